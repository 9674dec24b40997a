/*
 * spec_dflash.c - the DFlash draft source (spec.h): a DFlash draft model
 * (model/dflash.c) proposes a whole block of tokens per round from the
 * target's taps (its context) and one forward of the row's last token
 * followed by mask tokens (slot s of the source is row s of the draft
 * model's cache).
 *
 * Alignment, as in the published code: context position t holds the
 * target's taps at position t (the token fed there is hist[t]). With a
 * history of n tokens the target has computed positions 0 .. n - 2, so the
 * context covers those and the block is hist[n - 1] then block - 1 masks at
 * positions n - 1 ..; the masks' argmax are the drafts for positions n ...
 *
 * State per slot: base (the target position of cache position 0), n_held
 * (context positions in the cache) and pending taps (spec_taps.h, shared with
 * the EAGLE-3 source, spec_eagle3.c), except that a context position needs only its
 * own token confirmed (hist[t] equals the token fed there), not the next.
 * A round's block positions are trimmed right after it; pending taps of
 * rejected drafts fail the history check. A gap in the taps (a prefix from
 * the prefix cache) starts the context afresh where the taps start.
 *
 * Ownership: borrows the draft model (and through it the target's
 * embedding and lm_head); owns the per-slot buffers. Threading: the engine
 * thread.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "engine/engine.h"
#include "kv/kv.h"
#include "model/model.h"
#include "spec.h"
#include "spec_taps.h"


typedef struct df_src {
    ember_draft base;
    ember_model *m;
    tap_slot *slot;
    int W, V, n_ctx, chunk, block, mask;
    int *jslot, *jcnt;
    int32_t *tok, *pos, *row, *outi, *apos;
    float *tin;    /* [chunk * W] */
    float *logits; /* [chunk * V] */
} df_src;

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void reset(df_src *s, int slot, int base) {
    tap_slot_reset(&s->slot[slot], s->m->kv, slot, base);
}

static bool trim_to_held(df_src *s, int slot) {
    return tap_slot_trim(&s->slot[slot], s->m->kv, slot);
}

/* How many pending positions the history confirms (the token fed at t is hist[t]); drops from the first refuted. */
static int confirmed(df_src *s, int slot, const int32_t *hist, int n_hist) {
    tap_slot *e = &s->slot[slot];
    int k = 0;
    while (k < e->np && e->p0 + k < n_hist && hist[e->p0 + k] == e->ptok[k]) k++;
    if (k < e->np && e->p0 + k < n_hist) e->np = k; /* refuted: it and all after it */
    return k;
}

/* Sets up job j for slot: its confirmed pending positions, the cache row trimmed to its context. */
static int job(df_src *s, int j, int slot, const int32_t *hist, int n_hist) {
    s->jslot[j] = slot;
    s->jcnt[j] = 0;
    tap_slot *e = &s->slot[slot];
    if (!e->open || e->base < 0 || !trim_to_held(s, slot)) return 0;
    int k = confirmed(s, slot, hist, n_hist);
    if (e->p0 - e->base + k + s->block > s->n_ctx) k = 0; /* no room left for a round */
    return s->jcnt[j] = k;
}

/* Feeds jobs j < n (their first jcnt[j] pending positions) into the context, in chunks. */
static void feed(df_src *s, int n) {
    ember_model *m = s->m;
    int j = 0, o = 0;
    while (j < n) {
        int nt = 0, first = j, first_o = o;
        while (j < n && nt < s->chunk) {
            if (o >= s->jcnt[j]) {
                j++, o = 0;
                continue;
            }
            tap_slot *e = &s->slot[s->jslot[j]];
            s->pos[nt] = e->p0 + o - e->base;
            s->row[nt] = s->jslot[j];
            memcpy(s->tin + (size_t)nt * s->W, e->ptaps + (size_t)o * s->W, (size_t)s->W * sizeof(float));
            nt++;
            if (++o == s->jcnt[j]) j++, o = 0;
        }
        if (!nt) break;
        ember_error err = {0};
        int rc = ember_dflash_context(m->llm, m->st, m->kv, nt, s->row, s->pos, s->tin, &err);
        for (int q = first, qo = first_o; q < n && (q < j || (q == j && qo < o)); q++, qo = 0) {
            if (qo >= s->jcnt[q]) continue;
            tap_slot *e = &s->slot[s->jslot[q]];
            if (rc) {
                reset(s, s->jslot[q], -1);
                s->jcnt[q] = 0;
            } else {
                e->n_held = e->p0 + (q < j ? s->jcnt[q] : o) - e->base;
            }
        }
    }
    for (int q = 0; q < n; q++) {
        tap_slot *e = &s->slot[s->jslot[q]];
        int k = s->jcnt[q];
        if (k <= 0 || e->base < 0) continue;
        memmove(e->ptok, e->ptok + k, (size_t)(e->np - k) * sizeof *e->ptok);
        memmove(e->ptaps, e->ptaps + (size_t)k * s->W, (size_t)(e->np - k) * s->W * sizeof(float));
        e->p0 += k;
        e->np -= k;
    }
}

