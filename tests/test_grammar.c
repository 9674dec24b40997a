/*
 * test_grammar.c - constrained decoding (src/sample/grammar.c): over a
 * suite of JSON schemas (written out, then varied: nested in objects and
 * arrays, made nullable), random walks that pick a random allowed token at
 * every step must end in JSON that parses and validates against its schema
 * (checked by a small validator of this file, independent of the grammar);
 * the mask must allow exactly the tokens accept takes; schemas the grammar
 * cannot enforce are refused naming the feature; the tool-call shape (a
 * literal head per tool, the arguments, a closing literal).
 */
#define _GNU_SOURCE
#include <jansson.h>
#include <math.h>

#include "sample/grammar.h"
#include "test.h"

/* ---- a small vocabulary: every byte, some multi-byte pieces, an end id ---- */

static const char *const k_pieces[] = {"{\"", "\":", "\": ", "\", \"", "\",\"", "true", "false", "null", "name",
                                       "city", "\"}", "}}", "]}", "[\"", "\"]", ", ", "12", "0.5", "-1", "e+3",
                                       "Paris", " the", "\\n", "\\u00e9", "\xc3\xa9", "\xe2\x82\xac", "<tool_call>",
                                       "\n</tool_call>", "{\"name\": \"", "\", \"arguments\": ", "ab", "a\"",
                                       /* tokens that open a string (grammar.c's quote table), long ones
                                          (more code points than the maxLength levels) */
                                       "\"ab", "\"\"", "\"\",", "\"\xc3", "\"\\", "\"x\"}", " \"q",
                                       "abcdefghijklmnopqrstuvwxyz", "\"abcdefghijklmnopqrstu", "\xc3\xa9\xc3\xa9\xc3",
                                       NULL};

typedef struct vocab {
    int n, end;
    char *bytes[512];
    size_t lens[512];
    bool is_end[512];
} vocab;

static void vocab_init(vocab *v) {
    memset(v, 0, sizeof *v);
    for (int b = 1; b < 256; b++) {
        v->bytes[v->n] = malloc(1);
        v->bytes[v->n][0] = (char)b;
        v->lens[v->n++] = 1;
    }
    for (int i = 0; k_pieces[i]; i++) {
        v->bytes[v->n] = strdup(k_pieces[i]);
        v->lens[v->n++] = strlen(k_pieces[i]);
    }
    v->end = v->n;
    v->is_end[v->n++] = true; /* bytes NULL */
}

static void vocab_free(vocab *v) {
    for (int i = 0; i < v->n; i++) free(v->bytes[i]);
}

/* ---- an independent validator ---- */

static size_t cp_len(const char *s) {
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xc0) != 0x80;
    return n;
}

static bool valid(const json_t *x, const json_t *s, const json_t *root);

static bool valid_type(const json_t *x, const char *t) {
    if (!strcmp(t, "object")) return json_is_object(x);
    if (!strcmp(t, "array")) return json_is_array(x);
    if (!strcmp(t, "string")) return json_is_string(x);
    if (!strcmp(t, "integer")) return json_is_integer(x);
    if (!strcmp(t, "number")) return json_is_number(x);
    if (!strcmp(t, "boolean")) return json_is_boolean(x);
    if (!strcmp(t, "null")) return json_is_null(x);
    return false;
}

