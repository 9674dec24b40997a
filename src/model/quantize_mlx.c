/*
 * quantize_mlx.c - see quantize_mlx.h. Plans the output tensors (each
 * quantizable matrix becomes weight / scales / biases, the rest is copied;
 * a module is one source matrix or a stack of experts, gathered row by row
 * from per-expert tensors or from row ranges of a fused one),
 * then streams model.safetensors through ember_st_write: a module is
 * quantized (rows split over a worker pool, formats/mlx_quant.h's
 * quantizer) when its first output tensor is written, and kept until its
 * three tensors are out, so memory holds one module at a time.
 *
 * Ownership: everything allocated here is freed before returning. Called
 * from one thread; pool workers only encode disjoint rows.
 */
#define _POSIX_C_SOURCE 200809L
#include "quantize_mlx.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/cpu.h"
#include "core/mapfile.h"
#include "core/threadpool.h"
#include "core/util.h"
#include "formats/config.h"
#include "formats/mlx_quant.h"
#include "formats/quant.h"
#include "formats/safetensors.h"
#include "formats/weights.h"

#define MAX_CONFIG_BYTES (16u * 1024u * 1024u)

bool ember_mlx_qtype_parse(const char *name, int *bits, int *high_bits) {
    int b = 0, h = 0;
    char tail;
    if (sscanf(name, "mlx_mixed_%d_%d%c", &b, &h, &tail) == 2) {
        if (!ember_mlx_bits_ok(b) || !ember_mlx_bits_ok(h) || h <= b) return false;
    } else if (sscanf(name, "mlx%d%c", &b, &tail) != 1 || !ember_mlx_bits_ok(b)) {
        return false;
    }
    *bits = b;
    *high_bits = h;
    return true;
}

typedef enum part_kind { PART_COPY = 0, PART_W, PART_S, PART_B, PART_STACK } part_kind;

/* A matrix of the output: one source tensor, or a stack of experts
   [E, rows, K] gathered from E per-expert tensors (qwen3_moe, glm4_moe) or
   from row ranges of one fused 3-D tensor (gemma4's gate_up_proj). */
typedef struct qmod {
    char path[200];                /* output module path ("...switch_mlp.gate_proj") */
    const ember_st_tensor **src;   /* n_src tensors (malloc'd) */
    int n_src;                     /* 1, or E: src[e] is expert e's [rows, K] */
    int64_t E;                     /* 0: a 2-D [rows, K] output; else [E, rows, K] */
    int64_t rows, K;
    int64_t stride, row0;          /* one fused source: expert e's row r is row e * stride + row0 + r */
    ember_dtype dtype;             /* the sources' dtype */
} qmod;

typedef struct plan_entry {
    part_kind kind;
    const ember_st_tensor *src; /* PART_COPY */
    const qmod *mod;            /* the other kinds */
    int bits, G;                /* quantized parts: the module's width and group size */
    ember_dtype sdt;            /* quantized parts: dtype of scales / biases */
} plan_entry;

typedef struct qctx {
    const ember_mlx_qopts *o;
    const plan_entry *plan;
    ember_pool *pool;
    float *scratch; /* per thread, K floats each */
    size_t scratch_k;
    const qmod *cur; /* the module held below, or NULL */
    unsigned char *packed, *scales, *biases;
} qctx;

typedef struct row_job {
    const qctx *q;
    const plan_entry *e;
    int64_t K;
    size_t packed_row, sb_row;
} row_job;

/* Row R (of all E * rows) of module m in its source. */
static const unsigned char *mod_row(const qmod *m, int64_t R) {
    const int64_t e = R / m->rows, r = R % m->rows;
    const size_t rb = (size_t)m->K * ember_dtype_get(m->dtype)->block_bytes;
    if (m->n_src > 1) return m->src[e]->data + (size_t)r * rb;
    return m->src[0]->data + (size_t)(e * m->stride + m->row0 + r) * rb;
}

