/*
 * test_server_tools.c - tool calls through the HTTP server, in process, on
 * the demo model (random weights, byte-level tokenizer) whose chat template
 * is replaced by Qwen2.5's real one (shared/testdata), which renders tools
 * and writes calls as <tool_call>{json}</tool_call>:
 *   - a hostile table of tool requests (bad tools, bad names, tool results
 *     for unknown calls, wrong types): each 400 with a JSON error naming the
 *     field, the server alive after;
 *   - the output path, driven by the test-only "ember_test_output" hook (a
 *     random-weight model writes no calls by itself; the hook swaps the
 *     sampled token ids for a scripted completion's, everything else runs
 *     as in production): OpenAI tool_calls and Anthropic tool_use blocks,
 *     single and parallel calls, text around them, a malformed call and one
 *     cut off by max_tokens coming back as content, tool_choice "none",
 *     parallel_tool_calls false, tool results fed back; streaming and not,
 *     the streamed pieces joining into exactly the non-streamed answer;
 *   - the hook refused by a server started without it; --tool-parser's
 *     override (the Mistral format on the same template).
 * Skipped (77) when shared/testdata is absent.
 */
#include "server_util.h"

#include "core/mapfile.h"
#include "core/util.h"
#include "ember.h"
#include "serve/serve.h"
#include "test.h"

/* A JSON string's text, or dflt. */
static const char *str_or(const json_t *j, const char *dflt) {
    return json_is_string(j) ? json_string_value(j) : dflt;
}

static ember_server *start(ember_model *m, ember_tokenizer *tok, ember_chat_template *tmpl, ember_tool_format f,
                           bool test_output) {
    ember_server_opts o = {0};
    o.model_id = "demo";
    o.max_queue = 64;
    o.max_body = 256 * 1024;
    o.tool_format = f;
    o.test_output = test_output;
    return server_start(m, tok, tmpl, &o, 1);
}

#define TOOLS                                                                                                         \
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather of a city\","  \
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"description\":\"A city\"}},"        \
    "\"required\":[\"city\"]}}},{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"description\":\"The time\","      \
    "\"parameters\":{\"type\":\"object\",\"properties\":{}}}}]"
#define ATOOLS                                                                                                       \
    "\"tools\":[{\"name\":\"get_weather\",\"description\":\"Weather of a city\",\"input_schema\":{\"type\":\"object\"," \
    "\"properties\":{\"city\":{\"type\":\"string\"}}}},{\"name\":\"get_time\",\"input_schema\":{\"type\":\"object\"}}]"
#define USER "\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}]"

typedef struct bad_case {
    const char *path, *body, *param; /* param: OpenAI's error.param, or NULL */
    const char *needle;              /* in the message */
} bad_case;

/* Enums past the grammar's limit (256 values), in response_format and in an
   enforced tool's parameters: 400 naming the limit, the server up after. */
static void huge_enums(void) {
    json_t *en = json_array();
    for (int i = 0; i < 5000; i++) json_array_append_new(en, json_integer(i));
    json_t *sch = json_pack("{s:O}", "enum", en);
    json_t *b1 = json_pack("{s:[{s:s,s:s}], s:{s:s, s:{s:s, s:O}}}", "messages", "role", "user", "content", "x",
                           "response_format", "type", "json_schema", "json_schema", "name", "x", "schema", sch);
    json_t *b2 = json_pack("{s:[{s:s,s:s}], s:[{s:s, s:{s:s, s:{s:s, s:{s:O}}}}], s:s}", "messages", "role", "user",
                           "content", "x", "tools", "type", "function", "function", "name", "f", "parameters", "type",
                           "object", "properties", "v", sch, "tool_choice", "required");
    json_t *bodies[2] = {b1, b2};
    const char *params[2] = {"response_format", "tools"};
    for (int i = 0; i < 2; i++) {
        char *text = json_dumps(bodies[i], JSON_COMPACT);
        int st;
        json_t *j = post("/v1/chat/completions", text, &st, NULL);
        const json_t *err = json_object_get(j, "error");
        const char *msg = json_string_value(json_object_get(err, "message"));
        const char *param = json_string_value(json_object_get(err, "param"));
        CHECKF(st == 400 && msg && strstr(msg, "256") && param && !strcmp(param, params[i]),
               "huge enum %d: status %d '%s'", i, st, msg ? msg : "");
        json_decref(j);
        free(text);
    }
    json_decref(b1);
    json_decref(b2);
    json_decref(sch);
    json_decref(en);
    CHECK(health() == 200);
}