static bool valid(const json_t *x, const json_t *s, const json_t *root) {
    if (json_is_true(s)) return true;
    const json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        const char *r = json_string_value(ref);
        const json_t *t = !strncmp(r, "#/$defs/", 8) ? json_object_get(json_object_get(root, "$defs"), r + 8)
                                                     : json_object_get(json_object_get(root, "definitions"), r + 14);
        return t && valid(x, t, root);
    }
    const json_t *e = json_object_get(s, "enum");
    if (e) {
        size_t i;
        const json_t *v;
        bool hit = false;
        json_array_foreach(e, i, v) hit |= json_equal(v, x);
        if (!hit) return false;
    }
    if (json_object_get(s, "const") && !json_equal(json_object_get(s, "const"), x)) return false;
    const json_t *any = json_object_get(s, "anyOf");
    if (any) {
        size_t i;
        const json_t *a;
        bool hit = false;
        json_array_foreach(any, i, a) hit |= valid(x, a, root);
        if (!hit) return false;
    }
    const json_t *ty = json_object_get(s, "type");
    if (json_is_string(ty) && !valid_type(x, json_string_value(ty))) return false;
    if (json_is_array(ty)) {
        size_t i;
        const json_t *t;
        bool hit = false;
        json_array_foreach(ty, i, t) hit |= valid_type(x, json_string_value(t));
        if (!hit) return false;
    }
    if (json_is_string(x)) {
        size_t n = cp_len(json_string_value(x));
        const json_t *lo = json_object_get(s, "minLength"), *hi = json_object_get(s, "maxLength");
        if ((lo && (json_int_t)n < json_integer_value(lo)) || (hi && (json_int_t)n > json_integer_value(hi))) return false;
    }
    if (json_is_number(x)) {
        double d = json_number_value(x);
        const json_t *b;
        if ((b = json_object_get(s, "minimum")) && !(d >= json_number_value(b))) return false;
        if ((b = json_object_get(s, "maximum")) && !(d <= json_number_value(b))) return false;
        if ((b = json_object_get(s, "exclusiveMinimum")) && !(d > json_number_value(b))) return false;
        if ((b = json_object_get(s, "exclusiveMaximum")) && !(d < json_number_value(b))) return false;
    }
    if (json_is_array(x)) {
        const json_t *lo = json_object_get(s, "minItems"), *hi = json_object_get(s, "maxItems"), *it = json_object_get(s, "items");
        json_int_t n = (json_int_t)json_array_size(x);
        if ((lo && n < json_integer_value(lo)) || (hi && n > json_integer_value(hi))) return false;
        size_t i;
        const json_t *v;
        json_array_foreach(x, i, v) if (it && !valid(v, it, root)) return false;
    }
    if (json_is_object(x)) {
        const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
        size_t i;
        const json_t *r;
        json_array_foreach(req, i, r) if (!json_object_get(x, json_string_value(r))) return false;
        const char *k;
        const json_t *v;
        json_object_foreach((json_t *)x, k, v) {
            const json_t *ps = json_object_get(props, k);
            if (!ps && json_is_false(json_object_get(s, "additionalProperties"))) return false;
            if (ps && !valid(v, ps, root)) return false;
        }
    }
    return true;
}

/* ---- random walks ---- */

static uint64_t g_rng = 88172645463325252ull;
static double urand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) * 0x1.0p-53;
}

/* One walk: random logits (closing bytes and the end favoured so walks end),
   the mask, the best allowed token, accepted. Returns the text (malloc'd),
   *ended when the end id came. Checks mask/accept agreement on the way. */
/* Whether a fresh matcher fed text then token t takes it (the mask's truth). */
static bool takes(const ember_grammar *g, const ember_gvocab *gv, const char *text, size_t n, int t) {
    ember_gmatch *m = NULL;
    ember_error err = {0};
    if (ember_gmatch_new(g, gv, &m, &err)) return false;
    bool ok = ember_gmatch_feed(m, text, n) && ember_gmatch_accept(m, t);
    ember_gmatch_free(m);
    return ok;
}

/* Whether token t is allowed with left tokens to go: a fresh matcher fed
   text then t takes it, and (unless the output is already past steering:
   its shortest completion longer than left - 1) the shortest completion
   after it fits in left - 2 (grammar.h, ember_gmatch_mask_left). */
static bool takes_left(const ember_grammar *g, const ember_gvocab *gv, const char *text, size_t n, int t, int left) {
    ember_gmatch *m = NULL;
    ember_error err = {0};
    if (ember_gmatch_new(g, gv, &m, &err)) return false;
    if (left < 1) left = 1;
    bool ok = ember_gmatch_feed(m, text, n);
    bool steer = ok && ember_gmatch_min_bytes(m) <= left - 1;
    ok = ok && ember_gmatch_accept(m, t) && (!steer || ember_gmatch_min_bytes(m) <= left - 2);
    ember_gmatch_free(m);
    return ok;
}

