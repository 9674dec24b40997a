/*
 * tok_bench.c - tokenizer encode throughput (one thread).
 *
 *   tok_bench --model PATH --text FILE [--runs N] [--chunk BYTES]
 *
 * Loads the tokenizer at PATH (a directory, tokenizer.json or .gguf),
 * encodes FILE (whole, or in chunks of --chunk bytes) --runs times with one
 * workspace and prints the best run: MB/s, tokens and tokens/s, plus the
 * load time and the decode throughput of the ids. The text file for the
 * comparison with the reference is written by tests/ref/tok/bench_ref.mjs.
 *
 * Owner: bench (run by hand; never part of the tests).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/util.h"
#include "tok/tokenizer.h"

/* CPU time of this process (less disturbed than wall time on a busy machine). */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)sz + 1);
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[sz] = 0;
    *n = (size_t)sz;
    return b;
}

int main(int argc, char **argv) {
    const char *model = NULL, *file = NULL;
    int runs = 3;
    size_t chunk = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--text") && i + 1 < argc) file = argv[++i];
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--chunk") && i + 1 < argc) chunk = (size_t)atol(argv[++i]);
        else {
            fprintf(stderr, "usage: tok_bench --model PATH --text FILE [--runs N] [--chunk BYTES]\n");
            return 1;
        }
    }
    if (!model || !file || runs < 1) {
        fprintf(stderr, "usage: tok_bench --model PATH --text FILE [--runs N] [--chunk BYTES]\n");
        return 1;
    }
    size_t n;
    char *text = read_all(file, &n);
    if (!text) {
        fprintf(stderr, "tok_bench: cannot read %s\n", file);
        return 1;
    }
    ember_error err = {0};
    ember_tokenizer *t;
    double t0 = ember_now();
    if (ember_tok_load(model, &t, &err)) {
        fprintf(stderr, "tok_bench: %s\n", err.msg);
        free(text);
        return 1;
    }
    double load_s = ember_now() - t0;
    ember_tok_ws *ws = ember_tok_ws_new(t);
    double best = 1e30, best_cpu = 1e30;
    size_t n_tok = 0;
    int32_t *keep = NULL;
    for (int r = 0; r < runs; r++) {
        double a = ember_now(), ac = cpu_now();
        size_t total = 0;
        for (size_t off = 0; off < n;) {
            size_t len = chunk ? (n - off < chunk ? n - off : chunk) : n;
            /* chunks end at a line break when there is one, like real requests */
            if (chunk && off + len < n) {
                const char *nl = memchr(text + off + len / 2, '\n', len - len / 2);
                if (nl) len = (size_t)(nl - (text + off)) + 1;
            }
            int32_t *ids;
            size_t k;
            if (ember_tok_encode(t, ws, text + off, len, 0, &ids, &k, &err)) {
                fprintf(stderr, "tok_bench: %s\n", err.msg);
                return 1;
            }
            total += k;
            if (!chunk && r == runs - 1) keep = ids;
            else free(ids);
            off += len;
        }
        double dt = ember_now() - a, dc = cpu_now() - ac;
        if (dt < best) best = dt;
        if (dc < best_cpu) best_cpu = dc;
        n_tok = total;
    }
    printf("model      %s\n", model);
    printf("text       %s: %.2f MB\n", file, (double)n / 1e6);
    printf("load       %.3f s\n", load_s);
    printf("encode     %.3f s  %.2f MB/s  %zu tokens  %.0f tokens/s  (best of %d%s)\n", best, (double)n / 1e6 / best,
           n_tok, (double)n_tok / best, runs, chunk ? ", chunked" : "");
    printf("encode cpu %.3f s  %.2f MB/s  (process CPU time, best of %d)\n", best_cpu, (double)n / 1e6 / best_cpu, runs);
    if (keep) {
        double a = ember_now();
        char *out;
        size_t ol;
        if (ember_tok_decode(t, keep, n_tok, 0, &out, &ol, &err) == 0) {
            double dt = ember_now() - a;
            printf("decode     %.3f s  %.2f MB/s out  %.0f tokens/s\n", dt, (double)ol / 1e6 / dt, (double)n_tok / dt);
            free(out);
        }
        free(keep);
    }
    ember_tok_ws_free(ws);
    ember_tok_free(t);
    free(text);
    return 0;
}
