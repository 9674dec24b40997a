/*
 * quant.c - reference (de)quantization of the GGUF block formats; see
 * quant.h for the layouts and the exactness promises.
 *
 * Every block is memcpy'd into (or out of) its struct, so source and
 * destination may have any alignment. The host is little-endian (x86-64),
 * which is also the byte order of the file formats.
 *
 * Decoders are written per element: for element e of a block they say which
 * byte and which bits hold its quant and which scale it uses, so each one
 * can be checked against the format description line by line.
 */
#include "quant.h"

#include <float.h>
#include <math.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "quant.c assumes a little-endian host"
#endif

_Static_assert(sizeof(ember_block_q4_0) == 18, "q4_0 layout");
_Static_assert(sizeof(ember_block_q4_1) == 20, "q4_1 layout");
_Static_assert(sizeof(ember_block_q5_0) == 22, "q5_0 layout");
_Static_assert(sizeof(ember_block_q5_1) == 24, "q5_1 layout");
_Static_assert(sizeof(ember_block_q8_0) == 34, "q8_0 layout");
_Static_assert(sizeof(ember_block_q8_1) == 36, "q8_1 layout");
_Static_assert(sizeof(ember_block_q2_k) == 84, "q2_k layout");
_Static_assert(sizeof(ember_block_q3_k) == 110, "q3_k layout");
_Static_assert(sizeof(ember_block_q4_k) == 144, "q4_k layout");
_Static_assert(sizeof(ember_block_q5_k) == 176, "q5_k layout");
_Static_assert(sizeof(ember_block_q6_k) == 210, "q6_k layout");
_Static_assert(sizeof(ember_block_q8_k) == 292, "q8_k layout");

static inline float h2f(uint16_t h) {
    return ember_f16_to_f32(h);
}
static inline uint16_t f2h(float f) {
    return ember_f32_to_f16(f);
}

/* Conversions from float to a bounded integer without undefined behaviour:
   values below lo give lo, above hi give hi, NaN gives lo. Inside the
   range they are exactly C's truncation, roundf and nearbyintf. */
static inline int trunc_clamp(float v, int lo, int hi) {
    if (!(v > (float)lo)) return lo;
    if (v >= (float)hi) return hi;
    return (int)v;
}
static inline int round_clamp(float v, int lo, int hi) { /* ties away from zero */
    if (!(v > (float)lo)) return lo;
    if (v >= (float)hi) return hi;
    return (int)roundf(v);
}
static inline int rint_clamp(float v, int lo, int hi) { /* ties to even */
    if (!(v > (float)lo)) return lo;
    if (v >= (float)hi) return hi;
    return (int)nearbyintf(v);
}

/* ==== 32-element formats ================================================= */

/* Q4_0: element j < 16 is the low nibble of qs[j], element j + 16 its high
   nibble; x = (q - 8) * d. */
void ember_dequant_q4_0(const void *src, float *dst, size_t nblocks) {
    const unsigned char *p = src;
    for (size_t b = 0; b < nblocks; b++, p += sizeof(ember_block_q4_0), dst += 32) {
        ember_block_q4_0 blk;
        memcpy(&blk, p, sizeof blk);
        float d = h2f(blk.d);
        for (int e = 0; e < 32; e++) {
            int q = e < 16 ? (blk.qs[e] & 15) : (blk.qs[e - 16] >> 4);
            dst[e] = (float)(q - 8) * d;
        }
    }
}

/* Q4_1: nibbles as Q4_0; x = q * d + m. */
void ember_dequant_q4_1(const void *src, float *dst, size_t nblocks) {
    const unsigned char *p = src;
    for (size_t b = 0; b < nblocks; b++, p += sizeof(ember_block_q4_1), dst += 32) {
        ember_block_q4_1 blk;
        memcpy(&blk, p, sizeof blk);
        float d = h2f(blk.d), m = h2f(blk.m);
        for (int e = 0; e < 32; e++) {
            int q = e < 16 ? (blk.qs[e] & 15) : (blk.qs[e - 16] >> 4);
            dst[e] = (float)q * d + m;
        }
    }
}

/* The fifth bit of element e of a Q5 block: bit e of qh read as a
   little-endian u32. */
static inline int q5_high(const uint8_t qh[4], int e) {
    return (qh[e / 8] >> (e % 8)) & 1;
}

