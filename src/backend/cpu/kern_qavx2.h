/*
 * kern_qavx2.h - AVX2 quantized gemm kernels, bit-identical to the
 * canonical dot products of qkern.h. Included by kern_avx2.c (built with
 * -mavx2 -mfma -mf16c) and only called after runtime detection.
 *
 * 32-element types: one block per ymm; even blocks accumulate in the low
 * eight lanes of the canonical 16 (vec16.lo), odd blocks in the high eight;
 * p = madd(maddubs(|w|, sign(y, w)), 1) are the exact partial sums of four
 * products. K types: maddubs of unsigned levels with the activations, the
 * sub-block scales applied with madd, totals reduced exactly in int32.
 * No state; tiles write only their own outputs.
 */
#include "qkern.h"

#define Q2TW 2
#define Q2TX 2

static inline float q2_h2f(const unsigned char *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

ALWAYS_INLINE __m256i q2_levels(const unsigned char *blk, const int T) {
    if (T == EMBER_Q8_0) return _mm256_loadu_si256((const __m256i *)(blk + 2));
    const __m128i m4 = _mm_set1_epi8(15);
    __m128i v = _mm_loadu_si128((const __m128i *)(blk + (T == EMBER_Q4_0 ? 2 : 6)));
    __m256i n = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
    if (T == EMBER_Q4_0) return _mm256_sub_epi8(n, _mm256_set1_epi8(8));
    /* Q5_0: spread the 32 high bits to bytes, 0x10 where set */
    uint32_t qh;
    memcpy(&qh, blk + 2, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303ll, 0x0202020202020202ll, 0x0101010101010101ll, 0);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
    return _mm256_sub_epi8(_mm256_or_si256(n, _mm256_and_si256(set, _mm256_set1_epi8(16))), _mm256_set1_epi8(16));
}

ALWAYS_INLINE void q2_tile(const unsigned char *w, size_t w_row, const unsigned char *x, size_t x_row, int nb,
                           float *out, size_t ldo, const int NW, const int NX, const int T) {
    const size_t bb = T == EMBER_Q8_0 ? 34 : T == EMBER_Q4_0 ? 18 : 22;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[Q2TW][Q2TX][2];
#pragma GCC unroll 2
    for (int i = 0; i < NW; i++)
#pragma GCC unroll 2
        for (int j = 0; j < NX; j++) acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const int h = b & 1;
        __m256i wv[Q2TW], wa[Q2TW];
        float dw[Q2TW];
#pragma GCC unroll 2
        for (int i = 0; i < NW; i++) {
            const unsigned char *blk = w + (size_t)i * w_row + (size_t)b * bb;
            wv[i] = q2_levels(blk, T);
            wa[i] = _mm256_sign_epi8(wv[i], wv[i]);
            dw[i] = q2_h2f(blk);
        }
#pragma GCC unroll 2
        for (int j = 0; j < NX; j++) {
            const unsigned char *y = x + (size_t)j * x_row + (size_t)b * sizeof(cpu_act32);
            float dx;
            memcpy(&dx, y, 4);
            __m256i yv = _mm256_loadu_si256((const __m256i *)(y + 8));
#pragma GCC unroll 2
            for (int i = 0; i < NW; i++) {
                __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wa[i], _mm256_sign_epi8(yv, wv[i])), ones);
                acc[i][j][h] = _mm256_fmadd_ps(_mm256_set1_ps(dw[i] * dx), _mm256_cvtepi32_ps(p), acc[i][j][h]);
            }
        }
    }
#pragma GCC unroll 2
    for (int i = 0; i < NW; i++)
#pragma GCC unroll 2
        for (int j = 0; j < NX; j++) out[(size_t)j * ldo + (size_t)i] = v_hsum((vec16){acc[i][j][0], acc[i][j][1]});
}

static inline int32_t q2_hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* One weight super-block against one activation super-block: S1 (scaled
   level sums) and S2 (mins or scales against bsums), exact. */
