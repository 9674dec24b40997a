/*
 * qwen3_moe.c - the mixture-of-experts family: qwen3_moe (Qwen3-30B-A3B,
 * Qwen3-235B-A22B) and glm4_moe (GLM-4.5), one network with other options.
 *
 * Qwen3's attention with the MLP replaced by a mixture of experts on the
 * layers the config names (cfg.layer_moe: every decoder_sparse_step-th
 * layer not in mlp_only_layers; the others keep a dense SwiGLU MLP of
 * width intermediate_size). Per layer, for a batch of T tokens:
 *   h = rmsnorm(x) ; q, k, v = h Wq, h Wk, h Wv
 *   q, k = per-head rmsnorm(q), rmsnorm(k) ; q, k = rope(q, k)
 *   x += attention(q, cache) Wo             (scale head_dim^-0.5)
 *   h = rmsnorm(x)
 *   MoE layer:   p = softmax(h Wr) over the E experts; the top k of p
 *                (renormalised to sum 1 when norm_topk_prob);
 *                x += sum_e p_e down_e(silu(h Wg_e) * h Wu_e)
 *   dense layer: x += (silu(h Wg) * h Wu) Wd
 * then logits = rmsnorm(x[wanted]) Wlm. qwen3_moe has no shared expert.
 * The MoE block (grouping by expert, batch invariance) is ember_blk_moe in
 * blocks.c. GGUF qwen3moe / glm4moe files bind the same tensors by name
 * (gguf_model.c maps the keys and names; blocks.c reads the stacked experts).
 */
#include <math.h>
#include <stdio.h>

#include "family.h"

/* glm4_moe is the same network: q/k/v biases (no o bias), q/k norms when
   use_qk_norm, partial RoPE (partial_rotary_factor, rotate_half on the
   first dims), dense layers below first_k_dense_replace, and the MoE block
   with a sigmoid router (scores + e_score_correction_bias select, the
   scores weigh; group top-k; routed_scaling_factor) plus a shared expert
   added to the routed sum (ember_blk_moe). */

/* Binds layer i's tensors (HuggingFace names), shapes from the config: the
   attention, then the MoE block or the dense MLP. Returns an error naming a
   missing or misshapen tensor. */
static int load_layer(ember_loader *L, int i) {
    ember_llm *m = L->m;
    const ember_model_config *c = &m->cfg;
    ember_llm_layer *ly = &m->layers[i];
    const int64_t H = c->hidden_size, D = c->head_dim, Q = (int64_t)c->n_heads * D,
                  KV = (int64_t)c->n_kv_heads * D, I = c->intermediate_size;
    char n[256];
    int rc;
#define NAME(suffix) (snprintf(n, sizeof n, "model.layers.%d.%s", i, suffix), n)
#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
    if ((rc = ember_load_tensor(L, &ly->attn_norm, NAME("input_layernorm.weight"), 1, SHAPE(H), true, false)) ||
        (rc = ember_load_tensor(L, &ly->wq, NAME("self_attn.q_proj.weight"), 2, SHAPE(Q, H), false, false)) ||
        (rc = ember_load_tensor(L, &ly->wk, NAME("self_attn.k_proj.weight"), 2, SHAPE(KV, H), false, false)) ||
        (rc = ember_load_tensor(L, &ly->wv, NAME("self_attn.v_proj.weight"), 2, SHAPE(KV, H), false, false)) ||
        (rc = ember_load_tensor(L, &ly->wo, NAME("self_attn.o_proj.weight"), 2, SHAPE(H, Q), false, false)) ||
        (rc = ember_load_tensor(L, &ly->ffn_norm, NAME("post_attention_layernorm.weight"), 1, SHAPE(H), true, false)))
        return rc;
    if (c->attn_bias &&
        ((rc = ember_load_tensor(L, &ly->bq, NAME("self_attn.q_proj.bias"), 1, SHAPE(Q), true, false)) ||
         (rc = ember_load_tensor(L, &ly->bk, NAME("self_attn.k_proj.bias"), 1, SHAPE(KV), true, false)) ||
         (rc = ember_load_tensor(L, &ly->bv, NAME("self_attn.v_proj.bias"), 1, SHAPE(KV), true, false))))
        return rc;
    if (c->attn_out_bias &&
        (rc = ember_load_tensor(L, &ly->bo, NAME("self_attn.o_proj.bias"), 1, SHAPE(H), true, false)))
        return rc;
    if (c->qk_norm &&
        ((rc = ember_load_tensor(L, &ly->q_norm, NAME("self_attn.q_norm.weight"), 1, SHAPE(D), true, false)) ||
         (rc = ember_load_tensor(L, &ly->k_norm, NAME("self_attn.k_norm.weight"), 1, SHAPE(D), true, false))))
        return rc;
    if (c->layer_moe[i]) return ember_load_moe(L, i);
    if ((rc = ember_load_tensor(L, &ly->w_gate, NAME("mlp.gate_proj.weight"), 2, SHAPE(I, H), false, false)) ||
        (rc = ember_load_tensor(L, &ly->w_up, NAME("mlp.up_proj.weight"), 2, SHAPE(I, H), false, false)) ||
        (rc = ember_load_tensor(L, &ly->w_down, NAME("mlp.down_proj.weight"), 2, SHAPE(H, I), false, false)))
        return rc;
#undef NAME
#undef SHAPE
    return EMBER_OK;
}

/* The family's loader (family.h). */
static int qwen3_moe_load(ember_loader *L) {
    int rc = ember_load_io(L);
    for (int i = 0; !rc && i < L->m->cfg.n_layers; i++) rc = load_layer(L, i);
    return rc;
}

/* The family's forward pass (family.h). */
static int qwen3_moe_forward(ember_llm *m, ember_llm_state *st, ember_kv *kv, const ember_batch *b, float *logits,
                             ember_error *err) {
    const ember_model_config *c = &m->cfg;
    ember_fwd f;
    ember_fwd_init(&f, m, st, kv, b, err);
    const ember_rope rope = {m->inv_freq, m->n_rot, m->rope_mode, m->attn_factor};
    const float scale = 1.0f / sqrtf((float)c->head_dim);
    int rc = ember_blk_embed(&f, 1.0f);
    for (int l = 0; !rc && l < c->n_layers; l++) {
        const ember_llm_layer *ly = &m->layers[l];
        const ember_attn ap = {scale, ly->window, 0.0f};
        if ((rc = ember_blk_tap(&f, l)) || (rc = ember_blk_norm(&f, &f.h, &f.x, &ly->attn_norm, false)) ||
            (rc = ember_blk_attention(&f, l, ly, &rope, &ap, false)) ||
            (rc = ember_blk_residual_norm(&f, &ly->ffn_norm, false)) ||
            (rc = ly->experts ? ember_blk_moe(&f, ly) : ember_blk_mlp(&f, ly, c->act)) ||
            (rc = ember_blk_residual(&f)))
            break;
    }
    if (!rc) rc = ember_blk_logits(&f, &m->out_norm, false, 0.0f, logits);
    return rc;
}

const ember_family ember_family_qwen3_moe = {"qwen3_moe", qwen3_moe_load, qwen3_moe_forward};
