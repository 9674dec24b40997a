/*
 * mlx_quant.c - MLX affine group-wise quantization: code access in MLX's
 * packed rows, mlx-lm's group quantizer, and repacking the three MLX
 * tensors of a module into Ember's one-block-per-group form (layouts in
 * mlx_quant.h).
 *
 * Compiled with -ffp-contract=off like everything else, so the quantizer's
 * f32 arithmetic is exactly the sequence written. No state; thread-safe.
 */
#include "mlx_quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"

bool ember_mlx_bits_ok(int bits) {
    return bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
}

bool ember_mlx_group_ok(int group_size) {
    return group_size == 32 || group_size == 64 || group_size == 128;
}

uint32_t ember_mlx_get_code(const unsigned char *row, int64_t e, int bits) {
    uint64_t o = (uint64_t)e * (uint64_t)bits;
    size_t byte = (size_t)(o >> 3);
    unsigned shift = (unsigned)(o & 7);
    uint32_t v = row[byte];
    if (shift + (unsigned)bits > 8) v |= (uint32_t)row[byte + 1] << 8;
    return (v >> shift) & ((1u << bits) - 1u);
}

void ember_mlx_put_code(unsigned char *row, int64_t e, int bits, uint32_t q) {
    uint64_t o = (uint64_t)e * (uint64_t)bits;
    size_t byte = (size_t)(o >> 3);
    unsigned shift = (unsigned)(o & 7);
    uint32_t mask = ((1u << bits) - 1u) << shift;
    uint32_t v = (q << shift) & mask;
    row[byte] = (unsigned char)((row[byte] & ~mask) | v);
    if (shift + (unsigned)bits > 8)
        row[byte + 1] = (unsigned char)((row[byte + 1] & ~(mask >> 8)) | (v >> 8));
}

/* std::max / std::min as MLX's kernel uses them (the first argument wins
   ties and NaN comparisons). */
static inline float max_first(float a, float b) {
    return a < b ? b : a;
}
static inline float min_first(float a, float b) {
    return b < a ? b : a;
}

void ember_mlx_quantize_group(const float *x, int G, int bits, uint8_t *codes, float *scale_out, float *bias_out) {
    const float n_bins = (float)((1 << bits) - 1);
    const float eps = (float)1e-7;
    float w_min = INFINITY, w_max = -INFINITY;
    for (int j = 0; j < G; j++) {
        w_max = max_first(w_max, x[j]);
        w_min = min_first(w_min, x[j]);
    }
    bool mask = fabsf(w_min) > fabsf(w_max);
    float scale = max_first((w_max - w_min) / n_bins, eps);
    scale = mask ? scale : -scale;
    float edge = mask ? w_min : w_max;
    float q0 = rintf(edge / scale);
    float bias = 0.0f;
    if (q0 != 0.0f) {
        scale = edge / q0;
        bias = edge;
    }
    for (int j = 0; j < G; j++) {
        float v = rintf((x[j] - bias) / scale);
        v = min_first(max_first(v, 0.0f), n_bins);
        codes[j] = v >= 0.0f ? (uint8_t)v : 0; /* NaN -> 0 (a cast of NaN is undefined) */
    }
    *scale_out = scale;
    *bias_out = bias;
}

/* ---- Ember's sub-block layout ------------------------------------------- */

static void pack4(const uint8_t *q, unsigned char *d) {
    for (int j = 0; j < 16; j++) d[j] = (unsigned char)((q[j] & 15) | (q[j + 16] & 15) << 4);
}
static void pack2(const uint8_t *q, int shift, unsigned char *d) {
    for (int j = 0; j < 8; j++)
        d[j] = (unsigned char)(((q[j] >> shift) & 3) | ((q[j + 8] >> shift) & 3) << 2 |
                               ((q[j + 16] >> shift) & 3) << 4 | ((q[j + 24] >> shift) & 3) << 6);
}
static void pack_bitplane(const uint8_t *q, int bit, unsigned char *d) {
    memset(d, 0, 4);
    for (int e = 0; e < 32; e++) d[e / 8] |= (unsigned char)(((q[e] >> bit) & 1) << (e % 8));
}

/* The 4 * bits bytes of one sub-block of 32 codes. */
static void pack_sub(int bits, const uint8_t *q, unsigned char *d) {
    switch (bits) {
    case 8: memcpy(d, q, 32); break;
    case 4: pack4(q, d); break;
    case 2: pack2(q, 0, d); break;
    case 3:
        pack2(q, 0, d);
        pack_bitplane(q, 2, d + 8);
        break;
    case 5:
        pack4(q, d);
        pack_bitplane(q, 4, d + 16);
        break;
    default: /* 6 */
        pack4(q, d);
        pack2(q, 4, d + 16);
        break;
    }
}

void ember_mlx_pack_block(int bits, int G, float scale, float bias, const uint8_t *codes, unsigned char *blk) {
    memcpy(blk, &scale, 4);
    memcpy(blk + 4, &bias, 4);
    for (int c = 0; c < G / 32; c++) pack_sub(bits, codes + 32 * c, blk + 8 + (size_t)c * 4 * (size_t)bits);
}

/* The 32 codes starting at a byte-aligned point of an MLX packed row:
   4 * bits bytes, in 4 chunks of 8 codes in `bits` bytes each. */
static void unpack_mlx32(const unsigned char *p, int bits, uint8_t *q) {
    const uint64_t mask = (1u << bits) - 1u;
    for (int k = 0; k < 4; k++, p += bits) {
        uint64_t v = 0;
        for (int i = 0; i < bits; i++) v |= (uint64_t)p[i] << (8 * i);
        for (int i = 0; i < 8; i++) q[8 * k + i] = (uint8_t)((v >> (i * bits)) & mask);
    }
}

