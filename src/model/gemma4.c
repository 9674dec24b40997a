/*
 * gemma4.c - the Gemma 4 family: gemma4_text (dense 31B style, E2B / E4B
 * style with per-layer inputs and KV sharing, 26B-A4B style with the MoE
 * block beside the dense MLP).
 *
 * Every norm is a plain RMSNorm, x * rsqrt(mean(x^2) + eps) * w (Gemma 4
 * stores w itself, not w - 1); "norm(x)" without a weight has no scale.
 *
 *   x = embed[tok] * sqrt(hidden)
 *   [PLE] per token and layer l: ple_l = (norm((x Wpm)_l * hidden^-0.5,
 *         per_layer_projection_norm) + embed_per_layer[tok]_l * sqrt(P)) * 2^-0.5
 *   per layer l (sliding-window and full-attention layers, layer_types;
 *   head size and KV heads per layer, per_layer_config):
 *     h = norm(x, input_layernorm)
 *     q = norm(h Wq, q_norm)
 *     own K/V:   k = h Wk ; v = h Wv, or v = k on full-attention layers
 *                with attention_k_eq_v ; k = norm(k, k_norm) ; v = norm(v)
 *                cache[row, pos] = rope(k), v
 *     KV-shared (the last num_kv_shared_layers layers): no k, v; the layer
 *                attends over the cache of the last earlier non-shared
 *                layer of its type (which has the same window)
 *     q = rope(q)      sliding layers: default RoPE (rope_local);
 *                      full layers: proportional RoPE over their head size
 *     a = softmax(q.k) v        (scale 1: the norms fix the magnitudes),
 *                                keys i - W < j <= i on sliding layers
 *     x += norm(a Wo, post_attention_layernorm)
 *     h = norm(x, pre_feedforward_layernorm)
 *     h = (gelu_tanh(h Wg) * h Wu) Wd       (2 * intermediate_size wide on
 *                                           KV-shared layers with use_double_wide_mlp)
 *     [MoE] h = norm(h, post_feedforward_layernorm_1)
 *             + norm(experts(norm(x, pre_feedforward_layernorm_2)), post_feedforward_layernorm_2)
 *           routed on x: softmax((norm(x) * router.scale * hidden^-0.5) Wr),
 *           the top k renormalised, times per_expert_scale; GeGLU experts
 *     x += norm(h, post_feedforward_layernorm)
 *     [PLE] x += norm((gelu_tanh(x Wgate) * ple_l) Wproj, post_per_layer_input_norm)
 *     x *= layer_scalar
 *   logits = norm(x, model.norm) Wembed^T (tied), then
 *            final_cap * tanh(logits / final_cap) when final_logit_softcapping is set
 *
 * The KV cache holds layers 0 .. n_layers - num_kv_shared_layers - 1 only
 * (ember_llm_kv_layout): a shared layer takes no blocks of its own. Within
 * one forward pass its source layer, being earlier, has already written the
 * batch's K/V, so a shared layer sees exactly what transformers hands it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/alloc.h"
#include "family.h"

/* Binds layer i's tensors (HuggingFace names), shapes from the config and
   the layer's own head size, KV heads and MLP width. */
