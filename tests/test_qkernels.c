/*
 * test_qkernels.c - the CPU backend's quantized paths against independent
 * references:
 *   1. exact dequantization: every fixture llama weight quantized to each
 *      block type (formats/quant.h encoders), then dequantized by the
 *      backend (cpu_dequant_row) and by formats/quant.h's straightforward
 *      reference: bit-identical. Also random block bytes.
 *   2. every ISA's quantized gemm (cpu_qmatmul: packed kernels on weights
 *      packed in memory and on row-major weights packed on the fly, or the
 *      row-major kernels) equals the canonical plain-C kernel bit for bit,
 *      for odd and even block counts, ragged groups and every register
 *      tile remainder, and each output row equals the row computed alone
 *      (batch invariance).
 *   3. the canonical dot product is close to the f32 dot of the dequantized
 *      weights with the activations.
 *   4. packing is lossless: unpacking gives the original bytes, and packed
 *      rows dequantize exactly as the original rows.
 *   5. every ISA's activation quantizers give the plain-C bytes, also for
 *      zeros, NaN and infinities.
 */
#define TEST_RNG_SEED 0x9e3779b97f4a7c15ull
#include "backend/cpu/kernels.h"
#include "backend/cpu/qkern.h"
#include "core/cpu.h"
#include "fixture.h"
#include "formats/quant.h"
#include "test.h"

static const ember_dtype k_types[] = {EMBER_Q4_0, EMBER_Q4_1, EMBER_Q5_0, EMBER_Q5_1, EMBER_Q8_0,
                                      EMBER_Q4_K, EMBER_Q5_K, EMBER_Q6_K, EMBER_Q8_K};
#define NTYPES (sizeof k_types / sizeof k_types[0])


static void check_dequant(ember_dtype t, const float *src, size_t n, const char *what) {
    size_t bytes;
    CHECK(ember_dtype_nbytes(t, n, &bytes));
    unsigned char *q = malloc(bytes);
    float *a = malloc(n * 4), *b = malloc(n * 4);
    ember_error err;
    CHECK(ember_quantize(t, src, q, n, &err) == EMBER_OK);
    CHECK(cpu_dequant_row(t, q, a, (int64_t)n));
    CHECK(ember_dequantize(t, q, b, n, &err) == EMBER_OK);
    CHECKF(memcmp(a, b, n * 4) == 0, "%s: %s dequantization differs from the reference", what,
           ember_dtype_get(t)->name);
    /* random bytes with finite half scales */
    for (size_t i = 0; i < bytes; i++) q[i] = (unsigned char)rnd();
    const ember_dtype_info *di = ember_dtype_get(t);
    for (size_t blk = 0; blk < bytes / di->block_bytes; blk++) {
        unsigned char *p = q + blk * di->block_bytes;
        uint16_t h = ember_f32_to_f16(frnd() * 0.01f), h2 = ember_f32_to_f16(frnd() * 0.01f);
        if (t == EMBER_Q6_K) memcpy(p + 208, &h, 2);
        else if (t == EMBER_Q8_K) { float d = frnd(); memcpy(p, &d, 4); }
        else { memcpy(p, &h, 2); memcpy(p + 2, &h2, 2); }
    }
    CHECK(cpu_dequant_row(t, q, a, (int64_t)n));
    CHECK(ember_dequantize(t, q, b, n, &err) == EMBER_OK);
    CHECKF(memcmp(a, b, n * 4) == 0, "%s: %s dequantization of random blocks differs", what, ember_dtype_get(t)->name);
    free(q);
    free(a);
    free(b);
}

/* 1. the fixture's weights, every 2-D tensor flattened into whole blocks */
static void test_fixture_dequant(void) {
    fixture f;
    fixture_open(&f, "llama");
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors", f.dir);
    ember_st_file *wf = NULL;
    ember_error err;
    CHECKF(ember_st_open(path, &wf, &err) == EMBER_OK, "%s", err.msg);
    int tested = 0;
    for (int i = 0; wf && i < wf->n_tensors; i++) {
        const ember_st_tensor *t = &wf->tensors[i];
        if (t->ndim != 2 || t->dtype != EMBER_F32) continue;
        size_t n = t->nbytes / 4;
        float *x = malloc(n * 4);
        memcpy(x, t->data, n * 4);
        for (size_t k = 0; k < NTYPES; k++) {
            size_t be = ember_dtype_get(k_types[k])->block_elems;
            if (n / be) check_dequant(k_types[k], x, n / be * be, t->name);
        }
        free(x);
        tested++;
    }
    CHECK(tested > 5);
    ember_st_free(wf);
    fixture_close(&f);
}

