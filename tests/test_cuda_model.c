/*
 * test_cuda_model.c - the fixture models on the GPU (--device cuda:0):
 *   - parity with HuggingFace transformers: for every supported family (the
 *     mixture-of-experts and hybrid linear-attention ones included), the
 *     logits of every prompt position and of p0's 24 decode steps within
 *     the fixtures' mark (1e-4 x max |logit| with an f32 KV cache; 1e-3 f16,
 *     1e-2 bf16, as the CPU test allows), and the 24 greedy ids of the
 *     reference (with a 16-bit cache: up to a step where the reference's
 *     top-2 margin is within that error);
 *   - batch invariance: the three prompts generated together (one batch of
 *     three rows) give the bits each gets alone, and so does a prefill cut
 *     into chunks of 5 tokens;
 *   - batched decode over long contexts: 20 prompts of 130 to 263 tokens
 *     generated together (decode steps of 20 rows: the bf16 products'
 *     cluster kernel, attention split over spans and grouped by KV head)
 *     give the logits and ids each gets alone (llama_bf16 with f32 and bf16
 *     KV, gemma2);
 *   - the refusals: a quantized KV kind, and a device index past the last.
 *   - gemma4_text and gemma4_text_ple the same way (f16 at 1e-2, as
 *     test_gemma4.c), and gemma4_text_moe.
 * EMBER_CUDA_MODEL_QUICK=1 (the sanitizer runs): llama, gemma2 and qwen3_5_moe_text, f32 only.
 * Without a CUDA device it prints "skipped: no CUDA device" and exits 77;
 * without ../shared, "skipped" too.
 */
#include "backend/backend.h"
#include "ember.h"
#include "fixture.h"

static const char *const k_families[] = {"llama",     "llama_bf16", "qwen2",      "qwen3",        "mistral",
                                         "phi3",      "gemma2",     "gemma3_text", "qwen3_moe",   "glm4_moe",
                                         "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"};

enum { GEN = 24 };

static ember_model *load_gpu(const char *dir, const char *kv, int rows, int batch) {
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.device = "cuda:0";
    mp.kv_type = kv;
    mp.n_rows = rows;
    mp.max_batch_tokens = batch;
    return fx_load_params(dir, &mp);
}

/* Generates GEN greedy tokens for each of the n prompts in one call (one
   batch); logits [n][prompt + GEN - 1][V] and ids [n][GEN]. */
static int gen(ember_model *m, fixture *f, const int *which, int n, float **lg, int32_t (*ids)[GEN]) {
    ember_request r[3];
    memset(r, 0, sizeof r);
    for (int i = 0; i < n; i++) {
        fixture_prompt *p = &f->p[which[i]];
        r[i].prompt = p->ids;
        r[i].n_prompt = p->n;
        r[i].max_new_tokens = GEN;
        r[i].ignore_eos = 1;
        ember_sampling_init(&r[i].sampling);
        r[i].out_ids = ids[i];
        r[i].out_logits = lg[i];
    }
    ember_error err = {0};
    int rc = ember_generate(m, r, n, &err);
    CHECKF(rc == EMBER_OK, "generate: %s", err.msg);
    for (int i = 0; i < n && !rc; i++) CHECK(r[i].n_out == GEN);
    return rc;
}

