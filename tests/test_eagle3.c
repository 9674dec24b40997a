/*
 * test_eagle3.c - the hidden-tap draft sources: EAGLE-3 (src/engine/spec_eagle3.c,
 * src/model/eagle3.c) with random-weight draft models written here in the
 * published EAGLE-3 format (config.json with architectures
 * LlamaForCausalLMEagle3, draft_vocab_size, target_hidden_size and
 * eagle_config.eagle_aux_hidden_state_layer_ids; safetensors with fc,
 * midlayer.*, norm, lm_head, d2t, t2d), paired with fixture targets:
 *   - greedy output identical token for token (ids, logprobs, finish) with
 *     and without the source, alone and in a batch of 16 rows with mixed
 *     draft lengths, opted-out rows and stop ids, and again when the prompts
 *     come back from the prefix cache (the draft rows then start where the
 *     target's taps start);
 *   - a one-token draft vocabulary mapped by d2t to the target's most
 *     frequent output token, so drafts are accepted as well as rejected;
 *   - configs that do not fit the target refused with one line naming the
 *     field (target_hidden_size, vocab_size, the tap layers).
 * And the same for DFlash draft models (src/model/dflash.c,
 * src/engine/spec_dflash.c: architectures DFlashDraftModel, block_size,
 * dflash_config; layers.*, norm, fc, hidden_norm), one with zero output
 * projections so that its blocks draft one chosen token and are accepted.
 * EMBER_TEST_DEVICE=cuda:0 runs the models on that device instead.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "engine/engine.h"
#include "fixture.h"
#include "formats/safetensors.h"
#include "model/model.h"

#define NREQ 16
#define MAXGEN 48

typedef struct drafter {
    int H, I, V, Vd, hidden_field; /* hidden_field: target_hidden_size written (0: none) */
    int const_tok;                 /* >= 0: Vd is 1 and d2t maps it to this target id */
    const char *aux;               /* eagle_aux_hidden_state_layer_ids, JSON */
    uint64_t seed;
    bool own_embed;                /* embed_tokens.weight written (else the target's is used) */
} drafter;

typedef struct tensor_spec {
    const char *name;
    int kind; /* 0 random matrix, 1 norm (ones), 2 d2t, 3 t2d */
} tensor_spec;

static const tensor_spec k_tensors[] = {
    {"fc.weight", 0},
    {"midlayer.hidden_norm.weight", 1},
    {"midlayer.input_layernorm.weight", 1},
    {"midlayer.self_attn.q_proj.weight", 0},
    {"midlayer.self_attn.k_proj.weight", 0},
    {"midlayer.self_attn.v_proj.weight", 0},
    {"midlayer.self_attn.o_proj.weight", 0},
    {"midlayer.post_attention_layernorm.weight", 1},
    {"midlayer.mlp.gate_proj.weight", 0},
    {"midlayer.mlp.up_proj.weight", 0},
    {"midlayer.mlp.down_proj.weight", 0},
    {"norm.weight", 1},
    {"lm_head.weight", 0},
    {"d2t", 2},
    {"t2d", 3},
    {"embed_tokens.weight", 0}, /* written only for a drafter with its own embedding */
};
#define N_TENSORS ((int)(sizeof k_tensors / sizeof *k_tensors))

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

static int fill(void *user, int index, size_t first, size_t n, void *dst, ember_error *err) {
    (void)err;
    const drafter *d = user;
    for (size_t k = 0; k < n; k++) {
        size_t e = first + k;
        switch (k_tensors[index].kind) {
        case 0: /* uniform in [-0.2, 0.2) */
            ((float *)dst)[k] = (float)((double)(mix(d->seed * 131 + (uint64_t)index * 1000003 + e) >> 11) / 9007199254740992.0 * 0.4 - 0.2);
            break;
        case 1:
            ((float *)dst)[k] = 1.0f;
            break;
        case 2: { /* draft id e is target id 2e + 1 (mod V), or the constant */
            int64_t t = d->const_tok >= 0 ? d->const_tok : (int64_t)((2 * e + 1) % (size_t)d->V);
            ((int64_t *)dst)[k] = t - (int64_t)e;
            break;
        }
        default:
            ((uint8_t *)dst)[k] = 0;
        }
    }
    return EMBER_OK;
}

