/*
 * test_quant.c - the quantized block types: the dtype table and GGUF id
 * mapping, the reference decoders against hand-computed blocks and against
 * a second decoder written here independently (streaming over the bytes in
 * file order, where the library works per element), the canonical encoders
 * (Q4_0 .. Q8_1, Q8_K) bit for bit against encoders written here from the
 * rules, round-trip error bounds for every encoder, and hostile input
 * (non-finite, huge, tiny, unaligned, random bytes).
 */
#define TEST_RNG_SEED 0x9e3779b97f4a7c15ull
#include <float.h>
#include <math.h>

#include "core/dtype.h"
#include "core/util.h"
#include "formats/quant.h"
#include "test.h"

static float urand(void) { /* [0, 1) */
    return (float)(rnd() & 0xffffff) / 16777216.0f;
}
static float nrand(void) { /* roughly normal */
    float s = 0;
    for (int i = 0; i < 6; i++) s += urand();
    return (s - 3.0f) * 1.41f;
}

static float h(uint16_t x) {
    return ember_f16_to_f32(x);
}
static uint16_t rd16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}
static void wr16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static bool same_bits(float a, float b) {
    return memcmp(&a, &b, 4) == 0 || (isnan(a) && isnan(b));
}

/* ---- an independent decoder: walks each block's bytes in file order ---- */

static void ref_decode(ember_dtype t, const uint8_t *p, float *y) {
    switch (t) {
    case EMBER_Q4_0:
    case EMBER_Q4_1:
    case EMBER_Q5_0:
    case EMBER_Q5_1: {
        bool has_m = t == EMBER_Q4_1 || t == EMBER_Q5_1, five = t == EMBER_Q5_0 || t == EMBER_Q5_1;
        float d = h(rd16(p)), m = has_m ? h(rd16(p + 2)) : 0;
        const uint8_t *q = p + (has_m ? 4 : 2);
        uint32_t hb = 0;
        if (five) {
            hb = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
            q += 4;
        }
        int off = has_m ? 0 : (five ? 16 : 8);
        for (int half = 0; half < 2; half++)
            for (int i = 0; i < 16; i++) {
                int v = half ? q[i] >> 4 : q[i] & 0xf;
                if (five && (hb >> (16 * half + i)) & 1) v += 16;
                y[16 * half + i] = has_m ? (float)v * d + m : (float)(v - off) * d;
            }
        break;
    }
    case EMBER_Q8_0:
    case EMBER_Q8_1: {
        float d = h(rd16(p));
        const int8_t *q = (const int8_t *)(p + (t == EMBER_Q8_0 ? 2 : 4));
        for (int i = 0; i < 32; i++) y[i] = (float)q[i] * d;
        break;
    }
    case EMBER_Q8_K: {
        float d;
        memcpy(&d, p, 4);
        for (int i = 0; i < 256; i++) y[i] = d * (float)(int8_t)p[4 + i];
        break;
    }
    case EMBER_Q2_K:
    case EMBER_Q3_K: {
        /* 2-bit planes: byte qs[32c + i] carries, at shift 2s, element
           128c + 32s + i */
        bool three = t == EMBER_Q3_K;
        const uint8_t *qs = three ? p + 32 : p + 16, *hm = p;
        int sc[16];
        float mn[16], d;
        if (three) {
            const uint8_t *s = p + 96;
            d = h(rd16(p + 108));
            for (int j = 0; j < 16; j++) {
                int low = (j < 8 ? s[j] : s[j - 8] >> 4) & 0xf;
                int top = (s[8 + (j & 3)] >> ((j >> 2) * 2)) & 3;
                sc[j] = (low + 16 * top) - 32;
                mn[j] = 0;
            }
        } else {
            d = h(rd16(p + 80));
            float dmin = h(rd16(p + 82));
            for (int j = 0; j < 16; j++) {
                sc[j] = p[j] & 0xf;
                mn[j] = dmin * (float)(p[j] >> 4);
            }
        }
        for (int c = 0; c < 2; c++)
            for (int s = 0; s < 4; s++)
                for (int i = 0; i < 32; i++) {
                    int e = 128 * c + 32 * s + i;
                    int v = (qs[32 * c + i] >> (2 * s)) & 3;
                    if (three && !((hm[i] >> (4 * c + s)) & 1)) v -= 4;
                    y[e] = (d * (float)sc[e / 16]) * (float)v - mn[e / 16];
                }
        break;
    }
    case EMBER_Q4_K:
    case EMBER_Q5_K: {
        float d = h(rd16(p)), dmin = h(rd16(p + 2));
        const uint8_t *s = p + 4, *qh = p + 16, *qs = t == EMBER_Q4_K ? p + 16 : p + 48;
        int sc[8], mn[8];
        for (int j = 0; j < 4; j++) {
            sc[j] = s[j] % 64;
            mn[j] = s[j + 4] % 64;
            sc[j + 4] = (s[j + 8] % 16) + 16 * (s[j] / 64);
            mn[j + 4] = (s[j + 8] / 16) + 16 * (s[j + 4] / 64);
        }
        for (int c = 0; c < 4; c++)
            for (int i = 0; i < 32; i++)
                for (int nib = 0; nib < 2; nib++) {
                    int j = 2 * c + nib, e = 32 * j + i;
                    int v = nib ? qs[32 * c + i] >> 4 : qs[32 * c + i] & 15;
                    if (t == EMBER_Q5_K && (qh[i] >> j) & 1) v += 16;
                    y[e] = (d * (float)sc[j]) * (float)v - dmin * (float)mn[j];
                }
        break;
    }
    case EMBER_Q6_K: {
        const uint8_t *ql = p, *qh = p + 128;
        const int8_t *sc = (const int8_t *)(p + 192);
        float d = h(rd16(p + 208));
        for (int c = 0; c < 2; c++)
            for (int i = 0; i < 32; i++)
                for (int g = 0; g < 4; g++) {
                    int e = 128 * c + 32 * g + i;
                    uint8_t lb = ql[64 * c + 32 * (g & 1) + i];
                    int v = (g < 2 ? lb & 15 : lb >> 4) | (((qh[32 * c + i] >> (2 * g)) & 3) << 4);
                    y[e] = (d * (float)sc[e / 16]) * (float)(v - 32);
                }
        break;
    }
    default: break;
    }
}

