/*
 * test_kernels.c - the CPU kernels against a double-precision reference,
 * for every instruction set this CPU has and every weight dtype:
 *   - each output within a rounding bound of the exact dot product;
 *   - AVX2 and AVX-512 bit-identical (same 16-lane order, both FMA);
 *   - a row's output bit-identical whatever the batch (M) around it and
 *     however the weight rows are grouped (the heart of batch invariance).
 * And the CPU backend's elementwise swiglu (silu_mul), geglu, scale and
 * softcap ops against double precision, on every ISA and thread count, in place and not, and
 * which weights its zero-copy mode wraps. And the plain loops of kern_ew.h (add, norm_apply,
 * rope_rotate) against the C expressions' bits on every ISA, at any start and in place, and
 * argmax_range against the host's first-largest rule.
 */
#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "core/cpu.h"
#include "core/dtype.h"
#include "test.h"

static uint64_t g_rng = 88172645463325252ull;
static float frand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((double)(g_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

typedef struct wmat {
    ember_dtype dt;
    void *data;
    float *f; /* exact f32 values of the weights */
} wmat;

static wmat make_w(ember_dtype dt, int N, int K) {
    wmat w = {dt, NULL, malloc((size_t)N * K * sizeof(float))};
    size_t es = dt == EMBER_F32 ? 4 : 2;
    w.data = malloc((size_t)N * K * es);
    for (size_t i = 0; i < (size_t)N * K; i++) {
        float v = frand();
        if (dt == EMBER_F32) {
            ((float *)w.data)[i] = v;
        } else if (dt == EMBER_F16) {
            uint16_t h = ember_f32_to_f16(v);
            ((uint16_t *)w.data)[i] = h;
            v = ember_f16_to_f32(h);
        } else {
            uint16_t h = ember_f32_to_bf16(v);
            ((uint16_t *)w.data)[i] = h;
            v = ember_bf16_to_f32(h);
        }
        w.f[i] = v;
    }
    return w;
}

static cpu_gemm_fn pick(const cpu_kernels *k, ember_dtype dt) {
    return dt == EMBER_F32 ? k->gemm_f32 : dt == EMBER_F16 ? k->gemm_f16 : k->gemm_bf16;
}

static void test_shape(ember_dtype dt, int N, int K, int M) {
    wmat w = make_w(dt, N, K);
    float *x = malloc((size_t)M * K * sizeof(float));
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = frand();
    float *out[3] = {0};
    const ember_isa isas[] = {EMBER_ISA_SCALAR, EMBER_ISA_AVX2, EMBER_ISA_AVX512};
    size_t es = dt == EMBER_F32 ? 4 : 2;
    for (int a = 0; a < 3; a++) {
        if (!ember_isa_supported(isas[a])) continue;
        const cpu_kernels *k = ember_cpu_kernels_for(isas[a]);
        cpu_gemm_fn fn = pick(k, dt);
        out[a] = malloc((size_t)M * N * sizeof(float));
        fn(w.data, (size_t)K, N, x, (size_t)K, M, K, out[a], (size_t)N);
        /* accuracy against double */
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double exact = 0, mag = 0;
                for (int kk = 0; kk < K; kk++) {
                    exact += (double)w.f[(size_t)n * K + kk] * x[(size_t)m * K + kk];
                    mag += fabs((double)w.f[(size_t)n * K + kk] * x[(size_t)m * K + kk]);
                }
                double got = out[a][(size_t)m * N + n];
                CHECKF(fabs(got - exact) <= 1e-6 * mag + 1e-30, "%s %s N%d K%d M%d [%d,%d]: %g vs %g",
                       ember_isa_name(isas[a]), ember_dtype_get(dt)->name, N, K, M, m, n, got, exact);
            }
        /* each row alone, each weight row alone: bit-identical */
        float one;
        for (int m = 0; m < M; m++) {
            float *row = malloc((size_t)N * sizeof(float));
            fn(w.data, (size_t)K, N, x + (size_t)m * K, (size_t)K, 1, K, row, (size_t)N);
            CHECKF(!memcmp(row, out[a] + (size_t)m * N, (size_t)N * sizeof(float)), "%s M=1 vs M=%d row %d",
                   ember_isa_name(isas[a]), M, m);
            free(row);
            for (int n = 0; n < N; n += 7) {
                fn((const char *)w.data + (size_t)n * K * es, (size_t)K, 1, x + (size_t)m * K, (size_t)K, 1, K, &one,
                   1);
                CHECKF(!memcmp(&one, &out[a][(size_t)m * N + n], 4), "%s single dot [%d,%d]",
                       ember_isa_name(isas[a]), m, n);
            }
            if (dt == EMBER_F32 && N > 0) {
                float d = k->dot(w.f, x + (size_t)m * K, K);
                CHECKF(!memcmp(&d, &out[a][(size_t)m * N], 4), "%s dot vs gemm", ember_isa_name(isas[a]));
            }
        }
    }
    if (out[1] && out[2])
        CHECKF(!memcmp(out[1], out[2], (size_t)M * N * sizeof(float)), "avx2 != avx512 %s N%d K%d M%d",
               ember_dtype_get(dt)->name, N, K, M);
    for (int a = 0; a < 3; a++) free(out[a]);
    free(x);
    free(w.data);
    free(w.f);
}

static void test_axpy(void) {
    float x[37], y0[37], y[3][37];
    for (int i = 0; i < 37; i++) {
        x[i] = frand();
        y0[i] = frand();
    }
    const ember_isa isas[] = {EMBER_ISA_SCALAR, EMBER_ISA_AVX2, EMBER_ISA_AVX512};
    for (int a = 0; a < 3; a++) {
        if (!ember_isa_supported(isas[a])) continue;
        memcpy(y[a], y0, sizeof y0);
        ember_cpu_kernels_for(isas[a])->axpy(y[a], 0.37f, x, 37);
        for (int i = 0; i < 37; i++) CHECK(fabsf(y[a][i] - (y0[i] + 0.37f * x[i])) <= 1e-6f);
    }
    if (ember_isa_supported(EMBER_ISA_AVX512)) CHECK(!memcmp(y[1], y[2], sizeof y[1]));
}

/* silu_mul on every ISA: within a few ulp of silu(g) u in double
   precision; each element's bits the same wherever it lies in the range
   and in place; the scalar tier the plain C expression's bits; AVX2 and
   AVX-512 the same bits. */
static void test_silu_mul(void) {
    enum { N = 1003 };
    const ember_isa isas[] = {EMBER_ISA_SCALAR, EMBER_ISA_AVX2, EMBER_ISA_AVX512};
    static float g[N], u[N], got[3][N], part[N];
    for (int i = 0; i < N; i++) {
        g[i] = frand() * (i % 5 == 0 ? 100.0f : 8.0f); /* e^-g over- and underflows for the large ones */
        u[i] = frand();
    }
    g[0] = 0.0f, g[1] = -0.0f, g[2] = 89.5f, g[3] = -89.5f, g[4] = 1e-30f, g[5] = -103.0f;
    for (int a = 0; a < 3; a++) {
        if (!ember_isa_supported(isas[a])) continue;
        const cpu_kernels *k = ember_cpu_kernels_for(isas[a]);
        k->silu_mul(got[a], g, u, N);
        double worst = 0;
        for (int i = 0; i < N; i++) {
            const double want = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
            worst = fmax(worst, fabs(got[a][i] - want) / (fabs((double)g[i] * u[i]) + 1e-30));
        }
        CHECKF(worst <= 5e-7, "silu_mul %s: error %g x |g u|", ember_isa_name(isas[a]), worst);
        bool same = true; /* every start and a few lengths: the bits of the whole range */
        for (int off = 0; off < 40; off++)
            for (int len = 1; off + len <= N; len += 1 + len / 3) {
                k->silu_mul(part, g + off, u + off, len);
                same &= !memcmp(part, got[a] + off, (size_t)len * sizeof *part);
            }
        CHECKF(same, "silu_mul %s: an element's bits depend on where the range starts or ends", ember_isa_name(isas[a]));
        memcpy(part, g, sizeof g);
        k->silu_mul(part, part, u, N); /* in place */
        CHECK(!memcmp(part, got[a], sizeof part));
    }
    bool plain = true;
    for (int i = 0; i < N; i++) {
        const float want = (g[i] / (1.0f + expf(-g[i]))) * u[i];
        plain &= !memcmp(&want, &got[0][i], sizeof want);
    }
    CHECKF(plain, "silu_mul scalar: not the plain expression's bits");
    if (ember_isa_supported(EMBER_ISA_AVX512)) CHECK(!memcmp(got[1], got[2], sizeof got[1]));
}

/* add, norm_apply and rope_rotate (kern_ew.h) on every ISA: the plain C
   expressions' bits (this file is built, like the kernels, with
   contraction off), at every start and in place. */
static void test_plain_loops(void) {
    enum { N = 1003, H = 3, D = 80 };
    const ember_isa isas[] = {EMBER_ISA_SCALAR, EMBER_ISA_AVX2, EMBER_ISA_AVX512};
    static float a[N], b[N], w[N], got[N], want[N], rx[H * D], cs[D / 2], sn[D / 2], rwant[H * D];
    for (int i = 0; i < N; i++) a[i] = frand() * 10.0f, b[i] = frand(), w[i] = frand();
    for (int i = 0; i < H * D; i++) rx[i] = frand() * 3.0f;
    for (int i = 0; i < D / 2; i++) cs[i] = frand(), sn[i] = frand();
    const float r = 0.8127f;
    for (int t = 0; t < 3; t++) {
        if (!ember_isa_supported(isas[t])) continue;
        const cpu_kernels *k = ember_cpu_kernels_for(isas[t]);
        const char *nm = ember_isa_name(isas[t]);
        bool ok = true;
        for (int off = 0; off < 40; off += 3) { /* add: a + b, from any start, out of place and in place */
            const int n = N - off;
            k->add(got, a + off, b + off, n);
            for (int i = 0; i < n; i++) want[i] = a[off + i] + b[off + i];
            ok &= !memcmp(got, want, (size_t)n * sizeof *got);
            memcpy(got, a + off, (size_t)n * sizeof *got);
            k->add(got, got, b + off, n);
            ok &= !memcmp(got, want, (size_t)n * sizeof *got);
        }
        CHECKF(ok, "add %s: not a + b's bits", nm);
        for (int po = 0; po < 2; po++) {
            ok = true;
            for (int off = 0; off < 40; off += 7) {
                const int n = N - off;
                k->norm_apply(got, a + off, w + off, r, po, n);
                for (int i = 0; i < n; i++) want[i] = (po ? 1.0f + w[off + i] : w[off + i]) * (a[off + i] * r);
                ok &= !memcmp(got, want, (size_t)n * sizeof *got);
                memcpy(got, a + off, (size_t)n * sizeof *got);
                k->norm_apply(got, got, w + off, r, po, n); /* y = x */
                ok &= !memcmp(got, want, (size_t)n * sizeof *got);
            }
            CHECKF(ok, "norm_apply %s plus_one %d: not the expression's bits", nm, po);
        }
        for (int neox = 0; neox < 2; neox++)
            for (int half = 8; half <= D / 2; half += 32) { /* 16 of the 80 dims rotated, then all 80 */
                memcpy(rwant, rx, sizeof rx);
                for (int h = 0; h < H; h++) {
                    float *v = rwant + h * D;
                    for (int i = 0; i < half; i++) {
                        const int p0 = neox ? i : 2 * i, p1 = neox ? i + half : 2 * i + 1;
                        const float x0 = v[p0], x1 = v[p1];
                        v[p0] = x0 * cs[i] - x1 * sn[i];
                        v[p1] = x1 * cs[i] + x0 * sn[i];
                    }
                }
                float rg[H * D];
                memcpy(rg, rx, sizeof rx);
                k->rope_rotate(rg, H, D, half, neox, cs, sn);
                CHECKF(!memcmp(rg, rwant, sizeof rg), "rope_rotate %s neox %d half %d: not the rotation's bits", nm, neox,
                       half);
            }
    }
}

/* The host rule: the first index of the largest value, NaNs skipped, -1 when all are NaN. */
static int64_t ref_argmax_range(const float *x, int64_t n) {
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++)
        if (!isnan(x[i]) && (best < 0 || x[i] > x[best])) best = i;
    return best;
}

