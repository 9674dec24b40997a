/*
 * test_gguf_hybrid.c - the hybrid linear-attention families through GGUF
 * in llama.cpp's layout (architectures qwen3next, qwen35, qwen35moe):
 *   1. each fixture (qwen3_next, qwen3_5_text, qwen3_5_moe_text) written by
 *      `ember quantize`'s library call as an F32 GGUF gives the safetensors
 *      logits on every prompt: bit for bit for qwen3next, within 1e-5 of
 *      the largest logit for qwen35 / qwen35moe (their value heads are
 *      stored in llama.cpp's tiled order, so out_proj sums in another
 *      order); greedy ids of the prompts' last positions equal;
 *   2. q8_0 and q4_k_m: mean KL(f32 || quantized) over every position below
 *      5e-2 and 0.35. These tiny random hybrids are far more sensitive to
 *      weight rounding than the dense fixtures (measured: q8_0 0.005-0.025,
 *      q4_k_m 0.09-0.17, against 2e-4-5e-4 and 5e-3-1e-2 for the dense
 *      families in test_quant_models). The same quantized weights stored
 *      back as f32 (weight-only rounding, f32 kernels) give the same KL
 *      within 25%, and f16 weights give 4e-6-2e-4: the loss is the
 *      weights', not a kernel's or the layout's (part 1 checks the layout
 *      exactly);
 *   3. the file itself, read back with the GGUF reader and checked against
 *      the safetensors weights by an independent index computation: the
 *      keys (ssm.*, full_attention_interval, rope.dimension_sections,
 *      expert_*), the tensor names and shapes llama.cpp's loader asks for,
 *      and each transform of llama.cpp's converter (norms + 1, ssm_a =
 *      -exp(A_log), conv1d squeezed, qwen3next's in_proj_qkvz split, the
 *      value heads tiled, experts stacked, f32 routers);
 *   4. impossible hybrid metadata and missing DeltaNet tensors are refused
 *      with one line naming the key or tensor;
 *   5. `ember mkmodel` of a dense hybrid config (see test_mkmodel);
 *   6. layers that follow no interval, as ARCH.attention.recurrent_layers.
 * Exits 77 when ../shared is absent.
 */
#define _POSIX_C_SOURCE 200809L /* popen */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember.h"
#include "fixture.h"
#include "gguf_check.h"
#include "formats/gguf.h"
#include "model/model.h"
#include "model/quantize.h"

static const char *const k_fams[] = {"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"};

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

static void gguf_path(char *out, size_t n, const char *fam, const char *scheme) {
    snprintf(out, n, "%s/hyb-%s-%s.gguf", EMBER_TEST_TMP, fam, scheme);
}

/* 1 and 2 */
static void test_logits(void) {
    static const char *const schemes[] = {"f32", "q8_0", "q4_k_m"};
    for (int i = 0; i < 3; i++) {
        fixture f;
        fixture_open(&f, k_fams[i]);
        const int rows = f.p[0].n + f.p[1].n + f.p[2].n;
        const size_t n = (size_t)rows * (size_t)f.vocab;
        float *ref = malloc(n * 4), *got = malloc(n * 4);
        CHECK(ref && got && fx_prompt_logits(f.dir, &f, 3, ref) == 0);
        for (int s = 0; s < 3; s++) {
            ember_qscheme qs;
            CHECK(ember_qscheme_parse(schemes[s], &qs));
            char out[700];
            gguf_path(out, sizeof out, k_fams[i], schemes[s]);
            ember_error err = {0};
            CHECKF(ember_quantize_to_gguf(f.dir, out, qs, &err) == EMBER_OK, "%s %s: %s", k_fams[i], schemes[s],
                   err.msg);
            if (!CHECKV(fx_prompt_logits(out, &f, 3, got) == 0, "%s %s GGUF does not run", k_fams[i], schemes[s])) continue;
            if (s == 0) {
                float d = 0, mx = 0;
                for (size_t k = 0; k < n; k++) {
                    d = fmaxf(d, fabsf(ref[k] - got[k]));
                    mx = fmaxf(mx, fabsf(ref[k]));
                }
                fprintf(stderr, "%-17s f32 GGUF vs safetensors: max|dlogit| %g (max|logit| %g)\n", k_fams[i], d, mx);
                if (i == 0)
                    CHECKF(!memcmp(ref, got, n * 4), "qwen3_next f32 GGUF: logits differ (max %g)", d);
                else
                    CHECKF(d <= 1e-5f * mx, "%s f32 GGUF: max|dlogit| %g above 1e-5 of %g", k_fams[i], d, mx);
                for (int p = 0, r = 0; p < 3; r += f.p[p].n, p++) {
                    const size_t last = (size_t)(r + f.p[p].n - 1) * (size_t)f.vocab;
                    CHECKF(argmax(ref + last, f.vocab) == argmax(got + last, f.vocab), "%s f32 GGUF: prompt %d's "
                           "next token differs", k_fams[i], p);
                }
            } else {
                const double kl = mean_kl(ref, got, rows, f.vocab), bound = s == 1 ? 5e-2 : 0.35;
                fprintf(stderr, "%-17s %-7s mean KL %.3g (bound %g)\n", k_fams[i], schemes[s], kl, bound);
                CHECKF(kl < bound, "%s %s: mean KL %g >= %g", k_fams[i], schemes[s], kl, bound);
            }
        }
        free(ref);
        free(got);
        fixture_close(&f);
    }
}

