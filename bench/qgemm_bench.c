/*
 * qgemm_bench.c - one matmul kernel alone, single thread: N weight rows of
 * K elements (quantized: packed, qkern.h; float: the gemm kernels of
 * kern_template.h) times M activation rows, for every kernel table this CPU
 * has (scalar skipped). Reports the fastest call and its multiply-accumulates
 * per second. Random data; the outputs of the tables are compared (they
 * must be bit-identical).
 *
 * usage: qgemm_bench [TYPE] [N] [K] [M] [SECONDS]
 *        TYPE q8_0 | q4_0 | q5_0 | q4_k | q5_k | q6_k | f32 | f16 | bf16
 *        (default q8_0), N 896, K 896, M 512, SECONDS 1 per table. bf16 on a
 *        table with AMX-BF16 tiles runs the tiles' packed kernel (kern_bamx.h),
 *        as the backend does for a prepared weight; its bits are another
 *        summation's and are not compared.
 * env:   ONLY=VARIANT runs that table alone (avx2, avx512-vnni, amx, ...).
 *        COPIES=C cycles the calls over C copies of the weights (C x the
 *        weight bytes in memory), so that with C large enough each call
 *        streams its weights from memory, as a model's layers do, instead of
 *        finding them in the caches; the time is then the mean call, not the
 *        fastest.
 * Builds against the internal headers (src/); never run by the tests.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/qkern.h"
#include "core/cpu.h"
#include "formats/quant.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    const char *tn = argc > 1 ? argv[1] : "q8_0";
    int N = argc > 2 ? atoi(argv[2]) : 896, K = argc > 3 ? atoi(argv[3]) : 896, M = argc > 4 ? atoi(argv[4]) : 512;
    double secs = argc > 5 ? atof(argv[5]) : 1.0;
    ember_dtype t = EMBER_DTYPE_INVALID;
    for (int i = 0; i < EMBER_DTYPE_COUNT; i++)
        if (!strcmp(ember_dtype_get((ember_dtype)i)->name, tn)) t = (ember_dtype)i;
    const bool fl = t == EMBER_F32 || t == EMBER_F16 || t == EMBER_BF16; /* float weights */
    if (t == EMBER_DTYPE_INVALID || !(fl || cpu_qpack_has(t)) || N % 16 || N <= 0 || K <= 0 || M <= 0) {
        fprintf(stderr, "usage: qgemm_bench [q8_0|q4_0|q5_0|q4_k|q5_k|q6_k|f32|f16|bf16] [N%%16==0] [K] [M] [SECONDS]\n");
        return 2;
    }
    cpu_act_kind ak = fl ? CPU_ACT_32 : cpu_act_kind_for(t);
    size_t wr = cpu_row_bytes(t, K), xr = cpu_act_row_bytes(ak, K);
    if (!wr || !xr) return fprintf(stderr, "K=%d is not a whole number of blocks\n", K), 2;
    float *wf = malloc(sizeof(float) * (size_t)N * K), *x = malloc(sizeof(float) * (size_t)M * K);
    unsigned char *w = malloc(wr * N), *wp = aligned_alloc(64, (wr * N + 63) / 64 * 64), *xa = malloc(xr * M);
    unsigned char *xt = ak == CPU_ACT_32 ? malloc(cpu_act32_tiled_bytes(M, K)) : NULL;
    float *out = malloc(sizeof(float) * (size_t)M * N), *ref = malloc(sizeof(float) * (size_t)M * N);
    uint64_t s = 7;
    for (size_t i = 0; i < (size_t)N * K; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        wf[i] = (float)((int64_t)(s >> 40) - (1 << 23)) / (1 << 23);
    }
    for (size_t i = 0; i < (size_t)M * K; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((int64_t)(s >> 40) - (1 << 23)) / (1 << 23);
    }
    ember_error err;
    if (fl) { /* the weights in their own type; the kernels read x as f32 */
        for (size_t i = 0; i < (size_t)N * K; i++) {
            uint16_t h = t == EMBER_BF16 ? ember_f32_to_bf16(wf[i]) : ember_f32_to_f16(wf[i]);
            if (t == EMBER_F32) memcpy(w + 4 * i, &wf[i], 4);
            else memcpy(w + 2 * i, &h, 2);
        }
    } else {
        if (ember_quantize(t, wf, w, (size_t)N * K, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
        for (int g = 0; g < N / 16; g++) cpu_qpack_group(t, w + (size_t)g * 16 * wr, wr, 16, K, wp + (size_t)g * 16 * wr);
        for (int m = 0; m < M; m++)
            (ak == CPU_ACT_32 ? cpu_quantize_act32 : cpu_quantize_act256)(x + (size_t)m * K, K, xa + (size_t)m * xr);
    }
    const ember_isa isas[] = {EMBER_ISA_AVX2, EMBER_ISA_AVX512, EMBER_ISA_AMX};
    const cpu_kernels *tabs[6];
    int nt = 0;
    for (int i = 0; i < 3; i++)
        if (ember_isa_supported(isas[i])) tabs[nt++] = ember_cpu_kernels_for(isas[i]);
    /* the tiers without VNNI too, where the CPU has it */
    if (ember_isa_supported(EMBER_ISA_AVX2) && tabs[0] != &ember_cpu_kernels_avx2) tabs[nt++] = &ember_cpu_kernels_avx2;
    if (ember_isa_supported(EMBER_ISA_AVX512) && ember_cpu_kernels_for(EMBER_ISA_AVX512) != &ember_cpu_kernels_avx512)
        tabs[nt++] = &ember_cpu_kernels_avx512;
    printf("# %s N=%d K=%d M=%d, one thread\n", tn, N, K, M);
    const char *only = getenv("ONLY"); /* one table by its variant name, e.g. for perf stat */
    const int copies = getenv("COPIES") && atoi(getenv("COPIES")) > 1 ? atoi(getenv("COPIES")) : 1;
    const size_t wbytes = wr * N; /* one copy of w (float) or wp (packed) */
    unsigned char *wc = NULL;
    if (copies > 1) {
        if (!(wc = aligned_alloc(64, (wbytes * (size_t)copies + 63) / 64 * 64)))
            return fprintf(stderr, "no memory for %d copies\n", copies), 1;
        for (int c = 0; c < copies; c++) memcpy(wc + (size_t)c * wbytes, fl ? w : wp, wbytes);
        printf("# cycling over %d copies of the weights (%.1f MB), the mean call\n", copies, (double)wbytes * copies / 1e6);
    }
    /* bf16 weights on a table with tiles for them (AMX): packed as the backend packs them, the inputs split
       into bf16 hi / lo rows padded to whole 16-row tiles (cpu_backend.c quantize_acts) */
    unsigned char *wb16 = NULL, *xb16 = NULL, *wcb = NULL;
    const size_t xb_row = (size_t)K * 4;
    for (int a = 0; a < nt && t == EMBER_BF16 && K % 32 == 0 && !wb16; a++) {
        if (!tabs[a]->qgemm_packed[EMBER_BF16] || (only && strcmp(only, tabs[a]->variant))) continue;
        const size_t rows = (size_t)M + (size_t)(16 - M % 16) + 15;
        if (!(wb16 = aligned_alloc(64, (wbytes + 63) / 64 * 64)) || !(xb16 = calloc(rows, xb_row)))
            return fprintf(stderr, "out of memory\n"), 1;
        for (int g = 0; g < N / 16; g++)
            cpu_qpack_group(t, w + (size_t)g * 16 * wr, wr, 16, K, wb16 + (size_t)g * 16 * wr);
        for (int m = 0; m < M; m++) tabs[a]->quantize_actbf16(x + (size_t)m * K, K, xb16 + (size_t)m * xb_row);
        if (copies > 1) {
            if (!(wcb = aligned_alloc(64, (wbytes * (size_t)copies + 63) / 64 * 64)))
                return fprintf(stderr, "no memory for %d copies\n", copies), 1;
            for (int c = 0; c < copies; c++) memcpy(wcb + (size_t)c * wbytes, wb16, wbytes);
        }
    }
    for (int a = 0; a < nt; a++) {
        if (only && strcmp(only, tabs[a]->variant)) continue;
        const bool tiles16 = wb16 && tabs[a]->qgemm_packed[EMBER_BF16]; /* bf16 on AMX tiles */
        cpu_qgemm_packed_fn f = tiles16 ? tabs[a]->qgemm_packed[EMBER_BF16] : fl ? NULL : tabs[a]->qgemm_packed[t];
        cpu_qgemm_tiled_fn tf = !fl && M >= tabs[a]->tiled_min_m ? tabs[a]->qgemm_tiled[t] : NULL;
        cpu_gemm_fn gf = t == EMBER_F32 ? tabs[a]->gemm_f32 : t == EMBER_F16 ? tabs[a]->gemm_f16 : tabs[a]->gemm_bf16;
        if (tf) { /* the backend tiles the activations once per matmul, outside the kernel */
            for (int tile = 0; tile < (M + 15) / 16; tile++) cpu_act32_tile_blocks(xa, xr, K, M, tile, 0, K / 32, xt);
        }
#define CALL(W)                                                                                               \
    (tiles16 ? f(W, N / 16, xb16, xb_row, M, K, out, (size_t)N)                                              \
     : fl    ? gf(W, (size_t)K, N, x, (size_t)K, M, K, out, (size_t)N)                                       \
     : tf    ? tf(W, N / 16, xt, M, K, out, (size_t)N)                                                      \
             : f(W, N / 16, xa, xr, M, K, out, (size_t)N))
        unsigned char *w1 = tiles16 ? wb16 : fl ? w : wp, *wcs = tiles16 ? wcb : wc;
        CALL(w1);
        double t0 = now(), t1, per = 1e30;
        long calls = 0;
        do { /* the fastest call: the machine may be shared; with copies, the mean */
            double c0 = now();
            CALL(copies > 1 ? wcs + (size_t)(calls % copies) * wbytes : w1);
            t1 = now();
            calls++;
            if (t1 - c0 < per) per = t1 - c0;
        } while (t1 - t0 < secs);
        if (copies > 1) per = (t1 - t0) / (double)calls;
        if (a == 0 || only) memcpy(ref, out, sizeof(float) * (size_t)M * N);
        bool same = !memcmp(ref, out, sizeof(float) * (size_t)M * N);
        printf("%-12s %9.3f ms  %7.1f GMAC/s  %s\n", tabs[a]->variant, per * 1e3, (double)N * K * M / per * 1e-9,
               tiles16 ? "bf16 tiles (another summation)" : same ? "same bits" : "DIFFERS");
    }
    free(wf), free(x), free(w), free(wp), free(xa), free(xt), free(out), free(ref), free(wc), free(wb16), free(xb16),
        free(wcb);
    return 0;
}
