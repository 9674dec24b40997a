/*
 * cuda_kernels.h - the launch functions of the CUDA kernels (cuda_matmul.cu,
 * cuda_ops.cu), called by the host side of the backend (cuda_backend.c).
 *
 * Ownership: every pointer here is device memory owned by the caller (the
 * backend's buffers and its argument area); a launcher only enqueues work
 * on the given stream and returns. Nothing here allocates, synchronises or
 * keeps state between calls.
 *
 * Contract of every launcher: the caller has checked shapes, dtypes,
 * bounds and alignment (cuda_backend.c does); the launcher enqueues its
 * kernels on `stream` and returns cudaGetLastError() after the launches,
 * i.e. cudaSuccess or the launch error. Errors raised while the kernel runs
 * surface at the next synchronising call (read, write, free).
 *
 * Threading: called from the one thread that drives the backend, with that
 * backend's device current.
 */
#ifndef EMBER_CUDA_KERNELS_H
#define EMBER_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "core/draw_def.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Programmatic dependent launch of the kernels (cuda_pdl.cuh): 1 (the
   default) or 0, set once by the backend from EMBER_CUDA_PDL. */
extern int ember_cu_pdl;

/* Element type of a float tensor, as the kernels see it. */
enum { EMBER_CU_F32 = 0, EMBER_CU_F16 = 1, EMBER_CU_BF16 = 2 };

/* The canonical dot products (cuda_matmul.cu's header says them in full).
   bf16 weights: tensor cores, x split into bf16 hi + lo, K in k-blocks of
   32 dealt round robin to 8 parts, each part one chain of mma.sync
   m16n8k16 steps (hi then lo), the parts added in order. f32 and f16
   weights: lanes l = 0..31, lane l sums the chunks c = l, l + 32, l + 64, ... of 8
   consecutive elements (k = 8c .. 8c + 7, k < K) with one fused
   multiply-add per element in k order; then the 32 lane sums are combined
   by the butterfly s = 16, 8, 4, 2, 1 (lane l adds lane l ^ s). The order
   depends on K alone, so a row's outputs never depend on M. */
#define EMBER_CU_MAX_MM 8

typedef struct ember_cu_mm_prod {
    const void *w;     /* [N, K] of the launch's dtype */
    float *out;        /* [M, N] */
    const float *bias; /* [N] or NULL */
    int N;
    int first_block; /* filled by the launcher */
} ember_cu_mm_prod;

typedef struct ember_cu_mm {
    const float *x; /* [M, K] */
    int M, K;
    int dtype; /* EMBER_CU_*, shared by every product of the launch */
    int n;     /* products, 1 .. EMBER_CU_MAX_MM */
    int variant; /* 0: the kernel the launcher picks; > 0: ember_cu_tc_variant (bf16) */
    int legacy;  /* bf16 on the CUDA-core kernels (another order; for measuring only) */
    int early;   /* 1: no queued work writes the weights, so a kernel may read them before the kernel
                    before it has finished (cuda_pdl.cuh); 0: it waits first */
    ember_cu_mm_prod p[EMBER_CU_MAX_MM];
} ember_cu_mm;

/* Measuring aid: variant v > 0 is another shape of the bf16 tensor-core
   kernel, for any M: shape = {WT, XT, BW, BX, PS, U, S, CL} (cuda_matmul.cu;
   CL = 1: a cluster kernel, the parts over the blocks of a cluster). v = 0
   (the default for each M) gives zeros. Returns 0 past the last variant.
   Every variant gives the same bits. */
int ember_cu_tc_variant(int variant, int shape[8]);

/* The cluster kernel for bf16 products at M > 8: 1 (the default) or 0
   (tc_mid, tc_big and tc_huge there, as before; a measuring aid, set from
   EMBER_CUDA_MM_CLUSTER). The launcher clears it when the GPU refuses a
   cluster launch. */
extern int ember_cu_mm_cluster;

