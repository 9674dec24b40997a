/*
 * test_server_responses.c - OpenAI's Responses API (POST /v1/responses)
 * through the HTTP server, in process, on the demo model (random weights)
 * with Qwen2.5's real chat template (shared/testdata), which renders tools
 * and writes calls as <tool_call>{json}</tool_call>:
 *   - a hostile table: bad input types, unknown item types, bad tools,
 *     tool_choice, text.format and sampling fields, unsupported features,
 *     an unknown previous_response_id: each 400 with a JSON error whose
 *     param names the field, the server alive after;
 *   - text, non-streamed and streamed (driven by the test-only
 *     "ember_test_output" hook, as test_server_tools does): the typed events
 *     in order with consecutive sequence numbers, the deltas joining into
 *     the items of the final response, which equals the non-streamed one;
 *     max_output_tokens cutting the answer (status incomplete);
 *   - a function call round trip: function_call items (call_id, name,
 *     arguments streamed in pieces), the call and its output fed back as
 *     items and through previous_response_id (and refused after
 *     store: false); parallel_tool_calls false;
 *   - enforced tool_choice (required, named) and text.format json_schema on
 *     random weights: the constrained sampler makes valid calls and JSON.
 * Skipped (77) when shared/testdata is absent.
 */
#include "server_util.h"

#include "core/mapfile.h"
#include "core/util.h"
#include "ember.h"
#include "serve/serve.h"
#include "test.h"

static const char *str_or(const json_t *j, const char *dflt) {
    return json_is_string(j) ? json_string_value(j) : dflt;
}