/* budget > 0: the walk's token budget (ember_gmatch_mask_left); check:
   compare the mask with what a fresh matcher takes (on a budget, with
   takes_left), every fourth step (every step when check > 1). The count
   the mask returns must be the ids it left, at every step. */
static char *walk(const ember_grammar *g, const ember_gvocab *gv, const vocab *v, int steps, bool *ended, int *disagree,
                  int budget, int check) {
    ember_gmatch *m = NULL;
    ember_error err = {0};
    CHECK(ember_gmatch_new(g, gv, &m, &err) == 0);
    char *out = calloc(1, 8192);
    size_t n = 0;
    float lg[512];
    *ended = false;
    for (int s = 0; s < steps && !*ended; s++) {
        for (int i = 0; i < v->n; i++) {
            lg[i] = (float)urand();
            if (v->bytes[i] && v->lens[i] == 1 && strchr("\"}]0", v->bytes[i][0])) lg[i] += 0.6f;
        }
        lg[v->end] += 0.8f;
        int left = budget > 0 ? ember_gmatch_mask_left(m, lg, v->n, budget - s) : ember_gmatch_mask(m, lg, v->n);
        CHECK(left > 0);
        int kept = 0;
        for (int i = 0; i < v->n; i++) kept += lg[i] != -INFINITY;
        if (kept != left) (*disagree)++;
        if (check && (check > 1 || s % 4 == 0))
            for (int i = 0; i < v->n; i++) {
                bool truth = budget > 0 ? takes_left(g, gv, out, n, i, budget - s) : takes(g, gv, out, n, i);
                if (i != v->end && (lg[i] != -INFINITY) != truth) (*disagree)++;
            }
        int best = -1;
        for (int i = 0; i < v->n; i++)
            if (lg[i] != -INFINITY && (best < 0 || lg[i] > lg[best])) best = i;
        if (best == v->end) {
            *ended = true;
            CHECK(ember_gmatch_complete(m));
            break;
        }
        if (!ember_gmatch_accept(m, best)) (*disagree)++;
        if (n + v->lens[best] < 8000) {
            memcpy(out + n, v->bytes[best], v->lens[best]);
            n += v->lens[best];
        }
    }
    ember_gmatch_free(m);
    return out;
}

