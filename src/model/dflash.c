/*
 * dflash.c - DFlash draft models (the published format of z-lab's DFlash:
 * a Qwen3 config whose architectures name DFlashDraftModel, with
 * block_size, num_target_layers and dflash_config {mask_token_id,
 * target_layer_ids}; safetensors with layers.i.* (Qwen3 decoder layers:
 * q/k norms, SwiGLU), norm, fc [H, n * H] and hidden_norm; no embedding
 * and no lm_head: the target's are used).
 *
 * Context: the target's taps at each position (the outputs of layers
 * target_layer_ids, i.e. the residual stream entering layer id + 1, or the
 * final norm's output for the last layer, as transformers' hidden_states
 * list gives them) give ctx = hidden_norm(fc(taps)); every layer keeps
 * k_norm(ctx Wk) (with RoPE at the position) and ctx Wv in its cache,
 * nothing else: context positions have no residual stream.
 * Block: a round feeds the row's last known token and block - 1 mask
 * tokens at the positions after the context, x = embed(tokens); per layer
 * x += attention(q_norm(h Wq), keys and values of the context and of the
 * whole block, h = norm(x)) (no causal mask inside the block), x +=
 * mlp(norm(x)); logits = lm_head(norm(x)). The mask positions' argmax are
 * the drafts, all of a block at once. The block's keys and values are
 * written to the cache (that is where attention reads them) and trimmed by
 * the caller after the round.
 *
 * Non-causal attention through the causal kernel: the keys and values are
 * written at each token's own position, and attention reads them with a
 * map built from att_pos (the block's last position for every token of
 * it), RoPE applied at the true positions beforehand.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "family.h"

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

/* The family's loader (family.h): the Qwen3 layers (read through the
   weights' empty text prefix: layers.i.* as model.layers.i.*), the final
   norm, fc and hidden_norm. */
static int df_load(ember_loader *L) {
    ember_llm *m = L->m;
    const ember_model_config *c = &m->cfg;
    const int64_t H = c->hidden_size, n = c->df_n_ids ? c->df_n_ids : c->n_layers;
    int rc = EMBER_OK;
    if (!L->w) return ember_err(L->err, EMBER_ERR_UNSUPPORTED, "%s: DFlash draft models load from safetensors only", L->primary);
    for (int i = 0; !rc && i < c->n_layers; i++) rc = ember_llama_load_layer(L, i);
    if (rc || (rc = ember_load_tensor(L, &m->out_norm, "model.norm.weight", 1, SHAPE(H), true, false)) ||
        (rc = ember_load_tensor(L, &m->e3_fc, "model.fc.weight", 2, SHAPE(H, n * H), false, false)) ||
        (rc = ember_load_tensor(L, &m->e3_hidden_norm, "model.hidden_norm.weight", 1, SHAPE(H), true, false)))
        return rc;
    return EMBER_OK;
}

static int df_forward_refused(ember_llm *m, ember_llm_state *st, ember_kv *kv, const ember_batch *b, float *logits,
                              ember_error *err) {
    (void)m, (void)st, (void)kv, (void)b, (void)logits;
    return ember_err(err, EMBER_ERR_INVALID_ARG, "a DFlash draft model runs only beside its target (--spec dflash)");
}

const ember_family ember_family_dflash = {"dflash", df_load, df_forward_refused};

int ember_dflash_bind(ember_llm *draft, const ember_llm *target, int32_t *taps, int *n_taps, ember_error *err) {
    const ember_model_config *d = &draft->cfg, *t = &target->cfg;
    *n_taps = 0;
    if (!d->dflash) return ember_err(err, EMBER_ERR_INVALID_ARG, "the draft model is not a DFlash draft model");
    if (d->vocab_size != t->vocab_size)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "DFlash draft model: vocab_size %d does not match the target's %d",
                         d->vocab_size, t->vocab_size);
    if (d->hidden_size != t->hidden_size)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "DFlash draft model: hidden_size %d does not match the target's %d",
                         d->hidden_size, t->hidden_size);
    const int N = t->n_layers;
    if (d->df_n_target && d->df_n_target != N)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "DFlash draft model: num_target_layers %d, the target has %d layers",
                         d->df_n_target, N);
    const int n = d->df_n_ids ? d->df_n_ids : d->n_layers;
    if (n > 8) return ember_err(err, EMBER_ERR_UNSUPPORTED, "DFlash draft model: %d target layers (8 at most)", n);
    for (int i = 0; i < n; i++) { /* the published default: one middle layer, or spread over 1 .. N - 3 */
        int id = d->df_n_ids ? d->df_ids[i]
                 : n == 1    ? N / 2
                             : (int)lround(1.0 + (double)i * (double)(N - 4) / (double)(n - 1));
        if (id < 0 || id >= N)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "DFlash draft model: %s names layer %d of a %d-layer target",
                             d->df_n_ids ? "dflash_config.target_layer_ids" : "the default target layers", id, N);
        taps[i] = id + 1 == N ? EMBER_TAP_NORMED : id + 1; /* layer id's output; the last one's is after the norm */
    }
    draft->embed = target->embed; /* views: the target owns them */
    draft->lm_head = target->lm_head;
    *n_taps = n;
    return EMBER_OK;
}

