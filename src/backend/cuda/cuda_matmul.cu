/*
 * cuda_matmul.cu - the matrix products of the CUDA backend: out = x w^T
 * (+ bias) for f32, f16 and bf16 weights, x and out f32.
 *
 * Batch invariance is the point of this file. Every output element is
 * computed in one canonical order per weight dtype that depends on K
 * alone: not on M, on how many weight rows or input rows a warp carries,
 * on the grid, or on the unrolling. No atomics, no split of K that
 * depends on the shape. So every kernel of a dtype gives a row the same
 * bits, whatever batch it is in.
 *
 * bf16 weights: the tensor-core order, for every M.
 *   - x is split per element into two bf16 numbers: hi = bf16(x) and
 *     lo = bf16(x - hi) (round to nearest even; x - hi is exact in f32),
 *     so hi + lo keeps about 16 bits of x's 24 (relative error <= 2^-17);
 *   - K is cut into k-blocks of 32 (k = 32b .. 32b + 31, zero past K);
 *     k-block b belongs to part b % 8;
 *   - the weights are the mma's A operand (16 weight rows), the inputs its
 *     B operand (8 input rows). In k-block b, lane t of the warp (g = t / 4,
 *     q = t % 4) holds k = 32b + 8q .. 32b + 8q + 7 of weight rows g and
 *     g + 8 of its weight tile and of input row g of its input tile.
 *     Elements 8q + 0, 1, 2, 3 fill k slots 2q, 2q + 1, 2q + 8, 2q + 9 of
 *     step 0, elements 8q + 4 .. 7 the same slots of step 1; each step is
 *     one mma.sync m16n8k16 (bf16 in, f32 accumulate) with x's hi, then
 *     one with x's lo, on the same accumulator;
 *   - each part is one accumulator chain, starting at +0, over its
 *     k-blocks in increasing b, steps 0 then 1, hi then lo;
 *   - out = ((p0 + p1) + p2) + ... + p7 (in part order), then + bias[n].
 *   The tensor cores compute an output from its own row of A, column of B
 *   and accumulator only, so padding (input rows past M are zeros, weight
 *   rows past N repeat the last) and the tile a row lands in change
 *   nothing. The parts exist for decode: eight warps walk one tile's K
 *   side by side (PS below).
 * f32 and f16 weights: the CUDA-core order (cuda_kernels.h):
 *   - the K elements are cut into chunks of 8 (k = 8c .. 8c + 7);
 *   - lane l of 32 (one warp) owns the chunks c = l, l + 32, l + 64, ...
 *     and sums them in that order, one fused multiply-add per element, in
 *     k order inside a chunk, into one f32 accumulator;
 *   - the 32 lane sums are combined by the butterfly s = 16, 8, 4, 2, 1
 *     (lane l adds the value of lane l ^ s; the two lanes of a pair add the
 *     same two numbers, so every lane ends with the same bits);
 *   - then out = sum (+ bias[n]).
 *
 * Kernels (one launch per weight dtype; up to 8 products share the input):
 *   wg     bf16, M >= 128 on a GPU of compute capability 9.0, where the grid
 *          of its 128-row blocks fills its waves (cuda_wgmma.cu: Hopper's
 *          wgmma, the same order and bits; EMBER_CUDA_MM_WG=0: never).
 *   tc_blk bf16, off by default (EMBER_CUDA_MM_BLK=N: from N rows on; a
 *          variant of the benchmark). A block of 8 warps per 128 weight
 *          rows x 128 (or 64) input rows, weights and split inputs staged
 *          in shared memory, the parts walked in turn. Measured no faster
 *          than tc_cl (docs/cuda.md: bound by the latency of its input
 *          loads, one k-block ahead).
 *   tc_cl  bf16, M > 8 (the default; EMBER_CUDA_MM_CLUSTER=0 keeps tc for
 *          every M). A cluster of 8 blocks per tile of 128 weight rows x
 *          8 XT input rows, block r computing part r with 8 warps of 16
 *          weight rows; the input split once per block into shared memory;
 *          the parts added in order through distributed shared memory.
 *          Reads the weights once per 8 XT input rows (64 from M = 33 on).
 *   tc     bf16, every M (M <= 8 by default). A warp owns WT weight tiles (16 rows) x XT input
 *          tiles (8 rows), a block BW x BX such warp tiles. PS (parts
 *          split): each tile has 8 warps, one per part, whose sums meet in
 *          shared memory (small M: more warps per weight, more loads in
 *          flight); else one warp walks the eight parts in turn, keeping
 *          the running sum (large M). Each lane keeps the weights of U
 *          k-blocks in registers while the next U load. Shapes per M in
 *          k_tc, measured on an H200 (docs/cuda.md); tc_elem (element
 *          loads) takes K % 8 != 0 and tensors not 16-byte aligned, with
 *          the same values and so the same bits.
 *   gemv   f32 / f16, M <= 8, 16-byte weight loads. A warp owns R weight
 *          rows and all M input rows; each lane keeps U chunks of each row
 *          in flight (U x R x 16 bytes), reads the input chunks (2 x 16
 *          bytes per row) through L1, where all warps of the SM share
 *          them. Known limit: from M = 4 on, the input no longer stays in
 *          L1 and each warp re-reads it from L2.
 *   tiled  f32 / f16, M > 8, 16-byte loads. A warp owns an 8 (input rows)
 *          x 4 (weight rows) tile: 32 accumulators per lane. Eight warps
 *          per block (2 x 4) make a 16 x 16 tile. CUDA cores.
 *   elem   f32 / f16, anything else (K % 8 != 0, or a tensor not 16-byte
 *          aligned): element loads, one warp per weight row, the same order.
 * ember_cu_mm.legacy runs bf16 on gemv / tiled / elem (the CUDA-core order)
 * for measuring before against after; nothing else uses it.
 *
 * Ownership and threads: the launcher (ember_cu_matmul) runs on the host
 * thread that drives the backend and only enqueues; the kernels read x, w,
 * bias and write out, all device memory owned by the backend's buffers.
 * Each output element is written by exactly one lane.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <cooperative_groups.h>

#include "cuda_kernels.h"
#include "cuda_mm.cuh"
#include "cuda_pdl.cuh"

namespace cg = cooperative_groups;

#define LANES 32
#define WARPS 8 /* per block, every kernel */
#define TILE_M 8 /* tiled: input rows per warp */
#define TILE_N 4 /* tiled: weight rows per warp */
#define TILE_WM 2 /* tiled: warps along M */
#define TILE_WN 4 /* tiled: warps along N */

/* Eight weights: a holds them for 16-bit types, a and b for f32. */
typedef struct wchunk {
    uint4 a, b;
} wchunk;

/* Chunk c of a weight row (16-byte aligned), dtype dt. */
static __device__ __forceinline__ wchunk ld_wchunk(const void *row, int c, const int dt) {
    wchunk r;
    if (dt == EMBER_CU_F32) {
        const uint4 *p = (const uint4 *)row + 2 * (size_t)c;
        r.a = __ldg(p);
        r.b = __ldg(p + 1);
    } else {
        r.a = __ldg((const uint4 *)row + c);
        r.b = make_uint4(0, 0, 0, 0);
    }
    return r;
}

static __device__ __forceinline__ float f16_bits(unsigned int h) {
    return __half2float(__ushort_as_half((unsigned short)h));
}

/* The eight weights of a chunk as f32 (exact conversions). */
static __device__ __forceinline__ void cvt_wchunk(wchunk c, const int dt, float f[8]) {
    const unsigned int u[4] = {c.a.x, c.a.y, c.a.z, c.a.w};
    if (dt == EMBER_CU_F32) {
        f[0] = __uint_as_float(c.a.x);
        f[1] = __uint_as_float(c.a.y);
        f[2] = __uint_as_float(c.a.z);
        f[3] = __uint_as_float(c.a.w);
        f[4] = __uint_as_float(c.b.x);
        f[5] = __uint_as_float(c.b.y);
        f[6] = __uint_as_float(c.b.z);
        f[7] = __uint_as_float(c.b.w);
    } else if (dt == EMBER_CU_BF16) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[2 * i] = __uint_as_float(u[i] << 16);
            f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
        }
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[2 * i] = f16_bits(u[i] & 0xffffu);
            f[2 * i + 1] = f16_bits(u[i] >> 16);
        }
    }
}

/* Chunk c of an input row (16-byte aligned). */
static __device__ __forceinline__ void ld_xchunk(const float *row, int c, float f[8]) {
    const float4 *p = (const float4 *)row + 2 * (size_t)c;
    float4 a = __ldg(p), b = __ldg(p + 1);
    f[0] = a.x;
    f[1] = a.y;
    f[2] = a.z;
    f[3] = a.w;
    f[4] = b.x;
    f[5] = b.y;
    f[6] = b.z;
    f[7] = b.w;
}

