/*
 * sampler.c - see sampler.h.
 *
 * A row's distribution is built one of two ways (build_dist):
 *
 * - dense, the common case (no top_k below the number of usable logits, and
 *   the largest scaled logit finite): w[vocab] holds the scaled logits, then
 *   e^(w - max) for every id, 0 where the logit is NaN or -inf or a filter
 *   dropped the id. top_p finds its cut by a radix walk over the values'
 *   bits (radix_cut: histograms of three levels, no sort); min_p is a
 *   threshold. The draw walks per-block sums, then one block of w, in id
 *   order.
 * - candidates (top_k below the usable count, or an infinite scaled logit):
 *   c[0, n) holds (value, id) pairs; top_k keeps the k best (radix_cut
 *   again, by count), sorts them by value and applies softmax, top_p and
 *   min_p over the sorted list.
 *
 * Either way the kept ids and their masses follow the chain's definition
 * (ties in value: lowest id first), and the draw takes the id where a
 * uniform times the total falls in the running sum. Which way a row goes
 * depends on its parameters and logits only. The passes over the whole
 * vocabulary (sampler_loops.h) exist twice, plain and for AVX2, picked per
 * sampler by the CPU; both do the same float operations in the same order
 * (the build contracts no FMA), so they give the same bits and tokens on
 * every machine. Sums are in double. About 140-360 us a row of 151,936 ids
 * with AVX2 on Zen 5 where the sorted chain took 1-13 ms (bench/RESULTS.md).
 *
 * Threads: a sampler is one row's; different samplers may run at once (the
 * scheduler draws a step's rows on the backend's host threads).
 */
#include "sampler.h"
#include "core/alloc.h"
#include "core/cpu.h"
#include "core/draw_def.h"

#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

typedef struct cand {
    float v;
    int32_t id;
} cand;

enum { DIST_NONE, DIST_CANDS, DIST_DENSE };
enum { BLOCK = 256 };     /* ids per block sum of the dense draw */
enum { RADIX_BINS = 2048 }; /* the widest level of radix_cut (11 bits) */
enum { RADIX_SORT_BELOW = 512 }; /* radix_cut sorts what is left once it is this few */

