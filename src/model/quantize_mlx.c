/*
 * quantize_mlx.c - see quantize_mlx.h. Plans the output tensors (each
 * quantizable matrix becomes weight / scales / biases, the rest is copied),
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

typedef enum part_kind { PART_COPY = 0, PART_W, PART_S, PART_B } part_kind;

typedef struct plan_entry {
    part_kind kind;
    const ember_st_tensor *src;
    int bits;         /* quantized parts: the module's width */
    ember_dtype sdt;  /* quantized parts: dtype of scales / biases */
} plan_entry;

typedef struct qctx {
    const ember_mlx_qopts *o;
    const plan_entry *plan;
    ember_pool *pool;
    float *scratch; /* per thread, K floats each */
    size_t scratch_k;
    const ember_st_tensor *cur; /* the module held below, or NULL */
    unsigned char *packed, *scales, *biases;
} qctx;

typedef struct row_job {
    const qctx *q;
    const plan_entry *e;
    int64_t K;
    size_t packed_row, sb_row;
} row_job;

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
    const ember_st_tensor *t = j->e->src;
    const int bits = j->e->bits, G = q->o->group_size;
    const size_t esz = ember_dtype_get(t->dtype)->block_bytes, ssz = ember_dtype_get(j->e->sdt)->block_bytes;
    float *x = q->scratch + (size_t)thread * q->scratch_k;
    ember_dequantize(t->dtype, t->data + (size_t)row * (size_t)j->K * esz, x, (size_t)j->K, NULL);
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
    if (q->cur == e->src) return EMBER_OK;
    free(q->packed);
    free(q->scales);
    free(q->biases);
    q->packed = q->scales = q->biases = NULL;
    q->cur = NULL;
    const ember_st_tensor *t = e->src;
    int64_t N = t->shape[0], K = t->shape[1];
    row_job j = {q, e, K, (size_t)K * (size_t)e->bits / 8,
                 (size_t)(K / q->o->group_size) * ember_dtype_get(e->sdt)->block_bytes};
    q->packed = ember_malloc((size_t)N * j.packed_row + 1);
    q->scales = ember_malloc((size_t)N * j.sb_row + 1);
    q->biases = ember_malloc((size_t)N * j.sb_row + 1);
    if (!q->packed || !q->scales || !q->biases) return ember_err(err, EMBER_ERR_NOMEM, "out of memory quantizing '%s'", t->name);
    ember_pool_run(q->pool, (int)N, row_task, &j);
    q->cur = t;
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
    plan_entry *plan = NULL;
    ember_st_out *outs = NULL;
    char **names = NULL;
    json_t *quant = NULL;
    int n = 0, cap = 0, rc = ember_config_load(in_dir, &cfg, err);
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
    if (cfg.n_experts) { /* the MLX loader reads only the dense modules' quantization (config.h) */
        rc = ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: MLX-quantizing a mixture-of-experts model (%s) is not supported yet",
                       in_dir, cfg.model_type);
        goto done;
    }
    if (strcmp(cfg.model_type, "gemma4_text") == 0) { /* its per-layer and fused expert tensors are not planned */
        rc = ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: MLX-quantizing %s is not supported yet", in_dir, cfg.model_type);
        goto done;
    }
    if ((rc = ember_weights_open(in_dir, &w, err))) goto done;
    if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) {
        rc = ember_err(err, EMBER_ERR_IO, "%s: cannot create: %s", out_dir, strerror(errno));
        goto done;
    }
    quant = qparams(o->group_size, o->bits);
    bool tied = cfg.tie_embeddings;
    size_t max_k = 1;
    for (int f = 0; f < w->n_files; f++) {
        for (int i = 0; i < w->files[f]->n_tensors; i++) {
            const ember_st_tensor *t = &w->files[f]->tensors[i];
            if ((tied && strcmp(t->name, "lm_head.weight") == 0) || ends_with(t->name, "rotary_emb.inv_freq")) continue;
            if (n + 3 > cap) {
                cap = cap ? 2 * cap : 256;
                plan_entry *np = ember_realloc(plan, (size_t)cap * sizeof *np);
                if (!np) {
                    rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
                    goto done;
                }
                plan = np;
            }
            bool is_float = t->dtype == EMBER_F32 || t->dtype == EMBER_F16 || t->dtype == EMBER_BF16;
            if (t->ndim == 2 && is_float && ends_with(t->name, ".weight") && t->shape[0] > 0 && t->shape[0] < INT32_MAX &&
                t->shape[1] > 0 && t->shape[1] % o->group_size == 0) {
                char module[256];
                snprintf(module, sizeof module, "%.*s", (int)(strlen(t->name) - 7), t->name);
                int bits = o->high_bits && more_bits(module, cfg.n_layers) ? o->high_bits : o->bits;
                ember_dtype sdt = o->scale_dtype != EMBER_DTYPE_INVALID ? o->scale_dtype : t->dtype;
                for (int p = PART_W; p <= PART_B; p++) plan[n++] = (plan_entry){(part_kind)p, t, bits, sdt};
                if (o->high_bits) json_object_set_new(quant, module, qparams(o->group_size, bits));
                if ((size_t)t->shape[1] > max_k) max_k = (size_t)t->shape[1];
            } else {
                plan[n++] = (plan_entry){PART_COPY, t, 0, EMBER_DTYPE_INVALID};
            }
        }
    }
    outs = ember_calloc((size_t)(n ? n : 1), sizeof *outs);
    names = ember_calloc((size_t)(n ? n : 1), sizeof *names);
    pool = ember_pool_new(ember_cpu_count(), err);
    if (!pool) {
        rc = err ? err->code : EMBER_ERR_NOMEM;
        goto done;
    }
    q = (qctx){o, plan, pool, NULL, max_k, NULL, NULL, NULL, NULL};
    q.scratch = ember_malloc((size_t)ember_pool_size(pool) * max_k * sizeof(float));
    if (!outs || !names || !q.scratch) {
        rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        const plan_entry *e = &plan[i];
        const ember_st_tensor *t = e->src;
        ember_st_out *so = &outs[i];
        if (e->kind == PART_COPY) {
            so->name = t->name;
            so->dtype = t->dtype;
            so->ndim = t->ndim;
            memcpy(so->shape, t->shape, sizeof so->shape);
            continue;
        }
        static const char *const suffix[] = {"", "weight", "scales", "biases"};
        size_t len = strlen(t->name) - 6; /* keeps the '.' */
        if (!(names[i] = ember_malloc(len + 8))) {
            rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
            goto done;
        }
        snprintf(names[i], len + 8, "%.*s%s", (int)len, t->name, suffix[e->kind]);
        so->name = names[i];
        so->ndim = 2;
        so->shape[0] = t->shape[0];
        so->dtype = e->kind == PART_W ? EMBER_U32 : e->sdt;
        so->shape[1] = e->kind == PART_W ? t->shape[1] * e->bits / 32 : t->shape[1] / o->group_size;
    }
    char *st_path = ember_path_join(out_dir, "model.safetensors");
    if (!st_path) {
        rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        goto done;
    }
    rc = ember_st_write(st_path, outs, n, fill, &q, err);
    free(st_path);
    if (!rc) rc = write_config(in_dir, out_dir, quant, err);
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
    for (int i = 0; names && i < n; i++) free(names[i]);
    free(names);
    free(outs);
    free(plan);
    json_decref(quant);
    ember_pool_free(pool);
    ember_weights_free(w);
    return rc;
}