/* Writes draft model d into dir (config.json, model.safetensors). */
static void write_drafter(const char *dir, const drafter *d) {
    mkdir(dir, 0755);
    char path[700];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) exit(1);
    fprintf(f,
            "{\"architectures\": [\"LlamaForCausalLMEagle3\"], \"model_type\": \"llama\", \"hidden_size\": %d, "
            "\"intermediate_size\": %d, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, "
            "\"num_hidden_layers\": 1, \"vocab_size\": %d, \"draft_vocab_size\": %d, \"rms_norm_eps\": 1e-06, "
            "\"rope_theta\": 10000.0, \"max_position_embeddings\": 512, \"tie_word_embeddings\": false",
            d->H, d->I, d->V, d->Vd);
    if (d->hidden_field) fprintf(f, ", \"target_hidden_size\": %d", d->hidden_field);
    if (d->aux) fprintf(f, ", \"eagle_config\": {\"eagle_aux_hidden_state_layer_ids\": %s, \"use_aux_hidden_state\": true}", d->aux);
    fprintf(f, "}\n");
    fclose(f);
    const int Ht = d->hidden_field ? d->hidden_field : d->H, A = 3;
    const int64_t H = d->H, I = d->I;
    ember_st_out outs[N_TENSORS];
    const int64_t shapes[N_TENSORS][2] = {{H, A * Ht}, {H, 0}, {H, 0}, {64, 2 * H}, {32, 2 * H}, {32, 2 * H}, {H, 64},
                                          {H, 0},      {I, H}, {I, H}, {H, I},      {H, 0},      {d->Vd, H},  {d->Vd, 0},
                                          {d->V, 0},   {d->V, H}};
    for (int i = 0; i < N_TENSORS; i++) {
        int kind = k_tensors[i].kind;
        outs[i] = (ember_st_out){k_tensors[i].name, kind == 2 ? EMBER_I64 : kind == 3 ? EMBER_BOOL : EMBER_F32,
                                 shapes[i][1] ? 2 : 1, {shapes[i][0], shapes[i][1]}};
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ember_error err = {0};
    CHECKF(ember_st_write(path, outs, N_TENSORS - !d->own_embed, fill, (void *)d, &err) == EMBER_OK, "%s", err.msg);
}

static ember_model *load(const char *dir, int rows) {
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.n_rows = rows;
    mp.n_threads = 2;
    mp.n_ctx = 256;
    mp.max_batch_tokens = 64;
    mp.device = getenv("EMBER_TEST_DEVICE"); /* e.g. cuda:0: the same checks on that device (NULL: cpu) */
    ember_model *m = fx_load_params(dir, &mp);
    if (!m) exit(1);
    return m;
}

#include "spec_waves.h"

static ember_engine *new_engine(ember_model *m, ember_model *draft) {
    ember_engine_params ep = {0};
    ep.spec = !draft ? EMBER_SPEC_NONE : draft->cfg.dflash ? EMBER_SPEC_DFLASH : EMBER_SPEC_EAGLE3;
    ep.draft_model = draft;
    ember_engine *e = NULL;
    ember_error err = {0};
    CHECKF(ember_engine_new(m, &ep, &e, &err) == EMBER_OK, "%s", err.msg);
    if (!e) exit(1);
    return e;
}

/* The batch, alone, and again from the prefix cache, with draft model dd
   over target m; plain: the results without speculation. Returns the
   accepted drafts. */
