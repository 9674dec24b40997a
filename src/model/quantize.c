/*
 * quantize.c - see quantize.h. Reads every weight of a safetensors model,
 * converts it to f32, permutes llama Q/K rows (and applies the other
 * families' converter transforms: gemma norms + 1, the hybrids', gemma4's
 * keys and rope_freqs), encodes each tensor in the
 * type its scheme picks (formats/quant.h encoders, rows split over a
 * worker pool) and writes one GGUF file.
 *
 * Ownership: everything allocated here is freed before returning; the
 * GGUF writer owns tensor buffers once added. Called from one thread; the
 * pool's workers only encode disjoint row ranges.
 */
#include "quantize.h"
#include "tok_export.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu.h"
#include "core/threadpool.h"
#include "core/alloc.h"
#include "core/util.h"
#include "formats/arch.h"
#include "formats/config.h"
#include "formats/gguf_write.h"
#include "formats/quant.h"
#include "formats/weights.h"
#include "model.h"
#include "rope.h"

bool ember_qscheme_parse(const char *name, ember_qscheme *out) {
    if (strcmp(name, "f32") == 0) *out = EMBER_QSCHEME_F32;
    else if (strcmp(name, "q8_0") == 0) *out = EMBER_QSCHEME_Q8_0;
    else if (strcmp(name, "q4_0") == 0) *out = EMBER_QSCHEME_Q4_0;
    else if (strcmp(name, "q4_k_m") == 0) *out = EMBER_QSCHEME_Q4_K_M;
    else if (strcmp(name, "bf16") == 0) *out = EMBER_QSCHEME_BF16;
    else if (strcmp(name, "f16") == 0) *out = EMBER_QSCHEME_F16;
    else return false;
    return true;
}

