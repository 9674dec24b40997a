/*
 * kern_mlx_x86.h - 256-bit helpers shared by the AVX2 and AVX-512 MLX
 * kernels (kern_mlx_avx2.c, kern_mlx_avx512.c): unpacking one sub-block of
 * 32 codes from Ember's bit planes (formats/mlx_quant.h) into 32 bytes,
 * the exact int32 lane partials p_l of kern_mlx.h, and the fixed lane
 * tree. Included only by files built with AVX2 (or wider) enabled.
 */
#ifndef EMBER_CPU_KERN_MLX_X86_H
#define EMBER_CPU_KERN_MLX_X86_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kern_mlx.h"
#include "qkern.h"

#define MLX_AI static inline __attribute__((always_inline))
#define MLX_YQ offsetof(cpu_act32, q)
#define MLX_MX 4 /* activation rows sharing one unpacked weight sub-block */

/* Nibble plane: byte j = q[j] | q[j + 16] << 4 -> q[0..31]. */
MLX_AI __m256i mlx_nib(const uint8_t *p) {
    const __m128i m4 = _mm_set1_epi8(15);
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
}

/* 2-bit plane: byte j = q[j] | q[j+8] << 2 | q[j+16] << 4 | q[j+24] << 6. */
MLX_AI __m256i mlx_two(const uint8_t *p) {
    uint64_t x;
    memcpy(&x, p, 8);
    __m256i v = _mm256_srlv_epi64(_mm256_set1_epi64x((long long)x), _mm256_setr_epi64x(0, 2, 4, 6));
    return _mm256_and_si256(v, _mm256_set1_epi8(3));
}

/* 1-bit plane (bit e % 8 of byte e / 8): val where set, else 0. */
MLX_AI __m256i mlx_bit(const uint8_t *p, char val) {
    uint32_t h;
    memcpy(&h, p, 4);
    const __m256i shuf =
        _mm256_setr_epi64x(0, 0x0101010101010101ll, 0x0202020202020202ll, 0x0303030303030303ll);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), shuf);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(val));
}

/* The 32 codes of a sub-block, one per byte, in element order. */
MLX_AI __m256i mlx_unpack(const uint8_t *sb, const int BITS) {
    switch (BITS) {
    case 8: return _mm256_loadu_si256((const __m256i *)(const void *)sb);
    case 4: return mlx_nib(sb);
    case 2: return mlx_two(sb);
    case 3: return _mm256_or_si256(mlx_two(sb), mlx_bit(sb + 8, 4));
    case 5: return _mm256_or_si256(mlx_nib(sb), mlx_bit(sb + 16, 16));
    default: return _mm256_or_si256(mlx_nib(sb), _mm256_slli_epi16(mlx_two(sb + 16), 4)); /* 6 */
    }
}

/* p_l = sum_{e = 4l..4l+3} q_e * y_e as 8 int32 lanes, exactly. Codes of
   up to 6 bits keep maddubs' pair sums within int16 (2 * 63 * 127); 8-bit
   codes are split as (q - 128) * y + 128 * y, each within int16. */
MLX_AI __m256i mlx_dot4(__m256i q, __m256i y, const int BITS) {
#ifdef MLX_AVXVNNI /* kern_mlx_avx2vnni.c: one vpdpbusd, exact for any code width */
    (void)BITS;
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), q, y);
#endif
    const __m256i ones = _mm256_set1_epi16(1);
    if (BITS < 8) return _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), ones);
    const __m256i k80 = _mm256_set1_epi8((char)0x80);
    __m256i s = _mm256_xor_si256(q, k80); /* q - 128 as int8 */
    __m256i a = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(s, s), _mm256_sign_epi8(y, s)), ones);
    __m256i b = _mm256_madd_epi16(_mm256_maddubs_epi16(k80, y), ones);
    return _mm256_add_epi32(a, b);
}

/* The fixed tree of kernels.h over 16 lanes given as lanes 0-7 (even
   blocks) and 8-15 (odd blocks). */
static inline float mlx_hsum(__m256 even, __m256 odd) {
    __m256 s8 = _mm256_add_ps(even, odd);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 0x55));
    return _mm_cvtss_f32(s1);
}

static inline float mlx_f32(const unsigned char *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}

#endif
