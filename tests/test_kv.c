/*
 * test_kv.c - the KV cache contract, kind by kind: random sequences of
 * append (committed and failed), trim, speculative rounds, clone, extract /
 * merge (prepared, aborted, committed), filter, clear, save / load and
 * corrupt loads, checked after every step against a plain reference that
 * keeps every written vector in f32:
 *   - every position a row must hold decodes to exactly what the kind's
 *     codec makes of the reference vector (bit for bit), and that is within
 *     the kind's stated error of the reference (dense: its rounding; affine:
 *     half a step of its group; TQ: a bound on the relative error);
 *   - attention through the block table equals attention over the
 *     reference's decoded vectors (double precision) within 1e-5;
 *   - rotating layers hold no more than window + retain + chunk positions;
 *   - every failure (full budget, bad trim, corrupt blob) leaves the rows
 *     as they were, and at the end every block is back in its pool.
 */
#define TEST_RNG_SEED 0x6b76636f6e747261ull
#include "backend/kv_codec.h"
#include "kv/kv.h"
#include "kv/kv_internal.h"
#include "test.h"

#define ROWS 4
#define CTX 160
#define LAYERS 3
#define MAXHD 32
#define CHUNK 12
#define RETAIN 8
#define WINDOW 20

static const int k_heads[LAYERS] = {2, 2, 1};
static const int k_dims[LAYERS] = {16, 16, 32};
static const int k_win[LAYERS] = {0, 0, WINDOW};

typedef struct ref_row {
    int len;
    bool converted;
    float k[CTX][LAYERS][MAXHD], v[CTX][LAYERS][MAXHD]; /* what was written */
} ref_row;

typedef struct ctx {
    ember_backend *be;
    ember_kv *kv;
    ember_kv_type type;
    ref_row ref[ROWS];
    const char *name;
    int step;
} ctx;

static float gauss(void) {
    float u = 0;
    for (int i = 0; i < 4; i++) u += frnd();
    return u * 0.8660254f; /* about unit variance */
}

/* The codec of layer l for a row (converted or not). */
static void codec_of(const ctx *c, int l, bool is_k, bool converted, ember_kv_codec *cd, float *signs) {
    const ember_kv_type *t = &c->type;
    int D = k_dims[l];
    memset(cd, 0, sizeof *cd);
    bool final = t->quant_start == 0 || converted;
    cd->enc = final ? (is_k ? t->k_enc : t->v_enc) : EMBER_KVE_F32;
    cd->group = t->group < D ? t->group : D;
    cd->bits = is_k ? t->k_bits : t->v_bits;
    cd->codebook = ember_tq_codebook(cd->bits);
    cd->bounds = ember_tq_bounds(cd->bits);
    ember_tq_signs(EMBER_KV_TQ_SEED, D, signs);
    cd->signs = signs;
    cd->head_bytes = ember_kv_head_bytes(cd, D, is_k);
}

/* What the cache should hold for row r, layer l, one head, K or V, at
   positions [0, R->len): the reference vectors written block by block
   through the codec, as a fresh row would be (a converted row's first block
   normalized by its own f32 keys, later blocks by the block before). Also
   checks each value against the kind's stated error:
     f32 exact; f16 / bf16 their rounding;
     affine: half a step of its group (of the channel-normalized values,
             times the channel's spread), plus the f16 rounding of its bias;
     TQ: a bound on the vector's relative error (Lloyd-Max MSE x 6). */
