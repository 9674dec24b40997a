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
 * out = A (1 / L). Four kernels implement this: the fused one walks a
 * token's spans in one block, each thread loading its own key or dimension
 * from global memory (prefill: many blocks hide the latency); the staged
 * one does the same after copying each span's K and V pieces into shared
 * memory with cp.async, every load in flight at once (few tokens); the
 * split one (few tokens, long contexts: decode) gives every span its own
 * staged block, writes its state to a scratch array, and the last block of
 * a (token, head) to finish combines the spans in increasing order; the
 * grouped split one (many tokens: batched decode) stages a span once per KV
 * head and computes its query heads from that staging in turn. All
 * run the same arithmetic on the same values in the same order, built
 * without contraction (--fmad=false): they give the same bits, so a
 * token's output never depends on the batch around it or on which kernel
 * the host picked.
 *
 * bf16 KV with head sizes 16 to 128 takes another order (the tc order:
 * the same spans and combine, each span's state on the tensor cores), for
 * every token count, unless EMBER_CUDA_ATTN_TC=0; its section below says
 * it in full.
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
#include "cuda_mm.cuh"
#include "cuda_pdl.cuh"

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
    ember_pdl_enter();
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
    return ember_launch(kv_rw_k, dim3((unsigned)kv->T, (unsigned)kv->H, 1), dim3(128), 0, stream, *kv, k, v, write);
}

/* ---- rope + kv_write ------------------------------------------------------------------------ */

/* Block (t, j): head j of token t's q (j < Hq), or KV head j - Hq: the
   cos / sin table of its position (as cuda_ops.cu's rope_k), the head's
   pairs rotated, and for a KV head its rotated k and its v stored as
   kv_rw_k stores them (a rotated pair straight from registers). The
   cache's block is looked up before the table, off the critical path. */
static __global__ void __launch_bounds__(128) rope_kv_k(ember_cu_kv kv, float *q, int Hq, float *k, const float *v,
                                                        const int32_t *pos, const float *inv_freq, int half,
                                                        int interleaved, float af) {
    ember_pdl_enter();
    extern __shared__ float tab[]; /* cos [half], then sin [half] */
    const int t = blockIdx.x, j = blockIdx.y, H = kv.H, D = kv.D;
    const bool is_k = j >= Hq;
    const int h = is_k ? j - Hq : j;
    unsigned char *kp = NULL, *vp = NULL;
    int slot = 0, enc_k = 0, enc_v = 0;
    if (is_k) {
        const ember_cu_kv_ref ref = kv.refs[kv.row[t]];
        const ember_cu_kv_view *vw = &kv.view[ref.layer_set];
        const int p = kv.pos[t];
        slot = p % 16;
        kp = (unsigned char *)piece(&kv, &ref, vw, p, h, 1);
        vp = (unsigned char *)piece(&kv, &ref, vw, p, h, 0);
        enc_k = vw->k_enc;
        enc_v = vw->v_enc;
    }
    const float p = (float)pos[t];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float angle = p * inv_freq[i];
        double s, c;
        sincos((double)angle, &s, &c);
        tab[i] = (float)c * af;
        tab[half + i] = (float)s * af;
    }
    __syncthreads();
    float *x = is_k ? k + ((size_t)t * (size_t)H + (size_t)h) * (size_t)D : q + ((size_t)t * (size_t)Hq + (size_t)h) * (size_t)D;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
        const float x0 = x[a], x1 = x[b], cs = tab[i], sn = tab[half + i];
        const float y0 = x0 * cs - x1 * sn, y1 = x1 * cs + x0 * sn;
        x[a] = y0;
        x[b] = y1;
        if (is_k) {
            st_kv(kp, (size_t)a * 16 + (size_t)slot, enc_k, y0);
            st_kv(kp, (size_t)b * 16 + (size_t)slot, enc_k, y1);
        }
    }
    if (!is_k) return;
    for (int d = 2 * half + threadIdx.x; d < D; d += blockDim.x) /* dimensions past n_rot: as they are */
        st_kv(kp, (size_t)d * 16 + (size_t)slot, enc_k, x[d]);
    const float *vh = v + ((size_t)t * (size_t)H + (size_t)h) * (size_t)D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) st_kv(vp, (size_t)slot * (size_t)D + (size_t)d, enc_v, vh[d]);
}

extern "C" cudaError_t ember_cu_rope_kv_write(cudaStream_t stream, const ember_cu_kv *kv, float *q, int Hq, float *k,
                                              const float *v, const int32_t *pos, const float *inv_freq, int n_rot,
                                              int interleaved, float attn_factor) {
    if (kv->T < 1 || kv->H < 1) return cudaSuccess;
    const int half = n_rot / 2;
    if (half < 1 || Hq + kv->H > 65535) return cudaErrorInvalidValue;
    return ember_launch(rope_kv_k, dim3((unsigned)kv->T, (unsigned)(Hq + kv->H)), dim3(128),
                        (size_t)half * 2 * sizeof(float), stream, *kv, q, Hq, k, v, pos, inv_freq, half, interleaved,
                        attn_factor);
}

/* ---- attention ---------------------------------------------------------------------------- */

/* The staged kernels copy a span's K and V pieces into shared memory with
   cp.async before computing: every load of a span is in flight at once,
   where the plain kernels keep a few loads per thread in flight (a chain of
   dependent loads, the decode bottleneck). K is staged STAGE_K bytes of
   dimensions at a time (each piece padded by 16 values so the two pieces a
   warp reads fall in other banks), V STAGE_V bytes of keys at a time. The
   arithmetic, and so the bits, are the plain kernels'. */
#define STAGE_K 32768
#define STAGE_V 32768
#define PIECES (SPAN / 16)
#define STAGE_K_PAD (STAGE_K + PIECES * 16 * 4) /* the K region with each piece padded by 16 values */
#define STAGE_BYTES (STAGE_K_PAD + STAGE_V)
static_assert(STAGE_K_PAD % 16 == 0, "the V region starts 16-byte aligned");
static_assert(16 * EMBER_CU_ATTN_MAX_D * 4 <= STAGE_V, "one V piece of the largest head fits");

typedef struct attn_args {
    ember_cu_kv kv;
    float *out;      /* [T, Hq, D] */
    const float *q;  /* [T, Hq, D] */
    float *parts;    /* split mode: [T * Hq][n_span][2 + D] */
    int *count;      /* split mode: [T * Hq] spans finished, zero between launches */
    int Hq, rep, n_span;
    float scale, softcap;
    int window;
    int vec16; /* every pool, offset and head size is a multiple of 16 bytes */
} attn_args;

typedef struct attn_smem {
    float q[EMBER_CU_ATTN_MAX_D];
    float p[SPAN];        /* scores, then their exponentials */
    float red[SPAN / 32]; /* warp maxima, then warp sums */
    const unsigned char *kb[PIECES], *vb[PIECES]; /* staged: the span's pieces (NULL: outside the keys) */
} attn_smem;

/* Keys [lo, hi] of token t. */
static __device__ __forceinline__ void keys_of(const attn_args *a, int t, int *lo, int *hi) {
    const int p = a->kv.pos[t], w = a->window;
    *hi = p;
    *lo = w > 0 && p - w + 1 > 0 ? p - w + 1 : 0;
}

/* The score of key j from its dot product; -inf for a key outside the window. */
static __device__ __forceinline__ float score_of(const attn_args *a, float dot, bool live) {
    if (!live) return -INFINITY;
    float sc = dot * a->scale;
    if (a->softcap > 0.0f) sc = a->softcap * tanhf(sc / a->softcap);
    return sc;
}

/* m, l of a span from each thread's score sc; p[tid] = exp(sc - m). Ends
   with p[] written and visible (a barrier). */
static __device__ __forceinline__ void span_softmax(attn_smem *sm, float sc, float *m, float *l) {
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
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
    const int D = kv->D, hk = hq / a->rep, tid = threadIdx.x;
    const int j = s * SPAN + tid;
    float dot = 0.0f;
    if (j >= lo && j <= hi) {
        const unsigned char *kp = piece(kv, &ref, vw, j, hk, 1);
        const int slot = j % 16;
#pragma unroll 16
        for (int d = 0; d < D; d++) dot = fmaf(sm->q[d], ld_enc<ENC>(kp, (size_t)d * 16 + (size_t)slot), dot);
    }
    span_softmax(sm, score_of(a, dot, j >= lo && j <= hi), m, l);
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

/* Queues the copy of n bytes (a multiple of 16, or of 4 without vec16)
   from src to shared dst, split over the block's threads from index i0. */
static __device__ __forceinline__ void stage_copy(unsigned char *dst, const unsigned char *src, int n, int i0,
                                                  int vec16) {
    if (vec16) {
        for (int i = i0 * 16; i < n; i += SPAN * 16) {
            ember_cp16(dst + i, src + i);
        }
    } else {
        for (int i = i0 * 4; i < n; i += SPAN * 4) {
            const unsigned int sa = (unsigned int)__cvta_generic_to_shared(dst + i);
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(sa), "l"(src + i) : "memory");
        }
    }
}

/* Staged K: dimensions [d0, d0 + dn) of every live piece (sm->kb) into sk,
   piece p at p * pstride bytes. */
template <int ES>
static __device__ __forceinline__ void stage_k(const attn_args *a, const attn_smem *sm, unsigned char *sk, int d0,
                                               int dn, int pstride) {
    const int n = dn * 16 * ES;
    for (int p = 0; p < PIECES; p++)
        if (sm->kb[p]) stage_copy(sk + p * pstride, sm->kb[p] + (size_t)d0 * 16 * ES, n, threadIdx.x, a->vec16);
}

/* Staged V: the live pieces among keys [c0, c0 + kc) of the span (relative). */
template <int ES>
static __device__ __forceinline__ void stage_v(const attn_args *a, const attn_smem *sm, unsigned char *sv, int c0,
                                               int kc, int D) {
    const int n = 16 * D * ES;
    for (int p = c0 / 16; p < (c0 + kc) / 16 && p < PIECES; p++)
        if (sm->vb[p]) stage_copy(sv + (p - c0 / 16) * n, sm->vb[p], n, threadIdx.x, a->vec16);
}

/* span_state through shared memory (the staged kernels): the same sums in
   the same order, so the same bits. stage: STAGE_BYTES of dynamic shared
   memory. with_q: load the query into sm->q too (the first span). */
