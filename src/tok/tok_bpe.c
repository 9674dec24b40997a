/*
 * tok_bpe.c - the BPE model (merges by rank, byte-level or per character,
 * byte fallback, ignore_merges, fuse_unk) and the model dispatcher.
 *
 * Owner: tokenizer module; runs on the calling thread with its workspace
 * (symbol arrays, the merge heap and the word cache live there).
 *
 * Algorithm: the word starts as one symbol per byte (byte-level models) or
 * per character; the adjacent pair with the lowest merge rank is merged,
 * the leftmost one first among equal ranks, until no pair has a merge. A
 * binary heap holds candidate pairs keyed (rank << 32 | position); a popped
 * entry is stale when its pair no longer has that rank (ranks identify
 * merges uniquely), so no deletion is needed: O(n log n) per word.
 * This is the reference's order exactly (its float tie-break rank + i/len
 * orders by rank, then position).
 *
 * Symbols absent from the vocabulary (and merges whose parts or result are
 * absent) use "phantom" ids above the real ones; they never reach the
 * output: such a symbol becomes its <0xXX> byte tokens (byte_fallback, when
 * all exist), else the unknown token, else nothing.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"
#include "core/alloc.h"

static int nomem(ember_error *err) { return ember_err(err, EMBER_ERR_NOMEM, "out of memory"); }

static int ensure_syms(struct ember_tok_ws *ws, size_t n) {
    if (n <= ws->sym_cap) return EMBER_OK;
    size_t cap = ws->sym_cap ? ws->sym_cap : 256;
    while (cap < n) cap *= 2;
    int32_t *a = ember_realloc(ws->sym_id, cap * sizeof *a);
    if (a) ws->sym_id = a;
    uint32_t *b = ember_realloc(ws->sym_off, cap * sizeof *b);
    if (b) ws->sym_off = b;
    uint32_t *c = ember_realloc(ws->sym_len, cap * sizeof *c);
    if (c) ws->sym_len = c;
    int32_t *d = ember_realloc(ws->sym_prev, cap * sizeof *d);
    if (d) ws->sym_prev = d;
    int32_t *e = ember_realloc(ws->sym_next, cap * sizeof *e);
    if (e) ws->sym_next = e;
    uint64_t *h = ember_realloc(ws->heap, cap * 2 * sizeof *h);
    if (h) ws->heap = h;
    if (!a || !b || !c || !d || !e || !h) return EMBER_ERR_NOMEM;
    ws->sym_cap = cap;
    ws->heap_cap = cap * 2;
    return EMBER_OK;
}

/* ---- heap (min on key) ------------------------------------------------------ */

static int heap_push(struct ember_tok_ws *ws, uint64_t key) {
    if (ws->heap_n == ws->heap_cap) {
        size_t cap = ws->heap_cap * 2;
        uint64_t *h = ember_realloc(ws->heap, cap * sizeof *h);
        if (!h) return EMBER_ERR_NOMEM;
        ws->heap = h;
        ws->heap_cap = cap;
    }
    uint64_t *h = ws->heap;
    size_t i = ws->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= key) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = key;
    return EMBER_OK;
}

static uint64_t heap_pop(struct ember_tok_ws *ws) {
    uint64_t *h = ws->heap;
    uint64_t top = h[0];
    uint64_t last = h[--ws->heap_n];
    size_t n = ws->heap_n, i = 0;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= n) break;
        size_t c = (l + 1 < n && h[l + 1] < h[l]) ? l + 1 : l;
        if (h[c] >= last) break;
        h[i] = h[c];
        i = c;
    }
    if (n) h[i] = last;
    return top;
}

static inline bool pair_rank(const tok_model *m, int32_t a, int32_t b, uint32_t *rank, int32_t *merged) {
    if (a < 0 || b < 0) return false;
    uint64_t v;
    if (!tok_umap_get(&m->merges, ((uint64_t)(uint32_t)a << 32) | (uint32_t)b, &v)) return false;
    *rank = (uint32_t)(v >> 32);
    *merged = (int32_t)(uint32_t)v;
    return true;
}

