/*
 * test_text_api.c - the text API of include/ember.h (src/api/text.c) over
 * the demo model (ember mkmodel --preset demo: random weights, a byte-level
 * BPE tokenizer, a ChatML template), written into the test's tmp dir; no
 * ../shared data needed.
 *
 * Checks: version; argument and size-field refusals; opening org/name from
 * a HuggingFace cache made in the tmp dir; tokenize / detokenize
 * round trip; rendering through the model's template; generation: streamed
 * pieces join to the whole text, the same text twice (same seed), a stop
 * string cuts the text right before it and is never streamed, a callback
 * that says stop cancels, an older (smaller) params / result struct is
 * read and written only as far as its size.
 * Tools (ember_chat_message, ember_chat_params): on the demo model, whose
 * ChatML template shows no call format, tools render and nothing is
 * parsed; with Qwen2.5's real template from ../shared/testdata (that part
 * says it is skipped when the data is absent): the render equals the one
 * the shared template input gives (what the server renders), a scripted
 * completion (the text_int.h hook: the random model writes no calls) comes
 * back as tool_calls with the text outside them, streamed and whole, the
 * calls fed back render as the template's tool_call / tool_response, and
 * bad JSON, shapes and sizes are refused.
 */
#define _GNU_SOURCE
#include <stddef.h>

#include "api/text_int.h"
#include "core/mapfile.h"
#include "ember.h"
#include "template/chat.h"
#include "test.h"
#include "tok/tokenizer.h"

typedef struct pieces {
    char buf[1 << 16];
    size_t len;
    int n, stop_after; /* stop_after > 0: return 1 after that many pieces */
} pieces;

static int collect(void *user, const char *text, size_t len) {
    pieces *p = user;
    if (p->len + len < sizeof p->buf) {
        memcpy(p->buf + p->len, text, len);
        p->len += len;
        p->buf[p->len] = 0;
    }
    p->n++;
    return p->stop_after > 0 && p->n >= p->stop_after;
}

static void check_refusals(void) {
    ember_error err;
    ember_text *t = (ember_text *)&err;
    CHECK(ember_text_open(EMBER_TEST_TMP "/no/such/model", NULL, &t, &err) != EMBER_OK && t == NULL);
    ember_text_params p;
    ember_text_params_init(&p);
    CHECK(p.size == sizeof p);
    p.size = 0; /* never initialized */
    CHECK(ember_text_open(EMBER_TEST_TMP "/text_api_demo", &p, &t, &err) == EMBER_ERR_INVALID_ARG && t == NULL);
    CHECKF(strstr(err.msg, "init") != NULL, "%s", err.msg);
}

static void check_text(ember_text *t) {
    ember_error err;
    const char *s = "Hello, world! h\xc3\xa9llo <|im_end|> \xe2\x82\xac";
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(ember_text_tokenize(t, s, strlen(s), 0, &ids, &n, &err) == EMBER_OK && n > 0);
    char *back = NULL;
    size_t len = 0;
    CHECK(ember_text_detokenize(t, ids, n, 0, &back, &len, &err) == EMBER_OK);
    CHECKF(back && len == strlen(s) && !strcmp(back, s), "'%s'", back ? back : "(null)");
    ember_free(back);
    /* skip_special drops the chat marker; an id past the vocabulary gives nothing */
    int32_t *more = malloc((n + 1) * sizeof *more);
    memcpy(more, ids, n * sizeof *ids);
    more[n] = 1 << 20;
    CHECK(ember_text_detokenize(t, more, n + 1, 1, &back, &len, &err) == EMBER_OK);
    CHECKF(back && !strstr(back, "<|im_end|>") && strstr(back, "h\xc3\xa9llo"), "'%s'", back ? back : "(null)");
    ember_free(back);
    free(more);
    ember_free(ids);

    ember_message msgs[] = {{"system", "Be brief."}, {"user", "Hi"}};
    char *r = NULL;
    CHECK(ember_text_render(t, msgs, 2, 1, &r, &len, &err) == EMBER_OK);
    const char *want = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
    CHECKF(r && !strcmp(r, want) && len == strlen(want), "'%s'", r ? r : "(null)");
    ember_free(r);
    CHECK(ember_text_render(t, msgs, 2, 0, &r, NULL, &err) == EMBER_OK && r && !strstr(r, "assistant"));
    ember_free(r);
    ember_message bad[] = {{"user", NULL}};
    CHECK(ember_text_render(t, bad, 1, 1, &r, NULL, &err) == EMBER_ERR_INVALID_ARG && r == NULL);
}

