/*
 * cuda_mlx.cu - MLX affine weights on the GPU (the EMBER_MLX<b>_G<G> dtypes,
 * 2, 3, 4, 5, 6 or 8 bits, groups of 32, 64 or 128, in Ember's bit-plane
 * layout: src/formats/mlx_quant.h, src/backend/cpu/kern_mlx.h): the matrix
 * product and get_rows, the CPU's numbers bit for bit.
 *
 * A weight row is K / G blocks: f32 scale sc, f32 bias bi, then G / 32
 * sub-blocks of 4 * bits bytes of codes. Dequantization is w = sc * code +
 * bi, product and sum each rounded (get_rows). The product is kern_mlx.h's
 * canonical dot product: the input row quantized as for the 32-element GGUF
 * types (cuda_qact.cuh's A32 records: levels q, scale d, level sum s; the
 * CPU's ds is d * (float)s, one rounding, computed here), then for each
 * 32-element block b in order
 *     dd = sc * d_b;  p_l = sum of code(e) * q(e), e = 4l .. 4l + 3 (exact)
 *     acc[8 * (b % 2) + l] = fmaf(dd, (float)p_l, acc[8 * (b % 2) + l])
 *     macc = fmaf(bi, ds_b, macc)
 * and the output is tree16(acc) + macc (qkern.h cpu_tree16's order), plus
 * the bias as its own addition. Nothing depends on the other rows of the
 * batch, so results are batch invariant, and equal the CPU backend's.
 *
 * The product kernel (mlx_mm_k): a block of 8 warps, one weight row a warp,
 * MLX_MT input rows a block (grid y). For each input row a warp walks K in
 * chunks of 32 blocks: lane t computes block t's eight integer sums (four
 * codes a byte by four levels in one dp4a; 8-bit codes as code - 128, the
 * levels' sum times 128 added back: exact) and its dd, bi and ds into the
 * warp's shared memory; then lanes 0-15 run the
 * chunk's part of acc[lane]'s chain (the blocks of its parity, in order) and
 * lane 16 the macc chain. Correct first; not tuned (a weight row is read
 * again from L1 / L2 for each input row). It takes up to 8 input rows.
 *
 * From 9 rows (mlx_tc_k; EMBER_CUDA_MLXTC=0 keeps mlx_mm_k): the input
 * quantized into cuda_qmm.cu's A32T tiles, and the integer sums on the
 * tensor cores. A warp takes 16 weight rows x one slice of 8 input rows. The
 * canonical sums are of 4 elements each (p_l), which an mma's k would add
 * together, so each mma.m16n8k16 (u8 codes x s8 levels) takes half a block
 * (16 elements, 4 groups of 4) of 2 input rows, with B holding each input
 * row's levels in 4 columns, one per group and zero outside it: its 16 x 8
 * sums are the p_l of 16 weight rows x 2 input rows x 4 groups (a quarter of
 * the products the unit does are useful, still far more than dp4a gives).
 * Lane 4g + t gets rows g, g + 8 x input row 2p + t / 2 x groups 2 (t % 2),
 * 2 (t % 2) + 1 (+ 4 in the second half), and runs those 8 of the 16 chains
 * of its two outputs (the other 8 on lane t ^ 1; lanes with t even also the
 * bias chains); at the end the two lanes swap their chains and the even
 * one adds the tree16 and macc: the same steps on the same values as
 * mlx_mm_k, so the CPU's bits.
 *
 * Weights must be 4-byte aligned (blocks are a multiple of 4 bytes: the
 * caller checks the base); every pointer is device memory owned by the
 * caller; launchers enqueue and return (cuda_kernels.h).
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_kernels.h"
#include "cuda_mm.cuh"
#include "cuda_pdl.cuh"
#include "cuda_qact.cuh"

#define MLX_MT 8 /* input rows a block of the product takes (grid y) */

/* Byte i of the little-endian words w. */
static __device__ __forceinline__ unsigned int mlx_byte(const unsigned int *w, int i) {
    return (w[i >> 2] >> (8 * (i & 3))) & 255u;
}

/* The nibble plane's and a 2-bit plane's part of code e (0..31); the 2-bit
   plane starts at byte o. */
