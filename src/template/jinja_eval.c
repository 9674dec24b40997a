/*
 * jinja_eval.c - compiling entry points, render contexts and the tree-walking
 * interpreter (statements, expressions, filters, tests, built-in functions
 * and methods); see jinja.h.
 *
 * Semantics follow the reference (@huggingface/jinja) node by node: scopes
 * are created by for loops, macro calls and call blocks only; macros see the
 * variables of their caller (dynamic scoping, as the reference does); a
 * break / continue discards the output of the current iteration; a for loop
 * whose every iteration was skipped by continue runs its else block.
 *
 * Ownership: all values and environments of a render live in the ctx arena
 * and are never freed one by one. Output goes through malloc'd jsb builders
 * owned by the function that declared them; each such function frees its
 * builders on every path. Limits (output size, arena size, iterations,
 * evaluation depth) turn runaway templates into EMBER_ERR_LIMIT errors.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/util.h"
#include "template/jinja_value.h"

#define DEFAULT_MAX_OUTPUT (16u * 1024u * 1024u)
#define DEFAULT_MAX_MEMORY (256u * 1024u * 1024u)
#define DEFAULT_MAX_ITERATIONS 10000000u
#define DEFAULT_MAX_DEPTH 500
#define DEFAULT_MAX_SOURCE (1u * 1024u * 1024u)
#define DEFAULT_MAX_NESTING 200

enum { EV_BREAK = 1, EV_CONTINUE = 2 };

typedef enum fkind { F_NAMESPACE, F_RAISE, F_RANGE, F_STRFTIME, F_METHOD, F_MACRO, F_CALLER, F_DICT } fkind;

typedef enum method {
    M_UPPER, M_LOWER, M_STRIP, M_TITLE, M_CAPITALIZE, M_RSTRIP, M_LSTRIP, M_STARTSWITH, M_ENDSWITH, M_SPLIT,
    M_REPLACE, M_GET, M_ITEMS, M_KEYS, M_VALUES, M_DICTSORT,
    /* extensions (jinja_ctx_enable_extensions) */
    M_FIND, M_RFIND, M_SCOUNT, M_RSPLIT, M_JOIN, M_SPLITLINES, M_ISDIGIT, M_ISALPHA, M_ISALNUM, M_ISSPACE,
    M_ISLOWER, M_ISUPPER, M_REMOVEPREFIX, M_REMOVESUFFIX, M_FORMAT,
    M_APPEND, M_EXTEND, M_POP, M_INDEX, M_LCOUNT, M_INSERT,
} method;

typedef struct jenv jenv;
struct jenv {
    jenv *parent;
    jv_dict vars;
};

struct jv_func {
    fkind kind;
    method m;
    jv self;
    const jnode *node;
    jenv *env;
};

struct jinja_ctx {
    jarena arena;
    jinja_limits lim;
    bool have_time;
    struct tm now;
    bool ext; /* Python-Jinja extensions where the reference fails */
    jv_dict vars;
};

typedef struct R {
    jinja_ctx *c;
    jarena *a;
    const jinja_template *t;
    ember_error *err;
    uint64_t iters;
    int depth;
    size_t ctl_pos; /* where the pending break / continue is */
} R;

static const char *const GLOBALS[] = {"namespace", "false", "true", "none", "raise_exception", "range",
                                      "strftime_now", "True", "False", "None"};

/* ---------------------------------------------------------------- errors */

static int rt_err(R *r, size_t pos, int code, const char *fmt, ...) EMBER_PRINTF(4, 5);
static int rt_err(R *r, size_t pos, int code, const char *fmt, ...) {
    char msg[EMBER_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return jinja_err_at(r->err, code, r->t->source, r->t->source_len, pos, "%s", msg);
}

static int rt_oom(R *r, size_t pos) {
    int code = r->a->failed ? r->a->failed : EMBER_ERR_NOMEM;
    if (code == EMBER_ERR_LIMIT)
        return rt_err(r, pos, code, "render memory limit of %zu bytes exceeded", r->c->lim.max_memory);
    return rt_err(r, pos, code, "out of memory");
}

static int sb_fail(R *r, const jsb *b, size_t pos) {
    if (b->failed == EMBER_ERR_LIMIT)
        return rt_err(r, pos, EMBER_ERR_LIMIT, "rendered text exceeds the limit of %zu bytes", r->c->lim.max_output);
    return rt_err(r, pos, EMBER_ERR_NOMEM, "out of memory");
}

/* A failure reported by a jinja_value.c helper. */
static int why_fail(R *r, int rc, const jsb *b, size_t pos, const char *why) {
    if (b && b->failed) return sb_fail(r, b, pos);
    if (rc == EMBER_ERR_NOMEM || rc == EMBER_ERR_LIMIT) return rt_err(r, pos, rc, "%s", why);
    return rt_err(r, pos, EMBER_ERR_FORMAT, "%s", why);
}

#define CK(x)                      \
    do {                           \
        int rc_ = (x);             \
        if (rc_) return rc_;       \
    } while (0)

/* The reference fails on almost any use of a hole (see jv_hole). */
static int nohole(R *r, jv v, size_t pos) {
    if (jv_is_hole(v)) return rt_err(r, pos, EMBER_ERR_FORMAT, "Cannot read properties of undefined (the first or last item of an empty list)");
    return 0;
}

static int enter(R *r, size_t pos) {
    if (++r->depth > r->c->lim.max_depth) {
        r->depth--;
        return rt_err(r, pos, EMBER_ERR_LIMIT, "evaluation nested deeper than %d levels", r->c->lim.max_depth);
    }
    return 0;
}

static int count_iter(R *r, size_t pos, uint64_t n) {
    r->iters += n;
    if (r->iters > r->c->lim.max_iterations)
        return rt_err(r, pos, EMBER_ERR_LIMIT, "more than %llu loop iterations",
                      (unsigned long long)r->c->lim.max_iterations);
    return 0;
}

/* ---------------------------------------------------------------- helpers */

static void jsb_init_out(R *r, jsb *b) {
    jsb_init(b, r->c->lim.max_output);
}

/* Moves a builder's text into an arena string (frees the builder). */
static int sb_take(R *r, jsb *b, size_t pos, jv *out) {
    if (b->failed) {
        int rc = sb_fail(r, b, pos);
        jsb_free(b);
        return rc;
    }
    *out = jv_str_copy(r->a, b->p ? b->p : "", b->len);
    jsb_free(b);
    if (out->type != JV_STRING) return rt_oom(r, pos);
    return 0;
}

static bool is_str(jv v) {
    return v.type == JV_STRING;
}
static bool is_arr(jv v) {
    return v.type == JV_ARRAY || v.type == JV_TUPLE;
}
static bool is_obj(jv v) { /* instanceof ObjectValue */
    return v.type == JV_OBJECT || v.type == JV_KWARGS;
}
static bool is_container(jv v) { /* isAttributeContainer */
    return v.type == JV_OBJECT || v.type == JV_KWARGS || v.type == JV_NAMESPACE;
}
static bool is_num(jv v) {
    return v.type == JV_INT || v.type == JV_FLOAT;
}
static bool str_eq(jv v, const char *s) {
    size_t l = strlen(s);
    return v.type == JV_STRING && v.u.s.n == l && memcmp(v.u.s.p, s, l) == 0;
}
static bool name_is(const char *p, size_t n, const char *s) {
    size_t l = strlen(s);
    return n == l && memcmp(p, s, l) == 0;
}

static jv mkfunc(R *r, fkind k, method m, jv self, const jnode *node, jenv *env) {
    jv_func *f = ja_alloc(r->a, sizeof *f);
    if (!f) return jv_undefined();
    f->kind = k;
    f->m = m;
    f->self = self;
    f->node = node;
    f->env = env;
    jv v = jv_undefined();
    v.type = JV_FUNCTION;
    v.u.fn = f;
    return v;
}

/* ---------------------------------------------------------------- environments */

static jenv *env_new(R *r, jenv *parent) {
    jenv *e = ja_alloc(r->a, sizeof *e);
    if (e) e->parent = parent;
    return e;
}

static bool env_set(R *r, jenv *e, const char *name, size_t n, jv v) {
    return jd_set(r->a, &e->vars, name, n, jv_unhole(v));
}

static jv env_get(const jenv *e, const char *name, size_t n) {
    for (; e; e = e->parent) {
        jv *v = jd_get(&e->vars, name, n);
        if (v) return *v;
    }
    return jv_undefined();
}

/* ---------------------------------------------------------------- strings */

typedef struct sview {
    const char *p;
    size_t n;
} sview;

static sview sv(jv v) {
    sview s = {v.u.s.p, v.u.s.n};
    return s;
}

/* JavaScript trim / trimStart / trimEnd */
static sview js_trim(sview s, bool left, bool right) {
    if (left) {
        while (s.n) {
            size_t l = ju_space_len(s.p, s.n);
            if (!l) break;
            s.p += l;
            s.n -= l;
        }
    }
    if (right) {
        while (s.n) {
            size_t k = s.n - 1;
            while (k > 0 && ((unsigned char)s.p[k] & 0xC0) == 0x80) k--;
            if (ju_space_len(s.p + k, s.n - k) != s.n - k) break;
            s.n = k;
        }
    }
    return s;
}

static int str_view_result(R *r, sview s, jv *out) {
    *out = jv_strview(s.p, s.n);
    (void)r;
    return 0;
}

static bool cased(uint32_t c) {
    return ju_upper(c) != c || ju_lower(c) != c || ju_upper_special(c) || ju_lower_special(c);
}
static bool case_ignorable(uint32_t c) {
    return (c >= 0x300 && c <= 0x36F) || c == '\'' || c == 0x2019 || c == 0xB7 || c == 0xAD;
}

/* Greek capital sigma lowers to final sigma at the end of a word (the one
   context-dependent rule of toLowerCase). */
static bool final_sigma(sview s, size_t at, size_t len) {
    bool before = false;
    for (size_t i = at; i > 0;) {
        size_t k = i - 1;
        while (k > 0 && ((unsigned char)s.p[k] & 0xC0) == 0x80) k--;
        size_t l;
        uint32_t c = ember_utf8_decode(s.p + k, s.n - k, &l);
        i = k;
        if (case_ignorable(c)) continue;
        before = cased(c);
        break;
    }
    if (!before) return false;
    for (size_t i = at + len; i < s.n;) {
        size_t l;
        uint32_t c = ember_utf8_decode(s.p + i, s.n - i, &l);
        i += l;
        if (case_ignorable(c)) continue;
        return !cased(c);
    }
    return true;
}

static int s_case(R *r, sview s, bool upper, size_t pos, jv *out) {
    jsb b;
    jsb_init_out(r, &b);
    for (size_t i = 0; i < s.n;) {
        unsigned char c = (unsigned char)s.p[i];
        if (c < 0x80) {
            char o = upper ? (c >= 'a' && c <= 'z' ? (char)(c - 32) : (char)c) : (c >= 'A' && c <= 'Z' ? (char)(c + 32) : (char)c);
            jsb_addc(&b, o);
            i++;
            continue;
        }
        size_t l;
        uint32_t cp = ember_utf8_decode(s.p + i, s.n - i, &l);
        if (cp == 0xFFFD && l == 1) {
            jsb_add(&b, s.p + i, 1);
            i++;
            continue;
        }
        const char *sp = upper ? ju_upper_special(cp) : ju_lower_special(cp);
        char enc[8];
        if (sp) {
            jsb_adds(&b, sp);
        } else if (!upper && cp == 0x3A3 && final_sigma(s, i, l)) {
            jsb_adds(&b, "\xCF\x82");
        } else {
            size_t el = ember_utf8_put(upper ? ju_upper(cp) : ju_lower(cp), enc);
            jsb_add(&b, enc, el);
        }
        i += l;
    }
    return sb_take(r, &b, pos, out);
}

static bool ascii_word(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

static int s_title(R *r, sview s, size_t pos, jv *out) {
    char *p = ja_alloc(r->a, s.n + 1);
    if (!p) return rt_oom(r, pos);
    for (size_t i = 0; i < s.n; i++) {
        unsigned char c = (unsigned char)s.p[i];
        bool boundary = i == 0 || !ascii_word((unsigned char)s.p[i - 1]);
        p[i] = (boundary && c >= 'a' && c <= 'z') ? (char)(c - 32) : (char)c;
    }
    *out = jv_strview(p, s.n);
    return 0;
}

static int s_capitalize(R *r, sview s, size_t pos, jv *out) {
    if (s.n == 0) return str_view_result(r, s, out);
    size_t l;
    uint32_t cp = ember_utf8_decode(s.p, s.n, &l);
    jsb b;
    jsb_init_out(r, &b);
    /* charAt(0).toUpperCase(): a character outside the BMP is half a
       surrogate pair there, which has no case */
    const char *sp = ju_upper_special(cp);
    if (sp) {
        jsb_adds(&b, sp);
    } else if ((cp == 0xFFFD && l == 1) || cp >= 0x10000) {
        jsb_add(&b, s.p, l);
    } else {
        char enc[8];
        jsb_add(&b, enc, ember_utf8_put(ju_upper(cp), enc));
    }
    jsb_add(&b, s.p + l, s.n - l);
    return sb_take(r, &b, pos, out);
}

/* First occurrence of n in h. Short needles: a direct scan; long ones:
   Knuth-Morris-Pratt, so that no input makes a search quadratic. */
static const char *memfind(const char *h, size_t hn, const char *n, size_t nn) {
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    if (nn <= 16) {
        for (const char *p = h; (size_t)(p - h) + nn <= hn;) {
            p = memchr(p, n[0], hn - nn + 1 - (size_t)(p - h));
            if (!p) return NULL;
            if (memcmp(p, n, nn) == 0) return p;
            p++;
        }
        return NULL;
    }
    size_t *fail = ember_malloc(nn * sizeof *fail);
    if (!fail) { /* out of memory: fall back to the direct scan */
        for (size_t i = 0; i + nn <= hn; i++)
            if (h[i] == n[0] && memcmp(h + i, n, nn) == 0) return h + i;
        return NULL;
    }
    fail[0] = 0;
    for (size_t i = 1, k = 0; i < nn; i++) {
        while (k > 0 && n[i] != n[k]) k = fail[k - 1];
        if (n[i] == n[k]) k++;
        fail[i] = k;
    }
    const char *found = NULL;
    for (size_t i = 0, k = 0; i < hn; i++) {
        while (k > 0 && h[i] != n[k]) k = fail[k - 1];
        if (h[i] == n[k]) k++;
        if (k == nn) {
            found = h + i + 1 - nn;
            break;
        }
    }
    free(fail);
    return found;
}

/* JavaScript-style replace of old by new; count < 0: all. */
static int s_replace(R *r, sview s, sview old, sview nw, double count, size_t pos, jv *out) {
    if (count == 0) return str_view_result(r, s, out);
    double remaining = count < 0 ? INFINITY : count;
    jsb b;
    jsb_init_out(r, &b);
    if (old.n == 0) {
        size_t i = 0;
        while (i <= s.n) {
            if (remaining > 0) {
                jsb_add(&b, nw.p, nw.n);
                remaining--;
            }
            if (i == s.n) break;
            size_t l;
            ember_utf8_decode(s.p + i, s.n - i, &l);
            jsb_add(&b, s.p + i, l);
            i += l;
        }
    } else {
        size_t i = 0;
        while (i < s.n) {
            const char *f = remaining > 0 ? memfind(s.p + i, s.n - i, old.p, old.n) : NULL;
            if (!f) break;
            size_t at = (size_t)(f - s.p);
            jsb_add(&b, s.p + i, at - i);
            jsb_add(&b, nw.p, nw.n);
            remaining--;
            i = at + old.n;
        }
        jsb_add(&b, s.p + i, s.n - i);
    }
    return sb_take(r, &b, pos, out);
}

/* UTF-16 unit at index i (negative: from the end), as a string; undefined
   when out of range. A half of a surrogate pair becomes U+FFFD. */
static jv s_at(R *r, sview s, double idx) {
    size_t len16 = ember_utf16_len(s.p, s.n);
    double i = trunc(idx);
    if (i < 0) i += (double)len16;
    if (!(i >= 0 && i < (double)len16)) return jv_undefined();
    size_t want = (size_t)i, u = 0;
    for (size_t k = 0; k < s.n;) {
        size_t l;
        uint32_t cp = ember_utf8_decode(s.p + k, s.n - k, &l);
        size_t units = cp >= 0x10000 ? 2 : 1;
        if (want < u + units) {
            if (units == 2) return jv_strview("\xEF\xBF\xBD", 3);
            return jv_strview(s.p + k, l);
        }
        u += units;
        k += l;
    }
    (void)r;
    return jv_undefined();
}

/* Splits a string into code points (Array.from). */
static int s_codepoints(R *r, sview s, jv_list **out, size_t pos) {
    jv l = jv_list_new(r->a, JV_ARRAY, 0);
    if (l.type != JV_ARRAY) return rt_oom(r, pos);
    for (size_t k = 0; k < s.n;) {
        size_t len;
        ember_utf8_decode(s.p + k, s.n - k, &len);
        if (!jl_push(r->a, l.u.list, jv_strview(s.p + k, len))) return rt_oom(r, pos);
        k += len;
    }
    *out = l.u.list;
    return 0;
}

/* ---------------------------------------------------------------- forward */

static int eval(R *r, const jnode *x, jenv *env, jv *out);
static int exec_block(R *r, const jnodes *body, jenv *env, jsb *sink);
static int call_function(R *r, jv fn, jv *args, size_t nargs, jenv *env, size_t pos, jv *out);
static int ext_call_method(R *r, const jv_func *f, jv *argv, size_t argc, size_t pos, jv *out);
static bool ext_method_of(R *r, jv obj, const char *name, size_t n, jv *out);
static int ext_filter(R *r, jv v, const jnode *f, jenv *env, jv *out, bool *handled);

/* ---------------------------------------------------------------- arguments */

typedef struct args {
    jv *pos;
    size_t npos, cap;
    jv_dict kw; /* keyword arguments in order */
} args;

static int args_push(R *r, args *a, jv v, size_t pos) {
    if (a->npos == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 4;
        jv *p = ja_grow(r->a, a->pos, a->cap * sizeof(jv), (cap + 1) * sizeof(jv));
        if (!p) return rt_oom(r, pos);
        a->pos = p;
        a->cap = cap;
    }
    a->pos[a->npos++] = v;
    return 0;
}

static int eval_args(R *r, const jnodes *list, jenv *env, args *a) {
    memset(a, 0, sizeof *a);
    for (size_t i = 0; i < list->n; i++) {
        const jnode *x = list->v[i];
        if (x->kind == N_SPREAD) {
            jv v;
            CK(eval(r, x->a, env, &v));
            if (!is_arr(v)) return rt_err(r, x->pos, EMBER_ERR_FORMAT, "Cannot unpack non-iterable type: %s", jv_type_name(v.type));
            for (size_t k = 0; k < v.u.list->len; k++) CK(args_push(r, a, v.u.list->items[k], x->pos));
        } else if (x->kind != N_KWARG && x->kind != N_KWSPREAD) {
            jv v;
            CK(eval(r, x, env, &v));
            CK(args_push(r, a, v, x->pos));
        }
    }
    for (size_t i = 0; i < list->n; i++) {
        const jnode *x = list->v[i];
        if (x->kind == N_KWARG) {
            if (jd_get(&a->kw, x->s, x->n))
                return rt_err(r, x->pos, EMBER_ERR_FORMAT, "Got multiple values for keyword argument '%.*s'",
                              (int)EMBER_MIN(x->n, 64), x->s);
            jv v;
            CK(eval(r, x->b, env, &v));
            if (!jd_append(r->a, &a->kw, x->s, x->n, v)) return rt_oom(r, x->pos);
        } else if (x->kind == N_KWSPREAD) {
            jv v;
            CK(eval(r, x->a, env, &v));
            if (!is_obj(v))
                return rt_err(r, x->pos, EMBER_ERR_FORMAT, "Argument after ** must be a mapping, not %s", jv_type_name(v.type));
            for (size_t k = 0; k < v.u.dict->len; k++) {
                const jv_entry *e = &v.u.dict->e[k];
                if (jd_get(&a->kw, e->key, e->klen))
                    return rt_err(r, x->pos, EMBER_ERR_FORMAT, "Got multiple values for keyword argument '%.*s'",
                                  (int)EMBER_MIN(e->klen, 64), e->key);
                if (!jd_append(r->a, &a->kw, e->key, e->klen, e->val)) return rt_oom(r, x->pos);
            }
        }
    }
    return 0;
}

/* The argument vector a call receives: positional + a KWARGS value if any. */
static int args_flat(R *r, args *a, bool always_kwargs, size_t pos) {
    if (a->kw.len || always_kwargs) {
        jv kw = jv_dict_new(r->a, JV_KWARGS);
        if (kw.type != JV_KWARGS) return rt_oom(r, pos);
        *kw.u.dict = a->kw;
        CK(args_push(r, a, kw, pos));
    }
    return 0;
}

static jv *kwget(args *a, const char *name) {
    return jd_get(&a->kw, name, strlen(name));
}

/* args.at(i) ?? kwargs.get(name) ?? NULL */
static jv *arg_or_kw(args *a, size_t i, const char *name) {
    if (i < a->npos) return &a->pos[i];
    return kwget(a, name);
}

/* ---------------------------------------------------------------- tests */

static int apply_test(R *r, const char *name, size_t nlen, jv v, const jv *arg, size_t pos, bool *res) {
#define T(s) name_is(name, nlen, s)
    if (T("boolean")) *res = v.type == JV_BOOL;
    else if (T("callable")) *res = v.type == JV_FUNCTION;
    else if (T("odd") || T("even")) {
        if (v.type != JV_INT)
            return rt_err(r, pos, EMBER_ERR_FORMAT, "cannot %.*s on %s", (int)nlen, name, jv_type_name(v.type));
        bool odd = fmod(v.u.n, 2) != 0;
        *res = T("odd") ? odd : !odd;
    } else if (T("false")) *res = v.type == JV_BOOL && !v.u.b;
    else if (T("true")) *res = v.type == JV_BOOL && v.u.b;
    else if (T("none")) *res = v.type == JV_NULL;
    else if (T("string")) *res = v.type == JV_STRING;
    else if (T("number")) *res = is_num(v);
    else if (T("integer")) *res = v.type == JV_INT;
    else if (T("iterable")) *res = v.type == JV_ARRAY || v.type == JV_STRING;
    else if (T("mapping")) *res = is_obj(v);
    else if (T("sequence")) *res = is_arr(v) || is_obj(v) || v.type == JV_STRING;
    else if (T("lower") || T("upper")) {
        *res = false;
        if (v.type == JV_STRING) {
            jv c;
            CK(s_case(r, sv(v), T("upper"), pos, &c));
            *res = c.u.s.n == v.u.s.n && memcmp(c.u.s.p, v.u.s.p, c.u.s.n) == 0;
        }
    } else if (T("defined")) *res = v.type != JV_UNDEFINED;
    else if (T("undefined")) *res = v.type == JV_UNDEFINED;
    else if (T("equalto") || T("eq")) {
        if (!arg) return rt_err(r, pos, EMBER_ERR_FORMAT, "the '%.*s' test needs a value to compare with", (int)nlen, name);
        *res = jv_strict_eq(v, *arg);
    } else if (r->c->ext && T("float")) *res = v.type == JV_FLOAT;
    else
        return rt_err(r, pos, EMBER_ERR_FORMAT, "unknown test '%.*s'", (int)EMBER_MIN(nlen, 64), name);
#undef T
    return 0;
}

static bool test_exists(const char *name, size_t n) {
    static const char *const names[] = {"boolean", "callable", "odd", "even", "false", "true", "none",
                                        "string", "number", "integer", "iterable", "mapping", "sequence",
                                        "lower", "upper", "defined", "undefined", "equalto", "eq"};
    for (size_t i = 0; i < EMBER_ARRAY_LEN(names); i++)
        if (name_is(name, n, names[i])) return true;
    return false;
}

/* ---------------------------------------------------------------- sorting */

typedef struct sort_ctx {
    R *r;
    size_t pos;
    bool case_sensitive, reverse;
    const char *attr; /* dotted attribute path or NULL */
    size_t attr_len;
    int by_value; /* dictsort: compare items[1] */
    int dictsort;
} sort_ctx;

static jv attr_value(jv item, const char *path, size_t plen) {
    jv v = item;
    size_t i = 0;
    for (;;) {
        size_t j = i;
        while (j < plen && path[j] != '.') j++;
        const char *part = path + i;
        size_t pl = j - i;
        if (is_container(v)) {
            jv *f = jd_get(v.u.dict, part, pl);
            v = f ? *f : jv_undefined();
        } else if (is_arr(v)) {
            double idx = js_parse_int(part, pl);
            if (!isnan(idx) && idx >= 0 && idx < (double)v.u.list->len)
                v = v.u.list->items[(size_t)idx];
            else
                return jv_undefined();
        } else {
            return jv_undefined();
        }
        if (j >= plen) break;
        i = j + 1;
    }
    return v;
}

static int sort_cmp(sort_ctx *s, jv a, jv b, int *out) {
    if (s->dictsort) {
        a = a.u.list->items[s->by_value];
        b = b.u.list->items[s->by_value];
    } else if (s->attr) {
        a = attr_value(a, s->attr, s->attr_len);
        b = attr_value(b, s->attr, s->attr_len);
    }
    char why[160];
    int rc = jv_compare(a, b, s->case_sensitive, out, why, sizeof why);
    if (rc) return why_fail(s->r, rc, NULL, s->pos, why);
    if (s->reverse) *out = -*out;
    return 0;
}

/* Stable merge sort of v[0..n) with a failing comparator. */
static int merge_sort(sort_ctx *s, jv *v, jv *tmp, size_t n) {
    if (n < 2) return 0;
    size_t h = n / 2;
    CK(merge_sort(s, v, tmp, h));
    CK(merge_sort(s, v + h, tmp, n - h));
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int c;
        CK(sort_cmp(s, v[j], v[i], &c));
        if (c < 0)
            tmp[k++] = v[j++];
        else
            tmp[k++] = v[i++];
    }
    while (i < h) tmp[k++] = v[i++];
    while (j < n) tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof(jv));
    return 0;
}

