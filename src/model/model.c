/*
 * model.c - the life cycle every family shares: a model_type's family, the
 * RoPE tables (one per layer kind), the layers' windows, the family's
 * loader, the preparation step (each matrix handed once to the backend's
 * prepare_weight: docs/backend.md), the run state and the checks of a
 * batch. A safetensors store's loader gets MLX's matrix_source
 * (mlx_load.h): the one place the generic loading names MLX. The families themselves
 * are llama.c and gemma.c (family.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/util.h"
#include "formats/arch.h"
#include "family.h"
#include "mlx_load.h"
#include "rope.h"

/* Rows of logits computed (and read back) per output-head product: 16 in
   host memory; 64 on a device backend, where [64, V] floats of device memory
   are cheap and the head's weights (the largest matrix) are then read once
   per 64 rows instead of once per 16 (one launch of the GPU's mid-M kernel). */
#define LOGIT_ROWS 16
#define LOGIT_ROWS_DEVICE 64

/* ---- loading ------------------------------------------------------------------- */

void ember_llm_free(ember_llm *m) {
    if (!m) return;
    for (int i = 0; i < m->n_bufs; i++) ember_buffer_free(m->bufs[i]);
    free(m->bufs);
    for (int i = 0; m->layers && i < m->cfg.n_layers; i++) {
        free(m->layers[i].experts);
        free(m->layers[i].router_bias);
        free(m->layers[i].expert_scale);
    }
    free(m->layers);
    free(m->inv_freq);
    free(m->inv_freq_local);
    free(m->e3_d2t);
    ember_gguf_free(m->gguf);
    free(m);
}

/* Applies a GGUF rope_freqs.weight (per-dimension divisors, llama 3; on
   gemma4's full layers 1e30 or more marks the pairs proportional RoPE
   leaves at rest, whose frequency is 0 already). */
static int apply_freq_factors(ember_loader *L) {
    ember_llm *m = L->m;
    const ember_gguf_tensor *t = L->gg ? ember_gguf_find_tensor(L->gg, "rope_freqs.weight") : NULL;
    if (!t) return EMBER_OK;
    if (t->dtype != EMBER_F32 || t->nelem != (size_t)m->n_rot / 2)
        return ember_err(L->err, EMBER_ERR_FORMAT, "%s: rope_freqs.weight must be f32 [%d]", L->primary, m->n_rot / 2);
    for (int i = 0; i < m->n_rot / 2; i++) {
        float f;
        memcpy(&f, t->data + 4 * (size_t)i, 4);
        if (f >= 1e30f && m->inv_freq[i] == 0.0f) continue; /* a pair at rest (gemma4) */
        if (!(f > 0 && f < 1e30f))
            return ember_err(L->err, EMBER_ERR_FORMAT, "%s: rope_freqs.weight[%d] is not a positive number", L->primary, i);
        m->inv_freq[i] = m->inv_freq[i] / f;
    }
    if (L->claimed) L->claimed[t - L->gg->tensors] = 1;
    return EMBER_OK;
}

/* Tensors a file may hold that no family reads: a multimodal checkpoint's
   non-text parts, the MTP layers of the hybrids (read by the MTP head alone,
   whose own check is the reverse: every mtp.* tensor), transformers' rotary
   buffers, glm4_moe's num_nextn_predict_layers MTP layers (numbered after
   the decoder layers), and the output projection of a tied model (transformers ties it
   to the embedding, ignoring the stored copy). */
