/*
 * test_backend_ops.c - CPU backend ops through the backend interface.
 *
 *   1. matmul_each (n products, each with its own input row: a MoE token's
 *      expert down projections in one dispatch) gives, bit for bit, what
 *      matmul gives on each row alone: every weight type the experts come in
 *      (f32, bf16, Q8_0, Q4_0, Q4_K, Q6_K, MLX affine 4-bit group 32 and
 *      8-bit group 64), mixed types in one call, 1 to 8
 *      products of unequal widths, on every ISA this CPU has, 1 and 2 threads.
 *   2. matmul_each refuses an input whose row count is not the product count.
 *   3. moe_token (a decoding token's routed experts in one call) gives, bit
 *      for bit, what matmul (gate and up), swiglu / geglu, matmul_each (down)
 *      and add_rows_scaled give: f32, bf16, Q8_0, Q4_0, MLX, and the mixed
 *      types of a Q4_K_M file (Q4_K gate / up with Q6_K, Q5_0 or Q8_0 down),
 *      1 to 8 experts, every ISA, 1 and 2 threads; it refuses 9 experts and
 *      scratch with fewer rows than experts.
 *   4. argmax_rows (greedy ids on the pool: rows, or parts of rows where there
 *      are fewer rows than threads) gives the host loop's id: ties to the lower
 *      index (within a part and across parts), NaNs skipped, an all-NaN row 0,
 *      an all -inf row its first value, on 1, 2, 3 and 7 threads; it refuses
 *      more rows than the tensor has and a tensor that is not f32.
 *   5. host_run (the engine's host work on the pool) runs each of 0, 1, 5
 *      and 300 tasks exactly once, on thread indices below the thread count,
 *      on 1, 4 and 7 threads.
 *   6. read of ranges up to 1.6 MB (copied in pieces on the pool) gives the
 *      bytes at each offset and writes nothing past the length.
 *   7. add_rms_norm gives, bit for bit, what add then rms_norm give (x and
 *      the output, the output in h as the models ask or apart), one row to
 *      64, rows short enough to run inline and long ones on the pool,
 *      plus_one or not, every ISA, 1, 2 and 7 threads; it refuses shapes
 *      that do not match.
 *   8. rope_kv_write gives, bit for bit, what rope(q), rope(k) and
 *      kv_write give (q, k and the KV pool's bytes), over a row's prompt
 *      (a block boundary crossed), two rows' tokens interleaved (also
 *      across block boundaries, stored a task per row and head on more
 *      threads than heads), a decode step of a token per row (one landing
 *      on a block's first slot, which the quantized kinds encode against
 *      the block before), one token alone: f32, f16, bf16, q8 and q4 caches,
 *      NEOX and interleaved rotations, partial rotary dims, grouped heads,
 *      every ISA, 1 and 7 threads, the pools also against a one-thread
 *      backend's (its stores a task a head, every token in order); it
 *      refuses q and k of different token counts.
 *
 * Ownership: each case allocates its buffers and frees them before the next.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/cpu.h"
#include "formats/mlx_quant.h"
#include "formats/quant.h"
#include "kv/kv.h"
#define TEST_RNG_SEED 0x5eed0b5ull
#include "test.h"

#define K 256
#define MAXN 8

/* MLX blocks (formats/mlx_quant.h) of N rows of cols random codes, scales and biases. */
static bool make_mlx(ember_dtype t, int N, int cols, void *q) {
    int bits, G;
    if (!ember_dtype_mlx_params(t, &bits, &G)) return false;
    const size_t bb = ember_dtype_get(t)->block_bytes;
    uint8_t codes[128];
    for (int b = 0; b < N * (cols / G); b++) {
        for (int i = 0; i < G; i++) codes[i] = (uint8_t)(rnd() % (1u << bits));
        ember_mlx_pack_block(bits, G, frnd() * 0.05f, frnd() * 0.2f, codes, (unsigned char *)q + (size_t)b * bb);
    }
    return true;
}

/* A weight [N, cols] of type t with random values, in a buffer of be (*buf, caller frees),
   prepared (backend.h prepare_weight). */
static bool make_weight_cols(ember_backend *be, ember_dtype t, int N, int cols, ember_tensor *w, ember_buffer **buf) {
    ember_error err = {0};
    float *f = malloc((size_t)N * cols * sizeof(float));
    size_t bytes = 0;
    bool ok = CHECKV(ember_dtype_nbytes(t, (size_t)N * cols, &bytes), "size of %d rows", N);
    void *q = malloc(bytes);
    ok = ok && f && q;
    for (size_t i = 0; ok && i < (size_t)N * cols; i++) f[i] = frnd();
    int mb, mg;
    if (ok && ember_dtype_mlx_params(t, &mb, &mg))
        ok = make_mlx(t, N, cols, q);
    else
        ok = ok && CHECKV(ember_quantize(t, f, q, (size_t)N * cols, &err) == EMBER_OK, "quantize: %s", err.msg);
    ok = ok && CHECKV(be->ops->buffer_from_host(be, q, bytes, buf, &err) == EMBER_OK, "buffer: %s", err.msg);
    int64_t shape[2] = {N, cols};
    ok = ok && CHECKV(ember_tensor_view(w, *buf, 0, t, 2, shape, &err) == EMBER_OK, "view: %s", err.msg);
    /* prepared as the model loader prepares every matrix (packed where the ISA has a kernel) */
    ok = ok && CHECKV(be->ops->prepare_weight(be, w, &err) == EMBER_OK, "prepare: %s", err.msg);
    free(f);
    free(q); /* buffer_from_host copies (zero_copy is off) */
    return ok;
}

/* make_weight_cols with rows of K. */
static bool make_weight(ember_backend *be, ember_dtype t, int N, ember_tensor *w, ember_buffer **buf) {
    return make_weight_cols(be, t, N, K, w, buf);
}

