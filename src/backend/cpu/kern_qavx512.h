/*
 * kern_qavx512.h - AVX-512 quantized gemm kernels (qkern.h gives the
 * canonical dot product they reproduce bit for bit). Included by
 * kern_avx512.c, once without and once with EMBER_VNNI (vpdpbusd,
 * vpdpwssd); only called after runtime detection.
 *
 * 32-element types (Q4_0, Q5_0, Q8_0): two blocks per zmm (block b in the
 * low half, b + 1 in the high half, as in the canonical 16-lane layout),
 * weights unpacked to signed levels once per tile and reused across the
 * tile's activation rows. VNNI: p = dpbusd(-128 * sum4(w), y + 128, w);
 * without: p = madd(maddubs(|w|, sign(y, w)), 1). Both are the exact lane
 * partial sums of four products.
 * K types (Q4_K, Q5_K, Q6_K): one 64-element chunk per zmm, levels as
 * unsigned bytes, maddubs with the activations, then the sub-block scales
 * as int16 multipliers (dpwssd / madd); integer totals are reduced exactly
 * and combined in f32 as qkern.h defines.
 * Decode (fewer than QB_MIN_ROWS input rows) uses register tiles with a
 * software prefetch of the next tile; prefill uses q32_big / qk_big, which
 * unpack each weight tile once per 64 input rows. Both run the same
 * per-output operation sequence, so they give the same bits.
 * No state besides stack buffers; tiles write only their own outputs.
 */
#include "qkern.h"

#define QTW 4 /* weight rows per tile */
/* Software prefetch of the next tile's weights: a tile reads NW short rows
   side by side, too short for the hardware prefetchers to ramp up, so each
   step of a tile prefetches its share of the following NW rows (one
   contiguous range). Prefetches past the end of the matrix are harmless. */
static inline void q_prefetch_next(const unsigned char *w, size_t tile_bytes, int step, int nsteps) {
    size_t lines = (tile_bytes + 63) / 64, per = (lines + (size_t)nsteps - 1) / (size_t)nsteps;
    const char *next = (const char *)w + tile_bytes;
    for (size_t k = (size_t)step * per; k < (size_t)(step + 1) * per && k < lines; k++)
        _mm_prefetch(next + 64 * k, _MM_HINT_T0);
}
#define QTX 3 /* activation rows per tile */

static inline __m512 q_pair_f(float a, float b) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(a)), _mm256_set1_ps(b), 1);
}
static inline float q_h2f(const unsigned char *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}
static inline __m512i q_join(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* The 32 signed levels of one block of T (zero when blk is NULL). */
ALWAYS_INLINE __m256i q32_levels(const unsigned char *blk, const int T) {
    if (!blk) return _mm256_setzero_si256();
    if (T == EMBER_Q8_0) return _mm256_loadu_si256((const __m256i *)(blk + 2));
    const __m128i m4 = _mm_set1_epi8(15);
    const unsigned char *qs = blk + (T == EMBER_Q4_0 ? 2 : 6);
    __m128i v = _mm_loadu_si128((const __m128i *)qs);
    __m256i n = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
    if (T == EMBER_Q4_0) return _mm256_sub_epi8(n, _mm256_set1_epi8(8));
    uint32_t qh;
    memcpy(&qh, blk + 2, 4);
    /* Q5_0: level = nibble + 16 * bit - 16: subtract 16 where the bit is clear */
    return _mm256_mask_sub_epi8(n, (__mmask32)~qh, n, _mm256_set1_epi8(16));
}

/* The levels of blocks b0 and b1 (b1 NULL: zeros) as one zmm, and their
   scales as [d0 x 8, d1 x 8]. */
ALWAYS_INLINE __m512i q32_pair(const unsigned char *b0, const unsigned char *b1, __m512 *dw, const int T) {
    const size_t bb = T == EMBER_Q8_0 ? 34 : T == EMBER_Q4_0 ? 18 : 22;
    (void)bb;
    uint16_t h0, h1 = 0;
    memcpy(&h0, b0, 2);
    if (b1) memcpy(&h1, b1, 2);
    __m128 d = _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)h0 | ((uint32_t)h1 << 16))));
    *dw = _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                                _mm512_castps128_ps512(d));
    if (T != EMBER_Q4_0 || !b1) return q_join(q32_levels(b0, T), q32_levels(b1, T));
    /* Q4_0, two blocks: [lo0, lo1 | hi0, hi1] -> [lo0, hi0, lo1, hi1] */
    __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(b0 + 2))),
                                        _mm_loadu_si128((const __m128i *)(b1 + 2)), 1);
    const __m256i m4 = _mm256_set1_epi8(15);
    __m512i a = q_join(_mm256_and_si256(v, m4), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
    a = _mm512_shuffle_i64x2(a, a, _MM_SHUFFLE(3, 1, 2, 0));
    return _mm512_sub_epi8(a, _mm512_set1_epi8(8));
}

