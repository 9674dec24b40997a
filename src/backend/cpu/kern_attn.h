/*
 * kern_attn.h - attention over paged KV blocks, written once for every ISA.
 *
 * Included by kern_scalar.c, kern_avx2.c and kern_avx512.c after the vec16
 * primitives of kern_template.h and these:
 *   v_set1(f)          every lane f
 *   v_mul(a, b)        per lane
 *   v_max(a, b)        per lane
 *   v_hmax(v)          the largest lane
 *   v_store(p, v)      16 floats
 *   v_load_u8(p)       16 bytes as floats 0..255
 *   v_load_u4x2(p, &lo, &hi)  the low and the high nibbles of 16 bytes as floats
 *   v_exp(v)           e^x per lane (inputs >= -87 give results > 0)
 *   v_nib16(p)         16 nibbles of 8 bytes (low nibble first) as floats
 *   v_lut4(p, t)       t[nibble] for the 16 nibbles of 8 bytes, t [16]
 *   v_lut8(p, t)       t[byte] for 16 bytes, t [256]
 *   v_wht16(v)         the unnormalized 16-point Walsh-Hadamard transform
 *   ATTN_NH            query heads whose score vectors stay in registers
 *
 * One call runs a part of the keys of one KV head for its `rep` query heads
 * (grouped-query attention) and leaves the part's softmax state: per query
 * head the max m of its scores, the sum l of e^(s - m) and acc = sum e^(s -
 * m) v. A part is at most one span of 512 keys (cpu_backend.c), decided by
 * the caller from absolute positions only, so a token's arithmetic never
 * depends on its batch, its chunk or the thread count. Within a part:
 *   1. scores, block by block: K blocks are transposed ([D][16]), so a
 *      score vector of 16 keys is D fused multiply-adds of one key
 *      dimension against the broadcast query value, each column decoded
 *      once (in registers: f16, bf16, affine with its channel statistics;
 *      through the codebook: TQ) for every query head of the group;
 *   2. per head: the max, e^(s - max), their sum;
 *   3. V, block by block: rows decoded once per block into a scratch
 *      [16][Dp] (Dp = D rounded up to 16, zero tail), then each output
 *      chunk of 16 accumulated over the block's keys in order, ATTN_NH heads
 *      at a time in registers.
 */
#include <math.h>

#include "backend/kv_codec.h"

/* The most keys one part may have, and the row stride of the score scratch
   (a part starting mid-block spans one more block). */
#define ATTN_PART_MAX 512
#define ATTN_SC_STRIDE (ATTN_PART_MAX + 16)

/* The 16 codes of one dimension of a TQ K piece (2b bytes, slot i at bit
   i * b), through the codebook. */
static inline vec16 tq_column(const unsigned char *p, int bits, const float *cb, float *tmp) {
    if (bits == 4) return v_lut4(p, cb);
    if (bits == 8) return v_lut8(p, cb);
    for (int i = 0; i < 16; i++) {
        size_t bit = (size_t)i * (size_t)bits;
        unsigned v = p[bit / 8], sh = (unsigned)(bit % 8);
        if (sh + (unsigned)bits > 8) v |= (unsigned)p[bit / 8 + 1] << 8;
        tmp[i] = cb[(v >> sh) & ((1u << bits) - 1)];
    }
    return v_load_f32(tmp);
}

