/*
 * config.c - config.json / generation_config.json parsing; see config.h.
 *
 * Accepts both serialisations: the hub's (top-level rope_theta and
 * rope_scaling with "type" or "rope_type") and transformers 5's
 * (rope_parameters with rope_type / rope_theta / ..., dtype). Absent or
 * null optional fields take the defaults transformers uses for the family.
 */
#define _POSIX_C_SOURCE 200809L
#include "config.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/mapfile.h"
#include "formats/arch.h"
#include "core/jsonutil.h"
#include "core/util.h"

#define MAX_CONFIG_BYTES (16u * 1024u * 1024u)

/* Field readers: absent or null -> *out = def (or an error when required). */
static int get_int(const char *file, const json_t *o, const char *key, bool required, long long def,
                   long long lo, long long hi, int *out, ember_error *err) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required) return ember_err(err, EMBER_ERR_FORMAT, "%s: missing required field '%s'", file, key);
        *out = (int)def;
        return EMBER_OK;
    }
    if (!json_is_integer(v))
        return ember_err(err, EMBER_ERR_FORMAT, "%s: field '%s' must be an integer, got %s", file, key,
                         ember_json_type_bare(v));
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: field '%s' is %lld, outside [%lld, %lld]", file, key, x,
                         lo, hi);
    *out = (int)x;
    return EMBER_OK;
}

static int get_num(const char *file, const json_t *o, const char *key, bool required, double def,
                   double lo, double hi, double *out, ember_error *err) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required) return ember_err(err, EMBER_ERR_FORMAT, "%s: missing required field '%s'", file, key);
        *out = def;
        return EMBER_OK;
    }
    if (!json_is_number(v))
        return ember_err(err, EMBER_ERR_FORMAT, "%s: field '%s' must be a number, got %s", file, key, ember_json_type_bare(v));
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: field '%s' is %g, outside [%g, %g]", file, key, x, lo, hi);
    *out = x;
    return EMBER_OK;
}

static int get_bool(const char *file, const json_t *o, const char *key, bool def, bool *out,
                    ember_error *err) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return EMBER_OK;
    }
    if (!json_is_boolean(v))
        return ember_err(err, EMBER_ERR_FORMAT, "%s: field '%s' must be true or false, got %s", file, key,
                         ember_json_type_bare(v));
    *out = json_is_true(v);
    return EMBER_OK;
}

/* A string field; *out is NULL when absent or null. */
static int get_str(const char *file, const json_t *o, const char *key, const char **out, ember_error *err) {
    const json_t *v = json_object_get(o, key);
    *out = NULL;
    if (!v || json_is_null(v)) return EMBER_OK;
    if (!json_is_string(v))
        return ember_err(err, EMBER_ERR_FORMAT, "%s: field '%s' must be a string, got %s", file, key, ember_json_type_bare(v));
    *out = json_string_value(v);
    return EMBER_OK;
}

/* eos_token_id: an integer or an array of integers. */
static int get_eos(const char *file, const json_t *o, ember_model_config *cfg, ember_error *err) {
    const json_t *v = json_object_get(o, "eos_token_id");
    if (!v || json_is_null(v)) return EMBER_OK;
    if (json_is_integer(v)) {
        long long x = json_integer_value(v);
        if (x < 0 || x >= cfg->vocab_size)
            return ember_err(err, EMBER_ERR_FORMAT, "%s: eos_token_id %lld is outside the vocabulary", file, x);
        cfg->n_eos = 1;
        cfg->eos_ids[0] = (int)x;
        return EMBER_OK;
    }
    if (!json_is_array(v))
        return ember_err(err, EMBER_ERR_FORMAT, "%s: field 'eos_token_id' must be an integer or an array, got %s",
                         file, ember_json_type_bare(v));
    if (json_array_size(v) > EMBER_MAX_EOS)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: more than %d eos_token_id values", file, EMBER_MAX_EOS);
    cfg->n_eos = 0;
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= cfg->vocab_size)
            return ember_err(err, EMBER_ERR_FORMAT, "%s: eos_token_id[%zu] is not a token id of the vocabulary",
                             file, i);
        cfg->eos_ids[cfg->n_eos++] = (int)json_integer_value(e);
    }
    return EMBER_OK;
}

static int get_bos(const char *file, const json_t *o, ember_model_config *cfg, ember_error *err) {
    int bos;
    int rc = get_int(file, o, "bos_token_id", false, cfg->bos_id, -1, (long long)cfg->vocab_size - 1, &bos, err);
    if (!rc) cfg->bos_id = bos;
    return rc;
}

/* One RoPE from src (an object holding rope_type and its parameters, or
   NULL); rope_theta and partial_rotary_factor fall back to the top level. */
static int parse_rope_obj(const char *file, const json_t *root, const json_t *src, const ember_model_config *cfg,
                          ember_rope_config *r, ember_error *err) {
    int rc;
    memset(r, 0, sizeof *r);
    const json_t *theta_holder = src && json_object_get(src, "rope_theta") ? src : root;
    if ((rc = get_num(file, theta_holder, "rope_theta", false, 10000.0, 1e-3, 1e12, &r->theta, err))) return rc;
    const json_t *prf_holder = src && json_object_get(src, "partial_rotary_factor") ? src : root;
    if ((rc = get_num(file, prf_holder, "partial_rotary_factor", false, 1.0, 1e-6, 1.0, &r->partial_rotary_factor,
                      err)))
        return rc;
    r->type = EMBER_ROPE_DEFAULT;
    r->factor = 1.0;
    r->attention_factor = -1.0;
    r->truncate = true;
    r->original_max_pos = cfg->max_pos;
    if (!src) return EMBER_OK;
    const char *type = NULL;
    if ((rc = get_str(file, src, "rope_type", &type, err))) return rc;
    if (!type && (rc = get_str(file, src, "type", &type, err))) return rc;
    if (!type || strcmp(type, "default") == 0) return EMBER_OK;
    if (strcmp(type, "linear") == 0)
        r->type = EMBER_ROPE_LINEAR;
    else if (strcmp(type, "llama3") == 0)
        r->type = EMBER_ROPE_LLAMA3;
    else if (strcmp(type, "yarn") == 0)
        r->type = EMBER_ROPE_YARN;
    else if (strcmp(type, "proportional") == 0)
        r->type = EMBER_ROPE_PROPORTIONAL;
    else
        return ember_err(err, EMBER_ERR_UNSUPPORTED,
                         "%s: rope type '%.32s' is not supported (supported: default, linear, llama3, yarn, "
                         "proportional)",
                         file, type);
    if (r->type == EMBER_ROPE_PROPORTIONAL) /* gemma4: factor optional */
        return get_num(file, src, "factor", false, 1.0, 1e-6, 1e6, &r->factor, err);
    bool need_factor = r->type != EMBER_ROPE_YARN;
    if ((rc = get_num(file, src, "factor", need_factor, -1.0, 1e-6, 1e6, &r->factor, err))) return rc;
    if ((rc = get_int(file, src, "original_max_position_embeddings", false, cfg->max_pos, 1,
                      1 << 30, &r->original_max_pos, err)))
        return rc;
    if (r->type == EMBER_ROPE_LLAMA3) {
        if ((rc = get_num(file, src, "low_freq_factor", true, 0, 1e-6, 1e6, &r->low_freq_factor, err)) ||
            (rc = get_num(file, src, "high_freq_factor", true, 0, 1e-6, 1e6, &r->high_freq_factor, err)))
            return rc;
        if (r->high_freq_factor <= r->low_freq_factor)
            return ember_err(err, EMBER_ERR_FORMAT, "%s: rope high_freq_factor must exceed low_freq_factor", file);
    }
    if (r->type == EMBER_ROPE_YARN) {
        if (r->factor < 0) r->factor = (double)cfg->max_pos / (double)r->original_max_pos;
        if ((rc = get_num(file, src, "beta_fast", false, 32.0, 1e-6, 1e6, &r->beta_fast, err)) ||
            (rc = get_num(file, src, "beta_slow", false, 1.0, 1e-6, 1e6, &r->beta_slow, err)) ||
            (rc = get_num(file, src, "mscale", false, 0.0, 0.0, 1e6, &r->mscale, err)) ||
            (rc = get_num(file, src, "mscale_all_dim", false, 0.0, 0.0, 1e6, &r->mscale_all_dim, err)) ||
            (rc = get_num(file, src, "attention_factor", false, -1.0, 0.0, 1e6, &r->attention_factor, err)) ||
            (rc = get_bool(file, src, "truncate", true, &r->truncate, err)))
            return rc;
    }
    return EMBER_OK;
}