/* Q5_0: low four bits as Q4_0, fifth bit from qh; x = (q - 16) * d. */
void ember_dequant_q5_0(const void *src, float *dst, size_t nblocks) {
    const unsigned char *p = src;
    for (size_t b = 0; b < nblocks; b++, p += sizeof(ember_block_q5_0), dst += 32) {
        ember_block_q5_0 blk;
        memcpy(&blk, p, sizeof blk);
        float d = h2f(blk.d);
        for (int e = 0; e < 32; e++) {
            int q = e < 16 ? (blk.qs[e] & 15) : (blk.qs[e - 16] >> 4);
            q |= q5_high(blk.qh, e) << 4;
            dst[e] = (float)(q - 16) * d;
        }
    }
}

/* Q5_1: bits as Q5_0; x = q * d + m. */
void ember_dequant_q5_1(const void *src, float *dst, size_t nblocks) {
    const unsigned char *p = src;
    for (size_t b = 0; b < nblocks; b++, p += sizeof(ember_block_q5_1), dst += 32) {
        ember_block_q5_1 blk;
        memcpy(&blk, p, sizeof blk);
        float d = h2f(blk.d), m = h2f(blk.m);
        for (int e = 0; e < 32; e++) {
            int q = e < 16 ? (blk.qs[e] & 15) : (blk.qs[e - 16] >> 4);
            q |= q5_high(blk.qh, e) << 4;
            dst[e] = (float)q * d + m;
        }
    }
}

/* Q8_0: x = qs[e] * d. */
void ember_dequant_q8_0(const void *src, float *dst, size_t nblocks) {
    const unsigned char *p = src;
    for (size_t b = 0; b < nblocks; b++, p += sizeof(ember_block_q8_0), dst += 32) {
        ember_block_q8_0 blk;
        memcpy(&blk, p, sizeof blk);
        float d = h2f(blk.d);
        for (int e = 0; e < 32; e++) dst[e] = (float)blk.qs[e] * d;
    }
}

/* Q8_1: x = qs[e] * d (s is a precomputed sum for dot products). */
void ember_dequant_q8_1(const void *src, float *dst, size_t nblocks) {
    const unsigned char *p = src;
    for (size_t b = 0; b < nblocks; b++, p += sizeof(ember_block_q8_1), dst += 32) {
        ember_block_q8_1 blk;
        memcpy(&blk, p, sizeof blk);
        float d = h2f(blk.d);
        for (int e = 0; e < 32; e++) dst[e] = (float)blk.qs[e] * d;
    }
}

/* The element with the largest magnitude (the first one on ties), signed;
   0 when all are zero. */
static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    }
    return max;
}

/* Q4_0 canonical rule: d = m / -8 where m is the element of largest
   magnitude (so m encodes as level 0), q = min(15, trunc(x / d + 8.5)). */
void ember_quant_q4_0(const float *src, void *dst, size_t nblocks) {
    unsigned char *p = dst;
    for (size_t b = 0; b < nblocks; b++, p += sizeof(ember_block_q4_0), src += 32) {
        ember_block_q4_0 blk;
        float d = signed_absmax(src, 32) / -8.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        blk.d = f2h(d);
        for (int j = 0; j < 16; j++) {
            int lo = trunc_clamp(src[j] * id + 8.5f, 0, 15);
            int hi = trunc_clamp(src[j + 16] * id + 8.5f, 0, 15);
            blk.qs[j] = (uint8_t)(lo | (hi << 4));
        }
        memcpy(p, &blk, sizeof blk);
    }
}

/* min and max of x[0..n) (NaN elements are skipped). */
static void min_max(const float *x, int n, float *mn, float *mx) {
    float lo = FLT_MAX, hi = -FLT_MAX;
    for (int i = 0; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
    }
    *mn = lo;
    *mx = hi;
}

/* Q4_1 canonical rule: m = min, d = (max - min) / 15,
   q = min(15, trunc((x - min) / d + 0.5)) (with the unrounded f32 min and d). */
void ember_quant_q4_1(const float *src, void *dst, size_t nblocks) {
    unsigned char *p = dst;
    for (size_t b = 0; b < nblocks; b++, p += sizeof(ember_block_q4_1), src += 32) {
        ember_block_q4_1 blk;
        float mn, mx;
        min_max(src, 32, &mn, &mx);
        float d = (mx - mn) / 15.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        blk.d = f2h(d);
        blk.m = f2h(mn);
        for (int j = 0; j < 16; j++) {
            int lo = trunc_clamp((src[j] - mn) * id + 0.5f, 0, 15);
            int hi = trunc_clamp((src[j + 16] - mn) * id + 0.5f, 0, 15);
            blk.qs[j] = (uint8_t)(lo | (hi << 4));
        }
        memcpy(p, &blk, sizeof blk);
    }
}

