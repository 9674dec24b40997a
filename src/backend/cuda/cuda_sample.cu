/*
 * cuda_sample.cu - the device draw (core/draw_def.h: ember_draw; backend.h: sample_rows): a
 * token per row of logits on the GPU, so a sampled row sends 4 bytes to
 * the host instead of its logits.
 *
 * One cluster of C blocks of SM_THREADS threads per row (C = 8 for up to
 * 16 rows, fewer as the rows fill the GPU, 1 from 128 rows on: sm_cluster),
 * each block owning a slice of the row's ids; what a pass sums is summed
 * per block, then over the cluster through distributed shared memory
 * (sm_gather: one cluster barrier), so every block of a row takes the same
 * decisions. The blocks first turn their slices into weights in place (x
 * becomes w = e^(x / T - max), NaN where an id is not usable), then find
 * each cut of the chain by a radix select: four passes over the row, each
 * counting the kept ids into 256 bins of the next 8 bits of the sort key
 * (w's bits: w >= 0, so they order as w does; or the id's complement, to
 * find the r-th lowest id among ties) by count or by mass, and taking the
 * bin where the walk from the top reaches what is needed. Each warp counts
 * into bins of its own in 32-bit digits (sm_select), so no atomic waits on
 * another warp's and none is 64-bit (the first version shared 2,048 bins
 * of 64-bit counters between all warps: 0.8 ms a select where the weights
 * are alike). A cut is kept as (key, highest id of the key kept), so
 * membership of an id in the kept set is a test on its own weight and id,
 * and nothing but the row itself is stored. The draw then walks the kept
 * masses by id (the pass that sums the kept mass leaves each warp's sum of
 * its contiguous range of its block's slice; the block whose slice holds
 * the draw's point cuts the warp range holding it into a piece a thread,
 * and the piece holding it walks itself) or, when top_k applied, in the
 * chain's order (one more select). Every pass keeps SM_UNROLL loads of 16
 * bytes in flight a thread. (One block a row, the first versions, took
 * 120-344 us a sampled row on an H100, a fifth of a 1B model's step.)
 *
 * Determinism: every sum is of integer masses (draw_def.h), by atomics or
 * any tree: their order cannot change a bit, nor can C or the slices. The
 * weights come from the host sampler's polynomial (built --fmad=false), so
 * tests/draw_ref.h (a sort in plain C) gives the same token for every row
 * and every C (test_cuda_ops forces each through ember_cu_sample_cluster).
 *
 * Ownership and threads: the launcher runs on the backend's host thread and
 * only enqueues on its stream; the kernel writes the rows of x it samples
 * (each block its own slice) and out[rows] (one block a row), device
 * memory the backend owns. A block reads another's shared memory only
 * between two cluster barriers, and no block leaves before the last one.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include <cooperative_groups.h>

#include "cuda_kernels.h"
#include "cuda_pdl.cuh"
#include "core/draw_def.h"

namespace cg = cooperative_groups;

#define SM_THREADS 512
#define SM_WARPS (SM_THREADS / 32)
#define SM_BINS 256   /* a select level's bins: 8 bits of the key */
#define SM_DIGITS 3   /* a mass (< 2^45) in 15-bit digits, each summed as a 32-bit count */
#define SM_UNROLL 4   /* loads in flight a thread in a pass over the row */
#define SM_DYN_BYTES (SM_WARPS * SM_DIGITS * SM_BINS * 4)
#define SM_CMAX 8     /* blocks a row at most (the portable cluster size) */

/* A row's cuts: an id is kept at stage 1 when it passes top_k, at stage 2
   when also top_p, at stage 3 when also min_p. A cut (key, id) keeps the
   ids whose weight's key is above key, and those of key itself up to id. */
typedef struct sm_cuts {
    int k_on, p_on;
    uint32_t kk, pk;
    int32_t ki, pi;
    float minw;
} sm_cuts;