ALWAYS_INLINE void q32_tile(const unsigned char *w, size_t w_row, const unsigned char *x, size_t x_row, int nb,
                            float *out, size_t ldo, const int NW, const int NX, const int T) {
    const size_t bb = T == EMBER_Q8_0 ? 34 : T == EMBER_Q4_0 ? 18 : 22;
    __m512 acc[QTW][QTX];
#pragma GCC unroll 4
    for (int i = 0; i < NW; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NX; j++) acc[i][j] = _mm512_setzero_ps();
#ifdef EMBER_VNNI
    const __m512i c80 = _mm512_set1_epi8((char)0x80);
#else
    const __m512i ones = _mm512_set1_epi16(1);
#endif
    for (int b = 0; b < nb; b += 2) {
        const bool two = b + 1 < nb;
        q_prefetch_next(w, (size_t)NW * w_row, b / 2, (nb + 1) / 2);
        __m512i wv[QTW], wa[QTW];
        __m512 dw[QTW];
#ifndef EMBER_VNNI
        __mmask64 neg[QTW];
#endif
#pragma GCC unroll 4
        for (int i = 0; i < NW; i++) {
            const unsigned char *b0 = w + (size_t)i * w_row + (size_t)b * bb;
            const unsigned char *b1 = two ? b0 + bb : NULL;
            wv[i] = q32_pair(b0, b1, &dw[i], T);
#ifdef EMBER_VNNI
            wa[i] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), c80, wv[i]));
#else
            neg[i] = _mm512_movepi8_mask(wv[i]);
            wa[i] = _mm512_abs_epi8(wv[i]);
#endif
        }
#pragma GCC unroll 4
        for (int j = 0; j < NX; j++) {
            const unsigned char *y0 = x + (size_t)j * x_row + (size_t)b * sizeof(cpu_act32);
            float d0, d1 = 0.0f;
            memcpy(&d0, y0, 4);
            __m256i ylo = _mm256_loadu_si256((const __m256i *)(y0 + 8)), yhi = _mm256_setzero_si256();
            if (two) {
                memcpy(&d1, y0 + sizeof(cpu_act32), 4);
                yhi = _mm256_loadu_si256((const __m256i *)(y0 + sizeof(cpu_act32) + 8));
            }
            __m512i yv = q_join(ylo, yhi);
            __m512 dx = q_pair_f(d0, d1);
#ifdef EMBER_VNNI
            __m512i yu = _mm512_xor_si512(yv, c80);
#endif
#pragma GCC unroll 4
            for (int i = 0; i < NW; i++) {
#ifdef EMBER_VNNI
                __m512i p = _mm512_dpbusd_epi32(wa[i], yu, wv[i]);
#else
                __m512i ys = _mm512_mask_sub_epi8(yv, neg[i], _mm512_setzero_si512(), yv);
                __m512i p = _mm512_madd_epi16(_mm512_maddubs_epi16(wa[i], ys), ones);
#endif
                acc[i][j] = _mm512_fmadd_ps(_mm512_mul_ps(dw[i], dx), _mm512_cvtepi32_ps(p), acc[i][j]);
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NW; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NX; j++) out[(size_t)j * ldo + (size_t)i] = v_hsum(acc[i][j]);
}

