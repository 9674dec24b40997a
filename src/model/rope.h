/*
 * rope.h - rotary position embedding frequencies for each scaling kind,
 * computed the way transformers computes them (float32 base frequencies,
 * then the kind's adjustment).
 */
#ifndef EMBER_MODEL_ROPE_H
#define EMBER_MODEL_ROPE_H

#include "formats/config.h"

/* Fills inv_freq[n_rot / 2] (caller-allocated, head_dim / 2 floats suffice),
   *n_rot (rotated dims per head) and *attn_factor (scale on cos and sin). */
int ember_rope_freqs(const ember_rope_config *r, int head_dim, float *inv_freq, int *n_rot,
                     float *attn_factor, ember_error *err);

#endif
