/*
 * gguf_model.c - GGUF files as llama.cpp's converter writes them
 * (architectures llama, mistral as llama, qwen2, qwen3, phi3, gemma2,
 * gemma3, gemma4, qwen3moe, glm4moe, qwen3next, qwen35, qwen35moe) mapped
 * onto the same model config and tensor names as HuggingFace safetensors,
 * so each family's code (llama.c, gemma.c, gemma4.c, qwen3_moe.c,
 * qwen3_next.c) runs both.
 *
 * Metadata (ARCH = general.architecture):
 *   ARCH.embedding_length -> hidden_size, ARCH.block_count -> n_layers,
 *   ARCH.feed_forward_length -> intermediate_size, ARCH.attention.head_count
 *   (_kv) -> heads, ARCH.attention.key_length -> head_dim (default hidden /
 *   heads), ARCH.attention.layer_norm_rms_epsilon, ARCH.context_length ->
 *   max_pos, ARCH.rope.freq_base (default 10000), ARCH.rope.dimension_count
 *   (default head_dim) -> partial rotary factor, ARCH.rope.scaling.type /
 *   .factor / .original_context_length (linear, yarn), tokenizer.ggml.bos /
 *   eos / eot token ids, ARCH.attention.sliding_window (every layer; written
 *   by `ember quantize` for mistral). The vocabulary size is token_embd's row count.
 *   Optional tensors decide biases (blk.0.attn_q.bias, attn_output.bias,
 *   ffn_gate.bias), qwen3's q/k norms (blk.0.attn_q_norm.weight) and tied
 *   embeddings (no output.weight). A rope_freqs.weight tensor (llama 3's
 *   per-dimension frequency divisors) is applied by llama.c.
 *
 * gemma4 (gemma4.c; llama.cpp's converter and loader for Gemma 4): norms
 * stored as they are (plain x * w, no 1 added); attention scale 1;
 * ARCH.attention.sliding_window_pattern (one flag per layer, required,
 * true = sliding) with ARCH.attention.sliding_window; head sizes
 * ARCH.attention.key_length (the full-attention layers') and
 * .key_length_swa (the sliding layers', default key_length), value lengths
 * equal to them; ARCH.attention.head_count_kv and ARCH.feed_forward_length
 * one value or one integer per layer (the KV-shared layers may all be twice
 * as wide: use_double_wide_mlp); ARCH.attention.shared_kv_layers (default
 * 0; each shared layer reads the last earlier non-shared layer of its
 * type); ARCH.embedding_length_per_layer_input (per-layer inputs, 0 or
 * absent: none; the table per_layer_token_embd's rows are their vocabulary);
 * ARCH.final_logit_softcapping (none when absent); ARCH.expert_count (at
 * least 1) / expert_used_count (1 .. expert_count) /
 * expert_feed_forward_length: the MoE block beside the dense MLP on every
 * layer. RoPE: the full layers' is proportional, from rope_freqs.weight
 * ([key_length / 2] f32: a positive divisor per rotated pair, then 1e30 on
 * the pairs at rest; ARCH.rope.dimension_count must be key_length), base
 * ARCH.rope.freq_base; the sliding layers' default RoPE over
 * ARCH.rope.dimension_count_swa dimensions (default key_length_swa), base
 * ARCH.rope.freq_base_swa (default freq_base, as llama.cpp). K = V full
 * layers: the first full layer with K/V of its own has attn_k and no
 * attn_v. Tensors (blk.N.): post_attention_norm, ffn_norm
 * (pre_feedforward_layernorm), post_ffw_norm, pre_ffw_norm_2,
 * post_ffw_norm_1, post_ffw_norm_2, layer_output_scale.weight
 * (layer_scalar), ffn_gate_inp.weight / .scale (router.proj / router.scale),
 * ffn_down_exps.scale (router.per_expert_scale), ffn_gate_up_exps [E, 2I, H]
 * (gate rows, then up; or ffn_gate_exps and ffn_up_exps apart) and
 * ffn_down_exps [E, H, I], inp_gate / proj / post_norm (the per-layer input
 * gate, projection and norm); per_layer_token_embd, per_layer_model_proj,
 * per_layer_proj_norm.
 *
 * gemma2 / gemma3: ARCH.attn_logit_softcapping and ARCH.final_logit_softcapping
 * (defaults 50 / 30 for gemma2, none for gemma3, as llama.cpp),
 * ARCH.attention.sliding_window on the sliding layers: every other layer
 * (gemma2) or 5 of 6 (gemma3), or ARCH.attention.sliding_window_pattern (a
 * period, or one flag per layer, bool or integer, true = sliding, as
 * llama.cpp writes it for gemma4; `ember quantize` writes the bools when the
 * layers follow no period). The attention scale is
 * ARCH.attention.scale when present, else llama.cpp's rule: head_dim^-0.5,
 * (hidden / heads)^-0.5 for the 27B models. gemma3's sliding layers use
 * ARCH.rope.freq_base_swa (default 10000) without scaling. The converter
 * stores Gemma norm weights with the 1 of x * (1 + w) added, so they are
 * used as they are (ember_llm.norm_plus_one false).
 * phi3: fused blk.N.attn_qkv and blk.N.ffn_up (gate rows, then up rows), as
 * HF's qkv_proj and gate_up_proj; the sliding window on every layer.
 *
 * qwen3next / qwen35 / qwen35moe (hybrid linear attention, qwen3_next.c):
 *   ARCH.ssm.conv_kernel -> lin_conv_k, .ssm.state_size -> lin_k_dim,
 *   .ssm.group_count -> lin_k_heads, .ssm.time_step_rank -> lin_v_heads,
 *   .ssm.inner_size / time_step_rank -> lin_v_dim; recurrent layers from
 *   ARCH.attention.recurrent_layers (one flag per layer) or
 *   ARCH.full_attention_interval (default 4); ARCH.rope.dimension_sections
 *   (qwen35: M-RoPE, plain partial RoPE for text) must sum to half of
 *   rope.dimension_count; ARCH.expert_count / expert_used_count /
 *   expert_feed_forward_length / expert_shared_feed_forward_length (the
 *   shared expert's width defaults to feed_forward_length, as llama.cpp);
 *   the top-k is always renormalised; ARCH.nextn_predict_layers MTP blocks
 *   at the end of block_count are not run and their tensors are ignored.
 *   Tensors (blk.N.): attn_qkv / attn_gate (in_proj_qkv / in_proj_z),
 *   ssm_beta / ssm_alpha (in_proj_b / a) or qwen3next's fused ssm_ba,
 *   ssm_conv1d [C, K], ssm_dt.bias, ssm_a (holds -exp(A_log)), ssm_norm,
 *   ssm_out, post_attention_norm, ffn_gate_inp (router),
 *   ffn_{gate,up,down}_exps (stacked [E, rows, cols]: blocks.c),
 *   ffn_{gate,up,down}_shexp, ffn_gate_inp_shexp. The converter's
 *   transforms are undone in qwen3_next.c: norms stored as 1 + w (except
 *   ssm_norm), ssm_a used as is, and for qwen35 / qwen35moe the value heads
 *   in llama.cpp's tiled order (cfg.lin_v_tiled: the delta_net op pairs
 *   value head h with key head h % Hk; rows and columns are not moved).
 *
 * qwen3moe / glm4moe (mixture of experts, qwen3_moe.c): ARCH.expert_count,
 *   expert_used_count (at most expert_count), expert_feed_forward_length
 *   (qwen3moe: default feed_forward_length / expert_used_count, as
 *   llama.cpp); qwen3moe routes by softmax, always renormalised, every layer
 *   MoE. glm4moe: expert_shared_count (a shared expert of that many times the
 *   experts' width), leading_dense_block_count (dense first layers, default
 *   0), expert_gating_func (2 = sigmoid, also when absent; others refused),
 *   expert_weights_norm (default false, as llama.cpp), expert_weights_scale
 *   (0 or absent: 1), nextn_predict_layers MTP blocks at the end of
 *   block_count not run and their tensors (blk.N.nextn.* and the block's
 *   own) ignored. Neither has expert groups (llama.cpp ignores
 *   expert_group_count here, so does Ember). Tensors (blk.N.): ffn_norm
 *   (qwen3moe) or post_attention_norm (glm4moe) for post_attention_layernorm,
 *   ffn_gate_inp (router), ffn_{gate,up,down}_exps (stacked [E, rows, cols]),
 *   exp_probs_b.bias (e_score_correction_bias), ffn_{gate,up,down}_shexp,
 *   and ffn_{gate,up,down} on glm4moe's dense layers.
 *
 * RoPE layout: llama.cpp's converter permutes llama Q/K rows so that llama
 * GGUFs rotate interleaved pairs; the other architectures keep HF's NEOX
 * halves.
 *
 * Ownership: pure functions over a parsed, validated ember_gguf (gguf.h).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/arch.h"
#include "model.h"
#include "core/alloc.h"

/* The gemma2 / gemma3 keys (see the top of the file); cfg's dimensions and
   RoPE are set. */
