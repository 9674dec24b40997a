/*
 * cuda_wgmma.cu - the bf16 matrix products for many input rows on Hopper's
 * warpgroup tensor-core instruction (wgmma, sm_90a machine code only).
 *
 * Design note.
 *   What it computes: out = x w^T (+ bias) for bf16 weights w [N, K] and f32
 *   inputs x [M, K], in the tensor-core order of cuda_matmul.cu (its header
 *   says it element by element), so every output element gets the bits that
 *   tc / tc_cl give it: a row's result does not depend on M, on which kernel
 *   the launcher picked for that M, or on the other rows of the batch.
 *   Restated for this kernel:
 *     - x is split per element into hi = bf16(x) and lo = bf16(x - hi)
 *       (tc_split's arithmetic, the same rounding);
 *     - K is cut into k-blocks of 32; k-block b belongs to part b % 8; each
 *       part is one accumulator chain from +0 over its k-blocks in
 *       increasing b; in each k-block step 0 then step 1, each hi then lo,
 *       each one tensor-core product of k16 onto the same accumulator;
 *     - out = ((p0 + p1) + ... ) + p7, then + bias[n].
 *   The k16 products must see the same numbers in the same k slots as
 *   mma.m16n8k16 in tc: there, slots 2q, 2q + 1, 2q + 8, 2q + 9 of step s
 *   (q = 0 .. 3) hold elements 8q + 4s + 0, 1, 2, 3 of the k-block. Here
 *   the weights are wgmma's A operand from registers, whose fragment
 *   layout per warp is mma.m16n8k16's A layout: each lane loads the same
 *   16 bytes (8 weights of rows g and g + 8) that tc loads and hands the
 *   same four registers per step. The inputs are the B operand from shared
 *   memory: the block writes the split inputs there with slot s of step st
 *   holding the element tc puts in that slot, so the k slots match too.
 *   A wgmma m64nNk16 computes each output from its own row of A, column of
 *   B and accumulator, as an mma does. That its k16 step rounds exactly as
 *   mma.m16n8k16's does on the same slots is not written in the PTX ISA
 *   (which leaves the tensor cores' internal sum unspecified): it is
 *   measured, by test_cuda_ops (matmul_wg: rows against the row alone on
 *   tc, every kind, several K and M) and cuda_ops_bench (every shape
 *   against the cluster kernel). A GPU where it failed would need
 *   EMBER_CUDA_MM_WG=0.
 *   Why not the copy engine (TMA) and swizzled descriptors for both
 *   operands: tc's k slots permute a k-block's elements in pairs (4
 *   bytes), which no descriptor layout expresses; the weights would need a
 *   pass through registers anyway, so they are the register operand, and
 *   only the inputs, split in shared memory in any case, use a descriptor.
 *
 *   Tile: a block of WGS warpgroups (128 threads each) owns 64 WGS weight
 *   rows (64 per warpgroup: 16 per warp) by NI input rows (wgmma's N), for
 *   every M: M only sets how many input tiles there are. Accumulators in
 *   registers: NI / 2 floats for the running part and NI / 2 for the sum of
 *   the parts so far.
 *
 *   Walk and pipeline: the block walks the k-blocks part by part (part 0's
 *   k-blocks 0, 8, 16, ..., then part 1's, ...), one k-block per step.
 *   Every thread copies (cp.async, 16 bytes) pieces of the weights (64 WGS
 *   rows x 64 bytes) and of the f32 inputs (NI rows x 128 bytes, the 16-byte
 *   pieces of a row rotated by row % 8 so that the reads below miss bank
 *   conflicts) of step i + S - 1 into stage (i + S - 1) % S, S stages deep.
 *   Step i: wait for its copies and a barrier; each thread splits its
 *   (input row, step) pieces into hi / lo and writes them into B buffer
 *   i % 2 (the core-matrix layout of wgmma without swizzle: 8 rows x 16
 *   bytes per core matrix; the 4 k-chunks of 8 of a k-block lie NI x 16
 *   bytes apart, the 8-row groups 128 bytes apart), each lane reads its
 *   2 x 16 bytes of weights into registers, a proxy fence and a barrier;
 *   each warpgroup issues its four wgmma (step 0 hi, lo, step 1 hi, lo),
 *   every thread issues the copies of step i + S - 1, and each warpgroup
 *   waits for the group of step i - 1 only, so the tensor cores work on
 *   step i while the threads prepare step i + 1. At the end of a part: wait
 *   for all, then sum = part ? sum + acc : acc, acc = 0. Nothing in the walk
 *   depends on M or on the grid; rows past M read zeros, weight rows past N
 *   repeat row N - 1, neither is stored.
 *
 *   Buffer reuse: stage (i - 1) % S is refilled in step i after its first
 *   barrier (its reads, in step i - 1, are before it); B buffer i % 2 was
 *   read by the wgmma group of step i - 2, which every warp waited for
 *   (wait_group 1 in step i - 1) before that barrier. The weight registers
 *   of a group are read by the tensor cores until that group is waited for:
 *   steps alternate between two register sets, and each step keeps the
 *   other set (the step before's) live until its own wait_group 1 has seen
 *   that group finish, so the compiler cannot give those registers to
 *   anything else meanwhile (without that, run 1 of bench/RESULTS.md's
 *   section: garbage in the 128-row kinds, where a group runs longest).
 *
 * Kinds (k_wg): {WGS, NI, S} = {2, 128, 5}, {1, 64, 6}, {1, 128, 4},
 * {2, 64, 6}, {3, 128, 4}; every kind gives the same bits. One block of
 * the 128-row kinds fills a multiprocessor (shared memory), so a grid whose
 * last wave is far from full leaves the GPU idle: the launcher's pick
 * (ember_cu_mm_wg) is the first of kinds 4 and 0 whose grid fills at
 * least 85% of its waves, else it declines and cuda_matmul.cu's kernels
 * run the product (the same bits). The launcher of cuda_matmul.cu asks it
 * from M >= ember_cu_mm_wg_min (128; EMBER_CUDA_MM_WG, 0: never), K % 8 ==
 * 0 and 16-byte aligned tensors, and only on a GPU of compute capability
 * 9.0 (ember_cu_mm_wg_prepare finds out once per backend).
 *
 * Ownership and threads: the launcher runs on the backend's host thread and
 * only enqueues; the kernel reads x, w, bias and writes out (device memory
 * of the backend's buffers); each output element is written by one lane.
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "cuda_kernels.h"
#include "cuda_mm.cuh"
#include "cuda_pdl.cuh"

#define WG_KB 32 /* elements of a k-block (TC_KB) */
#define WG_P 8   /* parts (TC_P) */