static const char *const k_schemas[] = {
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}",
    "{\"type\":\"string\"}",
    "{\"type\":\"string\",\"minLength\":2,\"maxLength\":5}",
    "{\"type\":\"integer\"}",
    "{\"type\":\"number\"}",
    "{\"type\":\"boolean\"}",
    "{\"type\":\"null\"}",
    "{\"enum\":[\"red\",\"green\",\"blue\",1,12,null]}",
    "{\"const\":{\"a\":[1,2]}}",
    "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}",
    "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"enum\":[\"x\",\"y\"]},\"maxItems\":0}",
    "{\"type\":\"object\"}",
    "{}",
    "{\"type\":\"object\",\"properties\":{},\"additionalProperties\":false}",
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"ab\":{\"type\":\"boolean\"},\"abc\":{\"type\":"
    "\"string\"}},\"required\":[\"ab\",\"abc\"],\"additionalProperties\":false}",
    "{\"type\":[\"string\",\"null\"]}",
    "{\"type\":[\"integer\",\"boolean\",\"array\"],\"items\":{\"type\":\"null\"}}",
    "{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"number\"}},\"required\":[\"k\"]}]}",
    "{\"$defs\":{\"pt\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"},\"y\":{\"type\":\"number\"}},"
    "\"required\":[\"x\",\"y\"],\"additionalProperties\":false}},\"type\":\"object\",\"properties\":{\"from\":{\"$ref\":"
    "\"#/$defs/pt\"},\"to\":{\"$ref\":\"#/$defs/pt\"}},\"required\":[\"from\",\"to\"]}",
    "{\"definitions\":{\"u\":{\"type\":\"string\",\"maxLength\":3}},\"type\":\"array\",\"items\":{\"$ref\":\"#/definitions/u\"}}",
    "{\"type\":\"object\",\"properties\":{\"deep\":{\"type\":\"object\",\"properties\":{\"deeper\":{\"type\":\"array\","
    "\"items\":{\"type\":\"object\",\"properties\":{\"v\":{\"enum\":[true,false,\"maybe\"]}},\"required\":[\"v\"]}}}}},"
    "\"required\":[\"deep\"],\"title\":\"t\",\"description\":\"d\"}",
    "{\"type\":\"string\",\"minLength\":1,\"maxLength\":1}",
    "{\"type\":\"integer\",\"description\":\"an id\"}",
    "{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"maxItems\":2},\"maxItems\":2}",
    "{\"type\":\"object\",\"properties\":{\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\",\"fahrenheit\"]},\"days\":"
    "{\"type\":\"integer\"}},\"required\":[\"unit\"]}",
    "{\"type\":\"integer\",\"minimum\":-5,\"maximum\":12}",
    "{\"type\":\"integer\",\"minimum\":1000,\"exclusiveMaximum\":1003}",
    "{\"type\":\"integer\",\"exclusiveMinimum\":-1}",
    "{\"type\":\"number\",\"minimum\":0.25,\"maximum\":0.75}",
    "{\"type\":\"number\",\"exclusiveMinimum\":-2.5,\"exclusiveMaximum\":-2.4}",
    "{\"type\":\"number\",\"maximum\":-100}",
    "{\"type\":\"string\",\"pattern\":\"^[a-z]{2,4}-\\\\d{3}$\"}",
    "{\"type\":\"string\",\"pattern\":\"^(ab|cd)*x?$\"}",
    "{\"type\":\"string\",\"pattern\":\"ab\"}",
    /* maxLength room above the bitset levels, minLength under a tight budget, strings as keys' values */
    "{\"type\":\"string\",\"maxLength\":40}",
    "{\"type\":\"string\",\"minLength\":3,\"maxLength\":30}",
    "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"minLength\":20},\"t\":{\"type\":"
    "\"string\",\"maxLength\":17}},\"required\":[\"s\",\"t\"]}",
};

/* The variations of a schema: itself, as a required property, as array
   items, nullable ($defs stay at the root). */
static int variations(const char *base, char out[4][4096]) {
    json_t *b = json_loads(base, 0, NULL);
    json_t *defs = json_incref(json_object_get(b, "$defs")), *defs2 = json_incref(json_object_get(b, "definitions"));
    json_object_del(b, "$defs");
    json_object_del(b, "definitions");
    json_t *v[4] = {json_loads(base, 0, NULL),
                    json_pack("{s:s, s:{s:O, s:{s:s}}, s:[s]}", "type", "object", "properties", "p", b, "q", "type",
                              "integer", "required", "p"),
                    json_pack("{s:s, s:O, s:i}", "type", "array", "items", b, "maxItems", 2),
                    json_pack("{s:[O, {s:s}]}", "anyOf", b, "type", "null")};
    for (int i = 0; i < 4; i++) {
        if (i > 0 && defs) json_object_set(v[i], "$defs", defs);
        if (i > 0 && defs2) json_object_set(v[i], "definitions", defs2);
        char *t = json_dumps(v[i], JSON_COMPACT);
        snprintf(out[i], 4096, "%s", t);
        free(t);
        json_decref(v[i]);
    }
    json_decref(b);
    json_decref(defs);
    json_decref(defs2);
    return 4;
}

