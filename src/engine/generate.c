/*
 * generate.c - running requests as rows of one batch (ember_generate),
 * all-position logits (ember_logits) and the timing loop (ember_bench_run).
 *
 * Prefill packs the prompts of every row into chunks of at most
 * max_batch_tokens tokens; then each decode step feeds one token per live
 * row through one forward pass. Rows leave as they finish. Because no
 * kernel reduces across tokens, each row's logits and tokens are exactly
 * those it would get alone. A decode step whose rows record no logits has
 * the forward pick its tokens (forward_picks: greedy ids, and the device
 * draws of sampled rows where the backend has sample_rows), so no logits
 * row leaves a GPU.
 */
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "engine.h"
#include "sample/sampler.h"

int ember_engine_reserve_logits(ember_model *m, size_t rows, ember_error *err) {
    if (rows <= m->logits_rows) return EMBER_OK;
    size_t n;
    if (!ember_mul_ok(rows, (size_t)m->cfg.vocab_size * sizeof(float), &n))
        return ember_err(err, EMBER_ERR_NOMEM, "logits buffer size overflows");
    float *l = ember_realloc(m->logits, n);
    if (!l) return ember_err(err, EMBER_ERR_NOMEM, "out of memory for %zu rows of logits", rows);
    m->logits = l;
    m->logits_rows = rows;
    return EMBER_OK;
}

static bool is_eos(const ember_model *m, int32_t t) {
    for (int i = 0; i < m->cfg.n_eos; i++)
        if (m->cfg.eos_ids[i] == t) return true;
    return false;
}

typedef struct row_run {
    ember_request *req;
    ember_sampler *sampler;
    int prefilled; /* prompt tokens sent */
    bool done;
} row_run;

static int check_request(const ember_model *m, const ember_request *r, int i, ember_error *err) {
    const int V = m->cfg.vocab_size, C = m->params.n_ctx;
    if (!r->prompt || r->n_prompt < 1)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "request %d: the prompt is empty", i);
    if (r->max_new_tokens < 0 || (r->max_new_tokens > 0 && !r->out_ids))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "request %d: invalid max_new_tokens or output buffer", i);
    for (int k = 0; k < r->n_prompt; k++)
        if (r->prompt[k] < 0 || r->prompt[k] >= V)
            return ember_err(err, EMBER_ERR_INVALID_ARG,
                             "request %d: prompt token %d (id %d) is outside the vocabulary [0, %d)", i, k,
                             r->prompt[k], V);
    long need = (long)r->n_prompt + (r->max_new_tokens > 0 ? r->max_new_tokens - 1 : 0);
    if (need > C)
        return ember_err(err, EMBER_ERR_LIMIT,
                         "request %d: %d prompt tokens + %d new tokens need %ld positions, but the context holds %d",
                         i, r->n_prompt, r->max_new_tokens, need, C);
    return EMBER_OK;
}

/* Records a row's next token t. */
static void take_token(const ember_model *m, row_run *rr, int32_t t) {
    ember_request *r = rr->req;
    r->out_ids[r->n_out++] = t;
    if (r->n_out >= r->max_new_tokens || (!r->ignore_eos && is_eos(m, t))) rr->done = true;
}

/* Handles a row's new logits: records them if asked, samples at the end of
   the prompt and after each decode step. */
static void take_logits(ember_model *m, row_run *rr, const float *lg, int logit_row, bool sample) {
    ember_request *r = rr->req;
    const size_t V = (size_t)m->cfg.vocab_size;
    if (r->out_logits) memcpy(r->out_logits + (size_t)logit_row * V, lg, V * sizeof *lg);
    if (sample) take_token(m, rr, ember_sampler_sample(rr->sampler, lg));
}

/* Whether the forward may pick the tokens of a decode step's rows b_row[0,
   nt) itself: no request records logits, and sampled rows only where the
   backend draws (ember_model_draws). Then *draw says whether any row samples,
   and draws[o] holds each row's parameters and next uniform (taken from
   its sampler, as its host draw would take it: the same chain, so the
   tokens of the host's draws but where a cut falls within rounding,
   core/draw_def.h's ember_draw). Greedy rows give the host's ids exactly. */
static bool forward_picks(ember_model *m, row_run *rows, int nt, ember_draw *draws, bool *draw) {
    *draw = false;
    for (int o = 0; o < nt; o++) {
        const ember_request *r = rows[m->b_row[o]].req;
        if (r->out_logits || (r->sampling.temperature > 0 && !ember_model_draws(m))) return false;
        *draw |= r->sampling.temperature > 0;
    }
    for (int o = 0; *draw && o < nt; o++) draws[o] = ember_sampler_draw(rows[m->b_row[o]].sampler);
    return true;
}