/* Decodes the V rows [i0, i1) of a piece into vd[i][Dp] (zero tail). */
static void v_rows(const ember_kv_codec *c, int D, int Dp, const unsigned char *vp, int i0, int i1, float *vd) {
    for (int i = i0; i < i1; i++) {
        float *o = vd + (size_t)i * (size_t)Dp;
        int d = 0;
        switch (c->enc) {
        case EMBER_KVE_F32: memcpy(o, (const float *)(const void *)vp + (size_t)i * (size_t)D, (size_t)D * 4); break;
        case EMBER_KVE_F16:
        case EMBER_KVE_BF16: {
            const uint16_t *h = (const uint16_t *)(const void *)vp + (size_t)i * (size_t)D;
            for (; d + 16 <= D; d += 16)
                v_store(o + d, c->enc == EMBER_KVE_F16 ? v_load_f16(h + d) : v_load_bf16(h + d));
            for (; d < D; d++) {
                uint16_t u;
                memcpy(&u, h + d, 2);
                o[d] = c->enc == EMBER_KVE_F16 ? ember_f16_to_f32(u) : ember_bf16_to_f32(u);
            }
            break;
        }
        case EMBER_KVE_Q8:
        case EMBER_KVE_Q4: {
            const bool q8 = c->enc == EMBER_KVE_Q8;
            const int G = c->group, ng = D / G;
            const unsigned char *sc = vp + (size_t)16 * (size_t)(q8 ? D : D / 2);
            const unsigned char *bi = sc + (size_t)16 * (size_t)ng * 2;
            const unsigned char *row = vp + (size_t)i * (size_t)(q8 ? D : D / 2);
            for (int g = 0; g < ng; g++) {
                uint16_t hs, hb;
                memcpy(&hs, sc + ((size_t)g * 16 + (size_t)i) * 2, 2);
                memcpy(&hb, bi + ((size_t)g * 16 + (size_t)i) * 2, 2);
                float s = ember_f16_to_f32(hs), b = ember_f16_to_f32(hb);
                d = g * G;
                if (G % 16 == 0) {
                    vec16 vs = v_set1(s), vb = v_set1(b);
                    for (; d < (g + 1) * G; d += 16)
                        v_store(o + d, v_fma(vb, vs, q8 ? v_load_u8(row + d) : v_nib16(row + d / 2)));
                } else {
                    for (; d < (g + 1) * G; d++) {
                        unsigned q = q8 ? row[d] : (row[d / 2] >> ((unsigned)(d & 1) * 4)) & 0xfu;
                        o[d] = b + s * (float)q; /* groups under 16 (tiny heads) only */
                    }
                }
            }
            d = D;
            break;
        }
        case EMBER_KVE_TQ: {
            const int bits = c->bits;
            const size_t rb = ((size_t)D * (size_t)bits + 7) / 8;
            const unsigned char *row = vp + (size_t)i * rb;
            uint16_t hs;
            memcpy(&hs, vp + (size_t)16 * rb + (size_t)i * 2, 2);
            float s = ember_f16_to_f32(hs);
            if ((bits == 4 || bits == 8) && D % 16 == 0) {
                vec16 vs = v_set1(s);
                for (; d < D; d += 16)
                    v_store(o + d, v_mul(vs, bits == 4 ? v_lut4(row + d / 2, c->codebook) : v_lut8(row + d, c->codebook)));
            }
            for (; d < D; d++) {
                size_t bit = (size_t)d * (size_t)bits;
                unsigned v = row[bit / 8], sh = (unsigned)(bit % 8);
                if (sh + (unsigned)bits > 8) v |= (unsigned)row[bit / 8 + 1] << 8;
                o[d] = s * c->codebook[(v >> sh) & ((1u << bits) - 1)];
            }
            break;
        }
        }
        for (d = D; d < Dp; d++) o[d] = 0;
    }
}

/* Blocks ahead whose K (V) piece is asked for while one block is worked on:
   a row's blocks are scattered over the pool (each a layer-and-head piece
   of a block holding every layer), so the hardware prefetchers see no
   stride, and each block would otherwise start with a miss to memory. */
#define ATTN_PREFETCH 2

/* Asks for the n bytes at p in the cache, a line at a time. */
static inline void prefetch_piece(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i += 64) __builtin_prefetch(p + i);
    if (n) __builtin_prefetch(p + n - 1);
}

/* The channel statistics of a normalizing K piece: mu and sigma (0 read as 1). */
static inline void k_norm(const unsigned char *norm, int D, float *mu, float *sg) {
    int d = 0;
    for (; d + 16 <= D; d += 16) {
        v_store(mu + d, v_load_f16((const uint16_t *)(const void *)(norm + 2 * (size_t)d)));
        v_store(sg + d, v_load_f16((const uint16_t *)(const void *)(norm + 2 * ((size_t)D + (size_t)d))));
    }
    for (; d < D; d++) {
        uint16_t hm, hs;
        memcpy(&hm, norm + 2 * (size_t)d, 2);
        memcpy(&hs, norm + 2 * ((size_t)D + (size_t)d), 2);
        mu[d] = ember_f16_to_f32(hm);
        sg[d] = ember_f16_to_f32(hs);
    }
    for (d = 0; d < D; d++)
        if (sg[d] == 0) sg[d] = 1.0f; /* stored 0: no statistics */
}

