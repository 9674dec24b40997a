/*
 * textgen.c - turning a request's token events into the text a client sees:
 * streaming detokenization (complete UTF-8 only) and stop strings, matched
 * on text and held back while a partial match is pending.
 *
 * One textgen belongs to one request and one thread.
 */
#define _GNU_SOURCE
#include "textgen.h"
#include "core/alloc.h"

#include <stdlib.h>
#include <string.h>

int sb_append(strbuf *b, const char *s, size_t n) {
    if (n == 0) return 0;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = ember_realloc(b->data, cap);
        if (!p) return -1;
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int sb_puts(strbuf *b, const char *s) {
    return sb_append(b, s, strlen(s));
}

void sb_free(strbuf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

void sb_consume(strbuf *b, size_t n) {
    if (n >= b->len) {
        b->len = 0;
    } else {
        memmove(b->data, b->data + n, b->len - n);
        b->len -= n;
    }
    if (b->data) b->data[b->len] = '\0';
}

int textgen_init(textgen *t, const ember_tokenizer *tok, char **stops, int n_stops, ember_error *err) {
    memset(t, 0, sizeof *t);
    t->stops = stops;
    t->n_stops = n_stops;
    t->stop_index = -1;
    t->n_vocab = ember_tok_n_vocab(tok);
    t->tok = tok;
    return ember_tok_stream_new(tok, EMBER_TOK_SKIP_SPECIAL, &t->ds, err);
}

void textgen_free(textgen *t) {
    ember_tok_stream_free(t->ds);
    sb_free(&t->pending);
    sb_free(&t->text);
}

/* Longest suffix of s that is a proper prefix of some stop string. */
static size_t partial_stop(const textgen *t, const char *s, size_t n) {
    size_t best = 0;
    for (int i = 0; i < t->n_stops; i++) {
        size_t ls = strlen(t->stops[i]);
        size_t max = ls - 1 < n ? ls - 1 : n;
        for (size_t k = max; k > best; k--)
            if (memcmp(s + n - k, t->stops[i], k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

/* Moves what can be released from pending to out (and to the full text). */
static int release(textgen *t, strbuf *out, bool final) {
    /* a complete stop string ends the text right before it */
    size_t cut = t->pending.len;
    for (int i = 0; i < t->n_stops; i++) {
        const char *hit = t->pending.len ? memmem(t->pending.data, t->pending.len, t->stops[i], strlen(t->stops[i]))
                                         : NULL;
        if (hit && (size_t)(hit - t->pending.data) < cut) {
            cut = (size_t)(hit - t->pending.data);
            t->stop_index = i;
        }
    }
    size_t keep = 0;
    if (t->stop_index >= 0)
        t->stopped = true;
    else if (!final)
        keep = partial_stop(t, t->pending.data, t->pending.len);
    size_t emit = t->stopped ? cut : t->pending.len - keep;
    if (sb_append(out, t->pending.data, emit) || sb_append(&t->text, t->pending.data, emit)) return -1;
    if (t->stopped)
        sb_consume(&t->pending, t->pending.len);
    else
        sb_consume(&t->pending, emit);
    return 0;
}

void textgen_keep(textgen *t, const int32_t *keep, int n_keep) {
    t->keep = keep;
    t->n_keep = n_keep;
}

int textgen_push(textgen *t, int32_t id, strbuf *out, ember_error *err) {
    if (t->stopped) return EMBER_OK;
    if (id < 0 || id >= t->n_vocab) return EMBER_OK; /* padding rows of the model's vocabulary have no text */
    const char *piece;
    size_t n;
    int rc;
    for (int i = 0; i < t->n_keep; i++) {
        if (t->keep[i] != id) continue;
        /* a kept special token: what the decoder held back, then the token's own text */
        if ((rc = ember_tok_stream_flush(t->ds, &piece, &n, err))) return rc;
        size_t tn = 0;
        const char *tx = ember_tok_id_text(t->tok, id, &tn);
        if (sb_append(&t->pending, piece, n) || (tx && sb_append(&t->pending, tx, tn)) || release(t, out, false))
            return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        return EMBER_OK;
    }
    rc = ember_tok_stream_push(t->ds, id, &piece, &n, err);
    if (rc) return rc;
    if (sb_append(&t->pending, piece, n) || release(t, out, false))
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    return EMBER_OK;
}

int textgen_finish(textgen *t, strbuf *out, ember_error *err) {
    if (!t->stopped) {
        const char *piece;
        size_t n;
        int rc = ember_tok_stream_flush(t->ds, &piece, &n, err);
        if (rc) return rc;
        if (sb_append(&t->pending, piece, n)) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    }
    if (release(t, out, true)) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    return EMBER_OK;
}
