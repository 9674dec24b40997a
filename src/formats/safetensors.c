/*
 * safetensors.c - see safetensors.h.
 *
 * The parser trusts nothing in the file: every integer read from the header
 * is range-checked before it is used in arithmetic, and errors name the
 * file and the tensor ("model.safetensors: tensor 'x': ...").
 */
#define _POSIX_C_SOURCE 200809L
#include "safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"

uint64_t ember_hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}

void ember_st_free(ember_st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    free(f->index);
    ember_mapfile_free(f->map);
    free(f->path);
    free(f);
}

const ember_st_tensor *ember_st_find(const ember_st_file *f, const char *name) {
    if (!f || !f->index_cap) return NULL;
    size_t mask = f->index_cap - 1;
    for (size_t i = ember_hash_str(name) & mask;; i = (i + 1) & mask) {
        int t = f->index[i];
        if (t < 0) return NULL;
        if (strcmp(f->tensors[t].name, name) == 0) return &f->tensors[t];
    }
}

static int build_index(ember_st_file *f, ember_error *err) {
    size_t cap = 16;
    while (cap < (size_t)f->n_tensors * 2) cap *= 2;
    f->index = ember_malloc(cap * sizeof *f->index);
    if (!f->index) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", f->path);
    for (size_t i = 0; i < cap; i++) f->index[i] = -1;
    f->index_cap = cap;
    for (int t = 0; t < f->n_tensors; t++) {
        size_t i = ember_hash_str(f->tensors[t].name) & (cap - 1);
        while (f->index[i] >= 0) i = (i + 1) & (cap - 1);
        f->index[i] = t;
    }
    return EMBER_OK;
}

static int cmp_begin(const void *a, const void *b) {
    const ember_st_tensor *x = *(ember_st_tensor *const *)a, *y = *(ember_st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int parse_tensor(ember_st_file *f, const char *key, json_t *v, ember_st_tensor *t,
                        ember_error *err) {
    const char *p = f->path;
    if (!json_is_object(v))
        return ember_err(err, EMBER_ERR_FORMAT, "%s: tensor '%s': entry is not a JSON object", p, key);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd))
        return ember_err(err, EMBER_ERR_FORMAT, "%s: tensor '%s': missing or non-string 'dtype'", p, key);
    t->dtype = ember_dtype_from_st_name(json_string_value(jd));
    if (t->dtype == EMBER_DTYPE_INVALID)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%.32s'", p, key,
                         json_string_value(jd));
    if (!json_is_array(js))
        return ember_err(err, EMBER_ERR_FORMAT, "%s: tensor '%s': missing or non-array 'shape'", p, key);
    size_t nd = json_array_size(js);
    if (nd > EMBER_ST_MAX_DIMS)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: tensor '%s': %zu dimensions (at most %d)", p, key, nd,
                         EMBER_ST_MAX_DIMS);
    t->ndim = (int)nd;
    size_t nelem = 1;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return ember_err(err, EMBER_ERR_FORMAT, "%s: tensor '%s': shape[%zu] is not a non-negative integer",
                             p, key, i);
        t->shape[i] = json_integer_value(d);
        if (!ember_mul_ok(nelem, (size_t)t->shape[i], &nelem))
            return ember_err(err, EMBER_ERR_FORMAT, "%s: tensor '%s': shape overflows", p, key);
    }
    size_t bytes;
    if (!ember_dtype_nbytes(t->dtype, nelem, &bytes))
        return ember_err(err, EMBER_ERR_FORMAT, "%s: tensor '%s': byte size overflows", p, key);
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
        !json_is_integer(json_array_get(jo, 1)))
        return ember_err(err, EMBER_ERR_FORMAT, "%s: tensor '%s': 'data_offsets' must be two integers", p,
                         key);
    json_int_t b = json_integer_value(json_array_get(jo, 0)), e = json_integer_value(json_array_get(jo, 1));
    if (b < 0 || e < b)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: tensor '%s': invalid data_offsets [%lld, %lld]", p, key,
                         (long long)b, (long long)e);
    if ((unsigned long long)e > f->data_size)
        return ember_err(err, EMBER_ERR_FORMAT,
                         "%s: tensor '%s': data_offsets [%lld, %lld] outside the %zu-byte data section "
                         "(file truncated?)",
                         p, key, (long long)b, (long long)e, f->data_size);
    t->begin = (size_t)b;
    t->end = (size_t)e;
    if (t->end - t->begin != bytes)
        return ember_err(err, EMBER_ERR_FORMAT,
                         "%s: tensor '%s': data_offsets span %zu bytes but shape x dtype needs %zu", p, key,
                         t->end - t->begin, bytes);
    t->nbytes = bytes;
    t->name = ember_strdup(key);
    if (!t->name) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", p);
    return EMBER_OK;
}

