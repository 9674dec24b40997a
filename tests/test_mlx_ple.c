/*
 * test_mlx_ple.c - MLX affine quantization of Gemma 4 with per-layer inputs
 * (gemma4_text with hidden_size_per_layer_input, the E2B / E4B style) in
 * mlx-lm's layout. mlx-lm's gemma4_text has no rule for the per-layer input
 * modules, so its default predicate applies: every Linear and Embedding whose
 * rows are whole groups is quantized (embed_tokens_per_layer as a
 * QuantizedEmbedding, per_layer_model_projection, each layer's
 * per_layer_input_gate and per_layer_projection), the norms stay float.
 *   1. layout: for mlx8 / mlx4 at group 32, mlx4 at group 64 and mlx-lm's
 *      mixed 4/6 recipe with BF16 scales, every quantized module is U32
 *      [rows, K * bits / 32] with scales and biases [rows, K / G] of its
 *      source [rows, K] and every element dequantizes (this file's own
 *      reading of the format) within the quantizer's error; the PLE modules
 *      are quantized exactly when their rows are whole groups (the fixture's
 *      per_layer_projection, 16 wide, stays float at every group size), the
 *      norms and scalars are byte copies, no tensor is left out or invented;
 *      the mixed recipe lists the PLE modules and config.json's entries for
 *      them are read (ember_config_quant_module);
 *   2. logits of the three fixture prompts against transformers' (ember's
 *      unquantized logits match them within 1e-5 of the largest): mean KL
 *      below stated bounds on every ISA this CPU has (scalar, AVX2,
 *      AVX-512, AMX); mlx8's greedy ids equal the reference's up to the
 *      first step whose reference top-1 / top-2 margin is below 0.25, and
 *      teacher-forced along the reference's continuation its argmax is the
 *      reference's at every step with a margin of at least 0.25;
 *   3. a PLE width of 32 (the fixture with its per-layer input tensors
 *      replaced by seeded random ones of that width, written here), so that
 *      per_layer_projection [64, 32] is quantized too: layout, and KL against
 *      that model's own unquantized logits on every ISA;
 *   4. batch invariance of the mlx4 files on every ISA: three prompts with 8
 *      decode steps together (2 threads), each alone (1 thread) and in
 *      prefill chunks of 5: logits bit for bit;
 *   5. refusals with one line naming the tensor: a quantized PLE tensor of
 *      the wrong shape (embed_tokens_per_layer's codes, the model
 *      projection's scales), one renamed away (a layer's input gate, the
 *      projection's biases, the projection norm), and config.json entries
 *      for the PLE modules that contradict the file (marked float, or at
 *      8 bits over 4-bit codes);
 *   6. the mlx4 file laid out as mlx-lm writes the Gemma 4 multimodal
 *      checkpoint (model_type gemma4 with text_config, tensors and
 *      quantization entries under language_model.model.*) gives the plain
 *      directory's logits bit for bit, and its wrapped entries are read;
 *   7. the CLI writes the library call's bytes.
 * Exits 77 when ../shared is absent.
 */
#define TEST_RNG_SEED 0x6d6c78706c65ull
#include <jansson.h>
#include <math.h>

#include "core/cpu.h"
#include "ember.h"
#include "fixture.h"
#include "mlx_check.h"
#include "formats/config.h"
#include "formats/mlx_quant.h"
#include "formats/quant.h"
#include "model/quantize_mlx.h"


/* Mean KL bounds against transformers' logits, about 3x the measurements
   (docs/model-families.md); the P = 32 model against its own float logits. */
#define KL_MLX8 1.2e-2     /* measured 3.7e-3 */
#define KL_MLX4 0.5        /* 0.185 (group 64 0.196, mixed 4/6 0.188) */
#define KL_P32_MLX8 1e-2   /* 3.2e-3 */
#define KL_P32_MLX4 0.5    /* 0.179 */