static void simulate(const ctx *c, const ref_row *R, int l, int h, bool is_k, float (*out)[MAXHD]) {
    ember_kv_codec cd, c32;
    float signs[MAXHD], s32[MAXHD];
    codec_of(c, l, is_k, R->converted, &cd, signs);
    codec_of(c, l, is_k, false, &c32, s32);
    c32.enc = EMBER_KVE_F32;
    c32.head_bytes = ember_kv_head_bytes(&c32, k_dims[l], is_k);
    const int D = k_dims[l];
    static unsigned char cur[8192], prev[8192], first32[8192];
    for (int b = 0; b * EMBER_KV_BLOCK < R->len; b++) {
        int n = R->len - b * EMBER_KV_BLOCK < EMBER_KV_BLOCK ? R->len - b * EMBER_KV_BLOCK : EMBER_KV_BLOCK;
        const float *x[EMBER_KV_BLOCK];
        for (int s = 0; s < n; s++) {
            int p = b * EMBER_KV_BLOCK + s;
            x[s] = (is_k ? R->k[p][l] : R->v[p][l]) + h * D;
        }
        memset(cur, 0, sizeof cur);
        const unsigned char *pv = b ? prev : NULL;
        const ember_kv_codec *pc = NULL;
        if (b == 0 && cd.enc != EMBER_KVE_F32 && n == EMBER_KV_BLOCK) { /* converted: its own keys */
            memset(first32, 0, sizeof first32);
            for (int s = 0; s < n; s++) ember_kv_encode(&c32, D, is_k, x[s], first32, s, NULL, NULL);
            pv = first32;
            pc = &c32;
        }
        for (int s = 0; s < n; s++) ember_kv_encode(&cd, D, is_k, x[s], cur, s, pv, pc);
        for (int s = 0; s < n; s++) {
            float *y = out[b * EMBER_KV_BLOCK + s];
            ember_kv_decode(&cd, D, is_k, cur, s, y);
            switch (cd.enc) {
            case EMBER_KVE_F32:
                for (int d = 0; d < D; d++) CHECK(y[d] == x[s][d]);
                break;
            case EMBER_KVE_F16:
                for (int d = 0; d < D; d++) CHECK(y[d] == ember_f16_to_f32(ember_f32_to_f16(x[s][d])));
                break;
            case EMBER_KVE_BF16:
                for (int d = 0; d < D; d++) CHECK(y[d] == ember_bf16_to_f32(ember_f32_to_bf16(x[s][d])));
                break;
            case EMBER_KVE_Q8:
            case EMBER_KVE_Q4: {
                float mu[MAXHD], sg[MAXHD], xn[MAXHD];
                for (int d = 0; d < D; d++) {
                    mu[d] = 0;
                    sg[d] = 1;
                    if (is_k) {
                        size_t o = ember_kv_norm_offset(&cd, D);
                        uint16_t hm, hs;
                        memcpy(&hm, cur + o + 2 * d, 2);
                        memcpy(&hs, cur + o + 2 * (size_t)D + 2 * d, 2);
                        mu[d] = ember_f16_to_f32(hm);
                        sg[d] = hs ? ember_f16_to_f32(hs) : 1.0f;
                    }
                    xn[d] = (x[s][d] - mu[d]) / sg[d];
                }
                for (int g = 0; g < D / cd.group; g++) {
                    float mn = xn[g * cd.group], mx = mn;
                    for (int d = g * cd.group; d < (g + 1) * cd.group; d++) {
                        mn = fminf(mn, xn[d]);
                        mx = fmaxf(mx, xn[d]);
                    }
                    float step = (mx - mn) / (cd.enc == EMBER_KVE_Q8 ? 255.0f : 15.0f);
                    for (int d = g * cd.group; d < (g + 1) * cd.group; d++) {
                        float bound = sg[d] * (0.5f * step * 1.002f + fabsf(mn) * (1.0f / 1024) + 1e-5f) +
                                      1e-5f * fabsf(x[s][d]);
                        CHECKF(fabsf(y[d] - x[s][d]) <= bound, "%s affine error %g > %g", c->name,
                               fabsf(y[d] - x[s][d]), bound);
                    }
                }
                break;
            }
            case EMBER_KVE_TQ: {
                static const double mse[9] = {0, 0, 0.118, 0.0345, 0.0095, 0.0025, 0.00065, 0.00017, 0.00005};
                double e = 0, nn = 0;
                float mu[MAXHD] = {0};
                if (is_k) {
                    size_t o = ember_kv_norm_offset(&cd, D);
                    for (int d = 0; d < D; d++) {
                        uint16_t hm;
                        memcpy(&hm, cur + o + 2 * d, 2);
                        mu[d] = ember_f16_to_f32(hm);
                    }
                }
                for (int d = 0; d < D; d++) {
                    e += ((double)y[d] - x[s][d]) * ((double)y[d] - x[s][d]);
                    nn += ((double)x[s][d] - mu[d]) * ((double)x[s][d] - mu[d]);
                }
                double bound = 6 * mse[cd.bits] + 0.002; /* small D: the rotated values are far from Gaussian */
                CHECKF(e <= bound * nn * 4 + 1e-9, "%s TQ%d relative error %g > %g", c->name, cd.bits, e / nn, bound);
                break;
            }
            }
        }
        memcpy(prev, cur, sizeof prev);
    }
}

