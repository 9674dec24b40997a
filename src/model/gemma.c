/*
 * gemma.c - the gemma family: gemma2 and gemma3_text.
 *
 * Every norm is Gemma's RMSNorm, x * rsqrt(mean(x^2) + eps) * (1 + w)
 * (norm() below; a GGUF stores 1 + w, and m->norm_plus_one is false there).
 *
 *   x = embed[tok] * sqrt(hidden)
 *   per layer (sliding-window and global layers interleaved, layer_types):
 *     h = norm(x, input_layernorm)
 *     q, k, v = h Wq, h Wk, h Wv
 *     [gemma3] q, k = per-head norm(q, q_norm), norm(k, k_norm)
 *     q, k = rope(q, k)          gemma3: theta of the layer's kind
 *                                (rope_local on sliding layers)
 *     a = softmax(cap * tanh(q.k * s / cap)) v, s = query_pre_attn_scalar^-0.5,
 *         keys i - W < j <= i on sliding layers; no cap when
 *         attn_logit_softcapping is unset (gemma3)
 *     x += norm(a Wo, post_attention_layernorm)
 *     h = norm(x, pre_feedforward_layernorm)
 *     x += norm((gelu_tanh(h Wg) * h Wu) Wd, post_feedforward_layernorm)
 *   logits = norm(x, model.norm) Wembed^T (tied), then
 *            final_cap * tanh(logits / final_cap) when final_logit_softcapping is set
 */
#include <math.h>
#include <stdio.h>

#include "family.h"

/* Binds layer i's tensors (HuggingFace names), shapes from the config. */
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
    if (c->attn_bias &&
        ((rc = ember_load_tensor(L, &ly->bq, NAME("self_attn.q_proj.bias"), 1, SHAPE(Q), true, false)) ||
         (rc = ember_load_tensor(L, &ly->bk, NAME("self_attn.k_proj.bias"), 1, SHAPE(KV), true, false)) ||
         (rc = ember_load_tensor(L, &ly->bv, NAME("self_attn.v_proj.bias"), 1, SHAPE(KV), true, false)) ||
         (rc = ember_load_tensor(L, &ly->bo, NAME("self_attn.o_proj.bias"), 1, SHAPE(H), true, false))))
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
static int gemma_load(ember_loader *L) {
    int rc = ember_load_io(L);
    for (int i = 0; !rc && i < L->m->cfg.n_layers; i++) rc = load_layer(L, i);
    return rc;
}

/* The family's forward pass (family.h). */
static int gemma_forward(ember_llm *m, ember_llm_state *st, ember_kv *kv, const ember_batch *b, float *logits,
                         ember_error *err) {
    const ember_model_config *c = &m->cfg;
    const bool p1 = m->norm_plus_one;
    ember_fwd f;
    ember_fwd_init(&f, m, st, kv, b, err);
    const ember_rope rope_global = {m->inv_freq, m->n_rot, m->rope_mode, m->attn_factor};
    const ember_rope rope_local = {m->inv_freq_local, m->n_rot_local, m->rope_mode, m->attn_factor_local};
    const double qpas = c->query_pre_attn_scalar > 0 ? c->query_pre_attn_scalar : c->head_dim;
    const float scale = (float)pow(qpas, -0.5);
    int rc = ember_blk_embed(&f, (float)sqrt((double)c->hidden_size));
    for (int l = 0; !rc && l < c->n_layers; l++) {
        const ember_llm_layer *ly = &m->layers[l];
        const ember_attn ap = {scale, ly->window, c->attn_softcap};
        const ember_rope *rope = ly->local_rope ? &rope_local : &rope_global;
        if ((rc = ember_blk_tap(&f, l)) || (rc = ember_blk_norm(&f, &f.h, &f.x, &ly->attn_norm, p1)) ||
            (rc = ember_blk_attention(&f, l, ly, rope, &ap, p1)) ||
            (rc = ember_blk_norm(&f, &f.h, &f.h, &ly->post_attn_norm, p1)) ||
            (rc = ember_blk_residual_norm(&f, &ly->ffn_norm, p1)) || (rc = ember_blk_mlp(&f, ly, c->act)) ||
            (rc = ember_blk_norm(&f, &f.h, &f.h, &ly->post_ffn_norm, p1)) || (rc = ember_blk_residual(&f)))
            break;
    }
    if (!rc) rc = ember_blk_logits(&f, &m->out_norm, p1, c->final_softcap, logits);
    return rc;
}

const ember_family ember_family_gemma = {"gemma", gemma_load, gemma_forward};