static int quantize(const char *in, const char *out, int bits, int G, int high, ember_dtype sdt) {
    ember_mlx_qopts o = {bits, G, high, sdt, false};
    ember_error err = {0};
    int rc = ember_quantize_to_mlx(in, out, &o, &err);
    if (rc) fprintf(stderr, "quantize %s -> %s: %s\n", in, out, err.msg);
    return rc;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static float scalar_at(const ember_st_tensor *t, int64_t i) {
    float v = 0;
    const size_t es = ember_dtype_get(t->dtype)->block_bytes;
    ember_dequantize(t->dtype, t->data + (size_t)i * es, &v, 1, NULL);
    return v;
}

/* ---- 1 and 3: layout ---------------------------------------------------------------- */

/* Module m ("model.layers.1.per_layer_input_gate") of the output f against
   its source matrix src [rows, K]: quantized with the config's bits and
   group (sdt scales and biases), every element within the quantizer's error. */
static void check_quantized(const char *dir, const ember_model_config *cfg, const ember_st_file *f,
                            const ember_st_tensor *src, const char *module, ember_dtype sdt) {
    char name[320];
    int bits = 0, G = 0;
    ember_config_quant_module(cfg, module, &bits, &G);
    const int64_t rows = src->shape[0], K = src->shape[1];
    snprintf(name, sizeof name, "%s.weight", module);
    const ember_st_tensor *w = ember_st_find(f, name);
    snprintf(name, sizeof name, "%s.scales", module);
    const ember_st_tensor *s = ember_st_find(f, name);
    snprintf(name, sizeof name, "%s.biases", module);
    const ember_st_tensor *b = ember_st_find(f, name);
    bool ok = CHECKV(w && s && b && w->dtype == EMBER_U32 && w->ndim == 2 && w->shape[0] == rows &&
                         w->shape[1] == K * bits / 32 && s->dtype == sdt && b->dtype == sdt && s->ndim == 2 &&
                         b->ndim == 2 && s->shape[0] == rows && b->shape[0] == rows && s->shape[1] == K / G &&
                         b->shape[1] == K / G,
                     "%s: %s is not mlx-lm's [%lld, %lld] layout at %d bits, group %d", dir, module, (long long)rows,
                     (long long)K, bits, G);
    int64_t bad = -1;
    float got = 0, want = 0;
    for (int64_t r = 0; ok && bad < 0 && r < rows; r++) {
        const unsigned char *code = w->data + (size_t)r * (size_t)(K * bits / 8);
        const float *x = (const float *)src->data + r * K;
        for (int64_t c = 0; c < K; c++) {
            const float sc = scalar_at(s, r * (K / G) + c / G), bi = scalar_at(b, r * (K / G) + c / G);
            const float v = sc * (float)ember_mlx_get_code(code, c, bits) + bi;
            /* half a step, or at the far end one more step: mlx-lm's
               quantizer makes one end exact and clamps the other; BF16
               scales and biases add their own rounding */
            const float tol = fabsf(sc) * 1.5f + (sdt == EMBER_BF16 ? fabsf(bi) * 8e-3f : 0) + 1e-6f;
            if (!(fabsf(v - x[c]) <= tol)) {
                bad = r * K + c;
                got = v;
                want = x[c];
                break;
            }
        }
    }
    if (ok)
        CHECKF(bad < 0, "%s: %s element %lld dequantizes to %g, source %g", dir, module, (long long)bad, got, want);
}

/* The layout of the quantized directory dir made from src_dir (F32): every
   source tensor is either quantized (a 2-D ".weight" whose rows are whole
   groups) or copied byte for byte, nothing else is written; the PLE modules
   as expected. Returns the number of PLE modules found quantized. */
static int check_layout(const char *dir, const char *src_dir, ember_dtype sdt) {
    char path[800];
    ember_model_config cfg, scfg;
    ember_error err = {0};
    ember_st_file *f = NULL, *src = NULL;
    if (!CHECKV(ember_config_load(dir, &cfg, &err) == EMBER_OK, "%s: %s", dir, err.msg)) return 0;
    if (!CHECKV(ember_config_load(src_dir, &scfg, &err) == EMBER_OK, "%s: %s", src_dir, err.msg)) return 0;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (!CHECKV(ember_st_open(path, &f, &err) == EMBER_OK, "%s", err.msg)) return 0;
    snprintf(path, sizeof path, "%s/model.safetensors", src_dir);
    if (!CHECKV(ember_st_open(path, &src, &err) == EMBER_OK, "%s", err.msg)) {
        ember_st_free(f);
        return 0;
    }
    const int G = cfg.quant.group_size;
    int accounted = 0, ple_q = 0, ple_seen = 0;
    for (int i = 0; i < src->n_tensors; i++) {
        const ember_st_tensor *t = &src->tensors[i];
        const bool ple = strstr(t->name, "per_layer") != NULL;
        ple_seen += ple;
        char module[300];
        if (t->ndim == 2 && ends_with(t->name, ".weight")) {
            snprintf(module, sizeof module, "%.*s", (int)(strlen(t->name) - 7), t->name);
            int bits = 0, g = 0;
            ember_config_quant_module(&cfg, module, &bits, &g);
            if (t->shape[1] % G == 0 && t->shape[1] % g == 0) {
                check_quantized(dir, &cfg, f, t, module, sdt);
                ple_q += ple;
                accounted += 3;
                continue;
            }
            char sname[320];
            snprintf(sname, sizeof sname, "%s.scales", module);
            CHECKF(!ember_st_find(f, sname), "%s: %s has rows of %lld, not whole groups of %d, yet is quantized", dir,
                   module, (long long)t->shape[1], G);
        }
        /* copied unchanged */
        const ember_st_tensor *o = ember_st_find(f, t->name);
        CHECKF(o && o->dtype == t->dtype && o->ndim == t->ndim && o->nbytes == t->nbytes &&
                   !memcmp(o->data, t->data, t->nbytes),
               "%s: '%s' should be a copy of the source tensor", dir, t->name);
        accounted++;
    }
    CHECKF(accounted == f->n_tensors, "%s: %d tensors, %d accounted for by the source", dir, f->n_tensors, accounted);
    CHECKF(ple_seen == 3 + 3 * scfg.n_layers, "%s: the source has %d per-layer input tensors", src_dir, ple_seen);
    /* the PLE modules mlx-lm quantizes: the table, the model projection, every layer's gate,
       and every layer's projection when the PLE width is whole groups */
    const int want = 2 + scfg.n_layers * (scfg.ple_dim % G == 0 ? 2 : 1);
    CHECKF(ple_q == want, "%s: %d per-layer input modules quantized, expected %d (P %d, group %d)", dir, ple_q, want,
           scfg.ple_dim, G);
    ember_st_free(f);
    ember_st_free(src);
    return ple_q;
}

/* The mixed recipe lists the PLE modules at the low width, and the loader's
   config reads those entries. */
static void check_mixed_entries(const char *dir, int low) {
    ember_model_config cfg;
    ember_error err = {0};
    if (!CHECKV(ember_config_load(dir, &cfg, &err) == EMBER_OK, "%s: %s", dir, err.msg)) return;
    static const char *const mods[] = {"model.embed_tokens_per_layer", "model.per_layer_model_projection",
                                       "model.layers.0.per_layer_input_gate", "model.layers.3.per_layer_input_gate"};
    for (size_t i = 0; i < sizeof mods / sizeof mods[0]; i++) {
        int b = 0, g = 0;
        CHECKF(ember_config_quant_module(&cfg, mods[i], &b, &g) == EMBER_QMOD_QUANT && b == low,
               "%s: config.json should list %s at %d bits (read as %d)", dir, mods[i], low, b);
    }
}

/* ---- 2: logits against transformers, greedy ids ---------------------------------------- */

/* Each prompt's 24 greedy ids equal the reference's up to the first step
   that differs, where the reference's top-1 / top-2 margin is below 0.25;
   then check_greedy_forced. */
static void check_greedy(const char *what, const fixture *f, const char *dir) {
    ember_model *m = fx_load_model(dir, EMBER_ISA_AUTO, 2, 1);
    if (!CHECKV(m != NULL, "%s does not load", dir)) return;
    int32_t ids[3][24];
    if (CHECKV(fx_generate3(m, f, dir, ids, NULL), "%s: the prompts do not run", dir))
        for (int i = 0; i < 3; i++) {
            const int k = fx_agree(f, i, ids[i]);
            fprintf(stderr, "%-22s p%d: greedy ids equal for %d of 24 steps\n", what, i, k);
            if (k < 24)
                CHECKF(f->p[i].margin[k] < 0.25f, "%s p%d: greedy step %d differs where the reference margin is %g",
                       dir, i, k, f->p[i].margin[k]);
        }
    ember_model_free(m);
    check_greedy_forced(what, f, dir);
}

/* ---- 3: a PLE width of 32 ------------------------------------------------------------------ */

typedef struct p32_src {
    const ember_st_file *fx;
    const float **data; /* per output tensor */
} p32_src;

static int p32_fill(void *user, int index, size_t first, size_t n, void *dst, ember_error *err) {
    (void)err;
    memcpy(dst, ((const p32_src *)user)->data[index] + first, n * 4);
    return 0;
}

/* dst: the fixture fdir with hidden_size_per_layer_input 32, its per-layer
   input tensors replaced by seeded random ones of that width (weights
   uniform in +-0.17, norms 1 +- 0.1), everything else the fixture's. */
static bool write_p32(const char *fdir, const char *dst) {
    char path[800], cmd[1600];
    const int P = 32;
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dst, dst);
    if (!CHECKV(system(cmd) == 0, "cannot make %s", dst)) return false;
    json_error_t je;
    snprintf(path, sizeof path, "%s/config.json", fdir);
    json_t *cfg = json_load_file(path, 0, &je);
    if (!CHECKV(cfg != NULL, "%s: %s", path, je.text)) return false;
    const int L = (int)json_integer_value(json_object_get(cfg, "num_hidden_layers")),
              H = (int)json_integer_value(json_object_get(cfg, "hidden_size")),
              Vp = (int)json_integer_value(json_object_get(cfg, "vocab_size_per_layer_input"));
    json_object_set_new(cfg, "hidden_size_per_layer_input", json_integer(P));
    snprintf(path, sizeof path, "%s/config.json", dst);
    bool ok = CHECKV(json_dump_file(cfg, path, JSON_INDENT(2)) == 0, "cannot write %s", path);
    json_decref(cfg);
    snprintf(path, sizeof path, "%s/generation_config.json", fdir);
    size_t n = 0;
    char *gen = fx_slurp(path, &n);
    if (gen) fx_put(dst, "generation_config.json", gen, n);
    free(gen);
    ember_st_file *fx = NULL;
    ember_error err = {0};
    snprintf(path, sizeof path, "%s/model.safetensors", fdir);
    if (!ok || !CHECKV(ember_st_open(path, &fx, &err) == EMBER_OK, "%s", err.msg)) return false;
    const int nt = fx->n_tensors;
    ember_st_out *outs = calloc((size_t)nt, sizeof *outs);
    const float **data = calloc((size_t)nt, sizeof *data);
    float **own = calloc((size_t)nt, sizeof *own);
    for (int i = 0; i < nt; i++) {
        const ember_st_tensor *t = &fx->tensors[i];
        outs[i] = (ember_st_out){t->name, t->dtype, t->ndim, {0}};
        memcpy(outs[i].shape, t->shape, sizeof outs[i].shape);
        data[i] = (const float *)t->data;
        int64_t r = 0, c = 0; /* a new [r, c] (c 0: a [r] norm) */
        if (strcmp(t->name, "model.embed_tokens_per_layer.weight") == 0) r = Vp, c = (int64_t)L * P;
        else if (strcmp(t->name, "model.per_layer_model_projection.weight") == 0) r = (int64_t)L * P, c = H;
        else if (strcmp(t->name, "model.per_layer_projection_norm.weight") == 0) r = P;
        else if (ends_with(t->name, ".per_layer_input_gate.weight")) r = P, c = H;
        else if (ends_with(t->name, ".per_layer_projection.weight")) r = H, c = P;
        if (!r) continue;
        CHECKF(t->dtype == EMBER_F32, "%s: %s is not F32", fdir, t->name);
        outs[i].ndim = c ? 2 : 1;
        outs[i].shape[0] = r;
        outs[i].shape[1] = c;
        const int64_t cnt = r * (c ? c : 1);
        own[i] = malloc((size_t)cnt * 4);
        for (int64_t k = 0; k < cnt; k++) own[i][k] = c ? 0.17f * frnd() : 1.0f + 0.1f * frnd();
        data[i] = own[i];
    }
    p32_src s = {fx, data};
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    ok = CHECKV(ember_st_write(path, outs, nt, p32_fill, &s, &err) == EMBER_OK, "%s", err.msg);
    for (int i = 0; i < nt; i++) free(own[i]);
    free(own);
    free(data);
    free(outs);
    ember_st_free(fx);
    return ok;
}

