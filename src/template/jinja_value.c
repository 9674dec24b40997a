/*
 * jinja_value.c - the value model of the Jinja interpreter: constructors,
 * lists and dicts, conversion to text (printing, JavaScript toString, JSON as
 * the reference's tojson writes it), equality and ordering; see
 * jinja_value.h.
 *
 * Ownership: every value lives in the arena of a jinja_ctx; functions here
 * that build text write into a caller-owned jsb.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/jinja_value.h"
#include "core/alloc.h"

jv jv_undefined(void) {
    jv v;
    memset(&v, 0, sizeof v);
    v.type = JV_UNDEFINED;
    return v;
}
jv jv_null(void) {
    jv v = jv_undefined();
    v.type = JV_NULL;
    return v;
}
jv jv_bool(bool b) {
    jv v = jv_undefined();
    v.type = JV_BOOL;
    v.u.b = b;
    return v;
}
jv jv_int(double n) {
    jv v = jv_undefined();
    v.type = JV_INT;
    v.u.n = n;
    return v;
}
jv jv_float(double n) {
    jv v = jv_undefined();
    v.type = JV_FLOAT;
    v.u.n = n;
    return v;
}
jv jv_strview(const char *p, size_t n) {
    jv v = jv_undefined();
    v.type = JV_STRING;
    v.u.s.p = p ? p : "";
    v.u.s.n = n;
    return v;
}

jv jv_str_copy(jarena *a, const char *p, size_t n) {
    char *c = ja_strdup(a, p, n);
    if (!c) return jv_undefined();
    return jv_strview(c, n);
}

jv jv_list_new(jarena *a, jv_type type, size_t cap) {
    jv v = jv_undefined();
    jv_list *l = ja_alloc(a, sizeof *l);
    if (!l) return v;
    if (cap) {
        l->items = ja_alloc(a, cap * sizeof(jv));
        if (!l->items) return v;
        l->cap = cap;
    }
    v.type = type;
    v.u.list = l;
    return v;
}

jv jv_dict_new(jarena *a, jv_type type) {
    jv v = jv_undefined();
    jv_dict *d = ja_alloc(a, sizeof *d);
    if (!d) return v;
    v.type = type;
    v.u.dict = d;
    return v;
}

bool jl_push(jarena *a, jv_list *l, jv x) {
    if (l->len == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        jv *items = ja_grow(a, l->items, l->cap * sizeof(jv), cap * sizeof(jv));
        if (!items) return false;
        l->items = items;
        l->cap = cap;
    }
    l->items[l->len++] = x;
    return true;
}

/* Dicts of more than INDEX_MIN entries get a hash index, so that lookups
   in big objects (untrusted JSON) stay O(1). */
#define INDEX_MIN 16

static uint64_t key_hash(const char *k, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)k[i]) * 1099511628211ULL;
    return h;
}

jv *jd_get(const jv_dict *d, const char *k, size_t kl) {
    if (d->idx) {
        size_t mask = d->icap - 1;
        for (size_t h = (size_t)key_hash(k, kl) & mask; d->idx[h]; h = (h + 1) & mask) {
            jv_entry *e = &d->e[d->idx[h] - 1];
            if (e->klen == kl && memcmp(e->key, k, kl) == 0) return &e->val;
        }
        return NULL;
    }
    for (size_t i = 0; i < d->len; i++)
        if (d->e[i].klen == kl && memcmp(d->e[i].key, k, kl) == 0) return &d->e[i].val;
    return NULL;
}

static void index_put(jv_dict *d, size_t i) {
    size_t mask = d->icap - 1, h = (size_t)key_hash(d->e[i].key, d->e[i].klen) & mask;
    while (d->idx[h]) h = (h + 1) & mask;
    d->idx[h] = (uint32_t)(i + 1);
}

static bool index_build(jarena *a, jv_dict *d, size_t icap) {
    uint32_t *idx = ja_alloc(a, icap * sizeof(uint32_t));
    if (!idx) return false;
    d->idx = idx;
    d->icap = icap;
    for (size_t i = 0; i < d->len; i++) index_put(d, i);
    return true;
}