/*
 * cfg->rope (full-attention layers) and cfg->rope_local (sliding layers).
 * transformers 5 writes rope_parameters, either one object or one per layer
 * type ("full_attention", "sliding_attention"); the hub format has
 * top-level rope_theta and rope_scaling, and gemma3's rope_local_base_freq
 * for the sliding layers (default RoPE).
 */
static int parse_rope(const char *file, const json_t *root, ember_model_config *cfg, ember_error *err) {
    int rc;
    const json_t *rp = json_object_get(root, "rope_parameters");
    const json_t *rs = json_object_get(root, "rope_scaling");
    const json_t *src = NULL, *local = NULL; /* the objects holding the parameters */
    if (rp && !json_is_null(rp)) {
        if (!json_is_object(rp))
            return ember_err(err, EMBER_ERR_FORMAT, "%s: field 'rope_parameters' must be an object, got %s", file,
                             ember_json_type_bare(rp));
        const json_t *full = json_object_get(rp, "full_attention"), *sliding = json_object_get(rp, "sliding_attention");
        if ((full && !json_is_object(full)) || (sliding && !json_is_object(sliding)))
            return ember_err(err, EMBER_ERR_FORMAT, "%s: rope_parameters per layer type must be objects", file);
        src = full ? full : sliding ? sliding : rp;
        local = sliding ? sliding : src;
    } else if (rs && !json_is_null(rs)) {
        if (!json_is_object(rs))
            return ember_err(err, EMBER_ERR_FORMAT, "%s: field 'rope_scaling' must be an object, got %s", file,
                             ember_json_type_bare(rs));
        src = local = rs;
    }
    if ((rc = parse_rope_obj(file, root, src, cfg, &cfg->rope, err))) return rc;
    if (local == src) {
        cfg->rope_local = cfg->rope;
    } else if ((rc = parse_rope_obj(file, root, local, cfg, &cfg->rope_local, err))) {
        return rc;
    }
    bool gemma3 = strcmp(cfg->model_type, "gemma3_text") == 0;
    const json_t *lb = json_object_get(root, "rope_local_base_freq");
    if (gemma3 && (local == src || (lb && !json_is_null(lb)))) { /* the hub format */
        double theta;
        if ((rc = get_num(file, root, "rope_local_base_freq", false, 10000.0, 1e-3, 1e12, &theta, err))) return rc;
        if ((rc = parse_rope_obj(file, root, NULL, cfg, &cfg->rope_local, err))) return rc;
        cfg->rope_local.theta = theta;
    }
    return EMBER_OK;
}

static int parse_windows(const char *file, const json_t *root, ember_model_config *cfg, ember_error *err) {
    int rc, window = 0;
    const json_t *sw = json_object_get(root, "sliding_window");
    bool gemma = ember_arch_is_gemma(cfg->model_type);
    if ((sw && !json_is_null(sw)) || gemma) /* gemma: 4096 when absent, as transformers */
        if ((rc = get_int(file, root, "sliding_window", false, 4096, 0, 1 << 30, &window, err))) return rc;
    for (int i = 0; i < cfg->n_layers; i++) {
        cfg->layer_window[i] = 0;
        cfg->layer_sliding[i] = false;
    }
    const json_t *lt = json_object_get(root, "layer_types");
    bool is_qwen = strncmp(cfg->model_type, "qwen", 4) == 0;
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt) || json_array_size(lt) != (size_t)cfg->n_layers)
            return ember_err(err, EMBER_ERR_FORMAT, "%s: field 'layer_types' must be an array of %d strings", file,
                             cfg->n_layers);
        bool use_sw = true;
        if (is_qwen && (rc = get_bool(file, root, "use_sliding_window", true, &use_sw, err))) return rc;
        for (int i = 0; i < cfg->n_layers; i++) {
            const json_t *e = json_array_get(lt, (size_t)i);
            const char *s = json_is_string(e) ? json_string_value(e) : "";
            if (strcmp(s, "full_attention") == 0) {
                cfg->layer_window[i] = 0;
            } else if (strcmp(s, "sliding_attention") == 0) {
                cfg->layer_window[i] = use_sw ? window : 0;
                cfg->layer_sliding[i] = true;
            } else if (strcmp(s, "linear_attention") == 0 && ember_arch_find(cfg->model_type) &&
                       ember_arch_find(cfg->model_type)->family == EMBER_FAMILY_HYBRID) {
                cfg->layer_window[i] = 0; /* a DeltaNet layer (parse_hybrid) */
            } else {
                return ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: layer_types[%d] '%.32s' is not supported", file, i,
                                 s);
            }
        }
        return EMBER_OK;
    }
    if (gemma) { /* hub format: every other layer (gemma2), or 5 of every sliding_window_pattern (gemma3) */
        int pattern = 2;
        if (strcmp(cfg->model_type, "gemma3_text") == 0) {
            const char *key = json_object_get(root, "sliding_window_pattern") ? "sliding_window_pattern"
                                                                               : "_sliding_window_pattern";
            if ((rc = get_int(file, root, key, false, 6, 1, 1 << 20, &pattern, err))) return rc;
        }
        for (int i = 0; i < cfg->n_layers; i++) {
            cfg->layer_sliding[i] = (i + 1) % pattern != 0;
            cfg->layer_window[i] = cfg->layer_sliding[i] ? window : 0;
        }
    } else if (strcmp(cfg->model_type, "mistral") == 0 || strcmp(cfg->model_type, "phi3") == 0) {
        for (int i = 0; i < cfg->n_layers; i++) cfg->layer_window[i] = window;
    } else if (is_qwen) {
        bool use_sw = false;
        int max_window_layers = 0;
        if ((rc = get_bool(file, root, "use_sliding_window", false, &use_sw, err)) ||
            (rc = get_int(file, root, "max_window_layers", false, cfg->n_layers, 0, 1 << 30, &max_window_layers, err)))
            return rc;
        if (use_sw && window > 0)
            for (int i = max_window_layers; i < cfg->n_layers; i++) cfg->layer_window[i] = window;
    }
    return EMBER_OK;
}

/* A soft-capping value: absent -> def, null -> 0 (none). */
static int get_softcap(const char *file, const json_t *root, const char *key, double def, float *out,
                       ember_error *err) {
    const json_t *v = json_object_get(root, key);
    double x = 0;
    int rc = EMBER_OK;
    if (!v)
        x = def;
    else if (!json_is_null(v))
        rc = get_num(file, root, key, false, 0.0, 0.0, 1e6, &x, err);
    *out = (float)x;
    return rc;
}

