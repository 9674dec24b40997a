/*
 * server.c - the HTTP front of ember: routing, limits, OpenAI / Anthropic
 * protocol handling, SSE streaming and metrics (see serve.h).
 *
 * Threads: libmicrohttpd gives every connection its own thread; a request's
 * whole life (body, validation, template, tokenization, submit, waiting on
 * the engine's events, writing the response) runs on it. Shared state is
 * the engine (thread-safe API), the tokenizer and template (immutable), and
 * the metrics (under srv->mu).
 *
 * Ownership: a req_ctx belongs to its connection and is freed when MHD
 * reports the request completed. A streaming response owns a gen_run (the
 * engine stream, text state, protocol state) freed by MHD's free callback,
 * which also cancels the engine request: a client that disconnects stops
 * its row at the next step.
 *
 * Errors: every failure a client can cause is an HTTP status with a JSON
 * body in the protocol's own shape; messages come from our validation and
 * never contain addresses or internals.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "core/fault.h"
#include "core/jsonutil.h"
#include "core/alloc.h"
#include "core/util.h"
#include "serve.h"
#include "serve_int.h"
#include "api/textgen.h"
#include "sample/gbudget.h"
#include "sample/grammar.h"

#define MAX_JSON_DEPTH 64
#define MAX_STOPS 16
#define MAX_STOP_LEN 512
#define POLL_MS 100

enum { PROTO_CHAT = 1, PROTO_COMPLETION, PROTO_ANTHROPIC, PROTO_RESPONSES };

/* ---- metrics ---------------------------------------------------------------------- */

#define N_TTFT 11
#define N_ITL 11
static const double k_ttft_b[N_TTFT] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
static const double k_itl_b[N_ITL] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};

typedef struct histo {
    uint64_t counts[16]; /* per bucket, plus +Inf last */
    double sum;
    uint64_t n;
} histo;

struct ember_server {
    ember_model *m;
    const ember_tokenizer *tok;
    const ember_chat_template *tmpl;
    ember_engine *eng;
    struct MHD_Daemon *d;
    ember_server_opts o;
    ember_model_info info;
    time_t created;
    atomic_int draining;
    atomic_int active; /* generation requests in flight */
    atomic_ulong next_id;
    pthread_mutex_t mu; /* metrics */
    histo ttft, itl;
    uint64_t http_by_code[6]; /* 1xx..5xx */
    uint64_t finished[5];     /* by ember_finish */
    int32_t keep_ids[8];      /* special tokens spelling the tool format's markers: kept in the text */
    int n_keep;
    /* constrained decoding: every token's bytes in a trie, made at the first request that needs it */
    pthread_mutex_t gv_mu;
    ember_gvocab *gv;
    resp_store rstore; /* finished Responses conversations, for previous_response_id */
};

static void histo_add(histo *h, const double *bounds, int nb, double v) {
    int i = 0;
    while (i < nb && v > bounds[i]) i++;
    h->counts[i]++;
    h->sum += v;
    h->n++;
}

/* ---- small helpers ------------------------------------------------------------------ */

/* Maximum nesting depth of a JSON text (brackets outside strings). */
static int json_depth(const char *s, size_t n) {
    int depth = 0, max = 0;
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = false;
        } else if (c == '"') {
            in_str = true;
        } else if (c == '[' || c == '{') {
            if (++depth > max) max = depth;
        } else if (c == ']' || c == '}') {
            depth--;
        }
    }
    return max;
}

/* The type of v for error messages ("an object", ...): core/jsonutil.h. */
static const char *jtype(const json_t *v) {
    return ember_json_type(v);
}

/* ---- responses -------------------------------------------------------------------------- */

static void count_code(ember_server *s, unsigned code) {
    pthread_mutex_lock(&s->mu);
    if (code >= 100 && code < 600) s->http_by_code[code / 100]++;
    pthread_mutex_unlock(&s->mu);
}

static enum MHD_Result send_body(ember_server *s, struct MHD_Connection *c, unsigned code, const char *type,
                                 const char *body, size_t len, int retry_after) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    if (retry_after > 0) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", retry_after);
        MHD_add_response_header(r, "Retry-After", ra);
    }
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    count_code(s, code);
    return ret;
}

static enum MHD_Result send_json(ember_server *s, struct MHD_Connection *c, unsigned code, json_t *j) {
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!body) return send_body(s, c, 500, "application/json", "{\"error\":{\"message\":\"out of memory\"}}", 37, 0);
    enum MHD_Result r = send_body(s, c, code, "application/json", body, strlen(body), 0);
    free(body);
    return r;
}

/* An error in the protocol's shape. */
static enum MHD_Result send_error(ember_server *s, struct MHD_Connection *c, int proto, unsigned code,
                                  const char *param, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static enum MHD_Result send_error(ember_server *s, struct MHD_Connection *c, int proto, unsigned code,
                                  const char *param, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *type;
    json_t *j;
    if (proto == PROTO_ANTHROPIC) {
        type = code == 400   ? "invalid_request_error"
               : code == 404 ? "not_found_error"
               : code == 413 ? "request_too_large"
               : code == 429 ? "rate_limit_error"
               : code == 503 ? "overloaded_error"
                             : "api_error";
        j = json_pack("{s:s, s:{s:s, s:o}}", "type", "error", "error", "type", type, "message", ember_json_string_clean(msg, strlen(msg)));
    } else {
        type = code == 400   ? "invalid_request_error"
               : code == 404 ? "not_found_error"
               : code == 413 ? "invalid_request_error"
               : code == 429 ? "rate_limit_exceeded"
               : code == 503 ? "service_unavailable"
                             : "server_error";
        j = json_pack("{s:{s:o, s:s, s:o, s:n}}", "error", "message", ember_json_string_clean(msg, strlen(msg)), "type", type,
                      "param", param ? json_string(param) : json_null(), "code");
    }
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    enum MHD_Result r;
    if (!body)
        r = send_body(s, c, 500, "application/json", "{\"error\":{\"message\":\"out of memory\"}}", 37, 0);
    else
        r = send_body(s, c, code, "application/json", body, strlen(body), (code == 429 || code == 503) ? 1 : 0);
    free(body);
    return r;
}

/* Whether the peer has closed the connection (EOF or error on a peek). */
static bool client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return true;
    char b;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
    return false;
}

/* ---- request validation ------------------------------------------------------------------ */

/* Optional number field in [lo, hi]; absent or null leaves *out. */
static int opt_num(const json_t *o, const char *k, double lo, double hi, double *out, bad *b) {
    const json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return fail(b, 400, k, "'%s' must be a number, not %s", k, jtype(v));
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi) return fail(b, 400, k, "'%s' must be between %g and %g, got %g", k, lo, hi, x);
    *out = x;
    return 0;
}

static int opt_int(const json_t *o, const char *k, long long lo, long long hi, long long *out, bad *b) {
    const json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) return fail(b, 400, k, "'%s' must be an integer, not %s", k, jtype(v));
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return fail(b, 400, k, "'%s' must be between %lld and %lld, got %lld", k, lo, hi, x);
    *out = x;
    return 0;
}

static int opt_bool(const json_t *o, const char *k, bool *out, bad *b) {
    const json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return fail(b, 400, k, "'%s' must be a boolean, not %s", k, jtype(v));
    *out = json_is_true(v);
    return 0;
}

/* Everything a generation request needs, protocol aside. */
typedef struct gen_req {
    int proto;
    bool stream, include_usage;
    int32_t *ids; /* malloc'd prompt */
    int n_ids;
    ember_gen_params g;
    ember_logit_bias *bias;
    char *stops[MAX_STOPS];
    int n_stops;
    bool max_tokens_given;
    int lp_mode; /* 0 none, 1 chat logprobs, 2 completion logprobs */
    json_t *tools;   /* the request's tools in OpenAI's shape (owned), NULL when none */
    int tool_choice; /* TOOLS_AUTO, ... */
    bool one_call;   /* parallel_tool_calls false / disable_parallel_tool_use: calls after the first are dropped */
    ember_grammar *gram; /* owned until submit: what the output must follow (tool_choice, response_format) */
    resp_req resp;   /* /v1/responses: the request translated, its response object and conversation */
    int32_t *script; /* TESTS ONLY (ember_test_output): tokens that replace the sampled ones */
    int n_script;
    bool script_ends; /* the script is shorter than max_tokens: its end is the end of the turn */
} gen_req;

enum { TOOLS_AUTO, TOOLS_NONE, TOOLS_REQUIRED, TOOLS_NAMED };

static void gen_req_free(gen_req *q) {
    free(q->ids);
    free(q->bias);
    json_decref(q->tools);
    ember_grammar_free(q->gram);
    if (q->g.constrain_free && q->g.constrain_user) q->g.constrain_free(q->g.constrain_user); /* never submitted */
    free(q->script);
    resp_req_free(&q->resp);
    for (int i = 0; i < q->n_stops; i++) free(q->stops[i]);
    memset(q, 0, sizeof *q);
}

static int parse_stops(const json_t *o, const char *k, gen_req *q, bad *b) {
    const json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    const json_t *one[1] = {v};
    size_t n = 1;
    if (json_is_array(v)) {
        n = json_array_size(v);
        if (n > MAX_STOPS) return fail(b, 400, k, "'%s' may hold at most %d strings", k, MAX_STOPS);
    } else if (!json_is_string(v)) {
        return fail(b, 400, k, "'%s' must be a string or an array of strings, not %s", k, jtype(v));
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_is_array(v) ? json_array_get(v, i) : one[0];
        if (!json_is_string(e)) return fail(b, 400, k, "'%s' entries must be strings", k);
        size_t len = json_string_length(e);
        if (len == 0) continue; /* an empty stop string never matches */
        if (len > MAX_STOP_LEN) return fail(b, 400, k, "stop strings are limited to %d bytes", MAX_STOP_LEN);
        if (memchr(json_string_value(e), 0, len)) return fail(b, 400, k, "stop strings may not contain NUL");
        q->stops[q->n_stops] = ember_strndup(json_string_value(e), len);
        if (!q->stops[q->n_stops]) return fail(b, 500, NULL, "out of memory");
        q->n_stops++;
    }
    return 0;
}

/* Sampling fields shared by the OpenAI endpoints (and most of Anthropic's). */
static int parse_sampling(ember_server *s, const json_t *o, gen_req *q, bad *b) {
    double temp = 1.0, top_p = 1.0, min_p = 0.0, pres = 0, freq = 0, rep = 1.0;
    long long top_k = 0, seed = 0, n = 1, max_tokens = -1;
    bool anth = q->proto == PROTO_ANTHROPIC;
    if (opt_num(o, "temperature", 0, anth ? 1 : 2, &temp, b) || opt_num(o, "top_p", 0, 1, &top_p, b) ||
        opt_num(o, "min_p", 0, 1, &min_p, b) || opt_int(o, "top_k", -1, 1 << 24, &top_k, b) ||
        opt_int(o, "seed", INT64_MIN, INT64_MAX, &seed, b))
        return -1;
    if (!anth && (opt_num(o, "presence_penalty", -2, 2, &pres, b) || opt_num(o, "frequency_penalty", -2, 2, &freq, b) ||
                  opt_num(o, "repetition_penalty", 1e-3, 10, &rep, b) || opt_int(o, "n", 1, 128, &n, b)))
        return -1;
    if (n != 1) return fail(b, 400, "n", "only n = 1 is supported");
    const char *mt_key = q->proto == PROTO_RESPONSES                       ? "max_output_tokens"
                         : json_object_get(o, "max_completion_tokens") ? "max_completion_tokens"
                                                                       : "max_tokens";
    if (opt_int(o, mt_key, 1, 1 << 30, &max_tokens, b)) return -1;
    if (anth && max_tokens < 0) return fail(b, 400, "max_tokens", "'max_tokens' is required");
    q->max_tokens_given = max_tokens > 0;
    q->g.max_tokens = max_tokens > 0 ? (int)max_tokens : 0;
    ember_sampling_init(&q->g.sampling);
    q->g.sampling.temperature = (float)temp;
    q->g.sampling.top_p = top_p > 0 ? (float)top_p : 1e-9f;
    q->g.sampling.min_p = (float)min_p;
    q->g.sampling.top_k = top_k > 0 ? (int)top_k : 0;
    q->g.sampling.seed = (uint64_t)seed;
    q->g.presence_penalty = (float)pres;
    q->g.frequency_penalty = (float)freq;
    q->g.repetition_penalty = (float)rep;
    bool ignore_eos = false, cache_prompt = true, speculative = true;
    if (opt_bool(o, "stream", &q->stream, b) || opt_bool(o, "ignore_eos", &ignore_eos, b) ||
        opt_bool(o, "cache_prompt", &cache_prompt, b) || opt_bool(o, "speculative", &speculative, b))
        return -1;
    q->g.ignore_eos = ignore_eos;
    q->g.no_prompt_cache = !cache_prompt;
    q->g.no_speculation = !speculative; /* only matters when the server speculates (--spec) */
    const json_t *salt = json_object_get(o, "cache_salt");
    if (salt && !json_is_null(salt)) { /* requests share cached prompt blocks only with the same salt */
        if (!json_is_string(salt) || json_string_length(salt) == 0 || json_string_length(salt) > 1024)
            return fail(b, 400, "cache_salt", "'cache_salt' must be a string of 1 to 1024 bytes");
        uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
        const unsigned char *c = (const unsigned char *)json_string_value(salt);
        for (size_t i = 0; i < json_string_length(salt); i++) h = (h ^ c[i]) * 0x100000001b3ull;
        q->g.cache_salt = h ? h : 1;
    }
    const json_t *so = json_object_get(o, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) return fail(b, 400, "stream_options", "'stream_options' must be an object");
        if (opt_bool(so, "include_usage", &q->include_usage, b)) return -1;
    }
    if (parse_stops(o, anth ? "stop_sequences" : "stop", q, b)) return -1;
    const json_t *lb = json_object_get(o, "logit_bias");
    if (!anth && lb && !json_is_null(lb)) {
        if (!json_is_object(lb)) return fail(b, 400, "logit_bias", "'logit_bias' must be an object");
        size_t nb = json_object_size(lb);
        if (nb > 1024) return fail(b, 400, "logit_bias", "'logit_bias' may hold at most 1024 entries");
        q->bias = ember_calloc(nb ? nb : 1, sizeof *q->bias);
        if (!q->bias) return fail(b, 500, NULL, "out of memory");
        const char *key;
        const json_t *val;
        json_object_foreach((json_t *)lb, key, val) {
            char *end;
            errno = 0;
            long t = strtol(key, &end, 10);
            if (!*key || *end || errno || t < 0 || t >= s->info.vocab_size)
                return fail(b, 400, "logit_bias", "logit_bias key '%.32s' is not a token id of this model", key);
            if (!json_is_number(val) || !isfinite(json_number_value(val)) || fabs(json_number_value(val)) > 100)
                return fail(b, 400, "logit_bias", "logit_bias values must be numbers between -100 and 100");
            q->bias[q->g.n_logit_bias++] = (ember_logit_bias){(int32_t)t, (float)json_number_value(val)};
        }
        q->g.logit_bias = q->bias;
    }
    return 0;
}

