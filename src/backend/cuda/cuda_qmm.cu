/*
 * cuda_qmm.cu - quantized weights on the GPU: the activation quantizers,
 * the matrix products and get_rows for Q8_0, Q4_0, Q5_0, Q4_K, Q5_K and
 * Q6_K weights, read in the layout the GGUF file holds (row-major blocks,
 * uploaded as they are; nothing is repacked).
 *
 * The numbers are the CPU's, bit for bit. A product is defined once, by
 * the canonical dot product of src/backend/cpu/qkern.h: each input row is
 * quantized on its own (blocks of 32 or 256 elements, d = amax / 127,
 * levels round(x * 127 / amax)), each weight block meets it in an exact
 * integer sum, and each output is one chain of f32 fused multiply-adds,
 * block by block in order:
 *   acc = fmaf(f32(w.d) * y.d, (float)S, acc)                    32-element types, Q6_K
 *   acc = fmaf(f32(w.d) * y.d, (float)S1, acc);
 *   acc = fmaf(-(f32(w.dmin) * y.d), (float)S2, acc)             Q4_K, Q5_K
 * Integer sums are exact in any order, so the GPU may split them among
 * threads as it likes; the float chain is kept whole. The quantizers
 * evaluate the CPU's f32 operations (IEEE division, round to nearest even;
 * nvcc --fmad=false keeps them apart). So a row's outputs never depend on
 * the rows beside it (batch invariance), and tests/test_cuda_ops.c
 * compares them with the CPU backend's bit for bit.
 *
 * Activations go to a device scratch the backend owns (ember_cu_qact_bytes;
 * this file's layout, not the CPU's structs): per row, per block of 32
 * elements { i8 q[32]; f32 d; i32 s; pad } (48 bytes; s = sum of q), and
 * per block of 256 { i8 q[256]; i32 bs16[16]; f32 d; pad } (336 bytes;
 * bs16[j] = sum of q[16j .. 16j + 15]).
 *
 * The product kernel (qmm_k): a block of 256 threads owns QR = 8 weight rows
 * (one per warp) and up to MT input rows (1, 2, 4 or 8; more rows take more
 * blocks along grid x, which reread the weights from L2). K is walked in
 * chunks: each lane computes the integer sums of UPT units of its warp's row
 * (a unit: a 32-element block; 64 elements of a Q4_K / Q5_K super-block;
 * 128 of a Q6_K one) against each input row, and stores them in shared
 * memory with each block's f32(w.d) * y.d; then QR x MT threads, one per
 * output, run the chunk's part of the float chain from there. Two sets
 * alternate, so one barrier a chunk suffices.
 *
 * One input row against the K types takes qmv_k instead: qmm_k's sums and
 * chain, with the input row staged in shared memory once per block and each
 * warp running its own row's chain; against Q4_0, qmv4_k: qmm_k with each
 * weight block read as two aligned 16-byte words and the input staged
 * (their sections say why).
 *
 * From QTC_MIN_M rows on, every type runs on the tensor cores. The
 * 32-element types (qmm_tc_k): one int8 mma.m16n8k32 is one block of 16
 * weight rows against 8 input rows, exact, and each lane runs the chain of
 * its 4 outputs (per 8 input rows a warp takes); the loads of TC_AHEAD blocks
 * go out together; the input is quantized into the mma fragments' order (A32T
 * below). The K types (qmm_tck_k): per super-block, one m16n8k32 per
 * sub-block of 32 (Q4_K / Q5_K) or one m16n8k16 per sub-block of 16 (Q6_K)
 * gives its exact sums, which each lane scales by the sub-block's integer
 * scale and adds up in int32 (the mins' term from the input's level sums),
 * then runs the super-block's chain step; the input in A256T tiles.
 *
 * Weight bytes are read as aligned 32-bit words (blocks of 18, 22, 34 and 210
 * bytes start at any even address): ld_words shifts each pair of words by
 * 0 or 16 bits. The caller checks that weights are 2-byte aligned.
 *
 * Ownership: every pointer is device memory owned by the caller; launchers
 * enqueue and return (cuda_kernels.h).
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_kernels.h"
#include "cuda_mm.cuh"
#include "cuda_pdl.cuh"
#include "cuda_qact.cuh"

/* ---- the types --------------------------------------------------------------------------- */

/* Bytes and elements of one block, the activation kind, and the unit a
   lane computes (elements; units per block = QEL / UEL). */
template <int QT> struct qt_info;
#define QT_INFO(T, BYTES, ELEMS, UNIT)                                               \
    template <> struct qt_info<T> {                                                  \
        enum { QB = (BYTES), QEL = (ELEMS), UEL = (UNIT), A256 = (ELEMS) == 256 }; \
    };
QT_INFO(EMBER_CU_Q8_0, 34, 32, 32)
QT_INFO(EMBER_CU_Q4_0, 18, 32, 32)
QT_INFO(EMBER_CU_Q5_0, 22, 32, 32)
QT_INFO(EMBER_CU_Q4_K, 144, 256, 64)
QT_INFO(EMBER_CU_Q5_K, 176, 256, 64)
QT_INFO(EMBER_CU_Q6_K, 210, 256, 128)
#undef QT_INFO

/* The tensor-core kernel's input layout (A32 tiles): for block b and slice s
   of 8 input rows, at (b * slices + s) * A32T_BYTES: the B fragments of
   mma.m16n8k32 by lane (lane 4g + t: words t and 4 + t of row 8s + g's 32
   levels, 256 bytes), then for t = 0..3 {d of row 8s + 2t, d of row 8s +
   2t + 1, s of those two} (64 bytes). Rows past M are zero. */

/* The K types' tensor-core kernel's input layout (A256T tiles): for
   super-block b and slice s of 8 input rows, at (b * slices + s) *
   A256T_BYTES: for each sub-block j of 32 (0..7), at 256 j, the B fragments of
   its levels as A32T's (lane 4g + t: words t and 4 + t of row 8s + g's 32
   levels of sub-block j); at 2048 + 128 t (t = 0..3): bs16[0..15] of row 8s +
   2t, then of row 8s + 2t + 1 (the level sums of the 16 sub-blocks of 16); at
   2560 + 4g: d of row 8s + g. Rows past M are zero. */

/* The tensor-core kernels take the types from this many rows on. */
#define QTC_MIN_M 9
static_assert(QTC_MIN_M > EMBER_CU_QFUSE_MAX_M, "the producers' fused quantization writes the row-major layout");

extern "C" {
int ember_cu_qktc = 1;
}

static bool qt_tc(int qtype, int M) {
    return M >= QTC_MIN_M && (!ember_cu_q256(qtype) || ember_cu_qktc);
}

extern "C" size_t ember_cu_qact_bytes(int qtype, int M, int K) {
    if (ember_cu_q256(qtype) && qt_tc(qtype, M)) return (size_t)((M + 7) / 8) * (size_t)(K / 256) * A256T_BYTES;
    if (ember_cu_q256(qtype)) return (size_t)M * (size_t)(K / 256) * A256_BYTES;
    if (qt_tc(qtype, M)) return (size_t)((M + 7) / 8) * (size_t)(K / 32) * A32T_BYTES;
    return (size_t)M * (size_t)(K / 32) * A32_BYTES;
}

/* ---- activation quantizers ------------------------------------------------------------- */

/* The byte offset, in a table of mma B fragments (A32T / A256T: lane 4g + t holds words t and 4 + t of
   row g's 32 levels, 8 bytes a lane), of word w (levels 4w .. 4w + 3) of row g. */
static __device__ __forceinline__ int bfrag_word(int g, int w) {
    return 8 * (4 * g + w % 4) + 4 * (w / 4);
}

/* One warp per 32-element block: lane l quantizes element l (cuda_qact.cuh). */
static __global__ void __launch_bounds__(256) qact32_k(const float *x, unsigned char *act, int M, int K) {
    ember_pdl_enter();
    const int nb = K / 32;
    const long long blk = (long long)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (blk >= (long long)M * nb) return;
    const int lane = threadIdx.x & 31;
    const long long m = blk / nb, b = blk % nb;
    qact32_store(x[m * (long long)K + b * 32 + lane], act + blk * A32_BYTES, lane);
}

/* qact32_k into the A32 tiles of the tensor-core kernel (the same levels,
   d and s); one warp per (row, block) of the padded rows (rows past M zero). */
static __global__ void __launch_bounds__(256) qact32t_k(const float *x, unsigned char *act, int M, int K) {
    ember_pdl_enter();
    const int nb = K / 32, S = (M + 7) / 8;
    const long long blk = (long long)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (blk >= (long long)S * 8 * nb) return;
    const int lane = threadIdx.x & 31;
    const int m = (int)(blk / nb), b = (int)(blk % nb);
    float d;
    int s;
    const int q = qact32_warp(m < M ? x[(long long)m * K + (long long)b * 32 + lane] : 0.0f, &d, &s);
    unsigned char *rec = act + ((size_t)b * (size_t)S + (size_t)(m / 8)) * A32T_BYTES;
    const int g = m % 8, w = lane / 4; /* level `lane` is byte lane % 4 of word w */
    rec[bfrag_word(g, w) + lane % 4] = (unsigned char)(signed char)q;
    if (lane == 0) {
        *(float *)(rec + 256 + 16 * (g / 2) + 4 * (g % 2)) = d;
        *(int *)(rec + 256 + 16 * (g / 2) + 8 + 4 * (g % 2)) = s;
    }
}

/* One warp per 256-element block: lane l quantizes elements 8l .. 8l + 7
   (cuda_qact.cuh). */
