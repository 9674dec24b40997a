/*
 * test_kv_quality.c - the KV kinds' quality goals of issue 10 as checks, on
 * the trained stories260K model (../shared/testdata): the model's own greedy
 * text (tests/kv_kl.h: 5 sequences of 480 positions, 2,400 next-token
 * distributions), the mean KL of each kind's distributions against the f32
 * cache's. bench/kv_quality prints the same measure for every kind.
 *
 * Checked: f16 < 1e-5, q8 < 1e-4 and q4 < 2e-2 (the goals), and
 * tq-k5v4 (5-bit keys, 4-bit values after the rotation) below affine q4 at
 * fewer bytes per token. stories260K's heads have 8 values, so q4's group is
 * a whole head and its scale and bias cost 4 more bits a value; at 4 bits a
 * value on average (tq-k4v4, tq-k5v3) the rotation kinds do not reach q4 on
 * this model (bench/RESULTS.md, "the 4-bit rotation kind"), so that is not
 * asserted. About 3 s in a release build.
 */
#include "test.h"
#include "kv_kl.h"

typedef struct kind_kl {
    const char *kind;
    double kl;
    size_t bytes;
} kind_kl;

/* The mean KL of kind k against ref, and its bytes per token; kl < 0 on error. */
static void measure(const char *path, const kl_text *t, const float *ref, kind_kl *k) {
    k->kl = -1;
    ember_model *m = kl_load(path, k->kind, 0);
    if (!CHECKV(m != NULL, "%s does not load with --kv-type %s", path, k->kind)) return;
    ember_model_info info;
    ember_model_get_info(m, &info);
    k->bytes = info.kv_bytes_per_token;
    k->kl = kl_mean(m, t, ref);
    CHECKF(k->kl >= 0, "%s: the KL measure failed", k->kind);
    fprintf(stderr, "%-8s %5zu bytes/token  mean KL %.3g\n", k->kind, k->bytes, k->kl);
    ember_model_free(m);
}

int main(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/testdata/models/stories260K/stories260K.gguf", shared_require("testdata"));
    ember_model *m = kl_load(path, NULL, 0);
    if (!CHECKV(m != NULL, "%s does not load", path)) return test_done();
    static kl_text t;
    CHECK(kl_make_text(m, &t) == 0);
    float *ref = kl_ref_logits(m, &t);
    ember_model_free(m);
    if (!CHECKV(ref != NULL, "the f32 logits")) return test_done();
    kind_kl k[] = {{"f16", 0, 0}, {"q8", 0, 0}, {"q4", 0, 0}, {"tq-k5v4", 0, 0}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) measure(path, &t, ref, &k[i]);
    free(ref);
    CHECKF(k[0].kl >= 0 && k[0].kl < 1e-5, "f16: mean KL %g (bound 1e-5)", k[0].kl);
    CHECKF(k[1].kl >= 0 && k[1].kl < 1e-4, "q8: mean KL %g (goal 1e-4)", k[1].kl);
    CHECKF(k[2].kl >= 0 && k[2].kl < 2e-2, "q4: mean KL %g (goal 2e-2)", k[2].kl);
    CHECKF(k[3].kl >= 0 && k[3].kl < k[2].kl, "tq-k5v4: mean KL %g not below q4's %g", k[3].kl, k[2].kl);
    CHECKF(k[3].bytes <= k[2].bytes, "tq-k5v4: %zu bytes a token, more than q4's %zu", k[3].bytes, k[2].bytes);
    return test_done();
}