/* Every position row r must hold, against the reference. */
static void verify_row(ctx *c, int r) {
    ref_row *R = &c->ref[r];
    CHECKF(ember_kv_len(c->kv, r) == R->len, "%s step %d row %d: len %d, want %d", c->name, c->step, r,
           ember_kv_len(c->kv, r), R->len);
    if (ember_kv_len(c->kv, r) != R->len) return;
    static float ek[4][CTX][MAXHD], ev[4][CTX][MAXHD];
    for (int l = 0; l < LAYERS; l++) {
        for (int h = 0; h < k_heads[l]; h++) {
            simulate(c, R, l, h, true, ek[h]);
            simulate(c, R, l, h, false, ev[h]);
        }
        int lo = k_win[l] ? R->len - k_win[l] + 1 : 0; /* what a rotating layer must keep: the next window */
        for (int p = lo < 0 ? 0 : lo; p < R->len; p++) {
            float k[MAXHD * 2], v[MAXHD * 2];
            ember_error err = {0};
            int rc = ember_kv_read_pos(c->kv, r, l, p, k, v, &err);
            CHECKF(rc == EMBER_OK, "%s step %d row %d layer %d pos %d: %s", c->name, c->step, r, l, p, err.msg);
            if (rc) return;
            for (int h = 0; h < k_heads[l]; h++) {
                bool ok = !memcmp(ek[h][p], k + h * k_dims[l], (size_t)k_dims[l] * 4) &&
                          !memcmp(ev[h][p], v + h * k_dims[l], (size_t)k_dims[l] * 4);
                CHECKF(ok, "%s step %d row %d layer %d pos %d head %d: decoded values differ", c->name, c->step, r,
                       l, p, h);
                if (!ok) return;
            }
        }
        if (k_win[l]) { /* memory bounded by the window */
            kv_tab *t = kv_tab_of(c->kv, c->kv->layer_group[l], r);
            CHECKF(t->n <= (WINDOW + RETAIN + CHUNK) / EMBER_KV_BLOCK + 2, "%s row %d: rotating layer holds %d blocks",
                   c->name, r, t->n);
        }
    }
}

static void verify_all(ctx *c) {
    for (int r = 0; r < ROWS; r++) verify_row(c, r);
}

/* Attention of a random query at the last position of row r, every layer,
   against the reference in double. */
static void check_attention(ctx *c, int r) {
    ref_row *R = &c->ref[r];
    if (R->len == 0) return;
    for (int l = 0; l < LAYERS; l++) {
        const int H = k_heads[l], D = k_dims[l], Hq = 2 * H, p = R->len - 1;
        float q[4 * MAXHD], out[4 * MAXHD];
        for (int i = 0; i < Hq * D; i++) q[i] = gauss();
        /* through the backend, with the map a forward would use */
        ember_kv_layer views[2];
        ember_kv_map map;
        int32_t rowv = r, posv = p;
        int g = c->kv->layer_group[l];
        kv_tab *t = kv_tab_of(c->kv, g, r);
        c->kv->refs[(size_t)g * ROWS + (size_t)r] = (ember_kv_rowref){t->blk, t->first, t->n, R->converted ? 1 : 0};
        ember_kv_map_for(c->kv, l, &rowv, &posv, views, &map);
        ember_buffer *qb, *ob;
        ember_tensor qt, ot;
        ember_error err = {0};
        const int64_t shape[3] = {1, Hq, D};
        CHECK(ember_tensor_alloc(c->be, &qt, &qb, EMBER_F32, 3, shape, &err) == EMBER_OK);
        CHECK(ember_tensor_alloc(c->be, &ot, &ob, EMBER_F32, 3, shape, &err) == EMBER_OK);
        c->be->ops->write(c->be, &qt, 0, q, sizeof(float) * (size_t)(Hq * D), &err);
        ember_attn a = {1.0f / sqrtf((float)D), k_win[l], 0};
        int rc = c->be->ops->attention(c->be, &ot, &qt, &map, &a, &err);
        CHECKF(rc == EMBER_OK, "%s attention: %s", c->name, err.msg);
        c->be->ops->read(c->be, &ot, 0, out, sizeof(float) * (size_t)(Hq * D), &err);
        ember_buffer_free(qb);
        ember_buffer_free(ob);
        int lo = k_win[l] && p - k_win[l] + 1 > 0 ? p - k_win[l] + 1 : 0;
        static float ek[CTX][MAXHD], ev[CTX][MAXHD];
        for (int hq = 0; hq < Hq; hq++) {
            int h = hq / (Hq / H);
            if (hq % (Hq / H) == 0) {
                simulate(c, R, l, h, true, ek);
                simulate(c, R, l, h, false, ev);
            }
            double s[CTX], mx = -1e300, sum = 0, o[MAXHD] = {0};
            for (int j = lo; j <= p; j++) {
                double d = 0;
                for (int i = 0; i < D; i++) d += (double)q[hq * D + i] * ek[j][i];
                s[j] = d * a.scale;
                if (s[j] > mx) mx = s[j];
            }
            for (int j = lo; j <= p; j++) {
                double w = exp(s[j] - mx);
                sum += w;
                for (int i = 0; i < D; i++) o[i] += w * ev[j][i];
            }
            double worst = 0, scale = 1e-30;
            for (int i = 0; i < D; i++) {
                worst = fmax(worst, fabs(o[i] / sum - out[hq * D + i]));
                scale = fmax(scale, fabs(o[i] / sum));
            }
            CHECKF(worst <= 1e-5 * (1 + scale), "%s step %d row %d layer %d head %d: attention off by %g", c->name,
                   c->step, r, l, hq, worst);
        }
    }
}

