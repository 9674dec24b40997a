/*
 * test_mtp.c - the MTP head of the hybrid families (src/model/mtp.c) and
 * its draft source, --spec mtp (src/engine/spec_eagle3.c). The fixtures
 * carry no mtp.* tensors, so this test writes copies of them that do:
 * config.json with mtp_num_hidden_layers, model.safetensors with every
 * tensor of the fixture plus mtp.fc, mtp.pre_fc_norm_{embedding,hidden},
 * mtp.layers.0.* (shaped as the fixture's full-attention layer: gated
 * q_proj, q/k norms, MoE or dense MLP) and mtp.norm, in f32 or bf16, of
 * three kinds:
 *   random  every mtp.* value random: drafts are noise;
 *   table   built to draft, for up to H tokens y chosen from the plain runs'
 *           outputs, the token the target produced after y there: the layer's
 *           o_proj and down projections are zero and every norm weight 0
 *           (x 1), so out = norm(M norm(embed[y])) with fc = [M | 0], M solved
 *           on the host so that M norm(embed[y_i]) = lm_head[next(y_i)] (a
 *           least-squares fit, exact for up to H keys; each next token is
 *           lm_head's argmax over its own row, checked). Its drafts, chained
 *           through its own fed-back state, are accepted along those runs;
 *   wrong   table with a random layer (mtp.layers.0.*, matrices in [-1, 1)):
 *           drafts are noise.
 * Checks:
 *   - one step of the head against the layer written out on the host
 *     (position 0: the attention is its value, gated; logits and the kept
 *     hidden within 1e-4 of the largest value), catching the concatenation
 *     order, the (1 + w) norms and the gate;
 *   - greedy output identical token for token (ids, logprobs, finish) with
 *     --spec mtp, in a batch of 16 rows with mixed draft caps, opted-out
 *     rows and stop ids, and alone, on qwen3_next (MoE), qwen3_5_text
 *     (dense) and qwen3_5_moe_text, for every kind; drafts are made, the
 *     constructed heads get drafts accepted and the random one fewer;
 *   - a model without an MTP head, and malformed MTP weights (a wrong shape,
 *     a missing and an unread mtp.* tensor, mtp_num_hidden_layers 0 or 2),
 *     refused with one line naming the tensor or field, while the model
 *     itself still loads;
 *   - ember generate --spec mtp prints the plain output, also on a hybrid
 *     that ember mkmodel wrote with a random MTP head.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "core/dtype.h"
#include "engine/engine.h"
#include "fixture.h"
#include "formats/safetensors.h"
#include "model/model.h"

#define NREQ 16
#define MAXGEN 48
#define MAXT 512

typedef enum { K_RANDOM, K_TABLE, K_WRONG } mtp_kind;

typedef struct mtp_spec {
    mtp_kind kind;
    ember_dtype dt;   /* of the mtp.* tensors: EMBER_F32 or EMBER_BF16 */
    uint64_t seed;
    const char *bad;  /* NULL, or "shape", "missing", "extra" */
    int layers_field; /* mtp_num_hidden_layers written (-1: the key left out) */
    const float *fcm; /* K_TABLE / K_WRONG: M [H, H], the embedding half of fc */
} mtp_spec;

/* One copy being written: the fixture's tensors, then the head's. */
typedef struct writer {
    const mtp_spec *sp;
    const ember_st_file *src;
    int n_src, n;
    int H;
    ember_st_out out[MAXT];
    char names[MAXT][160];
    int src_of[MAXT]; /* >= 0: copy that fixture tensor; -1: an mtp.* tensor */
} writer;

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