struct ember_sampler {
    ember_sampling p;
    int vocab;
    ember_rng rng;
    bool avx2;     /* the AVX2 copy of sampler_loops.h (the CPU has AVX2, not turned off) */
    int dist;      /* the last distribution: DIST_CANDS (c[0, n)), DIST_DENSE (w), DIST_NONE (none yet, or greedy) */
    int n;         /* DIST_CANDS: candidates kept */
    double total;  /* the kept mass */
    /* the scratch of sampled draws: NULL until a configuration with a temperature (scratch_alloc) */
    cand *c;        /* [vocab] candidates: scaled logits, then probabilities */
    float *w;       /* [vocab] dense: scaled logits, then unnormalised probabilities */
    double *bsum;   /* [ceil(vocab / BLOCK)] dense: each block's sum of w */
    int32_t *idx;   /* [vocab] radix_cut's ids */
    uint32_t *keys; /* [vocab] radix_cut's keys of w */
    int (*hcnt)[RADIX_BINS];     /* [4] radix_cut's histograms (four for its first level, see histogram4) */
    double (*hmass)[RADIX_BINS]; /* [4] */
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

/* The largest non-NaN value of x[0, n); -inf when there is none. */
static float max_of(const float *x, int n) {
    float mx = -INFINITY;
    int i = 0;
#if defined(__SSE2__)
    __m128 m0 = _mm_set1_ps(-INFINITY), m1 = m0;
    for (; i + 8 <= n; i += 8) { /* maxps(a, b) is a > b ? a : b: a NaN in x leaves m */
        m0 = _mm_max_ps(_mm_loadu_ps(x + i), m0);
        m1 = _mm_max_ps(_mm_loadu_ps(x + i + 4), m1);
    }
    float t[4];
    _mm_storeu_ps(t, _mm_max_ps(m0, m1));
    for (int l = 0; l < 4; l++) mx = t[l] > mx ? t[l] : mx;
#endif
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    return mx;
}

int32_t ember_argmax(const float *x, int n) {
    const float mx = max_of(x, n);
    for (int i = 0; i < n; i++)
        if (x[i] == mx) return i; /* -0 == +0: the lowest id of either, as a scan with > finds */
    return 0;                     /* all NaN */
}

static void scratch_free(ember_sampler *s) {
    free(s->c);
    free(s->w);
    free(s->idx);
    free(s->keys);
    free(s->bsum);
    free(s->hcnt);
    free(s->hmass);
    s->c = NULL;
    s->w = NULL;
    s->idx = NULL;
    s->keys = NULL;
    s->bsum = NULL;
    s->hcnt = NULL;
    s->hmass = NULL;
}

/* The scratch of sampled draws (about 20 bytes an id, 3 MB for 152k ids),
   made on the first configuration with a temperature: greedy rows never
   need it. false (nothing kept) when memory runs out. */
static bool scratch_alloc(ember_sampler *s) {
    const size_t V = (size_t)s->vocab;
    s->c = ember_malloc(V * sizeof *s->c);
    s->w = ember_malloc(V * sizeof *s->w);
    s->idx = ember_malloc(V * sizeof *s->idx);
    s->keys = ember_malloc(V * sizeof *s->keys);
    s->bsum = ember_malloc((V + BLOCK - 1) / BLOCK * sizeof *s->bsum);
    s->hcnt = ember_malloc(4 * sizeof *s->hcnt);
    s->hmass = ember_malloc(4 * sizeof *s->hmass);
    if (s->c && s->w && s->idx && s->keys && s->bsum && s->hcnt && s->hmass) return true;
    scratch_free(s);
    return false;
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
    if (p->temperature > 0 && !s->w && !scratch_alloc(s))
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory for the sampler of a %d-token vocabulary", s->vocab);
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
    s->avx2 = ember_isa_supported(EMBER_ISA_AVX2);
    int rc = ember_sampler_configure(s, p, err);
    if (rc) {
        ember_sampler_free(s);
        return rc;
    }
    *out = s;
    return EMBER_OK;
}

void ember_sampler_use_avx2(ember_sampler *s, bool on) {
    s->avx2 = on && ember_isa_supported(EMBER_ISA_AVX2);
}

const float *ember_sampler_dense(const ember_sampler *s) {
    return s->dist == DIST_DENSE ? s->w : NULL;
}

void ember_sampler_free(ember_sampler *s) {
    if (!s) return;
    scratch_free(s);
    free(s);
}

/* Candidate order: value descending, then id ascending (a total order). */
static int better(const cand *a, const cand *b) {
    return a->v > b->v || (a->v == b->v && a->id < b->id);
}

static int cmp_cand(const void *a, const void *b) {
    return better(a, b) ? -1 : better(b, a) ? 1 : 0;
}

/* A float's bits as an unsigned key in the floats' order (no NaN): a < b
   gives key(a) < key(b); -0 and +0 share a key, as they compare equal. */
static inline uint32_t fkey(float f) {
    f += 0.0f; /* -0 -> +0 */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u ^ ((0u - (u >> 31)) | 0x80000000u); /* negative: ~u; else the sign bit set */
}

/* s->keys[i] = fkey(w[i]) for i < n (the copy of sampler_loops.h the flag picks). */
static void keys_all(ember_sampler *s, const float *w, int n);

/* radix_cut's first level: counts (and masses, by_mass) of w[0, n) by the
   top 11 bits of their keys (s->keys), in s->hcnt[0] and s->hmass[0].
   Four histograms, one per element modulo 4, summed at the end: equal bins
   in a row (the common case) then do not wait on each other's updates. */
static void histogram4(ember_sampler *s, const float *w, int n, bool by_mass) {
    memset(s->hcnt, 0, 4 * sizeof *s->hcnt);
    if (by_mass) memset(s->hmass, 0, 4 * sizeof *s->hmass);
    const uint32_t *keys = s->keys;
    int i = 0;
    if (by_mass)
        for (; i + 4 <= n; i += 4)
            for (int l = 0; l < 4; l++) {
                const uint32_t b = keys[i + l] >> 21;
                s->hcnt[l][b]++;
                s->hmass[l][b] += w[i + l];
            }
    else
        for (; i + 4 <= n; i += 4)
            for (int l = 0; l < 4; l++) s->hcnt[l][keys[i + l] >> 21]++;
    for (; i < n; i++) {
        s->hcnt[0][keys[i] >> 21]++;
        if (by_mass) s->hmass[0][keys[i] >> 21] += w[i];
    }
    for (int b = 0; b < RADIX_BINS; b++) {
        s->hcnt[0][b] += (s->hcnt[1][b] + s->hcnt[2][b]) + s->hcnt[3][b];
        if (by_mass) s->hmass[0][b] = (s->hmass[0][b] + s->hmass[1][b]) + (s->hmass[2][b] + s->hmass[3][b]);
    }
}

/* radix_cut's finish for few elements (the ids from[0, m), or 0 .. m - 1
   when from is NULL), with `taken` already walked above them: sorts them
   (value down, id up) and walks. Same results as radix_cut. */
static bool sort_cut(ember_sampler *s, const float *w, const int32_t *from, int m, bool by_mass, double need,
                     double taken, int *ties, int *n_key) {
    cand *c = s->c;
    for (int j = 0; j < m; j++) {
        int i = from ? from[j] : j;
        c[j] = (cand){w[i] + 0.0f, i};
    }
    qsort(c, (size_t)m, sizeof *c, cmp_cand);
    int j = 0;
    for (; j < m; j++) {
        taken += by_mass ? (double)c[j].v : 1.0;
        if (taken >= need) break;
    }
    if (j == m) return false;
    int a = j, b = j + 1; /* the run of c[j]'s value */
    while (a > 0 && c[a - 1].v == c[j].v) a--;
    while (b < m && c[b].v == c[j].v) b++;
    for (int r = a; r < b; r++) s->idx[r - a] = c[r].id;
    *ties = j - a + 1;
    *n_key = b - a;
    return true;
}

/* Where a walk over w[0, n) from the largest value down (equal values:
   lowest id first) reaches `need`: counting elements (by_mass false), or
   summing the values themselves (by_mass true; they are then >= 0). w has
   no NaN. On true, s->idx[0, *n_key) holds, by id, the elements with the
   value of the one that reaches it (the cut): the walk takes every element
   greater than the cut and the first *ties of those. false: the walk never reaches
   need (it takes everything). Three levels of histograms over the key's
   bits (11, 11, 10), each over the elements of the previous level's bin,
   until RADIX_SORT_BELOW or fewer are left: those are sorted (sort_cut).
   Uses s->keys, s->hcnt, s->hmass, s->idx and s->c. */
static bool radix_cut(ember_sampler *s, const float *w, int n, bool by_mass, double need, int *ties, int *n_key) {
    static const int shift[3] = {21, 10, 0}, bins[3] = {2048, 2048, 1024};
    int *cnt = s->hcnt[0];
    double *mass = s->hmass[0], taken = 0; /* elements or mass taken above the bin under study */
    int32_t *idx = s->idx;
    const uint32_t *keys = s->keys;
    int m = n; /* level 0: all of w; later levels idx[0, m) */
    uint32_t prefix = 0;
    for (int lv = 0; lv < 3; lv++) {
        if (m <= RADIX_SORT_BELOW) return sort_cut(s, w, lv ? idx : NULL, m, by_mass, need, taken, ties, n_key);
        const int sh = shift[lv], nb = bins[lv];
        const uint32_t mask = (uint32_t)nb - 1;
        if (lv == 0) {
            keys_all(s, w, n);
            histogram4(s, w, n, by_mass);
        } else {
            memset(cnt, 0, (size_t)nb * sizeof *cnt);
            if (by_mass) memset(mass, 0, (size_t)nb * sizeof *mass);
            for (int j = 0; j < m; j++) {
                const int i = idx[j];
                const uint32_t b = keys[i] >> sh & mask;
                cnt[b]++;
                if (by_mass) mass[b] += w[i];
            }
        }
        int b = nb - 1;
        for (; b >= 0; b--) {
            double add = by_mass ? mass[b] : cnt[b];
            if (cnt[b] && taken + add >= need) break;
            taken += add;
        }
        if (b < 0) return false;
        prefix |= (uint32_t)b << sh;
        /* keep the bin's elements, in id order */
        const int top = 32 - sh; /* bits fixed so far, this level's included */
        const uint32_t fixed = top >= 32 ? 0xffffffffu : ~(0xffffffffu >> top);
        int k = 0;
        for (int j = 0; j < m; j++) {
            const int i = lv ? idx[j] : j;
            idx[k] = i;
            k += (keys[i] & fixed) == prefix;
        }
        m = k;
    }
    /* idx[0, m): the elements with key `prefix`, all of one value */
    int t = 0;
    if (by_mass) {
        while (t < m && taken < need) taken += w[idx[t++]];
    } else {
        t = (int)(need - taken);
    }
    *ties = t;
    *n_key = m;
    return true;
}

/* The polynomial e^x of draw_def.h, shared with the device draw. */
#define exp_nonpos ember_exp_nonpos

#define LOOP(name) name##_plain
#define LOOP_ATTR
#include "sampler_loops.h"
#undef LOOP
#undef LOOP_ATTR
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SAMPLER_AVX2 1
#define LOOP(name) name##_avx2
#define LOOP_ATTR __attribute__((target("avx2")))
#include "sampler_loops.h"
#undef LOOP
#undef LOOP_ATTR
#else
#define SAMPLER_AVX2 0
#endif

/* The loops of sampler_loops.h, the copy the sampler's flag picks. */
static int scale_all(const ember_sampler *s, const float *logits, int *sunk) {
#if SAMPLER_AVX2
    if (s->avx2) return scale_avx2(logits, s->w, s->vocab, s->p.temperature, sunk);
#endif
    return scale_plain(logits, s->w, s->vocab, s->p.temperature, sunk);
}

static void expo_all(const ember_sampler *s, float mx) {
#if SAMPLER_AVX2
    if (s->avx2) {
        expo_avx2(s->w, s->vocab, mx);
        return;
    }
#endif
    expo_plain(s->w, s->vocab, mx);
}

static void floor_all(const ember_sampler *s, float cut) {
#if SAMPLER_AVX2
    if (s->avx2) {
        floor_avx2(s->w, s->vocab, cut);
        return;
    }
#endif
    floor_plain(s->w, s->vocab, cut);
}

static void keys_all(ember_sampler *s, const float *w, int n) {
#if SAMPLER_AVX2
    if (s->avx2) {
        keys_avx2(w, n, s->keys);
        return;
    }
#endif
    keys_plain(w, n, s->keys);
}

double ember_log_sum_exp(const float *x, int n) {
    static _Atomic int avx2 = -1; /* the CPU's answer, asked once (a race asks it twice: the same answer) */
    int a = atomic_load_explicit(&avx2, memory_order_relaxed);
    if (a < 0) {
        a = ember_isa_supported(EMBER_ISA_AVX2);
        atomic_store_explicit(&avx2, a, memory_order_relaxed);
    }
    const float mx = max_of(x, n);
    if (!isfinite(mx)) return mx;
#if SAMPLER_AVX2
    if (a) return mx + log(expsum_avx2(x, n, mx));
#endif
    return mx + log(expsum_plain(x, n, mx));
}

/* s->bsum[b] = the sum of w over block b (in double); returns their sum. */
static double block_sums(ember_sampler *s) {
#if SAMPLER_AVX2
    if (s->avx2) return bsums_avx2(s->w, s->vocab, s->bsum);
#endif
    return bsums_plain(s->w, s->vocab, s->bsum);
}

/* The sorted way: c[0, n) holds scaled logits (n > 0). Applies top_k
   (already done when `sorted`: then c is the k best in order), softmax,
   top_p and min_p; leaves the kept candidates in c[0, s->n). */
static void build_cands(ember_sampler *s, int n, bool sorted) {
    const ember_sampling *p = &s->p;
    if (!sorted && p->top_k > 0 && p->top_k < n) { /* rare (see build_dist): select by sorting */
        qsort(s->c, (size_t)n, sizeof *s->c, cmp_cand);
        n = p->top_k;
        sorted = true;
    }
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) mx = s->c[i].v > mx ? s->c[i].v : mx;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        s->c[i].v = isinf(mx) ? (s->c[i].v == mx ? 1.0f : 0.0f) : expf(s->c[i].v - mx);
        sum += s->c[i].v;
    }
    for (int i = 0; i < n; i++) s->c[i].v = (float)(s->c[i].v / sum);
    if (p->top_p < 1.0f) {
        if (!sorted) qsort(s->c, (size_t)n, sizeof *s->c, cmp_cand);
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
            if (s->c[i].v >= p->min_p * best) s->c[m++] = s->c[i];
        n = m;
    }
    double total = 0;
    for (int i = 0; i < n; i++) total += s->c[i].v;
    s->dist = DIST_CANDS;
    s->n = n;
    s->total = total;
}

