/*
 * cuda_ops.cu - the row and elementwise ops of the CUDA backend: get_rows,
 * rms_norm, rope, swiglu, geglu, scale, softcap and add. Every output is f32.
 *
 * Each op's arithmetic is written as the CPU backend writes it
 * (cpu_backend.c), built without contraction of multiplies and adds
 * (--fmad=false), so results agree with the CPU to rounding of the library
 * functions (expf, cos, sin in double) and of the one reduction (rms_norm).
 *
 * Determinism: every output element is written by one thread; the only
 * reduction (the sum of squares of rms_norm) has an order fixed by the row
 * length D and the constant block size, never by the number of rows.
 *
 * Ownership and threads: the launchers run on the host thread that drives
 * the backend and only enqueue on its stream; the kernels touch device
 * memory owned by the backend's buffers and its argument area (ids,
 * positions, frequencies), which the host side filled before the launch
 * on the same stream.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_kernels.h"
#include "cuda_pdl.cuh"
#include "cuda_qact.cuh"

#define THREADS 256
#define NORM_THREADS 1024 /* rms_norm: the most threads per row */

static __device__ __forceinline__ float elem_f32(const void *src, size_t i, const int dt) {
    if (dt == EMBER_CU_F32) return ((const float *)src)[i];
    unsigned int h = ((const unsigned short *)src)[i];
    if (dt == EMBER_CU_BF16) return __uint_as_float(h << 16);
    return __half2float(__ushort_as_half((unsigned short)h));
}

/* ---- get_rows ------------------------------------------------------------------------ */

/* Block (i, y): row i of dst, columns y * THREADS + thread. */
static __global__ void __launch_bounds__(THREADS)
    get_rows_k(float *dst, const void *src, int dt, const int32_t *ids, int64_t D) {
    ember_pdl_enter();
    const int64_t d = (int64_t)blockIdx.y * THREADS + threadIdx.x;
    if (d >= D) return;
    const size_t row = (size_t)ids[blockIdx.x];
    dst[(size_t)blockIdx.x * (size_t)D + (size_t)d] = elem_f32(src, row * (size_t)D + (size_t)d, dt);
}

extern "C" cudaError_t ember_cu_get_rows(cudaStream_t stream, float *dst, const void *src, int dtype,
                                         const int32_t *ids, int n, int64_t D) {
    if (n < 1 || D < 1) return cudaSuccess;
    const int64_t gy = (D + THREADS - 1) / THREADS;
    if (gy > 65535 || dtype < 0 || dtype > 2) return cudaErrorInvalidValue;
    return ember_launch(get_rows_k, dim3((unsigned)n, (unsigned)gy, 1), dim3(THREADS), 0, stream, dst, src, dtype, ids,
                        D);
}

/* ---- rms_norm -------------------------------------------------------------------------- */

/* The block reduction of both norms: from each thread's partial sum of
   squares ss, the warp's 32 sums by the butterfly 16, 8, 4, 2, 1, then the
   blockDim.x / 32 warp sums in warp order; returns 1 / sqrt(sum / D + eps)
   to every thread. Every thread of the block must call it (a barrier). */
static __device__ __forceinline__ float norm_scale(float ss, int64_t D, float eps) {
    __shared__ float part[NORM_THREADS / 32];
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1) ss = ss + __shfl_xor_sync(0xffffffffu, ss, s);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
    __syncthreads();
    float tot = part[0];
    const int nw = (int)blockDim.x / 32;
#pragma unroll
    for (int i = 1; i < nw; i++) tot = tot + part[i];
    return 1.0f / sqrtf(tot / (float)D + eps);
}

/* One block of n = norm_threads(D) threads per row. The sum of squares:
   thread t sums x[i]^2 for i = t, t + n, ... (fused multiply-add, in i
   order), the warp's 32 sums by the butterfly 16, 8, 4, 2, 1, then the n /
   32 warp sums in warp order. n depends on the row length alone. */
