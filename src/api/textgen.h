/*
 * textgen.h - a request's text: streaming detokenization and stop strings
 * (part of libember: the text API, src/api/text.c, and the server use it).
 * Also the growable byte buffer the server uses for bodies and events.
 */
#ifndef EMBER_API_TEXTGEN_H
#define EMBER_API_TEXTGEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tok/tokenizer.h"

typedef struct strbuf {
    char *data; /* NUL-terminated when non-NULL */
    size_t len, cap;
} strbuf;

/* Append; return 0, or -1 when out of memory (the buffer is unchanged). */
int sb_append(strbuf *b, const char *s, size_t n);
int sb_puts(strbuf *b, const char *s);
/* Drops the first n bytes. */
void sb_consume(strbuf *b, size_t n);
void sb_free(strbuf *b);

typedef struct textgen {
    ember_tok_stream *ds;
    char **stops; /* borrowed stop strings (non-empty) */
    int n_stops;
    strbuf pending; /* decoded, not yet released (a stop string may be starting) */
    strbuf text;    /* everything released so far */
    bool stopped;   /* a stop string matched: generation should end */
    int stop_index; /* which one, or -1 */
    int32_t n_vocab; /* the tokenizer's ids; others (model padding) decode to nothing */
    const ember_tokenizer *tok;
    const int32_t *keep; /* borrowed: special tokens whose text is kept (tool-call markers) */
    int n_keep;
} textgen;

/* stops (borrowed, must outlive t) are matched on the decoded text. */
int textgen_init(textgen *t, const ember_tokenizer *tok, char **stops, int n_stops, ember_error *err);
void textgen_free(textgen *t);

/* Special tokens the text keeps (their stored text, e.g. "[TOOL_CALLS]"),
   where all other special tokens are dropped. keep is borrowed and must
   outlive t. */
void textgen_keep(textgen *t, const int32_t *keep, int n_keep);

/* Feeds one generated token; appends the newly releasable text to out.
   After a stop string matched, t->stopped is set and further pushes add
   nothing. */
int textgen_push(textgen *t, int32_t id, strbuf *out, ember_error *err);

/* The request ended: appends whatever was held back (up to a stop string). */
int textgen_finish(textgen *t, strbuf *out, ember_error *err);

#endif
