/* grammar.c - see grammar.h.
 *
 * A grammar is an array of nodes (literal, sequence, choice of literal
 * heads, object, array, string, number, union dispatched on the first
 * byte). A matcher's state is a stack of frames, one per node being
 * matched; a byte goes to the top frame, and a frame that refuses it but is
 * complete is popped so the byte goes to its parent. Every decision depends
 * only on the bytes fed, and no frame is ever left without a way to finish:
 * a state the grammar reaches always has a completion (nothing recursive,
 * ranges and counts checked before they are entered).
 *
 * Ownership: the grammar owns its nodes and their strings; a matcher owns
 * its state and scratch; the vocabulary owns its trie.
 */
#include "grammar.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/cpu.h"
#include "gbnf.h"
#include "regex.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_AVX512_MASK 1
#endif

#define MAX_STACK 32   /* frames: nesting of values */
#define MAX_TOKEN 128  /* bytes of a token the trie holds (longer ones are never allowed) */
#define MAX_PROPS 64   /* properties of one object */
#define MAX_ENUM 256   /* values of one enum */
#define MAX_WS 16      /* white-space characters in a row */
#define MAX_NUM 24     /* characters of a number */
#define MAX_INT_DIGITS 15 /* digits before a number's point */
#define MAX_SCHEMA_DEPTH 24
#define NO_LEFT (1 << 29) /* no token budget */
#define BIG_LEN (1 << 28) /* a length beyond any budget */
#define BNUM_INT_DIGITS 15   /* bounded integers: digits (exact in int64 and doubles) */
#define BNUM_NUM_DIGITS 9    /* bounded numbers: digits before the point */
#define BNUM_FRAC_DIGITS 6   /* bounded numbers: digits after it */

enum { K_LIT, K_SEQ, K_CHOICE, K_OBJ, K_ARR, K_STR, K_NUM, K_UNION, K_TEXT };

typedef struct gnode {
    int kind;
    char *text; /* LIT */
    size_t len;
    int *kids; /* SEQ, UNION: the parts; OBJ: each property's value node */
    int n;
    char **keys; /* CHOICE heads / OBJ property names, sorted */
    size_t *klen;
    int *next;          /* CHOICE: the node after each head, -1 none */
    uint64_t required;  /* OBJ */
    bool free_obj;      /* OBJ: any keys, any values */
    int item;           /* ARR */
    int lo, hi;         /* ARR items, STR length: min, max (-1 none) */
    bool integer;       /* NUM */
    bool bounded;       /* NUM: minimum / maximum: no exponent, values within [ulo, uhi] */
    int8_t sd, maxd;    /* NUM bounded: digits after the point (0: integer), before it */
    int64_t ulo, uhi;   /* NUM bounded: the range in units of 10^-sd */
    ember_rx *rx;       /* STR: the pattern (NULL: none) */
    int minlen;         /* fewest bytes of a complete value (set_root computes it) */
    uint8_t first[32];  /* bytes the node can begin with */
} gnode;

struct ember_grammar {
    gb_prog *gb; /* a GBNF grammar or a regular expression (gbnf.h): the whole grammar; nodes unused */
    gnode *nodes;
    int n, cap;
    int root;
    int any, str; /* shared nodes: any JSON value, any string (-1 until made) */
    /* $ref compilation: memo and the refs being compiled (recursion) */
    const json_t *ref_sch[64];
    int ref_node[64];
    int n_ref;
    const json_t *busy[64];
    int n_busy;
};

/* ---- building -------------------------------------------------------------------------------- */

static void node_free(gnode *nd) {
    free(nd->text);
    free(nd->kids);
    for (int i = 0; nd->keys && i < nd->n; i++) free(nd->keys[i]);
    free(nd->keys);
    free(nd->klen);
    free(nd->next);
    free(nd->rx);
}

ember_grammar *ember_grammar_new(void) {
    ember_grammar *g = ember_calloc(1, sizeof *g);
    if (g) {
        g->root = -1;
        g->any = -1;
        g->str = -1;
    }
    return g;
}

void ember_grammar_free(ember_grammar *g) {
    if (!g) return;
    for (int i = 0; i < g->n; i++) node_free(&g->nodes[i]);
    free(g->nodes);
    gb_prog_free(g->gb);
    free(g);
}

static int add(ember_grammar *g, int kind, ember_error *err) {
    if (g->n == g->cap) {
        if (g->cap >= (1 << 20)) return ember_err(err, EMBER_ERR_LIMIT, "the grammar is too large");
        int cap = g->cap ? g->cap * 2 : 32;
        gnode *nn = ember_realloc(g->nodes, (size_t)cap * sizeof *nn);
        if (!nn) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        g->nodes = nn;
        g->cap = cap;
    }
    memset(&g->nodes[g->n], 0, sizeof(gnode));
    g->nodes[g->n].kind = kind;
    g->nodes[g->n].hi = -1;
    g->nodes[g->n].item = -1;
    return g->n++;
}

static void set_first(uint8_t *f, unsigned char c) {
    f[c >> 3] |= (uint8_t)(1u << (c & 7));
}

static bool in_first(const uint8_t *f, unsigned char c) {
    return f[c >> 3] >> (c & 7) & 1;
}

int ember_grammar_literal(ember_grammar *g, const char *text, size_t len, ember_error *err) {
    if (len == 0) return ember_err(err, EMBER_ERR_INVALID_ARG, "an empty literal");
    int k = add(g, K_LIT, err);
    if (k < 0) return k;
    gnode *nd = &g->nodes[k];
    nd->text = ember_malloc(len);
    if (!nd->text) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    memcpy(nd->text, text, len);
    nd->len = len;
    set_first(nd->first, (unsigned char)text[0]);
    return k;
}

int ember_grammar_seq(ember_grammar *g, const int *nodes, int n, ember_error *err) {
    if (n < 1) return ember_err(err, EMBER_ERR_INVALID_ARG, "an empty sequence");
    for (int i = 0; i < n; i++)
        if (nodes[i] < 0 || nodes[i] >= g->n) return ember_err(err, EMBER_ERR_INVALID_ARG, "a bad node");
    if (n == 1) return nodes[0];
    int k = add(g, K_SEQ, err);
    if (k < 0) return k;
    gnode *nd = &g->nodes[k];
    nd->kids = ember_malloc((size_t)n * sizeof *nd->kids);
    if (!nd->kids) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    memcpy(nd->kids, nodes, (size_t)n * sizeof *nodes);
    nd->n = n;
    memcpy(nd->first, g->nodes[nodes[0]].first, 32);
    return k;
}

static int cmp_key(const char *a, size_t al, const char *b, size_t bl) {
    int c = memcmp(a, b, al < bl ? al : bl);
    return c ? c : (al < bl ? -1 : al > bl ? 1 : 0);
}

/* Sorts keys (with their parallel arrays) and refuses duplicates. */
static int sort_keys(gnode *nd, const char *what, ember_error *err) {
    for (int i = 1; i < nd->n; i++) /* insertion sort: n is small */
        for (int j = i; j > 0 && cmp_key(nd->keys[j - 1], nd->klen[j - 1], nd->keys[j], nd->klen[j]) > 0; j--) {
            char *t = nd->keys[j];
            nd->keys[j] = nd->keys[j - 1];
            nd->keys[j - 1] = t;
            size_t tl = nd->klen[j];
            nd->klen[j] = nd->klen[j - 1];
            nd->klen[j - 1] = tl;
            int *par = nd->next ? nd->next : nd->kids;
            if (par) {
                int tn = par[j];
                par[j] = par[j - 1];
                par[j - 1] = tn;
            }
        }
    for (int i = 1; i < nd->n; i++)
        if (!cmp_key(nd->keys[i - 1], nd->klen[i - 1], nd->keys[i], nd->klen[i]))
            return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: '%.64s' is given twice", what, nd->keys[i]);
    return 0;
}

static int alloc_keys(gnode *nd, int n, bool with_next, ember_error *err) {
    nd->keys = ember_calloc((size_t)n, sizeof *nd->keys);
    nd->klen = ember_calloc((size_t)n, sizeof *nd->klen);
    if (with_next) nd->next = ember_calloc((size_t)n, sizeof *nd->next);
    if (!nd->keys || !nd->klen || (with_next && !nd->next)) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    return 0;
}

int ember_grammar_choice(ember_grammar *g, const char *const *heads, const int *next, int n, ember_error *err) {
    if (n < 1) return ember_err(err, EMBER_ERR_INVALID_ARG, "an empty choice");
    int k = add(g, K_CHOICE, err);
    if (k < 0) return k;
    gnode *nd = &g->nodes[k];
    if (alloc_keys(nd, n, true, err)) return -1;
    for (int i = 0; i < n; i++) {
        size_t l = strlen(heads[i]);
        nd->keys[i] = ember_malloc(l + 1);
        if (!nd->keys[i]) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        memcpy(nd->keys[i], heads[i], l + 1);
        nd->klen[i] = l;
        nd->n = i + 1;
        nd->next[i] = next ? next[i] : -1;
        if (l == 0) return ember_err(err, EMBER_ERR_INVALID_ARG, "an empty choice head");
        set_first(nd->first, (unsigned char)heads[i][0]);
    }
    if (sort_keys(nd, "choice", err)) return -1;
    for (int i = 0; i + 1 < n; i++) /* a head with a node after it may not be a prefix of the next */
        if (nd->next[i] >= 0 && nd->klen[i] < nd->klen[i + 1] && !memcmp(nd->keys[i], nd->keys[i + 1], nd->klen[i]))
            return ember_err(err, EMBER_ERR_INVALID_ARG, "choice heads '%.64s' and '%.64s' overlap", nd->keys[i],
                             nd->keys[i + 1]);
    return k;
}

static int make_union(ember_grammar *g, const int *alts, int n, const char *where, ember_error *err) {
    if (n == 1) return alts[0];
    int k = add(g, K_UNION, err);
    if (k < 0) return k;
    gnode *nd = &g->nodes[k];
    nd->kids = ember_malloc((size_t)n * sizeof *nd->kids);
    if (!nd->kids) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    memcpy(nd->kids, alts, (size_t)n * sizeof *alts);
    nd->n = n;
    for (int i = 0; i < n; i++)
        for (int b = 0; b < 256; b++) {
            if (!in_first(g->nodes[alts[i]].first, (unsigned char)b)) continue;
            if (in_first(nd->first, (unsigned char)b))
                return ember_err(err, EMBER_ERR_INVALID_ARG,
                                 "%s: anyOf / oneOf / type branches that can begin with the same character ('%c') are "
                                 "not supported",
                                 where, b);
            set_first(nd->first, (unsigned char)b);
        }
    return k;
}

static int make_str(ember_grammar *g, int lo, int hi, ember_error *err) {
    int k = add(g, K_STR, err);
    if (k < 0) return k;
    g->nodes[k].lo = lo;
    g->nodes[k].hi = hi;
    set_first(g->nodes[k].first, '"');
    return k;
}

static int make_num(ember_grammar *g, bool integer, ember_error *err) {
    int k = add(g, K_NUM, err);
    if (k < 0) return k;
    g->nodes[k].integer = integer;
    set_first(g->nodes[k].first, '-');
    for (int c = '0'; c <= '9'; c++) set_first(g->nodes[k].first, (unsigned char)c);
    return k;
}

int ember_grammar_text(ember_grammar *g, ember_error *err) {
    int k = add(g, K_TEXT, err);
    if (k < 0) return k;
    for (int c = 0; c < 256; c++)
        if (c != '<' && (c >= 0x20 || c == '\n' || c == '\t')) set_first(g->nodes[k].first, (unsigned char)c);
    return k;
}

static int make_bool(ember_grammar *g, ember_error *err) {
    static const char *const heads[] = {"true", "false"};
    return ember_grammar_choice(g, heads, NULL, 2, err);
}

/* Any JSON value: a union of a free object, a free array, a string, a
   number, true / false / null. Made once per grammar. */