/* Element e of mtp.* tensor `index` (its name and shape in w) as f32. */
static float mtp_value(const writer *w, int index, size_t e) {
    const mtp_spec *sp = w->sp;
    const char *name = w->names[index];
    const bool norm = w->out[index].ndim == 1, layer = !strncmp(name, "mtp.layers.0.", 13);
    const int64_t H = w->H, cols = w->out[index].ndim > 1 ? w->out[index].shape[1] : 1;
    const size_t r = e / (size_t)cols, c = e % (size_t)cols;
    const double u = (double)(mix(sp->seed * 131 + (uint64_t)index * 1000003 + e) >> 11) / 9007199254740992.0;
    if (sp->kind == K_RANDOM) return (float)(norm ? u * 0.2 - 0.1 : u * 0.4 - 0.2);
    if (sp->kind == K_WRONG && layer) return (float)(norm ? u * 0.2 - 0.1 : u * 2.0 - 1.0); /* outweighs fc's part */
    if (norm || strstr(name, "o_proj") || strstr(name, "down_proj")) return 0.0f;
    if (!strcmp(name, "mtp.fc.weight")) return c < (size_t)H ? sp->fcm[r * (size_t)H + c] : 0.0f;
    return (float)(u * 0.4 - 0.2); /* q, k, v, the router, gate and up projections: unused */
}

static int fill(void *user, int index, size_t first, size_t n, void *dst, ember_error *err) {
    (void)err;
    const writer *w = user;
    if (w->src_of[index] >= 0) {
        const ember_st_tensor *t = &w->src->tensors[w->src_of[index]];
        size_t numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= (size_t)t->shape[d];
        const size_t es = numel ? t->nbytes / numel : 0; /* the fixtures are f32 */
        memcpy(dst, t->data + first * es, n * es);
        return EMBER_OK;
    }
    for (size_t k = 0; k < n; k++) {
        float v = mtp_value(w, index, first + k);
        if (w->out[index].dtype == EMBER_BF16)
            ((uint16_t *)dst)[k] = ember_f32_to_bf16(v);
        else
            ((float *)dst)[k] = v;
    }
    return EMBER_OK;
}

static void add_mtp(writer *w, const char *name, int ndim, int64_t r, int64_t c) {
    int i = w->n++;
    snprintf(w->names[i], sizeof w->names[i], "%s", name);
    w->out[i] = (ember_st_out){w->names[i], w->sp->dt, ndim, {r, c}};
    w->src_of[i] = -1;
}

/* The fixture dir's full-attention layer index (the last one with a q_proj). */
static int attn_layer(const ember_st_file *f) {
    int best = -1;
    for (int i = 0; i < f->n_tensors; i++) {
        int l = -1, used = 0;
        if (sscanf(f->tensors[i].name, "model.layers.%d.%n", &l, &used) == 1 && used > 0 &&
            !strcmp(f->tensors[i].name + used, "self_attn.q_proj.weight") && l > best)
            best = l;
    }
    return best;
}