static int gemma_config(const ember_gguf *f, const char *arch, int window, ember_model_config *cfg, ember_error *err) {
    const bool g2 = strcmp(arch, "gemma2") == 0;
    char key[160];
    int rc;
#define KEY(s) (snprintf(key, sizeof key, "%s.%s", arch, s), key)
    cfg->act = EMBER_ACT_GELU_TANH;
    cfg->attn_softcap = g2 ? 50.0f : 0.0f;
    cfg->final_softcap = g2 ? 30.0f : 0.0f;
    float v;
    if (ember_gguf_find_kv(f, KEY("attn_logit_softcapping"))) {
        if ((rc = ember_gguf_get_f32(f, key, &v, err))) return rc;
        cfg->attn_softcap = v;
    }
    if (ember_gguf_find_kv(f, KEY("final_logit_softcapping"))) {
        if ((rc = ember_gguf_get_f32(f, key, &v, err))) return rc;
        cfg->final_softcap = v;
    }
    if (!(cfg->attn_softcap >= 0 && cfg->attn_softcap < 1e6f) || !(cfg->final_softcap >= 0 && cfg->final_softcap < 1e6f))
        return ember_err(err, EMBER_ERR_FORMAT, "%s: soft-capping values out of range", f->path);
    /* the attention scale: llama.cpp's rule unless stored */
    const bool big = cfg->n_layers == (g2 ? 46 : 62); /* the 27B models */
    cfg->query_pre_attn_scalar = big ? (float)(cfg->hidden_size / cfg->n_heads) : (float)cfg->head_dim;
    if (ember_gguf_find_kv(f, KEY("attention.scale"))) {
        if ((rc = ember_gguf_get_f32(f, key, &v, err))) return rc;
        if (!(v > 1e-6f && v < 1e6f)) return ember_err(err, EMBER_ERR_FORMAT, "%s: attention.scale out of range", f->path);
        cfg->query_pre_attn_scalar = (float)(1.0 / ((double)v * (double)v));
    }
    /* sliding layers: a period, or one flag per layer (bools as llama.cpp writes them, or integers) */
    int period = g2 ? 2 : 6;
    int32_t *flags = NULL;
    size_t n_flags = 0;
    const ember_gguf_kv *kv = ember_gguf_find_kv(f, KEY("attention.sliding_window_pattern"));
    if (kv && kv->type == EMBER_GGUF_ARRAY && kv->arr_type == EMBER_GGUF_BOOL) {
        n_flags = kv->arr_len;
        if (n_flags == (size_t)cfg->n_layers && kv->arr_bytes == n_flags) {
            flags = ember_malloc(n_flags * sizeof *flags + 1);
            if (!flags) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
            for (size_t i = 0; i < n_flags; i++) flags[i] = kv->arr_data[i] != 0;
        }
    } else if (kv && kv->type == EMBER_GGUF_ARRAY) {
        if ((rc = ember_gguf_get_i32s(f, key, &flags, &n_flags, err))) return rc;
    } else if (kv) {
        uint32_t u;
        if ((rc = ember_gguf_get_u32(f, key, &u, err))) return rc;
        if (u < 1 || u > (uint32_t)EMBER_MAX_LAYERS)
            return ember_err(err, EMBER_ERR_FORMAT, "%s: %s %u out of range", f->path, key, u);
        period = (int)u;
    }
    if (kv && kv->type == EMBER_GGUF_ARRAY && (!flags || n_flags != (size_t)cfg->n_layers)) {
        free(flags);
        return ember_err(err, EMBER_ERR_FORMAT, "%s: %s has %zu entries for %d layers", f->path, key, n_flags,
                         cfg->n_layers);
    }
    for (int i = 0; i < cfg->n_layers; i++) {
        bool sliding = flags ? flags[i] != 0 : (i + 1) % period != 0;
        cfg->layer_sliding[i] = sliding && window > 0;
        cfg->layer_window[i] = sliding ? window : 0;
    }
    free(flags);
    if (!g2) { /* gemma3: the sliding layers' RoPE, unscaled */
        ember_rope_config *l = &cfg->rope_local;
        *l = cfg->rope;
        l->type = EMBER_ROPE_DEFAULT;
        l->factor = 1.0;
        l->theta = 10000.0;
        if (ember_gguf_find_kv(f, KEY("rope.freq_base_swa"))) {
            if ((rc = ember_gguf_get_f32(f, key, &v, err))) return rc;
            if (!(v > 1e-3f && v < 1e12f))
                return ember_err(err, EMBER_ERR_FORMAT, "%s: rope.freq_base_swa out of range", f->path);
            l->theta = v;
        }
    }
#undef KEY
    return EMBER_OK;
}