static int any_value(ember_grammar *g, ember_error *err) {
    if (g->any >= 0) return g->any;
    int u = add(g, K_UNION, err);
    if (u < 0) return u;
    g->any = u;
    int obj = add(g, K_OBJ, err), arr = obj >= 0 ? add(g, K_ARR, err) : -1;
    int str = arr >= 0 ? make_str(g, 0, -1, err) : -1, num = str >= 0 ? make_num(g, false, err) : -1;
    static const char *const heads[] = {"true", "false", "null"};
    int lit = num >= 0 ? ember_grammar_choice(g, heads, NULL, 3, err) : -1;
    if (lit < 0) return -1;
    g->nodes[obj].free_obj = true;
    set_first(g->nodes[obj].first, '{');
    g->nodes[arr].item = u;
    g->nodes[arr].lo = 0;
    set_first(g->nodes[arr].first, '[');
    if (g->str < 0) g->str = str;
    gnode *nd = &g->nodes[u];
    nd->kids = ember_malloc(5 * sizeof *nd->kids);
    if (!nd->kids) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    int alts[5] = {obj, arr, str, num, lit};
    memcpy(nd->kids, alts, sizeof alts);
    nd->n = 5;
    for (int i = 0; i < 5; i++)
        for (int b = 0; b < 32; b++) nd->first[b] |= g->nodes[alts[i]].first[b];
    return u;
}

int ember_grammar_any_object(ember_grammar *g, ember_error *err) {
    if (any_value(g, err) < 0) return -1;
    return g->nodes[g->any].kids[0];
}

static void compute_minlen(ember_grammar *g);

int ember_grammar_set_root(ember_grammar *g, int node, ember_error *err) {
    if (node < 0 || node >= g->n) return ember_err(err, EMBER_ERR_INVALID_ARG, "a bad root node");
    g->root = node;
    compute_minlen(g);
    return 0;
}

int ember_grammar_min_bytes(const ember_grammar *g) {
    if (g->gb) return gb_prog_min_bytes(g->gb);
    return g->root < 0 ? 0 : g->nodes[g->root].minlen;
}

int ember_grammar_gbnf(ember_grammar *g, const char *text, size_t len, ember_error *err) {
    if (g->gb || g->n > 0 || g->root >= 0)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "a GBNF grammar must be the whole grammar");
    return gb_compile(text, len, &g->gb, err);
}

int ember_grammar_regex(ember_grammar *g, const char *pattern, const char *what, ember_error *err) {
    if (g->gb || g->n > 0 || g->root >= 0)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "a regular expression must be the whole grammar");
    return gb_compile_regex(pattern, what, &g->gb, err);
}

/* ---- JSON schema ------------------------------------------------------------------------------- */

static const char *const k_annotations[] = {"title", "description", "default", "examples", "$schema", "$id",
                                            "$comment", "deprecated", "readOnly", "writeOnly", "strict", NULL};
static const char *const k_handled[] = {"type", "properties", "required", "additionalProperties", "items", "minItems",
                                        "maxItems", "enum", "const", "minLength", "maxLength", "anyOf", "oneOf",
                                        "$ref", "$defs", "definitions", "pattern", "minimum", "maximum",
                                        "exclusiveMinimum", "exclusiveMaximum", NULL};
/* keywords that constrain one type only: refused in a schema without "type" */
static const char *const k_typed[] = {"minLength", "maxLength", "pattern", "minimum", "maximum", "exclusiveMinimum",
                                      "exclusiveMaximum", "minItems", "maxItems", "required", "additionalProperties",
                                      NULL};

static bool in_list(const char *const *l, const char *k) {
    for (int i = 0; l[i]; i++)
        if (!strcmp(l[i], k)) return true;
    return false;
}

static int compile(ember_grammar *g, const json_t *s, const json_t *root, const char *where, int depth, ember_error *err);

/* A non-negative integer keyword; -1 when absent. */
static int count_kw(const json_t *s, const char *k, const char *where, int *out, ember_error *err) {
    const json_t *v = json_object_get(s, k);
    *out = -1;
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 100000)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: '%s' must be an integer from 0 to 100000", where, k);
    *out = (int)json_integer_value(v);
    return 0;
}

static int compile_object(ember_grammar *g, const json_t *s, const json_t *root, const char *where, int depth,
                          ember_error *err) {
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    const json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: 'properties' must be an object", where);
    if (addl && !json_is_boolean(addl) && !(json_is_object(addl) && json_object_size(addl) == 0))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: 'additionalProperties' with a schema is not supported", where);
    if (req && !json_is_array(req))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: 'required' must be an array of names", where);
    size_t np = props ? json_object_size(props) : 0;
    if (np == 0 && !json_is_false(addl)) { /* no properties named: any object */
        if (json_array_size(req))
            return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: 'required' names properties 'properties' lacks", where);
        return ember_grammar_any_object(g, err);
    }
    if (np > MAX_PROPS)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: more than %d properties are not supported", where, MAX_PROPS);
    int k = add(g, K_OBJ, err);
    if (k < 0) return k;
    set_first(g->nodes[k].first, '{');
    if (np == 0) return k; /* {} only */
    if (alloc_keys(&g->nodes[k], (int)np, false, err)) return -1;
    g->nodes[k].kids = ember_calloc(np, sizeof(int));
    if (!g->nodes[k].kids) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    const char *name;
    const json_t *ps;
    int i = 0;
    json_object_foreach((json_t *)props, name, ps) {
        size_t l = strlen(name);
        for (size_t c = 0; c < l; c++)
            if (name[c] == '"' || name[c] == '\\' || (unsigned char)name[c] < 0x20)
                return ember_err(err, EMBER_ERR_INVALID_ARG,
                                 "%s: property names with quotes, backslashes or control characters are not supported",
                                 where);
        if (l == 0 || l > 256)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: property names must be 1 to 256 bytes", where);
        char sub[200];
        snprintf(sub, sizeof sub, "%.120s.properties.%.60s", where, name);
        int v = compile(g, ps, root, sub, depth + 1, err);
        if (v < 0) return v;
        gnode *nd = &g->nodes[k]; /* compile may have moved the nodes */
        nd->keys[i] = ember_malloc(l + 1);
        if (!nd->keys[i]) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        memcpy(nd->keys[i], name, l + 1);
        nd->klen[i] = l;
        nd->kids[i] = v;
        nd->n = ++i;
    }
    gnode *nd = &g->nodes[k];
    if (sort_keys(nd, where, err)) return -1;
    size_t r;
    const json_t *rv;
    json_array_foreach(req, r, rv) {
        int at = -1;
        for (int j = 0; json_is_string(rv) && j < nd->n; j++)
            if (nd->klen[j] == json_string_length(rv) && !memcmp(nd->keys[j], json_string_value(rv), nd->klen[j])) at = j;
        if (at < 0)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: required[%zu] is not one of 'properties'", where, r);
        nd->required |= 1ull << at;
    }
    return k;
}

/* The pattern of string node k (schema s has one). */
static int compile_pattern(ember_grammar *g, int k, const json_t *s, const char *where, ember_error *err) {
    const json_t *p = json_object_get(s, "pattern");
    if (!json_is_string(p)) return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: 'pattern' must be a string", where);
    if (json_object_get(s, "minLength") || json_object_get(s, "maxLength"))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: 'pattern' together with minLength / maxLength is not supported",
                         where);
    ember_rx *rx = ember_malloc(sizeof *rx);
    if (!rx) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    char why[160] = "";
    if (ember_rx_compile(json_string_value(p), rx, why, sizeof why)) {
        free(rx);
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: %s", where, why);
    }
    g->nodes[k].rx = rx;
    return 0;
}

static int64_t p10(int k) {
    int64_t v = 1;
    while (k-- > 0) v *= 10;
    return v;
}

/* Whether U / S (as a double) is on the allowed side of bound x. */
static bool bound_ok(int64_t u, int64_t S, double x, bool upper, bool strict) {
    double v = (double)u / (double)S;
    return upper ? (strict ? v < x : v <= x) : (strict ? v > x : v >= x);
}

/* The least (upper: greatest) U in units of 1/S whose value is on the
   allowed side of x, U clamped to just beyond +-lim. */
static int64_t scaled_bound(double x, int64_t S, bool upper, bool strict, int64_t lim) {
    double c = upper ? floor(x * (double)S) : ceil(x * (double)S);
    if (!(c <= (double)lim)) c = (double)lim + 1;
    if (!(c >= -(double)lim)) c = -(double)lim - 1;
    int64_t u = (int64_t)c;
    for (int i = 0; i < 8 && !bound_ok(u, S, x, upper, strict); i++) u += upper ? -1 : 1;
    for (int i = 0; i < 8 && bound_ok(upper ? u + 1 : u - 1, S, x, upper, strict); i++) u += upper ? 1 : -1;
    return u;
}

/* minimum / maximum / exclusive* of number node k. */
static int num_bounds(ember_grammar *g, int k, const json_t *s, const char *where, ember_error *err) {
    static const char *const kw[4] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    gnode *nd = &g->nodes[k];
    nd->sd = (int8_t)(nd->integer ? 0 : BNUM_FRAC_DIGITS);
    nd->maxd = (int8_t)(nd->integer ? BNUM_INT_DIGITS : BNUM_NUM_DIGITS);
    int64_t S = p10(nd->sd), lim = p10(nd->maxd) * S - 1;
    nd->ulo = -lim;
    nd->uhi = lim;
    for (int i = 0; i < 4; i++) {
        const json_t *v = json_object_get(s, kw[i]);
        if (!v) continue;
        if (json_is_boolean(v))
            return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: a boolean '%s' (draft 4) is not supported: give the bound",
                             where, kw[i]);
        if (!json_is_number(v)) return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: '%s' must be a number", where, kw[i]);
        nd->bounded = true;
        int64_t u = scaled_bound(json_number_value(v), S, i >= 2, i & 1, lim);
        if (i < 2 && u > nd->ulo) nd->ulo = u;
        if (i >= 2 && u < nd->uhi) nd->uhi = u;
    }
    if (nd->bounded && nd->ulo > nd->uhi)
        return ember_err(err, EMBER_ERR_INVALID_ARG,
                         "%s: no %s satisfies minimum / maximum (bounded values are written with at most %d digits "
                         "before the point%s)",
                         where, nd->integer ? "integer" : "number", nd->maxd, nd->integer ? "" : " and 6 after");
    return 0;
}

static int compile_type(ember_grammar *g, const char *t, const json_t *s, const json_t *root, const char *where,
                        int depth, ember_error *err) {
    if (!strcmp(t, "object")) return compile_object(g, s, root, where, depth, err);
    if (!strcmp(t, "array")) {
        int lo, hi;
        if (count_kw(s, "minItems", where, &lo, err) || count_kw(s, "maxItems", where, &hi, err)) return -1;
        if (hi >= 0 && lo > hi) return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: minItems > maxItems", where);
        const json_t *items = json_object_get(s, "items");
        char sub[200];
        snprintf(sub, sizeof sub, "%.180s.items", where);
        int it = items ? compile(g, items, root, sub, depth + 1, err) : any_value(g, err);
        if (it < 0) return it;
        int k = add(g, K_ARR, err);
        if (k < 0) return k;
        g->nodes[k].item = it;
        g->nodes[k].lo = lo < 0 ? 0 : lo;
        g->nodes[k].hi = hi;
        set_first(g->nodes[k].first, '[');
        return k;
    }
    if (!strcmp(t, "string")) {
        int lo, hi;
        if (count_kw(s, "minLength", where, &lo, err) || count_kw(s, "maxLength", where, &hi, err)) return -1;
        if (hi >= 0 && lo > hi) return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: minLength > maxLength", where);
        int k = make_str(g, lo < 0 ? 0 : lo, hi, err);
        if (k >= 0 && json_object_get(s, "pattern") && compile_pattern(g, k, s, where, err)) return -1;
        return k;
    }
    if (!strcmp(t, "number") || !strcmp(t, "integer")) {
        int k = make_num(g, t[0] == 'i', err);
        if (k >= 0 && num_bounds(g, k, s, where, err)) return -1;
        return k;
    }
    if (!strcmp(t, "boolean")) return make_bool(g, err);
    if (!strcmp(t, "null")) return ember_grammar_literal(g, "null", 4, err);
    return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: unknown type '%.32s'", where, t);
}

