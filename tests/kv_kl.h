/*
 * kv_kl.h - the KV-cache quality measure shared by tests/test_kv_quality.c
 * and bench/kv_quality.c: a model's own greedy text, then the mean
 * KL(p_f32 || p_kind) of the next-token distributions at every position,
 * with the logits of each KV kind computed by ember_logits (what `ember
 * logits --kv-type KIND` writes).
 */
#ifndef EMBER_TEST_KV_KL_H
#define EMBER_TEST_KV_KL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember.h"

#define KL_SEQS 5
#define KL_LEN 480

typedef struct kl_text {
    int32_t ids[KL_SEQS][KL_LEN];
    int vocab;
} kl_text;

/* Loads path with a KV kind (NULL: f32) and 2 threads; NULL on error (printed). */
static ember_model *kl_load(const char *path, const char *kv_type, int quant_start) {
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.n_threads = 2;
    mp.n_ctx = 512;
    mp.kv_type = kv_type;
    mp.kv_quant_start = quant_start;
    ember_model *m = NULL;
    ember_error err = {0};
    if (ember_model_load(path, &mp, &m, &err)) fprintf(stderr, "%s: %s\n", path, err.msg);
    return m;
}

/* KL_SEQS sequences: BOS (id 1), a different second token each, then the
   model's greedy continuation with an f32 cache. 0 on success. */
static int kl_make_text(ember_model *m, kl_text *t) {
    ember_model_info info;
    ember_model_get_info(m, &info);
    t->vocab = info.vocab_size;
    for (int s = 0; s < KL_SEQS; s++) {
        int32_t prompt[2] = {1, (int32_t)(300 + 37 * s) % info.vocab_size};
        ember_request r;
        memset(&r, 0, sizeof r);
        r.prompt = prompt;
        r.n_prompt = 2;
        r.max_new_tokens = KL_LEN - 2;
        r.ignore_eos = 1;
        ember_sampling_init(&r.sampling);
        r.out_ids = t->ids[s] + 2;
        ember_error err = {0};
        if (ember_generate(m, &r, 1, &err)) {
            fprintf(stderr, "generate: %s\n", err.msg);
            return -1;
        }
        t->ids[s][0] = prompt[0];
        t->ids[s][1] = prompt[1];
    }
    return 0;
}

/* Log-softmax of x[n] into y. */
static void kl_logsoftmax(const float *x, int n, double *y) {
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < n; i++) s += exp(x[i] - mx);
    double l = mx + log(s);
    for (int i = 0; i < n; i++) y[i] = x[i] - l;
}

/* Mean KL(ref || m) over every position of the text; ref_logits holds the
   f32 logits ([KL_SEQS][KL_LEN][vocab]). Negative on error. */
static double kl_mean(ember_model *m, const kl_text *t, const float *ref_logits) {
    const int V = t->vocab;
    float *lg = malloc(sizeof(float) * (size_t)KL_LEN * V);
    double *a = malloc(sizeof(double) * (size_t)V), *b = malloc(sizeof(double) * (size_t)V), sum = 0;
    int n = 0;
    for (int s = 0; s < KL_SEQS && lg; s++) {
        ember_error err = {0};
        if (ember_logits(m, t->ids[s], KL_LEN, lg, &err)) {
            fprintf(stderr, "logits: %s\n", err.msg);
            sum = -1;
            break;
        }
        for (int p = 0; p < KL_LEN; p++) {
            kl_logsoftmax(ref_logits + ((size_t)s * KL_LEN + p) * V, V, a);
            kl_logsoftmax(lg + (size_t)p * V, V, b);
            double kl = 0;
            for (int i = 0; i < V; i++) kl += exp(a[i]) * (a[i] - b[i]);
            sum += kl;
            n++;
        }
    }
    free(lg);
    free(a);
    free(b);
    return sum < 0 ? -1 : sum / n;
}

/* The f32 logits of the text into a new array (caller frees). */
static float *kl_ref_logits(ember_model *m, const kl_text *t) {
    float *r = malloc(sizeof(float) * (size_t)KL_SEQS * KL_LEN * t->vocab);
    for (int s = 0; s < KL_SEQS && r; s++) {
        ember_error err = {0};
        if (ember_logits(m, t->ids[s], KL_LEN, r + (size_t)s * KL_LEN * t->vocab, &err)) {
            fprintf(stderr, "logits: %s\n", err.msg);
            free(r);
            return NULL;
        }
    }
    return r;
}

#endif
