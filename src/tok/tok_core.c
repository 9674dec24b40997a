/*
 * tok_core.c - the tokenizer object: building it (ids, texts, added tokens,
 * merges, the derived tables), freeing it, and the vocabulary getters.
 *
 * Owner: tokenizer module. Builders run on the loading thread before the
 * object is published; afterwards nothing here mutates it.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"
#include "core/alloc.h"

int tok_new(const char *name, ember_tokenizer **out, ember_error *err) {
    ember_tokenizer *t = ember_calloc(1, sizeof *t);
    if (!t) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", name);
    t->name = tok_arena_strdup(&t->pool, name, strlen(name));
    if (!t->name) {
        free(t);
        return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", name);
    }
    t->model.unk_id = -1;
    t->model.max_chars = 100;
    for (int b = 0; b < 256; b++) t->model.byte_sym[b] = t->model.byte_tok[b] = -1;
    t->bos_id = t->eos_id = t->pad_id = t->unk_cfg_id = -1;
    t->cleanup = true;
    *out = t;
    return EMBER_OK;
}

static int grow_ids(ember_tokenizer *t, int32_t need, ember_error *err) {
    if ((size_t)need <= t->id_cap) return EMBER_OK;
    if (need > TOK_MAX_VOCAB * 2)
        return ember_err(err, EMBER_ERR_LIMIT, "%s: more than %d token ids", t->name, TOK_MAX_VOCAB);
    size_t cap = t->id_cap ? t->id_cap : 1024;
    while (cap < (size_t)need) cap *= 2;
    tok_sv *tx = ember_realloc(t->text, cap * sizeof *tx);
    if (!tx) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name);
    t->text = tx;
    uint8_t *fl = ember_realloc(t->flags, cap);
    if (!fl) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name);
    t->flags = fl;
    for (size_t i = t->id_cap; i < cap; i++) {
        t->text[i].p = NULL;
        t->text[i].n = 0;
        t->flags[i] = 0;
    }
    t->id_cap = cap;
    return EMBER_OK;
}

int tok_set_text(ember_tokenizer *t, int32_t id, const char *s, size_t n, ember_error *err) {
    return tok_set_text_h(t, id, s, n, tok_hash(s, n), err);
}

int tok_set_text_h(ember_tokenizer *t, int32_t id, const char *s, size_t n, uint64_t h, ember_error *err) {
    if (id < 0 || id >= TOK_MAX_VOCAB)
        return ember_err(err, EMBER_ERR_LIMIT, "%s: token id %ld outside [0, %d)", t->name, (long)id, TOK_MAX_VOCAB);
    if (n > TOK_MAX_TOKEN_BYTES)
        return ember_err(err, EMBER_ERR_LIMIT, "%s: token %ld is %zu bytes long (limit %d)", t->name, (long)id, n,
                         TOK_MAX_TOKEN_BYTES);
    if (t->n_all > t->n_ids)
        return ember_err(err, EMBER_ERR_INTERNAL, "%s: token text set after merges", t->name);
    int rc = grow_ids(t, id + 1, err);
    if (rc) return rc;
    char *p = tok_arena_strdup(&t->pool, s, n);
    if (!p) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name);
    t->text[id].p = p;
    t->text[id].n = n;
    if (id >= t->n_ids) t->n_ids = t->n_all = id + 1;
    int32_t prev;
    if (tok_smap_put_h(&t->map, p, n, h, id, true, &prev)) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name);
    /* the map names id for this text now; an earlier id with the same text no longer */
    t->flags[id] &= (uint8_t)~TOK_F_SHADOWED;
    if (prev >= 0 && prev != id) t->flags[prev] |= TOK_F_SHADOWED;
    return EMBER_OK;
}

int tok_id_or_phantom(ember_tokenizer *t, const char *s, size_t n, int32_t *id, ember_error *err) {
    return tok_id_or_phantom_h(t, s, n, tok_hash(s, n), id, err);
}

int tok_id_or_phantom_h(ember_tokenizer *t, const char *s, size_t n, uint64_t h, int32_t *id, ember_error *err) {
    int32_t k = tok_smap_get_h(&t->map, s, n, h);
    if (k >= 0) {
        *id = k;
        return EMBER_OK;
    }
    if (n > TOK_MAX_TOKEN_BYTES * 2)
        return ember_err(err, EMBER_ERR_LIMIT, "%s: merge result of %zu bytes", t->name, n);
    int rc = grow_ids(t, t->n_all + 1, err);
    if (rc) return rc;
    char *p = tok_arena_strdup(&t->pool, s, n);
    if (!p) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name);
    k = t->n_all++;
    t->text[k].p = p;
    t->text[k].n = n;
    t->flags[k] = TOK_F_PHANTOM;
    if (tok_smap_put_h(&t->map, p, n, h, k, true, NULL)) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name);
    *id = k;
    return EMBER_OK;
}

