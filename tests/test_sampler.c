/*
 * test_sampler.c - the sampler chain: greedy, determinism per seed, the
 * support each filter leaves, and the sampled distribution matching the
 * softmax of the logits (chi-square bound over many draws), and
 * speculative verification keeping that distribution. The support is also
 * checked against a plain reference of the chain (sort, softmax in double,
 * cumulative top_p) on random vocabularies with ties, NaN and -inf, where
 * the sampler itself cuts by radix walks instead of sorting.
 */
#include <stdbool.h>
#include <stdlib.h>

#include "draw_ref.h"
#include "ember.h"
#include "sample/sampler.h"
#include "test.h"

static ember_sampler *mk(float temp, int top_k, float top_p, float min_p, uint64_t seed, int V) {
    ember_sampling p;
    ember_sampling_init(&p);
    p.temperature = temp;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.seed = seed;
    ember_sampler *s = NULL;
    ember_error err = {0};
    CHECKF(ember_sampler_new(&p, V, &s, &err) == EMBER_OK, "%s", err.msg);
    return s;
}

typedef struct rc {
    double v;
    int id;
} rc;

static int rc_cmp(const void *a, const void *b) {
    const rc *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->id - y->id;
}

/* The chain by its definition: usable logits scaled, sorted (value down,
   id up), top_k, softmax in double, the shortest prefix reaching top_p,
   min_p. keep[i]: 1 kept, 0 dropped, 2 on a boundary that float rounding
   may put either side (cumulative mass or min_p ratio within 1e-5).
   Returns the number kept (0: nothing usable). */
static int ref_keep(const float *lg, int V, float T, int top_k, float top_p, float min_p, char *keep) {
    rc *c = malloc((size_t)V * sizeof *c);
    int n = 0;
    for (int i = 0; i < V; i++) {
        keep[i] = 0;
        if (!isnan(lg[i]) && lg[i] != -INFINITY) c[n++] = (rc){(double)(lg[i] / T), i};
    }
    qsort(c, (size_t)n, sizeof *c, rc_cmp);
    if (top_k > 0 && top_k < n) n = top_k;
    double z = 0;
    for (int i = 0; i < n; i++) z += exp(c[i].v - c[0].v);
    int kept = n;
    if (top_p < 1) {
        double cum = 0;
        for (int i = 0; i < n; i++) {
            double before = cum;
            cum += exp(c[i].v - c[0].v) / z;
            keep[c[i].id] = fabs(before - top_p) < 1e-5 || fabs(cum - top_p) < 1e-5 ? 2 : 1;
            if (cum >= top_p) {
                kept = i + 1;
                break;
            }
        }
    }
    for (int i = 0; i < kept; i++) {
        double r = exp(c[i].v - c[0].v); /* p / p_max */
        char k = keep[c[i].id] == 2 ? 2 : 1;
        if (min_p > 0 && fabs(r - min_p) < 1e-5 * (min_p > 1e-3 ? min_p : 1e-3)) k = 2;
        else if (min_p > 0 && r < min_p) k = 0;
        keep[c[i].id] = k;
    }
    for (int i = kept; i < n; i++) keep[c[i].id] = 0;
    free(c);
    return kept;
}

static uint64_t t_rng = 88172645463325252ull;
static double t_uniform(void) {
    t_rng ^= t_rng << 13;
    t_rng ^= t_rng >> 7;
    t_rng ^= t_rng << 17;
    return (double)(t_rng >> 11) * 0x1.0p-53;
}

/* Random vocabularies and settings: every drawn id is one the reference
   keeps (or a boundary one), and every id the reference gives more than a
   tenth of the mass is drawn. */
