/*
 * gguf_write.h - writing GGUF v3 files (the layout gguf.h describes):
 * metadata pairs and tensors in the order added, alignment 32.
 *
 * Ownership: a writer owns copies of every key and string, and takes
 * ownership of each tensor's data buffer (malloc'd by the caller, freed by
 * the writer). Not thread-safe; one thread builds and writes a file.
 */
#ifndef EMBER_FORMATS_GGUF_WRITE_H
#define EMBER_FORMATS_GGUF_WRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/error.h"

typedef struct ember_gguf_writer ember_gguf_writer;

/* A new, empty writer (NULL when out of memory). Free with
   ember_gguf_writer_free. */
ember_gguf_writer *ember_gguf_writer_new(void);
void ember_gguf_writer_free(ember_gguf_writer *w);

/* Metadata. Each returns EMBER_OK or EMBER_ERR_NOMEM / EMBER_ERR_INVALID_ARG
   (duplicate or empty key); the writer is unchanged on failure. */
int ember_gguf_set_str(ember_gguf_writer *w, const char *key, const char *val, ember_error *err);
int ember_gguf_set_u32(ember_gguf_writer *w, const char *key, uint32_t val, ember_error *err);
int ember_gguf_set_i32(ember_gguf_writer *w, const char *key, int32_t val, ember_error *err);
int ember_gguf_set_f32(ember_gguf_writer *w, const char *key, float val, ember_error *err);
int ember_gguf_set_bool(ember_gguf_writer *w, const char *key, int val, ember_error *err);
/* Arrays of strings (copied), of f32, of i32 and of bools (copied). */
int ember_gguf_set_strs(ember_gguf_writer *w, const char *key, const char *const *vals, size_t n, ember_error *err);
int ember_gguf_set_f32s(ember_gguf_writer *w, const char *key, const float *vals, size_t n, ember_error *err);
int ember_gguf_set_i32s(ember_gguf_writer *w, const char *key, const int32_t *vals, size_t n, ember_error *err);
int ember_gguf_set_bools(ember_gguf_writer *w, const char *key, const bool *vals, size_t n, ember_error *err);

/* Adds a tensor of dtype t with Ember's row-major shape (shape[ndim-1]
   contiguous; written to the file innermost first). data (malloc'd,
   ember_dtype_nbytes(t, elements) bytes) is owned by the writer from this
   call on, also on failure. */
int ember_gguf_add_tensor(ember_gguf_writer *w, const char *name, ember_dtype t, int ndim, const int64_t *shape,
                          void *data, ember_error *err);

/* Writes everything to path (through a temporary file renamed into place).
   Errors name the path. */
int ember_gguf_write_file(const ember_gguf_writer *w, const char *path, ember_error *err);

#endif
