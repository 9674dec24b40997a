/*
 * eagle3.c - EAGLE-3 draft models (the published format of SafeAILab's
 * EAGLE-3: a config.json whose architectures name Eagle3 or that has
 * draft_vocab_size, and safetensors with these tensors):
 *
 *   fc.weight                       [H, n_aux * Ht]  fuses the target's taps
 *   midlayer.hidden_norm.weight     [H]              norms the hidden input
 *   midlayer.input_layernorm.weight [H]              norms the token embedding
 *   midlayer.self_attn.{q,k,v}_proj [Q | KV, 2H]     over cat(embedding, hidden)
 *   midlayer.self_attn.o_proj       [H, Q]
 *   midlayer.post_attention_layernorm, midlayer.mlp.{gate,up,down}_proj
 *   norm.weight [H], lm_head.weight [Vd, H]         logits over the draft vocabulary
 *   d2t [Vd] (int64)                                 draft id i is target id i + d2t[i]
 *   t2d [V] (bool, unused), embed_tokens.weight [V, H] (optional: else the target's)
 *
 * For one token, with g its hidden input (fc(taps) when the target's taps
 * of the position before are fed, the draft's own output when it drafts
 * on from its own proposal):
 *   r = g ; a = cat(rmsnorm(embed[tok]) * w_in, rmsnorm(g) * w_hid)
 *   x = r + attention(a)             (one Llama attention, RoPE, own cache)
 *   x = x + mlp(rmsnorm(x) * w_post) (SwiGLU)
 *   hidden out = x ; logits = lm_head(rmsnorm(x) * w_norm)
 * The concatenation is built as rows: the normed embeddings and the normed
 * hidden states stacked [2T, H], regathered in the order e0 g0 e1 g1 ...,
 * which read as [T, 2H] is cat(e_t, g_t) per token. Every op is row-wise,
 * so the draft model is batch invariant like the target.
 *
 * Taps: the target's residual stream entering layers
 * eagle_config.eagle_aux_hidden_state_layer_ids (default 2, N / 2, N - 3,
 * as the published code records them), concatenated low to high.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "family.h"

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

/* d2t [Vd] int64 (when present) into m->e3_d2t, checked against the target's vocabulary. */
static int load_d2t(ember_loader *L) {
    ember_llm *m = L->m;
    const ember_model_config *c = &m->cfg;
    const int Vd = c->e3_draft_vocab;
    m->e3_d2t = ember_calloc((size_t)Vd, sizeof *m->e3_d2t);
    if (!m->e3_d2t) return ember_err(L->err, EMBER_ERR_NOMEM, "out of memory");
    ember_load_claim(L, "t2d"); /* the reverse map: not needed to draft */
    const ember_st_tensor *t = L->w ? ember_weights_find(L->w, "d2t", NULL) : NULL;
    if (!t) {
        if (Vd != c->vocab_size)
            return ember_err(L->err, EMBER_ERR_FORMAT, "%s: missing tensor 'd2t' (draft_vocab_size %d is not vocab_size %d)",
                             L->primary, Vd, c->vocab_size);
        return EMBER_OK; /* the identity */
    }
    ember_load_claim(L, "d2t");
    if (t->dtype != EMBER_I64 || t->ndim != 1 || t->shape[0] != Vd)
        return ember_err(L->err, EMBER_ERR_FORMAT, "%s: tensor 'd2t' must be int64 [%d] (draft_vocab_size)", L->primary, Vd);
    for (int i = 0; i < Vd; i++) {
        int64_t off;
        memcpy(&off, t->data + 8 * (size_t)i, 8);
        if (off < -(int64_t)i || off >= (int64_t)c->vocab_size - i)
            return ember_err(L->err, EMBER_ERR_FORMAT, "%s: d2t[%d] = %lld maps outside vocab_size %d", L->primary, i,
                             (long long)off, c->vocab_size);
        m->e3_d2t[i] = (int32_t)off;
    }
    return EMBER_OK;
}

