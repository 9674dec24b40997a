/*
 * test_server_grammar.c - grammars and regular expressions through the HTTP
 * server, in process, on the demo model (random weights, byte-level
 * tokenizer) with Qwen2.5's real chat template:
 *   - a hostile table: GBNF syntax errors (with line and column), undefined
 *     rules, left recursion, empty grammars, limits, unsupported regex
 *     features, two constraints at once, wrong types: each 400 with a JSON
 *     error naming the field and the problem, the server alive after;
 *   - outputs: sampled answers under "grammar" (chat, completions,
 *     Anthropic messages, structured_outputs.grammar) and "guided_regex" /
 *     structured_outputs.regex, each finished ("stop") and checked by an
 *     independent matcher (a recursive-descent parser of this file for the
 *     arithmetic grammar, POSIX regexec for the regular ones); a streamed
 *     answer joining into the non-streamed one;
 *   - the server's default grammar (--grammar-file): a request without a
 *     constraint follows it, one with its own constraint does not;
 *   - speculation: greedy constrained completions from a server with n-gram
 *     speculation equal the plain server's, are valid, and drafts were made
 *     (the prompt's continuation is what the drafts propose and what the
 *     grammar forbids, so an unchecked draft would show).
 * Skipped (77) when shared/testdata is absent.
 */
#define _GNU_SOURCE
#include <regex.h>

#include "server_util.h"

#include "core/util.h"
#include "test.h"

static ember_server *start(ember_model *m, ember_tokenizer *tok, ember_chat_template *tmpl, const char *dflt,
                           ember_spec_mode spec) {
    ember_server_opts o = {0};
    o.model_id = "demo";
    o.max_queue = 64;
    o.max_body = 2u << 20;
    o.default_grammar = dflt;
    o.spec = spec;
    return server_start(m, tok, tmpl, &o, 3);
}

#define USER "\"messages\":[{\"role\":\"user\",\"content\":\"Compute something\"}]"
#define ARITH                                                                                                         \
    "root ::= expr\\n"                                                                                                \
    "expr ::= term ([-+] term)*\\n"                                                                                   \
    "term ::= factor ([*/] factor)*\\n"                                                                               \
    "factor ::= [0-9]{1,3} | \\\"(\\\" expr \\\")\\\"\\n"

/* ---- independent checkers ---- */

static bool ar_expr(const char **p, int depth);
static bool ar_factor(const char **p, int depth) {
    if (**p == '(') {
        (*p)++;
        if (depth > 200 || !ar_expr(p, depth + 1) || **p != ')') return false;
        (*p)++;
        return true;
    }
    int n = 0;
    while (**p >= '0' && **p <= '9' && n < 4) {
        (*p)++;
        n++;
    }
    return n >= 1 && n <= 3;
}
static bool ar_term(const char **p, int depth) {
    if (!ar_factor(p, depth)) return false;
    while (**p == '*' || **p == '/') {
        (*p)++;
        if (!ar_factor(p, depth)) return false;
    }
    return true;
}
static bool ar_expr(const char **p, int depth) {
    if (!ar_term(p, depth)) return false;
    while (**p == '+' || **p == '-') {
        (*p)++;
        if (!ar_term(p, depth)) return false;
    }
    return true;
}
static bool check_arith(const char *s) {
    const char *p = s;
    return s && ar_expr(&p, 0) && *p == '\0';
}

static bool check_posix(const char *ere, const char *s) {
    char full[512];
    snprintf(full, sizeof full, "^(%s)$", ere);
    regex_t re;
    if (!s || regcomp(&re, full, REG_EXTENDED | REG_NOSUB)) return false;
    bool ok = regexec(&re, s, 0, NULL, 0) == 0;
    regfree(&re);
    return ok;
}

/* ---- answers ---- */

