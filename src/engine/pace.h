/*
 * pace.h - step pacing's cost model (sched.c, engine param prefill_pace):
 * what a step costs as a function of the tokens in it, fitted to the steps
 * the engine has run, and the prompt tokens a step may take beside decoding
 * rows so that it lasts about pace times a step of those rows alone.
 *
 * The model: a step of n tokens takes T(n) = f + c * n seconds (f: what a
 * step costs whatever its size, e.g. reading the weights once; c: one
 * token's share). Decode and prompt tokens cost alike to this model: each
 * is one row of every product. It is fitted by least squares over the
 * steps (those with drafts are left out by the caller), each step's weight
 * decaying by PACE_DECAY per later step, so the fit follows a machine whose
 * speed moves.
 *
 * Why a fit and not two means (what sched.c had before, 2026-12-05): a mean
 * of decode-only steps mixes steps of different row counts, and a prompt
 * token's cost measured against it came out low whenever a mixed step had
 * fewer decoding rows than that mean's steps; on the 2-core VM 78 of 141
 * paced steps took 17-26 prompt tokens where the floor of 16 was the right
 * budget (bench/RESULTS.md, "Step pacing: a fitted cost").
 *
 * Pure arithmetic on the caller's struct; no state of its own, no I/O.
 */
#ifndef EMBER_PACE_H
#define EMBER_PACE_H

#include <stdbool.h>

#define PACE_DECAY (1.0 / 16.0) /* a step's weight falls by this share per later step */
#define PACE_MIN_VAR 1.0        /* token counts must vary (tokens^2) before the slope is trusted */
#define PACE_MIN 16             /* prompt tokens a paced step takes at least (see sched.c) */
#define PACE_FIRST 64           /* prompt tokens a step takes while the fit is not ready */

/* Exponentially weighted sums of steps: weight, tokens, seconds, and the
   products; and the slope last seen (0: none yet). All zero: no step yet. */
typedef struct pace_fit {
    double w, x, y, xx, xy;
    double c; /* seconds a token, from the last steps whose sizes varied enough */
} pace_fit;

/* Folds one step of n tokens that took dt seconds into the fit; where the
   steps' sizes vary (PACE_MIN_VAR) and cost grows with them, their slope
   becomes the one the fit keeps. Steps all of one size (decode alone, no
   prompts arriving) leave the slope as it was and move only the level. */
static inline void pace_fit_add(pace_fit *p, int n, double dt) {
    const double k = 1.0 - PACE_DECAY, x = (double)n;
    p->w = k * p->w + 1.0;
    p->x = k * p->x + x;
    p->y = k * p->y + dt;
    p->xx = k * p->xx + x * x;
    p->xy = k * p->xy + x * dt;
    const double mx = p->x / p->w, my = p->y / p->w;
    const double var = p->xx / p->w - mx * mx, cov = p->xy / p->w - mx * my;
    if (var >= PACE_MIN_VAR && cov > 0) p->c = cov / var;
}

/* The line: f (seconds a step) and c (seconds a token) into *f, *c, the
   kept slope through the steps' weighted mean. Returns false, leaving them
   alone, until a slope was seen. f is at least 0 (a negative intercept is
   noise: the line is then taken through 0 and the mean). */
static inline bool pace_fit_get(const pace_fit *p, double *f, double *c) {
    if (!(p->c > 0) || p->w <= 0) return false;
    const double mx = p->x / p->w, my = p->y / p->w;
    double slope = p->c, icpt = my - slope * mx;
    if (icpt < 0) {
        icpt = 0;
        slope = my / mx;
    }
    *f = icpt;
    *c = slope;
    return true;
}

/* Prompt tokens a step may take beside n_dec decoding rows: as many as keep
   T(n_dec + k) within pace * T(n_dec), i.e. k = (pace - 1) * (f / c +
   n_dec), within [PACE_MIN, chunk]; PACE_FIRST (within chunk) while the fit
   is not ready; pace < 0: chunk (no cap). */
static inline int pace_budget(const pace_fit *p, double pace, int n_dec, int chunk) {
    if (pace < 0) return chunk;
    double f, c;
    int b;
    if (!pace_fit_get(p, &f, &c))
        b = PACE_FIRST;
    else {
        double k = (pace - 1.0) * (f / c + (double)n_dec);
        b = k >= (double)chunk ? chunk : (int)k;
        if (b < PACE_MIN) b = PACE_MIN;
    }
    return b < chunk ? b : chunk;
}

#endif
