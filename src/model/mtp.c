/*
 * mtp.c - the multi-token-prediction (MTP) head of the hybrid families
 * (qwen3_next, qwen3_5_text, qwen3_5_moe_text), as their checkpoints carry
 * it beside the model: config mtp_num_hidden_layers (1) and the tensors
 *
 *   mtp.fc.weight                      [H, 2H]  over cat(embedding, hidden)
 *   mtp.pre_fc_norm_embedding.weight   [H]      norms the token's embedding
 *   mtp.pre_fc_norm_hidden.weight      [H]      norms the hidden input
 *   mtp.layers.0.*                     one decoder layer of the family, a
 *                                      full-attention one: input_layernorm,
 *                                      the gated q_proj (q and gate per head),
 *                                      k/v/o, q/k norms, post_attention_layernorm,
 *                                      the MLP (the MoE block with its gated
 *                                      shared expert where the model's layer 0
 *                                      is MoE, else dense)
 *   mtp.norm.weight                    [H]      the head's final norm
 *
 * and the model's own embedding and lm_head (lent by ember_mtp_bind; never
 * a copy). Every norm is the family's x * (1 + w). For one token, with g
 * its hidden input:
 *   c = fc(cat(norm_e(embed[tok]), norm_h(g)))     (embedding first)
 *   x = c + attention(norm(c)) ; x = x + mlp(norm(x))   (the layer, own KV)
 *   out = norm(x, mtp.norm) ; logits = lm_head(out)
 * and out is also the hidden input of the next draft step. The first step's
 * g is the target's hidden state after its final norm (EMBER_TAP_NORMED) at
 * the position before the token: position i of the head's row pairs the
 * target's state at t with token t + 1 and predicts token t + 2, exactly
 * as EAGLE-3 does (spec_eagle3.c runs both). This is the head as vLLM's
 * qwen3_next_mtp.py / qwen3_5_mtp.py run it (transformers ignores mtp.*).
 *
 * The head is an ember_llm of one layer whose config is the model's with
 * cfg.mtp set (ember_mtp_config); it loads from the model's own weight
 * store, reading mtp.* only and refusing a missing, misshapen or unread
 * mtp.* tensor by name. Safetensors only (a GGUF's nextn blocks are not
 * read). Every op is row-wise, so the head is batch invariant.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "family.h"

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

int ember_mtp_config(const ember_model_config *target, ember_model_config *out, ember_error *err) {
    memset(out, 0, sizeof *out);
    if (!target->n_linear || !target->attn_output_gate)
        return ember_err(err, EMBER_ERR_INVALID_ARG,
                         "%s has no MTP head (MTP heads are the hybrid families': qwen3_next, qwen3_5_text, "
                         "qwen3_5_moe_text)",
                         target->model_type);
    if (target->mtp_layers == 0)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "the model has no MTP head (config mtp_num_hidden_layers is 0)");
    if (target->mtp_layers > 1)
        return ember_err(err, EMBER_ERR_UNSUPPORTED, "mtp_num_hidden_layers %d: MTP heads of one layer are supported",
                         target->mtp_layers);
    *out = *target;
    out->mtp = true;
    out->n_layers = 1;
    out->n_linear = 0;
    out->layer_linear[0] = false;
    out->layer_window[0] = 0;
    out->layer_sliding[0] = false;
    out->n_mtp_layers = 0;
    /* layer 0's MoE choice: the MTP layer is numbered 0 as the published code builds it */
    return EMBER_OK;
}

/* The family's loader (family.h): the tensors listed above, names under mtp. */
static int mtp_load(ember_loader *L) {
    ember_llm *m = L->m;
    const int64_t H = m->cfg.hidden_size;
    int rc;
    if (!L->w) return ember_err(L->err, EMBER_ERR_UNSUPPORTED, "%s: MTP heads load from safetensors only", L->primary);
    L->layers = "mtp.layers";
    if ((rc = ember_load_tensor(L, &m->e3_fc, "mtp.fc.weight", 2, SHAPE(H, 2 * H), false, false)) ||
        (rc = ember_load_tensor(L, &m->mtp_embed_norm, "mtp.pre_fc_norm_embedding.weight", 1, SHAPE(H), true, false)) ||
        (rc = ember_load_tensor(L, &m->e3_hidden_norm, "mtp.pre_fc_norm_hidden.weight", 1, SHAPE(H), true, false)) ||
        (rc = ember_hybrid_load_attn_layer(L, 0)) ||
        (rc = ember_load_tensor(L, &m->out_norm, "mtp.norm.weight", 1, SHAPE(H), true, false)))
        return rc;
    return EMBER_OK;
}

static int mtp_forward_refused(ember_llm *m, ember_llm_state *st, ember_kv *kv, const ember_batch *b, float *logits,
                               ember_error *err) {
    (void)m, (void)st, (void)kv, (void)b, (void)logits;
    return ember_err(err, EMBER_ERR_INVALID_ARG, "an MTP head runs only beside its model (--spec mtp)");
}

