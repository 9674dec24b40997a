/*
 * regex.h - the regular subset of JSON Schema's `pattern` (ECMAScript
 * syntax) as a small position automaton, for constrained decoding.
 *
 * The pattern is compiled into a Glushkov automaton: one position per
 * character class of the pattern (at most EMBER_RX_MAX, repetitions
 * {m,n} expanded), no epsilon moves. A matcher's state is the set of
 * positions it may be at, a 64-bit mask (bit 0: nothing read yet), so a
 * grammar frame carries it in one word. Characters are printable ASCII
 * without '"' and '\' (what a JSON string holds without an escape); a class
 * outside that alphabet is refused. A pattern without '^' may begin
 * anywhere, one without '$' may end anywhere (ECMAScript search semantics):
 * they get an implicit `.*` on that side.
 *
 * Supported: literals, '.', classes [...] (ranges, negation, \d \w \s
 * inside), \d \D \w \W \s \S, escaped punctuation, \xHH / \uHHHH (ASCII),
 * groups (...) and (?:...), '|', quantifiers * + ? {n} {n,} {n,m} (lazy
 * forms too: same language), '^' at the start and '$' at the end.
 * Refused (named in the message): lookaround, backreferences, \b, anchors
 * elsewhere or together with a top-level '|', characters outside the
 * alphabet, more than EMBER_RX_MAX positions.
 */
#ifndef EMBER_SAMPLE_REGEX_H
#define EMBER_SAMPLE_REGEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EMBER_RX_MAX 63

typedef struct ember_rx {
    int n;                          /* positions 1..n */
    uint64_t cls[EMBER_RX_MAX + 1][2]; /* bytes 0..127 each position matches */
    uint64_t follow[EMBER_RX_MAX + 1]; /* follow[0]: the first positions */
    uint64_t last;                  /* positions where a match may end; bit 0: the empty string matches */
    uint8_t dist[EMBER_RX_MAX + 1]; /* fewest characters from a position to an end */
} ember_rx;

/* The syntax tree of a pattern, for compilers other than the automaton
   (gbnf.c compiles it into rules without the position limit). */
enum { EMBER_RXT_CLS, EMBER_RXT_CAT, EMBER_RXT_ALT, EMBER_RXT_REP, EMBER_RXT_EMPTY };
#define EMBER_RX_NODES 512
#define EMBER_RX_INF (-1) /* REP: no upper bound */
typedef struct ember_rx_node {
    int kind;
    int a, b;        /* CAT / ALT: the parts; REP: a is the body */
    int lo, hi;      /* REP: counts (hi EMBER_RX_INF: none) */
    uint64_t cls[2]; /* CLS: the bytes 0..127 it matches */
} ember_rx_node;
typedef struct ember_rx_tree {
    int n, root;
    ember_rx_node nodes[EMBER_RX_NODES];
} ember_rx_tree;

/* Parses pattern as a whole-string match (a '^' at its start and a '$' at
   its end are accepted and change nothing; no implicit .*) over a wider
   alphabet: printable ASCII, tab and line feed ('.' is all of them but the
   line feed). what names the field in messages. Returns 0, or -1 with why
   written (naming the unsupported feature). */
int ember_rx_parse(const char *pattern, const char *what, ember_rx_tree *out, char *why, size_t why_len);

/* Compiles pattern into *out. Returns 0, or -1 with why (a sentence naming
   what is not supported) written to why[0..why_len). */
int ember_rx_compile(const char *pattern, ember_rx *out, char *why, size_t why_len);

/* The set after reading c from set (0: refused). */
uint64_t ember_rx_step(const ember_rx *rx, uint64_t set, unsigned char c);

/* Whether a match may end at set. */
bool ember_rx_accepts(const ember_rx *rx, uint64_t set);

/* Fewest characters that take set to an end (0 when it accepts). */
int ember_rx_dist(const ember_rx *rx, uint64_t set);

#endif