static void check_generate(ember_text *t) {
    ember_error err;
    ember_message msgs[] = {{"user", "Tell me a story."}};
    ember_gen_text_params g;
    ember_gen_text_params_init(&g);
    g.max_tokens = 40;
    g.ignore_eos = 1;
    g.temperature = 0.9f; /* greedy on the random demo model repeats one byte */
    g.seed = 7;
    static pieces a, b, c, d;
    g.on_text = collect;
    g.user = &a;
    ember_text_result res;
    ember_text_result_init(&res);
    CHECK(ember_text_chat(t, msgs, 1, &g, &res, &err) == EMBER_OK);
    CHECK(res.finish == EMBER_FINISH_LENGTH && res.n_generated == 40 && res.stop_index == -1);
    CHECK(res.n_prompt > 5);
    CHECKF(res.text && res.text_len == a.len && !memcmp(res.text, a.buf, a.len), "pieces join to the text");
    CHECK(a.n > 1 && a.len > 0);

    /* the same again (same seed): the same text, the prompt now cached */
    g.user = &b;
    ember_text_result again;
    ember_text_result_init(&again);
    CHECK(ember_text_chat(t, msgs, 1, &g, &again, &err) == EMBER_OK);
    CHECK(again.text && again.text_len == res.text_len && !memcmp(again.text, res.text, res.text_len) && b.len == a.len);
    CHECKF(again.n_cached > 0, "n_cached %d", again.n_cached);
    ember_free(again.text);

    /* a stop string from the middle of the text: the text ends right before it */
    size_t at = res.text_len / 2;
    while (at < res.text_len && ((unsigned char)res.text[at] & 0xC0) == 0x80) at++; /* a UTF-8 start */
    size_t sl = 1;
    while (at + sl < res.text_len && ((unsigned char)res.text[at + sl] & 0xC0) == 0x80) sl++;
    if (at + sl + 1 <= res.text_len) sl++;
    while (at + sl < res.text_len && ((unsigned char)res.text[at + sl] & 0xC0) == 0x80) sl++;
    char stop[32] = "";
    if (sl < sizeof stop) memcpy(stop, res.text + at, sl), stop[sl] = 0;
    const char *stops[] = {"\x01never\x02", stop};
    const char *first = sl < sizeof stop ? memmem(res.text, res.text_len, stop, sl) : NULL; /* the text may hold NULs */
    CHECK(first != NULL);
    g.stop = stops;
    g.n_stop = 2;
    g.user = &c;
    ember_text_result cut;
    ember_text_result_init(&cut);
    CHECK(ember_text_chat(t, msgs, 1, &g, &cut, &err) == EMBER_OK);
    CHECKF(cut.finish == EMBER_FINISH_STOP && cut.stop_index == 1, "finish %d stop %d", cut.finish, cut.stop_index);
    CHECKF(first && cut.text && cut.text_len == (size_t)(first - res.text) && !memcmp(cut.text, res.text, cut.text_len),
           "cut at %zu, want %td", cut.text_len, first ? first - res.text : -1);
    CHECKF(cut.text_len > 0, "the stop string was found at the start of '%s'", res.text);
    CHECK(c.len == cut.text_len && !memcmp(c.buf, cut.text, c.len) && !memmem(c.buf, c.len, stop, sl));
    ember_free(cut.text);

    /* the callback asks to stop after its first piece */
    g.stop = NULL;
    g.n_stop = 0;
    d.stop_after = 1;
    g.user = &d;
    ember_text_result cancelled;
    ember_text_result_init(&cancelled);
    CHECK(ember_text_chat(t, msgs, 1, &g, &cancelled, &err) == EMBER_OK);
    CHECK(cancelled.finish == EMBER_FINISH_CANCELLED && d.n == 1);
    ember_free(cancelled.text);

    /* refusals: an empty stop string, params never initialized */
    const char *empty[] = {""};
    g.stop = empty;
    g.n_stop = 1;
    CHECK(ember_text_chat(t, msgs, 1, &g, NULL, &err) == EMBER_ERR_INVALID_ARG);
    ember_gen_text_params zero;
    memset(&zero, 0, sizeof zero);
    CHECK(ember_text_generate(t, "x", &zero, NULL, &err) == EMBER_ERR_INVALID_ARG);

    /* an older program's structs: params up to n_stop's end (no callback), a result without text */
    ember_gen_text_params old;
    ember_gen_text_params_init(&old);
    old.max_tokens = 40;
    old.ignore_eos = 1;
    old.on_text = collect; /* past the old size: never read */
    old.user = NULL;
    old.size = offsetof(ember_gen_text_params, ignore_eos);
    ember_text_result small;
    ember_text_result_init(&small);
    small.size = offsetof(ember_text_result, text);
    small.text = NULL;
    CHECK(ember_text_chat(t, msgs, 1, &old, &small, &err) == EMBER_OK);
    CHECK(small.text == NULL && small.n_generated >= 1 && small.n_generated <= 40);
    ember_free(res.text);

    /* raw text prompt */
    ember_gen_text_params_init(&g);
    g.max_tokens = 4;
    ember_text_result raw;
    ember_text_result_init(&raw);
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(ember_text_tokenize(t, "Once upon a time", 16, 1, &ids, &n, &err) == EMBER_OK);
    CHECK(ember_text_generate(t, "Once upon a time", &g, &raw, &err) == EMBER_OK && raw.n_prompt == (int)n);
    CHECK(raw.n_generated >= 1 && raw.n_generated <= 4);
    ember_free(ids);
    ember_free(raw.text);
}