/* Appends n[r] random positions to the rows with n[r] > 0; fail: the
   forward fails after writing (ember_kv_end(false)). Returns the status of
   ember_kv_begin. */
static int append(ctx *c, const int *n, bool fail) {
    int32_t row[ROWS * CHUNK], pos[ROWS * CHUNK];
    int T = 0;
    for (int r = 0; r < ROWS; r++)
        for (int i = 0; i < n[r]; i++) {
            row[T] = r;
            pos[T] = c->ref[r].len + i;
            T++;
        }
    if (!T) return EMBER_OK;
    /* interleave rows the way a batch may */
    for (int i = T - 1; i > 0; i--) {
        int j = (int)(rnd() % (uint32_t)(i + 1));
        if (row[i] != row[j]) { /* keep each row's positions in order: swap only rows' slots, then renumber */
            int32_t tr = row[i];
            row[i] = row[j];
            row[j] = tr;
        }
    }
    int seen[ROWS] = {0};
    for (int t = 0; t < T; t++) pos[t] = c->ref[row[t]].len + seen[row[t]]++;
    ember_error err = {0};
    size_t need = 0; /* a refusal must come from the budget, not from a pool that filled first */
    for (int r = 0; r < ROWS; r++) need += ember_kv_need_bytes(c->kv, r, n[r]);
    const size_t free_b = ember_kv_free_bytes(c->kv);
    int rc = ember_kv_begin(c->kv, row, pos, T, &err);
    CHECKF(rc != EMBER_ERR_NOMEM || need > free_b, "%s: refused %zu bytes with %zu free (%s)", c->name, need, free_b,
           err.msg);
    if (rc) return rc;
    static float kvals[ROWS * CHUNK][LAYERS][MAXHD], vvals[ROWS * CHUNK][LAYERS][MAXHD];
    for (int l = 0; l < LAYERS; l++) {
        int HD = k_heads[l] * k_dims[l];
        ember_buffer *kb, *vb;
        ember_tensor kt, vt;
        const int64_t shape[3] = {T, k_heads[l], k_dims[l]};
        CHECK(ember_tensor_alloc(c->be, &kt, &kb, EMBER_F32, 3, shape, &err) == EMBER_OK);
        CHECK(ember_tensor_alloc(c->be, &vt, &vb, EMBER_F32, 3, shape, &err) == EMBER_OK);
        float tk[ROWS * CHUNK * MAXHD], tv[ROWS * CHUNK * MAXHD];
        for (int t = 0; t < T; t++)
            for (int i = 0; i < HD; i++) {
                kvals[t][l][i] = tk[t * HD + i] = gauss() * (i % 7 == 0 ? 4.0f : 1.0f); /* a few outlier dims */
                vvals[t][l][i] = tv[t * HD + i] = gauss();
            }
        c->be->ops->write(c->be, &kt, 0, tk, (size_t)T * HD * 4, &err);
        c->be->ops->write(c->be, &vt, 0, tv, (size_t)T * HD * 4, &err);
        ember_kv_layer views[2];
        ember_kv_map map;
        ember_kv_map_for(c->kv, l, row, pos, views, &map);
        rc = c->be->ops->kv_write(c->be, &map, &kt, &vt, &err);
        CHECKF(rc == EMBER_OK, "%s kv_write: %s", c->name, err.msg);
        ember_buffer_free(kb);
        ember_buffer_free(vb);
    }
    ember_kv_end(c->kv, !fail);
    if (!fail) {
        for (int t = 0; t < T; t++) {
            ref_row *R = &c->ref[row[t]];
            for (int l = 0; l < LAYERS; l++) {
                memcpy(R->k[pos[t]][l], kvals[t][l], sizeof R->k[0][0]);
                memcpy(R->v[pos[t]][l], vvals[t][l], sizeof R->v[0][0]);
            }
        }
        for (int r = 0; r < ROWS; r++) {
            if (!n[r]) continue;
            ref_row *R = &c->ref[r];
            if (c->type.quant_start && !R->converted && R->len == c->type.quant_start) R->converted = true;
            R->len += n[r];
        }
    }
    return EMBER_OK;
}

