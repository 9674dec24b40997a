/*
 * tok_load_bench.c - tokenizer load time (issue 18, startup).
 *
 *   tok_load_bench [--runs N] PATH...
 *
 * Loads each PATH (a model directory, a tokenizer.json with the
 * tokenizer_config.json beside it, or a .gguf file: whatever ember_tok_load
 * takes) N times (default 5) in this process and prints, per path, the best
 * and the median wall time of one load, the best process CPU time of one
 * load (less disturbed than wall time by other work on the machine) and the
 * vocabulary size. The machine this runs on is shared, so the best of N is
 * the number to compare; the median says how noisy the run was. The first load of a path also pays for
 * reading the file into the page cache; a warm-up load before timing makes
 * every timed load start from a warm page cache.
 *
 * Design: one load = ember_tok_load + ember_tok_free of the result is not
 * timed (freeing happens at exit in the server). Nothing else runs in the
 * process.
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

/* CPU time of this process in seconds. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int runs = 5, first = 1;
    if (argc > 2 && !strcmp(argv[1], "--runs")) {
        runs = atoi(argv[2]);
        first = 3;
    }
    if (runs < 1 || runs > 1000 || first >= argc) {
        fprintf(stderr, "usage: tok_load_bench [--runs N] PATH...\n");
        return 1;
    }
    double *t = malloc((size_t)runs * sizeof *t);
    if (!t) return 1;
    printf("%-72s %9s %9s %9s %8s\n", "tokenizer", "best ms", "median ms", "cpu ms", "vocab");
    for (int a = first; a < argc; a++) {
        ember_error err = {0};
        ember_tokenizer *tok = NULL;
        if (ember_tok_load(argv[a], &tok, &err)) { /* warm-up (page cache) */
            fprintf(stderr, "tok_load_bench: %s\n", err.msg);
            free(t);
            return 1;
        }
        int32_t vocab = ember_tok_n_vocab(tok);
        ember_tok_free(tok);
        double best_cpu = 1e30;
        for (int r = 0; r < runs; r++) {
            double t0 = ember_now(), c0 = cpu_now();
            if (ember_tok_load(argv[a], &tok, &err)) {
                fprintf(stderr, "tok_load_bench: %s\n", err.msg);
                free(t);
                return 1;
            }
            t[r] = ember_now() - t0;
            if (cpu_now() - c0 < best_cpu) best_cpu = cpu_now() - c0;
            ember_tok_free(tok);
        }
        qsort(t, (size_t)runs, sizeof *t, cmp_double);
        double med = runs % 2 ? t[runs / 2] : 0.5 * (t[runs / 2 - 1] + t[runs / 2]);
        printf("%-72s %9.1f %9.1f %9.1f %8ld\n", argv[a], t[0] * 1e3, med * 1e3, best_cpu * 1e3, (long)vocab);
    }
    free(t);
    return 0;
}
