/*
 * test_kv_codec.c - the KV codecs and the paged attention kernels.
 *   - The TQ codebooks are the Lloyd-Max quantizers of N(0, 1): each
 *     centroid is the mean of its cell (recomputed here in double), each
 *     threshold the midpoint of its neighbours.
 *   - The TQ rotation is orthonormal (rotate then unrotate gives x back,
 *     norms are kept), for power-of-two and composite head sizes.
 *   - Every codec decodes what it encoded within its error, K and V
 *     layouts, every slot of a block, without touching the other slots.
 *   - Attention through block tables, every kind, on every ISA the CPU
 *     has: equal to a double-precision reference over the decoded keys and
 *     values within 2e-6, the same bits whether a token's keys are split
 *     over threads (few tokens) or not (many tokens), at 1 and 2 threads,
 *     and the same bits on AVX2 and AVX-512. Contexts of 1300 positions so
 *     several 512-key spans combine; windows and soft-capping too.
 */
#define TEST_RNG_SEED 0x6b76636f64656321ull
#include "backend/kv_codec.h"
#include "kv/kv.h"
#include "kv/kv_internal.h"
#include "test.h"

static double phi(double x) {
    return exp(-0.5 * x * x) / 2.50662827463100050242; /* sqrt(2 pi) */
}
static double Phi(double x) {
    return 0.5 * erfc(-x / sqrt(2.0));
}

static void test_codebooks(void) {
    for (int b = 2; b <= 8; b++) {
        const float *c = ember_tq_codebook(b), *t = ember_tq_bounds(b);
        int n = 1 << b;
        double worst = 0;
        for (int i = 0; i < n; i++) {
            double lo = i ? t[i - 1] : -INFINITY, hi = i < n - 1 ? t[i] : INFINITY;
            double plo = i ? phi(lo) : 0, phi_hi = i < n - 1 ? phi(hi) : 0;
            double mass = (i < n - 1 ? Phi(hi) : 1) - (i ? Phi(lo) : 0);
            double mean = (plo - phi_hi) / mass;
            worst = fmax(worst, fabs(mean - c[i]));
            if (i) CHECK(c[i] > c[i - 1]);
            if (i < n - 1) CHECK(t[i] == 0.5f * (c[i] + c[i + 1]));
            CHECK(c[i] == -c[n - 1 - i]);
        }
        CHECKF(worst < 2e-6, "%d-bit codebook: a centroid is %g from its cell's mean", b, worst);
    }
    CHECK(ember_tq_codebook(1) == NULL && ember_tq_codebook(9) == NULL);
}

static void test_rotation(void) {
    const int dims[] = {8, 16, 64, 128, 80, 96, 24};
    for (size_t k = 0; k < sizeof dims / sizeof dims[0]; k++) {
        int D = dims[k];
        float s[128], x[128], y[128], z[128];
        ember_tq_signs(7, D, s);
        int neg = 0;
        for (int i = 0; i < D; i++) {
            CHECK(s[i] == 1.0f || s[i] == -1.0f);
            neg += s[i] < 0;
            x[i] = frnd();
        }
        CHECK(neg > 0 && neg < D);
        ember_tq_rotate(s, D, x, y);
        double nx = 0, ny = 0, e = 0;
        for (int i = 0; i < D; i++) {
            nx += (double)x[i] * x[i];
            ny += (double)y[i] * y[i];
        }
        ember_tq_unrotate(s, D, y, z);
        for (int i = 0; i < D; i++) e = fmax(e, fabs(z[i] - x[i]));
        CHECKF(fabs(nx - ny) < 1e-5 * nx && e < 1e-6, "D=%d: rotation not orthonormal (%g, %g)", D, nx - ny, e);
        memcpy(z, y, sizeof z);
        ember_tq_unrotate(s, D, z, z); /* in place */
        for (int i = 0; i < D; i++) CHECK(fabsf(z[i] - x[i]) < 1e-6f);
    }
}