#define TOOLS                                                                                                         \
    "\"tools\":[{\"type\":\"function\",\"name\":\"get_weather\",\"description\":\"Weather of a city\",\"parameters\":" \
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}},{\"type\":"        \
    "\"function\",\"name\":\"get_time\",\"description\":\"The time\",\"parameters\":{\"type\":\"object\","           \
    "\"properties\":{}}}]"
#define INPUT "\"input\":\"Weather in Paris?\""

typedef struct bad_case {
    const char *body, *param, *needle; /* param: error.param (NULL: null); needle: in the message */
} bad_case;

static void hostile(void) {
    static const bad_case cases[] = {
        {"{\"model\":\"demo\"}", "input", "required"},
        {"{\"input\":5}", "input", "string"},
        {"{\"input\":[]}", "input", "empty"},
        {"{\"input\":[5]}", "input", "object"},
        {"{\"input\":[{\"type\":\"foo\"}]}", "input", "foo"},
        {"{\"input\":[{\"type\":7}]}", "input", "type"},
        {"{\"input\":[{\"type\":\"item_reference\",\"id\":\"x\"}]}", "input", "item_reference"},
        {"{\"input\":[{\"role\":\"robot\",\"content\":\"x\"}]}", "input", "role"},
        {"{\"input\":[{\"role\":\"user\",\"content\":5}]}", "input", "content"},
        {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":\"x\"}]}]}", "input",
         "input_image"},
        {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\"}]}]}", "input", "text"},
        {"{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"x\"}]}", "input",
         "no function_call"},
        {"{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c1\",\"arguments\":\"{}\"}]}", "input", "name"},
        {"{\"input\":[{\"type\":\"function_call\",\"name\":\"f\",\"arguments\":\"{}\"}]}", "input", "call_id"},
        {"{\"input\":[{\"role\":\"user\",\"content\":\"x\"},{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":"
         "\"f\",\"arguments\":\"[1]\"}]}",
         "input", "input[1].arguments must be JSON text of an object"},
        {"{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{}\"},{\"type\":"
         "\"function_call_output\",\"call_id\":\"c1\",\"output\":5}]}",
         "input", "output"},
        {"{" INPUT ",\"instructions\":5}", "instructions", "string"},
        {"{" INPUT ",\"tools\":{}}", "tools", "array"},
        {"{" INPUT ",\"tools\":[{\"type\":\"web_search\"}]}", "tools", "function"},
        {"{" INPUT ",\"tools\":[{\"type\":\"function\",\"name\":\"bad name\"}]}", "tools", "name"},
        {"{" INPUT ",\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":[]}]}", "tools", "parameters"},
        {"{" INPUT "," TOOLS ",\"tool_choice\":\"sometimes\"}", "tool_choice", "sometimes"},
        {"{" INPUT "," TOOLS ",\"tool_choice\":{\"type\":\"file_search\"}}", "tool_choice", "function"},
        {"{" INPUT "," TOOLS ",\"tool_choice\":{\"type\":\"function\",\"name\":\"nope\"}}", "tool_choice", "nope"},
        {"{" INPUT ",\"tool_choice\":\"required\"}", "tool_choice", "tools"},
        {"{" INPUT "," TOOLS ",\"parallel_tool_calls\":\"no\"}", "parallel_tool_calls", "boolean"},
        {"{" INPUT ",\"text\":5}", "text", "object"},
        {"{" INPUT ",\"text\":{\"format\":{\"type\":\"yaml\"}}}", "text.format", "yaml"},
        {"{" INPUT ",\"text\":{\"format\":{\"type\":\"json_schema\",\"schema\":{}}}}", "text.format", "name"},
        {"{" INPUT ",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"x\",\"schema\":{\"type\":\"integer\","
         "\"multipleOf\":2}}}}",
         "text.format", "multipleOf"},
        {"{" INPUT "," TOOLS ",\"tool_choice\":\"required\",\"text\":{\"format\":{\"type\":\"json_object\"}}}",
         "text.format", "tool_choice"},
        {"{" INPUT ",\"max_output_tokens\":\"x\"}", "max_output_tokens", "integer"},
        {"{" INPUT ",\"max_output_tokens\":0}", "max_output_tokens", "between"},
        {"{" INPUT ",\"temperature\":3}", "temperature", "between"},
        {"{" INPUT ",\"top_p\":\"x\"}", "top_p", "number"},
        {"{" INPUT ",\"stream\":1}", "stream", "boolean"},
        {"{" INPUT ",\"store\":\"yes\"}", "store", "boolean"},
        {"{" INPUT ",\"previous_response_id\":\"resp_none\"}", "previous_response_id", "resp_none"},
        {"{" INPUT ",\"previous_response_id\":5}", "previous_response_id", "string"},
        {"{" INPUT ",\"background\":true}", "background", "background"},
        {"{" INPUT ",\"conversation\":\"conv_1\"}", "conversation", "previous_response_id"},
        {"{" INPUT ",\"metadata\":{\"a\":1}}", "metadata", "string"},
        {"{" INPUT ",\"reasoning\":5}", "reasoning", "object"},
        {"{" INPUT ",\"truncation\":\"sometimes\"}", "truncation", "auto"},
        {"{" INPUT ",\"top_logprobs\":3}", "top_logprobs", "not supported"},
        {"{" INPUT ",\"model\":5}", "model", "string"},
        {"[1]", NULL, "object"},
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n; i++) {
        int st;
        json_t *j = post("/v1/responses", cases[i].body, &st, NULL);
        const json_t *err = json_object_get(j, "error");
        const char *msg = json_string_value(json_object_get(err, "message"));
        const char *param = json_string_value(json_object_get(err, "param"));
        CHECKF(st == 400 && msg && !strcmp(str_or(json_object_get(err, "type"), ""), "invalid_request_error"),
               "case %d (%.70s): status %d", i, cases[i].body, st);
        if (cases[i].param)
            CHECKF(param && !strcmp(param, cases[i].param), "case %d: param %s, want %s (%s)", i, param ? param : "null",
                   cases[i].param, msg ? msg : "");
        else
            CHECKF(json_is_null(json_object_get(err, "param")), "case %d: param %s", i, param ? param : "?");
        if (msg && cases[i].needle)
            CHECKF(strstr(msg, cases[i].needle), "case %d: message '%s' lacks '%s'", i, msg, cases[i].needle);
        json_decref(j);
    }
    CHECK(health() == 200);
    fprintf(stderr, "%d hostile Responses requests answered 400\n", n);
}

/* ---- the stream rebuilt --------------------------------------------------------------------- */

static int g_arg_deltas, g_text_deltas;

/* The streamed answer checked and rebuilt: each event's type matches its
   SSE name and its sequence_number follows the last; items open and close
   in order, their deltas joining into the text / arguments of the done
   item. Returns {"response": the terminal event's response, "items": the
   items as the events built them, "terminal": its type}. */