/* Whether id's text is a + b and the map names id for it (what a lookup
   of a + b would return). */
static bool merged_is(const ember_tokenizer *t, int64_t id, tok_sv a, tok_sv b) {
    if (id < 0 || id >= t->n_all) return false;
    tok_sv s = t->text[id];
    return s.p && s.n == a.n + b.n && !(t->flags[id] & TOK_F_SHADOWED) && memcmp(s.p, a.p, a.n) == 0 &&
           memcmp(s.p + a.n, b.p, b.n) == 0;
}

int tok_merge_entry(ember_tokenizer *t, int32_t left, int32_t right, uint32_t rank, uint64_t *key, uint64_t *val,
                    ember_error *err) {
    tok_sv a = t->text[left], b = t->text[right];
    *key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    int64_t guess = (int64_t)rank + t->merge_off;
    if (merged_is(t, guess, a, b)) {
        *val = ((uint64_t)rank << 32) | (uint32_t)guess;
        return EMBER_OK;
    }
    size_t n = a.n + b.n;
    char stack[256];
    char *buf = n <= sizeof stack ? stack : ember_malloc(n);
    if (!buf) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name);
    memcpy(buf, a.p, a.n);
    memcpy(buf + a.n, b.p, b.n);
    int32_t mid;
    int rc = tok_id_or_phantom(t, buf, n, &mid, err);
    if (buf != stack) free(buf);
    if (rc) return rc;
    t->merge_off = (int64_t)mid - (int64_t)rank;
    *val = ((uint64_t)rank << 32) | (uint32_t)mid;
    return EMBER_OK;
}

int tok_add_merge(ember_tokenizer *t, int32_t left, int32_t right, uint32_t rank, ember_error *err) {
    uint64_t key, val;
    int rc = tok_merge_entry(t, left, right, rank, &key, &val, err);
    if (rc) return rc;
    if (tok_umap_put(&t->model.merges, key, val, true)) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name);
    return EMBER_OK;
}

int tok_add_added(ember_tokenizer *t, int32_t id, const char *s, size_t n, bool special, bool lstrip, bool rstrip,
                  bool normalized, bool single_word, ember_error *err) {
    if (t->n_added >= TOK_MAX_ADDED)
        return ember_err(err, EMBER_ERR_LIMIT, "%s: more than %d added tokens", t->name, TOK_MAX_ADDED);
    int rc = tok_set_text(t, id, s, n, err);
    if (rc) return rc;
    if ((t->n_added & (t->n_added - 1)) == 0) { /* grow at powers of two */
        size_t cap = t->n_added ? t->n_added * 2 : 16;
        tok_added *a = ember_realloc(t->added, cap * sizeof *a);
        if (!a) return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name);
        t->added = a;
    }
    tok_added *a = &t->added[t->n_added++];
    memset(a, 0, sizeof *a);
    a->id = id;
    a->content = (char *)t->text[id].p;
    a->n = n;
    a->special = special;
    a->lstrip = lstrip;
    a->rstrip = rstrip;
    a->normalized = normalized;
    a->single_word = single_word;
    return EMBER_OK;
}

/* ---- finishing ----------------------------------------------------------------- */

static uint32_t caps_norm(const tok_norm *n) {
    uint32_t m = n->pat.n_caps;
    for (size_t k = 0; k < n->n_kids; k++) {
        uint32_t c = caps_norm(&n->kids[k]);
        if (c > m) m = c;
    }
    return m;
}
static uint32_t caps_pre(const tok_pretok *p) {
    uint32_t m = p->pat.n_caps;
    for (size_t k = 0; k < p->n_kids; k++) {
        uint32_t c = caps_pre(&p->kids[k]);
        if (c > m) m = c;
    }
    return m;
}
static bool dec_has_regex(const tok_dec *d) {
    if (d->has_pat && d->pat.is_regex) return true;
    for (size_t k = 0; k < d->n_kids; k++)
        if (dec_has_regex(&d->kids[k])) return true;
    return false;
}

static uint32_t caps_dec(const tok_dec *d) {
    uint32_t m = d->pat.n_caps;
    for (size_t k = 0; k < d->n_kids; k++) {
        uint32_t c = caps_dec(&d->kids[k]);
        if (c > m) m = c;
    }
    return m;
}

static int nomem_t(ember_tokenizer *t, ember_error *err) {
    return ember_err(err, EMBER_ERR_NOMEM, "%s: out of memory", t->name);
}

