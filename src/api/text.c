/*
 * text.c - the text API of include/ember.h: a model opened with its
 * tokenizer and chat template, and generation from text with streamed,
 * stop-string-aware output.
 *
 * Ownership: an ember_text owns its model, tokenizer, chat template (may be
 * NULL), the texts of the BOS and EOS tokens (for the template), and one
 * serving engine over the model. Everything a call returns is malloc'd for
 * the caller (ember_free).
 *
 * Threads: the engine's own thread runs all compute. tokenize / detokenize
 * / render only read the handle. A generate call submits one request to the
 * engine and then, on the calling thread, turns the request's token events
 * into text (a textgen of its own: streaming detokenizer and stop strings,
 * src/api/textgen.c, the same code the server uses) and calls on_text. So
 * several threads may generate at once; the engine batches them.
 *
 * ABI: the params and result structs carry a size field (the ABI rule in
 * include/ember.h): read_sized / write_sized touch only the bytes the
 * caller's struct has.
 */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "api/hfcache.h"
#include "api/textgen.h"
#include "core/error.h"
#include "core/util.h"
#include "ember.h"
#include "template/chat.h"
#include "template/load.h"
#include "tok/tokenizer.h"

struct ember_text {
    ember_model *model;
    ember_tokenizer *tok;
    ember_chat_template *tmpl; /* NULL: the model has none */
    char *bos_text, *eos_text; /* "" when the tokenizer has none */
    ember_engine *engine;
};

int ember_version(const char **str) {
    if (str) *str = EMBER_VERSION_STRING;
    return EMBER_VERSION;
}

void ember_free(void *p) {
    free(p);
}

/* Copies the caller's sized struct over dst (already holding the defaults):
   the bytes both versions have. Returns EMBER_ERR_INVALID_ARG when size was
   never set (the caller skipped the init function). */
static int read_sized(void *dst, size_t dst_size, const void *src, size_t src_size, const char *what,
                      ember_error *err) {
    if (src_size < sizeof(size_t) + 1)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: size is %zu: fill it with its init function first", what,
                         src_size);
    size_t n = src_size < dst_size ? src_size : dst_size;
    memcpy((char *)dst + sizeof(size_t), (const char *)src + sizeof(size_t), n - sizeof(size_t));
    return EMBER_OK;
}

/* Writes res (a full, current struct) into the caller's, up to its size. */
static void write_sized(void *dst, const void *src, size_t src_size) {
    size_t dst_size;
    memcpy(&dst_size, dst, sizeof dst_size);
    size_t n = dst_size < src_size ? dst_size : src_size;
    if (n > sizeof(size_t)) memcpy((char *)dst + sizeof(size_t), (const char *)src + sizeof(size_t), n - sizeof(size_t));
}

void ember_text_params_init(ember_text_params *p) {
    memset(p, 0, sizeof *p);
    p->size = sizeof *p;
}

void ember_gen_text_params_init(ember_gen_text_params *g) {
    memset(g, 0, sizeof *g);
    g->size = sizeof *g;
    g->max_tokens = 256;
    g->top_p = 1.0f;
}

void ember_text_result_init(ember_text_result *res) {
    memset(res, 0, sizeof *res);
    res->size = sizeof *res;
    res->stop_index = -1;
}

/* A malloc'd copy of id's text ("" when id < 0 or unknown); NULL on OOM. */
static char *token_text(const ember_tokenizer *tok, int32_t id) {
    size_t n = 0;
    const char *s = id >= 0 ? ember_tok_id_text(tok, id, &n) : NULL;
    return ember_strndup(s ? s : "", s ? n : 0);
}

void ember_text_free(ember_text *t) {
    if (!t) return;
    ember_engine_free(t->engine); /* before the model it drives */
    ember_model_free(t->model);
    ember_chat_template_free(t->tmpl);
    ember_tok_free(t->tok);
    free(t->bos_text);
    free(t->eos_text);
    free(t);
}

/* model as given, or the snapshot of an "org/name" in the HF cache, into
   path. */
static int resolve_path(const char *model, char *path, size_t n, ember_error *err) {
    struct stat st;
    if (stat(model, &st) == 0) {
        if (strlen(model) >= n) return ember_err(err, EMBER_ERR_INVALID_ARG, "model path too long");
        memcpy(path, model, strlen(model) + 1);
        return EMBER_OK;
    }
    if (ember_hf_resolve(model, path, n)) return EMBER_OK;
    char hub[2048];
    ember_hf_hub_dir(hub, sizeof hub);
    return ember_err(err, EMBER_ERR_IO, "model '%s' is not a directory, a file, or a model in the HuggingFace cache (%s)",
                     model, hub);
}

