/*
 * kern_quant.c - the plain-C side of quantized weights in the CPU backend
 * (see qkern.h): activation quantizers, exact row dequantization for
 * get_rows, the canonical dot products, which are the scalar kernels and
 * the reference every SIMD kernel must match bit for bit, the packed
 * (16-row interleaved) layouts, and cpu_qmatmul, which runs a kernel on
 * packed or row-major weights.
 *
 * Compiled with baseline flags only; -ffp-contract=off keeps every
 * multiply and add as written, and fmaf is the C library's correctly
 * rounded fused multiply-add. No state; any thread may call anything here.
 */
#include <math.h>
#include <stdint.h>
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
    if (k == CPU_ACT_BF16X2) return (size_t)K * 4;
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

/* max |x| over n floats; NaN elements are skipped (fmaxf). */
static inline float qa_absmax(const float *x, int n) {
    float a = 0.0f;
    for (int i = 0; i < n; i++) a = fmaxf(a, fabsf(x[i]));
    return a;
}

/* The levels of 16 floats stored at q; returns their sum. */
static inline int qa_16(const float *x, float id, int8_t *q) {
    int s = 0;
    for (int e = 0; e < 16; e++) {
        q[e] = q127(x[e] * id);
        s += q[e];
    }
    return s;
}

/* The block layout is written once, in kern_qact.h, over the primitives
   above; the SIMD files give the same template their own primitives. */
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define KPREFIX plain_
#include "kern_qact.h"

void cpu_quantize_act32(const float *x, int K, void *dst) {
    plain_quant_act32(x, K, dst);
}

