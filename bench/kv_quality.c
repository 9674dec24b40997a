/*
 * kv_quality.c - KV cache quality: mean KL of next-token distributions of
 * every KV kind against f32, over a model's own greedy text (tests/kv_kl.h),
 * with bytes per token. Prints a markdown table for bench/RESULTS.md.
 *
 * usage: kv_quality MODEL [KIND ...]   (default: every kind)
 */
#include "../tests/kv_kl.h"

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: kv_quality MODEL [KIND[@QUANT_START] ...]\n");
        return 2;
    }
    static const char *const all[] = {"f16",     "bf16",    "q8",      "q4",      "tq-k8v8", "tq-k8v4",
                                      "tq-k4v4", "tq-k4v3", "tq-k3v3", "tq-k3v2", "q8@256",  "q4@256"};
    const char *const *kinds = argc > 2 ? (const char *const *)argv + 2 : all;
    int n_kinds = argc > 2 ? argc - 2 : (int)(sizeof all / sizeof all[0]);
    ember_model *m = kl_load(argv[1], NULL, 0);
    if (!m) return 1;
    static kl_text t;
    if (kl_make_text(m, &t)) return 1;
    float *ref = kl_ref_logits(m, &t);
    ember_model_info info;
    ember_model_get_info(m, &info);
    ember_model_free(m);
    if (!ref) return 1;
    printf("| KV kind | bytes per token | vs f32 | mean KL vs f32 (%d positions) |\n", KL_SEQS * KL_LEN);
    printf("|---|---|---|---|\n");
    printf("| %s | %zu | 1.000 | 0 |\n", info.kv_type, info.kv_bytes_per_token);
    size_t f32_bytes = info.kv_bytes_per_token;
    for (int k = 0; k < n_kinds; k++) {
        char kind[64];
        snprintf(kind, sizeof kind, "%s", kinds[k]);
        int qs = 0;
        char *at = strchr(kind, '@');
        if (at) {
            *at = 0;
            qs = atoi(at + 1);
        }
        m = kl_load(argv[1], kind, qs);
        if (!m) return 1;
        double kl = kl_mean(m, &t, ref);
        ember_model_get_info(m, &info);
        printf("| %s | %zu | %.3f | %.3g |\n", info.kv_type, info.kv_bytes_per_token,
               (double)info.kv_bytes_per_token / (double)f32_bytes, kl);
        fflush(stdout);
        ember_model_free(m);
        if (kl < 0) return 1;
    }
    free(ref);
    return 0;
}