static void test_roundtrip(void) {
    const ember_kv_enc encs[] = {EMBER_KVE_F32, EMBER_KVE_F16, EMBER_KVE_BF16, EMBER_KVE_Q8, EMBER_KVE_Q4, EMBER_KVE_TQ};
    const int dims[] = {8, 64, 80, 128};
    float signs[128];
    for (size_t e = 0; e < 6; e++)
        for (size_t k = 0; k < 4; k++)
            for (int is_k = 0; is_k < 2; is_k++) {
                int D = dims[k];
                ember_tq_signs(3, D, signs);
                ember_kv_codec c = {encs[e], D < 32 ? D : (D % 32 ? 16 : 32), 4, ember_tq_codebook(4),
                                    ember_tq_bounds(4), signs, 0};
                c.head_bytes = ember_kv_head_bytes(&c, D, is_k);
                CHECK(c.head_bytes > 0);
                unsigned char *p = calloc(1, c.head_bytes), *q = malloc(c.head_bytes);
                float x[16][128], y[128];
                for (int s = 0; s < 16; s++) {
                    for (int d = 0; d < D; d++) x[s][d] = frnd() * 3;
                    ember_kv_encode(&c, D, is_k, x[s], p, s, NULL, NULL);
                }
                memcpy(q, p, c.head_bytes);
                /* rewriting one slot leaves the other slots' bytes alone */
                ember_kv_encode(&c, D, is_k, x[9], p, 9, NULL, NULL);
                CHECK(!memcmp(p, q, c.head_bytes));
                for (int s = 0; s < 16; s++) {
                    ember_kv_decode(&c, D, is_k, p, s, y);
                    double err = 0, n = 0, worst = 0;
                    for (int d = 0; d < D; d++) {
                        err += ((double)y[d] - x[s][d]) * ((double)y[d] - x[s][d]);
                        n += (double)x[s][d] * x[s][d];
                        worst = fmax(worst, fabs(y[d] - x[s][d]));
                    }
                    double bound = encs[e] == EMBER_KVE_F32 ? 0 : encs[e] == EMBER_KVE_F16 ? 3 * 4.9e-4 :
                                   encs[e] == EMBER_KVE_BF16 ? 3 * 3.9e-3 : encs[e] == EMBER_KVE_Q8 ? 6.0 / 255 * 0.51 + 3e-3 :
                                   encs[e] == EMBER_KVE_Q4 ? 6.0 / 15 * 0.51 + 3e-3 : -1;
                    if (bound >= 0)
                        CHECKF(worst <= bound, "enc %zu D %d k %d slot %d: error %g > %g", e, D, is_k, s, worst, bound);
                    else
                        CHECKF(err <= 0.08 * n, "TQ4 D %d: relative error %g", D, err / n);
                }
                free(p);
                free(q);
            }
}

/* ---- attention ---------------------------------------------------------------- */

#define N_POS 1300

typedef struct acase {
    const char *kind;
    int heads, hq, dim, window;
    float softcap;
} acase;

/* A one-layer cache holding one row of N_POS random positions. */
static ember_kv *fill(ember_backend *be, const char *kind, int H, int D, int window) {
    ember_kv_type t;
    ember_error err = {0};
    CHECKF(ember_kv_type_parse(kind, 0, 0, &t, &err) == EMBER_OK, "%s", err.msg);
    const int heads[1] = {H}, dims[1] = {D}, win[1] = {window};
    ember_kv_params p = {t, 1, heads, dims, win, 1, 4096, 0, 4096, 256, NULL, {0}};
    ember_kv *kv = NULL;
    CHECKF(ember_kv_new(be, &p, &kv, &err) == EMBER_OK, "%s", err.msg);
    uint64_t saved = g_rng;
    g_rng = 99; /* the same values in every cache */
    for (int s = 0, n; s < N_POS; s += n) {
        n = N_POS - s < 256 ? N_POS - s : 256;
        if (n > ember_kv_max_append(kv, 0)) n = ember_kv_max_append(kv, 0); /* stop at the conversion */
        int32_t row[256], pos[256];
        for (int i = 0; i < n; i++) row[i] = 0, pos[i] = s + i;
        CHECK(ember_kv_begin(kv, row, pos, n, &err) == EMBER_OK);
        ember_buffer *kb, *vb;
        ember_tensor kt, vt;
        const int64_t shape[3] = {n, H, D};
        ember_tensor_alloc(be, &kt, &kb, EMBER_F32, 3, shape, &err);
        ember_tensor_alloc(be, &vt, &vb, EMBER_F32, 3, shape, &err);
        float *tmp = malloc(sizeof(float) * (size_t)n * H * D);
        for (int i = 0; i < n * H * D; i++) tmp[i] = frnd() * (i % 5 == 0 ? 3 : 1);
        be->ops->write(be, &kt, 0, tmp, sizeof(float) * (size_t)n * H * D, &err);
        for (int i = 0; i < n * H * D; i++) tmp[i] = frnd();
        be->ops->write(be, &vt, 0, tmp, sizeof(float) * (size_t)n * H * D, &err);
        ember_kv_layer views[2];
        ember_kv_map map;
        ember_kv_map_for(kv, 0, row, pos, views, &map);
        CHECK(be->ops->kv_write(be, &map, &kt, &vt, &err) == EMBER_OK);
        ember_kv_end(kv, true);
        free(tmp);
        ember_buffer_free(kb);
        ember_buffer_free(vb);
    }
    g_rng = saved;
    return kv;
}

