/*
 * tok_decode.c - ids -> text (the decoder chain) and streaming
 * detokenization.
 *
 * Owner: tokenizer module. ember_tok_decode only reads the tokenizer;
 * a stream belongs to one thread.
 *
 * Full decode follows the reference step by step on a list of strings:
 * ids -> token texts (special ones dropped with SKIP_SPECIAL) -> each
 * decoder of the chain (ByteLevel, ByteFallback, Metaspace, WordPiece,
 * Replace, Fuse, Strip, BPEDecoder, CTC, Sequence) -> joined ->
 * end_of_word_suffix -> clean_up_tokenization_spaces. Byte sequences are
 * turned into text by the WHATWG UTF-8 decoder (invalid -> U+FFFD);
 * ByteFallback, like the reference's default TextDecoder, drops a U+FEFF
 * that starts a run of byte tokens.
 *
 * Streaming compiles the chain into a plan: per-token steps (Replace with
 * a literal, Metaspace, WordPiece, Strip), one byte stage (ByteLevel or
 * ByteFallback), then whole-text steps (Strip after Fuse, clean-up). The
 * stream holds back only what a later token can still change: an
 * incomplete UTF-8 sequence, the start of a byte-token run (a possible
 * BOM), leading characters a whole-text Strip may remove, trailing ones it
 * may remove, and the last characters before which a clean-up rule (" .",
 * " n't", ...) could still match. Chains outside the plan (BPEDecoder, CTC,
 * regex Replace, ...) are decoded in full at flush time.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"
#include "core/alloc.h"

static int nomem(ember_error *err) { return ember_err(err, EMBER_ERR_NOMEM, "out of memory"); }

/* ---- clean_up_tokenization ----------------------------------------------- */

static const struct {
    const char *from, *to;
} k_cleanup[] = {{" .", "."},   {" ?", "?"},     {" !", "!"},     {" ,", ","},     {" ' ", "'"},
                 {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};

static int replace_lit(const char *s, size_t n, const char *from, size_t fn, const char *to, size_t tn, tok_buf *out) {
    size_t i = 0, last = 0;
    if (fn == 0) { /* JS replaceAll("") inserts `to` around every character */
        if (tok_buf_put(out, to, tn)) return EMBER_ERR_NOMEM;
        while (i < n) {
            size_t l = tok_utf8_len((unsigned char)s[i]);
            if (l > n - i) l = n - i;
            if (tok_buf_put(out, s + i, l) || tok_buf_put(out, to, tn)) return EMBER_ERR_NOMEM;
            i += l;
        }
        return EMBER_OK;
    }
    while (i + fn <= n) {
        if (memcmp(s + i, from, fn) == 0) {
            if (tok_buf_put(out, s + last, i - last) || tok_buf_put(out, to, tn)) return EMBER_ERR_NOMEM;
            i += fn;
            last = i;
        } else {
            i++;
        }
    }
    return tok_buf_put(out, s + last, n - last);
}

int tok_cleanup_append(const char *s, size_t n, tok_buf *out) {
    if (!memchr(s, ' ', n)) return tok_buf_put(out, s, n);
    tok_buf a = {0}, b = {0};
    int rc = tok_buf_put(&a, s, n);
    for (size_t k = 0; !rc && k < sizeof k_cleanup / sizeof k_cleanup[0]; k++) {
        b.n = 0;
        rc = replace_lit(a.p, a.n, k_cleanup[k].from, strlen(k_cleanup[k].from), k_cleanup[k].to,
                         strlen(k_cleanup[k].to), &b);
        tok_buf t = a;
        a = b;
        b = t;
    }
    if (!rc) rc = tok_buf_put(out, a.p, a.n);
    tok_buf_free(&a);
    tok_buf_free(&b);
    return rc;
}

/* ---- helpers ------------------------------------------------------------------ */

/* JS parseInt(s, 16) for the two UTF-16 units of a <0x..> token, then the
   Uint8Array conversion; -1 for NaN. */
static int js_hex_byte(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s, *e = p + n;
    while (p < e) {
        uint32_t cp;
        size_t l = tok_utf8_next(p, e, &cp);
        if (!ember_js_space(cp)) break;
        p += l;
    }
    int sign = 1;
    if (p < e && (*p == '+' || *p == '-')) {
        if (*p == '-') sign = -1;
        p++;
    }
    if (e - p >= 2 && p[0] == '0' && (p[1] | 32) == 'x') p += 2;
    long v = 0;
    int digits = 0;
    while (p < e) {
        int d = (*p >= '0' && *p <= '9') ? *p - '0' : ((*p | 32) >= 'a' && (*p | 32) <= 'f') ? (*p | 32) - 'a' + 10 : -1;
        if (d < 0) break;
        v = v * 16 + d;
        digits++;
        p++;
    }
    if (!digits) return -1;
    return (int)(((sign * v) % 256 + 256) % 256);
}

/* The reference's byte-token test: 6 UTF-16 units, "<0x" .. ">". */
static int byte_token(const char *s, size_t n) {
    if (n < 6 || memcmp(s, "<0x", 3) != 0 || s[n - 1] != '>') return -1;
    if (ember_utf16_len(s, n) != 6) return -1;
    return js_hex_byte(s + 3, n - 4);
}

/* The reference's Strip on one string (units compared with content). */
static tok_sv strip_sv(tok_sv s, uint32_t cp, size_t start, size_t stop) {
    const unsigned char *b = (const unsigned char *)s.p, *e = b + s.n, *p = b;
    for (size_t i = 0; i < start && p < e; i++) {
        uint32_t c;
        size_t l = tok_utf8_next(p, e, &c);
        if (c != cp) break;
        p += l;
    }
    const unsigned char *q = e;
    for (size_t i = 0; i < stop && q > p; i++) {
        const unsigned char *r = q - 1;
        while (r > p && (*r & 0xC0) == 0x80) r--;
        uint32_t c;
        tok_utf8_next(r, e, &c);
        if (c != cp) break;
        q = r;
    }
    tok_sv r = {(const char *)p, (size_t)(q - p)};
    return r;
}

/* ---- full decode on string lists ----------------------------------------------- */

typedef struct slist {
    tok_sv *v;
    size_t n, cap;
} slist;

static int sl_push(slist *l, tok_arena *a, const char *s, size_t n, bool copy) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        tok_sv *v = ember_realloc(l->v, cap * sizeof *v);
        if (!v) return EMBER_ERR_NOMEM;
        l->v = v;
        l->cap = cap;
    }
    if (copy) {
        char *p = tok_arena_strdup(a, s, n);
        if (!p) return EMBER_ERR_NOMEM;
        s = p;
    }
    l->v[l->n].p = s;
    l->v[l->n].n = n;
    l->n++;
    return EMBER_OK;
}

