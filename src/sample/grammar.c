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

#define MAX_STACK 32   /* frames: nesting of values */
#define MAX_TOKEN 128  /* bytes of a token the trie holds (longer ones are never allowed) */
#define MAX_PROPS 64   /* properties of one object */
#define MAX_ENUM 256   /* values of one enum */
#define MAX_WS 16      /* white-space characters in a row */
#define MAX_NUM 24     /* characters of a number */
#define MAX_INT_DIGITS 15 /* digits before a number's point */
#define MAX_SCHEMA_DEPTH 24

enum { K_LIT, K_SEQ, K_CHOICE, K_OBJ, K_ARR, K_STR, K_NUM, K_UNION };

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
    uint8_t first[32];  /* bytes the node can begin with */
} gnode;

struct ember_grammar {
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

int ember_grammar_set_root(ember_grammar *g, int node, ember_error *err) {
    if (node < 0 || node >= g->n) return ember_err(err, EMBER_ERR_INVALID_ARG, "a bad root node");
    g->root = node;
    return 0;
}

/* ---- JSON schema ------------------------------------------------------------------------------- */

static const char *const k_annotations[] = {"title", "description", "default", "examples", "$schema", "$id",
                                            "$comment", "deprecated", "readOnly", "writeOnly", "strict", NULL};
static const char *const k_handled[] = {"type", "properties", "required", "additionalProperties", "items", "minItems",
                                        "maxItems", "enum", "const", "minLength", "maxLength", "anyOf", "oneOf",
                                        "$ref", "$defs", "definitions", NULL};

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
        return make_str(g, lo < 0 ? 0 : lo, hi, err);
    }
    if (!strcmp(t, "number") || !strcmp(t, "integer")) return make_num(g, t[0] == 'i', err);
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