const ember_family ember_family_mtp = {"mtp", mtp_load, mtp_forward_refused};

int ember_mtp_bind(ember_llm *head, const ember_llm *target, ember_error *err) {
    const ember_model_config *h = &head->cfg, *t = &target->cfg;
    if (!h->mtp) return ember_err(err, EMBER_ERR_INVALID_ARG, "not an MTP head");
    if (h->hidden_size != t->hidden_size || h->vocab_size != t->vocab_size)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "the MTP head (hidden %d, vocab %d) does not fit its model (%d, %d)",
                         h->hidden_size, h->vocab_size, t->hidden_size, t->vocab_size);
    head->embed = target->embed; /* views: the target owns them */
    head->lm_head = target->lm_head;
    return EMBER_OK;
}

/* f->x = fc(cat(norm_e(embed[tok]), norm_h(g))), g the taps or the kept hidden rows hid_src. */
static int mtp_input(ember_fwd *f, const float *taps, const int32_t *hid_src) {
    ember_llm *m = f->m;
    ember_backend *be = m->be;
    const ember_backend_ops *ops = be->ops;
    ember_llm_state *st = f->st;
    const int T = f->T, H = m->cfg.hidden_size;
    const float eps = m->cfg.rms_norm_eps;
    const bool p1 = m->norm_plus_one;
    ember_tensor g = ember_f32_rows(&st->e3_tin, 0, T, H);
    int rc;
    if (taps)
        rc = ops->write(be, &g, 0, taps, (size_t)T * (size_t)H * 4, f->err);
    else
        rc = ops->get_rows(be, &g, &st->e3_hid, hid_src, T, f->err);
    if (rc) return rc;
    ember_tensor e = ember_f32_rows(&st->e3_s, 0, T, H), gn = ember_f32_rows(&st->e3_s, T, T, H), s = ember_f32_rows(&st->e3_s, 0, 2 * T, H);
    ember_tensor c2 = ember_f32_rows(&st->e3_c, 0, 2 * T, H), cat = ember_f32_rows(&st->e3_c, 0, T, 2 * H);
    for (int i = 0; i < T; i++) st->e3_idx[2 * i] = i, st->e3_idx[2 * i + 1] = T + i;
    ember_matmul fc = {&f->x, &m->e3_fc, NULL};
    if ((rc = ops->get_rows(be, &e, &m->embed, f->b->tok, T, f->err)) ||
        (rc = ops->rms_norm(be, &e, &e, &m->mtp_embed_norm, eps, p1, f->err)) ||
        (rc = ops->rms_norm(be, &gn, &g, &m->e3_hidden_norm, eps, p1, f->err)) ||
        (rc = ops->get_rows(be, &c2, &s, st->e3_idx, 2 * T, f->err)) || (rc = ops->matmul(be, &cat, 1, &fc, f->err)))
        return rc;
    return EMBER_OK;
}

/* The layer on f->x, then f->x = norm(x, mtp.norm). */
static int mtp_layer(ember_fwd *f) {
    ember_llm *m = f->m;
    const ember_llm_layer *ly = &m->layers[0];
    const ember_rope rope = {m->inv_freq, m->n_rot, m->rope_mode, m->attn_factor};
    const ember_attn ap = {1.0f / sqrtf((float)m->cfg.head_dim), 0, 0.0f};
    const bool p1 = m->norm_plus_one;
    int rc;
    if ((rc = ember_blk_norm(f, &f->h, &f->x, &ly->attn_norm, p1)) ||
        (rc = ember_blk_attention(f, 0, ly, &rope, &ap, p1)) || (rc = ember_blk_residual(f)) ||
        (rc = ember_blk_norm(f, &f->h, &f->x, &ly->ffn_norm, p1)) ||
        (rc = ly->experts ? ember_blk_moe(f, ly) : ember_blk_mlp(f, ly, m->cfg.act)) || (rc = ember_blk_residual(f)) ||
        (rc = ember_blk_norm(f, &f->x, &f->x, &m->out_norm, p1)))
        return rc;
    return EMBER_OK;
}

int ember_mtp_forward(ember_llm *m, ember_llm_state *st, ember_kv *kv, const ember_batch *b, const float *taps,
                      const int32_t *hid_src, const int32_t *hid_dst, float *logits, ember_error *err) {
    if (!m->cfg.mtp || !m->embed.buf || !m->lm_head.buf)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "an MTP head must be bound to its model first");
    int rc = ember_draft_check(m, st, b, taps, hid_src, hid_dst, "MTP forward", err);
    if (rc) return rc;
    rc = ember_kv_begin(kv, b->row, b->pos, b->n, err);
    if (rc) return rc;
    ember_fwd f;
    ember_fwd_init(&f, m, st, kv, b, err);
    if (!(rc = mtp_input(&f, taps, hid_src)) && !(rc = mtp_layer(&f)))
        rc = ember_draft_outputs(&f, hid_dst, logits, m->cfg.vocab_size, false);
    ember_kv_end(kv, rc == EMBER_OK);
    return rc;
}