/* ---- 5: refusals -------------------------------------------------------------------------- */

/* dir copied to dst with `from` (bytes of the safetensors header within 120
   bytes after the tensor's name) replaced by `to`, of the same length; with
   tname NULL, config.json gets the quantization entry key = entry (JSON). */
static bool variant(const char *dir, const char *dst, const char *tname, const char *from, const char *to,
                    const char *key, const char *entry) {
    static const char *const files[] = {"config.json", "generation_config.json", "model.safetensors"};
    char p[800], cmd[2000];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dst, dst);
    if (system(cmd) != 0) return false;
    bool ok = true;
    for (size_t i = 0; i < sizeof files / sizeof files[0] && ok; i++) {
        size_t n = 0;
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        char *b = fx_slurp(p, &n);
        if (!b) continue;
        if (tname && i == 2) {
            char k[300];
            snprintf(k, sizeof k, "\"%s\":", tname);
            char *at = strstr(b + 8, k);
            char *hit = at ? strstr(at, from) : NULL;
            ok = CHECKV(hit && hit - at < 120 && strlen(from) == strlen(to), "no '%s' after '%s'", from, tname);
            if (ok) memcpy(hit, to, strlen(to));
        }
        if (!tname && i == 0) {
            json_error_t je;
            json_t *root = json_loadb(b, n, 0, &je), *e = json_loads(entry, JSON_DECODE_ANY, &je);
            ok = CHECKV(root && e, "config variant %s", key);
            if (ok) {
                json_object_set(json_object_get(root, "quantization"), key, e);
                json_object_set(json_object_get(root, "quantization_config"), key, e);
                char *text = json_dumps(root, 0);
                fx_put(dst, files[i], text, strlen(text));
                free(text);
            }
            json_decref(root);
            json_decref(e);
            free(b);
            continue;
        }
        fx_put(dst, files[i], b, n);
        free(b);
    }
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