static int load_layer(ember_loader *L, int i) {
    ember_llm *m = L->m;
    const ember_model_config *c = &m->cfg;
    ember_llm_layer *ly = &m->layers[i];
    const int64_t H = c->hidden_size, D = ember_cfg_head_dim(c, i), Q = (int64_t)c->n_heads * D,
                  KV = (int64_t)ember_cfg_kv_heads(c, i) * D, I = ember_cfg_intermediate(c, i), P = c->ple_dim,
                  E = c->n_experts;
    ly->head_dim = (int)D;
    ly->n_kv_heads = ember_cfg_kv_heads(c, i);
    ly->kv_shared = ember_cfg_kv_shared(c, i);
    ly->kv_layer = ember_cfg_kv_layer(c, i);
    ly->k_eq_v = c->attn_k_eq_v && !c->layer_sliding[i];
    char n[256];
    int rc;
#define NAME(suffix) (snprintf(n, sizeof n, "model.layers.%d.%s", i, suffix), n)
#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
    if ((rc = ember_load_tensor(L, &ly->attn_norm, NAME("input_layernorm.weight"), 1, SHAPE(H), true, false)) ||
        (rc = ember_load_tensor(L, &ly->wq, NAME("self_attn.q_proj.weight"), 2, SHAPE(Q, H), false, false)) ||
        (rc = ember_load_tensor(L, &ly->q_norm, NAME("self_attn.q_norm.weight"), 1, SHAPE(D), true, false)) ||
        (rc = ember_load_tensor(L, &ly->wo, NAME("self_attn.o_proj.weight"), 2, SHAPE(H, Q), false, false)) ||
        (rc = ember_load_tensor(L, &ly->post_attn_norm, NAME("post_attention_layernorm.weight"), 1, SHAPE(H), true,
                                false)) ||
        (rc = ember_load_tensor(L, &ly->ffn_norm, NAME("pre_feedforward_layernorm.weight"), 1, SHAPE(H), true,
                                false)) ||
        (rc = ember_load_tensor(L, &ly->w_gate, NAME("mlp.gate_proj.weight"), 2, SHAPE(I, H), false, false)) ||
        (rc = ember_load_tensor(L, &ly->w_up, NAME("mlp.up_proj.weight"), 2, SHAPE(I, H), false, false)) ||
        (rc = ember_load_tensor(L, &ly->w_down, NAME("mlp.down_proj.weight"), 2, SHAPE(H, I), false, false)) ||
        (rc = ember_load_tensor(L, &ly->post_ffn_norm, NAME("post_feedforward_layernorm.weight"), 1, SHAPE(H), true,
                                false)))
        return rc;
    if (ly->kv_shared) { /* transformers ignores a shared layer's k/v weights when a file has them */
        static const char *const unused[] = {"self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                             "self_attn.k_norm.weight", "self_attn.v_norm.weight"};
        for (int u = 0; u < 4; u++) ember_load_claim(L, NAME(unused[u]));
    } else if ((rc = ember_load_tensor(L, &ly->wk, NAME("self_attn.k_proj.weight"), 2, SHAPE(KV, H), false, false)) ||
               (rc = ember_load_tensor(L, &ly->k_norm, NAME("self_attn.k_norm.weight"), 1, SHAPE(D), true, false)) ||
               (!ly->k_eq_v &&
                (rc = ember_load_tensor(L, &ly->wv, NAME("self_attn.v_proj.weight"), 2, SHAPE(KV, H), false, false)))) {
        return rc;
    }
    ember_tensor scalar; /* layer_scalar [1], kept on the host */
    if ((rc = ember_load_tensor(L, &scalar, NAME("layer_scalar"), 1, SHAPE(1), true, false)) ||
        (rc = m->be->ops->read(m->be, &scalar, 0, &ly->layer_scalar, sizeof ly->layer_scalar, L->err)))
        return rc;
    if (P && ((rc = ember_load_tensor(L, &ly->ple_gate, NAME("per_layer_input_gate.weight"), 2, SHAPE(P, H), false,
                                      false)) ||
              (rc = ember_load_tensor(L, &ly->ple_proj, NAME("per_layer_projection.weight"), 2, SHAPE(H, P), false,
                                      false)) ||
              (rc = ember_load_tensor(L, &ly->ple_norm, NAME("post_per_layer_input_norm.weight"), 1, SHAPE(H), true,
                                      false))))
        return rc;
    if (!c->moe_beside_mlp) return EMBER_OK;
    ember_tensor pes; /* router.per_expert_scale [E], kept on the host where the routing runs */
    if ((rc = ember_load_tensor(L, &ly->router, NAME("router.proj.weight"), 2, SHAPE(E, H), false, false)) ||
        (rc = ember_load_tensor(L, &ly->router_scale, NAME("router.scale"), 1, SHAPE(H), true, false)) ||
        (rc = ember_load_tensor(L, &pes, NAME("router.per_expert_scale"), 1, SHAPE(E), true, false)) ||
        (rc = ember_load_tensor(L, &ly->pre_ffn_norm2, NAME("pre_feedforward_layernorm_2.weight"), 1, SHAPE(H), true,
                                false)) ||
        (rc = ember_load_tensor(L, &ly->post_ffn_norm1, NAME("post_feedforward_layernorm_1.weight"), 1, SHAPE(H), true,
                                false)) ||
        (rc = ember_load_tensor(L, &ly->post_ffn_norm2, NAME("post_feedforward_layernorm_2.weight"), 1, SHAPE(H), true,
                                false)) ||
        (rc = ember_load_fused_experts(L, i)))
        return rc;
#undef NAME
#undef SHAPE
    ly->expert_scale = ember_malloc((size_t)E * sizeof *ly->expert_scale);
    if (!ly->expert_scale) return ember_err(L->err, EMBER_ERR_NOMEM, "out of memory");
    return m->be->ops->read(m->be, &pes, 0, ly->expert_scale, (size_t)E * sizeof *ly->expert_scale, L->err);
}

/* The per-layer input tables (PLE): embed_tokens_per_layer [Vp, L * P] (one
   row read per token), per_layer_model_projection [L * P, H] and
   per_layer_projection_norm [P]. */
static int load_ple(ember_loader *L) {
    ember_llm *m = L->m;
    const ember_model_config *c = &m->cfg;
    const int64_t LP = (int64_t)c->n_layers * c->ple_dim, H = c->hidden_size;
    int rc;
    if ((rc = ember_load_tensor(L, &m->ple_embed, "model.embed_tokens_per_layer.weight", 2,
                                (const int64_t[]){c->ple_vocab, LP}, false, false)) ||
        (rc = ember_load_tensor(L, &m->ple_model_proj, "model.per_layer_model_projection.weight", 2,
                                (const int64_t[]){LP, H}, false, false)) ||
        (rc = ember_load_tensor(L, &m->ple_proj_norm, "model.per_layer_projection_norm.weight", 1,
                                (const int64_t[]){c->ple_dim}, true, false)))
        return rc;
    m->weight_bytes -= m->ple_embed.nbytes - m->ple_embed.nbytes / (size_t)c->ple_vocab; /* one row per token */
    return EMBER_OK;
}

/* The family's loader (family.h). */
static int gemma4_load(ember_loader *L) {
    ember_llm *m = L->m;
    const ember_model_config *c = &m->cfg;
    int max_d = 2;
    for (int i = 0; i < c->n_layers; i++) max_d = ember_cfg_head_dim(c, i) > max_d ? ember_cfg_head_dim(c, i) : max_d;
    int rc = ember_load_io(L);
    if (!rc) rc = ember_load_ones(L, &m->ones, max_d);
    if (!rc && c->ple_dim) rc = load_ple(L);
    for (int i = 0; !rc && i < c->n_layers; i++) rc = load_layer(L, i);
    return rc;
}

/* The family's forward pass (family.h). */
static int gemma4_forward(ember_llm *m, ember_llm_state *st, ember_kv *kv, const ember_batch *b, float *logits,
                          ember_error *err) {
    const ember_model_config *c = &m->cfg;
    ember_fwd f;
    ember_fwd_init(&f, m, st, kv, b, err);
    const ember_rope rope_global = {m->inv_freq, m->n_rot, m->rope_mode, m->attn_factor};
    const ember_rope rope_local = {m->inv_freq_local, m->n_rot_local, m->rope_mode, m->attn_factor_local};
    int rc = ember_blk_embed(&f, (float)sqrt((double)c->hidden_size));
    if (!rc && c->ple_dim) rc = ember_blk_ple_inputs(&f);
    for (int l = 0; !rc && l < c->n_layers; l++) {
        const ember_llm_layer *ly = &m->layers[l];
        const ember_attn ap = {1.0f, ly->window, 0.0f};
        const ember_rope *rope = ly->local_rope ? &rope_local : &rope_global;
        ember_fwd_layer_shape(&f, ly->head_dim, ly->n_kv_heads, ember_cfg_intermediate(c, l));
        if ((rc = ember_blk_tap(&f, l)) || (rc = ember_blk_norm(&f, &f.h, &f.x, &ly->attn_norm, false)) ||
            (rc = ember_blk_attention_g4(&f, ly, rope, &ap)) ||
            (rc = ember_blk_norm(&f, &f.h, &f.h, &ly->post_attn_norm, false)) || (rc = ember_blk_residual(&f)) ||
            (rc = ember_blk_norm(&f, &f.h, &f.x, &ly->ffn_norm, false)) || (rc = ember_blk_mlp(&f, ly, c->act)) ||
            (c->moe_beside_mlp && (rc = ember_blk_moe_g4(&f, ly))) ||
            (rc = ember_blk_norm(&f, &f.h, &f.h, &ly->post_ffn_norm, false)) || (rc = ember_blk_residual(&f)) ||
            (c->ple_dim && (rc = ember_blk_ple(&f, l, ly))) || (rc = ember_blk_scale_x(&f, ly->layer_scalar)))
            break;
    }
    if (!rc) rc = ember_blk_logits(&f, &m->out_norm, false, c->final_softcap, logits);
    return rc;
}

const ember_family ember_family_gemma4 = {"gemma4", gemma4_load, gemma4_forward};