static __global__ void __launch_bounds__(256) qact256_k(const float *x, unsigned char *act, int M, int K) {
    ember_pdl_enter();
    const int nb = K / 256;
    const long long blk = (long long)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (blk >= (long long)M * nb) return;
    const int lane = threadIdx.x & 31;
    const long long m = blk / nb, b = blk % nb;
    const float *xs = x + m * (long long)K + b * 256 + 8 * lane;
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; e++) v[e] = xs[e];
    qact256_store(v, act + blk * A256_BYTES, lane);
}

/* qact256_k into the A256T tiles of the K types' tensor-core kernel (the
   same levels, sums and d); one warp per (row, super-block) of the padded
   rows (rows past M zero). Lane l holds words 2 (l % 4) and 2 (l % 4) + 1 of
   sub-block l / 4. */
static __global__ void __launch_bounds__(256) qact256t_k(const float *x, unsigned char *act, int M, int K) {
    ember_pdl_enter();
    const int nb = K / 256, S = (M + 7) / 8;
    const long long blk = (long long)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (blk >= (long long)S * 8 * nb) return;
    const int lane = threadIdx.x & 31;
    const int m = (int)(blk / nb), b = (int)(blk % nb);
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; e++) v[e] = m < M ? x[(long long)m * K + (long long)b * 256 + 8 * lane + e] : 0.0f;
    unsigned int lo, hi;
    int s16;
    float d;
    qact256_warp(v, &lo, &hi, &s16, &d);
    unsigned char *rec = act + ((size_t)b * (size_t)S + (size_t)(m / 8)) * A256T_BYTES;
    const int g = m % 8, j = lane / 4, w0 = 2 * (lane % 4), w1 = w0 + 1;
    *(unsigned int *)(rec + 256 * j + bfrag_word(g, w0)) = lo;
    *(unsigned int *)(rec + 256 * j + bfrag_word(g, w1)) = hi;
    if ((lane & 1) == 0) *(int *)(rec + 2048 + 128 * (g / 2) + 64 * (g % 2) + 4 * (lane / 2)) = s16;
    if (lane == 0) *(float *)(rec + 2560 + 4 * g) = d;
}

extern "C" cudaError_t ember_cu_qact32_rows(cudaStream_t stream, const float *x, void *act, int M, int K) {
    if (M < 1 || K < 1) return cudaSuccess;
    const long long grid = ((long long)M * (K / 32) + 7) / 8;
    if (grid > 0x7fffffffLL) return cudaErrorInvalidValue;
    return ember_launch(qact32_k, dim3((unsigned)grid), dim3(256), 0, stream, x, (unsigned char *)act, M, K);
}

extern "C" cudaError_t ember_cu_qact(cudaStream_t stream, int qtype, const float *x, void *act, int M, int K) {
    if (M < 1 || K < 1) return cudaSuccess;
    const bool k256 = ember_cu_q256(qtype), tc = qt_tc(qtype, M);
    const long long rows = tc ? (long long)(M + 7) / 8 * 8 : M;
    const long long grid = (rows * (K / (k256 ? 256 : 32)) + 7) / 8;
    if (grid > 0x7fffffffLL) return cudaErrorInvalidValue;
    unsigned char *o = (unsigned char *)act;
    if (k256 && tc) return ember_launch(qact256t_k, dim3((unsigned)grid), dim3(256), 0, stream, x, o, M, K);
    if (k256) return ember_launch(qact256_k, dim3((unsigned)grid), dim3(256), 0, stream, x, o, M, K);
    if (tc) return ember_launch(qact32t_k, dim3((unsigned)grid), dim3(256), 0, stream, x, o, M, K);
    return ember_cu_qact32_rows(stream, x, act, M, K);
}

/* ---- loads ----------------------------------------------------------------------------- */

/* N little-endian 32-bit words starting at p (2-byte aligned): N + 1
   aligned loads and a funnel shift by 0 or 16 bits (no branch, so lanes
   whose blocks sit at different alignments stay together). Reads up to 4
   bytes past the last word and 2 before the first; neither changes the
   result, and both stay inside the buffer (buffers start 256-byte aligned
   and have 16 spare bytes at the end: cuda_backend.c). */
template <int N> static __device__ __forceinline__ void ld_words(const unsigned char *p, unsigned int *o) {
    const unsigned int *a = (const unsigned int *)((uintptr_t)p & ~(uintptr_t)3);
    const unsigned int sh = (unsigned int)((uintptr_t)p & 2) * 8u;
    unsigned int w[N + 1];
#pragma unroll
    for (int i = 0; i <= N; i++) w[i] = __ldg(a + i);
#pragma unroll
    for (int i = 0; i < N; i++) o[i] = __funnelshift_r(w[i], w[i + 1], sh);
}

/* The 8 words at p (16-byte aligned) as two 16-byte loads. */
static __device__ __forceinline__ void ld_u4x2(const unsigned char *p, unsigned int *o) {
    const uint4 a = __ldg((const uint4 *)p), b = __ldg((const uint4 *)p + 1);
    o[0] = a.x;
    o[1] = a.y;
    o[2] = a.z;
    o[3] = a.w;
    o[4] = b.x;
    o[5] = b.y;
    o[6] = b.z;
    o[7] = b.w;
}

static __device__ __forceinline__ float ld_h2f(const unsigned char *p) {
    return __half2float(__ushort_as_half(__ldg((const unsigned short *)p)));
}

/* Byte k (0..11) of the three words sc, without indexing a register array
   at run time (that would put it in local memory). */
static __device__ __forceinline__ int sc_byte(const unsigned int *sc, int k) {
    const unsigned int w = k < 4 ? sc[0] : k < 8 ? sc[1] : sc[2];
    return (int)((w >> (8 * (k & 3))) & 255u);
}

/* Q4_K / Q5_K scale and min of sub-block j from the 12 scale bytes (sc as
   three words), as cpu_k4_scale_min. */
static __device__ __forceinline__ void k4_scale_min(const unsigned int *sc, int j, int *s, int *m) {
    if (j < 4) {
        *s = sc_byte(sc, j) & 63;
        *m = sc_byte(sc, j + 4) & 63;
    } else {
        *s = (sc_byte(sc, j + 4) & 15) | ((sc_byte(sc, j - 4) >> 6) << 4);
        *m = (sc_byte(sc, j + 4) >> 4) | ((sc_byte(sc, j) >> 6) << 4);
    }
}

/* Bits 0..3 of h as bit 4 of each of four bytes. */
static __device__ __forceinline__ unsigned int spread4(unsigned int h) {
    return ((h & 1u) << 4) | ((h & 2u) << 11) | ((h & 4u) << 18) | ((h & 8u) << 25);
}

/* ---- one 32-element block ----------------------------------------------------------------- */

/* The 8 level words of a 32-element block (word i: levels 4i .. 4i + 3, as
   the input's A32 record) from its words after d: Q8_0 its 8 words of
   levels; Q4_0 its 4 words of nibbles (low nibbles levels 0..15, high ones
   16..31); Q5_0 qh, then 4 words of nibbles. Q4_0 / Q5_0 levels keep their
   offset (8, 16): blk32_sum takes it out. */
template <int QT> static __device__ __forceinline__ void blk32_levels(const unsigned int *v, unsigned int *w) {
    if (QT == EMBER_CU_Q8_0) {
#pragma unroll
        for (int i = 0; i < 8; i++) w[i] = v[i];
    } else if (QT == EMBER_CU_Q4_0) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            w[i] = v[i] & 0x0f0f0f0fu;
            w[4 + i] = (v[i] >> 4) & 0x0f0f0f0fu;
        }
    } else {
        const unsigned int qh = v[0];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            w[i] = (v[1 + i] & 0x0f0f0f0fu) | spread4(qh >> (4 * i));
            w[4 + i] = ((v[1 + i] >> 4) & 0x0f0f0f0fu) | spread4(qh >> (16 + 4 * i));
        }
    }
}

/* The exact sum S of a block: level words w (blk32_levels) against the
   input's levels ya (0..15), yb (16..31) and their sum ys. */
template <int QT> static __device__ __forceinline__ int blk32_sum(const unsigned int *w, uint4 ya, uint4 yb, int ys) {
    int s = 0;
    s = __dp4a((int)w[0], (int)ya.x, s);
    s = __dp4a((int)w[1], (int)ya.y, s);
    s = __dp4a((int)w[2], (int)ya.z, s);
    s = __dp4a((int)w[3], (int)ya.w, s);
    s = __dp4a((int)w[4], (int)yb.x, s);
    s = __dp4a((int)w[5], (int)yb.y, s);
    s = __dp4a((int)w[6], (int)yb.z, s);
    s = __dp4a((int)w[7], (int)yb.w, s);
    if (QT == EMBER_CU_Q4_0) s -= 8 * ys;
    if (QT == EMBER_CU_Q5_0) s -= 16 * ys;
    return s;
}

/* (float)v exactly for |v| < 2^22, without a conversion instruction (a
   quarter-rate one): the bits of 1.5 x 2^23 + v, minus 1.5 x 2^23. Block sums
   of the 32-element types stay under 32 x 128 x 127 < 2^19. */
static __device__ __forceinline__ float small_i2f(int v) {
    return __fsub_rn(__int_as_float(v + 0x4b400000), 12582912.0f);
}

/* An input load: from shared memory (SH) or through the read-only cache. */
template <bool SH, typename T> static __device__ __forceinline__ T ldy(const T *p) {
    if (SH) return *p;
    return __ldg(p);
}