/* ---- 32-element types, many activation rows (prefill) ------------------
   The weight levels of QB_NW rows are unpacked once per chunk of QB_KC
   block pairs into a stack buffer and reused by every activation row of
   an m-block, so the unpacking cost no longer scales with the rows. Each
   output still accumulates its pairs in order in one 16-lane vector: the
   same operations as q32_tile, so the same bits. */
#define QB_NW 4
#define QB_NX 4
#define QB_KC 32
#define QB_MB 64

typedef struct qb_wbuf {
    __m512i wv[QB_NW][QB_KC], wa[QB_NW][QB_KC];
    __m512 dw[QB_NW][QB_KC];
#ifndef EMBER_VNNI
    __mmask64 neg[QB_NW][QB_KC];
#endif
} qb_wbuf;

ALWAYS_INLINE void qb_tile(const qb_wbuf *wb, int i0, __m512 acc[][QB_MB], int j0, const unsigned char *x, size_t x_row,
                           int p0, int pc, int nb, const int NW, const int NX) {
    __m512 a[QB_NW][QB_NX];
#pragma GCC unroll 4
    for (int i = 0; i < NW; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NX; j++) a[i][j] = acc[i0 + i][j0 + j];
#ifdef EMBER_VNNI
    const __m512i c80 = _mm512_set1_epi8((char)0x80);
#else
    const __m512i ones = _mm512_set1_epi16(1);
#endif
    for (int p = 0; p < pc; p++) {
        const int b = 2 * (p0 + p);
        const bool two = b + 1 < nb;
        __m512i yv[QB_NX];
        __m512 dx[QB_NX];
#pragma GCC unroll 4
        for (int j = 0; j < NX; j++) {
            const unsigned char *y0 = x + (size_t)(j0 + j) * x_row + (size_t)b * sizeof(cpu_act32);
            float d0, d1 = 0.0f;
            memcpy(&d0, y0, 4);
            __m256i ylo = _mm256_loadu_si256((const __m256i *)(y0 + 8)), yhi = _mm256_setzero_si256();
            if (two) {
                memcpy(&d1, y0 + sizeof(cpu_act32), 4);
                yhi = _mm256_loadu_si256((const __m256i *)(y0 + sizeof(cpu_act32) + 8));
            }
#ifdef EMBER_VNNI
            yv[j] = _mm512_xor_si512(q_join(ylo, yhi), c80);
#else
            yv[j] = q_join(ylo, yhi);
#endif
            dx[j] = q_pair_f(d0, d1);
        }
#pragma GCC unroll 4
        for (int i = 0; i < NW; i++) {
            const __m512i wa = wb->wa[i0 + i][p];
#ifdef EMBER_VNNI
            const __m512i wv = wb->wv[i0 + i][p];
#endif
            const __m512 dw = wb->dw[i0 + i][p];
#pragma GCC unroll 4
            for (int j = 0; j < NX; j++) {
#ifdef EMBER_VNNI
                __m512i pp = _mm512_dpbusd_epi32(wa, yv[j], wv);
#else
                __m512i ys = _mm512_mask_sub_epi8(yv[j], wb->neg[i0 + i][p], _mm512_setzero_si512(), yv[j]);
                __m512i pp = _mm512_madd_epi16(_mm512_maddubs_epi16(wa, ys), ones);
#endif
                a[i][j] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dx[j]), _mm512_cvtepi32_ps(pp), a[i][j]);
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NW; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NX; j++) acc[i0 + i][j0 + j] = a[i][j];
}