static bool more_bits(int i, int n) {
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

ember_dtype ember_qscheme_type(ember_qscheme s, const char *name, int ndim, int64_t row_len, int layer, int n_layers,
                               bool tied) {
    if (ndim < 2 || s == EMBER_QSCHEME_F32) return EMBER_F32;
    /* kept in f32 as llama.cpp does: the hybrids' conv kernels, the routers and the shared experts' gates */
    if (ends_with(name, "ssm_conv1d.weight") || ends_with(name, "ffn_gate_inp.weight") ||
        ends_with(name, "ffn_gate_inp_shexp.weight"))
        return EMBER_F32;
    if (s == EMBER_QSCHEME_BF16) return EMBER_BF16;
    if (s == EMBER_QSCHEME_F16) return EMBER_F16;
    ember_dtype base = s == EMBER_QSCHEME_Q8_0 ? EMBER_Q8_0 : s == EMBER_QSCHEME_Q4_0 ? EMBER_Q4_0 : EMBER_Q4_K;
    ember_dtype t = base;
    if (strcmp(name, "output.weight") == 0 || (tied && strcmp(name, "token_embd.weight") == 0)) {
        if (s == EMBER_QSCHEME_Q8_0 || row_len % (int64_t)ember_dtype_get(base)->block_elems) t = EMBER_Q8_0;
        else t = EMBER_Q6_K;
    } else if (s == EMBER_QSCHEME_Q4_K_M && (ends_with(name, "attn_v.weight") || ends_with(name, "ffn_down.weight") ||
                                             ends_with(name, "ffn_down_exps.weight") ||
                                             ends_with(name, "ffn_down_shexp.weight"))) { /* llama.cpp: any ffn_down */
        if (more_bits(layer, n_layers)) t = EMBER_Q6_K;
    }
    if (row_len % 256) {
        if (t == EMBER_Q4_K) t = EMBER_Q5_0;
        else if (t == EMBER_Q5_K) t = EMBER_Q5_1;
        else if (t == EMBER_Q6_K) t = EMBER_Q8_0;
    }
    if (row_len % (int64_t)ember_dtype_get(t)->block_elems) t = EMBER_F16;
    return t;
}

/* ---- fast K-quant encoders ------------------------------------------------
   formats/quant.h's K encoders search hard for the best scales (tens of
   roundings per element), too slow for billion-weight models. These do a
   min/max fit plus two least-squares refinements per sub-block; the blocks
   are valid Q4_K / Q5_K / Q6_K and are read back by the exact decoders. */

static inline int clampi(int v, int lo, int hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

/* x ~ a * q - b, q in [0, nmax], a, b >= 0; returns a, *b_out = b. */
static float fast_affine(const float *x, int n, int nmax, float *b_out) {
    float lo = 0.0f, hi = 0.0f;
    for (int i = 0; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
    }
    float a = (hi - lo) / (float)nmax, b = -lo;
    if (!(a > 0.0f) || !isfinite(a)) {
        *b_out = isfinite(b) ? b : 0.0f;
        return 0.0f;
    }
    float best_a = a, best_b = b, best_e = INFINITY;
    for (int it = 0; it < 3; it++) {
        double sq = 0, sx = 0, sqq = 0, sqx = 0, e = 0;
        for (int i = 0; i < n; i++) {
            int q = clampi((int)lrintf((x[i] + b) / a), 0, nmax);
            double r = (double)a * q - b - x[i];
            e += r * r;
            sq += q;
            sx += x[i];
            sqq += (double)q * q;
            sqx += (double)q * x[i];
        }
        if (e < best_e) {
            best_e = (float)e;
            best_a = a;
            best_b = b;
        }
        double den = n * sqq - sq * sq;
        if (den <= 0) break;
        double na = (n * sqx - sq * sx) / den, nb = (na * sq - sx) / n;
        if (!(na > 0) || nb < 0) break;
        a = (float)na;
        b = (float)nb;
    }
    *b_out = best_b;
    return best_a;
}

/* One Q4_K (nmax 15) or Q5_K (nmax 31) block from 256 floats. */
static void fast_k45(const float *x, int nmax, unsigned char *blk) {
    float a[8], b[8], amax = 0, bmax = 0;
    for (int j = 0; j < 8; j++) {
        a[j] = fast_affine(x + 32 * j, 32, nmax, &b[j]);
        amax = fmaxf(amax, a[j]);
        bmax = fmaxf(bmax, b[j]);
    }
    uint16_t dh = ember_f32_to_f16(amax / 63.0f), mh = ember_f32_to_f16(bmax / 63.0f);
    float d = ember_f16_to_f32(dh), dm = ember_f16_to_f32(mh);
    uint8_t sc[8], mn[8]; /* 0..63 */
    for (int j = 0; j < 8; j++) {
        sc[j] = (uint8_t)(d > 0 ? clampi((int)lrintf(a[j] / d), 0, 63) : 0);
        mn[j] = (uint8_t)(dm > 0 ? clampi((int)lrintf(b[j] / dm), 0, 63) : 0);
    }
    uint8_t q[256];
    for (int e = 0; e < 256; e++) {
        int j = e / 32;
        float a1 = d * (float)sc[j], b1 = dm * (float)mn[j];
        q[e] = (uint8_t)(a1 > 0 ? clampi((int)lrintf((x[e] + b1) / a1), 0, nmax) : 0);
    }
    memcpy(blk, &dh, 2);
    memcpy(blk + 2, &mh, 2);
    ember_q4k_pack_scales(blk + 4, sc, mn);
    unsigned char *qs = blk + (nmax == 15 ? 16 : 48);
    if (nmax == 31) memset(blk + 16, 0, 32);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            int lo = q[64 * c + l], hi = q[64 * c + 32 + l];
            qs[32 * c + l] = (uint8_t)((lo & 15) | ((hi & 15) << 4));
            if (nmax == 31) {
                blk[16 + l] |= (uint8_t)(((lo >> 4) & 1) << (2 * c));
                blk[16 + l] |= (uint8_t)(((hi >> 4) & 1) << (2 * c + 1));
            }
        }
}

/* One Q6_K block from 256 floats: 16 scales of 16 elements, q - 32 in
   [-32, 31]. */
static void fast_q6k(const float *x, unsigned char *blk) {
    float a[16], amax = 0;
    for (int j = 0; j < 16; j++) {
        float m = 0, mv = 0;
        for (int i = 0; i < 16; i++)
            if (fabsf(x[16 * j + i]) > m) {
                m = fabsf(x[16 * j + i]);
                mv = x[16 * j + i];
            }
        a[j] = mv / -32.0f; /* the largest magnitude lands on level -32 */
        amax = fmaxf(amax, fabsf(a[j]));
    }
    uint16_t dh = ember_f32_to_f16(amax / 127.0f);
    float d = ember_f16_to_f32(dh);
    int8_t sc[16];
    uint8_t q[256];
    for (int j = 0; j < 16; j++) sc[j] = (int8_t)(d > 0 ? clampi((int)lrintf(a[j] / d), -127, 127) : 0);
    for (int e = 0; e < 256; e++) {
        float a1 = d * (float)sc[e / 16];
        q[e] = (uint8_t)(a1 != 0 ? clampi((int)lrintf(x[e] / a1) + 32, 0, 63) : 32);
    }
    memset(blk, 0, 192);
    for (int e = 0; e < 256; e++) {
        int n = e / 128, r = e % 128, k = r / 32, l = r % 32;
        unsigned char *lb = blk + 64 * n + l + 32 * (k % 2);
        *lb |= (uint8_t)(k < 2 ? (q[e] & 15) : ((q[e] & 15) << 4));
        blk[128 + 32 * n + l] |= (uint8_t)((q[e] >> 4) << (2 * k));
    }
    memcpy(blk + 192, sc, 16);
    memcpy(blk + 208, &dh, 2);
}

/* Encodes one row: the fast K encoders, formats/quant.h for the rest. */
static void encode_row(ember_dtype t, const float *x, unsigned char *dst, int64_t K) {
    const ember_dtype_info *di = ember_dtype_get(t);
    if (t == EMBER_Q4_K || t == EMBER_Q5_K || t == EMBER_Q6_K) {
        for (int64_t b = 0; b < K / 256; b++) {
            if (t == EMBER_Q6_K) fast_q6k(x + 256 * b, dst + (size_t)b * di->block_bytes);
            else fast_k45(x + 256 * b, t == EMBER_Q4_K ? 15 : 31, dst + (size_t)b * di->block_bytes);
        }
        return;
    }
    ember_quantize(t, x, dst, (size_t)K, NULL);
}

typedef struct enc_job {
    ember_dtype t;
    const float *src;
    unsigned char *dst;
    int64_t rows, K;
    size_t row_bytes;
    int rows_per_task;
} enc_job;

static void enc_task(void *ctx, int task, int thread) {
    (void)thread;
    const enc_job *j = ctx;
    int64_t r0 = (int64_t)task * j->rows_per_task, r1 = r0 + j->rows_per_task < j->rows ? r0 + j->rows_per_task : j->rows;
    for (int64_t r = r0; r < r1; r++)
        encode_row(j->t, j->src + r * j->K, j->dst + (size_t)r * j->row_bytes, j->K);
}

/* llama.cpp's permutation of llama Q/K rows for interleaved RoPE: within
   each head of hd rows, new row 2i + j takes old row j * hd / 2 + i. */
static int permute_rows(float *w, int64_t rows, int64_t cols, int heads, ember_error *err) {
    if (heads < 1 || rows % heads || (rows / heads) % 2)
        return ember_err(err, EMBER_ERR_FORMAT, "cannot permute %lld rows into %d heads", (long long)rows, heads);
    int64_t hd = rows / heads;
    float *tmp = ember_malloc((size_t)(hd * cols) * sizeof *tmp);
    if (!tmp) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    for (int h = 0; h < heads; h++) {
        float *head = w + (size_t)(h * hd * cols);
        memcpy(tmp, head, (size_t)(hd * cols) * sizeof *tmp);
        for (int64_t i = 0; i < hd / 2; i++)
            for (int j = 0; j < 2; j++)
                memcpy(head + (size_t)((2 * i + j) * cols), tmp + (size_t)((j * hd / 2 + i) * cols),
                       (size_t)cols * sizeof *tmp);
    }
    free(tmp);
    return EMBER_OK;
}

/* gemma2 / gemma3 keys, read back by gguf_model.c: soft-capping, the
   sliding window and (when the layers follow no period of llama.cpp's) one
   flag per layer, the attention scale when it differs from llama.cpp's
   rule, gemma3's RoPE base of the sliding layers. */
static int write_gemma(ember_gguf_writer *g, const ember_model_config *c, const char *arch, ember_error *err) {
    char k[128];
    int rc, window = 0;
    const bool g2 = strcmp(arch, "gemma2") == 0;
#define KEY(x) (snprintf(k, sizeof k, "%s.%s", arch, x), k)
    if ((rc = ember_gguf_set_f32(g, KEY("attn_logit_softcapping"), c->attn_softcap, err)) ||
        (rc = ember_gguf_set_f32(g, KEY("final_logit_softcapping"), c->final_softcap, err)))
        return rc;
    const int period = g2 ? 2 : 6;
    bool periodic = true;
    bool *flags = ember_malloc((size_t)c->n_layers * sizeof *flags);
    if (!flags) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    for (int i = 0; i < c->n_layers; i++) {
        flags[i] = c->layer_window[i] > 0;
        if (flags[i] && window && c->layer_window[i] != window) {
            free(flags);
            return ember_err(err, EMBER_ERR_UNSUPPORTED, "GGUF holds one sliding window; the layers have several");
        }
        if (flags[i]) window = c->layer_window[i];
        periodic &= flags[i] == ((i + 1) % period != 0);
    }
    if (window > 0) {
        rc = ember_gguf_set_u32(g, KEY("attention.sliding_window"), (uint32_t)window, err);
        if (!rc && !periodic)
            rc = ember_gguf_set_bools(g, KEY("attention.sliding_window_pattern"), flags, (size_t)c->n_layers, err);
    }
    free(flags);
    if (rc) return rc;
    const bool big = c->n_layers == (g2 ? 46 : 62); /* llama.cpp's 27B rule */
    const float qpas_default = big ? (float)(c->hidden_size / c->n_heads) : (float)c->head_dim;
    if (c->query_pre_attn_scalar != qpas_default &&
        (rc = ember_gguf_set_f32(g, KEY("attention.scale"), (float)pow(c->query_pre_attn_scalar, -0.5), err)))
        return rc;
    if (!g2 && (rc = ember_gguf_set_f32(g, KEY("rope.freq_base_swa"), (float)c->rope_local.theta, err))) return rc;
#undef KEY
    return EMBER_OK;
}

/* The hybrids' keys as llama.cpp's converter writes them (qwen3next,
   qwen35, qwen35moe), read back by gguf_model.c: the DeltaNet sizes, which
   layers are recurrent, Qwen3.5's M-RoPE sections, the experts. */
static int write_hybrid(ember_gguf_writer *g, const ember_model_config *c, const char *arch, int n_rot,
                        ember_error *err) {
    char k[128];
    int rc;
#define KEY(x) (snprintf(k, sizeof k, "%s.%s", arch, x), k)
    if ((rc = ember_gguf_set_u32(g, KEY("ssm.conv_kernel"), (uint32_t)c->lin_conv_k, err)) ||
        (rc = ember_gguf_set_u32(g, KEY("ssm.state_size"), (uint32_t)c->lin_k_dim, err)) ||
        (rc = ember_gguf_set_u32(g, KEY("ssm.group_count"), (uint32_t)c->lin_k_heads, err)) ||
        (rc = ember_gguf_set_u32(g, KEY("ssm.time_step_rank"), (uint32_t)c->lin_v_heads, err)) ||
        (rc = ember_gguf_set_u32(g, KEY("ssm.inner_size"), (uint32_t)(c->lin_v_dim * c->lin_v_heads), err)))
        return rc;
    int interval = 0; /* every interval-th layer full attention? (the first full layer sets it) */
    for (int l = 0; l < c->n_layers && !interval; l++)
        if (!c->layer_linear[l]) interval = l + 1;
    bool periodic = interval > 0;
    for (int l = 0; l < c->n_layers && periodic; l++) periodic = c->layer_linear[l] == ((l + 1) % interval != 0);
    if (periodic) {
        if ((rc = ember_gguf_set_u32(g, KEY("full_attention_interval"), (uint32_t)interval, err))) return rc;
    } else {
        bool flags[EMBER_MAX_LAYERS];
        for (int l = 0; l < c->n_layers; l++) flags[l] = c->layer_linear[l];
        if ((rc = ember_gguf_set_bools(g, KEY("attention.recurrent_layers"), flags, (size_t)c->n_layers, err)))
            return rc;
    }
    if (strcmp(arch, "qwen3next") != 0) { /* llama.cpp requires the sections for qwen35 / qwen35moe */
        int32_t sec[4] = {0, 0, 0, 0};
        if (c->n_mrope) {
            for (int i = 0; i < c->n_mrope && i < 4; i++) sec[i] = c->mrope_section[i];
        } else { /* text positions: any split of the rotated pairs is plain RoPE; Qwen3.5's proportions */
            sec[0] = sec[1] = (int32_t)(n_rot / 2 * 11 / 32);
            sec[2] = (int32_t)(n_rot / 2) - 2 * sec[0];
        }
        if ((rc = ember_gguf_set_i32s(g, KEY("rope.dimension_sections"), sec, 4, err))) return rc;
    }
    if (c->n_experts &&
        ((rc = ember_gguf_set_u32(g, KEY("expert_count"), (uint32_t)c->n_experts, err)) ||
         (rc = ember_gguf_set_u32(g, KEY("expert_used_count"), (uint32_t)c->n_experts_used, err)) ||
         (rc = ember_gguf_set_u32(g, KEY("expert_feed_forward_length"), (uint32_t)c->moe_intermediate_size, err)) ||
         (rc = ember_gguf_set_u32(g, KEY("expert_shared_feed_forward_length"), (uint32_t)c->shared_expert_size, err))))
        return rc;
#undef KEY
    return EMBER_OK;
}

/* The qwen3moe / glm4moe keys as llama.cpp's converter writes them, read
   back by gguf_model.c: the experts, and for glm4moe the shared experts,
   the dense first layers and the sigmoid router's normalisation and scale.
   The MTP layers (glm4_moe's num_nextn_predict_layers) are not written: no
   nextn_predict_layers key, block_count the decoder's layers. */
static int write_moe(ember_gguf_writer *g, const ember_model_config *c, const char *arch, ember_error *err) {
    char k[128];
    int rc, dense = 0;
#define KEY(x) (snprintf(k, sizeof k, "%s.%s", arch, x), k)
    while (dense < c->n_layers && !c->layer_moe[dense]) dense++;
    if ((rc = ember_gguf_set_u32(g, KEY("expert_count"), (uint32_t)c->n_experts, err)) ||
        (rc = ember_gguf_set_u32(g, KEY("expert_used_count"), (uint32_t)c->n_experts_used, err)) ||
        (rc = ember_gguf_set_u32(g, KEY("expert_feed_forward_length"), (uint32_t)c->moe_intermediate_size, err)))
        return rc;
    if (strcmp(arch, "glm4moe") == 0 &&
        ((rc = ember_gguf_set_u32(g, KEY("expert_shared_count"), (uint32_t)c->n_shared_experts, err)) ||
         (rc = ember_gguf_set_u32(g, KEY("leading_dense_block_count"), (uint32_t)dense, err)) ||
         (rc = ember_gguf_set_u32(g, KEY("expert_gating_func"), 2, err)) || /* llama.cpp's sigmoid */
         (rc = ember_gguf_set_f32(g, KEY("expert_weights_scale"), c->routed_scale, err)) ||
         (rc = ember_gguf_set_bool(g, KEY("expert_weights_norm"), c->norm_topk_prob, err))))
        return rc;
#undef KEY
    return EMBER_OK;
}

/* What llama.cpp's qwen3moe / glm4moe cannot say: refused naming the field. */
static int moe_check(const char *in_dir, const ember_model_config *c, ember_error *err) {
    const bool glm = strcmp(c->model_type, "glm4_moe") == 0;
    bool dense_run = true; /* the dense layers must come first (glm4moe) or not be there (qwen3moe) */
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_moe[l]) dense_run = false;
        if (!c->layer_moe[l] && (!glm || !dense_run))
            return ember_err(err, EMBER_ERR_UNSUPPORTED,
                             "%s: layer %d is dense (%s); GGUF's %s has %s", in_dir, l,
                             glm ? "first_k_dense_replace" : "mlp_only_layers / decoder_sparse_step", c->model_type,
                             glm ? "its dense layers first" : "experts in every layer");
    }
    if (!glm && !c->norm_topk_prob)
        return ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: norm_topk_prob false; llama.cpp renormalises the top-k of %s",
                         in_dir, c->model_type);
    if (glm && c->topk_group < c->n_group)
        return ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: n_group %d / topk_group %d; GGUF's glm4moe has no expert groups",
                         in_dir, c->n_group, c->topk_group);
    return EMBER_OK;
}