static const ember_dtype k_blocks[] = {EMBER_Q4_0, EMBER_Q4_1, EMBER_Q5_0, EMBER_Q5_1, EMBER_Q8_0, EMBER_Q8_1,
                                       EMBER_Q2_K, EMBER_Q3_K, EMBER_Q4_K, EMBER_Q5_K, EMBER_Q6_K, EMBER_Q8_K};
static const ember_dtype k_encodable[] = {EMBER_Q4_0, EMBER_Q4_1, EMBER_Q5_0, EMBER_Q5_1, EMBER_Q8_0,
                                          EMBER_Q8_1, EMBER_Q4_K, EMBER_Q5_K, EMBER_Q6_K, EMBER_Q8_K};

/* ---- the dtype table ---------------------------------------------------- */

static void test_table(void) {
    static const struct {
        ember_dtype t;
        uint32_t gguf;
        size_t elems, bytes;
        const char *name;
    } want[] = {
        {EMBER_Q4_0, 2, 32, 18, "q4_0"},    {EMBER_Q4_1, 3, 32, 20, "q4_1"},    {EMBER_Q5_0, 6, 32, 22, "q5_0"},
        {EMBER_Q5_1, 7, 32, 24, "q5_1"},    {EMBER_Q8_0, 8, 32, 34, "q8_0"},    {EMBER_Q8_1, 9, 32, 36, "q8_1"},
        {EMBER_Q2_K, 10, 256, 84, "q2_k"},  {EMBER_Q3_K, 11, 256, 110, "q3_k"}, {EMBER_Q4_K, 12, 256, 144, "q4_k"},
        {EMBER_Q5_K, 13, 256, 176, "q5_k"}, {EMBER_Q6_K, 14, 256, 210, "q6_k"}, {EMBER_Q8_K, 15, 256, 292, "q8_k"},
        {EMBER_F32, 0, 1, 4, "f32"},        {EMBER_F16, 1, 1, 2, "f16"},        {EMBER_I8, 24, 1, 1, "i8"},
        {EMBER_I16, 25, 1, 2, "i16"},       {EMBER_I32, 26, 1, 4, "i32"},       {EMBER_I64, 27, 1, 8, "i64"},
        {EMBER_F64, 28, 1, 8, "f64"},       {EMBER_BF16, 30, 1, 2, "bf16"},
    };
    for (size_t i = 0; i < EMBER_ARRAY_LEN(want); i++) {
        const ember_dtype_info *d = ember_dtype_get(want[i].t);
        CHECKF(d->block_elems == want[i].elems && d->block_bytes == want[i].bytes, "%s", want[i].name);
        CHECKF(strcmp(d->name, want[i].name) == 0, "%s", d->name);
        CHECKF(ember_dtype_from_gguf(want[i].gguf) == want[i].t, "gguf id %u", want[i].gguf);
        CHECKF(ember_dtype_to_gguf(want[i].t) == (int)want[i].gguf, "%s", want[i].name);
        size_t nb = 0;
        CHECK(ember_dtype_nbytes(want[i].t, want[i].elems * 7, &nb) && nb == want[i].bytes * 7);
        if (want[i].elems > 1) CHECK(!ember_dtype_nbytes(want[i].t, want[i].elems * 7 + 1, &nb));
        size_t big = SIZE_MAX - SIZE_MAX % want[i].elems, prod;
        bool overflows = __builtin_mul_overflow(big / want[i].elems, want[i].bytes, &prod);
        CHECK(ember_dtype_nbytes(want[i].t, big, &nb) == !overflows);
    }
    /* ids never assigned, retired, or without an Ember dtype */
    static const uint32_t unknown[] = {4, 5, 16, 23, 29, 31, 32, 33, 34, 39, 43, 1000, UINT32_MAX};
    for (size_t i = 0; i < EMBER_ARRAY_LEN(unknown); i++)
        CHECKF(ember_dtype_from_gguf(unknown[i]) == EMBER_DTYPE_INVALID, "id %u", unknown[i]);
    CHECK(ember_dtype_to_gguf(EMBER_U8) == -1 && ember_dtype_to_gguf(EMBER_BOOL) == -1);
    CHECK(ember_dtype_to_gguf(EMBER_DTYPE_INVALID) == -1);
    /* the struct layouts agree with the table */
    CHECK(sizeof(ember_block_q4_0) == ember_dtype_get(EMBER_Q4_0)->block_bytes);
    CHECK(sizeof(ember_block_q5_1) == ember_dtype_get(EMBER_Q5_1)->block_bytes);
    CHECK(sizeof(ember_block_q3_k) == ember_dtype_get(EMBER_Q3_K)->block_bytes);
    CHECK(sizeof(ember_block_q6_k) == ember_dtype_get(EMBER_Q6_K)->block_bytes);
    CHECK(sizeof(ember_block_q8_k) == ember_dtype_get(EMBER_Q8_K)->block_bytes);
}