/* Text of a message's content: a string, or text parts joined by "\n". */
static int content_text(const json_t *c, strbuf *out, bool *ok) {
    *ok = true;
    if (!c || json_is_null(c)) return 0;
    if (json_is_string(c)) return sb_append(out, json_string_value(c), json_string_length(c));
    if (!json_is_array(c)) {
        *ok = false;
        return 0;
    }
    size_t i;
    const json_t *part;
    bool first = true;
    json_array_foreach(c, i, part) {
        const json_t *t = json_object_get(part, "type"), *tx = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(t) || strcmp(json_string_value(t), "text") || !json_is_string(tx)) {
            *ok = false;
            return 0;
        }
        if ((!first && sb_append(out, "\n", 1)) || sb_append(out, json_string_value(tx), json_string_length(tx)))
            return -1;
        first = false;
    }
    return 0;
}

/* ---- tools ------------------------------------------------------------------------------- */

#define MAX_TOOLS 128
#define MAX_CALL_ID 256

/* A function name as OpenAI and Anthropic accept them: ^[a-zA-Z0-9_-]{1,64}$. */
static bool tool_name_ok(const json_t *v) {
    if (!json_is_string(v)) return false;
    size_t n = json_string_length(v);
    const char *t = json_string_value(v);
    if (n == 0 || n > 64) return false;
    for (size_t i = 0; i < n; i++) {
        char c = t[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return false;
    }
    return true;
}

static bool has_tool(const json_t *tools, const char *name) {
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *n = json_object_get(json_object_get(t, "function"), "name");
        if (json_is_string(n) && !strcmp(json_string_value(n), name)) return true;
    }
    return false;
}

/* Validates the request's tools (OpenAI's or Anthropic's shape) into q->tools,
   in OpenAI's shape ({"type": "function", "function": {name, description,
   parameters}}), which is what chat templates read. */
static int parse_tools(const json_t *body, bool anth, gen_req *q, bad *b) {
    const json_t *tools = json_object_get(body, "tools");
    if (!tools || json_is_null(tools)) return 0;
    if (!json_is_array(tools)) return fail(b, 400, "tools", "'tools' must be an array");
    if (json_array_size(tools) > MAX_TOOLS) return fail(b, 400, "tools", "'tools' may hold at most %d tools", MAX_TOOLS);
    q->tools = json_array();
    if (!q->tools) return fail(b, 500, NULL, "out of memory");
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        if (!json_is_object(t)) return fail(b, 400, "tools", "tools[%zu] must be an object", i);
        const json_t *fn = anth ? t : json_object_get(t, "function");
        const json_t *ty = json_object_get(t, "type");
        if (anth) {
            if (ty && !json_is_null(ty) && !(json_is_string(ty) && !strcmp(json_string_value(ty), "custom")))
                return fail(b, 400, "tools", "tools[%zu]: only client tools (with 'input_schema') are supported, not '%.40s'",
                            i, json_is_string(ty) ? json_string_value(ty) : "?");
        } else {
            if (!json_is_string(ty) || strcmp(json_string_value(ty), "function"))
                return fail(b, 400, "tools", "tools[%zu].type must be \"function\"", i);
            if (!json_is_object(fn)) return fail(b, 400, "tools", "tools[%zu].function must be an object", i);
        }
        const json_t *name = json_object_get(fn, "name");
        if (!tool_name_ok(name))
            return fail(b, 400, "tools", "tools[%zu]: the name must be 1 to 64 characters of a-z, A-Z, 0-9, '_' and '-'", i);
        if (has_tool(q->tools, json_string_value(name)))
            return fail(b, 400, "tools", "tools[%zu]: the name '%s' is given twice", i, json_string_value(name));
        const json_t *desc = json_object_get(fn, "description");
        if (desc && !json_is_null(desc) && !json_is_string(desc))
            return fail(b, 400, "tools", "tools[%zu]: 'description' must be a string", i);
        const char *pk = anth ? "input_schema" : "parameters";
        const json_t *params = json_object_get(fn, pk);
        if (anth ? !json_is_object(params) : (params && !json_is_null(params) && !json_is_object(params)))
            return fail(b, 400, "tools", "tools[%zu]: '%s' must be an object (a JSON schema)", i, pk);
        const json_t *strict = json_object_get(fn, "strict");
        if (strict && !json_is_null(strict) && !json_is_boolean(strict))
            return fail(b, 400, "tools", "tools[%zu]: 'strict' must be a boolean", i);
        json_t *f;
        if (anth) {
            f = json_pack("{s:O}", "name", name);
            if (json_is_string(desc)) json_object_set(f, "description", (json_t *)desc);
            json_object_set(f, "parameters", (json_t *)params);
        } else {
            f = json_deep_copy(fn);
        }
        if (!f || json_array_append_new(q->tools, json_pack("{s:s, s:o}", "type", "function", "function", f)))
            return fail(b, 500, NULL, "out of memory");
    }
    if (json_array_size(q->tools) == 0) {
        json_decref(q->tools);
        q->tools = NULL;
    }
    return 0;
}

/* tool_choice and parallel_tool_calls (OpenAI) or tool_choice with
   disable_parallel_tool_use (Anthropic). Call after parse_tools. */
static int parse_tool_choice(const json_t *body, bool anth, gen_req *q, bad *b) {
    const json_t *tc = json_object_get(body, "tool_choice");
    q->tool_choice = TOOLS_AUTO;
    const char *named = NULL;
    if (anth) {
        if (tc && !json_is_null(tc)) {
            const json_t *ty = json_object_get(tc, "type");
            const char *t = json_string_value(ty);
            if (!json_is_object(tc) || !t)
                return fail(b, 400, "tool_choice", "'tool_choice' must be an object with a 'type'");
            if (!strcmp(t, "auto"))
                q->tool_choice = TOOLS_AUTO;
            else if (!strcmp(t, "none"))
                q->tool_choice = TOOLS_NONE;
            else if (!strcmp(t, "any"))
                q->tool_choice = TOOLS_REQUIRED;
            else if (!strcmp(t, "tool")) {
                q->tool_choice = TOOLS_NAMED;
                const json_t *n = json_object_get(tc, "name");
                if (!json_is_string(n)) return fail(b, 400, "tool_choice", "tool_choice {\"type\": \"tool\"} needs a 'name'");
                named = json_string_value(n);
            } else
                return fail(b, 400, "tool_choice", "tool_choice.type must be auto, any, tool or none, not '%.32s'", t);
            bool one = false;
            if (opt_bool(tc, "disable_parallel_tool_use", &one, b)) return -1;
            q->one_call = one;
        }
    } else {
        bool parallel = true;
        if (opt_bool(body, "parallel_tool_calls", &parallel, b)) return -1;
        q->one_call = !parallel;
        if (json_is_string(tc)) {
            const char *t = json_string_value(tc);
            if (!strcmp(t, "auto"))
                q->tool_choice = TOOLS_AUTO;
            else if (!strcmp(t, "none"))
                q->tool_choice = TOOLS_NONE;
            else if (!strcmp(t, "required"))
                q->tool_choice = TOOLS_REQUIRED;
            else
                return fail(b, 400, "tool_choice", "'tool_choice' must be none, auto, required or a named function, not '%.32s'", t);
        } else if (json_is_object(tc)) {
            const json_t *ty = json_object_get(tc, "type");
            const json_t *n = json_object_get(json_object_get(tc, "function"), "name");
            if (!json_is_string(ty) || strcmp(json_string_value(ty), "function") || !json_is_string(n))
                return fail(b, 400, "tool_choice",
                            "a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}");
            q->tool_choice = TOOLS_NAMED;
            named = json_string_value(n);
        } else if (tc && !json_is_null(tc)) {
            return fail(b, 400, "tool_choice", "'tool_choice' must be a string or an object, not %s", jtype(tc));
        }
    }
    if ((q->tool_choice == TOOLS_REQUIRED || q->tool_choice == TOOLS_NAMED) && !q->tools)
        return fail(b, 400, "tool_choice", "this 'tool_choice' needs 'tools'");
    if (named && !has_tool(q->tools, named))
        return fail(b, 400, "tool_choice", "tool_choice names '%.64s', which is not one of 'tools'", named);
    return 0;
}

static int tool_grammar(ember_server *s, const gen_req *q, const char *named, bad *b);

/* The name a named tool_choice gives (NULL for others). */
static const char *choice_name(const json_t *body, bool anth) {
    const json_t *tc = json_object_get(body, "tool_choice");
    return json_string_value(anth ? json_object_get(tc, "name") : json_object_get(json_object_get(tc, "function"), "name"));
}

/* An enforced tool_choice (required / any / named) as the grammar of one call. */
static int enforce_tool_choice(ember_server *s, const json_t *body, bool anth, gen_req *q, bad *b) {
    if (q->tool_choice != TOOLS_REQUIRED && q->tool_choice != TOOLS_NAMED) return 0;
    return tool_grammar(s, q, q->tool_choice == TOOLS_NAMED ? choice_name(body, anth) : NULL, b);
}

/* ---- constrained decoding ------------------------------------------------------------------ */

/* The bytes of the GPT-2 byte-level alphabet's code point cp, or -1. */
static int bytelevel_byte(unsigned cp) {
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255)) return (int)cp;
    if (cp < 256 || cp > 323) return -1;
    unsigned k = cp - 256; /* the k-th byte outside the ranges above */
    for (int b = 0; b < 256; b++) {
        bool in = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        if (!in && k-- == 0) return b;
    }
    return -1;
}

/* What token id writes in the middle of a text, into buf (up to 256 bytes):
   byte-level vocabularies map their alphabet back to bytes; SentencePiece
   ones write U+2581 as a space and <0xNN> as the byte. false: unknown. */
static bool token_bytes(const ember_tokenizer *tok, bool bytelevel, int32_t id, char *buf, size_t *n) {
    size_t len = 0;
    const char *t = ember_tok_id_text(tok, id, &len);
    if (!t || len == 0 || len > 256) return false;
    *n = 0;
    if (!bytelevel && len == 6 && !memcmp(t, "<0x", 3) && t[5] == '>') {
        buf[(*n)++] = (char)strtol(t + 3, NULL, 16);
        return true;
    }
    const unsigned char *u = (const unsigned char *)t;
    for (size_t i = 0; i < len;) {
        unsigned cp = u[i];
        size_t l = cp < 0x80 ? 1 : (cp >> 5) == 6 ? 2 : (cp >> 4) == 14 ? 3 : 4;
        if (i + l > len) return false;
        if (l == 2) cp = (cp & 0x1fu) << 6 | (u[i + 1] & 0x3fu);
        if (l == 3) cp = (cp & 0x0fu) << 12 | (u[i + 1] & 0x3fu) << 6 | (u[i + 2] & 0x3fu);
        if (bytelevel) {
            int b = l <= 2 ? bytelevel_byte(cp) : -1;
            if (b < 0) return false;
            buf[(*n)++] = (char)b;
        } else if (l == 3 && cp == 0x2581) {
            buf[(*n)++] = ' ';
        } else {
            memcpy(buf + *n, t + i, l);
            *n += l;
        }
        i += l;
    }
    return true;
}

int ember_serve_gvocab_new(const ember_tokenizer *tok, int n_rows, const int32_t *eos, int n_eos,
                           const int32_t *keep, int n_keep, ember_gvocab **out, ember_error *err) {
    int n = n_rows, nt = ember_tok_n_vocab(tok);
    bool bytelevel = ember_tok_text_id(tok, "\xc4\xa0", 2) >= 0; /* "Ġ": spaces as the byte alphabet writes them */
    char **bytes = ember_calloc((size_t)n, sizeof *bytes);
    size_t *lens = ember_calloc((size_t)n, sizeof *lens);
    bool *end = ember_calloc((size_t)n, sizeof *end);
    char buf[1024];
    bool ok = bytes && lens && end;
    for (int i = 0; ok && i < n; i++) {
        for (int k = 0; k < n_eos; k++) end[i] |= eos[k] == i;
        if (i >= nt || end[i]) continue;
        size_t len = 0;
        if (ember_tok_is_special(tok, i)) {
            bool kept = false;
            for (int k = 0; k < n_keep; k++) kept |= keep[k] == i;
            const char *t = kept ? ember_tok_id_text(tok, i, &len) : NULL;
            if (!t || len > sizeof buf) continue;
            memcpy(buf, t, len);
        } else if (!token_bytes(tok, bytelevel, i, buf, &len)) {
            continue;
        }
        bytes[i] = ember_malloc(len ? len : 1);
        if (!bytes[i]) ok = false;
        else memcpy(bytes[i], buf, len);
        lens[i] = len;
    }
    int rc = ok ? ember_gvocab_new(n, (const char *const *)bytes, lens, end, out, err)
                : ember_err(err, EMBER_ERR_NOMEM, "out of memory building the vocabulary's trie");
    for (int i = 0; bytes && i < n; i++) free(bytes[i]);
    free(bytes);
    free(lens);
    free(end);
    return rc;
}

/* The vocabulary's trie for constrained decoding (made on first use). */
static const ember_gvocab *server_gvocab(ember_server *s, bad *b) {
    pthread_mutex_lock(&s->gv_mu);
    if (!s->gv) {
        ember_error err = {0};
        if (ember_serve_gvocab_new(s->tok, s->info.vocab_size, s->info.eos_ids, s->info.n_eos, s->keep_ids, s->n_keep,
                                   &s->gv, &err)) {
            pthread_mutex_unlock(&s->gv_mu);
            fail(b, 500, NULL, "out of memory building the vocabulary's trie");
            return NULL;
        }
    }
    const ember_gvocab *v = s->gv;
    pthread_mutex_unlock(&s->gv_mu);
    return v;
}

/* A JSON string's text quoted, into out (room for 2 * 64 + 3). */
static void quoted(char *out, size_t n, const char *name) {
    snprintf(out, n, "\"%s\"", name);
}

/* The grammar of one forced call in the server's tool format: every tool
   (tool_choice required / any) or the named one, its arguments following
   its parameters schema. */
/* A Qwen3-Coder call's body after its head: the required parameters in the
   schema's order, each <parameter=P>\n VALUE </parameter>\n (a string's
   value raw text, the parser's reading; any other type's a JSON value
   between line breaks), then </function>. Optional parameters are left out.
   Returns the node, or < 0 with the 400 / 500 in b. */