void cpu_quantize_act256(const float *x, int K, void *dst) {
    plain_quant_act256(x, K, dst);
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

/* ---- packed layouts (qkern.h) --------------------------------------------------- */

bool cpu_qpack_has(ember_dtype t) {
    return t == EMBER_Q4_0 || t == EMBER_Q5_0 || t == EMBER_Q8_0 || t == EMBER_Q4_K || t == EMBER_Q5_K ||
           t == EMBER_Q6_K;
}

static inline uint32_t ld32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline void st32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

/* The 4 bytes of dword [k][r] of the array at off in a block group. */
static inline size_t qp_dw(size_t off, int k, int r) {
    return off + 4 * (16 * (size_t)k + (size_t)r);
}

/* Q5_0's high bits: bit e of qh (element e) <-> bit 8 (e % 4) + e / 4 of h. */
static uint32_t q5_spread(uint32_t qh) {
    uint32_t h = 0;
    for (int e = 0; e < 32; e++) h |= ((qh >> e) & 1u) << (8 * (e % 4) + e / 4);
    return h;
}
static uint32_t q5_gather(uint32_t h) {
    uint32_t qh = 0;
    for (int e = 0; e < 32; e++) qh |= ((h >> (8 * (e % 4) + e / 4)) & 1u) << e;
    return qh;
}

/* The unit the packed layout moves: a block of the type, or for BF16 32
   elements (64 bytes: the AMX-BF16 kernels' chunk, qkern.h). */
static void qp_geom(ember_dtype t, size_t *bb, int *be) {
    const ember_dtype_info *di = ember_dtype_get(t);
    *bb = t == EMBER_BF16 ? 64 : di->block_bytes;
    *be = t == EMBER_BF16 ? 32 : (int)di->block_elems;
}

/* One direction of the block <-> block-group mapping: put copies blk into
   the group, get copies it back. Every byte of a block has one place. */
static void qp_move(ember_dtype t, unsigned char *bg, int r, unsigned char *blk, bool put) {
#define MV(goff, boff, n) (put ? memcpy(bg + (goff), blk + (boff), n) : memcpy(blk + (boff), bg + (goff), n))
    switch (t) {
    case EMBER_Q8_0:
        MV(2 * (size_t)r, 0, 2);
        for (int g = 0; g < 8; g++)
            for (int i = 0; i < 4; i++) {
                size_t o = qp_dw(32, g, r) + (size_t)i;
                if (put)
                    bg[o] = blk[2 + 4 * g + i] ^ 0x80;
                else
                    blk[2 + 4 * g + i] = bg[o] ^ 0x80;
            }
        break;
    case EMBER_Q4_0:
        MV(2 * (size_t)r, 0, 2);
        for (int k = 0; k < 4; k++) MV(qp_dw(32, k, r), 2 + 4 * (size_t)k, 4);
        break;
    case EMBER_Q5_0:
        MV(2 * (size_t)r, 0, 2);
        if (put)
            st32(bg + qp_dw(32, 0, r), q5_spread(ld32(blk + 2)));
        else
            st32(blk + 2, q5_gather(ld32(bg + qp_dw(32, 0, r))));
        for (int k = 0; k < 4; k++) MV(qp_dw(96, k, r), 6 + 4 * (size_t)k, 4);
        break;
    case EMBER_Q4_K:
    case EMBER_Q5_K: {
        MV(2 * (size_t)r, 0, 2);
        MV(32 + 2 * (size_t)r, 2, 2);
        for (int k = 0; k < 3; k++) MV(qp_dw(64, k, r), 4 + 4 * (size_t)k, 4);
        size_t qoff = 256, qs = 16;
        if (t == EMBER_Q5_K) {
            for (int k = 0; k < 8; k++) MV(qp_dw(256, k, r), 16 + 4 * (size_t)k, 4);
            qoff = 768;
            qs = 48;
        }
        for (int k = 0; k < 32; k++) MV(qp_dw(qoff, k, r), qs + 4 * (size_t)k, 4);
        break;
    }
    case EMBER_BF16: /* dword [k][r] = elements 2k, 2k + 1 of row r: AMX's B tile */
        for (int k = 0; k < 16; k++) MV(qp_dw(0, k, r), 4 * (size_t)k, 4);
        break;
    case EMBER_Q6_K:
        MV(2 * (size_t)r, 208, 2);
        for (int j = 0; j < 16; j++) MV(32 + 16 * (size_t)j + (size_t)r, 192 + (size_t)j, 1);
        for (int k = 0; k < 32; k++) MV(qp_dw(288, k, r), 4 * (size_t)k, 4);
        for (int k = 0; k < 16; k++) MV(qp_dw(2336, k, r), 128 + 4 * (size_t)k, 4);
        break;
    default: break;
    }
#undef MV
}

void cpu_qpack_put_block(ember_dtype t, void *bg, int r, const void *blk) {
    qp_move(t, bg, r, (unsigned char *)(uintptr_t)blk, true);
}

void cpu_qpack_get_block(ember_dtype t, const void *bg, int r, void *blk) {
    qp_move(t, (unsigned char *)(uintptr_t)bg, r, blk, false);
}

void cpu_qpack_group(ember_dtype t, const void *src, size_t src_row, int nrows, int K, void *dst) {
    static const unsigned char zero[292];
    size_t bb;
    int be;
    qp_geom(t, &bb, &be);
    const int nb = K / be;
    for (int b = 0; b < nb; b++) {
        unsigned char *bg = (unsigned char *)dst + (size_t)b * CPU_QP_ROWS * bb;
        for (int r = 0; r < CPU_QP_ROWS; r++)
            cpu_qpack_put_block(t, bg, r,
                                r < nrows ? (const unsigned char *)src + (size_t)r * src_row + (size_t)b * bb : zero);
    }
}

void cpu_qunpack_group(ember_dtype t, const void *src, int K, void *dst, size_t dst_row, int nrows) {
    size_t bb;
    int be;
    qp_geom(t, &bb, &be);
    const int nb = K / be;
    for (int b = 0; b < nb; b++) {
        const unsigned char *bg = (const unsigned char *)src + (size_t)b * CPU_QP_ROWS * bb;
        for (int r = 0; r < nrows; r++)
            cpu_qpack_get_block(t, bg, r, (unsigned char *)dst + (size_t)r * dst_row + (size_t)b * bb);
    }
}

void cpu_qpack_dequant_row(ember_dtype t, const void *g, int r, int K, float *dst) {
    size_t bb;
    int be;
    qp_geom(t, &bb, &be);
    const int nb = K / be;
    unsigned char blk[292];
    for (int b = 0; b < nb; b++) {
        cpu_qpack_get_block(t, (const unsigned char *)g + (size_t)b * CPU_QP_ROWS * bb, r, blk);
        cpu_dequant_row(t, blk, dst + (size_t)b * be, (int64_t)be);
    }
}

static size_t round64(size_t n) {
    return (n + 63) & ~(size_t)63;
}

size_t cpu_qmatmul_scratch_bytes(ember_dtype t, int K, int mm) {
    return round64(CPU_QP_ROWS * cpu_row_bytes(t, K)) + round64((size_t)mm * CPU_QP_ROWS * sizeof(float));
}

/* One packed kernel call over ngroups groups at wg: the row-major kernel
   (pf with xa) or the tiled one (tf with xt). */
typedef struct qmm_kern {
    cpu_qgemm_packed_fn pf;
    cpu_qgemm_tiled_fn tf;
    const void *xa, *xt;
    size_t xa_row;
    int mm, K;
} qmm_kern;

static void qmm_call(const qmm_kern *q, const void *wg, int ngroups, float *out, size_t ldo) {
    if (q->tf)
        q->tf(wg, ngroups, q->xt, q->mm, q->K, out, ldo);
    else
        q->pf(wg, ngroups, q->xa, q->xa_row, q->mm, q->K, out, ldo);
}

/* The whole groups of w (packed, or packed group by group into scratch)
   and the nn % 16 tail rows (packed into scratch, their outputs copied). */
static void qmm_groups(const qmm_kern *q, ember_dtype t, const void *w, bool packed, int nn, float *out, size_t ldo,
                       void *scratch) {
    const size_t row = cpu_row_bytes(t, q->K);
    const unsigned char *wb = w;
    const size_t gbytes = CPU_QP_ROWS * row;
    unsigned char *gbuf = scratch;
    float *tout = (float *)(void *)(gbuf + round64(gbytes));
    const int full = nn / CPU_QP_ROWS, tail = nn % CPU_QP_ROWS;
    if (packed && full > 0) {
        qmm_call(q, wb, full, out, ldo);
    } else {
        for (int g = 0; g < full; g++) {
            cpu_qpack_group(t, wb + (size_t)g * gbytes, row, CPU_QP_ROWS, q->K, gbuf);
            qmm_call(q, gbuf, 1, out + (size_t)g * CPU_QP_ROWS, ldo);
        }
    }
    if (tail) {
        cpu_qpack_group(t, wb + (size_t)full * gbytes, row, tail, q->K, gbuf);
        qmm_call(q, gbuf, 1, tout, CPU_QP_ROWS);
        for (int m = 0; m < q->mm; m++)
            memcpy(out + (size_t)m * ldo + (size_t)full * CPU_QP_ROWS, tout + (size_t)m * CPU_QP_ROWS,
                   (size_t)tail * sizeof(float));
    }
}

void cpu_qmatmul(const cpu_kernels *k, ember_dtype t, const void *w, bool packed, int nn, const void *xa,
                 size_t xa_row, int mm, int K, float *out, size_t ldo, void *scratch) {
    cpu_qgemm_packed_fn pf = k->qgemm_packed[t];
    if (!pf) {
        cpu_qgemm_fn_t fn = k->qgemm[t] ? k->qgemm[t] : cpu_qgemm_generic(t);
        fn(w, cpu_row_bytes(t, K), nn, xa, xa_row, mm, K, out, ldo);
        return;
    }
    const qmm_kern q = {.pf = pf, .xa = xa, .xa_row = xa_row, .mm = mm, .K = K};
    qmm_groups(&q, t, w, packed, nn, out, ldo, scratch);
}

void cpu_qmatmul_tiled(const cpu_kernels *k, ember_dtype t, const void *w, bool packed, int nn, const void *xt, int mm,
                       int K, float *out, size_t ldo, void *scratch) {
    const qmm_kern q = {.tf = k->qgemm_tiled[t], .xt = xt, .mm = mm, .K = K};
    qmm_groups(&q, t, w, packed, nn, out, ldo, scratch);
}

size_t cpu_act32_tiled_bytes(int mm, int K) {
    return (size_t)((mm + 15) / 16) * (size_t)(K / 32) * sizeof(cpu_act32_tile);
}

void cpu_act32_tile_blocks(const void *act, size_t arow, int K, int mm, int tile, int b0, int b1, void *xt) {
    const int nb = K / 32, r0 = tile * 16, n = mm - r0 < 16 ? mm - r0 : 16;
    cpu_act32_tile *t = (cpu_act32_tile *)xt + (size_t)tile * (size_t)nb;
    const unsigned char *a = (const unsigned char *)act + (size_t)r0 * arow;
    for (int b = b0; b < b1; b++) {
        const unsigned char *ab = a + (size_t)b * sizeof(cpu_act32);
        for (int r = 0; r < n; r++, ab += arow) {
            memcpy(&t[b].d[r], ab + offsetof(cpu_act32, d), sizeof(float));
            memcpy(t[b].q[r], ab + offsetof(cpu_act32, q), 32);
        }
        if (n < 16) {
            memset(&t[b].d[n], 0, (size_t)(16 - n) * sizeof(float));
            memset(t[b].q[n], 0, (size_t)(16 - n) * 32);
        }
    }
}

/* ---- canonical dot products ---------------------------------------------------------- */

static float dot32(ember_dtype t, const unsigned char *w, const unsigned char *ya, int nb) {
    const size_t bb = ember_dtype_get(t)->block_bytes;
    const bool has_min = t == EMBER_Q4_1 || t == EMBER_Q5_1;
    float acc = 0.0f;
    for (int b = 0; b < nb; b++, w += bb, ya += sizeof(cpu_act32)) {
        cpu_act32 y;
        memcpy(&y, ya, sizeof y);
        int lv[32];
        levels32(t, w, lv);
        int32_t s = 0;
        for (int e = 0; e < 32; e++) s += lv[e] * y.q[e];
        acc = fmaf(cpu_h2f(w) * y.d, (float)s, acc);
        if (has_min) acc = fmaf(cpu_h2f(w + 2), y.ds, acc);
    }
    return acc;
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
                s2 += m * y.bs32[j];
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
                    KIND == 32 ? dot32(T, wr, x, K / 32) : dot256(T, wr, x, K / 256);                            \
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