bool jd_append(jarena *a, jv_dict *d, const char *k, size_t kl, jv v) {
    if (d->len == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        if (cap > UINT32_MAX / 2) return false;
        jv_entry *e = ja_grow(a, d->e, d->cap * sizeof(jv_entry), cap * sizeof(jv_entry));
        if (!e) return false;
        d->e = e;
        d->cap = cap;
    }
    d->e[d->len].key = k;
    d->e[d->len].klen = kl;
    d->e[d->len].val = v;
    d->len++;
    if (d->idx && d->len * 2 <= d->icap) {
        index_put(d, d->len - 1);
    } else if (d->len > INDEX_MIN) {
        size_t icap = 64;
        while (icap < d->len * 4) icap *= 2;
        if (!index_build(a, d, icap)) {
            d->len--;
            return false;
        }
    }
    return true;
}

bool jd_set(jarena *a, jv_dict *d, const char *k, size_t kl, jv v) {
    jv *slot = jd_get(d, k, kl);
    if (slot) {
        *slot = v;
        return true;
    }
    return jd_append(a, d, k, kl, v);
}

bool jd_del(jv_dict *d, const char *k, size_t kl) {
    for (size_t i = 0; i < d->len; i++)
        if (d->e[i].klen == kl && memcmp(d->e[i].key, k, kl) == 0) {
            memmove(&d->e[i], &d->e[i + 1], (d->len - i - 1) * sizeof(jv_entry));
            d->len--;
            d->idx = NULL; /* positions moved: back to linear lookups */
            d->icap = 0;
            return true;
        }
    return false;
}

const char *jv_type_name(jv_type t) {
    switch (t) {
    case JV_UNDEFINED: return "UndefinedValue";
    case JV_NULL: return "NullValue";
    case JV_BOOL: return "BooleanValue";
    case JV_INT: return "IntegerValue";
    case JV_FLOAT: return "FloatValue";
    case JV_STRING: return "StringValue";
    case JV_ARRAY: return "ArrayValue";
    case JV_TUPLE: return "TupleValue";
    case JV_OBJECT: return "ObjectValue";
    case JV_KWARGS: return "KeywordArgumentsValue";
    case JV_NAMESPACE: return "NamespaceValue";
    case JV_FUNCTION: return "FunctionValue";
    }
    return "Value";
}

bool jv_truthy(jv v) {
    switch (v.type) {
    case JV_UNDEFINED:
    case JV_NULL: return false;
    case JV_BOOL: return v.u.b;
    case JV_INT:
    case JV_FLOAT: return v.u.n != 0 && !isnan(v.u.n);
    case JV_STRING: return v.u.s.n > 0;
    case JV_ARRAY:
    case JV_TUPLE: return v.u.list->len > 0;
    case JV_OBJECT:
    case JV_KWARGS: return v.u.dict->len > 0;
    case JV_NAMESPACE:
    case JV_FUNCTION: return true;
    }
    return false;
}

/* ---- text ---- */

static int tj_fail(jsb *b, char *why, size_t whylen, const char *msg) {
    snprintf(why, whylen, "%s", msg);
    return b->failed ? b->failed : EMBER_ERR_FORMAT;
}

void jv_num_print(double x, bool is_float, jsb *b) {
    char buf[64];
    if (is_float) {
        if (x == 0 && signbit(x)) {
            jsb_adds(b, "-0.0");
            return;
        }
        if (isfinite(x) && x == floor(x) && fabs(x) < 1e21) {
            snprintf(buf, sizeof buf, "%.1f", x);
            jsb_adds(b, buf);
            return;
        }
    }
    js_num_str(x, buf);
    jsb_adds(b, buf);
}

