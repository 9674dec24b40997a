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
 *   TILE_W1                  (optional) the weight rows of a tile for one input row
 *   V_HALVES                 (optional, where vec16 is two registers .lo and .hi) the
 *                            half-register forms vhalf, vh_load_f32 / _f16 / _bf16(p) (8 lanes),
 *                            vh_x(p) (8 inputs, in a register) and vh_fma(acc, a, b), so tiles
 *                            of several input rows step half by half
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

/* Tiles are at most 8 weight rows x 6 input rows: the kernels' arrays are sized so (unrolled,
   only a tile's own entries are ever touched) and tile() has a case for each input-row count. */
#define TW_MAX 8
#define TX_MAX 6
#if TILE_W > TW_MAX || TILE_X > TX_MAX || (defined(TILE_W1) && TILE_W1 > TW_MAX)
#error "a register tile is larger than TW_MAX x TX_MAX"
#endif

/* The m-block: input rows kept hot in L2 while a tile of weights sweeps them. (An m-block sized
   by K instead, 256 KB to 1 MB of input rows, measured level or slower on Zen 5 at K = 2,048 and
   8,192: bench/RESULTS.md.) */
#define M_BLOCK 64

ALWAYS_INLINE vec16 ld_w(const void *p, size_t idx, int wt) {
    if (wt == W_F32) return v_load_f32((const float *)p + idx);
    if (wt == W_F16) return v_load_f16((const uint16_t *)p + idx);
    return v_load_bf16((const uint16_t *)p + idx);
}

#ifdef V_HALVES
ALWAYS_INLINE vhalf ld_wh(const void *p, size_t idx, int wt) {
    if (wt == W_F32) return vh_load_f32((const float *)p + idx);
    if (wt == W_F16) return vh_load_f16((const uint16_t *)p + idx);
    return vh_load_bf16((const uint16_t *)p + idx);
}
#endif

ALWAYS_INLINE float w_scalar(const void *p, size_t idx, int wt) {
    if (wt == W_F32) return ((const float *)p)[idx];
    uint16_t h;
    memcpy(&h, (const uint16_t *)p + idx, 2);
    return wt == W_F16 ? ember_f16_to_f32(h) : ember_bf16_to_f32(h);
}

/* out[j * ldo + i * ldi] = dot(w row i, x row j) for i < NW <= TW_MAX, j < NX <= TX_MAX; row i
   at w + i * ldw elements. pf (and always for one input row) asks for the elements pfd ahead of
   each row's (the next tile's rows: NW * ldw). */
ALWAYS_INLINE void mk_at(const void *w, size_t ldw, const float *x, size_t ldx, int K, float *out,
                         size_t ldo, size_t ldi, const int NW, const int NX, const int wt, const bool pf,
                         const size_t pfd) {
    vec16 acc[TW_MAX][TX_MAX];
#pragma GCC unroll 8
    for (int i = 0; i < NW; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NX; j++) acc[i][j] = v_zero();
    int k = 0;
    const size_t es = wt == W_F32 ? 4 : 2;
#ifdef V_HALVES
    /* Several input rows: lanes 0-7 of every accumulator, then lanes 8-15, so that only one half's
       weights and one input register are live beside the accumulators and each input half is
       loaded once (the whole-vector step below runs out of registers and folds every input load
       into each of its NW multiply-adds). Each accumulator half takes the same multiply-adds in
       the same order, so the same bits. */
    if (NX > 1)
        for (; k + EMBER_LANES <= K; k += EMBER_LANES) {
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                if (pf && h == 0 && wt != W_F32) /* the next tile's rows (below) */
#pragma GCC unroll 8
                    for (int i = 0; i < NW; i++)
                        __builtin_prefetch((const void *)((uintptr_t)w + ((size_t)i * ldw + pfd + (size_t)k) * es), 0, 2);
                vhalf wh[TW_MAX];
#pragma GCC unroll 8
                for (int i = 0; i < NW; i++) wh[i] = ld_wh(w, (size_t)i * ldw + (size_t)(k + 8 * h), wt);
#pragma GCC unroll 8
                for (int j = 0; j < NX; j++) {
                    const vhalf xh = vh_x(x + (size_t)j * ldx + (size_t)(k + 8 * h));
#pragma GCC unroll 8
                    for (int i = 0; i < NW; i++) {
                        if (h)
                            acc[i][j].hi = vh_fma(acc[i][j].hi, wh[i], xh);
                        else
                            acc[i][j].lo = vh_fma(acc[i][j].lo, wh[i], xh);
                    }
                }
            }
        }
