/*
 * config.h - a model's hyper-parameters from HuggingFace config.json (hub
 * format and the transformers 5 format) and generation_config.json.
 *
 * Every field is type-checked and range-checked; errors name the file and
 * the field ("config.json: field 'hidden_size' must be an integer, got
 * string").
 */
#ifndef EMBER_FORMATS_CONFIG_H
#define EMBER_FORMATS_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"

#define EMBER_MAX_LAYERS 1024
#define EMBER_MAX_EOS 8

typedef enum ember_rope_type {
    EMBER_ROPE_DEFAULT = 0,
    EMBER_ROPE_LINEAR,
    EMBER_ROPE_LLAMA3,
    EMBER_ROPE_YARN,
    EMBER_ROPE_PROPORTIONAL /* gemma4: the first partial_rotary_factor * head_dim / 2 pairs rotate with
                               frequencies of the whole head (theta^(-2i / head_dim)), the rest not at all */
} ember_rope_type;

typedef struct ember_rope_config {
    ember_rope_type type;
    double theta;
    double partial_rotary_factor; /* 1: rotate the whole head */
    double factor;                /* linear, llama3, yarn */
    double low_freq_factor, high_freq_factor; /* llama3 */
    int original_max_pos;         /* llama3, yarn */
    double beta_fast, beta_slow;  /* yarn */
    double mscale, mscale_all_dim; /* yarn; 0 = unset */
    double attention_factor;      /* yarn; < 0 = derive from factor */
    bool truncate;                /* yarn */
} ember_rope_config;

/* MLX affine quantization from config.json "quantization" (or its copy
   "quantization_config"); formats/mlx_quant.h describes the format. */
/* per layer: q (phi3: qkv), k, v, o, gate (phi3: gate_up), up, down projections; then the MoE block's
   modules in mlx-lm's names: the router (mlp.gate; gemma4 router.proj), the stacked experts
   (mlp.switch_mlp.{gate,up,down}_proj; gemma4 experts.switch_glu.*) and the shared expert
   (mlp.shared_experts.{gate,up,down}_proj); then gemma4's per-layer input modules
   (per_layer_input_gate, per_layer_projection) */
#define EMBER_QUANT_LAYER_MODULES 16
#define EMBER_QUANT_FLOAT 1         /* override code: the module stays float */

typedef struct ember_quant_config {
    int bits, group_size; /* the defaults; bits 0: no quantization in config.json */
    /* per-module overrides: 0 none, EMBER_QUANT_FLOAT, or bits | (group_size / 32) << 4 */
    uint8_t embed, lm_head;
    uint8_t ple_embed, ple_proj; /* gemma4: model.embed_tokens_per_layer, model.per_layer_model_projection */
    uint8_t layer[EMBER_MAX_LAYERS][EMBER_QUANT_LAYER_MODULES];
} ember_quant_config;

typedef enum ember_qmod_kind {
    EMBER_QMOD_DEFAULT = 0, /* no entry: quantized with the defaults iff "<module>.scales" exists */
    EMBER_QMOD_FLOAT,       /* entry false: the module is a float matrix */
    EMBER_QMOD_QUANT        /* entry true or an object: quantized with the given parameters */
} ember_qmod_kind;

/* The MLP's activation: down(act(gate(x)) * up(x)). */
typedef enum ember_act {
    EMBER_ACT_SILU = 0,  /* SwiGLU */
    EMBER_ACT_GELU_TANH  /* GeGLU, gelu_pytorch_tanh (gemma) */
} ember_act;