/* One u32 key as an int in [lo, hi] (def when absent and not required). */
static int get_int_key(const ember_gguf *f, const char *key, bool required, int def, int lo, int hi, int *out,
                       ember_error *err) {
    *out = def;
    if (!ember_gguf_find_kv(f, key)) {
        if (required) return ember_err(err, EMBER_ERR_FORMAT, "%s: missing key '%s'", f->path, key);
        return EMBER_OK;
    }
    uint32_t u;
    int rc = ember_gguf_get_u32(f, key, &u, err);
    if (rc) return rc;
    if (u < (uint32_t)lo || u > (uint32_t)hi)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: %s %u out of range [%d, %d]", f->path, key, u, lo, hi);
    *out = (int)u;
    return EMBER_OK;
}

/* The mixture-of-experts keys of qwen3moe and glm4moe (see the top of the
   file), read as llama.cpp reads them; cfg's dimensions are set. */
static int moe_config(const ember_gguf *f, const char *arch, ember_model_config *cfg, ember_error *err) {
    const bool glm = strcmp(arch, "glm4moe") == 0;
    char key[160];
    int rc, dense = 0, gating = 0;
#define KEY(s) (snprintf(key, sizeof key, "%s.%s", arch, s), key)
    if ((rc = get_int_key(f, KEY("expert_count"), true, 0, 1, 1 << 16, &cfg->n_experts, err)) ||
        (rc = get_int_key(f, KEY("expert_used_count"), true, 0, 1, cfg->n_experts, &cfg->n_experts_used, err)))
        return rc;
    /* qwen3moe: the experts' width defaults to feed_forward_length / top-k (llama.cpp); glm4moe needs it */
    const int def_ff = cfg->intermediate_size / cfg->n_experts_used;
    if ((rc = get_int_key(f, KEY("expert_feed_forward_length"), glm || def_ff < 1, def_ff, 1, 1 << 22,
                          &cfg->moe_intermediate_size, err)))
        return rc;
    cfg->n_group = cfg->topk_group = 1; /* llama.cpp's qwen3moe / glm4moe have no expert groups */
    cfg->routed_scale = 1.0f;
    cfg->norm_topk_prob = !glm; /* qwen3moe: always renormalised; glm4moe: llama.cpp's default, false */
    if (glm) {
        if ((rc = get_int_key(f, KEY("expert_shared_count"), true, 0, 0, 64, &cfg->n_shared_experts, err)) ||
            (rc = get_int_key(f, KEY("leading_dense_block_count"), false, 0, 0, cfg->n_layers, &dense, err)) ||
            (rc = get_int_key(f, KEY("expert_gating_func"), false, 0, 0, 1 << 16, &gating, err)))
            return rc;
        if (gating != 0 && gating != 2) /* 0: unset, sigmoid for glm4moe as in llama.cpp; 1 softmax, 2 sigmoid */
            return ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: %s %d is not supported (glm4moe routes with 2, sigmoid)",
                             f->path, key, gating);
        cfg->router_sigmoid = true;
        if (ember_gguf_find_kv(f, KEY("expert_weights_norm")) &&
            (rc = ember_gguf_get_bool(f, key, &cfg->norm_topk_prob, err)))
            return rc;
        if (ember_gguf_find_kv(f, KEY("expert_weights_scale"))) {
            float v;
            if ((rc = ember_gguf_get_f32(f, key, &v, err))) return rc;
            if (!(v >= 0 && v < 1e6f)) return ember_err(err, EMBER_ERR_FORMAT, "%s: %s out of range", f->path, key);
            if (v != 0) cfg->routed_scale = v; /* 0: none, as llama.cpp */
        }
    }
#undef KEY
    for (int l = 0; l < cfg->n_layers; l++) cfg->layer_moe[l] = l >= dense;
    return EMBER_OK;
}

/* The hybrid keys (qwen3next, qwen35, qwen35moe; see the top of the file);
   cfg's dimensions and RoPE are set. */
static int hybrid_config(const ember_gguf *f, const char *arch, int n_rot, ember_model_config *cfg, ember_error *err) {
    char key[160];
    int rc, inner, interval;
#define KEY(s) (snprintf(key, sizeof key, "%s.%s", arch, s), key)
    if ((rc = get_int_key(f, KEY("ssm.conv_kernel"), true, 0, 1, 64, &cfg->lin_conv_k, err)) ||
        (rc = get_int_key(f, KEY("ssm.state_size"), true, 0, 1, 4096, &cfg->lin_k_dim, err)) ||
        (rc = get_int_key(f, KEY("ssm.group_count"), true, 0, 1, 4096, &cfg->lin_k_heads, err)) ||
        (rc = get_int_key(f, KEY("ssm.time_step_rank"), true, 0, 1, 4096, &cfg->lin_v_heads, err)) ||
        (rc = get_int_key(f, KEY("ssm.inner_size"), true, 0, 1, 1 << 22, &inner, err)) ||
        (rc = get_int_key(f, KEY("full_attention_interval"), false, 4, 1, EMBER_MAX_LAYERS, &interval, err)))
        return rc;
    if (cfg->lin_v_heads % cfg->lin_k_heads)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: %s.ssm.time_step_rank %d is not a multiple of ssm.group_count %d",
                         f->path, arch, cfg->lin_v_heads, cfg->lin_k_heads);
    if (inner % cfg->lin_v_heads)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: %s.ssm.inner_size %d is not a multiple of ssm.time_step_rank %d",
                         f->path, arch, inner, cfg->lin_v_heads);
    cfg->lin_v_dim = inner / cfg->lin_v_heads;
    cfg->lin_v_tiled = strcmp(arch, "qwen3next") != 0; /* the converter reorders qwen35's value heads */
    /* which layers are recurrent: one flag per layer, else every interval-th layer is full attention */
    const ember_gguf_kv *kv = ember_gguf_find_kv(f, KEY("attention.recurrent_layers"));
    if (kv) {
        int32_t *flags = NULL;
        size_t n = 0;
        if (kv->type == EMBER_GGUF_ARRAY && kv->arr_type == EMBER_GGUF_BOOL && kv->arr_bytes == kv->arr_len) {
            n = kv->arr_len;
            flags = ember_malloc(n * sizeof *flags + 1);
            if (!flags) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
            for (size_t i = 0; i < n; i++) flags[i] = kv->arr_data[i] != 0;
        } else if ((rc = ember_gguf_get_i32s(f, key, &flags, &n, err))) {
            return rc;
        }
        if (n < (size_t)cfg->n_layers) {
            free(flags);
            return ember_err(err, EMBER_ERR_FORMAT, "%s: %s has %zu entries for %d layers", f->path, key, n,
                             cfg->n_layers);
        }
        for (int l = 0; l < cfg->n_layers; l++) cfg->layer_linear[l] = flags[l] != 0;
        free(flags);
    } else {
        for (int l = 0; l < cfg->n_layers; l++) cfg->layer_linear[l] = (l + 1) % interval != 0;
    }
    ember_config_hybrid_layers(cfg);
    /* M-RoPE sections (qwen35): text positions make it plain partial RoPE; they must still fit */
    kv = ember_gguf_find_kv(f, KEY("rope.dimension_sections"));
    if (kv) {
        int32_t *sec = NULL;
        size_t n = 0;
        if ((rc = ember_gguf_get_i32s(f, key, &sec, &n, err))) return rc;
        long long sum = 0;
        bool ok = n <= 4;
        for (size_t i = 0; ok && i < n; i++) {
            ok = sec[i] >= 0 && sec[i] <= 4096;
            sum += sec[i];
        }
        free(sec);
        if (!ok || sum * 2 != n_rot)
            return ember_err(err, EMBER_ERR_FORMAT, "%s: %s must be at most 4 sections summing to %d (half the rotated "
                             "dimensions)", f->path, key, n_rot / 2);
    }
    if (!ember_gguf_find_kv(f, KEY("expert_count"))) return EMBER_OK;
    if ((rc = get_int_key(f, key, true, 0, 1, 1 << 16, &cfg->n_experts, err)) ||
        (rc = get_int_key(f, KEY("expert_used_count"), true, 0, 1, cfg->n_experts, &cfg->n_experts_used, err)) ||
        (rc = get_int_key(f, KEY("expert_feed_forward_length"), true, 0, 1, 1 << 22, &cfg->moe_intermediate_size,
                          err)) ||
        (rc = get_int_key(f, KEY("expert_shared_feed_forward_length"), false, cfg->intermediate_size, 0, 1 << 22,
                          &cfg->shared_expert_size, err)))
        return rc;