template <int ENC>
static __device__ void span_state_staged(const attn_args *a, attn_smem *sm, unsigned char *stage, int t, int hq,
                                         int s, int lo, int hi, float *m, float *l, float *acc, bool with_q) {
    constexpr int ES = ENC == EMBER_CU_F32 ? 4 : 2;
    const ember_cu_kv *kv = &a->kv;
    const ember_cu_kv_ref ref = kv->refs[kv->row[t]];
    const ember_cu_kv_view *vw = &kv->view[ref.layer_set];
    const int D = kv->D, hk = hq / a->rep, tid = threadIdx.x, s0 = s * SPAN;
    const int j0 = s0 > lo ? s0 : lo, j1 = s0 + SPAN - 1 < hi ? s0 + SPAN - 1 : hi;
    const int DC = D < STAGE_K / (SPAN * ES) ? D : STAGE_K / (SPAN * ES); /* dimensions per K chunk */
    const int kc_max = STAGE_V / (D * ES) / 16 * 16, KC = kc_max < SPAN ? kc_max : SPAN; /* keys per V chunk */
    const int pstride = (DC * 16 + 16) * ES;
    unsigned char *sk = stage, *sv = stage + STAGE_K_PAD;
    if (tid < PIECES) { /* the pieces holding keys of [j0, j1] */
        const int b = s0 + tid * 16;
        const bool live = b + 15 >= j0 && b <= j1;
        sm->kb[tid] = live ? piece(kv, &ref, vw, b, hk, 1) : NULL;
        sm->vb[tid] = live ? piece(kv, &ref, vw, b, hk, 0) : NULL;
    }
    if (with_q) { /* the query beside the block lookups: one wait for both */
        const float *qg = a->q + ((size_t)t * (size_t)a->Hq + (size_t)hq) * (size_t)D;
        for (int d = tid; d < D; d += SPAN) sm->q[d] = qg[d];
    }
    __syncthreads();
    const int c_first = (j0 - s0) / KC * KC; /* the V chunk holding j0 */
    stage_k<ES>(a, sm, sk, 0, DC, pstride);
    ember_cp_commit();
    stage_v<ES>(a, sm, sv, c_first, KC, D);
    ember_cp_commit();
    const int j = s0 + tid;
    const bool live = j >= lo && j <= hi;
    float dot = 0.0f;
    for (int d0 = 0; d0 < D; d0 += DC) {
        const int dn = D - d0 < DC ? D - d0 : DC;
        if (d0 == 0) {
            ember_cp_wait<1>();
        } else {
            __syncthreads(); /* every thread is done with the last chunk */
            stage_k<ES>(a, sm, sk, d0, dn, pstride);
            ember_cp_commit();
            ember_cp_wait<0>();
        }
        __syncthreads();
        if (live) {
            const unsigned char *kp = sk + (tid / 16) * pstride;
            const int slot = tid % 16;
#pragma unroll 16
            for (int dd = 0; dd < dn; dd++)
                dot = fmaf(sm->q[d0 + dd], ld_enc<ENC>(kp, (size_t)dd * 16 + (size_t)slot), dot);
        }
    }
    span_softmax(sm, score_of(a, dot, live), m, l);
#pragma unroll
    for (int i = 0; i < DPT; i++) acc[i] = 0.0f;
    for (int c0 = c_first; s0 + c0 <= j1; c0 += KC) {
        if (c0 == c_first) {
            ember_cp_wait<0>();
        } else {
            __syncthreads(); /* every thread is done with the last chunk */
            stage_v<ES>(a, sm, sv, c0, KC, D);
            ember_cp_commit();
            ember_cp_wait<0>();
        }
        __syncthreads();
        const int e0 = j0 > s0 + c0 ? j0 : s0 + c0, e1 = j1 < s0 + c0 + KC - 1 ? j1 : s0 + c0 + KC - 1;
#pragma unroll 4
        for (int jj = e0; jj <= e1; jj++) {
            const float pj = sm->p[jj - s0];
            const size_t row = (size_t)(jj - s0 - c0) * (size_t)D;
#pragma unroll
            for (int i = 0; i < DPT; i++) {
                const int d = tid + i * SPAN;
                if (d < D) acc[i] = fmaf(pj, ld_enc<ENC>(sv, row + (size_t)d), acc[i]);
            }
        }
    }
    __syncthreads(); /* p[], red[], the pieces and the stage are free again */
}

/* (M, L, A) <- combine((M, L, A), (m, l, a)); the same in every kernel. */
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

/* Fused: block u = t * Hq + hq walks every span of token t in order
   (STAGED: through shared memory, STAGE_BYTES of dynamic shared memory). */
template <int ENC, int STAGED> static __global__ void __launch_bounds__(SPAN) attn_fused_k(attn_args a) {
    ember_pdl_enter();
    __shared__ attn_smem sm;
    extern __shared__ __align__(16) unsigned char stage[];
    const int t = blockIdx.x / a.Hq, hq = blockIdx.x % a.Hq;
    int lo, hi;
    keys_of(&a, t, &lo, &hi);
    if (!STAGED) load_q(&a, &sm, t, hq);
    float M = -INFINITY, L = 0.0f, A[DPT], acc[DPT], m, l;
#pragma unroll
    for (int i = 0; i < DPT; i++) A[i] = 0.0f;
    for (int s = lo / SPAN; s <= hi / SPAN; s++) {
        if (STAGED)
            span_state_staged<ENC>(&a, &sm, stage, t, hq, s, lo, hi, &m, &l, acc, s == lo / SPAN);
        else
            span_state<ENC>(&a, &sm, t, hq, s, lo, hi, &m, &l, acc);
        combine(&M, &L, A, m, l, acc);
    }
    finish(&a, t, hq, L, A);
}

/* Split: block (x, u) computes span lo / SPAN + x of unit u (staged) into
   parts; the last of the unit's blocks to finish (a counter per unit)
   combines its spans in increasing order, as the fused kernel does, and
   zeroes the counter for the next launch. Which block is last changes
   nothing: the combine reads every span's part in the same order. */
template <int ENC> static __global__ void __launch_bounds__(SPAN) attn_split_k(attn_args a) {
    ember_pdl_enter();
    __shared__ attn_smem sm;
    __shared__ int last;
    extern __shared__ __align__(16) unsigned char stage[];
    const int u = blockIdx.y, t = u / a.Hq, hq = u % a.Hq;
    int lo, hi;
    keys_of(&a, t, &lo, &hi);
    const int s = lo / SPAN + (int)blockIdx.x, ns = hi / SPAN - lo / SPAN + 1;
    if (s > hi / SPAN) return;
    float m, l, acc[DPT];
    span_state_staged<ENC>(&a, &sm, stage, t, hq, s, lo, hi, &m, &l, acc, true);
    const size_t stride = (size_t)(2 + a.kv.D);
    float *part = a.parts + ((size_t)u * (size_t)a.n_span + blockIdx.x) * stride;
    if (threadIdx.x == 0) {
        part[0] = m;
        part[1] = l;
    }
#pragma unroll
    for (int i = 0; i < DPT; i++) {
        const int d = threadIdx.x + i * SPAN;
        if (d < a.kv.D) part[2 + d] = acc[i];
    }
    __threadfence(); /* this block's part is visible before the count says so */
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&a.count[u], 1) == ns - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    float M = -INFINITY, L = 0.0f, A[DPT];
#pragma unroll
    for (int i = 0; i < DPT; i++) A[i] = 0.0f;
    for (int x = 0; x < ns; x++) {
        const float *px = a.parts + ((size_t)u * (size_t)a.n_span + (size_t)x) * stride;
#pragma unroll
        for (int i = 0; i < DPT; i++) {
            const int d = threadIdx.x + i * SPAN;
            acc[i] = d < a.kv.D ? __ldcg(px + 2 + d) : 0.0f;
        }
        combine(&M, &L, A, __ldcg(px), __ldcg(px + 1), acc);
    }
    finish(&a, t, hq, L, A);
    if (threadIdx.x == 0) a.count[u] = 0;
}

/* ---- grouped split: the query heads of a KV head over one staging of its span ---------------- */

/* Whether a whole span of K and of V fits the stage at once (every
   dimension in one K chunk, every key in one V chunk). */
static __host__ __device__ __forceinline__ bool span_fits(int D, int enc) {
    const int es = enc == EMBER_CU_F32 ? 4 : 2;
    return D * SPAN * es <= STAGE_K && 16 * ((SPAN + 15) / 16) * D * es <= STAGE_V;
}

/* Stages span s of KV head hk of token t whole (span_fits): K and V at
   the places span_state_staged puts them when they fit (one K chunk of
   all D dimensions, one V chunk from key 0 of the span). Ends with the
   stage complete and visible. */
template <int ENC>
static __device__ void span_stage_all(const attn_args *a, attn_smem *sm, unsigned char *stage, int t, int hk, int s,
                                      int lo, int hi) {
    constexpr int ES = ENC == EMBER_CU_F32 ? 4 : 2;
    const ember_cu_kv *kv = &a->kv;
    const ember_cu_kv_ref ref = kv->refs[kv->row[t]];
    const ember_cu_kv_view *vw = &kv->view[ref.layer_set];
    const int D = kv->D, tid = threadIdx.x, s0 = s * SPAN;
    const int j0 = s0 > lo ? s0 : lo, j1 = s0 + SPAN - 1 < hi ? s0 + SPAN - 1 : hi;
    if (tid < PIECES) {
        const int b = s0 + tid * 16;
        const bool live = b + 15 >= j0 && b <= j1;
        sm->kb[tid] = live ? piece(kv, &ref, vw, b, hk, 1) : NULL;
        sm->vb[tid] = live ? piece(kv, &ref, vw, b, hk, 0) : NULL;
    }
    __syncthreads();
    stage_k<ES>(a, sm, stage, 0, D, (D * 16 + 16) * ES);
    stage_v<ES>(a, sm, stage + STAGE_K_PAD, 0, SPAN, D);
    ember_cp_commit();
    ember_cp_wait<0>();
    __syncthreads();
}

/* The partial state of span s for (t, query head hq) from a stage that
   span_stage_all filled: span_state_staged's sums in its order (one K
   chunk, one V chunk), so its bits. Leaves q, p and red free (ends with a
   barrier); the stage stays. */