/* Writes a copy of fixture `family` with an MTP head as sp says into dir. */
static void write_copy(const char *family, const char *dir, const mtp_spec *sp) {
    char src[600], path[800];
    snprintf(src, sizeof src, "%s/fixtures/%s", shared_dir(), family);
    mkdir(dir, 0755);
    /* config.json: the fixture's, with mtp_num_hidden_layers */
    snprintf(path, sizeof path, "%s/config.json", src);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    if (!f) exit(1);
    static char cfg[1 << 16];
    size_t n = fread(cfg, 1, sizeof cfg - 1, f);
    cfg[n] = '\0';
    fclose(f);
    char *brace = strchr(cfg, '{');
    CHECK(brace != NULL);
    snprintf(path, sizeof path, "%s/config.json", dir);
    f = fopen(path, "wb");
    fputs("{", f);
    if (sp->layers_field >= 0) fprintf(f, "\n  \"mtp_num_hidden_layers\": %d,", sp->layers_field);
    fputs(brace + 1, f);
    fclose(f);
    /* model.safetensors: the fixture's tensors and the head's */
    writer *w = calloc(1, sizeof *w);
    w->sp = sp;
    ember_st_file *sf = NULL;
    ember_error err = {0};
    snprintf(path, sizeof path, "%s/model.safetensors", src);
    CHECKF(ember_st_open(path, &sf, &err) == EMBER_OK, "%s", err.msg);
    if (!sf) exit(1);
    w->src = sf;
    for (int i = 0; i < sf->n_tensors && w->n < MAXT; i++) {
        const ember_st_tensor *t = &sf->tensors[i];
        snprintf(w->names[w->n], sizeof w->names[0], "%s", t->name);
        w->out[w->n] = (ember_st_out){w->names[w->n], t->dtype, t->ndim, {0}};
        memcpy(w->out[w->n].shape, t->shape, sizeof t->shape);
        w->src_of[w->n++] = i;
        if (!strcmp(t->name, "model.embed_tokens.weight")) w->H = (int)t->shape[1];

    }
    w->n_src = w->n;
    const int H = w->H, L = attn_layer(sf);
    CHECK(H > 0 && L >= 0);
    add_mtp(w, "mtp.fc.weight", 2, H, sp->bad && !strcmp(sp->bad, "shape") ? 2 * H - 1 : 2 * H);
    add_mtp(w, "mtp.pre_fc_norm_embedding.weight", 1, H, 0);
    add_mtp(w, "mtp.pre_fc_norm_hidden.weight", 1, H, 0);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "model.layers.%d.", L);
    for (int i = 0; i < w->n_src; i++) {
        const ember_st_tensor *t = &sf->tensors[w->src_of[i]];
        if (strncmp(t->name, prefix, strlen(prefix)) != 0) continue;
        char name[160];
        snprintf(name, sizeof name, "mtp.layers.0.%s", t->name + strlen(prefix));
        add_mtp(w, name, t->ndim, t->shape[0], t->ndim > 1 ? t->shape[1] : 0);
    }
    if (!sp->bad || strcmp(sp->bad, "missing")) add_mtp(w, "mtp.norm.weight", 1, H, 0);
    if (sp->bad && !strcmp(sp->bad, "extra")) add_mtp(w, "mtp.layers.0.self_attn.extra_norm.weight", 1, H, 0);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECKF(ember_st_write(path, w->out, w->n, fill, w, &err) == EMBER_OK, "%s", err.msg);
    ember_st_free(sf);
    free(w);
}

static ember_model *load(const char *dir, int rows) {
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.n_rows = rows;
    mp.n_threads = 2;
    mp.n_ctx = 256;
    mp.max_batch_tokens = 64;
    mp.device = getenv("EMBER_TEST_DEVICE"); /* e.g. cuda:0 (NULL: cpu) */
    ember_model *m = fx_load_params(dir, &mp);
    if (!m) exit(1);
    return m;
}

/* ---- one step against the host ------------------------------------------------------ */

static void mat_vec(const float *w, const float *x, int rows, int cols, float *y) {
    for (int r = 0; r < rows; r++) {
        double acc = 0;
        for (int c = 0; c < cols; c++) acc += (double)w[(size_t)r * cols + c] * x[c];
        y[r] = (float)acc;
    }
}

/* y = rmsnorm(x) * (1 + w) */
static void rms1(const float *x, const float *w, int n, float *y) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + 1e-6));
    for (int i = 0; i < n; i++) y[i] = x[i] * r * (1.0f + w[i]);
}

/* The values of the copy's tensor `name` (f32), as written. */
static float *tensor_of(const char *dir, const char *name, size_t *n) {
    char path[800];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ember_st_file *f = NULL;
    ember_error err = {0};
    CHECKF(ember_st_open(path, &f, &err) == EMBER_OK, "%s", err.msg);
    const ember_st_tensor *t = f ? ember_st_find(f, name) : NULL;
    CHECKF(t && t->dtype == EMBER_F32, "%s", name);
    if (!t) exit(1);
    *n = t->nbytes / 4;
    float *v = malloc(t->nbytes);
    memcpy(v, t->data, t->nbytes);
    ember_st_free(f);
    return v;
}

