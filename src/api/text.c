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
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <time.h>

#include "api/hfcache.h"
#include "api/text_int.h"
#include "api/textgen.h"
#include "core/error.h"
#include "core/jsonutil.h"
#include "core/utf8.h"
#include "core/util.h"
#include "ember.h"
#include "template/chat.h"
#include "template/load.h"
#include "template/toolcall.h"
#include "tok/tokenizer.h"

struct ember_text {
    ember_model *model;
    ember_tokenizer *tok;
    ember_chat_template *tmpl; /* NULL: the model has none */
    ember_tool_format tools;   /* the call format the template shows */
    int32_t keep_ids[8];       /* special tokens spelling its markers: kept in the text the parser reads */
    int n_keep;
    atomic_ulong next_call;    /* tool call ids: a counter under a salt of the open time */
    uint64_t salt;
    int32_t *script; /* TESTS ONLY (text_int.h): tokens the text side sees in place of the sampled ones */
    int n_script;
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

void ember_text_free(ember_text *t) {
    if (!t) return;
    ember_engine_free(t->engine); /* before the model it drives */
    ember_model_free(t->model);
    ember_chat_template_free(t->tmpl);
    ember_tok_free(t->tok);
    free(t->script);
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
    int fmt = EMBER_TOOLS_NONE;
    if (!rc) rc = ember_chat_template_load(path, &t->tmpl, &fmt, err);
    if (!rc) {
        t->tools = (ember_tool_format)fmt;
        t->n_keep = ember_tool_format_marker_ids(t->tools, t->tok, t->keep_ids, 8);
        t->salt = ember_mix64((uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)t);
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

/* ---- conversations: messages into the template's variables ---- */

void ember_chat_params_init(ember_chat_params *p) {
    memset(p, 0, sizeof *p);
    p->size = sizeof *p;
    p->add_generation_prompt = 1;
    p->parse_tool_calls = 1;
}

const char *ember_text_tool_format(const ember_text *t) {
    return ember_tool_format_name(t ? t->tools : EMBER_TOOLS_NONE);
}

/* JSON text (len bytes) that must be a value of type want, into *out. */
static int parse_json(const char *text, size_t len, json_type want, const char *what, json_t **out, ember_error *err) {
    json_error_t je;
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    *out = NULL;
    if (!j && json_error_code(&je) == json_error_out_of_memory) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    if (!j) return ember_err(err, EMBER_ERR_INVALID_ARG, "%s is not JSON: %s (column %d)", what, je.text, je.column);
    if (json_typeof(j) != want) {
        int rc = ember_err(err, EMBER_ERR_INVALID_ARG, "%s must be %s, not %s", what,
                           want == JSON_ARRAY ? "an array" : "an object", ember_json_type(j));
        json_decref(j);
        return rc;
    }
    *out = j;
    return EMBER_OK;
}

/* Sets m[key] to the string v (NULL: nothing). */
static int set_str(json_t *m, const char *key, const char *v, int i, ember_error *err) {
    if (!v) return EMBER_OK;
    size_t n = strlen(v);
    if (!ember_utf8_valid(v, n)) return ember_err(err, EMBER_ERR_INVALID_ARG, "messages[%d].%s is not valid UTF-8", i, key);
    if (json_object_set_new(m, key, json_stringn_nocheck(v, n)))
        return ember_err(err, EMBER_ERR_NOMEM, "messages[%d]: out of memory", i);
    return EMBER_OK;
}

/* One call of an assistant message as HF transformers passes it: its
   arguments an object (parsed when given as text). */
static int shape_call(json_t *c, int i, size_t k, ember_error *err) {
    json_t *fn = json_object_get(c, "function");
    if (!json_is_object(c) || !json_is_object(fn) || !json_is_string(json_object_get(fn, "name")))
        return ember_err(err, EMBER_ERR_INVALID_ARG,
                         "messages[%d].tool_calls[%zu] must be {\"function\": {\"name\": ..., \"arguments\": ...}}", i, k);
    json_t *args = json_object_get(fn, "arguments");
    if (json_is_object(args)) return EMBER_OK;
    if (args && !json_is_string(args))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "messages[%d].tool_calls[%zu].function.arguments must be an object or its JSON text", i, k);
    json_t *parsed = NULL;
    char what[96];
    snprintf(what, sizeof what, "messages[%d].tool_calls[%zu].function.arguments", i, k);
    int rc = args ? parse_json(json_string_value(args), json_string_length(args), JSON_OBJECT, what, &parsed, err)
                  : ((parsed = json_object()) ? EMBER_OK : ember_err(err, EMBER_ERR_NOMEM, "out of memory"));
    if (!rc && json_object_set_new(fn, "arguments", parsed)) rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    return rc;
}

/* msg.tool_calls (JSON text) into m["tool_calls"]. */
static int set_calls(json_t *m, const char *text, int i, ember_error *err) {
    char what[48];
    snprintf(what, sizeof what, "messages[%d].tool_calls", i);
    json_t *calls;
    int rc = parse_json(text, strlen(text), JSON_ARRAY, what, &calls, err);
    size_t k;
    json_t *c;
    if (!rc) json_array_foreach(calls, k, c) if ((rc = shape_call(c, i, k, err))) break;
    if (rc) {
        json_decref(calls);
        return rc;
    }
    if (json_object_set_new(m, "tool_calls", calls)) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    return EMBER_OK;
}

/* One message as the template sees it, into *out. */
static int message_json(const ember_chat_message *cm, int i, json_t **out, ember_error *err) {
    *out = NULL;
    if (!cm->role) return ember_err(err, EMBER_ERR_INVALID_ARG, "messages[%d]: role is NULL", i);
    if (!cm->content && !cm->tool_calls)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "messages[%d]: content is NULL (only tool_calls may stand without)", i);
    if (cm->tool_calls && strcmp(cm->role, "assistant"))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "messages[%d]: only assistant messages carry tool_calls", i);
    json_t *m = NULL;
    int rc = EMBER_OK;
    char what[40];
    snprintf(what, sizeof what, "messages[%d].extra", i);
    if (cm->extra) rc = parse_json(cm->extra, strlen(cm->extra), JSON_OBJECT, what, &m, err);
    else if (!(m = json_object())) rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    if (!rc) rc = set_str(m, "role", cm->role, i, err);
    if (!rc && !cm->content && json_object_set_new(m, "content", json_null()))
        rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    if (!rc) rc = set_str(m, "content", cm->content, i, err);
    if (!rc && cm->tool_calls) rc = set_calls(m, cm->tool_calls, i, err);
    if (!rc) rc = set_str(m, "tool_call_id", cm->tool_call_id, i, err);
    if (!rc) rc = set_str(m, "name", cm->name, i, err);
    if (rc) {
        json_decref(m);
        return rc;
    }
    *out = m;
    return EMBER_OK;
}