template <int ENC>
static __device__ void span_head_staged(const attn_args *a, attn_smem *sm, const unsigned char *stage, int t, int hq,
                                        int s, int lo, int hi, float *m, float *l, float *acc) {
    constexpr int ES = ENC == EMBER_CU_F32 ? 4 : 2;
    const int D = a->kv.D, tid = threadIdx.x, s0 = s * SPAN;
    const int j0 = s0 > lo ? s0 : lo, j1 = s0 + SPAN - 1 < hi ? s0 + SPAN - 1 : hi;
    const int pstride = (D * 16 + 16) * ES;
    const unsigned char *sk = stage, *sv = stage + STAGE_K_PAD;
    const float *qg = a->q + ((size_t)t * (size_t)a->Hq + (size_t)hq) * (size_t)D;
    for (int d = tid; d < D; d += SPAN) sm->q[d] = qg[d];
    __syncthreads();
    const int j = s0 + tid;
    const bool live = j >= lo && j <= hi;
    float dot = 0.0f;
    if (live) {
        const unsigned char *kp = sk + (tid / 16) * pstride;
        const int slot = tid % 16;
#pragma unroll 16
        for (int dd = 0; dd < D; dd++) dot = fmaf(sm->q[dd], ld_enc<ENC>(kp, (size_t)dd * 16 + (size_t)slot), dot);
    }
    span_softmax(sm, score_of(a, dot, live), m, l);
#pragma unroll
    for (int i = 0; i < DPT; i++) acc[i] = 0.0f;
#pragma unroll 4
    for (int jj = j0; jj <= j1; jj++) {
        const float pj = sm->p[jj - s0];
        const size_t row = (size_t)(jj - s0) * (size_t)D;
#pragma unroll
        for (int i = 0; i < DPT; i++) {
            const int d = tid + i * SPAN;
            if (d < D) acc[i] = fmaf(pj, ld_enc<ENC>(sv, row + (size_t)d), acc[i]);
        }
    }
    __syncthreads(); /* q, p and red are free again */
}

/* Grouped split (span_fits): block (x, g) stages span lo / SPAN + x of KV
   head hk of token t (g = t * H + hk) once and computes the state of each
   of its rep query heads from it in turn, into parts as attn_split_k does;
   a counter per (t, hk) finds the last block, which combines the spans of
   each head in increasing order. The same values in the same order as
   attn_split_k, so the same bits, with the keys and values read once per
   KV head instead of once per query head. */
template <int ENC> static __global__ void __launch_bounds__(SPAN) attn_group_k(attn_args a) {
    ember_pdl_enter();
    __shared__ attn_smem sm;
    __shared__ int last;
    extern __shared__ __align__(16) unsigned char stage[];
    const int g = blockIdx.y, t = g / a.kv.H, hk = g % a.kv.H;
    int lo, hi;
    keys_of(&a, t, &lo, &hi);
    const int s = lo / SPAN + (int)blockIdx.x, ns = hi / SPAN - lo / SPAN + 1;
    if (s > hi / SPAN) return;
    span_stage_all<ENC>(&a, &sm, stage, t, hk, s, lo, hi);
    const size_t stride = (size_t)(2 + a.kv.D);
    for (int r = 0; r < a.rep; r++) {
        const int hq = hk * a.rep + r;
        const size_t u = (size_t)t * (size_t)a.Hq + (size_t)hq;
        float m, l, acc[DPT];
        span_head_staged<ENC>(&a, &sm, stage, t, hq, s, lo, hi, &m, &l, acc);
        float *part = a.parts + (u * (size_t)a.n_span + blockIdx.x) * stride;
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
    __threadfence(); /* this block's parts are visible before the count says so */
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&a.count[g], 1) == ns - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int r = 0; r < a.rep; r++) {
        const int hq = hk * a.rep + r;
        const size_t u = (size_t)t * (size_t)a.Hq + (size_t)hq;
        float M = -INFINITY, L = 0.0f, A[DPT], acc[DPT];
#pragma unroll
        for (int i = 0; i < DPT; i++) A[i] = 0.0f;
        for (int x = 0; x < ns; x++) {
            const float *px = a.parts + (u * (size_t)a.n_span + (size_t)x) * stride;
#pragma unroll
            for (int i = 0; i < DPT; i++) {
                const int d = threadIdx.x + i * SPAN;
                acc[i] = d < a.kv.D ? __ldcg(px + 2 + d) : 0.0f;
            }
            combine(&M, &L, A, __ldcg(px), __ldcg(px + 1), acc);
        }
        finish(&a, t, hq, L, A);
    }
    if (threadIdx.x == 0) a.count[g] = 0;
}

/* ---- attention on the tensor cores (bf16 KV): the tc order ------------------------------------ */

/* The tc order, for bf16 K and V, head sizes 16, 32, 64 and 128 (the
   layer's own properties: a layer always takes the same order). It keeps
   the spans of SPAN keys of fixed absolute position and their combine in
   increasing order (combine() above, the same arithmetic), and changes how
   a span's state is computed, with mma.sync m16n8k16 (bf16 in, f32
   accumulate) over 16 query rows (a row: one (token, query head)):
   score of key j: q is split per element into bf16 hi = bf16(q) and
     lo = bf16(q - hi) (as the bf16 matmul splits its input; k is bf16
     already, so every product is exact); for each 16 dimensions in order,
     one mma with hi, then one with lo, accumulating from +0; then times
     scale, soft-capped; -inf outside the row's keys;
   m: the largest score; lane (g, c) of the quad holding the row keeps
     keys 8 n + 2 c + e (n = 0..15, e = 0, 1), so l = the sum of that
     lane's p = exp(score - m) in (n, e) order, then the lanes c ^ 1, then
     c ^ 2 added (a butterfly, the same for every row);
   a[d]: p split like q (hi, lo); for each 16 keys of the span in order,
     one mma with hi, then one with lo, from +0; keys outside the row's
     range have p = 0 (their V is finite: the span's staged pieces, zero
     where nothing was staged).
   A row's result depends on its own q and keys only (the mma computes
   each output from its own row), never on the other rows of the tile, so
   a token gets the same bits in any batch, chunk or kernel below. Two
   kernels: tc walk (a block per tile of tokens and KV head walks the
   spans, combining as it goes: prefill) and tc split (a block per (span,
   token, KV head) into parts, the last block combining them: decode over
   long contexts; with at most 16 query heads per KV head by default its
   lean form, attn_tc_lean_k, in less shared memory; attn_tc_pipe_k, several
   spans per block, is a measured alternative, off). The query heads of a
   KV head are rows of the same tile, so each K and V span is staged once
   per KV head. */
#define TCA_WARPS 4
#define TCA_ROWS (TCA_WARPS * 16) /* query rows per block */
#define TCA_KS (SPAN + 8)         /* staged K: [d][SPAN keys], row stride in bf16 (272 bytes: no bank conflicts) */

static_assert(SPAN == 128, "the tc kernels hold a span's scores in 16 n-tiles of 8 keys");

/* The wide path's buffers: the scores, then p, of 16 rows ([16][SPAN + 4]
   floats) and their m and l ([2][16]). */
#define TCA_WIDE_BYTES ((size_t)16 * (SPAN + 4) * 4 + 2 * 16 * 4)

/* Shared memory of a tc block for head size D, in bytes: q hi and lo
   ([TCA_ROWS][D + 8] each), K ([D][TCA_KS]), V ([SPAN][D + 8]), the wide
   path's buffers. */
static __host__ __device__ constexpr size_t tca_smem(int D) {
    return (size_t)2 * TCA_ROWS * (D + 8) * 2 + (size_t)D * TCA_KS * 2 + (size_t)SPAN * (D + 8) * 2 + TCA_WIDE_BYTES;
}

/* The per-token data of a tc block (TCA_ROWS tokens at most). */
typedef struct tca_tile {
    int lo[TCA_ROWS], hi[TCA_ROWS]; /* keys of each token of the tile; hi < 0: not in this pass */
    const unsigned char *kb[SPAN / 16], *vb[SPAN / 16]; /* the span's pieces (NULL: nothing staged) */
    int plo, phi; /* keys of the pass: [plo, phi] */
    int row; /* the pass's KV row, -1: no more passes */
    unsigned long long done;
    int last;
} tca_tile;

static __device__ __forceinline__ void tca_mma(float c[4], const unsigned int a[4], unsigned int b0, unsigned int b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Four 8 x 8 b16 matrices from shared memory, transposed: lane i gives the
   address of row i % 8 of matrix i / 8. */
static __device__ __forceinline__ void tca_ldsm_t(unsigned int r[4], const void *p) {
    const unsigned int sa = (unsigned int)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(sa)
                 : "memory");
}

/* The bf16 pair (x, y) (x in the low half) and the pair of remainders. */
static __device__ __forceinline__ void tca_split2(float x, float y, unsigned int *hi, unsigned int *lo) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    const float2 hf = __bfloat1622float2(h);
    const __nv_bfloat162 l = __floats2bfloat162_rn(x - hf.x, y - hf.y);
    *hi = *(const unsigned int *)&h;
    *lo = *(const unsigned int *)&l;
}

/* Where 16-byte word c (< 2 D) of a span's K or V piece p (< SPAN / 16)
   lands in the stage: K [D][16] pieces side by side in rows of TCA_KS
   keys, V [16][D] pieces one under the other in rows of D + 8. */
template <int D> static __device__ __forceinline__ unsigned char *tca_kdst(unsigned char *sk, int p, int c) {
    return sk + ((size_t)(c >> 1) * TCA_KS + (size_t)(p * 16 + (c & 1) * 8)) * 2;
}
template <int D> static __device__ __forceinline__ unsigned char *tca_vdst(unsigned char *sv, int p, int c) {
    return sv + ((size_t)(p * 16 + c / (D / 8)) * (D + 8) + (size_t)(c % (D / 8)) * 8) * 2;
}

/* Stages span s of KV head hk of kv row `row` for keys [klo, khi] (the
   pieces holding them; the others zero) into sk and sv, every load in
   flight at once. Ends with the stage complete and visible. */
template <int D>
static __device__ void tca_stage(const attn_args *a, tca_tile *tl, unsigned char *sk, unsigned char *sv, int row,
                                 int hk, int s, int klo, int khi) {
    const ember_cu_kv *kv = &a->kv;
    const int tid = threadIdx.x, s0 = s * SPAN;
    const int j0 = s0 > klo ? s0 : klo, j1 = s0 + SPAN - 1 < khi ? s0 + SPAN - 1 : khi;
    if (tid < SPAN / 16) {
        const ember_cu_kv_ref ref = kv->refs[row];
        const ember_cu_kv_view *vw = &kv->view[ref.layer_set];
        const int b = s0 + tid * 16;
        const bool live = b + 15 >= j0 && b <= j1;
        tl->kb[tid] = live ? piece(kv, &ref, vw, b, hk, 1) : NULL;
        tl->vb[tid] = live ? piece(kv, &ref, vw, b, hk, 0) : NULL;
    }
    __syncthreads();
    /* a piece: K [D][16] and V [16][D], each 2 D chunks of 16 bytes */
    for (int i = tid; i < (SPAN / 16) * 2 * D; i += TCA_WARPS * 32) {
        const int p = i / (2 * D), c = i % (2 * D);
        unsigned char *dk = tca_kdst<D>(sk, p, c), *dv = tca_vdst<D>(sv, p, c);
        if (tl->kb[p]) {
            ember_cp16(dk, tl->kb[p] + (size_t)c * 16);
            ember_cp16(dv, tl->vb[p] + (size_t)c * 16);
        } else {
            *(uint4 *)dk = make_uint4(0, 0, 0, 0);
            *(uint4 *)dv = make_uint4(0, 0, 0, 0);
        }
    }
    ember_cp_commit();
    ember_cp_wait<0>();
    __syncthreads();
}