/* One case: n products of the given types and widths on backend be. */
static void check_each(ember_backend *be, int n, const ember_dtype *types, const int *widths, const char *tag) {
    ember_error err = {0};
    ember_tensor w[MAXN], out[MAXN], ref[MAXN], xall, xrow;
    ember_buffer *wb[MAXN] = {0}, *ob[MAXN] = {0}, *rb[MAXN] = {0}, *xb = NULL;
    bool ok = true;
    for (int i = 0; ok && i < n; i++) {
        int64_t os[2] = {1, widths[i]};
        ok = make_weight(be, types[i], widths[i], &w[i], &wb[i]) &&
             CHECKV(ember_tensor_alloc(be, &out[i], &ob[i], EMBER_F32, 2, os, &err) == EMBER_OK, "%s", err.msg) &&
             CHECKV(ember_tensor_alloc(be, &ref[i], &rb[i], EMBER_F32, 2, os, &err) == EMBER_OK, "%s", err.msg);
    }
    float x[MAXN * K];
    for (int i = 0; i < n * K; i++) x[i] = frnd() * 3.0f;
    int64_t xs[2] = {n, K};
    ok = ok && CHECKV(ember_tensor_alloc(be, &xall, &xb, EMBER_F32, 2, xs, &err) == EMBER_OK, "%s", err.msg) &&
         CHECKV(be->ops->write(be, &xall, 0, x, (size_t)n * K * sizeof(float), &err) == EMBER_OK, "%s", err.msg);
    if (ok) {
        ember_matmul mm[MAXN];
        for (int i = 0; i < n; i++) mm[i] = (ember_matmul){&out[i], &w[i], NULL};
        int rc = be->ops->matmul_each(be, &xall, n, mm, &err);
        CHECKF(rc == EMBER_OK, "%s: matmul_each: %s", tag, err.msg);
        for (int i = 0; rc == EMBER_OK && i < n; i++) {
            int64_t rs[2] = {1, K};
            CHECK(ember_tensor_view(&xrow, xb, (size_t)i * K * sizeof(float), EMBER_F32, 2, rs, &err) == EMBER_OK);
            ember_matmul one = {&ref[i], &w[i], NULL};
            CHECKF(be->ops->matmul(be, &xrow, 1, &one, &err) == EMBER_OK, "%s: matmul: %s", tag, err.msg);
            float a[512], b[512];
            bool rd = be->ops->read(be, &out[i], 0, a, (size_t)widths[i] * 4, &err) == EMBER_OK &&
                      be->ops->read(be, &ref[i], 0, b, (size_t)widths[i] * 4, &err) == EMBER_OK;
            CHECKF(rd, "%s: read: %s", tag, err.msg);
            CHECKF(!memcmp(a, b, (size_t)widths[i] * 4), "%s: product %d of %d (%s, N=%d) differs from matmul", tag,
                   i, n, ember_dtype_get(types[i])->name, widths[i]);
        }
    }
    for (int i = 0; i < n; i++) {
        ember_buffer_free(wb[i]);
        ember_buffer_free(ob[i]);
        ember_buffer_free(rb[i]);
    }
    ember_buffer_free(xb);
}

static void test_matmul_each(void) {
    const ember_dtype types[] = {EMBER_F32,  EMBER_BF16, EMBER_Q8_0,
                                 EMBER_Q4_0, EMBER_Q4_K, EMBER_Q6_K,
                                 ember_dtype_mlx(4, 32), ember_dtype_mlx(8, 64)};
    static const int widths[MAXN] = {64, 96, 32, 160, 40, 128, 8, 256};
    const ember_isa isas[] = {EMBER_ISA_SCALAR, EMBER_ISA_AVX2, EMBER_ISA_AVX512, EMBER_ISA_AMX};
    for (int a = 0; a < 4; a++) {
        if (!ember_isa_supported(isas[a])) {
            fprintf(stderr, "matmul_each: %s not on this CPU, skipped\n", ember_isa_name(isas[a]));
            continue;
        }
        for (int th = 1; th <= 2; th++) {
            ember_cpu_params p = {.n_threads = th, .isa = isas[a]};
            ember_backend *be = NULL;
            ember_error err = {0};
            if (!CHECKV(ember_backend_cpu_new(&p, &be, &err) == EMBER_OK, "backend: %s", err.msg)) continue;
            char tag[96];
            for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
                ember_dtype ty[MAXN];
                for (int i = 0; i < MAXN; i++) ty[i] = types[t];
                for (int n = 1; n <= MAXN; n += (n < 2 ? 1 : 3)) { /* 1, 2, 5, 8 */
                    snprintf(tag, sizeof tag, "%s t%d %s n%d", ember_isa_name(isas[a]), th,
                             ember_dtype_get(types[t])->name, n);
                    check_each(be, n, ty, widths, tag);
                }
            }
            /* mixed types in one dispatch (two activation kinds at once) */
            const ember_dtype mixed[MAXN] = {EMBER_Q8_0, EMBER_Q4_K, EMBER_F32, ember_dtype_mlx(4, 32),
                                             EMBER_BF16, EMBER_Q4_0, ember_dtype_mlx(8, 64), EMBER_Q8_0};
            snprintf(tag, sizeof tag, "%s t%d mixed", ember_isa_name(isas[a]), th);
            check_each(be, MAXN, mixed, widths, tag);
            ember_backend_free(be);
        }
    }
}

static void test_refusals(void) {
    ember_cpu_params p = {.n_threads = 2};
    ember_backend *be = NULL;
    ember_error err = {0};
    if (!CHECKV(ember_backend_cpu_new(&p, &be, &err) == EMBER_OK, "backend: %s", err.msg)) return;
    ember_tensor w, x, o;
    ember_buffer *wb = NULL, *xb = NULL, *ob = NULL;
    int64_t xs[2] = {3, K}, os[2] = {1, 32};
    if (make_weight(be, EMBER_Q8_0, 32, &w, &wb) &&
        CHECKV(ember_tensor_alloc(be, &x, &xb, EMBER_F32, 2, xs, &err) == EMBER_OK, "%s", err.msg) &&
        CHECKV(ember_tensor_alloc(be, &o, &ob, EMBER_F32, 2, os, &err) == EMBER_OK, "%s", err.msg)) {
        ember_matmul mm[2] = {{&o, &w, NULL}, {&o, &w, NULL}};
        CHECK(be->ops->matmul_each(be, &x, 2, mm, &err) == EMBER_ERR_INVALID_ARG); /* 3 rows, 2 products */
        CHECKF(strstr(err.msg, "input rows") != NULL, "message: %s", err.msg);
    }
    ember_buffer_free(wb);
    ember_buffer_free(xb);
    ember_buffer_free(ob);
    ember_backend_free(be);
}

