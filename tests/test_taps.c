/*
 * test_taps.c - the forward's hidden taps (model.h's ember_batch.tap*): the
 * residual stream entering each layer, after the last one and after the
 * final norm, for the tokens that ask.
 *
 * Checked per family against transformers' hidden states of the fixtures'
 * second prompt (hidden_all.embed / layerK / final_norm: the embeddings,
 * layer K's output, the final norm's output); the logits are bit for bit
 * the same with and without taps; a row's taps are bit for bit the same
 * alone, beside another row in one forward, prefilled in chunks, and
 * asked for only some of its tokens (batch invariance); bad tap layers are
 * refused before anything is computed.
 */
#include <math.h>

#include "engine/engine.h"
#include "fixture.h"
#include "model/model.h"

static const char *const k_families[] = {"llama", "qwen2", "qwen3", "qwen3_moe", "gemma2", "gemma3_text",
                                         "gemma4_text", "qwen3_5_text"};

/* A forward of the tokens ids[0, n) at positions pos0.. of row `row`
   (taps for every token at tap layers L[0, nl) when taps is non-NULL; the
   last token's logits into lg when non-NULL). */
static int fwd(ember_model *m, int row, int pos0, const int32_t *ids, int n, const int32_t *L, int nl, float *taps,
               float *lg) {
    int32_t pos[128], rows[128], idx[128], last = n - 1;
    for (int i = 0; i < n; i++) pos[i] = pos0 + i, rows[i] = row, idx[i] = i;
    ember_batch b = {.n = n, .tok = ids, .pos = pos, .row = rows, .n_out = lg ? 1 : 0, .out = &last,
                     .n_tap = taps ? n : 0, .tap = idx, .n_tap_layers = nl, .tap_layers = L, .taps = taps};
    ember_error err = {0};
    int rc = ember_llm_forward(m->llm, m->st, m->kv, &b, lg, &err);
    if (rc) fprintf(stderr, "forward: %s\n", err.msg);
    return rc;
}

/* max |a - b| over n values, relative to max |b|. */
static double rel_err(const float *a, const float *b, size_t n, size_t stride_a) {
    double mx = 0, ref = 1e-30;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i * stride_a] - (double)b[i]);
        mx = d > mx ? d : mx;
        ref = fabs((double)b[i]) > ref ? fabs((double)b[i]) : ref;
    }
    return mx / ref;
}

