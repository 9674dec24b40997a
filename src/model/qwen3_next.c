/*
 * qwen3_next.c - the hybrid linear-attention family: qwen3_next
 * (Qwen3-Next), qwen3_5_text (Qwen3.5 dense) and qwen3_5_moe_text (Qwen3.5
 * MoE), one network with other options.
 *
 * Layers are of two kinds (cfg.layer_linear, from layer_types). Per layer,
 * for a batch of T tokens, with Gemma-style norms x * (1 + w):
 *   h = rmsnorm(x)
 *   linear-attention layer (gated DeltaNet, C = 2 Hk Dk + Hv Dv channels):
 *     x_qkv = h Wqkv [T, C] ; z = h Wz [T, Hv Dv] ; b = h Wb, a = h Wa [T, Hv]
 *     o = delta_net(x_qkv, b, a) (backend.h: causal conv, silu, l2-normed q
 *         and k, the gated delta rule over the row's recurrent state)
 *     o = rmsnorm_per_head(o) * w_norm * silu(z)   (a plain-weight norm)
 *     x += o Wout
 *   full-attention layer (gated):
 *     q | gate = h Wq (per head: D q values, then D gate values)
 *     q, k = per-head rmsnorm (1 + w); partial RoPE (partial_rotary_factor;
 *     Qwen3.5's interleaved M-RoPE equals it for text positions)
 *     x += (attention(q, cache) * sigmoid(gate)) Wo
 *   h = rmsnorm(x)
 *   MoE (qwen3_next, qwen3_5_moe_text): softmax top-k over the experts,
 *     renormalised, plus sigmoid(h Wsg) * shared_expert(h)
 *   dense (qwen3_5_text): x += (silu(h Wg) * h Wu) Wd
 * then logits = rmsnorm(x[wanted]) Wlm.
 *
 * qwen3_next stores the DeltaNet projections fused and grouped per key
 * head (in_proj_qkvz: per key head its q, k, then its Hv / Hk heads' v and
 * z; in_proj_ba: its b then a); Qwen3.5 stores them apart
 * (in_proj_qkv / z / b / a). The fused rows are regrouped once at load
 * into the separate layout, so one forward serves both. The gated q_proj
 * is regrouped the same way (q rows, then gate rows).
 *
 * The recurrent state (the convolution's inputs and S per value head) lives
 * in the KV cache's state slots (kv.h). GGUF files (qwen3next, qwen35,
 * qwen35moe as llama.cpp's converter writes them; names in gguf_model.c)
 * load through the same code: their in_proj_qkvz is already split
 * (attn_qkv / attn_gate), qwen3next's ssm_ba stays fused and is regrouped
 * here, conv1d is [C, K], ssm_a = -exp(A_log) is handed to delta_net as
 * is (ember_delta_w.a_neg), norms hold 1 + w (m->norm_plus_one false), and
 * Qwen3.5's value heads are in llama.cpp's tiled order (cfg.lin_v_tiled).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "family.h"

#define NAME(suffix) ember_layer_name(L, n, sizeof n, i, suffix)
#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

/* The DeltaNet tensors of layer i. */
static int load_linear(ember_loader *L, int i) {
    ember_llm *m = L->m;
    const ember_model_config *c = &m->cfg;
    ember_llm_layer *ly = &m->layers[i];
    const int64_t H = c->hidden_size, Hk = c->lin_k_heads, Hv = c->lin_v_heads, Dk = c->lin_k_dim, Dv = c->lin_v_dim,
                  K = c->lin_conv_k, C = 2 * Hk * Dk + Hv * Dv, Z = Hv * Dv, r = Hv / Hk;
    char n[256];
    int rc;
    const bool fused = ember_load_has(L, NAME("linear_attn.in_proj_qkvz.weight")); /* qwen3_next */
    /* qwen3_next's b and a are always fused (in GGUF too): a missing in_proj_ba is named as such */
    const bool fused_ba = ember_load_has(L, NAME("linear_attn.in_proj_ba.weight")) ||
                          strcmp(m->cfg.model_type, "qwen3_next") == 0;
    int32_t *perm = NULL;
    if (fused || fused_ba) {
        perm = ember_malloc((size_t)(Hk * (2 * Dk + 2 * r * Dv) + 2 * Hv) * sizeof *perm);
        if (!perm) return ember_err(L->err, EMBER_ERR_NOMEM, "out of memory");
    }
    if (fused) {
        /* per key head g: q [Dk], k [Dk], v [r Dv], z [r Dv] -> q all, k all, v all, z all */
        const int64_t W = 2 * Dk + 2 * r * Dv, rows = Hk * W;
        int64_t j = 0;
        for (int64_t g = 0; g < Hk; g++)
            for (int64_t e = 0; e < Dk; e++) perm[j++] = (int32_t)(g * W + e);
        for (int64_t g = 0; g < Hk; g++)
            for (int64_t e = 0; e < Dk; e++) perm[j++] = (int32_t)(g * W + Dk + e);
        for (int64_t g = 0; g < Hk; g++)
            for (int64_t e = 0; e < r * Dv; e++) perm[j++] = (int32_t)(g * W + 2 * Dk + e);
        for (int64_t g = 0; g < Hk; g++)
            for (int64_t e = 0; e < r * Dv; e++) perm[j++] = (int32_t)(g * W + 2 * Dk + r * Dv + e);
        ember_tensor *qkvz[2] = {&ly->lin_qkv, &ly->lin_z};
        rc = ember_load_regrouped(L, NAME("linear_attn.in_proj_qkvz.weight"), rows, H, perm, 2, qkvz,
                                  SHAPE(C, Z));
    } else if (!(rc = ember_load_tensor(L, &ly->lin_qkv, NAME("linear_attn.in_proj_qkv.weight"), 2, SHAPE(C, H),
                                        false, false))) {
        rc = ember_load_tensor(L, &ly->lin_z, NAME("linear_attn.in_proj_z.weight"), 2, SHAPE(Z, H), false, false);
    }
    if (!rc && fused_ba) {
        /* per key head g: b [r], a [r] -> b all, a all */
        for (int64_t g = 0, q = 0; g < Hk; g++)
            for (int64_t e = 0; e < r; e++, q++) {
                perm[q] = (int32_t)(g * 2 * r + e);
                perm[Hv + q] = (int32_t)(g * 2 * r + r + e);
            }
        ember_tensor *ba[2] = {&ly->lin_b, &ly->lin_a};
        rc = ember_load_regrouped(L, NAME("linear_attn.in_proj_ba.weight"), 2 * Hv, H, perm, 2, ba, SHAPE(Hv, Hv));
    } else if (!rc && !(rc = ember_load_tensor(L, &ly->lin_b, NAME("linear_attn.in_proj_b.weight"), 2, SHAPE(Hv, H),
                                               false, false))) {
        rc = ember_load_tensor(L, &ly->lin_a, NAME("linear_attn.in_proj_a.weight"), 2, SHAPE(Hv, H), false, false);
    }
    free(perm);
    if (rc) return rc;
    /* GGUF (llama.cpp's converter): conv1d squeezed to [C, K]; A_log stored as ssm_a = -exp(A_log) */
    if ((rc = L->gg ? ember_load_tensor(L, &ly->lin_conv, NAME("linear_attn.conv1d.weight"), 2, SHAPE(C, K), true, false)
                    : ember_load_tensor(L, &ly->lin_conv, NAME("linear_attn.conv1d.weight"), 3, SHAPE(C, 1, K), true,
                                        false)) ||
        (rc = ember_load_tensor(L, L->gg ? &ly->lin_a_neg : &ly->lin_a_log, NAME("linear_attn.A_log"), 1, SHAPE(Hv),
                                true, false)) ||
        (rc = ember_load_tensor(L, &ly->lin_dt_bias, NAME("linear_attn.dt_bias"), 1, SHAPE(Hv), true, false)) ||
        (rc = ember_load_tensor(L, &ly->lin_norm, NAME("linear_attn.norm.weight"), 1, SHAPE(Dv), true, false)) ||
        (rc = ember_load_tensor(L, &ly->lin_out, NAME("linear_attn.out_proj.weight"), 2, SHAPE(H, Z), false, false)))
        return rc;
    ly->lin_conv.ndim = 2; /* [C, 1, K] is [C, K] */
    ly->lin_conv.shape[1] = K;
    ly->lin_conv.shape[2] = 0;
    return EMBER_OK;
}

