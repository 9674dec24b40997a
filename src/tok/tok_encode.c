/*
 * tok_encode.c - text -> ids: added-token splitting, normalization,
 * pre-tokenization, the model, the post-processor. Workspaces.
 *
 * Owner: tokenizer module. ember_tok_encode reads the tokenizer only and
 * writes the workspace (the caller's, or a temporary one), so concurrent
 * calls with different workspaces are safe.
 *
 * The flow is the reference's (node @huggingface/tokenizers encode_text):
 *   1. split the text on added tokens that are not normalized (leftmost,
 *      longest); an added token with lstrip / rstrip trims the whitespace
 *      (JavaScript trim) of its neighbours;
 *   2. each other section is normalized, split again on normalized added
 *      tokens (same lstrip / rstrip rule), pre-tokenized (with its section
 *      index, for Metaspace prepend_scheme "first") and run through the
 *      model;
 *   3. the post-processor adds special tokens when asked (ADD_SPECIAL).
 * A section is an added token when its text equals an added token's content
 * or normalized content (a string lookup, as the reference does).
 */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"
#include "core/alloc.h"

ember_tok_ws *ember_tok_ws_new(const ember_tokenizer *t) {
    if (!t) return NULL;
    ember_tok_ws *ws = ember_calloc(1, sizeof *ws);
    if (!ws) return NULL;
    ws->tok = t;
    if (tok_rx_init(&ws->rx, t->max_caps)) {
        free(ws);
        return NULL;
    }
    return ws;
}

void ember_tok_ws_free(ember_tok_ws *ws) {
    if (!ws) return;
    tok_rx_free(&ws->rx);
    tok_arena_free(&ws->arena);
    tok_pieces_free(&ws->pa);
    tok_pieces_free(&ws->pb);
    tok_pieces_free(&ws->sections);
    tok_pieces_free(&ws->subs);
    tok_buf_free(&ws->tmp);
    tok_buf_free(&ws->tmp2);
    free(ws->sym_id);
    free(ws->sym_off);
    free(ws->sym_len);
    free(ws->sym_prev);
    free(ws->sym_next);
    free(ws->heap);
    tok_ivec_free(&ws->model_out);
    free(ws->cache);
    tok_buf_free(&ws->cache_keys);
    tok_ivec_free(&ws->cache_ids);
    free(ws->segs);
    free(ws->nfc_state);
    free(ws->dbl);
    free(ws->i32a);
    free(ws->i32b);
    free(ws);
}

static int nomem(ember_error *err) { return ember_err(err, EMBER_ERR_NOMEM, "out of memory"); }

/* lstrip / rstrip of added tokens: trims the neighbours in place, in order. */
static void strip_neighbours(const ember_tokenizer *t, tok_pieces *l, bool parse_special) {
    for (size_t i = 0; i < l->n; i++) {
        const tok_added *a = tok_added_lookup(t, l->v[i].p, l->v[i].n, parse_special);
        if (!a) continue;
        if (a->lstrip && i > 0) {
            tok_sv s = tok_trim_end((tok_sv){l->v[i - 1].p, l->v[i - 1].n});
            l->v[i - 1].n = s.n;
        }
        if (a->rstrip && i + 1 < l->n) {
            tok_sv s = tok_trim_start((tok_sv){l->v[i + 1].p, l->v[i + 1].n});
            l->v[i + 1].p = s.p;
            l->v[i + 1].n = s.n;
        }
    }
}

/* remove_space: trim, then runs of JS whitespace -> one space. */
static int collapse_spaces(struct ember_tok_ws *ws, tok_sv s, tok_sv *out) {
    s = tok_trim_end(tok_trim_start(s));
    char *d = tok_arena_alloc(&ws->arena, s.n + 1);
    if (!d) return EMBER_ERR_NOMEM;
    size_t k = 0;
    bool in_space = false;
    const unsigned char *p = (const unsigned char *)s.p, *e = p + s.n;
    while (p < e) {
        uint32_t cp;
        size_t l = tok_utf8_next(p, e, &cp);
        if (ember_js_space(cp)) {
            if (!in_space) d[k++] = ' ';
            in_space = true;
        } else {
            memcpy(d + k, p, l);
            k += l;
            in_space = false;
        }
        p += l;
    }
    out->p = d;
    out->n = k;
    return EMBER_OK;
}

