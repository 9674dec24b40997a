/*
 * gbudget.h - one request's grammar constraint as the engine calls it: a
 * matcher (grammar.h) and the tokens the request may still take, so the
 * mask steers the output to finish within max_tokens
 * (ember_gmatch_mask_left). The three callbacks have the shapes of
 * ember_gen_params' constrain_mask / constrain_accept / constrain_free, so
 * the server and `ember generate --grammar-file` hand the same object to
 * the engine.
 *
 * Ownership: an ember_gbudget owns its matcher; it borrows its grammar and
 * vocabulary (both must outlive it) unless the grammar is handed over with
 * ember_gbudget_own_grammar. The engine calls it from its one thread.
 */
#ifndef EMBER_SAMPLE_GBUDGET_H
#define EMBER_SAMPLE_GBUDGET_H

#include <stdint.h>

#include "core/error.h"
#include "sample/grammar.h"

typedef struct ember_gbudget ember_gbudget;

/* A constraint at the start of g over v with a budget of max_tokens tokens
   (<= 0: no budget to speak of, 2^29). *out is freed by ember_gbudget_free.
   Returns EMBER_OK, or EMBER_ERR_NOMEM with err filled (nothing kept). */
int ember_gbudget_new(const ember_grammar *g, const ember_gvocab *v, int max_tokens, ember_gbudget **out,
                      ember_error *err);

/* Hands g (the grammar b was made on) to b: ember_gbudget_free frees it. */
void ember_gbudget_own_grammar(ember_gbudget *b, ember_grammar *g);

/* constrain_mask: -INFINITY on logits[i] for every id the grammar does not
   allow next within the tokens left; returns the ids left. */
int ember_gbudget_mask(void *b, float *logits, int n_vocab);

/* constrain_accept: the token chosen advances the matcher and spends one
   token of the budget (the last one is never spent, so the end stays
   reachable). */
void ember_gbudget_accept(void *b, int32_t token);

/* The tokens the mask still counts on (tests). */
int ember_gbudget_left(const ember_gbudget *b);

/* constrain_free: frees b, its matcher and (when handed over) its grammar.
   NULL is a no-op. */
void ember_gbudget_free(void *b);

#endif
