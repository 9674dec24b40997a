/* kv_dense.c - the dense per-layer cache; see kv.h. */
#include <stdlib.h>

#include "core/util.h"
#include "kv.h"

size_t ember_kv_bytes(int n_layers, int n_rows, int n_ctx, int n_kv_heads, int head_dim) {
    size_t b = 4 * 2;
    const int dims[] = {n_layers, n_rows, n_ctx, n_kv_heads, head_dim};
    for (size_t i = 0; i < EMBER_ARRAY_LEN(dims); i++)
        if (dims[i] < 0 || !ember_mul_ok(b, (size_t)dims[i], &b)) return 0;
    return b;
}

void ember_kv_free(ember_kv *kv) {
    if (!kv) return;
    if (kv->bufs)
        for (int i = 0; i < 2 * kv->n_layers; i++) ember_buffer_free(kv->bufs[i]);
    free(kv->bufs);
    free(kv->k);
    free(kv->v);
    free(kv->len);
    free(kv);
}

int ember_kv_new(ember_backend *be, int n_layers, int n_rows, int n_ctx, int n_kv_heads, int head_dim,
                 ember_kv **out, ember_error *err) {
    *out = NULL;
    if (n_layers < 1 || n_rows < 1 || n_ctx < 1 || n_kv_heads < 1 || head_dim < 1 ||
        ember_kv_bytes(n_layers, n_rows, n_ctx, n_kv_heads, head_dim) == 0)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "invalid KV cache dimensions");
    ember_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return ember_err(err, EMBER_ERR_NOMEM, "out of memory for the KV cache");
    *kv = (ember_kv){.be = be, .n_layers = n_layers, .n_rows = n_rows, .n_ctx = n_ctx, .n_kv_heads = n_kv_heads,
                     .head_dim = head_dim};
    kv->k = calloc((size_t)n_layers, sizeof *kv->k);
    kv->v = calloc((size_t)n_layers, sizeof *kv->v);
    kv->bufs = calloc((size_t)n_layers * 2, sizeof *kv->bufs);
    kv->len = calloc((size_t)n_rows, sizeof *kv->len);
    if (!kv->k || !kv->v || !kv->bufs || !kv->len) {
        ember_kv_free(kv);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory for the KV cache");
    }
    const int64_t shape[4] = {n_rows, n_kv_heads, n_ctx, head_dim};
    for (int l = 0; l < n_layers; l++) {
        int rc = ember_tensor_alloc(be, &kv->k[l], &kv->bufs[2 * l], EMBER_F32, 4, shape, err);
        if (!rc) rc = ember_tensor_alloc(be, &kv->v[l], &kv->bufs[2 * l + 1], EMBER_F32, 4, shape, err);
        if (rc) {
            ember_kv_free(kv);
            if (err)
                ember_err_prefix(err, "KV cache (%zu bytes): ",
                                 ember_kv_bytes(n_layers, n_rows, n_ctx, n_kv_heads, head_dim));
            return rc;
        }
    }
    *out = kv;
    return EMBER_OK;
}

void ember_kv_clear(ember_kv *kv, int r) {
    if (r >= 0 && r < kv->n_rows) kv->len[r] = 0;
}

int ember_kv_trim(ember_kv *kv, int r, int n, ember_error *err) {
    if (r < 0 || r >= kv->n_rows || n < 0 || n > kv->len[r])
        return ember_err(err, EMBER_ERR_INVALID_ARG, "cannot trim row %d to %d positions", r, n);
    kv->len[r] = n;
    return EMBER_OK;
}
