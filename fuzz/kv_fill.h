/*
 * kv_fill.h - fills row 1 of a fuzz target's KV cache with deterministic
 * values (the seed corpora of fuzz_kv_codec and fuzz_prompt_file). The
 * including file defines g_be, k_heads and k_dims (two layers).
 */
#ifndef EMBER_FUZZ_KV_FILL_H
#define EMBER_FUZZ_KV_FILL_H

/* Fills row 1 of kv with n positions of deterministic values. */
static void fill(ember_kv *kv, int n) {
    uint64_t s = 12345;
    ember_error err;
    for (int at = 0; at < n;) {
        int k = n - at < 16 ? n - at : 16;
        if (k > ember_kv_max_append(kv, 1)) k = ember_kv_max_append(kv, 1);
        int32_t row[16], pos[16];
        for (int i = 0; i < k; i++) row[i] = 1, pos[i] = at + i;
        if (ember_kv_begin(kv, row, pos, k, &err)) abort();
        for (int l = 0; l < 2; l++) {
            ember_buffer *kb, *vb;
            ember_tensor kt, vt;
            const int64_t shape[3] = {k, k_heads[l], k_dims[l]};
            if (ember_tensor_alloc(g_be, &kt, &kb, EMBER_F32, 3, shape, &err) ||
                ember_tensor_alloc(g_be, &vt, &vb, EMBER_F32, 3, shape, &err))
                abort();
            float buf[16 * 32];
            for (int i = 0; i < k * k_heads[l] * k_dims[l]; i++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                buf[i] = (float)((int64_t)(s >> 40) - (1 << 23)) / (1 << 21);
            }
            g_be->ops->write(g_be, &kt, 0, buf, kt.nbytes, &err);
            g_be->ops->write(g_be, &vt, 0, buf, vt.nbytes, &err);
            ember_kv_layer views[2];
            ember_kv_map map;
            ember_kv_map_for(kv, l, row, pos, views, &map);
            if (g_be->ops->kv_write(g_be, &map, &kt, &vt, &err)) abort();
            ember_buffer_free(kb);
            ember_buffer_free(vb);
        }
        ember_kv_end(kv, true);
        at += k;
    }
}

#endif