static void df_observe(ember_draft *d, int n, const int *slot, const int32_t *pos, const int32_t *tok, const float *taps,
                       const int32_t *const *hist, const int *n_hist) {
    df_src *s = (df_src *)d;
    for (int i = 0; i < n; i++) {
        const int sl = slot[i];
        if (sl < 0 || sl >= d->n_slots || !s->slot[sl].open) continue;
        tap_slot *e = &s->slot[sl];
        const int t = pos[i];
        tap_slot_place(e, s->m->kv, sl, t);
        if (e->np == TAP_PEND_CAP) { /* full (a long prompt chunk): into the context what the history confirms */
            if (job(s, 0, sl, hist[sl], n_hist[sl])) feed(s, 1);
            if (e->np == TAP_PEND_CAP || e->base < 0) reset(s, sl, t);
        }
        tap_slot_push(e, tok[i], taps + (size_t)i * s->W, s->W);
    }
    int nj = 0;
    for (int i = 0; i < n; i++) {
        const int sl = slot[i];
        if (sl < 0 || sl >= d->n_slots || (i > 0 && slot[i - 1] == sl)) continue;
        bool seen = false;
        for (int q = 0; q < nj && !seen; q++) seen = s->jslot[q] == sl;
        if (!seen && job(s, nj, sl, hist[sl], n_hist[sl]) > 0) nj++;
    }
    if (nj) feed(s, nj);
}

static void df_draft_many(ember_draft *d, int n, const int *slots, const int32_t *const *hist, const int *n_hist,
                          const int *n_max, int32_t *const *out, int *n_out) {
    df_src *s = (df_src *)d;
    const int B = s->block;
    for (int j = 0; j < n; j++) {
        n_out[j] = 0;
        job(s, j, slots[j], hist[j], n_hist[j]);
    }
    feed(s, n); /* the context up to each row's position n_hist - 2 */
    /* the blocks of the ready rows, as many per forward as fit */
    int j = 0;
    while (j < n) {
        int nt = 0, first = j;
        for (; j < n && nt + B <= s->chunk; j++) {
            tap_slot *e = &s->slot[slots[j]];
            if (!e->open || e->base < 0 || e->base + e->n_held != n_hist[j] - 1 || n_max[j] <= 0) continue;
            const int p = n_hist[j] - 1 - e->base;
            for (int k = 0; k < B; k++) {
                s->tok[nt + k] = k == 0 ? hist[j][n_hist[j] - 1] : s->mask;
                s->pos[nt + k] = p + k;
                s->row[nt + k] = slots[j];
                s->apos[nt + k] = p + B - 1;
            }
            nt += B;
        }
        if (!nt) continue;
        int no = 0;
        for (int k = 0; k < nt; k++)
            if (k % B) s->outi[no++] = k;
        ember_batch b = {.n = nt, .tok = s->tok, .pos = s->pos, .row = s->row, .n_out = no, .out = s->outi};
        ember_error err = {0};
        int rc = ember_dflash_block(s->m->llm, s->m->st, s->m->kv, &b, s->apos, s->logits, &err);
        for (int q = first, blk = 0; q < j; q++) {
            tap_slot *e = &s->slot[slots[q]];
            if (!e->open || e->base < 0 || e->base + e->n_held != n_hist[q] - 1 || n_max[q] <= 0) continue;
            if (rc) {
                reset(s, slots[q], -1);
            } else {
                int want = n_max[q] < B - 1 ? n_max[q] : B - 1;
                for (int k = 0; k < want; k++) out[q][k] = argmax(s->logits + (size_t)(blk * (B - 1) + k) * s->V, s->V);
                n_out[q] = want;
                trim_to_held(s, slots[q]); /* the block leaves the cache */
            }
            blk++;
        }
    }
}