static __device__ __forceinline__ unsigned int mlx_nib(const unsigned int *w, int e) {
    return e < 16 ? (mlx_byte(w, e) & 15u) : (mlx_byte(w, e - 16) >> 4);
}
static __device__ __forceinline__ unsigned int mlx_two(const unsigned int *w, int o, int e) {
    return (mlx_byte(w, o + (e & 7)) >> (2 * (e >> 3))) & 3u;
}

/* The 4-bit value x's bit i into bit 0 of byte i. */
static __device__ __forceinline__ unsigned int mlx_spread4(unsigned int x) {
    return (x * 0x00204081u) & 0x01010101u;
}

/* Codes 4l .. 4l + 3 of a sub-block held as its BITS words w, one a byte
   (the same codes as mlx_code, four at once). */
static __device__ __forceinline__ unsigned int mlx_nib4(const unsigned int *w, int l) { /* words 0-3 */
    return l < 4 ? w[l & 3] & 0x0f0f0f0fu : (w[l & 3] >> 4) & 0x0f0f0f0fu;
}
static __device__ __forceinline__ unsigned int mlx_two4(const unsigned int *w, int o, int l) { /* words o, o + 1 */
    return (w[o + (l & 1)] >> (2 * (l >> 1))) & 0x03030303u;
}
template <int BITS> static __device__ __forceinline__ unsigned int mlx_codes4(const unsigned int *w, int l) {
    switch (BITS) {
    case 8: return w[l];
    case 4: return mlx_nib4(w, l);
    case 2: return mlx_two4(w, 0, l);
    case 3: return mlx_two4(w, 0, l) | mlx_spread4((mlx_byte(w, 8 + (l >> 1)) >> (4 * (l & 1))) & 15u) << 2;
    case 5: return mlx_nib4(w, l) | mlx_spread4((mlx_byte(w, 16 + (l >> 1)) >> (4 * (l & 1))) & 15u) << 4;
    default: return mlx_nib4(w, l) | mlx_two4(w, 4, l) << 4; /* 6 */
    }
}

/* Code e (0..31) of a sub-block held as its BITS words w (kern_mlx.c
   mlx_code); each case reads only bytes below 4 * BITS. */
template <int BITS> static __device__ __forceinline__ int mlx_code(const unsigned int *w, int e) {
    switch (BITS) {
    case 8: return (int)mlx_byte(w, e);
    case 4: return (int)mlx_nib(w, e);
    case 2: return (int)mlx_two(w, 0, e);
    case 3: return (int)(mlx_two(w, 0, e) | ((mlx_byte(w, 8 + (e >> 3)) >> (e & 7)) & 1u) << 2);
    case 5: return (int)(mlx_nib(w, e) | ((mlx_byte(w, 16 + (e >> 3)) >> (e & 7)) & 1u) << 4);
    default: return (int)(mlx_nib(w, e) | mlx_two(w, 16, e) << 4); /* 6 */
    }
}

