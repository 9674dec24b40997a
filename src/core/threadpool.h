/*
 * threadpool.h - a fixed pool of worker threads for data-parallel kernels.
 *
 * ember_pool_run splits n_tasks among the calling thread and the workers and
 * returns once all are done. Tasks may run in any interleaving: a task must
 * write only its own part of the output, so results never depend on the
 * number of threads. They are claimed in increasing index order, though,
 * a few consecutive ones at a time while many are left, each thread running
 * its claim in order (the CPU backend's moe_token relies on it): a task may
 * wait for a task of a lower index, which has then been claimed by a
 * running thread already. Workers spin briefly between runs, then sleep on
 * a condition variable. One thread at a time may call ember_pool_run on a
 * pool.
 *
 * Profile (ember_pool_profile_start): every run is then timed by the caller
 * (wall) and every task by the thread that runs it (busy), keyed by the task
 * function's name; ember_pool_profile_write prints the table. Off by default:
 * then a run costs one extra pointer test per task.
 */
#ifndef EMBER_CORE_THREADPOOL_H
#define EMBER_CORE_THREADPOOL_H

#include "error.h"

#include <stdio.h>

typedef struct ember_pool ember_pool;

/* task: index in [0, n_tasks); thread: index in [0, ember_pool_size). */
typedef void (*ember_task_fn)(void *ctx, int task, int thread);

/* A pool running n_threads threads in all (the caller counts as one).
   Returns NULL and fills err on failure. Free with ember_pool_free. */
ember_pool *ember_pool_new(int n_threads, ember_error *err);
void ember_pool_free(ember_pool *p);
int ember_pool_size(const ember_pool *p);
/* Runs fn(ctx, t, thread) for t in [0, n_tasks); name keys the profile
   (ember_pool_run passes the function's own name). */
void ember_pool_run_named(ember_pool *p, int n_tasks, ember_task_fn fn, void *ctx, const char *name);
#define ember_pool_run(p, n_tasks, fn, ctx) ember_pool_run_named((p), (n_tasks), (fn), (ctx), #fn)

/* Starts timing runs (see above). Returns 0, or -1 (nothing changed) when out
   of memory. The profile lives until ember_pool_free. */
int ember_pool_profile_start(ember_pool *p);
/* Appends the profile to f: a line naming what (the caller's label) with
   the wall time in runs and between runs (the calling thread's own work,
   and idle time), then a markdown table, per task function: runs, tasks a
   run, wall time of its runs on the calling thread, its share, and busy /
   (wall x threads), the share of the pool's threads spent inside its
   tasks. Does nothing when the profile is off or f is NULL. */
void ember_pool_profile_write(const ember_pool *p, FILE *f, const char *what);

#endif
