/*
 * toolcall.h - tool calls written by a model, parsed out of its generated
 * text, one format per model family (internal header of src/template/).
 *
 * Who owns what: this part knows the text formats only (the markers a family
 * writes around a call, how the name and arguments are spelled). It knows
 * nothing of HTTP or of the OpenAI / Anthropic shapes: src/serve/ turns the
 * events below into each protocol's tool_calls / tool_use blocks, makes the
 * call ids, and decides which tokens reach the text.
 *
 * The parser is streaming: it is fed the generated text in pieces of any
 * size and reports events through a callback:
 *   CONTENT     plain text for the user (never part of a call);
 *   CALL_START  a call begins: its index (0, 1, ...) and function name;
 *   CALL_ARGS   a piece of the call's arguments, JSON text of an object;
 *   CALL_END    the call is complete.
 * Text that may be the start of a call marker is held back until it is
 * decided. Calls whose name comes before their arguments object (Hermes'
 * and Llama 3's {"name": "f", "arguments": {..}}, Mistral's
 * NAME[ARGS]{..}) stream: once the head is complete and the arguments
 * object has begun the call is committed (CALL_START), and each byte of the
 * arguments is reported (CALL_ARGS pieces) as soon as an incremental JSON
 * check accepts it; a committed call that breaks or is cut off ends there
 * with what it has (its arguments then are not a complete JSON object) and
 * the rest is text again. Other calls (other shapes, Qwen3-Coder, Gemma 4,
 * Mistral's JSON list) are reported once complete and well formed, their
 * arguments in one piece; a malformed or cut-off one is reported as CONTENT,
 * markers included. Every decision depends only on the bytes seen, so the
 * events join into the same result however the text is split into pieces:
 * streamed events join into exactly the one-piece result.
 *
 * Arguments are the model's own JSON text of the arguments object (no
 * re-serialization, so numbers keep their spelling), except for the formats
 * whose arguments are not JSON (Qwen3-Coder XML parameters, Gemma 4's
 * key:value syntax), which are converted to compact JSON.
 */
#ifndef EMBER_TEMPLATE_TOOLCALL_H
#define EMBER_TEMPLATE_TOOLCALL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef enum ember_tool_format {
    EMBER_TOOLS_NONE = 0, /* no parsing: everything is content */
    EMBER_TOOLS_HERMES,   /* Qwen 2.5/3, Hermes: <tool_call>{"name":..,"arguments":{..}}</tool_call> */
    EMBER_TOOLS_QWEN3_CODER, /* <tool_call><function=NAME><parameter=P>v</parameter></function></tool_call> */
    EMBER_TOOLS_LLAMA3,   /* Llama 3.x: {"name":..,"parameters":{..}} at the start, maybe after <|python_tag|> */
    EMBER_TOOLS_MISTRAL,  /* [TOOL_CALLS][{..},..] or [TOOL_CALLS]NAME[CALL_ID]id[ARGS]{..} */
    EMBER_TOOLS_GEMMA4,   /* <|tool_call>call:NAME{key:value,..}<tool_call|> */
} ember_tool_format;

/* The format's name as --tool-parser spells it ("none", "hermes",
   "qwen3_coder", "llama3_json", "mistral", "gemma4"); a static string. */
const char *ember_tool_format_name(ember_tool_format f);

/* Parses a --tool-parser name. Returns true and sets *out when known. */
bool ember_tool_format_from_name(const char *name, ember_tool_format *out);

/* A comma-separated list of every name, for help and error messages. */
const char *ember_tool_format_names(void);

/* The format a chat template's text asks for, from the markers it writes
   (EMBER_TOOLS_NONE when it shows none). text may be NULL. */
ember_tool_format ember_tool_format_detect(const char *text, size_t len);

/* The marker strings of format f (NULL-terminated static array): a serving
   layer keeps the tokens spelled exactly so in the text it feeds the parser,
   even when they are special tokens it would otherwise drop. */
const char *const *ember_tool_format_markers(ember_tool_format f);

struct ember_tokenizer;

/* The ids of tok's special tokens that spell f's markers (at most max, into
   ids); returns how many. A serving layer keeps their text in what it feeds
   the parser (textgen_keep), where other special tokens are dropped. */
int ember_tool_format_marker_ids(ember_tool_format f, const struct ember_tokenizer *tok, int32_t *ids, int max);

/* A call id into out (n >= 32 bytes): prefix ("call_", "toolu_") and 24
   hex digits mixed from k (a counter the caller never repeats) and salt.
   With Mistral's format 9 letters and digits instead (its templates refuse
   any other id when the call is fed back), unique for 62^9 values of k
   under one salt9. */
void ember_tool_call_id(ember_tool_format f, const char *prefix, uint64_t k, uint64_t salt, uint64_t salt9, char *out,
                        size_t n);

typedef enum ember_tool_event_kind {
    EMBER_TOOL_EV_CONTENT = 1,
    EMBER_TOOL_EV_CALL_START,
    EMBER_TOOL_EV_CALL_ARGS,
    EMBER_TOOL_EV_CALL_END,
} ember_tool_event_kind;

typedef struct ember_tool_event {
    ember_tool_event_kind kind;
    int index;        /* the call's index (calls only) */
    const char *name; /* CALL_START: the function name, NUL-terminated */
    const char *text; /* CONTENT / CALL_ARGS: the piece (not NUL-terminated) */
    size_t len;
} ember_tool_event;

/* Receives one event; the pointers are valid only during the call. Returns
   0 to go on, anything else to stop: the parser returns EMBER_ERR_INTERNAL
   ("stopped by the sink") and is then unusable. */
typedef int (*ember_tool_sink)(void *user, const ember_tool_event *ev);

typedef struct ember_tool_parser ember_tool_parser;

/* A parser for format f. tools (borrowed, may be NULL; must live as long as
   the parser) is the request's OpenAI-shaped tools array: the Qwen3-Coder
   format reads the parameters' JSON schema types from it to tell strings
   from numbers. Returns NULL when out of memory. Free with
   ember_tool_parser_free. */
ember_tool_parser *ember_tool_parser_new(ember_tool_format f, const json_t *tools);

void ember_tool_parser_free(ember_tool_parser *p);

/* Feeds text[0..len) (any split; UTF-8 pieces may be cut anywhere) and
   reports what is decided. Returns EMBER_OK, EMBER_ERR_NOMEM, or
   EMBER_ERR_INTERNAL when the sink stopped it; also EMBER_ERR_INVALID_ARG
   after finish. */
int ember_tool_parser_feed(ember_tool_parser *p, const char *text, size_t len, ember_tool_sink sink, void *user,
                           ember_error *err);

/* The text ended: decides what was held back (an unfinished call becomes
   CONTENT) and reports it. Further feeds are refused. Same returns as feed. */
int ember_tool_parser_finish(ember_tool_parser *p, ember_tool_sink sink, void *user, ember_error *err);

/* The number of calls reported so far. */
int ember_tool_parser_calls(const ember_tool_parser *p);

#endif