/* ---- 3: the layout ---- */

static const float *st_f32(const ember_weights *w, const char *name) {
    const ember_st_tensor *t = ember_weights_find(w, name, NULL);
    if (!CHECKV(t && t->dtype == EMBER_F32, "fixture tensor %s missing or not F32", name)) return NULL;
    return (const float *)t->data;
}

/* The HF (grouped) value head of llama.cpp's tiled head j: key head j % Hk, its (j / Hk)-th head. */
static int grouped_of(int j, int Hk, int r, bool tiled) {
    return tiled ? (j % Hk) * r + j / Hk : j;
}

static void check_layout(const char *fam) {
    fixture f;
    fixture_open(&f, fam);
    ember_model_config c;
    ember_weights *w = NULL;
    ember_error err = {0};
    char path[700];
    gguf_path(path, sizeof path, fam, "f32");
    ember_gguf *g = NULL;
    if (!CHECKV(ember_config_load(f.dir, &c, &err) == EMBER_OK && ember_weights_open(f.dir, &w, &err) == EMBER_OK &&
                    ember_gguf_open(path, &g, &err) == EMBER_OK,
                "%s: %s", fam, err.msg)) {
        ember_weights_free(w);
        fixture_close(&f);
        return;
    }
    const bool next = strcmp(fam, "qwen3_next") == 0, moe = c.n_experts > 0, tiled = !next;
    const char *arch = next ? "qwen3next" : moe ? "qwen35moe" : "qwen35";
    const char *got_arch = NULL;
    CHECK(ember_gguf_get_str(g, "general.architecture", &got_arch, NULL, &err) == EMBER_OK && got_arch &&
          strcmp(got_arch, arch) == 0);
    const int H = c.hidden_size, Hk = c.lin_k_heads, Hv = c.lin_v_heads, Dk = c.lin_k_dim, Dv = c.lin_v_dim,
              K = c.lin_conv_k, r = Hv / Hk, C = 2 * Hk * Dk + Hv * Dv, Z = Hv * Dv;
    CHECK(gx_key_u32(g, arch, "ssm.conv_kernel") == (uint32_t)K && gx_key_u32(g, arch, "ssm.state_size") == (uint32_t)Dk &&
          gx_key_u32(g, arch, "ssm.group_count") == (uint32_t)Hk && gx_key_u32(g, arch, "ssm.time_step_rank") == (uint32_t)Hv &&
          gx_key_u32(g, arch, "ssm.inner_size") == (uint32_t)Z && gx_key_u32(g, arch, "full_attention_interval") == 4 &&
          gx_key_u32(g, arch, "rope.dimension_count") == 8);
    if (!next) {
        char key[160];
        snprintf(key, sizeof key, "%s.rope.dimension_sections", arch);
        int32_t *sec = NULL;
        size_t ns = 0;
        CHECKF(ember_gguf_get_i32s(g, key, &sec, &ns, &err) == EMBER_OK && ns == 4 && sec[0] == 2 && sec[1] == 1 &&
                   sec[2] == 1 && sec[3] == 0,
               "%s: %s is not the config's mrope_section [2, 1, 1, 0]", fam, key);
        free(sec);
    }
    if (moe)
        CHECK(gx_key_u32(g, arch, "expert_count") == (uint32_t)c.n_experts &&
              gx_key_u32(g, arch, "expert_used_count") == (uint32_t)c.n_experts_used &&
              gx_key_u32(g, arch, "expert_feed_forward_length") == (uint32_t)c.moe_intermediate_size &&
              gx_key_u32(g, arch, "expert_shared_feed_forward_length") == (uint32_t)c.shared_expert_size);
    /* layer 0 (linear) */
    const ember_gguf_tensor *qkv = gx_tensor(g, "blk.0.attn_qkv.weight", 2, (const int64_t[]){C, H}),
                            *gate = gx_tensor(g, "blk.0.attn_gate.weight", 2, (const int64_t[]){Z, H}),
                            *conv = gx_tensor(g, "blk.0.ssm_conv1d.weight", 2, (const int64_t[]){C, K}),
                            *a = gx_tensor(g, "blk.0.ssm_a", 1, (const int64_t[]){Hv}),
                            *dt = gx_tensor(g, "blk.0.ssm_dt.bias", 1, (const int64_t[]){Hv}),
                            *out = gx_tensor(g, "blk.0.ssm_out.weight", 2, (const int64_t[]){H, Z}),
                            *sn = gx_tensor(g, "blk.0.ssm_norm.weight", 1, (const int64_t[]){Dv}),
                            *an = gx_tensor(g, "blk.0.attn_norm.weight", 1, (const int64_t[]){H}),
                            *pn = gx_tensor(g, "blk.0.post_attention_norm.weight", 1, (const int64_t[]){H});
    const ember_gguf_tensor *ba = NULL, *beta = NULL, *alpha = NULL;
    if (next)
        ba = gx_tensor(g, "blk.0.ssm_ba.weight", 2, (const int64_t[]){2 * Hv, H});
    else {
        beta = gx_tensor(g, "blk.0.ssm_beta.weight", 2, (const int64_t[]){Hv, H});
        alpha = gx_tensor(g, "blk.0.ssm_alpha.weight", 2, (const int64_t[]){Hv, H});
    }
    /* layer 3 (full attention): q_proj with its gate rows as it is, q/k norms + 1 */
    const ember_gguf_tensor *q3 = gx_tensor(g, "blk.3.attn_q.weight", 2, (const int64_t[]){2 * c.n_heads * c.head_dim, H}),
                            *qn3 = gx_tensor(g, "blk.3.attn_q_norm.weight", 1, (const int64_t[]){c.head_dim});
    const float *hq3 = st_f32(w, "model.layers.3.self_attn.q_proj.weight"),
                *hqn3 = st_f32(w, "model.layers.3.self_attn.q_norm.weight");
    if (q3 && qn3 && hq3 && hqn3) {
        CHECK(!memcmp(q3->data, hq3, q3->nbytes));
        bool ok = true;
        for (int e = 0; e < c.head_dim; e++) ok &= ((const float *)qn3->data)[e] == 1.0f + hqn3[e];
        CHECKF(ok, "%s: attn_q_norm is not 1 + q_norm", fam);
    }
    const float *han = st_f32(w, "model.layers.0.input_layernorm.weight"),
                *hpn = st_f32(w, "model.layers.0.post_attention_layernorm.weight"),
                *hsn = st_f32(w, "model.layers.0.linear_attn.norm.weight"),
                *hA = st_f32(w, "model.layers.0.linear_attn.A_log"), *hdt = st_f32(w, "model.layers.0.linear_attn.dt_bias"),
                *hconv = st_f32(w, "model.layers.0.linear_attn.conv1d.weight"),
                *hout = st_f32(w, "model.layers.0.linear_attn.out_proj.weight");
    if (an && pn && sn && han && hpn && hsn) {
        bool ok = !memcmp(sn->data, hsn, sn->nbytes); /* the gated norm is plain */
        for (int e = 0; e < H; e++)
            ok &= ((const float *)an->data)[e] == 1.0f + han[e] && ((const float *)pn->data)[e] == 1.0f + hpn[e];
        CHECKF(ok, "%s: norms not stored as llama.cpp does", fam);
    }
    if (a && dt && hA && hdt) {
        bool ok = true;
        for (int j = 0; j < Hv; j++) {
            const int h = grouped_of(j, Hk, r, tiled);
            ok &= ((const float *)a->data)[j] == -expf(hA[h]) && ((const float *)dt->data)[j] == hdt[h];
        }
        CHECKF(ok, "%s: ssm_a / ssm_dt are not -exp(A_log) / dt_bias in llama.cpp's head order", fam);
    }
    if (conv && hconv) { /* q, k channels as they are; v channels by head */
        bool ok = true;
        for (int ch = 0; ch < C; ch++) {
            int src = ch;
            if (ch >= 2 * Hk * Dk) {
                const int v = ch - 2 * Hk * Dk;
                src = 2 * Hk * Dk + grouped_of(v / Dv, Hk, r, tiled) * Dv + v % Dv;
            }
            ok &= !memcmp((const float *)conv->data + (size_t)ch * K, hconv + (size_t)src * K, (size_t)K * 4);
        }
        CHECKF(ok, "%s: ssm_conv1d rows are not llama.cpp's", fam);
    }
    if (out && hout) {
        bool ok = true;
        for (int row = 0; row < H; row++)
            for (int col = 0; col < Z; col++)
                ok &= ((const float *)out->data)[(size_t)row * Z + col] ==
                      hout[(size_t)row * Z + grouped_of(col / Dv, Hk, r, tiled) * Dv + col % Dv];
        CHECKF(ok, "%s: ssm_out columns are not llama.cpp's", fam);
    }
    /* the projections: qwen3next splits in_proj_qkvz per key head; qwen35 tiles v and z rows */
    const float *hqkvz = next ? st_f32(w, "model.layers.0.linear_attn.in_proj_qkvz.weight") : NULL,
                *hqkv = next ? NULL : st_f32(w, "model.layers.0.linear_attn.in_proj_qkv.weight"),
                *hz = next ? NULL : st_f32(w, "model.layers.0.linear_attn.in_proj_z.weight");
    if (qkv && gate && (hqkvz || (hqkv && hz))) {
        bool ok = true;
        const int Wg = 2 * Dk + 2 * r * Dv; /* rows of one key head in in_proj_qkvz */
        for (int row = 0; row < C + Z; row++) {
            const float *dst = row < C ? (const float *)qkv->data + (size_t)row * H
                                       : (const float *)gate->data + (size_t)(row - C) * H;
            const float *src;
            if (row < 2 * Hk * Dk) { /* q or k of key head g */
                const int part = row / (Hk * Dk), g2 = row % (Hk * Dk) / Dk, e = row % Dk;
                src = next ? hqkvz + (size_t)(g2 * Wg + part * Dk + e) * H : hqkv + (size_t)row * H;
            } else { /* v (row < C) or z: value head j, element e */
                const int v = row < C ? row - 2 * Hk * Dk : row - C, j = v / Dv, e = v % Dv, h = grouped_of(j, Hk, r, tiled);
                if (next)
                    src = hqkvz + (size_t)((h / r) * Wg + 2 * Dk + (row < C ? 0 : r * Dv) + (h % r) * Dv + e) * H;
                else
                    src = row < C ? hqkv + (size_t)(2 * Hk * Dk + h * Dv + e) * H : hz + (size_t)(h * Dv + e) * H;
            }
            ok &= !memcmp(dst, src, (size_t)H * 4);
        }
        CHECKF(ok, "%s: attn_qkv / attn_gate rows are not llama.cpp's", fam);
    }
    const float *hb = next ? st_f32(w, "model.layers.0.linear_attn.in_proj_ba.weight")
                           : st_f32(w, "model.layers.0.linear_attn.in_proj_b.weight"),
                *ha = next ? NULL : st_f32(w, "model.layers.0.linear_attn.in_proj_a.weight");
    if (next && ba && hb)
        CHECKF(!memcmp(ba->data, hb, ba->nbytes), "qwen3_next: ssm_ba is not in_proj_ba as it is");
    if (!next && beta && alpha && hb && ha) {
        bool ok = true;
        for (int j = 0; j < Hv; j++) {
            const int h = grouped_of(j, Hk, r, tiled);
            ok &= !memcmp((const float *)beta->data + (size_t)j * H, hb + (size_t)h * H, (size_t)H * 4) &&
                  !memcmp((const float *)alpha->data + (size_t)j * H, ha + (size_t)h * H, (size_t)H * 4);
        }
        CHECKF(ok, "%s: ssm_beta / ssm_alpha rows are not llama.cpp's", fam);
    }
    if (moe) { /* stacked experts, f32 router and shared-expert gate even in q8_0 */
        const int64_t E = c.n_experts, Im = c.moe_intermediate_size, Is = c.shared_expert_size;
        const ember_gguf_tensor *ge = gx_tensor(g, "blk.0.ffn_gate_exps.weight", 3, (const int64_t[]){E, Im, H}),
                                *de = gx_tensor(g, "blk.0.ffn_down_exps.weight", 3, (const int64_t[]){E, H, Im});
        gx_tensor(g, "blk.0.ffn_up_exps.weight", 3, (const int64_t[]){E, Im, H});
        gx_tensor(g, "blk.0.ffn_gate_inp.weight", 2, (const int64_t[]){E, H});
        gx_tensor(g, "blk.0.ffn_gate_shexp.weight", 2, (const int64_t[]){Is, H});
        gx_tensor(g, "blk.0.ffn_up_shexp.weight", 2, (const int64_t[]){Is, H});
        gx_tensor(g, "blk.0.ffn_down_shexp.weight", 2, (const int64_t[]){H, Is});
        gx_tensor(g, "blk.0.ffn_gate_inp_shexp.weight", 2, (const int64_t[]){1, H});
        const float *h2 = st_f32(w, "model.layers.0.mlp.experts.2.gate_proj.weight"),
                    *hd3 = st_f32(w, "model.layers.0.mlp.experts.3.down_proj.weight");
        if (ge && de && h2 && hd3)
            CHECK(!memcmp((const float *)ge->data + 2 * Im * H, h2, (size_t)(Im * H) * 4) &&
                  !memcmp((const float *)de->data + 3 * H * Im, hd3, (size_t)(H * Im) * 4));
        char q8[700];
        gguf_path(q8, sizeof q8, fam, "q8_0");
        ember_gguf *g8 = NULL;
        if (CHECKV(ember_gguf_open(q8, &g8, &err) == EMBER_OK, "%s", err.msg)) {
            const ember_gguf_tensor *t1 = ember_gguf_find_tensor(g8, "blk.0.ffn_gate_inp.weight"),
                                    *t2 = ember_gguf_find_tensor(g8, "blk.0.ffn_gate_inp_shexp.weight"),
                                    *t3 = ember_gguf_find_tensor(g8, "blk.0.ssm_conv1d.weight"),
                                    *t4 = ember_gguf_find_tensor(g8, "blk.0.ffn_up_exps.weight");
            CHECK(t1 && t2 && t3 && t4 && t1->dtype == EMBER_F32 && t2->dtype == EMBER_F32 &&
                  t3->dtype == EMBER_F32 && t4->dtype == EMBER_Q8_0);
            ember_gguf_free(g8);
        }
    }
    ember_gguf_free(g);
    ember_weights_free(w);
    fixture_close(&f);
}