static void json_str(jsb *b, const char *s, size_t n, bool ascii) {
    jsb_addc(b, '"');
    size_t run = 0; /* start of the pending unescaped run */
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char ubuf[16];
        size_t len = 1;
        if (c == '"')
            esc = "\\\"";
        else if (c == '\\')
            esc = "\\\\";
        else if (c == '\b')
            esc = "\\b";
        else if (c == '\f')
            esc = "\\f";
        else if (c == '\n')
            esc = "\\n";
        else if (c == '\r')
            esc = "\\r";
        else if (c == '\t')
            esc = "\\t";
        else if (c < 0x20) {
            snprintf(ubuf, sizeof ubuf, "\\u%04x", c);
            esc = ubuf;
        } else if (ascii && c >= 0x7F) {
            uint32_t cp = c == 0x7F ? 0x7F : ember_utf8_decode(s + i, n - i, &len);
            if (cp >= 0x10000) {
                uint32_t v = cp - 0x10000;
                snprintf(ubuf, sizeof ubuf, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
            } else {
                snprintf(ubuf, sizeof ubuf, "\\u%04x", cp);
            }
            esc = ubuf;
        }
        if (esc) {
            jsb_add(b, s + run, i - run);
            jsb_adds(b, esc);
            i += len;
            run = i;
        } else {
            i++;
        }
    }
    jsb_add(b, s + run, n - run);
    jsb_addc(b, '"');
}

/* Approximation of String.prototype.localeCompare (ICU root collation) for
   tojson(sort_keys=true): three levels - base characters (whitespace <
   punctuation in ICU's order < symbols < digits < letters, accents and case
   ignored), then accents, then case (lower first). Exact for ASCII keys. */
typedef struct coll_key {
    uint32_t prim; /* class << 24 | value */
    uint8_t sec, ter;
} coll_key;

static const char COLL_PUNCT[] = "_-,;:!?.'\"()[]{}@*/\\&#%`^+<=>|~$";
/* Latin-1 letters U+00C0..U+00FF: base letter and accent (1 acute, 2 grave,
   3 circumflex, 4 ring, 5 diaeresis, 6 tilde, 7 cedilla, 8 stroke, 9 other) */
static const char L1_BASE[] = "aaaaaaaceeeeiiiidnooooo*ouuuuyts" "aaaaaaaceeeeiiiidnooooo*ouuuuyty";
static const char L1_ACC[] = "21365497213521358621365082135199" "21365497213521358621365082135195";

static coll_key coll_of(uint32_t c) {
    coll_key k = {0, 0, 0};
    if (c == ' ' || (c >= 9 && c <= 13)) {
        k.prim = (0u << 24) | (c == ' ' ? 14u : c);
    } else if (c < 0x80 && c >= '0' && c <= '9') {
        k.prim = (3u << 24) | (c - '0');
    } else if (c < 0x80 && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) {
        k.prim = (4u << 24) | (c | 0x20);
        k.ter = c < 'a';
    } else if (c < 0x80) {
        const char *q = strchr(COLL_PUNCT, (int)c);
        k.prim = (1u << 24) | (q ? (uint32_t)(q - COLL_PUNCT) : 100u + c);
    } else if (c >= 0xC0 && c <= 0xFF && c != 0xD7 && c != 0xF7) {
        size_t i = c - 0xC0;
        k.prim = (4u << 24) | (uint32_t)(unsigned char)L1_BASE[i];
        k.sec = (uint8_t)(L1_ACC[i] - '0');
        k.ter = c < 0xE0;
    } else if (ju_lower(c) != c || ju_upper(c) != c) {
        uint32_t l = ju_lower(c);
        k.prim = (4u << 24) | (0x100u + (l & 0xFFFFFu));
        k.ter = l != c;
    } else {
        k.prim = (2u << 24) | (c & 0xFFFFFFu);
    }
    return k;
}

static int locale_cmp(const char *a, size_t an, const char *b, size_t bn) {
    for (int level = 0; level < 3; level++) {
        size_t i = 0, j = 0;
        while (i < an && j < bn) {
            size_t la, lb;
            coll_key ka = coll_of(ember_utf8_decode(a + i, an - i, &la)), kb = coll_of(ember_utf8_decode(b + j, bn - j, &lb));
            uint32_t x = level == 0 ? ka.prim : level == 1 ? ka.sec : ka.ter;
            uint32_t y = level == 0 ? kb.prim : level == 1 ? kb.sec : kb.ter;
            if (x != y) return x < y ? -1 : 1;
            i += la;
            j += lb;
        }
        if (i < an || j < bn) return i < an ? 1 : -1;
    }
    return 0;
}

