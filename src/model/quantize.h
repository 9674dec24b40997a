/*
 * quantize.h - writing a HuggingFace model (F32 / F16 / BF16 safetensors;
 * llama, mistral, qwen2, qwen3, phi3, gemma2, gemma3_text, gemma4_text,
 * qwen3_moe, glm4_moe, qwen3_next, qwen3_5_text, qwen3_5_moe_text) as a quantized (or
 * plain F32) GGUF file that both Ember and llama.cpp load.
 */
#ifndef EMBER_MODEL_QUANTIZE_H
#define EMBER_MODEL_QUANTIZE_H

#include <stdbool.h>

#include "core/dtype.h"
#include "core/error.h"

typedef enum ember_qscheme {
    EMBER_QSCHEME_Q8_0 = 0,
    EMBER_QSCHEME_Q4_0,
    EMBER_QSCHEME_Q4_K_M,
    EMBER_QSCHEME_F32,  /* every tensor F32: a lossless conversion */
    EMBER_QSCHEME_BF16, /* matrices BF16 (lossless from a bf16 model), the rest F32 */
    EMBER_QSCHEME_F16   /* matrices F16, the rest F32 */
} ember_qscheme;

/* "q8_0", "q4_0", "q4_k_m", "f32", "bf16", "f16" -> scheme; false for other names. */
bool ember_qscheme_parse(const char *name, ember_qscheme *out);

/*
 * The type of one tensor under a scheme, following llama.cpp's
 * llama-quantize rules for these three file types (read in its
 * src/llama-quant.cpp and re-implemented here):
 *   - 1-D tensors (norms, biases, glm4moe's exp_probs_b) stay F32, and so
 *     do the routers (ffn_gate_inp, ffn_gate_inp_shexp) and the hybrids'
 *     ssm_conv1d;
 *   - output.weight, and token_embd.weight when the embeddings are tied
 *     (no output.weight): Q8_0 under q8_0 or when the row length is not a
 *     multiple of the scheme's block, else Q6_K;
 *   - q4_k_m: attn_v.weight and ffn_down.weight (also ffn_down_exps and
 *     ffn_down_shexp: llama.cpp matches "ffn_down") of layer i of n get
 *     Q6_K when i < n/8 or i >= 7n/8 or (i - n/8) % 3 == 2, else Q4_K;
 *     every other matrix Q4_K;
 *   - q4_0 / q8_0: every other matrix Q4_0 / Q8_0;
 *   - f32: every tensor F32;
 *   - bf16 / f16: every other matrix BF16 / F16 (llama.cpp's MOSTLY_BF16 /
 *     MOSTLY_F16), output.weight and token_embd.weight included;
 *   - a K type whose row length is not a multiple of 256 falls back
 *     (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0), and any type whose row
 *     length is not a multiple of its block falls back to F16.
 * gguf_name is the GGUF tensor name, row_len its innermost dimension.
 */
ember_dtype ember_qscheme_type(ember_qscheme s, const char *gguf_name, int ndim, int64_t row_len, int layer,
                               int n_layers, bool tied);

/* Reads the model directory in_dir and writes out_path (GGUF v3). The
   metadata carries what Ember's and llama.cpp's loaders need; a model
   without tokenizer metadata gets tokenizer.ggml.model = "none" and
   ARCH.vocab_size (llama.cpp then creates a dummy vocabulary of that size,
   enough for llama-bench). Llama Q/K rows are permuted to the interleaved
   RoPE layout llama.cpp expects; llama 3 RoPE scaling is written as a
   rope_freqs.weight tensor; Gemma norm weights are stored as 1 + w, as
   llama.cpp's converter does (gguf_model.c lists the gemma keys; Gemma 4's
   plain norms stay as they are, its per-layer shapes go to gemma4 keys, its
   fused experts to ffn_gate_up_exps / ffn_down_exps and its proportional
   RoPE to rope_freqs.weight); experts are stacked into
   ffn_{gate,up,down}_exps [E, rows, cols], and glm4_moe's MTP layers are
   left out. A model llama.cpp's layout cannot hold (a qwen3_moe with dense
   layers or without norm_topk_prob, glm4_moe expert groups, Gemma 4 RoPE
   other than proportional / default, the hybrids' cases in quantize.c) is
   refused naming the field. */
int ember_quantize_to_gguf(const char *in_dir, const char *out_path, ember_qscheme s, ember_error *err);

#endif