/* The block kernel (tc_blk, cuda_matmul.cu) for bf16 products from this
   many rows on; 0 (the default): never. A measuring aid, set from
   EMBER_CUDA_MM_BLK; the same bits as every other bf16 kernel. */
extern int ember_cu_mm_blk_min;

/* The warpgroup kernel (cuda_wgmma.cu, Hopper's wgmma; sm_90a machine
   code, so compute capability 9.0 only) for bf16 products from this many
   rows on; 0: never. Default 128; set from EMBER_CUDA_MM_WG. The same bits
   as every other bf16 kernel. */
extern int ember_cu_mm_wg_min;

/* Measuring aid: the warpgroup kernel's shape for every M (an index for
   ember_cu_mm_wg_kinds), or -1 (the default): the launcher's pick. */
extern int ember_cu_mm_wg_kind;

/* shape = {WGS, NI, S} of warpgroup kind `kind` (warpgroups per block,
   input rows per block, pipeline stages); returns 0 past the last kind. */
int ember_cu_mm_wg_kinds(int kind, int shape[3]);

/* Finds out once per device whether the warpgroup kernel runs here (a GPU
   of compute capability 9.0 with its machine code) and raises its
   shared-memory limit. Never fails: where it cannot run, ember_cu_mm_wg_ready
   answers 0 and the other kernels take every product. */
cudaError_t ember_cu_mm_wg_prepare(void);

/* 1 when ember_cu_mm_wg_prepare found the warpgroup kernel usable. */
int ember_cu_mm_wg_ready(void);

/* The bf16 products of a on the warpgroup kernel (any M; K % 8 == 0 and
   16-byte aligned x and weights: the caller checks). Sets first_block of
   each product. cudaErrorNotSupported (nothing enqueued) when the kernel is
   not ready, or when it declines the shape: with ember_cu_mm_wg_kind < 0,
   a grid that fills less than 85% of its waves of one block per
   multiprocessor (the other kernels give the same bits). */
cudaError_t ember_cu_mm_wg(cudaStream_t stream, ember_cu_mm *a);

/* Raises tc_blk's (and the warpgroup kernel's) dynamic shared-memory limit
   on the current device. Called once per backend, when it is created. */
cudaError_t ember_cu_mm_prepare(void);

/* out_i = x w_i^T (+ bias_i) for each product i. Picks the kernel: vector
   loads when K % 8 == 0 and x and every w are 16-byte aligned, else element
   loads; bf16 on the tensor cores for every M; f32 / f16 a decode kernel for M <= 8,
   a tiled one above. Every kernel of a dtype gives the same bits. */
cudaError_t ember_cu_matmul(cudaStream_t stream, ember_cu_mm *a);

/* ---- quantized weights (cuda_qmm.cu) ---- */

/* Block types of quantized weights, as the kernels see them (consecutive). */
enum { EMBER_CU_Q8_0 = 16, EMBER_CU_Q4_0, EMBER_CU_Q5_0, EMBER_CU_Q4_K, EMBER_CU_Q5_K, EMBER_CU_Q6_K };

/* 1 for the types of 256-element blocks (their inputs are quantized in blocks of 256). */
static inline int ember_cu_q256(int qtype) {
    return qtype == EMBER_CU_Q4_K || qtype == EMBER_CU_Q5_K || qtype == EMBER_CU_Q6_K;
}

/* Products of one input with weights of one quantized type: the CPU's
   canonical dot products (src/backend/cpu/qkern.h), bit for bit. act holds
   the input quantized by ember_cu_qact (the same qtype, M and K). */
typedef struct ember_cu_qmm {
    const void *act; /* ember_cu_qact_bytes(qtype, M, K) bytes */
    int M, K;        /* K a multiple of the type's block (32 or 256) */
    int qtype;       /* EMBER_CU_Q* */
    int n;           /* products, 1 .. EMBER_CU_MAX_MM */
    ember_cu_mm_prod p[EMBER_CU_MAX_MM]; /* w: [N, K] row-major blocks, 2-byte aligned */
    int a16; /* set by ember_cu_qmatmul: every w 16-byte aligned (and ember_cu_qld16 on) */
    int early; /* as ember_cu_mm.early */
} ember_cu_qmm;

