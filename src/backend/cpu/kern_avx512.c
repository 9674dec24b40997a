/*
 * kern_avx512.c - AVX-512 (F, BW, VL, DQ) kernels. Built with those flags
 * and only called when the CPU has them. 16 lanes are one zmm register.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

typedef __m512 vec16;

static inline vec16 v_zero(void) {
    return _mm512_setzero_ps();
}
static inline vec16 v_load_f32(const float *p) {
    return _mm512_loadu_ps(p);
}
static inline vec16 v_load_f16(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
static inline vec16 v_load_bf16(const uint16_t *p) {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}
static inline vec16 v_fma(vec16 acc, vec16 a, vec16 b) {
    return _mm512_fmadd_ps(a, b, acc);
}
static inline float v_hsum(vec16 a) {
    __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 0x55));
    return _mm_cvtss_f32(s1);
}

/* batches: 6 weight rows x 4 input rows (24 accumulators + 6 weights + 1 input = 31 zmm): on Zen 5,
   `qgemm_bench bf16 2048 K 64`, G multiply-adds a second at K 896 / 2,048 / 8,192: 85 / 80 / 60
   with 4 x 4, 94 / 89 / 72 with this (bench/RESULTS.md); one row (decode): 8 weight rows a tile
   (8 accumulators + 8 weights + 1 input), each asking for the next 8 rows at its k: 0.5B bf16 decode
   on one Zen 5 thread 20 -> 22-24 tokens/s against 4 rows (bench/RESULTS.md); its 8 rows taken
   nn / 8 apart (SPREAD_W1, kern_template.h's gemm_rows_spread, as on AVX2): 0.5B bf16 decode on one
   thread of the 16-core Xeon 13.6 / 16.5 -> 17.6 / 17.3 tokens/s (2026-12-06, bench/RESULTS.md) */
#define TILE_W 6
#define TILE_W1 8
#define SPREAD_W1 1
#define TILE_X 4
#define KPREFIX avx512_
#include "kern_template.h"

static void avx512_axpy(float *y, float a, const float *x, int n) {
    __m512 va = _mm512_set1_ps(a);
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    for (; i < n; i++) y[i] = __builtin_fmaf(a, x[i], y[i]);
}

#include "kern_qavx512.h"

static inline vec16 v_set1(float f) {
    return _mm512_set1_ps(f);
}
static inline vec16 v_mul(vec16 a, vec16 b) {
    return _mm512_mul_ps(a, b);
}
static inline void v_store(float *p, vec16 a) {
    _mm512_storeu_ps(p, a);
}
static inline vec16 v_load_u8(const unsigned char *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p)));
}
static inline vec16 v_max(vec16 a, vec16 b) {
    return _mm512_max_ps(a, b);
}
static inline float v_hmax(vec16 a) {
    return _mm512_reduce_max_ps(a);
}
/* The 16 nibbles of 8 bytes, low nibble first, as 16 32-bit lanes. */
static inline __m512i nib16(const unsigned char *p) {
    __m128i b = _mm_loadl_epi64((const __m128i *)(const void *)p), m = _mm_set1_epi8(0x0f);
    return _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m)));
}
static inline vec16 v_nib16(const unsigned char *p) {
    return _mm512_cvtepi32_ps(nib16(p));
}
static inline vec16 v_lut4(const unsigned char *p, const float *t) {
    return _mm512_permutexvar_ps(nib16(p), _mm512_loadu_ps(t));
}
static inline vec16 v_lut8(const unsigned char *p, const float *t) {
    return _mm512_i32gather_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p)), t, 4);
}
#define ATTN_NH 8
/* e^x, the same operations as the AVX2 version lane for lane. */
static inline vec16 v_exp(vec16 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    x = _mm512_min_ps(x, _mm512_set1_ps(88.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
    p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}
static inline void v_load_u4x2(const unsigned char *p, vec16 *lo, vec16 *hi) {
    __m128i b = _mm_loadu_si128((const __m128i *)(const void *)p), m = _mm_set1_epi8(0x0f);
    *lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b, m)));
    *hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b, 4), m)));
}
/* Stages h = 1, 2, 4, 8: y_j = x_(j^h) + s_j x_j, s_j = -1 where bit h of j
   is set; the same sums as the AVX2 version. */
static inline vec16 v_wht16(vec16 x) {
    const __m512i i1 = _mm512_setr_epi32(1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14),
                  i2 = _mm512_setr_epi32(2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13),
                  i4 = _mm512_setr_epi32(4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11),
                  i8 = _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    const __m512 s1 = _mm512_setr_ps(1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1),
                 s2 = _mm512_setr_ps(1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1),
                 s4 = _mm512_setr_ps(1, 1, 1, 1, -1, -1, -1, -1, 1, 1, 1, 1, -1, -1, -1, -1),
                 s8 = _mm512_setr_ps(1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1, -1);
    x = _mm512_fmadd_ps(s1, x, _mm512_permutexvar_ps(i1, x));
    x = _mm512_fmadd_ps(s2, x, _mm512_permutexvar_ps(i2, x));
    x = _mm512_fmadd_ps(s4, x, _mm512_permutexvar_ps(i4, x));
    return _mm512_fmadd_ps(s8, x, _mm512_permutexvar_ps(i8, x));
}
#include "kern_attn.h"
static inline vec16 v_div(vec16 a, vec16 b) {
    return _mm512_div_ps(a, b);
}
#include "kern_ew.h"

#ifndef AVX512_TABLE /* kern_avx512vnni.c and kern_amx.c build this file again */
#define AVX512_TABLE ember_cpu_kernels_avx512
#define AVX512_VARIANT "avx512"
#endif
#ifndef AVX512_ISA
#define AVX512_ISA EMBER_ISA_AVX512
#endif
#ifdef EMBER_AMX
#include "kern_qamx.h"
#include "kern_bamx.h"
#endif

const cpu_kernels AVX512_TABLE = {
    .isa = AVX512_ISA,
    .variant = AVX512_VARIANT,
    .gemm_f32 = avx512_gemm_f32,
    .gemm_f16 = avx512_gemm_f16,
    .gemm_bf16 = avx512_gemm_bf16,
    QP_TABLE,
#ifdef AMX_TABLE
    AMX_TABLE,
    BAMX_TABLE,
#endif
    .quantize_act32 = avx512_quant_act32,
    .quantize_act256 = avx512_quant_act256,
    .dot = avx512_dot,
    .axpy = avx512_axpy,
    .attn_part = avx512_attn_part,
    .silu_mul = avx512_silu_mul,
    .add = avx512_add,
    .norm_apply = avx512_norm_apply,
    .rope_rotate = avx512_rope_rotate,
    .argmax_range = avx512_argmax_range,
};