/* ---- hand-computed blocks ------------------------------------------------- */

static void test_known_answers(void) {
    float y[256];
    uint8_t b[292];

    /* Q4_0, d = 1: qs[j] = j | (15 - j) << 4 -> x[j] = j - 8, x[j+16] = 7 - j */
    wr16(b, 0x3c00);
    for (int j = 0; j < 16; j++) b[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    ember_dequant_q4_0(b, y, 1);
    for (int j = 0; j < 16; j++) CHECK(y[j] == (float)(j - 8) && y[j + 16] == (float)(7 - j));

    /* Q4_1, d = 2, m = -1: qs = 0x5a -> low 10 -> 19, high 5 -> 9 */
    wr16(b, 0x4000);
    wr16(b + 2, 0xbc00);
    memset(b + 4, 0x5a, 16);
    ember_dequant_q4_1(b, y, 1);
    for (int j = 0; j < 16; j++) CHECK(y[j] == 19.0f && y[j + 16] == 9.0f);

    /* Q5_0, d = 0.5: qh = 0x80000001 sets the fifth bit of elements 0 and 31.
       qs[0] = 0x3f: x0 = (15 | 16) - 16 = 15 -> 7.5, x16 = 3 - 16 -> -6.5;
       qs[15] = 0x80: x15 = 0 - 16 -> -8, x31 = (8 | 16) - 16 = 8 -> 4 */
    memset(b, 0, sizeof b);
    wr16(b, 0x3800);
    b[2] = 0x01, b[5] = 0x80;
    b[6] = 0x3f;
    b[6 + 15] = 0x80;
    ember_dequant_q5_0(b, y, 1);
    CHECK(y[0] == 7.5f && y[16] == -6.5f && y[15] == -8.0f && y[31] == 4.0f && y[1] == -8.0f);

    /* Q5_1, d = 1, m = 0.25: every fifth bit set, qs = 0x21 -> 17.25 / 18.25 */
    wr16(b, 0x3c00);
    wr16(b + 2, 0x3400);
    memset(b + 4, 0xff, 4);
    memset(b + 8, 0x21, 16);
    ember_dequant_q5_1(b, y, 1);
    CHECK(y[0] == 17.25f && y[16] == 18.25f && y[15] == 17.25f && y[31] == 18.25f);

    /* Q8_0, d = 0.25 */
    wr16(b, 0x3400);
    for (int i = 0; i < 32; i++) b[2 + i] = (uint8_t)(int8_t)(i * 8 - 128);
    ember_dequant_q8_0(b, y, 1);
    for (int i = 0; i < 32; i++) CHECK(y[i] == (float)(i * 8 - 128) * 0.25f);

    /* Q8_K, d = 0.5f (f32) */
    float d = 0.5f;
    memcpy(b, &d, 4);
    for (int i = 0; i < 256; i++) b[4 + i] = (uint8_t)i;
    ember_dequant_q8_k(b, y, 1);
    CHECK(y[0] == 0.0f && y[127] == 63.5f && y[128] == -64.0f && y[255] == -0.5f);

    /* Q4_K, d = 1, dmin = 0.5; scales bytes chosen so that sub-block 0 has
       scale 1, min 4 (0x41: low six bits 1; 0x04) and sub-block 4 takes
       bits 4..5 from the top of s[0] / s[4]: s[8] = 0x45 -> scale
       5 | 1 << 4 = 21, min 4 | 0 << 4 = 4. qs all 0x21. */
    memset(b, 0, sizeof b);
    wr16(b, 0x3c00);
    wr16(b + 2, 0x3800);
    static const uint8_t s4[12] = {0x41, 2, 3, 4, 0x04, 1, 2, 3, 0x45, 0x67, 0x89, 0xab};
    memcpy(b + 4, s4, 12);
    memset(b + 16, 0x21, 128);
    ember_dequant_q4_k(b, y, 1);
    CHECK(y[0] == 1.0f * 1 - 0.5f * 4);    /* sub-block 0: low nibble 1 */
    CHECK(y[32] == 2.0f * 2 - 0.5f * 1);   /* sub-block 1: scale 2, min 1, high nibble 2 */
    CHECK(y[128] == 21.0f * 1 - 0.5f * 4); /* sub-block 4 */
    /* sub-block 5: scale = (s[9] & 15) | (s[1] >> 6) << 4 = 7, min = (s[9] >> 4) | (s[5] >> 6) << 4 = 6 */
    CHECK(y[160] == 7.0f * 2 - 0.5f * 6);
    /* sub-block 7: s[11] = 0xab -> scale 11, min 10 */
    CHECK(y[255] == 11.0f * 2 - 0.5f * 10);

    /* Q5_K: same scales; qh[0] = 0x81 sets the fifth bit of element 0
       (sub-block 0) and element 224 (sub-block 7) */
    memset(b, 0, sizeof b);
    wr16(b, 0x3c00);
    wr16(b + 2, 0x3800);
    memcpy(b + 4, s4, 12);
    b[16] = 0x81;
    memset(b + 48, 0x21, 128);
    ember_dequant_q5_k(b, y, 1);
    CHECK(y[0] == 1.0f * 17 - 0.5f * 4 && y[1] == 1.0f * 1 - 0.5f * 4);
    CHECK(y[224] == 11.0f * 18 - 0.5f * 10 && y[225] == 11.0f * 2 - 0.5f * 10);

    /* Q6_K, d = 0.5, scales[j] = j - 8. ql[0] = 0x1f, qh[0] = 0b11100100:
       e0: low 15 | (0) << 4 = 15 -> 15 - 32 = -17, scale -8 -> 68
       e64: high 1 | (2) << 4 = 33 -> 1, scale[4] = -4 -> -2
       e96: ql[32] high 0 | 3 << 4 = 48 -> 16, scale[6] = -2 -> -16
       e32: ql[32] low 0 | 1 << 4 = 16 -> -16, scale[2] = -6 -> 48 */
    memset(b, 0, sizeof b);
    b[0] = 0x1f;
    b[128] = 0xe4;
    for (int j = 0; j < 16; j++) b[192 + j] = (uint8_t)(int8_t)(j - 8);
    wr16(b + 208, 0x3800);
    ember_dequant_q6_k(b, y, 1);
    CHECK(y[0] == 68.0f && y[64] == -2.0f && y[96] == -16.0f && y[32] == 48.0f);
    CHECK(y[1] == 0.5f * -8 * -32); /* all-zero quant = -32 */

    /* Q2_K, d = 1, dmin = 2; scales[0] = 0x13 (scale 3, min 1); qs[0] = 0b11100100
       -> e0 = 0, e32 = 1, e64 = 2, e96 = 3 (each in a different sub-block) */
    memset(b, 0, sizeof b);
    b[0] = 0x13, b[2] = 0x25, b[4] = 0x01, b[6] = 0x40;
    b[16] = 0xe4;
    wr16(b + 80, 0x3c00);
    wr16(b + 82, 0x4000);
    ember_dequant_q2_k(b, y, 1);
    CHECK(y[0] == 3.0f * 0 - 2.0f * 1);
    CHECK(y[32] == 5.0f * 1 - 2.0f * 2);
    CHECK(y[64] == 1.0f * 2 - 0.0f);
    CHECK(y[96] == 0.0f * 3 - 2.0f * 4);

    /* Q3_K, d = 1: scale j = 6 bits - 32. scales[0] = 0x21 -> low(0) 1,
       low(8) 2; scales[8] = 0b11100100 -> high bits of j = 0, 4, 8, 12 are
       0, 1, 2, 3. So scale0 = 1 - 32 = -31, scale8 = (2 | 2 << 4) - 32 = 2.
       hmask[0] = 0x01: element 0 has its bit (no -4); element 128 (half 1,
       bit 4) does not. qs[0] = 3, qs[32] = 2 */
    memset(b, 0, sizeof b);
    b[0] = 0x01;
    b[32] = 0x03;
    b[32 + 32] = 0x02;
    b[96] = 0x21;
    b[104] = 0xe4;
    wr16(b + 108, 0x3c00);
    ember_dequant_q3_k(b, y, 1);
    CHECK(y[0] == -31.0f * 3);
    CHECK(y[128] == 2.0f * (2 - 4));
    CHECK(y[1] == -31.0f * -4);
}

/* ---- random blocks: library decoder == independent decoder ----------------- */

static void random_block(ember_dtype t, uint8_t *b) {
    size_t n = ember_dtype_get(t)->block_bytes;
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)rnd();
    /* keep the scales finite most of the time, but not always */
    uint16_t small = (uint16_t)(0x2000 + rnd() % 0x2000 + (rnd() & 0x8000));
    if (rnd() % 8) {
        switch (t) {
        case EMBER_Q4_0:
        case EMBER_Q5_0:
        case EMBER_Q8_0: wr16(b, small); break;
        case EMBER_Q4_1:
        case EMBER_Q5_1:
        case EMBER_Q8_1:
        case EMBER_Q4_K:
        case EMBER_Q5_K:
            wr16(b, small);
            wr16(b + 2, (uint16_t)(0x2000 + rnd() % 0x2000));
            break;
        case EMBER_Q2_K: wr16(b + 80, small), wr16(b + 82, small ^ 0x8000); break;
        case EMBER_Q3_K: wr16(b + 108, small); break;
        case EMBER_Q6_K: wr16(b + 208, small); break;
        case EMBER_Q8_K: {
            float d = nrand() * 0.01f;
            memcpy(b, &d, 4);
            break;
        }
        default: break;
        }
    }
}