/* The gemma-specific fields (gemma2, gemma3_text), with transformers' defaults. */
static int parse_gemma(const char *file, const json_t *root, ember_model_config *cfg, ember_error *err) {
    int rc;
    bool g2 = strcmp(cfg->model_type, "gemma2") == 0;
    double qpas;
    if ((rc = get_num(file, root, "query_pre_attn_scalar", false, 256.0, 1e-6, 1e9, &qpas, err)) ||
        (rc = get_softcap(file, root, "attn_logit_softcapping", g2 ? 50.0 : 0.0, &cfg->attn_softcap, err)) ||
        (rc = get_softcap(file, root, "final_logit_softcapping", g2 ? 30.0 : 0.0, &cfg->final_softcap, err)))
        return rc;
    cfg->query_pre_attn_scalar = (float)qpas;
    bool bidir = false;
    if ((rc = get_bool(file, root, "use_bidirectional_attention", false, &bidir, err))) return rc;
    if (bidir)
        return ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: use_bidirectional_attention (an encoder) is not supported",
                         file);
    return EMBER_OK;
}

/* The mixture-of-experts fields, with transformers' defaults. qwen3_moe:
   the expert count is num_experts (hub) or num_local_experts (transformers
   5); MoE layers are those with (l + 1) % decoder_sparse_step == 0 not in
   mlp_only_layers; softmax router. glm4_moe: n_routed_experts (or
   num_experts), layers from first_k_dense_replace on, a sigmoid router
   with groups (n_group, topk_group), routed_scaling_factor and
   n_shared_experts. Counts are checked against each other. */
static int parse_moe(const char *file, const json_t *root, ember_model_config *cfg, ember_error *err) {
    int rc, step = 1, first_dense = 0;
    const bool glm = strcmp(cfg->model_type, "glm4_moe") == 0;
    double scale = 1.0;
    const char *ek = json_object_get(root, "num_experts") ? "num_experts"
                     : glm                                ? "n_routed_experts"
                                                          : "num_local_experts";
    if ((rc = get_int(file, root, ek, true, 0, 1, 1 << 16, &cfg->n_experts, err)) ||
        (rc = get_int(file, root, "num_experts_per_tok", true, 0, 1, 1 << 16, &cfg->n_experts_used, err)) ||
        (rc = get_int(file, root, "moe_intermediate_size", true, 0, 1, 1 << 22, &cfg->moe_intermediate_size, err)) ||
        (rc = get_int(file, root, "decoder_sparse_step", false, 1, 1, EMBER_MAX_LAYERS, &step, err)) ||
        (rc = get_bool(file, root, "norm_topk_prob", glm || strcmp(cfg->model_type, "qwen3_next") == 0,
                             &cfg->norm_topk_prob, err)))
        return rc;
    cfg->n_group = cfg->topk_group = 1;
    if (glm && ((rc = get_int(file, root, "n_group", false, 1, 1, 256, &cfg->n_group, err)) ||
                (rc = get_int(file, root, "topk_group", false, 1, 1, 1 << 16, &cfg->topk_group, err)) ||
                (rc = get_int(file, root, "n_shared_experts", false, 1, 0, 64, &cfg->n_shared_experts, err)) ||
                (rc = get_int(file, root, "first_k_dense_replace", false, 1, 0, EMBER_MAX_LAYERS, &first_dense, err)) ||
                (rc = get_num(file, root, "routed_scaling_factor", false, 1.0, 1e-6, 1e6, &scale, err)) ||
                (rc = get_int(file, root, "num_nextn_predict_layers", false, 0, 0, 16, &cfg->n_mtp_layers, err))))
        return rc;
    cfg->router_sigmoid = glm;
    cfg->routed_scale = (float)scale;
    if (cfg->n_experts_used > cfg->n_experts)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: num_experts_per_tok %d is above the expert count %s %d", file,
                         cfg->n_experts_used, ek, cfg->n_experts);
    if (cfg->n_experts % cfg->n_group || cfg->topk_group > cfg->n_group ||
        cfg->n_experts_used > cfg->topk_group * (cfg->n_experts / cfg->n_group))
        return ember_err(err, EMBER_ERR_FORMAT,
                         "%s: n_group %d / topk_group %d do not fit %d experts with num_experts_per_tok %d", file,
                         cfg->n_group, cfg->topk_group, cfg->n_experts, cfg->n_experts_used);
    for (int l = 0; l < cfg->n_layers; l++) cfg->layer_moe[l] = glm ? l >= first_dense : (l + 1) % step == 0;
    const json_t *only = json_object_get(root, "mlp_only_layers");
    if (glm || !only || json_is_null(only)) return EMBER_OK;
    if (!json_is_array(only))
        return ember_err(err, EMBER_ERR_FORMAT, "%s: field 'mlp_only_layers' must be an array, got %s", file,
                         ember_json_type_bare(only));
    for (size_t i = 0; i < json_array_size(only); i++) {
        const json_t *v = json_array_get(only, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= cfg->n_layers)
            return ember_err(err, EMBER_ERR_FORMAT, "%s: mlp_only_layers[%zu] must be a layer index in [0, %d)", file,
                             i, cfg->n_layers);
        cfg->layer_moe[json_integer_value(v)] = false;
    }
    return EMBER_OK;
}

void ember_config_hybrid_layers(ember_model_config *cfg) {
    cfg->n_linear = 0;
    for (int l = 0; l < cfg->n_layers; l++) cfg->n_linear += cfg->layer_linear[l];
    cfg->qk_norm = true;
    cfg->attn_output_gate = true;
}

/*
 * The hybrid fields (qwen3_next, qwen3_5_text, qwen3_5_moe_text), with
 * transformers' defaults: layer_types (or, in older configs,
 * full_attention_interval: every interval-th layer full, default 4), the
 * DeltaNet head counts and sizes, the convolution width; the attention
 * layers have qk-norm and an output gate; the MoE variants a sigmoid-gated
 * shared expert of shared_expert_intermediate_size; mtp_num_hidden_layers
 * (-1 when absent) for the MTP head (model/mtp.c). Impossible values are
 * refused naming the field.
 */
