/*
 * pool_bench.c - what one run of the thread pool costs: runs of N tasks,
 * each a chain of multiply-adds of about W nanoseconds (timed on one
 * thread), on T threads; prints the mean time a run over R runs, and that
 * time less the work's share (W x ceil(N / T)), which is the pool's own
 * cost (publishing, claims, the wait for the last task).
 * The CPU backend's small ops (norms, RoPE, the activations) are runs of
 * 16-64 tasks of a few microseconds or less, so on many threads this cost
 * decides whether they belong in the pool at all.
 *
 * usage: pool_bench [THREADS] [TASKS,...] [WORK_NS] [RUNS]
 *        defaults: the online CPUs, 1,16,64, 200, 20000.
 * Never run by the tests.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/threadpool.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct job {
    unsigned long iters;          /* a task's work: a chain of dependent multiply-adds */
    volatile unsigned long sink[1024]; /* a line per thread slot, written once a task */
} job;

static void spin_task(void *ctx, int task, int thread) {
    job *j = ctx;
    unsigned long x = (unsigned long)task;
    for (unsigned long i = 0; i < j->iters; i++) x = x * 6364136223846793005ul + 1442695040888963407ul;
    j->sink[(thread & 63) * 16] += x;
}

/* Iterations of spin_task's chain in ns nanoseconds, on this thread. */
static unsigned long calibrate(double ns) {
    static job c;
    c.iters = 1u << 22;
    double t0 = now();
    spin_task(&c, 1, 0);
    double per = (now() - t0) / (double)c.iters;
    return (unsigned long)(1e-9 * ns / per + 0.5);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    const char *list = argc > 2 ? argv[2] : "1,16,64";
    double work_ns = argc > 3 ? atof(argv[3]) : 200.0;
    int runs = argc > 4 ? atoi(argv[4]) : 20000;
    if (threads < 1 || runs < 1 || work_ns < 0) {
        fprintf(stderr, "usage: pool_bench [THREADS] [TASKS,...] [WORK_NS] [RUNS]\n");
        return 2;
    }
    ember_error err = {0};
    ember_pool *p = ember_pool_new(threads, &err);
    if (!p) {
        fprintf(stderr, "pool_bench: %s\n", err.msg);
        return 1;
    }
    static job j;
    j.iters = calibrate(work_ns);
    printf("| threads | tasks a run | work a task ns | us a run | us a run less the work / threads |\n"
           "| --- | --- | --- | --- | --- |\n");
    char *copy = strdup(list);
    for (char *tok = strtok(copy, ","); tok; tok = strtok(NULL, ",")) {
        int n = atoi(tok);
        if (n < 1) continue;
        for (int i = 0; i < runs / 10 + 1; i++) ember_pool_run(p, n, spin_task, &j); /* warm */
        double t0 = now();
        for (int i = 0; i < runs; i++) ember_pool_run(p, n, spin_task, &j);
        double us = 1e6 * (now() - t0) / runs;
        int lanes = n < threads ? n : threads;
        printf("| %d | %d | %.0f | %.2f | %.2f |\n", threads, n, work_ns, us,
               us - 1e-3 * work_ns * (double)((n + lanes - 1) / lanes));
    }
    free(copy);
    ember_pool_free(p);
    return 0;
}