/* ---- the integer sums of one unit -------------------------------------------------------- */

/* s1[m] (and s2[m] for Q4_K / Q5_K) of unit u of the weight row wr against
   input rows m < mt of the activations ya (row stride yrow bytes; in shared
   memory if SH): the unit's whole contribution to the block's S (S1, S2).
   Exact. */
template <int QT, int MT, bool SH = false>
static __device__ __forceinline__ void unit_sums(const unsigned char *wr, int u, const unsigned char *ya, size_t yrow,
                                                 int mt, int *s1, int *s2, bool a16) {
    typedef qt_info<QT> I;
    if (!I::A256) {
        const unsigned char *blk = wr + (size_t)u * I::QB;
        const unsigned char *y0 = ya + (size_t)u * A32_BYTES;
        unsigned int v[8], w[8];
        ld_words<QT == EMBER_CU_Q8_0 ? 8 : QT == EMBER_CU_Q4_0 ? 4 : 5>(blk + 2, v);
        blk32_levels<QT>(v, w);
#pragma unroll
        for (int m = 0; m < MT; m++) {
            if (m >= mt) break;
            const unsigned char *y = y0 + (size_t)m * yrow;
            s1[m] = blk32_sum<QT>(w, ldy<SH>((const uint4 *)y), ldy<SH>((const uint4 *)(y + 16)),
                                  ldy<SH>((const int *)(y + 36)));
            s2[m] = 0;
        }
    } else if (QT == EMBER_CU_Q4_K || QT == EMBER_CU_Q5_K) {
        const int sb = u >> 2, p = u & 3; /* sub-blocks 2p (low nibbles) and 2p + 1 (high) */
        const unsigned char *blk = wr + (size_t)sb * I::QB;
        unsigned int sc[3], q[8], lo[8], hi[8];
        if (a16) { /* the block 16-byte aligned: d, dmin and the scales are its first word */
            const uint4 hd = __ldg((const uint4 *)blk);
            sc[0] = hd.y;
            sc[1] = hd.z;
            sc[2] = hd.w;
            ld_u4x2(blk + (QT == EMBER_CU_Q4_K ? 16 : 48) + 32 * p, q);
        } else {
            ld_words<3>(blk + 4, sc);
            ld_words<8>(blk + (QT == EMBER_CU_Q4_K ? 16 : 48) + 32 * p, q);
        }
#pragma unroll
        for (int i = 0; i < 8; i++) {
            lo[i] = q[i] & 0x0f0f0f0fu;
            hi[i] = (q[i] >> 4) & 0x0f0f0f0fu;
        }
        if (QT == EMBER_CU_Q5_K) {
            unsigned int h[8];
            if (a16)
                ld_u4x2(blk + 16, h);
            else
                ld_words<8>(blk + 16, h);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                lo[i] |= ((h[i] >> (2 * p)) & 0x01010101u) << 4;
                hi[i] |= ((h[i] >> (2 * p + 1)) & 0x01010101u) << 4;
            }
        }
        int sca, mna, scb, mnb;
        k4_scale_min(sc, 2 * p, &sca, &mna);
        k4_scale_min(sc, 2 * p + 1, &scb, &mnb);
        const unsigned char *y0 = ya + (size_t)sb * A256_BYTES;
#pragma unroll
        for (int m = 0; m < MT; m++) {
            if (m >= mt) break;
            const unsigned char *y = y0 + (size_t)m * yrow;
            const uint4 *yq = (const uint4 *)(y + 64 * p);
            int sa = 0, sbv = 0;
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const uint4 t = ldy<SH>(yq + i), v = ldy<SH>(yq + 2 + i);
                sa = __dp4a((int)lo[4 * i + 0], (int)t.x, sa);
                sa = __dp4a((int)lo[4 * i + 1], (int)t.y, sa);
                sa = __dp4a((int)lo[4 * i + 2], (int)t.z, sa);
                sa = __dp4a((int)lo[4 * i + 3], (int)t.w, sa);
                sbv = __dp4a((int)hi[4 * i + 0], (int)v.x, sbv);
                sbv = __dp4a((int)hi[4 * i + 1], (int)v.y, sbv);
                sbv = __dp4a((int)hi[4 * i + 2], (int)v.z, sbv);
                sbv = __dp4a((int)hi[4 * i + 3], (int)v.w, sbv);
            }
            const int4 bs = ldy<SH>((const int4 *)(y + 256 + 16 * p)); /* bs16[4p .. 4p + 3] */
            s1[m] = sca * sa + scb * sbv;
            s2[m] = mna * (bs.x + bs.y) + mnb * (bs.z + bs.w);
        }
    } else { /* Q6_K: unit = half n of the super-block (128 elements, sub-blocks 8n .. 8n + 7) */
        const int sb = u >> 1, n = u & 1;
        const unsigned char *blk = wr + (size_t)sb * I::QB;
        unsigned int L[16], H[8], S[2];
        ld_words<16>(blk + 64 * n, L);
        ld_words<8>(blk + 128 + 32 * n, H);
        ld_words<2>(blk + 192 + 8 * n, S);
        const signed char *sc = (const signed char *)S;
        const unsigned char *y0 = ya + (size_t)sb * A256_BYTES;
#pragma unroll
        for (int m = 0; m < MT; m++) {
            if (m >= mt) break;
            const unsigned char *y = y0 + (size_t)m * yrow;
            const uint4 *yq = (const uint4 *)(y + 128 * n);
            const int4 bsa = ldy<SH>((const int4 *)(y + 256 + 32 * n)),
                       bsb = ldy<SH>((const int4 *)(y + 256 + 32 * n + 16));
            const int bs[8] = {bsa.x, bsa.y, bsa.z, bsa.w, bsb.x, bsb.y, bsb.z, bsb.w};
            int tot = 0;
#pragma unroll
            for (int k = 0; k < 4; k++) { /* quarter k: elements 32k .. 32k + 31, sub-blocks 2k, 2k + 1 */
                int part[2] = {0, 0};
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const uint4 t = ldy<SH>(yq + 2 * k + h);
                    const unsigned int yv[4] = {t.x, t.y, t.z, t.w};
#pragma unroll
                    for (int gg = 0; gg < 4; gg++) {
                        const int g = 4 * h + gg;
                        const unsigned int l = L[g + 8 * (k & 1)];
                        const unsigned int nib = k < 2 ? (l & 0x0f0f0f0fu) : ((l >> 4) & 0x0f0f0f0fu);
                        const unsigned int lv = nib | (((H[g] >> (2 * k)) & 0x03030303u) << 4);
                        part[h] = __dp4a((int)lv, (int)yv[gg], part[h]);
                    }
                }
                tot += (int)sc[2 * k] * (part[0] - 32 * bs[2 * k]) + (int)sc[2 * k + 1] * (part[1] - 32 * bs[2 * k + 1]);
            }
            s1[m] = tot;
            s2[m] = 0;
        }
    }
}

/* ---- the product kernel -------------------------------------------------------------------- */

#define QR 8 /* weight rows per block: one per warp */

/* The shared-memory slot of entry c (< N, a power of two) of output o's row of N entries: c with
   its low bits XORed by a key of o, such that the 32 outputs of a warp that read entry c together
   (the chain threads) find it in 32 different banks, and the lanes that write one output's
   consecutive entries still do. Unswizzled, a row of 32 UPT entries put every chain thread of a
   warp in one bank: 8- to 32-way conflicts on each step of the chain (bench/RESULTS.md). */
template <int N> static __device__ __forceinline__ int swz(int c, int o) {
    return N >= 32 ? c ^ (o & 31) : c ^ ((o / (32 / N)) & (N - 1));
}

/* The slot of entry c of output o in a row of N (+ PADW) entries: one input row (PADW = 1) pads
   each row by a word instead (8 chain threads; the chain's addresses stay immediate offsets, which
   measured faster there: 8B q4_0 decode 3.42 against 3.51 ms a step swizzled); more rows swizzle,
   which measured faster than the pad at 4 and 8 rows for most types (an 8B layer's Q4_0 products
   at 8 rows 227 against 260 us; bench/RESULTS.md). */
template <int N, int PADW> static __device__ __forceinline__ int slot_of(int c, int o) {
    return PADW ? c : swz<N>(c, o);
}

/* The constants of a chunk of qmm_k / qmv_k for type QT with UPT units a
   lane: units per block U, units UCH and blocks BCH per row per chunk,
   TWO (Q4_K / Q5_K: a second chain term for the mins), the input record's
   bytes AB and its d's offset YD, the weight block's d offset WD. */
template <int QT, int UPT> struct qchunk {
    enum {
        U = qt_info<QT>::QEL / qt_info<QT>::UEL,
        UCH = 32 * UPT,
        BCH = UCH / U,
        TWO = QT == EMBER_CU_Q4_K || QT == EMBER_CU_Q5_K,
        AB = qt_info<QT>::A256 ? A256_BYTES : A32_BYTES,
        YD = qt_info<QT>::A256 ? 320 : 32,
        WD = QT == EMBER_CU_Q6_K ? 208 : 0
    };
};

