/*
 * test_mlx_moe.c - MLX affine quantization of the mixture-of-experts
 * families (qwen3_moe, glm4_moe, gemma4_text_moe) in mlx-lm's layout:
 *   1. layout: `ember quantize` (the library call) writes each MoE layer's
 *      experts stacked as mlx-lm's sanitize stacks them
 *      (mlp.switch_mlp.{gate,up,down}_proj; gemma4: experts.switch_glu.*,
 *      gate_up_proj split) as U32 [E, rows, K * bits / 32] with scales and
 *      biases [E, rows, K / G]; no per-expert tensor is left; the routers
 *      as mlx-lm's predicates have them (qwen3_moe mlp.gate and gemma4
 *      router.proj 8 bits group 64, listed in config.json; glm4_moe's
 *      MoEGate float, e_score_correction_bias copied); stacks whose rows
 *      are not whole groups stay float [E, rows, K]; every expert's rows
 *      dequantize (this file's own reading of the MLX format) to its source
 *      matrix within half a quantization step;
 *   2. logits of the three fixture prompts against transformers' (the
 *      unquantized model's, which ember matches within 1e-6): mean KL and
 *      largest difference relative to the largest logit below stated bounds
 *      (mlx8 tight, mlx4 looser); the same bits on every ISA this CPU has
 *      (scalar, AVX2, AVX-512); mlx8's greedy ids equal the reference's up
 *      to the first step whose reference top-1 / top-2 margin is within the
 *      measured logit error (the rest are not compared);
 *   3. batch invariance on every ISA: three prompts with 8 decode steps
 *      together (2 threads), each alone (1 thread: the one-token decode
 *      path), and in prefill chunks of 5: logits bit for bit;
 *   4. refusals: a stacked expert tensor (weight, scales, a float stack) of
 *      the wrong shape, and a missing one, fail with one line naming it;
 *   5. mlx-lm's mixed 4/6 recipe with BF16 scales: the per-module entries
 *      (6-bit stacked down projections on the recipe's layers, the router at
 *      the low width) and the mlx4 bound;
 *   6. the CLI writes the same bytes as the library call;
 *   7. gemma4_text without experts quantizes and runs within bounds (with
 *      per-layer inputs: test_mlx_ple.c);
 *   8. the mlx4 gemma4_text_moe laid out as mlx-lm writes the Gemma 4
 *      multimodal checkpoint (model_type gemma4 with text_config, tensors and
 *      quantization entries under language_model.model.*) gives the plain
 *      directory's logits bit for bit.
 * Under the sanitizers each ISA loop runs one ISA, in turn.
 * Exits 77 when ../shared is absent.
 */
#define TEST_RNG_SEED 0x6d6c786d6f65ull
#include <jansson.h>
#include <math.h>

#include "core/cpu.h"
#include "core/mapfile.h"
#include "ember.h"
#include "fixture.h"
#include "formats/config.h"
#include "formats/mlx_quant.h"
#include "model/quantize_mlx.h"

typedef struct fam {
    const char *name;
    const char *stack;  /* the stacked experts' module under model.layers.N. */
    const char *router; /* the router's module under model.layers.N. */
    bool router_q8;     /* mlx-lm quantizes it (8 bits, group 64), else float */
    double kl8, kl4;    /* mean KL bounds, mlx8 / mlx4 (group 32), every matrix quantized */
} fam;

/* Bounds: about 3x the measured mean KL (docs/model-families.md). The
   fixtures are sensitive to weight rounding upstream of the routers (a
   rounded router input flips experts); gemma4 also without experts (the
   dense gemma4_text fixture: mlx8 4.2e-3, mlx4 0.18). With only the experts
   quantized the bounds are family-independent: EXP_KL8, EXP_KL4. */
static const fam k_fams[] = {
    {"qwen3_moe", "mlp.switch_mlp", "mlp.gate", true, 1e-3, 8e-2},
    {"glm4_moe", "mlp.switch_mlp", "mlp.gate", false, 5e-3, 0.15},
    {"gemma4_text_moe", "experts.switch_glu", "router.proj", true, 3e-2, 0.45},
};
#define EXP_KL8 3e-4
#define EXP_KL4 3e-2

/* Under the sanitizers (10x slower) each check takes one ISA, in turn, so
   every ISA is still covered across the checks. */
