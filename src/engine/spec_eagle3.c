/*
 * spec_eagle3.c - the EAGLE-3 draft source (spec.h): an EAGLE-3 draft model
 * (model/eagle3.c) proposes, greedily, the tokens that follow a row's
 * history from the target's hidden taps and its own cache rows (slot s of
 * the source is row s of the draft model's cache).
 *
 * Alignment, as in the published EAGLE-3 code: the draft model's position
 * i pairs the target's taps at position t = base + i (the state that
 * produced token t + 1) with the token t + 1; its output predicts token
 * t + 2. So when the row's history holds n tokens and the draft row holds
 * pairs up to t = n - 2, that last position's logits propose token n (the
 * first draft); each further draft feeds the draft model's own output
 * hidden state with the draft just proposed (no taps exist for it yet).
 *
 * State per slot: base (the target position of draft row position 0),
 * n_held (draft positions made from the target's taps; positions above
 * them are the last proposal's and are trimmed before anything else), and
 * pending taps: target positions whose next token was not known when the
 * engine handed them over (observe runs before verification). Each pending
 * position t is kept once the history confirms it (the token fed there is
 * hist[t] and hist[t + 1] exists) and dropped at the first that it does not
 * (a rejected draft). Positions arrive in order; a gap (a prompt prefix the
 * target took from the prefix cache, so computed no taps for it) starts
 * the draft row afresh at the first position with taps: drafts then see a
 * shorter context, never a wrong one. A row whose last fed position has no
 * taps proposes nothing.
 *
 * Rollback: nothing to do at commit. The draft row's proposal positions
 * are trimmed at the next feed, and pending taps of rejected drafts fail
 * the history check. Output never depends on the draft: drafts are only
 * proposals, verified by the target (docs/speculative.md).
 *
 * The same source runs a hybrid model's own MTP head (model/mtp.c, "mtp"):
 * one tap, the target's state after its final norm, the same alignment
 * (the head's position i pairs the target's state at t with token t + 1),
 * the target's vocabulary (no d2t), and its own output fed back as the
 * next step's hidden input; only the forward differs.
 *
 * Ownership: borrows the EAGLE-3 draft model (and through it the target's
 * embedding); owns the MTP head's model (built from the target at
 * ember_draft_mtp_new) and the per-slot buffers. Threading: the engine
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


/* A draft forward: ember_eagle3_forward or ember_mtp_forward (model.h). */
typedef int (*draft_fwd)(ember_llm *m, ember_llm_state *st, ember_kv *kv, const ember_batch *b, const float *taps,
                         const int32_t *hid_src, const int32_t *hid_dst, float *logits, ember_error *err);

typedef struct e3_src {
    ember_draft base;
    ember_model *m;      /* the draft model (EAGLE-3) or MTP head */
    ember_model *own;    /* the MTP head, owned; NULL for EAGLE-3 */
    draft_fwd fwd;
    const int32_t *d2t;  /* draft id i is target id i + d2t[i]; NULL: the identity (MTP) */
    tap_slot *slot;
    int W, Vd, n_ctx, chunk;
    /* one feed's jobs (at most n_slots): slot, count, and whether its logits are wanted */
    int *jslot, *jcnt;
    float *logits; /* [n_slots * Vd] */
    int *want;     /* [n_slots] draft_many's proposals wanted per job */
    const int32_t **hist_by_slot; /* [n_slots] draft_many's histories, by slot */
    /* a forward's staging [chunk] */
    int32_t *tok, *pos, *row, *outi, *hsrc, *hdst;
    float *tin; /* [chunk * W] */
} e3_src;

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void reset(e3_src *s, int slot, int base) {
    tap_slot_reset(&s->slot[slot], s->m->kv, slot, base);
}

/* The draft row back to its n_held positions made from taps (a proposal's positions go). */
static bool trim_to_held(e3_src *s, int slot) {
    return tap_slot_trim(&s->slot[slot], s->m->kv, slot);
}

/* How many of slot's pending positions the history confirms (fed token
   hist[t], next token known); drops the pending from the first refuted one. */
static int confirmed(e3_src *s, int slot, const int32_t *hist, int n_hist) {
    tap_slot *e = &s->slot[slot];
    int k = 0;
    while (k < e->np) {
        int t = e->p0 + k;
        if (t >= n_hist || hist[t] != e->ptok[k]) { /* a rejected draft: it and all after it */
            e->np = k;
            break;
        }
        if (t + 1 >= n_hist) break; /* its next token is not known yet */
        k++;
    }
    return k;
}

/* Feeds jobs j < n: the first jcnt[j] pending positions of slot jslot[j]
   (pairs taps t, hist[t + 1]) in forwards of at most s->chunk tokens; with
   want, each job's last token's logits into s->logits row j and its hidden
   state into the run state's row j. A failed forward resets the rows it
   held (their jcnt becomes 0). */
