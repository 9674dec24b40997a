/*
 * cuda_mm.cuh - device helpers shared by the matrix-product kernels of
 * cuda_matmul.cu, cuda_wgmma.cu and cuda_qmm.cu (CUDA sources only;
 * internal to the backend).
 *
 * A matmul launch (ember_cu_mm, cuda_kernels.h) carries up to
 * EMBER_CU_MAX_MM products sharing one input, their blocks laid out
 * product after product in the grid; ember_cu_pick_prod finds the product
 * of a block. One definition, so the files cannot drift apart; likewise
 * the cp.async group helpers.
 */
#ifndef EMBER_CUDA_MM_CUH
#define EMBER_CUDA_MM_CUH

#include "cuda_kernels.h"

/* The product that block `blk` works on (the last product whose
   first_block is at most blk); copied field by field with constant indices
   so the parameter struct stays in parameter space. A: ember_cu_mm or
   ember_cu_qmm (cuda_qmm.cu). */
template <typename A> static __device__ __forceinline__ ember_cu_mm_prod ember_cu_pick_prod(const A &a, int blk) {
    ember_cu_mm_prod p = a.p[0];
#pragma unroll
    for (int i = 1; i < EMBER_CU_MAX_MM; i++)
        if (i < a.n && blk >= a.p[i].first_block) p = a.p[i];
    return p;
}

/* cp.async (sm_80 on): 16 bytes from global src to shared dst, both
   16-byte aligned, queued in the thread's current group; commit closes the
   group; wait<N> returns once at most N of the thread's groups are pending
   (the copies of the others are then in shared memory, visible to other
   threads after a barrier). */
static __device__ __forceinline__ void ember_cp16(void *dst, const void *src) {
    const unsigned int d = (unsigned int)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}

static __device__ __forceinline__ void ember_cp_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N> static __device__ __forceinline__ void ember_cp_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#endif
