/*
 * grammar.h - constrained decoding: a grammar of JSON values (from a JSON
 * schema) and literal text, matched byte by byte, turned into a token mask
 * over a vocabulary.
 *
 * Three objects, each with one owner:
 *   ember_gvocab   the bytes each token id writes, in a trie (built once per
 *                  tokenizer by the caller who knows how tokens decode;
 *                  immutable afterwards, shared by every request and thread);
 *   ember_grammar  a compiled grammar (immutable; built per request from
 *                  pieces: literals, choices between literal heads, JSON
 *                  schemas);
 *   ember_gmatch   one request's position in a grammar (mutable, one thread
 *                  at a time): mask the logits of its next token, accept the
 *                  token chosen.
 * A gmatch borrows its grammar and vocabulary: both must outlive it.
 *
 * The mask is computed by walking the vocabulary's trie depth first with a
 * copy of the matcher's state per trie level: a branch is cut at the first
 * byte the grammar refuses, so the work follows the tokens that can come
 * next, not the vocabulary's size. Inside a free string, and for the
 * tokens that open one, tables the vocabulary makes once replace the walk
 * (nearly every token is allowed there). The mask is a bitset over the ids,
 * written into the logits with AVX-512 masked stores where the CPU has
 * them (EMBER_GRAMMAR_NO_AVX512 in the environment: the SSE2 writer).
 *
 * JSON the grammar writes: objects with the schema's properties only (any
 * order, each at most once, every required one before '}'), arrays within
 * minItems / maxItems, strings within minLength / maxLength (code points),
 * numbers and integers in JSON syntax (at most 24 characters, 15 digits
 * before the point), enum / const values exactly as JSON writes them compactly, booleans, null; between
 * tokens at most 16 white-space characters in a row. anyOf / oneOf / type
 * lists whose branches begin with different characters; $ref to
 * #/$defs/... or #/definitions/..., not recursive. minimum / maximum /
 * exclusiveMinimum / exclusiveMaximum: integers of at most 15 digits,
 * numbers of at most 9 digits before the point and 6 after, no exponent,
 * every prefix able to end within the range. pattern (regex.h): strings of
 * printable ASCII matching it. Everything else that constrains a value
 * (format, multipleOf, ...) is refused naming it.
 *
 * A grammar may instead be a whole GBNF grammar or regular expression
 * (ember_grammar_gbnf / ember_grammar_regex: gbnf.h), matched by a
 * pushdown automaton with cached states over the same trie; the matcher
 * API below is the same for both.
 *
 * A token budget (ember_gmatch_mask_left) steers the output to finish in
 * time: a token is allowed only when the grammar can still be completed,
 * then ended, in the tokens left, counting one token per byte of the
 * shortest completion (every byte a grammar needs has a one-byte token in
 * byte-level vocabularies).
 */
#ifndef EMBER_SAMPLE_GRAMMAR_H
#define EMBER_SAMPLE_GRAMMAR_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef struct ember_gvocab ember_gvocab;

/* A vocabulary of n ids: bytes[i][0..lens[i]) is what id i writes (NULL:
   the id is never allowed), end[i] marks ids that end the output (EOS):
   allowed only where the grammar is complete. Copies what it needs. */
int ember_gvocab_new(int n, const char *const *bytes, const size_t *lens, const bool *end, ember_gvocab **out,
                     ember_error *err);
void ember_gvocab_free(ember_gvocab *v);

typedef struct ember_grammar ember_grammar;

/* An empty grammar under construction; NULL when out of memory. Nodes are
   numbered from 0; the root is set with ember_grammar_set_root. */
ember_grammar *ember_grammar_new(void);
void ember_grammar_free(ember_grammar *g);

/* Node builders: return the node's number, or < 0 with err filled
   (EMBER_ERR_INVALID_ARG names what is not supported; EMBER_ERR_NOMEM). */
int ember_grammar_literal(ember_grammar *g, const char *text, size_t len, ember_error *err);
/* A sequence of nodes, one after the other. */
int ember_grammar_seq(ember_grammar *g, const int *nodes, int n, ember_error *err);
/* One of n literal heads, each followed by its node (-1: nothing). Heads
   followed by a node must not be a prefix of another head. */
int ember_grammar_choice(ember_grammar *g, const char *const *heads, const int *next, int n, ember_error *err);
/* A JSON value matching schema (defs: the document $ref resolves in, may be
   the schema itself). where names the schema in messages ("tools[0].parameters"). */
int ember_grammar_schema(ember_grammar *g, const json_t *schema, const json_t *defs, const char *where,
                         ember_error *err);
/* Raw text (a Qwen3-Coder parameter's value): any valid UTF-8 without '<'
   or control characters other than line breaks and tabs, as long as it
   goes on; what follows it must begin with '<'. */
int ember_grammar_text(ember_grammar *g, ember_error *err);
/* Any JSON object (json_object mode). */
int ember_grammar_any_object(ember_grammar *g, ember_error *err);
int ember_grammar_set_root(ember_grammar *g, int node, ember_error *err);

/* Makes the empty grammar g a GBNF grammar (gbnf.h: llama.cpp's notation,
   start rule `root`) compiled from text[0..len): the whole output must be
   a string of it. Errors name the line and column (EMBER_ERR_INVALID_ARG)
   or the limit passed (EMBER_ERR_LIMIT). No node builder or set_root
   afterwards. */
int ember_grammar_gbnf(ember_grammar *g, const char *text, size_t len, ember_error *err);

/* Makes the empty grammar g a regular expression (regex.h's syntax; the
   whole output must match it: '^' / '$' at its ends change nothing;
   characters: printable ASCII, tab, line feed). what names the field in
   messages ("guided_regex"); unsupported features are named. */
int ember_grammar_regex(ember_grammar *g, const char *pattern, const char *what, ember_error *err);

typedef struct ember_gmatch ember_gmatch;

int ember_gmatch_new(const ember_grammar *g, const ember_gvocab *v, ember_gmatch **out, ember_error *err);
void ember_gmatch_free(ember_gmatch *m);

/* Sets logits[i] = -INFINITY for every id of [0, n) the grammar does not
   allow next (ids beyond the vocabulary too). At least one id stays: when
   the grammar allows nothing the end ids do. Returns the ids left. */
int ember_gmatch_mask(ember_gmatch *m, float *logits, int n);

/* ember_gmatch_mask with a budget: left is how many tokens the output may
   still take, this one included. A token is allowed only when the shortest
   completion after it, in bytes, fits in left - 2 (one token per byte, one
   more for the end); the end ids when the grammar is complete. Starting
   with left > ember_grammar_min_bytes(g), every output completes in time. */
int ember_gmatch_mask_left(ember_gmatch *m, float *logits, int n, int left);

/* The fewest bytes of a complete output of g (its root; 0 without one). */
int ember_grammar_min_bytes(const ember_grammar *g);

/* The fewest bytes that complete the output from m's state. */
int ember_gmatch_min_bytes(const ember_gmatch *m);

/* The token chosen: advances the state. false when the grammar refuses it
   (the state is then unchanged). */
bool ember_gmatch_accept(ember_gmatch *m, int32_t token);

/* Feeds raw bytes (tests); false when refused (state unchanged). */
bool ember_gmatch_feed(ember_gmatch *m, const char *s, size_t n);

/* Whether the output may end here (the grammar is complete). */
bool ember_gmatch_complete(const ember_gmatch *m);

#endif