/* The gated full attention of layer i. */
static int load_attention(ember_loader *L, int i) {
    ember_llm *m = L->m;
    const ember_model_config *c = &m->cfg;
    ember_llm_layer *ly = &m->layers[i];
    const int64_t H = c->hidden_size, D = c->head_dim, Hq = c->n_heads, Q = Hq * D, KV = (int64_t)c->n_kv_heads * D;
    char n[256];
    int rc;
    /* q_proj per head: q [D], gate [D] -> q all, gate all */
    int32_t *perm = ember_malloc((size_t)(2 * Q) * sizeof *perm);
    if (!perm) return ember_err(L->err, EMBER_ERR_NOMEM, "out of memory");
    for (int64_t h = 0; h < Hq; h++)
        for (int64_t e = 0; e < D; e++) {
            perm[h * D + e] = (int32_t)(h * 2 * D + e);
            perm[Q + h * D + e] = (int32_t)(h * 2 * D + D + e);
        }
    ember_tensor *qg[2] = {&ly->wq, &ly->wq_gate};
    rc = ember_load_regrouped(L, NAME("self_attn.q_proj.weight"), 2 * Q, H, perm, 2, qg, SHAPE(Q, Q));
    free(perm);
    if (rc || (rc = ember_load_tensor(L, &ly->wk, NAME("self_attn.k_proj.weight"), 2, SHAPE(KV, H), false, false)) ||
        (rc = ember_load_tensor(L, &ly->wv, NAME("self_attn.v_proj.weight"), 2, SHAPE(KV, H), false, false)) ||
        (rc = ember_load_tensor(L, &ly->wo, NAME("self_attn.o_proj.weight"), 2, SHAPE(H, Q), false, false)) ||
        (rc = ember_load_tensor(L, &ly->q_norm, NAME("self_attn.q_norm.weight"), 1, SHAPE(D), true, false)) ||
        (rc = ember_load_tensor(L, &ly->k_norm, NAME("self_attn.k_norm.weight"), 1, SHAPE(D), true, false)))
        return rc;
    if (c->attn_bias &&
        ((rc = ember_load_tensor(L, &ly->bq, NAME("self_attn.q_proj.bias"), 1, SHAPE(Q), true, false)) ||
         (rc = ember_load_tensor(L, &ly->bk, NAME("self_attn.k_proj.bias"), 1, SHAPE(KV), true, false)) ||
         (rc = ember_load_tensor(L, &ly->bv, NAME("self_attn.v_proj.bias"), 1, SHAPE(KV), true, false))))
        return rc;
    return EMBER_OK;
}

