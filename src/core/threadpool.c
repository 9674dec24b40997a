/*
 * threadpool.c - see threadpool.h.
 *
 * Protocol: the runner publishes (fn, ctx, n_tasks), resets the task counter,
 * sets `active` to the number of workers and bumps `gen`. A worker that sees
 * a new gen takes tasks with an atomic counter until none remain, then
 * decrements `active`. The runner takes tasks too and then waits for
 * `active` to reach zero. Sleeping uses a mutex/condvar pair; `n_sleeping`
 * and `gen` are sequentially consistent so a wake-up is never lost.
 */
#define _POSIX_C_SOURCE 200809L
#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
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
    atomic_uint gen;
    atomic_int n_sleeping;
    atomic_int quit;
    atomic_int next_task;
    atomic_int active;
    ember_task_fn fn;
    void *ctx;
    int n_tasks;
};

typedef struct worker_arg {
    ember_pool *p;
    int index;
} worker_arg;

static void take_tasks(ember_pool *p, int thread) {
    for (;;) {
        int t = atomic_fetch_add_explicit(&p->next_task, 1, memory_order_relaxed);
        if (t >= p->n_tasks) break;
        p->fn(p->ctx, t, thread);
    }
}

static void *worker_main(void *argp) {
    worker_arg *a = argp;
    ember_pool *p = a->p;
    int index = a->index;
    free(a);
    unsigned seen = 0; /* gen at pool creation: a run may start before this thread does */
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->quit)) {
            if (++spins < SPIN_ITERS) {
                CPU_RELAX();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->n_sleeping, 1);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->quit))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->n_sleeping, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load(&p->quit)) break;
        seen = g;
        take_tasks(p, index);
        atomic_fetch_sub_explicit(&p->active, 1, memory_order_release);
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
    atomic_init(&p->gen, 0);
    atomic_init(&p->n_sleeping, 0);
    atomic_init(&p->quit, 0);
    atomic_init(&p->next_task, 0);
    atomic_init(&p->active, 0);
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
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next_task, 0, memory_order_relaxed);
    atomic_store_explicit(&p->active, p->n_started, memory_order_relaxed);
    atomic_fetch_add(&p->gen, 1); /* seq_cst: publishes the fields above */
    if (atomic_load(&p->n_sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    take_tasks(p, 0);
    while (atomic_load_explicit(&p->active, memory_order_acquire) > 0) CPU_RELAX();
}
