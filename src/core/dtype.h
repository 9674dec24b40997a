/*
 * dtype.h - element types of tensors, and exact scalar conversions.
 *
 * A dtype has a block size (elements per block) and bytes per block; plain
 * types have blocks of one element. Quantized block types (GGUF, MLX) are
 * added to this table by the quantization work.
 */
#ifndef EMBER_CORE_DTYPE_H
#define EMBER_CORE_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum ember_dtype {
    EMBER_DTYPE_INVALID = 0,
    EMBER_F32,
    EMBER_F16,
    EMBER_BF16,
    EMBER_F64,
    EMBER_F8_E4M3,
    EMBER_F8_E5M2,
    EMBER_I8,
    EMBER_I16,
    EMBER_I32,
    EMBER_I64,
    EMBER_U8,
    EMBER_U16,
    EMBER_U32,
    EMBER_U64,
    EMBER_BOOL,
    /* GGUF / ggml block-quantized types (layouts in formats/quant.h). */
    EMBER_Q4_0, /* 32 elements, 18 bytes */
    EMBER_Q4_1, /* 32 elements, 20 bytes */
    EMBER_Q5_0, /* 32 elements, 22 bytes */
    EMBER_Q5_1, /* 32 elements, 24 bytes */
    EMBER_Q8_0, /* 32 elements, 34 bytes */
    EMBER_Q8_1, /* 32 elements, 36 bytes */
    EMBER_Q2_K, /* 256 elements, 84 bytes */
    EMBER_Q3_K, /* 256 elements, 110 bytes */
    EMBER_Q4_K, /* 256 elements, 144 bytes */
    EMBER_Q5_K, /* 256 elements, 176 bytes */
    EMBER_Q6_K, /* 256 elements, 210 bytes */
    EMBER_Q8_K, /* 256 elements, 292 bytes */
    /* MLX affine group-wise types, repacked at load (layout in
       formats/mlx_quant.h): one block per group of G elements, f32 scale and
       bias then the codes; EMBER_MLX<bits>_G<G>, 8 + G * bits / 8 bytes. */
    EMBER_MLX2_G32, EMBER_MLX2_G64, EMBER_MLX2_G128,
    EMBER_MLX3_G32, EMBER_MLX3_G64, EMBER_MLX3_G128,
    EMBER_MLX4_G32, EMBER_MLX4_G64, EMBER_MLX4_G128,
    EMBER_MLX5_G32, EMBER_MLX5_G64, EMBER_MLX5_G128,
    EMBER_MLX6_G32, EMBER_MLX6_G64, EMBER_MLX6_G128,
    EMBER_MLX8_G32, EMBER_MLX8_G64, EMBER_MLX8_G128,
    EMBER_DTYPE_COUNT
} ember_dtype;

typedef struct ember_dtype_info {
    const char *name;        /* short lower-case name: "f32", "bf16", ... */
    const char *st_name;     /* safetensors spelling: "F32", "BF16", ... */
    size_t block_elems;      /* elements per block */
    size_t block_bytes;      /* bytes per block */
} ember_dtype_info;

/* Never NULL: an invalid dtype gets an entry named "invalid". */
const ember_dtype_info *ember_dtype_get(ember_dtype t);

/* The dtype with the given safetensors name, or EMBER_DTYPE_INVALID. */
ember_dtype ember_dtype_from_st_name(const char *name);

/* Bytes taken by n elements of t; false if n is not a whole number of blocks
   or on overflow. */
bool ember_dtype_nbytes(ember_dtype t, size_t n, size_t *out);

/* ---- GGUF (ggml) tensor type ids ------------------------------------ */

/* The dtype of GGUF tensor type id `ggml_type` (F32 0, F16 1, Q4_0 2, ...,
   BF16 30), or EMBER_DTYPE_INVALID for an id Ember has no dtype for (ids
   that were never assigned, were retired, or name formats without an Ember
   dtype such as the IQ* types). */
ember_dtype ember_dtype_from_gguf(uint32_t ggml_type);

/* The GGUF tensor type id of t, or -1 when GGUF has no type for t
   (U8, BOOL, F8_*, ...). */
int ember_dtype_to_gguf(ember_dtype t);

/* ---- MLX affine group-wise types ------------------------------------ */

/* The MLX dtype for bits (2, 3, 4, 5, 6, 8) and group size (32, 64, 128),
   or EMBER_DTYPE_INVALID for any other pair. */
ember_dtype ember_dtype_mlx(int bits, int group_size);

/* true when t is an MLX dtype; then *bits and *group_size (either may be
   NULL) receive its parameters. */
bool ember_dtype_mlx_params(ember_dtype t, int *bits, int *group_size);

/* ---- exact conversions ---------------------------------------------- */

static inline float ember_bits_to_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint32_t ember_f32_to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* bf16 -> f32 is exact (the top 16 bits of an f32). */
static inline float ember_bf16_to_f32(uint16_t h) {
    return ember_bits_to_f32((uint32_t)h << 16);
}

/* f32 -> bf16, round to nearest even; NaN stays a (quiet) NaN. */
static inline uint16_t ember_f32_to_bf16(float f) {
    uint32_t u = ember_f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* IEEE half -> f32, exact (subnormals, infinities and NaN included). */
float ember_f16_to_f32(uint16_t h);
/* f32 -> IEEE half, round to nearest even, overflow to infinity. */
uint16_t ember_f32_to_f16(float f);

#endif