int jv_tojson(jsb *b, jv v, const jv_json_opts *o, int depth, bool undef_null, char *why, size_t whylen) {
    if (depth > 512) return tj_fail(b, why, whylen, "tojson: value nested too deeply (a reference cycle?)");
    const char *item_sep = o->item_sep ? o->item_sep : (o->indent > 0 ? "," : ", ");
    const char *key_sep = o->key_sep ? o->key_sep : ": ";
    switch (v.type) {
    case JV_NULL: jsb_adds(b, "null"); break;
    case JV_UNDEFINED: jsb_adds(b, undef_null ? "null" : "undefined"); break;
    case JV_BOOL: jsb_adds(b, v.u.b ? "true" : "false"); break;
    case JV_INT:
    case JV_FLOAT:
        if (!isfinite(v.u.n))
            jsb_adds(b, "null");
        else
            jv_num_print(v.u.n, false, b);
        break;
    case JV_STRING: json_str(b, v.u.s.p, v.u.s.n, o->ensure_ascii); break;
    case JV_ARRAY: {
        const jv_list *l = v.u.list;
        bool ind = o->indent > 0 && l->len > 0;
        jsb_addc(b, '[');
        for (size_t i = 0; i < l->len; i++) {
            if (i) jsb_adds(b, item_sep);
            if (ind) {
                jsb_addc(b, '\n');
                for (int k = 0; k < (depth + 1) * o->indent; k++) jsb_addc(b, ' ');
            }
            int rc = jv_tojson(b, l->items[i], o, depth + 1, undef_null, why, whylen);
            if (rc) return rc;
        }
        if (ind) {
            jsb_addc(b, '\n');
            for (int k = 0; k < depth * o->indent; k++) jsb_addc(b, ' ');
        }
        jsb_addc(b, ']');
        break;
    }
    case JV_OBJECT:
    case JV_NAMESPACE: {
        const jv_dict *d = v.u.dict;
        bool ind = o->indent > 0 && d->len > 0;
        size_t *order = NULL;
        if (o->sort_keys && d->len > 1) {
            order = ember_malloc(d->len * sizeof *order);
            if (!order) return tj_fail(b, why, whylen, "tojson: out of memory");
            for (size_t i = 0; i < d->len; i++) order[i] = i;
            /* insertion sort is stable; key counts are small */
            for (size_t i = 1; i < d->len; i++) {
                size_t x = order[i], j = i;
                while (j > 0 && locale_cmp(d->e[order[j - 1]].key, d->e[order[j - 1]].klen, d->e[x].key,
                                           d->e[x].klen) > 0) {
                    order[j] = order[j - 1];
                    j--;
                }
                order[j] = x;
            }
        }
        jsb_addc(b, '{');
        for (size_t i = 0; i < d->len; i++) {
            const jv_entry *e = &d->e[order ? order[i] : i];
            if (i) jsb_adds(b, item_sep);
            if (ind) {
                jsb_addc(b, '\n');
                for (int k = 0; k < (depth + 1) * o->indent; k++) jsb_addc(b, ' ');
            }
            json_str(b, e->key, e->klen, o->ensure_ascii);
            jsb_adds(b, key_sep);
            int rc = jv_tojson(b, e->val, o, depth + 1, undef_null, why, whylen);
            if (rc) {
                free(order);
                return rc;
            }
        }
        free(order);
        if (ind) {
            jsb_addc(b, '\n');
            for (int k = 0; k < depth * o->indent; k++) jsb_addc(b, ' ');
        }
        jsb_addc(b, '}');
        break;
    }
    default: {
        char msg[96];
        snprintf(msg, sizeof msg, "Cannot convert to JSON: %s", jv_type_name(v.type));
        return tj_fail(b, why, whylen, msg);
    }
    }
    return b->failed;
}