/* ---- 3. moe_token ------------------------------------------------------------ */

#define MH 256 /* hidden */
#define MI 512 /* expert width */

/* An f32 [rows, cols] tensor of be (*buf, caller frees), zeroed. */
static bool f32_tensor(ember_backend *be, int rows, int cols, ember_tensor *t, ember_buffer **buf) {
    ember_error err = {0};
    int64_t s[2] = {rows, cols};
    return CHECKV(ember_tensor_alloc(be, t, buf, EMBER_F32, 2, s, &err) == EMBER_OK, "alloc: %s", err.msg) &&
           CHECKV(be->ops->scale(be, t, t, 0.0f, &err) == EMBER_OK, "zero: %s", err.msg);
}

/* Row r of a [rows, cols] f32 tensor t as a [1, cols] view. */
static ember_tensor row_of(const ember_tensor *t, int r, int cols) {
    ember_tensor v = *t;
    v.shape[0] = 1;
    v.offset += (size_t)r * (size_t)cols * 4;
    v.nbytes = (size_t)cols * 4;
    return v;
}

/* One case: n experts with gate / up of type tg and down of type td; dst
   starts from random values. moe_token against matmul (gate and up of each
   expert), swiglu / geglu, matmul_each (down) and add_rows_scaled. */
static void check_moe_token(ember_backend *be, int n, ember_dtype tg, ember_dtype td, bool geglu, const char *tag) {
    ember_error err = {0};
    ember_tensor ex[3 * MAXN], x, dst, ref, g, u, y, g2, u2, y2;
    ember_buffer *eb[3 * MAXN] = {0}, *bufs[9] = {0};
    bool ok = true;
    for (int j = 0; ok && j < n; j++)
        ok = make_weight_cols(be, tg, MI, MH, &ex[3 * j], &eb[3 * j]) &&
             make_weight_cols(be, tg, MI, MH, &ex[3 * j + 1], &eb[3 * j + 1]) &&
             make_weight_cols(be, td, MH, MI, &ex[3 * j + 2], &eb[3 * j + 2]);
    ok = ok && f32_tensor(be, 1, MH, &x, &bufs[0]) && f32_tensor(be, 1, MH, &dst, &bufs[1]) &&
         f32_tensor(be, 1, MH, &ref, &bufs[2]) && f32_tensor(be, MAXN, MI, &g, &bufs[3]) &&
         f32_tensor(be, MAXN, MI, &u, &bufs[4]) && f32_tensor(be, MAXN, MH, &y, &bufs[5]) &&
         f32_tensor(be, n, MI, &g2, &bufs[6]) && f32_tensor(be, n, MI, &u2, &bufs[7]) &&
         f32_tensor(be, n, MH, &y2, &bufs[8]);
    float xv[MH], d0[MH], w[MAXN], a[MH], b[MH];
    int32_t ids[MAXN] = {0};
    for (int i = 0; i < MH; i++) xv[i] = frnd() * 2.0f, d0[i] = frnd();
    for (int j = 0; j < n; j++) w[j] = 0.05f + (float)(rnd() % 100) / 200.0f;
    ok = ok && be->ops->write(be, &x, 0, xv, sizeof xv, &err) == EMBER_OK &&
         be->ops->write(be, &dst, 0, d0, sizeof d0, &err) == EMBER_OK &&
         be->ops->write(be, &ref, 0, d0, sizeof d0, &err) == EMBER_OK;
    if (ok) {
        int rc = be->ops->moe_token(be, &dst, &x, n, ex, w, geglu, &g, &u, &y, &err);
        CHECKF(rc == EMBER_OK, "%s: moe_token: %s", tag, err.msg);
        /* the steps: gate and up per expert, the activation, the downs, the combine */
        ember_tensor gr[MAXN], ur[MAXN], yr[MAXN];
        ember_matmul dn[MAXN];
        for (int j = 0; rc == EMBER_OK && j < n; j++) {
            gr[j] = row_of(&g2, j, MI), ur[j] = row_of(&u2, j, MI), yr[j] = row_of(&y2, j, MH);
            ember_matmul gu[2] = {{&gr[j], &ex[3 * j], NULL}, {&ur[j], &ex[3 * j + 1], NULL}};
            dn[j] = (ember_matmul){&yr[j], &ex[3 * j + 2], NULL};
            rc = be->ops->matmul(be, &x, 2, gu, &err);
        }
        if (rc == EMBER_OK)
            rc = geglu ? be->ops->geglu(be, &g2, &g2, &u2, &err) : be->ops->swiglu(be, &g2, &g2, &u2, &err);
        if (rc == EMBER_OK) rc = be->ops->matmul_each(be, &g2, n, dn, &err);
        if (rc == EMBER_OK) rc = be->ops->add_rows_scaled(be, &ref, &y2, ids, w, n, &err);
        CHECKF(rc == EMBER_OK, "%s: the steps: %s", tag, err.msg);
        bool rd = be->ops->read(be, &dst, 0, a, sizeof a, &err) == EMBER_OK &&
                  be->ops->read(be, &ref, 0, b, sizeof b, &err) == EMBER_OK;
        CHECKF(rd, "%s: read: %s", tag, err.msg);
        int diff = -1;
        for (int i = 0; i < MH && diff < 0; i++)
            if (memcmp(&a[i], &b[i], 4)) diff = i;
        CHECKF(diff < 0, "%s: moe_token differs from the steps at %d: %.9g vs %.9g", tag, diff,
               (double)a[diff < 0 ? 0 : diff], (double)b[diff < 0 ? 0 : diff]);
        bool moved = false; /* the experts did add something */
        for (int i = 0; i < MH; i++) moved = moved || a[i] != d0[i];
        CHECKF(moved, "%s: dst unchanged", tag);
    }
    for (int i = 0; i < 3 * n; i++) ember_buffer_free(eb[i]);
    for (int i = 0; i < 9; i++) ember_buffer_free(bufs[i]);
}

