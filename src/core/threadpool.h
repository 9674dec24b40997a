/*
 * threadpool.h - a fixed pool of worker threads for data-parallel kernels.
 *
 * ember_pool_run splits n_tasks among the calling thread and the workers and
 * returns once all are done. Tasks may run in any interleaving: a task must
 * write only its own part of the output, so results never depend on the
 * number of threads. They are claimed in increasing index order, though
 * (the CPU backend's moe_token relies on it): a task may wait for a task of
 * a lower index, which has then been claimed by a running thread already. Workers spin briefly between runs, then sleep on a condition
 * variable. One thread at a time may call ember_pool_run on a pool.
 */
#ifndef EMBER_CORE_THREADPOOL_H
#define EMBER_CORE_THREADPOOL_H

#include "error.h"

typedef struct ember_pool ember_pool;

/* task: index in [0, n_tasks); thread: index in [0, ember_pool_size). */
typedef void (*ember_task_fn)(void *ctx, int task, int thread);

/* A pool running n_threads threads in all (the caller counts as one).
   Returns NULL and fills err on failure. Free with ember_pool_free. */
ember_pool *ember_pool_new(int n_threads, ember_error *err);
void ember_pool_free(ember_pool *p);
int ember_pool_size(const ember_pool *p);
void ember_pool_run(ember_pool *p, int n_tasks, ember_task_fn fn, void *ctx);

#endif
