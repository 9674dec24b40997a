/*
 * threadpool.c - see threadpool.h.
 *
 * Protocol: one 64-bit atomic `work` holds (generation << 32 | next task).
 * The runner publishes (fn, ctx, n_tasks), zeroes `done`, then stores
 * (gen + 1, 0) into `work`. Anyone (runner and workers) claims task t by a
 * compare-and-swap of (gen, t) -> (gen, t + 1), runs it and increments
 * `done`; the runner returns once `done` reaches n_tasks. So a run waits
 * only for tasks that were actually claimed: a worker that the OS has not
 * scheduled yet (the machine is shared) never holds up a run, it simply
 * finds nothing left to take. A worker that wakes late for an old
 * generation fails its compare-and-swap (the generation moved on) and
 * cannot claim a task of the new run under the old one. fn and ctx are read
 * only after a successful claim, and the runner cannot publish the next run
 * before every claimed task is done, so they are stable while used.
 * Idle workers spin briefly, then sleep on a mutex/condvar pair;
 * `n_sleeping` and `work` are sequentially consistent so a wake-up is never
 * lost.
 */
#define _POSIX_C_SOURCE 200809L
#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

#define SPIN_ITERS 20000

struct ember_pool {
    int n_threads;
    pthread_t *threads;
    int n_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic uint64_t work; /* generation << 32 | next task */
    atomic_int done;       /* tasks finished in the current run */
    atomic_int n_tasks;
    atomic_int n_sleeping;
    atomic_int quit;
    uint32_t gen; /* the runner's last generation */
    ember_task_fn fn;
    void *ctx;
};

typedef struct worker_arg {
    ember_pool *p;
    int index;
} worker_arg;

/* Claims and runs tasks of generation gen until none is left. */
static void take_tasks(ember_pool *p, uint32_t gen, int thread) {
    for (;;) {
        uint64_t w = atomic_load_explicit(&p->work, memory_order_acquire);
        if ((uint32_t)(w >> 32) != gen) return;
        uint32_t t = (uint32_t)w;
        if ((int64_t)t >= (int64_t)atomic_load_explicit(&p->n_tasks, memory_order_relaxed)) return;
        if (!atomic_compare_exchange_weak_explicit(&p->work, &w, w + 1, memory_order_acq_rel, memory_order_relaxed))
            continue;
        p->fn(p->ctx, (int)t, thread);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    }
}

static void *worker_main(void *argp) {
    worker_arg *a = argp;
    ember_pool *p = a->p;
    int index = a->index;
    free(a);
    uint32_t seen = 0; /* gen at pool creation: a run may start before this thread does */
    for (;;) {
        uint32_t g;
        int spins = 0;
        while ((g = (uint32_t)(atomic_load(&p->work) >> 32)) == seen && !atomic_load(&p->quit)) {
            if (++spins < SPIN_ITERS) {
                CPU_RELAX();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->n_sleeping, 1);
            while ((uint32_t)(atomic_load(&p->work) >> 32) == seen && !atomic_load(&p->quit))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->n_sleeping, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load(&p->quit)) break;
        seen = g;
        take_tasks(p, g, index);
    }
    return NULL;
}

ember_pool *ember_pool_new(int n_threads, ember_error *err) {
    if (n_threads < 1) n_threads = 1;
    if (n_threads > 1024) {
        ember_err(err, EMBER_ERR_INVALID_ARG, "thread count %d is too large (max 1024)", n_threads);
        return NULL;
    }
    ember_pool *p = calloc(1, sizeof *p);
    if (!p) {
        ember_err(err, EMBER_ERR_NOMEM, "out of memory creating the thread pool");
        return NULL;
    }
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    atomic_init(&p->work, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->n_tasks, 0);
    atomic_init(&p->n_sleeping, 0);
    atomic_init(&p->quit, 0);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        if (!p->threads) {
            ember_pool_free(p);
            ember_err(err, EMBER_ERR_NOMEM, "out of memory creating the thread pool");
            return NULL;
        }
        for (int i = 1; i < n_threads; i++) {
            worker_arg *a = malloc(sizeof *a);
            if (a) *a = (worker_arg){p, i};
            if (!a || pthread_create(&p->threads[i - 1], NULL, worker_main, a) != 0) {
                free(a);
                ember_pool_free(p);
                ember_err(err, EMBER_ERR_NOMEM, "cannot start worker thread %d of %d", i,
                          n_threads);
                return NULL;
            }
            p->n_started++;
        }
    }
    return p;
}

void ember_pool_free(ember_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->quit, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_started; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}

int ember_pool_size(const ember_pool *p) {
    return p ? p->n_threads : 1;
}

void ember_pool_run(ember_pool *p, int n_tasks, ember_task_fn fn, void *ctx) {
    if (n_tasks <= 0) return;
    if (!p || p->n_started == 0 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->n_tasks, n_tasks, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    uint32_t gen = ++p->gen;
    atomic_store(&p->work, (uint64_t)gen << 32); /* seq_cst: publishes the fields above */
    if (atomic_load(&p->n_sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    take_tasks(p, gen, 0);
    while (atomic_load_explicit(&p->done, memory_order_acquire) < n_tasks) CPU_RELAX();
}
