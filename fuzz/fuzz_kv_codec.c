/*
 * fuzz_kv_codec.c - libFuzzer entry point for the KV row codec
 * (ember_kv_row_load).
 *
 * The first input byte picks one of four small caches (dense f32; q4 with
 * its first-block conversion; tq-k4v3; q8 converting at 32 with a rotating
 * layer). Bit 7 of that byte set: the CRC at the end of the rest is
 * recomputed first, so the fuzzer reaches the checks behind the checksum.
 * Any input must load or fail with one clean line, leaving the row empty.
 * A blob that loads must decode at every position it holds, run through
 * attention, and save back to the very same bytes.
 *
 * With EMBER_FUZZ_KV_SEEDS=DIR set, the first call writes one valid blob per
 * cache into DIR (the seed corpus) and returns.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/kv_codec.h"
#include "kv/kv.h"
#include "kv/kv_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define N_CACHES 4
static ember_backend *g_be;
static ember_kv *g_kv[N_CACHES];

static const int k_heads[2] = {2, 1}, k_dims[2] = {16, 8}, k_win[2] = {0, 24};

static void setup(void) {
    if (g_be) return;
    ember_error err;
    ember_cpu_params cp = {1, EMBER_ISA_AUTO, false, {0}};
    if (ember_backend_cpu_new(&cp, &g_be, &err)) abort();
    static const struct {
        const char *kind;
        int qs;
    } kinds[N_CACHES] = {{"f32", 0}, {"q4", 0}, {"tq-k4v3", 0}, {"q8", 32}};
    for (int i = 0; i < N_CACHES; i++) {
        ember_kv_type t;
        if (ember_kv_type_parse(kinds[i].kind, 0, kinds[i].qs, &t, &err)) abort();
        ember_kv_params p = {t, 2, k_heads, k_dims, k_win, 2, 128, 0, 8, 16, NULL, {0}};
        if (ember_kv_new(g_be, &p, &g_kv[i], &err)) abort();
    }
}

#include "kv_fill.h"

static uint32_t crc32_ieee(const uint8_t *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1)));
    }
    return c ^ 0xffffffffu;
}

static void write_seeds(const char *dir) {
    for (int i = 0; i < N_CACHES; i++) {
        fill(g_kv[i], 40 + 13 * i);
        void *blob;
        size_t n;
        ember_error err;
        if (ember_kv_row_save(g_kv[i], 1, &blob, &n, &err)) abort();
        char path[4096];
        snprintf(path, sizeof path, "%s/seed%d.bin", dir, i);
        FILE *fp = fopen(path, "wb");
        if (fp) {
            fputc(i, fp);
            fwrite(blob, 1, n, fp);
            fclose(fp);
        }
        free(blob);
        ember_kv_clear(g_kv[i], 1);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setup();
    static int seeded;
    if (!seeded) {
        seeded = 1;
        const char *dir = getenv("EMBER_FUZZ_KV_SEEDS");
        if (dir) {
            write_seeds(dir);
            return 0;
        }
    }
    if (size < 1) return 0;
    ember_kv *kv = g_kv[(data[0] & 0x7f) % N_CACHES];
    size_t n = size - 1;
    uint8_t *blob = malloc(n ? n : 1);
    if (!blob) return 0;
    memcpy(blob, data + 1, n);
    if ((data[0] & 0x80) && n >= 4) {
        uint32_t c = crc32_ieee(blob, n - 4);
        blob[n - 4] = (uint8_t)c;
        blob[n - 3] = (uint8_t)(c >> 8);
        blob[n - 2] = (uint8_t)(c >> 16);
        blob[n - 1] = (uint8_t)(c >> 24);
    }
    ember_error err;
    int rc = ember_kv_row_load(kv, 0, blob, n, &err);
    if (rc) {
        if (strchr(err.msg, '\n') || !err.msg[0] || ember_kv_len(kv, 0) != 0) abort();
        free(blob);
        return 0;
    }
    int len = ember_kv_len(kv, 0);
    float k[64], v[64];
    for (int l = 0; l < 2; l++)
        for (int p = 0; p < len; p++) {
            int r = ember_kv_read_pos(kv, 0, l, p, k, v, &err);
            if (r && p >= ember_kv_min_reuse(kv, 0)) abort(); /* what a row must hold is there */
        }
    if (len > 0) { /* attention of one query at the last position, every layer */
        int32_t row = 0, pos = len - 1;
        for (int l = 0; l < 2; l++) {
            int g = kv->layer_group[l];
            kv_tab *t = kv_tab_of(kv, g, 0);
            kv->refs[(size_t)g * (size_t)kv->n_rows] =
                (ember_kv_rowref){t->blk, t->first, t->n, kv->rows[0].converted ? 1 : 0};
            ember_kv_layer views[2];
            ember_kv_map map;
            ember_kv_map_for(kv, l, &row, &pos, views, &map);
            ember_buffer *qb, *ob;
            ember_tensor qt, ot;
            const int64_t shape[3] = {1, 2 * k_heads[l], k_dims[l]};
            if (ember_tensor_alloc(g_be, &qt, &qb, EMBER_F32, 3, shape, &err) ||
                ember_tensor_alloc(g_be, &ot, &ob, EMBER_F32, 3, shape, &err))
                abort();
            ember_attn a = {0.25f, k_win[l], 0};
            /* may refuse (a row trimmed to its minimum no longer holds the
               last position's whole window), must not crash */
            (void)g_be->ops->attention(g_be, &ot, &qt, &map, &a, &err);
            ember_buffer_free(qb);
            ember_buffer_free(ob);
        }
    }
    void *again;
    size_t m;
    if (ember_kv_row_save(kv, 0, &again, &m, &err)) abort();
    if (m != n || memcmp(again, blob, n)) abort(); /* the format is canonical */
    free(again);
    ember_kv_clear(kv, 0);
    if (ember_kv_used_bytes(kv) != 0) abort();
    free(blob);
    return 0;
}