typedef struct sm_shared {
    unsigned long long hist[2 * SM_THREADS]; /* a level's bins over the cluster (SM_BINS used, the rest 0) */
    unsigned long long xb[2][SM_BINS];       /* this block's part of a cluster sum, the two used in turn */
    unsigned long long ws[SM_WARPS];
    sm_cuts c;
    unsigned long long res_above; /* a select's result: the sum above its bin */
    int res_bin;
    int32_t out;
} sm_shared;

/* What one block of a row's cluster works on: ids [lo, lo + n) of the row
   w, rank `rank` of C blocks. xk: the buffer of xb the next gather uses
   (every thread of the cluster makes the same gathers in the same order). */
typedef struct sm_ctx {
    sm_shared *sh;
    unsigned *dg; /* the selects' bins of each warp (dynamic shared memory) */
    float *w;
    int lo, n, C, rank, xk;
} sm_ctx;

/* f(i, x) for every id i of [lo, lo + n) and its value x (w[i]): the ids
   up to a 16-byte boundary one at a time, then four at a time (float4),
   SM_UNROLL loads of 16 bytes in flight a thread before any is used (a
   pass is bound by the L2's latency, not its bandwidth), then the rest. In
   no particular order: every use sums integers, takes a maximum by a total
   order or writes its own element. */
template <typename F> static __device__ __forceinline__ void sm_each(const float *w, int lo, int n, F f) {
    const float *b = w + lo;
    int head = (int)((16u - ((unsigned)(uintptr_t)b & 15u)) & 15u) / 4;
    head = head < n ? head : n;
    for (int i = threadIdx.x; i < head; i += SM_THREADS) f(lo + i, b[i]);
    const int nv = (n - head) / 4;
    const float4 *w4 = (const float4 *)(b + head);
    for (int j0 = threadIdx.x; j0 < nv; j0 += SM_UNROLL * SM_THREADS) {
        float4 xs[SM_UNROLL];
#pragma unroll
        for (int k = 0; k < SM_UNROLL; k++) {
            const int j = j0 + k * SM_THREADS;
            xs[k] = j < nv ? w4[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int k = 0; k < SM_UNROLL; k++) {
            const int j = j0 + k * SM_THREADS, i = lo + head + 4 * j;
            if (j < nv) {
                f(i, xs[k].x);
                f(i + 1, xs[k].y);
                f(i + 2, xs[k].z);
                f(i + 3, xs[k].w);
            }
        }
    }
    for (int i = head + 4 * nv + (int)threadIdx.x; i < n; i += SM_THREADS) f(lo + i, b[i]);
}

static __device__ __forceinline__ bool sm_kept(const sm_cuts *c, int stage, int32_t i, float w) {
    if (isnan(w)) return false;
    const uint32_t key = __float_as_uint(w);
    if (stage >= 1 && c->k_on && !(key > c->kk || (key == c->kk && i <= c->ki))) return false;
    if (stage >= 2 && c->p_on && !(key > c->pk || (key == c->pk && i <= c->pi))) return false;
    if (stage >= 3 && !(w >= c->minw)) return false;
    return true;
}

/* The sum of v over threads t' >= t (the calling thread's t) of the block,
   all its threads calling. */
static __device__ unsigned long long sm_suffix(unsigned long long v, sm_shared *sh) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long y = __shfl_down_sync(0xffffffffu, v, o);
        if (lane + o < 32) v += y;
    }
    if (lane == 0) sh->ws[wid] = v;
    __syncthreads();
    unsigned long long a = 0;
    for (int k = wid + 1; k < SM_WARPS; k++) a += sh->ws[k];
    __syncthreads();
    return v + a;
}

/* The sum of v over the block's threads, in every thread. */
static __device__ unsigned long long sm_total(unsigned long long v, sm_shared *sh) {
    const unsigned long long s = sm_suffix(v, sh);
    if (threadIdx.x == 0) sh->res_above = s;
    __syncthreads();
    const unsigned long long t = sh->res_above;
    __syncthreads();
    return t;
}

/* v of each block of the cluster (v: this block's, the same in each of its
   threads; read from thread 0) into a[rank], in every thread: one cluster
   barrier, which is also the block's. The buffers alternate, so a block
   writes one again only after the next gather's barrier, which every
   block passes only when done reading it. */