int ember_text_open(const char *model, const ember_text_params *params, ember_text **out, ember_error *err) {
    if (!out) return ember_err(err, EMBER_ERR_INVALID_ARG, "ember_text_open: out is NULL");
    *out = NULL;
    if (!model) return ember_err(err, EMBER_ERR_INVALID_ARG, "ember_text_open: model is NULL");
    ember_text_params p;
    ember_text_params_init(&p);
    int rc;
    if (params && (rc = read_sized(&p, sizeof p, params, params->size, "ember_text_params", err))) return rc;
    char path[4096];
    if ((rc = resolve_path(model, path, sizeof path, err))) return rc;
    ember_text *t = ember_calloc(1, sizeof *t);
    if (!t) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    ember_model_params mp;
    ember_model_params_init(&mp);
    if (p.model) mp = *p.model;
    rc = ember_tok_load(path, &t->tok, err);
    if (!rc) rc = ember_chat_template_load(path, &t->tmpl, NULL, err);
    if (!rc) {
        t->bos_text = token_text(t->tok, ember_tok_bos_id(t->tok));
        t->eos_text = token_text(t->tok, ember_tok_eos_id(t->tok));
        if (!t->bos_text || !t->eos_text) rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    }
    if (!rc) rc = ember_model_load(path, &mp, &t->model, err);
    if (!rc) {
        ember_engine_params ep;
        memset(&ep, 0, sizeof ep);
        ep.max_queue = p.max_queue;
        rc = ember_engine_new(t->model, &ep, &t->engine, err);
    }
    if (rc) {
        ember_text_free(t);
        return rc;
    }
    *out = t;
    return EMBER_OK;
}

const ember_model *ember_text_model(const ember_text *t) {
    return t ? t->model : NULL;
}

int ember_text_has_template(const ember_text *t) {
    return t && t->tmpl ? 1 : 0;
}

int ember_text_tokenize(const ember_text *t, const char *text, size_t len, int add_special, int32_t **ids,
                        size_t *n_ids, ember_error *err) {
    if (!t || (!text && len) || !ids || !n_ids)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "ember_text_tokenize: a NULL argument");
    *ids = NULL;
    *n_ids = 0;
    return ember_tok_encode(t->tok, NULL, text ? text : "", len, add_special ? EMBER_TOK_ADD_SPECIAL : 0, ids, n_ids,
                            err);
}

int ember_text_detokenize(const ember_text *t, const int32_t *ids, size_t n_ids, int skip_special, char **text,
                          size_t *len, ember_error *err) {
    if (!t || (!ids && n_ids) || !text)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "ember_text_detokenize: a NULL argument");
    *text = NULL;
    int32_t nv = ember_tok_n_vocab(t->tok);
    int32_t *known = ember_malloc((n_ids ? n_ids : 1) * sizeof *known);
    if (!known) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    size_t k = 0; /* ids the tokenizer lacks (model padding rows) give no text */
    for (size_t i = 0; i < n_ids; i++)
        if (ids[i] >= 0 && ids[i] < nv) known[k++] = ids[i];
    int rc = ember_tok_decode(t->tok, known, k, skip_special ? EMBER_TOK_SKIP_SPECIAL : 0, text, len, err);
    free(known);
    return rc;
}

