/*
 * serve_int.h - what the server's source files share (not installed, not
 * part of libember): a validation failure (an HTTP status, the offending
 * field and a message), text made JSON-safe, and the Responses API's pieces
 * (src/serve/responses.c): translating a /v1/responses body to the chat
 * machinery's shape, building the response object and its stream of typed
 * events, and the in-memory store behind previous_response_id.
 *
 * Threads: every function here runs on a connection's thread; only the
 * store is shared between connections (it locks itself).
 */
#ifndef EMBER_SERVE_INT_H
#define EMBER_SERVE_INT_H

#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "api/textgen.h"
#include "core/jsonutil.h"

/* A request that cannot be served: the status, the field at fault (OpenAI's
   error.param; empty for none) and the message. */
typedef struct bad {
    unsigned code;
    char param[64];
    char msg[400];
} bad;

/* Records a failure in b; always returns -1 so that callers write
   `return fail(b, 400, "field", "...")`. */
static inline int fail(bad *b, unsigned code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static inline int fail(bad *b, unsigned code, const char *param, const char *fmt, ...) {
    b->code = code;
    snprintf(b->param, sizeof b->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->msg, sizeof b->msg, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- the Responses API (responses.c) ---------------------------------------------------------- */

/* A /v1/responses body translated for the chat machinery. */
typedef struct resp_req {
    json_t *view;     /* {"messages", "tools", "tool_choice", "parallel_tool_calls", "response_format"} in the
                         chat-completions shape, for the chat request's own validation */
    json_t *convo;    /* the conversation without the instructions: the stored history, then the input as chat
                         messages (what a later previous_response_id continues) */
    json_t *response; /* the response object's echo of the request (status in_progress, output empty); the
                         caller sets id, created_at and model */
    size_t n_history; /* the messages of convo that came from previous_response_id */
    bool store;       /* keep the finished response for previous_response_id */
} resp_req;

/* Translates and validates body (a JSON object) into *out. history is the
   conversation previous_response_id names (chat messages; NULL for none).
   Fields that do not exist in chat requests are checked here; the chat
   request's own validation (tools, schemas, sampling) runs later on
   out->view and body. On failure *b says why and *out holds nothing. */
int resp_translate(const json_t *body, const json_t *history, resp_req *out, bad *b);

/* Frees what *q holds and zeroes it. */
void resp_req_free(resp_req *q);

/* Receives one stream event (consumed, never NULL) of the given type;
   returns non-zero when it cannot be written. */
typedef int (*resp_emit_fn)(void *user, const char *type, json_t *ev);

/* A response being built: the output items as the text and calls arrive,
   and (when streaming) the typed events that describe them. */
typedef struct resp_out {
    json_t *resp;       /* the response object (owned) */
    resp_emit_fn emit;  /* NULL: not streaming */
    void *user;
    long seq;           /* the next event's sequence_number */
    strbuf text;        /* the open message's text */
    strbuf args;        /* the open call's arguments */
    bool msg_open, call_open;
    json_t *item;       /* the open item (owned) */
    bool failed;        /* an event or item could not be made (no memory) */
} resp_out;

/* Starts *o on the response object resp (consumed; from resp_translate).
   With emit, sends response.created and response.in_progress. */
void resp_out_start(resp_out *o, json_t *resp, resp_emit_fn emit, void *user);

/* Text of the answer (outside any call): opens a message item when none is
   open. */
void resp_out_text(resp_out *o, const char *text, size_t len);

/* A function call begins (closing an open message), its arguments arrive
   in pieces, and it ends. */
void resp_out_call_start(resp_out *o, const char *call_id, const char *name);
void resp_out_call_args(resp_out *o, const char *text, size_t len);
void resp_out_call_end(resp_out *o);

/* The end: closes what is open (an answer with no item at all gets one
   empty message), sets status ("completed", or "incomplete" with
   incomplete_details.reason = reason when reason is not NULL) and usage
   (consumed), and sends response.completed / response.incomplete. */
void resp_out_finish(resp_out *o, const char *reason, json_t *usage);

/* A failure after the stream began: an `error` event, then response.failed
   with the response's error set. */
void resp_out_fail(resp_out *o, const char *message);

/* The assistant's turn as one chat message (text joined, function calls as
   tool_calls), for the store; NULL when out of memory. */
json_t *resp_out_message(const resp_out *o);

void resp_out_free(resp_out *o);

/* The conversations and response objects of finished responses, by id, for
   previous_response_id and GET / DELETE /v1/responses/{id}: in memory for
   the server's lifetime, the oldest dropped beyond
   RESP_STORE_MAX entries or RESP_STORE_BYTES bytes (estimated). */
#define RESP_STORE_MAX 1024
#define RESP_STORE_BYTES ((size_t)256 << 20)

typedef struct resp_entry resp_entry;

typedef struct resp_store {
    pthread_mutex_t mu;
    resp_entry *head, *tail; /* oldest first */
    int n;
    size_t bytes;
} resp_store;

void resp_store_init(resp_store *st);
void resp_store_free(resp_store *st);

/* Keeps convo (a chat message array, referenced, not copied: nobody changes
   it after) and a copy of the final response object under id, with bytes
   (plus the response's size) as its estimated size. Returns non-zero when
   out of memory (nothing is kept). */
int resp_store_put(resp_store *st, const char *id, json_t *convo, const json_t *response, size_t bytes);

/* The conversation (response false) or the response object (true) stored
   under id, as a new reference (the caller decrefs; nobody changes it), or
   NULL. */
json_t *resp_store_get(resp_store *st, const char *id, bool response);

/* Drops what is stored under id; false when nothing is. */
bool resp_store_delete(resp_store *st, const char *id);

/* The GBNF grammar (malloc'd text in *out) of one enforced call in Gemma 4's
   format, <|tool_call>call:NAME{...}<tool_call|>, of one of tools (OpenAI
   shape) or of the one named: each tool's parameters schema written in
   Gemma's value syntax (gemma_grammar.c). Returns 0; -1 with why naming
   what cannot be enforced; -2 out of memory. */
int gemma_call_gbnf(const json_t *tools, const char *named, char **out, char *why, size_t why_len);

#endif