/* out[T][Hq][D] for queries q at positions pos[T] of row 0. */
static void attend(ember_backend *be, ember_kv *kv, const acase *ac, const float *q, const int32_t *pos, int T,
                   float *out) {
    int32_t row[64] = {0};
    kv_tab *t = kv_tab_of(kv, 0, 0);
    kv->refs[0] = (ember_kv_rowref){t->blk, t->first, t->n, kv->rows[0].converted ? 1 : 0};
    ember_kv_layer views[2];
    ember_kv_map map;
    ember_kv_map_for(kv, 0, row, pos, views, &map);
    ember_buffer *qb, *ob;
    ember_tensor qt, ot;
    ember_error err = {0};
    const int64_t shape[3] = {T, ac->hq, ac->dim};
    size_t bytes = sizeof(float) * (size_t)T * ac->hq * ac->dim;
    ember_tensor_alloc(be, &qt, &qb, EMBER_F32, 3, shape, &err);
    ember_tensor_alloc(be, &ot, &ob, EMBER_F32, 3, shape, &err);
    be->ops->write(be, &qt, 0, q, bytes, &err);
    ember_attn a = {1.0f / sqrtf((float)ac->dim), ac->window, ac->softcap};
    CHECKF(be->ops->attention(be, &ot, &qt, &map, &a, &err) == EMBER_OK, "%s", err.msg);
    be->ops->read(be, &ot, 0, out, bytes, &err);
    ember_buffer_free(qb);
    ember_buffer_free(ob);
}

static void reference(ember_kv *kv, const acase *ac, const float *q, int p, double *out) {
    const int H = ac->heads, D = ac->dim, rep = ac->hq / H;
    int lo = ac->window && p - ac->window + 1 > 0 ? p - ac->window + 1 : 0;
    float *K = malloc(sizeof(float) * (size_t)(p + 1) * H * D), *V = malloc(sizeof(float) * (size_t)(p + 1) * H * D);
    ember_error err = {0};
    for (int j = lo; j <= p; j++)
        CHECK(ember_kv_read_pos(kv, 0, 0, j, K + (size_t)j * H * D, V + (size_t)j * H * D, &err) == EMBER_OK);
    for (int hq = 0; hq < ac->hq; hq++) {
        int h = hq / rep;
        double *s = malloc(sizeof(double) * (size_t)(p + 1)), mx = -INFINITY, sum = 0;
        for (int j = lo; j <= p; j++) {
            double d = 0;
            for (int i = 0; i < D; i++) d += (double)q[hq * D + i] * K[((size_t)j * H + h) * D + i];
            d *= 1.0 / sqrt((double)D);
            if (ac->softcap > 0) d = tanh(d / ac->softcap) * ac->softcap;
            s[j] = d;
            mx = fmax(mx, d);
        }
        for (int i = 0; i < D; i++) out[hq * D + i] = 0;
        for (int j = lo; j <= p; j++) {
            double w = exp(s[j] - mx);
            sum += w;
            for (int i = 0; i < D; i++) out[hq * D + i] += w * V[((size_t)j * H + h) * D + i];
        }
        for (int i = 0; i < D; i++) out[hq * D + i] /= sum;
        free(s);
    }
    free(K);
    free(V);
}

