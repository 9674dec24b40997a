/* gemma_grammar.c - an enforced tool call in Gemma 4's format as a GBNF
 * grammar (serve_int.h: gemma_call_gbnf).
 *
 * Gemma 4 writes a call as <|tool_call>call:NAME{key:value,...}<tool_call|>
 * with its own value syntax (the parser in src/template/toolcall.c reads it
 * back as JSON): objects with bare keys (or keys quoted as strings), arrays,
 * strings between <|"|> quotes (raw text inside), numbers, true, false,
 * null. That is not JSON, so the JSON-schema grammar of the other formats
 * does not apply; instead each tool's parameters schema is written out as
 * GBNF rules of Gemma's syntax, compiled by the GBNF engine (gbnf.c) like
 * any grammar. One rule per schema node; $ref targets once each.
 *
 * Properties are written in the schema's order, each required one always,
 * each optional one at most once (two rules per position: before anything
 * was written, and after, which owns the comma). Strings are raw text
 * without '<' or control characters but line breaks and tabs.
 *
 * What is not enforced here (a 400 naming it, as elsewhere): pattern,
 * numeric bounds, lengths or counts over 1,000, and every keyword the JSON
 * schema path refuses (that check runs first, in server.c).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "serve_int.h"

#define GQ "\"<|\\\"|>\"" /* the GBNF literal of Gemma's string quote <|"|> */
#define MAX_REFS 64

typedef struct gg {
    char *s;
    size_t n, cap;
    bool oom;
    int rules; /* rules named so far: n0, n1, ... */
    const json_t *ref_sch[MAX_REFS];
    int ref_rule[MAX_REFS];
    int n_ref;
    bool any_made;
    char *why;
    size_t why_len;
    bool failed;
} gg;

static void put(gg *g, const char *fmt, ...) EMBER_PRINTF(2, 3);
static void put(gg *g, const char *fmt, ...) {
    va_list ap;
    for (int pass = 0; pass < 2 && !g->oom; pass++) {
        va_start(ap, fmt);
        int k = vsnprintf(g->s ? g->s + g->n : NULL, g->s ? g->cap - g->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            g->oom = true;
            return;
        }
        if (g->s && g->n + (size_t)k < g->cap) {
            g->n += (size_t)k;
            return;
        }
        size_t cap = g->cap ? g->cap : 1024;
        while (cap <= g->n + (size_t)k) cap *= 2;
        char *ns = ember_realloc(g->s, cap);
        if (!ns) {
            g->oom = true;
            return;
        }
        g->s = ns;
        g->cap = cap;
    }
}

static int gfail(gg *g, const char *fmt, ...) EMBER_PRINTF(2, 3);
static int gfail(gg *g, const char *fmt, ...) {
    if (!g->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(g->why, g->why_len, fmt, ap);
        va_end(ap);
    }
    g->failed = true;
    return -1;
}

/* A GBNF string literal of text[0..len) (escaped). */
static void put_lit(gg *g, const char *text, size_t len) {
    put(g, "\"");
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c == '"' || c == '\\') put(g, "\\%c", c);
        else if (c < 0x20) put(g, "\\x%02x", c);
        else put(g, "%c", c);
    }
    put(g, "\"");
}

static bool bare_key(const char *k) {
    if (!*k) return false;
    for (; *k; k++)
        if (!((*k >= 'a' && *k <= 'z') || (*k >= 'A' && *k <= 'Z') || (*k >= '0' && *k <= '9') || *k == '_' ||
              *k == '-' || *k == '.'))
            return false;
    return true;
}

/* The rules any Gemma value needs (an object without properties, items
   without a schema); made once. */
static void any_rules(gg *g) {
    if (g->any_made) return;
    g->any_made = true;
    put(g, "gval ::= gobj | garr | gstr | gnum | \"true\" | \"false\" | \"null\"\n"
           "gobj ::= \"{\" ( gkey \":\" gval ( \",\" gkey \":\" gval )* )? \"}\"\n"
           "garr ::= \"[\" ( gval ( \",\" gval )* )? \"]\"\n"
           "gkey ::= [a-zA-Z_] [a-zA-Z0-9_]{0,63}\n"
           "gstr ::= " GQ " [^<\\x00-\\x08\\x0b-\\x1f]* " GQ "\n"
           "gnum ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,14} ) ( \".\" [0-9]{1,6} )?\n");
}

