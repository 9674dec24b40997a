/*
 * test_quant_models.c - GGUF and quantized models end to end:
 *   1. stories260K.gguf (real trained weights): logits at positions 0-3 of
 *      the BOS run within 1e-4 of llama2.c's (expected/logits_bos_pos0-3.txt)
 *      and the greedy ids of expected/greedy.jsonl exactly, on every ISA;
 *   2. llama-2-tiny-random.gguf (F16, 32000-token vocab) loads and runs;
 *   3. the fixture models quantized by `ember quantize`'s library call to
 *      q8_0 / q4_0 / q4_k_m: mean KL(f32 || quantized) over every position
 *      of the fixture prompts below 1e-3 (q8_0) and 5e-2 (4-bit); a random
 *      model whose rows are multiples of 256 (so Q4_K / Q6_K really run)
 *      likewise; every family written as an F32 GGUF gives the safetensors
 *      logits (gemma4's three layouts too); the config of gemma2 / gemma3 /
 *      gemma4 / phi3 GGUF metadata (defaults,
 *      stored keys) and the refusal of unknown architectures; files holding
 *      a tensor the architecture does not read are refused naming it;
 *   4. batch invariance of a quantized model: three prompts together equal
 *      each alone, and 1 thread equals 2 threads, bit for bit.
 * Exits 77 when ../shared is absent.
 */
#include <jansson.h>

#include "ember.h"
#include "fixture.h"
#include "gguf_check.h"
#include "core/cpu.h"
#include "model/model.h"
#include "formats/gguf.h"
#include "formats/gguf_write.h"
#include "model/quantize.h"

/* 1 */
static void test_stories(void) {
    char path[600], exp[600];
    snprintf(path, sizeof path, "%s/testdata/models/stories260K/stories260K.gguf", shared_dir());
    snprintf(exp, sizeof exp, "%s/testdata/models/stories260K/expected", shared_dir());
    const ember_isa isas[] = {EMBER_ISA_SCALAR, EMBER_ISA_AVX2, EMBER_ISA_AVX512, EMBER_ISA_AMX};
    for (int a = 0; a < 4; a++) {
        if (!ember_isa_supported(isas[a])) continue;
        ember_model *m = fx_load_model(path, isas[a], 2, 1);
        CHECK(m != NULL);
        if (!m) continue;
        ember_model_info info;
        ember_model_get_info(m, &info);
        CHECK(info.vocab_size == 512 && info.n_layers == 5 && info.bos_id == 1);
        /* logits at positions 0..3 */
        char lp[700];
        snprintf(lp, sizeof lp, "%s/logits_bos_pos0-3.txt", exp);
        FILE *fp = fopen(lp, "r");
        CHECK(fp != NULL);
        int32_t ids[4] = {1, 403, 407, 261};
        float *lg = malloc(4 * 512 * sizeof *lg);
        ember_error err = {0};
        CHECKF(ember_logits(m, ids, 4, lg, &err) == EMBER_OK, "%s", err.msg);
        float worst = 0;
        for (int p = 0; fp && p < 4; p++) {
            int pos, tok;
            CHECK(fscanf(fp, " logits pos=%d input_token=%d:", &pos, &tok) == 2 && pos == p && tok == ids[p]);
            for (int v = 0; v < 512; v++) {
                float e;
                CHECK(fscanf(fp, "%f", &e) == 1);
                worst = fmaxf(worst, fabsf(e - lg[p * 512 + v]));
            }
        }
        if (fp) fclose(fp);
        CHECKF(worst <= 1e-4f, "stories260K %s: logits differ from llama2.c by %g", ember_isa_name(isas[a]), worst);
        free(lg);
        /* greedy ids */
        char gp[700];
        snprintf(gp, sizeof gp, "%s/greedy.jsonl", exp);
        fp = fopen(gp, "r");
        CHECK(fp != NULL);
        char line[16384];
        int lines = 0;
        while (fp && fgets(line, sizeof line, fp)) {
            json_error_t je;
            json_t *o = json_loads(line, 0, &je);
            CHECK(o != NULL);
            if (!o) continue;
            json_t *pi = json_object_get(o, "prompt_ids"), *gi = json_object_get(o, "generated_ids");
            int np = (int)json_array_size(pi), ng = (int)json_array_size(gi);
            int32_t prompt[64], *want = malloc((size_t)ng * 4), *got = malloc((size_t)ng * 4);
            for (int i = 0; i < np && i < 64; i++) prompt[i] = (int32_t)json_integer_value(json_array_get(pi, (size_t)i));
            for (int i = 0; i < ng; i++) want[i] = (int32_t)json_integer_value(json_array_get(gi, (size_t)i));
            ember_request r = {0};
            r.prompt = prompt;
            r.n_prompt = np;
            r.max_new_tokens = ng;
            r.ignore_eos = 1;
            ember_sampling_init(&r.sampling);
            r.out_ids = got;
            CHECKF(ember_generate(m, &r, 1, &err) == EMBER_OK, "%s", err.msg);
            CHECKF(r.n_out == ng && memcmp(got, want, (size_t)ng * 4) == 0, "stories260K %s: greedy ids of prompt %d differ",
                   ember_isa_name(isas[a]), lines);
            free(want);
            free(got);
            json_decref(o);
            lines++;
        }
        CHECK(lines == 3);
        if (fp) fclose(fp);
        ember_model_free(m);
    }
}

