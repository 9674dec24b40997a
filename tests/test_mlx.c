/*
 * test_mlx.c - MLX affine group-wise quantization end to end:
 *   1. config.json: the "quantization" object (defaults, per-module entries
 *      true / false / objects, the "quantization_config" copy) is read, and
 *      other schemes (GPTQ, AWQ, mxfp4) and bad values are refused;
 *   2. exact dequantization: the fixture llama quantized by `ember quantize`'s
 *      library call for every width (2, 3, 4, 5, 6, 8), group size (32, 64,
 *      128) and scale dtype (F32, F16, BF16); each matrix dequantized by
 *      Ember (repack + the CPU backend's row dequantizer) equals this file's
 *      straightforward reading of the MLX definition (uint32 words, bit
 *      offsets e * bits, w = scale * q + bias) bit for bit; the codes,
 *      scales and biases equal this file's own transcription of MLX's
 *      quantizer; random packed words and scales likewise;
 *   3. kernels: every ISA's gemm equals the canonical plain-C kernel bit for
 *      bit, for all widths and group sizes, odd and even block counts and
 *      ragged tiles; each output row equals the row computed alone; and the
 *      result is close to the f32 dot of the dequantized operands;
 *   4. KL(f32 || quantized) over every position of the fixture prompts for
 *      llama, qwen2, qwen3, mistral (and llama_bf16, whose BF16 weights give
 *      BF16 scales as in mlx-community files): mean below 1e-3 for 8 bits,
 *      5e-2 for 4 bits (and mlx-lm's mixed 4/6 recipe), looser stated bounds
 *      for 2, 3, 5, 6 bits; quantized embeddings and tied heads included;
 *   5. a directory shaped like mlx-community's Qwen2.5 4-bit (config without
 *      "mode", BF16 scales, tied embeddings), and one with a module left
 *      float by a `false` entry, load and stay within the 4-bit bound;
 *   6. batch invariance of an MLX model: three prompts together (2 threads)
 *      equal each alone (1 thread), bit for bit;
 *   7. malformed MLX files each fail with one line naming the file and the
 *      tensor (or config field), never a crash; random code and scale bytes
 *      load and run.
 * Exits 77 when ../shared is absent.
 */
#define TEST_RNG_SEED 0x2545f4914f6cdd1dull
#include <sys/stat.h>

#include "backend/cpu/kern_mlx.h"
#include "backend/cpu/qkern.h"
#include "core/cpu.h"
#include "core/mapfile.h"
#include "ember.h"
#include "fixture.h"
#include "formats/config.h"
#include "formats/mlx_quant.h"
#include "formats/weights.h"
#include "model/model.h"
#include "model/quantize_mlx.h"


static const int k_bits[] = {2, 3, 4, 5, 6, 8};
static const int k_groups[] = {32, 64, 128};

/* ---- independent references ------------------------------------------------ */

/* IEEE half -> float by the textbook formula. */
static float ref_f16(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0)
        v = ldexpf((float)m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexpf((float)(1024 + m), e - 25);
    return s ? -v : v;
}

