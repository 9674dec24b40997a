/*
 * gguf.h - reading GGUF files (llama.cpp / ggml), versions 2 and 3.
 *
 * Layout (all little-endian): "GGUF", u32 version, u64 tensor count, u64
 * metadata count; the metadata key/value pairs (key = u64 length + bytes,
 * u32 value type, value); the tensor infos (name, u32 n_dims, u64 ne[n_dims],
 * u32 type id, u64 offset); zero padding up to general.alignment (default
 * 32); the tensor data. Tensor offsets are relative to the data section.
 *
 * The reader trusts nothing. Before anything is used it checks: magic and
 * version (1 and big-endian files are refused as unsupported); every count
 * against the bytes left (no allocation larger than the file could justify);
 * every string and array inside the file; key and tensor-name lengths
 * (1..65535 and 1..64 bytes, no NUL bytes); value types; bools (0 or 1);
 * arrays nested at most EMBER_GGUF_MAX_DEPTH deep; duplicate keys;
 * general.alignment (a u32, a power of two, 8 .. 1 MiB); n_dims (1..4);
 * dims (>= 1, < 2^63, element count and byte size without overflow, the
 * innermost dim a whole number of blocks); type ids (unknown ids are errors);
 * offsets (aligned, inside the file); duplicate names; overlapping tensors.
 * Failures are one line naming the file and, where there is one, the key or
 * tensor: "model.gguf: tensor 'blk.0.attn_q.weight': offset 96 is not a
 * multiple of the alignment 32".
 *
 * Shapes: GGUF lists dims innermost first (ne[0] is the contiguous one).
 * ember_gguf_tensor keeps that list as `ne` and also gives `shape` in
 * Ember's row-major order (reversed: shape[ndim-1] == ne[0]), so a GGUF
 * matrix with ne = {n_embd, n_vocab} has shape {n_vocab, n_embd}.
 *
 * Types: a tensor's type id maps to an ember_dtype (F32, F16, BF16, F64,
 * I8..I64, Q4_0 .. Q8_K). Ids of ggml formats Ember cannot compute with
 * (IQ*, TQ*, MXFP4, ...) are still accepted when their block size is known,
 * so such files can be inspected and their vocabularies read; those tensors
 * have dtype EMBER_DTYPE_INVALID and the model loader refuses them.
 *
 * Ownership: an ember_gguf owns its mapping (ember_gguf_open) and copies of
 * every key, string and string array (NUL-terminated). Tensor data and raw
 * array pointers point into the mapping (or the caller's buffer for
 * ember_gguf_parse) and stay valid until ember_gguf_free. An ember_gguf is
 * immutable after parsing: concurrent readers are safe.
 */
#ifndef EMBER_FORMATS_GGUF_H
#define EMBER_FORMATS_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/mapfile.h"

#define EMBER_GGUF_MAX_DIMS 4
#define EMBER_GGUF_MAX_NAME 64   /* tensor name bytes */
#define EMBER_GGUF_MAX_KEY 65535 /* metadata key bytes */
#define EMBER_GGUF_MAX_DEPTH 8   /* array of array of ... */
#define EMBER_GGUF_DEFAULT_ALIGNMENT 32u
#define EMBER_GGUF_MAX_ALIGNMENT (1u << 20)

/* Metadata value types, numbered as in the file. */
typedef enum ember_gguf_vtype {
    EMBER_GGUF_U8 = 0,
    EMBER_GGUF_I8 = 1,
    EMBER_GGUF_U16 = 2,
    EMBER_GGUF_I16 = 3,
    EMBER_GGUF_U32 = 4,
    EMBER_GGUF_I32 = 5,
    EMBER_GGUF_F32 = 6,
    EMBER_GGUF_BOOL = 7,
    EMBER_GGUF_STRING = 8,
    EMBER_GGUF_ARRAY = 9,
    EMBER_GGUF_U64 = 10,
    EMBER_GGUF_I64 = 11,
    EMBER_GGUF_F64 = 12,
    EMBER_GGUF_VTYPE_COUNT
} ember_gguf_vtype;

/* One metadata pair. Which fields are set depends on type. */
typedef struct ember_gguf_kv {
    char *key;
    ember_gguf_vtype type;
    /* scalars */
    uint64_t u64; /* U8, U16, U32, U64; BOOL as 0 / 1 */
    int64_t i64;  /* I8, I16, I32, I64 */
    double f64;   /* F32 (widened exactly), F64 */
    /* STRING: NUL-terminated copy; str_len excludes the terminator (the
       string itself may contain NUL bytes, so use str_len when it matters) */
    char *str;
    size_t str_len;
    /* ARRAY */
    ember_gguf_vtype arr_type;     /* element type */
    size_t arr_len;                /* number of elements */
    const unsigned char *arr_data; /* the packed elements in the file: for
                                      numbers and bools little-endian and
                                      possibly unaligned (read with memcpy) */
    size_t arr_bytes;              /* their size in bytes */
    char **arr_strs;               /* arr_type STRING: arr_len copies */
    size_t *arr_str_lens;
} ember_gguf_kv;

