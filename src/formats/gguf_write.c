/*
 * gguf_write.c - see gguf_write.h. Metadata values are serialized into one
 * growing byte buffer as they are added; tensors keep their data until the
 * file is written. Only the caller's thread touches a writer.
 */
#define _POSIX_C_SOURCE 200809L
#include "gguf_write.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"

#define ALIGN 32u

typedef struct wtensor {
    char *name;
    ember_dtype t;
    int ndim;
    int64_t shape[4];
    void *data;
    size_t nbytes;
} wtensor;

struct ember_gguf_writer {
    unsigned char *kv; /* serialized pairs */
    size_t kv_len, kv_cap;
    size_t n_kv;
    char **keys;
    wtensor *tensors;
    size_t n_tensors, cap_tensors;
};

ember_gguf_writer *ember_gguf_writer_new(void) {
    return ember_calloc(1, sizeof(ember_gguf_writer));
}

void ember_gguf_writer_free(ember_gguf_writer *w) {
    if (!w) return;
    free(w->kv);
    for (size_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    free(w->keys);
    for (size_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        free(w->tensors[i].data);
    }
    free(w->tensors);
    free(w);
}

static bool put(ember_gguf_writer *w, const void *p, size_t n) {
    if (w->kv_len + n > w->kv_cap) {
        size_t cap = w->kv_cap ? w->kv_cap * 2 : 4096;
        while (cap < w->kv_len + n) cap *= 2;
        unsigned char *nk = ember_realloc(w->kv, cap);
        if (!nk) return false;
        w->kv = nk;
        w->kv_cap = cap;
    }
    memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
    return true;
}
static bool put_u32(ember_gguf_writer *w, uint32_t v) {
    return put(w, &v, 4); /* little-endian hosts only (x86-64) */
}
static bool put_u64(ember_gguf_writer *w, uint64_t v) {
    return put(w, &v, 8);
}
static bool put_str(ember_gguf_writer *w, const char *s) {
    size_t n = strlen(s);
    return put_u64(w, n) && put(w, s, n);
}

/* Starts a pair: checks the key, writes it and the value type. On failure
   the buffer is rolled back by the caller through *mark. */
static int begin(ember_gguf_writer *w, const char *key, uint32_t type, size_t *mark, ember_error *err) {
    if (!key || !*key || strlen(key) > 65535) return ember_err(err, EMBER_ERR_INVALID_ARG, "gguf: bad metadata key");
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->keys[i], key) == 0)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "gguf: duplicate metadata key '%s'", key);
    *mark = w->kv_len;
    if (!put_str(w, key) || !put_u32(w, type)) {
        w->kv_len = *mark;
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    }
    return EMBER_OK;
}

static int end(ember_gguf_writer *w, const char *key, bool ok, size_t mark, ember_error *err) {
    char **nk = ok ? ember_realloc(w->keys, (w->n_kv + 1) * sizeof *nk) : NULL;
    char *k = nk ? ember_strdup(key) : NULL;
    if (nk) w->keys = nk;
    if (!k) {
        w->kv_len = mark;
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    }
    w->keys[w->n_kv++] = k;
    return EMBER_OK;
}

#define SCALAR(fn, ctype, vtype, size)                                                         \
    int fn(ember_gguf_writer *w, const char *key, ctype val, ember_error *err) {               \
        size_t mark;                                                                           \
        int rc = begin(w, key, vtype, &mark, err);                                             \
        if (rc) return rc;                                                                     \
        return end(w, key, put(w, &val, size), mark, err);                                     \
    }
SCALAR(ember_gguf_set_u32, uint32_t, 4, 4)
SCALAR(ember_gguf_set_i32, int32_t, 5, 4)
SCALAR(ember_gguf_set_f32, float, 6, 4)

int ember_gguf_set_bool(ember_gguf_writer *w, const char *key, int val, ember_error *err) {
    size_t mark;
    int rc = begin(w, key, 7, &mark, err);
    if (rc) return rc;
    uint8_t b = val ? 1 : 0;
    return end(w, key, put(w, &b, 1), mark, err);
}

int ember_gguf_set_str(ember_gguf_writer *w, const char *key, const char *val, ember_error *err) {
    size_t mark;
    int rc = begin(w, key, 8, &mark, err);
    if (rc) return rc;
    return end(w, key, put_str(w, val), mark, err);
}

int ember_gguf_set_strs(ember_gguf_writer *w, const char *key, const char *const *vals, size_t n, ember_error *err) {
    size_t mark;
    int rc = begin(w, key, 9, &mark, err);
    if (rc) return rc;
    bool ok = put_u32(w, 8) && put_u64(w, n);
    for (size_t i = 0; ok && i < n; i++) ok = put_str(w, vals[i]);
    return end(w, key, ok, mark, err);
}

