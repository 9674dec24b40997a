/*
 * test_gemma4.c - the Gemma 4 family (src/model/gemma4.c) against
 * HuggingFace transformers on the fixtures gemma4_text (K = V global
 * layers of another head size, proportional RoPE, layer_scalar),
 * gemma4_text_ple (per-layer inputs, KV sharing, double-wide MLPs) and
 * gemma4_text_moe (the MoE block beside the dense MLP):
 *   - parity: the logits of every prompt position within 1e-4 x max|logit|
 *     (the fixtures' mark), p0's decode-step logits, and the 24 greedy ids
 *     exactly, on every ISA this CPU has, with the f32 KV cache; with f16
 *     (1e-2: scores are not scaled by head_dim^-0.5) on the best ISA;
 *   - batch invariance, bit for bit: alone vs batched vs chunked prefill vs
 *     1 thread, greedy and sampled, with the f32, f16 and q8 KV kinds;
 *   - far past the sliding window (16): the rotating cache (sliding layers)
 *     against one that keeps every position, same tokens and logits;
 *   - KV sharing: shared layers own no cache layer (bytes per token) and
 *     the hub config format (global_head_dim, num_global_key_value_heads)
 *     gives the same logits as per_layer_config;
 *   - impossible configs refused with one line naming the field;
 *   - `ember info` describes the models.
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, symlink, popen */
#include <unistd.h>

#include "ember.h"
#include "engine/engine.h"
#include "fixture.h"
#include "kv/kv.h"

static const char *const k_families[] = {"gemma4_text", "gemma4_text_ple", "gemma4_text_moe"};
#define N_FAM (sizeof k_families / sizeof k_families[0])

/* ---- parity ------------------------------------------------------------------------ */

static void parity(const char *family, ember_isa isa, const char *kv_type, float tol) {
    fixture f;
    fixture_open(&f, family);
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.isa = isa;
    mp.n_threads = 2;
    mp.kv_type = kv_type;
    ember_model *m = fx_load_params(f.dir, &mp);
    CHECKF(m != NULL, "%s: does not load", family);
    if (!m) {
        fixture_close(&f);
        return;
    }
    float *lg[3];
    int32_t ids[3][24];
    for (int i = 0; i < 3; i++) lg[i] = malloc((size_t)(f.p[i].n + 23) * (size_t)f.vocab * sizeof(float));
    float worst = 0;
    if (CHECKV(lg[0] && lg[1] && lg[2] && fx_generate3(m, &f, family, ids, lg), "%s/%s: the prompts do not run",
               family, kv_type))
        for (int i = 0; i < 3; i++) {
            const fixture_prompt *p = &f.p[i];
            /* f32: identical ids; f16 may part only where the reference's margin is within its error */
            const int agree = fx_agree(&f, i, ids[i]);
            const float ref_max = max_abs(p->logits, (size_t)p->n * (size_t)f.vocab);
            CHECKF(agree == 24 || (tol > 1e-4f && p->margin[agree] <= 2 * tol * ref_max),
                   "%s/%s/%s p%d: greedy ids differ from step %d (margin %g)", family, ember_isa_name(isa), kv_type, i,
                   agree, agree < 24 ? p->margin[agree] : 0.0);
            const float e = fx_logit_err(&f, i, lg[i], agree);
            CHECKF(e <= tol, "%s/%s/%s p%d: max|dlogit| relative %g", family, ember_isa_name(isa), kv_type, i, e);
            worst = fmaxf(worst, e);
        }
    for (int i = 0; i < 3; i++) free(lg[i]);
    fprintf(stderr, "%-16s %-6s %-4s worst relative logit error %.3g\n", family, ember_isa_name(isa), kv_type, worst);
    ember_model_free(m);
    fixture_close(&f);
}

/* ---- batch invariance ---------------------------------------------------------------- */

typedef struct run {
    int32_t ids[3][24];
    int n_out[3];
    float *logits[3];
} run;

static ember_model *load(const char *dir, const char *kv_type, int rows, int threads, int max_batch) {
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.kv_type = kv_type;
    mp.n_rows = rows;
    mp.n_threads = threads;
    mp.max_batch_tokens = max_batch;
    ember_model *m = fx_load_params(dir, &mp);
    if (!m) exit(1);
    return m;
}