static void feed(e3_src *s, int n, const int32_t *const *hist, bool want) {
    ember_model *m = s->m;
    int j = 0, o = 0;
    while (j < n) {
        int nt = 0, nout = 0, first = j, first_o = o;
        while (j < n && nt < s->chunk) {
            if (o >= s->jcnt[j]) {
                j++, o = 0;
                continue;
            }
            tap_slot *e = &s->slot[s->jslot[j]];
            int t = e->p0 + o;
            s->tok[nt] = hist[s->jslot[j]][t + 1];
            s->pos[nt] = t - e->base;
            s->row[nt] = s->jslot[j];
            memcpy(s->tin + (size_t)nt * s->W, e->ptaps + (size_t)o * s->W, (size_t)s->W * sizeof(float));
            if (want && o == s->jcnt[j] - 1) s->outi[nout] = nt, s->hdst[nout++] = j;
            nt++;
            if (++o == s->jcnt[j]) j++, o = 0;
        }
        if (!nt) break;
        ember_batch b = {.n = nt, .tok = s->tok, .pos = s->pos, .row = s->row, .n_out = nout, .out = s->outi};
        float *lg = s->logits + (size_t)(nout ? s->hdst[0] : 0) * s->Vd;
        ember_error err = {0};
        int rc = s->fwd(m->llm, m->st, m->kv, &b, s->tin, NULL, s->hdst, lg, &err);
        if (!rc) /* each job's logits to its own row (they landed from row hdst[0] on) */
            for (int k = nout - 1; k >= 0; k--)
                if (s->hdst[k] != s->hdst[0] + k)
                    memmove(s->logits + (size_t)s->hdst[k] * s->Vd, lg + (size_t)k * s->Vd, (size_t)s->Vd * sizeof(float));
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
    for (int q = 0; q < n; q++) { /* the fed positions leave the pending */
        tap_slot *e = &s->slot[s->jslot[q]];
        int k = s->jcnt[q];
        if (k <= 0 || e->base < 0) continue;
        memmove(e->ptok, e->ptok + k, (size_t)(e->np - k) * sizeof *e->ptok);
        memmove(e->ptaps, e->ptaps + (size_t)k * s->W, (size_t)(e->np - k) * s->W * sizeof(float));
        e->p0 += k;
        e->np -= k;
    }
}

/* Sets up job j for slot: its confirmed pending positions, the draft row trimmed to its held part. */
static int job(e3_src *s, int j, int slot, const int32_t *hist, int n_hist) {
    s->jslot[j] = slot;
    s->jcnt[j] = 0;
    tap_slot *e = &s->slot[slot];
    if (e->base < 0 || !trim_to_held(s, slot)) return 0;
    int k = confirmed(s, slot, hist, n_hist);
    if (e->p0 - e->base + k > s->n_ctx) k = 0; /* past the draft row's context */
    s->jcnt[j] = k;
    return k;
}

static void e3_observe(ember_draft *d, int n, const int *slot, const int32_t *pos, const int32_t *tok, const float *taps,
                       const int32_t *const *hist, const int *n_hist) {
    e3_src *s = (e3_src *)d;
    for (int i = 0; i < n; i++) {
        const int sl = slot[i];
        if (sl < 0 || sl >= d->n_slots || !s->slot[sl].open) continue;
        tap_slot *e = &s->slot[sl];
        const int t = pos[i];
        tap_slot_place(e, s->m->kv, sl, t);
        if (e->np == TAP_PEND_CAP) { /* full (a long prompt chunk): take what the history confirms */
            int k = job(s, 0, sl, hist[sl], n_hist[sl]);
            if (k) feed(s, 1, hist, false);
            if (e->np == TAP_PEND_CAP || e->base < 0) reset(s, sl, t);
        }
        tap_slot_push(e, tok[i], taps + (size_t)i * s->W, s->W);
    }
    /* every slot touched: feed what its history already confirms (a prompt's inside), in shared forwards */
    int nj = 0;
    for (int i = 0; i < n; i++) {
        const int sl = slot[i];
        if (sl < 0 || sl >= d->n_slots || !s->slot[sl].open || (i > 0 && slot[i - 1] == sl)) continue;
        bool seen = false;
        for (int q = 0; q < nj && !seen; q++) seen = s->jslot[q] == sl;
        if (!seen && job(s, nj, sl, hist[sl], n_hist[sl]) > 0) nj++;
    }
    if (nj) feed(s, nj, hist, false);
}

/* Draft forwards: each live job's next token with its own last hidden state,
   until each has its want[j] proposals (n_out[j] holds the first already). */
static void draft_on(e3_src *s, int n, const int *slots, const int *n_hist, const int *want, int32_t *const *out,
                     int *n_out) {
    ember_model *m = s->m;
    const int32_t *d2t = s->d2t;
    for (;;) {
        int nt = 0;
        for (int j = 0; j < n; j++) {
            if (n_out[j] == 0 || n_out[j] >= want[j]) continue;
            tap_slot *e = &s->slot[slots[j]];
            s->tok[nt] = out[j][n_out[j] - 1];
            s->pos[nt] = n_hist[j] - 1 - e->base + n_out[j] - 1;
            s->row[nt] = slots[j];
            s->outi[nt] = nt;
            s->hsrc[nt] = s->hdst[nt] = j;
            nt++;
        }
        if (!nt) return;
        ember_batch b = {.n = nt, .tok = s->tok, .pos = s->pos, .row = s->row, .n_out = nt, .out = s->outi};
        ember_error err = {0};
        if (s->fwd(m->llm, m->st, m->kv, &b, NULL, s->hsrc, s->hdst, s->logits, &err)) {
            for (int k = 0; k < nt; k++) reset(s, s->row[k], -1);
            return; /* the proposals so far stand: drafts are only proposals */
        }
        for (int k = 0; k < nt; k++) {
            int j = s->hdst[k], id = argmax(s->logits + (size_t)k * s->Vd, s->Vd);
            out[j][n_out[j]++] = id + (d2t ? d2t[id] : 0);
        }
    }
}

static void e3_draft_many(ember_draft *d, int n, const int *slots, const int32_t *const *hist, const int *n_hist,
                          const int *n_max, int32_t *const *out, int *n_out) {
    e3_src *s = (e3_src *)d;
    const int32_t *d2t = s->d2t;
    int *want = s->want;
    for (int j = 0; j < n; j++) {
        n_out[j] = 0;
        s->hist_by_slot[slots[j]] = hist[j];
        tap_slot *e = &s->slot[slots[j]];
        want[j] = 0;
        /* the pending positions the history confirms; after them the draft row must end at
           position n_hist - 2, whose logits propose token n_hist */
        int k = e->open ? job(s, j, slots[j], hist[j], n_hist[j]) : (s->jslot[j] = slots[j], s->jcnt[j] = 0);
        if (k == 0 || e->p0 + k != n_hist[j] - 1) {
            s->jcnt[j] = 0;
            continue;
        }
        int room = s->n_ctx - (n_hist[j] - 1 - e->base); /* draft row positions left */
        want[j] = n_max[j] < room ? n_max[j] : room;
        if (want[j] <= 0) s->jcnt[j] = 0, want[j] = 0;
    }
    feed(s, n, s->hist_by_slot, true);
    for (int j = 0; j < n; j++) {
        tap_slot *e = &s->slot[slots[j]];
        if (want[j] <= 0 || s->jcnt[j] == 0 || e->base < 0 || e->base + e->n_held != n_hist[j] - 1) {
            want[j] = 0;
            continue;
        }
        int id = argmax(s->logits + (size_t)j * s->Vd, s->Vd);
        out[j][0] = id + (d2t ? d2t[id] : 0);
        n_out[j] = 1;
    }
    draft_on(s, n, slots, n_hist, want, out, n_out);
}

static int e3_draft(ember_draft *d, int slot, const int32_t *hist, int n_hist, int n_max, int32_t *out) {
    int n = 0;
    e3_draft_many(d, 1, &slot, &hist, &n_hist, &n_max, &out, &n);
    return n;
}

static int e3_open(ember_draft *d, int slot, const int32_t *hist, int n_hist, ember_error *err) {
    (void)hist, (void)n_hist, (void)err;
    e3_src *s = (e3_src *)d;
    reset(s, slot, -1);
    s->slot[slot].open = true;
    return EMBER_OK;
}

static void e3_close(ember_draft *d, int slot) {
    e3_src *s = (e3_src *)d;
    reset(s, slot, -1);
    s->slot[slot].open = false;
}

static void e3_destroy(ember_draft *d) {
    e3_src *s = (e3_src *)d;
    if (!s) return;
    tap_slots_free(s->slot, s->base.n_slots);
    free(s->jslot);
    free(s->jcnt);
    free(s->logits);
    free(s->want);
    free(s->hist_by_slot);
    free(s->tok);
    free(s->pos);
    free(s->row);
    free(s->outi);
    free(s->hsrc);
    free(s->hdst);
    free(s->tin);
    ember_model_free(s->own);
    free(s);
}

static const ember_draft_ops k_e3_ops = {
    .name = "eagle3",
    .open = e3_open,
    .draft = e3_draft,
    .draft_many = e3_draft_many,
    .observe = e3_observe,
    .close = e3_close,
    .destroy = e3_destroy,
};

static const ember_draft_ops k_mtp_ops = {
    .name = "mtp",
    .open = e3_open,
    .draft = e3_draft,
    .draft_many = e3_draft_many,
    .observe = e3_observe,
    .close = e3_close,
    .destroy = e3_destroy,
};

/* The source over draft model `draft` (its cache rows are the slots):
   taps[0, n_taps) of the target, W floats per token, logits over Vd ids.
   `own` (freed with the source, also on failure) or NULL. */
static int src_new(const ember_draft_ops *ops, ember_model *draft, ember_model *own, draft_fwd fwd, const int32_t *d2t,
                   const int32_t *taps, int n_taps, int W, int Vd, int n_slots, ember_draft **out, ember_error *err) {
    e3_src *s = ember_calloc(1, sizeof *s);
    if (!s) {
        ember_model_free(own);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    }
    s->base = (ember_draft){.ops = ops, .n_slots = n_slots, .n_tap_layers = n_taps, .tap_width = W};
    memcpy(s->base.tap_layers, taps, (size_t)n_taps * sizeof *taps);
    s->m = draft;
    s->own = own;
    s->fwd = fwd;
    s->d2t = d2t;
    s->W = W;
    s->Vd = Vd;
    s->n_ctx = draft->params.n_ctx;
    s->chunk = draft->params.max_batch_tokens;
    const size_t C = (size_t)s->chunk, S = (size_t)n_slots;
    s->slot = tap_slots_new(n_slots, s->W);
    s->jslot = ember_malloc(S * sizeof *s->jslot);
    s->jcnt = ember_malloc(S * sizeof *s->jcnt);
    s->logits = ember_malloc(S * (size_t)s->Vd * sizeof *s->logits);
    s->want = ember_malloc(S * sizeof *s->want);
    s->hist_by_slot = ember_calloc(S, sizeof *s->hist_by_slot);
    s->tok = ember_malloc(C * sizeof *s->tok);
    s->pos = ember_malloc(C * sizeof *s->pos);
    s->row = ember_malloc(C * sizeof *s->row);
    s->outi = ember_malloc(C * sizeof *s->outi);
    s->hsrc = ember_malloc(C * sizeof *s->hsrc);
    s->hdst = ember_malloc(C * sizeof *s->hdst);
    s->tin = ember_malloc(C * (size_t)s->W * sizeof *s->tin);
    bool ok = s->slot && s->jslot && s->jcnt && s->logits && s->want && s->hist_by_slot && s->tok && s->pos && s->row &&
              s->outi && s->hsrc && s->hdst && s->tin;
    if (!ok) {
        e3_destroy(&s->base);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory for the %s draft rows", ops->name);
    }
    for (int i = 0; i < n_slots; i++) reset(s, i, -1);
    *out = &s->base;
    return EMBER_OK;
}

int ember_draft_eagle3_new(ember_model *draft, ember_model *target, int n_slots, ember_draft **out, ember_error *err) {
    *out = NULL;
    if (!draft) return ember_err(err, EMBER_ERR_INVALID_ARG, "speculative decoding with EAGLE-3: no draft model given");
    if (draft == target)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "the EAGLE-3 draft model must be loaded apart from the target");
    if (!draft->cfg.eagle3)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "the draft model is not an EAGLE-3 draft model (--spec draft runs it)");
    if (draft->params.n_rows < n_slots || draft->params.n_ctx < target->params.n_ctx)
        return ember_err(err, EMBER_ERR_INVALID_ARG,
                         "the EAGLE-3 draft model holds %d rows of %d positions; the target needs %d of %d",
                         draft->params.n_rows, draft->params.n_ctx, n_slots, target->params.n_ctx);
    int32_t taps[8];
    int n_taps = 0;
    int rc = ember_eagle3_bind(draft->llm, target->llm, taps, &n_taps, err);
    if (rc) return rc;
    return src_new(&k_e3_ops, draft, NULL, ember_eagle3_forward, draft->llm->e3_d2t, taps, n_taps,
                   n_taps * target->cfg.hidden_size, draft->cfg.e3_draft_vocab, n_slots, out, err);
}

int ember_draft_mtp_new(ember_model *target, int n_slots, ember_draft **out, ember_error *err) {
    *out = NULL;
    ember_model *head = NULL;
    int rc = ember_model_mtp_new(target, &head, err);
    if (rc) return rc;
    if (head->params.n_rows < n_slots) {
        ember_model_free(head);
        return ember_err(err, EMBER_ERR_INVALID_ARG, "the MTP head holds %d rows; the engine needs %d",
                         head->params.n_rows, n_slots);
    }
    const int32_t tap = EMBER_TAP_NORMED;
    return src_new(&k_mtp_ops, head, head, ember_mtp_forward, NULL, &tap, 1, target->cfg.hidden_size,
                   target->cfg.vocab_size, n_slots, out, err);
}