static void test_moe_token(void) {
    /* gate / up type, down type: the Q4_K_M mix of a MoE whose expert width
       is no multiple of 256 (Q4_K gate / up, Q5_0 or Q8_0 down) among them */
    const ember_dtype pairs[][2] = {{EMBER_F32, EMBER_F32},   {EMBER_BF16, EMBER_BF16}, {EMBER_Q8_0, EMBER_Q8_0},
                                    {EMBER_Q4_0, EMBER_Q4_0}, {EMBER_Q4_K, EMBER_Q6_K}, {EMBER_Q4_K, EMBER_Q5_0},
                                    {EMBER_Q4_K, EMBER_Q8_0}, {EMBER_Q5_0, EMBER_Q4_K},
                                    {ember_dtype_mlx(4, 32), ember_dtype_mlx(4, 32)},
                                    {ember_dtype_mlx(8, 64), ember_dtype_mlx(4, 64)}};
    const ember_isa isas[] = {EMBER_ISA_SCALAR, EMBER_ISA_AVX2, EMBER_ISA_AVX512, EMBER_ISA_AMX};
    for (int a = 0; a < 4; a++) {
        if (!ember_isa_supported(isas[a])) continue;
        for (int th = 1; th <= 2; th++) {
            ember_cpu_params p = {.n_threads = th, .isa = isas[a]};
            ember_backend *be = NULL;
            ember_error err = {0};
            if (!CHECKV(ember_backend_cpu_new(&p, &be, &err) == EMBER_OK, "backend: %s", err.msg)) continue;
            if (!CHECKV(be->ops->moe_token != NULL, "the cpu backend has moe_token")) {
                ember_backend_free(be);
                continue;
            }
            char tag[128];
            for (size_t t = 0; t < sizeof pairs / sizeof pairs[0]; t++)
                for (int n = 1; n <= MAXN; n += (n < 2 ? 1 : 3)) { /* 1, 2, 5, 8 */
                    const bool geglu = (n + (int)t) % 2;
                    snprintf(tag, sizeof tag, "%s t%d %s/%s n%d %s", ember_isa_name(isas[a]), th,
                             ember_dtype_get(pairs[t][0])->name, ember_dtype_get(pairs[t][1])->name, n,
                             geglu ? "geglu" : "swiglu");
                    check_moe_token(be, n, pairs[t][0], pairs[t][1], geglu, tag);
                }
            /* refusals: 9 experts, and scratch rows fewer than the experts */
            ember_tensor x, dst, g, u, y, wgu, wdn, ex[3 * (MAXN + 1)];
            ember_buffer *bufs[7] = {0};
            float w[MAXN + 1] = {0};
            if (f32_tensor(be, 1, MH, &x, &bufs[0]) && f32_tensor(be, 1, MH, &dst, &bufs[1]) &&
                f32_tensor(be, 2, MI, &g, &bufs[2]) && f32_tensor(be, 2, MI, &u, &bufs[3]) &&
                f32_tensor(be, 2, MH, &y, &bufs[4]) && f32_tensor(be, MI, MH, &wgu, &bufs[5]) &&
                f32_tensor(be, MH, MI, &wdn, &bufs[6])) {
                for (int i = 0; i < 3 * (MAXN + 1); i++) ex[i] = (i % 3 == 2) ? wdn : wgu;
                CHECK(be->ops->moe_token(be, &dst, &x, MAXN + 1, ex, w, false, &g, &u, &y, &err) ==
                      EMBER_ERR_INVALID_ARG);
                CHECKF(strstr(err.msg, "experts") != NULL, "message: %s", err.msg);
                CHECK(be->ops->moe_token(be, &dst, &x, 3, ex, w, false, &g, &u, &y, &err) == EMBER_ERR_INVALID_ARG);
                CHECKF(strstr(err.msg, "shapes") != NULL, "message: %s", err.msg);
            }
            for (int i = 0; i < 7; i++) ember_buffer_free(bufs[i]);
            ember_backend_free(be);
        }
    }
}

/* ember_argmax's rule (sample/sampler.c), written out. */
static int32_t ref_argmax(const float *x, int n) {
    int32_t best = -1;
    for (int i = 0; i < n; i++)
        if (!isnan(x[i]) && (best < 0 || x[i] > x[best])) best = i;
    return best < 0 ? 0 : best;
}