/* Stores the 5-bit quants q[0..32) of a Q5 block into qs / qh. */
static void q5_pack(const int q[32], uint8_t qs[16], uint8_t qh[4]) {
    memset(qh, 0, 4);
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)((q[j] & 15) | ((q[j + 16] & 15) << 4));
    for (int e = 0; e < 32; e++) qh[e / 8] |= (uint8_t)(((q[e] >> 4) & 1) << (e % 8));
}

/* Q5_0 canonical rule: d = m / -16 (m the element of largest magnitude),
   q = min(31, trunc(x / d + 16.5)). */
void ember_quant_q5_0(const float *src, void *dst, size_t nblocks) {
    unsigned char *p = dst;
    for (size_t b = 0; b < nblocks; b++, p += sizeof(ember_block_q5_0), src += 32) {
        ember_block_q5_0 blk;
        float d = signed_absmax(src, 32) / -16.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        blk.d = f2h(d);
        int q[32];
        for (int e = 0; e < 32; e++) q[e] = trunc_clamp(src[e] * id + 16.5f, 0, 31);
        q5_pack(q, blk.qs, blk.qh);
        memcpy(p, &blk, sizeof blk);
    }
}

/* Q5_1 canonical rule: m = min, d = (max - min) / 31,
   q = trunc((x - min) / d + 0.5) (at most 31). */
void ember_quant_q5_1(const float *src, void *dst, size_t nblocks) {
    unsigned char *p = dst;
    for (size_t b = 0; b < nblocks; b++, p += sizeof(ember_block_q5_1), src += 32) {
        ember_block_q5_1 blk;
        float mn, mx;
        min_max(src, 32, &mn, &mx);
        float d = (mx - mn) / 31.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        blk.d = f2h(d);
        blk.m = f2h(mn);
        int q[32];
        for (int e = 0; e < 32; e++) q[e] = trunc_clamp((src[e] - mn) * id + 0.5f, 0, 31);
        q5_pack(q, blk.qs, blk.qh);
        memcpy(p, &blk, sizeof blk);
    }
}

/* Q8_0 / Q8_1 canonical rule: d = max|x| / 127, q = round(x / d) with ties
   away from zero. Returns d; fills q. */
static float q8_block(const float *x, int8_t q[32]) {
    float amax = 0.0f;
    for (int e = 0; e < 32; e++)
        if (fabsf(x[e]) > amax) amax = fabsf(x[e]);
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int e = 0; e < 32; e++) q[e] = (int8_t)round_clamp(x[e] * id, -128, 127);
    return d;
}

void ember_quant_q8_0(const float *src, void *dst, size_t nblocks) {
    unsigned char *p = dst;
    for (size_t b = 0; b < nblocks; b++, p += sizeof(ember_block_q8_0), src += 32) {
        ember_block_q8_0 blk;
        blk.d = f2h(q8_block(src, blk.qs));
        memcpy(p, &blk, sizeof blk);
    }
}

/* Q8_1: as Q8_0, plus s = f16(sum(q) * d) with the unrounded f32 d. */
void ember_quant_q8_1(const float *src, void *dst, size_t nblocks) {
    unsigned char *p = dst;
    for (size_t b = 0; b < nblocks; b++, p += sizeof(ember_block_q8_1), src += 32) {
        ember_block_q8_1 blk;
        float d = q8_block(src, blk.qs);
        int sum = 0;
        for (int e = 0; e < 32; e++) sum += blk.qs[e];
        blk.d = f2h(d);
        blk.s = f2h((float)sum * d);
        memcpy(p, &blk, sizeof blk);
    }
}

/* ==== 256-element K formats ============================================== */

/* Q2_K / Q3_K share the arrangement of their 2-bit quants: a block is two
   halves of 128; in half n, element r (0..127) takes bits 2*(r/32) .. +1
   of qs[32n + r % 32]. Sub-block (scale) index is e / 16. */
static inline int k2_bits(const uint8_t qs[64], int e) {
    int n = e / 128, r = e % 128;
    return (qs[32 * n + r % 32] >> (2 * (r / 32))) & 3;
}