static uint64_t greedy_with(const char *family, ember_model *m, ember_model *dd, reqset *q, const result *plain) {
    result spec[NREQ], again[NREQ], alone;
    ember_engine_stats st;
    ember_engine *e = new_engine(m, dd);
    run_wave(e, q, 0, NREQ, spec);
    ember_engine_get_stats(e, &st);
    for (int i = 0; i < NREQ; i++)
        CHECKF(same_result(&spec[i], &plain[i], q->stop[i]), "%s request %d (draft_max %d%s): EAGLE-3 output differs (n %d vs %d)",
               family, i, q->draft_max[i], q->opt_out[i] ? ", opted out" : "", spec[i].n, plain[i].n);
    CHECKF(st.spec_drafted_total > 0 && st.spec_accepted_total <= st.spec_drafted_total, "%s: %llu drafted", family,
           (unsigned long long)st.spec_drafted_total);
    uint64_t accepted = st.spec_accepted_total;
    run_wave(e, q, 0, NREQ, again); /* the prompts' blocks now come from the prefix cache */
    int cached = 0;
    for (int i = 0; i < NREQ; i++) {
        cached += again[i].done.n_cached > 0;
        CHECKF(same_result(&again[i], &plain[i], q->stop[i]), "%s request %d from the prefix cache: output differs", family, i);
    }
    CHECKF(cached > 0 || strncmp(family, "qwen3_5", 7) == 0, /* a hybrid's rows have no prefix cache */
           "%s: nothing came from the prefix cache", family);
    fprintf(stderr, "note: %s, %s draft vocabulary %d: %llu drafted, %llu accepted over %llu forwards\n", family,
            dd->cfg.dflash ? "DFlash" : "EAGLE-3", dd->cfg.dflash ? dd->cfg.vocab_size : dd->cfg.e3_draft_vocab, (unsigned long long)st.spec_drafted_total, (unsigned long long)accepted,
            (unsigned long long)st.spec_forwards_total);
    run_wave(e, q, 3, 1, &alone);
    CHECKF(same_result(&alone, &plain[3], q->stop[3]), "%s: a request alone differs", family);
    ember_engine_free(e);
    return accepted;
}

static void greedy_family(const char *family) {
    char dir[600], ddir[700];
    snprintf(dir, sizeof dir, "%s/fixtures/%s", shared_dir(), family);
    ember_model *m = load(dir, NREQ);
    const int H = m->cfg.hidden_size, V = m->cfg.vocab_size, N = m->cfg.n_layers;
    reqset q;
    make_requests(&q, V);
    result plain[NREQ];
    ember_engine *e = new_engine(m, NULL);
    run_wave(e, &q, 0, NREQ, plain);
    ember_engine_free(e);
    for (int i = 0; i < NREQ; i += 5) q.stop[i] = plain[i].ids[plain[i].n / 2];

    /* a random draft model over a draft vocabulary of V / 2 (taps low / mid / high) */
    char aux[64];
    snprintf(aux, sizeof aux, "[0, %d, %d]", N / 2, N);
    drafter d = {H, 128, V, V / 2, H, -1, aux, 7, false};
    snprintf(ddir, sizeof ddir, "%s/eagle3_%s", EMBER_TEST_TMP, family);
    write_drafter(ddir, &d);
    ember_model *dd = load(ddir, NREQ);
    greedy_with(family, m, dd, &q, plain);
    ember_model_free(dd);

    /* a draft vocabulary of one token, the plain runs' most frequent: some drafts are accepted */
    int *count = calloc((size_t)V, sizeof(int)), best = 0;
    for (int i = 0; i < NREQ; i++)
        for (int k = 0; k < plain[i].n; k++) count[plain[i].ids[k]]++;
    for (int t = 1; t < V; t++) best = count[t] > count[best] ? t : best;
    free(count);
    drafter c = {H, 128, V, 1, 0, best, aux, 9, false};
    snprintf(ddir, sizeof ddir, "%s/eagle3_%s_const", EMBER_TEST_TMP, family);
    write_drafter(ddir, &c);
    dd = load(ddir, NREQ);
    uint64_t acc = greedy_with(family, m, dd, &q, plain);
    CHECKF(acc > 0, "%s: no draft of token %d accepted", family, best);
    ember_model_free(dd);
    ember_model_free(m);
}