/* The dense way, after scaling (w = logits / temperature, -inf for
   unusable ids; mx, their largest, finite): w becomes e^(w - mx), then
   top_p and min_p zero the ids they drop. */
static void build_dense(ember_sampler *s, float mx) {
    const ember_sampling *p = &s->p;
    const int V = s->vocab;
    float *w = s->w;
    expo_all(s, mx);
    if (p->top_p < 1.0f) {
        double total = block_sums(s);
        int ties, n_key;
        if (radix_cut(s, w, V, true, (double)p->top_p * total, &ties, &n_key)) {
            const float cut = w[s->idx[0]]; /* the value with that key */
            floor_all(s, cut);
            for (int t = ties; t < n_key; t++) w[s->idx[t]] = 0.0f; /* ties past the walk's end */
        }
    }
    if (p->min_p > 0) {
        floor_all(s, p->min_p * max_of(w, V));
    }
    s->dist = DIST_DENSE;
    s->total = block_sums(s);
}

/* Builds the final distribution for one row of logits (temperature > 0)
   in s (s->dist, and c[0, s->n) or w, s->total). Returns false when no
   logit is usable (all NaN or -inf): the caller falls back to the argmax. */
static bool build_dist(ember_sampler *s, const float *logits) {
    const ember_sampling *p = &s->p;
    const int V = s->vocab;
    float *w = s->w;
    int sunk;                                 /* usable logits that scaling took to -inf */
    const int usable = scale_all(s, logits, &sunk); /* not NaN, not -inf */
    const float mx = max_of(w, V);
    if (usable == 0) return false;
    const bool top_k = p->top_k > 0 && p->top_k < usable;
    if (isfinite(mx) && !top_k) {
        build_dense(s, mx);
        return true;
    }
    int n = 0;
    if (isfinite(mx) && sunk == 0) { /* top_k: the k best by value, then id; the rest of w is above -inf */
        int ties, n_key;
        (void)radix_cut(s, w, V, false, (double)p->top_k, &ties, &n_key); /* usable > top_k: found */
        const float cut = w[s->idx[0]]; /* the value with that key: greater values are above it */
        for (int i = 0; i < V; i++)
            if (w[i] > cut) s->c[n++] = (cand){w[i], i};
        for (int t = 0; t < ties; t++) s->c[n++] = (cand){w[s->idx[t]], s->idx[t]};
        qsort(s->c, (size_t)n, sizeof *s->c, cmp_cand);
        build_cands(s, n, true);
        return true;
    }
    for (int i = 0; i < V; i++) /* an infinite scaled logit */
        if (logits[i] == logits[i] && logits[i] != -INFINITY) s->c[n++] = (cand){w[i], i};
    build_cands(s, n, false);
    return true;
}

