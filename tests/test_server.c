/*
 * test_server.c - the HTTP server end to end, in process, on the demo model
 * (random weights over a byte-level tokenizer, written by `ember mkmodel
 * --preset demo`):
 *   - a table of malformed and hostile requests, each answered with the right
 *     status and a JSON error in the protocol's shape, the server alive after;
 *   - chat, completions and messages, streaming and not, agree with each
 *     other; stop strings; logprobs; usage with cached tokens;
 *   - batch invariance under load: 16 concurrent greedy requests each give
 *     exactly the text they give alone;
 *   - 50 streaming clients that drop at random points: afterwards the server
 *     answers and no request or KV is left running;
 *   - overload: 429 with Retry-After; graceful stop.
 */
#include "server_util.h"

#include <pthread.h>

#include <dirent.h>

#include "core/mapfile.h"
#include "core/util.h"
#include "ember.h"
#include "serve/serve.h"
#include "test.h"

static ember_server *start_spec(ember_model *m, ember_tokenizer *tok, ember_chat_template *tmpl, int max_queue,
                                ember_spec_mode spec) {
    ember_server_opts o = {0};
    o.spec = spec;
    o.model_id = "demo";
    o.max_queue = max_queue;
    o.max_body = 256 * 1024;
    return server_start(m, tok, tmpl, &o, 0);
}

static ember_server *start(ember_model *m, ember_tokenizer *tok, ember_chat_template *tmpl, int max_queue) {
    return start_spec(m, tok, tmpl, max_queue, EMBER_SPEC_NONE);
}

typedef struct bad_case {
    const char *method, *path, *body;
    int status;
    const char *needle; /* in the error message, or NULL */
} bad_case;

static void check_error_shape(const bad_case *c, int status, json_t *j) {
    bool anth = strcmp(c->path, "/v1/messages") == 0;
    CHECKF(status == c->status, "%s %s %.60s: status %d, want %d", c->method, c->path, c->body ? c->body : "", status,
           c->status);
    const json_t *msg = anth ? json_object_get(json_object_get(j, "error"), "message")
                             : json_object_get(json_object_get(j, "error"), "message");
    CHECKF(json_is_string(msg), "%s %.60s: no JSON error body", c->path, c->body ? c->body : "");
    if (anth) CHECK(json_is_string(json_object_get(j, "type")) && !strcmp(json_string_value(json_object_get(j, "type")), "error"));
    if (json_is_string(msg)) {
        const char *m = json_string_value(msg);
        CHECKF(!c->needle || strstr(m, c->needle), "%s %.60s: message '%s' lacks '%s'", c->path,
               c->body ? c->body : "", m, c->needle);
        CHECKF(!strstr(m, "0x"), "message may leak an address: %s", m);
    }
}

