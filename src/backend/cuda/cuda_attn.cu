/*
 * cuda_attn.cu - the paged KV ops of the CUDA backend: kv_write and kv_read
 * (the f32 / f16 / bf16 block codecs of backend.h) and attention over the
 * row's blocks.
 *
 * Layout (backend.h): position j of a row lives in block
 * blocks[j / 16 - first], slot j % 16; inside a block, each layer's K
 * region holds one piece per KV head of [D][16] values (transposed), its V
 * region one piece of [16][D] values.
 *
 * Attention, the order of every sum. The keys of token t are reduced in
 * spans of EMBER_CU_ATTN_SPAN consecutive absolute positions (span s holds
 * keys s * SPAN .. s * SPAN + SPAN - 1, cut to the token's window). For one
 * (token, query head, span) a block of SPAN threads computes the partial
 * softmax state (m, l, a[D]):
 *   score of key j (thread j - s * SPAN): sum over d in order of q[d] k_j[d]
 *     (fused multiply-add), times scale, then soft-capped;
 *   m = the largest score (exact in any order);
 *   l = sum of p_j = exp(score_j - m): the warp butterfly 16, 8, 4, 2, 1,
 *     then the warp sums in warp order;
 *   a[d] = sum over keys j in position order of p_j v_j[d] (thread d).
 * Then the spans are combined in increasing s: (M, L, A) <- (max(M, m),
 * L ca + l cb, A ca + a cb) with ca = exp(M - max), cb = exp(m - max), and
 * out = A (1 / L). Two kernels implement this: the fused one walks a
 * token's spans in one block; the split one (few tokens, long contexts)
 * computes every span in its own block into a scratch array, then a merge
 * kernel combines them. Both run the same device functions on the same
 * values, built without contraction (--fmad=false): they give the same
 * bits, so a token's output never depends on the batch around it or on
 * which kernel the host picked.
 *
 * Ownership and threads: launchers run on the host thread that drives the
 * backend and only enqueue on its stream; every pointer is device memory
 * owned by the backend (pools, tensors, its argument area, its scratch).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "cuda_kernels.h"

#define SPAN EMBER_CU_ATTN_SPAN
#define DPT (EMBER_CU_ATTN_MAX_D / SPAN) /* output dimensions per thread */

static_assert(SPAN % 32 == 0 && SPAN % 16 == 0, "a span is whole warps and whole blocks");
static_assert(EMBER_CU_ATTN_MAX_D % SPAN == 0, "dimensions split evenly over the threads");

/* Element i of a K or V piece in codec enc, as f32. */
static __device__ __forceinline__ float ld_kv(const unsigned char *p, size_t i, int enc) {
    if (enc == EMBER_CU_F32) return ((const float *)p)[i];
    const unsigned short h = ((const unsigned short *)p)[i];
    if (enc == EMBER_CU_BF16) return __uint_as_float((unsigned int)h << 16);
    return __half2float(__ushort_as_half(h));
}

/* The same with the codec known at compile time (attention's inner loops,
   which the compiler can then unroll with their loads issued together). */
template <int ENC> static __device__ __forceinline__ float ld_enc(const unsigned char *p, size_t i) {
    return ld_kv(p, i, ENC);
}

static __device__ __forceinline__ void st_kv(unsigned char *p, size_t i, int enc, float x) {
    if (enc == EMBER_CU_F32)
        ((float *)p)[i] = x;
    else if (enc == EMBER_CU_BF16)
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(x);
    else
        ((__half *)p)[i] = __float2half_rn(x);
}

/* The start of the block holding position j of ref (K or V region of head h). */
static __device__ __forceinline__ const unsigned char *piece(const ember_cu_kv *kv, const ember_cu_kv_ref *ref,
                                                             const ember_cu_kv_view *v, int j, int h, int is_k) {
    const int32_t blk = kv->blocks[ref->off + j / 16 - ref->first];
    const unsigned char *b = v->pool + (size_t)blk * v->block_bytes;
    return is_k ? b + v->k_off + (size_t)h * v->k_head : b + v->v_off + (size_t)h * v->v_head;
}

/* ---- kv_write / kv_read ------------------------------------------------------------------- */