static int sl_push_buf(slist *l, tok_arena *a, const tok_buf *b) { return sl_push(l, a, b->p ? b->p : "", b->n, true); }

static bool is_added_content(const ember_tokenizer *t, tok_sv s) {
    int32_t k = tok_smap_get(&t->added_map, s.p, s.n);
    return k >= 0 && t->added[k].n == s.n && memcmp(t->added[k].content, s.p, s.n) == 0;
}

/* Bytes -> text through a fresh WHATWG decoder; bom: drop a leading U+FEFF. */
static int bytes_to_text(const unsigned char *b, size_t n, bool drop_bom, tok_buf *out) {
    tok_u8dec d = {0};
    size_t start = out->n;
    for (size_t i = 0; i < n; i++)
        if (tok_u8dec_byte(&d, b[i], out)) return EMBER_ERR_NOMEM;
    if (tok_u8dec_finish(&d, out)) return EMBER_ERR_NOMEM;
    if (drop_bom && out->n - start >= 3 && memcmp(out->p + start, "\xEF\xBB\xBF", 3) == 0) {
        memmove(out->p + start, out->p + start + 3, out->n - start - 3);
        out->n -= 3;
        out->p[out->n] = 0;
    }
    return EMBER_OK;
}

static int apply_dec(const ember_tokenizer *t, const tok_dec *d, tok_arena *ar, tok_rx *rx, slist *in, slist *out,
                     ember_error *err);

/* Only the top-level decoder knows the added tokens (the reference sets
   them on the root decoder alone): a ByteLevel inside a Sequence maps
   every token through the byte table. */
static int apply_seq(const ember_tokenizer *t, const tok_dec *d, tok_arena *ar, tok_rx *rx, slist *l,
                     ember_error *err) {
    for (size_t k = 0; k < d->n_kids; k++) {
        slist o = {0};
        int rc = apply_dec(t, &d->kids[k], ar, rx, l, &o, err);
        if (rc) {
            free(o.v);
            return rc;
        }
        free(l->v);
        *l = o;
    }
    return EMBER_OK;
}

/* ByteLevel: the byte-alphabet characters back to bytes, then text (invalid
   UTF-8 as U+FFFD); the top decoder passes added tokens through. Appends to
   out; b is scratch. Returns 0, or nonzero when out of memory. */