/* q4: the fixture at mlx4, group 32 (L * P = 64, H = 64, P = 16). */
static void check_refusals(const char *q4) {
    char dst[700];
    snprintf(dst, sizeof dst, "%s/ple-bad", EMBER_TEST_TMP);
    const char *t = "model.embed_tokens_per_layer.weight"; /* [512, 8] -> [64, 64]: the same bytes */
    if (variant(q4, dst, t, "\"shape\":[512,8]", "\"shape\":[64,64]", NULL, NULL)) expect_refused(dst, t);
    t = "model.per_layer_model_projection.scales"; /* [64, 2] -> [32, 4] */
    if (variant(q4, dst, t, "\"shape\":[64,2]", "\"shape\":[32,4]", NULL, NULL)) expect_refused(dst, t);
    t = "model.layers.1.per_layer_input_gate.weight"; /* renamed away: its scales name it */
    if (variant(q4, dst, t, "gate.weight\"", "gate.weighx\"", NULL, NULL)) expect_refused(dst, t);
    t = "model.per_layer_model_projection.biases";
    if (variant(q4, dst, t, "tion.biases\"", "tion.biasex\"", NULL, NULL)) expect_refused(dst, t);
    t = "model.per_layer_projection_norm.weight";
    if (variant(q4, dst, t, "norm.weight\"", "norm.weighx\"", NULL, NULL)) expect_refused(dst, t);
    /* config.json's entries for the PLE modules count: marked float while quantized, or 8 bits over 4-bit codes */
    if (variant(q4, dst, NULL, NULL, NULL, "model.embed_tokens_per_layer", "false"))
        expect_refused(dst, "model.embed_tokens_per_layer.scales");
    if (variant(q4, dst, NULL, NULL, NULL, "model.layers.2.per_layer_input_gate", "{\"group_size\": 32, \"bits\": 8}"))
        expect_refused(dst, "model.layers.2.per_layer_input_gate.weight");
    if (variant(q4, dst, NULL, NULL, NULL, "model.per_layer_model_projection", "{\"group_size\": 64, \"bits\": 4}"))
        expect_refused(dst, "model.per_layer_model_projection");
}

