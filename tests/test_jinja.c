/*
 * test_jinja.c - unit tests of the Jinja interpreter and the chat-template
 * API that the corpus test does not cover: exact line:column of syntax and
 * runtime errors, limits (iterations, recursion, output, memory, nesting),
 * the value-building API, and API misuse. Everything must fail cleanly.
 */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "template/chat.h"
#include "template/jinja.h"

#include <time.h>
static double ember_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Renders src with vars (JSON text, may be NULL); returns the status and
   fills out (caller frees) / err. */
static bool g_ext; /* render with extensions on */

static int render(const char *src, const char *vars_json, const jinja_limits *lim, char **out, ember_error *err) {
    *out = NULL;
    ember_chat_template *t = NULL;
    int rc = ember_chat_template_compile(src, strlen(src), &t, err);
    if (rc) return rc;
    json_t *vars = NULL;
    if (vars_json) {
        json_error_t je;
        vars = json_loads(vars_json, 0, &je);
        if (!vars) {
            ember_chat_template_free(t);
            return ember_err(err, EMBER_ERR_INVALID_ARG, "bad test JSON: %s", je.text);
        }
    }
    ember_chat_opts opts;
    memset(&opts, 0, sizeof opts);
    if (lim) opts.limits = *lim;
    opts.extensions = g_ext;
    rc = ember_chat_template_render(t, vars, &opts, out, NULL, err);
    json_decref(vars);
    ember_chat_template_free(t);
    return rc;
}

static void expect_out(const char *src, const char *vars, const char *want) {
    char *out;
    ember_error err = {0};
    int rc = render(src, vars, NULL, &out, &err);
    CHECKF(rc == EMBER_OK && out && strcmp(out, want) == 0, "template [%s]: want [%s] got [%s] (%s)", src, want,
           out ? out : "", rc ? err.msg : "ok");
    free(out);
}

/* The error code and the start of the message must match. */
static void expect_err(const char *src, const char *vars, const jinja_limits *lim, int code, const char *prefix) {
    char *out;
    ember_error err = {0};
    int rc = render(src, vars, lim, &out, &err);
    CHECKF(rc == code && strncmp(err.msg, prefix, strlen(prefix)) == 0,
           "template [%.60s]: want code %d and [%s...], got code %d [%s]", src, code, prefix, rc, err.msg);
    CHECK(out == NULL);
    free(out);
}

static void syntax_errors(void) {
    expect_err("{% if %}", NULL, NULL, EMBER_ERR_FORMAT, "template:1:7: unexpected '%}'");
    expect_err("Hello\n{{ name | }}", NULL, NULL, EMBER_ERR_FORMAT, "template:2:11: unexpected '}}'");
    expect_err("line1\nline2 {% foo %}", NULL, NULL, EMBER_ERR_FORMAT, "template:2:10: unknown statement 'foo'");
    expect_err("{{ 'unterminated }}", NULL, NULL, EMBER_ERR_FORMAT, "template:1:4: unexpected end of template inside a string");
    expect_err("ok {# never closed", NULL, NULL, EMBER_ERR_FORMAT, "template:1:4: missing end of comment tag");
    expect_err("a\n  {% if x %}abc", NULL, NULL, EMBER_ERR_FORMAT, "template:2:3: unclosed block: expected {% endif %}");
    expect_err("{% for x in xs %}{% endif %}", NULL, NULL, EMBER_ERR_FORMAT, "template:1:21: unknown statement 'endif'");
    expect_err("{% for x in xs %}", NULL, NULL, EMBER_ERR_FORMAT, "template:1:1: unclosed block: expected {% endfor %}");
    expect_err("{{ x ? y }}", NULL, NULL, EMBER_ERR_FORMAT, "template:1:6: unexpected character '?'");
    expect_err("{{ 'a\\q' }}", NULL, NULL, EMBER_ERR_FORMAT, "template:1:7: unexpected escaped character 'q'");
    expect_err("{% macro m(a, a) %}{% endmacro %}", NULL, NULL, EMBER_ERR_FORMAT, "template:1:15: duplicate parameter name 'a'");
    expect_err("{{ f(a=1, 2) }}", NULL, NULL, EMBER_ERR_FORMAT, "template:1:11: positional arguments must come before keyword arguments");
    expect_err("{% for 1 in x %}{% endfor %}", NULL, NULL, EMBER_ERR_FORMAT, "template:1:8: expected an identifier or tuple");
    expect_err("{{ x[] }}", NULL, NULL, EMBER_ERR_FORMAT, "template:1:6: expected at least one argument");
    expect_err("{{ x }", NULL, NULL, EMBER_ERR_FORMAT, "template:1:6: expected '}}', got '}'");
    expect_err("{{ x", NULL, NULL, EMBER_ERR_FORMAT, "template:1:5: unexpected end of template");
    expect_err("  \xc3\xa9\xc3\xa9 {{ \xc3\xa9 }}", NULL, NULL, EMBER_ERR_FORMAT, "template:1:9: unexpected character U+00E9");
    expect_err("{{ x.1.2 }}{% set %}", NULL, NULL, EMBER_ERR_FORMAT, "template:1:19: unexpected '%}'");
    /* trailing newline handling and lstrip do not shift reported positions */
    expect_err("\n\n    {% if a %}\n{% elif %}\n{% endif %}\n", NULL, NULL, EMBER_ERR_FORMAT, "template:4:9: unexpected '%}'");
}