#undef KEY
    cfg->norm_topk_prob = true; /* llama.cpp renormalises these architectures' top-k */
    cfg->routed_scale = 1.0f;
    cfg->n_group = cfg->topk_group = 1;
    for (int l = 0; l < cfg->n_layers; l++) cfg->layer_moe[l] = true;
    return EMBER_OK;
}

/* gemma4's per-layer integers (see the top of the file): a u32 or bool
   scalar (every layer), or an array of bools or integers of exactly
   n_layers entries, each in [lo, hi], into out[0 .. n_layers); def for
   every layer when the key is absent (def < 0: required). */
static int get_layer_ints(const ember_gguf *f, const char *key, int n_layers, int def, int lo, int hi, int *out,
                          ember_error *err) {
    const ember_gguf_kv *kv = ember_gguf_find_kv(f, key);
    if (!kv && def < 0) return ember_err(err, EMBER_ERR_FORMAT, "%s: missing key '%s'", f->path, key);
    int rc;
    if (!kv) {
        for (int l = 0; l < n_layers; l++) out[l] = def;
    } else if (kv->type == EMBER_GGUF_ARRAY && kv->arr_type == EMBER_GGUF_BOOL) {
        if (kv->arr_len != (size_t)n_layers || kv->arr_bytes != kv->arr_len)
            return ember_err(err, EMBER_ERR_FORMAT, "%s: %s has %zu entries for %d layers", f->path, key, kv->arr_len,
                             n_layers);
        for (int l = 0; l < n_layers; l++) out[l] = kv->arr_data[l] != 0;
    } else if (kv->type == EMBER_GGUF_ARRAY) {
        int32_t *v = NULL;
        size_t n = 0;
        if ((rc = ember_gguf_get_i32s(f, key, &v, &n, err))) return rc;
        if (n != (size_t)n_layers) {
            free(v);
            return ember_err(err, EMBER_ERR_FORMAT, "%s: %s has %zu entries for %d layers", f->path, key, n, n_layers);
        }
        for (int l = 0; l < n_layers; l++) out[l] = v[l];
        free(v);
    } else if (kv->type == EMBER_GGUF_BOOL) {
        for (int l = 0; l < n_layers; l++) out[l] = kv->u64 != 0;
    } else {
        uint32_t u;
        if ((rc = ember_gguf_get_u32(f, key, &u, err))) return rc;
        for (int l = 0; l < n_layers; l++) out[l] = u > (uint32_t)INT32_MAX ? -1 : (int)u;
    }
    for (int l = 0; l < n_layers; l++)
        if (out[l] < lo || out[l] > hi)
            return ember_err(err, EMBER_ERR_FORMAT, "%s: %s %d (layer %d) out of range [%d, %d]", f->path, key, out[l],
                             l, lo, hi);
    return EMBER_OK;
}

/* A u32 key, or where per_layer (gemma4) the first entry of an integer
   array, its per-layer form (gemma4_config reads all of them). */
static int get_u32_or_first(const ember_gguf *f, const char *key, bool per_layer, uint32_t *u, ember_error *err) {
    const ember_gguf_kv *kv = ember_gguf_find_kv(f, key);
    if (!per_layer || !kv || kv->type != EMBER_GGUF_ARRAY) return ember_gguf_get_u32(f, key, u, err);
    int32_t *w = NULL;
    size_t n = 0;
    int rc = ember_gguf_get_i32s(f, key, &w, &n, err);
    if (rc) return rc;
    *u = n && w[0] > 0 ? (uint32_t)w[0] : 0;
    free(w);
    return EMBER_OK;
}

/* gemma4's RoPE (see the top of the file): proportional on the full
   layers, from rope_freqs.weight (llama.cpp's form: factor 1 on the
   rotated pairs, 1e30 or more on the pairs at rest, which must come
   last); default on the sliding layers, partial by rope.dimension_count_swa,
   base rope.freq_base_swa. Dg, Ds: the head sizes of the two kinds. */
