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
 *     KV, gemma2 with f32 and bf16, qwen3_5_text with bf16: bf16 KV runs
 *     attention in the tc order, on the tensor cores); llama_bf16 and gemma2
 *     with bf16 KV again under EMBER_CUDA_ATTN_TC=0 (the span kernels);
 *   - step graphs (docs/cuda.md): the same decode steps, rows leaving and one
 *     joining, positions crossing attention spans, with EMBER_CUDA_GRAPHS on
 *     and 0 give the same greedy ids and logits bits, in both ways a step
 *     can end (logits read back; greedy ids from the forward), and the
 *     graphs were really captured and replayed (llama_bf16 f32 and bf16 KV,
 *     gemma2; quick: llama);
 *   - quantized models (`ember quantize` to q8_0, q4_0, q4_k_m, mlx4 and mlx8 of the fixtures,
 *     and of a random llama with rows of 256 so Q4_K / Q6_K run): greedy ids
 *     the CPU's, logits within 3e-2 (8-bit input levels can round apart),
 *     batch invariant
 *     (EMBER_CUDA_MODEL_QUANT=1: these alone);
 *   - the refusals: a quantized KV kind, and a device index past the last.
 *   - gemma4_text and gemma4_text_ple the same way (f16 at 1e-2, as
 *     test_gemma4.c), and gemma4_text_moe.
 * EMBER_CUDA_MODEL_QUICK=1 (the sanitizer runs): llama, gemma2 and qwen3_5_moe_text, f32 only.
 * Without a CUDA device it prints "skipped: no CUDA device" and exits 77;
 * without ../shared, "skipped" too.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <stdlib.h>

#include "backend/backend.h"
#include "ember.h"
#include "engine/engine.h"
#include "fixture.h"
#include "model/model.h"
#include "model/quantize.h"
#include "model/quantize_mlx.h"

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

/* Step graphs: GR_ROWS rows with prompts of 100 + 4 r synthetic tokens
   (below one span of 128 keys: staged attention, until row 5 crosses 128 at
   step 8 and the steps' attention goes split), row GR_ROWS joining before
   step GR_JOIN with 240 tokens (crossing 256 at step 26: three spans), row r
   leaving after 14 + 5 r steps: row counts 6, 7, 6, 5, 4, 3, 2, 1, each for
   several steps, so keys repeat (captures, replays) and change (a replay
   whose launches differ is captured again). */
enum { GR_ROWS = 6, GR_JOIN = 10, GR_STEPS = 40 };

