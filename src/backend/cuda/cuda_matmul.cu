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
 * bf16 weights: the tensor-core order (TC_ORDER), for every M.
 *   - x is split per element into two bf16 numbers: hi = bf16(x) and
 *     lo = bf16(x - hi) (round to nearest even; x - hi is exact in f32),
 *     so hi + lo keeps about 16 bits of x's 24 (relative error <= 2^-17);
 *   - K is cut into k-blocks of 32 (k = 32b .. 32b + 31, zero past K);
 *     k-block b belongs to part b % 4;
 *   - in k-block b, lane t of the warp (g = t / 4, q = t % 4) holds
 *     k = 32b + 8q .. 32b + 8q + 7 of weight row g of its n8 tile and of
 *     input rows g and g + 8 of its m16 tile. Elements 8q + 0, 1, 2, 3 fill
 *     slots 2q, 2q + 1, 2q + 8, 2q + 9 of step 0, elements 8q + 4 .. 7 the
 *     same slots of step 1; each step is one mma.sync m16n8k16 (bf16 in,
 *     f32 accumulate) with x's hi, then one with x's lo, on the same
 *     accumulator;
 *   - each part is one accumulator chain, starting at +0, over its
 *     k-blocks in increasing b, steps 0 then 1, hi then lo;
 *   - out = ((p0 + p1) + p2) + p3, then + bias[n].
 *   The tensor cores compute an output from its own row of A, column of B
 *   and accumulator only, so padding M (rows past M are zeros) and the
 *   tile a row lands in change nothing. The parts exist for decode: four
 *   warps walk one tile's K side by side (PS below).
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
 *   tc     bf16, every M. A warp owns MT m16 tiles x NT n8 tiles of the
 *          output, a block WM x WN such warp tiles. PS (parts split): each
 *          tile has 4 warps, one per part, whose sums meet in shared
 *          memory (small M: more warps per weight, more loads in flight);
 *          else one warp walks the four parts in turn, keeping the running
 *          sum (large M). U k-blocks of weights are loaded ahead. Shapes
 *          per M in k_tc (small M <= 16, mid M <= 128, big), measured on
 *          an H200 (docs/cuda.md); tc_elem (element loads) takes K % 8 != 0
 *          and tensors not 16-byte aligned, with the same values and bits.
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

#include "cuda_kernels.h"

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

/* The product that block `blk` works on (blocks are laid out product after
   product); copied field by field with constant indices so the parameter
   struct stays in parameter space. */
static __device__ __forceinline__ ember_cu_mm_prod pick_prod(const ember_cu_mm &a, int blk) {
    ember_cu_mm_prod p = a.p[0];
#pragma unroll
    for (int i = 1; i < EMBER_CU_MAX_MM; i++)
        if (i < a.n && blk >= a.p[i].first_block) p = a.p[i];
    return p;
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
    const ember_cu_mm_prod p = pick_prod(a, (int)blockIdx.x);
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
    const ember_cu_mm_prod p = pick_prod(a, (int)blockIdx.x);
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
    const ember_cu_mm_prod p = pick_prod(a, (int)blockIdx.x);
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

/* The tensor-core order (TC_ORDER in the header comment). TC_KB elements
   make a k-block, TC_P parts share the k-blocks round robin. */
#define TC_KB 32
#define TC_P 4

/* acc += a b on the tensor cores: one m16n8k16 product, bf16 in, f32
   accumulate (fragment layouts: PTX ISA, "mma.m16n8k16"). */
static __device__ __forceinline__ void mma_bf16(float acc[4], const unsigned int a[4], unsigned int b0,
                                                unsigned int b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* The eight weights of a lane in k-block kb: row `row`, k = 32 kb + 8 q ..
   + 7, zero past K. vec: one 16-byte load (K % 8 == 0, row 16-byte
   aligned), else element loads; the same values either way. */
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

/* Eight inputs of a row (NULL: a row past M, zeros) split into bf16 pairs:
   hi[i] = the pair (x[2i], x[2i + 1]) rounded to bf16 (lower k in the low
   half), lo[i] = the pairs' remainders x - hi (exact in f32) rounded to
   bf16. */
static __device__ __forceinline__ void tc_ldx(const float *row, int k, int K, const bool vec, unsigned int hi[4],
                                              unsigned int lo[4]) {
    float f[8];
    if (!row) {
#pragma unroll
        for (int j = 0; j < 8; j++) f[j] = 0.0f;
    } else if (vec) {
        if (k < K) {
            ld_xchunk(row + k, 0, f);
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++) f[j] = 0.0f;
        }
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++) f[j] = k + j < K ? __ldg(row + k + j) : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        __nv_bfloat162 h = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
        float2 hf = __bfloat1622float2(h);
        __nv_bfloat162 l = __floats2bfloat162_rn(f[2 * i] - hf.x, f[2 * i + 1] - hf.y);
        hi[i] = *(const unsigned int *)&h;
        lo[i] = *(const unsigned int *)&l;
    }
}