static void test_decoders_agree(void) {
    uint8_t raw[4 * 292 + 1];
    float a[4 * 256], r[256];
    for (size_t k = 0; k < EMBER_ARRAY_LEN(k_blocks); k++) {
        ember_dtype t = k_blocks[k];
        size_t bb = ember_dtype_get(t)->block_bytes, be = ember_dtype_get(t)->block_elems;
        int bad = 0;
        for (int it = 0; it < 2000; it++) {
            uint8_t *b = raw + (it & 1); /* odd addresses too */
            for (int i = 0; i < 4; i++) random_block(t, b + i * bb);
            CHECK(ember_dequantize(t, b, a, 4 * be, NULL) == EMBER_OK);
            for (int i = 0; i < 4; i++) {
                ref_decode(t, b + i * bb, r);
                for (size_t e = 0; e < be; e++)
                    if (!same_bits(a[i * be + e], r[e]) && bad++ < 5)
                        fprintf(stderr, "%s block %d element %zu: %a vs %a\n", ember_dtype_get(t)->name, i, e,
                                a[i * be + e], r[e]);
            }
        }
        CHECKF(bad == 0, "%s: %d mismatches", ember_dtype_get(t)->name, bad);
    }
}

/* ---- canonical encoders, written again from their rules -------------------- */