/* The answer's text and finish reason of any endpoint's JSON. */
static const char *answer(const json_t *j, const char **finish) {
    const json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    if (c0) {
        *finish = json_string_value(json_object_get(c0, "finish_reason"));
        const json_t *msg = json_object_get(c0, "message");
        return json_string_value(msg ? json_object_get(msg, "content") : json_object_get(c0, "text"));
    }
    *finish = json_string_value(json_object_get(j, "stop_reason"));
    return json_string_value(json_object_get(json_array_get(json_object_get(j, "content"), 0), "text"));
}

typedef bool (*checker)(const char *text, const void *arg);
static bool ok_arith(const char *s, const void *a) {
    (void)a;
    return check_arith(s);
}
static bool ok_posix(const char *s, const void *a) {
    return check_posix(a, s);
}

/* Posts body n times (seeds 1..n) and checks every answer finished and
   passes ok. */
static void outputs(const char *what, const char *path, const char *fmt, checker ok, const void *arg, int n,
                    const char *fin_want) {
    for (int seed = 1; seed <= n; seed++) {
        char body[4096];
        snprintf(body, sizeof body, fmt, seed);
        int st;
        json_t *j = post(path, body, &st, NULL);
        const char *fin = NULL, *text = answer(j, &fin);
        CHECKF(st == 200 && text && fin && !strcmp(fin, fin_want) && ok(text, arg),
               "%s seed %d: status %d finish %s text '%s'", what, seed, st, fin ? fin : "-", text ? text : "-");
        if (getenv("SHOW")) fprintf(stderr, "%s: %s\n", what, text ? text : "-");
        json_decref(j);
    }
}

typedef struct bad_case {
    const char *path, *body, *param, *needle;
} bad_case;