/* The available kernel tables: each ISA this CPU has (AMX where the OS
   grants it), and AVX2 and AVX-512 without VNNI as well. */
static int all_tables(const cpu_kernels *tables[6]) {
    const ember_isa isas[] = {EMBER_ISA_SCALAR, EMBER_ISA_AVX2, EMBER_ISA_AMX, EMBER_ISA_AVX512};
    int nt = 0;
    for (int a = 0; a < 4; a++)
        if (ember_isa_supported(isas[a])) tables[nt++] = ember_cpu_kernels_for(isas[a]);
    if (ember_isa_supported(EMBER_ISA_AVX2) && ember_cpu_kernels_for(EMBER_ISA_AVX2) != &ember_cpu_kernels_avx2)
        tables[nt++] = &ember_cpu_kernels_avx2; /* non-VNNI too */
    if (ember_isa_supported(EMBER_ISA_AVX512) && tables[nt - 1] != &ember_cpu_kernels_avx512)
        tables[nt++] = &ember_cpu_kernels_avx512; /* non-VNNI too */
    return nt;
}

/* The A32 tiles of the m rows at xa (rows of xr bytes) into xt, each tile
   written in three block ranges (as the backend's tasks split it). */
static void tile_all(const unsigned char *xa, size_t xr, int K, int m, void *xt) {
    const int nb = K / 32;
    for (int t = 0; t < (m + 15) / 16; t++)
        for (int c = 0; c < 3; c++) cpu_act32_tile_blocks(xa, xr, K, m, t, nb * c / 3, nb * (c + 1) / 3, xt);
}

/* cpu_act32_tile_blocks against qkern.h's layout, read field by field:
   row r's block b in tile r / 16, (tile, block) slot r % 16; the rows past
   m zero whatever the buffer held. */
static void test_tile_layout(void) {
    enum { K = 160, NB = K / 32, M = 37 }; /* 5 blocks: ranges of 1, 2 and 2 */
    const size_t xr = cpu_act_row_bytes(CPU_ACT_32, K);
    unsigned char *xa = malloc(xr * M), *xt = malloc(cpu_act32_tiled_bytes(M, K));
    float *x = malloc(sizeof(float) * K * M);
    for (int i = 0; i < K * M; i++) x[i] = (float)((i * 7919) % 201 - 100) / (1.0f + (float)(i % 5));
    for (int r = 0; r < M; r++) cpu_quantize_act32(x + (size_t)r * K, K, xa + (size_t)r * xr);
    for (int m = 1; m <= M; m += m < 18 ? 1 : 19) {
        memset(xt, 0x5a, cpu_act32_tiled_bytes(m, K));
        tile_all(xa, xr, K, m, xt);
        const cpu_act32_tile *t = (const cpu_act32_tile *)xt;
        int bad = 0;
        for (int r = 0; r < (m + 15) / 16 * 16; r++)
            for (int b = 0; b < NB; b++) {
                const cpu_act32_tile *s = &t[(r / 16) * NB + b];
                cpu_act32 a;
                memset(&a, 0, sizeof a);
                if (r < m) memcpy(&a, xa + (size_t)r * xr + (size_t)b * sizeof(cpu_act32), sizeof a);
                bad += memcmp(&s->d[r % 16], &a.d, 4) != 0 || memcmp(s->q[r % 16], a.q, 32) != 0;
            }
        CHECKF(bad == 0, "A32 tiles of %d rows: %d (row, block)s differ from the rows", m, bad);
    }
    free(x);
    free(xa);
    free(xt);
}

/* k's qgemm_tiled kernel on the activations xa (M rows of xr bytes) made
   A32 tiles: every output equal to ref, for all M rows and for the first
   m rows alone (tiles with padded rows). */
static void check_tiled(const cpu_kernels *k, ember_dtype t, const unsigned char *w, int packed, int N, int K, int M,
                        const unsigned char *xa, size_t xr, const float *ref, void *scratch) {
    float *got = malloc((size_t)M * N * 4);
    unsigned char *xt = malloc(cpu_act32_tiled_bytes(M, K));
    for (int m = 1; m <= M; m = m < 17 && m < M ? m + 1 : m == M ? M + 1 : M) {
        memset(xt, 0x5a, cpu_act32_tiled_bytes(m, K)); /* the pad must clear whatever was there */
        tile_all(xa, xr, K, m, xt);
        memset(got, 0xff, (size_t)m * N * 4);
        cpu_qmatmul_tiled(k, t, w, packed, N, xt, m, K, got, (size_t)N, scratch);
        CHECKF(memcmp(got, ref, (size_t)m * N * 4) == 0, "%s tiled %s%s N=%d K=%d, %d of %d rows: differs",
               k->variant, packed ? "packed " : "", ember_dtype_get(t)->name, N, K, m, M);
    }
    free(xt);
    free(got);
}