/* 2 */
static void test_tiny_random(void) {
    char path[600];
    snprintf(path, sizeof path, "%s/testdata/models/llama-2-tiny-random/llama-2-tiny-random.gguf", shared_dir());
    ember_model *m = fx_load_model(path, EMBER_ISA_AUTO, 2, 1);
    CHECK(m != NULL);
    if (!m) return;
    ember_model_info info;
    ember_model_get_info(m, &info);
    CHECK(info.vocab_size == 32000 && info.n_layers == 1);
    int32_t ids[3] = {1, 450, 4996}, out[8];
    ember_request r = {0};
    r.prompt = ids;
    r.n_prompt = 3;
    r.max_new_tokens = 8;
    r.ignore_eos = 1;
    ember_sampling_init(&r.sampling);
    r.out_ids = out;
    ember_error err = {0};
    CHECKF(ember_generate(m, &r, 1, &err) == EMBER_OK && r.n_out == 8, "%s", err.msg);
    float *lg = malloc(3 * 32000 * sizeof *lg);
    CHECK(ember_logits(m, ids, 3, lg, &err) == EMBER_OK);
    bool finite = true;
    for (int i = 0; i < 3 * 32000; i++) finite &= isfinite(lg[i]) != 0;
    CHECK(finite);
    free(lg);
    ember_model_free(m);
}

/* Logits of the fixture prompts for the model at path (rows concatenated). */
static const char *const k_schemes[] = {"q8_0", "q4_0", "q4_k_m"};

/* 3, on one model directory whose prompts come from fixture f */
static void kl_model(const char *dir, const char *tag, const fixture *f) {
    int rows = f->p[0].n + f->p[1].n + f->p[2].n;
    float *ref = malloc((size_t)rows * f->vocab * 4), *q = malloc((size_t)rows * f->vocab * 4);
    CHECK(fx_prompt_logits(dir, f, 3, ref) == 0);
    for (int s = 0; s < 3; s++) {
        ember_qscheme qs;
        CHECK(ember_qscheme_parse(k_schemes[s], &qs));
        char out[700];
        snprintf(out, sizeof out, "%s/%s-%s.gguf", EMBER_TEST_TMP, tag, k_schemes[s]);
        ember_error err = {0};
        CHECKF(ember_quantize_to_gguf(dir, out, qs, &err) == EMBER_OK, "%s", err.msg);
        CHECK(fx_prompt_logits(out, f, 3, q) == 0);
        double kl = mean_kl(ref, q, rows, f->vocab);
        double bound = s == 0 ? 1e-3 : 5e-2;
        fprintf(stderr, "%-8s %-7s mean KL %.3g (bound %g)\n", tag, k_schemes[s], kl, bound);
        CHECKF(kl < bound, "%s %s: mean KL %g >= %g", tag, k_schemes[s], kl, bound);
    }
    free(ref);
    free(q);
}