#if defined(__SANITIZE_ADDRESS__)
#define MOE_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MOE_TEST_SANITIZED 1
#endif
#endif
#ifndef MOE_TEST_SANITIZED
#define MOE_TEST_SANITIZED 0
#endif

/* MoE checks run without the AMX tier (MLX weights take its AVX-512 VNNI
   kernels) and, sanitized, on one ISA in turn. */
static bool use_isa(int a);
#define MLX_CHECK_ISAS EMBER_ISA_SCALAR, EMBER_ISA_AVX2, EMBER_ISA_AVX512
#define MLX_CHECK_USE_ISA(a) use_isa(a)
#include "mlx_check.h"

/* Whether a check runs on ISA a (every supported one; one in turn when sanitized). */
static bool use_isa(int a) {
    static int turn;
    if (!ember_isa_supported(k_isas[a])) return false;
    if (!MOE_TEST_SANITIZED) return true;
    if (a == 0) turn++;
    int n = 0;
    for (int i = 0; i < N_ISAS; i++) n += ember_isa_supported(k_isas[i]);
    int k = 0; /* this ISA's rank among the supported */
    for (int i = 0; i < a; i++) k += ember_isa_supported(k_isas[i]);
    return n > 0 && turn % n == k;
}

static int quantize_opts(const char *in, const char *out, const ember_mlx_qopts *o) {
    ember_error err = {0};
    int rc = ember_quantize_to_mlx(in, out, o, &err);
    if (rc) fprintf(stderr, "quantize %s -> %s: %s\n", in, out, err.msg);
    return rc;
}

static int quantize(const char *in, const char *out, int bits, int G, bool experts_only) {
    ember_mlx_qopts o = {bits, G, 0, EMBER_DTYPE_INVALID, experts_only};
    ember_error err = {0};
    int rc = ember_quantize_to_mlx(in, out, &o, &err);
    if (rc) fprintf(stderr, "quantize %s -> %s: %s\n", in, out, err.msg);
    return rc;
}

/* ---- 1: layout ------------------------------------------------------------------- */

static const ember_st_tensor *tensor(const ember_st_file *f, const char *fmt, int l, const char *a, const char *b) {
    char name[256];
    snprintf(name, sizeof name, fmt, l, a, b);
    return ember_st_find(f, name);
}

static bool shape3(const ember_st_tensor *t, ember_dtype dt, int64_t a, int64_t b, int64_t c) {
    return t && t->dtype == dt && t->ndim == 3 && t->shape[0] == a && t->shape[1] == b && t->shape[2] == c;
}

/* Row r of source expert e of projection p (0 gate, 1 up, 2 down) in the
   unquantized fixture (per-expert tensors, or gemma4's fused ones), K floats. */
static const float *src_row(const ember_st_file *src, const char *fam, int l, int e, int p, int r, int64_t Im,
                            int64_t H) {
    static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
    char name[256];
    if (strcmp(fam, "gemma4_text_moe") == 0) {
        snprintf(name, sizeof name, "model.layers.%d.experts.%s", l, p < 2 ? "gate_up_proj" : "down_proj");
        const ember_st_tensor *t = ember_st_find(src, name);
        if (!t) return NULL;
        int64_t row = p < 2 ? (int64_t)e * 2 * Im + (p ? Im : 0) + r : (int64_t)e * H + r;
        return (const float *)t->data + row * (p < 2 ? H : Im);
    }
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.%s.weight", l, e, proj[p]);
    const ember_st_tensor *t = ember_st_find(src, name);
    return t ? (const float *)t->data + (int64_t)r * (p < 2 ? H : Im) : NULL;
}

