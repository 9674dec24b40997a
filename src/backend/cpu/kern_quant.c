/*
 * kern_quant.c - the plain-C side of quantized weights in the CPU backend
 * (see qkern.h): activation quantizers, exact row dequantization for
 * get_rows, and the canonical dot products, which are the scalar kernels
 * and the reference every SIMD kernel must match bit for bit.
 *
 * Compiled with baseline flags only; -ffp-contract=off keeps every
 * multiply and add as written, and fmaf is the C library's correctly
 * rounded fused multiply-add. No state; any thread may call anything here.
 */
#include <math.h>
#include <string.h>

#include "kernels.h"
#include "qkern.h"

cpu_act_kind cpu_act_kind_for(ember_dtype t) {
    switch (t) {
    case EMBER_Q4_0:
    case EMBER_Q4_1:
    case EMBER_Q5_0:
    case EMBER_Q5_1:
    case EMBER_Q8_0: return CPU_ACT_32;
    case EMBER_Q4_K:
    case EMBER_Q5_K:
    case EMBER_Q6_K:
    case EMBER_Q8_K: return CPU_ACT_256;
    default: return CPU_ACT_NONE;
    }
}

size_t cpu_act_row_bytes(cpu_act_kind k, int K) {
    if (k == CPU_ACT_32) return (size_t)(K / 32) * sizeof(cpu_act32);
    if (k == CPU_ACT_256) return (size_t)(K / 256) * sizeof(cpu_act256);
    return 0;
}

size_t cpu_row_bytes(ember_dtype t, int64_t K) {
    const ember_dtype_info *d = ember_dtype_get(t);
    if (d->block_bytes == 0 || K < 0 || K % (int64_t)d->block_elems) return 0;
    return (size_t)(K / (int64_t)d->block_elems) * d->block_bytes;
}

/* ---- activation quantizers --------------------------------------------- */

/* round(v) to nearest even, clamped to [-127, 127]; NaN gives -127. */
static inline int8_t q127(float v) {
    v = fmaxf(v, -127.0f); /* NaN -> -127 */
    v = fminf(v, 127.0f);
    return (int8_t)nearbyintf(v);
}

static float absmax(const float *x, int n) {
    float a = 0.0f;
    for (int i = 0; i < n; i++) a = fmaxf(a, fabsf(x[i]));
    return a;
}

void cpu_quantize_act32(const float *x, int K, void *dst) {
    cpu_act32 *b = dst;
    for (int i = 0; i < K / 32; i++, x += 32, b++) {
        float a = absmax(x, 32);
        float d = a / 127.0f, id = a > 0 ? 127.0f / a : 0.0f;
        int s = 0;
        for (int e = 0; e < 32; e++) {
            b->q[e] = q127(x[e] * id);
            s += b->q[e];
        }
        b->d = d;
        b->ds = d * (float)s;
    }
}

void cpu_quantize_act256(const float *x, int K, void *dst) {
    unsigned char *p = dst;
    for (int i = 0; i < K / 256; i++, x += 256, p += sizeof(cpu_act256)) {
        cpu_act256 b;
        float a = absmax(x, 256);
        float id = a > 0 ? 127.0f / a : 0.0f;
        b.d = a / 127.0f;
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int e = 16 * j; e < 16 * j + 16; e++) {
                b.q[e] = q127(x[e] * id);
                s += b.q[e];
            }
            b.bsums[j] = (int16_t)s;
        }
        memcpy(p, &b, sizeof b);
    }
}

/* ---- element levels of each block type --------------------------------------- */

/* Low nibble for e < 16, high nibble of qs[e - 16] otherwise. */
static inline int nib32(const uint8_t *qs, int e) {
    return e < 16 ? (qs[e] & 15) : (qs[e - 16] >> 4);
}
static inline int q5hi(const uint8_t *qh, int e) {
    return (qh[e / 8] >> (e % 8)) & 1;
}
static inline int k4_nib(const uint8_t *qs, int e) {
    int j = e / 32;
    uint8_t byte = qs[32 * (j / 2) + e % 32];
    return (j % 2) ? (byte >> 4) : (byte & 15);
}
static inline int q6_level(const uint8_t *ql, const uint8_t *qh, int e) {
    int n = e / 128, r = e % 128, k = r / 32, l = r % 32;
    uint8_t lb = ql[64 * n + l + 32 * (k % 2)];
    int low = k < 2 ? (lb & 15) : (lb >> 4);
    return low | (((qh[32 * n + l] >> (2 * k)) & 3) << 4);
}

