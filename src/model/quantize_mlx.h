/*
 * quantize_mlx.h - writing a HuggingFace model (llama and gemma families,
 * qwen3_moe, glm4_moe, gemma4_text; F32 / F16 / BF16 safetensors) as an
 * MLX affine-quantized model directory in the
 * mlx-community layout, as mlx-lm's converter would (formats/mlx_quant.h
 * describes the format and the quantizer).
 */
#ifndef EMBER_MODEL_QUANTIZE_MLX_H
#define EMBER_MODEL_QUANTIZE_MLX_H

#include <stdbool.h>

#include "core/dtype.h"
#include "core/error.h"

typedef struct ember_mlx_qopts {
    int bits;       /* 2, 3, 4, 5, 6 or 8 */
    int group_size; /* 32, 64 or 128 */
    /* 0, or mlx-lm's mixed recipe (mixed_<bits>_<high_bits>): the v_proj
       and down_proj of layers i < n/8, i >= 7n/8 and (i - n/8) % 3 == 2,
       and lm_head, get high_bits; every quantized module is then listed in
       config.json with its parameters, as mlx-lm writes it. */
    int high_bits;
    /* dtype of scales and biases (F32, F16, BF16), or EMBER_DTYPE_INVALID:
       each matrix's own dtype, as mlx-lm does. */
    ember_dtype scale_dtype;
    /* Quantize only the stacked experts of a MoE model, every other matrix
       stays float (not a format mlx-lm writes: for tests and A/B runs that
       isolate the experts' error; the CLI does not offer it). */
    bool experts_only;
} ember_mlx_qopts;

/* "mlx2" .. "mlx8" (*bits, *high_bits 0) and "mlx_mixed_<b>_<h>"; false
   for other names or unsupported widths. */
bool ember_mlx_qtype_parse(const char *name, int *bits, int *high_bits);

/*
 * Reads the model directory in_dir and writes out_dir (created if missing):
 * config.json (the input's, plus "quantization" and "quantization_config":
 * {"group_size", "bits", "mode": "affine"} and any per-module entries),
 * model.safetensors, and copies of the tokenizer and generation config
 * files that exist. Every 2-D float "<module>.weight" whose rows are whole
 * groups becomes "<module>.weight" (U32 packed codes), "<module>.scales" and
 * "<module>.biases"; other tensors are copied unchanged (lm_head.weight is
 * dropped when the embeddings are tied, rotary inv_freq buffers always).
 * Mixture-of-experts models get mlx-lm's layout: each MoE layer's experts
 * stacked (mlx-lm's sanitize) into "<layer>.mlp.switch_mlp.{gate,up,down}_proj"
 * (gemma4: the fused tensors split into "<layer>.experts.switch_glu.*"), 3-D
 * [E, rows, K * bits / 32] / [E, rows, K / G], or a float [E, rows, K] when
 * the rows are not whole groups; the routers as mlx-lm's model predicates
 * have them (qwen3_moe's mlp.gate and gemma4's router.proj: 8 bits, group
 * 64, listed in config.json; under a mixed recipe, which replaces those
 * predicates in mlx-lm, the recipe's width; glm4_moe's router, not a Linear
 * in mlx-lm, stays float); glm4_moe's MTP layers and gemma4's KV-shared
 * layers' K / V weights are left out, as mlx-lm drops them. gemma4's
 * per-layer input modules are quantized like any other (mlx-lm has no rule
 * for them): embed_tokens_per_layer (an Embedding, quantized along its rows
 * of num_hidden_layers * hidden_size_per_layer_input), per_layer_model_projection
 * and each layer's per_layer_input_gate and per_layer_projection (the
 * latter only when hidden_size_per_layer_input is whole groups); their norms
 * stay float. Refused: hybrid linear-attention models, multimodal
 * checkpoints, already quantized models.
 */
int ember_quantize_to_mlx(const char *in_dir, const char *out_dir, const ember_mlx_qopts *opts, ember_error *err);

#endif