static void check_layout(const fam *fm, const char *dir, const char *src_dir, int bits, int G, bool experts_only) {
    char path[800];
    ember_model_config cfg;
    ember_error err = {0};
    ember_st_file *f = NULL, *src = NULL;
    if (!CHECKV(ember_config_load(dir, &cfg, &err) == EMBER_OK, "%s: %s", dir, err.msg)) return;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (!CHECKV(ember_st_open(path, &f, &err) == EMBER_OK, "%s", err.msg)) return;
    snprintf(path, sizeof path, "%s/model.safetensors", src_dir);
    if (!CHECKV(ember_st_open(path, &src, &err) == EMBER_OK, "%s", err.msg)) {
        ember_st_free(f);
        return;
    }
    const int64_t E = cfg.n_experts, H = cfg.hidden_size, Im = cfg.moe_intermediate_size;
    static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
    int stacks = 0, checked_rows = 0;
    for (int i = 0; i < f->n_tensors; i++)
        CHECKF(!strstr(f->tensors[i].name, ".experts.0.") && !strstr(f->tensors[i].name, "gate_up_proj") &&
                   !strstr(f->tensors[i].name, ".experts.down_proj"),
               "%s: per-expert or fused tensor '%s' left", dir, f->tensors[i].name);
    for (int l = 0; l < cfg.n_layers; l++) {
        if (!cfg.layer_moe[l] && !cfg.moe_beside_mlp) continue;
        for (int p = 0; p < 3; p++) {
            const int64_t rows = p < 2 ? Im : H, K = p < 2 ? H : Im;
            const ember_st_tensor *w = tensor(f, "model.layers.%d.%s.%s.weight", l, fm->stack, proj[p]),
                                  *s = tensor(f, "model.layers.%d.%s.%s.scales", l, fm->stack, proj[p]),
                                  *b = tensor(f, "model.layers.%d.%s.%s.biases", l, fm->stack, proj[p]);
            stacks++;
            if (K % G) { /* rows are not whole groups: a float stack, as mlx-lm leaves it */
                CHECKF(shape3(w, EMBER_F32, E, rows, K) && !s && !b, "%s layer %d %s: not a float [%lld, %lld, %lld] stack",
                       dir, l, proj[p], (long long)E, (long long)rows, (long long)K);
                continue;
            }
            bool ok = CHECKV(shape3(w, EMBER_U32, E, rows, K * bits / 32) && shape3(s, EMBER_F32, E, rows, K / G) &&
                                 shape3(b, EMBER_F32, E, rows, K / G),
                             "%s layer %d %s: not mlx-lm's stacked [%lld, %lld, ...] layout", dir, l, proj[p],
                             (long long)E, (long long)rows);
            /* every element of every expert against its source, within the quantizer's error */
            int64_t bad = -1;
            float got = 0, want = 0;
            for (int e = 0; ok && bad < 0 && e < E; e++)
                for (int r = 0; bad < 0 && r < rows; r++) {
                    const float *x = src_row(src, fm->name, l, e, p, r, Im, H);
                    const int64_t R = (int64_t)e * rows + r;
                    const unsigned char *code = w->data + (size_t)R * (size_t)(K * bits / 8);
                    if (!x) {
                        bad = R * K;
                        break;
                    }
                    for (int64_t c = 0; c < K; c++) {
                        float sc = ((const float *)s->data)[R * (K / G) + c / G],
                              bi = ((const float *)b->data)[R * (K / G) + c / G];
                        float v = sc * (float)ember_mlx_get_code(code, c, bits) + bi;
                        /* half a step, or at the far end one more step: mlx-lm's
                           quantizer makes the edge exact and clamps the other end */
                        if (!(fabsf(v - x[c]) <= fabsf(sc) * 1.5f + 1e-6f)) {
                            bad = R * K + c;
                            got = v;
                            want = x[c];
                            break;
                        }
                    }
                    checked_rows++;
                }
            if (ok)
                CHECKF(bad < 0, "%s layer %d %s: element %lld (expert %lld) dequantizes to %g, source %g", dir, l, proj[p],
                       (long long)bad, (long long)(bad / (rows * K)), got, want);
        }
        /* the router */
        const ember_st_tensor *rw = tensor(f, "model.layers.%d.%s.%s", l, fm->router, "weight");
        if (!fm->router_q8 || experts_only) {
            CHECKF(rw && rw->dtype == EMBER_F32 && rw->ndim == 2 && rw->shape[0] == E && rw->shape[1] == H &&
                       !tensor(f, "model.layers.%d.%s.%s", l, fm->router, "scales"),
                   "%s layer %d: the router should stay float", dir, l);
        } else {
            int rb = 0, rg = 0;
            char module[128];
            snprintf(module, sizeof module, "model.layers.%d.%s", l, fm->router);
            CHECKF(ember_config_quant_module(&cfg, module, &rb, &rg) == EMBER_QMOD_QUANT && rb == 8 && rg == 64,
                   "%s: config.json should list %s at 8 bits, group 64 (has %d / %d)", dir, module, rb, rg);
            CHECKF(rw && rw->dtype == EMBER_U32 && rw->ndim == 2 && rw->shape[0] == E && rw->shape[1] == H * 8 / 32,
                   "%s layer %d: the router should be 8-bit codes", dir, l);
        }
        if (cfg.router_sigmoid)
            CHECKF(tensor(f, "model.layers.%d.%s.%s", l, "mlp.gate", "e_score_correction_bias") != NULL,
                   "%s layer %d: e_score_correction_bias missing", dir, l);
    }
    CHECKF(stacks > 0 && checked_rows > 0, "%s: no expert stack checked", dir);
    ember_st_free(f);
    ember_st_free(src);
}