static int trunc_to(float v, int hi) { /* finite v >= 0 here */
    int q = (int)v;
    return q > hi ? hi : q;
}

static void ref_encode(ember_dtype t, const float *x, uint8_t *b) {
    memset(b, 0, ember_dtype_get(t)->block_bytes);
    if (t == EMBER_Q4_0 || t == EMBER_Q5_0) {
        int lv = t == EMBER_Q4_0 ? 16 : 32;
        int m = 0; /* index of the largest |x| (first wins) */
        for (int i = 1; i < 32; i++)
            if (fabsf(x[i]) > fabsf(x[m])) m = i;
        float d = x[m] / (float)(-lv / 2);
        float id = d != 0 ? 1.0f / d : 0.0f;
        wr16(b, ember_f32_to_f16(d));
        uint8_t *qs = b + (lv == 16 ? 2 : 6);
        for (int i = 0; i < 32; i++) {
            int q = trunc_to(x[i] * id + ((float)(lv / 2) + 0.5f), lv - 1);
            qs[i % 16] |= (uint8_t)((q & 15) << (i < 16 ? 0 : 4));
            if (q & 16) b[2 + i / 8] |= (uint8_t)(1 << (i % 8));
        }
    } else if (t == EMBER_Q4_1 || t == EMBER_Q5_1) {
        int top = t == EMBER_Q4_1 ? 15 : 31;
        float lo = x[0], hi = x[0];
        for (int i = 1; i < 32; i++) lo = x[i] < lo ? x[i] : lo, hi = x[i] > hi ? x[i] : hi;
        float d = (hi - lo) / (float)top, id = d != 0 ? 1.0f / d : 0.0f;
        wr16(b, ember_f32_to_f16(d));
        wr16(b + 2, ember_f32_to_f16(lo));
        uint8_t *qs = b + (top == 15 ? 4 : 8);
        for (int i = 0; i < 32; i++) {
            int q = trunc_to((x[i] - lo) * id + 0.5f, top);
            qs[i % 16] |= (uint8_t)((q & 15) << (i < 16 ? 0 : 4));
            if (q & 16) b[4 + i / 8] |= (uint8_t)(1 << (i % 8));
        }
    } else if (t == EMBER_Q8_0 || t == EMBER_Q8_1) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
        float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        int8_t *qs = (int8_t *)(b + (t == EMBER_Q8_0 ? 2 : 4));
        int sum = 0;
        for (int i = 0; i < 32; i++) sum += qs[i] = (int8_t)lroundf(x[i] * id);
        wr16(b, ember_f32_to_f16(d));
        if (t == EMBER_Q8_1) wr16(b + 2, ember_f32_to_f16((float)sum * d));
    } else if (t == EMBER_Q8_K) {
        int m = 0;
        for (int i = 1; i < 256; i++)
            if (fabsf(x[i]) > fabsf(x[m])) m = i;
        if (x[m] == 0) return;
        float is = -127.0f / x[m], d = 1.0f / is;
        memcpy(b, &d, 4);
        for (int i = 0; i < 256; i++) {
            long q = lrintf(is * x[i]);
            b[4 + i] = (uint8_t)(int8_t)(q > 127 ? 127 : q);
            int16_t s;
            memcpy(&s, b + 260 + 2 * (i / 16), 2);
            s = (int16_t)(s + (int8_t)b[4 + i]);
            memcpy(b + 260 + 2 * (i / 16), &s, 2);
        }
    }
}