/* What llama.cpp's layout cannot say about a hybrid: refused naming the field. */
static int hybrid_check(const char *in_dir, const ember_model_config *c, ember_error *err) {
    if (c->lin_k_dim != c->lin_v_dim)
        return ember_err(err, EMBER_ERR_UNSUPPORTED,
                         "%s: linear_key_head_dim %d differs from linear_value_head_dim %d, which GGUF's ssm.state_size "
                         "cannot hold", in_dir, c->lin_k_dim, c->lin_v_dim);
    if (c->attn_bias) return ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: attention_bias has no GGUF tensor for %s", in_dir, c->model_type);
    if (!c->n_experts) return EMBER_OK;
    for (int l = 0; l < c->n_layers; l++)
        if (!c->layer_moe[l])
            return ember_err(err, EMBER_ERR_UNSUPPORTED,
                             "%s: layer %d is dense (mlp_only_layers / decoder_sparse_step); GGUF's %s has experts in "
                             "every layer", in_dir, l, c->model_type);
    if (!c->norm_topk_prob)
        return ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: norm_topk_prob false; llama.cpp renormalises the top-k of %s",
                         in_dir, c->model_type);
    if (!c->shared_expert_size)
        return ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: shared_expert_intermediate_size 0; GGUF's %s has a shared expert",
                         in_dir, c->model_type);
    return EMBER_OK;
}