/* Layer i's MLP: the MoE block with its gated shared expert, or dense. */
static int load_mlp(ember_loader *L, int i) {
    ember_llm *m = L->m;
    const ember_model_config *c = &m->cfg;
    ember_llm_layer *ly = &m->layers[i];
    const int64_t H = c->hidden_size, I = c->intermediate_size, Is = c->shared_expert_size;
    char n[256];
    int rc;
    if (!c->layer_moe[i]) {
        if ((rc = ember_load_tensor(L, &ly->w_gate, NAME("mlp.gate_proj.weight"), 2, SHAPE(I, H), false, false)) ||
            (rc = ember_load_tensor(L, &ly->w_up, NAME("mlp.up_proj.weight"), 2, SHAPE(I, H), false, false)) ||
            (rc = ember_load_tensor(L, &ly->w_down, NAME("mlp.down_proj.weight"), 2, SHAPE(H, I), false, false)))
            return rc;
        return EMBER_OK;
    }
    if ((rc = ember_load_moe(L, i))) return rc;
    if (!Is) return EMBER_OK;
    if ((rc = ember_load_tensor(L, &ly->sh_gate, NAME("mlp.shared_expert.gate_proj.weight"), 2, SHAPE(Is, H), false,
                                false)) ||
        (rc = ember_load_tensor(L, &ly->sh_up, NAME("mlp.shared_expert.up_proj.weight"), 2, SHAPE(Is, H), false,
                                false)) ||
        (rc = ember_load_tensor(L, &ly->sh_down, NAME("mlp.shared_expert.down_proj.weight"), 2, SHAPE(H, Is), false,
                                false)) ||
        (rc = ember_load_tensor(L, &ly->sh_expert_gate, NAME("mlp.shared_expert_gate.weight"), 2, SHAPE(1, H), false,
                                false)))
        return rc;
    return EMBER_OK;
}

int ember_hybrid_load_attn_layer(ember_loader *L, int i) {
    ember_llm *m = L->m;
    const int64_t H = m->cfg.hidden_size;
    char n[256];
    int rc;
    if ((rc = ember_load_tensor(L, &m->layers[i].attn_norm, NAME("input_layernorm.weight"), 1, SHAPE(H), true, false)) ||
        (rc = ember_load_tensor(L, &m->layers[i].ffn_norm, NAME("post_attention_layernorm.weight"), 1, SHAPE(H), true,
                                false)) ||
        (rc = load_attention(L, i)))
        return rc;
    return load_mlp(L, i);
}

/* The family's loader (family.h). */
static int hybrid_load(ember_loader *L) {
    ember_llm *m = L->m;
    const ember_model_config *c = &m->cfg;
    const ember_backend_ops *ops = m->be->ops;
    if (c->n_linear && (!ops->delta_net || !ops->delta_replay))
        return ember_err(L->err, EMBER_ERR_UNSUPPORTED,
                         "%s: the %s backend cannot run linear-attention layers (%s) yet", L->primary, ops->name,
                         c->model_type);
    if (!ops->sigmoid_mul || (c->n_experts && !ops->add_rows_scaled))
        return ember_err(L->err, EMBER_ERR_UNSUPPORTED, "%s: the %s backend cannot run %s yet", L->primary, ops->name,
                         c->model_type);
    int rc = ember_load_io(L);
    char n[256];
    for (int i = 0; !rc && i < c->n_layers; i++) {
        if (!(rc = ember_load_tensor(L, &m->layers[i].attn_norm, NAME("input_layernorm.weight"), 1,
                                     SHAPE(c->hidden_size), true, false)) &&
            !(rc = ember_load_tensor(L, &m->layers[i].ffn_norm, NAME("post_attention_layernorm.weight"), 1,
                                     SHAPE(c->hidden_size), true, false)))
            rc = c->layer_linear[i] ? load_linear(L, i) : load_attention(L, i);
        if (!rc) rc = load_mlp(L, i);
    }
    return rc;
}

