/*
 * kern_qpack.h - the quantized gemm kernels on packed weights (qkern.h:
 * groups of 16 rows, one row per 32-bit lane), written once for every SIMD
 * ISA. Included by kern_avx2.c and kern_avx512.c (twice: with and without
 * VNNI) after they define, for vectors of QL 32-bit lanes (8 or 16):
 *   qv, fv                      integer and f32 vectors
 *   qv_zero, qv_load(p), qv_and, qv_add, qv_sub (i32), qv_mullo (i32), qv_set1 (i32),
 *   qv_set8 (i8), qv_bcast(p)   (the dword at p in every lane),
 *   qv_srl16(v, n), qv_sll32(v, n), qv_srl32(v, n),
 *   qv_or_and(a, b, m)          a | (b & m),
 *   qv_cvt_s8(p)                QL int8 at p sign-extended to i32 lanes,
 *   qv_dot4(acc, w, y)          acc + per lane sum of the four products of
 *                               unsigned bytes w (<= 63) and signed bytes y,
 *   qv_dot2(acc, a, b)          acc + per lane a.lo16 * b.lo16 + a.hi16 * b.hi16
 *                               (signed 16-bit halves; vpmaddwd + add, or
 *                               one vpdpwssd with VNNI),
 *   qv_pair16(a, b)             per lane the low 16 bits of a, then of b,
 *   qv_dot4_q8(acc, w, y)       the same for Q8_0's stored bytes w = level ^
 *                               0x80; Q8_INIT * sum(y) is the start value
 *                               that makes the result sum(level * y) exact,
 *   fv_zero, fv_load_h(p)       (QL halves), fv_bcast(p) (the f32 at p),
 *   fv_mul, fv_fma(a, b, c) = a * b + c, fv_fnma(a, b, c) = -(a * b) + c
 *   (one rounding each), fv_cvt (i32 -> f32), fv_store(p, v),
 *   QP_NX                       activation rows per register tile (4 or 8),
 *   QP_NX32 (optional)          the same for Q5_0 (default QP_NX; AVX2
 *                               takes 8: the weights of a block are
 *                               unpacked once per tile, and Q5_0's high
 *                               bits cost 3 operations per vector, so a
 *                               wider tile halves that work per row),
 *   KPREFIX                     the name prefix,
 * and, where dot4 is maddubs + madd (no VNNI), QP_MAD16 with
 *   qv_mad16(w, y)              maddubs alone: 16-bit sums of byte pairs,
 *   qv_add16(a, b)              16-bit lane add,
 *   qv_wide16(acc, v)           acc + the 32-bit sums of v's 16-bit pairs,
 * which let 4-, 5- and 6-bit weights add several maddubs results in 16
 * bits before one madd widens them (fewer multiply-port µops per MAC). The
 * 16-bit sums stay exact: a byte pair is at most 2 * L * 127 for levels <=
 * L, so 8 pairs of Q4 (30,480), 4 of Q5 (31,496) or 2 of Q6 (32,004) fit
 * below 2^15. The integer result, and so every output, is the same.
 * For the K types that widening madd also multiplies by the sub-block's
 * scale (qv_dot2 against the pair (sc, sc), |sc| <= 128: no vpmulld per
 * sub-block and row), and with or without VNNI the K types' other terms
 * are 16-bit pair products against the activation's int16 bsums: Q4_K /
 * Q5_K min_j * (bsums[2j] + bsums[2j+1]), Q6_K's level offset -32 sc_j *
 * bsums[j] two sub-blocks at a time (|-32 sc| <= 4,096, |bsums| <= 2,032).
 * All exact in 32 bits, so the sums are the canonical ones.
 * With QL = 8 a group is processed as two halves (rows 0-7, 8-15).
 *
 * Every output is one lane of one f32 accumulator that takes exactly the
 * canonical fused multiply-adds of qkern.h in block order; the integer sums
 * before them are exact (no intermediate can overflow: see qkern.h's level
 * ranges; the emulated dot4 stays below 2^15 per byte pair). So results are
 * bit-identical across ISAs, tiles and batches.
 *
 * Loop order: for each group and half, activation rows in tiles of QP_NX
 * (QP_NX32; then 4, 2, 1 for the rest), and for each tile the blocks in order. The
 * weights of a group (at most 139 KB, Q8_0 with K = 8192) stay in L2 while
 * the activation tiles sweep them, each tile asking for its share of the
 * next group's blocks (QP_PREFETCH_NEXT), so that memory streams during
 * every sweep; decode (one row) streams each group once, and with QL = 8 it
 * takes both halves in that one pass (NH = 2: each block's cache lines feed
 * all 16 rows while they are in L1; a K type's super-block half 0, then
 * half 1, so no more registers are live than for one half).
 * No state; a call writes only its own outputs.
 */