int ember_generate(ember_model *m, ember_request *reqs, int n, ember_error *err) {
    if (!m || !reqs || n < 1 || n > m->params.n_rows)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%d requests for a model with %d rows", n,
                         m ? m->params.n_rows : 0);
    for (int i = 0; i < n; i++) {
        int rc = check_request(m, &reqs[i], i, err);
        if (rc) return rc;
    }
    row_run *rows = ember_calloc((size_t)n, sizeof *rows);
    int32_t *ids = ember_malloc((size_t)n * sizeof *ids); /* a decode step's tokens from the forward */
    ember_draw *draws = ember_malloc((size_t)n * sizeof *draws);
    if (!rows || !ids || !draws) {
        free(rows);
        free(ids);
        free(draws);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    }
    int rc = EMBER_OK;
    for (int i = 0; i < n && !rc; i++) {
        rows[i].req = &reqs[i];
        reqs[i].n_out = 0;
        rows[i].done = reqs[i].max_new_tokens == 0;
        rc = ember_sampler_new(&reqs[i].sampling, m->cfg.vocab_size, &rows[i].sampler, err);
        if (rc) ember_err_prefix(err, "request %d: ", i);
        ember_kv_clear(m->kv, i);
    }
    const int B = m->params.max_batch_tokens;
    bool full = false; /* does any request want every prompt position's logits? */
    for (int i = 0; i < n; i++) full |= reqs[i].out_logits != NULL;
    if (!rc) rc = ember_engine_reserve_logits(m, (size_t)(full ? B : n), err);
    /* prefill: pack prompts into chunks */
    int cur = 0;
    while (!rc && cur < n) {
        int nt = 0, no = 0;
        for (int i = cur; i < n && nt < B; i++) {
            ember_request *r = rows[i].req;
            int lim = ember_kv_max_append(m->kv, i); /* chunks stop at a KV conversion offset */
            for (int k = 0; rows[i].prefilled < r->n_prompt && nt < B && k < lim; k++) {
                int p = rows[i].prefilled++;
                m->b_tok[nt] = r->prompt[p];
                m->b_pos[nt] = p;
                m->b_row[nt] = i;
                if (r->out_logits || p == r->n_prompt - 1) m->b_out[no++] = nt;
                nt++;
            }
        }
        ember_batch b = {.n = nt, .tok = m->b_tok, .pos = m->b_pos, .row = m->b_row, .n_out = no, .out = m->b_out};
        if ((rc = ember_llm_forward(m->llm, m->st, m->kv, &b, m->logits, err))) break;
        for (int o = 0; o < no; o++) {
            int t = m->b_out[o], i = m->b_row[t];
            ember_request *r = rows[i].req;
            bool last = m->b_pos[t] == r->n_prompt - 1;
            take_logits(m, &rows[i], m->logits + (size_t)o * (size_t)m->cfg.vocab_size, m->b_pos[t],
                        last && !rows[i].done);
        }
        while (cur < n && rows[cur].prefilled == rows[cur].req->n_prompt) cur++;
    }
    /* decode: one token per live row per step */
    while (!rc) {
        int nt = 0;
        for (int i = 0; i < n; i++) {
            if (rows[i].done) continue;
            ember_request *r = rows[i].req;
            m->b_tok[nt] = r->out_ids[r->n_out - 1];
            m->b_pos[nt] = r->n_prompt + r->n_out - 1;
            m->b_row[nt] = i;
            m->b_out[nt] = nt;
            nt++;
        }
        if (nt == 0) break;
        bool draw;
        const bool picks = forward_picks(m, rows, nt, draws, &draw);
        ember_batch b = {.n = nt, .tok = m->b_tok, .pos = m->b_pos, .row = m->b_row, .n_out = nt, .out = m->b_out,
                         .argmax = picks ? ids : NULL, .draw = picks && draw ? draws : NULL};
        if ((rc = ember_llm_forward(m->llm, m->st, m->kv, &b, m->logits, err))) break;
        for (int o = 0; o < nt; o++) {
            int i = m->b_row[o];
            if (picks)
                take_token(m, &rows[i], ids[o]);
            else
                take_logits(m, &rows[i], m->logits + (size_t)o * (size_t)m->cfg.vocab_size,
                            rows[i].req->n_prompt + rows[i].req->n_out - 1, true);
        }
    }
    for (int i = 0; i < n; i++) ember_sampler_free(rows[i].sampler);
    free(rows);
    free(ids);
    free(draws);
    return rc;
}