extern "C" {
int ember_cu_mm_wg_min = 128;
int ember_cu_mm_wg_kind = -1;
}
static int g_wg_ok = -1; /* -1: not asked yet, 0: no sm_90a kernel for this GPU, 1: ready */
static int g_wg_sms = 132; /* multiprocessors of the device (ember_cu_mm_wg_prepare) */

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_HAVE 1
#else
#define WG_HAVE 0
#endif

/* The k-block of step i of the part-by-part walk over KB k-blocks: parts
   0 .. r - 1 (r = KB % 8) have KB / 8 + 1 k-blocks, the rest KB / 8. */
static __device__ __forceinline__ int wg_kblock(int i, int KB) {
    const int q = KB / WG_P, r = KB % WG_P;
    if (i < r * (q + 1)) return i / (q + 1) + WG_P * (i % (q + 1));
    i -= r * (q + 1);
    return r + i / q + WG_P * (i % q);
}

/* 16 bytes global -> shared (cp.async), or 16 zeros when !full. */
static __device__ __forceinline__ void wg_cp16(unsigned int dst, const void *src, bool full) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(full ? 16 : 0) : "memory");
}
static __device__ __forceinline__ void wg_commit(void) {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> static __device__ __forceinline__ void wg_cpwait(void) {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

#if WG_HAVE
static __device__ __forceinline__ void wg_fence(void) {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
static __device__ __forceinline__ void wg_commit_mma(void) {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N> static __device__ __forceinline__ void wg_wait_mma(void) {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
/* Keeps the compiler from moving accesses of v across this point. */
static __device__ __forceinline__ void wg_pin(float &v) {
    asm volatile("" : "+f"(v)::"memory");
}

/* The shared-memory descriptor of a K-major B operand without swizzle:
   core matrices of 8 rows x 16 bytes, lbo bytes apart along K, 128 bytes
   apart along N. */
static __device__ __forceinline__ uint64_t wg_desc(unsigned int addr, unsigned int lbo) {
    return (uint64_t)((addr >> 4) & 0x3fffu) | (uint64_t)((lbo >> 4) & 0x3fffu) << 16 |
           (uint64_t)((128u >> 4) & 0x3fffu) << 32;
}

/* d[0 .. 32) += a b: one m64n64k16 (wgmma), A (16 weight rows per warp) from registers, B (64 input
   rows) from shared memory through desc; bf16 in, f32 accumulate. */
static __device__ __forceinline__ void wg_mma64(float *d, const unsigned int a[4], uint64_t desc) {
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "setp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n"
                 "}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(1));
}

/* d[0 .. 64) += a b: one m64n128k16 (wgmma), A (16 weight rows per warp) from registers, B (128 input
   rows) from shared memory through desc; bf16 in, f32 accumulate. */
static __device__ __forceinline__ void wg_mma128(float *d, const unsigned int a[4], uint64_t desc) {
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "setp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n"
                 "}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(1));
}

#endif

/* hi / lo of the pair (f0, f1), lower k in the low half: tc_split's arithmetic. */
static __device__ __forceinline__ void wg_split2(float f0, float f1, unsigned int &hi, unsigned int &lo) {
    __nv_bfloat162 h = __floats2bfloat162_rn(f0, f1);
    float2 hf = __bfloat1622float2(h);
    __nv_bfloat162 l = __floats2bfloat162_rn(f0 - hf.x, f1 - hf.y);
    hi = *(const unsigned int *)&h;
    lo = *(const unsigned int *)&l;
}

/* Shared-memory layout of a block (bytes from the 128-aligned base). */
template <int WGS, int NI, int S> struct wg_lay {
    static constexpr int THREADS = 128 * WGS;
    static constexpr int ROWS = 64 * WGS;          /* weight rows of a block */
    static constexpr int A_BYTES = ROWS * 64;      /* a k-block of weights: row r at 64 r */
    static constexpr int X_BYTES = NI * 128;       /* a k-block of f32 inputs: row r at 128 r, pieces rotated */
    static constexpr int STAGE = A_BYTES + X_BYTES;
    static constexpr int B_HALF = NI * 64;         /* hi (or lo): 4 k-chunks x NI rows x 16 bytes */
    static constexpr int B_BYTES = 2 * B_HALF;
    static constexpr int SMEM = S * STAGE + 2 * B_BYTES;
    static constexpr int ALLOC = SMEM + 128;       /* slack to align the base */
};

template <int WGS, int NI, int S>
static __global__ void __launch_bounds__(128 * WGS, 1) wg_k(const ember_cu_mm a) {
#if WG_HAVE
    typedef wg_lay<WGS, NI, S> L;
    extern __shared__ unsigned char wg_raw[];
    const unsigned int base = ((unsigned int)__cvta_generic_to_shared(wg_raw) + 127u) & ~127u;
    unsigned char *const gbase = wg_raw + (base - (unsigned int)__cvta_generic_to_shared(wg_raw));
    ember_pdl_enter();
    const ember_cu_mm_prod p = ember_cu_pick_prod(a, (int)blockIdx.x);
    const int tid = (int)threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
    const int n0 = ((int)blockIdx.x - p.first_block) * L::ROWS, m0 = (int)blockIdx.y * NI;
    const int K = a.K, M = a.M, N = p.N, KB = (K + WG_KB - 1) / WG_KB;
    const unsigned short *const w = (const unsigned short *)p.w;
    const unsigned int bbuf = base + S * L::STAGE;

    /* the copies of step i into stage i % S (an empty group past the walk) */
    auto load = [&](int i) {
        if (i < KB) {
            const unsigned int st = base + (i % S) * L::STAGE;
            const int k0 = wg_kblock(i, KB) * WG_KB;
#pragma unroll
            for (int c = tid; c < L::ROWS * 4; c += L::THREADS) {
                const int r = c / 4, k = k0 + 8 * (c % 4);
                const unsigned short *row = w + (size_t)min(n0 + r, N - 1) * (size_t)K;
                wg_cp16(st + c * 16, k < K ? row + k : row, k < K);
            }
#pragma unroll
            for (int c = tid; c < NI * 8; c += L::THREADS) {
                const int r = c / 8, pc = c % 8, k = k0 + 4 * pc, m = m0 + r;
                const bool ok = m < M && k < K;
                wg_cp16(st + L::A_BYTES + r * 128 + ((pc ^ (r & 7)) * 16),
                        ok ? a.x + (size_t)m * (size_t)K + k : a.x, ok);
            }
        }
        wg_commit();
    };

    float acc[NI / 2], sum[NI / 2];
#pragma unroll
    for (int j = 0; j < NI / 2; j++) sum[j] = 0.0f;
#pragma unroll
    for (int i = 0; i < S - 1; i++) load(i);
    const int arow = (warp / 4) * 64 + (warp % 4) * 16 + g; /* this lane's weight rows: arow, arow + 8 */
    /* One step of the walk with the weight fragments in ac; ap holds those of the step before,
       whose wgmma group may still be reading them (wgmma reads its A registers asynchronously):
       they stay live, untouched, until the wait below has seen that group finish. */
    auto step = [&](int it, unsigned int (&ac)[8], unsigned int (&ap)[8]) {
        wg_cpwait<S - 2>();
        __syncthreads();
        const unsigned char *st = gbase + (it % S) * L::STAGE;
        const unsigned int bb = bbuf + (it & 1) * L::B_BYTES;
        unsigned char *const bg = gbase + S * L::STAGE + (it & 1) * L::B_BYTES;
        /* split: unit (input row r, step s): elements 8 q' + 4 s + 0 .. 3 (q' = 0 .. 3) */
#pragma unroll
        for (int u = tid; u < 2 * NI; u += L::THREADS) {
            const int r = u % NI, s = u / NI;
            unsigned int h0[4], l0[4], h1[4], l1[4];
#pragma unroll
            for (int qq = 0; qq < 4; qq++) {
                const float4 v = *(const float4 *)(st + L::A_BYTES + r * 128 + (((2 * qq + s) ^ (r & 7)) * 16));
                wg_split2(v.x, v.y, h0[qq], l0[qq]); /* slots 2 qq, 2 qq + 1 */
                wg_split2(v.z, v.w, h1[qq], l1[qq]); /* slots 2 qq + 8, 2 qq + 9 */
            }
            const int o = (r / 8) * 128 + (r % 8) * 16; /* k-chunk 2 s then 2 s + 1 */
            *(uint4 *)(bg + (2 * s) * NI * 16 + o) = make_uint4(h0[0], h0[1], h0[2], h0[3]);
            *(uint4 *)(bg + (2 * s + 1) * NI * 16 + o) = make_uint4(h1[0], h1[1], h1[2], h1[3]);
            *(uint4 *)(bg + L::B_HALF + (2 * s) * NI * 16 + o) = make_uint4(l0[0], l0[1], l0[2], l0[3]);
            *(uint4 *)(bg + L::B_HALF + (2 * s + 1) * NI * 16 + o) = make_uint4(l1[0], l1[1], l1[2], l1[3]);
        }
        const uint4 r0 = *(const uint4 *)(st + arow * 64 + q * 16);
        const uint4 r8 = *(const uint4 *)(st + (arow + 8) * 64 + q * 16);
        ac[0] = r0.x, ac[1] = r8.x, ac[2] = r0.y, ac[3] = r8.y; /* step 0: elements 8q + 0 .. 3 */
        ac[4] = r0.z, ac[5] = r8.z, ac[6] = r0.w, ac[7] = r8.w; /* step 1: elements 8q + 4 .. 7 */
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
#pragma unroll
        for (int jj = 0; jj < NI / 2; jj++) wg_pin(acc[jj]);
        wg_fence();
        if (NI == 128) {
            wg_mma128(acc, ac, wg_desc(bb, NI * 16));
            wg_mma128(acc, ac, wg_desc(bb + L::B_HALF, NI * 16));
            wg_mma128(acc, ac + 4, wg_desc(bb + 2 * NI * 16, NI * 16));
            wg_mma128(acc, ac + 4, wg_desc(bb + L::B_HALF + 2 * NI * 16, NI * 16));
        } else {
            wg_mma64(acc, ac, wg_desc(bb, NI * 16));
            wg_mma64(acc, ac, wg_desc(bb + L::B_HALF, NI * 16));
            wg_mma64(acc, ac + 4, wg_desc(bb + 2 * NI * 16, NI * 16));
            wg_mma64(acc, ac + 4, wg_desc(bb + L::B_HALF + 2 * NI * 16, NI * 16));
        }
        wg_commit_mma();
        /* stage (it - 1) % S: its reads (step it - 1) are before this step's first barrier */
        load(it + S - 1);
        wg_wait_mma<1>();
        asm volatile("" ::"r"(ap[0]), "r"(ap[1]), "r"(ap[2]), "r"(ap[3]), "r"(ap[4]), "r"(ap[5]), "r"(ap[6]),
                     "r"(ap[7])
                     : "memory");
#pragma unroll
        for (int jj = 0; jj < NI / 2; jj++) wg_pin(acc[jj]);
    };
    unsigned int fx[8] = {0, 0, 0, 0, 0, 0, 0, 0}, fy[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int it = 0;
#pragma unroll 1
    for (int part = 0; part < WG_P; part++) {
        const int np = part < KB ? (KB - part + WG_P - 1) / WG_P : 0;
#pragma unroll
        for (int j = 0; j < NI / 2; j++) acc[j] = 0.0f;
        /* two steps per turn, the fragments alternating between fx and fy */
#pragma unroll 1
        for (int j = 0; j < np; j += 2) {
            step(it++, fx, fy);
            if (j + 1 < np) step(it++, fy, fx);
        }
        wg_wait_mma<0>();
#pragma unroll
        for (int jj = 0; jj < NI / 2; jj++) {
            wg_pin(acc[jj]);
            sum[jj] = part ? sum[jj] + acc[jj] : acc[jj];
        }
    }
    wg_cpwait<0>();
    /* accumulator j = 4 t + e: weight row arow (+ 8 for e >= 2), input row 8 t + 2 q + (e & 1) */
#pragma unroll
    for (int jj = 0; jj < NI / 2; jj++) {
        const int n = n0 + arow + ((jj & 2) ? 8 : 0), m = m0 + 8 * (jj / 4) + 2 * q + (jj & 1);
        if (m < M && n < N) p.out[(size_t)m * (size_t)N + (size_t)n] = p.bias ? sum[jj] + p.bias[n] : sum[jj];
    }
#else
    (void)a;
#endif
}

typedef struct wg_kind {
    void (*k)(const ember_cu_mm);
    int WGS, NI, S, smem;
} wg_kind;

#define WG_KIND(W, N, S) {wg_k<W, N, S>, W, N, S, wg_lay<W, N, S>::ALLOC}
static const wg_kind k_wg[] = {WG_KIND(2, 128, 5), WG_KIND(1, 64, 6), WG_KIND(1, 128, 4), WG_KIND(2, 64, 6),
                               WG_KIND(3, 128, 4)};
#define N_WG ((int)(sizeof k_wg / sizeof k_wg[0]))

extern "C" int ember_cu_mm_wg_kinds(int kind, int shape[3]) {
    if (kind < 0 || kind >= N_WG) return 0;
    shape[0] = k_wg[kind].WGS;
    shape[1] = k_wg[kind].NI;
    shape[2] = k_wg[kind].S;
    return 1;
}

extern "C" cudaError_t ember_cu_mm_wg_prepare(void) {
    g_wg_ok = 0;
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev)) {
        cudaGetLastError();
        return cudaSuccess;
    }
    if (major != 9 || minor != 0) return cudaSuccess; /* sm_90a machine code runs on 9.0 alone */
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && sms > 0) g_wg_sms = sms;
    cudaGetLastError();
    for (int i = 0; i < N_WG; i++) {
        cudaError_t e = cudaFuncSetAttribute((const void *)k_wg[i].k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             k_wg[i].smem);
        if (e != cudaSuccess) { /* no image for this GPU, or too little shared memory: the other kernels */
            cudaGetLastError();
            return cudaSuccess;
        }
    }
    g_wg_ok = 1;
    return cudaSuccess;
}

extern "C" int ember_cu_mm_wg_ready(void) {
    return g_wg_ok == 1;
}

extern "C" cudaError_t ember_cu_mm_wg(cudaStream_t stream, ember_cu_mm *a) {
    if (g_wg_ok != 1) return cudaErrorNotSupported;
    /* One block per multiprocessor: a last wave less than full leaves that share of the GPU idle
       for a whole block's time, and the cluster kernels' smaller blocks then do better (measured,
       docs/cuda.md). The launcher's pick: the first of kinds 4 (192 x 128) and 0 (128 x 128) whose
       grid fills at least 85% of its waves; neither: declined, the other kernels (the same bits). */
    const bool forced = ember_cu_mm_wg_kind >= 0 && ember_cu_mm_wg_kind < N_WG;
    static const int pick[2] = {4, 0};
    const wg_kind *kd = NULL;
    int grid_y = 0, rows = 0, blocks = 0;
    for (int c = 0; c < (forced ? 1 : 2) && !kd; c++) {
        const wg_kind *t = &k_wg[forced ? ember_cu_mm_wg_kind : pick[c]];
        const int gy = (a->M + t->NI - 1) / t->NI, r = 64 * t->WGS;
        int nb = 0;
        for (int i = 0; i < a->n; i++) nb += (a->p[i].N + r - 1) / r;
        const double cells = (double)nb * gy, waves = ceil(cells / g_wg_sms);
        if (forced || cells >= 0.85 * waves * g_wg_sms) kd = t, grid_y = gy, rows = r, blocks = nb;
    }
    if (!kd) return cudaErrorNotSupported;
    if (grid_y > 65535) return cudaErrorInvalidConfiguration;
    if (blocks < 1) return cudaSuccess;
    blocks = 0;
    for (int i = 0; i < a->n; i++) {
        a->p[i].first_block = blocks;
        blocks += (a->p[i].N + rows - 1) / rows;
    }
    void *args[] = {a};
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute at;
    ember_pdl_config(&cfg, &at, dim3((unsigned)blocks, (unsigned)grid_y, 1), dim3((unsigned)(128 * kd->WGS), 1, 1),
                     (size_t)kd->smem, stream);
    cudaError_t e = cudaLaunchKernelExC(&cfg, (const void *)kd->k, args);
    return e != cudaSuccess ? e : cudaGetLastError();
}