static float ref_scalar(ember_dtype t, const unsigned char *p, size_t i) {
    if (t == EMBER_F32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    if (t == EMBER_F16) return ref_f16(h);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Code e of a packed row, read as MLX defines it: uint32 words, element e
   at bit offset e * bits, straddling into the next word when needed. */
static uint32_t ref_code(const unsigned char *row, int64_t e, int bits) {
    uint64_t bit = (uint64_t)e * (uint64_t)bits;
    uint32_t w0, w1 = 0;
    memcpy(&w0, row + 4 * (bit / 32), 4);
    unsigned sh = (unsigned)(bit % 32);
    uint64_t v = (uint64_t)w0 >> sh;
    if (sh + (unsigned)bits > 32) {
        memcpy(&w1, row + 4 * (bit / 32 + 1), 4);
        v |= (uint64_t)w1 << (32 - sh);
    }
    return (uint32_t)(v & ((1u << bits) - 1));
}

/* W[n][e] = scales[n][e / G] * q + biases[n][e / G], product then sum. */
static void ref_dequant(const ember_st_tensor *w, const ember_st_tensor *s, const ember_st_tensor *b, int bits, int G,
                        int64_t N, int64_t K, float *out) {
    size_t row = (size_t)K * (size_t)bits / 8;
    for (int64_t n = 0; n < N; n++)
        for (int64_t e = 0; e < K; e++) {
            size_t gi = (size_t)(n * (K / G) + e / G);
            float sc = ref_scalar(s->dtype, s->data, gi), bi = ref_scalar(b->dtype, b->data, gi);
            float prod = sc * (float)ref_code(w->data + (size_t)n * row, e, bits);
            out[n * K + e] = prod + bi;
        }
}

/* MLX's CPU quantize kernel for one group, transcribed from its definition:
   returns scale / bias in f32 and codes. */
static void ref_quant_group(const float *x, int G, int bits, uint32_t *q, float *scale, float *bias) {
    float n_bins = (float)((1 << bits) - 1), eps = 1e-7f;
    float mx = -INFINITY, mn = INFINITY;
    for (int i = 0; i < G; i++) {
        if (x[i] > mx) mx = x[i];
        if (x[i] < mn) mn = x[i];
    }
    bool min_edge = fabsf(mn) > fabsf(mx);
    float s = (mx - mn) / n_bins;
    if (s < eps) s = eps;
    if (!min_edge) s = -s;
    float edge = min_edge ? mn : mx, q0 = rintf(edge / s), bi = 0;
    if (q0 != 0) {
        s = edge / q0;
        bi = edge;
    }
    for (int i = 0; i < G; i++) {
        float v = rintf((x[i] - bi) / s);
        q[i] = v < 0 ? 0 : v > n_bins ? (uint32_t)n_bins : (uint32_t)v;
    }
    *scale = s;
    *bias = bi;
}

static void round_to(ember_dtype t, float *v) {
    if (t == EMBER_BF16) *v = ember_bf16_to_f32(ember_f32_to_bf16(*v));
    if (t == EMBER_F16) *v = ember_f16_to_f32(ember_f32_to_f16(*v));
}

/* ---- helpers ---------------------------------------------------------------- */

static int quantize(const char *in, const char *out, int bits, int G, int high, ember_dtype sdt) {
    ember_mlx_qopts o = {bits, G, high, sdt, false};
    ember_error err = {0};
    int rc = ember_quantize_to_mlx(in, out, &o, &err);
    if (rc) fprintf(stderr, "quantize %s -> %s: %s\n", in, out, err.msg);
    return rc;
}

/* The whole file, NUL-terminated (caller frees); NULL when unreadable. */
static char *read_text(const char *path) {
    char *s = NULL;
    ember_error err = {0};
    return ember_read_file(path, (size_t)1 << 26, &s, NULL, &err) ? NULL : s;
}

static void write_text(const char *path, const char *text) {
    FILE *fp = fopen(path, "wb");
    CHECK(fp != NULL);
    if (!fp) return;
    fputs(text, fp);
    fclose(fp);
}

/* ---- 1: config.json -------------------------------------------------------- */

#define CBASE "\"model_type\":\"llama\",\"vocab_size\":100,\"hidden_size\":64,\"intermediate_size\":128," \
              "\"num_hidden_layers\":2,\"num_attention_heads\":4"

static int parse_cfg(const char *json, ember_model_config *c, ember_error *err) {
    return ember_config_parse("config.json", json, strlen(json), c, err);
}

static void cfg_err(const char *json, int code, const char *needle) {
    ember_model_config c;
    ember_error err = {0};
    int rc = parse_cfg(json, &c, &err);
    CHECKF(rc == code, "%s -> %d (%s)", json, rc, err.msg);
    CHECKF(strstr(err.msg, "config.json") && strstr(err.msg, needle) && !strchr(err.msg, '\n'), "message: %s (want %s)",
           err.msg, needle);
}

static void test_config(void) {
    ember_model_config c;
    ember_error err = {0};
    int b, g;
    CHECKF(parse_cfg("{" CBASE "}", &c, &err) == EMBER_OK, "%s", err.msg);
    CHECK(c.quant.bits == 0 && ember_config_quant_module(&c, "lm_head", &b, &g) == EMBER_QMOD_DEFAULT && b == 0);
    CHECKF(parse_cfg("{" CBASE ",\"quantization\":{\"group_size\":64,\"bits\":4,\"mode\":\"affine\","
                     "\"model.layers.1.mlp.down_proj\":{\"group_size\":32,\"bits\":8},"
                     "\"model.layers.0.self_attn.v_proj\":{\"bits\":6},"
                     "\"lm_head\":false,\"model.embed_tokens\":true,\"model.layers.0.mlp.router\":{\"bits\":8},"
                     "\"vision_tower.blocks.0\":false},"
                     "\"quantization_config\":{\"group_size\":64,\"bits\":4}}",
                     &c, &err) == EMBER_OK,
           "%s", err.msg);
    CHECK(c.quant.bits == 4 && c.quant.group_size == 64);
    CHECK(ember_config_quant_module(&c, "model.layers.1.mlp.down_proj", &b, &g) == EMBER_QMOD_QUANT && b == 8 && g == 32);
    /* object entries without group_size take the affine default 64, as MLX's to_quantized does */
    CHECK(ember_config_quant_module(&c, "model.layers.0.self_attn.v_proj", &b, &g) == EMBER_QMOD_QUANT && b == 6 &&
          g == 64);
    CHECK(ember_config_quant_module(&c, "lm_head", &b, &g) == EMBER_QMOD_FLOAT);
    CHECK(ember_config_quant_module(&c, "model.embed_tokens", &b, &g) == EMBER_QMOD_QUANT && b == 4 && g == 64);
    CHECK(ember_config_quant_module(&c, "model.layers.0.mlp.down_proj", &b, &g) == EMBER_QMOD_DEFAULT && b == 4 &&
          g == 64);
    /* only the copy (older writers) */
    CHECKF(parse_cfg("{" CBASE ",\"quantization_config\":{\"group_size\":32,\"bits\":8}}", &c, &err) == EMBER_OK, "%s",
           err.msg);
    CHECK(c.quant.bits == 8 && c.quant.group_size == 32);
    /* refused */
    cfg_err("{" CBASE ",\"quantization_config\":{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":128}}",
            EMBER_ERR_UNSUPPORTED, "gptq");
    cfg_err("{" CBASE ",\"quantization_config\":{\"quant_method\":\"awq\",\"bits\":4}}", EMBER_ERR_UNSUPPORTED, "awq");
    cfg_err("{" CBASE ",\"quantization\":{\"group_size\":32,\"bits\":4,\"mode\":\"mxfp4\"}}", EMBER_ERR_UNSUPPORTED,
            "mxfp4");
    cfg_err("{" CBASE ",\"quantization\":{\"group_size\":64,\"bits\":7}}", EMBER_ERR_FORMAT, "quantization.bits");
    cfg_err("{" CBASE ",\"quantization\":{\"group_size\":48,\"bits\":4}}", EMBER_ERR_FORMAT, "quantization.group_size");
    cfg_err("{" CBASE ",\"quantization\":{\"bits\":4}}", EMBER_ERR_FORMAT, "quantization.group_size");
    cfg_err("{" CBASE ",\"quantization\":{\"group_size\":64}}", EMBER_ERR_FORMAT, "quantization.bits");
    cfg_err("{" CBASE ",\"quantization\":{\"group_size\":64,\"bits\":\"4\"}}", EMBER_ERR_FORMAT, "bits");
    cfg_err("{" CBASE ",\"quantization\":4}", EMBER_ERR_FORMAT, "quantization");
    cfg_err("{" CBASE ",\"quantization\":{\"group_size\":64,\"bits\":4,\"lm_head\":{\"bits\":1}}}", EMBER_ERR_FORMAT,
            "quantization.lm_head.bits");
    cfg_err("{" CBASE ",\"quantization\":{\"group_size\":64,\"bits\":4,\"model.layers.5.mlp.up_proj\":false}}",
            EMBER_ERR_FORMAT, "model.layers.5.mlp.up_proj");
}