ALWAYS_INLINE void q32_big(const unsigned char *w, size_t w_row, int nn, const unsigned char *x, size_t x_row, int mm,
                           int nb, float *out, size_t ldo, const int T) {
    const size_t bb = T == EMBER_Q8_0 ? 34 : T == EMBER_Q4_0 ? 18 : 22;
    const int npairs = (nb + 1) / 2;
    qb_wbuf wb;
    __m512 acc[QB_NW][QB_MB];
#ifdef EMBER_VNNI
    const __m512i c80 = _mm512_set1_epi8((char)0x80);
#endif
    for (int n0 = 0; n0 < nn; n0 += QB_NW) {
        const int nw = nn - n0 < QB_NW ? nn - n0 : QB_NW;
        for (int m0 = 0; m0 < mm; m0 += QB_MB) {
            const int mb = mm - m0 < QB_MB ? mm - m0 : QB_MB;
            const unsigned char *xm = x + (size_t)m0 * x_row;
            for (int i = 0; i < nw; i++)
                for (int j = 0; j < mb; j++) acc[i][j] = _mm512_setzero_ps();
            for (int p0 = 0; p0 < npairs; p0 += QB_KC) {
                const int pc = npairs - p0 < QB_KC ? npairs - p0 : QB_KC;
                for (int i = 0; i < nw; i++)
                    for (int p = 0; p < pc; p++) {
                        const int b = 2 * (p0 + p);
                        const bool two = b + 1 < nb;
                        const unsigned char *b0 = w + (size_t)(n0 + i) * w_row + (size_t)b * bb;
                        const unsigned char *b1 = two ? b0 + bb : NULL;
                        __m512i v = q32_pair(b0, b1, &wb.dw[i][p], T);
                        wb.wv[i][p] = v;
#ifdef EMBER_VNNI
                        wb.wa[i][p] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                                       _mm512_dpbusd_epi32(_mm512_setzero_si512(), c80, v));
#else
                        wb.neg[i][p] = _mm512_movepi8_mask(v);
                        wb.wa[i][p] = _mm512_abs_epi8(v);
#endif
                    }
                int j0 = 0;
                for (; j0 + QB_NX <= mb; j0 += QB_NX) {
                    if (nw == QB_NW)
                        qb_tile(&wb, 0, acc, j0, xm, x_row, p0, pc, nb, QB_NW, QB_NX);
                    else
                        for (int i = 0; i < nw; i++) qb_tile(&wb, i, acc, j0, xm, x_row, p0, pc, nb, 1, QB_NX);
                }
                for (; j0 < mb; j0++) {
                    if (nw == QB_NW)
                        qb_tile(&wb, 0, acc, j0, xm, x_row, p0, pc, nb, QB_NW, 1);
                    else
                        for (int i = 0; i < nw; i++) qb_tile(&wb, i, acc, j0, xm, x_row, p0, pc, nb, 1, 1);
                }
            }
            for (int i = 0; i < nw; i++)
                for (int j = 0; j < mb; j++) out[(size_t)(m0 + j) * ldo + (size_t)(n0 + i)] = v_hsum(acc[i][j]);
        }
    }
}

/* ---- K types ------------------------------------------------------------- */

/* One super-block of weights unpacked: 4 chunks of 64 unsigned levels, the
   int16 multiplier of each level pair, and the per-pair mins / scales
   against the activation's 16 bsums. */
typedef struct qk_unpacked {
    __m512i q[4], sc[4];
    __m256i bs_mul; /* int16 x16: Q4_K/Q5_K: min of sub-block j / 2; Q6_K: scale j */
    float d, dmin;
} qk_unpacked;

