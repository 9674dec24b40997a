/*
 * tensor.h - a typed, shaped view into a backend buffer.
 *
 * Shapes are row-major like numpy and safetensors: shape[0] is outermost,
 * shape[ndim-1] is contiguous. Tensors are always contiguous. A tensor does
 * not own its buffer: the buffer's owner (model weights, run state, cache)
 * frees it, and only the backend that made the buffer touches its memory.
 */
#ifndef EMBER_CORE_TENSOR_H
#define EMBER_CORE_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"

#define EMBER_MAX_DIMS 4

typedef struct ember_buffer ember_buffer; /* defined by backend/backend.h */
typedef struct ember_prepared ember_prepared; /* defined by each backend that prepares weights */

typedef struct ember_tensor {
    ember_dtype dtype;
    int ndim;
    int64_t shape[EMBER_MAX_DIMS];
    ember_buffer *buf; /* owned elsewhere; NULL for an unbound tensor */
    size_t offset;     /* bytes from the start of buf */
    size_t nbytes;
    /* a weight the backend prepared once at load (backend.h prepare_weight):
       its handle, owned by buf and read by the kernels with no lookup; NULL
       for every other tensor (ember_tensor_view and ember_tensor_alloc clear it) */
    ember_prepared *prep;
} ember_tensor;

/* Number of elements (1 for ndim 0). */
static inline int64_t ember_tensor_nelem(const ember_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}
/* Length of the innermost dimension. */
static inline int64_t ember_tensor_row_len(const ember_tensor *t) {
    return t->ndim ? t->shape[t->ndim - 1] : 1;
}
/* Number of rows: product of every dimension but the innermost. */
static inline int64_t ember_tensor_rows(const ember_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i + 1 < t->ndim; i++) n *= t->shape[i];
    return n;
}

#endif