static void check_support(void) {
    static const float temps[] = {0.3f, 0.7f, 1.0f, 1.5f}, tops[] = {1, 0.95f, 0.9f, 0.5f, 0.1f},
                       minps[] = {0, 0, 0.05f, 0.3f};
    int bad = 0, missed = 0, trials = 0;
    for (int trial = 0; trial < 300; trial++) {
        const int V = 1 + (int)(t_uniform() * (trial % 3 ? 3000 : 40));
        float *lg = malloc((size_t)V * sizeof *lg);
        char *keep = malloc((size_t)V);
        long *cnt = calloc((size_t)V, sizeof *cnt);
        const int mode = trial % 4;
        for (int i = 0; i < V; i++) {
            double u = t_uniform();
            if (mode == 0) lg[i] = (float)(int)(u * 6) - 3.0f; /* heavy ties */
            else if (mode == 1) lg[i] = (float)(u * 20 - 10);
            else if (mode == 2) lg[i] = -1.0f - (float)(int)(u * 50) * 0.25f; /* all negative, ties */
            else lg[i] = u < 0.1 ? NAN : u < 0.2 ? -INFINITY : (float)(u * 8);
        }
        const float T = temps[trial % 4], tp = tops[(trial / 4) % 5], mp = minps[(trial / 20) % 4];
        const int ks[] = {0, 1, 5, 40, V - 1, V + 3}, K = ks[(trial / 7) % 6];
        if (ref_keep(lg, V, T, K, tp, mp, keep) == 0) goto next; /* all unusable: greedy fallback */
        trials++;
        ember_sampler *s = mk(T, K, tp, mp, (uint64_t)trial, V);
        ember_sampler_use_avx2(s, trial % 2); /* both copies of the vocabulary passes */
        for (int d = 0; d < 200; d++) {
            int32_t t = ember_sampler_sample(s, lg);
            if (t < 0 || t >= V || !keep[t]) {
                if (bad++ < 5)
                    fprintf(stderr, "trial %d (V %d mode %d T %g top_k %d top_p %g min_p %g): drew %d\n", trial, V,
                            mode, (double)T, K, (double)tp, (double)mp, t);
                break;
            }
            cnt[t]++;
        }
        ember_sampler_free(s);
        { /* the heavy ids must show up: p > 0.1 drawn 200 times misses with chance < 1e-9 */
            rc *c = malloc((size_t)V * sizeof *c);
            int n = 0;
            double z = 0;
            for (int i = 0; i < V; i++)
                if (keep[i] == 1) c[n++] = (rc){exp((double)(lg[i] / T)), i};
            for (int i = 0; i < n; i++) z += c[i].v;
            for (int i = 0; i < n; i++)
                if (c[i].v / z > 0.1 && cnt[c[i].id] == 0 && missed++ < 5)
                    fprintf(stderr, "trial %d: id %d (p %.3g) never drawn\n", trial, c[i].id, c[i].v / z);
            free(c);
        }
    next:
        free(lg);
        free(keep);
        free(cnt);
    }
    CHECKF(bad == 0, "%d trials drew an id outside the chain's support", bad);
    CHECKF(missed == 0, "%d heavy ids never drawn", missed);
    CHECK(trials > 250);
}

/* A tie group straddling the top_p and top_k cuts: exactly its lowest ids
   are kept. 1000 ids share the largest logit (spread over the vocabulary),
   the rest lie 30 below (together 2e-10 of the mass). */
static void check_tie_cuts(void) {
    enum { TV = 7000 };
    float *lg = malloc(TV * sizeof *lg);
    for (int i = 0; i < TV; i++) lg[i] = i % 7 == 3 ? 2.0f : -28.0f;
    static const struct {
        int top_k;
        float top_p;
        int want; /* tied ids kept */
    } cs[] = {{0, 0.2505f, 251}, {100, 1, 100}, {300, 0.1005f, 31}, {0, 0.0005f, 1}};
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        ember_sampler *s = mk(1.0f, cs[ci].top_k, cs[ci].top_p, 0, 17 + ci, TV);
        int hi = -1, outside = 0;
        for (int d = 0; d < 3000; d++) {
            int32_t t = ember_sampler_sample(s, lg);
            if (t % 7 != 3 || (t - 3) / 7 >= cs[ci].want) outside++;
            hi = t > hi ? t : hi;
        }
        ember_sampler_free(s);
        CHECKF(outside == 0 && (hi - 3) / 7 == cs[ci].want - 1, "case %zu: %d draws outside, highest tied index %d of %d",
               ci, outside, (hi - 3) / 7, cs[ci].want);
    }
    free(lg);
}

/* Infinite scaled logits: +inf logits, and finite ones that the
   temperature takes to +inf or -inf. */