static int coder_body(ember_grammar *g, const json_t *params, const char *where, bad *b) {
    const json_t *props = json_object_get(params, "properties"), *req = json_object_get(params, "required");
    ember_error err = {0};
    int parts[130], np = 0;
    const char *key;
    const json_t *ps;
    json_object_foreach((json_t *)props, key, ps) {
        bool required = false;
        size_t i;
        const json_t *r;
        json_array_foreach(req, i, r) required |= json_is_string(r) && !strcmp(json_string_value(r), key);
        if (!required) continue;
        if (np + 3 > 128) return fail(b, 400, "tools", "%s: too many required parameters to enforce", where);
        if (strpbrk(key, "<>\n") || strlen(key) > 200)
            return fail(b, 400, "tools", "%s: parameter names with '<', '>' or line breaks cannot be enforced", where);
        /* the parser reads a value as raw text when the type is string, lists string, or is absent */
        const json_t *ty = json_object_get(ps, "type");
        bool text = !ty || (json_is_string(ty) && !strcmp(json_string_value(ty), "string"));
        size_t x;
        const json_t *tv;
        json_array_foreach(ty, x, tv) text |= json_is_string(tv) && !strcmp(json_string_value(tv), "string");
        const json_t *en = json_object_get(ps, "enum"), *cn = json_object_get(ps, "const");
        int value = -1;
        if (text && (en || cn)) { /* an enum of strings: one of them, raw */
            const char *heads[256];
            size_t nh = cn ? 1 : json_array_size(en);
            bool ok = nh > 0 && nh <= 256;
            for (size_t h = 0; ok && h < nh; h++) {
                const json_t *v = cn ? cn : json_array_get(en, h);
                heads[h] = json_string_value(v);
                ok = json_is_string(v) && json_string_length(v) > 0 && !strpbrk(heads[h], "<\n");
            }
            if (!ok)
                return fail(b, 400, "tools",
                            "%s.properties.%.60s: with the 'qwen3_coder' format an enum read as raw text must hold 1 to "
                            "256 non-empty strings without '<' or line breaks",
                            where, key);
            value = ember_grammar_choice(g, heads, NULL, (int)nh, &err);
        } else if (text && (json_object_get(ps, "pattern") || json_object_get(ps, "minLength") ||
                            json_object_get(ps, "maxLength") || json_object_get(ps, "format"))) {
            return fail(b, 400, "tools",
                        "%s.properties.%.60s: a string parameter with a pattern or a length cannot be enforced with "
                        "the 'qwen3_coder' format (its values are raw text)",
                        where, key);
        }
        char open[256], sub[200];
        snprintf(open, sizeof open, "<parameter=%s>\n", key);
        snprintf(sub, sizeof sub, "%.100s.properties.%.60s", where, key);
        parts[np++] = ember_grammar_literal(g, open, strlen(open), &err);
        parts[np++] = value >= 0 || (text && (en || cn)) ? value
                      : text                              ? ember_grammar_text(g, &err)
                                                          : ember_grammar_schema(g, ps, params, sub, &err);
        parts[np++] = text ? ember_grammar_literal(g, "</parameter>\n", 13, &err)
                           : ember_grammar_literal(g, "\n</parameter>\n", 14, &err);
        for (int x = np - 3; x < np; x++)
            if (parts[x] < 0) return fail(b, err.code == EMBER_ERR_NOMEM ? 500 : 400, "tools", "%s", err.msg);
    }
    parts[np++] = ember_grammar_literal(g, "</function>", 11, &err);
    int k = parts[np - 1] < 0 ? -1 : ember_grammar_seq(g, parts, np, &err);
    if (k < 0) return fail(b, 500, NULL, "%s", err.msg);
    return k;
}

/* An enforced call in Gemma 4's format: each tool's schema checked as for
   the other formats, then written as a GBNF grammar (gemma_grammar.c). */
static int gemma_tool_grammar(const gen_req *q, const char *named, bad *b) {
    size_t i;
    const json_t *t;
    json_array_foreach(q->tools, i, t) {
        const json_t *fn = json_object_get(t, "function"), *params = json_object_get(fn, "parameters");
        if (named && strcmp(json_string_value(json_object_get(fn, "name")), named)) continue;
        char where[64];
        snprintf(where, sizeof where, "tools[%zu] parameters", i);
        const json_t *ty = json_object_get(params, "type");
        if (ty && !(json_is_string(ty) && !strcmp(json_string_value(ty), "object")))
            return fail(b, 400, "tools", "%s: a tool's parameters must describe an object to be enforced", where);
        ember_grammar *chk = ember_grammar_new();
        ember_error err = {0};
        int k = !chk ? ember_err(&err, EMBER_ERR_NOMEM, "out of memory")
                : json_object_size(params) ? ember_grammar_schema(chk, params, params, where, &err) : 0;
        ember_grammar_free(chk);
        if (k < 0) return fail(b, err.code == EMBER_ERR_NOMEM ? 500 : 400, "tools", "%s", err.msg);
    }
    char *text = NULL, why[256];
    int rc = gemma_call_gbnf(q->tools, named, &text, why, sizeof why);
    if (rc) return fail(b, rc == -2 ? 500 : 400, "tools", "%s", why);
    ember_grammar *g = ember_grammar_new();
    ember_error err = {0};
    rc = g ? ember_grammar_gbnf(g, text, strlen(text), &err) : ember_err(&err, EMBER_ERR_NOMEM, "out of memory");
    free(text);
    if (rc) {
        ember_grammar_free(g);
        return fail(b, err.code == EMBER_ERR_NOMEM ? 500 : 400, "tools", "gemma4 tool call: %s", err.msg);
    }
    ((gen_req *)q)->gram = g;
    return 0;
}

static int tool_grammar(ember_server *s, const gen_req *q, const char *named, bad *b) {
    ember_tool_format f = s->o.tool_format;
    if (f == EMBER_TOOLS_GEMMA4) return gemma_tool_grammar(q, named, b);
    if (f != EMBER_TOOLS_HERMES && f != EMBER_TOOLS_LLAMA3 && f != EMBER_TOOLS_MISTRAL && f != EMBER_TOOLS_QWEN3_CODER)
        return fail(b, 400, "tool_choice",
                    "this tool_choice cannot be enforced with the '%s' tool-call format (enforced: hermes, "
                    "qwen3_coder, llama3_json, mistral, gemma4); use \"auto\"",
                    ember_tool_format_name(f));
    ember_grammar *g = ember_grammar_new();
    if (!g) return fail(b, 500, NULL, "out of memory");
    ((gen_req *)q)->gram = g;
    bool mistral_args = f == EMBER_TOOLS_MISTRAL && ember_tok_text_id(s->tok, "[ARGS]", 6) >= 0;
    size_t nt = json_array_size(q->tools), k = 0, i;
    char **heads = ember_calloc(nt, sizeof *heads);
    int *next = ember_calloc(nt, sizeof *next);
    if (!heads || !next) {
        free(heads);
        free(next);
        return fail(b, 500, NULL, "out of memory");
    }
    int rc = 0;
    ember_error err = {0};
    const json_t *t;
    json_array_foreach(q->tools, i, t) {
        const json_t *fn = json_object_get(t, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (named && strcmp(name, named)) continue;
        const json_t *params = json_object_get(fn, "parameters");
        char where[64];
        snprintf(where, sizeof where, "tools[%zu] parameters", i);
        bool coder = f == EMBER_TOOLS_QWEN3_CODER;
        int args = coder ? 0
                   : json_is_object(params) && json_object_size(params) ? ember_grammar_schema(g, params, params, where, &err)
                                                                        : ember_grammar_any_object(g, &err);
        if (!coder && args < 0) {
            rc = fail(b, err.code == EMBER_ERR_NOMEM ? 500 : 400, "tools", "%s", err.msg);
            break;
        }
        const json_t *ty = json_object_get(params, "type");
        if (ty && !(json_is_string(ty) && !strcmp(json_string_value(ty), "object"))) {
            rc = fail(b, 400, "tools", "%s: a tool's parameters must describe an object to be enforced", where);
            break;
        }
        char q1[160], h[400];
        quoted(q1, sizeof q1, name);
        int close = -1;
        if (coder) {
            if (ember_grammar_schema(g, params, params, where, &err) < 0) { /* the whole schema checked, as elsewhere */
                rc = fail(b, err.code == EMBER_ERR_NOMEM ? 500 : 400, "tools", "%s", err.msg);
                break;
            }
            snprintf(h, sizeof h, "<function=%s>\n", name);
            next[k] = coder_body(g, params, where, b);
            if (next[k] < 0) {
                rc = -1;
                break;
            }
        } else if (mistral_args) {
            snprintf(h, sizeof h, "%s[ARGS]", name);
            next[k] = args;
        } else {
            snprintf(h, sizeof h, "{\"name\": %s, \"%s\": ", q1, f == EMBER_TOOLS_LLAMA3 ? "parameters" : "arguments");
            close = ember_grammar_literal(g, "}", 1, &err);
            int parts[2] = {args, close};
            next[k] = close < 0 ? -1 : ember_grammar_seq(g, parts, 2, &err);
            if (next[k] < 0) {
                rc = fail(b, 500, NULL, "%s", err.msg);
                break;
            }
        }
        heads[k] = ember_strdup(h);
        if (!heads[k++]) {
            rc = fail(b, 500, NULL, "out of memory");
            break;
        }
    }
    int body = rc ? -1 : ember_grammar_choice(g, (const char *const *)heads, next, (int)k, &err);
    for (size_t x = 0; x < k; x++) free(heads[x]);
    free(heads);
    free(next);
    if (rc) return rc;
    if (body < 0) return fail(b, 400, "tools", "%s", err.msg);
    int parts[3], np = 0;
    bool tc = f == EMBER_TOOLS_HERMES || f == EMBER_TOOLS_QWEN3_CODER;
    const char *open = tc ? "<tool_call>\n" : f == EMBER_TOOLS_MISTRAL ? (mistral_args ? "[TOOL_CALLS]" : "[TOOL_CALLS][") : NULL;
    const char *close = tc ? "\n</tool_call>" : f == EMBER_TOOLS_MISTRAL && !mistral_args ? "]" : NULL;
    if (open) parts[np++] = ember_grammar_literal(g, open, strlen(open), &err);
    parts[np++] = body;
    if (close) parts[np++] = ember_grammar_literal(g, close, strlen(close), &err);
    for (int x = 0; x < np; x++)
        if (parts[x] < 0) return fail(b, 500, NULL, "%s", err.msg);
    int root = ember_grammar_seq(g, parts, np, &err);
    if (root < 0 || ember_grammar_set_root(g, root, &err)) return fail(b, 500, NULL, "%s", err.msg);
    return 0;
}

/* response_format {"type": "json_object"} or {"type": "json_schema", "json_schema": {"schema", ...}};
   field: what the client called it (response_format, or text.format on /v1/responses), for errors. */
static int format_grammar(const json_t *rf, const char *field, gen_req *q, bad *b) {
    const char *t = json_string_value(json_object_get(rf, "type"));
    if (!json_is_object(rf) || !t)
        return fail(b, 400, "response_format", "'response_format' must be an object with a 'type'");
    if (!strcmp(t, "text")) return 0;
    if (strcmp(t, "json_object") && strcmp(t, "json_schema"))
        return fail(b, 400, "response_format", "response_format.type must be text, json_object or json_schema, not '%.32s'",
                    t);
    if (q->gram) return fail(b, 400, field, "'%s' with an enforced 'tool_choice' is not supported", field);
    const json_t *js = json_object_get(rf, "json_schema"), *sch = json_object_get(js, "schema");
    if (!strcmp(t, "json_schema")) {
        if (!json_is_object(js) || !json_is_string(json_object_get(js, "name")))
            return fail(b, 400, "response_format", "response_format.json_schema must be an object with a 'name'");
        if (sch && !json_is_object(sch))
            return fail(b, 400, "response_format", "response_format.json_schema.schema must be an object");
    }
    q->gram = ember_grammar_new();
    if (!q->gram) return fail(b, 500, NULL, "out of memory");
    ember_error err = {0};
    char where[64];
    snprintf(where, sizeof where, "%s", strcmp(field, "response_format") ? "text.format.schema" : "response_format.json_schema.schema");
    int root = sch ? ember_grammar_schema(q->gram, sch, sch, where, &err) : ember_grammar_any_object(q->gram, &err);
    if (root < 0) return fail(b, err.code == EMBER_ERR_NOMEM ? 500 : 400, field, "%s", err.msg);
    if (ember_grammar_set_root(q->gram, root, &err)) return fail(b, 500, NULL, "%s", err.msg);
    return 0;
}

/* The constraint a request names directly: a GBNF grammar ("grammar", or
   vLLM's "guided_grammar" / "structured_outputs": {"grammar"}) or a regular
   expression the whole output matches (vLLM's "guided_regex" /
   "structured_outputs": {"regex"}). At most one, and not together with
   response_format or an enforced tool_choice (400 naming both). A request
   with no constraint at all takes the server's default grammar
   (--grammar-file), when it has one. */
static int direct_grammar(ember_server *s, const json_t *body, gen_req *q, bad *b) {
    static const char *const k_fields[] = {"grammar", "guided_grammar", "guided_regex", "structured_outputs"};
    const char *field = NULL, *text = NULL;
    bool regex = false;
    for (int i = 0; i < 4; i++) {
        const json_t *v = json_object_get(body, k_fields[i]);
        if (!v || json_is_null(v)) continue;
        if (field) return fail(b, 400, k_fields[i], "'%s' and '%s' both constrain the output: give one", field, k_fields[i]);
        field = k_fields[i];
        if (i == 3) {
            const json_t *rx = json_object_get(v, "regex"), *gr = json_object_get(v, "grammar");
            const char *key;
            const json_t *x;
            if (!json_is_object(v)) return fail(b, 400, field, "'structured_outputs' must be an object");
            json_object_foreach((json_t *)v, key, x) {
                if (strcmp(key, "regex") && strcmp(key, "grammar") && !json_is_null(x))
                    return fail(b, 400, field,
                                "structured_outputs.%.32s is not supported (regex and grammar are; JSON schemas go in "
                                "response_format)",
                                key);
            }
            if (!!json_is_string(rx) + !!json_is_string(gr) != 1)
                return fail(b, 400, field, "'structured_outputs' must hold one string: 'regex' or 'grammar'");
            regex = json_is_string(rx);
            v = regex ? rx : gr;
        } else if (!json_is_string(v)) {
            return fail(b, 400, field, "'%s' must be a string, not %s", field, jtype(v));
        }
        regex = regex || i == 2;
        text = json_string_value(v);
    }
    if (field && q->gram)
        return fail(b, 400, field, "'%s' together with response_format or an enforced tool_choice is not supported",
                    field);
    if (!field && (q->gram || !s->o.default_grammar)) return 0;
    if (!field) text = s->o.default_grammar;
    q->gram = ember_grammar_new();
    if (!q->gram) return fail(b, 500, NULL, "out of memory");
    ember_error err = {0};
    int rc = regex ? ember_grammar_regex(q->gram, text, field, &err)
                   : ember_grammar_gbnf(q->gram, text, strlen(text), &err);
    if (rc) return fail(b, err.code == EMBER_ERR_NOMEM ? 500 : 400, field ? field : "grammar", "%s%s", field ? "" : "--grammar-file: ", err.msg);
    return 0;
}

/* Moves q->gram into a constraint on q->g (the vocabulary's trie made
   first): an ember_gbudget owning the grammar, freed by the engine. */
static int attach_grammar(ember_server *s, gen_req *q, bad *b) {
    if (!q->gram) return 0;
    const ember_gvocab *v = server_gvocab(s, b);
    if (!v) return -1;
    ember_gbudget *c;
    ember_error err = {0};
    if (ember_gbudget_new(q->gram, v, q->g.max_tokens, &c, &err)) return fail(b, 500, NULL, "out of memory");
    ember_gbudget_own_grammar(c, q->gram);
    q->gram = NULL;
    q->g.constrain_mask = ember_gbudget_mask;
    q->g.constrain_accept = ember_gbudget_accept;
    q->g.constrain_free = ember_gbudget_free;
    q->g.constrain_user = c;
    return 0;
}

/* Checks an OpenAI assistant message's tool_calls in place (copy is the
   message's own copy): ids recorded in ids, arguments given as JSON text
   turned into objects (chat templates read them as mappings). */
static int check_tool_calls(json_t *copy, size_t i, json_t *ids, bad *b) {
    json_t *tcs = json_object_get(copy, "tool_calls");
    if (!tcs || json_is_null(tcs)) {
        json_object_del(copy, "tool_calls");
        return 0;
    }
    if (!json_is_array(tcs)) return fail(b, 400, "messages", "messages[%zu].tool_calls must be an array", i);
    if (json_array_size(tcs) > 1024) return fail(b, 400, "messages", "messages[%zu]: too many tool calls", i);
    size_t k;
    json_t *tc;
    json_array_foreach(tcs, k, tc) {
        json_t *fn = json_object_get(tc, "function");
        const json_t *id = json_object_get(tc, "id"), *ty = json_object_get(tc, "type");
        if (!json_is_object(tc) || !json_is_object(fn))
            return fail(b, 400, "messages", "messages[%zu].tool_calls[%zu] must be an object with a 'function'", i, k);
        if (!json_is_string(id) || json_string_length(id) == 0 || json_string_length(id) > MAX_CALL_ID)
            return fail(b, 400, "messages", "messages[%zu].tool_calls[%zu].id must be a string of 1 to %d bytes", i, k,
                        MAX_CALL_ID);
        if (ty && !json_is_null(ty) && !(json_is_string(ty) && !strcmp(json_string_value(ty), "function")))
            return fail(b, 400, "messages", "messages[%zu].tool_calls[%zu].type must be \"function\"", i, k);
        if (!tool_name_ok(json_object_get(fn, "name")))
            return fail(b, 400, "messages", "messages[%zu].tool_calls[%zu].function.name is not a valid function name", i, k);
        json_t *args = json_object_get(fn, "arguments");
        if (json_is_string(args)) {
            json_t *parsed = json_loadb(json_string_value(args), json_string_length(args), 0, NULL);
            if (!json_is_object(parsed)) {
                json_decref(parsed);
                return fail(b, 400, "messages",
                            "messages[%zu].tool_calls[%zu].function.arguments must be a JSON object (as a string)", i, k);
            }
            json_object_set_new(fn, "arguments", parsed);
        } else if (!json_is_object(args)) {
            return fail(b, 400, "messages", "messages[%zu].tool_calls[%zu].function.arguments must be a JSON string", i, k);
        }
        json_object_set_new(ids, json_string_value(id), json_true());
    }
    return 0;
}

/* An Anthropic message with content blocks, appended to out as the
   template's messages: text blocks joined; tool_use blocks (assistant) as
   tool_calls; tool_result blocks (user) as "tool" messages before the
   user's text. */
static int anthropic_blocks(const json_t *m, const char *role, size_t i, json_t *out, json_t *ids, bad *b) {
    const json_t *c = json_object_get(m, "content");
    bool assistant = !strcmp(role, "assistant");
    strbuf text = {0};
    json_t *calls = json_array();
    int rc = 0;
    size_t n_results = 0, k;
    const json_t *blk;
    if (json_is_string(c)) {
        json_array_append_new(out, json_pack("{s:s, s:s%}", "role", role, "content", json_string_value(c),
                                             json_string_length(c)));
        json_decref(calls);
        return 0;
    }
    if (!json_is_array(c)) {
        json_decref(calls);
        return fail(b, 400, "messages", "messages[%zu].content must be a string or an array of content blocks", i);
    }
    bool first_text = true;
    json_array_foreach(c, k, blk) {
        const char *ty = json_string_value(json_object_get(blk, "type"));
        if (!json_is_object(blk) || !ty) {
            rc = fail(b, 400, "messages", "messages[%zu].content[%zu] must be an object with a 'type'", i, k);
            break;
        }
        if (!strcmp(ty, "text")) {
            const json_t *tx = json_object_get(blk, "text");
            if (!json_is_string(tx)) {
                rc = fail(b, 400, "messages", "messages[%zu].content[%zu].text must be a string", i, k);
                break;
            }
            if ((!first_text && sb_append(&text, "\n", 1)) || sb_append(&text, json_string_value(tx), json_string_length(tx))) {
                rc = fail(b, 500, NULL, "out of memory");
                break;
            }
            first_text = false;
        } else if (!strcmp(ty, "tool_use") && assistant) {
            const json_t *id = json_object_get(blk, "id"), *nm = json_object_get(blk, "name"),
                         *in = json_object_get(blk, "input");
            if (!json_is_string(id) || json_string_length(id) == 0 || json_string_length(id) > MAX_CALL_ID ||
                !tool_name_ok(nm) || !json_is_object(in)) {
                rc = fail(b, 400, "messages",
                          "messages[%zu].content[%zu]: a tool_use block needs an 'id', a valid 'name' and an 'input' object", i, k);
                break;
            }
            json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", id, "type", "function", "function",
                                                   "name", nm, "arguments", in));
            json_object_set_new(ids, json_string_value(id), json_true());
        } else if (!strcmp(ty, "tool_result") && !assistant) {
            const json_t *id = json_object_get(blk, "tool_use_id");
            if (!json_is_string(id)) {
                rc = fail(b, 400, "messages", "messages[%zu].content[%zu].tool_use_id must be a string", i, k);
                break;
            }
            if (!json_object_get(ids, json_string_value(id))) {
                rc = fail(b, 400, "messages",
                          "messages[%zu].content[%zu]: tool_use_id '%.64s' answers no tool_use block of an earlier message", i,
                          k, json_string_value(id));
                break;
            }
            const json_t *ie = json_object_get(blk, "is_error");
            if (ie && !json_is_null(ie) && !json_is_boolean(ie)) {
                rc = fail(b, 400, "messages", "messages[%zu].content[%zu].is_error must be a boolean", i, k);
                break;
            }
            strbuf rt = {0};
            bool ok;
            if (content_text(json_object_get(blk, "content"), &rt, &ok) || !ok) {
                sb_free(&rt);
                rc = fail(b, 400, "messages",
                          "messages[%zu].content[%zu].content must be a string or an array of text blocks", i, k);
                break;
            }
            json_array_append_new(out, json_pack("{s:s, s:O, s:s%}", "role", "tool", "tool_call_id", id, "content",
                                                 rt.data ? rt.data : "", rt.len));
            sb_free(&rt);
            n_results++;
        } else {
            rc = fail(b, 400, "messages", "messages[%zu].content[%zu]: '%.32s' blocks are not supported in %s messages", i,
                      k, ty, role);
            break;
        }
    }
    if (!rc) {
        if (assistant) {
            json_t *msg = json_pack("{s:s}", "role", role);
            if (text.len || json_array_size(calls) == 0)
                json_object_set_new(msg, "content", json_stringn(text.data ? text.data : "", text.len));
            else
                json_object_set_new(msg, "content", json_null());
            if (json_array_size(calls)) json_object_set(msg, "tool_calls", calls);
            json_array_append_new(out, msg);
        } else if (text.len || n_results == 0) {
            json_array_append_new(out, json_pack("{s:s, s:s%}", "role", role, "content", text.data ? text.data : "",
                                                 text.len));
        }
    }
    sb_free(&text);
    json_decref(calls);
    return rc;
}