static json_t *sse_responses(const char *body) {
    g_arg_deltas = g_text_deltas = 0;
    json_t *items = json_array(), *resp = NULL;
    json_t *open = NULL; /* the item being built */
    char acc[8192] = "", terminal[64] = "";
    long seq = 0;
    bool ok = true, created = false;
    for (const char *p = body; (p = strstr(p, "event: "));) {
        p += 7;
        const char *nl = strchr(p, '\n');
        if (!nl || strncmp(nl + 1, "data: ", 6)) {
            ok = false;
            break;
        }
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(nl - p), p);
        const char *d = nl + 7, *e = strstr(d, "\n\n");
        if (!e) {
            ok = false;
            break;
        }
        json_t *j = json_loadb(d, (size_t)(e - d), 0, NULL);
        const char *ty = str_or(json_object_get(j, "type"), "");
        CHECKF(j && !strcmp(ty, name), "event %s carries type %s", name, ty);
        CHECKF(json_integer_value(json_object_get(j, "sequence_number")) == seq, "event %s: sequence_number %lld, want %ld",
               name, (long long)json_integer_value(json_object_get(j, "sequence_number")), seq);
        seq++;
        if (!strcmp(ty, "response.created")) {
            ok &= seq == 1 && !strcmp(str_or(json_object_get(json_object_get(j, "response"), "status"), ""), "in_progress");
            created = true;
        } else if (!strcmp(ty, "response.in_progress")) {
            ok &= seq == 2;
        } else if (!strcmp(ty, "response.output_item.added")) {
            ok &= open == NULL && json_integer_value(json_object_get(j, "output_index")) == (json_int_t)json_array_size(items);
            open = json_deep_copy(json_object_get(j, "item"));
            acc[0] = 0;
        } else if (!strcmp(ty, "response.content_part.added")) {
            ok &= open && !strcmp(str_or(json_object_get(j, "item_id"), ""), str_or(json_object_get(open, "id"), "?"));
        } else if (!strcmp(ty, "response.output_text.delta") || !strcmp(ty, "response.function_call_arguments.delta")) {
            ok &= open && !strcmp(str_or(json_object_get(j, "item_id"), ""), str_or(json_object_get(open, "id"), "?"));
            strncat(acc, str_or(json_object_get(j, "delta"), ""), sizeof acc - strlen(acc) - 1);
            if (ty[9] == 'f') g_arg_deltas++;
            else g_text_deltas++;
        } else if (!strcmp(ty, "response.output_text.done")) {
            CHECKF(!strcmp(str_or(json_object_get(j, "text"), "?"), acc), "text.done '%s', deltas '%s'",
                   str_or(json_object_get(j, "text"), "?"), acc);
        } else if (!strcmp(ty, "response.function_call_arguments.done")) {
            CHECKF(!strcmp(str_or(json_object_get(j, "arguments"), "?"), acc), "arguments.done '%s', deltas '%s'",
                   str_or(json_object_get(j, "arguments"), "?"), acc);
        } else if (!strcmp(ty, "response.content_part.done")) {
            ok &= open != NULL;
        } else if (!strcmp(ty, "response.output_item.done")) {
            json_t *it = json_object_get(j, "item");
            ok &= open && !strcmp(str_or(json_object_get(it, "id"), ""), str_or(json_object_get(open, "id"), "?"));
            const char *ity = str_or(json_object_get(it, "type"), "");
            const char *built = !strcmp(ity, "message")
                                    ? str_or(json_object_get(json_array_get(json_object_get(it, "content"), 0), "text"), "?")
                                    : str_or(json_object_get(it, "arguments"), "?");
            CHECKF(!strcmp(built, acc), "item done with '%s', deltas '%s'", built, acc);
            json_array_append(items, it);
            json_decref(open);
            open = NULL;
        } else if (!strcmp(ty, "response.completed") || !strcmp(ty, "response.incomplete") ||
                   !strcmp(ty, "response.failed")) {
            resp = json_incref(json_object_get(j, "response"));
            snprintf(terminal, sizeof terminal, "%s", ty);
        } else if (strcmp(ty, "error")) {
            CHECKF(0, "unexpected event %s", ty);
        }
        json_decref(j);
        p = e;
    }
    CHECK(ok && created && open == NULL && resp && !strstr(body, "[DONE]"));
    json_decref(open);
    return json_pack("{s:o, s:o, s:s}", "response", resp ? resp : json_null(), "items", items, "terminal", terminal);
}

/* Items equal but for their ids (every response makes its own). */
static bool same_items(const json_t *a, const json_t *b) {
    if (json_array_size(a) != json_array_size(b)) return false;
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *x = json_deep_copy(json_array_get(a, i)), *y = json_deep_copy(json_array_get(b, i));
        json_object_del(x, "id");
        json_object_del(y, "id");
        json_object_del(x, "call_id");
        json_object_del(y, "call_id");
        bool eq = json_equal(x, y);
        json_decref(x);
        json_decref(y);
        if (!eq) return false;
    }
    return true;
}