static void hostile(void) {
    static const bad_case cases[] = {
        {"/v1/chat/completions", "{" USER ",\"tools\":5}", "tools", "array"},
        {"/v1/chat/completions", "{" USER ",\"tools\":[5]}", "tools", "object"},
        {"/v1/chat/completions", "{" USER ",\"tools\":[{\"type\":\"retrieval\"}]}", "tools", "function"},
        {"/v1/chat/completions", "{" USER ",\"tools\":[{\"type\":\"function\"}]}", "tools", "function"},
        {"/v1/chat/completions", "{" USER ",\"tools\":[{\"type\":\"function\",\"function\":{}}]}", "tools", "name"},
        {"/v1/chat/completions", "{" USER ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"bad name\"}}]}",
         "tools", "name"},
        {"/v1/chat/completions", "{" USER ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"\"}}]}", "tools",
         "name"},
        {"/v1/chat/completions",
         "{" USER ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
         "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}}]}",
         "tools", "64"},
        {"/v1/chat/completions", "{" USER ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\\u0000x\"}}]}",
         NULL, "invalid JSON"}, /* a NUL in a name never gets past the body's parser */
        {"/v1/chat/completions",
         "{" USER ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},{\"type\":\"function\",\"function\":"
         "{\"name\":\"f\"}}]}",
         "tools", "twice"},
        {"/v1/chat/completions", "{" USER ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":[]}}]}",
         "tools", "parameters"},
        {"/v1/chat/completions",
         "{" USER ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":7}}]}", "tools",
         "description"},
        {"/v1/chat/completions", "{" USER "," TOOLS ",\"tool_choice\":\"sometimes\"}", "tool_choice", "tool_choice"},
        {"/v1/chat/completions", "{" USER "," TOOLS ",\"tool_choice\":5}", "tool_choice", "tool_choice"},
        {"/v1/chat/completions", "{" USER "," TOOLS ",\"tool_choice\":{\"type\":\"function\"}}", "tool_choice", "name"},
        {"/v1/chat/completions", "{" USER "," TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}}",
         "tool_choice", "nope"},
        {"/v1/chat/completions", "{" USER ",\"tool_choice\":\"required\"}", "tool_choice", "tools"},
        {"/v1/chat/completions", "{" USER "," TOOLS ",\"parallel_tool_calls\":\"yes\"}", "parallel_tool_calls", NULL},
        /* tool calls and results in the conversation */
        {"/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":"
         "\"20C\"}]}",
         "messages", "no tool call"},
        {"/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"tool\",\"content\":\"20C\"}]}", "messages",
         "tool_call_id"},
        {"/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"tool_calls\":{}}]}", "messages",
         "array"},
        {"/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c1\","
         "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{not json\"}}]}]}",
         "messages", "arguments"},
        {"/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c1\","
         "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"[1]\"}}]}]}",
         "messages", "arguments"},
        {"/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"tool_calls\":[{\"type\":"
         "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}]}",
         "messages", "id"},
        {"/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c1\","
         "\"type\":\"function\",\"function\":{\"name\":\"no way\",\"arguments\":\"{}\"}}]}]}",
         "messages", "name"},
        {"/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
         "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}]}",
         "messages", "assistant"},
        {"/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c1\","
         "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":5}}]}]}",
         "messages", "arguments"},
        /* enforced tool_choice: schemas the constrainer cannot handle, response_format shapes */
        {"/v1/chat/completions",
         "{" USER ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":"
         "\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"^(?!x)$\"}}}}}],\"tool_choice\":\"required\"}",
         "tools", "pattern"},
        {"/v1/chat/completions",
         "{" USER ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"$defs\":{\"n\":"
         "{\"type\":\"object\",\"properties\":{\"k\":{\"$ref\":\"#/$defs/n\"}}}},\"$ref\":\"#/$defs/n\"}}}],"
         "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}",
         "tools", "recursive"},
        {"/v1/chat/completions",
         "{" USER ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":"
         "\"string\"}}}],\"tool_choice\":\"required\"}",
         "tools", "object"},
        {"/v1/chat/completions", "{" USER ",\"response_format\":{\"type\":\"json_schema\"}}", "response_format", "name"},
        {"/v1/chat/completions", "{" USER ",\"response_format\":{\"type\":\"yaml\"}}", "response_format", "yaml"},
        {"/v1/chat/completions",
         "{" USER ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":"
         "\"integer\",\"minimum\":1e300}}}}",
         "response_format", "minimum"},
        {"/v1/chat/completions",
         "{" USER "," TOOLS ",\"tool_choice\":\"required\",\"response_format\":{\"type\":\"json_object\"}}",
         "response_format", "tool_choice"},
        /* invalid or unenforceable schemas */
        {"/v1/chat/completions",
         "{" USER ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":5}}}",
         "response_format", "schema"},
        {"/v1/chat/completions",
         "{" USER ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":"
         "\"strange\"}}}}",
         "response_format", "unknown type"},
        {"/v1/chat/completions",
         "{" USER ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":"
         "\"string\",\"pattern\":\"(ab\"}}}}",
         "response_format", "unclosed"},
        {"/v1/chat/completions",
         "{" USER ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"$ref\":"
         "\"#/$defs/a\",\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"anyOf\":[{\"type\":\"null\"},{\"$ref\":"
         "\"#/$defs/a\"}]}}}}}}",
         "response_format", "recursive"},
        {"/v1/chat/completions",
         "{" USER ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"anyOf\":"
         "[{\"type\":\"integer\"},{\"type\":\"number\"}]}}}}",
         "response_format", "same character"},
        {"/v1/chat/completions",
         "{" USER ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":"
         "\"array\",\"minItems\":-1}}}}",
         "response_format", "minItems"},
        {"/v1/messages",
         "{\"max_tokens\":5," USER ",\"tools\":[{\"name\":\"f\",\"input_schema\":{\"$defs\":{\"n\":{\"type\":"
         "\"object\",\"properties\":{\"k\":{\"$ref\":\"#/$defs/n\"}}}},\"$ref\":\"#/$defs/n\"}}],\"tool_choice\":{"
         "\"type\":\"any\"}}",
         NULL, "recursive"},
        /* grammars and regular expressions (more in test_server_grammar.c) */
        {"/v1/chat/completions", "{" USER ",\"grammar\":\"root ::= x\\nx ::= x \\\"a\\\" | \\\"b\\\"\"}", "grammar",
         "left recursion"},
        {"/v1/chat/completions", "{" USER ",\"grammar\":\"root ::= [0-9]{1,99999}\"}", "grammar", "limit"},
        {"/v1/chat/completions", "{" USER "," TOOLS ",\"tool_choice\":\"required\",\"guided_regex\":\"[a-z]+\"}",
         "guided_regex", "tool_choice"},
        /* the test hook: only with text */
        {"/v1/chat/completions", "{" USER ",\"ember_test_output\":5}", "ember_test_output", "string"},
        /* Anthropic */
        {"/v1/messages", "{\"max_tokens\":5," USER ",\"tools\":{}}", NULL, "array"},
        {"/v1/messages", "{\"max_tokens\":5," USER ",\"tools\":[{\"name\":\"f\"}]}", NULL, "input_schema"},
        {"/v1/messages", "{\"max_tokens\":5," USER ",\"tools\":[{\"name\":\"f g\",\"input_schema\":{}}]}", NULL, "name"},
        {"/v1/messages",
         "{\"max_tokens\":5," USER ",\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"web_search\"}]}", NULL,
         "client tools"},
        {"/v1/messages", "{\"max_tokens\":5," USER "," ATOOLS ",\"tool_choice\":\"auto\"}", NULL, "tool_choice"},
        {"/v1/messages", "{\"max_tokens\":5," USER "," ATOOLS ",\"tool_choice\":{\"type\":\"maybe\"}}", NULL, "maybe"},
        {"/v1/messages", "{\"max_tokens\":5," USER "," ATOOLS ",\"tool_choice\":{\"type\":\"tool\"}}", NULL, "name"},
        {"/v1/messages", "{\"max_tokens\":5," USER "," ATOOLS ",\"tool_choice\":{\"type\":\"tool\",\"name\":\"zzz\"}}", NULL,
         "zzz"},
        {"/v1/messages", "{\"max_tokens\":5," USER ",\"tool_choice\":{\"type\":\"any\"}}", NULL, "tools"},
        {"/v1/messages",
         "{\"max_tokens\":5," USER "," ATOOLS ",\"tool_choice\":{\"type\":\"auto\",\"disable_parallel_tool_use\":1}}", NULL,
         "disable_parallel_tool_use"},
        {"/v1/messages",
         "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":"
         "\"toolu_x\",\"content\":\"20C\"}]}]}",
         NULL, "no tool_use"},
        {"/v1/messages",
         "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":"
         "\"f\",\"input\":{}}]}]}",
         NULL, "tool_use"},
        {"/v1/messages",
         "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":[{"
         "\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"f\",\"input\":\"{}\"}]}]}",
         NULL, "input"},
        {"/v1/messages",
         "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":[{"
         "\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"f\",\"input\":{}}]},{\"role\":\"user\",\"content\":[{\"type\":"
         "\"tool_result\",\"tool_use_id\":\"t1\",\"content\":[{\"type\":\"image\"}]}]}]}",
         NULL, "content"},
        {"/v1/messages",
         "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":[{"
         "\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"f\",\"input\":{}}]},{\"role\":\"user\",\"content\":[{\"type\":"
         "\"tool_result\",\"tool_use_id\":\"t1\",\"is_error\":\"no\"}]}]}",
         NULL, "is_error"},
        {"/v1/messages", "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\"}]}]}", NULL,
         "image"},
        {"/v1/messages", "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[7]}]}", NULL, "type"},
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n; i++) {
        int st;
        json_t *j = post(cases[i].path, cases[i].body, &st, NULL);
        bool anth = !strcmp(cases[i].path, "/v1/messages");
        const json_t *err = json_object_get(j, "error");
        const char *msg = json_string_value(json_object_get(err, "message"));
        CHECKF(st == 400 && msg, "case %d (%.70s): status %d", i, cases[i].body, st);
        if (anth) CHECKF(json_is_string(json_object_get(j, "type")), "case %d: not Anthropic's error shape", i);
        if (!anth && cases[i].param) {
            const char *param = json_string_value(json_object_get(err, "param"));
            CHECKF(param && !strcmp(param, cases[i].param), "case %d: param %s, want %s", i, param ? param : "null",
                   cases[i].param);
        }
        if (msg && cases[i].needle)
            CHECKF(strstr(msg, cases[i].needle), "case %d: message '%s' lacks '%s'", i, msg, cases[i].needle);
        json_decref(j);
    }
    CHECK(health() == 200);
    fprintf(stderr, "%d hostile tool requests answered 400\n", n);
    huge_enums();
}

/* ---- OpenAI: non-streamed vs streamed ------------------------------------------------------ */

/* Chunks that carried a piece of a call's arguments in the last streamed answer. */
static int g_arg_chunks;

/* The streamed answer rebuilt: {"content", "tool_calls": [{id, name, arguments}], "finish"}. */
static json_t *sse_chat(const char *body) {
    g_arg_chunks = 0;
    json_t *calls = json_array();
    char *content = calloc(1, strlen(body) + 1);
    size_t cn = 0;
    const char *finish = NULL;
    char fin[32] = "";
    bool done = false, order_ok = true;
    for (const char *p = body; (p = strstr(p, "data: "));) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        if (!e) break;
        if (!strncmp(p, "[DONE]", 6)) {
            done = true;
            break;
        }
        json_t *j = json_loadb(p, (size_t)(e - p), 0, NULL);
        CHECK(j != NULL);
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
        json_t *d = json_object_get(ch, "delta");
        const char *c = json_string_value(json_object_get(d, "content"));
        if (c) {
            memcpy(content + cn, c, strlen(c));
            cn += strlen(c);
        }
        size_t k;
        json_t *tc;
        json_array_foreach(json_object_get(d, "tool_calls"), k, tc) {
            size_t idx = (size_t)json_integer_value(json_object_get(tc, "index"));
            json_t *fn = json_object_get(tc, "function");
            if (idx == json_array_size(calls)) { /* a new call: id, type and name come first */
                order_ok &= json_is_string(json_object_get(tc, "id")) && json_is_string(json_object_get(fn, "name")) &&
                            !strcmp(json_string_value(json_object_get(tc, "type")), "function");
                json_array_append_new(calls, json_pack("{s:O, s:O, s:s}", "id", json_object_get(tc, "id"), "name",
                                                       json_object_get(fn, "name"), "arguments", ""));
            }
            json_t *call = json_array_get(calls, idx);
            order_ok &= call != NULL;
            const char *a = json_string_value(json_object_get(fn, "arguments"));
            if (call && a && *a) g_arg_chunks++;
            if (call && a) {
                char *cat = malloc(strlen(json_string_value(json_object_get(call, "arguments"))) + strlen(a) + 1);
                strcpy(cat, json_string_value(json_object_get(call, "arguments")));
                strcat(cat, a);
                json_object_set_new(call, "arguments", json_string(cat));
                free(cat);
            }
        }
        const char *f = json_string_value(json_object_get(ch, "finish_reason"));
        if (f) snprintf(fin, sizeof fin, "%s", f), finish = fin;
        json_decref(j);
        p = e;
    }
    CHECK(done && order_ok);
    json_t *out = json_pack("{s:s%, s:o, s:s}", "content", content, cn, "tool_calls", calls, "finish", finish ? finish : "");
    free(content);
    return out;
}

/* Runs one chat request both ways; checks they agree; returns the message. */
static json_t *chat_both(const char *extra, const char *script, char *finish, size_t fin_n) {
    char body[8192];
    json_t *sj = json_string(script);
    char *sq = json_dumps(sj, JSON_ENCODE_ANY);
    json_decref(sj);
    snprintf(body, sizeof body, "{" USER "," TOOLS ",\"max_tokens\":300,\"temperature\":0%s,\"ember_test_output\":%s}",
             extra, sq);
    int st;
    json_t *j = post("/v1/chat/completions", body, &st, NULL);
    CHECKF(st == 200, "status %d (%s) for %s", st, str_or(json_object_get(json_object_get(j, "error"), "message"), ""),
           body);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    json_t *msg = json_incref(json_object_get(ch, "message"));
    snprintf(finish, fin_n, "%s", str_or(json_object_get(ch, "finish_reason"), ""));
    json_decref(j);
    /* the same streamed */
    snprintf(body, sizeof body,
             "{" USER "," TOOLS ",\"max_tokens\":300,\"temperature\":0,\"stream\":true%s,\"ember_test_output\":%s}", extra,
             sq);
    free(sq);
    http_resp r;
    http_request(g_port, "POST", "/v1/chat/completions", body, &r);
    CHECK(r.status == 200);
    json_t *s = sse_chat(r.body);
    http_resp_free(&r);
    const json_t *c = json_object_get(msg, "content");
    CHECKF(!strcmp(json_string_value(json_object_get(s, "content")), json_is_string(c) ? json_string_value(c) : ""),
           "streamed content '%s' vs '%s'", json_string_value(json_object_get(s, "content")),
           json_is_string(c) ? json_string_value(c) : "(null)");
    CHECKF(!strcmp(json_string_value(json_object_get(s, "finish")), finish), "streamed finish %s vs %s",
           json_string_value(json_object_get(s, "finish")), finish);
    json_t *calls = json_object_get(msg, "tool_calls");
    json_t *scalls = json_object_get(s, "tool_calls");
    CHECKF(json_array_size(calls) == json_array_size(scalls), "%zu calls streamed, %zu not", json_array_size(scalls),
           json_array_size(calls));
    for (size_t i = 0; i < json_array_size(calls) && i < json_array_size(scalls); i++) {
        json_t *a = json_object_get(json_array_get(calls, i), "function"), *b = json_array_get(scalls, i);
        CHECK(!strcmp(json_string_value(json_object_get(a, "name")), json_string_value(json_object_get(b, "name"))));
        CHECK(!strcmp(json_string_value(json_object_get(a, "arguments")), json_string_value(json_object_get(b, "arguments"))));
        const char *id = str_or(json_object_get(b, "id"), "");
        CHECKF(!strncmp(id, "call_", 5) || strlen(id) == 9, "call id '%s'", id); /* 9 characters for Mistral */
    }
    json_decref(s);
    return msg;
}

static const char *call_name(const json_t *msg, size_t i) {
    return json_string_value(json_object_get(json_object_get(json_array_get(json_object_get(msg, "tool_calls"), i), "function"), "name"));
}

static json_t *call_args(const json_t *msg, size_t i) {
    const char *a = json_string_value(
        json_object_get(json_object_get(json_array_get(json_object_get(msg, "tool_calls"), i), "function"), "arguments"));
    return a ? json_loads(a, 0, NULL) : NULL;
}

static json_t *sse_anthropic(const char *body);

/* Enforced tool_choice on random weights (no script): the sampler follows the
   call format and the tool's schema, so every answer is a call of the right
   tool whose arguments parse and hold the required properties; streamed
   too. response_format json_schema / json_object likewise. */
static void enforced(void) {
    int n_done = 0;
    for (int k = 0; k < 3; k++) {
        char body[4096];
        snprintf(body, sizeof body,
                 "{" USER "," TOOLS ",\"max_tokens\":400,\"temperature\":%s,\"seed\":%d,\"tool_choice\":%s}",
                 k == 0 ? "0" : "1", k, k == 2 ? "{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}" : "\"required\"");
        int st;
        json_t *j = post("/v1/chat/completions", body, &st, NULL);
        CHECKF(st == 200, "status %d", st);
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0), *msg = json_object_get(ch, "message");
        const char *fin = str_or(json_object_get(ch, "finish_reason"), "");
        json_t *calls = json_object_get(msg, "tool_calls");
        if (strcmp(fin, "length")) n_done++;
        if (strcmp(fin, "length")) { /* unless max_tokens cut it: one call, arguments valid */
            CHECKF(!strcmp(fin, "tool_calls") && json_array_size(calls) == 1, "case %d: finish %s, %zu calls", k, fin,
                   json_array_size(calls));
            const char *name = call_name(msg, 0);
            json_t *a = call_args(msg, 0);
            CHECKF(json_is_object(a), "case %d: arguments %s", k,
                   str_or(json_object_get(json_object_get(json_array_get(calls, 0), "function"), "arguments"), "?"));
            if (k == 2) CHECK(name && !strcmp(name, "get_time"));
            if (name && !strcmp(name, "get_weather")) CHECK(json_is_string(json_object_get(a, "city")));
            json_decref(a);
        }
        json_decref(j);
    }
    fprintf(stderr, "enforced tool_choice: %d of 3 answers complete calls\n", n_done);
    /* a tool whose arguments are bounded (an enum, an integer, no free text) always completes */
    for (int k = 0; k < 2; k++) {
        char body[4096];
        snprintf(body, sizeof body,
                 "{" USER ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"pick\",\"parameters\":{\"type\":"
                 "\"object\",\"properties\":{\"color\":{\"enum\":[\"red\",\"green\"]},\"n\":{\"type\":\"integer\"}},"
                 "\"required\":[\"color\",\"n\"],\"additionalProperties\":false}}}],\"max_tokens\":300,\"temperature\":%d,"
                 "\"seed\":3,\"tool_choice\":\"required\"}",
                 k);
        int st;
        json_t *j = post("/v1/chat/completions", body, &st, NULL);
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0), *msg = json_object_get(ch, "message");
        json_t *a = call_args(msg, 0);
        const char *color = json_string_value(json_object_get(a, "color"));
        CHECKF(st == 200 && !strcmp(str_or(json_object_get(ch, "finish_reason"), ""), "tool_calls") &&
                   !strcmp(call_name(msg, 0) ? call_name(msg, 0) : "", "pick") && color &&
                   (!strcmp(color, "red") || !strcmp(color, "green")) && json_is_integer(json_object_get(a, "n")) &&
                   json_object_size(a) == 2,
               "bounded tool, temperature %d: status %d", k, st);
        json_decref(a);
        json_decref(j);
    }
    /* Anthropic any, streamed: a tool_use block whose streamed input parses */
    char body[4096];
    snprintf(body, sizeof body, "{\"max_tokens\":400,\"stream\":true," USER "," ATOOLS ",\"tool_choice\":{\"type\":\"any\"}}");
    http_resp r;
    http_request(g_port, "POST", "/v1/messages", body, &r);
    CHECK(r.status == 200);
    json_t *sm = sse_anthropic(r.body);
    http_resp_free(&r);
    const char *stop = str_or(json_object_get(sm, "stop_reason"), "");
    if (strcmp(stop, "max_tokens")) {
        json_t *blk = json_array_get(json_object_get(sm, "content"), 0);
        CHECKF(!strcmp(stop, "tool_use") && !strcmp(str_or(json_object_get(blk, "type"), ""), "tool_use") &&
                   json_is_object(json_object_get(blk, "input")),
               "anthropic any: stop %s", stop);
    }
    json_decref(sm);
    /* structured output */
    static const char *const formats[] = {
        "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"w\",\"strict\":true,\"schema\":{\"type\":\"object\","
        "\"properties\":{\"n\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]},"
        "\"maxItems\":2},\"ok\":{\"type\":\"boolean\"}},\"required\":[\"n\",\"tags\",\"ok\"],\"additionalProperties\":false}}}",
        "{\"type\":\"json_object\"}",
    };
    for (int k = 0; k < 2; k++) {
        snprintf(body, sizeof body, "{" USER ",\"max_tokens\":400,\"temperature\":1,\"seed\":7,\"response_format\":%s}",
                 formats[k]);
        int st;
        json_t *j = post("/v1/chat/completions", body, &st, NULL);
        CHECKF(st == 200, "status %d", st);
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
        const char *c = str_or(json_object_get(json_object_get(ch, "message"), "content"), "");
        CHECKF(k == 1 || strcmp(str_or(json_object_get(ch, "finish_reason"), ""), "length"),
               "a bounded schema ran out of tokens: %s", c);
        if (strcmp(str_or(json_object_get(ch, "finish_reason"), ""), "length")) {
            json_t *x = json_loads(c, 0, NULL);
            CHECKF(json_is_object(x), "format %d: content does not parse: %s", k, c);
            if (k == 0)
                CHECKF(json_is_integer(json_object_get(x, "n")) && json_is_array(json_object_get(x, "tags")) &&
                           json_is_boolean(json_object_get(x, "ok")) && json_object_size(x) == 3,
                       "format 0: %s", c);
            json_decref(x);
        }
        json_decref(j);
    }
}

static void openai_calls(void) {
    char fin[32];
    /* one call, text before it */
    json_t *m = chat_both("", "I will check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
                          fin, sizeof fin);
    CHECKF(!strcmp(fin, "tool_calls"), "finish %s", fin);
    CHECK(!strcmp(json_string_value(json_object_get(m, "content")), "I will check.\n"));
    CHECK(json_array_size(json_object_get(m, "tool_calls")) == 1 && !strcmp(call_name(m, 0), "get_weather"));
    json_t *a = call_args(m, 0);
    CHECK(json_is_object(a) && !strcmp(json_string_value(json_object_get(a, "city")), "Paris"));
    json_decref(a);
    const char *id = json_string_value(json_object_get(json_array_get(json_object_get(m, "tool_calls"), 0), "id"));
    CHECK(id && !strncmp(id, "call_", 5) && strlen(id) > 12);
    /* the arguments streamed as they were generated, not in one piece at the end */
    CHECKF(g_arg_chunks > 3, "arguments streamed in %d chunks", g_arg_chunks);
    json_decref(m);
    /* parallel calls, no text: content is null */
    const char *two = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n"
                      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    m = chat_both("", two, fin, sizeof fin);
    CHECK(!strcmp(fin, "tool_calls") && json_array_size(json_object_get(m, "tool_calls")) == 2);
    CHECK(json_is_null(json_object_get(m, "content")) || !strcmp(json_string_value(json_object_get(m, "content")), "\n"));
    CHECK(call_name(m, 1) && !strcmp(call_name(m, 1), "get_time"));
    const char *id0 = json_string_value(json_object_get(json_array_get(json_object_get(m, "tool_calls"), 0), "id"));
    const char *id1 = json_string_value(json_object_get(json_array_get(json_object_get(m, "tool_calls"), 1), "id"));
    CHECK(id0 && id1 && strcmp(id0, id1));
    json_decref(m);
    /* parallel_tool_calls false: the first call only */
    m = chat_both(",\"parallel_tool_calls\":false", two, fin, sizeof fin);
    CHECK(json_array_size(json_object_get(m, "tool_calls")) == 1 && !strcmp(call_name(m, 0), "get_weather"));
    json_decref(m);
    /* tool_choice none: no parsing, the text as it is */
    m = chat_both(",\"tool_choice\":\"none\"", two, fin, sizeof fin);
    CHECK(!json_object_get(m, "tool_calls") && !strcmp(json_string_value(json_object_get(m, "content")), two));
    CHECK(!strcmp(fin, "stop"));
    json_decref(m);
    /* malformed: content, markers and all */
    const char *bad = "Here: <tool_call>{\"name\": \"get_weather\", \"arguments\": }</tool_call> sorry";
    m = chat_both("", bad, fin, sizeof fin);
    CHECK(!json_object_get(m, "tool_calls") && !strcmp(json_string_value(json_object_get(m, "content")), bad));
    CHECK(!strcmp(fin, "stop"));
    json_decref(m);
    /* cut off by max_tokens inside the call: content, finish length */
    m = chat_both(",\"max_tokens\":30", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
                  fin, sizeof fin);
    const char *ct = json_string_value(json_object_get(m, "content"));
    CHECK(!json_object_get(m, "tool_calls") && ct && !strncmp(ct, "<tool_call>\n{\"name\"", 19));
    CHECKF(!strcmp(fin, "length"), "finish %s", fin);
    json_decref(m);
}

/* The call fed back: an assistant message with tool_calls, then the tool's
   result; the prompt grows by what the template renders for them. */
static void openai_results(void) {
    int st;
    const char *base = "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}%s]," TOOLS
                       ",\"max_tokens\":3,\"temperature\":0}";
    char body[4096];
    snprintf(body, sizeof body, base, "");
    json_t *j = post("/v1/chat/completions", body, &st, NULL);
    CHECK(st == 200);
    json_int_t p0 = json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens"));
    json_decref(j);
    snprintf(body, sizeof body, base,
             ",{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_abc\",\"type\":\"function\","
             "\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}}]},"
             "{\"role\":\"tool\",\"tool_call_id\":\"call_abc\",\"content\":\"18 C, sunny\"}");
    j = post("/v1/chat/completions", body, &st, NULL);
    CHECKF(st == 200, "status %d", st);
    json_int_t p1 = json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens"));
    /* the byte-level tokenizer: at least the result's and the call's text */
    CHECKF(p1 > p0 + (json_int_t)strlen("<tool_response>18 C, sunny</tool_response>{\"name\": \"get_weather\"}"),
           "prompt %lld -> %lld tokens", (long long)p0, (long long)p1);
    json_decref(j);
    /* tools kept out of the prompt with tool_choice none */
    snprintf(body, sizeof body, base, "");
    body[strlen(body) - 1] = 0;
    strcat(body, ",\"tool_choice\":\"none\"}");
    j = post("/v1/chat/completions", body, &st, NULL);
    json_int_t pn = json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens"));
    CHECKF(st == 200 && pn + 100 < p0, "tool_choice none: %lld prompt tokens, with tools %lld", (long long)pn, (long long)p0);
    json_decref(j);
}

/* ---- Anthropic ------------------------------------------------------------------------------ */

/* The streamed message rebuilt: {"content": [blocks], "stop_reason"}. */
static int g_json_deltas; /* input_json_delta events of the last streamed message */

static json_t *sse_anthropic(const char *body) {
    g_json_deltas = 0;
    json_t *blocks = json_array();
    const char *stop = "";
    char stop_b[32];
    bool ok = true;
    int open = -1;
    for (const char *p = body; (p = strstr(p, "event: "));) {
        const char *d = strstr(p, "data: ");
        if (!d) break;
        d += 6;
        const char *e = strstr(d, "\n\n");
        if (!e) break;
        json_t *j = json_loadb(d, (size_t)(e - d), 0, NULL);
        const char *ty = json_string_value(json_object_get(j, "type"));
        int idx = (int)json_integer_value(json_object_get(j, "index"));
        if (ty && !strcmp(ty, "content_block_start")) {
            ok &= open == -1 && idx == (int)json_array_size(blocks);
            json_t *cb = json_deep_copy(json_object_get(j, "content_block"));
            if (json_object_get(cb, "input")) json_object_set_new(cb, "partial", json_string(""));
            json_array_append_new(blocks, cb);
            open = idx;
        } else if (ty && !strcmp(ty, "content_block_delta")) {
            ok &= idx == open;
            json_t *cb = json_array_get(blocks, (size_t)idx), *dl = json_object_get(j, "delta");
            const char *dt = json_string_value(json_object_get(dl, "type"));
            const char *key = dt && !strcmp(dt, "text_delta") ? "text" : "partial";
            if (dt && !strcmp(dt, "input_json_delta")) g_json_deltas++;
            const char *piece = json_string_value(json_object_get(dl, dt && !strcmp(dt, "text_delta") ? "text" : "partial_json"));
            const char *have = json_string_value(json_object_get(cb, key));
            ok &= have && piece;
            if (have && piece) {
                char *cat = malloc(strlen(have) + strlen(piece) + 1);
                strcpy(cat, have);
                strcat(cat, piece);
                json_object_set_new(cb, key, json_string(cat));
                free(cat);
            }
        } else if (ty && !strcmp(ty, "content_block_stop")) {
            ok &= idx == open;
            json_t *cb = json_array_get(blocks, (size_t)idx);
            if (json_object_get(cb, "partial")) {
                json_t *in = json_loads(json_string_value(json_object_get(cb, "partial")), 0, NULL);
                ok &= json_is_object(in);
                json_object_set_new(cb, "input", in ? in : json_null());
                json_object_del(cb, "partial");
            }
            open = -1;
        } else if (ty && !strcmp(ty, "message_delta")) {
            snprintf(stop_b, sizeof stop_b, "%s", str_or(json_object_get(json_object_get(j, "delta"), "stop_reason"), ""));
            stop = stop_b;
        }
        json_decref(j);
        p = e;
    }
    CHECK(ok);
    return json_pack("{s:o, s:s}", "content", blocks, "stop_reason", stop);
}

/* Same blocks, ids aside (every request makes its own). */
static bool same_blocks(const json_t *a, const json_t *b) {
    if (json_array_size(a) != json_array_size(b)) return false;
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *x = json_deep_copy(json_array_get(a, i)), *y = json_deep_copy(json_array_get(b, i));
        json_object_del(x, "id");
        json_object_del(y, "id");
        bool eq = json_equal(x, y);
        json_decref(x);
        json_decref(y);
        if (!eq) return false;
    }
    return true;
}