/* A config that does not fit its target is refused, the message naming the field. */
static void refused(void) {
    char dir[600], ddir[700];
    snprintf(dir, sizeof dir, "%s/fixtures/llama", shared_dir());
    ember_model *m = load(dir, 2);
    const struct {
        drafter d;
        const char *field;
    } bad[] = {{{32, 64, 512, 64, 32, -1, "[0, 1, 2]", 3, false}, "target_hidden_size"},
               {{32, 64, 512, 64, 0, -1, "[0, 1, 2]", 3, false}, "hidden_size 32"},
               {{64, 128, 500, 64, 64, -1, "[0, 1, 2]", 3, false}, "vocab_size"},
               {{64, 128, 512, 64, 64, -1, "[0, 1, 5]", 3, false}, "eagle_aux_hidden_state_layer_ids"},
               {{64, 128, 512, 64, 64, -1, NULL, 3, false}, "default tap layers"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(ddir, sizeof ddir, "%s/eagle3_bad%zu", EMBER_TEST_TMP, i);
        write_drafter(ddir, &bad[i].d);
        ember_model *dd = load(ddir, 2);
        ember_engine_params ep = {0};
        ep.spec = EMBER_SPEC_EAGLE3;
        ep.draft_model = dd;
        ember_engine *e = NULL;
        ember_error err = {0};
        CHECKF(ember_engine_new(m, &ep, &e, &err) == EMBER_ERR_INVALID_ARG && !e, "bad config %zu accepted", i);
        CHECKF(strstr(err.msg, bad[i].field) != NULL && !strchr(err.msg, '\n'), "bad config %zu: '%s' (want %s)", i,
               err.msg, bad[i].field);
        ember_engine_free(e);
        ember_model_free(dd);
    }
    /* a plain model given as an EAGLE-3 draft model */
    ember_model *plain = load(dir, 2);
    ember_engine_params ep = {0};
    ep.spec = EMBER_SPEC_EAGLE3;
    ep.draft_model = plain;
    ember_engine *e = NULL;
    ember_error err = {0};
    CHECKF(ember_engine_new(m, &ep, &e, &err) == EMBER_ERR_INVALID_ARG && strstr(err.msg, "not an EAGLE-3"), "'%s'",
           err.msg);
    ember_model_free(plain);
    ember_model_free(m);
}

/* Tensor i of drafter d as the file holds it (f32), in a new array. */
static float *host_tensor(const drafter *d, int i, size_t n) {
    float *t = malloc(n * sizeof *t);
    ember_error err = {0};
    fill((void *)d, i, 0, n, t, &err);
    return t;
}

static void mat_vec(const float *w, const float *x, int rows, int cols, float *y) {
    for (int r = 0; r < rows; r++) {
        double acc = 0;
        for (int c = 0; c < cols; c++) acc += (double)w[(size_t)r * cols + c] * x[c];
        y[r] = (float)acc;
    }
}

static void rms(const float *x, int n, float *y) { /* the weights are ones */
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + 1e-6));
    for (int i = 0; i < n; i++) y[i] = x[i] * r;
}

/* One token at position 0 of a drafter with its own embedding, against the
   EAGLE-3 layer written out on the host (attention over one key is its
   value, RoPE at position 0 the identity): logits and the kept hidden. */
