/* kv_type.c - parsing and naming KV kinds; see kv.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv.h"

int ember_kv_type_parse(const char *name, int group, int quant_start, ember_kv_type *out, ember_error *err) {
    memset(out, 0, sizeof *out);
    if (!name || !*name) name = "f32";
    ember_kv_type t = {.group = group ? group : 64, .quant_start = quant_start};
    if (!strcmp(name, "f32")) {
        t.k_enc = t.v_enc = EMBER_KVE_F32;
    } else if (!strcmp(name, "f16")) {
        t.k_enc = t.v_enc = EMBER_KVE_F16;
    } else if (!strcmp(name, "bf16")) {
        t.k_enc = t.v_enc = EMBER_KVE_BF16;
    } else if (!strcmp(name, "q8")) {
        t.k_enc = t.v_enc = EMBER_KVE_Q8;
    } else if (!strcmp(name, "q4")) {
        t.k_enc = t.v_enc = EMBER_KVE_Q4;
    } else if (!strncmp(name, "tq-k", 4)) {
        char *end;
        long kb = strtol(name + 4, &end, 10);
        long vb = -1;
        if (end != name + 4 && *end == 'v') {
            char *e2;
            vb = strtol(end + 1, &e2, 10);
            if (e2 == end + 1 || *e2) vb = -1;
        }
        if (kb < 2 || kb > 8 || vb < 2 || vb > 8)
            return ember_err(err, EMBER_ERR_INVALID_ARG,
                             "unknown KV cache type '%s': rotation-based kinds are tq-kKvV with K and V bits in 2..8",
                             name);
        t.k_enc = t.v_enc = EMBER_KVE_TQ;
        t.k_bits = (int)kb;
        t.v_bits = (int)vb;
    } else {
        return ember_err(err, EMBER_ERR_INVALID_ARG, "unknown KV cache type '%s' (%s)", name, EMBER_KV_TYPES);
    }
    if (t.k_enc == EMBER_KVE_Q8 || t.k_enc == EMBER_KVE_Q4) {
        if (t.group != 32 && t.group != 64 && t.group != 128)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "KV group size must be 32, 64 or 128, got %d", group);
    } else if (group) {
        return ember_err(err, EMBER_ERR_INVALID_ARG, "a KV group size only applies to the affine kinds q8 and q4");
    }
    if (quant_start < 0)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "the KV quantization offset must not be negative, got %d",
                         quant_start);
    if (quant_start > 0 && t.k_enc <= EMBER_KVE_BF16)
        return ember_err(err, EMBER_ERR_INVALID_ARG,
                         "a KV quantization offset needs a quantized kind (q8, q4, tq-...), not '%s'", name);
    if (quant_start > 0 && quant_start < EMBER_KV_BLOCK)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "the KV quantization offset must be at least %d, got %d",
                         EMBER_KV_BLOCK, quant_start);
    /* Quantized kinds keep a row's first block f32 until it is complete,
       then quantize it with its own channel statistics (kv.h). */
    if (t.k_enc > EMBER_KVE_BF16 && quant_start == 0) {
        t.quant_start = EMBER_KV_BLOCK;
        t.implicit_start = true;
    }
    snprintf(t.name, sizeof t.name, "%s", name);
    *out = t;
    return EMBER_OK;
}

void ember_kv_type_describe(const ember_kv_type *t, char *buf, size_t n) {
    int k = 0;
    if (t->k_enc == EMBER_KVE_Q8 || t->k_enc == EMBER_KVE_Q4)
        k = snprintf(buf, n, "%s (group %d)", t->name, t->group);
    else
        k = snprintf(buf, n, "%s", t->name);
    if (t->quant_start > 0 && !t->implicit_start && k >= 0 && (size_t)k < n)
        snprintf(buf + k, n - (size_t)k, ", f32 below position %d", t->quant_start);
}