/* argmax_range on every ISA: the host rule's index for rows with the largest
   value at chunk and vector edges, ties (also of -0 and +0), NaNs before and
   at the maximum, all NaN, all -inf, and every length up to 70. */
static void test_argmax_range(void) {
    enum { N = 1300 };
    const ember_isa isas[] = {EMBER_ISA_SCALAR, EMBER_ISA_AVX2, EMBER_ISA_AVX512};
    static float x[N];
    for (int t = 0; t < 3; t++) {
        if (!ember_isa_supported(isas[t])) continue;
        const cpu_kernels *k = ember_cpu_kernels_for(isas[t]);
        int bad = 0;
        for (int c = 0; c < 40; c++) {
            for (int i = 0; i < N; i++) x[i] = frand();
            const int at[] = {0, 15, 16, 255, 256, 257, 1023, N - 1, 700, 511};
            int n = N;
            if (c < 10) x[at[c]] = 2.0f; /* a single largest at an edge */
            else if (c < 14) x[100] = x[300 + 100 * (c - 10)] = 2.0f; /* a tie: the first */
            else if (c < 16) { x[5] = NAN; x[6] = 3.0f; x[900] = NAN; } /* NaNs around the largest */
            else if (c == 16) for (int i = 0; i < N; i++) x[i] = NAN;
            else if (c == 17) for (int i = 0; i < N; i++) x[i] = i % 3 ? NAN : -INFINITY;
            else if (c == 18) { for (int i = 0; i < N; i++) x[i] = -1.0f; x[40] = -0.0f; x[41] = 0.0f; }
            else if (c == 19) { for (int i = 0; i < N; i++) x[i] = -1.0f; x[800] = 0.0f; x[801] = -0.0f; }
            else n = c - 19; /* lengths 1 .. 20, and below */
            if (c >= 20 && c < 40) n = (c - 19) * 3 + (c & 1); /* 4 .. 64: partial vectors */
            const int64_t got = k->argmax_range(x, n), want = ref_argmax_range(x, n);
            if (got != want && bad++ < 5)
                fprintf(stderr, "argmax_range %s case %d (n %d): %lld, want %lld\n", ember_isa_name(isas[t]), c, n,
                        (long long)got, (long long)want);
        }
        CHECKF(bad == 0, "argmax_range %s: %d cases wrong", ember_isa_name(isas[t]), bad);
        CHECK(k->argmax_range(x, 0) == -1);
    }
}