static bool ignorable(const ember_llm *m, const ember_weights *w, const char *name) {
    size_t n = strlen(name);
    if (m->cfg.mtp) return strncmp(name, "mtp.", 4) != 0; /* an MTP head reads mtp.* only, and all of it */
    if (!ember_weights_is_text(w, name)) return true; /* a multimodal checkpoint's vision / audio parts */
    if (strncmp(name, "mtp.", 4) == 0 && m->cfg.n_linear) return true; /* Qwen3-Next / 3.5 MTP (transformers skips it) */
    if (m->cfg.tie_embeddings && w->head_prefix && strncmp(name, w->head_prefix, strlen(w->head_prefix)) == 0)
        return true;
    static const char inv[] = "rotary_emb.inv_freq";
    if (n >= sizeof inv - 1 && strcmp(name + n - (sizeof inv - 1), inv) == 0) return true;
    int l = -1;
    if (m->cfg.n_mtp_layers && sscanf(name, "model.layers.%d.", &l) == 1 && l >= m->cfg.n_layers &&
        l < m->cfg.n_layers + m->cfg.n_mtp_layers)
        return true; /* glm4_moe's multi-token-prediction layers (transformers skips them too) */
    return m->cfg.tie_embeddings && strncmp(name, "lm_head.", 8) == 0;
}

/* Refuses a file holding a tensor the family did not read, naming it: a
   renamed or foreign tensor must not load silently (a GGUF whose
   output.weight is renamed would otherwise run tied to the embeddings). */
static int check_unclaimed(const ember_loader *L) {
    const ember_llm *m = L->m;
    size_t k = 0;
    if (L->gg) {
        for (size_t i = 0; i < L->gg->n_tensors; i++) {
            int blk = -1;
            if (m->cfg.n_mtp_layers && sscanf(L->gg->tensors[i].name, "blk.%d.", &blk) == 1 && blk >= m->cfg.n_layers)
                continue; /* a multi-token-prediction block after the decoder's (not run) */
            if (!L->claimed[i])
                return ember_err(L->err, EMBER_ERR_FORMAT, "%s: tensor '%s' is not part of a %s model", L->primary,
                                 L->gg->tensors[i].name, m->cfg.model_type);
        }
        return EMBER_OK;
    }
    for (int f = 0; f < L->w->n_files; f++)
        for (int i = 0; i < L->w->files[f]->n_tensors; i++, k++)
            if (!L->claimed[k] && !ignorable(m, L->w, L->w->files[f]->tensors[i].name))
                return ember_err(L->err, EMBER_ERR_FORMAT, "%s: tensor '%s' is not part of a %s model",
                                 L->w->files[f]->path, L->w->files[f]->tensors[i].name, m->cfg.model_type);
    return EMBER_OK;
}

/* The family of a model_type (the config parser admits only known ones). */
static const ember_family *family_for(const ember_model_config *c) {
    const char *model_type = c->model_type;
    if (c->eagle3) return &ember_family_eagle3;
    if (c->dflash) return &ember_family_dflash;
    if (c->mtp) return &ember_family_mtp;
    const ember_arch *row = ember_arch_find(model_type);
    if (row && row->family == EMBER_FAMILY_QWEN3_MOE) return &ember_family_qwen3_moe;
    if (row && row->family == EMBER_FAMILY_HYBRID) return &ember_family_qwen3_next;
    if (row && row->family == EMBER_FAMILY_GEMMA4) return &ember_family_gemma4;
    return ember_arch_is_gemma(model_type) ? &ember_family_gemma : &ember_family_llama;
}

/* The head size of the full-attention and of the sliding layers (the
   first layer of each kind; head_dim when there is none). */
static void rope_dims(const ember_model_config *c, int *global, int *local) {
    *global = *local = 0;
    for (int l = 0; l < c->n_layers; l++) {
        int *d = c->layer_sliding[l] ? local : global;
        if (!*d) *d = ember_cfg_head_dim(c, l);
    }
    if (!*global) *global = c->head_dim;
    if (!*local) *local = c->head_dim;
}

/* Hands t to the backend's prepare_weight (backend.h) when it is bound. */
static int prepare_one(ember_llm *m, ember_tensor *t, ember_error *err) {
    return t->buf ? m->be->ops->prepare_weight(m->be, t, err) : EMBER_OK;
}

