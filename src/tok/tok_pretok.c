/*
 * tok_pretok.c - pre-tokenizers: Split, ByteLevel, Metaspace, Whitespace,
 * WhitespaceSplit, BertPreTokenizer, Punctuation, Digits, Replace,
 * FixedLength, Sequence.
 *
 * Owner: tokenizer module; runs on the calling thread with its workspace.
 * Pieces point into the input, the workspace arena or nowhere else; no
 * pre-tokenizer frees anything.
 *
 * Semantics are the reference's (node), which uses JavaScript regexes:
 * Whitespace / WhitespaceSplit / BertPreTokenizer and ByteLevel's built-in
 * GPT-2 regex use JavaScript's \s (which includes U+FEFF but not U+0085),
 * Digits uses ASCII digits, Punctuation keeps runs of punctuation together.
 * Where the reference lacks a feature the HuggingFace (Rust) meaning is
 * used: Split behaviours Removed, MergedWithPrevious, MergedWithNext and
 * Contiguous, Split invert (the delimiters become the pieces), and
 * Metaspace split = true (pieces start at each replacement character).
 * FixedLength counts code points (the reference counts UTF-16 units).
 */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"
#include "core/alloc.h"

static int nomem(ember_error *err) { return ember_err(err, EMBER_ERR_NOMEM, "out of memory"); }

static int push(tok_pieces *out, const char *p, size_t n, ember_error *err) {
    return tok_pieces_push(out, p, n) ? nomem(err) : EMBER_OK;
}

/* Every match of pat in the piece becomes a piece (JS String#match with /g). */
static int match_all(const tok_pattern *pat, struct ember_tok_ws *ws, tok_piece pc, tok_pieces *out,
                     ember_error *err) {
    size_t pos = 0;
    while (pos <= pc.n) {
        size_t ms, me;
        int rc = tok_pattern_find(pat, &ws->rx, pc.p, pc.n, pos, &ms, &me, err);
        if (rc < 0) return rc;
        if (rc == 0) break;
        if (push(out, pc.p + ms, me - ms, err)) return EMBER_ERR_NOMEM;
        if (me == ms) {
            if (me >= pc.n) break;
            pos = me + tok_utf8_len((unsigned char)pc.p[me]);
        } else {
            pos = me;
        }
    }
    return EMBER_OK;
}

static int seg_push(struct ember_tok_ws *ws, size_t *n, size_t s, size_t e, bool m) {
    if (*n == ws->segs_cap) {
        size_t cap = ws->segs_cap ? ws->segs_cap * 2 : 64;
        void *p = ember_realloc(ws->segs, cap * sizeof *ws->segs);
        if (!p) return EMBER_ERR_NOMEM;
        ws->segs = p;
        ws->segs_cap = cap;
    }
    ws->segs[*n].s = s;
    ws->segs[*n].e = e;
    ws->segs[*n].m = m;
    (*n)++;
    return EMBER_OK;
}