template <int QT, int MT, int UPT>
static __global__ void __launch_bounds__(256) qmm_k(const ember_cu_qmm a) {
    typedef qt_info<QT> I;
    typedef qchunk<QT, UPT> C;
    constexpr int U = C::U, UCH = C::UCH, BCH = C::BCH, TWO = C::TWO, AB = C::AB, YD = C::YD, WD = C::WD;
    /* per chunk: the units' exact sums (as float already where a block is one unit: exact below 2^24,
       else the conversion the chain would make), and each block's f32(w.d) * y.d (and -(dmin * y.d)) */
    constexpr int PW = MT == 1; /* rows padded (one input row) or swizzled: slot_of */
    __shared__ int part[2][QR][MT][UCH + PW];
    __shared__ int part2[TWO ? 2 : 1][TWO ? QR : 1][TWO ? MT : 1][TWO ? UCH + PW : 1];
    __shared__ float dd[2][QR][MT][BCH + PW];
    __shared__ float dd2[TWO ? 2 : 1][TWO ? QR : 1][TWO ? MT : 1][TWO ? BCH + PW : 1];
    ember_pdl_enter();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tid = threadIdx.x;
    const ember_cu_mm_prod p = ember_cu_pick_prod(a, (int)blockIdx.y);
    const int n0 = ((int)blockIdx.y - p.first_block) * QR, m0 = (int)blockIdx.x * MT;
    const int mt = a.M - m0 < MT ? a.M - m0 : MT;
    const int nblk = a.K / I::QEL, nunits = nblk * U;
    const size_t rowb = (size_t)nblk * I::QB;
    const size_t yrow = (size_t)nblk * AB;
    const unsigned char *ya = (const unsigned char *)a.act + (size_t)m0 * yrow;
    const int row = n0 + warp;
    const bool rv = row < p.N;
    const unsigned char *wr = (const unsigned char *)p.w + (size_t)(rv ? row : 0) * rowb;
    /* the output this thread chains, if any */
    const int cr = tid / MT, cm = tid % MT;
    const bool chain = tid < QR * MT && n0 + cr < p.N && cm < mt;
    float acc = 0.0f;
    int buf = 0;
    for (int c0 = 0; c0 < nunits; c0 += UCH, buf ^= 1) {
#pragma unroll
        for (int i = 0; i < UPT; i++) {
            const int slot = lane + 32 * i, u = c0 + slot;
            const bool uv = rv && u < nunits;
            int s1[MT], s2[MT];
#pragma unroll
            for (int m = 0; m < MT; m++) s1[m] = s2[m] = 0;
            if (uv) unit_sums<QT, MT>(wr, u, ya, yrow, mt, s1, s2, a.a16);
#pragma unroll
            for (int m = 0; m < MT; m++) {
                const int sw = slot_of<UCH, PW>(slot, warp * MT + m);
                if (U == 1)
                    part[buf][warp][m][sw] = __float_as_int(__int2float_rn(s1[m]));
                else
                    part[buf][warp][m][sw] = s1[m];
                if (TWO) part2[buf][warp][m][sw] = s2[m];
            }
            if (slot % U == 0) { /* the first unit of a block: its scales */
                const int b = u / U;
                float wd = 0.0f, wm = 0.0f;
                if (uv) {
                    wd = ld_h2f(wr + (size_t)b * I::QB + WD);
                    if (TWO) wm = ld_h2f(wr + (size_t)b * I::QB + 2);
                }
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    const float yd = uv && m < mt ? __ldg((const float *)(ya + (size_t)m * yrow + (size_t)b * AB + YD))
                                                  : 0.0f;
                    const int sw = slot_of<BCH, PW>(slot / U, warp * MT + m);
                    dd[buf][warp][m][sw] = __fmul_rn(wd, yd);
                    if (TWO) dd2[buf][warp][m][sw] = -__fmul_rn(wm, yd);
                }
            }
        }
        __syncthreads();
        if (chain) {
            const int nb = (nunits - c0 < UCH ? nunits - c0 : UCH) / U;
#pragma unroll 8
            for (int c = 0; c < nb; c++) {
                if (U == 1) {
                    acc = fmaf(dd[buf][cr][cm][slot_of<BCH, PW>(c, tid)],
                               __int_as_float(part[buf][cr][cm][slot_of<UCH, PW>(c, tid)]), acc);
                } else {
                    int S1 = 0, S2 = 0;
#pragma unroll
                    for (int k = 0; k < U; k++) {
                        S1 += part[buf][cr][cm][slot_of<UCH, PW>(c * U + k, tid)];
                        if (TWO) S2 += part2[buf][cr][cm][slot_of<UCH, PW>(c * U + k, tid)];
                    }
                    acc = fmaf(dd[buf][cr][cm][slot_of<BCH, PW>(c, tid)], __int2float_rn(S1), acc);
                    if (TWO) acc = fmaf(dd2[buf][cr][cm][slot_of<BCH, PW>(c, tid)], __int2float_rn(S2), acc);
                }
            }
        }
    }
    if (chain) {
        const int n = n0 + cr;
        float o = acc;
        if (p.bias) o = o + p.bias[n];
        p.out[(size_t)(m0 + cm) * (size_t)p.N + (size_t)n] = o;
    }
}

/* ---- the one-row kernel (M = 1) ---------------------------------------------------------- */

/* qmv_k: one input row against Q4_K, Q5_K or Q6_K weights. As qmm_k at
   MT = 1 (a warp per weight row, each lane the integer sums of UPT units a
   chunk), with two changes:
   - the input row is copied into shared memory once per block (cp.async),
     where qmm_k's eight warps each read it through the L1 cache;
   - each warp runs its own row's chain (lane 0, from the warp's part of
     shared memory) right after its sums, so no warp waits at a block
     barrier for another's chain, and a block's warps finish independently.
   The sums, the scales and the chain are qmm_k's: the same bits. Measured
   on the H200 (bench/RESULTS.md): the Q6_K products of an 8B decode step
   11% faster, Q4_K 3%; the 32-element types 10-20% slower (ncu: the L1
   stays busy with their weights' unaligned word loads, and the chain on
   one lane a warp costs more than it saves), so they stay on qmm_k (Q4_0:
   qmv4_k, below). */
#define QV_ACT_MAX (64 * 1024) /* the largest input row staged (bytes of its quantized form) */

template <int QT, int UPT> static __global__ void __launch_bounds__(256) qmv_k(const ember_cu_qmm a) {
    typedef qt_info<QT> I;
    typedef qchunk<QT, UPT> C;
    constexpr int U = C::U, UCH = C::UCH, BCH = C::BCH, TWO = C::TWO, AB = C::AB, YD = C::YD, WD = C::WD;
    static_assert(U > 1, "the K types only: a block is several units");
    extern __shared__ __align__(16) unsigned char qv_act[]; /* the input row, nblk x AB bytes */
    __shared__ int part[QR][UCH];
    __shared__ int part2[TWO ? QR : 1][TWO ? UCH : 1];
    __shared__ float dd[QR][BCH];
    __shared__ float dd2[TWO ? QR : 1][TWO ? BCH : 1];
    ember_pdl_enter();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nblk = a.K / I::QEL, nunits = nblk * U;
    for (int i = threadIdx.x; i < nblk * AB / 16; i += 256)
        ember_cp16(qv_act + 16 * i, (const unsigned char *)a.act + 16 * (size_t)i);
    ember_cp_commit();
    ember_cp_wait<0>();
    __syncthreads(); /* the only block barrier */
    const ember_cu_mm_prod p = ember_cu_pick_prod(a, (int)blockIdx.y);
    const int row = ((int)blockIdx.y - p.first_block) * QR + warp;
    if (row >= p.N) return;
    const unsigned char *wr = (const unsigned char *)p.w + (size_t)row * (size_t)nblk * I::QB;
    float acc = 0.0f;
    for (int c0 = 0; c0 < nunits; c0 += UCH) {
#pragma unroll
        for (int i = 0; i < UPT; i++) {
            const int slot = lane + 32 * i, u = c0 + slot;
            const bool uv = u < nunits;
            int s1[1] = {0}, s2[1] = {0};
            if (uv) unit_sums<QT, 1, true>(wr, u, qv_act, 0, 1, s1, s2, a.a16);
            part[warp][slot] = s1[0];
            if (TWO) part2[warp][slot] = s2[0];
            if (slot % U == 0) { /* the first unit of a block: its scales */
                const int b = u / U;
                float wd = 0.0f, wm = 0.0f, yd = 0.0f;
                if (uv) {
                    wd = ld_h2f(wr + (size_t)b * I::QB + WD);
                    if (TWO) wm = ld_h2f(wr + (size_t)b * I::QB + 2);
                    yd = *(const float *)(qv_act + (size_t)b * AB + YD);
                }
                dd[warp][slot / U] = __fmul_rn(wd, yd);
                if (TWO) dd2[warp][slot / U] = -__fmul_rn(wm, yd);
            }
        }
        __syncwarp();
        if (lane == 0) {
            const int nb = (nunits - c0 < UCH ? nunits - c0 : UCH) / U;
#pragma unroll 8
            for (int c = 0; c < nb; c++) {
                int S1 = 0, S2 = 0;
#pragma unroll
                for (int k = 0; k < U; k++) {
                    S1 += part[warp][c * U + k];
                    if (TWO) S2 += part2[warp][c * U + k];
                }
                acc = fmaf(dd[warp][c], __int2float_rn(S1), acc);
                if (TWO) acc = fmaf(dd2[warp][c], __int2float_rn(S2), acc);
            }
        }
        __syncwarp(); /* the chain has read this chunk's sums */
    }
    if (lane == 0) {
        float o = acc;
        if (p.bias) o = o + p.bias[row];
        p.out[row] = o;
    }
}

/* Whether qmv_k takes this launch: ember_cu_qmv on, one row, a K type (the
   32-element types measured slower through it than through qmm_k: the
   weights' own loads keep the L1 busy there; bench/RESULTS.md), an input
   row of at most QV_ACT_MAX bytes, 16-byte aligned. ember_cu_qmv also
   switches qmv4_k (Q4_0). */
