/*
 * qkern.h - quantized weights in the CPU backend: the activation formats,
 * the canonical definition of a quantized dot product, and the per-type
 * helpers shared by every ISA.
 *
 * Ownership: header only; no state. Everything here is a pure function of
 * its arguments and may run on any worker thread.
 *
 * Activations. A matmul with quantized weights first quantizes each input
 * row on its own (so a row's result never depends on the other rows):
 *   A32  (for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MLX): blocks of 32 elements,
 *        struct cpu_act32 { f32 d; f32 ds; i8 q[32] }, d = amax / 127,
 *        q = round_to_nearest_even(x * (127 / amax)) (0 when amax is 0;
 *        NaN -> -127), ds = d * (float)sum(q).
 *   A256 (for Q4_K, Q5_K, Q6_K, Q8_K): blocks of 256,
 *        struct cpu_act256 { f32 d; i16 bsums[16]; i8 q[256] }, same rule
 *        with amax over 256 elements; bsums[j] = sum of q[16j .. 16j+15].
 * The quantizers are plain C compiled once (kern_quant.c), so every ISA
 * sees the same bytes.
 *
 * The canonical dot product of a weight row w with an activation row y
 * (every ISA's kernel must give exactly this float, bit for bit):
 *   32-element types: integer weight levels w_e (Q4_0: nibble - 8, Q5_0:
 *     q5 - 16, Q8_0: qs, Q4_1 / Q5_1: the unsigned level q). For block b,
 *     lane partials p_l = sum_{e = 4l .. 4l+3} w_e * y_e (exact int32,
 *     l = 0..7), dd = f32(w.d) * y.d (one rounding), and a 16-lane f32
 *     accumulator: acc[8 * (b % 2) + l] = fmaf(dd, (float)p_l, acc[...]).
 *     The result is the fixed tree sum of acc (kernels.h). Q4_1 / Q5_1 add
 *     the min term after the tree: macc = fmaf(f32(w.m), y.ds, macc) over
 *     blocks in order, result = tree + macc.
 *   K types, per super-block b in order, with a scalar accumulator:
 *     Q4_K / Q5_K: S1 = sum_j sc_j * sum_{e in j} q_e y_e, S2 = sum_j m_j *
 *       (bsums[2j] + bsums[2j+1]) (exact int32);
 *       acc = fmaf(f32(d) * y.d, (float)S1, acc);
 *       acc = fmaf(-(f32(dmin) * y.d), (float)S2, acc).
 *     Q6_K: S1 = sum_j sc_j * sum_{e in j} (q_e - 32) y_e;
 *       acc = fmaf(f32(d) * y.d, (float)S1, acc).
 *     Q8_K: S1 = sum_e q_e y_e; acc = fmaf(w.d * y.d, (float)S1, acc).
 * Integer parts are exact in any order and the float parts are fixed, so
 * scalar, AVX2 and AVX-512 (with or without VNNI) agree bit for bit.
 */
#ifndef EMBER_CPU_QKERN_H
#define EMBER_CPU_QKERN_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/dtype.h"
#include "kernels.h"

typedef struct cpu_act32 {
    float d, ds;
    int8_t q[32];
} cpu_act32; /* 40 bytes */

typedef struct cpu_act256 {
    float d;
    int16_t bsums[16];
    int8_t q[256];
} cpu_act256; /* 292 bytes */

typedef enum cpu_act_kind { CPU_ACT_NONE = 0, CPU_ACT_32, CPU_ACT_256 } cpu_act_kind;

/* The activation format a weight dtype multiplies with (NONE for float
   weights and for dtypes the CPU backend cannot multiply). */
cpu_act_kind cpu_act_kind_for(ember_dtype t);

/* Bytes of one quantized activation row of K elements (K a multiple of the
   block), or 0 for NONE. */
size_t cpu_act_row_bytes(cpu_act_kind k, int K);

/* Quantizes one row of K floats (K a multiple of 32 / 256) into dst. */
void cpu_quantize_act32(const float *x, int K, void *dst);
void cpu_quantize_act256(const float *x, int K, void *dst);

/* Converts n elements (a whole number of blocks) of a weight dtype to f32,
   exactly as the format defines (formats/quant.h spells out the formulas).
   Returns false for a dtype it does not know. */
bool cpu_dequant_row(ember_dtype t, const void *src, float *dst, int64_t n);

/* Bytes of one row of K elements of dtype t (0 when K is not a whole number
   of blocks). */
size_t cpu_row_bytes(ember_dtype t, int64_t K);

/* The canonical quantized gemm for every supported block type (plain C):
   out[m * ldo + n] = dot(w row n, activation row m). Used as the scalar
   kernels and as the reference the SIMD kernels are tested against. */
cpu_qgemm_fn_t cpu_qgemm_generic(ember_dtype t);

/* ---- helpers shared with the SIMD files ------------------------------- */

static inline float cpu_h2f(const unsigned char *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return ember_f16_to_f32(h);
}

/* The fixed tree sum of 16 lanes (kernels.h). */
static inline float cpu_tree16(const float a[16]) {
    float s8[8], s4[4];
    for (int l = 0; l < 8; l++) s8[l] = a[l] + a[l + 8];
    for (int l = 0; l < 4; l++) s4[l] = s8[l] + s8[l + 4];
    float s0 = s4[0] + s4[2], s1 = s4[1] + s4[3];
    return s0 + s1;
}

/* Q4_K / Q5_K 6-bit scale and min of sub-block j. */
static inline void cpu_k4_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

#endif