int jv_print(jsb *b, jv v, char *why, size_t whylen) {
    switch (v.type) {
    case JV_UNDEFINED: jsb_adds(b, "undefined"); break;
    case JV_NULL: jsb_adds(b, "undefined"); break; /* the reference's none holds JS undefined */
    case JV_BOOL: jsb_adds(b, v.u.b ? "true" : "false"); break;
    case JV_INT: jv_num_print(v.u.n, false, b); break;
    case JV_FLOAT: jv_num_print(v.u.n, true, b); break;
    case JV_STRING: jsb_add(b, v.u.s.p, v.u.s.n); break;
    case JV_FUNCTION: jsb_adds(b, "[function]"); break;
    default: {
        jv_json_opts o;
        memset(&o, 0, sizeof o);
        return jv_tojson(b, v, &o, 0, false, why, whylen);
    }
    }
    return b->failed;
}

int jv_js_string(jsb *b, jv v, char *why, size_t whylen) {
    switch (v.type) {
    case JV_INT:
    case JV_FLOAT: jv_num_print(v.u.n, false, b); break;
    case JV_ARRAY:
    case JV_TUPLE:
        for (size_t i = 0; i < v.u.list->len; i++) {
            if (i) jsb_addc(b, ',');
            int rc = jv_print(b, v.u.list->items[i], why, whylen);
            if (rc) return rc;
        }
        break;
    case JV_OBJECT:
    case JV_KWARGS:
    case JV_NAMESPACE: jsb_adds(b, "[object Map]"); break;
    default: return jv_print(b, v, why, whylen);
    }
    return b->failed;
}

/* ---- numbers from strings (JavaScript rules) ---- */

static size_t skip_js_ws(const char *s, size_t n, size_t i) {
    while (i < n) {
        size_t l = ju_space_len(s + i, n - i);
        if (!l) break;
        i += l;
    }
    return i;
}

/* Length of the longest StrDecimalLiteral prefix of s (0 if none). */
static size_t decimal_prefix(const char *s, size_t n, bool *inf) {
    size_t i = 0;
    *inf = false;
    if (i < n && (s[i] == '+' || s[i] == '-')) i++;
    if (n - i >= 8 && memcmp(s + i, "Infinity", 8) == 0) {
        *inf = true;
        return i + 8;
    }
    size_t d0 = i;
    while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    size_t intd = i - d0, fracd = 0;
    if (i < n && s[i] == '.') {
        size_t f0 = i + 1, j = f0;
        while (j < n && s[j] >= '0' && s[j] <= '9') j++;
        fracd = j - f0;
        if (intd || fracd) i = j;
    }
    if (!intd && !fracd) return 0;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1;
        if (j < n && (s[j] == '+' || s[j] == '-')) j++;
        size_t e0 = j;
        while (j < n && s[j] >= '0' && s[j] <= '9') j++;
        if (j > e0) i = j;
    }
    return i;
}

static double strtod_n(const char *s, size_t n) {
    char buf[128];
    char *tmp = n < sizeof buf ? buf : ember_malloc(n + 1);
    if (!tmp) return NAN;
    memcpy(tmp, s, n);
    tmp[n] = '\0';
    double d = strtod(tmp, NULL);
    if (tmp != buf) free(tmp);
    return d;
}