static int sorted_copy(R *r, const jv_list *in, sort_ctx *s, jv *out) {
    jv l = jv_list_new(r->a, JV_ARRAY, in->len);
    jv *tmp = ja_alloc(r->a, (in->len + 1) * sizeof(jv));
    if (l.type != JV_ARRAY || !tmp) return rt_oom(r, s->pos);
    if (in->len) memcpy(l.u.list->items, in->items, in->len * sizeof(jv));
    l.u.list->len = in->len;
    CK(merge_sort(s, l.u.list->items, tmp, in->len));
    *out = l;
    return 0;
}

/* ---------------------------------------------------------------- dict methods */

static int pair(R *r, const char *k, size_t kl, jv v, size_t pos, jv *out) {
    jv p = jv_list_new(r->a, JV_ARRAY, 2);
    if (p.type != JV_ARRAY) return rt_oom(r, pos);
    p.u.list->items[0] = jv_strview(k, kl);
    p.u.list->items[1] = v;
    p.u.list->len = 2;
    *out = p;
    return 0;
}

static int dict_items(R *r, const jv_dict *d, size_t pos, jv *out) {
    jv l = jv_list_new(r->a, JV_ARRAY, d->len);
    if (l.type != JV_ARRAY) return rt_oom(r, pos);
    for (size_t i = 0; i < d->len; i++) CK(pair(r, d->e[i].key, d->e[i].klen, d->e[i].val, pos, &l.u.list->items[i]));
    l.u.list->len = d->len;
    *out = l;
    return 0;
}

static int dict_keys(R *r, const jv_dict *d, bool values, size_t pos, jv *out) {
    jv l = jv_list_new(r->a, JV_ARRAY, d->len);
    if (l.type != JV_ARRAY) return rt_oom(r, pos);
    for (size_t i = 0; i < d->len; i++)
        l.u.list->items[i] = values ? d->e[i].val : jv_strview(d->e[i].key, d->e[i].klen);
    l.u.list->len = d->len;
    *out = l;
    return 0;
}

/* Runs a bound method. argv may end with a JV_KWARGS value. */
static int call_method(R *r, const jv_func *f, jv *argv, size_t argc, size_t pos, jv *out) {
    jv self = f->self;
    switch (f->m) {
    case M_UPPER: return s_case(r, sv(self), true, pos, out);
    case M_LOWER: return s_case(r, sv(self), false, pos, out);
    case M_STRIP: return str_view_result(r, js_trim(sv(self), true, true), out);
    case M_LSTRIP: return str_view_result(r, js_trim(sv(self), true, false), out);
    case M_RSTRIP: return str_view_result(r, js_trim(sv(self), false, true), out);
    case M_TITLE: return s_title(r, sv(self), pos, out);
    case M_CAPITALIZE: return s_capitalize(r, sv(self), pos, out);
    case M_STARTSWITH:
    case M_ENDSWITH: {
        bool sw = f->m == M_STARTSWITH;
        const char *nm = sw ? "startswith" : "endswith";
        if (argc == 0) return rt_err(r, pos, EMBER_ERR_FORMAT, "%s() requires at least one argument", nm);
        jv p = argv[0];
        sview s = sv(self);
        if (p.type == JV_STRING) {
            bool ok = p.u.s.n <= s.n &&
                      memcmp(sw ? s.p : s.p + s.n - p.u.s.n, p.u.s.p, p.u.s.n) == 0;
            *out = jv_bool(ok);
            return 0;
        }
        if (is_arr(p)) {
            for (size_t i = 0; i < p.u.list->len; i++) {
                jv it = p.u.list->items[i];
                if (it.type != JV_STRING) return rt_err(r, pos, EMBER_ERR_FORMAT, "%s() tuple elements must be strings", nm);
                if (it.u.s.n <= s.n && memcmp(sw ? s.p : s.p + s.n - it.u.s.n, it.u.s.p, it.u.s.n) == 0) {
                    *out = jv_bool(true);
                    return 0;
                }
            }
            *out = jv_bool(false);
            return 0;
        }
        return rt_err(r, pos, EMBER_ERR_FORMAT, "%s() argument must be a string or tuple of strings", nm);
    }
    case M_SPLIT: {
        jv sep = argc > 0 ? argv[0] : jv_null();
        if (sep.type != JV_STRING && sep.type != JV_NULL)
            return rt_err(r, pos, EMBER_ERR_FORMAT, "sep argument must be a string or null");
        jv maxv = argc > 1 ? argv[1] : jv_int(-1);
        if (maxv.type != JV_INT) return rt_err(r, pos, EMBER_ERR_FORMAT, "maxsplit argument must be a number");
        double maxsplit = maxv.u.n;
        jv l = jv_list_new(r->a, JV_ARRAY, 0);
        if (l.type != JV_ARRAY) return rt_oom(r, pos);
        sview s = sv(self);
        if (sep.type == JV_NULL) {
            sview t = js_trim(s, true, false);
            size_t i = 0;
            while (i < t.n) {
                size_t w = ju_space_len(t.p + i, t.n - i);
                if (w) {
                    i += w;
                    continue;
                }
                size_t st = i;
                while (i < t.n && !ju_space_len(t.p + i, t.n - i)) {
                    size_t cl;
                    ember_utf8_decode(t.p + i, t.n - i, &cl);
                    i += cl;
                }
                if (maxsplit != -1 && (double)l.u.list->len >= maxsplit) {
                    if (!jl_push(r->a, l.u.list, jv_strview(t.p + st, t.n - st))) return rt_oom(r, pos);
                    break;
                }
                if (!jl_push(r->a, l.u.list, jv_strview(t.p + st, i - st))) return rt_oom(r, pos);
            }
        } else {
            if (sep.u.s.n == 0) return rt_err(r, pos, EMBER_ERR_FORMAT, "empty separator");
            size_t i = 0;
            for (;;) {
                const char *f2 = memfind(s.p + i, s.n - i, sep.u.s.p, sep.u.s.n);
                size_t end = f2 ? (size_t)(f2 - s.p) : s.n;
                if (maxsplit != -1 && (double)l.u.list->len >= maxsplit) {
                    if (!jl_push(r->a, l.u.list, jv_strview(s.p + i, s.n - i))) return rt_oom(r, pos);
                    break;
                }
                if (!jl_push(r->a, l.u.list, jv_strview(s.p + i, end - i))) return rt_oom(r, pos);
                if (!f2) break;
                i = end + sep.u.s.n;
            }
        }
        *out = l;
        return 0;
    }
    case M_REPLACE: {
        if (argc < 2) return rt_err(r, pos, EMBER_ERR_FORMAT, "replace() requires at least two arguments");
        if (argv[0].type != JV_STRING || argv[1].type != JV_STRING)
            return rt_err(r, pos, EMBER_ERR_FORMAT, "replace() arguments must be strings");
        jv count = jv_null();
        if (argc > 2) {
            if (argv[2].type == JV_KWARGS) {
                jv *c = jd_get(argv[2].u.dict, "count", 5);
                count = c ? *c : jv_null();
            } else {
                count = argv[2];
            }
        }
        if (count.type != JV_INT && count.type != JV_NULL)
            return rt_err(r, pos, EMBER_ERR_FORMAT, "replace() count argument must be a number or null");
        return s_replace(r, sv(self), sv(argv[0]), sv(argv[1]), count.type == JV_NULL ? -1 : count.u.n, pos, out);
    }
    case M_GET: {
        if (argc < 1 || argv[0].type != JV_STRING)
            return rt_err(r, pos, EMBER_ERR_FORMAT, "Object key must be a string: got %s",
                          argc < 1 ? "UndefinedValue" : jv_type_name(argv[0].type));
        jv *v = jd_get(self.u.dict, argv[0].u.s.p, argv[0].u.s.n);
        *out = v ? *v : argc > 1 ? argv[1] : jv_null();
        return 0;
    }
    case M_ITEMS: return dict_items(r, self.u.dict, pos, out);
    case M_KEYS: return dict_keys(r, self.u.dict, false, pos, out);
    case M_VALUES: return dict_keys(r, self.u.dict, true, pos, out);
    case M_DICTSORT: {
        jv_dict *kw = NULL;
        size_t np = 0;
        jv posv[8];
        for (size_t i = 0; i < argc; i++) {
            if (argv[i].type == JV_KWARGS)
                kw = argv[i].u.dict;
            else if (np < 8)
                posv[np++] = argv[i];
        }
        jv *cs = np > 0 ? &posv[0] : kw ? jd_get(kw, "case_sensitive", 14) : NULL;
        jv *by = np > 1 ? &posv[1] : kw ? jd_get(kw, "by", 2) : NULL;
        jv *rev = np > 2 ? &posv[2] : kw ? jd_get(kw, "reverse", 7) : NULL;
        if (cs && cs->type != JV_BOOL) return rt_err(r, pos, EMBER_ERR_FORMAT, "case_sensitive must be a boolean");
        if (by && by->type != JV_STRING) return rt_err(r, pos, EMBER_ERR_FORMAT, "by must be a string");
        if (by && !str_eq(*by, "key") && !str_eq(*by, "value"))
            return rt_err(r, pos, EMBER_ERR_FORMAT, "by must be either 'key' or 'value'");
        if (rev && rev->type != JV_BOOL) return rt_err(r, pos, EMBER_ERR_FORMAT, "reverse must be a boolean");
        jv items;
        CK(dict_items(r, self.u.dict, pos, &items));
        sort_ctx s;
        memset(&s, 0, sizeof s);
        s.r = r;
        s.pos = pos;
        s.case_sensitive = cs && cs->u.b;
        s.reverse = rev && rev->u.b;
        s.dictsort = 1;
        s.by_value = by && str_eq(*by, "value");
        return sorted_copy(r, items.u.list, &s, out);
    }
    default: return ext_call_method(r, f, argv, argc, pos, out);
    }
}

