/*
 * spec_taps.c - per-slot bookkeeping of the hidden-tap draft sources (see
 * spec_taps.h for the model and the ownership).
 */
#include "spec_taps.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

tap_slot *tap_slots_new(int n, int W) {
    tap_slot *s = ember_calloc((size_t)n, sizeof *s);
    if (!s) return NULL;
    for (int i = 0; i < n; i++) {
        s[i].base = s[i].p0 = -1;
        s[i].ptok = ember_malloc(TAP_PEND_CAP * sizeof(int32_t));
        s[i].ptaps = ember_malloc((size_t)TAP_PEND_CAP * (size_t)W * sizeof(float));
        if (!s[i].ptok || !s[i].ptaps) {
            tap_slots_free(s, i + 1);
            return NULL;
        }
    }
    return s;
}

void tap_slots_free(tap_slot *s, int n) {
    for (int i = 0; s && i < n; i++) {
        free(s[i].ptok);
        free(s[i].ptaps);
    }
    free(s);
}

void tap_slot_reset(tap_slot *e, ember_kv *kv, int row, int base) {
    ember_kv_clear(kv, row);
    e->base = base;
    e->n_held = 0;
    e->p0 = base;
    e->np = 0;
}

bool tap_slot_trim(tap_slot *e, ember_kv *kv, int row) {
    if (ember_kv_len(kv, row) <= e->n_held) return true;
    if (ember_kv_trim(kv, row, e->n_held, NULL) == EMBER_OK) return true;
    tap_slot_reset(e, kv, row, -1);
    return false;
}

void tap_slot_place(tap_slot *e, ember_kv *kv, int row, int t) {
    if (e->base >= 0 && t == e->p0 + e->np) return;
    if (e->base >= 0 && t >= e->base && t <= e->base + e->n_held) { /* fed again: back to t */
        e->n_held = t - e->base;
        e->p0 = t;
        e->np = 0;
        if (!tap_slot_trim(e, kv, row)) tap_slot_reset(e, kv, row, t);
    } else if (e->base >= 0 && t > e->base + e->n_held && t <= e->p0 + e->np) {
        e->np = t - e->p0; /* inside the pending: the rest is fed again */
    } else {
        tap_slot_reset(e, kv, row, t); /* a gap: afresh from here */
    }
}

void tap_slot_push(tap_slot *e, int32_t tok, const float *taps, int W) {
    e->ptok[e->np] = tok;
    memcpy(e->ptaps + (size_t)e->np * (size_t)W, taps, (size_t)W * sizeof(float));
    e->np++;
}