/* "#/$defs/NAME", "#/definitions/NAME" or "#". */
static const json_t *resolve_ref(const json_t *root, const char *ref) {
    if (!strcmp(ref, "#")) return root;
    const char *p;
    const json_t *defs;
    if (!strncmp(ref, "#/$defs/", 8)) {
        p = ref + 8;
        defs = json_object_get(root, "$defs");
    } else if (!strncmp(ref, "#/definitions/", 14)) {
        p = ref + 14;
        defs = json_object_get(root, "definitions");
    } else {
        return NULL;
    }
    if (strchr(p, '/') || strchr(p, '~')) return NULL;
    return json_object_get(defs, p);
}

static int compile(ember_grammar *g, const json_t *s, const json_t *root, const char *where, int depth, ember_error *err) {
    if (depth > MAX_SCHEMA_DEPTH) return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: the schema nests too deep", where);
    if (json_is_true(s)) return any_value(g, err);
    if (!json_is_object(s)) return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: a schema must be an object", where);
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)s, key, v) {
        if (!in_list(k_handled, key) && !in_list(k_annotations, key))
            return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: the schema keyword '%.40s' is not supported", where, key);
    }
    const json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        if (!json_is_string(ref)) return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: '$ref' must be a string", where);
        const json_t *t = resolve_ref(root, json_string_value(ref));
        if (!t)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: '$ref' '%.64s' does not resolve (#/$defs/NAME)", where,
                             json_string_value(ref));
        for (int i = 0; i < g->n_ref; i++)
            if (g->ref_sch[i] == t) return g->ref_node[i];
        for (int i = 0; i < g->n_busy; i++)
            if (g->busy[i] == t)
                return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: recursive '$ref' '%.64s' is not supported", where,
                                 json_string_value(ref));
        if (g->n_busy == 64 || g->n_ref == 64)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: too many '$ref's", where);
        g->busy[g->n_busy++] = t;
        int k = compile(g, t, root, json_string_value(ref), depth + 1, err);
        g->n_busy--;
        if (k < 0) return k;
        g->ref_sch[g->n_ref] = t;
        g->ref_node[g->n_ref++] = k;
        return k;
    }
    const json_t *cn = json_object_get(s, "const"), *en = json_object_get(s, "enum");
    if (cn || en) {
        if (en && (!json_is_array(en) || json_array_size(en) == 0))
            return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: 'enum' must be a non-empty array", where);
        size_t n = cn ? 1 : json_array_size(en);
        if (n > MAX_ENUM)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: enums of more than %d values are not supported", where,
                             MAX_ENUM);
        char **heads = ember_calloc(n, sizeof *heads);
        if (!heads) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        int rc = 0;
        size_t total = 0;
        for (size_t i = 0; i < n && !rc; i++) {
            heads[i] = json_dumps(cn ? cn : json_array_get(en, i), JSON_COMPACT | JSON_ENCODE_ANY);
            if (!heads[i]) rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
            total += heads[i] ? strlen(heads[i]) : 0;
        }
        if (!rc && total > 65536)
            rc = ember_err(err, EMBER_ERR_INVALID_ARG, "%s: the enum's values are too long (over 64 KiB)", where);
        /* duplicates are dropped (the choice refuses them) */
        size_t m = 0;
        for (size_t i = 0; i < n && !rc; i++) {
            bool dup = false;
            for (size_t j = 0; j < m && !dup; j++) dup = !strcmp(heads[j], heads[i]);
            if (dup) {
                free(heads[i]);
                heads[i] = NULL;
            } else {
                heads[m++] = heads[i];
                if (m - 1 != i) heads[i] = NULL;
            }
        }
        int k = rc ? -1 : ember_grammar_choice(g, (const char *const *)heads, NULL, (int)m, err);
        for (size_t i = 0; i < n; i++) free(heads[i]);
        free(heads);
        return k;
    }
    const json_t *any = json_object_get(s, "anyOf");
    if (!any) any = json_object_get(s, "oneOf");
    if (any) {
        if (!json_is_array(any) || json_array_size(any) == 0 || json_array_size(any) > 16)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: 'anyOf' / 'oneOf' must hold 1 to 16 schemas", where);
        int alts[16];
        size_t i;
        const json_t *a;
        json_array_foreach(any, i, a) {
            char sub[200];
            snprintf(sub, sizeof sub, "%.170s.anyOf[%zu]", where, i);
            alts[i] = compile(g, a, root, sub, depth + 1, err);
            if (alts[i] < 0) return -1;
        }
        return make_union(g, alts, (int)json_array_size(any), where, err);
    }
    const json_t *ty = json_object_get(s, "type");
    if (json_is_string(ty)) return compile_type(g, json_string_value(ty), s, root, where, depth, err);
    if (json_is_array(ty)) {
        if (json_array_size(ty) == 0 || json_array_size(ty) > 7)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: 'type' must name 1 to 7 types", where);
        int alts[7];
        size_t i;
        const json_t *t;
        bool num = false;
        json_array_foreach(ty, i, t) {
            if (!json_is_string(t)) return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: 'type' entries must be strings", where);
            const char *tn = json_string_value(t);
            if (!strcmp(tn, "integer") || !strcmp(tn, "number")) {
                if (num) return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: 'type' holds both number and integer", where);
                num = true;
            }
            alts[i] = compile_type(g, tn, s, root, where, depth, err);
            if (alts[i] < 0) return -1;
        }
        return make_union(g, alts, (int)json_array_size(ty), where, err);
    }
    if (ty) return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: 'type' must be a string or an array", where);
    if (json_object_get(s, "properties")) return compile_object(g, s, root, where, depth, err);
    if (json_object_get(s, "items")) return compile_type(g, "array", s, root, where, depth, err);
    for (int i = 0; k_typed[i]; i++)
        if (json_object_get(s, k_typed[i]))
            return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: '%s' without 'type' is not supported (name the type)",
                             where, k_typed[i]);
    return any_value(g, err);
}

int ember_grammar_schema(ember_grammar *g, const json_t *schema, const json_t *defs, const char *where,
                         ember_error *err) {
    g->n_busy = 0;
    return compile(g, schema, defs ? defs : schema, where ? where : "schema", 0, err);
}

/* ---- matching ------------------------------------------------------------------------------------ */

enum { S_OPEN, S_IN, S_ESC, S_HEX, S_DONE };
enum { N_START, N_SIGN, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };
enum { O_OPEN, O_FIRST, O_KEY, O_COLON, O_VAL, O_AFTER, O_NEXT, O_DONE };
enum { A_OPEN, A_FIRST, A_AFTER, A_NEXT, A_DONE };
enum { ST_OK, ST_NO, ST_AGAIN };

typedef struct gframe {
    int32_t node;
    uint8_t phase, ws;
    uint16_t pos;
    int16_t lo, hi;
    int32_t count;
    uint64_t seen;
} gframe;

typedef struct gstate {
    int n;
    gframe f[MAX_STACK];
} gstate;

static bool push(const ember_grammar *g, gstate *s, int node) {
    if (s->n == MAX_STACK) return false;
    gframe *f = &s->f[s->n++];
    memset(f, 0, sizeof *f);
    f->node = node;
    if (g->nodes[node].kind == K_CHOICE) f->hi = (int16_t)g->nodes[node].n;
    return true;
}

