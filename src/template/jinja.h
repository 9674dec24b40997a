/*
 * jinja.h - a Jinja-subset interpreter for chat templates.
 *
 * Design: the behaviour oracle is the npm package @huggingface/jinja (the
 * engine of transformers.js). Wherever the reference renders, we render the
 * same bytes; wherever it fails, we fail too (with a "template:LINE:COL:"
 * message). Its quirks are mirrored on purpose: trim_blocks and lstrip_blocks
 * are always on, the one trailing newline of the source is dropped, booleans
 * print as "true"/"false", none prints as nothing, == is JavaScript's loose
 * equality on scalars, lengths and string indexing count UTF-16 units.
 *
 * Supported (what the reference supports): statements if/elif/else, for
 * (loop.index/index0/revindex/revindex0/first/last/length/previtem/nextitem,
 * else, filtered loops, unpacking), set (incl. block set and namespace
 * attributes), macro, call, filter, break, continue; expressions with
 * literals (lists, dicts, tuples), arithmetic, ~, comparisons, and/or/not,
 * (not) in, is (not) tests, x if c else y, attribute / item access, slices,
 * calls with positional / keyword / * / ** arguments. Filters: safe, tojson
 * (indent, ensure_ascii, sort_keys, separators), list, first, last, length,
 * reverse, sort (reverse, case_sensitive, attribute), join, string, unique,
 * upper, lower, title, capitalize, trim, indent, int, float, abs, items,
 * dictsort, default, replace, map(attribute=), selectattr, rejectattr, bool.
 * Tests: boolean, callable, odd, even, true, false, none, string, number,
 * integer, iterable, mapping, sequence, lower, upper, defined, undefined,
 * equalto, eq. Methods: string upper, lower, strip, lstrip, rstrip, title,
 * capitalize, startswith, endswith, split, replace, length; dict get, items,
 * keys, values, dictsort; list length. Globals: namespace, range,
 * raise_exception, strftime_now, true/false/none (and capitalized).
 * More (Python-Jinja2) with jinja_ctx_enable_extensions.
 *
 * Ownership:
 *  - A jinja_template owns its preprocessed source, tokens and syntax tree;
 *    it is immutable after jinja_compile and may be rendered from several
 *    threads at once, each with its own jinja_ctx.
 *  - A jinja_ctx owns one memory arena. Every value built through it
 *    (jinja_ctx_str, jinja_ctx_list, ...) and every value a render creates
 *    lives in that arena until jinja_ctx_free; nothing is freed one by one,
 *    so values may share and reference each other freely (no refcounts, no
 *    leaks, reference cycles are harmless). The arena has a byte limit.
 *  - jv is a small by-value handle; strings inside a jv are (pointer, length)
 *    views, not NUL-terminated, always valid UTF-8 or raw template bytes.
 * Nothing here prints, reads files, or keeps global mutable state.
 */
#ifndef EMBER_TEMPLATE_JINJA_H
#define EMBER_TEMPLATE_JINJA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "core/error.h"

typedef enum jv_type {
    JV_UNDEFINED = 0,
    JV_NULL,
    JV_BOOL,
    JV_INT,   /* a JavaScript number that prints as an integer */
    JV_FLOAT, /* a JavaScript number that prints with a fraction ("1.0") */
    JV_STRING,
    JV_ARRAY,
    JV_TUPLE,
    JV_OBJECT, /* insertion-ordered string -> value map */
    JV_KWARGS, /* keyword arguments of a call (an object) */
    JV_NAMESPACE,
    JV_FUNCTION,
} jv_type;

typedef struct jv_list jv_list;
typedef struct jv_dict jv_dict;
typedef struct jv_func jv_func;

typedef struct jv {
    jv_type type;
    union {
        bool b;
        double n; /* JV_INT and JV_FLOAT */
        struct {
            const char *p;
            size_t n;
        } s;
        jv_list *list; /* JV_ARRAY, JV_TUPLE */
        jv_dict *dict; /* JV_OBJECT, JV_KWARGS, JV_NAMESPACE */
        jv_func *fn;
    } u;
} jv;

struct jv_list {
    size_t len, cap;
    jv *items;
};

typedef struct jv_entry {
    const char *key;
    size_t klen;
    jv val;
} jv_entry;

struct jv_dict {
    size_t len, cap;
    jv_entry *e;
    uint32_t *idx; /* open-addressing index (entry + 1, 0 = empty) once big */
    size_t icap;
};

