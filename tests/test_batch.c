/*
 * test_batch.c - batch invariance: a row's logits and tokens do not depend
 * on what else is in its batch, on how its prompt is chunked, or on the
 * number of threads (1, 2, and 3 for the batch: more threads than KV heads,
 * where the CPU backend's kv_write splits a decode step by row). Compared bit for bit (memcmp), for every fixture
 * family, greedy and sampled, and every KV cache kind (dense, affine,
 * rotation-based, and transitioning with an offset the prompts cross).
 */
#include "ember.h"
#include "fixture.h"

static const char *const k_families[] = {"llama",   "llama_bf16", "qwen2",      "qwen3",        "qwen3_moe",
                                         "glm4_moe", "mistral",   "phi3",       "gemma2",       "gemma3_text",
                                         "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"};

/* The hybrid families: a prompt's aligned 64-position spans prefilled in one
   forward take the delta rule's chunked form, equal to token-by-token within
   rounding only; every split that never holds such a span whole is bit-exact. */
static bool is_hybrid(const char *family) {
    return strncmp(family, "qwen3_next", 10) == 0 || strncmp(family, "qwen3_5", 7) == 0;
}

typedef struct run {
    int32_t ids[3][24];
    int n_out[3];
    float *logits[3];
} run;

typedef struct kv_kind {
    const char *type;
    int quant_start;
} kv_kind;

static const kv_kind k_kinds[] = {{"f32", 0}, {"f16", 0}, {"bf16", 0}, {"q8", 0},
                                  {"q4", 0},  {"tq-k4v3", 0}, {"q4", 20}};
static const kv_kind *g_kind = &k_kinds[0];

static ember_model *load(const char *dir, int rows, int threads, int max_batch) {
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.kv_type = g_kind->type;
    mp.kv_quant_start = g_kind->quant_start;
    mp.n_rows = rows;
    mp.n_threads = threads;
    mp.max_batch_tokens = max_batch;
    ember_model *m = fx_load_params(dir, &mp);
    if (!m) exit(1);
    return m;
}

