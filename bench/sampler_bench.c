/*
 * sampler_bench.c - the host sampler's time per row (src/sample/sampler.c),
 * one thread: the scheduler samples every non-greedy row this way, one row
 * after another, on its own thread, once per step.
 *
 * usage: sampler_bench [VOCAB] [ROWS]   (default 151936, 50 rows a setting)
 * Two kinds of logits: "flat" (uniform in [-4, 4], like a random-weight
 * model's) and "peaked" (normal with sd 2 plus 12 on 20 ids, nearer a trained
 * model's); for each, greedy and four sampling settings, and the log-softmax
 * normaliser a logprobs row needs (ember_log_sum_exp, and the double exp()
 * loop it replaced). Prints microseconds a row (the mean over ROWS calls).
 * Builds against the internal headers.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "sample/sampler.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static double uniform(void) { /* (0, 1) */
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return ((double)(g_rng >> 11) + 0.5) / 9007199254740992.0;
}

int main(int argc, char **argv) {
    const int V = argc > 1 ? atoi(argv[1]) : 151936, R = argc > 2 ? atoi(argv[2]) : 50;
    if (V < 1 || V > 4000000 || R < 1) {
        fprintf(stderr, "usage: sampler_bench [VOCAB (1..4000000)] [ROWS (>= 1)]\n");
        return 2;
    }
    float *x = malloc(sizeof(float) * (size_t)V);
    if (!x) return 1;
    const struct {
        const char *name;
        float temp, top_p, min_p;
        int top_k;
    } cfg[] = {{"greedy", 0, 1, 0, 0},
               {"temperature 1 (the OpenAI default)", 1, 1, 0, 0},
               {"temperature 0.8, top_p 0.95", 0.8f, 0.95f, 0, 0},
               {"temperature 0.7, top_k 40, top_p 0.9", 0.7f, 0.9f, 0, 40},
               {"temperature 1, min_p 0.05", 1, 1, 0.05f, 0}};
    printf("| logits | setting | us a row |\n| --- | --- | --- |\n");
    for (int kind = 0; kind < 2; kind++) {
        for (int i = 0; i < V; i++) {
            if (kind == 0) {
                x[i] = (float)(uniform() * 8 - 4);
            } else { /* Box-Muller */
                x[i] = (float)(2 * sqrt(-2 * log(uniform())) * cos(6.283185307179586 * uniform()));
            }
        }
        for (int i = 0; kind == 1 && i < 20 && i < V; i++) x[(size_t)i * 7919 % (size_t)V] += 12;
        for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
            ember_sampling sp = {0};
            sp.temperature = cfg[c].temp;
            sp.top_p = cfg[c].top_p;
            sp.top_k = cfg[c].top_k;
            sp.min_p = cfg[c].min_p;
            sp.seed = 1;
            ember_sampler *s;
            ember_error err = {0};
            if (ember_sampler_new(&sp, V, &s, &err)) {
                fprintf(stderr, "sampler_bench: %s\n", err.msg);
                free(x);
                return 1;
            }
            int64_t ids = 0; /* summed, so the calls cannot be dropped */
            const double t0 = now();
            for (int r = 0; r < R; r++) ids += ember_sampler_sample(s, x);
            const double t1 = now();
            if (ids < 0) fprintf(stderr, "sampler_bench: a negative id\n");
            printf("| %s | %s | %.0f |\n", kind ? "peaked" : "flat", cfg[c].name, 1e6 * (t1 - t0) / R);
            ember_sampler_free(s);
        }
        /* a logprobs row's normaliser: ember_log_sum_exp, and the double exp loop it replaced */
        double acc = 0;
        double t0 = now();
        for (int r = 0; r < R; r++) acc += ember_log_sum_exp(x, V);
        double t1 = now();
        printf("| %s | log-sum-exp (logprobs), ember_log_sum_exp | %.0f |\n", kind ? "peaked" : "flat", 1e6 * (t1 - t0) / R);
        t0 = now();
        for (int r = 0; r < R; r++) {
            float mx = -INFINITY;
            for (int i = 0; i < V; i++) mx = x[i] > mx ? x[i] : mx;
            double sum = 0;
            for (int i = 0; i < V; i++) sum += exp((double)x[i] - mx);
            acc -= mx + log(sum);
        }
        t1 = now();
        printf("| %s | log-sum-exp, exp() in double (before) | %.0f |\n", kind ? "peaked" : "flat", 1e6 * (t1 - t0) / R);
        if (!(fabs(acc) < 1e-3 * R)) fprintf(stderr, "sampler_bench: the two log-sum-exps disagree (%g)\n", acc);
    }
    free(x);
    return 0;
}