/* gelu_pytorch_tanh(g) * u in double precision. */
static double geglu_ref(double g, double u) {
    return 0.5 * g * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (g + 0.044715 * g * g * g))) * u;
}

static void test_elementwise_ops(void) {
    enum { N = 40000 }; /* more than one task's chunk */
    const ember_isa isas[] = {EMBER_ISA_SCALAR, EMBER_ISA_AVX2, EMBER_ISA_AVX512};
    float *g = malloc(N * sizeof *g), *u = malloc(N * sizeof *u), *got = malloc(N * sizeof *got);
    for (int i = 0; i < N; i++) {
        g[i] = frand() * (i % 7 == 0 ? 12.0f : 3.0f); /* tanh saturates for the large ones */
        u[i] = frand();
    }
    for (int a = 0; a < 3; a++) {
        if (!ember_isa_supported(isas[a])) continue;
        for (int threads = 1; threads <= 2; threads++) {
            ember_backend *be;
            ember_error err = {0};
            ember_cpu_params cp = {threads, isas[a], false, {0}};
            CHECK(ember_backend_cpu_new(&cp, &be, &err) == EMBER_OK);
            ember_tensor tg, tu, to;
            ember_buffer *bg, *bu, *bo;
            const int64_t sh[1] = {N};
            CHECK(ember_tensor_alloc(be, &tg, &bg, EMBER_F32, 1, sh, &err) == EMBER_OK);
            CHECK(ember_tensor_alloc(be, &tu, &bu, EMBER_F32, 1, sh, &err) == EMBER_OK);
            CHECK(ember_tensor_alloc(be, &to, &bo, EMBER_F32, 1, sh, &err) == EMBER_OK);
            be->ops->write(be, &tg, 0, g, N * sizeof *g, &err);
            be->ops->write(be, &tu, 0, u, N * sizeof *u, &err);
            CHECK(be->ops->swiglu(be, &to, &tg, &tu, &err) == EMBER_OK); /* the kernel's bits, split in tasks */
            be->ops->read(be, &to, 0, got, N * sizeof *got, &err);
            float *want = malloc(N * sizeof *want);
            ember_cpu_kernels_for(isas[a])->silu_mul(want, g, u, N);
            CHECKF(!memcmp(got, want, N * sizeof *got), "swiglu %s, %d threads: not silu_mul's bits",
                   ember_isa_name(isas[a]), threads);
            free(want);
            CHECK(be->ops->geglu(be, &to, &tg, &tu, &err) == EMBER_OK);
            be->ops->read(be, &to, 0, got, N * sizeof *got, &err);
            double worst = 0;
            for (int i = 0; i < N; i++) {
                double want = geglu_ref(g[i], u[i]);
                /* relative to |g u|: 1 + tanh cancels for negative g, in f32 as in torch */
                worst = fmax(worst, fabs(got[i] - want) / (fabs((double)g[i] * u[i]) + 1e-30));
            }
            CHECKF(worst <= 3e-7, "geglu %s: error %g x |g u|", ember_isa_name(isas[a]), worst);
            CHECK(be->ops->scale(be, &tg, &tg, 8.0f, &err) == EMBER_OK); /* in place */
            be->ops->read(be, &tg, 0, got, N * sizeof *got, &err);
            bool exact = true;
            for (int i = 0; i < N; i++) exact &= got[i] == g[i] * 8.0f;
            CHECKF(exact, "scale %s: not the exact products", ember_isa_name(isas[a]));
            CHECK(be->ops->softcap(be, &to, &tg, 4.0f, &err) == EMBER_OK); /* tg holds 8 g now */
            be->ops->read(be, &to, 0, got, N * sizeof *got, &err);
            worst = 0;
            for (int i = 0; i < N; i++) worst = fmax(worst, fabs(got[i] - 4.0 * tanh(8.0 * g[i] / 4.0)));
            CHECKF(worst <= 2e-6, "softcap %s: error %g", ember_isa_name(isas[a]), worst);
            CHECK(be->ops->softcap(be, &to, &tg, 0.0f, &err) == EMBER_ERR_INVALID_ARG);
            const int64_t sh2[1] = {N - 1};
            ember_tensor small;
            CHECK(ember_tensor_view(&small, bo, 0, EMBER_F32, 1, sh2, &err) == EMBER_OK);
            CHECK(be->ops->geglu(be, &small, &tg, &tu, &err) == EMBER_ERR_INVALID_ARG); /* sizes differ */
            ember_buffer_free(bg);
            ember_buffer_free(bu);
            ember_buffer_free(bo);
            ember_backend_free(be);
        }
    }
    free(g);
    free(u);
    free(got);
}

