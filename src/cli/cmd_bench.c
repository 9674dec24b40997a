/*
 * cmd_bench.c - `ember bench`: prompt processing and generation speed, in
 * the manner of llama-bench (a warm-up run, then repeats; mean and spread).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "cli.h"

static void stats(const double *x, int n, double *mean, double *sd) {
    double s = 0, q = 0;
    for (int i = 0; i < n; i++) s += x[i];
    *mean = s / n;
    for (int i = 0; i < n; i++) q += (x[i] - *mean) * (x[i] - *mean);
    *sd = n > 1 ? sqrt(q / (n - 1)) : 0;
}

static void report(bool json, const char *model, const ember_model_info *info, const char *test, int threads,
                   const double *tps, int reps) {
    double mean, sd;
    stats(tps, reps, &mean, &sd);
    if (json) {
        printf("{\"test\": \"%s\", \"threads\": %d, \"tokens_per_s\": %.3f, \"stddev\": %.3f, \"repeats\": %d, "
               "\"model\": \"%s\", \"arch\": \"%s\", \"weights\": \"%s\", \"weight_bytes\": %zu, \"kv\": \"%s\", "
               "\"kv_bytes_per_token\": %zu, \"isa\": \"%s\", \"device\": \"%s\"}\n",
               test, threads, mean, sd, reps, model, info->arch, info->weight_dtype, info->weight_bytes, info->kv_type,
               info->kv_bytes_per_token, ember_isa_name(info->isa), info->device);
    } else {
        char kv[16] = {0};
        for (size_t i = 0; i < sizeof kv - 1 && info->kv_type[i] && info->kv_type[i] != ' '; i++)
            kv[i] = info->kv_type[i];
        char where[16] = {0}; /* the ISA, or "cuda:0" without the GPU's name */
        const char *w = strcmp(info->device, "cpu") ? info->device : ember_isa_name(info->isa);
        for (size_t i = 0; i < sizeof where - 1 && w[i] && w[i] != ' '; i++) where[i] = w[i];
        printf("| %-16s | %7d | %10.2f ± %-8.2f | %-6s | %-6s | %-6s |\n", test, threads, mean, sd, info->weight_dtype,
               kv, where);
    }
    fflush(stdout);
}

int cmd_bench(int argc, char **argv) {
    const char *model = NULL, *threads_s = NULL, *isa = NULL, *depth_s = NULL;
    cli_model_opts kvo = {0};
    int n_prompt = 512, n_gen = 64, reps = 5;
    bool json = false, use_mmap = false;
    cli_opt opts[] = {
        {"model", 'm', OPT_STR, &model, "PATH", "model directory or GGUF file", 0, 0, false},
        {"n-prompt", 'p', OPT_INT, &n_prompt, "N", "prompt tokens for the pp test; 0 skips it (default 512)", 0,
         1 << 20, false},
        {"n-gen", 'n', OPT_INT, &n_gen, "N", "generated tokens for the tg test; 0 skips it (default 64)", 0, 1 << 20,
         false},
        {"threads", 't', OPT_STR, &threads_s, "LIST", "thread counts to test, e.g. 1,2 (default: all cores)", 0, 0,
         false},
        {"repeats", 'r', OPT_INT, &reps, "N", "timed repeats per test (default 5)", 1, 1000, false},
        {"isa", 0, OPT_STR, &isa, "NAME", "kernels: auto, scalar, avx2, avx512, amx", 0, 0, false},
        {"json", 0, OPT_FLAG, &json, NULL, "one JSON object per test and thread count", 0, 0, false},
        {"mmap", 0, OPT_FLAG, &use_mmap, NULL, "compute from the mapped model files (less memory, slower)", 0, 0, false},
        {"depth", 'd', OPT_STR, &depth_s, "LIST", "tokens already in the context before each test, e.g. 0,4096 "
         "(default 0)", 0, 0, false},
        CLI_KV_OPTS(kvo),
    };
    cli_cmd cmd = {"bench", "Measure prompt processing (pp) and token generation (tg) speed in tokens/s.",
                   "--model DIR|FILE.gguf [-p 512] [-n 64] [-t 1,2] [-r 5] [--json]",
                   "pp: one prompt of -p synthetic tokens, prefilled in chunks of 512.\n"
                   "tg: -n tokens decoded one at a time after a 1-token prompt.\n"
                   "With -d D, both start after D untimed tokens in the context (\"pp512 @ d4096\"),\n"
                   "which also stand in for the warm-up run.\n"
                   "Each test runs once untimed to warm up, then -r times.",
                   opts, (int)(sizeof opts / sizeof opts[0])};
    int rc = cli_parse(&cmd, argc, argv);
    if (rc) return rc == 2 ? 0 : 1;
    if (!model) return cli_fail("bench", "--model is required");
    int thr[16], n_thr = 1, dep[16], n_dep = 1;
    thr[0] = 0;
    dep[0] = 0;
    if (threads_s && cli_parse_int_list("bench", "threads", threads_s, thr, 16, 1, 4096, &n_thr)) return 1;
    if (depth_s && cli_parse_int_list("bench", "depth", depth_s, dep, 16, 0, 1 << 24, &n_dep)) return 1;
    int max_dep = 0;
    for (int i = 0; i < n_dep; i++) {
        if (dep[i] < 0) return cli_fail("bench", "--depth values must not be negative");
        if (dep[i] > max_dep) max_dep = dep[i];
    }
    if (!json) {
        printf("| test             | threads | tokens/s              | weights| kv     | isa    |\n");
        printf("|------------------|---------|-----------------------|--------|--------|--------|\n");
    }
    for (int ti = 0; ti < n_thr; ti++) {
        int ctx = max_dep + (n_prompt > n_gen + 1 ? n_prompt : n_gen + 1) + 1;
        ember_model *m;
        cli_model_opts mo = {thr[ti], ctx, 1, isa, false, use_mmap, 0, kvo.kv_type, kvo.kv_group, kvo.kv_quant_start, false, kvo.device};
        if (cli_load_model("bench", model, &mo, &m)) return 1;
        ember_model_info info;
        ember_model_get_info(m, &info);
        ember_error err = {0};
        double tps[1000];
        char name[48];
        ember_bench_result res;
        for (int di = 0; di < n_dep && !rc; di++) {
            char at[24] = "";
            if (dep[di]) snprintf(at, sizeof at, " @ d%d", dep[di]);
            /* a warm-up run first, except after a depth: its untimed prefill warms everything */
            const int r0 = dep[di] > 0 ? 0 : -1;
            if (n_prompt > 0) {
                for (int r = r0; r < reps && !rc; r++) {
                    if (ember_bench_run_at(m, dep[di], n_prompt, 0, &res, &err)) rc = cli_fail("bench", "%s", err.msg);
                    else if (r >= 0) tps[r] = n_prompt / res.prefill_seconds;
                }
                snprintf(name, sizeof name, "pp%d%s", n_prompt, at);
                if (!rc) report(json, model, &info, name, info.n_threads, tps, reps);
            }
            if (n_gen > 0) {
                for (int r = r0; r < reps && !rc; r++) {
                    if (ember_bench_run_at(m, dep[di] ? dep[di] : 1, 0, n_gen, &res, &err))
                        rc = cli_fail("bench", "%s", err.msg);
                    else if (r >= 0) tps[r] = n_gen / res.decode_seconds;
                }
                snprintf(name, sizeof name, "tg%d%s", n_gen, at);
                if (!rc) report(json, model, &info, name, info.n_threads, tps, reps);
            }
        }
        ember_model_free(m);
        if (rc) return rc;
    }
    return 0;
}