static void run_family(const char *family, const char *kv, float tol) {
    fixture f;
    fixture_open(&f, family);
    const int V = f.vocab;
    ember_model *m = load_gpu(f.dir, kv, 3, 512);
    CHECKF(m != NULL, "%s: loading on cuda:0 failed", family);
    if (!m) {
        fixture_close(&f);
        return;
    }
    float *alone[3], *together[3];
    int32_t ids_alone[3][GEN], ids_together[3][GEN];
    size_t sz[3];
    for (int i = 0; i < 3; i++) {
        sz[i] = (size_t)(f.p[i].n + GEN - 1) * (size_t)V;
        alone[i] = malloc(sz[i] * sizeof(float));
        together[i] = malloc(sz[i] * sizeof(float));
    }
    float worst = 0;
    for (int i = 0; i < 3; i++) {
        fixture_prompt *p = &f.p[i];
        if (gen(m, &f, &i, 1, &alone[i], &ids_alone[i])) continue;
        const float *lg = alone[i];
        float ref_max = max_abs(p->logits, (size_t)p->n * (size_t)V), d = 0;
        for (size_t k = 0; k < (size_t)p->n * (size_t)V; k++) d = fmaxf(d, fabsf(lg[k] - p->logits[k]));
        CHECKF(d / ref_max <= tol, "%s/%s p%d: max|dlogit| %g (rel %g)", family, kv, i, d, d / ref_max);
        worst = fmaxf(worst, d / ref_max);
        int first_diff = -1;
        for (int s = 0; s < GEN && first_diff < 0; s++)
            if (ids_alone[i][s] != p->greedy[s]) first_diff = s;
        CHECKF(first_diff < 0 || (tol > 1e-4f && p->margin[first_diff] <= 2 * tol * ref_max),
               "%s/%s p%d: greedy ids differ from the reference from step %d", family, kv, i, first_diff);
        if (i == 0) {
            int agree = first_diff < 0 ? GEN : first_diff;
            float dg = 0;
            for (int s = 0; s <= agree && s < GEN; s++)
                for (int v = 0; v < V; v++)
                    dg = fmaxf(dg, fabsf(lg[(size_t)(p->n - 1 + s) * V + v] - f.p0_gen_logits[(size_t)s * V + v]));
            CHECKF(dg / ref_max <= tol, "%s/%s p0 decode logits: max diff %g", family, kv, dg);
            worst = fmaxf(worst, dg / ref_max);
        }
    }
    /* the three together: the bits of each alone */
    const int all[3] = {0, 1, 2};
    if (!gen(m, &f, all, 3, together, ids_together))
        for (int i = 0; i < 3; i++)
            CHECKF(!memcmp(alone[i], together[i], sz[i] * sizeof(float)) &&
                       !memcmp(ids_alone[i], ids_together[i], sizeof ids_alone[i]),
                   "%s/%s p%d: logits in a batch of three differ from alone", family, kv, i);
    ember_model_free(m);
    /* prefill in chunks of 5 tokens */
    m = load_gpu(f.dir, kv, 1, 5);
    CHECK(m != NULL);
    if (m) {
        const int two = 2;
        if (!gen(m, &f, &two, 1, &together[2], &ids_together[2]))
            CHECKF(!memcmp(alone[2], together[2], sz[2] * sizeof(float)),
                   "%s/%s p2: a prefill in chunks of 5 gives other logits", family, kv);
        ember_model_free(m);
    }
    fprintf(stderr, "%-12s cuda:0 %-5s worst relative logit error %.3g; batch and chunk invariant\n", family, kv,
            worst);
    for (int i = 0; i < 3; i++) {
        free(alone[i]);
        free(together[i]);
    }
    fixture_close(&f);
}

/* Rows over contexts longer than one attention span (128 keys): LB_ROWS
   prompts of 130 + 7 i tokens (synthetic ids) and LB_GEN greedy steps,
   together in one call and then each alone; every logit of every position
   and every id must be the same bits. */
enum { LB_ROWS = 20, LB_GEN = 8 };

