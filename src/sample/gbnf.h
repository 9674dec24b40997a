/*
 * gbnf.h - GBNF grammars (the notation of llama.cpp's llama-server) for
 * constrained decoding: a parser that compiles the text into a small
 * program of byte-level rules, and a cache of the matcher's states that
 * grammar.c walks over the vocabulary's trie.
 *
 * Notation accepted: rules `name ::= body` (names of letters, digits, '-'
 * and '_'; the start rule is `root`), alternatives `|`, sequences, groups
 * `( )`, postfix `*` `+` `?` `{m}` `{m,}` `{m,n}`, string literals "..."
 * and classes `[a-z]` / `[^...]` with the escapes \n \r \t \\ \" \[ \] \-
 * \xHH \uHHHH \UHHHHHHHH, `.` (any character), comments from `#` to the end
 * of the line. A rule ends at the end of its line unless a group is open
 * or the next line begins with `|`. Characters are Unicode code points
 * matched as their UTF-8 bytes.
 *
 * Refused with a message naming the line and column: syntax errors,
 * undefined rules, a rule defined twice, a missing root, left recursion
 * (a rule that can begin with itself, directly or through rules that can
 * match the empty string), repetition of something that can match the
 * empty string, rules that can never finish, and grammars past the limits
 * (GB_MAX_*: text, rules, elements, nesting, repetition counts).
 *
 * The matcher's state is a set of stacks of element positions (a
 * nondeterministic pushdown automaton: each stack one way to read the bytes
 * so far). gb_cache interns the states it meets and remembers each
 * state's transition on each byte, so a trie walk mostly looks transitions
 * up. A state whose stacks would grow past GB_MAX_DEPTH or GB_MAX_STACKS
 * refuses the byte that leads to it (the output stays in the grammar).
 */
#ifndef EMBER_SAMPLE_GBNF_H
#define EMBER_SAMPLE_GBNF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

#define GB_MAX_TEXT (1 << 20)   /* bytes of grammar text */
#define GB_MAX_RULES 8192       /* rules, those made for groups and repetitions included */
#define GB_MAX_ELEMS (1 << 18)  /* elements of all rules */
#define GB_MAX_NEST 64          /* groups inside groups */
#define GB_MAX_REPEAT 1000      /* m and n of {m,n} */
#define GB_MAX_DEPTH 256        /* entries of one matcher stack */
#define GB_MAX_STACKS 256       /* stacks of one matcher state */

typedef struct gb_prog gb_prog;

/* Compiles GBNF text[0..len) into *out. Errors: EMBER_ERR_INVALID_ARG
   (the message names the line:column and the problem), EMBER_ERR_LIMIT
   (past a limit, named), EMBER_ERR_NOMEM. */
int gb_compile(const char *text, size_t len, gb_prog **out, ember_error *err);
void gb_prog_free(gb_prog *p);

/* Compiles a regular expression (regex.h's ember_rx_parse: the whole
   output matches it) into *out; what names the field in messages. */
int gb_compile_regex(const char *pattern, const char *what, gb_prog **out, ember_error *err);

/* The fewest bytes of a complete output. */
int gb_prog_min_bytes(const gb_prog *p);

typedef struct gb_cache gb_cache;

/* A cache of p's matcher states (p must outlive it); NULL when out of memory. */
gb_cache *gb_cache_new(const gb_prog *p);
void gb_cache_free(gb_cache *c);

/* The start state's id; -1 when out of memory. */
int gb_cache_start(gb_cache *c);

/* The state after byte b from state sid; -1 when the grammar refuses b
   there (or the state would pass the limits, or memory ran out). */
int gb_cache_next(gb_cache *c, int sid, unsigned char b);

/* Limits the closure steps that new transitions may take from now on
   (< 0: no limit): once spent, gb_cache_next refuses every transition it
   has not made yet (and does not remember the refusal). A mask's walk runs
   under a budget so that no grammar makes one token cost seconds. */
void gb_cache_set_budget(gb_cache *c, long steps);

/* Fewest bytes that complete the output from sid (0 when complete). */
int gb_cache_cost(const gb_cache *c, int sid);

/* Whether the output may end at sid. */
bool gb_cache_done(const gb_cache *c, int sid);

/* Counts the times gb_cache_trim forgot the states (ids of an older
   generation mean nothing). */
unsigned gb_cache_generation(const gb_cache *c);

/* Keeps the cache small: when it holds many states, forgets them all but
   sid. Returns sid's id afterwards (-1 when out of memory). Ids taken
   before a call are invalid after it. */
int gb_cache_trim(gb_cache *c, int sid);

#endif