static const char k_tools[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather of a city\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, "
    "\"required\": [\"city\"]}}}]";

/* The demo model's ChatML template shows no call format: tools render (it
   ignores them) and the text comes back whole. */
static void check_tools_none(ember_text *t) {
    ember_error err;
    CHECK(!strcmp(ember_text_tool_format(t), "none"));
    ember_chat_params cp;
    ember_chat_params_init(&cp);
    CHECK(cp.size == sizeof cp && cp.add_generation_prompt == 1 && cp.parse_tool_calls == 1);
    cp.tools = k_tools;
    ember_chat_message msgs[] = {{.role = "user", .content = "Hi"}};
    char *r = NULL, *plain = NULL;
    CHECK(ember_text_render_messages(t, msgs, 1, &cp, &r, NULL, &err) == EMBER_OK);
    ember_message pm[] = {{"user", "Hi"}};
    CHECK(ember_text_render(t, pm, 1, 1, &plain, NULL, &err) == EMBER_OK);
    CHECKF(r && plain && !strcmp(r, plain), "'%s' vs '%s'", r ? r : "", plain ? plain : "");
    ember_free(r);
    ember_free(plain);
    CHECK(ember_text_render_messages(t, msgs, 1, NULL, &r, NULL, &err) == EMBER_OK && r);
    ember_free(r);
    ember_gen_text_params g;
    ember_gen_text_params_init(&g);
    g.max_tokens = 6;
    g.ignore_eos = 1;
    ember_text_result res;
    ember_text_result_init(&res);
    CHECK(ember_text_chat_messages(t, msgs, 1, &cp, &g, &res, &err) == EMBER_OK);
    CHECK(res.n_generated == 6 && res.text && res.tool_calls == NULL && res.n_tool_calls == 0);
    ember_free(res.text);
}

/* The refusals of the messages calls. */
static void check_tools_refusals(ember_text *t) {
    ember_error err;
    ember_chat_params cp;
    ember_chat_params_init(&cp);
    char *r = (char *)&err;
    ember_chat_message ok[] = {{.role = "user", .content = "Hi"}};
    static const struct {
        const char *tools, *kwargs;
        ember_chat_message m;
        const char *want; /* in the message */
    } bad[] = {
        {"not json", NULL, {.role = "user", .content = "x"}, "tools is not JSON"},
        {"{}", NULL, {.role = "user", .content = "x"}, "tools must be an array"},
        {"[{\"type\": \"function\"}]", NULL, {.role = "user", .content = "x"}, "tools[0]"},
        {NULL, "[]", {.role = "user", .content = "x"}, "template_kwargs must be an object"},
        {NULL, NULL, {.role = NULL, .content = "x"}, "role is NULL"},
        {NULL, NULL, {.role = "user", .content = NULL}, "content is NULL"},
        {NULL, NULL, {.role = "user", .content = "x", .tool_calls = "[]"}, "only assistant"},
        {NULL, NULL, {.role = "assistant", .tool_calls = "{}"}, "tool_calls must be an array"},
        {NULL, NULL, {.role = "assistant", .tool_calls = "[{\"function\": {}}]"}, "tool_calls[0]"},
        {NULL, NULL, {.role = "assistant", .tool_calls = "[{\"function\": {\"name\": \"f\", \"arguments\": \"[1]\"}}]"},
         "arguments must be an object"},
        {NULL, NULL, {.role = "assistant", .tool_calls = "[{\"function\": {\"name\": \"f\", \"arguments\": \"{\"}}]"},
         "arguments is not JSON"},
        {NULL, NULL, {.role = "user", .content = "x", .extra = "[1]"}, "extra must be an object"},
        {NULL, NULL, {.role = "user", .content = "\xff"}, "not valid UTF-8"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cp.tools = bad[i].tools;
        cp.template_kwargs = bad[i].kwargs;
        int rc = ember_text_render_messages(t, &bad[i].m, 1, &cp, &r, NULL, &err);
        CHECKF(rc == EMBER_ERR_INVALID_ARG && r == NULL && strstr(err.msg, bad[i].want), "case %zu: %d '%s'", i, rc,
               err.msg);
        ember_text_result res;
        ember_text_result_init(&res);
        rc = ember_text_chat_messages(t, &bad[i].m, 1, &cp, NULL, &res, &err);
        CHECKF(rc == EMBER_ERR_INVALID_ARG && res.text == NULL, "chat case %zu: %d", i, rc);
    }
    cp.tools = cp.template_kwargs = NULL;
    cp.size = 0; /* never initialized */
    CHECK(ember_text_render_messages(t, ok, 1, &cp, &r, NULL, &err) == EMBER_ERR_INVALID_ARG && strstr(err.msg, "init"));
    CHECK(ember_text_render_messages(t, NULL, 1, NULL, &r, NULL, &err) == EMBER_ERR_INVALID_ARG);
    CHECK(ember_text_render_messages(NULL, ok, 1, NULL, &r, NULL, &err) == EMBER_ERR_INVALID_ARG);
    CHECK(ember_text_chat_messages(t, ok, -1, NULL, NULL, NULL, &err) == EMBER_ERR_INVALID_ARG);
    CHECK(!strcmp(ember_text_tool_format(NULL), "none"));
}

/* What the server's input filling gives for the same conversation. */
static char *render_direct(const char *tpl_path, const ember_text *t, const char *msgs_json) {
    char *tpl = NULL, *out = NULL;
    size_t n = 0;
    ember_error err;
    ember_chat_template *ct = NULL;
    json_t *msgs = json_loads(msgs_json, 0, NULL), *tools = json_loads(k_tools, 0, NULL);
    ember_tokenizer *tok = NULL;
    CHECK(ember_read_file(tpl_path, 1 << 20, &tpl, &n, &err) == EMBER_OK);
    CHECK(ember_chat_template_compile(tpl, n, &ct, &err) == EMBER_OK);
    CHECK(ember_tok_load(EMBER_TEST_TMP "/text_api_qwen", &tok, &err) == EMBER_OK);
    ember_chat_input in = {.messages = msgs, .tools = tools, .add_generation_prompt = true, .tok = tok};
    CHECKF(msgs && ember_chat_render_input(ct, &in, &out, NULL, &err) == EMBER_OK, "%s", err.msg);
    (void)t;
    ember_tok_free(tok);
    ember_chat_template_free(ct);
    json_decref(msgs);
    json_decref(tools);
    free(tpl);
    return out;
}

/* Qwen2.5's template (Hermes calls): render, parse, feed back. */
static void check_tools_qwen(const char *tpl_path) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "rm -rf '%s/text_api_qwen' && cp -r '%s/text_api_demo' '%s/text_api_qwen' && cp '%s' '%s/text_api_qwen/chat_template.jinja'",
             EMBER_TEST_TMP, EMBER_TEST_TMP, EMBER_TEST_TMP, tpl_path, EMBER_TEST_TMP);
    CHECK(system(cmd) == 0);
    ember_text *t = NULL;
    ember_error err;
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.n_threads = 2;
    mp.n_ctx = 1024;
    ember_text_params p;
    ember_text_params_init(&p);
    p.model = &mp;
    if (!CHECKV(ember_text_open(EMBER_TEST_TMP "/text_api_qwen", &p, &t, &err) == EMBER_OK, "%s", err.msg)) return;
    CHECK(!strcmp(ember_text_tool_format(t), "hermes"));
    ember_chat_params cp;
    ember_chat_params_init(&cp);
    cp.tools = k_tools;

    /* the render: tools shown, the same text as the shared input filling gives */
    ember_chat_message first[] = {{.role = "system", .content = "Be brief."}, {.role = "user", .content = "Weather in Paris?"}};
    char *r = NULL;
    CHECK(ember_text_render_messages(t, first, 2, &cp, &r, NULL, &err) == EMBER_OK);
    char *want = render_direct(tpl_path, t,
                               "[{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Weather in Paris?\"}]");
    CHECKF(r && want && !strcmp(r, want), "'%s'\nvs\n'%s'", r ? r : "", want ? want : "");
    CHECKF(r && strstr(r, "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\""), "%s", r ? r : "");
    ember_free(r);
    free(want);

    /* a completion that calls the tool: the call parsed out, the text around it streamed */
    ember_error serr;
    CHECK(ember_text_script(t, "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", &serr) == EMBER_OK);
    ember_gen_text_params g;
    ember_gen_text_params_init(&g);
    static pieces a;
    g.on_text = collect;
    g.user = &a;
    ember_text_result res;
    ember_text_result_init(&res);
    CHECKF(ember_text_chat_messages(t, first, 2, &cp, &g, &res, &err) == EMBER_OK, "%s", err.msg);
    CHECKF(res.n_tool_calls == 1 && res.tool_calls, "%d calls", res.n_tool_calls);
    CHECKF(res.text && !strcmp(res.text, "Let me check.\n") && a.len == res.text_len && !strcmp(a.buf, res.text),
           "'%s' / '%s'", res.text ? res.text : "", a.buf);
    json_t *calls = res.tool_calls ? json_loads(res.tool_calls, 0, NULL) : NULL;
    json_t *c0 = json_array_get(calls, 0), *fn = json_object_get(c0, "function");
    const char *id = json_string_value(json_object_get(c0, "id"));
    CHECKF(json_array_size(calls) == 1 && id && !strncmp(id, "call_", 5) && strlen(id) == 29 &&
               !strcmp(json_string_value(json_object_get(c0, "type")), "function") &&
               !strcmp(json_string_value(json_object_get(fn, "name")), "get_weather") &&
               !strcmp(json_string_value(json_object_get(fn, "arguments")), "{\"city\": \"Paris\"}"),
           "%s", res.tool_calls ? res.tool_calls : "(null)");

    /* fed back: the call and its result as the template writes them */
    char call_id[64] = "";
    if (id) snprintf(call_id, sizeof call_id, "%s", id);
    ember_chat_message conv[] = {first[0], first[1],
                                 {.role = "assistant", .content = res.text, .tool_calls = res.tool_calls},
                                 {.role = "tool", .content = "18 C, sunny", .tool_call_id = call_id, .name = "get_weather"}};
    CHECK(ember_text_render_messages(t, conv, 4, &cp, &r, NULL, &err) == EMBER_OK);
    CHECKF(r && strstr(r, "<|im_start|>assistant\nLet me check.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                          "{\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n18 C, sunny\n"
                          "</tool_response><|im_end|>\n<|im_start|>assistant\n"),
           "%s", r ? r : "");
    ember_free(r);
    /* a call's arguments as an object render the same as its text; content NULL with calls */
    conv[2].tool_calls = "[{\"id\": \"x\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
                         "\"arguments\": {\"city\": \"Paris\"}}}]";
    conv[2].content = NULL;
    CHECK(ember_text_render_messages(t, conv, 4, &cp, &r, NULL, &err) == EMBER_OK &&
          strstr(r, "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"));
    ember_free(r);
    json_decref(calls);
    ember_free(res.text);
    ember_free(res.tool_calls);

    /* a second call gets another id; parse_tool_calls 0 leaves the text as written */
    ember_text_result_init(&res);
    CHECK(ember_text_chat_messages(t, first, 2, &cp, NULL, &res, &err) == EMBER_OK && res.n_tool_calls == 1);
    CHECK(res.tool_calls && (!id || !strstr(res.tool_calls, call_id)));
    ember_free(res.text);
    ember_free(res.tool_calls);
    cp.parse_tool_calls = 0;
    ember_text_result_init(&res);
    CHECK(ember_text_chat_messages(t, first, 2, &cp, NULL, &res, &err) == EMBER_OK);
    CHECK(res.n_tool_calls == 0 && !res.tool_calls && res.text && strstr(res.text, "</tool_call>"));
    ember_free(res.text);
    cp.parse_tool_calls = 1;

    /* an older result struct (no tool_calls field): the calls are not written, nothing leaks */
    ember_text_result small;
    ember_text_result_init(&small);
    small.size = offsetof(ember_text_result, tool_calls);
    small.tool_calls = NULL;
    CHECK(ember_text_chat_messages(t, first, 2, &cp, NULL, &small, &err) == EMBER_OK);
    CHECK(small.tool_calls == NULL && small.n_tool_calls == 0 && small.text && !strcmp(small.text, "Let me check.\n"));
    ember_free(small.text);
    /* without tools nothing is parsed */
    ember_text_result_init(&res);
    CHECK(ember_text_chat_messages(t, first, 2, NULL, NULL, &res, &err) == EMBER_OK);
    CHECK(res.n_tool_calls == 0 && res.text && strstr(res.text, "<tool_call>"));
    ember_free(res.text);
    CHECK(ember_text_script(t, NULL, &serr) == EMBER_OK);
    ember_text_free(t);
}

int main(void) {
    const char *v = NULL;
    CHECK(ember_version(&v) == EMBER_VERSION && v && !strcmp(v, EMBER_VERSION_STRING));
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' mkmodel --preset demo --out '%s/text_api_demo' > /dev/null", EMBER_BIN,
             EMBER_TEST_TMP);
    if (system(cmd) != 0) {
        fprintf(stderr, "ember mkmodel --preset demo failed\n");
        return 1;
    }
    check_refusals();
    /* org/name in the local HuggingFace cache: HUB/models--org--demo/snapshots/REV, refs/main = REV */
    snprintf(cmd, sizeof cmd, "rm -rf '%s/hf' && mkdir -p '%s/hf/models--org--demo/snapshots' '%s/hf/models--org--demo/refs' && "
             "ln -s '%s/text_api_demo' '%s/hf/models--org--demo/snapshots/rev1' && echo rev1 > '%s/hf/models--org--demo/refs/main'",
             EMBER_TEST_TMP, EMBER_TEST_TMP, EMBER_TEST_TMP, EMBER_TEST_TMP, EMBER_TEST_TMP, EMBER_TEST_TMP);
    CHECK(system(cmd) == 0);
    setenv("HF_HUB_CACHE", EMBER_TEST_TMP "/hf", 1);
    ember_text *h = NULL;
    ember_error herr;
    CHECKF(ember_text_open("org/demo", NULL, &h, &herr) == EMBER_OK && h, "%s", herr.msg);
    CHECK(ember_text_has_template(h));
    ember_text_free(h);
    CHECK(ember_text_open("org/none", NULL, &h, &herr) == EMBER_ERR_IO && h == NULL && strstr(herr.msg, "HuggingFace"));
    ember_text *t = NULL;
    ember_error err;
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.n_threads = 2;
    mp.n_ctx = 512;
    ember_text_params p;
    ember_text_params_init(&p);
    p.model = &mp;
    if (ember_text_open(EMBER_TEST_TMP "/text_api_demo", &p, &t, &err) != EMBER_OK) {
        fprintf(stderr, "open: %s\n", err.msg);
        return 1;
    }
    CHECK(ember_text_has_template(t));
    ember_model_info info;
    ember_model_get_info(ember_text_model(t), &info);
    CHECK(info.n_ctx == 512);
    check_text(t);
    check_generate(t);
    check_tools_none(t);
    check_tools_refusals(t);
    ember_text_free(t);
    char tpl[1024];
    snprintf(tpl, sizeof tpl, "%s/testdata/chat-templates/llama.cpp/Qwen-Qwen2.5-7B-Instruct.jinja", EMBER_SHARED_DIR);
    if (path_exists(tpl))
        check_tools_qwen(tpl);
    else
        fprintf(stderr, "skipped: the tool-call part (%s not found: test data from ../shared is absent)\n", tpl);
    ember_text_free(NULL);
    return test_done();
}
