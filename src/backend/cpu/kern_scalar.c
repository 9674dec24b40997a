/*
 * kern_scalar.c - portable kernels for any x86-64 (and other CPUs).
 * Multiplies and adds separately (no FMA), so results agree with the SIMD
 * paths to rounding, not bit for bit.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct vec16 {
    float v[16];
} vec16;

static inline vec16 v_zero(void) {
    vec16 r;
    memset(&r, 0, sizeof r);
    return r;
}
static inline vec16 v_load_f32(const float *p) {
    vec16 r;
    memcpy(r.v, p, sizeof r.v);
    return r;
}
#include "core/dtype.h"
static inline vec16 v_load_f16(const uint16_t *p) {
    vec16 r;
    for (int l = 0; l < 16; l++) {
        uint16_t h;
        memcpy(&h, p + l, 2);
        r.v[l] = ember_f16_to_f32(h);
    }
    return r;
}
static inline vec16 v_load_bf16(const uint16_t *p) {
    vec16 r;
    for (int l = 0; l < 16; l++) {
        uint16_t h;
        memcpy(&h, p + l, 2);
        r.v[l] = ember_bf16_to_f32(h);
    }
    return r;
}
static inline vec16 v_fma(vec16 acc, vec16 a, vec16 b) {
    for (int l = 0; l < 16; l++) acc.v[l] = acc.v[l] + a.v[l] * b.v[l];
    return acc;
}
static inline float v_hsum(vec16 a) {
    float s8[8], s4[4];
    for (int l = 0; l < 8; l++) s8[l] = a.v[l] + a.v[l + 8];
    for (int l = 0; l < 4; l++) s4[l] = s8[l] + s8[l + 4];
    float s0 = s4[0] + s4[2], s1 = s4[1] + s4[3];
    return s0 + s1;
}

#include "qkern.h"

#define TILE_W 2
#define TILE_X 2
#define KPREFIX scalar_
#include "kern_template.h"

static void scalar_axpy(float *y, float a, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] = y[i] + a * x[i];
}

static inline vec16 v_set1(float f) {
    vec16 r;
    for (int l = 0; l < 16; l++) r.v[l] = f;
    return r;
}
static inline vec16 v_mul(vec16 a, vec16 b) {
    for (int l = 0; l < 16; l++) a.v[l] *= b.v[l];
    return a;
}
static inline void v_store(float *p, vec16 a) {
    memcpy(p, a.v, sizeof a.v);
}
static inline vec16 v_load_u8(const unsigned char *p) {
    vec16 r;
    for (int l = 0; l < 16; l++) r.v[l] = (float)p[l];
    return r;
}
static inline vec16 v_load_u4(const unsigned char *p, int hi) {
    vec16 r;
    for (int l = 0; l < 16; l++) r.v[l] = (float)((p[l] >> (hi ? 4 : 0)) & 0xf);
    return r;
}
static inline vec16 v_max(vec16 a, vec16 b) {
    for (int l = 0; l < 16; l++) a.v[l] = a.v[l] > b.v[l] ? a.v[l] : b.v[l];
    return a;
}
static inline float v_hmax(vec16 a) {
    float m = a.v[0];
    for (int l = 1; l < 16; l++) m = a.v[l] > m ? a.v[l] : m;
    return m;
}
static inline vec16 v_nib16(const unsigned char *p) {
    vec16 r;
    for (int l = 0; l < 16; l++) r.v[l] = (float)((p[l / 2] >> ((l & 1) * 4)) & 0xf);
    return r;
}
static inline vec16 v_lut4(const unsigned char *p, const float *t) {
    vec16 r;
    for (int l = 0; l < 16; l++) r.v[l] = t[(p[l / 2] >> ((l & 1) * 4)) & 0xf];
    return r;
}
static inline vec16 v_lut8(const unsigned char *p, const float *t) {
    vec16 r;
    for (int l = 0; l < 16; l++) r.v[l] = t[p[l]];
    return r;
}
#define ATTN_NH 4
static inline vec16 v_exp(vec16 a) {
    for (int l = 0; l < 16; l++) a.v[l] = expf(a.v[l]);
    return a;
}
static inline void v_load_u4x2(const unsigned char *p, vec16 *lo, vec16 *hi) {
    *lo = v_load_u4(p, 0);
    *hi = v_load_u4(p, 1);
}
/* Stages h = 1, 2, 4, 8: y_j = x_(j^h) + s_j x_j, s_j = -1 where bit h of j is set. */
static inline vec16 v_wht16(vec16 x) {
    for (int h = 1; h < 16; h *= 2) {
        vec16 y;
        for (int j = 0; j < 16; j++) y.v[j] = x.v[j ^ h] + ((j & h) ? -1.0f : 1.0f) * x.v[j];
        x = y;
    }
    return x;
}
#include "kern_attn.h"
static inline vec16 v_div(vec16 a, vec16 b) {
    for (int l = 0; l < 16; l++) a.v[l] /= b.v[l];
    return a;
}
#include "kern_ew.h"

const cpu_kernels ember_cpu_kernels_scalar = {
    .isa = EMBER_ISA_SCALAR,
    .variant = "scalar",
    .gemm_f32 = scalar_gemm_f32,
    .gemm_f16 = scalar_gemm_f16,
    .gemm_bf16 = scalar_gemm_bf16,
    .quantize_act32 = cpu_quantize_act32,
    .quantize_act256 = cpu_quantize_act256,
    .dot = scalar_dot,
    .axpy = scalar_axpy,
    .attn_part = scalar_attn_part,
    .silu_mul = scalar_silu_mul,
    .add = scalar_add,
    .norm_apply = scalar_norm_apply,
    .rope_rotate = scalar_rope_rotate,
    .argmax_range = scalar_argmax_range,
};
