/*
 * spec_bench.c - speculative decoding in the serving engine: the same
 * greedy requests with and without n-gram drafts, for 1 and 16 (or any)
 * concurrent streams. Reports the acceptance rate (accepted / drafted
 * tokens), tokens per target forward (decode tokens / decoding rows'
 * forwards), and the wall-clock speedup over plain decode, and checks that
 * both runs produced the same tokens.
 *
 * usage: spec_bench --model PATH [--streams 1,16] [--gen 256] [--draft-max 8]
 *                   [--draft-min 1] [--ngram-min 1] [--ngram-max 3]
 *                   [--prefix 8] [--reps 3] [--threads N] [--kv-type f32]
 *                   [--draft-model PATH] [--ids 1,2,3] [--isa auto]
 *        spec_bench --model PATH --window 16 [--depth 256] [--reps 5]
 *
 * --draft-model PATH drafts with that model (EMBER_SPEC_DRAFT, loaded with
 * the target's rows, context and KV kind) instead of n-grams.
 *
 * --window W measures instead the ceiling on speedup: the time of one
 * forward of T = 1..W tokens of one row after --depth tokens of context
 * (a verify window of T - 1 drafts), relative to T = 1 (one decode step),
 * the median of --reps rounds over T = 1..W (ember_bench_run_at; it asks
 * the logits of the last position only, so the head's cost for the other
 * T - 1 rows is not in it).
 *
 * Prompts: BOS, then --prefix tokens sampled (temperature 1, seed = the
 * stream's index) from the model itself, so every stream tells its own
 * story; or, with --ids, those token ids for every stream (so another
 * engine can be given the very same prompt, bench/spec_vs_llamacpp.sh;
 * stream 0's generated ids are then printed on a line "tokens 1,2,..");
 * then --gen greedy tokens (EOS ignored). Each configuration runs
 * --reps times; the fastest run's time is reported.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ember.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct run_out {
    double secs;
    ember_engine_stats st;
    int32_t *ids; /* [streams * gen] */
} run_out;

static int run(ember_model *m, int32_t **prompts, const int *plen, int streams, int gen, const ember_engine_params *ep,
               run_out *o) {
    ember_error err = {0};
    ember_engine *e;
    if (ember_engine_new(m, ep, &e, &err)) {
        fprintf(stderr, "spec_bench: %s\n", err.msg);
        return 1;
    }
    ember_stream **ss = calloc((size_t)streams, sizeof *ss);
    double t0 = now();
    int rc = 0;
    for (int i = 0; i < streams && !rc; i++) {
        ember_gen_params g;
        memset(&g, 0, sizeof g);
        g.prompt = prompts[i];
        g.n_prompt = plen[i];
        g.max_tokens = gen;
        ember_sampling_init(&g.sampling);
        g.ignore_eos = 1;
        g.no_prompt_cache = 1;
        if (ember_engine_submit(e, &g, &ss[i], &err)) {
            fprintf(stderr, "spec_bench: %s\n", err.msg);
            rc = 1;
        }
    }
    for (int i = 0; i < streams && !rc; i++) {
        ember_event ev;
        int n = 0;
        while (ember_stream_next(ss[i], &ev, -1) == 1 && ev.kind == EMBER_EV_TOKEN)
            if (n < gen) o->ids[(size_t)i * (size_t)gen + (size_t)n++] = ev.token;
        if (n != gen) {
            fprintf(stderr, "spec_bench: stream %d ended after %d tokens (%s)\n", i, n, ev.error);
            rc = 1;
        }
    }
    o->secs = now() - t0;
    for (int i = 0; i < streams; i++) ember_stream_free(ss[i]);
    free(ss);
    ember_engine_get_stats(e, &o->st);
    ember_engine_free(e);
    return rc;
}

static int arg_int(int argc, char **argv, int *i, int lo, int hi) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "spec_bench: %s needs a value\n", argv[*i]);
        exit(1);
    }
    char *end;
    long v = strtol(argv[++*i], &end, 10);
    if (*end || v < lo || v > hi) {
        fprintf(stderr, "spec_bench: %s expects an integer in [%d, %d]\n", argv[*i - 1], lo, hi);
        exit(1);
    }
    return (int)v;
}