int ember_logits(ember_model *m, const int32_t *ids, int n_ids, float *out, ember_error *err) {
    if (!m || !ids || !out || n_ids < 1)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "ember_logits needs a model, ids and an output buffer");
    if (n_ids > m->params.n_ctx)
        return ember_err(err, EMBER_ERR_LIMIT, "%d tokens do not fit the context of %d", n_ids, m->params.n_ctx);
    const int B = m->params.max_batch_tokens;
    ember_kv_clear(m->kv, 0);
    for (int s = 0, nt; s < n_ids; s += nt) {
        nt = n_ids - s < B ? n_ids - s : B;
        int lim = ember_kv_max_append(m->kv, 0);
        if (nt > lim) nt = lim;
        for (int i = 0; i < nt; i++) {
            m->b_tok[i] = ids[s + i];
            m->b_pos[i] = s + i;
            m->b_row[i] = 0;
            m->b_out[i] = i;
        }
        ember_batch b = {.n = nt, .tok = m->b_tok, .pos = m->b_pos, .row = m->b_row, .n_out = nt, .out = m->b_out};
        int rc = ember_llm_forward(m->llm, m->st, m->kv, &b, out + (size_t)s * (size_t)m->cfg.vocab_size, err);
        if (rc) return rc;
    }
    return EMBER_OK;
}

/* Feeds n synthetic tokens to row 0 from position start, in chunks; the
   last chunk's last logits land in m->logits. */
static int bench_prefill(ember_model *m, int start, int n, ember_error *err) {
    const int B = m->params.max_batch_tokens, V = m->cfg.vocab_size;
    for (int s = 0, nt; s < n; s += nt) {
        nt = n - s < B ? n - s : B;
        int lim = ember_kv_max_append(m->kv, 0);
        if (nt > lim) nt = lim;
        for (int i = 0; i < nt; i++) {
            m->b_tok[i] = (int32_t)(((uint32_t)(start + s + i) * 2654435761u) % (uint32_t)V);
            m->b_pos[i] = start + s + i;
            m->b_row[i] = 0;
        }
        m->b_out[0] = nt - 1;
        ember_batch b = {.n = nt, .tok = m->b_tok, .pos = m->b_pos, .row = m->b_row, .n_out = 1, .out = m->b_out};
        int rc = ember_llm_forward(m->llm, m->st, m->kv, &b, m->logits, err);
        if (rc) return rc;
    }
    return EMBER_OK;
}

int ember_bench_run_at(ember_model *m, int n_depth, int n_prompt, int n_gen, ember_bench_result *res,
                       ember_error *err) {
    if (!m || !res || n_depth < 0 || n_prompt < 0 || n_gen < 0 || n_depth + n_prompt + n_gen < 1 ||
        (long)n_depth + n_prompt + n_gen > m->params.n_ctx)
        return ember_err(err, EMBER_ERR_INVALID_ARG,
                         "benchmark of %d + %d + %d tokens does not fit the context of %d", n_depth, n_prompt, n_gen,
                         m ? m->params.n_ctx : 0);
    const int V = m->cfg.vocab_size;
    int rc = ember_engine_reserve_logits(m, 1, err);
    if (rc) return rc;
    ember_kv_clear(m->kv, 0);
    if ((rc = bench_prefill(m, 0, n_depth, err))) return rc;
    double t0 = ember_now();
    if ((rc = bench_prefill(m, n_depth, n_prompt, err))) return rc;
    double t1 = ember_now();
    int32_t tok = n_depth + n_prompt > 0 ? ember_argmax(m->logits, V) : 1 % V;
    for (int g = 0; g < n_gen; g++) {
        m->b_tok[0] = tok;
        m->b_pos[0] = n_depth + n_prompt + g;
        m->b_row[0] = 0;
        m->b_out[0] = 0;
        int32_t next = 0; /* greedy on the device where the backend can (argmax_rows) */
        ember_batch b = {.n = 1, .tok = m->b_tok, .pos = m->b_pos, .row = m->b_row, .n_out = 1, .out = m->b_out, .argmax = &next};
        if ((rc = ember_llm_forward(m->llm, m->st, m->kv, &b, m->logits, err))) return rc;
        tok = next;
    }
    double t2 = ember_now();
    res->prefill_seconds = t1 - t0;
    res->decode_seconds = t2 - t1;
    return EMBER_OK;
}

int ember_bench_run(ember_model *m, int n_prompt, int n_gen, ember_bench_result *res, ember_error *err) {
    if (n_prompt < 1) return ember_err(err, EMBER_ERR_INVALID_ARG, "a benchmark needs at least one prompt token");
    return ember_bench_run_at(m, 0, n_prompt, n_gen, res, err);
}