static void bad_requests(void) {
    static char big[300 * 1024];
    memset(big, ' ', sizeof big - 1);
    big[0] = '{';
    big[sizeof big - 2] = '}';
    static char deep[4096];
    size_t k = 0;
    for (int i = 0; i < 200; i++) deep[k++] = '[';
    for (int i = 0; i < 200; i++) deep[k++] = ']';
    deep[k] = 0;
#define B(extra) "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]," extra "}"
    const bad_case cases[] = {
        {"POST", "/v1/chat/completions", "{", 400, "invalid JSON"},
        {"POST", "/v1/chat/completions", "", 400, "invalid JSON"},
        {"POST", "/v1/chat/completions", "[]", 400, "JSON object"},
        {"POST", "/v1/chat/completions", "\"x\"", 400, NULL},
        {"POST", "/v1/chat/completions", "{}", 400, "messages"},
        {"POST", "/v1/chat/completions", "{\"messages\":[]}", 400, "non-empty"},
        {"POST", "/v1/chat/completions", "{\"messages\":\"hi\"}", 400, "messages"},
        {"POST", "/v1/chat/completions", "{\"messages\":[{\"content\":\"hi\"}]}", 400, "role"},
        {"POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"wizard\",\"content\":\"hi\"}]}", 400, "role"},
        {"POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "content"},
        {"POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\"}]}]}", 400,
         "content"},
        {"POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\"}]}", 400, "content"},
        {"POST", "/v1/chat/completions", B("\"temperature\":-1"), 400, "temperature"},
        {"POST", "/v1/chat/completions", B("\"temperature\":3"), 400, "temperature"},
        {"POST", "/v1/chat/completions", B("\"temperature\":\"hot\""), 400, "temperature"},
        {"POST", "/v1/chat/completions", B("\"temperature\":1e999"), 400, NULL},
        {"POST", "/v1/chat/completions", B("\"top_p\":1.5"), 400, "top_p"},
        {"POST", "/v1/chat/completions", B("\"top_p\":-0.1"), 400, "top_p"},
        {"POST", "/v1/chat/completions", B("\"top_k\":-5"), 400, "top_k"},
        {"POST", "/v1/chat/completions", B("\"min_p\":2"), 400, "min_p"},
        {"POST", "/v1/chat/completions", B("\"max_tokens\":0"), 400, "max_tokens"},
        {"POST", "/v1/chat/completions", B("\"max_tokens\":-3"), 400, "max_tokens"},
        {"POST", "/v1/chat/completions", B("\"max_tokens\":99999999999"), 400, "max_tokens"},
        {"POST", "/v1/chat/completions", B("\"max_tokens\":1.5"), 400, "max_tokens"},
        {"POST", "/v1/chat/completions", B("\"max_tokens\":100000"), 400, "maximum context length"},
        {"POST", "/v1/chat/completions", B("\"n\":2"), 400, "n = 1"},
        {"POST", "/v1/chat/completions", B("\"speculative\":\"yes\""), 400, "speculative"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"speculative\":1}", 400, "speculative"},
        {"POST", "/v1/chat/completions", B("\"presence_penalty\":5"), 400, "presence_penalty"},
        {"POST", "/v1/chat/completions", B("\"frequency_penalty\":\"x\""), 400, "frequency_penalty"},
        {"POST", "/v1/chat/completions", B("\"logit_bias\":{\"abc\":1}"), 400, "logit_bias"},
        {"POST", "/v1/chat/completions", B("\"logit_bias\":{\"99999\":1}"), 400, "logit_bias"},
        {"POST", "/v1/chat/completions", B("\"logit_bias\":{\"5\":1000}"), 400, "logit_bias"},
        {"POST", "/v1/chat/completions", B("\"logit_bias\":[1,2]"), 400, "logit_bias"},
        {"POST", "/v1/chat/completions", B("\"top_logprobs\":3"), 400, "logprobs"},
        {"POST", "/v1/chat/completions", B("\"logprobs\":true,\"top_logprobs\":50"), 400, "top_logprobs"},
        {"POST", "/v1/chat/completions", B("\"stop\":5"), 400, "stop"},
        {"POST", "/v1/chat/completions", B("\"stop\":[\"a\",1]"), 400, "stop"},
        {"POST", "/v1/chat/completions", B("\"stream\":\"yes\""), 400, "stream"},
        {"POST", "/v1/chat/completions", B("\"stream_options\":7"), 400, "stream_options"},
        {"POST", "/v1/chat/completions", B("\"seed\":\"x\""), 400, "seed"},
        {"POST", "/v1/chat/completions", B("\"model\":5"), 400, "model"},
        {"POST", "/v1/chat/completions", B("\"response_format\":{\"type\":\"json_schema\"}"), 400,
         "response_format"},
        {"POST", "/v1/chat/completions", deep, 400, "nested"},
        {"POST", "/v1/chat/completions", big, 413, "limit"},
        {"POST", "/v1/completions", "{}", 400, "prompt"},
        {"POST", "/v1/completions", "{\"prompt\":[]}", 400, "prompt"},
        {"POST", "/v1/completions", "{\"prompt\":[1,-2]}", 400, "prompt"},
        {"POST", "/v1/completions", "{\"prompt\":[1,999999]}", 400, "prompt"},
        {"POST", "/v1/completions", "{\"prompt\":[\"a\",\"b\"]}", 400, "prompt"},
        {"POST", "/v1/completions", "{\"prompt\":{\"a\":1}}", 400, "prompt"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"logprobs\":9}", 400, "logprobs"},
        {"POST", "/v1/completions", "{\"prompt\":\"hi\",\"echo\":true}", 400, "echo"},
        {"POST", "/v1/completions", "{\"prompt\":\"\"}", 400, "empty"},
        {"POST", "/v1/messages", "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", 400, "max_tokens"},
        {"POST", "/v1/messages", "{\"max_tokens\":5,\"messages\":[{\"role\":\"system\",\"content\":\"hi\"}]}", 400, "role"},
        {"POST", "/v1/messages", "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"temperature\":1.5}",
         400, "temperature"},
        {"POST", "/v1/messages", "{\"max_tokens\":5,\"system\":7,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
         400, "system"},
        {"POST", "/v1/messages", "nope", 400, "invalid JSON"},
        {"GET", "/v1/chat/completions", NULL, 405, "POST"},
        {"POST", "/v1/models", "{}", 405, "GET"},
        {"GET", "/v2/nothing", NULL, 404, "no endpoint"},
        {"DELETE", "/health", NULL, 405, NULL},
        {"POST", "/tokenize", "{\"content\":5}", 400, "content"},
        {"POST", "/detokenize", "{\"tokens\":[1,\"x\"]}", 400, "tokens"},
        {"POST", "/detokenize", "{\"tokens\":[-1]}", 400, "tokens"},
    };
#undef B
    int n = (int)(sizeof cases / sizeof cases[0]);
    CHECKF(n >= 40, "only %d bad-request cases", n);
    for (int i = 0; i < n; i++) {
        http_resp r;
        http_request(g_port, cases[i].method, cases[i].path, cases[i].body, &r);
        json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
        check_error_shape(&cases[i], r.status, j);
        json_decref(j);
        http_resp_free(&r);
    }
    CHECK(health() == 200);
    fprintf(stderr, "%d malformed requests answered\n", n);
}

/* Concatenated content of an SSE chat stream; checks its framing. */
static char *sse_chat_text(const char *body, json_t **usage, const char **finish) {
    static char fin[32];
    size_t cap = strlen(body) + 1, n = 0;
    char *text = calloc(1, cap);
    const char *p = body;
    bool done = false;
    *finish = NULL;
    while ((p = strstr(p, "data: "))) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        CHECK(e != NULL);
        if (!e) break;
        if (!strncmp(p, "[DONE]", 6)) {
            done = true;
            break;
        }
        json_t *j = json_loadb(p, (size_t)(e - p), 0, NULL);
        CHECKF(j != NULL, "bad SSE data: %.*s", (int)(e - p), p);
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
        const char *c = json_string_value(json_object_get(json_object_get(ch, "delta"), "content"));
        if (c) {
            size_t l = strlen(c);
            memcpy(text + n, c, l);
            n += l;
        }
        const char *f = json_string_value(json_object_get(ch, "finish_reason"));
        if (f) {
            snprintf(fin, sizeof fin, "%s", f);
            *finish = fin;
        }
        if (json_object_get(j, "usage") && usage) *usage = json_incref(json_object_get(j, "usage"));
        json_decref(j);
        p = e;
    }
    CHECK(done);
    text[n] = 0;
    return text;
}