/* Parses s, comma-separated integers in [0, 2^31), into out (at most cap);
   *n the count. Returns 0, or 1 when s is empty, malformed or too long. */
static int parse_ids(const char *s, int32_t *out, int cap, int *n) {
    *n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > 0x7fffffffL || *n >= cap || (*end && *end != ',')) return 1;
        out[(*n)++] = (int32_t)v;
        s = *end ? end + 1 : end;
    }
    return *n == 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The --window mode (see the file comment): a warm-up run per T, then
   --reps rounds each timing T = 1..W once (so that a burst of load from
   elsewhere lands on one round, not on every run of one T), the median
   over rounds per T. */
static int window_costs(ember_model *m, int window, int depth, int reps) {
    ember_error err = {0};
    double *t = calloc((size_t)reps * (size_t)window, sizeof *t); /* [T - 1][round] */
    if (!t) return 1;
    ember_bench_result res;
    for (int round = -1; round < reps; round++) /* round -1: the warm-ups */
        for (int T = 1; T <= window; T++) {
            if (ember_bench_run_at(m, depth, T, 0, &res, &err)) {
                fprintf(stderr, "spec_bench: %s\n", err.msg);
                free(t);
                return 1;
            }
            if (round >= 0) t[(size_t)(T - 1) * (size_t)reps + (size_t)round] = res.prefill_seconds;
        }
    printf("%6s %12s %10s %16s\n", "tokens", "ms/forward", "x decode", "ms/token");
    double base = 0;
    for (int T = 1; T <= window; T++) {
        double *v = t + (size_t)(T - 1) * (size_t)reps;
        qsort(v, (size_t)reps, sizeof *v, cmp_double);
        double med = v[reps / 2];
        if (T == 1) base = med;
        printf("%6d %12.3f %9.2fx %16.3f\n", T, med * 1e3, med / base, med * 1e3 / T);
    }
    free(t);
    return 0;
}