static int dec_bytelevel(const ember_tokenizer *t, const tok_dec *d, tok_arena *ar, const slist *in, slist *out,
                         tok_buf *b) {
    int rc = 0;
    tok_buf bytes = {0};
    for (size_t i = 0; i < in->n && !rc; i++) {
        tok_sv s = in->v[i];
        if (d == t->dec && is_added_content(t, s)) {
            if (bytes.n) {
                b->n = 0;
                rc = bytes_to_text((const unsigned char *)bytes.p, bytes.n, false, b);
                if (!rc) rc = sl_push_buf(out, ar, b);
                bytes.n = 0;
            }
            if (!rc) rc = sl_push(out, ar, s.p, s.n, false);
            continue;
        }
        const unsigned char *p = (const unsigned char *)s.p, *e = p + s.n;
        while (p < e && !rc) {
            uint32_t cp;
            p += tok_utf8_next(p, e, &cp);
            int by = tok_cp_to_byte(cp);
            rc = tok_buf_putc(&bytes, (char)(by < 0 ? 0 : by));
        }
    }
    if (!rc && bytes.n) {
        b->n = 0;
        rc = bytes_to_text((const unsigned char *)bytes.p, bytes.n, false, b);
        if (!rc) rc = sl_push_buf(out, ar, b);
    }
    tok_buf_free(&bytes);
    return rc;
}

/* ByteFallback: runs of <0xNN> tokens to text (each invalid byte as U+FFFD).
   Appends to out; b is scratch. Returns 0, or nonzero when out of memory. */
static int dec_bytefallback(tok_arena *ar, const slist *in, slist *out, tok_buf *b) {
    int rc = 0;
    tok_buf bytes = {0};
    for (size_t i = 0; i < in->n && !rc; i++) {
        tok_sv s = in->v[i];
        int by = byte_token(s.p, s.n);
        if (by >= 0) {
            rc = tok_buf_putc(&bytes, (char)by);
            continue;
        }
        if (bytes.n) {
            b->n = 0;
            rc = bytes_to_text((const unsigned char *)bytes.p, bytes.n, true, b);
            if (!rc) rc = sl_push_buf(out, ar, b);
            bytes.n = 0;
        }
        if (!rc) rc = sl_push(out, ar, s.p, s.n, false);
    }
    if (!rc && bytes.n) {
        b->n = 0;
        rc = bytes_to_text((const unsigned char *)bytes.p, bytes.n, true, b);
        if (!rc) rc = sl_push_buf(out, ar, b);
    }
    tok_buf_free(&bytes);
    return rc;
}

/* WordPiece: the continuation prefix dropped, a space before each other
   piece, optional cleanup. Appends to out; b is scratch. Returns 0, or
   nonzero when out of memory. */
static int dec_wordpiece(const tok_dec *d, tok_arena *ar, const slist *in, slist *out, tok_buf *b) {
    int rc = 0;
    for (size_t i = 0; i < in->n && !rc; i++) {
        tok_sv s = in->v[i];
        b->n = 0;
        if (i != 0) {
            if (d->str_n && s.n >= d->str_n && memcmp(s.p, d->str, d->str_n) == 0) {
                s.p += d->str_n;
                s.n -= d->str_n;
            } else {
                rc = tok_buf_putc(b, ' ');
            }
        }
        if (!rc) rc = tok_buf_put(b, s.p, s.n);
        if (!rc && d->cleanup) {
            tok_buf c = {0};
            rc = tok_cleanup_append(b->p, b->n, &c);
            if (!rc) rc = sl_push_buf(out, ar, &c);
            tok_buf_free(&c);
        } else if (!rc) {
            rc = sl_push_buf(out, ar, b);
        }
    }
    return rc;
}

/* CTC: repeats and the pad token dropped, optional cleanup and word
   delimiter. Appends to out; b is scratch. Returns 0, or nonzero when out of
   memory. */
static int dec_ctc(const tok_dec *d, tok_arena *ar, const slist *in, slist *out, tok_buf *b) {
    int rc = 0;
    for (size_t i = 0; i < in->n && !rc; i++) {
        tok_sv s = in->v[i];
        if (i > 0 && in->v[i - 1].n == s.n && memcmp(in->v[i - 1].p, s.p, s.n) == 0) continue;
        if (s.n == d->str_n && memcmp(s.p, d->str, s.n) == 0) continue;
        rc = tok_buf_put(b, s.p, s.n);
    }
    if (!rc && d->cleanup) {
        tok_buf c = {0}, e = {0};
        rc = tok_cleanup_append(b->p ? b->p : "", b->n, &c);
        if (!rc) {
            if (d->str2_n)
                rc = replace_lit(c.p ? c.p : "", c.n, d->str2, d->str2_n, " ", 1, &e);
            else
                rc = tok_buf_put(&e, c.p ? c.p : "", c.n);
        }
        if (!rc) {
            tok_sv tr = tok_trim_end(tok_trim_start((tok_sv){e.p ? e.p : "", e.n}));
            rc = sl_push(out, ar, tr.p, tr.n, true);
        }
        tok_buf_free(&c);
        tok_buf_free(&e);
    } else if (!rc) {
        rc = sl_push_buf(out, ar, b);
    }
    return rc;
}

