/*
 * safetensors.h - reading and writing safetensors files.
 *
 * Layout: an 8-byte little-endian header length N, N bytes of JSON
 * {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {..}},
 * then the data section. Reading maps the file and checks everything before
 * use: N bounded and inside the file, valid JSON with no duplicate keys,
 * known dtypes, non-negative shapes whose byte size equals end - begin,
 * offsets inside the data section, and no two tensors overlapping.
 *
 * Ownership: an ember_st_file owns its mapping, names and tensor table;
 * tensor data pointers stay valid until ember_st_free.
 */
#ifndef EMBER_FORMATS_SAFETENSORS_H
#define EMBER_FORMATS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/mapfile.h"

#define EMBER_ST_MAX_DIMS 8
#define EMBER_ST_MAX_HEADER (100u * 1024u * 1024u)

typedef struct ember_st_tensor {
    char *name;
    ember_dtype dtype;
    int ndim;
    int64_t shape[EMBER_ST_MAX_DIMS];
    size_t begin, end;         /* offsets within the data section */
    const unsigned char *data; /* start of this tensor's bytes */
    size_t nbytes;
} ember_st_tensor;

typedef struct ember_st_file {
    char *path;
    ember_mapfile *map; /* NULL when parsed from caller memory */
    size_t data_size;
    int n_tensors;
    ember_st_tensor *tensors; /* in header order */
    int *index;               /* hash table over tensors, -1 = empty */
    size_t index_cap;
} ember_st_file;

/* Maps and validates path. On success *out owns everything (ember_st_free). */
int ember_st_open(const char *path, ember_st_file **out, ember_error *err);

/* Validates a safetensors image held by the caller (which must keep buf
   alive as long as *out). name is used in error messages. */
int ember_st_parse(const char *name, const unsigned char *buf, size_t size, ember_st_file **out,
                   ember_error *err);

void ember_st_free(ember_st_file *f);

/* The tensor called name, or NULL. */
const ember_st_tensor *ember_st_find(const ember_st_file *f, const char *name);

/* ---- writing ---------------------------------------------------------------- */

typedef struct ember_st_out {
    const char *name;
    ember_dtype dtype;
    int ndim;
    int64_t shape[EMBER_ST_MAX_DIMS];
} ember_st_out;

/* Fills dst with n elements of tensor `index`, starting at element `first`. */
typedef int (*ember_st_fill_fn)(void *user, int index, size_t first, size_t n, void *dst,
                                ember_error *err);

/* Writes n tensors to path (replacing it), data produced by fill in chunks. */
int ember_st_write(const char *path, const ember_st_out *t, int n, ember_st_fill_fn fill,
                   void *user, ember_error *err);

/* FNV-1a, used for name tables across formats. */
uint64_t ember_hash_str(const char *s);

#endif
