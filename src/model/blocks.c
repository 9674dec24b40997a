/*
 * blocks.c - the loader and the forward blocks every family shares; see
 * family.h.
 *
 * Loading: large weights are zero-copy views of the mapped files where the
 * backend allows; norms and biases are converted to f32 and uploaded; a
 * store with its own encoding of matrices (L->matrix_source: MLX's
 * group-quantized safetensors) binds them itself. Every tensor is
 * checked for presence, dtype and shape, and errors name it.
 *
 * Forward blocks: each is a fixed sequence of backend ops on the run
 * state's views. The llama family's numerics are exactly these sequences.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/util.h"
#include "family.h"
#include "formats/quant.h"

/* ---- loading ------------------------------------------------------------------- */

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
static bool find_weight(const ember_loader *L, const char *name, wview *v) {
    memset(v, 0, sizeof *v);
    if (L->gg) {
        char gn[128];
        if (!ember_gguf_tensor_name(L->m->cfg.model_type, name, gn, sizeof gn)) return false;
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

const char *ember_layer_name(const ember_loader *L, char *n, size_t cap, int i, const char *suffix) {
    snprintf(n, cap, "%s.%d.%s", L->layers ? L->layers : "model.layers", i, suffix);
    return n;
}

bool ember_load_has(const ember_loader *L, const char *name) {
    wview v;
    return find_weight(L, name, &v);
}

void ember_load_claim(ember_loader *L, const char *name) {
    if (!L->claimed) return;
    if (L->gg) {
        char gn[128];
        const ember_gguf_tensor *t = ember_gguf_tensor_name(L->m->cfg.model_type, name, gn, sizeof gn)
                                         ? ember_gguf_find_tensor(L->gg, gn)
                                         : NULL;
        if (t) L->claimed[t - L->gg->tensors] = 1;
        return;
    }
    const char *file = NULL;
    const ember_st_tensor *st = ember_weights_find(L->w, name, &file);
    size_t base = 0;
    for (int f = 0; st && f < L->w->n_files; f++) {
        const ember_st_file *sf = L->w->files[f];
        if (st >= sf->tensors && st < sf->tensors + sf->n_tensors) {
            L->claimed[base + (size_t)(st - sf->tensors)] = 1;
            return;
        }
        base += (size_t)sf->n_tensors;
    }
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

/* Adds b to the model's buffers (freeing it on failure). */
static int keep_buf(ember_llm *m, ember_buffer *b, ember_error *err) {
    if (m->n_bufs == m->cap_bufs) {
        int cap = m->cap_bufs ? m->cap_bufs * 2 : 64;
        ember_buffer **nb = ember_realloc(m->bufs, (size_t)cap * sizeof *nb);
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

/* "[a, b, ...]" into buf. */
static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

/* The error for a weight the backend cannot compute with (weight_ok). */
static int check_backend_dtype(ember_loader *L, const char *file, const char *name, ember_dtype dt) {
    const ember_backend *be = L->m->be;
    if (!be->ops->weight_ok || be->ops->weight_ok(dt)) return EMBER_OK;
    return ember_err(L->err, EMBER_ERR_UNSUPPORTED,
                     "%s: tensor '%s' is %s, which the %s backend does not support yet", file,
                     name, ember_dtype_get(dt)->name, be->ops->name);
}

int ember_load_blocks(ember_loader *L, ember_tensor *t, const char *name, void *blocks, size_t nbytes, ember_dtype dt,
                      int ndim, const int64_t *shape) {
    ember_llm *m = L->m;
    ember_buffer *b = NULL;
    int rc = check_backend_dtype(L, L->primary, name, dt);
    if (rc) {
        free(blocks);
        return rc;
    }
    rc = ember_tensor_alloc(m->be, t, &b, dt, ndim, shape, L->err);
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

/* A weight's name for messages, quoted: from GGUF llama.cpp's name, then
   the HuggingFace one ("'blk.0.attn_q.weight' (model.layers.0...)"). */
static const char *quoted_name(const ember_loader *L, const char *name, char *buf, size_t n) {
    char gn[128];
    if (L->gg && ember_gguf_tensor_name(L->m->cfg.model_type, name, gn, sizeof gn))
        snprintf(buf, n, "'%s' (%s)", gn, name);
    else
        snprintf(buf, n, "'%s'", name);
    return buf;
}

int ember_load_tensor(ember_loader *L, ember_tensor *t, const char *name, int ndim, const int64_t *shape, bool as_f32,
                bool optional) {
    ember_llm *m = L->m;
    wview st;
    memset(t, 0, sizeof *t);
    if (L->matrix_source && !as_f32 && (ndim == 2 || ndim == 3)) { /* the store's own encoding of a matrix (or a stack)? */
        bool bound = false;
        int rc = L->matrix_source(L, t, name, ndim, shape, &bound);
        if (rc || bound) return rc;
    }
    char shown[400];
    if (!find_weight(L, name, &st)) {
        if (optional) return EMBER_OK;
        return ember_err(L->err, EMBER_ERR_FORMAT, "%s: missing tensor %s", L->primary,
                         quoted_name(L, name, shown, sizeof shown));
    }
    ember_load_claim(L, name);
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
        return ember_err(L->err, EMBER_ERR_FORMAT, "%s: tensor %s has shape %s, expected %s", file,
                         quoted_name(L, name, shown, sizeof shown), got, want);
    }
    ember_buffer *b = NULL;
    int rc;
    if (!as_f32 && (rc = check_backend_dtype(L, file, name, st.dtype))) return rc;
    if (as_f32) {
        size_t n = 1;
        for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
        float *tmp = ember_malloc(n * sizeof *tmp + 1);
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

int ember_load_split(ember_loader *L, const char *name, int n, ember_tensor *const *parts, const int64_t *rows,
                     int64_t cols) {
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += rows[i];
    ember_tensor whole;
    int rc = ember_load_tensor(L, &whole, name, 2, (const int64_t[]){total, cols}, false, false);
    if (rc) return rc;
    if (total < 1 || whole.nbytes % (size_t)total)
        return ember_err(L->err, EMBER_ERR_FORMAT, "%s: tensor '%s' cannot be split into rows", L->primary, name);
    const size_t row_bytes = whole.nbytes / (size_t)total;
    size_t off = whole.offset;
    for (int i = 0; i < n; i++) {
        if ((rc = ember_tensor_view(parts[i], whole.buf, off, whole.dtype, 2, (const int64_t[]){rows[i], cols},
                                    L->err)))
            return rc;
        off += (size_t)rows[i] * row_bytes;
    }
    return EMBER_OK;
}

int ember_load_regrouped(ember_loader *L, const char *name, int64_t rows, int64_t cols, const int32_t *perm, int n,
                         ember_tensor *const *parts, const int64_t *part_rows) {
    ember_llm *m = L->m;
    ember_tensor whole;
    int rc = ember_load_tensor(L, &whole, name, 2, (const int64_t[]){rows, cols}, false, false);
    if (rc) return rc;
    switch (whole.dtype) { /* rows must be whole byte ranges */
    case EMBER_F32: case EMBER_F16: case EMBER_BF16: case EMBER_Q4_0: case EMBER_Q4_1: case EMBER_Q5_0:
    case EMBER_Q5_1: case EMBER_Q8_0: case EMBER_Q4_K: case EMBER_Q5_K: case EMBER_Q6_K: case EMBER_Q8_K: break;
    default:
        return ember_err(L->err, EMBER_ERR_UNSUPPORTED, "%s: tensor '%s' is %s, whose rows cannot be regrouped",
                         L->primary, name, ember_dtype_get(whole.dtype)->name);
    }
    if (rows < 1 || whole.nbytes % (size_t)rows)
        return ember_err(L->err, EMBER_ERR_FORMAT, "%s: tensor '%s' cannot be split into rows", L->primary, name);
    const size_t row_bytes = whole.nbytes / (size_t)rows;
    ember_buffer *b = NULL;
    ember_tensor t;
    if ((rc = ember_tensor_alloc(m->be, &t, &b, whole.dtype, 2, (const int64_t[]){rows, cols}, L->err))) return rc;
    for (int64_t j = 0; j < rows && !rc; j++) {
        if (perm[j] < 0 || perm[j] >= rows) {
            rc = ember_err(L->err, EMBER_ERR_INTERNAL, "bad row regrouping of '%s'", name);
            break;
        }
        rc = m->be->ops->copy(m->be, &t, (size_t)j * row_bytes, &whole, (size_t)perm[j] * row_bytes, row_bytes,
                              L->err);
    }
    if (rc) {
        ember_buffer_free(b);
        return rc;
    }
    if ((rc = keep_buf(m, b, L->err))) return rc; /* it freed b */
    /* the file's view (kept just before b) is no longer needed */
    if (m->n_bufs >= 2 && m->bufs[m->n_bufs - 2] == whole.buf) {
        ember_buffer_free(m->bufs[m->n_bufs - 2]);
        m->bufs[m->n_bufs - 2] = b;
        m->n_bufs--;
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if ((rc = ember_tensor_view(parts[i], b, off, t.dtype, 2, (const int64_t[]){part_rows[i], cols}, L->err)))
            return rc;
        off += (size_t)part_rows[i] * row_bytes;
    }
    return EMBER_OK;
}

/* GGUF's stacked experts: the tensor gn [E, rows, cols] bound as one buffer
   over the file's bytes, expert e a view of its slice in parts[e * stride]. */
static int load_stacked(ember_loader *L, const char *gn, int E, int64_t rows, int64_t cols, ember_tensor *parts,
                        int stride) {
    ember_llm *m = L->m;
    const ember_gguf_tensor *t = ember_gguf_find_tensor(L->gg, gn);
    if (!t) return ember_err(L->err, EMBER_ERR_FORMAT, "%s: missing tensor '%s'", L->primary, gn);
    if (t->ndim != 3 || t->shape[0] != E || t->shape[1] != rows || t->shape[2] != cols) {
        char got[128], want[128];
        shape_str(got, sizeof got, t->ndim, t->shape);
        shape_str(want, sizeof want, 3, (const int64_t[]){E, rows, cols});
        return ember_err(L->err, EMBER_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected %s", L->primary, gn, got,
                         want);
    }
    if (!weight_dtype_ok(t->dtype) || t->nbytes % (size_t)E)
        return ember_err(L->err, EMBER_ERR_UNSUPPORTED, "%s: tensor '%s' has unsupported dtype %s", L->primary, gn,
                         ember_dtype_get(t->dtype)->st_name);
    int rc = check_backend_dtype(L, L->primary, gn, t->dtype);
    ember_buffer *b = NULL;
    if (rc || (rc = m->be->ops->buffer_from_host(m->be, t->data, t->nbytes, &b, L->err))) return rc;
    if ((rc = keep_buf(m, b, L->err))) return rc; /* it freed b */
    const size_t per = t->nbytes / (size_t)E;
    for (int e = 0; e < E; e++)
        if ((rc = ember_tensor_view(&parts[(size_t)e * (size_t)stride], b, (size_t)e * per, t->dtype, 2,
                                    (const int64_t[]){rows, cols}, L->err)))
            return rc;
    if (L->claimed) L->claimed[t - L->gg->tensors] = 1;
    L->dtype_seen |= (uint64_t)1 << t->dtype;
    m->weight_bytes += t->nbytes;
    return EMBER_OK;
}

/* mlx-lm's stacked experts in safetensors: the tensor name [E, rows, cols]
   (float, or MLX-quantized with its scales and biases: ember_load_tensor),
   expert e bound as a view of its rows in parts[e * stride]. */
static int load_stacked_st(ember_loader *L, const char *name, int64_t E, int64_t rows, int64_t cols,
                           ember_tensor *parts, int stride) {
    ember_tensor all;
    int rc = ember_load_tensor(L, &all, name, 3, (const int64_t[]){E, rows, cols}, false, false);
    if (rc) return rc;
    if (all.nbytes % (size_t)(E * rows))
        return ember_err(L->err, EMBER_ERR_FORMAT, "%s: tensor '%s' cannot be split into rows", L->primary, name);
    const size_t per = all.nbytes / (size_t)E;
    for (int64_t e = 0; e < E; e++)
        if ((rc = ember_tensor_view(&parts[(size_t)e * (size_t)stride], all.buf, all.offset + (size_t)e * per, all.dtype,
                                    2, (const int64_t[]){rows, cols}, L->err)))
            return rc;
    return EMBER_OK;
}

/* A decoding token reads n_experts_used of a layer's E experts: weight_bytes
   (the bytes a decode step reads) keeps that share of the experts the loader
   counted in full. */
static void count_active_experts(ember_llm *m, const ember_llm_layer *ly) {
    const int E = m->cfg.n_experts, K = m->cfg.n_experts_used;
    size_t all = 0;
    for (int k = 0; k < 3 * E; k++) all += ly->experts[k].nbytes;
    m->weight_bytes -= all - (size_t)((double)all * K / E);
}

int ember_load_moe(ember_loader *L, int i) {
    ember_llm *m = L->m;
    const ember_model_config *c = &m->cfg;
    ember_llm_layer *ly = &m->layers[i];
    const int E = c->n_experts;
    const int64_t H = c->hidden_size, Im = c->moe_intermediate_size;
    char n[256];
    int rc;
    if (E < 1 || c->n_experts_used < 1 || c->n_experts_used > E)
        return ember_err(L->err, EMBER_ERR_FORMAT, "%s: layer %d: %d experts with top-%d is not a mixture of experts",
                         L->primary, i, E, c->n_experts_used);
    ember_layer_name(L, n, sizeof n, i, "mlp.gate.weight");
    if ((rc = ember_load_tensor(L, &ly->router, n, 2, (const int64_t[]){E, H}, false, false))) return rc;
    ly->experts = ember_calloc((size_t)E * 3, sizeof *ly->experts);
    if (!ly->experts) return ember_err(L->err, EMBER_ERR_NOMEM, "out of memory");
    static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
    if (L->gg) { /* GGUF stacks each projection of every expert: blk.i.ffn_{gate,up,down}_exps */
        static const char *const gg[3] = {"gate", "up", "down"};
        for (int p = 0; p < 3; p++) {
            snprintf(n, sizeof n, "blk.%d.ffn_%s_exps.weight", i, gg[p]);
            if ((rc = load_stacked(L, n, E, p < 2 ? Im : H, p < 2 ? H : Im, ly->experts + p, 3))) return rc;
        }
    }
    ember_layer_name(L, n, sizeof n, i, "mlp.switch_mlp.gate_proj.weight");
    const bool stacked = !L->gg && ember_load_has(L, n); /* mlx-lm's layout: mlp.switch_mlp.{gate,up,down}_proj */
    for (int p = 0; p < 3 && stacked; p++) {
        char sfx[64];
        snprintf(sfx, sizeof sfx, "mlp.switch_mlp.%s.weight", proj[p]);
        ember_layer_name(L, n, sizeof n, i, sfx);
        if ((rc = load_stacked_st(L, n, E, p < 2 ? Im : H, p < 2 ? H : Im, ly->experts + p, 3))) return rc;
    }
    for (int e = 0; e < E && !L->gg && !stacked; e++)
        for (int p = 0; p < 3; p++) {
            const int64_t shape[2] = {p < 2 ? Im : H, p < 2 ? H : Im};
            char sfx[64];
            snprintf(sfx, sizeof sfx, "mlp.experts.%d.%s.weight", e, proj[p]);
            ember_layer_name(L, n, sizeof n, i, sfx);
            if ((rc = ember_load_tensor(L, &ly->experts[3 * e + p], n, 2, shape, false, false))) return rc;
        }
    count_active_experts(m, ly);
    if (c->n_shared_experts) { /* one MLP of n_shared_experts * Im */
        const int64_t Is = (int64_t)c->n_shared_experts * Im;
        ember_tensor *sh[3] = {&ly->sh_gate, &ly->sh_up, &ly->sh_down};
        for (int p = 0; p < 3; p++) {
            const int64_t shape[2] = {p < 2 ? Is : H, p < 2 ? H : Is};
            char sfx[64];
            snprintf(sfx, sizeof sfx, "mlp.shared_experts.%s.weight", proj[p]);
            ember_layer_name(L, n, sizeof n, i, sfx);
            if ((rc = ember_load_tensor(L, sh[p], n, 2, shape, false, false))) return rc;
        }
    }
    if (!c->router_sigmoid) return EMBER_OK;
    /* the selection bias, kept on the host where the top-k runs */
    ember_tensor bias;
    ember_layer_name(L, n, sizeof n, i, "mlp.gate.e_score_correction_bias");
    if ((rc = ember_load_tensor(L, &bias, n, 1, (const int64_t[]){E}, true, false))) return rc;
    ly->router_bias = ember_malloc((size_t)E * sizeof *ly->router_bias);
    if (!ly->router_bias) return ember_err(L->err, EMBER_ERR_NOMEM, "out of memory");
    return m->be->ops->read(m->be, &bias, 0, ly->router_bias, (size_t)E * sizeof *ly->router_bias, L->err);
}

int ember_load_io(ember_loader *L) {
    ember_llm *m = L->m;
    const ember_model_config *cfg = &m->cfg;
    const int64_t V = cfg->vocab_size, H = cfg->hidden_size;
    int rc;
    if ((rc = ember_load_tensor(L, &m->embed, "model.embed_tokens.weight", 2, (const int64_t[]){V, H}, false, false)) ||
        (rc = ember_load_tensor(L, &m->out_norm, "model.norm.weight", 1, (const int64_t[]){H}, true, false)))
        return rc;
    if (cfg->tie_embeddings) {
        m->lm_head = m->embed; /* read in full per token as the output projection */
        return EMBER_OK;
    }
    size_t embed_bytes = m->embed.nbytes;
    if ((rc = ember_load_tensor(L, &m->lm_head, "lm_head.weight", 2, (const int64_t[]){V, H}, false, false))) return rc;
    m->weight_bytes -= embed_bytes; /* only one embedding row is read per token */
    return EMBER_OK;
}

/* ---- forward blocks ------------------------------------------------------------------- */

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

/* t when bound, else NULL (an absent bias). */
static const ember_tensor *opt(const ember_tensor *t) {
    return t->buf ? t : NULL;
}

void ember_fwd_init(ember_fwd *f, ember_llm *m, ember_llm_state *st, ember_kv *kv, const ember_batch *b,
                    ember_error *err) {
    const ember_model_config *c = &m->cfg;
    const int T = b->n, H = c->hidden_size;
    *f = (ember_fwd){.m = m, .st = st, .kv = kv, .b = b, .err = err, .T = T};
    f->x = rows_view(&st->x, 2, T, H, 0);
    f->h = rows_view(&st->h, 2, T, H, 0);
    ember_fwd_layer_shape(f, c->head_dim, c->n_kv_heads, c->intermediate_size); /* the model-wide shape */
}

int ember_blk_embed(ember_fwd *f, float scale) {
    ember_backend *be = f->m->be;
    int rc = be->ops->get_rows(be, &f->x, &f->m->embed, f->b->tok, f->T, f->err);
    if (!rc && scale != 1.0f) rc = be->ops->scale(be, &f->x, &f->x, scale, f->err);
    return rc;
}

int ember_blk_norm(ember_fwd *f, ember_tensor *dst, const ember_tensor *x, const ember_tensor *w, bool plus_one) {
    ember_backend *be = f->m->be;
    return be->ops->rms_norm(be, dst, x, w, f->m->cfg.rms_norm_eps, plus_one, f->err);
}

int ember_blk_attention(ember_fwd *f, int l, const ember_llm_layer *ly, const ember_rope *rope, const ember_attn *a,
                        bool qk_plus_one) {
    ember_backend *be = f->m->be;
    const ember_backend_ops *ops = be->ops;
    const float eps = f->m->cfg.rms_norm_eps;
    ember_error *err = f->err;
    int rc;
    ember_tensor qg = rows_view(&f->st->qgate, 2, f->T, f->q.shape[1], 0);
    ember_matmul qkv[4] = {{&f->q, &ly->wq, opt(&ly->bq)},
                           {&f->k, &ly->wk, opt(&ly->bk)},
                           {&f->v, &ly->wv, opt(&ly->bv)},
                           {&qg, &ly->wq_gate, NULL}};
    ember_kv_layer views[2];
    ember_kv_map map;
    ember_kv_map_for(f->kv, l, f->b->row, f->b->pos, views, &map);
    if ((rc = ops->matmul(be, &f->h, ly->wq_gate.buf ? 4 : 3, qkv, err))) return rc;
    if (ly->q_norm.buf && ((rc = ops->rms_norm(be, &f->qh, &f->qh, &ly->q_norm, eps, qk_plus_one, err)) ||
                           (rc = ops->rms_norm(be, &f->kh, &f->kh, &ly->k_norm, eps, qk_plus_one, err))))
        return rc;
    ember_matmul o = {&f->h, &ly->wo, opt(&ly->bo)};
    if (ops->rope_kv_write) /* the same three ops in one (backend.h) */
        rc = ops->rope_kv_write(be, &f->q3, &f->k3, &f->v3, f->b->pos, rope, &map, err);
    else if (!(rc = ops->rope(be, &f->q3, f->b->pos, rope, err)) && !(rc = ops->rope(be, &f->k3, f->b->pos, rope, err)))
        rc = ops->kv_write(be, &map, &f->k3, &f->v3, err);
    if (rc || (rc = ops->attention(be, &f->att3, &f->q3, &map, a, err)) ||
        (ly->wq_gate.buf && (rc = ops->sigmoid_mul(be, &f->att, &f->att, &qg, err))) ||
        (rc = ops->matmul(be, &f->att, 1, &o, err)))
        return rc;
    return EMBER_OK;
}

int ember_blk_mlp(ember_fwd *f, const ember_llm_layer *ly, ember_act act) {
    ember_backend *be = f->m->be;
    const ember_backend_ops *ops = be->ops;
    int rc;
    ember_matmul gu[2] = {{&f->gate, &ly->w_gate, opt(&ly->b_gate)}, {&f->up, &ly->w_up, opt(&ly->b_up)}};
    ember_matmul dn = {&f->h, &ly->w_down, opt(&ly->b_down)};
    if ((rc = ops->matmul(be, &f->h, 2, gu, f->err))) return rc;
    rc = act == EMBER_ACT_GELU_TANH ? ops->geglu(be, &f->gate, &f->gate, &f->up, f->err)
                                    : ops->swiglu(be, &f->gate, &f->gate, &f->up, f->err);
    if (rc) return rc;
    return ops->matmul(be, &f->gate, 1, &dn, f->err);
}

/* The k largest of v[0..n) into idx (in decreasing order; ties: the lower
   index). Entries where skip is non-NULL and skip[e] are passed over. */
static void top_k(const float *v, int n, int k, const bool *skip, int32_t *idx) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n; e++) {
            bool taken = skip && skip[e];
            for (int q = 0; q < j && !taken; q++) taken = idx[q] == e;
            if (!taken && (best < 0 || v[e] > v[best])) best = e;
        }
        idx[j] = best;
    }
}

/* The softmax router (qwen3_moe), for one token: p = softmax(z); the top k
   of p into sel, their p (over their sum when norm) into w. */
static void route_softmax(const float *z, int E, int k, bool norm, int32_t *sel, float *w) {
    float mx = z[0], sum = 0, kept = 0;
    for (int e = 1; e < E; e++) mx = z[e] > mx ? z[e] : mx;
    for (int e = 0; e < E; e++) sum += expf(z[e] - mx);
    top_k(z, E, k, NULL, sel);
    for (int j = 0; j < k; j++) kept += w[j] = expf(z[sel[j]] - mx) / sum;
    if (norm)
        for (int j = 0; j < k; j++) w[j] /= kept;
}

/* The sigmoid router (glm4_moe), for one token: s = sigmoid(z); experts are
   chosen by c = s + bias: the topk_group groups (of E / n_group experts)
   with the largest sums of their two best c, then the top k of c within
   them (the others count as 0); the weights are their s, over (their sum +
   1e-20) when norm, times scale. choice: [E] scratch. */
static void route_sigmoid(const float *z, const float *bias, const ember_model_config *c, float *choice, int32_t *sel,
                          float *w) {
    const int E = c->n_experts, k = c->n_experts_used, G = c->n_group, per = E / G;
    for (int e = 0; e < E; e++) choice[e] = 1.0f / (1.0f + expf(-z[e])) + (bias ? bias[e] : 0.0f);
    if (c->topk_group < G) { /* keep the best groups: zero the others' scores */
        float gs[256];
        int32_t best[256], two[2];
        bool keep[256] = {false};
        for (int g = 0; g < G && g < 256; g++) {
            top_k(choice + g * per, per, per < 2 ? per : 2, NULL, two);
            gs[g] = choice[g * per + two[0]] + (per < 2 ? 0.0f : choice[g * per + two[1]]);
        }
        top_k(gs, G, c->topk_group, NULL, best);
        for (int j = 0; j < c->topk_group; j++) keep[best[j]] = true;
        for (int e = 0; e < E; e++)
            if (!keep[e / per]) choice[e] = 0.0f;
    }
    top_k(choice, E, k, NULL, sel);
    float kept = 0;
    for (int j = 0; j < k; j++) kept += w[j] = 1.0f / (1.0f + expf(-z[sel[j]]));
    for (int j = 0; j < k; j++) w[j] = (c->norm_topk_prob ? w[j] / (kept + 1e-20f) : w[j]) * c->routed_scale;
}

void ember_moe_route(const ember_model_config *c, const float *z, const float *bias, float *choice, int32_t *sel,
                     float *w) {
    if (c->router_sigmoid)
        route_sigmoid(z, bias, c, choice, sel, w);
    else
        route_softmax(z, c->n_experts, c->n_experts_used, c->norm_topk_prob, sel, w);
}

/* The routed experts of a MoE block (the routing in st->moe_sel / moe_w): for
   each expert in increasing order, the tokens routed to it (in batch order)
   are gathered from in, run through its gated MLP (act: SwiGLU or GeGLU)
   and added into f->h with their weights. Only the chosen experts run, each
   once per forward; a token's terms arrive in expert order. */
/* Products per matmul call on the one-token path: the least any backend
   takes (cpu and cuda take 8). */
#define MOE_MM 8

/* moe_experts for a batch of one token (decode alone), when the scratch holds
   K rows: the same products, fewer calls. Its K experts, in increasing order,
   share the input row, so their gate and up projections go MOE_MM / 2
   experts to a matmul call, one SwiGLU / GeGLU covers them all, and one
   combine adds the K down projections in expert order: each product and
   each addition is the one moe_experts makes, so the bits are the same.
   Where the backend has moe_token (K <= MOE_MM), all of it is that one
   call (the CPU runs it as one pool run, backend.h), with the same bits. */
static int moe_experts_one(ember_fwd *f, const ember_llm_layer *ly, const ember_tensor *in, ember_act act) {
    ember_backend *be = f->m->be;
    const ember_backend_ops *ops = be->ops;
    const ember_model_config *c = &f->m->cfg;
    ember_llm_state *st = f->st;
    ember_error *err = f->err;
    const int K = c->n_experts_used;
    const int64_t H = c->hidden_size, Im = c->moe_intermediate_size;
    int32_t *sel = st->moe_ids; /* [K]: the experts in increasing order, their weights in moe_ew */
    int rc;
    for (int j = 0; j < K; j++) { /* insertion sort by expert (top-k picks each expert once) */
        int32_t e = st->moe_sel[j];
        float w = st->moe_w[j];
        int i = j;
        for (; i > 0 && sel[i - 1] > e; i--) {
            sel[i] = sel[i - 1];
            st->moe_ew[i] = st->moe_ew[i - 1];
        }
        sel[i] = e;
        st->moe_ew[i] = w;
    }
    if (ops->moe_token && K <= MOE_MM) { /* the whole block in one backend call */
        ember_tensor ex[3 * MOE_MM];
        for (int j = 0; j < K; j++)
            for (int p = 0; p < 3; p++) ex[3 * j + p] = ly->experts[3 * (size_t)sel[j] + (size_t)p];
        ember_tensor ga = rows_view(&st->moe_gate, 2, K, Im, 0), ua = rows_view(&st->moe_up, 2, K, Im, 0),
                     ya = rows_view(&st->moe_y, 2, K, H, 0);
        return ops->moe_token(be, &f->h, in, K, ex, st->moe_ew, act == EMBER_ACT_GELU_TANH, &ga, &ua, &ya, err);
    }
    ember_tensor g[MOE_MM / 2], u[MOE_MM / 2];
    ember_matmul mm[MOE_MM];
    for (int j0 = 0; j0 < K; j0 += MOE_MM / 2) {
        const int n = K - j0 < MOE_MM / 2 ? K - j0 : MOE_MM / 2;
        for (int j = 0; j < n; j++) {
            const ember_tensor *ex = &ly->experts[3 * (size_t)sel[j0 + j]];
            g[j] = rows_view(&st->moe_gate, 2, 1, Im, 0);
            u[j] = rows_view(&st->moe_up, 2, 1, Im, 0);
            g[j].offset += (size_t)(j0 + j) * (size_t)Im * 4;
            u[j].offset += (size_t)(j0 + j) * (size_t)Im * 4;
            mm[2 * j] = (ember_matmul){&g[j], &ex[0], NULL};
            mm[2 * j + 1] = (ember_matmul){&u[j], &ex[1], NULL};
        }
        if ((rc = ops->matmul(be, in, 2 * n, mm, err))) return rc;
    }
    ember_tensor ga = rows_view(&st->moe_gate, 2, K, Im, 0), ua = rows_view(&st->moe_up, 2, K, Im, 0);
    if ((rc = act == EMBER_ACT_GELU_TANH ? ops->geglu(be, &ga, &ga, &ua, err) : ops->swiglu(be, &ga, &ga, &ua, err)))
        return rc;
    /* the down projections, each expert on its own row: MOE_MM at a time in
       one dispatch where the backend has matmul_each */
    ember_tensor y[MOE_MM];
    for (int j0 = 0; j0 < K; j0 += MOE_MM) {
        const int n = K - j0 < MOE_MM ? K - j0 : MOE_MM;
        for (int j = 0; j < n; j++) {
            y[j] = rows_view(&st->moe_y, 2, 1, H, 0);
            y[j].offset += (size_t)(j0 + j) * (size_t)H * 4;
            mm[j] = (ember_matmul){&y[j], &ly->experts[3 * (size_t)sel[j0 + j] + 2], NULL};
        }
        ember_tensor gs = rows_view(&st->moe_gate, 2, n, Im, 0);
        gs.offset += (size_t)j0 * (size_t)Im * 4;
        if (ops->matmul_each) {
            if ((rc = ops->matmul_each(be, &gs, n, mm, err))) return rc;
            continue;
        }
        for (int j = 0; j < n; j++) {
            ember_tensor gj = rows_view(&st->moe_gate, 2, 1, Im, 0);
            gj.offset += (size_t)(j0 + j) * (size_t)Im * 4;
            if ((rc = ops->matmul(be, &gj, 1, &mm[j], err))) return rc;
        }
    }
    int32_t *ids = st->moe_sel; /* every term goes to token 0 (moe_sel is read no more) */
    for (int j = 0; j < K; j++) ids[j] = 0;
    ember_tensor ya = rows_view(&st->moe_y, 2, K, H, 0);
    return ops->add_rows_scaled(be, &f->h, &ya, ids, st->moe_ew, K, err);
}

static int moe_experts(ember_fwd *f, const ember_llm_layer *ly, const ember_tensor *in, ember_act act) {
    ember_backend *be = f->m->be;
    const ember_backend_ops *ops = be->ops;
    const ember_model_config *c = &f->m->cfg;
    ember_llm_state *st = f->st;
    ember_error *err = f->err;
    const int T = f->T, E = c->n_experts, K = c->n_experts_used;
    const int64_t H = c->hidden_size, Im = c->moe_intermediate_size;
    int rc;
    const size_t need_i = (size_t)K * (size_t)Im * 4, need_h = (size_t)K * (size_t)H * 4;
    if (T == 1 && st->moe_gate.nbytes >= need_i && st->moe_up.nbytes >= need_i && st->moe_y.nbytes >= need_h &&
        st->moe_gate.shape[0] >= K) /* moe_ids, moe_ew: one per row */
        return moe_experts_one(f, ly, in, act);
    for (int e = 0; e < E; e++) {
        int n = 0; /* the tokens routed to expert e, in batch order */
        for (int t = 0; t < T; t++)
            for (int j = 0; j < K; j++)
                if (st->moe_sel[(size_t)t * K + j] == e) {
                    st->moe_ids[n] = t;
                    st->moe_ew[n++] = st->moe_w[(size_t)t * K + j];
                }
        if (!n) continue; /* only the chosen experts run */
        const ember_tensor *ex = &ly->experts[3 * e];
        ember_tensor x = rows_view(&st->moe_x, 2, n, H, 0), y = rows_view(&st->moe_y, 2, n, H, 0),
                     g = rows_view(&st->moe_gate, 2, n, Im, 0), u = rows_view(&st->moe_up, 2, n, Im, 0);
        ember_matmul gu[2] = {{&g, &ex[0], NULL}, {&u, &ex[1], NULL}}, dn = {&y, &ex[2], NULL};
        if ((rc = ops->get_rows(be, &x, in, st->moe_ids, n, err)) || (rc = ops->matmul(be, &x, 2, gu, err)) ||
            (rc = act == EMBER_ACT_GELU_TANH ? ops->geglu(be, &g, &g, &u, err) : ops->swiglu(be, &g, &g, &u, err)) ||
            (rc = ops->matmul(be, &g, 1, &dn, err)) ||
            (rc = ops->add_rows_scaled(be, &f->h, &y, st->moe_ids, st->moe_ew, n, err)))
            return rc;
    }
    return EMBER_OK;
}

int ember_blk_moe(ember_fwd *f, const ember_llm_layer *ly) {
    ember_backend *be = f->m->be;
    const ember_backend_ops *ops = be->ops;
    const ember_model_config *c = &f->m->cfg;
    ember_llm_state *st = f->st;
    ember_error *err = f->err;
    const int T = f->T, E = c->n_experts, K = c->n_experts_used;
    const int64_t H = c->hidden_size;
    int rc;
    if (!ops->add_rows_scaled)
        return ember_err(err, EMBER_ERR_UNSUPPORTED, "the %s backend cannot run a mixture-of-experts block", ops->name);
    ember_tensor lg = rows_view(&st->moe_logits, 2, T, E, 0), in = rows_view(&st->moe_in, 2, T, H, 0);
    ember_matmul route = {&lg, &ly->router, NULL};
    if ((rc = ops->matmul(be, &f->h, 1, &route, err)) ||
        (rc = ops->read(be, &lg, 0, st->moe_host, (size_t)T * (size_t)E * sizeof(float), err)) ||
        (rc = ops->copy(be, &in, 0, &f->h, 0, (size_t)T * (size_t)H * sizeof(float), err)) ||
        (rc = ops->scale(be, &f->h, &f->h, 0.0f, err)))
        return rc;
    for (int t = 0; t < T; t++) /* each token routed on its own logits */
        ember_moe_route(c, st->moe_host + (size_t)t * (size_t)E, ly->router_bias, st->moe_choice,
                        st->moe_sel + (size_t)t * K, st->moe_w + (size_t)t * K);
    if ((rc = moe_experts(f, ly, &in, EMBER_ACT_SILU))) return rc;
    if (!ly->sh_gate.buf) return EMBER_OK;
    /* the shared expert on every token, added to the routed sum (weighed by
       sigmoid(h Wsg) per token when it has a gate) */
    const int64_t Is = ly->sh_gate.shape[0];
    ember_tensor y = rows_view(&st->moe_y, 2, T, H, 0), g = rows_view(&st->moe_gate, 2, T, Is, 0),
                 u = rows_view(&st->moe_up, 2, T, Is, 0);
    ember_matmul gu[2] = {{&g, &ly->sh_gate, NULL}, {&u, &ly->sh_up, NULL}}, dn = {&y, &ly->sh_down, NULL};
    if ((rc = ops->matmul(be, &in, 2, gu, err)) || (rc = ops->swiglu(be, &g, &g, &u, err)) ||
        (rc = ops->matmul(be, &g, 1, &dn, err)))
        return rc;
    if (!ly->sh_expert_gate.buf) return ops->add(be, &f->h, &f->h, &y, err);
    ember_tensor sg = rows_view(&st->moe_logits, 2, T, 1, 0);
    ember_matmul gm = {&sg, &ly->sh_expert_gate, NULL};
    if ((rc = ops->matmul(be, &in, 1, &gm, err)) ||
        (rc = ops->read(be, &sg, 0, st->moe_host, (size_t)T * sizeof(float), err)))
        return rc;
    for (int t = 0; t < T; t++) {
        st->moe_ids[t] = t;
        st->moe_ew[t] = 1.0f / (1.0f + expf(-st->moe_host[t]));
    }
    return ops->add_rows_scaled(be, &f->h, &y, st->moe_ids, st->moe_ew, T, err);
}

int ember_blk_residual(ember_fwd *f) {
    ember_backend *be = f->m->be;
    return be->ops->add(be, &f->x, &f->x, &f->h, f->err);
}

int ember_blk_residual_norm(ember_fwd *f, const ember_tensor *w, bool plus_one) {
    ember_backend *be = f->m->be;
    if (be->ops->add_rms_norm)
        return be->ops->add_rms_norm(be, &f->h, &f->x, &f->h, w, f->m->cfg.rms_norm_eps, plus_one, f->err);
    int rc = ember_blk_residual(f);
    return rc ? rc : ember_blk_norm(f, &f->h, &f->x, w, plus_one);
}

/* The first index of the largest of x[0..n), NaNs skipped, 0 when all are
   NaN (ember_argmax's rule, sample/sampler.c). */
static int32_t host_argmax(const float *x, int n) {
    int32_t best = -1;
    for (int i = 0; i < n; i++)
        if (!isnan(x[i]) && (best < 0 || x[i] > x[best])) best = i;
    return best < 0 ? 0 : best;
}

/* The rows b->tap of x into the batch's taps at tap layer slot k, through
   the state's sel rows (max_logit_rows at a time) and the host staging;
   with norm, rms-normed first (the EMBER_TAP_NORMED tap). */
static int tap_rows(ember_fwd *f, const ember_tensor *x, int k, const ember_tensor *norm, bool plus_one) {
    ember_backend *be = f->m->be;
    const ember_backend_ops *ops = be->ops;
    ember_llm_state *st = f->st;
    const ember_batch *b = f->b;
    const int H = f->m->cfg.hidden_size, K = b->n_tap_layers;
    int rc;
    for (int o0 = 0; o0 < b->n_tap; o0 += st->max_logit_rows) {
        int n = b->n_tap - o0 < st->max_logit_rows ? b->n_tap - o0 : st->max_logit_rows;
        ember_tensor sel = rows_view(&st->sel, 2, n, H, 0);
        if ((rc = ops->get_rows(be, &sel, x, b->tap + o0, n, f->err)) ||
            (norm && (rc = ops->rms_norm(be, &sel, &sel, norm, f->m->cfg.rms_norm_eps, plus_one, f->err))) ||
            (rc = ops->read(be, &sel, 0, st->tap_host, (size_t)n * (size_t)H * 4, f->err)))
            return rc;
        for (int i = 0; i < n; i++)
            memcpy(b->taps + ((size_t)(o0 + i) * K + (size_t)k) * (size_t)H, st->tap_host + (size_t)i * H,
                   (size_t)H * sizeof(float));
    }
    return EMBER_OK;
}

int ember_blk_tap(ember_fwd *f, int l) {
    const ember_batch *b = f->b;
    int rc = EMBER_OK;
    for (int k = 0; b->n_tap > 0 && k < b->n_tap_layers && !rc; k++)
        if (b->tap_layers[k] == l) rc = tap_rows(f, &f->x, k, NULL, false);
    return rc;
}

int ember_blk_logits(ember_fwd *f, const ember_tensor *norm, bool plus_one, float softcap, float *logits) {
    ember_backend *be = f->m->be;
    const ember_backend_ops *ops = be->ops;
    ember_llm_state *st = f->st;
    const ember_batch *b = f->b;
    const int V = f->m->cfg.vocab_size, H = f->m->cfg.hidden_size;
    int rc = ember_blk_tap(f, f->m->cfg.n_layers); /* the taps after the last layer, then after the final norm */
    for (int k = 0; !rc && b->n_tap > 0 && k < b->n_tap_layers; k++)
        if (b->tap_layers[k] == EMBER_TAP_NORMED) rc = tap_rows(f, &f->x, k, norm, plus_one);
    if (rc) return rc;
    /* LOGIT_ROWS (the state's max_logit_rows) rows at a time */
    for (int o0 = 0; o0 < b->n_out; o0 += st->max_logit_rows) {
        int n = b->n_out - o0 < st->max_logit_rows ? b->n_out - o0 : st->max_logit_rows;
        ember_tensor sel = rows_view(&st->sel, 2, n, H, 0), lg = rows_view(&st->logits, 2, n, V, 0);
        ember_matmul head = {&lg, &f->m->lm_head, NULL};
        if ((rc = ops->get_rows(be, &sel, &f->x, b->out + o0, n, f->err)) ||
            (rc = ops->rms_norm(be, &sel, &sel, norm, f->m->cfg.rms_norm_eps, plus_one, f->err)) ||
            (rc = ops->matmul(be, &sel, 1, &head, f->err)) ||
            (softcap > 0 && (rc = ops->softcap(be, &lg, &lg, softcap, f->err))))
            return rc;
        if (b->draw) { /* device draws (check_batch: the backend has sample_rows) */
            if ((rc = ops->sample_rows(be, &lg, b->draw + o0, b->argmax + o0, n, f->err))) return rc;
            continue;
        }
        if (b->argmax && ops->argmax_rows) { /* greedy ids only: the rows stay on the device */
            if ((rc = ops->argmax_rows(be, &lg, b->argmax + o0, n, f->err))) return rc;
            continue;
        }
        float *dst = logits + (size_t)o0 * (size_t)V;
        if ((rc = ops->read(be, &lg, 0, dst, (size_t)n * (size_t)V * 4, f->err))) return rc;
        for (int i = 0; b->argmax && i < n; i++) /* as ember_argmax */
            b->argmax[o0 + i] = host_argmax(dst + (size_t)i * (size_t)V, V);
    }
    return EMBER_OK;
}

/* ---- Gemma 4's blocks (family.h, gemma4.c) ------------------------------------------ */

int ember_load_fused_experts(ember_loader *L, int i) {
    ember_llm *m = L->m;
    const ember_model_config *c = &m->cfg;
    ember_llm_layer *ly = &m->layers[i];
    const int64_t E = c->n_experts, H = c->hidden_size, Im = c->moe_intermediate_size;
    char gn[256], dn[256];
    int rc;
    if (E < 1 || c->n_experts_used < 1 || c->n_experts_used > E)
        return ember_err(L->err, EMBER_ERR_FORMAT, "%s: layer %d: %d experts with top-%d is not a mixture of experts",
                         L->primary, i, (int)E, c->n_experts_used);
    snprintf(gn, sizeof gn, "model.layers.%d.experts.switch_glu.gate_proj.weight", i);
    if (L->w && ember_load_has(L, gn)) { /* mlx-lm's layout: experts.switch_glu.{gate,up,down}_proj, stacked */
        static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
        ly->experts = ember_calloc((size_t)E * 3, sizeof *ly->experts);
        if (!ly->experts) return ember_err(L->err, EMBER_ERR_NOMEM, "out of memory");
        for (int p = 0; p < 3; p++) {
            snprintf(gn, sizeof gn, "model.layers.%d.experts.switch_glu.%s.weight", i, proj[p]);
            if ((rc = load_stacked_st(L, gn, E, p < 2 ? Im : H, p < 2 ? H : Im, ly->experts + p, 3))) return rc;
        }
        count_active_experts(m, ly);
        return EMBER_OK;
    }
    char fused[96], gate[96];
    snprintf(fused, sizeof fused, "blk.%d.ffn_gate_up_exps.weight", i);
    snprintf(gate, sizeof gate, "blk.%d.ffn_gate_exps.weight", i);
    if (L->gg && !ember_gguf_find_tensor(L->gg, fused) && ember_gguf_find_tensor(L->gg, gate)) {
        /* llama.cpp's gemma4 also reads the gate and up experts apart: blk.i.ffn_{gate,up,down}_exps */
        static const char *const gg[3] = {"gate", "up", "down"};
        ly->experts = ember_calloc((size_t)E * 3, sizeof *ly->experts);
        if (!ly->experts) return ember_err(L->err, EMBER_ERR_NOMEM, "out of memory");
        for (int p = 0; p < 3; p++) {
            snprintf(gn, sizeof gn, "blk.%d.ffn_%s_exps.weight", i, gg[p]);
            if ((rc = load_stacked(L, gn, (int)E, p < 2 ? Im : H, p < 2 ? H : Im, ly->experts + p, 3))) return rc;
        }
        count_active_experts(m, ly);
        return EMBER_OK;
    }
    ember_tensor gu, down;
    snprintf(gn, sizeof gn, "model.layers.%d.experts.gate_up_proj", i);
    snprintf(dn, sizeof dn, "model.layers.%d.experts.down_proj", i);
    if ((rc = ember_load_tensor(L, &gu, gn, 3, (const int64_t[]){E, 2 * Im, H}, false, false)) ||
        (rc = ember_load_tensor(L, &down, dn, 3, (const int64_t[]){E, H, Im}, false, false)))
        return rc;
    if (gu.nbytes % (size_t)(E * 2 * Im) || down.nbytes % (size_t)(E * H))
        return ember_err(L->err, EMBER_ERR_FORMAT, "%s: layer %d: the fused expert tensors cannot be split into rows",
                         L->primary, i);
    const size_t gu_row = gu.nbytes / (size_t)(E * 2 * Im), dn_row = down.nbytes / (size_t)(E * H);
    ly->experts = ember_calloc((size_t)E * 3, sizeof *ly->experts);
    if (!ly->experts) return ember_err(L->err, EMBER_ERR_NOMEM, "out of memory");
    for (int64_t e = 0; e < E; e++) { /* expert e: gate rows [2e Im, (2e + 1) Im), up rows after, down [e H, (e + 1) H) */
        ember_tensor *ex = &ly->experts[3 * e];
        if ((rc = ember_tensor_view(&ex[0], gu.buf, gu.offset + (size_t)(2 * e * Im) * gu_row, gu.dtype, 2,
                                    (const int64_t[]){Im, H}, L->err)) ||
            (rc = ember_tensor_view(&ex[1], gu.buf, gu.offset + (size_t)((2 * e + 1) * Im) * gu_row, gu.dtype, 2,
                                    (const int64_t[]){Im, H}, L->err)) ||
            (rc = ember_tensor_view(&ex[2], down.buf, down.offset + (size_t)(e * H) * dn_row, down.dtype, 2,
                                    (const int64_t[]){H, Im}, L->err)))
            return rc;
    }
    count_active_experts(m, ly);
    return EMBER_OK;
}

int ember_load_ones(ember_loader *L, ember_tensor *t, int n) {
    ember_llm *m = L->m;
    ember_buffer *b = NULL;
    float *one = ember_malloc((size_t)n * sizeof *one);
    if (!one) return ember_err(L->err, EMBER_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) one[i] = 1.0f;
    int rc = ember_tensor_alloc(m->be, t, &b, EMBER_F32, 1, (const int64_t[]){n}, L->err);
    if (!rc) rc = m->be->ops->write(m->be, t, 0, one, (size_t)n * sizeof *one, L->err);
    free(one);
    if (rc) {
        ember_buffer_free(b);
        return rc;
    }
    return keep_buf(m, b, L->err);
}

void ember_fwd_layer_shape(ember_fwd *f, int D, int Hkv, int I) {
    ember_llm_state *st = f->st;
    const int T = f->T, Hq = f->m->cfg.n_heads;
    f->q = rows_view(&st->q, 2, T, (int64_t)Hq * D, 0);
    f->k = rows_view(&st->k, 2, T, (int64_t)Hkv * D, 0);
    f->v = rows_view(&st->v, 2, T, (int64_t)Hkv * D, 0);
    f->att = rows_view(&st->att, 2, T, (int64_t)Hq * D, 0);
    f->q3 = rows_view(&st->q, 3, T, Hq, D);
    f->k3 = rows_view(&st->k, 3, T, Hkv, D);
    f->v3 = rows_view(&st->v, 3, T, Hkv, D);
    f->att3 = rows_view(&st->att, 3, T, Hq, D);
    f->qh = rows_view(&st->q, 2, (int64_t)T * Hq, D, 0);
    f->kh = rows_view(&st->k, 2, (int64_t)T * Hkv, D, 0);
    f->gate = rows_view(&st->gate, 2, T, I, 0);
    f->up = rows_view(&st->up, 2, T, I, 0);
}

int ember_blk_attention_g4(ember_fwd *f, const ember_llm_layer *ly, const ember_rope *rope, const ember_attn *a) {
    ember_backend *be = f->m->be;
    const ember_backend_ops *ops = be->ops;
    const float eps = f->m->cfg.rms_norm_eps;
    ember_error *err = f->err;
    const int64_t D = f->q3.shape[2], Hkv = f->k3.shape[1];
    int rc;
    ember_kv_layer views[2];
    ember_kv_map map;
    ember_kv_map_for(f->kv, ly->kv_layer, f->b->row, f->b->pos, views, &map);
    ember_matmul qkv[3] = {{&f->q, &ly->wq, NULL}, {&f->k, &ly->wk, NULL}, {&f->v, &ly->wv, NULL}};
    if (ly->kv_shared) { /* K and V are in the cache already: an earlier layer wrote them in this pass */
        if ((rc = ops->matmul(be, &f->h, 1, qkv, err))) return rc;
    } else {
        ember_tensor vh = rows_view(&f->st->v, 2, (int64_t)f->T * Hkv, D, 0), one = f->m->ones;
        one.shape[0] = D;
        one.nbytes = (size_t)D * sizeof(float);
        if ((rc = ops->matmul(be, &f->h, ly->k_eq_v ? 2 : 3, qkv, err)) ||
            (ly->k_eq_v && (rc = ops->copy(be, &f->v, 0, &f->k, 0, f->k.nbytes, err))) ||
            (rc = ops->rms_norm(be, &f->kh, &f->kh, &ly->k_norm, eps, false, err)) ||
            (rc = ops->rms_norm(be, &vh, &vh, &one, eps, false, err)) ||
            (rc = ops->rope(be, &f->k3, f->b->pos, rope, err)) || (rc = ops->kv_write(be, &map, &f->k3, &f->v3, err)))
            return rc;
    }
    ember_matmul o = {&f->h, &ly->wo, NULL};
    if ((rc = ops->rms_norm(be, &f->qh, &f->qh, &ly->q_norm, eps, false, err)) ||
        (rc = ops->rope(be, &f->q3, f->b->pos, rope, err)) || (rc = ops->attention(be, &f->att3, &f->q3, &map, a, err)) ||
        (rc = ops->matmul(be, &f->att, 1, &o, err)))
        return rc;
    return EMBER_OK;
}

int ember_blk_ple_inputs(ember_fwd *f) {
    ember_llm *m = f->m;
    ember_backend *be = m->be;
    const ember_backend_ops *ops = be->ops;
    ember_llm_state *st = f->st;
    const ember_model_config *c = &m->cfg;
    const int64_t T = f->T, L = c->n_layers, P = c->ple_dim;
    ember_tensor all = rows_view(&st->ple_all, 2, T, L * P, 0), allh = rows_view(&st->ple_all, 2, T * L, P, 0),
                 tok = rows_view(&st->ple_tok, 2, T, L * P, 0);
    ember_matmul proj = {&all, &m->ple_model_proj, NULL};
    int rc;
    if ((rc = ops->get_rows(be, &tok, &m->ple_embed, f->b->tok, f->T, f->err)) ||
        (rc = ops->scale(be, &tok, &tok, (float)sqrt((double)P), f->err)) ||
        (rc = ops->matmul(be, &f->x, 1, &proj, f->err)) ||
        (rc = ops->scale(be, &all, &all, (float)pow((double)c->hidden_size, -0.5), f->err)) ||
        (rc = ops->rms_norm(be, &allh, &allh, &m->ple_proj_norm, c->rms_norm_eps, false, f->err)) ||
        (rc = ops->add(be, &all, &all, &tok, f->err)) ||
        (rc = ops->scale(be, &all, &all, (float)pow(2.0, -0.5), f->err)))
        return rc;
    return EMBER_OK;
}

int ember_blk_ple(ember_fwd *f, int l, const ember_llm_layer *ly) {
    ember_backend *be = f->m->be;
    const ember_backend_ops *ops = be->ops;
    ember_llm_state *st = f->st;
    const ember_model_config *c = &f->m->cfg;
    const int64_t T = f->T, L = c->n_layers, P = c->ple_dim;
    for (int t = 0; t < f->T; t++) st->ple_ids[t] = (int32_t)(t * L + l); /* row l of token t's [L, P] */
    ember_tensor allh = rows_view(&st->ple_all, 2, T * L, P, 0), one = rows_view(&st->ple_one, 2, T, P, 0),
                 g = rows_view(&st->ple_g, 2, T, P, 0);
    ember_matmul gate = {&g, &ly->ple_gate, NULL}, proj = {&f->h, &ly->ple_proj, NULL};
    int rc;
    if ((rc = ops->get_rows(be, &one, &allh, st->ple_ids, f->T, f->err)) ||
        (rc = ops->matmul(be, &f->x, 1, &gate, f->err)) || (rc = ops->geglu(be, &g, &g, &one, f->err)) ||
        (rc = ops->matmul(be, &g, 1, &proj, f->err)) ||
        (rc = ops->rms_norm(be, &f->h, &f->h, &ly->ple_norm, c->rms_norm_eps, false, f->err)) ||
        (rc = ops->add(be, &f->x, &f->x, &f->h, f->err)))
        return rc;
    return EMBER_OK;
}

int ember_blk_moe_g4(ember_fwd *f, const ember_llm_layer *ly) {
    ember_backend *be = f->m->be;
    const ember_backend_ops *ops = be->ops;
    const ember_model_config *c = &f->m->cfg;
    ember_llm_state *st = f->st;
    ember_error *err = f->err;
    const int T = f->T, E = c->n_experts, K = c->n_experts_used;
    const int64_t H = c->hidden_size;
    const float eps = c->rms_norm_eps;
    int rc;
    if (!ops->add_rows_scaled)
        return ember_err(err, EMBER_ERR_UNSUPPORTED, "the %s backend cannot run a mixture-of-experts block", ops->name);
    ember_tensor lg = rows_view(&st->moe_logits, 2, T, E, 0), in = rows_view(&st->moe_in, 2, T, H, 0),
                 h1 = rows_view(&st->mlp_out, 2, T, H, 0);
    ember_matmul route = {&lg, &ly->router, NULL};
    /* the dense MLP's share, then the router on the residual stream, then the experts' input */
    if ((rc = ops->rms_norm(be, &h1, &f->h, &ly->post_ffn_norm1, eps, false, err)) ||
        (rc = ops->rms_norm(be, &in, &f->x, &ly->router_scale, eps, false, err)) ||
        (rc = ops->scale(be, &in, &in, (float)pow((double)H, -0.5), err)) || (rc = ops->matmul(be, &in, 1, &route, err)) ||
        (rc = ops->read(be, &lg, 0, st->moe_host, (size_t)T * (size_t)E * sizeof(float), err)) ||
        (rc = ops->rms_norm(be, &in, &f->x, &ly->pre_ffn_norm2, eps, false, err)) ||
        (rc = ops->scale(be, &f->h, &f->h, 0.0f, err)))
        return rc;
    for (int t = 0; t < T; t++) { /* softmax, top k renormalised (c->norm_topk_prob), times per_expert_scale */
        int32_t *sel = st->moe_sel + (size_t)t * K;
        float *w = st->moe_w + (size_t)t * K;
        ember_moe_route(c, st->moe_host + (size_t)t * (size_t)E, NULL, st->moe_choice, sel, w);
        for (int j = 0; j < K; j++) w[j] *= ly->expert_scale[sel[j]];
    }
    if ((rc = moe_experts(f, ly, &in, EMBER_ACT_GELU_TANH))) return rc; /* GeGLU experts */
    if ((rc = ops->rms_norm(be, &f->h, &f->h, &ly->post_ffn_norm2, eps, false, err)) ||
        (rc = ops->add(be, &f->h, &h1, &f->h, err)))
        return rc;
    return EMBER_OK;
}

int ember_blk_scale_x(ember_fwd *f, float s) {
    ember_backend *be = f->m->be;
    return s == 1.0f ? EMBER_OK : be->ops->scale(be, &f->x, &f->x, s, f->err);
}