#define K_HEADS(kd)                                                                                                    \
    do {                                                                                                               \
        _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++) acc[h] =                                                  \
            v_fma(acc[h], v_set1(q[(size_t)h * ldq + (size_t)d]), (kd));                                              \
    } while (0)

/* Score vectors of NH query heads (q + h * ldq) against the 16 keys of a
   K piece: s[h] = sum_d q[h][d] * K[d][:], in increasing d. Affine keys
   are decoded as sigma_d (scale code + bias) + mu_d (kmu, ksg: the block's
   statistics); TQ keys give codebook values (the caller rotates q). */
ALWAYS_INLINE void k_scores(const ember_kv_codec *c, int D, const unsigned char *kp, const float *kmu,
                            const float *ksg, const float *q, size_t ldq, vec16 *s, const int NH, float *tmp) {
    vec16 acc[ATTN_NH];
#pragma GCC unroll 8
    for (int h = 0; h < NH; h++) acc[h] = v_zero();
    switch (c->enc) {
    case EMBER_KVE_F32:
        for (int d = 0; d < D; d++) K_HEADS(v_load_f32((const float *)(const void *)kp + (size_t)d * 16));
        break;
    case EMBER_KVE_F16:
        for (int d = 0; d < D; d++) K_HEADS(v_load_f16((const uint16_t *)(const void *)kp + (size_t)d * 16));
        break;
    case EMBER_KVE_BF16:
        for (int d = 0; d < D; d++) K_HEADS(v_load_bf16((const uint16_t *)(const void *)kp + (size_t)d * 16));
        break;
    case EMBER_KVE_Q8:
    case EMBER_KVE_Q4: {
        const bool q8 = c->enc == EMBER_KVE_Q8;
        const int G = c->group;
        const unsigned char *sc = kp + (size_t)16 * (size_t)(q8 ? D : D / 2);
        const unsigned char *bi = sc + (size_t)16 * (size_t)(D / G) * 2;
        for (int g = 0; g < D / G; g++) {
            vec16 vs = v_load_f16((const uint16_t *)(const void *)(sc + (size_t)g * 32));
            vec16 vb = v_load_f16((const uint16_t *)(const void *)(bi + (size_t)g * 32));
            if (q8) {
                for (int d = g * G; d < (g + 1) * G; d++)
                    K_HEADS(v_fma(v_set1(kmu[d]), v_fma(vb, vs, v_load_u8(kp + (size_t)d * 16)), v_set1(ksg[d])));
            } else { /* one 16-byte load holds dimensions d (low nibbles) and d + 1 (high) */
                for (int d = g * G; d < (g + 1) * G; d += 2) {
                    vec16 lo, hi;
                    v_load_u4x2(kp + (size_t)(d / 2) * 16, &lo, &hi);
                    K_HEADS(v_fma(v_set1(kmu[d]), v_fma(vb, vs, lo), v_set1(ksg[d])));
                    d++;
                    K_HEADS(v_fma(v_set1(kmu[d]), v_fma(vb, vs, hi), v_set1(ksg[d])));
                    d--;
                }
            }
        }
        break;
    }
    case EMBER_KVE_TQ:
        for (int d = 0; d < D; d++)
            K_HEADS(tq_column(kp + (size_t)d * 2 * (size_t)c->bits, c->bits, c->codebook, tmp));
        break;
    }
#pragma GCC unroll 8
    for (int h = 0; h < NH; h++) s[h] = acc[h];
}

static inline void k_scores_n(const ember_kv_codec *c, int D, const unsigned char *kp, const float *kmu,
                              const float *ksg, const float *q, size_t ldq, vec16 *s, int nh, float *tmp) {
    switch (nh) {
#if ATTN_NH >= 8
    case 8: k_scores(c, D, kp, kmu, ksg, q, ldq, s, 8, tmp); break;
    case 7: k_scores(c, D, kp, kmu, ksg, q, ldq, s, 7, tmp); break;
    case 6: k_scores(c, D, kp, kmu, ksg, q, ldq, s, 6, tmp); break;
    case 5: k_scores(c, D, kp, kmu, ksg, q, ldq, s, 5, tmp); break;
#endif
    case 4: k_scores(c, D, kp, kmu, ksg, q, ldq, s, 4, tmp); break;
    case 3: k_scores(c, D, kp, kmu, ksg, q, ldq, s, 3, tmp); break;
    case 2: k_scores(c, D, kp, kmu, ksg, q, ldq, s, 2, tmp); break;
    default: k_scores(c, D, kp, kmu, ksg, q, ldq, s, 1, tmp); break;
    }
}