/* llama.cpp's order of a Qwen3.5 layer's value heads (its converter's
   reordering): Hv = Hk r heads of d rows (cols false) or d columns (cols
   true) starting at row / column `first`, from HF's grouped order (key
   head g's r heads together) to the tiled one: new head v Hk + g is old
   head g r + v. */
static int tile_heads(float *x, int64_t rows, int64_t row_len, int64_t first, int Hk, int r, int64_t d, bool cols,
                      ember_error *err) {
    const int64_t n = (int64_t)Hk * r * d, unit = cols ? 1 : row_len, len = cols ? rows : 1;
    const int64_t stride = cols ? row_len : 0;
    if (r <= 1) return EMBER_OK;
    float *tmp = ember_malloc((size_t)(n * unit) * sizeof *tmp + 1);
    if (!tmp) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    for (int64_t q = 0; q < len; q++) {
        float *base = x + q * stride + first * unit;
        memcpy(tmp, base, (size_t)(n * unit) * sizeof *tmp);
        for (int g = 0; g < Hk; g++)
            for (int v = 0; v < r; v++)
                memcpy(base + ((int64_t)v * Hk + g) * d * unit, tmp + ((int64_t)g * r + v) * d * unit,
                       (size_t)(d * unit) * sizeof *tmp);
    }
    free(tmp);
    return EMBER_OK;
}

/* The converter's transforms of one hybrid tensor (GGUF name gn, f32 x
   [rows, K]), in place: Gemma-style norms store 1 + w (not ssm_norm),
   ssm_a = -exp(A_log), and for qwen35 / qwen35moe the value heads tiled. */
static int hybrid_transform(const ember_model_config *c, const char *arch, const char *gn, float *x, int64_t rows,
                            int64_t K, ember_error *err) {
    const size_t n = (size_t)(rows * K);
    if (ends_with(gn, "norm.weight") && !ends_with(gn, "ssm_norm.weight"))
        for (size_t e = 0; e < n; e++) x[e] = 1.0f + x[e];
    if (ends_with(gn, ".ssm_a"))
        for (size_t e = 0; e < n; e++) x[e] = -expf(x[e]);
    if (strcmp(arch, "qwen3next") == 0) return EMBER_OK;
    const int Hk = c->lin_k_heads, r = c->lin_v_heads / c->lin_k_heads;
    const int64_t Dv = c->lin_v_dim, QK = 2 * (int64_t)Hk * c->lin_k_dim;
    if (ends_with(gn, "attn_qkv.weight") || ends_with(gn, "ssm_conv1d.weight"))
        return tile_heads(x, rows, K, QK, Hk, r, Dv, false, err);
    if (ends_with(gn, "attn_gate.weight")) return tile_heads(x, rows, K, 0, Hk, r, Dv, false, err);
    if (ends_with(gn, "ssm_beta.weight") || ends_with(gn, "ssm_alpha.weight"))
        return tile_heads(x, rows, K, 0, Hk, r, 1, false, err);
    if (ends_with(gn, ".ssm_a") || ends_with(gn, "ssm_dt.bias")) return tile_heads(x, 1, K, 0, Hk, r, 1, true, err);
    if (ends_with(gn, "ssm_out.weight")) return tile_heads(x, rows, K, 0, Hk, r, Dv, true, err);
    return EMBER_OK;
}

/* Encodes x [rows, K] (freed here) in the scheme's type for gn and adds it
   with shape (ndim 1: [K]; 2: [rows, K]; 3: [E, rows / E, K]). */