static void family(const char *name) {
    fixture fx;
    fixture_open(&fx, name);
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.n_rows = 2;
    mp.n_threads = 2;
    mp.device = getenv("EMBER_TEST_DEVICE"); /* e.g. cuda:0 (NULL: cpu) */
    ember_model *m = fx_load_params(fx.dir, &mp);
    CHECKF(m != NULL, "%s: load", name);
    if (!m) return;
    const int NL = m->cfg.n_layers, H = m->cfg.hidden_size, V = m->cfg.vocab_size;
    int32_t L[16];
    int nl = 0;
    for (int l = 0; l <= NL; l++) L[nl++] = l;
    L[nl++] = EMBER_TAP_NORMED;
    const fixture_prompt *p = &fx.p[1];
    const int n = p->n, K = nl;
    float *taps = calloc((size_t)n * K * H, sizeof(float)), *taps2 = calloc((size_t)n * K * H, sizeof(float));
    float *lg = malloc((size_t)V * 4), *lg2 = malloc((size_t)V * 4);

    /* parity with transformers: embed, layer k's output (= the stream entering k + 1), final norm */
    CHECK(fwd(m, 0, 0, p->ids, n, L, nl, taps, lg) == EMBER_OK);
    for (int k = 0; k < K; k++) {
        char key[64];
        if (L[k] == EMBER_TAP_NORMED)
            snprintf(key, sizeof key, "hidden_all.final_norm");
        else if (L[k] == 0)
            snprintf(key, sizeof key, "hidden_all.embed");
        else
            snprintf(key, sizeof key, "hidden_all.layer%d", L[k] - 1);
        const ember_st_tensor *t = ember_st_find(fx.refs, key);
        if (!t) continue; /* the fixture records the layers it records */
        CHECKF((int)t->shape[0] == n && (int)t->shape[1] == H, "%s %s shape", name, key);
        double worst = 0;
        for (int d = 0; d < H; d++) { /* column by column: the stride of one token's taps is K * H */
            float ref[128];
            for (int i = 0; i < n; i++) ref[i] = ((const float *)t->data)[(size_t)i * H + d];
            double e = rel_err(taps + (size_t)k * H + d, ref, (size_t)n, (size_t)K * H);
            worst = e > worst ? e : worst;
        }
        CHECKF(worst <= 1e-3, "%s tap %d (%s): relative error %g", name, L[k], key, worst);
    }
    /* the logits do not change with taps */
    ember_kv_clear(m->kv, 0);
    CHECK(fwd(m, 0, 0, p->ids, n, NULL, 0, NULL, lg2) == EMBER_OK);
    CHECKF(!memcmp(lg, lg2, (size_t)V * 4), "%s: logits differ with taps", name);

    /* batch invariance: the same row in chunks of 7 beside another row's prompt, taps for odd tokens only */
    ember_kv_clear(m->kv, 0);
    memset(taps2, 0, (size_t)n * K * H * 4);
    const fixture_prompt *o = &fx.p[0];
    for (int c0 = 0, oc = 0; c0 < n; c0 += 7) {
        int c = n - c0 < 7 ? n - c0 : 7, oc_n = oc < o->n ? (o->n - oc < 5 ? o->n - oc : 5) : 0;
        int32_t tok[16], pos[16], rows[16], idx[16], ni = 0;
        for (int i = 0; i < oc_n; i++) tok[i] = o->ids[oc + i], pos[i] = oc + i, rows[i] = 1; /* the other row first */
        for (int i = 0; i < c; i++) {
            tok[oc_n + i] = p->ids[c0 + i], pos[oc_n + i] = c0 + i, rows[oc_n + i] = 0;
            if ((c0 + i) % 2) idx[ni++] = oc_n + i;
        }
        float chunk[8 * 16 * 128];
        ember_batch b = {.n = oc_n + c, .tok = tok, .pos = pos, .row = rows, .n_out = 0, .out = NULL,
                         .n_tap = ni, .tap = idx, .n_tap_layers = nl, .tap_layers = L, .taps = chunk};
        ember_error err = {0};
        CHECKF(ember_llm_forward(m->llm, m->st, m->kv, &b, NULL, &err) == EMBER_OK, "%s: %s", name, err.msg);
        for (int j = 0; j < ni; j++) /* token c0 + (idx[j] - oc_n) */
            memcpy(taps2 + (size_t)(c0 + idx[j] - oc_n) * K * H, chunk + (size_t)j * K * H, (size_t)K * H * 4);
        oc += oc_n;
    }
    bool same = true;
    for (int i = 1; i < n; i += 2) same &= !memcmp(taps + (size_t)i * K * H, taps2 + (size_t)i * K * H, (size_t)K * H * 4);
    CHECKF(same, "%s: taps differ in chunks beside another row", name);

    /* refused: a layer past the last, and the cache unchanged */
    ember_kv_clear(m->kv, 0);
    int32_t bad[1] = {NL + 1}, pos0 = 0, row0 = 0, i0 = 0;
    ember_batch b = {.n = 1, .tok = p->ids, .pos = &pos0, .row = &row0, .n_out = 0, .out = NULL,
                     .n_tap = 1, .tap = &i0, .n_tap_layers = 1, .tap_layers = bad, .taps = taps};
    ember_error err = {0};
    CHECK(ember_llm_forward(m->llm, m->st, m->kv, &b, NULL, &err) == EMBER_ERR_INVALID_ARG);
    CHECKF(strstr(err.msg, "hidden tap layer") != NULL, "%s: message '%s'", name, err.msg);
    CHECK(ember_kv_len(m->kv, 0) == 0);
    free(taps);
    free(taps2);
    free(lg);
    free(lg2);
    ember_model_free(m);
    fixture_close(&fx);
}

int main(void) {
    shared_dir();
    for (size_t i = 0; i < sizeof k_families / sizeof *k_families; i++) family(k_families[i]);
    return test_done();
}
