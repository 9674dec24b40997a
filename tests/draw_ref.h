/*
 * draw_ref.h - the device draw (core/draw_def.h: ember_draw) written the plain
 * way, for tests: sort the usable ids by weight, walk the chain over the
 * sorted list. Shares nothing with a backend's kernel but draw_def.h (the
 * weights and masses), so a backend's sample_rows that gives these tokens
 * bit for bit implements the definition, not a copy of its own steps.
 *
 * draw_ref(x, V, p, scratch): the token for one row x[0, V) with p.
 * scratch: draw_ref_scratch(V) from malloc, freed by the caller.
 */
#ifndef EMBER_TESTS_DRAW_REF_H
#define EMBER_TESTS_DRAW_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "core/draw_def.h"

typedef struct draw_ref_el {
    float w;
    int32_t id;
} draw_ref_el;

static size_t draw_ref_scratch(int V) {
    return (size_t)V * sizeof(draw_ref_el);
}

static int draw_ref_cmp(const void *a, const void *b) {
    const draw_ref_el *x = a, *y = b;
    if (x->w != y->w) return x->w > y->w ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int draw_ref_cmp_id(const void *a, const void *b) {
    const draw_ref_el *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int32_t draw_ref_argmax(const float *x, int V) {
    float mx = -INFINITY;
    int any = 0;
    for (int i = 0; i < V; i++)
        if (x[i] == x[i]) {
            mx = any && !(x[i] > mx) ? mx : x[i];
            any = 1;
        }
    for (int i = 0; any && i < V; i++)
        if (x[i] == mx) return i;
    return 0;
}

static int32_t draw_ref(const float *x, int V, const ember_draw *p, void *scratch) {
    draw_ref_el *e = scratch;
    if (!(p->temperature > 0)) return draw_ref_argmax(x, V);
    const float T = p->temperature;
    float mx = -INFINITY;
    int n = 0;
    for (int i = 0; i < V; i++)
        if (x[i] == x[i] && x[i] != -INFINITY) {
            float s = x[i] / T;
            mx = s > mx ? s : mx;
            n++;
        }
    if (n == 0) return draw_ref_argmax(x, V);
    n = 0;
    for (int i = 0; i < V; i++)
        if (x[i] == x[i] && x[i] != -INFINITY) {
            float s = x[i] / T;
            e[n++] = (draw_ref_el){isinf(mx) ? (s == mx ? 1.0f : 0.0f) : ember_exp_nonpos(s - mx), i};
        }
    qsort(e, (size_t)n, sizeof *e, draw_ref_cmp);
    const int k_on = p->top_k > 0 && p->top_k < n;
    if (k_on) n = p->top_k;
    if (p->top_p < 1.0f) {
        uint64_t M = 0;
        for (int j = 0; j < n; j++) M += ember_draw_mass(e[j].w);
        const uint64_t need = ember_draw_need(p->top_p, M);
        uint64_t cum = 0;
        if (need < M)
            for (int j = 0; j < n; j++) {
                cum += ember_draw_mass(e[j].w);
                if (cum >= need) {
                    n = j + 1;
                    break;
                }
            }
    }
    const float minw = p->min_p > 0 ? p->min_p : 0.0f;
    int m = 0;
    for (int j = 0; j < n; j++)
        if (e[j].w >= minw) e[m++] = e[j];
    n = m;
    uint64_t K = 0;
    for (int j = 0; j < n; j++) K += ember_draw_mass(e[j].w);
    const uint64_t t = ember_draw_point(p->u, K);
    uint64_t cum = 0;
    if (!k_on) qsort(e, (size_t)n, sizeof *e, draw_ref_cmp_id); /* walked by id */
    for (int j = 0; j < n; j++) {
        cum += ember_draw_mass(e[j].w);
        if (t < cum) return e[j].id;
    }
    return -1; /* not reached: K > t */
}

#endif
