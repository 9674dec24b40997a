/*
 * jinja_value.h - value helpers shared by the Jinja interpreter's files (not
 * for use outside src/template/jinja*.c). Values live in a jinja_ctx arena; text
 * is written into caller-owned jsb builders. Functions that can fail return
 * 0 or an EMBER_ERR_* code and put a reason (without position) in why.
 */
#ifndef EMBER_TEMPLATE_JINJA_VALUE_H
#define EMBER_TEMPLATE_JINJA_VALUE_H

#include "template/jinja_internal.h"

/* A string view (not copied) and a copy into the arena (JV_UNDEFINED on
   failure). */
jv jv_strview(const char *p, size_t n);
jv jv_str_copy(jarena *a, const char *p, size_t n);
/* An empty list (JV_ARRAY or JV_TUPLE) / dict (JV_OBJECT, JV_KWARGS,
   JV_NAMESPACE); JV_UNDEFINED on failure. */
jv jv_list_new(jarena *a, jv_type type, size_t cap);
jv jv_dict_new(jarena *a, jv_type type);
bool jl_push(jarena *a, jv_list *l, jv x);
jv *jd_get(const jv_dict *d, const char *k, size_t kl);
/* Set: replace in place or append. Append: no duplicate check. Keys are not
   copied: they must live as long as the dict. */
bool jd_set(jarena *a, jv_dict *d, const char *k, size_t kl, jv v);
bool jd_append(jarena *a, jv_dict *d, const char *k, size_t kl, jv v);
bool jd_del(jv_dict *d, const char *k, size_t kl);

/* A "hole": the raw JavaScript undefined that the reference's first / last
   filters return for an empty list. Stored into a variable it becomes a plain
   undefined; almost any other use of it is an error there, and here. */
static inline jv jv_hole(void) {
    jv v;
    v.type = JV_UNDEFINED;
    v.u.n = 0;
    v.u.b = true;
    return v;
}
static inline bool jv_is_hole(jv v) {
    return v.type == JV_UNDEFINED && v.u.b;
}
static inline jv jv_unhole(jv v) {
    if (jv_is_hole(v)) v.u.b = false;
    return v;
}

const char *jv_type_name(jv_type t);
bool jv_truthy(jv v);

typedef struct jv_json_opts {
    int indent;           /* > 0: pretty-print */
    const char *item_sep; /* NULL: ", " (or "," when indenting) */
    const char *key_sep;  /* NULL: ": " */
    bool ensure_ascii, sort_keys;
} jv_json_opts;

/* JSON as the reference's tojson writes it; undef_null: undefined -> null
   (else "undefined"). */
int jv_tojson(jsb *b, jv v, const jv_json_opts *o, int depth, bool undef_null, char *why, size_t whylen);
/* What the reference prints for a value (RuntimeValue.toString). */
int jv_print(jsb *b, jv v, char *why, size_t whylen);
/* JavaScript String(value.value): used by ~, + and join. */
int jv_js_string(jsb *b, jv v, char *why, size_t whylen);
/* A number as the reference prints it (is_float: 1 -> "1.0"). */
void jv_num_print(double x, bool is_float, jsb *b);

double js_to_number(const char *s, size_t n);
double js_parse_float(const char *s, size_t n);
double js_parse_int(const char *s, size_t n);

bool jv_strict_eq(jv a, jv b);
bool jv_same_value_zero(jv a, jv b);
int jv_loose_eq(jv a, jv b, bool *out, char *why, size_t whylen);
int jv_compare(jv a, jv b, bool case_sensitive, int *out, char *why, size_t whylen);

#endif
