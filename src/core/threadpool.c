/*
 * threadpool.c - see threadpool.h.
 *
 * Protocol. One 64-bit atomic word `work` describes the current run:
 *
 *     bits 63..40  generation (24 bits, wraps)
 *     bits 39..20  n_tasks    (20 bits)
 *     bits 19..0   next task  (20 bits)
 *
 * The runner publishes fn and ctx, zeroes `done`, then stores (gen + 1,
 * n_tasks, 0) into `work` (and the generation into `pub`, the word idle
 * workers watch). Anyone (runner and workers) claims tasks [t, t + k) by a
 * compare-and-swap of the whole word from (g, n, t) to (g, n, t + k), which
 * it tries only when t < n, with k = 1 + (n - t) / (CLAIM_SHARE x threads)
 * (so k <= n - t: one task a claim once fewer are left than a few a
 * thread); it then reads fn and ctx and runs them in order. When it finds
 * nothing left it adds the count it ran to `done`, once. The runner returns
 * once `done` reaches n_tasks.
 *
 * Why this is safe:
 * - The bound n and the claim counter live in the same word, so a claim is
 *   always checked against the bound of the run it claims from. (An earlier
 *   version kept n_tasks in a separate field: a worker that read an old
 *   word and a new n_tasks could claim a task past the end of a finished
 *   run while the next one was being published.)
 * - A successful claim means the word was (g, n, t) with t < n at that
 *   instant: task t of the published run was unclaimed, so `done` < n and
 *   the runner is still waiting; it cannot publish another run (and change
 *   fn, ctx or `done`) before this thread's add, which comes after its
 *   last claim of the run. Even if the generation
 *   wrapped while a worker slept between its load and its compare-and-swap,
 *   an identical word still means "task t of the run now published".
 * - A run waits only for tasks that were actually claimed: a worker the OS
 *   has not scheduled yet (the machine is shared) never holds up a run; it
 *   later finds nothing left to take.
 * - The generation only tells an idle worker that something new was
 *   published. Idle workers spin briefly, then sleep on a mutex/condvar
 *   pair; `n_sleeping` and `work` are sequentially consistent, so either the
 *   runner sees a sleeper and broadcasts, or the sleeper sees the new word.
 * Runs of more than TP_MAX_TASKS tasks are split into consecutive runs.
 *
 * Profile: `prof` is set by the caller thread between runs and read by the
 * workers after they claim a task (the word's seq_cst store published it).
 * Each thread adds its tasks' time to its own slot of prof->busy (one cache
 * line each) before its `done` increment; the runner, once `done` reaches n
 * (acquire), sums and clears the slots. Only the runner touches the keys.
 */
#define _POSIX_C_SOURCE 200809L
#include "threadpool.h"
#include "alloc.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

#define SPIN_ITERS 20000
#define CLAIM_SHARE 4 /* a claim takes 1 + left / (CLAIM_SHARE x threads) tasks */

#define TP_TASK_BITS 20
#define TP_MAX_TASKS ((1 << TP_TASK_BITS) - 1)
#define TP_FIELD ((uint64_t)TP_MAX_TASKS)
#define TP_GEN(w) ((uint32_t)((w) >> (2 * TP_TASK_BITS)))
#define TP_N(w) ((uint32_t)(((w) >> TP_TASK_BITS) & TP_FIELD))
#define TP_NEXT(w) ((uint32_t)((w)&TP_FIELD))
#define TP_GEN_MASK ((1u << (64 - 2 * TP_TASK_BITS)) - 1u)

#define PROF_KEYS 64
#define PROF_SLOT 8 /* uint64_t per busy slot: one cache line */

typedef struct pool_prof_key {
    const char *name; /* the task function's name (a string literal) */
    uint64_t runs, tasks, wall_ns, busy_ns;
    uint64_t inline_runs; /* runs on the calling thread alone (one task, or no workers) */
} pool_prof_key;

typedef struct pool_prof {
    pool_prof_key key[PROF_KEYS]; /* [n_keys]; names past PROF_KEYS go to the last */
    int n_keys;
    uint64_t gap_ns;      /* the runner's time between runs */
    uint64_t last_end_ns; /* when the last run ended (0: none yet) */
    uint64_t *busy;       /* [n_threads * PROF_SLOT]: thread i's task time in this run at busy[i * PROF_SLOT] */
} pool_prof;