static __global__ void __launch_bounds__(NORM_THREADS)
    rms_norm_k(float *dst, const float *x, const float *w, int64_t D, float eps, int plus_one, unsigned char *act32,
               unsigned char *act256) {
    ember_pdl_enter();
    const float *xr = x + (size_t)blockIdx.x * (size_t)D;
    float *yr = dst + (size_t)blockIdx.x * (size_t)D;
    float ss = 0.0f;
    const int n = (int)blockDim.x;
    for (int64_t i = threadIdx.x; i < D; i += n) ss = fmaf(xr[i], xr[i], ss);
    const float r = norm_scale(ss, D, eps);
    for (int64_t i = threadIdx.x; i < D; i += n) {
        const float wv = plus_one ? 1.0f + w[i] : w[i];
        const float y = wv * (xr[i] * r);
        yr[i] = y;
        if (act32) qact32_at(y, i, D, act32); /* a warp's i are one 32-element block (n, D multiples of 32) */
    }
    if (act256) { /* the quantized form for the product that reads dst (cuda_qact.cuh) */
        __syncthreads();
        qact_row(yr, (int)blockIdx.x, (int)D, nullptr, act256);
    }
}

/* Threads per row of D: 32 to 1024, about 4 elements each. */
static int norm_threads(int64_t D) {
    int n = 32;
    while (n < NORM_THREADS && (int64_t)n * 4 < D) n *= 2;
    return n;
}

extern "C" cudaError_t ember_cu_rms_norm(cudaStream_t stream, float *dst, const float *x, const float *w,
                                         int64_t rows, int64_t D, float eps, int plus_one, const ember_cu_qout *q) {
    if (rows < 1 || D < 1) return cudaSuccess;
    if (rows > 0x7fffffff || (q && (D > 0x7fffffff || (q->act32 && D % 32) || (q->act256 && D % 256))))
        return cudaErrorInvalidValue;
    return ember_launch(rms_norm_k, dim3((unsigned)rows), dim3((unsigned)norm_threads(D)), 0, stream, dst, x, w, D, eps,
                        plus_one, q ? (unsigned char *)q->act32 : nullptr, q ? (unsigned char *)q->act256 : nullptr);
}

/* add_rms_norm: x = x + h, then rms_norm as rms_norm_k (the same thread
   layout and sum order, so the bits of add then rms_norm). Each element is
   read and written by one thread in both loops, so dst may be h. Rows of
   at most NORM_HOLD elements per thread keep x and w in registers, so the
   weights load beside x and h instead of after the sum. */
#define NORM_HOLD 8
static __global__ void __launch_bounds__(NORM_THREADS)
    add_rms_norm_k(float *dst, float *x, const float *h, const float *w, int64_t D, float eps, int plus_one,
                   unsigned char *act32, unsigned char *act256) {
    ember_pdl_enter();
    float *xr = x + (size_t)blockIdx.x * (size_t)D;
    const float *hr = h + (size_t)blockIdx.x * (size_t)D;
    float *yr = dst + (size_t)blockIdx.x * (size_t)D;
    float ss = 0.0f;
    const int n = (int)blockDim.x;
    const bool hold = D <= (int64_t)NORM_HOLD * n;
    float xv[NORM_HOLD], wv[NORM_HOLD];
    if (hold) {
#pragma unroll
        for (int k = 0; k < NORM_HOLD; k++) {
            const int64_t i = threadIdx.x + (int64_t)k * n;
            if (i < D) {
                const float v = xr[i] + hr[i];
                wv[k] = w[i];
                xr[i] = v;
                xv[k] = v;
                ss = fmaf(v, v, ss);
            }
        }
    } else {
        for (int64_t i = threadIdx.x; i < D; i += n) {
            const float v = xr[i] + hr[i];
            xr[i] = v;
            ss = fmaf(v, v, ss);
        }
    }
    const float r = norm_scale(ss, D, eps);
    if (hold) {
#pragma unroll
        for (int k = 0; k < NORM_HOLD; k++) {
            const int64_t i = threadIdx.x + (int64_t)k * n;
            if (i < D) {
                const float y = (plus_one ? 1.0f + wv[k] : wv[k]) * (xv[k] * r);
                yr[i] = y;
                if (act32) qact32_at(y, i, D, act32);
            }
        }
    } else {
        for (int64_t i = threadIdx.x; i < D; i += n) {
            const float wq = plus_one ? 1.0f + w[i] : w[i];
            const float y = wq * (xr[i] * r);
            yr[i] = y;
            if (act32) qact32_at(y, i, D, act32);
        }
    }
    if (act256) { /* as rms_norm_k */
        __syncthreads();
        qact_row(yr, (int)blockIdx.x, (int)D, nullptr, act256);
    }
}

