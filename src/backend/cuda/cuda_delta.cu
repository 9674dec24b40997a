/*
 * cuda_delta.cu - the gated DeltaNet ops of the CUDA backend (backend.h:
 * delta_net, delta_replay) and the MoE combine (add_rows_scaled).
 *
 * delta_net runs three kernels, as the CPU does (cpu_delta.c):
 *   token_k   one block per token: the causal convolution over the row's
 *             inputs (the state's K - 1, then the batch's), silu, the l2
 *             norms of the q and k heads (q scaled), g and beta; the log of
 *             a row in a speculative round;
 *   head_k    one block per (row, value head), a thread per column j of S:
 *             the row's tokens in order, the recurrent form of the rule
 *             (S[:, j] is column j's alone, so every sum runs over i = 0 ..
 *             Dk - 1 in order in one thread);
 *   conv_k    one block per row: the last K - 1 inputs into the new slot.
 * The GPU runs the recurrent form for every token (the chunked form of
 * the CPU's prefill is not ported yet): results agree with the CPU within
 * rounding, and a row's result never depends on the rest of the batch or
 * on how its prompt is chunked.
 *
 * Ownership: device memory of the caller (the backend's buffers, the state
 * pool, the logs, the argument area); the launchers only enqueue.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_kernels.h"

#define THREADS 256

static __device__ __forceinline__ float silu_f(float x) {
    return x / (1.0f + expf(-x));
}

static __device__ __forceinline__ float softplus_f(float x) {
    return x > 20.0f ? x : log1pf(expf(x));
}

/* Input m of row ri's tokens (m < 0: the state's convolution inputs). */
static __device__ __forceinline__ const float *conv_in(const ember_cu_delta *a, const ember_cu_delta_row *ri, int m,
                                                       const float *cstate) {
    if (m >= 0) return a->x + (size_t)a->tok[ri->start + m] * (size_t)a->C;
    return cstate ? cstate + (size_t)(a->K - 1 + m) * (size_t)a->C : nullptr;
}

static __global__ void __launch_bounds__(THREADS) token_k(ember_cu_delta a) {
    const int t = blockIdx.x;
    const int C = a.C, K = a.K, Hk = a.Hk, Hv = a.Hv, Dk = a.Dk, Dv = a.Dv;
    const ember_cu_delta_row *ri = &a.rows[a.tok_row[t]];
    const float *cstate = ri->src < 0 ? nullptr : a.slots + (size_t)ri->src * a.slot_floats + a.off;
    float *y = a.y + (size_t)t * C;
    const int m0 = a.tok_j[t] - (K - 1);
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = 0.0f;
        for (int i = 0; i < K; i++) {
            const float *in = conv_in(&a, ri, m0 + i, cstate);
            acc = acc + a.conv_w[(size_t)c * K + i] * (in ? in[c] : 0.0f);
        }
        y[c] = silu_f(acc);
    }
    __syncthreads();
    /* l2 norms: one thread per q or k head, in element order */
    for (int h = threadIdx.x; h < 2 * Hk; h += blockDim.x) {
        float *v = y + (size_t)h * Dk;
        float ss = 0.0f;
        for (int i = 0; i < Dk; i++) ss = ss + v[i] * v[i];
        const float r = 1.0f / sqrtf(ss + 1e-6f);
        for (int i = 0; i < Dk; i++) v[i] = v[i] * r;
        if (h < Hk)
            for (int i = 0; i < Dk; i++) v[i] = v[i] * a.qscale;
    }
    for (int h = threadIdx.x; h < Hv; h += blockDim.x) {
        const float bt = a.b[(size_t)t * Hv + h], at = a.a[(size_t)t * Hv + h];
        a.gb[(size_t)t * 2 * Hv + h] = (a.a_neg ? a.a_neg[h] : -expf(a.a_log[h])) * softplus_f(at + a.dt_bias[h]);
        a.gb[(size_t)t * 2 * Hv + Hv + h] = 1.0f / (1.0f + expf(-bt));
    }
    if (!ri->log) return;
    __syncthreads();
    float *e = ri->log + (size_t)(a.pos[t] - ri->log_base) * a.log_stride + a.log_off;
    const size_t kv_n = (size_t)Hk * Dk + (size_t)Hv * Dv;
    for (int c = threadIdx.x; c < C; c += blockDim.x) e[c] = a.x[(size_t)t * C + c];
    for (size_t i = threadIdx.x; i < kv_n; i += blockDim.x) e[C + i] = y[(size_t)Hk * Dk + i];
    for (int i = threadIdx.x; i < 2 * Hv; i += blockDim.x) e[C + kv_n + i] = a.gb[(size_t)t * 2 * Hv + i];
}