static int apply_dec(const ember_tokenizer *t, const tok_dec *d, tok_arena *ar, tok_rx *rx, slist *in, slist *out,
                     ember_error *err) {
    tok_buf b = {0};
    int rc = EMBER_OK;
    switch (d->type) {
    case TOK_DEC_SEQUENCE: {
        slist l = {0};
        for (size_t i = 0; i < in->n && !rc; i++) rc = sl_push(&l, ar, in->v[i].p, in->v[i].n, false);
        if (!rc) rc = apply_seq(t, d, ar, rx, &l, err);
        if (!rc) {
            *out = l;
            return EMBER_OK;
        }
        free(l.v);
        return rc == EMBER_ERR_NOMEM ? nomem(err) : rc;
    }
    case TOK_DEC_BYTELEVEL: rc = dec_bytelevel(t, d, ar, in, out, &b); break;
    case TOK_DEC_BYTEFALLBACK: rc = dec_bytefallback(ar, in, out, &b); break;
    case TOK_DEC_WORDPIECE: rc = dec_wordpiece(d, ar, in, out, &b); break;
    case TOK_DEC_METASPACE:
        for (size_t i = 0; i < in->n && !rc; i++) {
            b.n = 0;
            rc = replace_lit(in->v[i].p, in->v[i].n, d->str, d->str_n, " ", 1, &b);
            size_t skip = (!rc && i == 0 && b.n > 0 && b.p[0] == ' ') ? 1 : 0;
            if (!rc) rc = sl_push(out, ar, b.p + skip, b.n - skip, true);
        }
        break;
    case TOK_DEC_BPE:
        for (size_t i = 0; i < in->n && !rc; i++) {
            b.n = 0;
            const char *to = i + 1 == in->n ? "" : " ";
            rc = replace_lit(in->v[i].p, in->v[i].n, d->str, d->str_n, to, strlen(to), &b);
            if (!rc) rc = sl_push_buf(out, ar, &b);
        }
        break;
    case TOK_DEC_CTC: rc = dec_ctc(d, ar, in, out, &b); break;
    case TOK_DEC_REPLACE:
        for (size_t i = 0; i < in->n && !rc; i++) {
            b.n = 0;
            if (d->has_pat) {
                rc = tok_pattern_replace_all(&d->pat, rx, in->v[i].p, in->v[i].n, d->str, d->str_n, &b, err);
                if (rc) {
                    tok_buf_free(&b);
                    return rc;
                }
            } else {
                rc = tok_buf_put(&b, in->v[i].p, in->v[i].n);
            }
            if (!rc) rc = sl_push_buf(out, ar, &b);
        }
        break;
    case TOK_DEC_FUSE:
        for (size_t i = 0; i < in->n && !rc; i++) rc = tok_buf_put(&b, in->v[i].p, in->v[i].n);
        if (!rc) rc = sl_push_buf(out, ar, &b);
        break;
    case TOK_DEC_STRIP:
        for (size_t i = 0; i < in->n && !rc; i++) {
            tok_sv s = strip_sv(in->v[i], d->strip_cp, d->start, d->stop);
            rc = sl_push(out, ar, s.p, s.n, false);
        }
        break;
    }
    tok_buf_free(&b);
    return rc ? nomem(err) : EMBER_OK;
}

/* The token text for id (unk text for holes), NULL when none. */
static tok_sv id_text(const ember_tokenizer *t, int32_t id) {
    tok_sv s = t->text[id];
    if (!s.p && t->model.unk_str) {
        s.p = t->model.unk_str;
        s.n = t->model.unk_n;
    }
    return s;
}

static bool skip_id(const ember_tokenizer *t, tok_sv s) {
    return s.p && tok_smap_get(&t->special_set, s.p, s.n) >= 0;
}

