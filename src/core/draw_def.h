/*
 * draw_def.h - what the host sampler (src/sample) and the device draw (a
 * backend's sample_rows, docs/cuda.md "Sampling on the GPU") share, written
 * once for C and CUDA: the float polynomial of e^x and the fixed-point mass
 * of a device draw, and the draw's definition with its parameters
 * (ember_draw). In core because both the sampler and the backends depend
 * on core, and neither on the other. Plain float and double operations in
 * a fixed order (the C build contracts no FMA, the CUDA build is
 * --fmad=false), so every compiler and device gives the same bits.
 */
#ifndef EMBER_CORE_DRAW_DEF_H
#define EMBER_CORE_DRAW_DEF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define EMBER_DRAW_FN static __host__ __device__ __forceinline__
#else
#define EMBER_DRAW_FN static inline
#endif

/* The largest vocabulary a device draw takes: its masses (ember_draw_mass,
   each at most 2^44) sum to at most 2^63, within 64 bits. */
#define EMBER_DRAW_MAX_IDS (1 << 19)

/* One row's device draw (a backend's sample_rows; rows of at most
   EMBER_DRAW_MAX_IDS): the chain of sampler.h with the row's next uniform
   u in [0, 1) (ember_sampler_draw gives both). temperature <= 0
   (or NaN): the argmax, as argmax_rows. Otherwise, over the row's logits x
   and its usable ids (x neither NaN nor -inf):
   - s = x / temperature, mx the largest s; the weight w = e^(s - mx) by
     ember_exp_nonpos (w = 1 where s == mx and 0 elsewhere when mx is
     infinite); an id's mass is ember_draw_mass(w). No usable
     id: the argmax.
   - The ids in order of w descending, then id ascending. top_k (0 < k <
     usable) keeps the first k; top_p < 1 then keeps the shortest prefix
     whose masses reach need = ceil(top_p * M) (M: the kept masses; every
     id when need >= M; ember_draw_need); min_p > 0 keeps the ids with
     w >= min_p.
   - K, the kept masses' sum; t = floor(u * K) within [0, K - 1]
     (ember_draw_point); the token is the kept id where the running sum of
     masses first exceeds t, walked in the order above when top_k applied,
     else by id.
   Integer masses make every sum exact, so any implementation gives the
   same token; it matches ember_sampler_sample's (the same chain and
   uniform) except where a cut or the draw falls within rounding of a mass
   boundary. */
typedef struct ember_draw {
    float temperature, top_p, min_p;
    int32_t top_k;
    double u;
} ember_draw;

/* e^x for x <= 0, x = -inf included (0); 0 below -87.33 (where e^x leaves
   the normal floats); NaN for NaN; exactly 1 at 0. Cephes' expf
   polynomial: within 1 ulp of e^x (a sweep of [-87.3, 0] against exp() in
   double found 0.99). Written to vectorise: no branch but the final
   select. */
EMBER_DRAW_FN float ember_exp_nonpos(float x) {
    const float lo = -87.33654f;
    float y = x >= lo ? x : lo; /* NaN -> lo: no NaN reaches the conversion to int */
    float n = (y * 1.44269504f + 12582912.0f) - 12582912.0f; /* round(y / ln 2) */
    float r = y - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float q = 1.9875691500e-4f;
    q = q * r + 1.3981999507e-3f;
    q = q * r + 8.3334519073e-3f;
    q = q * r + 4.1665795894e-2f;
    q = q * r + 1.6666665459e-1f;
    q = q * r + 5.0000001201e-1f;
    q = q * r * r + r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23; /* 2^n, n in [-126, 0] */
    float sc;
    memcpy(&sc, &bits, sizeof sc);
    return x >= lo ? q * sc : x < lo ? 0.0f : x; /* NaN in, NaN out */
}

/* A device draw's mass of an id whose weight is w in [0, 1] (e^(s - max)):
   floor(w 2^44), exact in double (w's 24 bits shifted, then truncated).
   Masses are summed as integers, which no order of addition changes; a
   vocabulary of up to EMBER_DRAW_MAX_IDS ids sums to at most 2^63.
   Weights under 2^-44 (odds below 6e-14 against the likeliest id) have no
   mass. (Shifting w's
   significand by its exponent in integers gives the same value; on an
   H100 it measured no faster in the draws, bench/RESULTS.md.) */
EMBER_DRAW_FN uint64_t ember_draw_mass(float w) {
    return (uint64_t)((double)w * 17592186044416.0); /* 2^44 */
}

/* top_p's need over kept masses summing to M >= 1: ceil(top_p M), at least
   1 (top_p <= 0 or NaN: 1; above M: M + 1, which keeps everything). */
EMBER_DRAW_FN uint64_t ember_draw_need(float top_p, uint64_t M) {
    const double y = ceil((double)top_p * (double)M);
    return y > 1 ? (y < (double)M ? (uint64_t)y : M + 1) : 1;
}

/* The draw's point in kept masses summing to K >= 1: floor(u K) within
   [0, K - 1] (u outside [0, 1) or NaN clamped, never an undefined
   conversion). */
EMBER_DRAW_FN uint64_t ember_draw_point(double u, uint64_t K) {
    const double x = u * (double)K;
    const uint64_t t = x > 0 ? (x < (double)K ? (uint64_t)x : K - 1) : 0;
    return t < K ? t : K - 1;
}

#endif