/* Builds the template's messages: roles checked, contents as strings,
   tool calls and tool results checked (a result must answer a call of an
   earlier message) and shaped as HF transformers passes them. */
static json_t *normalize_messages(const json_t *msgs, bool anthropic, const json_t *system, bad *b) {
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        fail(b, 400, "messages", "'messages' must be a non-empty array");
        return NULL;
    }
    if (json_array_size(msgs) > 100000) {
        fail(b, 400, "messages", "too many messages");
        return NULL;
    }
    json_t *out = json_array();
    json_t *ids = json_object(); /* tool call ids seen so far */
    if (!out || !ids) goto oom;
    if (system && !json_is_null(system)) {
        strbuf sb = {0};
        bool ok;
        int crc = content_text(system, &sb, &ok);
        if (crc || !ok) {
            sb_free(&sb);
            if (crc) goto oom;
            json_decref(out);
            json_decref(ids);
            fail(b, 400, "system", "'system' must be a string or an array of text blocks");
            return NULL;
        }
        int arc = json_array_append_new(out, json_pack("{s:s, s:s%}", "role", "system", "content", sb.data ? sb.data : "", sb.len));
        sb_free(&sb);
        if (arc) goto oom;
    }
    size_t i;
    const json_t *m;
    json_array_foreach(msgs, i, m) {
        const json_t *role = json_object_get(m, "role");
        if (!json_is_object(m) || !json_is_string(role)) {
            fail(b, 400, "messages", "messages[%zu] must be an object with a string 'role'", i);
            goto bad;
        }
        const char *r = json_string_value(role);
        bool known = anthropic ? (!strcmp(r, "user") || !strcmp(r, "assistant"))
                               : (!strcmp(r, "system") || !strcmp(r, "user") || !strcmp(r, "assistant") ||
                                  !strcmp(r, "tool") || !strcmp(r, "developer"));
        if (!known) {
            fail(b, 400, "messages", "messages[%zu]: unknown role '%.32s'", i, r);
            goto bad;
        }
        if (anthropic) {
            if (anthropic_blocks(m, r, i, out, ids, b)) goto bad;
            continue;
        }
        json_t *copy = json_deep_copy(m);
        if (!copy || (!strcmp(r, "developer") && json_object_set_new(copy, "role", json_string("system")))) {
            json_decref(copy);
            goto oom;
        }
        strbuf sb = {0};
        bool ok;
        const json_t *c = json_object_get(m, "content");
        int crc = content_text(c, &sb, &ok);
        if (crc || !ok) {
            sb_free(&sb);
            json_decref(copy);
            if (crc) goto oom;
            fail(b, 400, "messages", "messages[%zu].content must be a string or an array of text parts", i);
            goto bad;
        }
        const json_t *tcs = json_object_get(m, "tool_calls");
        bool has_calls = tcs && !json_is_null(tcs);
        if (c && !json_is_null(c)) {
            if (json_object_set_new(copy, "content", json_stringn(sb.data ? sb.data : "", sb.len))) {
                sb_free(&sb);
                json_decref(copy);
                goto oom;
            }
        } else if (!has_calls) {
            sb_free(&sb);
            json_decref(copy);
            fail(b, 400, "messages", "messages[%zu] has no content", i);
            goto bad;
        }
        sb_free(&sb);
        if (has_calls && strcmp(r, "assistant")) {
            json_decref(copy);
            fail(b, 400, "messages", "messages[%zu]: only assistant messages carry 'tool_calls'", i);
            goto bad;
        }
        if (check_tool_calls(copy, i, ids, b)) {
            json_decref(copy);
            goto bad;
        }
        if (!strcmp(r, "tool")) {
            const json_t *id = json_object_get(m, "tool_call_id");
            if (!json_is_string(id)) {
                json_decref(copy);
                fail(b, 400, "messages", "messages[%zu]: a tool message needs a string 'tool_call_id'", i);
                goto bad;
            }
            if (!json_object_get(ids, json_string_value(id))) {
                json_decref(copy);
                fail(b, 400, "messages", "messages[%zu]: tool_call_id '%.64s' answers no tool call of an earlier message",
                     i, json_string_value(id));
                goto bad;
            }
        }
        if (json_array_append_new(out, copy)) goto oom;
    }
    json_decref(ids);
    return out;
oom: /* jansson's allocations fail silently: each result is checked */
    fail(b, 500, NULL, "out of memory");
bad:
    json_decref(ids);
    json_decref(out);
    return NULL;
}

/* Renders the chat template and tokenizes the prompt. */
static int chat_prompt(ember_server *s, const json_t *body, const json_t *msgs, gen_req *q, bad *b) {
    if (!s->tmpl)
        return fail(b, 400, "messages", "this model has no chat template: use /v1/completions with a raw prompt");
    json_t *kw = json_object_get(body, "chat_template_kwargs");
    ember_chat_input in = {.messages = msgs, .kwargs = json_is_object(kw) ? kw : NULL,
                           .add_generation_prompt = true, .tok = s->tok};
    /* tool_choice "none": the model is not told about the tools at all */
    if (q->tool_choice != TOOLS_NONE) in.tools = q->tools;
    char *text = NULL;
    size_t len = 0;
    ember_error err = {0};
    int rc = ember_chat_render_input(s->tmpl, &in, &text, &len, &err);
    if (rc) return fail(b, rc == EMBER_ERR_NOMEM ? 500 : 400, "messages", "chat template: %s", err.msg);
    size_t n = 0;
    int32_t *ids = NULL;
    rc = ember_tok_encode(s->tok, NULL, text, len, 0, &ids, &n, &err);
    free(text);
    if (rc) return fail(b, rc == EMBER_ERR_NOMEM ? 500 : 400, "messages", "tokenizer: %s", err.msg);
    q->ids = ids;
    q->n_ids = (int)n;
    return 0;
}

/* prompt: a string, [string] or [int, ...] (one prompt: n = 1). */
static int completion_prompt(ember_server *s, const json_t *p, gen_req *q, bad *b) {
    ember_error err = {0};
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0))) p = json_array_get(p, 0);
    if (json_is_string(p)) {
        size_t n = 0;
        int rc = ember_tok_encode(s->tok, NULL, json_string_value(p), json_string_length(p), EMBER_TOK_ADD_SPECIAL,
                                  &q->ids, &n, &err);
        if (rc) return fail(b, rc == EMBER_ERR_NOMEM ? 500 : 400, "prompt", "tokenizer: %s", err.msg);
        q->n_ids = (int)n;
        return 0;
    }
    if (!json_is_array(p) || json_array_size(p) == 0)
        return fail(b, 400, "prompt", "'prompt' must be a string or a non-empty array of token ids");
    size_t n = json_array_size(p);
    if (n > (size_t)s->info.n_ctx + 1)
        return fail(b, 400, "prompt", "the prompt has %zu tokens; this model's context holds %d", n, s->info.n_ctx);
    q->ids = ember_malloc(n * sizeof *q->ids);
    if (!q->ids) return fail(b, 500, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(p, i);
        if (!json_is_integer(v))
            return fail(b, 400, "prompt", "'prompt' must be a string or an array of token ids (one prompt only)");
        long long t = json_integer_value(v);
        if (t < 0 || t >= s->info.vocab_size)
            return fail(b, 400, "prompt", "prompt token %zu (%lld) is not a token id of this model", i, t);
        q->ids[i] = (int32_t)t;
    }
    q->n_ids = (int)n;
    return 0;
}