int tok_decode_full(const ember_tokenizer *t, const int32_t *ids, size_t n, unsigned flags, tok_buf *out,
                    ember_error *err) {
    tok_arena ar = {0};
    slist l = {0};
    int rc = EMBER_OK;
    tok_rx rx = {0};
    bool skip = (flags & EMBER_TOK_SKIP_SPECIAL) != 0;
    for (size_t i = 0; i < n && !rc; i++) {
        tok_sv s = id_text(t, ids[i]);
        if (!s.p) s = (tok_sv){"", 0};
        if (skip && skip_id(t, s)) continue;
        rc = sl_push(&l, &ar, s.p, s.n, false) ? nomem(err) : EMBER_OK;
    }
    tok_buf txt = {0};
    if (!rc && t->dec) {
        if (t->dec_regex && tok_rx_init(&rx, t->max_caps)) rc = nomem(err); /* only regex Replace needs it */
        slist o = {0};
        if (!rc) rc = apply_dec(t, t->dec, &ar, &rx, &l, &o, err);
        free(l.v);
        l = o;
        for (size_t i = 0; i < l.n && !rc; i++) rc = tok_buf_put(&txt, l.v[i].p, l.v[i].n) ? nomem(err) : EMBER_OK;
        if (!rc && t->model.eow_n) {
            tok_buf e = {0};
            rc = replace_lit(txt.p ? txt.p : "", txt.n, t->model.eow_suffix, t->model.eow_n, " ", 1, &e) ? nomem(err)
                                                                                                      : EMBER_OK;
            tok_buf_free(&txt);
            txt = e;
            if (!rc && skip) {
                tok_sv tr = tok_trim_end(tok_trim_start((tok_sv){txt.p ? txt.p : "", txt.n}));
                memmove(txt.p, tr.p, tr.n);
                txt.n = tr.n;
            }
        }
    } else if (!rc) {
        for (size_t i = 0; i < l.n && !rc; i++) {
            if (i && tok_buf_putc(&txt, ' ')) rc = nomem(err);
            if (!rc && tok_buf_put(&txt, l.v[i].p, l.v[i].n)) rc = nomem(err);
        }
    }
    if (!rc) {
        if (t->cleanup && !(flags & EMBER_TOK_NO_CLEANUP))
            rc = tok_cleanup_append(txt.p ? txt.p : "", txt.n, out) ? nomem(err) : EMBER_OK;
        else
            rc = tok_buf_put(out, txt.p ? txt.p : "", txt.n) ? nomem(err) : EMBER_OK;
    }
    tok_buf_free(&txt);
    free(l.v);
    tok_arena_free(&ar);
    tok_rx_free(&rx);
    return rc;
}

static int check_ids(const ember_tokenizer *t, const int32_t *ids, size_t n, ember_error *err) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= t->n_ids)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "token id %ld at position %zu is outside the vocabulary [0, %ld)",
                             (long)ids[i], i, (long)t->n_ids);
    return EMBER_OK;
}

int ember_tok_decode(const ember_tokenizer *t, const int32_t *ids, size_t n, unsigned flags, char **text, size_t *len,
                     ember_error *err) {
    if (!t || !text || (!ids && n)) return ember_err(err, EMBER_ERR_INVALID_ARG, "ember_tok_decode: NULL argument");
    *text = NULL;
    if (len) *len = 0;
    if (n > TOK_MAX_DECODE_IDS)
        return ember_err(err, EMBER_ERR_LIMIT, "%zu ids to decode (limit %zu)", n, (size_t)TOK_MAX_DECODE_IDS);
    int rc = check_ids(t, ids, n, err);
    if (rc) return rc;
    tok_buf out = {0};
    rc = tok_decode_full(t, ids, n, flags, &out, err);
    if (!rc && !out.p && tok_buf_reserve(&out, 1)) rc = nomem(err);
    if (rc) {
        tok_buf_free(&out);
        return rc;
    }
    out.p[out.n] = 0;
    *text = out.p;
    if (len) *len = out.n;
    return EMBER_OK;
}

/* ---- streaming plan -------------------------------------------------------------- */

static void flatten(const tok_dec *d, const tok_dec **v, size_t *n, bool *overflow) {
    if (d->type == TOK_DEC_SEQUENCE) {
        for (size_t k = 0; k < d->n_kids; k++) flatten(&d->kids[k], v, n, overflow);
        return;
    }
    if (*n == TOK_MAX_SEQ_ITEMS) {
        *overflow = true;
        return;
    }
    v[(*n)++] = d;
}

