/*
 * cuda_stub.c - the CUDA entry points of backend.h in a build without CUDA
 * (-DEMBER_CUDA=OFF, the default): each fails with EMBER_ERR_UNSUPPORTED,
 * so callers (--device cuda:N) get a one-line answer instead of a link
 * error. Owns nothing; safe from any thread.
 */
#include <stdio.h>

#include "backend/backend.h"

#define NO_CUDA_MSG "ember was built without CUDA (-DEMBER_CUDA=ON)"

int ember_backend_cuda_new(const ember_cuda_params *p, ember_backend **out, ember_error *err) {
    (void)p;
    *out = NULL;
    return ember_err(err, EMBER_ERR_UNSUPPORTED, NO_CUDA_MSG);
}

int ember_cuda_device_count(int *count, ember_error *err) {
    *count = 0;
    return ember_err(err, EMBER_ERR_UNSUPPORTED, NO_CUDA_MSG);
}

void *ember_backend_cuda_stream(const ember_backend *be) {
    (void)be;
    return NULL;
}

int ember_cuda_mem_info(const ember_backend *be, size_t *free_b, size_t *total_b, ember_error *err) {
    (void)be;
    *free_b = *total_b = 0;
    return ember_err(err, EMBER_ERR_UNSUPPORTED, NO_CUDA_MSG);
}

void ember_backend_describe(const ember_backend *be, char *buf, size_t n) {
    (void)be;
    if (n) snprintf(buf, n, "cpu");
}

void ember_cuda_graph_stats(const ember_backend *be, long *captured, long *replayed, long *again) {
    (void)be;
    *captured = *replayed = *again = 0;
}

long ember_cuda_qfuse_count(const ember_backend *be) {
    (void)be;
    return 0;
}