static void check_infinite(void) {
    enum { IV = 600 };
    float lg[IV];
    for (int i = 0; i < IV; i++) lg[i] = (float)(i % 13);
    lg[7] = lg[300] = INFINITY;
    lg[8] = NAN;
    ember_sampler *s = mk(1.0f, 0, 1, 0, 5, IV);
    int n7 = 0, n300 = 0, other = 0;
    for (int d = 0; d < 400; d++) {
        int32_t t = ember_sampler_sample(s, lg);
        n7 += t == 7, n300 += t == 300, other += t != 7 && t != 300;
    }
    ember_sampler_free(s);
    CHECKF(other == 0 && n7 > 100 && n300 > 100, "+inf logits: %d / %d / %d", n7, n300, other);
    for (int i = 0; i < IV; i++) lg[i] = i == 41 ? 3e30f : i == 42 ? 2e30f : i % 2 ? -3e30f : 1e-3f * (float)i;
    for (int k = 0; k < 3; k++) { /* temperature 1e-9: 41 -> +inf, 42 -> +inf, the odd ids -> -inf */
        s = mk(1e-9f, k == 0 ? 0 : k == 1 ? 2 : 400, 1, 0, 9, IV);
        int ok = 0;
        for (int d = 0; d < 100; d++) {
            int32_t t = ember_sampler_sample(s, lg);
            ok += t == 41 || t == 42;
        }
        ember_sampler_free(s);
        CHECKF(ok == 100, "overflowing temperature, top_k case %d: %d of 100 draws on the infinite ids", k, ok);
    }
    /* top_k over logits that the temperature sinks to -inf: the k best stay the finite ones */
    for (int i = 0; i < IV; i++) lg[i] = i < 3 ? -1.0f * (float)i : -3e30f;
    s = mk(1e-9f, 5, 1, 0, 9, IV);
    bool first = true;
    for (int d = 0; d < 50; d++) first &= ember_sampler_sample(s, lg) == 0;
    ember_sampler_free(s);
    CHECK(first);
}

/* ember_argmax against a plain scan: the first index of the largest non-NaN
   value (-0 and +0 equal), 0 when every value is NaN; lengths around the
   vector width. */
static void check_argmax(void) {
    static const float pool[] = {NAN, -INFINITY, INFINITY, -0.0f, 0.0f, 1.0f, -1.0f, 2.0f};
    int bad = 0;
    for (int trial = 0; trial < 4000; trial++) {
        float x[40];
        const int n = 1 + trial % 40;
        for (int i = 0; i < n; i++) x[i] = pool[(int)(t_uniform() * (trial % 5 == 0 ? 2 : 8))];
        int want = -1;
        for (int i = 0; i < n; i++)
            if (!isnan(x[i]) && (want < 0 || x[i] > x[want])) want = i;
        if (want < 0) want = 0;
        if (ember_argmax(x, n) != want && bad++ < 5) fprintf(stderr, "argmax trial %d: %d, want %d\n", trial, ember_argmax(x, n), want);
    }
    CHECKF(bad == 0, "%d argmax trials wrong", bad);
}

/* The AVX2 copy of the vocabulary passes gives the plain copy's masses bit
   for bit and its tokens draw for draw, on a 151,936-id vocabulary under
   each filter (where the CPU has no AVX2 both run the plain copy). */
static void check_copies(void) {
    enum { BV = 151936 };
    float *lg = malloc(BV * sizeof *lg);
    for (int i = 0; i < BV; i++) lg[i] = (float)(t_uniform() * 8 - 4) + (i % 9973 == 0 ? 9.0f : 0.0f);
    static const struct {
        float temp, top_p, min_p;
        int top_k;
    } cfg[] = {{1.0f, 1, 0, 0}, {0.8f, 0.95f, 0, 0}, {0.7f, 0.9f, 0, 40}, {1.0f, 1, 0.05f, 0}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        ember_sampler *a = mk(cfg[c].temp, cfg[c].top_k, cfg[c].top_p, cfg[c].min_p, 77, BV);
        ember_sampler *b = mk(cfg[c].temp, cfg[c].top_k, cfg[c].top_p, cfg[c].min_p, 77, BV);
        ember_sampler_use_avx2(a, true);
        ember_sampler_use_avx2(b, false);
        int differ = 0, bits = 0;
        for (int d = 0; d < 40; d++) {
            lg[(d * 7919) % BV] += 0.5f; /* the logits move a little between draws */
            differ += ember_sampler_sample(a, lg) != ember_sampler_sample(b, lg);
            const float *wa = ember_sampler_dense(a), *wb = ember_sampler_dense(b);
            CHECK((wa == NULL) == (cfg[c].top_k > 0) && (wb == NULL) == (cfg[c].top_k > 0));
            bits += wa && wb && memcmp(wa, wb, BV * sizeof *wa) != 0;
        }
        CHECKF(differ == 0 && bits == 0, "setting %zu: of 40 draws, %d tokens and %d mass arrays differ between the AVX2 and plain passes", c,
               differ, bits);
        ember_sampler_free(a);
        ember_sampler_free(b);
    }
    free(lg);
}