/* A literal value (enum / const) in Gemma's syntax, as GBNF literals. */
static int put_value(gg *g, const json_t *v, int depth) {
    if (depth > 16) return gfail(g, "an enum value nests too deep");
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (strstr(s, "<|\"|>")) return gfail(g, "an enum string holds Gemma's quote <|\"|>");
        put(g, " %s ", GQ);
        put_lit(g, s, json_string_length(v));
        put(g, " %s ", GQ);
        return 0;
    }
    if (json_is_object(v)) {
        const char *k;
        const json_t *x;
        bool first = true;
        put(g, " \"{\" ");
        json_object_foreach((json_t *)v, k, x) {
            if (!first) put(g, " \",\" ");
            first = false;
            if (bare_key(k)) {
                put_lit(g, k, strlen(k));
            } else {
                put(g, " %s ", GQ);
                put_lit(g, k, strlen(k));
                put(g, " %s ", GQ);
            }
            put(g, " \":\" ");
            if (put_value(g, x, depth + 1)) return -1;
        }
        put(g, " \"}\" ");
        return 0;
    }
    if (json_is_array(v)) {
        size_t i;
        const json_t *x;
        put(g, " \"[\" ");
        json_array_foreach(v, i, x) {
            if (i) put(g, " \",\" ");
            if (put_value(g, x, depth + 1)) return -1;
        }
        put(g, " \"]\" ");
        return 0;
    }
    char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!t) {
        g->oom = true;
        return -1;
    }
    put_lit(g, t, strlen(t));
    free(t);
    return 0;
}

static int node(gg *g, const json_t *s, const json_t *root, int depth);

/* A count keyword within GB_MAX_REPEAT, or dflt when absent. */
static int count(gg *g, const json_t *s, const char *k, int dflt) {
    const json_t *v = json_object_get(s, k);
    if (!v) return dflt;
    if (json_integer_value(v) > 1000) return gfail(g, "'%s' over 1000 cannot be enforced with the gemma4 format", k);
    return (int)json_integer_value(v);
}

/* An object's properties: rules A_i (nothing written yet) and B_i
   (something written: a comma first), i from 0 to np. */
static int object_rule(gg *g, int r, const json_t *s, const json_t *root, int depth) {
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    size_t np = json_object_size(props);
    if (np == 0) {
        if (json_is_false(json_object_get(s, "additionalProperties"))) {
            put(g, "n%d ::= \"{\" \"}\"\n", r);
        } else {
            any_rules(g);
            put(g, "n%d ::= gobj\n", r);
        }
        return 0;
    }
    int *val = ember_calloc(np, sizeof *val);
    if (!val) {
        g->oom = true;
        return -1;
    }
    const char *k;
    const json_t *ps;
    size_t i = 0;
    json_object_foreach((json_t *)props, k, ps) {
        val[i] = node(g, ps, root, depth + 1);
        if (val[i++] < 0) {
            free(val);
            return -1;
        }
    }
    put(g, "n%d ::= \"{\" n%da0 \"}\"\n", r, r);
    i = 0;
    json_object_foreach((json_t *)props, k, ps) {
        bool required = false;
        size_t j;
        const json_t *x;
        json_array_foreach(req, j, x) required = required || (json_is_string(x) && !strcmp(json_string_value(x), k));
        put(g, "n%dp%zu ::= ", r, i);
        if (bare_key(k)) {
            put_lit(g, k, strlen(k));
        } else {
            if (strstr(k, "<|\"|>")) {
                free(val);
                return gfail(g, "a property name holds Gemma's quote <|\"|>");
            }
            put(g, "%s ", GQ);
            put_lit(g, k, strlen(k));
            put(g, " %s", GQ);
        }
        put(g, " \":\" n%d\n", val[i]);
        put(g, "n%da%zu ::= n%dp%zu n%db%zu", r, i, r, i, r, i + 1);
        if (!required) put(g, " | n%da%zu", r, i + 1);
        put(g, "\nn%db%zu ::= \",\" n%dp%zu n%db%zu", r, i, r, i, r, i + 1);
        if (!required) put(g, " | n%db%zu", r, i + 1);
        put(g, "\n");
        i++;
    }
    put(g, "n%da%zu ::= \"\"\nn%db%zu ::= \"\"\n", r, np, r, np);
    free(val);
    return 0;
}