/* The preparation step of loading: every matrix a matmul reads goes to the
   backend's prepare_weight once, now that the family has bound them all
   (the CPU backend packs the quantized ones in place; docs/backend.md).
   The embedding is prepared only when tied (it then views the output
   head's bytes and shares its handle, which get_rows reads): an untied one
   is only gathered from. A matrix missed here still computes the same
   bits, row-major. Out of memory fails the load, which frees the model. */
static int prepare_weights(ember_llm *m, ember_error *err) {
    if (!m->be->ops->prepare_weight) return EMBER_OK;
    int rc;
    ember_tensor *top[] = {&m->lm_head, &m->ple_model_proj, &m->e3_fc};
    for (size_t i = 0; i < EMBER_ARRAY_LEN(top); i++)
        if ((rc = prepare_one(m, top[i], err))) return rc;
    if (m->embed.buf == m->lm_head.buf && m->embed.offset == m->lm_head.offset &&
        (rc = prepare_one(m, &m->embed, err)))
        return rc;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        ember_llm_layer *ly = &m->layers[l];
        ember_tensor *mats[] = {&ly->wq,      &ly->wk,     &ly->wv,      &ly->wo,      &ly->w_gate,  &ly->w_up,
                                &ly->w_down,  &ly->router, &ly->sh_gate, &ly->sh_up,   &ly->sh_down, &ly->sh_expert_gate,
                                &ly->wq_gate, &ly->lin_qkv, &ly->lin_z,  &ly->lin_b,   &ly->lin_a,   &ly->lin_out,
                                &ly->ple_gate, &ly->ple_proj};
        for (size_t i = 0; i < EMBER_ARRAY_LEN(mats); i++)
            if ((rc = prepare_one(m, mats[i], err))) return rc;
        for (int64_t e = 0; ly->experts && e < 3 * (int64_t)m->cfg.n_experts; e++)
            if ((rc = prepare_one(m, &ly->experts[e], err))) return rc;
    }
    return EMBER_OK;
}

/* Everything but the file: RoPE tables, layers, then the family's tensors. */
static int build(ember_llm *m, ember_loader *L) {
    const ember_model_config *cfg = &m->cfg;
    ember_error *err = L->err;
    int rc;
    m->family = family_for(cfg);
    m->layers = ember_calloc((size_t)cfg->n_layers, sizeof *m->layers);
    int d_global, d_local; /* the head size of each layer kind (gemma4's differ) */
    rope_dims(cfg, &d_global, &d_local);
    m->inv_freq = ember_calloc((size_t)d_global / 2 + 1, sizeof *m->inv_freq);
    m->inv_freq_local = ember_calloc((size_t)d_local / 2 + 1, sizeof *m->inv_freq_local);
    if (!m->layers || !m->inv_freq || !m->inv_freq_local) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    if ((rc = ember_rope_freqs(&cfg->rope, d_global, m->inv_freq, &m->n_rot, &m->attn_factor, err))) return rc;
    const ember_rope_config *local = cfg->rope_local.theta > 0 ? &cfg->rope_local : &cfg->rope; /* unset: one kind */
    if ((rc = ember_rope_freqs(local, d_local, m->inv_freq_local, &m->n_rot_local,
                               &m->attn_factor_local, err)))
        return rc;
    size_t n = 0;
    if (L->gg) {
        n = L->gg->n_tensors;
    } else {
        for (int f = 0; f < L->w->n_files; f++) n += (size_t)L->w->files[f]->n_tensors;
    }
    L->claimed = ember_calloc(n + 1, 1);
    L->n_tensors = n;
    if (!L->claimed) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    if ((rc = apply_freq_factors(L))) return rc;
    for (int i = 0; i < cfg->n_layers; i++) {
        m->layers[i].window = cfg->layer_window[i];
        m->layers[i].local_rope = cfg->layer_sliding[i];
    }
    if ((rc = m->family->load(L)) || (rc = check_unclaimed(L)) || (rc = prepare_weights(m, err))) return rc;
    uint64_t mask = L->dtype_seen;
    m->weight_dtype = "mixed";
    for (int t = 1; t < EMBER_DTYPE_COUNT; t++)
        if (mask == (uint64_t)1 << t) m->weight_dtype = ember_dtype_get((ember_dtype)t)->name;
    return EMBER_OK;
}

