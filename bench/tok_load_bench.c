/*
 * tok_load_bench.c - tokenizer load time (issue 18, startup).
 *
 *   tok_load_bench [--runs N] PATH...
 *
 * Loads each PATH (a model directory, a tokenizer.json with the
 * tokenizer_config.json beside it, or a .gguf file: whatever ember_tok_load
 * takes) N + 1 times (N default 5) in this process, the first untimed, and
 * prints per path: the best and the median wall time of one load, the best
 * process CPU time of one load (less disturbed than wall time by other work
 * on the machine) and the vocabulary size. The machine this runs on is
 * shared, so the best of N is the number to compare; the median says how
 * noisy the run was.
 *
 * "first ms" is the wall time of the very first load in the process (of
 * the first PATH only): what a starting server pays, with fresh pages for
 * every table; later loads reuse memory the allocator kept. Run the program
 * once before measuring so that the files are in the page cache, and give
 * each tokenizer its own process to get its "first ms".
 *
 * Design: one load = ember_tok_load; ember_tok_free of the result is not
 * timed (the server frees at exit). Nothing else runs in the process.
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
    int runs = 5, first_arg = 1;
    if (argc > 2 && !strcmp(argv[1], "--runs")) {
        runs = atoi(argv[2]);
        first_arg = 3;
    }
    if (runs < 1 || runs > 1000 || first_arg >= argc) {
        fprintf(stderr, "usage: tok_load_bench [--runs N] PATH...\n");
        return 1;
    }
    double *t = malloc((size_t)runs * sizeof *t);
    if (!t) return 1;
    printf("%-64s %9s %9s %9s %9s %8s\n", "tokenizer", "first ms", "best ms", "median ms", "cpu ms", "vocab");
    for (int a = first_arg; a < argc; a++) {
        ember_error err = {0};
        ember_tokenizer *tok = NULL;
        double t0 = ember_now();
        if (ember_tok_load(argv[a], &tok, &err)) {
            fprintf(stderr, "tok_load_bench: %s\n", err.msg);
            free(t);
            return 1;
        }
        double first = ember_now() - t0;
        int32_t vocab = ember_tok_n_vocab(tok);
        ember_tok_free(tok);
        double best_cpu = 1e30;
        for (int r = 0; r < runs; r++) {
            double w0 = ember_now(), c0 = cpu_now();
            if (ember_tok_load(argv[a], &tok, &err)) {
                fprintf(stderr, "tok_load_bench: %s\n", err.msg);
                free(t);
                return 1;
            }
            double c = cpu_now() - c0;
            t[r] = ember_now() - w0;
            if (c < best_cpu) best_cpu = c;
            ember_tok_free(tok);
        }
        qsort(t, (size_t)runs, sizeof *t, cmp_double);
        double med = runs % 2 ? t[runs / 2] : 0.5 * (t[runs / 2 - 1] + t[runs / 2]);
        char fs[32] = "-";
        if (a == first_arg) snprintf(fs, sizeof fs, "%.1f", first * 1e3);
        printf("%-64s %9s %9.1f %9.1f %9.1f %8ld\n", argv[a], fs, t[0] * 1e3, med * 1e3, best_cpu * 1e3,
               (long)vocab);
    }
    free(t);
    return 0;
}