typedef struct ember_model_config {
    char model_type[32]; /* a model_type of the family table (formats/arch.h) */
    int vocab_size;
    int hidden_size;
    int intermediate_size;
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int max_pos;
    float rms_norm_eps;
    ember_rope_config rope;
    bool tie_embeddings;
    bool attn_bias; /* q/k/v biases (qwen2 always) */
    bool attn_out_bias;
    bool mlp_bias;
    bool qk_norm; /* qwen3, gemma3_text */
    ember_act act;
    /* gemma: attention scale query_pre_attn_scalar^-0.5 (0: head_dim^-0.5),
       tanh soft-capping of attention scores and of the final logits (0: none) */
    float query_pre_attn_scalar;
    float attn_softcap, final_softcap;
    /* RoPE of sliding-window layers where it differs (gemma3: rope_local_base_freq
       or rope_parameters.sliding_attention); equal to rope otherwise */
    ember_rope_config rope_local;
    /* mixture of experts (qwen3_moe, glm4_moe): n_experts routed experts of
       which n_experts_used (top-k) run per token, each a gated MLP of width
       moe_intermediate_size; 0 experts: a dense model */
    int n_experts, n_experts_used, moe_intermediate_size;
    bool norm_topk_prob;                /* renormalise the top-k routing weights to sum 1 */
    bool router_sigmoid;                /* glm4_moe: sigmoid scores, e_score_correction_bias for selection */
    int n_group, topk_group;            /* glm4_moe: experts in n_group groups, top-k within the best topk_group */
    float routed_scale;                 /* glm4_moe routed_scaling_factor (1 otherwise) */
    int n_shared_experts;               /* a shared expert of width n_shared * moe_intermediate_size; 0: none */
    int n_mtp_layers;                   /* glm4_moe num_nextn_predict_layers: stored after the decoder layers, not run */
    bool layer_moe[EMBER_MAX_LAYERS];   /* per layer: the MLP is the MoE block (else the dense one) */
    int layer_window[EMBER_MAX_LAYERS]; /* per layer: sliding window, 0 = full */
    bool layer_sliding[EMBER_MAX_LAYERS]; /* per layer: a sliding_attention layer (uses rope_local) */
    /* hybrid linear attention (qwen3_next, qwen3_5_text, qwen3_5_moe_text):
       gated DeltaNet layers beside gated full-attention layers */
    bool layer_linear[EMBER_MAX_LAYERS]; /* per layer: a linear-attention (DeltaNet) layer */
    int n_linear;                       /* how many */
    int lin_conv_k;                     /* linear_conv_kernel_dim */
    int lin_k_heads, lin_v_heads;       /* linear_num_key_heads, linear_num_value_heads */
    int lin_k_dim, lin_v_dim;           /* linear_key_head_dim, linear_value_head_dim */
    bool lin_v_tiled;                   /* value heads in llama.cpp's tiled order (GGUF qwen35 / qwen35moe):
                                           head h reads key head h % Hk, not h / (Hv / Hk) */
    int mrope_section[4], n_mrope;      /* rope_parameters.mrope_section (Qwen3.5; equal to plain RoPE for text) */
    bool attn_output_gate;              /* q_proj is 2x wide: per head, q then a sigmoid gate on the output */
    int shared_expert_size;             /* shared_expert_intermediate_size: a sigmoid-gated shared expert; 0: none */
    int mtp_layers;                     /* mtp_num_hidden_layers (-1: absent): the MTP head's layers (mtp.*, model/mtp.c) */
    bool mtp;                           /* this config is a hybrid's MTP head (model/mtp.c), not a model of its own */
    bool text_of_multimodal;            /* the text model of a multimodal checkpoint (its config's
                                           text_config; weights model.language_model.* or
                                           language_model.model.*, ember_weights_use_text_model) */
    int bos_id;                         /* -1 if none */
    int n_eos;
    int eos_ids[EMBER_MAX_EOS];
    ember_quant_config quant;
    /* gemma4_text (gemma4.c): per-layer attention shapes (per_layer_config, or the hub's
       global_head_dim / num_global_key_value_heads; 0: head_dim / n_kv_heads), keys reused as
       values on full-attention layers, KV sharing, per-layer input embeddings (PLE), double-wide
       MLPs and the MoE block beside the dense MLP. Read them through the ember_cfg_* helpers. */
    int layer_head_dim[EMBER_MAX_LAYERS];
    int layer_kv_heads[EMBER_MAX_LAYERS];
    int layer_kv_src[EMBER_MAX_LAYERS]; /* KV-shared layers: the layer whose K/V they attend over */
    bool attn_k_eq_v;       /* attention_k_eq_v: full-attention layers have no v_proj, v = k */
    int n_kv_shared;        /* num_kv_shared_layers: the last n layers compute no K/V of their own */
    int ple_dim, ple_vocab; /* hidden_size_per_layer_input, vocab_size_per_layer_input; 0: no PLE */
    bool double_wide_mlp;   /* use_double_wide_mlp: KV-shared layers' MLP is 2 * intermediate_size wide */
    bool moe_beside_mlp;    /* enable_moe_block: the MoE block runs beside the dense MLP on every layer */
    /* an EAGLE-3 draft model (model/eagle3.c): architectures naming Eagle3, or draft_vocab_size
       present. One decoder layer (midlayer.*) over fc(the target's taps); its lm_head has
       e3_draft_vocab rows, mapped to the target's ids by d2t */
    bool eagle3;
    int e3_draft_vocab;     /* draft_vocab_size (vocab_size when absent) */
    int e3_target_hidden;   /* target_hidden_size (hidden_size when absent): the width of one tap */
    bool e3_target_hidden_set; /* target_hidden_size was in the config */
    int e3_n_aux;           /* eagle_config.eagle_aux_hidden_state_layer_ids (0: the target's
                               default, layers 2, N / 2, N - 3): the residual stream entering them */
    int e3_aux[8];
    /* a DFlash draft model (model/dflash.c): architectures naming DFlash, or dflash_config present.
       Qwen3 layers (layers.*, no embedding or head of its own) over fc(the target's taps) */
    bool dflash;
    int df_block;           /* block_size: tokens per round (the last known one and block - 1 masks) */
    int df_mask_id;         /* dflash_config.mask_token_id */
    int df_n_target;        /* num_target_layers (0: absent) */
    int df_n_ids;           /* dflash_config.target_layer_ids (0: the default spread over num_target_layers) */
    int df_ids[16];
} ember_model_config;