/* Integer levels of one 32-element block of t (unsigned q for Q4_1/Q5_1). */
static void levels32(ember_dtype t, const unsigned char *blk, int w[32]) {
    switch (t) {
    case EMBER_Q4_0:
        for (int e = 0; e < 32; e++) w[e] = nib32(blk + 2, e) - 8;
        break;
    case EMBER_Q4_1:
        for (int e = 0; e < 32; e++) w[e] = nib32(blk + 4, e);
        break;
    case EMBER_Q5_0:
        for (int e = 0; e < 32; e++) w[e] = (nib32(blk + 6, e) | (q5hi(blk + 2, e) << 4)) - 16;
        break;
    case EMBER_Q5_1:
        for (int e = 0; e < 32; e++) w[e] = nib32(blk + 8, e) | (q5hi(blk + 4, e) << 4);
        break;
    default: /* Q8_0 */
        for (int e = 0; e < 32; e++) w[e] = (int8_t)blk[2 + e];
        break;
    }
}

/* ---- exact dequantization ------------------------------------------------------ */

bool cpu_dequant_row(ember_dtype t, const void *src, float *dst, int64_t n) {
    const unsigned char *p = src;
    const ember_dtype_info *info = ember_dtype_get(t);
    int64_t nb = n / (int64_t)info->block_elems;
    switch (t) {
    case EMBER_F32: memcpy(dst, src, (size_t)n * 4); return true;
    case EMBER_F16:
    case EMBER_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = t == EMBER_F16 ? ember_f16_to_f32(h) : ember_bf16_to_f32(h);
        }
        return true;
    case EMBER_Q4_0:
    case EMBER_Q5_0:
    case EMBER_Q8_0:
        for (int64_t b = 0; b < nb; b++, p += info->block_bytes, dst += 32) {
            int w[32];
            levels32(t, p, w);
            float d = cpu_h2f(p);
            for (int e = 0; e < 32; e++) dst[e] = (float)w[e] * d;
        }
        return true;
    case EMBER_Q4_1:
    case EMBER_Q5_1:
        for (int64_t b = 0; b < nb; b++, p += info->block_bytes, dst += 32) {
            int w[32];
            levels32(t, p, w);
            float d = cpu_h2f(p), m = cpu_h2f(p + 2);
            for (int e = 0; e < 32; e++) dst[e] = (float)w[e] * d + m;
        }
        return true;
    case EMBER_Q4_K:
    case EMBER_Q5_K:
        for (int64_t b = 0; b < nb; b++, p += info->block_bytes, dst += 256) {
            float d = cpu_h2f(p), dmin = cpu_h2f(p + 2);
            const uint8_t *sc = p + 4, *qh = p + 16, *qs = t == EMBER_Q4_K ? p + 16 : p + 48;
            for (int e = 0; e < 256; e++) {
                int s, m;
                cpu_k4_scale_min(sc, e / 32, &s, &m);
                float d1 = d * (float)s, m1 = dmin * (float)m;
                int q = k4_nib(qs, e);
                if (t == EMBER_Q5_K) q += ((qh[e % 32] >> (e / 32)) & 1) << 4;
                dst[e] = d1 * (float)q - m1;
            }
        }
        return true;
    case EMBER_Q6_K:
        for (int64_t b = 0; b < nb; b++, p += info->block_bytes, dst += 256) {
            const uint8_t *ql = p, *qh = p + 128;
            const int8_t *sc = (const int8_t *)(p + 192);
            float d = cpu_h2f(p + 208);
            for (int e = 0; e < 256; e++) {
                float ds = d * (float)sc[e / 16];
                dst[e] = ds * (float)(q6_level(ql, qh, e) - 32);
            }
        }
        return true;
    case EMBER_Q8_K:
        for (int64_t b = 0; b < nb; b++, p += info->block_bytes, dst += 256) {
            float d;
            memcpy(&d, p, 4);
            for (int e = 0; e < 256; e++) dst[e] = d * (float)(int8_t)p[4 + e];
        }
        return true;
    default: return false;
    }
}

/* ---- canonical dot products ---------------------------------------------------------- */

static float dot32(ember_dtype t, const unsigned char *w, const cpu_act32 *y, int nb) {
    const size_t bb = ember_dtype_get(t)->block_bytes;
    const bool has_min = t == EMBER_Q4_1 || t == EMBER_Q5_1;
    float acc[16] = {0}, macc = 0.0f;
    for (int b = 0; b < nb; b++, w += bb, y++) {
        int lv[32];
        levels32(t, w, lv);
        float dd = cpu_h2f(w) * y->d;
        for (int l = 0; l < 8; l++) {
            int p = 0;
            for (int e = 4 * l; e < 4 * l + 4; e++) p += lv[e] * y->q[e];
            float *a = &acc[8 * (b % 2) + l];
            *a = fmaf(dd, (float)p, *a);
        }
        if (has_min) macc = fmaf(cpu_h2f(w + 2), y->ds, macc);
    }
    float r = cpu_tree16(acc);
    return has_min ? r + macc : r;
}