/* Block (t, h): head h of token t, dimensions by thread. */
static __global__ void __launch_bounds__(128) kv_rw_k(ember_cu_kv kv, float *k, float *v, int write) {
    const int t = blockIdx.x, h = blockIdx.y, D = kv.D;
    const ember_cu_kv_ref ref = kv.refs[kv.row[t]];
    const ember_cu_kv_view *vw = &kv.view[ref.layer_set];
    const int p = kv.pos[t], slot = p % 16;
    unsigned char *kp = (unsigned char *)piece(&kv, &ref, vw, p, h, 1);
    unsigned char *vp = (unsigned char *)piece(&kv, &ref, vw, p, h, 0);
    const size_t off = ((size_t)t * (size_t)kv.H + (size_t)h) * (size_t)D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        const size_t ki = (size_t)d * 16 + (size_t)slot, vi = (size_t)slot * (size_t)D + (size_t)d;
        if (write) {
            st_kv(kp, ki, vw->k_enc, k[off + d]);
            st_kv(vp, vi, vw->v_enc, v[off + d]);
        } else {
            k[off + d] = ld_kv(kp, ki, vw->k_enc);
            v[off + d] = ld_kv(vp, vi, vw->v_enc);
        }
    }
}

extern "C" cudaError_t ember_cu_kv_rw(cudaStream_t stream, const ember_cu_kv *kv, float *k, float *v, int write) {
    if (kv->T < 1 || kv->H < 1) return cudaSuccess;
    if (kv->H > 65535) return cudaErrorInvalidValue;
    kv_rw_k<<<dim3((unsigned)kv->T, (unsigned)kv->H, 1), 128, 0, stream>>>(*kv, k, v, write);
    return cudaGetLastError();
}

/* ---- attention ---------------------------------------------------------------------------- */

typedef struct attn_args {
    ember_cu_kv kv;
    float *out;      /* [T, Hq, D] */
    const float *q;  /* [T, Hq, D] */
    float *parts;    /* split mode: [T * Hq][n_span][2 + D] */
    int Hq, rep, n_span;
    float scale, softcap;
    int window;
} attn_args;

typedef struct attn_smem {
    float q[EMBER_CU_ATTN_MAX_D];
    float p[SPAN];        /* scores, then their exponentials */
    float red[SPAN / 32]; /* warp maxima, then warp sums */
} attn_smem;

/* Keys [lo, hi] of token t. */
static __device__ __forceinline__ void keys_of(const attn_args *a, int t, int *lo, int *hi) {
    const int p = a->kv.pos[t], w = a->window;
    *hi = p;
    *lo = w > 0 && p - w + 1 > 0 ? p - w + 1 : 0;
}

/* The partial state of span s for (t, query head hq): every thread gets m
   and l; thread d-owner gets a[i] for d = threadIdx.x + i * SPAN. Leaves
   the shared memory free for the next call (ends with a barrier). */
template <int ENC>
static __device__ void span_state(const attn_args *a, attn_smem *sm, int t, int hq, int s, int lo, int hi, float *m,
                                  float *l, float *acc) {
    const ember_cu_kv *kv = &a->kv;
    const ember_cu_kv_ref ref = kv->refs[kv->row[t]];
    const ember_cu_kv_view *vw = &kv->view[ref.layer_set];
    const int D = kv->D, hk = hq / a->rep, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int j = s * SPAN + tid;
    float sc = -INFINITY;
    if (j >= lo && j <= hi) {
        const unsigned char *kp = piece(kv, &ref, vw, j, hk, 1);
        const int slot = j % 16;
        float dot = 0.0f;
#pragma unroll 16
        for (int d = 0; d < D; d++) dot = fmaf(sm->q[d], ld_enc<ENC>(kp, (size_t)d * 16 + (size_t)slot), dot);
        sc = dot * a->scale;
        if (a->softcap > 0.0f) sc = a->softcap * tanhf(sc / a->softcap);
    }
    float mx = sc;
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) sm->red[warp] = mx;
    __syncthreads();
    mx = sm->red[0];