static void run_long_batch(const char *family, const char *kv) {
    fixture f;
    fixture_open(&f, family);
    const int V = f.vocab;
    ember_model *m = load_gpu(f.dir, kv, LB_ROWS, 512);
    CHECKF(m != NULL, "%s: loading on cuda:0 failed", family);
    if (!m) {
        fixture_close(&f);
        return;
    }
    ember_request r[LB_ROWS];
    int32_t *prompt[LB_ROWS], ids[LB_ROWS][LB_GEN], ids1[LB_GEN];
    float *lg[LB_ROWS];
    size_t sz[LB_ROWS];
    memset(r, 0, sizeof r);
    for (int i = 0; i < LB_ROWS; i++) {
        const int n = 130 + 7 * i;
        prompt[i] = malloc(sizeof(int32_t) * (size_t)n);
        for (int j = 0; j < n; j++) prompt[i][j] = (int32_t)(((uint32_t)(i * 7919 + j) * 2654435761u) % (uint32_t)V);
        sz[i] = (size_t)(n + LB_GEN - 1) * (size_t)V;
        lg[i] = malloc(sz[i] * sizeof(float));
        r[i].prompt = prompt[i];
        r[i].n_prompt = n;
        r[i].max_new_tokens = LB_GEN;
        r[i].ignore_eos = 1;
        ember_sampling_init(&r[i].sampling);
        r[i].out_ids = ids[i];
        r[i].out_logits = lg[i];
    }
    ember_error err = {0};
    int rc = ember_generate(m, r, LB_ROWS, &err);
    CHECKF(rc == EMBER_OK, "%s/%s: generate %d rows: %s", family, kv, LB_ROWS, err.msg);
    int differ = 0;
    for (int i = 0; !rc && i < LB_ROWS; i++) {
        float *one = malloc(sz[i] * sizeof(float));
        ember_request q = r[i];
        q.out_ids = ids1;
        q.out_logits = one;
        q.n_out = 0;
        CHECKF(ember_generate(m, &q, 1, &err) == EMBER_OK, "%s/%s: generate alone: %s", family, kv, err.msg);
        differ += memcmp(one, lg[i], sz[i] * sizeof(float)) || memcmp(ids1, ids[i], sizeof ids1) || q.n_out != LB_GEN;
        free(one);
    }
    CHECKF(differ == 0, "%s/%s: %d of %d rows over long contexts differ between the batch and alone", family, kv,
           differ, LB_ROWS);
    fprintf(stderr, "%-12s cuda:0 %-5s %d rows of 130-263 tokens + %d steps: batch invariant\n", family, kv, LB_ROWS,
            LB_GEN);
    for (int i = 0; i < LB_ROWS; i++) {
        free(prompt[i]);
        free(lg[i]);
    }
    ember_model_free(m);
    fixture_close(&f);
}

static void test_refusals(void) {
    fixture f;
    fixture_open(&f, "llama");
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.device = "cuda:0";
    mp.kv_type = "q8";
    ember_model *m = NULL;
    ember_error err = {0};
    CHECK(ember_model_load(f.dir, &mp, &m, &err) == EMBER_ERR_UNSUPPORTED && m == NULL);
    CHECKF(strstr(err.msg, "not supported on cuda:0") && !strchr(err.msg, '\n'), "%s", err.msg);
    mp.kv_type = NULL;
    mp.device = "cuda:999";
    CHECK(ember_model_load(f.dir, &mp, &m, &err) == EMBER_ERR_INVALID_ARG && m == NULL);
    CHECKF(strstr(err.msg, "no such device"), "%s", err.msg);
    mp.device = "cuda:0";
    CHECK(ember_model_load(f.dir, &mp, &m, &err) == EMBER_OK);
    ember_model_info info;
    ember_model_get_info(m, &info);
    CHECKF(!strncmp(info.device, "cuda:0 (", 8), "device: %s", info.device);
    ember_model_free(m);
    fixture_close(&f);
}

int main(void) {
    ember_error err = {0};
    int count = 0;
    if (ember_cuda_device_count(&count, &err) || count == 0) {
        fprintf(stderr, "skipped: no CUDA device%s%s\n", err.msg[0] ? ": " : "", err.msg);
        return 77;
    }
    shared_dir();
    test_refusals();
    if (getenv("EMBER_CUDA_MODEL_QUICK")) { /* under compute-sanitizer: three families, f32 */
        run_family("llama", "f32", 1e-4f);
        run_family("gemma2", "f32", 1e-4f);
        run_family("qwen3_5_moe_text", "f32", 1e-4f); /* DeltaNet, gated attention, MoE with a gated shared expert */
        return test_done();
    }
    run_long_batch("llama_bf16", "f32");
    run_long_batch("llama_bf16", "bf16");
    run_long_batch("gemma2", "f32");
    for (size_t k = 0; k < sizeof k_families / sizeof k_families[0]; k++) run_family(k_families[k], "f32", 1e-4f);
    for (size_t k = 0; k < sizeof k_families / sizeof k_families[0]; k++) {
        run_family(k_families[k], "f16", 1e-3f);
        run_family(k_families[k], "bf16", 1e-2f);
    }
    /* Gemma 4 (gemma4.c): every layout, MoE included; f16 at test_gemma4.c's mark (scores unscaled) */
    static const char *const g4[] = {"gemma4_text", "gemma4_text_ple", "gemma4_text_moe"};
    for (size_t k = 0; k < sizeof g4 / sizeof g4[0]; k++) {
        run_family(g4[k], "f32", 1e-4f);
        run_family(g4[k], "f16", 1e-2f);
    }
    return test_done();
}