#endif
    for (; k + EMBER_LANES <= K; k += EMBER_LANES) {
        vec16 wv[TW_MAX];
        /* decode streams 16-bit weights once: ask for the next tile's rows at
           this k (bf16 decode: +12-17% at one thread on a quiet machine, more on
           a busy one; f32 was slower with it in a noisy A/B, so not f32); a
           batch's first tile of input rows over these weights (pf) does the
           same, so the next weight tile waits in L2 for its own first tile */
        if ((NX == 1 || pf) && wt != W_F32)
#pragma GCC unroll 8
            for (int i = 0; i < NW; i++)
                __builtin_prefetch((const void *)((uintptr_t)w + ((size_t)i * ldw + pfd + (size_t)k) * es), 0, 2);
#pragma GCC unroll 8
        for (int i = 0; i < NW; i++) wv[i] = ld_w(w, (size_t)i * ldw + (size_t)k, wt);
        /* one input row at a time: NW x NX accumulators + NW weights + 1 register */
#pragma GCC unroll 8
        for (int j = 0; j < NX; j++) {
            vec16 xv = v_load_f32(x + (size_t)j * ldx + (size_t)k);
#pragma GCC unroll 8
            for (int i = 0; i < NW; i++) acc[i][j] = v_fma(acc[i][j], wv[i], xv);
        }
    }
    if (k < K) { /* the last, partial chunk, zero-padded */
        float tw[TW_MAX][EMBER_LANES] = {{0}}, tx[TX_MAX][EMBER_LANES] = {{0}};
        int r = K - k;
        for (int i = 0; i < NW; i++)
            for (int l = 0; l < r; l++) tw[i][l] = w_scalar(w, (size_t)i * ldw + (size_t)(k + l), wt);
        for (int j = 0; j < NX; j++)
            for (int l = 0; l < r; l++) tx[j][l] = x[(size_t)j * ldx + (size_t)(k + l)];
        for (int i = 0; i < NW; i++)
            for (int j = 0; j < NX; j++)
                acc[i][j] = v_fma(acc[i][j], v_load_f32(tw[i]), v_load_f32(tx[j]));
    }
#pragma GCC unroll 8
    for (int i = 0; i < NW; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NX; j++) out[(size_t)j * ldo + (size_t)i * ldi] = v_hsum(acc[i][j]);
}

/* out[j * ldo + i] = dot(w row i, x row j): a tile of adjacent rows (mk_at). */
ALWAYS_INLINE void mk(const void *w, size_t ldw, const float *x, size_t ldx, int K, float *out,
                      size_t ldo, const int NW, const int NX, const int wt, const bool pf) {
    mk_at(w, ldw, x, ldx, K, out, ldo, 1, NW, NX, wt, pf, (size_t)NW * ldw);
}

/* NW weight rows against R (1 <= R <= TILE_X) input rows as one tile: the main tile, or the rows
   an m-block leaves over; each R its own unrolled instance. */
#define TILE_CASE(n)                                                                          \
    case n:                                                                                   \
        if (n <= TILE_X) mk_at(w, ldw, x, ldx, K, out, ldo, ldi, NW, n, wt, pf, pfd);         \
        break;
ALWAYS_INLINE void tile_at(const void *w, size_t ldw, const float *x, size_t ldx, int K, float *out,
                           size_t ldo, size_t ldi, const int NW, int R, const int wt, const bool pf, size_t pfd) {
    switch (R) {
        TILE_CASE(6)
        TILE_CASE(5)
        TILE_CASE(4)
        TILE_CASE(3)
        TILE_CASE(2)
        TILE_CASE(1)
    default: break;
    }
}
#undef TILE_CASE
ALWAYS_INLINE void tile(const void *w, size_t ldw, const float *x, size_t ldx, int K, float *out,
                        size_t ldo, const int NW, int R, const int wt, const bool pf) {
    tile_at(w, ldw, x, ldx, K, out, ldo, 1, NW, R, wt, pf, (size_t)NW * ldw);
}

/* out[m * ldo + n] = dot(w row n, x row m): tiles of TW weight rows x TILE_X input rows, over
   m-blocks of M_BLOCK input rows. */
