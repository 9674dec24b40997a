/*
 * kv_rows.h - rows of a test KV cache filled from tokens (test_kv_prefix,
 * test_kv_disk): the K and V of a position are a function of (token,
 * position, layer) only, as a model's are of the tokens up to it. The
 * including file defines LAYERS, HEADS, HD and g_be.
 */
#ifndef EMBER_TEST_KV_ROWS_H
#define EMBER_TEST_KV_ROWS_H

static void values(int32_t tok, int pos, int l, float *k, float *v) {
    for (int i = 0; i < HEADS * HD; i++) {
        k[i] = sinf((float)tok * 0.37f + (float)i * 0.11f + (float)l + (float)pos * 0.013f) * (i % 7 == 0 ? 4.0f : 1.0f);
        v[i] = cosf((float)tok * 0.23f - (float)i * 0.07f + (float)l * 0.5f + (float)pos * 0.029f);
    }
}

/* Appends tokens[from..to) to row r in chunks of at most 24 (stopping at a
   conversion offset as the engine does). */
static void feed(ember_kv *kv, int r, const int32_t *tokens, int from, int to) {
    ember_error err = {0};
    while (from < to) {
        int n = to - from;
        if (n > 24) n = 24;
        int lim = ember_kv_max_append(kv, r);
        if (n > lim) n = lim;
        int32_t row[24], pos[24];
        for (int i = 0; i < n; i++) row[i] = r, pos[i] = from + i;
        int rc = ember_kv_begin(kv, row, pos, n, &err);
        CHECKF(rc == EMBER_OK, "begin: %s", err.msg);
        if (rc) return;
        for (int l = 0; l < LAYERS; l++) {
            ember_buffer *kb, *vb;
            ember_tensor kt, vt;
            const int64_t shape[3] = {n, HEADS, HD};
            CHECK(ember_tensor_alloc(g_be, &kt, &kb, EMBER_F32, 3, shape, &err) == EMBER_OK);
            CHECK(ember_tensor_alloc(g_be, &vt, &vb, EMBER_F32, 3, shape, &err) == EMBER_OK);
            float tk[24 * HEADS * HD], tv[24 * HEADS * HD];
            for (int i = 0; i < n; i++) values(tokens[from + i], from + i, l, tk + i * HEADS * HD, tv + i * HEADS * HD);
            g_be->ops->write(g_be, &kt, 0, tk, sizeof(float) * (size_t)n * HEADS * HD, &err);
            g_be->ops->write(g_be, &vt, 0, tv, sizeof(float) * (size_t)n * HEADS * HD, &err);
            ember_kv_layer views[2];
            ember_kv_map map;
            ember_kv_map_for(kv, l, row, pos, views, &map);
            CHECK(g_be->ops->kv_write(g_be, &map, &kt, &vt, &err) == EMBER_OK);
            ember_buffer_free(kb);
            ember_buffer_free(vb);
        }
        ember_kv_end(kv, true);
        from += n;
    }
}

/* Rows a and b have one length and the same bits at every position both
   hold (a rotating group drops old ones); at least one such position. */
static bool same_held(ember_kv *kv, int a, int b) {
    if (ember_kv_len(kv, a) != ember_kv_len(kv, b)) return false;
    ember_error err = {0};
    int both = 0;
    for (int p = 0; p < ember_kv_len(kv, a); p++)
        for (int l = 0; l < LAYERS; l++) {
            float ka[HEADS * HD], va[HEADS * HD], kb[HEADS * HD], vb[HEADS * HD];
            int ra = ember_kv_read_pos(kv, a, l, p, ka, va, &err), rb = ember_kv_read_pos(kv, b, l, p, kb, vb, &err);
            if ((ra == EMBER_OK) != (rb == EMBER_OK)) return false;
            if (ra) continue;
            both++;
            if (memcmp(ka, kb, sizeof ka) || memcmp(va, vb, sizeof va)) return false;
        }
    return both > 0;
}

#endif