/* Q2_K: scales[e/16] holds the scale (low nibble) and min (high nibble);
   x = (d * scale) * q - (dmin * min). */
void ember_dequant_q2_k(const void *src, float *dst, size_t nblocks) {
    const unsigned char *p = src;
    for (size_t b = 0; b < nblocks; b++, p += sizeof(ember_block_q2_k), dst += 256) {
        ember_block_q2_k blk;
        memcpy(&blk, p, sizeof blk);
        float d = h2f(blk.d), dmin = h2f(blk.dmin);
        for (int e = 0; e < 256; e++) {
            int sc = blk.scales[e / 16];
            float dl = d * (float)(sc & 15), ml = dmin * (float)(sc >> 4);
            dst[e] = dl * (float)k2_bits(blk.qs, e) - ml;
        }
    }
}

/* Q3_K scale j (0..15), a 6-bit value stored in 12 bytes: its low four
   bits are the low nibble of scales[j] (j < 8) or the high nibble of
   scales[j - 8] (j >= 8); its high two bits are bits 2*(j/4) .. +1 of
   scales[8 + j % 4]. The decoded scale is that value minus 32. */
static inline int q3k_scale(const uint8_t s[12], int j) {
    int lo = j < 8 ? (s[j] & 15) : (s[j - 8] >> 4);
    int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

/* Q3_K: 2-bit part as Q2_K; element e of half n, r = e % 128, has its
   third bit at bit (4n + r/32) of hmask[r % 32]; a clear bit subtracts 4.
   x = (d * scale) * (q - (bit ? 0 : 4)). */
void ember_dequant_q3_k(const void *src, float *dst, size_t nblocks) {
    const unsigned char *p = src;
    for (size_t b = 0; b < nblocks; b++, p += sizeof(ember_block_q3_k), dst += 256) {
        ember_block_q3_k blk;
        memcpy(&blk, p, sizeof blk);
        float d = h2f(blk.d);
        for (int e = 0; e < 256; e++) {
            int n = e / 128, r = e % 128;
            int bit = (blk.hmask[r % 32] >> (4 * n + r / 32)) & 1;
            int q = k2_bits(blk.qs, e) - (bit ? 0 : 4);
            float dl = d * (float)q3k_scale(blk.scales, e / 16);
            dst[e] = dl * (float)q;
        }
    }
}

/* Q4_K / Q5_K scale and min of sub-block j (0..7), 6 bits each in 12
   bytes: for j < 4 the low six bits of s[j] (scale) and s[j + 4] (min);
   for j >= 4 the low / high nibble of s[j + 4] (scale / min) with the top
   two bits of s[j - 4] (scale) and s[j] (min) as bits 4..5. */
static inline void k4_scale_min(const uint8_t s[12], int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}
void ember_q4k_pack_scales(uint8_t s[12], const uint8_t sc[8], const uint8_t mn[8]) {
    memset(s, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            s[j] |= (uint8_t)(sc[j] & 63);
            s[j + 4] |= (uint8_t)(mn[j] & 63);
        } else {
            s[j + 4] = (uint8_t)((sc[j] & 15) | ((mn[j] & 15) << 4));
            s[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
            s[j] |= (uint8_t)((mn[j] >> 4) << 6);
        }
    }
}

/* Q4_K / Q5_K low four bits: the block is four chunks of 64; element e of
   sub-block j = e / 32 is the low (j even) or high (j odd) nibble of
   qs[32 * (j / 2) + e % 32]. */
static inline int k4_nibble(const uint8_t qs[128], int e) {
    int j = e / 32;
    uint8_t byte = qs[32 * (j / 2) + e % 32];
    return (j & 1) ? byte >> 4 : byte & 15;
}

/* Q4_K: x = (d * scale_j) * q - (dmin * min_j), j = e / 32. */
void ember_dequant_q4_k(const void *src, float *dst, size_t nblocks) {
    const unsigned char *p = src;
    for (size_t b = 0; b < nblocks; b++, p += sizeof(ember_block_q4_k), dst += 256) {
        ember_block_q4_k blk;
        memcpy(&blk, p, sizeof blk);
        float d = h2f(blk.d), dmin = h2f(blk.dmin);
        for (int e = 0; e < 256; e++) {
            int sc, mn;
            k4_scale_min(blk.scales, e / 32, &sc, &mn);
            float d1 = d * (float)sc, m1 = dmin * (float)mn;
            dst[e] = d1 * (float)k4_nibble(blk.qs, e) - m1;
        }
    }
}

/* Q5_K: as Q4_K with a fifth bit: bit j (= e / 32) of qh[e % 32]. */
void ember_dequant_q5_k(const void *src, float *dst, size_t nblocks) {
    const unsigned char *p = src;
    for (size_t b = 0; b < nblocks; b++, p += sizeof(ember_block_q5_k), dst += 256) {
        ember_block_q5_k blk;
        memcpy(&blk, p, sizeof blk);
        float d = h2f(blk.d), dmin = h2f(blk.dmin);
        for (int e = 0; e < 256; e++) {
            int sc, mn;
            k4_scale_min(blk.scales, e / 32, &sc, &mn);
            float d1 = d * (float)sc, m1 = dmin * (float)mn;
            int q = k4_nibble(blk.qs, e) + (((blk.qh[e % 32] >> (e / 32)) & 1) ? 16 : 0);
            dst[e] = d1 * (float)q - m1;
        }
    }
}

/* Q6_K: two halves of 128; in half n, element r (0..127) with k = r / 32,
   l = r % 32 has its low four bits in the low (k < 2) or high (k >= 2)
   nibble of ql[64n + l + 32 * (k % 2)] and its high two bits at bits
   2k .. 2k+1 of qh[32n + l]. x = (d * scales[e / 16]) * (q - 32). */
static inline int q6k_quant(const uint8_t ql[128], const uint8_t qh[64], int e) {
    int n = e / 128, r = e % 128, k = r / 32, l = r % 32;
    uint8_t lb = ql[64 * n + l + 32 * (k % 2)];
    int low = k < 2 ? (lb & 15) : (lb >> 4);
    int high = (qh[32 * n + l] >> (2 * k)) & 3;
    return low | (high << 4);
}

void ember_dequant_q6_k(const void *src, float *dst, size_t nblocks) {
    const unsigned char *p = src;
    for (size_t b = 0; b < nblocks; b++, p += sizeof(ember_block_q6_k), dst += 256) {
        ember_block_q6_k blk;
        memcpy(&blk, p, sizeof blk);
        float d = h2f(blk.d);
        for (int e = 0; e < 256; e++) {
            float ds = d * (float)blk.scales[e / 16];
            dst[e] = ds * (float)(q6k_quant(blk.ql, blk.qh, e) - 32);
        }
    }
}

/* Q8_K: x = d * qs[e], d an f32. */
void ember_dequant_q8_k(const void *src, float *dst, size_t nblocks) {
    const unsigned char *p = src;
    for (size_t b = 0; b < nblocks; b++, p += sizeof(ember_block_q8_k), dst += 256) {
        ember_block_q8_k blk;
        memcpy(&blk, p, sizeof blk);
        for (int e = 0; e < 256; e++) dst[e] = blk.d * (float)blk.qs[e];
    }
}

/* ---- K encoders ----------------------------------------------------------- */

/* Squared error of x ~ a * q - b with q the nearest level in [0, nmax]. */
static float affine_err(const float *x, int n, int nmax, float a, float b) {
    float e = 0.0f;
    for (int i = 0; i < n; i++) {
        int q = a > 0.0f ? round_clamp((x[i] + b) / a, 0, nmax) : 0;
        float r = a * (float)q - b - x[i];
        e += r * r;
    }
    return e;
}

/* One least-squares step: with q the nearest levels under (a, b), the (a, b)
   that minimise sum (a q - b - x)^2 subject to a >= 0, b >= 0. Returns false
   when the fit is degenerate (then a, b are unchanged). */
static bool affine_refit(const float *x, int n, int nmax, float *a, float *b) {
    if (!(*a > 0.0f)) return false;
    double sq = 0, sqq = 0, sx = 0, sxq = 0;
    for (int i = 0; i < n; i++) {
        int q = round_clamp((x[i] + *b) / *a, 0, nmax);
        sq += q;
        sqq += (double)q * q;
        sx += x[i];
        sxq += (double)x[i] * q;
    }
    double det = n * sqq - sq * sq;
    if (!(det > 0)) return false;
    double na = (n * sxq - sq * sx) / det;
    double c = (sx - na * sq) / n; /* x ~ na * q + c, c = -b */
    if (c > 0) {                   /* b must be >= 0 */
        c = 0;
        na = sxq / sqq;
    }
    if (!(na > 0) || !isfinite(na) || !isfinite(c)) return false;
    *a = (float)na;
    *b = (float)-c;
    return true;
}

/* Ember's fit of one K sub-block by a * q - b, q in [0, nmax], a, b >= 0:
   start from the min/max fit at several level counts around nmax, refine
   each with a few least-squares steps, keep the lowest squared error.
   Returns a; *b_out = b. */
static float fit_affine(const float *x, int n, int nmax, float *b_out) {
    float lo, hi;
    min_max(x, n, &lo, &hi);
    if (lo > 0.0f) lo = 0.0f;
    if (!(hi > lo)) { /* constant block (or nothing finite) */
        *b_out = lo < 0.0f ? -lo : 0.0f;
        return 0.0f;
    }
    float best_a = (hi - lo) / (float)nmax, best_b = -lo;
    float best_e = affine_err(x, n, nmax, best_a, best_b);
    for (int k = -4; k <= 4; k++) {
        float a = (hi - lo) / ((float)nmax + 0.25f * (float)k), b = -lo;
        for (int it = 0; it < 4; it++) {
            float e = affine_err(x, n, nmax, a, b);
            if (e < best_e) {
                best_e = e;
                best_a = a;
                best_b = b;
            }
            if (!affine_refit(x, n, nmax, &a, &b)) break;
        }
    }
    *b_out = best_b;
    return best_a;
}

/* The Q4_K / Q5_K encoder (nmax 15 or 31): fits each of the 8 sub-blocks,
   codes scales and mins in 6 bits against f16 super-block scales, then
   rounds every element to the nearest level of its decoded scale. */
static void encode_k_affine(const float *x, int nmax, uint16_t *dh, uint16_t *mh, uint8_t scales[12],
                            uint8_t q[256]) {
    float a[8], b[8], amax = 0.0f, bmax = 0.0f;
    for (int j = 0; j < 8; j++) {
        a[j] = fit_affine(x + 32 * j, 32, nmax, &b[j]);
        if (a[j] > amax) amax = a[j];
        if (b[j] > bmax) bmax = b[j];
    }
    *dh = f2h(amax / 63.0f);
    *mh = f2h(bmax / 63.0f);
    float d = h2f(*dh), dm = h2f(*mh);
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        ls[j] = (uint8_t)(d > 0.0f ? round_clamp(a[j] / d, 0, 63) : 0);
        lm[j] = (uint8_t)(dm > 0.0f ? round_clamp(b[j] / dm, 0, 63) : 0);
    }
    ember_q4k_pack_scales(scales, ls, lm);
    for (int j = 0; j < 8; j++) {
        float d1 = d * (float)ls[j], m1 = dm * (float)lm[j];
        for (int i = 0; i < 32; i++)
            q[32 * j + i] = (uint8_t)(d1 > 0.0f ? round_clamp((x[32 * j + i] + m1) / d1, 0, nmax) : 0);
    }
}