/* Byte offsets of half h inside the per-row arrays of a block group. */
#define QP_DW(h) ((size_t)(4 * QL) * (size_t)(h))
#define QP_HF(h) ((size_t)(2 * QL) * (size_t)(h))
#define QP_B8(h) ((size_t)QL * (size_t)(h))

/* v shifted left by n bits (right by -n), per 32-bit lane. */
#define QP_SHIFT(v, n) ((n) > 0 ? qv_sll32(v, (n) > 0 ? (n) : 0) : (n) < 0 ? qv_srl32(v, (n) < 0 ? -(n) : 0) : (v))

/* Decode (one activation row) streams each weight group once, so ask for
   the bb bytes that lie ahead bytes past p (a few KB: the next blocks)
   while the ones at p are computed. A prefetch never faults, also past the
   end (the address is formed as an integer: no out-of-bounds pointer). */
#define QP_PREFETCH(p, bb, ahead)                                                                                  \
    do {                                                                                                           \
        for (size_t pf_ = 0; pf_ < (size_t)(bb); pf_ += 64)                                                        \
            __builtin_prefetch((const void *)((uintptr_t)(p) + (size_t)(ahead) + pf_), 0, 3);                      \
    } while (0)

/* The same, spread over a block's steps: step st of nst asks for its share
   of the lines of the block `ahead` blocks on (bb bytes a block), a few
   lines a step. A whole super-block's lines asked for at once (36-53
   prefetches at the start of each) stalled a Zen 3 core until they came:
   memory and arithmetic took turns (Q6_K decode streamed at 13 G
   multiply-adds a second, 29 from cache) where a few a step keep both
   going (21-23; bench/RESULTS.md, 2026-12-06). pin: an empty asm after
   them keeps them where they are; without it GCC gathered Q4_K's fully
   unrolled steps' prefetches at the loop's top again (36, one to six
   instructions apart). Q6_K's steps keep their places unpinned, and pinned
   ran slower (17-19 against 20-23: the asm also orders its loads). */
#define QP_PREFETCH_STEP(p, bb, ahead, st, nst, pin)                                                               \
    do {                                                                                                           \
        const size_t per_ = (((size_t)(bb) + 63) / 64 + (size_t)(nst) - 1) / (size_t)(nst);                       \
        for (size_t l_ = (size_t)(st) * per_; l_ < ((size_t)(st) + 1) * per_ && 64 * l_ < (size_t)(bb); l_++)      \
            __builtin_prefetch((const void *)((uintptr_t)(p) + (size_t)(ahead) * (size_t)(bb) + 64 * l_), 0, 3);   \
        if (pin) __asm__ volatile("" ::: "memory");                                                                \
    } while (0)

/* v kept as it stands, in a register, at this point of its chain of
   integer adds (batch tiles only). The sums are exact, so GCC may
   re-associate a row's chain into a tree; without VNNI (a dot4 is maddubs,
   madd and a separate add) the AVX2 batch tiles' trees had more partial sums
   than 16 ymm registers hold: the Q8_0 tile stored and reloaded 20 of them
   a block, and the tiles ran 8-20% slower (bench/RESULTS.md, 2026-12-06).
   No instruction; the bits are the same either way. The AVX-512 build
   without VNNI takes it too (fewer stack accesses there; its speed on the
   Xeon host level within that host's spread). With VNNI a dot4 is one
   accumulating instruction, nothing to re-associate: left alone. */
#ifdef QP_MAD16
#define QP_KEEP(v) __asm__("" : "+v"(v))
#else
#define QP_KEEP(v) ((void)0)
#endif

/* Batches (several activation rows) sweep a group's weights once per tile
   of rows, the first sweep waiting on memory; so the tiles of each group
   also ask for the next group (pf.next: its start, NULL for none) into L2,
   where it waits for its own tiles (a group is at most 139 KB): tile
   pf.phase of pf.stride asks for the blocks b with b % stride == phase,
   as it passes block b, so the next group's bytes are requested evenly
   over all the sweeps of this one, not in the first sweep alone. */
typedef struct qp_pf {
    const unsigned char *next;
    int phase, stride;
} qp_pf;
#define QP_PREFETCH_NEXT(pf, b, bb)                                                                                \
    do {                                                                                                           \
        if ((pf).next && (b) % (pf).stride == (pf).phase)                                                          \
            for (size_t pf_ = 0; pf_ < (size_t)(bb); pf_ += 64)                                                    \
                __builtin_prefetch((const void *)((uintptr_t)(pf).next + (size_t)(b) * (size_t)(bb) + pf_), 0, 2); \
    } while (0)

/* ---- 32-element types ------------------------------------------------------ */

#ifndef QP_NX32
#define QP_NX32 QP_NX
#endif
#define QP_NXM (QP_NX32 > QP_NX ? QP_NX32 : QP_NX)