static int gemma4_rope(const ember_gguf *f, const char *arch, int n_rot, int Dg, int Ds, bool any_full,
                       ember_model_config *cfg, ember_error *err) {
    char key[160];
    int rc;
#define KEY(s) (snprintf(key, sizeof key, "%s.%s", arch, s), key)
    ember_rope_config *r = &cfg->rope, *l = &cfg->rope_local;
    if (r->type != EMBER_ROPE_DEFAULT)
        return ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: %s.rope.scaling.type is not supported for gemma4", f->path,
                         arch);
    *l = *r;
    if (ember_gguf_find_kv(f, KEY("rope.freq_base_swa"))) { /* llama.cpp's default: rope.freq_base */
        float v;
        if ((rc = ember_gguf_get_f32(f, key, &v, err))) return rc;
        if (!(v > 1e-3f && v < 1e12f)) return ember_err(err, EMBER_ERR_FORMAT, "%s: %s out of range", f->path, key);
        l->theta = v;
    }
    int rot_swa = Ds;
    if ((rc = get_int_key(f, KEY("rope.dimension_count_swa"), false, Ds, 2, Ds, &rot_swa, err))) return rc;
    if (rot_swa % 2) return ember_err(err, EMBER_ERR_FORMAT, "%s: %s %d is odd", f->path, key, rot_swa);
    l->partial_rotary_factor = (double)rot_swa / Ds;
    if (!any_full) return EMBER_OK;
    if (n_rot != Dg) /* llama.cpp pairs dimension i with i + n_rot / 2: proportional RoPE needs the whole head */
        return ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: %s.rope.dimension_count %d differs from the full layers' head "
                         "size %d", f->path, arch, n_rot, Dg);
    const ember_gguf_tensor *t = ember_gguf_find_tensor(f, "rope_freqs.weight");
    if (!t) return ember_err(err, EMBER_ERR_FORMAT, "%s: missing tensor 'rope_freqs.weight'", f->path);
    if (t->dtype != EMBER_F32 || t->ndim != 1 || t->nelem != (size_t)Dg / 2)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: rope_freqs.weight must be f32 [%d]", f->path, Dg / 2);
    int angles = 0;
    for (int i = 0; i < Dg / 2; i++) {
        float v;
        memcpy(&v, t->data + 4 * (size_t)i, 4);
        const bool rest = v >= 1e30f;
        if (!(v > 0) || (!rest && angles < i))
            return ember_err(err, EMBER_ERR_FORMAT, "%s: rope_freqs.weight[%d] is %g: the rotated pairs (positive "
                             "factors) must come first, the pairs at rest (1e30) last", f->path, i, (double)v);
        if (!rest) angles = i + 1;
    }
    if (angles < 1) return ember_err(err, EMBER_ERR_FORMAT, "%s: rope_freqs.weight rotates no pair", f->path);
    r->type = EMBER_ROPE_PROPORTIONAL;
    r->factor = 1.0; /* model.c divides by the stored factors */
    r->partial_rotary_factor = (angles + 0.5) / (Dg / 2.0); /* rope.c rotates floor(factor * Dg / 2) = angles pairs */
#undef KEY
    return EMBER_OK;
}

/* The gemma4 keys and layout (see the top of the file); cfg's common
   dimensions are set (head_dim from key_length: the full layers'). */
static int gemma4_config(const ember_gguf *f, const char *arch, int n_rot, int window, ember_model_config *cfg,
                         ember_error *err) {
    char key[160];
    int rc;
    const int L = cfg->n_layers;
#define KEY(s) (snprintf(key, sizeof key, "%s.%s", arch, s), key)
    cfg->act = EMBER_ACT_GELU_TANH;
    cfg->qk_norm = true;
    cfg->attn_softcap = 0.0f;
    cfg->query_pre_attn_scalar = 0.0f; /* unused: gemma4 scores are not scaled */
    if (ember_gguf_find_kv(f, KEY("final_logit_softcapping"))) {
        float v;
        if ((rc = ember_gguf_get_f32(f, key, &v, err))) return rc;
        if (!(v >= 0 && v < 1e6f)) return ember_err(err, EMBER_ERR_FORMAT, "%s: %s out of range", f->path, key);
        cfg->final_softcap = v;
    }
    int *v = ember_malloc((size_t)L * sizeof *v);
    if (!v) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    /* sliding layers: one flag per layer */
    bool any_full = false, any_sliding = false;
    if ((rc = get_layer_ints(f, KEY("attention.sliding_window_pattern"), L, -1, 0, 1, v, err))) goto done;
    for (int l = 0; l < L; l++) {
        cfg->layer_sliding[l] = v[l] != 0;
        cfg->layer_window[l] = v[l] ? window : 0;
        any_full |= !v[l];
        any_sliding |= v[l] != 0;
    }
    if (any_sliding && window < 1) {
        rc = ember_err(err, EMBER_ERR_FORMAT, "%s: missing key '%s.attention.sliding_window'", f->path, arch);
        goto done;
    }
    /* head sizes: key_length the full layers', key_length_swa the sliding layers'; values as long */
    const int Dg = cfg->head_dim;
    int Ds = Dg, vl = Dg, vls;
    if ((rc = get_int_key(f, KEY("attention.key_length_swa"), false, Dg, 2, 4096, &Ds, err)) ||
        (rc = get_int_key(f, KEY("attention.value_length"), false, Dg, 1, 4096, &vl, err)) ||
        (rc = get_int_key(f, KEY("attention.value_length_swa"), false, Ds, 1, 4096, &vls, err)))
        goto done;
    if (Ds % 2 || vl != Dg || vls != Ds) {
        rc = ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: head sizes %d / %d (key) and %d / %d (value, full / sliding) "
                       "are not supported (even, keys as long as values)", f->path, Dg, Ds, vl, vls);
        goto done;
    }
    cfg->head_dim = Ds;
    for (int l = 0; l < L; l++) cfg->layer_head_dim[l] = cfg->layer_sliding[l] ? Ds : Dg;
    /* KV heads: one count or one per layer */
    if ((rc = get_layer_ints(f, KEY("attention.head_count_kv"), L, cfg->n_heads, 1, 4096, v, err))) goto done;
    cfg->n_kv_heads = v[0];
    for (int l = 0; l < L; l++) {
        if (cfg->n_heads % v[l]) {
            rc = ember_err(err, EMBER_ERR_FORMAT, "%s: %s: layer %d has %d KV heads for %d heads", f->path, key, l, v[l],
                           cfg->n_heads);
            goto done;
        }
        cfg->layer_kv_heads[l] = v[l];
    }
    /* KV sharing: the last shared_kv_layers layers read the last earlier non-shared layer of their type */
    if ((rc = get_int_key(f, KEY("attention.shared_kv_layers"), false, 0, 0, L - 1, &cfg->n_kv_shared, err))) goto done;
    const int first = L - cfg->n_kv_shared;
    for (int l = first; l < L; l++) {
        int src = -1;
        for (int j = first - 1; j >= 0 && src < 0; j--)
            if (cfg->layer_sliding[j] == cfg->layer_sliding[l]) src = j;
        if (src < 0 || cfg->layer_kv_heads[src] != cfg->layer_kv_heads[l]) {
            rc = ember_err(err, EMBER_ERR_FORMAT, "%s: %s.attention.shared_kv_layers %d: layer %d (%s) has no earlier "
                           "layer of its type with its KV heads to share K/V with", f->path, arch, cfg->n_kv_shared, l,
                           cfg->layer_sliding[l] ? "sliding" : "full attention");
            goto done;
        }
        cfg->layer_kv_src[l] = src;
    }
    /* MLP widths: one, or one per layer with the KV-shared layers twice as wide (use_double_wide_mlp) */
    if ((rc = get_layer_ints(f, KEY("feed_forward_length"), L, -1, 1, 1 << 22, v, err))) goto done;
    cfg->intermediate_size = v[0];
    cfg->double_wide_mlp = first < L && v[first] == 2 * v[0];
    for (int l = 0; l < L; l++)
        if (v[l] != ember_cfg_intermediate(cfg, l)) {
            rc = ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: %s: layer %d is %d wide, layer 0 %d (only the KV-shared "
                           "layers may differ, all of them twice as wide)", f->path, key, l, v[l], v[0]);
            goto done;
        }
    /* K = V: the first full layer with K/V of its own has attn_k and no attn_v */
    for (int l = 0; l < first; l++) {
        if (cfg->layer_sliding[l]) continue;
        char tk[64], tv[64];
        snprintf(tk, sizeof tk, "blk.%d.attn_k.weight", l);
        snprintf(tv, sizeof tv, "blk.%d.attn_v.weight", l);
        cfg->attn_k_eq_v = ember_gguf_find_tensor(f, tk) && !ember_gguf_find_tensor(f, tv);
        break;
    }
    /* per-layer inputs: the table's rows are the token ids it covers */
    if ((rc = get_int_key(f, KEY("embedding_length_per_layer_input"), false, 0, 0, 1 << 16, &cfg->ple_dim, err)))
        goto done;
    if (cfg->ple_dim) {
        const ember_gguf_tensor *t = ember_gguf_find_tensor(f, "per_layer_token_embd.weight");
        if (!t || t->ndim != 2) {
            rc = ember_err(err, EMBER_ERR_FORMAT, "%s: missing 2-D tensor 'per_layer_token_embd.weight' (%s %d)",
                           f->path, key, cfg->ple_dim);
            goto done;
        }
        if (t->shape[0] < cfg->vocab_size || t->shape[0] > (1 << 24)) {
            rc = ember_err(err, EMBER_ERR_FORMAT, "%s: per_layer_token_embd.weight has %lld rows for %d tokens",
                           f->path, (long long)t->shape[0], cfg->vocab_size);
            goto done;
        }
        cfg->ple_vocab = (int)t->shape[0];
    }
    /* the MoE block beside the dense MLP, on every layer */
    if (ember_gguf_find_kv(f, KEY("expert_count"))) {
        if ((rc = get_int_key(f, key, true, 0, 1, 1 << 16, &cfg->n_experts, err)) ||
            (rc = get_int_key(f, KEY("expert_used_count"), true, 0, 1, cfg->n_experts, &cfg->n_experts_used, err)) ||
            (rc = get_int_key(f, KEY("expert_feed_forward_length"), true, 0, 1, 1 << 22, &cfg->moe_intermediate_size,
                              err)))
            goto done;
        cfg->moe_beside_mlp = true;
        cfg->norm_topk_prob = true; /* the router renormalises its top k */
        cfg->n_group = cfg->topk_group = 1;
        cfg->routed_scale = 1.0f;
        for (int l = 0; l < L; l++) cfg->layer_moe[l] = true;
    }
    rc = gemma4_rope(f, arch, n_rot, Dg, Ds, any_full, cfg, err);
