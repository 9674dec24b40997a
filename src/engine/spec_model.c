/*
 * spec_model.c - the draft-model source (spec.h): a smaller model sharing
 * the target's vocabulary proposes, greedily, the tokens that follow a
 * row's history, from its own KV rows (slot s of the source is row s of the
 * draft model's cache).
 *
 * State per slot: the tokens the draft row holds (held[s], n_held[s]). A
 * proposal first brings the row in step with the history the engine passes:
 * the common prefix of held and history stays, the rest is trimmed and the
 * history's remainder is prefilled; then each further token is one draft
 * forward. Accepted or rejected drafts, a preempted row whose history comes
 * back whole, a request that took a row holding another's tokens: all are
 * the same case, the next proposal's catch-up, so commit needs no work and
 * nothing can drift out of step. A row whose trim is refused (a rotating
 * window that no longer holds the shared prefix) is cleared and prefilled.
 *
 * Ownership: the source borrows the draft model (the caller loaded it, with
 * at least the target's rows and context, and frees it after the engine);
 * it owns held[] and its logits. Threading: the engine thread only, which
 * is also the only user of the draft model.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "kv/kv.h"
#include "model/model.h"
#include "spec.h"
#include "core/alloc.h"

typedef struct model_src {
    ember_draft base;
    ember_model *m;
    int32_t **held; /* [n_slots][n_ctx] tokens in the draft row */
    int *n_held;
    float *logits;  /* [V] the last position's logits */
    int32_t *pos, *row; /* [max_batch_tokens] staging */
    int n_ctx, chunk;
} model_src;

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Feeds tokens t[0, n) at positions start.. of row `slot`, in chunks; the
   logits of the last one land in s->logits. */
static int feed(model_src *s, int slot, const int32_t *t, int n, int start) {
    ember_error err = {0};
    for (int o = 0; o < n;) {
        int k = n - o < s->chunk ? n - o : s->chunk;
        for (int i = 0; i < k; i++) {
            s->pos[i] = start + o + i;
            s->row[i] = slot;
        }
        int32_t last = k - 1;
        ember_batch b = {k, t + o, s->pos, s->row, 1, &last};
        int rc = ember_llm_forward(s->m->llm, s->m->st, s->m->kv, &b, s->logits, &err);
        if (rc) return rc;
        memcpy(s->held[slot] + start + o, t + o, (size_t)k * sizeof *t);
        s->n_held[slot] = start + o + k;
        o += k;
    }
    return EMBER_OK;
}

static void reset(model_src *s, int slot) {
    ember_kv_clear(s->m->kv, slot);
    s->n_held[slot] = 0;
}

static int model_draft(ember_draft *d, int slot, const int32_t *hist, int n_hist, int n_max, int32_t *out) {
    model_src *s = (model_src *)d;
    const int V = s->m->cfg.vocab_size;
    if (n_hist + n_max > s->n_ctx) n_max = s->n_ctx - n_hist;
    if (n_max <= 0) return 0;
    /* in step with the history: keep the common prefix, feed the rest */
    int c = 0, h = s->n_held[slot];
    while (c < h && c < n_hist && s->held[slot][c] == hist[c]) c++;
    if (c == n_hist) c--; /* the last token is fed again: its logits propose the first draft */
    if (c < h) {
        if (c < ember_kv_min_reuse(s->m->kv, slot) || ember_kv_trim(s->m->kv, slot, c, NULL) != EMBER_OK) {
            reset(s, slot);
            c = 0;
        }
        s->n_held[slot] = c;
    }
    if (feed(s, slot, hist + c, n_hist - c, c) != EMBER_OK) {
        reset(s, slot);
        return 0;
    }
    int n = 0;
    for (;;) {
        out[n] = argmax(s->logits, V);
        if (++n == n_max) break;
        if (feed(s, slot, &out[n - 1], 1, n_hist + n - 1) != EMBER_OK) {
            reset(s, slot); /* the n proposals so far came from sound logits */
            break;
        }
    }
    return n;
}

static void model_close(ember_draft *d, int slot) {
    reset((model_src *)d, slot);
}

static void model_destroy(ember_draft *d) {
    model_src *s = (model_src *)d;
    if (!s) return;
    for (int i = 0; s->held && i < s->base.n_slots; i++) free(s->held[i]);
    free(s->held);
    free(s->n_held);
    free(s->logits);
    free(s->pos);
    free(s->row);
    free(s);
}

static const ember_draft_ops k_model_ops = {
    .name = "draft",
    .draft = model_draft,
    .close = model_close,
    .destroy = model_destroy,
};

int ember_draft_model_new(ember_model *draft, const ember_model *target, int n_slots, ember_draft **out,
                          ember_error *err) {
    *out = NULL;
    if (!draft) return ember_err(err, EMBER_ERR_INVALID_ARG, "speculative decoding with a draft model: no draft model given");
    if (draft == target)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "the draft model must be loaded apart from the target (its own cache)");
    if (draft->cfg.vocab_size != target->cfg.vocab_size)
        return ember_err(err, EMBER_ERR_INVALID_ARG,
                         "the draft model's vocabulary has %d tokens, the target's %d: they must share one",
                         draft->cfg.vocab_size, target->cfg.vocab_size);
    if (draft->params.n_rows < n_slots || draft->params.n_ctx < target->params.n_ctx)
        return ember_err(err, EMBER_ERR_INVALID_ARG,
                         "the draft model holds %d rows of %d positions; the target needs %d of %d",
                         draft->params.n_rows, draft->params.n_ctx, n_slots, target->params.n_ctx);
    model_src *s = ember_calloc(1, sizeof *s);
    if (!s) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    s->base = (ember_draft){&k_model_ops, n_slots};
    s->m = draft;
    s->n_ctx = target->params.n_ctx;
    s->chunk = draft->params.max_batch_tokens;
    s->held = ember_calloc((size_t)n_slots, sizeof *s->held);
    s->n_held = ember_calloc((size_t)n_slots, sizeof *s->n_held);
    s->logits = ember_malloc((size_t)draft->cfg.vocab_size * sizeof *s->logits);
    s->pos = ember_malloc((size_t)s->chunk * sizeof *s->pos);
    s->row = ember_malloc((size_t)s->chunk * sizeof *s->row);
    bool ok = s->held && s->n_held && s->logits && s->pos && s->row;
    for (int i = 0; ok && i < n_slots; i++) ok = (s->held[i] = ember_malloc((size_t)(s->n_ctx + 1) * sizeof(int32_t))) != NULL;
    if (!ok) {
        model_destroy(&s->base);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory for the draft model's rows");
    }
    for (int i = 0; i < n_slots; i++) ember_kv_clear(draft->kv, i);
    *out = &s->base;
    return EMBER_OK;
}