static void test_kl(void) {
    static const char *const fams[] = {"llama", "qwen2", "qwen3", "mistral", "phi3", "gemma2", "gemma3_text"};
    for (int i = 0; i < 7; i++) {
        fixture f;
        fixture_open(&f, fams[i]);
        kl_model(f.dir, fams[i], &f);
        fixture_close(&f);
    }
    /* K types on real 256-multiples: a random llama, prompts of the llama fixture */
    char dir[600], cfg[700], cmd[2048];
    snprintf(dir, sizeof dir, "%s/qk256", EMBER_TEST_TMP);
    snprintf(cfg, sizeof cfg, "%s/qk256.json", EMBER_TEST_TMP);
    FILE *fp = fopen(cfg, "w");
    CHECK(fp != NULL);
    if (!fp) return;
    fprintf(fp, "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": 512,"
                " \"hidden_size\": 256, \"intermediate_size\": 512, \"num_hidden_layers\": 8, \"num_attention_heads\": 4,"
                " \"num_key_value_heads\": 2, \"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-05,"
                " \"rope_theta\": 10000.0, \"tie_word_embeddings\": false, \"hidden_act\": \"silu\"}");
    fclose(fp);
    snprintf(cmd, sizeof cmd, "%s mkmodel --config %s --out %s --dtype f32 --std 0.02 --seed 7", EMBER_BIN, cfg, dir);
    CHECK(system(cmd) == 0);
    fixture f;
    fixture_open(&f, "llama");
    kl_model(dir, "qk256", &f);
    fixture_close(&f);
}

/* 3b: every fixture family written as an F32 GGUF (llama.cpp's tensor names
   and keys, Gemma norms stored as 1 + w, phi3's fused matrices) gives the
   safetensors logits: bit for bit where the layout is the same, within
   1e-5 relative for llama / mistral (Q/K rows permuted for interleaved
   RoPE, so q.k sums in another order). */
static void test_gguf_f32(void) {
    static const char *const fams[] = {"llama",       "mistral",         "qwen2",          "qwen3",
                                       "phi3",        "gemma2",          "gemma3_text",    "gemma4_text",
                                       "gemma4_text_ple", "gemma4_text_moe"};
    for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++) {
        fixture f;
        fixture_open(&f, fams[i]);
        int rows = f.p[0].n + f.p[1].n + f.p[2].n;
        size_t n = (size_t)rows * (size_t)f.vocab;
        float *ref = malloc(n * 4), *got = malloc(n * 4);
        char out[700];
        snprintf(out, sizeof out, "%s/%s-f32.gguf", EMBER_TEST_TMP, fams[i]);
        ember_error err = {0};
        CHECKF(ember_quantize_to_gguf(f.dir, out, EMBER_QSCHEME_F32, &err) == EMBER_OK, "%s: %s", fams[i], err.msg);
        CHECK(fx_prompt_logits(f.dir, &f, 3, ref) == 0);
        CHECK(fx_prompt_logits(out, &f, 3, got) == 0);
        bool permuted = strcmp(fams[i], "llama") == 0 || strcmp(fams[i], "mistral") == 0;
        float d = 0, mx = max_abs(ref, n);
        for (size_t k = 0; k < n; k++) d = fmaxf(d, fabsf(ref[k] - got[k]));
        if (permuted)
            CHECKF(d <= 1e-5f * mx, "%s f32 GGUF: max|dlogit| %g", fams[i], d);
        else
            CHECKF(!memcmp(ref, got, n * 4), "%s f32 GGUF: logits differ from safetensors (max %g)", fams[i], d);
        fprintf(stderr, "%-12s f32 GGUF vs safetensors: max|dlogit| %g\n", fams[i], d);
        free(ref);
        free(got);
        fixture_close(&f);
    }
}