void tok_plan_compile(ember_tokenizer *t) {
    tok_splan *p = &t->plan;
    memset(p, 0, sizeof *p);
    p->ok = true;
    if (!t->dec) {
        p->ops[p->n_ops++] = (tok_sop){TOK_SOP_JOIN, NULL};
        return;
    }
    if (t->model.eow_n) {
        p->ok = false;
        return;
    }
    const tok_dec *v[TOK_MAX_SEQ_ITEMS];
    size_t n = 0;
    bool overflow = false;
    flatten(t->dec, v, &n, &overflow);
    if (overflow) {
        p->ok = false;
        return;
    }
    int phase = 0; /* 0 per token, 1 after a byte stage, 2 after Fuse */
    for (size_t k = 0; k < n && p->ok; k++) {
        const tok_dec *d = v[k];
        switch (d->type) {
        case TOK_DEC_REPLACE:
            if (phase == 0 && d->has_pat && !d->pat.is_regex && d->pat.lit_n > 0 && !memchr(d->str, '$', d->str_n))
                p->ops[p->n_ops++] = (tok_sop){TOK_SOP_REPLACE, d};
            else
                p->ok = false;
            break;
        case TOK_DEC_METASPACE:
            if (phase == 0 && d->str_n > 0) p->ops[p->n_ops++] = (tok_sop){TOK_SOP_METASPACE, d};
            else p->ok = false;
            break;
        case TOK_DEC_WORDPIECE:
            if (phase == 0) p->ops[p->n_ops++] = (tok_sop){TOK_SOP_WORDPIECE, d};
            else p->ok = false;
            break;
        case TOK_DEC_STRIP:
            if (phase == 0) {
                p->ops[p->n_ops++] = (tok_sop){TOK_SOP_STRIP, d};
            } else if (phase == 2 && !p->strip_whole) {
                p->strip_whole = true;
                p->strip_cp = d->strip_cp;
                p->strip_start = d->start;
                p->strip_stop = d->stop;
            } else {
                p->ok = false;
            }
            break;
        case TOK_DEC_BYTELEVEL:
        case TOK_DEC_BYTEFALLBACK:
            if (phase == 0) {
                p->bytes = d->type == TOK_DEC_BYTELEVEL ? 1 : 2;
                phase = 1;
            } else {
                p->ok = false;
            }
            break;
        case TOK_DEC_FUSE:
            if (p->strip_whole) p->ok = false; /* a second fuse after a whole strip: keep it simple */
            phase = 2;
            break;
        default:
            p->ok = false;
            break;
        }
    }
}

/* ---- streams ------------------------------------------------------------------------ */

struct ember_tok_stream {
    const ember_tokenizer *t;
    unsigned flags;
    size_t index;       /* non-skipped tokens seen */
    tok_u8dec u8;       /* byte stage decoder */
    bool in_group;      /* ByteFallback: inside a run of byte tokens */
    bool group_first;   /* ByteFallback: no character of the run decoded yet */
    size_t strip_left;  /* whole-text Strip: leading characters still strippable */
    tok_buf hold;       /* whole-text Strip: trailing content characters held */
    tok_buf pend;       /* clean-up: text a rule may still change */
    tok_buf out;        /* returned chunk */
    tok_buf tmp, tmp2, chars;
    tok_ivec ids;       /* fallback: every id */
};

int ember_tok_stream_new(const ember_tokenizer *t, unsigned flags, ember_tok_stream **out, ember_error *err) {
    if (!t || !out) return ember_err(err, EMBER_ERR_INVALID_ARG, "ember_tok_stream_new: NULL argument");
    ember_tok_stream *s = ember_calloc(1, sizeof *s);
    if (!s) return nomem(err);
    s->t = t;
    s->flags = flags;
    s->strip_left = t->plan.strip_whole ? t->plan.strip_start : 0;
    *out = s;
    return EMBER_OK;
}

void ember_tok_stream_free(ember_tok_stream *s) {
    if (!s) return;
    tok_buf_free(&s->hold);
    tok_buf_free(&s->pend);
    tok_buf_free(&s->out);
    tok_buf_free(&s->tmp);
    tok_buf_free(&s->tmp2);
    tok_buf_free(&s->chars);
    tok_ivec_free(&s->ids);
    free(s);
}

static bool cleanup_on(const ember_tok_stream *s) { return s->t->cleanup && !(s->flags & EMBER_TOK_NO_CLEANUP); }

/* The last stage: clean-up (holding back what a rule may still change). */
static int stage_cleanup(ember_tok_stream *s, const char *p, size_t n, bool final) {
    if (!cleanup_on(s)) return tok_buf_put(&s->out, p, n);
    if (tok_buf_put(&s->pend, p, n)) return EMBER_ERR_NOMEM;
    size_t c = s->pend.n;
    if (!final) {
        /* largest cut c (a character boundary) with no space in the 3 bytes before it */
        const char *b = s->pend.p;
        while (c > 0) {
            bool boundary = c == s->pend.n || ((unsigned char)b[c] & 0xC0) != 0x80;
            bool clear = true;
            for (size_t k = c >= 3 ? c - 3 : 0; k < c; k++)
                if (b[k] == ' ') clear = false;
            if (boundary && clear) break;
            c--;
        }
    }
    if (c == 0) return EMBER_OK;
    if (tok_cleanup_append(s->pend.p, c, &s->out)) return EMBER_ERR_NOMEM;
    memmove(s->pend.p, s->pend.p + c, s->pend.n - c);
    s->pend.n -= c;
    s->pend.p[s->pend.n] = 0;
    return EMBER_OK;
}

