/*
 * llama.c - the llama-family decoder (llama, mistral, qwen2, qwen3).
 *
 * Per layer, for a batch of T tokens:
 *   h = rmsnorm(x) ; q, k, v = h Wq, h Wk, h Wv (+ biases)
 *   [qwen3] q, k = per-head rmsnorm(q), rmsnorm(k)
 *   q, k = rope(q, k) ; cache[row, pos] = k, v
 *   x += attention(q, cache) Wo
 *   h = rmsnorm(x) ; x += (silu(h Wg) * h Wu) Wd
 * then logits = rmsnorm(x[wanted]) Wlm.
 *
 * Large weights are zero-copy views of the mapped files where the backend
 * allows; norms and biases are converted to f32 and uploaded.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "formats/quant.h"
#include "mlx_load.h"
#include "model.h"
#include "rope.h"

#define LOGIT_ROWS 16

/* ---- loading ------------------------------------------------------------------- */

typedef struct loader {
    ember_llm *m;
    const ember_weights *w; /* safetensors, or */
    const ember_gguf *gg;   /* a GGUF file */
    const char *primary;    /* the file named in messages */
    ember_error *err;
    uint64_t dtype_seen; /* bit mask of weight dtypes */
} loader;

/* A weight as found in either kind of file. */
typedef struct wview {
    const char *file;
    ember_dtype dtype;
    int ndim;
    int64_t shape[4];
    const unsigned char *data;
    size_t nbytes;
} wview;

/* Finds the weight with HuggingFace name `name` in the loader's source. */
static bool find_weight(const loader *L, const char *name, wview *v) {
    memset(v, 0, sizeof *v);
    if (L->gg) {
        char gn[128];
        if (!ember_gguf_tensor_name(name, gn, sizeof gn)) return false;
        const ember_gguf_tensor *t = ember_gguf_find_tensor(L->gg, gn);
        if (!t) return false;
        *v = (wview){L->gg->path, t->dtype, t->ndim, {0}, t->data, t->nbytes};
        memcpy(v->shape, t->shape, sizeof v->shape);
        return true;
    }
    const char *file = L->w->primary;
    const ember_st_tensor *st = ember_weights_find(L->w, name, &file);
    if (!st) return false;
    *v = (wview){file, st->dtype, st->ndim, {0}, st->data, st->nbytes};
    for (int i = 0; i < st->ndim && i < 4; i++) v->shape[i] = st->shape[i];
    return true;
}

/* Weight dtypes the CPU backend multiplies with. */
static bool weight_dtype_ok(ember_dtype t) {
    switch (t) {
    case EMBER_F32: case EMBER_F16: case EMBER_BF16: case EMBER_Q4_0: case EMBER_Q4_1: case EMBER_Q5_0:
    case EMBER_Q5_1: case EMBER_Q8_0: case EMBER_Q4_K: case EMBER_Q5_K: case EMBER_Q6_K: case EMBER_Q8_K:
        return true;
    default: return false;
    }
}