/* The family's loader (family.h): every tensor of the list above. */
static int e3_load(ember_loader *L) {
    ember_llm *m = L->m;
    const ember_model_config *c = &m->cfg;
    ember_llm_layer *ly = &m->layers[0];
    const int64_t H = c->hidden_size, D = c->head_dim, Q = (int64_t)c->n_heads * D, KV = (int64_t)c->n_kv_heads * D,
                  I = c->intermediate_size, Ht = c->e3_target_hidden, A = c->e3_n_aux ? c->e3_n_aux : 3;
    int rc;
    if (!L->w) return ember_err(L->err, EMBER_ERR_UNSUPPORTED, "%s: EAGLE-3 draft models load from safetensors only", L->primary);
    if ((rc = ember_load_tensor(L, &m->e3_fc, "fc.weight", 2, SHAPE(H, A * Ht), false, false)) ||
        (rc = ember_load_tensor(L, &m->e3_hidden_norm, "midlayer.hidden_norm.weight", 1, SHAPE(H), true, false)) ||
        (rc = ember_load_tensor(L, &ly->attn_norm, "midlayer.input_layernorm.weight", 1, SHAPE(H), true, false)) ||
        (rc = ember_load_tensor(L, &ly->wq, "midlayer.self_attn.q_proj.weight", 2, SHAPE(Q, 2 * H), false, false)) ||
        (rc = ember_load_tensor(L, &ly->wk, "midlayer.self_attn.k_proj.weight", 2, SHAPE(KV, 2 * H), false, false)) ||
        (rc = ember_load_tensor(L, &ly->wv, "midlayer.self_attn.v_proj.weight", 2, SHAPE(KV, 2 * H), false, false)) ||
        (rc = ember_load_tensor(L, &ly->wo, "midlayer.self_attn.o_proj.weight", 2, SHAPE(H, Q), false, false)) ||
        (rc = ember_load_tensor(L, &ly->ffn_norm, "midlayer.post_attention_layernorm.weight", 1, SHAPE(H), true, false)) ||
        (rc = ember_load_tensor(L, &ly->w_gate, "midlayer.mlp.gate_proj.weight", 2, SHAPE(I, H), false, false)) ||
        (rc = ember_load_tensor(L, &ly->w_up, "midlayer.mlp.up_proj.weight", 2, SHAPE(I, H), false, false)) ||
        (rc = ember_load_tensor(L, &ly->w_down, "midlayer.mlp.down_proj.weight", 2, SHAPE(H, I), false, false)) ||
        (rc = ember_load_tensor(L, &m->out_norm, "norm.weight", 1, SHAPE(H), true, false)) ||
        (rc = ember_load_tensor(L, &m->lm_head, "lm_head.weight", 2, SHAPE(c->e3_draft_vocab, H), false, false)) ||
        (rc = ember_load_tensor(L, &m->embed, "embed_tokens.weight", 2, SHAPE(c->vocab_size, H), false, true)))
        return rc;
    m->e3_own_embed = m->embed.buf != NULL;
    return load_d2t(L);
}

static int e3_forward_refused(ember_llm *m, ember_llm_state *st, ember_kv *kv, const ember_batch *b, float *logits,
                              ember_error *err) {
    (void)m, (void)st, (void)kv, (void)b, (void)logits;
    return ember_err(err, EMBER_ERR_INVALID_ARG, "an EAGLE-3 draft model runs only beside its target (--spec eagle3)");
}

const ember_family ember_family_eagle3 = {"eagle3", e3_load, e3_forward_refused};

int ember_eagle3_bind(ember_llm *draft, const ember_llm *target, int32_t *taps, int *n_taps, ember_error *err) {
    const ember_model_config *d = &draft->cfg, *t = &target->cfg;
    *n_taps = 0;
    if (!d->eagle3) return ember_err(err, EMBER_ERR_INVALID_ARG, "the draft model is not an EAGLE-3 draft model");
    if (d->vocab_size != t->vocab_size)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "EAGLE-3 draft model: vocab_size %d does not match the target's %d",
                         d->vocab_size, t->vocab_size);
    if (d->e3_target_hidden != t->hidden_size)
        return ember_err(err, EMBER_ERR_INVALID_ARG,
                         "EAGLE-3 draft model: %s %d does not match the target's hidden_size %d",
                         d->e3_target_hidden_set ? "target_hidden_size" : "hidden_size", d->e3_target_hidden,
                         t->hidden_size);
    if (!draft->e3_own_embed && d->hidden_size != t->hidden_size)
        return ember_err(err, EMBER_ERR_INVALID_ARG,
                         "EAGLE-3 draft model: hidden_size %d differs from the target's %d and it has no embed_tokens",
                         d->hidden_size, t->hidden_size);
    const int N = t->n_layers, n = d->e3_n_aux ? d->e3_n_aux : 3;
    const int def[3] = {2, N / 2, N - 3};
    for (int i = 0; i < n; i++) {
        int l = d->e3_n_aux ? d->e3_aux[i] : def[i];
        if (l < 0 || l > N)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "EAGLE-3 draft model: %s names layer %d of a %d-layer target",
                             d->e3_n_aux ? "eagle_config.eagle_aux_hidden_state_layer_ids" : "the default tap layers (2, N/2, N-3)",
                             l, N);
        taps[i] = l;
    }
    if (!draft->e3_own_embed) draft->embed = target->embed; /* a view: the target owns it */
    *n_taps = n;
    return EMBER_OK;
}

