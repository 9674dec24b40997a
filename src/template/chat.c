/*
 * chat.c - chat templates over the Jinja interpreter; see chat.h.
 *
 * Owns the JSON -> template value conversion (jansson stays out of the
 * interpreter). Conversion mirrors what the reference sees after
 * JSON.parse: whole numbers are integers, object members keep their order
 * except that array-index-like keys ("0", "1", ...) come first in ascending
 * order (Object.entries). Each render converts into a fresh jinja_ctx that
 * is freed before returning.
 */
#define _POSIX_C_SOURCE 200809L
#include "template/chat.h"
#include "core/alloc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_JSON_DEPTH 256

struct ember_chat_template {
    jinja_template *prog;
};

int ember_chat_template_compile(const char *text, size_t len, ember_chat_template **out, ember_error *err) {
    if (!out) return ember_err(err, EMBER_ERR_INVALID_ARG, "chat template: out is NULL");
    *out = NULL;
    ember_chat_template *t = ember_calloc(1, sizeof *t);
    if (!t) return ember_err(err, EMBER_ERR_NOMEM, "chat template: out of memory");
    int rc = jinja_compile(text, len, NULL, &t->prog, err);
    if (rc) {
        free(t);
        return rc;
    }
    *out = t;
    return EMBER_OK;
}

void ember_chat_template_free(ember_chat_template *t) {
    if (!t) return;
    jinja_free(t->prog);
    free(t);
}

/* An array index key as JavaScript orders them: "0" or [1-9][0-9]* below 2^32-1. */
static bool index_key(const char *k, size_t n, unsigned long long *v) {
    if (n == 0 || n > 10) return false;
    if (n > 1 && k[0] == '0') return false;
    unsigned long long x = 0;
    for (size_t i = 0; i < n; i++) {
        if (k[i] < '0' || k[i] > '9') return false;
        x = x * 10 + (unsigned)(k[i] - '0');
    }
    if (x >= 4294967295ULL) return false;
    *v = x;
    return true;
}

static int convert(jinja_ctx *c, const json_t *j, int depth, jv *out, ember_error *err);

static int convert_object(jinja_ctx *c, const json_t *j, int depth, jv *out, ember_error *err) {
    jv d = jinja_ctx_dict(c);
    if (d.type != JV_OBJECT) return ember_err(err, EMBER_ERR_NOMEM, "chat template: out of memory");
    /* index-like keys first, ascending; then the rest in order (keys may
       hold NUL bytes, so lengths come from jansson) */
    size_t n = json_object_size(j), ni = 0;
    void **iiters = NULL;
    unsigned long long *ivals = NULL;
    for (void *it = json_object_iter((json_t *)j); it; it = json_object_iter_next((json_t *)j, it)) {
        unsigned long long iv;
        if (!index_key(json_object_iter_key(it), json_object_iter_key_len(it), &iv)) continue;
        if (!iiters) {
            iiters = ember_malloc(n * sizeof *iiters);
            ivals = ember_malloc(n * sizeof *ivals);
            if (!iiters || !ivals) {
                free(iiters);
                free(ivals);
                return ember_err(err, EMBER_ERR_NOMEM, "chat template: out of memory");
            }
        }
        size_t k = ni++;
        while (k > 0 && ivals[k - 1] > iv) {
            iiters[k] = iiters[k - 1];
            ivals[k] = ivals[k - 1];
            k--;
        }
        iiters[k] = it;
        ivals[k] = iv;
    }
    int rc = EMBER_OK;
    for (size_t i = 0; i < ni && !rc; i++) {
        jv v;
        rc = convert(c, json_object_iter_value(iiters[i]), depth + 1, &v, err);
        if (!rc && !jinja_ctx_dict_add(c, d, json_object_iter_key(iiters[i]), json_object_iter_key_len(iiters[i]), v))
            rc = ember_err(err, EMBER_ERR_NOMEM, "chat template: out of memory");
    }
    free(iiters);
    free(ivals);
    if (rc) return rc;
    for (void *it = json_object_iter((json_t *)j); it; it = json_object_iter_next((json_t *)j, it)) {
        unsigned long long iv;
        const char *key = json_object_iter_key(it);
        size_t kl = json_object_iter_key_len(it);
        if (index_key(key, kl, &iv)) continue;
        jv v;
        if ((rc = convert(c, json_object_iter_value(it), depth + 1, &v, err))) return rc;
        if (!jinja_ctx_dict_add(c, d, key, kl, v)) return ember_err(err, EMBER_ERR_NOMEM, "chat template: out of memory");
    }
    *out = d;
    return EMBER_OK;
}

