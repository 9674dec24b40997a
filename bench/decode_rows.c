/*
 * decode_rows.c - aggregate decode speed: R rows decoding together, each
 * over a context of --depth tokens, one token per row per forward pass.
 *
 * usage: decode_rows --model PATH [--device cpu|cuda:N] [--rows 1,8,64,256]
 *                    [--depth 1024] [--steps 32] [--kv-type bf16] [--threads N]
 *                    [--argmax 0|1] [--draw 0|1] [--isa auto|scalar|avx2|avx512|amx]
 *
 * Row 0 is prefilled with --depth synthetic tokens; its KV row is then
 * serialized and loaded into every other row (real copies: no row shares a
 * block with another, so attention reads R distinct contexts). For each R,
 * the rows are trimmed back to --depth, two untimed steps run (on a GPU the
 * second captures the step's CUDA graph, which the timed steps replay), then --steps
 * timed steps of R tokens (each row's greedy token from its own logits;
 * the logits of every row are read back, as a server samples every row;
 * with --argmax 1 the forward returns the greedy ids instead,
 * ember_batch.argmax, as the scheduler's plain greedy steps do: on the GPU
 * no logits row leaves the device, on the CPU none is copied and the rows
 * are scanned on the thread pool; with --draw 1 the forward draws each
 * row's token by the backend's sample_rows, temperature 0.8 and top_p
 * 0.95, ember_batch.draw, as the scheduler's plain sampled steps do).
 * Reported: milliseconds per step, aggregate tokens/s (R x steps / time),
 * tokens/s per row, and the step split into the forward (the logits read
 * back included) and the host's argmax over the rows read. Internal API (engine.h, model.h, kv.h).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ember.h"
#include "engine/engine.h"
#include "kv/kv.h"
#include "model/model.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static int fail(const char *what, const ember_error *err) {
    fprintf(stderr, "decode_rows: %s: %s\n", what, err->msg);
    return 1;
}

int main(int argc, char **argv) {
    const char *model = NULL, *device = "cpu", *kv = "bf16", *rows_s = "1,8,64,256";
    int depth = 1024, steps = 32, threads = 0, use_argmax = 0, use_draw = 0;
    ember_isa isa = EMBER_ISA_AUTO;
    for (int i = 1; i < argc; i += 2) { /* --name value pairs */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "decode_rows: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--kv-type")) kv = v;
        else if (!strcmp(a, "--rows")) rows_s = v;
        else if (!strcmp(a, "--depth")) depth = atoi(v);
        else if (!strcmp(a, "--steps")) steps = atoi(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--argmax")) use_argmax = atoi(v) != 0;
        else if (!strcmp(a, "--draw")) use_draw = atoi(v) != 0;
        else if (!strcmp(a, "--isa")) {
            const ember_isa all[] = {EMBER_ISA_AUTO, EMBER_ISA_SCALAR, EMBER_ISA_AVX2, EMBER_ISA_AVX512, EMBER_ISA_AMX};
            isa = (ember_isa)-1;
            for (int k = 0; k < 5; k++)
                if (!strcmp(v, ember_isa_name(all[k]))) isa = all[k];
            if ((int)isa < 0) {
                fprintf(stderr, "decode_rows: unknown --isa '%s'\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "usage: decode_rows --model PATH [--device cpu|cuda:N] [--rows 1,8,64,256] "
                            "[--depth 1024] [--steps 32] [--kv-type bf16] [--threads N] [--argmax 0|1] [--draw 0|1] "
                            "[--isa auto|scalar|avx2|avx512|amx]\n");
            return 2;
        }
    }
    int rows[16], n_rows = 0, max_rows = 1;
    for (const char *p = rows_s; *p && n_rows < 16;) {
        rows[n_rows] = atoi(p);
        if (rows[n_rows] < 1) {
            fprintf(stderr, "decode_rows: bad --rows '%s'\n", rows_s);
            return 2;
        }
        if (rows[n_rows] > max_rows) max_rows = rows[n_rows];
        n_rows++;
        const char *c = strchr(p, ',');
        if (!c) break;
        p = c + 1;
    }
    if (!model || depth < 1 || steps < 1) {
        fprintf(stderr, "decode_rows: --model is required; --depth and --steps must be positive\n");
        return 2;
    }
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.device = device;
    mp.kv_type = kv;
    mp.n_rows = max_rows;
    mp.n_ctx = depth + steps + 16;
    mp.max_batch_tokens = max_rows > 512 ? max_rows : 512;
    mp.n_threads = threads;
    mp.isa = isa;
    ember_model *m = NULL;
    ember_error err = {0};
    if (ember_model_load(model, &mp, &m, &err)) return fail("load", &err);
    const int V = m->cfg.vocab_size, B = m->params.max_batch_tokens;
    if (use_draw && !m->be->ops->sample_rows) {
        fprintf(stderr, "decode_rows: --draw 1: the %s backend has no sample_rows\n", m->be->ops->name);
        return 1;
    }
    if (use_draw) use_argmax = 1;
    ember_draw *draws = malloc(sizeof *draws * (size_t)max_rows);
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    float *logits = malloc((size_t)max_rows * (size_t)V * sizeof *logits);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)B), *pos = malloc(sizeof(int32_t) * (size_t)B),
            *row = malloc(sizeof(int32_t) * (size_t)B), *out = malloc(sizeof(int32_t) * (size_t)B);
    if (!logits || !tok || !pos || !row || !out || !draws) {
        fprintf(stderr, "decode_rows: out of memory\n");
        return 1;
    }
    /* row 0: depth synthetic tokens, in chunks */
    double t0 = now();
    for (int s = 0, nt; s < depth; s += nt) {
        nt = depth - s < B ? depth - s : B;
        for (int i = 0; i < nt; i++) {
            tok[i] = (int32_t)(((uint32_t)(s + i) * 2654435761u) % (uint32_t)V);
            pos[i] = s + i;
            row[i] = 0;
        }
        out[0] = nt - 1;
        ember_batch b = {.n = nt, .tok = tok, .pos = pos, .row = row, .n_out = 1, .out = out};
        if (ember_llm_forward(m->llm, m->st, m->kv, &b, logits, &err)) return fail("prefill", &err);
    }
    double t1 = now();
    void *blob = NULL;
    size_t nblob = 0;
    if (ember_kv_row_save(m->kv, 0, &blob, &nblob, &err)) return fail("row save", &err);
    for (int r = 1; r < max_rows; r++)
        if (ember_kv_row_load(m->kv, r, blob, nblob, &err)) return fail("row load", &err);
    free(blob);
    double t2 = now();
    ember_model_info info;
    ember_model_get_info(m, &info);
    printf("decode_rows: %s, %s weights, KV %s, device %s (isa %s); depth %d, %d timed steps; %s; prefill %.2f s, copies "
           "%.2f s\n",
           model, info.weight_dtype, info.kv_type, info.device, ember_isa_name(info.isa), depth, steps,
           use_draw     ? "tokens drawn by the forward (--draw 1: temperature 0.8, top_p 0.95)"
           : use_argmax ? "greedy ids from the forward (--argmax 1)"
                        : "every row's logits read back",
           t1 - t0, t2 - t1);
    printf("| rows | ms / step | tokens/s (all rows) | tokens/s per row | ms in the forward | ms of host argmax |\n");
    printf("|------|-----------|---------------------|------------------|-------------------|-------------------|\n");
    fflush(stdout);
    int32_t *last = malloc(sizeof(int32_t) * (size_t)max_rows);
    for (int ri = 0; ri < n_rows; ri++) {
        const int R = rows[ri];
        for (int r = 0; r < R; r++) {
            if (ember_kv_trim(m->kv, r, depth, &err)) return fail("trim", &err);
            last[r] = argmax(logits, V); /* row 0's next token, for every row */
        }
        double ts = 0, tf = 0; /* all of a step; the forward (logits read back included) */
        for (int s = -2; s < steps; s++) { /* steps -2 and -1: untimed (the second captures a CUDA step graph) */
            for (int r = 0; r < R; r++) {
                tok[r] = last[r];
                pos[r] = depth + s + 2;
                row[r] = r;
                out[r] = r;
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                draws[r] = (ember_draw){.temperature = 0.8f, .top_p = 0.95f, .u = (double)(rng >> 11) * 0x1.0p-53};
            }
            ember_batch b = {.n = R, .tok = tok, .pos = pos, .row = row, .n_out = R, .out = out,
                             .argmax = use_argmax ? last : NULL, .draw = use_draw ? draws : NULL};
            double a = now();
            if (ember_llm_forward(m->llm, m->st, m->kv, &b, logits, &err)) return fail("decode", &err);
            const double f = now();
            for (int r = 0; !use_argmax && r < R; r++) last[r] = argmax(logits + (size_t)r * (size_t)V, V);
            if (s >= 0) {
                ts += now() - a;
                tf += f - a;
            }
        }
        printf("| %4d | %9.3f | %19.1f | %16.1f | %17.3f | %17.3f |\n", R, 1e3 * ts / steps, (double)R * steps / ts,
               steps / ts, 1e3 * tf / steps, 1e3 * (ts - tf) / steps);
        fflush(stdout);
    }
    free(last);
    free(draws);
    free(logits);
    free(tok);
    free(pos);
    free(row);
    free(out);
    ember_model_free(m);
    return 0;
}