/* Bytes of the quantized activations of M rows of K for weights of qtype. */
size_t ember_cu_qact_bytes(int qtype, int M, int K);

/* act = x [M, K] quantized per row for weights of qtype (the CPU's
   quantizer: blocks of 32, or of 256 for the K types). */
cudaError_t ember_cu_qact(cudaStream_t stream, int qtype, const float *x, void *act, int M, int K);

/* act = x [M, K] (K % 32 == 0) as row-major A32 records (cuda_qact.cuh) at
   any M, M * (K / 32) * 48 bytes (ember_cu_qact switches the 32-element
   types to the tensor-core tiles from 9 rows; the MLX products read these). */
cudaError_t ember_cu_qact32_rows(cudaStream_t stream, const float *x, void *act, int M, int K);

/* out_i = dot(act rows, w_i rows) (+ bias_i) for each product i; sets
   first_block. cudaErrorInvalidValue for more than 65535 blocks of 8 rows. */
cudaError_t ember_cu_qmatmul(cudaStream_t stream, ember_cu_qmm *a);

/* One input row against Q4_0, Q4_K, Q5_K or Q6_K weights through the
   one-row kernels (cuda_qmm.cu, qmv4_k and qmv_k: the same bits): 1 (the
   default) or 0 (qmm_k, the kernel of before; a measuring aid, set from
   EMBER_CUDA_QMV). */
extern int ember_cu_qmv;

/* Q4_K / Q5_K weights read as whole 16-byte words where every weight of a
   launch is 16-byte aligned (their blocks of 144 and 176 bytes then are
   too): 1 (the default) or 0 (4-byte words, the loads of before; a
   measuring aid, set from EMBER_CUDA_QLD16). The same bits either way. */
extern int ember_cu_qld16;

/* Q4_K / Q5_K / Q6_K products of 9 rows or more on the tensor cores
   (cuda_qmm.cu, qmm_tck_k): 1 (the default) or 0 (qmm_k, the dp4a kernel of
   before, a pass per 8 rows; a measuring aid, set from EMBER_CUDA_QKTC). The
   same bits either way. */
extern int ember_cu_qktc;

/* Raises the dynamic shared-memory limit of the quantized kernels that need
   more than 48 KB, on the current device; once per backend. */
cudaError_t ember_cu_qmm_prepare(void);

/* dst[i, :] = src[ids[i], :] dequantized exactly (cpu_dequant_row); rows of
   D elements, row_bytes apart. */
cudaError_t ember_cu_qget_rows(cudaStream_t stream, float *dst, const void *src, int qtype, size_t row_bytes,
                               const int32_t *ids, int n, int64_t D);

/* ---- MLX affine weights (cuda_mlx.cu) ---- */

/* 1 where the MLX products of M input rows run on the tensor cores (from 9
   rows, unless ember_cu_mlxtc is 0: the dp4a kernel at every M; a measuring
   aid, set from EMBER_CUDA_MLXTC). The same bits either way. */
extern int ember_cu_mlxtc;
int ember_cu_mlx_tc(int M);

/* out_i = dot(act rows, w_i rows) (+ bias_i) for the products a->p[0 ..
   a->n): kern_mlx.h's canonical dot product, the CPU's bits, for weights of
   one MLX dtype (`bits` 2, 3, 4, 5, 6, 8; groups of G = 32, 64, 128
   elements; K % G == 0; every w 4-byte aligned); sets first_block; a->qtype,
   a16 are not read. a->act: the input quantized as for the 32-element GGUF
   types (ember_cu_qact with EMBER_CU_Q8_0: the A32T tiles from 9 rows) where
   ember_cu_mlx_tc(M), else row-major (ember_cu_qact32_rows; the same bytes
   as ember_cu_qact below 9 rows). cudaErrorInvalidValue for other shapes or
   more than 65,535 blocks. */