/* The device draw (core/draw_def.h: ember_draw; tests/draw_ref.h, what a
   backend's sample_rows must give) against the host sampler, fed the same
   uniforms (a second sampler of the same seed hands them out through
   ember_sampler_draw): the same chain, so the same tokens, but where a
   cut or the draw falls within rounding of a mass boundary (about 1e-7 of
   the mass with the host's float candidates; the random rows here never
   meet one). Vocabularies of 151,936 and 1,000 ids with ties, NaN, -inf
   and +inf; every filter alone and together, temperatures of 1e-30 (every
   finite logit scaled to an infinity) and 1e30 (every weight 1: ties
   everywhere), min_p 1, top_k of all ids but one. Then the draw's own edges:
   greedy and no usable id are the argmax; top_k 1 is the argmax; u near 1
   takes the last kept id. */
static void check_device_draw(void) {
    static const struct {
        float temp, top_p, min_p;
        int top_k;
    } cfg[] = {{1.0f, 1, 0, 0},    {0.8f, 0.95f, 0, 0}, {0.7f, 0.9f, 0, 40}, {1.0f, 1, 0.05f, 0},
               {1.5f, 0.5f, 0.01f, 0}, {0.6f, 1, 0, 7},  {2.0f, 0.3f, 0, 1000}, {1.0f, 0.999f, 0.2f, 3},
               {1e-30f, 0.9f, 0, 0},   {1e30f, 0.5f, 0, 0}, {1.0f, 1, 1.0f, 0},  {0.9f, 1, 0, 999}};
    static const int vs[] = {151936, 1000};
    int total = 0, same = 0;
    for (size_t v = 0; v < sizeof vs / sizeof vs[0]; v++) {
        const int V = vs[v];
        float *lg = malloc((size_t)V * sizeof *lg);
        void *scr = malloc(draw_ref_scratch(V));
        for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
            ember_sampler *a = mk(cfg[c].temp, cfg[c].top_k, cfg[c].top_p, cfg[c].min_p, 100 + c, V);
            ember_sampler *b = mk(cfg[c].temp, cfg[c].top_k, cfg[c].top_p, cfg[c].min_p, 100 + c, V);
            const ember_draw p = {cfg[c].temp, cfg[c].top_p, cfg[c].min_p, cfg[c].top_k, 0};
            const int nd = V > 100000 ? 9 : 24;
            for (int d = 0; d < nd; d++) {
                for (int i = 0; i < V; i++) /* a few peaks over noise, and rounded ties */
                    lg[i] = (float)(t_uniform() * 6 - 3) + (i % 997 == d ? 8.0f : 0.0f);
                for (int i = 0; d % 3 == 1 && i < V; i++) lg[i] = roundf(lg[i] * 4) / 4;
                if (d % 4 == 2) lg[d] = NAN, lg[d + 1] = -INFINITY;
                if (d == nd - 1) lg[5] = INFINITY, lg[9] = INFINITY;
                const ember_draw q = ember_sampler_draw(b); /* b's parameters and next uniform */
                CHECK(q.temperature == p.temperature && q.top_p == p.top_p && q.min_p == p.min_p &&
                      q.top_k == p.top_k && q.u >= 0 && q.u < 1);
                const int32_t host = ember_sampler_sample(a, lg), dev = draw_ref(lg, V, &q, scr);
                total++;
                same += host == dev;
                if (host != dev && total - same <= 5)
                    fprintf(stderr, "device draw V %d setting %zu draw %d: %d, host %d\n", V, c, d, dev, host);
            }
            ember_sampler_free(a);
            ember_sampler_free(b);
        }
        free(lg);
        free(scr);
    }
    CHECKF(same == total, "device draw against the host sampler: %d of %d tokens the same", same, total);
    CHECK(ember_draw_mass(1.0f) == 1ull << 44 && ember_draw_mass(0.0f) == 0 && ember_draw_mass(0x1p-44f) == 1 &&
          ember_draw_mass(0x1.fffffep-45f) == 0);
    /* edges */
    enum { EV = 6 };
    void *scr = malloc(draw_ref_scratch(EV));
    const float x[EV] = {1.0f, 3.0f, 2.0f, 3.0f, NAN, -INFINITY};
    ember_draw g = {0, 1, 0, 0, 0.5};
    CHECK(draw_ref(x, EV, &g, scr) == 1); /* greedy: the first of the tied largest */
    g.temperature = 1;
    g.top_k = 1;
    g.u = 0.999999;
    CHECK(draw_ref(x, EV, &g, scr) == 1); /* top_k 1: the first of the tied best */
    g.top_k = 0;
    CHECK(draw_ref(x, EV, &g, scr) == 3); /* u near 1, by id: the last kept id with mass */
    g.u = 0;
    CHECK(draw_ref(x, EV, &g, scr) == 0); /* u 0, by id: the first */
    const float none[3] = {NAN, -INFINITY, NAN};
    CHECK(draw_ref(none, 3, &g, scr) == 1); /* nothing usable: the argmax (-inf at id 1) */
    const float nans[2] = {NAN, NAN};
    CHECK(draw_ref(nans, 2, &g, scr) == 0);
    g.top_p = 1e-6f; /* the top mass alone: the first of the tied best */
    g.u = 0.99;
    CHECK(draw_ref(x, EV, &g, scr) == 1);
    free(scr);
}