/* TESTS ONLY: "ember_test_output", a completion that replaces the sampled
   tokens (accepted only by a server started with opts.test_output), so
   tests drive tool calls through random-weight models end to end: the
   engine still runs every step, the server only swaps the token ids. */
static int parse_test_output(ember_server *s, const json_t *body, gen_req *q, bad *b) {
    const json_t *t = json_object_get(body, "ember_test_output");
    if (!t) return 0;
    if (!s->o.test_output)
        return fail(b, 400, "ember_test_output", "'ember_test_output' is a test hook; this server was not started with it");
    if (!json_is_string(t) || json_string_length(t) == 0)
        return fail(b, 400, "ember_test_output", "'ember_test_output' must be a non-empty string");
    size_t n = 0;
    ember_error err = {0};
    if (ember_tok_encode(s->tok, NULL, json_string_value(t), json_string_length(t), 0, &q->script, &n, &err))
        return fail(b, 400, "ember_test_output", "tokenizer: %s", err.msg);
    if (n == 0) return fail(b, 400, "ember_test_output", "'ember_test_output' encodes to no tokens");
    q->n_script = (int)n;
    if (q->n_script < q->g.max_tokens) {
        q->g.max_tokens = q->n_script;
        q->script_ends = true;
    }
    q->g.ignore_eos = 1; /* the script decides where the text ends */
    return 0;
}

/* The field that holds a protocol's prompt, for errors about its length. */
static const char *prompt_field(int proto) {
    return proto == PROTO_COMPLETION ? "prompt" : proto == PROTO_RESPONSES ? "input" : "messages";
}

/* A /v1/responses body: previous_response_id's conversation looked up,
   the body translated (responses.c), then validated, rendered and
   tokenized by the chat request's own code; errors name the Responses
   API's fields. */
static int responses_request(ember_server *s, const json_t *body, gen_req *q, bad *b) {
    const json_t *prev = json_object_get(body, "previous_response_id");
    json_t *hist = NULL;
    if (prev && !json_is_null(prev)) {
        if (!json_is_string(prev))
            return fail(b, 400, "previous_response_id", "'previous_response_id' must be a string, not %s", jtype(prev));
        hist = resp_store_get(&s->rstore, json_string_value(prev), false);
        if (!hist)
            return fail(b, 400, "previous_response_id",
                        "no response with the id '%.64s' is stored (responses are kept in memory while the server runs, "
                        "unless 'store' was false)",
                        json_string_value(prev));
    }
    int rc = resp_translate(body, hist, &q->resp, b);
    json_decref(hist);
    if (rc) return -1;
    const json_t *v = q->resp.view, *rf = json_object_get(v, "response_format");
    json_t *msgs = NULL;
    if (parse_tools(v, false, q, b) || parse_tool_choice(v, false, q, b) || enforce_tool_choice(s, v, false, q, b) ||
        (rf && format_grammar(rf, "text.format", q, b)) ||
        !(msgs = normalize_messages(json_object_get(v, "messages"), false, NULL, b)) || chat_prompt(s, body, msgs, q, b)) {
        json_decref(msgs);
        if (!strcmp(b->param, "messages")) snprintf(b->param, sizeof b->param, "input");
        return -1;
    }
    json_decref(msgs);
    return 0;
}

/* Parses and validates a generation body into q (the prompt tokenized). */
static int parse_gen(ember_server *s, int proto, const json_t *body, gen_req *q, bad *b) {
    memset(q, 0, sizeof *q);
    q->proto = proto;
    if (!json_is_object(body)) return fail(b, 400, NULL, "the request body must be a JSON object");
    const json_t *model = json_object_get(body, "model");
    if (model && !json_is_string(model) && !json_is_null(model)) return fail(b, 400, "model", "'model' must be a string");
    if (parse_sampling(s, body, q, b)) return -1;
    if (proto == PROTO_CHAT) {
        bool lp = false;
        long long top = 0;
        if (opt_bool(body, "logprobs", &lp, b) || opt_int(body, "top_logprobs", 0, EMBER_MAX_TOP_LOGPROBS, &top, b))
            return -1;
        if (top > 0 && !lp) return fail(b, 400, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        q->g.logprobs = lp;
        q->g.top_logprobs = (int)top;
        q->lp_mode = lp ? 1 : 0;
        const json_t *rf = json_object_get(body, "response_format");
        if (parse_tools(body, false, q, b) || parse_tool_choice(body, false, q, b) ||
            enforce_tool_choice(s, body, false, q, b))
            return -1;
        if (rf && !json_is_null(rf) && format_grammar(rf, "response_format", q, b)) return -1;
        json_t *msgs = normalize_messages(json_object_get(body, "messages"), false, NULL, b);
        if (!msgs) return -1;
        int rc = chat_prompt(s, body, msgs, q, b);
        json_decref(msgs);
        if (rc) return rc;
    } else if (proto == PROTO_ANTHROPIC) {
        if (parse_tools(body, true, q, b) || parse_tool_choice(body, true, q, b) ||
            enforce_tool_choice(s, body, true, q, b))
            return -1;
        json_t *msgs = normalize_messages(json_object_get(body, "messages"), true, json_object_get(body, "system"), b);
        if (!msgs) return -1;
        int rc = chat_prompt(s, body, msgs, q, b);
        json_decref(msgs);
        if (rc) return rc;
    } else if (proto == PROTO_RESPONSES) {
        if (responses_request(s, body, q, b)) return -1;
    } else {
        long long lp = -1;
        bool echo = false;
        if (opt_int(body, "logprobs", 0, 5, &lp, b) || opt_bool(body, "echo", &echo, b)) return -1;
        if (echo) return fail(b, 400, "echo", "'echo' is not supported");
        const json_t *sfx = json_object_get(body, "suffix");
        if (sfx && !json_is_null(sfx)) return fail(b, 400, "suffix", "'suffix' is not supported");
        if (lp >= 0) {
            q->g.logprobs = 1;
            q->g.top_logprobs = (int)lp;
            q->lp_mode = 2;
        }
        const json_t *p = json_object_get(body, "prompt");
        if (!p) return fail(b, 400, "prompt", "'prompt' is required");
        if (completion_prompt(s, p, q, b)) return -1;
    }
    if (q->n_ids < 1) return fail(b, 400, prompt_field(proto), "the prompt is empty");
    const int C = s->info.n_ctx;
    if (q->max_tokens_given && (long)q->n_ids + q->g.max_tokens > C)
        return fail(b, 400, prompt_field(proto),
                    "This model's maximum context length is %d tokens. However, you requested %ld tokens (%d in the "
                    "prompt, %d in the completion). Please reduce the length of the prompt or completion.",
                    C, (long)q->n_ids + q->g.max_tokens, q->n_ids, q->g.max_tokens);
    if (!q->max_tokens_given) {
        if (q->n_ids >= C)
            return fail(b, 400, prompt_field(proto), "This model's maximum context length is %d tokens, but the prompt has %d",
                        C, q->n_ids);
        q->g.max_tokens = C - q->n_ids;
        if (s->o.default_max_tokens > 0 && q->g.max_tokens > s->o.default_max_tokens)
            q->g.max_tokens = s->o.default_max_tokens;
    }
    if (direct_grammar(s, body, q, b) || parse_test_output(s, body, q, b) || attach_grammar(s, q, b)) return -1;
    q->g.prompt = q->ids;
    q->g.n_prompt = q->n_ids;
    return 0;
}

/* ---- a running generation ---------------------------------------------------------------- */

typedef struct gen_run {
    ember_server *srv;
    struct MHD_Connection *conn;
    gen_req q;
    ember_stream *es;
    textgen tg;
    strbuf out;        /* SSE bytes not yet written */
    strbuf delta;      /* text released by the last token */
    bool failed;       /* the text could not be made (no memory): the answer is an error, not a short text */
    json_t *lp;        /* logprobs entries (chat: content array; completion: object of arrays) */
    char id[48];
    long created;
    double t_start, t_last;
    int n_tokens;      /* tokens given to the text (up to a stop string) */
    bool sent_first, done, finished;
    ember_event final;
    char finish_reason[24];
    /* tool calls (tp non-NULL when the request has tools and the model a call format) */
    ember_tool_parser *tp;
    bool streaming;
    strbuf content;  /* text outside calls */
    strbuf cur_text; /* Anthropic: the text block being built */
    strbuf args;     /* the current call's arguments */
    json_t *calls;   /* OpenAI tool_calls, as reported */
    json_t *blocks;  /* Anthropic content blocks, as reported */
    int n_calls;     /* calls kept */
    bool drop_call;  /* the current call is dropped (one call only) */
    bool block_open; /* Anthropic stream: a text block is open */
    int n_blocks;    /* Anthropic stream: blocks started */
    resp_out ro;     /* /v1/responses: the output items and their events */
} gen_run;

static void run_free(gen_run *r) {
    if (!r) return;
    if (r->es) ember_stream_free(r->es);
    textgen_free(&r->tg);
    sb_free(&r->out);
    sb_free(&r->delta);
    json_decref(r->lp);
    ember_tool_parser_free(r->tp);
    sb_free(&r->content);
    sb_free(&r->cur_text);
    sb_free(&r->args);
    json_decref(r->calls);
    json_decref(r->blocks);
    resp_out_free(&r->ro);
    gen_req_free(&r->q);
    atomic_fetch_sub(&r->srv->active, 1);
    free(r);
}

/* A token's text for logprobs: its own decoding, cleaned to valid UTF-8. */
static json_t *token_entry(ember_server *s, int32_t id, float lp, bool with_bytes) {
    char *text = NULL;
    size_t len = 0;
    ember_error err;
    if (ember_tok_decode(s->tok, &id, 1, 0, &text, &len, &err) != EMBER_OK) {
        text = NULL;
        len = 0;
    }
    json_t *e = json_object();
    json_object_set_new(e, "token", ember_json_string_clean(text ? text : "", len));
    json_object_set_new(e, "logprob", json_real(lp));
    if (with_bytes) {
        json_t *bytes = json_array();
        for (size_t i = 0; i < len; i++) json_array_append_new(bytes, json_integer((unsigned char)text[i]));
        json_object_set_new(e, "bytes", bytes);
    }
    free(text);
    return e;
}

static const char *finish_name(const gen_run *r) {
    bool anth = r->q.proto == PROTO_ANTHROPIC;
    bool length = r->final.finish == EMBER_FINISH_LENGTH && !(r->q.script_ends && r->n_tokens >= r->q.n_script);
    if (r->n_calls > 0 && !length) return anth ? "tool_use" : "tool_calls";
    if (r->tg.stopped) return anth ? "stop_sequence" : "stop";
    if (length) return anth ? "max_tokens" : "length";
    return anth ? "end_turn" : "stop";
}

static json_t *usage_json(const gen_run *r) {
    int p = r->final.n_prompt, c = r->n_tokens;
    if (r->q.proto == PROTO_RESPONSES)
        return json_pack("{s:i, s:{s:i}, s:i, s:{s:i}, s:i}", "input_tokens", p, "input_tokens_details", "cached_tokens",
                         r->final.n_cached, "output_tokens", c, "output_tokens_details", "reasoning_tokens", 0,
                         "total_tokens", p + c);
    if (r->q.proto == PROTO_ANTHROPIC)
        return json_pack("{s:i, s:i, s:i}", "input_tokens", p, "output_tokens", c, "cache_read_input_tokens",
                         r->final.n_cached);
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", p, "completion_tokens", c, "total_tokens", p + c,
                     "prompt_tokens_details", "cached_tokens", r->final.n_cached);
}

/* Records a token's logprobs for the response; returns the entry for a
   streaming chunk (chat) or NULL. */
static json_t *record_logprobs(gen_run *r, const ember_event *ev) {
    ember_server *s = r->srv;
    if (r->q.lp_mode == 1) {
        json_t *e = token_entry(s, ev->token, ev->logprob, true);
        json_t *tops = json_array();
        for (int i = 0; i < ev->n_top; i++)
            json_array_append_new(tops, token_entry(s, ev->top_ids[i], ev->top_logprobs[i], true));
        json_object_set_new(e, "top_logprobs", tops);
        if (!r->lp) r->lp = json_array();
        json_array_append(r->lp, e);
        return e;
    }
    if (r->q.lp_mode == 2) {
        if (!r->lp)
            r->lp = json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
        json_t *e = token_entry(s, ev->token, ev->logprob, false);
        json_array_append(json_object_get(r->lp, "tokens"), json_object_get(e, "token"));
        json_array_append_new(json_object_get(r->lp, "token_logprobs"), json_real(ev->logprob));
        json_t *tops = json_object();
        for (int i = 0; i < ev->n_top; i++) {
            json_t *t = token_entry(s, ev->top_ids[i], ev->top_logprobs[i], false);
            json_object_set(tops, json_string_value(json_object_get(t, "token")), json_object_get(t, "logprob"));
            json_decref(t);
        }
        json_array_append_new(json_object_get(r->lp, "top_logprobs"), tops);
        json_array_append_new(json_object_get(r->lp, "text_offset"), json_integer((json_int_t)r->tg.text.len));
        json_decref(e);
    }
    return NULL;
}

/* Appends j (consumed) to r->out as SSE data. A chunk that cannot be made
   (no memory: j NULL, or no room) fails the stream rather than leave a hole
   in the text. */
static void sse_data(gen_run *r, json_t *j) {
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s || sb_puts(&r->out, "data: ") || sb_puts(&r->out, s) || sb_puts(&r->out, "\n\n")) r->failed = true;
    free(s);
}

static void sse_event(gen_run *r, const char *name, json_t *j) {
    if (sb_puts(&r->out, "event: ") || sb_puts(&r->out, name) || sb_puts(&r->out, "\n")) r->failed = true;
    sse_data(r, j);
}

/* json_object_set_new on a chunk; a failure (no memory) fails the stream. */
static void set_or_fail(gen_run *r, json_t *o, const char *key, json_t *v) {
    if (json_object_set_new(o, key, v)) r->failed = true;
}

static json_t *chunk_base(const gen_run *r) {
    if (r->q.proto == PROTO_CHAT)
        return json_pack("{s:s, s:s, s:i, s:s}", "id", r->id, "object", "chat.completion.chunk", "created",
                         (json_int_t)r->created, "model", r->srv->o.model_id);
    return json_pack("{s:s, s:s, s:i, s:s}", "id", r->id, "object", "text_completion", "created",
                     (json_int_t)r->created, "model", r->srv->o.model_id);
}