extern "C" {
int ember_cu_qmv = 1;
int ember_cu_qld16 = 1;
}
static bool qmv_takes(const ember_cu_qmm *a) {
    return ember_cu_qmv && a->M == 1 && ember_cu_q256(a->qtype) && !((uintptr_t)a->act & 15u) &&
           ember_cu_qact_bytes(a->qtype, 1, a->K) <= QV_ACT_MAX;
}

template <int QT> static cudaError_t qmv_launch(cudaStream_t stream, const ember_cu_qmm *a, int blocks) {
    return ember_launch(qmv_k<QT, 2>, dim3(1, (unsigned)blocks), dim3(256), ember_cu_qact_bytes(QT, 1, a->K), stream,
                        *a);
}

/* ---- the one-row kernel for Q4_0 ------------------------------------------------------------ */

/* qmv4_k: one input row against Q4_0 weights. qmm_k at MT = 1 (a warp per
   weight row, 8 rows a block, each lane the sums of 4 blocks a chunk, the
   chain by one thread per row after a block barrier: the same sums and
   chain, so the same bits), with fewer, wider loads:
   - a lane reads its 18-byte weight block as the two aligned 16-byte words
     that hold it (q4_words), where qmm_k issues a 4-byte load for each of
     its five words and one for d;
   - the input row is copied into shared memory once per block (cp.async),
     where each of qmm_k's warps reads it through the L1 cache at a 48-byte
     stride;
   - the first chunk's weight loads go out before the input copy is waited
     for.
   The reads stay inside the buffer: an aligned word that starts before a
   block starts at or after the buffer's 256-byte aligned start, and the
   second ends at most 14 bytes past the block (the buffers have 16 spare
   bytes). Measured on the H200 (bench/RESULTS.md): the 8B q4_0 products of
   a decode step 1.99 (qmm_k, padded) -> 1.83 ms. Q8_0 and Q5_0 (three words a
   block) measured slower through the same design than through qmm_k, so
   they stay there. */
#define Q4V_UPT 4 /* blocks a lane a chunk */

/* The aligned 16-byte words holding the Q4_0 block at blk (2-byte aligned). */
static __device__ __forceinline__ void q4_load(const unsigned char *blk, uint4 *v) {
    const uint4 *a = (const uint4 *)((uintptr_t)blk & ~(uintptr_t)15);
    v[0] = __ldg(a);
    v[1] = __ldg(a + 1);
}

/* From the words v of a Q4_0 block at byte offset o (even, < 16) of v: its
   d, and its four words of nibbles in nib (as ld_words<4>(blk + 2) gives
   them). The word offset o / 4 is applied by two rounds of selects (a
   register array indexed at run time would go to local memory), the
   remaining 2 bytes by a funnel shift. */
static __device__ __forceinline__ float q4_words(const uint4 *v, int o, unsigned int *nib) {
    const unsigned int w[12] = {v[0].x, v[0].y, v[0].z, v[0].w, v[1].x, v[1].y, v[1].z, v[1].w, 0, 0, 0, 0};
    const int q = o >> 2;
    const unsigned int sh = (unsigned int)(o & 2) * 8u;
    unsigned int t[8], u[6], r[5];
#pragma unroll
    for (int k = 0; k < 8; k++) t[k] = (q & 1) ? w[k + 1] : w[k];
#pragma unroll
    for (int k = 0; k < 6; k++) u[k] = (q & 2) ? t[k + 2] : t[k]; /* w[q + k] */
#pragma unroll
    for (int k = 0; k < 5; k++) r[k] = __funnelshift_r(u[k], u[k + 1], sh); /* bytes o + 4k .. o + 4k + 3 */
#pragma unroll
    for (int k = 0; k < 4; k++) nib[k] = __byte_perm(r[k], r[k + 1], 0x5432); /* bytes o + 2 + 4k .. */
    return __half2float(__ushort_as_half((unsigned short)(r[0] & 0xffffu)));
}

static __global__ void __launch_bounds__(256) qmv4_k(const ember_cu_qmm a) {
    constexpr int UCH = 32 * Q4V_UPT, QB = qt_info<EMBER_CU_Q4_0>::QB;
    extern __shared__ __align__(16) unsigned char qv_act[]; /* the input row, nblk x A32_BYTES */
    __shared__ int part[2][QR][UCH + 1];                    /* padded: slot_of */
    __shared__ float dd[2][QR][UCH + 1];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tid = threadIdx.x;
    const ember_cu_mm_prod p = ember_cu_pick_prod(a, (int)blockIdx.y);
    const int nblk = a.K / 32;
    const int n0 = ((int)blockIdx.y - p.first_block) * QR, row = n0 + warp;
    const bool rv = row < p.N, chain = tid < QR && n0 + tid < p.N;
    const unsigned char *wr = (const unsigned char *)p.w + (size_t)(rv ? row : 0) * (size_t)nblk * QB;
    uint4 v[Q4V_UPT][2];
    /* the first chunk's weights before the input is waited for; where nothing queued writes them (a.early),
       before the kernel before this one has finished */
    if (!a.early) ember_pdl_enter();
#pragma unroll
    for (int i = 0; i < Q4V_UPT; i++)
        if (rv && lane + 32 * i < nblk) q4_load(wr + (size_t)(lane + 32 * i) * QB, v[i]);
    if (a.early) ember_pdl_enter();
    for (int i = tid; i < nblk * A32_BYTES / 16; i += 256)
        ember_cp16(qv_act + 16 * i, (const unsigned char *)a.act + 16 * (size_t)i);
    ember_cp_commit();
    ember_cp_wait<0>();
    __syncthreads();
    float acc = 0.0f;
    int buf = 0;
    for (int c0 = 0; c0 < nblk; c0 += UCH, buf ^= 1) {
        if (c0 > 0)
#pragma unroll
            for (int i = 0; i < Q4V_UPT; i++)
                if (rv && c0 + lane + 32 * i < nblk) q4_load(wr + (size_t)(c0 + lane + 32 * i) * QB, v[i]);
#pragma unroll
        for (int i = 0; i < Q4V_UPT; i++) {
            const int slot = lane + 32 * i, u = c0 + slot;
            float s = 0.0f, d = 0.0f;
            if (rv && u < nblk) {
                unsigned int nib[4], lw[8];
                const float wd = q4_words(v[i], (int)((uintptr_t)(wr + (size_t)u * QB) & 15), nib);
                blk32_levels<EMBER_CU_Q4_0>(nib, lw);
                const unsigned char *y = qv_act + (size_t)u * A32_BYTES;
                s = __int2float_rn(blk32_sum<EMBER_CU_Q4_0>(lw, *(const uint4 *)y, *(const uint4 *)(y + 16),
                                                            *(const int *)(y + 36)));
                d = __fmul_rn(wd, *(const float *)(y + 32));
            }
            part[buf][warp][slot] = __float_as_int(s);
            dd[buf][warp][slot] = d;
        }
        __syncthreads();
        if (chain) {
            const int nb = nblk - c0 < UCH ? nblk - c0 : UCH;
#pragma unroll 8
            for (int c = 0; c < nb; c++)
                acc = fmaf(dd[buf][tid][c], __int_as_float(part[buf][tid][c]), acc);
        }
    }
    if (chain) {
        float o = acc;
        if (p.bias) o = o + p.bias[n0 + tid];
        p.out[n0 + tid] = o;
    }
}

/* Whether qmv4_k takes this launch: ember_cu_qmv on, one row, Q4_0, an
   input row of at most QV_ACT_MAX bytes, 16-byte aligned. */
static bool qmv4_takes(const ember_cu_qmm *a) {
    return ember_cu_qmv && a->M == 1 && a->qtype == EMBER_CU_Q4_0 && !((uintptr_t)a->act & 15u) &&
           ember_cu_qact_bytes(a->qtype, 1, a->K) <= QV_ACT_MAX;
}

#define QV_PREP(T)                                                                                            \
    if (e == cudaSuccess)                                                                                     \
        e = cudaFuncSetAttribute(qmv_k<T, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, QV_ACT_MAX);
extern "C" cudaError_t ember_cu_qmm_prepare(void) {
    cudaError_t e = cudaSuccess;
    QV_PREP(EMBER_CU_Q4_K)
    QV_PREP(EMBER_CU_Q5_K)
    QV_PREP(EMBER_CU_Q6_K)
    if (e == cudaSuccess) e = cudaFuncSetAttribute(qmv4_k, cudaFuncAttributeMaxDynamicSharedMemorySize, QV_ACT_MAX);
    return e;
}
#undef QV_PREP

/* ---- the tensor-core kernel (M >= QTC_MIN_M, 32-element types) ------------------------------ */

/* d = a b + c: one mma.sync m16n8k32, s8 in, s32 accumulate (PTX ISA,
   "mma.m16n8k32"): a: rows g and g + 8, levels 4t .. 4t + 3 and 16 + 4t ..;
   b: input row g, levels 4t .. and 16 + 4t ..; d: rows g, g + 8 x inputs 2t,
   2t + 1 (lane = 4g + t). Exact. */
static __device__ __forceinline__ void mma_s8(int d[4], const unsigned int a[4], uint2 b) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%10, %11, %12, %13};\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y), "r"(0), "r"(0), "r"(0), "r"(0));
}

/* This lane's A fragment of block b for weight rows r0 = 16 tile + g and r0 + 8
   (zero rows past N), and their scales. */