static __device__ void sm_gather(sm_ctx *x, unsigned long long v, unsigned long long a[SM_CMAX]) {
    cg::cluster_group cl = cg::this_cluster();
    unsigned long long *mine = x->sh->xb[x->xk];
    if (threadIdx.x == 0) mine[0] = v;
    cl.sync();
    for (int r = 0; r < x->C; r++) a[r] = *cl.map_shared_rank(mine, (unsigned)r);
    x->xk ^= 1;
}

/* The sum of v over the threads of every block of the cluster. */
static __device__ unsigned long long sm_xtotal(sm_ctx *x, unsigned long long v) {
    unsigned long long a[SM_CMAX], s = 0;
    sm_gather(x, sm_total(v, x->sh), a);
    for (int r = 0; r < x->C; r++) s += a[r];
    return s;
}

/* Radix select over the row's ids kept at `stage` (with by_id, only those
   whose weight's key is `tie`, walked from the lowest id up: the sort key
   is ~id; else the key is the weight's, walked from the largest down),
   summing masses (by_mass) or counts until the sum reaches need (1 <= need
   <= the set's sum). Returns the sort key of the element that reaches it;
   *above: the sum over the keys before it; *at: the sum at that key (the
   same in every block of the cluster). Four passes over the block's slice,
   one for each 8 (then 6) bits of the key below its top two, which every
   weight's key has 0 (w <= 1) and every ~id 1 (ids < 2^30). Each warp
   counts into its own bins (dg: SM_DIGITS x SM_BINS 32-bit counters a
   warp), a mass as its three 15-bit digits, so no bin is shared between
   warps and no 64-bit atomic is needed: a warp counts at most V / SM_WARPS
   <= 2^15 ids, whose digits sum below 2^30. The block's bins are then
   summed over the cluster (xb, one cluster barrier a level). */
static __device__ uint32_t sm_select(sm_ctx *x, int stage, bool by_id, uint32_t tie, bool by_mass,
                                     unsigned long long need, unsigned long long *above, unsigned long long *at) {
    sm_shared *sh = x->sh;
    unsigned *dg = x->dg;
    cg::cluster_group cl = cg::this_cluster();
    uint32_t prefix = by_id ? 0xc0000000u : 0u, fixed = 0xc0000000u;
    unsigned long long taken = 0, at_b = 0;
    unsigned *mine = dg + (threadIdx.x >> 5) * SM_DIGITS * SM_BINS;
    for (int lv = 0; lv < 4; lv++) {
        const int s = lv < 3 ? 22 - 8 * lv : 0; /* key bits 29..22, 21..14, 13..6, 5..0 */
        const uint32_t mask = lv < 3 ? 0xffu : 0x3fu;
        for (int j = threadIdx.x; j < SM_WARPS * SM_DIGITS * SM_BINS; j += SM_THREADS) dg[j] = 0;
        if (threadIdx.x == 0) sh->res_bin = -1;
        __syncthreads();
        sm_each(x->w, x->lo, x->n, [&](int i, float v) {
            const uint32_t key = __float_as_uint(v), sk = by_id ? ~(uint32_t)i : key;
            if (!sm_kept(&sh->c, stage, i, v) || (by_id && key != tie) || (sk & fixed) != prefix) return;
            const unsigned b = (sk >> s) & mask;
            if (!by_mass) {
                atomicAdd(&mine[b], 1u);
                return;
            }
            const unsigned long long m = ember_draw_mass(v);
            if (!m) return; /* no mass: nothing to add, and the walk never stops on it */
            const unsigned d0 = (unsigned)(m & 0x7fffu), d1 = (unsigned)(m >> 15 & 0x7fffu), d2 = (unsigned)(m >> 30);
            if (d0) atomicAdd(&mine[b], d0);
            if (d1) atomicAdd(&mine[SM_BINS + b], d1);
            if (d2) atomicAdd(&mine[2 * SM_BINS + b], d2);
        });
        __syncthreads();
        unsigned long long *part = sh->xb[x->xk];
        for (int b = threadIdx.x; b < SM_BINS; b += SM_THREADS) {
            unsigned long long v = 0;
            for (int q = 0; q < SM_WARPS; q++) {
                const unsigned *d = dg + q * SM_DIGITS * SM_BINS;
                v += (unsigned long long)d[b] + ((unsigned long long)d[SM_BINS + b] << 15) +
                     ((unsigned long long)d[2 * SM_BINS + b] << 30);
            }
            part[b] = v;
        }
        cl.sync(); /* every block's bins in place (xb alternates: see sm_gather) */
        for (int b = threadIdx.x; b < 2 * SM_THREADS; b += SM_THREADS) {
            unsigned long long v = 0;
            for (int r = 0; b < SM_BINS && r < x->C; r++) v += *cl.map_shared_rank(part + b, (unsigned)r);
            sh->hist[b] = v;
        }
        x->xk ^= 1;
        __syncthreads();
        /* the bin b with S(b) >= want > S(b + 1), S(b) the sum over bins >= b */
        const unsigned long long want = need - taken;
        const int t = threadIdx.x;
        const unsigned long long h0 = sh->hist[2 * t], h1 = sh->hist[2 * t + 1];
        const unsigned long long s0 = sm_suffix(h0 + h1, sh), s1 = s0 - h0, s2 = s1 - h1;
        if (s1 >= want && s2 < want) {
            sh->res_bin = 2 * t + 1;
            sh->res_above = s2;
        } else if (s0 >= want && s1 < want) {
            sh->res_bin = 2 * t;
            sh->res_above = s1;
        }
        __syncthreads();
        int b = sh->res_bin;
        unsigned long long sup = sh->res_above;
        if (b < 0) { /* not reached (callers keep need within the sum): the lowest bin */
            b = 0;
            sup = 0;
        }
        at_b = sh->hist[b];
        prefix |= (uint32_t)b << s;
        fixed |= mask << s;
        taken += sup;
        __syncthreads();
    }
    *above = taken;
    *at = at_b;
    return prefix;
}