void ember_quant_q4_k(const float *src, void *dst, size_t nblocks) {
    unsigned char *p = dst;
    for (size_t b = 0; b < nblocks; b++, p += sizeof(ember_block_q4_k), src += 256) {
        ember_block_q4_k blk;
        uint8_t q[256];
        encode_k_affine(src, 15, &blk.d, &blk.dmin, blk.scales, q);
        memset(blk.qs, 0, sizeof blk.qs);
        for (int e = 0; e < 256; e++) {
            int j = e / 32;
            blk.qs[32 * (j / 2) + e % 32] |= (uint8_t)(q[e] << (4 * (j & 1)));
        }
        memcpy(p, &blk, sizeof blk);
    }
}

void ember_quant_q5_k(const float *src, void *dst, size_t nblocks) {
    unsigned char *p = dst;
    for (size_t b = 0; b < nblocks; b++, p += sizeof(ember_block_q5_k), src += 256) {
        ember_block_q5_k blk;
        uint8_t q[256];
        encode_k_affine(src, 31, &blk.d, &blk.dmin, blk.scales, q);
        memset(blk.qs, 0, sizeof blk.qs);
        memset(blk.qh, 0, sizeof blk.qh);
        for (int e = 0; e < 256; e++) {
            int j = e / 32;
            blk.qs[32 * (j / 2) + e % 32] |= (uint8_t)((q[e] & 15) << (4 * (j & 1)));
            blk.qh[e % 32] |= (uint8_t)((q[e] >> 4) << j);
        }
        memcpy(p, &blk, sizeof blk);
    }
}