static void put_scalar(ember_dtype t, unsigned char *p, float v) {
    if (t == EMBER_F32) {
        memcpy(p, &v, 4);
        return;
    }
    uint16_t h = t == EMBER_F16 ? ember_f32_to_f16(v) : ember_f32_to_bf16(v);
    memcpy(p, &h, 2);
}

/* Quantizes one row into MLX's packed codes, scales and biases. */
static void row_task(void *ctx, int row, int thread) {
    const row_job *j = ctx;
    const qctx *q = j->q;
    const qmod *m = j->e->mod;
    const int bits = j->e->bits, G = j->e->G;
    const size_t ssz = ember_dtype_get(j->e->sdt)->block_bytes;
    float *x = q->scratch + (size_t)thread * q->scratch_k;
    ember_dequantize(m->dtype, mod_row(m, row), x, (size_t)j->K, NULL);
    unsigned char *dst = q->packed + (size_t)row * j->packed_row;
    uint8_t codes[128];
    for (int64_t g = 0; g < j->K / G; g++) {
        float s, b;
        ember_mlx_quantize_group(x + g * G, G, bits, codes, &s, &b);
        /* 8 codes fill `bits` bytes of the little-endian stream */
        for (int c = 0; c < G; c += 8, dst += bits) {
            uint64_t v = 0;
            for (int i = 0; i < 8; i++) v |= (uint64_t)codes[c + i] << (i * bits);
            for (int i = 0; i < bits; i++) dst[i] = (unsigned char)(v >> (8 * i));
        }
        size_t si = (size_t)row * j->sb_row + (size_t)g * ssz;
        put_scalar(j->e->sdt, q->scales + si, s);
        put_scalar(j->e->sdt, q->biases + si, b);
    }
}

/* Quantizes the module of plan entry e into q's buffers (once per module). */
static int quantize_module(qctx *q, const plan_entry *e, ember_error *err) {
    if (q->cur == e->mod) return EMBER_OK;
    free(q->packed);
    free(q->scales);
    free(q->biases);
    q->packed = q->scales = q->biases = NULL;
    q->cur = NULL;
    const qmod *m = e->mod;
    int64_t N = (m->E ? m->E : 1) * m->rows, K = m->K;
    row_job j = {q, e, K, (size_t)K * (size_t)e->bits / 8,
                 (size_t)(K / e->G) * ember_dtype_get(e->sdt)->block_bytes};
    q->packed = ember_malloc((size_t)N * j.packed_row + 1);
    q->scales = ember_malloc((size_t)N * j.sb_row + 1);
    q->biases = ember_malloc((size_t)N * j.sb_row + 1);
    if (!q->packed || !q->scales || !q->biases) return ember_err(err, EMBER_ERR_NOMEM, "out of memory quantizing '%s'", m->path);
    ember_pool_run(q->pool, (int)N, row_task, &j);
    q->cur = m;
    return EMBER_OK;
}

