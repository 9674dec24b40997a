/*
 * gbudget.c - a matcher with a token budget, the engine's per-request
 * constraint (see gbudget.h). Used by src/serve/server.c (every grammar a
 * request names) and src/cli/cmd_generate.c (--grammar-file).
 */
#include <stdlib.h>

#include "core/alloc.h"
#include "sample/gbudget.h"

struct ember_gbudget {
    ember_gmatch *m;    /* owned */
    ember_grammar *own; /* the grammar when handed over, else NULL */
    int left;           /* tokens the output may still take, >= 1 */
};

int ember_gbudget_new(const ember_grammar *g, const ember_gvocab *v, int max_tokens, ember_gbudget **out,
                      ember_error *err) {
    *out = NULL;
    ember_gbudget *b = ember_calloc(1, sizeof *b);
    if (!b) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    int rc = ember_gmatch_new(g, v, &b->m, err);
    if (rc) {
        free(b);
        return rc;
    }
    b->left = max_tokens > 0 ? max_tokens : 1 << 29;
    *out = b;
    return EMBER_OK;
}

void ember_gbudget_own_grammar(ember_gbudget *b, ember_grammar *g) {
    b->own = g;
}

int ember_gbudget_mask(void *u, float *logits, int n_vocab) {
    ember_gbudget *b = u;
    return ember_gmatch_mask_left(b->m, logits, n_vocab, b->left);
}

void ember_gbudget_accept(void *u, int32_t token) {
    ember_gbudget *b = u;
    ember_gmatch_accept(b->m, token);
    if (b->left > 1) b->left--;
}

int ember_gbudget_left(const ember_gbudget *b) {
    return b->left;
}

void ember_gbudget_free(void *u) {
    ember_gbudget *b = u;
    if (!b) return;
    ember_gmatch_free(b->m);
    ember_grammar_free(b->own);
    free(b);
}