/* ember_log_sum_exp against a double reference, and its edge cases. */
static void check_lse(void) {
    static const int ns[] = {1, 7, 8, 9, 1000, 151936};
    int bad = 0;
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        const int n = ns[k];
        float *x = malloc((size_t)n * sizeof *x);
        for (int rep = 0; rep < 3; rep++) {
            for (int i = 0; i < n; i++)
                x[i] = rep == 0 ? (float)(t_uniform() * 8 - 4) : rep == 1 ? (float)(t_uniform() * 200 - 150) : -3.0f;
            double mx = -INFINITY, sum = 0;
            for (int i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
            for (int i = 0; i < n; i++) sum += exp((double)x[i] - mx);
            const double ref = mx + log(sum), got = ember_log_sum_exp(x, n);
            if (!(fabs(got - ref) <= 1e-6 * (fabs(ref) > 1 ? fabs(ref) : 1)) && bad++ < 5)
                fprintf(stderr, "lse n %d rep %d: %.9g, want %.9g\n", n, rep, got, ref);
        }
        free(x);
    }
    CHECKF(bad == 0, "%d log-sum-exp values off", bad);
    float e1[4] = {-INFINITY, -INFINITY, NAN, -INFINITY}, e2[4] = {1.0f, INFINITY, NAN, 2.0f},
          e3[4] = {1.0f, NAN, 2.0f, 3.0f}, e4[9] = {0, 0, 0, 0, 0, 0, 0, 0, NAN};
    CHECK(ember_log_sum_exp(e1, 4) == -INFINITY);
    CHECK(ember_log_sum_exp(e2, 4) == INFINITY);
    CHECK(isnan(ember_log_sum_exp(e3, 4)));
    CHECK(isnan(ember_log_sum_exp(e4, 9)));
    CHECK(fabs(ember_log_sum_exp(e4, 8) - log(8.0)) < 1e-7);
}