/* Whole-text stage: Strip after Fuse, then clean-up. p is valid UTF-8. */
static int stage_text(ember_tok_stream *s, const char *p, size_t n) {
    const tok_splan *pl = &s->t->plan;
    if (!pl->strip_whole) return stage_cleanup(s, p, n, false);
    const unsigned char *q = (const unsigned char *)p, *e = q + n;
    while (s->strip_left > 0 && q < e) {
        uint32_t cp;
        size_t l = tok_utf8_next(q, e, &cp);
        if (cp != pl->strip_cp) {
            s->strip_left = 0;
            break;
        }
        q += l;
        s->strip_left--;
    }
    if (q < e) s->strip_left = 0;
    if (pl->strip_stop == 0) return stage_cleanup(s, (const char *)q, (size_t)(e - q), false);
    if (tok_buf_put(&s->hold, q, (size_t)(e - q))) return EMBER_ERR_NOMEM;
    /* keep the last min(run, stop) content characters */
    const unsigned char *b = (const unsigned char *)s->hold.p, *h = b + s->hold.n;
    size_t kept = 0;
    while (h > b && kept < pl->strip_stop) {
        const unsigned char *r = h - 1;
        while (r > b && (*r & 0xC0) == 0x80) r--;
        uint32_t cp;
        tok_utf8_next(r, b + s->hold.n, &cp);
        if (cp != pl->strip_cp) break;
        h = r;
        kept++;
    }
    size_t emit = (size_t)(h - b);
    if (emit) {
        if (stage_cleanup(s, s->hold.p, emit, false)) return EMBER_ERR_NOMEM;
        memmove(s->hold.p, s->hold.p + emit, s->hold.n - emit);
        s->hold.n -= emit;
        s->hold.p[s->hold.n] = 0;
    }
    return EMBER_OK;
}

/* Sends decoded characters of the byte stage on, dropping a U+FEFF that
   starts a ByteFallback run. */
static int pass_chars(ember_tok_stream *s) {
    tok_buf *c = &s->chars;
    size_t from = 0;
    if (s->group_first && c->n > 0) {
        s->group_first = false;
        if (c->n >= 3 && memcmp(c->p, "\xEF\xBB\xBF", 3) == 0) from = 3;
    }
    int rc = c->n > from ? stage_text(s, c->p + from, c->n - from) : EMBER_OK;
    c->n = 0;
    return rc;
}

static int end_group(ember_tok_stream *s) {
    if (tok_u8dec_finish(&s->u8, &s->chars)) return EMBER_ERR_NOMEM;
    int rc = pass_chars(s);
    s->in_group = false;
    s->group_first = false;
    return rc;
}

/* Applies the per-token steps to s->tmp (in place through tmp2). */
static int token_ops(ember_tok_stream *s, size_t index) {
    const tok_splan *pl = &s->t->plan;
    for (size_t k = 0; k < pl->n_ops; k++) {
        const tok_sop *op = &pl->ops[k];
        const tok_dec *d = op->d;
        tok_buf *a = &s->tmp, *b = &s->tmp2;
        b->n = 0;
        int rc = EMBER_OK;
        switch (op->type) {
        case TOK_SOP_REPLACE:
            rc = replace_lit(a->p, a->n, d->pat.lit, d->pat.lit_n, d->str, d->str_n, b);
            break;
        case TOK_SOP_METASPACE:
            rc = replace_lit(a->p, a->n, d->str, d->str_n, " ", 1, b);
            if (!rc && index == 0 && b->n > 0 && b->p[0] == ' ') {
                memmove(b->p, b->p + 1, b->n - 1);
                b->n--;
            }
            break;
        case TOK_SOP_WORDPIECE:
            if (index != 0) {
                if (d->str_n && a->n >= d->str_n && memcmp(a->p, d->str, d->str_n) == 0)
                    rc = tok_buf_put(b, a->p + d->str_n, a->n - d->str_n);
                else
                    rc = tok_buf_putc(b, ' ') || tok_buf_put(b, a->p, a->n);
            } else {
                rc = tok_buf_put(b, a->p, a->n);
            }
            if (!rc && d->cleanup) {
                tok_buf c = {0};
                rc = tok_cleanup_append(b->p, b->n, &c);
                if (!rc) {
                    b->n = 0;
                    rc = tok_buf_put(b, c.p ? c.p : "", c.n);
                }
                tok_buf_free(&c);
            }
            break;
        case TOK_SOP_STRIP: {
            tok_sv sv = strip_sv((tok_sv){a->p, a->n}, d->strip_cp, d->start, d->stop);
            rc = tok_buf_put(b, sv.p, sv.n);
            break;
        }
        case TOK_SOP_JOIN:
            if (index) rc = tok_buf_putc(b, ' ');
            if (!rc) rc = tok_buf_put(b, a->p, a->n);
            break;
        }
        if (rc) return EMBER_ERR_NOMEM;
        tok_buf t = *a;
        *a = *b;
        *b = t;
        if (!a->p && tok_buf_reserve(a, 1)) return EMBER_ERR_NOMEM;
    }
    return EMBER_OK;
}

