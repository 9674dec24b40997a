/* sampler.c - see sampler.h. */
#include "sampler.h"
#include "core/alloc.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct cand {
    float v;
    int32_t id;
} cand;

struct ember_sampler {
    ember_sampling p;
    int vocab;
    ember_rng rng;
    cand *c;       /* [vocab] candidates: scaled logits, then probabilities */
};

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void ember_rng_seed(ember_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

uint64_t ember_rng_next(ember_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double ember_rng_uniform(ember_rng *r) {
    return (double)(ember_rng_next(r) >> 11) * 0x1.0p-53;
}

int32_t ember_argmax(const float *x, int n) {
    int32_t best = -1;
    for (int i = 0; i < n; i++)
        if (!isnan(x[i]) && (best < 0 || x[i] > x[best])) best = i;
    return best < 0 ? 0 : best;
}

int ember_sampler_configure(ember_sampler *s, const ember_sampling *p, ember_error *err) {
    if (!isfinite(p->temperature) || p->temperature < 0)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "temperature must be a finite number >= 0, got %g",
                         (double)p->temperature);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "top_p must be in (0, 1], got %g", (double)p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "min_p must be in [0, 1], got %g", (double)p->min_p);
    if (p->top_k < 0) return ember_err(err, EMBER_ERR_INVALID_ARG, "top_k must be >= 0, got %d", p->top_k);
    s->p = *p;
    ember_rng_seed(&s->rng, p->seed);
    return EMBER_OK;
}

int ember_sampler_new(const ember_sampling *p, int vocab, ember_sampler **out, ember_error *err) {
    *out = NULL;
    if (vocab < 1) return ember_err(err, EMBER_ERR_INVALID_ARG, "vocabulary of %d tokens", vocab);
    ember_sampler *s = ember_calloc(1, sizeof *s);
    if (!s) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    s->vocab = vocab;
    s->c = ember_malloc((size_t)vocab * sizeof *s->c);
    int rc = s->c ? ember_sampler_configure(s, p, err) : ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    if (rc) {
        ember_sampler_free(s);
        return rc;
    }
    *out = s;
    return EMBER_OK;
}

void ember_sampler_free(ember_sampler *s) {
    if (!s) return;
    free(s->c);
    free(s);
}

/* Candidate order: value descending, then id ascending (a total order). */
static int better(const cand *a, const cand *b) {
    return a->v > b->v || (a->v == b->v && a->id < b->id);
}

static int cmp_cand(const void *a, const void *b) {
    return better(a, b) ? -1 : better(b, a) ? 1 : 0;
}

/* Moves the k best of c[0, n) to the front, in any order. */
static void select_top(cand *c, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        cand t = c[mid];
        c[mid] = c[hi];
        c[hi] = t;
        int store = lo;
        for (int i = lo; i < hi; i++)
            if (better(&c[i], &c[hi])) {
                t = c[i];
                c[i] = c[store];
                c[store++] = t;
            }
        t = c[store];
        c[store] = c[hi];
        c[hi] = t;
        if (store == k - 1 || store == k) return;
        if (store < k)
            lo = store + 1;
        else
            hi = store - 1;
    }
}

/* Builds the final distribution for one row of logits (temperature > 0):
   s->c[0, *n) holds the surviving candidates with unnormalised
   probabilities summing to *total. Returns false when no logit is usable
   (all NaN or -inf): the caller falls back to the argmax. */
static bool build_dist(ember_sampler *s, const float *logits, int *n_out, double *total_out) {
    const ember_sampling *p = &s->p;
    int n = 0;
    for (int i = 0; i < s->vocab; i++) {
        if (isnan(logits[i]) || logits[i] == -INFINITY) continue;
        s->c[n] = (cand){logits[i] / p->temperature, i};
        n++;
    }
    if (n == 0) return false;
    bool sorted = false;
    if (p->top_k > 0 && p->top_k < n) {
        select_top(s->c, n, p->top_k);
        n = p->top_k;
        qsort(s->c, (size_t)n, sizeof *s->c, cmp_cand);
        sorted = true;
    }
    /* softmax over the candidates */
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) mx = s->c[i].v > mx ? s->c[i].v : mx;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        s->c[i].v = isinf(mx) ? (s->c[i].v == mx ? 1.0f : 0.0f) : expf(s->c[i].v - mx);
        sum += s->c[i].v;
    }
    for (int i = 0; i < n; i++) s->c[i].v = (float)(s->c[i].v / sum);
    if (p->top_p < 1.0f) {
        if (!sorted) {
            /* the smallest prefix reaching top_p usually lies in the top few hundred */
            int k = n < 256 ? n : 256;
            for (;;) {
                select_top(s->c, n, k);
                double mass = 0;
                for (int i = 0; i < k; i++) mass += s->c[i].v;
                if (mass >= p->top_p || k == n) break;
                k = k * 4 < n ? k * 4 : n;
            }
            qsort(s->c, (size_t)k, sizeof *s->c, cmp_cand);
            n = k;
        }
        double cum = 0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            cum += s->c[i].v;
            if (cum >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (p->min_p > 0) {
        float best = 0;
        for (int i = 0; i < n; i++) best = s->c[i].v > best ? s->c[i].v : best;
        int m = 0;
        for (int i = 0; i < n; i++)
            if (s->c[i].v >= p->min_p * best) {
                s->c[m++] = s->c[i];
            }
        n = m;
    }
    double total = 0;
    for (int i = 0; i < n; i++) total += s->c[i].v;
    *n_out = n;
    *total_out = total;
    return true;
}

/* One draw from candidates c[0, n) of unnormalised mass total, skipping
   candidate `skip` (-1: none). */
static int32_t draw(ember_sampler *s, int n, double total, int skip) {
    double u = ember_rng_uniform(&s->rng) * total, acc = 0;
    int last = -1;
    for (int i = 0; i < n; i++) {
        if (i == skip) continue;
        acc += s->c[i].v;
        last = i;
        if (u < acc) return s->c[i].id;
    }
    return s->c[last >= 0 ? last : n - 1].id;
}

int32_t ember_sampler_sample(ember_sampler *s, const float *logits) {
    if (s->p.temperature == 0) return ember_argmax(logits, s->vocab);
    int n;
    double total;
    if (!build_dist(s, logits, &n, &total)) return ember_argmax(logits, s->vocab);
    return draw(s, n, total, -1);
}

int32_t ember_sampler_sample_draft(ember_sampler *s, const float *logits, int32_t draft) {
    if (s->p.temperature == 0) return ember_argmax(logits, s->vocab);
    int n;
    double total;
    if (!build_dist(s, logits, &n, &total)) return ember_argmax(logits, s->vocab);
    if (draft < 0) return draw(s, n, total, -1);
    int at = -1;
    for (int i = 0; i < n && at < 0; i++)
        if (s->c[i].id == draft) at = i;
    if (at < 0) return draw(s, n, total, -1); /* p(draft) = 0: always rejected, the residual is p */
    /* accept with probability p(draft) */
    double pd = s->c[at].v / total;
    if (ember_rng_uniform(&s->rng) < pd) return draft;
    /* rejected: a draw from p without the draft, renormalised; p itself when nothing is left */
    double rest = total - s->c[at].v;
    if (!(rest > 0) || n == 1) return draw(s, n, total, -1);
    return draw(s, n, rest, at);
}
