/*
 * mlx_check.h - checks shared by the MLX model tests (test_mlx_ple.c,
 * test_mlx_families.c, test_mlx_moe.c): a quantized directory's logits on each ISA this CPU
 * has and their mean KL against reference logits, greedy ids teacher-forced
 * along a fixture's reference continuation, and batch invariance (together,
 * alone, chunked prefill) on each ISA.
 */
#ifndef EMBER_TEST_MLX_CHECK_H
#define EMBER_TEST_MLX_CHECK_H

#include <jansson.h>
#include <sys/stat.h>

#include "core/cpu.h"
#include "fixture.h"

/* Every ISA tier; the absent ones are skipped. MLX weights run the AVX-512
   (VNNI) kernels under AMX, whose tiles take GGUF types and bf16. A test may
   define MLX_CHECK_ISAS (the list) and MLX_CHECK_USE_ISA(a) (whether the
   checks run on k_isas[a]: e.g. one ISA in turn under the sanitizers)
   before including this header. */
#ifndef MLX_CHECK_ISAS
#define MLX_CHECK_ISAS EMBER_ISA_SCALAR, EMBER_ISA_AVX2, EMBER_ISA_AVX512, EMBER_ISA_AMX
#endif
static const ember_isa k_isas[] = {MLX_CHECK_ISAS};
#define N_ISAS ((int)(sizeof k_isas / sizeof k_isas[0]))
#ifndef MLX_CHECK_USE_ISA
#define MLX_CHECK_USE_ISA(a) ember_isa_supported(k_isas[a])
#endif

static inline int total_rows(const fixture *f) {
    return f->p[0].n + f->p[1].n + f->p[2].n;
}

/* ember_st_write's fill for mc_check_wrapped: tensor `index` of the source file, as it is. */
static inline int mc_wrap_fill(void *user, int index, size_t first, size_t n, void *dst, ember_error *err) {
    (void)err;
    const ember_st_tensor *t = &((const ember_st_file *)user)->tensors[index];
    const size_t es = ember_dtype_get(t->dtype)->block_bytes;
    memcpy(dst, t->data + first * es, n * es);
    return 0;
}

/* Writes dir (an MLX Gemma 4 text checkpoint) to out as mlx-lm writes the
   Gemma 4 multimodal checkpoint (the hub's E2B / E4B / MoE checkpoints are
   multimodal): config {"model_type": "gemma4", "text_config": ...} with the
   quantization entries keyed by the wrapper's module paths
   (language_model.model.layers.N...), tensors under language_model.model.*,
   and checks that out gives dir's logits bit for bit. Returns the config
   written (the caller decrefs it; its "quantization" object is the one to
   change for a variant of out), or NULL when a step failed (checked). */
