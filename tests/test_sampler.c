/*
 * test_sampler.c - the sampler chain: greedy, determinism per seed, the
 * support each filter leaves, and the sampled distribution matching the
 * softmax of the logits (chi-square bound over many draws), and
 * speculative verification keeping that distribution.
 */
#include <stdbool.h>

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