template <int QT>
static __device__ __forceinline__ void tc_afrag(const unsigned char *w, size_t rowb, int N, int r0, int t, int b,
                                                unsigned int a[4], float wd[2]) {
    typedef qt_info<QT> I;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = r0 + 8 * h;
        if (r >= N) {
            a[h] = a[2 + h] = 0;
            wd[h] = 0.0f;
            continue;
        }
        const unsigned char *blk = w + (size_t)r * rowb + (size_t)b * I::QB;
        wd[h] = ld_h2f(blk);
        if (QT == EMBER_CU_Q8_0) {
            unsigned int v[1], u[1];
            ld_words<1>(blk + 2 + 4 * t, v);
            ld_words<1>(blk + 18 + 4 * t, u);
            a[h] = v[0];
            a[2 + h] = u[0];
        } else if (QT == EMBER_CU_Q4_0) {
            unsigned int v[1];
            ld_words<1>(blk + 2 + 4 * t, v);
            a[h] = v[0] & 0x0f0f0f0fu;
            a[2 + h] = (v[0] >> 4) & 0x0f0f0f0fu;
        } else { /* Q5_0 */
            unsigned int qh[1], v[1];
            ld_words<1>(blk + 2, qh);
            ld_words<1>(blk + 6 + 4 * t, v);
            a[h] = (v[0] & 0x0f0f0f0fu) | spread4(qh[0] >> (4 * t));
            a[2 + h] = ((v[0] >> 4) & 0x0f0f0f0fu) | spread4(qh[0] >> (16 + 4 * t));
        }
    }
}

/* The tensor-core kernels' outputs: lane 4g + t's acc[j][i] is weight row r0 + 8 (i >> 1) (r0 = 16 tile +
   g) x input row 8 (s0 + j) + 2t + (i & 1); those inside the product p's N and M rows, plus the bias. A
   macro, so that both kernels keep the code they were measured with (a device function taking p changed
   how the compiler loads the parameters). */
#define TC_STORE(SPW_, p, M_, r0, s0, t, acc)                                                                      \
    do {                                                                                                           \
        _Pragma("unroll") for (int j_ = 0; j_ < (SPW_); j_++) {                                                    \
            _Pragma("unroll") for (int i_ = 0; i_ < 4; i_++) {                                                     \
                const int n_ = (r0) + 8 * (i_ >> 1), m_ = 8 * ((s0) + j_) + 2 * (t) + (i_ & 1);                    \
                if (n_ >= (p).N || m_ >= (M_)) continue;                                                           \
                float o_ = (acc)[j_][i_];                                                                          \
                if ((p).bias) o_ = o_ + (p).bias[n_];                                                              \
                (p).out[(size_t)m_ * (size_t)(p).N + (size_t)n_] = o_;                                             \
            }                                                                                                      \
        }                                                                                                          \
    } while (0)

#define TC_AHEAD 4 /* blocks whose loads a warp issues together */

/* One warp per block of 32 threads: 16 weight rows x SPW slices of 8 input
   rows (grid x: slice groups, y: row tiles over the products). Blocks go in
   groups of TC_AHEAD, all their loads issued first; then for each block in
   order one mma per slice gives the exact block sums of the warp's 16 x 8
   SPW outputs, and each lane runs the chain step of its 4 SPW outputs (the
   canonical order: acc = fmaf(f32(w.d) * y.d, (float)S, acc)). */
template <int QT, int SPW>
static __global__ void __launch_bounds__(32) qmm_tc_k(const ember_cu_qmm a, int slices) {
    typedef qt_info<QT> I;
    ember_pdl_enter();
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    const ember_cu_mm_prod p = ember_cu_pick_prod(a, (int)blockIdx.y);
    const int r0 = ((int)blockIdx.y - p.first_block) * 16 + g, s0 = (int)blockIdx.x * SPW;
    const int nb = a.K / 32;
    const size_t rowb = (size_t)nb * I::QB;
    const unsigned char *w = (const unsigned char *)p.w;
    const unsigned char *act = (const unsigned char *)a.act;
    float acc[SPW][4];
#pragma unroll
    for (int j = 0; j < SPW; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    for (int b0 = 0; b0 < nb; b0 += TC_AHEAD) {
        unsigned int af[TC_AHEAD][4];
        float wd[TC_AHEAD][2];
        uint2 bf[TC_AHEAD][SPW];
        float4 sc[TC_AHEAD][SPW];
#pragma unroll
        for (int k = 0; k < TC_AHEAD; k++) {
            const int b = b0 + k;
            if (b < nb) tc_afrag<QT>(w, rowb, p.N, r0, t, b, af[k], wd[k]);
            const unsigned char *rec = act + ((size_t)(b < nb ? b : 0) * (size_t)slices + (size_t)s0) * A32T_BYTES;
#pragma unroll
            for (int j = 0; j < SPW; j++) {
                if (b < nb && s0 + j < slices) {
                    bf[k][j] = __ldg((const uint2 *)(rec + (size_t)j * A32T_BYTES + 8 * lane));
                    sc[k][j] = __ldg((const float4 *)(rec + (size_t)j * A32T_BYTES + 256 + 16 * t)); /* d0 d1 s0 s1 */
                }
            }
        }
#pragma unroll
        for (int k = 0; k < TC_AHEAD; k++) {
            if (b0 + k >= nb) break;
#pragma unroll
            for (int j = 0; j < SPW; j++) {
                if (s0 + j >= slices) break;
                int d[4];
                mma_s8(d, af[k], bf[k][j]);
                if (QT != EMBER_CU_Q8_0) { /* Q4_0 / Q5_0 levels unsigned: minus 8 (16) times the input's level sum */
                    const int m = QT == EMBER_CU_Q4_0 ? 8 : 16;
                    const int k0 = m * __float_as_int(sc[k][j].z), k1 = m * __float_as_int(sc[k][j].w);
                    d[0] -= k0;
                    d[1] -= k1;
                    d[2] -= k0;
                    d[3] -= k1;
                }
                acc[j][0] = fmaf(__fmul_rn(wd[k][0], sc[k][j].x), small_i2f(d[0]), acc[j][0]);
                acc[j][1] = fmaf(__fmul_rn(wd[k][0], sc[k][j].y), small_i2f(d[1]), acc[j][1]);
                acc[j][2] = fmaf(__fmul_rn(wd[k][1], sc[k][j].x), small_i2f(d[2]), acc[j][2]);
                acc[j][3] = fmaf(__fmul_rn(wd[k][1], sc[k][j].y), small_i2f(d[3]), acc[j][3]);
            }
        }
    }
    TC_STORE(SPW, p, a.M, r0, s0, t, acc);
}

/* The tensor-core kernels' grid: slices of 8 input rows (*S), *spw of them a warp (two where the grid still
   has 4,096 warps, about 31 a multiprocessor, else one) along x, the tiles of 16 weight rows along y. */
static dim3 tc_grid(const ember_cu_qmm *a, int tiles, int *S, int *spw) {
    *S = (a->M + 7) / 8;
    *spw = (long long)((*S + 1) / 2) * tiles >= 4096 ? 2 : 1;
    return dim3((unsigned)((*S + *spw - 1) / *spw), (unsigned)tiles);
}

template <int QT> static cudaError_t qmm_tc(cudaStream_t stream, const ember_cu_qmm *a, int tiles) {
    int S, spw;
    const dim3 grid = tc_grid(a, tiles, &S, &spw);
    if (spw == 2) return ember_launch(qmm_tc_k<QT, 2>, grid, dim3(32), 0, stream, *a, S);
    return ember_launch(qmm_tc_k<QT, 1>, grid, dim3(32), 0, stream, *a, S);
}

/* ---- the K types on the tensor cores (M >= QTC_MIN_M) -------------------------------------- */

/* d = a b: one mma.sync m16n8k16, s8 in, s32 out: a: rows g and g + 8, levels
   4t .. 4t + 3; b: input row g, levels 4t .. 4t + 3; d as mma_s8's. Exact. */
static __device__ __forceinline__ void mma_s8_k16(int d[4], unsigned int a0, unsigned int a1, unsigned int b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
                 "{%7, %8, %9, %10};\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a0), "r"(a1), "r"(b), "r"(0), "r"(0), "r"(0), "r"(0));
}

/* The 32-bit word at p: an aligned load where A4 (the caller knows p is
   4-byte aligned), else ld_words' two (p 2-byte aligned). */
template <bool A4> static __device__ __forceinline__ unsigned int ld_w(const unsigned char *p) {
    if (A4) return __ldg((const unsigned int *)p);
    unsigned int v[1];
    ld_words<1>(p, v);
    return v[0];
}

/* What a lane holds of one super-block of one weight row (zeros for a row
   past N): its d (and Q4_K / Q5_K dmin) as f32, the scale words, and the
   words of its levels: Q4_K / Q5_K q[2p + h]: qs bytes 32p + 16h + 4t ..
   (nibbles of sub-blocks 2p, 2p + 1), Q5_K qh[h]: qh bytes 16h + 4t ..;
   Q6_K q[4n + 2k2 + h]: ql bytes 64n + 32k2 + 16h + 4t .., qh[2n + h]: qh
   bytes 32n + 16h + 4t ... One shape for every type (what a type does not
   load, it does not read, and the registers go). */
struct tck_row {
    float d, dm;
    unsigned int sc[4];
    unsigned int q[8];
    unsigned int qh[4];
};

template <int QT, bool A4> static __device__ __forceinline__ void tck_load(const unsigned char *blk, int t, tck_row *r) {
    if (QT == EMBER_CU_Q6_K) {
        r->d = ld_h2f(blk + 208);
        r->dm = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) r->sc[i] = ld_w<false>(blk + 192 + 4 * i);
#pragma unroll
        for (int i = 0; i < 8; i++) r->q[i] = ld_w<false>(blk + 16 * i + 4 * t); /* 64n + 32k2 + 16h = 16 (4n + 2k2 + h) */
#pragma unroll
        for (int i = 0; i < 4; i++) r->qh[i] = ld_w<false>(blk + 128 + 16 * i + 4 * t);
    } else {
        const unsigned int dw = ld_w<A4>(blk);
        r->d = __half2float(__ushort_as_half((unsigned short)(dw & 0xffffu)));
        r->dm = __half2float(__ushort_as_half((unsigned short)(dw >> 16)));
#pragma unroll
        for (int i = 0; i < 3; i++) r->sc[i] = ld_w<A4>(blk + 4 + 4 * i);
        const int qo = QT == EMBER_CU_Q4_K ? 16 : 48;
#pragma unroll
        for (int i = 0; i < 8; i++) r->q[i] = ld_w<A4>(blk + qo + 16 * i + 4 * t);
        if (QT == EMBER_CU_Q5_K) {
            r->qh[0] = ld_w<A4>(blk + 16 + 4 * t);
            r->qh[1] = ld_w<A4>(blk + 32 + 4 * t);
        }
    }
}