static void reference_step(void) {
    char dir[600], ddir[700];
    snprintf(dir, sizeof dir, "%s/fixtures/llama", shared_dir());
    ember_model *m = load(dir, 2);
    drafter d = {64, 128, 512, 100, 64, -1, "[0, 1, 2]", 11, true};
    snprintf(ddir, sizeof ddir, "%s/eagle3_ref", EMBER_TEST_TMP);
    write_drafter(ddir, &d);
    ember_model *dd = load(ddir, 2);
    int32_t taps[8];
    int nt = 0;
    ember_error err = {0};
    CHECKF(ember_eagle3_bind(dd->llm, m->llm, taps, &nt, &err) == EMBER_OK && nt == 3, "%s", err.msg);
    enum { H = 64, I = 128, V = 512, Vd = 100, Q = 64, KV = 32, D = 16 };
    float tin[3 * H], x[H], e[H], a[2 * H], q[Q], k[KV], v[KV], att[Q], o[H], h[H], g[I], u[I], mo[H], n[H], ref[Vd];
    for (int i = 0; i < 3 * H; i++) tin[i] = (float)sin(0.37 * i) * 2.0f;
    const int32_t tok = 77;
    float *fc = host_tensor(&d, 0, (size_t)H * 3 * H), *wq = host_tensor(&d, 3, (size_t)Q * 2 * H),
          *wk = host_tensor(&d, 4, (size_t)KV * 2 * H), *wv = host_tensor(&d, 5, (size_t)KV * 2 * H),
          *wo = host_tensor(&d, 6, (size_t)H * Q), *wg = host_tensor(&d, 8, (size_t)I * H), *wu = host_tensor(&d, 9, (size_t)I * H),
          *wd = host_tensor(&d, 10, (size_t)H * I), *lm = host_tensor(&d, 12, (size_t)Vd * H),
          *emb = host_tensor(&d, 15, (size_t)V * H);
    mat_vec(fc, tin, H, 3 * H, x);
    rms(emb + (size_t)tok * H, H, a);
    rms(x, H, a + H);
    (void)e;
    mat_vec(wq, a, Q, 2 * H, q);
    mat_vec(wk, a, KV, 2 * H, k);
    mat_vec(wv, a, KV, 2 * H, v);
    for (int hd = 0; hd < Q / D; hd++) memcpy(att + hd * D, v + (hd / 2) * D, D * sizeof(float)); /* 4 q heads on 2 kv heads */
    mat_vec(wo, att, H, Q, o);
    for (int i = 0; i < H; i++) x[i] += o[i];
    rms(x, H, h);
    mat_vec(wg, h, I, H, g);
    mat_vec(wu, h, I, H, u);
    for (int i = 0; i < I; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    mat_vec(wd, g, H, I, mo);
    for (int i = 0; i < H; i++) x[i] += mo[i];
    rms(x, H, n);
    mat_vec(lm, n, Vd, H, ref);
    float got[Vd], hid[H];
    int32_t pos = 0, row = 0, out = 0, dst = 0;
    ember_batch b = {.n = 1, .tok = &tok, .pos = &pos, .row = &row, .n_out = 1, .out = &out};
    CHECKF(ember_eagle3_forward(dd->llm, dd->st, dd->kv, &b, tin, NULL, &dst, got, &err) == EMBER_OK, "%s", err.msg);
    CHECK(dd->be->ops->read(dd->be, &dd->st->e3_hid, 0, hid, sizeof hid, &err) == EMBER_OK);
    double worst = 0, worst_h = 0, mx = 0, mh = 0;
    for (int i = 0; i < Vd; i++) worst = fmax(worst, fabs(got[i] - ref[i])), mx = fmax(mx, fabs(ref[i]));
    for (int i = 0; i < H; i++) worst_h = fmax(worst_h, fabs(hid[i] - x[i])), mh = fmax(mh, fabs(x[i]));
    CHECKF(worst <= 1e-4 * mx && worst_h <= 1e-4 * mh, "EAGLE-3 step against the host reference: logits %g of %g, hidden %g of %g",
           worst, mx, worst_h, mh);
    free(fc), free(wq), free(wk), free(wv), free(wo), free(wg), free(wu), free(wd), free(lm), free(emb);
    ember_model_free(dd);
    ember_model_free(m);
}

/* ---- DFlash ------------------------------------------------------------------------- */

typedef struct dflash {
    int L, B, mask, n_target; /* draft layers, block_size, mask_token_id, num_target_layers */
    const char *ids;          /* dflash_config.target_layer_ids, JSON (NULL: absent) */
    int n_ids;                /* their count (fc's width / 64) */
    bool zero_out;            /* o_proj and down_proj zero: every mask position drafts the mask's own argmax */
    uint64_t seed;
} dflash;

typedef struct df_writer {
    const dflash *d;
    int kind[64]; /* 0 random, 1 ones, 4 zeros */
} df_writer;

static int df_fill(void *user, int index, size_t first, size_t n, void *dst, ember_error *err) {
    (void)err;
    const df_writer *w = user;
    for (size_t k = 0; k < n; k++) {
        size_t e = first + k;
        int kind = w->kind[index];
        ((float *)dst)[k] = kind == 1 ? 1.0f : kind == 4 ? 0.0f
            : (float)((double)(mix(w->d->seed * 131 + (uint64_t)index * 1000003 + e) >> 11) / 9007199254740992.0 * 0.4 - 0.2);
    }
    return EMBER_OK;
}

/* Writes DFlash draft model d (hidden 64, heads 4/2 of 16, MLP 128, vocab 512) into dir. */
static void write_dflash(const char *dir, const dflash *d) {
    mkdir(dir, 0755);
    char path[700];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) exit(1);
    fprintf(f,
            "{\"architectures\": [\"DFlashDraftModel\"], \"model_type\": \"qwen3\", \"hidden_size\": 64, "
            "\"intermediate_size\": 128, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, "
            "\"num_hidden_layers\": %d, \"vocab_size\": 512, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, "
            "\"max_position_embeddings\": 512, \"tie_word_embeddings\": false, \"block_size\": %d, "
            "\"num_target_layers\": %d, \"dflash_config\": {\"mask_token_id\": %d",
            d->L, d->B, d->n_target, d->mask);
    if (d->ids) fprintf(f, ", \"target_layer_ids\": %s", d->ids);
    fprintf(f, "}}\n");
    fclose(f);
    static const struct {
        const char *name;
        int kind, r, c; /* r, c: 0 = H (64), -1 = 16, -2 = n_ids * 64, else the number */
    } per_layer[] = {{"input_layernorm.weight", 1, 0, 1},       {"self_attn.q_proj.weight", 0, 64, 0},
                     {"self_attn.k_proj.weight", 0, 32, 0},      {"self_attn.v_proj.weight", 0, 32, 0},
                     {"self_attn.o_proj.weight", 0, 0, 64},      {"self_attn.q_norm.weight", 1, -1, 1},
                     {"self_attn.k_norm.weight", 1, -1, 1},      {"post_attention_layernorm.weight", 1, 0, 1},
                     {"mlp.gate_proj.weight", 0, 128, 0},        {"mlp.up_proj.weight", 0, 128, 0},
                     {"mlp.down_proj.weight", 0, 0, 128}};
    enum { NP = sizeof per_layer / sizeof *per_layer };
    static char names[64][96];
    ember_st_out outs[64];
    df_writer w = {d, {0}};
    int n = 0;
    for (int l = 0; l < d->L; l++)
        for (int i = 0; i < NP; i++, n++) {
            snprintf(names[n], sizeof names[n], "layers.%d.%s", l, per_layer[i].name);
            int64_t r = per_layer[i].r == 0 ? 64 : per_layer[i].r == -1 ? 16 : per_layer[i].r;
            int64_t c = per_layer[i].c == 0 ? 64 : per_layer[i].c;
            bool vec = per_layer[i].c == 1;
            outs[n] = (ember_st_out){names[n], EMBER_F32, vec ? 1 : 2, {r, vec ? 0 : c}};
            w.kind[n] = per_layer[i].kind;
            if (d->zero_out && (i == 4 || i == 10)) w.kind[n] = 4;
        }
    outs[n] = (ember_st_out){"norm.weight", EMBER_F32, 1, {64}};
    w.kind[n++] = 1;
    outs[n] = (ember_st_out){"fc.weight", EMBER_F32, 2, {64, 64 * d->n_ids}};
    w.kind[n++] = 0;
    outs[n] = (ember_st_out){"hidden_norm.weight", EMBER_F32, 1, {64}};
    w.kind[n++] = 1;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ember_error err = {0};
    CHECKF(ember_st_write(path, outs, n, df_fill, &w, &err) == EMBER_OK, "%s", err.msg);
}