int main(int argc, char **argv) {
    const char *model = NULL, *kv_type = "f32";
    int streams_list[8] = {1, 16}, n_streams = 2, gen = 256, prefix = 8, reps = 3, threads = 0, window = 0, depth = 256;
    ember_engine_params spec = {0};
    spec.spec = EMBER_SPEC_NGRAM;
    const char *draft_path = NULL;
    int32_t ids[256];
    int n_ids = 0, isa = EMBER_ISA_AUTO;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--draft-model") && i + 1 < argc)
            draft_path = argv[++i];
        else if (!strcmp(argv[i], "--kv-type") && i + 1 < argc)
            kv_type = argv[++i];
        else if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
            const char *name = argv[++i];
            isa = -1;
            for (int k = EMBER_ISA_AUTO; k <= EMBER_ISA_AMX; k++)
                if (!strcmp(name, ember_isa_name((ember_isa)k))) isa = k;
            if (isa < 0) {
                fprintf(stderr, "spec_bench: --isa expects auto, scalar, avx2, avx512 or amx\n");
                return 1;
            }
        }
        else if (!strcmp(argv[i], "--ids") && i + 1 < argc) {
            if (parse_ids(argv[++i], ids, 256, &n_ids)) {
                fprintf(stderr, "spec_bench: --ids expects 1 to 256 comma-separated token ids >= 0\n");
                return 1;
            }
        }
        else if (!strcmp(argv[i], "--streams") && i + 1 < argc) {
            n_streams = 0;
            for (char *p = argv[++i]; *p && n_streams < 8;) {
                streams_list[n_streams++] = (int)strtol(p, &p, 10);
                if (*p == ',') p++;
            }
        } else if (!strcmp(argv[i], "--gen"))
            gen = arg_int(argc, argv, &i, 1, 1 << 16);
        else if (!strcmp(argv[i], "--prefix"))
            prefix = arg_int(argc, argv, &i, 0, 256);
        else if (!strcmp(argv[i], "--reps"))
            reps = arg_int(argc, argv, &i, 1, 100);
        else if (!strcmp(argv[i], "--threads"))
            threads = arg_int(argc, argv, &i, 1, 1024);
        else if (!strcmp(argv[i], "--draft-max"))
            spec.draft_max = arg_int(argc, argv, &i, 1, EMBER_MAX_DRAFT);
        else if (!strcmp(argv[i], "--draft-min"))
            spec.draft_min = arg_int(argc, argv, &i, 1, EMBER_MAX_DRAFT);
        else if (!strcmp(argv[i], "--ngram-min"))
            spec.ngram_min = arg_int(argc, argv, &i, 1, 16);
        else if (!strcmp(argv[i], "--ngram-max"))
            spec.ngram_max = arg_int(argc, argv, &i, 1, 16);
        else if (!strcmp(argv[i], "--window"))
            window = arg_int(argc, argv, &i, 1, 64);
        else if (!strcmp(argv[i], "--depth"))
            depth = arg_int(argc, argv, &i, 0, 1 << 20);
        else {
            fprintf(stderr, "usage: spec_bench --model PATH [--streams 1,16] [--gen 256] [--draft-max 8] "
                            "[--draft-min 1] [--ngram-min 1] [--ngram-max 3] [--prefix 8] [--reps 3] [--threads N] "
                            "[--kv-type f32] [--isa auto] [--draft-model PATH] [--ids 1,2,3]\n"
                            "       spec_bench --model PATH --window 16 [--depth 256] [--reps 5] [--threads N] "
                            "[--kv-type f32] [--isa auto]\n");
            return 1;
        }
    }
    if (!model) {
        fprintf(stderr, "spec_bench: --model is required\n");
        return 1;
    }
    int max_streams = 1;
    for (int i = 0; i < n_streams; i++) {
        if (streams_list[i] < 1 || streams_list[i] > 256) {
            fprintf(stderr, "spec_bench: --streams entries must be in [1, 256]\n");
            return 1;
        }
        if (streams_list[i] > max_streams) max_streams = streams_list[i];
    }
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.n_rows = max_streams;
    mp.n_threads = threads;
    mp.kv_type = kv_type;
    mp.isa = (ember_isa)isa;
    mp.n_ctx = window ? depth + window + 1 : (n_ids ? n_ids : 1 + prefix) + gen + 1;
    ember_model *m;
    ember_error err = {0};
    if (ember_model_load(model, &mp, &m, &err)) {
        fprintf(stderr, "spec_bench: %s\n", err.msg);
        return 1;
    }
    ember_model *draft = NULL;
    if (draft_path) {
        if (ember_model_load(draft_path, &mp, &draft, &err)) {
            fprintf(stderr, "spec_bench: draft model: %s\n", err.msg);
            return 1;
        }
        spec.spec = EMBER_SPEC_DRAFT;
        spec.draft_model = draft;
    }
    ember_model_info info;
    ember_model_get_info(m, &info);
    if (window) {
        printf("model %s (%s, %d layers, hidden %d, vocab %d), KV %s, %d threads, %s; one row, depth %d, median of %d\n",
               model, info.arch, info.n_layers, info.hidden_size, info.vocab_size, info.kv_type, info.n_threads,
               ember_isa_name(info.isa), depth, reps);
        int rc = window_costs(m, window, depth, reps);
        ember_model_free(m);
        ember_model_free(draft);
        return rc;
    }
    /* prompts: BOS + a sampled prefix per stream */
    int32_t **prompts = calloc((size_t)max_streams, sizeof *prompts);
    int *plen = calloc((size_t)max_streams, sizeof *plen);
    for (int i = 0; i < max_streams; i++) {
        prompts[i] = calloc((size_t)(n_ids ? n_ids : prefix + 1), sizeof **prompts);
        if (n_ids) {
            for (int j = 0; j < n_ids; j++) {
                if (ids[j] >= info.vocab_size) {
                    fprintf(stderr, "spec_bench: --ids: token %d is not below the vocabulary size %d\n", (int)ids[j],
                            info.vocab_size);
                    return 1;
                }
                prompts[i][j] = ids[j];
            }
            plen[i] = n_ids;
            continue;
        }
        prompts[i][0] = info.bos_id >= 0 ? info.bos_id : 1;
        plen[i] = 1;
        if (prefix > 0) {
            ember_request r;
            memset(&r, 0, sizeof r);
            r.prompt = prompts[i];
            r.n_prompt = 1;
            r.max_new_tokens = prefix;
            r.ignore_eos = 1;
            ember_sampling_init(&r.sampling);
            r.sampling.temperature = 1.0f;
            r.sampling.seed = (uint64_t)i + 1;
            r.out_ids = prompts[i] + 1;
            if (ember_generate(m, &r, 1, &err)) {
                fprintf(stderr, "spec_bench: %s\n", err.msg);
                return 1;
            }
            plen[i] = 1 + r.n_out;
        }
    }
    printf("model %s (%s, %d layers, hidden %d), KV %s, %d threads, %s; gen %d, prompt %s %d, draft_max %d, "
           "draft_min %d, %s%s, best of %d\n",
           model, info.arch, info.n_layers, info.hidden_size, info.kv_type, info.n_threads, ember_isa_name(info.isa),
           gen, n_ids ? "--ids" : "BOS + prefix", n_ids ? n_ids : prefix, spec.draft_max ? spec.draft_max : 8, spec.draft_min ? spec.draft_min : 1,
           draft_path ? "draft model " : "n-gram", draft_path ? draft_path : "", reps);
    printf("%8s %12s %12s %10s %10s %12s %14s %9s %6s\n", "streams", "plain tok/s", "spec tok/s", "speedup",
           "drafted", "accepted", "tok/forward", "forwards", "same");
    int rc = 0;
    for (int si = 0; si < n_streams && !rc; si++) {
        int S = streams_list[si];
        run_out best[2];
        memset(best, 0, sizeof best);
        for (int mode = 0; mode < 2; mode++) {
            best[mode].ids = calloc((size_t)S * (size_t)gen, sizeof(int32_t));
            best[mode].secs = 1e30;
        }
        bool same = true;
        for (int rep = 0; rep < reps && !rc; rep++)
            for (int mode = 0; mode < 2 && !rc; mode++) {
                ember_engine_params plain = {0};
                run_out o = {0};
                o.ids = calloc((size_t)S * (size_t)gen, sizeof(int32_t));
                rc = run(m, prompts, plen, S, gen, mode ? &spec : &plain, &o);
                if (!rc && o.secs < best[mode].secs) {
                    free(best[mode].ids);
                    best[mode] = o;
                } else {
                    free(o.ids);
                }
            }
        if (!rc) {
            same = !memcmp(best[0].ids, best[1].ids, (size_t)S * (size_t)gen * sizeof(int32_t));
            const ember_engine_stats *a = &best[0].st, *b = &best[1].st;
            double tp0 = (double)S * gen / best[0].secs, tp1 = (double)S * gen / best[1].secs;
            printf("%8d %12.1f %12.1f %9.2fx %10llu %6llu %4.1f%% %7.2f/%4.2f %9llu %6s\n", S, tp0, tp1, tp1 / tp0,
                   (unsigned long long)b->spec_drafted_total, (unsigned long long)b->spec_accepted_total,
                   b->spec_drafted_total ? 100.0 * (double)b->spec_accepted_total / (double)b->spec_drafted_total : 0,
                   b->decode_forwards_total ? (double)b->decode_tokens_total / (double)b->decode_forwards_total : 0,
                   a->decode_forwards_total ? (double)a->decode_tokens_total / (double)a->decode_forwards_total : 0,
                   (unsigned long long)b->steps_total, same ? "yes" : "NO");
            if (!same) rc = 1;
            if (n_ids) { /* stream 0's tokens, to compare with another engine's */
                printf("tokens");
                for (int j = 0; j < gen; j++) printf("%c%d", j ? ',' : ' ', (int)best[0].ids[j]);
                printf("\n");
            }
        }
        free(best[0].ids);
        free(best[1].ids);
    }
    for (int i = 0; i < max_streams; i++) free(prompts[i]);
    free(prompts);
    free(plen);
    ember_model_free(m);
    ember_model_free(draft);
    return rc;
}