static int emit(ember_gguf_writer *g, ember_pool *pool, ember_qscheme s, const char *gn, float *x, int ndim,
                const int64_t *shape, int n_layers, bool tied, ember_error *err) {
    const int64_t K = shape[ndim - 1];
    int64_t rows = 1;
    for (int i = 0; i < ndim - 1; i++) rows *= shape[i];
    int layer = -1;
    sscanf(gn, "blk.%d.", &layer);
    ember_dtype qt = ember_qscheme_type(s, gn, ndim, K, layer, n_layers, tied);
    size_t bytes = 0;
    void *q = NULL;
    if (!ember_dtype_nbytes(qt, (size_t)(rows * K), &bytes) || !(q = ember_malloc(bytes + 1))) {
        free(x);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    }
    enc_job j = {qt, x, q, rows, K, bytes / (size_t)rows, 16};
    ember_pool_run(pool, (int)((rows + 15) / 16), enc_task, &j);
    free(x);
    return ember_gguf_add_tensor(g, gn, qt, ndim, shape, q, err);
}

/* A float tensor of the model into dst as f32, its shape and dtype checked. */
static int read_f32(const ember_weights *w, const char *in_dir, const char *name, int ndim, const int64_t *shape,
                    float *dst, ember_error *err) {
    const ember_st_tensor *t = ember_weights_find(w, name, NULL);
    if (!t) return ember_err(err, EMBER_ERR_FORMAT, "%s: missing tensor '%s'", in_dir, name);
    bool same = t->ndim == ndim && ember_can_dequantize(t->dtype);
    size_t n = 1;
    for (int i = 0; same && i < ndim; i++) {
        same = t->shape[i] == shape[i];
        n *= (size_t)shape[i];
    }
    if (!same) return ember_err(err, EMBER_ERR_FORMAT, "%s: tensor '%s' has an unexpected shape or dtype", in_dir, name);
    return ember_dequantize(t->dtype, t->data, dst, n, err);
}

/* Layer l's experts stacked as llama.cpp stores them: blk.l.ffn_{gate,up,down}_exps [E, rows, cols]. */
static int write_experts(ember_gguf_writer *g, ember_pool *pool, ember_qscheme s, const ember_weights *w,
                         const char *in_dir, const ember_model_config *c, int l, bool tied, ember_error *err) {
    static const char *const hf[3] = {"gate_proj", "up_proj", "down_proj"}, *const gg[3] = {"gate", "up", "down"};
    const int E = c->n_experts;
    const int64_t H = c->hidden_size, Im = c->moe_intermediate_size;
    for (int p = 0; p < 3; p++) {
        const int64_t rows = p < 2 ? Im : H, K = p < 2 ? H : Im, per = rows * K;
        float *x = ember_malloc((size_t)(E * per) * sizeof *x + 1);
        if (!x) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        char name[160], gn[96];
        int rc = EMBER_OK;
        for (int e = 0; e < E && !rc; e++) {
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.%s.weight", l, e, hf[p]);
            rc = read_f32(w, in_dir, name, 2, (const int64_t[]){rows, K}, x + (size_t)(e * per), err);
        }
        if (rc) {
            free(x);
            return rc;
        }
        snprintf(gn, sizeof gn, "blk.%d.ffn_%s_exps.weight", l, gg[p]);
        if ((rc = emit(g, pool, s, gn, x, 3, (const int64_t[]){E, rows, K}, c->n_layers, tied, err))) return rc;
    }
    return EMBER_OK;
}

/* qwen3_next's fused in_proj_qkvz of layer l split as llama.cpp's converter
   does: per key head q, k, v, z -> attn_qkv (all q, all k, all v) and
   attn_gate (all z). */
static int write_qkvz(ember_gguf_writer *g, ember_pool *pool, ember_qscheme s, const ember_weights *w,
                      const char *in_dir, const ember_model_config *c, int l, bool tied, ember_error *err) {
    const int64_t H = c->hidden_size, Hk = c->lin_k_heads, Dk = c->lin_k_dim, r = c->lin_v_heads / c->lin_k_heads,
                  Dv = c->lin_v_dim, W = 2 * Dk + 2 * r * Dv, rows = Hk * W, C = 2 * Hk * Dk + Hk * r * Dv,
                  Z = Hk * r * Dv;
    char name[160], gn[96];
    snprintf(name, sizeof name, "model.layers.%d.linear_attn.in_proj_qkvz.weight", l);
    float *all = ember_malloc((size_t)(rows * H) * sizeof *all + 1), *qkv = ember_malloc((size_t)(C * H) * sizeof *qkv + 1),
          *z = ember_malloc((size_t)(Z * H) * sizeof *z + 1);
    int rc = !all || !qkv || !z ? ember_err(err, EMBER_ERR_NOMEM, "out of memory")
                                : read_f32(w, in_dir, name, 2, (const int64_t[]){rows, H}, all, err);
    if (!rc) {
        const size_t rb = (size_t)H * sizeof *all;
        int64_t j = 0;
        for (int64_t part = 0; part < 3; part++) /* q, k, v */
            for (int64_t hk = 0; hk < Hk; hk++) {
                const int64_t off = part == 0 ? 0 : part == 1 ? Dk : 2 * Dk, len = part < 2 ? Dk : r * Dv;
                memcpy(qkv + j * H, all + (hk * W + off) * H, (size_t)len * rb);
                j += len;
            }
        for (int64_t hk = 0; hk < Hk; hk++)
            memcpy(z + hk * r * Dv * H, all + (hk * W + 2 * Dk + r * Dv) * H, (size_t)(r * Dv) * rb);
    }
    free(all);
    if (rc) {
        free(qkv);
        free(z);
        return rc;
    }
    snprintf(gn, sizeof gn, "blk.%d.attn_qkv.weight", l);
    rc = emit(g, pool, s, gn, qkv, 2, (const int64_t[]){C, H}, c->n_layers, tied, err);
    snprintf(gn, sizeof gn, "blk.%d.attn_gate.weight", l);
    if (!rc) return emit(g, pool, s, gn, z, 2, (const int64_t[]){Z, H}, c->n_layers, tied, err);
    free(z);
    return rc;
}

/* The head size of gemma4's full-attention layers (kind false) or sliding
   layers (kind true): the first such layer's, head_dim when there is none. */
static int g4_head_dim(const ember_model_config *c, bool sliding) {
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer_sliding[l] == sliding) return ember_cfg_head_dim(c, l);
    return c->head_dim;
}

/* What llama.cpp's gemma4 cannot say about a gemma4_text model: refused
   naming the field. */