/* SSE bytes for newly released text (and a token's logprobs). */
static void stream_text(gen_run *r, const char *text, size_t len, json_t *lp_entry) {
    if (r->q.proto == PROTO_ANTHROPIC) {
        json_decref(lp_entry);
        if (!len) return;
        int index = 0;
        if (r->tp) { /* with tools, text blocks open as text comes, between tool_use blocks */
            if (!r->block_open) {
                sse_event(r, "content_block_start",
                          json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_start", "index", r->n_blocks,
                                    "content_block", "type", "text", "text", ""));
                r->block_open = true;
                r->n_blocks++;
            }
            index = r->n_blocks - 1;
        }
        sse_event(r, "content_block_delta",
                  json_pack("{s:s, s:i, s:{s:s, s:o}}", "type", "content_block_delta", "index", index, "delta", "type",
                            "text_delta", "text", ember_json_string_clean(text, len)));
        return;
    }
    if (!len && !lp_entry) return;
    json_t *c = chunk_base(r);
    json_t *choice;
    if (r->q.proto == PROTO_CHAT) {
        json_t *lp = lp_entry ? json_pack("{s:[o]}", "content", lp_entry) : json_null();
        choice = json_pack("{s:i, s:{s:o}, s:o, s:n}", "index", 0, "delta", "content", ember_json_string_clean(text, len),
                           "logprobs", lp, "finish_reason");
    } else {
        json_decref(lp_entry);
        choice = json_pack("{s:i, s:o, s:n, s:n}", "index", 0, "text", ember_json_string_clean(text, len), "logprobs",
                           "finish_reason");
    }
    set_or_fail(r, c, "choices", json_pack("[o]", choice));
    sse_data(r, c);
}

static void stream_start(gen_run *r) {
    if (r->q.proto == PROTO_ANTHROPIC) {
        json_t *u = json_pack("{s:i, s:i}", "input_tokens", r->q.n_ids, "output_tokens", 0);
        sse_event(r, "message_start",
                  json_pack("{s:s, s:{s:s, s:s, s:s, s:[], s:s, s:n, s:n, s:o}}", "type", "message_start", "message",
                            "id", r->id, "type", "message", "role", "assistant", "content", "model",
                            r->srv->o.model_id, "stop_reason", "stop_sequence", "usage", u));
        if (!r->tp)
            sse_event(r, "content_block_start",
                      json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_start", "index", 0, "content_block",
                                "type", "text", "text", ""));
        sse_event(r, "ping", json_pack("{s:s}", "type", "ping"));
    } else if (r->q.proto == PROTO_CHAT) {
        json_t *c = chunk_base(r);
        set_or_fail(r, c, "choices",
                            json_pack("[{s:i, s:{s:s, s:s}, s:n, s:n}]", "index", 0, "delta", "role", "assistant",
                                      "content", "", "logprobs", "finish_reason"));
        sse_data(r, c);
    }
}

static void stream_end(gen_run *r) {
    const char *fr = finish_name(r);
    if (r->q.proto == PROTO_ANTHROPIC) {
        if (r->tp && r->n_blocks == 0) { /* nothing at all: one empty text block, as without tools */
            sse_event(r, "content_block_start",
                      json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_start", "index", 0, "content_block",
                                "type", "text", "text", ""));
            r->block_open = true;
            r->n_blocks = 1;
        }
        if (!r->tp || r->block_open)
            sse_event(r, "content_block_stop",
                      json_pack("{s:s, s:i}", "type", "content_block_stop", "index", r->tp ? r->n_blocks - 1 : 0));
        json_t *seq = r->tg.stopped ? json_string(r->q.stops[r->tg.stop_index]) : json_null();
        sse_event(r, "message_delta",
                  json_pack("{s:s, s:{s:s, s:o}, s:{s:i}}", "type", "message_delta", "delta", "stop_reason", fr,
                            "stop_sequence", seq, "usage", "output_tokens", r->n_tokens));
        sse_event(r, "message_stop", json_pack("{s:s}", "type", "message_stop"));
        return;
    }
    json_t *c = chunk_base(r);
    json_t *choice = r->q.proto == PROTO_CHAT
                         ? json_pack("{s:i, s:{}, s:n, s:s}", "index", 0, "delta", "logprobs", "finish_reason", fr)
                         : json_pack("{s:i, s:s, s:n, s:s}", "index", 0, "text", "", "logprobs", "finish_reason", fr);
    set_or_fail(r, c, "choices", json_pack("[o]", choice));
    sse_data(r, c);
    if (r->q.include_usage) {
        c = chunk_base(r);
        set_or_fail(r, c, "choices", json_array());
        set_or_fail(r, c, "usage", usage_json(r));
        sse_data(r, c);
    }
    sb_puts(&r->out, "data: [DONE]\n\n");
}

/* ---- tool calls in each protocol's shape ------------------------------------------------------ */

/* A call id: call_... (OpenAI) or toolu_... (Anthropic), 24 hex digits
   unique within the server's life. Mistral's templates refuse any id but 9
   letters and digits when the call is fed back, so with that format the id
   is 9 of them (from the same counter: unique for 62^9 calls). */
static void call_id(gen_run *r, char *out, size_t n) {
    unsigned long k = atomic_fetch_add(&r->srv->next_id, 1);
    ember_tool_call_id(r->srv->o.tool_format, r->q.proto == PROTO_ANTHROPIC ? "toolu_" : "call_", k,
                       ((uint64_t)r->srv->created << 24) ^ ((uint64_t)r->created << 44), (uint64_t)r->srv->created, out,
                       n);
}

static void flush_text_block(gen_run *r) {
    if (!r->cur_text.len) return;
    json_array_append_new(r->blocks, json_pack("{s:s, s:o}", "type", "text", "text",
                                               ember_json_string_clean(r->cur_text.data, r->cur_text.len)));
    r->cur_text.len = 0;
}

/* Receives the parser's events: content goes on as text, calls become
   tool_calls / tool_use blocks (and their SSE events when streaming). */
static int tool_sink(void *user, const ember_tool_event *ev) {
    gen_run *r = user;
    bool anth = r->q.proto == PROTO_ANTHROPIC, resp = r->q.proto == PROTO_RESPONSES;
    switch (ev->kind) {
    case EMBER_TOOL_EV_CONTENT:
        if (resp) {
            resp_out_text(&r->ro, ev->text, ev->len);
            return 0;
        }
        if (sb_append(&r->content, ev->text, ev->len) || (anth && sb_append(&r->cur_text, ev->text, ev->len))) return -1;
        if (r->streaming) stream_text(r, ev->text, ev->len, NULL);
        return 0;
    case EMBER_TOOL_EV_CALL_START: {
        r->drop_call = r->q.one_call && r->n_calls > 0;
        if (r->drop_call) return 0;
        char id[48];
        call_id(r, id, sizeof id);
        int idx = r->n_calls++;
        r->args.len = 0;
        json_array_append_new(r->calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function",
                                                  "name", ev->name, "arguments", ""));
        if (resp) {
            resp_out_call_start(&r->ro, id, ev->name);
            return 0;
        }
        if (anth) {
            flush_text_block(r);
            json_array_append_new(r->blocks, json_pack("{s:s, s:s, s:s, s:{}}", "type", "tool_use", "id", id, "name",
                                                       ev->name, "input"));
        }
        if (!r->streaming) return 0;
        if (anth) {
            if (r->block_open) {
                sse_event(r, "content_block_stop",
                          json_pack("{s:s, s:i}", "type", "content_block_stop", "index", r->n_blocks - 1));
                r->block_open = false;
            }
            sse_event(r, "content_block_start",
                      json_pack("{s:s, s:i, s:{s:s, s:s, s:s, s:{}}}", "type", "content_block_start", "index",
                                r->n_blocks, "content_block", "type", "tool_use", "id", id, "name", ev->name, "input"));
            r->n_blocks++;
        } else {
            json_t *c = chunk_base(r);
            set_or_fail(r, c, "choices",
                                json_pack("[{s:i, s:{s:[{s:i, s:s, s:s, s:{s:s, s:s}}]}, s:n, s:n}]", "index", 0, "delta",
                                          "tool_calls", "index", idx, "id", id, "type", "function", "function", "name",
                                          ev->name, "arguments", "", "logprobs", "finish_reason"));
            sse_data(r, c);
        }
        return 0;
    }
    case EMBER_TOOL_EV_CALL_ARGS:
        if (r->drop_call) return 0;
        if (sb_append(&r->args, ev->text, ev->len)) return -1;
        if (resp) {
            resp_out_call_args(&r->ro, ev->text, ev->len);
            return 0;
        }
        if (!r->streaming || !ev->len) return 0;
        if (anth) {
            sse_event(r, "content_block_delta",
                      json_pack("{s:s, s:i, s:{s:s, s:o}}", "type", "content_block_delta", "index", r->n_blocks - 1,
                                "delta", "type", "input_json_delta", "partial_json", ember_json_string_clean(ev->text, ev->len)));
        } else {
            json_t *c = chunk_base(r);
            set_or_fail(r, c, "choices",
                                json_pack("[{s:i, s:{s:[{s:i, s:{s:o}}]}, s:n, s:n}]", "index", 0, "delta", "tool_calls",
                                          "index", r->n_calls - 1, "function", "arguments",
                                          ember_json_string_clean(ev->text, ev->len), "logprobs", "finish_reason"));
            sse_data(r, c);
        }
        return 0;
    case EMBER_TOOL_EV_CALL_END: {
        if (r->drop_call) return 0;
        if (resp) {
            resp_out_call_end(&r->ro);
            return 0;
        }
        json_t *fn = json_object_get(json_array_get(r->calls, json_array_size(r->calls) - 1), "function");
        json_object_set_new(fn, "arguments", ember_json_string_clean(r->args.data ? r->args.data : "", r->args.len));
        if (anth) {
            json_t *input = json_loadb(r->args.data ? r->args.data : "{}", r->args.len ? r->args.len : 2, JSON_ALLOW_NUL, NULL);
            json_object_set_new(json_array_get(r->blocks, json_array_size(r->blocks) - 1), "input",
                                json_is_object(input) ? input : json_object());
            if (input && !json_is_object(input)) json_decref(input);
            if (r->streaming)
                sse_event(r, "content_block_stop",
                          json_pack("{s:s, s:i}", "type", "content_block_stop", "index", r->n_blocks - 1));
        }
        return 0;
    }
    }
    return 0;
}

/* Passes released text through the tool-call parser (final: the text ended). */
static void tool_text(gen_run *r, const char *text, size_t len, bool final) {
    ember_error err;
    int rc = ember_tool_parser_feed(r->tp, text, len, tool_sink, r, &err);
    if (!rc && final) rc = ember_tool_parser_finish(r->tp, tool_sink, r, &err);
    if (rc && r->es) ember_stream_cancel(r->es);
}

/* Writes one typed event of a streamed /v1/responses answer. */
static int resp_emit(void *user, const char *type, json_t *ev) {
    gen_run *r = user;
    sse_event(r, type, ev);
    return r->failed ? -1 : 0;
}

/* Keeps a finished /v1/responses conversation (its input and the answer as
   a chat message) for a later previous_response_id; its size is estimated
   from this request's own messages (the history before them is shared). */
static int responses_keep(gen_run *r) {
    resp_req *rq = &r->q.resp;
    json_t *m = resp_out_message(&r->ro);
    if (!m || json_array_append_new(rq->convo, m)) return -1;
    size_t bytes = 256;
    for (size_t i = rq->n_history; i < json_array_size(rq->convo); i++)
        bytes += json_dumpb(json_array_get(rq->convo, i), NULL, 0, JSON_COMPACT) + 64;
    return resp_store_put(&r->srv->rstore, r->id, rq->convo, r->ro.resp, bytes);
}

/* The end of a /v1/responses generation: the last text, the status
   (incomplete when max_output_tokens cut the answer), the events that end
   the stream, and the conversation kept. A failed generation streams an
   error (not streaming: run_generation answers 500). */
static void responses_end(gen_run *r, const ember_event *ev) {
    if (!r->tp && r->delta.len) resp_out_text(&r->ro, r->delta.data, r->delta.len);
    if (ev->finish == EMBER_FINISH_ERROR && !r->tg.stopped) {
        if (r->streaming) resp_out_fail(&r->ro, "generation failed");
    } else {
        bool length = !strcmp(finish_name(r), "length");
        resp_out_finish(&r->ro, length ? "max_output_tokens" : NULL, usage_json(r));
        if (!r->ro.failed && r->q.resp.store && responses_keep(r)) r->ro.failed = true;
    }
    if (r->ro.failed) r->failed = true;
}

/* Handles one engine event: text, logprobs, metrics, and (streaming) SSE. */
static void on_event(gen_run *r, const ember_event *ev, bool streaming) {
    ember_server *s = r->srv;
    if (ev->kind == EMBER_EV_TOKEN) {
        double now = ember_now();
        pthread_mutex_lock(&s->mu);
        if (!r->sent_first)
            histo_add(&s->ttft, k_ttft_b, N_TTFT, now - r->t_start);
        else
            histo_add(&s->itl, k_itl_b, N_ITL, now - r->t_last);
        pthread_mutex_unlock(&s->mu);
        r->sent_first = true;
        r->t_last = now;
        if (r->tg.stopped) return; /* tokens after a stop string are dropped */
        int32_t token = ev->token;
        if (r->q.script && r->n_tokens < r->q.n_script) token = r->q.script[r->n_tokens]; /* test hook */
        r->n_tokens++;
        json_t *lp = record_logprobs(r, ev);
        r->delta.len = 0;
        ember_error err;
        if (textgen_push(&r->tg, token, &r->delta, &err) != EMBER_OK) {
            r->failed = true;
            ember_stream_cancel(r->es);
        }
        if (r->tg.stopped) ember_stream_cancel(r->es);
        if (r->tp) { /* text goes through the tool-call parser; logprobs in a chunk of their own */
            if (streaming && lp)
                stream_text(r, "", 0, lp);
            else
                json_decref(lp);
            tool_text(r, r->delta.data ? r->delta.data : "", r->delta.len, false);
        } else if (r->q.proto == PROTO_RESPONSES) {
            json_decref(lp);
            resp_out_text(&r->ro, r->delta.data ? r->delta.data : "", r->delta.len);
        } else if (streaming)
            stream_text(r, r->delta.data ? r->delta.data : "", r->delta.len, lp);
        else
            json_decref(lp);
        return;
    }
    r->final = *ev;
    r->done = true;
    pthread_mutex_lock(&s->mu);
    if (ev->finish < 5) s->finished[ev->finish]++;
    pthread_mutex_unlock(&s->mu);
    r->delta.len = 0;
    ember_error err;
    if (textgen_finish(&r->tg, &r->delta, &err) != EMBER_OK) r->failed = true;
    if (r->tp) {
        tool_text(r, r->delta.data ? r->delta.data : "", r->delta.len, true);
        r->delta.len = 0;
        if (r->q.proto == PROTO_ANTHROPIC) flush_text_block(r);
    }
    if (r->q.proto == PROTO_RESPONSES) {
        responses_end(r, ev);
        return;
    }
    if (streaming) {
        if (r->delta.len) stream_text(r, r->delta.data, r->delta.len, NULL);
        if (ev->finish == EMBER_FINISH_ERROR && !r->tg.stopped) {
            json_t *e = json_pack("{s:{s:s, s:s}}", "error", "message", "generation failed", "type", "server_error");
            if (r->q.proto == PROTO_ANTHROPIC)
                sse_event(r, "error", json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type",
                                                      "api_error", "message", "generation failed"));
            else
                sse_data(r, e), e = NULL;
            json_decref(e);
        } else {
            stream_end(r);
        }
    }
}