static void hostile(void) {
    static const bad_case cases[] = {
        {"/v1/chat/completions", "{" USER ",\"grammar\":\"root ::= foo\"}", "grammar", "line 1, column 10: undefined rule 'foo'"},
        {"/v1/chat/completions", "{" USER ",\"grammar\":\"root ::= \\\"a\\\"\\nx ::= (\\\"b\\\"\"}", "grammar",
         "line 2, column 7: a '(' without its ')'"},
        {"/v1/chat/completions", "{" USER ",\"grammar\":\"root ::= [a-z\"}", "grammar", "unterminated character class"},
        {"/v1/chat/completions", "{" USER ",\"grammar\":\"root ::= e\\ne ::= e \\\"+\\\" \\\"1\\\" | \\\"1\\\"\"}", "grammar",
         "left recursion"},
        {"/v1/chat/completions", "{" USER ",\"grammar\":\"\"}", "grammar", "empty"},
        {"/v1/chat/completions", "{" USER ",\"grammar\":\"# nothing\\n\"}", "grammar", "empty"},
        {"/v1/chat/completions", "{" USER ",\"grammar\":\"x ::= \\\"a\\\"\"}", "grammar", "no 'root'"},
        {"/v1/chat/completions", "{" USER ",\"grammar\":\"root ::= \\\"a\\\"{5000}\"}", "grammar", "limit of 1000"},
        {"/v1/chat/completions", "{" USER ",\"grammar\":\"root ::= (\\\"a\\\"?)*\"}", "grammar", "empty string"},
        {"/v1/chat/completions", "{" USER ",\"grammar\":\"root ::= \\\"a\\\" root\"}", "grammar", "never finish"},
        {"/v1/chat/completions", "{" USER ",\"grammar\":5}", "grammar", "string"},
        {"/v1/chat/completions", "{" USER ",\"guided_grammar\":\"root ::= \\\"a\\\" @\"}", "guided_grammar", "unexpected '@'"},
        {"/v1/chat/completions", "{" USER ",\"guided_regex\":\"a(?=b)\"}", "guided_regex", "lookaround"},
        {"/v1/chat/completions", "{" USER ",\"guided_regex\":\"(a)\\\\1\"}", "guided_regex", "backreferences"},
        {"/v1/chat/completions", "{" USER ",\"guided_regex\":\"\\\\bx\"}", "guided_regex", "word boundaries"},
        {"/v1/chat/completions", "{" USER ",\"guided_regex\":\"caf\\u00e9\"}", "guided_regex", "beyond ASCII"},
        {"/v1/chat/completions", "{" USER ",\"guided_regex\":\"a{1,5000}\"}", "guided_regex", "over 1000"},
        {"/v1/chat/completions", "{" USER ",\"structured_outputs\":{\"regex\":\"a\",\"grammar\":\"root ::= \\\"a\\\"\"}}",
         "structured_outputs", "one string"},
        {"/v1/chat/completions", "{" USER ",\"structured_outputs\":{\"json\":{}}}", "structured_outputs", "json"},
        {"/v1/chat/completions", "{" USER ",\"structured_outputs\":[1]}", "structured_outputs", "object"},
        {"/v1/chat/completions", "{" USER ",\"grammar\":\"root ::= \\\"a\\\"\",\"guided_regex\":\"a\"}", "guided_regex",
         "give one"},
        {"/v1/chat/completions",
         "{" USER ",\"grammar\":\"root ::= \\\"a\\\"\",\"response_format\":{\"type\":\"json_object\"}}", "grammar",
         "response_format"},
        {"/v1/completions", "{\"prompt\":\"x\",\"grammar\":\"root ::= \\\"\\\\q\\\"\"}", "grammar",
         "line 1, column 11: unknown escape"},
        {"/v1/messages", "{\"max_tokens\":5," USER ",\"guided_regex\":\"(ab\"}", NULL, "unclosed"},
        {"/v1/responses", "{\"input\":\"x\",\"grammar\":\"root ::= ::=\"}", "grammar", "'::=' inside a rule"},
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n; i++) {
        int st;
        json_t *j = post(cases[i].path, cases[i].body, &st, NULL);
        const json_t *err = json_object_get(j, "error");
        const char *msg = json_string_value(json_object_get(err, "message"));
        const char *param = json_string_value(json_object_get(err, "param"));
        CHECKF(st == 400 && msg && strstr(msg, cases[i].needle) &&
                   (!cases[i].param || (param && !strcmp(param, cases[i].param))),
               "case %d (%s): status %d message '%s' param '%s'", i, cases[i].body, st, msg ? msg : "",
               param ? param : "");
        json_decref(j);
    }
    /* a grammar whose expansion passes the limits: 400, quickly */
    char *big = malloc(1 << 20), *p = big;
    p += sprintf(p, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"grammar\":\"root ::= ");
    for (int i = 0; i < 400; i++) p += sprintf(p, "\\\"abcdefghij\\\"{1000} ");
    sprintf(p, "\"}");
    int st;
    double t0 = ember_now();
    json_t *j = post("/v1/chat/completions", big, &st, NULL);
    const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    CHECKF(st == 400 && msg && strstr(msg, "too large") && ember_now() - t0 < 5, "huge expansion: %d '%s'", st,
           msg ? msg : "");
    json_decref(j);
    free(big);
    CHECK(health() == 200);
}

