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
 *
 * Ownership: each case allocates its buffers and frees them before the next.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/cpu.h"
#include "formats/mlx_quant.h"
#include "formats/quant.h"
#define TEST_RNG_SEED 0x5eed0b5ull
#include "test.h"

#define K 256
#define MAXN 8

/* MLX blocks (formats/mlx_quant.h) of N rows of K random codes, scales and biases. */
static bool make_mlx(ember_dtype t, int N, void *q) {
    int bits, G;
    if (!ember_dtype_mlx_params(t, &bits, &G)) return false;
    const size_t bb = ember_dtype_get(t)->block_bytes;
    uint8_t codes[128];
    for (int b = 0; b < N * (K / G); b++) {
        for (int i = 0; i < G; i++) codes[i] = (uint8_t)(rnd() % (1u << bits));
        ember_mlx_pack_block(bits, G, frnd() * 0.05f, frnd() * 0.2f, codes, (unsigned char *)q + (size_t)b * bb);
    }
    return true;
}

/* A weight [N, K] of type t with random values, in a buffer of be (*buf, caller frees). */
static bool make_weight(ember_backend *be, ember_dtype t, int N, ember_tensor *w, ember_buffer **buf) {
    ember_error err = {0};
    float *f = malloc((size_t)N * K * sizeof(float));
    size_t bytes = 0;
    bool ok = CHECKV(ember_dtype_nbytes(t, (size_t)N * K, &bytes), "size of %d rows", N);
    void *q = malloc(bytes);
    ok = ok && f && q;
    for (size_t i = 0; ok && i < (size_t)N * K; i++) f[i] = frnd();
    int mb, mg;
    if (ok && ember_dtype_mlx_params(t, &mb, &mg))
        ok = make_mlx(t, N, q);
    else
        ok = ok && CHECKV(ember_quantize(t, f, q, (size_t)N * K, &err) == EMBER_OK, "quantize: %s", err.msg);
    ok = ok && CHECKV(be->ops->buffer_from_host(be, q, bytes, buf, &err) == EMBER_OK, "buffer: %s", err.msg);
    int64_t shape[2] = {N, K};
    ok = ok && CHECKV(ember_tensor_view(w, *buf, 0, t, 2, shape, &err) == EMBER_OK, "view: %s", err.msg);
    free(f);
    free(q); /* buffer_from_host copies (zero_copy is off) */
    return ok;
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

int main(void) {
    test_matmul_each();
    test_refusals();
    return test_done();
}