/* A conversation as the template's inputs. */
typedef struct conv {
    json_t *msgs;   /* the messages array */
    json_t *tools;  /* NULL: none */
    json_t *kwargs; /* NULL: none */
    ember_chat_params p;
} conv;

static void conv_free(conv *c) {
    json_decref(c->msgs);
    json_decref(c->tools);
    json_decref(c->kwargs);
}

/* The tools JSON text: an array of {"type": "function", "function": {"name", ...}}. */
static int parse_tools(const char *text, json_t **out, ember_error *err) {
    int rc = parse_json(text, strlen(text), JSON_ARRAY, "tools", out, err);
    size_t k;
    json_t *tl;
    if (!rc) json_array_foreach(*out, k, tl) {
            json_t *fn = json_object_get(tl, "function");
            if (!json_is_object(fn) || !json_is_string(json_object_get(fn, "name"))) {
                rc = ember_err(err, EMBER_ERR_INVALID_ARG, "tools[%zu] must be {\"type\": \"function\", \"function\": {\"name\": ...}}", k);
                break;
            }
        }
    if (rc || json_array_size(*out) == 0) {
        json_decref(*out);
        *out = NULL;
    }
    return rc;
}

/* Fills c from plain or full messages (one of them) and p (may be NULL). */
static int conv_make(const ember_message *plain, const ember_chat_message *full, int n, const ember_chat_params *p,
                     conv *c, ember_error *err) {
    memset(c, 0, sizeof *c);
    ember_chat_params_init(&c->p);
    int rc = p ? read_sized(&c->p, sizeof c->p, p, p->size, "ember_chat_params", err) : EMBER_OK;
    if (!rc && c->p.tools) rc = parse_tools(c->p.tools, &c->tools, err);
    if (!rc && c->p.template_kwargs)
        rc = parse_json(c->p.template_kwargs, strlen(c->p.template_kwargs), JSON_OBJECT, "template_kwargs", &c->kwargs, err);
    if (!rc && !(c->msgs = json_array())) rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n && !rc; i++) {
        ember_chat_message one = {0};
        if (plain) {
            if (!plain[i].role || !plain[i].content) {
                rc = ember_err(err, EMBER_ERR_INVALID_ARG, "messages[%d]: role and content must not be NULL", i);
                break;
            }
            one.role = plain[i].role;
            one.content = plain[i].content;
        }
        json_t *m;
        rc = message_json(plain ? &one : &full[i], i, &m, err);
        if (!rc && json_array_append_new(c->msgs, m)) rc = ember_err(err, EMBER_ERR_NOMEM, "messages[%d]: out of memory", i);
    }
    if (rc) conv_free(c);
    return rc;
}