static int df_draft(ember_draft *d, int slot, const int32_t *hist, int n_hist, int n_max, int32_t *out) {
    int n = 0;
    df_draft_many(d, 1, &slot, &hist, &n_hist, &n_max, &out, &n);
    return n;
}

static int df_open(ember_draft *d, int slot, const int32_t *hist, int n_hist, ember_error *err) {
    (void)hist, (void)n_hist, (void)err;
    df_src *s = (df_src *)d;
    reset(s, slot, -1);
    s->slot[slot].open = true;
    return EMBER_OK;
}

static void df_close(ember_draft *d, int slot) {
    df_src *s = (df_src *)d;
    reset(s, slot, -1);
    s->slot[slot].open = false;
}

static void df_destroy(ember_draft *d) {
    df_src *s = (df_src *)d;
    if (!s) return;
    tap_slots_free(s->slot, s->base.n_slots);
    free(s->jslot);
    free(s->jcnt);
    free(s->tok);
    free(s->pos);
    free(s->row);
    free(s->outi);
    free(s->apos);
    free(s->tin);
    free(s->logits);
    free(s);
}

static const ember_draft_ops k_df_ops = {
    .name = "dflash",
    .open = df_open,
    .draft = df_draft,
    .draft_many = df_draft_many,
    .observe = df_observe,
    .close = df_close,
    .destroy = df_destroy,
};

int ember_draft_dflash_new(ember_model *draft, ember_model *target, int n_slots, ember_draft **out, ember_error *err) {
    *out = NULL;
    if (!draft) return ember_err(err, EMBER_ERR_INVALID_ARG, "speculative decoding with DFlash: no draft model given");
    if (draft == target)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "the DFlash draft model must be loaded apart from the target");
    if (!draft->cfg.dflash)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "the draft model is not a DFlash draft model (--spec draft runs it)");
    if (draft->params.n_rows < n_slots || draft->params.n_ctx < target->params.n_ctx ||
        draft->params.max_batch_tokens < draft->cfg.df_block)
        return ember_err(err, EMBER_ERR_INVALID_ARG,
                         "the DFlash draft model holds %d rows of %d positions, %d per forward; the target needs %d of %d "
                         "and a block of %d",
                         draft->params.n_rows, draft->params.n_ctx, draft->params.max_batch_tokens, n_slots,
                         target->params.n_ctx, draft->cfg.df_block);
    int32_t taps[8];
    int n_taps = 0;
    int rc = ember_dflash_bind(draft->llm, target->llm, taps, &n_taps, err);
    if (rc) return rc;
    df_src *s = ember_calloc(1, sizeof *s);
    if (!s) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    s->base = (ember_draft){.ops = &k_df_ops, .n_slots = n_slots, .n_tap_layers = n_taps,
                            .tap_width = n_taps * target->cfg.hidden_size};
    memcpy(s->base.tap_layers, taps, (size_t)n_taps * sizeof *taps);
    s->m = draft;
    s->W = s->base.tap_width;
    s->V = target->cfg.vocab_size;
    s->n_ctx = draft->params.n_ctx;
    s->chunk = draft->params.max_batch_tokens;
    s->block = draft->cfg.df_block;
    s->mask = draft->cfg.df_mask_id;
    const size_t C = (size_t)s->chunk, S = (size_t)n_slots;
    s->slot = tap_slots_new(n_slots, s->W);
    s->jslot = ember_malloc(S * sizeof *s->jslot);
    s->jcnt = ember_malloc(S * sizeof *s->jcnt);
    s->tok = ember_malloc(C * sizeof *s->tok);
    s->pos = ember_malloc(C * sizeof *s->pos);
    s->row = ember_malloc(C * sizeof *s->row);
    s->outi = ember_malloc(C * sizeof *s->outi);
    s->apos = ember_malloc(C * sizeof *s->apos);
    s->tin = ember_malloc(C * (size_t)s->W * sizeof *s->tin);
    s->logits = ember_malloc(C * (size_t)s->V * sizeof *s->logits);
    bool ok = s->slot && s->jslot && s->jcnt && s->tok && s->pos && s->row && s->outi && s->apos && s->tin && s->logits;
    if (!ok) {
        df_destroy(&s->base);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory for the DFlash draft rows");
    }
    for (int i = 0; i < n_slots; i++) reset(s, i, -1);
    *out = &s->base;
    return EMBER_OK;
}