/* Runs the three prompts either together (one ember_generate) or one by one. */
static void run_prompts(ember_model *m, fixture *f, bool together, float temp, run *out) {
    ember_request r[3];
    memset(r, 0, sizeof r);
    const int V = f->vocab;
    for (int i = 0; i < 3; i++) {
        r[i].prompt = f->p[i].ids;
        r[i].n_prompt = f->p[i].n;
        r[i].max_new_tokens = 24 - 4 * i; /* rows leave the batch at different steps */
        r[i].ignore_eos = 1;
        ember_sampling_init(&r[i].sampling);
        r[i].sampling.temperature = temp;
        r[i].sampling.seed = 1000 + (uint64_t)i;
        r[i].out_ids = out->ids[i];
        out->logits[i] = calloc((size_t)(f->p[i].n + 24) * (size_t)V, sizeof(float));
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

static void same(const char *what, const char *family, fixture *f, run *a, run *b) {
    for (int i = 0; i < 3; i++) {
        CHECKF(a->n_out[i] == b->n_out[i] && !memcmp(a->ids[i], b->ids[i], sizeof(int32_t) * (size_t)a->n_out[i]),
               "%s %s p%d: ids differ", family, what, i);
        size_t n = (size_t)(f->p[i].n + a->n_out[i] - 1) * (size_t)f->vocab;
        CHECKF(!memcmp(a->logits[i], b->logits[i], n * sizeof(float)), "%s %s p%d: logits differ", family, what, i);
    }
}

/* a's and b's prompt logits within 1e-4 of their largest (the chunked and the
   recurrent forms of a hybrid's prefill). */
static void near(const char *what, const char *family, fixture *f, run *a, run *b) {
    for (int i = 0; i < 3; i++) {
        size_t n = (size_t)f->p[i].n * (size_t)f->vocab;
        float mx = 0, d = 0;
        for (size_t k = 0; k < n; k++) {
            mx = fmaxf(mx, fabsf(a->logits[i][k]));
            d = fmaxf(d, fabsf(a->logits[i][k] - b->logits[i][k]));
        }
        CHECKF(d <= 1e-4f * mx, "%s %s p%d: prompt logits differ by %g (of %g)", family, what, i, d, mx);
    }
}

static void free_run(run *r) {
    for (int i = 0; i < 3; i++) free(r->logits[i]);
}

/* Under AddressSanitizer the kind x family matrix runs two kinds per family
   (every family and every kind still covered, as in test_spec): the whole
   matrix is the release build's, and took 37 s of CI instrumented. */
#if defined(__SANITIZE_ADDRESS__)
#define BATCH_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BATCH_TEST_SANITIZED 1
#endif
#endif
#ifndef BATCH_TEST_SANITIZED
#define BATCH_TEST_SANITIZED 0
#endif

int main(void) {
    shared_dir();
    const size_t nk = sizeof k_kinds / sizeof k_kinds[0];
    for (size_t kk = 0; kk < nk; kk++) {
    g_kind = &k_kinds[kk];
    fprintf(stderr, "KV %s%s\n", g_kind->type, g_kind->quant_start ? " from position 20" : "");
    for (size_t k = 0; k < sizeof k_families / sizeof k_families[0]; k++) {
        const bool hybrid = is_hybrid(k_families[k]);
        /* hybrids: f32 and q4 (their KV is one attention layer); the others under ASan: two kinds each */
        if (hybrid ? kk != 0 && kk != 4 : BATCH_TEST_SANITIZED && kk != k % nk && kk != (k + nk / 2) % nk) continue;
        fixture f;
        fixture_open(&f, k_families[k]);
        const float temps[] = {0.0f, 0.9f};
        for (int t = 0; t < 2; t++) {
            ember_model *m = load(f.dir, 3, 2, 512);
            run alone, together, chunked, one_thread;
            run_prompts(m, &f, false, temps[t], &alone);
            ember_model_free(m);
            m = load(f.dir, 3, 3, 512); /* more threads than the fixtures' 2 KV heads: kv_write splits by row */
            run_prompts(m, &f, true, temps[t], &together);
            ember_model_free(m);
            m = load(f.dir, 3, 2, 5); /* prefill in chunks of 5 tokens */
            run_prompts(m, &f, true, temps[t], &chunked);
            ember_model_free(m);
            m = load(f.dir, 3, 1, 512);
            run_prompts(m, &f, true, temps[t], &one_thread);
            ember_model_free(m);
            const char *fam = k_families[k];
            same(temps[t] == 0 ? "batched vs alone (greedy)" : "batched vs alone (sampled)", fam, &f, &alone,
                 &together);
            if (hybrid) { /* chunks of 5 against token by token: exact; against whole: within rounding */
                run single;
                m = load(f.dir, 3, 2, 1);
                run_prompts(m, &f, true, temps[t], &single);
                ember_model_free(m);
                same("chunked prefill vs token by token", fam, &f, &single, &chunked);
                near("chunked prefill vs whole", fam, &f, &alone, &chunked);
                free_run(&single);
            } else {
                same("chunked prefill vs whole", fam, &f, &alone, &chunked);
            }
            same("1 thread vs 2", fam, &f, &alone, &one_thread);
            if (temps[t] == 0 && kk == 0)
                for (int i = 0; i < 3; i++)
                    CHECKF(!memcmp(alone.ids[i], f.p[i].greedy, sizeof(int32_t) * (size_t)alone.n_out[i]),
                           "%s p%d greedy ids differ from the reference", fam, i);
            free_run(&alone);
            free_run(&together);
            free_run(&chunked);
            free_run(&one_thread);
        }
        fixture_close(&f);
    }
    }
    return test_done();
}
