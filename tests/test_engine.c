/*
 * test_engine.c - the serving engine: continuous batching gives each
 * request exactly the tokens it gets alone (greedy and seeded sampling),
 * matches the reference greedy ids, honours cancellation, queue bounds,
 * stop ids, prefix reuse and logprobs, and returns to an empty KV. Under a
 * KV budget far below rows x context, requests are admitted by the blocks
 * they need, rows whose memory runs out are preempted and recomputed, and
 * every request still gets exactly its solo tokens, for every KV kind. A
 * prompt whose blocks the prefix cache still holds evicts them beside a
 * decoding row instead of waiting for its end (test_prefill_evicts).
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <stdatomic.h>
#include <time.h>

#include "draw_ref.h"
#include "ember.h"
#include "engine/engine.h"
#include "fixture.h"

typedef struct result {
    int32_t ids[64];
    float lp[64];
    int n;
    ember_event done;
} result;

static ember_model *load_batch(const char *dir, int rows, int max_batch) {
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.n_rows = rows;
    mp.n_threads = 2;
    mp.max_batch_tokens = max_batch;
    ember_model *m = fx_load_params(dir, &mp);
    if (!m) exit(1);
    return m;
}

static ember_model *load(const char *dir, int rows) {
    return load_batch(dir, rows, 64); /* small: forces chunked prefill beside decode */
}

static void drain(ember_stream *s, result *r) {
    memset(r, 0, sizeof *r);
    ember_event ev;
    while (ember_stream_next(s, &ev, 20000) == 1) {
        if (ev.kind == EMBER_EV_TOKEN) {
            if (r->n < 64) {
                r->lp[r->n] = ev.logprob;
                r->ids[r->n++] = ev.token;
            }
        } else {
            r->done = ev;
            return;
        }
    }
    CHECKF(0, "stream timed out");
}

static ember_gen_params gp(const int32_t *ids, int n, int max_tokens, float temp, uint64_t seed) {
    ember_gen_params g;
    memset(&g, 0, sizeof g);
    g.prompt = ids;
    g.n_prompt = n;
    g.max_tokens = max_tokens;
    ember_sampling_init(&g.sampling);
    g.sampling.temperature = temp;
    g.sampling.seed = seed;
    g.ignore_eos = 1;
    return g;
}

/* The pace an engine reports it runs with: prefill_pace 0 is the default
   1.5 (a past engine left 0 unresolved, which capped every step at the
   floor whatever the measured costs), any negative is off (-1), anything
   else as given. */
static void test_pace_default(const fixture *f) {
    const float in[] = {0.0f, -3.0f, -1.0f, 1.0f, 2.5f};
    const float want[] = {1.5f, -1.0f, -1.0f, 1.0f, 2.5f};
    for (int i = 0; i < 5; i++) {
        ember_model *m = load_batch(f->dir, 2, 64);
        ember_engine_params ep;
        memset(&ep, 0, sizeof ep);
        ep.prefill_pace = in[i];
        ember_engine *e;
        ember_error err = {0};
        CHECKF(ember_engine_new(m, &ep, &e, &err) == EMBER_OK, "%s", err.msg);
        ember_engine_stats st;
        ember_engine_get_stats(e, &st);
        CHECKF(st.prefill_pace == want[i], "prefill_pace %g: the engine reports %g, want %g", (double)in[i],
               (double)st.prefill_pace, (double)want[i]);
        ember_engine_free(e);
        ember_model_free(m);
    }
}

/* What the stats-at-the-end probe sees: run on the engine thread from A's
   constrain_accept, i.e. while the engine walks a step's outputs. */
typedef struct end_probe {
    ember_engine *e;
    ember_stream *b; /* request B: popped here, not by the test's thread */
    int a_tokens, b_tokens, probes, a_first; /* a_first: A's tokens at the first probe */
    bool b_done, ok;
    uint64_t got, want;
    atomic_int b_waiting, a_in; /* the gate on B's second token */
    int b_accepted;
} end_probe;

static void probe_accept(void *user, int32_t token) {
    (void)token;
    end_probe *p = user;
    p->a_tokens++;
    ember_event ev;
    while (!p->b_done && ember_stream_next(p->b, &ev, 0) == 1) {
        if (ev.kind == EMBER_EV_TOKEN) p->b_tokens++;
        else p->b_done = true;
    }
    if (!p->b_done) return;
    /* B has ended: its counts, and those of every step before this one, are in
       the stats. Both requests' first tokens come from their prompts' forwards;
       A's token now is this step's, which may not be counted yet. */
    ember_engine_stats st;
    ember_engine_get_stats(p->e, &st);
    uint64_t want = (uint64_t)(p->b_tokens - 1) + (uint64_t)(p->a_tokens >= 2 ? p->a_tokens - 2 : 0);
    if (!p->probes++) p->a_first = p->a_tokens;
    if (st.decode_tokens_total < want || st.decode_forwards_total < want) {
        p->ok = false;
        p->got = st.decode_tokens_total;
        p->want = want;
    }
}

/* B's constrain_accept: on B's second token the engine thread waits until
   the test has submitted A, so A runs beside B's remaining tokens however
   fast the steps are. */