/* One token at position 0 of a random qwen3_5_text head against the host. */
static void reference_step(void) {
    char dir[700];
    snprintf(dir, sizeof dir, "%s/mtp_ref", EMBER_TEST_TMP);
    const mtp_spec sp = {K_RANDOM, EMBER_F32, 21, NULL, 1, NULL};
    write_copy("qwen3_5_text", dir, &sp);
    ember_model *m = load(dir, 2);
    ember_model *hd = NULL;
    ember_error err = {0};
    CHECKF(ember_model_mtp_new(m, &hd, &err) == EMBER_OK, "%s", err.msg);
    if (!hd) exit(1);
    enum { H = 64, Hq = 4, Hkv = 2, D = 32, I = 128, V = 512 };
    size_t n;
    float *emb = tensor_of(dir, "model.embed_tokens.weight", &n), *lm = tensor_of(dir, "lm_head.weight", &n),
          *fc = tensor_of(dir, "mtp.fc.weight", &n), *we = tensor_of(dir, "mtp.pre_fc_norm_embedding.weight", &n),
          *wh = tensor_of(dir, "mtp.pre_fc_norm_hidden.weight", &n),
          *win = tensor_of(dir, "mtp.layers.0.input_layernorm.weight", &n),
          *wq = tensor_of(dir, "mtp.layers.0.self_attn.q_proj.weight", &n),
          *wv = tensor_of(dir, "mtp.layers.0.self_attn.v_proj.weight", &n),
          *wo = tensor_of(dir, "mtp.layers.0.self_attn.o_proj.weight", &n),
          *wpost = tensor_of(dir, "mtp.layers.0.post_attention_layernorm.weight", &n),
          *wg = tensor_of(dir, "mtp.layers.0.mlp.gate_proj.weight", &n),
          *wu = tensor_of(dir, "mtp.layers.0.mlp.up_proj.weight", &n),
          *wd = tensor_of(dir, "mtp.layers.0.mlp.down_proj.weight", &n), *wn = tensor_of(dir, "mtp.norm.weight", &n);
    float tap[H], cat[2 * H], x[H], h[H], q2[2 * Hq * D], v[Hkv * D], att[Hq * D], o[H], g[I], u[I], mo[H], out[H], ref[V];
    for (int i = 0; i < H; i++) tap[i] = (float)sin(0.41 * i + 0.3) * 1.7f;
    const int32_t tok = 123;
    rms1(emb + (size_t)tok * H, we, H, cat); /* the embedding first */
    rms1(tap, wh, H, cat + H);
    mat_vec(fc, cat, H, 2 * H, x);
    rms1(x, win, H, h);
    mat_vec(wq, h, 2 * Hq * D, H, q2);
    mat_vec(wv, h, Hkv * D, H, v);
    for (int hd2 = 0; hd2 < Hq; hd2++) /* one key: the value of the head's KV head, times sigmoid(gate) */
        for (int e = 0; e < D; e++) {
            float gate = q2[hd2 * 2 * D + D + e];
            att[hd2 * D + e] = v[(hd2 / (Hq / Hkv)) * D + e] / (1.0f + expf(-gate));
        }
    mat_vec(wo, att, H, Hq * D, o);
    for (int i = 0; i < H; i++) x[i] += o[i];
    rms1(x, wpost, H, h);
    mat_vec(wg, h, I, H, g);
    mat_vec(wu, h, I, H, u);
    for (int i = 0; i < I; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    mat_vec(wd, g, H, I, mo);
    for (int i = 0; i < H; i++) x[i] += mo[i];
    rms1(x, wn, H, out);
    mat_vec(lm, out, V, H, ref);
    float got[V], hid[H];
    int32_t pos = 0, row = 0, outi = 0, dst = 0;
    ember_batch b = {.n = 1, .tok = &tok, .pos = &pos, .row = &row, .n_out = 1, .out = &outi};
    CHECKF(ember_mtp_forward(hd->llm, hd->st, hd->kv, &b, tap, NULL, &dst, got, &err) == EMBER_OK, "%s", err.msg);
    CHECK(hd->be->ops->read(hd->be, &hd->st->e3_hid, 0, hid, sizeof hid, &err) == EMBER_OK);
    double worst = 0, worst_h = 0, mx = 0, mh = 0;
    for (int i = 0; i < V; i++) worst = fmax(worst, fabs(got[i] - ref[i])), mx = fmax(mx, fabs(ref[i]));
    for (int i = 0; i < H; i++) worst_h = fmax(worst_h, fabs(hid[i] - out[i])), mh = fmax(mh, fabs(out[i]));
    CHECKF(worst <= 1e-4 * mx && worst_h <= 1e-4 * mh, "MTP step vs host: logits %g of %g, hidden %g of %g", worst, mx,
           worst_h, mh);
    fprintf(stderr, "note: MTP step vs host: logits within %.2g of %.3g, hidden within %.2g of %.3g\n", worst, mx, worst_h,
            mh);
    float *all[] = {emb, lm, fc, we, wh, win, wq, wv, wo, wpost, wg, wu, wd, wn};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
    ember_model_free(hd);
    ember_model_free(m);
}

/* ---- greedy output with --spec mtp ----------------------------------------------------- */

#include "spec_waves.h"

static ember_engine *new_engine(ember_model *m, ember_spec_mode spec) {
    ember_engine_params ep = {0};
    ep.spec = spec;
    ember_engine *e = NULL;
    ember_error err = {0};
    CHECKF(ember_engine_new(m, &ep, &e, &err) == EMBER_OK, "%s", err.msg);
    if (!e) exit(1);
    return e;
}

static const char *kind_name(mtp_kind k) { return k == K_RANDOM ? "random" : k == K_TABLE ? "table" : "wrong"; }

/* Whether lm_head's argmax over its own row c is c. */
static bool self_argmax(const float *lm, int V, int H, int c) {
    int best = 0;
    double bv = -1e300;
    for (int v = 0; v < V; v++) {
        double acc = 0;
        for (int i = 0; i < H; i++) acc += (double)lm[(size_t)v * H + i] * lm[(size_t)c * H + i];
        if (acc > bv) bv = acc, best = v;
    }
    return best == c;
}

/* M [H, H] with M E = D: E [H, n] the keys' normed embeddings, D [H, n] the lm_head rows of
   their next tokens (columns), as M = D (E^T E)^-1 E^T; false if E^T E is singular. */
static bool solve_table(const double *E, const double *D, int H, int n, float *M) {
    double *G = calloc((size_t)n * n, sizeof *G), *Z = calloc((size_t)n * H, sizeof *Z); /* Z = G^-1 E^T [n, H] */
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++)
            for (int i = 0; i < H; i++) G[a * n + b] += E[i * n + a] * E[i * n + b];
    for (int a = 0; a < n; a++)
        for (int i = 0; i < H; i++) Z[a * H + i] = E[i * n + a];
    bool ok = true;
    for (int col = 0; col < n && ok; col++) { /* Gauss-Jordan with partial pivoting */
        int piv = col;
        for (int r = col + 1; r < n; r++)
            if (fabs(G[r * n + col]) > fabs(G[piv * n + col])) piv = r;
        if (fabs(G[piv * n + col]) < 1e-9) ok = false;
        for (int k = 0; ok && k < n; k++) {
            double t = G[col * n + k];
            G[col * n + k] = G[piv * n + k], G[piv * n + k] = t;
        }
        for (int k = 0; ok && k < H; k++) {
            double t = Z[col * H + k];
            Z[col * H + k] = Z[piv * H + k], Z[piv * H + k] = t;
        }
        for (int r = 0; ok && r < n; r++) {
            if (r == col) continue;
            double f = G[r * n + col] / G[col * n + col];
            for (int k = 0; k < n; k++) G[r * n + k] -= f * G[col * n + k];
            for (int k = 0; k < H; k++) Z[r * H + k] -= f * Z[col * H + k];
        }
    }
    for (int a = 0; ok && a < n; a++)
        for (int k = 0; k < H; k++) Z[a * H + k] /= G[a * n + a];
    for (int r = 0; ok && r < H; r++)
        for (int c = 0; c < H; c++) {
            double acc = 0;
            for (int a = 0; a < n; a++) acc += D[r * n + a] * Z[a * H + c];
            M[r * H + c] = (float)acc;
        }
    free(G);
    free(Z);
    return ok;
}

