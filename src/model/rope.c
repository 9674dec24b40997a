/* rope.c - see rope.h. */
#include "rope.h"

#include <math.h>

#define EMBER_PI 3.14159265358979323846

static double yarn_mscale(double scale, double mscale) {
    return scale <= 1.0 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

static double yarn_corr_dim(double rotations, int dim, double base, int max_pos) {
    return (dim * log((double)max_pos / (rotations * 2.0 * EMBER_PI))) / (2.0 * log(base));
}

int ember_rope_freqs(const ember_rope_config *r, int head_dim, float *inv_freq, int *n_rot, float *attn_factor,
                     ember_error *err) {
    if (r->type == EMBER_ROPE_PROPORTIONAL) { /* gemma4 (config.h): every pair of the head, most at rest */
        int half = head_dim / 2, angles = (int)floor(r->partial_rotary_factor * head_dim / 2.0);
        if (head_dim < 2 || head_dim % 2 || angles < 1 || angles > half)
            return ember_err(err, EMBER_ERR_FORMAT, "rope: proportional RoPE with %d rotated pairs for head_dim %d",
                             angles, head_dim);
        for (int i = 0; i < half; i++)
            inv_freq[i] = i < angles ? 1.0f / powf((float)r->theta, (float)(2 * i) / (float)head_dim) / (float)r->factor
                                     : 0.0f; /* cos 1, sin 0: the dimension passes unchanged */
        *n_rot = head_dim;
        *attn_factor = 1.0f;
        return EMBER_OK;
    }
    int dim = (int)(head_dim * r->partial_rotary_factor);
    dim -= dim % 2;
    if (dim < 2 || dim > head_dim)
        return ember_err(err, EMBER_ERR_FORMAT, "rope: %d rotated dimensions for head_dim %d", dim, head_dim);
    int half = dim / 2;
    float base = (float)r->theta;
    *n_rot = dim;
    *attn_factor = 1.0f;
    for (int i = 0; i < half; i++) inv_freq[i] = 1.0f / powf(base, (float)(2 * i) / (float)dim);
    switch (r->type) {
    case EMBER_ROPE_DEFAULT:
    case EMBER_ROPE_PROPORTIONAL: break; /* handled above */
    case EMBER_ROPE_LINEAR:
        for (int i = 0; i < half; i++) inv_freq[i] = inv_freq[i] / (float)r->factor;
        break;
    case EMBER_ROPE_LLAMA3: {
        double old = r->original_max_pos;
        double low_wl = old / r->low_freq_factor, high_wl = old / r->high_freq_factor;
        for (int i = 0; i < half; i++) {
            double f = inv_freq[i], wl = 2.0 * EMBER_PI / f;
            if (wl > low_wl) {
                inv_freq[i] = (float)(f / r->factor);
            } else if (wl >= high_wl) { /* medium: blend */
                double smooth = (old / wl - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
                inv_freq[i] = (float)((1.0 - smooth) * f / r->factor + smooth * f);
            }
        }
        break;
    }
    case EMBER_ROPE_YARN: {
        double factor = r->factor;
        double af = r->attention_factor;
        if (af < 0) {
            if (r->mscale > 0 && r->mscale_all_dim > 0)
                af = yarn_mscale(factor, r->mscale) / yarn_mscale(factor, r->mscale_all_dim);
            else
                af = yarn_mscale(factor, 1.0);
        }
        double lo = yarn_corr_dim(r->beta_fast, dim, r->theta, r->original_max_pos);
        double hi = yarn_corr_dim(r->beta_slow, dim, r->theta, r->original_max_pos);
        if (r->truncate) {
            lo = floor(lo);
            hi = ceil(hi);
        }
        if (lo < 0) lo = 0;
        if (hi > dim - 1) hi = dim - 1;
        if (lo == hi) hi += 0.001;
        for (int i = 0; i < half; i++) {
            float pos_freq = powf(base, (float)(2 * i) / (float)dim);
            float extrap = 1.0f / pos_freq;
            float interp = (float)(1.0 / (factor * pos_freq));
            float ramp = (float)((i - lo) / (hi - lo));
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            float extrap_w = 1.0f - ramp;
            inv_freq[i] = interp * (1.0f - extrap_w) + extrap * extrap_w;
        }
        *attn_factor = (float)af;
        break;
    }
    }
    return EMBER_OK;
}