/* The state of the staged span s for the 16 rows of this warp (rows w * 16
   .. w * 16 + 15 of sq; lane (g, c) holds rows g and g + 8). lo / hi: the
   keys of the lane's two rows (hi < lo: none). Out: m[2], l[2] (every lane
   of the quad), o[D / 8][4] (c0, c1: row g, dimensions 8 n + 2 c + 0, 1;
   c2, c3: row g + 8). */
template <int D>
static __device__ __forceinline__ void tca_span(const attn_args *a, const unsigned short *sqh,
                                                const unsigned short *sql, const unsigned short *sk,
                                                const unsigned short *sv, int s, const int lo[2], const int hi[2],
                                                float m[2], float l[2], float o[D / 8][4]) {
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32, g = lane / 4, c = lane % 4;
    const int s0 = s * SPAN;
    float sc[SPAN / 8][4];
#pragma unroll
    for (int n = 0; n < SPAN / 8; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
    const int r0 = w * 16 + g, r1 = r0 + 8;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        unsigned int qh[4], ql[4];
        const int k0 = kk * 16 + 2 * c;
        qh[0] = *(const unsigned int *)(sqh + r0 * (D + 8) + k0);
        qh[1] = *(const unsigned int *)(sqh + r1 * (D + 8) + k0);
        qh[2] = *(const unsigned int *)(sqh + r0 * (D + 8) + k0 + 8);
        qh[3] = *(const unsigned int *)(sqh + r1 * (D + 8) + k0 + 8);
        ql[0] = *(const unsigned int *)(sql + r0 * (D + 8) + k0);
        ql[1] = *(const unsigned int *)(sql + r1 * (D + 8) + k0);
        ql[2] = *(const unsigned int *)(sql + r0 * (D + 8) + k0 + 8);
        ql[3] = *(const unsigned int *)(sql + r1 * (D + 8) + k0 + 8);
        const int mi = lane / 8, mr = lane % 8;
#pragma unroll
        for (int nn = 0; nn < SPAN / 16; nn++) {
            unsigned int b[4];
            tca_ldsm_t(b, sk + (size_t)(kk * 16 + (mi & 1) * 8 + mr) * TCA_KS + nn * 16 + (mi >> 1) * 8);
            tca_mma(sc[2 * nn], qh, b[0], b[1]);
            tca_mma(sc[2 * nn], ql, b[0], b[1]);
            tca_mma(sc[2 * nn + 1], qh, b[2], b[3]);
            tca_mma(sc[2 * nn + 1], ql, b[2], b[3]);
        }
    }
    /* scores, the row maxima and sums */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < SPAN / 8; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int j = s0 + 8 * n + 2 * c + e;
                const float v = score_of(a, sc[n][2 * h + e], j >= lo[h] && j <= hi[h]);
                sc[n][2 * h + e] = v;
                mx = fmaxf(mx, v);
            }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < SPAN / 8; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float v = sc[n][2 * h + e];
                const float p = v == -INFINITY ? 0.0f : expf(v - mx);
                sc[n][2 * h + e] = p;
                sum = sum + p;
            }
        sum = sum + __shfl_xor_sync(0xffffffffu, sum, 1);
        sum = sum + __shfl_xor_sync(0xffffffffu, sum, 2);
        m[h] = mx;
        l[h] = sum;
    }
    /* a = p v: keys in 16s as the k dimension */
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < SPAN / 16; kk++) {
        unsigned int ph[4], pl[4];
        tca_split2(sc[2 * kk][0], sc[2 * kk][1], &ph[0], &pl[0]);
        tca_split2(sc[2 * kk][2], sc[2 * kk][3], &ph[1], &pl[1]);
        tca_split2(sc[2 * kk + 1][0], sc[2 * kk + 1][1], &ph[2], &pl[2]);
        tca_split2(sc[2 * kk + 1][2], sc[2 * kk + 1][3], &ph[3], &pl[3]);
        const int mi = lane / 8, mr = lane % 8;
#pragma unroll
        for (int nn = 0; nn < D / 16; nn++) {
            unsigned int b[4];
            tca_ldsm_t(b, sv + (size_t)(kk * 16 + (mi & 1) * 8 + mr) * (D + 8) + nn * 16 + (mi >> 1) * 8);
            tca_mma(o[2 * nn], ph, b[0], b[1]);
            tca_mma(o[2 * nn], pl, b[0], b[1]);
            tca_mma(o[2 * nn + 1], ph, b[2], b[3]);
            tca_mma(o[2 * nn + 1], pl, b[2], b[3]);
        }
    }
}

/* tca_span for a block whose rows are rows 0 .. 15 only (one token of a
   decode step: its rep query heads), with the work spread over the four
   warps and the same bits: warp w computes the scores of keys 32 w .. 32 w
   + 31 (the same mma chain per score; n-tiles wholly outside [lo, hi] are
   not computed, their scores are -inf either way) into ss; the lanes of
   warps 0 and 1 then hold the rows as tca_span's quads do (thread 4 r + c:
   row r, keys 8 n + 2 c + e) and compute m, p and l in tca_span's order;
   warp w computes the dimensions of 16-column groups w and w + 4 of a = p v
   (each output the same chain of mma over the keys). Rows r < nrows have
   keys [lo, hi]; the others none. Out: every warp's m[2], l[2] (rows g, g +
   8) and o[i][j][4]: n-tile 2 (w + 4 i) + j in tca_span's layout. Ends with
   a barrier after the last read of ss (its caller may then restage).
   LEAN (attn_tc_lean_k): the lane's q fragments come from registers (qrh /
   qrl [kk]: what the lane would read from sqh / sql for k-step kk), ss may
   lie over sk (a barrier after the last read of sk, before the scores are
   written), and V may still be in flight when it starts (the thread waits
   for all its copies before the barrier after the scores). The same
   values into the same instructions, so the same bits. */
template <int D, int LEAN = 0>
static __device__ __forceinline__ void tca_span_wide(const attn_args *a, const unsigned short *sqh,
                                                     const unsigned short *sql, const unsigned short *sk,
                                                     const unsigned short *sv, float *ss, float *ml, int s, int nrows,
                                                     int lo, int hi, float m[2], float l[2], float o[2][2][4],
                                                     const unsigned int (*qrh)[4] = nullptr,
                                                     const unsigned int (*qrl)[4] = nullptr) {
    const int tid = threadIdx.x, lane = tid % 32, w = tid / 32, g = lane / 4, c = lane % 4;
    const int s0 = s * SPAN;
    constexpr int SS = SPAN + 4;
    {
        float sc[4][4];
#pragma unroll
        for (int n = 0; n < 4; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            unsigned int qh[4], ql[4];
            if (LEAN) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    qh[e] = qrh[kk][e];
                    ql[e] = qrl[kk][e];
                }
            } else {
                const int k0 = kk * 16 + 2 * c;
                qh[0] = *(const unsigned int *)(sqh + g * (D + 8) + k0);
                qh[1] = *(const unsigned int *)(sqh + (g + 8) * (D + 8) + k0);
                qh[2] = *(const unsigned int *)(sqh + g * (D + 8) + k0 + 8);
                qh[3] = *(const unsigned int *)(sqh + (g + 8) * (D + 8) + k0 + 8);
                ql[0] = *(const unsigned int *)(sql + g * (D + 8) + k0);
                ql[1] = *(const unsigned int *)(sql + (g + 8) * (D + 8) + k0);
                ql[2] = *(const unsigned int *)(sql + g * (D + 8) + k0 + 8);
                ql[3] = *(const unsigned int *)(sql + (g + 8) * (D + 8) + k0 + 8);
            }
            const int mi = lane / 8, mr = lane % 8;
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int nn = 2 * w + i;
                if (s0 + 16 * nn + 15 < lo || s0 + 16 * nn > hi) continue;
                unsigned int b[4];
                tca_ldsm_t(b, sk + (size_t)(kk * 16 + (mi & 1) * 8 + mr) * TCA_KS + nn * 16 + (mi >> 1) * 8);
                tca_mma(sc[2 * i], qh, b[0], b[1]);
                tca_mma(sc[2 * i], ql, b[0], b[1]);
                tca_mma(sc[2 * i + 1], qh, b[2], b[3]);
                tca_mma(sc[2 * i + 1], ql, b[2], b[3]);
            }
        }
        if (LEAN) __syncthreads(); /* every read of sk done: ss lies over it */
#pragma unroll
        for (int ln = 0; ln < 4; ln++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int r = g + 8 * h, n = 4 * w + ln, j = s0 + 8 * n + 2 * c + e;
                    ss[r * SS + 8 * n + 2 * c + e] = score_of(a, sc[ln][2 * h + e], r < nrows && j >= lo && j <= hi);
                }
    }
    if (LEAN) ember_cp_wait<0>(); /* this thread's V copies; the barrier makes everyone's visible */
    __syncthreads();
    if (tid < 64) { /* row tid / 4, quad lane tid % 4: tca_span's m, p and l */
        float *row = ss + (tid / 4) * SS;
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < SPAN / 8; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) mx = fmaxf(mx, row[8 * n + 2 * c + e]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < SPAN / 8; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float v = row[8 * n + 2 * c + e];
                const float p = v == -INFINITY ? 0.0f : expf(v - mx);
                row[8 * n + 2 * c + e] = p;
                sum = sum + p;
            }
        sum = sum + __shfl_xor_sync(0xffffffffu, sum, 1);
        sum = sum + __shfl_xor_sync(0xffffffffu, sum, 2);
        if (c == 0) {
            ml[tid / 4] = mx;
            ml[16 + tid / 4] = sum;
        }
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; h++) {
        m[h] = ml[g + 8 * h];
        l[h] = ml[16 + g + 8 * h];
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) o[i][j][0] = o[i][j][1] = o[i][j][2] = o[i][j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < SPAN / 16; kk++) {
        unsigned int ph[4], pl[4];
        const float *r0 = ss + g * SS + kk * 16 + 2 * c, *r1 = r0 + 8 * SS;
        tca_split2(r0[0], r0[1], &ph[0], &pl[0]);
        tca_split2(r1[0], r1[1], &ph[1], &pl[1]);
        tca_split2(r0[8], r0[9], &ph[2], &pl[2]);
        tca_split2(r1[8], r1[9], &ph[3], &pl[3]);
        const int mi = lane / 8, mr = lane % 8;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int nn = w + 4 * i;
            if (nn >= D / 16) continue;
            unsigned int b[4];
            tca_ldsm_t(b, sv + (size_t)(kk * 16 + (mi & 1) * 8 + mr) * (D + 8) + nn * 16 + (mi >> 1) * 8);
            tca_mma(o[i][0], ph, b[0], b[1]);
            tca_mma(o[i][0], pl, b[0], b[1]);
            tca_mma(o[i][1], ph, b[2], b[3]);
            tca_mma(o[i][1], pl, b[2], b[3]);
        }
    }
    __syncthreads(); /* ss and ml are free again */
}