/* One draw from the distribution built last (s->dist) of mass `total`,
   leaving out the id `skip` (-1: none; DIST_CANDS: an index into c). Takes
   the element where u * total falls in the running sum; when rounding
   leaves u past the end, the last element with mass. */
static int32_t draw(ember_sampler *s, double total, int skip) {
    double u = ember_rng_uniform(&s->rng) * total, acc = 0;
    int last = -1;
    if (s->dist == DIST_CANDS) {
        for (int i = 0; i < s->n; i++) {
            if (i == skip || !(s->c[i].v > 0)) continue;
            acc += s->c[i].v;
            last = i;
            if (u < acc) return s->c[i].id;
        }
        return s->c[last >= 0 ? last : 0].id;
    }
    const int V = s->vocab, nb = (V + BLOCK - 1) / BLOCK;
    const float *w = s->w;
    for (int b = 0; b < nb; b++) {
        const int lo = b * BLOCK, hi = lo + BLOCK < V ? lo + BLOCK : V;
        double bs = s->bsum[b] - (skip >= lo && skip < hi ? w[skip] : 0);
        if (!(u < acc + bs)) {
            acc += bs;
            for (int i = hi - 1; last < 0 && bs > 0 && i >= lo; i--)
                if (w[i] > 0 && i != skip) last = i;
            continue;
        }
        for (int i = lo; i < hi; i++) {
            if (i == skip || !(w[i] > 0)) continue;
            acc += w[i];
            last = i;
            if (u < acc) return i;
        }
        return last; /* rounding: the block's sum ran past its elements' */
    }
    return last >= 0 ? last : 0;
}