/* The whole groups of w (N rows) packed, the last N % 16 rows row-major. */
static unsigned char *pack_matrix(ember_dtype t, const unsigned char *w, int N, int K) {
    size_t row = cpu_row_bytes(t, K);
    unsigned char *p = malloc(row * (size_t)N + 1);
    int g = 0;
    for (; (g + 1) * CPU_QP_ROWS <= N; g++)
        cpu_qpack_group(t, w + (size_t)g * CPU_QP_ROWS * row, row, CPU_QP_ROWS, K, p + (size_t)g * CPU_QP_ROWS * row);
    memcpy(p + (size_t)g * CPU_QP_ROWS * row, w + (size_t)g * CPU_QP_ROWS * row, row * (size_t)(N - g * CPU_QP_ROWS));
    return p;
}

/* 4: packing round trip and packed-row dequantization */
static void check_packing(ember_dtype t, const unsigned char *w, int N, int K) {
    if (!cpu_qpack_has(t)) return;
    size_t row = cpu_row_bytes(t, K);
    unsigned char *p = pack_matrix(t, w, N, K), *back = malloc(row * (size_t)N + 1);
    float *a = malloc((size_t)K * 4), *b = malloc((size_t)K * 4);
    int groups = N / CPU_QP_ROWS;
    memcpy(back, p, row * (size_t)N);
    for (int g = 0; g < groups; g++)
        cpu_qunpack_group(t, p + (size_t)g * CPU_QP_ROWS * row, K, back + (size_t)g * CPU_QP_ROWS * row, row,
                          CPU_QP_ROWS);
    CHECKF(memcmp(back, w, row * (size_t)N) == 0, "%s N=%d K=%d: unpack(pack(w)) differs from w",
           ember_dtype_get(t)->name, N, K);
    for (int n = 0; n < groups * CPU_QP_ROWS; n++) {
        CHECK(cpu_dequant_row(t, w + (size_t)n * row, a, K));
        cpu_qpack_dequant_row(t, p + (size_t)(n / CPU_QP_ROWS) * CPU_QP_ROWS * row, n % CPU_QP_ROWS, K, b);
        CHECKF(memcmp(a, b, (size_t)K * 4) == 0, "%s: packed row %d dequantizes differently", ember_dtype_get(t)->name,
               n);
    }
    free(p);
    free(back);
    free(a);
    free(b);
}

static void quant_acts(cpu_act_kind kind, const float *x, int M, int K, unsigned char *xa) {
    size_t rb = cpu_act_row_bytes(kind, K);
    for (int m = 0; m < M; m++) {
        if (kind == CPU_ACT_32)
            cpu_quantize_act32(x + (size_t)m * K, K, xa + m * rb);
        else
            cpu_quantize_act256(x + (size_t)m * K, K, xa + m * rb);
    }
}

/* The largest integer sums a kernel can meet: every weight at its largest
   unsigned level (Q8_0: -127), so that 16-bit partial sums (kern_qpack.h's
   QP_MAD16) sit at their bound; and the K types' scales at their extremes,
   so that the 16-bit pair products of kern_qpack.h (a sum times its scale,
   a minimum times bsums, Q6_K's -32 * scale times bsums) do too: Q4_K /
   Q5_K every 6-bit scale and minimum 63, Q6_K every scale -128 in even
   blocks and 127 in odd ones. Returns false for types without such a layout
   here. */
static bool saturate_levels(ember_dtype t, unsigned char *w, size_t nbytes) {
    size_t bb = ember_dtype_get(t)->block_bytes, lo, hi, lo2 = 0, hi2 = 0;
    int byte = 0xFF;
    switch (t) {
    case EMBER_Q4_0: lo = 2, hi = 18; break;
    case EMBER_Q5_0: lo = 2, hi = 22; break; /* qh and qs */
    case EMBER_Q8_0: lo = 2, hi = 34, byte = 0x81; break;
    case EMBER_Q4_K: lo = 16, hi = 144; break;
    case EMBER_Q5_K: lo = 16, hi = 176; break;
    case EMBER_Q6_K: lo = 0, hi = 128, lo2 = 128, hi2 = 192; break; /* ql, qh */
    default: return false;
    }
    for (size_t b = 0; b + bb <= nbytes; b += bb) {
        memset(w + b + lo, byte, hi - lo);
        if (hi2) memset(w + b + lo2, byte, hi2 - lo2);
        if (t == EMBER_Q4_K || t == EMBER_Q5_K) memset(w + b + 4, 0xFF, 12); /* scales and mins */
        if (t == EMBER_Q6_K) memset(w + b + 192, b / bb % 2 ? 0x7F : 0x80, 16); /* scales */
    }
    return true;
}