/* Splits one piece by pattern with a behaviour (see the file comment). */
static int split_piece(const tok_pattern *pat, tok_split_behavior beh, bool invert, struct ember_tok_ws *ws,
                       tok_piece pc, tok_pieces *out, ember_error *err) {
    size_t pos = 0, prev = 0;
    if (beh == TOK_SPLIT_ISOLATED && !invert) { /* the common case: gaps and matches */
        while (pos <= pc.n) {
            size_t ms, me;
            int rc = tok_pattern_find(pat, &ws->rx, pc.p, pc.n, pos, &ms, &me, err);
            if (rc < 0) return rc;
            if (rc == 0) break;
            if (ms > prev && push(out, pc.p + prev, ms - prev, err)) return EMBER_ERR_NOMEM;
            if (me > ms && push(out, pc.p + ms, me - ms, err)) return EMBER_ERR_NOMEM;
            prev = me;
            if (me == ms) {
                if (me >= pc.n) break;
                pos = me + tok_utf8_len((unsigned char)pc.p[me]);
            } else {
                pos = me;
            }
        }
        if (prev < pc.n && push(out, pc.p + prev, pc.n - prev, err)) return EMBER_ERR_NOMEM;
        return EMBER_OK;
    }
    /* general: segments (offsets, is_delimiter) covering the piece */
    size_t ns = 0;
    while (pos <= pc.n) {
        size_t ms, me;
        int rc = tok_pattern_find(pat, &ws->rx, pc.p, pc.n, pos, &ms, &me, err);
        if (rc < 0) return rc;
        if (rc == 0) break;
        if (ms > prev && seg_push(ws, &ns, prev, ms, invert)) return nomem(err);
        if (seg_push(ws, &ns, ms, me, !invert)) return nomem(err);
        prev = me;
        if (me == ms) {
            if (me >= pc.n) break;
            pos = me + tok_utf8_len((unsigned char)pc.p[me]);
        } else {
            pos = me;
        }
    }
    if (prev < pc.n && seg_push(ws, &ns, prev, pc.n, invert)) return nomem(err);
    struct tok_seg *sg = ws->segs;
    size_t k = 0; /* merged segments written to sg[0..k) */
    bool prev_m = false;
    switch (beh) {
    case TOK_SPLIT_ISOLATED:
        k = ns;
        for (size_t i = 0; i < k; i++) sg[i].m = false;
        break;
    case TOK_SPLIT_REMOVED:
        k = ns;
        break;
    case TOK_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < ns; i++) {
            bool m = sg[i].m;
            if (m == prev_m && k > 0)
                sg[k - 1].e = sg[i].e;
            else
                sg[k++] = (struct tok_seg){sg[i].s, sg[i].e, false};
            prev_m = m;
        }
        break;
    case TOK_SPLIT_MERGED_WITH_PREVIOUS:
        for (size_t i = 0; i < ns; i++) {
            bool m = sg[i].m;
            if (m && !prev_m && k > 0)
                sg[k - 1].e = sg[i].e;
            else
                sg[k++] = (struct tok_seg){sg[i].s, sg[i].e, false};
            prev_m = m;
        }
        break;
    case TOK_SPLIT_MERGED_WITH_NEXT: {
        /* right to left; the merged list is built from the end */
        size_t w = ns;
        for (size_t i = ns; i-- > 0;) {
            bool m = sg[i].m;
            if (m && !prev_m && w < ns)
                sg[w].s = sg[i].s;
            else
                sg[--w] = (struct tok_seg){sg[i].s, sg[i].e, false};
            prev_m = m;
        }
        memmove(sg, sg + w, (ns - w) * sizeof *sg);
        k = ns - w;
        break;
    }
    }
    for (size_t i = 0; i < k; i++)
        if (!sg[i].m && sg[i].e > sg[i].s && push(out, pc.p + sg[i].s, sg[i].e - sg[i].s, err))
            return EMBER_ERR_NOMEM;
    return EMBER_OK;
}

static int byte_map(struct ember_tok_ws *ws, tok_piece pc, tok_pieces *out, ember_error *err) {
    char *d = tok_arena_alloc(&ws->arena, pc.n * 2 + 1);
    if (!d) return nomem(err);
    size_t k = 0;
    for (size_t i = 0; i < pc.n; i++) k += ember_utf8_put(tok_byte_to_cp[(unsigned char)pc.p[i]], d + k);
    return push(out, d, k, err);
}

static int pre_one(const tok_pretok *pt, struct ember_tok_ws *ws, tok_piece pc, size_t si, tok_pieces *out,
                   ember_error *err);

static int pre_list(const tok_pretok *pt, struct ember_tok_ws *ws, const tok_pieces *in, size_t si,
                    tok_pieces *out, ember_error *err) {
    for (size_t i = 0; i < in->n; i++) {
        int rc = pre_one(pt, ws, in->v[i], si, out, err);
        if (rc) return rc;
    }
    return EMBER_OK;
}