static bool is_ws(unsigned char c) {
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

static int ws_step(gframe *f) {
    if (f->ws >= MAX_WS) return ST_NO;
    f->ws++;
    return ST_OK;
}

static int bnum_cost(const gnode *nd, const gframe *f);
static bool bnum_done(const gnode *nd, const gframe *f);

static bool frame_done(const ember_grammar *g, const gframe *f) {
    const gnode *nd = &g->nodes[f->node];
    switch (nd->kind) {
    case K_LIT: return f->pos == nd->len;
    case K_SEQ: return f->pos == nd->n;
    case K_CHOICE: return f->lo < f->hi && nd->klen[f->lo] == f->pos && nd->next[f->lo] < 0;
    case K_OBJ: return f->phase == O_DONE;
    case K_ARR: return f->phase == A_DONE;
    case K_STR: return f->phase == S_DONE;
    case K_TEXT: return f->lo == 0;
    case K_NUM:
        if (nd->bounded) return bnum_done(nd, f);
        return f->phase == N_ZERO || f->phase == N_INT || f->phase == N_FRAC || f->phase == N_EXP;
    default: return false;
    }
}

/* An object's key: starts matching at '"' when some property is left. */
static int obj_key_open(const ember_grammar *g, gstate *s, gframe *f) {
    const gnode *nd = &g->nodes[f->node];
    if (nd->free_obj) {
        f->phase = O_COLON;
        return push(g, s, g->str) ? ST_AGAIN : ST_NO;
    }
    uint64_t all = nd->n >= 64 ? ~0ull : ((1ull << nd->n) - 1);
    if ((f->seen & all) == all) return ST_NO;
    f->phase = O_KEY;
    f->pos = 0;
    f->lo = 0;
    f->hi = (int16_t)nd->n;
    return ST_OK;
}

static int step_obj(const ember_grammar *g, gstate *s, gframe *f, unsigned char c) {
    const gnode *nd = &g->nodes[f->node];
    bool ws = is_ws(c);
    switch (f->phase) {
    case O_OPEN:
        if (c != '{') return ST_NO;
        f->phase = O_FIRST;
        return ST_OK;
    case O_FIRST:
    case O_NEXT:
        if (ws) return ws_step(f);
        f->ws = 0;
        if (c == '"') return obj_key_open(g, s, f);
        if (c == '}' && f->phase == O_FIRST && (nd->required & ~f->seen) == 0) {
            f->phase = O_DONE;
            return ST_OK;
        }
        return ST_NO;
    case O_KEY: {
        if (c == '"') {
            if (f->lo < f->hi && nd->klen[f->lo] == f->pos && !(f->seen >> f->lo & 1)) {
                f->seen |= 1ull << f->lo;
                f->count = f->lo;
                f->phase = O_COLON;
                return ST_OK;
            }
            return ST_NO;
        }
        if (c == '\\' || c < 0x20) return ST_NO;
        int lo = -1, hi = -1;
        bool open = false;
        for (int k = f->lo; k < f->hi; k++)
            if (nd->klen[k] > f->pos && (unsigned char)nd->keys[k][f->pos] == c) {
                if (lo < 0) lo = k;
                hi = k + 1;
                if (!(f->seen >> k & 1)) open = true;
            }
        if (!open) return ST_NO;
        f->lo = (int16_t)lo;
        f->hi = (int16_t)hi;
        f->pos++;
        return ST_OK;
    }
    case O_COLON:
        if (ws) return ws_step(f);
        if (c != ':') return ST_NO;
        f->ws = 0;
        f->phase = O_VAL;
        return ST_OK;
    case O_VAL:
        if (ws) return ws_step(f);
        f->ws = 0;
        f->phase = O_AFTER;
        return push(g, s, nd->free_obj ? g->any : nd->kids[f->count]) ? ST_AGAIN : ST_NO;
    case O_AFTER:
        if (ws) return ws_step(f);
        f->ws = 0;
        if (c == ',') {
            uint64_t all = nd->n >= 64 ? ~0ull : ((1ull << nd->n) - 1);
            if (!nd->free_obj && (f->seen & all) == all) return ST_NO;
            f->phase = O_NEXT;
            return ST_OK;
        }
        if (c == '}' && (nd->required & ~f->seen) == 0) {
            f->phase = O_DONE;
            return ST_OK;
        }
        return ST_NO;
    default: return ST_NO;
    }
}

static int step_arr(const ember_grammar *g, gstate *s, gframe *f, unsigned char c) {
    const gnode *nd = &g->nodes[f->node];
    bool ws = is_ws(c);
    switch (f->phase) {
    case A_OPEN:
        if (c != '[') return ST_NO;
        f->phase = A_FIRST;
        return ST_OK;
    case A_FIRST:
    case A_NEXT:
        if (ws) return ws_step(f);
        f->ws = 0;
        if (c == ']' && f->phase == A_FIRST) {
            if (nd->lo > 0) return ST_NO;
            f->phase = A_DONE;
            return ST_OK;
        }
        if (nd->hi >= 0 && f->count >= nd->hi) return ST_NO;
        f->count++;
        f->phase = A_AFTER;
        return push(g, s, nd->item) ? ST_AGAIN : ST_NO;
    case A_AFTER:
        if (ws) return ws_step(f);
        f->ws = 0;
        if (c == ',' && (nd->hi < 0 || f->count < nd->hi)) {
            f->phase = A_NEXT;
            return ST_OK;
        }
        if (c == ']' && f->count >= nd->lo) {
            f->phase = A_DONE;
            return ST_OK;
        }
        return ST_NO;
    default: return ST_NO;
    }
}

/* A string with a pattern: printable ASCII without escapes, the pattern's
   position set in f->seen. */
static int step_pat(const gnode *nd, gframe *f, unsigned char c) {
    if (f->phase == S_OPEN) {
        if (c != '"') return ST_NO;
        f->phase = S_IN;
        f->seen = 1;
        return ST_OK;
    }
    if (f->phase != S_IN) return ST_NO;
    if (c == '"') {
        if (!ember_rx_accepts(nd->rx, f->seen)) return ST_NO;
        f->phase = S_DONE;
        return ST_OK;
    }
    uint64_t next = ember_rx_step(nd->rx, f->seen, c);
    if (!next) return ST_NO;
    f->seen = next;
    return ST_OK;
}

static int step_str(const gnode *nd, gframe *f, unsigned char c) {
    if (nd->rx) return step_pat(nd, f, c);
    switch (f->phase) {
    case S_OPEN:
        if (c != '"') return ST_NO;
        f->phase = S_IN;
        return ST_OK;
    case S_IN:
        if (f->lo > 0) { /* inside a UTF-8 sequence; hi: its lead byte until the first continuation */
            unsigned lo = 0x80, hi = 0xbf;
            if (f->hi == 0xe0) lo = 0xa0;      /* no overlong forms */
            else if (f->hi == 0xed) hi = 0x9f; /* no surrogates */
            else if (f->hi == 0xf0) lo = 0x90;
            else if (f->hi == 0xf4) hi = 0x8f; /* nothing beyond U+10FFFF */
            if (c < lo || c > hi) return ST_NO;
            f->lo--;
            f->hi = 0;
            return ST_OK;
        }
        if (c == '"') {
            if (f->count < nd->lo) return ST_NO;
            f->phase = S_DONE;
            return ST_OK;
        }
        if (nd->hi >= 0 && f->count >= nd->hi) return ST_NO;
        if (c == '\\') {
            f->phase = S_ESC;
        } else if (c < 0x20) {
            return ST_NO;
        } else if (c >= 0x80) {
            if (c >= 0xc2 && c <= 0xdf)
                f->lo = 1;
            else if (c >= 0xe0 && c <= 0xef)
                f->lo = 2;
            else if (c >= 0xf0 && c <= 0xf4)
                f->lo = 3;
            else
                return ST_NO;
            f->hi = c;
        }
        f->count++;
        return ST_OK;
    case S_ESC:
        if (c == 'u') {
            f->phase = S_HEX;
            f->pos = 4;
            return ST_OK;
        }
        if (!c || !strchr("\"\\/bfnrt", c)) return ST_NO;
        f->phase = S_IN;
        return ST_OK;
    case S_HEX:
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return ST_NO;
        if (--f->pos == 0) f->phase = S_IN;
        return ST_OK;
    default: return ST_NO;
    }
}

/* Whether a multiple of step lies in [a, b]. */
static bool has_multiple(int64_t a, int64_t b, int64_t step) {
    if (a > b) return false;
    int64_t q = b / step;
    if (b % step != 0 && b < 0) q--;
    return q * step >= a;
}

/* A bounded number's frame: sign in lo, digits before the point in pos
   (their value in seen), digits after it in hi (their value in count). */
static int bnum_cost_sign(const gnode *nd, const gframe *f, bool neg) {
    int64_t S = p10(nd->sd);
    int64_t A = neg ? -nd->uhi : nd->ulo, B = neg ? -nd->ulo : nd->uhi; /* the magnitudes allowed */
    if (A < 0) A = 0;
    if (B < A) return -1;
    int64_t m = (int64_t)f->seen;
    int kd = f->phase == N_START || f->phase == N_SIGN ? 0 : f->pos;
    if (f->phase == N_DOT || f->phase == N_FRAC) {
        int k = f->hi;
        int64_t unit = p10(nd->sd - k), lo = m * S + (int64_t)f->count * unit, hi = lo + unit - 1;
        for (int kf = k > 0 ? k : 1; kf <= nd->sd; kf++)
            if (has_multiple(lo > A ? lo : A, hi < B ? hi : B, p10(nd->sd - kf))) return kf - k;
        return -1;
    }
    int best = -1, jmax = f->phase == N_ZERO ? 0 : nd->maxd - kd;
    for (int j = kd == 0 ? 1 : 0; j <= jmax; j++) {
        int64_t ilo, ihi;
        if (f->phase == N_ZERO) {
            ilo = ihi = 0;
        } else if (kd == 0) {
            ilo = j == 1 ? 0 : p10(j - 1);
            ihi = p10(j) - 1;
        } else {
            ilo = m * p10(j);
            ihi = ilo + p10(j) - 1;
        }
        int64_t a = ilo * S > A ? ilo * S : A;
        int c = -1;
        if (has_multiple(a, ihi * S < B ? ihi * S : B, S)) c = j;
        for (int kf = 1; c < 0 && kf <= nd->sd; kf++)
            if (has_multiple(a, (ihi + 1) * S - 1 < B ? (ihi + 1) * S - 1 : B, p10(nd->sd - kf))) c = j + 1 + kf;
        if (c >= 0 && (best < 0 || c < best)) best = c;
    }
    return best;
}

/* Fewest characters that finish a bounded number from f within its range;
   -1 when none can. */
static int bnum_cost(const gnode *nd, const gframe *f) {
    if (f->phase != N_START) return bnum_cost_sign(nd, f, f->lo != 0);
    int a = bnum_cost_sign(nd, f, false), b = bnum_cost_sign(nd, f, true);
    if (b >= 0) b++;
    return a < 0 ? b : (b < 0 || a <= b) ? a : b;
}

/* Whether a bounded number may end here: bnum_cost(nd, f) == 0 without
   its search (a digit read, the value so far within the range). The walk
   asks this at every byte a number refuses, so it must be cheap. */
static bool bnum_done(const gnode *nd, const gframe *f) {
    if (f->phase != N_ZERO && f->phase != N_INT && f->phase != N_FRAC) return false;
    bool neg = f->lo != 0;
    int64_t A = neg ? -nd->uhi : nd->ulo, B = neg ? -nd->ulo : nd->uhi; /* the magnitudes allowed */
    if (A < 0) A = 0;
    int64_t v = (int64_t)f->seen * p10(nd->sd);
    if (f->phase == N_FRAC) v += (int64_t)f->count * p10(nd->sd - f->hi);
    return v >= A && v <= B;
}

static int step_bnum(const gnode *nd, gframe *f, unsigned char c) {
    gframe t = *f;
    bool digit = c >= '0' && c <= '9';
    int d = c - '0';
    switch (t.phase) {
    case N_START:
    case N_SIGN:
        if (c == '-' && t.phase == N_START) {
            t.lo = 1;
            t.phase = N_SIGN;
        } else if (digit) {
            t.phase = d == 0 ? N_ZERO : N_INT;
            t.pos = 1;
            t.seen = (uint64_t)d;
        } else {
            return ST_NO;
        }
        break;
    case N_ZERO:
    case N_INT:
        if (digit && t.phase == N_INT && t.pos < nd->maxd) {
            t.seen = t.seen * 10 + (uint64_t)d;
            t.pos++;
        } else if (c == '.' && nd->sd > 0) {
            t.phase = N_DOT;
        } else {
            return ST_NO;
        }
        break;
    case N_DOT:
    case N_FRAC:
        if (!digit || t.hi >= nd->sd) return ST_NO;
        t.count = t.count * 10 + d;
        t.hi++;
        t.phase = N_FRAC;
        break;
    default: return ST_NO;
    }
    if (bnum_cost(nd, &t) < 0) return ST_NO;
    *f = t;
    return ST_OK;
}

static int step_num(const gnode *nd, gframe *f, unsigned char c) {
    if (nd->bounded) return step_bnum(nd, f, c);
    bool digit = c >= '0' && c <= '9', e = (c == 'e' || c == 'E') && !nd->integer, dot = c == '.' && !nd->integer;
    int nx = -1;
    switch (f->phase) {
    case N_START: nx = c == '-' ? N_SIGN : c == '0' ? N_ZERO : digit ? N_INT : -1; break;
    case N_SIGN: nx = c == '0' ? N_ZERO : digit ? N_INT : -1; break;
    case N_ZERO: nx = dot ? N_DOT : e ? N_E : -1; break;
    case N_INT: nx = digit ? N_INT : dot ? N_DOT : e ? N_E : -1; break;
    case N_DOT: nx = digit ? N_FRAC : -1; break;
    case N_FRAC: nx = digit ? N_FRAC : e ? N_E : -1; break;
    case N_E: nx = digit ? N_EXP : (c == '+' || c == '-') ? N_ESIGN : -1; break;
    case N_ESIGN:
    case N_EXP: nx = digit ? N_EXP : -1; break;
    }
    if (nx < 0) return ST_NO;
    if (nx == N_EXP && ++f->hi > 2) return ST_NO; /* two exponent digits: the value stays finite */
    if (nx == N_INT && ++f->pos > MAX_INT_DIGITS) return ST_NO; /* integers stay exact in doubles and int64 */
    /* the last characters must be able to finish the number */
    if (f->count >= MAX_NUM - 1 && !(nx == N_ZERO || nx == N_INT || nx == N_FRAC || nx == N_EXP)) return ST_NO;
    if (f->count >= MAX_NUM) return ST_NO;
    f->phase = (uint8_t)nx;
    f->count++;
    return ST_OK;
}

/* Raw text (K_TEXT): valid UTF-8 without '<' or control characters but
   line breaks and tabs; lo: continuation bytes owed, hi: the lead byte. */
static int step_text(gframe *f, unsigned char c) {
    if (f->lo > 0) {
        unsigned lo = 0x80, hi = 0xbf;
        if (f->hi == 0xe0) lo = 0xa0;
        else if (f->hi == 0xed) hi = 0x9f;
        else if (f->hi == 0xf0) lo = 0x90;
        else if (f->hi == 0xf4) hi = 0x8f;
        if (c < lo || c > hi) return ST_NO;
        f->lo--;
        f->hi = 0;
        return ST_OK;
    }
    if (c == '<' || (c < 0x20 && c != '\n' && c != '\t')) return ST_NO;
    if (c >= 0x80) {
        if (c >= 0xc2 && c <= 0xdf) f->lo = 1;
        else if (c >= 0xe0 && c <= 0xef) f->lo = 2;
        else if (c >= 0xf0 && c <= 0xf4) f->lo = 3;
        else return ST_NO;
        f->hi = c;
    }
    f->count++;
    return ST_OK;
}

static int step(const ember_grammar *g, gstate *s, gframe *f, unsigned char c) {
    const gnode *nd = &g->nodes[f->node];
    switch (nd->kind) {
    case K_TEXT: return step_text(f, c);
    case K_LIT:
        if (f->pos < nd->len && (unsigned char)nd->text[f->pos] == c) {
            f->pos++;
            return ST_OK;
        }
        return ST_NO;
    case K_SEQ:
        if (f->pos >= nd->n) return ST_NO;
        f->pos++;
        return push(g, s, nd->kids[f->pos - 1]) ? ST_AGAIN : ST_NO;
    case K_CHOICE: {
        int lo = -1, hi = -1;
        for (int k = f->lo; k < f->hi; k++)
            if (nd->klen[k] > f->pos && (unsigned char)nd->keys[k][f->pos] == c) {
                if (lo < 0) lo = k;
                hi = k + 1;
            }
        if (lo < 0) return ST_NO;
        f->lo = (int16_t)lo;
        f->hi = (int16_t)hi;
        f->pos++;
        if (nd->klen[lo] == f->pos && nd->next[lo] >= 0) { /* the head is complete: its node follows */
            int next = nd->next[lo];
            memset(f, 0, sizeof *f);
            f->node = next;
            if (g->nodes[next].kind == K_CHOICE) f->hi = (int16_t)g->nodes[next].n;
        }
        return ST_OK;
    }
    case K_UNION:
        for (int i = 0; i < nd->n; i++)
            if (in_first(g->nodes[nd->kids[i]].first, c)) {
                int next = nd->kids[i];
                memset(f, 0, sizeof *f);
                f->node = next;
                if (g->nodes[next].kind == K_CHOICE) f->hi = (int16_t)g->nodes[next].n;
                return ST_AGAIN;
            }
        return ST_NO;
    case K_OBJ: return step_obj(g, s, f, c);
    case K_ARR: return step_arr(g, s, f, c);
    case K_STR: return step_str(nd, f, c);
    case K_NUM: return step_num(nd, f, c);
    }
    return ST_NO;
}

/* Feeds one byte to s in place; false when refused (s is then undefined). */
static bool feed(const ember_grammar *g, gstate *s, unsigned char c) {
    for (int guard = 0; guard < 4 * MAX_STACK + 8; guard++) {
        if (s->n == 0) return false;
        gframe *f = &s->f[s->n - 1];
        int r = step(g, s, f, c);
        if (r == ST_OK) return true;
        if (r == ST_AGAIN) continue;
        if (!frame_done(g, f)) return false;
        s->n--; /* complete: the byte is its parent's */
    }
    return false;
}

static bool complete(const ember_grammar *g, const gstate *s) {
    for (int i = 0; i < s->n; i++)
        if (!frame_done(g, &s->f[i])) return false;
    return true;
}

/* ---- lengths: the fewest bytes that finish a value, a frame, a state -------------------------------- */

static int sat_add(int a, int b) {
    return a + b > BIG_LEN ? BIG_LEN : a + b;
}

/* A property's fewest bytes: "key": and its value. */
static int prop_min(const ember_grammar *g, const gnode *nd, int k) {
    return sat_add((int)nd->klen[k] + 3, g->nodes[nd->kids[k]].minlen);
}

/* The fewest bytes of a node's value from its parts' current minlen. */
static int node_min(const ember_grammar *g, const gnode *nd) {
    int v = 0;
    switch (nd->kind) {
    case K_LIT: return (int)nd->len;
    case K_SEQ:
        for (int i = 0; i < nd->n; i++) v = sat_add(v, g->nodes[nd->kids[i]].minlen);
        return v;
    case K_CHOICE:
        v = BIG_LEN;
        for (int i = 0; i < nd->n; i++) {
            int c = sat_add((int)nd->klen[i], nd->next[i] >= 0 ? g->nodes[nd->next[i]].minlen : 0);
            if (c < v) v = c;
        }
        return v;
    case K_UNION:
        v = BIG_LEN;
        for (int i = 0; i < nd->n; i++)
            if (g->nodes[nd->kids[i]].minlen < v) v = g->nodes[nd->kids[i]].minlen;
        return v;
    case K_OBJ: {
        if (nd->free_obj) return 2;
        int r = 0;
        v = 2;
        for (int k = 0; k < nd->n; k++)
            if (nd->required >> k & 1) {
                v = sat_add(v, prop_min(g, nd, k));
                r++;
            }
        return sat_add(v, r > 0 ? r - 1 : 0);
    }
    case K_ARR:
        if (nd->lo <= 0) return 2;
        return sat_add(2, (int)((int64_t)nd->lo * (g->nodes[nd->item].minlen + 1) - 1 > BIG_LEN
                                    ? BIG_LEN
                                    : (int64_t)nd->lo * (g->nodes[nd->item].minlen + 1) - 1));
    case K_STR: return nd->rx ? 2 + ember_rx_dist(nd->rx, 1) : sat_add(2, nd->lo);
    case K_TEXT: return 0;
    case K_NUM: {
        if (!nd->bounded) return 1;
        gframe f;
        memset(&f, 0, sizeof f);
        int c = bnum_cost(nd, &f);
        return c < 0 ? BIG_LEN : c;
    }
    }
    return BIG_LEN;
}

/* Every node's minlen, to the fixed point (nodes may refer to later ones:
   any_value's union is made before its parts). */
static void compute_minlen(ember_grammar *g) {
    for (int i = 0; i < g->n; i++) g->nodes[i].minlen = BIG_LEN;
    for (bool changed = true; changed;) {
        changed = false;
        for (int i = 0; i < g->n; i++) {
            int v = node_min(g, &g->nodes[i]);
            if (v < g->nodes[i].minlen) {
                g->nodes[i].minlen = v;
                changed = true;
            }
        }
    }
}

/* The required properties not yet written: their bytes (each with the comma
   before it) and how many. */
static int req_rest(const ember_grammar *g, const gnode *nd, uint64_t seen, int skip) {
    int v = 0;
    for (int k = 0; k < nd->n; k++)
        if ((nd->required >> k & 1) && !(seen >> k & 1) && k != skip) v = sat_add(v, prop_min(g, nd, k) + 1);
    return v;
}

static int obj_rest(const ember_grammar *g, const gnode *nd, const gframe *f) {
    if (nd->free_obj) {
        static const int k_free[] = {[O_OPEN] = 2, [O_FIRST] = 1, [O_KEY] = 4, [O_COLON] = 3, [O_VAL] = 2,
                                     [O_AFTER] = 1, [O_NEXT] = 5, [O_DONE] = 0};
        return k_free[f->phase];
    }
    int rest = req_rest(g, nd, f->seen, -1);
    switch (f->phase) {
    case O_OPEN: return nd->minlen;
    case O_FIRST: return rest > 0 ? rest : 1; /* the first property has no comma: rest - 1 + 1 */
    case O_NEXT: {
        if (rest > 0) return rest; /* a property is due: the comma is written */
        int v = BIG_LEN;
        for (int k = 0; k < nd->n; k++)
            if (!(f->seen >> k & 1) && prop_min(g, nd, k) + 1 < v) v = prop_min(g, nd, k) + 1;
        return v;
    }
    case O_KEY: {
        int v = BIG_LEN;
        for (int k = f->lo; k < f->hi; k++) {
            if ((f->seen >> k & 1) || nd->klen[k] < f->pos) continue;
            int c = sat_add((int)(nd->klen[k] - f->pos) + 2, g->nodes[nd->kids[k]].minlen);
            c = sat_add(c, req_rest(g, nd, f->seen, k) + 1);
            if (c < v) v = c;
        }
        return v;
    }
    case O_COLON: return sat_add(1 + g->nodes[nd->kids[f->count]].minlen, rest + 1);
    case O_VAL: return sat_add(g->nodes[nd->kids[f->count]].minlen, rest + 1);
    case O_AFTER: return rest + 1;
    default: return 0;
    }
}

static int arr_rest(const ember_grammar *g, const gnode *nd, const gframe *f) {
    int64_t mi = g->nodes[nd->item].minlen, v;
    switch (f->phase) {
    case A_OPEN: return nd->minlen;
    case A_FIRST: v = nd->lo == 0 ? 1 : (int64_t)nd->lo * (mi + 1); break;
    case A_NEXT: {
        int64_t k = nd->lo - f->count > 1 ? nd->lo - f->count : 1;
        v = k * (mi + 1);
        break;
    }
    case A_AFTER: {
        int64_t k = nd->lo - f->count > 0 ? nd->lo - f->count : 0;
        v = k * (mi + 1) + 1;
        break;
    }
    default: return 0;
    }
    return v > BIG_LEN ? BIG_LEN : (int)v;
}

static int str_rest(const gnode *nd, const gframe *f) {
    if (f->phase == S_OPEN) return nd->minlen;
    if (f->phase == S_DONE) return 0;
    if (nd->rx) return ember_rx_dist(nd->rx, f->seen) + 1;
    int need = nd->lo - f->count > 0 ? nd->lo - f->count : 0;
    if (f->phase == S_IN) return f->lo + need + 1;
    if (f->phase == S_ESC) return need + 2;
    return f->pos + need + 1; /* S_HEX */
}

/* The fewest bytes that finish frame f once the frames above it are done. */
static int frame_rest(const ember_grammar *g, const gframe *f) {
    const gnode *nd = &g->nodes[f->node];
    int v = 0;
    switch (nd->kind) {
    case K_LIT: return (int)(nd->len - f->pos);
    case K_SEQ:
        for (int i = f->pos; i < nd->n; i++) v = sat_add(v, g->nodes[nd->kids[i]].minlen);
        return v;
    case K_CHOICE:
        v = BIG_LEN;
        for (int k = f->lo; k < f->hi; k++) {
            if (nd->klen[k] < f->pos) continue;
            int c = sat_add((int)(nd->klen[k] - f->pos), nd->next[k] >= 0 ? g->nodes[nd->next[k]].minlen : 0);
            if (c < v) v = c;
        }
        return v;
    case K_UNION: return nd->minlen;
    case K_OBJ: return obj_rest(g, nd, f);
    case K_ARR: return arr_rest(g, nd, f);
    case K_STR: return str_rest(nd, f);
    case K_TEXT: return f->lo;
    case K_NUM:
        if (nd->bounded) {
            int c = bnum_cost(nd, f);
            return c < 0 ? BIG_LEN : c;
        }
        return frame_done(g, f) ? 0 : 1;
    }
    return BIG_LEN;
}

/* The fewest bytes that finish the whole state. */
static int state_cost(const ember_grammar *g, const gstate *s) {
    int v = 0;
    for (int i = 0; i < s->n; i++) v = sat_add(v, frame_rest(g, &s->f[i]));
    return v;
}

/* ---- the vocabulary's tries ---------------------------------------------------------------------- */

/* A trie of byte strings in depth-first order: node i holds the byte into
   it, its depth (1 for a first byte), the node after its subtree, and the
   ids of the strings ending there (ends[tstart .. tstart + tcount)). */
typedef struct gtrie {
    int nn;
    uint8_t *byte;
    uint8_t *depth;
    int32_t *skip;
    int32_t *tstart;
    int32_t *tcount;
    int32_t *ends;
} gtrie;

/* What a token does inside a string, read from one of two string phases
   (in the text, or just after a backslash): the fast mask of a free string
   (see mask_string). */
enum { SC_NO, SC_STAY, SC_CLOSE };
#define N_SPH 2

#define CAP_LEVELS 16 /* maxLength room below which the staying ids come from a bitset per room */

typedef struct gstr {
    uint8_t *cps;   /* [n] code points the token adds before the closing quote (saturated at 255) */
    uint8_t *pend;  /* [n] SC_STAY: bytes the token leaves owed (a UTF-8 sequence, an escape) */
    uint64_t *stay; /* [nw] bits of the SC_STAY ids (copied into the mask as is) */
    uint64_t *cap;  /* [CAP_LEVELS * nw] level r: the SC_STAY ids of at most r code points */
    int cap_n[CAP_LEVELS]; /* ids in each level */
    int32_t *longer; /* SC_STAY ids of CAP_LEVELS code points or more, the most first */
    int n_longer;
    int32_t *owing;  /* SC_STAY ids that leave bytes owed (pend > 0) */
    int n_owing;
    int n_stay;
    int32_t *close0; /* ids that close the string with nothing after the quote */
    int n_close0;
    gtrie after;     /* the other closing ids, by the bytes after their quote */
} gstr;

struct ember_gvocab {
    int n;               /* ids */
    int nw;              /* 64-bit words of a mask over the ids (bit i: id i allowed) */
    bool avx512;         /* the CPU has AVX-512F: masks are written 16 logits per store */
    gtrie t;             /* every token's bytes */
    int32_t *end_ids;    /* ids that end the output */
    int n_end;
    char **tok;          /* [n] each id's bytes (NULL: never) */
    uint8_t *tlen;
    gstr str[N_SPH];     /* inside a string: S_IN, S_ESC */
    gstr qstr;           /* the tokens that begin with '"', by their bytes after it, read from S_IN */
    /* tokens that begin with white space (see mask_ws) */
    uint8_t *wsk;        /* [n] white-space bytes each token begins with */
    int32_t *pure_ws;    /* ids of white space only */
    int n_pure_ws;
    gtrie ws_rest;       /* the others, by their bytes after the white space */
};

static void trie_free(gtrie *t) {
    free(t->byte);
    free(t->depth);
    free(t->skip);
    free(t->tstart);
    free(t->tcount);
    free(t->ends);
}

void ember_gvocab_free(ember_gvocab *v) {
    if (!v) return;
    trie_free(&v->t);
    trie_free(&v->ws_rest);
    free(v->wsk);
    free(v->pure_ws);
    free(v->end_ids);
    for (int i = 0; v->tok && i < v->n; i++) free(v->tok[i]);
    free(v->tok);
    free(v->tlen);
    for (int k = 0; k <= N_SPH; k++) {
        gstr *st = k < N_SPH ? &v->str[k] : &v->qstr;
        free(st->cps);
        free(st->stay);
        free(st->pend);
        free(st->cap);
        free(st->longer);
        free(st->owing);
        free(st->close0);
        trie_free(&st->after);
    }
    free(v);
}

static void sort_strings(const char *const *b, const uint8_t *l, int32_t *ids, int n);

static inline void bs_set(uint64_t *b, int i) {
    b[i >> 6] |= 1ull << (i & 63);
}

static inline void bs_clear(uint64_t *b, int i) {
    b[i >> 6] &= ~(1ull << (i & 63));
}

static inline bool bs_get(const uint64_t *b, int i) {
    return b[i >> 6] >> (i & 63) & 1;
}

/* Builds t over the m strings b[ids[i]] (lengths l[], 1..MAX_TOKEN bytes);
   ids is sorted in place. 0, or -1 when out of memory. */
static int trie_build(gtrie *t, const char *const *b, const uint8_t *l, int32_t *ids, int m) {
    size_t total = 0;
    for (int i = 0; i < m; i++) total += l[ids[i]];
    sort_strings(b, l, ids, m);
    t->byte = ember_malloc(total + 1);
    t->depth = ember_malloc(total + 1);
    t->skip = ember_malloc((total + 1) * sizeof *t->skip);
    t->tstart = ember_malloc((total + 1) * sizeof *t->tstart);
    t->tcount = ember_calloc(total + 1, sizeof *t->tcount);
    t->ends = ember_malloc(((size_t)m + 1) * sizeof *t->ends);
    if (!t->byte || !t->depth || !t->skip || !t->tstart || !t->tcount || !t->ends) return -1;
    int32_t open[MAX_TOKEN + 1]; /* the node at each depth of the current path */
    int nn = 0, prev = -1, ne = 0;
    for (int i = 0; i < m; i++) {
        int id = ids[i];
        size_t len = l[id], lcp = 0;
        if (prev >= 0)
            while (lcp < len && lcp < l[prev] && b[prev][lcp] == b[id][lcp]) lcp++;
        if (prev >= 0) /* nodes deeper than the shared prefix are closed: their subtree ends here */
            for (size_t d = lcp + 1; d <= l[prev]; d++) t->skip[open[d]] = nn;
        for (size_t d = lcp + 1; d <= len; d++) {
            t->byte[nn] = (uint8_t)b[id][d - 1];
            t->depth[nn] = (uint8_t)d;
            t->tstart[nn] = ne;
            open[d] = nn++;
        }
        int at = open[len];
        if (t->tcount[at] == 0) t->tstart[at] = ne;
        t->ends[ne++] = id;
        t->tcount[at]++;
        prev = id;
    }
    if (prev >= 0)
        for (size_t d = 1; d <= l[prev]; d++) t->skip[open[d]] = nn;
    t->nn = nn;
    return 0;
}

/* Classifies every token read inside a free string from phase ph (S_IN or
   S_ESC) into s: the same steps as step_str, so the fast mask agrees with
   the walk byte for byte. quoted: only the tokens of two bytes or more that
   begin with '"', read from their second byte (a string being opened).
   0, or -1 when out of memory. */
static int str_classes(ember_gvocab *v, int ph, bool quoted, gstr *s) {
    size_t nw = (size_t)v->nw;
    s->cps = ember_calloc((size_t)v->n, 1);
    s->stay = ember_calloc(nw, sizeof *s->stay);
    s->pend = ember_calloc((size_t)v->n, 1);
    s->cap = ember_calloc(CAP_LEVELS * nw, sizeof *s->cap);
    s->longer = ember_malloc((size_t)v->n * sizeof *s->longer);
    s->owing = ember_malloc((size_t)v->n * sizeof *s->owing);
    s->close0 = ember_malloc((size_t)v->n * sizeof *s->close0);
    int32_t *ids = ember_malloc((size_t)v->n * sizeof *ids);
    const char **suf = ember_calloc((size_t)v->n, sizeof *suf);
    uint8_t *slen = ember_calloc((size_t)v->n, 1);
    int rc = -1, m = 0;
    if (!s->cps || !s->stay || !s->pend || !s->cap || !s->longer || !s->owing || !s->close0 || !ids || !suf || !slen)
        goto out;
    gnode free_str;
    memset(&free_str, 0, sizeof free_str);
    free_str.kind = K_STR;
    free_str.hi = -1;
    for (int id = 0; id < v->n; id++) {
        if (!v->tok[id]) continue;
        if (quoted && (v->tlen[id] < 2 || v->tok[id][0] != '"')) continue;
        gframe f;
        memset(&f, 0, sizeof f);
        f.phase = (uint8_t)ph;
        int q = -1, r = ST_OK;
        for (int i = quoted; i < v->tlen[id] && r == ST_OK && q < 0; i++) {
            r = step_str(&free_str, &f, (unsigned char)v->tok[id][i]);
            if (r == ST_OK && f.phase == S_DONE) q = i;
        }
        if (r != ST_OK) continue;
        s->cps[id] = (uint8_t)(f.count > 255 ? 255 : f.count);
        if (q < 0) { /* stays in the string */
            bs_set(s->stay, id);
            s->pend[id] = (uint8_t)(f.phase == S_ESC ? 1 : f.phase == S_HEX ? f.pos : f.lo);
            if (s->pend[id]) s->owing[s->n_owing++] = id;
            for (int r = s->cps[id]; r < CAP_LEVELS; r++) {
                bs_set(s->cap + (size_t)r * nw, id);
                s->cap_n[r]++;
            }
            s->n_stay++;
        } else if (q + 1 == v->tlen[id]) { /* closes it, nothing after the quote */
            s->close0[s->n_close0++] = id;
        } else { /* closes it, more bytes after the quote */
            suf[id] = v->tok[id] + q + 1;
            slen[id] = (uint8_t)(v->tlen[id] - q - 1);
            ids[m++] = id;
        }
    }
    int at[257] = {0}; /* the long staying ids, the most code points first (a counting sort) */
    for (int id = 0; id < v->n; id++)
        if (bs_get(s->stay, id) && s->cps[id] >= CAP_LEVELS) at[256 - s->cps[id]]++;
    for (int c = 1; c <= 256; c++) at[c] += at[c - 1];
    for (int id = 0; id < v->n; id++)
        if (bs_get(s->stay, id) && s->cps[id] >= CAP_LEVELS) s->longer[at[255 - s->cps[id]]++] = id;
    s->n_longer = at[255 - CAP_LEVELS + 1];
    rc = trie_build(&s->after, suf, slen, ids, m);
out:
    free(ids);
    free(suf);
    free(slen);
    return rc;
}

/* The white-space tables of mask_ws: each token's leading white space, the
   ids of white space only, a trie of the others' bytes after it. 0, or -1
   when out of memory. */
static int ws_tables(ember_gvocab *v) {
    v->wsk = ember_calloc((size_t)v->n, 1);
    v->pure_ws = ember_malloc((size_t)v->n * sizeof *v->pure_ws);
    int32_t *ids = ember_malloc((size_t)v->n * sizeof *ids);
    const char **rest = ember_calloc((size_t)v->n, sizeof *rest);
    uint8_t *rlen = ember_calloc((size_t)v->n, 1);
    int rc = -1, m = 0;
    if (v->wsk && v->pure_ws && ids && rest && rlen) {
        for (int id = 0; id < v->n; id++) {
            int k = 0;
            while (v->tok[id] && k < v->tlen[id] && is_ws((unsigned char)v->tok[id][k])) k++;
            if (k == 0) continue;
            v->wsk[id] = (uint8_t)k;
            if (k == v->tlen[id]) {
                v->pure_ws[v->n_pure_ws++] = id;
                continue;
            }
            rest[id] = v->tok[id] + k;
            rlen[id] = (uint8_t)(v->tlen[id] - k);
            ids[m++] = id;
        }
        rc = trie_build(&v->ws_rest, rest, rlen, ids, m);
    }
    free(ids);
    free(rest);
    free(rlen);
    return rc;
}

int ember_gvocab_new(int n, const char *const *bytes, const size_t *lens, const bool *end, ember_gvocab **out,
                     ember_error *err) {
    *out = NULL;
    if (n < 1) return ember_err(err, EMBER_ERR_INVALID_ARG, "an empty vocabulary");
    ember_gvocab *v = ember_calloc(1, sizeof *v);
    if (!v) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    v->n = n;
    v->nw = (n + 63) / 64;
    ember_cpu_features cf;
    ember_cpu_detect(&cf);
    v->avx512 = cf.avx512f && !getenv("EMBER_GRAMMAR_NO_AVX512"); /* the other path's A/B and test switch */
    v->tok = ember_calloc((size_t)n, sizeof *v->tok);
    v->tlen = ember_calloc((size_t)n, 1);
    v->end_ids = ember_malloc((size_t)n * sizeof *v->end_ids);
    int32_t *order = ember_malloc((size_t)n * sizeof *order);
    int m = 0;
    bool oom = !v->tok || !v->tlen || !v->end_ids || !order;
    for (int i = 0; i < n && !oom; i++) {
        if (end && end[i]) v->end_ids[v->n_end++] = i;
        if (!bytes[i] || lens[i] == 0 || lens[i] > MAX_TOKEN || (end && end[i])) continue;
        v->tok[i] = ember_malloc(lens[i]);
        if (!v->tok[i]) {
            oom = true;
            break;
        }
        memcpy(v->tok[i], bytes[i], lens[i]);
        v->tlen[i] = (uint8_t)lens[i];
        order[m++] = i;
    }
    if (!oom) oom = trie_build(&v->t, (const char *const *)v->tok, v->tlen, order, m) != 0;
    if (!oom)
        oom = str_classes(v, S_IN, false, &v->str[0]) != 0 || str_classes(v, S_ESC, false, &v->str[1]) != 0 ||
              str_classes(v, S_IN, true, &v->qstr) != 0;
    if (!oom) oom = ws_tables(v) != 0;
    free(order);
    if (oom) {
        ember_gvocab_free(v);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    }
    *out = v;
    return EMBER_OK;
}

/* Sorts ids by their strings (merge sort: no global comparator state). */
static void sort_strings(const char *const *b, const uint8_t *l, int32_t *ids, int n) {
    if (n < 2) return;
    int32_t *tmp = ember_malloc((size_t)n * sizeof *tmp);
    if (!tmp) { /* fall back to an in-place insertion sort */
        for (int i = 1; i < n; i++)
            for (int j = i; j > 0 && cmp_key(b[ids[j - 1]], l[ids[j - 1]], b[ids[j]], l[ids[j]]) > 0; j--) {
                int32_t t = ids[j];
                ids[j] = ids[j - 1];
                ids[j - 1] = t;
            }
        return;
    }
    for (int w = 1; w < n; w *= 2) {
        for (int lo = 0; lo < n; lo += 2 * w) {
            int mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n, i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                tmp[k++] = cmp_key(b[ids[i]], l[ids[i]], b[ids[j]], l[ids[j]]) <= 0 ? ids[i++] : ids[j++];
            while (i < mid) tmp[k++] = ids[i++];
            while (j < hi) tmp[k++] = ids[j++];
        }
        memcpy(ids, tmp, (size_t)n * sizeof *ids);
    }
    free(tmp);
}

/* ---- the matcher ---------------------------------------------------------------------------------- */

/* A GBNF state's mask without a budget, kept: the ids allowed (allow), and
   each one's cost after it (ids / cost, n of them, the greatest max_cost)
   for the budget's check. The same state comes back often (inside a
   string, a repetition), and its mask is then a copy. */
#define GB_MASKS 4
#define GB_WALK_STEPS 150000L /* closure steps of new transitions in a mask's walk, twice (~tens of ms) */
typedef struct gb_masked {
    int sid; /* -1: empty */
    unsigned gen;
    uint64_t used;
    int n, max_cost;
    uint64_t *allow; /* [nw] bits */
    int32_t *ids, *cost;
} gb_masked;

/* The bytes refused by one state, remembered by the trie walk per depth:
   the children of a node are tried from its state, and sibling nodes often
   have the same state (every letter of a [A-Z] class, every byte inside a
   string), so their children's refusals need not be fed again. */
#define MEMO_DEPTH 8 /* depths with a memo (near the root, where siblings are many) */
typedef struct wmemo {
    uint64_t gen;        /* the parent visit these refusals were last checked against */
    bool valid;
    gstate key;          /* the state they belong to */
    uint64_t refused[4]; /* bytes key refuses */
} wmemo;

struct ember_gmatch {
    const ember_grammar *g;
    const ember_gvocab *v;
    gb_cache *gc;  /* a GBNF grammar: its states; gsid the current one, glvl one per trie depth */
    int gsid;
    int32_t *glvl;
    gb_masked gm[GB_MASKS];
    uint64_t tick;
    gstate st;
    gstate *lvl;   /* [MAX_TOKEN + 1] the state at each trie depth */
    uint64_t *pgen; /* [MAX_TOKEN + 1] a number for each node the walk entered, per depth */
    uint64_t wgen;
    wmemo *memo;    /* [MEMO_DEPTH + 1] depth d: what lvl[d - 1] refuses */
    uint64_t *allow; /* [v->nw] bit i: id i allowed */
    uint64_t *scratch; /* [v->nw] */
};

int ember_gmatch_new(const ember_grammar *g, const ember_gvocab *v, ember_gmatch **out, ember_error *err) {
    *out = NULL;
    if (!g || !v || (g->root < 0 && !g->gb)) return ember_err(err, EMBER_ERR_INVALID_ARG, "a grammar without a root");
    ember_gmatch *m = ember_calloc(1, sizeof *m);
    if (!m) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    m->g = g;
    m->v = v;
    if (g->gb) {
        m->gc = gb_cache_new(g->gb);
        m->glvl = ember_malloc((MAX_TOKEN + 1) * sizeof *m->glvl);
        m->gsid = m->gc ? gb_cache_start(m->gc) : -1;
        for (int i = 0; i < GB_MASKS; i++) m->gm[i].sid = -1;
        m->allow = ember_malloc((size_t)v->nw * sizeof *m->allow);
        if (!m->glvl || m->gsid < 0 || !m->allow) {
            ember_gmatch_free(m);
            return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        }
        *out = m;
        return EMBER_OK;
    }
    m->lvl = ember_malloc((MAX_TOKEN + 1) * sizeof *m->lvl);
    m->pgen = ember_calloc(MAX_TOKEN + 1, sizeof *m->pgen);
    m->memo = ember_calloc(MEMO_DEPTH + 1, sizeof *m->memo);
    m->allow = ember_malloc((size_t)v->nw * sizeof *m->allow);
    m->scratch = ember_malloc((size_t)v->nw * sizeof *m->scratch);
    if (!m->lvl || !m->pgen || !m->memo || !m->allow || !m->scratch) {
        ember_gmatch_free(m);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    }
    push(g, &m->st, g->root);
    *out = m;
    return EMBER_OK;
}

void ember_gmatch_free(ember_gmatch *m) {
    if (!m) return;
    gb_cache_free(m->gc);
    free(m->glvl);
    for (int i = 0; i < GB_MASKS; i++) {
        free(m->gm[i].allow);
        free(m->gm[i].ids);
        free(m->gm[i].cost);
    }
    free(m->lvl);
    free(m->pgen);
    free(m->memo);
    free(m->allow);
    free(m->scratch);
    free(m);
}

static void copy_state(gstate *dst, const gstate *src) {
    dst->n = src->n;
    memcpy(dst->f, src->f, (size_t)src->n * sizeof *src->f);
}

bool ember_gmatch_complete(const ember_gmatch *m) {
    if (m->gc) return gb_cache_done(m->gc, m->gsid);
    return complete(m->g, &m->st);
}

int ember_gmatch_min_bytes(const ember_gmatch *m) {
    if (m->gc) return gb_cache_cost(m->gc, m->gsid);
    return state_cost(m->g, &m->st);
}

static int string_part(ember_gmatch *m, const gstate *st, const gstr *s, int left, uint64_t *stays);

/* Whether s's top frame is a free string in its text (where the string
   tables apply). */
static bool in_free_string(const ember_grammar *g, const gstate *s) {
    const gframe *f = &s->f[s->n - 1];
    const gnode *nd = &g->nodes[f->node];
    return nd->kind == K_STR && !nd->rx && f->phase == S_IN && f->lo == 0;
}

/* Allows, in m->allow, the ids of trie t that start's state takes, each
   only when cps is NULL or need <= cps[id] <= room, and (left < NO_LEFT)
   when the grammar can still finish in left - 2 tokens after it; no_ws:
   not the tokens that begin with white space. q (t the whole vocabulary's
   trie, or NULL): when '"' opens a free string from start, the tokens that
   begin with it and go on come from q's tables (see string_part), not the
   walk. Returns how many it allowed. */
static int walk(ember_gmatch *m, const gtrie *t, const gstate *start, const uint8_t *cps, int need, int room,
                int left, bool no_ws, const gstr *q) {
    gstate qst; /* the state after the '"' that opens a string, when q's tables are used */
    bool qhit = false;
    int allowed = 0;
    copy_state(&m->lvl[0], start);
    m->pgen[0] = ++m->wgen;
    for (int i = 0; i < t->nn;) {
        int d = t->depth[i];
        unsigned char b = t->byte[i];
        if (no_ws && d == 1 && is_ws(b)) {
            i = t->skip[i];
            continue;
        }
        wmemo *me = d <= MEMO_DEPTH ? &m->memo[d] : NULL;
        if (me && me->gen != m->pgen[d - 1]) { /* the first child of a node: is its state the remembered one? */
            const gstate *ps = &m->lvl[d - 1];
            if (!me->valid || me->key.n != ps->n || memcmp(me->key.f, ps->f, (size_t)ps->n * sizeof *ps->f)) {
                copy_state(&me->key, ps);
                memset(me->refused, 0, sizeof me->refused);
                me->valid = true;
            }
            me->gen = m->pgen[d - 1];
        }
        if (me && me->refused[b >> 6] >> (b & 63) & 1) {
            i = t->skip[i];
            continue;
        }
        copy_state(&m->lvl[d], &m->lvl[d - 1]);
        if (!feed(m->g, &m->lvl[d], b)) {
            if (me) me->refused[b >> 6] |= 1ull << (b & 63);
            i = t->skip[i];
            continue;
        }
        m->pgen[d] = ++m->wgen;
        if (t->tcount[i] && (left >= NO_LEFT || state_cost(m->g, &m->lvl[d]) <= left - 2))
            for (int k = 0; k < t->tcount[i]; k++) {
                int32_t id = t->ends[t->tstart[i] + k];
                if (cps && (cps[id] < need || cps[id] > room)) continue;
                bs_set(m->allow, id);
                allowed++;
            }
        if (q && d == 1 && b == '"' && in_free_string(m->g, &m->lvl[1])) { /* its subtree: q's tables */
            copy_state(&qst, &m->lvl[1]);
            qhit = true;
            i = t->skip[i];
            continue;
        }
        i++;
    }
    if (qhit) { /* the walk is over: lvl may be reused */
        allowed += string_part(m, &qst, q, left, m->scratch);
        for (int w = 0; w < m->v->nw; w++) m->allow[w] |= m->scratch[w];
    }
    return allowed;
}

/* allow: the staying tokens within room code points (a level's bitset
   below CAP_LEVELS; above, every staying token less the long ones past
   room). Returns how many. */
static int allow_room(uint64_t *restrict allow, const gstr *s, int nw, int room) {
    if (room < 0) {
        memset(allow, 0, (size_t)nw * sizeof *allow);
        return 0;
    }
    if (room < CAP_LEVELS) {
        memcpy(allow, s->cap + (size_t)room * (size_t)nw, (size_t)nw * sizeof *allow);
        return s->cap_n[room];
    }
    memcpy(allow, s->stay, (size_t)nw * sizeof *allow);
    int allowed = s->n_stay;
    for (int k = 0; k < s->n_longer && s->cps[s->longer[k]] > room; k++) {
        bs_clear(allow, s->longer[k]);
        allowed--;
    }
    return allowed;
}

/* allow: the staying tokens within room whose owed bytes, less the code
   points they add towards minLength (need), fit in slack. A token that
   owes nothing fits when slack >= 0, so only the owing ones are checked
   then; below 0 (the budget's last byte), a token that owes nothing must
   add at least -slack code points towards minLength (a level's bitset
   taken away), and the owing ones are checked. Returns how many. */
static int allow_tight(uint64_t *restrict allow, const gstr *s, int nw, int room, int slack, int need) {
    int allowed = 0, k = -slack; /* slack < 0: the code points a token that owes nothing must gain */
    if (slack < 0 && (need < k || room < k)) { /* no token gains enough */
        memset(allow, 0, (size_t)nw * sizeof *allow);
        return 0;
    }
    if (slack < 0 && k - 1 >= CAP_LEVELS) { /* beyond the levels (not met: the budget steers from slack -1) */
        for (int w = 0; w < nw; w++) {
            uint64_t keep = 0;
            for (uint64_t b = s->stay[w]; b; b &= b - 1) {
                int bit = __builtin_ctzll(b), id = w * 64 + bit;
                int gain = s->cps[id] < need ? s->cps[id] : need;
                if (s->cps[id] <= room && s->pend[id] - gain <= slack) {
                    keep |= 1ull << bit;
                    allowed++;
                }
            }
            allow[w] = keep;
        }
        return allowed;
    }
    allowed = allow_room(allow, s, nw, room);
    if (slack < 0) { /* those of fewer than k code points gain too little */
        const uint64_t *few = s->cap + (size_t)(k - 1) * (size_t)nw;
        for (int w = 0; w < nw; w++) allow[w] &= ~few[w];
        allowed -= s->cap_n[k - 1]; /* all within room: k - 1 < room */
    }
    for (int j = 0; j < s->n_owing; j++) {
        int id = s->owing[j], gain = s->cps[id] < need ? s->cps[id] : need;
        bool ok = s->cps[id] <= room && s->pend[id] - gain <= slack, was = bs_get(allow, id);
        if (ok && !was) {
            bs_set(allow, id);
            allowed++;
        } else if (!ok && was) {
            bs_clear(allow, id);
            allowed--;
        }
    }
    return allowed;
}

/* The tokens of s's tables read from st, whose top frame is a free string
   (no pattern) in its text (s = str[0], qstr) or after a backslash
   (str[1]): every token that stays in the string is allowed whatever
   surrounds it (a table made with the vocabulary; within maxLength's room;
   on a tight budget, those whose owed bytes fit), written to stays (all of
   it overwritten first); the tokens that close it are walked, by their
   bytes after the quote, from the state with the string finished, into
   m->allow. Returns the ids allowed. Gives exactly what walk gives. */
static int string_part(ember_gmatch *m, const gstate *st, const gstr *s, int left, uint64_t *stays) {
    const gframe *f = &st->f[st->n - 1];
    const gnode *nd = &m->g->nodes[f->node];
    int allowed = s->n_stay, need = nd->lo - f->count, cost = left < NO_LEFT ? state_cost(m->g, st) : 0;
    int room = nd->hi >= 0 ? nd->hi - f->count : 1 << 20; /* code points maxLength still allows */
    bool tight = left < NO_LEFT && cost + 8 > left - 2;
    if (tight || room < MAX_TOKEN + 2) {
        /* within room; on a tight budget, a staying token changes the cost
           by its owed bytes less the code points it adds towards minLength,
           less the byte st itself owes (after a backslash: the escape's
           letter, which the token writes) */
        int owed = f->phase == S_ESC ? 1 : 0;
        int slack = tight ? left - 2 - cost + owed : 1 << 20, nd_need = need > 0 ? need : 0;
        allowed = tight ? allow_tight(stays, s, m->v->nw, room, slack, nd_need) : allow_room(stays, s, m->v->nw, room);
    } else {
        memcpy(stays, s->stay, (size_t)m->v->nw * sizeof *stays);
    }
    gstate done; /* the string closed (popped at the next byte) */
    copy_state(&done, st);
    done.f[done.n - 1].phase = S_DONE;
    if (left >= NO_LEFT || state_cost(m->g, &done) <= left - 2)
        for (int k = 0; k < s->n_close0; k++)
            if (s->cps[s->close0[k]] >= need && s->cps[s->close0[k]] <= room) {
                bs_set(m->allow, s->close0[k]);
                allowed++;
            }
    return allowed + walk(m, &s->after, &done, s->cps, need, room, left, false, NULL);
}

/* The fast mask inside a free string (no pattern): string_part from the
   current state. Returns the ids allowed, or -1 when the state is not such
   a string. */
static int mask_string(ember_gmatch *m, int left) {
    const gframe *f = &m->st.f[m->st.n - 1];
    const gnode *nd = &m->g->nodes[f->node];
    if (nd->kind != K_STR || nd->rx) return -1;
    int ph = f->phase == S_IN && f->lo == 0 ? 0 : f->phase == S_ESC ? 1 : -1;
    if (ph < 0) return -1;
    return string_part(m, &m->st, &m->v->str[ph], left, m->allow);
}

/* The mask where white space goes to an object's or array's frame (between
   tokens of JSON): the trie walk skips the tokens that begin with white
   space, which would each be walked through their white space for nothing;
   those are allowed by tables instead: white space only when it fits in
   the run left (MAX_WS), the others by a walk of their bytes after the
   white space, from the state after one space (the white space changes
   nothing but the run's count). Elsewhere, the plain walk. Fills m->allow
   (cleared first); returns the ids allowed. Gives exactly what walk gives. */
static int mask_ws(ember_gmatch *m, int left) {
    const ember_gvocab *v = m->v;
    memset(m->allow, 0, (size_t)v->nw * sizeof *m->allow);
    gstate w, w2;
    copy_state(&w, &m->st);
    copy_state(&w2, &m->st);
    bool fast = feed(m->g, &w, ' ') && feed(m->g, &w2, '\n') && w.n == w2.n &&
                !memcmp(w.f, w2.f, (size_t)w.n * sizeof *w.f);
    if (fast) {
        const gnode *nd = &m->g->nodes[w.f[w.n - 1].node];
        fast = nd->kind == K_OBJ || nd->kind == K_ARR;
    }
    if (!fast) return walk(m, &v->t, &m->st, NULL, 0, 0, left, false, &v->qstr);
    int allowed = walk(m, &v->t, &m->st, NULL, 0, 0, left, true, &v->qstr);
    int room = MAX_WS - w.f[w.n - 1].ws + 1; /* white-space bytes a token may begin with */
    if (left >= NO_LEFT || state_cost(m->g, &w) <= left - 2)
        for (int k = 0; k < v->n_pure_ws; k++)
            if (v->wsk[v->pure_ws[k]] <= room) {
                bs_set(m->allow, v->pure_ws[k]);
                allowed++;
            }
    return allowed + walk(m, &v->ws_rest, &w, v->wsk, 0, room, left, false, NULL);
}

/* logits[i] = -inf where bit i of al is 0, for i in [0, n): a word of 64
   ids at a time, skipped where all are allowed (the common case inside a
   string). */
#if defined(HAVE_AVX512_MASK)
/* Sixteen logits per masked store (AVX-512F; the caller checked the CPU). */
__attribute__((target("avx512f"))) static void apply_mask_avx512(float *restrict lg, const uint64_t *restrict al,
                                                                  int n) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 64 <= n; i += 64) {
        uint64_t r = ~al[i >> 6];
        if (!r) continue;
        _mm512_mask_storeu_ps(lg + i, (__mmask16)r, ninf);
        _mm512_mask_storeu_ps(lg + i + 16, (__mmask16)(r >> 16), ninf);
        _mm512_mask_storeu_ps(lg + i + 32, (__mmask16)(r >> 32), ninf);
        _mm512_mask_storeu_ps(lg + i + 48, (__mmask16)(r >> 48), ninf);
    }
    for (; i < n; i++)
        if (!bs_get(al, i)) lg[i] = -INFINITY;
}
#endif

