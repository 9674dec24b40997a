/*
 * kv_rec.c - the recurrent state of hybrid models' linear-attention layers
 * inside the KV cache (kv.h, backend.h).
 *
 * A row's state is one slot of kv->rec.pool (every recurrent layer of the
 * row). Slots are reference counted like blocks: clone, extract and a
 * round's checkpoint share a slot; nothing ever writes a slot another
 * holder sees, because every forward writes a fresh one (rows[r].nxt,
 * taken in ember_kv_begin, journaled) and ember_kv_end swaps it in.
 *
 * A speculative round: spec_begin keeps a reference on the starting slot
 * (ckpt); the round's forwards log their inputs per position (rows[r].log,
 * backend.h); commit(k) keeps the state as it is when k is the round's
 * length, goes back to ckpt when k is 0, and otherwise rebuilds the state
 * after k positions from ckpt and the log (delta_replay). The log stays
 * with the row for its next round and goes with ember_kv_clear.
 */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "kv_internal.h"

int kv_rec_init(ember_kv *kv, const ember_kv_params *p, ember_error *err) {
    kv_rec *R = &kv->rec;
    int n = 0;
    for (int l = 0; p->recurrent && l < p->n_layers; l++) n += p->recurrent[l] ? 1 : 0;
    if (!n) return EMBER_OK;
    const ember_rec_shape *s = &p->rec;
    if (s->conv_k < 1 || s->conv_k > 64 || s->n_k_heads < 1 || s->n_v_heads < 1 || s->n_v_heads % s->n_k_heads ||
        s->k_dim < 1 || s->v_dim < 1 || s->k_dim > 4096 || s->v_dim > 4096 || s->n_v_heads > 4096 ||
        s->conv_dim != 2 * s->n_k_heads * s->k_dim + s->n_v_heads * s->v_dim)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "invalid recurrent state dimensions");
    R->shape = *s;
    R->index = ember_malloc((size_t)p->n_layers * sizeof *R->index);
    R->views = ember_calloc((size_t)n, sizeof *R->views);
    if (!R->index || !R->views) return ember_err(err, EMBER_ERR_NOMEM, "out of memory for the KV cache");
    const size_t lf = ember_rec_layer_floats(s), logf = ember_rec_log_floats(s);
    R->slot_floats = lf * (size_t)n;
    R->log_stride = logf * (size_t)n;
    int i = 0;
    for (int l = 0; l < p->n_layers; l++) {
        R->index[l] = p->recurrent[l] ? i : -1;
        if (!p->recurrent[l]) continue;
        R->views[i] = (ember_rec_layer){NULL, R->slot_floats, lf * (size_t)i, logf * (size_t)i, R->log_stride, *s};
        i++;
    }
    R->n_layers = n;
    R->pool.block_bytes = R->slot_floats * sizeof(float);
    return EMBER_OK;
}

void kv_rec_clear(ember_kv *kv, int r) {
    kv_row *row = &kv->rows[r];
    if (row->slot >= 0) kv_pool_unref(kv, &kv->rec.pool, row->slot);
    if (row->ckpt >= 0) kv_pool_unref(kv, &kv->rec.pool, row->ckpt);
    row->slot = row->ckpt = -1;
    ember_buffer_free(row->log_buf);
    row->log_buf = NULL;
    memset(&row->log, 0, sizeof row->log);
    row->log_cap = 0;
}

int kv_rec_spec_end(ember_kv *kv, int r, int k, ember_error *err) {
    kv_row *row = &kv->rows[r];
    if (!kv->rec.n_layers) return EMBER_OK;
    const int d = row->len - row->spec_base;
    kv_pool *P = &kv->rec.pool;
    if (k == d) { /* all kept: the state is right as it is */
        if (row->ckpt >= 0) kv_pool_unref(kv, P, row->ckpt);
    } else if (k == 0) { /* none kept: back to the round's start */
        if (row->slot >= 0) kv_pool_unref(kv, P, row->slot);
        row->slot = row->ckpt;
    } else {
        /* k of d: the state after k positions, from the start and the log */
        if (!row->log_buf || row->log_cap < k)
            return ember_err(err, EMBER_ERR_INTERNAL, "KV row %d: the round's log is missing", r);
        int32_t dst = row->slot;
        bool fresh = dst < 0 || P->ref[dst] > 1;
        if (fresh && (dst = kv_pool_take(kv, P)) < 0)
            return ember_err(err, EMBER_ERR_NOMEM, "the KV cache is full (rebuilding row %d's recurrent state)", r);
        int rc = kv->be->ops->delta_replay
                     ? kv->be->ops->delta_replay(kv->be, kv->rec.views, kv->rec.n_layers, row->ckpt, dst, &row->log,
                                                 k, err)
                     : ember_err(err, EMBER_ERR_UNSUPPORTED, "the %s backend cannot rebuild a recurrent state",
                                 kv->be->ops->name);
        if (rc) {
            if (fresh) kv_pool_unref(kv, P, dst);
            return rc;
        }
        if (fresh && row->slot >= 0) kv_pool_unref(kv, P, row->slot);
        row->slot = dst;
        if (row->ckpt >= 0) kv_pool_unref(kv, P, row->ckpt);
    }
    row->ckpt = -1;
    return EMBER_OK;
}

