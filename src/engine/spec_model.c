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
 * A draft model with recurrent state (a hybrid: its rows cannot be trimmed)
 * instead drafts inside a speculative round of its own cache: the history
 * up to its last token is fed outside the round, then the round begins and
 * the last token and the drafts are fed; the next proposal commits the
 * round's positions the new history kept (kv.h: a replay of k recurrent
 * steps at most) or rolls it back, so the row is never prefilled again.
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
    int32_t *pos, *row; /* [max_batch_tokens] staging */
    int *round_base;    /* [n_slots] recurrent draft caches: the open round's first position, or -1 */
    /* draft_many's scratch: per job (at most n_slots) its count, start, wish and state,
       the staged batch [chunk] (tokens, logit rows and their jobs), the logits [n_slots * V] */
    int *want, *at, *cnt;
    bool *live;
    const int32_t **jtok;
    int32_t *tok, *outi, *outj;
    float *logits_many;
    int n_ctx, chunk;
} model_src;

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void reset(model_src *s, int slot) {
    ember_kv_clear(s->m->kv, slot); /* ends any round too */
    s->n_held[slot] = 0;
    s->round_base[slot] = -1;
}

/* A recurrent draft row in a round: keep the round's positions below c
   (the part of the held tokens the new history shares), or none. */
static void end_round(model_src *s, int slot, int c) {
    ember_kv *kv = s->m->kv;
    int base = s->round_base[slot];
    s->round_base[slot] = -1;
    if (!ember_kv_in_spec(kv, slot)) return;
    int len = ember_kv_len(kv, slot), k = c < base ? 0 : (c > len ? len : c) - base;
    if (ember_kv_spec_commit(kv, slot, k, NULL) != EMBER_OK) {
        reset(s, slot);
        return;
    }
    s->n_held[slot] = base + k;
}

/* One batched feed: for each job j (live[j] set), tokens tok[j][0, cnt[j])
   at positions at[j].. of row slot[j]; the logits of each job's last token
   go to s->logits_many[j] when want_logits. Forwards of at most s->chunk
   tokens. A failed forward resets the rows it held and clears their live
   flag; returns how many jobs are still live. */
static int feed_many(model_src *s, int n, const int *slot, const int32_t *const *tok, const int *cnt, const int *at,
                     bool *live, bool want_logits) {
    const int V = s->m->cfg.vocab_size;
    int j = 0, o = 0; /* the next token: job j, offset o */
    while (j < n) {
        int nt = 0, nout = 0, first = j, first_o = o;
        while (j < n && nt < s->chunk) {
            if (!live[j] || o >= cnt[j]) {
                j++;
                o = 0;
                continue;
            }
            s->tok[nt] = tok[j][o];
            s->pos[nt] = at[j] + o;
            s->row[nt] = slot[j];
            if (want_logits && o == cnt[j] - 1) {
                s->outi[nout] = nt;
                s->outj[nout++] = j;
            }
            nt++;
            if (++o == cnt[j]) {
                j++;
                o = 0;
            }
        }
        if (!nt) break;
        ember_error err = {0};
        ember_batch b = {.n = nt, .tok = s->tok, .pos = s->pos, .row = s->row, .n_out = nout, .out = s->outi};
        /* the logits land from row outj[0] on (rows below hold earlier forwards' jobs) */
        float *lg = s->logits_many + (size_t)(nout ? s->outj[0] : 0) * (size_t)V;
        int rc = ember_llm_forward(s->m->llm, s->m->st, s->m->kv, &b, lg, &err);
        /* the jobs this forward touched: from (first, first_o) up to (j, o) */
        for (int q = first, qo = first_o; q < n && (q < j || (q == j && qo < o)); q++, qo = 0) {
            if (!live[q] || qo >= cnt[q]) continue;
            int end = q < j ? cnt[q] : o;
            if (rc) {
                reset(s, slot[q]);
                live[q] = false;
            } else {
                memcpy(s->held[slot[q]] + at[q] + qo, tok[q] + qo, (size_t)(end - qo) * sizeof(int32_t));
                s->n_held[slot[q]] = at[q] + end;
            }
        }
        if (!rc && want_logits) /* each finished job's logits to its own row of the staging area */
            for (int k = nout - 1; k >= 0; k--) /* spread upward: outj[k] >= outj[0] + k */
                if (s->outj[k] != s->outj[0] + k)
                    memmove(s->logits_many + (size_t)s->outj[k] * V, lg + (size_t)k * V, (size_t)V * sizeof(float));
    }
    int left = 0;
    for (int q = 0; q < n; q++) left += live[q];
    return left;
}

