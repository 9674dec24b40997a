/*
 * mlx_quant.h - MLX affine group-wise quantization (the mlx-community
 * safetensors layout), and Ember's repacked block form of it.
 *
 * The MLX layout (read in MLX's quantize / dequantize ops and CPU backend,
 * and mlx-lm's loader and converter). A quantized linear or embedding
 * module M whose float matrix is W [N, K] is stored as three tensors:
 *   M.weight  U32 [N, K * bits / 32]: each row's K codes as one
 *             little-endian bit stream; code e occupies stream bits
 *             [e * bits, (e + 1) * bits), and stream bit i is bit i % 32 of
 *             word i / 32 (words are little-endian, so the stream is also
 *             the row's bytes in order, bit 0 first). For 2, 4, 8 bits a
 *             word holds 32 / bits whole codes, the lowest first; 3-, 5- and
 *             6-bit codes straddle words (8 codes in 3 or 5 bytes, 4 in 3).
 *   M.scales  [N, K / G] and
 *   M.biases  [N, K / G], both in a float dtype (F32, F16 or BF16: mlx-lm
 *             writes the model's dtype, usually BF16).
 * Element e of row n is  W[n][e] = scales[n][e / G] * code_e + biases[n][e / G],
 * with bits in {2, 3, 4, 5, 6, 8} and the group size G in {32, 64, 128}.
 *
 * Ember's definition of that formula in f32 (what "exact" means for every
 * kernel): s = f32(scale), m = f32(bias) (exact widenings), then
 * w = s * (float)code + m with the product rounded, then the sum rounded
 * (no fused multiply-add). For F16 / BF16 scales the product is exact, so
 * this is also fmaf(s, code, m). MLX's own dequantize op rounds the result
 * once more to the scales' dtype; its matmul kernels, like Ember's, work in
 * f32.
 *
 * config.json (formats/config.h parses it): "quantization": {"group_size":
 * G, "bits": b, "mode": "affine" (optional)} plus per-module entries keyed
 * by module path ("model.layers.3.mlp.down_proj", "lm_head",
 * "model.embed_tokens"): false (the module stays float) or an object with
 * its own group_size / bits. mlx-lm also writes a copy under
 * "quantization_config". A module without an entry is quantized exactly
 * when its "<module>.scales" tensor exists.
 *
 * mlx-lm's quantizer (MLX's CPU quantize kernel), per group of G floats,
 * all in f32: max / min of the group; the end with the larger magnitude is
 * the "edge"; scale = max((max - min) / (2^bits - 1), 1e-7), negated when
 * the edge is the max; q0 = rint(edge / scale); if q0 != 0 then scale =
 * edge / q0 and bias = edge, else bias = 0; code = clamp(rint((x - bias) /
 * scale), 0, 2^bits - 1). Scales and biases are then rounded to the output
 * dtype (the codes were computed with the f32 values). So the edge value is
 * exact and zero is a representable level.
 *
 * Ember's block form (dtypes EMBER_MLX<bits>_G<G>, core/dtype.h). MLX keeps
 * codes, scales and biases in three arrays; Ember repacks them at load into
 * one block per group, so a row is K / G blocks:
 *   f32 scale, f32 bias (little-endian), then G / 32 sub-blocks of
 *   4 * bits bytes, sub-block c holding the codes q[0..31] of elements
 *   32c .. 32c + 31 of the group:
 *     8 bits: q[e] in byte e
 *     4 bits: byte j (j < 16) = q[j] | q[j + 16] << 4
 *     2 bits: byte j (j < 8)  = q[j] | q[j + 8] << 2 | q[j + 16] << 4 | q[j + 24] << 6
 *     3 bits: the 2-bit layout of q & 3 (8 bytes), then 4 bytes whose bit e
 *             (bit e % 8 of byte e / 8) is q[e] >> 2
 *     5 bits: the 4-bit layout of q & 15 (16 bytes), then 4 bytes of q[e] >> 4
 *             as for 3 bits
 *     6 bits: the 4-bit layout of q & 15 (16 bytes), then the 2-bit layout
 *             of q >> 4 (8 bytes)
 * These planes let SIMD kernels unpack 32 codes with a few shifts and masks.
 * The scale and bias are the exact f32 values of the file's; the codes are
 * the file's codes. The CPU backend (backend/cpu/kern_mlx.h) reads this form.
 *
 * Nothing here keeps state; all functions are thread-safe.
 */
#ifndef EMBER_FORMATS_MLX_QUANT_H
#define EMBER_FORMATS_MLX_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/error.h"
#include "formats/safetensors.h"

/* true for the bit widths and group sizes MLX's affine mode supports. */
bool ember_mlx_bits_ok(int bits);
bool ember_mlx_group_ok(int group_size);

/* Code e of an MLX packed row (the little-endian bit stream above). */
uint32_t ember_mlx_get_code(const unsigned char *row, int64_t e, int bits);

/* Stores code q (< 2^bits) as element e of an MLX packed row, leaving the
   other codes unchanged. */
void ember_mlx_put_code(unsigned char *row, int64_t e, int bits, uint32_t q);

/* mlx-lm's quantizer for one group of G floats (see above): codes[G] (one
   per byte) and the f32 scale and bias. Non-finite input never causes
   undefined behaviour (NaN codes become 0). */
void ember_mlx_quantize_group(const float *x, int G, int bits, uint8_t *codes, float *scale, float *bias);

/* Writes one Ember block (one group of G codes, one per byte) of the given
   bit width. */
void ember_mlx_pack_block(int bits, int G, float scale, float bias, const uint8_t *codes, unsigned char *blk);

/* One of the three tensors of a quantized module, with the file it is in
   (for messages). */
typedef struct ember_mlx_part {
    const char *name; /* full tensor name, e.g. "lm_head.scales" */
    const char *file;
    const ember_st_tensor *t;
} ember_mlx_part;

/*
 * Checks the three tensors of a quantized [N, K] matrix against bits and
 * group size G, and repacks them into Ember blocks (dtype
 * ember_dtype_mlx(bits, G)). On success *out is a malloc'd buffer of
 * *nbytes bytes (N * K / G blocks) the caller frees. Errors are one line
 * naming the file and tensor: a weight that is not U32 [N, K * bits / 32]
 * ("wrong packed width"), scales or biases that are not F32 / F16 / BF16
 * [N, K / G], or K not a multiple of G.
 */
int ember_mlx_repack(const ember_mlx_part *weight, const ember_mlx_part *scales, const ember_mlx_part *biases,
                     int bits, int G, int64_t N, int64_t K, void **out, size_t *nbytes, ember_error *err);

#endif