static int parse_hybrid(const char *file, const json_t *root, ember_model_config *cfg, ember_error *err) {
    int rc, interval = 4;
    if ((rc = get_int(file, root, "linear_conv_kernel_dim", false, 4, 1, 64, &cfg->lin_conv_k, err)) ||
        (rc = get_int(file, root, "linear_key_head_dim", false, 128, 1, 4096, &cfg->lin_k_dim, err)) ||
        (rc = get_int(file, root, "linear_value_head_dim", false, 128, 1, 4096, &cfg->lin_v_dim, err)) ||
        (rc = get_int(file, root, "linear_num_key_heads", false, 16, 1, 4096, &cfg->lin_k_heads, err)) ||
        (rc = get_int(file, root, "linear_num_value_heads", false, 32, 1, 4096, &cfg->lin_v_heads, err)) ||
        (rc = get_int(file, root, "full_attention_interval", false, 4, 1, EMBER_MAX_LAYERS, &interval, err)) ||
        (rc = get_int(file, root, "mtp_num_hidden_layers", false, -1, 0, 16, &cfg->mtp_layers, err)))
        return rc;
    if (cfg->lin_v_heads % cfg->lin_k_heads)
        return ember_err(err, EMBER_ERR_FORMAT,
                         "%s: linear_num_value_heads %d is not a multiple of linear_num_key_heads %d", file,
                         cfg->lin_v_heads, cfg->lin_k_heads);
    const json_t *lt = json_object_get(root, "layer_types");
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt))
            return ember_err(err, EMBER_ERR_FORMAT, "%s: field 'layer_types' must be an array, got %s", file,
                             ember_json_type_bare(lt));
        if (json_array_size(lt) != (size_t)cfg->n_layers)
            return ember_err(err, EMBER_ERR_FORMAT, "%s: layer_types has %zu entries for num_hidden_layers %d", file,
                             json_array_size(lt), cfg->n_layers);
        for (int l = 0; l < cfg->n_layers; l++) {
            const json_t *v = json_array_get(lt, (size_t)l);
            const char *t = json_is_string(v) ? json_string_value(v) : "";
            if (strcmp(t, "linear_attention") && strcmp(t, "full_attention"))
                return ember_err(err, EMBER_ERR_FORMAT,
                                 "%s: layer_types[%d] must be \"linear_attention\" or \"full_attention\"", file, l);
            cfg->layer_linear[l] = strcmp(t, "linear_attention") == 0;
        }
    } else {
        for (int l = 0; l < cfg->n_layers; l++) cfg->layer_linear[l] = (l + 1) % interval != 0;
    }
    ember_config_hybrid_layers(cfg);
    if (cfg->n_experts &&
        (rc = get_int(file, root, "shared_expert_intermediate_size", false, 0, 0, 1 << 22, &cfg->shared_expert_size, err)))
        return rc;
    const json_t *rp = json_object_get(root, "rope_parameters");
    const json_t *ms = rp && json_is_object(rp) ? json_object_get(rp, "mrope_section") : NULL;
    if (ms && !json_is_null(ms)) { /* M-RoPE: text positions make it plain RoPE; the sections must still fit */
        long long sum = 0;
        bool ok = json_is_array(ms);
        for (size_t i = 0; ok && i < json_array_size(ms); i++) {
            const json_t *v = json_array_get(ms, i);
            ok = json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= 4096 && i < 4;
            if (ok) sum += cfg->mrope_section[cfg->n_mrope++] = (int)json_integer_value(v);
        }
        double prf = cfg->rope.partial_rotary_factor > 0 ? cfg->rope.partial_rotary_factor : 1.0;
        long long half = (long long)(cfg->head_dim * prf) / 2;
        if (!ok || sum != half)
            return ember_err(err, EMBER_ERR_FORMAT,
                             "%s: rope_parameters.mrope_section must be at most 4 integers summing to %lld (half the rotated "
                             "dimensions)",
                             file, half);
    }
    return EMBER_OK;
}

/* ---- gemma4_text ---------------------------------------------------------------- */

/* One per_layer_config entry (transformers 5): {"head_dim": D, "num_key_value_heads": K}. */
static int g4_layer_entry(const char *file, const char *key, const json_t *v, ember_model_config *cfg,
                          ember_error *err) {
    char *end = NULL;
    long l = strtol(key, &end, 10);
    if (!*key || *end || l < 0 || l >= cfg->n_layers)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: per_layer_config key '%.32s' is not a layer index in [0, %d)",
                         file, key, cfg->n_layers);
    if (!json_is_object(v))
        return ember_err(err, EMBER_ERR_FORMAT, "%s: per_layer_config.%s must be an object, got %s", file, key,
                         ember_json_type_bare(v));
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x) {
        if (strcmp(k, "head_dim") != 0 && strcmp(k, "num_key_value_heads") != 0)
            return ember_err(err, EMBER_ERR_UNSUPPORTED,
                             "%s: per_layer_config.%s.%.32s is not supported (head_dim and num_key_value_heads are)",
                             file, key, k);
    }
    char where[300];
    snprintf(where, sizeof where, "%s: per_layer_config.%s", file, key);
    int rc;
    if ((rc = get_int(where, v, "head_dim", false, 0, 2, 4096, &cfg->layer_head_dim[l], err)) ||
        (rc = get_int(where, v, "num_key_value_heads", false, 0, 1, 4096, &cfg->layer_kv_heads[l], err)))
        return rc;
    return EMBER_OK;
}

/* The per-layer attention shapes: per_layer_config (transformers 5) or the
   hub's global_head_dim (default 512) and num_global_key_value_heads (with
   attention_k_eq_v) on the full-attention layers, as transformers reads them. */
static int g4_layer_shapes(const char *file, const json_t *root, ember_model_config *cfg, ember_error *err) {
    int rc;
    const json_t *plc = json_object_get(root, "per_layer_config");
    if (plc && !json_is_null(plc)) {
        if (!json_is_object(plc))
            return ember_err(err, EMBER_ERR_FORMAT, "%s: field 'per_layer_config' must be an object, got %s", file,
                             ember_json_type_bare(plc));
        const char *key;
        json_t *v;
        json_object_foreach((json_t *)plc, key, v) {
            if ((rc = g4_layer_entry(file, key, v, cfg, err))) return rc;
        }
        return EMBER_OK;
    }
    int ghd, gkv;
    if ((rc = get_int(file, root, "global_head_dim", false, 512, 2, 4096, &ghd, err)) ||
        (rc = get_int(file, root, "num_global_key_value_heads", false, 0, 1, 4096, &gkv, err)))
        return rc;
    for (int l = 0; l < cfg->n_layers; l++)
        if (!cfg->layer_sliding[l]) {
            cfg->layer_head_dim[l] = ghd;
            if (cfg->attn_k_eq_v) cfg->layer_kv_heads[l] = gkv;
        }
    return EMBER_OK;
}

/* The gemma4_text fields, with transformers' defaults (Gemma4TextConfig):
   sliding_window 512, layer_types 5 sliding : 1 full with the last layer
   full, rope_parameters per layer type (default / proportional), no
   soft-capping of scores, attention scale 1, q/k norms; the per-layer
   shapes, attention_k_eq_v, num_kv_shared_layers (each shared layer reads
   the last earlier non-shared layer of its type), per-layer inputs
   (hidden_size_per_layer_input 256, vocab_size_per_layer_input),
   use_double_wide_mlp and the MoE block (enable_moe_block: num_experts,
   top_k_experts, moe_intermediate_size). Impossible combinations are refused
   naming the field. */