static void test_argmax_rows(void) {
    enum { R = 7, V = 40000 }; /* up to 4 parts of a row (at least 8,192 values a part) */
    float *h = malloc(sizeof(float) * R * V);
    for (size_t i = 0; i < (size_t)R * V; i++) h[i] = frnd();
    h[0 * V + 70] = 3.0f; /* a tie across parts: the lower index wins */
    h[0 * V + 30001] = 3.0f;
    h[1 * V + 0] = NAN; /* NaNs skipped, one past the maximum */
    h[1 * V + 5] = 2.5f;
    h[1 * V + 6] = NAN;
    for (int i = 0; i < V; i++) h[2 * V + i] = NAN; /* every value NaN */
    h[3 * V + V - 1] = 7.0f; /* the last element */
    for (int i = 0; i < V; i++) h[4 * V + i] = -1.0f; /* all equal: index 0 */
    for (int i = 0; i < V; i++) h[5 * V + i] = i < 20000 ? NAN : -INFINITY; /* the first non-NaN, in a later part */
    h[6 * V + 12000] = 5.0f; /* a tie within a part */
    h[6 * V + 12001] = 5.0f;
    for (int nt = 1; nt <= 7; nt += nt < 3 ? 1 : 4) {
        ember_backend *be;
        ember_error err = {0};
        ember_cpu_params cp = {nt, EMBER_ISA_AUTO, false, {0}};
        CHECK(ember_backend_cpu_new(&cp, &be, &err) == EMBER_OK);
        ember_tensor t, bad;
        ember_buffer *b, *bb;
        const int64_t sh[2] = {R, V};
        CHECK(ember_tensor_alloc(be, &t, &b, EMBER_F32, 2, sh, &err) == EMBER_OK);
        CHECK(ember_tensor_alloc(be, &bad, &bb, EMBER_BF16, 2, sh, &err) == EMBER_OK);
        be->ops->write(be, &t, 0, h, sizeof(float) * R * V, &err);
        for (int n = 1; n <= R; n += 3) { /* 1, 4 and 7 rows: parts and not */
            for (int first = 0; first + n <= R; first += n) {
                ember_tensor v;
                const int64_t vs[2] = {n, V};
                CHECK(ember_tensor_view(&v, b, (size_t)first * V * sizeof(float), EMBER_F32, 2, vs, &err) == EMBER_OK);
                int32_t ids[R];
                for (int r = 0; r < R; r++) ids[r] = -7;
                CHECKF(be->ops->argmax_rows(be, &v, ids, n, &err) == EMBER_OK, "argmax_rows: %s", err.msg);
                for (int r = 0; r < n; r++)
                    CHECKF(ids[r] == ref_argmax(h + (size_t)(first + r) * V, V), "%d threads, rows %d..: row %d: %d, want %d",
                           nt, first, first + r, ids[r], ref_argmax(h + (size_t)(first + r) * V, V));
                for (int r = n; r < R; r++) CHECK(ids[r] == -7); /* nothing past n written */
            }
        }
        int32_t ids[R + 1];
        CHECK(be->ops->argmax_rows(be, &t, ids, R, &err) == EMBER_OK);
        CHECK(ids[0] == 70 && ids[1] == 5 && ids[2] == 0 && ids[3] == V - 1 && ids[4] == 0 && ids[5] == 20000 &&
              ids[6] == 12000);
        CHECK(be->ops->argmax_rows(be, &t, ids, R + 1, &err) == EMBER_ERR_INVALID_ARG);
        CHECK(be->ops->argmax_rows(be, &bad, ids, 1, &err) == EMBER_ERR_INVALID_ARG);
        CHECK(be->ops->argmax_rows(be, &t, ids, 0, &err) == EMBER_OK);
        ember_buffer_free(b);
        ember_buffer_free(bb);
        ember_backend_free(be);
    }
    free(h);
}

/* host_run: every task once, on a thread index below the backend's thread count. */
typedef struct hr_ctx {
    _Atomic int runs[300];
    _Atomic int bad_thread;
    int threads;
} hr_ctx;

static void hr_task(void *ctx, int task, int thread) {
    hr_ctx *c = ctx;
    atomic_fetch_add(&c->runs[task], 1);
    if (thread < 0 || thread >= c->threads) atomic_fetch_add(&c->bad_thread, 1);
}

static void test_host_run(void) {
    for (int nt = 1; nt <= 7; nt += 3) {
        ember_backend *be;
        ember_error err = {0};
        ember_cpu_params cp = {nt, EMBER_ISA_AUTO, false, {0}};
        if (!CHECKV(ember_backend_cpu_new(&cp, &be, &err) == EMBER_OK, "backend: %s", err.msg)) continue;
        CHECK(be->ops->host_run != NULL);
        static const int ns[] = {0, 1, 5, 300};
        for (size_t k = 0; k < sizeof ns / sizeof ns[0] && be->ops->host_run; k++) {
            static hr_ctx c;
            memset(&c, 0, sizeof c);
            c.threads = nt;
            be->ops->host_run(be, ns[k], hr_task, &c);
            int wrong = 0;
            for (int t = 0; t < 300; t++) wrong += atomic_load(&c.runs[t]) != (t < ns[k]);
            CHECKF(wrong == 0 && atomic_load(&c.bad_thread) == 0, "%d threads, %d tasks: %d counts wrong, %d bad threads",
                   nt, ns[k], wrong, atomic_load(&c.bad_thread));
        }
        ember_backend_free(be);
    }
}

/* read of large ranges (copied in pieces on the pool): the bytes at any
   offset and length, on 1, 4 and 7 threads. */
static void test_read_large(void) {
    enum { N = 900000 }; /* floats: 3.6 MB */
    float *h = malloc(sizeof(float) * N), *got = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) h[i] = (float)i * 0.5f - 7.0f;
    for (int nt = 1; nt <= 7; nt += 3) {
        ember_backend *be;
        ember_error err = {0};
        ember_cpu_params cp = {nt, EMBER_ISA_AUTO, false, {0}};
        if (!CHECKV(ember_backend_cpu_new(&cp, &be, &err) == EMBER_OK, "backend: %s", err.msg)) continue;
        ember_tensor t;
        ember_buffer *b;
        const int64_t sh[1] = {N};
        CHECK(ember_tensor_alloc(be, &t, &b, EMBER_F32, 1, sh, &err) == EMBER_OK);
        CHECK(be->ops->write(be, &t, 0, h, sizeof(float) * N, &err) == EMBER_OK);
        static const size_t offs[] = {0, 4, 1000, 4 * 151936}, lens[] = {4 * 151936 * 2 + 4, 4 * 400000, 3, 4 * 151936};
        for (size_t k = 0; k < sizeof offs / sizeof offs[0]; k++) {
            memset(got, 0xee, sizeof(float) * N);
            CHECK(be->ops->read(be, &t, offs[k], got, lens[k], &err) == EMBER_OK);
            CHECKF(!memcmp(got, (const char *)h + offs[k], lens[k]) &&
                       ((const unsigned char *)got)[lens[k]] == 0xee,
                   "%d threads: read of %zu bytes at %zu", nt, lens[k], offs[k]);
        }
        ember_buffer_free(b);
        ember_backend_free(be);
    }
    free(h);
    free(got);
}