static const struct {
    const char *name;
    method m;
} STR_METHODS[] = {{"upper", M_UPPER},           {"lower", M_LOWER},           {"strip", M_STRIP},
                   {"title", M_TITLE},           {"capitalize", M_CAPITALIZE}, {"rstrip", M_RSTRIP},
                   {"lstrip", M_LSTRIP},         {"startswith", M_STARTSWITH}, {"endswith", M_ENDSWITH},
                   {"split", M_SPLIT},           {"replace", M_REPLACE}},
  OBJ_METHODS[] = {{"get", M_GET}, {"items", M_ITEMS}, {"keys", M_KEYS}, {"values", M_VALUES}, {"dictsort", M_DICTSORT}};

/* obj.builtins.get(name): a bound method, "length", or undefined. */
static int builtin_of(R *r, jv obj, const char *name, size_t n, size_t pos, jv *out) {
    *out = jv_undefined();
    if (obj.type == JV_STRING) {
        if (name_is(name, n, "length")) {
            *out = jv_int((double)ember_utf16_len(obj.u.s.p, obj.u.s.n));
            return 0;
        }
        for (size_t i = 0; i < EMBER_ARRAY_LEN(STR_METHODS); i++)
            if (name_is(name, n, STR_METHODS[i].name)) {
                *out = mkfunc(r, F_METHOD, STR_METHODS[i].m, obj, NULL, NULL);
                return out->type == JV_FUNCTION ? 0 : rt_oom(r, pos);
            }
    } else if (is_arr(obj)) {
        if (name_is(name, n, "length")) *out = jv_int((double)obj.u.list->len);
    } else if (is_obj(obj)) {
        for (size_t i = 0; i < EMBER_ARRAY_LEN(OBJ_METHODS); i++)
            if (name_is(name, n, OBJ_METHODS[i].name)) {
                *out = mkfunc(r, F_METHOD, OBJ_METHODS[i].m, obj, NULL, NULL);
                return out->type == JV_FUNCTION ? 0 : rt_oom(r, pos);
            }
    }
    if (out->type == JV_UNDEFINED && r->c->ext && ext_method_of(r, obj, name, n, out) && out->type != JV_FUNCTION)
        return rt_oom(r, pos);
    return 0;
}

/* ---------------------------------------------------------------- tojson filter */

static int do_tojson(R *r, jv v, const jv_json_opts *o, size_t pos, jv *out) {
    jsb b;
    jsb_init_out(r, &b);
    char why[160] = "";
    int rc = jv_tojson(&b, v, o, 0, true, why, sizeof why);
    if (rc) {
        rc = why_fail(r, rc, &b, pos, why);
        jsb_free(&b);
        return rc;
    }
    return sb_take(r, &b, pos, out);
}

static int to_text(R *r, jv v, bool js, size_t pos, jv *out) {
    if (v.type == JV_STRING) {
        *out = v;
        return 0;
    }
    jsb b;
    jsb_init_out(r, &b);
    char why[160] = "";
    int rc = js ? jv_js_string(&b, v, why, sizeof why) : jv_print(&b, v, why, sizeof why);
    if (rc) {
        rc = why_fail(r, rc, &b, pos, why);
        jsb_free(&b);
        return rc;
    }
    return sb_take(r, &b, pos, out);
}

/* Array.prototype.join over .value of each item. */
static int join_values(R *r, const jv_list *l, sview sep, size_t pos, jv *out) {
    jsb b;
    jsb_init_out(r, &b);
    char why[160] = "";
    for (size_t i = 0; i < l->len; i++) {
        if (i) jsb_add(&b, sep.p, sep.n);
        jv it = l->items[i];
        if (it.type == JV_NULL || it.type == JV_UNDEFINED) continue;
        int rc = jv_js_string(&b, it, why, sizeof why);
        if (rc) {
            rc = why_fail(r, rc, &b, pos, why);
            jsb_free(&b);
            return rc;
        }
    }
    return sb_take(r, &b, pos, out);
}

static int indent_lines(R *r, sview s, double width, bool first, bool blank, size_t pos, jv *out) {
    if (width < 0 || width > 1e6) return rt_err(r, pos, EMBER_ERR_FORMAT, "indent width out of range");
    jsb b;
    jsb_init_out(r, &b);
    size_t i = 0, line = 0;
    for (;;) {
        const char *nl = memchr(s.p + i, '\n', s.n - i);
        size_t end = nl ? (size_t)(nl - s.p) : s.n;
        bool empty = end == i;
        if (!((!first && line == 0) || (!blank && empty)))
            for (int k = 0; k < (int)width; k++) jsb_addc(&b, ' ');
        jsb_add(&b, s.p + i, end - i);
        if (!nl) break;
        jsb_addc(&b, '\n');
        i = end + 1;
        line++;
    }
    return sb_take(r, &b, pos, out);
}

/* ---------------------------------------------------------------- filters */

static int filter_err(R *r, size_t pos, const char *kind, const char *name, size_t n) {
    return rt_err(r, pos, EMBER_ERR_FORMAT, "unknown %s filter '%.*s'", kind, (int)EMBER_MIN(n, 64), name);
}

#define F(s) name_is(name, n, s) /* in the filters below: the filter is named s */

/* An argument-free filter on an array (list, first, last, length, reverse,
   sort, join, string, unique). Unknown names: filter_err. */
static int filter_array(R *r, jv v, const char *name, size_t n, size_t pos, jv *out) {
    const jv_list *l = v.u.list;
    if (F("list")) {
        *out = v;
        return 0;
    }
    if (F("first") || F("last")) {
        *out = l->len ? l->items[F("first") ? 0 : l->len - 1] : jv_hole();
        return 0;
    }
    if (F("length")) {
        *out = jv_int((double)l->len);
        return 0;
    }
    if (F("reverse")) {
        jv c = jv_list_new(r->a, JV_ARRAY, l->len);
        if (c.type != JV_ARRAY) return rt_oom(r, pos);
        for (size_t i = 0; i < l->len; i++) c.u.list->items[i] = l->items[l->len - 1 - i];
        c.u.list->len = l->len;
        *out = c;
        return 0;
    }
    if (F("sort")) {
        sort_ctx s;
        memset(&s, 0, sizeof s);
        s.r = r;
        s.pos = pos;
        return sorted_copy(r, l, &s, out);
    }
    if (F("join")) return join_values(r, l, (sview){"", 0}, pos, out);
    if (F("string")) {
        jsb b;
        jsb_init_out(r, &b);
        char why[160] = "";
        jv_json_opts o;
        memset(&o, 0, sizeof o);
        int rc = jv_tojson(&b, v, &o, 0, false, why, sizeof why);
        if (rc) {
            rc = why_fail(r, rc, &b, pos, why);
            jsb_free(&b);
            return rc;
        }
        return sb_take(r, &b, pos, out);
    }
    if (F("unique")) {
        jv c = jv_list_new(r->a, JV_ARRAY, 0);
        if (c.type != JV_ARRAY) return rt_oom(r, pos);
        for (size_t i = 0; i < l->len; i++) {
            bool seen = false;
            for (size_t k = 0; k < c.u.list->len && !seen; k++)
                seen = jv_same_value_zero(c.u.list->items[k], l->items[i]);
            if (!seen && !jl_push(r->a, c.u.list, l->items[i])) return rt_oom(r, pos);
        }
        *out = c;
        return 0;
    }
    return filter_err(r, pos, "ArrayValue", name, n);
}

/* An argument-free filter on a string (length in UTF-16 units, upper, lower,
   title, capitalize, trim, indent, join, string, int, float). Unknown names:
   filter_err. */
static int filter_string(R *r, jv v, const char *name, size_t n, size_t pos, jv *out) {
    sview s = sv(v);
    if (F("length")) {
        *out = jv_int((double)ember_utf16_len(s.p, s.n));
        return 0;
    }
    if (F("upper") || F("lower")) return s_case(r, s, F("upper"), pos, out);
    if (F("title")) return s_title(r, s, pos, out);
    if (F("capitalize")) return s_capitalize(r, s, pos, out);
    if (F("trim")) return str_view_result(r, js_trim(s, true, true), out);
    if (F("indent")) return indent_lines(r, s, 4, false, false, pos, out);
    if (F("join") || F("string")) {
        *out = v;
        return 0;
    }
    if (F("int")) {
        double d = js_parse_int(s.p, s.n);
        *out = jv_int(isnan(d) ? 0 : d);
        return 0;
    }
    if (F("float")) {
        double d = js_parse_float(s.p, s.n);
        *out = jv_float(isnan(d) ? 0 : d);
        return 0;
    }
    return filter_err(r, pos, "StringValue", name, n);
}

/* An argument-free filter on a number (abs, int, float, string). Unknown names: filter_err. */
static int filter_number(R *r, jv v, const char *name, size_t n, size_t pos, jv *out) {
    if (F("abs")) {
        *out = v.type == JV_INT ? jv_int(fabs(v.u.n)) : jv_float(fabs(v.u.n));
        return 0;
    }
    if (F("int")) {
        *out = jv_int(floor(v.u.n));
        return 0;
    }
    if (F("float")) {
        *out = jv_float(v.u.n);
        return 0;
    }
    if (F("string")) return to_text(r, v, false, pos, out);
    return filter_err(r, pos, "NumericValue", name, n);
}

/* An argument-free filter on an object (items, length, or a method of the
   object called without arguments). Unknown names: filter_err. */
static int filter_object(R *r, jv v, const char *name, size_t n, size_t pos, jv *out) {
    if (F("items")) return dict_items(r, v.u.dict, pos, out);
    if (F("length")) {
        *out = jv_int((double)v.u.dict->len);
        return 0;
    }
    jv b;
    CK(builtin_of(r, v, name, n, pos, &b));
    if (b.type == JV_FUNCTION) return call_method(r, b.u.fn, NULL, 0, pos, out);
    if (b.type != JV_UNDEFINED) {
        *out = b;
        return 0;
    }
    return filter_err(r, pos, "ObjectValue", name, n);
}

/* An argument-free filter on a boolean (bool, int, float, string). Unknown names: filter_err. */
static int filter_bool(R *r, jv v, const char *name, size_t n, size_t pos, jv *out) {
    if (F("bool")) {
        *out = v;
        return 0;
    }
    if (F("int")) {
        *out = jv_int(v.u.b ? 1 : 0);
        return 0;
    }
    if (F("float")) {
        *out = jv_float(v.u.b ? 1 : 0);
        return 0;
    }
    if (F("string")) {
        *out = jv_strview(v.u.b ? "true" : "false", v.u.b ? 4 : 5);
        return 0;
    }
    return filter_err(r, pos, "BooleanValue", name, n);
}

/* An argument-free filter ({{ v | name }}): safe and tojson on anything, the
   others by the type of v. */
static int apply_filter_ident(R *r, jv v, const jnode *f, jv *out) {
    const char *name = f->s;
    size_t n = f->n, pos = f->pos;
    if (F("safe")) {
        *out = v;
        return 0;
    }
    if (F("tojson")) {
        jv_json_opts o;
        memset(&o, 0, sizeof o);
        return do_tojson(r, v, &o, pos, out);
    }
    if (is_arr(v)) return filter_array(r, v, name, n, pos, out);
    if (v.type == JV_STRING) return filter_string(r, v, name, n, pos, out);
    if (is_num(v)) return filter_number(r, v, name, n, pos, out);
    if (is_obj(v)) return filter_object(r, v, name, n, pos, out);
    if (v.type == JV_BOOL) return filter_bool(r, v, name, n, pos, out);
    return rt_err(r, pos, EMBER_ERR_FORMAT, "cannot apply filter '%.*s' to %s", (int)EMBER_MIN(n, 64), name,
                  jv_type_name(v.type));
}

/* selectattr / rejectattr (attribute[, test[, value]]): the objects of the
   array v whose attribute passes the test (truthy without one), or fails it. */
static int filter_select_attr(R *r, jv v, const jnode *call, bool select, jv *out) {
    const char *name = call->a->s;
    size_t n = call->a->n, pos = call->a->pos;
    if (!is_arr(v))
        return rt_err(r, pos, EMBER_ERR_FORMAT, "cannot apply filter '%.*s' to %s", (int)n, name, jv_type_name(v.type));
    for (size_t i = 0; i < v.u.list->len; i++)
        if (!is_container(v.u.list->items[i]))
            return rt_err(r, pos, EMBER_ERR_FORMAT, "'%.*s' can only be applied to an array of objects", (int)n, name);
    for (size_t i = 0; i < call->list.n; i++)
        if (call->list.v[i]->kind != N_TEXT)
            return rt_err(r, call->list.v[i]->pos, EMBER_ERR_FORMAT, "arguments of '%.*s' must be strings", (int)n, name);
    if (call->list.n < 1) return rt_err(r, pos, EMBER_ERR_FORMAT, "'%.*s' needs an attribute name", (int)n, name);
    const jnode *attr = call->list.v[0];
    const jnode *tname = call->list.n > 1 ? call->list.v[1] : NULL;
    jv tval;
    bool have_val = call->list.n > 2;
    if (have_val) tval = jv_strview(call->list.v[2]->s, call->list.v[2]->n);
    if (tname && !test_exists(tname->s, tname->n))
        return rt_err(r, tname->pos, EMBER_ERR_FORMAT, "unknown test '%.*s'", (int)EMBER_MIN(tname->n, 64), tname->s);
    jv c = jv_list_new(r->a, JV_ARRAY, 0);
    if (c.type != JV_ARRAY) return rt_oom(r, pos);
    for (size_t i = 0; i < v.u.list->len; i++) {
        jv it = v.u.list->items[i];
        jv *f = jd_get(it.u.dict, attr->s, attr->n);
        bool res = false;
        if (f) {
            if (tname)
                CK(apply_test(r, tname->s, tname->n, *f, have_val ? &tval : NULL, tname->pos, &res));
            else
                res = jv_truthy(*f);
        }
        if (res == select && !jl_push(r->a, c.u.list, it)) return rt_oom(r, pos);
    }
    *out = c;
    return 0;
}

/* tojson(indent=, ensure_ascii=, sort_keys=, separators=) with its arguments
   checked as the reference checks them. */
static int filter_tojson(R *r, jv v, args *a, size_t pos, jv *out) {
    jv_json_opts o;
    memset(&o, 0, sizeof o);
    jv *ind = kwget(a, "indent");
    if (ind && ind->type != JV_INT && ind->type != JV_NULL)
        return rt_err(r, pos, EMBER_ERR_FORMAT, "If set, indent must be a number");
    if (ind && ind->type == JV_INT) {
        if (ind->u.n < 0) return rt_err(r, pos, EMBER_ERR_FORMAT, "Invalid count value: %g", ind->u.n);
        if (ind->u.n > 1000) return rt_err(r, pos, EMBER_ERR_LIMIT, "indent %g is too large", ind->u.n);
        o.indent = (int)ind->u.n;
    }
    jv *ea = kwget(a, "ensure_ascii");
    if (ea && ea->type != JV_BOOL) return rt_err(r, pos, EMBER_ERR_FORMAT, "If set, ensure_ascii must be a boolean");
    o.ensure_ascii = ea && ea->u.b;
    jv *sk = kwget(a, "sort_keys");
    if (sk && sk->type != JV_BOOL) return rt_err(r, pos, EMBER_ERR_FORMAT, "If set, sort_keys must be a boolean");
    o.sort_keys = sk && sk->u.b;
    jv *sp = kwget(a, "separators");
    char *isep = NULL, *ksep = NULL;
    if (sp && is_arr(*sp)) {
        if (sp->u.list->len != 2 || sp->u.list->items[0].type != JV_STRING || sp->u.list->items[1].type != JV_STRING)
            return rt_err(r, pos, EMBER_ERR_FORMAT, "separators must be a tuple of two strings");
        isep = ja_strdup(r->a, sp->u.list->items[0].u.s.p, sp->u.list->items[0].u.s.n);
        ksep = ja_strdup(r->a, sp->u.list->items[1].u.s.p, sp->u.list->items[1].u.s.n);
        if (!isep || !ksep) return rt_oom(r, pos);
        o.item_sep = isep;
        o.key_sep = ksep;
    } else if (sp && sp->type != JV_NULL) {
        return rt_err(r, pos, EMBER_ERR_FORMAT, "If set, separators must be a tuple of two strings");
    }
    return do_tojson(r, v, &o, pos, out);
}