extern "C" cudaError_t ember_cu_add_rms_norm(cudaStream_t stream, float *dst, float *x, const float *h, const float *w,
                                             int64_t rows, int64_t D, float eps, int plus_one, const ember_cu_qout *q) {
    if (rows < 1 || D < 1) return cudaSuccess;
    if (rows > 0x7fffffff || (q && (D > 0x7fffffff || (q->act32 && D % 32) || (q->act256 && D % 256))))
        return cudaErrorInvalidValue;
    return ember_launch(add_rms_norm_k, dim3((unsigned)rows), dim3((unsigned)norm_threads(D)), 0, stream, dst, x, h, w,
                        D, eps, plus_one, q ? (unsigned char *)q->act32 : nullptr,
                        q ? (unsigned char *)q->act256 : nullptr);
}

/* ---- rope ------------------------------------------------------------------------------- */

/* One block per token t: first the cos / sin table of its position (in
   double, rounded to f32, times attn_factor, as the CPU does), then every
   (head, pair) rotated by one thread. */
static __global__ void __launch_bounds__(THREADS) rope_k(float *x, const int32_t *pos, const float *inv_freq,
                                                         int H, int D, int half, int interleaved, float af) {
    ember_pdl_enter();
    extern __shared__ float tab[]; /* cos [half], then sin [half] */
    const float p = (float)pos[blockIdx.x];
    for (int i = threadIdx.x; i < half; i += THREADS) {
        const float angle = p * inv_freq[i];
        double s, c;
        sincos((double)angle, &s, &c);
        tab[i] = (float)c * af;
        tab[half + i] = (float)s * af;
    }
    __syncthreads();
    float *xt = x + (size_t)blockIdx.x * (size_t)H * (size_t)D;
    for (int idx = threadIdx.x; idx < H * half; idx += THREADS) {
        const int h = idx / half, i = idx - h * half;
        float *v = xt + (size_t)h * (size_t)D;
        const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
        const float x0 = v[a], x1 = v[b], cs = tab[i], sn = tab[half + i];
        v[a] = x0 * cs - x1 * sn;
        v[b] = x1 * cs + x0 * sn;
    }
}

extern "C" cudaError_t ember_cu_rope(cudaStream_t stream, float *x, const int32_t *pos, const float *inv_freq,
                                     int T, int H, int D, int n_rot, int interleaved, float attn_factor) {
    if (T < 1 || H < 1) return cudaSuccess;
    const int half = n_rot / 2;
    if (half < 1 || (int64_t)H * half > 0x7fffffff) return cudaErrorInvalidValue;
    return ember_launch(rope_k, dim3((unsigned)T), dim3(THREADS), (size_t)half * 2 * sizeof(float), stream, x, pos,
                        inv_freq, H, D, half, interleaved, attn_factor);
}

/* ---- swiglu, add -------------------------------------------------------------------------- */

/* swiglu (kind 0) and geglu (kind 2) of gate g and up u: every kernel's arithmetic for them. */
static __device__ __forceinline__ float glu(int kind, float g, float u) {
    if (kind == 0) return (g / (1.0f + expf(-g))) * u;
    const float inner = 0.7978845608028654f * (g + 0.044715f * (g * g * g));
    return 0.5f * g * (1.0f + tanhf(inner)) * u;
}