/* Layer l's head size, KV heads, MLP width, and the layer whose KV cache it
   reads and writes (itself unless KV-shared): per-layer values where the
   family has them (gemma4_text), the model's otherwise. */
static inline int ember_cfg_head_dim(const ember_model_config *c, int l) {
    return c->layer_head_dim[l] > 0 ? c->layer_head_dim[l] : c->head_dim;
}
static inline int ember_cfg_kv_heads(const ember_model_config *c, int l) {
    return c->layer_kv_heads[l] > 0 ? c->layer_kv_heads[l] : c->n_kv_heads;
}
static inline bool ember_cfg_kv_shared(const ember_model_config *c, int l) {
    return c->n_kv_shared > 0 && l >= c->n_layers - c->n_kv_shared;
}
static inline int ember_cfg_kv_layer(const ember_model_config *c, int l) {
    return ember_cfg_kv_shared(c, l) ? c->layer_kv_src[l] : l;
}
static inline int ember_cfg_intermediate(const ember_model_config *c, int l) {
    return c->double_wide_mlp && ember_cfg_kv_shared(c, l) ? 2 * c->intermediate_size : c->intermediate_size;
}

/* Whether config.json's model_type names a family Ember runs (a row of the
   family table, formats/arch.h). */
bool ember_config_model_type_supported(const char *model_type);

/* Parses config.json text. name is used in messages. */
int ember_config_parse(const char *name, const char *text, size_t len, ember_model_config *cfg,
                       ember_error *err);

/* Applies generation_config.json text (eos / bos ids) to cfg. */
int ember_generation_config_parse(const char *name, const char *text, size_t len,
                                  ember_model_config *cfg, ember_error *err);

/* How module `path` ("model.layers.3.mlp.down_proj", "lm_head",
   "model.embed_tokens") is quantized; *bits and *group_size receive its
   parameters (the defaults for EMBER_QMOD_DEFAULT; 0 when the config has no
   quantization). Paths that are not the matrices of EMBER_QUANT_LAYER_MODULES
   (or the embedding, lm_head, gemma4's model.embed_tokens_per_layer and
   model.per_layer_model_projection) give DEFAULT. */
ember_qmod_kind ember_config_quant_module(const ember_model_config *cfg, const char *path, int *bits, int *group_size);

/* A hybrid model's fields that follow from cfg->layer_linear (set from
   config.json or GGUF): n_linear, and the attention layers' q/k norms and
   output gate, which every hybrid family has. */
void ember_config_hybrid_layers(ember_model_config *cfg);

/* Reads DIR/config.json and, if present, DIR/generation_config.json. */
int ember_config_load(const char *dir, ember_model_config *cfg, ember_error *err);

#endif