/* The sum of masses of the row's ids kept at stage. */
static __device__ unsigned long long sm_mass(sm_ctx *x, int stage) {
    unsigned long long m = 0;
    sm_each(x->w, x->lo, x->n, [&](int i, float v) {
        if (sm_kept(&x->sh->c, stage, i, v)) m += ember_draw_mass(v);
    });
    return sm_xtotal(x, m);
}

/* The highest id kept by a cut at key whose walk needs `ties` of the ids
   with that key (in id order) out of n_key of them. */
static __device__ int32_t sm_tie_id(sm_ctx *x, int stage, uint32_t key, unsigned long long ties,
                                    unsigned long long n_key) {
    if (ties >= n_key) return INT32_MAX;
    unsigned long long above, at;
    return (int32_t)~sm_select(x, stage, true, key, false, ties, &above, &at);
}

/* Is (v2, i2) before (v1, i1) in the order "larger value, then lower id",
   an id < 0 being none? */
static __device__ __forceinline__ bool sm_better(float v2, int i2, float v1, int i1) {
    return i2 >= 0 && (i1 < 0 || v2 > v1 || (v2 == v1 && i2 < i1));
}

/* (value, id) packed for a gather, and back. */
static __device__ __forceinline__ unsigned long long sm_pack(float v, int i) {
    return (unsigned long long)(uint32_t)i << 32 | (unsigned long long)__float_as_uint(v);
}
static __device__ __forceinline__ void sm_unpack(unsigned long long a, float *v, int *i) {
    *v = __uint_as_float((uint32_t)a);
    *i = (int)(uint32_t)(a >> 32);
}

/* Greedy: the first id of the row's largest value, NaNs skipped, 0 when all
   are NaN (argmax_rows, ember_argmax; -0 and +0 are one value). One pass:
   each thread's first maximum, then a reduction by that total order over
   the block, then over the cluster. */