static void test_layout(void) {
    for (int i = 0; i < 3; i++) check_layout(k_fams[i]);
}

/* ---- 4: refusals ---- */

static void expect_refused(const char *src, const char *from, const char *to, long long u32, const char *needle) {
    char dst[700];
    snprintf(dst, sizeof dst, "%s/hyb-patched.gguf", EMBER_TEST_TMP);
    if (!CHECKV(fx_patched_copy(src, dst, from, to, u32), "cannot patch %s in %s", from, src)) return;
    ember_model_params mp;
    ember_model_params_init(&mp);
    ember_model *m = NULL;
    ember_error err = {0};
    int rc = ember_model_load(dst, &mp, &m, &err);
    CHECKF(rc != EMBER_OK && strstr(err.msg, needle) && !strchr(err.msg, '\n'),
           "patching %s: expected a refusal naming '%s', got rc %d '%s'", from, needle, rc, err.msg);
    fprintf(stderr, "refused: %s\n", err.msg);
    ember_model_free(m);
}

static void test_refusals(void) {
    char src[700];
    gguf_path(src, sizeof src, "qwen3_5_text", "q8_0");
    expect_refused(src, "qwen35.ssm.conv_kernel", NULL, 0, "ssm.conv_kernel");
    expect_refused(src, "qwen35.ssm.time_step_rank", NULL, 3, "ssm.time_step_rank");
    expect_refused(src, "qwen35.ssm.inner_size", NULL, 63, "ssm.inner_size");
    expect_refused(src, "qwen35.ssm.group_count", "qwen35.ssm.group_cnunt", -1, "qwen35.ssm.group_count");
    expect_refused(src, "blk.1.ssm_out.weight", "blk.1.ssm_oux.weight", -1, "linear_attn.out_proj");
    expect_refused(src, "blk.2.ssm_conv1d.weight", "blk.2.ssm_conv1x.weight", -1, "linear_attn.conv1d");
    gguf_path(src, sizeof src, "qwen3_5_moe_text", "q8_0");
    expect_refused(src, "blk.0.ffn_down_exps.weight", "blk.0.ffn_down_exqs.weight", -1, "blk.0.ffn_down_exps");
}