/* ---- 2: logits, ISAs, greedy ids ----------------------------------------------------- */

/* Logits on every ISA within the KL bound; mlx8 (greedy): each prompt's 24
   greedy ids equal the reference's up to the first step that differs, and
   there the reference's top-1 / top-2 margin is below tau (a near tie the
   quantization error can flip). Prints the measurements. */
static void check_logits(const char *name, const fixture *f, const char *dir, const char *what, double bound,
                         bool greedy) {
    const int rows = total_rows(f), V = f->vocab;
    float *ref = malloc((size_t)rows * V * 4), *q = malloc((size_t)rows * V * 4);
    int r0 = 0;
    for (int i = 0; i < 3; i++) {
        memcpy(ref + (size_t)r0 * V, f->p[i].logits, (size_t)f->p[i].n * V * 4);
        r0 += f->p[i].n;
    }
    const ember_isa *isas = k_isas;
    for (int a = 0; a < N_ISAS; a++) {
        if (!use_isa(a)) continue;
        if (!isa_logits(dir, f, isas[a], q)) continue;
        const double kl = mean_kl(ref, q, rows, V);
        double mad = 0;
        for (size_t i = 0; i < (size_t)rows * V; i++) mad += fabs((double)q[i] - ref[i]);
        mad /= (double)rows * V;
        fprintf(stderr, "%-16s %-16s %-7s mean KL %.3g (bound %g), mean |dlogit| %.3g\n", name, what,
                ember_isa_name(isas[a]), kl, bound, mad);
        CHECKF(kl < bound, "%s (%s): mean KL %g >= %g", dir, ember_isa_name(isas[a]), kl, bound);
    }
    ember_model *m = greedy ? fx_load_model(dir, EMBER_ISA_AUTO, 2, 1) : NULL;
    const float tau = 0.25f;
    int32_t ids[3][24];
    if (m && CHECKV(fx_generate3(m, f, dir, ids, NULL), "%s: the prompts do not run", dir))
        for (int i = 0; i < 3; i++) {
            const int k = fx_agree(f, i, ids[i]);
            fprintf(stderr, "%-16s %-16s p%d: greedy ids equal for %d of 24 steps%s\n", name, what, i, k,
                    k < 24 ? "" : " (all)");
            if (k < 24)
                CHECKF(f->p[i].margin[k] < tau, "%s p%d: greedy step %d differs where the reference margin is %g (>= %g)",
                       dir, i, k, f->p[i].margin[k], tau);
        }
    ember_model_free(m);
    free(ref);
    free(q);
}

/* ---- 3: batch invariance: check_batch (mlx_check.h) ------------------------------------ */

/* ---- 4: refusals ------------------------------------------------------------------------ */

/* dir's files copied to dst with `from` (bytes of the safetensors header
   after the tensor's name) replaced by `to`, of the same length. */
static bool variant(const char *dir, const char *dst, const char *tname, const char *from, const char *to) {
    static const char *const files[] = {"config.json", "generation_config.json", "tokenizer.json",
                                        "tokenizer_config.json"};
    char p[800], cmd[2000];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dst, dst);
    if (system(cmd) != 0) return false;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        size_t n;
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        char *b = fx_slurp(p, &n);
        if (b) fx_put(dst, files[i], b, n);
        free(b);
    }
    size_t n = 0;
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    char *b = fx_slurp(p, &n);
    char key[300];
    snprintf(key, sizeof key, "\"%s\":", tname);
    char *at = b ? strstr(b + 8, key) : NULL;
    char *hit = at ? strstr(at, from) : NULL;
    bool ok = CHECKV(hit && hit - at < 120 && strlen(from) == strlen(to), "no '%s' after '%s'", from, tname);
    if (ok) {
        memcpy(hit, to, strlen(to));
        fx_put(dst, "model.safetensors", b, n);
    }
    free(b);
    return ok;
}