static int type_rule(gg *g, int r, const char *t, const json_t *s, const json_t *root, int depth) {
    if (!strcmp(t, "object")) return object_rule(g, r, s, root, depth);
    if (!strcmp(t, "string")) {
        if (json_object_get(s, "pattern"))
            return gfail(g, "a string 'pattern' cannot be enforced with the gemma4 format (strings are raw text)");
        int lo = count(g, s, "minLength", 0), hi = count(g, s, "maxLength", -1);
        if (g->failed) return -1;
        if (hi >= 0)
            put(g, "n%d ::= %s [^<\\x00-\\x08\\x0b-\\x1f]{%d,%d} %s\n", r, GQ, lo, hi, GQ);
        else
            put(g, "n%d ::= %s [^<\\x00-\\x08\\x0b-\\x1f]{%d,} %s\n", r, GQ, lo, GQ);
        return 0;
    }
    if (!strcmp(t, "integer") || !strcmp(t, "number")) {
        static const char *const k_bounds[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL};
        for (int i = 0; k_bounds[i]; i++)
            if (json_object_get(s, k_bounds[i]))
                return gfail(g, "'%s' cannot be enforced with the gemma4 format yet", k_bounds[i]);
        put(g, "n%d ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,14} )%s\n", r,
            t[0] == 'n' ? " ( \".\" [0-9]{1,6} )?" : "");
        return 0;
    }
    if (!strcmp(t, "boolean")) {
        put(g, "n%d ::= \"true\" | \"false\"\n", r);
        return 0;
    }
    if (!strcmp(t, "null")) {
        put(g, "n%d ::= \"null\"\n", r);
        return 0;
    }
    if (!strcmp(t, "array")) {
        const json_t *items = json_object_get(s, "items");
        int lo = count(g, s, "minItems", 0), hi = count(g, s, "maxItems", -1);
        if (g->failed) return -1;
        int it;
        if (items) {
            it = node(g, items, root, depth + 1);
            if (it < 0) return -1;
        } else {
            any_rules(g);
            it = -1;
        }
        char iv[32];
        snprintf(iv, sizeof iv, it < 0 ? "gval" : "n%d", it);
        if (hi == 0) {
            put(g, "n%d ::= \"[\" \"]\"\n", r);
        } else {
            int rlo = lo > 0 ? lo - 1 : 0;
            put(g, "n%d ::= \"[\" %s%s ( \",\" %s ){%d,", r, lo == 0 ? "( " : "", iv, iv, rlo);
            if (hi > 0) put(g, "%d", hi - 1);
            put(g, "}%s \"]\"\n", lo == 0 ? " )?" : "");
        }
        return 0;
    }
    return gfail(g, "unknown type '%.32s'", t);
}

