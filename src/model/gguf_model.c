/*
 * gguf_model.c - llama-family GGUF files (llama.cpp's llama, qwen2, qwen3;
 * mistral as llama) mapped onto the same model config and tensor names as
 * HuggingFace safetensors, so one model code path (llama.c) runs both.
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
 * RoPE layout: llama.cpp's converter permutes llama Q/K rows so that llama
 * GGUFs rotate interleaved pairs; qwen2/qwen3 GGUFs keep HF's NEOX halves.
 *
 * Ownership: pure functions over a parsed, validated ember_gguf (gguf.h).
 */
#include <stdio.h>
#include <string.h>

#include "model.h"

int ember_gguf_model_config(const ember_gguf *f, ember_model_config *cfg, ember_rope_mode *mode, ember_error *err) {
    memset(cfg, 0, sizeof *cfg);
    cfg->bos_id = -1;
    const char *arch;
    int rc = ember_gguf_get_str(f, "general.architecture", &arch, NULL, err);
    if (rc) return rc;
    bool llama = strcmp(arch, "llama") == 0 || strcmp(arch, "mistral") == 0;
    if (!llama && strcmp(arch, "qwen2") != 0 && strcmp(arch, "qwen3") != 0)
        return ember_err(err, EMBER_ERR_UNSUPPORTED,
                         "%s: architecture '%.32s' is not supported (supported: llama, mistral, qwen2, qwen3)", f->path,
                         arch);
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", strcmp(arch, "mistral") == 0 ? "llama" : arch);
    *mode = llama ? EMBER_ROPE_INTERLEAVED : EMBER_ROPE_NEOX;
    char key[160];
#define KEY(s) (snprintf(key, sizeof key, "%s.%s", arch, s), key)
    uint32_t u;
    if ((rc = ember_gguf_get_u32(f, KEY("embedding_length"), &u, err))) return rc;
    cfg->hidden_size = (int)(u > 1u << 20 ? 0 : u);
    if ((rc = ember_gguf_get_u32(f, KEY("block_count"), &u, err))) return rc;
    cfg->n_layers = (int)(u > EMBER_MAX_LAYERS ? 0 : u);
    if ((rc = ember_gguf_get_u32(f, KEY("feed_forward_length"), &u, err))) return rc;
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

bool ember_gguf_tensor_name(const char *hf, char *out, size_t n) {
    static const struct {
        const char *hf, *gg;
    } k_top[] = {{"model.embed_tokens.weight", "token_embd.weight"},
                 {"model.norm.weight", "output_norm.weight"},
                 {"lm_head.weight", "output.weight"}};
    for (size_t i = 0; i < sizeof k_top / sizeof k_top[0]; i++)
        if (strcmp(hf, k_top[i].hf) == 0) return (size_t)snprintf(out, n, "%s", k_top[i].gg) < n;
    static const struct {
        const char *hf, *gg;
    } k_layer[] = {{"input_layernorm.weight", "attn_norm.weight"},
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
                   {"post_attention_layernorm.weight", "ffn_norm.weight"},
                   {"mlp.gate_proj.weight", "ffn_gate.weight"},
                   {"mlp.up_proj.weight", "ffn_up.weight"},
                   {"mlp.down_proj.weight", "ffn_down.weight"},
                   {"mlp.gate_proj.bias", "ffn_gate.bias"},
                   {"mlp.up_proj.bias", "ffn_up.bias"},
                   {"mlp.down_proj.bias", "ffn_down.bias"}};
    int layer, used = 0;
    if (sscanf(hf, "model.layers.%d.%n", &layer, &used) != 1 || used == 0 || layer < 0) return false;
    const char *rest = hf + used;
    for (size_t i = 0; i < sizeof k_layer / sizeof k_layer[0]; i++)
        if (strcmp(rest, k_layer[i].hf) == 0) return (size_t)snprintf(out, n, "blk.%d.%s", layer, k_layer[i].gg) < n;
    return false;
}