static int render_conv(const ember_text *t, const conv *c, bool add_generation_prompt, char **text, size_t *len,
                       ember_error *err) {
    ember_chat_input in = {.messages = c->msgs, .tools = c->tools, .kwargs = c->kwargs,
                           .add_generation_prompt = add_generation_prompt, .tok = t->tok};
    return ember_chat_render_input(t->tmpl, &in, text, len, err);
}

/* The checks every render and chat makes first. */
static int conv_args(const ember_text *t, const void *msgs, int n_msgs, const char *fn, ember_error *err) {
    if (!t || n_msgs < 0 || (!msgs && n_msgs))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: a NULL argument or a negative count", fn);
    if (!t->tmpl) return ember_err(err, EMBER_ERR_UNSUPPORTED, "this model has no chat template");
    return EMBER_OK;
}

int ember_text_render(const ember_text *t, const ember_message *msgs, int n_msgs, int add_generation_prompt,
                      char **text, size_t *len, ember_error *err) {
    if (!text) return ember_err(err, EMBER_ERR_INVALID_ARG, "ember_text_render: text is NULL");
    *text = NULL;
    if (len) *len = 0;
    conv c;
    int rc = conv_args(t, msgs, n_msgs, "ember_text_render", err);
    if (!rc) rc = conv_make(msgs, NULL, n_msgs, NULL, &c, err);
    if (rc) return rc;
    rc = render_conv(t, &c, add_generation_prompt != 0, text, len, err);
    conv_free(&c);
    return rc;
}

int ember_text_render_messages(const ember_text *t, const ember_chat_message *msgs, int n_msgs,
                               const ember_chat_params *p, char **text, size_t *len, ember_error *err) {
    if (!text) return ember_err(err, EMBER_ERR_INVALID_ARG, "ember_text_render_messages: text is NULL");
    *text = NULL;
    if (len) *len = 0;
    conv c;
    int rc = conv_args(t, msgs, n_msgs, "ember_text_render_messages", err);
    if (!rc) rc = conv_make(NULL, msgs, n_msgs, p, &c, err);
    if (rc) return rc;
    rc = render_conv(t, &c, c.p.add_generation_prompt != 0, text, len, err);
    conv_free(&c);
    return rc;
}

/* ---- generation ---- */

/* One request's text side: its textgen, the tool-call parser, and the
   caller's callback. */
typedef struct text_run {
    ember_text *t;
    textgen tg;
    strbuf piece;
    const ember_gen_text_params *g;
    bool cancelled;        /* on_text asked to stop */
    ember_tool_parser *tp; /* NULL: no calls parsed */
    strbuf content;        /* with tp: the text outside calls */
    strbuf args;           /* the current call's arguments */
    json_t *calls;         /* with tp: OpenAI tool_calls, as reported */
    bool oom;              /* the tool sink ran out of memory */
} text_run;

static void say(text_run *r, const char *s, size_t n) {
    if (n && r->g->on_text && !r->cancelled) r->cancelled = r->g->on_text(r->g->user, s, n) != 0;
}

