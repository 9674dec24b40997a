/*
 * kern_mlx.c - the plain-C side of MLX weights in the CPU backend (see
 * kern_mlx.h): exact dequantization, the canonical dot product (the scalar
 * kernel and the reference for the SIMD ones), and the choice of kernel
 * per ISA.
 *
 * Compiled with baseline flags; -ffp-contract=off keeps each multiply and
 * add as written, and fmaf is the C library's correctly rounded fused
 * multiply-add. No state.
 */
#include <math.h>
#include <string.h>

#include "kern_mlx.h"
#include "qkern.h"

bool cpu_mlx_is(ember_dtype t) {
    return ember_dtype_mlx_params(t, NULL, NULL);
}

/* The nibble plane's and the 2-bit plane's part of code e (0..31). */
static inline int nib_at(const uint8_t *p, int e) {
    return e < 16 ? (p[e] & 15) : (p[e - 16] >> 4);
}
static inline int two_at(const uint8_t *p, int e) {
    return (p[e & 7] >> (2 * (e >> 3))) & 3;
}

/* Code e (0..31) of a sub-block in Ember's bit-plane layout; reads only
   the sub-block's 4 * bits bytes. */
static inline int mlx_code(const uint8_t *sb, int e, int bits) {
    switch (bits) {
    case 8: return sb[e];
    case 4: return nib_at(sb, e);
    case 2: return two_at(sb, e);
    case 3: return two_at(sb, e) | ((sb[8 + (e >> 3)] >> (e & 7)) & 1) << 2;
    case 5: return nib_at(sb, e) | ((sb[16 + (e >> 3)] >> (e & 7)) & 1) << 4;
    default: return nib_at(sb, e) | two_at(sb + 16, e) << 4; /* 6 */
    }
}

bool cpu_mlx_dequant_row(ember_dtype t, const void *src, float *dst, int64_t n) {
    int bits, G;
    if (!ember_dtype_mlx_params(t, &bits, &G)) return false;
    const unsigned char *p = src;
    const size_t bb = ember_dtype_get(t)->block_bytes;
    for (int64_t blk = 0; blk < n / G; blk++, p += bb, dst += G) {
        float s, m;
        memcpy(&s, p, 4);
        memcpy(&m, p + 4, 4);
        for (int c = 0; c < G / 32; c++) {
            const uint8_t *sb = p + 8 + (size_t)c * 4 * (size_t)bits;
            for (int e = 0; e < 32; e++) {
                float w = s * (float)mlx_code(sb, e, bits);
                dst[32 * c + e] = w + m;
            }
        }
    }
    return true;
}

/* The canonical dot product (kern_mlx.h) of one weight row with one
   activation row of nb blocks. */
static float mlx_dot(int bits, int G, const unsigned char *w, const cpu_act32 *y, int nb) {
    const int per_g = G / 32;
    const size_t bb = 8 + (size_t)G * (size_t)bits / 8, sbb = 4 * (size_t)bits;
    float acc[16] = {0}, macc = 0.0f;
    for (int b = 0; b < nb; b++, y++) {
        const unsigned char *blk = w + (size_t)(b / per_g) * bb;
        const uint8_t *sb = blk + 8 + (size_t)(b % per_g) * sbb;
        float s, m;
        memcpy(&s, blk, 4);
        memcpy(&m, blk + 4, 4);
        float dd = s * y->d;
        for (int l = 0; l < 8; l++) {
            int p = 0;
            for (int e = 4 * l; e < 4 * l + 4; e++) p += mlx_code(sb, e, bits) * y->q[e];
            float *a = &acc[8 * (b % 2) + l];
            *a = fmaf(dd, (float)p, *a);
        }
        macc = fmaf(m, y->ds, macc);
    }
    return cpu_tree16(acc) + macc;
}

void cpu_mlx_gemm_generic(int bits, int G, const void *w, size_t w_row, int nn, const void *xa, size_t xa_row,
                          int mm, int K, float *out, size_t ldo) {
    for (int m = 0; m < mm; m++) {
        const cpu_act32 *y = (const cpu_act32 *)(const void *)((const unsigned char *)xa + (size_t)m * xa_row);
        for (int n = 0; n < nn; n++)
            out[(size_t)m * ldo + (size_t)n] = mlx_dot(bits, G, (const unsigned char *)w + (size_t)n * w_row, y, K / 32);
    }
}

cpu_mlx_gemm_fn cpu_mlx_gemm_for(const cpu_kernels *k) {
    switch (k->isa) {
    case EMBER_ISA_AMX: return cpu_mlx_gemm_avx512vnni;
    case EMBER_ISA_AVX512: return k == &ember_cpu_kernels_avx512vnni ? cpu_mlx_gemm_avx512vnni : cpu_mlx_gemm_avx512;
    case EMBER_ISA_AVX2: return k == &ember_cpu_kernels_avx2vnni ? cpu_mlx_gemm_avx2vnni : cpu_mlx_gemm_avx2;
    default: return cpu_mlx_gemm_generic;
    }
}