static void runtime_errors(void) {
    expect_err("\n\n  {{ x|nosuch }}", NULL, NULL, EMBER_ERR_FORMAT, "template:3:8: cannot apply filter 'nosuch' to UndefinedValue");
    expect_err("{{ 'a'|nosuch }}", NULL, NULL, EMBER_ERR_FORMAT, "template:1:8: unknown StringValue filter 'nosuch'");
    expect_err("{% if x is frob %}{% endif %}", NULL, NULL, EMBER_ERR_FORMAT, "template:1:12: unknown test 'frob'");
    expect_err("{{ raise_exception('Only user and assistant roles') }}", NULL, NULL, EMBER_ERR_INVALID_ARG,
               "template:1:4: raise_exception: Only user and assistant roles");
    expect_err("{{ messages.append(1) }}", "{\"messages\": []}", NULL, EMBER_ERR_FORMAT,
               "template:1:13: 'append' is not a method of this value");
    expect_err("{{ 1 + none }}", NULL, NULL, EMBER_ERR_FORMAT, "template:1:6: Cannot perform operation + on null values");
    expect_err("{% for m in 5 %}{% endfor %}", NULL, NULL, EMBER_ERR_FORMAT,
               "template:1:13: Expected iterable or object type in for loop: got IntegerValue");
    expect_err("{% macro m() %}{% endmacro %}{{ m(1) }}", NULL, NULL, EMBER_ERR_FORMAT,
               "template:1:33: macro 'm' takes not more than 0 argument(s)");
    expect_err("{% set ns = namespace() %}{% set ns.self = ns %}{{ ns|tojson }}", NULL, NULL, EMBER_ERR_FORMAT,
               "template:1:55: tojson: value nested too deeply");
    expect_err("ab\n {% if 1 %}{% continue %}{% endif %}", NULL, NULL, EMBER_ERR_FORMAT, "template:2:15: continue outside of a loop");
    expect_err("{% macro m() %}{% break %}{% endmacro %}{% for i in [1] %}{{ m() }}{% endfor %}", NULL, NULL, EMBER_ERR_FORMAT,
               "template:1:19: break outside of a loop");
    expect_err("{% set d = {} %}{% set d.x = 1 %}", NULL, NULL, EMBER_ERR_FORMAT,
               "template:1:25: cannot assign attribute on non-namespace object");
}