/* 3b': `ember quantize --type bf16` of the bf16 llama fixture: matrices BF16
   (bit for bit the safetensors' values), norms F32, llama.cpp's file type
   32; its logits those of the safetensors within the fixtures' 1e-4 mark
   (Q/K rows permuted, so q.k sums in another order; on AMX-BF16 the
   products' own rounding adds to it: 9e-6 relative measured there). */
static void test_gguf_bf16(void) {
    fixture f;
    fixture_open(&f, "llama_bf16");
    int rows = f.p[0].n + f.p[1].n + f.p[2].n;
    size_t n = (size_t)rows * (size_t)f.vocab;
    float *ref = malloc(n * 4), *got = malloc(n * 4);
    char out[700];
    snprintf(out, sizeof out, "%s/llama_bf16-bf16.gguf", EMBER_TEST_TMP);
    ember_qscheme qs;
    CHECK(ember_qscheme_parse("bf16", &qs) && qs == EMBER_QSCHEME_BF16);
    ember_error err = {0};
    CHECKF(ember_quantize_to_gguf(f.dir, out, EMBER_QSCHEME_BF16, &err) == EMBER_OK, "%s", err.msg);
    ember_gguf *g = NULL;
    if (CHECKV(ember_gguf_open(out, &g, &err) == EMBER_OK, "%s", err.msg)) {
        const ember_gguf_tensor *q = ember_gguf_find_tensor(g, "blk.0.ffn_down.weight");
        const ember_gguf_tensor *e = ember_gguf_find_tensor(g, "token_embd.weight");
        const ember_gguf_tensor *nm = ember_gguf_find_tensor(g, "blk.0.attn_norm.weight");
        CHECK(q && q->dtype == EMBER_BF16 && e && e->dtype == EMBER_BF16 && nm && nm->dtype == EMBER_F32);
        uint32_t ft = 0;
        CHECK(ember_gguf_get_u32(g, "general.file_type", &ft, &err) == EMBER_OK && ft == 32);
        ember_gguf_free(g);
    }
    CHECK(fx_prompt_logits(f.dir, &f, 3, ref) == 0);
    CHECK(fx_prompt_logits(out, &f, 3, got) == 0);
    float d = 0, mx = max_abs(ref, n);
    for (size_t k = 0; k < n; k++) d = fmaxf(d, fabsf(ref[k] - got[k]));
    CHECKF(d <= 1e-4f * mx, "bf16 GGUF: max|dlogit| %g (max|logit| %g)", d, mx);
    fprintf(stderr, "llama_bf16   bf16 GGUF vs safetensors: max|dlogit| %g (relative %g)\n", d, d / mx);
    free(ref);
    free(got);
    fixture_close(&f);
}

/* 3c: the model config of gemma2 / gemma3 / phi3 GGUF metadata: llama.cpp's
   defaults where keys are absent, and unknown architectures refused with
   the supported ones named. kv: extra keys as {key, value} (u32 when the
   value has no '.', f32 otherwise, bools for "[0110]"). */
typedef struct kvpair {
    const char *key, *val;
} kvpair;

