/*
 * kern_avx2.c - AVX2 + FMA + F16C kernels. Built with -mavx2 -mfma -mf16c
 * and only called when the CPU has them. 16 lanes are two ymm registers.
 * kern_avx2vnni.c builds it again with AVX-VNNI for the quantized dot
 * products (ember_cpu_kernels_avx2vnni); everything else is the same code.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

typedef struct vec16 {
    __m256 lo, hi;
} vec16;

static inline vec16 v_zero(void) {
    return (vec16){_mm256_setzero_ps(), _mm256_setzero_ps()};
}
static inline vec16 v_load_f32(const float *p) {
    return (vec16){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
}
static inline __m256 f16x8(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
static inline vec16 v_load_f16(const uint16_t *p) {
    return (vec16){f16x8(p), f16x8(p + 8)};
}
static inline __m256 bf16x8(const uint16_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
static inline vec16 v_load_bf16(const uint16_t *p) {
    return (vec16){bf16x8(p), bf16x8(p + 8)};
}
static inline vec16 v_fma(vec16 acc, vec16 a, vec16 b) {
    return (vec16){_mm256_fmadd_ps(a.lo, b.lo, acc.lo), _mm256_fmadd_ps(a.hi, b.hi, acc.hi)};
}
static inline float hsum8(__m256 s8) {
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));        /* [0]+[2], [1]+[3] */
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 0x55)); /* + [1] */
    return _mm_cvtss_f32(s1);
}
static inline float v_hsum(vec16 a) {
    return hsum8(_mm256_add_ps(a.lo, a.hi));
}

/* The batch tile's half-register step (kern_template.h): vh_x puts the input half in a register
   (the empty asm keeps gcc from folding its load into each multiply-add that uses it, which it
   does even with registers free: 16 loads a step instead of 10). On Zen 5 the tile's loop with
   everything in L1 ran at 35 G multiply-adds a second with the 16 loads and 46 with the 10
   (peak 52; bench/RESULTS.md). */
#define V_HALVES 1
typedef __m256 vhalf;
#define vh_load_f32 _mm256_loadu_ps
#define vh_load_f16 f16x8
#define vh_load_bf16 bf16x8
static inline vhalf vh_x(const float *p) {
    vhalf v = _mm256_loadu_ps(p);
    __asm__("" : "+x"(v));
    return v;
}
static inline vhalf vh_fma(vhalf acc, vhalf a, vhalf b) {
    return _mm256_fmadd_ps(a, b, acc);
}

/* 2 weight rows x 3 input rows of two-register vectors: 12 accumulators, and half by half the
   weights' 2 and the input's 1 (15 ymm). 2 x 2 was load-bound: bf16 1B pp512 at one thread 33.3
   -> 37.2 tok/s (Zen 5, --isa avx2, bench/RESULTS.md). One input row (decode) takes 4 weight
   rows a tile (8 accumulators): streaming a bf16 151,936 x 896 weight at one thread 9.7 -> 13.9
   G multiply-adds a second, f16 10.3 -> 12.0, f32 4.7 -> 5.7 (8 rows a tile spilled: slower);
   6 rows (12 accumulators, each row's weights loaded as its multiply-adds need them): bf16 0.5B
   decode at one thread 22.4 / 21.2 / 22.2 -> 25.3 / 24.2 / 23.0 tokens/s (Zen 5 VM, --isa avx2
   without VNNI, `ember bench -p 0 -n 64 -t 1`, 2026-12-05, bench/RESULTS.md). The 6 rows are taken
   nn / 6 apart (SPREAD_W1, kern_template.h's gemm_rows_spread): six long streams instead of six one row
   long; the 0.5B's 1,792-byte rows streamed at 10-12 -> 21-23 GB/s, its bf16 decode 12.6 -> 19.9
   tokens/s at one thread (Zen 3, 2026-12-06, bench/RESULTS.md). */
#define TILE_W 2
#define TILE_X 3
#define TILE_W1 6
#define SPREAD_W1 1
/* 2-8 input rows (batched decode) take the 2 x 3 tile with its 2 rows nn / 2 apart the same way:
   bf16 4,864 x 896 at M = 2 / 3 / 4 10.9 -> 18, 15.6 -> 25, 19.8 -> 25.5 G multiply-adds a second
   from memory; level at M = 8 and at K = 2,048 / 8,192 (Zen 3, 2026-12-06, bench/RESULTS.md). */
#define SPREAD_MMAX 8
#define KPREFIX avx2_
#include "kern_template.h"

static void avx2_axpy(float *y, float a, const float *x, int n) {
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] = __builtin_fmaf(a, x[i], y[i]);
}

#include "kern_qavx2.h"