/* The parser's events: content goes on as text, calls into r->calls. */
static int tool_sink(void *user, const ember_tool_event *ev) {
    text_run *r = user;
    bool ok = true;
    switch (ev->kind) {
    case EMBER_TOOL_EV_CONTENT:
        ok = !sb_append(&r->content, ev->text, ev->len);
        if (ok) say(r, ev->text, ev->len);
        break;
    case EMBER_TOOL_EV_CALL_START: {
        char id[48];
        ember_tool_call_id(r->t->tools, "call_", atomic_fetch_add(&r->t->next_call, 1), r->t->salt, r->t->salt, id,
                           sizeof id);
        r->args.len = 0;
        json_t *c = json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function", "name", ev->name,
                              "arguments", "");
        ok = c && !json_array_append_new(r->calls, c);
        break;
    }
    case EMBER_TOOL_EV_CALL_ARGS: ok = !sb_append(&r->args, ev->text, ev->len); break;
    case EMBER_TOOL_EV_CALL_END: {
        json_t *fn = json_object_get(json_array_get(r->calls, json_array_size(r->calls) - 1), "function");
        ok = !json_object_set_new(fn, "arguments", ember_json_string_clean(r->args.data ? r->args.data : "", r->args.len));
        break;
    }
    }
    r->oom |= !ok;
    return ok ? 0 : -1;
}

/* Passes released text on: through the parser with tools, else to on_text.
   final: the text ended. */
static int emit(text_run *r, const char *s, size_t n, bool final, ember_error *err) {
    if (!r->tp) {
        say(r, s, n);
        return EMBER_OK;
    }
    int rc = n ? ember_tool_parser_feed(r->tp, s, n, tool_sink, r, err) : EMBER_OK;
    if (!rc && final) rc = ember_tool_parser_finish(r->tp, tool_sink, r, err);
    if (rc && r->oom) rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    return rc;
}

/* Feeds one token; passes on what it released. */
static int run_token(text_run *r, int32_t id, ember_error *err) {
    r->piece.len = 0;
    int rc = textgen_push(&r->tg, id, &r->piece, err);
    if (!rc && r->piece.len && !r->cancelled) rc = emit(r, r->piece.data, r->piece.len, false, err);
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
    if (t->script) { /* test hook: the script is the text, its end the end of the turn */
        gp.max_tokens = gp.max_tokens < t->n_script ? gp.max_tokens : t->n_script;
        gp.ignore_eos = 1;
    }
    ember_stream *s = NULL;
    int rc = ember_engine_submit(t->engine, &gp, &s, err);
    if (rc) return rc;
    ember_event ev;
    memset(&ev, 0, sizeof ev);
    bool asked = false; /* cancel sent */
    for (int k = 0; ember_stream_next(s, &ev, -1) == 1 && ev.kind != EMBER_EV_DONE; k++) {
        int32_t tok = t->script && k < t->n_script ? t->script[k] : ev.token;
        if (!rc && !r->tg.stopped && !r->cancelled) rc = run_token(r, tok, err);
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
        if (!rc) rc = emit(r, r->piece.data, r->piece.len, true, err);
    }
    if (rc) return rc;
    res->finish = r->tg.stopped ? EMBER_FINISH_STOP : r->cancelled ? EMBER_FINISH_CANCELLED : ev.finish;
    res->stop_index = r->tg.stop_index;
    res->n_prompt = ev.n_prompt ? ev.n_prompt : (int)n_ids;
    res->n_cached = ev.n_cached;
    res->n_generated = ev.n_generated;
    return EMBER_OK;
}

/* Moves the run's text and calls into out (a full, current struct). */
static int take_result(text_run *r, ember_text_result *out, ember_error *err) {
    strbuf *text = r->tp ? &r->content : &r->tg.text;
    out->text = text->data ? text->data : ember_strdup("");
    if (!out->text) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    out->text_len = text->len;
    if (out->text == text->data) memset(text, 0, sizeof *text);
    size_t nc = json_array_size(r->calls);
    if (nc) {
        out->tool_calls = json_dumps(r->calls, JSON_COMPACT);
        if (!out->tool_calls) {
            free(out->text);
            out->text = NULL;
            return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        }
        out->n_tool_calls = (int)nc;
    }
    return EMBER_OK;
}

/* Writes out into the caller's res, up to its size; frees what an older
   struct has no room for. */
static void give_result(ember_text_result *res, ember_text_result *out) {
    write_sized(res, out, sizeof *out);
    if (res->size < offsetof(ember_text_result, text) + sizeof(char *)) free(out->text);
    if (res->size < offsetof(ember_text_result, tool_calls) + sizeof(char *)) free(out->tool_calls);
}