/* One 16-wide chunk (dims c..c+15) of V row i, in the units the
   accumulation uses: values (f32, f16, bf16), codes (affine), codebook
   values (TQ; the caller's rows are rotated). */
ALWAYS_INLINE vec16 v_chunk(const unsigned char *vp, int D, int enc, int bits, const float *cb, int i, int c) {
    switch (enc) {
    case EMBER_KVE_F32: return v_load_f32((const float *)(const void *)vp + (size_t)i * (size_t)D + (size_t)c);
    case EMBER_KVE_F16: return v_load_f16((const uint16_t *)(const void *)vp + (size_t)i * (size_t)D + (size_t)c);
    case EMBER_KVE_BF16: return v_load_bf16((const uint16_t *)(const void *)vp + (size_t)i * (size_t)D + (size_t)c);
    case EMBER_KVE_Q8: return v_load_u8(vp + (size_t)i * (size_t)D + (size_t)c);
    case EMBER_KVE_Q4: return v_nib16(vp + (size_t)i * (size_t)(D / 2) + (size_t)(c / 2));
    default: /* TQ, 4 or 8 bits */
        return bits == 4 ? v_lut4(vp + (size_t)i * (size_t)(D / 2) + (size_t)(c / 2), cb)
                         : v_lut8(vp + (size_t)i * (size_t)D + (size_t)c, cb);
    }
}

/* acc[h0 + h][c] += sum over keys i in [i0, i1) of w[h * ws + g * 16 + i] *
   row_i[c] (g = c / G, the chunk's group), keys in order, for NH heads at
   once: each chunk's accumulators stay in registers, each row chunk is
   loaded (and decoded) once for all NH heads. Rows are D apart (in values). */
ALWAYS_INLINE void v_accum(float *acc, int Dp, const float *w, size_t ws, int G, const unsigned char *vp, int D,
                           int enc, int bits, const float *cb, int i0, int i1, int h0, const int NH) {
    for (int c = 0; c < Dp; c += 16) {
        vec16 x[ATTN_NH];
        const float *wg = w + (size_t)(c / G) * 16;
#pragma GCC unroll 8
        for (int h = 0; h < NH; h++) x[h] = v_load_f32(acc + (size_t)(h0 + h) * (size_t)Dp + (size_t)c);
        for (int i = i0; i < i1; i++) {
            vec16 v = v_chunk(vp, D, enc, bits, cb, i, c);
#pragma GCC unroll 8
            for (int h = 0; h < NH; h++) x[h] = v_fma(x[h], v_set1(wg[(size_t)h * ws + (size_t)i]), v);
        }
#pragma GCC unroll 8
        for (int h = 0; h < NH; h++) v_store(acc + (size_t)(h0 + h) * (size_t)Dp + (size_t)c, x[h]);
    }
}

/* v_accum with the encoding and NH as constants: the compiler then takes
   the row decode out of the inner loop. */
#define V_ACCUM_NH(E)                                                                                                  \
    switch (nh) {                                                                                                      \
    case 8: v_accum(acc, Dp, w, ws, G, vp, D, E, bits, cb, i0, i1, h0, ATTN_NH >= 8 ? 8 : 1); break;                   \
    case 7: v_accum(acc, Dp, w, ws, G, vp, D, E, bits, cb, i0, i1, h0, ATTN_NH >= 8 ? 7 : 1); break;                   \
    case 6: v_accum(acc, Dp, w, ws, G, vp, D, E, bits, cb, i0, i1, h0, ATTN_NH >= 8 ? 6 : 1); break;                   \
    case 5: v_accum(acc, Dp, w, ws, G, vp, D, E, bits, cb, i0, i1, h0, ATTN_NH >= 8 ? 5 : 1); break;                   \
    case 4: v_accum(acc, Dp, w, ws, G, vp, D, E, bits, cb, i0, i1, h0, 4); break;                                      \
    case 3: v_accum(acc, Dp, w, ws, G, vp, D, E, bits, cb, i0, i1, h0, 3); break;                                      \
    case 2: v_accum(acc, Dp, w, ws, G, vp, D, E, bits, cb, i0, i1, h0, 2); break;                                      \
    default: v_accum(acc, Dp, w, ws, G, vp, D, E, bits, cb, i0, i1, h0, 1); break;                                     \
    }