cudaError_t ember_cu_mlx_matmul(cudaStream_t stream, ember_cu_qmm *a, int bits, int G);

/* dst[i, :] = src[ids[i], :] dequantized exactly (cpu_mlx_dequant_row);
   rows of D elements (D % G == 0), row_bytes apart, 4-byte aligned. */
cudaError_t ember_cu_mlx_get_rows(cudaStream_t stream, float *dst, const void *src, int bits, int G,
                                  size_t row_bytes, const int32_t *ids, int n, int64_t D);

/* dst[i, :] = src[ids[i], :] as f32; ids is device memory holding n ids,
   each already checked to be in range. */
cudaError_t ember_cu_get_rows(cudaStream_t stream, float *dst, const void *src, int dtype,
                              const int32_t *ids, int n, int64_t D);

/* The quantized form of an op's f32 output for the quantized product that
   reads it (cuda_qact.cuh): its rows quantized as ember_cu_qact would for
   a 32-element weight type into act32 and for a 256-element one into
   act256 (either NULL: not written), in the row-major layouts, so for at
   most EMBER_CU_QFUSE_MAX_M rows. Device memory of the backend's
   quantized-input scratch. */
#define EMBER_CU_QFUSE_MAX_M 8
typedef struct ember_cu_qout {
    void *act32, *act256;
} ember_cu_qout;

/* dst = x * rsqrt(mean(x^2) + eps) * (w or 1 + w), rows of D; dst may be x.
   q (or NULL): also the quantized form of dst (D a multiple of its blocks). */
cudaError_t ember_cu_rms_norm(cudaStream_t stream, float *dst, const float *x, const float *w,
                              int64_t rows, int64_t D, float eps, int plus_one, const ember_cu_qout *q);

/* x = x + h, then dst = rms_norm(x) as ember_cu_rms_norm (same bits as
   the two launches); dst may be h, not x. q as for ember_cu_rms_norm. */
cudaError_t ember_cu_add_rms_norm(cudaStream_t stream, float *dst, float *x, const float *h, const float *w,
                                  int64_t rows, int64_t D, float eps, int plus_one, const ember_cu_qout *q);

/* swiglu (kind 0) or geglu (kind 2) as ember_cu_elementwise, n elements
   (rows of a multiple of 32, of 256 for q->act256), with the quantized
   form of dst in q (not NULL). */
cudaError_t ember_cu_glu_q(cudaStream_t stream, int kind, float *dst, const float *gate, const float *up, int64_t n,
                           const ember_cu_qout *q);

/* out[r] (device, [rows]) = the first index of the largest value of row r
   of x [rows, V], NaNs skipped, 0 when all are NaN; rows <= 65535. count:
   [rows] ints of device memory that are zero (and are again after the
   launch); cand: ember_cu_argmax_cands(rows, V) floats and as many ints. */
size_t ember_cu_argmax_cands(int rows, int64_t V);
cudaError_t ember_cu_argmax(cudaStream_t stream, int32_t *out, int *count, void *cand, const float *x, int rows,
                            int64_t V);

/* out[r] (device, [rows]) = the device draw (core/draw_def.h) of row r of
   x [rows, V] with p[r] (device memory), x's rows overwritten by their
   weights (NaN: ids not usable); V <= EMBER_DRAW_MAX_IDS, rows <= 65535. */
cudaError_t ember_cu_sample(cudaStream_t stream, int32_t *out, float *x, const ember_draw *p, int rows, int64_t V);

/* The blocks a row of ember_cu_sample: 0 (the default) picks by the rows
   (8 for a few rows, 1 from 128 rows on a GPU of 132 SMs); 1, 2, 4 or 8
   force that many (at most what the GPU runs). The same tokens whatever
   it is: a testing and measuring aid. */
extern int ember_cu_sample_cluster;