template <int BITS> static __global__ void __launch_bounds__(256) mlx_mm_k(const ember_cu_qmm a, int G) {
    __shared__ int sp[8][32][8];
    __shared__ float sdd[8][32], sbi[8][32], sds[8][32];
    ember_pdl_enter();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const ember_cu_mm_prod pr = ember_cu_pick_prod(a, (int)blockIdx.x);
    const int n = ((int)blockIdx.x - pr.first_block) * 8 + warp, N = pr.N, M = a.M, K = a.K;
    if (n >= N) return; /* (warp-level synchronisation only below) */
    const int nb = K / 32, per_g = G / 32;
    const size_t bb = 8 + (size_t)G * BITS / 8, row_bytes = (size_t)(K / G) * bb;
    const unsigned char *w = (const unsigned char *)pr.w, *act = (const unsigned char *)a.act;
    float *out = pr.out;
    const float *bias = pr.bias;
    const unsigned char *wr = w + (size_t)n * row_bytes;
    const int m0 = blockIdx.y * MLX_MT, m1 = M - m0 < MLX_MT ? M : m0 + MLX_MT;
    for (int m = m0; m < m1; m++) {
        const unsigned char *ar = act + (size_t)m * (size_t)nb * A32_BYTES;
        float acc = 0.0f; /* lane j < 16: acc[j]; lane 16: macc */
        for (int c0 = 0; c0 < nb; c0 += 32) {
            const int b = c0 + lane, nc = nb - c0 < 32 ? nb - c0 : 32;
            if (lane < nc) {
                const unsigned char *blk = wr + (size_t)(b / per_g) * bb;
                const unsigned int *sb = (const unsigned int *)(blk + 8 + (size_t)(b % per_g) * 4 * BITS);
                unsigned int cw[BITS];
#pragma unroll
                for (int i = 0; i < BITS; i++) cw[i] = __ldg(sb + i);
                const unsigned char *ab = ar + (size_t)b * A32_BYTES;
                unsigned int qw[8];
#pragma unroll
                for (int i = 0; i < 8; i++) qw[i] = __ldg((const unsigned int *)ab + i);
                const float d = __ldg((const float *)(ab + 32));
                const int s = __ldg((const int *)(ab + 36));
#pragma unroll
                for (int l = 0; l < 8; l++) { /* 4 codes by 4 levels, exact; 8-bit codes as code - 128, + 128 sum */
                    const unsigned int c4 = mlx_codes4<BITS>(cw, l);
                    sp[warp][lane][l] = BITS == 8 ? __dp4a((int)(c4 ^ 0x80808080u), (int)qw[l], 0) +
                                                        128 * __dp4a(0x01010101, (int)qw[l], 0)
                                                  : __dp4a((int)c4, (int)qw[l], 0);
                }
                sdd[warp][lane] = __fmul_rn(__ldg((const float *)blk), d);
                sbi[warp][lane] = __ldg((const float *)(blk + 4));
                sds[warp][lane] = __fmul_rn(d, (float)s);
            }
            __syncwarp();
            if (lane < 16) { /* c0 is even: block c0 + t has the parity of t */
                const int l = lane & 7;
                for (int t = lane >> 3; t < nc; t += 2) acc = __fmaf_rn(sdd[warp][t], (float)sp[warp][t][l], acc);
            } else if (lane == 16) {
                for (int t = 0; t < nc; t++) acc = __fmaf_rn(sbi[warp][t], sds[warp][t], acc);
            }
            __syncwarp();
        }
        float a[17];
#pragma unroll
        for (int j = 0; j < 17; j++) a[j] = __shfl_sync(0xffffffffu, acc, j);
        if (lane == 0) { /* cpu_tree16, then + macc */
            float s8[8], s4[4];
#pragma unroll
            for (int j = 0; j < 8; j++) s8[j] = __fadd_rn(a[j], a[j + 8]);
#pragma unroll
            for (int j = 0; j < 4; j++) s4[j] = __fadd_rn(s8[j], s8[j + 4]);
            float o = __fadd_rn(__fadd_rn(__fadd_rn(s4[0], s4[2]), __fadd_rn(s4[1], s4[3])), a[16]);
            if (bias) o = __fadd_rn(o, bias[n]);
            out[(size_t)m * (size_t)N + (size_t)n] = o;
        }
    }
}

/* d = a b: one mma.sync m16n8k16, u8 a (rows g and g + 8, k 4t .. 4t + 3),
   s8 b (k 4t .. 4t + 3 of column g), s32 out as mma_s8 (cuda_qmm.cu). Exact. */
static __device__ __forceinline__ void mma_u8s8_k16(int d[4], unsigned int a0, unsigned int a1, unsigned int b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
                 "{%7, %8, %9, %10};\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a0), "r"(a1), "r"(b), "r"(0), "r"(0), "r"(0), "r"(0));
}

/* One block (b, of parity PAR) of mlx_tc_k: the codes of rows r0 (w0) and r0
   + 8 (w1; NULL: past N) against the slice's A32T record rec; acc[h][p][4 PAR
   + q] is the chain of group 2e + (q & 1) + 4 (q >> 1) of row r0 + 8h and input
   row 2p + t / 2. */