/* Element k of a weight row. */
static __device__ __forceinline__ float ld_welem(const void *row, int k, const int dt) {
    if (dt == EMBER_CU_F32) return __ldg((const float *)row + k);
    unsigned int h = __ldg((const unsigned short *)row + k);
    return dt == EMBER_CU_BF16 ? __uint_as_float(h << 16) : f16_bits(h);
}

/* The butterfly of the canonical order; every lane returns the sum. */
static __device__ __forceinline__ float lane_sum(float v) {
#pragma unroll
    for (int s = LANES / 2; s >= 1; s >>= 1) v = v + __shfl_xor_sync(0xffffffffu, v, s);
    return v;
}

static __device__ __forceinline__ void store_out(const ember_cu_mm_prod &p, int m, int n, float v) {
    p.out[(size_t)m * (size_t)p.N + (size_t)n] = p.bias ? v + p.bias[n] : v;
}

/* ---- gemv: M <= 8 ------------------------------------------------------------------------ */

/* M input rows, R weight rows per warp, U chunks in flight per row and lane;
   all three are constants at every call site (the loops unroll, the arrays
   stay in registers). */
static __device__ __forceinline__ void gemv_body(const ember_cu_mm &a, const int dt, const int M, const int R,
                                                 const int U) {
    ember_pdl_enter();
    const ember_cu_mm_prod p = ember_cu_pick_prod(a, (int)blockIdx.x);
    const int warp = (int)threadIdx.x / LANES, lane = (int)threadIdx.x % LANES;
    const int n0 = ((int)blockIdx.x - p.first_block) * (WARPS * R) + warp * R;
    if (n0 >= p.N) return; /* the whole warp leaves together */
    const int K = a.K, C = K / 8;
    const size_t wrow_bytes = (size_t)K * (dt == EMBER_CU_F32 ? 4 : 2);
    const char *wr[4];
#pragma unroll
    for (int r = 0; r < R; r++) wr[r] = (const char *)p.w + (size_t)min(n0 + r, p.N - 1) * wrow_bytes;
    float acc[8][4];
#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int r = 0; r < R; r++) acc[m][r] = 0.0f;
    int c = lane;
    for (; c + LANES * (U - 1) < C; c += LANES * U) {
        wchunk wv[16][4];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++) wv[u][r] = ld_wchunk(wr[r], c + LANES * u, dt);
#pragma unroll
        for (int u = 0; u < U; u++) {
            float wf[4][8];
#pragma unroll
            for (int r = 0; r < R; r++) cvt_wchunk(wv[u][r], dt, wf[r]);
#pragma unroll
            for (int m = 0; m < M; m++) {
                float xf[8];
                ld_xchunk(a.x + (size_t)m * (size_t)K, c + LANES * u, xf);
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int j = 0; j < 8; j++) acc[m][r] = fmaf(wf[r][j], xf[j], acc[m][r]);
            }
        }
    }
    for (; c < C; c += LANES) { /* the last chunks of this lane, one at a time, same order */
        float wf[4][8];
#pragma unroll
        for (int r = 0; r < R; r++) cvt_wchunk(ld_wchunk(wr[r], c, dt), dt, wf[r]);
#pragma unroll
        for (int m = 0; m < M; m++) {
            float xf[8];
            ld_xchunk(a.x + (size_t)m * (size_t)K, c, xf);
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int j = 0; j < 8; j++) acc[m][r] = fmaf(wf[r][j], xf[j], acc[m][r]);
        }
    }
#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int r = 0; r < R; r++) acc[m][r] = lane_sum(acc[m][r]);
    /* lane i stores output i of the warp's M x R */
#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int r = 0; r < R; r++)
            if (lane == m * R + r && n0 + r < p.N) store_out(p, m, n0 + r, acc[m][r]);
}

/* ---- kernel tables --------------------------------------------------------------------------- */

typedef void (*mm_kernel)(const ember_cu_mm);

/* A decode kernel: M input rows, R weight rows per warp, U chunks in flight. */
typedef struct gemv_kind {
    mm_kernel k;
    int M, R, U;
} gemv_kind;

#define GEMV_KERNEL(NAME, DT, M, R, U)                                                   \
    static_assert((R) <= 4 && (U) <= 16 && (M) * (R) <= LANES, "decode kernel shape"); \
    static __global__ void __launch_bounds__(WARPS *LANES) NAME(const ember_cu_mm a) { \
        gemv_body(a, DT, M, R, U);                                                      \
    }

/* The defaults per M, measured on an H200 (docs/cuda.md): at M = 1 one
   weight row per warp and 4 chunks in flight per lane (64 bytes of 16-bit
   weights; f32 weights keep 8 chunks, 256 bytes); more rows per warp as M
   grows, so each input chunk read serves more weight rows. */
#define GEMV_R(M) ((M) == 1 ? 1 : (M) <= 4 ? 2 : 4)
#define GEMV_U(M, DT) ((M) == 1 ? ((DT) == EMBER_CU_F32 ? 8 : 4) : (M) <= 4 ? 4 : 1)
#define GEMV_KERNELS(DT, DTNAME, M) GEMV_KERNEL(gemv_##DTNAME##_m##M, DT, M, GEMV_R(M), GEMV_U(M, DT))
#define GEMV_ALL(DT, DTNAME)                                                                        \
    GEMV_KERNELS(DT, DTNAME, 1) GEMV_KERNELS(DT, DTNAME, 2) GEMV_KERNELS(DT, DTNAME, 3)             \
        GEMV_KERNELS(DT, DTNAME, 4) GEMV_KERNELS(DT, DTNAME, 5) GEMV_KERNELS(DT, DTNAME, 6)         \
            GEMV_KERNELS(DT, DTNAME, 7) GEMV_KERNELS(DT, DTNAME, 8)
GEMV_ALL(EMBER_CU_F32, f32)
GEMV_ALL(EMBER_CU_F16, f16)
GEMV_ALL(EMBER_CU_BF16, bf16)

#define GEMV_ROW1(DT, DTNAME, M) {gemv_##DTNAME##_m##M, M, GEMV_R(M), GEMV_U(M, DT)}
#define GEMV_ROW(DT, DTNAME)                                                                             \
    {GEMV_ROW1(DT, DTNAME, 1), GEMV_ROW1(DT, DTNAME, 2), GEMV_ROW1(DT, DTNAME, 3), GEMV_ROW1(DT, DTNAME, 4), \
     GEMV_ROW1(DT, DTNAME, 5), GEMV_ROW1(DT, DTNAME, 6), GEMV_ROW1(DT, DTNAME, 7), GEMV_ROW1(DT, DTNAME, 8)}
static const gemv_kind k_gemv[3][8] = {GEMV_ROW(EMBER_CU_F32, f32), GEMV_ROW(EMBER_CU_F16, f16),
                                       GEMV_ROW(EMBER_CU_BF16, bf16)};

/* ---- tiled: M > 8 ------------------------------------------------------------------------ */

static __device__ __forceinline__ void tiled_body(const ember_cu_mm &a, const int dt) {
    ember_pdl_enter();
    const ember_cu_mm_prod p = ember_cu_pick_prod(a, (int)blockIdx.x);
    const int warp = (int)threadIdx.x / LANES, lane = (int)threadIdx.x % LANES;
    const int wm = warp / TILE_WN, wn = warp % TILE_WN;
    const int m0 = (int)blockIdx.y * (TILE_M * TILE_WM) + wm * TILE_M;
    const int n0 = ((int)blockIdx.x - p.first_block) * (TILE_N * TILE_WN) + wn * TILE_N;
    if (m0 >= a.M || n0 >= p.N) return;
    const int K = a.K, C = K / 8;
    const size_t wrow_bytes = (size_t)K * (dt == EMBER_CU_F32 ? 4 : 2);
    const char *wr[TILE_N];
    const float *xr[TILE_M];
#pragma unroll
    for (int r = 0; r < TILE_N; r++) wr[r] = (const char *)p.w + (size_t)min(n0 + r, p.N - 1) * wrow_bytes;
#pragma unroll
    for (int m = 0; m < TILE_M; m++) xr[m] = a.x + (size_t)min(m0 + m, a.M - 1) * (size_t)K;
    float acc[TILE_M][TILE_N];
#pragma unroll
    for (int m = 0; m < TILE_M; m++)
#pragma unroll
        for (int r = 0; r < TILE_N; r++) acc[m][r] = 0.0f;
#pragma unroll 1
    for (int c = lane; c < C; c += LANES) {
        float wf[TILE_N][8];
#pragma unroll
        for (int r = 0; r < TILE_N; r++) cvt_wchunk(ld_wchunk(wr[r], c, dt), dt, wf[r]);
#pragma unroll
        for (int m = 0; m < TILE_M; m++) {
            float xf[8];
            ld_xchunk(xr[m], c, xf);
#pragma unroll
            for (int r = 0; r < TILE_N; r++)
#pragma unroll
                for (int j = 0; j < 8; j++) acc[m][r] = fmaf(wf[r][j], xf[j], acc[m][r]);
        }
    }
#pragma unroll
    for (int m = 0; m < TILE_M; m++)
#pragma unroll
        for (int r = 0; r < TILE_N; r++) acc[m][r] = lane_sum(acc[m][r]);
#pragma unroll
    for (int m = 0; m < TILE_M; m++)
#pragma unroll
        for (int r = 0; r < TILE_N; r++)
            if (lane == m * TILE_N + r && m0 + m < a.M && n0 + r < p.N) store_out(p, m0 + m, n0 + r, acc[m][r]);
}

