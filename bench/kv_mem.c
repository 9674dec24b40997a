/*
 * kv_mem.c - memory per token of each KV kind, measured: a cache of
 * Qwen2.5-0.5B's KV shape (24 layers, 2 KV heads of 64) is filled with
 * ROWS rows of LEN positions each, and the growth of the process's resident
 * memory (/proc/self/statm) is divided by the positions held. Printed beside
 * the kind's predicted bytes per token (ember_kv_bytes_per_token) and the
 * bytes of blocks the cache accounts for.
 *
 * usage: kv_mem [ROWS] [LEN] [KIND ...]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "kv/kv.h"

enum { LAYERS = 24, HKV = 2, D = 64 };

static long rss_bytes(void) {
    FILE *fp = fopen("/proc/self/statm", "r");
    long size = 0, res = 0;
    if (fp) {
        if (fscanf(fp, "%ld %ld", &size, &res) != 2) res = 0;
        fclose(fp);
    }
    return res * sysconf(_SC_PAGESIZE);
}

int main(int argc, char **argv) {
    int rows = argc > 1 ? atoi(argv[1]) : 8, len = argc > 2 ? atoi(argv[2]) : 4096;
    static const char *const all[] = {"f32", "f16", "bf16", "q8", "q4", "tq-k8v4", "tq-k4v3"};
    const char *const *kinds = argc > 3 ? (const char *const *)argv + 3 : all;
    int n_kinds = argc > 3 ? argc - 3 : (int)(sizeof all / sizeof all[0]);
    ember_backend *be;
    ember_error err = {0};
    ember_cpu_params cp = {1, EMBER_ISA_AUTO, false, {0}};
    if (ember_backend_cpu_new(&cp, &be, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
    /* the K/V source: one chunk of values, written at every position */
    enum { CH = 256 };
    ember_buffer *kb, *vb;
    ember_tensor kt, vt;
    const int64_t shape[3] = {CH, HKV, D};
    ember_tensor_alloc(be, &kt, &kb, EMBER_F32, 3, shape, &err);
    ember_tensor_alloc(be, &vt, &vb, EMBER_F32, 3, shape, &err);
    float *buf = malloc(sizeof(float) * CH * HKV * D);
    for (int i = 0; i < CH * HKV * D; i++) buf[i] = (float)((i * 7919) % 2001 - 1000) / 250.0f;
    be->ops->write(be, &kt, 0, buf, kt.nbytes, &err);
    be->ops->write(be, &vt, 0, buf, vt.nbytes, &err);
    printf("| kind | positions | predicted bytes/token | measured (RSS) bytes/token | ratio | accounted bytes/token |\n");
    printf("|---|---|---|---|---|---|\n");
    int heads[LAYERS], dims[LAYERS], win[LAYERS];
    for (int l = 0; l < LAYERS; l++) heads[l] = HKV, dims[l] = D, win[l] = 0;
    for (int k = 0; k < n_kinds; k++) {
        ember_kv_type t;
        if (ember_kv_type_parse(kinds[k], 0, 0, &t, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
        ember_kv_params p = {t, LAYERS, heads, dims, win, rows, len, 0, 0, CH, NULL, {0}};
        ember_kv *kv;
        if (ember_kv_new(be, &p, &kv, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
        long before = rss_bytes();
        int32_t row[CH], pos[CH];
        for (int r = 0; r < rows; r++)
            for (int at = 0, n; at < len; at += n) {
                n = len - at < CH ? len - at : CH;
                if (n > ember_kv_max_append(kv, r)) n = ember_kv_max_append(kv, r);
                for (int i = 0; i < n; i++) row[i] = r, pos[i] = at + i;
                if (ember_kv_begin(kv, row, pos, n, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
                ember_tensor k1 = kt, v1 = vt;
                k1.shape[0] = v1.shape[0] = n;
                k1.nbytes = v1.nbytes = (size_t)n * HKV * D * 4;
                for (int l = 0; l < LAYERS; l++) {
                    ember_kv_layer views[2];
                    ember_kv_map map;
                    ember_kv_map_for(kv, l, row, pos, views, &map);
                    if (be->ops->kv_write(be, &map, &k1, &v1, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
                }
                ember_kv_end(kv, true);
            }
        long after = rss_bytes();
        double n = (double)rows * len, measured = (double)(after - before) / n;
        size_t predicted = ember_kv_bytes_per_token(kv, false);
        printf("| %s | %.0f | %zu | %.1f | %.4f | %.1f |\n", kinds[k], n, predicted, measured, measured / (double)predicted,
               (double)ember_kv_used_bytes(kv) / n);
        fflush(stdout);
        ember_kv_free(kv);
    }
    free(buf);
    ember_buffer_free(kb);
    ember_buffer_free(vb);
    ember_backend_free(be);
    return 0;
}