/* The factor of a state with maximum M in a combine whose new maximum is
   mn: combine()'s ca / cb. The tc kernels combine each row element as
   combine() does: L = L ca + l cb, A = A ca + a cb, M = mn. */
static __device__ __forceinline__ float tca_scale(float M, float mn) {
    return M == -INFINITY ? 0.0f : expf(M - mn);
}

/* q rows of the tile into sqh / sql, split (rows whose token is not in the
   pass: zero). Row i: token t0 + i / rep of the tile, query head hk * rep
   + i % rep. */
template <int D>
static __device__ void tca_load_q(const attn_args *a, const tca_tile *tl, unsigned short *sqh, unsigned short *sql,
                                  int t0, int ntok, int hk) {
    for (int i = threadIdx.x; i < TCA_ROWS * (D / 2); i += TCA_WARPS * 32) {
        const int r = i / (D / 2), d = (i % (D / 2)) * 2, tk = r / a->rep;
        float x = 0.0f, y = 0.0f;
        if (tk < ntok && tl->hi[tk] >= 0) {
            const float *q = a->q + ((size_t)(t0 + tk) * (size_t)a->Hq + (size_t)(hk * a->rep + r % a->rep)) * D;
            x = q[d];
            y = q[d + 1];
        }
        unsigned int h, l;
        tca_split2(x, y, &h, &l);
        *(unsigned int *)(sqh + r * (D + 8) + d) = h;
        *(unsigned int *)(sql + r * (D + 8) + d) = l;
    }
}

/* tc walk: block (x, hk) takes tokens t0 = x * tq .. t0 + tq - 1 (tq *
   rep <= TCA_ROWS) and KV head hk; in passes, one per KV row among those
   tokens, it stages each span of the pass's keys once and computes every
   row's state, combining the spans of each row in increasing order. WIDE
   (tq = 1, rep <= 16: a decode step's token) through tca_span_wide, the
   work of each span over the four warps; else a warp per 16 rows. */
template <int D, int WIDE>
static __global__ void __launch_bounds__(TCA_WARPS * 32, 2) attn_tc_walk_k(attn_args a, int tq) {
    ember_pdl_enter();
    __shared__ tca_tile tl;
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned short *sqh = (unsigned short *)smem, *sql = sqh + TCA_ROWS * (D + 8);
    unsigned char *sk = (unsigned char *)(sql + TCA_ROWS * (D + 8)), *sv = sk + (size_t)D * TCA_KS * 2;
    float *ss = (float *)(sv + (size_t)SPAN * (D + 8) * 2), *ml = ss + 16 * (SPAN + 4);
    const int hk = blockIdx.y, t0 = (int)blockIdx.x * tq, T = a.kv.T;
    const int ntok = T - t0 < tq ? T - t0 : tq;
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32, g = lane / 4, c = lane % 4;
    if (threadIdx.x == 0) tl.done = 0;
    __syncthreads();
    for (;;) {
        if (threadIdx.x == 0) { /* the next pass: the tokens of the first KV row not done */
            int row = -1, plo = 0x7fffffff, phi = -1;
            unsigned long long done = tl.done;
            for (int k = 0; k < ntok; k++) {
                const int r = a.kv.row[t0 + k];
                if (row < 0 && !(done >> k & 1)) row = r;
                int lo, hi;
                keys_of(&a, t0 + k, &lo, &hi);
                if (row >= 0 && r == row && !(done >> k & 1)) {
                    done |= 1ull << k;
                    tl.lo[k] = lo;
                    tl.hi[k] = hi;
                    plo = lo < plo ? lo : plo;
                    phi = hi > phi ? hi : phi;
                } else {
                    tl.lo[k] = 0;
                    tl.hi[k] = -1;
                }
            }
            tl.done = done;
            tl.row = row;
            tl.plo = plo;
            tl.phi = phi;
        }
        __syncthreads();
        const int row = tl.row, plo = tl.plo, phi = tl.phi;
        if (row < 0) break;
        tca_load_q<D>(&a, &tl, sqh, sql, t0, ntok, hk);
        if (WIDE) { /* tq = 1, rep <= 16: one token, the wide path, every warp on each span */
            float M[2] = {-INFINITY, -INFINITY}, L[2] = {0.0f, 0.0f}, A[2][2][4];
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) A[i][j][0] = A[i][j][1] = A[i][j][2] = A[i][j][3] = 0.0f;
            for (int s = plo / SPAN; s <= phi / SPAN; s++) {
                __syncthreads(); /* every warp is done with the last span (and q is stored) */
                tca_stage<D>(&a, &tl, sk, sv, row, hk, s, plo, phi);
                float m[2], l[2], o[2][2][4];
                tca_span_wide<D>(&a, sqh, sql, (const unsigned short *)sk, (const unsigned short *)sv, ss, ml, s, a.rep,
                                 plo, phi, m, l, o);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    if (g + 8 * h >= a.rep) continue;
                    const float mn = fmaxf(M[h], m[h]);
                    const float ca = tca_scale(M[h], mn), cb = tca_scale(m[h], mn);
                    L[h] = L[h] * ca + l[h] * cb;
#pragma unroll
                    for (int i = 0; i < 2; i++)
#pragma unroll
                        for (int j = 0; j < 2; j++) {
                            A[i][j][2 * h] = A[i][j][2 * h] * ca + o[i][j][2 * h] * cb;
                            A[i][j][2 * h + 1] = A[i][j][2 * h + 1] * ca + o[i][j][2 * h + 1] * cb;
                        }
                    M[h] = mn;
                }
            }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if (g + 8 * h >= a.rep) continue;
                float *out = a.out + ((size_t)t0 * (size_t)a.Hq + (size_t)(hk * a.rep + g + 8 * h)) * D;
                const float inv = L[h] > 0.0f ? 1.0f / L[h] : 0.0f;
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        const int nn = w + 4 * i;
                        if (nn >= D / 16) continue;
                        out[8 * (2 * nn + j) + 2 * c] = A[i][j][2 * h] * inv;
                        out[8 * (2 * nn + j) + 2 * c + 1] = A[i][j][2 * h + 1] * inv;
                    }
            }
            __syncthreads(); /* tl is read before the next pass rewrites it */
            continue;
        }
        /* the lane's two rows */
        int lo[2], hi[2], tk[2];
        bool warp_live = false;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = w * 16 + g + 8 * h;
            tk[h] = r / a.rep;
            lo[h] = 0;
            hi[h] = -1;
            if (tk[h] < ntok && r < tq * a.rep) {
                lo[h] = tl.lo[tk[h]];
                hi[h] = tl.hi[tk[h]];
            }
        }
        for (int r = w * 16; r < w * 16 + 16 && r < tq * a.rep; r++)
            if (r / a.rep < ntok && tl.hi[r / a.rep] >= 0) warp_live = true;
        float M[2] = {-INFINITY, -INFINITY}, L[2] = {0.0f, 0.0f}, A[D / 8][4];
#pragma unroll
        for (int n = 0; n < D / 8; n++) A[n][0] = A[n][1] = A[n][2] = A[n][3] = 0.0f;
        for (int s = plo / SPAN; s <= phi / SPAN; s++) {
            __syncthreads(); /* every warp is done with the last span (and q is stored) */
            tca_stage<D>(&a, &tl, sk, sv, row, hk, s, plo, phi);
            if (!warp_live) continue;
            float m[2], l[2], o[D / 8][4];
            tca_span<D>(&a, sqh, sql, (const unsigned short *)sk, (const unsigned short *)sv, s, lo, hi, m, l, o);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if (hi[h] < lo[h] || s < lo[h] / SPAN || s > hi[h] / SPAN) continue; /* not a span of the row */
                const float mn = fmaxf(M[h], m[h]);
                const float ca = tca_scale(M[h], mn), cb = tca_scale(m[h], mn);
                L[h] = L[h] * ca + l[h] * cb;
#pragma unroll
                for (int n = 0; n < D / 8; n++) {
                    A[n][2 * h] = A[n][2 * h] * ca + o[n][2 * h] * cb;
                    A[n][2 * h + 1] = A[n][2 * h + 1] * ca + o[n][2 * h + 1] * cb;
                }
                M[h] = mn;
            }
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if (hi[h] < lo[h]) continue;
            const int r = w * 16 + g + 8 * h;
            float *out = a.out + ((size_t)(t0 + tk[h]) * (size_t)a.Hq + (size_t)(hk * a.rep + r % a.rep)) * D;
            const float inv = L[h] > 0.0f ? 1.0f / L[h] : 0.0f;
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                out[8 * n + 2 * c] = A[n][2 * h] * inv;
                out[8 * n + 2 * c + 1] = A[n][2 * h + 1] * inv;
            }
        }
        __syncthreads(); /* tl is read before the next pass rewrites it */
    }
}

/* Writes the wide path's state of span `span` of (t, hk) to the split
   scratch (2 + D floats a query row: m, l, then the output): for the lane's
   query rows r = g + 8 h (< rep), m and l from lane c = 0 of warp 0, and
   the lane's output fragments o (tca_span_wide's layout). */