static void protocol_checks(void) {
    int st;
    /* non-streaming and streaming chat agree (greedy) */
    const char *q = "{\"model\":\"x\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\","
                    "\"content\":[{\"type\":\"text\",\"text\":\"Hello\"},{\"type\":\"text\",\"text\":\"there\"}]}],"
                    "\"max_tokens\":12,\"temperature\":0%s}";
    char body[1024];
    snprintf(body, sizeof body, q, "");
    json_t *j = post("/v1/chat/completions", body, &st, NULL);
    CHECK(st == 200);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    const char *text = json_string_value(json_object_get(json_object_get(ch, "message"), "content"));
    CHECK(text != NULL);
    CHECK(!strcmp(json_string_value(json_object_get(j, "object")), "chat.completion"));
    json_t *u = json_object_get(j, "usage");
    CHECK(json_integer_value(json_object_get(u, "completion_tokens")) == 12);
    CHECK(json_is_integer(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")));
    int prompt_tokens = (int)json_integer_value(json_object_get(u, "prompt_tokens"));
    CHECK(prompt_tokens > 10);
    snprintf(body, sizeof body, q, ",\"stream\":true,\"stream_options\":{\"include_usage\":true}");
    http_resp r;
    http_request(g_port, "POST", "/v1/chat/completions", body, &r);
    CHECK(r.status == 200 && http_header(&r, "Content-Type") && strstr(http_header(&r, "Content-Type"), "text/event-stream"));
    json_t *su = NULL;
    const char *fin;
    char *stext = sse_chat_text(r.body, &su, &fin);
    CHECKF(text && !strcmp(stext, text), "stream '%s' vs '%s'", stext, text ? text : "");
    CHECK(fin && !strcmp(fin, "length"));
    CHECK(su && json_integer_value(json_object_get(su, "completion_tokens")) == 12);
    CHECK(su && json_integer_value(json_object_get(json_object_get(su, "prompt_tokens_details"), "cached_tokens")) ==
                    prompt_tokens - 1); /* the same prompt again: reused */
    json_decref(su);
    free(stext);
    http_resp_free(&r);
    /* cache_prompt: false reuses nothing; a cache_salt shares only with its own salt */
    {
        static const char *const extra[] = {",\"cache_prompt\":false", ",\"cache_salt\":\"tenant-a\"",
                                            ",\"cache_salt\":\"tenant-a\""};
        const int want[] = {0, 0, prompt_tokens - 1};
        for (int i = 0; i < 3; i++) {
            snprintf(body, sizeof body, q, extra[i]);
            json_t *jc = post("/v1/chat/completions", body, &st, NULL);
            json_t *uc = json_object_get(jc, "usage");
            CHECKF(st == 200 && json_integer_value(json_object_get(json_object_get(uc, "prompt_tokens_details"),
                                                                   "cached_tokens")) == want[i],
                   "cache option %d: status %d", i, st);
            const char *t2 = json_string_value(json_object_get(
                json_object_get(json_array_get(json_object_get(jc, "choices"), 0), "message"), "content"));
            CHECK(t2 && text && !strcmp(t2, text)); /* the same answer either way */
            json_decref(jc);
        }
        snprintf(body, sizeof body, q, ",\"cache_salt\":7");
        json_t *jb = post("/v1/chat/completions", body, &st, NULL);
        CHECK(st == 400 && strstr(json_string_value(json_object_get(json_object_get(jb, "error"), "message")), "cache_salt"));
        json_decref(jb);
    }
    /* stop strings: cut the text before the stop, finish "stop" */
    if (text && strlen(text) >= 4) {
        char stop[8];
        size_t tl = strlen(text);
        /* a stop string from the middle of the text: 2 bytes at a character boundary */
        size_t at = tl / 2;
        while (at > 0 && (text[at] & 0xc0) == 0x80) at--;
        size_t sl = 1;
        while (at + sl < tl && (text[at + sl] & 0xc0) == 0x80) sl++;
        memcpy(stop, text + at, sl);
        stop[sl] = 0;
        char sb[1024];
        json_t *stop_str = json_string(stop);
        char *stop_json = json_dumps(stop_str, JSON_ENCODE_ANY);
        json_decref(stop_str);
        snprintf(sb, sizeof sb, q, "");
        sb[strlen(sb) - 1] = 0;
        strcat(sb, ",\"stop\":");
        strcat(sb, stop_json);
        strcat(sb, "}");
        free(stop_json);
        json_t *sjr = post("/v1/chat/completions", sb, &st, NULL);
        json_t *c0 = json_array_get(json_object_get(sjr, "choices"), 0);
        const char *st_text = json_string_value(json_object_get(json_object_get(c0, "message"), "content"));
        const char *first = strstr(text, stop);
        CHECKF(st == 200 && st_text && first && strlen(st_text) == (size_t)(first - text) &&
                   !strncmp(st_text, text, strlen(st_text)),
               "stop '%s': got '%s' from '%s'", stop, st_text ? st_text : "", text);
        CHECK(!strcmp(json_string_value(json_object_get(c0, "finish_reason")), "stop"));
        json_decref(sjr);
    }
    json_decref(j);
    /* completions with token ids, logprobs */
    j = post("/v1/completions", "{\"prompt\":[72,101,108,108,111],\"max_tokens\":6,\"temperature\":0,\"logprobs\":3}", &st, NULL);
    CHECK(st == 200);
    ch = json_array_get(json_object_get(j, "choices"), 0);
    json_t *lp = json_object_get(ch, "logprobs");
    CHECK(json_array_size(json_object_get(lp, "tokens")) == 6 && json_array_size(json_object_get(lp, "token_logprobs")) == 6);
    double l0 = json_real_value(json_array_get(json_object_get(lp, "token_logprobs"), 0));
    CHECK(l0 <= 0 && l0 > -20);
    json_decref(j);
    /* chat logprobs: the greedy token is its own top alternative */
    j = post("/v1/chat/completions",
             "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":4,\"temperature\":0,\"logprobs\":true,"
             "\"top_logprobs\":2}",
             &st, NULL);
    CHECK(st == 200);
    json_t *content = json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs"), "content");
    CHECK(json_array_size(content) == 4);
    json_t *e0 = json_array_get(content, 0);
    CHECK(json_array_size(json_object_get(e0, "top_logprobs")) == 2);
    CHECK(json_real_value(json_object_get(json_array_get(json_object_get(e0, "top_logprobs"), 0), "logprob")) ==
          json_real_value(json_object_get(e0, "logprob")));
    CHECK(json_is_array(json_object_get(e0, "bytes")));
    json_decref(j);
    /* Anthropic messages: non-streaming and the exact streaming event order */
    const char *aq = "{\"model\":\"m\",\"max_tokens\":5,\"system\":\"sys\",\"messages\":[{\"role\":\"user\",\"content\":"
                     "[{\"type\":\"text\",\"text\":\"hi\"}]}],\"temperature\":0%s}";
    snprintf(body, sizeof body, aq, "");
    j = post("/v1/messages", body, &st, NULL);
    CHECK(st == 200 && !strcmp(json_string_value(json_object_get(j, "type")), "message"));
    CHECK(!strcmp(json_string_value(json_object_get(j, "stop_reason")), "max_tokens"));
    CHECK(json_integer_value(json_object_get(json_object_get(j, "usage"), "output_tokens")) == 5);
    const char *atext = json_string_value(json_object_get(json_array_get(json_object_get(j, "content"), 0), "text"));
    snprintf(body, sizeof body, aq, ",\"stream\":true");
    http_request(g_port, "POST", "/v1/messages", body, &r);
    const char *order[] = {"message_start", "content_block_start", "ping", "content_block_delta", "content_block_stop",
                           "message_delta", "message_stop"};
    int oi = 0;
    char stream_text[512] = "";
    for (const char *p = r.body; (p = strstr(p, "event: ")); p++) {
        p += 7;
        size_t l = strcspn(p, "\n");
        while (oi < 7 && (strlen(order[oi]) != l || strncmp(p, order[oi], l))) {
            if (oi == 3) oi++; /* deltas may be absent */
            else break;
        }
        CHECKF(oi < 7 && strlen(order[oi]) == l && !strncmp(p, order[oi], l), "unexpected event %.*s", (int)l, p);
        if (oi == 3) {
            const char *d = strstr(p, "data: ");
            json_t *dj = d ? json_loadb(d + 6, strcspn(d + 6, "\n"), 0, NULL) : NULL;
            const char *t = json_string_value(json_object_get(json_object_get(dj, "delta"), "text"));
            if (t) strncat(stream_text, t, sizeof stream_text - strlen(stream_text) - 1);
            json_decref(dj);
        } else if (oi < 7) {
            oi++;
        }
    }
    CHECKF(oi == 7, "stream ended at event %d", oi);
    CHECKF(atext && !strcmp(stream_text, atext), "messages stream '%s' vs '%s'", stream_text, atext ? atext : "");
    http_resp_free(&r);
    json_decref(j);
    /* models, tokenize round trip, metrics */
    http_request(g_port, "GET", "/v1/models", NULL, &r);
    j = json_loadb(r.body, r.body_len, 0, NULL);
    CHECK(r.status == 200 && !strcmp(json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id")), "demo"));
    json_decref(j);
    http_resp_free(&r);
    j = post("/tokenize", "{\"content\":\"héllo <|im_end|>\"}", &st, NULL);
    CHECK(st == 200 && json_array_size(json_object_get(j, "tokens")) == 8);
    char *toks = json_dumps(json_object_get(j, "tokens"), 0);
    char db[512];
    snprintf(db, sizeof db, "{\"tokens\":%s}", toks);
    free(toks);
    json_decref(j);
    j = post("/detokenize", db, &st, NULL);
    CHECK(st == 200 && !strcmp(json_string_value(json_object_get(j, "content")), "héllo <|im_end|>"));
    json_decref(j);
    http_request(g_port, "GET", "/metrics", NULL, &r);
    CHECK(r.status == 200 && strstr(r.body, "ember_requests_running 0") && strstr(r.body, "ember_time_to_first_token_seconds_bucket") &&
          strstr(r.body, "ember_inter_token_latency_seconds_count"));
    CHECK(strstr(r.body, "ember_prefix_cache_hits_total ") && strstr(r.body, "ember_prefix_cache_bytes ") &&
          strstr(r.body, "ember_prefix_cache_evictions_total "));
    CHECK(strstr(r.body, "ember_spec_drafted_total 0\n") && strstr(r.body, "ember_spec_accepted_total 0\n") &&
          strstr(r.body, "ember_spec_forwards_total 0\n") && strstr(r.body, "ember_decode_forwards_total ") &&
          strstr(r.body, "ember_decode_tokens_total "));
    /* requests ran before: the pools' high-water mark is above zero and at
       least what is held now */
    const char *tk = strstr(r.body, "\nember_kv_cache_touched_bytes "), *hk = strstr(r.body, "\nember_kv_cache_held_bytes ");
    CHECK(tk && hk);
    if (tk && hk) {
        double touched = strtod(tk + strlen("\nember_kv_cache_touched_bytes "), NULL);
        double held = strtod(hk + strlen("\nember_kv_cache_held_bytes "), NULL);
        CHECKF(touched > 0 && touched >= held, "touched %g, held %g", touched, held);
    }
    http_resp_free(&r);
}

/* ---- concurrency ------------------------------------------------------------------------------ */

typedef struct job {
    char body[512];
    char *text; /* result */
    int status;
    int drop_after; /* streaming clients: bytes to read before closing, -1 = all */
} job;

static void *run_job(void *arg) {
    job *jb = arg;
    if (jb->drop_after >= 0) {
        int fd = http_connect(g_port);
        if (fd >= 0) {
            http_send(fd, "POST", "/v1/chat/completions", jb->body, strlen(jb->body), NULL);
            size_t n;
            free(http_read_all(fd, (size_t)jb->drop_after, &n));
            close(fd);
        }
        return NULL;
    }
    int st;
    json_t *j = post("/v1/completions", jb->body, &st, NULL);
    jb->status = st;
    const char *t = json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
    jb->text = t ? strdup(t) : NULL;
    json_decref(j);
    return NULL;
}

static void batch_invariance(void) {
    enum { N = 16 };
    job jobs[N], solo[N];
    for (int i = 0; i < N; i++) {
        snprintf(jobs[i].body, sizeof jobs[i].body,
                 "{\"prompt\":[%d,%d,%d,%d,%d,%d],\"max_tokens\":%d,\"temperature\":%s,\"seed\":%d}", 40 + i, 50 + i,
                 60 + i % 7, 70, 80 + i, 90, 10 + i % 6, i % 2 ? "0.8" : "0", i);
        jobs[i].drop_after = -1;
        solo[i] = jobs[i];
        run_job(&solo[i]);
    }
    pthread_t th[N];
    for (int i = 0; i < N; i++) pthread_create(&th[i], NULL, run_job, &jobs[i]);
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
    int same = 0;
    for (int i = 0; i < N; i++) {
        CHECKF(jobs[i].status == 200 && solo[i].status == 200, "request %d: %d / %d", i, jobs[i].status, solo[i].status);
        bool eq = jobs[i].text && solo[i].text && !strcmp(jobs[i].text, solo[i].text);
        CHECKF(eq, "request %d: concurrent text differs from its solo run", i);
        same += eq;
        free(jobs[i].text);
        free(solo[i].text);
    }
    fprintf(stderr, "batch invariance: %d/%d concurrent requests identical to their solo runs\n", same, N);
}

static void disconnects(ember_server *s) {
    enum { N = 50 };
    static job jobs[N];
    pthread_t th[N];
    unsigned seed = 12345;
    for (int i = 0; i < N; i++) {
        snprintf(jobs[i].body, sizeof jobs[i].body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"client %d\"}],\"max_tokens\":200,\"stream\":true,"
                 "\"temperature\":0.7,\"seed\":%d}",
                 i, i);
        seed = seed * 1103515245u + 12345u;
        jobs[i].drop_after = (int)((seed >> 8) % 3000); /* 0: drop right after sending */
        pthread_create(&th[i], NULL, run_job, &jobs[i]);
    }
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
    (void)s;
    CHECKF(server_wait_idle(), "rows still running after the clients left");
    CHECK(health() == 200);
    int status;
    json_t *j = post("/v1/completions", "{\"prompt\":\"still there?\",\"max_tokens\":3}", &status, NULL);
    CHECK(status == 200);
    json_decref(j);
    fprintf(stderr, "50 dropped streaming clients: server idle and answering\n");
}

static void overload(ember_model *m, ember_tokenizer *tok, ember_chat_template *tmpl) {
    ember_server *s = start(m, tok, tmpl, 2); /* 4 rows (the model's) + 2 waiting */
    enum { N = 12 };
    job jobs[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        /* every request runs its whole length (no early end of sequence), so the
           twelve overlap even when a loaded machine starts the clients slowly */
        snprintf(jobs[i].body, sizeof jobs[i].body,
                 "{\"prompt\":\"load %d\",\"max_tokens\":480,\"temperature\":1,\"ignore_eos\":true}", i);
        jobs[i].drop_after = -1;
        pthread_create(&th[i], NULL, run_job, &jobs[i]);
    }
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
    int ok = 0, limited = 0;
    for (int i = 0; i < N; i++) {
        ok += jobs[i].status == 200;
        limited += jobs[i].status == 429;
        free(jobs[i].text);
    }
    CHECKF(ok >= 2 && limited >= 1 && ok + limited == N, "overload: %d ok, %d limited", ok, limited);
    http_resp r;
    /* Retry-After on a 429 */
    pthread_t t2[N];
    for (int i = 0; i < N; i++) pthread_create(&t2[i], NULL, run_job, &jobs[i]);
    usleep(200000);
    http_request(g_port, "POST", "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":300}", &r);
    if (r.status == 429) CHECK(http_header(&r, "Retry-After") != NULL);
    http_resp_free(&r);
    for (int i = 0; i < N; i++) {
        pthread_join(t2[i], NULL);
        free(jobs[i].text);
    }
    double t0 = ember_now();
    ember_server_stop(s, 2.0);
    CHECK(ember_now() - t0 < 10.0);
}

/* Copies file from to to, flipping byte `flip` (< 0: none) and keeping
   `keep` bytes (0: all). */
static void copy_damaged(const char *from, const char *to, long flip, long keep) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    CHECK(a && b);
    if (!a || !b) {
        if (a) fclose(a);
        if (b) fclose(b);
        return;
    }
    long i = 0;
    int c;
    while ((c = fgetc(a)) != EOF && (!keep || i < keep)) {
        fputc(i == flip ? c ^ 0x11 : c, b);
        i++;
    }
    fclose(a);
    fclose(b);
}

/* The prompt cache's disk tier across a restart: a server with a
   prompt_cache_dir answers, stops, and a new server over a freshly loaded
   model answers the same request from the file (cached_tokens, the same
   text), skipping (and removing) damaged and foreign files, and stays up. */
static void restart(const char *model_dir, ember_tokenizer *tok, ember_chat_template *tmpl) {
    char pc[700], cmd[1600];
    snprintf(pc, sizeof pc, "%s/server_pcache", EMBER_TEST_TMP);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", pc);
    CHECK(system(cmd) == 0);
    char body[4096] = "{\"messages\":[{\"role\":\"system\",\"content\":\"";
    for (int i = 0; i < 120; i++) {
        char w[24];
        snprintf(w, sizeof w, "rule%d ", i);
        strcat(body, w);
    }
    strcat(body, "\"},{\"role\":\"user\",\"content\":\"hello\"}],\"max_tokens\":8,\"temperature\":0}");
    char text0[512] = "";
    long prompt0 = 0;
    for (int pass = 0; pass < 3; pass++) {
        ember_model_params mp;
        ember_model_params_init(&mp);
        mp.n_rows = 2;
        mp.n_ctx = 1024;
        mp.n_threads = 2;
        ember_model *m;
        ember_error err = {0};
        CHECKF(ember_model_load(model_dir, &mp, &m, &err) == EMBER_OK, "%s", err.msg);
        char good[1000] = "", bad[1000];
        struct stat sb;
        if (pass > 0) { /* the file the first server wrote */
            DIR *d = opendir(pc);
            struct dirent *de;
            while (d && (de = readdir(d)))
                if (strstr(de->d_name, ".emkv") && strncmp(de->d_name, "00000000000000a", 15))
                    snprintf(good, sizeof good, "%s/%s", pc, de->d_name);
            if (d) closedir(d);
            CHECKF(good[0] && stat(good, &sb) == 0, "no prompt cache file in %s", pc);
        }
        if (pass == 2) { /* only a copy with a damaged payload: found when read, removed, a full prefill */
            snprintf(bad, sizeof bad, "%s/00000000000000b1.emkv", pc);
            copy_damaged(good, bad, (long)sb.st_size - 300, 0);
            CHECK(unlink(good) == 0);
        }
        if (pass == 1) { /* beside the good file: a corrupt, a truncated and a foreign one */
            snprintf(bad, sizeof bad, "%s/00000000000000a1.emkv", pc);
            copy_damaged(good, bad, (long)sb.st_size - 200, 0); /* payload: found on restore */
            snprintf(bad, sizeof bad, "%s/00000000000000a2.emkv", pc);
            copy_damaged(good, bad, -1, (long)sb.st_size / 2);
            snprintf(bad, sizeof bad, "%s/00000000000000a3.emkv", pc);
            copy_damaged(good, bad, 17, 0); /* the fingerprint: another model */
            snprintf(bad, sizeof bad, "%s/00000000000000a4.emkv", pc);
            FILE *f = fopen(bad, "wb");
            if (f) {
                fputs("not a cache file at all", f);
                fclose(f);
            }
        }
        ember_server_opts o = {0};
        o.model_id = "demo";
        o.prompt_cache_dir = pc;
        ember_server *s = NULL;
        for (int attempt = 0; attempt < 50 && !s; attempt++) {
            o.port = 20000 + (int)((getpid() * 11 + attempt * 137 + pass * 7) % 20000);
            if (ember_server_start(m, tok, tmpl, &o, &s, &err) != EMBER_OK) s = NULL;
        }
        CHECKF(s != NULL, "cannot start the server: %s", err.msg);
        if (!s) {
            ember_model_free(m);
            return;
        }
        g_port = o.port;
        int status;
        json_t *j = post("/v1/chat/completions", body, &status, NULL);
        CHECK(status == 200 && j);
        const char *text = json_string_value(json_object_get(
            json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message"), "content"));
        json_t *u = json_object_get(j, "usage");
        long np = (long)json_integer_value(json_object_get(u, "prompt_tokens"));
        long cached = (long)json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
        CHECK(text != NULL && np > 200);
        if (pass == 0) {
            CHECKF(cached == 0, "a fresh directory gave %ld cached tokens", cached);
            snprintf(text0, sizeof text0, "%s", text ? text : "");
            prompt0 = np;
        } else {
            long want = pass == 1 ? np - 1 : 0;
            CHECKF(cached == want && np == prompt0, "pass %d after a restart: %ld of %ld prompt tokens cached", pass,
                   cached, np);
            CHECKF(text && !strcmp(text, text0), "pass %d: the text after a restart differs", pass);
        }
        json_decref(j);
        CHECK(health() == 200);
        if (pass > 0) { /* pass 1: the truncated, foreign and garbage files at start (the corrupt
                           payload too if it was tried first); pass 2: the damaged copy when read */
            http_resp r;
            http_request(g_port, "GET", "/metrics", NULL, &r);
            const char *rm = r.body ? strstr(r.body, "\nember_prompt_cache_disk_removed_total ") : NULL;
            long removed = rm ? strtol(rm + strlen("\nember_prompt_cache_disk_removed_total "), NULL, 10) : -1;
            CHECKF(pass == 1 ? removed >= 3 && strstr(r.body, "\nember_prompt_cache_disk_restores_total 1")
                             : removed >= 1 && strstr(r.body, "\nember_prompt_cache_disk_restores_total 0"),
                   "pass %d: %ld files removed; metrics:\n%s", pass, removed, r.body ? r.body : "");
            http_resp_free(&r);
            CHECK(pass == 1 || access(bad, F_OK) != 0);
        }
        ember_server_stop(s, 5.0);
        ember_model_free(m);
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", pc);
    CHECK(system(cmd) == 0);
}

/* ---- speculative decoding ---------------------------------------------------------------------- */

/* A greedy completion of a repetitive prompt (token ids): its text. */
static char *spec_completion(const char *extra) {
    char body[1024];
    snprintf(body, sizeof body,
             "{\"prompt\":[5,6,7,8,9,5,6,7,8,9,5,6,7,8,9,5,6,7,8,9],\"max_tokens\":48,\"temperature\":0,"
             "\"ignore_eos\":true,\"cache_prompt\":false%s}",
             extra);
    int st;
    json_t *j = post("/v1/completions", body, &st, NULL);
    const char *t = json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
    CHECKF(st == 200 && t, "completion: status %d", st);
    char *r = t ? ember_strndup(t, strlen(t)) : NULL;
    json_decref(j);
    return r;
}

/* The metric's value in a /metrics body (-1 when absent). */
static double metric_value(const char *body, const char *name) {
    char pat[128];
    snprintf(pat, sizeof pat, "\n%s ", name);
    const char *p = strstr(body, pat);
    return p ? strtod(p + strlen(pat), NULL) : -1;
}

/* The same greedy completion from a plain server, a speculating one and a
   request opting out; drafts counted in /metrics only for the speculating
   request. */
static void speculative(ember_model *m, ember_tokenizer *tok, ember_chat_template *tmpl) {
    ember_server *s = start(m, tok, tmpl, 8);
    char *plain = spec_completion("");
    ember_server_stop(s, 2.0);
    s = start_spec(m, tok, tmpl, 8, EMBER_SPEC_NGRAM);
    char *off = spec_completion(",\"speculative\":false");
    http_resp r;
    http_request(g_port, "GET", "/metrics", NULL, &r);
    CHECKF(metric_value(r.body, "ember_spec_drafted_total") == 0, "opted out, yet drafted");
    http_resp_free(&r);
    char *spec = spec_completion(",\"speculative\":true");
    http_request(g_port, "GET", "/metrics", NULL, &r);
    double drafted = metric_value(r.body, "ember_spec_drafted_total"),
           accepted = metric_value(r.body, "ember_spec_accepted_total"),
           fw = metric_value(r.body, "ember_spec_forwards_total");
    http_resp_free(&r);
    CHECKF(plain && spec && off && !strcmp(plain, spec) && !strcmp(plain, off), "speculative text differs:\n%s\n%s",
           plain ? plain : "", spec ? spec : "");
    CHECKF(drafted > 0 && fw > 0 && accepted >= 0 && accepted <= drafted, "drafted %g accepted %g forwards %g", drafted,
           accepted, fw);
    free(plain);
    free(spec);
    free(off);
    ember_server_stop(s, 2.0);
}

int main(void) {
    shared_dir(); /* not needed, but keeps the suite's skip rule uniform */
    char dir[600], cmd[1400];
    snprintf(dir, sizeof dir, "%s/server_demo", EMBER_TEST_TMP);
    snprintf(cmd, sizeof cmd, "%s mkmodel --preset demo --out %s", EMBER_BIN, dir);
    CHECK(system(cmd) == 0);
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.n_rows = 4;
    mp.n_ctx = 512;
    mp.n_threads = 2;
    ember_model *m;
    ember_error err = {0};
    CHECKF(ember_model_load(dir, &mp, &m, &err) == EMBER_OK, "%s", err.msg);
    ember_tokenizer *tok;
    CHECKF(ember_tok_load(dir, &tok, &err) == EMBER_OK, "%s", err.msg);
    char p[700], *text;
    size_t len;
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    CHECK(ember_read_file(p, 1 << 20, &text, &len, &err) == 0);
    json_t *cfg = json_loadb(text, len, 0, NULL);
    const char *src = ember_chat_template_from_config(cfg, NULL);
    ember_chat_template *tmpl = NULL;
    CHECK(src && ember_chat_template_compile(src, strlen(src), &tmpl, &err) == EMBER_OK);
    json_decref(cfg);
    free(text);

    ember_server *s = start(m, tok, tmpl, 64);
    bad_requests();
    protocol_checks();
    batch_invariance();
    disconnects(s);
    ember_server_stop(s, 5.0);
    overload(m, tok, tmpl);
    restart(dir, tok, tmpl);
    speculative(m, tok, tmpl);

    ember_chat_template_free(tmpl);
    ember_tok_free(tok);
    ember_model_free(m);
    return test_done();
}