static void answers(void) {
    outputs("chat grammar", "/v1/chat/completions",
            "{" USER ",\"grammar\":\"" ARITH "\",\"max_tokens\":24,\"temperature\":1.0,\"seed\":%d}", ok_arith, NULL, 6,
            "stop");
    outputs("completions structured_outputs.grammar", "/v1/completions",
            "{\"prompt\":\"1+1=\",\"structured_outputs\":{\"grammar\":\"" ARITH
            "\"},\"max_tokens\":16,\"temperature\":1.0,\"seed\":%d}",
            ok_arith, NULL, 4, "stop");
    outputs("anthropic grammar", "/v1/messages",
            "{" USER ",\"grammar\":\"" ARITH "\",\"max_tokens\":20,\"temperature\":1.0,\"seed\":%d}",
            ok_arith, NULL, 3, "end_turn");
    static const char k_email[] = "[a-z]{2,8}@[a-z]{2,6}\\\\.(com|org)";
    static const char k_email_posix[] = "[a-z]{2,8}@[a-z]{2,6}\\.(com|org)";
    char fmt[1024];
    snprintf(fmt, sizeof fmt, "{" USER ",\"guided_regex\":\"%s\",\"max_tokens\":30,\"temperature\":1.0,\"seed\":%%d}",
             k_email);
    outputs("guided_regex", "/v1/chat/completions", fmt, ok_posix, k_email_posix, 6, "stop");
    outputs("structured_outputs.regex", "/v1/completions",
            "{\"prompt\":\"Phone:\",\"structured_outputs\":{\"regex\":\"\\\\(\\\\d{3}\\\\) \\\\d{3}-\\\\d{4}\"},"
            "\"max_tokens\":20,\"temperature\":1.0,\"seed\":%d}",
            ok_posix, "\\([0-9]{3}\\) [0-9]{3}-[0-9]{4}", 4, "stop");
    CHECK(health() == 200);
}

/* A streamed chat answer under a grammar joins into the non-streamed one
   (same seed) and follows the grammar. */
static void streamed(void) {
    static const char k_body[] = "{" USER ",\"grammar\":\"" ARITH "\",\"max_tokens\":24,\"temperature\":1.0,\"seed\":7%s}";
    char body[2048];
    snprintf(body, sizeof body, k_body, "");
    int st;
    json_t *j = post("/v1/chat/completions", body, &st, NULL);
    const char *fin = NULL, *want = answer(j, &fin);
    snprintf(body, sizeof body, k_body, ",\"stream\":true");
    http_resp r;
    http_request(g_port, "POST", "/v1/chat/completions", body, &r);
    char joined[4096] = "";
    int deltas = 0;
    for (const char *p = r.body; p && (p = strstr(p, "data: ")); p += 6) {
        const char *e = strchr(p, '\n');
        json_t *ev = json_loadb(p + 6, e ? (size_t)(e - p - 6) : strlen(p + 6), 0, NULL);
        const char *d = json_string_value(
            json_object_get(json_object_get(json_array_get(json_object_get(ev, "choices"), 0), "delta"), "content"));
        if (d && strlen(joined) + strlen(d) < sizeof joined) {
            strcat(joined, d);
            deltas++;
        }
        json_decref(ev);
    }
    CHECKF(r.status == 200 && want && deltas > 1 && !strcmp(joined, want) && check_arith(joined),
           "streamed '%s' (%d deltas) vs '%s'", joined, deltas, want ? want : "-");
    http_resp_free(&r);
    json_decref(j);
}

static bool ok_json(const char *s, const void *a) {
    (void)a;
    json_t *j = s ? json_loads(s, JSON_DECODE_ANY, NULL) : NULL;
    bool ok = json_is_object(j);
    json_decref(j);
    return ok;
}

/* The default grammar: requests without a constraint follow it. */
static void default_grammar(ember_model *m, ember_tokenizer *tok, ember_chat_template *tmpl) {
    static const char k_dflt[] = "root ::= (\"yes\" | \"no\") \"!\"{1,3}\n";
    ember_server *s = start(m, tok, tmpl, k_dflt, EMBER_SPEC_NONE);
    outputs("default grammar", "/v1/chat/completions",
            "{" USER ",\"max_tokens\":12,\"temperature\":1.0,\"seed\":%d}", ok_posix, "(yes|no)!{1,3}", 3, "stop");
    outputs("default grammar replaced by response_format", "/v1/chat/completions",
            "{" USER ",\"response_format\":{\"type\":\"json_object\"},\"max_tokens\":24,\"temperature\":1.0,\"seed\":%d}",
            ok_json, NULL, 2, "stop");
    outputs("default grammar replaced by guided_regex", "/v1/chat/completions",
            "{" USER ",\"guided_regex\":\"[0-9]{4}\",\"max_tokens\":12,\"temperature\":1.0,\"seed\":%d}", ok_posix,
            "[0-9]{4}", 2, "stop");
    ember_server_stop(s, 2.0);
    /* a bad default grammar: the server does not start, the message names it */
    ember_server_opts o = {0};
    o.default_grammar = "root ::= nope";
    ember_server *bad = NULL;
    ember_error err = {0};
    CHECKF(ember_server_start(m, tok, tmpl, &o, &bad, &err) != 0 && strstr(err.msg, "undefined rule 'nope'"), "%s",
           err.msg);
    if (bad) ember_server_stop(bad, 1.0);
}