/* 2 and 3: every ISA against the canonical kernel; extreme: saturated
   weight levels and activations of +-127 (rows all +1, all -1, and blocks
   alternating) */
static void test_gemm_x(ember_dtype t, int N, int K, int M, bool extreme) {
    cpu_act_kind kind = cpu_act_kind_for(t);
    size_t wr = cpu_row_bytes(t, K), xr = cpu_act_row_bytes(kind, K);
    float *wf = malloc((size_t)N * K * 4), *x = malloc((size_t)M * K * 4), *wd = malloc((size_t)N * K * 4);
    unsigned char *w = malloc(wr * N), *xa = malloc(xr * M);
    for (int i = 0; i < N * K; i++) wf[i] = frnd() * (1 + (i % 7));
    for (int i = 0; i < M * K; i++) x[i] = frnd();
    ember_error err;
    CHECK(ember_quantize(t, wf, w, (size_t)N * K, &err) == EMBER_OK);
    if (extreme) {
        if (!saturate_levels(t, w, wr * (size_t)N)) goto done;
        for (int m = 0; m < M; m++)
            for (int i = 0; i < K; i++)
                x[(size_t)m * K + i] = m % 3 == 0 ? 1.0f : m % 3 == 1 ? -1.0f : (i / 32) % 2 ? 1.0f : -1.0f;
    }
    CHECK(cpu_dequant_row(t, w, wd, (int64_t)N * K));
    quant_acts(kind, x, M, K, xa);
    float *ref = malloc((size_t)M * N * 4), *got = malloc((size_t)M * N * 4), *one = malloc((size_t)N * 4);
    cpu_qgemm_generic(t)(w, wr, N, xa, xr, M, K, ref, (size_t)N);
    /* 3: close to the f32 product of the dequantized weights */
    double worst = 0;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0, a = 0;
            for (int k = 0; k < K; k++) {
                s += (double)wd[(size_t)n * K + k] * x[(size_t)m * K + k];
                a += fabs((double)wd[(size_t)n * K + k] * x[(size_t)m * K + k]);
            }
            double e = fabs(ref[(size_t)m * N + n] - s) / (a + 1e-9);
            if (e > worst) worst = e;
        }
    CHECKF(worst < 0.02, "%s: canonical dot off the f32 product by %g of sum|w x|", ember_dtype_get(t)->name, worst);
    check_packing(t, w, N, K);
    const cpu_kernels *tables[6];
    int nt = all_tables(tables);
    unsigned char *wp = cpu_qpack_has(t) ? pack_matrix(t, w, N, K) : NULL;
    void *scratch = aligned_alloc(64, (cpu_qmatmul_scratch_bytes(t, K, M) + 63) / 64 * 64);
    for (int a = 0; a < nt; a++) {
        for (int packed = 0; packed < 2; packed++) {
            if (packed && !(wp && tables[a]->qgemm_packed[t])) continue;
            const unsigned char *wm = packed ? wp : w;
            memset(got, 0xff, (size_t)M * N * 4);
            cpu_qmatmul(tables[a], t, wm, packed, N, xa, xr, M, K, got, (size_t)N, scratch);
            CHECKF(memcmp(got, ref, (size_t)M * N * 4) == 0,
                   "%s %s%s N=%d K=%d M=%d: differs from the canonical kernel", tables[a]->variant,
                   packed ? "packed " : "", ember_dtype_get(t)->name, N, K, M);
            for (int m = 0; m < M; m++) { /* each row alone */
                cpu_qmatmul(tables[a], t, wm, packed, N, xa + (size_t)m * xr, xr, 1, K, one, (size_t)N, scratch);
                CHECKF(memcmp(one, got + (size_t)m * N, (size_t)N * 4) == 0, "%s %s%s: row %d alone differs",
                       tables[a]->variant, packed ? "packed " : "", ember_dtype_get(t)->name, m);
            }
            if (tables[a]->qgemm_tiled[t]) /* AMX: the same outputs from A32 tiles */
                check_tiled(tables[a], t, wm, packed, N, K, M, xa, xr, ref, scratch);
        }
    }
    free(wp);
    free(scratch);
    free(ref);
    free(got);
    free(one);
done:
    free(wf);
    free(x);
    free(wd);
    free(w);
    free(xa);
}

