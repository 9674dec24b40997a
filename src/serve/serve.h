/*
 * serve.h - the HTTP server: OpenAI- and Anthropic-compatible endpoints over
 * one engine (continuous batching) and one tokenizer / chat template.
 *
 * Threads: libmicrohttpd runs one thread per connection; those threads
 * parse and validate requests, render templates, tokenize, submit to the
 * engine and turn its events into responses. They never run model compute.
 * The engine thread (src/engine/sched.c) runs every forward pass.
 *
 * Lifecycle: ember_server_start loads nothing itself: it takes a loaded
 * model and tokenizer (both must outlive the server), starts the engine and
 * the HTTP daemon. ember_server_stop stops accepting connections, lets
 * running requests finish for up to drain_seconds, cancels the rest, and
 * joins everything.
 */
#ifndef EMBER_SERVE_H
#define EMBER_SERVE_H

#include <stddef.h>

#include "core/log.h"
#include "ember.h"
#include "sample/grammar.h"
#include "template/chat.h"
#include "template/toolcall.h"
#include "tok/tokenizer.h"

typedef struct ember_server ember_server;

typedef struct ember_server_opts {
    const char *host;          /* NULL: 127.0.0.1 */
    int port;                  /* 0: 8080 */
    const char *model_id;      /* the id /v1/models reports */
    const char *model_note;    /* optional note in /v1/models (the demo label) */
    int max_queue;             /* waiting requests before 429; 0: 256 */
    size_t max_body;           /* request body limit in bytes; 0: 4 MiB */
    int max_connections;       /* 0: 512 */
    int default_max_tokens;    /* when a request names none; 0: until the context is full */
    const char *prompt_cache_dir; /* the prompt cache's disk tier (ember_engine_params); NULL: none */
    size_t prompt_cache_max;   /* its byte cap; 0: 4 GiB */
    ember_spec_mode spec;      /* speculative decoding's draft source (EMBER_SPEC_NONE: off) */
    int draft_max, draft_min;  /* see ember_engine_params; <= 0: its defaults */
    ember_model *draft_model;  /* EMBER_SPEC_DRAFT: the draft model (the caller frees it after the server) */
    int prefill_chunk;         /* see ember_engine_params; <= 0: its default */
    float prefill_pace;        /* see ember_engine_params: 0 its default, < 0 off */
    ember_tool_format tool_format; /* how the model writes tool calls (EMBER_TOOLS_NONE: tools are
                                      rendered, calls come back as text); see docs/tool-calls.md */
    const char *default_grammar; /* GBNF text (--grammar-file) for requests that carry no constraint of
                                    their own; NULL: none. Checked by ember_server_start (400-style message
                                    in err) and borrowed: it must outlive the server */
    bool test_output;          /* TESTS ONLY: accept "ember_test_output" (a scripted completion whose
                                  tokens replace the sampled ones) so tests can drive tool calls
                                  through random-weight models. Never set it in production. */
    ember_logger log;
} ember_server_opts;

/* Starts serving model m with tokenizer tok and chat template tmpl (may be
   NULL: chat requests are then refused with a clear error). On success
   *out owns the server (ember_server_stop frees it). */
int ember_server_start(ember_model *m, const ember_tokenizer *tok, const ember_chat_template *tmpl,
                       const ember_server_opts *o, ember_server **out, ember_error *err);

/* The port actually bound (useful with port 0 in tests... 0 means 8080 here,
   so tests pick a free port themselves). */
/* The vocabulary of constrained decoding (grammar.h) as the server builds
   it from tok: n_rows logits rows, each token's bytes (byte-level and
   SentencePiece vocabularies mapped back to bytes; special tokens never,
   but the keep[0..n_keep) ids, written as their text), eos[0..n_eos) the
   ids that end the output. `ember generate --grammar-file` uses it too. */
int ember_serve_gvocab_new(const ember_tokenizer *tok, int n_rows, const int32_t *eos, int n_eos,
                           const int32_t *keep, int n_keep, ember_gvocab **out, ember_error *err);

int ember_server_port(const ember_server *s);

/* Graceful stop: refuse new work (503), wait up to drain_seconds for running
   requests, cancel what is left, stop the daemon and free the server. */
void ember_server_stop(ember_server *s, double drain_seconds);

#endif