static int fill(void *user, int index, size_t first, size_t n, void *dst, ember_error *err) {
    qctx *q = user;
    const plan_entry *e = &q->plan[index];
    if (e->kind == PART_COPY) {
        size_t es = ember_dtype_get(e->src->dtype)->block_bytes;
        memcpy(dst, e->src->data + first * es, n * es);
        return EMBER_OK;
    }
    if (e->kind == PART_STACK) { /* a float stack, row by row from its sources */
        const qmod *m = e->mod;
        const size_t es = ember_dtype_get(m->dtype)->block_bytes, K = (size_t)m->K;
        unsigned char *d = dst;
        for (size_t i = first; i < first + n;) {
            size_t R = i / K, c = i % K, take = K - c < first + n - i ? K - c : first + n - i;
            memcpy(d, mod_row(m, (int64_t)R) + c * es, take * es);
            d += take * es;
            i += take;
        }
        return EMBER_OK;
    }
    int rc = quantize_module(q, e, err);
    if (rc) return rc;
    const unsigned char *src = e->kind == PART_W ? q->packed : e->kind == PART_S ? q->scales : q->biases;
    size_t es = e->kind == PART_W ? 4 : ember_dtype_get(e->sdt)->block_bytes;
    memcpy(dst, src + first * es, n * es);
    return EMBER_OK;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* mlx-lm's mixed recipe: does module path get the high width? */
static bool more_bits(const char *path, int n_layers) {
    if (strstr(path, "lm_head")) return true;
    int i = 0;
    if (sscanf(path, "model.layers.%d.", &i) != 1) i = 0;
    bool use_more = i < n_layers / 8 || i >= 7 * n_layers / 8 || (i - n_layers / 8) % 3 == 2;
    return use_more && (strstr(path, "v_proj") || strstr(path, "down_proj"));
}

static int copy_file(const char *from, const char *to, ember_error *err) {
    FILE *in = fopen(from, "rb");
    if (!in) return ember_err(err, EMBER_ERR_IO, "%s: cannot open: %s", from, strerror(errno));
    FILE *out = fopen(to, "wb");
    if (!out) {
        fclose(in);
        return ember_err(err, EMBER_ERR_IO, "%s: cannot create: %s", to, strerror(errno));
    }
    char buf[65536];
    size_t got;
    int rc = EMBER_OK;
    while ((got = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, got, out) != got) {
            rc = ember_err(err, EMBER_ERR_IO, "%s: write failed: %s", to, strerror(errno));
            break;
        }
    if (!rc && ferror(in)) rc = ember_err(err, EMBER_ERR_IO, "%s: read failed", from);
    fclose(in);
    if (fclose(out) != 0 && !rc) rc = ember_err(err, EMBER_ERR_IO, "%s: write failed: %s", to, strerror(errno));
    return rc;
}

static json_t *qparams(int group_size, int bits) {
    json_t *o = json_object();
    json_object_set_new(o, "group_size", json_integer(group_size));
    json_object_set_new(o, "bits", json_integer(bits));
    json_object_set_new(o, "mode", json_string("affine"));
    return o;
}

/* config.json: the input's fields plus the quantization entries. */
static int write_config(const char *in_dir, const char *out_dir, json_t *quant, ember_error *err) {
    char *in = ember_path_join(in_dir, "config.json"), *out = ember_path_join(out_dir, "config.json"), *text = NULL;
    size_t len;
    json_t *root = NULL;
    int rc = !in || !out ? ember_err(err, EMBER_ERR_NOMEM, "out of memory") : EMBER_OK;
    if (!rc) rc = ember_read_file(in, MAX_CONFIG_BYTES, &text, &len, err);
    if (!rc) {
        json_error_t je;
        root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
        if (!json_is_object(root)) rc = ember_err(err, EMBER_ERR_FORMAT, "%s: not a JSON object", in);
    }
    if (!rc) {
        json_object_set(root, "quantization", quant);
        json_object_set_new(root, "quantization_config", json_deep_copy(quant));
        if (json_dump_file(root, out, JSON_INDENT(4) | JSON_SORT_KEYS) != 0)
            rc = ember_err(err, EMBER_ERR_IO, "%s: cannot write", out);
    }
    json_decref(root);
    free(text);
    free(in);
    free(out);
    return rc;
}

static const char *const k_side_files[] = {"tokenizer.json",     "tokenizer_config.json", "special_tokens_map.json",
                                           "tokenizer.model",    "vocab.json",            "merges.txt",
                                           "added_tokens.json",  "generation_config.json", "chat_template.jinja",
                                           "chat_template.json"};

/* The plan being built: output entries and the modules they come from. */
typedef struct planner {
    const ember_mlx_qopts *o;
    const ember_model_config *cfg;
    plan_entry *plan;
    int n, cap;
    qmod **mods;
    int n_mods, cap_mods;
    json_t *quant;
    size_t max_k;
} planner;

static int plan_push(planner *P, plan_entry e, ember_error *err) {
    if (P->n == P->cap) {
        int cap = P->cap ? 2 * P->cap : 256;
        plan_entry *np = ember_realloc(P->plan, (size_t)cap * sizeof *np);
        if (!np) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        P->plan = np;
        P->cap = cap;
    }
    P->plan[P->n++] = e;
    return EMBER_OK;
}

/* A new module *out (owned by P) with n_src source slots. */
static int mod_new(planner *P, const char *path, int n_src, qmod **out, ember_error *err) {
    *out = NULL;
    if (P->n_mods == P->cap_mods) {
        int cap = P->cap_mods ? 2 * P->cap_mods : 64;
        qmod **nm = ember_realloc(P->mods, (size_t)cap * sizeof *nm);
        if (!nm) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        P->mods = nm;
        P->cap_mods = cap;
    }
    qmod *m = ember_calloc(1, sizeof *m);
    const ember_st_tensor **src = ember_calloc((size_t)n_src, sizeof *src);
    if (!m || !src) {
        free(m);
        free(src);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    }
    snprintf(m->path, sizeof m->path, "%s", path);
    m->src = src;
    m->n_src = n_src;
    P->mods[P->n_mods++] = m;
    *out = m;
    return EMBER_OK;
}

/* mlx-lm's own predicate for a module of this model (its models'
   quant_predicate; a mixed recipe replaces it): the MoE routers of
   qwen3_moe (mlp.gate) and gemma4 (router.proj) at 8 bits, group 64; glm4_moe's
   router is a bare weight (MoEGate, not a Linear), never quantized. Returns
   the bits (0: the defaults, -1: stays float), *G the group size. */
static int model_rule(const ember_model_config *cfg, const char *path, bool mixed, int *G) {
    const size_t len = strlen(path);
    const bool router = (len > 9 && strcmp(path + len - 9, ".mlp.gate") == 0) ||
                        (len > 12 && strcmp(path + len - 12, ".router.proj") == 0);
    if (!router || !cfg->n_experts) return 0;
    if (cfg->router_sigmoid) return -1;
    if (mixed) return 0;
    *G = 64;
    return 8;
}

/* Adds module m to the plan: weight / scales / biases when its rows are
   whole groups (and the rules quantize it), else the float matrix (a stack
   as one [E, rows, K] tensor). */
static int plan_module(planner *P, qmod *m, ember_error *err) {
    const ember_mlx_qopts *o = P->o;
    int G = o->group_size, bits = o->bits;
    const bool mixed = o->high_bits != 0;
    int rule = model_rule(P->cfg, m->path, mixed, &G);
    if (rule > 0) bits = rule;
    if (mixed) bits = more_bits(m->path, P->cfg->n_layers) ? o->high_bits : o->bits;
    /* mlx-lm quantizes a module whose rows are whole groups of the default size */
    bool quantize = rule >= 0 && m->K % o->group_size == 0 && m->K % G == 0 && (!o->experts_only || m->E);
    if (!quantize) {
        if (!m->E) return plan_push(P, (plan_entry){PART_COPY, m->src[0], NULL, 0, 0, EMBER_DTYPE_INVALID}, err);
        return plan_push(P, (plan_entry){PART_STACK, NULL, m, 0, 0, EMBER_DTYPE_INVALID}, err);
    }
    if (rule > 0) { /* the model's own rule, as mlx-lm writes it (no "mode") */
        json_t *e = json_object();
        json_object_set_new(e, "group_size", json_integer(G));
        json_object_set_new(e, "bits", json_integer(bits));
        json_object_set_new(P->quant, m->path, e);
    } else if (mixed) { /* mlx-lm's mixed recipe lists every module */
        json_object_set_new(P->quant, m->path, qparams(G, bits));
    }
    ember_dtype sdt = o->scale_dtype != EMBER_DTYPE_INVALID ? o->scale_dtype : m->dtype;
    int rc = EMBER_OK;
    for (int p = PART_W; p <= PART_B && !rc; p++) rc = plan_push(P, (plan_entry){(part_kind)p, NULL, m, bits, G, sdt}, err);
    if ((size_t)m->K > P->max_k) P->max_k = (size_t)m->K;
    return rc;
}

static bool is_float(ember_dtype t) {
    return t == EMBER_F32 || t == EMBER_F16 || t == EMBER_BF16;
}

/* The stacked experts of layer l, projection proj, from the per-expert
   tensors model.layers.l.mlp.experts.e.<proj>.weight [rows, K]. */
static int plan_experts(planner *P, const ember_weights *w, int l, const char *proj, int64_t rows, int64_t K,
                        ember_error *err) {
    const int E = P->cfg->n_experts;
    char path[200], name[256];
    snprintf(path, sizeof path, "model.layers.%d.mlp.switch_mlp.%s", l, proj);
    qmod *m;
    int rc = mod_new(P, path, E, &m, err);
    if (rc) return rc;
    for (int e = 0; e < E; e++) {
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.%s.weight", l, e, proj);
        const ember_st_tensor *t = ember_weights_find(w, name, NULL);
        if (!t) return ember_err(err, EMBER_ERR_FORMAT, "%s: missing tensor '%s'", w->primary, name);
        if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != K || !is_float(t->dtype) ||
            (e && t->dtype != m->src[0]->dtype))
            return ember_err(err, EMBER_ERR_FORMAT, "%s: tensor '%s' is not a float [%lld, %lld] matrix like expert 0's",
                             w->primary, name, (long long)rows, (long long)K);
        m->src[e] = t;
    }
    m->E = E;
    m->rows = rows;
    m->K = K;
    m->dtype = m->src[0]->dtype;
    return plan_module(P, m, err);
}