int ember_dflash_context(ember_llm *m, ember_llm_state *st, ember_kv *kv, int n, const int32_t *row, const int32_t *pos,
                         const float *taps, ember_error *err) {
    if (!m->cfg.dflash || !m->embed.buf || n < 1 || n > st->max_tokens)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "DFlash context: %d positions (1..%d), bound model", n, st->max_tokens);
    int rc = ember_kv_begin(kv, row, pos, n, err);
    if (rc) return rc;
    ember_backend *be = m->be;
    const ember_backend_ops *ops = be->ops;
    const int H = m->cfg.hidden_size;
    const int64_t W = st->e3_tin.shape[1];
    ember_batch b = {.n = n, .tok = row, .pos = pos, .row = row};
    ember_fwd f;
    ember_fwd_init(&f, m, st, kv, &b, err);
    const ember_rope rope = {m->inv_freq, m->n_rot, m->rope_mode, m->attn_factor};
    ember_tensor tin = ember_f32_rows(&st->e3_tin, 0, n, W), ctx = ember_f32_rows(&st->e3_hid, 0, n, H);
    ember_matmul fc = {&ctx, &m->e3_fc, NULL};
    if (!(rc = ops->write(be, &tin, 0, taps, (size_t)n * (size_t)W * 4, err)) && !(rc = ops->matmul(be, &tin, 1, &fc, err)))
        rc = ops->rms_norm(be, &ctx, &ctx, &m->e3_hidden_norm, m->cfg.rms_norm_eps, false, err);
    for (int l = 0; !rc && l < m->cfg.n_layers; l++) {
        const ember_llm_layer *ly = &m->layers[l];
        ember_matmul kv2[2] = {{&f.k, &ly->wk, NULL}, {&f.v, &ly->wv, NULL}};
        ember_kv_layer views[2];
        ember_kv_map map;
        ember_kv_map_for(kv, l, row, pos, views, &map);
        if ((rc = ops->matmul(be, &ctx, 2, kv2, err)) ||
            (ly->k_norm.buf && (rc = ops->rms_norm(be, &f.kh, &f.kh, &ly->k_norm, m->cfg.rms_norm_eps, false, err))) ||
            (rc = ops->rope(be, &f.k3, pos, &rope, err)) || (rc = ops->kv_write(be, &map, &f.k3, &f.v3, err)))
            break;
    }
    ember_kv_end(kv, rc == EMBER_OK);
    return rc;
}

/* Layer l of a block: attention over the context and the whole block, then the MLP. */
static int block_layer(ember_fwd *f, int l, const int32_t *att_pos) {
    ember_llm *m = f->m;
    ember_backend *be = m->be;
    const ember_backend_ops *ops = be->ops;
    const ember_llm_layer *ly = &m->layers[l];
    const float eps = m->cfg.rms_norm_eps;
    const ember_rope rope = {m->inv_freq, m->n_rot, m->rope_mode, m->attn_factor};
    const ember_attn ap = {1.0f / sqrtf((float)m->cfg.head_dim), 0, 0.0f};
    ember_matmul qkv[3] = {{&f->q, &ly->wq, NULL}, {&f->k, &ly->wk, NULL}, {&f->v, &ly->wv, NULL}};
    ember_matmul o = {&f->h, &ly->wo, NULL};
    ember_kv_layer wviews[2], aviews[2];
    ember_kv_map wmap, amap;
    ember_kv_map_for(f->kv, l, f->b->row, f->b->pos, wviews, &wmap);
    ember_kv_map_for(f->kv, l, f->b->row, att_pos, aviews, &amap);
    int rc;
    if ((rc = ember_blk_norm(f, &f->h, &f->x, &ly->attn_norm, false)) || (rc = ops->matmul(be, &f->h, 3, qkv, f->err)) ||
        (ly->q_norm.buf && ((rc = ops->rms_norm(be, &f->qh, &f->qh, &ly->q_norm, eps, false, f->err)) ||
                            (rc = ops->rms_norm(be, &f->kh, &f->kh, &ly->k_norm, eps, false, f->err)))) ||
        (rc = ops->rope(be, &f->q3, f->b->pos, &rope, f->err)) || (rc = ops->rope(be, &f->k3, f->b->pos, &rope, f->err)) ||
        (rc = ops->kv_write(be, &wmap, &f->k3, &f->v3, f->err)) ||
        (rc = ops->attention(be, &f->att3, &f->q3, &amap, &ap, f->err)) || (rc = ops->matmul(be, &f->att, 1, &o, f->err)) ||
        (rc = ember_blk_residual(f)) || (rc = ember_blk_norm(f, &f->h, &f->x, &ly->ffn_norm, false)) ||
        (rc = ember_blk_mlp(f, ly, EMBER_ACT_SILU)) || (rc = ember_blk_residual(f)))
        return rc;
    return EMBER_OK;
}

int ember_dflash_block(ember_llm *m, ember_llm_state *st, ember_kv *kv, const ember_batch *b, const int32_t *att_pos,
                       float *logits, ember_error *err) {
    if (!m->cfg.dflash || !m->embed.buf || b->n < 1 || b->n > st->max_tokens || b->n_out < 0 || b->n_out > b->n)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "DFlash block: a batch of %d tokens (1..%d), bound model", b->n,
                         st->max_tokens);
    for (int i = 0; i < b->n; i++)
        if (b->tok[i] < 0 || b->tok[i] >= m->cfg.vocab_size || att_pos[i] < b->pos[i])
            return ember_err(err, EMBER_ERR_INVALID_ARG, "DFlash block: token %d: id or attention span out of range", i);
    for (int j = 0; j < b->n_out; j++)
        if (b->out[j] < 0 || b->out[j] >= b->n)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "DFlash block: output %d out of range", j);
    int rc = ember_kv_begin(kv, b->row, b->pos, b->n, err);
    if (rc) return rc;
    ember_fwd f;
    ember_fwd_init(&f, m, st, kv, b, err);
    rc = ember_blk_embed(&f, 1.0f);
    for (int l = 0; !rc && l < m->cfg.n_layers; l++) rc = block_layer(&f, l, att_pos);
    if (!rc) rc = ember_blk_logits(&f, &m->out_norm, false, 0.0f, logits);
    ember_kv_end(kv, rc == EMBER_OK);
    return rc;
}