/* sort(reverse=, case_sensitive=, attribute=) of the array v: a sorted copy. */
static int filter_sort(R *r, jv v, args *a, size_t pos, jv *out) {
    jv *rev = arg_or_kw(a, 0, "reverse");
    jv *cs = arg_or_kw(a, 1, "case_sensitive");
    jv *at = arg_or_kw(a, 2, "attribute");
    if (rev && rev->type != JV_BOOL) return rt_err(r, pos, EMBER_ERR_FORMAT, "reverse must be a boolean");
    if (cs && cs->type != JV_BOOL) return rt_err(r, pos, EMBER_ERR_FORMAT, "case_sensitive must be a boolean");
    if (at && at->type != JV_STRING && at->type != JV_INT && at->type != JV_NULL)
        return rt_err(r, pos, EMBER_ERR_FORMAT, "attribute must be a string, integer, or null");
    sort_ctx s;
    memset(&s, 0, sizeof s);
    s.r = r;
    s.pos = pos;
    s.reverse = rev && rev->u.b;
    s.case_sensitive = cs && cs->u.b;
    if (at && at->type == JV_STRING) {
        s.attr = at->u.s.p;
        s.attr_len = at->u.s.n;
    } else if (at && at->type == JV_INT) {
        jv t;
        CK(to_text(r, *at, true, pos, &t));
        s.attr = t.u.s.p;
        s.attr_len = t.u.s.n;
    }
    return sorted_copy(r, v.u.list, &s, out);
}

/* map(attribute=, default=) of the array v (map with a filter name is not
   supported). */
static int filter_map(R *r, jv v, args *a, size_t pos, jv *out) {
    jv *at = kwget(a, "attribute");
    if (!at) return rt_err(r, pos, EMBER_ERR_FORMAT, "'map' without 'attribute' is not supported");
    if (at->type != JV_STRING) return rt_err(r, pos, EMBER_ERR_FORMAT, "attribute must be a string");
    jv *dflt = kwget(a, "default");
    jv c = jv_list_new(r->a, JV_ARRAY, v.u.list->len);
    if (c.type != JV_ARRAY) return rt_oom(r, pos);
    for (size_t i = 0; i < v.u.list->len; i++) {
        jv it = v.u.list->items[i];
        if (!is_container(it)) return rt_err(r, pos, EMBER_ERR_FORMAT, "items in map must be objects");
        jv x = attr_value(it, at->u.s.p, at->u.s.n);
        c.u.list->items[i] = x.type == JV_UNDEFINED ? (dflt ? *dflt : jv_undefined()) : x;
    }
    c.u.list->len = v.u.list->len;
    *out = c;
    return 0;
}

/* A filter with arguments ({{ v | name(...) }}). */
static int apply_filter_call(R *r, jv v, const jnode *call, jenv *env, jv *out) {
    const jnode *callee = call->a;
    size_t pos = callee->pos;
    if (callee->kind != N_IDENT) return rt_err(r, call->pos, EMBER_ERR_FORMAT, "unknown filter expression");
    const char *name = callee->s;
    size_t n = callee->n;
    args a;
    if (F("selectattr") || F("rejectattr")) return filter_select_attr(r, v, call, F("selectattr"), out);
    CK(eval_args(r, &call->list, env, &a));
    if (F("tojson")) return filter_tojson(r, v, &a, pos, out);
    if (F("join")) {
        const jv_list *l;
        jv_list *cps;
        if (v.type == JV_STRING) {
            CK(s_codepoints(r, sv(v), &cps, pos));
            l = cps;
        } else if (is_arr(v)) {
            l = v.u.list;
        } else {
            return rt_err(r, pos, EMBER_ERR_FORMAT, "cannot apply filter 'join' to %s", jv_type_name(v.type));
        }
        jv *sep = arg_or_kw(&a, 0, "separator");
        if (sep && sep->type != JV_STRING) return rt_err(r, pos, EMBER_ERR_FORMAT, "separator must be a string");
        return join_values(r, l, sep ? sv(*sep) : (sview){"", 0}, pos, out);
    }
    if (F("int") || F("float")) {
        bool isint = F("int");
        jv *dflt = arg_or_kw(&a, 0, "default");
        jv dv = dflt ? *dflt : isint ? jv_int(0) : jv_float(0);
        if (v.type == JV_STRING) {
            double d = isint ? js_parse_int(v.u.s.p, v.u.s.n) : js_parse_float(v.u.s.p, v.u.s.n);
            *out = isnan(d) ? dv : isint ? jv_int(d) : jv_float(d);
            return 0;
        }
        if (is_num(v)) {
            *out = v;
            return 0;
        }
        if (v.type == JV_BOOL) {
            *out = isint ? jv_int(v.u.b ? 1 : 0) : jv_float(v.u.b ? 1 : 0);
            return 0;
        }
        return rt_err(r, pos, EMBER_ERR_FORMAT, "cannot apply filter '%.*s' to %s", (int)n, name, jv_type_name(v.type));
    }
    if (F("default")) {
        jv dv = a.npos > 0 ? a.pos[0] : jv_strview("", 0);
        jv *bo = a.npos > 1 ? &a.pos[1] : kwget(&a, "boolean");
        if (bo && bo->type != JV_BOOL) return rt_err(r, pos, EMBER_ERR_FORMAT, "'default' filter flag must be a boolean");
        if (bo && bo->u.b) CK(nohole(r, v, pos));
        if ((v.type == JV_UNDEFINED && !jv_is_hole(v)) || (bo && bo->u.b && !jv_truthy(v)))
            *out = dv;
        else
            *out = v;
        return 0;
    }
    if (is_arr(v)) {
        if (F("sort")) return filter_sort(r, v, &a, pos, out);
        if (F("map")) return filter_map(r, v, &a, pos, out);
        return filter_err(r, pos, "ArrayValue", name, n);
    }
    if (v.type == JV_STRING) {
        if (F("indent")) {
            jv *w = arg_or_kw(&a, 0, "width");
            if (w && w->type != JV_INT) return rt_err(r, pos, EMBER_ERR_FORMAT, "width must be a number");
            jv *fi = arg_or_kw(&a, 1, "first");
            jv *bl = arg_or_kw(&a, 2, "blank");
            return indent_lines(r, sv(v), w ? w->u.n : 4, fi && jv_truthy(*fi), bl && jv_truthy(*bl), pos, out);
        }
        if (F("replace")) {
            CK(args_flat(r, &a, true, pos));
            jv_func f;
            memset(&f, 0, sizeof f);
            f.kind = F_METHOD;
            f.m = M_REPLACE;
            f.self = v;
            return call_method(r, &f, a.pos, a.npos, pos, out);
        }
        return filter_err(r, pos, "StringValue", name, n);
    }
    if (is_obj(v)) {
        jv b;
        CK(builtin_of(r, v, name, n, pos, &b));
        if (b.type == JV_FUNCTION) {
            CK(args_flat(r, &a, false, pos));
            return call_method(r, b.u.fn, a.pos, a.npos, pos, out);
        }
        return filter_err(r, pos, "ObjectValue", name, n);
    }
#undef F
    return rt_err(r, pos, EMBER_ERR_FORMAT, "cannot apply filter '%.*s' to %s", (int)EMBER_MIN(n, 64), name,
                  jv_type_name(v.type));
}

static int apply_filter(R *r, jv v, const jnode *f, jenv *env, jv *out);
/* ---------------------------------------------------------------- extensions
 * Python-Jinja2 features the reference lacks. Each one is reached only where
 * the reference would fail (an unknown filter, an undefined method being
 * called), so enabling them never changes what the reference renders. */

static const struct {
    const char *name;
    method m;
} EXT_STR_METHODS[] = {{"find", M_FIND},           {"rfind", M_RFIND},         {"count", M_SCOUNT},
                       {"rsplit", M_RSPLIT},       {"join", M_JOIN},           {"splitlines", M_SPLITLINES},
                       {"isdigit", M_ISDIGIT},     {"isalpha", M_ISALPHA},     {"isalnum", M_ISALNUM},
                       {"isspace", M_ISSPACE},     {"islower", M_ISLOWER},     {"isupper", M_ISUPPER},
                       {"removeprefix", M_REMOVEPREFIX}, {"removesuffix", M_REMOVESUFFIX}, {"format", M_FORMAT}},
  EXT_LIST_METHODS[] = {{"append", M_APPEND}, {"extend", M_EXTEND}, {"pop", M_POP},
                        {"index", M_INDEX},   {"count", M_LCOUNT},   {"insert", M_INSERT}};

static bool ext_method_of(R *r, jv obj, const char *name, size_t n, jv *out) {
    if (obj.type == JV_STRING) {
        for (size_t i = 0; i < EMBER_ARRAY_LEN(EXT_STR_METHODS); i++)
            if (name_is(name, n, EXT_STR_METHODS[i].name)) {
                *out = mkfunc(r, F_METHOD, EXT_STR_METHODS[i].m, obj, NULL, NULL);
                return true;
            }
    } else if (is_arr(obj)) {
        for (size_t i = 0; i < EMBER_ARRAY_LEN(EXT_LIST_METHODS); i++) {
            method m = EXT_LIST_METHODS[i].m;
            if (obj.type == JV_TUPLE && m != M_INDEX && m != M_LCOUNT) continue;
            if (name_is(name, n, EXT_LIST_METHODS[i].name)) {
                *out = mkfunc(r, F_METHOD, m, obj, NULL, NULL);
                return true;
            }
        }
    }
    return false;
}

static size_t cp_count(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) c++;
    return c;
}

/* Byte offset of code point index i (clamped, negative from the end). */
static size_t cp_offset(sview s, double i) {
    double len = (double)cp_count(s.p, s.n);
    if (i < 0) i += len;
    if (i <= 0) return 0;
    if (i >= len) return s.n;
    size_t want = (size_t)i, k = 0, off = 0;
    while (off < s.n && k < want) {
        size_t l;
        ember_utf8_decode(s.p + off, s.n - off, &l);
        off += l;
        k++;
    }
    return off;
}

static bool is_cp_alpha(uint32_t c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= 0xC0 && !ember_js_space(c) && c != 0xD7 && c != 0xF7);
}
static bool is_cp_digit(uint32_t c) {
    return c >= '0' && c <= '9';
}

static int str_list_push(R *r, jv_list *l, const char *p, size_t n, size_t pos) {
    return jl_push(r->a, l, jv_strview(p, n)) ? 0 : rt_oom(r, pos);
}

/* Python str.format with {} / {0} / {name} fields (no format specs). */
static int py_format(R *r, sview f, jv *argv, size_t argc, size_t pos, jv *out) {
    jv_dict *kw = NULL;
    if (argc && argv[argc - 1].type == JV_KWARGS) kw = argv[--argc].u.dict;
    jsb b;
    jsb_init_out(r, &b);
    size_t auto_idx = 0;
    char why[160] = "";
    int rc = 0;
    for (size_t i = 0; i < f.n && !rc; i++) {
        char c = f.p[i];
        if ((c == '{' || c == '}') && i + 1 < f.n && f.p[i + 1] == c) {
            jsb_addc(&b, c);
            i++;
            continue;
        }
        if (c != '{') {
            jsb_addc(&b, c);
            continue;
        }
        const char *end = memchr(f.p + i, '}', f.n - i);
        if (!end) {
            rc = rt_err(r, pos, EMBER_ERR_FORMAT, "format(): single '{' encountered in format string");
            break;
        }
        const char *field = f.p + i + 1;
        size_t fl = (size_t)(end - field);
        const char *colon = memchr(field, ':', fl);
        if (colon) fl = (size_t)(colon - field);
        jv v = jv_undefined();
        bool found = false;
        if (fl == 0) {
            if (auto_idx < argc) {
                v = argv[auto_idx];
                found = true;
            }
            auto_idx++;
        } else if (field[0] >= '0' && field[0] <= '9') {
            size_t idx = (size_t)atoi(field);
            if (idx < argc) {
                v = argv[idx];
                found = true;
            }
        } else if (kw) {
            jv *k = jd_get(kw, field, fl);
            if (k) {
                v = *k;
                found = true;
            }
        }
        if (!found) {
            rc = rt_err(r, pos, EMBER_ERR_FORMAT, "format(): no value for field '%.*s'", (int)EMBER_MIN(fl, 64), field);
            break;
        }
        if (v.type == JV_BOOL)
            jsb_adds(&b, v.u.b ? "True" : "False");
        else if (v.type == JV_NULL)
            jsb_adds(&b, "None");
        else if ((rc = jv_print(&b, v, why, sizeof why)))
            rc = why_fail(r, rc, &b, pos, why);
        i = (size_t)(end - f.p);
    }
    if (rc) {
        jsb_free(&b);
        return rc;
    }
    return sb_take(r, &b, pos, out);
}

/* str.find / rfind / count (sub[, start[, end]]): code-point offsets, -1 when absent. */
static int m_find(R *r, const jv_func *f, jv *argv, size_t npos, size_t pos, jv *out) {
    jv self = f->self;
    if (npos < 1 || argv[0].type != JV_STRING)
        return rt_err(r, pos, EMBER_ERR_FORMAT, "%s() needs a string argument",
                      f->m == M_SCOUNT ? "count" : f->m == M_FIND ? "find" : "rfind");
    sview s = sv(self), sub = sv(argv[0]);
    size_t from = npos > 1 && argv[1].type == JV_INT ? cp_offset(s, argv[1].u.n) : 0;
    size_t to = npos > 2 && argv[2].type == JV_INT ? cp_offset(s, argv[2].u.n) : s.n;
    if (to < from) to = from;
    sview w = {s.p + from, to - from};
    if (f->m == M_SCOUNT) {
        double c = 0;
        if (sub.n == 0) {
            c = (double)cp_count(w.p, w.n) + 1;
        } else {
            for (size_t i = 0; i + sub.n <= w.n;) {
                const char *hit = memfind(w.p + i, w.n - i, sub.p, sub.n);
                if (!hit) break;
                c++;
                i = (size_t)(hit - w.p) + sub.n;
            }
        }
        *out = jv_int(c);
        return 0;
    }
    const char *hit = NULL;
    if (f->m == M_FIND) {
        hit = memfind(w.p, w.n, sub.p, sub.n);
    } else {
        for (size_t i = w.n + 1; i-- > 0;)
            if (i + sub.n <= w.n && memcmp(w.p + i, sub.p, sub.n) == 0) {
                hit = w.p + i;
                break;
            }
    }
    *out = jv_int(hit ? (double)cp_count(s.p, (size_t)(hit - s.p)) : -1);
    return 0;
}

/* str.rsplit(sep=None, maxsplit=-1), Python's: from the right; no sep splits on runs of whitespace. */
static int m_rsplit(R *r, const jv_func *f, jv *argv, size_t npos, size_t pos, jv *out) {
    jv self = f->self;
    jv sep = npos > 0 ? argv[0] : jv_null();
    double maxsplit = npos > 1 && argv[1].type == JV_INT ? argv[1].u.n : -1;
    if (sep.type != JV_STRING && sep.type != JV_NULL)
        return rt_err(r, pos, EMBER_ERR_FORMAT, "rsplit(): sep must be a string or none");
    if (sep.type == JV_STRING && sep.u.s.n == 0) return rt_err(r, pos, EMBER_ERR_FORMAT, "empty separator");
    jv l = jv_list_new(r->a, JV_ARRAY, 0);
    if (l.type != JV_ARRAY) return rt_oom(r, pos);
    sview s = sv(self);
    size_t end = s.n;
    double splits = 0;
    if (sep.type == JV_NULL) {
        for (;;) {
            sview rest = js_trim((sview){s.p, end}, false, true);
            end = rest.n;
            if (end == 0) break;
            if (maxsplit >= 0 && splits >= maxsplit) {
                CK(str_list_push(r, l.u.list, s.p, end, pos));
                break;
            }
            size_t st = end;
            while (st > 0) {
                size_t k = st - 1;
                while (k > 0 && ((unsigned char)s.p[k] & 0xC0) == 0x80) k--;
                if (ju_space_len(s.p + k, st - k) == st - k) break;
                st = k;
            }
            CK(str_list_push(r, l.u.list, s.p + st, end - st, pos));
            splits++;
            end = st;
        }
    } else {
        sview sp = sv(sep);
        for (;;) {
            const char *hit = NULL;
            if (!(maxsplit >= 0 && splits >= maxsplit))
                for (size_t i = end + 1; i-- > 0;)
                    if (i + sp.n <= end && memcmp(s.p + i, sp.p, sp.n) == 0) {
                        hit = s.p + i;
                        break;
                    }
            if (!hit) {
                CK(str_list_push(r, l.u.list, s.p, end, pos));
                break;
            }
            size_t at = (size_t)(hit - s.p);
            CK(str_list_push(r, l.u.list, s.p + at + sp.n, end - at - sp.n, pos));
            splits++;
            end = at;
        }
    }
    jv_list *L = l.u.list;
    for (size_t i = 0; i < L->len / 2; i++) {
        jv t = L->items[i];
        L->items[i] = L->items[L->len - 1 - i];
        L->items[L->len - 1 - i] = t;
    }
    *out = l;
    return 0;
}