/* The three prompts together (one ember_generate) or one by one. */
static void run_prompts(ember_model *m, fixture *f, bool together, float temp, run *out) {
    ember_request r[3];
    memset(r, 0, sizeof r);
    for (int i = 0; i < 3; i++) {
        r[i].prompt = f->p[i].ids;
        r[i].n_prompt = f->p[i].n;
        r[i].max_new_tokens = 24 - 4 * i; /* rows leave the batch at different steps */
        r[i].ignore_eos = 1;
        ember_sampling_init(&r[i].sampling);
        r[i].sampling.temperature = temp;
        r[i].sampling.seed = 1000 + (uint64_t)i;
        r[i].out_ids = out->ids[i];
        out->logits[i] = calloc((size_t)(f->p[i].n + 24) * (size_t)f->vocab, sizeof(float));
        r[i].out_logits = out->logits[i];
    }
    ember_error err = {0};
    if (together) {
        CHECKF(ember_generate(m, r, 3, &err) == EMBER_OK, "%s", err.msg);
    } else {
        for (int i = 0; i < 3; i++) CHECKF(ember_generate(m, &r[i], 1, &err) == EMBER_OK, "%s", err.msg);
    }
    for (int i = 0; i < 3; i++) out->n_out[i] = r[i].n_out;
}

static void same(const char *what, const char *family, const char *kv, fixture *f, run *a, run *b) {
    for (int i = 0; i < 3; i++) {
        CHECKF(a->n_out[i] == b->n_out[i] && !memcmp(a->ids[i], b->ids[i], sizeof(int32_t) * (size_t)a->n_out[i]),
               "%s %s %s p%d: ids differ", family, kv, what, i);
        size_t n = (size_t)(f->p[i].n + a->n_out[i] - 1) * (size_t)f->vocab;
        CHECKF(!memcmp(a->logits[i], b->logits[i], n * sizeof(float)), "%s %s %s p%d: logits differ", family, kv, what,
               i);
    }
}

static void free_run(run *r) {
    for (int i = 0; i < 3; i++) free(r->logits[i]);
}

static void batch_invariance(const char *family, const char *kv) {
    fixture f;
    fixture_open(&f, family);
    const float temps[] = {0.0f, 0.9f};
    for (int t = 0; t < 2; t++) {
        ember_model *m = load(f.dir, kv, 3, 2, 512);
        run alone, together, chunked, one_thread;
        run_prompts(m, &f, false, temps[t], &alone);
        run_prompts(m, &f, true, temps[t], &together);
        ember_model_free(m);
        m = load(f.dir, kv, 3, 2, 5); /* prefill in chunks of 5 tokens */
        run_prompts(m, &f, true, temps[t], &chunked);
        ember_model_free(m);
        m = load(f.dir, kv, 3, 1, 512);
        run_prompts(m, &f, true, temps[t], &one_thread);
        ember_model_free(m);
        same(temps[t] == 0 ? "batched vs alone (greedy)" : "batched vs alone (sampled)", family, kv, &f, &alone,
             &together);
        same("chunked prefill vs whole", family, kv, &f, &alone, &chunked);
        same("1 thread vs 2", family, kv, &f, &alone, &one_thread);
        if (temps[t] == 0 && strcmp(kv, "f32") == 0)
            for (int i = 0; i < 3; i++)
                CHECKF(!memcmp(alone.ids[i], f.p[i].greedy, sizeof(int32_t) * (size_t)alone.n_out[i]),
                       "%s p%d greedy ids differ from the reference", family, i);
        free_run(&alone);
        free_run(&together);
        free_run(&chunked);
        free_run(&one_thread);
    }
    fixture_close(&f);
}

/* ---- far past the window: rotating vs unrotated --------------------------------------- */