int ember_llm_load(const ember_model_config *cfg, const ember_weights *w, ember_backend *be, ember_llm **out,
                   ember_error *err) {
    *out = NULL;
    ember_llm *m = ember_calloc(1, sizeof *m);
    if (!m) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    m->cfg = *cfg;
    m->be = be;
    m->rope_mode = EMBER_ROPE_NEOX;
    m->norm_plus_one = true; /* HF stores gemma's norms as w of x * (1 + w) */
    /* a safetensors store may hold mlx-community's quantized matrices */
    ember_loader L = {m, w, NULL, w->primary, err, 0, NULL, 0, NULL, ember_mlx_matrix_source};
    int rc = build(m, &L);
    free(L.claimed);
    if (rc) {
        ember_llm_free(m);
        return rc;
    }
    *out = m;
    return EMBER_OK;
}

int ember_llm_from_gguf(ember_gguf *f, ember_backend *be, ember_model_config *cfg, ember_llm **out,
                        ember_error *err) {
    *out = NULL;
    ember_llm *m = ember_calloc(1, sizeof *m);
    if (!m) {
        ember_gguf_free(f);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    }
    m->be = be;
    m->gguf = f;
    int rc = ember_gguf_model_config(m->gguf, &m->cfg, &m->rope_mode, err);
    if (!rc) {
        ember_loader L = {m, NULL, m->gguf, m->gguf->path, err, 0, NULL, 0, NULL, NULL};
        rc = build(m, &L);
        free(L.claimed);
    }
    if (rc) {
        ember_llm_free(m);
        return rc;
    }
    *cfg = m->cfg;
    *out = m;
    return EMBER_OK;
}

int ember_llm_load_gguf(const char *path, ember_backend *be, ember_model_config *cfg, ember_llm **out,
                        ember_error *err) {
    *out = NULL;
    ember_gguf *f = NULL;
    int rc = ember_gguf_open(path, &f, err);
    if (rc) return rc;
    return ember_llm_from_gguf(f, be, cfg, out, err);
}

ember_rec_shape ember_llm_rec_shape(const ember_model_config *c) {
    return (ember_rec_shape){2 * c->lin_k_heads * c->lin_k_dim + c->lin_v_heads * c->lin_v_dim, c->lin_conv_k,
                             c->lin_k_heads, c->lin_v_heads, c->lin_k_dim, c->lin_v_dim, c->lin_v_tiled};
}

/* ---- run state ------------------------------------------------------------------------ */

void ember_llm_state_free(ember_llm_state *st) {
    if (!st) return;
    for (size_t i = 0; i < EMBER_ARRAY_LEN(st->bufs); i++) ember_buffer_free(st->bufs[i]);
    free(st->tmp_idx);
    free(st->tap_host);
    free(st->moe_host);
    free(st->moe_sel);
    free(st->moe_w);
    free(st->moe_ids);
    free(st->moe_ew);
    free(st->moe_choice);
    for (size_t i = 0; i < EMBER_ARRAY_LEN(st->g4_bufs); i++) ember_buffer_free(st->g4_bufs[i]);
    free(st->ple_ids);
    for (size_t i = 0; i < EMBER_ARRAY_LEN(st->e3_bufs); i++) ember_buffer_free(st->e3_bufs[i]);
    free(st->e3_idx);
    free(st);
}

/* One device buffer of the run state: tensor *t of [rows, cols] f32 in *buf. */
typedef struct state_slot {
    ember_tensor *t;
    ember_buffer **buf;
    int64_t rows, cols;
} state_slot;