/* Dword groups 4q .. 4q+3 of block group p as unsigned levels (Q4_0: the
   nibble, Q5_0: nibble + 16 * high bit, Q8_0: the stored byte). */
ALWAYS_INLINE void qp32_quad(const unsigned char *p, int q, qv w[4], const int T, const int h) {
    if (T == EMBER_Q8_0) {
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) w[k] = qv_load(p + 32 + 64 * (4 * q + k) + QP_DW(h));
        return;
    }
    const qv m4 = qv_set8(0x0F);
    const size_t qo = T == EMBER_Q4_0 ? 32 : 96;
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        qv v = qv_load(p + qo + 64 * k + QP_DW(h));
        w[k] = q ? qv_and(qv_srl16(v, 4), m4) : qv_and(v, m4);
    }
    if (T == EMBER_Q5_0) {
        const qv m10 = qv_set8(0x10);
        const qv H = qv_load(p + 32 + QP_DW(h));
        /* group g's high bits sit at bit g of each byte: move them to bit 4 */
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) w[k] = qv_or_and(w[k], QP_SHIFT(H, 4 - (4 * q + k)), m10);
    }
}

/* NH (1 or 2) halves of the group from half h0 on in one pass over the
   blocks: with QL = 8, decode (NX = 1) takes both halves together, so each
   block's cache lines, fetched from memory once, feed all 16 rows at once
   (two passes of one half each read the group twice, the first pass waiting
   on memory with half the work to hide it). Per output nothing changes. */
ALWAYS_INLINE void qp32_tile(const unsigned char *wg, int nb, const unsigned char *x, size_t x_row, float *out,
                             size_t ldo, const int NX, const int T, const int h0, const int NH,
                             qp_pf pf) {
    const size_t BG = 16 * (size_t)(T == EMBER_Q8_0 ? 34 : T == EMBER_Q4_0 ? 18 : 22);
    const int init = T == EMBER_Q8_0 ? Q8_INIT : T == EMBER_Q4_0 ? -8 : -16;
    const int NS = NX <= 2 ? 2 : 1; /* independent integer chains per row */
    fv acc[2][QP_NXM];
#pragma GCC unroll 2
    for (int hh = 0; hh < NH; hh++)
#pragma GCC unroll 8
        for (int j = 0; j < NX; j++) acc[hh][j] = fv_zero();
    for (int b = 0; b < nb; b++) {
        const unsigned char *p = wg + (size_t)b * BG;
        if (NX == 1 && T != EMBER_Q8_0) QP_PREFETCH(p, BG, 8 * BG);
        QP_PREFETCH_NEXT(pf, b, BG);
#pragma GCC unroll 2
        for (int hh = 0; hh < NH; hh++) {
            const int h = h0 + hh;
            /* Q8_0 (9 lines a block): 4 blocks ahead, half the lines a half (at
               8 ahead, or none, the Zen 3 streamed 15-16 G multiply-adds a
               second; so 18.6-21) */
            if (NX == 1 && T == EMBER_Q8_0) QP_PREFETCH_STEP(p, BG, 4, hh, NH, 1);
            qv s[QP_NXM][2];
#pragma GCC unroll 8
            for (int j = 0; j < NX; j++) {
                int32_t ys;
                memcpy(&ys, x + (size_t)j * x_row + (size_t)b * sizeof(cpu_act32) + offsetof(cpu_act32, s), 4);
                s[j][0] = qv_set1(init * ys);
                s[j][1] = qv_zero();
            }
#ifdef QP_MAD16
            if (T == EMBER_Q4_0) {
                /* the block's 8 weight vectors once, then per row all 8 maddubs
                   summed in 16 bits (8 x 3,810 fits) and widened once */
                qv w[8];
                qp32_quad(p, 0, w, T, h);
                qp32_quad(p, 1, w + 4, T, h);
#pragma GCC unroll 8
                for (int j = 0; j < NX; j++) {
                    const unsigned char *yq =
                        x + (size_t)j * x_row + (size_t)b * sizeof(cpu_act32) + offsetof(cpu_act32, q);
                    qv h0v = qv_mad16(w[0], qv_bcast(yq)), h1v = qv_mad16(w[1], qv_bcast(yq + 4));
#pragma GCC unroll 3
                    for (int k = 1; k < 4; k++) {
                        h0v = qv_add16(h0v, qv_mad16(w[2 * k], qv_bcast(yq + 8 * k)));
                        h1v = qv_add16(h1v, qv_mad16(w[2 * k + 1], qv_bcast(yq + 8 * k + 4)));
                    }
                    s[j][1] = qv_wide16(s[j][1], qv_add16(h0v, h1v));
                }
            } else if (T == EMBER_Q5_0) {
                /* per quad: 4 maddubs in 16 bits (4 x 7,874 fits) */
#pragma GCC unroll 2
                for (int q = 0; q < 2; q++) {
                    qv w[4];
                    qp32_quad(p, q, w, T, h);
#pragma GCC unroll 8
                    for (int j = 0; j < NX; j++) {
                        const unsigned char *yq = x + (size_t)j * x_row + (size_t)b * sizeof(cpu_act32) +
                                                  offsetof(cpu_act32, q) + 16 * (size_t)q;
                        qv h0v = qv_add16(qv_mad16(w[0], qv_bcast(yq)), qv_mad16(w[2], qv_bcast(yq + 8)));
                        qv h1v = qv_add16(qv_mad16(w[1], qv_bcast(yq + 4)), qv_mad16(w[3], qv_bcast(yq + 12)));
                        qv *sq = &s[j][NX > 2 ? 0 : q]; /* one chain per row in a wide tile (registers) */
                        *sq = qv_wide16(*sq, qv_add16(h0v, h1v));
                    }
                }
            } else
#endif
#pragma GCC unroll 2
                for (int q = 0; q < 2; q++) {
                    qv w[4];
                    qp32_quad(p, q, w, T, h);
#pragma GCC unroll 8
                    for (int j = 0; j < NX; j++) {
                        const unsigned char *yq = x + (size_t)j * x_row + (size_t)b * sizeof(cpu_act32) +
                                                  offsetof(cpu_act32, q) + 16 * (size_t)q;
#pragma GCC unroll 4
                        for (int k = 0; k < 4; k++) {
                            qv *sk = &s[j][NS == 2 ? k & 1 : 0];
                            *sk = T == EMBER_Q8_0 ? qv_dot4_q8(*sk, w[k], qv_bcast(yq + 4 * k))
                                                  : qv_dot4(*sk, w[k], qv_bcast(yq + 4 * k));
                            if (NX > 1) QP_KEEP(*sk);
                        }
                    }
                }
            const fv dw = fv_load_h(p + QP_HF(h));
#pragma GCC unroll 8
            for (int j = 0; j < NX; j++) {
                const unsigned char *y = x + (size_t)j * x_row + (size_t)b * sizeof(cpu_act32);
                qv t = qv_add(s[j][0], s[j][1]);
                acc[hh][j] = fv_fma(fv_mul(dw, fv_bcast(y + offsetof(cpu_act32, d))), fv_cvt(t), acc[hh][j]);
            }
        }
    }
#pragma GCC unroll 2
    for (int hh = 0; hh < NH; hh++)
#pragma GCC unroll 8
        for (int j = 0; j < NX; j++) fv_store(out + (size_t)j * ldo + QL * (size_t)(h0 + hh), acc[hh][j]);
}