static ref_row g_held_ref[3]; /* the reference of each detached state */

static int rand_chunk(ctx *c, int r) {
    int lim = ember_kv_max_append(c->kv, r);
    if (lim > CHUNK) lim = CHUNK;
    if (lim <= 0) return 0;
    return 1 + (int)(rnd() % (uint32_t)lim);
}

/* A plan of p (ember_kv_new without a backend) against the cache kv made
   of p: the same sizes, and the pools' bytes those kv allocated. */
static void check_plan(const ember_kv *kv, const ember_kv_params *p, const char *name) {
    ember_kv *plan = NULL;
    ember_error err = {0};
    CHECKF(ember_kv_new(NULL, p, &plan, &err) == EMBER_OK, "%s: plan: %s", name, err.msg);
    if (!plan) return;
    size_t real = 0;
    for (int g = 0; g < kv->n_groups; g++)
        for (int i = 0; i < kv->g[g].n_pools; i++) {
            CHECKF(kv->g[g].pool[i].buf && !plan->g[g].pool[i].buf, "%s: group %d pool %d allocated in the plan", name,
                   g, i);
            real += kv->g[g].pool[i].t.nbytes;
        }
    CHECKF(ember_kv_pool_bytes(kv) == real, "%s: pool bytes %zu, the buffers %zu", name, ember_kv_pool_bytes(kv), real);
    CHECKF(ember_kv_pool_bytes(plan) == real, "%s: the plan's pool bytes %zu, the cache's %zu", name,
           ember_kv_pool_bytes(plan), real);
    CHECK(ember_kv_capacity_bytes(plan) == ember_kv_capacity_bytes(kv));
    CHECK(ember_kv_request_bytes(plan, CTX) == ember_kv_request_bytes(kv, CTX));
    CHECK(ember_kv_bytes_per_token(plan, false) == ember_kv_bytes_per_token(kv, false));
    ember_kv_free(plan);
}

