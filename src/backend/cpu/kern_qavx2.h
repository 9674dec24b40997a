/*
 * kern_qavx2.h - AVX2 quantized kernels: the vector primitives that
 * kern_qpack.h's packed-weight gemm is written in (a 16-row group as two
 * halves of 8 rows, one per ymm; activation rows in register tiles of 4
 * for Q8_0 / Q4_0 and the K types, 8 for Q5_0), and the activation
 * quantizers. Included by kern_avx2.c (built with -mavx2 -mfma -mf16c) and
 * only called after runtime detection. Bit-identical to qkern.h's
 * canonical arithmetic.
 *
 * dot4 is maddubs + madd: unsigned weight levels (<= 63) times signed
 * activations, or for Q8_0 |level| times the activation with the level's
 * sign (vpsignb), so no byte-pair sum exceeds 2 * 128 * 127 < 2^15.
 * Built again with EMBER_VNNI (kern_avx2vnni.c, -mavxvnni): dot4 is one
 * AVX-VNNI vpdpbusd, and Q8_0 takes the stored bytes (level + 128) with the
 * start value -128 * sum(y), as the AVX-512 VNNI kernels do.
 * No state.
 */
#include <stddef.h>

#include "qkern.h"

typedef __m256i qv;
typedef __m256 fv;
#define QL 8

static inline qv qv_zero(void) {
    return _mm256_setzero_si256();
}
static inline qv qv_load(const void *p) {
    return _mm256_loadu_si256((const __m256i *)p);
}
static inline qv qv_and(qv a, qv b) {
    return _mm256_and_si256(a, b);
}
static inline qv qv_add(qv a, qv b) {
    return _mm256_add_epi32(a, b);
}
static inline qv qv_sub(qv a, qv b) {
    return _mm256_sub_epi32(a, b);
}
static inline qv qv_mullo(qv a, qv b) {
    return _mm256_mullo_epi32(a, b);
}
static inline qv qv_set1(int v) {
    return _mm256_set1_epi32(v);
}
static inline qv qv_set8(int v) {
    return _mm256_set1_epi8((char)v);
}
static inline qv qv_bcast(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}
#define qv_srl16(v, n) _mm256_srli_epi16(v, (int)(n))
#define qv_sll32(v, n) _mm256_slli_epi32(v, (int)(n))
#define qv_srl32(v, n) _mm256_srli_epi32(v, (int)(n))
static inline qv qv_or_and(qv a, qv b, qv m) {
    return _mm256_or_si256(a, _mm256_and_si256(b, m));
}
static inline qv qv_cvt_s8(const void *p) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
}
static inline qv qv_pair16(qv a, qv b) {
    return _mm256_blend_epi16(a, _mm256_slli_epi32(b, 16), 0xAA);
}
#ifdef EMBER_VNNI
static inline qv qv_dot2(qv acc, qv a, qv b) {
    return _mm256_dpwssd_avx_epi32(acc, a, b);
}
static inline qv qv_dot4(qv acc, qv w, qv y) {
    return _mm256_dpbusd_avx_epi32(acc, w, y);
}
#define Q8_INIT (-128)
static inline qv qv_dot4_q8(qv acc, qv w, qv y) {
    return _mm256_dpbusd_avx_epi32(acc, w, y);
}
#else
static inline qv qv_dot4(qv acc, qv w, qv y) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, y), _mm256_set1_epi16(1)));
}
static inline qv qv_dot2(qv acc, qv a, qv b) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
}
#define Q8_INIT 0
static inline qv qv_dot4_q8(qv acc, qv w, qv y) {
    qv s = _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80)); /* the signed level */
    return qv_dot4(acc, _mm256_sign_epi8(s, s), _mm256_sign_epi8(y, s));
}
#define QP_MAD16 1
static inline qv qv_mad16(qv w, qv y) {
    return _mm256_maddubs_epi16(w, y);
}
static inline qv qv_add16(qv a, qv b) {
    return _mm256_add_epi16(a, b);
}
static inline qv qv_wide16(qv acc, qv v) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(v, _mm256_set1_epi16(1)));
}
#endif

static inline fv fv_zero(void) {
    return _mm256_setzero_ps();
}
static inline fv fv_load_h(const void *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
static inline fv fv_bcast(const void *p) {
    float v;
    memcpy(&v, p, 4);
    return _mm256_set1_ps(v);
}
static inline fv fv_mul(fv a, fv b) {
    return _mm256_mul_ps(a, b);
}
static inline fv fv_fma(fv a, fv b, fv c) {
    return _mm256_fmadd_ps(a, b, c);
}
static inline fv fv_fnma(fv a, fv b, fv c) {
    return _mm256_fnmadd_ps(a, b, c);
}
static inline fv fv_cvt(qv v) {
    return _mm256_cvtepi32_ps(v);
}
static inline void fv_store(float *p, fv v) {
    _mm256_storeu_ps(p, v);
}

#define QP_NX 4
#define QP_NX32 8 /* 32-element types: see kern_qpack.h */
#include "kern_qpack.h"

/* ---- activation quantizers (kern_qact.h) ----------------------------------- */

static inline float qa_hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 0x55));
    return _mm_cvtss_f32(m);
}

/* max |x| over n floats (n a multiple of 8); NaN elements are skipped as fmaxf does. */
static inline float qa_absmax(const float *x, int n) {
    const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 a = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) a = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), abs), a);
    return qa_hmax8(a);
}

/* 8 levels round(x * id) clamped to [-127, 127] (NaN -> -127), as int32. */
static inline __m256i qa_levels(const float *x, __m256 id) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x), id);
    v = _mm256_max_ps(v, _mm256_set1_ps(-127.0f)); /* NaN -> -127 */
    v = _mm256_min_ps(v, _mm256_set1_ps(127.0f));
    return _mm256_cvtps_epi32(v); /* round to nearest even */
}

static inline int qa_hsum8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* The levels of 16 floats as bytes at q; returns their sum. */
static inline int qa_16(const float *x, float id, int8_t *q) {
    const __m256 idv = _mm256_set1_ps(id);
    __m256i a = qa_levels(x, idv), b = qa_levels(x + 8, idv);
    __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xd8); /* 16 x i16 in order */
    __m128i bytes = _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    _mm_storeu_si128((__m128i *)(void *)q, bytes);
    return qa_hsum8(_mm256_add_epi32(a, b));
}

#include "kern_qact.h"
