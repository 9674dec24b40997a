/*
 * spec_taps.h - the per-slot bookkeeping shared by the hidden-tap draft
 * sources (spec_eagle3.c, spec_dflash.c): which target positions a slot's
 * draft cache row holds, and the taps the target delivered that the row
 * has not taken yet (pending until the history confirms them).
 *
 * A slot: base = the target position of the row's position 0 (< 0: the
 * row holds nothing), n_held = positions held, and pending taps for target
 * positions [p0, p0 + np) with the token fed at each. Ownership: the array
 * and its per-slot buffers belong to the source that made them
 * (tap_slots_new / tap_slots_free); the cache rows are the draft model's.
 * Threading: the engine thread.
 */
#ifndef EMBER_ENGINE_SPEC_TAPS_H
#define EMBER_ENGINE_SPEC_TAPS_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"
#include "kv/kv.h"

#define TAP_PEND_CAP (EMBER_MAX_DRAFT + 1) /* a verify window: the last token and its drafts */

typedef struct tap_slot {
    bool open;
    int base, n_held; /* base < 0: the draft row holds nothing */
    int p0, np;       /* pending taps: target positions [p0, p0 + np) */
    int32_t *ptok;    /* [TAP_PEND_CAP] the token fed at each */
    float *ptaps;     /* [TAP_PEND_CAP * W] */
} tap_slot;

/* n closed, empty slots for taps of W floats; NULL when out of memory.
   The caller frees with tap_slots_free. */
tap_slot *tap_slots_new(int n, int W);
void tap_slots_free(tap_slot *s, int n);

/* Empties slot e (cache row `row` of kv cleared) and starts it at target
   position base (-1: nothing). */
void tap_slot_reset(tap_slot *e, ember_kv *kv, int row, int base);

/* Trims the row back to the n_held positions made from taps (drafted
   positions go); false (and the slot reset to nothing) if the cache
   refused. */
bool tap_slot_trim(tap_slot *e, ember_kv *kv, int row);

/* Before taps for target position t are pushed: where t is not the next
   pending position, a position fed again rolls the slot back to t (held
   part and pending), one inside the pending drops the pending from t, and
   a gap (a prefix from the prefix cache) starts the slot afresh at t. */
void tap_slot_place(tap_slot *e, ember_kv *kv, int row, int t);

/* Appends the token and taps (W floats) of the next pending position; the
   caller has made room (np < TAP_PEND_CAP). */
void tap_slot_push(tap_slot *e, int32_t tok, const float *taps, int W);

#endif