static __global__ void __launch_bounds__(WARPS *LANES) tiled_f32(const ember_cu_mm a) {
    tiled_body(a, EMBER_CU_F32);
}
static __global__ void __launch_bounds__(WARPS *LANES) tiled_f16(const ember_cu_mm a) {
    tiled_body(a, EMBER_CU_F16);
}
static __global__ void __launch_bounds__(WARPS *LANES) tiled_bf16(const ember_cu_mm a) {
    tiled_body(a, EMBER_CU_BF16);
}
static const mm_kernel k_tiled[3] = {tiled_f32, tiled_f16, tiled_bf16};

/* ---- elem: any K, any element-aligned tensors ------------------------------------------ */

/* One warp per weight row, every input row in turn (blockIdx.y strides M). */
static __device__ __forceinline__ void elem_body(const ember_cu_mm &a, const int dt) {
    ember_pdl_enter();
    const ember_cu_mm_prod p = ember_cu_pick_prod(a, (int)blockIdx.x);
    const int warp = (int)threadIdx.x / LANES, lane = (int)threadIdx.x % LANES;
    const int n = ((int)blockIdx.x - p.first_block) * WARPS + warp;
    if (n >= p.N) return;
    const int K = a.K, C = (K + 7) / 8;
    const char *wr = (const char *)p.w + (size_t)n * (size_t)K * (dt == EMBER_CU_F32 ? 4 : 2);
    for (int m = (int)blockIdx.y; m < a.M; m += (int)gridDim.y) {
        const float *xr = a.x + (size_t)m * (size_t)K;
        float acc = 0.0f;
        for (int c = lane; c < C; c += LANES) {
#pragma unroll
            for (int j = 0; j < 8; j++) {
                int k = 8 * c + j;
                if (k < K) acc = fmaf(ld_welem(wr, k, dt), __ldg(xr + k), acc);
            }
        }
        acc = lane_sum(acc);
        if (lane == 0) store_out(p, m, n, acc);
    }
}

static __global__ void __launch_bounds__(WARPS *LANES) elem_f32(const ember_cu_mm a) {
    elem_body(a, EMBER_CU_F32);
}
static __global__ void __launch_bounds__(WARPS *LANES) elem_f16(const ember_cu_mm a) {
    elem_body(a, EMBER_CU_F16);
}
static __global__ void __launch_bounds__(WARPS *LANES) elem_bf16(const ember_cu_mm a) {
    elem_body(a, EMBER_CU_BF16);
}
static const mm_kernel k_elem[3] = {elem_f32, elem_f16, elem_bf16};

/* ---- tc: bf16 weights on the tensor cores, every M ------------------------------------------ */

/* The tensor-core order (the header comment). TC_KB elements make a
   k-block, TC_P parts share the k-blocks round robin. */
#define TC_KB 32
#define TC_P 8

/* acc += a b on the tensor cores: one m16n8k16 product, bf16 in, f32
   accumulate (fragment layouts: PTX ISA, "mma.m16n8k16"). a: 16 weight
   rows, b: 8 input rows. */
static __device__ __forceinline__ void mma_bf16(float acc[4], unsigned int a0, unsigned int a1, unsigned int a2,
                                                unsigned int a3, unsigned int b0, unsigned int b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* The eight weights k .. k + 7 of a weight row, zero past K. vec: one
   16-byte load (K % 8 == 0, row 16-byte aligned), else element loads; the
   same values either way. */
static __device__ __forceinline__ uint4 tc_ldw(const unsigned short *row, int k, int K, const bool vec) {
    if (vec) return k < K ? __ldg((const uint4 *)(row + k)) : make_uint4(0, 0, 0, 0);
    unsigned int u[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        unsigned int l = k + 2 * i < K ? __ldg(row + k + 2 * i) : 0u;
        unsigned int h = k + 2 * i + 1 < K ? __ldg(row + k + 2 * i + 1) : 0u;
        u[i] = l | h << 16;
    }
    return make_uint4(u[0], u[1], u[2], u[3]);
}

/* Eight inputs split into bf16 pairs: hi[i] = the pair (f[2i], f[2i + 1])
   rounded to bf16 (lower k in the low half), lo[i] = the remainders
   f - hi (exact in f32) rounded to bf16. Every kernel splits through this. */
static __device__ __forceinline__ void tc_split(const float f[8], unsigned int hi[4], unsigned int lo[4]) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        __nv_bfloat162 h = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
        float2 hf = __bfloat1622float2(h);
        __nv_bfloat162 l = __floats2bfloat162_rn(f[2 * i] - hf.x, f[2 * i + 1] - hf.y);
        hi[i] = *(const unsigned int *)&h;
        lo[i] = *(const unsigned int *)&l;
    }
}

/* The eight inputs k .. k + 7 of a row (NULL: a row past M, zeros; zero
   past K) split into bf16 pairs: hi[i] = the pair (x[2i], x[2i + 1])
   rounded to bf16 (lower k in the low half), lo[i] = the remainders x - hi
   (exact in f32) rounded to bf16. */
static __device__ __forceinline__ void tc_ldx(const float *row, int k, int K, const bool vec, unsigned int hi[4],
                                              unsigned int lo[4]) {
    float f[8];
#pragma unroll
    for (int j = 0; j < 8; j++) f[j] = 0.0f;
    if (row && vec && k < K) {
        ld_xchunk(row + k, 0, f);
    } else if (row && !vec) {
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (k + j < K) f[j] = __ldg(row + k + j);
    }
    tc_split(f, hi, lo);
}

/* One k-block of a warp's WT x XT tiles: w[wt][0], w[wt][1] are the lane's
   weights of rows g and g + 8 of weight tile wt; step 0 then step 1, each
   hi then lo. */
static __device__ __forceinline__ void tc_kblock(float acc[][4][4], const uint4 w[][2], const float *const *xr, int k,
                                                 int K, const bool vec, const int WT, const int XT) {
#pragma unroll
    for (int xt = 0; xt < XT; xt++) {
        unsigned int hi[4], lo[4];
        tc_ldx(xr[xt], k, K, vec, hi, lo);
#pragma unroll
        for (int wt = 0; wt < WT; wt++) {
            const uint4 r0 = w[wt][0], r8 = w[wt][1];
            mma_bf16(acc[wt][xt], r0.x, r8.x, r0.y, r8.y, hi[0], hi[1]);
            mma_bf16(acc[wt][xt], r0.x, r8.x, r0.y, r8.y, lo[0], lo[1]);
            mma_bf16(acc[wt][xt], r0.z, r8.z, r0.w, r8.w, hi[2], hi[3]);
            mma_bf16(acc[wt][xt], r0.z, r8.z, r0.w, r8.w, lo[2], lo[3]);
        }
    }
}

/* The chain of part `part`: k-blocks part, part + TC_P, ... in order, from
   +0. The weights of U k-blocks are in registers while the next U load. */