/* ---- Q4_K, Q5_K -------------------------------------------------------------------- */

/* Sub-block j's 6-bit scale and min for the lanes' rows, from the three
   scale dwords D[0..2] (qkern.h cpu_k4_scale_min, lane-wise). */
ALWAYS_INLINE void qpk_scale_min(const qv D[3], int j, qv *sc, qv *mn) {
    const qv m63 = qv_set1(63), m15 = qv_set1(15), m48 = qv_set1(0x30);
    if (j < 4) {
        *sc = qv_and(qv_srl32(D[0], 8 * j), m63);
        *mn = qv_and(qv_srl32(D[1], 8 * j), m63);
    } else {
        const int s = 8 * (j - 4);
        *sc = qv_or_and(qv_and(qv_srl32(D[2], s), m15), qv_srl32(D[0], s + 2), m48);
        *mn = qv_or_and(qv_and(qv_srl32(D[2], s + 4), m15), qv_srl32(D[1], s + 2), m48);
    }
}

ALWAYS_INLINE void qpk4_tile(const unsigned char *wg, int nsb, const unsigned char *x, size_t x_row, float *out,
                             size_t ldo, const int NX, const int T, const int h0, const int NH, qp_pf pf) {
    const size_t BG = T == EMBER_Q4_K ? 2304 : 2816, qoff = T == EMBER_Q4_K ? 256 : 768;
    const qv m4 = qv_set8(0x0F), m10 = qv_set8(0x10);
    fv acc[2][QP_NX];
#pragma GCC unroll 2
    for (int hh = 0; hh < NH; hh++)
#pragma GCC unroll 8
        for (int j = 0; j < NX; j++) acc[hh][j] = fv_zero();
    for (int b = 0; b < nsb; b++) {
        const unsigned char *p = wg + (size_t)b * BG;
        const unsigned char *yb = x + (size_t)b * sizeof(cpu_act256);
        QP_PREFETCH_NEXT(pf, b, BG);
#pragma GCC unroll 2
        for (int hh = 0; hh < NH; hh++) {
            const int h = h0 + hh;
            qv D[3];
#pragma GCC unroll 3
            for (int k = 0; k < 3; k++) D[k] = qv_load(p + 64 + 64 * k + QP_DW(h));
            qv S1[QP_NX], S2[QP_NX];
#pragma GCC unroll 8
            for (int c = 0; c < NX; c++) S1[c] = S2[c] = qv_zero();
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                qv sc, mn;
                if (NX == 1) QP_PREFETCH_STEP(p, BG, 2, 8 * hh + j, 8 * NH, 1); /* two super-blocks ahead */
                qpk_scale_min(D, j, &sc, &mn);
                /* S2 = sum_j min_j * bs32[j] as min_j * (bsums[2j] + bsums[2j+1]):
                   one 16-bit pair product per sub-block and row */
                const qv mn16 = qv_pair16(mn, mn);
#pragma GCC unroll 8
                for (int c = 0; c < NX; c++) {
                    S2[c] = qv_dot2(S2[c], mn16,
                                    qv_bcast(yb + (size_t)c * x_row + offsetof(cpu_act256, bsums) + 4 * j));
                    if (NX > 1) QP_KEEP(S2[c]);
                }
#ifdef QP_MAD16
                if (T == EMBER_Q4_K || NX > 1) {
                    /* the scale as a 16-bit pair: the one madd that widens a row's
                       16-bit sums also multiplies them by it (no 32-bit multiply) */
                    const qv sc16 = qv_pair16(sc, sc);
                    qv w[8];
#pragma GCC unroll 8
                    for (int t = 0; t < 8; t++) {
                        qv v = qv_load(p + qoff + 64 * (8 * (j / 2) + t) + QP_DW(h));
                        w[t] = j & 1 ? qv_and(qv_srl16(v, 4), m4) : qv_and(v, m4);
                        if (T == EMBER_Q5_K) /* bit j of qh byte 4t + i: element 32j + 4t + i */
                            w[t] = qv_or_and(w[t], QP_SHIFT(qv_load(p + 256 + 64 * t + QP_DW(h)), 4 - j), m10);
                    }
                    /* the sub-block's weights once, then per row 16-bit sums: all 8
                       maddubs of Q4_K (8 x 3,810 fits), 4 of Q5_K (4 x 7,874) */
#pragma GCC unroll 8
                    for (int c = 0; c < NX; c++) {
                        const unsigned char *yt = yb + (size_t)c * x_row + offsetof(cpu_act256, q) + 32 * j;
                        qv h0 = qv_mad16(w[0], qv_bcast(yt)), h1 = qv_mad16(w[1], qv_bcast(yt + 4));
                        if (T == EMBER_Q5_K) {
                            h0 = qv_add16(h0, qv_mad16(w[2], qv_bcast(yt + 8)));
                            h1 = qv_add16(h1, qv_mad16(w[3], qv_bcast(yt + 12)));
                            S1[c] = qv_dot2(S1[c], qv_add16(h0, h1), sc16);
                            h0 = qv_mad16(w[4], qv_bcast(yt + 16));
                            h1 = qv_mad16(w[5], qv_bcast(yt + 20));
                            h0 = qv_add16(h0, qv_mad16(w[6], qv_bcast(yt + 24)));
                            h1 = qv_add16(h1, qv_mad16(w[7], qv_bcast(yt + 28)));
                        } else {
#pragma GCC unroll 3
                            for (int t = 2; t < 8; t += 2) {
                                h0 = qv_add16(h0, qv_mad16(w[t], qv_bcast(yt + 4 * t)));
                                h1 = qv_add16(h1, qv_mad16(w[t + 1], qv_bcast(yt + 4 * t + 4)));
                            }
                        }
                        S1[c] = qv_dot2(S1[c], qv_add16(h0, h1), sc16);
                        if (NX > 1) QP_KEEP(S1[c]);
                    }
                    continue;
                }
#endif
                {
                    const int NS = NX <= 2 ? 2 : 1; /* independent integer chains per row */
                    qv P[QP_NX][2];
#pragma GCC unroll 8
                    for (int c = 0; c < NX; c++) P[c][0] = P[c][1] = qv_zero();
#ifdef QP_MAD16
                    const qv sc16 = qv_pair16(sc, sc); /* as above */
                    qv H[QP_NX];
#endif
#pragma GCC unroll 8
                    for (int t = 0; t < 8; t++) {
                        qv v = qv_load(p + qoff + 64 * (8 * (j / 2) + t) + QP_DW(h));
                        qv w = j & 1 ? qv_and(qv_srl16(v, 4), m4) : qv_and(v, m4);
                        if (T == EMBER_Q5_K) /* bit j of qh byte 4t + i: element 32j + 4t + i */
                            w = qv_or_and(w, QP_SHIFT(qv_load(p + 256 + 64 * t + QP_DW(h)), 4 - j), m10);
#pragma GCC unroll 8
                        for (int c = 0; c < NX; c++) {
                            const unsigned char *yt = yb + (size_t)c * x_row + offsetof(cpu_act256, q) + 32 * j + 4 * t;
#ifdef QP_MAD16 /* groups of 4 maddubs in 16 bits (4 x 7,874 fits) */
                            qv m = qv_mad16(w, qv_bcast(yt));
                            H[c] = t & 3 ? qv_add16(H[c], m) : m;
                            if ((t & 3) == 3) P[c][t / 4 & (NS - 1)] = qv_dot2(P[c][t / 4 & (NS - 1)], H[c], sc16);
#else
                            qv *pc = &P[c][NS == 2 ? t & 1 : 0];
                            *pc = qv_dot4(*pc, w, qv_bcast(yt));
#endif
                        }
                    }
#pragma GCC unroll 8
                    for (int c = 0; c < NX; c++) {
                        qv pj = qv_add(P[c][0], P[c][1]);
#ifdef QP_MAD16
                        S1[c] = qv_add(S1[c], pj); /* already times the scale */
#else
                        S1[c] = qv_add(S1[c], qv_mullo(pj, sc));
#endif
                    }
                }
            }
            const fv d = fv_load_h(p + QP_HF(h)), dm = fv_load_h(p + 32 + QP_HF(h));
#pragma GCC unroll 8
            for (int c = 0; c < NX; c++) {
                const fv yd = fv_bcast(yb + (size_t)c * x_row + offsetof(cpu_act256, d));
                acc[hh][c] = fv_fma(fv_mul(d, yd), fv_cvt(S1[c]), acc[hh][c]);
                acc[hh][c] = fv_fnma(fv_mul(dm, yd), fv_cvt(S2[c]), acc[hh][c]);
            }
        }
    }