static int encode_section(const ember_tokenizer *t, struct ember_tok_ws *ws, tok_sv sec, size_t si,
                          bool parse_special, tok_ivec *out, ember_error *err) {
    int rc;
    if (t->remove_space && (rc = collapse_spaces(ws, sec, &sec))) return nomem(err);
    if (t->lower_remove_accent) {
        tok_norm a = {.type = TOK_NORM_LOWERCASE}, b = {.type = TOK_NORM_STRIP_ACCENTS};
        if ((rc = tok_normalize(&a, ws, sec, &sec, err)) || (rc = tok_normalize(&b, ws, sec, &sec, err))) return rc;
    }
    if (t->norm && (rc = tok_normalize(t->norm, ws, sec, &sec, err))) return rc;
    if (sec.n == 0) return EMBER_OK;
    tok_pieces subs = {0};
    const tok_trie *tr = parse_special ? (t->has_trie_norm ? &t->trie_norm : NULL)
                                       : (t->has_trie_norm_ns ? &t->trie_norm_ns : NULL);
    rc = tr ? tok_trie_split(t, tr, sec, &subs) : tok_pieces_push(&subs, sec.p, sec.n);
    if (rc) {
        tok_pieces_free(&subs);
        return nomem(err);
    }
    if (tr) strip_neighbours(t, &subs, parse_special);
    for (size_t j = 0; j < subs.n && !rc; j++) {
        tok_piece sub = subs.v[j];
        if (sub.n == 0) continue;
        const tok_added *a = tok_added_lookup(t, sub.p, sub.n, parse_special);
        if (a) {
            if (tok_ivec_push(out, a->id)) rc = nomem(err);
            continue;
        }
        ws->pa.n = 0;
        if (t->pre) {
            tok_pieces one = {0};
            rc = tok_pieces_push(&one, sub.p, sub.n) ? nomem(err) : EMBER_OK;
            if (!rc) rc = tok_pretokenize(t->pre, ws, &one, si, &ws->pa, err);
            tok_pieces_free(&one);
        } else {
            rc = tok_pieces_push(&ws->pa, sub.p, sub.n) ? nomem(err) : EMBER_OK;
        }
        if (!rc) rc = tok_model_encode(t, ws, &ws->pa, out, err);
    }
    tok_pieces_free(&subs);
    return rc;
}

static int put_all(tok_ivec *out, const tok_ivec *seq) {
    if (tok_ivec_reserve(out, seq->n)) return EMBER_ERR_NOMEM;
    if (seq->n) memcpy(out->v + out->n, seq->v, seq->n * sizeof *seq->v);
    out->n += seq->n;
    return EMBER_OK;
}

/* One post-processor step on seq (with special tokens) into out. */
static int post_step(const tok_post *p, const tok_ivec *seq, tok_ivec *out) {
    if (p->type == TOK_POST_TEMPLATE) {
        for (size_t k = 0; k < p->n_single; k++) {
            int32_t it = p->single[k];
            if (it == TOK_POST_SEQ_A) {
                if (put_all(out, seq)) return EMBER_ERR_NOMEM;
            } else if (it >= 0 && tok_ivec_push(out, it)) {
                return EMBER_ERR_NOMEM;
            }
        }
        return EMBER_OK;
    }
    /* Bert / Roberta: [cls] A [sep] */
    if (p->cls_id >= 0 && tok_ivec_push(out, p->cls_id)) return EMBER_ERR_NOMEM;
    if (put_all(out, seq)) return EMBER_ERR_NOMEM;
    if (p->sep_id >= 0 && tok_ivec_push(out, p->sep_id)) return EMBER_ERR_NOMEM;
    return EMBER_OK;
}

static int post_process(const ember_tokenizer *t, tok_ivec *seq, bool add_special, tok_ivec *out) {
    if (!add_special || t->n_posts == 0) return put_all(out, seq);
    tok_ivec a = {0};
    if (put_all(&a, seq)) return EMBER_ERR_NOMEM;
    for (size_t k = 0; k < t->n_posts; k++) {
        tok_ivec b = {0};
        if (post_step(&t->posts[k], &a, &b)) {
            tok_ivec_free(&a);
            tok_ivec_free(&b);
            return EMBER_ERR_NOMEM;
        }
        tok_ivec_free(&a);
        a = b;
    }
    int rc = put_all(out, &a);
    tok_ivec_free(&a);
    return rc;
}