/* ---- 2: exact dequantization ------------------------------------------------ */

static const ember_st_tensor *find(const ember_st_file *f, const char *fmt, const char *module) {
    char name[300];
    snprintf(name, sizeof name, fmt, module);
    return ember_st_find(f, name);
}

/* Every quantized module of dir: Ember's dequantization against ref_dequant,
   and the file's codes / scales / biases against ref_quant_group of the
   original weights in src. */
static void check_dir_exact(const char *dir, const char *src_dir, int bits, int G, const char *tag) {
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ember_st_file *f = NULL, *src = NULL;
    ember_error err = {0};
    CHECKF(ember_st_open(path, &f, &err) == EMBER_OK, "%s", err.msg);
    snprintf(path, sizeof path, "%s/model.safetensors", src_dir);
    CHECKF(ember_st_open(path, &src, &err) == EMBER_OK, "%s", err.msg);
    if (!f || !src) return;
    int modules = 0;
    for (int i = 0; i < f->n_tensors; i++) {
        const char *name = f->tensors[i].name;
        size_t len = strlen(name);
        if (len < 8 || strcmp(name + len - 7, ".scales") != 0) continue;
        char module[256];
        snprintf(module, sizeof module, "%.*s", (int)(len - 7), name);
        const ember_st_tensor *w = find(f, "%s.weight", module), *s = &f->tensors[i], *b = find(f, "%s.biases", module);
        const ember_st_tensor *orig = find(src, "%s.weight", module);
        CHECK(w && b && orig && w->dtype == EMBER_U32);
        if (!w || !b || !orig) continue;
        int64_t N = orig->shape[0], K = orig->shape[1];
        CHECK(w->shape[0] == N && w->shape[1] == K * bits / 32 && s->shape[1] == K / G);
        float *ref = malloc((size_t)(N * K) * 4), *got = malloc((size_t)(N * K) * 4);
        ref_dequant(w, s, b, bits, G, N, K, ref);
        ember_mlx_part pw = {"w", path, w}, ps = {"s", path, s}, pb = {"b", path, b};
        void *blocks = NULL;
        size_t nb = 0;
        CHECKF(ember_mlx_repack(&pw, &ps, &pb, bits, G, N, K, &blocks, &nb, &err) == EMBER_OK, "%s", err.msg);
        ember_dtype dt = ember_dtype_mlx(bits, G);
        CHECK(blocks && cpu_mlx_dequant_row(dt, blocks, got, N * K));
        CHECKF(memcmp(ref, got, (size_t)(N * K) * 4) == 0, "%s %s: dequantization differs from the reference", tag,
               module);
        /* the quantizer: codes and (rounded) scales / biases as MLX computes them */
        bool same = true;
        float x[128];
        uint32_t q[128];
        for (int64_t n = 0; n < N && same; n++)
            for (int64_t g = 0; g < K / G && same; g++) {
                for (int e = 0; e < G; e++) x[e] = ref_scalar(orig->dtype, orig->data, (size_t)(n * K + g * G + e));
                float sc, bi;
                ref_quant_group(x, G, bits, q, &sc, &bi);
                round_to(s->dtype, &sc);
                round_to(b->dtype, &bi);
                size_t gi = (size_t)(n * (K / G) + g);
                same = ref_scalar(s->dtype, s->data, gi) == sc && ref_scalar(b->dtype, b->data, gi) == bi;
                for (int e = 0; e < G && same; e++)
                    same = ref_code(w->data + (size_t)n * (size_t)K * bits / 8, g * G + e, bits) == q[e];
            }
        CHECKF(same, "%s %s: codes / scales differ from MLX's quantizer", tag, module);
        free(blocks);
        free(ref);
        free(got);
        modules++;
    }
    CHECKF(modules > 0, "%s: no quantized modules", tag);
    ember_st_free(f);
    ember_st_free(src);
}

static void test_exact(void) {
    fixture fx;
    fixture_open(&fx, "llama");
    static const ember_dtype sdts[] = {EMBER_F32, EMBER_F16, EMBER_BF16};
    for (int bi = 0; bi < 6; bi++)
        for (int gi = 0; gi < 3; gi++)
            for (int si = 0; si < 3; si++) {
                int bits = k_bits[bi], G = k_groups[gi];
                if (si != 2 && gi != 1 && bits != 3) continue; /* every width x group with BF16; the rest sampled */
                char dir[700], tag[64];
                snprintf(tag, sizeof tag, "mlx%d_g%d_%s", bits, G, ember_dtype_get(sdts[si])->name);
                snprintf(dir, sizeof dir, "%s/exact-%s", EMBER_TEST_TMP, tag);
                CHECK(quantize(fx.dir, dir, bits, G, 0, sdts[si]) == 0);
                check_dir_exact(dir, fx.dir, bits, G, tag);
            }
    fixture_close(&fx);
    /* random packed words and scales, every width and group size */
    for (int bi = 0; bi < 6; bi++)
        for (int gi = 0; gi < 3; gi++) {
            int bits = k_bits[bi], G = k_groups[gi];
            const int64_t N = 3, K = 2 * G;
            uint32_t *words = malloc((size_t)(N * K * bits / 32) * 4);
            uint16_t sc[3 * 8], bs[3 * 8];
            for (int64_t i = 0; i < N * K * bits / 32; i++) words[i] = rnd() ^ (rnd() << 16);
            for (int i = 0; i < N * K / G; i++) {
                sc[i] = ember_f32_to_bf16(frnd() * 0.1f);
                bs[i] = ember_f32_to_f16(frnd());
            }
            ember_st_tensor w = {.dtype = EMBER_U32, .ndim = 2, .shape = {N, K * bits / 32}, .data = (void *)words};
            ember_st_tensor s = {.dtype = EMBER_BF16, .ndim = 2, .shape = {N, K / G}, .data = (void *)sc};
            ember_st_tensor b = {.dtype = EMBER_F16, .ndim = 2, .shape = {N, K / G}, .data = (void *)bs};
            float ref[3 * 256], got[3 * 256];
            ref_dequant(&w, &s, &b, bits, G, N, K, ref);
            ember_mlx_part pw = {"w", "mem", &w}, ps = {"s", "mem", &s}, pb = {"b", "mem", &b};
            void *blocks = NULL;
            size_t nb;
            ember_error err = {0};
            CHECKF(ember_mlx_repack(&pw, &ps, &pb, bits, G, N, K, &blocks, &nb, &err) == EMBER_OK, "%s", err.msg);
            CHECK(blocks && cpu_mlx_dequant_row(ember_dtype_mlx(bits, G), blocks, got, N * K));
            CHECKF(memcmp(ref, got, sizeof(float) * (size_t)(N * K)) == 0, "random mlx%d_g%d: dequantization differs",
                   bits, G);
            /* the byte-wise code accessors agree with the word-wise reference */
            bool same = true;
            for (int64_t e = 0; e < K && same; e++) same = ember_mlx_get_code((void *)words, e, bits) == ref_code((void *)words, e, bits);
            unsigned char row[256] = {0};
            for (int64_t e = 0; e < K; e++) ember_mlx_put_code(row, e, bits, ref_code((void *)words, e, bits));
            CHECKF(same && memcmp(row, words, (size_t)K * bits / 8) == 0, "mlx%d code accessors", bits);
            free(blocks);
            free(words);
        }
}