/* The template's variables for msgs into *out (the caller decrefs). */
static int chat_vars(const ember_text *t, const ember_message *msgs, int n_msgs, int add_generation_prompt,
                     json_t **out, ember_error *err) {
    *out = NULL;
    json_t *vars = json_object(), *arr = json_array();
    if (!vars || !arr || json_object_set_new(vars, "messages", arr)) {
        json_decref(vars);
        if (!vars) json_decref(arr); /* set_new took arr otherwise, even on failure */
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    }
    if (json_object_set_new(vars, "add_generation_prompt", json_boolean(add_generation_prompt != 0)) ||
        json_object_set_new(vars, "bos_token", json_string(t->bos_text)) ||
        json_object_set_new(vars, "eos_token", json_string(t->eos_text))) {
        json_decref(vars);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < n_msgs; i++) {
        if (!msgs[i].role || !msgs[i].content) {
            json_decref(vars);
            return ember_err(err, EMBER_ERR_INVALID_ARG, "messages[%d]: role and content must not be NULL", i);
        }
        json_t *role = json_string(msgs[i].role), *content = json_string(msgs[i].content);
        if (!role || !content) { /* json_string refuses invalid UTF-8 */
            json_decref(role);
            json_decref(content);
            json_decref(vars);
            return ember_err(err, EMBER_ERR_INVALID_ARG, "messages[%d]: role or content is not valid UTF-8", i);
        }
        json_t *m = json_object();
        if (!m) {
            json_decref(role);
            json_decref(content);
        }
        /* set_new and append_new take their value, also when they fail */
        bool fail = !m || (json_object_set_new(m, "role", role) | json_object_set_new(m, "content", content));
        if (fail) json_decref(m);
        if (fail || json_array_append_new(arr, m)) {
            json_decref(vars);
            return ember_err(err, EMBER_ERR_NOMEM, "messages[%d]: out of memory", i);
        }
    }
    *out = vars;
    return EMBER_OK;
}

int ember_text_render(const ember_text *t, const ember_message *msgs, int n_msgs, int add_generation_prompt,
                      char **text, size_t *len, ember_error *err) {
    if (!t || !text || n_msgs < 0 || (!msgs && n_msgs))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "ember_text_render: a NULL argument or a negative count");
    *text = NULL;
    if (!t->tmpl) return ember_err(err, EMBER_ERR_UNSUPPORTED, "this model has no chat template");
    json_t *vars = NULL;
    int rc = chat_vars(t, msgs, n_msgs, add_generation_prompt, &vars, err);
    if (rc) return rc;
    ember_chat_opts o;
    memset(&o, 0, sizeof o);
    o.extensions = true; /* as the server and the CLI render */
    rc = ember_chat_template_render(t->tmpl, vars, &o, text, len, err);
    json_decref(vars);
    return rc;
}

/* One request's text side: its textgen and the caller's callback. */
typedef struct text_run {
    textgen tg;
    strbuf piece;
    const ember_gen_text_params *g;
    bool cancelled; /* on_text asked to stop */
} text_run;

/* Feeds one token; calls on_text with what it released. */
static int run_token(text_run *r, int32_t id, ember_error *err) {
    r->piece.len = 0;
    int rc = textgen_push(&r->tg, id, &r->piece, err);
    if (!rc && r->piece.len && r->g->on_text && !r->cancelled)
        r->cancelled = r->g->on_text(r->g->user, r->piece.data, r->piece.len) != 0;
    return rc;
}

/* Submits ids and drains the stream into r; fills res. */
static int run_request(ember_text *t, const int32_t *ids, size_t n_ids, const ember_gen_text_params *g, text_run *r,
                       ember_text_result *res, ember_error *err) {
    ember_gen_params gp;
    memset(&gp, 0, sizeof gp);
    gp.prompt = ids;
    gp.n_prompt = (int)n_ids;
    gp.max_tokens = g->max_tokens;
    gp.sampling.temperature = g->temperature;
    gp.sampling.top_k = g->top_k;
    gp.sampling.top_p = g->top_p;
    gp.sampling.min_p = g->min_p;
    gp.sampling.seed = g->seed;
    gp.ignore_eos = g->ignore_eos;
    ember_stream *s = NULL;
    int rc = ember_engine_submit(t->engine, &gp, &s, err);
    if (rc) return rc;
    ember_event ev;
    memset(&ev, 0, sizeof ev);
    bool asked = false; /* cancel sent */
    while (ember_stream_next(s, &ev, -1) == 1 && ev.kind != EMBER_EV_DONE) {
        if (!rc && !r->tg.stopped && !r->cancelled) rc = run_token(r, ev.token, err);
        if (!asked && (rc || r->tg.stopped || r->cancelled)) {
            ember_stream_cancel(s);
            asked = true;
        }
    }
    ember_stream_free(s);
    if (!rc && ev.kind == EMBER_EV_DONE && ev.finish == EMBER_FINISH_ERROR)
        rc = ember_err(err, ev.error_code ? ev.error_code : EMBER_ERR_INTERNAL, "%s", ev.error);
    if (!rc && !r->cancelled) { /* what was held back: text before a stop string, or all of it */
        r->piece.len = 0;
        rc = textgen_finish(&r->tg, &r->piece, err);
        if (!rc && r->piece.len && g->on_text) r->cancelled = g->on_text(g->user, r->piece.data, r->piece.len) != 0;
    }
    if (rc) return rc;
    res->finish = r->tg.stopped ? EMBER_FINISH_STOP : r->cancelled ? EMBER_FINISH_CANCELLED : ev.finish;
    res->stop_index = r->tg.stop_index;
    res->n_prompt = ev.n_prompt ? ev.n_prompt : (int)n_ids;
    res->n_cached = ev.n_cached;
    res->n_generated = ev.n_generated;
    return EMBER_OK;
}