/* body with ,"ember_test_output": script (JSON-quoted) before its last brace. */
static char *with_script(const char *body, const char *script, bool stream) {
    json_t *j = json_loads(body, 0, NULL);
    CHECKF(j != NULL, "test body does not parse: %s", body);
    if (script) json_object_set_new(j, "ember_test_output", json_string(script));
    if (stream) json_object_set_new(j, "stream", json_true());
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}

/* One request both ways; checks that they agree; returns the non-streamed
   response. */
static json_t *both(const char *body, const char *script) {
    char *b = with_script(body, script, false);
    int st;
    json_t *j = post("/v1/responses", b, &st, NULL);
    CHECKF(st == 200, "status %d (%s) for %s", st, str_or(json_object_get(json_object_get(j, "error"), "message"), ""), b);
    free(b);
    b = with_script(body, script, true);
    http_resp r;
    http_request(g_port, "POST", "/v1/responses", b, &r);
    free(b);
    CHECK(r.status == 200);
    json_t *s = sse_responses(r.body ? r.body : "");
    http_resp_free(&r);
    json_t *sr = json_object_get(s, "response");
    const char *status = str_or(json_object_get(j, "status"), "?");
    CHECKF(!strcmp(status, str_or(json_object_get(sr, "status"), "")), "status %s, streamed %s", status,
           str_or(json_object_get(sr, "status"), ""));
    char want[64];
    snprintf(want, sizeof want, "response.%s", status);
    CHECKF(!strcmp(json_string_value(json_object_get(s, "terminal")), want), "terminal event %s, status %s",
           json_string_value(json_object_get(s, "terminal")), status);
    CHECKF(same_items(json_object_get(j, "output"), json_object_get(sr, "output")), "streamed output differs");
    CHECKF(same_items(json_object_get(s, "items"), json_object_get(sr, "output")),
           "the events' items differ from the final response's");
    CHECK(json_equal(json_object_get(j, "usage"), json_object_get(sr, "usage")) ||
          json_integer_value(json_object_get(json_object_get(j, "usage"), "output_tokens")) ==
              json_integer_value(json_object_get(json_object_get(sr, "usage"), "output_tokens")));
    json_decref(s);
    return j;
}

static const json_t *item(const json_t *resp, size_t i) {
    return json_array_get(json_object_get(resp, "output"), i);
}

static const char *item_text(const json_t *it) {
    return str_or(json_object_get(json_array_get(json_object_get(it, "content"), 0), "text"), NULL);
}

