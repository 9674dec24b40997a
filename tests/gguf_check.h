/*
 * gguf_check.h - checks on a GGUF file shared by the GGUF family tests
 * (test_gguf_moe.c, test_gguf_hybrid.c, test_gguf_gemma4.c,
 * test_quant_models.c): a tensor's presence and shape, an architecture's
 * u32 key, and randomly mutated copies of a file loading or refused
 * cleanly. Each failed check is counted through test.h's CHECKV / CHECKF
 * and says which file, tensor or key.
 */
#ifndef EMBER_TEST_GGUF_CHECK_H
#define EMBER_TEST_GGUF_CHECK_H

#include <stdint.h>
#include <stdio.h>

#include "backend/backend.h"
#include "fixture.h"
#include "formats/gguf.h"
#include "model/model.h"
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

/* `iters` mutated copies of the GGUF file at path (1 .. max_flips bytes
   before the tensor data set at random from seed, every tenth copy also
   truncated), each parsed and loaded on a one-thread CPU backend: it loads
   or is refused with a one-line message, never a crash (the sanitizer
   build checks the memory accesses), and at least one copy is refused.
   Prints the counts under `what`. */
static inline void gx_mutations(const char *path, const char *what, uint64_t seed, int iters, int max_flips) {
    size_t n = 0;
    unsigned char *orig = (unsigned char *)fx_slurp(path, &n), *buf = orig ? malloc(n) : NULL;
    ember_gguf *g0 = NULL;
    ember_error err = {0};
    if (!CHECKV(buf && ember_gguf_parse("x.gguf", orig, n, &g0, &err) == EMBER_OK, "%s: %s", path, err.msg)) {
        free(orig);
        free(buf);
        return;
    }
    const size_t header = g0->data_offset; /* the metadata and tensor infos */
    ember_gguf_free(g0);
    uint64_t rng = seed;
    int loaded = 0, refused = 0;
    for (int it = 0; it < iters; it++) {
        memcpy(buf, orig, n);
        for (int k = 0; k <= it % max_flips; k++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            buf[(size_t)(rng >> 33) % header] = (unsigned char)(rng >> 13);
        }
        const size_t len = it % 10 == 9 ? (size_t)(rng >> 40) % n : n;
        ember_gguf *f = NULL;
        if (ember_gguf_parse("mut.gguf", buf, len, &f, &err) != EMBER_OK) {
            refused++;
            continue;
        }
        ember_backend *be = NULL;
        ember_cpu_params cp = {1, EMBER_ISA_AUTO, true, {0}};
        CHECK(ember_backend_cpu_new(&cp, &be, &err) == EMBER_OK);
        ember_model_config cfg;
        ember_llm *m = NULL;
        if (ember_llm_from_gguf(f, be, &cfg, &m, &err) == EMBER_OK) {
            loaded++;
        } else {
            refused++;
            CHECKF(err.msg[0] && !strchr(err.msg, '\n'), "bad message: %s", err.msg);
        }
        ember_llm_free(m);
        ember_backend_free(be);
    }
    fprintf(stderr, "mutated %s: %d loaded, %d refused\n", what, loaded, refused);
    CHECKF(refused > 0, "%s: every mutated copy loaded", what);
    free(orig);
    free(buf);
}

#endif
