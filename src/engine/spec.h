/*
 * spec.h - draft sources for speculative decoding.
 *
 * A draft source proposes tokens that a row's target model is likely to
 * produce next; the engine (sched.c) feeds them beside the row's last token
 * in one forward, verifies them with the row's own sampler chain and keeps
 * the accepted ones (docs/speculative.md). A source is one object serving
 * every row of an engine, addressed by slot (the engine's row index):
 *
 *   open    a request starts on slot (its prompt is hist[0, n_hist));
 *   draft   propose up to n_max tokens continuing hist[0, n_hist) (the
 *           row's prompt and output so far); fewer, or none, is allowed;
 *   commit  of the n_drafted tokens last proposed on slot, the first
 *           n_accepted were accepted (the history passed to the next draft
 *           call holds them, then the target's own token);
 *   close   the request on slot ended.
 *
 * A source that reads the target's hidden states (EAGLE-3) names the tap
 * layers it wants in its head (n_tap_layers > 0): the engine then asks the
 * target's forward for those taps on every token of the speculating rows
 * (prompt chunks, last tokens and drafts) and hands them over with
 *   observe the tokens just fed, with their slots, positions and taps
 *           (before they are verified: the source keeps what the row's
 *           history later confirms and drops the rest).
 *
 * The history is always the engine's: a source reads it, never keeps a
 * pointer to it past a call. A source with state per slot (a draft model's
 * own cache rows) keeps that state in step with open / commit / close;
 * the n-gram source has none.
 *
 * Ownership: ember_draft_free releases a source and everything it holds.
 * Threading: a source is used by one thread (the engine thread).
 */
#ifndef EMBER_ENGINE_SPEC_H
#define EMBER_ENGINE_SPEC_H

#include <stdint.h>

#include "core/error.h"
#include "ember.h"

typedef struct ember_draft ember_draft;

/* The operations behind a source (each implementation fills one; open,
   commit and close may be NULL where a source keeps no state per slot). */
typedef struct ember_draft_ops {
    const char *name;
    int (*open)(ember_draft *d, int slot, const int32_t *hist, int n_hist, ember_error *err);
    int (*draft)(ember_draft *d, int slot, const int32_t *hist, int n_hist, int n_max, int32_t *out);
    /* Optional: proposals for n distinct slots at once (a source that batches
       its work across rows); for each i the contract of draft, its count in
       n_out[i]. NULL: draft is called slot by slot. */
    void (*draft_many)(ember_draft *d, int n, const int *slots, const int32_t *const *hist, const int *n_hist,
                       const int *n_max, int32_t *const *out, int *n_out);
    void (*commit)(ember_draft *d, int slot, int n_drafted, int n_accepted);
    /* Optional (sources with tap layers): n tokens of the last target forward, token i fed at
       position pos[i] of slot[i] (in increasing position per slot), its taps at taps + i * tap_width;
       hist[s] / n_hist[s]: slot s's history (prompt and output so far, indexed by slot). */
    void (*observe)(ember_draft *d, int n, const int *slot, const int32_t *pos, const int32_t *tok, const float *taps,
                    const int32_t *const *hist, const int *n_hist);
    void (*close)(ember_draft *d, int slot);
    void (*destroy)(ember_draft *d);
} ember_draft_ops;

/* The common head of every source; implementations embed it first. */
struct ember_draft {
    const ember_draft_ops *ops;
    int n_slots;
    int n_tap_layers;      /* > 0: the target's taps this source reads (model.h's ember_batch.tap_layers) */
    int32_t tap_layers[8];
    int tap_width;         /* floats per token: n_tap_layers * the target's hidden size */
};

/* A request starts on slot: its prompt is hist[0, n_hist). Errors leave
   the slot closed. */
int ember_draft_open(ember_draft *d, int slot, const int32_t *hist, int n_hist, ember_error *err);
/* Writes up to n_max proposed tokens into out; returns how many (0..n_max).
   Never fails: a source that cannot propose returns 0. */