static void expect_refused(const char *dir, const char *needle) {
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.n_threads = 1;
    ember_model *m = NULL;
    ember_error err = {0};
    int rc = ember_model_load(dir, &mp, &m, &err);
    CHECKF(rc != EMBER_OK, "%s loaded", dir);
    CHECKF(err.msg[0] && !strchr(err.msg, '\n') && strstr(err.msg, needle), "%s: message '%s' should name '%s'", dir,
           err.msg, needle);
    fprintf(stderr, "refused: %s\n", err.msg);
    ember_model_free(m);
}

static void check_refusals(const char *q4, const char *q4g64) {
    char dst[700];
    snprintf(dst, sizeof dst, "%s/moe-bad", EMBER_TEST_TMP);
    /* E = 4, Im = 32, H = 64: [4,32,8] -> [2,64,8] keeps the byte count */
    const char *w = "model.layers.1.mlp.switch_mlp.up_proj.weight";
    if (variant(q4, dst, w, "\"shape\":[4,32,8]", "\"shape\":[2,64,8]")) expect_refused(dst, w);
    const char *s = "model.layers.0.mlp.switch_mlp.gate_proj.scales";
    if (variant(q4, dst, s, "\"shape\":[4,32,2]", "\"shape\":[4,64,1]")) expect_refused(dst, s);
    const char *fl = "model.layers.1.mlp.switch_mlp.down_proj.weight"; /* a float stack (group 64) */
    if (variant(q4g64, dst, fl, "\"shape\":[4,64,32]", "\"shape\":[2,64,64]")) expect_refused(dst, fl);
    /* a stack renamed away: its scales name the missing weight */
    if (variant(q4, dst, w, "up_proj.weight\"", "up_proj.weighx\"")) expect_refused(dst, w);
}

/* ---- 5: the CLI ----------------------------------------------------------------------------- */

static void check_cli(const fixture *f, const char *lib_dir) {
    char cmd[2048], dir[700], a[800], b[800];
    snprintf(dir, sizeof dir, "%s/moe-cli-mlx4", EMBER_TEST_TMP);
    snprintf(cmd, sizeof cmd, "%s quantize --model %s --type mlx4 --group-size 32 --out %s", EMBER_BIN, f->dir, dir);
    CHECK(system(cmd) == 0);
    snprintf(a, sizeof a, "%s/model.safetensors", dir);
    snprintf(b, sizeof b, "%s/model.safetensors", lib_dir);
    size_t na = 0, nb = 0;
    char *x = fx_slurp(a, &na), *y = fx_slurp(b, &nb);
    CHECKF(x && y && na == nb && !memcmp(x, y, na), "the CLI's %s differs from the library call's", a);
    free(x);
    free(y);
}

/* ---- 8: an mlx-lm multimodal checkpoint's text model ----------------------------------- */

/* dir (an MLX gemma4_text_moe) as mlx-lm writes the Gemma 4 multimodal
   checkpoint (mc_check_wrapped): loads and gives dir's logits bit for bit. */
static void check_wrapped(const fixture *f, const char *dir) {
    char out[700];
    snprintf(out, sizeof out, "%s/moe-gemma4-wrapped", EMBER_TEST_TMP);
    json_decref(mc_check_wrapped(f, dir, out));
}

/* gemma4_text without experts (its quantization came with the MoE variant's):
   mlx8 / mlx4 within bounds (measured 4.2e-3 / 0.18). */
static void check_gemma4_dense(void) {
    fixture f;
    fixture_open(&f, "gemma4_text");
    char dir[700];
    snprintf(dir, sizeof dir, "%s/moe-gemma4_text-mlx8", EMBER_TEST_TMP);
    if (CHECKV(quantize(f.dir, dir, 8, 32, false) == 0, "quantize gemma4_text mlx8"))
        check_logits("gemma4_text", &f, dir, "mlx8", 1.5e-2, false);
    snprintf(dir, sizeof dir, "%s/moe-gemma4_text-mlx4", EMBER_TEST_TMP);
    if (CHECKV(quantize(f.dir, dir, 4, 32, false) == 0, "quantize gemma4_text mlx4"))
        check_logits("gemma4_text", &f, dir, "mlx4", 0.5, false);
    fixture_close(&f);
}

