/*
 * test_faults.c - simulated failures (src/core/fault.h, tests/fault_walk.h):
 * every allocation, and every file open / map / read, failed in turn along
 * a representative run of each surface:
 *   - loading a model: safetensors (fixtures/llama, gemma3_text) and GGUF
 *     (testdata stories260K), then its logits, which must equal the clean
 *     run's bit for bit;
 *   - loading a tokenizer (tokenizer.json of testdata's qwen3, the GGUF
 *     vocabulary of stories260K) and encoding, ids equal to the clean run's;
 *     also with every read() cut short (same ids);
 *   - the text API on the demo model: open, render, tokenize, chat; and
 *     generate alone on an open ember_text, after whose failure a clean
 *     generate on the same object must give the clean run's text; and two
 *     chats at once, where the one not failed must give the clean text;
 *     and a chat with tools, a tool call and its result on Qwen2.5's
 *     template (testdata), whose scripted reply's call must come back
 *     parsed as in the clean run;
 *   - a KV cache operation sequence (append, clone, trim, extract / merge,
 *     speculative round, save / load): an operation that fails leaves every
 *     row exactly as it was, and the rest of the sequence then gives the
 *     clean run's rows;
 *   - a server request (chat and /v1/responses, streaming and not, allocations of jansson
 *     included) and streamed writes that fail: the client gets the answer
 *     or an error, the server frees the row and answers the next request.
 * Each walk prints its calls and points; the summary line counts them all.
 * Surfaces whose data (../shared) is absent are skipped, saying so.
 */
#define _GNU_SOURCE
#include "server_util.h"

#include <pthread.h>

#include "core/fault.h"
#include "core/util.h"
#include "api/text_int.h"
#include "fault_walk.h"
#include "kv/kv.h"
#include "template/load.h"
#include "tok/tokenizer.h"

static bool have(const char *rel) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", EMBER_SHARED_DIR, rel);
    if (path_exists(p)) return true;
    fprintf(stderr, "skipped: %s not found (test data from ../shared is absent)\n", p);
    return false;
}

/* ---- models ------------------------------------------------------------- */

/* The first clean run's result got (n bytes) is kept: *want takes it and
   true is returned (the caller no longer owns got). Every later clean
   run's must equal it byte for byte; false. */
static bool first_or_same(void **want, size_t *n_want, void *got, size_t n, const char *path, const char *what) {
    if (*want) {
        CHECKF(n == *n_want && !memcmp(got, *want, n), "%s: %s differ", path, what);
        return false;
    }
    *want = got;
    *n_want = n;
    return true;
}

typedef struct model_run {
    char path[1024];
    void *want; /* the clean run's logits */
    size_t n_want;
} model_run;

static const int32_t k_ids[5] = {1, 17, 42, 99, 7};

static int run_model(void *u, ember_error *err) {
    model_run *r = u;
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.n_threads = 1;
    mp.n_ctx = 64;
    mp.n_rows = 1;
    ember_model *m = (ember_model *)&mp; /* must come back NULL on failure */
    int rc = ember_model_load(r->path, &mp, &m, err);
    if (rc) {
        CHECKF(m == NULL, "%s: a failed load handed out a model", r->path);
        return rc;
    }
    ember_model_info info;
    ember_model_get_info(m, &info);
    size_t n = (size_t)info.vocab_size * 5;
    float *out = malloc(n * sizeof *out);
    rc = ember_logits(m, k_ids, 5, out, err);
    if (!rc && first_or_same(&r->want, &r->n_want, out, n * sizeof *out, r->path, "logits")) out = NULL;
    free(out);
    ember_model_free(m);
    return rc;
}

static void models(void) {
    static const char *const rel[] = {"fixtures/llama", "fixtures/gemma3_text",
                                      "testdata/models/stories260K/stories260K.gguf"};
    for (size_t i = 0; i < EMBER_ARRAY_LEN(rel); i++) {
        if (!have(rel[i])) continue;
        model_run r = {0};
        snprintf(r.path, sizeof r.path, "%s/%s", EMBER_SHARED_DIR, rel[i]);
        char name[128];
        snprintf(name, sizeof name, "model %s", ember_basename(rel[i]));
        fault_walk(name, EMBER_FAULT_ALLOC, run_model, &r);
        fault_walk(name, EMBER_FAULT_READ, run_model, &r);
        free(r.want);
    }
}