/* One recurrent step of column j: S[:, j] of a head (stride Dv). */
static __device__ __forceinline__ float step_col(float *S, int Dk, int Dv, int j, const float *q, const float *k,
                                                 float v, float g, float beta) {
    const float decay = expf(g);
    float mem = 0.0f;
    for (int i = 0; i < Dk; i++) {
        float s = S[(size_t)i * Dv + j] * decay;
        S[(size_t)i * Dv + j] = s;
        mem = mem + s * k[i];
    }
    const float u = (v - mem) * beta;
    float o = 0.0f;
    for (int i = 0; i < Dk; i++) {
        float s = S[(size_t)i * Dv + j] + k[i] * u;
        S[(size_t)i * Dv + j] = s;
        if (q) o = o + s * q[i];
    }
    return o;
}

static __global__ void head_k(ember_cu_delta a) {
    const int Hv = a.Hv, Hk = a.Hk, Dk = a.Dk, Dv = a.Dv, C = a.C, K = a.K;
    const int h = blockIdx.x % Hv, kh = a.v_tiled ? h % Hk : h / (Hv / Hk);
    const ember_cu_delta_row *ri = &a.rows[blockIdx.x / Hv];
    const size_t conv_f = (size_t)(K - 1) * C, head_f = (size_t)Dk * Dv;
    float *S = a.slots + (size_t)ri->dst * a.slot_floats + a.off + conv_f + (size_t)h * head_f;
    const float *S0 = ri->src < 0 ? nullptr : a.slots + (size_t)ri->src * a.slot_floats + a.off + conv_f + (size_t)h * head_f;
    for (int j = threadIdx.x; j < Dv; j += blockDim.x) {
        for (int i = 0; i < Dk; i++) S[(size_t)i * Dv + j] = S0 ? S0[(size_t)i * Dv + j] : 0.0f;
        for (int m = 0; m < ri->n; m++) {
            const int t = a.tok[ri->start + m];
            const float *y = a.y + (size_t)t * C;
            const float o = step_col(S, Dk, Dv, j, y + (size_t)kh * Dk, y + (size_t)Hk * Dk + (size_t)kh * Dk,
                                     y[2 * (size_t)Hk * Dk + (size_t)h * Dv + j], a.gb[(size_t)t * 2 * Hv + h],
                                     a.gb[(size_t)t * 2 * Hv + Hv + h]);
            a.out[(size_t)t * Hv * Dv + (size_t)h * Dv + j] = o;
        }
    }
}

static __global__ void __launch_bounds__(THREADS) conv_k(ember_cu_delta a) {
    const ember_cu_delta_row *ri = &a.rows[blockIdx.x];
    const int C = a.C, K = a.K;
    const float *cstate = ri->src < 0 ? nullptr : a.slots + (size_t)ri->src * a.slot_floats + a.off;
    float *d = a.slots + (size_t)ri->dst * a.slot_floats + a.off;
    for (int e = 0; e < K - 1; e++) {
        const float *in = conv_in(&a, ri, ri->n - (K - 1) + e, cstate);
        for (int c = threadIdx.x; c < C; c += blockDim.x) d[(size_t)e * C + c] = in ? in[c] : 0.0f;
    }
}

static int dv_threads(int Dv) {
    int n = 32;
    while (n < Dv && n < 1024) n *= 2;
    return n;
}