/* The logits rows a forward computes at once on backend kind `device`. */
static int64_t logit_rows(bool device, int max_tokens) {
    const int lr = device ? LOGIT_ROWS_DEVICE : LOGIT_ROWS;
    return max_tokens < lr ? max_tokens : lr;
}

/* Lists the device buffers of a run state of config c for T tokens a
   forward and L logits rows into out (room for STATE_SLOTS), pointing
   into st; returns their count. The one list both ember_llm_state_new
   (which allocates them) and ember_llm_state_bytes (which sums them) read. */
#define STATE_SLOTS 40
static int state_slots(const ember_model_config *c, int64_t T, int64_t L, ember_llm_state *st, state_slot *out) {
    int64_t Q = 0, KV = 0, I = 0; /* the widest layer's (gemma4's layers differ) */
    for (int l = 0; l < c->n_layers; l++) {
        const int64_t d = ember_cfg_head_dim(c, l), q = (int64_t)c->n_heads * d, kv = ember_cfg_kv_heads(c, l) * d;
        Q = q > Q ? q : Q;
        KV = kv > KV ? kv : KV;
        I = ember_cfg_intermediate(c, l) > I ? ember_cfg_intermediate(c, l) : I;
    }
    const int64_t H = c->hidden_size;
    int n = 0, b = 0;
#define SLOT(tensor, bufs, r, cl) (out[n++] = (state_slot){&st->tensor, &st->bufs, (r), (cl)})
    SLOT(x, bufs[b++], T, H);
    SLOT(h, bufs[b++], T, H);
    SLOT(q, bufs[b++], T, Q);
    SLOT(k, bufs[b++], T, KV);
    SLOT(v, bufs[b++], T, KV);
    SLOT(att, bufs[b++], T, Q);
    SLOT(gate, bufs[b++], T, I);
    SLOT(up, bufs[b++], T, I);
    SLOT(sel, bufs[b++], L, H);
    SLOT(logits, bufs[b++], L, c->vocab_size);
    if (c->n_experts) { /* the MoE block's scratch (state in model.h) */
        const int64_t Is = c->shared_expert_size > (int64_t)c->n_shared_experts * c->moe_intermediate_size
                               ? c->shared_expert_size
                               : (int64_t)c->n_shared_experts * c->moe_intermediate_size,
                      Im = Is > c->moe_intermediate_size ? Is : c->moe_intermediate_size;
        SLOT(moe_in, bufs[b++], T, H);
        SLOT(moe_x, bufs[b++], T, H);
        SLOT(moe_y, bufs[b++], T, H);
        SLOT(moe_gate, bufs[b++], T, Im);
        SLOT(moe_up, bufs[b++], T, Im);
        SLOT(moe_logits, bufs[b++], T, c->n_experts);
    }
    b = 16; /* the hybrid scratch's buffers follow the MoE block's places */
    if (c->n_linear || c->attn_output_gate) { /* the hybrid layers' scratch */
        const int64_t C = 2 * (int64_t)c->lin_k_heads * c->lin_k_dim + (int64_t)c->lin_v_heads * c->lin_v_dim,
                      Z = (int64_t)c->lin_v_heads * c->lin_v_dim, Hv = c->lin_v_heads;
#define AT_LEAST_1(x) ((x) > 0 ? (x) : 1)
        SLOT(qgate, bufs[b++], T, AT_LEAST_1(Q));
        SLOT(lin_x, bufs[b++], T, AT_LEAST_1(C));
        SLOT(lin_z, bufs[b++], T, AT_LEAST_1(Z));
        SLOT(lin_b, bufs[b++], T, AT_LEAST_1(Hv));
        SLOT(lin_a, bufs[b++], T, AT_LEAST_1(Hv));
        SLOT(lin_o, bufs[b++], T, AT_LEAST_1(Z));
#undef AT_LEAST_1
    }
    if (c->ple_dim || c->moe_beside_mlp) { /* gemma4's scratch (state in model.h) */
        const int64_t P = c->ple_dim ? c->ple_dim : 1;
        SLOT(ple_all, g4_bufs[0], T, (int64_t)c->n_layers * P);
        SLOT(ple_one, g4_bufs[1], T, P);
        SLOT(ple_g, g4_bufs[2], T, P);
        SLOT(mlp_out, g4_bufs[3], T, H);
        SLOT(ple_tok, g4_bufs[4], T, (int64_t)c->n_layers * P);
    }
    if (c->eagle3 || c->dflash || c->mtp) { /* an EAGLE-3 / DFlash draft model's or MTP head's scratch */
        const int64_t n_aux =
            c->mtp ? 1 : c->dflash ? (c->df_n_ids ? c->df_n_ids : c->n_layers) : c->e3_n_aux ? c->e3_n_aux : 3;
        SLOT(e3_tin, e3_bufs[0], T, n_aux * (c->dflash || c->mtp ? H : c->e3_target_hidden));
        SLOT(e3_s, e3_bufs[1], 2 * T, H);
        SLOT(e3_c, e3_bufs[2], 2 * T, H);
        SLOT(e3_hid, e3_bufs[3], T, H);
    }
#undef SLOT
    return n;
}