static int convert(jinja_ctx *c, const json_t *j, int depth, jv *out, ember_error *err) {
    if (depth > MAX_JSON_DEPTH)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "chat template: variables nested deeper than %d levels",
                         MAX_JSON_DEPTH);
    switch (json_typeof(j)) {
    case JSON_NULL: *out = jv_null(); return EMBER_OK;
    case JSON_TRUE: *out = jv_bool(true); return EMBER_OK;
    case JSON_FALSE: *out = jv_bool(false); return EMBER_OK;
    case JSON_INTEGER: *out = jv_int((double)json_integer_value(j)); return EMBER_OK;
    case JSON_REAL: {
        double d = json_real_value(j);
        *out = (isfinite(d) && d == floor(d)) ? jv_int(d) : jv_float(d);
        return EMBER_OK;
    }
    case JSON_STRING:
        *out = jinja_ctx_str(c, json_string_value(j), json_string_length(j));
        if (out->type != JV_STRING) return ember_err(err, EMBER_ERR_NOMEM, "chat template: out of memory");
        return EMBER_OK;
    case JSON_ARRAY: {
        jv l = jinja_ctx_list(c);
        if (l.type != JV_ARRAY) return ember_err(err, EMBER_ERR_NOMEM, "chat template: out of memory");
        for (size_t i = 0; i < json_array_size(j); i++) {
            jv v;
            int rc = convert(c, json_array_get(j, i), depth + 1, &v, err);
            if (rc) return rc;
            if (!jinja_ctx_list_push(c, l, v)) return ember_err(err, EMBER_ERR_NOMEM, "chat template: out of memory");
        }
        *out = l;
        return EMBER_OK;
    }
    case JSON_OBJECT: return convert_object(c, j, depth, out, err);
    }
    return ember_err(err, EMBER_ERR_INVALID_ARG, "chat template: unsupported JSON value");
}

int ember_chat_template_render(const ember_chat_template *t, const json_t *vars, const ember_chat_opts *opts,
                               char **out, size_t *out_len, ember_error *err) {
    if (!out) return ember_err(err, EMBER_ERR_INVALID_ARG, "chat template: out is NULL");
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!t) return ember_err(err, EMBER_ERR_INVALID_ARG, "chat template: template is NULL");
    if (vars && !json_is_object(vars))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "chat template: variables must be a JSON object");
    jinja_ctx *c = jinja_ctx_new(opts ? &opts->limits : NULL);
    if (!c) return ember_err(err, EMBER_ERR_NOMEM, "chat template: out of memory");
    if (opts && opts->now) jinja_ctx_set_time(c, opts->now);
    if (opts) jinja_ctx_enable_extensions(c, opts->extensions);
    int rc = EMBER_OK;
    if (vars) {
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)vars, key, val) {
            jv v;
            if (json_object_iter_key_len(json_object_key_to_iter(key)) != strlen(key)) {
                rc = ember_err(err, EMBER_ERR_INVALID_ARG, "chat template: a variable name contains a NUL byte");
                break;
            }
            if ((rc = convert(c, val, 1, &v, err))) break;
            if ((rc = jinja_ctx_set(c, key, v, err))) break;
        }
    }
    if (!rc) rc = jinja_render(t->prog, c, out, out_len, err);
    jinja_ctx_free(c);
    return rc;
}

const char *ember_chat_template_from_config(const json_t *cfg, const char *name) {
    const json_t *ct = json_object_get(cfg, "chat_template");
    if (json_is_string(ct)) return json_string_value(ct);
    if (!json_is_array(ct)) return NULL;
    const char *want = name ? name : "default";
    const char *first = NULL;
    for (size_t i = 0; i < json_array_size(ct); i++) {
        const json_t *e = json_array_get(ct, i);
        const json_t *n = json_object_get(e, "name"), *tx = json_object_get(e, "template");
        if (!json_is_string(tx)) continue;
        if (!first) first = json_string_value(tx);
        if (json_is_string(n) && strcmp(json_string_value(n), want) == 0) return json_string_value(tx);
    }
    return name ? NULL : first;
}