extern "C" cudaError_t ember_cu_delta_net(cudaStream_t stream, const ember_cu_delta *a) {
    if (a->T < 1 || a->n_rows < 1) return cudaSuccess;
    token_k<<<(unsigned)a->T, THREADS, 0, stream>>>(*a);
    head_k<<<(unsigned)(a->n_rows * a->Hv), (unsigned)dv_threads(a->Dv), 0, stream>>>(*a);
    conv_k<<<(unsigned)a->n_rows, THREADS, 0, stream>>>(*a);
    return cudaGetLastError();
}

/* ---- delta_replay ---- */

static __global__ void replay_head_k(ember_cu_replay a) {
    const int Hv = a.Hv, Hk = a.Hk, Dk = a.Dk, Dv = a.Dv, C = a.C, K = a.K;
    const int h = blockIdx.x % Hv, li = blockIdx.x / Hv, kh = a.v_tiled ? h % Hk : h / (Hv / Hk);
    const size_t conv_f = (size_t)(K - 1) * C, head_f = (size_t)Dk * Dv;
    const size_t off = a.layer_floats * (size_t)li, loff = a.log_floats * (size_t)li;
    float *S = a.slots + (size_t)a.dst * a.slot_floats + off + conv_f + (size_t)h * head_f;
    const float *S0 = a.src < 0 ? nullptr : a.slots + (size_t)a.src * a.slot_floats + off + conv_f + (size_t)h * head_f;
    for (int j = threadIdx.x; j < Dv; j += blockDim.x) {
        for (int i = 0; i < Dk; i++) S[(size_t)i * Dv + j] = S0 ? S0[(size_t)i * Dv + j] : 0.0f;
        for (int m = 0; m < a.n; m++) {
            const float *e = a.log + (size_t)m * a.log_stride + loff + C;
            const float *k = e + (size_t)kh * Dk, *v = e + (size_t)Hk * Dk, *gb = v + (size_t)Hv * Dv;
            (void)step_col(S, Dk, Dv, j, nullptr, k, v[(size_t)h * Dv + j], gb[h], gb[Hv + h]);
        }
    }
    if (h != 0) return;
    float *cd = a.slots + (size_t)a.dst * a.slot_floats + off; /* the convolution state, once per layer */
    const float *cs = a.src < 0 ? nullptr : a.slots + (size_t)a.src * a.slot_floats + off;
    for (int e = 0; e < K - 1; e++) {
        const int m = a.n - (K - 1) + e;
        for (int c = threadIdx.x; c < C; c += blockDim.x)
            cd[(size_t)e * C + c] = m >= 0 ? a.log[(size_t)m * a.log_stride + loff + c]
                                           : cs ? cs[(size_t)(K - 1 + m) * C + c] : 0.0f;
    }
}

extern "C" cudaError_t ember_cu_delta_replay(cudaStream_t stream, const ember_cu_replay *a) {
    if (a->n_layers < 1) return cudaSuccess;
    replay_head_k<<<(unsigned)(a->n_layers * a->Hv), (unsigned)dv_threads(a->Dv), 0, stream>>>(*a);
    return cudaGetLastError();
}

/* ---- add_rows_scaled ---- */

/* Column d of dst: its rows' terms in i order (one thread per column). */
static __global__ void __launch_bounds__(THREADS)
    add_rows_k(float *dst, const float *src, const int32_t *ids, const float *w, int n, int64_t D) {
    const int64_t d = (int64_t)blockIdx.x * THREADS + threadIdx.x;
    if (d >= D) return;
    for (int i = 0; i < n; i++) {
        float *p = dst + (size_t)ids[i] * (size_t)D + (size_t)d;
        *p = *p + w[i] * src[(size_t)i * (size_t)D + (size_t)d];
    }
}

extern "C" cudaError_t ember_cu_add_rows_scaled(cudaStream_t stream, float *dst, const float *src,
                                                const int32_t *ids, const float *w, int n, int64_t D) {
    if (n < 1 || D < 1) return cudaSuccess;
    add_rows_k<<<(unsigned)((D + THREADS - 1) / THREADS), THREADS, 0, stream>>>(dst, src, ids, w, n, D);
    return cudaGetLastError();
}
