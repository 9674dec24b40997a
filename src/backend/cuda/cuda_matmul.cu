/*
 * cuda_matmul.cu - the matrix products of the CUDA backend: out = x w^T
 * (+ bias) for f32, f16 and bf16 weights, x and out f32.
 *
 * Batch invariance is the point of this file. Every kernel here computes
 * each output element with the same canonical dot product (cuda_kernels.h):
 *   - the K elements are cut into chunks of 8 (k = 8c .. 8c + 7);
 *   - lane l of 32 (one warp) owns the chunks c = l, l + 32, l + 64, ...
 *     and sums them in that order, one fused multiply-add per element, in
 *     k order inside a chunk, into one f32 accumulator;
 *   - the 32 lane sums are combined by the butterfly s = 16, 8, 4, 2, 1
 *     (lane l adds the value of lane l ^ s; the two lanes of a pair add the
 *     same two numbers, so every lane ends with the same bits);
 *   - then out = sum (+ bias[n]).
 * The order depends on K alone: not on M, on how many weight rows or input
 * rows a warp carries, on the grid, or on the unrolling. No atomics, no
 * split of K across warps or blocks. So the decode kernel (M <= 8), the
 * tiled kernel (M > 8) and the element-load kernel (odd K, unaligned
 * tensors) give bit-identical results for a row, whatever batch it is in.
 *
 * Kernels (one launch per weight dtype; up to 8 products share the input):
 *   gemv   M <= 8, 16-byte weight loads. A warp owns R weight rows and all
 *          M input rows; each lane keeps U chunks of each row in flight
 *          (U x R x 16 bytes), reads the input chunks (2 x 16 bytes per
 *          row) through L1, where all warps of the SM share them. (R, U)
 *          per M were measured (docs/cuda.md). Known limit: from M = 4 on,
 *          the input no longer stays in L1 and each warp re-reads it from
 *          L2, which bounds the time (36-60% of the copy bandwidth); a
 *          shared-memory pipeline tried for it was slower.
 *   tiled  M > 8, 16-byte loads. A warp owns an 8 (input rows) x 4 (weight
 *          rows) tile: 32 accumulators per lane, the weights of a chunk
 *          converted once and used for 8 input rows. Eight warps per block
 *          (2 x 4) make a 16 x 16 tile, so the rows a warp reads are read
 *          by neighbours too (L1 hits). CUDA cores only: tensor cores
 *          would sum in another order; a later step must move the decode
 *          kernel to that order at the same time.
 *   elem   anything else (K % 8 != 0, or a tensor not 16-byte aligned):
 *          element loads, one warp per weight row, the same order.
 *
 * Ownership and threads: the launcher (ember_cu_matmul) runs on the host
 * thread that drives the backend and only enqueues; the kernels read x, w,
 * bias and write out, all device memory owned by the backend's buffers.
 * Each output element is written by exactly one lane.
 */
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

/* Other shapes of the bf16 decode kernel, for measuring (ember_cu_mm.variant,
   bench/cuda_ops_bench.c); the same bits as the defaults, by construction.
   X(variant, M, R, U). */
#define GEMV_VARIANTS(X) \
    X(1, 1, 1, 8)        \
    X(2, 1, 2, 8)        \
    X(3, 1, 1, 2)        \
    X(4, 2, 1, 8)        \
    X(5, 2, 2, 2)        \
    X(6, 4, 4, 2)        \
    X(7, 4, 1, 8)        \
    X(8, 8, 4, 2)        \
    X(9, 8, 2, 2)
#define VAR_KERNEL(V, M, R, U) GEMV_KERNEL(gemv_var##V, EMBER_CU_BF16, M, R, U)
GEMV_VARIANTS(VAR_KERNEL)
#define VAR_ROW(V, M, R, U) {gemv_var##V, M, R, U},
static const gemv_kind k_gemv_var[] = {GEMV_VARIANTS(VAR_ROW)};
#define N_GEMV_VAR ((int)(sizeof k_gemv_var / sizeof k_gemv_var[0]))

extern "C" int ember_cu_gemv_variant(int variant, int *M, int *R, int *U) {
    if (variant == 0) {
        *M = *R = *U = 0;
        return 1;
    }
    if (variant < 1 || variant > N_GEMV_VAR) return 0;
    const gemv_kind *v = &k_gemv_var[variant - 1];
    *M = v->M;
    *R = v->R;
    *U = v->U;
    return 1;
}

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

/* ---- launcher ---------------------------------------------------------------------------- */

static bool aligned16(const void *p) {
    return ((uintptr_t)p & 15u) == 0;
}

extern "C" cudaError_t ember_cu_matmul(cudaStream_t stream, ember_cu_mm *a) {
    if (a->M < 1 || a->n < 1) return cudaSuccess;
    if (a->n > EMBER_CU_MAX_MM || a->dtype < 0 || a->dtype > 2) return cudaErrorInvalidValue;
    bool vec = a->K % 8 == 0 && aligned16(a->x);
    for (int i = 0; i < a->n; i++) vec = vec && aligned16(a->p[i].w);
    mm_kernel k;
    int rows_per_block, grid_y = 1;
    const gemv_kind *g = NULL;
    if (a->variant) {
        if (a->variant < 0 || a->variant > N_GEMV_VAR) return cudaErrorInvalidValue;
        g = &k_gemv_var[a->variant - 1];
        if (!vec || a->dtype != EMBER_CU_BF16 || a->M != g->M) return cudaErrorInvalidValue;
    } else if (vec && a->M <= 8) {
        g = &k_gemv[a->dtype][a->M - 1];
    }
    if (g) {
        k = g->k;
        rows_per_block = WARPS * g->R;
    } else if (vec) {
        k = k_tiled[a->dtype];
        rows_per_block = TILE_N * TILE_WN;
        grid_y = (a->M + TILE_M * TILE_WM - 1) / (TILE_M * TILE_WM);
    } else {
        k = k_elem[a->dtype];
        rows_per_block = WARPS;
        grid_y = a->M < 1024 ? a->M : 1024;
    }
    if (grid_y > 65535) return cudaErrorInvalidConfiguration;
    int blocks = 0;
    for (int i = 0; i < a->n; i++) {
        a->p[i].first_block = blocks;
        blocks += (a->p[i].N + rows_per_block - 1) / rows_per_block;
    }
    if (blocks < 1) return cudaSuccess;
    void *args[] = {a};
    cudaError_t e = cudaLaunchKernel((const void *)k, dim3((unsigned)blocks, (unsigned)grid_y, 1),
                                     dim3(WARPS * LANES, 1, 1), args, 0, stream);
    if (e != cudaSuccess) return e;
    return cudaGetLastError();
}