int ember_st_parse(const char *name, const unsigned char *buf, size_t size, ember_st_file **out,
                   ember_error *err) {
    *out = NULL;
    ember_st_file *f = ember_calloc(1, sizeof *f);
    if (!f || !(f->path = ember_strdup(name))) {
        free(f);
        return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", name);
    }
    int rc = EMBER_OK;
    json_t *root = NULL;
    ember_st_tensor **sorted = NULL;
    if (size < 8) {
        rc = ember_err(err, EMBER_ERR_FORMAT, "%s: file is %zu bytes, too short for a safetensors header",
                       name, size);
        goto done;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    if (hlen < 2 || hlen > EMBER_ST_MAX_HEADER) {
        rc = ember_err(err, EMBER_ERR_FORMAT, "%s: header length %llu is out of range (2..%u)", name,
                       (unsigned long long)hlen, EMBER_ST_MAX_HEADER);
        goto done;
    }
    if (hlen > size - 8) {
        rc = ember_err(err, EMBER_ERR_FORMAT, "%s: header of %llu bytes runs past the end of the %zu-byte file (truncated?)",
                       name, (unsigned long long)hlen, size);
        goto done;
    }
    f->data_size = size - 8 - (size_t)hlen;
    json_error_t je;
    root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        rc = ember_err(err, EMBER_ERR_FORMAT, "%s: header is not valid JSON: %s (at byte %d)", name, je.text,
                       je.position);
        goto done;
    }
    if (!json_is_object(root)) {
        rc = ember_err(err, EMBER_ERR_FORMAT, "%s: header is not a JSON object", name);
        goto done;
    }
    size_t n = json_object_size(root);
    f->tensors = ember_calloc(n ? n : 1, sizeof *f->tensors);
    if (!f->tensors) {
        rc = ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", name);
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(val)) {
                rc = ember_err(err, EMBER_ERR_FORMAT, "%s: __metadata__ is not an object", name);
                goto done;
            }
            const char *mk;
            json_t *mv;
            json_object_foreach(val, mk, mv) {
                if (!json_is_string(mv)) {
                    rc = ember_err(err, EMBER_ERR_FORMAT, "%s: __metadata__ value '%.64s' is not a string",
                                   name, mk);
                    goto done;
                }
            }
            continue;
        }
        if (key[0] == '\0' || strlen(key) > 4096) {
            rc = ember_err(err, EMBER_ERR_FORMAT, "%s: tensor name is empty or too long", name);
            goto done;
        }
        rc = parse_tensor(f, key, val, &f->tensors[f->n_tensors], err);
        if (rc) goto done;
        f->n_tensors++;
    }
    /* overlap check on non-empty tensors sorted by start offset */
    sorted = ember_malloc((size_t)(f->n_tensors ? f->n_tensors : 1) * sizeof *sorted);
    if (!sorted) {
        rc = ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", name);
        goto done;
    }
    int ns = 0;
    for (int i = 0; i < f->n_tensors; i++)
        if (f->tensors[i].nbytes) sorted[ns++] = &f->tensors[i];
    qsort(sorted, (size_t)ns, sizeof *sorted, cmp_begin);
    for (int i = 1; i < ns; i++) {
        if (sorted[i]->begin < sorted[i - 1]->end) {
            rc = ember_err(err, EMBER_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap", name, sorted[i - 1]->name,
                           sorted[i]->name);
            goto done;
        }
    }
    const unsigned char *data = buf + 8 + hlen;
    for (int i = 0; i < f->n_tensors; i++) f->tensors[i].data = data + f->tensors[i].begin;
    rc = build_index(f, err);