/* 5: `ember mkmodel` writes a dense hybrid from a config (Qwen3.5's
   separate layout, conv1d [C, 1, K]); it loads, and its F32 GGUF gives its
   logits within 1e-5 (tiled value heads); a MoE hybrid config is refused
   naming the model type. */
static void test_mkmodel(void) {
    char dir[700], gguf[700], cmd[2048];
    snprintf(dir, sizeof dir, "%s/hyb-mk35", EMBER_TEST_TMP);
    snprintf(gguf, sizeof gguf, "%s/hyb-mk35.gguf", EMBER_TEST_TMP);
    snprintf(cmd, sizeof cmd, "%s mkmodel --config %s/fixtures/qwen3_5_text/config.json --out %s --dtype f32 --std 0.1",
             EMBER_BIN, shared_dir(), dir);
    if (!CHECKV(system(cmd) == 0, "%s", cmd)) return;
    ember_error err = {0};
    if (!CHECKV(ember_quantize_to_gguf(dir, gguf, EMBER_QSCHEME_F32, &err) == EMBER_OK, "%s", err.msg)) return;
    fixture f;
    fixture_open(&f, "qwen3_5_text");
    const size_t n = (size_t)(f.p[0].n + f.p[1].n + f.p[2].n) * (size_t)f.vocab;
    float *a = malloc(n * 4), *b = malloc(n * 4);
    if (CHECKV(a && b && fx_prompt_logits(dir, &f, 3, a) == 0 && fx_prompt_logits(gguf, &f, 3, b) == 0, "mkmodel hybrid runs")) {
        float d = 0, mx = 0;
        for (size_t k = 0; k < n; k++) {
            d = fmaxf(d, fabsf(a[k] - b[k]));
            mx = fmaxf(mx, fabsf(a[k]));
        }
        fprintf(stderr, "mkmodel qwen3_5_text f32 GGUF vs directory: max|dlogit| %g (max|logit| %g)\n", d, mx);
        CHECKF(mx > 0 && d <= 1e-5f * mx, "mkmodel hybrid: max|dlogit| %g of %g", d, mx);
    }
    free(a);
    free(b);
    fixture_close(&f);
    snprintf(cmd, sizeof cmd, "%s mkmodel --config %s/fixtures/qwen3_5_moe_text/config.json --out %s-moe 2>&1",
             EMBER_BIN, shared_dir(), dir);
    FILE *p = popen(cmd, "r");
    char out[1024] = {0};
    size_t got = p ? fread(out, 1, sizeof out - 1, p) : 0;
    int rc = p ? pclose(p) : -1;
    CHECKF(got > 0 && rc != 0 && strstr(out, "qwen3_5_moe_text") && strstr(out, "not supported"),
           "mkmodel of a MoE hybrid: rc %d '%s'", rc, out);
}