static __device__ __forceinline__ void tc_part(float acc[][4][4], const unsigned short *const *wr,
                                               const float *const *xr, int part, int K, const bool vec, const int WT,
                                               const int XT, const int U) {
    const int q = (int)threadIdx.x % 4, KB = (K + TC_KB - 1) / TC_KB;
#pragma unroll
    for (int wt = 0; wt < WT; wt++)
#pragma unroll
        for (int xt = 0; xt < XT; xt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[wt][xt][i] = 0.0f;
    uint4 cur[8][4][2], nxt[8][4][2];
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int wt = 0; wt < WT; wt++)
#pragma unroll
            for (int h = 0; h < 2; h++) cur[u][wt][h] = tc_ldw(wr[2 * wt + h], (part + TC_P * u) * TC_KB + 8 * q, K, vec);
    for (int b = part; b < KB; b += TC_P * U) {
        /* past K the loads give zeros and read nothing */
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int wt = 0; wt < WT; wt++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    nxt[u][wt][h] = tc_ldw(wr[2 * wt + h], (b + TC_P * (U + u)) * TC_KB + 8 * q, K, vec);
#pragma unroll
        for (int u = 0; u < U; u++)
            if (b + TC_P * u < KB) tc_kblock(acc, cur[u], xr, (b + TC_P * u) * TC_KB + 8 * q, K, vec, WT, XT);
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int wt = 0; wt < WT; wt++)
#pragma unroll
                for (int h = 0; h < 2; h++) cur[u][wt][h] = nxt[u][wt][h];
    }
}

/* cp.async: 16 bytes from global to shared memory, or 16 zeros (n = 0). */
static __device__ __forceinline__ void cp16(uint4 *dst, const void *src, bool full) {
    const unsigned int d = (unsigned int)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(full ? 16 : 0) : "memory");
}
/* Waits until at most n of this thread's copy groups are pending (ember_cp_wait, cuda_mm.cuh). */
static __device__ __forceinline__ void cp_wait(const int n) {
    if (n <= 0)
        ember_cp_wait<0>();
    else if (n == 1)
        ember_cp_wait<1>();
    else if (n == 2)
        ember_cp_wait<2>();
    else
        ember_cp_wait<3>();
}

/* The first S k-blocks of part `part` (this lane's 16-byte pieces of the
   2 WT rows wr) into `ring`, one copy group each: tc_part_ring's start. */
static __device__ __forceinline__ void tc_ring_fill(uint4 *ring, const unsigned short *const *wr, int part, int K,
                                                    const int WT, const int S) {
    const int lane = (int)threadIdx.x % LANES, q = lane % 4;
#pragma unroll
    for (int s = 0; s < S; s++) {
        const int k = (part + TC_P * s) * TC_KB + 8 * q;
#pragma unroll
        for (int i = 0; i < 2 * WT; i++) cp16(&ring[(s * 2 * WT + i) * LANES + lane], k < K ? wr[i] + k : wr[i], k < K);
        ember_cp_commit();
    }
}

/* tc_part with the weights of the next S k-blocks in flight through
   shared memory (vec only, S <= 4): each lane copies its own 16-byte
   pieces into its own slots of `ring` (the warp's S x WT x 2 x 32 uint4,
   lane fastest) and reads back only those, so no other thread is waited
   for. The same values as tc_ldw, so the same bits. The caller has run
   tc_ring_fill (the same ring, wr, part, K, WT, S). */