static int parse_gemma4(const char *file, const json_t *root, ember_model_config *cfg, ember_error *err) {
    int rc, window;
    const int L = cfg->n_layers;
    if ((rc = get_int(file, root, "sliding_window", false, 512, 1, 1 << 30, &window, err))) return rc;
    const json_t *lt = json_object_get(root, "layer_types");
    if (!lt || json_is_null(lt))
        for (int l = 0; l < L; l++) cfg->layer_sliding[l] = (l + 1) % 6 != 0;
    cfg->layer_sliding[L - 1] = false; /* transformers makes the last layer full attention */
    for (int l = 0; l < L; l++) cfg->layer_window[l] = cfg->layer_sliding[l] ? window : 0;
    const json_t *rp = json_object_get(root, "rope_parameters");
    if (!rp || json_is_null(rp)) { /* transformers' defaults per layer type */
        cfg->rope_local = cfg->rope;
        cfg->rope_local.type = EMBER_ROPE_DEFAULT;
        cfg->rope_local.theta = 10000.0;
        cfg->rope_local.partial_rotary_factor = 1.0;
        cfg->rope.type = EMBER_ROPE_PROPORTIONAL;
        cfg->rope.theta = 1000000.0;
        cfg->rope.partial_rotary_factor = 0.25;
        cfg->rope.factor = 1.0;
    } else {
        for (int l = 0; l < L; l++) {
            const char *kind = cfg->layer_sliding[l] ? "sliding_attention" : "full_attention";
            if (!json_object_get(rp, kind))
                return ember_err(err, EMBER_ERR_FORMAT, "%s: rope_parameters has no '%s' entry (layer %d)", file,
                                 kind, l);
        }
    }
    if ((rc = get_softcap(file, root, "final_logit_softcapping", 0.0, &cfg->final_softcap, err))) return rc;
    cfg->attn_softcap = 0.0f;
    cfg->query_pre_attn_scalar = 0.0f;
    cfg->qk_norm = true;
    const json_t *bidir = json_object_get(root, "use_bidirectional_attention");
    if (bidir && !json_is_null(bidir) &&
        (!json_is_string(bidir) || strcmp(json_string_value(bidir), "vision") != 0)) /* "vision": text stays causal */
        return ember_err(err, EMBER_ERR_UNSUPPORTED,
                         "%s: use_bidirectional_attention '%.32s' is not supported (null or \"vision\")", file,
                         json_is_string(bidir) ? json_string_value(bidir) : ember_json_type_bare(bidir));
    if (cfg->attn_bias)
        return ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: attention_bias true is not supported for gemma4_text", file);
    bool moe = false;
    if ((rc = get_bool(file, root, "attention_k_eq_v", false, &cfg->attn_k_eq_v, err)) ||
        (rc = get_int(file, root, "num_kv_shared_layers", false, 0, 0, L - 1, &cfg->n_kv_shared, err)) ||
        (rc = get_int(file, root, "hidden_size_per_layer_input", false, 256, 0, 1 << 16, &cfg->ple_dim, err)) ||
        (rc = get_bool(file, root, "use_double_wide_mlp", false, &cfg->double_wide_mlp, err)) ||
        (rc = get_bool(file, root, "enable_moe_block", false, &moe, err)))
        return rc;
    if (cfg->ple_dim) {
        if ((rc = get_int(file, root, "vocab_size_per_layer_input", false, 262144, 0, 1 << 24, &cfg->ple_vocab, err)))
            return rc;
        if (cfg->ple_vocab < cfg->vocab_size) /* the per-layer table is indexed by the token ids */
            return ember_err(err, EMBER_ERR_FORMAT,
                             "%s: vocab_size_per_layer_input %d is below vocab_size %d (hidden_size_per_layer_input %d)",
                             file, cfg->ple_vocab, cfg->vocab_size, cfg->ple_dim);
    }
    if (moe) {
        cfg->moe_beside_mlp = true;
        if ((rc = get_int(file, root, "num_experts", true, 0, 1, 1 << 16, &cfg->n_experts, err)) ||
            (rc = get_int(file, root, "top_k_experts", true, 0, 1, 1 << 16, &cfg->n_experts_used, err)) ||
            (rc = get_int(file, root, "moe_intermediate_size", true, 0, 1, 1 << 22, &cfg->moe_intermediate_size,
                          err)))
            return rc;
        if (cfg->n_experts_used > cfg->n_experts)
            return ember_err(err, EMBER_ERR_FORMAT, "%s: top_k_experts %d is above num_experts %d", file,
                             cfg->n_experts_used, cfg->n_experts);
        cfg->norm_topk_prob = true; /* the router renormalises its top k */
        cfg->n_group = cfg->topk_group = 1;
        cfg->routed_scale = 1.0f;
        for (int l = 0; l < L; l++) cfg->layer_moe[l] = true;
    }
    if ((rc = g4_layer_shapes(file, root, cfg, err))) return rc;
    int kind_dim[2] = {0, 0}; /* full, sliding: one RoPE table each, so one head size each */
    for (int l = 0; l < L; l++) {
        const int d = ember_cfg_head_dim(cfg, l), kv = ember_cfg_kv_heads(cfg, l), s = cfg->layer_sliding[l];
        if (d % 2)
            return ember_err(err, EMBER_ERR_FORMAT, "%s: layer %d: head_dim %d must be even (per_layer_config)", file,
                             l, d);
        if (cfg->n_heads % kv)
            return ember_err(err, EMBER_ERR_FORMAT,
                             "%s: layer %d: num_attention_heads %d is not a multiple of its num_key_value_heads %d "
                             "(per_layer_config)",
                             file, l, cfg->n_heads, kv);
        if (kind_dim[s] && kind_dim[s] != d)
            return ember_err(err, EMBER_ERR_UNSUPPORTED,
                             "%s: layer %d: head_dim %d differs from %d of the other %s layers (per_layer_config)", file,
                             l, d, kind_dim[s], s ? "sliding" : "full-attention");
        kind_dim[s] = d;
    }
    const int first = L - cfg->n_kv_shared;
    for (int l = first; l < L; l++) { /* the last earlier non-shared layer of the same type */
        int src = -1;
        for (int j = first - 1; j >= 0 && src < 0; j--)
            if (cfg->layer_sliding[j] == cfg->layer_sliding[l]) src = j;
        if (src < 0)
            return ember_err(err, EMBER_ERR_FORMAT,
                             "%s: num_kv_shared_layers %d: layer %d (%s) has no earlier layer of its type to share K/V "
                             "with",
                             file, cfg->n_kv_shared, l, cfg->layer_sliding[l] ? "sliding" : "full attention");
        if (ember_cfg_kv_heads(cfg, l) != ember_cfg_kv_heads(cfg, src))
            return ember_err(err, EMBER_ERR_FORMAT,
                             "%s: num_kv_shared_layers: layer %d has %d KV heads, layer %d whose K/V it shares has %d "
                             "(per_layer_config)",
                             file, l, ember_cfg_kv_heads(cfg, l), src, ember_cfg_kv_heads(cfg, src));
        cfg->layer_kv_src[l] = src;
    }
    return EMBER_OK;
}

/* ---- MLX quantization ---------------------------------------------------------- */

static const char *const k_layer_modules[EMBER_QUANT_LAYER_MODULES] = {
    "self_attn.q_proj",           "self_attn.k_proj",         "self_attn.v_proj",
    "self_attn.o_proj",           "mlp.gate_proj",            "mlp.up_proj",
    "mlp.down_proj",              "mlp.gate",                 "mlp.switch_mlp.gate_proj",
    "mlp.switch_mlp.up_proj",     "mlp.switch_mlp.down_proj", "mlp.shared_experts.gate_proj",
    "mlp.shared_experts.up_proj", "mlp.shared_experts.down_proj", "per_layer_input_gate",
    "per_layer_projection"};

/* Slots of the modules outside the layers: embed, lm_head, gemma4's
   embed_tokens_per_layer and per_layer_model_projection; layer slots follow. */
#define QUANT_GLOBAL_SLOTS 4

/* The override slot of a module path: 0 embed, 1 lm_head, 2 gemma4's
   embed_tokens_per_layer, 3 its per_layer_model_projection,
   QUANT_GLOBAL_SLOTS + EMBER_QUANT_LAYER_MODULES * layer + module for layer matrices (phi3's
   qkv_proj and gate_up_proj share the q and gate slots, gemma4's router.proj
   and experts.switch_glu.* those of mlp.gate and mlp.switch_mlp.*, which
   gemma4 lacks); -1 for paths that are not such matrices.
   *bad_layer is set when the path names a layer >= n_layers. */
