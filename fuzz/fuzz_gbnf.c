/*
 * fuzz_gbnf.c - libFuzzer target: a grammar from the input (first byte 'r':
 * the rest is a regular expression, as guided_regex takes it; anything
 * else: the rest is GBNF text), compiled; when it compiles, a walk of up to
 * 24 tokens over a small vocabulary (every byte, some multi-byte pieces,
 * an end id) under a token budget: every token the mask allows must be
 * taken by accept from the same state (the mask never lets through what
 * the grammar refuses), and a refused compile must say why.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sample/grammar.h"

static const char *const k_pieces[] = {"{\"", "\":", "ab", "true", "null", "12", "\xc3\xa9", "\xe2\x82\xac", "hi ", NULL};

static ember_gvocab *vocab(int *n_out) {
    static ember_gvocab *v;
    static int n;
    if (v) {
        *n_out = n;
        return v;
    }
    char *bytes[300];
    size_t lens[300];
    bool end[300];
    memset(end, 0, sizeof end);
    for (int b = 1; b < 256; b++) {
        bytes[n] = malloc(1);
        bytes[n][0] = (char)b;
        lens[n++] = 1;
    }
    for (int i = 0; k_pieces[i]; i++) {
        bytes[n] = strdup(k_pieces[i]);
        lens[n++] = strlen(k_pieces[i]);
    }
    bytes[n] = NULL;
    lens[n] = 0;
    end[n++] = true;
    ember_error err;
    if (ember_gvocab_new(n, (const char *const *)bytes, lens, end, &v, &err)) abort();
    for (int i = 0; i < n; i++) free(bytes[i]);
    *n_out = n;
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 65536) return 0;
    int n;
    ember_gvocab *gv = vocab(&n);
    char *text = malloc(size);
    memcpy(text, data + 1, size - 1);
    text[size - 1] = 0;
    ember_grammar *g = ember_grammar_new();
    ember_error err;
    memset(&err, 0, sizeof err);
    int rc = data[0] == 'r' ? ember_grammar_regex(g, text, "guided_regex", &err)
                            : ember_grammar_gbnf(g, text, size - 1, &err);
    if (rc && !err.msg[0]) abort(); /* a refusal always says why */
    ember_gmatch *m = NULL;
    if (!rc && ember_gmatch_new(g, gv, &m, &err) == 0) {
        float lg[300];
        for (int s = 0; s < 24; s++) {
            for (int i = 0; i < n; i++) lg[i] = (float)((i * 7919 + s * 104729) % 1000);
            if (ember_gmatch_mask_left(m, lg, n, 24 - s) < 1) abort();
            int best = -1;
            for (int i = 0; i < n; i++)
                if (lg[i] != -INFINITY && (best < 0 || lg[i] > lg[best])) best = i;
            if (best < 0) abort();
            if (best == n - 1) break; /* the end */
            if (!ember_gmatch_accept(m, best)) abort(); /* the mask allowed what accept refuses */
        }
        ember_gmatch_free(m);
    }
    ember_grammar_free(g);
    free(text);
    return 0;
}