#pragma GCC unroll 2
    for (int hh = 0; hh < NH; hh++)
#pragma GCC unroll 8
        for (int c = 0; c < NX; c++) fv_store(out + (size_t)c * ldo + QL * (size_t)(h0 + hh), acc[hh][c]);
}

/* ---- Q6_K ------------------------------------------------------------------------ */

/* S1 = sum_j sc_j * (sum_e q_e y_e) - 32 * sum_j sc_j * bsums[j]: the level
   offset of -32 becomes one 16-bit pair product per two sub-blocks and row
   (the pair (-32 sc_j, -32 sc_j+1) against the dword (bsums[j], bsums[j+1]),
   |-32 sc| <= 4,096, |bsums| <= 2,032); all exact in 32 bits. */
ALWAYS_INLINE void qpk6_tile(const unsigned char *wg, int nsb, const unsigned char *x, size_t x_row, float *out,
                             size_t ldo, const int NX, const int T, const int h0, const int NH, qp_pf pf) {
    (void)T;
    const qv m4 = qv_set8(0x0F), m48 = qv_set8(0x30);
    fv acc[2][QP_NX];
#pragma GCC unroll 2
    for (int hh = 0; hh < NH; hh++)
#pragma GCC unroll 8
        for (int j = 0; j < NX; j++) acc[hh][j] = fv_zero();
    for (int b = 0; b < nsb; b++) {
        const unsigned char *p = wg + (size_t)b * 3360;
        const unsigned char *yb = x + (size_t)b * sizeof(cpu_act256);
        QP_PREFETCH_NEXT(pf, b, 3360);
#pragma GCC unroll 2
        for (int hh = 0; hh < NH; hh++) {
            const int h = h0 + hh;
            qv S1[QP_NX];
#pragma GCC unroll 8
            for (int c = 0; c < NX; c++) S1[c] = qv_zero();
            for (int n = 0; n < 2; n++) {
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) {
                    qv scu[2];
#pragma GCC unroll 2
                    for (int u = 0; u < 2; u++) {
                        const int j = 8 * n + 2 * k + u; /* sub-block: elements 16j .. 16j+15 */
                        if (NX == 1) QP_PREFETCH_STEP(p, 3360, 2, 16 * hh + j, 16 * NH, 0); /* two ahead */
                        const qv sc = qv_cvt_s8(p + 32 + 16 * j + QP_B8(h));
                        scu[u] = sc;
#ifdef QP_MAD16
                        /* 16-bit sums of 2 maddubs (6-bit levels), widened times the
                           scale; one row (measured faster so): widened into two
                           chains that start at -32 * bs16[j], then one vpmulld */
                        const qv sc16 = qv_pair16(sc, sc);
                        qv H[QP_NX], P1[2] = {qv_zero(), qv_zero()};
                        if (NX == 1) {
                            int32_t bs;
                            memcpy(&bs, yb + offsetof(cpu_act256, bs16) + 4 * (size_t)j, 4);
                            P1[0] = qv_set1(-32 * bs);
                        }
#else
                        const int NS = NX <= 2 ? 2 : 1; /* independent integer chains per row (dot4) */
                        qv P[QP_NX][2];
#pragma GCC unroll 8
                        for (int c = 0; c < NX; c++) P[c][0] = P[c][1] = qv_zero();
#endif
#pragma GCC unroll 4
                        for (int t = 4 * u; t < 4 * u + 4; t++) {
                            qv l = qv_load(p + 288 + 64 * (16 * n + 8 * (k & 1) + t) + QP_DW(h));
                            qv hb = qv_load(p + 2336 + 64 * (8 * n + t) + QP_DW(h));
                            qv w = qv_or_and(k < 2 ? qv_and(l, m4) : qv_and(qv_srl16(l, 4), m4),
                                             QP_SHIFT(hb, 4 - 2 * k), m48);
#pragma GCC unroll 8
                            for (int c = 0; c < NX; c++) {
                                const unsigned char *yt =
                                    yb + (size_t)c * x_row + offsetof(cpu_act256, q) + 128 * n + 32 * k + 4 * t;
#ifdef QP_MAD16
                                qv m = qv_mad16(w, qv_bcast(yt));
                                if (!(t & 1))
                                    H[c] = m;
                                else if (NX == 1)
                                    P1[t >> 1 & 1] = qv_wide16(P1[t >> 1 & 1], qv_add16(H[c], m));
                                else {
                                    S1[c] = qv_dot2(S1[c], qv_add16(H[c], m), sc16);
                                    QP_KEEP(S1[c]); /* NX > 1 here */
                                }
#else
                                qv *pc = &P[c][NS == 2 ? t & 1 : 0];
                                *pc = qv_dot4(*pc, w, qv_bcast(yt));
#endif
                            }
                        }
#ifdef QP_MAD16
                        if (NX == 1) S1[0] = qv_add(S1[0], qv_mullo(qv_add(P1[0], P1[1]), sc));
#else
#pragma GCC unroll 8
                        for (int c = 0; c < NX; c++) {
                            qv pj = NS == 2 ? qv_add(P[c][0], P[c][1]) : P[c][0];
                            S1[c] = qv_add(S1[c], qv_mullo(pj, sc));
                        }
#endif
                    }
#ifdef QP_MAD16
                    if (NX == 1) continue; /* the offset is in P1 */
#endif
                    /* the offset of sub-blocks 8n + 2k and 8n + 2k + 1 */
                    const qv off =
                        qv_pair16(qv_sub(qv_zero(), qv_sll32(scu[0], 5)), qv_sub(qv_zero(), qv_sll32(scu[1], 5)));
#pragma GCC unroll 8
                    for (int c = 0; c < NX; c++) {
                        S1[c] = qv_dot2(
                            S1[c], off,
                            qv_bcast(yb + (size_t)c * x_row + offsetof(cpu_act256, bsums) + 2 * (8 * n + 2 * k)));
                        if (NX > 1) QP_KEEP(S1[c]);
                    }
                }
            }
            const fv d = fv_load_h(p + QP_HF(h));
#pragma GCC unroll 8
            for (int c = 0; c < NX; c++) {
                const fv yd = fv_bcast(yb + (size_t)c * x_row + offsetof(cpu_act256, d));
                acc[hh][c] = fv_fma(fv_mul(d, yd), fv_cvt(S1[c]), acc[hh][c]);
            }
        }
    }