/* ---- 3: kernels --------------------------------------------------------------- */

static void test_kernels(void) {
    const cpu_kernels *tables[] = {&ember_cpu_kernels_scalar, &ember_cpu_kernels_avx2, &ember_cpu_kernels_avx512,
                                   &ember_cpu_kernels_avx512vnni, &ember_cpu_kernels_avx2vnni};
    ember_cpu_features feat;
    ember_cpu_detect(&feat);
    bool have[] = {true, ember_isa_supported(EMBER_ISA_AVX2), ember_isa_supported(EMBER_ISA_AVX512),
                   ember_isa_supported(EMBER_ISA_AVX512) && feat.avx512vnni,
                   ember_isa_supported(EMBER_ISA_AVX2) && feat.avxvnni};
    int ran = 0;
    for (int bi = 0; bi < 6; bi++)
        for (int gi = 0; gi < 3; gi++)
            for (int kk = 1; kk <= 3; kk += 2) {
                /* N = 13: decode's 4-row tiles take rows 3 apart, and one row is left */
                int bits = k_bits[bi], G = k_groups[gi], K = G * kk, N = 13, M = 7;
                ember_dtype dt = ember_dtype_mlx(bits, G);
                size_t wrow = (size_t)(K / G) * ember_dtype_get(dt)->block_bytes;
                unsigned char *w = malloc(wrow * (size_t)N);
                uint8_t codes[128];
                for (int n = 0; n < N; n++)
                    for (int g = 0; g < K / G; g++) {
                        for (int e = 0; e < G; e++) codes[e] = (uint8_t)(rnd() & ((1u << bits) - 1));
                        /* the extreme codes too, where 8-bit partial sums are largest */
                        if (n == 0) memset(codes, (1 << bits) - 1, (size_t)G);
                        ember_mlx_pack_block(bits, G, frnd() * 0.05f, frnd(), codes,
                                             w + (size_t)n * wrow + (size_t)g * ember_dtype_get(dt)->block_bytes);
                    }
                float *x = malloc((size_t)(M * K) * 4);
                for (int i = 0; i < M * K; i++) x[i] = frnd();
                for (int i = 0; i < K; i++) x[i] = i % 2 ? 1.0f : -1.0f; /* row 0: +-127 activations */
                size_t arow = (size_t)(K / 32) * sizeof(cpu_act32);
                unsigned char *xa = malloc(arow * (size_t)M);
                for (int m = 0; m < M; m++) cpu_quantize_act32(x + (size_t)m * K, K, xa + (size_t)m * arow);
                float ref[91], got[91], one[13];
                cpu_mlx_gemm_generic(bits, G, w, wrow, N, xa, arow, M, K, ref, N);
                for (int t = 0; t < 4; t++) {
                    if (!have[t]) continue;
                    cpu_mlx_gemm_fn fn = cpu_mlx_gemm_for(tables[t]);
                    for (int mm = 1; mm <= M; mm += 3) { /* 1, 4, 7 rows: full and ragged tiles */
                        memset(got, 0, sizeof got);
                        fn(bits, G, w, wrow, N, xa, arow, mm, K, got, N);
                        CHECKF(memcmp(got, ref, (size_t)(mm * N) * 4) == 0, "%s mlx%d_g%d K=%d rows=%d: differs from the canonical kernel",
                               tables[t]->variant, bits, G, K, mm);
                    }
                    for (int m = 0; m < M; m++) { /* a row alone */
                        fn(bits, G, w, wrow, N, xa + (size_t)m * arow, arow, 1, K, one, N);
                        CHECKF(memcmp(one, ref + m * N, sizeof one) == 0, "%s mlx%d_g%d: row %d alone differs",
                               tables[t]->variant, bits, G, m);
                    }
                    ran++;
                }
                /* close to the f32 dot of the dequantized weights and activations */
                float *wd = malloc((size_t)(N * K) * 4);
                CHECK(cpu_mlx_dequant_row(dt, w, wd, (int64_t)N * K));
                for (int m = 0; m < M; m++)
                    for (int n = 0; n < N; n++) {
                        const cpu_act32 *y = (const cpu_act32 *)(const void *)(xa + (size_t)m * arow);
                        double d = 0, mag = 0;
                        for (int e = 0; e < K; e++) {
                            double xv = (double)y[e / 32].d * y[e / 32].q[e % 32];
                            d += (double)wd[n * K + e] * xv;
                            mag += fabs((double)wd[n * K + e] * xv);
                        }
                        CHECKF(fabs(d - ref[m * N + n]) <= 1e-5 * mag + 1e-6, "mlx%d_g%d: dot %g vs f64 %g", bits, G,
                               ref[m * N + n], d);
                    }
                free(wd);
                free(w);
                free(x);
                free(xa);
            }
    CHECK(ran > 0);
}

/* ---- 4: KL bounds ----------------------------------------------------------------- */

typedef struct scheme {
    const char *name;
    int bits, G, high;
    ember_dtype sdt;
    double bound;
} scheme;

