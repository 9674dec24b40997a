/*
 * kern_qavx512.h - AVX-512 quantized kernels: the vector primitives that
 * kern_qpack.h's packed-weight gemm is written in (one 16-row group per
 * zmm), and the activation quantizers. Included by kern_avx512.c, once
 * without and once with EMBER_VNNI (vpdpbusd); only called after runtime
 * detection. The canonical arithmetic the kernels reproduce bit for bit is
 * qkern.h's.
 *
 * dot4: with VNNI one vpdpbusd (unsigned weight levels times signed
 * activations; Q8_0 stores its levels + 128, so its sums start at -128 *
 * sum(y)); without, maddubs + madd (the levels' sign moved onto the
 * activations for Q8_0, so no pair sum exceeds 2 * 128 * 127).
 * No state.
 */
#include <stddef.h>

#include "qkern.h"

typedef __m512i qv;
typedef __m512 fv;
#define QL 16

static inline qv qv_zero(void) {
    return _mm512_setzero_si512();
}
static inline qv qv_load(const void *p) {
    return _mm512_loadu_si512(p);
}
static inline qv qv_and(qv a, qv b) {
    return _mm512_and_si512(a, b);
}
static inline qv qv_add(qv a, qv b) {
    return _mm512_add_epi32(a, b);
}
static inline qv qv_sub(qv a, qv b) {
    return _mm512_sub_epi32(a, b);
}
static inline qv qv_mullo(qv a, qv b) {
    return _mm512_mullo_epi32(a, b);
}
static inline qv qv_set1(int v) {
    return _mm512_set1_epi32(v);
}
static inline qv qv_set8(int v) {
    return _mm512_set1_epi8((char)v);
}
static inline qv qv_bcast(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}
#define qv_srl16(v, n) _mm512_srli_epi16(v, (unsigned)(n))
#define qv_sll32(v, n) _mm512_slli_epi32(v, (unsigned)(n))
#define qv_srl32(v, n) _mm512_srli_epi32(v, (unsigned)(n))
static inline qv qv_or_and(qv a, qv b, qv m) {
    return _mm512_ternarylogic_epi32(a, b, m, 0xF8); /* a | (b & m) */
}
static inline qv qv_cvt_s8(const void *p) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
}
static inline qv qv_pair16(qv a, qv b) {
    return _mm512_mask_blend_epi16(0xAAAAAAAAu, a, _mm512_slli_epi32(b, 16));
}
#ifdef EMBER_VNNI
static inline qv qv_dot2(qv acc, qv a, qv b) {
    return _mm512_dpwssd_epi32(acc, a, b);
}
static inline qv qv_dot4(qv acc, qv w, qv y) {
    return _mm512_dpbusd_epi32(acc, w, y);
}
#define Q8_INIT (-128)
static inline qv qv_dot4_q8(qv acc, qv w, qv y) {
    return _mm512_dpbusd_epi32(acc, w, y);
}
#else
static inline qv qv_dot4(qv acc, qv w, qv y) {
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, y), _mm512_set1_epi16(1)));
}
static inline qv qv_dot2(qv acc, qv a, qv b) {
    return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
}
#define Q8_INIT 0
static inline qv qv_dot4_q8(qv acc, qv w, qv y) {
    qv s = _mm512_xor_si512(w, _mm512_set1_epi8((char)0x80)); /* the signed level */
    qv ys = _mm512_mask_sub_epi8(y, _mm512_movepi8_mask(s), _mm512_setzero_si512(), y);
    return qv_dot4(acc, _mm512_abs_epi8(s), ys);
}
#define QP_MAD16 1
static inline qv qv_mad16(qv w, qv y) {
    return _mm512_maddubs_epi16(w, y);
}
static inline qv qv_add16(qv a, qv b) {
    return _mm512_add_epi16(a, b);
}
static inline qv qv_wide16(qv acc, qv v) {
    return _mm512_add_epi32(acc, _mm512_madd_epi16(v, _mm512_set1_epi16(1)));
}
#endif

static inline fv fv_zero(void) {
    return _mm512_setzero_ps();
}
static inline fv fv_load_h(const void *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
static inline fv fv_bcast(const void *p) {
    float v;
    memcpy(&v, p, 4);
    return _mm512_set1_ps(v);
}
static inline fv fv_mul(fv a, fv b) {
    return _mm512_mul_ps(a, b);
}
static inline fv fv_fma(fv a, fv b, fv c) {
    return _mm512_fmadd_ps(a, b, c);
}
static inline fv fv_fnma(fv a, fv b, fv c) {
    return _mm512_fnmadd_ps(a, b, c);
}
static inline fv fv_cvt(qv v) {
    return _mm512_cvtepi32_ps(v);
}
static inline void fv_store(float *p, fv v) {
    _mm512_storeu_ps(p, v);
}

#define QP_NX 8
#include "kern_qpack.h"

/* ---- activation quantizers (kern_qact.h) ----------------------------------- */

/* max |x| over n floats (n a multiple of 16); NaN elements are skipped as fmaxf does. */
static inline float qa_absmax(const float *x, int n) {
    __m512 a = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) a = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + i)), a);
    return _mm512_reduce_max_ps(a);
}

/* The levels round(x * id) of 16 floats, clamped to [-127, 127] (NaN ->
   -127), stored as bytes at q; returns their sum. */
static inline int qa_16(const float *x, float id, int8_t *q) {
    __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x), _mm512_set1_ps(id));
    v = _mm512_max_ps(v, _mm512_set1_ps(-127.0f)); /* NaN -> -127 */
    v = _mm512_min_ps(v, _mm512_set1_ps(127.0f));
    __m512i l = _mm512_cvtps_epi32(v); /* round to nearest even */
    _mm_storeu_si128((__m128i *)(void *)q, _mm512_cvtepi32_epi8(l));
    return _mm512_reduce_add_epi32(l);
}

#include "kern_qact.h"