static void apply_mask(float *restrict lg, const uint64_t *restrict al, int n, bool avx512) {
#if defined(HAVE_AVX512_MASK)
    if (avx512) {
        apply_mask_avx512(lg, al, n);
        return;
    }
#else
    (void)avx512;
#endif
    int i = 0;
    for (; i + 64 <= n; i += 64) {
        uint64_t w = al[i >> 6];
        if (w == ~0ull) continue;
        if (w == 0) {
            for (int k = 0; k < 64; k++) lg[i + k] = -INFINITY;
            continue;
        }
#if defined(__SSE2__)
        /* four logits per nibble: lanes of all ones where allowed, then a select */
        const __m128 ninf = _mm_set1_ps(-INFINITY);
        for (int q = 0; q < 64; q += 4) {
            unsigned nib = (unsigned)(w >> q) & 15u;
            if (nib == 15u) continue;
            __m128i keep = _mm_set_epi32(-(int)(nib >> 3 & 1), -(int)(nib >> 2 & 1), -(int)(nib >> 1 & 1), -(int)(nib & 1));
            __m128 x = _mm_loadu_ps(lg + i + q), k = _mm_castsi128_ps(keep);
            _mm_storeu_ps(lg + i + q, _mm_or_ps(_mm_and_ps(k, x), _mm_andnot_ps(k, ninf)));
        }
#else
        for (uint64_t r = ~w; r; r &= r - 1) lg[i + __builtin_ctzll(r)] = -INFINITY;
#endif
    }
    for (; i < n; i++)
        if (!bs_get(al, i)) lg[i] = -INFINITY;
}

