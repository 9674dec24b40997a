/*
 * sampler_loops.h - the sampler's passes over a whole vocabulary, included
 * twice by sampler.c: LOOP(name) names this copy's functions and LOOP_ATTR
 * is its target attribute (empty: baseline x86-64, SSE2; target("avx2"):
 * 8-wide). Both copies do the same float and double operations in the same
 * order (no FMA: the build contracts nothing), so they give the same bits;
 * the AVX2 one only runs where the CPU has AVX2 (ember_sampler's avx2 flag).
 * Written to vectorise: no branches, selects only (sampler.c is built with
 * -fno-trapping-math so that compares vectorise).
 */

/* w[i] = logits[i] / T, -inf where the logit is NaN; returns the number of
   usable logits (not NaN, not -inf) and sets *sunk to those of them the
   division took to -inf. */
LOOP_ATTR static int LOOP(scale)(const float *logits, float *w, int V, float T, int *sunk) {
    int usable = 0, sk = 0;
    for (int i = 0; i < V; i++) {
        const float x = logits[i], v = x / T;
        const int ok = (x == x) & (x != -INFINITY);
        usable += ok;
        sk += ok & (v == -INFINITY);
        w[i] = x == x ? v : -INFINITY;
    }
    *sunk = sk;
    return usable;
}

/* w[i] = e^(w[i] - mx) (exp_nonpos), for w[i] <= mx, mx finite. */
LOOP_ATTR static void LOOP(expo)(float *w, int V, float mx) {
    for (int i = 0; i < V; i++) w[i] = exp_nonpos(w[i] - mx);
}

/* w[i] = 0 where w[i] < cut. */
LOOP_ATTR static void LOOP(floor)(float *w, int V, float cut) {
    for (int i = 0; i < V; i++) w[i] = w[i] < cut ? 0.0f : w[i];
}

/* The sum of e^(x[i] - mx) over x[0, n) (x[i] <= mx, mx finite; NaN
   propagates), in double, eight partial sums. */
LOOP_ATTR static double LOOP(expsum)(const float *x, int n, float mx) {
    double a[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) a[l] += exp_nonpos(x[i + l] - mx);
    for (; i < n; i++) a[0] += exp_nonpos(x[i] - mx);
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* key[i] = fkey(w[i]). */
LOOP_ATTR static void LOOP(keys)(const float *w, int n, uint32_t *key) {
    for (int i = 0; i < n; i++) key[i] = fkey(w[i]);
}

/* bsum[b] = the sum of w over block b of BLOCK ids (in double, eight
   partial sums a block); returns the blocks' sum. */
LOOP_ATTR static double LOOP(bsums)(const float *w, int V, double *bsum) {
    const int nb = (V + BLOCK - 1) / BLOCK;
    double total = 0;
    for (int b = 0; b < nb; b++) {
        const int lo = b * BLOCK, hi = lo + BLOCK < V ? lo + BLOCK : V;
        double a[8] = {0};
        int i = lo;
        for (; i + 8 <= hi; i += 8)
            for (int l = 0; l < 8; l++) a[l] += w[i + l];
        for (; i < hi; i++) a[0] += w[i];
        bsum[b] = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
        total += bsum[b];
    }
    return total;
}