size_t ember_llm_state_bytes(const ember_model_config *c, bool device, int max_tokens) {
    ember_llm_state st;
    state_slot sl[STATE_SLOTS];
    const int n = state_slots(c, max_tokens, logit_rows(device, max_tokens), &st, sl);
    size_t total = 0;
    for (int i = 0; i < n; i++) total += (size_t)(sl[i].rows * sl[i].cols) * sizeof(float);
    return total;
}

int ember_llm_state_new(const ember_llm *m, int max_tokens, int n_kv_rows, ember_llm_state **out,
                        ember_error *err) {
    *out = NULL;
    if (max_tokens < 1 || n_kv_rows < 1)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "invalid batch size %d", max_tokens);
    const ember_model_config *c = &m->cfg;
    ember_llm_state *st = ember_calloc(1, sizeof *st);
    if (!st) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    st->max_tokens = max_tokens;
    st->max_logit_rows = (int)logit_rows(strcmp(m->be->ops->name, "cpu") != 0, max_tokens);
    st->n_rows = n_kv_rows;
    const int64_t T = max_tokens, H = c->hidden_size, L = st->max_logit_rows;
    state_slot sl[STATE_SLOTS];
    const int n_sl = state_slots(c, T, L, st, sl);
    int rc = EMBER_OK;
    for (int i = 0; i < n_sl && !rc; i++)
        rc = ember_tensor_alloc(m->be, sl[i].t, sl[i].buf, EMBER_F32, 2, (const int64_t[]){sl[i].rows, sl[i].cols}, err);
    if (c->n_experts) { /* the MoE block's host side */
        const int64_t E = c->n_experts, K = c->n_experts_used;
        st->moe_host = ember_malloc((size_t)(T * E) * sizeof *st->moe_host);
        st->moe_sel = ember_malloc((size_t)(T * K) * sizeof *st->moe_sel);
        st->moe_w = ember_malloc((size_t)(T * K) * sizeof *st->moe_w);
        st->moe_ids = ember_malloc((size_t)T * sizeof *st->moe_ids);
        st->moe_ew = ember_malloc((size_t)T * sizeof *st->moe_ew);
        st->moe_choice = ember_malloc((size_t)E * sizeof *st->moe_choice);
        if (!rc && (!st->moe_host || !st->moe_sel || !st->moe_w || !st->moe_ids || !st->moe_ew || !st->moe_choice))
            rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    }
    if (c->ple_dim || c->moe_beside_mlp) {
        st->ple_ids = ember_malloc((size_t)T * sizeof *st->ple_ids);
        if (!rc && !st->ple_ids) rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    }
    if (c->eagle3 || c->dflash || c->mtp) {
        st->e3_idx = ember_malloc((size_t)(2 * T) * sizeof *st->e3_idx);
        if (!rc && !st->e3_idx) rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    }
    st->tmp_idx = ember_calloc((size_t)max_tokens, sizeof *st->tmp_idx);
    st->tap_host = ember_malloc((size_t)(L * H) * sizeof *st->tap_host);
    if (!rc && (!st->tmp_idx || !st->tap_host)) rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    if (rc) {
        ember_llm_state_free(st);
        return rc;
    }
    *out = st;
    return EMBER_OK;
}