/* A [n0 x n1 (x n2)] f32 tensor of be holding data (*t; the buffer returned, caller frees). */
static ember_buffer *f32_data(ember_backend *be, ember_tensor *t, int ndim, const int64_t *shape, const float *data) {
    ember_error err = {0};
    ember_buffer *b = NULL;
    if (!CHECKV(ember_tensor_alloc(be, t, &b, EMBER_F32, ndim, shape, &err) == EMBER_OK, "alloc: %s", err.msg))
        return NULL;
    CHECK(be->ops->write(be, t, 0, data, t->nbytes, &err) == EMBER_OK);
    return b;
}

/* true when tensor a of backend ba and b of bb hold the same bytes. */
static bool same_bytes2(ember_backend *ba, const ember_tensor *a, ember_backend *bb, const ember_tensor *b) {
    ember_error err = {0};
    if (a->nbytes != b->nbytes) return false;
    unsigned char *x = malloc(a->nbytes), *y = malloc(b->nbytes);
    bool same = x && y && ba->ops->read(ba, a, 0, x, a->nbytes, &err) == EMBER_OK &&
                bb->ops->read(bb, b, 0, y, b->nbytes, &err) == EMBER_OK && !memcmp(x, y, a->nbytes);
    free(x);
    free(y);
    return same;
}

/* true when tensors a and b of be hold the same bytes. */
static bool same_bytes(ember_backend *be, const ember_tensor *a, const ember_tensor *b) {
    return same_bytes2(be, a, be, b);
}

/* add_rms_norm on rows x D against add then rms_norm; out_in_h: the output goes to h (the models' use). */
static void check_add_norm(ember_backend *be, int rows, int D, bool plus_one, bool out_in_h, const char *tag) {
    ember_error err = {0};
    const size_t n = (size_t)rows * D;
    float *x = malloc(n * 4), *h = malloc(n * 4), *w = malloc((size_t)D * 4);
    for (size_t i = 0; i < n; i++) x[i] = frnd() * 4.0f, h[i] = frnd() * 2.0f;
    for (int i = 0; i < D; i++) w[i] = frnd() + 0.5f;
    const int64_t sh[2] = {rows, D}, ws[1] = {D};
    ember_tensor tx, th, to, rx, rh, ro, tw;
    ember_buffer *b[7] = {f32_data(be, &tx, 2, sh, x), f32_data(be, &th, 2, sh, h), f32_data(be, &to, 2, sh, x),
                          f32_data(be, &rx, 2, sh, x), f32_data(be, &rh, 2, sh, h), f32_data(be, &ro, 2, sh, x),
                          f32_data(be, &tw, 1, ws, w)};
    const float eps = 1e-5f;
    ember_tensor *rout = out_in_h ? &rh : &ro, *tout = out_in_h ? &th : &to;
    CHECKF(be->ops->add(be, &rx, &rx, &rh, &err) == EMBER_OK, "%s: add: %s", tag, err.msg);
    CHECKF(be->ops->rms_norm(be, rout, &rx, &tw, eps, plus_one, &err) == EMBER_OK, "%s: rms_norm: %s", tag, err.msg);
    CHECKF(be->ops->add_rms_norm(be, tout, &tx, &th, &tw, eps, plus_one, &err) == EMBER_OK, "%s: add_rms_norm: %s", tag,
           err.msg);
    CHECKF(same_bytes(be, &tx, &rx), "%s: x differs from add's", tag);
    CHECKF(same_bytes(be, tout, rout), "%s: the output differs from add then rms_norm", tag);
    if (!out_in_h) CHECKF(same_bytes(be, &th, &rh), "%s: h changed", tag);
    /* and every row is a norm (within float rounding of a double
       reference): a row the split left out would be equal in both outputs
       above (each starts as a copy of x or h) */
    float *got = malloc(n * 4);
    int bad_row = -1;
    if (got && be->ops->read(be, tout, 0, got, n * 4, &err) == EMBER_OK) {
        for (int r = 0; r < rows && bad_row < 0; r++) {
            double ss = 0;
            for (int i = 0; i < D; i++) {
                const double v = (double)x[(size_t)r * D + i] + (double)h[(size_t)r * D + i];
                ss += v * v;
            }
            const double inv = 1.0 / sqrt(ss / D + eps);
            for (int i = 0; i < D; i++) {
                const double v = (double)x[(size_t)r * D + i] + (double)h[(size_t)r * D + i];
                const double ref = v * inv * ((double)w[i] + (plus_one ? 1.0 : 0.0));
                if (fabs((double)got[(size_t)r * D + i] - ref) > 1e-4 * (1.0 + fabs(ref))) bad_row = r;
            }
        }
    } else {
        bad_row = rows;
    }
    CHECKF(bad_row < 0, "%s: row %d of %d is not the norm of x + h", tag, bad_row, rows);
    free(got);
    for (int i = 0; i < 7; i++) ember_buffer_free(b[i]);
    free(x);
    free(h);
    free(w);
}

/* fn(be, its ISA, threads) on a CPU backend of every ISA this CPU has, at 1, 2 and 7 threads. */
static void each_backend(void (*fn)(ember_backend *be, ember_isa isa, int threads)) {
    const ember_isa isas[] = {EMBER_ISA_SCALAR, EMBER_ISA_AVX2, EMBER_ISA_AVX512, EMBER_ISA_AMX};
    for (int a = 0; a < 4; a++) {
        if (!ember_isa_supported(isas[a])) continue;
        for (int th = 1; th <= 7; th += th < 2 ? 1 : 5) {
            ember_cpu_params p = {.n_threads = th, .isa = isas[a]};
            ember_backend *be = NULL;
            ember_error err = {0};
            if (!CHECKV(ember_backend_cpu_new(&p, &be, &err) == EMBER_OK, "backend: %s", err.msg)) continue;
            fn(be, isas[a], th);
            ember_backend_free(be);
        }
    }
}