/* Squared error of x ~ s * q, q the nearest level in [-32, 31]. */
static float sym_err(const float *x, int n, float s) {
    float e = 0.0f;
    for (int i = 0; i < n; i++) {
        int q = s != 0.0f ? round_clamp(x[i] / s, -32, 31) : 0;
        float r = s * (float)q - x[i];
        e += r * r;
    }
    return e;
}

/* Ember's fit of one Q6_K sub-block by s * q, q in [-32, 31]: candidates
   that put the largest-magnitude element m at level -t or +t (t from 28 to
   32), each refined by least-squares steps; the lowest error wins. */
static float fit_symmetric(const float *x, int n) {
    float m = signed_absmax(x, n);
    if (!(fabsf(m) > 0.0f)) return 0.0f;
    float best_s = m / -32.0f, best_e = sym_err(x, n, best_s);
    for (int k = 0; k <= 8; k++) {
        for (int sign = -1; sign <= 1; sign += 2) {
            float s = m / ((float)sign * (28.0f + 0.5f * (float)k));
            for (int it = 0; it < 3; it++) {
                float e = sym_err(x, n, s);
                if (e < best_e) {
                    best_e = e;
                    best_s = s;
                }
                double sxq = 0, sqq = 0;
                for (int i = 0; i < n; i++) {
                    int q = round_clamp(x[i] / s, -32, 31);
                    sxq += (double)x[i] * q;
                    sqq += (double)q * q;
                }
                if (!(sqq > 0)) break;
                double ns = sxq / sqq;
                if (!isfinite(ns) || ns == 0) break;
                s = (float)ns;
            }
        }
    }
    return best_s;
}

