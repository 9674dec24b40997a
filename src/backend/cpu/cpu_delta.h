/*
 * cpu_delta.h - the CPU's gated DeltaNet ops (backend.h: delta_net,
 * delta_replay) on host memory; cpu_backend.c checks the tensors and calls
 * these. Internal to the CPU backend.
 */
#ifndef EMBER_CPU_DELTA_H
#define EMBER_CPU_DELTA_H

#include "backend/backend.h"
#include "core/threadpool.h"

/* Host arguments of one delta_net call. slots: the pool's floats; logs[r]:
   the log floats of row r in a speculative round (NULL otherwise). */
typedef struct cpu_delta_args {
    float *out;           /* [T, Hv Dv] */
    const float *x;       /* [T, C] */
    const float *b, *a;   /* [T, Hv] each */
    const float *conv_w;  /* [C, K] */
    const float *a_log, *dt_bias; /* [Hv] */
    float *slots;
    float *const *logs;   /* [n_refs] */
    const ember_rec_map *map;
    int T;
    const float *a_neg;   /* [Hv] -exp(A_log) precomputed (GGUF's ssm_a), or NULL: from a_log */
} cpu_delta_args;

/* Runs delta_net on the pool. *scratch (*cap bytes) is the caller's area,
   grown with realloc when too small (the caller frees it). Returns EMBER_OK
   or EMBER_ERR_NOMEM (then *scratch is unchanged). */
int cpu_delta_run(ember_pool *pool, const cpu_delta_args *a, void **scratch, size_t *cap, ember_error *err);

/* delta_replay on host memory: slots as above, log the row's log floats. */
int cpu_delta_rebuild(const ember_rec_layer *layers, int n_layers, float *slots, int32_t src, int32_t dst,
                     const float *log, int n, ember_error *err);

#endif
