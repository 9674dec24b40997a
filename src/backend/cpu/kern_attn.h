/*
 * kern_attn.h - attention over paged KV blocks, written once for every ISA.
 *
 * Included by kern_scalar.c, kern_avx2.c and kern_avx512.c after the vec16
 * primitives of kern_template.h and these:
 *   v_set1(f)          every lane f
 *   v_mul(a, b)        per lane
 *   v_max(a, b)        per lane
 *   v_store(p, v)      16 floats
 *   v_load_u8(p)       16 bytes as floats 0..255
 *   v_load_u4(p, hi)   the low (hi = 0) or high nibbles of 16 bytes as floats
 *   v_exp(v)           e^x per lane (inputs >= -87 give results > 0)
 *
 * One call runs a part of the keys of one KV head for its `rep` query heads
 * (grouped-query attention) and leaves the part's softmax state: per query
 * head the running max m, the sum l of e^(s - m) and acc = sum e^(s - m) v.
 * Keys go block by block (16 positions, one vector of scores per head), in
 * increasing position, with the online-softmax update; which keys form a
 * part is decided by the caller from absolute positions only, so a token's
 * arithmetic never depends on its batch, its chunk or the thread count.
 *
 * K blocks are transposed ([D][16]): a score vector is D fused multiply-adds
 * of one key dimension broadcast from the query against 16 keys, shared by
 * every query head of the group. V rows are decoded once per block into a
 * scratch [16][Dp] (Dp = D rounded up to 16, zero tail) and accumulated.
 * Quantized blocks are read directly: each vector is decoded in registers
 * (affine) or through the codebook (TQ) as it is used.
 */
#include <math.h>

#include "backend/kv_codec.h"

#define ATTN_NH 4 /* query heads whose score vectors stay in registers together */