static int gguf_cfg(const char *arch, int layers, const kvpair *kv, int n_kv, ember_model_config *cfg,
                    ember_error *err) {
    char path[700], k[128];
    snprintf(path, sizeof path, "%s/cfg-%s.gguf", EMBER_TEST_TMP, arch);
    ember_gguf_writer *g = ember_gguf_writer_new();
#define KEY(x) (snprintf(k, sizeof k, "%s.%s", arch, x), k)
    ember_gguf_set_str(g, "general.architecture", arch, err);
    ember_gguf_set_u32(g, KEY("embedding_length"), 64, err);
    ember_gguf_set_u32(g, KEY("block_count"), (uint32_t)layers, err);
    ember_gguf_set_u32(g, KEY("feed_forward_length"), 128, err);
    ember_gguf_set_u32(g, KEY("attention.head_count"), 4, err);
    ember_gguf_set_u32(g, KEY("attention.head_count_kv"), 2, err);
    ember_gguf_set_u32(g, KEY("attention.key_length"), 32, err);
    for (int i = 0; i < n_kv; i++) {
        if (kv[i].val[0] == '[') { /* bools: "[101]" */
            bool b[64];
            size_t n = 0;
            for (const char *p = kv[i].val + 1; *p && *p != ']' && n < 64; p++) b[n++] = *p == '1';
            ember_gguf_set_bools(g, KEY(kv[i].key), b, n, err);
        } else if (strchr(kv[i].val, '.'))
            ember_gguf_set_f32(g, KEY(kv[i].key), strtof(kv[i].val, NULL), err);
        else
            ember_gguf_set_u32(g, KEY(kv[i].key), (uint32_t)strtoul(kv[i].val, NULL, 10), err);
    }
#undef KEY
    ember_gguf_add_tensor(g, "token_embd.weight", EMBER_F32, 2, (const int64_t[]){16, 64}, calloc(16 * 64, 4), err);
    int rc = ember_gguf_write_file(g, path, err);
    ember_gguf_writer_free(g);
    if (rc) return rc;
    ember_gguf *f = NULL;
    if ((rc = ember_gguf_open(path, &f, err))) return rc;
    ember_rope_mode mode;
    rc = ember_gguf_model_config(f, cfg, &mode, err);
    if (!rc && mode != EMBER_ROPE_NEOX) rc = ember_err(err, EMBER_ERR_FORMAT, "interleaved RoPE for %s", arch);
    ember_gguf_free(f);
    return rc;
}