template <int D>
static __device__ __forceinline__ void tca_store_wide(const attn_args *a, int t, int hk, size_t span, int g, int w,
                                                      int c, const float m[2], const float l[2],
                                                      const float o[2][2][4]) {
    const size_t stride = (size_t)(2 + D);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = g + 8 * h;
        if (r >= a->rep) continue;
        const size_t u = (size_t)t * (size_t)a->Hq + (size_t)(hk * a->rep + r);
        float *part = a->parts + (u * (size_t)a->n_span + span) * stride;
        if (w == 0 && c == 0) {
            part[0] = m[h];
            part[1] = l[h];
        }
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int nn = w + 4 * i;
                if (nn >= D / 16) continue;
                part[2 + 8 * (2 * nn + j) + 2 * c] = o[i][j][2 * h];
                part[2 + 8 * (2 * nn + j) + 2 * c + 1] = o[i][j][2 * h + 1];
            }
    }
}

/* The last block of (t, hk) to finish: every query head's spans 0 .. ns - 1
   of the split scratch combined in increasing order with combine()'s
   arithmetic (per span x: mn = max(M, m_x), ca = tca_scale(M, mn), cb =
   tca_scale(m_x, mn), L = L ca + l_x cb, A = A ca + a_x cb, M = mn; then
   out = A (1 / L)), out written, the counter zeroed. ca, cb and L depend
   on the query row alone, so where the block's free shared memory fs
   (fs_bytes) holds them for every span, one thread per row computes them
   once and the outputs of the row read them: the same operations on the
   same values as computing them per output (the fallback below), so the
   same bits, with the exponentials off the outputs' chains. A thread's
   outputs (column tid % D of rows tid / D, + NT / D, ...) go four rows at
   a time and TCA_CB spans at a time, their loads of the parts issued
   together. Every thread of the block calls it (a barrier). */
#define TCA_CB 8
template <int D>
static __device__ void tca_combine_parts(const attn_args *a, int t, int hk, int gi, int ns, float *fs,
                                         size_t fs_bytes) {
    constexpr int NT = TCA_WARPS * 32, RS = NT / D; /* rows a pass of the block covers */
    static_assert(NT % D == 0, "a pass covers whole rows");
    constexpr size_t stride = (size_t)(2 + D);
    const int rep = a->rep, tid = threadIdx.x;
    const size_t u0 = (size_t)t * (size_t)a->Hq + (size_t)(hk * rep); /* the unit of query row 0 */
    const size_t rstride = (size_t)a->n_span * stride;                /* from one row's parts to the next */
    const float *p0 = a->parts + u0 * rstride;
    if ((size_t)rep * ((size_t)ns * 2 + 1) * sizeof(float) <= fs_bytes) {
        float *fca = fs, *fcb = fs + (size_t)rep * ns, *finv = fs + (size_t)2 * rep * ns;
        for (int r = tid; r < rep; r += NT) {
            const float *pr = p0 + (size_t)r * rstride;
            float M = -INFINITY, L = 0.0f;
            for (int x0 = 0; x0 < ns; x0 += TCA_CB) {
                float m[TCA_CB], l[TCA_CB];
#pragma unroll
                for (int j = 0; j < TCA_CB; j++) {
                    const bool in = x0 + j < ns;
                    m[j] = in ? __ldcg(pr + (size_t)(x0 + j) * stride) : 0.0f;
                    l[j] = in ? __ldcg(pr + (size_t)(x0 + j) * stride + 1) : 0.0f;
                }
#pragma unroll
                for (int j = 0; j < TCA_CB; j++) {
                    if (x0 + j >= ns) break;
                    const float mn = fmaxf(M, m[j]);
                    const float ca = tca_scale(M, mn), cb = tca_scale(m[j], mn);
                    L = L * ca + l[j] * cb;
                    M = mn;
                    fca[(size_t)r * ns + x0 + j] = ca;
                    fcb[(size_t)r * ns + x0 + j] = cb;
                }
            }
            finv[r] = L > 0.0f ? 1.0f / L : 0.0f;
        }
        __syncthreads();
        const int d = tid % D;
        for (int rb = tid / D; rb < rep; rb += 4 * RS) {
            float A[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int x0 = 0; x0 < ns; x0 += TCA_CB) {
                float o[4][TCA_CB];
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const int r = rb + k * RS;
                    const float *pr = p0 + (size_t)(r < rep ? r : 0) * rstride + 2 + d;
#pragma unroll
                    for (int j = 0; j < TCA_CB; j++)
                        o[k][j] = r < rep && x0 + j < ns ? __ldcg(pr + (size_t)(x0 + j) * stride) : 0.0f;
                }
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const int r = rb + k * RS;
                    if (r >= rep) break;
                    const float *ca = fca + (size_t)r * ns + x0, *cb = fcb + (size_t)r * ns + x0;
#pragma unroll
                    for (int j = 0; j < TCA_CB; j++) {
                        if (x0 + j >= ns) break;
                        A[k] = A[k] * ca[j] + o[k][j] * cb[j];
                    }
                }
            }
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int r = rb + k * RS;
                if (r < rep) a->out[(u0 + (size_t)r) * D + d] = A[k] * finv[r];
            }
        }
    } else {
        for (int i = tid; i < rep * D; i += NT) {
            const int r = i / D, d = i % D;
            const float *pr = p0 + (size_t)r * rstride;
            float M = -INFINITY, L = 0.0f, A = 0.0f;
            for (int x = 0; x < ns; x++) {
                const float *px = pr + (size_t)x * stride;
                const float m = __ldcg(px), l = __ldcg(px + 1), o = __ldcg(px + 2 + d);
                const float mn = fmaxf(M, m);
                const float ca = tca_scale(M, mn), cb = tca_scale(m, mn);
                L = L * ca + l * cb;
                A = A * ca + o * cb;
                M = mn;
            }
            const float inv = L > 0.0f ? 1.0f / L : 0.0f;
            a->out[(u0 + (size_t)r) * D + d] = A * inv;
        }
    }
    if (tid == 0) a->count[gi] = 0;
}

/* tc split: block (x, t * H + hk) computes span lo / SPAN + x of token t's
   rows of KV head hk (its rep query heads) into parts, as attn_split_k
   does per query head; the last block of (t, hk) to finish (a counter)
   combines each head's spans in increasing order (combine()'s arithmetic,
   the walk's sequence), and zeroes the counter. */
template <int D> static __global__ void __launch_bounds__(TCA_WARPS * 32, 2) attn_tc_split_k(attn_args a) {
    ember_pdl_enter();
    __shared__ tca_tile tl;
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned short *sqh = (unsigned short *)smem, *sql = sqh + TCA_ROWS * (D + 8);
    unsigned char *sk = (unsigned char *)(sql + TCA_ROWS * (D + 8)), *sv = sk + (size_t)D * TCA_KS * 2;
    float *ss = (float *)(sv + (size_t)SPAN * (D + 8) * 2), *ml = ss + 16 * (SPAN + 4);
    const int gi = blockIdx.y, t = gi / a.kv.H, hk = gi % a.kv.H;
    int tlo, thi;
    keys_of(&a, t, &tlo, &thi);
    const int s = tlo / SPAN + (int)blockIdx.x, ns = thi / SPAN - tlo / SPAN + 1;
    if (s > thi / SPAN) return;
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32, g = lane / 4, c = lane % 4;
    if (threadIdx.x == 0) {
        tl.lo[0] = tlo;
        tl.hi[0] = thi;
    }
    __syncthreads();
    tca_load_q<D>(&a, &tl, sqh, sql, t, 1, hk);
    tca_stage<D>(&a, &tl, sk, sv, a.kv.row[t], hk, s, tlo, thi);
    const size_t stride = (size_t)(2 + D);
    if (a.rep <= 16) { /* the wide path: every warp on the span */
        float m[2], l[2], o[2][2][4];
        tca_span_wide<D>(&a, sqh, sql, (const unsigned short *)sk, (const unsigned short *)sv, ss, ml, s, a.rep, tlo,
                         thi, m, l, o);
        tca_store_wide<D>(&a, t, hk, blockIdx.x, g, w, c, m, l, o);
    } else if (w * 16 < a.rep) {
        int lo[2], hi[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const bool live = w * 16 + g + 8 * h < a.rep;
            lo[h] = live ? tlo : 0;
            hi[h] = live ? thi : -1;
        }
        float m[2], l[2], o[D / 8][4];
        tca_span<D>(&a, sqh, sql, (const unsigned short *)sk, (const unsigned short *)sv, s, lo, hi, m, l, o);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = w * 16 + g + 8 * h;
            if (r >= a.rep) continue;
            const size_t u = (size_t)t * (size_t)a.Hq + (size_t)(hk * a.rep + r);
            float *part = a.parts + (u * (size_t)a.n_span + blockIdx.x) * stride;
            if (c == 0) {
                part[0] = m[h];
                part[1] = l[h];
            }
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                part[2 + 8 * n + 2 * c] = o[n][2 * h];
                part[2 + 8 * n + 2 * c + 1] = o[n][2 * h + 1];
            }
        }
    }
    __threadfence(); /* this block's parts are visible before the count says so */
    __syncthreads();
    if (threadIdx.x == 0) tl.last = atomicAdd(&a.count[gi], 1) == ns - 1;
    __syncthreads();
    if (!tl.last) return;
    __threadfence();
    tca_combine_parts<D>(&a, t, hk, gi, ns, (float *)smem, tca_smem(D));
}

/* tc split, pipelined (decode over long contexts with many tokens: the
   split mode's cases where rep <= 16 and the grid stays full with several
   spans per block). Block (x, t * H + hk) takes spans x * spb .. x * spb +
   spb - 1 of token t's spans (counted from its first) for KV head hk, each
   span computed exactly as attn_tc_split_k's wide path computes it
   (tca_span_wide on the same staged values, q rows split the same way),
   its state written to the same place of the split scratch; the last block
   of (t, hk) combines every span in increasing order with the same
   arithmetic, so the bits of attn_tc_split_k. What changes is only the
   schedule: the span pieces of all the block's spans are looked up once,
   and span j + 1 is copied (cp.async) into a second stage while span j is
   computed, so the loads of a block run under its computation; the
   per-block costs (q, the lookups, the counter) are paid once per spb
   spans. One block per SM at D = 128 (two stages of K and V: 156 KB);
   measured slower than attn_tc_split_k and the lean kernel (two and three
   blocks per SM), so off unless EMBER_CUDA_ATTN_PIPE asks for it. */
#define TCP_MAX_SPB 8
template <int D> static __host__ __device__ constexpr size_t tcp_smem(void) {
    return (size_t)2 * 16 * (D + 8) * 2 + (size_t)2 * ((size_t)D * TCA_KS * 2 + (size_t)SPAN * (D + 8) * 2) +
           TCA_WIDE_BYTES;
}