done:
#undef KEY
    free(v);
    return rc;
}

int ember_gguf_model_config(const ember_gguf *f, ember_model_config *cfg, ember_rope_mode *mode, ember_error *err) {
    memset(cfg, 0, sizeof *cfg);
    cfg->bos_id = -1;
    const char *arch;
    int rc = ember_gguf_get_str(f, "general.architecture", &arch, NULL, err);
    if (rc) return rc;
    const ember_arch *row = ember_arch_find_gguf(arch);
    if (!row) {
        char list[256];
        return ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: architecture '%.32s' is not supported (supported: %s)",
                         f->path, arch, ember_arch_list(true, list, sizeof list));
    }
    const bool g4 = row->family == EMBER_FAMILY_GEMMA4;
    const bool hybrid = row->family == EMBER_FAMILY_HYBRID;
    const bool gemma = row->family == EMBER_FAMILY_GEMMA;
    const bool moe = row->family == EMBER_FAMILY_QWEN3_MOE;
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", row->model_type);
    *mode = row->rope_interleaved ? EMBER_ROPE_INTERLEAVED : EMBER_ROPE_NEOX;
    char key[160];
#define KEY(s) (snprintf(key, sizeof key, "%s.%s", arch, s), key)
    uint32_t u;
    if ((rc = ember_gguf_get_u32(f, KEY("embedding_length"), &u, err))) return rc;
    cfg->hidden_size = (int)(u > 1u << 20 ? 0 : u);
    if ((rc = ember_gguf_get_u32(f, KEY("block_count"), &u, err))) return rc;
    if ((hybrid || moe) && ember_gguf_find_kv(f, KEY("nextn_predict_layers"))) { /* MTP blocks after the decoder's: not run */
        uint32_t mtp;
        if ((rc = ember_gguf_get_u32(f, key, &mtp, err))) return rc;
        if (mtp >= u) return ember_err(err, EMBER_ERR_FORMAT, "%s: %s %u for %u blocks", f->path, key, mtp, u);
        cfg->n_mtp_layers = (int)mtp;
        u -= mtp;
    }
    cfg->n_layers = (int)(u > EMBER_MAX_LAYERS ? 0 : u);
    /* a MoE model needs no dense width: the experts' stands in when the key is absent */
    const bool ffn_from_experts = (hybrid || moe) && !ember_gguf_find_kv(f, KEY("feed_forward_length")) &&
                                  ember_gguf_find_kv(f, KEY("expert_count"));
    if ((rc = get_u32_or_first(f, KEY(ffn_from_experts ? "expert_feed_forward_length" : "feed_forward_length"), g4, &u,
                               err)))
        return rc;
    cfg->intermediate_size = (int)(u > 1u << 22 ? 0 : u);
    if ((rc = ember_gguf_get_u32(f, KEY("attention.head_count"), &u, err))) return rc;
    cfg->n_heads = (int)(u > 4096 ? 0 : u);
    cfg->n_kv_heads = cfg->n_heads;
    if (ember_gguf_find_kv(f, KEY("attention.head_count_kv"))) {
        if ((rc = get_u32_or_first(f, key, g4, &u, err))) return rc;
        cfg->n_kv_heads = (int)(u > 4096 ? 0 : u);
    }
    if (cfg->hidden_size < 1 || cfg->n_layers < 1 || cfg->intermediate_size < 1 || cfg->n_heads < 1 ||
        cfg->n_kv_heads < 1 || cfg->n_heads % cfg->n_kv_heads)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: model dimensions out of range (hidden %d, layers %d, ffn %d, heads %d/%d)",
                         f->path, cfg->hidden_size, cfg->n_layers, cfg->intermediate_size, cfg->n_heads, cfg->n_kv_heads);
    cfg->head_dim = cfg->hidden_size / cfg->n_heads;
    if (ember_gguf_find_kv(f, KEY("attention.key_length"))) {
        if ((rc = ember_gguf_get_u32(f, key, &u, err))) return rc;
        cfg->head_dim = (int)(u > 4096 ? 0 : u);
    }
    if (cfg->head_dim < 2 || cfg->head_dim % 2)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: head size %d is not supported", f->path, cfg->head_dim);
    cfg->max_pos = 4096;
    if (ember_gguf_find_kv(f, KEY("context_length"))) {
        if ((rc = ember_gguf_get_u32(f, key, &u, err))) return rc;
        cfg->max_pos = (int)(u > 1u << 30 ? 1u << 30 : u < 1 ? 1 : u);
    }
    cfg->rms_norm_eps = 1e-5f;
    if (ember_gguf_find_kv(f, KEY("attention.layer_norm_rms_epsilon")) &&
        (rc = ember_gguf_get_f32(f, key, &cfg->rms_norm_eps, err)))
        return rc;
    if (!(cfg->rms_norm_eps >= 0 && cfg->rms_norm_eps < 1))
        return ember_err(err, EMBER_ERR_FORMAT, "%s: rms epsilon out of range", f->path);
    ember_rope_config *r = &cfg->rope;
    r->type = EMBER_ROPE_DEFAULT;
    r->theta = 10000.0;
    r->factor = 1.0;
    r->attention_factor = -1.0;
    r->truncate = true;
    r->original_max_pos = cfg->max_pos;
    r->beta_fast = 32.0;
    r->beta_slow = 1.0;
    float fv;
    if (ember_gguf_find_kv(f, KEY("rope.freq_base"))) {
        if ((rc = ember_gguf_get_f32(f, key, &fv, err))) return rc;
        if (!(fv > 1e-3f && fv < 1e12f)) return ember_err(err, EMBER_ERR_FORMAT, "%s: rope.freq_base out of range", f->path);
        r->theta = fv;
    }
    int n_rot = cfg->head_dim;
    if (ember_gguf_find_kv(f, KEY("rope.dimension_count"))) {
        if ((rc = ember_gguf_get_u32(f, key, &u, err))) return rc;
        if (u < 2 || u > (uint32_t)cfg->head_dim || u % 2)
            return ember_err(err, EMBER_ERR_FORMAT, "%s: rope.dimension_count %u for head size %d", f->path, u,
                             cfg->head_dim);
        n_rot = (int)u;
    }
    r->partial_rotary_factor = (double)n_rot / cfg->head_dim;
    const char *st = NULL;
    if (ember_gguf_find_kv(f, KEY("rope.scaling.type")) && (rc = ember_gguf_get_str(f, key, &st, NULL, err))) return rc;
    if (st && strcmp(st, "none") != 0) {
        if (strcmp(st, "linear") == 0)
            r->type = EMBER_ROPE_LINEAR;
        else if (strcmp(st, "yarn") == 0)
            r->type = EMBER_ROPE_YARN;
        else
            return ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: rope scaling '%.32s' is not supported", f->path, st);
        if ((rc = ember_gguf_get_f32(f, KEY("rope.scaling.factor"), &fv, err))) return rc;
        if (!(fv > 0 && fv < 1e6f)) return ember_err(err, EMBER_ERR_FORMAT, "%s: rope.scaling.factor out of range", f->path);
        r->factor = fv;
        if (ember_gguf_find_kv(f, KEY("rope.scaling.original_context_length"))) {
            if ((rc = ember_gguf_get_u32(f, key, &u, err))) return rc;
            r->original_max_pos = (int)(u < 1 ? 1 : u > 1u << 30 ? 1u << 30 : u);
        }
    }
    int window = 0;
    if (ember_gguf_find_kv(f, KEY("attention.sliding_window"))) {
        if ((rc = ember_gguf_get_u32(f, key, &u, err))) return rc;
        window = (int)(u > 1u << 30 ? 0 : u);
    }
    for (int i = 0; i < cfg->n_layers; i++) cfg->layer_window[i] = window;
    cfg->rope_local = cfg->rope; /* one RoPE for every layer */
    if (gemma && (rc = gemma_config(f, arch, window, cfg, err))) return rc;