static long quant_slot(int n_layers, const char *path, bool *bad_layer) {
    *bad_layer = false;
    /* a multimodal checkpoint's text model (mlx-lm writes its module paths):
       language_model.model.X (model.language_model.X) is model.X,
       language_model.lm_head is lm_head */
    char plain[256];
    static const char *const wrapped[] = {"language_model.model.", "model.language_model."};
    for (size_t i = 0; i < EMBER_ARRAY_LEN(wrapped); i++) {
        size_t n = strlen(wrapped[i]);
        if (strncmp(path, wrapped[i], n) == 0 && strlen(path + n) < sizeof plain - 8) {
            snprintf(plain, sizeof plain, "model.%s", path + n);
            path = plain;
        }
    }
    if (strcmp(path, "language_model.lm_head") == 0) return 1;
    if (strcmp(path, "model.embed_tokens") == 0) return 0;
    if (strcmp(path, "lm_head") == 0) return 1;
    if (strcmp(path, "model.embed_tokens_per_layer") == 0) return 2;
    if (strcmp(path, "model.per_layer_model_projection") == 0) return 3;
    static const char prefix[] = "model.layers.";
    if (strncmp(path, prefix, sizeof prefix - 1) != 0) return -1;
    const char *p = path + sizeof prefix - 1;
    long layer = 0;
    int digits = 0;
    while (*p >= '0' && *p <= '9' && digits < 9) layer = layer * 10 + (*p++ - '0'), digits++;
    if (!digits || *p != '.') return -1;
    /* phi3's fused projections take the slots of q_proj and gate_proj, which phi3 lacks */
    static const struct {
        const char *name;
        int slot;
    } k_fused[] = {{"self_attn.qkv_proj", 0},
                   {"mlp.gate_up_proj", 4},
                   {"router.proj", 7},
                   {"experts.switch_glu.gate_proj", 8},
                   {"experts.switch_glu.up_proj", 9},
                   {"experts.switch_glu.down_proj", 10}};
    for (size_t i = 0; i < EMBER_ARRAY_LEN(k_fused); i++)
        if (strcmp(p + 1, k_fused[i].name) == 0) {
            if (layer >= n_layers) {
                *bad_layer = true;
                return -1;
            }
            return QUANT_GLOBAL_SLOTS + EMBER_QUANT_LAYER_MODULES * layer + k_fused[i].slot;
        }
    for (int i = 0; i < EMBER_QUANT_LAYER_MODULES; i++)
        if (strcmp(p + 1, k_layer_modules[i]) == 0) {
            if (layer >= n_layers) {
                *bad_layer = true;
                return -1;
            }
            return QUANT_GLOBAL_SLOTS + EMBER_QUANT_LAYER_MODULES * layer + i;
        }
    return -1;
}

/* The override of slot i (quant_slot), and a pointer to it to set. */
static uint8_t slot_get(const ember_quant_config *q, long i) {
    if (i < QUANT_GLOBAL_SLOTS) return i == 0 ? q->embed : i == 1 ? q->lm_head : i == 2 ? q->ple_embed : q->ple_proj;
    i -= QUANT_GLOBAL_SLOTS;
    return q->layer[i / EMBER_QUANT_LAYER_MODULES][i % EMBER_QUANT_LAYER_MODULES];
}

static uint8_t *slot_at(ember_quant_config *q, long i) {
    if (i < QUANT_GLOBAL_SLOTS) return i == 0 ? &q->embed : i == 1 ? &q->lm_head : i == 2 ? &q->ple_embed : &q->ple_proj;
    i -= QUANT_GLOBAL_SLOTS;
    return &q->layer[i / EMBER_QUANT_LAYER_MODULES][i % EMBER_QUANT_LAYER_MODULES];
}

/* mode: absent, or "affine". */
static int quant_mode(const char *file, const char *where, const json_t *o, ember_error *err) {
    const json_t *m = json_object_get(o, "mode");
    if (!m || json_is_null(m)) return EMBER_OK;
    if (!json_is_string(m) || strcmp(json_string_value(m), "affine") != 0)
        return ember_err(err, EMBER_ERR_UNSUPPORTED,
                         "%s: %s.mode '%.32s' is not supported (only MLX affine quantization)", file, where,
                         json_is_string(m) ? json_string_value(m) : ember_json_type_bare(m));
    return EMBER_OK;
}

/* group_size and bits of an object; absent ones take def_g / def_b (0: required). */
static int quant_params(const char *file, const char *where, const json_t *o, int def_g, int def_b, int *g, int *b,
                        ember_error *err) {
    int rc;
    char key[160];
    snprintf(key, sizeof key, "%.120s.group_size", where);
    const json_t *gv = json_object_get(o, "group_size"), *bv = json_object_get(o, "bits");
    if ((!gv || json_is_null(gv)) && !def_g)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: missing required field '%s'", file, key);
    if ((rc = get_int(file, o, "group_size", false, def_g, 1, 1 << 20, g, err))) return rc;
    if (*g != 32 && *g != 64 && *g != 128)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: field '%s' is %d; MLX group sizes are 32, 64 and 128", file, key,
                         *g);
    snprintf(key, sizeof key, "%.120s.bits", where);
    if ((!bv || json_is_null(bv)) && !def_b)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: missing required field '%s'", file, key);
    if ((rc = get_int(file, o, "bits", false, def_b, 0, 64, b, err))) return rc;
    if (*b != 2 && *b != 3 && *b != 4 && *b != 5 && *b != 6 && *b != 8)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: field '%s' is %d; MLX bit widths are 2, 3, 4, 5, 6 and 8", file,
                         key, *b);
    return quant_mode(file, where, o, err);
}

/*
 * "quantization" (else "quantization_config"): MLX's affine scheme with
 * per-module entries. Other schemes (GPTQ, AWQ, bitsandbytes, FP8, ...:
 * a "quant_method" other than "mlx", or a mode other than "affine") are
 * refused as unsupported.
 */
static int parse_quant(const char *file, const json_t *root, ember_model_config *cfg, ember_error *err) {
    const char *key = "quantization";
    json_t *q = json_object_get(root, key);
    if (!q || json_is_null(q)) {
        key = "quantization_config";
        q = json_object_get(root, key);
    }
    if (!q || json_is_null(q)) return EMBER_OK;
    if (!json_is_object(q))
        return ember_err(err, EMBER_ERR_FORMAT, "%s: field '%s' must be an object, got %s", file, key, ember_json_type_bare(q));
    const json_t *method = json_object_get(q, "quant_method");
    if (method && !json_is_null(method) &&
        (!json_is_string(method) || strcmp(json_string_value(method), "mlx") != 0))
        return ember_err(err, EMBER_ERR_UNSUPPORTED,
                         "%s: %s.quant_method '%.32s' is not supported (Ember reads MLX affine quantization)", file, key,
                         json_is_string(method) ? json_string_value(method) : ember_json_type_bare(method));
    ember_quant_config *qc = &cfg->quant;
    int rc = quant_params(file, key, q, 0, 0, &qc->group_size, &qc->bits, err);
    if (rc) return rc;
    const char *name;
    json_t *v;
    json_object_foreach(q, name, v) {
        if (!json_is_object(v) && !json_is_boolean(v)) continue; /* group_size, bits, mode, other scalars */
        char where[200];
        snprintf(where, sizeof where, "%s.%.150s", key, name);
        uint8_t code;
        if (json_is_object(v)) {
            int g, b; /* absent fields take the affine mode's defaults, as MLX's to_quantized does */
            if ((rc = quant_params(file, where, v, 64, 4, &g, &b, err))) return rc;
            code = (uint8_t)(b | (g / 32) << 4);
        } else {
            code = json_is_true(v) ? (uint8_t)(qc->bits | (qc->group_size / 32) << 4) : EMBER_QUANT_FLOAT;
        }
        bool bad_layer;
        long slot = quant_slot(cfg->n_layers, name, &bad_layer);
        if (bad_layer)
            return ember_err(err, EMBER_ERR_FORMAT, "%s: %s names a layer beyond num_hidden_layers %d", file, where,
                             cfg->n_layers);
        if (slot >= 0) *slot_at(qc, slot) = code; /* entries for modules the family does not have are ignored */
    }
    return EMBER_OK;
}