/* MHD content reader of a streaming response. */
static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    gen_run *r = cls;
    while (r->out.len == 0 && !r->failed) {
        if (r->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        if (r->done) {
            r->finished = true;
            continue;
        }
        ember_event ev;
        if (ember_stream_next(r->es, &ev, POLL_MS) == 0) {
            if (client_gone(r->conn)) {
                ember_stream_cancel(r->es);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            continue;
        }
        on_event(r, &ev, true);
    }
    if (r->failed) { /* no [DONE]: the client sees the stream break */
        ember_stream_cancel(r->es);
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    if (ember_fault_hit(EMBER_FAULT_WRITE)) { /* simulated: the write of this chunk fails */
        ember_stream_cancel(r->es);
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = r->out.len < max ? r->out.len : max;
    memcpy(buf, r->out.data, n);
    sb_consume(&r->out, n);
    return (ssize_t)n;
}

static void sse_free(void *cls) {
    run_free(cls);
}

/* The complete (non-streaming) response body. */
static json_t *full_response(gen_run *r) {
    if (r->q.proto == PROTO_RESPONSES) return json_incref(r->ro.resp);
    const char *text = r->tg.text.data ? r->tg.text.data : "";
    size_t len = r->tg.text.len;
    if (r->tp) { /* the text outside the calls */
        text = r->content.data ? r->content.data : "";
        len = r->content.len;
    }
    const char *fr = finish_name(r);
    if (r->q.proto == PROTO_ANTHROPIC) {
        json_t *seq = r->tg.stopped ? json_string(r->q.stops[r->tg.stop_index]) : json_null();
        if (r->tp && json_array_size(r->blocks))
            return json_pack("{s:s, s:s, s:s, s:s, s:O, s:s, s:o, s:o}", "id", r->id, "type", "message", "role",
                             "assistant", "model", r->srv->o.model_id, "content", r->blocks, "stop_reason", fr,
                             "stop_sequence", seq, "usage", usage_json(r));
        return json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:o}], s:s, s:o, s:o}", "id", r->id, "type", "message", "role",
                         "assistant", "model", r->srv->o.model_id, "content", "type", "text", "text",
                         ember_json_string_clean(text, len), "stop_reason", fr, "stop_sequence", seq, "usage", usage_json(r));
    }
    json_t *choice;
    if (r->q.proto == PROTO_CHAT) {
        json_t *lp = r->lp ? json_pack("{s:O}", "content", r->lp) : json_null();
        choice = json_pack("{s:i, s:{s:s, s:o}, s:o, s:s}", "index", 0, "message", "role", "assistant", "content",
                           (len || !r->n_calls) ? ember_json_string_clean(text, len) : json_null(), "logprobs", lp, "finish_reason", fr);
        if (r->n_calls) json_object_set(json_object_get(choice, "message"), "tool_calls", r->calls);
    } else {
        choice = json_pack("{s:i, s:o, s:O, s:s}", "index", 0, "text", ember_json_string_clean(text, len), "logprobs",
                           r->lp ? r->lp : json_null(), "finish_reason", fr);
    }
    return json_pack("{s:s, s:s, s:i, s:s, s:[o], s:o}", "id", r->id, "object",
                     r->q.proto == PROTO_CHAT ? "chat.completion" : "text_completion", "created",
                     (json_int_t)r->created, "model", r->srv->o.model_id, "choices", choice, "usage", usage_json(r));
}

static enum MHD_Result run_generation(ember_server *s, struct MHD_Connection *c, int proto, const json_t *body) {
    bad b = {0};
    gen_run *r = ember_calloc(1, sizeof *r);
    if (!r) return send_error(s, c, proto, 500, NULL, "out of memory");
    atomic_fetch_add(&s->active, 1);
    r->srv = s;
    r->conn = c;
    r->t_start = ember_now();
    r->created = (long)time(NULL);
    unsigned long id = atomic_fetch_add(&s->next_id, 1);
    snprintf(r->id, sizeof r->id, "%s%lx%lx",
             proto == PROTO_CHAT        ? "chatcmpl-"
             : proto == PROTO_ANTHROPIC ? "msg_"
             : proto == PROTO_RESPONSES ? "resp_"
                                        : "cmpl-",
             (unsigned long)r->created, id);
    if (parse_gen(s, proto, body, &r->q, &b)) {
        enum MHD_Result ret = send_error(s, c, proto, b.code, b.param[0] ? b.param : NULL, "%s", b.msg);
        run_free(r);
        return ret;
    }
    ember_error err = {0};
    if (textgen_init(&r->tg, s->tok, r->q.stops, r->q.n_stops, &err)) {
        run_free(r);
        return send_error(s, c, proto, 500, NULL, "out of memory");
    }
    r->streaming = r->q.stream;
    if (r->q.tools && r->q.tool_choice != TOOLS_NONE && s->o.tool_format != EMBER_TOOLS_NONE) {
        r->tp = ember_tool_parser_new(s->o.tool_format, r->q.tools);
        r->calls = json_array();
        r->blocks = json_array();
        if (!r->tp || !r->calls || !r->blocks) {
            run_free(r);
            return send_error(s, c, proto, 500, NULL, "out of memory");
        }
        textgen_keep(&r->tg, s->keep_ids, s->n_keep);
    }
    json_t *resp = r->q.resp.response;
    if (resp && (json_object_set_new(resp, "id", json_string(r->id)) ||
                 json_object_set_new(resp, "created_at", json_integer(r->created)) ||
                 json_object_set_new(resp, "model", json_string(s->o.model_id)))) {
        run_free(r);
        return send_error(s, c, proto, 500, NULL, "out of memory");
    }
    int rc = ember_engine_submit(s->eng, &r->q.g, &r->es, &err);
    if (rc) ember_gbudget_free(r->q.g.constrain_user); /* not taken by the engine */
    r->q.g.constrain_user = NULL;
    if (rc) {
        unsigned code = rc == EMBER_ERR_LIMIT ? (atomic_load(&s->draining) ? 503 : 429) : rc == EMBER_ERR_NOMEM ? 500 : 400;
        run_free(r);
        return send_error(s, c, proto, code, NULL, "%s", code == 429 ? "the server is busy: too many requests waiting; retry later" : err.msg);
    }
    if (proto == PROTO_RESPONSES) { /* the response object moves to the output; streamed: created, in_progress */
        r->q.resp.response = NULL;
        resp_out_start(&r->ro, resp, r->q.stream ? resp_emit : NULL, r);
        if (r->ro.failed) {
            run_free(r);
            return send_error(s, c, proto, 500, NULL, "out of memory");
        }
    }
    if (r->q.stream) {
        stream_start(r);
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_reader, r, sse_free);
        if (!resp) {
            run_free(r);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        enum MHD_Result ret = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        count_code(s, 200);
        return ret;
    }
    while (!r->done) {
        ember_event ev;
        if (ember_stream_next(r->es, &ev, POLL_MS) == 0) {
            if (client_gone(c)) { /* nobody to answer: stop the row, drop the connection */
                run_free(r);
                return MHD_NO;
            }
            continue;
        }
        on_event(r, &ev, false);
    }
    enum MHD_Result ret;
    if (r->failed)
        ret = send_error(s, c, proto, 500, NULL, "out of memory");
    else if (r->final.finish == EMBER_FINISH_ERROR && !r->tg.stopped)
        ret = send_error(s, c, proto, 500, NULL, "generation failed");
    else
        ret = send_json(s, c, 200, full_response(r));
    run_free(r);
    return ret;
}

/* ---- other endpoints ------------------------------------------------------------------------ */