static void schema_suite(const ember_gvocab *gv, const vocab *v, bool checked_budget) {
    int schemas = 0, walks = 0, ended_n = 0, refused = 0, disagree = 0, budgeted = 0;
    for (size_t i = 0; i < sizeof k_schemas / sizeof *k_schemas; i++) {
        char var[4][4096];
        int nv = variations(k_schemas[i], var);
        for (int k = 0; k < nv; k++) {
            json_t *s = json_loads(var[k], 0, NULL);
            CHECKF(s != NULL, "schema text %zu/%d", i, k);
            ember_grammar *g = ember_grammar_new();
            ember_error err = {0};
            int root = ember_grammar_schema(g, s, s, "schema", &err);
            /* the nullable variation of a schema that can itself be null overlaps: refused, named */
            if (root < 0) {
                CHECKF(strstr(err.msg, "same character") != NULL, "schema %zu/%d refused: %s", i, k, err.msg);
                refused++;
            } else {
                schemas++;
                CHECK(ember_grammar_set_root(g, root, &err) == 0);
                for (int w = 0; w < 5; w++) {
                    bool ended;
                    /* the last walk on a budget: it must end, in time */
                    int budget = w == 4 ? ember_grammar_min_bytes(g) + 1 + (int)(urand() * 12) : 0;
                    char *text = walk(g, gv, v, budget ? budget : 300, &ended, &disagree, budget,
                                      w == 0 || (checked_budget && w == 4));
                    walks++;
                    if (budget) {
                        CHECKF(ended, "schema %zu/%d: a walk on a budget of %d did not end: %s", i, k, budget, text);
                        budgeted++;
                    }
                    if (ended) {
                        ended_n++;
                        json_error_t je;
                        json_t *x = json_loads(text, JSON_DECODE_ANY, &je);
                        CHECKF(x != NULL, "schema %zu/%d: output does not parse (%s): %s", i, k, je.text, text);
                        CHECKF(x && valid(x, s, s), "schema %zu/%d: output does not validate: %s\n  schema %s", i, k,
                               text, var[k]);
                        json_decref(x);
                    }
                    free(text);
                }
            }
            ember_grammar_free(g);
            json_decref(s);
        }
    }
    fprintf(stderr, "%d schemas (%d refused as overlapping), %d walks (%d on a budget), %d ended and validated\n", schemas,
            refused, walks, budgeted, ended_n);
    CHECK(schemas >= 90);
    CHECK(disagree == 0);
    CHECKF(ended_n * 10 >= walks * 8, "only %d of %d walks ended", ended_n, walks);
}

/* Strings under a budget so tight that the last bytes are counted: the mask
   checked at every step against takes_left (a string's minLength still
   owed when one byte of slack is gone: grammar.c's allow_tight with a
   negative slack; an object around it). */
static void tight_strings(const ember_gvocab *gv, const vocab *v) {
    static const char *const k_tight[] = {
        "{\"type\":\"string\",\"minLength\":3}",
        "{\"type\":\"string\",\"minLength\":2,\"maxLength\":20}",
        "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"minLength\":4}},\"required\":[\"s\"]}",
    };
    int disagree = 0, walks = 0, ended_n = 0;
    for (size_t i = 0; i < sizeof k_tight / sizeof *k_tight; i++) {
        json_t *s = json_loads(k_tight[i], 0, NULL);
        ember_grammar *g = ember_grammar_new();
        ember_error err = {0};
        int root = ember_grammar_schema(g, s, s, "schema", &err);
        CHECK(root >= 0 && ember_grammar_set_root(g, root, &err) == 0);
        for (int w = 0; w < 24; w++) {
            bool ended;
            int budget = ember_grammar_min_bytes(g) + 1 + w % 4;
            char *text = walk(g, gv, v, budget, &ended, &disagree, budget, 2);
            walks++;
            ended_n += ended;
            CHECKF(ended, "tight %zu: a walk on a budget of %d did not end: %s", i, budget, text);
            free(text);
        }
        ember_grammar_free(g);
        json_decref(s);
    }
    CHECKF(disagree == 0, "tight strings: the mask and the matcher disagree %d times", disagree);
    fprintf(stderr, "tight strings: %d walks, %d ended\n", walks, ended_n);
}