static __device__ __forceinline__ void tc_part_ring(float acc[][4][4], uint4 *ring, const unsigned short *const *wr,
                                                    const float *const *xr, int part, int K, const int WT,
                                                    const int XT, const int S) {
    const int lane = (int)threadIdx.x % LANES, q = lane % 4, KB = (K + TC_KB - 1) / TC_KB;
#pragma unroll
    for (int wt = 0; wt < WT; wt++)
#pragma unroll
        for (int xt = 0; xt < XT; xt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[wt][xt][i] = 0.0f;
    int slot = 0;
    for (int b = part; b < KB; b += TC_P) {
        cp_wait(S - 1);
        uint4 w[4][2];
#pragma unroll
        for (int i = 0; i < 2 * WT; i++) w[i / 2][i % 2] = ring[(slot * 2 * WT + i) * LANES + lane];
        /* the slot just read takes the k-block S steps on (past K: zeros, nothing read);
           this thread's ld.shared above precedes its copy into the same bytes. Refilling
           after the products instead measured 10-20% slower (docs/cuda.md). */
        const int kn = (b + TC_P * S) * TC_KB + 8 * q;
#pragma unroll
        for (int i = 0; i < 2 * WT; i++)
            cp16(&ring[(slot * 2 * WT + i) * LANES + lane], kn < K ? wr[i] + kn : wr[i], kn < K);
        ember_cp_commit();
        tc_kblock(acc, w, xr, b * TC_KB + 8 * q, K, true, WT, XT);
        slot = slot + 1 == S ? 0 : slot + 1;
    }
    cp_wait(0);
}

/* A block of BW x BX warp tiles (along weight rows x input rows), each WT
   m16 tiles (16 weight rows) by XT n8 tiles (8 input rows). PS (parts
   split): each tile has TC_P warps, one per part, whose sums meet in
   shared memory `red`; else one warp per tile walks the parts in turn,
   keeping the running sum. Both add the parts as (((p0 + p1) + p2) + ...)
   + p7. */
static __device__ __forceinline__ void tc_body(const ember_cu_mm &a, float *red, uint4 *ring, const bool vec,
                                               const int WT, const int XT, const int BW, const int BX, const bool PS,
                                               const int U, const int S) {
    const ember_cu_mm_prod p = ember_cu_pick_prod(a, (int)blockIdx.x);
    const int warp = (int)threadIdx.x / LANES, lane = (int)threadIdx.x % LANES, g = lane / 4, q = lane % 4;
    const int tile = PS ? warp / TC_P : warp, part = PS ? warp % TC_P : 0;
    const int tw = tile % BW, tx = tile / BW;
    const int n0 = ((int)blockIdx.x - p.first_block) * (BW * WT * 16) + tw * WT * 16;
    const int m0 = (int)blockIdx.y * (BX * XT * 8) + tx * XT * 8;
    const int K = a.K;
    /* weight rows past N read row N - 1 and input rows past M read zeros; neither is stored */
    const unsigned short *wr[8];
    const float *xr[4];
#pragma unroll
    for (int i = 0; i < 2 * WT; i++)
        wr[i] = (const unsigned short *)p.w + (size_t)min(n0 + (i / 2) * 16 + (i % 2) * 8 + g, p.N - 1) * (size_t)K;
#pragma unroll
    for (int xt = 0; xt < XT; xt++) {
        const int m = m0 + xt * 8 + g;
        xr[xt] = m < a.M ? a.x + (size_t)m * (size_t)K : NULL;
    }
    const bool live = m0 < a.M && n0 < p.N;
    /* where nothing queued writes the weights (a.early), their first k-blocks come while the kernel before
       this one still runs; everything else waits for it (cuda_pdl.cuh) */
    uint4 *wring = ring + (size_t)warp * S * 2 * WT * LANES;
    const bool fill = PS && S && live;
    if (fill && a.early) tc_ring_fill(wring, wr, part, K, WT, S);
    ember_pdl_enter();
    if (fill && !a.early) tc_ring_fill(wring, wr, part, K, WT, S);
    float acc[4][4][4], sum[4][4][4];
    if (PS) {
        if (live && S)
            tc_part_ring(acc, wring, wr, xr, part, K, WT, XT, S);
        else if (live)
            tc_part(acc, wr, xr, part, K, vec, WT, XT, U);
        const int per = WT * XT * 4;
        if (part && live) {
#pragma unroll
            for (int wt = 0; wt < WT; wt++)
#pragma unroll
                for (int xt = 0; xt < XT; xt++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        red[(((size_t)tile * (TC_P - 1) + part - 1) * per + (wt * XT + xt) * 4 + i) * LANES + lane] =
                            acc[wt][xt][i];
        }
        __syncthreads();
        if (part || !live) return;
#pragma unroll
        for (int wt = 0; wt < WT; wt++)
#pragma unroll
            for (int xt = 0; xt < XT; xt++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float s = acc[wt][xt][i];
#pragma unroll
                    for (int pp = 1; pp < TC_P; pp++)
                        s = s + red[(((size_t)tile * (TC_P - 1) + pp - 1) * per + (wt * XT + xt) * 4 + i) * LANES +
                                    lane];
                    sum[wt][xt][i] = s;
                }
    } else {
        if (!live) return;
#pragma unroll 1
        for (int pp = 0; pp < TC_P; pp++) {
            tc_part(acc, wr, xr, pp, K, vec, WT, XT, U);
#pragma unroll
            for (int wt = 0; wt < WT; wt++)
#pragma unroll
                for (int xt = 0; xt < XT; xt++)
#pragma unroll
                    for (int i = 0; i < 4; i++) sum[wt][xt][i] = pp ? sum[wt][xt][i] + acc[wt][xt][i] : acc[wt][xt][i];
        }
    }
    /* the accumulator layout: i = 0, 1 weight row g, input rows 2q, 2q + 1; i = 2, 3 weight row g + 8 */
#pragma unroll
    for (int wt = 0; wt < WT; wt++)
#pragma unroll
        for (int xt = 0; xt < XT; xt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int n = n0 + wt * 16 + g + (i >= 2 ? 8 : 0), m = m0 + xt * 8 + 2 * q + (i & 1);
                if (m < a.M && n < p.N) store_out(p, m, n, sum[wt][xt][i]);
            }
}

/* ---- tc_cl: M > 8, the eight parts in the eight blocks of a cluster ---------------------- */

/* Block (x, y, part): weight rows [128 x', 128 x' + 128) of its product
   (x' counted from the product's first block) by input rows [8 XT y,
   8 XT y + 8 XT), the chain of part `part` only. Its 8 warps own 16 weight
   rows each and all 8 XT input rows; the input of each k-block is loaded
   once per block (thread t: input row 8 (t / 32) + (t % 32) / 4, elements
   8 (t % 4) .. + 7, the lane layout of tc_ldx), split into hi / lo
   (tc_split) and shared through shared memory (two buffers, one barrier per
   k-block; the inputs of the next XA k-blocks in registers meanwhile); each
   lane keeps S k-blocks of its own weights in flight through its own
   cp.async ring (as tc_part_ring). The eight blocks of a (x, y) tile form
   a cluster: each leaves its part's sums in shared memory, and after the
   cluster barrier block r adds, for its eighth of the tile, the eight
   parts in part order from the blocks' shared memory (distributed shared
   memory), as tc_body does: (((p0 + p1) + p2) + ...) + p7, then the bias.
   So the bits are tc_body's; what changes is that the weights are read
   once per M tile by 8 times as many blocks, and the input is read once
   per 128 weight rows instead of once per 16. */
#define CL_WARPS 8
#define CL_ROWS (CL_WARPS * 16) /* weight rows per block */

template <int XT, int S> struct cl_smem {
    union {
        struct {
            uint4 ring[CL_WARPS * S * 2 * LANES]; /* [warp][slot][row g / g + 8][lane] */
            uint4 xs[2][XT][2][LANES];            /* [buffer][input tile][hi / lo][lane] */
        } s;
        float red[CL_WARPS * XT * 4 * LANES]; /* the part's sums: [warp][tile][i][lane] */
    } u;
};

/* The eight inputs of this thread in k-block b (zeros past K or M). */
static __device__ __forceinline__ void cl_ldx(const float *xrow, int b, int q, int K, float f[8]) {
#pragma unroll
    for (int j = 0; j < 8; j++) f[j] = 0.0f;
    const int k = b * TC_KB + 8 * q;
    if (xrow && k < K) ld_xchunk(xrow + k, 0, f);
}

template <int XT, int XA, int S>
static __global__ void __cluster_dims__(1, 1, TC_P) __launch_bounds__(CL_WARPS *LANES) tc_cl_k(const ember_cu_mm a) {
    static_assert(XT <= CL_WARPS && XA >= 1 && XA <= 2 && S >= 1 && S <= 4, "cluster kernel shape");
    __shared__ cl_smem<XT, S> sm;
    cg::cluster_group cluster = cg::this_cluster();
    const int part = (int)cluster.block_rank(); /* the cluster spans z: rank = blockIdx.z */
    const ember_cu_mm_prod p = ember_cu_pick_prod(a, (int)blockIdx.x);
    const int tid = (int)threadIdx.x, warp = tid / LANES, lane = tid % LANES, g = lane / 4, q = lane % 4;
    const int nb = ((int)blockIdx.x - p.first_block) * CL_ROWS, n0 = nb + warp * 16;
    const int m0 = (int)blockIdx.y * XT * 8;
    const int K = a.K, KB = (K + TC_KB - 1) / TC_KB, nk = part < KB ? (KB - part + TC_P - 1) / TC_P : 0;
    /* weight rows past N read row N - 1 and input rows past M read zeros; neither is stored */
    const unsigned short *wr[2];
#pragma unroll
    for (int h = 0; h < 2; h++) wr[h] = (const unsigned short *)p.w + (size_t)min(n0 + h * 8 + g, p.N - 1) * (size_t)K;
    const bool xl = warp < XT; /* this thread loads inputs: row m0 + 8 warp + g */
    const int xm = m0 + warp * 8 + g;
    const float *xrow = xl && xm < a.M ? a.x + (size_t)xm * (size_t)K : NULL;
    uint4 *ring = sm.u.s.ring + (size_t)warp * S * 2 * LANES;
    float acc[XT][4];
#pragma unroll
    for (int xt = 0; xt < XT; xt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[xt][i] = 0.0f;
    /* the first weights before the wait where nothing queued writes them (a.early, as tc_body) */
    if (a.early) tc_ring_fill(ring, wr, part, K, 1, S);
    ember_pdl_enter();
    if (!a.early) tc_ring_fill(ring, wr, part, K, 1, S);
    /* fx[j]: the inputs of k-block i + 1 + j while k-block i computes */
    float f0[8], fx[XA][8];
    cl_ldx(nk > 0 ? xrow : NULL, part, q, K, f0);
#pragma unroll
    for (int j = 0; j < XA; j++) cl_ldx(1 + j < nk ? xrow : NULL, part + TC_P * (1 + j), q, K, fx[j]);
    if (xl) {
        unsigned int hi[4], lo[4];
        tc_split(f0, hi, lo);
        sm.u.s.xs[0][warp][0][lane] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
        sm.u.s.xs[0][warp][1][lane] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    }
    __syncthreads();
    int slot = 0;
    for (int i = 0; i < nk; i++) {
        const int b = part + TC_P * i, buf = i & 1;
        float fn[8]; /* k-block i + 1 + XA, in flight while this one computes */
        cl_ldx(i + 1 + XA < nk ? xrow : NULL, b + TC_P * (1 + XA), q, K, fn);
        cp_wait(S - 1);
        const uint4 w0 = ring[(slot * 2) * LANES + lane], w8 = ring[(slot * 2 + 1) * LANES + lane];
        /* the slot just read takes the k-block S steps on (as tc_part_ring) */
        const int kn = (b + TC_P * S) * TC_KB + 8 * q;
#pragma unroll
        for (int h = 0; h < 2; h++) cp16(&ring[(slot * 2 + h) * LANES + lane], kn < K ? wr[h] + kn : wr[h], kn < K);
        ember_cp_commit();
#pragma unroll
        for (int xt = 0; xt < XT; xt++) {
            const uint4 hi = sm.u.s.xs[buf][xt][0][lane], lo = sm.u.s.xs[buf][xt][1][lane];
            mma_bf16(acc[xt], w0.x, w8.x, w0.y, w8.y, hi.x, hi.y);
            mma_bf16(acc[xt], w0.x, w8.x, w0.y, w8.y, lo.x, lo.y);
            mma_bf16(acc[xt], w0.z, w8.z, w0.w, w8.w, hi.z, hi.w);
            mma_bf16(acc[xt], w0.z, w8.z, w0.w, w8.w, lo.z, lo.w);
        }
        if (i + 1 < nk && xl) {
            unsigned int hi[4], lo[4];
            tc_split(fx[0], hi, lo);
            sm.u.s.xs[buf ^ 1][warp][0][lane] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
            sm.u.s.xs[buf ^ 1][warp][1][lane] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
        }
#pragma unroll
        for (int j = 0; j + 1 < XA; j++)
#pragma unroll
            for (int e = 0; e < 8; e++) fx[j][e] = fx[j + 1][e];
#pragma unroll
        for (int e = 0; e < 8; e++) fx[XA - 1][e] = fn[e];
        __syncthreads();
        slot = slot + 1 == S ? 0 : slot + 1;
    }
    cp_wait(0);
    __syncthreads(); /* the ring and the inputs are free: red takes their place */
#pragma unroll
    for (int xt = 0; xt < XT; xt++)
#pragma unroll
        for (int i = 0; i < 4; i++) sm.u.red[((warp * XT + xt) * 4 + i) * LANES + lane] = acc[xt][i];
    cluster.sync(); /* every part's sums are in place */
    const float *parts[TC_P];
#pragma unroll
    for (int pp = 0; pp < TC_P; pp++) parts[pp] = cluster.map_shared_rank(sm.u.red, pp);
    const int E = CL_WARPS * XT * 4 * LANES, per = E / TC_P;
    for (int e = part * per + tid; e < (part + 1) * per; e += CL_WARPS * LANES) {
        float v = parts[0][e];
#pragma unroll
        for (int pp = 1; pp < TC_P; pp++) v = v + parts[pp][e];
        /* e = ((w * XT + xt) * 4 + i) * LANES + l: the accumulator layout of tc_body */
        const int l = e % LANES, i = e / LANES % 4, xt = e / (LANES * 4) % XT, w = e / (LANES * 4 * XT);
        const int n = nb + w * 16 + l / 4 + (i >= 2 ? 8 : 0), m = m0 + xt * 8 + 2 * (l % 4) + (i & 1);
        if (m < a.M && n < p.N) store_out(p, m, n, v);
    }
    cluster.sync(); /* no block leaves while another reads its shared memory */
}

/* ---- tc_blk: large M, block tiles staged in shared memory -------------------------------- */

/* Block (x, y): weight rows [128 x', 128 x' + 128) of its product (x'
   counted from the product's first block) by input rows [BX y, BX y + BX),
   BX = 32 XT. Its 8 warps are 2 (weight rows, 64 each) x 4 (input rows,
   8 XT each); a warp owns 4 m16 weight tiles x XT n8 input tiles. Every
   k-block's weights (128 rows x 64 bytes) come into a ring of S stages
   by cp.async, shared by the block; its inputs (BX rows x 32 f32) are
   loaded into registers two steps ahead, split into hi / lo (tc_split)
   and stored one step ahead in a second pair of buffers. The block walks the k-blocks
   part by part (part 0: k-blocks 0, 8, 16, ...; then part 1, ...), one
   accumulator chain per part from +0, and adds each finished part to a
   running sum: ((p0 + p1) + p2) + ... + p7, as tc_body's walking warps do.
   Each lane reads its fragments as 16-byte words at row g (g + 8) and
   bytes 16 q of a 64-byte shared-memory row, i.e. the elements 8q .. 8q + 7
   that tc_ldw / tc_ldx give it: the same mma.sync calls on the same values
   in the same order, so the bits of every other bf16 kernel. What changes:
   each weight k-block is read once per BX input rows and each input
   k-block once per 128 weight rows, both through shared memory. */
#define BK_WARPS 8
#define BK_ROWS 128 /* weight rows per block */

template <int XT, int S> struct bk_smem {
    uint4 w[S][BK_ROWS][4];          /* [stage][weight row][16-byte piece] */
    uint4 x[2][2][4 * XT * 8][4];    /* [buffer][hi / lo][input row][16-byte piece] */
};

/* The k-block of step i of the part-by-part walk over KB k-blocks: parts
   0 .. r - 1 (r = KB % 8) have KB / 8 + 1 k-blocks, the rest KB / 8. */
static __device__ __forceinline__ int bk_kblock(int i, int KB) {
    const int q = KB / TC_P, r = KB % TC_P;
    if (i < r * (q + 1)) return i / (q + 1) + TC_P * (i % (q + 1));
    i -= r * (q + 1);
    return r + i / q + TC_P * (i % q);
}
/* The number of k-blocks of part pp. */
static __device__ __forceinline__ int bk_nk(int pp, int KB) {
    return pp < KB ? (KB - pp + TC_P - 1) / TC_P : 0;
}

/* This thread's 16 inputs of k-block b: row xrow (NULL: zeros), elements
   32 b + 16 h .. + 15 (zeros past K). */
static __device__ __forceinline__ void bk_ldx(const float *xrow, int b, int h, int K, float f[16]) {
#pragma unroll
    for (int j = 0; j < 16; j++) f[j] = 0.0f;
    const int k = b * TC_KB + 16 * h;
    if (xrow && k < K) ld_xchunk(xrow + k, 0, f);
    if (xrow && k + 8 < K) ld_xchunk(xrow + k + 8, 0, f + 8);
}

template <int XT, int S>
static __global__ void __launch_bounds__(BK_WARPS *LANES, 1) tc_blk_k(const ember_cu_mm a) {
    static_assert(XT >= 1 && XT <= 4 && S >= 2 && S <= 4, "block kernel shape");
    constexpr int BX = 4 * XT * 8; /* input rows per block */
    ember_pdl_enter();
    extern __shared__ uint4 bk_dyn[];
    bk_smem<XT, S> &sm = *reinterpret_cast<bk_smem<XT, S> *>(bk_dyn);
    const ember_cu_mm_prod p = ember_cu_pick_prod(a, (int)blockIdx.x);
    const int tid = (int)threadIdx.x, warp = tid / LANES, lane = tid % LANES, g = lane / 4, q = lane % 4;
    const int wn = warp % 2, wx = warp / 2;
    const int nb = ((int)blockIdx.x - p.first_block) * BK_ROWS, m0 = (int)blockIdx.y * BX;
    const int K = a.K, KB = (K + TC_KB - 1) / TC_KB;
    /* weight pieces copied by this thread: pieces tid and tid + 256 of 512 (row c / 4, piece c % 4);
       rows past N read row N - 1, never stored */
    const unsigned short *wsrc[2];
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int c = tid + j * BK_WARPS * LANES;
        wsrc[j] = (const unsigned short *)p.w + (size_t)min(nb + c / 4, p.N - 1) * (size_t)K + 8 * (c % 4);
    }
    /* inputs loaded by this thread: row tid / 2 of the block's BX (when < BX), half tid % 2 of each k-block */
    const int xr = tid / 2, xh = tid % 2, xm = m0 + xr;
    const float *xrow = xr < BX && xm < a.M ? a.x + (size_t)xm * (size_t)K : NULL;
    /* the prologue: weights of steps 0 .. S - 2, inputs of step 0 (split, stored) and 1 (registers) */
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < KB) {
            const int b = bk_kblock(s, KB);
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int c = tid + j * BK_WARPS * LANES, k = b * TC_KB + 8 * (c % 4);
                cp16(&sm.w[s][c / 4][c % 4], k < K ? wsrc[j] + b * TC_KB : wsrc[j], k < K);
            }
        }
        ember_cp_commit();
    }
    float fx[16];
    bk_ldx(xrow, bk_kblock(0, KB), xh, K, fx);
    if (xr < BX) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            unsigned int hi[4], lo[4];
            tc_split(fx + 8 * h, hi, lo);
            sm.x[0][0][xr][2 * xh + h] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
            sm.x[0][1][xr][2 * xh + h] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
        }
    }
    bk_ldx(KB > 1 ? xrow : NULL, KB > 1 ? bk_kblock(1, KB) : 0, xh, K, fx);
    float acc[4][XT][4], sum[4][XT][4];