template <int BITS, int PAR>
static __device__ __forceinline__ void mlx_tc_block(const unsigned char *w0, const unsigned char *w1, int b, int per_g,
                                                    size_t bb, const unsigned char *rec, int g, int t,
                                                    float acc[2][4][8], float macc[2][4]) {
    unsigned int c[2][BITS];
    float sc[2] = {0.0f, 0.0f}, bi[2] = {0.0f, 0.0f};
    const unsigned char *wr[2] = {w0, w1};
    const size_t sub = 8 + (size_t)(b % per_g) * 4 * BITS;
#pragma unroll
    for (int h = 0; h < 2; h++) {
#pragma unroll
        for (int i = 0; i < BITS; i++) c[h][i] = 0;
        if (wr[h]) {
            const unsigned char *blk = wr[h] + (size_t)(b / per_g) * bb;
#pragma unroll
            for (int i = 0; i < BITS; i++) c[h][i] = __ldg((const unsigned int *)(blk + sub) + i);
            sc[h] = __ldg((const float *)blk);
            bi[h] = __ldg((const float *)(blk + 4));
        }
    }
    const unsigned int a00 = mlx_codes4<BITS>(c[0], t), a01 = mlx_codes4<BITS>(c[1], t);         /* group t */
    const unsigned int a10 = mlx_codes4<BITS>(c[0], 4 + t), a11 = mlx_codes4<BITS>(c[1], 4 + t); /* group 4 + t */
    const bool mine = (g & 3) == t; /* this lane's B column g holds group t of its input row */
    const int e = t & 1;
#pragma unroll
    for (int p = 0; p < 4; p++) {
        uint2 y = make_uint2(0u, 0u);
        if (mine) y = __ldg((const uint2 *)(rec + 8 * (4 * (2 * p + (g >> 2)) + t)));
        int d0[4], d1[4];
        mma_u8s8_k16(d0, a00, a01, y.x);
        mma_u8s8_k16(d1, a10, a11, y.y);
        const float4 q = __ldg((const float4 *)(rec + 256 + 16 * p)); /* d, d, s, s of input rows 2p, 2p + 1 */
        const float yd = (t >> 1) ? q.y : q.x;
        const float yds = __fmul_rn(yd, (float)__float_as_int((t >> 1) ? q.w : q.z)); /* d s: the bias chain's */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float dd = __fmul_rn(sc[h], yd);
            acc[h][p][4 * PAR + 0] = __fmaf_rn(dd, (float)d0[2 * h], acc[h][p][4 * PAR + 0]);
            acc[h][p][4 * PAR + 1] = __fmaf_rn(dd, (float)d0[2 * h + 1], acc[h][p][4 * PAR + 1]);
            acc[h][p][4 * PAR + 2] = __fmaf_rn(dd, (float)d1[2 * h], acc[h][p][4 * PAR + 2]);
            acc[h][p][4 * PAR + 3] = __fmaf_rn(dd, (float)d1[2 * h + 1], acc[h][p][4 * PAR + 3]);
            if (e == 0) macc[h][p] = __fmaf_rn(bi[h], yds, macc[h][p]);
        }
    }
}