/* One sub-block from MLX's packing to Ember's, for any width. 8 and 4 bits
   (the common widths) go byte to byte; the result is the same as
   pack_sub(unpack_mlx32(src)). */
static void convert_sub(int bits, const unsigned char *src, unsigned char *dst) {
    if (bits == 8) {
        memcpy(dst, src, 32);
    } else if (bits == 4) { /* MLX: element 2j low and 2j + 1 high nibble of byte j */
        for (int j = 0; j < 8; j++) {
            unsigned lo = src[j], hi = src[8 + j];
            dst[2 * j] = (unsigned char)((lo & 15) | (hi & 15) << 4);
            dst[2 * j + 1] = (unsigned char)((lo >> 4) | (hi & 0xf0));
        }
    } else {
        uint8_t q[32];
        unpack_mlx32(src, bits, q);
        pack_sub(bits, q, dst);
    }
}

static float load_scalar(ember_dtype t, const unsigned char *p, size_t i) {
    if (t == EMBER_F32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return t == EMBER_F16 ? ember_f16_to_f32(h) : ember_bf16_to_f32(h);
}

static void shape_str(char *buf, size_t n, const ember_st_tensor *t) {
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

static int check_sb(const ember_mlx_part *p, const char *what, int64_t N, int64_t groups, int G, ember_error *err) {
    const ember_st_tensor *t = p->t;
    if (t->dtype != EMBER_F32 && t->dtype != EMBER_F16 && t->dtype != EMBER_BF16)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: tensor '%s' (MLX %s) has dtype %s, expected F32, F16 or BF16",
                         p->file, p->name, what, ember_dtype_get(t->dtype)->st_name);
    if (t->ndim != 2 || t->shape[0] != N || t->shape[1] != groups) {
        char got[96];
        shape_str(got, sizeof got, t);
        return ember_err(err, EMBER_ERR_FORMAT, "%s: tensor '%s' (MLX %s) has shape %s, expected [%lld, %lld] (group_size %d)",
                         p->file, p->name, what, got, (long long)N, (long long)groups, G);
    }
    return EMBER_OK;
}

int ember_mlx_repack(const ember_mlx_part *weight, const ember_mlx_part *scales, const ember_mlx_part *biases, int bits,
                     int G, int64_t N, int64_t K, void **out, size_t *nbytes, ember_error *err) {
    *out = NULL;
    *nbytes = 0;
    if (!ember_mlx_bits_ok(bits) || !ember_mlx_group_ok(G))
        return ember_err(err, EMBER_ERR_FORMAT, "%s: tensor '%s': MLX bits %d / group_size %d are not supported", weight->file,
                         weight->name, bits, G);
    if (N < 1 || K < 1 || K % G)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: tensor '%s': rows of %lld elements are not whole groups of %d",
                         weight->file, weight->name, (long long)K, G);
    const ember_st_tensor *w = weight->t;
    int64_t words = K * bits / 32;
    if (w->dtype != EMBER_U32)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: tensor '%s' is %s, expected U32 packed MLX codes", weight->file,
                         weight->name, ember_dtype_get(w->dtype)->st_name);
    if (w->ndim != 2 || w->shape[0] != N) {
        char got[96];
        shape_str(got, sizeof got, w);
        return ember_err(err, EMBER_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected [%lld, %lld]", weight->file,
                         weight->name, got, (long long)N, (long long)words);
    }
    if (w->shape[1] != words)
        return ember_err(err, EMBER_ERR_FORMAT,
                         "%s: tensor '%s' has %lld packed columns, expected %lld for %d-bit codes of %lld elements "
                         "(wrong packed width)",
                         weight->file, weight->name, (long long)w->shape[1], (long long)words, bits, (long long)K);
    int rc;
    if ((rc = check_sb(scales, "scales", N, K / G, G, err)) || (rc = check_sb(biases, "biases", N, K / G, G, err)))
        return rc;
    ember_dtype dt = ember_dtype_mlx(bits, G);
    size_t bytes;
    if (!ember_dtype_nbytes(dt, (size_t)N * (size_t)K, &bytes) || (size_t)N > SIZE_MAX / (size_t)K)
        return ember_err(err, EMBER_ERR_LIMIT, "%s: tensor '%s' is too large", weight->file, weight->name);
    unsigned char *dst = ember_malloc(bytes ? bytes : 1);
    if (!dst) return ember_err(err, EMBER_ERR_NOMEM, "out of memory repacking '%s'", weight->name);
    const size_t row_in = (size_t)K * (size_t)bits / 8, bb = ember_dtype_get(dt)->block_bytes;
    const int64_t groups = K / G;
    unsigned char *d = dst;
    const size_t sub_in = 4 * (size_t)bits; /* bytes of 32 codes, in MLX's packing and in Ember's */
    for (int64_t n = 0; n < N; n++) {
        const unsigned char *src = w->data + (size_t)n * row_in;
        for (int64_t g = 0; g < groups; g++, d += bb) {
            size_t si = (size_t)n * (size_t)groups + (size_t)g;
            float sc = load_scalar(scales->t->dtype, scales->t->data, si);
            float bi = load_scalar(biases->t->dtype, biases->t->data, si);
            memcpy(d, &sc, 4);
            memcpy(d + 4, &bi, 4);
            for (int c = 0; c < G / 32; c++, src += sub_in) convert_sub(bits, src, d + 8 + (size_t)c * sub_in);
        }
    }
    *out = dst;
    *nbytes = bytes;
    return EMBER_OK;
}