static inline json_t *mc_check_wrapped(const fixture *f, const char *dir, const char *out) {
    char path[800];
    mkdir(out, 0755);
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t je;
    json_t *tc = json_load_file(path, 0, &je), *root = json_object(), *q = json_object();
    json_t *oq = tc ? json_object_get(tc, "quantization") : NULL;
    const char *key;
    json_t *v;
    bool ok = CHECKV(oq != NULL, "%s: no quantization", path);
    json_object_foreach(oq, key, v) {
        char k2[300];
        snprintf(k2, sizeof k2, "%s%s", strncmp(key, "model.", 6) == 0 ? "language_model." : "", key);
        json_object_set(q, k2, v);
    }
    if (ok) {
        json_object_del(tc, "quantization");
        json_object_del(tc, "quantization_config");
        json_object_set_new(root, "model_type", json_string("gemma4"));
        json_object_set(root, "text_config", tc);
        json_object_set(root, "quantization", q);
        json_object_set(root, "quantization_config", q);
        snprintf(path, sizeof path, "%s/config.json", out);
        ok = CHECKV(json_dump_file(root, path, 0) == 0, "cannot write %s", path);
    }
    json_decref(tc);
    json_decref(q);
    ember_st_file *sf = NULL;
    ember_error err = {0};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ok = ok && CHECKV(ember_st_open(path, &sf, &err) == EMBER_OK, "%s", err.msg);
    ember_st_out *outs = ok ? calloc((size_t)sf->n_tensors, sizeof *outs) : NULL;
    char(*names)[300] = ok ? calloc((size_t)sf->n_tensors, sizeof *names) : NULL;
    ok = ok && CHECKV(outs && names, "out of memory");
    for (int i = 0; ok && i < sf->n_tensors; i++) {
        const ember_st_tensor *t = &sf->tensors[i];
        snprintf(names[i], sizeof names[i], "%s%s", strncmp(t->name, "model.", 6) == 0 ? "language_model." : "",
                 t->name);
        outs[i] = (ember_st_out){names[i], t->dtype, t->ndim, {0}};
        memcpy(outs[i].shape, t->shape, sizeof outs[i].shape);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    ok = ok && CHECKV(ember_st_write(path, outs, sf->n_tensors, mc_wrap_fill, sf, &err) == EMBER_OK, "%s", err.msg);
    free(outs);
    free(names);
    ember_st_free(sf);
    const int rows = total_rows(f);
    float *a = malloc((size_t)rows * f->vocab * 4), *b = malloc((size_t)rows * f->vocab * 4);
    ok = ok && CHECKV(a && b && fx_prompt_logits(dir, f, 3, a) == 0 && fx_prompt_logits(out, f, 3, b) == 0,
                      "%s does not run", out) &&
         CHECKV(!memcmp(a, b, (size_t)rows * f->vocab * 4), "%s: logits differ from the plain directory's", out);
    free(a);
    free(b);
    if (!ok) {
        json_decref(root);
        return NULL;
    }
    return root;
}

/* The three prompts' logits on one ISA, 1 thread. */
static inline bool isa_logits(const char *dir, const fixture *f, ember_isa isa, float *out) {
    ember_model *m = fx_load_model(dir, isa, 1, 1);
    if (!CHECKV(m != NULL, "%s does not load", dir)) return false;
    ember_error err = {0};
    int rows = 0;
    bool ok = true;
    for (int i = 0; i < 3 && ok; i++) {
        ok = CHECKV(ember_logits(m, f->p[i].ids, f->p[i].n, out + (size_t)rows * f->vocab, &err) == EMBER_OK, "%s: %s",
                    dir, err.msg);
        rows += f->p[i].n;
    }
    ember_model_free(m);
    return ok;
}

/* Mean KL of dir's logits against ref on every ISA, below bound. */
static inline void check_kl(const char *what, const fixture *f, const char *dir, const float *ref, double bound) {
    const int rows = total_rows(f), V = f->vocab;
    float *q = malloc((size_t)rows * V * 4);
    for (int a = 0; a < N_ISAS; a++) {
        if (!MLX_CHECK_USE_ISA(a) || !isa_logits(dir, f, k_isas[a], q)) continue;
        const double kl = mean_kl(ref, q, rows, V);
        fprintf(stderr, "%-22s %-7s mean KL %.3g (bound %g)\n", what, ember_isa_name(k_isas[a]), kl, bound);
        CHECKF(kl < bound, "%s (%s): mean KL %g >= %g", dir, ember_isa_name(k_isas[a]), kl, bound);
    }
    free(q);
}

/* Teacher-forced along the reference's greedy continuation (prompt + its
   first 23 ids): at each of the 24 steps whose reference top-1 / top-2
   margin is at least 0.25, dir's argmax is the reference's id. */
static inline void check_greedy_forced(const char *what, const fixture *f, const char *dir) {
    ember_model *m = fx_load_model(dir, EMBER_ISA_AUTO, 2, 1);
    if (!CHECKV(m != NULL, "%s does not load", dir)) return;
    const int V = f->vocab;
    int compared = 0, equal = 0;
    for (int i = 0; i < 3; i++) {
        const int n = f->p[i].n, T = n + 23;
        int32_t ids[160];
        memcpy(ids, f->p[i].ids, (size_t)n * sizeof *ids);
        memcpy(ids + n, f->p[i].greedy, 23 * sizeof *ids);
        float *lg = malloc((size_t)T * V * 4);
        ember_error err = {0};
        if (!CHECKV(lg && ember_logits(m, ids, T, lg, &err) == EMBER_OK, "%s: %s", dir, err.msg)) {
            free(lg);
            break;
        }
        for (int k = 0; k < 24; k++) {
            const float *row = lg + (size_t)(n - 1 + k) * V;
            int best = 0;
            for (int v = 1; v < V; v++) best = row[v] > row[best] ? v : best;
            if (f->p[i].margin[k] < 0.25f) continue;
            compared++;
            equal += best == f->p[i].greedy[k];
            CHECKF(best == f->p[i].greedy[k], "%s p%d step %d: argmax %d, the reference's %d (margin %g)", dir, i, k,
                   best, f->p[i].greedy[k], f->p[i].margin[k]);
        }
        free(lg);
    }
    fprintf(stderr, "%-22s teacher-forced: %d of the %d steps with a margin >= 0.25 agree\n", what, equal, compared);
    CHECKF(compared >= 10, "%s: only %d steps compared", dir, compared);
    ember_model_free(m);
}

/* Prompt + 8 decode steps of logits for the three prompts, together or one by one. */
static inline bool run_three(const char *dir, const fixture *f, ember_isa isa, int threads, int max_batch, bool together,
                      float *out[3]) {
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.isa = isa;
    mp.n_threads = threads;
    mp.n_rows = 3;
    mp.max_batch_tokens = max_batch;
    ember_model *m = fx_load_params(dir, &mp);
    if (!CHECKV(m != NULL, "%s does not load", dir)) return false;
    ember_request r[3];
    memset(r, 0, sizeof r);
    int32_t ids[3][8];
    for (int i = 0; i < 3; i++) {
        r[i].prompt = f->p[i].ids;
        r[i].n_prompt = f->p[i].n;
        r[i].max_new_tokens = 8;
        r[i].ignore_eos = 1;
        ember_sampling_init(&r[i].sampling);
        r[i].out_ids = ids[i];
        r[i].out_logits = out[i];
    }
    ember_error err = {0};
    bool ok = true;
    if (together)
        ok = CHECKV(ember_generate(m, r, 3, &err) == EMBER_OK, "%s", err.msg);
    else
        for (int i = 0; i < 3 && ok; i++) ok = CHECKV(ember_generate(m, &r[i], 1, &err) == EMBER_OK, "%s", err.msg);
    ember_model_free(m);
    return ok;
}

/* On every ISA (MLX_CHECK_USE_ISA): together (2 threads, the grouped
   path), alone (1 thread: decode takes the one-token path), prefill chunks
   of 5. */
static inline void check_batch(const char *what, const fixture *f, const char *dir) {
    for (int a = 0; a < N_ISAS; a++) {
        if (!MLX_CHECK_USE_ISA(a)) continue;
        float *together[3], *alone[3], *chunked[3];
        for (int i = 0; i < 3; i++) {
            size_t n = (size_t)(f->p[i].n + 7) * f->vocab;
            together[i] = calloc(n, 4);
            alone[i] = calloc(n, 4);
            chunked[i] = calloc(n, 4);
        }
        if (run_three(dir, f, k_isas[a], 2, 512, true, together) && run_three(dir, f, k_isas[a], 1, 512, false, alone) &&
            run_three(dir, f, k_isas[a], 2, 5, true, chunked))
            for (int i = 0; i < 3; i++) {
                size_t n = (size_t)(f->p[i].n + 7) * f->vocab * 4;
                CHECKF(!memcmp(together[i], alone[i], n), "%s %s p%d: batched (2 threads) and alone (1 thread) differ",
                       what, ember_isa_name(k_isas[a]), i);
                CHECKF(!memcmp(together[i], chunked[i], n), "%s %s p%d: whole and chunked prefill differ", what,
                       ember_isa_name(k_isas[a]), i);
            }
        for (int i = 0; i < 3; i++) {
            free(together[i]);
            free(alone[i]);
            free(chunked[i]);
        }
    }
}

#endif