template <int BITS> static __global__ void __launch_bounds__(32) mlx_tc_k(const ember_cu_qmm a, int G, int slices) {
    ember_pdl_enter();
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3, s = blockIdx.x;
    const ember_cu_mm_prod pr = ember_cu_pick_prod(a, (int)blockIdx.y);
    const int r0 = ((int)blockIdx.y - pr.first_block) * 16 + g, N = pr.N, M = a.M, K = a.K;
    const int nb = K / 32, per_g = G / 32;
    const size_t bb = 8 + (size_t)G * BITS / 8, row_bytes = (size_t)(K / G) * bb;
    const unsigned char *w = (const unsigned char *)pr.w, *act = (const unsigned char *)a.act;
    float *out = pr.out;
    const float *bias = pr.bias;
    const unsigned char *w0 = r0 < N ? w + (size_t)r0 * row_bytes : NULL;
    const unsigned char *w1 = r0 + 8 < N ? w + (size_t)(r0 + 8) * row_bytes : NULL;
    float acc[2][4][8], macc[2][4];
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int p = 0; p < 4; p++) {
            macc[h][p] = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; j++) acc[h][p][j] = 0.0f;
        }
    for (int b = 0; b < nb; b += 2) {
        const unsigned char *rec = act + ((size_t)b * (size_t)slices + (size_t)s) * A32T_BYTES;
        mlx_tc_block<BITS, 0>(w0, w1, b, per_g, bb, rec, g, t, acc, macc);
        if (b + 1 < nb)
            mlx_tc_block<BITS, 1>(w0, w1, b + 1, per_g, bb, rec + (size_t)slices * A32T_BYTES, g, t, acc, macc);
    }
    /* lanes t and t ^ 1 hold the two halves of each output's 16 chains */
    const int e = t & 1;
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int p = 0; p < 4; p++) {
            float o8[8];
#pragma unroll
            for (int j = 0; j < 8; j++) o8[j] = __shfl_xor_sync(0xffffffffu, acc[h][p][j], 1);
            const int n = r0 + 8 * h, m = 8 * s + 2 * p + (t >> 1);
            if (e || n >= N || m >= M) continue;
            float a[16]; /* cpu order: a[8 par + l]; this lane has l = 0, 1, 4, 5, the other 2, 3, 6, 7 */
#pragma unroll
            for (int par = 0; par < 2; par++) {
                a[8 * par + 0] = acc[h][p][4 * par + 0];
                a[8 * par + 1] = acc[h][p][4 * par + 1];
                a[8 * par + 4] = acc[h][p][4 * par + 2];
                a[8 * par + 5] = acc[h][p][4 * par + 3];
                a[8 * par + 2] = o8[4 * par + 0];
                a[8 * par + 3] = o8[4 * par + 1];
                a[8 * par + 6] = o8[4 * par + 2];
                a[8 * par + 7] = o8[4 * par + 3];
            }
            float s8[8], s4[4];
#pragma unroll
            for (int j = 0; j < 8; j++) s8[j] = __fadd_rn(a[j], a[j + 8]);
#pragma unroll
            for (int j = 0; j < 4; j++) s4[j] = __fadd_rn(s8[j], s8[j + 4]);
            float o = __fadd_rn(__fadd_rn(__fadd_rn(s4[0], s4[2]), __fadd_rn(s4[1], s4[3])), macc[h][p]);
            if (bias) o = __fadd_rn(o, bias[n]);
            out[(size_t)m * (size_t)N + (size_t)n] = o;
        }
}

extern "C" {
int ember_cu_mlxtc = 1;
}

extern "C" int ember_cu_mlx_tc(int M) {
    return ember_cu_mlxtc && M >= 9;
}

extern "C" cudaError_t ember_cu_mlx_matmul(cudaStream_t stream, ember_cu_qmm *a, int bits, int G) {
    if (a->M < 1) return cudaSuccess;
    if (a->n < 1 || a->n > EMBER_CU_MAX_MM || a->K < 32 || a->K % G || (G != 32 && G != 64 && G != 128))
        return cudaErrorInvalidValue;
    const bool tc = ember_cu_mlx_tc(a->M);
    const int rows = tc ? 16 : 8; /* weight rows a block (mlx_mm_k) or a warp (mlx_tc_k) */
    long long blocks = 0;
    for (int i = 0; i < a->n; i++) {
        a->p[i].first_block = (int)blocks;
        blocks += (a->p[i].N + rows - 1) / rows;
    }
    if (blocks < 1) return cudaSuccess;
    if (tc) {
        const long long S = ((long long)a->M + 7) / 8;
        if (blocks > 65535 || S > 0x7fffffffLL) return cudaErrorInvalidValue;
        const dim3 grid((unsigned)S, (unsigned)blocks), blk(32);
        const int sl = (int)S;
        switch (bits) {
        case 2: return ember_launch(mlx_tc_k<2>, grid, blk, 0, stream, *a, G, sl);
        case 3: return ember_launch(mlx_tc_k<3>, grid, blk, 0, stream, *a, G, sl);
        case 4: return ember_launch(mlx_tc_k<4>, grid, blk, 0, stream, *a, G, sl);
        case 5: return ember_launch(mlx_tc_k<5>, grid, blk, 0, stream, *a, G, sl);
        case 6: return ember_launch(mlx_tc_k<6>, grid, blk, 0, stream, *a, G, sl);
        case 8: return ember_launch(mlx_tc_k<8>, grid, blk, 0, stream, *a, G, sl);
        default: return cudaErrorInvalidValue;
        }
    }
    const long long gy = ((long long)a->M + MLX_MT - 1) / MLX_MT;
    if (gy > 65535 || blocks > 0x7fffffffLL) return cudaErrorInvalidValue;
    const dim3 grid((unsigned)blocks, (unsigned)gy), blk(256);
    switch (bits) {
    case 2: return ember_launch(mlx_mm_k<2>, grid, blk, 0, stream, *a, G);
    case 3: return ember_launch(mlx_mm_k<3>, grid, blk, 0, stream, *a, G);
    case 4: return ember_launch(mlx_mm_k<4>, grid, blk, 0, stream, *a, G);
    case 5: return ember_launch(mlx_mm_k<5>, grid, blk, 0, stream, *a, G);
    case 6: return ember_launch(mlx_mm_k<6>, grid, blk, 0, stream, *a, G);
    case 8: return ember_launch(mlx_mm_k<8>, grid, blk, 0, stream, *a, G);
    default: return cudaErrorInvalidValue;
    }
}

