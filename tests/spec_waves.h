/*
 * spec_waves.h - the request waves of the drafter tests (test_eagle3.c,
 * test_mtp.c): NREQ greedy requests of varied prompts, lengths, draft
 * lengths, opt-outs and stop ids, run at once through an engine, and the
 * comparison of a speculative result against the plain one (ids, logprobs
 * and finish bit for bit, cut at the request's stop id).
 *
 * Include after fixture.h with NREQ and MAXGEN defined.
 */
#ifndef EMBER_TEST_SPEC_WAVES_H
#define EMBER_TEST_SPEC_WAVES_H

#include <string.h>

#include "ember.h"
#include "fixture.h"

/* One request's output: ids and logprobs of its tokens, and its done event. */
typedef struct result {
    int32_t ids[MAXGEN];
    float lp[MAXGEN];
    int n;
    ember_event done;
} result;

typedef struct reqset {
    int32_t prompt[NREQ][64];
    int plen[NREQ], max_tokens[NREQ], draft_max[NREQ];
    bool opt_out[NREQ];
    int32_t stop[NREQ];
} reqset;

static inline void make_requests(reqset *q, int vocab) {
    memset(q, 0, sizeof *q);
    for (int i = 0; i < NREQ; i++) {
        int n = 0;
        q->prompt[i][n++] = (int32_t)(3 + i);
        for (; n < 18 + i % 9; n++) q->prompt[i][n] = (int32_t)(5 + (i * 37 + n * 11 + (n % 3) * 7) % (vocab - 5));
        q->plen[i] = n;
        q->max_tokens[i] = MAXGEN - (i % 4) * 5;
        q->draft_max[i] = i % 5 == 0 ? 0 : i % 5 == 4 ? 2 : i % 5; /* 0: the engine's (8) */
        q->opt_out[i] = i % 6 == 5;
        q->stop[i] = -1;
    }
}

static inline void drain(ember_stream *s, result *r) {
    memset(r, 0, sizeof *r);
    ember_event ev;
    while (ember_stream_next(s, &ev, 60000) == 1) {
        if (ev.kind == EMBER_EV_TOKEN) {
            if (r->n < MAXGEN) r->lp[r->n] = ev.logprob, r->ids[r->n++] = ev.token;
        } else {
            r->done = ev;
            return;
        }
    }
    CHECKF(0, "stream timed out");
}

static inline void run_wave(ember_engine *e, const reqset *q, int first, int count, result *res) {
    ember_stream *ss[NREQ];
    ember_error err = {0};
    for (int i = first; i < first + count; i++) {
        ember_gen_params g;
        memset(&g, 0, sizeof g);
        g.prompt = q->prompt[i];
        g.n_prompt = q->plen[i];
        g.max_tokens = q->max_tokens[i];
        ember_sampling_init(&g.sampling);
        g.ignore_eos = 1;
        g.logprobs = 1;
        g.draft_max = q->draft_max[i];
        g.no_speculation = q->opt_out[i];
        if (q->stop[i] >= 0) g.stop_ids = &q->stop[i], g.n_stop_ids = 1;
        CHECKF(ember_engine_submit(e, &g, &ss[i - first], &err) == EMBER_OK, "%s", err.msg);
    }
    for (int i = 0; i < count; i++) {
        drain(ss[i], &res[i]);
        ember_stream_free(ss[i]);
    }
}

/* Whether a equals want cut at the first `stop` in it (-1: none): the
   same ids, logprobs and finish. */
static inline bool same_result(const result *a, const result *want, int32_t stop) {
    int n = want->n;
    ember_finish fin = want->done.finish;
    for (int k = 0; stop >= 0 && k < want->n; k++)
        if (want->ids[k] == stop) {
            n = k + 1;
            fin = EMBER_FINISH_STOP;
            break;
        }
    return a->n == n && a->done.finish == fin && !memcmp(a->ids, want->ids, (size_t)n * sizeof *a->ids) &&
           !memcmp(a->lp, want->lp, (size_t)n * sizeof *a->lp);
}

#endif