static void test_gguf_config(void) {
    ember_model_config c;
    ember_error err = {0};
    /* gemma2 with no optional key: soft-caps 50 / 30, window on even layers, scale head_dim^-0.5 */
    const kvpair g2[] = {{"attention.sliding_window", "16"}};
    CHECKF(gguf_cfg("gemma2", 4, g2, 1, &c, &err) == EMBER_OK, "%s", err.msg);
    CHECK(strcmp(c.model_type, "gemma2") == 0 && c.act == EMBER_ACT_GELU_TANH && c.attn_softcap == 50.0f &&
          c.final_softcap == 30.0f && c.query_pre_attn_scalar == 32.0f && c.tie_embeddings);
    CHECK(c.layer_window[0] == 16 && c.layer_window[1] == 0 && c.layer_window[2] == 16 && c.layer_window[3] == 0);
    /* the 27B shape (46 layers): (hidden / heads)^-0.5; stored values win */
    CHECKF(gguf_cfg("gemma2", 46, g2, 1, &c, &err) == EMBER_OK, "%s", err.msg);
    CHECK(c.query_pre_attn_scalar == 16.0f);
    const kvpair g2b[] = {{"attention.sliding_window", "16"}, {"attn_logit_softcapping", "2.0"},
                          {"final_logit_softcapping", "0.0"}, {"attention.scale", "0.125"}};
    CHECKF(gguf_cfg("gemma2", 2, g2b, 4, &c, &err) == EMBER_OK, "%s", err.msg);
    CHECK(c.attn_softcap == 2.0f && c.final_softcap == 0.0f && c.query_pre_attn_scalar == 64.0f);
    /* gemma3: 5 sliding layers of 6, no soft-capping, the sliding layers' RoPE unscaled at 10000 */
    const kvpair g3[] = {{"attention.sliding_window", "512"}, {"rope.freq_base", "1000000.0"}};
    CHECKF(gguf_cfg("gemma3", 12, g3, 2, &c, &err) == EMBER_OK, "%s", err.msg);
    CHECK(strcmp(c.model_type, "gemma3_text") == 0 && c.attn_softcap == 0 && c.final_softcap == 0);
    CHECK(c.rope.theta == 1e6 && c.rope_local.theta == 1e4);
    for (int i = 0; i < 12; i++)
        CHECKF(c.layer_window[i] == (i % 6 == 5 ? 0 : 512) && c.layer_sliding[i] == (i % 6 != 5), "layer %d", i);
    const kvpair g3b[] = {{"attention.sliding_window", "8"}, {"attention.sliding_window_pattern", "3"},
                          {"rope.freq_base_swa", "20000.0"}};
    CHECKF(gguf_cfg("gemma3", 6, g3b, 3, &c, &err) == EMBER_OK, "%s", err.msg);
    CHECK(c.rope_local.theta == 20000.0);
    for (int i = 0; i < 6; i++) CHECKF(c.layer_window[i] == (i % 3 == 2 ? 0 : 8), "pattern 3 layer %d", i);
    /* one flag per layer, as llama.cpp writes gemma4's; a wrong count is refused */
    const kvpair g3c[] = {{"attention.sliding_window", "8"}, {"attention.sliding_window_pattern", "[1101]"}};
    CHECKF(gguf_cfg("gemma3", 4, g3c, 2, &c, &err) == EMBER_OK, "%s", err.msg);
    CHECK(c.layer_window[0] == 8 && c.layer_window[1] == 8 && c.layer_window[2] == 0 && c.layer_window[3] == 8);
    CHECK(gguf_cfg("gemma3", 5, g3c, 2, &c, &err) == EMBER_ERR_FORMAT && strstr(err.msg, "4 entries for 5 layers"));
    /* phi3: silu, NEOX, its window on every layer */
    const kvpair p3[] = {{"attention.sliding_window", "2047"}};
    CHECKF(gguf_cfg("phi3", 2, p3, 1, &c, &err) == EMBER_OK, "%s", err.msg);
    CHECK(c.act == EMBER_ACT_SILU && c.layer_window[0] == 2047 && c.layer_window[1] == 2047);
    /* an unknown architecture: one line naming it and the supported ones */
    CHECK(gguf_cfg("mamba", 2, NULL, 0, &c, &err) == EMBER_ERR_UNSUPPORTED);
    CHECKF(strstr(err.msg, "'mamba'") && !strchr(err.msg, '\n'), "%s", err.msg);
    static const char *const archs[] = {"llama",    "mistral", "qwen2",     "qwen3",  "phi3",     "gemma2",   "gemma3",
                                        "qwen3moe", "glm4moe", "qwen3next", "qwen35", "qwen35moe", "gemma4"};
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        CHECKF(strstr(err.msg, archs[i]), "'%s' missing from: %s", archs[i], err.msg);
    /* gemma4 (test_gguf_gemma4.c has the rest): the sliding flags are required; defaults: the sliding layers'
       head size key_length, no KV sharing, per-layer inputs, experts or soft-capping; a full layer needs rope_freqs */
    CHECK(gguf_cfg("gemma4", 2, NULL, 0, &c, &err) == EMBER_ERR_FORMAT &&
          strstr(err.msg, "missing key 'gemma4.attention.sliding_window_pattern'") && !strchr(err.msg, '\n'));
    const kvpair g4a[] = {{"attention.sliding_window", "8"}, {"attention.sliding_window_pattern", "[11]"},
                          {"rope.freq_base_swa", "20000.0"}};
    CHECKF(gguf_cfg("gemma4", 2, g4a, 3, &c, &err) == EMBER_OK, "%s", err.msg);
    CHECK(strcmp(c.model_type, "gemma4_text") == 0 && c.act == EMBER_ACT_GELU_TANH && c.head_dim == 32 &&
          c.n_kv_heads == 2 && c.intermediate_size == 128 && !c.double_wide_mlp && c.n_kv_shared == 0 &&
          c.ple_dim == 0 && !c.moe_beside_mlp && c.final_softcap == 0 && c.qk_norm && c.rope_local.theta == 20000.0 &&
          c.layer_window[0] == 8 && c.layer_window[1] == 8 && c.layer_sliding[1]);
    const kvpair g4b[] = {{"attention.sliding_window", "8"}, {"attention.sliding_window_pattern", "[10]"}};
    CHECK(gguf_cfg("gemma4", 2, g4b, 2, &c, &err) == EMBER_ERR_FORMAT &&
          strstr(err.msg, "missing tensor 'rope_freqs.weight'"));
}