/* budget_rows > 0: a budget of that many full rows, so appends get refused */
static void run_kind(const char *kind, int group, int quant_start, double budget_rows, int steps) {
    ctx *c = calloc(1, sizeof *c);
    char name[64];
    snprintf(name, sizeof name, "%s", kind);
    if (group) snprintf(name + strlen(name), sizeof name - strlen(name), "/g%d", group);
    if (quant_start) snprintf(name + strlen(name), sizeof name - strlen(name), "@%d", quant_start);
    if (budget_rows > 0) snprintf(name + strlen(name), sizeof name - strlen(name), " (%.1f rows)", budget_rows);
    c->name = name;
    ember_error err = {0};
    ember_cpu_params cp = {2, EMBER_ISA_AUTO, false, {0}};
    CHECK(ember_backend_cpu_new(&cp, &c->be, &err) == EMBER_OK);
    CHECKF(ember_kv_type_parse(kind, group, quant_start, &c->type, &err) == EMBER_OK, "%s", err.msg);
    ember_kv_params p = {c->type, LAYERS, k_heads, k_dims, k_win, ROWS, CTX, 0, RETAIN, CHUNK, NULL, {0}};
    int rc = ember_kv_new(c->be, &p, &c->kv, &err);
    size_t budget = 0;
    if (!rc && budget_rows > 0) {
        budget = (size_t)(budget_rows * (double)ember_kv_request_bytes(c->kv, CTX));
        ember_kv_free(c->kv);
        p.budget = budget;
        rc = ember_kv_new(c->be, &p, &c->kv, &err);
    }
    CHECKF(rc == EMBER_OK, "%s: %s", name, err.msg);
    if (rc) return;
    check_plan(c->kv, &p, name);
    ember_kv_rowstate *held[3] = {0};
    int n_nomem = 0, n_ok = 0;
    size_t touched_max = 0;
    for (c->step = 0; c->step < steps; c->step++) {
        int op = (int)(rnd() % 100);
        if (op < 40) { /* append to some rows, sometimes failing */
            int n[ROWS] = {0};
            for (int r = 0; r < ROWS; r++)
                if (rnd() % 2 && !ember_kv_in_spec(c->kv, r)) n[r] = rand_chunk(c, r);
            bool fail = rnd() % 8 == 0;
            size_t used = ember_kv_used_bytes(c->kv);
            rc = append(c, n, fail);
            if (rc == EMBER_ERR_NOMEM) n_nomem++;
            else if (!fail) n_ok++;
            CHECKF(rc == EMBER_OK || rc == EMBER_ERR_NOMEM, "%s: append failed with %d", name, rc);
            if (rc || fail) CHECKF(ember_kv_used_bytes(c->kv) == used, "%s: a failed append kept blocks", name);
        } else if (op < 50) { /* trim, sometimes below what the row can give */
            int r = (int)(rnd() % ROWS), len = c->ref[r].len;
            if (ember_kv_in_spec(c->kv, r)) continue;
            int n = len ? (int)(rnd() % (uint32_t)(len + 1)) : 0;
            rc = ember_kv_trim(c->kv, r, n, &err);
            int lo = ember_kv_min_reuse(c->kv, r);
            if (n == 0 || n >= lo) {
                CHECKF(rc == EMBER_OK, "%s: trim %d of %d: %s", name, n, len, err.msg);
                if (!rc) {
                    c->ref[r].len = n;
                    if (n == 0) c->ref[r].converted = false;
                }
            } else {
                CHECK(rc != EMBER_OK);
            }
        } else if (op < 62) { /* a speculative round */
            int r = (int)(rnd() % ROWS);
            if (ember_kv_in_spec(c->kv, r)) continue;
            int base = c->ref[r].len;
            CHECK(ember_kv_spec_begin(c->kv, r, &err) == EMBER_OK);
            CHECK(ember_kv_spec_begin(c->kv, r, &err) != EMBER_OK); /* not twice */
            CHECK(ember_kv_trim(c->kv, r, base, &err) != EMBER_OK); /* no trims inside a round */
            int n[ROWS] = {0}, total = 0;
            for (int k = 0; k < 2; k++) { /* one or two draft forwards */
                n[r] = rand_chunk(c, r);
                if (append(c, n, false) == EMBER_OK) total += n[r];
            }
            int keep = total ? (int)(rnd() % (uint32_t)(total + 1)) : 0;
            if (rnd() % 3 == 0) {
                CHECK(ember_kv_spec_rollback(c->kv, r, &err) == EMBER_OK);
                keep = 0;
            } else {
                CHECK(ember_kv_spec_commit(c->kv, r, total + 1, &err) != EMBER_OK);
                CHECK(ember_kv_spec_commit(c->kv, r, keep, &err) == EMBER_OK);
            }
            c->ref[r].len = base + keep;
            CHECK(!ember_kv_in_spec(c->kv, r));
        } else if (op < 70) { /* clone */
            int s = (int)(rnd() % ROWS), d = (int)(rnd() % ROWS);
            if (ember_kv_in_spec(c->kv, s) || ember_kv_in_spec(c->kv, d)) continue;
            CHECKF(ember_kv_clone(c->kv, s, d, &err) == EMBER_OK, "%s", err.msg);
            if (s != d) c->ref[d] = c->ref[s];
        } else if (op < 78) { /* extract, keep, later merge back somewhere */
            int r = (int)(rnd() % ROWS), slot = (int)(rnd() % 3);
            if (ember_kv_in_spec(c->kv, r)) continue;
            if (!held[slot]) {
                CHECKF(ember_kv_extract(c->kv, r, &held[slot], &err) == EMBER_OK, "%s", err.msg);
                g_held_ref[slot] = c->ref[r]; /* the reference travels with the state */
            } else {
                int d = (int)(rnd() % ROWS);
                if (ember_kv_in_spec(c->kv, d)) continue;
                ember_kv_clear(c->kv, d);
                c->ref[d].len = 0;
                c->ref[d].converted = false;
                ember_kv_prepared *pp;
                int dd[2] = {d, d};
                CHECK(ember_kv_merge_prepare(c->kv, (ember_kv_rowstate *const[]){held[slot], held[slot]}, dd, 2, &pp,
                                             &err) != EMBER_OK); /* a row named twice */
                CHECKF(ember_kv_merge_prepare(c->kv, &held[slot], &d, 1, &pp, &err) == EMBER_OK, "%s", err.msg);
                if (rnd() % 2) {
                    ember_kv_merge_abort(c->kv, pp);
                } else {
                    ember_kv_merge_commit(c->kv, pp);
                    c->ref[d] = g_held_ref[slot];
                }
                if (rnd() % 2) {
                    ember_kv_rowstate_free(c->kv, held[slot]);
                    held[slot] = NULL;
                }
            }
        } else if (op < 82) { /* filter */
            int keep[ROWS], nk = 0;
            for (int r = 0; r < ROWS; r++)
                if (rnd() % 4 || ember_kv_in_spec(c->kv, r)) keep[nk++] = r;
            ember_kv_filter(c->kv, keep, nk);
            for (int r = 0; r < ROWS; r++) {
                bool k = false;
                for (int i = 0; i < nk; i++) k |= keep[i] == r;
                if (!k) c->ref[r].len = 0, c->ref[r].converted = false;
            }
        } else if (op < 85) { /* clear */
            int r = (int)(rnd() % ROWS);
            ember_kv_clear(c->kv, r);
            c->ref[r].len = 0;
            c->ref[r].converted = false;
        } else if (op < 95) { /* save, then load into some row; corrupt copies are refused */
            int r = (int)(rnd() % ROWS), d = (int)(rnd() % ROWS);
            if (ember_kv_in_spec(c->kv, r) || ember_kv_in_spec(c->kv, d)) continue;
            void *blob;
            size_t n;
            CHECKF(ember_kv_row_save(c->kv, r, &blob, &n, &err) == EMBER_OK, "%s", err.msg);
            unsigned char *bad = malloc(n);
            memcpy(bad, blob, n);
            bad[rnd() % n] ^= (unsigned char)(1u << (rnd() % 8));
            CHECK(ember_kv_row_load(c->kv, d, bad, n, &err) == EMBER_ERR_FORMAT);
            CHECK(ember_kv_row_load(c->kv, d, blob, n - 1 - rnd() % (n - 1), &err) != EMBER_OK);
            free(bad);
            verify_row(c, d); /* unchanged by the refused loads */
            rc = ember_kv_row_load(c->kv, d, blob, n, &err);
            CHECKF(rc == EMBER_OK || rc == EMBER_ERR_NOMEM, "%s: load: %s", name, err.msg);
            if (rc == EMBER_OK) c->ref[d] = c->ref[r];
            free(blob);
        } else {
            check_attention(c, (int)(rnd() % ROWS));
        }
        verify_all(c);
        /* the pools' high-water mark: never below what is held, never falls */
        size_t touched = ember_kv_touched_bytes(c->kv);
        CHECKF(touched >= ember_kv_used_bytes(c->kv) && touched >= touched_max,
               "%s: step %d: touched %zu bytes, held %zu, earlier mark %zu", name, c->step, touched,
               ember_kv_used_bytes(c->kv), touched_max);
        touched_max = touched;
        if (g_fail > 20) break;
    }
    for (int r = 0; r < ROWS; r++) check_attention(c, r);
    for (int i = 0; i < 3; i++) ember_kv_rowstate_free(c->kv, held[i]);
    for (int r = 0; r < ROWS; r++) {
        if (ember_kv_in_spec(c->kv, r)) ember_kv_spec_rollback(c->kv, r, &err);
        ember_kv_clear(c->kv, r);
    }
    CHECKF(ember_kv_used_bytes(c->kv) == 0 && ember_kv_blocks_used(c->kv) == 0, "%s: %zu bytes still held", name,
           ember_kv_used_bytes(c->kv));
    CHECKF(touched_max > 0 && ember_kv_touched_bytes(c->kv) == touched_max, "%s: touched %zu after clearing, mark %zu",
           name, ember_kv_touched_bytes(c->kv), touched_max);
    CHECKF(n_ok > steps / 40, "%s: only %d appends went through", name, n_ok);
    if (budget) CHECKF(n_nomem > 0, "%s: the small budget never filled", name);
    fprintf(stderr, "%-20s %d steps, %d appends, %d refused for memory\n", name, steps, n_ok, n_nomem);
    ember_kv_free(c->kv);
    ember_backend_free(c->be);
    free(c);
}