static int gemma4_check(const char *in_dir, const ember_model_config *c, ember_error *err) {
    int window = 0;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_sliding[l] && window && c->layer_window[l] != window)
            return ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: the sliding layers have several windows; GGUF holds one",
                             in_dir);
        if (c->layer_sliding[l]) window = c->layer_window[l];
    }
    const ember_rope_config *r = &c->rope, *lr = &c->rope_local;
    if (!(r->type == EMBER_ROPE_PROPORTIONAL || (r->type == EMBER_ROPE_DEFAULT && r->partial_rotary_factor == 1.0)))
        return ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: rope_parameters.full_attention: GGUF's gemma4 holds "
                         "proportional RoPE (or default over the whole head) only", in_dir);
    if (lr->type != EMBER_ROPE_DEFAULT)
        return ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: rope_parameters.sliding_attention: GGUF's gemma4 holds "
                         "default RoPE only", in_dir);
    if (c->attn_softcap != 0)
        return ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: attention soft-capping has no GGUF key for gemma4", in_dir);
    return EMBER_OK;
}

/* The gemma4 keys as llama.cpp's converter writes them, read back by
   gguf_model.c: one flag per layer for the sliding layers, the head sizes
   of both kinds (key_length the full layers'), KV heads and MLP widths as
   one value or one per layer, KV sharing, the per-layer inputs' width,
   the RoPE of the sliding layers, soft-capping and the experts. */
static int write_gemma4(ember_gguf_writer *g, const ember_model_config *c, const char *arch, ember_error *err) {
    char k[128];
    int rc, window = 0;
    const int L = c->n_layers, Dg = g4_head_dim(c, false), Ds = g4_head_dim(c, true);
    bool flags[EMBER_MAX_LAYERS], kv_same = true, ff_same = true;
    int32_t kv[EMBER_MAX_LAYERS], ff[EMBER_MAX_LAYERS];
    for (int l = 0; l < L; l++) {
        flags[l] = c->layer_sliding[l];
        if (flags[l]) window = c->layer_window[l];
        kv[l] = ember_cfg_kv_heads(c, l);
        ff[l] = ember_cfg_intermediate(c, l);
        kv_same &= kv[l] == kv[0];
        ff_same &= ff[l] == ff[0];
    }
    int rot_swa = (int)(Ds * c->rope_local.partial_rotary_factor);
    rot_swa -= rot_swa % 2;
#define KEY(x) (snprintf(k, sizeof k, "%s.%s", arch, x), k)
    if ((rc = ember_gguf_set_bools(g, KEY("attention.sliding_window_pattern"), flags, (size_t)L, err)) ||
        (window > 0 && (rc = ember_gguf_set_u32(g, KEY("attention.sliding_window"), (uint32_t)window, err))) ||
        (rc = ember_gguf_set_u32(g, KEY("attention.key_length"), (uint32_t)Dg, err)) ||
        (rc = ember_gguf_set_u32(g, KEY("attention.value_length"), (uint32_t)Dg, err)) ||
        (rc = ember_gguf_set_u32(g, KEY("attention.key_length_swa"), (uint32_t)Ds, err)) ||
        (rc = ember_gguf_set_u32(g, KEY("attention.value_length_swa"), (uint32_t)Ds, err)) ||
        (rc = kv_same ? ember_gguf_set_u32(g, KEY("attention.head_count_kv"), (uint32_t)kv[0], err)
                      : ember_gguf_set_i32s(g, KEY("attention.head_count_kv"), kv, (size_t)L, err)) ||
        (rc = ff_same ? ember_gguf_set_u32(g, KEY("feed_forward_length"), (uint32_t)ff[0], err)
                      : ember_gguf_set_i32s(g, KEY("feed_forward_length"), ff, (size_t)L, err)) ||
        (rc = ember_gguf_set_u32(g, KEY("attention.shared_kv_layers"), (uint32_t)c->n_kv_shared, err)) ||
        (rc = ember_gguf_set_u32(g, KEY("embedding_length_per_layer_input"), (uint32_t)c->ple_dim, err)) ||
        (rc = ember_gguf_set_u32(g, KEY("rope.dimension_count"), (uint32_t)Dg, err)) ||
        (rc = ember_gguf_set_u32(g, KEY("rope.dimension_count_swa"), (uint32_t)rot_swa, err)) ||
        (rc = ember_gguf_set_f32(g, KEY("rope.freq_base_swa"), (float)c->rope_local.theta, err)))
        return rc;
    if (c->final_softcap > 0 &&
        (rc = ember_gguf_set_f32(g, KEY("final_logit_softcapping"), c->final_softcap, err)))
        return rc;
    if (c->moe_beside_mlp &&
        ((rc = ember_gguf_set_u32(g, KEY("expert_count"), (uint32_t)c->n_experts, err)) ||
         (rc = ember_gguf_set_u32(g, KEY("expert_used_count"), (uint32_t)c->n_experts_used, err)) ||
         (rc = ember_gguf_set_u32(g, KEY("expert_feed_forward_length"), (uint32_t)c->moe_intermediate_size, err))))
        return rc;
#undef KEY
    return EMBER_OK;
}

/* gemma4's proportional RoPE as llama.cpp stores it (rope_freqs.weight,
   read on the full-attention layers only): per pair of the full layers'
   head, the divisor of its frequency, 1e30 for the pairs at rest. */
static int add_rope_freqs_g4(ember_gguf_writer *g, const ember_model_config *c, ember_error *err) {
    const int Dg = g4_head_dim(c, false), half = Dg / 2;
    const ember_rope_config *r = &c->rope;
    const int angles = r->type == EMBER_ROPE_PROPORTIONAL ? (int)floor(r->partial_rotary_factor * Dg / 2.0) : half;
    const float factor = r->type == EMBER_ROPE_PROPORTIONAL ? (float)r->factor : 1.0f;
    float *v = ember_malloc((size_t)half * sizeof *v + 1);
    if (!v) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    for (int i = 0; i < half; i++) v[i] = i < angles ? factor : 1e30f;
    return ember_gguf_add_tensor(g, "rope_freqs.weight", EMBER_F32, 1, (const int64_t[]){half}, v, err);
}