static __global__ void __launch_bounds__(THREADS)
    elementwise_k(int kind, float *dst, const float *a, const float *b, float s, int64_t n) {
    ember_pdl_enter();
    const int64_t stride = (int64_t)gridDim.x * THREADS;
    for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < n; i += stride) {
        if (kind == 0 || kind == 2) {
            dst[i] = glu(kind, a[i], b[i]);
        } else if (kind == 1) {
            dst[i] = a[i] + b[i];
        } else if (kind == 3) {
            dst[i] = a[i] * s;
        } else if (kind == 4) {
            dst[i] = tanhf(a[i] / s) * s;
        } else {
            dst[i] = a[i] * (1.0f / (1.0f + expf(-b[i])));
        }
    }
}

extern "C" cudaError_t ember_cu_elementwise(cudaStream_t stream, int kind, float *dst, const float *a,
                                            const float *b, float s, int64_t n) {
    if (n < 1) return cudaSuccess;
    int64_t blocks = (n + THREADS - 1) / THREADS;
    if (blocks > 132 * 16) blocks = 132 * 16; /* a grid-stride loop past a few waves */
    return ember_launch(elementwise_k, dim3((unsigned)blocks), dim3(THREADS), 0, stream, kind, dst, a, b, s, n);
}

/* swiglu / geglu with the quantized form of the result (rows of K, a
   multiple of 32; of 256 for act256): block i computes elements
   [256 i, 256 i + 256) as elementwise_k does, then its warps quantize the
   32-element blocks of them (warp w the w-th), and warp 0 the 256-element
   block (cuda_qact.cuh). n is a multiple of the blocks quantized, so no
   block of either kind straddles two blocks of threads. */
static __global__ void __launch_bounds__(THREADS) glu_q_k(int kind, float *dst, const float *a, const float *b,
                                                          int64_t n, unsigned char *act32, unsigned char *act256) {
    ember_pdl_enter();
    __shared__ __align__(16) float ys[THREADS];
    const int64_t i0 = (int64_t)blockIdx.x * THREADS, i = i0 + threadIdx.x;
    float y = 0.0f;
    if (i < n) {
        y = glu(kind, a[i], b[i]);
        dst[i] = y;
    }
    ys[threadIdx.x] = y;
    __syncthreads();
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
    if (act32 && i0 + 32 * warp < n) qact32_store(ys[32 * warp + lane], act32 + (size_t)(i0 / 32 + warp) * A32_BYTES, lane);
    if (act256 && warp == 0 && i0 < n) {
        float v[8];
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = ys[8 * lane + e];
        qact256_store(v, act256 + (size_t)(i0 / 256) * A256_BYTES, lane);
    }
}

extern "C" cudaError_t ember_cu_glu_q(cudaStream_t stream, int kind, float *dst, const float *gate, const float *up,
                                      int64_t n, const ember_cu_qout *q) {
    if (n < 1) return cudaSuccess;
    static_assert(THREADS == 256, "one 256-element block per block of threads");
    if ((kind != 0 && kind != 2) || (q->act32 && n % 32) || (q->act256 && n % 256) || (n + THREADS - 1) / THREADS > 0x7fffffff)
        return cudaErrorInvalidValue;
    return ember_launch(glu_q_k, dim3((unsigned)((n + THREADS - 1) / THREADS)), dim3(THREADS), 0, stream, kind, dst, gate,
                        up, n, (unsigned char *)q->act32, (unsigned char *)q->act256);
}

/* ---- argmax (greedy sampling on the GPU) ------------------------------------------------ */

/* Is (v2, i2) before (v1, i1) in the order "larger value, then lower index",
   an index < 0 being no candidate? */
static __device__ __forceinline__ bool am_better(float v2, int i2, float v1, int i1) {
    return i2 >= 0 && (i1 < 0 || v2 > v1 || (v2 == v1 && i2 < i1));
}