/* 3d: a file holding a tensor its architecture does not read is refused,
   naming the tensor. path: a copy of src with the first occurrence of `from`
   replaced by `to` (same length). */
static void patched_copy(const char *src, const char *dst, const char *from, const char *to) {
    FILE *fp = fopen(src, "rb");
    CHECK(fp != NULL);
    if (!fp) return;
    fseek(fp, 0, SEEK_END);
    size_t n = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc(n);
    CHECK(fread(buf, 1, n, fp) == n);
    fclose(fp);
    size_t fl = strlen(from);
    bool done = false;
    for (size_t i = 0; i + fl <= n && !done; i++)
        if (!memcmp(buf + i, from, fl)) {
            memcpy(buf + i, to, fl);
            done = true;
        }
    CHECKF(done, "%s: '%s' not found", src, from);
    fp = fopen(dst, "wb");
    CHECK(fp && fwrite(buf, 1, n, fp) == n);
    if (fp) fclose(fp);
    free(buf);
}

static void expect_refused(const char *path, const char *needle) {
    ember_model *m = NULL;
    ember_error err = {0};
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.n_threads = 1;
    int rc = ember_model_load(path, &mp, &m, &err);
    CHECKF(rc == EMBER_ERR_FORMAT && strstr(err.msg, needle) && strstr(err.msg, "not part of"), "%s: rc %d: %s", path,
           rc, err.msg);
    ember_model_free(m);
}