ALWAYS_INLINE void qk_unpack(const unsigned char *blk, qk_unpacked *u, const int T) {
    const __m256i m4 = _mm256_set1_epi8(15), m1 = _mm256_set1_epi8(1), m3 = _mm256_set1_epi8(3);
    if (T == EMBER_Q6_K) {
        const unsigned char *ql = blk, *qh = blk + 128;
        u->d = q_h2f(blk + 208);
        __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
        u->bs_mul = s16;
        __m512i s512 = _mm512_castsi256_si512(s16);
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++) {
            __m512i idx = _mm512_add_epi16(_mm512_set1_epi16((short)(4 * t)),
                                           _mm512_srli_epi16(_mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21,
                                                                              20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10,
                                                                              9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                             3));
            u->sc[t] = _mm512_permutexvar_epi16(idx, s512);
        }
#pragma GCC unroll 2
        for (int n = 0; n < 2; n++) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(ql + 64 * n));
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 64 * n + 32));
            __m256i h = _mm256_loadu_si256((const __m256i *)(qh + 32 * n));
            __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(h, m3), 4);
            __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m3), 4);
            __m256i h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m3), 4);
            __m256i h3 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m3), 4);
            u->q[2 * n] = q_join(_mm256_or_si256(_mm256_and_si256(l0, m4), h0), _mm256_or_si256(_mm256_and_si256(l1, m4), h1));
            u->q[2 * n + 1] = q_join(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), h2),
                                     _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), h3));
        }
        return;
    }
    /* Q4_K / Q5_K */
    u->d = q_h2f(blk);
    u->dmin = q_h2f(blk + 2);
    int sc[8], mn[8];
    for (int j = 0; j < 8; j++) cpu_k4_scale_min(blk + 4, j, &sc[j], &mn[j]);
    u->bs_mul = _mm256_setr_epi16((short)mn[0], (short)mn[0], (short)mn[1], (short)mn[1], (short)mn[2], (short)mn[2],
                                  (short)mn[3], (short)mn[3], (short)mn[4], (short)mn[4], (short)mn[5], (short)mn[5],
                                  (short)mn[6], (short)mn[6], (short)mn[7], (short)mn[7]);
    const unsigned char *qs = blk + (T == EMBER_Q4_K ? 16 : 48);
    __m256i qh = T == EMBER_Q5_K ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (T == EMBER_Q5_K) {
            __m256i b0 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), m1);
            __m256i b1 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), m1);
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(b0, 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(b1, 4));
        }
        u->q[c] = q_join(lo, hi);
        u->sc[c] = q_join(_mm256_set1_epi16((short)sc[2 * c]), _mm256_set1_epi16((short)sc[2 * c + 1]));
    }
}

/* acc after one weight super-block (unpacked) against activation block y. */
ALWAYS_INLINE float qk_step(const qk_unpacked *u, const unsigned char *y, float acc, const int T) {
#ifndef EMBER_VNNI
    const __m512i ones = _mm512_set1_epi16(1);
    (void)ones;
#endif
    float yd;
    memcpy(&yd, y, 4);
    __m256i bsums = _mm256_loadu_si256((const __m256i *)(y + 4));
    __m512i s = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        __m512i t = _mm512_maddubs_epi16(u->q[c], _mm512_loadu_si512((const void *)(y + 36 + 64 * c)));
#ifdef EMBER_VNNI
        s = _mm512_dpwssd_epi32(s, t, u->sc[c]);
#else
        s = _mm512_add_epi32(s, _mm512_madd_epi16(t, u->sc[c]));
#endif
    }
    int32_t s1 = _mm512_reduce_add_epi32(s);
    __m256i m = _mm256_madd_epi16(bsums, u->bs_mul);
    __m128i m2 = _mm_add_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    m2 = _mm_add_epi32(m2, _mm_shuffle_epi32(m2, 0x4e));
    m2 = _mm_add_epi32(m2, _mm_shuffle_epi32(m2, 0xb1));
    int32_t s2 = _mm_cvtsi128_si32(m2);
    if (T == EMBER_Q6_K) return __builtin_fmaf(u->d * yd, (float)(s1 - 32 * s2), acc);
    acc = __builtin_fmaf(u->d * yd, (float)s1, acc);
    return __builtin_fmaf(-(u->dmin * yd), (float)s2, acc);
}