typedef struct ember_gguf_tensor {
    char *name;
    uint32_t ggml_type;                 /* the type id in the file */
    ember_dtype dtype;                  /* EMBER_DTYPE_INVALID for types Ember lacks */
    int ndim;                           /* 1..4 */
    int64_t ne[EMBER_GGUF_MAX_DIMS];    /* GGUF order: ne[0] innermost; unused = 1 */
    int64_t shape[EMBER_GGUF_MAX_DIMS]; /* row-major: shape[ndim-1] == ne[0] */
    size_t nelem;
    uint64_t offset;           /* from the start of the data section */
    const unsigned char *data; /* the tensor's bytes */
    size_t nbytes;
} ember_gguf_tensor;

typedef struct ember_gguf {
    char *path;         /* the name used in messages */
    ember_mapfile *map; /* NULL when parsed from caller memory */
    uint32_t version;   /* 2 or 3 */
    uint32_t alignment;
    size_t data_offset; /* file offset of the tensor data section */
    size_t data_size;   /* bytes from data_offset to the end of the file */
    size_t n_kv;
    ember_gguf_kv *kv; /* in file order */
    size_t n_tensors;
    ember_gguf_tensor *tensors; /* in file order */
    /* private: hash tables (open addressing, -1 = empty) */
    int64_t *kv_index, *tensor_index;
    size_t kv_cap, tensor_cap;
} ember_gguf;

/* Maps and validates path. On success *out owns everything (ember_gguf_free)
   and the mapping lives as long as *out. On failure *out is NULL and err
   names path. */
int ember_gguf_open(const char *path, ember_gguf **out, ember_error *err);

/* Validates a GGUF image of size bytes held by the caller, who must keep buf
   alive (and unchanged) as long as *out. name is used in error messages.
   The entry point for fuzzing: any bytes give EMBER_OK or an error. */
int ember_gguf_parse(const char *name, const unsigned char *buf, size_t size, ember_gguf **out, ember_error *err);

/* Frees f and everything it owns (accepts NULL). */
void ember_gguf_free(ember_gguf *f);

/* ---- metadata ------------------------------------------------------------

   Getters return EMBER_OK and fill *out, or fail without touching *out:
   EMBER_ERR_FORMAT when the key is missing ("model.gguf: metadata key
   'llama.block_count' is missing") or holds the wrong type or a value out
   of range. For optional keys, test ember_gguf_find_kv first. */

/* The pair with this key, or NULL. */
const ember_gguf_kv *ember_gguf_find_kv(const ember_gguf *f, const char *key);

/* Integers: any integer type (U8..U64, I8..I64) whose value fits. */
int ember_gguf_get_u32(const ember_gguf *f, const char *key, uint32_t *out, ember_error *err);
int ember_gguf_get_i32(const ember_gguf *f, const char *key, int32_t *out, ember_error *err);
int ember_gguf_get_u64(const ember_gguf *f, const char *key, uint64_t *out, ember_error *err);
int ember_gguf_get_i64(const ember_gguf *f, const char *key, int64_t *out, ember_error *err);
/* Floats: F32 or F64 (F64 is rounded to the nearest float by get_f32). */
int ember_gguf_get_f32(const ember_gguf *f, const char *key, float *out, ember_error *err);
int ember_gguf_get_f64(const ember_gguf *f, const char *key, double *out, ember_error *err);
int ember_gguf_get_bool(const ember_gguf *f, const char *key, bool *out, ember_error *err);
/* STRING. *out is owned by f; len (may be NULL) gets its length. */
int ember_gguf_get_str(const ember_gguf *f, const char *key, const char **out, size_t *len, ember_error *err);

/* ARRAY of STRING. *strs and *lens (may be NULL) are arrays of *n entries
   owned by f. */
int ember_gguf_get_strs(const ember_gguf *f, const char *key, const char *const **strs, const size_t **lens,
                        size_t *n, ember_error *err);
/* ARRAY of F32 or F64, converted to a malloc'd float array of *n elements
   (caller frees; NULL with *n 0 for an empty array). */
int ember_gguf_get_f32s(const ember_gguf *f, const char *key, float **out, size_t *n, ember_error *err);
/* ARRAY of any integer type whose every element fits an int32, converted to
   a malloc'd array (caller frees; NULL with *n 0 for an empty array). */
int ember_gguf_get_i32s(const ember_gguf *f, const char *key, int32_t **out, size_t *n, ember_error *err);

/* "u8", "string", "array", ... ("?" for an invalid type). */
const char *ember_gguf_vtype_name(ember_gguf_vtype t);

/* ---- tensors ---------------------------------------------------------------
   Iterate with f->tensors[0 .. f->n_tensors). */

/* The tensor called name, or NULL. */
const ember_gguf_tensor *ember_gguf_find_tensor(const ember_gguf *f, const char *name);

/* The ggml name of a tensor type id ("F32", "Q4_K", "IQ2_XXS", ...), or NULL
   when the id is unknown. */
const char *ember_gguf_type_name(uint32_t ggml_type);

#endif
