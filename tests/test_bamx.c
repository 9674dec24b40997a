/*
 * test_bamx.c - bf16 weights on AMX-BF16 tiles (src/backend/cpu/kern_bamx.h)
 * through the CPU backend's matmul, where the CPU has AMX (else: skipped).
 *
 *   1. Batch invariance: each row of an M-row matmul equals, bit for bit,
 *      the same row multiplied alone, and every row block, for M from 1 to
 *      130 (partial tiles, two M blocks), widths with a tail of rows past the
 *      last 16-row group, K of one chunk, one K block and more than one
 *      (the sums stored and reloaded between blocks), at 1 and 2 threads
 *      (the same bits at both).
 *   2. Precision: against a double-precision product of the bf16 weights
 *      and the f32 inputs, |error| <= 2^-14 * sum |w x| + tiny per output
 *      (the split of x into two bf16 keeps 16 significand bits).
 *   3. The packing is invisible: reading the weight back after it is
 *      prepared (backend.h prepare_weight: packed once, as the model loader
 *      does for every matrix) and multiplied gives the original bytes; get_rows of a packed (tied)
 *      embedding gives the original rows; a weight whose K is not a
 *      multiple of 32 stays on the f32 kernels and is as precise.
 *   4. The AMX path is really taken: the AVX-512 table's results for the
 *      same inputs differ in some output (a different summation), so a
 *      silent fallback would fail this check.
 *   5. Weights in the caller's memory (zero_copy) give the same bits.
 *
 * Ownership: each case allocates its buffers and frees them before the next.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/cpu.h"
#include "core/dtype.h"
#define TEST_RNG_SEED 0xb4a3c0ull
#include "test.h"

typedef struct mm_case {
    ember_tensor w, x, o;
    ember_buffer *wb, *xb, *ob;
} mm_case;

static void case_free(mm_case *c) {
    ember_buffer_free(c->wb);
    ember_buffer_free(c->xb);
    ember_buffer_free(c->ob);
    memset(c, 0, sizeof *c);
}

/* Weight [N, K] bf16 from wbits (prepared), input [M, K] from x, output [M, N]. */
static bool case_new(ember_backend *be, const uint16_t *wbits, int N, int K, const float *x, int M, mm_case *c) {
    ember_error err = {0};
    memset(c, 0, sizeof *c);
    int64_t ws[2] = {N, K}, xs[2] = {M, K}, os[2] = {M, N};
    bool ok = CHECKV(be->ops->buffer_from_host(be, wbits, (size_t)N * K * 2, &c->wb, &err) == EMBER_OK, "%s", err.msg) &&
              CHECKV(ember_tensor_view(&c->w, c->wb, 0, EMBER_BF16, 2, ws, &err) == EMBER_OK, "%s", err.msg) &&
              CHECKV(be->ops->prepare_weight(be, &c->w, &err) == EMBER_OK, "prepare: %s", err.msg) &&
              CHECKV(ember_tensor_alloc(be, &c->x, &c->xb, EMBER_F32, 2, xs, &err) == EMBER_OK, "%s", err.msg) &&
              CHECKV(ember_tensor_alloc(be, &c->o, &c->ob, EMBER_F32, 2, os, &err) == EMBER_OK, "%s", err.msg) &&
              CHECKV(be->ops->write(be, &c->x, 0, x, (size_t)M * K * 4, &err) == EMBER_OK, "%s", err.msg);
    if (!ok) case_free(c);
    return ok;
}

/* out (M x N floats) = x (M rows) times the weight, on be. */
static bool run_mm(ember_backend *be, const uint16_t *wbits, int N, int K, const float *x, int M, float *out) {
    mm_case c;
    if (!case_new(be, wbits, N, K, x, M, &c)) return false;
    ember_error err = {0};
    ember_matmul mm = {&c.o, &c.w, NULL};
    bool ok = CHECKV(be->ops->matmul(be, &c.x, 1, &mm, &err) == EMBER_OK, "matmul: %s", err.msg) &&
              CHECKV(be->ops->read(be, &c.o, 0, out, (size_t)M * N * 4, &err) == EMBER_OK, "read: %s", err.msg);
    case_free(&c);
    return ok;
}