static int set_arr(ember_gguf_writer *w, const char *key, uint32_t et, const void *vals, size_t n, ember_error *err) {
    size_t mark, bytes;
    if (!ember_mul_ok(n, 4, &bytes)) return ember_err(err, EMBER_ERR_INVALID_ARG, "gguf: array too large");
    int rc = begin(w, key, 9, &mark, err);
    if (rc) return rc;
    return end(w, key, put_u32(w, et) && put_u64(w, n) && put(w, vals, bytes), mark, err);
}
int ember_gguf_set_f32s(ember_gguf_writer *w, const char *key, const float *vals, size_t n, ember_error *err) {
    return set_arr(w, key, 6, vals, n, err);
}
int ember_gguf_set_i32s(ember_gguf_writer *w, const char *key, const int32_t *vals, size_t n, ember_error *err) {
    return set_arr(w, key, 5, vals, n, err);
}
int ember_gguf_set_bools(ember_gguf_writer *w, const char *key, const bool *vals, size_t n, ember_error *err) {
    size_t mark;
    int rc = begin(w, key, 9, &mark, err);
    if (rc) return rc;
    bool ok = put_u32(w, 7) && put_u64(w, n);
    for (size_t i = 0; ok && i < n; i++) {
        uint8_t b = vals[i] ? 1 : 0;
        ok = put(w, &b, 1);
    }
    return end(w, key, ok, mark, err);
}

int ember_gguf_add_tensor(ember_gguf_writer *w, const char *name, ember_dtype t, int ndim, const int64_t *shape,
                          void *data, ember_error *err) {
    size_t n = 1, bytes;
    bool ok = name && *name && strlen(name) <= 64 && ndim >= 1 && ndim <= 4 && ember_dtype_to_gguf(t) >= 0;
    for (int i = 0; ok && i < ndim; i++) ok = shape[i] >= 1 && ember_mul_ok(n, (size_t)shape[i], &n);
    ok = ok && ember_dtype_nbytes(t, n, &bytes) && (size_t)shape[ndim - 1] % ember_dtype_get(t)->block_elems == 0;
    for (size_t i = 0; ok && i < w->n_tensors; i++) ok = strcmp(w->tensors[i].name, name) != 0;
    if (!ok) {
        free(data);
        return ember_err(err, EMBER_ERR_INVALID_ARG, "gguf: bad or duplicate tensor '%.64s'", name ? name : "");
    }
    if (w->n_tensors == w->cap_tensors) {
        size_t cap = w->cap_tensors ? w->cap_tensors * 2 : 64;
        wtensor *nt = ember_realloc(w->tensors, cap * sizeof *nt);
        if (!nt) {
            free(data);
            return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        }
        w->tensors = nt;
        w->cap_tensors = cap;
    }
    wtensor *d = &w->tensors[w->n_tensors];
    memset(d, 0, sizeof *d);
    if (!(d->name = ember_strdup(name))) {
        free(data);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    }
    d->t = t;
    d->ndim = ndim;
    for (int i = 0; i < ndim; i++) d->shape[i] = shape[i];
    d->data = data;
    d->nbytes = bytes;
    w->n_tensors++;
    return EMBER_OK;
}

static bool fput(FILE *fp, const void *p, size_t n) {
    return fwrite(p, 1, n, fp) == n;
}

int ember_gguf_write_file(const ember_gguf_writer *w, const char *path, ember_error *err) {
    size_t plen = strlen(path);
    char *tmp = ember_malloc(plen + 8);
    if (!tmp) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    snprintf(tmp, plen + 8, "%s.tmp", path);
    FILE *fp = fopen(tmp, "wb");
    if (!fp) {
        free(tmp);
        return ember_err(err, EMBER_ERR_IO, "%s: cannot create the file", path);
    }
    uint32_t version = 3;
    uint64_t nt = w->n_tensors, nkv = w->n_kv;
    bool ok = fput(fp, "GGUF", 4) && fput(fp, &version, 4) && fput(fp, &nt, 8) && fput(fp, &nkv, 8) &&
              fput(fp, w->kv, w->kv_len);
    size_t pos = 24 + w->kv_len, off = 0;
    for (size_t i = 0; ok && i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        uint64_t len = strlen(t->name), o = off;
        uint32_t nd = (uint32_t)t->ndim, type = (uint32_t)ember_dtype_to_gguf(t->t);
        ok = fput(fp, &len, 8) && fput(fp, t->name, len) && fput(fp, &nd, 4);
        for (int d = t->ndim - 1; ok && d >= 0; d--) {
            uint64_t ne = (uint64_t)t->shape[d];
            ok = fput(fp, &ne, 8);
        }
        ok = ok && fput(fp, &type, 4) && fput(fp, &o, 8);
        pos += 8 + len + 4 + 8 * (size_t)t->ndim + 4 + 8;
        off += (t->nbytes + ALIGN - 1) / ALIGN * ALIGN;
    }
    static const unsigned char zeros[ALIGN] = {0};
    if (ok && pos % ALIGN) ok = fput(fp, zeros, ALIGN - pos % ALIGN);
    for (size_t i = 0; ok && i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        ok = fput(fp, t->data, t->nbytes);
        if (ok && t->nbytes % ALIGN) ok = fput(fp, zeros, ALIGN - t->nbytes % ALIGN);
    }
    ok = fclose(fp) == 0 && ok;
    if (ok && rename(tmp, path) != 0) ok = false;
    if (!ok) remove(tmp);
    free(tmp);
    return ok ? EMBER_OK : ember_err(err, EMBER_ERR_IO, "%s: write failed", path);
}