/* Limits of one render; a zero field takes the default in brackets. */
typedef struct jinja_limits {
    size_t max_output;        /* bytes of rendered text [16 MiB] */
    size_t max_memory;        /* bytes of the context arena [256 MiB] */
    uint64_t max_iterations;  /* loop iterations + range() elements, summed [10,000,000] */
    int max_depth;            /* nested evaluation (expressions, blocks, macro calls) [500] */
} jinja_limits;

/* Compile options; NULL means defaults. */
typedef struct jinja_options {
    size_t max_source;   /* bytes of template text [1 MiB] */
    int max_nesting;     /* syntactic nesting of blocks and expressions [200] */
} jinja_options;

typedef struct jinja_template jinja_template;
typedef struct jinja_ctx jinja_ctx;

/* Compiles template text (src, len bytes; need not be NUL-terminated).
   Returns EMBER_OK and sets *out (caller frees with jinja_free), or an error
   (EMBER_ERR_FORMAT for syntax, with "template:LINE:COL: ..." in err). */
int jinja_compile(const char *src, size_t len, const jinja_options *opt, jinja_template **out,
                  ember_error *err);
/* Frees a compiled template (NULL is fine). */
void jinja_free(jinja_template *t);

/* A new render context with an empty variable set and the given limits
   (NULL: defaults; the struct is copied). Returns NULL on OOM. Free with
   jinja_ctx_free. */
jinja_ctx *jinja_ctx_new(const jinja_limits *limits);
void jinja_ctx_free(jinja_ctx *c);

/* Turns on extensions (off by default): Python-Jinja2 features that the
   reference lacks, active only where the reference would fail - filters
   count, d, default without arguments, wordcount, round, select, reject,
   map('filter'), sum, min, max, first/last/list on strings, list on objects;
   string methods find, rfind, count, rsplit, join, splitlines, isdigit,
   isalpha, isalnum, isspace, islower, isupper, removeprefix, removesuffix,
   format; list methods append, extend, pop, index, count, insert; the test
   float and the global dict(). Output of templates the reference renders
   does not change, except that `x.append is defined` and the like become
   true. */
void jinja_ctx_enable_extensions(jinja_ctx *c, bool on);

/* Pins the clock that strftime_now() reads (copied); NULL restores "now in
   local time". */
void jinja_ctx_set_time(jinja_ctx *c, const struct tm *now);

/* Value constructors. Strings are copied into the ctx arena. On arena
   exhaustion these return a JV_UNDEFINED value (or false) and the ctx
   remembers the failure: jinja_ctx_set and jinja_render then fail with
   EMBER_ERR_NOMEM / EMBER_ERR_LIMIT. */
jv jv_undefined(void);
jv jv_null(void);
jv jv_bool(bool b);
jv jv_int(double n);
jv jv_float(double n);
jv jinja_ctx_str(jinja_ctx *c, const char *s, size_t n);
jv jinja_ctx_list(jinja_ctx *c);  /* an empty JV_ARRAY */
jv jinja_ctx_dict(jinja_ctx *c);  /* an empty JV_OBJECT */
/* Appends v to list (a JV_ARRAY made by this ctx). Returns false on failure. */
bool jinja_ctx_list_push(jinja_ctx *c, jv list, jv v);
/* Sets key (copied) in dict (a JV_OBJECT made by this ctx); an existing key
   keeps its position and takes the new value. Returns false on failure. */
bool jinja_ctx_dict_set(jinja_ctx *c, jv dict, const char *key, size_t klen, jv v);

/* Like jinja_ctx_dict_set for a key known not to be in dict (e.g. the members
   of a parsed JSON object, which are unique): no duplicate check. */
bool jinja_ctx_dict_add(jinja_ctx *c, jv dict, const char *key, size_t klen, jv v);

/* Declares a top-level template variable (name copied). Fails with
   EMBER_ERR_INVALID_ARG if the name is already declared, including the
   built-in globals (true, false, none, True, False, None, namespace, range,
   raise_exception, strftime_now) - as the reference does. */
int jinja_ctx_set(jinja_ctx *c, const char *name, jv v, ember_error *err);

/* Renders t with the variables of c. On EMBER_OK, *out is a malloc'd,
   NUL-terminated UTF-8 string (caller frees) and *out_len (if non-NULL) its
   length. On failure *out is NULL and err says what and where
   ("template:LINE:COL: ..."): EMBER_ERR_FORMAT for template errors (unknown
   filter, type error, ...), EMBER_ERR_INVALID_ARG for raise_exception(),
   EMBER_ERR_LIMIT when a limit is hit, EMBER_ERR_NOMEM. Temporary values
   stay in c's arena until jinja_ctx_free. */
int jinja_render(const jinja_template *t, jinja_ctx *c, char **out, size_t *out_len, ember_error *err);

#endif