/* A block of test data of one of several shapes. */
static void make_data(float *x, int n, int kind) {
    float scale = kind == 5 ? 1e-2f : kind == 6 ? 1000.0f : 1.0f;
    for (int i = 0; i < n; i++) {
        switch (kind) {
        case 0: x[i] = nrand(); break;
        case 1: x[i] = urand() * 2 - 1; break;
        case 2: x[i] = nrand() * 0.02f + (i % 37 == 5 ? 3.0f : 0.0f); break; /* outliers */
        case 3: x[i] = 0.0f; break;
        case 4: x[i] = 0.75f; break;
        case 7: x[i] = urand() + 0.5f; break;  /* all positive */
        case 8: x[i] = -urand() - 0.5f; break; /* all negative */
        case 9:
            x[i] = (float)(int)(rnd() % 7) - 3; /* few distinct values */
            break;
        default: x[i] = nrand() * scale; break;
        }
    }
}
#define N_KINDS 10

static void test_canonical_encoders(void) {
    static const ember_dtype canon[] = {EMBER_Q4_0, EMBER_Q4_1, EMBER_Q5_0, EMBER_Q5_1,
                                        EMBER_Q8_0, EMBER_Q8_1, EMBER_Q8_K};
    float x[256];
    uint8_t got[292 + 1], want[292];
    for (size_t k = 0; k < EMBER_ARRAY_LEN(canon); k++) {
        ember_dtype t = canon[k];
        size_t bb = ember_dtype_get(t)->block_bytes, be = ember_dtype_get(t)->block_elems;
        int bad = 0;
        for (int it = 0; it < 3000; it++) {
            make_data(x, (int)be, it % N_KINDS);
            CHECK(ember_quantize(t, x, got + (it & 1), be, NULL) == EMBER_OK);
            ref_encode(t, x, want);
            if (memcmp(got + (it & 1), want, bb) != 0 && bad++ < 3)
                fprintf(stderr, "%s: block differs (kind %d)\n", ember_dtype_get(t)->name, it % N_KINDS);
        }
        CHECKF(bad == 0, "%s: %d blocks differ from the canonical rule", ember_dtype_get(t)->name, bad);
    }
}