static float dot256(ember_dtype t, const unsigned char *w, const unsigned char *ya, int nb) {
    const size_t bb = ember_dtype_get(t)->block_bytes;
    float acc = 0.0f;
    for (int b = 0; b < nb; b++, w += bb, ya += sizeof(cpu_act256)) {
        cpu_act256 y;
        memcpy(&y, ya, sizeof y);
        if (t == EMBER_Q4_K || t == EMBER_Q5_K) {
            const uint8_t *sc = w + 4, *qh = w + 16, *qs = t == EMBER_Q4_K ? w + 16 : w + 48;
            int32_t s1 = 0, s2 = 0;
            for (int j = 0; j < 8; j++) {
                int s, m, p = 0;
                cpu_k4_scale_min(sc, j, &s, &m);
                for (int e = 32 * j; e < 32 * j + 32; e++) {
                    int q = k4_nib(qs, e);
                    if (t == EMBER_Q5_K) q += ((qh[e % 32] >> j) & 1) << 4;
                    p += q * y.q[e];
                }
                s1 += s * p;
                s2 += m * (y.bsums[2 * j] + y.bsums[2 * j + 1]);
            }
            acc = fmaf(cpu_h2f(w) * y.d, (float)s1, acc);
            acc = fmaf(-(cpu_h2f(w + 2) * y.d), (float)s2, acc);
        } else if (t == EMBER_Q6_K) {
            const int8_t *sc = (const int8_t *)(w + 192);
            int32_t s1 = 0;
            for (int j = 0; j < 16; j++) {
                int p = 0;
                for (int e = 16 * j; e < 16 * j + 16; e++) p += (q6_level(w, w + 128, e) - 32) * y.q[e];
                s1 += sc[j] * p;
            }
            acc = fmaf(cpu_h2f(w + 208) * y.d, (float)s1, acc);
        } else { /* Q8_K */
            float d;
            memcpy(&d, w, 4);
            int32_t s1 = 0;
            for (int e = 0; e < 256; e++) s1 += (int8_t)w[4 + e] * y.q[e];
            acc = fmaf(d * y.d, (float)s1, acc);
        }
    }
    return acc;
}

#define GENERIC(name, T, KIND)                                                                                    \
    static void name(const void *w, size_t w_row, int nn, const void *xa, size_t xa_row, int mm, int K, float *out, \
                     size_t ldo) {                                                                                \
        for (int m = 0; m < mm; m++) {                                                                            \
            const unsigned char *x = (const unsigned char *)xa + (size_t)m * xa_row;                             \
            for (int n = 0; n < nn; n++) {                                                                        \
                const unsigned char *wr = (const unsigned char *)w + (size_t)n * w_row;                          \
                out[(size_t)m * ldo + (size_t)n] =                                                                \
                    KIND == 32 ? dot32(T, wr, (const cpu_act32 *)(const void *)x, K / 32) : dot256(T, wr, x, K / 256); \
            }                                                                                                     \
        }                                                                                                         \
    }

GENERIC(gen_q4_0, EMBER_Q4_0, 32)
GENERIC(gen_q4_1, EMBER_Q4_1, 32)
GENERIC(gen_q5_0, EMBER_Q5_0, 32)
GENERIC(gen_q5_1, EMBER_Q5_1, 32)
GENERIC(gen_q8_0, EMBER_Q8_0, 32)
GENERIC(gen_q4_k, EMBER_Q4_K, 256)
GENERIC(gen_q5_k, EMBER_Q5_K, 256)
GENERIC(gen_q6_k, EMBER_Q6_K, 256)
GENERIC(gen_q8_k, EMBER_Q8_K, 256)

cpu_qgemm_fn_t cpu_qgemm_generic(ember_dtype t) {
    switch (t) {
    case EMBER_Q4_0: return gen_q4_0;
    case EMBER_Q4_1: return gen_q4_1;
    case EMBER_Q5_0: return gen_q5_0;
    case EMBER_Q5_1: return gen_q5_1;
    case EMBER_Q8_0: return gen_q8_0;
    case EMBER_Q4_K: return gen_q4_k;
    case EMBER_Q5_K: return gen_q5_k;
    case EMBER_Q6_K: return gen_q6_k;
    case EMBER_Q8_K: return gen_q8_k;
    default: return NULL;
    }
}