/* ---- forward ---------------------------------------------------------------------------- */

/* Checks what the KV cache does not: sizes, token ids, wanted rows. */
static int check_batch(const ember_llm *m, ember_llm_state *st, const ember_batch *b, ember_error *err) {
    if (b->n < 1 || b->n > st->max_tokens)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "batch of %d tokens (1..%d allowed)", b->n, st->max_tokens);
    if (b->n_out < 0 || b->n_out > b->n)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "%d logit rows wanted from %d tokens", b->n_out, b->n);
    for (int i = 0; i < b->n; i++)
        if (b->tok[i] < 0 || b->tok[i] >= m->cfg.vocab_size)
            return ember_err(err, EMBER_ERR_INVALID_ARG, "token id %d is outside the vocabulary [0, %d)", b->tok[i],
                             m->cfg.vocab_size);
    for (int i = 0; i < b->n_out; i++)
        if (b->out[i] < 0 || b->out[i] >= b->n || (i > 0 && b->out[i] <= b->out[i - 1]))
            return ember_err(err, EMBER_ERR_INVALID_ARG, "logit rows must be increasing indices into the batch");
    if (b->draw && (!b->argmax || !m->be->ops->sample_rows))
        return ember_err(err, EMBER_ERR_INVALID_ARG, "device draws asked %s",
                         b->argmax ? "of a backend without sample_rows" : "without an array for their ids");
    if (b->n_tap == 0) return EMBER_OK;
    if (b->n_tap < 0 || b->n_tap > b->n || !b->tap || b->n_tap_layers < 1 || !b->tap_layers || !b->taps)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "hidden taps: %d tokens of %d layers asked without their arrays",
                         b->n_tap, b->n_tap_layers);
    for (int i = 0; i < b->n_tap; i++)
        if (b->tap[i] < 0 || b->tap[i] >= b->n || (i > 0 && b->tap[i] <= b->tap[i - 1]))
            return ember_err(err, EMBER_ERR_INVALID_ARG, "hidden taps must be increasing indices into the batch");
    for (int k = 0; k < b->n_tap_layers; k++)
        if (b->tap_layers[k] != EMBER_TAP_NORMED && (b->tap_layers[k] < 0 || b->tap_layers[k] > m->cfg.n_layers))
            return ember_err(err, EMBER_ERR_INVALID_ARG, "hidden tap layer %d (0..%d, or %d for the final norm's output)",
                             b->tap_layers[k], m->cfg.n_layers, EMBER_TAP_NORMED);
    return EMBER_OK;
}

/* Whether b may run as a step graph of the backend (backend.h: step_begin):
   a decode step (every token its row's only one and a logits row, one
   head launch, no taps) of a model whose forward reads nothing back from
   the device before its end (no experts, whose routing is read back; no
   recurrent layers). */
static bool graph_step(const ember_llm *m, const ember_llm_state *st, const ember_batch *b) {
    const ember_backend_ops *ops = m->be->ops;
    if (!ops->step_begin || !ops->step_end || m->cfg.n_experts || m->cfg.n_linear || b->n_tap ||
        b->n_out != b->n || b->n > st->max_logit_rows)
        return false;
    for (int i = 0; i < b->n; i++) {
        if (b->out[i] != i) return false;
        for (int j = 0; j < i; j++)
            if (b->row[j] == b->row[i]) return false;
    }
    return true;
}