/* Schemas the grammar cannot enforce: refused, naming what. */
static void refusals(void) {
    static const struct {
        const char *schema, *want;
    } cs[] = {
        {"{\"type\":\"string\",\"pattern\":\"^(?=a)a+$\"}", "lookaround"},
        {"{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "backreferences"},
        {"{\"type\":\"string\",\"pattern\":\"^\\\\n$\"}", "printable ASCII"},
        {"{\"type\":\"string\",\"pattern\":\"^[a-z]{40}[0-9]{40}$\"}", "too complex"},
        {"{\"type\":\"number\",\"multipleOf\":2}", "multipleOf"},
        {"{\"minLength\":2}", "without 'type'"},
        {"{\"type\":\"string\",\"format\":\"date-time\"}", "format"},
        {"{\"type\":\"integer\",\"minimum\":3,\"maximum\":2}", "no integer satisfies"},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":true}", "boolean"},
        {"{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"next\":{\"$ref\":\"#/$defs/n\"}}}},\"$ref\":\"#/$defs/n\"}",
         "recursive"},
        {"{\"$ref\":\"#/$defs/missing\"}", "does not resolve"},
        {"{\"$ref\":\"http://example.com/s.json\"}", "does not resolve"},
        {"{\"anyOf\":[{\"type\":\"object\"},{\"type\":\"object\",\"properties\":{\"a\":{}}}]}", "same character"},
        {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"}}", "additionalProperties"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}", "required[0]"},
        {"{\"type\":\"strange\"}", "unknown type"},
        {"{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "minItems > maxItems"},
        {"{\"allOf\":[{}]}", "allOf"},
        {"{\"type\":\"object\",\"properties\":{\"a\\\"b\":{}}}", "quotes"},
        {"[1]", "must be an object"},
    };
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
        json_t *s = json_loads(cs[i].schema, JSON_DECODE_ANY, NULL);
        ember_grammar *g = ember_grammar_new();
        ember_error err = {0};
        int r = ember_grammar_schema(g, s, s, "p", &err);
        CHECKF(r < 0 && strstr(err.msg, cs[i].want), "case %zu: %d '%s'", i, r, err.msg);
        ember_grammar_free(g);
        json_decref(s);
    }
    /* a huge enum */
    json_t *en = json_array();
    for (int i = 0; i < 300; i++) json_array_append_new(en, json_integer(i));
    json_t *s = json_pack("{s:o}", "enum", en);
    ember_grammar *g = ember_grammar_new();
    ember_error err = {0};
    CHECK(ember_grammar_schema(g, s, s, "p", &err) < 0 && strstr(err.msg, "256"));
    ember_grammar_free(g);
    json_decref(s);
}

/* The shape of a forced Hermes call: <tool_call>\n + one head per tool + the
   arguments + "}" + \n</tool_call>; the bytes fed decide the tool. */
