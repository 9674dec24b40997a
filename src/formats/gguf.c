/*
 * gguf.c - see gguf.h.
 *
 * The parser walks the file once with a bounds-checked cursor. Every
 * integer read from the file is range-checked before it takes part in
 * arithmetic (ember_mul_ok / ember_add_ok), every count is checked against
 * the bytes that remain before anything is allocated for it, and tables
 * grow only as entries actually parse, so memory stays proportional to the
 * file. Any failure frees everything built so far and returns one line
 * naming the file and the place ("model.gguf: metadata 'general.name': ...").
 */
#define _POSIX_C_SOURCE 200809L
#include "gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "safetensors.h" /* ember_hash_str */

/* ---- tensor types ---------------------------------------------------------- */

/* Every ggml type id with a known block layout. The ones Ember computes with
   also have an ember_dtype (dtype.c), whose sizes must agree (tested). */
static const struct {
    uint32_t id;
    const char *name;
    uint32_t block_elems, block_bytes;
} k_types[] = {
    {0, "F32", 1, 4},         {1, "F16", 1, 2},         {2, "Q4_0", 32, 18},      {3, "Q4_1", 32, 20},
    {6, "Q5_0", 32, 22},      {7, "Q5_1", 32, 24},      {8, "Q8_0", 32, 34},      {9, "Q8_1", 32, 36},
    {10, "Q2_K", 256, 84},    {11, "Q3_K", 256, 110},   {12, "Q4_K", 256, 144},   {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},   {15, "Q8_K", 256, 292},   {16, "IQ2_XXS", 256, 66}, {17, "IQ2_XS", 256, 74},
    {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},   {20, "IQ4_NL", 32, 18},   {21, "IQ3_S", 256, 110},
    {22, "IQ2_S", 256, 82},   {23, "IQ4_XS", 256, 136}, {24, "I8", 1, 1},         {25, "I16", 1, 2},
    {26, "I32", 1, 4},        {27, "I64", 1, 8},        {28, "F64", 1, 8},        {29, "IQ1_M", 256, 56},
    {30, "BF16", 1, 2},       {34, "TQ1_0", 256, 54},   {35, "TQ2_0", 256, 66},   {39, "MXFP4", 32, 17},
    {40, "NVFP4", 64, 36},    {41, "Q1_0", 128, 18},    {42, "Q2_0", 64, 18},
};

static int type_index(uint32_t id) {
    for (size_t i = 0; i < sizeof k_types / sizeof k_types[0]; i++)
        if (k_types[i].id == id) return (int)i;
    return -1;
}

const char *ember_gguf_type_name(uint32_t ggml_type) {
    int i = type_index(ggml_type);
    return i < 0 ? NULL : k_types[i].name;
}