ALWAYS_INLINE void qk_tile(const unsigned char *w, size_t w_row, const unsigned char *x, size_t x_row, int nb,
                           float *out, size_t ldo, const int NW, const int NX, const int T) {
    const size_t bb = T == EMBER_Q4_K ? 144 : T == EMBER_Q5_K ? 176 : 210;
    float acc[2][4] = {{0}};
    for (int b = 0; b < nb; b++) {
        qk_unpacked u[2];
        q_prefetch_next(w, (size_t)NW * w_row, b, nb);
#pragma GCC unroll 2
        for (int i = 0; i < NW; i++) qk_unpack(w + (size_t)i * w_row + (size_t)b * bb, &u[i], T);
#pragma GCC unroll 4
        for (int j = 0; j < NX; j++) {
            const unsigned char *y = x + (size_t)j * x_row + (size_t)b * sizeof(cpu_act256);
#pragma GCC unroll 2
            for (int i = 0; i < NW; i++) acc[i][j] = qk_step(&u[i], y, acc[i][j], T);
        }
    }
#pragma GCC unroll 2
    for (int i = 0; i < NW; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NX; j++) out[(size_t)j * ldo + (size_t)i] = acc[i][j];
}

/* K types, many activation rows: each weight super-block of QK_NW rows is
   unpacked once per chunk and reused by every row of a 64-row m-block; the
   per-output sequence of qk_step calls is unchanged, so are the bits. */
#define QK_NW 2
#define QK_KC 8
ALWAYS_INLINE void qk_big(const unsigned char *w, size_t w_row, int nn, const unsigned char *x, size_t x_row, int mm,
                          int nb, float *out, size_t ldo, const int T) {
    const size_t bb = T == EMBER_Q4_K ? 144 : T == EMBER_Q5_K ? 176 : 210;
    qk_unpacked u[QK_NW][QK_KC];
    float acc[QK_NW][QB_MB];
    for (int n0 = 0; n0 < nn; n0 += QK_NW) {
        const int nw = nn - n0 < QK_NW ? nn - n0 : QK_NW;
        for (int m0 = 0; m0 < mm; m0 += QB_MB) {
            const int mb = mm - m0 < QB_MB ? mm - m0 : QB_MB;
            for (int i = 0; i < nw; i++)
                for (int j = 0; j < mb; j++) acc[i][j] = 0.0f;
            for (int b0 = 0; b0 < nb; b0 += QK_KC) {
                const int bc = nb - b0 < QK_KC ? nb - b0 : QK_KC;
                for (int i = 0; i < nw; i++)
                    for (int b = 0; b < bc; b++) qk_unpack(w + (size_t)(n0 + i) * w_row + (size_t)(b0 + b) * bb, &u[i][b], T);
                for (int j = 0; j < mb; j++) {
                    const unsigned char *y = x + (size_t)(m0 + j) * x_row + (size_t)b0 * sizeof(cpu_act256);
                    if (nw == QK_NW) {
                        float a0 = acc[0][j], a1 = acc[1][j];
                        for (int b = 0; b < bc; b++) {
                            const unsigned char *yb = y + (size_t)b * sizeof(cpu_act256);
                            a0 = qk_step(&u[0][b], yb, a0, T);
                            a1 = qk_step(&u[1][b], yb, a1, T);
                        }
                        acc[0][j] = a0;
                        acc[1][j] = a1;
                    } else {
                        for (int b = 0; b < bc; b++)
                            acc[0][j] = qk_step(&u[0][b], y + (size_t)b * sizeof(cpu_act256), acc[0][j], T);
                    }
                }
            }
            for (int i = 0; i < nw; i++)
                for (int j = 0; j < mb; j++) out[(size_t)(m0 + j) * ldo + (size_t)(n0 + i)] = acc[i][j];
        }
    }
}