static int write_metadata(ember_gguf_writer *g, const char *in_dir, const ember_model_config *c, const char *arch, ember_qscheme s,
                          ember_error *err) {
    char k[128];
    int rc = 0;
#define KEY(x) (snprintf(k, sizeof k, "%s.%s", arch, x), k)
    /* llama.cpp's LLAMA_FTYPE_MOSTLY_{Q8_0, Q4_0, Q4_K_M}, LLAMA_FTYPE_ALL_F32, LLAMA_FTYPE_MOSTLY_{BF16, F16} */
    static const uint32_t k_ftype[] = {7, 2, 15, 0, 32, 1};
    int n_rot = (int)(c->head_dim * c->rope.partial_rotary_factor);
    n_rot -= n_rot % 2;
    const ember_arch *row = ember_arch_find(c->model_type);
    const bool g4 = row && row->family == EMBER_FAMILY_GEMMA4; /* per-layer shapes: write_gemma4 */
    if ((rc = ember_gguf_set_str(g, "general.architecture", arch, err)) ||
        (rc = ember_gguf_set_str(g, "general.name", "ember quantized model", err)) ||
        (rc = ember_gguf_set_u32(g, "general.file_type", k_ftype[s], err)) ||
        (rc = ember_gguf_set_u32(g, "general.quantization_version", 2, err)) ||
        (rc = ember_gguf_set_u32(g, KEY("context_length"), (uint32_t)c->max_pos, err)) ||
        (rc = ember_gguf_set_u32(g, KEY("embedding_length"), (uint32_t)c->hidden_size, err)) ||
        (rc = ember_gguf_set_u32(g, KEY("block_count"), (uint32_t)c->n_layers, err)) ||
        (rc = ember_gguf_set_u32(g, KEY("attention.head_count"), (uint32_t)c->n_heads, err)) ||
        (rc = ember_gguf_set_f32(g, KEY("attention.layer_norm_rms_epsilon"), c->rms_norm_eps, err)) ||
        (rc = ember_gguf_set_f32(g, KEY("rope.freq_base"), (float)c->rope.theta, err)) ||
        (rc = ember_gguf_set_u32(g, KEY("vocab_size"), (uint32_t)c->vocab_size, err)))
        return rc;
    if (!g4 &&
        ((rc = ember_gguf_set_u32(g, KEY("feed_forward_length"), (uint32_t)c->intermediate_size, err)) ||
         (rc = ember_gguf_set_u32(g, KEY("attention.head_count_kv"), (uint32_t)c->n_kv_heads, err)) ||
         (rc = ember_gguf_set_u32(g, KEY("attention.key_length"), (uint32_t)c->head_dim, err)) ||
         (rc = ember_gguf_set_u32(g, KEY("attention.value_length"), (uint32_t)c->head_dim, err)) ||
         (rc = ember_gguf_set_u32(g, KEY("rope.dimension_count"), (uint32_t)n_rot, err))))
        return rc;
    if (c->rope.type == EMBER_ROPE_LINEAR || c->rope.type == EMBER_ROPE_YARN) {
        if ((rc = ember_gguf_set_str(g, KEY("rope.scaling.type"), c->rope.type == EMBER_ROPE_LINEAR ? "linear" : "yarn", err)) ||
            (rc = ember_gguf_set_f32(g, KEY("rope.scaling.factor"), (float)c->rope.factor, err)) ||
            (rc = ember_gguf_set_u32(g, KEY("rope.scaling.original_context_length"), (uint32_t)c->rope.original_max_pos,
                                     err)))
            return rc;
    }
    if (g4) {
        if ((rc = write_gemma4(g, c, arch, err))) return rc;
    } else if (row && row->family == EMBER_FAMILY_HYBRID) {
        if ((rc = write_hybrid(g, c, arch, n_rot, err))) return rc;
    } else if (row && row->family == EMBER_FAMILY_QWEN3_MOE && (rc = write_moe(g, c, arch, err))) {
        return rc;
    } else if (ember_arch_is_gemma(c->model_type)) {
        if ((rc = write_gemma(g, c, arch, err))) return rc;
    } else {
        /* one sliding window for every layer (mistral, phi3): llama.cpp
           ignores the key for llama, Ember applies it */
        bool same = c->layer_window[0] > 0;
        for (int i = 1; i < c->n_layers; i++) same &= c->layer_window[i] == c->layer_window[0];
        if (same && (rc = ember_gguf_set_u32(g, KEY("attention.sliding_window"), (uint32_t)c->layer_window[0], err)))
            return rc;
    }
#undef KEY
    /* the model's own tokenizer when it has one we can write; otherwise
       llama.cpp's "none" vocabulary (dummy tokens of ARCH.vocab_size), plus
       the special ids Ember reads */
    ember_error terr = {0};
    if (in_dir && ember_gguf_write_tokenizer(g, in_dir, c->vocab_size, &terr) == EMBER_OK) return EMBER_OK;
    if (terr.code != EMBER_ERR_UNSUPPORTED && terr.code != EMBER_OK) return ember_err(err, terr.code, "%s", terr.msg);
    if ((rc = ember_gguf_set_str(g, "tokenizer.ggml.model", "none", err))) return rc;
    if (c->bos_id >= 0 && (rc = ember_gguf_set_u32(g, "tokenizer.ggml.bos_token_id", (uint32_t)c->bos_id, err)))
        return rc;
    if (c->n_eos > 0 && (rc = ember_gguf_set_u32(g, "tokenizer.ggml.eos_token_id", (uint32_t)c->eos_ids[0], err)))
        return rc;
    return EMBER_OK;
}

/* llama 3 scaling as llama.cpp stores it: per-dimension divisors of the
   default frequencies. */
static int add_rope_freqs(ember_gguf_writer *g, const ember_model_config *c, ember_error *err) {
    ember_rope_config def = c->rope;
    def.type = EMBER_ROPE_DEFAULT;
    int half = c->head_dim / 2 + 1, n_rot, n_rot2;
    float af, *a = ember_calloc((size_t)half, 4), *b = ember_calloc((size_t)half, 4);
    int rc = !a || !b ? ember_err(err, EMBER_ERR_NOMEM, "out of memory") : EMBER_OK;
    if (!rc) rc = ember_rope_freqs(&def, c->head_dim, a, &n_rot, &af, err);
    if (!rc) rc = ember_rope_freqs(&c->rope, c->head_dim, b, &n_rot2, &af, err);
    if (!rc) {
        for (int i = 0; i < n_rot / 2; i++) a[i] = a[i] / b[i];
        rc = ember_gguf_add_tensor(g, "rope_freqs.weight", EMBER_F32, 1, (const int64_t[]){n_rot / 2}, a, err);
        a = NULL;
    }
    free(a);
    free(b);
    return rc;
}