/* Generation after ids; with tools (borrowed, non-NULL: parse calls in
   t's format) the calls go to res->tool_calls. */
static int generate(ember_text *t, const int32_t *ids, size_t n_ids, const ember_gen_text_params *g,
                    const json_t *tools, ember_text_result *res, ember_error *err) {
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
    for (int i = 0; i < gp.n_stop; i++)
        if (!gp.stop[i] || !gp.stop[i][0]) return ember_err(err, EMBER_ERR_INVALID_ARG, "stop[%d] is empty", i);
    text_run r;
    memset(&r, 0, sizeof r);
    r.t = t;
    r.g = &gp;
    ember_text_result out;
    ember_text_result_init(&out);
    /* textgen only reads the stop strings */
    rc = textgen_init(&r.tg, t->tok, (char **)(uintptr_t)gp.stop, gp.n_stop, err);
    if (!rc && tools && t->tools != EMBER_TOOLS_NONE) {
        r.tp = ember_tool_parser_new(t->tools, tools);
        r.calls = json_array();
        if (!r.tp || !r.calls) rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        textgen_keep(&r.tg, t->keep_ids, t->n_keep);
    }
    if (!rc) rc = run_request(t, ids, n_ids, &gp, &r, &out, err);
    if (!rc && res) rc = take_result(&r, &out, err);
    if (!rc && res) give_result(res, &out);
    textgen_free(&r.tg);
    sb_free(&r.piece);
    ember_tool_parser_free(r.tp);
    sb_free(&r.content);
    sb_free(&r.args);
    json_decref(r.calls);
    return rc;
}

int ember_text_generate_ids(ember_text *t, const int32_t *ids, size_t n_ids, const ember_gen_text_params *g,
                            ember_text_result *res, ember_error *err) {
    return generate(t, ids, n_ids, g, NULL, res, err);
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

/* Renders c with the generation prompt, tokenizes it as the template wrote
   it (its special tokens included), and generates. */
static int chat_conv(ember_text *t, const conv *c, const ember_gen_text_params *g, ember_text_result *res,
                     ember_error *err) {
    char *text = NULL;
    size_t len = 0;
    int rc = render_conv(t, c, true, &text, &len, err);
    int32_t *ids = NULL;
    size_t n = 0;
    if (!rc) rc = ember_text_tokenize(t, text, len, 0, &ids, &n, err);
    free(text);
    const json_t *tools = c->p.parse_tool_calls ? c->tools : NULL;
    if (!rc) rc = generate(t, ids, n, g, tools, res, err);
    free(ids);
    return rc;
}

int ember_text_chat(ember_text *t, const ember_message *msgs, int n_msgs, const ember_gen_text_params *g,
                    ember_text_result *res, ember_error *err) {
    conv c;
    int rc = conv_args(t, msgs, n_msgs, "ember_text_chat", err);
    if (!rc) rc = conv_make(msgs, NULL, n_msgs, NULL, &c, err);
    if (rc) return rc;
    rc = chat_conv(t, &c, g, res, err);
    conv_free(&c);
    return rc;
}

int ember_text_chat_messages(ember_text *t, const ember_chat_message *msgs, int n_msgs, const ember_chat_params *p,
                             const ember_gen_text_params *g, ember_text_result *res, ember_error *err) {
    conv c;
    int rc = conv_args(t, msgs, n_msgs, "ember_text_chat_messages", err);
    if (!rc) rc = conv_make(NULL, msgs, n_msgs, p, &c, err);
    if (rc) return rc;
    rc = chat_conv(t, &c, g, res, err);
    conv_free(&c);
    return rc;
}

int ember_text_script(ember_text *t, const char *text, ember_error *err) {
    free(t->script);
    t->script = NULL;
    t->n_script = 0;
    if (!text) return EMBER_OK;
    size_t n = 0;
    int rc = ember_tok_encode(t->tok, NULL, text, strlen(text), 0, &t->script, &n, err);
    if (!rc && (n == 0 || n > (1u << 20))) rc = ember_err(err, EMBER_ERR_INVALID_ARG, "script: %zu tokens", n);
    if (rc) {
        free(t->script);
        t->script = NULL;
        return rc;
    }
    t->n_script = (int)n;
    return EMBER_OK;
}