double js_to_number(const char *s, size_t n) {
    size_t i = skip_js_ws(s, n, 0);
    size_t e = n;
    while (e > i) {
        size_t k = e - 1;
        while (k > i && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
        if (ju_space_len(s + k, e - k) != e - k) break;
        e = k;
    }
    if (i == e) return 0;
    const char *p = s + i;
    size_t m = e - i;
    if (m > 2 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X' || p[1] == 'o' || p[1] == 'O' || p[1] == 'b' || p[1] == 'B')) {
        int base = (p[1] == 'x' || p[1] == 'X') ? 16 : (p[1] == 'o' || p[1] == 'O') ? 8 : 2;
        double v = 0;
        for (size_t k = 2; k < m; k++) {
            int d;
            char c = p[k];
            if (c >= '0' && c <= '9')
                d = c - '0';
            else if (c >= 'a' && c <= 'f')
                d = c - 'a' + 10;
            else if (c >= 'A' && c <= 'F')
                d = c - 'A' + 10;
            else
                return NAN;
            if (d >= base) return NAN;
            v = v * base + d;
        }
        return v;
    }
    bool inf;
    size_t l = decimal_prefix(p, m, &inf);
    if (l != m) return NAN;
    if (inf) return p[0] == '-' ? -INFINITY : INFINITY;
    return strtod_n(p, m);
}

double js_parse_float(const char *s, size_t n) {
    size_t i = skip_js_ws(s, n, 0);
    bool inf;
    size_t l = decimal_prefix(s + i, n - i, &inf);
    if (!l) return NAN;
    if (inf) return s[i] == '-' ? -INFINITY : INFINITY;
    return strtod_n(s + i, l);
}

double js_parse_int(const char *s, size_t n) {
    size_t i = skip_js_ws(s, n, 0);
    size_t st = i;
    if (i < n && (s[i] == '+' || s[i] == '-')) i++;
    size_t d0 = i;
    while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    if (i == d0) return NAN;
    return strtod_n(s + st, i - st);
}

/* ---- equality ---- */

static bool same_object(jv a, jv b) {
    switch (a.type) {
    case JV_ARRAY:
    case JV_TUPLE: return a.u.list == b.u.list;
    case JV_OBJECT:
    case JV_KWARGS:
    case JV_NAMESPACE: return a.u.dict == b.u.dict;
    case JV_FUNCTION: return a.u.fn == b.u.fn;
    default: return false;
    }
}

/* JavaScript typeof-level class of .value */
typedef enum { K_UNDEF, K_NULL, K_BOOL, K_NUM, K_STR, K_OBJ } jskind;
static jskind kind_of(jv v) {
    switch (v.type) {
    case JV_UNDEFINED: return K_UNDEF;
    case JV_NULL: return K_UNDEF; /* none's .value is JS undefined in the reference too */
    case JV_BOOL: return K_BOOL;
    case JV_INT:
    case JV_FLOAT: return K_NUM;
    case JV_STRING: return K_STR;
    default: return K_OBJ;
    }
}

bool jv_strict_eq(jv a, jv b) {
    jskind ka = kind_of(a), kb = kind_of(b);
    if (ka != kb) return false;
    switch (ka) {
    case K_UNDEF:
    case K_NULL: return true;
    case K_BOOL: return a.u.b == b.u.b;
    case K_NUM: return a.u.n == b.u.n;
    case K_STR: return a.u.s.n == b.u.s.n && memcmp(a.u.s.p, b.u.s.p, a.u.s.n) == 0;
    case K_OBJ:
        if ((a.type == JV_ARRAY || a.type == JV_TUPLE) != (b.type == JV_ARRAY || b.type == JV_TUPLE)) return false;
        return same_object(a, b);
    }
    return false;
}

bool jv_same_value_zero(jv a, jv b) {
    if (kind_of(a) == K_NUM && kind_of(b) == K_NUM && isnan(a.u.n) && isnan(b.u.n)) return true;
    return jv_strict_eq(a, b);
}

int jv_loose_eq(jv a, jv b, bool *out, char *why, size_t whylen) {
    for (int guard = 0; guard < 4; guard++) {
        jskind ka = kind_of(a), kb = kind_of(b);
        if (ka == kb) {
            *out = jv_strict_eq(a, b);
            return 0;
        }
        if ((ka == K_NULL || ka == K_UNDEF) && (kb == K_NULL || kb == K_UNDEF)) {
            *out = true;
            return 0;
        }
        if (ka == K_NULL || ka == K_UNDEF || kb == K_NULL || kb == K_UNDEF) {
            *out = false;
            return 0;
        }
        if (ka == K_BOOL) {
            a = jv_int(a.u.b ? 1 : 0);
            continue;
        }
        if (kb == K_BOOL) {
            b = jv_int(b.u.b ? 1 : 0);
            continue;
        }
        if (ka == K_NUM && kb == K_STR) {
            *out = a.u.n == js_to_number(b.u.s.p, b.u.s.n);
            return 0;
        }
        if (ka == K_STR && kb == K_NUM) {
            *out = js_to_number(a.u.s.p, a.u.s.n) == b.u.n;
            return 0;
        }
        /* an object against a string or number: compare its primitive */
        jv *obj = ka == K_OBJ ? &a : &b;
        jsb t;
        jsb_init(&t, 1u << 16); /* bounds the work of one comparison */
        int rc = jv_js_string(&t, *obj, why, whylen);
        if (rc) {
            if (!why[0]) snprintf(why, whylen, "value too large to compare with ==");
            jsb_free(&t);
            return rc;
        }
        jv other = ka == K_OBJ ? b : a;
        bool eq;
        if (kind_of(other) == K_STR)
            eq = other.u.s.n == t.len && (t.len == 0 || memcmp(other.u.s.p, t.p, t.len) == 0);
        else
            eq = other.u.n == js_to_number(t.p ? t.p : "", t.len);
        jsb_free(&t);
        *out = eq;
        return 0;
    }
    *out = false;
    return 0;
}

/* ---- ordering (sort, dictsort) ---- */

static int cmp_str(const char *a, size_t an, const char *b, size_t bn, bool case_sensitive) {
    if (case_sensitive) {
        size_t m = an < bn ? an : bn;
        int c = m ? memcmp(a, b, m) : 0;
        if (c) return c < 0 ? -1 : 1;
        return an < bn ? -1 : an > bn ? 1 : 0;
    }
    size_t i = 0, j = 0;
    while (i < an && j < bn) {
        size_t la, lb;
        uint32_t ca = ju_lower(ember_utf8_decode(a + i, an - i, &la)), cb = ju_lower(ember_utf8_decode(b + j, bn - j, &lb));
        if (ca != cb) return ca < cb ? -1 : 1;
        i += la;
        j += lb;
    }
    if (i < an) return 1;
    if (j < bn) return -1;
    return 0;
}

int jv_compare(jv a, jv b, bool case_sensitive, int *out, char *why, size_t whylen) {
    if (a.type == JV_NULL && b.type == JV_NULL) {
        *out = 0;
        return 0;
    }
    if (a.type == JV_NULL || b.type == JV_NULL || a.type == JV_UNDEFINED || b.type == JV_UNDEFINED) {
        if (a.type == JV_UNDEFINED && b.type == JV_UNDEFINED) {
            *out = 0;
            return 0;
        }
        snprintf(why, whylen, "Cannot compare %s with %s", jv_type_name(a.type), jv_type_name(b.type));
        return EMBER_ERR_FORMAT;
    }
    bool na = a.type == JV_INT || a.type == JV_FLOAT || a.type == JV_BOOL;
    bool nb = b.type == JV_INT || b.type == JV_FLOAT || b.type == JV_BOOL;
    if (na && nb) {
        double x = a.type == JV_BOOL ? (a.u.b ? 1 : 0) : a.u.n;
        double y = b.type == JV_BOOL ? (b.u.b ? 1 : 0) : b.u.n;
        *out = x < y ? -1 : x > y ? 1 : 0;
        return 0;
    }
    if (a.type != b.type) {
        snprintf(why, whylen, "Cannot compare different types: %s and %s", jv_type_name(a.type),
                 jv_type_name(b.type));
        return EMBER_ERR_FORMAT;
    }
    if (a.type == JV_STRING) {
        *out = cmp_str(a.u.s.p, a.u.s.n, b.u.s.p, b.u.s.n, case_sensitive);
        return 0;
    }
    snprintf(why, whylen, "Cannot compare type: %s", jv_type_name(a.type));
    return EMBER_ERR_FORMAT;
}
