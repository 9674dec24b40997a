/*
 * gguf_model.c - GGUF files as llama.cpp's converter writes them
 * (architectures llama, mistral as llama, qwen2, qwen3, phi3, gemma2,
 * gemma3, qwen3moe, glm4moe, qwen3next, qwen35, qwen35moe) mapped onto the
 * same model config and tensor names as HuggingFace safetensors, so each
 * family's code (llama.c, gemma.c, qwen3_moe.c, qwen3_next.c) runs both.
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
    if (row->family == EMBER_FAMILY_GEMMA4) /* per-layer shapes, KV sharing and per-layer inputs have no GGUF keys here yet */
        return ember_err(err, EMBER_ERR_UNSUPPORTED,
                         "%s: architecture '%.32s' is not supported from GGUF yet; load the HuggingFace directory",
                         f->path, arch);
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
    if ((rc = ember_gguf_get_u32(f, KEY(ffn_from_experts ? "expert_feed_forward_length" : "feed_forward_length"), &u,
                                 err)))
        return rc;
    cfg->intermediate_size = (int)(u > 1u << 22 ? 0 : u);
    if ((rc = ember_gguf_get_u32(f, KEY("attention.head_count"), &u, err))) return rc;
    cfg->n_heads = (int)(u > 4096 ? 0 : u);
    cfg->n_kv_heads = cfg->n_heads;
    if (ember_gguf_find_kv(f, KEY("attention.head_count_kv"))) {
        if ((rc = ember_gguf_get_u32(f, key, &u, err))) return rc;
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
    static const struct {
        const char *hf, *gg;
    } k_top[] = {{"model.embed_tokens.weight", "token_embd.weight"},
                 {"model.norm.weight", "output_norm.weight"},
                 {"lm_head.weight", "output.weight"}};
    for (size_t i = 0; i < sizeof k_top / sizeof k_top[0]; i++)
        if (strcmp(hf, k_top[i].hf) == 0) return (size_t)snprintf(out, n, "%s", k_top[i].gg) < n;
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
    /* mixture of experts (the stacked experts are named in blocks.c and quantize.c) */
    static const pair k_qwen3_moe[] = {{"post_attention_layernorm.weight", "ffn_norm.weight"},
                                       {"mlp.gate.weight", "ffn_gate_inp.weight"}};
    static const pair k_glm4_moe[] = {{"post_attention_layernorm.weight", "post_attention_norm.weight"},
                                      {"mlp.gate.weight", "ffn_gate_inp.weight"},
                                      {"mlp.gate.e_score_correction_bias", "exp_probs_b.bias"},
                                      {"mlp.shared_experts.gate_proj.weight", "ffn_gate_shexp.weight"},
                                      {"mlp.shared_experts.up_proj.weight", "ffn_up_shexp.weight"},
                                      {"mlp.shared_experts.down_proj.weight", "ffn_down_shexp.weight"}};
    const ember_arch *row = ember_arch_find(model_type);
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