static void model_draft_many(ember_draft *d, int n, const int *slots, const int32_t *const *hist, const int *n_hist,
                             const int *n_max, int32_t *const *out, int *n_out) {
    model_src *s = (model_src *)d;
    ember_kv *kv = s->m->kv;
    const int V = s->m->cfg.vocab_size;
    const bool rec = ember_kv_state_bytes(kv) > 0;
    int *want = s->want, *at = s->at, *cnt = s->cnt;
    bool *live = s->live;
    const int32_t **tok = s->jtok;
    for (int i = 0; i < n; i++) {
        const int slot = slots[i];
        n_out[i] = 0;
        want[i] = n_hist[i] + n_max[i] > s->n_ctx ? s->n_ctx - n_hist[i] : n_max[i];
        live[i] = want[i] > 0 && n_hist[i] > 0;
        if (!live[i]) {
            if (s->round_base[slot] >= 0) end_round(s, slot, 0);
            continue;
        }
        /* in step with the history: keep the common prefix, feed the rest */
        int c = 0, h = s->n_held[slot];
        while (c < h && c < n_hist[i] && s->held[slot][c] == hist[i][c]) c++;
        if (c == n_hist[i]) c--; /* the last token is fed again: its logits propose the first draft */
        if (s->round_base[slot] >= 0) {
            end_round(s, slot, c);
            h = s->n_held[slot];
            if (c > h) c = h;
        }
        if (c < h) {
            if (c < ember_kv_min_reuse(kv, slot) || ember_kv_trim(kv, slot, c, NULL) != EMBER_OK) {
                reset(s, slot);
                c = 0;
            }
            s->n_held[slot] = c;
        }
        /* first the history up to its last token (for a recurrent cache, outside the round) */
        tok[i] = hist[i] + c;
        cnt[i] = n_hist[i] - 1 - c;
        at[i] = c;
    }
    if (!feed_many(s, n, slots, tok, cnt, at, live, false)) return;
    for (int i = 0; i < n; i++) { /* then the last token, whose logits propose the first draft */
        if (!live[i]) continue;
        if (rec) {
            if (ember_kv_spec_begin(kv, slots[i], NULL) != EMBER_OK) {
                reset(s, slots[i]);
                live[i] = false;
                continue;
            }
            s->round_base[slots[i]] = n_hist[i] - 1;
        }
        tok[i] = hist[i] + n_hist[i] - 1;
        cnt[i] = 1;
        at[i] = n_hist[i] - 1;
    }
    /* one token per row per forward, each row's last proposal fed back */
    while (feed_many(s, n, slots, tok, cnt, at, live, true)) {
        bool more = false;
        for (int i = 0; i < n; i++) {
            if (!live[i]) continue;
            out[i][n_out[i]] = argmax(s->logits_many + (size_t)i * V, V);
            if (++n_out[i] == want[i]) {
                live[i] = false;
                continue;
            }
            tok[i] = &out[i][n_out[i] - 1];
            at[i] = n_hist[i] + n_out[i] - 1;
            more = true;
        }
        if (!more) break;
    }
}

static int model_draft(ember_draft *d, int slot, const int32_t *hist, int n_hist, int n_max, int32_t *out) {
    int n = 0;
    model_draft_many(d, 1, &slot, &hist, &n_hist, &n_max, &out, &n);
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
    free(s->round_base);
    free(s->want);
    free(s->at);
    free(s->cnt);
    free(s->live);
    free(s->jtok);
    free(s->tok);
    free(s->outi);
    free(s->outj);
    free(s->logits_many);
    free(s->pos);
    free(s->row);
    free(s);
}

static const ember_draft_ops k_model_ops = {
    .name = "draft",
    .draft = model_draft,
    .draft_many = model_draft_many,
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
    s->base = (ember_draft){.ops = &k_model_ops, .n_slots = n_slots};
    s->m = draft;
    s->n_ctx = target->params.n_ctx;
    s->chunk = draft->params.max_batch_tokens;
    s->held = ember_calloc((size_t)n_slots, sizeof *s->held);
    s->n_held = ember_calloc((size_t)n_slots, sizeof *s->n_held);
    s->round_base = ember_malloc((size_t)n_slots * sizeof *s->round_base);
    s->want = ember_malloc((size_t)n_slots * sizeof *s->want);
    s->at = ember_malloc((size_t)n_slots * sizeof *s->at);
    s->cnt = ember_malloc((size_t)n_slots * sizeof *s->cnt);
    s->live = ember_malloc((size_t)n_slots * sizeof *s->live);
    s->jtok = ember_malloc((size_t)n_slots * sizeof *s->jtok);
    s->tok = ember_malloc((size_t)s->chunk * sizeof *s->tok);
    s->outi = ember_malloc((size_t)s->chunk * sizeof *s->outi);
    s->outj = ember_malloc((size_t)s->chunk * sizeof *s->outj);
    s->logits_many = ember_malloc((size_t)n_slots * (size_t)draft->cfg.vocab_size * sizeof *s->logits_many);
    s->pos = ember_malloc((size_t)s->chunk * sizeof *s->pos);
    s->row = ember_malloc((size_t)s->chunk * sizeof *s->row);
    bool ok = s->held && s->n_held && s->round_base && s->pos && s->row && s->want && s->at && s->cnt &&
              s->live && s->jtok && s->tok && s->outi && s->outj && s->logits_many;
    for (int i = 0; ok && i < n_slots; i++) ok = (s->held[i] = ember_malloc((size_t)(s->n_ctx + 1) * sizeof(int32_t))) != NULL;
    if (!ok) {
        model_destroy(&s->base);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory for the draft model's rows");
    }
    for (int i = 0; i < n_slots; i++) {
        ember_kv_clear(draft->kv, i);
        s->round_base[i] = -1;
    }
    *out = &s->base;
    return EMBER_OK;
}