/* ---- every encoder: round trip ---------------------------------------------- */

static void test_round_trip(void) {
    enum { N = 256 * 64 };
    static float x[N], y[N];
    static uint8_t q[N * 2];
    /* relative RMS error bounds on normal data (measured values are about
       0.6x these) and per-format maximum error in units of max|x| */
    static const struct {
        ember_dtype t;
        double rel_rms;
    } bound[] = {
        {EMBER_Q4_0, 0.13},   {EMBER_Q4_1, 0.12}, {EMBER_Q5_0, 0.065}, {EMBER_Q5_1, 0.06},  {EMBER_Q8_0, 0.0085},
        {EMBER_Q8_1, 0.0085}, {EMBER_Q4_K, 0.10}, {EMBER_Q5_K, 0.05},  {EMBER_Q6_K, 0.025}, {EMBER_Q8_K, 0.0095},
    };
    for (size_t k = 0; k < EMBER_ARRAY_LEN(bound); k++) {
        ember_dtype t = bound[k].t;
        const char *name = ember_dtype_get(t)->name;
        for (int i = 0; i < N; i++) x[i] = nrand();
        CHECK(ember_quantize(t, x, q, N, NULL) == EMBER_OK);
        CHECK(ember_dequantize(t, q, y, N, NULL) == EMBER_OK);
        double se = 0, sx = 0;
        for (int i = 0; i < N; i++) {
            se += (double)(y[i] - x[i]) * (y[i] - x[i]);
            sx += (double)x[i] * x[i];
        }
        double rel = sqrt(se / sx);
        fprintf(stderr, "  %s: relative rms error %.4f\n", name, rel);
        CHECKF(rel < bound[k].rel_rms, "%s: relative rms error %.4f >= %.4f", name, rel, bound[k].rel_rms);

        /* special blocks: exact zeros stay zero, constants come back close */
        size_t be = ember_dtype_get(t)->block_elems;
        for (int kind = 3; kind <= 4; kind++) {
            make_data(x, (int)be, kind);
            ember_quantize(t, x, q, be, NULL);
            ember_dequantize(t, q, y, be, NULL);
            bool ok = true;
            for (size_t i = 0; i < be; i++) ok = ok && fabsf(y[i] - x[i]) <= (kind == 3 ? 0.0f : 0.75f * 0.02f);
            CHECKF(ok, "%s: %s block", name, kind == 3 ? "zero" : "constant");
        }
        /* scaled data: error scales with the data (within the f16 range) */
        for (int kind = 5; kind <= 9; kind++) {
            make_data(x, (int)be * 8, kind);
            ember_quantize(t, x, q, be * 8, NULL);
            ember_dequantize(t, q, y, be * 8, NULL);
            double e2 = 0, x2 = 0;
            for (size_t i = 0; i < be * 8; i++) {
                e2 += (double)(y[i] - x[i]) * (y[i] - x[i]);
                x2 += (double)x[i] * x[i];
            }
            CHECKF(sqrt(e2 / x2) < 2.5 * bound[k].rel_rms, "%s kind %d: relative error %.4f", name, kind,
                   sqrt(e2 / x2));
        }
    }
    /* Q8_0 element bound: |x - y| <= d/2 plus the f16 rounding of d */
    for (int i = 0; i < N; i++) x[i] = nrand();
    ember_quant_q8_0(x, q, N / 32);
    ember_dequant_q8_0(q, y, N / 32);
    int bad = 0;
    for (int b = 0; b < N / 32; b++) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[32 * b + i]));
        float d = amax / 127;
        for (int i = 0; i < 32; i++) bad += fabsf(y[32 * b + i] - x[32 * b + i]) > d * (0.5f + 127.0f / 2048);
    }
    CHECKF(bad == 0, "q8_0: %d elements beyond d/2", bad);
}

/* ---- hostile input ---------------------------------------------------------- */