/* ---- 6: the multimodal checkpoint's layout ------------------------------------------------- */

/* dir (an MLX gemma4_text_ple) laid out as mlx-lm writes the Gemma 4
   multimodal checkpoint (mc_check_wrapped: dir's logits bit for bit); an
   entry marking the wrapped per-layer table float is refused, so those keys
   are read. */
static void check_wrapped(const fixture *f, const char *dir) {
    char path[800], out[700];
    snprintf(out, sizeof out, "%s/ple-gemma4-wrapped", EMBER_TEST_TMP);
    json_t *root = mc_check_wrapped(f, dir, out);
    if (!root) return;
    json_object_set_new(json_object_get(root, "quantization"), "language_model.model.embed_tokens_per_layer",
                        json_false());
    snprintf(path, sizeof path, "%s/config.json", out);
    if (CHECKV(json_dump_file(root, path, 0) == 0, "cannot write %s", path))
        expect_refused(out, "embed_tokens_per_layer.scales");
    json_decref(root);
}

/* ---- 7: the CLI --------------------------------------------------------------------------- */

static void check_cli(const fixture *f, const char *lib_dir) {
    char cmd[2048], dir[700], a[800], b[800];
    snprintf(dir, sizeof dir, "%s/ple-cli-mlx4", EMBER_TEST_TMP);
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

int main(void) {
    shared_dir();
    for (int a = 0; a < N_ISAS; a++)
        if (!ember_isa_supported(k_isas[a])) fprintf(stderr, "%s not on this CPU, skipped\n", ember_isa_name(k_isas[a]));
    fixture f;
    fixture_open(&f, "gemma4_text_ple");
    const int rows = total_rows(&f), V = f.vocab;
    float *ref = malloc((size_t)rows * V * 4), *fl = malloc((size_t)rows * V * 4);
    for (int i = 0, r0 = 0; i < 3; r0 += f.p[i].n, i++)
        memcpy(ref + (size_t)r0 * V, f.p[i].logits, (size_t)f.p[i].n * V * 4);
    /* ember's float model is the reference's (so the KL below is the quantization's) */
    if (CHECKV(fx_prompt_logits(f.dir, &f, 3, fl) == 0, "%s does not run", f.dir)) {
        float d = 0;
        for (size_t i = 0; i < (size_t)rows * V; i++) d = fmaxf(d, fabsf(fl[i] - ref[i]));
        CHECKF(d <= 1e-5f * max_abs(ref, (size_t)rows * V), "float gemma4_text_ple: |dlogit| %g", d);
    }
    char d8[700], d4[700], d4g64[700], dmix[700];
    snprintf(d8, sizeof d8, "%s/ple-mlx8", EMBER_TEST_TMP);
    snprintf(d4, sizeof d4, "%s/ple-mlx4", EMBER_TEST_TMP);
    snprintf(d4g64, sizeof d4g64, "%s/ple-mlx4-g64", EMBER_TEST_TMP);
    snprintf(dmix, sizeof dmix, "%s/ple-mixed", EMBER_TEST_TMP);
    if (CHECKV(quantize(f.dir, d8, 8, 32, 0, EMBER_DTYPE_INVALID) == 0, "quantize mlx8")) {
        check_layout(d8, f.dir, EMBER_F32);
        check_kl("gemma4_ple mlx8", &f, d8, ref, KL_MLX8);
        check_greedy("gemma4_ple mlx8", &f, d8);
    }
    if (CHECKV(quantize(f.dir, d4, 4, 32, 0, EMBER_DTYPE_INVALID) == 0, "quantize mlx4")) {
        check_layout(d4, f.dir, EMBER_F32);
        check_kl("gemma4_ple mlx4", &f, d4, ref, KL_MLX4);
        check_batch("gemma4_ple mlx4", &f, d4);
        check_refusals(d4);
        check_cli(&f, d4);
        check_wrapped(&f, d4);
    }
    if (CHECKV(quantize(f.dir, d4g64, 4, 64, 0, EMBER_DTYPE_INVALID) == 0, "quantize mlx4 g64")) {
        check_layout(d4g64, f.dir, EMBER_F32);
        check_kl("gemma4_ple mlx4 g64", &f, d4g64, ref, KL_MLX4);
    }
    if (CHECKV(quantize(f.dir, dmix, 4, 32, 6, EMBER_BF16) == 0, "quantize mlx_mixed_4_6")) {
        check_layout(dmix, f.dir, EMBER_BF16);
        check_mixed_entries(dmix, 4);
        check_kl("gemma4_ple mixed_4_6", &f, dmix, ref, KL_MLX4);
    }
    /* P = 32: per_layer_projection is quantized too; against this model's own float logits */
    char p32[700], p32q8[700], p32q4[700];
    snprintf(p32, sizeof p32, "%s/ple-p32", EMBER_TEST_TMP);
    snprintf(p32q8, sizeof p32q8, "%s/ple-p32-mlx8", EMBER_TEST_TMP);
    snprintf(p32q4, sizeof p32q4, "%s/ple-p32-mlx4", EMBER_TEST_TMP);
    if (write_p32(f.dir, p32) && CHECKV(fx_prompt_logits(p32, &f, 3, fl) == 0, "%s does not run", p32)) {
        if (CHECKV(quantize(p32, p32q8, 8, 32, 0, EMBER_DTYPE_INVALID) == 0, "quantize p32 mlx8")) {
            check_layout(p32q8, p32, EMBER_F32);
            check_kl("gemma4_ple P32 mlx8", &f, p32q8, fl, KL_P32_MLX8);
        }
        if (CHECKV(quantize(p32, p32q4, 4, 32, 0, EMBER_DTYPE_INVALID) == 0, "quantize p32 mlx4")) {
            check_layout(p32q4, p32, EMBER_F32);
            check_kl("gemma4_ple P32 mlx4", &f, p32q4, fl, KL_P32_MLX4);
            check_batch("gemma4_ple P32 mlx4", &f, p32q4);
        }
    }
    free(ref);
    free(fl);
    fixture_close(&f);
    return test_done();
}
