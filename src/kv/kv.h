/*
 * kv.h - per-layer attention state, held as rows (one per sequence).
 *
 * This first kind is the dense cache: for each layer, K and V tensors of
 * shape [rows, kv_heads, n_ctx, head_dim] (f32) in backend memory, and per
 * row the number of positions filled. A row's positions are always the
 * prefix [0, len): forward passes append, trim rolls back, clear empties.
 * Sliding-window layers keep every position (the window is a mask).
 *
 * Ownership: the cache owns its buffers; ember_kv_free releases them.
 */
#ifndef EMBER_KV_H
#define EMBER_KV_H

#include "backend/backend.h"

typedef struct ember_kv {
    ember_backend *be;
    int n_layers, n_rows, n_ctx, n_kv_heads, head_dim;
    ember_tensor *k, *v;   /* [n_layers], each [n_rows, n_kv_heads, n_ctx, head_dim] */
    ember_buffer **bufs;   /* [2 * n_layers] */
    int *len;              /* [n_rows] filled positions per row */
} ember_kv;

/* Bytes a dense cache of these dimensions takes (0 on overflow). */
size_t ember_kv_bytes(int n_layers, int n_rows, int n_ctx, int n_kv_heads, int head_dim);

int ember_kv_new(ember_backend *be, int n_layers, int n_rows, int n_ctx, int n_kv_heads, int head_dim,
                 ember_kv **out, ember_error *err);
void ember_kv_free(ember_kv *kv);

/* Forgets every position of row r. */
void ember_kv_clear(ember_kv *kv, int r);
/* Keeps the first n positions of row r (n <= len). */
int ember_kv_trim(ember_kv *kv, int r, int n, ember_error *err);

#endif