#pragma unroll
    for (int w = 1; w < SPAN / 32; w++) mx = fmaxf(mx, sm->red[w]);
    const float e = sc == -INFINITY ? 0.0f : expf(sc - mx);
    sm->p[tid] = e;
    float sum = e;
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) sum = sum + __shfl_xor_sync(0xffffffffu, sum, o);
    __syncthreads(); /* every thread has read red[] as maxima */
    if (lane == 0) sm->red[warp] = sum;
    __syncthreads();
    sum = sm->red[0];
#pragma unroll
    for (int w = 1; w < SPAN / 32; w++) sum = sum + sm->red[w];
    *m = mx;
    *l = sum;
    /* a[d] over the span's keys that exist, in position order */
    const int j0 = s * SPAN > lo ? s * SPAN : lo, j1 = s * SPAN + SPAN - 1 < hi ? s * SPAN + SPAN - 1 : hi;
#pragma unroll
    for (int i = 0; i < DPT; i++) acc[i] = 0.0f;
    for (int b0 = j0; b0 <= j1; b0 = (b0 / 16 + 1) * 16) {
        const unsigned char *vp = piece(kv, &ref, vw, b0, hk, 0);
        const int e1 = (b0 / 16) * 16 + 15 < j1 ? (b0 / 16) * 16 + 15 : j1;
#pragma unroll 4
        for (int jj = b0; jj <= e1; jj++) {
            const float pj = sm->p[jj - s * SPAN];
            const size_t row = (size_t)(jj % 16) * (size_t)D;
#pragma unroll
            for (int i = 0; i < DPT; i++) {
                const int d = tid + i * SPAN;
                if (d < D) acc[i] = fmaf(pj, ld_enc<ENC>(vp, row + (size_t)d), acc[i]);
            }
        }
    }
    __syncthreads(); /* p[] and red[] are free again */
}

/* (M, L, A) <- combine((M, L, A), (m, l, a)); the same in both kernels. */
static __device__ __forceinline__ void combine(float *M, float *L, float *A, float m, float l, const float *acc) {
    const float mn = fmaxf(*M, m);
    const float ca = *M == -INFINITY ? 0.0f : expf(*M - mn), cb = m == -INFINITY ? 0.0f : expf(m - mn);
    *L = *L * ca + l * cb;
#pragma unroll
    for (int i = 0; i < DPT; i++) A[i] = A[i] * ca + acc[i] * cb;
    *M = mn;
}

static __device__ __forceinline__ void finish(const attn_args *a, int t, int hq, float L, const float *A) {
    const int D = a->kv.D;
    float *o = a->out + ((size_t)t * (size_t)a->Hq + (size_t)hq) * (size_t)D;
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
#pragma unroll
    for (int i = 0; i < DPT; i++) {
        const int d = threadIdx.x + i * SPAN;
        if (d < D) o[d] = A[i] * inv;
    }
}

static __device__ __forceinline__ void load_q(const attn_args *a, attn_smem *sm, int t, int hq) {
    const float *q = a->q + ((size_t)t * (size_t)a->Hq + (size_t)hq) * (size_t)a->kv.D;
    for (int d = threadIdx.x; d < a->kv.D; d += SPAN) sm->q[d] = q[d];
    __syncthreads();
}

/* Fused: block u = t * Hq + hq walks every span of token t in order. */
template <int ENC> static __global__ void __launch_bounds__(SPAN) attn_fused_k(attn_args a) {
    __shared__ attn_smem sm;
    const int t = blockIdx.x / a.Hq, hq = blockIdx.x % a.Hq;
    int lo, hi;
    keys_of(&a, t, &lo, &hi);
    load_q(&a, &sm, t, hq);
    float M = -INFINITY, L = 0.0f, A[DPT], acc[DPT], m, l;
#pragma unroll
    for (int i = 0; i < DPT; i++) A[i] = 0.0f;
    for (int s = lo / SPAN; s <= hi / SPAN; s++) {
        span_state<ENC>(&a, &sm, t, hq, s, lo, hi, &m, &l, acc);
        combine(&M, &L, A, m, l, acc);
    }
    finish(&a, t, hq, L, A);
}