/* One k-block of a warp's MT x NT tiles: both steps, hi then lo each. */
static __device__ __forceinline__ void tc_kblock(float acc[][4][4], const uint4 *wv, const float *const *xr0,
                                                 const float *const *xr8, int k, int K, const bool vec, const int MT,
                                                 const int NT) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        unsigned int h0[4], l0[4], h8[4], l8[4]; /* rows g and g + 8 of the m-tile */
        tc_ldx(xr0[mt], k, K, vec, h0, l0);
        tc_ldx(xr8[mt], k, K, vec, h8, l8);
#pragma unroll
        for (int s = 0; s < 2; s++) {
            const unsigned int ah[4] = {h0[2 * s], h8[2 * s], h0[2 * s + 1], h8[2 * s + 1]};
            const unsigned int al[4] = {l0[2 * s], l8[2 * s], l0[2 * s + 1], l8[2 * s + 1]};
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const unsigned int b0 = s ? wv[nt].z : wv[nt].x, b1 = s ? wv[nt].w : wv[nt].y;
                mma_bf16(acc[mt][nt], ah, b0, b1);
                mma_bf16(acc[mt][nt], al, b0, b1);
            }
        }
    }
}

/* The chain of part `part`: k-blocks part, part + TC_P, ... in order, U
   k-blocks' weights loaded ahead. acc starts at zero. */
static __device__ __forceinline__ void tc_part(float acc[][4][4], const unsigned short *const *wr,
                                               const float *const *xr0, const float *const *xr8, int part, int K,
                                               const bool vec, const int MT, const int NT, const int U) {
    const int q = (int)threadIdx.x % 4, KB = (K + TC_KB - 1) / TC_KB;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mt][nt][i] = 0.0f;
    int b = part;
    for (; b + TC_P * (U - 1) < KB; b += TC_P * U) {
        uint4 wv[8][4];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) wv[u][nt] = tc_ldw(wr[nt], (b + TC_P * u) * TC_KB + 8 * q, K, vec);
#pragma unroll
        for (int u = 0; u < U; u++) tc_kblock(acc, wv[u], xr0, xr8, (b + TC_P * u) * TC_KB + 8 * q, K, vec, MT, NT);
    }
    for (; b < KB; b += TC_P) {
        uint4 wv[4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) wv[nt] = tc_ldw(wr[nt], b * TC_KB + 8 * q, K, vec);
        tc_kblock(acc, wv, xr0, xr8, b * TC_KB + 8 * q, K, vec, MT, NT);
    }
}

/* A block of WM x WN warp tiles, each MT m16 tiles by NT n8 tiles.
   PS (parts split): each tile has TC_P warps, one per part, and the parts
   meet in shared memory `red`; else one warp per tile walks the parts in
   turn. Both add the parts as ((p0 + p1) + p2) + p3. */