/* The table head's M for the plain runs of the fixture in dir (write_copy's K_TABLE):
   the first up to H output transitions y -> next with a new y whose next is its own
   lm_head argmax. Returns the keys. */
static int table_for(const char *dir, const result *plain, float *M) {
    enum { V = 512, H = 64 };
    size_t ne, nl;
    float *emb = tensor_of(dir, "model.embed_tokens.weight", &ne), *lm = tensor_of(dir, "lm_head.weight", &nl);
    CHECK(ne == (size_t)V * H && nl == (size_t)V * H);
    static double E[H * H], D[H * H];
    int nk = 0;
    bool seen[V] = {false};
    double Ec[H][H], Dc[H][H];
    for (int i = 0; i < NREQ && nk < H; i++)
        for (int k = 0; k + 1 < plain[i].n && nk < H; k++) {
            int y = plain[i].ids[k], nx = plain[i].ids[k + 1];
            if (seen[y] || !self_argmax(lm, V, H, nx)) continue;
            seen[y] = true;
            double ss = 0;
            for (int d = 0; d < H; d++) ss += (double)emb[(size_t)y * H + d] * emb[(size_t)y * H + d];
            const double r = 1.0 / sqrt(ss / H + 1e-6);
            for (int d = 0; d < H; d++) Ec[nk][d] = emb[(size_t)y * H + d] * r, Dc[nk][d] = lm[(size_t)nx * H + d];
            nk++;
        }
    for (int d = 0; d < H; d++)
        for (int a = 0; a < nk; a++) E[d * nk + a] = Ec[a][d], D[d * nk + a] = Dc[a][d];
    CHECKF(nk > 8 && solve_table(E, D, H, nk, M), "%s: a table of %d keys", dir, nk);
    free(emb);
    free(lm);
    return nk;
}