#pragma unroll
    for (int wt = 0; wt < 4; wt++)
#pragma unroll
        for (int xt = 0; xt < XT; xt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[wt][xt][i] = sum[wt][xt][i] = 0.0f;
    int pp = 0, j = 0, npp = bk_nk(0, KB);
    for (int i = 0; i < KB; i++) {
        const int buf = i & 1, st = i % S;
        cp_wait(S - 2); /* this thread's copies of step i are done */
        __syncthreads(); /* everyone's, and the inputs of step i; steps i - 1's buffers are free */
        {   /* the weights of step i + S - 1 into the stage step i - 1 used */
            const int in = i + S - 1;
            if (in < KB) {
                const int b = bk_kblock(in, KB);
#pragma unroll
                for (int jj = 0; jj < 2; jj++) {
                    const int c = tid + jj * BK_WARPS * LANES, k = b * TC_KB + 8 * (c % 4);
                    cp16(&sm.w[in % S][c / 4][c % 4], k < K ? wsrc[jj] + b * TC_KB : wsrc[jj], k < K);
                }
            }
            ember_cp_commit();
        }
        if (i + 1 < KB && xr < BX) { /* step i + 1's inputs into the other buffer (last read in step i - 1) */
#pragma unroll
            for (int h = 0; h < 2; h++) {
                unsigned int hi[4], lo[4];
                tc_split(fx + 8 * h, hi, lo);
                sm.x[buf ^ 1][0][xr][2 * xh + h] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
                sm.x[buf ^ 1][1][xr][2 * xh + h] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
            }
        }
        /* the inputs of step i + 2, in flight while step i computes */
        bk_ldx(i + 2 < KB ? xrow : NULL, i + 2 < KB ? bk_kblock(i + 2, KB) : 0, xh, K, fx);
        uint4 bh[XT], bl[XT];
#pragma unroll
        for (int xt = 0; xt < XT; xt++) {
            bh[xt] = sm.x[buf][0][wx * XT * 8 + xt * 8 + g][q];
            bl[xt] = sm.x[buf][1][wx * XT * 8 + xt * 8 + g][q];
        }
#pragma unroll
        for (int wt = 0; wt < 4; wt++) {
            const uint4 w0 = sm.w[st][wn * 64 + wt * 16 + g][q], w8 = sm.w[st][wn * 64 + wt * 16 + 8 + g][q];
#pragma unroll
            for (int xt = 0; xt < XT; xt++) {
                mma_bf16(acc[wt][xt], w0.x, w8.x, w0.y, w8.y, bh[xt].x, bh[xt].y);
                mma_bf16(acc[wt][xt], w0.x, w8.x, w0.y, w8.y, bl[xt].x, bl[xt].y);
                mma_bf16(acc[wt][xt], w0.z, w8.z, w0.w, w8.w, bh[xt].z, bh[xt].w);
                mma_bf16(acc[wt][xt], w0.z, w8.z, w0.w, w8.w, bl[xt].z, bl[xt].w);
            }
        }
        if (++j == npp) { /* part pp is complete: add it to the running sum */
#pragma unroll
            for (int wt = 0; wt < 4; wt++)
#pragma unroll
                for (int xt = 0; xt < XT; xt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        sum[wt][xt][e] = pp ? sum[wt][xt][e] + acc[wt][xt][e] : acc[wt][xt][e];
                        acc[wt][xt][e] = 0.0f;
                    }
            pp++;
            j = 0;
            npp = bk_nk(pp, KB);
        }
    }
    cp_wait(0);
    /* parts with no k-block (K < 256) are chains of +0, added like the others */
    for (; pp < TC_P; pp++)
#pragma unroll
        for (int wt = 0; wt < 4; wt++)
#pragma unroll
            for (int xt = 0; xt < XT; xt++)
#pragma unroll
                for (int e = 0; e < 4; e++) sum[wt][xt][e] = sum[wt][xt][e] + 0.0f;
    /* the accumulator layout of tc_body */
#pragma unroll
    for (int wt = 0; wt < 4; wt++)
#pragma unroll
        for (int xt = 0; xt < XT; xt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int n = nb + wn * 64 + wt * 16 + g + (e >= 2 ? 8 : 0);
                const int m = m0 + wx * XT * 8 + xt * 8 + 2 * q + (e & 1);
                if (m < a.M && n < p.N) store_out(p, m, n, sum[wt][xt][e]);
            }
}