static int encode_ws(const ember_tokenizer *t, struct ember_tok_ws *ws, const char *text, size_t len, unsigned flags,
                     int32_t **ids, size_t *n_ids, ember_error *err) {
    bool parse_special = !(flags & EMBER_TOK_NO_PARSE_SPECIAL);
    tok_arena_reset(&ws->arena);
    tok_sv s;
    if (tok_utf8_sanitize(text, len, &ws->tmp, &s)) return nomem(err);
    tok_ivec seq = {0};
    int rc = EMBER_OK;
    if (s.n > 64 && tok_ivec_reserve(&seq, s.n / 3)) return nomem(err); /* ~3-4 bytes a token */
    tok_pieces *secs = &ws->sections;
    secs->n = 0;
    const tok_trie *tr = parse_special ? (t->has_trie_raw ? &t->trie_raw : NULL)
                                       : (t->has_trie_raw_ns ? &t->trie_raw_ns : NULL);
    if (tr ? tok_trie_split(t, tr, s, secs) : tok_pieces_push(secs, s.p, s.n)) {
        rc = nomem(err);
        goto done;
    }
    if (tr) strip_neighbours(t, secs, parse_special);
    for (size_t i = 0; i < secs->n && !rc; i++) {
        tok_piece sec = secs->v[i];
        if (sec.n == 0) continue;
        const tok_added *a = tok_added_lookup(t, sec.p, sec.n, parse_special);
        if (a) {
            if (tok_ivec_push(&seq, a->id)) rc = nomem(err);
            continue;
        }
        rc = encode_section(t, ws, (tok_sv){sec.p, sec.n}, i, parse_special, &seq, err);
    }
    if (!rc && (!(flags & EMBER_TOK_ADD_SPECIAL) || t->n_posts == 0)) { /* nothing to add: hand over */
        if (seq.cap > seq.n * 2 + 1024) { /* give back the over-reservation */
            int32_t *v = ember_realloc(seq.v, (seq.n ? seq.n : 1) * sizeof *v);
            if (v) seq.v = v;
        }
        *ids = seq.v;
        *n_ids = seq.n;
        seq.v = NULL;
    } else if (!rc) {
        tok_ivec res = {0};
        if (post_process(t, &seq, true, &res)) {
            tok_ivec_free(&res);
            rc = nomem(err);
        } else {
            *ids = res.v;
            *n_ids = res.n;
        }
    }
done:
    tok_ivec_free(&seq);
    /* keep the workspace from holding on to a huge input copy */
    if (ws->tmp.cap > (16u << 20)) tok_buf_free(&ws->tmp);
    return rc;
}

int ember_tok_encode(const ember_tokenizer *t, ember_tok_ws *ws, const char *text, size_t len, unsigned flags,
                     int32_t **ids, size_t *n_ids, ember_error *err) {
    if (!t || !ids || !n_ids || (!text && len))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "ember_tok_encode: NULL argument");
    *ids = NULL;
    *n_ids = 0;
    if (len > TOK_MAX_INPUT_BYTES)
        return ember_err(err, EMBER_ERR_LIMIT, "text of %zu bytes is over the limit of %zu bytes", len,
                         (size_t)TOK_MAX_INPUT_BYTES);
    if (ws && ws->tok != t)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "ember_tok_encode: workspace belongs to another tokenizer");
    if (!text) text = "";
    ember_err_clear(err);
    ember_tok_ws *tmp = ws ? NULL : ember_tok_ws_new(t);
    if (!ws && !tmp) return nomem(err);
    int rc = encode_ws(t, ws ? ws : tmp, text, len, flags, ids, n_ids, err);
    ember_tok_ws_free(tmp);
    /* the word-level helpers return a bare status: the message is made here */
    if (rc && err && err->code == EMBER_OK) rc = rc == EMBER_ERR_NOMEM ? nomem(err) : ember_err(err, rc, "encoding failed");
    return rc;
}