/* The batch and one request alone with --spec mtp on the copy in dir; returns the accepted drafts. */
static uint64_t greedy_with(const char *family, const char *dir, const mtp_spec *sp, reqset *q, const result *plain) {
    ember_model *m = load(dir, NREQ);
    result spec[NREQ], alone;
    ember_engine_stats st;
    ember_engine *e = new_engine(m, EMBER_SPEC_MTP);
    run_wave(e, q, 0, NREQ, spec);
    ember_engine_get_stats(e, &st);
    for (int i = 0; i < NREQ; i++)
        CHECKF(same_result(&spec[i], &plain[i], q->stop[i]),
               "%s %s %s request %d (draft_max %d%s): MTP output differs (n %d vs %d)", family, kind_name(sp->kind),
               sp->dt == EMBER_BF16 ? "bf16" : "f32", i, q->draft_max[i], q->opt_out[i] ? ", opted out" : "", spec[i].n,
               plain[i].n);
    CHECKF(st.spec_drafted_total > 0 && st.spec_accepted_total <= st.spec_drafted_total, "%s: %llu drafted", family,
           (unsigned long long)st.spec_drafted_total);
    fprintf(stderr,
            "note: %s, %s MTP head (%s): %llu drafted, %llu accepted (%.1f%%), %.3f tokens per target forward\n", family,
            kind_name(sp->kind), sp->dt == EMBER_BF16 ? "bf16" : "f32", (unsigned long long)st.spec_drafted_total,
            (unsigned long long)st.spec_accepted_total,
            st.spec_drafted_total ? 100.0 * (double)st.spec_accepted_total / (double)st.spec_drafted_total : 0.0,
            st.decode_forwards_total ? (double)st.decode_tokens_total / (double)st.decode_forwards_total : 0.0);
    run_wave(e, q, 3, 1, &alone);
    CHECKF(same_result(&alone, &plain[3], q->stop[3]), "%s: a request alone differs", family);
    ember_engine_free(e);
    ember_model_free(m);
    return st.spec_accepted_total;
}