static const scheme k_schemes[] = {
    {"mlx8", 8, 64, 0, EMBER_DTYPE_INVALID, 1e-3},   {"mlx8_g32", 8, 32, 0, EMBER_DTYPE_INVALID, 1e-3},
    {"mlx8_bf16", 8, 64, 0, EMBER_BF16, 1e-3},       {"mlx6", 6, 64, 0, EMBER_DTYPE_INVALID, 5e-3},
    {"mlx5", 5, 64, 0, EMBER_DTYPE_INVALID, 2e-2},   {"mlx4", 4, 64, 0, EMBER_DTYPE_INVALID, 5e-2},
    {"mlx4_g32", 4, 32, 0, EMBER_DTYPE_INVALID, 5e-2}, {"mlx4_g128", 4, 128, 0, EMBER_DTYPE_INVALID, 5e-2},
    {"mlx4_bf16", 4, 64, 0, EMBER_BF16, 5e-2},       {"mlx_mixed_4_6", 4, 64, 6, EMBER_DTYPE_INVALID, 5e-2},
    {"mlx3", 3, 64, 0, EMBER_DTYPE_INVALID, 0.2},    {"mlx2", 2, 64, 0, EMBER_DTYPE_INVALID, 1.0},
};

/* scale multiplies every bound: quantization noise adds up layer by layer,
   and gemma3_text has 4 layers where the other fixtures have 2. */
static void kl_family(const char *fam, double scale) {
    fixture f;
    fixture_open(&f, fam);
    int rows = f.p[0].n + f.p[1].n + f.p[2].n;
    float *ref = malloc((size_t)rows * f.vocab * 4), *q = malloc((size_t)rows * f.vocab * 4);
    CHECK(fx_prompt_logits(f.dir, &f, 3, ref) == 0);
    for (size_t s = 0; s < sizeof k_schemes / sizeof k_schemes[0]; s++) {
        const scheme *sc = &k_schemes[s];
        char out[700];
        snprintf(out, sizeof out, "%s/kl-%s-%s", EMBER_TEST_TMP, fam, sc->name);
        CHECK(quantize(f.dir, out, sc->bits, sc->G, sc->high, sc->sdt) == 0);
        if (fx_prompt_logits(out, &f, 3, q)) {
            CHECKF(0, "%s %s does not load", fam, sc->name);
            continue;
        }
        double kl = mean_kl(ref, q, rows, f.vocab);
        fprintf(stderr, "%-10s %-14s mean KL %.3g (bound %g)\n", fam, sc->name, kl, sc->bound * scale);
        CHECKF(kl < sc->bound * scale, "%s %s: mean KL %g >= %g", fam, sc->name, kl, sc->bound * scale);
    }
    free(ref);
    free(q);
    fixture_close(&f);
}

static void test_kl(void) {
    static const char *const fams[] = {"llama", "qwen2", "qwen3", "mistral", "llama_bf16", "phi3", "gemma2",
                                       "gemma3_text"};
    for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++)
        kl_family(fams[i], strcmp(fams[i], "gemma3_text") == 0 ? 2.0 : 1.0);
}

/* ---- safetensors rewriting (5, 7) ------------------------------------------------ */

typedef struct rewrite {
    const ember_st_file *src;
    const ember_st_file *extra; /* tensors taken from another file, by name */
    ember_st_out *outs;
    const ember_st_tensor **from; /* source of each output (NULL: zeros) */
} rewrite;

static int rw_fill(void *user, int index, size_t first, size_t n, void *dst, ember_error *err) {
    (void)err;
    const rewrite *r = user;
    size_t es = ember_dtype_get(r->outs[index].dtype)->block_bytes, off = first * es, len = n * es;
    const ember_st_tensor *t = r->from[index];
    memset(dst, 0, len);
    if (t && off < t->nbytes) memcpy(dst, t->data + off, t->nbytes - off < len ? t->nbytes - off : len);
    return EMBER_OK;
}

/* A mutation of one tensor: drop it, retype it, reshape it, or replace it
   by the float tensor `with` from the original model (renamed). */
typedef struct mutation {
    const char *name;
    enum { MUT_NONE, MUT_DROP, MUT_DTYPE, MUT_SHAPE, MUT_REPLACE } op;
    ember_dtype dtype;
    int64_t d0, d1;
    const char *with; /* MUT_REPLACE: tensor of the extra file */
} mutation;

/* Copies src_dir's MLX model to dst_dir applying mutations (any number,
   each naming one tensor) and writing config text (or copying it). */
static void make_variant(const char *src_dir, const char *orig_dir, const char *dst_dir, const mutation *mut, int nmut,
                         const char *config) {
    mkdir(dst_dir, 0755);
    char path[800];
    snprintf(path, sizeof path, "%s/config.json", src_dir);
    char *cfg = config ? NULL : read_text(path);
    snprintf(path, sizeof path, "%s/config.json", dst_dir);
    write_text(path, config ? config : cfg);
    free(cfg);
    ember_st_file *src = NULL, *orig = NULL;
    ember_error err = {0};
    snprintf(path, sizeof path, "%s/model.safetensors", src_dir);
    CHECK(ember_st_open(path, &src, &err) == EMBER_OK);
    snprintf(path, sizeof path, "%s/model.safetensors", orig_dir);
    CHECK(ember_st_open(path, &orig, &err) == EMBER_OK);
    if (!src || !orig) return;
    ember_st_out *outs = calloc((size_t)src->n_tensors, sizeof *outs);
    const ember_st_tensor **from = calloc((size_t)src->n_tensors, sizeof *from);
    int n = 0;
    for (int i = 0; i < src->n_tensors; i++) {
        const ember_st_tensor *t = &src->tensors[i];
        ember_st_out o = {t->name, t->dtype, t->ndim, {0}};
        memcpy(o.shape, t->shape, sizeof o.shape);
        const ember_st_tensor *fr = t;
        bool drop = false;
        for (int k = 0; k < nmut; k++) {
            if (strcmp(mut[k].name, t->name) != 0) continue;
            switch (mut[k].op) {
            case MUT_DROP: drop = true; break;
            case MUT_DTYPE: o.dtype = mut[k].dtype; break;
            case MUT_SHAPE:
                o.shape[0] = mut[k].d0;
                o.shape[1] = mut[k].d1;
                break;
            case MUT_REPLACE:
                fr = ember_st_find(orig, mut[k].with);
                CHECK(fr != NULL);
                if (!fr) return;
                o.dtype = fr->dtype;
                o.ndim = fr->ndim;
                memcpy(o.shape, fr->shape, sizeof o.shape);
                o.name = mut[k].with;
                break;
            default: break;
            }
        }
        if (drop) continue;
        outs[n] = o;
        from[n++] = fr;
    }
    rewrite r = {src, orig, outs, from};
    snprintf(path, sizeof path, "%s/model.safetensors", dst_dir);
    CHECKF(ember_st_write(path, outs, n, rw_fill, &r, &err) == EMBER_OK, "%s", err.msg);
    free(outs);
    free(from);
    ember_st_free(src);
    ember_st_free(orig);
}