/* The rule of schema s: its number. */
static int node(gg *g, const json_t *s, const json_t *root, int depth) {
    if (depth > 24) return gfail(g, "the schema nests too deep");
    if (g->failed || g->oom) return -1;
    int r = g->rules++;
    if (json_is_true(s) || (json_is_object(s) && json_object_size(s) == 0)) {
        any_rules(g);
        put(g, "n%d ::= gval\n", r);
        return r;
    }
    const json_t *ref = json_object_get(s, "$ref");
    if (json_is_string(ref)) {
        const char *p = json_string_value(ref);
        const json_t *t = !strcmp(p, "#") ? root
                          : !strncmp(p, "#/$defs/", 8) ? json_object_get(json_object_get(root, "$defs"), p + 8)
                          : !strncmp(p, "#/definitions/", 14) ? json_object_get(json_object_get(root, "definitions"), p + 14)
                                                               : NULL;
        if (!t) return gfail(g, "'$ref' '%.64s' does not resolve", p);
        for (int i = 0; i < g->n_ref; i++)
            if (g->ref_sch[i] == t) {
                put(g, "n%d ::= n%d\n", r, g->ref_rule[i]);
                return r;
            }
        if (g->n_ref == MAX_REFS) return gfail(g, "too many '$ref's");
        g->ref_sch[g->n_ref] = t;
        g->ref_rule[g->n_ref++] = g->rules; /* the next rule: recursion refers to it */
        int k = node(g, t, root, depth + 1);
        if (k < 0) return -1;
        put(g, "n%d ::= n%d\n", r, k);
        return r;
    }
    const json_t *cn = json_object_get(s, "const"), *en = json_object_get(s, "enum");
    if (cn || en) {
        put(g, "n%d ::= ", r);
        size_t n = cn ? 1 : json_array_size(en);
        for (size_t i = 0; i < n; i++) {
            if (i) put(g, " | ");
            if (put_value(g, cn ? cn : json_array_get(en, i), 0)) return -1;
        }
        put(g, "\n");
        return r;
    }
    const json_t *any = json_object_get(s, "anyOf");
    if (!any) any = json_object_get(s, "oneOf");
    const json_t *ty = json_object_get(s, "type");
    if (any || json_is_array(ty)) {
        size_t n = any ? json_array_size(any) : json_array_size(ty);
        int alts[16];
        if (n == 0 || n > 16) return gfail(g, "'anyOf' / 'type' must hold 1 to 16 entries");
        for (size_t i = 0; i < n; i++) {
            if (any) {
                alts[i] = node(g, json_array_get(any, i), root, depth + 1);
            } else {
                alts[i] = g->rules++;
                if (type_rule(g, alts[i], json_string_value(json_array_get(ty, i)), s, root, depth)) return -1;
            }
            if (alts[i] < 0) return -1;
        }
        put(g, "n%d ::= ", r);
        for (size_t i = 0; i < n; i++) put(g, "%sn%d", i ? " | " : "", alts[i]);
        put(g, "\n");
        return r;
    }
    if (json_is_string(ty)) return type_rule(g, r, json_string_value(ty), s, root, depth) ? -1 : r;
    if (json_object_get(s, "properties")) return object_rule(g, r, s, root, depth) ? -1 : r;
    any_rules(g);
    put(g, "n%d ::= gval\n", r);
    return r;
}

int gemma_call_gbnf(const json_t *tools, const char *named, char **out, char *why, size_t why_len) {
    gg g;
    memset(&g, 0, sizeof g);
    g.why = why;
    g.why_len = why_len;
    *out = NULL;
    size_t i;
    const json_t *t;
    int *body = ember_calloc(json_array_size(tools) + 1, sizeof *body);
    if (!body) return snprintf(why, why_len, "out of memory"), -1;
    json_array_foreach(tools, i, t) {
        const json_t *fn = json_object_get(t, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        body[i] = -1;
        if (named && strcmp(name, named)) continue;
        const json_t *params = json_object_get(fn, "parameters");
        body[i] = params && json_object_size(params) ? node(&g, params, params, 0) : -1;
        if (g.failed || g.oom) break;
        if (body[i] < 0) {
            any_rules(&g);
            body[i] = g.rules++;
            put(&g, "n%d ::= gobj\n", body[i]);
        }
    }
    put(&g, "root ::= \"<|tool_call>call:\" (");
    bool first = true;
    json_array_foreach(tools, i, t) {
        if (body[i] < 0 || g.failed) continue;
        const char *name = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
        put(&g, "%s", first ? " " : " | ");
        first = false;
        put_lit(&g, name, strlen(name));
        put(&g, " n%d", body[i]);
    }
    put(&g, " ) \"<tool_call|>\"\n");
    free(body);
    if (g.failed || g.oom) {
        if (g.oom && !g.failed) snprintf(why, why_len, "out of memory");
        free(g.s);
        return g.oom && !g.failed ? -2 : -1;
    }
    *out = g.s;
    return 0;
}