/* Split, pass 1: block (x, u) computes span lo / SPAN + x of unit u. */
template <int ENC> static __global__ void __launch_bounds__(SPAN) attn_span_k(attn_args a) {
    __shared__ attn_smem sm;
    const int u = blockIdx.y, t = u / a.Hq, hq = u % a.Hq;
    int lo, hi;
    keys_of(&a, t, &lo, &hi);
    const int s = lo / SPAN + (int)blockIdx.x;
    if (s > hi / SPAN) return;
    load_q(&a, &sm, t, hq);
    float m, l, acc[DPT];
    span_state<ENC>(&a, &sm, t, hq, s, lo, hi, &m, &l, acc);
    float *part = a.parts + ((size_t)u * (size_t)a.n_span + blockIdx.x) * (size_t)(2 + a.kv.D);
    if (threadIdx.x == 0) {
        part[0] = m;
        part[1] = l;
    }
#pragma unroll
    for (int i = 0; i < DPT; i++) {
        const int d = threadIdx.x + i * SPAN;
        if (d < a.kv.D) part[2 + d] = acc[i];
    }
}

/* Split, pass 2: block u combines its spans in order. */
static __global__ void __launch_bounds__(SPAN) attn_merge_k(attn_args a) {
    const int u = blockIdx.x, t = u / a.Hq, hq = u % a.Hq;
    int lo, hi;
    keys_of(&a, t, &lo, &hi);
    const int ns = hi / SPAN - lo / SPAN + 1;
    float M = -INFINITY, L = 0.0f, A[DPT], acc[DPT];
#pragma unroll
    for (int i = 0; i < DPT; i++) A[i] = 0.0f;
    for (int x = 0; x < ns; x++) {
        const float *part = a.parts + ((size_t)u * (size_t)a.n_span + (size_t)x) * (size_t)(2 + a.kv.D);
#pragma unroll
        for (int i = 0; i < DPT; i++) {
            const int d = threadIdx.x + i * SPAN;
            acc[i] = d < a.kv.D ? part[2 + d] : 0.0f;
        }
        combine(&M, &L, A, part[0], part[1], acc);
    }
    finish(&a, t, hq, L, A);
}

extern "C" cudaError_t ember_cu_attention(cudaStream_t stream, const ember_cu_kv *kv, float *out, const float *q,
                                          int Hq, float scale, int window, float softcap, int n_span, float *parts) {
    if (kv->T < 1 || Hq < 1) return cudaSuccess;
    if (kv->D < 1 || kv->D > EMBER_CU_ATTN_MAX_D || kv->H < 1 || Hq % kv->H || (int64_t)kv->T * Hq > 0x7fffffff)
        return cudaErrorInvalidValue;
    const int enc = kv->view[0].k_enc;
    for (int i = 0; i < 2; i++) /* one codec for K and V of every view the kernels read */
        if (kv->view[i].pool && (kv->view[i].k_enc != enc || kv->view[i].v_enc != enc)) return cudaErrorInvalidValue;
    attn_args a = {*kv, out, q, parts, Hq, Hq / kv->H, n_span, scale, softcap, window};
    const unsigned units = (unsigned)(kv->T * Hq);
    if (n_span > 0 && units > 65535u) return cudaErrorInvalidValue; /* grid y */
    const dim3 split((unsigned)n_span, units, 1);
    switch (enc) {
    case EMBER_CU_F32:
        if (n_span > 0) attn_span_k<EMBER_CU_F32><<<split, SPAN, 0, stream>>>(a);
        else attn_fused_k<EMBER_CU_F32><<<units, SPAN, 0, stream>>>(a);
        break;
    case EMBER_CU_F16:
        if (n_span > 0) attn_span_k<EMBER_CU_F16><<<split, SPAN, 0, stream>>>(a);
        else attn_fused_k<EMBER_CU_F16><<<units, SPAN, 0, stream>>>(a);
        break;
    case EMBER_CU_BF16:
        if (n_span > 0) attn_span_k<EMBER_CU_BF16><<<split, SPAN, 0, stream>>>(a);
        else attn_fused_k<EMBER_CU_BF16><<<units, SPAN, 0, stream>>>(a);
        break;
    default: return cudaErrorInvalidValue;
    }
    if (n_span > 0) attn_merge_k<<<units, SPAN, 0, stream>>>(a);
    return cudaGetLastError();
}