static inline vec16 v_set1(float f) {
    return (vec16){_mm256_set1_ps(f), _mm256_set1_ps(f)};
}
static inline vec16 v_mul(vec16 a, vec16 b) {
    return (vec16){_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)};
}
static inline void v_store(float *p, vec16 a) {
    _mm256_storeu_ps(p, a.lo);
    _mm256_storeu_ps(p + 8, a.hi);
}
static inline vec16 v_load_u8(const unsigned char *p) {
    __m128i b = _mm_loadu_si128((const __m128i *)(const void *)p);
    return (vec16){_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)),
                   _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)))};
}
static inline vec16 v_max(vec16 a, vec16 b) {
    return (vec16){_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)};
}
static inline float v_hmax(vec16 a) {
    __m256 m8 = _mm256_max_ps(a.lo, a.hi);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 0x55));
    return _mm_cvtss_f32(m4);
}
/* The 16 nibbles of 8 bytes, low nibble first, as 16 bytes. */
static inline __m128i nib16(const unsigned char *p) {
    __m128i b = _mm_loadl_epi64((const __m128i *)(const void *)p), m = _mm_set1_epi8(0x0f);
    return _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
}
static inline vec16 v_nib16(const unsigned char *p) {
    __m128i n = nib16(p);
    return (vec16){_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(n)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(n, 8)))};
}
/* t[idx] for 8 indices 0..15: two 8-entry permutes, then a blend on bit 3. */
static inline __m256 lut16x8(__m256i idx, __m256 t0, __m256 t1) {
    __m256 a = _mm256_permutevar8x32_ps(t0, idx), b = _mm256_permutevar8x32_ps(t1, idx);
    __m256 hi = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)); /* bit 3 to the sign */
    return _mm256_blendv_ps(a, b, hi);
}
static inline vec16 v_lut4(const unsigned char *p, const float *t) {
    __m128i n = nib16(p);
    __m256 t0 = _mm256_loadu_ps(t), t1 = _mm256_loadu_ps(t + 8);
    return (vec16){lut16x8(_mm256_cvtepu8_epi32(n), t0, t1), lut16x8(_mm256_cvtepu8_epi32(_mm_srli_si128(n, 8)), t0, t1)};
}
static inline vec16 v_lut8(const unsigned char *p, const float *t) {
    __m128i b = _mm_loadu_si128((const __m128i *)(const void *)p);
    return (vec16){_mm256_i32gather_ps(t, _mm256_cvtepu8_epi32(b), 4),
                   _mm256_i32gather_ps(t, _mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)), 4)};
}
#define ATTN_NH 4 /* 16 lanes are two registers: 4 heads' scores fill 8 */
/* e^x, the same operations as the AVX-512 version lane for lane. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    x = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
    p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
static inline vec16 v_exp(vec16 a) {
    return (vec16){exp8(a.lo), exp8(a.hi)};
}
static inline void v_load_u4x2(const unsigned char *p, vec16 *lo, vec16 *hi) {
    __m128i b = _mm_loadu_si128((const __m128i *)(const void *)p), m = _mm_set1_epi8(0x0f);
    __m128i l = _mm_and_si128(b, m), h = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    *lo = (vec16){_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(l)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(l, 8)))};
    *hi = (vec16){_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(h)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(h, 8)))};
}
/* Stages h = 1, 2, 4 in each half (y_j = x_(j^h) + s_j x_j), then h = 8
   across the halves; the same sums as the AVX-512 version. */
static inline __m256 wht8_stage(__m256 x, __m256i idx, __m256 sign) {
    return _mm256_fmadd_ps(sign, x, _mm256_permutevar8x32_ps(x, idx));
}
static inline vec16 v_wht16(vec16 x) {
    const __m256i i1 = _mm256_setr_epi32(1, 0, 3, 2, 5, 4, 7, 6), i2 = _mm256_setr_epi32(2, 3, 0, 1, 6, 7, 4, 5),
                  i4 = _mm256_setr_epi32(4, 5, 6, 7, 0, 1, 2, 3);
    const __m256 s1 = _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1), s2 = _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1),
                 s4 = _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1);
    __m256 lo = wht8_stage(wht8_stage(wht8_stage(x.lo, i1, s1), i2, s2), i4, s4);
    __m256 hi = wht8_stage(wht8_stage(wht8_stage(x.hi, i1, s1), i2, s2), i4, s4);
    return (vec16){_mm256_fmadd_ps(_mm256_set1_ps(1.0f), lo, hi), _mm256_fmadd_ps(_mm256_set1_ps(-1.0f), hi, lo)};
}
#include "kern_attn.h"
static inline vec16 v_div(vec16 a, vec16 b) {
    return (vec16){_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)};
}
#include "kern_ew.h"

#ifndef AVX2_TABLE
#define AVX2_TABLE ember_cpu_kernels_avx2
#define AVX2_VARIANT "avx2"
#endif
const cpu_kernels AVX2_TABLE = {
    .isa = EMBER_ISA_AVX2,
    .variant = AVX2_VARIANT,
    .gemm_f32 = avx2_gemm_f32,
    .gemm_f16 = avx2_gemm_f16,
    .gemm_bf16 = avx2_gemm_bf16,
    QP_TABLE,
    .quantize_act32 = avx2_quant_act32,
    .quantize_act256 = avx2_quant_act256,
    .dot = avx2_dot,
    .axpy = avx2_axpy,
    .attn_part = avx2_attn_part,
    .silu_mul = avx2_silu_mul,
    .add = avx2_add,
    .norm_apply = avx2_norm_apply,
    .rope_rotate = avx2_rope_rotate,
    .argmax_range = avx2_argmax_range,
};
