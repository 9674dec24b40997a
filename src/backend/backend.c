/* backend.c - tensor helpers shared by every backend; see backend.h. */
#include "backend.h"

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