static __device__ __forceinline__ void tck_clear(tck_row *r) {
    r->d = r->dm = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) r->sc[i] = r->qh[i] = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) r->q[i] = 0;
}

/* Q4_K / Q5_K: the level words (k 4t .., 16 + 4t ..) of sub-block j of a row. */
template <int QT> static __device__ __forceinline__ void tck_k4_levels(const tck_row *r, int j, unsigned int *lo,
                                                                      unsigned int *hi) {
    const int p = j >> 1, sh = 4 * (j & 1);
    *lo = (r->q[2 * p] >> sh) & 0x0f0f0f0fu;
    *hi = (r->q[2 * p + 1] >> sh) & 0x0f0f0f0fu;
    if (QT == EMBER_CU_Q5_K) {
        *lo |= ((r->qh[0] >> j) & 0x01010101u) << 4;
        *hi |= ((r->qh[1] >> j) & 0x01010101u) << 4;
    }
}

/* Q6_K: the level words (unsigned, 0..63) of sub-block j = 4n + k of a row. */
static __device__ __forceinline__ void tck_q6_levels(const tck_row *r, int j, unsigned int *lo,
                                                     unsigned int *hi) {
    const int n = j >> 2, k = j & 3, sh = 4 * (k >> 1);
    const int qi = 4 * n + 2 * (k & 1);
    *lo = ((r->q[qi] >> sh) & 0x0f0f0f0fu) | (((r->qh[2 * n] >> (2 * k)) & 0x03030303u) << 4);
    *hi = ((r->q[qi + 1] >> sh) & 0x0f0f0f0fu) | (((r->qh[2 * n + 1] >> (2 * k)) & 0x03030303u) << 4);
}

/* Q6_K's scale of sub-block i of 16 (signed). */
static __device__ __forceinline__ int tck_q6_scale(const tck_row *r, int i) {
    return (int)(signed char)(unsigned char)((r->sc[i >> 2] >> (8 * (i & 3))) & 255u);
}

/* One warp per block of 32 threads: 16 weight rows (r0 = 16 tile + g and r0 +
   8) x SPW slices of 8 input rows, as qmm_tc_k. Per super-block: the lane's
   words of both rows, then for each sub-block j the mma of each slice and
   the integer scaling (S1 += sc_j S_j; Q4_K / Q5_K S2 += m_j bs32_j; Q6_K
   per sub-block of 16: S1 += sc (S - 32 bs16)), then the chain step of each
   output: acc = fmaf(f32(w.d) * y.d, (float)S1, acc) (and fmaf(-(f32(w.dmin) *
   y.d), (float)S2, acc)): qmm_k's integers and chain, the CPU's bits. */
template <int QT, int SPW, bool A4>
static __global__ void __launch_bounds__(32) qmm_tck_k(const ember_cu_qmm a, int slices) {
    typedef qt_info<QT> I;
    constexpr bool TWO = QT == EMBER_CU_Q4_K || QT == EMBER_CU_Q5_K;
    ember_pdl_enter();
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    const ember_cu_mm_prod p = ember_cu_pick_prod(a, (int)blockIdx.y);
    const int r0 = ((int)blockIdx.y - p.first_block) * 16 + g, s0 = (int)blockIdx.x * SPW;
    const int nb = a.K / 256;
    const size_t rowb = (size_t)nb * I::QB;
    const bool rv0 = r0 < p.N, rv1 = r0 + 8 < p.N;
    const unsigned char *w0 = (const unsigned char *)p.w + (size_t)(rv0 ? r0 : 0) * rowb;
    const unsigned char *w1 = (const unsigned char *)p.w + (size_t)(rv1 ? r0 + 8 : 0) * rowb;
    const unsigned char *act = (const unsigned char *)a.act;
    float acc[SPW][4];
#pragma unroll
    for (int j = 0; j < SPW; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    for (int b = 0; b < nb; b++) {
        tck_row R[2];
        if (rv0) tck_load<QT, A4>(w0 + (size_t)b * I::QB, t, &R[0]);
        else tck_clear(&R[0]);
        if (rv1) tck_load<QT, A4>(w1 + (size_t)b * I::QB, t, &R[1]);
        else tck_clear(&R[1]);
        const unsigned char *rec = act + ((size_t)b * (size_t)slices + (size_t)s0) * A256T_BYTES;
        int S1[SPW][4], S2[SPW][4];
#pragma unroll
        for (int jj = 0; jj < SPW; jj++)
#pragma unroll
            for (int i = 0; i < 4; i++) S1[jj][i] = S2[jj][i] = 0;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            unsigned int lo0, hi0, lo1, hi1;
            int sc0 = 0, sc1 = 0, mn0 = 0, mn1 = 0, sa0 = 0, sa1 = 0, sb0 = 0, sb1 = 0;
            if (QT == EMBER_CU_Q6_K) {
                tck_q6_levels(&R[0], j, &lo0, &hi0);
                tck_q6_levels(&R[1], j, &lo1, &hi1);
                sa0 = tck_q6_scale(&R[0], 2 * j);
                sb0 = tck_q6_scale(&R[0], 2 * j + 1);
                sa1 = tck_q6_scale(&R[1], 2 * j);
                sb1 = tck_q6_scale(&R[1], 2 * j + 1);
            } else {
                tck_k4_levels<QT>(&R[0], j, &lo0, &hi0);
                tck_k4_levels<QT>(&R[1], j, &lo1, &hi1);
                k4_scale_min(R[0].sc, j, &sc0, &mn0);
                k4_scale_min(R[1].sc, j, &sc1, &mn1);
            }
#pragma unroll
            for (int jj = 0; jj < SPW; jj++) {
                if (s0 + jj >= slices) break;
                const unsigned char *rj = rec + (size_t)jj * A256T_BYTES;
                const uint2 bf = __ldg((const uint2 *)(rj + 256 * j + 8 * lane));
                /* bs16[2j], bs16[2j + 1] of input rows 2t (ba) and 2t + 1 (bb) of the slice */
                const int2 ba = __ldg((const int2 *)(rj + 2048 + 128 * t + 8 * j));
                const int2 bb = __ldg((const int2 *)(rj + 2048 + 128 * t + 64 + 8 * j));
                if (QT == EMBER_CU_Q6_K) {
                    int da[4], db[4];
                    mma_s8_k16(da, lo0, lo1, bf.x); /* sub-block 2j of 16 */
                    mma_s8_k16(db, hi0, hi1, bf.y); /* sub-block 2j + 1 */
                    S1[jj][0] += sa0 * (da[0] - 32 * ba.x) + sb0 * (db[0] - 32 * ba.y);
                    S1[jj][1] += sa0 * (da[1] - 32 * bb.x) + sb0 * (db[1] - 32 * bb.y);
                    S1[jj][2] += sa1 * (da[2] - 32 * ba.x) + sb1 * (db[2] - 32 * ba.y);
                    S1[jj][3] += sa1 * (da[3] - 32 * bb.x) + sb1 * (db[3] - 32 * bb.y);
                } else {
                    const unsigned int af[4] = {lo0, lo1, hi0, hi1};
                    int d[4];
                    mma_s8(d, af, bf);
                    const int ca = ba.x + ba.y, cb = bb.x + bb.y; /* bs32_j of rows 2t, 2t + 1 */
                    S1[jj][0] += sc0 * d[0];
                    S1[jj][1] += sc0 * d[1];
                    S1[jj][2] += sc1 * d[2];
                    S1[jj][3] += sc1 * d[3];
                    S2[jj][0] += mn0 * ca;
                    S2[jj][1] += mn0 * cb;
                    S2[jj][2] += mn1 * ca;
                    S2[jj][3] += mn1 * cb;
                }
            }
        }
#pragma unroll
        for (int jj = 0; jj < SPW; jj++) {
            if (s0 + jj >= slices) break;
            const float2 yd = __ldg((const float2 *)(rec + (size_t)jj * A256T_BYTES + 2560 + 8 * t)); /* rows 2t, 2t + 1 */
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float wd = i < 2 ? R[0].d : R[1].d, wm = i < 2 ? R[0].dm : R[1].dm;
                const float y = (i & 1) ? yd.y : yd.x;
                acc[jj][i] = fmaf(__fmul_rn(wd, y), __int2float_rn(S1[jj][i]), acc[jj][i]);
                if (TWO) acc[jj][i] = fmaf(-__fmul_rn(wm, y), __int2float_rn(S2[jj][i]), acc[jj][i]);
            }
        }
    }
    TC_STORE(SPW, p, a.M, r0, s0, t, acc);
}