/* Replaces `from` by `to` (all occurrences) in a malloc'd copy of s. */
static char *replace(const char *s, const char *from, const char *to) {
    size_t n = 0, lf = strlen(from), lt = strlen(to);
    for (const char *p = strstr(s, from); p; p = strstr(p + lf, from)) n++;
    char *out = malloc(strlen(s) + n * (lt + 1) + 1), *o = out;
    for (const char *p = s;;) {
        const char *q = strstr(p, from);
        if (!q) {
            strcpy(o, p);
            break;
        }
        memcpy(o, p, (size_t)(q - p));
        o += q - p;
        memcpy(o, to, lt);
        o += lt;
        p = q + lf;
    }
    return out;
}

/* ---- 5: mlx-community shape, `false` entries -------------------------------------- */

static double kl_of(const char *dir, const fixture *f, const float *ref) {
    int rows = f->p[0].n + f->p[1].n + f->p[2].n;
    float *q = malloc((size_t)rows * f->vocab * 4);
    double kl = fx_prompt_logits(dir, f, 3, q) ? INFINITY : mean_kl(ref, q, rows, f->vocab);
    free(q);
    return kl;
}

static void test_layouts(void) {
    fixture f;
    fixture_open(&f, "qwen2");
    int rows = f.p[0].n + f.p[1].n + f.p[2].n;
    float *ref = malloc((size_t)rows * f.vocab * 4);
    CHECK(fx_prompt_logits(f.dir, &f, 3, ref) == 0);
    /* Qwen2.5-0.5B-Instruct-4bit style: {"group_size": 64, "bits": 4} without "mode", BF16 scales, tied */
    char q4[700], dir[700], path[800];
    snprintf(q4, sizeof q4, "%s/layout-qwen2-mlx4", EMBER_TEST_TMP);
    CHECK(quantize(f.dir, q4, 4, 64, 0, EMBER_BF16) == 0);
    snprintf(path, sizeof path, "%s/config.json", q4);
    char *cfg = read_text(path);
    CHECK(cfg != NULL);
    if (!cfg) return;
    char *c1 = replace(cfg, ",\n        \"mode\": \"affine\"", "");
    char *c2 = replace(c1, "\"dtype\": \"float32\"", "\"torch_dtype\": \"bfloat16\"");
    CHECK(!strstr(c2, "\"mode\"") && strstr(c2, "\"quantization_config\""));
    snprintf(dir, sizeof dir, "%s/layout-community", EMBER_TEST_TMP);
    make_variant(q4, f.dir, dir, NULL, 0, c2);
    double kl = kl_of(dir, &f, ref);
    fprintf(stderr, "qwen2      community-4bit mean KL %.3g (bound 0.05)\n", kl);
    CHECKF(kl < 5e-2, "mlx-community shaped qwen2: mean KL %g", kl);
    /* a `false` entry: layer 1's up_proj stays float */
    char *c3 = replace(cfg, "\"mode\": \"affine\"\n    },\n    \"quantization_config\"",
                       "\"mode\": \"affine\",\n        \"model.layers.1.mlp.up_proj\": false\n    },\n    \"quantization_config\"");
    CHECK(strstr(c3, "up_proj\": false") != NULL);
    mutation mf[] = {{"model.layers.1.mlp.up_proj.weight", MUT_REPLACE, 0, 0, 0, "model.layers.1.mlp.up_proj.weight"},
                     {"model.layers.1.mlp.up_proj.scales", MUT_DROP, 0, 0, 0, NULL},
                     {"model.layers.1.mlp.up_proj.biases", MUT_DROP, 0, 0, 0, NULL}};
    snprintf(dir, sizeof dir, "%s/layout-false", EMBER_TEST_TMP);
    make_variant(q4, f.dir, dir, mf, 3, c3);
    ember_model *m = fx_load_model(dir, EMBER_ISA_AUTO, 2, 1);
    CHECK(m != NULL);
    ember_model_free(m);
    kl = kl_of(dir, &f, ref);
    CHECKF(kl < 5e-2, "qwen2 with a float up_proj: mean KL %g", kl);
    /* the quantized embedding and tied head through the backend: get_rows equals dequantization */
    ember_model_config mc;
    ember_weights *w = NULL;
    ember_backend *be = NULL;
    ember_llm *llm = NULL;
    ember_error err = {0};
    ember_cpu_params cp = {2, EMBER_ISA_AUTO, false, {0}};
    CHECK(ember_config_load(q4, &mc, &err) == EMBER_OK && ember_weights_open(q4, &w, &err) == EMBER_OK &&
          ember_backend_cpu_new(&cp, &be, &err) == EMBER_OK && ember_llm_load(&mc, w, be, &llm, &err) == EMBER_OK);
    if (llm) {
        CHECK(llm->embed.dtype == EMBER_MLX4_G64 && llm->lm_head.buf == llm->embed.buf);
        ember_tensor dst;
        ember_buffer *buf = NULL;
        CHECK(ember_tensor_alloc(be, &dst, &buf, EMBER_F32, 2, (const int64_t[]){3, 64}, &err) == EMBER_OK);
        int32_t ids[3] = {0, 511, 7};
        CHECKF(be->ops->get_rows(be, &dst, &llm->embed, ids, 3, &err) == EMBER_OK, "%s", err.msg);
        float rows3[3 * 64], want[512 * 64];
        CHECK(be->ops->read(be, &dst, 0, rows3, sizeof rows3, &err) == EMBER_OK);
        const ember_st_tensor *ew = ember_weights_find(w, "model.embed_tokens.weight", NULL),
                              *es = ember_weights_find(w, "model.embed_tokens.scales", NULL),
                              *eb = ember_weights_find(w, "model.embed_tokens.biases", NULL);
        CHECK(ew && es && eb && es->dtype == EMBER_BF16);
        if (ew && es && eb) {
            ref_dequant(ew, es, eb, 4, 64, 512, 64, want);
            for (int i = 0; i < 3; i++)
                CHECKF(memcmp(rows3 + 64 * i, want + 64 * ids[i], 64 * 4) == 0, "get_rows of token %d differs", ids[i]);
        }
        ember_buffer_free(buf);
    }
    ember_llm_free(llm);
    ember_backend_free(be);
    ember_weights_free(w);
    free(cfg);
    free(c1);
    free(c2);
    free(c3);
    free(ref);
    fixture_close(&f);
}