/* The token t whose argmax(lm_head(rmsnorm(embed[t]))) with the target's embedding and head (at dir) is want, or -1. */
static int mask_drafting(const char *dir, int want) {
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ember_st_file *f = NULL;
    ember_error err = {0};
    if (ember_st_open(path, &f, &err)) return -1;
    const ember_st_tensor *E = ember_st_find(f, "model.embed_tokens.weight"), *Lm = ember_st_find(f, "lm_head.weight");
    if (!Lm) Lm = E;
    int found = -1;
    if (E && Lm && E->dtype == EMBER_F32 && Lm->dtype == EMBER_F32 && E->shape[1] == 64) {
        const float *e = (const float *)E->data, *lm = (const float *)Lm->data;
        const int V = (int)E->shape[0];
        for (int t = 0; t < V && found < 0; t++) {
            float x[64];
            rms(e + (size_t)t * 64, 64, x); /* the draft model's own final norm: ones */
            int best = 0;
            double bv = -1e30;
            for (int v = 0; v < V; v++) {
                double acc = 0;
                for (int i = 0; i < 64; i++) acc += (double)lm[(size_t)v * 64 + i] * x[i];
                if (acc > bv) bv = acc, best = v;
            }
            if (best == want) found = t;
        }
    }
    ember_st_free(f);
    return found;
}

