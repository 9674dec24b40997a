/*
 * sampler.h - turning a row of logits into a token.
 *
 * The chain, in the order transformers applies it: temperature, top-k,
 * top-p, min-p, then a draw from the renormalised distribution with the
 * row's own seeded generator. Temperature 0 is greedy (argmax, lowest id on
 * ties). The same seed and logits give the same tokens on every run.
 * Speculative decoding verifies draft tokens through the same chain
 * (ember_sampler_sample_draft: greedy match, or rejection sampling).
 *
 * Ownership: a sampler owns its scratch (about 20 bytes a vocabulary id,
 * allocated by the first configuration with a temperature: a greedy row
 * has none) and its RNG state; one sampler per row.
 */
#ifndef EMBER_SAMPLE_SAMPLER_H
#define EMBER_SAMPLE_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "core/draw_def.h"
#include "core/error.h"

typedef struct ember_rng {
    uint64_t s[4];
} ember_rng;

/* xoshiro256** seeded through splitmix64. */
void ember_rng_seed(ember_rng *r, uint64_t seed);
uint64_t ember_rng_next(ember_rng *r);
/* Uniform in [0, 1) with 53 random bits. */
double ember_rng_uniform(ember_rng *r);

typedef struct ember_sampler ember_sampler;

/* Validates p (temperature >= 0 and finite, top_p in (0, 1], min_p in
   [0, 1], top_k >= 0) and allocates a sampler for vocab entries. */
int ember_sampler_new(const ember_sampling *p, int vocab, ember_sampler **out, ember_error *err);
void ember_sampler_free(ember_sampler *s);

/* Whether the sampler's passes over the vocabulary use their AVX2 copy
   (the default where the CPU has AVX2; on is ignored where it has not).
   Both copies give the same bits: for tests that check it. */
void ember_sampler_use_avx2(ember_sampler *s, bool on);

/* For tests: the unnormalised masses of the last draw over the whole
   vocabulary (0 where an id was dropped) when it was built densely; NULL
   when it was not (top_k, infinite logits, greedy) or nothing was drawn
   yet. Owned by the sampler, valid until its next call. */
const float *ember_sampler_dense(const ember_sampler *s);

/* Re-validates and applies new parameters (and reseeds), keeping the
   scratch (and making it with the first temperature above 0: out of memory
   is EMBER_ERR_NOMEM): how one sampler serves successive requests on a row.
   On error the sampler is unchanged. */
int ember_sampler_configure(ember_sampler *s, const ember_sampling *p, ember_error *err);

/* The next token for one row of logits (vocab floats). NaN logits never win. */
int32_t ember_sampler_sample(ember_sampler *s, const float *logits);

/* Speculative verification of one draft token against the same chain:
   the returned token is distributed exactly as ember_sampler_sample's
   (the target distribution p after temperature / top-k / top-p / min-p).
   Greedy (temperature 0): the argmax, whatever the draft. Sampled: the
   draft (a deterministic, one-hot proposal) is accepted with probability
   p(draft); otherwise the token is drawn from p with the draft removed and
   renormalised (p itself when that leaves nothing). draft < 0: a plain
   draw. The caller compares the result with the draft to learn whether it
   was accepted. Uses one or two uniforms of the row's generator. */
int32_t ember_sampler_sample_draft(ember_sampler *s, const float *logits, int32_t draft);

/* A device draw of this row made elsewhere (a backend's sample_rows,
   core/draw_def.h): the sampler's parameters and, with a temperature, the
   next uniform of its generator, taken in place of the one
   ember_sampler_sample would take, so the row's stream of uniforms is the
   same either way (u 0 and no uniform taken when greedy). */
ember_draw ember_sampler_draw(ember_sampler *s);

/* log(sum of e^x[i]) over x[0, n), n >= 1: the normaliser of log-softmax.
   The largest value when it is infinite (NaN values skipped there, as
   ember_argmax skips them; -inf when all are -inf or NaN); NaN when any
   value is NaN and the largest is finite. Within a few 1e-7 of the exact
   value (the exponentials are the sampler's float polynomial, summed in
   double); the same bits on every machine. Thread-safe. */
double ember_log_sum_exp(const float *x, int n);

/* Index of the largest finite-or-infinite non-NaN value (lowest on ties); 0 if none. */
int32_t ember_argmax(const float *x, int n);

#endif