typedef struct tc_kind {
    mm_kernel k;
    int WT, XT, BW, BX, PS, U, S;
} tc_kind;

#define TC_WARPS(BW, BX, PS) ((BW) * (BX) * ((PS) ? TC_P : 1))
#define TC_KERNEL(NAME, VEC, WT, XT, BW, BX, PS, U, S)                                                          \
    static_assert((WT) <= 4 && (XT) <= 4 && (U) <= 8 && (S) <= 4 && (!(S) || ((PS) && (VEC))) &&             \
                      TC_WARPS(BW, BX, PS) * LANES <= 1024,                                                   \
                  "tc kernel shape");                                                                         \
    static __global__ void __launch_bounds__(TC_WARPS(BW, BX, PS) * LANES) NAME(const ember_cu_mm a) {          \
        __shared__ float red[(PS) ? (BW) * (BX) * (TC_P - 1) * (WT) * (XT) * 4 * LANES : 1];                     \
        __shared__ uint4 ring[(S) ? TC_WARPS(BW, BX, PS) * (S) * 2 * (WT) * LANES : 1];                         \
        tc_body(a, red, ring, VEC, WT, XT, BW, BX, PS, U, S);                                                   \
    }
#define TC_ROW(NAME, VEC, WT, XT, BW, BX, PS, U, S) {NAME, WT, XT, BW, BX, PS, U, S},

/* The defaults, by M (measured on an H200, docs/cuda.md). X(name, vec, WT,
   XT, BW, BX, PS, U, S); S > 0: the weights through shared memory, S
   k-blocks ahead (U unused). */
#define TC_DEFAULTS(X)                           \
    X(tc_small, true, 1, 1, 1, 1, true, 1, 4)    \
    X(tc_mid, true, 1, 4, 1, 1, true, 1, 4)      \
    X(tc_big, true, 2, 2, 4, 2, false, 2, 0)     \
    X(tc_huge, true, 2, 4, 4, 2, false, 1, 0)    \
    X(tc_elem, false, 1, 1, 1, 1, true, 2, 0)
TC_DEFAULTS(TC_KERNEL)
enum { TC_SMALL, TC_MID, TC_BIG, TC_HUGE, TC_ELEM };
static const tc_kind k_tc[] = {TC_DEFAULTS(TC_ROW)};

/* Other shapes, for measuring (ember_cu_mm.variant, bench/cuda_ops_bench.c);
   the same bits as the defaults, by construction. */
#define TC_VARIANTS(X)                          \
    X(tc_v1, true, 1, 1, 1, 1, true, 1, 2)      \
    X(tc_v2, true, 1, 1, 1, 1, true, 1, 3)      \
    X(tc_v3, true, 1, 2, 1, 1, true, 1, 4)      \
    X(tc_v4, true, 1, 4, 1, 1, true, 1, 2)      \
    X(tc_v5, true, 2, 1, 1, 1, true, 1, 2)      \
    X(tc_v6, true, 1, 1, 1, 1, true, 2, 0)      \
    X(tc_v7, true, 1, 1, 1, 1, true, 1, 0)      \
    X(tc_v8, true, 1, 4, 1, 1, true, 2, 0)      \
    X(tc_v9, true, 2, 2, 4, 2, false, 2, 0)     \
    X(tc_v10, true, 2, 4, 4, 2, false, 1, 0)    \
    X(tc_v11, true, 2, 4, 4, 1, false, 1, 0)     \
    X(tc_v12, true, 1, 4, 1, 1, true, 1, 4)
TC_VARIANTS(TC_KERNEL)
static const tc_kind k_tc_var[] = {TC_VARIANTS(TC_ROW)};
#define N_TC_VAR ((int)(sizeof k_tc_var / sizeof k_tc_var[0]))

/* The cluster kernels: {kernel, XT, XA, S}. The first four are the
   defaults by M (9-16, 17-32, 33 and more rows: XT 2, 4, 8; XT 1 is only a
   variant), the rest variants for measuring (fewer inputs or weights in
   flight). */
typedef struct cl_kind {
    mm_kernel k;
    int XT, XA, S;
} cl_kind;
#define CL_XA 1 /* input k-blocks ahead in registers, besides the one being split (98 registers at XA 2, XT 8) */
#define CL_S 3  /* weight k-blocks ahead per lane, through shared memory */
static const cl_kind k_cl[] = {
    {tc_cl_k<1, CL_XA, CL_S>, 1, CL_XA, CL_S}, {tc_cl_k<2, CL_XA, CL_S>, 2, CL_XA, CL_S},
    {tc_cl_k<4, CL_XA, CL_S>, 4, CL_XA, CL_S}, {tc_cl_k<8, CL_XA, CL_S>, 8, CL_XA, CL_S},
    {tc_cl_k<8, 2, CL_S>, 8, 2, CL_S},         {tc_cl_k<8, CL_XA, 2>, 8, CL_XA, 2},
    {tc_cl_k<4, 2, CL_S>, 4, 2, CL_S}};
#define N_CL_VAR ((int)(sizeof k_cl / sizeof k_cl[0]))
static_assert(CL_WARPS == TC_P, "a cluster of TC_P blocks");

/* The block kernels: {kernel, XT, S}. The first runs from
   ember_cu_mm_blk_min rows on (off by default), all four are variants for
   measuring. */
typedef struct bk_kind {
    mm_kernel k;
    int XT, S;
} bk_kind;
static const bk_kind k_bk[] = {{tc_blk_k<4, 4>, 4, 4}, {tc_blk_k<4, 3>, 4, 3}, {tc_blk_k<2, 4>, 2, 4},
                               {tc_blk_k<4, 2>, 4, 2}};
#define N_BK_VAR ((int)(sizeof k_bk / sizeof k_bk[0]))

extern "C" int ember_cu_tc_variant(int variant, int shape[8]) {
    if (variant < 0 || variant > N_TC_VAR + N_CL_VAR + N_BK_VAR) return 0;
    for (int i = 0; i < 8; i++) shape[i] = 0;
    if (variant > N_TC_VAR + N_CL_VAR) { /* a block kernel: 2 x 4 warps of 4 x XT tiles, parts walked in turn */
        const bk_kind *b = &k_bk[variant - N_TC_VAR - N_CL_VAR - 1];
        shape[0] = 4;
        shape[1] = b->XT;
        shape[2] = 2;
        shape[3] = 4;
        shape[6] = b->S;
        shape[7] = 2;
        return 1;
    }
    if (variant > N_TC_VAR) { /* a cluster kernel: 8 warps of 16 weight rows, parts over the blocks */
        const cl_kind *c = &k_cl[variant - N_TC_VAR - 1];
        shape[0] = 1;
        shape[1] = c->XT;
        shape[2] = CL_WARPS;
        shape[3] = 1;
        shape[5] = c->XA;
        shape[6] = c->S;
        shape[7] = 1;
        return 1;
    }
    const tc_kind *v = variant ? &k_tc_var[variant - 1] : NULL;
    shape[0] = v ? v->WT : 0;
    shape[1] = v ? v->XT : 0;
    shape[2] = v ? v->BW : 0;
    shape[3] = v ? v->BX : 0;
    shape[4] = v ? v->PS : 0;
    shape[5] = v ? v->U : 0;
    shape[6] = v ? v->S : 0;
    return 1;
}

