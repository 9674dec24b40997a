/*
 * membw.c - measures this machine's memory read bandwidth: T threads each
 * sum their slice of a buffer much larger than the caches; best of several
 * passes. Used to express decode speed as a fraction of the bandwidth limit.
 *
 * usage: membw [threads...]   (default: 1 and all cores)
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BYTES (1ull << 30)

typedef struct job {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
} job;

static void *reader(void *a) {
    job *j = a;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    for (size_t i = 0; i + 8 <= j->n; i += 8) {
        s0 += j->p[i];
        s1 += j->p[i + 1];
        s2 += j->p[i + 2];
        s3 += j->p[i + 3];
        s4 += j->p[i + 4];
        s5 += j->p[i + 5];
        s6 += j->p[i + 6];
        s7 += j->p[i + 7];
    }
    j->sum = s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
    return NULL;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    uint64_t *buf = aligned_alloc(64, BYTES);
    if (!buf) {
        fprintf(stderr, "membw: out of memory\n");
        return 1;
    }
    size_t words = BYTES / 8;
    for (size_t i = 0; i < words; i++) buf[i] = i;
    int counts[16], nc = 0;
    for (int i = 1; i < argc && nc < 16; i++) counts[nc++] = atoi(argv[i]);
    if (nc == 0) {
        counts[nc++] = 1;
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        if (c > 1) counts[nc++] = (int)c;
    }
    uint64_t check = 0;
    for (int c = 0; c < nc; c++) {
        int t = counts[c] < 1 ? 1 : counts[c] > 256 ? 256 : counts[c];
        double best = 0;
        for (int pass = 0; pass < 5; pass++) {
            pthread_t th[256];
            job jobs[256];
            double t0 = now();
            for (int i = 0; i < t; i++) {
                jobs[i] = (job){buf + words / t * i, words / t, 0};
                pthread_create(&th[i], NULL, reader, &jobs[i]);
            }
            for (int i = 0; i < t; i++) {
                pthread_join(th[i], NULL);
                check += jobs[i].sum;
            }
            double gbs = (double)(words / t * t * 8) / (now() - t0) / 1e9;
            if (gbs > best) best = gbs;
        }
        printf("{\"threads\": %d, \"read_GBps\": %.2f}\n", t, best);
    }
    free(buf);
    return check == 42 ? 2 : 0; /* keeps the sums alive */
}