/* Whether id is a real token (the reference's tokens_to_ids.has). */
static inline bool real_id(const ember_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_all && !(t->flags[id] & TOK_F_PHANTOM) && t->text[id].p;
}

/* ---- cache ----------------------------------------------------------------- */

static bool cache_get(const ember_tokenizer *t, struct ember_tok_ws *ws, const char *p, size_t n, uint64_t h,
                      tok_ivec *out) {
    (void)t;
    if (!ws->cache) return false;
    size_t mask = TOK_BPE_CACHE_SLOTS - 1, j = (size_t)h & mask;
    for (;;) {
        tok_cache_ent *e = &ws->cache[j];
        if (!e->key_n) return false;
        if (e->h == h && e->key_n == n && memcmp(ws->cache_keys.p + e->key_off, p, n) == 0) {
            if (!e->ids_n) return true;
            if (out->n + e->ids_n > out->cap && tok_ivec_reserve(out, e->ids_n)) return false;
            const int32_t *src = ws->cache_ids.v + e->ids_off;
            int32_t *dst = out->v + out->n;
            for (uint32_t k = 0; k < e->ids_n; k++) dst[k] = src[k]; /* usually 1-3 ids */
            out->n += e->ids_n;
            return true;
        }
        j = (j + 1) & mask;
    }
}

static void cache_put(struct ember_tok_ws *ws, const char *p, size_t n, uint64_t h, const int32_t *ids,
                      size_t n_ids) {
    if (n == 0 || n > TOK_BPE_CACHE_MAX_KEY) return;
    if (!ws->cache) {
        ws->cache = ember_calloc(TOK_BPE_CACHE_SLOTS, sizeof *ws->cache);
        if (!ws->cache) return;
    }
    if (ws->cache_used >= TOK_BPE_CACHE_SLOTS / 2 || ws->cache_keys.n > (64u << 20)) {
        memset(ws->cache, 0, TOK_BPE_CACHE_SLOTS * sizeof *ws->cache);
        ws->cache_used = 0;
        ws->cache_keys.n = 0;
        ws->cache_ids.n = 0;
    }
    size_t koff = ws->cache_keys.n, ioff = ws->cache_ids.n;
    if (tok_buf_put(&ws->cache_keys, p, n)) return;
    if (tok_ivec_reserve(&ws->cache_ids, n_ids)) return;
    if (n_ids) memcpy(ws->cache_ids.v + ioff, ids, n_ids * sizeof *ids);
    ws->cache_ids.n += n_ids;
    size_t mask = TOK_BPE_CACHE_SLOTS - 1, j = (size_t)h & mask;
    while (ws->cache[j].key_n) j = (j + 1) & mask;
    ws->cache[j] = (tok_cache_ent){h, (uint32_t)koff, (uint32_t)n, (uint32_t)ioff, (uint32_t)n_ids};
    ws->cache_used++;
}

/* ---- unknown symbols ------------------------------------------------------------ */

/* Appends the fallback for a symbol whose text (as the model sees it:
   mapped characters for byte-level models) is s[0..n). */
static int emit_unknown(const ember_tokenizer *t, const char *s, size_t n, tok_ivec *out) {
    const tok_model *m = &t->model;
    if (m->byte_fallback) {
        bool all = true;
        for (size_t i = 0; i < n && all; i++) all = m->byte_tok[(unsigned char)s[i]] >= 0;
        if (all) {
            for (size_t i = 0; i < n; i++)
                if (tok_ivec_push(out, tok_final_id(t, m->byte_tok[(unsigned char)s[i]]))) return EMBER_ERR_NOMEM;
            return EMBER_OK;
        }
    }
    if (m->unk_str && m->unk_id >= 0) return tok_ivec_push(out, tok_final_id(t, m->unk_id));
    return EMBER_OK;
}