/* Grows row r's log to hold `need` positions (its entries kept). */
static int log_reserve(ember_kv *kv, kv_row *row, int need, ember_error *err) {
    if (need <= row->log_cap) return EMBER_OK;
    int cap = row->log_cap ? row->log_cap : 16;
    while (cap < need) cap *= 2;
    ember_buffer *b = NULL;
    ember_tensor t;
    const int64_t shape[1] = {(int64_t)((size_t)cap * kv->rec.log_stride)};
    int rc = ember_tensor_alloc(kv->be, &t, &b, EMBER_F32, 1, shape, err);
    if (!rc && row->log_buf)
        rc = kv->be->ops->copy(kv->be, &t, 0, &row->log, 0, (size_t)row->log_cap * kv->rec.log_stride * sizeof(float),
                               err);
    if (rc) {
        ember_buffer_free(b);
        return rc;
    }
    ember_buffer_free(row->log_buf);
    row->log_buf = b;
    row->log = t;
    row->log_cap = cap;
    return EMBER_OK;
}

int kv_rec_begin_row(ember_kv *kv, int r, int n, ember_error *err) {
    kv_row *row = &kv->rows[r];
    int rc;
    if (row->spec_base >= 0 && (rc = log_reserve(kv, row, row->len + n - row->spec_base, err))) return rc;
    int32_t id = kv_pool_take(kv, &kv->rec.pool);
    if (id < 0)
        return ember_err(err, EMBER_ERR_NOMEM, "the KV cache is full (%zu of %zu bytes in use; row %d needs a state)",
                         kv->used, kv->budget, r);
    if (kv_journal_push(kv, (kv_jent){J_REC_KIND, 0, r, 0, -1, id, {0}})) {
        kv_pool_unref(kv, &kv->rec.pool, id);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory for the KV journal");
    }
    row->nxt = id;
    bool spec = row->spec_base >= 0;
    kv->rec.refs[r] = (ember_rec_rowref){row->slot, id, spec ? &row->log : NULL, spec ? row->spec_base : 0,
                                         spec ? row->log_cap : 0};
    return EMBER_OK;
}

void kv_rec_commit(ember_kv *kv) {
    if (!kv->rec.n_layers) return;
    for (int t = 0; t < kv->batch_n; t++) {
        kv_row *row = &kv->rows[kv->batch_row[t]];
        if (row->nxt < 0) continue; /* this row was moved at its first token */
        if (row->slot >= 0) kv_pool_unref(kv, &kv->rec.pool, row->slot);
        row->slot = row->nxt;
        row->nxt = -1;
    }
}

void ember_kv_rec_map_for(const ember_kv *kv, int layer, const int32_t *row, const int32_t *pos, ember_rec_map *map) {
    *map = (ember_rec_map){&kv->rec.views[kv->rec.index[layer]], kv->rec.refs, kv->n_rows, row, pos};
}

int ember_kv_chunk_span(const ember_kv *kv) {
    return kv->rec.n_layers ? EMBER_DELTA_SPAN : 0;
}

size_t ember_kv_state_bytes(const ember_kv *kv) {
    return kv->rec.n_layers ? kv->rec.pool.block_bytes : 0;
}

int ember_kv_read_state(ember_kv *kv, int r, float *out, ember_error *err) {
    if (r < 0 || r >= kv->n_rows) return ember_err(err, EMBER_ERR_INVALID_ARG, "KV row %d does not exist", r);
    if (!kv->rec.n_layers) return EMBER_OK;
    const size_t bytes = kv->rec.pool.block_bytes;
    if (kv->rows[r].slot < 0) {
        memset(out, 0, bytes);
        return EMBER_OK;
    }
    return kv->be->ops->read(kv->be, &kv->rec.pool.t, (size_t)kv->rows[r].slot * bytes, out, bytes, err);
}