/* The trie walk of a GBNF grammar from the current state: each depth's
   state an id of the matcher's cache, each byte a transition looked up (or
   made once). Fills e with every id allowed and its cost after it. */
static void gb_walk(ember_gmatch *m, gb_masked *e) {
    const gtrie *t = &m->v->t;
    gb_cache *c = m->gc;
    memset(e->allow, 0, (size_t)m->v->nw * sizeof *e->allow);
    e->n = 0;
    e->max_cost = 0;
    m->glvl[0] = m->gsid;
    /* every byte from the state first (single bytes keep the output able to
       finish), then the rest of the walk, each under GB_WALK_STEPS */
    gb_cache_set_budget(c, GB_WALK_STEPS);
    for (int b = 0; b < 256; b++) gb_cache_next(c, m->gsid, (unsigned char)b);
    gb_cache_set_budget(c, GB_WALK_STEPS);
    for (int i = 0; i < t->nn;) {
        int d = t->depth[i];
        int s = gb_cache_next(c, m->glvl[d - 1], t->byte[i]);
        if (s < 0) {
            i = t->skip[i];
            continue;
        }
        m->glvl[d] = s;
        if (t->tcount[i]) {
            int cost = gb_cache_cost(c, s);
            if (cost > e->max_cost) e->max_cost = cost;
            for (int k = 0; k < t->tcount[i]; k++) {
                int32_t id = t->ends[t->tstart[i] + k];
                bs_set(e->allow, id);
                e->ids[e->n] = id;
                e->cost[e->n++] = cost;
            }
        }
        i++;
    }
    gb_cache_set_budget(c, -1);
}