ALWAYS_INLINE void gemm_rows(const void *w, size_t ldw, int nn, const float *x, size_t ldx, int mm,
                             int K, float *out, size_t ldo, int wt, const int TW) {
    const size_t es = wt == W_F32 ? 4 : 2;
    const char *wb = w;
    for (int m0 = 0; m0 < mm; m0 += M_BLOCK) {
        int m1 = mm - m0 < M_BLOCK ? mm : m0 + M_BLOCK;
        int n = 0;
        for (; n + TW <= nn; n += TW) {
            const void *wn = wb + (size_t)n * ldw * es;
            for (int m = m0; m < m1; m += TILE_X) /* the first input tile prefetches the next weight tile */
                tile(wn, ldw, x + (size_t)m * ldx, ldx, K, out + (size_t)m * ldo + n, ldo, TW,
                     m1 - m < TILE_X ? m1 - m : TILE_X, wt, m == m0 && m1 - m0 > 1 && n + 2 * TW <= nn);
        }
        for (; n < nn; n++) {
            const void *wn = wb + (size_t)n * ldw * es;
            for (int m = m0; m < m1; m += TILE_X)
                tile(wn, ldw, x + (size_t)m * ldx, ldx, K, out + (size_t)m * ldo + n, ldo, 1,
                     m1 - m < TILE_X ? m1 - m : TILE_X, wt, false);
        }
    }
}

#if defined(SPREAD_W1) || defined(SPREAD_MMAX)
/* gemm_rows for a few input rows (one: SPREAD_W1, TW = TILE_W1; 2 .. SPREAD_MMAX: TW = TILE_W) with
   a tile's TW weight rows taken nn / TW apart: tile n has rows n, n + S, n + 2 S, ... (S = nn / TW),
   so each of its rows' streams walks on into the next tile's, TW long sequential streams through
   the weights however short a row is; adjacent rows made TW streams of one row each that moved on
   every tile (with K = 896, 1,792 bytes: bf16 one-row decode streamed at 10-12 GB/s against 21-23
   spread, one Zen 3 core, bench/RESULTS.md). The first input tile asks for each row's next row, K
   elements ahead in its stream. The rows past TW S one by one. Which rows share a tile changes no
   dot product: the same bits. */
ALWAYS_INLINE void gemm_rows_spread(const void *w, size_t ldw, int nn, const float *x, size_t ldx, int mm,
                                    int K, float *out, size_t ldo, int wt, const int TW) {
    const size_t es = wt == W_F32 ? 4 : 2;
    const char *wb = w;
    const int S = nn / TW;
    for (int n = 0; n < S; n++) {
        const void *wn = wb + (size_t)n * ldw * es;
        for (int m = 0; m < mm; m += TILE_X)
            tile_at(wn, (size_t)S * ldw, x + (size_t)m * ldx, ldx, K, out + (size_t)m * ldo + n, ldo, (size_t)S,
                    TW, mm - m < TILE_X ? mm - m : TILE_X, wt, m == 0, ldw);
    }
    for (int n = TW * S; n < nn; n++) {
        const void *wn = wb + (size_t)n * ldw * es;
        for (int m = 0; m < mm; m += TILE_X)
            tile(wn, ldw, x + (size_t)m * ldx, ldx, K, out + (size_t)m * ldo + n, ldo, 1,
                 mm - m < TILE_X ? mm - m : TILE_X, wt, false);
    }
}
#endif

/* One input row (decode) streams the weights once: its tile is TILE_W1 rows where the ISA sets
   one, else TILE_W. */
ALWAYS_INLINE void gemm_t(const void *w, size_t ldw, int nn, const float *x, size_t ldx, int mm,
                          int K, float *out, size_t ldo, int wt) {
#ifdef SPREAD_W1
    if (mm == 1) {
        gemm_rows_spread(w, ldw, nn, x, ldx, mm, K, out, ldo, wt, TILE_W1);
        return;
    }
#endif
#ifdef SPREAD_MMAX
    if (mm > 1 && mm <= SPREAD_MMAX) {
        gemm_rows_spread(w, ldw, nn, x, ldx, mm, K, out, ldo, wt, TILE_W);
        return;
    }
#endif
#ifdef TILE_W1
    if (mm == 1) {
        gemm_rows(w, ldw, nn, x, ldx, mm, K, out, ldo, wt, TILE_W1);
        return;
    }
#endif
    gemm_rows(w, ldw, nn, x, ldx, mm, K, out, ldo, wt, TILE_W);
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
    mk(a, 0, b, 0, n, &r, 0, 1, 1, W_F32, false);
    return r;
}