/* Blocks (b, row): block b takes elements [b * AM_CHUNK, (b + 1) * AM_CHUNK)
   of the row, each thread AM_PER of them (coalesced), keeping the first
   maximum of its own in increasing index; the block's candidate goes to
   the scratch, and the row's last block to finish (a counter per row,
   zeroed again after) reduces the candidates to out[row] = the first index
   of the row's largest value, NaNs skipped, 0 when every value is NaN (the
   host's ember_argmax). The candidates are reduced by a total order, so
   the result does not depend on the reduction's shape or on which block
   is last. */
#define AM_THREADS 256
#define AM_PER 8
#define AM_CHUNK (AM_THREADS * AM_PER)

static __device__ __forceinline__ void am_reduce(float *bv, int *bi, float *sv, int *si) {
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, *bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, *bi, o);
        if (am_better(ov, oi, *bv, *bi)) {
            *bv = ov;
            *bi = oi;
        }
    }
    if (threadIdx.x % 32 == 0) {
        sv[threadIdx.x / 32] = *bv;
        si[threadIdx.x / 32] = *bi;
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < AM_THREADS / 32; w++)
            if (am_better(sv[w], si[w], *bv, *bi)) {
                *bv = sv[w];
                *bi = si[w];
            }
}

static __global__ void __launch_bounds__(AM_THREADS)
    argmax_k(int32_t *out, float *cv, int *ci, int *count, const float *x, int64_t V, int nb) {
    ember_pdl_enter();
    __shared__ float sv[AM_THREADS / 32];
    __shared__ int si[AM_THREADS / 32];
    __shared__ int last;
    const int row = blockIdx.y, b = blockIdx.x;
    const float *r = x + (size_t)row * (size_t)V;
    float v[AM_PER];
    const int64_t base = (int64_t)b * AM_CHUNK + threadIdx.x;
#pragma unroll
    for (int k = 0; k < AM_PER; k++) v[k] = base + k * AM_THREADS < V ? r[base + k * AM_THREADS] : NAN;
    float bv = 0.0f;
    int bi = -1;
#pragma unroll
    for (int k = 0; k < AM_PER; k++)
        if (!isnan(v[k]) && (bi < 0 || v[k] > bv)) {
            bv = v[k];
            bi = (int)(base + k * AM_THREADS);
        }
    am_reduce(&bv, &bi, sv, si);
    if (threadIdx.x == 0) {
        cv[(size_t)row * nb + b] = bv;
        ci[(size_t)row * nb + b] = bi;
        __threadfence(); /* the candidate is visible before the count says so */
        last = atomicAdd(&count[row], 1) == nb - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    bv = 0.0f;
    bi = -1;
    for (int j = threadIdx.x; j < nb; j += AM_THREADS) {
        const float ov = __ldcg(cv + (size_t)row * nb + j);
        const int oi = __ldcg(ci + (size_t)row * nb + j);
        if (am_better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
    __syncthreads(); /* sv, si free again */
    am_reduce(&bv, &bi, sv, si);
    if (threadIdx.x == 0) {
        out[row] = bi < 0 ? 0 : bi;
        count[row] = 0;
    }
}

extern "C" size_t ember_cu_argmax_cands(int rows, int64_t V) {
    return (size_t)rows * (size_t)((V + AM_CHUNK - 1) / AM_CHUNK);
}

extern "C" cudaError_t ember_cu_argmax(cudaStream_t stream, int32_t *out, int *count, void *cand, const float *x,
                                       int rows, int64_t V) {
    if (rows < 1 || V < 1) return cudaSuccess;
    if (V > 0x7fffffff || rows > 65535) return cudaErrorInvalidValue;
    const int nb = (int)((V + AM_CHUNK - 1) / AM_CHUNK);
    float *cv = (float *)cand;
    int *ci = (int *)(cv + (size_t)rows * nb);
    return ember_launch(argmax_k, dim3((unsigned)nb, (unsigned)rows), dim3(AM_THREADS), 0, stream, out, cv, ci, count,
                        x, V, nb);
}