ember_qmod_kind ember_config_quant_module(const ember_model_config *cfg, const char *path, int *bits, int *group_size) {
    const ember_quant_config *q = &cfg->quant;
    *bits = q->bits;
    *group_size = q->group_size;
    bool bad;
    long i = q->bits ? quant_slot(cfg->n_layers, path, &bad) : -1;
    uint8_t code = i < 0 ? 0 : slot_get(q, i);
    if (code == 0) return EMBER_QMOD_DEFAULT;
    if (code == EMBER_QUANT_FLOAT) return EMBER_QMOD_FLOAT;
    *bits = code & 15;
    *group_size = (code >> 4) * 32;
    return EMBER_QMOD_QUANT;
}

bool ember_config_model_type_supported(const char *model_type) {
    return ember_arch_find(model_type) != NULL;
}

/* The multimodal checkpoints whose text model Ember runs: their config's
   model_type, and the text model's. */
static const struct {
    const char *wrapper, *text;
} k_wrappers[] = {
    {"qwen3_5", "qwen3_5_text"}, {"qwen3_5_moe", "qwen3_5_moe_text"}, {"gemma3", "gemma3_text"}, {"gemma4", "gemma4_text"}};

/*
 * A multimodal config (k_wrappers) read as its text model: *out (a new
 * reference the caller releases) is text_config with the top level's other
 * fields where text_config lacks them (eos and bos ids, tie_word_embeddings,
 * ...), and model_type the text model's when text_config has none. The
 * vision and audio parts are not read. Returns EMBER_OK with *out NULL when
 * mt is not a wrapper.
 */
static int unwrap_text_config(const char *file, json_t *root, const char *mt, json_t **out, ember_error *err) {
    *out = NULL;
    const char *text_type = NULL;
    for (size_t i = 0; i < EMBER_ARRAY_LEN(k_wrappers); i++)
        if (strcmp(mt, k_wrappers[i].wrapper) == 0) text_type = k_wrappers[i].text;
    if (!text_type) return EMBER_OK;
    json_t *tc = json_object_get(root, "text_config");
    if (!tc || !json_is_object(tc))
        return ember_err(err, EMBER_ERR_FORMAT,
                         "%s: model_type '%s' (a multimodal model) needs a 'text_config' object for its text model",
                         file, mt);
    json_t *m = json_deep_copy(tc);
    if (!m) return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "text_config") || !strcmp(key, "vision_config") || !strcmp(key, "audio_config") ||
            !strcmp(key, "model_type") || !strcmp(key, "architectures") || json_object_get(m, key))
            continue;
        if (json_object_set(m, key, v)) {
            json_decref(m);
            return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        }
    }
    if (!json_object_get(m, "model_type") && json_object_set_new(m, "model_type", json_string(text_type))) {
        json_decref(m);
        return ember_err(err, EMBER_ERR_NOMEM, "out of memory");
    }
    *out = m;
    return EMBER_OK;
}

/* An EAGLE-3 draft model's fields (config.h's eagle3 part): detected by an
   architectures entry naming Eagle3 or by draft_vocab_size. Leaves cfg
   alone for any other model. */
static int parse_eagle3(const char *file, const json_t *root, ember_model_config *cfg, ember_error *err) {
    const json_t *arch = json_object_get(root, "architectures"), *v;
    size_t i;
    bool e3 = json_object_get(root, "draft_vocab_size") != NULL;
    json_array_foreach(arch, i, v) if (json_is_string(v) && strstr(json_string_value(v), "Eagle3")) e3 = true;
    if (!e3) return EMBER_OK;
    cfg->eagle3 = true;
    int rc;
    if ((rc = get_int(file, root, "draft_vocab_size", false, cfg->vocab_size, 1, cfg->vocab_size, &cfg->e3_draft_vocab,
                      err)) ||
        (rc = get_int(file, root, "target_hidden_size", false, cfg->hidden_size, 1, 1 << 20, &cfg->e3_target_hidden,
                      err)))
        return rc;
    cfg->e3_target_hidden_set = json_object_get(root, "target_hidden_size") != NULL;
    if (cfg->n_layers != 1)
        return ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: num_hidden_layers %d (an EAGLE-3 draft model has 1)", file,
                         cfg->n_layers);
    const json_t *ec = json_object_get(root, "eagle_config");
    const json_t *ids = json_is_object(ec) ? json_object_get(ec, "eagle_aux_hidden_state_layer_ids") : NULL;
    if (!ids || json_is_null(ids)) return EMBER_OK;
    if (!json_is_array(ids) || json_array_size(ids) < 1 || json_array_size(ids) > 8)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: eagle_config.eagle_aux_hidden_state_layer_ids must be a list of 1..8 "
                         "layer ids", file);
    json_array_foreach(ids, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > EMBER_MAX_LAYERS)
            return ember_err(err, EMBER_ERR_FORMAT, "%s: eagle_config.eagle_aux_hidden_state_layer_ids[%zu] is not a "
                             "layer id", file, i);
        cfg->e3_aux[cfg->e3_n_aux++] = (int)json_integer_value(v);
    }
    return EMBER_OK;
}

/* A DFlash draft model's fields (config.h's dflash part): detected by an
   architectures entry naming DFlash or by dflash_config. Leaves cfg alone
   for any other model. */
static int parse_dflash(const char *file, const json_t *root, ember_model_config *cfg, ember_error *err) {
    const json_t *arch = json_object_get(root, "architectures"), *v, *dc = json_object_get(root, "dflash_config");
    size_t i;
    bool df = json_is_object(dc);
    json_array_foreach(arch, i, v) if (json_is_string(v) && strstr(json_string_value(v), "DFlash")) df = true;
    if (!df) return EMBER_OK;
    cfg->dflash = true;
    int rc;
    if ((rc = get_int(file, root, "block_size", false, 16, 2, 64, &cfg->df_block, err)) ||
        (rc = get_int(file, root, "num_target_layers", false, 0, 0, EMBER_MAX_LAYERS, &cfg->df_n_target, err)))
        return rc;
    if (!json_is_object(dc) || !json_is_integer(json_object_get(dc, "mask_token_id")))
        return ember_err(err, EMBER_ERR_FORMAT, "%s: a DFlash draft model needs dflash_config.mask_token_id", file);
    long long mask = json_integer_value(json_object_get(dc, "mask_token_id"));
    if (mask < 0 || mask >= cfg->vocab_size)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: dflash_config.mask_token_id %lld is outside vocab_size %d", file, mask,
                         cfg->vocab_size);
    cfg->df_mask_id = (int)mask;
    const json_t *ids = json_object_get(dc, "target_layer_ids");
    if (!ids || json_is_null(ids)) return EMBER_OK;
    if (!json_is_array(ids) || json_array_size(ids) < 1 || json_array_size(ids) > 16)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: dflash_config.target_layer_ids must be a list of 1..16 layer ids", file);
    json_array_foreach(ids, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= EMBER_MAX_LAYERS)
            return ember_err(err, EMBER_ERR_FORMAT, "%s: dflash_config.target_layer_ids[%zu] is not a layer id", file, i);
        cfg->df_ids[cfg->df_n_ids++] = (int)json_integer_value(v);
    }
    return EMBER_OK;
}

