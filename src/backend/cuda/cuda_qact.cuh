/*
 * cuda_qact.cuh - the quantizer of a quantized product's input (CUDA
 * sources only; internal to the backend): the CPU's per-block quantization
 * of f32 inputs to 8-bit levels (src/backend/cpu/qkern.h), as one warp's
 * work per block, in the activation layouts of cuda_qmm.cu.
 *
 * Two kinds of kernels call it: cuda_qmm.cu's quantizer kernels (the
 * matmul's own launch), and the ops that produce a product's input
 * (rms_norm, add_rms_norm, swiglu, geglu in cuda_ops.cu), which may write
 * the quantized form beside their f32 output for inputs of at most
 * EMBER_CU_QFUSE_MAX_M rows (cuda_backend.c decides; the matmul then skips
 * its own launch). Both run these functions on the same f32 values, so the
 * levels, scales and sums are the same bits either way.
 *
 * Layouts (per input row, its blocks in order):
 *   A32   blocks of 32: { i8 q[32]; f32 d; i32 s; pad } (48 bytes; s = sum of q)
 *   A256  blocks of 256: { i8 q[256]; i32 bs16[16]; f32 d; pad } (336 bytes;
 *         bs16[j] = sum of q[16j .. 16j + 15])
 *   A32T, A256T  the tensor-core kernels' tiles of 8 rows (cuda_qmm.cu;
 *         rows past M zero), from 9 rows on
 */
#ifndef EMBER_CUDA_QACT_CUH
#define EMBER_CUDA_QACT_CUH

#include <cuda_runtime.h>

#define A32_BYTES 48
#define A256_BYTES 336
#define A32T_BYTES 320
#define A256T_BYTES 2592

/* The CPU's q127: clamp to [-127, 127] (NaN -> -127), round to nearest even. */
static __device__ __forceinline__ int q127(float v) {
    v = fmaxf(v, -127.0f);
    v = fminf(v, 127.0f);
    return (int)rintf(v);
}

/* One 32-element block by one warp, lane l holding element v of it:
   returns lane l's level; *d and *s (every lane) the block's scale and
   level sum. The largest magnitude and the sum are exact in any order
   (fmaxf skips NaN as the CPU's loop does). */
static __device__ __forceinline__ int qact32_warp(float v, float *d, int *s) {
    float a = fabsf(v);
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    const float id = a > 0.0f ? 127.0f / a : 0.0f;
    const int q = q127(__fmul_rn(v, id));
    int t = q;
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    *d = a / 127.0f;
    *s = t;
    return q;
}

/* The same block into its A32 record p. */
static __device__ __forceinline__ void qact32_store(float v, unsigned char *p, int lane) {
    float d;
    int s;
    const int q = qact32_warp(v, &d, &s);
    p[lane] = (unsigned char)(signed char)q;
    if (lane == 0) {
        *(float *)(p + 32) = d;
        *(int *)(p + 36) = s;
    }
}

/* One 256-element block by one warp, lane l holding elements 8l .. 8l + 7
   (v): lane l's levels as two words (lo: elements 8l .. 8l + 3), *s16 the
   level sum of sub-block l / 2 of 16 (lanes 2j and 2j + 1 hold sub-block j),
   *d (every lane) the block's scale. */
static __device__ __forceinline__ void qact256_warp(const float v[8], unsigned int *lo, unsigned int *hi, int *s16,
                                                    float *d) {
    float a = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; e++) a = fmaxf(a, fabsf(v[e]));
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    const float id = a > 0.0f ? 127.0f / a : 0.0f;
    unsigned int l = 0, h = 0;
    int s = 0;
#pragma unroll
    for (int e = 0; e < 8; e++) {
        const int q = q127(__fmul_rn(v[e], id));
        s += q;
        const unsigned int byte = (unsigned int)(q & 255);
        if (e < 4)
            l |= byte << (8 * e);
        else
            h |= byte << (8 * (e - 4));
    }
    *lo = l;
    *hi = h;
    *s16 = s + __shfl_xor_sync(0xffffffffu, s, 1);
    *d = a / 127.0f;
}

/* The same block into its A256 record p. */
static __device__ __forceinline__ void qact256_store(const float v[8], unsigned char *p, int lane) {
    unsigned int lo, hi;
    int s;
    float d;
    qact256_warp(v, &lo, &hi, &s, &d);
    *(uint2 *)(p + 8 * lane) = make_uint2(lo, hi);
    if ((lane & 1) == 0) *(int *)(p + 256 + 4 * (lane >> 1)) = s;
    if (lane == 0) *(float *)(p + 320) = d;
}

/* Element i of this block's row (blockIdx.x, D elements) with value y,
   where the warp's 32 lanes hold the 32 elements of one block of 32 (in
   lane order): into its A32 record. Every lane of the warp calls it. */
static __device__ __forceinline__ void qact32_at(float y, int64_t i, int64_t D, unsigned char *act32) {
    const size_t rec = (size_t)blockIdx.x * (size_t)(D / 32) + (size_t)(i / 32);
    qact32_store(y, act32 + rec * A32_BYTES, (int)(i & 31));
}

/* Row m (D floats at yr, written by this block before a barrier) into the
   A32 records at act32 and / or the A256 records at act256 (NULL: not
   wanted); D a multiple of each kind's block. Every thread of the block
   calls it; warp w takes blocks w, w + warps, ... */
static __device__ __forceinline__ void qact_row(const float *yr, int m, int D, unsigned char *act32,
                                                unsigned char *act256) {
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5, nw = (int)blockDim.x >> 5;
    if (act32) {
        const int nb = D / 32;
        for (int b = warp; b < nb; b += nw)
            qact32_store(yr[b * 32 + lane], act32 + ((size_t)m * (size_t)nb + (size_t)b) * A32_BYTES, lane);
    }
    if (act256) {
        const int nb = D / 256;
        for (int b = warp; b < nb; b += nw) {
            float v[8]; /* element loads: a tensor's rows need only be 4-byte aligned */
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] = yr[b * 256 + 8 * lane + e];
            qact256_store(v, act256 + ((size_t)m * (size_t)nb + (size_t)b) * A256_BYTES, lane);
        }
    }
}

#endif
