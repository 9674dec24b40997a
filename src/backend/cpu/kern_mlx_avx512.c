/*
 * kern_mlx_avx512.c - AVX-512 MLX gemm, bit-identical to the canonical dot
 * product of kern_mlx.h. Built with -mavx512f/bw/vl/dq (and compiled a
 * second time by kern_mlx_avx512vnni.c with MLX_VNNI set and -mavx512vnni)
 * and only called after runtime detection.
 *
 * Two consecutive 32-element blocks share one zmm: the even block's lane
 * partials land in lanes 0-7 and the odd block's in lanes 8-15, exactly
 * the canonical accumulator layout, with per-half scales. The partials
 * come from VNNI's u8 x s8 dot products (no saturation) or from
 * maddubs / madd. A trailing odd block updates lanes 0-7 alone. Tiles of
 * NW weight rows x MX activation rows (4 x 1 for decode, 2 x 4 for
 * prefill) reuse each unpacked pair of blocks and keep independent
 * accumulator chains in flight. No state.
 */
#include "kern_mlx_x86.h"

#ifndef MLX_VNNI
#define MLX_VNNI 0
#define MLX_AVX512_NAME cpu_mlx_gemm_avx512
#endif

/* 16 lane partials of two blocks (q and y each 64 bytes), exactly. */
MLX_AI __m512i z_dot4(__m512i q, __m512i y, const int BITS) {
#if MLX_VNNI
    (void)BITS;
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, y);
#else
    const __m512i ones = _mm512_set1_epi16(1);
    if (BITS < 8) return _mm512_madd_epi16(_mm512_maddubs_epi16(q, y), ones);
    const __m512i k80 = _mm512_set1_epi8((char)0x80);
    __m512i s = _mm512_xor_si512(q, k80); /* q - 128 as int8 */
    __mmask64 neg = _mm512_movepi8_mask(s);
    __m512i ys = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y); /* y * sign(q - 128) */
    __m512i a = _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(s), ys), ones);
    __m512i b = _mm512_madd_epi16(_mm512_maddubs_epi16(k80, y), ones);
    return _mm512_add_epi32(a, b);
#endif
}

MLX_AI __m512i z_join(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

#define NW_MAX 4
#define MX_MAX 4

/* A tile of NW weight rows x MX activation rows (weight row i at w + i * w_row, outputs out[j * ldo + i * ldi]). */
MLX_AI void z_tile(const unsigned char *w, size_t w_row, const unsigned char *x, size_t xa_row, int nb, int G,
                   float *out, size_t ldo, size_t ldi, const int BITS, const int NW, const int MX) {
    const int per_g = G / 32, sh = per_g == 1 ? 0 : per_g == 2 ? 1 : 2;
    const size_t bb = 8 + (size_t)G * BITS / 8, sbb = 4 * (size_t)BITS, ys = sizeof(cpu_act32);
    __m512 acc[NW_MAX][MX_MAX];
    float macc[NW_MAX][MX_MAX];
    for (int i = 0; i < NW; i++)
        for (int j = 0; j < MX; j++) {
            acc[i][j] = _mm512_setzero_ps();
            macc[i][j] = 0.0f;
        }
    int b = 0;
    for (; b + 1 < nb; b += 2) {
        const size_t g0 = (size_t)(b >> sh) * bb, g1 = (size_t)((b + 1) >> sh) * bb;
        const size_t c0 = 8 + (size_t)(b & (per_g - 1)) * sbb, c1 = 8 + (size_t)((b + 1) & (per_g - 1)) * sbb;
        __m512i q[NW_MAX];
        __m512 sv[NW_MAX];
        float m0[NW_MAX], m1[NW_MAX];
        for (int i = 0; i < NW; i++) {
            const unsigned char *wr = w + (size_t)i * w_row;
            q[i] = z_join(mlx_unpack(wr + g0 + c0, BITS), mlx_unpack(wr + g1 + c1, BITS));
            sv[i] = _mm512_insertf32x8(_mm512_set1_ps(mlx_f32(wr + g0)), _mm256_set1_ps(mlx_f32(wr + g1)), 1);
            m0[i] = mlx_f32(wr + g0 + 4);
            m1[i] = mlx_f32(wr + g1 + 4);
        }
        for (int j = 0; j < MX; j++) {
            const unsigned char *y0 = x + (size_t)j * xa_row + (size_t)b * ys, *y1 = y0 + ys;
            const __m512i yv = z_join(_mm256_loadu_si256((const __m256i *)(const void *)(y0 + MLX_YQ)),
                                      _mm256_loadu_si256((const __m256i *)(const void *)(y1 + MLX_YQ)));
            const __m512 ydv = _mm512_insertf32x8(_mm512_set1_ps(mlx_f32(y0)), _mm256_set1_ps(mlx_f32(y1)), 1);
            const float yds0 = mlx_f32(y0 + 4), yds1 = mlx_f32(y1 + 4);
            for (int i = 0; i < NW; i++) {
                __m512i p = z_dot4(q[i], yv, BITS);
                /* lane-wise s_g * y_b.d: the canonical dd of each half */
                acc[i][j] = _mm512_fmadd_ps(_mm512_mul_ps(sv[i], ydv), _mm512_cvtepi32_ps(p), acc[i][j]);
                macc[i][j] = __builtin_fmaf(m0[i], yds0, macc[i][j]);
                macc[i][j] = __builtin_fmaf(m1[i], yds1, macc[i][j]);
            }
        }
    }
    if (b < nb) { /* a last, even block: lanes 0-7 only */
        const size_t g0 = (size_t)(b >> sh) * bb, c0 = 8 + (size_t)(b & (per_g - 1)) * sbb;
        for (int i = 0; i < NW; i++) {
            const unsigned char *wr = w + (size_t)i * w_row;
            const float s0 = mlx_f32(wr + g0), m0 = mlx_f32(wr + g0 + 4);
            __m256i q = mlx_unpack(wr + g0 + c0, BITS);
            for (int j = 0; j < MX; j++) {
                const unsigned char *y0 = x + (size_t)j * xa_row + (size_t)b * ys;
                __m256i p = mlx_dot4(q, _mm256_loadu_si256((const __m256i *)(const void *)(y0 + MLX_YQ)), BITS);
                __m256 lo = _mm256_fmadd_ps(_mm256_set1_ps(s0 * mlx_f32(y0)), _mm256_cvtepi32_ps(p),
                                            _mm512_castps512_ps256(acc[i][j]));
                acc[i][j] = _mm512_insertf32x8(acc[i][j], lo, 0);
                macc[i][j] = __builtin_fmaf(m0, mlx_f32(y0 + 4), macc[i][j]);
            }
        }
    }
    for (int i = 0; i < NW; i++)
        for (int j = 0; j < MX; j++) {
            float t = mlx_hsum(_mm512_castps512_ps256(acc[i][j]), _mm512_extractf32x8_ps(acc[i][j], 1));
            out[(size_t)j * ldo + (size_t)i * ldi] = t + macc[i][j];
        }
}

#define MLX_TILE z_tile
#define MLX_GEMM_NAME MLX_AVX512_NAME
#include "kern_mlx_gemm.h"
