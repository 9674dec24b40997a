/*
 * spec.c - draft sources (see spec.h): the dispatch through a source's
 * operations, and the n-gram (prompt lookup) source.
 *
 * The n-gram source keeps no state per slot: every proposal is a scan of
 * the history the engine passes. Matching the longest suffix first makes
 * the proposal as specific as the history allows; the most recent earlier
 * occurrence follows the current topic / loop rather than an old one.
 */
#include "spec.h"
#include "core/alloc.h"

#include <stdlib.h>
#include <string.h>

int ember_draft_open(ember_draft *d, int slot, const int32_t *hist, int n_hist, ember_error *err) {
    if (!d || slot < 0 || slot >= d->n_slots)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "draft source: slot %d does not exist", slot);
    return d->ops->open ? d->ops->open(d, slot, hist, n_hist, err) : EMBER_OK;
}

int ember_draft_propose(ember_draft *d, int slot, const int32_t *hist, int n_hist, int n_max, int32_t *out) {
    if (!d || slot < 0 || slot >= d->n_slots || n_max <= 0 || n_hist < 1) return 0;
    int n = d->ops->draft(d, slot, hist, n_hist, n_max, out);
    return n < 0 ? 0 : n > n_max ? n_max : n;
}

void ember_draft_propose_many(ember_draft *d, int n, const int *slots, const int32_t *const *hist, const int *n_hist,
                              const int *n_max, int32_t *const *out, int *n_out) {
    for (int i = 0; i < n; i++) n_out[i] = 0;
    if (!d || n <= 0) return;
    if (!d->ops->draft_many) {
        for (int i = 0; i < n; i++) n_out[i] = ember_draft_propose(d, slots[i], hist[i], n_hist[i], n_max[i], out[i]);
        return;
    }
    for (int i = 0; i < n; i++)
        if (slots[i] < 0 || slots[i] >= d->n_slots) return; /* a caller's bug: propose nothing */
    d->ops->draft_many(d, n, slots, hist, n_hist, n_max, out, n_out);
    for (int i = 0; i < n; i++) n_out[i] = n_out[i] < 0 ? 0 : n_out[i] > n_max[i] ? (n_max[i] > 0 ? n_max[i] : 0) : n_out[i];
}

void ember_draft_commit(ember_draft *d, int slot, int n_drafted, int n_accepted) {
    if (d && slot >= 0 && slot < d->n_slots && d->ops->commit) d->ops->commit(d, slot, n_drafted, n_accepted);
}

void ember_draft_observe(ember_draft *d, int n, const int *slot, const int32_t *pos, const int32_t *tok,
                         const float *taps, const int32_t *const *hist, const int *n_hist) {
    if (d && n > 0 && d->n_tap_layers > 0 && d->ops->observe) d->ops->observe(d, n, slot, pos, tok, taps, hist, n_hist);
}

void ember_draft_close(ember_draft *d, int slot) {
    if (d && slot >= 0 && slot < d->n_slots && d->ops->close) d->ops->close(d, slot);
}

void ember_draft_free(ember_draft *d) {
    if (d) d->ops->destroy(d);
}

const char *ember_draft_name(const ember_draft *d) {
    return d ? d->ops->name : "none";
}

/* ---- n-gram / prompt lookup ------------------------------------------------------- */

typedef struct ngram_src {
    ember_draft base;
    int ngram_min, ngram_max, window;
} ngram_src;

/* Proposes the continuation of the most recent earlier occurrence of the
   longest matching suffix (see spec.h). */
static int ngram_draft(ember_draft *d, int slot, const int32_t *hist, int n, int n_max, int32_t *out) {
    (void)slot;
    const ngram_src *g = (const ngram_src *)d;
    int lo = n - g->window > 0 ? n - g->window : 0; /* earliest start searched */
    for (int len = g->ngram_max < n - 1 ? g->ngram_max : n - 1; len >= g->ngram_min; len--) {
        const int32_t *suf = hist + n - len;
        for (int s = n - len - 1; s >= lo; s--) {
            if (hist[s] != suf[0] || memcmp(hist + s, suf, (size_t)len * sizeof *hist) != 0) continue;
            int c = s + len; /* < n: the continuation starts inside the history */
            for (int k = 0; k < n_max; k++) {
                int i = c + k;
                out[k] = i < n ? hist[i] : out[i - n]; /* i - n < k: read back the proposal */
            }
            return n_max;
        }
    }
    return 0;
}

static void ngram_destroy(ember_draft *d) {
    free(d);
}

static const ember_draft_ops k_ngram_ops = {
    .name = "ngram", .draft = ngram_draft, .destroy = ngram_destroy};

int ember_draft_ngram_new(int n_slots, int ngram_min, int ngram_max, int window, ember_draft **out,
                          ember_error *err) {
    *out = NULL;
    if (n_slots < 1) return ember_err(err, EMBER_ERR_INVALID_ARG, "n-gram drafts: %d slots", n_slots);
    if (ngram_min < 1 || ngram_max < ngram_min || ngram_max > 16)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "n-gram drafts: n-gram sizes %d..%d (want 1 <= min <= max <= 16)",
                         ngram_min, ngram_max);
    if (window < 2) return ember_err(err, EMBER_ERR_INVALID_ARG, "n-gram drafts: a window of %d tokens", window);
    ngram_src *g = ember_calloc(1, sizeof *g);
    if (!g) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    g->base.ops = &k_ngram_ops;
    g->base.n_slots = n_slots;
    g->ngram_min = ngram_min;
    g->ngram_max = ngram_max;
    g->window = window;
    *out = &g->base;
    return EMBER_OK;
}
