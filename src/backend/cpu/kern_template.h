/*
 * kern_template.h - the dot-product kernels written once for every ISA.
 *
 * Included by kern_scalar.c, kern_avx2.c and kern_avx512.c after they define
 *   vec16                    16 f32 lanes
 *   v_zero()                 all lanes 0
 *   v_load_f32(p)            16 floats
 *   v_load_f16(p)            16 halves, converted exactly
 *   v_load_bf16(p)           16 bfloat16s, converted exactly
 *   v_fma(acc, a, b)         acc + a * b per lane
 *   v_hsum(v)                the fixed tree sum described in kernels.h
 *   TILE_W, TILE_X           the main register tile (weight rows x input rows)
 *   KPREFIX                  a name prefix for this ISA
 * and the axpy kernel. Tiles change which dot products share loads, never
 * the order in which one is summed.
 */
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "kernels.h"

#define W_F32 0
#define W_F16 1
#define W_BF16 2
#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

/* The m-block: input rows kept hot in L2 while a tile of weights sweeps them. */
#define M_BLOCK 64

ALWAYS_INLINE vec16 ld_w(const void *p, size_t idx, int wt) {
    if (wt == W_F32) return v_load_f32((const float *)p + idx);
    if (wt == W_F16) return v_load_f16((const uint16_t *)p + idx);
    return v_load_bf16((const uint16_t *)p + idx);
}

ALWAYS_INLINE float w_scalar(const void *p, size_t idx, int wt) {
    if (wt == W_F32) return ((const float *)p)[idx];
    uint16_t h;
    memcpy(&h, (const uint16_t *)p + idx, 2);
    return wt == W_F16 ? ember_f16_to_f32(h) : ember_bf16_to_f32(h);
}

/* out[j * ldo + i] = dot(w row i, x row j) for i < NW, j < NX. */
ALWAYS_INLINE void mk(const void *w, size_t ldw, const float *x, size_t ldx, int K, float *out,
                      size_t ldo, const int NW, const int NX, const int wt) {
    vec16 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < NW; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NX; j++) acc[i][j] = v_zero();
    int k = 0;
    const size_t es = wt == W_F32 ? 4 : 2;
    for (; k + EMBER_LANES <= K; k += EMBER_LANES) {
        vec16 wv[4], xv[4];
        /* decode streams 16-bit weights once: ask for the next tile's rows at
           this k (bf16 decode: +12-17% at one thread on a quiet machine, more on
           a busy one; f32 was slower with it in a noisy A/B, so not f32) */
        if (NX == 1 && wt != W_F32)
#pragma GCC unroll 4
            for (int i = 0; i < NW; i++)
                __builtin_prefetch((const void *)((uintptr_t)w + ((size_t)(NW + i) * ldw + (size_t)k) * es), 0, 2);
#pragma GCC unroll 4
        for (int i = 0; i < NW; i++) wv[i] = ld_w(w, (size_t)i * ldw + (size_t)k, wt);
#pragma GCC unroll 4
        for (int j = 0; j < NX; j++) xv[j] = v_load_f32(x + (size_t)j * ldx + (size_t)k);
#pragma GCC unroll 4
        for (int i = 0; i < NW; i++)
#pragma GCC unroll 4
            for (int j = 0; j < NX; j++) acc[i][j] = v_fma(acc[i][j], wv[i], xv[j]);
    }
    if (k < K) { /* the last, partial chunk, zero-padded */
        float tw[4][EMBER_LANES] = {{0}}, tx[4][EMBER_LANES] = {{0}};
        int r = K - k;
        for (int i = 0; i < NW; i++)
            for (int l = 0; l < r; l++) tw[i][l] = w_scalar(w, (size_t)i * ldw + (size_t)(k + l), wt);
        for (int j = 0; j < NX; j++)
            for (int l = 0; l < r; l++) tx[j][l] = x[(size_t)j * ldx + (size_t)(k + l)];
        for (int i = 0; i < NW; i++)
            for (int j = 0; j < NX; j++)
                acc[i][j] = v_fma(acc[i][j], v_load_f32(tw[i]), v_load_f32(tx[j]));
    }
#pragma GCC unroll 4
    for (int i = 0; i < NW; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NX; j++) out[(size_t)j * ldo + (size_t)i] = v_hsum(acc[i][j]);
}

ALWAYS_INLINE void gemm_t(const void *w, size_t ldw, int nn, const float *x, size_t ldx, int mm,
                          int K, float *out, size_t ldo, int wt) {
    const size_t es = wt == W_F32 ? 4 : 2;
    const char *wb = w;
    for (int m0 = 0; m0 < mm; m0 += M_BLOCK) {
        int m1 = mm < m0 + M_BLOCK ? mm : m0 + M_BLOCK;
        int n = 0;
        for (; n + TILE_W <= nn; n += TILE_W) {
            const void *wn = wb + (size_t)n * ldw * es;
            int m = m0;
            for (; m + TILE_X <= m1; m += TILE_X)
                mk(wn, ldw, x + (size_t)m * ldx, ldx, K, out + (size_t)m * ldo + n, ldo, TILE_W,
                   TILE_X, wt);
            for (; m < m1; m++)
                mk(wn, ldw, x + (size_t)m * ldx, ldx, K, out + (size_t)m * ldo + n, ldo, TILE_W, 1,
                   wt);
        }
        for (; n < nn; n++) {
            const void *wn = wb + (size_t)n * ldw * es;
            int m = m0;
            for (; m + TILE_X <= m1; m += TILE_X)
                mk(wn, ldw, x + (size_t)m * ldx, ldx, K, out + (size_t)m * ldo + n, ldo, 1, TILE_X,
                   wt);
            for (; m < m1; m++)
                mk(wn, ldw, x + (size_t)m * ldx, ldx, K, out + (size_t)m * ldo + n, ldo, 1, 1, wt);
        }
    }
}

static void CAT(KPREFIX, gemm_f32)(const void *w, size_t ldw, int nn, const float *x, size_t ldx,
                                   int mm, int K, float *out, size_t ldo) {
    gemm_t(w, ldw, nn, x, ldx, mm, K, out, ldo, W_F32);
}
static void CAT(KPREFIX, gemm_f16)(const void *w, size_t ldw, int nn, const float *x, size_t ldx,
                                   int mm, int K, float *out, size_t ldo) {
    gemm_t(w, ldw, nn, x, ldx, mm, K, out, ldo, W_F16);
}
static void CAT(KPREFIX, gemm_bf16)(const void *w, size_t ldw, int nn, const float *x, size_t ldx,
                                    int mm, int K, float *out, size_t ldo) {
    gemm_t(w, ldw, nn, x, ldx, mm, K, out, ldo, W_BF16);
}
static float CAT(KPREFIX, dot)(const float *a, const float *b, int n) {
    float r;
    mk(a, 0, b, 0, n, &r, 0, 1, 1, W_F32);
    return r;
}