static void long_run(const char *family) {
    fixture f;
    fixture_open(&f, family);
    enum { NEW = 380 };
    int32_t out[2][NEW];
    float *lg[2];
    size_t held[2];
    for (int k = 0; k < 2; k++) {
        ember_model_params mp;
        ember_model_params_init(&mp);
        mp.n_threads = 2;
        mp.n_ctx = 512;
        mp.max_batch_tokens = 32;
        ember_model *m = fx_load_params(f.dir, &mp);
        if (!m) exit(1);
        if (k == 1) { /* the same layout, keeping every position of the sliding layers */
            ember_kv_free(m->kv);
            int heads[64], dims[64], win[64];
            const int n = ember_llm_kv_layout(m->llm, heads, dims, win);
            ember_kv_type t;
            ember_error err = {0};
            ember_kv_type_parse("f32", 0, 0, &t, &err);
            ember_kv_params kp = {t, n, heads, dims, win, 1, 512, 0, 1 << 20, 32, NULL, {0}};
            CHECK(ember_kv_new(m->be, &kp, &m->kv, &err) == EMBER_OK);
        }
        lg[k] = malloc(sizeof(float) * (size_t)(f.p[2].n + NEW) * (size_t)f.vocab);
        ember_request r = {0};
        r.prompt = f.p[2].ids;
        r.n_prompt = f.p[2].n;
        r.max_new_tokens = NEW;
        r.ignore_eos = 1;
        ember_sampling_init(&r.sampling);
        r.out_ids = out[k];
        r.out_logits = lg[k];
        ember_error err = {0};
        CHECKF(ember_generate(m, &r, 1, &err) == EMBER_OK, "%s", err.msg);
        held[k] = ember_kv_row_bytes(m->kv, 0);
        if (k == 0) CHECK(!memcmp(out[0], f.p[2].greedy, sizeof(int32_t) * 24));
        ember_model_free(m);
    }
    CHECKF(!memcmp(out[0], out[1], sizeof out[0]), "%s: rotating and unrotated caches give other tokens", family);
    CHECKF(!memcmp(lg[0], lg[1], sizeof(float) * (size_t)(f.p[2].n + NEW - 1) * (size_t)f.vocab),
           "%s: rotating and unrotated caches give other logits", family);
    CHECKF(held[1] > held[0], "%s: the rotating row holds %zu bytes, the unrotated %zu", family, held[0], held[1]);
    fprintf(stderr, "%s 480 positions: rotating row %zu bytes, unrotated %zu\n", family, held[0], held[1]);
    free(lg[0]);
    free(lg[1]);
    fixture_close(&f);
}

/* ---- KV sharing ------------------------------------------------------------------------ */

/* The cache holds only the non-shared layers: bytes per token in f32 are
   2 (K, V) x 4 bytes x the sum of their KV heads x head size, which the
   shared layers would raise. */
static void kv_sharing_layout(void) {
    fixture f;
    fixture_open(&f, "gemma4_text_ple");
    ember_model *m = fx_load_model(f.dir, EMBER_ISA_AUTO, 1, 1);
    CHECK(m != NULL);
    if (m) {
        const ember_model_config *c = &m->cfg;
        CHECK(c->n_kv_shared == 2);
        size_t own = 0, all = 0;
        for (int l = 0; l < c->n_layers; l++) {
            const size_t b = 2 * 4 * (size_t)ember_cfg_kv_heads(c, l) * (size_t)ember_cfg_head_dim(c, l);
            all += b;
            if (!ember_cfg_kv_shared(c, l)) own += b;
        }
        CHECKF(ember_kv_bytes_per_token(m->kv, false) == own && own < all,
               "KV bytes per token %zu, want %zu (not %zu)", ember_kv_bytes_per_token(m->kv, false), own, all);
        for (int l = 0; l < c->n_layers; l++) /* each shared layer reads the last earlier layer of its type */
            if (ember_cfg_kv_shared(c, l)) {
                const int src = ember_cfg_kv_layer(c, l);
                CHECK(src < c->n_layers - c->n_kv_shared && c->layer_sliding[src] == c->layer_sliding[l]);
                for (int j = src + 1; j < c->n_layers - c->n_kv_shared; j++) CHECK(c->layer_sliding[j] != c->layer_sliding[l]);
            }
    }
    ember_model_free(m);
    fixture_close(&f);
}

/* ---- configs written by hand ----------------------------------------------------------- */


/* The fixture's config with the text `from` replaced by `to` (which must
   occur), in a temporary directory next to a link to its weights; the
   directory's path into dir. false when `from` is absent. */
static bool edited_model(const char *family, const char *from, const char *to, char *dir) {
    char path[700], w[700];
    snprintf(path, sizeof path, "%s/fixtures/%s/config.json", shared_dir(), family);
    size_t n = 0;
    char *cfg = fx_slurp(path, &n);
    char *at = cfg ? strstr(cfg, from) : NULL;
    CHECKF(at != NULL, "%s: no \"%s\" in the config", family, from);
    if (!at) {
        free(cfg);
        return false;
    }
    strcpy(dir, "/tmp/ember_g4_XXXXXX");
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *o = fopen(path, "wb");
    CHECK(o != NULL);
    if (o) {
        fwrite(cfg, 1, (size_t)(at - cfg), o);
        fputs(to, o);
        fputs(at + strlen(from), o);
        fclose(o);
    }
    free(cfg);
    snprintf(w, sizeof w, "%s/fixtures/%s/model.safetensors", shared_dir(), family);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(symlink(w, path) == 0);
    return true;
}