#pragma GCC unroll 2
    for (int hh = 0; hh < NH; hh++)
#pragma GCC unroll 8
        for (int c = 0; c < NX; c++) fv_store(out + (size_t)c * ldo + QL * (size_t)(h0 + hh), acc[hh][c]);
}

/* ---- drivers --------------------------------------------------------------------- */

#define QP_TILE(T)                                                                                                 \
    ((T) == EMBER_Q4_K || (T) == EMBER_Q5_K ? 1 : (T) == EMBER_Q6_K ? 2 : 0)

/* One tile (when run; otherwise only counted); it asks for its share of
   the next group (QP_PREFETCH_NEXT); pf->phase counts the group's tiles. */
ALWAYS_INLINE void qp_call(const unsigned char *wg, int nb, const unsigned char *x, size_t x_row, float *out,
                           size_t ldo, const int NX, const int T, const int h, const int NH, qp_pf *pf,
                           const bool run) {
    if (run && QP_TILE(T) == 1)
        qpk4_tile(wg, nb, x, x_row, out, ldo, NX, T, h, NH, *pf);
    else if (run && QP_TILE(T) == 2)
        qpk6_tile(wg, nb, x, x_row, out, ldo, NX, T, h, NH, *pf);
    else if (run)
        qp32_tile(wg, nb, x, x_row, out, ldo, NX, T, h, NH, *pf);
    pf->phase++;
}