/* Q6_K encoder: 16 sub-block scales fitted, coded as int8 against an f16
   super-block scale d = s_max / -128, elements rounded to the nearest level
   of their decoded scale. */
void ember_quant_q6_k(const float *src, void *dst, size_t nblocks) {
    unsigned char *p = dst;
    for (size_t b = 0; b < nblocks; b++, p += sizeof(ember_block_q6_k), src += 256) {
        ember_block_q6_k blk;
        float s[16];
        for (int j = 0; j < 16; j++) s[j] = fit_symmetric(src + 16 * j, 16);
        float smax = signed_absmax(s, 16);
        blk.d = f2h(smax / -128.0f);
        float d = h2f(blk.d);
        for (int j = 0; j < 16; j++) blk.scales[j] = (int8_t)(d != 0.0f ? round_clamp(s[j] / d, -128, 127) : 0);
        memset(blk.ql, 0, sizeof blk.ql);
        memset(blk.qh, 0, sizeof blk.qh);
        for (int e = 0; e < 256; e++) {
            float ds = d * (float)blk.scales[e / 16];
            int q = (ds != 0.0f ? round_clamp(src[e] / ds, -32, 31) : 0) + 32;
            int n = e / 128, r = e % 128, k = r / 32, l = r % 32;
            blk.ql[64 * n + l + 32 * (k % 2)] |= (uint8_t)((q & 15) << (k < 2 ? 0 : 4));
            blk.qh[32 * n + l] |= (uint8_t)((q >> 4) << (2 * k));
        }
        memcpy(p, &blk, sizeof blk);
    }
}

/* Q8_K canonical rule: m the element of largest magnitude, iscale =
   -127 / m, q = min(127, round-half-even(iscale * x)), d = 1 / iscale,
   bsums the sums of each 16 quants; an all-zero block is all zeros. */
void ember_quant_q8_k(const float *src, void *dst, size_t nblocks) {
    unsigned char *p = dst;
    for (size_t b = 0; b < nblocks; b++, p += sizeof(ember_block_q8_k), src += 256) {
        ember_block_q8_k blk;
        memset(&blk, 0, sizeof blk);
        float m = signed_absmax(src, 256);
        if (m != 0.0f) {
            float iscale = -127.0f / m;
            for (int e = 0; e < 256; e++) blk.qs[e] = (int8_t)rint_clamp(iscale * src[e], -128, 127);
            for (int j = 0; j < 16; j++) {
                int sum = 0;
                for (int i = 0; i < 16; i++) sum += blk.qs[16 * j + i];
                blk.bsums[j] = (int16_t)sum;
            }
            blk.d = 1.0f / iscale;
        }
        memcpy(p, &blk, sizeof blk);
    }
}