static __device__ __forceinline__ void tc_body(const ember_cu_mm &a, float *red, const bool vec, const int MT,
                                               const int NT, const int WM, const int WN, const bool PS,
                                               const int U) {
    const ember_cu_mm_prod p = pick_prod(a, (int)blockIdx.x);
    const int warp = (int)threadIdx.x / LANES, lane = (int)threadIdx.x % LANES, g = lane / 4, q = lane % 4;
    const int tile = PS ? warp / TC_P : warp, part = PS ? warp % TC_P : 0;
    const int wm = tile / WN, wn = tile % WN;
    const int m0 = (int)blockIdx.y * (WM * MT * 16) + wm * MT * 16;
    const int n0 = ((int)blockIdx.x - p.first_block) * (WN * NT * 8) + wn * NT * 8;
    const int K = a.K;
    /* rows past N read row N - 1 and rows past M read zeros; neither is stored */
    const unsigned short *wr[4];
    const float *xr0[4], *xr8[4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
        wr[nt] = (const unsigned short *)p.w + (size_t)min(n0 + nt * 8 + g, p.N - 1) * (size_t)K;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        const int r0 = m0 + mt * 16 + g, r8 = r0 + 8;
        xr0[mt] = r0 < a.M ? a.x + (size_t)r0 * (size_t)K : NULL;
        xr8[mt] = r8 < a.M ? a.x + (size_t)r8 * (size_t)K : NULL;
    }
    const bool live = m0 < a.M && n0 < p.N;
    float acc[4][4][4], sum[4][4][4];
    if (PS) {
        if (live) tc_part(acc, wr, xr0, xr8, part, K, vec, MT, NT, U);
        const int per = MT * NT * 4;
        if (part && live) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        red[(((size_t)tile * (TC_P - 1) + part - 1) * per + (mt * NT + nt) * 4 + i) * LANES + lane] =
                            acc[mt][nt][i];
        }
        __syncthreads();
        if (part || !live) return;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float s = acc[mt][nt][i];
#pragma unroll
                    for (int pp = 1; pp < TC_P; pp++)
                        s = s + red[(((size_t)tile * (TC_P - 1) + pp - 1) * per + (mt * NT + nt) * 4 + i) * LANES +
                                    lane];
                    sum[mt][nt][i] = s;
                }
    } else {
        if (!live) return;
#pragma unroll 1
        for (int pp = 0; pp < TC_P; pp++) {
            tc_part(acc, wr, xr0, xr8, pp, K, vec, MT, NT, U);
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++) sum[mt][nt][i] = pp ? sum[mt][nt][i] + acc[mt][nt][i] : acc[mt][nt][i];
        }
    }
    /* the accumulator layout: i = 0, 1 row g, columns 2q, 2q + 1; i = 2, 3 row g + 8 */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int m = m0 + mt * 16 + g + (i >= 2 ? 8 : 0), n = n0 + nt * 8 + 2 * q + (i & 1);
                if (m < a.M && n < p.N) store_out(p, m, n, sum[mt][nt][i]);
            }
}

typedef struct tc_kind {
    mm_kernel k;
    int MT, NT, WM, WN, PS, U;
} tc_kind;

#define TC_WARPS(WM, WN, PS) ((WM) * (WN) * ((PS) ? TC_P : 1))
#define TC_KERNEL(NAME, VEC, MT, NT, WM, WN, PS, U)                                                            \
    static_assert((MT) <= 4 && (NT) <= 4 && (U) <= 8 && TC_WARPS(WM, WN, PS) * LANES <= 1024, "tc kernel shape"); \
    static __global__ void __launch_bounds__(TC_WARPS(WM, WN, PS) * LANES) NAME(const ember_cu_mm a) {          \
        __shared__ float red[(PS) ? (WM) * (WN) * (TC_P - 1) * (MT) * (NT) * 4 * LANES : 1];                     \
        tc_body(a, red, VEC, MT, NT, WM, WN, PS, U);                                                            \
    }
#define TC_ROW(NAME, VEC, MT, NT, WM, WN, PS, U) {NAME, MT, NT, WM, WN, PS, U},

/* The defaults, by M (measured on an H200, docs/cuda.md). X(name, vec, MT,
   NT, WM, WN, PS, U). */
#define TC_DEFAULTS(X)                        \
    X(tc_small, true, 1, 1, 1, 2, true, 4)    \
    X(tc_mid, true, 2, 2, 1, 2, true, 2)      \
    X(tc_big, true, 2, 4, 2, 4, false, 1)     \
    X(tc_elem, false, 1, 1, 1, 2, true, 2)
TC_DEFAULTS(TC_KERNEL)
enum { TC_SMALL, TC_MID, TC_BIG, TC_ELEM };
static const tc_kind k_tc[] = {TC_DEFAULTS(TC_ROW)};

