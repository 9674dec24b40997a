/* dtype.c - the dtype table and half-precision conversions. */
#include "dtype.h"

#include "util.h"

static const ember_dtype_info k_info[EMBER_DTYPE_COUNT] = {
    [EMBER_DTYPE_INVALID] = {"invalid", "INVALID", 1, 0},
    [EMBER_F32] = {"f32", "F32", 1, 4},
    [EMBER_F16] = {"f16", "F16", 1, 2},
    [EMBER_BF16] = {"bf16", "BF16", 1, 2},
    [EMBER_F64] = {"f64", "F64", 1, 8},
    [EMBER_F8_E4M3] = {"f8_e4m3", "F8_E4M3", 1, 1},
    [EMBER_F8_E5M2] = {"f8_e5m2", "F8_E5M2", 1, 1},
    [EMBER_I8] = {"i8", "I8", 1, 1},
    [EMBER_I16] = {"i16", "I16", 1, 2},
    [EMBER_I32] = {"i32", "I32", 1, 4},
    [EMBER_I64] = {"i64", "I64", 1, 8},
    [EMBER_U8] = {"u8", "U8", 1, 1},
    [EMBER_U16] = {"u16", "U16", 1, 2},
    [EMBER_U32] = {"u32", "U32", 1, 4},
    [EMBER_U64] = {"u64", "U64", 1, 8},
    [EMBER_BOOL] = {"bool", "BOOL", 1, 1},
    /* Block types have no safetensors dtype; st_name holds the GGUF
       spelling (used in messages). Note that ember_dtype_from_st_name
       matches these spellings too. */
    [EMBER_Q4_0] = {"q4_0", "Q4_0", 32, 18},
    [EMBER_Q4_1] = {"q4_1", "Q4_1", 32, 20},
    [EMBER_Q5_0] = {"q5_0", "Q5_0", 32, 22},
    [EMBER_Q5_1] = {"q5_1", "Q5_1", 32, 24},
    [EMBER_Q8_0] = {"q8_0", "Q8_0", 32, 34},
    [EMBER_Q8_1] = {"q8_1", "Q8_1", 32, 36},
    [EMBER_Q2_K] = {"q2_k", "Q2_K", 256, 84},
    [EMBER_Q3_K] = {"q3_k", "Q3_K", 256, 110},
    [EMBER_Q4_K] = {"q4_k", "Q4_K", 256, 144},
    [EMBER_Q5_K] = {"q5_k", "Q5_K", 256, 176},
    [EMBER_Q6_K] = {"q6_k", "Q6_K", 256, 210},
    [EMBER_Q8_K] = {"q8_k", "Q8_K", 256, 292},
    /* MLX: one group per block (f32 scale, f32 bias, codes); see formats/mlx_quant.h */
    [EMBER_MLX2_G32] = {"mlx2_g32", "MLX2_G32", 32, 16},
    [EMBER_MLX2_G64] = {"mlx2_g64", "MLX2_G64", 64, 24},
    [EMBER_MLX2_G128] = {"mlx2_g128", "MLX2_G128", 128, 40},
    [EMBER_MLX3_G32] = {"mlx3_g32", "MLX3_G32", 32, 20},
    [EMBER_MLX3_G64] = {"mlx3_g64", "MLX3_G64", 64, 32},
    [EMBER_MLX3_G128] = {"mlx3_g128", "MLX3_G128", 128, 56},
    [EMBER_MLX4_G32] = {"mlx4_g32", "MLX4_G32", 32, 24},
    [EMBER_MLX4_G64] = {"mlx4_g64", "MLX4_G64", 64, 40},
    [EMBER_MLX4_G128] = {"mlx4_g128", "MLX4_G128", 128, 72},
    [EMBER_MLX5_G32] = {"mlx5_g32", "MLX5_G32", 32, 28},
    [EMBER_MLX5_G64] = {"mlx5_g64", "MLX5_G64", 64, 48},
    [EMBER_MLX5_G128] = {"mlx5_g128", "MLX5_G128", 128, 88},
    [EMBER_MLX6_G32] = {"mlx6_g32", "MLX6_G32", 32, 32},
    [EMBER_MLX6_G64] = {"mlx6_g64", "MLX6_G64", 64, 56},
    [EMBER_MLX6_G128] = {"mlx6_g128", "MLX6_G128", 128, 104},
    [EMBER_MLX8_G32] = {"mlx8_g32", "MLX8_G32", 32, 40},
    [EMBER_MLX8_G64] = {"mlx8_g64", "MLX8_G64", 64, 72},
    [EMBER_MLX8_G128] = {"mlx8_g128", "MLX8_G128", 128, 136},
};

