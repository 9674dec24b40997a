/*
 * test_dtype.c - exact half / bfloat16 conversions. The F16C instructions
 * (when the CPU has them) are the independent oracle for f16; bf16 is
 * checked against its definition (the top 16 bits, rounded to nearest even).
 */
#include <immintrin.h>

#include "core/cpu.h"
#include "core/dtype.h"
#include "test.h"

__attribute__((target("f16c"))) static uint16_t hw_f32_to_f16(float f) {
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}
__attribute__((target("f16c"))) static float hw_f16_to_f32(uint16_t h) {
    return _cvtsh_ss(h);
}

static uint32_t lcg(uint32_t *s) {
    return *s = *s * 1664525u + 1013904223u;
}

int main(void) {
    ember_cpu_features f;
    ember_cpu_detect(&f);
    /* every half -> f32 */
    for (uint32_t h = 0; h < 65536; h++) {
        float v = ember_f16_to_f32((uint16_t)h);
        if (f.f16c) {
            float w = hw_f16_to_f32((uint16_t)h);
            CHECKF(memcmp(&v, &w, 4) == 0 || (isnan(v) && isnan(w)), "f16 %04x", h);
        }
        if (!isnan(v)) CHECKF(ember_f32_to_f16(v) == h, "f16 round trip %04x", h); /* exact values round-trip */
    }
    /* f32 -> half against hardware on many patterns, incl. ties and subnormals */
    if (f.f16c) {
        uint32_t s = 1;
        int bad = 0;
        for (int i = 0; i < 4000000; i++) {
            uint32_t u = lcg(&s);
            if (i % 4 == 1) u = (u & 0x8000ffffu) | (0x33000000u + (u & 0x0f000000u)); /* near half range */
            if (i % 4 == 2) u = (u & 0xffffe000u) | 0x1000u; /* exact ties */
            float x;
            memcpy(&x, &u, 4);
            uint16_t a = ember_f32_to_f16(x), b = hw_f32_to_f16(x);
            if (isnan(x)) continue;
            if (a != b && bad++ < 5) fprintf(stderr, "f32 %08x -> %04x, hardware %04x\n", u, a, b);
        }
        CHECK(bad == 0);
    } else {
        fprintf(stderr, "note: no F16C, hardware oracle skipped\n");
    }
    CHECK(ember_f32_to_f16(65520.0f) == 0x7c00);  /* rounds to infinity */
    CHECK(ember_f32_to_f16(65504.0f) == 0x7bff);
    CHECK(ember_f32_to_f16(5.9604645e-08f) == 0x0001); /* smallest subnormal */
    CHECK(ember_f32_to_f16(2.9802322e-08f) == 0x0000); /* half of it: tie to even */
    /* bf16 */
    CHECK(ember_f32_to_bf16(1.0f) == 0x3f80);
    CHECK(ember_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(ember_f32_to_bf16(ember_bits_to_f32(0x3f808000u)) == 0x3f80); /* tie, even stays */
    CHECK(ember_f32_to_bf16(ember_bits_to_f32(0x3f818000u)) == 0x3f82); /* tie, odd rounds up */
    CHECK(ember_f32_to_bf16(ember_bits_to_f32(0x3f808001u)) == 0x3f81);
    CHECK(isnan(ember_bf16_to_f32(ember_f32_to_bf16(NAN))));
    for (uint32_t h = 0; h < 65536; h++) {
        float v = ember_bf16_to_f32((uint16_t)h);
        if (!isnan(v)) CHECKF(ember_f32_to_bf16(v) == h, "bf16 round trip %04x", h);
    }
    /* sizes */
    size_t n;
    CHECK(ember_dtype_nbytes(EMBER_BF16, 10, &n) && n == 20);
    CHECK(!ember_dtype_nbytes(EMBER_F32, SIZE_MAX / 2, &n));
    CHECK(ember_dtype_from_st_name("BF16") == EMBER_BF16);
    CHECK(ember_dtype_from_st_name("Q9") == EMBER_DTYPE_INVALID);
    return test_done();
}