int tok_finish(ember_tokenizer *t, ember_error *err) {
    int rc;
    uint32_t mc = 0;
    if (t->norm) mc = caps_norm(t->norm);
    if (t->pre) {
        uint32_t c = caps_pre(t->pre);
        if (c > mc) mc = c;
    }
    if (t->dec) {
        uint32_t c = caps_dec(t->dec);
        if (c > mc) mc = c;
        t->dec_regex = dec_has_regex(t->dec);
    }
    t->max_caps = mc;
    if (t->n_ids == 0) return ember_err(err, EMBER_ERR_FORMAT, "%s: the vocabulary is empty", t->name);

    /* added tokens: normalized contents, the content map, tries */
    ember_tok_ws *ws = NULL;
    for (size_t k = 0; k < t->n_added; k++) {
        tok_added *a = &t->added[k];
        bool to_norm = a->normalized && t->norm;
        if (to_norm) {
            if (!ws && !(ws = ember_tok_ws_new(t))) return nomem_t(t, err);
            tok_sv nv;
            tok_arena_reset(&ws->arena);
            rc = tok_normalize(t->norm, ws, (tok_sv){a->content, a->n}, &nv, err);
            if (rc) {
                ember_tok_ws_free(ws);
                return ember_err_prefix(err, "%s: added token %ld: ", t->name, (long)a->id);
            }
            a->norm = tok_arena_strdup(&t->pool, nv.p, nv.n);
            if (!a->norm) {
                ember_tok_ws_free(ws);
                return nomem_t(t, err);
            }
            a->norm_n = nv.n;
        }
    }
    ember_tok_ws_free(ws);
    for (size_t k = 0; k < t->n_added; k++) {
        tok_added *a = &t->added[k];
        if (tok_smap_put(&t->added_map, a->content, a->n, (int32_t)k, true, NULL)) return nomem_t(t, err);
        if (a->norm && tok_smap_put(&t->added_map, a->norm, a->norm_n, (int32_t)k, true, NULL)) return nomem_t(t, err);
        if (a->special && tok_smap_put(&t->special_set, a->content, a->n, a->id, true, NULL)) return nomem_t(t, err);
        if (a->norm) {
            t->has_trie_norm = true;
            if (tok_trie_add(&t->trie_norm, a->norm, a->norm_n, (int32_t)k)) return nomem_t(t, err);
            if (!a->special) {
                t->has_trie_norm_ns = true;
                if (tok_trie_add(&t->trie_norm_ns, a->norm, a->norm_n, (int32_t)k)) return nomem_t(t, err);
            }
        } else {
            t->has_trie_raw = true;
            if (tok_trie_add(&t->trie_raw, a->content, a->n, (int32_t)k)) return nomem_t(t, err);
            if (!a->special) {
                t->has_trie_raw_ns = true;
                if (tok_trie_add(&t->trie_raw_ns, a->content, a->n, (int32_t)k)) return nomem_t(t, err);
            }
        }
    }
    /* id flags */
    for (int32_t id = 0; id < t->n_ids; id++) {
        tok_sv s = t->text[id];
        if (!s.p) continue;
        int32_t k = tok_smap_get(&t->added_map, s.p, s.n);
        if (k >= 0 && t->added[k].n == s.n && memcmp(t->added[k].content, s.p, s.n) == 0) t->flags[id] |= TOK_F_ADDED;
        if (tok_smap_get(&t->special_set, s.p, s.n) >= 0) t->flags[id] |= TOK_F_SPECIAL;
    }
    /* a model token spelled like a normalized added content maps to the added id */
    for (size_t k = 0; k < t->n_added; k++) {
        tok_added *a = &t->added[k];
        if (!a->norm) continue;
        int32_t j = tok_smap_get(&t->map, a->norm, a->norm_n);
        if (j < 0 || j == a->id) continue;
        if (!t->remap) {
            t->remap = ember_malloc((size_t)t->n_all * sizeof *t->remap);
            if (!t->remap) return nomem_t(t, err);
            for (int32_t i = 0; i < t->n_all; i++) t->remap[i] = i;
        }
        t->remap[j] = a->id;
    }
    /* model tables */
    tok_model *m = &t->model;
    if (tok_umap_fit(&m->merges)) return nomem_t(t, err);
    if (m->unk_str) {
        int32_t u = tok_smap_get(&t->map, m->unk_str, m->unk_n);
        m->unk_id = (u >= 0 && !(t->flags[u] & TOK_F_PHANTOM)) ? u : -1;
        if (m->type == TOK_MODEL_UNIGRAM && m->unk_id < 0) m->unk_id = -1;
    }
    if (m->type == TOK_MODEL_BPE) {
        for (int b = 0; b < 256; b++) {
            char nm[8] = {'<', '0', 'x', "0123456789ABCDEF"[b >> 4], "0123456789ABCDEF"[b & 15], '>', 0};
            int32_t id = tok_smap_get(&t->map, nm, 6);
            m->byte_tok[b] = (id >= 0 && !(t->flags[id] & TOK_F_PHANTOM)) ? id : -1;
        }
        for (int c = 0; c < 128; c++) {
            char ch = (char)c;
            m->ascii_sym[c] = tok_smap_get(&t->map, &ch, 1);
        }
        if (m->byte_mode) {
            for (int b = 0; b < 256; b++) {
                char u[4];
                size_t l = ember_utf8_put(tok_byte_to_cp[b], u);
                m->byte_sym[b] = tok_smap_get(&t->map, u, l);
            }
            /* raw-byte spellings of the real tokens (for ignore_merges) */
            if (m->ignore_merges) {
                if (tok_smap_reserve(&m->raw_map, (size_t)t->n_ids)) return nomem_t(t, err);
                tok_buf raw = {0};
                for (int32_t id = 0; id < t->n_ids; id++) {
                    tok_sv s = t->text[id];
                    if (!s.p) continue;
                    raw.n = 0;
                    bool ok = true;
                    const unsigned char *p = (const unsigned char *)s.p, *e = p + s.n;
                    while (p < e && ok) {
                        uint32_t cp;
                        p += tok_utf8_next(p, e, &cp);
                        int by = tok_cp_to_byte(cp);
                        if (by < 0) ok = false;
                        else if (tok_buf_putc(&raw, (char)by)) {
                            tok_buf_free(&raw);
                            return nomem_t(t, err);
                        }
                    }
                    if (!ok || raw.n == 0) continue;
                    /* the reference's map: the token's own id for its text */
                    if (t->flags[id] & TOK_F_SHADOWED) continue;
                    char *k = tok_arena_strdup(&t->pool, raw.p, raw.n);
                    if (!k || tok_smap_put(&m->raw_map, k, raw.n, id, true, NULL)) {
                        tok_buf_free(&raw);
                        return nomem_t(t, err);
                    }
                }
                tok_buf_free(&raw);
            }
        }
    }
    for (int32_t id = 0; id < t->n_all; id++) t->flags[id] &= (uint8_t)~TOK_F_SHADOWED; /* loading only */
    tok_plan_compile(t);
    return EMBER_OK;
}