/* Tiles over nn weight rows x mm activation rows, activation rows blocked
   so a block stays in L2 while the weights stream. */
#define QGEMM_DRIVER(name, TILE, T, TW, TX)                                                                        \
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
            for (; n < nn; n++) {                                                                                 \
                int m = m0;                                                                                       \
                for (; m + TX <= m1; m += TX)                                                                     \
                    TILE(wb + (size_t)n * w_row, w_row, xb + (size_t)m * xa_row, xa_row, nb,                      \
                         out + (size_t)m * ldo + n, ldo, 1, TX, T);                                               \
                for (; m < m1; m++)                                                                               \
                    TILE(wb + (size_t)n * w_row, w_row, xb + (size_t)m * xa_row, xa_row, nb,                      \
                         out + (size_t)m * ldo + n, ldo, 1, 1, T);                                                \
            }                                                                                                     \
        }                                                                                                         \
    }

QGEMM_DRIVER(CAT(KPREFIX, q8_0_small), q32_tile, EMBER_Q8_0, QTW, QTX)
QGEMM_DRIVER(CAT(KPREFIX, q4_0_small), q32_tile, EMBER_Q4_0, QTW, QTX)
QGEMM_DRIVER(CAT(KPREFIX, q5_0_small), q32_tile, EMBER_Q5_0, QTW, QTX)

/* Few rows (decode): register tiles; many rows (prefill): q32_big. */
#define QB_MIN_ROWS 8
#define Q32_ENTRY(name, small, T)                                                                                 \
    static void name(const void *w, size_t w_row, int nn, const void *xa, size_t xa_row, int mm, int K, float *out, \
                     size_t ldo) {                                                                                \
        if (mm < QB_MIN_ROWS)                                                                                     \
            small(w, w_row, nn, xa, xa_row, mm, K, out, ldo);                                                     \
        else                                                                                                      \
            q32_big(w, w_row, nn, xa, xa_row, mm, K / 32, out, ldo, T);                                           \
    }
Q32_ENTRY(CAT(KPREFIX, q8_0), CAT(KPREFIX, q8_0_small), EMBER_Q8_0)
Q32_ENTRY(CAT(KPREFIX, q4_0), CAT(KPREFIX, q4_0_small), EMBER_Q4_0)
Q32_ENTRY(CAT(KPREFIX, q5_0), CAT(KPREFIX, q5_0_small), EMBER_Q5_0)
QGEMM_DRIVER(CAT(KPREFIX, q4_k_small), qk_tile, EMBER_Q4_K, 2, 4)
QGEMM_DRIVER(CAT(KPREFIX, q5_k_small), qk_tile, EMBER_Q5_K, 2, 4)
QGEMM_DRIVER(CAT(KPREFIX, q6_k_small), qk_tile, EMBER_Q6_K, 2, 4)
#define QK_ENTRY(name, small, T)                                                                                  \
    static void name(const void *w, size_t w_row, int nn, const void *xa, size_t xa_row, int mm, int K, float *out, \
                     size_t ldo) {                                                                                \
        if (mm < QB_MIN_ROWS)                                                                                     \
            small(w, w_row, nn, xa, xa_row, mm, K, out, ldo);                                                     \
        else                                                                                                      \
            qk_big(w, w_row, nn, xa, xa_row, mm, K / 256, out, ldo, T);                                           \
    }
QK_ENTRY(CAT(KPREFIX, q4_k), CAT(KPREFIX, q4_k_small), EMBER_Q4_K)
QK_ENTRY(CAT(KPREFIX, q5_k), CAT(KPREFIX, q5_k_small), EMBER_Q5_K)
QK_ENTRY(CAT(KPREFIX, q6_k), CAT(KPREFIX, q6_k_small), EMBER_Q6_K)