static void text(void) {
    json_t *j = both("{\"model\":\"demo\"," INPUT ",\"instructions\":\"Be brief.\",\"metadata\":{\"k\":\"v\"}}",
                     "It is sunny.");
    CHECK(!strcmp(str_or(json_object_get(j, "object"), ""), "response"));
    CHECK(!strncmp(str_or(json_object_get(j, "id"), ""), "resp_", 5));
    CHECK(json_is_integer(json_object_get(j, "created_at")));
    CHECK(!strcmp(str_or(json_object_get(j, "status"), ""), "completed"));
    CHECK(json_is_null(json_object_get(j, "incomplete_details")) && json_is_null(json_object_get(j, "error")));
    CHECK(!strcmp(str_or(json_object_get(j, "model"), ""), "demo"));
    CHECK(!strcmp(str_or(json_object_get(j, "instructions"), ""), "Be brief."));
    CHECK(!strcmp(str_or(json_object_get(json_object_get(j, "metadata"), "k"), ""), "v"));
    CHECK(!json_object_get(j, "output_text")); /* the SDK's convenience, not the server's */
    CHECK(json_array_size(json_object_get(j, "output")) == 1);
    const json_t *m = item(j, 0);
    CHECK(!strcmp(str_or(json_object_get(m, "type"), ""), "message") &&
          !strcmp(str_or(json_object_get(m, "role"), ""), "assistant") &&
          !strcmp(str_or(json_object_get(m, "status"), ""), "completed") &&
          !strncmp(str_or(json_object_get(m, "id"), ""), "msg_", 4));
    CHECK(!strcmp(str_or(json_object_get(json_array_get(json_object_get(m, "content"), 0), "type"), ""), "output_text"));
    CHECKF(item_text(m) && !strcmp(item_text(m), "It is sunny."), "text '%s'", item_text(m) ? item_text(m) : "(none)");
    json_t *u = json_object_get(j, "usage");
    json_int_t in = json_integer_value(json_object_get(u, "input_tokens")),
               out = json_integer_value(json_object_get(u, "output_tokens"));
    CHECK(in > 5 && out > 0 && json_integer_value(json_object_get(u, "total_tokens")) == in + out);
    CHECK(g_text_deltas > 1); /* streamed in pieces */
    json_decref(j);
    /* items as input: content parts, an assistant turn, a developer message */
    j = both("{\"input\":[{\"role\":\"developer\",\"content\":\"Answer in French.\"},{\"type\":\"message\",\"role\":"
             "\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"Hi\"}]},{\"role\":\"assistant\",\"content\":[{"
             "\"type\":\"output_text\",\"text\":\"Bonjour\"}]},{\"role\":\"user\",\"content\":\"Again?\"}]}",
             "Bonjour encore.");
    CHECK(item_text(item(j, 0)) && !strcmp(item_text(item(j, 0)), "Bonjour encore."));
    json_decref(j);
    /* max_output_tokens cuts the answer: incomplete */
    j = both("{" INPUT ",\"max_output_tokens\":3}", "This is a much longer answer than three tokens.");
    CHECK(!strcmp(str_or(json_object_get(j, "status"), ""), "incomplete"));
    CHECK(!strcmp(str_or(json_object_get(json_object_get(j, "incomplete_details"), "reason"), ""), "max_output_tokens"));
    CHECK(!strcmp(str_or(json_object_get(item(j, 0), "status"), ""), "incomplete"));
    CHECK(json_integer_value(json_object_get(json_object_get(j, "usage"), "output_tokens")) == 3);
    json_decref(j);
    /* sampled, no script: still one message */
    j = both("{" INPUT ",\"max_output_tokens\":8,\"temperature\":0}", NULL);
    CHECK(json_array_size(json_object_get(j, "output")) == 1);
    json_decref(j);
}

/* method on path; the parsed JSON answer (NULL if none) and its status. */
static json_t *call(const char *method, const char *path, int *status) {
    http_resp r;
    http_request(g_port, method, path, NULL, &r);
    *status = r.status;
    json_t *j = json_loadb(r.body ? r.body : "", r.body_len, 0, NULL);
    http_resp_free(&r);
    return j;
}

static const char *err_msg(const json_t *j) {
    return str_or(json_object_get(json_object_get(j, "error"), "message"), "");
}

/* GET and DELETE /v1/responses/{id}: the stored object, streamed or not,
   forgetting it, and every way of asking for what is not there. */