void ember_tok_free(ember_tokenizer *t) {
    if (!t) return;
    tok_model_free(&t->model);
    if (t->norm) {
        tok_norm_free(t->norm);
        free(t->norm);
    }
    if (t->pre) {
        tok_pretok_free(t->pre);
        free(t->pre);
    }
    if (t->dec) {
        tok_dec_free(t->dec);
        free(t->dec);
    }
    for (size_t k = 0; k < t->n_posts; k++) free(t->posts[k].single);
    free(t->posts);
    free(t->text);
    free(t->flags);
    free(t->remap);
    free(t->added);
    tok_smap_free(&t->map);
    tok_smap_free(&t->added_map);
    tok_smap_free(&t->special_set);
    tok_trie_free(&t->trie_raw);
    tok_trie_free(&t->trie_norm);
    tok_trie_free(&t->trie_raw_ns);
    tok_trie_free(&t->trie_norm_ns);
    tok_arena_free(&t->pool);
    free(t);
}

void tok_dec_free(tok_dec *d) {
    if (!d) return;
    tok_pattern_free(&d->pat);
    free(d->str);
    free(d->str2);
    for (size_t k = 0; k < d->n_kids; k++) tok_dec_free(&d->kids[k]);
    free(d->kids);
    memset(d, 0, sizeof *d);
}

/* ---- getters ---------------------------------------------------------------------- */

int32_t ember_tok_n_vocab(const ember_tokenizer *t) { return t ? t->n_ids : 0; }
ember_tok_kind ember_tok_get_kind(const ember_tokenizer *t) {
    return t->model.type == TOK_MODEL_WORDPIECE ? EMBER_TOK_KIND_WORDPIECE
           : t->model.type == TOK_MODEL_UNIGRAM ? EMBER_TOK_KIND_UNIGRAM
                                                 : EMBER_TOK_KIND_BPE;
}

const char *ember_tok_id_text(const ember_tokenizer *t, int32_t id, size_t *len) {
    if (!t || id < 0 || id >= t->n_ids || !t->text[id].p) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = t->text[id].n;
    return t->text[id].p;
}

int32_t ember_tok_text_id(const ember_tokenizer *t, const char *s, size_t n) {
    if (!t || (!s && n)) return -1;
    int32_t id = tok_smap_get(&t->map, s ? s : "", n);
    if (id < 0 || id >= t->n_ids) return -1;
    return id;
}

bool ember_tok_is_special(const ember_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_ids && (t->flags[id] & TOK_F_SPECIAL);
}

int32_t ember_tok_bos_id(const ember_tokenizer *t) { return t ? t->bos_id : -1; }
int32_t ember_tok_eos_id(const ember_tokenizer *t) { return t ? t->eos_id : -1; }
int32_t ember_tok_pad_id(const ember_tokenizer *t) { return t ? t->pad_id : -1; }