static void test_hostile(void) {
    float x[512], y[512];
    uint8_t q[2 * 292];
    const float specials[] = {NAN,    INFINITY, -INFINITY, FLT_MAX, -FLT_MAX, FLT_MIN,
                              1e-45f, -1e-40f,  65504.0f,  1e9f,    0.0f,     -0.0f};
    for (size_t k = 0; k < EMBER_ARRAY_LEN(k_encodable); k++) {
        ember_dtype t = k_encodable[k];
        size_t be = ember_dtype_get(t)->block_elems;
        for (int it = 0; it < 200; it++) {
            for (size_t i = 0; i < 2 * be; i++)
                x[i] = (rnd() % 3 == 0) ? specials[rnd() % EMBER_ARRAY_LEN(specials)] : nrand() * 1e3f;
            if (it % 5 == 0) /* a block of only tiny values */
                for (size_t i = 0; i < be; i++) x[i] = (float)(rnd() % 5) * 1e-41f;
            CHECK(ember_quantize(t, x, q, 2 * be, NULL) == EMBER_OK);
            CHECK(ember_dequantize(t, q, y, 2 * be, NULL) == EMBER_OK);
        }
        /* huge but finite blocks stay finite where f16 can hold the scale */
        for (size_t i = 0; i < be; i++) x[i] = nrand() * 1000.0f;
        ember_quantize(t, x, q, be, NULL);
        ember_dequantize(t, q, y, be, NULL);
        bool finite = true;
        for (size_t i = 0; i < be; i++) finite = finite && isfinite(y[i]);
        CHECKF(finite, "%s", ember_dtype_get(t)->name);
    }
}

/* ---- by dtype ------------------------------------------------------------------ */

static void test_dispatch(void) {
    float x[64], y[64];
    uint16_t hbuf[65];
    for (int i = 0; i < 64; i++) x[i] = nrand();
    CHECK(ember_quantize(EMBER_F16, x, (uint8_t *)hbuf + 1, 64, NULL) == EMBER_OK); /* unaligned */
    CHECK(ember_dequantize(EMBER_F16, (uint8_t *)hbuf + 1, y, 64, NULL) == EMBER_OK);
    for (int i = 0; i < 64; i++) CHECK(y[i] == ember_f16_to_f32(ember_f32_to_f16(x[i])));
    CHECK(ember_quantize(EMBER_BF16, x, hbuf, 64, NULL) == EMBER_OK);
    CHECK(ember_dequantize(EMBER_BF16, hbuf, y, 64, NULL) == EMBER_OK);
    for (int i = 0; i < 64; i++) CHECK(y[i] == ember_bf16_to_f32(ember_f32_to_bf16(x[i])));
    CHECK(ember_dequantize(EMBER_F32, x, y, 64, NULL) == EMBER_OK && memcmp(x, y, sizeof x) == 0);

    ember_error err;
    CHECK(ember_dequantize(EMBER_Q4_0, hbuf, y, 33, &err) == EMBER_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "33 elements") != NULL);
    CHECK(ember_quantize(EMBER_Q4_K, x, hbuf, 64, &err) == EMBER_ERR_INVALID_ARG);
    CHECK(ember_quantize(EMBER_Q2_K, x, hbuf, 256, &err) == EMBER_ERR_UNSUPPORTED);
    CHECK(strstr(err.msg, "q2_k") != NULL);
    CHECK(ember_dequantize(EMBER_I32, x, y, 4, &err) == EMBER_ERR_UNSUPPORTED);
    CHECK(ember_dequantize(EMBER_DTYPE_INVALID, x, y, 4, &err) == EMBER_ERR_UNSUPPORTED);
    CHECK(ember_dequantize((ember_dtype)1000, x, y, 4, &err) == EMBER_ERR_UNSUPPORTED);
    for (size_t k = 0; k < EMBER_ARRAY_LEN(k_blocks); k++) CHECK(ember_can_dequantize(k_blocks[k]));
    for (size_t k = 0; k < EMBER_ARRAY_LEN(k_encodable); k++) CHECK(ember_can_quantize(k_encodable[k]));
    CHECK(!ember_can_quantize(EMBER_Q2_K) && !ember_can_quantize(EMBER_Q3_K) && !ember_can_quantize(EMBER_I8));
    CHECK(ember_dequantize(EMBER_Q8_0, NULL, NULL, 0, NULL) == EMBER_OK); /* nothing to do */
}

int main(void) {
    test_table();
    test_known_answers();
    test_decoders_agree();
    test_canonical_encoders();
    test_round_trip();
    test_hostile();
    test_dispatch();
    return test_done();
}