static ember_backend *backend(ember_isa isa, int threads, bool zero_copy) {
    ember_cpu_params p = {.n_threads = threads, .isa = isa, .zero_copy = zero_copy};
    ember_backend *be = NULL;
    ember_error err = {0};
    if (!CHECKV(ember_backend_cpu_new(&p, &be, &err) == EMBER_OK, "backend: %s", err.msg)) return NULL;
    return be;
}

static void fill(uint16_t *w, size_t nw, float *x, size_t nx) {
    for (size_t i = 0; i < nw; i++) w[i] = ember_f32_to_bf16(frnd() * 0.5f);
    /* inputs with a spread of magnitudes, so that lo carries real bits */
    for (size_t i = 0; i < nx; i++) x[i] = frnd() * (i % 7 == 0 ? 40.0f : 1.7f);
}

/* 1 and 2: one shape on the AMX table at 1 and 2 threads. */
static void test_shape(ember_backend *b1, ember_backend *b2, int N, int K, int M) {
    uint16_t *w = malloc((size_t)N * K * 2);
    float *x = malloc((size_t)M * K * 4), *all = malloc((size_t)M * N * 4), *all2 = malloc((size_t)M * N * 4);
    float *one = malloc((size_t)N * 4);
    if (!CHECKV(w && x && all && all2 && one, "out of memory")) goto done;
    fill(w, (size_t)N * K, x, (size_t)M * K);
    if (!run_mm(b1, w, N, K, x, M, all) || !run_mm(b2, w, N, K, x, M, all2)) goto done;
    CHECKF(!memcmp(all, all2, (size_t)M * N * 4), "N=%d K=%d M=%d: 1 and 2 threads differ", N, K, M);
    int bad_inv = -1, bad_prec = -1;
    double worst = 0;
    for (int m = 0; m < M; m++) {
        if (!run_mm(b1, w, N, K, x + (size_t)m * K, 1, one)) goto done;
        if (bad_inv < 0 && memcmp(one, all + (size_t)m * N, (size_t)N * 4)) bad_inv = m;
        for (int n = 0; n < N; n++) {
            double ref = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                double p = (double)ember_bf16_to_f32(w[(size_t)n * K + k]) * x[(size_t)m * K + k];
                ref += p;
                mag += fabs(p);
            }
            double e = fabs(all[(size_t)m * N + n] - ref), lim = ldexp(mag, -14) + 1e-30;
            if (e / lim > worst) worst = e / lim;
            if (bad_prec < 0 && e > lim) bad_prec = m * N + n;
        }
    }
    CHECKF(bad_inv < 0, "N=%d K=%d M=%d: row %d alone differs from the batch", N, K, M, bad_inv);
    CHECKF(bad_prec < 0, "N=%d K=%d M=%d: output %d off by more than 2^-14 sum|wx| (worst %.3g of the bound)", N, K,
           M, bad_prec, worst);
done:
    free(w);
    free(x);
    free(all);
    free(all2);
    free(one);
}