/* The kept mask of the current state, walked when it is not there (the
   least recently used slot is reused); NULL when out of memory. */
static gb_masked *gb_masked_get(ember_gmatch *m) {
    unsigned gen = gb_cache_generation(m->gc);
    gb_masked *e = NULL;
    for (int i = 0; i < GB_MASKS; i++)
        if (m->gm[i].sid == m->gsid && m->gm[i].gen == gen) e = &m->gm[i];
    if (!e) {
        e = &m->gm[0];
        for (int i = 1; i < GB_MASKS; i++)
            if (m->gm[i].sid < 0 || (e->sid >= 0 && m->gm[i].used < e->used)) e = &m->gm[i];
        if (!e->allow) {
            e->allow = ember_malloc((size_t)m->v->nw * sizeof *e->allow);
            e->ids = ember_malloc((size_t)m->v->n * sizeof *e->ids);
            e->cost = ember_malloc((size_t)m->v->n * sizeof *e->cost);
            if (!e->allow || !e->ids || !e->cost) return NULL;
        }
        e->sid = -1;
        gb_walk(m, e);
        e->sid = m->gsid;
        e->gen = gen;
    }
    e->used = ++m->tick;
    return e;
}

/* The end of a mask: with end_ok the end ids join m->allow (counted in
   allowed); logits outside it, and past the vocabulary, become -inf.
   Returns the tokens allowed. */