int ember_config_parse(const char *file, const char *text, size_t len, ember_model_config *cfg,
                       ember_error *err) {
    memset(cfg, 0, sizeof *cfg);
    cfg->bos_id = -1;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: not valid JSON: %s (line %d, column %d)", file, je.text, je.line,
                         je.column);
    int rc = EMBER_OK;
    if (!json_is_object(root)) {
        rc = ember_err(err, EMBER_ERR_FORMAT, "%s: not a JSON object", file);
        goto done;
    }
    const char *mt;
    if ((rc = get_str(file, root, "model_type", &mt, err))) goto done;
    if (!mt) {
        rc = ember_err(err, EMBER_ERR_FORMAT, "%s: missing required field 'model_type'", file);
        goto done;
    }
    json_t *inner;
    if ((rc = unwrap_text_config(file, root, mt, &inner, err))) goto done;
    if (inner) { /* a multimodal checkpoint: its text model from here on */
        json_decref(root);
        root = inner;
        cfg->text_of_multimodal = true;
        if ((rc = get_str(file, root, "model_type", &mt, err))) goto done;
        if (!mt) {
            rc = ember_err(err, EMBER_ERR_FORMAT, "%s: text_config.model_type must be a string", file);
            goto done;
        }
    }
    if (!ember_config_model_type_supported(mt)) {
        char list[256];
        rc = ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: model_type '%.32s' is not supported (supported: %s)", file, mt,
                       ember_arch_list(false, list, sizeof list));
        goto done;
    }
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", mt);
    if ((rc = get_int(file, root, "vocab_size", true, 0, 1, 1 << 24, &cfg->vocab_size, err)) ||
        (rc = get_int(file, root, "hidden_size", true, 0, 1, 1 << 20, &cfg->hidden_size, err)) ||
        (rc = get_int(file, root, "intermediate_size", true, 0, 1, 1 << 22, &cfg->intermediate_size, err)) ||
        (rc = get_int(file, root, "num_hidden_layers", true, 0, 1, EMBER_MAX_LAYERS, &cfg->n_layers, err)) ||
        (rc = get_int(file, root, "num_attention_heads", true, 0, 1, 4096, &cfg->n_heads, err)) ||
        (rc = get_int(file, root, "num_key_value_heads", false, cfg->n_heads, 1, 4096, &cfg->n_kv_heads, err)) ||
        (rc = get_int(file, root, "max_position_embeddings", false, 2048, 1, 1 << 30, &cfg->max_pos, err)))
        goto done;
    if ((rc = get_int(file, root, "head_dim", false, cfg->hidden_size / cfg->n_heads, 1, 4096, &cfg->head_dim, err)))
        goto done;
    if (cfg->head_dim < 2 || cfg->head_dim % 2) {
        rc = ember_err(err, EMBER_ERR_FORMAT, "%s: head_dim %d must be even and at least 2", file, cfg->head_dim);
        goto done;
    }
    if (cfg->n_heads % cfg->n_kv_heads) {
        rc = ember_err(err, EMBER_ERR_FORMAT, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                       file, cfg->n_heads, cfg->n_kv_heads);
        goto done;
    }
    double eps;
    if ((rc = get_num(file, root, "rms_norm_eps", false, 1e-6, 0.0, 1.0, &eps, err))) goto done;
    cfg->rms_norm_eps = (float)eps;
    const bool g4 = strcmp(mt, "gemma4_text") == 0; /* gemma4.c: gemma's conventions, its own fields */
    const bool gemma = ember_arch_is_gemma(mt) || g4;
    const char *act;
    /* gemma reads hidden_activation (gelu_pytorch_tanh when absent), the others hidden_act (silu) */
    const char *act_key = gemma ? "hidden_activation" : "hidden_act", *act_want = gemma ? "gelu_pytorch_tanh" : "silu";
    if ((rc = get_str(file, root, act_key, &act, err))) goto done;
    if (act && strcmp(act, act_want) != 0) {
        rc = ember_err(err, EMBER_ERR_UNSUPPORTED, "%s: %s '%.32s' is not supported for %s (only %s)", file, act_key,
                       act, mt, act_want);
        goto done;
    }
    cfg->act = gemma ? EMBER_ACT_GELU_TANH : EMBER_ACT_SILU;
    if ((rc = get_bool(file, root, "tie_word_embeddings", gemma, &cfg->tie_embeddings, err))) goto done;
    bool attention_bias = false;
    if ((rc = get_bool(file, root, "attention_bias", false, &attention_bias, err)) ||
        (rc = get_bool(file, root, "mlp_bias", false, &cfg->mlp_bias, err)))
        goto done;
    if (strcmp(mt, "qwen2") == 0) {
        cfg->attn_bias = true; /* Qwen2 always has q/k/v biases, no o bias */
    } else if (strcmp(mt, "mistral") != 0 && strcmp(mt, "phi3") != 0) {
        cfg->attn_bias = attention_bias; /* llama / qwen3: q, k, v and o */
        cfg->attn_out_bias = attention_bias;
    }
    if (strcmp(mt, "llama") != 0) cfg->mlp_bias = false;
    cfg->qk_norm = strcmp(mt, "qwen3") == 0 || strcmp(mt, "qwen3_moe") == 0 || strcmp(mt, "gemma3_text") == 0;
    const bool glm = strcmp(mt, "glm4_moe") == 0;
    if (glm) {
        cfg->attn_out_bias = false; /* glm4_moe: q, k, v biases only */
        if ((rc = get_bool(file, root, "use_qk_norm", false, &cfg->qk_norm, err))) goto done;
    }
    const bool hybrid = strcmp(mt, "qwen3_next") == 0 || strcmp(mt, "qwen3_5_text") == 0 ||
                        strcmp(mt, "qwen3_5_moe_text") == 0;
    if ((glm || strcmp(mt, "qwen3_moe") == 0 || (hybrid && strcmp(mt, "qwen3_5_text") != 0)) &&
        (rc = parse_moe(file, root, cfg, err)))
        goto done;
    if (hybrid && strcmp(mt, "qwen3_next") != 0) cfg->norm_topk_prob = true; /* Qwen3.5 MoE always renormalises */
    if (gemma && !g4 && (rc = parse_gemma(file, root, cfg, err))) goto done;
    if ((rc = parse_rope(file, root, cfg, err)) || (rc = parse_windows(file, root, cfg, err))) goto done;
    if (g4 && (rc = parse_gemma4(file, root, cfg, err))) goto done;
    if (hybrid && (rc = parse_hybrid(file, root, cfg, err))) goto done;
    if ((rc = parse_quant(file, root, cfg, err)) || (rc = parse_eagle3(file, root, cfg, err)) ||
        (rc = parse_dflash(file, root, cfg, err)))
        goto done;
    if ((rc = get_bos(file, root, cfg, err)) || (rc = get_eos(file, root, cfg, err))) goto done;
done:
    json_decref(root);
    return rc;
}

int ember_generation_config_parse(const char *file, const char *text, size_t len, ember_model_config *cfg,
                                  ember_error *err) {
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return ember_err(err, EMBER_ERR_FORMAT, "%s: not valid JSON: %s (line %d, column %d)", file, je.text, je.line,
                         je.column);
    int rc = EMBER_OK;
    if (!json_is_object(root))
        rc = ember_err(err, EMBER_ERR_FORMAT, "%s: not a JSON object", file);
    else if (!(rc = get_bos(file, root, cfg, err)))
        rc = get_eos(file, root, cfg, err);
    json_decref(root);
    return rc;
}

int ember_config_load(const char *dir, ember_model_config *cfg, ember_error *err) {
    char *path = ember_path_join(dir, "config.json");
    char *gpath = ember_path_join(dir, "generation_config.json");
    char *text = NULL;
    size_t len;
    int rc;
    if (!path || !gpath) {
        rc = ember_err(err, EMBER_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((rc = ember_read_file(path, MAX_CONFIG_BYTES, &text, &len, err))) goto done;
    if ((rc = ember_config_parse(path, text, len, cfg, err))) goto done;
    free(text);
    text = NULL;
    struct stat st;
    if (stat(gpath, &st) == 0) { /* optional, but checked when present */
        if ((rc = ember_read_file(gpath, MAX_CONFIG_BYTES, &text, &len, err))) goto done;
        rc = ember_generation_config_parse(gpath, text, len, cfg, err);
    }
done:
    free(text);
    free(path);
    free(gpath);
    return rc;
}