static void remove_model(const char *dir) {
    char path[700];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
}

/* Configs no model can have: refused at load with one line that names the
   field, never loaded. */
static void refusals(void) {
    static const struct {
        const char *family, *from, *to, *want;
    } cases[] = {
        {"gemma4_text", "\"3\": {", "\"4\": {", "per_layer_config key '4' is not a layer index in [0, 4)"},
        {"gemma4_text", "\"3\": {", "\"-1\": {", "per_layer_config key '-1'"},
        {"gemma4_text", "\"head_dim\": 32,", "\"head_dim\": 33,", "head_dim 33 must be even (per_layer_config)"},
        {"gemma4_text", "\"head_dim\": 32,", "\"head_dim\": 32, \"sliding_window\": 8,",
         "per_layer_config.3.sliding_window is not supported"},
        {"gemma4_text", "\"num_key_value_heads\": 1", "\"num_key_value_heads\": 3",
         "num_attention_heads 4 is not a multiple of its num_key_value_heads 3 (per_layer_config)"},
        {"gemma4_text", "\"per_layer_config\": {", "\"per_layer_config\": [], \"x\": {",
         "field 'per_layer_config' must be an object"},
        {"gemma4_text_ple", "\"num_kv_shared_layers\": 2", "\"num_kv_shared_layers\": 3",
         "num_kv_shared_layers 3: layer 1 (full attention) has no earlier layer of its type"},
        {"gemma4_text_ple", "\"num_kv_shared_layers\": 2", "\"num_kv_shared_layers\": 4",
         "field 'num_kv_shared_layers' is 4, outside [0, 3]"},
        {"gemma4_text_ple", "\"vocab_size_per_layer_input\": 512", "\"vocab_size_per_layer_input\": 0",
         "vocab_size_per_layer_input 0 is below vocab_size 512"},
        {"gemma4_text_ple", "\"hidden_size_per_layer_input\": 16", "\"hidden_size_per_layer_input\": 8",
         "tensor 'model.embed_tokens_per_layer.weight' has shape [512, 64], expected [512, 32]"},
        {"gemma4_text_moe", "\"top_k_experts\": 2", "\"top_k_experts\": 5", "top_k_experts 5 is above num_experts 4"},
        {"gemma4_text_moe", "\"num_experts\": 4", "\"num_experts\": null", "missing required field 'num_experts'"},
        {"gemma4_text_moe", "\"num_experts\": 4", "\"num_experts\": 5",
         "tensor 'model.layers.0.router.proj.weight' has shape [4, 64], expected [5, 64]"},
        {"gemma4_text", "\"attention_k_eq_v\": true", "\"attention_k_eq_v\": false",
         "missing tensor 'model.layers.3.self_attn.v_proj.weight'"},
        {"gemma4_text", "\"full_attention\": {", "\"x_attention\": {", "rope_parameters has no 'full_attention' entry"},
        {"gemma4_text", "\"rope_type\": \"proportional\"", "\"rope_type\": \"spiral\"", "rope type 'spiral'"},
        {"gemma4_text", "\"use_bidirectional_attention\": null", "\"use_bidirectional_attention\": \"all\"",
         "use_bidirectional_attention 'all' is not supported"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[64];
        if (!edited_model(cases[i].family, cases[i].from, cases[i].to, dir)) continue;
        ember_model_params mp;
        ember_model_params_init(&mp);
        mp.n_threads = 1;
        ember_model *m = NULL;
        ember_error err = {0};
        int rc = ember_model_load(dir, &mp, &m, &err);
        CHECKF(rc != EMBER_OK && !m && strstr(err.msg, cases[i].want) && !strchr(err.msg, '\n'),
               "%s with %s: want \"%s\", got rc %d: %s", cases[i].family, cases[i].to, cases[i].want, rc, err.msg);
        ember_model_free(m);
        remove_model(dir);
    }
}

/* The p1 logits of the model in dir (1 thread, f32 KV) into lg [n, V]. */
static bool prompt_logits(const char *dir, fixture *f, float *lg) {
    ember_model *m = fx_load_model(dir, EMBER_ISA_AUTO, 1, 1);
    if (!m) return false;
    int32_t out[1];
    ember_request r = {0};
    r.prompt = f->p[1].ids;
    r.n_prompt = f->p[1].n;
    r.max_new_tokens = 1;
    r.ignore_eos = 1;
    ember_sampling_init(&r.sampling);
    r.out_ids = out;
    r.out_logits = lg;
    ember_error err = {0};
    int rc = ember_generate(m, &r, 1, &err);
    CHECKF(rc == EMBER_OK, "%s", err.msg);
    ember_model_free(m);
    return rc == EMBER_OK;
}

/* The hub format's global_head_dim / num_global_key_value_heads (with
   attention_k_eq_v) read as the same layers as per_layer_config. */
static void hub_format(void) {
    static const struct {
        const char *family, *from, *to;
    } cases[] = {
        {"gemma4_text", "\"per_layer_config\": {\n    \"3\": {\n      \"head_dim\": 32,\n      \"num_key_value_heads\": 1\n    }\n  },",
         "\"global_head_dim\": 32, \"num_global_key_value_heads\": 1,"},
        {"gemma4_text_ple", "\"per_layer_config\": {\n    \"1\": {\n      \"head_dim\": 32\n    },\n    \"3\": {\n      \"head_dim\": 32\n    }\n  },",
         "\"global_head_dim\": 32, \"num_global_key_value_heads\": 1,"}, /* k_eq_v false: the kv override is not taken */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fixture f;
        fixture_open(&f, cases[i].family);
        char dir[64];
        const size_t n = (size_t)f.p[1].n * (size_t)f.vocab;
        float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
        if (edited_model(cases[i].family, cases[i].from, cases[i].to, dir)) {
            CHECK(prompt_logits(f.dir, &f, a) && prompt_logits(dir, &f, b));
            CHECKF(!memcmp(a, b, n * sizeof *a), "%s: the hub format gives other logits", cases[i].family);
            remove_model(dir);
        }
        free(a);
        free(b);
        fixture_close(&f);
    }
}

/* ---- the command line --------------------------------------------------------------------- */

static void cli_info(void) {
    static const struct {
        const char *family, *want;
    } cases[] = {{"gemma4_text", "global layers: head_dim 32, kv 1; K = V on global layers"},
                 {"gemma4_text_ple", "layers 2-3 share earlier layers' KV (MLP 256 wide); per-layer inputs 16"},
                 {"gemma4_text_moe", "4 experts, top 2, width 32, beside the dense MLP"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cmd[800], buf[4096];
        snprintf(cmd, sizeof cmd, "%s info --model %s/fixtures/%s 2>&1", EMBER_BIN, shared_dir(), cases[i].family);
        FILE *p = popen(cmd, "r");
        size_t n = p ? fread(buf, 1, sizeof buf - 1, p) : 0;
        buf[n] = '\0';
        int st = p ? pclose(p) : -1;
        CHECKF(st == 0 && strstr(buf, "gemma4_text") && strstr(buf, cases[i].want), "ember info %s: %s",
               cases[i].family, buf);
    }
}

int main(void) {
    shared_dir();
    const ember_isa isas[] = {EMBER_ISA_SCALAR, EMBER_ISA_AVX2, EMBER_ISA_AVX512};
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        if (isas[i] > ember_isa_detect()) {
            fprintf(stderr, "note: %s not supported by this CPU, not tested here\n", ember_isa_name(isas[i]));
            continue;
        }
        for (size_t k = 0; k < N_FAM; k++) parity(k_families[k], isas[i], "f32", 1e-4f);
    }
    /* f16 keys and values round at 2^-11 relative; Gemma 4 attends with scale 1 over unit-RMS q and k (no
       head_dim^-0.5), so a score's error is about sqrt(head_dim) times the other families' (1e-3 there) */
    for (size_t k = 0; k < N_FAM; k++) parity(k_families[k], ember_isa_detect(), "f16", 1e-2f);
    static const char *const kinds[] = {"f32", "f16", "q8"};
    for (size_t kk = 0; kk < 3; kk++)
        for (size_t k = 0; k < N_FAM; k++) batch_invariance(k_families[k], kinds[kk]);
    for (size_t k = 0; k < N_FAM; k++) long_run(k_families[k]);
    kv_sharing_layout();
    refusals();
    hub_format();
    cli_info();
    return test_done();
}
