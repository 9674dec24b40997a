/*
 * kern_mlx.h - MLX affine group-wise weights (dtypes EMBER_MLX<b>_G<G>) in
 * the CPU backend: exact row dequantization (get_rows, so quantized
 * embeddings work and tied heads reuse the same matrix) and matmul, on
 * scalar, AVX2 and AVX-512 (with and without VNNI).
 *
 * Block layout (formats/mlx_quant.h): one block per group of G elements,
 * f32 scale s, f32 bias m, then G / 32 sub-blocks of 4 * bits bytes of
 * codes in bit planes. Dequantization: w = s * (float)q + m, product and
 * sum each rounded (no FMA).
 *
 * Matmul quantizes each input row to the A32 activation format of qkern.h
 * (cpu_act32: d, ds = d * sum(q), q[32]), like the GGUF 32-element types.
 * The canonical dot product of a weight row with an activation row, which
 * every ISA's kernel gives bit for bit:
 *   acc[16] = 0, macc = 0; for each 32-element block b in order, with g its
 *   group (s_g, m_g) and q_e its codes:
 *     p_l = sum_{e = 4l .. 4l+3} q_e * y_b.q[e]   (exact int32, l = 0..7)
 *     dd = s_g * y_b.d                             (one f32 rounding)
 *     acc[8 * (b % 2) + l] = fmaf(dd, (float)p_l, acc[8 * (b % 2) + l])
 *     macc = fmaf(m_g, y_b.ds, macc)
 *   result = tree16(acc) + macc   (tree16: kernels.h's fixed lane tree)
 * i.e. sum_e (s q_e + m) x_e with x quantized per 32 elements. The integer
 * partials are exact however a kernel computes them (SIMD madd / VNNI dot
 * products), and the float steps are a fixed sequence per lane, so results
 * never depend on the ISA, the tile, the batch or the thread count.
 *
 * Ownership: no state; every function may run on any worker thread.
 */
#ifndef EMBER_CPU_KERN_MLX_H
#define EMBER_CPU_KERN_MLX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "kernels.h"

/* out[m * ldo + n] = canonical dot of weight row n (w + n * w_row bytes,
   K / G blocks of a bits-bit MLX dtype) with A32 activation row m (xa + m *
   xa_row bytes), for n < nn, m < mm. */
typedef void (*cpu_mlx_gemm_fn)(int bits, int G, const void *w, size_t w_row, int nn, const void *xa,
                                size_t xa_row, int mm, int K, float *out, size_t ldo);

/* true when t is an MLX dtype (matmul uses A32 activations for it). */
bool cpu_mlx_is(ember_dtype t);

/* Converts n elements (whole blocks) of MLX dtype t to f32, exactly.
   Returns false when t is not an MLX dtype. */
bool cpu_mlx_dequant_row(ember_dtype t, const void *src, float *dst, int64_t n);

/* The MLX gemm for a kernel table (by its ISA, and VNNI for the
   avx512-vnni table). */
cpu_mlx_gemm_fn cpu_mlx_gemm_for(const cpu_kernels *k);

/* The canonical plain-C kernel (the scalar path, and the reference the
   SIMD kernels are tested against), and the SIMD ones (call only when the
   CPU has the ISA). */
void cpu_mlx_gemm_generic(int bits, int G, const void *w, size_t w_row, int nn, const void *xa, size_t xa_row,
                          int mm, int K, float *out, size_t ldo);
void cpu_mlx_gemm_avx2(int bits, int G, const void *w, size_t w_row, int nn, const void *xa, size_t xa_row, int mm,
                       int K, float *out, size_t ldo);
void cpu_mlx_gemm_avx2vnni(int bits, int G, const void *w, size_t w_row, int nn, const void *xa, size_t xa_row, int mm,
                       int K, float *out, size_t ldo);
void cpu_mlx_gemm_avx512(int bits, int G, const void *w, size_t w_row, int nn, const void *xa, size_t xa_row,
                         int mm, int K, float *out, size_t ldo);
void cpu_mlx_gemm_avx512vnni(int bits, int G, const void *w, size_t w_row, int nn, const void *xa, size_t xa_row,
                             int mm, int K, float *out, size_t ldo);

#endif