static void test_foreign_tensors(void) {
    char src[700], dst[700];
    /* llama's output.weight renamed: without the check it would run tied to the embeddings */
    snprintf(src, sizeof src, "%s/llama-f32.gguf", EMBER_TEST_TMP); /* written by test_gguf_f32 */
    snprintf(dst, sizeof dst, "%s/llama-renamed.gguf", EMBER_TEST_TMP);
    patched_copy(src, dst, "output.weight", "outpux.weight");
    expect_refused(dst, "'outpux.weight'");
    /* qwen3 with layer 0's q-norm renamed: the q/k norms are off, layer 1's is foreign */
    snprintf(src, sizeof src, "%s/qwen3-f32.gguf", EMBER_TEST_TMP);
    snprintf(dst, sizeof dst, "%s/qwen3-renamed.gguf", EMBER_TEST_TMP);
    patched_copy(src, dst, "blk.0.attn_q_norm.weight", "blk.0.attn_q_morm.weight");
    expect_refused(dst, "attn_");
    /* a safetensors shard with a tensor gemma2 does not have */
    fixture f;
    fixture_open(&f, "gemma2");
    char dir[700], path[3000];
    snprintf(dir, sizeof dir, "%s/foreign-gemma2", EMBER_TEST_TMP);
    snprintf(path, sizeof path, "mkdir -p %s && cp %s/config.json %s/model.safetensors %s/", dir, f.dir, f.dir, dir);
    CHECK(system(path) == 0);
    snprintf(path, sizeof path, "%s/extra.safetensors", dir);
    FILE *fp = fopen(path, "wb");
    CHECK(fp != NULL);
    if (fp) {
        const char hdr[] = "{\"model.layers.0.mlp.extra_proj.weight\":{\"dtype\":\"F32\",\"shape\":[2],"
                           "\"data_offsets\":[0,8]}}";
        uint64_t hl = sizeof hdr - 1;
        float data[2] = {1, 2};
        fwrite(&hl, 8, 1, fp);
        fwrite(hdr, 1, hl, fp);
        fwrite(data, 4, 2, fp);
        fclose(fp);
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    fp = fopen(path, "w");
    CHECK(fp != NULL);
    if (fp) {
        fprintf(fp, "{\"weight_map\": {\"model.embed_tokens.weight\": \"model.safetensors\","
                    " \"model.layers.0.mlp.extra_proj.weight\": \"extra.safetensors\"}}");
        fclose(fp);
    }
    expect_refused(dir, "'model.layers.0.mlp.extra_proj.weight'");
    fixture_close(&f);
}

/* 4 */
static void test_batch_invariance(void) {
    fixture f;
    fixture_open(&f, "qwen2");
    char out[700];
    snprintf(out, sizeof out, "%s/bi-q4_k_m.gguf", EMBER_TEST_TMP);
    ember_error err = {0};
    CHECKF(ember_quantize_to_gguf(f.dir, out, EMBER_QSCHEME_Q4_K_M, &err) == EMBER_OK, "%s", err.msg);
    snprintf(out, sizeof out, "%s/qwen2-q4_0.gguf", EMBER_TEST_TMP); /* written by test_kl */
    const int V = f.vocab;
    float *together[3], *alone[3], *other[3] = {NULL, NULL, NULL};
    /* pass 2, where the CPU has AMX: batched on AVX-512 without the tiles
       (the prompts' matmuls of 32+ rows ran on AMX in pass 0) */
    const int passes = ember_isa_supported(EMBER_ISA_AMX) ? 3 : 2;
    for (int pass = 0; pass < passes; pass++) {
        ember_model *m = fx_load_model(out, pass == 2 ? EMBER_ISA_AVX512 : EMBER_ISA_AUTO, pass == 1 ? 1 : 2, 3);
        CHECK(m != NULL);
        if (!m) return;
        ember_request r[3];
        memset(r, 0, sizeof r);
        int32_t ids[3][8];
        for (int i = 0; i < 3; i++) {
            float **dst = pass == 2 ? other : pass ? alone : together;
            dst[i] = malloc((size_t)(f.p[i].n + 7) * V * 4);
            r[i].prompt = f.p[i].ids;
            r[i].n_prompt = f.p[i].n;
            r[i].max_new_tokens = 8;
            r[i].ignore_eos = 1;
            ember_sampling_init(&r[i].sampling);
            r[i].out_ids = ids[i];
            r[i].out_logits = dst[i];
        }
        if (pass != 1) {
            CHECKF(ember_generate(m, r, 3, &err) == EMBER_OK, "%s", err.msg);
        } else {
            for (int i = 0; i < 3; i++) CHECKF(ember_generate(m, &r[i], 1, &err) == EMBER_OK, "%s", err.msg);
        }
        ember_model_free(m);
    }
    for (int i = 0; i < 3; i++) {
        CHECKF(memcmp(together[i], alone[i], (size_t)(f.p[i].n + 7) * V * 4) == 0,
               "quantized qwen2 prompt %d: batched (2 threads) and alone (1 thread) logits differ", i);
        if (other[i])
            CHECKF(memcmp(together[i], other[i], (size_t)(f.p[i].n + 7) * V * 4) == 0,
                   "quantized qwen2 prompt %d: AMX and AVX-512 logits differ", i);
        free(other[i]);
        free(together[i]);
        free(alone[i]);
    }
    fixture_close(&f);
}

/* 5: mutated copies of stories260K.gguf load or fail cleanly */
static void test_corrupt(void) {
    char path[600];
    snprintf(path, sizeof path, "%s/testdata/models/stories260K/stories260K.gguf", shared_dir());
    gx_mutations(path, "stories260K", 12345, 400, 4);
}

int main(void) {
    shared_dir();
    shared_require("testdata/models/stories260K");
    shared_require("testdata/models/llama-2-tiny-random");
    test_stories();
    test_tiny_random();
    test_kl();
    test_gguf_f32();
    test_gguf_bf16();
    test_gguf_config();
    test_foreign_tensors();
    test_batch_invariance();
    test_corrupt();
    return test_done();
}