static void stored(void) {
    char path[160];
    int st;
    for (int stream = 0; stream < 2; stream++) {
        char *b = with_script("{" INPUT ",\"metadata\":{\"k\":\"v\"}}", "Stored answer.", stream);
        http_resp r;
        http_request(g_port, "POST", "/v1/responses", b, &r);
        free(b);
        CHECK(r.status == 200);
        json_t *sse = stream ? sse_responses(r.body ? r.body : "") : NULL;
        json_t *posted = stream ? json_incref(json_object_get(sse, "response")) : json_loadb(r.body, r.body_len, 0, NULL);
        http_resp_free(&r);
        json_decref(sse);
        const char *id = str_or(json_object_get(posted, "id"), "");
        CHECK(!strncmp(id, "resp_", 5));
        snprintf(path, sizeof path, "/v1/responses/%s", id);
        json_t *got = call("GET", path, &st);
        CHECKF(st == 200 && json_equal(got, posted), "GET %s: status %d, %s", path, st,
               got ? "a different object" : "no JSON");
        json_decref(got);
        /* the stored conversation still continues */
        char body[256];
        snprintf(body, sizeof body, "{\"input\":\"And tomorrow?\",\"previous_response_id\":\"%s\"}", id);
        json_decref(post("/v1/responses", body, &st, NULL));
        CHECK(st == 200);
        json_t *del = call("DELETE", path, &st);
        CHECKF(st == 200 && json_is_true(json_object_get(del, "deleted")) &&
                   !strcmp(str_or(json_object_get(del, "id"), ""), id) &&
                   !strcmp(str_or(json_object_get(del, "object"), ""), "response"),
               "DELETE %s: status %d", path, st);
        json_decref(del);
        /* gone: GET, DELETE and previous_response_id all say so */
        json_t *j = call("GET", path, &st);
        CHECKF(st == 404 && strstr(err_msg(j), id), "GET after DELETE: status %d '%s'", st, err_msg(j));
        json_decref(j);
        j = call("DELETE", path, &st);
        CHECK(st == 404);
        json_decref(j);
        j = post("/v1/responses", body, &st, NULL);
        CHECKF(st == 400 && strstr(err_msg(j), id) &&
                   !strcmp(str_or(json_object_get(json_object_get(j, "error"), "param"), ""), "previous_response_id"),
               "status %d '%s'", st, err_msg(j));
        json_decref(j);
        json_decref(posted);
    }
    /* store: false keeps nothing */
    char *b = with_script("{" INPUT ",\"store\":false}", "Not kept.", false);
    json_t *j = post("/v1/responses", b, &st, NULL);
    free(b);
    CHECK(st == 200 && json_is_false(json_object_get(j, "store")));
    snprintf(path, sizeof path, "/v1/responses/%s", str_or(json_object_get(j, "id"), "x"));
    json_decref(j);
    j = call("GET", path, &st);
    CHECK(st == 404);
    json_decref(j);
    /* never stored, odd ids, other methods, sub-resources */
    static const struct {
        const char *method, *path;
        int status;
    } k_bad[] = {{"GET", "/v1/responses/resp_000000000000000000000000", 404},
                 {"GET", "/v1/responses/", 404},
                 {"GET", "/v1/responses/%2e%2e", 404},
                 {"GET", "/v1/responses/resp_abc%00x", 404},
                 {"GET", "/v1/responses/resp_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", 404},
                 {"GET", "/v1/responses/resp_abc/input_items", 404},
                 {"POST", "/v1/responses/resp_abc/cancel", 404},
                 {"PUT", "/v1/responses/resp_abc", 405},
                 {"POST", "/v1/responses/resp_abc", 405}};
    for (size_t i = 0; i < sizeof k_bad / sizeof *k_bad; i++) {
        j = call(k_bad[i].method, k_bad[i].path, &st);
        CHECKF(st == k_bad[i].status && json_is_object(json_object_get(j, "error")), "%s %s: status %d, want %d",
               k_bad[i].method, k_bad[i].path, st, k_bad[i].status);
        json_decref(j);
    }
    CHECK(health() == 200);
}

