/*
 * llama.c - the llama family: llama, mistral, qwen2, qwen3, phi3.
 *
 * Per layer, for a batch of T tokens:
 *   h = rmsnorm(x) ; q, k, v = h Wq, h Wk, h Wv (+ biases)
 *   [qwen3] q, k = per-head rmsnorm(q), rmsnorm(k)
 *   q, k = rope(q, k) ; cache[row, pos] = k, v
 *   x += attention(q, cache) Wo           (scale head_dim^-0.5; mistral,
 *                                          phi3: a sliding window)
 *   h = rmsnorm(x) ; x += (silu(h Wg) * h Wu) Wd
 * then logits = rmsnorm(x[wanted]) Wlm.
 *
 * phi3 is the same network with fused projections: qkv_proj [Q + 2 KV, H]
 * (q rows, then k, then v) and gate_up_proj [2 I, H] (gate rows, then up),
 * bound at load as row views of one buffer, so the forward pass is llama's.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "family.h"

/* Binds layer i's tensors (HuggingFace names), shapes from the config;
   phi3's fused projections as row views (family.h). */
int ember_llama_load_layer(ember_loader *L, int i) {
    ember_llm *m = L->m;
    const ember_model_config *c = &m->cfg;
    ember_llm_layer *ly = &m->layers[i];
    const int64_t H = c->hidden_size, D = c->head_dim, Q = (int64_t)c->n_heads * D,
                  KV = (int64_t)c->n_kv_heads * D, I = c->intermediate_size;
    const bool fused = strcmp(c->model_type, "phi3") == 0;
    char n[256];
    int rc;
#define NAME(suffix) (snprintf(n, sizeof n, "model.layers.%d.%s", i, suffix), n)
#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
    if ((rc = ember_load_tensor(L, &ly->attn_norm, NAME("input_layernorm.weight"), 1, SHAPE(H), true, false)))
        return rc;
    if (fused) {
        ember_tensor *qkv[3] = {&ly->wq, &ly->wk, &ly->wv}, *gu[2] = {&ly->w_gate, &ly->w_up};
        if ((rc = ember_load_split(L, NAME("self_attn.qkv_proj.weight"), 3, qkv, SHAPE(Q, KV, KV), H)) ||
            (rc = ember_load_split(L, NAME("mlp.gate_up_proj.weight"), 2, gu, SHAPE(I, I), H)))
            return rc;
    } else if ((rc = ember_load_tensor(L, &ly->wq, NAME("self_attn.q_proj.weight"), 2, SHAPE(Q, H), false, false)) ||
               (rc = ember_load_tensor(L, &ly->wk, NAME("self_attn.k_proj.weight"), 2, SHAPE(KV, H), false, false)) ||
               (rc = ember_load_tensor(L, &ly->wv, NAME("self_attn.v_proj.weight"), 2, SHAPE(KV, H), false, false)) ||
               (rc = ember_load_tensor(L, &ly->w_gate, NAME("mlp.gate_proj.weight"), 2, SHAPE(I, H), false, false)) ||
               (rc = ember_load_tensor(L, &ly->w_up, NAME("mlp.up_proj.weight"), 2, SHAPE(I, H), false, false))) {
        return rc;
    }
    if ((rc = ember_load_tensor(L, &ly->wo, NAME("self_attn.o_proj.weight"), 2, SHAPE(H, Q), false, false)) ||
        (rc = ember_load_tensor(L, &ly->ffn_norm, NAME("post_attention_layernorm.weight"), 1, SHAPE(H), true, false)) ||
        (rc = ember_load_tensor(L, &ly->w_down, NAME("mlp.down_proj.weight"), 2, SHAPE(H, I), false, false)))
        return rc;
    if (c->attn_bias &&
        ((rc = ember_load_tensor(L, &ly->bq, NAME("self_attn.q_proj.bias"), 1, SHAPE(Q), true, false)) ||
         (rc = ember_load_tensor(L, &ly->bk, NAME("self_attn.k_proj.bias"), 1, SHAPE(KV), true, false)) ||
         (rc = ember_load_tensor(L, &ly->bv, NAME("self_attn.v_proj.bias"), 1, SHAPE(KV), true, false))))
        return rc;
    if (c->attn_out_bias &&
        (rc = ember_load_tensor(L, &ly->bo, NAME("self_attn.o_proj.bias"), 1, SHAPE(H), true, false)))
        return rc;
    if (c->mlp_bias &&
        ((rc = ember_load_tensor(L, &ly->b_gate, NAME("mlp.gate_proj.bias"), 1, SHAPE(I), true, false)) ||
         (rc = ember_load_tensor(L, &ly->b_up, NAME("mlp.up_proj.bias"), 1, SHAPE(I), true, false)) ||
         (rc = ember_load_tensor(L, &ly->b_down, NAME("mlp.down_proj.bias"), 1, SHAPE(H), true, false))))
        return rc;
    if (c->qk_norm &&
        ((rc = ember_load_tensor(L, &ly->q_norm, NAME("self_attn.q_norm.weight"), 1, SHAPE(D), true, false)) ||
         (rc = ember_load_tensor(L, &ly->k_norm, NAME("self_attn.k_norm.weight"), 1, SHAPE(D), true, false))))
        return rc;
#undef NAME
#undef SHAPE
    return EMBER_OK;
}

/* The family's loader (family.h). */
static int llama_load(ember_loader *L) {
    int rc = ember_load_io(L);
    for (int i = 0; !rc && i < L->m->cfg.n_layers; i++) rc = ember_llama_load_layer(L, i);
    return rc;
}

/* The family's forward pass (family.h). */
static int llama_forward(ember_llm *m, ember_llm_state *st, ember_kv *kv, const ember_batch *b, float *logits,
                         ember_error *err) {
    const ember_model_config *c = &m->cfg;
    ember_fwd f;
    ember_fwd_init(&f, m, st, kv, b, err);
    const ember_rope rope = {m->inv_freq, m->n_rot, m->rope_mode, m->attn_factor};
    const float scale = 1.0f / sqrtf((float)c->head_dim);
    int rc = ember_blk_embed(&f, 1.0f);
    if (!rc && c->n_layers > 0) rc = ember_blk_norm(&f, &f.h, &f.x, &m->layers[0].attn_norm, false);
    for (int l = 0; !rc && l < c->n_layers; l++) {
        const ember_llm_layer *ly = &m->layers[l];
        const ember_attn ap = {scale, ly->window, 0.0f};
        /* each residual add and the norm after it: one op where the backend fuses them */
        if ((rc = ember_blk_tap(&f, l)) || (rc = ember_blk_attention(&f, l, ly, &rope, &ap, false)) ||
            (rc = ember_blk_residual_norm(&f, &ly->ffn_norm, false)) || (rc = ember_blk_mlp(&f, ly, c->act)) ||
            (rc = l + 1 < c->n_layers ? ember_blk_residual_norm(&f, &m->layers[l + 1].attn_norm, false)
                                      : ember_blk_residual(&f)))
            break;
    }
    if (!rc) rc = ember_blk_logits(&f, &m->out_norm, false, 0.0f, logits);
    return rc;
}

const ember_family ember_family_llama = {"llama", llama_load, llama_forward};