static void add_norm_cases(ember_backend *be, ember_isa isa_id, int th) {
    const char *isa = ember_isa_name(isa_id);
    static const int shapes[][2] = {{1, 64}, {3, 100}, {1, 896}, {16, 896}, {5, 4096}, {64, 96}};
    ember_error err = {0};
    if (!CHECKV(be->ops->add_rms_norm != NULL, "no add_rms_norm")) return;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int v = 0; v < 4; v++) {
            char tag[96];
            snprintf(tag, sizeof tag, "add_rms_norm %s t%d %dx%d%s%s", isa, th, shapes[s][0], shapes[s][1],
                     v & 1 ? " plus_one" : "", v & 2 ? " into h" : "");
            check_add_norm(be, shapes[s][0], shapes[s][1], v & 1, v & 2, tag);
        }
    /* refusals: a weight of another length, h of another size */
    ember_tensor x, h, w;
    ember_buffer *bx, *bh, *bw;
    const int64_t xs[2] = {2, 32}, hs[2] = {2, 16}, ws[1] = {16};
    CHECK(ember_tensor_alloc(be, &x, &bx, EMBER_F32, 2, xs, &err) == EMBER_OK);
    CHECK(ember_tensor_alloc(be, &h, &bh, EMBER_F32, 2, hs, &err) == EMBER_OK);
    CHECK(ember_tensor_alloc(be, &w, &bw, EMBER_F32, 1, ws, &err) == EMBER_OK);
    CHECK(be->ops->add_rms_norm(be, &x, &x, &h, &w, 1e-5f, false, &err) == EMBER_ERR_INVALID_ARG);
    CHECK(be->ops->add_rms_norm(be, &h, &x, &x, &w, 1e-5f, false, &err) == EMBER_ERR_INVALID_ARG);
    ember_buffer_free(bx);
    ember_buffer_free(bh);
    ember_buffer_free(bw);
}

static void test_add_rms_norm(void) {
    each_backend(add_norm_cases);
}

/* rope_kv_write against rope, rope, kv_write: two caches of one layer
   (Hkv heads of D) take the same batches, one through the three ops, the
   other through the fused one; q, k and the pools must match after each.
   A third cache on be1 (one thread: its stores a task a head, every token
   in order) takes the three ops too: the pools must match it whatever
   split be's thread count gives the stores. */