static bool frame_done(const ember_grammar *g, const gframe *f) {
    const gnode *nd = &g->nodes[f->node];
    switch (nd->kind) {
    case K_LIT: return f->pos == nd->len;
    case K_SEQ: return f->pos == nd->n;
    case K_CHOICE: return f->lo < f->hi && nd->klen[f->lo] == f->pos && nd->next[f->lo] < 0;
    case K_OBJ: return f->phase == O_DONE;
    case K_ARR: return f->phase == A_DONE;
    case K_STR: return f->phase == S_DONE;
    case K_NUM: return f->phase == N_ZERO || f->phase == N_INT || f->phase == N_FRAC || f->phase == N_EXP;
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

static int step_str(const gnode *nd, gframe *f, unsigned char c) {
    switch (f->phase) {
    case S_OPEN:
        if (c != '"') return ST_NO;
        f->phase = S_IN;
        return ST_OK;
    case S_IN:
        if (f->lo > 0) { /* inside a UTF-8 sequence */
            if (c < 0x80 || c > 0xbf) return ST_NO;
            f->lo--;
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

static int step_num(const gnode *nd, gframe *f, unsigned char c) {
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
    if (nx == N_INT && ++f->pos > MAX_INT_DIGITS) return ST_NO; /* integers stay exact in doubles and int64 */
    /* the last characters must be able to finish the number */
    if (f->count >= MAX_NUM - 1 && !(nx == N_ZERO || nx == N_INT || nx == N_FRAC || nx == N_EXP)) return ST_NO;
    if (f->count >= MAX_NUM) return ST_NO;
    f->phase = (uint8_t)nx;
    f->count++;
    return ST_OK;
}

static int step(const ember_grammar *g, gstate *s, gframe *f, unsigned char c) {
    const gnode *nd = &g->nodes[f->node];
    switch (nd->kind) {
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

/* ---- the vocabulary's trie ------------------------------------------------------------------------ */

struct ember_gvocab {
    int n;               /* ids */
    int nn;              /* trie nodes, in depth-first order */
    uint8_t *byte;       /* [nn] the byte into the node */
    uint8_t *depth;      /* [nn] 1 for a first byte */
    int32_t *skip;       /* [nn] the node after this one's subtree */
    int32_t *tstart;     /* [nn] tokens ending here: ends[tstart .. tstart + tcount) */
    int32_t *tcount;
    int32_t *ends;       /* token ids */
    int32_t *end_ids;    /* ids that end the output */
    int n_end;
    char **tok;          /* [n] each id's bytes (NULL: never) */
    uint8_t *tlen;
};

void ember_gvocab_free(ember_gvocab *v) {
    if (!v) return;
    free(v->byte);
    free(v->depth);
    free(v->skip);
    free(v->tstart);
    free(v->tcount);
    free(v->ends);
    free(v->end_ids);
    for (int i = 0; v->tok && i < v->n; i++) free(v->tok[i]);
    free(v->tok);
    free(v->tlen);
    free(v);
}

static void isort_tokens(const ember_gvocab *v, int32_t *ids, int n);

int ember_gvocab_new(int n, const char *const *bytes, const size_t *lens, const bool *end, ember_gvocab **out,
                     ember_error *err) {
    *out = NULL;
    if (n < 1) return ember_err(err, EMBER_ERR_INVALID_ARG, "an empty vocabulary");
    ember_gvocab *v = ember_calloc(1, sizeof *v);
    if (!v) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    v->n = n;
    v->tok = ember_calloc((size_t)n, sizeof *v->tok);
    v->tlen = ember_calloc((size_t)n, 1);
    v->end_ids = ember_malloc((size_t)n * sizeof *v->end_ids);
    int32_t *order = ember_malloc((size_t)n * sizeof *order);
    size_t total = 0;
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
        total += lens[i];
    }
    if (!oom) {
        isort_tokens(v, order, m);
        v->byte = ember_malloc(total + 1);
        v->depth = ember_malloc(total + 1);
        v->skip = ember_malloc((total + 1) * sizeof *v->skip);
        v->tstart = ember_malloc((total + 1) * sizeof *v->tstart);
        v->tcount = ember_calloc(total + 1, sizeof *v->tcount);
        v->ends = ember_malloc(((size_t)m + 1) * sizeof *v->ends);
        oom = !v->byte || !v->depth || !v->skip || !v->tstart || !v->tcount || !v->ends;
    }
    if (oom) {
        free(order);
        ember_gvocab_free(v);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    }
    int32_t open[MAX_TOKEN + 1]; /* the node at each depth of the current path */
    int nn = 0, prev = -1, ne = 0;
    for (int t = 0; t < m; t++) {
        int id = order[t];
        size_t l = v->tlen[id], lcp = 0;
        if (prev >= 0)
            while (lcp < l && lcp < v->tlen[prev] && v->tok[prev][lcp] == v->tok[id][lcp]) lcp++;
        if (prev >= 0) /* nodes deeper than the shared prefix are closed: their subtree ends here */
            for (size_t d = lcp + 1; d <= v->tlen[prev]; d++) v->skip[open[d]] = nn;
        for (size_t d = lcp + 1; d <= l; d++) {
            v->byte[nn] = (uint8_t)v->tok[id][d - 1];
            v->depth[nn] = (uint8_t)d;
            v->tstart[nn] = ne;
            open[d] = nn++;
        }
        int at = open[l];
        if (v->tcount[at] == 0) v->tstart[at] = ne;
        v->ends[ne++] = id;
        v->tcount[at]++;
        prev = id;
    }
    if (prev >= 0)
        for (size_t d = 1; d <= v->tlen[prev]; d++) v->skip[open[d]] = nn;
    v->nn = nn;
    free(order);
    *out = v;
    return EMBER_OK;
}

/* Sorts ids by their bytes (merge sort: no global comparator state). */
static void isort_tokens(const ember_gvocab *v, int32_t *ids, int n) {
    if (n < 2) return;
    int32_t *tmp = ember_malloc((size_t)n * sizeof *tmp);
    if (!tmp) { /* fall back to an in-place insertion sort */
        for (int i = 1; i < n; i++)
            for (int j = i; j > 0 && cmp_key(v->tok[ids[j - 1]], v->tlen[ids[j - 1]], v->tok[ids[j]], v->tlen[ids[j]]) > 0;
                 j--) {
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
                tmp[k++] = cmp_key(v->tok[ids[i]], v->tlen[ids[i]], v->tok[ids[j]], v->tlen[ids[j]]) <= 0 ? ids[i++]
                                                                                                        : ids[j++];
            while (i < mid) tmp[k++] = ids[i++];
            while (j < hi) tmp[k++] = ids[j++];
        }
        memcpy(ids, tmp, (size_t)n * sizeof *ids);
    }
    free(tmp);
}

/* ---- the matcher ---------------------------------------------------------------------------------- */

struct ember_gmatch {
    const ember_grammar *g;
    const ember_gvocab *v;
    gstate st;
    gstate *lvl;   /* [MAX_TOKEN + 1] the state at each trie depth */
    uint8_t *allow; /* [v->n] */
};

int ember_gmatch_new(const ember_grammar *g, const ember_gvocab *v, ember_gmatch **out, ember_error *err) {
    *out = NULL;
    if (!g || !v || g->root < 0) return ember_err(err, EMBER_ERR_INVALID_ARG, "a grammar without a root");
    ember_gmatch *m = ember_calloc(1, sizeof *m);
    if (!m) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    m->g = g;
    m->v = v;
    m->lvl = ember_malloc((MAX_TOKEN + 1) * sizeof *m->lvl);
    m->allow = ember_malloc((size_t)v->n);
    if (!m->lvl || !m->allow) {
        ember_gmatch_free(m);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    }
    push(g, &m->st, g->root);
    *out = m;
    return EMBER_OK;
}

void ember_gmatch_free(ember_gmatch *m) {
    if (!m) return;
    free(m->lvl);
    free(m->allow);
    free(m);
}

static void copy_state(gstate *dst, const gstate *src) {
    dst->n = src->n;
    memcpy(dst->f, src->f, (size_t)src->n * sizeof *src->f);
}

bool ember_gmatch_complete(const ember_gmatch *m) {
    return complete(m->g, &m->st);
}

int ember_gmatch_mask(ember_gmatch *m, float *logits, int n) {
    const ember_gvocab *v = m->v;
    memset(m->allow, 0, (size_t)v->n);
    int allowed = 0;
    copy_state(&m->lvl[0], &m->st);
    for (int i = 0; i < v->nn;) {
        int d = v->depth[i];
        copy_state(&m->lvl[d], &m->lvl[d - 1]);
        if (!feed(m->g, &m->lvl[d], v->byte[i])) {
            i = v->skip[i];
            continue;
        }
        for (int k = 0; k < v->tcount[i]; k++) m->allow[v->ends[v->tstart[i] + k]] = 1;
        allowed += v->tcount[i];
        i++;
    }
    if (allowed == 0 || complete(m->g, &m->st))
        for (int k = 0; k < v->n_end; k++) {
            allowed += !m->allow[v->end_ids[k]];
            m->allow[v->end_ids[k]] = 1;
        }
    for (int i = 0; i < n; i++)
        if (i >= v->n || !m->allow[i]) logits[i] = -INFINITY;
    return allowed;
}

bool ember_gmatch_feed(ember_gmatch *m, const char *s, size_t n) {
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