#undef KEY
    const ember_gguf_tensor *emb = ember_gguf_find_tensor(f, "token_embd.weight");
    if (!emb || emb->ndim != 2)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: missing 2-D tensor 'token_embd.weight'", f->path);
    if (emb->shape[0] < 1 || emb->shape[0] > (1 << 24))
        return ember_err(err, EMBER_ERR_FORMAT, "%s: vocabulary of %lld tokens", f->path, (long long)emb->shape[0]);
    cfg->vocab_size = (int)emb->shape[0];
    cfg->tie_embeddings = ember_gguf_find_tensor(f, "output.weight") == NULL;
    cfg->attn_bias = ember_gguf_find_tensor(f, "blk.0.attn_q.bias") != NULL;
    cfg->attn_out_bias = ember_gguf_find_tensor(f, "blk.0.attn_output.bias") != NULL;
    cfg->mlp_bias = ember_gguf_find_tensor(f, "blk.0.ffn_gate.bias") != NULL;
    cfg->qk_norm = ember_gguf_find_tensor(f, "blk.0.attn_q_norm.weight") != NULL;
    if (hybrid && (rc = hybrid_config(f, arch, n_rot, cfg, err))) return rc;
    if (moe && (rc = moe_config(f, arch, cfg, err))) return rc;
    if (g4 && (rc = gemma4_config(f, arch, n_rot, window, cfg, err))) return rc;
    static const char *const k_special[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                            "tokenizer.ggml.eot_token_id"};
    for (int i = 0; i < 3; i++) {
        int64_t id;
        if (!ember_gguf_find_kv(f, k_special[i]) || ember_gguf_get_i64(f, k_special[i], &id, NULL)) continue;
        if (id < 0 || id >= cfg->vocab_size) continue; /* ignored, as llama.cpp does for bad ids */
        if (i == 0) {
            cfg->bos_id = (int)id;
        } else {
            bool dup = false;
            for (int k = 0; k < cfg->n_eos; k++) dup |= cfg->eos_ids[k] == (int)id;
            if (!dup && cfg->n_eos < EMBER_MAX_EOS) cfg->eos_ids[cfg->n_eos++] = (int)id;
        }
    }
    return EMBER_OK;
}

const char *ember_gguf_arch_of(const char *model_type) {
    const ember_arch *row = ember_arch_find(model_type);
    return row ? row->gguf : model_type;
}