static void test_attention(void) {
    const acase cases[] = {
        {"f32", 2, 14, 64, 0, 0},     {"f16", 2, 14, 64, 0, 0},     {"bf16", 1, 3, 80, 0, 0},
        {"q8", 2, 4, 64, 0, 0},       {"q4", 2, 4, 128, 0, 0},      {"tq-k4v3", 2, 6, 64, 0, 0},
        {"tq-k8v8", 1, 1, 96, 0, 0},  {"f16", 4, 8, 8, 700, 0},     {"q8", 2, 2, 16, 100, 2.0f},
        {"tq-k3v2", 2, 4, 32, 600, 0}, {"f32", 2, 2, 24, 0, 3.0f},
    };
    const ember_isa isas[] = {EMBER_ISA_SCALAR, EMBER_ISA_AVX2, EMBER_ISA_AVX512};
    const int32_t qpos[8] = {0, 15, 16, 511, 512, 700, 1023, N_POS - 1};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const acase *ac = &cases[ci];
        const int T = 8, n = T * ac->hq * ac->dim;
        float *q = malloc(sizeof(float) * (size_t)n), *res[3][3] = {{0}};
        for (int i = 0; i < n; i++) q[i] = frnd() * 2;
        for (int ii = 0; ii < 3; ii++) {
            if (isas[ii] > ember_isa_detect()) continue;
            for (int threads = 1; threads <= 2; threads++) {
                ember_backend *be;
                ember_error err = {0};
                ember_cpu_params cp = {threads, isas[ii], false, {0}};
                CHECK(ember_backend_cpu_new(&cp, &be, &err) == EMBER_OK);
                ember_kv *kv = fill(be, ac->kind, ac->heads, ac->dim, ac->window);
                /* all 8 queries in one call, then one by one */
                float *all = malloc(sizeof(float) * (size_t)n), *one = malloc(sizeof(float) * (size_t)n);
                attend(be, kv, ac, q, qpos, T, all);
                for (int t = 0; t < T; t++) {
                    size_t o = (size_t)t * ac->hq * ac->dim;
                    attend(be, kv, ac, q + o, &qpos[t], 1, one + o);
                }
                CHECKF(!memcmp(all, one, sizeof(float) * (size_t)n), "%s %s %d threads: batched and alone differ",
                       ac->kind, ember_isa_name(isas[ii]), threads);
                if (threads == 1) { /* against the reference once per ISA */
                    double *ref = malloc(sizeof(double) * (size_t)ac->hq * ac->dim), worst = 0;
                    for (int t = 0; t < T; t++) {
                        reference(kv, ac, q + (size_t)t * ac->hq * ac->dim, qpos[t], ref);
                        for (int i = 0; i < ac->hq * ac->dim; i++)
                            worst = fmax(worst, fabs(ref[i] - one[(size_t)t * ac->hq * ac->dim + i]));
                    }
                    CHECKF(worst < 2e-6, "%s h%d/%d d%d w%d %s: off the reference by %g", ac->kind, ac->heads, ac->hq,
                           ac->dim, ac->window, ember_isa_name(isas[ii]), worst);
                    free(ref);
                }
                free(all);
                if (res[ii][0]) {
                    CHECKF(!memcmp(res[ii][0], one, sizeof(float) * (size_t)n), "%s %s: 1 and 2 threads differ",
                           ac->kind, ember_isa_name(isas[ii]));
                    free(one);
                } else {
                    res[ii][0] = one;
                }
                ember_kv_free(kv);
                ember_backend_free(be);
            }
        }
        if (res[1][0] && res[2][0])
            CHECKF(!memcmp(res[1][0], res[2][0], sizeof(float) * (size_t)n), "%s: AVX2 and AVX-512 differ", ac->kind);
        for (int ii = 0; ii < 3; ii++) free(res[ii][0]);
        free(q);
    }
}

int main(void) {
    test_codebooks();
    test_rotation();
    test_roundtrip();
    test_attention();
    return test_done();
}
