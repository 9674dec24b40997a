/*
 * quant.h - the GGUF (ggml) block-quantized formats: their byte layouts,
 * and slow, obviously-correct reference conversions to and from f32.
 *
 * These are the references that faster kernels (SIMD, CUDA) are tested
 * against, and the encoder behind `ember quantize`. They favour clarity
 * over speed: one element at a time, in the order the format defines.
 *
 * Layouts. Every block is a fixed number of elements (32, or 256 for the
 * "K" super-blocks) stored in a fixed number of bytes; all multi-byte
 * fields are little-endian; "half" is an IEEE binary16 scale. Blocks are
 * packed back to back with no padding, so a block may sit at any address
 * that is a multiple of 2 (4 for Q8_K). The reference functions below copy
 * each block out with memcpy, so they accept any alignment.
 *
 *   Q4_0  32 el, 18 B: half d; u8 qs[16].
 *         x[j] = (lo4(qs[j]) - 8) * d, x[j+16] = (hi4(qs[j]) - 8) * d  (j < 16)
 *   Q4_1  32 el, 20 B: half d, m; u8 qs[16].   x = q * d + m
 *   Q5_0  32 el, 22 B: half d; u8 qh[4]; u8 qs[16]. The fifth bit of element
 *         i is bit i of the little-endian u32 qh; x = (q - 16) * d
 *   Q5_1  32 el, 24 B: half d, m; u8 qh[4]; u8 qs[16].  x = q * d + m
 *   Q8_0  32 el, 34 B: half d; i8 qs[32].      x = qs * d
 *   Q8_1  32 el, 36 B: half d, s; i8 qs[32].   x = qs * d; s = d * sum(qs)
 *   Q2_K 256 el, 84 B: u8 scales[16]; u8 qs[64]; half d, dmin.
 *         16 sub-blocks of 16; scales[j] = scale (low 4 bits) | min (high 4)
 *         x = d * scale * q - dmin * min, q in 0..3
 *   Q3_K 256 el, 110 B: u8 hmask[32]; u8 qs[64]; u8 scales[12]; half d.
 *         16 sub-blocks of 16, 6-bit scales stored minus 32 (see quant.c);
 *         x = d * (scale - 32) * (q - 4 * !high_bit), q in 0..3
 *   Q4_K 256 el, 144 B: half d, dmin; u8 scales[12]; u8 qs[128].
 *         8 sub-blocks of 32, 6-bit scale and min each (packed in 12 bytes)
 *         x = d * scale * q - dmin * min, q in 0..15
 *   Q5_K 256 el, 176 B: half d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128].
 *         as Q4_K with a fifth bit in qh, q in 0..31
 *   Q6_K 256 el, 210 B: u8 ql[128]; u8 qh[64]; i8 scales[16]; half d.
 *         16 sub-blocks of 16, x = d * scale * (q - 32), q in 0..63
 *   Q8_K 256 el, 292 B: f32 d; i8 qs[256]; i16 bsums[16].
 *         x = d * qs; bsums[j] = sum of qs[16j .. 16j+15]
 *   (quant.c spells out, at each function, where every bit of q lives.)
 *
 * Dequantization is exact: it evaluates the format's formula in f32, in
 * the order written above (products left to right, e.g. (d * scale) * q),
 * with the half scales widened by ember_f16_to_f32. Any block bytes are
 * valid input (NaN or infinite scales give NaN or infinite outputs).
 *
 * Quantization: for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 and Q8_K the format
 * comes with a canonical rounding rule (scale from the block's extreme
 * value, then round each element), and these encoders follow it exactly,
 * so their blocks are bit-identical to any other faithful implementation
 * on finite input (except blocks so tiny that 1/d overflows, where the rule
 * itself is undefined; here they get a defined, valid block). The K formats (Q4_K, Q5_K, Q6_K) have no canonical
 * encoder - any choice of scales is a valid block - so Ember uses its own:
 * per sub-block, a small least-squares search for scale (and min), then
 * 6- or 8-bit scale codes against an f16 super-block scale, then each
 * element rounded to the nearest level of its decoded scale. Non-finite
 * inputs never cause undefined behaviour; their blocks are valid but their
 * contents are unspecified.
 *
 * Nothing here allocates or keeps state; all functions are thread-safe.
 */
#ifndef EMBER_FORMATS_QUANT_H
#define EMBER_FORMATS_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/error.h"

#define EMBER_QK 32    /* elements per block of Q4_0 .. Q8_1 */
#define EMBER_QK_K 256 /* elements per K super-block */

/* The block layouts as C structs (halves as raw uint16_t bits). Useful for
   kernels; sizes are checked against the dtype table in quant.c. A pointer
   into a file may only be cast to one of these when suitably aligned. */
