/*
 * test_fixtures.c - parity with HuggingFace transformers on the fixture
 * models: for every llama-family fixture and every instruction set this CPU
 * has, the logits of every prompt position within 1e-4 x max|logit| (the
 * fixtures' recommended mark), the decode-step logits of p0, and the 24
 * greedy ids exactly.
 */
#include "ember.h"
#include "fixture.h"

static const char *const k_families[] = {"llama", "llama_bf16", "qwen2", "qwen3", "mistral"};

static void run_family(const char *family, ember_isa isa) {
    fixture f;
    fixture_open(&f, family);
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.isa = isa;
    mp.n_threads = 2;
    ember_model *m = NULL;
    ember_error err = {0};
    int rc = ember_model_load(f.dir, &mp, &m, &err);
    CHECKF(rc == EMBER_OK, "%s: %s", family, err.msg);
    if (rc) {
        fixture_close(&f);
        return;
    }
    const int V = f.vocab;
    float worst = 0;
    for (int i = 0; i < 3; i++) {
        fixture_prompt *p = &f.p[i];
        float *lg = malloc((size_t)(p->n + 23) * (size_t)V * sizeof *lg);
        int32_t out[24];
        ember_request r = {0};
        r.prompt = p->ids;
        r.n_prompt = p->n;
        r.max_new_tokens = 24;
        r.ignore_eos = 1;
        ember_sampling_init(&r.sampling);
        r.out_ids = out;
        r.out_logits = lg;
        rc = ember_generate(m, &r, 1, &err);
        CHECKF(rc == EMBER_OK, "%s p%d: %s", family, i, err.msg);
        CHECK(r.n_out == 24);
        float ref_max = max_abs(p->logits, (size_t)p->n * (size_t)V);
        float d = 0;
        for (size_t k = 0; k < (size_t)p->n * (size_t)V; k++) d = fmaxf(d, fabsf(lg[k] - p->logits[k]));
        CHECKF(d / ref_max <= 1e-4f, "%s/%s p%d: max|dlogit| %g (rel %g)", family, ember_isa_name(isa), i, d,
               d / ref_max);
        worst = fmaxf(worst, d / ref_max);
        if (i == 0) { /* decode-step logits: row k predicts greedy[k] */
            float dg = 0;
            for (int s = 0; s < 24; s++)
                for (int v = 0; v < V; v++)
                    dg = fmaxf(dg, fabsf(lg[(size_t)(p->n - 1 + s) * V + v] - f.p0_gen_logits[(size_t)s * V + v]));
            CHECKF(dg / ref_max <= 1e-4f, "%s p0 decode logits: max diff %g", family, dg);
            worst = fmaxf(worst, dg / ref_max);
        }
        int first_diff = -1;
        for (int s = 0; s < 24 && first_diff < 0; s++)
            if (out[s] != p->greedy[s]) first_diff = s;
        CHECKF(first_diff < 0, "%s/%s p%d: greedy ids differ from step %d (margin there %g)", family,
               ember_isa_name(isa), i, first_diff, first_diff >= 0 ? p->margin[first_diff] : 0.0);
        free(lg);
    }
    fprintf(stderr, "%-10s %-6s worst relative logit error %.3g\n", family, ember_isa_name(isa), worst);
    ember_model_free(m);
    fixture_close(&f);
}

int main(void) {
    shared_dir();
    const ember_isa isas[] = {EMBER_ISA_SCALAR, EMBER_ISA_AVX2, EMBER_ISA_AVX512};
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        ember_model_params mp;
        ember_model_params_init(&mp);
        if (isas[i] > ember_isa_detect()) {
            fprintf(stderr, "note: %s not supported by this CPU, not tested here\n", ember_isa_name(isas[i]));
            continue;
        }
        for (size_t k = 0; k < sizeof k_families / sizeof k_families[0]; k++) run_family(k_families[k], isas[i]);
    }
    return test_done();
}