static __device__ int32_t sm_argmax(sm_ctx *x) {
    sm_shared *sh = x->sh;
    float bv = 0.0f;
    int bi = -1;
    sm_each(x->w, x->lo, x->n, [&](int i, float v) {
        if (!isnan(v) && sm_better(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    });
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (sm_better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
    if ((threadIdx.x & 31) == 0) sh->ws[threadIdx.x >> 5] = sm_pack(bv, bi);
    __syncthreads();
    for (int k = 0; k < SM_WARPS; k++) { /* every thread: the block's best */
        float ov;
        int oi;
        sm_unpack(sh->ws[k], &ov, &oi);
        if (sm_better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
    unsigned long long a[SM_CMAX];
    sm_gather(x, sm_pack(bv, bi), a); /* its barrier also orders ws's reads before any reuse */
    for (int r = 0; r < x->C; r++) {
        float ov;
        int oi;
        sm_unpack(a[r], &ov, &oi);
        if (sm_better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
    return bi < 0 ? 0 : bi;
}

/* The row's token, in every thread of the block; *writes: whether this
   block is the one that stores it. Every block of the cluster takes the
   same branches and makes the same gathers (their values are the
   cluster's). */
static __device__ int32_t sm_draw(sm_ctx *x, const ember_draw p, bool *writes) {
    sm_shared *sh = x->sh;
    *writes = x->rank == 0;
    if (!(p.temperature > 0)) return sm_argmax(x);
    /* s = x / T over the usable ids: their count and largest value */
    const float T = p.temperature;
    float mx = -INFINITY;
    unsigned long long n = 0;
    sm_each(x->w, x->lo, x->n, [&](int, float v) { /* the largest x, then max(x / T) = max(x) / T (T > 0) */
        if (isnan(v) || v == -INFINITY) return;
        mx = fmaxf(mx, v);
        n++;
    });
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((threadIdx.x & 31) == 0) sh->hist[threadIdx.x >> 5] = (unsigned long long)__float_as_uint(mx);
    const unsigned long long nb = sm_total(n, sh); /* its barriers order hist's writes */
    for (int k = 0; k < SM_WARPS; k++) mx = fmaxf(mx, __uint_as_float((uint32_t)sh->hist[k]));
    unsigned long long a[SM_CMAX], usable = 0; /* (count << 32 | the largest x's bits) of each block */
    sm_gather(x, nb << 32 | (unsigned long long)__float_as_uint(mx), a);
    for (int r = 0; r < x->C; r++) {
        usable += a[r] >> 32;
        mx = fmaxf(mx, __uint_as_float((uint32_t)a[r]));
    }
    mx = mx / T;
    if (usable == 0) return sm_argmax(x); /* nothing usable: the argmax of the row as it is */
    /* the weights, in place (NaN: not usable) */
    const bool inf = isinf(mx);
    float *w = x->w;
    sm_each(w, x->lo, x->n, [&](int i, float v) {
        float r = NAN;
        if (!(isnan(v) || v == -INFINITY)) {
            const float s = v / T;
            r = inf ? (s == mx ? 1.0f : 0.0f) : ember_exp_nonpos(s - mx);
        }
        w[i] = r;
    });
    if (threadIdx.x == 0) {
        sh->c.k_on = p.top_k > 0 && (unsigned long long)p.top_k < usable;
        sh->c.p_on = 0;
        sh->c.minw = p.min_p > 0 ? p.min_p : 0.0f;
    }
    __syncthreads();
    unsigned long long above, at;
    if (sh->c.k_on) { /* the k first by weight, then id */
        const uint32_t key = sm_select(x, 0, false, 0, false, (unsigned long long)p.top_k, &above, &at);
        const int32_t id = sm_tie_id(x, 0, key, (unsigned long long)p.top_k - above, at);
        if (threadIdx.x == 0) {
            sh->c.kk = key;
            sh->c.ki = id;
        }
        __syncthreads();
    }
    if (p.top_p < 1.0f) { /* the shortest prefix of mass ceil(top_p * M) */
        const unsigned long long M = sm_mass(x, 1);
        const unsigned long long need = ember_draw_need(p.top_p, M);
        if (need < M) {
            const uint32_t key = sm_select(x, 1, false, 0, true, need, &above, &at);
            const unsigned long long mt = ember_draw_mass(__uint_as_float(key));
            const int32_t id = sm_tie_id(x, 1, key, (need - above + mt - 1) / mt, at / mt);
            if (threadIdx.x == 0) {
                sh->c.p_on = 1;
                sh->c.pk = key;
                sh->c.pi = id;
            }
            __syncthreads();
        }
    }
    /* the kept masses: warp q of the block sums ids [lo + q cw, lo + (q + 1) cw), 32 at a time
       (coalesced), into ws[q]; their sum over the cluster is K */
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, end = x->lo + x->n;
    const int cw = ((x->n + SM_WARPS - 1) / SM_WARPS + 31) & ~31, wlo = x->lo + wid * cw;
    const int whi = wlo + cw < end ? wlo + cw : end;
    unsigned long long own = 0;
    for (int i0 = wlo + lane; i0 < whi; i0 += SM_UNROLL * 32) {
        float xs[SM_UNROLL];
#pragma unroll
        for (int k = 0; k < SM_UNROLL; k++) xs[k] = i0 + 32 * k < whi ? w[i0 + 32 * k] : NAN;
#pragma unroll
        for (int k = 0; k < SM_UNROLL; k++)
            if (sm_kept(&sh->c, 3, i0 + 32 * k, xs[k])) own += ember_draw_mass(xs[k]);
    }
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) own += __shfl_xor_sync(0xffffffffu, own, o);
    if (lane == 0) sh->ws[wid] = own;
    __syncthreads();
    unsigned long long blk = 0, K = 0;
    for (int k = 0; k < SM_WARPS; k++) blk += sh->ws[k];
    sm_gather(x, blk, a);
    for (int r = 0; r < x->C; r++) K += a[r];
    const unsigned long long t = ember_draw_point(p.u, K);
    if (sh->c.k_on) { /* in the chain's order: where the masses from the top first exceed t */
        const uint32_t key = sm_select(x, 3, false, 0, true, t + 1, &above, &at);
        const unsigned long long mt = ember_draw_mass(__uint_as_float(key));
        const unsigned long long r = (t + 1 - above + mt - 1) / mt;
        unsigned long long a2, at2;
        return (int32_t)~sm_select(x, 3, true, key, false, r, &a2, &at2);
    }
    /* by id: the block whose slice holds t (every block finds the same), then its warp range
       holding t, cut into one piece a thread; the piece holding t walks itself to the id where
       the running sum passes t */
    int qb = 0;
    unsigned long long acc = 0;
    while (qb < x->C - 1 && !(t < acc + a[qb])) acc += a[qb++];
    *writes = x->rank == qb;
    if (x->rank != qb) return 0;
    int q = 0;
    while (q < SM_WARPS - 1 && !(t < acc + sh->ws[q])) acc += sh->ws[q++];
    const unsigned long long own_q = sh->ws[q];
    __syncthreads(); /* ws is read before sm_suffix reuses it */
    /* that range in SM_THREADS pieces of sc ids, one a thread */
    const int qlo = x->lo + q * cw, qhi = qlo + cw < end ? qlo + cw : end, sc = (cw + SM_THREADS - 1) / SM_THREADS;
    const int plo = qlo + (int)threadIdx.x * sc, phi = plo + sc < qhi ? plo + sc : qhi;
    unsigned long long piece = 0;
#pragma unroll 4
    for (int i = plo; i < phi; i++) {
        const float v = w[i];
        if (sm_kept(&sh->c, 3, i, v)) piece += ember_draw_mass(v);
    }
    if (threadIdx.x == 0) sh->out = 0; /* (always replaced: one piece holds t) */
    const unsigned long long suf = sm_suffix(piece, sh); /* its barriers order sh->out's write */
    unsigned long long before = acc + (own_q - suf); /* the masses before this piece */
    if (piece > 0 && before <= t && t < before + piece)
        for (int i = plo; i < phi; i++) {
            const float v = w[i];
            if (!sm_kept(&sh->c, 3, i, v)) continue;
            before += ember_draw_mass(v);
            if (t < before) {
                sh->out = i;
                break;
            }
        }
    __syncthreads();
    return sh->out;
}

/* A cluster of C blocks (the launch's cluster size) a row. */
static __global__ void __launch_bounds__(SM_THREADS, 1)
    sample_k(int32_t *out, float *x, int64_t V64, const ember_draw *dp) {
    ember_pdl_enter();
    __shared__ sm_shared sh;
    extern __shared__ unsigned sm_dg[]; /* SM_DYN_BYTES: the selects' bins of each warp */
    cg::cluster_group cl = cg::this_cluster();
    const int C = (int)cl.num_blocks(), rank = (int)cl.block_rank(), row = (int)blockIdx.x / C, V = (int)V64;
    const int cs = ((V + C - 1) / C + 31) & ~31, lo = rank * cs < V ? rank * cs : V;
    sm_ctx c = {&sh, sm_dg, x + (size_t)row * (size_t)V64, lo, (lo + cs < V ? lo + cs : V) - lo, C, rank, 0};
    bool writes;
    const int32_t id = sm_draw(&c, dp[row], &writes);
    cl.sync(); /* no block leaves while another may still read its shared memory */
    if (writes && threadIdx.x == 0) out[row] = id;
}

int ember_cu_sample_cluster = 0;

/* The blocks a row for `rows` rows: what the GPU takes (sm_cmax, from the
   occupancy of clusters of this kernel), at most SM_CMAX, and no more than
   keeps rows x C within the SMs (so the rows run in one wave); 1 from 128
   rows on a GPU of 132 SMs. */
static int sm_cluster(int rows, int sms, int cmax) {
    if (ember_cu_sample_cluster > 0) return ember_cu_sample_cluster < cmax ? ember_cu_sample_cluster : cmax;
    int c = cmax;
    while (c > 1 && (long)rows * c > sms) c /= 2;
    return c;
}

/* cfg for `blocks` blocks in clusters of C, its attributes in at (two
   entries): the launch's own (ember_pdl_config's) where pdl, then the
   cluster size. */
static void sm_config(cudaLaunchConfig_t *cfg, cudaLaunchAttribute at[2], int blocks, int C, cudaStream_t stream,
                      bool pdl) {
    ember_pdl_config(cfg, &at[0], dim3((unsigned)blocks), dim3(SM_THREADS), SM_DYN_BYTES, stream);
    if (!pdl) cfg->numAttrs = 0;
    at[cfg->numAttrs].id = cudaLaunchAttributeClusterDimension;
    at[cfg->numAttrs].val.clusterDim.x = (unsigned)C;
    at[cfg->numAttrs].val.clusterDim.y = 1;
    at[cfg->numAttrs].val.clusterDim.z = 1;
    cfg->numAttrs++;
}

extern "C" cudaError_t ember_cu_sample(cudaStream_t stream, int32_t *out, float *x, const ember_draw *p, int rows,
                                       int64_t V) {
    if (rows < 1 || V < 1) return cudaSuccess;
    if (V > EMBER_DRAW_MAX_IDS || rows > 65535) return cudaErrorInvalidValue;
    static int sms, cmax; /* asked once: the SMs, the largest cluster the GPU runs */
    if (!cmax) {
        cudaError_t e = cudaFuncSetAttribute(sample_k, cudaFuncAttributeMaxDynamicSharedMemorySize, SM_DYN_BYTES);
        int dev = 0;
        if (e == cudaSuccess) e = cudaGetDevice(&dev);
        if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        if (e != cudaSuccess) return e;
        int c = SM_CMAX;
        for (; c > 1; c /= 2) { /* the largest cluster with at least one place on the GPU */
            cudaLaunchConfig_t cfg;
            cudaLaunchAttribute at[2];
            sm_config(&cfg, at, c, c, stream, false);
            int n = 0;
            const cudaError_t q = cudaOccupancyMaxActiveClusters(&n, sample_k, &cfg);
            if (q == cudaSuccess && n > 0) break;
            if (q != cudaSuccess) (void)cudaGetLastError(); /* a refused query leaves no error behind */
        }
        cmax = c;
    }
    const int C = sm_cluster(rows, sms, cmax);
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute at[2];
    sm_config(&cfg, at, rows * C, C, stream, true);
    return cudaLaunchKernelEx(&cfg, sample_k, out, x, V, p);
}
