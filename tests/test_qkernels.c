/*
 * test_qkernels.c - the CPU backend's quantized paths against independent
 * references:
 *   1. exact dequantization: every fixture llama weight quantized to each
 *      block type (formats/quant.h encoders), then dequantized by the
 *      backend (cpu_dequant_row) and by formats/quant.h's straightforward
 *      reference: bit-identical. Also random block bytes.
 *   2. every ISA's quantized gemm equals the canonical plain-C kernel bit
 *      for bit, for odd and even block counts and ragged tiles, and each
 *      output row equals the row computed alone (batch invariance).
 *   3. the canonical dot product is close to the f32 dot of the dequantized
 *      weights with the activations.
 */
#include "backend/cpu/kernels.h"
#include "backend/cpu/qkern.h"
#include "core/cpu.h"
#include "fixture.h"
#include "formats/quant.h"
#include "test.h"

static const ember_dtype k_types[] = {EMBER_Q4_0, EMBER_Q4_1, EMBER_Q5_0, EMBER_Q5_1, EMBER_Q8_0,
                                      EMBER_Q4_K, EMBER_Q5_K, EMBER_Q6_K, EMBER_Q8_K};
#define NTYPES (sizeof k_types / sizeof k_types[0])

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}
static float frnd(void) {
    return (float)((double)(rnd() & 0xffffff) / 16777216.0 * 2.0 - 1.0);
}

static void check_dequant(ember_dtype t, const float *src, size_t n, const char *what) {
    size_t bytes;
    CHECK(ember_dtype_nbytes(t, n, &bytes));
    unsigned char *q = malloc(bytes);
    float *a = malloc(n * 4), *b = malloc(n * 4);
    ember_error err;
    CHECK(ember_quantize(t, src, q, n, &err) == EMBER_OK);
    CHECK(cpu_dequant_row(t, q, a, (int64_t)n));
    CHECK(ember_dequantize(t, q, b, n, &err) == EMBER_OK);
    CHECKF(memcmp(a, b, n * 4) == 0, "%s: %s dequantization differs from the reference", what,
           ember_dtype_get(t)->name);
    /* random bytes with finite half scales */
    for (size_t i = 0; i < bytes; i++) q[i] = (unsigned char)rnd();
    const ember_dtype_info *di = ember_dtype_get(t);
    for (size_t blk = 0; blk < bytes / di->block_bytes; blk++) {
        unsigned char *p = q + blk * di->block_bytes;
        uint16_t h = ember_f32_to_f16(frnd() * 0.01f), h2 = ember_f32_to_f16(frnd() * 0.01f);
        if (t == EMBER_Q6_K) memcpy(p + 208, &h, 2);
        else if (t == EMBER_Q8_K) { float d = frnd(); memcpy(p, &d, 4); }
        else { memcpy(p, &h, 2); memcpy(p + 2, &h2, 2); }
    }
    CHECK(cpu_dequant_row(t, q, a, (int64_t)n));
    CHECK(ember_dequantize(t, q, b, n, &err) == EMBER_OK);
    CHECKF(memcmp(a, b, n * 4) == 0, "%s: %s dequantization of random blocks differs", what, ember_dtype_get(t)->name);
    free(q);
    free(a);
    free(b);
}

/* 1. the fixture's weights, every 2-D tensor flattened into whole blocks */
static void test_fixture_dequant(void) {
    fixture f;
    fixture_open(&f, "llama");
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors", f.dir);
    ember_st_file *wf = NULL;
    ember_error err;
    CHECKF(ember_st_open(path, &wf, &err) == EMBER_OK, "%s", err.msg);
    int tested = 0;
    for (int i = 0; wf && i < wf->n_tensors; i++) {
        const ember_st_tensor *t = &wf->tensors[i];
        if (t->ndim != 2 || t->dtype != EMBER_F32) continue;
        size_t n = t->nbytes / 4;
        float *x = malloc(n * 4);
        memcpy(x, t->data, n * 4);
        for (size_t k = 0; k < NTYPES; k++) {
            size_t be = ember_dtype_get(k_types[k])->block_elems;
            if (n / be) check_dequant(k_types[k], x, n / be * be, t->name);
        }
        free(x);
        tested++;
    }
    CHECK(tested > 5);
    ember_st_free(wf);
    fixture_close(&f);
}

