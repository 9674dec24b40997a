/* backend.c - tensor helpers shared by every backend; see backend.h. */
#include "backend.h"

#include <string.h>

#include "core/util.h"

static int shape_bytes(ember_dtype dtype, int ndim, const int64_t *shape, size_t *bytes,
                       ember_error *err) {
    if (ndim < 0 || ndim > EMBER_MAX_DIMS)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "tensor rank %d out of range", ndim);
    size_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || !ember_mul_ok(n, (size_t)shape[i], &n))
            return ember_err(err, EMBER_ERR_INVALID_ARG, "tensor shape overflows");
    }
    if (!ember_dtype_nbytes(dtype, n, bytes))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "tensor of %zu %s elements has no valid size",
                         n, ember_dtype_get(dtype)->name);
    return EMBER_OK;
}

int ember_tensor_view(ember_tensor *t, ember_buffer *buf, size_t offset, ember_dtype dtype, int ndim,
                      const int64_t *shape, ember_error *err) {
    size_t bytes, end;
    int rc = shape_bytes(dtype, ndim, shape, &bytes, err);
    if (rc) return rc;
    if (!ember_add_ok(offset, bytes, &end) || (buf && end > buf->size))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "tensor view [%zu, +%zu) outside its buffer",
                         offset, bytes);
    *t = (ember_tensor){.dtype = dtype, .ndim = ndim, .buf = buf, .offset = offset, .nbytes = bytes};
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    return EMBER_OK;
}

int ember_tensor_alloc(ember_backend *be, ember_tensor *t, ember_buffer **buf, ember_dtype dtype,
                       int ndim, const int64_t *shape, ember_error *err) {
    *buf = NULL;
    size_t bytes;
    int rc = shape_bytes(dtype, ndim, shape, &bytes, err);
    if (rc) return rc;
    rc = be->ops->buffer_alloc(be, bytes, buf, err);
    if (rc) return rc;
    rc = ember_tensor_view(t, *buf, 0, dtype, ndim, shape, err);
    if (rc) {
        ember_buffer_free(*buf);
        *buf = NULL;
    }
    return rc;
}

size_t ember_rec_layer_floats(const ember_rec_shape *s) {
    return (size_t)(s->conv_k - 1) * (size_t)s->conv_dim + (size_t)s->n_v_heads * (size_t)s->k_dim * (size_t)s->v_dim;
}

size_t ember_rec_log_floats(const ember_rec_shape *s) {
    return (size_t)s->conv_dim + (size_t)s->n_k_heads * (size_t)s->k_dim + (size_t)s->n_v_heads * (size_t)s->v_dim +
           2 * (size_t)s->n_v_heads;
}

bool ember_rec_layer_ok(const ember_rec_layer *L) {
    const ember_rec_shape *s = &L->s;
    return L->pool && L->pool->buf && s->conv_k >= 1 && s->n_k_heads >= 1 && s->n_v_heads >= s->n_k_heads &&
           s->n_v_heads % s->n_k_heads == 0 && s->k_dim >= 1 && s->v_dim >= 1 &&
           s->conv_dim == 2 * s->n_k_heads * s->k_dim + s->n_v_heads * s->v_dim && L->slot_floats &&
           L->off + ember_rec_layer_floats(s) <= L->slot_floats && L->log_off + ember_rec_log_floats(s) <= L->log_stride;
}

bool ember_rec_slot_ok(const ember_rec_layer *L, int32_t slot) {
    return slot >= 0 && (size_t)slot < L->pool->nbytes / sizeof(float) / L->slot_floats;
}

int ember_delta_net_check(const ember_tensor *out, const ember_tensor *x, const ember_tensor *b, const ember_tensor *a,
                          const ember_delta_w *w, const ember_rec_map *map, ember_error *err) {
    const ember_rec_layer *L = map->layer;
    if (!L || !ember_rec_layer_ok(L)) return ember_err(err, EMBER_ERR_INVALID_ARG, "delta_net: bad state layout");
    const ember_rec_shape *s = &L->s;
    const ember_tensor *decay = w->a_neg ? w->a_neg : w->a_log;
    const int64_t T = ember_tensor_rows(x);
    if (T < 1 || T > INT32_MAX || ember_tensor_row_len(x) != s->conv_dim || ember_tensor_rows(b) != T ||
        ember_tensor_row_len(b) != s->n_v_heads || ember_tensor_rows(a) != T || ember_tensor_row_len(a) != s->n_v_heads ||
        ember_tensor_rows(out) != T || ember_tensor_row_len(out) != (int64_t)s->n_v_heads * s->v_dim ||
        ember_tensor_nelem(w->conv) != (int64_t)s->conv_dim * s->conv_k || ember_tensor_nelem(decay) != s->n_v_heads ||
        ember_tensor_nelem(w->dt_bias) != s->n_v_heads)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "delta_net: shapes do not match the state's");
    for (int64_t t = 0; t < T; t++) {
        const int r = map->row[t];
        if (r < 0 || r >= map->n_refs)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "delta_net: row %d outside the map", r);
        const ember_rec_rowref *ref = &map->refs[r];
        if (!ember_rec_slot_ok(L, ref->dst) || (ref->src >= 0 && !ember_rec_slot_ok(L, ref->src)) ||
            ref->src == ref->dst)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "delta_net: row %d has bad state slots", r);
        if (!ref->log) continue;
        const int p = map->pos[t] - ref->log_base;
        if (p < 0 || p >= ref->log_cap || ref->log->dtype != EMBER_F32 ||
            (size_t)ref->log_cap * L->log_stride * sizeof(float) > ref->log->nbytes)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "delta_net: row %d position %d is outside its log", r,
                             map->pos[t]);
    }
    return EMBER_OK;
}

int ember_delta_replay_check(const ember_rec_layer *layers, int n_layers, int32_t src, int32_t dst,
                             const ember_tensor *log, int n, ember_error *err) {
    if (n_layers < 1 || !layers || !log || !log->buf || log->dtype != EMBER_F32 || n < 0)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "delta_replay: bad arguments");
    const size_t lf = ember_rec_layer_floats(&layers[0].s), logf = ember_rec_log_floats(&layers[0].s);
    for (int l = 0; l < n_layers; l++) /* the layout kv_rec.c makes: equal layers, one after another */
        if (!ember_rec_layer_ok(&layers[l]) || !ember_rec_slot_ok(&layers[l], dst) ||
            (src >= 0 && !ember_rec_slot_ok(&layers[l], src)) || src == dst ||
            (size_t)n * layers[l].log_stride * sizeof(float) > log->nbytes || layers[l].pool != layers[0].pool ||
            layers[l].off != lf * (size_t)l || layers[l].log_off != logf * (size_t)l ||
            memcmp(&layers[l].s, &layers[0].s, sizeof layers[0].s))
            return ember_err(err, EMBER_ERR_INVALID_ARG, "delta_replay: bad state or log");
    return EMBER_OK;
}

int ember_rows_scaled_check(const ember_tensor *dst, const ember_tensor *src, const int32_t *ids, int n,
                            ember_error *err) {
    const int64_t D = ember_tensor_row_len(dst), R = ember_tensor_rows(dst);
    if (n < 0 || ember_tensor_row_len(src) != D || ember_tensor_rows(src) < n)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "add_rows_scaled: src does not hold %d rows of %lld", n,
                         (long long)D);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= R)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "add_rows_scaled: row %d is outside [0, %lld)", ids[i],
                             (long long)R);
    return EMBER_OK;
}
