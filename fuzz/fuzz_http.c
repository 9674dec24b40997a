/*
 * fuzz_http.c - libFuzzer target: arbitrary request bodies through the
 * server's validation (JSON depth check, parsing, protocol fields, chat
 * template, tokenization) into an engine request, for every generation
 * endpoint (chat, completions, messages, responses; /v1/responses also
 * through previous_response_id, against a conversation stored at start). It includes server.c to reach its static functions; no socket
 * or engine is involved.
 *
 * Needs EMBER_FUZZ_MODEL: a model directory with tokenizer.json and a chat
 * template (e.g. `ember mkmodel --preset demo --out DIR`; scripts/fuzz.sh
 * makes one).
 */
#include "../src/serve/server.c"
#include "core/mapfile.h"

static ember_server g_srv;
static ember_tokenizer *g_tok;
static ember_chat_template *g_tmpl;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *dir = getenv("EMBER_FUZZ_MODEL");
    if (!dir) {
        fprintf(stderr, "fuzz_http: set EMBER_FUZZ_MODEL to a model directory (ember mkmodel --preset demo)\n");
        exit(1);
    }
    ember_error err;
    if (ember_tok_load(dir, &g_tok, &err)) {
        fprintf(stderr, "fuzz_http: %s\n", err.msg);
        exit(1);
    }
    char p[4096], *text;
    size_t len;
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    if (ember_read_file(p, 1 << 20, &text, &len, &err)) {
        fprintf(stderr, "fuzz_http: %s\n", err.msg);
        exit(1);
    }
    json_t *cfg = json_loadb(text, len, 0, NULL);
    const char *src = ember_chat_template_from_config(cfg, NULL);
    if (!src || ember_chat_template_compile(src, strlen(src), &g_tmpl, &err)) exit(1);
    json_decref(cfg);
    free(text);
    g_srv.tok = g_tok;
    g_srv.tmpl = g_tmpl;
    g_srv.o.model_id = "fuzz";
    g_srv.o.max_body = 1 << 20;
    g_srv.info.vocab_size = ember_tok_n_vocab(g_tok);
    g_srv.info.n_ctx = 256;
    g_srv.o.test_output = true; /* "ember_test_output" is validated too */
    /* one stored conversation, so that {"previous_response_id": "resp_fuzz"} reaches the history's path */
    resp_store_init(&g_srv.rstore);
    json_t *convo = json_loads("[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":null,"
                               "\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\","
                               "\"arguments\":\"{}\"}}]}]",
                               0, NULL);
    json_t *resp = json_pack("{s:s, s:s, s:s}", "id", "resp_fuzz", "object", "response", "status", "completed");
    if (!convo || !resp || resp_store_put(&g_srv.rstore, "resp_fuzz", convo, resp, 100)) exit(1);
    json_decref(convo);
    json_decref(resp);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static const int protos[4] = {PROTO_CHAT, PROTO_COMPLETION, PROTO_ANTHROPIC, PROTO_RESPONSES};
    int proto = protos[data[0] % 4];
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    if (json_depth(text, n) > MAX_JSON_DEPTH) return 0;
    json_error_t je;
    json_t *body = json_loadb(text, n, 0, &je);
    if (!body) return 0;
    gen_req q;
    bad b = {0};
    if (parse_gen(&g_srv, proto, body, &q, &b) == 0) {
        /* a request that passed must be one the engine accepts as well-formed */
        if (q.n_ids < 1 || q.n_ids > g_srv.info.n_ctx || q.g.max_tokens < 1 || q.g.n_prompt != q.n_ids) abort();
        for (int i = 0; i < q.n_ids; i++)
            if (q.ids[i] < 0 || q.ids[i] >= g_srv.info.vocab_size) abort();
    } else if (b.code < 400 || b.code > 599 || !b.msg[0]) {
        abort();
    }
    gen_req_free(&q);
    json_decref(body);
    return 0;
}