static void limits(void) {
    jinja_limits lim;
    memset(&lim, 0, sizeof lim);
    lim.max_iterations = 10000;
    expect_err("{% for i in range(100000000) %}{% endfor %}", NULL, &lim, EMBER_ERR_LIMIT, "template:1:13: more than 10000 loop iterations");
    expect_err("{% for a in range(100) %}{% for b in range(100) %}{% for c in range(100) %}x{% endfor %}{% endfor %}{% endfor %}",
               NULL, &lim, EMBER_ERR_LIMIT, "template:1:");
    memset(&lim, 0, sizeof lim);
    expect_err("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, NULL, EMBER_ERR_LIMIT, "template:1:");
    lim.max_output = 1000;
    expect_err("{% for i in range(2000) %}x{% endfor %}", NULL, &lim, EMBER_ERR_LIMIT, "template:1:");
    expect_err("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", NULL,
               &lim, EMBER_ERR_LIMIT, "template:1:");
    memset(&lim, 0, sizeof lim);
    lim.max_memory = 1u << 20;
    expect_err("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + [i] %}{% endfor %}", NULL,
               &lim, EMBER_ERR_LIMIT, "template:1:");
    /* deeply nested syntax is rejected, not a stack overflow */
    size_t n = 20000;
    char *deep = malloc(2 * n + 16);
    strcpy(deep, "{{ ");
    for (size_t i = 0; i < n; i++) strcat(deep + 3 + i - (i ? 1 : 0), "(");
    size_t l = strlen(deep);
    deep[l++] = '1';
    for (size_t i = 0; i < n; i++) deep[l++] = ')';
    strcpy(deep + l, " }}");
    expect_err(deep, NULL, NULL, EMBER_ERR_FORMAT, "template:1:");
    free(deep);
    char *ifs = malloc(20 * 5000 + 1);
    ifs[0] = '\0';
    for (int i = 0; i < 5000; i++) strcat(ifs + (size_t)i * 10, "{% if 1 %}");
    expect_err(ifs, NULL, NULL, EMBER_ERR_FORMAT, "template:1:");
    free(ifs);
}

static void features(void) {
    expect_out("{{ x }}", "{\"x\": 2.0}", "2");                   /* whole JSON numbers are integers */
    expect_out("{{ x }}", "{\"x\": 2.5}", "2.5");
    expect_out("{{ 2.0 }}|{{ 2.0|tojson }}", NULL, "2.0|2");
    expect_out("{% for k in d %}{{ k }}{% endfor %}", "{\"d\": {\"b\": 1, \"10\": 2, \"a\": 3, \"2\": 4}}", "210ba");
    expect_out("{{ messages[-1]['content'] }}", "{\"messages\": [{\"content\": \"a\"}, {\"content\": \"b\"}]}", "b");
    expect_out("{%- for m in messages -%}\n  {{- m.role -}}\n{%- endfor -%}\n", "{\"messages\": [{\"role\": \"u\"}, {\"role\": \"a\"}]}", "ua");
    expect_out("{{ bos_token }}{% if add_generation_prompt %}GO{% endif %}", "{\"bos_token\": \"<s>\", \"add_generation_prompt\": true}", "<s>GO");
    expect_out("a\n", NULL, "a");   /* one trailing newline is dropped, as the reference does */
    expect_out("a\n\n", NULL, "a\n");
    expect_out("", NULL, "");
    expect_out("{{ '\\u00e9\\ud83d\\ude80' }}", NULL, "\xc3\xa9\xf0\x9f\x9a\x80");
    expect_out("{{ s|length }} {{ s[1] }}", "{\"s\": \"\xf0\x9f\x9a\x80x\"}", "3 \xef\xbf\xbd"); /* UTF-16 units */
}

/* Extensions: each template fails without them (as in the reference). */
static void ext_case(const char *src, const char *vars, const char *want) {
    g_ext = false;
    char *out;
    ember_error err = {0};
    int rc = render(src, vars, NULL, &out, &err);
    CHECKF(rc != EMBER_OK, "[%s] renders without extensions: [%s]", src, out ? out : "");
    free(out);
    g_ext = true;
    expect_out(src, vars, want);
    g_ext = false;
}

static void extensions(void) {
    const char *v = "{\"xs\": [3, 1, 2], \"s\": \"  Hello big World  \", \"d\": {\"b\": 1, \"a\": 2}}";
    ext_case("{{ xs|count }} {{ s|count }} {{ d|count }}", v, "3 19 2");
    ext_case("{{ nope|d('x') }}{{ nope|default }}|{{ ''|d('e', true) }}", v, "x|e");
    ext_case("{{ s|wordcount }}", v, "3");
    ext_case("{{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(1) }} {{ 2.1|round(0, 'ceil') }} {{ 7|round }}", v, "2.0 4.0 2.7 3.0 7");
    ext_case("{{ xs|select('odd')|list }} {{ xs|reject('odd')|list }} {{ [0, 1, '', 'a']|select|list }}", v, "[3, 1] [2] [1, \"a\"]");
    ext_case("{{ ['a', 'b']|map('upper')|list }}", v, "[\"A\", \"B\"]");
    ext_case("{{ xs|sum }} {{ xs|min }} {{ xs|max }} {{ [1.5, 2]|sum }}", v, "6 1 3 3.5");
    ext_case("{{ 'abc'|first }}{{ 'abc'|last }} {{ 'ab'|list }} {{ d|list }}", v, "ac [\"a\", \"b\"] [\"b\", \"a\"]");
    ext_case("{{ s.find('big') }} {{ s.rfind('o') }} {{ s.find('zz') }} {{ s.count('l') }} {{ 'é-x'.find('x') }}", v, "8 13 -1 3 2");
    ext_case("{{ 'a,b,c'.rsplit(',', 1) }} {{ '  a b  c '.rsplit(none, 1) }} {{ 'x'.rsplit() }}", v,
             "[\"a,b\", \"c\"] [\"  a b\", \"c\"] [\"x\"]");
    ext_case("{{ ', '.join(['a', 'b']) }} {{ 'l1\nl2\r\nl3\n'.splitlines() }}", v, "a, b [\"l1\", \"l2\", \"l3\"]");
    ext_case("{{ '123'.isdigit() }} {{ 'ab'.isalpha() }} {{ 'a1'.isalnum() }} {{ ' '.isspace() }} {{ 'ab'.islower() }} {{ 'AB'.isupper() }} {{ ''.isdigit() }}",
             v, "true true true true true true false");
    ext_case("{{ 'v1.txt'.removeprefix('v1').removesuffix('.txt') }}", v, "");
    ext_case("{{ '{} + {} = {total} {{x}} {0}'.format(1, 2, total=3) }} {{ '{}{}'.format(true, none) }}", v,
             "1 + 2 = 3 {x} 1 TrueNone");
    ext_case("{% set l = [1] %}{{ l.append(2) }}{% set _ = l.extend([3, 4]) %}{{ l.pop() }}{{ l.pop(0) }}{{ l }}{{ l.index(3) }}{{ l.count(2) }}{% set _ = l.insert(0, 9) %}{{ l }}",
             v, "41[2, 3]11[9, 2, 3]");
    ext_case("{{ dict(a=1, b='x') }} {{ dict([['k', 2]]) }}", v, "{\"a\": 1, \"b\": \"x\"} {\"k\": 2}");
    ext_case("{{ 1.5 is float }} {{ 1 is float }}", v, "true false");
    /* what the reference renders stays the same with extensions on */
    g_ext = true;
    expect_out("{{ s.strip('H') }}|{{ xs|default('z') }}|{{ d.get('a') }}", v, "Hello big World|[3, 1, 2]|2");
    g_ext = false;
}

/* Big objects from untrusted JSON stay fast (hash-indexed lookups). */
static void big_objects(void) {
    size_t n = 50000;
    char *js = malloc(n * 32 + 64);
    size_t o = (size_t)sprintf(js, "{\"d\": {");
    for (size_t i = 0; i < n; i++) o += (size_t)sprintf(js + o, "%s\"k%zu\": %zu", i ? ", " : "", i, i);
    o += (size_t)sprintf(js + o, ", \"7\": \"seven\", \"k5\": \"dup\"}}");
    double t0 = ember_now_s();
    expect_out("{{ d.k49999 }} {{ d['k0'] }} {{ d.k5 }} {{ d|length }} {{ d.keys()[0] }} {% for k in d %}{% if d[k] == 3 %}{{ k }}{% endif %}{% endfor %}",
               js, "49999 0 dup 50001 7 k3");
    CHECKF(ember_now_s() - t0 < 20.0, "a 50000-key object took %.1f s", ember_now_s() - t0);
    free(js);
}

static void api(void) {
    ember_error err = {0};
    ember_chat_template *t = NULL;
    CHECK(ember_chat_template_compile("{{ x }}", 7, &t, &err) == EMBER_OK);
    char *out = NULL;
    json_t *arr = json_array();
    CHECK(ember_chat_template_render(t, arr, NULL, &out, NULL, &err) == EMBER_ERR_INVALID_ARG && out == NULL);
    json_decref(arr);
    json_t *v = json_pack("{s:s}", "range", "x");
    CHECK(ember_chat_template_render(t, v, NULL, &out, NULL, &err) == EMBER_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "built-in") != NULL);
    json_decref(v);
    size_t len = 99;
    CHECK(ember_chat_template_render(t, NULL, NULL, &out, &len, &err) == EMBER_OK && out && len == 0 && !out[0]);
    free(out);
    ember_chat_template_free(t);
    ember_chat_template_free(NULL);
    CHECK(ember_chat_template_compile(NULL, 5, &t, &err) != EMBER_OK);

    /* the value-building API of jinja.h, and reuse of one compiled template */
    jinja_template *jt = NULL;
    const char *src = "{% for m in msgs %}{{ m.role }}:{{ m.n }};{% endfor %}{{ flag }}";
    CHECK(jinja_compile(src, strlen(src), NULL, &jt, &err) == EMBER_OK);
    for (int round = 0; round < 2; round++) {
        jinja_ctx *c = jinja_ctx_new(NULL);
        jv msgs = jinja_ctx_list(c);
        for (int i = 0; i < 3; i++) {
            jv m = jinja_ctx_dict(c);
            CHECK(jinja_ctx_dict_set(c, m, "role", 4, jinja_ctx_str(c, "user", 4)));
            CHECK(jinja_ctx_dict_set(c, m, "n", 1, jv_int(i + round)));
            CHECK(jinja_ctx_list_push(c, msgs, m));
        }
        CHECK(jinja_ctx_set(c, "msgs", msgs, &err) == EMBER_OK);
        CHECK(jinja_ctx_set(c, "flag", jv_bool(round == 1), &err) == EMBER_OK);
        CHECK(jinja_ctx_set(c, "flag", jv_null(), &err) == EMBER_ERR_INVALID_ARG);
        CHECK(jinja_ctx_set(c, "none", jv_null(), &err) == EMBER_ERR_INVALID_ARG);
        char *o = NULL;
        CHECK(jinja_render(jt, c, &o, NULL, &err) == EMBER_OK);
        const char *want = round == 0 ? "user:0;user:1;user:2;false" : "user:1;user:2;user:3;true";
        CHECKF(o && strcmp(o, want) == 0, "got [%s]", o ? o : "");
        free(o);
        jinja_ctx_free(c);
    }
    jinja_free(jt);

    /* tokenizer_config chat_template as a list of named templates */
    json_t *cfg = json_loads("{\"chat_template\": [{\"name\": \"default\", \"template\": \"D\"}, {\"name\": \"tool_use\", \"template\": \"T\"}]}", 0, NULL);
    CHECK(cfg && strcmp(ember_chat_template_from_config(cfg, NULL), "D") == 0);
    CHECK(strcmp(ember_chat_template_from_config(cfg, "tool_use"), "T") == 0);
    CHECK(ember_chat_template_from_config(cfg, "rag") == NULL);
    json_decref(cfg);
}

int main(void) {
    syntax_errors();
    runtime_errors();
    limits();
    features();
    extensions();
    big_objects();
    api();
    return test_done();
}