/* The 16 keys' values of dimension d of a K piece, as floats. */
ALWAYS_INLINE vec16 k_column(const ember_kv_codec *c, int D, const unsigned char *kp, int d, float *tmp) {
    switch (c->enc) {
    case EMBER_KVE_F32: return v_load_f32((const float *)(const void *)kp + (size_t)d * 16);
    case EMBER_KVE_F16: return v_load_f16((const uint16_t *)(const void *)kp + (size_t)d * 16);
    case EMBER_KVE_BF16: return v_load_bf16((const uint16_t *)(const void *)kp + (size_t)d * 16);
    case EMBER_KVE_Q8:
    case EMBER_KVE_Q4: {
        const bool q8 = c->enc == EMBER_KVE_Q8;
        const unsigned char *sc = kp + (size_t)16 * (size_t)(q8 ? D : D / 2);
        const unsigned char *bi = sc + (size_t)16 * (size_t)(D / c->group) * 2;
        int g = d / c->group;
        vec16 code = q8 ? v_load_u8(kp + (size_t)d * 16) : v_load_u4(kp + (size_t)(d / 2) * 16, d & 1);
        vec16 s = v_load_f16((const uint16_t *)(const void *)(sc + (size_t)g * 32));
        vec16 b = v_load_f16((const uint16_t *)(const void *)(bi + (size_t)g * 32));
        return v_fma(b, s, code);
    }
    case EMBER_KVE_TQ: {
        const int bits = c->bits;
        const unsigned char *p = kp + (size_t)d * 2 * (size_t)bits;
        for (int i = 0; i < 16; i++) {
            size_t bit = (size_t)i * (size_t)bits;
            unsigned v = p[bit / 8], sh = (unsigned)(bit % 8);
            if (sh + (unsigned)bits > 8) v |= (unsigned)p[bit / 8 + 1] << 8;
            tmp[i] = c->codebook[(v >> sh) & ((1u << bits) - 1)];
        }
        return v_load_f32(tmp);
    }
    }
    return v_zero();
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
                memcpy(&hs, sc + ((size_t)i * (size_t)ng + (size_t)g) * 2, 2);
                memcpy(&hb, bi + ((size_t)i * (size_t)ng + (size_t)g) * 2, 2);
                float s = ember_f16_to_f32(hs), b = ember_f16_to_f32(hb);
                d = g * G;
                if (q8 && G % 16 == 0) {
                    vec16 vs = v_set1(s), vb = v_set1(b);
                    for (; d < (g + 1) * G; d += 16) v_store(o + d, v_fma(vb, vs, v_load_u8(row + d)));
                } else {
                    for (; d < (g + 1) * G; d++) {
                        unsigned q = q8 ? row[d] : (row[d / 2] >> ((unsigned)(d & 1) * 4)) & 0xfu;
                        o[d] = b + s * (float)q; /* the vector path's fma(b, s, q), rounded once */
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

/* Score vectors of NH query heads (q + h * ldq) against the 16 keys of a
   K piece: s[h] = sum_d q[h][d] * K[d][:], in increasing d. */
ALWAYS_INLINE void k_scores(const ember_kv_codec *c, int D, const unsigned char *kp, const float *q, size_t ldq,
                            vec16 *s, const int NH, float *tmp) {
    vec16 acc[ATTN_NH];
#pragma GCC unroll 4
    for (int h = 0; h < NH; h++) acc[h] = v_zero();
    for (int d = 0; d < D; d++) {
        vec16 kd = k_column(c, D, kp, d, tmp);
#pragma GCC unroll 4
        for (int h = 0; h < NH; h++) acc[h] = v_fma(acc[h], v_set1(q[(size_t)h * ldq + (size_t)d]), kd);
    }
#pragma GCC unroll 4
    for (int h = 0; h < NH; h++) s[h] = acc[h];
}

/*
 * The attention part of keys [j0, j1) (j0 < j1; j0 % 16 == 0 unless it is
 * the window's first key) for `rep` query heads q[rep][D]. m, l: [rep], acc: [rep][Dp], all overwritten. scratch: at least
 * attn_scratch floats (cpu_backend.c).
 */
static void CAT(KPREFIX, attn_part)(const cpu_attn_part *a, int j0, int j1, float *m, float *l, float *acc,
                                    float *scratch) {
    const int D = a->D, Dp = (D + 15) & ~15, rep = a->rep;
    const ember_kv_codec *kc = a->kc, *vc = a->vc;
    /* scratch: vd [16][Dp], tmp [32], then for normalized K qn [rep][D], qoff [rep], kmu [D], ksg [D] */
    float *vd = scratch, *tmp = scratch + (size_t)16 * (size_t)Dp;
    float *qn = tmp + 32, *qoff = qn + (size_t)rep * (size_t)D, *kmu = qoff + rep, *ksg = kmu + D;
    const bool norm_k = kc->enc == EMBER_KVE_Q8 || kc->enc == EMBER_KVE_Q4 || kc->enc == EMBER_KVE_TQ;
    const size_t knorm_off = ember_kv_norm_offset(kc, D);
    for (int h = 0; h < rep; h++) {
        m[h] = -INFINITY;
        l[h] = 0;
    }
    memset(acc, 0, (size_t)rep * (size_t)Dp * sizeof *acc);
    for (int j = j0; j < j1;) {
        int bi = j / 16, i0 = j % 16, i1 = j1 - bi * 16 < 16 ? j1 - bi * 16 : 16;
        const unsigned char *blk = a->pool + (size_t)a->blocks[bi - a->first] * a->block_bytes;
        const unsigned char *kp = blk + a->k_off, *vp = blk + a->v_off;
        bool vdone = false;
        const float *qb = a->q; /* the queries this block's keys are dotted with */
        if (norm_k) { /* normalized keys: q . (sigma k~ + mu) = (q sigma) . k~ + q . mu */
            const uint16_t *mu = (const uint16_t *)(const void *)(kp + knorm_off), *sg = mu + D;
            for (int d = 0; d < D; d++) {
                uint16_t hm, hs;
                memcpy(&hm, mu + d, 2);
                memcpy(&hs, sg + d, 2);
                kmu[d] = ember_f16_to_f32(hm);
                ksg[d] = hs ? ember_f16_to_f32(hs) : 1.0f;
            }
            for (int h = 0; h < rep; h++) {
                float cq = 0;
                for (int d = 0; d < D; d++) {
                    qn[(size_t)h * (size_t)D + (size_t)d] = a->q[(size_t)h * (size_t)D + (size_t)d] * ksg[d];
                    cq += a->q[(size_t)h * (size_t)D + (size_t)d] * kmu[d];
                }
                qoff[h] = cq;
                /* TQ keys are rotated: q . R^T y = (R q) . y */
                if (kc->enc == EMBER_KVE_TQ)
                    ember_tq_rotate(kc->signs, D, qn + (size_t)h * (size_t)D, qn + (size_t)h * (size_t)D);
            }
            qb = qn;
        }
        for (int h0 = 0; h0 < rep; h0 += ATTN_NH) {
            int nh = rep - h0 < ATTN_NH ? rep - h0 : ATTN_NH;
            vec16 s[ATTN_NH];
            const float *qh = qb + (size_t)h0 * (size_t)D;
            switch (nh) {
            case 1: k_scores(kc, D, kp, qh, (size_t)D, s, 1, tmp); break;
            case 2: k_scores(kc, D, kp, qh, (size_t)D, s, 2, tmp); break;
            case 3: k_scores(kc, D, kp, qh, (size_t)D, s, 3, tmp); break;
            default: k_scores(kc, D, kp, qh, (size_t)D, s, 4, tmp); break;
            }
            if (!vdone) { /* V rows decoded once per block for every head */
                v_rows(vc, D, Dp, vp, i0, i1, vd);
                vdone = true;
            }
            for (int hh = 0; hh < nh; hh++) {
                int h = h0 + hh;
                float *sc = tmp;
                if (kc->enc == EMBER_KVE_TQ) /* the keys' scales */
                    s[hh] = v_mul(s[hh], v_load_f16((const uint16_t *)(const void *)(kp + (size_t)D * 2 *
                                                                                      (size_t)kc->bits)));
                if (norm_k) s[hh] = v_fma(s[hh], v_set1(qoff[h]), v_set1(1.0f));
                v_store(sc, v_mul(s[hh], v_set1(a->scale)));
                if (a->softcap > 0)
                    for (int i = 0; i < 16; i++) sc[i] = tanhf(sc[i] / a->softcap) * a->softcap;
                float mb = -INFINITY;
                for (int i = i0; i < i1; i++) mb = sc[i] > mb ? sc[i] : mb;
                float mn = m[h] > mb ? m[h] : mb;
                float corr = m[h] == -INFINITY ? 0.0f : expf(m[h] - mn);
                for (int i = 0; i < 16; i++) sc[i] = i >= i0 && i < i1 ? sc[i] - mn : -100.0f;
                v_store(sc, v_exp(v_load_f32(sc)));
                for (int i = 0; i < 16; i++)
                    if (i < i0 || i >= i1) sc[i] = 0;
                l[h] = l[h] * corr + v_hsum(v_load_f32(sc));
                m[h] = mn;
                float *ah = acc + (size_t)h * (size_t)Dp;
                vec16 vcorr = v_set1(corr);
                for (int d = 0; d < Dp; d += 16) {
                    vec16 x = v_mul(v_load_f32(ah + d), vcorr);
                    for (int i = i0; i < i1; i++) x = v_fma(x, v_set1(sc[i]), v_load_f32(vd + (size_t)i * (size_t)Dp + d));
                    v_store(ah + d, x);
                }
            }
        }
        j = bi * 16 + i1;
    }
}
