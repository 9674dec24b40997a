/*
 * cuda_pdl.cuh - programmatic dependent launch for the backend's kernels
 * (CUDA sources only).
 *
 * Every kernel launched through ember_launch may start while the kernel
 * before it on the stream is still running: its blocks get resident and
 * wait at ember_pdl_enter, before any memory access of such a kernel,
 * until that kernel has finished and its writes are visible (PTX
 * griddepcontrol.wait), so no kernel reads or writes memory before its
 * predecessor is done and results cannot change. One exception: a
 * product whose weights nothing queued writes (ember_cu_mm.early /
 * ember_cu_qmm.early, set for weights the model prepared: tc_body, tc_cl_k,
 * qmv4_k) puts its first weight loads in flight before the wait; they read
 * memory no kernel writes. What is saved is the
 * launch latency between dependent kernels (a decode step is hundreds of
 * small launches). ember_pdl_enter then allows the next kernel to launch
 * (griddepcontrol.launch_dependents), so at most one kernel waits ahead.
 * A kernel launched without the attribute (or on a GPU without it) passes
 * both instructions at once.
 *
 * ember_cu_pdl (0 or 1, default 1) switches the attribute for the whole
 * process; the backend sets it from EMBER_CUDA_PDL at creation (a
 * measuring aid: EMBER_CUDA_PDL=0 gives plain launches).
 */
#ifndef EMBER_CUDA_PDL_CUH
#define EMBER_CUDA_PDL_CUH

#include <cuda_runtime.h>

#include <utility>

#include "cuda_kernels.h"

/* Waits for the previous kernel of the stream, then lets the next one launch. */
static __device__ __forceinline__ void ember_pdl_enter(void) {
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

/* The launch attribute, or none when ember_cu_pdl is 0. */
static inline void ember_pdl_config(cudaLaunchConfig_t *cfg, cudaLaunchAttribute *at, dim3 grid, dim3 block,
                                    size_t smem, cudaStream_t stream) {
    at->id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at->val.programmaticStreamSerializationAllowed = 1;
    *cfg = cudaLaunchConfig_t{};
    cfg->gridDim = grid;
    cfg->blockDim = block;
    cfg->dynamicSmemBytes = smem;
    cfg->stream = stream;
    cfg->attrs = at;
    cfg->numAttrs = ember_cu_pdl ? 1 : 0;
}

/* kernel<<<grid, block, smem, stream>>>(args...) with the attribute;
   returns the launch's error. */
template <typename... K, typename... A>
static cudaError_t ember_launch(void (*kernel)(K...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                A &&...args) {
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute at;
    ember_pdl_config(&cfg, &at, grid, block, smem, stream);
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
}

#endif