/* Queues the copy of the 8 pieces of one span (pk / pv: their K and V
   starts, NULL: not staged, zero) into sk / sv in tca_stage's layout. */
template <int D>
static __device__ __forceinline__ void tcp_issue(unsigned char *sk, unsigned char *sv,
                                                 const unsigned char *const *pk, const unsigned char *const *pv) {
    for (int i = threadIdx.x; i < (SPAN / 16) * 2 * D; i += TCA_WARPS * 32) {
        const int p = i / (2 * D), c = i % (2 * D);
        unsigned char *dk = tca_kdst<D>(sk, p, c), *dv = tca_vdst<D>(sv, p, c);
        if (pk[p]) {
            ember_cp16(dk, pk[p] + (size_t)c * 16);
            ember_cp16(dv, pv[p] + (size_t)c * 16);
        } else {
            *(uint4 *)dk = make_uint4(0, 0, 0, 0);
            *(uint4 *)dv = make_uint4(0, 0, 0, 0);
        }
    }
    ember_cp_commit();
}

template <int D> static __global__ void __launch_bounds__(TCA_WARPS * 32, 1) attn_tc_pipe_k(attn_args a, int spb) {
    ember_pdl_enter();
    __shared__ const unsigned char *pk[TCP_MAX_SPB * (SPAN / 16)], *pv[TCP_MAX_SPB * (SPAN / 16)];
    __shared__ int last;
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned short *sqh = (unsigned short *)smem, *sql = sqh + 16 * (D + 8);
    unsigned char *st = (unsigned char *)(sql + 16 * (D + 8)); /* stage b: K at st + b * SB, V after it */
    constexpr size_t SKB = (size_t)D * TCA_KS * 2, SB = SKB + (size_t)SPAN * (D + 8) * 2;
    float *ss = (float *)(st + 2 * SB), *ml = ss + 16 * (SPAN + 4);
    const int gi = blockIdx.y, t = gi / a.kv.H, hk = gi % a.kv.H, tid = threadIdx.x;
    int tlo, thi;
    keys_of(&a, t, &tlo, &thi);
    const int sf = tlo / SPAN, ns = thi / SPAN - sf + 1, x0 = (int)blockIdx.x * spb;
    if (x0 >= ns) return;
    const int n = ns - x0 < spb ? ns - x0 : spb, nblk = (ns + spb - 1) / spb;
    const int lane = tid % 32, w = tid / 32, g = lane / 4, c = lane % 4;
    if (tid < n * (SPAN / 16)) { /* the pieces of every span of the block (tca_stage's choice) */
        const ember_cu_kv *kv = &a.kv;
        const ember_cu_kv_ref ref = kv->refs[kv->row[t]];
        const ember_cu_kv_view *vw = &kv->view[ref.layer_set];
        const int b = (sf + x0 + tid / (SPAN / 16)) * SPAN + (tid % (SPAN / 16)) * 16;
        const bool live = b + 15 >= tlo && b <= thi;
        pk[tid] = live ? piece(kv, &ref, vw, b, hk, 1) : NULL;
        pv[tid] = live ? piece(kv, &ref, vw, b, hk, 0) : NULL;
    }
    __syncthreads();
    tcp_issue<D>(st, st + SKB, pk, pv);
    for (int i = tid; i < 16 * (D / 2); i += TCA_WARPS * 32) { /* q rows as tca_load_q gives them (one token) */
        const int r = i / (D / 2), d = (i % (D / 2)) * 2;
        float qx = 0.0f, qy = 0.0f;
        if (r < a.rep) {
            const float *q = a.q + ((size_t)t * (size_t)a.Hq + (size_t)(hk * a.rep + r)) * D;
            qx = q[d];
            qy = q[d + 1];
        }
        unsigned int h, l;
        tca_split2(qx, qy, &h, &l);
        *(unsigned int *)(sqh + r * (D + 8) + d) = h;
        *(unsigned int *)(sql + r * (D + 8) + d) = l;
    }
    for (int j = 0; j < n; j++) {
        unsigned char *sk = st + (size_t)(j & 1) * SB;
        if (j + 1 < n) { /* the next span into the other stage (free: its span ended with a barrier) */
            unsigned char *nk = st + (size_t)((j + 1) & 1) * SB;
            tcp_issue<D>(nk, nk + SKB, pk + (j + 1) * (SPAN / 16), pv + (j + 1) * (SPAN / 16));
            ember_cp_wait<1>();
        } else {
            ember_cp_wait<0>();
        }
        __syncthreads(); /* span j's stage (and q) complete and visible */
        const int s = sf + x0 + j;
        float m[2], l[2], o[2][2][4];
        tca_span_wide<D>(&a, sqh, sql, (const unsigned short *)sk, (const unsigned short *)(sk + SKB), ss, ml, s,
                         a.rep, tlo, thi, m, l, o);
        tca_store_wide<D>(&a, t, hk, (size_t)(x0 + j), g, w, c, m, l, o);
    }
    __threadfence(); /* this block's parts are visible before the count says so */
    __syncthreads();
    if (tid == 0) last = atomicAdd(&a.count[gi], 1) == nblk - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    tca_combine_parts<D>(&a, t, hk, gi, ns, (float *)smem, tcp_smem<D>());
}

/* tc split, lean (the split mode's cases with rep <= 16, the default): the
   blocks of attn_tc_split_k's wide path, each span's state computed the
   same way into the same place of the scratch and combined by the last
   block the same way, so its bits; in less shared memory, so that three
   blocks share a multiprocessor at D = 128 (attn_tc_split_k: two): q's
   fragments live in registers (each lane splits the values tca_load_q
   would have put where it reads them), the scores lie over the staged K
   once its last read is done, and only 16 q rows are kept. V is copied as
   a second group, still landing while the scores are computed. */
static __host__ __device__ constexpr bool tcl_ss_over_k(int D) {
    return (size_t)D * TCA_KS * 2 >= TCA_WIDE_BYTES;
}
template <int D> static __host__ __device__ constexpr size_t tcl_smem(void) {
    return (size_t)D * TCA_KS * 2 + (size_t)SPAN * (D + 8) * 2 + (tcl_ss_over_k(D) ? 0 : TCA_WIDE_BYTES);
}

template <int D> static __global__ void __launch_bounds__(TCA_WARPS * 32, 3) attn_tc_lean_k(attn_args a) {
    ember_pdl_enter();
    __shared__ const unsigned char *pk[SPAN / 16], *pv[SPAN / 16];
    __shared__ int last;
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned char *sk = smem, *sv = sk + (size_t)D * TCA_KS * 2;
    float *ss = tcl_ss_over_k(D) ? (float *)sk : (float *)(sv + (size_t)SPAN * (D + 8) * 2);
    float *ml = ss + 16 * (SPAN + 4);
    const int gi = blockIdx.y, t = gi / a.kv.H, hk = gi % a.kv.H, tid = threadIdx.x;
    int tlo, thi;
    keys_of(&a, t, &tlo, &thi);
    const int s = tlo / SPAN + (int)blockIdx.x, ns = thi / SPAN - tlo / SPAN + 1;
    if (s > thi / SPAN) return;
    if (tid < SPAN / 16) { /* tca_stage's pieces */
        const ember_cu_kv *kv = &a.kv;
        const ember_cu_kv_ref ref = kv->refs[kv->row[t]];
        const ember_cu_kv_view *vw = &kv->view[ref.layer_set];
        const int b = s * SPAN + tid * 16;
        const bool live = b + 15 >= tlo && b <= thi;
        pk[tid] = live ? piece(kv, &ref, vw, b, hk, 1) : NULL;
        pv[tid] = live ? piece(kv, &ref, vw, b, hk, 0) : NULL;
    }
    __syncthreads();
    /* K, then V: two groups in tca_stage's layout, issued before q is read so that they land while
       q is split. Thread tid copies 16-byte word cc of piece p: a piece is 2 D words, NT threads
       take NT / (2 D) pieces at once (D < 64) or a piece in 2 D / NT turns (D >= 64). */
    {
        constexpr int NT = TCA_WARPS * 32, W = 2 * D;
        constexpr int PPI = NT >= W ? NT / W : 1, IPP = W >= NT ? W / NT : 1;
        const int p0 = PPI > 1 ? tid / W : 0, c0 = PPI > 1 ? tid % W : tid;
#pragma unroll
        for (int kv2 = 0; kv2 < 2; kv2++) {
#pragma unroll
            for (int it = 0; it < (SPAN / 16) * IPP / PPI; it++) {
                const int p = (it / IPP) * PPI + p0, cc = c0 + (it % IPP) * NT;
                unsigned char *dst = kv2 == 0 ? tca_kdst<D>(sk, p, cc) : tca_vdst<D>(sv, p, cc);
                const unsigned char *src = kv2 == 0 ? pk[p] : pv[p];
                if (src)
                    ember_cp16(dst, src + (size_t)cc * 16);
                else
                    *(uint4 *)dst = make_uint4(0, 0, 0, 0);
            }
            ember_cp_commit();
        }
    }
    const int lane = tid % 32, w = tid / 32, g = lane / 4, c = lane % 4;
    /* q: lane (g, c) holds rows g and g + 8, elements kk * 16 + 2 c + {0, 1, 8, 9} (rows past rep: zeros,
       whose split is zeros) */
    unsigned int qh[D / 16][4], ql[D / 16][4];
    {
        const float *q0 = g < a.rep ? a.q + ((size_t)t * (size_t)a.Hq + (size_t)(hk * a.rep + g)) * D : nullptr;
        const float *q1 = g + 8 < a.rep ? a.q + ((size_t)t * (size_t)a.Hq + (size_t)(hk * a.rep + g + 8)) * D : nullptr;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            const int k0 = kk * 16 + 2 * c;
            tca_split2(q0 ? q0[k0] : 0.0f, q0 ? q0[k0 + 1] : 0.0f, &qh[kk][0], &ql[kk][0]);
            tca_split2(q0 ? q0[k0 + 8] : 0.0f, q0 ? q0[k0 + 9] : 0.0f, &qh[kk][2], &ql[kk][2]);
            qh[kk][1] = ql[kk][1] = qh[kk][3] = ql[kk][3] = 0u;
        }
        if (a.rep > 8) /* a uniform branch: rows 8 .. 15 exist */
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                const int k0 = kk * 16 + 2 * c;
                tca_split2(q1 ? q1[k0] : 0.0f, q1 ? q1[k0 + 1] : 0.0f, &qh[kk][1], &ql[kk][1]);
                tca_split2(q1 ? q1[k0 + 8] : 0.0f, q1 ? q1[k0 + 9] : 0.0f, &qh[kk][3], &ql[kk][3]);
            }
    }
    ember_cp_wait<1>(); /* K */
    __syncthreads();
    float m[2], l[2], o[2][2][4];
    tca_span_wide<D, 1>(&a, nullptr, nullptr, (const unsigned short *)sk, (const unsigned short *)sv, ss, ml, s, a.rep,
                        tlo, thi, m, l, o, qh, ql);
    tca_store_wide<D>(&a, t, hk, blockIdx.x, g, w, c, m, l, o);
    __threadfence(); /* this block's parts are visible before the count says so */
    __syncthreads();
    if (tid == 0) last = atomicAdd(&a.count[gi], 1) == ns - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    tca_combine_parts<D>(&a, t, hk, gi, ns, (float *)smem, tcl_smem<D>());
}