int ember_draft_propose(ember_draft *d, int slot, const int32_t *hist, int n_hist, int n_max, int32_t *out);
/* ember_draft_propose for n distinct slots at once (n_out[i] proposals in
   out[i]); a source that batches does all of them in shared forwards. */
void ember_draft_propose_many(ember_draft *d, int n, const int *slots, const int32_t *const *hist, const int *n_hist,
                              const int *n_max, int32_t *const *out, int *n_out);
/* Of the n_drafted tokens last proposed on slot, n_accepted were kept. */
void ember_draft_commit(ember_draft *d, int slot, int n_drafted, int n_accepted);
/* The taps of the tokens the target just fed (spec.h's observe); a no-op
   for a source without tap layers. */
void ember_draft_observe(ember_draft *d, int n, const int *slot, const int32_t *pos, const int32_t *tok,
                         const float *taps, const int32_t *const *hist, const int *n_hist);
/* The request on slot ended (a closed slot is ignored). */
void ember_draft_close(ember_draft *d, int slot);
/* Frees the source (NULL is fine). */
void ember_draft_free(ember_draft *d);
const char *ember_draft_name(const ember_draft *d);

/*
 * Prompt lookup: the longest suffix of the history, ngram_max tokens down to
 * ngram_min, that occurred earlier in it (the most recent such occurrence)
 * proposes the tokens that followed that occurrence. When the copy runs
 * into the end of the history it goes on reading its own proposal, so a
 * loop of period p is proposed for as long as asked. Only the last
 * `window` tokens are searched (bounded cost per call).
 * 1 <= ngram_min <= ngram_max <= 16; window >= 2.
 */
int ember_draft_ngram_new(int n_slots, int ngram_min, int ngram_max, int window, ember_draft **out,
                          ember_error *err);

/*
 * A draft model (spec_model.c): `draft`, loaded apart from `target` with the
 * same vocabulary size and at least n_slots rows of the target's context,
 * proposes greedily from its own cache rows, brought in step with each
 * row's history at every proposal. Borrowed: the caller frees it after the
 * source. A mismatch of vocabulary, rows or context: EMBER_ERR_INVALID_ARG.
 */
int ember_draft_model_new(ember_model *draft, const ember_model *target, int n_slots, ember_draft **out,
                          ember_error *err);

/*
 * An EAGLE-3 draft model (spec_eagle3.c, model/eagle3.c): `draft`, loaded
 * apart from `target` (an EAGLE-3 directory) with at least n_slots rows of
 * the target's context, drafts greedily from the target's taps and its own
 * cache rows. Borrowed: the caller frees it after the source (and the
 * target after it: it may borrow the target's embedding). A config that
 * does not fit the target: EMBER_ERR_INVALID_ARG naming the field.
 */
int ember_draft_eagle3_new(ember_model *draft, ember_model *target, int n_slots, ember_draft **out, ember_error *err);

/*
 * A DFlash draft model (spec_dflash.c, model/dflash.c): as the EAGLE-3
 * source, but a whole block of drafts per round (block_size - 1 at most)
 * from one forward of the row's last token and mask tokens over the
 * target's taps as context. Borrows the target's embedding and lm_head.
 */
int ember_draft_dflash_new(ember_model *draft, ember_model *target, int n_slots, ember_draft **out, ember_error *err);

/*
 * The model's own MTP head (spec_eagle3.c, model/mtp.c): built from the
 * target's weights (ember_model_mtp_new) and owned by the source, it drafts
 * greedily as the EAGLE-3 source does, from the target's hidden state after
 * its final norm and its own cache rows. A target without an MTP head:
 * EMBER_ERR_INVALID_ARG with one line; a wrong mtp.* tensor is named.
 */
int ember_draft_mtp_new(ember_model *target, int n_slots, ember_draft **out, ember_error *err);

#endif