static void v_accum_n(float *acc, int Dp, const float *w, size_t ws, int G, const unsigned char *vp, int D, int enc,
                      int bits, const float *cb, int i0, int i1, int h0, int nh) {
    switch (enc) {
    case EMBER_KVE_F32: V_ACCUM_NH(EMBER_KVE_F32); break;
    case EMBER_KVE_F16: V_ACCUM_NH(EMBER_KVE_F16); break;
    case EMBER_KVE_BF16: V_ACCUM_NH(EMBER_KVE_BF16); break;
    case EMBER_KVE_Q8: V_ACCUM_NH(EMBER_KVE_Q8); break;
    case EMBER_KVE_Q4: V_ACCUM_NH(EMBER_KVE_Q4); break;
    default:
        if (bits == 4) {
            V_ACCUM_NH(EMBER_KVE_TQ);
        } else {
            V_ACCUM_NH(EMBER_KVE_TQ);
        }
        break;
    }
}

/* x = R x for the TQ rotation (ember_tq_rotate's transform, summed in
   another order): per power-of-two segment, the sign flips, the 16-point
   transforms in registers (v_wht16), the stages across registers, then
   1 / sqrt(n). Segments under 16 go through ember_tq_rotate. */
static void tq_rotate_q(const float *signs, int D, float *x) {
    for (int off = 0; off < D;) {
        int n = 1;
        while (n * 2 <= D - off) n *= 2;
        if (n < 16) {
            ember_tq_rotate(signs + off, D - off, x + off, x + off);
            break;
        }
        float *y = x + off;
        for (int i = 0; i < n; i += 16)
            v_store(y + i, v_wht16(v_mul(v_load_f32(y + i), v_load_f32(signs + off + i))));
        for (int h = 16; h < n; h *= 2)
            for (int i = 0; i < n; i += 2 * h)
                for (int j = i; j < i + h; j += 16) {
                    vec16 a = v_load_f32(y + j), b = v_load_f32(y + j + h);
                    v_store(y + j, v_fma(a, b, v_set1(1.0f)));
                    v_store(y + j + h, v_fma(a, b, v_set1(-1.0f)));
                }
        vec16 sc = v_set1(1.0f / sqrtf((float)n));
        for (int i = 0; i < n; i += 16) v_store(y + i, v_mul(v_load_f32(y + i), sc));
        off += n;
    }
}

/*
 * The attention part of keys [j0, j1) (j0 < j1, at most ATTN_PART_MAX keys
 * inside one span) for `rep` query heads q[rep][D]. m, l: [rep], acc:
 * [rep][Dp], all overwritten. scratch: attn_scratch floats (cpu_backend.c):
 * vd [16][Dp], tmp [32], sc [rep][ATTN_PART_MAX + 16], qn [rep][D], kmu [D],
 * ksg [D], qoff [rep], w [rep][Dp], bsum [rep][Dp].
 */