static int keep_buf(ember_llm *m, ember_buffer *b, ember_error *err) {
    if (m->n_bufs == m->cap_bufs) {
        int cap = m->cap_bufs ? m->cap_bufs * 2 : 64;
        ember_buffer **nb = realloc(m->bufs, (size_t)cap * sizeof *nb);
        if (!nb) {
            ember_buffer_free(b);
            return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        }
        m->bufs = nb;
        m->cap_bufs = cap;
    }
    m->bufs[m->n_bufs++] = b;
    return EMBER_OK;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

/* Binds t to a copy of repacked MLX blocks (mlx_load.h), which it frees. */
static int load_blocks(loader *L, ember_tensor *t, void *blocks, size_t nbytes, ember_dtype dt, int ndim,
                       const int64_t *shape) {
    ember_llm *m = L->m;
    ember_buffer *b = NULL;
    int rc = ember_tensor_alloc(m->be, t, &b, dt, ndim, shape, L->err);
    if (!rc) rc = m->be->ops->write(m->be, t, 0, blocks, nbytes, L->err);
    free(blocks);
    if (rc) {
        ember_buffer_free(b);
        return rc;
    }
    _Static_assert(EMBER_DTYPE_COUNT <= 64, "dtype_seen is a 64-bit mask");
    L->dtype_seen |= (uint64_t)1 << dt;
    m->weight_bytes += nbytes;
    return keep_buf(m, b, L->err);
}

/*
 * Binds t to the weight called name with the expected shape. as_f32: the
 * tensor is small (norm, bias) and is converted to an f32 copy. Missing
 * tensors are errors unless optional (then t stays unbound).
 */
static int load(loader *L, ember_tensor *t, const char *name, int ndim, const int64_t *shape, bool as_f32,
                bool optional) {
    ember_llm *m = L->m;
    wview st;
    memset(t, 0, sizeof *t);
    if (L->w && !as_f32 && ndim == 2) { /* an MLX-quantized matrix? */
        void *blocks;
        size_t nb;
        ember_dtype dt;
        int rc = ember_mlx_load_weight(L->w, &m->cfg, name, shape[0], shape[1], &blocks, &nb, &dt, L->err);
        if (rc) return rc;
        if (blocks) return load_blocks(L, t, blocks, nb, dt, ndim, shape);
    }
    if (!find_weight(L, name, &st)) {
        if (optional) return EMBER_OK;
        return ember_err(L->err, EMBER_ERR_FORMAT, "%s: missing tensor '%s'", L->primary, name);
    }
    const char *file = st.file;
    if (!weight_dtype_ok(st.dtype) || (as_f32 && !ember_can_dequantize(st.dtype)))
        return ember_err(L->err, EMBER_ERR_UNSUPPORTED,
                         "%s: tensor '%s' has unsupported dtype %s (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, "
                         "Q8_0, Q4_K, Q5_K, Q6_K, Q8_K)",
                         file, name, ember_dtype_get(st.dtype)->st_name);
    bool same = st.ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = st.shape[i] == shape[i];
    if (!same) {
        char got[128], want[128];
        shape_str(got, sizeof got, st.ndim, st.shape);
        shape_str(want, sizeof want, ndim, shape);
        return ember_err(L->err, EMBER_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected %s", file, name, got,
                         want);
    }
    ember_buffer *b = NULL;
    int rc;
    if (as_f32) {
        size_t n = 1;
        for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
        float *tmp = malloc(n * sizeof *tmp + 1);
        if (!tmp) return ember_err(L->err, EMBER_ERR_NOMEM, "out of memory loading '%s'", name);
        rc = ember_dequantize(st.dtype, st.data, tmp, n, L->err);
        if (!rc) rc = ember_tensor_alloc(m->be, t, &b, EMBER_F32, ndim, shape, L->err);
        if (!rc) rc = m->be->ops->write(m->be, t, 0, tmp, n * sizeof *tmp, L->err);
        free(tmp);
        if (rc) {
            ember_buffer_free(b);
            return rc;
        }
    } else {
        rc = m->be->ops->buffer_from_host(m->be, st.data, st.nbytes, &b, L->err);
        if (rc) return rc;
        rc = ember_tensor_view(t, b, 0, st.dtype, ndim, shape, L->err);
        if (rc) {
            ember_buffer_free(b);
            return rc;
        }
        L->dtype_seen |= (uint64_t)1 << st.dtype;
        m->weight_bytes += st.nbytes;
    }
    return keep_buf(m, b, L->err);
}

void ember_llm_free(ember_llm *m) {
    if (!m) return;
    for (int i = 0; i < m->n_bufs; i++) ember_buffer_free(m->bufs[i]);
    free(m->bufs);
    free(m->layers);
    free(m->inv_freq);
    ember_gguf_free(m->gguf);
    free(m);
}

static int load_layer(loader *L, int i) {
    ember_llm *m = L->m;
    const ember_model_config *c = &m->cfg;
    ember_llm_layer *ly = &m->layers[i];
    const int64_t H = c->hidden_size, D = c->head_dim, Q = (int64_t)c->n_heads * D,
                  KV = (int64_t)c->n_kv_heads * D, I = c->intermediate_size;
    char n[256];
    int rc;
#define NAME(suffix) (snprintf(n, sizeof n, "model.layers.%d.%s", i, suffix), n)
#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
    if ((rc = load(L, &ly->attn_norm, NAME("input_layernorm.weight"), 1, SHAPE(H), true, false)) ||
        (rc = load(L, &ly->wq, NAME("self_attn.q_proj.weight"), 2, SHAPE(Q, H), false, false)) ||
        (rc = load(L, &ly->wk, NAME("self_attn.k_proj.weight"), 2, SHAPE(KV, H), false, false)) ||
        (rc = load(L, &ly->wv, NAME("self_attn.v_proj.weight"), 2, SHAPE(KV, H), false, false)) ||
        (rc = load(L, &ly->wo, NAME("self_attn.o_proj.weight"), 2, SHAPE(H, Q), false, false)) ||
        (rc = load(L, &ly->ffn_norm, NAME("post_attention_layernorm.weight"), 1, SHAPE(H), true, false)) ||
        (rc = load(L, &ly->w_gate, NAME("mlp.gate_proj.weight"), 2, SHAPE(I, H), false, false)) ||
        (rc = load(L, &ly->w_up, NAME("mlp.up_proj.weight"), 2, SHAPE(I, H), false, false)) ||
        (rc = load(L, &ly->w_down, NAME("mlp.down_proj.weight"), 2, SHAPE(H, I), false, false)))
        return rc;
    if (c->attn_bias &&
        ((rc = load(L, &ly->bq, NAME("self_attn.q_proj.bias"), 1, SHAPE(Q), true, false)) ||
         (rc = load(L, &ly->bk, NAME("self_attn.k_proj.bias"), 1, SHAPE(KV), true, false)) ||
         (rc = load(L, &ly->bv, NAME("self_attn.v_proj.bias"), 1, SHAPE(KV), true, false))))
        return rc;
    if (c->attn_out_bias && (rc = load(L, &ly->bo, NAME("self_attn.o_proj.bias"), 1, SHAPE(H), true, false)))
        return rc;
    if (c->mlp_bias &&
        ((rc = load(L, &ly->b_gate, NAME("mlp.gate_proj.bias"), 1, SHAPE(I), true, false)) ||
         (rc = load(L, &ly->b_up, NAME("mlp.up_proj.bias"), 1, SHAPE(I), true, false)) ||
         (rc = load(L, &ly->b_down, NAME("mlp.down_proj.bias"), 1, SHAPE(H), true, false))))
        return rc;
    if (c->qk_norm &&
        ((rc = load(L, &ly->q_norm, NAME("self_attn.q_norm.weight"), 1, SHAPE(D), true, false)) ||
         (rc = load(L, &ly->k_norm, NAME("self_attn.k_norm.weight"), 1, SHAPE(D), true, false))))
        return rc;
#undef NAME
#undef SHAPE
    ly->window = c->layer_window[i];
    return EMBER_OK;
}

/* Applies a GGUF rope_freqs.weight (per-dimension divisors, llama 3). */
static int apply_freq_factors(loader *L) {
    ember_llm *m = L->m;
    const ember_gguf_tensor *t = L->gg ? ember_gguf_find_tensor(L->gg, "rope_freqs.weight") : NULL;
    if (!t) return EMBER_OK;
    if (t->dtype != EMBER_F32 || t->nelem != (size_t)m->n_rot / 2)
        return ember_err(L->err, EMBER_ERR_FORMAT, "%s: rope_freqs.weight must be f32 [%d]", L->primary, m->n_rot / 2);
    for (int i = 0; i < m->n_rot / 2; i++) {
        float f;
        memcpy(&f, t->data + 4 * (size_t)i, 4);
        if (!(f > 0 && f < 1e30f))
            return ember_err(L->err, EMBER_ERR_FORMAT, "%s: rope_freqs.weight[%d] is not a positive number", L->primary, i);
        m->inv_freq[i] = m->inv_freq[i] / f;
    }
    return EMBER_OK;
}

static int build(ember_llm *m, loader *L) {
    const ember_model_config *cfg = &m->cfg;
    ember_error *err = L->err;
    int rc;
    m->layers = calloc((size_t)cfg->n_layers, sizeof *m->layers);
    m->inv_freq = calloc((size_t)cfg->head_dim / 2 + 1, sizeof *m->inv_freq);
    if (!m->layers || !m->inv_freq) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    if ((rc = ember_rope_freqs(&cfg->rope, cfg->head_dim, m->inv_freq, &m->n_rot, &m->attn_factor, err))) return rc;
    if ((rc = apply_freq_factors(L))) return rc;
    const int64_t V = cfg->vocab_size, H = cfg->hidden_size;
    if ((rc = load(L, &m->embed, "model.embed_tokens.weight", 2, (const int64_t[]){V, H}, false, false))) return rc;
    size_t embed_bytes = m->embed.nbytes;
    for (int i = 0; i < cfg->n_layers; i++)
        if ((rc = load_layer(L, i))) return rc;
    if ((rc = load(L, &m->out_norm, "model.norm.weight", 1, (const int64_t[]){H}, true, false))) return rc;
    if (cfg->tie_embeddings) {
        m->lm_head = m->embed; /* read in full per token as the output projection */
    } else {
        if ((rc = load(L, &m->lm_head, "lm_head.weight", 2, (const int64_t[]){V, H}, false, false))) return rc;
        m->weight_bytes -= embed_bytes; /* only one embedding row is read per token */
    }
    uint64_t mask = L->dtype_seen;
    m->weight_dtype = "mixed";
    for (int t = 1; t < EMBER_DTYPE_COUNT; t++)
        if (mask == (uint64_t)1 << t) m->weight_dtype = ember_dtype_get((ember_dtype)t)->name;
    return EMBER_OK;
}

int ember_llm_load(const ember_model_config *cfg, const ember_weights *w, ember_backend *be, ember_llm **out,
                   ember_error *err) {
    *out = NULL;
    ember_llm *m = calloc(1, sizeof *m);
    if (!m) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    m->cfg = *cfg;
    m->be = be;
    m->rope_mode = EMBER_ROPE_NEOX;
    loader L = {m, w, NULL, w->primary, err, 0};
    int rc = build(m, &L);
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
    ember_llm *m = calloc(1, sizeof *m);
    if (!m) {
        ember_gguf_free(f);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    }
    m->be = be;
    m->gguf = f;
    int rc = ember_gguf_model_config(m->gguf, &m->cfg, &m->rope_mode, err);
    if (!rc) {
        loader L = {m, NULL, m->gguf, m->gguf->path, err, 0};
        rc = build(m, &L);
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

/* ---- run state ------------------------------------------------------------------------ */

void ember_llm_state_free(ember_llm_state *st) {
    if (!st) return;
    for (size_t i = 0; i < EMBER_ARRAY_LEN(st->bufs); i++) ember_buffer_free(st->bufs[i]);
    free(st->tmp_idx);
    free(st);
}

int ember_llm_state_new(const ember_llm *m, int max_tokens, int n_kv_rows, ember_llm_state **out,
                        ember_error *err) {
    *out = NULL;
    if (max_tokens < 1 || n_kv_rows < 1)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "invalid batch size %d", max_tokens);
    const ember_model_config *c = &m->cfg;
    ember_llm_state *st = calloc(1, sizeof *st);
    if (!st) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    st->max_tokens = max_tokens;
    st->max_logit_rows = max_tokens < LOGIT_ROWS ? max_tokens : LOGIT_ROWS;
    st->n_rows = n_kv_rows;
    const int64_t T = max_tokens, H = c->hidden_size, Q = (int64_t)c->n_heads * c->head_dim,
                  KV = (int64_t)c->n_kv_heads * c->head_dim, I = c->intermediate_size, L = st->max_logit_rows;
    struct {
        ember_tensor *t;
        int64_t cols, rows;
    } want[] = {{&st->x, H, T},      {&st->h, H, T},     {&st->q, Q, T},   {&st->k, KV, T},
                {&st->v, KV, T},     {&st->att, Q, T},   {&st->gate, I, T}, {&st->up, I, T},
                {&st->sel, H, L},    {&st->logits, c->vocab_size, L}};
    int rc = EMBER_OK;
    for (size_t i = 0; i < EMBER_ARRAY_LEN(want) && !rc; i++)
        rc = ember_tensor_alloc(m->be, want[i].t, &st->bufs[i], EMBER_F32, 2, (const int64_t[]){want[i].rows, want[i].cols},
                                err);
    st->tmp_idx = calloc((size_t)max_tokens, sizeof *st->tmp_idx);
    if (!rc && !st->tmp_idx) rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    if (rc) {
        ember_llm_state_free(st);
        return rc;
    }
    *out = st;
    return EMBER_OK;
}

/* ---- forward ---------------------------------------------------------------------------- */

/* A view of the first `rows` rows of t, reshaped to dims (rows first). */
static ember_tensor rows_view(const ember_tensor *t, int ndim, int64_t d0, int64_t d1, int64_t d2) {
    ember_tensor v = *t;
    v.ndim = ndim;
    v.shape[0] = d0;
    v.shape[1] = d1;
    v.shape[2] = d2;
    v.shape[3] = 0;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= v.shape[i];
    v.nbytes = (size_t)n * 4;
    return v;
}

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
    return EMBER_OK;
}

static const ember_tensor *opt(const ember_tensor *t) {
    return t->buf ? t : NULL;
}

/* The forward pass proper, between ember_kv_begin and ember_kv_end. */
static int forward(ember_llm *m, ember_llm_state *st, ember_kv *kv, const ember_batch *b, float *logits,
                   ember_error *err) {
    int rc;
    ember_backend *be = m->be;
    const ember_backend_ops *ops = be->ops;
    const ember_model_config *c = &m->cfg;
    const int T = b->n, H = c->hidden_size, D = c->head_dim, Hq = c->n_heads, Hkv = c->n_kv_heads,
              I = c->intermediate_size;
    ember_tensor x = rows_view(&st->x, 2, T, H, 0), h = rows_view(&st->h, 2, T, H, 0);
    ember_tensor q = rows_view(&st->q, 2, T, (int64_t)Hq * D, 0), k = rows_view(&st->k, 2, T, (int64_t)Hkv * D, 0),
                 v = rows_view(&st->v, 2, T, (int64_t)Hkv * D, 0);
    ember_tensor q3 = rows_view(&st->q, 3, T, Hq, D), k3 = rows_view(&st->k, 3, T, Hkv, D),
                 v3 = rows_view(&st->v, 3, T, Hkv, D), att3 = rows_view(&st->att, 3, T, Hq, D);
    ember_tensor qh = rows_view(&st->q, 2, (int64_t)T * Hq, D, 0), kh = rows_view(&st->k, 2, (int64_t)T * Hkv, D, 0);
    ember_tensor att = rows_view(&st->att, 2, T, (int64_t)Hq * D, 0);
    ember_tensor gate = rows_view(&st->gate, 2, T, I, 0), up = rows_view(&st->up, 2, T, I, 0);
    ember_rope rope = {m->inv_freq, m->n_rot, m->rope_mode, m->attn_factor};
    const float scale = 1.0f / sqrtf((float)D);

    if ((rc = ops->get_rows(be, &x, &m->embed, b->tok, T, err))) return rc;
    for (int l = 0; l < c->n_layers; l++) {
        const ember_llm_layer *ly = &m->layers[l];
        ember_matmul qkv[3] = {{&q, &ly->wq, opt(&ly->bq)}, {&k, &ly->wk, opt(&ly->bk)}, {&v, &ly->wv, opt(&ly->bv)}};
        ember_attn ap = {scale, ly->window, 0.0f};
        ember_kv_layer views[2];
        ember_kv_map map;
        ember_kv_map_for(kv, l, b->row, b->pos, views, &map);
        if ((rc = ops->rms_norm(be, &h, &x, &ly->attn_norm, c->rms_norm_eps, false, err)) ||
            (rc = ops->matmul(be, &h, 3, qkv, err)))
            return rc;
        if (ly->q_norm.buf && ((rc = ops->rms_norm(be, &qh, &qh, &ly->q_norm, c->rms_norm_eps, false, err)) ||
                               (rc = ops->rms_norm(be, &kh, &kh, &ly->k_norm, c->rms_norm_eps, false, err))))
            return rc;
        ember_matmul o = {&h, &ly->wo, opt(&ly->bo)};
        if ((rc = ops->rope(be, &q3, b->pos, &rope, err)) || (rc = ops->rope(be, &k3, b->pos, &rope, err)) ||
            (rc = ops->kv_write(be, &map, &k3, &v3, err)) || (rc = ops->attention(be, &att3, &q3, &map, &ap, err)) ||
            (rc = ops->matmul(be, &att, 1, &o, err)) || (rc = ops->add(be, &x, &x, &h, err)))
            return rc;
        ember_matmul gu[2] = {{&gate, &ly->w_gate, opt(&ly->b_gate)}, {&up, &ly->w_up, opt(&ly->b_up)}};
        ember_matmul dn = {&h, &ly->w_down, opt(&ly->b_down)};
        if ((rc = ops->rms_norm(be, &h, &x, &ly->ffn_norm, c->rms_norm_eps, false, err)) ||
            (rc = ops->matmul(be, &h, 2, gu, err)) || (rc = ops->swiglu(be, &gate, &gate, &up, err)) ||
            (rc = ops->matmul(be, &gate, 1, &dn, err)) || (rc = ops->add(be, &x, &x, &h, err)))
            return rc;
    }
    /* logits of the wanted rows, LOGIT_ROWS at a time */
    const int V = c->vocab_size;
    for (int o0 = 0; o0 < b->n_out; o0 += st->max_logit_rows) {
        int n = b->n_out - o0 < st->max_logit_rows ? b->n_out - o0 : st->max_logit_rows;
        ember_tensor sel = rows_view(&st->sel, 2, n, H, 0), lg = rows_view(&st->logits, 2, n, V, 0);
        ember_matmul head = {&lg, &m->lm_head, NULL};
        if ((rc = ops->get_rows(be, &sel, &x, b->out + o0, n, err)) ||
            (rc = ops->rms_norm(be, &sel, &sel, &m->out_norm, c->rms_norm_eps, false, err)) ||
            (rc = ops->matmul(be, &sel, 1, &head, err)) ||
            (rc = ops->read(be, &lg, 0, logits + (size_t)o0 * (size_t)V, (size_t)n * (size_t)V * 4, err)))
            return rc;
    }
    return EMBER_OK;
}

int ember_llm_forward(ember_llm *m, ember_llm_state *st, ember_kv *kv, const ember_batch *b, float *logits,
                      ember_error *err) {
    int rc = check_batch(m, st, b, err);
    if (!rc) rc = ember_kv_begin(kv, b->row, b->pos, b->n, err);
    if (rc) return rc;
    rc = forward(m, st, kv, b, logits, err);
    ember_kv_end(kv, rc == EMBER_OK);
    return rc;
}