/* add_rows_scaled, the MoE combine: dst[ids[i]] += w[i] src[i] in i order,
   a repeated row included; a row no term names is untouched; rows out of
   range and a short src are refused. */
static void test_add_rows_scaled(void) {
    enum { R = 5, D = 37, N = 4 };
    ember_backend *be;
    ember_error err = {0};
    ember_cpu_params cp = {2, EMBER_ISA_AUTO, false, {0}};
    CHECK(ember_backend_cpu_new(&cp, &be, &err) == EMBER_OK);
    ember_tensor td, ts;
    ember_buffer *bd, *bs;
    CHECK(ember_tensor_alloc(be, &td, &bd, EMBER_F32, 2, (const int64_t[]){R, D}, &err) == EMBER_OK);
    CHECK(ember_tensor_alloc(be, &ts, &bs, EMBER_F32, 2, (const int64_t[]){N, D}, &err) == EMBER_OK);
    float d[R * D], s[N * D], want[R * D], got[R * D];
    for (int i = 0; i < R * D; i++) want[i] = d[i] = frand();
    for (int i = 0; i < N * D; i++) s[i] = frand();
    const int32_t ids[N] = {3, 0, 3, 4};
    const float w[N] = {0.25f, -1.5f, 0.75f, 2.0f};
    for (int i = 0; i < N; i++)
        for (int j = 0; j < D; j++) {
            float p = w[i] * s[i * D + j];
            want[ids[i] * D + j] += p;
        }
    be->ops->write(be, &td, 0, d, sizeof d, &err);
    be->ops->write(be, &ts, 0, s, sizeof s, &err);
    CHECK(be->ops->add_rows_scaled(be, &td, &ts, ids, w, N, &err) == EMBER_OK);
    be->ops->read(be, &td, 0, got, sizeof got, &err);
    double worst = 0;
    for (int i = 0; i < R * D; i++) worst = fmax(worst, fabs((double)got[i] - want[i]));
    CHECKF(worst <= 1e-6, "add_rows_scaled: error %g", worst);
    CHECK(!memcmp(got + D, d + D, 2 * D * sizeof(float))); /* rows 1 and 2: no term */
    const int32_t bad[1] = {R};
    CHECK(be->ops->add_rows_scaled(be, &td, &ts, bad, w, 1, &err) == EMBER_ERR_INVALID_ARG);
    CHECK(be->ops->add_rows_scaled(be, &td, &ts, ids, w, N + 1, &err) == EMBER_ERR_INVALID_ARG);
    ember_buffer_free(bd);
    ember_buffer_free(bs);
    ember_backend_free(be);
}