/* Layer index of a "model.layers.N." name, else -1. */
static int layer_of(const char *name) {
    int l = -1, used = 0;
    if (sscanf(name, "model.layers.%d.%n", &l, &used) != 1 || used == 0) return -1;
    return l;
}

/* Plans every output tensor of the model in w (config cfg) into P: the
   matrices as modules (mlx-lm's stacked experts for MoE layers), the rest
   copied; what mlx-lm's sanitize drops is left out. */
static int plan_model(planner *P, const ember_weights *w, const ember_model_config *cfg, ember_error *err) {
    int rc = EMBER_OK;
    const bool gemma4 = strcmp(cfg->model_type, "gemma4_text") == 0;
    const bool tied = cfg->tie_embeddings, per_expert = cfg->n_experts > 0 && !cfg->moe_beside_mlp;
    for (int f = 0; f < w->n_files && !rc; f++) {
        for (int i = 0; i < w->files[f]->n_tensors && !rc; i++) {
            const ember_st_tensor *t = &w->files[f]->tensors[i];
            const int l = layer_of(t->name);
            int le = 0;
            char rest[64];
            if ((tied && strcmp(t->name, "lm_head.weight") == 0) || ends_with(t->name, "rotary_emb.inv_freq")) continue;
            if (l >= cfg->n_layers) continue; /* glm4_moe's MTP layers: mlx-lm drops them */
            if (per_expert && sscanf(t->name, "model.layers.%*d.mlp.experts.%d.%63s", &le, rest) == 2 &&
                ends_with(rest, "_proj.weight"))
                continue; /* stacked below */
            if (gemma4 && l >= 0 && ember_cfg_kv_shared(cfg, l) &&
                (strstr(t->name, ".self_attn.k_proj") || strstr(t->name, ".self_attn.v_proj") ||
                 strstr(t->name, ".self_attn.k_norm")))
                continue; /* KV-shared layers' unused K / V weights: mlx-lm drops them */
            const bool fused_gu = gemma4 && t->ndim == 3 && t->shape[1] % 2 == 0 &&
                                  ends_with(t->name, ".experts.gate_up_proj"),
                       fused_dn = gemma4 && t->ndim == 3 && ends_with(t->name, ".experts.down_proj");
            if ((fused_gu || fused_dn) && is_float(t->dtype) && t->shape[0] == cfg->n_experts) {
                /* gemma4's fused experts: split as mlx-lm's sanitize does into experts.switch_glu.* */
                const size_t base = strlen(t->name) - (fused_gu ? strlen(".gate_up_proj") : strlen(".down_proj"));
                for (int part = 0; part < (fused_gu ? 2 : 1) && !rc; part++) {
                    char path[200];
                    snprintf(path, sizeof path, "%.*s.switch_glu.%s", (int)base, t->name,
                             fused_dn ? "down_proj" : part ? "up_proj" : "gate_proj");
                    qmod *m;
                    if ((rc = mod_new(P, path, 1, &m, err))) break;
                    m->src[0] = t;
                    m->E = t->shape[0];
                    m->rows = fused_gu ? t->shape[1] / 2 : t->shape[1];
                    m->K = t->shape[2];
                    m->stride = t->shape[1];
                    m->row0 = part ? m->rows : 0;
                    m->dtype = t->dtype;
                    rc = plan_module(P, m, err);
                }
                continue;
            }
            if (t->ndim == 2 && is_float(t->dtype) && ends_with(t->name, ".weight") && t->shape[0] > 0 &&
                t->shape[0] < INT32_MAX && t->shape[1] > 0) {
                char path[200];
                snprintf(path, sizeof path, "%.*s", (int)(strlen(t->name) - 7), t->name);
                qmod *m;
                if ((rc = mod_new(P, path, 1, &m, err))) break;
                m->src[0] = t;
                m->rows = m->stride = t->shape[0];
                m->K = t->shape[1];
                m->dtype = t->dtype;
                rc = plan_module(P, m, err);
            } else {
                rc = plan_push(P, (plan_entry){PART_COPY, t, NULL, 0, 0, EMBER_DTYPE_INVALID}, err);
            }
        }
    }
    /* qwen3_moe / glm4_moe: each MoE layer's experts stacked as mlx-lm's sanitize stacks them */
    static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
    const int64_t H = cfg->hidden_size, Im = cfg->moe_intermediate_size;
    for (int l = 0; per_expert && l < cfg->n_layers && !rc; l++)
        for (int p = 0; p < 3 && !rc && cfg->layer_moe[l]; p++)
            rc = plan_experts(P, w, l, proj[p], p < 2 ? Im : H, p < 2 ? H : Im, err);
    return rc;
}