int ember_quantize_to_gguf(const char *in_dir, const char *out_path, ember_qscheme s, ember_error *err) {
    ember_model_config cfg;
    ember_weights *w = NULL;
    ember_gguf_writer *g = NULL;
    ember_pool *pool = NULL;
    int rc = ember_config_load(in_dir, &cfg, err);
    if (!rc && cfg.quant.bits) /* MLX-quantized input: its matrices are packed codes */
        rc = ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: the model is already quantized (MLX %d-bit); quantize the "
                       "F32 / F16 / BF16 original", in_dir, cfg.quant.bits);
    const bool hybrid = !rc && cfg.n_linear > 0;
    if (hybrid) rc = hybrid_check(in_dir, &cfg, err);
    const ember_arch *row = !rc ? ember_arch_find(cfg.model_type) : NULL; /* non-NULL: the config parser checked */
    const bool moe = row && row->family == EMBER_FAMILY_QWEN3_MOE;
    if (moe) rc = moe_check(in_dir, &cfg, err);
    if (!rc && cfg.text_of_multimodal) /* its tensors carry the wrapper's names (weights.h) */
        rc = ember_err(err, EMBER_ERR_UNSUPPORTED,
                       "%s: quantizing a multimodal checkpoint (%s inside text_config) is not supported yet", in_dir,
                       cfg.model_type);
    const bool g4 = row && row->family == EMBER_FAMILY_GEMMA4;
    if (!rc && g4) rc = gemma4_check(in_dir, &cfg, err);
    if (!rc) rc = ember_weights_open(in_dir, &w, err);
    if (rc) goto done;
    g = ember_gguf_writer_new();
    pool = ember_pool_new(ember_cpu_count(), err);
    if (!g || !pool) {
        rc = g ? (err ? err->code : EMBER_ERR_NOMEM) : ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        goto done;
    }
    bool llama = row && row->rope_interleaved;                /* Q/K rows permuted as llama.cpp does */
    bool gemma = row && row->family == EMBER_FAMILY_GEMMA;
    const char *arch = ember_gguf_arch_of(cfg.model_type);
    if ((rc = write_metadata(g, in_dir, &cfg, arch, s, err))) goto done;
    if (cfg.rope.type == EMBER_ROPE_LLAMA3 && (rc = add_rope_freqs(g, &cfg, err))) goto done;
    bool any_full = false;
    for (int l = 0; g4 && l < cfg.n_layers; l++) any_full |= !cfg.layer_sliding[l];
    if (any_full && (rc = add_rope_freqs_g4(g, &cfg, err))) goto done;
    bool tied = cfg.tie_embeddings || !ember_weights_find(w, "lm_head.weight", NULL);
    for (int f = 0; f < w->n_files && !rc; f++) {
        for (int i = 0; i < w->files[f]->n_tensors && !rc; i++) {
            const ember_st_tensor *t = &w->files[f]->tensors[i];
            char gn[128];
            int hl = -1, used = 0;
            if (sscanf(t->name, "model.layers.%d.%n", &hl, &used) == 1 && used > 0 && hl >= cfg.n_layers)
                continue; /* glm4_moe's MTP layers, after the decoder's: not written (write_moe) */
            if ((hybrid || moe) && used > 0) {
                if (hybrid && strcmp(t->name + used, "linear_attn.in_proj_qkvz.weight") == 0) { /* qwen3_next: split */
                    rc = write_qkvz(g, pool, s, w, in_dir, &cfg, hl, tied, err);
                    continue;
                }
                int e = -1, used2 = 0;
                if (sscanf(t->name + used, "mlp.experts.%d.%n", &e, &used2) == 1 && used2 > 0) {
                    if (e == 0 && strcmp(t->name + used + used2, "gate_proj.weight") == 0) /* the layer's once */
                        rc = write_experts(g, pool, s, w, in_dir, &cfg, hl, tied, err);
                    continue;
                }
            }
            if (!ember_gguf_tensor_name(cfg.model_type, t->name, gn, sizeof gn)) continue; /* e.g. rotary inv_freq */
            if (tied && strcmp(gn, "output.weight") == 0) continue;
            /* conv1d [C, 1, K]: the converter squeezes it to [C, K] */
            const bool conv = hybrid && t->ndim == 3 && t->shape[1] == 1 && ends_with(gn, "ssm_conv1d.weight");
            /* gemma4's fused experts [E, rows, cols], stored as they are (ffn_gate_up_exps: gate rows, then up) */
            const bool fused = g4 && t->ndim == 3 && (ends_with(gn, "ffn_gate_up_exps.weight") ||
                                                      ends_with(gn, "ffn_down_exps.weight"));
            if ((!conv && !fused && (t->ndim < 1 || t->ndim > 2)) || !ember_can_dequantize(t->dtype)) {
                rc = ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: tensor '%s' is not a 1-D or 2-D float tensor", in_dir,
                               t->name);
                break;
            }
            int64_t rows = t->ndim >= 2 ? t->shape[0] : 1, K = t->shape[t->ndim - 1];
            if (fused) rows *= t->shape[1];
            const int ndim = conv ? 2 : t->ndim;
            size_t n = (size_t)(rows * K);
            float *x = ember_malloc(n * sizeof *x + 1);
            if (!x) {
                rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
                break;
            }
            rc = ember_dequantize(t->dtype, t->data, x, n, err);
            int layer = -1;
            sscanf(gn, "blk.%d.", &layer);
            if (!rc && llama && t->ndim == 2 && (ends_with(gn, "attn_q.weight") || ends_with(gn, "attn_k.weight")))
                rc = permute_rows(x, rows, K, ends_with(gn, "attn_q.weight") ? cfg.n_heads : cfg.n_kv_heads, err);
            if (!rc && llama && t->ndim == 1 && (ends_with(gn, "attn_q.bias") || ends_with(gn, "attn_k.bias")))
                rc = permute_rows(x, K, 1, ends_with(gn, "attn_q.bias") ? cfg.n_heads : cfg.n_kv_heads, err);
            if (!rc && gemma && ends_with(gn, "norm.weight")) /* llama.cpp stores Gemma's 1 + w */
                for (size_t e = 0; e < n; e++) x[e] = 1.0f + x[e];
            if (!rc && hybrid) rc = hybrid_transform(&cfg, arch, gn, x, rows, K, err);
            ember_dtype qt = ember_qscheme_type(s, gn, ndim, K, layer, cfg.n_layers, tied);
            size_t bytes = 0;
            void *q = NULL;
            if (!rc && (!ember_dtype_nbytes(qt, n, &bytes) || !(q = ember_malloc(bytes + 1))))
                rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
            if (!rc) {
                enc_job j = {qt, x, q, rows, K, bytes / (size_t)rows, 16};
                ember_pool_run(pool, (int)((rows + 15) / 16), enc_task, &j);
                int64_t shape[2] = {rows, K};
                rc = ember_gguf_add_tensor(g, gn, qt, ndim, fused ? t->shape : ndim == 2 ? shape : shape + 1, q, err);
            } else {
                free(q);
            }
            free(x);
        }
    }
    if (!rc) rc = ember_gguf_write_file(g, out_path, err);
done:
    ember_pool_free(pool);
    ember_gguf_writer_free(g);
    ember_weights_free(w);
    return rc;
}