ember_draw ember_sampler_draw(ember_sampler *s) {
    const ember_sampling *p = &s->p;
    return (ember_draw){.temperature = p->temperature, .top_p = p->top_p, .min_p = p->min_p, .top_k = p->top_k,
                        .u = p->temperature > 0 ? ember_rng_uniform(&s->rng) : 0};
}

int32_t ember_sampler_sample(ember_sampler *s, const float *logits) {
    s->dist = DIST_NONE;
    if (s->p.temperature == 0 || !build_dist(s, logits)) return ember_argmax(logits, s->vocab);
    return draw(s, s->total, -1);
}

int32_t ember_sampler_sample_draft(ember_sampler *s, const float *logits, int32_t draft) {
    s->dist = DIST_NONE;
    if (s->p.temperature == 0 || !build_dist(s, logits)) return ember_argmax(logits, s->vocab);
    if (draft < 0) return draw(s, s->total, -1);
    /* the draft's place and mass in the distribution; none: p(draft) = 0, always rejected, the residual is p */
    int at = -1;
    double pm = 0;
    if (s->dist == DIST_DENSE) {
        if (draft < s->vocab && s->w[draft] > 0) at = draft, pm = s->w[draft];
    } else {
        for (int i = 0; i < s->n && at < 0; i++)
            if (s->c[i].id == draft && s->c[i].v > 0) at = i, pm = s->c[i].v;
    }
    if (at < 0) return draw(s, s->total, -1);
    /* accept with probability p(draft) */
    if (ember_rng_uniform(&s->rng) < pm / s->total) return draft;
    /* rejected: a draw from p without the draft, renormalised; p itself when nothing is left */
    double rest = s->total - pm;
    if (!(rest > 0)) return draw(s, s->total, -1);
    return draw(s, rest, at);
}