/* str.join(iterable): the items printed and joined by self. */
static int m_join(R *r, const jv_func *f, jv *argv, size_t npos, size_t pos, jv *out) {
    jv self = f->self;
    if (npos < 1) return rt_err(r, pos, EMBER_ERR_FORMAT, "join() needs an iterable");
    const jv_list *items;
    jv_list *cps;
    if (argv[0].type == JV_STRING) {
        CK(s_codepoints(r, sv(argv[0]), &cps, pos));
        items = cps;
    } else if (is_arr(argv[0])) {
        items = argv[0].u.list;
    } else {
        return rt_err(r, pos, EMBER_ERR_FORMAT, "join() argument must be iterable, not %s", jv_type_name(argv[0].type));
    }
    jsb b;
    jsb_init_out(r, &b);
    char why[160] = "";
    for (size_t i = 0; i < items->len; i++) {
        if (i) jsb_add(&b, self.u.s.p, self.u.s.n);
        int rc = jv_print(&b, items->items[i], why, sizeof why);
        if (rc) {
            rc = why_fail(r, rc, &b, pos, why);
            jsb_free(&b);
            return rc;
        }
    }
    return sb_take(r, &b, pos, out);
}

/* str.splitlines(): at \n, \r and \r\n, the breaks dropped. */
static int m_splitlines(R *r, const jv_func *f, jv *argv, size_t npos, size_t pos, jv *out) {
    jv self = f->self;
    (void)npos;
    (void)argv;
    jv l = jv_list_new(r->a, JV_ARRAY, 0);
    if (l.type != JV_ARRAY) return rt_oom(r, pos);
    sview s = sv(self);
    size_t st = 0;
    for (size_t i = 0; i < s.n; i++) {
        if (s.p[i] == '\n' || s.p[i] == '\r') {
            CK(str_list_push(r, l.u.list, s.p + st, i - st, pos));
            if (s.p[i] == '\r' && i + 1 < s.n && s.p[i + 1] == '\n') i++;
            st = i + 1;
        }
    }
    if (st < s.n) CK(str_list_push(r, l.u.list, s.p + st, s.n - st, pos));
    *out = l;
    return 0;
}

/* str.isdigit / isalpha / isalnum / isspace: every code point of a non-empty string in the class. */
static int m_is_class(R *r, const jv_func *f, jv *argv, size_t npos, size_t pos, jv *out) {
    jv self = f->self;
    (void)npos;
    (void)argv;
    (void)r;
    (void)pos;
    sview s = sv(self);
    bool ok = s.n > 0;
    for (size_t i = 0; i < s.n && ok;) {
        size_t l;
        uint32_t c = ember_utf8_decode(s.p + i, s.n - i, &l);
        i += l;
        if (f->m == M_ISDIGIT) ok = is_cp_digit(c);
        else if (f->m == M_ISALPHA) ok = is_cp_alpha(c);
        else if (f->m == M_ISALNUM) ok = is_cp_alpha(c) || is_cp_digit(c);
        else ok = ember_js_space(c);
    }
    *out = jv_bool(ok);
    return 0;
}

/* str.islower / isupper: at least one cased code point and none of the other case. */
static int m_is_case(R *r, const jv_func *f, jv *argv, size_t npos, size_t pos, jv *out) {
    jv self = f->self;
    (void)npos;
    (void)argv;
    (void)r;
    (void)pos;
    sview s = sv(self);
    bool cased = false, ok = true;
    for (size_t i = 0; i < s.n;) {
        size_t l;
        uint32_t c = ember_utf8_decode(s.p + i, s.n - i, &l);
        i += l;
        bool up = ju_lower(c) != c, low = ju_upper(c) != c;
        if (up || low) cased = true;
        if (f->m == M_ISLOWER ? up : low) ok = false;
    }
    *out = jv_bool(cased && ok);
    return 0;
}

/* str.removeprefix / removesuffix. */
static int m_remove_affix(R *r, const jv_func *f, jv *argv, size_t npos, size_t pos, jv *out) {
    jv self = f->self;
    if (npos < 1 || argv[0].type != JV_STRING) return rt_err(r, pos, EMBER_ERR_FORMAT, "removeprefix/removesuffix need a string");
    sview s = sv(self), a = sv(argv[0]);
    if (a.n <= s.n && f->m == M_REMOVEPREFIX && memcmp(s.p, a.p, a.n) == 0) {
        s.p += a.n;
        s.n -= a.n;
    } else if (a.n <= s.n && f->m == M_REMOVESUFFIX && memcmp(s.p + s.n - a.n, a.p, a.n) == 0) {
        s.n -= a.n;
    }
    *out = jv_strview(s.p, s.n);
    return 0;
}

/* list.append(x) / list.extend(iterable): changes self in place, returns none. */
static int m_append_extend(R *r, const jv_func *f, jv *argv, size_t npos, size_t pos, jv *out) {
    jv self = f->self;
    if (npos < 1) return rt_err(r, pos, EMBER_ERR_FORMAT, "%s() takes exactly one argument", f->m == M_APPEND ? "append" : "extend");
    if (f->m == M_APPEND) {
        if (!jl_push(r->a, self.u.list, argv[0])) return rt_oom(r, pos);
    } else {
        if (!is_arr(argv[0])) return rt_err(r, pos, EMBER_ERR_FORMAT, "extend() argument must be a list");
        jv src = argv[0];
        size_t n = src.u.list->len; /* a list extended by itself */
        for (size_t i = 0; i < n; i++)
            if (!jl_push(r->a, self.u.list, src.u.list->items[i])) return rt_oom(r, pos);
    }
    *out = jv_null();
    return 0;
}

/* list.pop([i]) / list.insert(i, x): in place, Python's index rules. */
static int m_pop_insert(R *r, const jv_func *f, jv *argv, size_t npos, size_t pos, jv *out) {
    jv self = f->self;
    jv_list *l = self.u.list;
    double idx = npos > 0 && argv[0].type == JV_INT ? argv[0].u.n : (f->m == M_POP ? -1 : 0);
    if (f->m == M_INSERT) {
        if (npos < 2) return rt_err(r, pos, EMBER_ERR_FORMAT, "insert() takes exactly two arguments");
        double len = (double)l->len;
        if (idx < 0) idx = fmax(idx + len, 0);
        if (idx > len) idx = len;
        if (!jl_push(r->a, l, argv[1])) return rt_oom(r, pos);
        size_t at = (size_t)idx;
        memmove(&l->items[at + 1], &l->items[at], (l->len - 1 - at) * sizeof(jv));
        l->items[at] = argv[1];
        *out = jv_null();
        return 0;
    }
    if (l->len == 0) return rt_err(r, pos, EMBER_ERR_FORMAT, "pop from empty list");
    if (idx < 0) idx += (double)l->len;
    if (!(idx >= 0 && idx < (double)l->len)) return rt_err(r, pos, EMBER_ERR_FORMAT, "pop index out of range");
    size_t at = (size_t)idx;
    *out = l->items[at];
    memmove(&l->items[at], &l->items[at + 1], (l->len - at - 1) * sizeof(jv));
    l->len--;
    return 0;
}

/* list.index(x) / list.count(x) under strict equality. */
static int m_index_count(R *r, const jv_func *f, jv *argv, size_t npos, size_t pos, jv *out) {
    jv self = f->self;
    if (npos < 1) return rt_err(r, pos, EMBER_ERR_FORMAT, "%s() takes exactly one argument", f->m == M_INDEX ? "index" : "count");
    double c = 0;
    for (size_t i = 0; i < self.u.list->len; i++)
        if (jv_strict_eq(self.u.list->items[i], argv[0])) {
            if (f->m == M_INDEX) {
                *out = jv_int((double)i);
                return 0;
            }
            c++;
        }
    if (f->m == M_INDEX) return rt_err(r, pos, EMBER_ERR_FORMAT, "index(): value is not in list");
    *out = jv_int(c);
    return 0;
}

/* A Python method of the extensions (jinja_ctx_enable_extensions) on f->self:
   one function per method family below; errors name the method. */
static int ext_call_method(R *r, const jv_func *f, jv *argv, size_t argc, size_t pos, jv *out) {
    size_t npos = argc && argv[argc - 1].type == JV_KWARGS ? argc - 1 : argc;
    switch (f->m) {
    case M_FIND:
    case M_RFIND:
    case M_SCOUNT: return m_find(r, f, argv, npos, pos, out);
    case M_RSPLIT: return m_rsplit(r, f, argv, npos, pos, out);
    case M_JOIN: return m_join(r, f, argv, npos, pos, out);
    case M_SPLITLINES: return m_splitlines(r, f, argv, npos, pos, out);
    case M_ISDIGIT:
    case M_ISALPHA:
    case M_ISALNUM:
    case M_ISSPACE: return m_is_class(r, f, argv, npos, pos, out);
    case M_ISLOWER:
    case M_ISUPPER: return m_is_case(r, f, argv, npos, pos, out);
    case M_REMOVEPREFIX:
    case M_REMOVESUFFIX: return m_remove_affix(r, f, argv, npos, pos, out);
    case M_FORMAT: return py_format(r, sv(f->self), argv, argc, pos, out);
    case M_APPEND:
    case M_EXTEND: return m_append_extend(r, f, argv, npos, pos, out);
    case M_POP:
    case M_INSERT: return m_pop_insert(r, f, argv, npos, pos, out);
    case M_INDEX:
    case M_LCOUNT: return m_index_count(r, f, argv, npos, pos, out);
    default: break;
    }
    return rt_err(r, pos, EMBER_ERR_INTERNAL, "unknown method");
}

static int ext_minmax_sum(R *r, jv v, const char *name, args *a, size_t pos, jv *out) {
    const jv_list *l = v.u.list;
    jv *attr = kwget(a, "attribute");
    if (attr && attr->type != JV_STRING) return rt_err(r, pos, EMBER_ERR_FORMAT, "attribute must be a string");
    if (!strcmp(name, "sum")) {
        jv *start = arg_or_kw(a, 1, "start");
        double acc = start && is_num(*start) ? start->u.n : 0;
        bool fl = start && start->type == JV_FLOAT;
        for (size_t i = 0; i < l->len; i++) {
            jv x = attr ? attr_value(l->items[i], attr->u.s.p, attr->u.s.n) : l->items[i];
            if (x.type == JV_BOOL) x = jv_int(x.u.b);
            if (!is_num(x)) return rt_err(r, pos, EMBER_ERR_FORMAT, "sum(): cannot add %s", jv_type_name(x.type));
            acc += x.u.n;
            fl = fl || x.type == JV_FLOAT;
        }
        *out = fl ? jv_float(acc) : jv_int(acc);
        return 0;
    }
    jv *cs = arg_or_kw(a, 0, "case_sensitive");
    bool max = !strcmp(name, "max");
    sort_ctx s;
    memset(&s, 0, sizeof s);
    s.r = r;
    s.pos = pos;
    s.case_sensitive = cs && jv_truthy(*cs);
    if (attr) {
        s.attr = attr->u.s.p;
        s.attr_len = attr->u.s.n;
    }
    *out = jv_undefined();
    for (size_t i = 0; i < l->len; i++) {
        if (i == 0) {
            *out = l->items[0];
            continue;
        }
        int c;
        CK(sort_cmp(&s, l->items[i], *out, &c));
        if (max ? c > 0 : c < 0) *out = l->items[i];
    }
    return 0;
}

static int ext_filter(R *r, jv v, const jnode *f, jenv *env, jv *out, bool *handled) {
    bool call = f->kind == N_CALL;
    const jnode *id = call ? f->a : f;
    if (id->kind != N_IDENT) return 0;
    const char *name = id->s;
    size_t n = id->n, pos = id->pos;
#define F(s) name_is(name, n, s)
    bool want = (F("count") && (is_arr(v) || is_str(v) || is_obj(v))) || F("d") || (F("default") && !call) ||
                (F("wordcount") && is_str(v)) || (F("round") && is_num(v)) ||
                ((F("select") || F("reject") || F("sum") || F("min") || F("max")) && is_arr(v)) ||
                ((F("first") || F("last")) && is_str(v)) || (F("list") && (is_str(v) || is_obj(v)));
    args a;
    memset(&a, 0, sizeof a);
    if (!want && F("map") && call && is_arr(v)) {
        /* map('filter'): only where the reference fails (no attribute=) */
        CK(eval_args(r, &f->list, env, &a));
        if (kwget(&a, "attribute") || a.npos < 1 || a.pos[0].type != JV_STRING) return 0;
        *handled = true;
        jnode fn;
        memset(&fn, 0, sizeof fn);
        fn.kind = N_IDENT;
        fn.pos = pos;
        fn.s = a.pos[0].u.s.p;
        fn.n = a.pos[0].u.s.n;
        jv c = jv_list_new(r->a, JV_ARRAY, v.u.list->len);
        if (c.type != JV_ARRAY) return rt_oom(r, pos);
        for (size_t i = 0; i < v.u.list->len; i++) CK(apply_filter(r, v.u.list->items[i], &fn, env, &c.u.list->items[c.u.list->len++]));
        *out = c;
        return 0;
    }
    if (!want) return 0;
    *handled = true;
    if (call) CK(eval_args(r, &f->list, env, &a));
    if (F("count")) {
        *out = jv_int(is_arr(v) ? (double)v.u.list->len : is_obj(v) ? (double)v.u.dict->len : (double)ember_utf16_len(v.u.s.p, v.u.s.n));
        return 0;
    }
    if (F("d") || F("default")) {
        jv dv = a.npos > 0 ? a.pos[0] : jv_strview("", 0);
        jv *bo = a.npos > 1 ? &a.pos[1] : kwget(&a, "boolean");
        *out = (v.type == JV_UNDEFINED || (bo && jv_truthy(*bo) && !jv_truthy(v))) ? dv : v;
        return 0;
    }
    if (F("wordcount")) {
        double words = 0;
        bool in = false;
        for (size_t i = 0; i < v.u.s.n;) {
            size_t l;
            uint32_t c = ember_utf8_decode(v.u.s.p + i, v.u.s.n - i, &l);
            i += l;
            bool w = is_cp_alpha(c) || is_cp_digit(c) || c == '_';
            if (w && !in) words++;
            in = w;
        }
        *out = jv_int(words);
        return 0;
    }
    if (F("round")) {
        jv *pr = arg_or_kw(&a, 0, "precision");
        jv *me = arg_or_kw(&a, 1, "method");
        double p = pr && pr->type == JV_INT ? pr->u.n : 0;
        double scale = pow(10, p), x = v.u.n * scale;
        if (me && str_eq(*me, "ceil"))
            x = ceil(x);
        else if (me && str_eq(*me, "floor"))
            x = floor(x);
        else if (!me || str_eq(*me, "common"))
            x = nearbyint(x);
        else
            return rt_err(r, pos, EMBER_ERR_FORMAT, "round(): method must be 'common', 'ceil' or 'floor'");
        x /= scale;
        *out = v.type == JV_INT && p <= 0 ? jv_int(x) : jv_float(x);
        return 0;
    }
    if (F("select") || F("reject")) {
        bool sel = F("select");
        jv c = jv_list_new(r->a, JV_ARRAY, 0);
        if (c.type != JV_ARRAY) return rt_oom(r, pos);
        for (size_t i = 0; i < v.u.list->len; i++) {
            jv it = v.u.list->items[i];
            bool res;
            if (a.npos > 0) {
                if (a.pos[0].type != JV_STRING) return rt_err(r, pos, EMBER_ERR_FORMAT, "select/reject: the test name must be a string");
                CK(apply_test(r, a.pos[0].u.s.p, a.pos[0].u.s.n, it, a.npos > 1 ? &a.pos[1] : NULL, pos, &res));
            } else {
                res = jv_truthy(it);
            }
            if (res == sel && !jl_push(r->a, c.u.list, it)) return rt_oom(r, pos);
        }
        *out = c;
        return 0;
    }
    if (F("sum") || F("min") || F("max")) return ext_minmax_sum(r, v, F("sum") ? "sum" : F("min") ? "min" : "max", &a, pos, out);
    if (F("first") || F("last")) {
        jv_list *cps;
        CK(s_codepoints(r, sv(v), &cps, pos));
        *out = cps->len ? cps->items[F("first") ? 0 : cps->len - 1] : jv_undefined();
        return 0;
    }
    if (F("list")) {
        if (is_obj(v)) return dict_keys(r, v.u.dict, false, pos, out);
        jv_list *cps;
        CK(s_codepoints(r, sv(v), &cps, pos));
        out->type = JV_ARRAY;
        out->u.list = cps;
        return 0;
    }
#undef F
    return 0;
}