static void gate_accept(void *user, int32_t token) {
    (void)token;
    end_probe *p = user;
    if (++p->b_accepted != 2) return;
    atomic_store(&p->b_waiting, 1);
    while (!atomic_load(&p->a_in)) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

/* A request's counts are in ember_engine_stats when its end is visible: a
   client that reads the stats on seeing EMBER_EV_DONE sees every token it was
   given counted (the engine once added a step's counts after the loop that
   had already ended its requests, so `ember generate -v` and spec_bench
   could miss the last step: a target forward short now and then). Request
   B (12 tokens, in row 0) shares steps with A (24 tokens, admitted while B
   waits at its second token, in row 1), so B's outputs come first in a
   step; A's constrain_accept, called on the engine thread while the engine
   walks a step's outputs, pops B's events, and once B's end is there checks
   the decode counts. */
static void test_stats_at_done(const fixture *f) {
    ember_model *m = load_batch(f->dir, 2, 64);
    ember_engine_params ep;
    memset(&ep, 0, sizeof ep);
    ep.prefill_pace = -1.0f; /* A's prompt in one step */
    ember_engine *e;
    ember_error err = {0};
    CHECKF(ember_engine_new(m, &ep, &e, &err) == EMBER_OK, "%s", err.msg);
    end_probe p = {.e = e, .ok = true};
    atomic_init(&p.b_waiting, 0);
    atomic_init(&p.a_in, 0);
    ember_gen_params gb = gp(f->p[0].ids, f->p[0].n, 12, 0.0f, 0);
    gb.constrain_accept = gate_accept;
    gb.constrain_user = &p;
    CHECKF(ember_engine_submit(e, &gb, &p.b, &err) == EMBER_OK, "%s", err.msg);
    while (!atomic_load(&p.b_waiting)) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    ember_gen_params ga = gp(f->p[1].ids, f->p[1].n, 24, 0.0f, 0);
    ga.constrain_accept = probe_accept;
    ga.constrain_user = &p;
    ember_stream *sa;
    CHECKF(ember_engine_submit(e, &ga, &sa, &err) == EMBER_OK, "%s", err.msg);
    atomic_store(&p.a_in, 1);
    result ra;
    drain(sa, &ra);
    CHECK(ra.done.finish == EMBER_FINISH_LENGTH && ra.n == 24);
    /* A decoded beside B: its first probe came in B's last step or the next */
    CHECKF(p.b_done && p.b_tokens == 12 && p.probes > 0 && p.a_first >= 2 && p.a_first < 24,
           "B: %d tokens, ended %d; A: %d tokens at the first of %d probes", p.b_tokens, (int)p.b_done, p.a_first,
           p.probes);
    CHECKF(p.ok, "a request's end was visible before its counts: %llu decode tokens in the stats, want >= %llu",
           (unsigned long long)p.got, (unsigned long long)p.want);
    ember_engine_stats st;
    ember_engine_get_stats(e, &st);
    CHECKF(st.decode_tokens_total == 11 + 23 && st.decode_forwards_total == 11 + 23,
           "after both ends: %llu decode tokens, %llu forwards, want 34", (unsigned long long)st.decode_tokens_total,
           (unsigned long long)st.decode_forwards_total);
    ember_stream_free(sa);
    ember_stream_free(p.b);
    ember_engine_free(e);
    ember_model_free(m);
}

/* The order in which the engine thread accepts tokens, across requests:
   each request's constrain_accept appends its letter. */
typedef struct order_log {
    char seq[256];
    int n;
    atomic_int b_waiting, a_in; /* the gate in the second filler's token (hold_accept) */
} order_log;

static void log_a(void *user, int32_t token) {
    (void)token;
    order_log *o = user;
    if (o->n < 255) o->seq[o->n++] = 'A';
}

static void log_b(void *user, int32_t token) {
    (void)token;
    order_log *o = user;
    if (o->n < 255) o->seq[o->n++] = 'B';
}

/* The second filler's constrain_accept: holds the engine thread in its
   step until the test has submitted B and A, so one admission takes both. */
static void hold_accept(void *user, int32_t token) {
    (void)token;
    order_log *o = user;
    atomic_store(&o->b_waiting, 1);
    while (!atomic_load(&o->a_in)) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

/* Prompts that find the KV blocks held by cached prefixes. A budget of 8
   blocks for 2 rows; two requests (64-token prompts, one token each) leave
   every block to the cache, their rows' KV shared with the prefix cache.
   While the second one's token holds the engine thread, B (16-token
   prompt, 40 tokens) and then A (16-token prompt, 5 tokens) arrive, so one
   admission takes both, each counting its row's old blocks as coming
   back; but the prefix cache still holds them. B's prefill (alone in its
   step) evicts; A's must too, beside B's tokens. (It once evicted only in a
   step with nothing else, so A waited for B's end: 1.5 s stalls of the
   time to first token in serving.) A ends before B, and both get their
   tokens alone. */
static void test_prefill_evicts(const fixture *f) {
    enum { PF = 64, PA = 16, PB = 16, NA = 5, NB = 40 };
    int32_t pr[4][PF];
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < PF; i++) pr[k][i] = f->p[(i + k) % 3].ids[(i / 3 + k) % f->p[(i + k) % 3].n];
    for (int k = 0; k < 4; k++) pr[k][0] = (int32_t)(5 + k); /* four different prompts */
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.n_rows = 2;
    mp.n_threads = 2;
    mp.n_ctx = 128; /* the budget must hold one row's context */
    mp.max_batch_tokens = 64;
    ember_model *probe = fx_load_params(f->dir, &mp);
    if (!probe) exit(1);
    ember_model_info info;
    ember_model_get_info(probe, &info);
    ember_model_free(probe);
    mp.kv_budget = 8 * 16 * info.kv_bytes_per_token;
    ember_model *m = fx_load_params(f->dir, &mp);
    if (!m) exit(1);
    ember_engine *e;
    ember_error err = {0};
    result solo[2], ra, rb;
    CHECKF(ember_engine_new(m, NULL, &e, &err) == EMBER_OK, "%s", err.msg);
    for (int k = 0; k < 2; k++) { /* A and B alone: their tokens */
        ember_gen_params g = k == 0 ? gp(pr[2], PA, NA, 0.0f, 0) : gp(pr[3], PB, NB, 0.0f, 0);
        ember_stream *s;
        CHECKF(ember_engine_submit(e, &g, &s, &err) == EMBER_OK, "%s", err.msg);
        drain(s, &solo[k]);
        ember_stream_free(s);
    }
    ember_engine_free(e); /* a new engine: its cache holds only what follows */
    CHECKF(ember_engine_new(m, NULL, &e, &err) == EMBER_OK, "%s", err.msg);
    order_log o = {.n = 0};
    atomic_init(&o.b_waiting, 0);
    atomic_init(&o.a_in, 0);
    ember_stream *f0, *f1, *sa, *sb;
    ember_gen_params g0 = gp(pr[0], PF, 1, 0.0f, 0), g1 = gp(pr[1], PF, 1, 0.0f, 0);
    CHECKF(ember_engine_submit(e, &g0, &f0, &err) == EMBER_OK, "%s", err.msg); /* the fillers: 4 full */
    drain(f0, &ra);                                                             /* blocks each, shared */
    g1.constrain_accept = hold_accept;                                          /* with the prefix cache */
    g1.constrain_user = &o;
    CHECKF(ember_engine_submit(e, &g1, &f1, &err) == EMBER_OK, "%s", err.msg);
    while (!atomic_load(&o.b_waiting)) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    ember_gen_params gb = gp(pr[3], PB, NB, 0.0f, 0), ga = gp(pr[2], PA, NA, 0.0f, 0);
    gb.constrain_accept = log_b;
    gb.constrain_user = &o;
    ga.constrain_accept = log_a;
    ga.constrain_user = &o;
    CHECKF(ember_engine_submit(e, &gb, &sb, &err) == EMBER_OK, "%s", err.msg);
    CHECKF(ember_engine_submit(e, &ga, &sa, &err) == EMBER_OK, "%s", err.msg);
    atomic_store(&o.a_in, 1);
    drain(f1, &ra);
    CHECK(ra.n == 1);
    drain(sa, &ra);
    drain(sb, &rb);
    o.seq[o.n] = 0;
    CHECKF(o.n == NA + NB && o.seq[o.n - 1] == 'B', "accept order %s: A should end before B", o.seq);
    CHECK(ra.n == solo[0].n && !memcmp(ra.ids, solo[0].ids, sizeof(int32_t) * (size_t)ra.n));
    CHECK(rb.n == solo[1].n && !memcmp(rb.ids, solo[1].ids, sizeof(int32_t) * (size_t)rb.n));
    ember_stream_free(f0);
    ember_stream_free(f1);
    ember_stream_free(sa);
    ember_stream_free(sb);
    ember_engine_free(e);
    ember_model_free(m);
}

/* Step pacing: a 200-token prompt arriving while a row decodes (400 tokens:
   it outlasts the prompt) is cut into
   steps of PACE_MIN (16) prompt tokens with prefill_pace 1 (once the engine
   has measured a decode-only step and a prompt token, which it has after
   the first request's prompt and first steps), each counted as paced; with
   pacing off it takes the full chunk of 64 and no step is paced. Either
   way both requests get the same tokens (chunk invariance). */
static void test_pacing(const fixture *f, bool hybrid) {
    int32_t longp[200];
    for (int i = 0; i < 200; i++) longp[i] = f->p[i % 3].ids[(i / 3) % f->p[i % 3].n];
    result a[2], b[2];
    uint64_t paced[2];
    double t_dec = 0, t_tok = 0;
    for (int k = 0; k < 2; k++) {
        /* a hybrid: room for whole spans, so that an unpaced step takes the prompt whole */
        ember_model *m = load_batch(f->dir, 2, hybrid ? 256 : 64);
        ember_engine_params ep;
        memset(&ep, 0, sizeof ep);
        ep.prefill_pace = k == 0 ? 1.0f : -1.0f;
        ember_engine *e;
        ember_error err = {0};
        CHECKF(ember_engine_new(m, &ep, &e, &err) == EMBER_OK, "%s", err.msg);
        ember_gen_params ga = gp(f->p[0].ids, f->p[0].n, 400, 0.0f, 0), gb = gp(longp, 200, 20, 0.0f, 0);
        ember_stream *sa, *sb;
        CHECK(ember_engine_submit(e, &ga, &sa, &err) == EMBER_OK);
        memset(&a[k], 0, sizeof a[k]);
        ember_event ev;
        while (a[k].n < 3 && ember_stream_next(sa, &ev, 20000) == 1 && ev.kind == EMBER_EV_TOKEN)
            a[k].ids[a[k].n++] = ev.token;
        CHECK(a[k].n == 3);
        CHECK(ember_engine_submit(e, &gb, &sb, &err) == EMBER_OK); /* arrives while sa decodes */
        result rest;
        drain(sa, &rest);
        for (int i = 0; i < rest.n && a[k].n < 64; i++) a[k].ids[a[k].n++] = rest.ids[i];
        drain(sb, &b[k]);
        ember_stream_free(sa);
        ember_stream_free(sb);
        ember_engine_stats st;
        ember_engine_get_stats(e, &st);
        paced[k] = st.prefill_paced_steps;
        if (k == 0) {
            t_dec = st.step_decode_seconds;
            t_tok = st.step_prefill_token_seconds;
        }
        ember_engine_free(e);
        ember_model_free(m);
    }
    /* a hybrid's prompt is cut at the delta rule's 64-position spans whatever the pace (sched.c:
       span_chunk), so its paced steps are fewer; its logprobs are bit for bit the same */
    CHECKF(hybrid || paced[0] >= 200 / 16 - 1, "pace 1: %llu paced steps for a 200-token prompt",
           (unsigned long long)paced[0]);
    CHECKF(paced[1] == 0, "pacing off: %llu paced steps", (unsigned long long)paced[1]);
    CHECKF(!memcmp(b[0].lp, b[1].lp, sizeof(float) * (size_t)b[0].n), "%s: pacing changed the logprobs",
           hybrid ? "hybrid" : "dense");
    CHECK(t_dec > 0 && t_tok > 0);
    CHECK(a[0].n == 64 && b[0].n == 20); /* the first 64 of a's 400 tokens are kept */
    CHECKF(a[0].n == a[1].n && !memcmp(a[0].ids, a[1].ids, sizeof(int32_t) * (size_t)a[0].n) && b[0].n == b[1].n &&
               !memcmp(b[0].ids, b[1].ids, sizeof(int32_t) * (size_t)b[0].n),
           "pacing changed the tokens");
    fprintf(stderr, "pacing: %llu paced steps (decode step %.3g ms, prompt token %.3g ms)\n",
            (unsigned long long)paced[0], t_dec * 1e3, t_tok * 1e3);
}

/* A hybrid model's prompt goes through the engine in chunks cut at the
   delta rule's 64-position spans (sched.c: span_chunk), so its bits do
   not depend on the prefill budget: 200 prompt tokens with a budget of 256,
   40 and 16 give the same tokens and the same logprobs, bit for bit. */
static void test_hybrid_chunks(const fixture *f) {
    int32_t longp[200];
    for (int i = 0; i < 200; i++) longp[i] = f->p[i % 3].ids[(i / 3) % f->p[i % 3].n];
    static const int budgets[3] = {256, 40, 16};
    result r[3];
    for (int k = 0; k < 3; k++) {
        ember_model *m = load_batch(f->dir, 1, 256);
        ember_engine_params ep;
        memset(&ep, 0, sizeof ep);
        ep.prefill_chunk = budgets[k];
        ember_engine *e;
        ember_error err = {0};
        CHECKF(ember_engine_new(m, &ep, &e, &err) == EMBER_OK, "%s", err.msg);
        ember_gen_params g = gp(longp, 200, 8, 0.0f, 0);
        g.logprobs = 1;
        ember_stream *st;
        CHECK(ember_engine_submit(e, &g, &st, &err) == EMBER_OK);
        drain(st, &r[k]);
        ember_stream_free(st);
        ember_engine_free(e);
        ember_model_free(m);
    }
    for (int k = 1; k < 3; k++)
        CHECKF(r[k].n == 8 && r[k].n == r[0].n && !memcmp(r[k].ids, r[0].ids, sizeof(int32_t) * 8) &&
                   !memcmp(r[k].lp, r[0].lp, sizeof(float) * 8),
               "hybrid: a prefill budget of %d changed the output", budgets[k]);
}

/* A CPU backend given a sample_rows of tests/draw_ref.h (the device
   draw's definition), counting the rows it drew. */
static const ember_backend_ops *g_cpu_ops;
static ember_backend_ops g_draw_ops;
static atomic_int g_drawn, g_drawn_sampled;

static int draw_rows(ember_backend *be, ember_tensor *x, const ember_draw *p, int32_t *out, int n, ember_error *err) {
    const size_t V = (size_t)x->shape[x->ndim - 1];
    float *h = malloc((size_t)n * V * sizeof *h);
    void *scr = malloc(draw_ref_scratch((int)V));
    if (!h || !scr) {
        free(h);
        free(scr);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    }
    int rc = g_cpu_ops->read(be, x, 0, h, (size_t)n * V * sizeof *h, err);
    for (int i = 0; !rc && i < n; i++) {
        out[i] = draw_ref(h + (size_t)i * V, (int)V, &p[i], scr);
        atomic_fetch_add(&g_drawn, 1);
        if (p[i].temperature > 0) atomic_fetch_add(&g_drawn_sampled, 1);
    }
    free(h);
    free(scr);
    return rc;
}

/* Tokens drawn on the "device" (the forward's sample_rows, no logits row
   to the host) are the host sampler's: 8 requests on 4 rows, greedy beside
   sampled ones under each filter, once with the draws on the backend and
   once on the host, the same tokens. A request with log-probabilities or a
   penalty in the batch sends its steps to the host: still the same tokens.
   Then ember_generate's decode steps (11 of each sampled row's 12 tokens:
   the first comes from the prefill's logits), the same way. */
static void test_device_draw(const fixture *f) {
    enum { NR = 8 };
    result res[2][NR];
    int32_t gen[2][3][12];
    for (int pass = 0; pass < 2; pass++) {
        ember_model *m = load(f->dir, 4);
        g_cpu_ops = m->be->ops;
        if (pass == 0) {
            g_draw_ops = *g_cpu_ops;
            g_draw_ops.sample_rows = draw_rows;
            m->be->ops = &g_draw_ops;
        }
        atomic_store(&g_drawn, 0);
        atomic_store(&g_drawn_sampled, 0);
        ember_engine *e;
        ember_error err = {0};
        CHECK(ember_engine_new(m, NULL, &e, &err) == EMBER_OK);
        ember_stream *ss[NR];
        for (int i = 0; i < NR; i++) {
            const fixture_prompt *fp = &f->p[i % 3];
            ember_gen_params g = gp(fp->ids, fp->n, 10 + i, i % 4 == 3 ? 0.0f : 0.7f + 0.1f * (float)i, 50 + (uint64_t)i);
            g.sampling.top_p = i % 4 == 1 ? 0.9f : 1.0f;
            g.sampling.top_k = i % 4 == 2 ? 20 : 0;
            g.sampling.min_p = i == 4 ? 0.05f : 0.0f;
            if (i == 6) g.top_logprobs = 2; /* its steps draw on the host */
            if (i == 7) g.presence_penalty = 0.5f;
            CHECKF(ember_engine_submit(e, &g, &ss[i], &err) == EMBER_OK, "%s", err.msg);
        }
        for (int i = 0; i < NR; i++) {
            drain(ss[i], &res[pass][i]);
            ember_stream_free(ss[i]);
            CHECK(res[pass][i].done.finish == EMBER_FINISH_LENGTH && res[pass][i].n == 10 + i);
        }
        if (pass == 0)
            CHECKF(atomic_load(&g_drawn_sampled) > 20, "%d sampled rows drawn by sample_rows (%d rows in all)",
                   atomic_load(&g_drawn_sampled), atomic_load(&g_drawn));
        else
            CHECK(atomic_load(&g_drawn) == 0);
        ember_engine_free(e);
        /* ember_generate: three rows, greedy and sampled, the forward picking the decode steps' tokens */
        atomic_store(&g_drawn_sampled, 0);
        ember_request rq[3];
        memset(rq, 0, sizeof rq);
        for (int i = 0; i < 3; i++) {
            rq[i].prompt = f->p[i].ids;
            rq[i].n_prompt = f->p[i].n;
            rq[i].max_new_tokens = 12;
            rq[i].ignore_eos = 1;
            ember_sampling_init(&rq[i].sampling);
            rq[i].sampling.temperature = i == 0 ? 0.0f : 0.9f;
            rq[i].sampling.top_p = i == 2 ? 0.8f : 1.0f;
            rq[i].sampling.seed = 7 + (uint64_t)i;
            rq[i].out_ids = gen[pass][i];
        }
        CHECKF(ember_generate(m, rq, 3, &err) == EMBER_OK, "%s", err.msg);
        for (int i = 0; i < 3; i++) CHECK(rq[i].n_out == 12);
        if (pass == 0) CHECKF(atomic_load(&g_drawn_sampled) == 2 * 11, "%d rows drawn", atomic_load(&g_drawn_sampled));
        m->be->ops = g_cpu_ops;
        ember_model_free(m);
    }
    for (int i = 0; i < NR; i++)
        CHECKF(res[0][i].n == res[1][i].n && !memcmp(res[0][i].ids, res[1][i].ids, sizeof(int32_t) * (size_t)res[1][i].n),
               "request %d: tokens drawn by sample_rows differ from the host sampler's", i);
    CHECKF(!memcmp(gen[0], gen[1], sizeof gen[0]), "ember_generate: tokens drawn by sample_rows differ from the host's");
}

int main(void) {
    shared_dir();
    fixture f;
    fixture_open(&f, "qwen2");
    ember_error err = {0};
    test_prefill_evicts(&f);
    test_device_draw(&f);

    /* 16 requests on 4 rows: each equals its solo run, greedy and sampled */
    enum { NREQ = 16 };
    int32_t prompts[NREQ][100];
    int plen[NREQ];
    for (int i = 0; i < NREQ; i++) {
        fixture_prompt *p = &f.p[i % 3];
        plen[i] = p->n - (i / 3) % 5; /* different lengths */
        if (plen[i] < 2) plen[i] = p->n;
        memcpy(prompts[i], p->ids, (size_t)plen[i] * sizeof(int32_t));
        prompts[i][0] = (int32_t)(3 + i); /* different contents */
    }
    for (int pass = 0; pass < 2; pass++) {
        float temp = pass ? 0.8f : 0.0f;
        result solo[NREQ], batched[NREQ];
        ember_model *m = load(f.dir, 4);
        ember_engine *e;
        CHECK(ember_engine_new(m, NULL, &e, &err) == EMBER_OK);
        for (int i = 0; i < NREQ; i++) { /* one at a time */
            ember_gen_params g = gp(prompts[i], plen[i], 12 + i % 5, temp, 100 + (uint64_t)i);
            ember_stream *s;
            CHECKF(ember_engine_submit(e, &g, &s, &err) == EMBER_OK, "%s", err.msg);
            drain(s, &solo[i]);
            ember_stream_free(s);
        }
        ember_stream *ss[NREQ];
        for (int i = 0; i < NREQ; i++) { /* all at once */
            ember_gen_params g = gp(prompts[i], plen[i], 12 + i % 5, temp, 100 + (uint64_t)i);
            CHECKF(ember_engine_submit(e, &g, &ss[i], &err) == EMBER_OK, "%s", err.msg);
        }
        for (int i = 0; i < NREQ; i++) {
            drain(ss[i], &batched[i]);
            ember_stream_free(ss[i]);
            CHECKF(batched[i].n == solo[i].n && !memcmp(batched[i].ids, solo[i].ids, sizeof(int32_t) * (size_t)solo[i].n),
                   "pass %d request %d: batched tokens differ from solo", pass, i);
            CHECK(batched[i].done.finish == EMBER_FINISH_LENGTH && batched[i].done.n_generated == 12 + i % 5);
            CHECK(batched[i].done.n_prompt == plen[i]);
        }
        ember_engine_stats st;
        ember_engine_get_stats(e, &st);
        CHECK(st.running == 0 && st.waiting == 0 && st.kv_bytes_used == 0 && st.requests_total == 2 * NREQ);
        ember_engine_free(e);
        ember_model_free(m);
    }

    /* reference greedy ids, all three prompts at once */
    {
        ember_model *m = load(f.dir, 3);
        ember_engine *e;
        CHECK(ember_engine_new(m, NULL, &e, &err) == EMBER_OK);
        ember_stream *s[3];
        for (int i = 0; i < 3; i++) {
            ember_gen_params g = gp(f.p[i].ids, f.p[i].n, 24, 0, 0);
            g.logprobs = 1;
            g.top_logprobs = 5;
            CHECK(ember_engine_submit(e, &g, &s[i], &err) == EMBER_OK);
        }
        for (int i = 0; i < 3; i++) {
            ember_event ev;
            int n = 0;
            bool ok_lp = true;
            while (ember_stream_next(s[i], &ev, 20000) == 1 && ev.kind == EMBER_EV_TOKEN) {
                CHECKF(n < 24 && ev.token == f.p[i].greedy[n], "p%d step %d", i, n);
                /* greedy: the chosen token is the top alternative */
                ok_lp &= ev.n_top == 5 && ev.top_ids[0] == ev.token && ev.top_logprobs[0] == ev.logprob;
                for (int k = 1; k < ev.n_top; k++) ok_lp &= ev.top_logprobs[k] <= ev.top_logprobs[k - 1];
                ok_lp &= ev.logprob <= 0;
                n++;
            }
            CHECK(ok_lp);
            CHECK(n == 24 && ev.kind == EMBER_EV_DONE && ev.finish == EMBER_FINISH_LENGTH);
            ember_stream_free(s[i]);
        }
        /* the same prompt again reuses its prefix and gives the same tokens */
        ember_gen_params g = gp(f.p[2].ids, f.p[2].n, 24, 0, 0);
        ember_stream *st;
        CHECK(ember_engine_submit(e, &g, &st, &err) == EMBER_OK);
        result r;
        drain(st, &r);
        ember_stream_free(st);
        CHECKF(r.done.n_cached == f.p[2].n - 1, "n_cached %d", r.done.n_cached);
        CHECK(r.n == 24 && !memcmp(r.ids, f.p[2].greedy, sizeof(int32_t) * 24));
        /* stop ids end generation with STOP, the stop token included */
        g = gp(f.p[0].ids, f.p[0].n, 24, 0, 0);
        int32_t stop = f.p[0].greedy[3];
        g.stop_ids = &stop;
        g.n_stop_ids = 1;
        CHECK(ember_engine_submit(e, &g, &st, &err) == EMBER_OK);
        drain(st, &r);
        ember_stream_free(st);
        int first = 0;
        while (f.p[0].greedy[first] != stop) first++;
        CHECK(r.done.finish == EMBER_FINISH_STOP && r.n == first + 1 && r.ids[r.n - 1] == stop);
        /* cancel mid-stream */
        /* (a long generation: the engine must not finish before the cancel lands, even when
           this thread is descheduled for a while on a loaded machine) */
        const int long_gen = 480 - f.p[1].n;
        g = gp(f.p[1].ids, f.p[1].n, long_gen, 0.5f, 3);
        g.ignore_eos = 1;
        CHECK(ember_engine_submit(e, &g, &st, &err) == EMBER_OK);
        ember_event ev;
        CHECK(ember_stream_next(st, &ev, 20000) == 1 && ev.kind == EMBER_EV_TOKEN);
        ember_stream_cancel(st);
        int extra = 0;
        while (ember_stream_next(st, &ev, 20000) == 1 && ev.kind == EMBER_EV_TOKEN) extra++;
        CHECKF(ev.kind == EMBER_EV_DONE && ev.finish == EMBER_FINISH_CANCELLED && extra < long_gen - 1,
               "cancel: finish %d after %d more tokens", ev.finish, extra);
        ember_stream_free(st);
        /* bad requests */
        g = gp(f.p[0].ids, 0, 5, 0, 0);
        CHECK(ember_engine_submit(e, &g, &st, &err) == EMBER_ERR_INVALID_ARG);
        int32_t bad = 99999;
        g = gp(&bad, 1, 5, 0, 0);
        CHECK(ember_engine_submit(e, &g, &st, &err) == EMBER_ERR_INVALID_ARG && strstr(err.msg, "vocabulary"));
        g = gp(f.p[0].ids, f.p[0].n, 5, -1, 0);
        CHECK(ember_engine_submit(e, &g, &st, &err) == EMBER_ERR_INVALID_ARG);
        g = gp(f.p[0].ids, f.p[0].n, 0, 0, 0);
        CHECK(ember_engine_submit(e, &g, &st, &err) == EMBER_ERR_INVALID_ARG);
        g = gp(f.p[0].ids, f.p[0].n, 5, 0, 0);
        g.top_logprobs = 21;
        CHECK(ember_engine_submit(e, &g, &st, &err) == EMBER_ERR_INVALID_ARG);
        ember_logit_bias lb = {7, NAN};
        g.top_logprobs = 0;
        g.logit_bias = &lb;
        g.n_logit_bias = 1;
        CHECK(ember_engine_submit(e, &g, &st, &err) == EMBER_ERR_INVALID_ARG);
        /* a huge logit bias forces a token */
        lb.bias = 100.0f;
        CHECK(ember_engine_submit(e, &g, &st, &err) == EMBER_OK);
        drain(st, &r);
        ember_stream_free(st);
        CHECK(r.n == 5 && r.ids[0] == 7 && r.ids[4] == 7);
        ember_engine_stats stt;
        ember_engine_get_stats(e, &stt);
        CHECK(stt.kv_bytes_used == 0 && stt.running == 0);
        ember_engine_free(e);
        ember_model_free(m);
    }

    /* a KV budget of about 2.5 requests for 6 rows: admission waits for
       blocks, decoding rows get preempted and recomputed; tokens unchanged */
    static const char *const kinds[] = {"f32", "q8", "tq-k4v3"};
    for (size_t ki = 0; ki < sizeof kinds / sizeof kinds[0]; ki++) {
        enum { NB = 10, MAXT = 60 };
        ember_model_params mp;
        ember_model_params_init(&mp);
        mp.n_rows = 6;
        mp.n_threads = 2;
        mp.n_ctx = 256;
        mp.max_batch_tokens = 64;
        mp.kv_type = kinds[ki];
        ember_model *probe = fx_load_params(f.dir, &mp);
        if (!probe) exit(1);
        ember_model_info info;
        ember_model_get_info(probe, &info);
        ember_model_free(probe);
        /* one request: up to 100 prompt + 60 generated positions */
        mp.kv_budget = (size_t)(2.5 * 160 * (double)info.kv_bytes_per_token);
        ember_model *m = fx_load_params(f.dir, &mp);
        if (!m) exit(1);
        ember_engine *e;
        CHECK(ember_engine_new(m, NULL, &e, &err) == EMBER_OK);
        result solo[NB], batched[NB];
        ember_stream *ss[NB];
        for (int i = 0; i < NB; i++) {
            ember_gen_params g = gp(prompts[i], plen[i], MAXT, 0, 0);
            CHECKF(ember_engine_submit(e, &g, &ss[i], &err) == EMBER_OK, "%s", err.msg);
            drain(ss[i], &solo[i]);
            ember_stream_free(ss[i]);
        }
        /* the burst, until it preempts: whether the rows admitted first
           outgrow the budget depends on how the submissions interleave
           with the steps (about 1 in 16 bursts never preempts), so a burst
           that did not is run again, up to 4 times, every one checked */
        ember_engine_stats st;
        for (int attempt = 0; attempt < 4; attempt++) {
            for (int i = 0; i < NB; i++) {
                ember_gen_params g = gp(prompts[i], plen[i], MAXT, 0, 0);
                CHECKF(ember_engine_submit(e, &g, &ss[i], &err) == EMBER_OK, "%s", err.msg);
            }
            for (int i = 0; i < NB; i++) {
                drain(ss[i], &batched[i]);
                ember_stream_free(ss[i]);
                CHECKF(batched[i].done.finish == EMBER_FINISH_LENGTH && batched[i].n == MAXT &&
                           !memcmp(batched[i].ids, solo[i].ids, sizeof(int32_t) * MAXT),
                       "KV %s request %d: tokens differ from its solo run under a tight budget (finish %d: %s)",
                       kinds[ki], i, batched[i].done.finish, batched[i].done.error);
            }
            ember_engine_get_stats(e, &st);
            if (st.preempted_total > 0) break;
        }
        CHECKF(st.preempted_total > 0, "KV %s: the budget never forced a preemption", kinds[ki]);
        CHECK(st.running == 0 && st.kv_bytes_used == 0 && st.kv_bytes_held <= st.kv_bytes_total);
        fprintf(stderr, "KV %s budget %zu: %llu preemptions, %zu bytes cached after\n", kinds[ki], st.kv_bytes_total,
                (unsigned long long)st.preempted_total, st.kv_bytes_held);
        ember_engine_free(e);
        ember_model_free(m);
    }

    /* the prefix cache: requests sharing a system prompt reuse its blocks
       (full blocks only, from the cache or a free row), give exactly the
       tokens they give without it, and a salt or cache_prompt: false opt out */
    static const char *const pkinds[] = {"f32", "q8", "tq-k4v3", "f32", "q8"};
    static const char *const pfams[] = {"llama", "llama", "llama", "gemma2", "gemma3_text"}; /* the last two: sliding windows */
    for (size_t ki = 0; ki < sizeof pkinds / sizeof pkinds[0]; ki++) {
        char pdir[600];
        snprintf(pdir, sizeof pdir, "%s/fixtures/%s", shared_dir(), pfams[ki]);
        enum { NP = 4, SYS = 80, SUF = 10, MAXT = 16 };
        ember_model_params mp;
        ember_model_params_init(&mp);
        mp.n_rows = NP;
        mp.n_threads = 2;
        mp.n_ctx = 256;
        mp.max_batch_tokens = 64;
        mp.kv_type = pkinds[ki];
        ember_model *m = fx_load_params(pdir, &mp);
        if (!m) exit(1);
        ember_engine *e;
        CHECK(ember_engine_new(m, NULL, &e, &err) == EMBER_OK);
        int32_t pr[NP][SYS + SUF];
        for (int i = 0; i < NP; i++)
            for (int t = 0; t < SYS + SUF; t++) pr[i][t] = t < SYS ? (int32_t)((t * 37 + 11) % 500) : (int32_t)((i * 101 + t * 7) % 500);
        result solo[NP], got[NP];
        ember_stream *ss[NP];
        for (int i = 0; i < NP; i++) { /* each alone, opted out of the cache */
            ember_gen_params g = gp(pr[i], SYS + SUF, MAXT, 0, 0);
            g.no_prompt_cache = 1;
            CHECK(ember_engine_submit(e, &g, &ss[i], &err) == EMBER_OK);
            drain(ss[i], &solo[i]);
            ember_stream_free(ss[i]);
            CHECK(solo[i].n == MAXT && solo[i].done.n_cached == 0);
        }
        ember_engine_stats st;
        ember_engine_get_stats(e, &st);
        CHECK(st.prefix_cache_entries == 0);
        /* the first request fills the cache, the others take its system prompt concurrently */
        ember_gen_params g0 = gp(pr[0], SYS + SUF, MAXT, 0, 0);
        CHECK(ember_engine_submit(e, &g0, &ss[0], &err) == EMBER_OK);
        drain(ss[0], &got[0]);
        ember_stream_free(ss[0]);
        CHECK(got[0].done.n_cached == 0);
        for (int i = 1; i < NP; i++) {
            ember_gen_params g = gp(pr[i], SYS + SUF, MAXT, 0, 0);
            CHECK(ember_engine_submit(e, &g, &ss[i], &err) == EMBER_OK);
        }
        for (int i = 1; i < NP; i++) {
            drain(ss[i], &got[i]);
            ember_stream_free(ss[i]);
            CHECKF(got[i].done.n_cached == SYS, "KV %s request %d: %d cached positions, want %d", pkinds[ki], i,
                   got[i].done.n_cached, SYS);
        }
        for (int i = 0; i < NP; i++)
            CHECKF(got[i].n == MAXT && !memcmp(got[i].ids, solo[i].ids, sizeof(int32_t) * MAXT),
                   "KV %s request %d: tokens with the prefix cache differ from without", pkinds[ki], i);
        ember_engine_get_stats(e, &st);
        CHECKF(st.prefix_cache_hits >= 2 && st.prefix_cache_entries >= SYS / 16, "KV %s: %llu hits, %d entries",
               pkinds[ki], (unsigned long long)st.prefix_cache_hits, st.prefix_cache_entries);
        CHECK(st.prefix_cache_bytes_unused <= st.prefix_cache_bytes && st.prefix_cache_bytes <= st.kv_bytes_held);
        /* another salt shares nothing; the same salt again does */
        ember_gen_params g = gp(pr[1], SYS + SUF, MAXT, 0, 0);
        g.cache_salt = 99;
        for (int pass = 0; pass < 2; pass++) {
            CHECK(ember_engine_submit(e, &g, &ss[0], &err) == EMBER_OK);
            drain(ss[0], &got[0]);
            ember_stream_free(ss[0]);
            CHECKF(got[0].done.n_cached == (pass ? SYS + SUF - 1 : 0), "salted pass %d: %d cached", pass,
                   got[0].done.n_cached);
            CHECK(!memcmp(got[0].ids, solo[1].ids, sizeof(int32_t) * MAXT));
        }
        /* opted out: nothing reused, same tokens */
        g = gp(pr[2], SYS + SUF, MAXT, 0, 0);
        g.no_prompt_cache = 1;
        CHECK(ember_engine_submit(e, &g, &ss[0], &err) == EMBER_OK);
        drain(ss[0], &got[0]);
        ember_stream_free(ss[0]);
        CHECK(got[0].done.n_cached == 0 && !memcmp(got[0].ids, solo[2].ids, sizeof(int32_t) * MAXT));
        ember_engine_free(e);
        ember_model_free(m);
    }

    /* a context one row of which cannot fit the budget is refused at load */
    {
        ember_model_params mp;
        ember_model_params_init(&mp);
        mp.n_ctx = 512;
        mp.kv_budget = 512 * 64; /* 64 bytes a position: less than qwen2's KV needs */
        ember_model *m = NULL;
        CHECK(ember_model_load(f.dir, &mp, &m, &err) == EMBER_ERR_NOMEM && strstr(err.msg, "over the budget"));
        CHECK(m == NULL);
        mp.n_ctx = 0; /* the default context is lowered instead */
        CHECKF(ember_model_load(f.dir, &mp, &m, &err) == EMBER_OK, "%s", err.msg);
        ember_model_info info;
        ember_model_get_info(m, &info);
        CHECK(info.n_ctx > 0 && info.n_ctx < 512 && (size_t)info.n_ctx * info.kv_bytes_per_token <= mp.kv_budget);
        ember_model_free(m);
    }

    /* queue bound and shutdown with requests in flight */
    {
        ember_model *m = load(f.dir, 1);
        ember_engine_params ep = {.max_queue = 2};
        ember_engine *e;
        CHECK(ember_engine_new(m, &ep, &e, &err) == EMBER_OK);
        ember_stream *s[8];
        int accepted = 0, limited = 0;
        for (int i = 0; i < 8; i++) {
            ember_gen_params g = gp(f.p[2].ids, f.p[2].n, 200, 0.7f, (uint64_t)i);
            int rc = ember_engine_submit(e, &g, &s[accepted], &err);
            if (rc == EMBER_OK)
                accepted++;
            else
                limited += rc == EMBER_ERR_LIMIT;
        }
        CHECK(limited >= 5 && accepted + limited == 8);
        ember_engine_free(e); /* cancels everything */
        for (int i = 0; i < accepted; i++) {
            result r;
            drain(s[i], &r);
            CHECK(r.done.kind == EMBER_EV_DONE &&
                  (r.done.finish == EMBER_FINISH_CANCELLED || r.done.finish == EMBER_FINISH_LENGTH));
            ember_stream_free(s[i]);
        }
        ember_model_free(m);
    }
    test_pace_default(&f);
    test_stats_at_done(&f);
    test_pacing(&f, false);
    fixture_close(&f);
    fixture h; /* a hybrid model: its prompt's chunking must not depend on the pace either */
    fixture_open(&h, "qwen3_5_text");
    test_pacing(&h, true);
    test_hybrid_chunks(&h);
    fixture_close(&h);
    return test_done();
}