/* Whether the tc kernels take this layer (bf16 K and V, head size 16, 32,
   64 or 128, 16-byte aligned pieces, at most TCA_ROWS query heads per KV
   head): properties of the layer, never of the batch. */
static bool tca_takes(const attn_args *a, int enc) {
    const int D = a->kv.D;
    return enc == EMBER_CU_BF16 && a->vec16 && a->rep <= TCA_ROWS && (D == 16 || D == 32 || D == 64 || D == 128);
}

/* Pipelined tc split (attn_tc_pipe_k; the same bits as attn_tc_split_k),
   from EMBER_CUDA_ATTN_PIPE (a measuring aid): 0 (the default) never; 1
   picks the spans per block, the largest power of two up to TCP_MAX_SPB
   that keeps at least TCP_MIN_WAVES blocks per multiprocessor; N >= 2 asks
   for N. Measured slower than the lean kernel at 64 and 256 rows (one block
   per SM: bench/RESULTS.md), so off. */
#define TCP_MIN_WAVES 4
extern "C" {
int ember_cu_attn_pipe = 0;
int ember_cu_attn_lean = 1;
}
static int g_attn_sms = 132; /* multiprocessors of the device (ember_cu_attn_prepare) */

/* Spans per block of the pipelined split for T tokens, H KV heads, n_span
   spans (1: the plain split kernel). */
static int tcp_spans_per_block(int T, int H, int n_span) {
    if (ember_cu_attn_pipe <= 0) return 1;
    const long long units = (long long)T * H;
    if (ember_cu_attn_pipe >= 2) {
        int spb = ember_cu_attn_pipe < TCP_MAX_SPB ? ember_cu_attn_pipe : TCP_MAX_SPB;
        return spb < n_span ? spb : n_span;
    }
    int spb = 1;
    while (spb * 2 <= TCP_MAX_SPB && spb * 2 <= n_span &&
           (long long)((n_span + spb * 2 - 1) / (spb * 2)) * units >= (long long)TCP_MIN_WAVES * g_attn_sms)
        spb *= 2;
    return spb;
}

template <int D> static cudaError_t tca_launch(cudaStream_t stream, const attn_args *a, int mode, int tq) {
    const size_t smem = tca_smem(D);
    const int spb = mode == EMBER_CU_ATTN_SPLIT && a->rep <= 16 ? tcp_spans_per_block(a->kv.T, a->kv.H, a->n_span) : 1;
    if (spb >= 2)
        return ember_launch(attn_tc_pipe_k<D>, dim3((unsigned)((a->n_span + spb - 1) / spb), (unsigned)(a->kv.T * a->kv.H), 1),
                            dim3(TCA_WARPS * 32), tcp_smem<D>(), stream, *a, spb);
    if (mode == EMBER_CU_ATTN_SPLIT && a->rep <= 16 && ember_cu_attn_lean)
        return ember_launch(attn_tc_lean_k<D>, dim3((unsigned)a->n_span, (unsigned)(a->kv.T * a->kv.H), 1),
                            dim3(TCA_WARPS * 32), tcl_smem<D>(), stream, *a);
    if (mode == EMBER_CU_ATTN_SPLIT)
        return ember_launch(attn_tc_split_k<D>, dim3((unsigned)a->n_span, (unsigned)(a->kv.T * a->kv.H), 1),
                            dim3(TCA_WARPS * 32), smem, stream, *a);
    if (tq < 1 || tq * a->rep > TCA_ROWS) tq = TCA_ROWS / a->rep;
    if (tq == 1 && a->rep <= 16)
        return ember_launch(attn_tc_walk_k<D, 1>, dim3((unsigned)a->kv.T, (unsigned)a->kv.H, 1), dim3(TCA_WARPS * 32),
                            smem, stream, *a, tq);
    return ember_launch(attn_tc_walk_k<D, 0>, dim3((unsigned)((a->kv.T + tq - 1) / tq), (unsigned)a->kv.H, 1),
                        dim3(TCA_WARPS * 32), smem, stream, *a, tq);
}

static cudaError_t tca_attention(cudaStream_t stream, const attn_args *a, int mode, int tq) {
    switch (a->kv.D) {
    case 16: return tca_launch<16>(stream, a, mode, tq);
    case 32: return tca_launch<32>(stream, a, mode, tq);
    case 64: return tca_launch<64>(stream, a, mode, tq);
    case 128: return tca_launch<128>(stream, a, mode, tq);
    default: return cudaErrorInvalidValue;
    }
}

/* Grouped split on (the default; 0: attn_split_k, a measuring aid set from
   EMBER_CUDA_ATTN_GROUP), where it makes at least GROUP_MIN_BLOCKS blocks. */
#define GROUP_MIN_BLOCKS 512
extern "C" {
int ember_cu_attn_group = 1;
}

template <int ENC>
static cudaError_t attn_launch(cudaStream_t stream, const attn_args *a, int mode, unsigned units) {
    if (mode == EMBER_CU_ATTN_FUSED) {
        return ember_launch(attn_fused_k<ENC, 0>, dim3(units), dim3(SPAN), 0, stream, *a);
    }
    const unsigned groups = units / (unsigned)a->rep;
    /* grouped only where its blocks still fill the GPU twice over: at one token a block per query
       head keeps more of it busy (batch-1 decode measured 0.5 ms per 8B step slower grouped) */
    const bool group = mode == EMBER_CU_ATTN_SPLIT && ember_cu_attn_group && span_fits(a->kv.D, ENC) &&
                       a->rep > 1 && (long long)groups * a->n_span >= GROUP_MIN_BLOCKS;
    if (mode == EMBER_CU_ATTN_STAGED) return ember_launch(attn_fused_k<ENC, 1>, dim3(units), dim3(SPAN), STAGE_BYTES, stream, *a);
    if (group)
        return ember_launch(attn_group_k<ENC>, dim3((unsigned)a->n_span, groups, 1), dim3(SPAN), STAGE_BYTES, stream, *a);
    return ember_launch(attn_split_k<ENC>, dim3((unsigned)a->n_span, units, 1), dim3(SPAN), STAGE_BYTES, stream, *a);
}

extern "C" cudaError_t ember_cu_attention(cudaStream_t stream, const ember_cu_kv *kv, float *out, const float *q,
                                          int Hq, float scale, int window, float softcap, int mode, int n_span,
                                          float *parts, int *count, int tc) {
    if (kv->T < 1 || Hq < 1) return cudaSuccess;
    if (kv->D < 1 || kv->D > EMBER_CU_ATTN_MAX_D || kv->H < 1 || Hq % kv->H || (int64_t)kv->T * Hq > 0x7fffffff)
        return cudaErrorInvalidValue;
    const int enc = kv->view[0].k_enc;
    int vec16 = 1;
    for (int i = 0; i < 2; i++) { /* one codec for K and V of every view the kernels read */
        const ember_cu_kv_view *v = &kv->view[i];
        if (!v->pool) continue;
        if (v->k_enc != enc || v->v_enc != enc) return cudaErrorInvalidValue;
        if (((uintptr_t)v->pool | v->block_bytes | v->k_off | v->v_off | v->k_head | v->v_head) & 15u) vec16 = 0;
    }
    attn_args a = {*kv, out, q, parts, count, Hq, Hq / kv->H, n_span, scale, softcap, window, vec16};
    const unsigned units = (unsigned)(kv->T * Hq);
    if (mode == EMBER_CU_ATTN_SPLIT && (n_span < 1 || units > 65535u)) return cudaErrorInvalidValue; /* grid y */
    if (tc > 0 && tca_takes(&a, enc)) return tca_attention(stream, &a, mode, tc);
    switch (enc) {
    case EMBER_CU_F32: return attn_launch<EMBER_CU_F32>(stream, &a, mode, units);
    case EMBER_CU_F16: return attn_launch<EMBER_CU_F16>(stream, &a, mode, units);
    case EMBER_CU_BF16: return attn_launch<EMBER_CU_BF16>(stream, &a, mode, units);
    default: return cudaErrorInvalidValue;
    }
}


/* The dynamic shared-memory limit of each attention kernel over 48 KB. */
template <int ENC> static cudaError_t attn_prepare_enc(void) {
    cudaError_t e = cudaFuncSetAttribute(attn_fused_k<ENC, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, STAGE_BYTES);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(attn_group_k<ENC>, cudaFuncAttributeMaxDynamicSharedMemorySize, STAGE_BYTES);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(attn_split_k<ENC>, cudaFuncAttributeMaxDynamicSharedMemorySize, STAGE_BYTES);
    return e;
}

template <int D> static cudaError_t tca_prepare(void) {
    cudaError_t e = cudaFuncSetAttribute(attn_tc_walk_k<D, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tca_smem(D));
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(attn_tc_walk_k<D, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tca_smem(D));
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(attn_tc_split_k<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tca_smem(D));
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(attn_tc_pipe_k<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tcp_smem<D>());
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(attn_tc_lean_k<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tcl_smem<D>());
    return e;
}

extern "C" cudaError_t ember_cu_attn_prepare(void) {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && sms > 0)
        g_attn_sms = sms;
    cudaError_t e = attn_prepare_enc<EMBER_CU_F32>();
    if (e == cudaSuccess) e = attn_prepare_enc<EMBER_CU_F16>();
    if (e == cudaSuccess) e = attn_prepare_enc<EMBER_CU_BF16>();
    if (e == cudaSuccess) e = tca_prepare<16>();
    if (e == cudaSuccess) e = tca_prepare<32>();
    if (e == cudaSuccess) e = tca_prepare<64>();
    if (e == cudaSuccess) e = tca_prepare<128>();
    return e;
}