static int first_max(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* The decode above on m, greedy: ids [GR_STEPS][GR_ROWS + 1] (-1 where a row
   is not in the step) and, without argmax, logits [GR_STEPS][GR_ROWS + 1][V]
   (the forward's rows read back); with argmax the ids come from the forward
   (ember_batch.argmax) and no logits are read. */
static int graph_decode(ember_model *m, int use_argmax, int32_t *ids, float *lg) {
    const int R = GR_ROWS + 1, V = m->cfg.vocab_size;
    int32_t tok[512], pos[512], row[512], out[512], cur[GR_ROWS + 1], am[GR_ROWS + 1];
    int plen[GR_ROWS + 1], first[GR_ROWS + 1], last[GR_ROWS + 1];
    float *pl = malloc((size_t)V * sizeof *pl), *slg = malloc((size_t)R * (size_t)V * sizeof *slg);
    ember_error err = {0};
    int rc = pl && slg ? EMBER_OK : EMBER_ERR_NOMEM;
    for (int r = 0; r < R; r++) {
        plen[r] = r < GR_ROWS ? 100 + 4 * r : 240;
        first[r] = r < GR_ROWS ? 0 : GR_JOIN;
        last[r] = r < GR_ROWS ? 14 + 5 * r : GR_STEPS; /* live in steps [first, last) */
        ember_kv_clear(m->kv, r);
    }
    for (int s = 0; s < GR_STEPS && !rc; s++) {
        for (int r = 0; r < R && !rc; r++) { /* a row's prefill before its first step */
            if (first[r] != s) continue;
            for (int j = 0; j < plen[r]; j++) {
                tok[j] = (int32_t)(((uint32_t)(r * 7919 + j) * 2654435761u) % (uint32_t)V);
                pos[j] = j;
                row[j] = r;
            }
            out[0] = plen[r] - 1;
            ember_batch b = {.n = plen[r], .tok = tok, .pos = pos, .row = row, .n_out = 1, .out = out};
            rc = ember_llm_forward(m->llm, m->st, m->kv, &b, pl, &err);
            CHECKF(rc == EMBER_OK, "graphs: prefill of row %d: %s", r, err.msg);
            cur[r] = first_max(pl, V);
        }
        int n = 0;
        for (int r = 0; r < R; r++) {
            ids[s * R + r] = -1;
            if (s < first[r] || s >= last[r]) continue;
            tok[n] = cur[r];
            pos[n] = plen[r] + s - first[r];
            row[n] = r;
            out[n] = n;
            n++;
        }
        if (rc || !n) break;
        ember_batch b = {.n = n, .tok = tok, .pos = pos, .row = row, .n_out = n, .out = out,
                         .argmax = use_argmax ? am : NULL};
        rc = ember_llm_forward(m->llm, m->st, m->kv, &b, slg, &err);
        CHECKF(rc == EMBER_OK, "graphs: step %d of %d rows: %s", s, n, err.msg);
        for (int i = 0; i < n && !rc; i++) {
            const int r = row[i];
            cur[r] = use_argmax ? am[i] : first_max(slg + (size_t)i * (size_t)V, V);
            ids[s * R + r] = cur[r];
            if (!use_argmax) memcpy(lg + ((size_t)s * R + (size_t)r) * (size_t)V, slg + (size_t)i * (size_t)V, (size_t)V * 4);
        }
    }
    free(pl);
    free(slg);
    return rc;
}

static void run_graphs(const char *family, const char *kv) {
    fixture f;
    fixture_open(&f, family);
    const int R = GR_ROWS + 1, V = f.vocab;
    ember_model *on = load_gpu(f.dir, kv, R, 512);
    setenv("EMBER_CUDA_GRAPHS", "0", 1); /* read when the backend is made */
    ember_model *off = load_gpu(f.dir, kv, R, 512);
    unsetenv("EMBER_CUDA_GRAPHS");
    CHECKF(on && off, "%s/%s: loading on cuda:0 failed", family, kv);
    const size_t nl = (size_t)GR_STEPS * (size_t)R * (size_t)V;
    int32_t *ids_on = malloc(sizeof(int32_t) * GR_STEPS * R), *ids_off = malloc(sizeof(int32_t) * GR_STEPS * R);
    float *lg_on = calloc(nl, sizeof(float)), *lg_off = calloc(nl, sizeof(float));
    for (int am = 0; on && off && am < 2; am++) {
        if (graph_decode(on, am, ids_on, lg_on) || graph_decode(off, am, ids_off, lg_off)) break;
        int id_diff = -1, lg_diff = -1;
        for (int i = 0; i < GR_STEPS * R && id_diff < 0; i++)
            if (ids_on[i] != ids_off[i]) id_diff = i;
        for (size_t i = 0; !am && i < (size_t)GR_STEPS * R && lg_diff < 0; i++)
            if (memcmp(lg_on + i * (size_t)V, lg_off + i * (size_t)V, (size_t)V * sizeof(float))) lg_diff = (int)i;
        CHECKF(id_diff < 0, "%s/%s graphs (%s): ids differ from plain launches at step %d row %d", family, kv,
               am ? "greedy ids" : "logits", id_diff / R, id_diff % R);
        CHECKF(lg_diff < 0, "%s/%s graphs: logits differ from plain launches at step %d row %d", family, kv,
               lg_diff / R, lg_diff % R);
    }
    long cap = 0, rep = 0, again = 0, cap0 = 0, rep0 = 0, again0 = 0;
    if (on && off) {
        ember_cuda_graph_stats(on->be, &cap, &rep, &again);
        ember_cuda_graph_stats(off->be, &cap0, &rep0, &again0);
        CHECKF(cap >= 4 && rep >= 20, "%s/%s: %ld steps captured, %ld replayed (graphs on)", family, kv, cap, rep);
        CHECKF(cap0 == 0 && rep0 == 0 && again0 == 0, "%s/%s: EMBER_CUDA_GRAPHS=0 still made graphs", family, kv);
    }
    fprintf(stderr, "%-12s cuda:0 %-5s step graphs: %ld captured, %ld replayed, %ld passes again; the same ids and "
                    "logits as plain launches\n", family, kv, cap, rep, again);
    free(ids_on);
    free(ids_off);
    free(lg_on);
    free(lg_off);
    ember_model_free(on);
    ember_model_free(off);
    fixture_close(&f);
}

/* The largest value of x [n] minus the second largest. */
static float top2_margin(const float *x, int n) {
    float a = -INFINITY, b = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (x[i] > a) {
            b = a;
            a = x[i];
        } else if (x[i] > b) {
            b = x[i];
        }
    }
    return a - b;
}

/* Quantized models' mark for GPU against CPU logits, relative to the
   largest: the matrix products give the CPU's bits for the same input, but
   attention, norms and RoPE differ in the last bits, and a difference that
   moves an input across a rounding boundary of its 8-bit quantization moves
   a level by one (about 1/127 of the block's largest value); on a random
   model with rows of 256 such moves reached 0.9% of the largest logit. */
#define QTOL 3e-2f

/* A quantized model on the GPU against the same file on the CPU: the
   fixture family (or, with cfg, a random model of that config whose rows
   are multiples of 256, so the K types run) written by `ember quantize`'s
   library call as scheme. Each prompt alone: every logit within QTOL of the
   largest CPU logit, the 24 greedy ids the CPU's (up to a step where the
   CPU's top two were closer than twice the largest difference); the three
   prompts together give the bits of each alone on the GPU. */
static void run_quant(const char *family, const char *scheme, const char *cfg) {
    fixture f;
    fixture_open(&f, family);
    char src[700], out[800];
    snprintf(src, sizeof src, "%s", f.dir);
    if (cfg) {
        char cpath[700], cmd[2400];
        snprintf(cpath, sizeof cpath, "%s/cuda-q-%s.json", EMBER_TEST_TMP, family);
        snprintf(src, sizeof src, "%s/cuda-q-%s", EMBER_TEST_TMP, family);
        FILE *fp = fopen(cpath, "w");
        CHECK(fp != NULL);
        if (!fp) {
            fixture_close(&f);
            return;
        }
        fputs(cfg, fp);
        fclose(fp);
        snprintf(cmd, sizeof cmd, "%s mkmodel --config %s --out %s --dtype f32 --std 0.02 --seed 7 >/dev/null",
                 EMBER_BIN, cpath, src);
        CHECK(system(cmd) == 0);
    }
    /* "mlx4", "mlx8": an MLX directory (group 64) whose products run cuda_mlx.cu; else a GGUF scheme */
    const bool mlx = !strncmp(scheme, "mlx", 3);
    snprintf(out, sizeof out, "%s/cuda-%s-%s%s%s", EMBER_TEST_TMP, family, scheme, cfg ? "-256" : "",
             mlx ? "" : ".gguf");
    ember_error err = {0};
    int rc;
    if (mlx) {
        ember_mlx_qopts o = {atoi(scheme + 3), 64, 0, EMBER_DTYPE_INVALID, false};
        rc = ember_quantize_to_mlx(src, out, &o, &err);
    } else {
        ember_qscheme qs;
        CHECK(ember_qscheme_parse(scheme, &qs));
        rc = ember_quantize_to_gguf(src, out, qs, &err);
    }
    CHECKF(rc == EMBER_OK, "quantize %s %s: %s", family, scheme, err.msg);
    ember_model *mg = rc ? NULL : load_gpu(out, "f32", 3, 512);
    ember_model *mc = rc ? NULL : fx_load_model(out, EMBER_ISA_AUTO, 2, 3);
    CHECKF(mg && mc, "%s %s: loading failed", family, scheme);
    if (!mg || !mc) {
        ember_model_free(mg);
        ember_model_free(mc);
        fixture_close(&f);
        return;
    }
    ember_model_info info;
    ember_model_get_info(mg, &info);
    const int V = info.vocab_size;
    float *lg[3], *lc[3], *lt[3];
    int32_t ig[3][GEN], ic[3][GEN], it[3][GEN];
    size_t sz[3];
    float worst = 0;
    for (int i = 0; i < 3; i++) {
        sz[i] = (size_t)(f.p[i].n + GEN - 1) * (size_t)V;
        lg[i] = malloc(sz[i] * sizeof(float));
        lc[i] = malloc(sz[i] * sizeof(float));
        lt[i] = malloc(sz[i] * sizeof(float));
        if (gen(mg, &f, &i, 1, &lg[i], &ig[i]) || gen(mc, &f, &i, 1, &lc[i], &ic[i])) continue;
        float ref = max_abs(lc[i], sz[i]), d = 0;
        for (size_t k = 0; k < sz[i]; k++) d = fmaxf(d, fabsf(lg[i][k] - lc[i][k]));
        CHECKF(d <= QTOL * ref, "%s %s p%d: max |gpu - cpu| logit %g (rel %g)", family, scheme, i, d, d / ref);
        worst = fmaxf(worst, d / ref);
        int s = 0; /* the first step whose id differs: only where the CPU's top two were within the difference */
        while (s < GEN && ig[i][s] == ic[i][s]) s++;
        CHECKF(s == GEN || top2_margin(lc[i] + (size_t)(f.p[i].n - 1 + s) * V, V) <= 2 * d,
               "%s %s p%d: greedy ids differ from the CPU's from step %d", family, scheme, i, s);
    }
    const int all[3] = {0, 1, 2};
    if (!gen(mg, &f, all, 3, lt, it))
        for (int i = 0; i < 3; i++)
            CHECKF(!memcmp(lg[i], lt[i], sz[i] * sizeof(float)) && !memcmp(ig[i], it[i], sizeof ig[i]),
                   "%s %s p%d: logits in a batch of three differ from alone", family, scheme, i);
    /* the decode steps' quantized inputs came from the ops that produced them (cuda_backend.c, "quantized
       inputs"), MLX products' too (they share the 32-element types' input); the matmul's own quantizer
       (EMBER_CUDA_QFUSE=0, read when the backend is made) gives the same bits. */
    CHECKF(ember_cuda_qfuse_count(mg->be) > 0, "%s %s: no matmul found its input quantized", family, scheme);
    setenv("EMBER_CUDA_QFUSE", "0", 1);
    ember_model *mu = load_gpu(out, "f32", 3, 512);
    unsetenv("EMBER_CUDA_QFUSE");
    CHECKF(mu != NULL, "%s %s: loading failed (EMBER_CUDA_QFUSE=0)", family, scheme);
    for (int i = 0; mu && i < 3; i++)
        if (!gen(mu, &f, &i, 1, &lt[i], &it[i]))
            CHECKF(!memcmp(lg[i], lt[i], sz[i] * sizeof(float)) && !memcmp(ig[i], it[i], sizeof ig[i]),
                   "%s %s p%d: logits differ between fused and separate input quantization", family, scheme, i);
    if (mu) CHECKF(ember_cuda_qfuse_count(mu->be) == 0, "%s %s: EMBER_CUDA_QFUSE=0 still fused", family, scheme);
    ember_model_free(mu);
    fprintf(stderr, "%-12s cuda:0 %-7s%s greedy ids the CPU's, worst relative logit difference %.3g; batch invariant\n",
            family, scheme, cfg ? " (rows of 256)" : "", worst);
    fprintf(stderr,
            "%-12s cuda:0 %-7s quantized inputs from the producing ops: %ld matmuls; the same bits as without\n",
            family, scheme, ember_cuda_qfuse_count(mg->be));
    for (int i = 0; i < 3; i++) {
        free(lg[i]);
        free(lc[i]);
        free(lt[i]);
    }
    ember_model_free(mg);
    ember_model_free(mc);
    fixture_close(&f);
}

/* quantized models: the 32-element types on the fixtures' shapes, the K types on rows of 256 */
static void test_quant(void) {
    static const char *const k256 =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": 512,"
        " \"hidden_size\": 256, \"intermediate_size\": 512, \"num_hidden_layers\": 4, \"num_attention_heads\": 4,"
        " \"num_key_value_heads\": 2, \"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-05,"
        " \"rope_theta\": 10000.0, \"tie_word_embeddings\": false, \"hidden_act\": \"silu\"}";
    run_quant("llama", "q8_0", NULL);
    run_quant("llama", "q4_0", NULL);
    run_quant("qwen2", "q4_k_m", NULL);
    run_quant("llama", "q4_k_m", k256);
    run_quant("llama", "q8_0", k256);
    run_quant("llama", "mlx4", NULL); /* MLX affine weights (cuda_mlx.cu), group 64 */
    run_quant("qwen2", "mlx8", NULL);
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
    /* a KV cache past the device's memory (65,536 rows of 65,536 positions: terabytes) is refused
       before the weights load, by the fit check (its message, not a failed allocation's) */
    mp.device = "cuda:0";
    mp.n_rows = 1 << 16;
    mp.n_ctx = 1 << 16;
    CHECK(ember_model_load(f.dir, &mp, &m, &err) == EMBER_ERR_NOMEM && m == NULL);
    CHECKF(strstr(err.msg, "KV cache") && strstr(err.msg, "GiB free of") && !strchr(err.msg, '\n'), "%s", err.msg);
    fprintf(stderr, "refused: %s\n", err.msg);
    mp.n_rows = 0;
    mp.n_ctx = 0;
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
    if (getenv("EMBER_CUDA_MODEL_QUANT")) { /* the quantized models alone */
        test_quant();
        return test_done();
    }
    if (getenv("EMBER_CUDA_MODEL_QUICK")) { /* under compute-sanitizer: three families, f32 */
        run_family("llama", "f32", 1e-4f);
        run_graphs("llama", "f32");
        run_family("gemma2", "f32", 1e-4f);
        run_family("qwen3_5_moe_text", "f32", 1e-4f); /* DeltaNet, gated attention, MoE with a gated shared expert */
        return test_done();
    }
    if (getenv("EMBER_CUDA_MODEL_GRAPHS")) { /* the step graph checks alone (a quick mutation check) */
        run_graphs("llama_bf16", "f32");
        return test_done();
    }
    run_graphs("llama_bf16", "f32");
    run_graphs("llama_bf16", "bf16");
    run_graphs("gemma2", "f32");
    run_long_batch("llama_bf16", "f32");
    run_long_batch("llama_bf16", "bf16"); /* bf16 KV: attention in the tc order */
    run_long_batch("gemma2", "f32");
    run_long_batch("gemma2", "bf16");
    run_long_batch("qwen3_5_text", "bf16"); /* head size 32, gated attention beside DeltaNet */
    /* EMBER_CUDA_ATTN_TC=0 (read when the backend is made): bf16 KV on the span kernels, invariant and
       within the fixtures' mark the same way */
    setenv("EMBER_CUDA_ATTN_TC", "0", 1);
    fprintf(stderr, "EMBER_CUDA_ATTN_TC=0:\n");
    run_long_batch("llama_bf16", "bf16");
    run_family("llama_bf16", "bf16", 1e-2f);
    run_family("gemma2", "bf16", 1e-2f);
    unsetenv("EMBER_CUDA_ATTN_TC");
    for (size_t k = 0; k < sizeof k_families / sizeof k_families[0]; k++) run_family(k_families[k], "f32", 1e-4f);
    for (size_t k = 0; k < sizeof k_families / sizeof k_families[0]; k++) {
        run_family(k_families[k], "f16", 1e-3f);
        run_family(k_families[k], "bf16", 1e-2f);
    }
    test_quant();
    /* Gemma 4 (gemma4.c): every layout, MoE included; f16 at test_gemma4.c's mark (scores unscaled) */
    static const char *const g4[] = {"gemma4_text", "gemma4_text_ple", "gemma4_text_moe"};
    for (size_t k = 0; k < sizeof g4 / sizeof g4[0]; k++) {
        run_family(g4[k], "f32", 1e-4f);
        run_family(g4[k], "f16", 1e-2f);
    }
    return test_done();
}