/* The model-side text of symbol k (byte-level: mapped characters). */
static int sym_text(const ember_tokenizer *t, struct ember_tok_ws *ws, const char *p, uint32_t off, uint32_t len,
                    bool last, tok_buf *b) {
    b->n = 0;
    if (t->model.byte_mode) {
        for (uint32_t i = 0; i < len; i++)
            if (tok_buf_put_cp(b, tok_byte_to_cp[(unsigned char)p[off + i]])) return EMBER_ERR_NOMEM;
    } else if (tok_buf_put(b, p + off, len)) {
        return EMBER_ERR_NOMEM;
    }
    if (last && t->model.eow_n && tok_buf_put(b, t->model.eow_suffix, t->model.eow_n)) return EMBER_ERR_NOMEM;
    (void)ws;
    return EMBER_OK;
}

int tok_bpe_word(const ember_tokenizer *t, struct ember_tok_ws *ws, const char *p, size_t n, tok_ivec *out,
                 ember_error *err) {
    const tok_model *m = &t->model;
    if (n == 0) return EMBER_OK;
    if (m->ignore_merges) {
        int32_t id = m->byte_mode ? tok_smap_get(&m->raw_map, p, n) : tok_smap_get(&t->map, p, n);
        if (real_id(t, id)) return tok_ivec_push(out, tok_final_id(t, id)) ? nomem(err) : EMBER_OK;
    }
    uint64_t h = 0;
    bool cacheable = n <= TOK_BPE_CACHE_MAX_KEY;
    if (cacheable) {
        h = tok_hash(p, n);
        if (cache_get(t, ws, p, n, h, out)) return EMBER_OK;
    }
    if (n > UINT32_MAX / 2) return ember_err(err, EMBER_ERR_LIMIT, "a pre-tokenized piece of %zu bytes", n);
    if (ensure_syms(ws, n + 1)) return nomem(err);
    int32_t *id = ws->sym_id, *prv = ws->sym_prev, *nxt = ws->sym_next;
    uint32_t *off = ws->sym_off, *len = ws->sym_len;
    size_t ns = 0;
    if (m->byte_mode) {
        for (size_t i = 0; i < n; i++) {
            id[ns] = m->byte_sym[(unsigned char)p[i]];
            off[ns] = (uint32_t)i;
            len[ns] = 1;
            ns++;
        }
    } else {
        const unsigned char *q = (const unsigned char *)p, *e = q + n;
        while (q < e) {
            size_t l = tok_utf8_len(*q);
            if (l > (size_t)(e - q)) l = (size_t)(e - q);
            off[ns] = (uint32_t)((const char *)q - p);
            len[ns] = (uint32_t)l;
            id[ns] = l == 1 && *q < 0x80 ? m->ascii_sym[*q] : tok_smap_get(&t->map, (const char *)q, l);
            ns++;
            q += l;
        }
    }
    if (m->eow_n) { /* the last symbol carries the end-of-word suffix */
        tok_buf *b = &ws->tmp2;
        if (sym_text(t, ws, p, off[ns - 1], len[ns - 1], true, b)) return nomem(err);
        id[ns - 1] = tok_smap_get(&t->map, b->p, b->n);
    }
    for (size_t i = 0; i < ns; i++) {
        prv[i] = (int32_t)i - 1;
        nxt[i] = i + 1 < ns ? (int32_t)(i + 1) : -1;
    }
    if (ns > 1) {
        ws->heap_n = 0;
        for (size_t i = 0; i + 1 < ns; i++) {
            uint32_t r;
            int32_t mid;
            if (pair_rank(m, id[i], id[i + 1], &r, &mid) && heap_push(ws, ((uint64_t)r << 32) | i)) return nomem(err);
        }
        while (ws->heap_n) {
            uint64_t key = heap_pop(ws);
            uint32_t r = (uint32_t)(key >> 32), i = (uint32_t)key;
            if (len[i] == 0) continue; /* merged away */
            int32_t j = nxt[i];
            if (j < 0) continue;
            uint32_t r2;
            int32_t mid;
            if (!pair_rank(m, id[i], id[j], &r2, &mid) || r2 != r) continue; /* stale */
            id[i] = mid;
            len[i] += len[j];
            len[j] = 0;
            nxt[i] = nxt[j];
            if (nxt[j] >= 0) prv[nxt[j]] = (int32_t)i;
            if (prv[i] >= 0) {
                uint32_t pi = (uint32_t)prv[i];
                if (pair_rank(m, id[pi], id[i], &r2, &mid) && heap_push(ws, ((uint64_t)r2 << 32) | pi))
                    return nomem(err);
            }
            if (nxt[i] >= 0) {
                if (pair_rank(m, id[i], id[nxt[i]], &r2, &mid) && heap_push(ws, ((uint64_t)r2 << 32) | i))
                    return nomem(err);
            }
        }
    }
    size_t first = out->n;
    for (int32_t i = 0; i >= 0; i = nxt[i]) {
        bool last = nxt[i] < 0;
        int32_t sid = id[i];
        if (m->cont_n && !last) { /* continuing_subword_suffix on all but the last */
            tok_buf *b = &ws->tmp2;
            if (sym_text(t, ws, p, off[i], len[i], false, b) || tok_buf_put(b, m->cont_suffix, m->cont_n))
                return nomem(err);
            sid = tok_smap_get(&t->map, b->p, b->n);
        }
        if (real_id(t, sid)) {
            if (tok_ivec_push(out, tok_final_id(t, sid))) return nomem(err);
        } else {
            tok_buf *b = &ws->tmp2;
            if (sym_text(t, ws, p, off[i], len[i], last, b)) return nomem(err);
            if (m->cont_n && !last && tok_buf_put(b, m->cont_suffix, m->cont_n)) return nomem(err);
            if (emit_unknown(t, b->p, b->n, out)) return nomem(err);
        }
    }
    /* out->v is NULL while nothing was ever pushed: no pointer arithmetic on it then */
    if (cacheable) cache_put(ws, p, n, h, out->n > first ? out->v + first : NULL, out->n - first);
    return EMBER_OK;
}