/* In place on x [T, H, D]; pos [T] and inv_freq [n_rot / 2] are device memory. */
cudaError_t ember_cu_rope(cudaStream_t stream, float *x, const int32_t *pos, const float *inv_freq, int T,
                          int H, int D, int n_rot, int interleaved, float attn_factor);

/* dst = silu(gate) * up (kind 0 on a = gate, b = up), a + b (kind 1),
   gelu_tanh(gate) * up (kind 2), a * s (kind 3), s * tanh(a / s) (kind
   4) or a * sigmoid(b) (kind 5), n elements; dst may alias either input. */
cudaError_t ember_cu_elementwise(cudaStream_t stream, int kind, float *dst, const float *a, const float *b,
                                 float s, int64_t n);

/* ---- paged KV (cuda_attn.cu) ---- */

/* Keys per attention span, and the largest head size the kernels take. */
#define EMBER_CU_ATTN_SPAN 128
#define EMBER_CU_ATTN_MAX_D 512

/* One pool view of a layer (backend.h's ember_kv_layer, device side). */
typedef struct ember_cu_kv_view {
    unsigned char *pool;
    unsigned long long block_bytes, k_off, v_off, k_head, v_head;
    int k_enc, v_enc; /* EMBER_CU_F32 / F16 / BF16 */
} ember_cu_kv_view;

/* A row's block table: its ids are blocks[off .. off + n_blocks). */
typedef struct ember_cu_kv_ref {
    int32_t off, first, n_blocks, layer_set;
} ember_cu_kv_ref;

/* The map of an op, every array in device memory; H: KV heads. */
typedef struct ember_cu_kv {
    ember_cu_kv_view view[2];
    const ember_cu_kv_ref *refs;
    const int32_t *blocks, *row, *pos; /* row, pos: [T] */
    int T, H, D;
} ember_cu_kv;

/* write: encodes k[t], v[t] ([T, H, D] f32) into position pos[t] of row
   row[t]; else decodes them back. */
cudaError_t ember_cu_kv_rw(cudaStream_t stream, const ember_cu_kv *kv, float *k, float *v, int write);

/* The attention kernels (cuda_attn.cu), all giving the same bits:
   FUSED    a block per (token, query head) walks the token's spans, each
            thread loading its key / dimension from global memory (prefill);
   STAGED   the same with every span's K and V pieces first copied to shared
            memory (cp.async), all loads in flight at once (few tokens);
   SPLIT    STAGED with a block per (token, query head, span) and the spans
            combined in order by the unit's last block (decode over long
            contexts): n_span >= the spans of any token, T * Hq <= 65535,
            parts [T * Hq * n_span * (2 + D)] floats, count [T * Hq] ints
            that are zero before the launch (and are again after it). */
enum { EMBER_CU_ATTN_FUSED = 0, EMBER_CU_ATTN_STAGED = 1, EMBER_CU_ATTN_SPLIT = 2 };

/* SPLIT through the grouped kernel where a span of K and V fits the stage
   at once (cuda_attn.cu: the query heads of a KV head share one staging;
   the same bits): 1 (the default) or 0 (a measuring aid, set from
   EMBER_CUDA_ATTN_GROUP). */
extern int ember_cu_attn_group;

/* SPLIT in the tc order (bf16 KV) with several spans per block, the next
   span's copy under the current one's computation (cuda_attn.cu,
   attn_tc_pipe_k; the same bits; measured slower than the lean kernel):
   0 (the default: off), 1 (the spans per block picked from the grid) or
   N >= 2 (N spans per block, at most 8); set from EMBER_CUDA_ATTN_PIPE, a
   measuring aid. */
extern int ember_cu_attn_pipe;

/* SPLIT in the tc order with at most 16 query heads per KV head through
   the lean kernel (attn_tc_lean_k: less shared memory, three blocks per
   SM at head size 128; the same bits): 1 (the default) or 0 (the split
   kernel of before; a measuring aid, set from EMBER_CUDA_ATTN_LEAN). */