static void greedy_family(const char *family) {
    char dir[600], cdir[700];
    snprintf(dir, sizeof dir, "%s/fixtures/%s", shared_dir(), family);
    ember_model *m = load(dir, NREQ);
    reqset q;
    make_requests(&q, m->cfg.vocab_size);
    result plain[NREQ];
    ember_engine *e = new_engine(m, EMBER_SPEC_NONE);
    run_wave(e, &q, 0, NREQ, plain);
    ember_engine_free(e);
    ember_model_free(m);
    for (int i = 0; i < NREQ; i += 5) q.stop[i] = plain[i].ids[plain[i].n / 2];
    static float M[64 * 64];
    const int nk = table_for(dir, plain, M);
    fprintf(stderr, "note: %s: a table head of %d keys\n", family, nk);
    const mtp_spec kinds[] = {{K_RANDOM, EMBER_BF16, 5, NULL, 1, NULL}, {K_TABLE, EMBER_F32, 6, NULL, 1, M},
                              {K_WRONG, EMBER_F32, 7, NULL, -1, M}};
    uint64_t acc[3];
    for (int k = 0; k < 3; k++) {
        snprintf(cdir, sizeof cdir, "%s/mtp_%s_%s", EMBER_TEST_TMP, family, kind_name(kinds[k].kind));
        write_copy(family, cdir, &kinds[k]);
        acc[k] = greedy_with(family, cdir, &kinds[k], &q, plain);
    }
    /* the constructed head gets drafts accepted; with its layer random, or all random, far fewer
       (the output unchanged all the same) */
    CHECKF(acc[1] >= 20 && 4 * acc[0] < acc[1] && 4 * acc[2] < acc[1],
           "%s: accepted random %llu, table %llu, wrong layer %llu", family, (unsigned long long)acc[0],
           (unsigned long long)acc[1], (unsigned long long)acc[2]);
}

/* ---- refusals ----------------------------------------------------------------------------- */

static void refused_one(ember_model *m, const char *want, const char *what) {
    ember_engine_params ep = {0};
    ep.spec = EMBER_SPEC_MTP;
    ember_engine *e = NULL;
    ember_error err = {0};
    int rc = ember_engine_new(m, &ep, &e, &err);
    CHECKF(rc != EMBER_OK && !e && strstr(err.msg, want) && !strchr(err.msg, '\n'), "%s: rc %d '%s' (want %s)", what, rc,
           err.msg, want);
    ember_engine_free(e);
}