static void test_gemm(ember_dtype t, int N, int K, int M) {
    test_gemm_x(t, N, K, M, false);
}

/* 5: every ISA's activation quantizers against the plain-C ones */
static void test_act_quant(void) {
    const int K = 2048;
    float *x = malloc((size_t)K * 4);
    unsigned char *a = malloc(cpu_act_row_bytes(CPU_ACT_256, K) + cpu_act_row_bytes(CPU_ACT_32, K));
    unsigned char *b = malloc(cpu_act_row_bytes(CPU_ACT_256, K) + cpu_act_row_bytes(CPU_ACT_32, K));
    const cpu_kernels *tables[6];
    int nt = all_tables(tables);
    for (int trial = 0; trial < 8; trial++) {
        for (int i = 0; i < K; i++) x[i] = frnd() * (float)(1 << (trial * 3 % 17)) * (i % 37 == 0 ? 50.0f : 1.0f);
        if (trial == 1) memset(x, 0, 256 * 4); /* an all-zero block */
        if (trial == 2) x[5] = NAN, x[300] = INFINITY, x[700] = -INFINITY, x[1000] = -NAN;
        if (trial == 3)
            for (int i = 0; i < K; i++) x[i] = (float)((i % 255) - 127) * 0.5f; /* ties of the rounding */
        for (int kind = CPU_ACT_32; kind <= CPU_ACT_256; kind++) {
            size_t bytes = cpu_act_row_bytes((cpu_act_kind)kind, K);
            if (kind == CPU_ACT_32)
                cpu_quantize_act32(x, K, a);
            else
                cpu_quantize_act256(x, K, a);
            for (int t = 0; t < nt; t++) {
                memset(b, 0x5a, bytes);
                if (kind == CPU_ACT_32)
                    tables[t]->quantize_act32(x, K, b);
                else
                    tables[t]->quantize_act256(x, K, b);
                CHECKF(memcmp(a, b, bytes) == 0, "%s: A%d activations differ from the plain-C quantizer (trial %d)",
                       tables[t]->variant, kind == CPU_ACT_32 ? 32 : 256, trial);
            }
        }
    }
    free(x);
    free(a);
    free(b);
}

int main(void) {
    test_fixture_dequant();
    test_act_quant();
    test_tile_layout();
    for (size_t k = 0; k < NTYPES; k++) {
        bool kq = ember_dtype_get(k_types[k])->block_elems == 256;
        test_gemm(k_types[k], 13, kq ? 512 : 96, 7);
        test_gemm(k_types[k], 5, kq ? 768 : 64, 1);
        test_gemm(k_types[k], 9, kq ? 256 : 352, 4);
        test_gemm(k_types[k], 37, kq ? 512 : 160, 15);    /* two groups and a tail; tiles 8 + 4 + 2 + 1 */
        test_gemm(k_types[k], 48, kq ? 256 : 32, 1);      /* decode: whole groups, one block */
        test_gemm(k_types[k], 16, kq ? 1024 : 800, 11);   /* 8 + 2 + 1 */
        test_gemm(k_types[k], 13, kq ? 2304 : 2144, 70); /* many rows, odd block count */
        test_gemm(k_types[k], 35, kq ? 768 : 992, 70);
        test_gemm(k_types[k], 32, kq ? 256 : 1056, 16); /* AMX: one whole tile, chunks of 16 + 16 + 1 blocks */
        test_gemm(k_types[k], 20, kq ? 512 : 544, 33);  /* AMX: two tiles and a padded row */
        test_gemm(k_types[k], 16, kq ? 256 : 64, 8);    /* AMX: tiles of 8 rows, half padded */
        /* AMX (kern_qamx.h): 6 tiles (the last padded), three groups and a
           tail, 13 blocks; 4 whole tiles; and an out past AMX_MBLK_OUT (256
           groups x 130 rows x 64 bytes > 2 MB: m-blocks of 4 + 4 + 1 tiles,
           the last padded) with a tail of 4 rows */
        test_gemm(k_types[k], 50, kq ? 512 : 416, 87);
        test_gemm(k_types[k], 64, kq ? 256 : 96, 64);
        test_gemm(k_types[k], 4100, kq ? 256 : 64, 130);
        test_gemm_x(k_types[k], 35, kq ? 768 : 992, 15, true); /* every tile shape at the 16-bit bound: 8 + 4 + 2 + 1 */
        test_gemm_x(k_types[k], 16, kq ? 256 : 64, 1, true);
        test_gemm_x(k_types[k], 48, kq ? 512 : 416, 75, true); /* AMX: 5 tiles at the bound */
    }
    return test_done();
}