/* The tiles of one group for mm activation rows (NXT rows a tile, then 4,
   2, 1; H1 = 2: the last single row takes both halves), in order; with run
   false they are only counted into pf->phase (qp_drive's pf.stride). */
ALWAYS_INLINE void qp_group(const unsigned char *wg, int nb, const unsigned char *x, size_t xa_row, float *og,
                            size_t ldo, int mm, const int NXT, const int T, const int H1, qp_pf *pf,
                            const bool run) {
    int m1 = 0;
    for (int h = 0; h < 16 / QL; h++) {
        int m = 0;
        for (; m + NXT <= mm; m += NXT)
            qp_call(wg, nb, x + (size_t)m * xa_row, xa_row, og + (size_t)m * ldo, ldo, NXT, T, h, 1, pf, run);
        if (NXT > 4 && m + 4 <= mm) {
            qp_call(wg, nb, x + (size_t)m * xa_row, xa_row, og + (size_t)m * ldo, ldo, 4, T, h, 1, pf, run);
            m += 4;
        }
        if (m + 2 <= mm) {
            qp_call(wg, nb, x + (size_t)m * xa_row, xa_row, og + (size_t)m * ldo, ldo, 2, T, h, 1, pf, run);
            m += 2;
        }
        m1 = m;
        if (m < mm && H1 == 1)
            qp_call(wg, nb, x + (size_t)m * xa_row, xa_row, og + (size_t)m * ldo, ldo, 1, T, h, 1, pf, run);
    }
    if (m1 < mm && H1 == 2)
        qp_call(wg, nb, x + (size_t)m1 * xa_row, xa_row, og + (size_t)m1 * ldo, ldo, 1, T, 0, 2, pf, run);
}

