/*
 * tok_unigram.c - the Unigram model: Viterbi over a lattice of vocabulary
 * pieces (scores are log probabilities), the unknown token for characters
 * no single-character piece covers (score: lowest score - 10).
 *
 * Owner: tokenizer module; runs on the calling thread with its workspace.
 * Tie-breaking follows the reference: for each end position the first best
 * candidate in insertion order (start ascending) wins; runs of unknown
 * tokens are fused (the reference always fuses for Unigram).
 */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"
#include "core/alloc.h"

static int grow(struct ember_tok_ws *ws, size_t n) {
    if (n <= ws->dbl_cap && n <= ws->i32_cap) return EMBER_OK;
    size_t cap = n < 256 ? 256 : n;
    double *d = ember_realloc(ws->dbl, cap * sizeof *d);
    if (d) ws->dbl = d;
    int32_t *a = ember_realloc(ws->i32a, cap * sizeof *a);
    if (a) ws->i32a = a;
    int32_t *b = ember_realloc(ws->i32b, cap * sizeof *b);
    if (b) ws->i32b = b;
    if (!d || !a || !b) return EMBER_ERR_NOMEM;
    ws->dbl_cap = ws->i32_cap = cap;
    return EMBER_OK;
}

int tok_unigram_word(const ember_tokenizer *t, struct ember_tok_ws *ws, const char *p, size_t n, tok_ivec *out,
                     ember_error *err) {
    const tok_model *m = &t->model;
    if (n == 0) return EMBER_OK;
    if (n >= (size_t)INT32_MAX) return ember_err(err, EMBER_ERR_LIMIT, "a piece of %zu bytes", n);
    /* positions are byte offsets of character starts; arrays indexed by byte */
    if (grow(ws, n + 1)) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    double *best = ws->dbl;  /* best score of a path ending at byte i */
    int32_t *tok = ws->i32a; /* token of that path's last node (-2 = unk) */
    int32_t *from = ws->i32b; /* its start */
    for (size_t i = 0; i <= n; i++) {
        from[i] = -1;
        tok[i] = -1;
    }
    best[0] = 0;
    from[0] = 0;
    for (size_t b = 0; b < n;) {
        size_t cl = tok_utf8_len((unsigned char)p[b]);
        if (cl > n - b) cl = n - b;
        if (from[b] < 0) { /* unreachable: cannot happen, every char has a node */
            b += cl;
            continue;
        }
        double base = best[b];
        bool single = false;
        /* every vocabulary piece starting at b, shortest first */
        uint64_t node = 0;
        for (size_t e = b; e < n;) {
            uint64_t child;
            if (!m->pieces || !tok_umap_get(&m->pieces->edges, (node << 8) | (unsigned char)p[e], &child)) break;
            node = child;
            e++;
            int32_t id = m->pieces->term[node] - 1;
            if (id < 0 || (size_t)id >= m->n_scores) continue;
            if (e - b == cl) single = true;
            double sc = base + m->scores[id];
            if (from[e] < 0 || sc > best[e]) {
                best[e] = sc;
                tok[e] = id;
                from[e] = (int32_t)b;
            }
        }
        if (!single) {
            double sc = base + m->unk_score;
            size_t e2 = b + cl;
            if (from[e2] < 0 || sc > best[e2]) {
                best[e2] = sc;
                tok[e2] = -2;
                from[e2] = (int32_t)b;
            }
        }
        b += cl;
    }
    /* backtrack */
    size_t cnt = 0;
    for (int32_t e = (int32_t)n; e > 0; e = from[e]) cnt++;
    if (tok_ivec_reserve(out, cnt)) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    size_t w = out->n + cnt;
    out->n = w;
    int32_t unk = m->unk_id >= 0 ? tok_final_id(t, m->unk_id) : -1;
    for (int32_t e = (int32_t)n; e > 0; e = from[e]) {
        int32_t id = tok[e];
        /* the reference maps the piece text back to an id */
        int32_t fid = id == -2 ? tok_smap_get(&t->map, p + from[e], (size_t)(e - from[e])) : id;
        if (fid < 0 || (t->flags[fid] & TOK_F_PHANTOM)) fid = unk;
        else fid = tok_final_id(t, fid);
        out->v[--w] = fid;
    }
    /* drop unresolvable unknowns (no unk token) */
    size_t r = w, k = w;
    for (; r < out->n; r++)
        if (out->v[r] >= 0) out->v[k++] = out->v[r];
    out->n = k;
    return EMBER_OK;
}