static int apply_filter(R *r, jv v, const jnode *f, jenv *env, jv *out) {
    if (jv_is_hole(v)) {
        bool pass = (f->kind == N_IDENT && name_is(f->s, f->n, "safe")) ||
                    (f->kind == N_CALL && f->a->kind == N_IDENT && name_is(f->a->s, f->a->n, "default"));
        if (!pass) return nohole(r, v, f->pos);
    }
    if (r->c->ext) {
        bool handled = false;
        int rc = ext_filter(r, v, f, env, out, &handled);
        if (handled) return rc;
    }
    if (f->kind == N_IDENT) return apply_filter_ident(r, v, f, out);
    if (f->kind == N_CALL) return apply_filter_call(r, v, f, env, out);
    return rt_err(r, f->pos, EMBER_ERR_FORMAT, "unknown filter expression");
}

/* ---------------------------------------------------------------- built-in functions */

static const char *const MONTHS[] = {"January", "February", "March",     "April",   "May",      "June",
                                     "July",    "August",   "September", "October", "November", "December"};

static int fn_strftime(R *r, jv *argv, size_t argc, size_t pos, jv *out) {
    if (argc < 1 || argv[0].type != JV_STRING)
        return rt_err(r, pos, EMBER_ERR_FORMAT, "strftime_now() needs a format string");
    struct tm tmv;
    if (r->c->have_time) {
        tmv = r->c->now;
    } else {
        time_t now = time(NULL);
        if (!localtime_r(&now, &tmv)) memset(&tmv, 0, sizeof tmv);
    }
    int mon = tmv.tm_mon >= 0 && tmv.tm_mon < 12 ? tmv.tm_mon : 0;
    sview f = sv(argv[0]);
    jsb b;
    jsb_init_out(r, &b);
    char buf[32];
    for (size_t i = 0; i < f.n; i++) {
        if (f.p[i] == '%' && i + 1 < f.n && strchr("YmdbBHM%", f.p[i + 1])) {
            char c = f.p[++i];
            switch (c) {
            case 'Y': snprintf(buf, sizeof buf, "%d", tmv.tm_year + 1900); break;
            case 'm': snprintf(buf, sizeof buf, "%02d", mon + 1); break;
            case 'd': snprintf(buf, sizeof buf, "%02d", tmv.tm_mday); break;
            case 'b': snprintf(buf, sizeof buf, "%.3s", MONTHS[mon]); break;
            case 'B': snprintf(buf, sizeof buf, "%s", MONTHS[mon]); break;
            case 'H': snprintf(buf, sizeof buf, "%02d", tmv.tm_hour); break;
            case 'M': snprintf(buf, sizeof buf, "%02d", tmv.tm_min); break;
            default: snprintf(buf, sizeof buf, "%%"); break;
            }
            jsb_adds(&b, buf);
        } else {
            jsb_addc(&b, f.p[i]);
        }
    }
    return sb_take(r, &b, pos, out);
}

static int fn_range(R *r, jv *argv, size_t argc, size_t pos, jv *out) {
    double p[3] = {0, 0, 1};
    size_t np = 0;
    for (size_t i = 0; i < argc && np < 3; i++) {
        if (argv[i].type == JV_KWARGS) continue;
        if (argv[i].type == JV_BOOL)
            p[np++] = argv[i].u.b ? 1 : 0;
        else if (is_num(argv[i]))
            p[np++] = argv[i].u.n;
        else
            return rt_err(r, pos, EMBER_ERR_FORMAT, "range() arguments must be numbers, got %s", jv_type_name(argv[i].type));
    }
    double start = 0, stop = 0, step = 1;
    if (np == 1) {
        stop = p[0];
    } else if (np >= 2) {
        start = p[0];
        stop = p[1];
        if (np == 3) step = p[2];
    }
    if (step == 0) return rt_err(r, pos, EMBER_ERR_FORMAT, "range() step must not be zero");
    jv l = jv_list_new(r->a, JV_ARRAY, 0);
    if (l.type != JV_ARRAY) return rt_oom(r, pos);
    for (double i = start; step > 0 ? i < stop : i > stop; i += step) {
        CK(count_iter(r, pos, 1));
        jv x = i == floor(i) && isfinite(i) ? jv_int(i) : jv_float(i);
        if (!jl_push(r->a, l.u.list, x)) return rt_oom(r, pos);
    }
    *out = l;
    return 0;
}

static int ns_entry(R *r, jv pairv, size_t pos, jv_dict *d) {
    jv k, val;
    if (is_arr(pairv) && pairv.u.list->len == 2) {
        k = pairv.u.list->items[0];
        val = pairv.u.list->items[1];
    } else if (pairv.type == JV_STRING) {
        jv_list *cps;
        CK(s_codepoints(r, sv(pairv), &cps, pos));
        if (cps->len != 2)
            return rt_err(r, pos, EMBER_ERR_FORMAT, "namespace expected an object or an iterable of [key, value] pairs");
        k = cps->items[0];
        val = cps->items[1];
    } else {
        return rt_err(r, pos, EMBER_ERR_FORMAT, "namespace expected an object or an iterable of [key, value] pairs");
    }
    if (k.type != JV_STRING) return rt_err(r, pos, EMBER_ERR_FORMAT, "namespace keys must be strings");
    if (!jd_set(r->a, d, k.u.s.p, k.u.s.n, val)) return rt_oom(r, pos);
    return 0;
}

static int fn_namespace(R *r, jv *argv, size_t argc, size_t pos, jv *out) {
    jv_dict *kw = NULL;
    if (argc && argv[argc - 1].type == JV_KWARGS) kw = argv[--argc].u.dict;
    if (argc > 1) return rt_err(r, pos, EMBER_ERR_FORMAT, "namespace expected at most 1 argument, got %zu", argc);
    jv ns = jv_dict_new(r->a, JV_NAMESPACE);
    if (ns.type != JV_NAMESPACE) return rt_oom(r, pos);
    if (argc == 1) {
        jv src = argv[0];
        if (is_obj(src)) {
            for (size_t i = 0; i < src.u.dict->len; i++)
                if (!jd_set(r->a, ns.u.dict, src.u.dict->e[i].key, src.u.dict->e[i].klen, src.u.dict->e[i].val))
                    return rt_oom(r, pos);
        } else if (is_arr(src)) {
            for (size_t i = 0; i < src.u.list->len; i++) CK(ns_entry(r, src.u.list->items[i], pos, ns.u.dict));
        } else {
            return rt_err(r, pos, EMBER_ERR_FORMAT, "'%s' object is not iterable", jv_type_name(src.type));
        }
    }
    if (kw)
        for (size_t i = 0; i < kw->len; i++)
            if (!jd_set(r->a, ns.u.dict, kw->e[i].key, kw->e[i].klen, kw->e[i].val)) return rt_oom(r, pos);
    *out = ns;
    return 0;
}

/* Binds macro / caller parameters in scope (the reference's rules). */
static int bind_params(R *r, const jnodes *params, bool uses_kwargs, bool uses_varargs, jv *argv, size_t argc,
                       jenv *scope, const char *display, size_t pos) {
    jv_dict kw;
    memset(&kw, 0, sizeof kw);
    if (argc && argv[argc - 1].type == JV_KWARGS) {
        const jv_dict *src = argv[--argc].u.dict;
        for (size_t i = 0; i < src->len; i++)
            if (!jd_append(r->a, &kw, src->e[i].key, src->e[i].klen, src->e[i].val)) return rt_oom(r, pos);
    }
    size_t npend = 0;
    const jnode **pend = params->n ? ja_alloc(r->a, params->n * sizeof *pend) : NULL;
    if (params->n && !pend) return rt_oom(r, pos);
    for (size_t i = 0; i < params->n; i++) {
        const jnode *p = params->v[i];
        bool have = i < argc && !jv_is_hole(argv[i]);
        jv val = have ? argv[i] : jv_undefined();
        if (!have) {
            jv *k = jd_get(&kw, p->s, p->n);
            if (k) {
                val = *k;
                have = !jv_is_hole(val);
                jd_del(&kw, p->s, p->n);
            }
        }
        if (!have && p->kind == N_KWARG) pend[npend++] = p;
        if (!env_set(r, scope, p->s, p->n, val)) return rt_oom(r, pos);
    }
    if (uses_kwargs) {
        jv k = jv_dict_new(r->a, JV_OBJECT);
        if (k.type != JV_OBJECT) return rt_oom(r, pos);
        *k.u.dict = kw;
        if (!env_set(r, scope, "kwargs", 6, k)) return rt_oom(r, pos);
    } else if (kw.len) {
        return rt_err(r, pos, EMBER_ERR_FORMAT, "macro %s takes no keyword argument '%.*s'", display,
                      (int)EMBER_MIN(kw.e[0].klen, 64), kw.e[0].key);
    }
    if (uses_varargs) {
        jv va = jv_list_new(r->a, JV_ARRAY, 0);
        if (va.type != JV_ARRAY) return rt_oom(r, pos);
        for (size_t i = params->n; i < argc; i++)
            if (!jl_push(r->a, va.u.list, argv[i])) return rt_oom(r, pos);
        if (!env_set(r, scope, "varargs", 7, va)) return rt_oom(r, pos);
    } else if (argc > params->n) {
        return rt_err(r, pos, EMBER_ERR_FORMAT, "macro %s takes not more than %zu argument(s)", display, params->n);
    }
    for (size_t i = 0; i < npend; i++) {
        jv dv;
        CK(eval(r, pend[i]->b, scope, &dv));
        if (!env_set(r, scope, pend[i]->s, pend[i]->n, dv)) return rt_oom(r, pos);
    }
    return 0;
}

static int run_body(R *r, const jnodes *body, jenv *scope, size_t pos, jv *out) {
    jsb b;
    jsb_init_out(r, &b);
    int rc = exec_block(r, body, scope, &b);
    if (rc == EV_BREAK || rc == EV_CONTINUE)
        rc = rt_err(r, r->ctl_pos, EMBER_ERR_FORMAT, "%s outside of a loop", rc == EV_BREAK ? "break" : "continue");
    if (rc) {
        jsb_free(&b);
        return rc;
    }
    return sb_take(r, &b, pos, out);
}

static int call_function(R *r, jv fnv, jv *argv, size_t argc, jenv *env, size_t pos, jv *out) {
    const jv_func *f = fnv.u.fn;
    switch (f->kind) {
    case F_METHOD: return call_method(r, f, argv, argc, pos, out);
    case F_NAMESPACE: return fn_namespace(r, argv, argc, pos, out);
    case F_RANGE: return fn_range(r, argv, argc, pos, out);
    case F_STRFTIME: return fn_strftime(r, argv, argc, pos, out);
    case F_DICT: {
        jv_dict *kw = NULL;
        if (argc && argv[argc - 1].type == JV_KWARGS) kw = argv[--argc].u.dict;
        jv d = jv_dict_new(r->a, JV_OBJECT);
        if (d.type != JV_OBJECT) return rt_oom(r, pos);
        if (argc > 1) return rt_err(r, pos, EMBER_ERR_FORMAT, "dict expected at most 1 argument, got %zu", argc);
        if (argc == 1) {
            if (is_obj(argv[0])) {
                for (size_t i = 0; i < argv[0].u.dict->len; i++)
                    if (!jd_set(r->a, d.u.dict, argv[0].u.dict->e[i].key, argv[0].u.dict->e[i].klen, argv[0].u.dict->e[i].val))
                        return rt_oom(r, pos);
            } else if (is_arr(argv[0])) {
                for (size_t i = 0; i < argv[0].u.list->len; i++) CK(ns_entry(r, argv[0].u.list->items[i], pos, d.u.dict));
            } else {
                return rt_err(r, pos, EMBER_ERR_FORMAT, "dict() argument must be a mapping or a list of pairs");
            }
        }
        if (kw)
            for (size_t i = 0; i < kw->len; i++)
                if (!jd_set(r->a, d.u.dict, kw->e[i].key, kw->e[i].klen, kw->e[i].val)) return rt_oom(r, pos);
        *out = d;
        return 0;
    }
    case F_RAISE: {
        jv msg = argc ? argv[0] : jv_undefined();
        jv t;
        CK(to_text(r, msg, true, pos, &t));
        return rt_err(r, pos, EMBER_ERR_INVALID_ARG, "raise_exception: %.*s", (int)EMBER_MIN(t.u.s.n, 400), t.u.s.p);
    }
    case F_MACRO: {
        CK(enter(r, pos));
        jenv *scope = env_new(r, env);
        if (!scope) return rt_oom(r, pos);
        char disp[80];
        snprintf(disp, sizeof disp, "'%.*s'", (int)EMBER_MIN(f->node->a->n, 64), f->node->a->s);
        int rc = bind_params(r, &f->node->list2, f->node->uses_kwargs, f->node->uses_varargs, argv, argc, scope, disp, pos);
        if (!rc) rc = run_body(r, &f->node->body, scope, pos, out);
        r->depth--;
        return rc;
    }
    case F_CALLER: {
        CK(enter(r, pos));
        jenv *scope = env_new(r, f->env);
        if (!scope) return rt_oom(r, pos);
        int rc = bind_params(r, &f->node->list2, f->node->uses_kwargs, f->node->uses_varargs, argv, argc, scope, "None", pos);
        if (!rc) rc = run_body(r, &f->node->body, scope, pos, out);
        r->depth--;
        return rc;
    }
    }
    return rt_err(r, pos, EMBER_ERR_INTERNAL, "unknown function kind");
}

/* ---------------------------------------------------------------- expressions */

static int eval_member(R *r, const jnode *x, jenv *env, jv *out) {
    jv obj;
    CK(eval(r, x->a, env, &obj));
    CK(nohole(r, obj, x->pos));
    const jnode *pn = x->b;
    jv prop;
    if (x->negate && pn->kind == N_SLICE) {
        if (!is_arr(obj) && obj.type != JV_STRING)
            return rt_err(r, x->pos, EMBER_ERR_FORMAT, "Slice object must be an array or string");
        jv sl[3];
        const jnode *parts[3] = {pn->a, pn->b, pn->c};
        for (int k = 0; k < 3; k++) {
            sl[k] = jv_undefined();
            if (parts[k]) CK(eval(r, parts[k], env, &sl[k]));
            if (sl[k].type != JV_INT && sl[k].type != JV_UNDEFINED)
                return rt_err(r, x->pos, EMBER_ERR_FORMAT, "Slice %s must be numeric or undefined",
                              k == 0 ? "start" : k == 1 ? "stop" : "step");
        }
        jv_list *src;
        if (obj.type == JV_STRING)
            CK(s_codepoints(r, sv(obj), &src, x->pos));
        else
            src = obj.u.list;
        double len = (double)src->len;
        double step = sl[2].type == JV_INT ? sl[2].u.n : 1;
        double dir = step > 0 ? 1 : step < 0 ? -1 : 0;
        double start, stop;
        if (dir >= 0) {
            start = sl[0].type == JV_INT ? sl[0].u.n : 0;
            stop = sl[1].type == JV_INT ? sl[1].u.n : len;
            start = start < 0 ? fmax(len + start, 0) : fmin(start, len);
            stop = stop < 0 ? fmax(len + stop, 0) : fmin(stop, len);
        } else {
            start = sl[0].type == JV_INT ? sl[0].u.n : len - 1;
            stop = sl[1].type == JV_INT ? sl[1].u.n : -1;
            start = start < 0 ? fmax(len + start, -1) : fmin(start, len - 1);
            stop = stop < -1 ? fmax(len + stop, -1) : fmin(stop, len - 1);
        }
        jv res = jv_list_new(r->a, JV_ARRAY, 0);
        if (res.type != JV_ARRAY) return rt_oom(r, x->pos);
        if (dir != 0)
            for (double i = start; dir * i < dir * stop; i += step) {
                jv it = (i >= 0 && i < len) ? src->items[(size_t)i] : jv_undefined();
                if (!jl_push(r->a, res.u.list, it)) return rt_oom(r, x->pos);
            }
        if (obj.type == JV_STRING) return join_values(r, res.u.list, (sview){"", 0}, x->pos, out);
        *out = res;
        return 0;
    }
    if (x->negate)
        CK(eval(r, pn, env, &prop));
    else if (pn->kind == N_INT)
        prop = jv_int(pn->num);
    else
        prop = jv_strview(pn->s, pn->n);
    if (is_container(obj)) {
        if (prop.type != JV_STRING)
            return rt_err(r, x->pos, EMBER_ERR_FORMAT, "Cannot access property with non-string: got %s", jv_type_name(prop.type));
        jv *f = jd_get(obj.u.dict, prop.u.s.p, prop.u.s.n);
        if (f) {
            *out = jv_unhole(*f);
            return 0;
        }
        if (is_obj(obj)) return builtin_of(r, obj, prop.u.s.p, prop.u.s.n, x->pos, out);
        *out = jv_undefined();
        return 0;
    }
    if (is_arr(obj) || obj.type == JV_STRING) {
        if (prop.type == JV_INT) {
            if (obj.type == JV_STRING) {
                *out = s_at(r, sv(obj), prop.u.n);
                return 0;
            }
            double i = trunc(prop.u.n), len = (double)obj.u.list->len;
            if (i < 0) i += len;
            *out = (i >= 0 && i < len) ? jv_unhole(obj.u.list->items[(size_t)i]) : jv_undefined();
            return 0;
        }
        if (prop.type == JV_STRING) return builtin_of(r, obj, prop.u.s.p, prop.u.s.n, x->pos, out);
        return rt_err(r, x->pos, EMBER_ERR_FORMAT, "Cannot access property with non-string/non-number: got %s",
                      jv_type_name(prop.type));
    }
    if (prop.type != JV_STRING)
        return rt_err(r, x->pos, EMBER_ERR_FORMAT, "Cannot access property with non-string: got %s", jv_type_name(prop.type));
    *out = jv_undefined();
    return 0;
}