int tok_model_encode(const ember_tokenizer *t, struct ember_tok_ws *ws, const tok_pieces *pieces, tok_ivec *out,
                     ember_error *err) {
    size_t first = out->n;
    for (size_t i = 0; i < pieces->n; i++) {
        int rc;
        const tok_piece *pc = &pieces->v[i];
        switch (t->model.type) {
        case TOK_MODEL_BPE: rc = tok_bpe_word(t, ws, pc->p, pc->n, out, err); break;
        case TOK_MODEL_WORDPIECE: rc = tok_wordpiece_word(t, ws, pc->p, pc->n, out, err); break;
        default: rc = tok_unigram_word(t, ws, pc->p, pc->n, out, err); break;
        }
        if (rc) return rc;
    }
    if (t->model.fuse_unk && t->model.unk_id >= 0) { /* runs of unknown tokens collapse */
        int32_t unk = tok_final_id(t, t->model.unk_id);
        size_t w = first;
        for (size_t r = first; r < out->n; r++) {
            if (out->v[r] == unk && w > first && out->v[w - 1] == unk) continue;
            out->v[w++] = out->v[r];
        }
        out->n = w;
    }
    return EMBER_OK;
}

void tok_model_free(tok_model *m) {
    tok_umap_free(&m->merges);
    tok_smap_free(&m->raw_map);
    free(m->eow_suffix);
    free(m->cont_suffix);
    free(m->cont_prefix);
    free(m->word_prefix);
    free(m->unk_str);
    free(m->scores);
    if (m->pieces) {
        tok_trie_free(m->pieces);
        free(m->pieces);
    }
    memset(m, 0, sizeof *m);
}