/* A greedy constrained completion of a prompt whose continuation the
   grammar forbids: its text. */
static char *spec_text(const char *grammar_field) {
    char body[1024];
    snprintf(body, sizeof body,
             "{\"prompt\":\"abcabcabcabcabcabcabcabcabcabcabcabc\",\"max_tokens\":40,\"temperature\":0,"
             "\"cache_prompt\":false,%s}",
             grammar_field);
    int st;
    json_t *j = post("/v1/completions", body, &st, NULL);
    const char *fin = NULL, *t = answer(j, &fin);
    CHECKF(st == 200 && t, "completion: status %d", st);
    char *r = t ? ember_strndup(t, strlen(t)) : NULL;
    json_decref(j);
    return r;
}

static double metric_value(const char *body, const char *name) {
    char pat[128];
    snprintf(pat, sizeof pat, "\n%s ", name);
    const char *p = body ? strstr(body, pat) : NULL;
    return p ? strtod(p + strlen(pat), NULL) : -1;
}

static void speculation(ember_model *m, ember_tokenizer *tok, ember_chat_template *tmpl) {
    static const char *const fields[] = {"\"grammar\":\"root ::= \\\"ab\\\" ([ab] | \\\"ab\\\" | \\\"ba\\\"){30,40}\"",
                                         "\"guided_regex\":\"ab(ab?|ba?|b){30,40}\""};
    for (int i = 0; i < 2; i++) {
        ember_server *s = start(m, tok, tmpl, NULL, EMBER_SPEC_NONE);
        char *plain = spec_text(fields[i]);
        ember_server_stop(s, 2.0);
        s = start(m, tok, tmpl, NULL, EMBER_SPEC_NGRAM);
        char *spec = spec_text(fields[i]);
        http_resp r;
        http_request(g_port, "GET", "/metrics", NULL, &r);
        double drafted = metric_value(r.body, "ember_spec_drafted_total");
        http_resp_free(&r);
        ember_server_stop(s, 2.0);
        CHECKF(plain && spec && !strcmp(plain, spec), "constrained speculative text differs:\n%s\n%s", plain ? plain : "",
               spec ? spec : "");
        CHECKF(check_posix("[ab]{30,80}", spec) && !strchr(spec ? spec : "c", 'c'), "speculative output '%s'",
               spec ? spec : "");
        if (getenv("SHOW")) fprintf(stderr, "spec: %s / %s drafted %g\n", plain, spec, drafted);
        CHECKF(drafted > 0, "no drafts were made (%g)", drafted);
        free(plain);
        free(spec);
    }
}

int main(void) {
    qwen_demo d;
    if (!qwen_demo_load("server_grammar_demo", &d)) return 77;
    ember_server *s = start(d.m, d.tok, d.tmpl, NULL, EMBER_SPEC_NONE);
    hostile();
    answers();
    streamed();
    ember_server_stop(s, 2.0);
    default_grammar(d.m, d.tok, d.tmpl);
    speculation(d.m, d.tok, d.tmpl);
    qwen_demo_free(&d);
    return test_done();
}