static json_t *messages_both(const char *msgs, const char *extra, const char *script) {
    char body[8192];
    json_t *sj = json_string(script);
    char *sq = json_dumps(sj, JSON_ENCODE_ANY);
    json_decref(sj);
    snprintf(body, sizeof body, "{\"max_tokens\":300,%s," ATOOLS "%s,\"ember_test_output\":%s}", msgs, extra, sq);
    int st;
    json_t *j = post("/v1/messages", body, &st, NULL);
    CHECKF(st == 200, "status %d: %s", st, body);
    snprintf(body, sizeof body, "{\"max_tokens\":300,\"stream\":true,%s," ATOOLS "%s,\"ember_test_output\":%s}", msgs,
             extra, sq);
    free(sq);
    http_resp r;
    http_request(g_port, "POST", "/v1/messages", body, &r);
    CHECK(r.status == 200);
    json_t *s = sse_anthropic(r.body);
    http_resp_free(&r);
    CHECKF(same_blocks(json_object_get(j, "content"), json_object_get(s, "content")), "streamed blocks differ");
    CHECK(!strcmp(str_or(json_object_get(j, "stop_reason"), "?"),
                  json_string_value(json_object_get(s, "stop_reason"))));
    json_decref(s);
    return j;
}

static void anthropic_calls(void) {
    const char *two = "Checking both.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n"
                      "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    json_t *j = messages_both(USER, "", two);
    json_t *c = json_object_get(j, "content");
    CHECK(!strcmp(json_string_value(json_object_get(j, "stop_reason")), "tool_use"));
    CHECKF(json_array_size(c) == 4, "%zu blocks", json_array_size(c)); /* text, tool_use, "\n", tool_use */
    json_t *t0 = json_array_get(c, 0), *u1 = json_array_get(c, 1), *u3 = json_array_get(c, 3);
    CHECK(!strcmp(json_string_value(json_object_get(t0, "type")), "text") &&
          !strcmp(json_string_value(json_object_get(t0, "text")), "Checking both."));
    CHECK(!strcmp(json_string_value(json_object_get(u1, "type")), "tool_use") &&
          !strcmp(json_string_value(json_object_get(u1, "name")), "get_weather") &&
          !strcmp(json_string_value(json_object_get(json_object_get(u1, "input"), "city")), "Rome"));
    CHECK(!strncmp(json_string_value(json_object_get(u1, "id")), "toolu_", 6));
    CHECKF(g_json_deltas > 3, "input streamed in %d input_json_delta events", g_json_deltas);
    CHECK(json_is_object(json_object_get(u3, "input")) && !strcmp(json_string_value(json_object_get(u3, "name")), "get_time"));
    const char *use_id = json_string_value(json_object_get(u1, "id"));
    /* the call fed back as tool_use and tool_result blocks */
    char msgs[2048];
    snprintf(msgs, sizeof msgs,
             "\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Rome?\"},{\"role\":\"assistant\",\"content\":[{"
             "\"type\":\"text\",\"text\":\"Checking.\"},{\"type\":\"tool_use\",\"id\":\"%s\",\"name\":\"get_weather\","
             "\"input\":{\"city\":\"Rome\"}}]},{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":"
             "\"%s\",\"content\":\"21 C\"},{\"type\":\"text\",\"text\":\"And now?\"}]}]",
             use_id, use_id);
    json_t *k = messages_both(msgs, "", "It is 21 C in Rome.");
    CHECK(!strcmp(json_string_value(json_object_get(k, "stop_reason")), "end_turn"));
    CHECK(json_array_size(json_object_get(k, "content")) == 1 &&
          !strcmp(json_string_value(json_object_get(json_array_get(json_object_get(k, "content"), 0), "text")),
                  "It is 21 C in Rome."));
    CHECK(json_integer_value(json_object_get(json_object_get(k, "usage"), "input_tokens")) >
          json_integer_value(json_object_get(json_object_get(j, "usage"), "input_tokens")));
    json_decref(k);
    json_decref(j);
    /* disable_parallel_tool_use: one call; a cut-off call: text, max_tokens */
    j = messages_both(USER, ",\"tool_choice\":{\"type\":\"auto\",\"disable_parallel_tool_use\":true}", two);
    c = json_object_get(j, "content");
    int uses = 0;
    for (size_t i = 0; i < json_array_size(c); i++)
        uses += !strcmp(json_string_value(json_object_get(json_array_get(c, i), "type")), "tool_use");
    CHECK(uses == 1);
    json_decref(j);
    j = messages_both(USER, ",\"max_tokens\":20", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>");
    /* max_tokens given twice: the later one wins in jansson, 20 */
    c = json_object_get(j, "content");
    CHECK(json_array_size(c) == 1 && !strcmp(json_string_value(json_object_get(json_array_get(c, 0), "type")), "text"));
    CHECK(!strcmp(json_string_value(json_object_get(j, "stop_reason")), "max_tokens"));
    json_decref(j);
}


/* Enforced tool_choice with the Qwen3-Coder format on random weights: one
   complete call of a tool of the request, its required parameters there with
   their types (a string as raw text, an integer and an enum as JSON), in
   time for max_tokens; a constrained string parameter is refused. */
static void coder_enforced(void) {
    static const char tools[] =
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"book\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"city\":{\"type\":\"string\"},\"nights\":{\"type\":\"integer\",\"minimum\":1,"
        "\"maximum\":9},\"note\":{\"type\":\"string\"},\"room\":{\"enum\":[\"single\",\"double\"]}},\"required\":"
        "[\"city\",\"nights\",\"room\"]}}},{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"parameters\":"
        "{\"type\":\"object\",\"properties\":{}}}}]";
    for (int k = 0; k < 4; k++) {
        char body[4096];
        snprintf(body, sizeof body, "{" USER ",%s,\"max_tokens\":%d,\"temperature\":1,\"seed\":%d,\"tool_choice\":%s}",
                 tools, k % 2 ? 160 : 300, k,
                 k >= 2 ? "{\"type\":\"function\",\"function\":{\"name\":\"book\"}}" : "\"required\"");
        int st;
        json_t *j = post("/v1/chat/completions", body, &st, NULL);
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0), *msg = json_object_get(ch, "message");
        const char *fin = str_or(json_object_get(ch, "finish_reason"), ""), *name = call_name(msg, 0);
        CHECKF(st == 200 && !strcmp(fin, "tool_calls") && name, "qwen3_coder enforced %d: status %d, finish %s", k, st, fin);
        json_t *a = call_args(msg, 0);
        CHECKF(json_is_object(a), "qwen3_coder enforced %d: arguments", k);
        if (name && !strcmp(name, "book")) {
            json_t *n = json_object_get(a, "nights");
            const char *room = json_string_value(json_object_get(a, "room"));
            CHECKF(json_is_string(json_object_get(a, "city")) && json_is_integer(n) && json_integer_value(n) >= 1 &&
                       json_integer_value(n) <= 9 && room && (!strcmp(room, "single") || !strcmp(room, "double")),
                   "qwen3_coder enforced %d: book's arguments %s", k,
                   str_or(json_object_get(json_object_get(json_array_get(json_object_get(msg, "tool_calls"), 0), "function"),
                                          "arguments"),
                          "?"));
        }
        if (k >= 2) CHECK(name && !strcmp(name, "book"));
        json_decref(a);
        json_decref(j);
    }
    int st;
    json_t *j = post("/v1/chat/completions",
                     "{" USER ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":"
                     "\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":3}},\"required\":[\"a\"]}}}],"
                     "\"tool_choice\":\"required\"}",
                     &st, NULL);
    const char *msg = str_or(json_object_get(json_object_get(j, "error"), "message"), "");
    CHECKF(st == 400 && strstr(msg, "raw text"), "qwen3_coder: a constrained string parameter: %d %s", st, msg);
    json_decref(j);
}