/* ==== by dtype ============================================================ */

typedef void (*dequant_fn)(const void *, float *, size_t);
typedef void (*quant_fn)(const float *, void *, size_t);

static dequant_fn dequant_for(ember_dtype t) {
    switch (t) {
    case EMBER_Q4_0: return ember_dequant_q4_0;
    case EMBER_Q4_1: return ember_dequant_q4_1;
    case EMBER_Q5_0: return ember_dequant_q5_0;
    case EMBER_Q5_1: return ember_dequant_q5_1;
    case EMBER_Q8_0: return ember_dequant_q8_0;
    case EMBER_Q8_1: return ember_dequant_q8_1;
    case EMBER_Q2_K: return ember_dequant_q2_k;
    case EMBER_Q3_K: return ember_dequant_q3_k;
    case EMBER_Q4_K: return ember_dequant_q4_k;
    case EMBER_Q5_K: return ember_dequant_q5_k;
    case EMBER_Q6_K: return ember_dequant_q6_k;
    case EMBER_Q8_K: return ember_dequant_q8_k;
    default: return NULL;
    }
}

static quant_fn quant_for(ember_dtype t) {
    switch (t) {
    case EMBER_Q4_0: return ember_quant_q4_0;
    case EMBER_Q4_1: return ember_quant_q4_1;
    case EMBER_Q5_0: return ember_quant_q5_0;
    case EMBER_Q5_1: return ember_quant_q5_1;
    case EMBER_Q8_0: return ember_quant_q8_0;
    case EMBER_Q8_1: return ember_quant_q8_1;
    case EMBER_Q4_K: return ember_quant_q4_k;
    case EMBER_Q5_K: return ember_quant_q5_k;
    case EMBER_Q6_K: return ember_quant_q6_k;
    case EMBER_Q8_K: return ember_quant_q8_k;
    default: return NULL;
    }
}

static bool is_plain_float(ember_dtype t) {
    return t == EMBER_F32 || t == EMBER_F16 || t == EMBER_BF16;
}

bool ember_can_dequantize(ember_dtype t) {
    return is_plain_float(t) || dequant_for(t) != NULL;
}

bool ember_can_quantize(ember_dtype t) {
    return is_plain_float(t) || quant_for(t) != NULL;
}

/* Checks that t is handled and n is whole blocks; *nblocks = n / block. */
static int check_n(const char *what, ember_dtype t, bool ok, size_t n, size_t *nblocks, ember_error *err) {
    const ember_dtype_info *d = ember_dtype_get(t);
    if (!ok) return ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: dtype %s is not supported", what, d->name);
    if (n % d->block_elems)
        return ember_err(err, EMBER_ERR_INVALID_ARG,
                         "%s: %zu elements is not a whole number of %zu-element %s blocks", what, n,
                         d->block_elems, d->name);
    *nblocks = n / d->block_elems;
    return EMBER_OK;
}

int ember_dequantize(ember_dtype t, const void *src, float *dst, size_t n, ember_error *err) {
    size_t nb;
    int rc = check_n("dequantize", t, ember_can_dequantize(t), n, &nb, err);
    if (rc) return rc;
    const unsigned char *p = src;
    switch (t) {
    case EMBER_F32: memmove(dst, src, n * sizeof(float)); break;
    case EMBER_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = ember_f16_to_f32(h);
        }
        break;
    case EMBER_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = ember_bf16_to_f32(h);
        }
        break;
    default: dequant_for(t)(src, dst, nb); break;
    }
    return EMBER_OK;
}

int ember_quantize(ember_dtype t, const float *src, void *dst, size_t n, ember_error *err) {
    size_t nb;
    int rc = check_n("quantize", t, ember_can_quantize(t), n, &nb, err);
    if (rc) return rc;
    unsigned char *p = dst;
    switch (t) {
    case EMBER_F32: memmove(dst, src, n * sizeof(float)); break;
    case EMBER_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = ember_f32_to_f16(src[i]);
            memcpy(p + 2 * i, &h, 2);
        }
        break;
    case EMBER_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = ember_f32_to_bf16(src[i]);
            memcpy(p + 2 * i, &h, 2);
        }
        break;
    default: quant_for(t)(src, dst, nb); break;
    }
    return EMBER_OK;
}