/* Programmatic dependent launch on (cuda_pdl.cuh); the cluster kernel for
   mid M on (the default; 0 keeps tc_mid there, a measuring aid). */
extern "C" {
int ember_cu_pdl = 1;
int ember_cu_mm_cluster = 1;
int ember_cu_mm_blk_min = 0; /* off: slower than tc_cl at every M measured (docs/cuda.md) */
}

/* ---- launcher ---------------------------------------------------------------------------- */

static bool aligned16(const void *p) {
    return ((uintptr_t)p & 15u) == 0;
}

/* Deals the blocks of a launch to its products, rows_per_block weight
   rows each: sets every product's first_block and returns the total. */
static int assign_blocks(ember_cu_mm *a, int rows_per_block) {
    int blocks = 0;
    for (int i = 0; i < a->n; i++) {
        a->p[i].first_block = blocks;
        blocks += (a->p[i].N + rows_per_block - 1) / rows_per_block;
    }
    return blocks;
}

/* Block and grid of a tc kind; the per-product block counts go to a. */
static cudaError_t launch(cudaStream_t stream, ember_cu_mm *a, mm_kernel k, int rows_per_block, int grid_y,
                          int threads) {
    if (grid_y > 65535) return cudaErrorInvalidConfiguration;
    const int blocks = assign_blocks(a, rows_per_block);
    if (blocks < 1) return cudaSuccess;
    void *args[] = {a};
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute at;
    ember_pdl_config(&cfg, &at, dim3((unsigned)blocks, (unsigned)grid_y, 1), dim3((unsigned)threads, 1, 1), 0, stream);
    cudaError_t e = cudaLaunchKernelExC(&cfg, (const void *)k, args);
    if (e != cudaSuccess) return e;
    return cudaGetLastError();
}

/* A cluster kernel (k_cl[ci]): blocks of CL_ROWS weight rows per product,
   8 XT input rows per grid row, the TC_P parts along z (one cluster). */
static cudaError_t launch_cl(cudaStream_t stream, ember_cu_mm *a, int ci) {
    const int bm = 8 * k_cl[ci].XT, grid_y = (a->M + bm - 1) / bm;
    if (grid_y > 65535) return cudaErrorInvalidConfiguration;
    const int blocks = assign_blocks(a, CL_ROWS);
    if (blocks < 1) return cudaSuccess;
    void *args[] = {a};
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute at;
    ember_pdl_config(&cfg, &at, dim3((unsigned)blocks, (unsigned)grid_y, TC_P), dim3(CL_WARPS * LANES, 1, 1), 0,
                     stream);
    return cudaLaunchKernelExC(&cfg, (const void *)k_cl[ci].k, args);
}

/* The shared memory of block kernel b: its weight ring and two input buffers
   (over the default 48 KB: ember_cu_mm_prepare raises the limit). */
static size_t bk_bytes(const bk_kind *b) {
    return (size_t)b->S * BK_ROWS * 4 * 16 + (size_t)2 * 2 * (32 * b->XT) * 4 * 16;
}

extern "C" cudaError_t ember_cu_mm_prepare(void) {
    for (int i = 0; i < N_BK_VAR; i++) {
        cudaError_t e =
            cudaFuncSetAttribute((const void *)k_bk[i].k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bk_bytes(&k_bk[i]));
        if (e != cudaSuccess) return e;
    }
    return ember_cu_mm_wg_prepare();
}

/* A block kernel (k_bk[bi]): blocks of BK_ROWS weight rows per product,
   32 XT input rows per grid row, the shared memory of bk_bytes (its limit
   raised once per backend by ember_cu_mm_prepare). */
static cudaError_t launch_bk(cudaStream_t stream, ember_cu_mm *a, int bi) {
    const bk_kind *b = &k_bk[bi];
    const size_t smem = bk_bytes(b);
    const int bm = 32 * b->XT, grid_y = (a->M + bm - 1) / bm;
    if (grid_y > 65535) return cudaErrorInvalidConfiguration;
    const int blocks = assign_blocks(a, BK_ROWS);
    if (blocks < 1) return cudaSuccess;
    void *args[] = {a};
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute at;
    ember_pdl_config(&cfg, &at, dim3((unsigned)blocks, (unsigned)grid_y, 1), dim3(BK_WARPS * LANES, 1, 1), smem,
                     stream);
    cudaError_t e = cudaLaunchKernelExC(&cfg, (const void *)b->k, args);
    return e != cudaSuccess ? e : cudaGetLastError();
}

extern "C" cudaError_t ember_cu_matmul(cudaStream_t stream, ember_cu_mm *a) {
    if (a->M < 1 || a->n < 1) return cudaSuccess;
    if (a->n > EMBER_CU_MAX_MM || a->dtype < 0 || a->dtype > 2) return cudaErrorInvalidValue;
    bool vec = a->K % 8 == 0 && aligned16(a->x);
    for (int i = 0; i < a->n; i++) vec = vec && aligned16(a->p[i].w);
    if (a->variant && (a->variant < 0 || a->variant > N_TC_VAR + N_CL_VAR + N_BK_VAR || !vec ||
                       a->dtype != EMBER_CU_BF16 || a->legacy))
        return cudaErrorInvalidValue;
    if (a->variant > N_TC_VAR + N_CL_VAR) return launch_bk(stream, a, a->variant - N_TC_VAR - N_CL_VAR - 1);
    if (a->dtype == EMBER_CU_BF16 && !a->legacy && !a->variant && vec && ember_cu_mm_blk_min > 0 &&
        a->M >= ember_cu_mm_blk_min)
        return launch_bk(stream, a, 0);
    if (a->dtype == EMBER_CU_BF16 && !a->legacy && !a->variant && vec && ember_cu_mm_wg_min > 0 &&
        a->M >= ember_cu_mm_wg_min && ember_cu_mm_wg_ready()) {
        cudaError_t e = ember_cu_mm_wg(stream, a);
        if (e == cudaSuccess) return e;
        if (e != cudaErrorNotSupported) cudaGetLastError(); /* a launch refused: the kernels below, the same bits */
    }
    if (a->variant > N_TC_VAR) {
        cudaError_t e = launch_cl(stream, a, a->variant - N_TC_VAR - 1);
        return e != cudaSuccess ? e : cudaGetLastError();
    }
    if (a->dtype == EMBER_CU_BF16 && !a->legacy && !a->variant && vec && ember_cu_mm_cluster && a->M > 8) {
        cudaError_t e = launch_cl(stream, a, a->M <= 16 ? 1 : a->M <= 32 ? 2 : 3);
        if (e == cudaSuccess) return cudaGetLastError();
        /* a GPU or driver that refuses the cluster launch: tc_mid, the same bits */
        cudaGetLastError();
        ember_cu_mm_cluster = 0;
    }
    if (a->dtype == EMBER_CU_BF16 && !a->legacy) {
        const tc_kind *t = a->variant ? &k_tc_var[a->variant - 1]
                           : !vec         ? &k_tc[TC_ELEM]
                           : a->M <= 8    ? &k_tc[TC_SMALL]
                           : a->M <= 128  ? &k_tc[TC_MID]
                           : a->M <= 512  ? &k_tc[TC_BIG]
                                          : &k_tc[TC_HUGE];
        const int bm = t->BX * t->XT * 8;
        return launch(stream, a, t->k, t->BW * t->WT * 16, (a->M + bm - 1) / bm,
                      TC_WARPS(t->BW, t->BX, t->PS) * LANES);
    }
    if (vec && a->M <= 8) {
        const gemv_kind *g = &k_gemv[a->dtype][a->M - 1];
        return launch(stream, a, g->k, WARPS * g->R, 1, WARPS * LANES);
    }
    if (vec)
        return launch(stream, a, k_tiled[a->dtype], TILE_N * TILE_WN, (a->M + TILE_M * TILE_WM - 1) / (TILE_M * TILE_WM),
                      WARPS * LANES);
    return launch(stream, a, k_elem[a->dtype], WARPS, a->M < 1024 ? a->M : 1024, WARPS * LANES);
}