/* Enforced tool_choice with the Gemma 4 format on random weights: one
   complete call of a tool of the request (the named one when named), its
   required parameters there with their types, optional ones within their
   limits; bounds Gemma's grammar cannot carry are refused by name. */
static void gemma_enforced(void) {
    static const char tools[] =
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"book\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":12},\"nights\":{\"type\":\"integer\"},"
        "\"room\":{\"type\":\"string\",\"enum\":[\"single\",\"double\"]},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\","
        "\"maxLength\":5},\"maxItems\":2},\"vip\":{\"type\":\"boolean\"}},\"required\":[\"city\",\"nights\",\"room\"]}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{}}}}]";
    for (int k = 0; k < 4; k++) {
        char body[4096];
        snprintf(body, sizeof body, "{" USER ",%s,\"max_tokens\":%d,\"temperature\":1,\"seed\":%d,\"tool_choice\":%s}",
                 tools, k % 2 ? 120 : 200, k,
                 k >= 2 ? "{\"type\":\"function\",\"function\":{\"name\":\"book\"}}" : "\"required\"");
        int st;
        json_t *j = post("/v1/chat/completions", body, &st, NULL);
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0), *msg = json_object_get(ch, "message");
        const char *fin = str_or(json_object_get(ch, "finish_reason"), ""), *name = call_name(msg, 0);
        CHECKF(st == 200 && !strcmp(fin, "tool_calls") && name, "gemma4 enforced %d: status %d, finish %s (%s)", k, st,
               fin, str_or(json_object_get(json_object_get(j, "error"), "message"), str_or(json_object_get(msg, "content"), "")));
        json_t *a = call_args(msg, 0);
        CHECKF(json_is_object(a), "gemma4 enforced %d: arguments", k);
        if (name && !strcmp(name, "book")) {
            const char *city = json_string_value(json_object_get(a, "city")), *room = json_string_value(json_object_get(a, "room"));
            json_t *tags = json_object_get(a, "tags"), *vip = json_object_get(a, "vip");
            bool tags_ok = !tags || (json_is_array(tags) && json_array_size(tags) <= 2);
            for (size_t i = 0; tags_ok && i < json_array_size(tags); i++)
                tags_ok = json_is_string(json_array_get(tags, i)) && json_string_length(json_array_get(tags, i)) <= 5 * 4;
            CHECKF(city && json_is_integer(json_object_get(a, "nights")) && room &&
                       (!strcmp(room, "single") || !strcmp(room, "double")) && tags_ok && (!vip || json_is_boolean(vip)),
                   "gemma4 enforced %d: book's arguments %s", k,
                   str_or(json_object_get(json_object_get(json_array_get(json_object_get(msg, "tool_calls"), 0), "function"),
                                          "arguments"),
                          "?"));
        }
        if (k >= 2) CHECK(name && !strcmp(name, "book"));
        json_decref(a);
        json_decref(j);
    }
    static const char *const refused[][2] = {
        {"{\"type\":\"integer\",\"minimum\":1}", "minimum"},
        {"{\"type\":\"string\",\"pattern\":\"^a+$\"}", "pattern"},
        {"{\"type\":\"string\",\"format\":\"date\"}", "format"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        char body[1024];
        snprintf(body, sizeof body,
                 "{" USER ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":"
                 "\"object\",\"properties\":{\"a\":%s},\"required\":[\"a\"]}}}],\"tool_choice\":\"required\"}",
                 refused[i][0]);
        int st;
        json_t *j = post("/v1/chat/completions", body, &st, NULL);
        const char *msg = str_or(json_object_get(json_object_get(j, "error"), "message"), "");
        CHECKF(st == 400 && strstr(msg, refused[i][1]), "gemma4: %s: %d %s", refused[i][0], st, msg);
        json_decref(j);
    }
}