static void tool_shape(const ember_gvocab *gv, const vocab *v) {
    ember_grammar *g = ember_grammar_new();
    ember_error err = {0};
    json_t *p1 = json_loads("{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}",
                            0, NULL);
    json_t *p2 = json_loads("{\"type\":\"object\",\"properties\":{}}", 0, NULL);
    int a1 = ember_grammar_schema(g, p1, p1, "t0", &err), a2 = ember_grammar_schema(g, p2, p2, "t1", &err);
    int close = ember_grammar_literal(g, "}", 1, &err);
    int s1[2] = {a1, close}, s2[2] = {a2, close};
    int next[2] = {ember_grammar_seq(g, s1, 2, &err), ember_grammar_seq(g, s2, 2, &err)};
    const char *heads[2] = {"{\"name\": \"get_weather\", \"arguments\": ", "{\"name\": \"get_time\", \"arguments\": "};
    int body = ember_grammar_choice(g, heads, next, 2, &err);
    int parts[3] = {ember_grammar_literal(g, "<tool_call>\n", 12, &err), body,
                    ember_grammar_literal(g, "\n</tool_call>", 13, &err)};
    CHECK(ember_grammar_set_root(g, ember_grammar_seq(g, parts, 3, &err), &err) == 0);
    for (int w = 0; w < 20; w++) {
        bool ended;
        int dis = 0;
        char *text = walk(g, gv, v, 300, &ended, &dis, w >= 10 ? ember_grammar_min_bytes(g) + 1 + w : 0, w < 2);
        CHECK(dis == 0);
        if (ended) {
            CHECKF(!strncmp(text, "<tool_call>\n{\"name\": \"get_", 26), "call '%s'", text);
            size_t n = strlen(text);
            CHECK(n > 26 + 13 && !strcmp(text + n - 13, "\n</tool_call>"));
            json_t *call = json_loadb(text + 12, n - 25, 0, NULL);
            const char *name = json_string_value(json_object_get(call, "name"));
            CHECKF(call && name, "call JSON: %s", text);
            json_t *args = json_object_get(call, "arguments");
            CHECK(json_is_object(args) && valid(args, !strcmp(name ? name : "", "get_weather") ? p1 : p2, p1));
            json_decref(call);
        }
        free(text);
    }
    /* bytes the grammar refuses leave the state as it was */
    ember_gmatch *m = NULL;
    CHECK(ember_gmatch_new(g, gv, &m, &err) == 0);
    CHECK(!ember_gmatch_feed(m, "<tool_call>\n{\"name\": \"nope", 27));
    const char *head = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {";
    CHECK(ember_gmatch_feed(m, head, strlen(head)));
    CHECK(!ember_gmatch_complete(m) && !ember_gmatch_feed(m, "]", 1));
    CHECK(ember_gmatch_feed(m, " }}\n</tool_call>", 16) && ember_gmatch_complete(m));
    float lg[512];
    for (int i = 0; i < v->n; i++) lg[i] = 0;
    CHECK(ember_gmatch_mask(m, lg, v->n) == 1 && lg[v->end] == 0); /* only the end is left */
    ember_gmatch_free(m);
    ember_grammar_free(g);
    json_decref(p1);
    json_decref(p2);
}

/* Raw text (a Qwen3-Coder parameter): <p>TEXT</p>, TEXT valid UTF-8 with no
   '<' and no control characters but line breaks and tabs; the mask equals
   what a fresh matcher takes; walks on a budget end in time. */
static void raw_text(const ember_gvocab *gv, const vocab *v) {
    ember_grammar *g = ember_grammar_new();
    ember_error err = {0};
    int parts[3] = {ember_grammar_literal(g, "<p>", 3, &err), ember_grammar_text(g, &err),
                    ember_grammar_literal(g, "</p>", 4, &err)};
    CHECK(ember_grammar_set_root(g, ember_grammar_seq(g, parts, 3, &err), &err) == 0);
    CHECK(ember_grammar_min_bytes(g) == 7);
    for (int w = 0; w < 12; w++) {
        bool ended;
        int dis = 0, budget = w % 2 ? 8 + w : 0;
        char *text = walk(g, gv, v, budget ? budget : 200, &ended, &dis, budget, w == 0 || w == 2);
        CHECK(dis == 0);
        if (budget) CHECKF(ended, "raw text: a walk on a budget of %d did not end: %s", budget, text);
        if (ended) {
            size_t n = strlen(text);
            CHECKF(n >= 7 && !strncmp(text, "<p>", 3) && !strcmp(text + n - 4, "</p>"), "raw text: %s", text);
            for (size_t i = 3; n >= 7 && i < n - 4; i++)
                CHECKF(text[i] != '<' && ((unsigned char)text[i] >= 0x20 || text[i] == '\n' || text[i] == '\t'),
                       "raw text: byte %zu of %s", i, text);
            json_t *j = json_stringn(text, n); /* NULL unless valid UTF-8 */
            CHECKF(j != NULL, "raw text: not UTF-8: %s", text);
            json_decref(j);
        }
        free(text);
    }
    ember_grammar_free(g);
}

int main(void) {
    vocab v;
    vocab_init(&v);
    ember_gvocab *gv = NULL;
    ember_error err = {0};
    CHECK(ember_gvocab_new(v.n, (const char *const *)v.bytes, v.lens, v.is_end, &gv, &err) == 0);
    schema_suite(gv, &v, true);
    tight_strings(gv, &v);
    /* again with the mask written without AVX-512 (where the CPU has it: the other path) */
    setenv("EMBER_GRAMMAR_NO_AVX512", "1", 1);
    ember_gvocab *gv2 = NULL;
    CHECK(ember_gvocab_new(v.n, (const char *const *)v.bytes, v.lens, v.is_end, &gv2, &err) == 0);
    unsetenv("EMBER_GRAMMAR_NO_AVX512");
    schema_suite(gv2, &v, false);
    ember_gvocab_free(gv2);
    refusals();
    tool_shape(gv, &v);
    raw_text(gv, &v);
    ember_gvocab_free(gv);
    vocab_free(&v);
    return test_done();
}