/* A zero-copy backend (--mmap) wraps weights at any 8-byte aligned address
   (safetensors pads its header to 8 only; the gemm calls above already read
   rows at 2-byte aligned addresses), and copies less aligned ones. */
static void test_zero_copy(void) {
    ember_backend *be;
    ember_error err = {0};
    ember_cpu_params cp = {1, EMBER_ISA_AUTO, true, {0}};
    CHECK(ember_backend_cpu_new(&cp, &be, &err) == EMBER_OK);
    _Alignas(64) unsigned char host[256] = {0};
    ember_buffer *b = NULL;
    CHECK(be->ops->buffer_from_host(be, host + 8, 128, &b, &err) == EMBER_OK);
    CHECKF(b && b->data == (void *)(host + 8) && !b->owned, "an 8-byte aligned weight was copied");
    ember_buffer_free(b);
    CHECK(be->ops->buffer_from_host(be, host + 4, 128, &b, &err) == EMBER_OK);
    CHECKF(b && b->data != (void *)(host + 4) && b->owned && !memcmp(b->data, host + 4, 128),
           "a 4-byte aligned weight was not copied");
    ember_buffer_free(b);
    ember_backend_free(be);
}

int main(void) {
    const ember_dtype dts[] = {EMBER_F32, EMBER_F16, EMBER_BF16};
    const int shapes[][3] = {{1, 16, 1}, {7, 33, 5}, {64, 64, 9}, {33, 100, 17}, {130, 257, 70}, {5, 1, 3}, {9, 15, 2}, {66, 48, 4}};
    for (int d = 0; d < 3; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            test_shape(dts[d], shapes[s][0], shapes[s][1], shapes[s][2]);
    test_axpy();
    test_silu_mul();
    test_plain_loops();
    test_argmax_range();
    test_elementwise_ops();
    test_add_rows_scaled();
    test_zero_copy();
    for (int i = EMBER_ISA_SCALAR; i <= EMBER_ISA_AMX; i++)
        if (!ember_isa_supported((ember_isa)i)) fprintf(stderr, "note: %s not available here\n", ember_isa_name((ember_isa)i));
    return test_done();
}