/* The DeltaNet mixer of layer l on f->h, the result in f->h. */
static int blk_delta(ember_fwd *f, int l, const ember_llm_layer *ly) {
    ember_backend *be = f->m->be;
    const ember_backend_ops *ops = be->ops;
    const ember_model_config *c = &f->m->cfg;
    ember_llm_state *st = f->st;
    ember_error *err = f->err;
    const int T = f->T;
    const int64_t Hv = c->lin_v_heads, Dv = c->lin_v_dim, Z = Hv * Dv,
                  C = 2 * (int64_t)c->lin_k_heads * c->lin_k_dim + Z;
    ember_tensor x = st->lin_x, z = st->lin_z, b = st->lin_b, a = st->lin_a, o = st->lin_o;
    x.shape[0] = z.shape[0] = b.shape[0] = a.shape[0] = o.shape[0] = T;
    x.nbytes = (size_t)T * (size_t)C * 4;
    z.nbytes = o.nbytes = (size_t)T * (size_t)Z * 4;
    b.nbytes = a.nbytes = (size_t)T * (size_t)Hv * 4;
    ember_tensor oh = o; /* [T * Hv, Dv]: per-head norm */
    oh.shape[0] = (int64_t)T * Hv;
    oh.shape[1] = Dv;
    ember_matmul in[4] = {{&x, &ly->lin_qkv, NULL}, {&z, &ly->lin_z, NULL}, {&b, &ly->lin_b, NULL}, {&a, &ly->lin_a, NULL}};
    ember_matmul out = {&f->h, &ly->lin_out, NULL};
    ember_rec_map map;
    ember_kv_rec_map_for(f->kv, l, f->b->row, f->b->pos, &map);
    const ember_delta_w w = {&ly->lin_conv, &ly->lin_a_log, &ly->lin_dt_bias, ly->lin_a_neg.buf ? &ly->lin_a_neg : NULL};
    int rc;
    if ((rc = ops->matmul(be, &f->h, 4, in, err)) || (rc = ops->delta_net(be, &o, &x, &b, &a, &w, &map, err)) ||
        (rc = ops->rms_norm(be, &oh, &oh, &ly->lin_norm, c->rms_norm_eps, false, err)) ||
        (rc = ops->swiglu(be, &o, &z, &o, err)) || (rc = ops->matmul(be, &o, 1, &out, err)))
        return rc;
    return EMBER_OK;
}

/* The family's forward pass (family.h). */
static int hybrid_forward(ember_llm *m, ember_llm_state *st, ember_kv *kv, const ember_batch *b, float *logits,
                          ember_error *err) {
    const ember_model_config *c = &m->cfg;
    ember_fwd f;
    ember_fwd_init(&f, m, st, kv, b, err);
    const ember_rope rope = {m->inv_freq, m->n_rot, m->rope_mode, m->attn_factor};
    const ember_attn ap = {1.0f / sqrtf((float)c->head_dim), 0, 0.0f};
    const bool p1 = m->norm_plus_one; /* x * (1 + w); a GGUF stores the 1 + w */
    int rc = ember_blk_embed(&f, 1.0f);
    for (int l = 0; !rc && l < c->n_layers; l++) {
        const ember_llm_layer *ly = &m->layers[l];
        if ((rc = ember_blk_tap(&f, l)) || (rc = ember_blk_norm(&f, &f.h, &f.x, &ly->attn_norm, p1)) ||
            (rc = c->layer_linear[l] ? blk_delta(&f, l, ly) : ember_blk_attention(&f, l, ly, &rope, &ap, p1)) ||
            (rc = ember_blk_residual(&f)) || (rc = ember_blk_norm(&f, &f.h, &f.x, &ly->ffn_norm, p1)) ||
            (rc = ly->experts ? ember_blk_moe(&f, ly) : ember_blk_mlp(&f, ly, c->act)) ||
            (rc = ember_blk_residual(&f)))
            break;
    }
    if (!rc) rc = ember_blk_logits(&f, &m->out_norm, p1, 0.0f, logits);
    return rc;
}

const ember_family ember_family_qwen3_next = {"qwen3_next", hybrid_load, hybrid_forward};