ALWAYS_INLINE void q2_kdot(const unsigned char *blk, const unsigned char *y, int32_t *s1, int32_t *s2, const int T) {
    const __m256i m4 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3), m1 = _mm256_set1_epi8(1);
    __m256i bsums = _mm256_loadu_si256((const __m256i *)(y + 4));
    const unsigned char *yq = y + 36;
    __m256i s = _mm256_setzero_si256();
    if (T == EMBER_Q6_K) {
        const int8_t *sc = (const int8_t *)(blk + 192);
        for (int n = 0; n < 2; n++) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * n));
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * n + 32));
            __m256i hq = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * n));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hq, m3), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hq, 2), m3), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hq, 4), m3), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hq, 6), m3), 4));
            for (int k = 0; k < 4; k++) {
                int e0 = 128 * n + 32 * k; /* first element; sub-blocks e0/16 and e0/16 + 1 */
                __m256i t = _mm256_maddubs_epi16(q[k], _mm256_loadu_si256((const __m256i *)(yq + e0)));
                __m256i scv = _mm256_set_m128i(_mm_set1_epi16(sc[e0 / 16 + 1]), _mm_set1_epi16(sc[e0 / 16]));
                s = _mm256_add_epi32(s, _mm256_madd_epi16(t, scv));
            }
        }
        *s2 = q2_hsum_i32(_mm256_madd_epi16(bsums, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc))));
        *s1 = q2_hsum_i32(s);
        return;
    }
    int sc[8], mn[8];
    for (int j = 0; j < 8; j++) cpu_k4_scale_min(blk + 4, j, &sc[j], &mn[j]);
    const unsigned char *qs = blk + (T == EMBER_Q4_K ? 16 : 48);
    __m256i qh = T == EMBER_Q5_K ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (T == EMBER_Q5_K) {
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), m1), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), m1), 4));
        }
        __m256i t0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(yq + 64 * c)));
        __m256i t1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(yq + 64 * c + 32)));
        s = _mm256_add_epi32(s, _mm256_madd_epi16(t0, _mm256_set1_epi16((short)sc[2 * c])));
        s = _mm256_add_epi32(s, _mm256_madd_epi16(t1, _mm256_set1_epi16((short)sc[2 * c + 1])));
    }
    __m256i mins = _mm256_setr_epi16((short)mn[0], (short)mn[0], (short)mn[1], (short)mn[1], (short)mn[2],
                                     (short)mn[2], (short)mn[3], (short)mn[3], (short)mn[4], (short)mn[4],
                                     (short)mn[5], (short)mn[5], (short)mn[6], (short)mn[6], (short)mn[7],
                                     (short)mn[7]);
    *s2 = q2_hsum_i32(_mm256_madd_epi16(bsums, mins));
    *s1 = q2_hsum_i32(s);
}

ALWAYS_INLINE void q2k_tile(const unsigned char *w, size_t w_row, const unsigned char *x, size_t x_row, int nb,
                            float *out, size_t ldo, const int NW, const int NX, const int T) {
    const size_t bb = T == EMBER_Q4_K ? 144 : T == EMBER_Q5_K ? 176 : 210;
    for (int i = 0; i < NW; i++)
        for (int j = 0; j < NX; j++) {
            const unsigned char *wr = w + (size_t)i * w_row, *xr = x + (size_t)j * x_row;
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                const unsigned char *blk = wr + (size_t)b * bb, *y = xr + (size_t)b * sizeof(cpu_act256);
                int32_t s1, s2;
                q2_kdot(blk, y, &s1, &s2, T);
                float yd;
                memcpy(&yd, y, 4);
                if (T == EMBER_Q6_K) {
                    acc = __builtin_fmaf(q2_h2f(blk + 208) * yd, (float)(s1 - 32 * s2), acc);
                } else {
                    acc = __builtin_fmaf(q2_h2f(blk) * yd, (float)s1, acc);
                    acc = __builtin_fmaf(-(q2_h2f(blk + 2) * yd), (float)s2, acc);
                }
            }
            out[(size_t)j * ldo + (size_t)i] = acc;
        }
}

#define Q2GEMM(name, TILE, T, TW, TX)                                                                             \
    static void name(const void *w, size_t w_row, int nn, const void *xa, size_t xa_row, int mm, int K, float *out, \
                     size_t ldo) {                                                                                \
        const unsigned char *wb = w, *xb = xa;                                                                    \
        const int nb = T == EMBER_Q4_K || T == EMBER_Q5_K || T == EMBER_Q6_K ? K / 256 : K / 32;                  \
        for (int m0 = 0; m0 < mm; m0 += M_BLOCK) {                                                                \
            int m1 = mm < m0 + M_BLOCK ? mm : m0 + M_BLOCK;                                                       \
            int n = 0;                                                                                            \
            for (; n + TW <= nn; n += TW) {                                                                       \
                int m = m0;                                                                                       \
                for (; m + TX <= m1; m += TX)                                                                     \
                    TILE(wb + (size_t)n * w_row, w_row, xb + (size_t)m * xa_row, xa_row, nb,                      \
                         out + (size_t)m * ldo + n, ldo, TW, TX, T);                                              \
                for (; m < m1; m++)                                                                               \
                    TILE(wb + (size_t)n * w_row, w_row, xb + (size_t)m * xa_row, xa_row, nb,                      \
                         out + (size_t)m * ldo + n, ldo, TW, 1, T);                                               \
            }                                                                                                     \
            for (; n < nn; n++)                                                                                   \
                for (int m = m0; m < m1; m++)                                                                     \
                    TILE(wb + (size_t)n * w_row, w_row, xb + (size_t)m * xa_row, xa_row, nb,                      \
                         out + (size_t)m * ldo + n, ldo, 1, 1, T);                                                \
        }                                                                                                         \
    }

Q2GEMM(avx2_q8_0, q2_tile, EMBER_Q8_0, Q2TW, Q2TX)
Q2GEMM(avx2_q4_0, q2_tile, EMBER_Q4_0, Q2TW, Q2TX)
Q2GEMM(avx2_q5_0, q2_tile, EMBER_Q5_0, Q2TW, Q2TX)
Q2GEMM(avx2_q4_k, q2k_tile, EMBER_Q4_K, 1, 1)
Q2GEMM(avx2_q5_k, q2k_tile, EMBER_Q5_K, 1, 1)
Q2GEMM(avx2_q6_k, q2k_tile, EMBER_Q6_K, 1, 1)