/* ---- tokenizers ----------------------------------------------------------- */

typedef struct tok_run {
    char path[1024];
    void *want; /* the clean run's ids */
    size_t n_want;
} tok_run;

static const char k_text[] = "Hello, world! Once upon a time, h\xc3\xa9llo 12345 <|im_end|>\n\tdone.";

static int run_tok(void *u, ember_error *err) {
    tok_run *r = u;
    ember_tokenizer *t = (ember_tokenizer *)r;
    int rc = ember_tok_load(r->path, &t, err);
    if (rc) {
        CHECKF(t == NULL, "%s: a failed load handed out a tokenizer", r->path);
        return rc;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    rc = ember_tok_encode(t, NULL, k_text, sizeof k_text - 1, 0, &ids, &n, err);
    if (!rc && first_or_same(&r->want, &r->n_want, ids, n * sizeof *ids, r->path, "ids")) ids = NULL;
    free(ids);
    ember_tok_free(t);
    return rc;
}

static void tokenizers(void) {
    static const char *const rel[] = {"testdata/tokenizers/hf/mistral-7b-v0.1",
                                      "testdata/tokenizers/llama.cpp-vocab/ggml-vocab-bert-bge.gguf",
                                      "testdata/models/stories260K/stories260K.gguf", "testdata/tokenizers/hf/qwen3"};
    for (size_t i = 0; i < EMBER_ARRAY_LEN(rel); i++) {
        /* qwen3's 150k-entry tokenizer.json takes 0.1-0.3 s a load (several under the
           sanitizers): a sample of its points, in the release pass only */
        bool big = strstr(rel[i], "qwen3") != NULL;
        if (big && FAULT_SANITIZED) continue;
        if (!have(rel[i])) continue;
        tok_run r = {0};
        snprintf(r.path, sizeof r.path, "%s/%s", EMBER_SHARED_DIR, rel[i]);
        char name[128];
        snprintf(name, sizeof name, "tokenizer %s", ember_basename(rel[i]));
        /* a load that succeeds late costs a whole load: under the sanitizers
           every point up to 30, then 20 spread over the rest */
        if (big)
            fault_walk_n(name, EMBER_FAULT_ALLOC, run_tok, &r, 0, 8);
        else
            fault_walk_n(name, EMBER_FAULT_ALLOC, run_tok, &r, FAULT_SANITIZED ? 30 : 400, FAULT_SANITIZED ? 20 : 60);
        fault_walk(name, EMBER_FAULT_READ, run_tok, &r);
        /* short reads are not errors: the same ids */
        ember_error err = {0};
        ember_fault_short_reads(7);
        CHECKF(run_tok(&r, &err) == EMBER_OK, "%s with short reads: %s", name, err.msg);
        ember_fault_reset();
        free(r.want);
    }
}

/* ---- the text API ----------------------------------------------------------- */

static const char *g_demo; /* the demo model's directory */

typedef struct text_run {
    ember_text *t;  /* the open object of the generate walk */
    char *want;     /* the clean run's text */
    char *want_render;
} text_run;

static const ember_message k_msgs[] = {{"system", "Be brief."}, {"user", "Tell me a story."}};

static int generate(ember_text *t, char **text, ember_error *err) {
    ember_gen_text_params g;
    ember_gen_text_params_init(&g);
    g.max_tokens = 6;
    g.ignore_eos = 1;
    ember_text_result res;
    ember_text_result_init(&res);
    int rc = ember_text_chat(t, k_msgs, 2, &g, &res, err);
    *text = rc ? NULL : res.text;
    if (rc) CHECKF(res.text == NULL, "a failed generate handed out text");
    return rc;
}

static int run_text_open(void *u, ember_error *err) {
    text_run *r = u;
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.n_threads = 1;
    mp.n_ctx = 256;
    mp.n_rows = 1;
    ember_text_params p;
    ember_text_params_init(&p);
    p.model = &mp;
    ember_text *t = (ember_text *)r;
    int rc = ember_text_open(g_demo, &p, &t, err);
    if (rc) {
        CHECKF(t == NULL, "a failed ember_text_open handed out an object");
        return rc;
    }
    char *rendered = NULL, *text = NULL;
    rc = ember_text_render(t, k_msgs, 2, 1, &rendered, NULL, err);
    if (!rc && r->want_render) CHECKF(!strcmp(rendered, r->want_render), "rendered '%s'", rendered);
    int32_t *ids = NULL;
    size_t n = 0;
    if (!rc) rc = ember_text_tokenize(t, rendered, strlen(rendered), 0, &ids, &n, err);
    if (!rc) rc = generate(t, &text, err);
    if (!rc && r->want) CHECKF(!strcmp(text, r->want), "text '%s', want '%s'", text, r->want);
    if (!rc && !r->want) {
        r->want = text;
        r->want_render = rendered;
        text = rendered = NULL;
    }
    ember_free(ids);
    ember_free(text);
    ember_free(rendered);
    ember_text_free(t);
    return rc;
}

/* generate on an open object; after a failure the object still works */
static int run_text_generate(void *u, ember_error *err) {
    text_run *r = u;
    char *text = NULL;
    int rc = generate(r->t, &text, err);
    if (!rc) CHECKF(!strcmp(text, r->want), "text '%s', want '%s'", text, r->want);
    ember_free(text);
    if (rc) {
        ember_fault_hold(true);
        ember_error e2;
        CHECKF(generate(r->t, &text, &e2) == EMBER_OK && !strcmp(text, r->want),
               "generate after a failed one: %s", text ? text : e2.msg);
        ember_free(text);
        ember_fault_hold(false);
    }
    return rc;
}

/* two chats at once on an open object: a failure in one leaves the other's
   text right (the engine keeps serving the other row) */
typedef struct chat_job {
    ember_text *t;
    char *text;
    int rc;
    ember_error err;
} chat_job;

static void *chat_thread(void *u) {
    chat_job *j = u;
    j->rc = generate(j->t, &j->text, &j->err);
    return NULL;
}

static int run_text_two(void *u, ember_error *err) {
    text_run *r = u;
    chat_job a = {r->t, NULL, 0, {0}}, b = {r->t, NULL, 0, {0}};
    pthread_t th;
    bool threaded = pthread_create(&th, NULL, chat_thread, &a) == 0;
    chat_thread(&b);
    if (threaded) pthread_join(th, NULL);
    CHECK(threaded);
    int rc = EMBER_OK;
    chat_job *jobs[2] = {&a, &b};
    for (int i = 0; i < 2; i++) {
        if (jobs[i]->rc == EMBER_OK)
            CHECKF(!strcmp(jobs[i]->text, r->want), "point %ld: concurrent chat %d: '%s'", g_fault_n, i, jobs[i]->text);
        else if (!rc) {
            rc = jobs[i]->rc;
            *err = jobs[i]->err;
        }
        ember_free(jobs[i]->text);
    }
    return rc;
}

/* a conversation with tools; the scripted reply calls one */
static int run_text_tools(void *u, ember_error *err) {
    ember_text *t = u;
    ember_chat_params cp;
    ember_chat_params_init(&cp);
    cp.tools = "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
               "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}]";
    const ember_chat_message msgs[] = {
        {.role = "user", .content = "Weather in Paris?"},
        {.role = "assistant",
         .tool_calls = "[{\"id\": \"call_1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
                       "\"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}]"},
        {.role = "tool", .content = "18 C", .tool_call_id = "call_1"},
        {.role = "user", .content = "And in Rome?"}};
    ember_text_result res;
    ember_text_result_init(&res);
    int rc = ember_text_chat_messages(t, msgs, 4, &cp, NULL, &res, err);
    if (rc) {
        CHECKF(res.text == NULL && res.tool_calls == NULL, "a failed chat handed out text or calls");
        return rc;
    }
    CHECKF(res.text && !strcmp(res.text, "Let me check.\n"), "text '%s'", res.text ? res.text : "(null)");
    CHECKF(res.n_tool_calls == 1 && res.tool_calls &&
               strstr(res.tool_calls, "\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Rome\\\"}\""),
           "calls %s", res.tool_calls ? res.tool_calls : "(null)");
    ember_free(res.text);
    ember_free(res.tool_calls);
    return EMBER_OK;
}

static void text_tools(void) {
    if (!have("testdata/chat-templates/llama.cpp/Qwen-Qwen2.5-7B-Instruct.jinja")) return;
    char cmd[2400];
    snprintf(cmd, sizeof cmd,
             "rm -rf '%s/faults_qwen' && cp -r '%s' '%s/faults_qwen' && "
             "cp '%s/testdata/chat-templates/llama.cpp/Qwen-Qwen2.5-7B-Instruct.jinja' '%s/faults_qwen/chat_template.jinja'",
             EMBER_TEST_TMP, g_demo, EMBER_TEST_TMP, EMBER_SHARED_DIR, EMBER_TEST_TMP);
    CHECK(system(cmd) == 0);
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.n_threads = 1;
    mp.n_ctx = 1024; /* the tools' text makes a long prompt */
    ember_text_params p;
    ember_text_params_init(&p);
    p.model = &mp;
    ember_error err;
    ember_text *t = NULL;
    if (!CHECKV(ember_text_open(EMBER_TEST_TMP "/faults_qwen", &p, &t, &err) == EMBER_OK, "%s", err.msg)) return;
    CHECK(ember_text_script(t, "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                               "{\"city\": \"Rome\"}}\n</tool_call>",
                            &err) == EMBER_OK);
    fault_walk("text chat with tools", EMBER_FAULT_ALLOC, run_text_tools, t);
    ember_text_free(t);
}

static void text_api(void) {
    text_run r = {0};
    fault_walk("text open+render+chat", EMBER_FAULT_ALLOC, run_text_open, &r);
    fault_walk("text open+render+chat", EMBER_FAULT_READ, run_text_open, &r);
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.n_threads = 1;
    mp.n_ctx = 256;
    ember_text_params p;
    ember_text_params_init(&p);
    p.model = &mp;
    ember_error err;
    if (r.want && ember_text_open(g_demo, &p, &r.t, &err) == EMBER_OK) {
        fault_walk("text chat on an open object", EMBER_FAULT_ALLOC, run_text_generate, &r);
        fault_walk("text two chats at once", EMBER_FAULT_ALLOC, run_text_two, &r);
        ember_text_free(r.t);
    }
    free(r.want);
    free(r.want_render);
    text_tools();
}

/* ---- a KV cache operation sequence ------------------------------------------ */

#define KROWS 4
#define KCTX 64
#define LAYERS 2
#define HEADS 2
#define HD 16
static ember_backend *g_be;
static const int k_kv_heads[LAYERS] = {HEADS, HEADS}, k_kv_dims[LAYERS] = {HD, HD}, k_kv_win[LAYERS] = {0, 16};

typedef struct kv_snap {
    int len[KROWS];
    int ok[KROWS][KCTX][LAYERS];
    float k[KROWS][KCTX][LAYERS][HEADS * HD], v[KROWS][KCTX][LAYERS][HEADS * HD];
} kv_snap;

static void kv_values(int r, int pos, int l, float *k, float *v) {
    for (int i = 0; i < HEADS * HD; i++) {
        k[i] = sinf((float)r * 0.37f + (float)i * 0.11f + (float)l + (float)pos * 0.013f);
        v[i] = cosf((float)r * 0.23f - (float)i * 0.07f + (float)l * 0.5f + (float)pos * 0.029f);
    }
}

/* What every row holds (read with the faults held). */
static void kv_snapshot(ember_kv *kv, kv_snap *s) {
    ember_fault_hold(true);
    memset(s, 0, sizeof *s);
    ember_error err;
    for (int r = 0; r < KROWS; r++) {
        s->len[r] = ember_kv_len(kv, r);
        for (int p = 0; p < s->len[r] && p < KCTX; p++)
            for (int l = 0; l < LAYERS; l++)
                s->ok[r][p][l] = ember_kv_read_pos(kv, r, l, p, s->k[r][p][l], s->v[r][p][l], &err) == EMBER_OK;
    }
    ember_fault_hold(false);
}

/* Appends n positions of generated values to row r in one forward. */
static int kv_append(ember_kv *kv, int r, int n, ember_error *err) {
    int from = ember_kv_len(kv, r);
    if (n > ember_kv_max_append(kv, r) || n > 12)
        return ember_err(err, EMBER_ERR_INTERNAL, "kv_append: %d positions in one go", n);
    int32_t row[12], pos[12];
    for (int i = 0; i < n; i++) row[i] = r, pos[i] = from + i;
    ember_buffer *kb = NULL, *vb = NULL;
    ember_tensor kt, vt;
    const int64_t shape[3] = {n, HEADS, HD};
    int rc = ember_tensor_alloc(g_be, &kt, &kb, EMBER_F32, 3, shape, err);
    if (!rc) rc = ember_tensor_alloc(g_be, &vt, &vb, EMBER_F32, 3, shape, err);
    if (!rc) rc = ember_kv_begin(kv, row, pos, n, err);
    bool begun = !rc;
    for (int l = 0; l < LAYERS && !rc; l++) {
        float tk[12 * HEADS * HD], tv[12 * HEADS * HD];
        for (int i = 0; i < n; i++) kv_values(r, from + i, l, tk + i * HEADS * HD, tv + i * HEADS * HD);
        rc = g_be->ops->write(g_be, &kt, 0, tk, sizeof(float) * (size_t)n * HEADS * HD, err);
        if (!rc) rc = g_be->ops->write(g_be, &vt, 0, tv, sizeof(float) * (size_t)n * HEADS * HD, err);
        ember_kv_layer views[2];
        ember_kv_map map;
        ember_kv_map_for(kv, l, row, pos, views, &map);
        if (!rc) rc = g_be->ops->kv_write(g_be, &map, &kt, &vt, err);
    }
    if (begun) ember_kv_end(kv, rc == EMBER_OK);
    ember_buffer_free(kb);
    ember_buffer_free(vb);
    return rc;
}

enum { KV_OPS = 12 };

/* Operation i of the sequence on kv: each one library operation (an append
   is one forward's begin / write / end). */
static int kv_op(ember_kv *kv, int i, ember_error *err) {
    switch (i) {
    case 0: return kv_append(kv, 0, 12, err);
    case 1: return kv_append(kv, 0, 12, err); /* up to the conversion at 24 */
    case 10: return kv_append(kv, 0, 6, err); /* converts the row */
    case 11: return kv_append(kv, 0, 12, err);
    case 2: return ember_kv_clone(kv, 0, 1, err);
    case 3: {
        int to = ember_kv_len(kv, 1) - 5, min = ember_kv_min_reuse(kv, 1);
        return ember_kv_trim(kv, 1, to > min ? to : min, err);
    }
    case 4: return kv_append(kv, 1, 6, err);
    case 5: {
        ember_kv_rowstate *st = NULL;
        int rc = ember_kv_extract(kv, 0, &st, err), dst = 2;
        if (!rc) rc = ember_kv_merge(kv, &st, &dst, 1, err);
        if (st) ember_kv_rowstate_free(kv, st);
        return rc;
    }
    case 6: {
        int rc = ember_kv_spec_begin(kv, 2, err);
        if (rc) return rc;
        rc = kv_append(kv, 2, 3, err);
        if (rc) {
            ember_error e2;
            CHECK(ember_kv_spec_rollback(kv, 2, &e2) == EMBER_OK);
            return rc;
        }
        return ember_kv_spec_commit(kv, 2, 1, err);
    }
    case 7: {
        void *blob = NULL;
        size_t n = 0;
        int rc = ember_kv_row_save(kv, 1, &blob, &n, err);
        if (!rc) rc = ember_kv_row_load(kv, 3, blob, n, err);
        free(blob);
        return rc;
    }
    case 8: return kv_append(kv, 3, 4, err);
    default: {
        static const int keep[3] = {1, 2, 3};
        ember_kv_filter(kv, keep, 3);
        return EMBER_OK;
    }
    }
}

typedef struct kv_run {
    bool have_want;
    kv_snap want, before, after;
} kv_run;

static int run_kv(void *u, ember_error *err) {
    kv_run *r = u;
    ember_kv_type type;
    ember_error e2;
    CHECK(ember_kv_type_parse("q8", 0, 24, &type, &e2) == EMBER_OK);
    ember_kv_params p = {type, LAYERS, k_kv_heads, k_kv_dims, k_kv_win, KROWS, KCTX, 0, 8, 12, NULL, {0}};
    ember_kv *kv = (ember_kv *)r;
    int rc = ember_kv_new(g_be, &p, &kv, err);
    if (rc) {
        CHECKF(kv == NULL, "a failed ember_kv_new handed out a cache");
        return rc;
    }
    int first = EMBER_OK;
    static const int order[KV_OPS] = {0, 1, 10, 11, 2, 3, 4, 5, 6, 7, 8, 9};
    for (int oi = 0; oi < KV_OPS; oi++) {
        int i = order[oi];
        kv_snapshot(kv, &r->before);
        int orc = kv_op(kv, i, err);
        if (!orc) continue;
        if (!first) first = orc;
        ember_fault_reset(); /* one failure per run: the rest runs clean */
        kv_snapshot(kv, &r->after);
        CHECKF(!memcmp(&r->before, &r->after, sizeof r->before), "kv op %d failed (%s) and changed the rows", i,
               err->msg);
        CHECKF(kv_op(kv, i, &e2) == EMBER_OK, "kv op %d again: %s", i, e2.msg);
    }
    kv_snapshot(kv, &r->after);
    if (r->have_want) CHECKF(!memcmp(&r->want, &r->after, sizeof r->want), "kv rows after the sequence differ");
    if (!r->have_want && !first) {
        r->want = r->after;
        r->have_want = true;
    }
    for (int i = 0; i < KROWS; i++) ember_kv_clear(kv, i);
    CHECKF(ember_kv_blocks_used(kv) == 0, "%d blocks still held with every row cleared", ember_kv_blocks_used(kv));
    ember_kv_free(kv);
    return first;
}

static void kv_sequence(void) {
    ember_error err = {0};
    ember_cpu_params cp = {1, EMBER_ISA_AUTO, false, {0}};
    CHECK(ember_backend_cpu_new(&cp, &g_be, &err) == EMBER_OK);
    static kv_run r;
    fault_walk("kv sequence (q8 from 24, a window)", EMBER_FAULT_ALLOC, run_kv, &r);
    ember_backend_free(g_be);
}

/* ---- a server request ----------------------------------------------------------- */

static pthread_t g_main;

/* jansson's allocations on the server's threads are walked too (the test's
   own parsing, on the main thread, is not) */
static void *json_alloc(size_t n) {
    if (!pthread_equal(pthread_self(), g_main) && ember_fault_hit(EMBER_FAULT_ALLOC)) return NULL;
    return malloc(n);
}

typedef struct server_run {
    bool stream;
    bool responses; /* POST /v1/responses instead of /v1/chat/completions */
    char *want;     /* the clean run's text */
} server_run;

static const char k_chat[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story.\"}],"
                             "\"max_tokens\":8,\"temperature\":0%s}";
static const char k_responses[] = "{\"input\":\"Tell me a story.\",\"max_output_tokens\":8,\"temperature\":0%s}";

/* The text of an SSE chat stream (*done when it ended with [DONE]) or of a
   Responses stream (*done when it ended with response.completed /
   response.incomplete; *error on an error or response.failed event). */
static char *sse_text(const char *body, bool *done, bool *error) {
    size_t cap = strlen(body) + 1, n = 0;
    char *text = calloc(1, cap);
    *done = *error = false;
    for (const char *p = body; p && *p;) {
        const char *e = strstr(p, "\n\n");
        if (!strncmp(p, "event: ", 7) && strchr(p, '\n') && (!e || strchr(p, '\n') < e)) p = strchr(p, '\n') + 1;
        if (!strncmp(p, "data: [DONE]", 12)) *done = true;
        else if (!strncmp(p, "data: ", 6)) {
            json_t *j = json_loadb(p + 6, (size_t)((e ? e : p + strlen(p)) - p - 6), 0, NULL);
            const char *ty = json_string_value(json_object_get(j, "type"));
            if (json_object_get(j, "error") || (ty && (!strcmp(ty, "error") || !strcmp(ty, "response.failed"))))
                *error = true;
            if (ty && (!strcmp(ty, "response.completed") || !strcmp(ty, "response.incomplete"))) *done = true;
            const char *c = json_string_value(json_object_get(
                json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta"), "content"));
            if (ty && !strcmp(ty, "response.output_text.delta")) c = json_string_value(json_object_get(j, "delta"));
            if (c && n + strlen(c) < cap) {
                memcpy(text + n, c, strlen(c));
                n += strlen(c);
            }
            json_decref(j);
        }
        p = e ? e + 2 : NULL;
    }
    return text;
}

/* One chat (or Responses) request; its text, or NULL with an error made of the answer. */
static char *chat(bool stream, bool responses, ember_error *err) {
    char body[512];
    snprintf(body, sizeof body, responses ? k_responses : k_chat, stream ? ",\"stream\":true" : "");
    http_resp r;
    http_request(g_port, "POST", responses ? "/v1/responses" : "/v1/chat/completions", body, &r);
    char *text = NULL;
    if (r.status == 200 && stream) {
        bool done, error;
        text = sse_text(r.body ? r.body : "", &done, &error);
        if (!done || error) {
            free(text);
            text = NULL;
            ember_err(err, error ? EMBER_ERR_NOMEM : EMBER_ERR_IO, "stream %s", error ? "with an error" : "cut");
        }
    } else if (r.status == 200) {
        json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
        const char *c = json_string_value(
            json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message"), "content"));
        if (responses)
            c = json_string_value(json_object_get(
                json_array_get(json_object_get(json_array_get(json_object_get(j, "output"), 0), "content"), 0), "text"));
        text = c ? strdup(c) : NULL;
        if (!text) ember_err(err, EMBER_ERR_INTERNAL, "200 without a message: %s", r.body ? r.body : "");
        json_decref(j);
    } else {
        json_t *j = json_loadb(r.body ? r.body : "", r.body_len, 0, NULL);
        const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
        /* 500 with a JSON error ("out of memory", or "generation failed" when the
           engine's row failed); 0: the server could not even keep the request's
           state (the first allocation of a connection) and closed it */
        bool clean = (r.status >= 500 && msg) || r.status == 0;
        CHECKF(clean, "point %ld: status %d, body '%s'", g_fault_n, r.status, r.body ? r.body : "");
        ember_err(err, clean ? EMBER_ERR_NOMEM : EMBER_ERR_INTERNAL, "%d: %s", r.status, msg ? msg : "(no JSON error)");
        json_decref(j);
    }
    http_resp_free(&r);
    return text;
}

static int run_server(void *u, ember_error *err) {
    server_run *r = u;
    char *text = chat(r->stream, r->responses, err);
    int rc = text ? EMBER_OK : err->code;
    if (text && r->want) CHECKF(!strcmp(text, r->want), "point %ld: text '%s', want '%s'", g_fault_n, text, r->want);
    if (text && !r->want) {
        r->want = text;
        text = NULL;
    }
    free(text);
    if (rc) { /* the row was freed and the server still answers */
        ember_fault_reset();
        CHECKF(server_wait_idle(), "the server is not idle after a failed request (%s)", err->msg);
        ember_error e2;
        char *again = chat(r->stream, r->responses, &e2);
        CHECKF(again && r->want && !strcmp(again, r->want), "the next request: %s", again ? again : e2.msg);
        free(again);
    }
    return rc;
}

static void server(void) {
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.n_rows = 2;
    mp.n_ctx = 512;
    mp.n_threads = 1;
    ember_error err = {0};
    ember_model *m = NULL;
    ember_tokenizer *tok = NULL;
    ember_chat_template *tmpl = NULL;
    CHECKF(ember_model_load(g_demo, &mp, &m, &err) == EMBER_OK, "%s", err.msg);
    CHECKF(ember_tok_load(g_demo, &tok, &err) == EMBER_OK, "%s", err.msg);
    int tools = 0;
    CHECKF(ember_chat_template_load(g_demo, &tmpl, &tools, &err) == EMBER_OK, "%s", err.msg);
    if (!m || !tok || !tmpl) return;
    /* EMBER_FAULT_JANSSON=1: jansson's allocations on the server's threads
       fail too. Off by default: jansson 2.14 itself reports some of its
       out-of-memory failures as syntax errors and can dump malformed JSON
       (docs/testing.md); the server's own handling of them was fixed with it. */
    g_main = pthread_self();
    if (fault_env("EMBER_FAULT_JANSSON", 0)) json_set_alloc_funcs(json_alloc, free);
    ember_server_opts o = {0};
    o.model_id = "demo";
    o.max_queue = 8;
    o.max_body = 64 * 1024;
    ember_server *s = server_start(m, tok, tmpl, &o, 2);
    server_run plain = {false, false, NULL}, stream = {true, false, NULL};
    server_run rplain = {false, true, NULL}, rstream = {true, true, NULL};
    fault_walk("server chat", EMBER_FAULT_ALLOC, run_server, &plain);
    g_fault_any_status = true; /* a stream cut by a failure says no more than that */
    fault_walk("server chat, streamed", EMBER_FAULT_ALLOC, run_server, &stream);
    fault_walk("server chat, streamed", EMBER_FAULT_WRITE, run_server, &stream);
    g_fault_any_status = false;
    CHECK(plain.want && stream.want && !strcmp(plain.want, stream.want));
    /* the Responses endpoint: the same prompt, the same text */
    rplain.want = plain.want ? strdup(plain.want) : NULL;
    rstream.want = plain.want ? strdup(plain.want) : NULL;
    fault_walk("server responses", EMBER_FAULT_ALLOC, run_server, &rplain);
    g_fault_any_status = true;
    fault_walk("server responses, streamed", EMBER_FAULT_ALLOC, run_server, &rstream);
    fault_walk("server responses, streamed", EMBER_FAULT_WRITE, run_server, &rstream);
    g_fault_any_status = false;
    free(rplain.want);
    free(rstream.want);
    free(plain.want);
    free(stream.want);
    ember_server_stop(s, 5.0);
    json_set_alloc_funcs(malloc, free);
    ember_chat_template_free(tmpl);
    ember_tok_free(tok);
    ember_model_free(m);
}

int main(int argc, char **argv) {
    /* argv[1]: run only the surfaces whose name contains it (models, tokenizers, text, kv, server) */
    const char *only = argc > 1 ? argv[1] : "";
    char dir[600], cmd[1400];
    snprintf(dir, sizeof dir, "%s/faults_demo", EMBER_TEST_TMP);
    snprintf(cmd, sizeof cmd, "'%s' mkmodel --preset demo --out '%s' > /dev/null", EMBER_BIN, dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "ember mkmodel --preset demo failed\n");
        return 1;
    }
    g_demo = dir;
    if (strstr("kv", only)) kv_sequence();
    if (strstr("text", only)) text_api();
    if (strstr("server", only)) server();
    if (strstr("tokenizers", only)) tokenizers();
    if (strstr("models", only)) models();
    fprintf(stderr, "fault points: %ld walked, %ld clean errors, %ld recovered\n", g_fault_points, g_fault_failed,
            g_fault_recovered);
    return test_done();
}