static int stream_token(ember_tok_stream *s, int32_t id) {
    const ember_tokenizer *t = s->t;
    const tok_splan *pl = &t->plan;
    tok_sv tx = id_text(t, id);
    if (!tx.p) tx = (tok_sv){"", 0};
    if ((s->flags & EMBER_TOK_SKIP_SPECIAL) && skip_id(t, tx)) return EMBER_OK;
    size_t index = s->index++;
    s->tmp.n = 0;
    if (tok_buf_put(&s->tmp, tx.p, tx.n)) return EMBER_ERR_NOMEM;
    if (!s->tmp.p && tok_buf_reserve(&s->tmp, 1)) return EMBER_ERR_NOMEM;
    if (token_ops(s, index)) return EMBER_ERR_NOMEM;
    tok_sv v = {s->tmp.p, s->tmp.n};
    if (pl->bytes == 1) {
        if (t->dec->type == TOK_DEC_BYTELEVEL && is_added_content(t, v)) {
            if (tok_u8dec_finish(&s->u8, &s->chars) || pass_chars(s)) return EMBER_ERR_NOMEM;
            return stage_text(s, v.p, v.n);
        }
        const unsigned char *p = (const unsigned char *)v.p, *e = p + v.n;
        while (p < e) {
            uint32_t cp;
            p += tok_utf8_next(p, e, &cp);
            int by = tok_cp_to_byte(cp);
            if (tok_u8dec_byte(&s->u8, (unsigned char)(by < 0 ? 0 : by), &s->chars)) return EMBER_ERR_NOMEM;
        }
        return pass_chars(s);
    }
    if (pl->bytes == 2) {
        int by = byte_token(v.p, v.n);
        if (by >= 0) {
            if (!s->in_group) {
                s->in_group = true;
                s->group_first = true;
            }
            if (tok_u8dec_byte(&s->u8, (unsigned char)by, &s->chars)) return EMBER_ERR_NOMEM;
            /* a lone EF / EF BB could still become a BOM: nothing decoded yet then */
            return pass_chars(s);
        }
        if (s->in_group && end_group(s)) return EMBER_ERR_NOMEM;
        return stage_text(s, v.p, v.n);
    }
    return stage_text(s, v.p, v.n);
}

int ember_tok_stream_push(ember_tok_stream *s, int32_t id, const char **text, size_t *len, ember_error *err) {
    if (!s || !text || !len) return ember_err(err, EMBER_ERR_INVALID_ARG, "ember_tok_stream_push: NULL argument");
    *text = "";
    *len = 0;
    if (id < 0 || id >= s->t->n_ids)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "token id %ld is outside the vocabulary [0, %ld)", (long)id,
                         (long)s->t->n_ids);
    s->out.n = 0;
    if (!s->t->plan.ok) {
        if (s->ids.n >= TOK_MAX_DECODE_IDS) return ember_err(err, EMBER_ERR_LIMIT, "stream of more than %zu ids", (size_t)TOK_MAX_DECODE_IDS);
        return tok_ivec_push(&s->ids, id) ? nomem(err) : EMBER_OK;
    }
    if (stream_token(s, id)) return nomem(err);
    *text = s->out.p ? s->out.p : "";
    *len = s->out.n;
    return EMBER_OK;
}

int ember_tok_stream_flush(ember_tok_stream *s, const char **text, size_t *len, ember_error *err) {
    if (!s || !text || !len) return ember_err(err, EMBER_ERR_INVALID_ARG, "ember_tok_stream_flush: NULL argument");
    *text = "";
    *len = 0;
    s->out.n = 0;
    int rc = EMBER_OK;
    if (!s->t->plan.ok) {
        rc = tok_decode_full(s->t, s->ids.v, s->ids.n, s->flags, &s->out, err);
        s->ids.n = 0;
    } else {
        /* pending bytes become U+FFFD; held trailing Strip characters go away */
        if (tok_u8dec_finish(&s->u8, &s->chars) || pass_chars(s)) rc = nomem(err);
        s->hold.n = 0;
        if (!rc && stage_cleanup(s, "", 0, true)) rc = nomem(err);
    }
    s->index = 0;
    s->in_group = s->group_first = false;
    memset(&s->u8, 0, sizeof s->u8);
    s->strip_left = s->t->plan.strip_whole ? s->t->plan.strip_start : 0;
    s->hold.n = 0;
    s->pend.n = 0;
    if (rc) return rc;
    *text = s->out.p ? s->out.p : "";
    *len = s->out.n;
    return EMBER_OK;
}