static void quant_acts(cpu_act_kind kind, const float *x, int M, int K, unsigned char *xa) {
    size_t rb = cpu_act_row_bytes(kind, K);
    for (int m = 0; m < M; m++) {
        if (kind == CPU_ACT_32)
            cpu_quantize_act32(x + (size_t)m * K, K, xa + m * rb);
        else
            cpu_quantize_act256(x + (size_t)m * K, K, xa + m * rb);
    }
}

/* 2 and 3: every ISA against the canonical kernel */
static void test_gemm(ember_dtype t, int N, int K, int M) {
    cpu_act_kind kind = cpu_act_kind_for(t);
    size_t wr = cpu_row_bytes(t, K), xr = cpu_act_row_bytes(kind, K);
    float *wf = malloc((size_t)N * K * 4), *x = malloc((size_t)M * K * 4), *wd = malloc((size_t)N * K * 4);
    unsigned char *w = malloc(wr * N), *xa = malloc(xr * M);
    for (int i = 0; i < N * K; i++) wf[i] = frnd() * (1 + (i % 7));
    for (int i = 0; i < M * K; i++) x[i] = frnd();
    ember_error err;
    CHECK(ember_quantize(t, wf, w, (size_t)N * K, &err) == EMBER_OK);
    CHECK(cpu_dequant_row(t, w, wd, (int64_t)N * K));
    quant_acts(kind, x, M, K, xa);
    float *ref = malloc((size_t)M * N * 4), *got = malloc((size_t)M * N * 4), *one = malloc((size_t)N * 4);
    cpu_qgemm_generic(t)(w, wr, N, xa, xr, M, K, ref, (size_t)N);
    /* 3: close to the f32 product of the dequantized weights */
    double worst = 0;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0, a = 0;
            for (int k = 0; k < K; k++) {
                s += (double)wd[(size_t)n * K + k] * x[(size_t)m * K + k];
                a += fabs((double)wd[(size_t)n * K + k] * x[(size_t)m * K + k]);
            }
            double e = fabs(ref[(size_t)m * N + n] - s) / (a + 1e-9);
            if (e > worst) worst = e;
        }
    CHECKF(worst < 0.02, "%s: canonical dot off the f32 product by %g of sum|w x|", ember_dtype_get(t)->name, worst);
    const ember_isa isas[] = {EMBER_ISA_SCALAR, EMBER_ISA_AVX2, EMBER_ISA_AVX512};
    const cpu_kernels *tables[4];
    int nt = 0;
    for (int a = 0; a < 3; a++)
        if (ember_isa_supported(isas[a])) tables[nt++] = ember_cpu_kernels_for(isas[a]);
    ember_cpu_features f;
    ember_cpu_detect(&f);
    if (ember_isa_supported(EMBER_ISA_AVX512)) tables[nt++] = &ember_cpu_kernels_avx512; /* non-VNNI too */
    for (int a = 0; a < nt; a++) {
        cpu_qgemm_fn_t fn = tables[a]->qgemm[t] ? tables[a]->qgemm[t] : cpu_qgemm_generic(t);
        memset(got, 0xff, (size_t)M * N * 4);
        fn(w, wr, N, xa, xr, M, K, got, (size_t)N);
        CHECKF(memcmp(got, ref, (size_t)M * N * 4) == 0, "%s %s N=%d K=%d M=%d: differs from the canonical kernel",
               tables[a]->variant, ember_dtype_get(t)->name, N, K, M);
        for (int m = 0; m < M; m++) { /* each row alone */
            fn(w, wr, N, xa + (size_t)m * xr, xr, 1, K, one, (size_t)N);
            CHECKF(memcmp(one, got + (size_t)m * N, (size_t)N * 4) == 0, "%s %s: row %d alone differs",
                   tables[a]->variant, ember_dtype_get(t)->name, m);
        }
    }
    free(wf);
    free(x);
    free(wd);
    free(w);
    free(xa);
    free(ref);
    free(got);
    free(one);
}

int main(void) {
    test_fixture_dequant();
    for (size_t k = 0; k < NTYPES; k++) {
        bool kq = ember_dtype_get(k_types[k])->block_elems == 256;
        test_gemm(k_types[k], 13, kq ? 512 : 96, 7);
        test_gemm(k_types[k], 5, kq ? 768 : 64, 1);
        test_gemm(k_types[k], 9, kq ? 256 : 352, 4);
        test_gemm(k_types[k], 13, kq ? 2304 : 2144, 70); /* the many-rows paths, K chunks, odd block count */
    }
    return test_done();
}