int ember_text_generate_ids(ember_text *t, const int32_t *ids, size_t n_ids, const ember_gen_text_params *g,
                            ember_text_result *res, ember_error *err) {
    if (!t || (!ids && n_ids)) return ember_err(err, EMBER_ERR_INVALID_ARG, "ember_text_generate: a NULL argument");
    if (n_ids == 0) return ember_err(err, EMBER_ERR_INVALID_ARG, "the prompt is empty after tokenization");
    if (n_ids > (size_t)1 << 30) return ember_err(err, EMBER_ERR_LIMIT, "the prompt has too many tokens");
    ember_gen_text_params gp;
    ember_gen_text_params_init(&gp);
    int rc;
    if (g && (rc = read_sized(&gp, sizeof gp, g, g->size, "ember_gen_text_params", err))) return rc;
    if (res && res->size < sizeof(size_t) + 1)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "ember_text_result: size is %zu: call ember_text_result_init first",
                         res->size);
    if (gp.n_stop < 0 || (gp.n_stop && !gp.stop))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "stop: %d strings at %p", gp.n_stop, (const void *)gp.stop);
    char **stops = ember_malloc((size_t)(gp.n_stop ? gp.n_stop : 1) * sizeof *stops);
    if (!stops) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    for (int i = 0; i < gp.n_stop; i++) {
        if (!gp.stop[i] || !gp.stop[i][0]) {
            free(stops);
            return ember_err(err, EMBER_ERR_INVALID_ARG, "stop[%d] is empty", i);
        }
        stops[i] = (char *)gp.stop[i]; /* textgen only reads them */
    }
    text_run r;
    memset(&r, 0, sizeof r);
    r.g = &gp;
    ember_text_result out;
    ember_text_result_init(&out);
    rc = textgen_init(&r.tg, t->tok, stops, gp.n_stop, err);
    if (!rc) rc = run_request(t, ids, n_ids, &gp, &r, &out, err);
    if (!rc && res) { /* the whole text, handed over */
        out.text = r.tg.text.data ? r.tg.text.data : ember_strdup("");
        out.text_len = r.tg.text.len;
        if (!out.text) {
            rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        } else {
            if (out.text == r.tg.text.data) memset(&r.tg.text, 0, sizeof r.tg.text);
            write_sized(res, &out, sizeof out);
            if (res->size < offsetof(ember_text_result, text) + sizeof(char *)) free(out.text); /* an older struct */
        }
    }
    textgen_free(&r.tg);
    sb_free(&r.piece);
    free(stops);
    return rc;
}

int ember_text_generate(ember_text *t, const char *prompt, const ember_gen_text_params *g, ember_text_result *res,
                        ember_error *err) {
    if (!prompt) return ember_err(err, EMBER_ERR_INVALID_ARG, "ember_text_generate: prompt is NULL");
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = ember_text_tokenize(t, prompt, strlen(prompt), 1, &ids, &n, err);
    if (!rc) rc = ember_text_generate_ids(t, ids, n, g, res, err);
    free(ids);
    return rc;
}

int ember_text_chat(ember_text *t, const ember_message *msgs, int n_msgs, const ember_gen_text_params *g,
                    ember_text_result *res, ember_error *err) {
    char *text = NULL;
    size_t len = 0;
    int rc = ember_text_render(t, msgs, n_msgs, 1, &text, &len, err);
    int32_t *ids = NULL;
    size_t n = 0;
    /* the template wrote the special tokens itself */
    if (!rc) rc = ember_text_tokenize(t, text, len, 0, &ids, &n, err);
    free(text);
    if (!rc) rc = ember_text_generate_ids(t, ids, n, g, res, err);
    free(ids);
    return rc;
}