int main(void) {
    enum { V = 8 };
    const float lg[V] = {1.0f, 3.0f, 2.5f, -1.0f, 3.0f, 0.0f, 2.0f, -5.0f};
    ember_sampler *s = mk(0, 0, 1, 0, 0, V);
    CHECK(ember_sampler_sample(s, lg) == 1); /* ties -> lowest id */
    ember_sampler_free(s);
    float nanl[3] = {NAN, 2.0f, NAN};
    CHECK(ember_argmax(nanl, 3) == 1);
    /* same seed, same sequence; another seed, another sequence */
    int32_t a[64], b[64], c[64];
    ember_sampler *s1 = mk(1.0f, 0, 1, 0, 42, V), *s2 = mk(1.0f, 0, 1, 0, 42, V), *s3 = mk(1.0f, 0, 1, 0, 43, V);
    for (int i = 0; i < 64; i++) {
        a[i] = ember_sampler_sample(s1, lg);
        b[i] = ember_sampler_sample(s2, lg);
        c[i] = ember_sampler_sample(s3, lg);
    }
    CHECK(!memcmp(a, b, sizeof a));
    CHECK(memcmp(a, c, sizeof a) != 0);
    ember_sampler_free(s1);
    ember_sampler_free(s2);
    ember_sampler_free(s3);
    /* distribution at temperature 0.7 matches softmax(lg / 0.7) */
    {
        const int N = 200000;
        int cnt[V] = {0};
        s = mk(0.7f, 0, 1, 0, 7, V);
        for (int i = 0; i < N; i++) cnt[ember_sampler_sample(s, lg)]++;
        ember_sampler_free(s);
        double z = 0, p[V], chi = 0;
        for (int i = 0; i < V; i++) z += exp(lg[i] / 0.7);
        for (int i = 0; i < V; i++) {
            p[i] = exp(lg[i] / 0.7) / z;
            if (p[i] * N > 5) chi += (cnt[i] - p[i] * N) * (cnt[i] - p[i] * N) / (p[i] * N);
        }
        CHECKF(chi < 30.0, "chi-square %g over 7 dof", chi); /* p ~ 1e-4 */
    }
    /* top-k 2: only the two best (ids 1 and 4 tie at 3.0) */
    s = mk(1.0f, 2, 1, 0, 3, V);
    for (int i = 0; i < 2000; i++) {
        int32_t t = ember_sampler_sample(s, lg);
        CHECK(t == 1 || t == 4);
    }
    ember_sampler_free(s);
    /* top-p: the smallest prefix with mass >= p */
    s = mk(1.0f, 0, 0.5f, 0, 3, V);
    for (int i = 0; i < 2000; i++) {
        int32_t t = ember_sampler_sample(s, lg);
        CHECK(t == 1 || t == 4); /* 1 and 4 hold ~0.57 of the mass */
    }
    ember_sampler_free(s);
    /* min-p 0.5: tokens with p >= 0.5 p_max: 1, 4, 2 (e^-0.5 = 0.61) */
    s = mk(1.0f, 0, 1, 0.5f, 3, V);
    int seen2 = 0;
    for (int i = 0; i < 4000; i++) {
        int32_t t = ember_sampler_sample(s, lg);
        CHECK(t == 1 || t == 4 || t == 2);
        seen2 |= t == 2;
    }
    CHECK(seen2);
    ember_sampler_free(s);
    /* a large vocabulary exercising the top-p fast path */
    {
        enum { BV = 50000 };
        float *big = malloc(BV * sizeof *big);
        for (int i = 0; i < BV; i++) big[i] = (float)((i * 7919) % 1000) / 100.0f;
        s = mk(1.0f, 0, 0.9f, 0, 5, BV);
        ember_sampler *s_ref = mk(1.0f, 0, 0.9f, 0, 5, BV);
        for (int i = 0; i < 200; i++) {
            int32_t t = ember_sampler_sample(s, big);
            CHECK(t >= 0 && t < BV && big[t] >= 7.0f); /* top 10% of mass lies above 7 */
            CHECK(ember_sampler_sample(s_ref, big) == t);
        }
        ember_sampler_free(s);
        ember_sampler_free(s_ref);
        free(big);
    }
    /* speculative verification (ember_sampler_sample_draft): greedy ignores the draft;
       without one it is the plain draw, same stream; with one its tokens follow the
       same distribution as the plain chain's (two-sample chi-square), for a draft in
       the support, one outside it, under every filter */
    {
        s = mk(0, 0, 1, 0, 0, V);
        for (int d = -1; d < V; d++) CHECK(ember_sampler_sample_draft(s, lg, d) == 1);
        ember_sampler_free(s);
        s1 = mk(0.9f, 0, 1, 0, 11, V);
        s2 = mk(0.9f, 0, 1, 0, 11, V);
        bool same = true;
        for (int i = 0; i < 256; i++) same &= ember_sampler_sample_draft(s1, lg, -1) == ember_sampler_sample(s2, lg);
        CHECK(same);
        ember_sampler_free(s1);
        ember_sampler_free(s2);
        static const struct {
            float temp, top_p, min_p;
            int top_k;
        } cfg[] = {{0.7f, 1, 0, 0}, {1.0f, 1, 0, 3}, {1.0f, 0.8f, 0, 0}, {1.2f, 1, 0.3f, 0}};
        static const int32_t drafts[] = {1, 2, 5, 7}; /* likely, middling, unlikely, outside most supports */
        const int N = 60000;
        for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++)
            for (size_t di = 0; di < sizeof drafts / sizeof drafts[0]; di++) {
                long a_cnt[V] = {0}, b_cnt[V] = {0}, acc = 0;
                ember_sampler *sa = mk(cfg[ci].temp, cfg[ci].top_k, cfg[ci].top_p, cfg[ci].min_p, 100 + ci, V);
                ember_sampler *sb = mk(cfg[ci].temp, cfg[ci].top_k, cfg[ci].top_p, cfg[ci].min_p, 900 + di, V);
                for (int i = 0; i < N; i++) {
                    int32_t t = ember_sampler_sample_draft(sa, lg, drafts[di]);
                    a_cnt[t]++;
                    acc += t == drafts[di];
                    b_cnt[ember_sampler_sample(sb, lg)]++;
                }
                ember_sampler_free(sa);
                ember_sampler_free(sb);
                double chi = 0;
                int df = -1;
                bool support = true;
                for (int t = 0; t < V; t++) {
                    support &= (a_cnt[t] > 0) == (b_cnt[t] > 0) || a_cnt[t] + b_cnt[t] < 5;
                    double tot = (double)(a_cnt[t] + b_cnt[t]);
                    if (tot < 10) continue;
                    df++;
                    chi += (a_cnt[t] - tot / 2) * (a_cnt[t] - tot / 2) / (tot / 2) +
                           (b_cnt[t] - tot / 2) * (b_cnt[t] - tot / 2) / (tot / 2);
                }
                /* the 1e-4 quantiles of chi-square with 1..7 dof */
                static const double lim[8] = {0, 15.1, 18.4, 21.1, 23.5, 25.7, 27.9, 29.9};
                CHECKF(df >= 1 && chi < lim[df] && support, "config %zu draft %d: chi-square %g over %d dof", ci,
                       drafts[di], chi, df);
                CHECK(a_cnt[drafts[di]] == acc);
            }
    }
    check_argmax();
    check_lse();
    check_copies();
    check_device_draw();
    check_support();
    check_tie_cuts();
    check_infinite();
    /* a greedy sampler makes its scratch when a temperature first comes: the same draws as one
       made with it */
    {
        ember_sampler *g0 = mk(0, 0, 1, 0, 0, V), *t0 = mk(0.9f, 0, 0.9f, 0, 21, V);
        CHECK(ember_sampler_sample(g0, lg) == 1 && ember_sampler_dense(g0) == NULL);
        ember_sampling sp;
        ember_sampling_init(&sp);
        sp.temperature = 0.9f;
        sp.top_p = 0.9f;
        sp.seed = 21;
        ember_error e2 = {0};
        CHECK(ember_sampler_configure(g0, &sp, &e2) == EMBER_OK);
        bool same = true;
        for (int i = 0; i < 64; i++) same &= ember_sampler_sample(g0, lg) == ember_sampler_sample(t0, lg);
        CHECK(same && ember_sampler_dense(g0) != NULL);
        ember_sampler_free(g0);
        ember_sampler_free(t0);
    }
    /* bad parameters */
    ember_sampling p;
    ember_sampling_init(&p);
    ember_error err = {0};
    p.temperature = -1;
    CHECK(ember_sampler_new(&p, V, &s, &err) == EMBER_ERR_INVALID_ARG);
    p.temperature = NAN;
    CHECK(ember_sampler_new(&p, V, &s, &err) == EMBER_ERR_INVALID_ARG);
    p.temperature = 1;
    p.top_p = 0;
    CHECK(ember_sampler_new(&p, V, &s, &err) == EMBER_ERR_INVALID_ARG);
    p.top_p = 1;
    p.min_p = 2;
    CHECK(ember_sampler_new(&p, V, &s, &err) == EMBER_ERR_INVALID_ARG);
    return test_done();
}