/* Other shapes, for measuring (ember_cu_mm.variant, bench/cuda_ops_bench.c);
   the same bits as the defaults, by construction. */
#define TC_VARIANTS(X)                      \
    X(tc_v1, true, 1, 1, 1, 2, true, 2)     \
    X(tc_v2, true, 1, 1, 1, 2, true, 8)     \
    X(tc_v3, true, 1, 2, 1, 2, true, 4)     \
    X(tc_v4, true, 1, 1, 1, 4, true, 4)     \
    X(tc_v5, true, 2, 2, 1, 2, true, 2)     \
    X(tc_v6, true, 4, 2, 1, 2, true, 1)     \
    X(tc_v7, true, 2, 4, 2, 4, false, 1)    \
    X(tc_v8, true, 2, 4, 2, 4, false, 2)    \
    X(tc_v9, true, 2, 2, 2, 4, false, 2)    \
    X(tc_v10, true, 1, 4, 2, 4, false, 2)   \
    X(tc_v11, true, 4, 2, 2, 2, false, 1)
TC_VARIANTS(TC_KERNEL)
static const tc_kind k_tc_var[] = {TC_VARIANTS(TC_ROW)};
#define N_TC_VAR ((int)(sizeof k_tc_var / sizeof k_tc_var[0]))

extern "C" int ember_cu_tc_variant(int variant, int shape[6]) {
    const tc_kind *v;
    if (variant < 0 || variant > N_TC_VAR) return 0;
    v = variant ? &k_tc_var[variant - 1] : NULL;
    if (!v) {
        for (int i = 0; i < 6; i++) shape[i] = 0;
        return 1;
    }
    shape[0] = v->MT;
    shape[1] = v->NT;
    shape[2] = v->WM;
    shape[3] = v->WN;
    shape[4] = v->PS;
    shape[5] = v->U;
    return 1;
}

/* ---- launcher ---------------------------------------------------------------------------- */

static bool aligned16(const void *p) {
    return ((uintptr_t)p & 15u) == 0;
}

/* Block and grid of a tc kind; the per-product block counts go to a. */
static cudaError_t launch(cudaStream_t stream, ember_cu_mm *a, mm_kernel k, int rows_per_block, int grid_y,
                          int threads) {
    if (grid_y > 65535) return cudaErrorInvalidConfiguration;
    int blocks = 0;
    for (int i = 0; i < a->n; i++) {
        a->p[i].first_block = blocks;
        blocks += (a->p[i].N + rows_per_block - 1) / rows_per_block;
    }
    if (blocks < 1) return cudaSuccess;
    void *args[] = {a};
    cudaError_t e = cudaLaunchKernel((const void *)k, dim3((unsigned)blocks, (unsigned)grid_y, 1),
                                     dim3((unsigned)threads, 1, 1), args, 0, stream);
    if (e != cudaSuccess) return e;
    return cudaGetLastError();
}

extern "C" cudaError_t ember_cu_matmul(cudaStream_t stream, ember_cu_mm *a) {
    if (a->M < 1 || a->n < 1) return cudaSuccess;
    if (a->n > EMBER_CU_MAX_MM || a->dtype < 0 || a->dtype > 2) return cudaErrorInvalidValue;
    bool vec = a->K % 8 == 0 && aligned16(a->x);
    for (int i = 0; i < a->n; i++) vec = vec && aligned16(a->p[i].w);
    if (a->variant && (a->variant < 0 || a->variant > N_TC_VAR || !vec || a->dtype != EMBER_CU_BF16 || a->legacy))
        return cudaErrorInvalidValue;
    if (a->dtype == EMBER_CU_BF16 && !a->legacy) {
        const tc_kind *t = a->variant ? &k_tc_var[a->variant - 1]
                           : !vec         ? &k_tc[TC_ELEM]
                           : a->M <= 16   ? &k_tc[TC_SMALL]
                           : a->M <= 128  ? &k_tc[TC_MID]
                                          : &k_tc[TC_BIG];
        const int bm = t->WM * t->MT * 16;
        return launch(stream, a, t->k, t->WN * t->NT * 8, (a->M + bm - 1) / bm,
                      TC_WARPS(t->WM, t->WN, t->PS) * LANES);
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