/* Element e of the row at r: sc * code + bi, each rounded (cpu_mlx_dequant_row). */
template <int BITS> static __device__ float mlx_deq(const unsigned char *r, int G, int64_t e) {
    const unsigned char *blk = r + (size_t)(e / G) * (8 + (size_t)G * BITS / 8);
    const int k = (int)(e % G);
    const unsigned int *sb = (const unsigned int *)(blk + 8 + (size_t)(k / 32) * 4 * BITS);
    unsigned int cw[BITS];
#pragma unroll
    for (int i = 0; i < BITS; i++) cw[i] = sb[i];
    const float sc = *(const float *)blk, bi = *(const float *)(blk + 4);
    return __fadd_rn(__fmul_rn(sc, (float)mlx_code<BITS>(cw, k & 31)), bi);
}

template <int BITS>
static __global__ void __launch_bounds__(256)
    mlx_rows_k(float *dst, const unsigned char *src, int G, size_t row_bytes, const int32_t *ids, int64_t D) {
    ember_pdl_enter();
    const long long e = (long long)blockIdx.y * 256 + threadIdx.x;
    if (e >= D) return;
    dst[(size_t)blockIdx.x * (size_t)D + (size_t)e] = mlx_deq<BITS>(src + (size_t)ids[blockIdx.x] * row_bytes, G, e);
}

extern "C" cudaError_t ember_cu_mlx_get_rows(cudaStream_t stream, float *dst, const void *src, int bits, int G,
                                             size_t row_bytes, const int32_t *ids, int n, int64_t D) {
    if (n < 1 || D < 1) return cudaSuccess;
    const int64_t gy = (D + 255) / 256;
    if (gy > 65535 || D % G || (G != 32 && G != 64 && G != 128)) return cudaErrorInvalidValue;
    const dim3 grid((unsigned)n, (unsigned)gy), blk(256);
    const unsigned char *s = (const unsigned char *)src;
    switch (bits) {
    case 2: return ember_launch(mlx_rows_k<2>, grid, blk, 0, stream, dst, s, G, row_bytes, ids, D);
    case 3: return ember_launch(mlx_rows_k<3>, grid, blk, 0, stream, dst, s, G, row_bytes, ids, D);
    case 4: return ember_launch(mlx_rows_k<4>, grid, blk, 0, stream, dst, s, G, row_bytes, ids, D);
    case 5: return ember_launch(mlx_rows_k<5>, grid, blk, 0, stream, dst, s, G, row_bytes, ids, D);
    case 6: return ember_launch(mlx_rows_k<6>, grid, blk, 0, stream, dst, s, G, row_bytes, ids, D);
    case 8: return ember_launch(mlx_rows_k<8>, grid, blk, 0, stream, dst, s, G, row_bytes, ids, D);
    default: return cudaErrorInvalidValue;
    }
}
