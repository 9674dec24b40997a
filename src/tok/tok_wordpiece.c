/*
 * tok_wordpiece.c - the WordPiece model (BERT): greedy longest match from
 * the start of each word, continuation pieces carry a prefix ("##"); a word
 * with an unmatchable rest, or longer than max_input_chars_per_word
 * characters, becomes the unknown token.
 *
 * Owner: tokenizer module; runs on the calling thread (scratch: ws->tmp2).
 * GGUF vocabularies (llama.cpp's "bert") mark word-initial pieces with a
 * "\u2581" prefix instead; model.word_prefix / cont_prefix cover both.
 */
#include <string.h>

#include "tok_internal.h"

int tok_wordpiece_word(const ember_tokenizer *t, struct ember_tok_ws *ws, const char *p, size_t n, tok_ivec *out,
                       ember_error *err) {
    const tok_model *m = &t->model;
    if (n == 0) return EMBER_OK;
    /* character boundaries */
    size_t nch = 0;
    for (size_t i = 0; i < n; i++) nch += ((unsigned char)p[i] & 0xC0) != 0x80;
    int32_t unk = m->unk_id >= 0 ? tok_final_id(t, m->unk_id) : -1;
    if (nch > m->max_chars) {
        if (unk >= 0 && tok_ivec_push(out, unk)) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        return EMBER_OK;
    }
    size_t first = out->n, start = 0;
    tok_buf *b = &ws->tmp2;
    while (start < n) {
        size_t end = n;
        int32_t found = -1;
        while (end > start) {
            b->n = 0;
            const char *pre = start ? m->cont_prefix : m->word_prefix;
            size_t pre_n = start ? m->cont_prefix_n : m->word_prefix_n;
            if (tok_buf_put(b, pre, pre_n) || tok_buf_put(b, p + start, end - start))
                return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
            int32_t id = tok_smap_get(&t->map, b->p, b->n);
            if (id >= 0 && !(t->flags[id] & TOK_F_PHANTOM)) {
                found = id;
                break;
            }
            /* previous character boundary */
            end--;
            while (end > start && ((unsigned char)p[end] & 0xC0) == 0x80) end--;
        }
        if (found < 0) {
            out->n = first;
            if (unk >= 0 && tok_ivec_push(out, unk)) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
            return EMBER_OK;
        }
        if (tok_ivec_push(out, tok_final_id(t, found))) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        start = end;
    }
    return EMBER_OK;
}
