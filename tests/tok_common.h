/*
 * tok_common.h - helpers shared by the tokenizer tests: reading files,
 * parsing id lists, checking that streaming detokenization equals the full
 * decode.
 */
#ifndef EMBER_TESTS_TOK_COMMON_H
#define EMBER_TESTS_TOK_COMMON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok/tokenizer.h"

/* Whole file, NUL-terminated (caller frees); NULL when it cannot be read. */
static inline char *tt_read(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (!b || fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        fclose(f);
        return NULL;
    }
    fclose(f);
    b[n] = 0;
    if (len) *len = (size_t)n;
    return b;
}

/* Parses space-separated ids from s up to the end of line; returns the
   number parsed (into a malloc'd *out) and advances *s past the newline. */
static inline size_t tt_ids(const char **s, int32_t **out) {
    size_t cap = 16, n = 0;
    int32_t *v = malloc(cap * sizeof *v);
    const char *p = *s;
    while (*p && *p != '\n') {
        while (*p == ' ') p++;
        if (*p == '\n' || !*p) break;
        char *e;
        long x = strtol(p, &e, 10);
        if (e == p) break;
        if (n == cap) {
            cap *= 2;
            v = realloc(v, cap * sizeof *v);
        }
        v[n++] = (int32_t)x;
        p = e;
    }
    while (*p && *p != '\n') p++;
    if (*p == '\n') p++;
    *s = p;
    *out = v;
    return n;
}

static inline bool tt_valid_utf8(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s, *e = p + n;
    while (p < e) {
        unsigned c = *p;
        size_t l = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        if (!l || (size_t)(e - p) < l) return false;
        for (size_t k = 1; k < l; k++)
            if ((p[k] & 0xC0) != 0x80) return false;
        if (c == 0xE0 && p[1] < 0xA0) return false;
        if (c == 0xED && p[1] > 0x9F) return false;
        if (c == 0xF0 && p[1] < 0x90) return false;
        if (c == 0xF4 && p[1] > 0x8F) return false;
        p += l;
    }
    return true;
}

/* Streams ids through a fresh stream; true when every chunk is valid UTF-8
   and all chunks plus the flush equal want[0..wn). On mismatch *got (may be
   NULL) receives the streamed text (caller frees). */
static inline bool tt_stream_equals(const ember_tokenizer *t, const int32_t *ids, size_t n, unsigned flags,
                                    const char *want, size_t wn, char **got) {
    ember_tok_stream *s;
    ember_error err = {0};
    if (got) *got = NULL;
    if (ember_tok_stream_new(t, flags, &s, &err)) return false;
    size_t cap = wn + 64, len = 0;
    char *acc = malloc(cap);
    bool ok = true;
    for (size_t i = 0; i <= n && ok; i++) {
        const char *txt;
        size_t tl;
        int rc = i < n ? ember_tok_stream_push(s, ids[i], &txt, &tl, &err) : ember_tok_stream_flush(s, &txt, &tl, &err);
        if (rc) {
            ok = false;
            break;
        }
        if (!tt_valid_utf8(txt, tl)) ok = false;
        if (len + tl + 1 > cap) {
            cap = (len + tl + 1) * 2;
            acc = realloc(acc, cap);
        }
        memcpy(acc + len, txt, tl);
        len += tl;
    }
    ember_tok_stream_free(s);
    if (ok) ok = len == wn && memcmp(acc, want, wn) == 0;
    if (!ok && got) {
        acc[len] = 0;
        *got = acc;
    } else {
        free(acc);
    }
    return ok;
}

/* One expected record (tests/ref/tok/tokenize_corpus.mjs): ids without (n)
   and with (i) special tokens, decode(i) (d) and decode(i, skip special) (s). */
typedef struct tt_rec {
    int32_t *n, *i;
    size_t nn, ni;
    const char *d, *s;
    size_t dn, sn;
} tt_rec;

/* "T <len>\n<bytes>\n", or "T =\n" (then *same) */
static inline bool tt_text(const char **s, char tag, const char **p, size_t *n, bool *same) {
    const char *q = *s;
    if (q[0] != tag || q[1] != ' ') return false;
    *same = false;
    if (q[2] == '=') {
        *same = true;
        *s = q + 4;
        return true;
    }
    char *e;
    long len = strtol(q + 2, &e, 10);
    if (*e != '\n' || len < 0) return false;
    *p = e + 1;
    *n = (size_t)len;
    *s = e + 1 + len + 1;
    return true;
}

/* Reads N, I, D, S at *s; false on a malformed file. Free with tt_rec_free. */
static inline bool tt_read_rec(const char **s, tt_rec *r) {
    memset(r, 0, sizeof *r);
    const char *p = *s;
    if (p[0] != 'N') return false;
    p++;
    r->nn = tt_ids(&p, &r->n);
    if (p[0] != 'I') return false;
    p++;
    if (p[0] == ' ' && p[1] == '@') { /* "I @ prefix | suffix" around N */
        p += 2;
        const char *bar = strchr(p, '|');
        if (!bar) return false;
        char tmp[512];
        size_t pl = (size_t)(bar - p) < sizeof tmp - 2 ? (size_t)(bar - p) : sizeof tmp - 2;
        memcpy(tmp, p, pl);
        tmp[pl] = '\n';
        tmp[pl + 1] = 0;
        const char *q = tmp;
        int32_t *pre, *suf;
        size_t npre = tt_ids(&q, &pre);
        p = bar + 1;
        size_t nsuf = tt_ids(&p, &suf);
        r->ni = npre + r->nn + nsuf;
        r->i = malloc((r->ni + 1) * sizeof *r->i);
        memcpy(r->i, pre, npre * sizeof *pre);
        if (r->nn) memcpy(r->i + npre, r->n, r->nn * sizeof *r->n);
        memcpy(r->i + npre + r->nn, suf, nsuf * sizeof *suf);
        free(pre);
        free(suf);
    } else {
        r->ni = tt_ids(&p, &r->i);
    }
    bool same;
    if (!tt_text(&p, 'D', &r->d, &r->dn, &same) || same) return false;
    if (!tt_text(&p, 'S', &r->s, &r->sn, &same)) return false;
    if (same) {
        r->s = r->d;
        r->sn = r->dn;
    }
    *s = p;
    return true;
}

static inline void tt_rec_free(tt_rec *r) {
    free(r->n);
    free(r->i);
    memset(r, 0, sizeof *r);
}

static inline void tt_print_ids(FILE *f, const char *tag, const int32_t *v, size_t n) {
    fprintf(f, "  %s:", tag);
    for (size_t i = 0; i < n && i < 64; i++) fprintf(f, " %d", v[i]);
    if (n > 64) fprintf(f, " ...");
    fprintf(f, "\n");
}

#endif