static int pre_one(const tok_pretok *pt, struct ember_tok_ws *ws, tok_piece pc, size_t si, tok_pieces *out,
                   ember_error *err) {
    switch (pt->type) {
    case TOK_PRE_BYTELEVEL: {
        if (pt->add_prefix_space && !(pc.n > 0 && pc.p[0] == ' ')) {
            char *d = tok_arena_alloc(&ws->arena, pc.n + 1);
            if (!d) return nomem(err);
            d[0] = ' ';
            if (pc.n) memcpy(d + 1, pc.p, pc.n);
            pc.p = d;
            pc.n++;
        }
        if (!pt->use_regex) return pt->map_bytes ? byte_map(ws, pc, out, err) : push(out, pc.p, pc.n, err);
        if (!pt->map_bytes) return match_all(&pt->pat, ws, pc, out, err);
        size_t first = out->n;
        int rc = match_all(&pt->pat, ws, pc, out, err);
        if (rc) return rc;
        /* map the new pieces in place */
        size_t last = out->n;
        for (size_t i = first; i < last; i++) {
            tok_piece q = out->v[i];
            char *d = tok_arena_alloc(&ws->arena, q.n * 2 + 1);
            if (!d) return nomem(err);
            size_t k = 0;
            for (size_t j = 0; j < q.n; j++) k += ember_utf8_put(tok_byte_to_cp[(unsigned char)q.p[j]], d + k);
            out->v[i].p = d;
            out->v[i].n = k;
        }
        return EMBER_OK;
    }
    case TOK_PRE_SPLIT:
        return split_piece(&pt->pat, pt->behavior, pt->invert, ws, pc, out, err);
    case TOK_PRE_METASPACE: {
        /* spaces -> replacement; maybe a leading replacement; maybe split */
        size_t cnt = 0;
        for (size_t i = 0; i < pc.n; i++) cnt += pc.p[i] == ' ';
        bool prepend = false;
        if (pt->prepend == TOK_PREPEND_ALWAYS || (pt->prepend == TOK_PREPEND_FIRST && si == 0)) {
            bool starts = pc.n >= pt->repl_n && memcmp(pc.p, pt->repl, pt->repl_n) == 0;
            if (!starts && cnt > 0 && pc.p[0] == ' ') starts = true; /* ' ' becomes the replacement */
            prepend = !starts;
        }
        size_t len = pc.n + cnt * (pt->repl_n - 1) + (prepend ? pt->repl_n : 0);
        char *d = tok_arena_alloc(&ws->arena, len + 1);
        if (!d) return nomem(err);
        size_t k = 0;
        if (prepend) {
            memcpy(d, pt->repl, pt->repl_n);
            k = pt->repl_n;
        }
        for (size_t i = 0; i < pc.n; i++) {
            if (pc.p[i] == ' ') {
                memcpy(d + k, pt->repl, pt->repl_n);
                k += pt->repl_n;
            } else {
                d[k++] = pc.p[i];
            }
        }
        tok_piece q = {d, k};
        if (!pt->split) return push(out, q.p, q.n, err);
        /* pieces begin at each replacement (MergedWithNext) */
        size_t start = 0;
        for (size_t i = 0; i + pt->repl_n <= k;) {
            if (memcmp(d + i, pt->repl, pt->repl_n) == 0) {
                /* a replacement right after another one stays alone */
                if (i > start && push(out, d + start, i - start, err)) return EMBER_ERR_NOMEM;
                start = i;
                i += pt->repl_n;
            } else {
                i++;
            }
        }
        if (k > start && push(out, d + start, k - start, err)) return EMBER_ERR_NOMEM;
        return EMBER_OK;
    }
    case TOK_PRE_WHITESPACE:
    case TOK_PRE_WHITESPACE_SPLIT:
    case TOK_PRE_PUNCTUATION:
    case TOK_PRE_DIGITS:
        return match_all(&pt->pat, ws, pc, out, err);
    case TOK_PRE_BERT: {
        tok_sv s = {pc.p, pc.n};
        s = tok_trim_end(tok_trim_start(s));
        tok_piece q = {s.p, s.n};
        return match_all(&pt->pat, ws, q, out, err);
    }
    case TOK_PRE_REPLACE: {
        tok_buf b = {0};
        int rc = tok_pattern_replace_all(&pt->pat, &ws->rx, pc.p, pc.n, pt->repl, pt->repl_n, &b, err);
        if (!rc) {
            char *d = tok_arena_strdup(&ws->arena, b.p ? b.p : "", b.n);
            rc = d ? push(out, d, b.n, err) : nomem(err);
        }
        tok_buf_free(&b);
        return rc;
    }
    case TOK_PRE_FIXED_LENGTH: {
        size_t i = 0;
        while (i < pc.n) {
            size_t j = i, c = 0;
            while (j < pc.n && c < pt->length) {
                j += tok_utf8_len((unsigned char)pc.p[j]);
                c++;
            }
            if (j > pc.n) j = pc.n;
            if (push(out, pc.p + i, j - i, err)) return EMBER_ERR_NOMEM;
            i = j;
        }
        return EMBER_OK;
    }
    case TOK_PRE_SEQUENCE: {
        tok_pieces a = {0}, b = {0};
        int rc = push(&a, pc.p, pc.n, err);
        for (size_t k = 0; !rc && k < pt->n_kids; k++) {
            b.n = 0;
            rc = pre_list(&pt->kids[k], ws, &a, si, &b, err);
            tok_pieces t = a;
            a = b;
            b = t;
        }
        for (size_t i = 0; !rc && i < a.n; i++) rc = push(out, a.v[i].p, a.v[i].n, err);
        tok_pieces_free(&a);
        tok_pieces_free(&b);
        return rc;
    }
    }
    return EMBER_OK;
}

int tok_pretokenize(const tok_pretok *pt, struct ember_tok_ws *ws, const tok_pieces *in, size_t si,
                    tok_pieces *out, ember_error *err) {
    return pre_list(pt, ws, in, si, out, err);
}

void tok_pretok_free(tok_pretok *pt) {
    if (!pt) return;
    tok_pattern_free(&pt->pat);
    free(pt->repl);
    for (size_t k = 0; k < pt->n_kids; k++) tok_pretok_free(&pt->kids[k]);
    free(pt->kids);
    memset(pt, 0, sizeof *pt);
}