bool ember_gguf_tensor_name(const char *model_type, const char *hf, char *out, size_t n) {
    const ember_arch *row = ember_arch_find(model_type);
    const bool g4 = row && row->family == EMBER_FAMILY_GEMMA4;
    static const struct {
        const char *hf, *gg;
    } k_top[] = {{"model.embed_tokens.weight", "token_embd.weight"},
                 {"model.norm.weight", "output_norm.weight"},
                 {"lm_head.weight", "output.weight"},
                 /* gemma4's per-layer input tables (llama.cpp's gemma3n names) */
                 {"model.embed_tokens_per_layer.weight", "per_layer_token_embd.weight"},
                 {"model.per_layer_model_projection.weight", "per_layer_model_proj.weight"},
                 {"model.per_layer_projection_norm.weight", "per_layer_proj_norm.weight"}};
    for (size_t i = 0; i < sizeof k_top / sizeof k_top[0]; i++)
        if (strcmp(hf, k_top[i].hf) == 0 && (i < 3 || g4)) return (size_t)snprintf(out, n, "%s", k_top[i].gg) < n;
    typedef struct {
        const char *hf, *gg;
    } pair;
    static const pair k_layer[] = {{"input_layernorm.weight", "attn_norm.weight"},
                                   {"self_attn.q_proj.weight", "attn_q.weight"},
                                   {"self_attn.k_proj.weight", "attn_k.weight"},
                                   {"self_attn.v_proj.weight", "attn_v.weight"},
                                   {"self_attn.o_proj.weight", "attn_output.weight"},
                                   {"self_attn.q_proj.bias", "attn_q.bias"},
                                   {"self_attn.k_proj.bias", "attn_k.bias"},
                                   {"self_attn.v_proj.bias", "attn_v.bias"},
                                   {"self_attn.o_proj.bias", "attn_output.bias"},
                                   {"self_attn.q_norm.weight", "attn_q_norm.weight"},
                                   {"self_attn.k_norm.weight", "attn_k_norm.weight"},
                                   {"mlp.gate_proj.weight", "ffn_gate.weight"},
                                   {"mlp.up_proj.weight", "ffn_up.weight"},
                                   {"mlp.down_proj.weight", "ffn_down.weight"},
                                   {"mlp.gate_proj.bias", "ffn_gate.bias"},
                                   {"mlp.up_proj.bias", "ffn_up.bias"},
                                   {"mlp.down_proj.bias", "ffn_down.bias"}};
    /* the names that depend on the family */
    static const pair k_llama[] = {{"post_attention_layernorm.weight", "ffn_norm.weight"}};
    static const pair k_phi3[] = {{"post_attention_layernorm.weight", "ffn_norm.weight"},
                                  {"self_attn.qkv_proj.weight", "attn_qkv.weight"},
                                  {"mlp.gate_up_proj.weight", "ffn_up.weight"}};
    static const pair k_gemma[] = {{"post_attention_layernorm.weight", "post_attention_norm.weight"},
                                   {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
                                   {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"}};
    /* hybrids (llama.cpp's names; the loader undoes the converter's transforms: qwen3_next.c) */
    static const pair k_hybrid[] = {{"post_attention_layernorm.weight", "post_attention_norm.weight"},
                                    {"linear_attn.in_proj_qkv.weight", "attn_qkv.weight"},
                                    {"linear_attn.in_proj_z.weight", "attn_gate.weight"},
                                    {"linear_attn.in_proj_b.weight", "ssm_beta.weight"},
                                    {"linear_attn.in_proj_a.weight", "ssm_alpha.weight"},
                                    {"linear_attn.in_proj_ba.weight", "ssm_ba.weight"},
                                    {"linear_attn.conv1d.weight", "ssm_conv1d.weight"},
                                    {"linear_attn.dt_bias", "ssm_dt.bias"},
                                    {"linear_attn.A_log", "ssm_a"}, /* holds -exp(A_log) */
                                    {"linear_attn.norm.weight", "ssm_norm.weight"},
                                    {"linear_attn.out_proj.weight", "ssm_out.weight"},
                                    {"mlp.gate.weight", "ffn_gate_inp.weight"},
                                    {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
                                    {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
                                    {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
                                    {"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"}};
    /* gemma4 (llama.cpp's names; norms stored as they are, plain x * w): the
       MoE block's norms, router and fused experts, layer_scalar, the
       per-layer input gate and projection */
    static const pair k_gemma4[] = {{"post_attention_layernorm.weight", "post_attention_norm.weight"},
                                    {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
                                    {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
                                    {"pre_feedforward_layernorm_2.weight", "pre_ffw_norm_2.weight"},
                                    {"post_feedforward_layernorm_1.weight", "post_ffw_norm_1.weight"},
                                    {"post_feedforward_layernorm_2.weight", "post_ffw_norm_2.weight"},
                                    {"layer_scalar", "layer_output_scale.weight"},
                                    {"router.proj.weight", "ffn_gate_inp.weight"},
                                    {"router.scale", "ffn_gate_inp.scale"},
                                    {"router.per_expert_scale", "ffn_down_exps.scale"},
                                    {"experts.gate_up_proj", "ffn_gate_up_exps.weight"},
                                    {"experts.down_proj", "ffn_down_exps.weight"},
                                    {"per_layer_input_gate.weight", "inp_gate.weight"},
                                    {"per_layer_projection.weight", "proj.weight"},
                                    {"post_per_layer_input_norm.weight", "post_norm.weight"}};
    /* mixture of experts (the stacked experts are named in blocks.c and quantize.c) */
    static const pair k_qwen3_moe[] = {{"post_attention_layernorm.weight", "ffn_norm.weight"},
                                       {"mlp.gate.weight", "ffn_gate_inp.weight"}};
    static const pair k_glm4_moe[] = {{"post_attention_layernorm.weight", "post_attention_norm.weight"},
                                      {"mlp.gate.weight", "ffn_gate_inp.weight"},
                                      {"mlp.gate.e_score_correction_bias", "exp_probs_b.bias"},
                                      {"mlp.shared_experts.gate_proj.weight", "ffn_gate_shexp.weight"},
                                      {"mlp.shared_experts.up_proj.weight", "ffn_up_shexp.weight"},
                                      {"mlp.shared_experts.down_proj.weight", "ffn_down_shexp.weight"}};
    const pair *fam = k_llama;
    size_t n_fam = sizeof k_llama / sizeof k_llama[0];
    if (strcmp(model_type, "qwen3_moe") == 0) {
        fam = k_qwen3_moe;
        n_fam = sizeof k_qwen3_moe / sizeof k_qwen3_moe[0];
    } else if (strcmp(model_type, "glm4_moe") == 0) {
        fam = k_glm4_moe;
        n_fam = sizeof k_glm4_moe / sizeof k_glm4_moe[0];
    } else if (row && row->family == EMBER_FAMILY_HYBRID) {
        fam = k_hybrid;
        n_fam = sizeof k_hybrid / sizeof k_hybrid[0];
    } else if (g4) {
        fam = k_gemma4;
        n_fam = sizeof k_gemma4 / sizeof k_gemma4[0];
    } else if (ember_arch_is_gemma(model_type)) {
        fam = k_gemma;
        n_fam = sizeof k_gemma / sizeof k_gemma[0];
    } else if (strcmp(model_type, "phi3") == 0) {
        fam = k_phi3;
        n_fam = sizeof k_phi3 / sizeof k_phi3[0];
    }
    int layer, used = 0;
    if (sscanf(hf, "model.layers.%d.%n", &layer, &used) != 1 || used == 0 || layer < 0) return false;
    const char *rest = hf + used;
    for (size_t i = 0; i < n_fam; i++)
        if (strcmp(rest, fam[i].hf) == 0) return (size_t)snprintf(out, n, "blk.%d.%s", layer, fam[i].gg) < n;
    for (size_t i = 0; i < sizeof k_layer / sizeof k_layer[0]; i++)
        if (strcmp(rest, k_layer[i].hf) == 0) return (size_t)snprintf(out, n, "blk.%d.%s", layer, k_layer[i].gg) < n;
    return false;
}