static void calls(void) {
    const char *one = "I will check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    json_t *j = both("{" INPUT "," TOOLS "}", one);
    CHECK(!strcmp(str_or(json_object_get(j, "status"), ""), "completed"));
    CHECKF(json_array_size(json_object_get(j, "output")) == 2, "%zu items", json_array_size(json_object_get(j, "output")));
    CHECK(item_text(item(j, 0)) && !strcmp(item_text(item(j, 0)), "I will check.\n"));
    const json_t *fc = item(j, 1);
    CHECK(!strcmp(str_or(json_object_get(fc, "type"), ""), "function_call") &&
          !strcmp(str_or(json_object_get(fc, "status"), ""), "completed") &&
          !strncmp(str_or(json_object_get(fc, "id"), ""), "fc_", 3) &&
          !strncmp(str_or(json_object_get(fc, "call_id"), ""), "call_", 5) &&
          !strcmp(str_or(json_object_get(fc, "name"), ""), "get_weather"));
    json_t *a = json_loads(str_or(json_object_get(fc, "arguments"), ""), 0, NULL);
    CHECK(json_is_object(a) && !strcmp(str_or(json_object_get(a, "city"), ""), "Paris"));
    json_decref(a);
    CHECKF(g_arg_deltas > 3, "arguments streamed in %d deltas", g_arg_deltas);
    CHECK(json_is_array(json_object_get(j, "tools")) &&
          !strcmp(str_or(json_object_get(json_array_get(json_object_get(j, "tools"), 0), "name"), ""), "get_weather"));
    /* the call and its output fed back as items */
    char body[4096];
    snprintf(body, sizeof body,
             "{\"input\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},{\"type\":\"function_call\",\"call_id\":"
             "\"%s\",\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"},{\"type\":"
             "\"function_call_output\",\"call_id\":\"%s\",\"output\":\"18 C\"}]," TOOLS "}",
             str_or(json_object_get(fc, "call_id"), ""), str_or(json_object_get(fc, "call_id"), ""));
    json_t *k = both(body, "It is 18 C in Paris.");
    CHECK(item_text(item(k, 0)) && !strcmp(item_text(item(k, 0)), "It is 18 C in Paris."));
    json_int_t fed_in = json_integer_value(json_object_get(json_object_get(k, "usage"), "input_tokens"));
    json_decref(k);
    /* the same through previous_response_id: only the output is sent */
    snprintf(body, sizeof body,
             "{\"previous_response_id\":\"%s\",\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"%s\",\"output\":"
             "\"18 C\"}]," TOOLS "}",
             str_or(json_object_get(j, "id"), ""), str_or(json_object_get(fc, "call_id"), ""));
    k = both(body, "It is 18 C in Paris.");
    CHECK(!strcmp(str_or(json_object_get(k, "previous_response_id"), ""), str_or(json_object_get(j, "id"), "?")));
    json_int_t chained_in = json_integer_value(json_object_get(json_object_get(k, "usage"), "input_tokens"));
    /* the prompt holds the first answer's text too ("I will check."), else the same */
    CHECKF(chained_in > fed_in, "chained prompt %lld tokens, fed back %lld", (long long)chained_in, (long long)fed_in);
    /* a chain of three: the second response continues */
    snprintf(body, sizeof body, "{\"previous_response_id\":\"%s\",\"input\":\"And tomorrow?\",\"max_output_tokens\":2," TOOLS "}",
             str_or(json_object_get(k, "id"), ""));
    int st;
    json_t *l = post("/v1/responses", body, &st, NULL);
    CHECKF(st == 200 && json_integer_value(json_object_get(json_object_get(l, "usage"), "input_tokens")) > chained_in,
           "status %d", st);
    json_decref(l);
    json_decref(k);
    json_decref(j);
    /* store: false: nothing to continue from */
    j = post("/v1/responses", "{" INPUT ",\"store\":false,\"max_output_tokens\":2}", &st, NULL);
    CHECK(st == 200 && json_is_false(json_object_get(j, "store")));
    snprintf(body, sizeof body, "{\"previous_response_id\":\"%s\",\"input\":\"more\"}", str_or(json_object_get(j, "id"), ""));
    json_decref(j);
    j = post("/v1/responses", body, &st, NULL);
    CHECK(st == 400 && !strcmp(str_or(json_object_get(json_object_get(j, "error"), "param"), ""), "previous_response_id"));
    json_decref(j);
    /* two calls; parallel_tool_calls false keeps the first */
    const char *two = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n"
                      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    j = both("{" INPUT "," TOOLS "}", two);
    size_t n_fc = 0;
    for (size_t i = 0; i < json_array_size(json_object_get(j, "output")); i++)
        n_fc += !strcmp(str_or(json_object_get(item(j, i), "type"), ""), "function_call");
    CHECK(n_fc == 2);
    json_decref(j);
    j = both("{" INPUT "," TOOLS ",\"parallel_tool_calls\":false}", two);
    n_fc = 0;
    for (size_t i = 0; i < json_array_size(json_object_get(j, "output")); i++)
        n_fc += !strcmp(str_or(json_object_get(item(j, i), "type"), ""), "function_call");
    CHECK(n_fc == 1 && json_is_false(json_object_get(j, "parallel_tool_calls")));
    json_decref(j);
    /* tool_choice none: the call is text */
    j = both("{" INPUT "," TOOLS ",\"tool_choice\":\"none\"}", one);
    CHECK(json_array_size(json_object_get(j, "output")) == 1 && item_text(item(j, 0)) && !strcmp(item_text(item(j, 0)), one));
    json_decref(j);
}

/* The function_call items of r. */
static const json_t *first_call(const json_t *r) {
    for (size_t i = 0; i < json_array_size(json_object_get(r, "output")); i++)
        if (!strcmp(str_or(json_object_get(item(r, i), "type"), ""), "function_call")) return item(r, i);
    return NULL;
}