ALWAYS_INLINE void qp_drive(const void *wp, int ngroups, const void *xa, size_t xa_row, int mm, int K, float *out,
                            size_t ldo, const int T) {
    const int kq = QP_TILE(T) != 0;
    /* activation rows per tile: the wide tiles only for Q5_0, the one type
       they were measured faster for (AVX2 Q8_0 measured level, and slower
       once with VNNI at 512 rows; Q4_0 not measured) */
    const int NXT = kq || T != EMBER_Q5_0 ? QP_NX : QP_NX32;
    const int nb = kq ? K / 256 : K / 32;
    const size_t bb = T == EMBER_Q8_0   ? 34
                      : T == EMBER_Q4_0 ? 18
                      : T == EMBER_Q5_0 ? 22
                      : T == EMBER_Q4_K ? 144
                      : T == EMBER_Q5_K ? 176
                                        : 210;
    const size_t gbytes = 16 * bb * (size_t)nb;
    const unsigned char *x = xa;
    /* with two halves, the last single row takes both in one pass over the
       blocks (qp32_tile; qpk4_tile and qpk6_tile: each super-block's half 0
       then half 1, so the second finds the block's lines in L1) */
    const int H1 = QL == 8 ? 2 : 1;
    qp_pf count = {NULL, 0, 1};
    qp_group(wp, nb, x, xa_row, out, ldo, mm, NXT, T, H1, &count, false); /* the tiles a group takes */
    for (int g = 0; g < ngroups; g++) {
        const unsigned char *wg = (const unsigned char *)wp + (size_t)g * gbytes;
        qp_pf pf = {mm > 1 && g + 1 < ngroups ? wg + gbytes : NULL, 0, count.phase}; /* decode prefetches its own */
        qp_group(wg, nb, x, xa_row, out + 16 * (size_t)g, ldo, mm, NXT, T, H1, &pf, true);
    }
}

#define QP_ENTRY(name, T)                                                                                          \
    static void CAT(KPREFIX, name)(const void *wp, int ngroups, const void *xa, size_t xa_row, int mm, int K,      \
                                   float *out, size_t ldo) {                                                       \
        qp_drive(wp, ngroups, xa, xa_row, mm, K, out, ldo, T);                                                     \
    }
QP_ENTRY(qp_q8_0, EMBER_Q8_0)
QP_ENTRY(qp_q4_0, EMBER_Q4_0)
QP_ENTRY(qp_q5_0, EMBER_Q5_0)
QP_ENTRY(qp_q4_k, EMBER_Q4_K)
QP_ENTRY(qp_q5_k, EMBER_Q5_K)
QP_ENTRY(qp_q6_k, EMBER_Q6_K)

#ifndef QP_EXTRA
#define QP_EXTRA /* more entries (kern_bamx.h) */
#endif
#define QP_TABLE                                                                                                   \
    .qgemm_packed = {[EMBER_Q8_0] = CAT(KPREFIX, qp_q8_0), [EMBER_Q4_0] = CAT(KPREFIX, qp_q4_0),                   \
                     [EMBER_Q5_0] = CAT(KPREFIX, qp_q5_0), [EMBER_Q4_K] = CAT(KPREFIX, qp_q4_k),                   \
                     [EMBER_Q5_K] = CAT(KPREFIX, qp_q5_k), [EMBER_Q6_K] = CAT(KPREFIX, qp_q6_k) QP_EXTRA}