static void dflash_family(const char *family, const char *ids, int n_ids) {
    char dir[600], ddir[700];
    snprintf(dir, sizeof dir, "%s/fixtures/%s", shared_dir(), family);
    ember_model *m = load(dir, NREQ);
    const int V = m->cfg.vocab_size, N = m->cfg.n_layers;
    reqset q;
    make_requests(&q, V);
    result plain[NREQ];
    ember_engine *e = new_engine(m, NULL);
    run_wave(e, &q, 0, NREQ, plain);
    ember_engine_free(e);
    for (int i = 0; i < NREQ; i += 5) q.stop[i] = plain[i].ids[plain[i].n / 2];
    dflash d = {ids ? 2 : 1, 4, V - 1, N, ids, n_ids, false, 5};
    snprintf(ddir, sizeof ddir, "%s/dflash_%s", EMBER_TEST_TMP, family);
    write_dflash(ddir, &d);
    ember_model *dd = load(ddir, NREQ);
    greedy_with(family, m, dd, &q, plain);
    ember_model_free(dd);
    /* o_proj and down_proj zero: a mask position's output is lm_head(norm(embed(mask))), so a mask
       token whose argmax is the plain runs' most frequent token drafts it at every position */
    int *count = calloc((size_t)V, sizeof(int)), best = 0;
    for (int i = 0; i < NREQ; i++)
        for (int k = 0; k < plain[i].n; k++) count[plain[i].ids[k]]++;
    for (int t = 1; t < V; t++) best = count[t] > count[best] ? t : best;
    free(count);
    int mask = mask_drafting(dir, best);
    if (mask < 0) {
        fprintf(stderr, "note: %s: no token drafts %d through the final norm and head; acceptance not checked\n", family, best);
    } else {
        dflash z = {1, 8, mask, N, ids, n_ids, true, 6};
        snprintf(ddir, sizeof ddir, "%s/dflash_%s_z", EMBER_TEST_TMP, family);
        write_dflash(ddir, &z);
        dd = load(ddir, NREQ);
        uint64_t acc = greedy_with(family, m, dd, &q, plain);
        CHECKF(acc > 0, "%s: no DFlash draft of token %d accepted", family, best);
        ember_model_free(dd);
    }
    ember_model_free(m);
}