static void CAT(KPREFIX, attn_part)(const cpu_attn_part *a, int j0, int j1, float *m, float *l, float *acc,
                                    float *scratch) {
    const int D = a->D, Dp = (D + 15) & ~15, rep = a->rep;
    const ember_kv_codec *kc = a->kc, *vc = a->vc;
    const int b0 = j0 / 16, b1 = (j1 - 1) / 16, nb = b1 - b0 + 1, W = nb * 16; /* blocks of the part */
    float *vd = scratch, *tmp = vd + (size_t)16 * (size_t)Dp, *sc = tmp + 32;
    float *qn = sc + (size_t)rep * ATTN_SC_STRIDE, *kmu = qn + (size_t)rep * (size_t)D, *ksg = kmu + D,
          *qoff = ksg + D;
    const bool tq_k = kc->enc == EMBER_KVE_TQ;
    const size_t knorm_off = ember_kv_norm_offset(kc, D);
    /* 1. scores: sc[h][k] for key b0 * 16 + k */
    const size_t kbytes = ember_kv_head_bytes(kc, D, true), vbytes = ember_kv_head_bytes(vc, D, false);
    for (int b = b0; b <= b1; b++) {
        const unsigned char *kp = a->pool + (size_t)a->blocks[b - a->first] * a->block_bytes + a->k_off;
        if (b + ATTN_PREFETCH <= b1) /* a row's blocks lie anywhere in the pool: no stride for the hardware */
            prefetch_piece(a->pool + (size_t)a->blocks[b + ATTN_PREFETCH - a->first] * a->block_bytes + a->k_off, kbytes);
        const float *qb = a->q;
        if (knorm_off) k_norm(kp + knorm_off, D, kmu, ksg);
        if (tq_k) { /* q . (sigma R^T y + mu) = R (q sigma) . y + q . mu, per block */
            for (int h = 0; h < rep; h++) {
                const float *qh = a->q + (size_t)h * (size_t)D;
                float *o = qn + (size_t)h * (size_t)D;
                if (D % 16 == 0) {
                    vec16 cq = v_zero();
                    for (int d = 0; d < D; d += 16) {
                        vec16 x = v_load_f32(qh + d);
                        v_store(o + d, v_mul(x, v_load_f32(ksg + d)));
                        cq = v_fma(cq, x, v_load_f32(kmu + d));
                    }
                    qoff[h] = v_hsum(cq);
                } else {
                    float cq = 0;
                    for (int d = 0; d < D; d++) {
                        o[d] = qh[d] * ksg[d];
                        cq += qh[d] * kmu[d];
                    }
                    qoff[h] = cq;
                }
                tq_rotate_q(kc->signs, D, o);
            }
            qb = qn;
        }
        for (int h0 = 0; h0 < rep; h0 += ATTN_NH) {
            int nh = rep - h0 < ATTN_NH ? rep - h0 : ATTN_NH;
            vec16 s[ATTN_NH];
            k_scores_n(kc, D, kp, kmu, ksg, qb + (size_t)h0 * (size_t)D, (size_t)D, s, nh, tmp);
            for (int hh = 0; hh < nh; hh++) {
                int h = h0 + hh;
                vec16 x = s[hh];
                if (tq_k) { /* the keys' scales, then the mean's part */
                    x = v_mul(x, v_load_f16((const uint16_t *)(const void *)(kp + (size_t)D * 2 * (size_t)kc->bits)));
                    x = v_fma(x, v_set1(qoff[h]), v_set1(1.0f));
                }
                float *o = sc + (size_t)h * ATTN_SC_STRIDE + (size_t)(b - b0) * 16;
                v_store(o, v_mul(x, v_set1(a->scale)));
                if (a->softcap > 0)
                    for (int i = 0; i < 16; i++) o[i] = tanhf(o[i] / a->softcap) * a->softcap;
            }
        }
    }
    /* 2. per head: max, e^(s - max) (0 outside [j0, j1)), sum */
    const int lo = j0 - b0 * 16, hi = j1 - b0 * 16; /* valid range inside sc rows */
    for (int h = 0; h < rep; h++) {
        float *row = sc + (size_t)h * ATTN_SC_STRIDE;
        for (int i = 0; i < lo; i++) row[i] = -INFINITY;
        for (int i = hi; i < W; i++) row[i] = -INFINITY;
        vec16 mx = v_load_f32(row);
        for (int k = 16; k < W; k += 16) mx = v_max(mx, v_load_f32(row + k));
        float mh = v_hmax(mx);
        vec16 vm = v_set1(-mh), sum = v_zero();
        for (int k = 0; k < W; k += 16) {
            vec16 e = v_exp(v_fma(vm, v_load_f32(row + k), v_set1(1.0f)));
            v_store(row + k, e);
        }
        for (int i = 0; i < lo; i++) row[i] = 0; /* exp(-inf) clamps: the masked keys weigh nothing */
        for (int i = hi; i < W; i++) row[i] = 0;
        for (int k = 0; k < W; k += 16) sum = v_fma(sum, v_load_f32(row + k), v_set1(1.0f));
        m[h] = mh;
        l[h] = v_hsum(sum);
    }
    /* 3. V. Affine rows are s_i code_i + b_i per group: the weights become
       p_i s_i and the bias term sum_i p_i b_i is added per group at the end;
       TQ rows are s_i codebook[code_i] (rotated back by the caller). Tiny
       or odd shapes go through decoded rows. */
    memset(acc, 0, (size_t)rep * (size_t)Dp * sizeof *acc);
    const bool affine_v = vc->enc == EMBER_KVE_Q8 || vc->enc == EMBER_KVE_Q4;
    const bool direct = D % 16 == 0 && (vc->enc <= EMBER_KVE_BF16 || (affine_v && vc->group % 16 == 0) ||
                                        (vc->enc == EMBER_KVE_TQ && (vc->bits == 4 || vc->bits == 8)));
    const int G = affine_v && direct ? vc->group : Dp, ng = Dp / G;
    float *w = qoff + rep, *bsum = w + (size_t)rep * (size_t)Dp; /* w, bsum: [rep][ng][16] */
    if (direct && affine_v)
        for (int k = 0; k < rep * ng * 16; k++) bsum[k] = 0;
    for (int b = b0; b <= b1; b++) {
        const unsigned char *vp = a->pool + (size_t)a->blocks[b - a->first] * a->block_bytes + a->v_off;
        if (b + ATTN_PREFETCH <= b1)
            prefetch_piece(a->pool + (size_t)a->blocks[b + ATTN_PREFETCH - a->first] * a->block_bytes + a->v_off, vbytes);
        int i0 = b == b0 ? lo : 0, i1 = b == b1 ? hi - (b1 - b0) * 16 : 16;
        const float *pk = sc + (size_t)(b - b0) * 16;
        if (!direct) { /* decoded rows, as f32 Dp apart; the scores are the weights */
            v_rows(vc, D, Dp, vp, i0, i1, vd);
            for (int h0 = 0; h0 < rep; h0 += ATTN_NH)
                v_accum_n(acc, Dp, pk + (size_t)h0 * ATTN_SC_STRIDE, ATTN_SC_STRIDE, Dp, (const unsigned char *)vd, Dp,
                          EMBER_KVE_F32, 0, NULL, i0, i1, h0, rep - h0 < ATTN_NH ? rep - h0 : ATTN_NH);
            continue;
        }
        const float *wk = pk;
        size_t ws = ATTN_SC_STRIDE;
        if (affine_v || vc->enc == EMBER_KVE_TQ) { /* weights p_i s_i per group */
            const size_t cbytes = vc->enc == EMBER_KVE_Q8 ? (size_t)16 * (size_t)D
                                  : vc->enc == EMBER_KVE_TQ ? (size_t)2 * (size_t)D * (size_t)vc->bits
                                                            : (size_t)8 * (size_t)D;
            const uint16_t *vs = (const uint16_t *)(const void *)(vp + cbytes);
            for (int h = 0; h < rep; h++) {
                vec16 p = v_load_f32(pk + (size_t)h * ATTN_SC_STRIDE);
                for (int g = 0; g < ng; g++) {
                    v_store(w + ((size_t)h * (size_t)ng + (size_t)g) * 16, v_mul(p, v_load_f16(vs + (size_t)g * 16)));
                    if (affine_v) { /* the bias term p_i b_i, valid keys only, summed lane-wise */
                        vec16 pb = v_mul(p, v_load_f16(vs + (size_t)(ng + g) * 16));
                        if (i0 > 0 || i1 < 16) {
                            v_store(tmp, pb);
                            for (int i = 0; i < 16; i++)
                                if (i < i0 || i >= i1) tmp[i] = 0;
                            pb = v_load_f32(tmp);
                        }
                        float *bs = bsum + ((size_t)h * (size_t)ng + (size_t)g) * 16;
                        v_store(bs, v_fma(v_load_f32(bs), pb, v_set1(1.0f)));
                    }
                }
            }
            wk = w;
            ws = (size_t)ng * 16;
        }
        for (int h0 = 0; h0 < rep; h0 += ATTN_NH)
            v_accum_n(acc, Dp, wk + (size_t)h0 * ws, ws, G, vp, D, vc->enc, vc->bits, vc->codebook, i0, i1, h0,
                      rep - h0 < ATTN_NH ? rep - h0 : ATTN_NH);
    }
    if (direct && affine_v)
        for (int h = 0; h < rep; h++)
            for (int g = 0; g < ng; g++) {
                vec16 bv = v_set1(v_hsum(v_load_f32(bsum + ((size_t)h * (size_t)ng + (size_t)g) * 16)));
                for (int c = g * G; c < (g + 1) * G; c += 16) {
                    float *o = acc + (size_t)h * (size_t)Dp + (size_t)c;
                    v_store(o, v_fma(v_load_f32(o), bv, v_set1(1.0f)));
                }
            }
}