static int eval_call(R *r, const jnode *x, jenv *env, jv *out) {
    args a;
    CK(eval_args(r, &x->list, env, &a));
    CK(args_flat(r, &a, false, x->pos));
    jv fn;
    CK(eval(r, x->a, env, &fn));
    if (fn.type != JV_FUNCTION) {
        if (x->a->kind == N_IDENT)
            return rt_err(r, x->a->pos, EMBER_ERR_FORMAT, "'%.*s' is not a function (got %s)",
                          (int)EMBER_MIN(x->a->n, 64), x->a->s, jv_type_name(fn.type));
        if (x->a->kind == N_MEMBER && !x->a->negate && x->a->b->kind == N_IDENT)
            return rt_err(r, x->a->b->pos, EMBER_ERR_FORMAT, "'%.*s' is not a method of this value (got %s)",
                          (int)EMBER_MIN(x->a->b->n, 64), x->a->b->s, jv_type_name(fn.type));
        return rt_err(r, x->pos, EMBER_ERR_FORMAT, "Cannot call something that is not a function: got %s",
                      jv_type_name(fn.type));
    }
    return call_function(r, fn, a.pos, a.npos, env, x->pos, out);
}

static int concat(R *r, jv a, jv b, size_t pos, jv *out) {
    jsb s;
    jsb_init_out(r, &s);
    char why[160] = "";
    int rc = jv_js_string(&s, a, why, sizeof why);
    if (!rc) rc = jv_js_string(&s, b, why, sizeof why);
    if (rc) {
        rc = why_fail(r, rc, &s, pos, why);
        jsb_free(&s);
        return rc;
    }
    return sb_take(r, &s, pos, out);
}

static const char *op_name(jop op) {
    switch (op) {
    case OP_AND: return "and";
    case OP_OR: return "or";
    case OP_NOT: return "not";
    case OP_EQ: return "==";
    case OP_NE: return "!=";
    case OP_LT: return "<";
    case OP_GT: return ">";
    case OP_LE: return "<=";
    case OP_GE: return ">=";
    case OP_IN: return "in";
    case OP_NOT_IN: return "not in";
    case OP_ADD: return "+";
    case OP_SUB: return "-";
    case OP_CONCAT: return "~";
    case OP_MUL: return "*";
    case OP_DIV: return "/";
    case OP_FLOORDIV: return "//";
    case OP_MOD: return "%";
    case OP_POW: return "**";
    default: return "?";
    }
}

static int eval_binary(R *r, const jnode *x, jenv *env, jv *out) {
    jv l, rv;
    CK(eval(r, x->a, env, &l));
    CK(nohole(r, l, x->pos));
    if (x->op == OP_AND) {
        if (!jv_truthy(l)) {
            *out = l;
            return 0;
        }
        return eval(r, x->b, env, out);
    }
    if (x->op == OP_OR) {
        if (jv_truthy(l)) {
            *out = l;
            return 0;
        }
        return eval(r, x->b, env, out);
    }
    CK(eval(r, x->b, env, &rv));
    CK(nohole(r, rv, x->pos));
    jop op = x->op;
    if (op == OP_EQ || op == OP_NE) {
        bool eq;
        char why[160] = "";
        int rc = jv_loose_eq(l, rv, &eq, why, sizeof why);
        if (rc) return why_fail(r, rc, NULL, x->pos, why);
        *out = jv_bool(op == OP_EQ ? eq : !eq);
        return 0;
    }
    if (l.type == JV_UNDEFINED || rv.type == JV_UNDEFINED) {
        if (rv.type == JV_UNDEFINED && (op == OP_IN || op == OP_NOT_IN)) {
            *out = jv_bool(op == OP_NOT_IN);
            return 0;
        }
        return rt_err(r, x->pos, EMBER_ERR_FORMAT, "Cannot perform operation %s on undefined values", op_name(op));
    }
    if (l.type == JV_NULL || rv.type == JV_NULL)
        return rt_err(r, x->pos, EMBER_ERR_FORMAT, "Cannot perform operation %s on null values", op_name(op));
    if (op == OP_CONCAT) return concat(r, l, rv, x->pos, out);
    bool ln = is_num(l) || l.type == JV_BOOL, rn = is_num(rv) || rv.type == JV_BOOL;
    if (op == OP_POW && ln && rn) {
        double a = l.type == JV_BOOL ? (l.u.b ? 1 : 0) : l.u.n, b = rv.type == JV_BOOL ? (rv.u.b ? 1 : 0) : rv.u.n;
        if (a == 0 && b < 0) return rt_err(r, x->pos, EMBER_ERR_FORMAT, "0.0 cannot be raised to a negative power");
        double res = pow(a, b);
        if ((a == 1 || a == -1) && isinf(b)) res = NAN; /* JavaScript: 1 ** Infinity is NaN */
        if (!isfinite(res)) return rt_err(r, x->pos, EMBER_ERR_FORMAT, "Exponentiation result is not a finite real number");
        bool fl = l.type == JV_FLOAT || rv.type == JV_FLOAT || b < 0;
        *out = fl ? jv_float(res) : jv_int(res);
        return 0;
    }
    if (is_num(l) && is_num(rv)) {
        double a = l.u.n, b = rv.u.n;
        bool fl = l.type == JV_FLOAT || rv.type == JV_FLOAT;
        switch (op) {
        case OP_ADD: *out = fl ? jv_float(a + b) : jv_int(a + b); return 0;
        case OP_SUB: *out = fl ? jv_float(a - b) : jv_int(a - b); return 0;
        case OP_MUL: *out = fl ? jv_float(a * b) : jv_int(a * b); return 0;
        case OP_DIV: *out = jv_float(a / b); return 0;
        case OP_FLOORDIV: *out = fl ? jv_float(floor(a / b)) : jv_int(floor(a / b)); return 0;
        case OP_MOD: *out = fl ? jv_float(fmod(a, b)) : jv_int(fmod(a, b)); return 0;
        case OP_LT: *out = jv_bool(a < b); return 0;
        case OP_GT: *out = jv_bool(a > b); return 0;
        case OP_GE: *out = jv_bool(a >= b); return 0;
        case OP_LE: *out = jv_bool(a <= b); return 0;
        default: break;
        }
    } else if (is_arr(l) && is_arr(rv)) {
        if (op == OP_ADD) {
            size_t n1 = l.u.list->len, n2 = rv.u.list->len;
            jv c = jv_list_new(r->a, JV_ARRAY, n1 + n2);
            if (c.type != JV_ARRAY) return rt_oom(r, x->pos);
            if (n1) memcpy(c.u.list->items, l.u.list->items, n1 * sizeof(jv));
            if (n2) memcpy(c.u.list->items + n1, rv.u.list->items, n2 * sizeof(jv));
            c.u.list->len = n1 + n2;
            *out = c;
            return 0;
        }
    } else if (is_arr(rv)) {
        if (op == OP_IN || op == OP_NOT_IN) {
            bool found = false;
            for (size_t i = 0; i < rv.u.list->len && !found; i++) found = jv_strict_eq(rv.u.list->items[i], l);
            *out = jv_bool(op == OP_IN ? found : !found);
            return 0;
        }
    }
    if ((is_str(l) || is_str(rv)) && op == OP_ADD) return concat(r, l, rv, x->pos, out);
    if (is_str(l) && is_str(rv) && (op == OP_IN || op == OP_NOT_IN)) {
        bool found = memfind(rv.u.s.p, rv.u.s.n, l.u.s.p, l.u.s.n) != NULL;
        *out = jv_bool(op == OP_IN ? found : !found);
        return 0;
    }
    if (is_str(l) && is_obj(rv) && (op == OP_IN || op == OP_NOT_IN)) {
        bool found = jd_get(rv.u.dict, l.u.s.p, l.u.s.n) != NULL;
        *out = jv_bool(op == OP_IN ? found : !found);
        return 0;
    }
    return rt_err(r, x->pos, EMBER_ERR_FORMAT, "Unknown operator \"%s\" between %s and %s", op_name(op),
                  jv_type_name(l.type), jv_type_name(rv.type));
}

static int eval_inner(R *r, const jnode *x, jenv *env, jv *out) {
    switch (x->kind) {
    case N_TEXT: *out = jv_strview(x->s, x->n); return 0;
    case N_INT: *out = jv_int(x->num); return 0;
    case N_FLOAT: *out = jv_float(x->num); return 0;
    case N_ARRAY:
    case N_TUPLE: {
        jv l = jv_list_new(r->a, x->kind == N_ARRAY ? JV_ARRAY : JV_TUPLE, x->list.n);
        if (l.type == JV_UNDEFINED) return rt_oom(r, x->pos);
        for (size_t i = 0; i < x->list.n; i++) {
            CK(eval(r, x->list.v[i], env, &l.u.list->items[l.u.list->len]));
            l.u.list->items[l.u.list->len] = jv_unhole(l.u.list->items[l.u.list->len]);
            l.u.list->len++;
        }
        *out = l;
        return 0;
    }
    case N_OBJECT: {
        jv d = jv_dict_new(r->a, JV_OBJECT);
        if (d.type != JV_OBJECT) return rt_oom(r, x->pos);
        for (size_t i = 0; i < x->list.n; i++) {
            jv k, v;
            CK(eval(r, x->list.v[i], env, &k));
            if (k.type != JV_STRING)
                return rt_err(r, x->list.v[i]->pos, EMBER_ERR_FORMAT, "Object keys must be strings: got %s", jv_type_name(k.type));
            CK(eval(r, x->list2.v[i], env, &v));
            if (!jd_set(r->a, d.u.dict, k.u.s.p, k.u.s.n, jv_unhole(v))) return rt_oom(r, x->pos);
        }
        *out = d;
        return 0;
    }
    case N_IDENT:
        *out = env_get(env, x->s, x->n);
        if (out->type == JV_UNDEFINED && r->c->ext && name_is(x->s, x->n, "dict")) {
            *out = mkfunc(r, F_DICT, 0, jv_undefined(), NULL, NULL);
            if (out->type != JV_FUNCTION) return rt_oom(r, x->pos);
        }
        return 0;
    case N_MEMBER: return eval_member(r, x, env, out);
    case N_CALL: return eval_call(r, x, env, out);
    case N_UNARY: {
        jv a;
        CK(eval(r, x->a, env, &a));
        CK(nohole(r, a, x->pos));
        if (x->op == OP_NOT) {
            *out = jv_bool(!jv_truthy(a));
            return 0;
        }
        if (is_num(a) || a.type == JV_BOOL) {
            double v = a.type == JV_BOOL ? (a.u.b ? 1 : 0) : a.u.n;
            double res = x->op == OP_SUB ? -v : v;
            *out = a.type == JV_FLOAT ? jv_float(res) : jv_int(res);
            return 0;
        }
        return rt_err(r, x->pos, EMBER_ERR_FORMAT, "Unknown operator \"%s\" for %s", x->op == OP_SUB ? "-" : "+",
                      jv_type_name(a.type));
    }
    case N_BINARY: return eval_binary(r, x, env, out);
    case N_FILTER: {
        jv v;
        CK(eval(r, x->a, env, &v));
        return apply_filter(r, v, x->b, env, out);
    }
    case N_TEST: {
        jv v;
        CK(eval(r, x->a, env, &v));
        CK(nohole(r, v, x->pos));
        bool res;
        CK(apply_test(r, x->s, x->n, v, NULL, x->pos, &res));
        *out = jv_bool(x->negate ? !res : res);
        return 0;
    }
    case N_SELECT: {
        jv t;
        CK(eval(r, x->b, env, &t));
        CK(nohole(r, t, x->pos));
        if (!jv_truthy(t)) {
            *out = jv_undefined();
            return 0;
        }
        return eval(r, x->a, env, out);
    }
    case N_TERNARY: {
        jv c;
        CK(eval(r, x->a, env, &c));
        CK(nohole(r, c, x->pos));
        return eval(r, jv_truthy(c) ? x->b : x->c, env, out);
    }
    case N_COMMENT: *out = jv_null(); return 0;
    default: return rt_err(r, x->pos, EMBER_ERR_FORMAT, "unexpected syntax in an expression");
    }
}

static int eval(R *r, const jnode *x, jenv *env, jv *out) {
    if (!x) {
        *out = jv_undefined();
        return 0;
    }
    CK(enter(r, x->pos));
    int rc = eval_inner(r, x, env, out);
    r->depth--;
    return rc;
}

/* ---------------------------------------------------------------- statements */

static int assign_loop_vars(R *r, const jnode *target, jv item, jenv *scope) {
    if (target->kind == N_IDENT) {
        if (!env_set(r, scope, target->s, target->n, item)) return rt_oom(r, target->pos);
        return 0;
    }
    for (size_t j = 0; j < target->list.n; j++) {
        const jnode *t = target->list.v[j];
        if (t->kind != N_IDENT)
            return rt_err(r, t->pos, EMBER_ERR_FORMAT, "Cannot unpack non-identifier type");
        if (!env_set(r, scope, t->s, t->n, item.u.list->items[j])) return rt_oom(r, t->pos);
    }
    return 0;
}

/* A for loop over range(a[, b[, c]]) with integer arguments and no filter
   is run without building the list (O(n^2) templates loop like that).
   Returns true and the sequence when x->b is such a call. */
static int lazy_range(R *r, const jnode *x, jenv *scope, bool *lazy, double *start, double *step, size_t *count,
                      jv *it, bool *have_it) {
    *lazy = false;
    *have_it = false;
    const jnode *c = x->b;
    if (c->kind != N_CALL || c->a->kind != N_IDENT || x->a->kind != N_IDENT) return 0;
    jv fn = env_get(scope, c->a->s, c->a->n);
    if (fn.type != JV_FUNCTION || fn.u.fn->kind != F_RANGE) return 0;
    if (c->list.n < 1 || c->list.n > 3) return 0;
    for (size_t i = 0; i < c->list.n; i++)
        if (c->list.v[i]->kind == N_KWARG || c->list.v[i]->kind == N_SPREAD || c->list.v[i]->kind == N_KWSPREAD) return 0;
    double p[3];
    jv argv[3];
    bool ints = true;
    for (size_t i = 0; i < c->list.n; i++) {
        CK(eval(r, c->list.v[i], scope, &argv[i]));
        ints = ints && argv[i].type == JV_INT && fabs(argv[i].u.n) <= 9007199254740992.0;
        p[i] = argv[i].u.n;
    }
    if (!ints) { /* arguments are evaluated once: build the list as range() does */
        *have_it = true;
        return fn_range(r, argv, c->list.n, c->pos, it);
    }
    double a = 0, b, st = 1;
    if (c->list.n == 1) {
        b = p[0];
    } else {
        a = p[0];
        b = p[1];
        if (c->list.n == 3) st = p[2];
    }
    if (st == 0) return rt_err(r, c->pos, EMBER_ERR_FORMAT, "range() step must not be zero");
    double n = st > 0 ? ceil((b - a) / st) : ceil((a - b) / -st);
    if (n < 0) n = 0;
    if (n > (double)r->c->lim.max_iterations) return count_iter(r, c->pos, (uint64_t)r->c->lim.max_iterations + 1);
    CK(count_iter(r, c->pos, (uint64_t)n)); /* what range() itself counts */
    *lazy = true;
    *start = a;
    *step = st;
    *count = (size_t)n;
    return 0;
}