/* ---- 6: batch invariance ------------------------------------------------------------ */

static void test_batch_invariance(void) {
    fixture f;
    fixture_open(&f, "qwen3");
    char out[700];
    snprintf(out, sizeof out, "%s/bi-qwen3-mlx4", EMBER_TEST_TMP);
    CHECK(quantize(f.dir, out, 4, 32, 0, EMBER_BF16) == 0);
    const int V = f.vocab;
    float *together[3], *alone[3];
    for (int pass = 0; pass < 2; pass++) {
        ember_model *m = fx_load_model(out, EMBER_ISA_AUTO, pass ? 1 : 2, 3);
        CHECK(m != NULL);
        if (!m) return;
        ember_request r[3];
        memset(r, 0, sizeof r);
        int32_t ids[3][8];
        for (int i = 0; i < 3; i++) {
            float **dst = pass ? alone : together;
            dst[i] = malloc((size_t)(f.p[i].n + 7) * V * 4);
            r[i].prompt = f.p[i].ids;
            r[i].n_prompt = f.p[i].n;
            r[i].max_new_tokens = 8;
            r[i].ignore_eos = 1;
            ember_sampling_init(&r[i].sampling);
            r[i].out_ids = ids[i];
            r[i].out_logits = dst[i];
        }
        ember_error err = {0};
        if (pass == 0) {
            CHECKF(ember_generate(m, r, 3, &err) == EMBER_OK, "%s", err.msg);
        } else {
            for (int i = 0; i < 3; i++) CHECKF(ember_generate(m, &r[i], 1, &err) == EMBER_OK, "%s", err.msg);
        }
        ember_model_free(m);
    }
    for (int i = 0; i < 3; i++) {
        CHECKF(memcmp(together[i], alone[i], (size_t)(f.p[i].n + 7) * V * 4) == 0,
               "MLX qwen3 prompt %d: batched (2 threads) and alone (1 thread) logits differ", i);
        free(together[i]);
        free(alone[i]);
    }
    fixture_close(&f);
}

/* ---- 7: malformed files ---------------------------------------------------------------- */

static void expect_fail(const char *dir, const char *needle1, const char *needle2) {
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.n_threads = 1;
    ember_model *m = NULL;
    ember_error err = {0};
    int rc = ember_model_load(dir, &mp, &m, &err);
    CHECKF(rc != EMBER_OK, "%s loaded", dir);
    CHECKF(err.msg[0] && !strchr(err.msg, '\n') && strstr(err.msg, needle1) && strstr(err.msg, needle2),
           "%s: message '%s' should name %s and %s", dir, err.msg, needle1, needle2);
    ember_model_free(m);
}