static int mask_finish(ember_gmatch *m, float *logits, int n, int allowed, bool end_ok) {
    const ember_gvocab *v = m->v;
    if (end_ok)
        for (int k = 0; k < v->n_end; k++) {
            allowed += !bs_get(m->allow, v->end_ids[k]);
            bs_set(m->allow, v->end_ids[k]);
        }
    apply_mask(logits, m->allow, n < v->n ? n : v->n, v->avx512);
    for (int i = v->n; i < n; i++) logits[i] = -INFINITY;
    return allowed;
}

/* ember_gmatch_mask_left for a GBNF grammar. */
static int gb_mask(ember_gmatch *m, float *logits, int n, int left) {
    const ember_gvocab *v = m->v;
    int sid = gb_cache_trim(m->gc, m->gsid);
    gb_masked *e = NULL;
    if (sid >= 0) {
        m->gsid = sid;
        e = gb_masked_get(m);
    }
    int allowed = 0;
    if (!e) { /* out of memory: only the end */
        memset(m->allow, 0, (size_t)v->nw * sizeof *m->allow);
    } else {
        if (left < 1) left = 1;
        if (left < NO_LEFT && gb_cache_cost(m->gc, m->gsid) > left - 1) left = NO_LEFT; /* too late to steer */
        if (left >= NO_LEFT || e->max_cost <= left - 2) {
            memcpy(m->allow, e->allow, (size_t)v->nw * sizeof *m->allow);
            allowed = e->n;
        } else {
            memset(m->allow, 0, (size_t)v->nw * sizeof *m->allow);
            for (int k = 0; k < e->n; k++)
                if (e->cost[k] <= left - 2) {
                    bs_set(m->allow, e->ids[k]);
                    allowed++;
                }
        }
    }
    return mask_finish(m, logits, n, allowed, allowed == 0 || (e && gb_cache_done(m->gc, m->gsid)));
}

int ember_gmatch_mask_left(ember_gmatch *m, float *logits, int n, int left) {
    if (m->gc) return gb_mask(m, logits, n, left);
    if (left < 1) left = 1;
    if (left < NO_LEFT && state_cost(m->g, &m->st) > left - 1) left = NO_LEFT; /* too late to steer: no budget */
    int allowed = m->st.n > 0 ? mask_string(m, left) : -1;
    if (allowed < 0) allowed = mask_ws(m, left);
    return mask_finish(m, logits, n, allowed, allowed == 0 || complete(m->g, &m->st));
}

int ember_gmatch_mask(ember_gmatch *m, float *logits, int n) {
    return ember_gmatch_mask_left(m, logits, n, NO_LEFT);
}

bool ember_gmatch_feed(ember_gmatch *m, const char *s, size_t n) {
    if (m->gc) {
        int sid = gb_cache_trim(m->gc, m->gsid);
        if (sid < 0) return false;
        m->gsid = sid;
        for (size_t i = 0; i < n && sid >= 0; i++) sid = gb_cache_next(m->gc, sid, (unsigned char)s[i]);
        if (sid < 0) return false;
        m->gsid = sid;
        return true;
    }
    gstate t;
    copy_state(&t, &m->st);
    for (size_t i = 0; i < n; i++)
        if (!feed(m->g, &t, (unsigned char)s[i])) return false;
    copy_state(&m->st, &t);
    return true;
}

bool ember_gmatch_accept(ember_gmatch *m, int32_t token) {
    const ember_gvocab *v = m->v;
    if (token < 0 || token >= v->n) return false;
    for (int k = 0; k < v->n_end; k++)
        if (v->end_ids[k] == token) return true; /* the end: nothing to match */
    if (!v->tok[token]) return false;
    return ember_gmatch_feed(m, v->tok[token], v->tlen[token]);
}