static int exec_for(R *r, const jnode *x, jenv *env, jsb *sink) {
    jenv *scope = env_new(r, env);
    if (!scope) return rt_oom(r, x->pos);
    const jnode *test = NULL;
    const jv_list *items = NULL;
    bool lazy = false;
    double rstart = 0, rstep = 1;
    size_t n = 0;
    jv it;
    bool have_it = false;
    if (x->b->kind != N_SELECT) CK(lazy_range(r, x, scope, &lazy, &rstart, &rstep, &n, &it, &have_it));
    if (!lazy) {
        if (have_it) {
            /* range() with non-integer arguments, already evaluated */
        } else if (x->b->kind == N_SELECT) {
            CK(eval(r, x->b->a, scope, &it));
            test = x->b->b;
        } else {
            CK(eval(r, x->b, scope, &it));
        }
        if (!is_arr(it) && !is_obj(it))
            return rt_err(r, x->b->pos, EMBER_ERR_FORMAT, "Expected iterable or object type in for loop: got %s",
                          jv_type_name(it.type));
        if (is_obj(it)) CK(dict_keys(r, it.u.dict, false, x->pos, &it));
        const jv_list *src = it.u.list;
        jv_list *kept = test ? ja_alloc(r->a, sizeof *kept) : NULL;
        if (test && !kept) return rt_oom(r, x->pos);
        for (size_t i = 0; i < src->len; i++) {
            jv cur = src->items[i];
            CK(count_iter(r, x->pos, 1));
            if (x->a->kind == N_TUPLE) {
                if (cur.type != JV_ARRAY)
                    return rt_err(r, x->a->pos, EMBER_ERR_FORMAT, "Cannot unpack non-iterable type: %s", jv_type_name(cur.type));
                if (cur.u.list->len != x->a->list.n)
                    return rt_err(r, x->a->pos, EMBER_ERR_FORMAT, "Too %s items to unpack",
                                  x->a->list.n > cur.u.list->len ? "few" : "many");
            }
            if (test) {
                jenv *ls = env_new(r, scope);
                if (!ls) return rt_oom(r, x->pos);
                CK(assign_loop_vars(r, x->a, cur, ls));
                jv tv;
                CK(eval(r, test, ls, &tv));
                CK(nohole(r, tv, test->pos));
                if (!jv_truthy(tv)) continue;
                if (!jl_push(r->a, kept, cur)) return rt_oom(r, x->pos);
            }
        }
        items = test ? kept : src;
        n = items->len;
    } else {
        CK(count_iter(r, x->pos, (uint64_t)n));
    }
    /* the loop object: one per iteration when a template may keep it (uses
       `loop` other than as loop.attr), else one updated in place */
    jv_dict *d = NULL;
    bool none = true;
    for (size_t i = 0; i < n; i++) {
        jv cur = lazy ? jv_int(rstart + (double)i * rstep) : items->items[i];
        jv prev = i == 0 ? jv_undefined() : lazy ? jv_int(rstart + (double)(i - 1) * rstep) : items->items[i - 1];
        jv next = i + 1 >= n ? jv_undefined() : lazy ? jv_int(rstart + (double)(i + 1) * rstep) : items->items[i + 1];
        if (!d || r->t->loop_escapes) {
            jv loop = jv_dict_new(r->a, JV_OBJECT);
            if (loop.type != JV_OBJECT) return rt_oom(r, x->pos);
            d = loop.u.dict;
            bool ok = jd_append(r->a, d, "index", 5, jv_undefined()) && jd_append(r->a, d, "index0", 6, jv_undefined()) &&
                      jd_append(r->a, d, "revindex", 8, jv_undefined()) &&
                      jd_append(r->a, d, "revindex0", 9, jv_undefined()) &&
                      jd_append(r->a, d, "first", 5, jv_undefined()) && jd_append(r->a, d, "last", 4, jv_undefined()) &&
                      jd_append(r->a, d, "length", 6, jv_undefined()) &&
                      jd_append(r->a, d, "previtem", 8, jv_undefined()) &&
                      jd_append(r->a, d, "nextitem", 8, jv_undefined());
            if (!ok) return rt_oom(r, x->pos);
        }
        d->e[0].val = jv_int((double)i + 1);
        d->e[1].val = jv_int((double)i);
        d->e[2].val = jv_int((double)(n - i));
        d->e[3].val = jv_int((double)(n - i - 1));
        d->e[4].val = jv_bool(i == 0);
        d->e[5].val = jv_bool(i == n - 1);
        d->e[6].val = jv_int((double)n);
        d->e[7].val = prev;
        d->e[8].val = next;
        jv loop = jv_undefined();
        loop.type = JV_OBJECT;
        loop.u.dict = d;
        if (!env_set(r, scope, "loop", 4, loop)) return rt_oom(r, x->pos);
        CK(assign_loop_vars(r, x->a, cur, scope));
        size_t mark = sink->len;
        int rc = exec_block(r, &x->body, scope, sink);
        if (rc == EV_CONTINUE || rc == EV_BREAK) {
            sink->len = mark;
            if (sink->p) sink->p[mark] = '\0';
            if (rc == EV_BREAK) break;
            continue;
        }
        if (rc) return rc;
        none = false;
    }
    if (none) {
        int rc = exec_block(r, &x->alt, scope, sink);
        if (rc) return rc;
    }
    return 0;
}

static int exec_set(R *r, const jnode *x, jenv *env) {
    jv v;
    if (x->b) {
        CK(eval(r, x->b, env, &v));
    } else {
        CK(run_body(r, &x->body, env, x->pos, &v));
    }
    const jnode *t = x->a;
    if (t->kind == N_IDENT) {
        if (!env_set(r, env, t->s, t->n, v)) return rt_oom(r, x->pos);
        return 0;
    }
    if (t->kind == N_TUPLE) {
        if (!is_arr(v))
            return rt_err(r, t->pos, EMBER_ERR_FORMAT, "Cannot unpack non-iterable type in set: %s", jv_type_name(v.type));
        if (v.u.list->len != t->list.n)
            return rt_err(r, t->pos, EMBER_ERR_FORMAT, "Too %s items to unpack in set",
                          t->list.n > v.u.list->len ? "few" : "many");
        for (size_t i = 0; i < t->list.n; i++) {
            const jnode *e = t->list.v[i];
            if (e->kind != N_IDENT)
                return rt_err(r, e->pos, EMBER_ERR_FORMAT, "Cannot unpack to non-identifier in set");
            if (!env_set(r, env, e->s, e->n, v.u.list->items[i])) return rt_oom(r, x->pos);
        }
        return 0;
    }
    if (t->kind == N_MEMBER) {
        jv obj;
        CK(eval(r, t->a, env, &obj));
        if (obj.type != JV_NAMESPACE)
            return rt_err(r, t->pos, EMBER_ERR_FORMAT, "cannot assign attribute on non-namespace object (%s)", jv_type_name(obj.type));
        if (t->b->kind != N_IDENT)
            return rt_err(r, t->b->pos, EMBER_ERR_FORMAT, "Cannot assign to member with non-identifier property");
        if (!jd_set(r->a, obj.u.dict, t->b->s, t->b->n, jv_unhole(v))) return rt_oom(r, x->pos);
        return 0;
    }
    return rt_err(r, t->pos, EMBER_ERR_FORMAT, "Invalid left-hand side of an assignment");
}

static int emit(R *r, jsb *sink, jv v, size_t pos) {
    CK(nohole(r, v, pos));
    if (v.type == JV_NULL || v.type == JV_UNDEFINED) return 0;
    char why[160] = "";
    int rc = jv_print(sink, v, why, sizeof why);
    if (rc) return why_fail(r, rc, sink, pos, why);
    if (sink->failed) return sb_fail(r, sink, pos);
    return 0;
}

static int exec_stmt(R *r, const jnode *x, jenv *env, jsb *sink) {
    switch (x->kind) {
    case N_TEXT:
        if (!jsb_add(sink, x->s, x->n)) return sb_fail(r, sink, x->pos);
        return 0;
    case N_COMMENT: return 0;
    case N_IF: {
        jv t;
        CK(eval(r, x->a, env, &t));
        CK(nohole(r, t, x->pos));
        return exec_block(r, jv_truthy(t) ? &x->body : &x->alt, env, sink);
    }
    case N_FOR: return exec_for(r, x, env, sink);
    case N_SET: return exec_set(r, x, env);
    case N_MACRO: {
        jv f = mkfunc(r, F_MACRO, 0, jv_undefined(), x, NULL);
        if (f.type != JV_FUNCTION || !env_set(r, env, x->a->s, x->a->n, f)) return rt_oom(r, x->pos);
        return 0;
    }
    case N_CALLBLOCK: {
        const jnode *call = x->a;
        jv caller = mkfunc(r, F_CALLER, 0, jv_undefined(), x, env);
        if (caller.type != JV_FUNCTION) return rt_oom(r, x->pos);
        args a;
        CK(eval_args(r, &call->list, env, &a));
        CK(args_flat(r, &a, true, x->pos));
        jv fn;
        CK(eval(r, call->a, env, &fn));
        if (fn.type != JV_FUNCTION)
            return rt_err(r, call->a->pos, EMBER_ERR_FORMAT, "Cannot call something that is not a function: got %s",
                          jv_type_name(fn.type));
        jenv *ne = env_new(r, env);
        if (!ne || !env_set(r, ne, "caller", 6, caller)) return rt_oom(r, x->pos);
        jv res;
        CK(call_function(r, fn, a.pos, a.npos, ne, call->pos, &res));
        return emit(r, sink, res, x->pos);
    }
    case N_FILTERBLOCK: {
        jv body, res;
        CK(run_body(r, &x->body, env, x->pos, &body));
        CK(apply_filter(r, body, x->a, env, &res));
        return emit(r, sink, res, x->pos);
    }
    case N_BREAK: r->ctl_pos = x->pos; return EV_BREAK;
    case N_CONTINUE: r->ctl_pos = x->pos; return EV_CONTINUE;
    default: {
        jv v;
        CK(eval(r, x, env, &v));
        return emit(r, sink, v, x->pos);
    }
    }
}

static int exec_block(R *r, const jnodes *body, jenv *env, jsb *sink) {
    for (size_t i = 0; i < body->n; i++) {
        const jnode *x = body->v[i];
        CK(enter(r, x->pos));
        int rc = exec_stmt(r, x, env, sink);
        r->depth--;
        if (rc) return rc;
    }
    return 0;
}

/* ---------------------------------------------------------------- public API */

int jinja_compile(const char *src, size_t len, const jinja_options *opt, jinja_template **out, ember_error *err) {
    if (!out) return ember_err(err, EMBER_ERR_INVALID_ARG, "jinja_compile: out is NULL");
    *out = NULL;
    if (!src && len) return ember_err(err, EMBER_ERR_INVALID_ARG, "jinja_compile: src is NULL");
    size_t max_source = opt && opt->max_source ? opt->max_source : DEFAULT_MAX_SOURCE;
    int max_nesting = opt && opt->max_nesting > 0 ? opt->max_nesting : DEFAULT_MAX_NESTING;
    if (len > max_source)
        return ember_err(err, EMBER_ERR_LIMIT, "template: %zu bytes is over the limit of %zu bytes", len, max_source);
    jinja_template *t = ember_calloc(1, sizeof *t);
    if (!t) return ember_err(err, EMBER_ERR_NOMEM, "template: out of memory");
    ja_init(&t->arena, 0);
    t->source = ja_strdup(&t->arena, src ? src : "", len);
    t->source_len = len;
    if (!t->source) {
        jinja_free(t);
        return ember_err(err, EMBER_ERR_NOMEM, "template: out of memory");
    }
    jtok *toks = NULL;
    size_t ntoks = 0;
    int rc = jinja_lex(&t->arena, t->source, len, &toks, &ntoks, err, t->source, len);
    if (!rc) rc = jinja_parse(t, toks, ntoks, max_nesting, err);
    if (rc) {
        jinja_free(t);
        return rc;
    }
    *out = t;
    return EMBER_OK;
}

void jinja_free(jinja_template *t) {
    if (!t) return;
    ja_release(&t->arena);
    free(t);
}

jinja_ctx *jinja_ctx_new(const jinja_limits *limits) {
    jinja_ctx *c = ember_calloc(1, sizeof *c);
    if (!c) return NULL;
    if (limits) c->lim = *limits;
    if (!c->lim.max_output) c->lim.max_output = DEFAULT_MAX_OUTPUT;
    if (!c->lim.max_memory) c->lim.max_memory = DEFAULT_MAX_MEMORY;
    if (!c->lim.max_iterations) c->lim.max_iterations = DEFAULT_MAX_ITERATIONS;
    if (c->lim.max_depth <= 0) c->lim.max_depth = DEFAULT_MAX_DEPTH;
    ja_init(&c->arena, c->lim.max_memory);
    return c;
}

void jinja_ctx_free(jinja_ctx *c) {
    if (!c) return;
    ja_release(&c->arena);
    free(c);
}

void jinja_ctx_enable_extensions(jinja_ctx *c, bool on) {
    if (c) c->ext = on;
}

void jinja_ctx_set_time(jinja_ctx *c, const struct tm *now) {
    if (!c) return;
    c->have_time = now != NULL;
    if (now) c->now = *now;
}

jv jinja_ctx_str(jinja_ctx *c, const char *s, size_t n) {
    return jv_str_copy(&c->arena, s ? s : "", s ? n : 0);
}
jv jinja_ctx_list(jinja_ctx *c) {
    return jv_list_new(&c->arena, JV_ARRAY, 0);
}
jv jinja_ctx_dict(jinja_ctx *c) {
    return jv_dict_new(&c->arena, JV_OBJECT);
}
bool jinja_ctx_list_push(jinja_ctx *c, jv list, jv v) {
    if (list.type != JV_ARRAY || (v.type == JV_UNDEFINED && c->arena.failed)) return false;
    return jl_push(&c->arena, list.u.list, v);
}
bool jinja_ctx_dict_set(jinja_ctx *c, jv dict, const char *key, size_t klen, jv v) {
    if (dict.type != JV_OBJECT || (v.type == JV_UNDEFINED && c->arena.failed)) return false;
    char *k = ja_strdup(&c->arena, key, klen);
    if (!k) return false;
    jv *slot = jd_get(dict.u.dict, k, klen);
    if (slot) {
        *slot = v;
        return true;
    }
    return jd_append(&c->arena, dict.u.dict, k, klen, v);
}

bool jinja_ctx_dict_add(jinja_ctx *c, jv dict, const char *key, size_t klen, jv v) {
    if (dict.type != JV_OBJECT || (v.type == JV_UNDEFINED && c->arena.failed)) return false;
    char *k = ja_strdup(&c->arena, key, klen);
    return k && jd_append(&c->arena, dict.u.dict, k, klen, v);
}

int jinja_ctx_set(jinja_ctx *c, const char *name, jv v, ember_error *err) {
    if (!c || !name) return ember_err(err, EMBER_ERR_INVALID_ARG, "jinja_ctx_set: NULL argument");
    if (c->arena.failed)
        return ember_err(err, c->arena.failed, "template context: %s",
                         c->arena.failed == EMBER_ERR_LIMIT ? "memory limit exceeded" : "out of memory");
    size_t n = strlen(name);
    for (size_t i = 0; i < EMBER_ARRAY_LEN(GLOBALS); i++)
        if (strcmp(name, GLOBALS[i]) == 0)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "template context: variable '%s' is a built-in and cannot be set",
                             name);
    if (jd_get(&c->vars, name, n))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "template context: variable '%.64s' is already declared", name);
    char *k = ja_strdup(&c->arena, name, n);
    if (!k || !jd_append(&c->arena, &c->vars, k, n, v))
        return ember_err(err, c->arena.failed ? c->arena.failed : EMBER_ERR_NOMEM, "template context: out of memory");
    return EMBER_OK;
}

int jinja_render(const jinja_template *t, jinja_ctx *c, char **out, size_t *out_len, ember_error *err) {
    if (!out) return ember_err(err, EMBER_ERR_INVALID_ARG, "jinja_render: out is NULL");
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!t || !c) return ember_err(err, EMBER_ERR_INVALID_ARG, "jinja_render: NULL template or context");
    if (c->arena.failed)
        return ember_err(err, c->arena.failed, "template context: %s",
                         c->arena.failed == EMBER_ERR_LIMIT ? "memory limit exceeded" : "out of memory");
    R r;
    memset(&r, 0, sizeof r);
    r.c = c;
    r.a = &c->arena;
    r.t = t;
    r.err = err;
    jenv *root = env_new(&r, NULL);
    if (!root) return rt_oom(&r, 0);
    static const fkind gk[] = {F_NAMESPACE, 0, 0, 0, F_RAISE, F_RANGE, F_STRFTIME, 0, 0, 0};
    for (size_t i = 0; i < EMBER_ARRAY_LEN(GLOBALS); i++) {
        jv v;
        const char *g = GLOBALS[i];
        if (!strcmp(g, "false") || !strcmp(g, "False"))
            v = jv_bool(false);
        else if (!strcmp(g, "true") || !strcmp(g, "True"))
            v = jv_bool(true);
        else if (!strcmp(g, "none") || !strcmp(g, "None"))
            v = jv_null();
        else
            v = mkfunc(&r, gk[i], 0, jv_undefined(), NULL, NULL);
        if (v.type == JV_UNDEFINED || !env_set(&r, root, g, strlen(g), v)) return rt_oom(&r, 0);
    }
    for (size_t i = 0; i < c->vars.len; i++)
        if (!env_set(&r, root, c->vars.e[i].key, c->vars.e[i].klen, c->vars.e[i].val)) return rt_oom(&r, 0);
    jsb sink;
    jsb_init_out(&r, &sink);
    int rc = exec_block(&r, &t->body, root, &sink);
    if (rc == EV_BREAK || rc == EV_CONTINUE)
        rc = rt_err(&r, r.ctl_pos, EMBER_ERR_FORMAT, "%s outside of a loop", rc == EV_BREAK ? "break" : "continue");
    if (!rc && sink.failed) rc = sb_fail(&r, &sink, 0);
    if (rc) {
        jsb_free(&sink);
        return rc;
    }
    if (!sink.p) {
        sink.p = ember_malloc(1);
        if (!sink.p) return ember_err(err, EMBER_ERR_NOMEM, "template: out of memory");
        sink.p[0] = '\0';
    }
    *out = sink.p;
    if (out_len) *out_len = sink.len;
    return EMBER_OK;
}