/* 3 and 4. */
static void test_packing(ember_backend *amx, ember_backend *avx) {
    const int N = 40, K = 96, M = 3;
    uint16_t w[40 * 96], back[40 * 96];
    float x[3 * 96], oa[3 * 40], ov[3 * 40], row[96];
    fill(w, (size_t)N * K, x, (size_t)M * K);
    mm_case c;
    if (!case_new(amx, w, N, K, x, M, &c)) return;
    ember_error err = {0};
    ember_matmul mm = {&c.o, &c.w, NULL};
    CHECKV(amx->ops->matmul(amx, &c.x, 1, &mm, &err) == EMBER_OK, "matmul: %s", err.msg);
    int32_t ids[3] = {0, 17, 39};
    ember_tensor rows;
    ember_buffer *rb = NULL;
    int64_t rs[2] = {3, K};
    if (CHECKV(ember_tensor_alloc(amx, &rows, &rb, EMBER_F32, 2, rs, &err) == EMBER_OK, "%s", err.msg) &&
        CHECKV(amx->ops->get_rows(amx, &rows, &c.w, ids, 3, &err) == EMBER_OK, "get_rows: %s", err.msg)) {
        for (int i = 0; i < 3; i++) {
            CHECK(amx->ops->read(amx, &rows, (size_t)i * K * 4, row, sizeof row, &err) == EMBER_OK);
            bool same = true;
            for (int k = 0; k < K; k++) same = same && row[k] == ember_bf16_to_f32(w[(size_t)ids[i] * K + k]);
            CHECKF(same, "get_rows of packed row %d differs from the weight", ids[i]);
        }
    }
    ember_buffer_free(rb);
    CHECKV(amx->ops->read(amx, &c.w, 0, back, sizeof back, &err) == EMBER_OK, "read: %s", err.msg);
    CHECK(!memcmp(back, w, sizeof w)); /* read gives the row-major bytes */
    CHECK(c.w.prep != NULL);           /* K = 96: a multiple of 32, packed at preparation */
    CHECKV(amx->ops->matmul(amx, &c.x, 1, &mm, &err) == EMBER_OK, "matmul: %s", err.msg); /* still packed */
    CHECK(amx->ops->read(amx, &c.o, 0, oa, sizeof oa, &err) == EMBER_OK);
    case_free(&c);
    if (run_mm(avx, w, N, K, x, M, ov)) {
        int diff = 0;
        for (int i = 0; i < M * N; i++) diff += oa[i] != ov[i];
        CHECKF(diff > 0, "AMX and AVX-512 agree on all %d outputs: the tiles were not used", M * N);
        fprintf(stderr, "bamx: %d of %d outputs differ from AVX-512's f32 kernel (expected: another summation)\n",
                diff, M * N);
    }
    /* K = 48: not whole chunks, the f32 kernel on every table, same bits */
    const int K2 = 48;
    float o1[3 * 40], o2[3 * 40];
    if (run_mm(amx, w, N, K2, x, M, o1) && run_mm(avx, w, N, K2, x, M, o2))
        CHECK(!memcmp(o1, o2, sizeof o1));
}

/* 5. Weights the backend does not own (zero_copy: the caller's memory,
   never packed in place: prepare_weight leaves them) are packed group by
   group on the fly: the same bits. */
static void test_zero_copy(ember_backend *owned, ember_backend *zc) {
    enum { N = 56, K = 160, M = 21 };
    static uint16_t w[N * K];
    static float x[M * K], a[M * N], b[M * N];
    fill(w, (size_t)N * K, x, (size_t)M * K);
    if (run_mm(owned, w, N, K, x, M, a) && run_mm(zc, w, N, K, x, M, b))
        CHECKF(!memcmp(a, b, sizeof a), "zero-copy weights give other bits than packed ones");
}

int main(void) {
    if (!ember_isa_supported(EMBER_ISA_AMX)) {
        fprintf(stderr, "skipped: no AMX on this CPU (or the OS did not grant the tile state)\n");
        return 77;
    }
    ember_backend *b1 = backend(EMBER_ISA_AMX, 1, false), *b2 = backend(EMBER_ISA_AMX, 2, false);
    ember_backend *avx = backend(EMBER_ISA_AVX512, 1, false), *zc = backend(EMBER_ISA_AMX, 2, true);
    if (b1 && b2 && avx && zc) {
        static const int shapes[][3] = {
            {16, 32, 1},   {40, 96, 5},   {64, 64, 16},   {48, 128, 17},  {72, 1056, 33},
            {32, 2080, 3}, {24, 64, 130}, {96, 160, 129}, {16, 1024, 64}, {33, 64, 31}, {48, 2080, 15},
            {56, 1088, 2},
        };
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            test_shape(b1, b2, shapes[i][0], shapes[i][1], shapes[i][2]);
        test_packing(b1, avx);
        test_zero_copy(b1, zc);
    }
    ember_backend_free(zc);
    ember_backend_free(b1);
    ember_backend_free(b2);
    ember_backend_free(avx);
    return test_done();
}