struct ember_pool {
    int n_threads;
    pthread_t *threads;
    int n_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* Each of the three words the runs touch on its own cache line: the
       claims' compare-and-swaps on `work`, the finishing threads' adds to
       `done` and the idle workers' reads of `pub` would otherwise take the
       same line from each other on every task (a 16-core Xeon, runs of 4
       to 128 tiny tasks: 2.5-13 us a run before, 1.5-10 after;
       bench/pool_bench, bench/RESULTS.md). */
    _Alignas(64) _Atomic uint64_t work; /* (generation, n_tasks, next task), see above */
    _Alignas(64) atomic_uint done;      /* tasks finished in the current run */
    _Alignas(64) atomic_uint pub;       /* the generation last published (after `work`): what spinners watch */
    _Alignas(64) atomic_int n_sleeping;
    atomic_int quit;
    uint32_t gen; /* the runner's last generation; only the runner touches it */
    ember_task_fn fn;
    void *ctx;
    pool_prof *prof; /* NULL unless ember_pool_profile_start */
};

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

typedef struct worker_arg {
    ember_pool *p;
    int index;
} worker_arg;

/* Claims and runs tasks of whatever run is published until none is left,
   then adds the count it ran to `done` at once (one contended add a thread
   a run, not one a task: the runner cannot publish the next run before it,
   so the claims stay checked against the run they belong to). Returns the
   generation of the last word it looked at. */
static uint32_t take_tasks(ember_pool *p, int thread) {
    uint64_t w = atomic_load_explicit(&p->work, memory_order_acquire);
    unsigned ran = 0;
    for (;;) {
        if (TP_NEXT(w) >= TP_N(w)) {
            if (ran) atomic_fetch_add_explicit(&p->done, ran, memory_order_release);
            return TP_GEN(w);
        }
        /* a share of what is left (at least one task), so that a run of
           many small tasks is not one contended claim a task */
        const uint32_t t = TP_NEXT(w), k = 1 + (TP_N(w) - t) / (CLAIM_SHARE * (uint32_t)p->n_threads);
        /* acquire on success: fn and ctx were stored before the word */
        if (!atomic_compare_exchange_weak_explicit(&p->work, &w, w + k, memory_order_acquire,
                                                   memory_order_acquire))
            continue; /* w now holds the current word */
        uint64_t t0 = p->prof ? now_ns() : 0;
        for (uint32_t i = t; i < t + k; i++) p->fn(p->ctx, (int)i, thread);
        if (p->prof) p->prof->busy[(size_t)thread * PROF_SLOT] += now_ns() - t0;
        ran += k;
        w = atomic_load_explicit(&p->work, memory_order_acquire);
    }
}

static void *worker_main(void *argp) {
    worker_arg *a = argp;
    ember_pool *p = a->p;
    int index = a->index;
    free(a);
    uint32_t seen = 0; /* gen at pool creation: a run may start before this thread does */
    for (;;) {
        int spins = 0;
        while (atomic_load_explicit(&p->pub, memory_order_acquire) == seen && !atomic_load(&p->quit)) {
            if (++spins < SPIN_ITERS) {
                CPU_RELAX();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->n_sleeping, 1);
            while (TP_GEN(atomic_load(&p->work)) == seen && !atomic_load(&p->quit))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->n_sleeping, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load(&p->quit)) break;
        seen = take_tasks(p, index);
    }
    return NULL;
}

