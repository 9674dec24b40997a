/*
 * kv_attn_bench.c - the attention op alone: one decode token (or a prefill
 * chunk) against a row of DEPTH positions, for each KV kind, with the
 * Qwen2.5-0.5B head layout (14 query heads over 2 KV heads of 64). Reports
 * microseconds per layer and the KV bytes read per second.
 *
 * usage: kv_attn_bench [DEPTH] [THREADS] [TOKENS] [KIND ...]
 * env:   ISA=scalar|avx2|avx512|amx (default: the best the CPU has),
 *        (or amx, the AVX-512 kernels built with AMX tiles),
 *        REPS=N: exactly N timed calls (default: calls for at least 1 s),
 *        for instruction counts under valgrind
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/util.h"
#include "kv/kv.h"
#include "kv/kv_internal.h"

enum { HQ = 14, HKV = 2, D = 64 };

static int fill(ember_backend *be, ember_kv *kv, int n) {
    ember_error err = {0};
    uint64_t s = 1;
    for (int at = 0, k; at < n; at += k) {
        k = n - at < 256 ? n - at : 256;
        if (k > ember_kv_max_append(kv, 0)) k = ember_kv_max_append(kv, 0);
        int32_t row[256], pos[256];
        for (int i = 0; i < k; i++) row[i] = 0, pos[i] = at + i;
        if (ember_kv_begin(kv, row, pos, k, &err)) return fprintf(stderr, "%s\n", err.msg), -1;
        ember_buffer *kb, *vb;
        ember_tensor kt, vt;
        const int64_t shape[3] = {k, HKV, D};
        ember_tensor_alloc(be, &kt, &kb, EMBER_F32, 3, shape, &err);
        ember_tensor_alloc(be, &vt, &vb, EMBER_F32, 3, shape, &err);
        float *buf = malloc(sizeof(float) * (size_t)k * HKV * D);
        for (int i = 0; i < k * HKV * D; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            buf[i] = (float)((int64_t)(s >> 40) - (1 << 23)) / (1 << 22);
        }
        be->ops->write(be, &kt, 0, buf, kt.nbytes, &err);
        be->ops->write(be, &vt, 0, buf, vt.nbytes, &err);
        ember_kv_layer views[2];
        ember_kv_map map;
        ember_kv_map_for(kv, 0, row, pos, views, &map);
        if (be->ops->kv_write(be, &map, &kt, &vt, &err)) return fprintf(stderr, "%s\n", err.msg), -1;
        ember_kv_end(kv, true);
        free(buf);
        ember_buffer_free(kb);
        ember_buffer_free(vb);
    }
    return 0;
}

int main(int argc, char **argv) {
    int depth = argc > 1 ? atoi(argv[1]) : 4096, threads = argc > 2 ? atoi(argv[2]) : 2,
        T = argc > 3 ? atoi(argv[3]) : 1;
    static const char *const all[] = {"f32", "f16", "bf16", "q8", "q4", "tq-k8v4", "tq-k4v4"};
    const char *const *kinds = argc > 4 ? (const char *const *)argv + 4 : all;
    int n_kinds = argc > 4 ? argc - 4 : (int)(sizeof all / sizeof all[0]);
    if (depth < T || T < 1 || T > 512) return fprintf(stderr, "bad arguments\n"), 2;
    ember_backend *be;
    ember_error err = {0};
    ember_isa isa = EMBER_ISA_AUTO;
    const char *isa_s = getenv("ISA");
    if (isa_s && *isa_s) {
        if (strcmp(isa_s, "scalar") == 0) isa = EMBER_ISA_SCALAR;
        else if (strcmp(isa_s, "avx2") == 0) isa = EMBER_ISA_AVX2;
        else if (strcmp(isa_s, "avx512") == 0) isa = EMBER_ISA_AVX512;
        else if (strcmp(isa_s, "amx") == 0) isa = EMBER_ISA_AMX;
        else return fprintf(stderr, "ISA: expected scalar, avx2, avx512 or amx, got '%s'\n", isa_s), 2;
    }
    ember_cpu_params cp = {threads, isa, false, {0}};
    if (ember_backend_cpu_new(&cp, &be, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
    printf("# ISA %s\n", ember_isa_name(ember_backend_cpu_isa(be)));
    printf("| kind | depth | tokens | threads | us per layer | KV GB/s |\n|---|---|---|---|---|---|\n");
    for (int k = 0; k < n_kinds; k++) {
        ember_kv_type t;
        if (ember_kv_type_parse(kinds[k], 0, 0, &t, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
        const int heads[1] = {HKV}, dims[1] = {D}, win[1] = {0};
        ember_kv_params p = {t, 1, heads, dims, win, 1, depth + 16, 0, 0, 256, NULL, {0}};
        ember_kv *kv;
        if (ember_kv_new(be, &p, &kv, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
        if (fill(be, kv, depth)) return 1;
        ember_buffer *qb, *ob;
        ember_tensor qt, ot;
        const int64_t shape[3] = {T, HQ, D};
        ember_tensor_alloc(be, &qt, &qb, EMBER_F32, 3, shape, &err);
        ember_tensor_alloc(be, &ot, &ob, EMBER_F32, 3, shape, &err);
        float *q = malloc(sizeof(float) * (size_t)T * HQ * D);
        for (int i = 0; i < T * HQ * D; i++) q[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
        be->ops->write(be, &qt, 0, q, qt.nbytes, &err);
        int32_t row[512], pos[512];
        for (int i = 0; i < T; i++) row[i] = 0, pos[i] = depth - T + i;
        kv_tab *tb = kv_tab_of(kv, 0, 0);
        kv->refs[0] = (ember_kv_rowref){tb->blk, tb->first, tb->n, kv->rows[0].converted ? 1 : 0};
        ember_kv_layer views[2];
        ember_kv_map map;
        ember_kv_map_for(kv, 0, row, pos, views, &map);
        ember_attn a = {0.125f, 0, 0};
        const char *reps_s = getenv("REPS");
        const int want = reps_s ? atoi(reps_s) : 0;
        int reps = 0;
        double t0 = ember_now(), t1;
        do {
            if (be->ops->attention(be, &ot, &qt, &map, &a, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
            reps++;
            t1 = ember_now();
        } while (want > 0 ? reps < want : (t1 - t0 < 1.0 || reps < 3));
        double us = (t1 - t0) / reps * 1e6;
        double bytes = (double)ember_kv_bytes_per_token(kv, false) * depth;
        printf("| %s | %d | %d | %d | %.1f | %.2f |\n", kinds[k], depth, T, threads, us, bytes / (us * 1e-6) / 1e9);
        fflush(stdout);
        free(q);
        ember_buffer_free(qb);
        ember_buffer_free(ob);
        ember_kv_free(kv);
    }
    ember_backend_free(be);
    return 0;
}