/* x = the hidden input; the attention's input cat(norm(embed[tok]), norm(x)) into st->e3_c. */
static int e3_input(ember_fwd *f, const float *taps, const int32_t *hid_src, ember_tensor *cat) {
    ember_llm *m = f->m;
    ember_backend *be = m->be;
    const ember_backend_ops *ops = be->ops;
    ember_llm_state *st = f->st;
    const int T = f->T, H = m->cfg.hidden_size;
    const float eps = m->cfg.rms_norm_eps;
    int rc;
    if (taps) {
        const int64_t W = st->e3_tin.shape[1];
        ember_tensor tin = ember_f32_rows(&st->e3_tin, 0, T, W);
        ember_matmul fc = {&f->x, &m->e3_fc, NULL};
        if ((rc = ops->write(be, &tin, 0, taps, (size_t)T * (size_t)W * 4, f->err)) || (rc = ops->matmul(be, &tin, 1, &fc, f->err)))
            return rc;
    } else if ((rc = ops->get_rows(be, &f->x, &st->e3_hid, hid_src, T, f->err))) {
        return rc;
    }
    ember_tensor e = ember_f32_rows(&st->e3_s, 0, T, H), g = ember_f32_rows(&st->e3_s, T, T, H), s = ember_f32_rows(&st->e3_s, 0, 2 * T, H);
    ember_tensor c2 = ember_f32_rows(&st->e3_c, 0, 2 * T, H);
    for (int i = 0; i < T; i++) st->e3_idx[2 * i] = i, st->e3_idx[2 * i + 1] = T + i;
    if ((rc = ops->get_rows(be, &e, &m->embed, f->b->tok, T, f->err)) ||
        (rc = ops->rms_norm(be, &e, &e, &m->layers[0].attn_norm, eps, false, f->err)) ||
        (rc = ops->rms_norm(be, &g, &f->x, &m->e3_hidden_norm, eps, false, f->err)) ||
        (rc = ops->get_rows(be, &c2, &s, st->e3_idx, 2 * T, f->err)))
        return rc;
    *cat = ember_f32_rows(&st->e3_c, 0, T, 2 * H);
    return EMBER_OK;
}

/* The midlayer after its input: x += attention(cat); x += mlp(norm(x)). */
static int e3_layer(ember_fwd *f, const ember_tensor *cat) {
    ember_llm *m = f->m;
    ember_backend *be = m->be;
    const ember_backend_ops *ops = be->ops;
    const ember_llm_layer *ly = &m->layers[0];
    const ember_rope rope = {m->inv_freq, m->n_rot, m->rope_mode, m->attn_factor};
    const ember_attn ap = {1.0f / sqrtf((float)m->cfg.head_dim), 0, 0.0f};
    ember_matmul qkv[3] = {{&f->q, &ly->wq, NULL}, {&f->k, &ly->wk, NULL}, {&f->v, &ly->wv, NULL}};
    ember_matmul o = {&f->h, &ly->wo, NULL};
    ember_kv_layer views[2];
    ember_kv_map map;
    ember_kv_map_for(f->kv, 0, f->b->row, f->b->pos, views, &map);
    int rc;
    if ((rc = ops->matmul(be, cat, 3, qkv, f->err)) || (rc = ops->rope(be, &f->q3, f->b->pos, &rope, f->err)) ||
        (rc = ops->rope(be, &f->k3, f->b->pos, &rope, f->err)) || (rc = ops->kv_write(be, &map, &f->k3, &f->v3, f->err)) ||
        (rc = ops->attention(be, &f->att3, &f->q3, &map, &ap, f->err)) || (rc = ops->matmul(be, &f->att, 1, &o, f->err)) ||
        (rc = ember_blk_residual(f)) || (rc = ember_blk_norm(f, &f->h, &f->x, &ly->ffn_norm, false)) ||
        (rc = ember_blk_mlp(f, ly, EMBER_ACT_SILU)) || (rc = ember_blk_residual(f)))
        return rc;
    return EMBER_OK;
}