ember_pool *ember_pool_new(int n_threads, ember_error *err) {
    if (n_threads < 1) n_threads = 1;
    if (n_threads > 1024) {
        ember_err(err, EMBER_ERR_INVALID_ARG, "thread count %d is too large (max 1024)", n_threads);
        return NULL;
    }
    ember_pool *p = ember_aligned_alloc(_Alignof(ember_pool), sizeof *p); /* its words' cache lines */
    if (p) memset(p, 0, sizeof *p);
    if (!p) {
        ember_err(err, EMBER_ERR_NOMEM, "out of memory creating the thread pool");
        return NULL;
    }
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    atomic_init(&p->work, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->pub, 0);
    atomic_init(&p->n_sleeping, 0);
    atomic_init(&p->quit, 0);
    if (n_threads > 1) {
        p->threads = ember_calloc((size_t)n_threads - 1, sizeof *p->threads);
        if (!p->threads) {
            ember_pool_free(p);
            ember_err(err, EMBER_ERR_NOMEM, "out of memory creating the thread pool");
            return NULL;
        }
        for (int i = 1; i < n_threads; i++) {
            worker_arg *a = ember_malloc(sizeof *a);
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
    if (p->prof) free(p->prof->busy);
    free(p->prof);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}

int ember_pool_size(const ember_pool *p) {
    return p ? p->n_threads : 1;
}

/* One published run of n (1 <= n <= TP_MAX_TASKS) tasks. */
static void run_once(ember_pool *p, int n, ember_task_fn fn, void *ctx) {
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    p->gen = (p->gen + 1) & TP_GEN_MASK;
    uint64_t w = ((uint64_t)p->gen << (2 * TP_TASK_BITS)) | ((uint64_t)n << TP_TASK_BITS);
    atomic_store(&p->work, w); /* seq_cst: publishes fn, ctx and done */
    atomic_store_explicit(&p->pub, p->gen, memory_order_release);
    if (atomic_load(&p->n_sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    take_tasks(p, 0);
    while (atomic_load_explicit(&p->done, memory_order_acquire) < (unsigned)n) CPU_RELAX();
}

typedef struct chunk_job {
    ember_task_fn fn;
    void *ctx;
    int base;
} chunk_job;

static void chunk_task(void *ctx, int t, int thread) {
    chunk_job *j = ctx;
    j->fn(j->ctx, j->base + t, thread);
}

/* The runs of ember_pool_run_named, unprofiled. */
static void pool_run(ember_pool *p, int n_tasks, ember_task_fn fn, void *ctx) {
    if (!p || p->n_started == 0 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    if (n_tasks <= TP_MAX_TASKS) {
        run_once(p, n_tasks, fn, ctx);
        return;
    }
    for (int base = 0; base < n_tasks; base += TP_MAX_TASKS) {
        int n = n_tasks - base < TP_MAX_TASKS ? n_tasks - base : TP_MAX_TASKS;
        chunk_job j = {fn, ctx, base};
        run_once(p, n, chunk_task, &j);
    }
}

/* The profile's key for name: found, or added (the last one once full). */
static pool_prof_key *prof_key(pool_prof *pf, const char *name) {
    for (int i = 0; i < pf->n_keys; i++)
        if (pf->key[i].name == name || !strcmp(pf->key[i].name, name)) return &pf->key[i];
    if (pf->n_keys == PROF_KEYS) return &pf->key[PROF_KEYS - 1];
    pf->key[pf->n_keys].name = name;
    return &pf->key[pf->n_keys++];
}

void ember_pool_run_named(ember_pool *p, int n_tasks, ember_task_fn fn, void *ctx, const char *name) {
    if (n_tasks <= 0) return;
    pool_prof *pf = p ? p->prof : NULL;
    if (!pf) {
        pool_run(p, n_tasks, fn, ctx);
        return;
    }
    const uint64_t t0 = now_ns();
    if (pf->last_end_ns) pf->gap_ns += t0 - pf->last_end_ns;
    pool_run(p, n_tasks, fn, ctx);
    const uint64_t t1 = now_ns();
    pool_prof_key *k = prof_key(pf, name);
    k->runs++;
    k->tasks += (uint64_t)n_tasks;
    k->wall_ns += t1 - t0;
    if (p->n_started == 0 || n_tasks == 1) {
        k->busy_ns += t1 - t0; /* ran inline, not through take_tasks */
        k->inline_runs++;
    } else {
        for (int i = 0; i < p->n_threads; i++) {
            k->busy_ns += pf->busy[(size_t)i * PROF_SLOT];
            pf->busy[(size_t)i * PROF_SLOT] = 0;
        }
    }
    pf->last_end_ns = t1;
}

int ember_pool_profile_start(ember_pool *p) {
    if (!p || p->prof) return 0;
    pool_prof *pf = ember_calloc(1, sizeof *pf);
    uint64_t *busy = ember_calloc((size_t)p->n_threads * PROF_SLOT, sizeof *busy);
    if (!pf || !busy) {
        free(pf);
        free(busy);
        return -1;
    }
    pf->busy = busy;
    p->prof = pf;
    return 0;
}

void ember_pool_profile_write(const ember_pool *p, FILE *f, const char *what) {
    const pool_prof *pf = p ? p->prof : NULL;
    if (!pf || !f) return;
    uint64_t wall = 0;
    for (int i = 0; i < pf->n_keys; i++) wall += pf->key[i].wall_ns;
    fprintf(f, "%s, %d threads: pool runs %.3f ms, between runs %.3f ms\n\n", what ? what : "pool", p->n_threads,
            1e-6 * (double)wall, 1e-6 * (double)pf->gap_ns);
    fprintf(f, "| task function | runs | tasks / run | wall ms | us / run | share of runs | busy / (wall x threads) | "
               "inline runs |\n"
               "| --- | --- | --- | --- | --- | --- | --- | --- |\n");
    bool shown[PROF_KEYS] = {false};
    for (int n = 0; n < pf->n_keys; n++) {
        int b = -1;
        for (int i = 0; i < pf->n_keys; i++)
            if (!shown[i] && (b < 0 || pf->key[i].wall_ns > pf->key[b].wall_ns)) b = i;
        shown[b] = true;
        const pool_prof_key *k = &pf->key[b];
        const double w = (double)k->wall_ns;
        fprintf(f, "| %s | %llu | %.1f | %.3f | %.2f | %.1f%% | %.0f%% | %llu |\n", k->name,
                (unsigned long long)k->runs, (double)k->tasks / (double)k->runs, 1e-6 * w, 1e-3 * w / (double)k->runs,
                wall ? 100.0 * w / (double)wall : 0.0, w > 0 ? 100.0 * (double)k->busy_ns / (w * p->n_threads) : 0.0,
                (unsigned long long)k->inline_runs);
    }
    fputc('\n', f);
}