/* GGUF tensor type id -> dtype; ids not listed have no Ember dtype. */
static const struct {
    uint32_t id;
    ember_dtype t;
} k_gguf[] = {
    {0, EMBER_F32},   {1, EMBER_F16},   {2, EMBER_Q4_0},  {3, EMBER_Q4_1},  {6, EMBER_Q5_0},
    {7, EMBER_Q5_1},  {8, EMBER_Q8_0},  {9, EMBER_Q8_1},  {10, EMBER_Q2_K}, {11, EMBER_Q3_K},
    {12, EMBER_Q4_K}, {13, EMBER_Q5_K}, {14, EMBER_Q6_K}, {15, EMBER_Q8_K}, {24, EMBER_I8},
    {25, EMBER_I16},  {26, EMBER_I32},  {27, EMBER_I64},  {28, EMBER_F64},  {30, EMBER_BF16},
};

ember_dtype ember_dtype_from_gguf(uint32_t ggml_type) {
    for (size_t i = 0; i < sizeof k_gguf / sizeof k_gguf[0]; i++)
        if (k_gguf[i].id == ggml_type) return k_gguf[i].t;
    return EMBER_DTYPE_INVALID;
}

int ember_dtype_to_gguf(ember_dtype t) {
    for (size_t i = 0; i < sizeof k_gguf / sizeof k_gguf[0]; i++)
        if (k_gguf[i].t == t) return (int)k_gguf[i].id;
    return -1;
}

const ember_dtype_info *ember_dtype_get(ember_dtype t) {
    if ((int)t <= 0 || t >= EMBER_DTYPE_COUNT) return &k_info[EMBER_DTYPE_INVALID];
    return &k_info[t];
}

ember_dtype ember_dtype_from_st_name(const char *name) {
    for (int t = 1; t < EMBER_DTYPE_COUNT; t++) /* safetensors has no block types */
        if (k_info[t].block_elems == 1 && strcmp(k_info[t].st_name, name) == 0) return (ember_dtype)t;
    return EMBER_DTYPE_INVALID;
}

bool ember_dtype_nbytes(ember_dtype t, size_t n, size_t *out) {
    const ember_dtype_info *d = ember_dtype_get(t);
    if (d->block_bytes == 0 || n % d->block_elems) return false;
    return ember_mul_ok(n / d->block_elems, d->block_bytes, out);
}

static const int k_mlx_bits[] = {2, 3, 4, 5, 6, 8};

ember_dtype ember_dtype_mlx(int bits, int group_size) {
    int g = group_size == 32 ? 0 : group_size == 64 ? 1 : group_size == 128 ? 2 : -1;
    for (int i = 0; g >= 0 && i < 6; i++)
        if (k_mlx_bits[i] == bits) return (ember_dtype)(EMBER_MLX2_G32 + 3 * i + g);
    return EMBER_DTYPE_INVALID;
}

bool ember_dtype_mlx_params(ember_dtype t, int *bits, int *group_size) {
    if (t < EMBER_MLX2_G32 || t > EMBER_MLX8_G128) return false;
    int i = (int)(t - EMBER_MLX2_G32);
    if (bits) *bits = k_mlx_bits[i / 3];
    if (group_size) *group_size = 32 << (i % 3);
    return true;
}

float ember_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13); /* inf / nan */
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else { /* subnormal: normalise */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400u));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    return ember_bits_to_f32(u);
}

uint16_t ember_f32_to_f16(float f) {
    uint32_t u = ember_f32_to_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t au = u & 0x7fffffffu;
    if (au > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((au >> 13) & 0x3ffu)); /* nan */
    if (au >= 0x47800000u) { /* >= 65536 before rounding: check with rounding */
        return (uint16_t)(sign | 0x7c00u);
    }
    int32_t exp = (int32_t)(au >> 23) - 127;
    if (exp >= -14) { /* normal half (may round up to inf) */
        uint32_t man = au & 0x7fffffu;
        uint32_t h = ((uint32_t)(exp + 15) << 10) | (man >> 13);
        uint32_t rem = man & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
        return (uint16_t)(sign | h); /* carry into exponent gives inf correctly */
    }
    if (exp < -25) return sign; /* rounds to zero (below half the smallest subnormal) */
    /* subnormal half: value = man24 * 2^(exp-23); half ulp = 2^-24 */
    uint32_t man = (au & 0x7fffffu) | 0x800000u;
    int shift = 13 + (-14 - exp); /* 14..24 bits drop below the 2^-24 unit */
    uint32_t h = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}