enum { RK_ROWS = 4, RK_CTX = 128, RK_MAXT = 48 };
static void check_rope_kv(ember_backend *be, ember_backend *be1, const char *kind, int Hkv, int rep, int D,
                          int n_rot, bool neox, const char *tag0) {
    ember_error err = {0};
    ember_kv_type ty;
    if (!CHECKV(ember_kv_type_parse(kind, 0, 0, &ty, &err) == EMBER_OK, "%s: %s", kind, err.msg)) return;
    const int heads[1] = {Hkv}, dims[1] = {D};
    ember_kv_params kp = {ty, 1, heads, dims, NULL, RK_ROWS, RK_CTX, 0, -1, RK_MAXT, NULL, {0}};
    ember_kv *ref = NULL, *got = NULL, *one = NULL;
    if (!CHECKV(ember_kv_new(be, &kp, &ref, &err) == EMBER_OK && ember_kv_new(be, &kp, &got, &err) == EMBER_OK &&
                    ember_kv_new(be1, &kp, &one, &err) == EMBER_OK,
                "%s: kv: %s", tag0, err.msg)) {
        ember_kv_free(ref);
        ember_kv_free(got);
        ember_kv_free(one);
        return;
    }
    float inv_freq[512];
    for (int i = 0; i < n_rot / 2; i++) inv_freq[i] = (float)pow(10000.0, -2.0 * i / n_rot);
    const ember_rope r = {inv_freq, n_rot, neox ? EMBER_ROPE_NEOX : EMBER_ROPE_INTERLEAVED, neox ? 1.0f : 0.875f};
    /* the batches, each as a row per token (a row's tokens in order); the quantized kinds keep
       their first block plain, so no batch crosses position 16 */
    static const int32_t b_rows[][RK_MAXT] = {
        {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},          /* row 0's prompt, 0..15 */
        {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, /* 16..39: a block boundary */
        {1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2}, /* two rows */
        {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},          /* row 1: 16..31 */
        {3, 0, 2, 1}, /* a decode step: row 2 at slot 0 of its second block, row 1 of its third */
        {0},          /* one token alone */
        {2, 3, 1, 0}, /* another decode step */
        {0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2,
         0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2}, /* two rows' chunks past block ends */
    };
    static const int b_len[] = {16, 24, 32, 16, 4, 1, 4, 48};
    int len[RK_ROWS] = {0};
    for (size_t b = 0; b < sizeof b_len / sizeof b_len[0]; b++) {
        const int T = b_len[b];
        int32_t row[RK_MAXT], pos[RK_MAXT];
        for (int t = 0; t < T; t++) row[t] = b_rows[b][t], pos[t] = len[row[t]]++;
        char tag[160];
        snprintf(tag, sizeof tag, "%s batch %zu (%d tokens)", tag0, b, T);
        if (!CHECKV(ember_kv_begin(ref, row, pos, T, &err) == EMBER_OK, "%s: begin: %s", tag, err.msg)) break;
        if (!CHECKV(ember_kv_begin(got, row, pos, T, &err) == EMBER_OK, "%s: begin: %s", tag, err.msg)) {
            ember_kv_end(ref, false);
            break;
        }
        if (!CHECKV(ember_kv_begin(one, row, pos, T, &err) == EMBER_OK, "%s: begin: %s", tag, err.msg)) {
            ember_kv_end(ref, false);
            ember_kv_end(got, false);
            break;
        }
        const int Hq = Hkv * rep;
        float *q = malloc((size_t)T * Hq * D * 4), *k = malloc((size_t)T * Hkv * D * 4),
              *v = malloc((size_t)T * Hkv * D * 4);
        for (int i = 0; i < T * Hq * D; i++) q[i] = frnd() * 3.0f;
        for (int i = 0; i < T * Hkv * D; i++) k[i] = frnd() * 3.0f, v[i] = frnd();
        const int64_t qs[3] = {T, Hq, D}, ks[3] = {T, Hkv, D};
        ember_tensor rq, rk, rv, gq, gk, gv, oq, ok, ov;
        ember_buffer *bufs[9] = {f32_data(be, &rq, 3, qs, q),  f32_data(be, &rk, 3, ks, k),  f32_data(be, &rv, 3, ks, v),
                                 f32_data(be, &gq, 3, qs, q),  f32_data(be, &gk, 3, ks, k),  f32_data(be, &gv, 3, ks, v),
                                 f32_data(be1, &oq, 3, qs, q), f32_data(be1, &ok, 3, ks, k), f32_data(be1, &ov, 3, ks, v)};
        ember_kv_layer rviews[2], gviews[2], oviews[2];
        ember_kv_map rm, gm, om;
        ember_kv_map_for(ref, 0, row, pos, rviews, &rm);
        ember_kv_map_for(got, 0, row, pos, gviews, &gm);
        ember_kv_map_for(one, 0, row, pos, oviews, &om);
        CHECKF(be1->ops->rope(be1, &oq, pos, &r, &err) == EMBER_OK && be1->ops->rope(be1, &ok, pos, &r, &err) == EMBER_OK &&
                   be1->ops->kv_write(be1, &om, &ok, &ov, &err) == EMBER_OK,
               "%s: the three ops on one thread: %s", tag, err.msg);
        CHECKF(be->ops->rope(be, &rq, pos, &r, &err) == EMBER_OK && be->ops->rope(be, &rk, pos, &r, &err) == EMBER_OK &&
                   be->ops->kv_write(be, &rm, &rk, &rv, &err) == EMBER_OK,
               "%s: the three ops: %s", tag, err.msg);
        CHECKF(be->ops->rope_kv_write(be, &gq, &gk, &gv, pos, &r, &gm, &err) == EMBER_OK, "%s: rope_kv_write: %s", tag,
               err.msg);
        CHECKF(same_bytes(be, &gq, &rq), "%s: q differs", tag);
        CHECKF(same_bytes(be, &gk, &rk), "%s: k differs", tag);
        CHECKF(rm.n_views == gm.n_views, "%s: views", tag);
        for (int i = 0; i < rm.n_views && i < gm.n_views; i++)
            CHECKF(same_bytes(be, rm.views[i].pool, gm.views[i].pool), "%s: pool %d differs", tag, i);
        for (int i = 0; i < rm.n_views && i < om.n_views; i++)
            CHECKF(same_bytes2(be, rm.views[i].pool, be1, om.views[i].pool), "%s: pool %d differs from one thread's", tag,
                   i);
        ember_kv_end(ref, true);
        ember_kv_end(got, true);
        ember_kv_end(one, true);
        for (int i = 0; i < 9; i++) ember_buffer_free(bufs[i]);
        free(q);
        free(k);
        free(v);
    }
    /* refusal: q of another token count than k */
    {
        const int T = 2;
        int32_t row[2] = {3, 3}, pos[2] = {len[3], len[3] + 1};
        if (CHECKV(ember_kv_begin(got, row, pos, T, &err) == EMBER_OK, "%s: begin: %s", tag0, err.msg)) {
            float z[2 * 16 * 512] = {0};
            const int64_t qs[3] = {1, Hkv * rep, D}, ks[3] = {T, Hkv, D};
            ember_tensor q, k, v;
            ember_buffer *bq = f32_data(be, &q, 3, qs, z), *bk = f32_data(be, &k, 3, ks, z),
                         *bv = f32_data(be, &v, 3, ks, z);
            ember_kv_layer views[2];
            ember_kv_map m;
            ember_kv_map_for(got, 0, row, pos, views, &m);
            CHECKF(be->ops->rope_kv_write(be, &q, &k, &v, pos, &r, &m, &err) == EMBER_ERR_INVALID_ARG,
                   "%s: q of 1 token, k of 2 accepted", tag0);
            ember_kv_end(got, false);
            ember_buffer_free(bq);
            ember_buffer_free(bk);
            ember_buffer_free(bv);
        }
    }
    ember_kv_free(ref);
    ember_kv_free(got);
    ember_kv_free(one);
}

static void rope_kv_cases(ember_backend *be, ember_isa isa, int th) {
    static const char *kinds[] = {"f32", "f16", "bf16", "q8", "q4"};
    ember_cpu_params p1 = {.n_threads = 1, .isa = isa};
    ember_backend *be1 = NULL;
    ember_error err = {0};
    if (th == 2) return; /* 1 thread stores a task a head, 7 by token or by row: 2 adds nothing here */
    if (!CHECKV(be->ops->rope_kv_write != NULL, "no rope_kv_write") ||
        !CHECKV(ember_backend_cpu_new(&p1, &be1, &err) == EMBER_OK, "backend: %s", err.msg))
        return;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        char tag[96];
        snprintf(tag, sizeof tag, "rope_kv_write %s t%d %s", ember_isa_name(isa), th, kinds[k]);
        check_rope_kv(be, be1, kinds[k], 2, 4, 64, 64, true, tag);   /* grouped heads, NEOX */
        check_rope_kv(be, be1, kinds[k], 1, 2, 128, 32, false, tag); /* partial rotary dims, interleaved */
        check_rope_kv(be, be1, kinds[k], 3, 1, 64, 48, true, tag);
    }
    ember_backend_free(be1);
}

static void test_rope_kv_write(void) {
    each_backend(rope_kv_cases);
}

int main(void) {
    test_add_rms_norm();
    test_rope_kv_write();
    test_read_large();
    test_host_run();
    test_argmax_rows();
    test_matmul_each();
    test_refusals();
    test_moe_token();
    return test_done();
}