typedef struct ember_block_q4_0 {
    uint16_t d;
    uint8_t qs[16];
} ember_block_q4_0;
typedef struct ember_block_q4_1 {
    uint16_t d, m;
    uint8_t qs[16];
} ember_block_q4_1;
typedef struct ember_block_q5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[16];
} ember_block_q5_0;
typedef struct ember_block_q5_1 {
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[16];
} ember_block_q5_1;
typedef struct ember_block_q8_0 {
    uint16_t d;
    int8_t qs[32];
} ember_block_q8_0;
typedef struct ember_block_q8_1 {
    uint16_t d, s;
    int8_t qs[32];
} ember_block_q8_1;
typedef struct ember_block_q2_k {
    uint8_t scales[16];
    uint8_t qs[64];
    uint16_t d, dmin;
} ember_block_q2_k;
typedef struct ember_block_q3_k {
    uint8_t hmask[32];
    uint8_t qs[64];
    uint8_t scales[12];
    uint16_t d;
} ember_block_q3_k;
typedef struct ember_block_q4_k {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qs[128];
} ember_block_q4_k;
typedef struct ember_block_q5_k {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[32];
    uint8_t qs[128];
} ember_block_q5_k;
typedef struct ember_block_q6_k {
    uint8_t ql[128];
    uint8_t qh[64];
    int8_t scales[16];
    uint16_t d;
} ember_block_q6_k;
typedef struct ember_block_q8_k {
    float d;
    int8_t qs[256];
    int16_t bsums[16];
} ember_block_q8_k;

/* ---- per-format references -------------------------------------------
   dequant: reads nblocks blocks at src (any alignment), writes
   nblocks * block_elems floats to dst. Never fails.
   quant: reads nblocks * block_elems floats, writes nblocks blocks to dst
   (any alignment; every byte of each block is written). Never fails. */

void ember_dequant_q4_0(const void *src, float *dst, size_t nblocks);
void ember_dequant_q4_1(const void *src, float *dst, size_t nblocks);
void ember_dequant_q5_0(const void *src, float *dst, size_t nblocks);
void ember_dequant_q5_1(const void *src, float *dst, size_t nblocks);
void ember_dequant_q8_0(const void *src, float *dst, size_t nblocks);
void ember_dequant_q8_1(const void *src, float *dst, size_t nblocks);
void ember_dequant_q2_k(const void *src, float *dst, size_t nblocks);
void ember_dequant_q3_k(const void *src, float *dst, size_t nblocks);
void ember_dequant_q4_k(const void *src, float *dst, size_t nblocks);
void ember_dequant_q5_k(const void *src, float *dst, size_t nblocks);
void ember_dequant_q6_k(const void *src, float *dst, size_t nblocks);
void ember_dequant_q8_k(const void *src, float *dst, size_t nblocks);

void ember_quant_q4_0(const float *src, void *dst, size_t nblocks);
void ember_quant_q4_1(const float *src, void *dst, size_t nblocks);
void ember_quant_q5_0(const float *src, void *dst, size_t nblocks);
void ember_quant_q5_1(const float *src, void *dst, size_t nblocks);
void ember_quant_q8_0(const float *src, void *dst, size_t nblocks);
void ember_quant_q8_1(const float *src, void *dst, size_t nblocks);
void ember_quant_q4_k(const float *src, void *dst, size_t nblocks);
void ember_quant_q5_k(const float *src, void *dst, size_t nblocks);
void ember_quant_q6_k(const float *src, void *dst, size_t nblocks);
void ember_quant_q8_k(const float *src, void *dst, size_t nblocks);

/* Packs the eight 6-bit scales and mins (0..63) of a Q4_K / Q5_K block into
   its 12 scale bytes (the layout above; the inverse of reading them). */
void ember_q4k_pack_scales(uint8_t s[12], const uint8_t sc[8], const uint8_t mn[8]);

/* ---- by dtype ---------------------------------------------------------- */

/* True when ember_dequantize handles t: F32, F16, BF16 and every block
   type above. */
bool ember_can_dequantize(ember_dtype t);
/* True when ember_quantize handles t: F32, F16, BF16, Q4_0, Q4_1, Q5_0,
   Q5_1, Q8_0, Q8_1, Q4_K, Q5_K, Q6_K, Q8_K. */
bool ember_can_quantize(ember_dtype t);

/* Converts n elements of type t at src to f32 at dst. Returns EMBER_OK, or
   EMBER_ERR_UNSUPPORTED for a type it cannot read, or EMBER_ERR_INVALID_ARG
   when n is not a whole number of blocks. Writes nothing on error. */
int ember_dequantize(ember_dtype t, const void *src, float *dst, size_t n, ember_error *err);

/* Converts n f32 elements at src to type t at dst (ember_dtype_nbytes(t, n)
   bytes). Errors as ember_dequantize. F16/BF16 round to nearest even. */
int ember_quantize(ember_dtype t, const float *src, void *dst, size_t n, ember_error *err);

#endif