int ember_quantize_to_mlx(const char *in_dir, const char *out_dir, const ember_mlx_qopts *o, ember_error *err) {
    if (!ember_mlx_bits_ok(o->bits) || !ember_mlx_group_ok(o->group_size) ||
        (o->high_bits && !ember_mlx_bits_ok(o->high_bits)))
        return ember_err(err, EMBER_ERR_INVALID_ARG,
                         "MLX quantization needs bits 2, 3, 4, 5, 6 or 8 and group size 32, 64 or 128 (got %d / %d)",
                         o->bits, o->group_size);
    if (o->scale_dtype != EMBER_DTYPE_INVALID && o->scale_dtype != EMBER_F32 && o->scale_dtype != EMBER_F16 &&
        o->scale_dtype != EMBER_BF16)
        return ember_err(err, EMBER_ERR_INVALID_ARG, "MLX scales must be F32, F16 or BF16");
    ember_model_config cfg;
    ember_weights *w = NULL;
    ember_pool *pool = NULL;
    ember_st_out *outs = NULL;
    char **names = NULL;
    planner P = {0};
    int rc = ember_config_load(in_dir, &cfg, err);
    qctx q = {0};
    if (rc) goto done;
    if (cfg.text_of_multimodal) {
        rc = ember_err(err, EMBER_ERR_UNSUPPORTED,
                       "%s: MLX-quantizing a multimodal checkpoint (%s inside text_config) is not supported yet", in_dir,
                       cfg.model_type);
        goto done;
    }
    if (cfg.n_linear) {
        rc = ember_err(err, EMBER_ERR_UNSUPPORTED,
                       "%s: MLX-quantizing a hybrid linear-attention model (%s) is not supported yet", in_dir,
                       cfg.model_type);
        goto done;
    }
    if (cfg.quant.bits) {
        rc = ember_err(err, EMBER_ERR_INVALID_ARG, "%s: the model is already quantized", in_dir);
        goto done;
    }
    if ((rc = ember_weights_open(in_dir, &w, err))) goto done;
    if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) {
        rc = ember_err(err, EMBER_ERR_IO, "%s: cannot create: %s", out_dir, strerror(errno));
        goto done;
    }
    P = (planner){.o = o, .cfg = &cfg, .quant = qparams(o->group_size, o->bits), .max_k = 1};
    rc = plan_model(&P, w, &cfg, err);
    if (rc) goto done;
    const int n = P.n;
    outs = ember_calloc((size_t)(n ? n : 1), sizeof *outs);
    names = ember_calloc((size_t)(n ? n : 1), sizeof *names);
    pool = ember_pool_new(ember_cpu_count(), err);
    if (!pool) {
        rc = err ? err->code : EMBER_ERR_NOMEM;
        goto done;
    }
    q = (qctx){o, P.plan, pool, NULL, P.max_k, NULL, NULL, NULL, NULL};
    q.scratch = ember_malloc((size_t)ember_pool_size(pool) * P.max_k * sizeof(float));
    if (!outs || !names || !q.scratch) {
        rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        const plan_entry *e = &P.plan[i];
        ember_st_out *so = &outs[i];
        if (e->kind == PART_COPY) {
            const ember_st_tensor *t = e->src;
            so->name = t->name;
            so->dtype = t->dtype;
            so->ndim = t->ndim;
            memcpy(so->shape, t->shape, sizeof so->shape);
            continue;
        }
        const qmod *m = e->mod;
        static const char *const suffix[] = {"", "weight", "scales", "biases", "weight"};
        size_t len = strlen(m->path) + 8;
        if (!(names[i] = ember_malloc(len))) {
            rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
            goto done;
        }
        snprintf(names[i], len, "%s.%s", m->path, suffix[e->kind]);
        so->name = names[i];
        int d = 0;
        so->ndim = m->E ? 3 : 2;
        if (m->E) so->shape[d++] = m->E;
        so->shape[d++] = m->rows;
        so->dtype = e->kind == PART_STACK ? m->dtype : e->kind == PART_W ? EMBER_U32 : e->sdt;
        so->shape[d] = e->kind == PART_STACK ? m->K : e->kind == PART_W ? m->K * e->bits / 32 : m->K / e->G;
    }
    char *st_path = ember_path_join(out_dir, "model.safetensors");
    if (!st_path) {
        rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        goto done;
    }
    rc = ember_st_write(st_path, outs, n, fill, &q, err);
    free(st_path);
    if (!rc) rc = write_config(in_dir, out_dir, P.quant, err);
    for (size_t i = 0; !rc && i < EMBER_ARRAY_LEN(k_side_files); i++) {
        char *from = ember_path_join(in_dir, k_side_files[i]), *to = ember_path_join(out_dir, k_side_files[i]);
        struct stat st;
        if (!from || !to)
            rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        else if (stat(from, &st) == 0 && S_ISREG(st.st_mode))
            rc = copy_file(from, to, err);
        free(from);
        free(to);
    }
done:
    free(q.scratch);
    free(q.packed);
    free(q.scales);
    free(q.biases);
    for (int i = 0; names && i < P.n; i++) free(names[i]);
    free(names);
    free(outs);
    free(P.plan);
    for (int i = 0; i < P.n_mods; i++) {
        free(P.mods[i]->src);
        free(P.mods[i]);
    }
    free(P.mods);
    json_decref(P.quant);
    ember_pool_free(pool);
    ember_weights_free(w);
    return rc;
}