/* ---- every family's real template: tools rendered, its call format parsed, the call fed back ---- */

static void families(ember_model *m, ember_tokenizer *tok) {
    static const struct {
        const char *file, *script;
        ember_tool_format want;
    } fam[] = {
        {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", EMBER_TOOLS_HERMES},
        {"Qwen3-Coder.jinja",
         "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
         EMBER_TOOLS_QWEN3_CODER},
        {"meta-llama-Llama-3.1-8B-Instruct.jinja", "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
         EMBER_TOOLS_LLAMA3},
        {"mistralai-Mistral-Nemo-Instruct-2407.jinja",
         "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]", EMBER_TOOLS_MISTRAL},
        {"google-gemma-4-31B-it.jinja", "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>",
         EMBER_TOOLS_GEMMA4},
    };
    for (size_t f = 0; f < sizeof fam / sizeof fam[0]; f++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/testdata/chat-templates/llama.cpp/%s", EMBER_SHARED_DIR, fam[f].file);
        char *tpl = NULL;
        size_t len = 0;
        ember_error err = {0};
        if (ember_read_file(path, 1 << 20, &tpl, &len, &err)) {
            fprintf(stderr, "note: %s absent\n", fam[f].file);
            continue;
        }
        ember_chat_template *t = NULL;
        CHECKF(ember_chat_template_compile(tpl, len, &t, &err) == EMBER_OK, "%s: %s", fam[f].file, err.msg);
        ember_tool_format d = ember_tool_format_detect(tpl, len);
        free(tpl);
        CHECK(d == fam[f].want);
        if (!t) continue;
        ember_server *s = start(m, tok, t, d, true);
        char fin[32];
        json_t *msg = chat_both("", fam[f].script, fin, sizeof fin);
        CHECKF(!strcmp(fin, "tool_calls") && call_name(msg, 0) && !strcmp(call_name(msg, 0), "get_weather"),
               "%s: finish %s", fam[f].file, fin);
        json_t *a = call_args(msg, 0);
        CHECKF(json_is_object(a) && !strcmp(str_or(json_object_get(a, "city"), ""), "Paris"), "%s: arguments", fam[f].file);
        json_decref(a);
        /* the answer fed back with the tool's result renders through the same template */
        json_t *calls = json_object_get(msg, "tool_calls");
        const char *id = str_or(json_object_get(json_array_get(calls, 0), "id"), "");
        if (d == EMBER_TOOLS_MISTRAL) CHECKF(strlen(id) == 9, "mistral call id '%s'", id);
        json_t *body = json_pack("{s:[{s:s, s:s}, {s:s, s:O}, {s:s, s:s, s:s, s:s}], s:i}", "messages", "role", "user",
                                 "content", "Weather in Paris?", "role", "assistant", "tool_calls", calls, "role", "tool",
                                 "tool_call_id", id, "name", "get_weather", "content", "18 C", "max_tokens", 2);
        json_t *wrap = json_loads("{" TOOLS "}", 0, NULL);
        json_object_set(body, "tools", json_object_get(wrap, "tools"));
        json_decref(wrap);
        char *text = json_dumps(body, JSON_COMPACT);
        int st;
        json_t *j = post("/v1/chat/completions", text, &st, NULL);
        CHECKF(st == 200, "%s: the call fed back: status %d %s", fam[f].file, st,
               str_or(json_object_get(json_object_get(j, "error"), "message"), ""));
        json_decref(j);
        free(text);
        json_decref(body);
        json_decref(msg);
        if (d == EMBER_TOOLS_QWEN3_CODER) coder_enforced();
        if (d == EMBER_TOOLS_GEMMA4) gemma_enforced();
        ember_server_stop(s, 5.0);
        ember_chat_template_free(t);
    }
}

int main(void) {
    qwen_demo d;
    if (!qwen_demo_load("server_tools_demo", &d)) return 77;
    ember_model *m = d.m;
    ember_tokenizer *tok = d.tok;
    ember_chat_template *tmpl = d.tmpl;
    ember_tool_format f = d.fmt;
    const char *dir = d.dir;
    ember_error err = {0};

    ember_server *s = start(m, tok, tmpl, f, true);
    hostile();
    openai_calls();
    openai_results();
    anthropic_calls();
    enforced();
    ember_server_stop(s, 5.0);

    /* without the hook the field is refused */
    s = start(m, tok, tmpl, f, false);
    int st;
    json_t *j = post("/v1/chat/completions", "{" USER ",\"ember_test_output\":\"x\"}", &st, NULL);
    CHECK(st == 400 && strstr(json_string_value(json_object_get(json_object_get(j, "error"), "message")), "test hook"));
    json_decref(j);
    ember_server_stop(s, 5.0);

    /* --tool-parser's override: the Mistral format, whatever the template; and
       its marker as a special token (added to a copy of the tokenizer), which the
       text keeps for the parser where other special tokens are dropped */
    char tdir[700], p1[800], p2[800];
    snprintf(tdir, sizeof tdir, "%s/server_tools_tok", EMBER_TEST_TMP);
    char cmd2[2200];
    snprintf(cmd2, sizeof cmd2, "mkdir -p %s && cp %s/tokenizer_config.json %s/", tdir, dir, tdir);
    CHECK(system(cmd2) == 0);
    snprintf(p1, sizeof p1, "%s/tokenizer.json", dir);
    snprintf(p2, sizeof p2, "%s/tokenizer.json", tdir);
    json_t *tj = json_load_file(p1, 0, NULL);
    json_t *added = json_object_get(tj, "added_tokens");
    json_int_t next_id = 0;
    for (size_t i = 0; i < json_array_size(added); i++)
        if (json_integer_value(json_object_get(json_array_get(added, i), "id")) >= next_id)
            next_id = json_integer_value(json_object_get(json_array_get(added, i), "id")) + 1;
    json_array_append_new(added, json_pack("{s:I, s:s, s:b, s:b, s:b, s:b, s:b}", "id", next_id, "content",
                                           "[TOOL_CALLS]", "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
                                           "special", 1));
    CHECK(json_dump_file(tj, p2, 0) == 0);
    json_decref(tj);
    ember_tokenizer *tok2;
    CHECKF(ember_tok_load(tdir, &tok2, &err) == EMBER_OK, "%s", err.msg);
    int32_t mark = ember_tok_text_id(tok2, "[TOOL_CALLS]", 12);
    CHECK(mark == (int32_t)next_id && ember_tok_is_special(tok2, mark));
    s = start(m, tok2, tmpl, EMBER_TOOLS_MISTRAL, true);
    char fin[32];
    json_t *msg = chat_both("", "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Lima\"}", fin, sizeof fin);
    CHECK(!strcmp(fin, "tool_calls") && call_name(msg, 0) && !strcmp(call_name(msg, 0), "get_weather"));
    json_decref(msg);
    msg = chat_both("", "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>", fin, sizeof fin);
    CHECK(!json_object_get(msg, "tool_calls") && !strcmp(fin, "stop")); /* not this format: text */
    json_decref(msg);
    /* without tools the marker token is dropped from the text, as every special token */
    j = post("/v1/chat/completions",
             "{" USER ",\"max_tokens\":50,\"ember_test_output\":\"[TOOL_CALLS]get_time[ARGS]{}\"}", &st, NULL);
    const char *plain = json_string_value(
        json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message"), "content"));
    CHECKF(st == 200 && plain && !strcmp(plain, "get_time[ARGS]{}"), "content '%s'", plain ? plain : "");
    json_decref(j);
    ember_server_stop(s, 5.0);
    ember_tok_free(tok2);

    families(m, tok);

    qwen_demo_free(&d);
    return test_done();
}