/* 6: layers that follow no full_attention_interval (linear, full, linear,
   linear) are written as ARCH.attention.recurrent_layers (one flag per
   layer) and read back: the F32 GGUF gives the directory's logits. */
static void test_recurrent_layers(void) {
    char cfgp[700], dir[700], gguf[700], cmd[2048];
    snprintf(cfgp, sizeof cfgp, "%s/hyb-irregular.json", EMBER_TEST_TMP);
    snprintf(dir, sizeof dir, "%s/hyb-irregular", EMBER_TEST_TMP);
    snprintf(gguf, sizeof gguf, "%s/hyb-irregular.gguf", EMBER_TEST_TMP);
    FILE *fp = fopen(cfgp, "w");
    if (!CHECKV(fp != NULL, "cannot write %s", cfgp)) return;
    fprintf(fp, "{\"architectures\": [\"Qwen3_5ForCausalLM\"], \"model_type\": \"qwen3_5_text\", \"vocab_size\": 512,"
                " \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 4, \"num_attention_heads\": 4,"
                " \"num_key_value_heads\": 2, \"head_dim\": 32, \"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-06,"
                " \"layer_types\": [\"linear_attention\", \"full_attention\", \"linear_attention\", \"linear_attention\"],"
                " \"linear_conv_kernel_dim\": 4, \"linear_key_head_dim\": 16, \"linear_value_head_dim\": 16,"
                " \"linear_num_key_heads\": 2, \"linear_num_value_heads\": 4, \"partial_rotary_factor\": 0.25,"
                " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0, \"partial_rotary_factor\": 0.25},"
                " \"tie_word_embeddings\": true, \"hidden_act\": \"silu\"}");
    fclose(fp);
    snprintf(cmd, sizeof cmd, "%s mkmodel --config %s --out %s --dtype f32 --std 0.1", EMBER_BIN, cfgp, dir);
    if (!CHECKV(system(cmd) == 0, "%s", cmd)) return;
    ember_error err = {0};
    if (!CHECKV(ember_quantize_to_gguf(dir, gguf, EMBER_QSCHEME_F32, &err) == EMBER_OK, "%s", err.msg)) return;
    ember_gguf *g = NULL;
    if (CHECKV(ember_gguf_open(gguf, &g, &err) == EMBER_OK, "%s", err.msg)) {
        const ember_gguf_kv *kv = ember_gguf_find_kv(g, "qwen35.attention.recurrent_layers");
        CHECKF(kv && kv->type == EMBER_GGUF_ARRAY && kv->arr_type == EMBER_GGUF_BOOL && kv->arr_len == 4 &&
                   kv->arr_data[0] && !kv->arr_data[1] && kv->arr_data[2] && kv->arr_data[3],
               "qwen35.attention.recurrent_layers is not [1, 0, 1, 1]");
        CHECK(!ember_gguf_find_kv(g, "qwen35.full_attention_interval"));
        CHECK(ember_gguf_find_tensor(g, "blk.1.attn_q.weight") && ember_gguf_find_tensor(g, "blk.3.ssm_out.weight"));
        ember_gguf_free(g);
    }
    fixture f;
    fixture_open(&f, "qwen3_5_text");
    const size_t n = (size_t)(f.p[0].n + f.p[1].n + f.p[2].n) * (size_t)f.vocab;
    float *a = malloc(n * 4), *b = malloc(n * 4);
    if (CHECKV(a && b && fx_prompt_logits(dir, &f, 3, a) == 0 && fx_prompt_logits(gguf, &f, 3, b) == 0, "irregular hybrid runs")) {
        float d = 0, mx = 0;
        for (size_t k = 0; k < n; k++) {
            d = fmaxf(d, fabsf(a[k] - b[k]));
            mx = fmaxf(mx, fabsf(a[k]));
        }
        CHECKF(mx > 0 && d <= 1e-5f * mx, "irregular layers: max|dlogit| %g of %g", d, mx);
    }
    free(a);
    free(b);
    fixture_close(&f);
}

int main(void) {
    shared_dir();
    shared_require("fixtures/qwen3_5_text");
    test_logits();
    test_layout();
    test_refusals();
    test_mkmodel();
    test_recurrent_layers();
    return test_done();
}