static void refused(void) {
    char dir[600], cdir[700];
    snprintf(dir, sizeof dir, "%s/fixtures/qwen3_next", shared_dir());
    ember_model *m = load(dir, 2);
    refused_one(m, "no MTP head (no mtp.* tensors", "the fixture without mtp.*");
    ember_model_free(m);
    snprintf(dir, sizeof dir, "%s/fixtures/llama", shared_dir());
    m = load(dir, 2);
    refused_one(m, "llama has no MTP head", "llama");
    ember_model_free(m);
    const struct {
        mtp_spec sp;
        const char *want;
    } bad[] = {{{K_RANDOM, EMBER_F32, 3, "shape", 1, NULL}, "tensor 'mtp.fc.weight' has shape [64, 127], expected [64, 128]"},
               {{K_RANDOM, EMBER_F32, 3, "missing", 1, NULL}, "missing tensor 'mtp.norm.weight'"},
               {{K_RANDOM, EMBER_F32, 3, "extra", 1, NULL}, "tensor 'mtp.layers.0.self_attn.extra_norm.weight' is not part"},
               {{K_RANDOM, EMBER_F32, 3, NULL, 0, NULL}, "mtp_num_hidden_layers is 0"},
               {{K_RANDOM, EMBER_F32, 3, NULL, 2, NULL}, "mtp_num_hidden_layers 2"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(cdir, sizeof cdir, "%s/mtp_bad%zu", EMBER_TEST_TMP, i);
        write_copy("qwen3_next", cdir, &bad[i].sp);
        m = load(cdir, 2); /* the model itself loads: its MTP weights are read only for --spec mtp */
        refused_one(m, bad[i].want, bad[i].want);
        ember_model_free(m);
    }
}

/* Runs cmd, its stdout and stderr into out (n bytes); returns the exit status. */
static int run_cmd(const char *cmd, char *out, size_t n) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t k = fread(out, 1, n - 1, p);
    out[k] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ember generate --spec mtp: the plain output; without an MTP head: exit 1, one line. */
static void cli(void) {
    char dir[700], cmd[2400], plain[4096], spec[4096], err[4096];
    snprintf(dir, sizeof dir, "%s/mtp_qwen3_next_table", EMBER_TEST_TMP);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --ids 1,5,9,33,7 -n 24 --ignore-eos --temp 0 2>/dev/null", EMBER_BIN, dir);
    CHECK(run_cmd(cmd, plain, sizeof plain) == 0 && strlen(plain) > 20);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --ids 1,5,9,33,7 -n 24 --ignore-eos --temp 0 --spec mtp -v 2>&1",
             EMBER_BIN, dir);
    CHECK(run_cmd(cmd, spec, sizeof spec) == 0);
    CHECKF(strstr(spec, plain) != NULL && strstr(spec, "speculative decoding (MTP head)") != NULL, "--spec mtp: %s", spec);
    /* ember mkmodel writes a random MTP head for a hybrid config with mtp_num_hidden_layers 1 */
    char cfgp[800], mdir[800];
    snprintf(cfgp, sizeof cfgp, "%s/mtp_mk.json", EMBER_TEST_TMP);
    snprintf(mdir, sizeof mdir, "%s/mtp_mk", EMBER_TEST_TMP);
    FILE *f = fopen(cfgp, "w");
    CHECK(f != NULL);
    if (f) {
        fputs("{\"model_type\": \"qwen3_5_text\", \"vocab_size\": 512, \"hidden_size\": 64, \"intermediate_size\": 128, "
              "\"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 32, "
              "\"max_position_embeddings\": 512, \"linear_key_head_dim\": 16, \"linear_value_head_dim\": 16, "
              "\"linear_num_key_heads\": 2, \"linear_num_value_heads\": 4, \"partial_rotary_factor\": 0.25, "
              "\"tie_word_embeddings\": true, \"mtp_num_hidden_layers\": 1}\n", f);
        fclose(f);
    }
    snprintf(cmd, sizeof cmd, "%s mkmodel --config %s --out %s --dtype f32 --std 0.2 2>&1", EMBER_BIN, cfgp, mdir);
    CHECKF(run_cmd(cmd, err, sizeof err) == 0, "%s", err);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --ids 1,5,9,33,7 -n 24 --ignore-eos --temp 0 2>/dev/null", EMBER_BIN, mdir);
    CHECK(run_cmd(cmd, plain, sizeof plain) == 0 && strlen(plain) > 20);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --ids 1,5,9,33,7 -n 24 --ignore-eos --temp 0 --spec mtp -v 2>&1",
             EMBER_BIN, mdir);
    CHECK(run_cmd(cmd, spec, sizeof spec) == 0);
    CHECKF(strstr(spec, plain) != NULL && strstr(spec, "speculative decoding (MTP head)") != NULL, "mkmodel --spec mtp: %s",
           spec);
    snprintf(cmd, sizeof cmd, "%s generate --model %s/fixtures/qwen3_next --ids 1,5 -n 4 --spec mtp 2>&1", EMBER_BIN,
             shared_dir());
    CHECKF(run_cmd(cmd, err, sizeof err) == 1 && strstr(err, "no MTP head") && strchr(err, '\n') == err + strlen(err) - 1,
           "%s", err);
}

int main(void) {
    shared_dir();
    reference_step();
    refused();
    static const char *const families[] = {"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"};
    for (size_t i = 0; i < sizeof families / sizeof *families; i++) greedy_family(families[i]);
    cli();
    return test_done();
}