template <int QT> static cudaError_t qmm_tck(cudaStream_t stream, const ember_cu_qmm *a, int tiles) {
    int S, spw;
    const dim3 grid = tc_grid(a, tiles, &S, &spw);
    /* Q4_K / Q5_K blocks (144, 176 bytes) are 16-byte aligned where the weights are; Q6_K's never, so Q6_K
       has only the unaligned instance (K4 false names the same one twice) */
    constexpr bool K4 = QT != EMBER_CU_Q6_K;
    const bool a4 = K4 && a->a16;
    if (spw == 2)
        return a4 ? ember_launch(qmm_tck_k<QT, 2, K4>, grid, dim3(32), 0, stream, *a, S)
                  : ember_launch(qmm_tck_k<QT, 2, false>, grid, dim3(32), 0, stream, *a, S);
    return a4 ? ember_launch(qmm_tck_k<QT, 1, K4>, grid, dim3(32), 0, stream, *a, S)
              : ember_launch(qmm_tck_k<QT, 1, false>, grid, dim3(32), 0, stream, *a, S);
}

template <int QT, int MT>
static cudaError_t qmm_launch(cudaStream_t stream, const ember_cu_qmm *a, int blocks) {
    /* shared memory: 2 x QR x MT x 32 UPT sums (twice for Q4_K / Q5_K) and the scales, under 48 KB */
    constexpr int UPT = qt_info<QT>::A256 ? (MT <= 4 ? 2 : 1) : (MT <= 2 ? 4 : MT == 4 ? 2 : 1);
    const int gx = (a->M + MT - 1) / MT;
    return ember_launch(qmm_k<QT, MT, UPT>, dim3((unsigned)gx, (unsigned)blocks), dim3(256), 0, stream, *a);
}

template <int QT> static cudaError_t qmm_type(cudaStream_t stream, const ember_cu_qmm *a, int blocks) {
    if (a->M == 1) return qmm_launch<QT, 1>(stream, a, blocks);
    if (a->M == 2) return qmm_launch<QT, 2>(stream, a, blocks);
    if (a->M <= 4) return qmm_launch<QT, 4>(stream, a, blocks);
    return qmm_launch<QT, 8>(stream, a, blocks);
}

extern "C" cudaError_t ember_cu_qmatmul(cudaStream_t stream, ember_cu_qmm *a) {
    if (a->M < 1 || a->n < 1 || a->n > EMBER_CU_MAX_MM) return a->M < 1 ? cudaSuccess : cudaErrorInvalidValue;
    const bool tc = qt_tc(a->qtype, a->M);
    const int rows = tc ? 16 : QR; /* weight rows per block */
    int blocks = 0;
    a->a16 = ember_cu_qld16;
    for (int i = 0; i < a->n; i++) {
        a->p[i].first_block = blocks;
        blocks += (a->p[i].N + rows - 1) / rows;
        if ((uintptr_t)a->p[i].w & 15u) a->a16 = 0;
    }
    if (blocks > 65535) return cudaErrorInvalidValue;
    if (tc) switch (a->qtype) {
        case EMBER_CU_Q8_0: return qmm_tc<EMBER_CU_Q8_0>(stream, a, blocks);
        case EMBER_CU_Q4_0: return qmm_tc<EMBER_CU_Q4_0>(stream, a, blocks);
        case EMBER_CU_Q5_0: return qmm_tc<EMBER_CU_Q5_0>(stream, a, blocks);
        case EMBER_CU_Q4_K: return qmm_tck<EMBER_CU_Q4_K>(stream, a, blocks);
        case EMBER_CU_Q5_K: return qmm_tck<EMBER_CU_Q5_K>(stream, a, blocks);
        default: return qmm_tck<EMBER_CU_Q6_K>(stream, a, blocks);
        }
    if (qmv4_takes(a))
        return ember_launch(qmv4_k, dim3(1, (unsigned)blocks), dim3(256), ember_cu_qact_bytes(EMBER_CU_Q4_0, 1, a->K),
                            stream, *a);
    if (qmv_takes(a)) switch (a->qtype) {
        case EMBER_CU_Q4_K: return qmv_launch<EMBER_CU_Q4_K>(stream, a, blocks);
        case EMBER_CU_Q5_K: return qmv_launch<EMBER_CU_Q5_K>(stream, a, blocks);
        default: return qmv_launch<EMBER_CU_Q6_K>(stream, a, blocks);
        }
    switch (a->qtype) {
    case EMBER_CU_Q8_0: return qmm_type<EMBER_CU_Q8_0>(stream, a, blocks);
    case EMBER_CU_Q4_0: return qmm_type<EMBER_CU_Q4_0>(stream, a, blocks);
    case EMBER_CU_Q5_0: return qmm_type<EMBER_CU_Q5_0>(stream, a, blocks);
    case EMBER_CU_Q4_K: return qmm_type<EMBER_CU_Q4_K>(stream, a, blocks);
    case EMBER_CU_Q5_K: return qmm_type<EMBER_CU_Q5_K>(stream, a, blocks);
    case EMBER_CU_Q6_K: return qmm_type<EMBER_CU_Q6_K>(stream, a, blocks);
    default: return cudaErrorInvalidValue;
    }
}

/* ---- get_rows: exact dequantization (cpu_dequant_row) ---------------------------------------- */

/* Element e (< D) of the block row at p (row-major blocks of qtype). */
static __device__ float deq(int qtype, const unsigned char *p, long long e) {
    switch (qtype) {
    case EMBER_CU_Q8_0: {
        const unsigned char *b = p + (e / 32) * 34;
        return (float)(signed char)b[2 + e % 32] * ld_h2f(b);
    }
    case EMBER_CU_Q4_0:
    case EMBER_CU_Q5_0: {
        const int i = (int)(e % 32);
        const bool q5 = qtype == EMBER_CU_Q5_0;
        const unsigned char *b = p + (e / 32) * (q5 ? 22 : 18), *qs = b + (q5 ? 6 : 2);
        int q = i < 16 ? (qs[i] & 15) : (qs[i - 16] >> 4);
        if (q5) q = (q | (((b[2 + i / 8] >> (i % 8)) & 1) << 4)) - 16;
        else q -= 8;
        return (float)q * ld_h2f(b);
    }
    case EMBER_CU_Q4_K:
    case EMBER_CU_Q5_K: {
        const bool q5 = qtype == EMBER_CU_Q5_K;
        const unsigned char *b = p + (e / 256) * (q5 ? 176 : 144);
        const int i = (int)(e % 256), j = i / 32;
        unsigned int sc[3];
        for (int k = 0; k < 3; k++)
            sc[k] = (unsigned int)b[4 + 4 * k] | (unsigned int)b[5 + 4 * k] << 8 | (unsigned int)b[6 + 4 * k] << 16 |
                    (unsigned int)b[7 + 4 * k] << 24;
        int s, m;
        k4_scale_min(sc, j, &s, &m);
        const float d1 = __fmul_rn(ld_h2f(b), (float)s), m1 = __fmul_rn(ld_h2f(b + 2), (float)m);
        const unsigned char byte = b[(q5 ? 48 : 16) + 32 * (j / 2) + i % 32];
        int q = (j % 2) ? (byte >> 4) : (byte & 15);
        if (q5) q += ((b[16 + i % 32] >> j) & 1) << 4;
        return __fsub_rn(__fmul_rn(d1, (float)q), m1);
    }
    default: { /* Q6_K */
        const unsigned char *b = p + (e / 256) * 210;
        const int i = (int)(e % 256), n = i / 128, r = i % 128, k = r / 32, l = r % 32;
        const unsigned char lb = b[64 * n + l + 32 * (k % 2)];
        const int low = k < 2 ? (lb & 15) : (lb >> 4);
        const int q = low | (((b[128 + 32 * n + l] >> (2 * k)) & 3) << 4);
        const float ds = __fmul_rn(ld_h2f(b + 208), (float)(signed char)b[192 + i / 16]);
        return __fmul_rn(ds, (float)(q - 32));
    }
    }
}

static __global__ void __launch_bounds__(256)
    qget_rows_k(float *dst, const unsigned char *src, int qtype, size_t row_bytes, const int32_t *ids, int64_t D) {
    ember_pdl_enter();
    const long long e = (long long)blockIdx.y * 256 + threadIdx.x;
    if (e >= D) return;
    dst[(size_t)blockIdx.x * (size_t)D + (size_t)e] = deq(qtype, src + (size_t)ids[blockIdx.x] * row_bytes, e);
}

extern "C" cudaError_t ember_cu_qget_rows(cudaStream_t stream, float *dst, const void *src, int qtype,
                                          size_t row_bytes, const int32_t *ids, int n, int64_t D) {
    if (n < 1 || D < 1) return cudaSuccess;
    const int64_t gy = (D + 255) / 256;
    if (gy > 65535 || qtype < EMBER_CU_Q8_0 || qtype > EMBER_CU_Q6_K) return cudaErrorInvalidValue;
    return ember_launch(qget_rows_k, dim3((unsigned)n, (unsigned)gy, 1), dim3(256), 0, stream, dst,
                        (const unsigned char *)src, qtype, row_bytes, ids, D);
}