done:
    free(sorted);
    json_decref(root);
    if (rc) {
        ember_st_free(f);
        return rc;
    }
    *out = f;
    return EMBER_OK;
}

int ember_st_open(const char *path, ember_st_file **out, ember_error *err) {
    *out = NULL;
    ember_mapfile *m;
    int rc = ember_mapfile_open(path, &m, err);
    if (rc) return rc;
    rc = ember_st_parse(path, m->data, m->size, out, err);
    if (rc) {
        ember_mapfile_free(m);
        return rc;
    }
    (*out)->map = m;
    return EMBER_OK;
}

/* ---- writing ------------------------------------------------------------------ */

#define FILL_CHUNK (1u << 20)

int ember_st_write(const char *path, const ember_st_out *t, int n, ember_st_fill_fn fill, void *user,
                   ember_error *err) {
    int rc = EMBER_OK;
    json_t *root = json_object();
    char *hdr = NULL;
    void *chunk = NULL;
    FILE *fp = NULL;
    size_t *sizes = ember_calloc((size_t)(n > 0 ? n : 1), sizeof *sizes);
    if (!root || !sizes) {
        rc = ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t ne = 1;
        json_t *shape = json_array();
        for (int d = 0; d < t[i].ndim; d++) {
            ne *= (size_t)t[i].shape[d];
            json_array_append_new(shape, json_integer(t[i].shape[d]));
        }
        if (!ember_dtype_nbytes(t[i].dtype, ne, &sizes[i])) {
            json_decref(shape);
            rc = ember_err(err, EMBER_ERR_INVALID_ARG, "%s: tensor '%s' has no valid size", path, t[i].name);
            goto done;
        }
        json_t *e = json_object();
        json_object_set_new(e, "dtype", json_string(ember_dtype_get(t[i].dtype)->st_name));
        json_object_set_new(e, "shape", shape);
        json_t *offs = json_array();
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)(off + sizes[i])));
        json_object_set_new(e, "data_offsets", offs);
        json_object_set_new(root, t[i].name, e);
        off += sizes[i];
    }
    json_t *meta = json_object();
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(root, "__metadata__", meta);
    hdr = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
    if (!hdr) {
        rc = ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    size_t hlen = strlen(hdr), padded = (hlen + 7) & ~(size_t)7;
    fp = fopen(path, "wb");
    if (!fp) {
        rc = ember_err(err, EMBER_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
        goto done;
    }
    unsigned char lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = (unsigned char)(((uint64_t)padded >> (8 * i)) & 0xff);
    fwrite(lenb, 1, 8, fp);
    fwrite(hdr, 1, hlen, fp);
    for (size_t i = hlen; i < padded; i++) fputc(' ', fp);
    chunk = ember_malloc(FILL_CHUNK * 8);
    if (!chunk) {
        rc = ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    for (int i = 0; i < n; i++) {
        size_t es = ember_dtype_get(t[i].dtype)->block_bytes, ne = sizes[i] / es;
        for (size_t first = 0; first < ne; first += FILL_CHUNK) {
            size_t cnt = ne - first < FILL_CHUNK ? ne - first : FILL_CHUNK;
            if ((rc = fill(user, i, first, cnt, chunk, err))) goto done;
            if (fwrite(chunk, es, cnt, fp) != cnt) {
                rc = ember_err(err, EMBER_ERR_IO, "%s: write failed: %s", path, strerror(errno));
                goto done;
            }
        }
    }
    if (fclose(fp) != 0) {
        fp = NULL;
        rc = ember_err(err, EMBER_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        goto done;
    }
    fp = NULL;
done:
    if (fp) fclose(fp);
    free(chunk);
    free(hdr);
    free(sizes);
    json_decref(root);
    return rc;
}