static void dflash_refused(void) {
    char dir[600], ddir[700];
    snprintf(dir, sizeof dir, "%s/fixtures/llama", shared_dir());
    ember_model *m = load(dir, 2);
    const struct {
        dflash d;
        const char *field;
    } bad[] = {{{1, 4, 511, 3, "[0]", 1, false, 1}, "num_target_layers 3"},
               {{1, 4, 511, 2, "[0, 2]", 2, false, 1}, "dflash_config.target_layer_ids"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(ddir, sizeof ddir, "%s/dflash_bad%zu", EMBER_TEST_TMP, i);
        write_dflash(ddir, &bad[i].d);
        ember_model *dd = load(ddir, 2);
        ember_engine_params ep = {0};
        ep.spec = EMBER_SPEC_DFLASH;
        ep.draft_model = dd;
        ember_engine *e = NULL;
        ember_error err = {0};
        CHECKF(ember_engine_new(m, &ep, &e, &err) == EMBER_ERR_INVALID_ARG && !e && strstr(err.msg, bad[i].field),
               "bad DFlash config %zu: '%s' (want %s)", i, err.msg, bad[i].field);
        ember_model_free(dd);
    }
    ember_model_free(m);
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

/* ember generate --spec eagle3 (and an EAGLE-3 directory given to --spec draft): the plain output;
   a plain model given to --spec eagle3 and a misfit config: exit 1 with one line naming why. */
static void cli(void) {
    char dir[600], cmd[2400], plain[4096], spec[4096], err[4096];
    snprintf(dir, sizeof dir, "%s/fixtures/llama", shared_dir());
    snprintf(cmd, sizeof cmd, "%s generate --model %s --ids 1,5,9,33,7 -n 24 --ignore-eos --temp 0 2>/dev/null", EMBER_BIN, dir);
    CHECK(run_cmd(cmd, plain, sizeof plain) == 0 && strlen(plain) > 20);
    const char *modes[] = {"eagle3", "draft"};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "%s generate --model %s --ids 1,5,9,33,7 -n 24 --ignore-eos --temp 0 --spec %s "
                 "--draft-model %s/eagle3_llama -v 2>&1", EMBER_BIN, dir, modes[i], EMBER_TEST_TMP);
        CHECK(run_cmd(cmd, spec, sizeof spec) == 0);
        CHECKF(strstr(spec, plain) != NULL && strstr(spec, "speculative decoding (EAGLE-3)") != NULL, "--spec %s: %s",
               modes[i], spec);
    }
    snprintf(cmd, sizeof cmd, "%s generate --model %s --ids 1,5,9,33,7 -n 24 --ignore-eos --temp 0 --spec dflash "
             "--draft-model %s/dflash_llama -v 2>&1", EMBER_BIN, dir, EMBER_TEST_TMP);
    CHECK(run_cmd(cmd, spec, sizeof spec) == 0);
    CHECKF(strstr(spec, plain) != NULL && strstr(spec, "speculative decoding (DFlash)") != NULL, "--spec dflash: %s", spec);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --ids 1,5 -n 4 --spec eagle3 --draft-model %s 2>&1", EMBER_BIN, dir, dir);
    CHECK(run_cmd(cmd, err, sizeof err) == 1 && strstr(err, "is not an EAGLE-3 draft model") && strchr(err, '\n') == err + strlen(err) - 1);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --ids 1,5 -n 4 --spec eagle3 --draft-model %s/eagle3_bad2 2>&1", EMBER_BIN,
             dir, EMBER_TEST_TMP);
    CHECKF(run_cmd(cmd, err, sizeof err) == 1 && strstr(err, "vocab_size 500") && strchr(err, '\n') == err + strlen(err) - 1,
           "%s", err);
}

int main(void) {
    shared_dir();
    refused();
    reference_step();
    static const char *const families[] = {"llama", "qwen3", "qwen3_5_text"};
    for (size_t i = 0; i < sizeof families / sizeof *families; i++) greedy_family(families[i]);
    dflash_refused();
    dflash_family("qwen3", "[0, 1]", 2);      /* taps: layer 0's output and the final norm's */
    dflash_family("llama", NULL, 1);          /* the default: the middle layer (1 of 2: after the norm) */
    dflash_family("qwen3_5_text", "[1, 2]", 2);
    cli();
    return test_done();
}