int main(void) {
    shared_dir();
    for (int a = 0; a < N_ISAS; a++)
        if (!ember_isa_supported(k_isas[a])) fprintf(stderr, "%s not on this CPU, skipped\n", ember_isa_name(k_isas[a]));
    check_gemma4_dense();
    for (size_t k = 0; k < sizeof k_fams / sizeof k_fams[0]; k++) {
        const fam *fm = &k_fams[k];
        fixture f;
        fixture_open(&f, fm->name);
        char d8[700], d4[700], d4g64[700], e8[700], e4[700], dmix[700];
        snprintf(dmix, sizeof dmix, "%s/moe-%s-mixed", EMBER_TEST_TMP, fm->name);
        snprintf(e8, sizeof e8, "%s/moe-%s-mlx8-experts", EMBER_TEST_TMP, fm->name);
        snprintf(e4, sizeof e4, "%s/moe-%s-mlx4-experts", EMBER_TEST_TMP, fm->name);
        snprintf(d8, sizeof d8, "%s/moe-%s-mlx8", EMBER_TEST_TMP, fm->name);
        snprintf(d4, sizeof d4, "%s/moe-%s-mlx4", EMBER_TEST_TMP, fm->name);
        snprintf(d4g64, sizeof d4g64, "%s/moe-%s-mlx4-g64", EMBER_TEST_TMP, fm->name);
        if (CHECKV(quantize(f.dir, d8, 8, 32, false) == 0, "quantize mlx8")) {
            check_layout(fm, d8, f.dir, 8, 32, false);
            check_logits(fm->name, &f, d8, "mlx8", fm->kl8, true);
        }
        if (CHECKV(quantize(f.dir, d4, 4, 32, false) == 0, "quantize mlx4")) {
            check_layout(fm, d4, f.dir, 4, 32, false);
            check_logits(fm->name, &f, d4, "mlx4", fm->kl4, false);
            char what[64];
            snprintf(what, sizeof what, "%s mlx4", fm->name);
            check_batch(what, &f, d4);
        }
        /* only the experts quantized: their error alone */
        if (CHECKV(quantize(f.dir, e8, 8, 32, true) == 0, "quantize mlx8 experts")) {
            check_layout(fm, e8, f.dir, 8, 32, true);
            check_logits(fm->name, &f, e8, "mlx8 experts", EXP_KL8, true);
        }
        if (CHECKV(quantize(f.dir, e4, 4, 32, true) == 0, "quantize mlx4 experts"))
            check_logits(fm->name, &f, e4, "mlx4 experts", EXP_KL4, false);
        /* group 64: the down projections' rows (32) stay a float stack */
        if (CHECKV(quantize(f.dir, d4g64, 4, 64, false) == 0, "quantize mlx4 g64")) {
            check_layout(fm, d4g64, f.dir, 4, 64, false);
            check_logits(fm->name, &f, d4g64, "mlx4 g64", fm->kl4, false);
        }
        /* mlx-lm's mixed 4/6 recipe with BF16 scales (as mlx-community files have them): the
           last layer's stacked down projections get 6 bits, the router the low width */
        ember_mlx_qopts mixed = {4, 32, 6, EMBER_BF16, false};
        if (CHECKV(quantize_opts(f.dir, dmix, &mixed) == 0, "quantize mlx_mixed_4_6")) {
            ember_model_config cfg;
            ember_error err = {0};
            int b = 0, g = 0, rb = 0;
            char module[160];
            if (CHECKV(ember_config_load(dmix, &cfg, &err) == EMBER_OK, "%s", err.msg)) {
                snprintf(module, sizeof module, "model.layers.%d.%s.down_proj", cfg.n_layers - 1, fm->stack);
                CHECKF(ember_config_quant_module(&cfg, module, &b, &g) == EMBER_QMOD_QUANT && b == 6 && g == 32,
                       "%s: %s should be listed at 6 bits (%d / %d)", dmix, module, b, g);
                snprintf(module, sizeof module, "model.layers.0.%s", fm->router);
                ember_qmod_kind rk = ember_config_quant_module(&cfg, module, &rb, &g);
                CHECKF(fm->router_q8 ? rk == EMBER_QMOD_QUANT && rb == 4 : rk == EMBER_QMOD_DEFAULT,
                       "%s: the router %s should be %s (%d bits)", dmix, module, fm->router_q8 ? "4-bit" : "float", rb);
            }
            check_logits(fm->name, &f, dmix, "mlx_mixed_4_6", fm->kl4, false);
        }
        if (strcmp(fm->name, "gemma4_text_moe") == 0) check_wrapped(&f, d4);
        if (k == 0) {
            check_refusals(d4, d4g64);
            check_cli(&f, d4);
        }
        fixture_close(&f);
    }
    return test_done();
}