/* The drafters' outputs (EAGLE-3 here, MTP heads in mtp.c): the wanted
   tokens' rows of f->x into st->e3_hid rows hid_dst, and their logits over V
   ids through m->lm_head into host memory (logits: n_out x V floats), the
   rows first put through m->out_norm when norm is set. Returns an error code;
   writes nothing it was not asked for. */
int ember_draft_outputs(ember_fwd *f, const int32_t *hid_dst, float *logits, int V, bool norm) {
    ember_llm *m = f->m;
    ember_backend *be = m->be;
    const ember_backend_ops *ops = be->ops;
    ember_llm_state *st = f->st;
    const ember_batch *b = f->b;
    const int H = m->cfg.hidden_size;
    int rc;
    for (int j = 0; j < b->n_out; j++)
        if ((rc = ops->copy(be, &st->e3_hid, (size_t)hid_dst[j] * H * 4, &f->x, (size_t)b->out[j] * H * 4, (size_t)H * 4,
                            f->err)))
            return rc;
    for (int o0 = 0; o0 < b->n_out; o0 += st->max_logit_rows) {
        int n = b->n_out - o0 < st->max_logit_rows ? b->n_out - o0 : st->max_logit_rows;
        ember_tensor sel = ember_f32_rows(&st->sel, 0, n, H), lg = ember_f32_rows(&st->logits, 0, n, V);
        ember_matmul head = {&lg, &m->lm_head, NULL};
        if ((rc = ops->get_rows(be, &sel, &f->x, b->out + o0, n, f->err)) ||
            (norm && (rc = ops->rms_norm(be, &sel, &sel, &m->out_norm, m->cfg.rms_norm_eps, false, f->err))) ||
            (rc = ops->matmul(be, &sel, 1, &head, f->err)) ||
            (rc = ops->read(be, &lg, 0, logits + (size_t)o0 * (size_t)V, (size_t)n * (size_t)V * 4, f->err)))
            return rc;
    }
    return EMBER_OK;
}

/* The checks both drafters' forwards make of their arguments (what names
   the forward in the messages): a batch of 1..st->max_tokens tokens with ids
   in the vocabulary, taps or in-range hidden rows to read, outputs within the
   batch and the hidden rows. Returns EMBER_OK or EMBER_ERR_INVALID_ARG. */
int ember_draft_check(const ember_llm *m, const ember_llm_state *st, const ember_batch *b, const float *taps,
                      const int32_t *hid_src, const int32_t *hid_dst, const char *what, ember_error *err) {
    if (b->n < 1 || b->n > st->max_tokens || b->n_out < 0 || b->n_out > b->n || (!taps && !hid_src))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: a batch of %d tokens (1..%d)", what, b->n, st->max_tokens);
    for (int i = 0; i < b->n; i++)
        if (b->tok[i] < 0 || b->tok[i] >= m->cfg.vocab_size || (!taps && (hid_src[i] < 0 || hid_src[i] >= st->max_tokens)))
            return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: token %d: id or hidden row out of range", what, i);
    for (int j = 0; j < b->n_out; j++)
        if (b->out[j] < 0 || b->out[j] >= b->n || hid_dst[j] < 0 || hid_dst[j] >= st->max_tokens)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "%s: output %d out of range", what, j);
    return EMBER_OK;
}

int ember_eagle3_forward(ember_llm *m, ember_llm_state *st, ember_kv *kv, const ember_batch *b, const float *taps,
                         const int32_t *hid_src, const int32_t *hid_dst, float *logits, ember_error *err) {
    if (!m->cfg.eagle3 || !m->embed.buf)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "an EAGLE-3 draft model must be bound to its target first");
    int rc = ember_draft_check(m, st, b, taps, hid_src, hid_dst, "EAGLE-3 draft forward", err);
    if (rc) return rc;
    rc = ember_kv_begin(kv, b->row, b->pos, b->n, err);
    if (rc) return rc;
    ember_fwd f;
    ember_fwd_init(&f, m, st, kv, b, err);
    ember_tensor cat;
    if (!(rc = e3_input(&f, taps, hid_src, &cat)) && !(rc = e3_layer(&f, &cat))) rc = ember_draft_outputs(&f, hid_dst, logits, m->cfg.e3_draft_vocab, true);
    ember_kv_end(kv, rc == EMBER_OK);
    return rc;
}
