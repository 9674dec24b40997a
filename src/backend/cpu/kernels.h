/*
 * kernels.h - the per-ISA inner loops of the CPU backend.
 *
 * Every ISA computes a dot product the same way: 16 lanes, lane l
 * accumulating elements k with k % 16 == l (a zero-padded last chunk), then
 * the lanes summed as a fixed tree (l + l+8, then + 4, + 2, + 1). The AVX2
 * and AVX-512 paths use fused multiply-add and so give bit-identical
 * results; the scalar path multiplies and adds separately and agrees to
 * rounding. Matmul tiles only decide which dot products run together, never
 * how one is summed: a row's output does not depend on the batch.
 *
 * Quantized weights (qkern.h): the input rows are quantized one by one to
 * 8-bit blocks, and every ISA (scalar, AVX2, AVX-512 with or without VNNI)
 * computes the same canonical dot product bit for bit: exact integer
 * partial sums, then a fixed sequence of f32 fused multiply-adds.
 */
#ifndef EMBER_CPU_KERNELS_H
#define EMBER_CPU_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "core/dtype.h"
#include "ember.h"

#define EMBER_LANES 16

/* out[m * ldo + n] = dot(w + n * ldw, x + m * ldx, K) for n < nn, m < mm. */
typedef void (*cpu_gemm_fn)(const void *w, size_t ldw, int nn, const float *x, size_t ldx, int mm,
                            int K, float *out, size_t ldo);

/* Quantized weights (qkern.h): out[m * ldo + n] = canonical dot of weight
   row n (w + n * w_row bytes) with quantized activation row m (xa + m *
   xa_row bytes), for n < nn, m < mm. */
typedef void (*cpu_qgemm_fn_t)(const void *w, size_t w_row, int nn, const void *xa, size_t xa_row, int mm, int K,
                               float *out, size_t ldo);

/* Packed quantized weights (qkern.h): out[m * ldo + 16 g + r] = canonical
   dot of row r of packed group g (wp + g * 16 * row bytes) with activation
   row m, for g < ngroups, r < 16, m < mm. */
typedef void (*cpu_qgemm_packed_fn)(const void *wp, int ngroups, const void *xa, size_t xa_row, int mm, int K,
                                    float *out, size_t ldo);

/* Packed quantized weights times A32 tiles (qkern.h): out[m * ldo + 16 g
   + r] as cpu_qgemm_packed_fn, the activations read from the tiles xt. */
typedef void (*cpu_qgemm_tiled_fn)(const void *wp, int ngroups, const void *xt, int mm, int K, float *out,
                                   size_t ldo);

/* One KV head's keys for the attention kernel (kern_attn.h). */
typedef struct cpu_attn_part {
    const float *q;              /* [rep][D] query heads of this KV head */
    int rep, D;
    const unsigned char *pool;   /* the pool's bytes */
    size_t block_bytes;
    size_t k_off, v_off;         /* this layer's and head's pieces inside a block */
    const ember_kv_codec *kc, *vc;
    const int32_t *blocks;       /* the row's block table */
    int first;                   /* logical index of blocks[0] */
    float scale, softcap;
} cpu_attn_part;

/* Runs keys [j0, j1) of a (see kern_attn.h): m, l [rep], acc [rep][Dp]. */
typedef void (*cpu_attn_part_fn)(const cpu_attn_part *a, int j0, int j1, float *m, float *l, float *acc,
                                 float *scratch);

typedef struct cpu_kernels {
    ember_isa isa;
    const char *variant; /* e.g. "avx512-vnni"; for logs and tests */
    cpu_gemm_fn gemm_f32, gemm_f16, gemm_bf16;
    /* per quantized dtype; NULL: use the canonical plain-C kernel
       (cpu_qgemm_generic), which gives the same bits */
    cpu_qgemm_fn_t qgemm[EMBER_DTYPE_COUNT];
    /* per quantized dtype with a packed layout: the kernel on packed
       weights; when set, the backend packs such weights (qkern.h). The
       AMX table also sets it for EMBER_BF16 (kern_bamx.h): bf16 weights
       whose K is a multiple of 32 are then packed and multiplied on
       AMX-BF16 tiles, for every number of rows, with activations split by
       quantize_actbf16 (CPU_ACT_BF16X2) */
    cpu_qgemm_packed_fn qgemm_packed[EMBER_DTYPE_COUNT];
    /* per dtype: the kernel on packed weights and A32 tiles (AMX); the
       backend tiles the activations for matmuls of at least tiled_min_m
       rows and uses it instead of qgemm_packed */
    cpu_qgemm_tiled_fn qgemm_tiled[EMBER_DTYPE_COUNT];
    int tiled_min_m;
    /* the activation quantizers (qkern.h); same bytes on every ISA */
    void (*quantize_act32)(const float *x, int K, void *dst);
    void (*quantize_act256)(const float *x, int K, void *dst);
    void (*quantize_actbf16)(const float *x, int K, void *dst); /* CPU_ACT_BF16X2; AMX table only */
    float (*dot)(const float *a, const float *b, int n);
    void (*axpy)(float *y, float a, const float *x, int n); /* y += a * x */
    cpu_attn_part_fn attn_part;
    /* dst[i] = silu(a[i]) * b[i] for i < n (kern_ew.h); dst may be a or b */
    void (*silu_mul)(float *dst, const float *a, const float *b, int64_t n);
    /* dst[i] = a[i] + b[i] for i < n (kern_ew.h); dst may be a or b */
    void (*add)(float *dst, const float *a, const float *b, int64_t n);
    /* y[i] = (plus_one ? 1 + w[i] : w[i]) * (x[i] * r) for i < n: an rms_norm row once its
       scale r is known (kern_ew.h); y may be x */
    void (*norm_apply)(float *y, const float *x, const float *w, float r, bool plus_one, int64_t n);
    /* rotates the H heads of D values at x (one token) by cs[i], sn[i] for i < half: pairs
       (i, i + half) where neox, else (2i, 2i + 1) (kern_ew.h) */
    void (*rope_rotate)(float *x, int H, int D, int half, bool neox, const float *cs, const float *sn);
    /* the first index of the largest of x[0..n), NaNs skipped; -1 when all are NaN or n is 0
       (ember_argmax's rule; kern_ew.h) */
    int64_t (*argmax_range)(const float *x, int64_t n);
} cpu_kernels;

extern const cpu_kernels ember_cpu_kernels_scalar;
extern const cpu_kernels ember_cpu_kernels_avx2;
extern const cpu_kernels ember_cpu_kernels_avx2vnni;   /* AVX2 + AVX-VNNI */
extern const cpu_kernels ember_cpu_kernels_avx512;
extern const cpu_kernels ember_cpu_kernels_avx512vnni; /* AVX-512 + VNNI */
extern const cpu_kernels ember_cpu_kernels_amx;        /* AVX-512 + VNNI + AMX-INT8 */

/* The table for isa (which the CPU must support). */
const cpu_kernels *ember_cpu_kernels_for(ember_isa isa);

#endif
