/*
 * tok_added.c - added tokens: the byte trie that finds them in text
 * (leftmost, then longest, like the reference's DictionarySplitter) and the
 * content lookup.
 *
 * Owner: tokenizer module. Tries are built at load time and read-only
 * afterwards (shared by all threads).
 *
 * single_word (not implemented by the reference; HuggingFace's meaning): a
 * match of such a token that touches a word character (letter, digit, '_')
 * on either side is not a match.
 */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tok_internal.h"
#include "core/alloc.h"

static int trie_new_node(tok_trie *tr) {
    if (tr->n_nodes == tr->cap) {
        size_t cap = tr->cap ? tr->cap * 2 : 64;
        int32_t *t = ember_realloc(tr->term, cap * sizeof *t);
        if (!t) return -1;
        tr->term = t;
        tr->cap = cap;
    }
    tr->term[tr->n_nodes] = 0;
    return (int)tr->n_nodes++;
}

int tok_trie_add(tok_trie *tr, const char *s, size_t n, int32_t value) {
    if (n == 0) return EMBER_OK; /* an empty content never matches */
    if (tr->n_nodes == 0 && trie_new_node(tr) < 0) return EMBER_ERR_NOMEM;
    uint64_t node = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t key = (node << 8) | (unsigned char)s[i], child;
        if (!tok_umap_get(&tr->edges, key, &child)) {
            int c = trie_new_node(tr);
            if (c < 0) return EMBER_ERR_NOMEM;
            child = (uint64_t)c;
            if (tok_umap_put(&tr->edges, key, child, false)) return EMBER_ERR_NOMEM;
        }
        node = child;
    }
    tr->term[node] = value + 1;
    tr->first[(unsigned char)s[0] >> 3] |= (uint8_t)(1u << ((unsigned char)s[0] & 7));
    return EMBER_OK;
}

void tok_trie_free(tok_trie *tr) {
    tok_umap_free(&tr->edges);
    free(tr->term);
    memset(tr, 0, sizeof *tr);
}

static bool is_word_cp(uint32_t cp) {
    if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) || c == UTF8PROC_CATEGORY_ND ||
           c == UTF8PROC_CATEGORY_PC || c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_MC;
}

static bool single_word_ok(tok_sv s, size_t a, size_t b) {
    const unsigned char *p = (const unsigned char *)s.p, *e = p + s.n;
    if (a > 0) {
        size_t q = a - 1;
        while (q > 0 && (p[q] & 0xC0) == 0x80) q--;
        uint32_t cp;
        tok_utf8_next(p + q, e, &cp);
        if (is_word_cp(cp)) return false;
    }
    if (b < s.n) {
        uint32_t cp;
        tok_utf8_next(p + b, e, &cp);
        if (is_word_cp(cp)) return false;
    }
    return true;
}

int tok_trie_split(const ember_tokenizer *t, const tok_trie *tr, tok_sv s, tok_pieces *out) {
    if (tr->n_nodes == 0) return tok_pieces_push(out, s.p, s.n);
    size_t start = 0, i = 0;
    const unsigned char *p = (const unsigned char *)s.p;
    while (i < s.n) {
        if (!(tr->first[p[i] >> 3] & (1u << (p[i] & 7)))) {
            i++;
            continue;
        }
        uint64_t node = 0;
        size_t j = i, mlen = 0;
        int32_t mval = 0;
        while (j < s.n) {
            uint64_t child;
            if (!tok_umap_get(&tr->edges, (node << 8) | p[j], &child)) break;
            node = child;
            j++;
            if (tr->term[node]) {
                mlen = j - i;
                mval = tr->term[node];
            }
        }
        if (mlen && t->added[mval - 1].single_word && !single_word_ok(s, i, i + mlen)) mlen = 0;
        if (mlen) {
            if (i > start && tok_pieces_push(out, s.p + start, i - start)) return EMBER_ERR_NOMEM;
            if (tok_pieces_push(out, s.p + i, mlen)) return EMBER_ERR_NOMEM;
            i += mlen;
            start = i;
        } else {
            i++;
        }
    }
    if (start < s.n && tok_pieces_push(out, s.p + start, s.n - start)) return EMBER_ERR_NOMEM;
    return EMBER_OK;
}

const tok_added *tok_added_lookup(const ember_tokenizer *t, const char *s, size_t n, bool parse_special) {
    if (!t->n_added) return NULL;
    int32_t k = tok_smap_get(&t->added_map, s, n);
    if (k < 0) return NULL;
    const tok_added *a = &t->added[k];
    if (a->special && !parse_special) return NULL;
    return a;
}