int main(void) {
    static const struct {
        const char *kind;
        int group, quant_start;
    } kinds[] = {
        {"f32", 0, 0},  {"f16", 0, 0},      {"bf16", 0, 0},     {"q8", 32, 0},      {"q4", 32, 0},
        {"q8", 128, 0}, {"tq-k8v4", 0, 0}, {"tq-k4v3", 0, 0},  {"tq-k3v2", 0, 0}, {"q4", 64, 40},
        {"tq-k4v4", 0, 40},
    };
#if defined(__SANITIZE_ADDRESS__)
    const int steps = 200; /* the sanitizer build runs fewer steps: each is ~6x slower */
#else
    const int steps = 600;
#endif
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        run_kind(kinds[i].kind, kinds[i].group, kinds[i].quant_start, 0, steps);
        run_kind(kinds[i].kind, kinds[i].group, kinds[i].quant_start, 1.5, steps / 2);
    }
    /* a plan allocates nothing: 65,536 rows of 65,536 positions plan at once,
       and their size is reported: a budget of 3 TiB (768 bytes a position),
       for each of the two layer groups (heads x dims 2 x 16 and 1 x 32) a
       pool of the whole budget (kv.h: ember_kv_pool_bytes) */
    ember_kv_type t;
    ember_error err = {0};
    CHECK(ember_kv_type_parse("f32", 0, 0, &t, &err) == EMBER_OK);
    ember_kv_params big = {t, LAYERS, k_heads, k_dims, NULL, 1 << 16, 1 << 16, 0, RETAIN, CHUNK, NULL, {0}};
    ember_kv *plan = NULL;
    CHECKF(ember_kv_new(NULL, &big, &plan, &err) == EMBER_OK, "%s", err.msg);
    if (plan) {
        const size_t want = (size_t)2 * 768 << 32;
        CHECKF(ember_kv_pool_bytes(plan) >= want && ember_kv_pool_bytes(plan) < want + (want >> 10),
               "the big plan's pools: %zu bytes", ember_kv_pool_bytes(plan));
        ember_kv_free(plan);
    }
    /* bad kinds and sizes are refused */
    CHECK(ember_kv_type_parse("q5", 0, 0, &t, &err) == EMBER_ERR_INVALID_ARG && strstr(err.msg, "q5"));
    CHECK(ember_kv_type_parse("tq-k9v4", 0, 0, &t, &err) == EMBER_ERR_INVALID_ARG);
    CHECK(ember_kv_type_parse("tq-k4", 0, 0, &t, &err) == EMBER_ERR_INVALID_ARG);
    CHECK(ember_kv_type_parse("q4", 48, 0, &t, &err) == EMBER_ERR_INVALID_ARG && strstr(err.msg, "48"));
    CHECK(ember_kv_type_parse("f16", 64, 0, &t, &err) == EMBER_ERR_INVALID_ARG);
    CHECK(ember_kv_type_parse("f16", 0, 100, &t, &err) == EMBER_ERR_INVALID_ARG);
    CHECK(ember_kv_type_parse("q8", 0, -1, &t, &err) == EMBER_ERR_INVALID_ARG);
    return test_done();
}
