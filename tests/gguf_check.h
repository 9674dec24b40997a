/*
 * gguf_check.h - checks on a GGUF file shared by the GGUF family tests
 * (test_gguf_moe.c, test_gguf_hybrid.c): a tensor's presence and shape, and
 * an architecture's u32 key. Each failed check is counted through test.h's
 * CHECKV / CHECKF and says which file, tensor or key.
 */
#ifndef EMBER_TEST_GGUF_CHECK_H
#define EMBER_TEST_GGUF_CHECK_H

#include <stdint.h>
#include <stdio.h>

#include "formats/gguf.h"
#include "test.h"

/* The tensor `name` of g when it has row-major shape[0..ndim), else NULL
 * after a failed check naming the file, the tensor and the shape it has. */
static inline const ember_gguf_tensor *gx_tensor(const ember_gguf *g, const char *name, int ndim,
                                                 const int64_t *shape) {
    const ember_gguf_tensor *t = ember_gguf_find_tensor(g, name);
    if (!CHECKV(t != NULL, "%s: no tensor %s", g->path, name)) return NULL;
    bool same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!CHECKV(same, "%s: %s has the wrong shape (ndim %d: %lld, %lld, %lld)", g->path, name, t->ndim,
                (long long)t->shape[0], (long long)t->shape[1], (long long)t->shape[2]))
        return NULL;
    return t;
}

/* The u32 key "<arch>.<k>" of g; 0 after a failed check (missing or not a u32). */
static inline uint32_t gx_key_u32(const ember_gguf *g, const char *arch, const char *k) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, k);
    uint32_t u = 0;
    ember_error err = {0};
    CHECKF(ember_gguf_get_u32(g, key, &u, &err) == EMBER_OK, "%s", err.msg);
    return u;
}

#endif
