/* test_threadpool.c - every task runs exactly once, for many runs and sizes. */
#include <stdatomic.h>

#include "core/threadpool.h"
#include "test.h"

typedef struct ctx {
    atomic_int *hits;
    int n_threads;
    atomic_int bad_thread;
} ctx;

static void task(void *p, int t, int thread) {
    ctx *c = p;
    atomic_fetch_add(&c->hits[t], 1);
    if (thread < 0 || thread >= c->n_threads) atomic_store(&c->bad_thread, 1);
}

int main(void) {
    for (int nt = 1; nt <= 4; nt++) {
        ember_error err = {0};
        ember_pool *p = ember_pool_new(nt, &err);
        CHECK(p != NULL);
        CHECK(ember_pool_size(p) == nt);
        atomic_int hits[300];
        ctx c = {hits, nt, 0};
        for (int run = 0; run < 600; run++) {
            int n = run % 300;
            for (int i = 0; i < n; i++) atomic_store(&hits[i], 0);
            ember_pool_run(p, n, task, &c);
            for (int i = 0; i < n; i++) CHECKF(atomic_load(&hits[i]) == 1, "threads %d run %d task %d", nt, run, i);
        }
        CHECK(!atomic_load(&c.bad_thread));
        ember_pool_free(p);
    }
    ember_error err = {0};
    CHECK(ember_pool_new(100000, &err) == NULL && err.code == EMBER_ERR_INVALID_ARG);
    return test_done();
}