extern int ember_cu_attn_lean;

/* rope (as ember_cu_rope) of q [T, Hq, D] and k [T, kv->H, D] in place
   with positions pos and inv_freq [n_rot / 2], then kv_write of k and v
   ([T, kv->H, D]) through kv: the bits of the three launches. */
cudaError_t ember_cu_rope_kv_write(cudaStream_t stream, const ember_cu_kv *kv, float *q, int Hq, float *k,
                                   const float *v, const int32_t *pos, const float *inv_freq, int n_rot,
                                   int interleaved, float attn_factor);

/* out [T, Hq, D] = attention of q [T, Hq, D] over the keys of each token
   (cuda_attn.cu says the order of every sum) with the kernel of mode.
   tc > 0: layers that the tensor-core kernels take (bf16 K and V, head
   size 16, 32, 64 or 128) run in the tc order (cuda_attn.cu), SPLIT
   through tc split, the other modes through tc walk with tiles of up to tc
   tokens (a choice of speed only: a token's bits do not depend on it);
   tc = 0, or another layer: the span kernels. A backend must keep one tc
   setting (on or off) for its life: the two orders give other bits. */
cudaError_t ember_cu_attention(cudaStream_t stream, const ember_cu_kv *kv, float *out, const float *q, int Hq,
                               float scale, int window, float softcap, int mode, int n_span, float *parts,
                               int *count, int tc);

/* Raises the dynamic shared-memory limit of every attention kernel that
   needs more than 48 KB, on the current device. Called once per backend,
   when it is created (the limit is a property of the device's context). */
cudaError_t ember_cu_attn_prepare(void);

/* ---- gated DeltaNet (cuda_delta.cu) ---- */

/* A row of a delta_net batch: its tokens tok[start .. start + n), its
   state slots, its log (a row in a speculative round) or NULL. */
typedef struct ember_cu_delta_row {
    int32_t start, n, src, dst;
    float *log;
    int32_t log_base, pad;
} ember_cu_delta_row;

/* The arguments of delta_net (backend.h), device pointers; the rows
   in order of first appearance, tok grouped by row. */
typedef struct ember_cu_delta {
    float *out, *y, *gb;               /* [T, Hv Dv]; scratch [T, C], [T, 2 Hv] */
    const float *x, *b, *a;            /* [T, C], [T, Hv], [T, Hv] */
    const float *conv_w, *a_log, *dt_bias;
    const float *a_neg;                /* [Hv] -exp(a_log) as GGUF stores it, or NULL (then a_log) */
    float *slots;                      /* the state pool */
    const ember_cu_delta_row *rows;
    const int32_t *tok, *tok_row, *tok_j, *pos; /* [T] */
    unsigned long long slot_floats, off, log_stride, log_off;
    int T, n_rows, C, K, Hk, Hv, Dk, Dv;
    int v_tiled;                       /* value head h reads key head h % Hk (else h / (Hv / Hk)) */
    float qscale;
} ember_cu_delta;

/* delta_replay over n_layers consecutive recurrent layers of one row. */
typedef struct ember_cu_replay {
    float *slots;
    const float *log;
    unsigned long long slot_floats, layer_floats, log_stride, log_floats;
    int src, dst, n, n_layers, C, K, Hk, Hv, Dk, Dv, v_tiled;
} ember_cu_replay;

cudaError_t ember_cu_delta_net(cudaStream_t stream, const ember_cu_delta *a);
cudaError_t ember_cu_delta_replay(cudaStream_t stream, const ember_cu_replay *a);

/* dst[ids[i], :] += w[i] * src[i, :] for i = 0 .. n - 1 in order; ids and
   w device memory (checked by the caller). */
cudaError_t ember_cu_add_rows_scaled(cudaStream_t stream, float *dst, const float *src, const int32_t *ids,
                                     const float *w, int n, int64_t D);

#ifdef __cplusplus
}
#endif

#endif