static void test_malformed(void) {
    fixture f;
    fixture_open(&f, "llama");
    char q4[700], dir[700], path[800];
    snprintf(q4, sizeof q4, "%s/bad-base", EMBER_TEST_TMP);
    CHECK(quantize(f.dir, q4, 4, 64, 0, EMBER_DTYPE_INVALID) == 0);
    snprintf(path, sizeof path, "%s/config.json", q4);
    char *cfg = read_text(path);
    if (!cfg) return;
    static const char qp[] = "model.layers.0.self_attn.q_proj";
    struct {
        const char *tag;
        mutation mut;
        const char *n1, *n2;
    } cases[] = {
        {"scales-shape", {"model.layers.0.self_attn.q_proj.scales", MUT_SHAPE, 0, 64, 2, NULL}, "model.safetensors", "q_proj.scales"},
        {"scales-rows", {"model.layers.0.mlp.up_proj.scales", MUT_SHAPE, 0, 64, 1, NULL}, "model.safetensors", "up_proj.scales"},
        {"biases-shape", {"model.layers.1.mlp.down_proj.biases", MUT_SHAPE, 0, 64, 3, NULL}, "model.safetensors", "down_proj.biases"},
        {"packed-width", {"model.layers.0.self_attn.q_proj.weight", MUT_SHAPE, 0, 64, 16, NULL}, "model.safetensors", "q_proj.weight"},
        {"weight-rows", {"model.layers.0.self_attn.k_proj.weight", MUT_SHAPE, 0, 31, 8, NULL}, "model.safetensors", "k_proj.weight"},
        {"weight-dtype", {"lm_head.weight", MUT_DTYPE, EMBER_I32, 0, 0, NULL}, "model.safetensors", "lm_head.weight"},
        {"scales-dtype", {"model.embed_tokens.scales", MUT_DTYPE, EMBER_I32, 0, 0, NULL}, "model.safetensors", "embed_tokens.scales"},
        {"no-biases", {"model.layers.1.self_attn.o_proj.biases", MUT_DROP, 0, 0, 0, NULL}, "model.safetensors", "o_proj.biases"},
        {"no-scales", {"model.layers.1.self_attn.v_proj.scales", MUT_DROP, 0, 0, 0, NULL}, "model.safetensors", "v_proj.scales"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(dir, sizeof dir, "%s/bad-%s", EMBER_TEST_TMP, cases[i].tag);
        make_variant(q4, f.dir, dir, &cases[i].mut, 1, NULL);
        expect_fail(dir, cases[i].n1, cases[i].n2);
    }
    /* config.json cases over the good tensors */
    struct {
        const char *tag, *from, *to, *n1, *n2;
    } ccases[] = {
        {"cfg-bits7", "\"bits\": 4", "\"bits\": 7", "config.json", "bits"},
        {"cfg-group48", "\"group_size\": 64", "\"group_size\": 48", "config.json", "group_size"},
        /* the config says 8 bits but the file holds 4-bit codes */
        {"cfg-bits8", "\"bits\": 4", "\"bits\": 8", "model.safetensors", "packed width"},
        /* group 32 while the scales have groups of 64 */
        {"cfg-group32", "\"group_size\": 64", "\"group_size\": 32", "model.safetensors", ".scales"},
        {"cfg-mode", "\"mode\": \"affine\"", "\"mode\": \"nvfp4\"", "config.json", "nvfp4"},
        {"cfg-none", "\"quantization\"", "\"no_quantization\"", "model.safetensors", ".scales"},
        {"cfg-false", "\"mode\": \"affine\"\n    },\n    \"quantization_config\"",
         "\"mode\": \"affine\",\n        \"lm_head\": false\n    },\n    \"quantization_config\"", "model.safetensors",
         "lm_head.scales"},
        {"cfg-override", "\"mode\": \"affine\"\n    },\n    \"quantization_config\"",
         "\"mode\": \"affine\",\n        \"model.layers.0.self_attn.q_proj\": {\"bits\": 8, \"group_size\": 64}\n    },\n"
         "    \"quantization_config\"",
         "model.safetensors", qp},
    };
    for (size_t i = 0; i < sizeof ccases / sizeof ccases[0]; i++) {
        char *base = strcmp(ccases[i].tag, "cfg-none") == 0 ? replace(cfg, "\"quantization_config\"", "\"x_config\"")
                                                           : replace(cfg, "\"quantization\"", "\"quantization\"");
        char *c = replace(base, ccases[i].from, ccases[i].to);
        free(base);
        CHECKF(strcmp(c, cfg) != 0, "%s: the config edit did not apply", ccases[i].tag);
        snprintf(dir, sizeof dir, "%s/bad-%s", EMBER_TEST_TMP, ccases[i].tag);
        make_variant(q4, f.dir, dir, NULL, 0, c);
        expect_fail(dir, ccases[i].n1, ccases[i].n2);
        free(c);
    }
    /* a quantized module whose weight is a float matrix (no scales) while the config names it */
    {
        char *c = replace(cfg, "\"mode\": \"affine\"\n    },\n    \"quantization_config\"",
                          "\"mode\": \"affine\",\n        \"model.layers.0.mlp.gate_proj\": true\n    },\n    \"quantization_config\"");
        mutation mf[] = {{"model.layers.0.mlp.gate_proj.weight", MUT_REPLACE, 0, 0, 0, "model.layers.0.mlp.gate_proj.weight"},
                         {"model.layers.0.mlp.gate_proj.scales", MUT_DROP, 0, 0, 0, NULL},
                         {"model.layers.0.mlp.gate_proj.biases", MUT_DROP, 0, 0, 0, NULL}};
        snprintf(dir, sizeof dir, "%s/bad-true-float", EMBER_TEST_TMP);
        make_variant(q4, f.dir, dir, mf, 3, c);
        expect_fail(dir, "model.safetensors", "gate_proj.scales");
        free(c);
    }
    /* random code and scale bytes: any bytes are a valid model (NaN logits are fine), never a crash */
    {
        snprintf(path, sizeof path, "%s/model.safetensors", q4);
        ember_st_file *st = NULL;
        ember_error err = {0};
        CHECK(ember_st_open(path, &st, &err) == EMBER_OK);
        snprintf(dir, sizeof dir, "%s/bad-random", EMBER_TEST_TMP);
        make_variant(q4, f.dir, dir, NULL, 0, NULL);
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        FILE *fp = fopen(path, "r+b");
        CHECK(fp != NULL);
        if (fp && st) {
            uint64_t hl;
            CHECK(fread(&hl, 8, 1, fp) == 1);
            for (int k = 0; k < 2000; k++) {
                fseek(fp, (long)(8 + hl + rnd() % st->data_size), SEEK_SET);
                fputc((int)(rnd() & 0xff), fp);
            }
            fclose(fp);
            ember_model *m = fx_load_model(dir, EMBER_ISA_AUTO, 2, 1);
            CHECK(m != NULL);
            float *lg = malloc((size_t)f.p[0].n * f.vocab * 4);
            if (m) CHECK(ember_logits(m, f.p[0].ids, f.p[0].n, lg, &err) == EMBER_OK);
            free(lg);
            ember_model_free(m);
        }
        ember_st_free(st);
    }
    free(cfg);
    fixture_close(&f);
}

/* the CLI verb writes the same directory as the library call */
static void test_cli(void) {
    fixture f;
    fixture_open(&f, "mistral");
    char cmd[2048], dir[700];
    snprintf(dir, sizeof dir, "%s/cli-mistral-mlx8", EMBER_TEST_TMP);
    snprintf(cmd, sizeof cmd, "%s quantize --model %s --type mlx8 --group-size 32 --out %s", EMBER_BIN, f.dir, dir);
    CHECK(system(cmd) == 0);
    check_dir_exact(dir, f.dir, 8, 32, "cli mlx8_g32");
    snprintf(cmd, sizeof cmd, "%s quantize --model %s --type mlx7 --out %s/x 2>/dev/null", EMBER_BIN, f.dir, EMBER_TEST_TMP);
    CHECK(system(cmd) != 0);
    fixture_close(&f);
}

int main(void) {
    shared_dir();
    test_config();
    test_exact();
    test_kernels();
    test_kl();
    test_layouts();
    test_batch_invariance();
    test_malformed();
    test_cli();
    return test_done();
}