static void enforced(void) {
    static const char *const choice[] = {"\"required\"", "{\"type\":\"function\",\"name\":\"get_time\"}"};
    int n_done = 0;
    for (int k = 0; k < 2; k++) {
        char body[4096];
        snprintf(body, sizeof body, "{" INPUT "," TOOLS ",\"max_output_tokens\":300,\"temperature\":1,\"tool_choice\":%s}",
                 choice[k]);
        json_t *j = both(body, NULL);
        if (!strcmp(str_or(json_object_get(j, "status"), ""), "completed")) {
            n_done++;
            const json_t *fc = first_call(j);
            CHECKF(fc != NULL, "choice %d: no function_call", k);
            json_t *a = json_loads(str_or(json_object_get(fc, "arguments"), ""), 0, NULL);
            CHECKF(json_is_object(a), "choice %d: arguments %s", k, str_or(json_object_get(fc, "arguments"), "?"));
            const char *name = str_or(json_object_get(fc, "name"), "");
            if (k == 1) CHECK(!strcmp(name, "get_time"));
            if (!strcmp(name, "get_weather")) CHECK(json_is_string(json_object_get(a, "city")));
            json_decref(a);
        }
        json_decref(j);
    }
    fprintf(stderr, "enforced tool_choice: %d of 2 answers complete calls\n", n_done);
    /* a bounded tool always completes */
    json_t *j = both("{" INPUT ",\"tools\":[{\"type\":\"function\",\"name\":\"pick\",\"strict\":true,\"parameters\":{"
                     "\"type\":\"object\",\"properties\":{\"color\":{\"enum\":[\"red\",\"green\"]},\"n\":{\"type\":"
                     "\"integer\"}},\"required\":[\"color\",\"n\"],\"additionalProperties\":false}}],\"tool_choice\":"
                     "\"required\",\"max_output_tokens\":300,\"temperature\":1,\"seed\":3}",
                     NULL);
    const json_t *fc = first_call(j);
    json_t *a = json_loads(str_or(json_object_get(fc, "arguments"), ""), 0, NULL);
    const char *color = str_or(json_object_get(a, "color"), "");
    CHECKF(!strcmp(str_or(json_object_get(j, "status"), ""), "completed") && fc &&
               !strcmp(str_or(json_object_get(fc, "name"), ""), "pick") && (!strcmp(color, "red") || !strcmp(color, "green")) &&
               json_is_integer(json_object_get(a, "n")) && json_object_size(a) == 2,
           "bounded tool: %s", str_or(json_object_get(fc, "arguments"), "(no call)"));
    json_decref(a);
    json_decref(j);
    /* text.format json_schema: the text parses and follows the schema */
    j = both("{" INPUT ",\"max_output_tokens\":400,\"temperature\":1,\"seed\":7,\"text\":{\"format\":{\"type\":"
             "\"json_schema\",\"name\":\"w\",\"strict\":true,\"schema\":{\"type\":\"object\",\"properties\":{\"n\":{"
             "\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]},\"maxItems\":2},"
             "\"ok\":{\"type\":\"boolean\"}},\"required\":[\"n\",\"tags\",\"ok\"],\"additionalProperties\":false}}}}",
             NULL);
    CHECK(!strcmp(str_or(json_object_get(json_object_get(json_object_get(j, "text"), "format"), "type"), ""), "json_schema"));
    const char *t = item_text(item(j, 0));
    json_t *x = t ? json_loads(t, 0, NULL) : NULL;
    CHECKF(!strcmp(str_or(json_object_get(j, "status"), ""), "completed") && json_is_object(x) &&
               json_is_integer(json_object_get(x, "n")) && json_is_array(json_object_get(x, "tags")) &&
               json_is_boolean(json_object_get(x, "ok")) && json_object_size(x) == 3,
           "json_schema text: %s", t ? t : "(none)");
    json_decref(x);
    json_decref(j);
    /* json_object */
    j = both("{" INPUT ",\"max_output_tokens\":200,\"temperature\":1,\"seed\":5,\"text\":{\"format\":{\"type\":"
             "\"json_object\"}}}",
             NULL);
    if (!strcmp(str_or(json_object_get(j, "status"), ""), "completed")) {
        t = item_text(item(j, 0));
        x = t ? json_loads(t, 0, NULL) : NULL;
        CHECKF(json_is_object(x), "json_object text: %s", t ? t : "(none)");
        json_decref(x);
    }
    json_decref(j);
}

int main(void) {
    qwen_demo d;
    if (!qwen_demo_load("server_responses_demo", &d)) return 77;
    ember_server_opts o = {0};
    o.model_id = "demo";
    o.max_queue = 64;
    o.max_body = 256 * 1024;
    o.tool_format = d.fmt;
    o.test_output = true;
    ember_server *s = server_start(d.m, d.tok, d.tmpl, &o, 3);
    hostile();
    text();
    stored();
    calls();
    enforced();
    CHECK(server_wait_idle());
    ember_server_stop(s, 5.0);
    qwen_demo_free(&d);
    return test_done();
}
