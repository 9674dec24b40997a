/*
 * test_mlx_families.c - the dense families of issue 11 (phi3 with its fused
 * qkv_proj / gate_up_proj, gemma2, gemma3_text) as MLX affine-quantized
 * directories written by `ember quantize`'s library call, checked on every
 * ISA this CPU has (scalar, AVX2, AVX-512, AMX) where test_mlx.c's KL table runs
 * the best ISA only:
 *   1. mean KL against transformers' logits over the three fixture prompts
 *      (ember's float logits match them within 1e-4 relative:
 *      test_fixtures.c), mlx8 and mlx4 at group 64 with test_mlx.c's bounds
 *      (1e-3 and 5e-2; twice that for gemma3_text, whose 4 layers add up
 *      more rounding);
 *   2. mlx8, teacher-forced along the reference's greedy continuation: the
 *      argmax is the reference's at every step whose reference top-1 / top-2
 *      margin is at least 0.25;
 *   3. batch invariance of the mlx4 files on every ISA: three prompts with 8
 *      decode steps together (2 threads), each alone (1 thread) and in
 *      prefill chunks of 5, logits bit for bit.
 * Exits 77 when ../shared is absent.
 */
#include <math.h>

#include "ember.h"
#include "fixture.h"
#include "mlx_check.h"
#include "model/quantize_mlx.h"

static int quantize(const char *in, const char *out, int bits, int G) {
    ember_mlx_qopts o = {bits, G, 0, EMBER_DTYPE_INVALID, false};
    ember_error err = {0};
    int rc = ember_quantize_to_mlx(in, out, &o, &err);
    if (rc) fprintf(stderr, "quantize %s -> %s: %s\n", in, out, err.msg);
    return rc;
}

static void check_family(const char *fam, double scale) {
    fixture f;
    fixture_open(&f, fam);
    const int rows = total_rows(&f), V = f.vocab;
    float *ref = malloc((size_t)rows * V * 4);
    for (int i = 0, r0 = 0; i < 3; r0 += f.p[i].n, i++)
        memcpy(ref + (size_t)r0 * V, f.p[i].logits, (size_t)f.p[i].n * V * 4);
    char d8[700], d4[700], what[64];
    snprintf(d8, sizeof d8, "%s/fam-%s-mlx8", EMBER_TEST_TMP, fam);
    snprintf(d4, sizeof d4, "%s/fam-%s-mlx4", EMBER_TEST_TMP, fam);
    if (CHECKV(quantize(f.dir, d8, 8, 64) == 0, "quantize %s mlx8", fam)) {
        snprintf(what, sizeof what, "%s mlx8", fam);
        check_kl(what, &f, d8, ref, 1e-3 * scale);
        check_greedy_forced(what, &f, d8);
    }
    if (CHECKV(quantize(f.dir, d4, 4, 64) == 0, "quantize %s mlx4", fam)) {
        snprintf(what, sizeof what, "%s mlx4", fam);
        check_kl(what, &f, d4, ref, 5e-2 * scale);
        check_batch(what, &f, d4);
    }
    free(ref);
    fixture_close(&f);
}

int main(void) {
    shared_dir();
    for (int a = 0; a < N_ISAS; a++)
        if (!ember_isa_supported(k_isas[a])) fprintf(stderr, "%s not on this CPU, skipped\n", ember_isa_name(k_isas[a]));
    check_family("phi3", 1.0);
    check_family("gemma2", 1.0);
    check_family("gemma3_text", 2.0);
    return test_done();
}