static const char *const k_vtype_names[EMBER_GGUF_VTYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

const char *ember_gguf_vtype_name(ember_gguf_vtype t) {
    return (unsigned)t < EMBER_GGUF_VTYPE_COUNT ? k_vtype_names[t] : "?";
}

/* Bytes of a fixed-size value type; 0 for STRING and ARRAY. */
static size_t vtype_size(uint32_t t) {
    switch (t) {
    case EMBER_GGUF_U8:
    case EMBER_GGUF_I8:
    case EMBER_GGUF_BOOL: return 1;
    case EMBER_GGUF_U16:
    case EMBER_GGUF_I16: return 2;
    case EMBER_GGUF_U32:
    case EMBER_GGUF_I32:
    case EMBER_GGUF_F32: return 4;
    case EMBER_GGUF_U64:
    case EMBER_GGUF_I64:
    case EMBER_GGUF_F64: return 8;
    default: return 0;
    }
}

/* The fewest bytes one value of type t can take in the file. */
static size_t vtype_min_size(uint32_t t) {
    if (t == EMBER_GGUF_STRING) return 8;    /* u64 length */
    if (t == EMBER_GGUF_ARRAY) return 4 + 8; /* u32 type + u64 length */
    return vtype_size(t);
}

/* ---- freeing and lookup ------------------------------------------------------ */

static void free_kv(ember_gguf_kv *kv) {
    free(kv->key);
    free(kv->str);
    if (kv->arr_strs && kv->arr_len) free(kv->arr_strs[0]); /* the one blob */
    free(kv->arr_strs);
    free(kv->arr_str_lens);
}

void ember_gguf_free(ember_gguf *f) {
    if (!f) return;
    for (size_t i = 0; i < f->n_kv; i++) free_kv(&f->kv[i]);
    free(f->kv);
    for (size_t i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    free(f->kv_index);
    free(f->tensor_index);
    ember_mapfile_free(f->map);
    free(f->path);
    free(f);
}

const ember_gguf_kv *ember_gguf_find_kv(const ember_gguf *f, const char *key) {
    if (!f || !key || !f->kv_cap) return NULL;
    size_t mask = f->kv_cap - 1;
    for (size_t i = ember_hash_str(key) & mask;; i = (i + 1) & mask) {
        int64_t k = f->kv_index[i];
        if (k < 0) return NULL;
        if (strcmp(f->kv[k].key, key) == 0) return &f->kv[k];
    }
}

const ember_gguf_tensor *ember_gguf_find_tensor(const ember_gguf *f, const char *name) {
    if (!f || !name || !f->tensor_cap) return NULL;
    size_t mask = f->tensor_cap - 1;
    for (size_t i = ember_hash_str(name) & mask;; i = (i + 1) & mask) {
        int64_t t = f->tensor_index[i];
        if (t < 0) return NULL;
        if (strcmp(f->tensors[t].name, name) == 0) return &f->tensors[t];
    }
}

/* Builds an open-addressing table over n names (name(i) gives the i-th);
   fails on a duplicate, reporting it with what ("metadata key", "tensor
   name"). */
typedef const char *(*name_at_fn)(const ember_gguf *f, size_t i);
static const char *kv_name_at(const ember_gguf *f, size_t i) {
    return f->kv[i].key;
}
static const char *tensor_name_at(const ember_gguf *f, size_t i) {
    return f->tensors[i].name;
}

static int build_index(ember_gguf *f, size_t n, name_at_fn name_at, int64_t **index, size_t *cap_out,
                       const char *what, ember_error *err) {
    size_t cap = 16;
    while (cap < n * 2) cap *= 2; /* n is bounded by the file size, so no overflow */
    int64_t *ix = ember_malloc(cap * sizeof *ix);
    if (!ix) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", f->path);
    for (size_t i = 0; i < cap; i++) ix[i] = -1;
    for (size_t k = 0; k < n; k++) {
        const char *name = name_at(f, k);
        size_t i = ember_hash_str(name) & (cap - 1);
        for (; ix[i] >= 0; i = (i + 1) & (cap - 1)) {
            if (strcmp(name_at(f, (size_t)ix[i]), name) == 0) {
                int rc = ember_err(err, EMBER_ERR_FORMAT, "%s: duplicate %s '%.128s' (entries %lld and %zu)",
                                   f->path, what, name, (long long)ix[i], k);
                free(ix);
                return rc;
            }
        }
        ix[i] = (int64_t)k;
    }
    *index = ix;
    *cap_out = cap;
    return EMBER_OK;
}

/* ---- the cursor ---------------------------------------------------------------- */

typedef struct cursor {
    const unsigned char *buf;
    size_t size, pos;
    const char *path;
    char ctx[200]; /* what is being read: "header", "metadata 'x'", "tensor 'y'" */
    ember_error *err;
} cursor;

static size_t left(const cursor *c) {
    return c->size - c->pos;
}

/* Fails unless n more bytes are available. */
static int need(cursor *c, size_t n, const char *what) {
    if (n > left(c))
        return ember_err(c->err, EMBER_ERR_FORMAT,
                         "%s: %s: %s needs %zu bytes at offset %zu but only %zu remain (file truncated?)", c->path,
                         c->ctx, what, n, c->pos, left(c));
    return EMBER_OK;
}

static uint16_t le16(const unsigned char *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}
static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t le64(const unsigned char *p) {
    return (uint64_t)le32(p) | ((uint64_t)le32(p + 4) << 32);
}

static int read_u32(cursor *c, uint32_t *v, const char *what) {
    int rc = need(c, 4, what);
    if (rc) return rc;
    *v = le32(c->buf + c->pos);
    c->pos += 4;
    return EMBER_OK;
}

static int read_u64(cursor *c, uint64_t *v, const char *what) {
    int rc = need(c, 8, what);
    if (rc) return rc;
    *v = le64(c->buf + c->pos);
    c->pos += 8;
    return EMBER_OK;
}

/* A GGUF string: u64 length, then that many bytes (inside the file). */
static int read_str(cursor *c, const unsigned char **s, size_t *len, const char *what) {
    uint64_t n;
    int rc = read_u64(c, &n, what);
    if (rc) return rc;
    if (n > left(c))
        return ember_err(c->err, EMBER_ERR_FORMAT,
                         "%s: %s: %s of %llu bytes at offset %zu runs past the end of the file (%zu bytes remain)",
                         c->path, c->ctx, what, (unsigned long long)n, c->pos, left(c));
    *s = c->buf + c->pos;
    *len = (size_t)n;
    c->pos += (size_t)n;
    return EMBER_OK;
}

/* A name (key or tensor name): 1..max bytes, no NUL; malloc'd copy. */
static int read_name(cursor *c, size_t max, char **out, const char *what) {
    const unsigned char *s;
    size_t n;
    int rc = read_str(c, &s, &n, what);
    if (rc) return rc;
    if (n == 0) return ember_err(c->err, EMBER_ERR_FORMAT, "%s: %s: %s is empty", c->path, c->ctx, what);
    if (n > max)
        return ember_err(c->err, EMBER_ERR_FORMAT, "%s: %s: %s is %zu bytes long (at most %zu)", c->path, c->ctx,
                         what, n, max);
    if (memchr(s, 0, n))
        return ember_err(c->err, EMBER_ERR_FORMAT, "%s: %s: %s contains a NUL byte", c->path, c->ctx, what);
    *out = ember_strndup((const char *)s, n);
    if (!*out) return ember_err(c->err, EMBER_ERR_NOMEM, "%s: out of memory", c->path);
    return EMBER_OK;
}

/* ---- metadata values -------------------------------------------------------------- */

static int check_vtype(cursor *c, uint32_t t, const char *what) {
    if (t >= EMBER_GGUF_VTYPE_COUNT)
        return ember_err(c->err, EMBER_ERR_FORMAT, "%s: %s: unknown %s %u at offset %zu", c->path, c->ctx, what, t,
                         c->pos - 4);
    return EMBER_OK;
}

/* After the array header: fails unless n elements of type t could fit in
   the bytes left. */
static int check_count(cursor *c, uint32_t t, uint64_t n) {
    if (n > left(c) / vtype_min_size(t))
        return ember_err(c->err, EMBER_ERR_FORMAT,
                         "%s: %s: array of %llu %s values at offset %zu cannot fit in the %zu bytes that remain",
                         c->path, c->ctx, (unsigned long long)n, ember_gguf_vtype_name((ember_gguf_vtype)t),
                         c->pos, left(c));
    return EMBER_OK;
}

/* Validates and steps over n array elements of type t (count already
   checked), recursing into nested arrays up to EMBER_GGUF_MAX_DEPTH. */
static int skip_elems(cursor *c, uint32_t t, size_t n, int depth) {
    size_t fixed = vtype_size(t);
    int rc;
    if (fixed) {
        size_t bytes;
        if (!ember_mul_ok(n, fixed, &bytes)) return need(c, SIZE_MAX, "array");
        if ((rc = need(c, bytes, "array"))) return rc;
        if (t == EMBER_GGUF_BOOL) {
            for (size_t i = 0; i < n; i++)
                if (c->buf[c->pos + i] > 1)
                    return ember_err(c->err, EMBER_ERR_FORMAT, "%s: %s: bool element %zu is %u (must be 0 or 1)",
                                     c->path, c->ctx, i, c->buf[c->pos + i]);
        }
        c->pos += bytes;
        return EMBER_OK;
    }
    for (size_t i = 0; i < n; i++) {
        if (t == EMBER_GGUF_STRING) {
            const unsigned char *s;
            size_t len;
            if ((rc = read_str(c, &s, &len, "string element"))) return rc;
        } else { /* nested array */
            if (depth + 1 >= EMBER_GGUF_MAX_DEPTH)
                return ember_err(c->err, EMBER_ERR_FORMAT, "%s: %s: arrays nested more than %d deep", c->path,
                                 c->ctx, EMBER_GGUF_MAX_DEPTH);
            uint32_t et;
            uint64_t m;
            if ((rc = read_u32(c, &et, "nested array type"))) return rc;
            if ((rc = check_vtype(c, et, "nested array element type"))) return rc;
            if ((rc = read_u64(c, &m, "nested array length"))) return rc;
            if ((rc = check_count(c, et, m))) return rc;
            if ((rc = skip_elems(c, et, (size_t)m, depth + 1))) return rc;
        }
    }
    return EMBER_OK;
}

/* Copies the n strings of an already validated string array starting at p
   into one NUL-terminated blob with pointer and length tables. */
static int copy_strs(cursor *c, ember_gguf_kv *kv, const unsigned char *p, size_t n) {
    if (n == 0) return EMBER_OK;
    size_t total = 0;
    const unsigned char *q = p;
    for (size_t i = 0; i < n; i++) {
        size_t len = (size_t)le64(q);
        q += 8 + len;
        total += len + 1; /* the strings fit in the file, so this cannot overflow */
    }
    kv->arr_strs = ember_malloc(n * sizeof *kv->arr_strs);
    kv->arr_str_lens = ember_malloc(n * sizeof *kv->arr_str_lens);
    char *blob = ember_malloc(total);
    if (!kv->arr_strs || !kv->arr_str_lens || !blob) {
        free(blob);
        free(kv->arr_strs); /* arr_len is still 0: free_kv must not touch a blob */
        kv->arr_strs = NULL;
        return ember_err(c->err, EMBER_ERR_NOMEM, "%s: out of memory", c->path);
    }
    for (size_t i = 0; i < n; i++) {
        size_t len = (size_t)le64(p);
        memcpy(blob, p + 8, len);
        blob[len] = '\0';
        kv->arr_strs[i] = blob;
        kv->arr_str_lens[i] = len;
        blob += len + 1;
        p += 8 + len;
    }
    return EMBER_OK;
}

/* Reads one metadata pair into kv (zeroed by the caller). */
static int parse_kv(cursor *c, size_t index, ember_gguf_kv *kv) {
    int rc;
    snprintf(c->ctx, sizeof c->ctx, "metadata pair %zu", index);
    if ((rc = read_name(c, EMBER_GGUF_MAX_KEY, &kv->key, "key"))) return rc;
    snprintf(c->ctx, sizeof c->ctx, "metadata '%.128s'", kv->key);
    uint32_t vt;
    if ((rc = read_u32(c, &vt, "value type"))) return rc;
    if ((rc = check_vtype(c, vt, "value type"))) return rc;
    kv->type = (ember_gguf_vtype)vt;
    size_t fixed = vtype_size(vt);
    if (fixed) {
        if ((rc = need(c, fixed, "value"))) return rc;
        const unsigned char *p = c->buf + c->pos;
        switch (kv->type) {
        case EMBER_GGUF_U8: kv->u64 = p[0]; break;
        case EMBER_GGUF_I8: kv->i64 = (int8_t)p[0]; break;
        case EMBER_GGUF_U16: kv->u64 = le16(p); break;
        case EMBER_GGUF_I16: kv->i64 = (int16_t)le16(p); break;
        case EMBER_GGUF_U32: kv->u64 = le32(p); break;
        case EMBER_GGUF_I32: kv->i64 = (int32_t)le32(p); break;
        case EMBER_GGUF_U64: kv->u64 = le64(p); break;
        case EMBER_GGUF_I64: kv->i64 = (int64_t)le64(p); break;
        case EMBER_GGUF_F32: kv->f64 = ember_bits_to_f32(le32(p)); break;
        case EMBER_GGUF_F64: {
            uint64_t u = le64(p);
            memcpy(&kv->f64, &u, 8);
            break;
        }
        case EMBER_GGUF_BOOL:
            if (p[0] > 1)
                return ember_err(c->err, EMBER_ERR_FORMAT, "%s: %s: bool value is %u (must be 0 or 1)", c->path,
                                 c->ctx, p[0]);
            kv->u64 = p[0];
            break;
        default: break;
        }
        c->pos += fixed;
        return EMBER_OK;
    }
    if (kv->type == EMBER_GGUF_STRING) {
        const unsigned char *s;
        size_t len;
        if ((rc = read_str(c, &s, &len, "string value"))) return rc;
        kv->str = ember_strndup((const char *)s, len); /* copies len bytes, NULs included */
        if (!kv->str) return ember_err(c->err, EMBER_ERR_NOMEM, "%s: out of memory", c->path);
        kv->str_len = len;
        return EMBER_OK;
    }
    /* ARRAY */
    uint32_t et;
    uint64_t n;
    if ((rc = read_u32(c, &et, "array element type"))) return rc;
    if ((rc = check_vtype(c, et, "array element type"))) return rc;
    if ((rc = read_u64(c, &n, "array length"))) return rc;
    if ((rc = check_count(c, et, n))) return rc;
    const unsigned char *start = c->buf + c->pos;
    if ((rc = skip_elems(c, et, (size_t)n, 0))) return rc;
    kv->arr_type = (ember_gguf_vtype)et;
    kv->arr_data = start;
    kv->arr_bytes = (size_t)(c->buf + c->pos - start);
    if (et == EMBER_GGUF_STRING && (rc = copy_strs(c, kv, start, (size_t)n))) return rc;
    kv->arr_len = (size_t)n;
    return EMBER_OK;
}

/* ---- tensor infos ----------------------------------------------------------------- */

static int parse_tensor_info(cursor *c, size_t index, uint32_t alignment, ember_gguf_tensor *t) {
    int rc;
    snprintf(c->ctx, sizeof c->ctx, "tensor info %zu", index);
    if ((rc = read_name(c, EMBER_GGUF_MAX_NAME, &t->name, "tensor name"))) return rc;
    snprintf(c->ctx, sizeof c->ctx, "tensor '%s'", t->name);
    const char *p = c->path, *ctx = c->ctx;
    uint32_t nd;
    if ((rc = read_u32(c, &nd, "n_dims"))) return rc;
    if (nd < 1 || nd > EMBER_GGUF_MAX_DIMS)
        return ember_err(c->err, EMBER_ERR_FORMAT, "%s: %s: n_dims is %u (must be 1..%d)", p, ctx, nd,
                         EMBER_GGUF_MAX_DIMS);
    t->ndim = (int)nd;
    size_t nelem = 1;
    for (int d = 0; d < EMBER_GGUF_MAX_DIMS; d++) t->ne[d] = t->shape[d] = 1;
    for (uint32_t d = 0; d < nd; d++) {
        uint64_t v;
        if ((rc = read_u64(c, &v, "dimension"))) return rc;
        if (v == 0) return ember_err(c->err, EMBER_ERR_FORMAT, "%s: %s: dimension %u is zero", p, ctx, d);
        if (v > (uint64_t)INT64_MAX)
            return ember_err(c->err, EMBER_ERR_FORMAT, "%s: %s: dimension %u is too large (%llu)", p, ctx, d,
                             (unsigned long long)v);
        if (!ember_mul_ok(nelem, (size_t)v, &nelem))
            return ember_err(c->err, EMBER_ERR_FORMAT, "%s: %s: element count overflows", p, ctx);
        t->ne[d] = (int64_t)v;
    }
    for (int d = 0; d < t->ndim; d++) t->shape[d] = t->ne[t->ndim - 1 - d];
    t->nelem = nelem;
    uint32_t type;
    if ((rc = read_u32(c, &type, "type id"))) return rc;
    int ti = type_index(type);
    if (ti < 0) return ember_err(c->err, EMBER_ERR_FORMAT, "%s: %s: unknown type id %u", p, ctx, type);
    t->ggml_type = type;
    t->dtype = ember_dtype_from_gguf(type);
    uint32_t be = k_types[ti].block_elems;
    if ((uint64_t)t->ne[0] % be)
        return ember_err(c->err, EMBER_ERR_FORMAT,
                         "%s: %s: innermost dimension %lld is not a multiple of the %s block size %u", p, ctx,
                         (long long)t->ne[0], k_types[ti].name, be);
    if (!ember_mul_ok(nelem / be, k_types[ti].block_bytes, &t->nbytes))
        return ember_err(c->err, EMBER_ERR_FORMAT, "%s: %s: byte size overflows", p, ctx);
    if ((rc = read_u64(c, &t->offset, "data offset"))) return rc;
    if (t->offset % alignment)
        return ember_err(c->err, EMBER_ERR_FORMAT,
                         "%s: %s: data offset %llu is not a multiple of the alignment %u", p, ctx,
                         (unsigned long long)t->offset, alignment);
    return EMBER_OK;
}

static int cmp_offset(const void *a, const void *b) {
    const ember_gguf_tensor *x = *(ember_gguf_tensor *const *)a, *y = *(ember_gguf_tensor *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

/* Places every tensor in the data section: inside it, and no two sharing
   a byte. */
static int place_tensors(ember_gguf *f, ember_error *err) {
    for (size_t i = 0; i < f->n_tensors; i++) {
        ember_gguf_tensor *t = &f->tensors[i];
        size_t end;
        if (t->offset > f->data_size || !ember_add_ok((size_t)t->offset, t->nbytes, &end) || end > f->data_size)
            return ember_err(err, EMBER_ERR_FORMAT,
                             "%s: tensor '%s': data at offset %llu (%zu bytes) runs past the end of the "
                             "%zu-byte data section (file truncated?)",
                             f->path, t->name, (unsigned long long)t->offset, t->nbytes, f->data_size);
    }
    if (f->n_tensors < 2) return EMBER_OK;
    ember_gguf_tensor **sorted = ember_malloc(f->n_tensors * sizeof *sorted);
    if (!sorted) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", f->path);
    for (size_t i = 0; i < f->n_tensors; i++) sorted[i] = &f->tensors[i];
    qsort(sorted, f->n_tensors, sizeof *sorted, cmp_offset);
    int rc = EMBER_OK;
    for (size_t i = 1; i < f->n_tensors; i++) {
        if (sorted[i]->offset < sorted[i - 1]->offset + sorted[i - 1]->nbytes) {
            rc = ember_err(err, EMBER_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap", f->path,
                           sorted[i - 1]->name, sorted[i]->name);
            break;
        }
    }
    free(sorted);
    return rc;
}

/* ---- the file ------------------------------------------------------------------------ */

/* general.alignment, if present: a u32 power of two in 8 .. 1 MiB. */
static int read_alignment(ember_gguf *f, ember_error *err) {
    f->alignment = EMBER_GGUF_DEFAULT_ALIGNMENT;
    const ember_gguf_kv *kv = ember_gguf_find_kv(f, "general.alignment");
    if (!kv) return EMBER_OK;
    if (kv->type != EMBER_GGUF_U32)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: metadata 'general.alignment' is %s, must be u32", f->path,
                         ember_gguf_vtype_name(kv->type));
    uint64_t a = kv->u64;
    if (a < 8 || a > EMBER_GGUF_MAX_ALIGNMENT || (a & (a - 1)))
        return ember_err(err, EMBER_ERR_FORMAT,
                         "%s: metadata 'general.alignment' is %llu (must be a power of two from 8 to %u)", f->path,
                         (unsigned long long)a, EMBER_GGUF_MAX_ALIGNMENT);
    f->alignment = (uint32_t)a;
    return EMBER_OK;
}

static int parse_header(cursor *c, ember_gguf *f, uint64_t *n_tensors, uint64_t *n_kv) {
    int rc;
    snprintf(c->ctx, sizeof c->ctx, "header");
    if (c->size < 4 || memcmp(c->buf, "GGUF", 4) != 0)
        return ember_err(c->err, EMBER_ERR_FORMAT, "%s: not a GGUF file (it does not start with \"GGUF\")",
                         c->path);
    c->pos = 4;
    uint32_t v;
    if ((rc = read_u32(c, &v, "version"))) return rc;
    if (v == 0x02000000u || v == 0x03000000u)
        return ember_err(c->err, EMBER_ERR_UNSUPPORTED, "%s: big-endian GGUF files are not supported", c->path);
    if (v == 1)
        return ember_err(c->err, EMBER_ERR_UNSUPPORTED, "%s: GGUF version 1 is not supported (only 2 and 3)",
                         c->path);
    if (v != 2 && v != 3)
        return ember_err(c->err, EMBER_ERR_FORMAT, "%s: unknown GGUF version %u (supported: 2 and 3)", c->path, v);
    f->version = v;
    if ((rc = read_u64(c, n_tensors, "tensor count"))) return rc;
    if ((rc = read_u64(c, n_kv, "metadata count"))) return rc;
    /* a pair takes at least 14 bytes (key length, one key byte, value type,
       one value byte), a tensor info at least 33 (name length, one name
       byte, n_dims, one dim, type id, offset) */
    size_t total = 0;
    bool fit = *n_kv <= left(c) / 14 && *n_tensors <= left(c) / 33; /* then the products below fit */
    if (fit) fit = ember_add_ok((size_t)*n_kv * 14, (size_t)*n_tensors * 33, &total) && total <= left(c);
    if (!fit)
        return ember_err(c->err, EMBER_ERR_FORMAT,
                         "%s: %llu tensors and %llu metadata pairs cannot fit in the %zu-byte file", c->path,
                         (unsigned long long)*n_tensors, (unsigned long long)*n_kv, c->size);
    return EMBER_OK;
}

/* Makes room for one more element in a table growing by doubling. */
static int grow(cursor *c, void **arr, size_t *cap, size_t n, size_t elem) {
    if (n < *cap) return EMBER_OK;
    size_t nc = *cap ? *cap * 2 : 16, bytes;
    if (!ember_mul_ok(nc, elem, &bytes)) return ember_err(c->err, EMBER_ERR_NOMEM, "%s: out of memory", c->path);
    void *p = ember_realloc(*arr, bytes);
    if (!p) return ember_err(c->err, EMBER_ERR_NOMEM, "%s: out of memory", c->path);
    *arr = p;
    *cap = nc;
    return EMBER_OK;
}

static int parse_all(cursor *c, ember_gguf *f) {
    uint64_t n_tensors, n_kv;
    int rc;
    if ((rc = parse_header(c, f, &n_tensors, &n_kv))) return rc;
    size_t cap = 0;
    for (uint64_t i = 0; i < n_kv; i++) {
        if ((rc = grow(c, (void **)&f->kv, &cap, f->n_kv, sizeof *f->kv))) return rc;
        ember_gguf_kv *kv = &f->kv[f->n_kv++];
        memset(kv, 0, sizeof *kv);
        if ((rc = parse_kv(c, (size_t)i, kv))) return rc;
    }
    if ((rc = build_index(f, f->n_kv, kv_name_at, &f->kv_index, &f->kv_cap, "metadata key", c->err))) return rc;
    if ((rc = read_alignment(f, c->err))) return rc;
    cap = 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        if ((rc = grow(c, (void **)&f->tensors, &cap, f->n_tensors, sizeof *f->tensors))) return rc;
        ember_gguf_tensor *t = &f->tensors[f->n_tensors++];
        memset(t, 0, sizeof *t);
        if ((rc = parse_tensor_info(c, (size_t)i, f->alignment, t))) return rc;
    }
    if ((rc = build_index(f, f->n_tensors, tensor_name_at, &f->tensor_index, &f->tensor_cap, "tensor name",
                          c->err)))
        return rc;
    /* the data section starts at the next multiple of the alignment */
    size_t a = f->alignment, start;
    if (!ember_add_ok(c->pos, a - 1, &start))
        return ember_err(c->err, EMBER_ERR_FORMAT, "%s: data section offset overflows", c->path);
    start -= start % a;
    if (start > c->size) {
        if (f->n_tensors)
            return ember_err(c->err, EMBER_ERR_FORMAT,
                             "%s: the data section would start at offset %zu, past the end of the %zu-byte file "
                             "(truncated?)",
                             c->path, start, c->size);
        start = c->size; /* no tensors: the final padding may be absent */
    }
    f->data_offset = start;
    f->data_size = c->size - start;
    if ((rc = place_tensors(f, c->err))) return rc;
    for (size_t i = 0; i < f->n_tensors; i++) f->tensors[i].data = c->buf + start + f->tensors[i].offset;
    return EMBER_OK;
}

int ember_gguf_parse(const char *name, const unsigned char *buf, size_t size, ember_gguf **out, ember_error *err) {
    *out = NULL;
    if (!name) name = "(gguf)";
    ember_gguf *f = ember_calloc(1, sizeof *f);
    if (!f || !(f->path = ember_strdup(name))) {
        free(f);
        return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", name);
    }
    if (!buf) size = 0;
    cursor c = {.buf = buf, .size = size, .pos = 0, .path = f->path, .err = err};
    int rc = parse_all(&c, f);
    if (rc) {
        ember_gguf_free(f);
        return rc;
    }
    *out = f;
    return EMBER_OK;
}

int ember_gguf_open(const char *path, ember_gguf **out, ember_error *err) {
    *out = NULL;
    ember_mapfile *m;
    int rc = ember_mapfile_open(path, &m, err);
    if (rc) return rc;
    rc = ember_gguf_parse(path, m->data, m->size, out, err);
    if (rc) {
        ember_mapfile_free(m);
        return rc;
    }
    (*out)->map = m;
    return EMBER_OK;
}

/* ---- typed getters ------------------------------------------------------------------------ */

/* "u32", "string", "array of f32", ... */
static const char *describe(const ember_gguf_kv *kv, char *buf, size_t n) {
    if (kv->type != EMBER_GGUF_ARRAY) return ember_gguf_vtype_name(kv->type);
    snprintf(buf, n, "array of %s", ember_gguf_vtype_name(kv->arr_type));
    return buf;
}

static int lookup(const ember_gguf *f, const char *key, const ember_gguf_kv **kv, ember_error *err) {
    *kv = ember_gguf_find_kv(f, key);
    if (!*kv)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: metadata key '%.128s' is missing", f ? f->path : "(null)",
                         key ? key : "(null)");
    return EMBER_OK;
}

static int type_error(const ember_gguf *f, const ember_gguf_kv *kv, const char *want, ember_error *err) {
    char buf[48];
    return ember_err(err, EMBER_ERR_FORMAT, "%s: metadata '%.128s' is %s, expected %s", f->path, kv->key,
                     describe(kv, buf, sizeof buf), want);
}

/* An integer of type t at p (little-endian) as sign and magnitude; false
   for non-integer types. */
static bool int_at(uint32_t t, const unsigned char *p, bool *neg, uint64_t *mag) {
    int64_t s;
    switch (t) {
    case EMBER_GGUF_U8: *neg = false, *mag = p[0]; return true;
    case EMBER_GGUF_U16: *neg = false, *mag = le16(p); return true;
    case EMBER_GGUF_U32: *neg = false, *mag = le32(p); return true;
    case EMBER_GGUF_U64: *neg = false, *mag = le64(p); return true;
    case EMBER_GGUF_I8: s = (int8_t)p[0]; break;
    case EMBER_GGUF_I16: s = (int16_t)le16(p); break;
    case EMBER_GGUF_I32: s = (int32_t)le32(p); break;
    case EMBER_GGUF_I64: s = (int64_t)le64(p); break;
    default: return false;
    }
    *neg = s < 0;
    *mag = *neg ? (uint64_t)0 - (uint64_t)s : (uint64_t)s;
    return true;
}

static bool kv_int(const ember_gguf_kv *kv, bool *neg, uint64_t *mag) {
    switch (kv->type) {
    case EMBER_GGUF_U8:
    case EMBER_GGUF_U16:
    case EMBER_GGUF_U32:
    case EMBER_GGUF_U64:
        *neg = false;
        *mag = kv->u64;
        return true;
    case EMBER_GGUF_I8:
    case EMBER_GGUF_I16:
    case EMBER_GGUF_I32:
    case EMBER_GGUF_I64:
        *neg = kv->i64 < 0;
        *mag = *neg ? (uint64_t)0 - (uint64_t)kv->i64 : (uint64_t)kv->i64;
        return true;
    default: return false;
    }
}

/* Does (neg, mag) fit the signed range [-neg_max, pos_max]? */
static bool fits(bool neg, uint64_t mag, uint64_t neg_max, uint64_t pos_max) {
    return neg ? mag <= neg_max : mag <= pos_max;
}
static int64_t to_signed(bool neg, uint64_t mag) { /* caller checked it fits int64 */
    if (!neg) return (int64_t)mag;
    return mag == (uint64_t)1 << 63 ? INT64_MIN : -(int64_t)mag;
}

static int get_int(const ember_gguf *f, const char *key, uint64_t neg_max, uint64_t pos_max, const char *want,
                   bool *neg, uint64_t *mag, ember_error *err) {
    const ember_gguf_kv *kv;
    int rc = lookup(f, key, &kv, err);
    if (rc) return rc;
    if (!kv_int(kv, neg, mag)) return type_error(f, kv, "an integer", err);
    if (!fits(*neg, *mag, neg_max, pos_max))
        return ember_err(err, EMBER_ERR_FORMAT, "%s: metadata '%.128s' is %s%llu, out of range for %s", f->path,
                         kv->key, *neg ? "-" : "", (unsigned long long)*mag, want);
    return EMBER_OK;
}

int ember_gguf_get_u32(const ember_gguf *f, const char *key, uint32_t *out, ember_error *err) {
    bool neg = false;
    uint64_t mag = 0;
    int rc = get_int(f, key, 0, UINT32_MAX, "u32", &neg, &mag, err);
    if (!rc) *out = (uint32_t)mag;
    return rc;
}

int ember_gguf_get_i32(const ember_gguf *f, const char *key, int32_t *out, ember_error *err) {
    bool neg = false;
    uint64_t mag = 0;
    int rc = get_int(f, key, (uint64_t)1 << 31, INT32_MAX, "i32", &neg, &mag, err);
    if (!rc) *out = (int32_t)to_signed(neg, mag);
    return rc;
}

int ember_gguf_get_u64(const ember_gguf *f, const char *key, uint64_t *out, ember_error *err) {
    bool neg = false;
    uint64_t mag = 0;
    int rc = get_int(f, key, 0, UINT64_MAX, "u64", &neg, &mag, err);
    if (!rc) *out = mag;
    return rc;
}

int ember_gguf_get_i64(const ember_gguf *f, const char *key, int64_t *out, ember_error *err) {
    bool neg = false;
    uint64_t mag = 0;
    int rc = get_int(f, key, (uint64_t)1 << 63, INT64_MAX, "i64", &neg, &mag, err);
    if (!rc) *out = to_signed(neg, mag);
    return rc;
}

int ember_gguf_get_f64(const ember_gguf *f, const char *key, double *out, ember_error *err) {
    const ember_gguf_kv *kv;
    int rc = lookup(f, key, &kv, err);
    if (rc) return rc;
    if (kv->type != EMBER_GGUF_F32 && kv->type != EMBER_GGUF_F64) return type_error(f, kv, "f32 or f64", err);
    *out = kv->f64;
    return EMBER_OK;
}

int ember_gguf_get_f32(const ember_gguf *f, const char *key, float *out, ember_error *err) {
    double d = 0;
    int rc = ember_gguf_get_f64(f, key, &d, err);
    if (!rc) *out = (float)d;
    return rc;
}

int ember_gguf_get_bool(const ember_gguf *f, const char *key, bool *out, ember_error *err) {
    const ember_gguf_kv *kv;
    int rc = lookup(f, key, &kv, err);
    if (rc) return rc;
    if (kv->type != EMBER_GGUF_BOOL) return type_error(f, kv, "bool", err);
    *out = kv->u64 != 0;
    return EMBER_OK;
}

int ember_gguf_get_str(const ember_gguf *f, const char *key, const char **out, size_t *len, ember_error *err) {
    const ember_gguf_kv *kv;
    int rc = lookup(f, key, &kv, err);
    if (rc) return rc;
    if (kv->type != EMBER_GGUF_STRING) return type_error(f, kv, "string", err);
    *out = kv->str;
    if (len) *len = kv->str_len;
    return EMBER_OK;
}

int ember_gguf_get_strs(const ember_gguf *f, const char *key, const char *const **strs, const size_t **lens,
                        size_t *n, ember_error *err) {
    const ember_gguf_kv *kv;
    int rc = lookup(f, key, &kv, err);
    if (rc) return rc;
    if (kv->type != EMBER_GGUF_ARRAY || kv->arr_type != EMBER_GGUF_STRING)
        return type_error(f, kv, "array of string", err);
    *strs = (const char *const *)kv->arr_strs;
    if (lens) *lens = kv->arr_str_lens;
    *n = kv->arr_len;
    return EMBER_OK;
}

int ember_gguf_get_f32s(const ember_gguf *f, const char *key, float **out, size_t *n, ember_error *err) {
    const ember_gguf_kv *kv;
    int rc = lookup(f, key, &kv, err);
    if (rc) return rc;
    if (kv->type != EMBER_GGUF_ARRAY || (kv->arr_type != EMBER_GGUF_F32 && kv->arr_type != EMBER_GGUF_F64))
        return type_error(f, kv, "array of f32", err);
    float *v = NULL;
    if (kv->arr_len) {
        v = ember_malloc(kv->arr_len * sizeof *v); /* arr_len * 4 <= arr_bytes */
        if (!v) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", f->path);
    }
    for (size_t i = 0; i < kv->arr_len; i++) {
        if (kv->arr_type == EMBER_GGUF_F32) {
            v[i] = ember_bits_to_f32(le32(kv->arr_data + 4 * i));
        } else {
            uint64_t u = le64(kv->arr_data + 8 * i);
            double d;
            memcpy(&d, &u, 8);
            v[i] = (float)d;
        }
    }
    *out = v;
    *n = kv->arr_len;
    return EMBER_OK;
}

int ember_gguf_get_i32s(const ember_gguf *f, const char *key, int32_t **out, size_t *n, ember_error *err) {
    const ember_gguf_kv *kv;
    int rc = lookup(f, key, &kv, err);
    if (rc) return rc;
    size_t es = kv->type == EMBER_GGUF_ARRAY ? vtype_size(kv->arr_type) : 0;
    bool neg = false;
    uint64_t mag = 0;
    if (!es || kv->arr_type == EMBER_GGUF_BOOL || kv->arr_type == EMBER_GGUF_F32 || kv->arr_type == EMBER_GGUF_F64)
        return type_error(f, kv, "array of integers", err);
    int32_t *v = NULL;
    if (kv->arr_len) {
        v = ember_malloc(kv->arr_len * sizeof *v); /* at most 4x arr_bytes */
        if (!v) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", f->path);
    }
    for (size_t i = 0; i < kv->arr_len; i++) {
        int_at(kv->arr_type, kv->arr_data + es * i, &neg, &mag);
        if (!fits(neg, mag, (uint64_t)1 << 31, INT32_MAX)) {
            free(v);
            return ember_err(err, EMBER_ERR_FORMAT,
                             "%s: metadata '%.128s': element %zu is %s%llu, out of range for i32", f->path,
                             kv->key, i, neg ? "-" : "", (unsigned long long)mag);
        }
        v[i] = (int32_t)to_signed(neg, mag);
    }
    *out = v;
    *n = kv->arr_len;
    return EMBER_OK;
}