static enum MHD_Result do_models(ember_server *s, struct MHD_Connection *c) {
    json_t *m = json_pack("{s:s, s:s, s:i, s:s, s:i}", "id", s->o.model_id, "object", "model", "created",
                          (json_int_t)s->created, "owned_by", "ember", "context_length", s->info.n_ctx);
    if (s->o.model_note) json_object_set_new(m, "description", json_string(s->o.model_note));
    json_object_set_new(m, "kv_cache", json_pack("{s:s, s:I}", "kind", s->info.kv_type, "bytes_per_token",
                                                  (json_int_t)s->info.kv_bytes_per_token));
    json_object_set_new(m, "device", json_string(s->info.device));
    return send_json(s, c, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", m));
}

static void metric(strbuf *o, const char *name, const char *type, const char *help, double v) {
    char line[512];
    snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
    sb_puts(o, line);
}

static void histogram(strbuf *o, const char *name, const char *help, const histo *h, const double *b, int nb) {
    char line[256];
    snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    sb_puts(o, line);
    uint64_t cum = 0;
    for (int i = 0; i < nb; i++) {
        cum += h->counts[i];
        snprintf(line, sizeof line, "%s_bucket{le=\"%g\"} %llu\n", name, b[i], (unsigned long long)cum);
        sb_puts(o, line);
    }
    cum += h->counts[nb];
    snprintf(line, sizeof line, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.17g\n%s_count %llu\n", name,
             (unsigned long long)cum, name, h->sum, name, (unsigned long long)h->n);
    sb_puts(o, line);
}

static enum MHD_Result do_metrics(ember_server *s, struct MHD_Connection *c) {
    ember_engine_stats st;
    ember_engine_get_stats(s->eng, &st);
    strbuf o = {0};
    metric(&o, "ember_requests_running", "gauge", "Requests being generated (rows in the batch).", st.running);
    metric(&o, "ember_requests_waiting", "gauge", "Requests waiting for a row.", st.waiting);
    metric(&o, "ember_batch_rows", "gauge", "Rows of the batch (maximum concurrent requests).", st.rows);
    metric(&o, "ember_kv_cache_used_bytes", "gauge", "KV cache bytes held by running requests.", (double)st.kv_bytes_used);
    metric(&o, "ember_kv_cache_held_bytes", "gauge", "KV cache bytes held in all (running requests and cached prompts).",
           (double)st.kv_bytes_held);
    metric(&o, "ember_kv_cache_total_bytes", "gauge", "KV cache budget in bytes.", (double)st.kv_bytes_total);
    metric(&o, "ember_kv_cache_touched_bytes", "gauge",
           "KV cache bytes ever handed out (the high-water mark the cache's resident memory follows).",
           (double)st.kv_bytes_touched);
    metric(&o, "ember_kv_cache_usage_ratio", "gauge", "Fraction of the KV cache budget held by running requests.",
           st.kv_bytes_total ? (double)st.kv_bytes_used / (double)st.kv_bytes_total : 0);
    metric(&o, "ember_kv_cache_blocks_used", "gauge", "KV cache blocks (16 positions each) held.", st.kv_blocks_used);
    metric(&o, "ember_kv_cache_bytes_per_token", "gauge", "KV cache bytes one position takes in every layer.",
           (double)s->info.kv_bytes_per_token);
    metric(&o, "ember_requests_preempted_total", "counter",
           "Requests whose KV was dropped for memory and recomputed later.", (double)st.preempted_total);
    metric(&o, "ember_prefix_cache_blocks", "gauge", "KV blocks held by the prefix cache.", st.prefix_cache_entries);
    metric(&o, "ember_prefix_cache_bytes", "gauge", "Bytes of the KV blocks the prefix cache holds.",
           (double)st.prefix_cache_bytes);
    metric(&o, "ember_prefix_cache_unused_bytes", "gauge",
           "Bytes of prefix cache blocks no running request holds (evicted first when memory is short).",
           (double)st.prefix_cache_bytes_unused);
    metric(&o, "ember_prefix_cache_hits_total", "counter", "Requests that reused cached prompt positions.",
           (double)st.prefix_cache_hits);
    metric(&o, "ember_prefix_cache_misses_total", "counter", "Requests that reused no cached prompt position.",
           (double)st.prefix_cache_misses);
    metric(&o, "ember_prefix_cache_evictions_total", "counter", "Prefix cache blocks evicted.",
           (double)st.prefix_cache_evictions);
    if (s->o.prompt_cache_dir) {
        metric(&o, "ember_prompt_cache_disk_files", "gauge", "Files of the prompt cache's disk tier.",
               st.disk_cache_files);
        metric(&o, "ember_prompt_cache_disk_bytes", "gauge", "Bytes of the prompt cache's disk tier.",
               (double)st.disk_cache_bytes);
        metric(&o, "ember_prompt_cache_disk_restores_total", "counter", "Requests that started from a prompt cache file.",
               (double)st.disk_cache_restores);
        metric(&o, "ember_prompt_cache_disk_restored_tokens_total", "counter", "Positions loaded from prompt cache files.",
               (double)st.disk_cache_tokens_restored);
        metric(&o, "ember_prompt_cache_disk_writes_total", "counter", "Prompt cache files written.",
               (double)st.disk_cache_writes);
        metric(&o, "ember_prompt_cache_disk_removed_total", "counter",
               "Prompt cache files removed as damaged or made by another model, tokenizer or KV kind.",
               (double)st.disk_cache_removed);
        metric(&o, "ember_prompt_cache_disk_evictions_total", "counter", "Prompt cache files removed to keep the byte cap.",
               (double)st.disk_cache_evictions);
    }
    {
        char line[256];
        snprintf(line, sizeof line,
                 "# HELP ember_kv_cache_info The KV cache kind.\n# TYPE ember_kv_cache_info gauge\n"
                 "ember_kv_cache_info{kind=\"%s\"} 1\n",
                 s->info.kv_type);
        sb_puts(&o, line);
    }
    metric(&o, "ember_requests_total", "counter", "Requests accepted by the engine.", (double)st.requests_total);
    metric(&o, "ember_prompt_tokens_total", "counter", "Prompt tokens of accepted requests.", (double)st.prompt_tokens_total);
    metric(&o, "ember_prompt_tokens_cached_total", "counter", "Prompt tokens reused from the prefix cache.",
           (double)st.cached_tokens_total);
    metric(&o, "ember_generation_tokens_total", "counter", "Tokens generated.", (double)st.generated_tokens_total);
    metric(&o, "ember_engine_steps_total", "counter", "Forward steps run by the engine.", (double)st.steps_total);
    metric(&o, "ember_prefill_paced_steps_total", "counter",
           "Steps whose prompt tokens were capped to keep decoding rows at their pace (--prefill-pace).",
           (double)st.prefill_paced_steps);
    metric(&o, "ember_step_decode_seconds", "gauge",
           "Estimate of a step of the current decoding rows alone (fitted to the steps run).", st.step_decode_seconds);
    metric(&o, "ember_step_prefill_token_seconds", "gauge",
           "Estimate of what one prompt token adds to a step (fitted to the steps run).", st.step_prefill_token_seconds);
    metric(&o, "ember_spec_drafted_total", "counter", "Draft tokens verified by speculative decoding.",
           (double)st.spec_drafted_total);
    metric(&o, "ember_spec_accepted_total", "counter", "Draft tokens accepted (the target produced them).",
           (double)st.spec_accepted_total);
    metric(&o, "ember_spec_forwards_total", "counter", "Row forwards (target forwards of one request) that carried drafts.",
           (double)st.spec_forwards_total);
    metric(&o, "ember_decode_forwards_total", "counter", "Row forwards of decoding requests, with or without drafts.",
           (double)st.decode_forwards_total);
    metric(&o, "ember_decode_tokens_total", "counter",
           "Tokens those forwards produced (tokens per target forward = this / ember_decode_forwards_total).",
           (double)st.decode_tokens_total);
    pthread_mutex_lock(&s->mu);
    histo ttft = s->ttft, itl = s->itl;
    uint64_t codes[6], fin[5];
    memcpy(codes, s->http_by_code, sizeof codes);
    memcpy(fin, s->finished, sizeof fin);
    pthread_mutex_unlock(&s->mu);
    histogram(&o, "ember_time_to_first_token_seconds", "Time from request arrival to its first token.", &ttft, k_ttft_b,
              N_TTFT);
    histogram(&o, "ember_inter_token_latency_seconds", "Time between consecutive tokens of a request.", &itl, k_itl_b,
              N_ITL);
    char line[256];
    sb_puts(&o, "# HELP ember_http_responses_total HTTP responses by status class.\n# TYPE ember_http_responses_total counter\n");
    for (int i = 1; i < 6; i++) {
        snprintf(line, sizeof line, "ember_http_responses_total{code=\"%dxx\"} %llu\n", i, (unsigned long long)codes[i]);
        sb_puts(&o, line);
    }
    static const char *const fn[5] = {"none", "length", "stop", "cancelled", "error"};
    sb_puts(&o, "# HELP ember_requests_finished_total Finished requests by reason.\n# TYPE ember_requests_finished_total counter\n");
    for (int i = 1; i < 5; i++) {
        snprintf(line, sizeof line, "ember_requests_finished_total{reason=\"%s\"} %llu\n", fn[i], (unsigned long long)fin[i]);
        sb_puts(&o, line);
    }
    enum MHD_Result r = send_body(s, c, 200, "text/plain; version=0.0.4", o.data ? o.data : "", o.len, 0);
    sb_free(&o);
    return r;
}

static enum MHD_Result do_tokenize(ember_server *s, struct MHD_Connection *c, const json_t *body) {
    const json_t *t = json_object_get(body, "content");
    if (!t) t = json_object_get(body, "prompt");
    if (!json_is_string(t)) return send_error(s, c, PROTO_CHAT, 400, "content", "'content' must be a string");
    bool add_special = false;
    bad b;
    if (opt_bool(body, "add_special", &add_special, &b)) return send_error(s, c, PROTO_CHAT, 400, b.param, "%s", b.msg);
    int32_t *ids = NULL;
    size_t n = 0;
    ember_error err = {0};
    if (ember_tok_encode(s->tok, NULL, json_string_value(t), json_string_length(t), add_special ? EMBER_TOK_ADD_SPECIAL : 0,
                         &ids, &n, &err))
        return send_error(s, c, PROTO_CHAT, 400, "content", "%s", err.msg);
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(arr, json_integer(ids[i]));
    free(ids);
    return send_json(s, c, 200, json_pack("{s:o}", "tokens", arr));
}

static enum MHD_Result do_detokenize(ember_server *s, struct MHD_Connection *c, const json_t *body) {
    const json_t *t = json_object_get(body, "tokens");
    if (!json_is_array(t)) return send_error(s, c, PROTO_CHAT, 400, "tokens", "'tokens' must be an array of token ids");
    size_t n = json_array_size(t);
    int32_t *ids = ember_malloc((n ? n : 1) * sizeof *ids);
    if (!ids) return send_error(s, c, PROTO_CHAT, 500, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(t, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= s->info.vocab_size) {
            free(ids);
            return send_error(s, c, PROTO_CHAT, 400, "tokens", "tokens[%zu] is not a token id of this model", i);
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    char *text = NULL;
    size_t len = 0;
    ember_error err = {0};
    int rc = ember_tok_decode(s->tok, ids, n, 0, &text, &len, &err);
    free(ids);
    if (rc) return send_error(s, c, PROTO_CHAT, 400, "tokens", "%s", err.msg);
    json_t *j = json_pack("{s:o}", "content", ember_json_string_clean(text, len));
    free(text);
    return send_json(s, c, 200, j);
}

/* ---- routing ------------------------------------------------------------------------------------ */

typedef struct req_ctx {
    strbuf body;
    bool too_large;
    bool nomem; /* the body could not be stored */
} req_ctx;

/* GET /v1/responses/{id}: the stored response object; DELETE: forgets it
   (and so its conversation for previous_response_id). 404 when nothing is
   stored under id (never stored, store: false, dropped for room, deleted). */
static enum MHD_Result do_stored_response(ember_server *s, struct MHD_Connection *c, const char *id, bool get) {
    size_t n = strlen(id);
    if (n == 0 || n > 63 || strspn(id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != n)
        return send_error(s, c, PROTO_RESPONSES, 404, NULL, "no response with the id '%.64s' is stored", id);
    if (get) {
        json_t *r = resp_store_get(&s->rstore, id, true);
        if (!r)
            return send_error(s, c, PROTO_RESPONSES, 404, NULL,
                              "no response with the id '%s' is stored (responses are kept in memory while the server "
                              "runs, unless 'store' was false)",
                              id);
        return send_json(s, c, 200, r);
    }
    if (!resp_store_delete(&s->rstore, id))
        return send_error(s, c, PROTO_RESPONSES, 404, NULL, "no response with the id '%s' is stored", id);
    return send_json(s, c, 200, json_pack("{s:s, s:s, s:b}", "id", id, "object", "response", "deleted", 1));
}

static enum MHD_Result route(ember_server *s, struct MHD_Connection *c, const char *url, const char *method,
                             req_ctx *rq) {
    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    int proto = !strcmp(url, "/v1/messages") ? PROTO_ANTHROPIC : PROTO_CHAT;
    if (!strcmp(url, "/health") || !strcmp(url, "/v1/health")) {
        if (!get) return send_error(s, c, proto, 405, NULL, "use GET for %s", url);
        if (atomic_load(&s->draining))
            return send_json(s, c, 503, json_pack("{s:s}", "status", "shutting down"));
        return send_json(s, c, 200, json_pack("{s:s}", "status", "ok"));
    }
    if (!strcmp(url, "/v1/models")) {
        if (!get) return send_error(s, c, proto, 405, NULL, "use GET for %s", url);
        return do_models(s, c);
    }
    if (!strcmp(url, "/metrics")) {
        if (!get) return send_error(s, c, proto, 405, NULL, "use GET for %s", url);
        return do_metrics(s, c);
    }
    if (!strncmp(url, "/v1/responses/", 14)) {
        const char *id = url + 14;
        if (strchr(id, '/')) /* input_items, cancel: not kept / no background responses */
            return send_error(s, c, PROTO_RESPONSES, 404, NULL, "no endpoint %s %s (only GET and DELETE of "
                              "/v1/responses/{id} are supported)", method, url);
        if (!get && strcmp(method, "DELETE"))
            return send_error(s, c, PROTO_RESPONSES, 405, NULL, "use GET or DELETE for %s", url);
        return do_stored_response(s, c, id, get);
    }
    int kind = !strcmp(url, "/v1/chat/completions") ? 1
               : !strcmp(url, "/v1/completions")    ? 2
               : !strcmp(url, "/v1/messages")       ? 3
               : !strcmp(url, "/v1/responses")      ? 4
               : !strcmp(url, "/tokenize")          ? 5
               : !strcmp(url, "/detokenize")        ? 6
                                                    : 0;
    if (!kind) return send_error(s, c, proto, 404, NULL, "no endpoint %s %s", method, url);
    if (!post) return send_error(s, c, proto, 405, NULL, "use POST for %s", url);
    if (rq->nomem) return send_error(s, c, proto, 500, NULL, "out of memory");
    if (rq->too_large)
        return send_error(s, c, proto, 413, NULL, "the request body is larger than the %zu-byte limit", s->o.max_body);
    if (kind <= 4 && atomic_load(&s->draining))
        return send_error(s, c, proto, 503, NULL, "the server is shutting down");
    const char *text = rq->body.data ? rq->body.data : "";
    if (json_depth(text, rq->body.len) > MAX_JSON_DEPTH)
        return send_error(s, c, proto, 400, NULL, "the JSON body is nested deeper than %d levels", MAX_JSON_DEPTH);
    json_error_t je;
    json_t *body = json_loadb(text, rq->body.len, 0, &je);
    if (!body && json_error_code(&je) == json_error_out_of_memory)
        return send_error(s, c, proto, 500, NULL, "out of memory");
    if (!body) return send_error(s, c, proto, 400, NULL, "invalid JSON body: %s (line %d, column %d)", je.text, je.line, je.column);
    enum MHD_Result r;
    if (!json_is_object(body))
        r = send_error(s, c, proto, 400, NULL, "the request body must be a JSON object");
    else if (kind == 5)
        r = do_tokenize(s, c, body);
    else if (kind == 6)
        r = do_detokenize(s, c, body);
    else
        r = run_generation(s, c,
                           kind == 1   ? PROTO_CHAT
                           : kind == 2 ? PROTO_COMPLETION
                           : kind == 3 ? PROTO_ANTHROPIC
                                       : PROTO_RESPONSES,
                           body);
    json_decref(body);
    return r;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    ember_server *s = cls;
    req_ctx *rq = *con_cls;
    if (!rq) {
        rq = ember_calloc(1, sizeof *rq);
        if (!rq) return MHD_NO;
        *con_cls = rq;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->o.max_body) rq->too_large = true;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!rq->too_large) {
            if (rq->body.len + *upload_size > s->o.max_body)
                rq->too_large = true;
            else if (sb_append(&rq->body, upload, *upload_size))
                rq->nomem = rq->too_large = true; /* too_large: store no more */
        }
        *upload_size = 0;
        return MHD_YES;
    }
    return route(s, c, url, method, rq);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)c;
    (void)toe;
    req_ctx *rq = *con_cls;
    if (!rq) return;
    sb_free(&rq->body);
    free(rq);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    ember_server *s = cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = 0;
    ember_log(&s->o.log, EMBER_LOG_DEBUG, "http: %s", msg);
}

/* ---- life cycle ------------------------------------------------------------------------------------ */

/* A hash of the tokenizer's vocabulary: every id's text and special flag. */
static uint64_t tokenizer_fingerprint(const ember_tokenizer *tok) {
    int32_t n = ember_tok_n_vocab(tok);
    uint64_t h = ember_mix64((uint64_t)n);
    for (int32_t id = 0; id < n; id++) {
        size_t len = 0;
        const char *t = ember_tok_id_text(tok, id, &len);
        uint64_t v = ember_tok_is_special(tok, id) ? 1 : 0;
        for (size_t i = 0; t && i < len; i++) v = v * 0x100000001b3ull ^ (unsigned char)t[i];
        h = ember_mix64(h ^ v) + (uint64_t)id;
    }
    return h;
}

int ember_server_start(ember_model *m, const ember_tokenizer *tok, const ember_chat_template *tmpl,
                       const ember_server_opts *o, ember_server **out, ember_error *err) {
    *out = NULL;
    if (o->default_grammar) { /* checked once here: a request never meets a bad default */
        ember_grammar *g = ember_grammar_new();
        int rc = g ? ember_grammar_gbnf(g, o->default_grammar, strlen(o->default_grammar), err)
                   : ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        ember_grammar_free(g);
        if (rc) return rc;
    }
    ember_server *s = ember_calloc(1, sizeof *s);
    if (!s) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    s->m = m;
    s->tok = tok;
    s->tmpl = tmpl;
    s->o = *o;
    if (!s->o.host) s->o.host = "127.0.0.1";
    if (!s->o.port) s->o.port = 8080;
    if (!s->o.max_body) s->o.max_body = 4u << 20;
    if (!s->o.max_connections) s->o.max_connections = 512;
    if (!s->o.model_id) s->o.model_id = "ember";
    s->created = time(NULL);
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->gv_mu, NULL);
    resp_store_init(&s->rstore);
    ember_model_get_info(m, &s->info);
    s->n_keep = ember_tool_format_marker_ids(o->tool_format, tok, s->keep_ids, 8);
    ember_engine_params ep = {.max_queue = o->max_queue, .spec = o->spec, .draft_max = o->draft_max,
                              .draft_min = o->draft_min, .draft_model = o->draft_model,
                              .prefill_chunk = o->prefill_chunk,
                              .prefill_pace = o->prefill_pace};
    if (o->prompt_cache_dir) { /* files keep token ids: the tokenizer that made them is part of their identity */
        ep.prompt_cache_dir = o->prompt_cache_dir;
        ep.prompt_cache_max = o->prompt_cache_max;
        ep.prompt_cache_tag = tokenizer_fingerprint(tok);
    }
    int rc = ember_engine_new(m, &ep, &s->eng, err);
    if (rc) {
        pthread_mutex_destroy(&s->mu);
        pthread_mutex_destroy(&s->gv_mu);
        resp_store_free(&s->rstore);
        free(s);
        return rc;
    }
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)s->o.port);
    if (inet_pton(AF_INET, s->o.host, &addr.sin_addr) != 1) {
        ember_server_stop(s, 0);
        return ember_err(err, EMBER_ERR_INVALID_ARG, "host '%s' is not an IPv4 address", o->host);
    }
    s->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC |
                                MHD_USE_ERROR_LOG,
                            (uint16_t)s->o.port, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                            MHD_OPTION_SOCK_ADDR, &addr,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)s->o.max_connections, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600,
                            MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1,
                            MHD_OPTION_END);
    if (!s->d) {
        ember_server_stop(s, 0);
        return ember_err(err, EMBER_ERR_IO, "cannot listen on %s:%d (address in use, or not allowed)", o->host ? o->host : "127.0.0.1",
                         o->port ? o->port : 8080);
    }
    *out = s;
    return EMBER_OK;
}

int ember_server_port(const ember_server *s) {
    return s->o.port;
}

void ember_server_stop(ember_server *s, double drain_seconds) {
    if (!s) return;
    atomic_store(&s->draining, 1);
    if (s->d) {
        MHD_socket ls = MHD_quiesce_daemon(s->d); /* no new connections */
        if (ls != MHD_INVALID_SOCKET) close(ls);
        double until = ember_now() + drain_seconds;
        while (atomic_load(&s->active) > 0 && ember_now() < until) {
            struct timespec ts = {0, 20 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    /* whatever is still running is cancelled; handlers then answer and end */
    ember_engine_shutdown(s->eng);
    if (s->d) MHD_stop_daemon(s->d);
    ember_engine_free(s->eng);
    ember_gvocab_free(s->gv);
    pthread_mutex_destroy(&s->gv_mu);
    resp_store_free(&s->rstore);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