int ember_llm_forward(ember_llm *m, ember_llm_state *st, ember_kv *kv, const ember_batch *b, float *logits,
                      ember_error *err) {
    int rc = check_batch(m, st, b, err);
    if (!rc) rc = ember_kv_begin(kv, b->row, b->pos, b->n, err);
    if (rc) return rc;
    if (!graph_step(m, st, b)) {
        rc = m->family->forward(m, st, kv, b, logits, err);
    } else { /* the backend replays or captures the step, or runs it plainly; a pass it could not
                finish runs again (the third pass at the latest runs plainly) */
        const ember_backend_ops *ops = m->be->ops;
        const ember_step_key key = {b->n, b->n_out, b->argmax ? (b->draw ? 2 : 1) : 0};
        bool again = true;
        for (int pass = 0; again && !rc; pass++) {
            bool graphed = false;
            if (pass == 3) {
                rc = ember_err(err, EMBER_ERR_INTERNAL, "a step graph did not run in three passes");
                break;
            }
            if ((rc = ops->step_begin(m->be, &key, &graphed, err))) break;
            rc = m->family->forward(m, st, kv, b, logits, err);
            int rc2 = ops->step_end(m->be, rc != EMBER_OK, &again, rc ? NULL : err);
            if (!rc) rc = rc2;
        }
    }
    ember_kv_end(kv, rc == EMBER_OK);
    return rc;
}

/* ---- the KV cache's layers and the layout line (model.h) ------------------------------ */

int ember_cfg_kv_layout(const ember_model_config *c, int *heads, int *dims, int *win) {
    const int n = c->n_layers - c->n_kv_shared; /* the shared layers come last and own no cache layer */
    for (int l = 0; l < n; l++) {
        heads[l] = ember_cfg_kv_heads(c, l);
        dims[l] = ember_cfg_head_dim(c, l);
        win[l] = c->layer_window[l]; /* what build gives the layer */
    }
    return n;
}

int ember_llm_kv_layout(const ember_llm *m, int *heads, int *dims, int *win) {
    return ember_cfg_kv_layout(&m->cfg, heads, dims, win);
}

void ember_llm_describe(const ember_llm *m, char *buf, size_t n) {
    const ember_model_config *c = &m->cfg;
    size_t o = 0;
    if (!n) return;
    buf[0] = '\0';
#define PUT(...) (o += o < n ? (size_t)snprintf(buf + o, n - o, __VA_ARGS__) : 0)
    int n_sliding = 0, window = 0;
    for (int l = 0; l < c->n_layers; l++)
        if (m->layers[l].window) n_sliding++, window = m->layers[l].window;
    if (n_sliding) PUT("%d of %d layers sliding (window %d)", n_sliding, c->n_layers, window);
    for (int l = 0; l < c->n_layers; l++) /* the first full-attention layer whose shape differs */
        if (!c->layer_sliding[l] && (ember_cfg_head_dim(c, l) != c->head_dim || ember_cfg_kv_heads(c, l) != c->n_kv_heads)) {
            PUT("%sglobal layers: head_dim %d, kv %d", o ? "; " : "", ember_cfg_head_dim(c, l), ember_cfg_kv_heads(c, l));
            break;
        }
    if (c->attn_k_eq_v) PUT("%sK = V on global layers", o ? "; " : "");
    if (c->n_kv_shared)
        PUT("%slayers %d-%d share earlier layers' KV", o ? "; " : "", c->n_layers - c->n_kv_shared, c->n_layers - 1);
    if (c->double_wide_mlp && c->n_kv_shared) PUT(" (MLP %d wide)", 2 * c->intermediate_size);
    if (c->ple_dim) PUT("%sper-layer inputs %d per layer", o ? "; " : "", c->ple_dim);
    if (c->n_experts)
        PUT("%s%d experts, top %d, width %d%s", o ? "; " : "", c->n_experts, c->n_experts_used, c->moe_intermediate_size,
            c->moe_beside_mlp ? ", beside the dense MLP" : "");
#undef PUT
    if (o >= n) buf[n - 1] = '\0';
}
