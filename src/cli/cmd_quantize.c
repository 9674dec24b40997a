/*
 * cmd_quantize.c - `ember quantize`: writes a quantized copy of an F32 /
 * F16 / BF16 safetensors model, either as a GGUF file (q8_0, q4_0, q4_k_m, f32)
 * that Ember and llama.cpp both load, or as an MLX affine-quantized model
 * directory in the mlx-community layout (mlx2 .. mlx8, mlx_mixed_B_H) that
 * Ember and mlx-lm both load. The tensor type rules are in
 * src/model/quantize.h and src/model/quantize_mlx.h. Runs on the calling
 * thread plus a worker pool.
 */
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "cli.h"
#include "model/quantize.h"
#include "model/quantize_mlx.h"

int cmd_quantize(int argc, char **argv) {
    const char *model = NULL, *type = NULL, *out = NULL, *scale_dtype = NULL;
    int group_size = 64;
    cli_opt opts[] = {
        {"model", 'm', OPT_STR, &model, "DIR", "input model directory (config.json + F32/F16/BF16 safetensors)", 0, 0,
         false},
        {"type", 0, OPT_STR, &type, "TYPE", "q8_0, q4_0, q4_k_m, f32, bf16, f16, mlx2..mlx8 (mlx2, mlx3, mlx4, mlx5, mlx6, mlx8) or mlx_mixed_B_H",
         0, 0, false},
        {"out", 'o', OPT_STR, &out, "PATH", "the GGUF file (q*) or model directory (mlx*) to write", 0, 0, false},
        {"group-size", 0, OPT_INT, &group_size, "N", "mlx types: elements per scale / bias group (32, 64, 128)", 32, 128,
         false},
        {"scale-dtype", 0, OPT_STR, &scale_dtype, "T",
         "mlx types: dtype of scales and biases (f32, f16, bf16; default: each matrix's own)", 0, 0, false},
    };
    cli_cmd cmd = {"quantize", "Write a quantized copy of a model (GGUF file or MLX directory).",
                   "--model DIR --type q8_0|q4_0|q4_k_m|f32|bf16|f16|mlx4|mlx8|... --out PATH",
                   "q4_k_m follows llama.cpp's mix: Q4_K, with Q6_K for the output matrix and for attn_v /\n"
                   "ffn_down (experts' too) of some layers (rows not a multiple of 256 fall back to Q5_0 / Q8_0);\n"
                   "norms, biases and MoE routers stay F32.\n"
                   "f32 writes every tensor as F32 (a lossless GGUF copy); bf16 / f16 write the matrices as BF16 / F16\n"
                   "and the rest as F32 (bf16 is lossless from a bf16 model).\n"
                   "GGUF models without a tokenizer get llama.cpp's 'none' vocabulary of vocab_size dummy tokens.\n"
                   "gemma4_text goes to GGUF as llama.cpp's gemma4: per-layer head sizes, KV heads and MLP widths\n"
                   "as keys, the fused experts as ffn_gate_up_exps / ffn_down_exps, the full layers' proportional\n"
                   "RoPE as rope_freqs.weight, its plain norms as they are.\n"
                   "mlx<B> quantizes every matrix whose rows are whole groups to B bits with mlx-lm's\n"
                   "affine quantizer and writes config.json, model.safetensors and the tokenizer files;\n"
                   "mlx_mixed_B_H is mlx-lm's mixed recipe (H bits for lm_head and some v_proj / down_proj).\n"
                   "MoE models (qwen3_moe, glm4_moe, gemma4_text) get mlx-lm's layout: each layer's experts\n"
                   "stacked into mlp.switch_mlp.{gate,up,down}_proj (gemma4: experts.switch_glu.*) of shape\n"
                   "[experts, rows, cols]; the router as mlx-lm has it: qwen3_moe's mlp.gate and gemma4's\n"
                   "router.proj at 8 bits, group 64 (the low width under mlx_mixed), glm4_moe's stays float.\n"
                   "gemma4 with per-layer inputs: embed_tokens_per_layer, per_layer_model_projection and each\n"
                   "layer's per_layer_input_gate / per_layer_projection are quantized like any matrix (when\n"
                   "their rows are whole groups), their norms stay float, as mlx-lm does.\n"
                   "Not yet for the hybrids (qwen3_next, qwen3_5*) or multimodal checkpoints.",
                   opts, (int)(sizeof opts / sizeof opts[0])};
    int rc = cli_parse(&cmd, argc, argv);
    if (rc) return rc == 2 ? 0 : 1;
    if (!model || !type || !out) return cli_fail("quantize", "--model, --type and --out are required");
    ember_error err = {0};
    ember_qscheme s;
    ember_mlx_qopts mo = {0, group_size, 0, EMBER_DTYPE_INVALID, false};
    if (ember_qscheme_parse(type, &s)) {
        if (ember_quantize_to_gguf(model, out, s, &err)) return cli_fail("quantize", "%s", err.msg);
        return 0;
    }
    if (!ember_mlx_qtype_parse(type, &mo.bits, &mo.high_bits))
        return cli_fail("quantize",
                        "unknown --type '%s' (expected q8_0, q4_0, q4_k_m, f32, bf16, f16, mlx2, mlx3, mlx4, mlx5, mlx6, mlx8 or "
                        "mlx_mixed_B_H)",
                        type);
    if (group_size != 32 && group_size != 64 && group_size != 128)
        return cli_fail("quantize", "--group-size must be 32, 64 or 128");
    if (scale_dtype) {
        mo.scale_dtype = strcmp(scale_dtype, "f32") == 0    ? EMBER_F32
                         : strcmp(scale_dtype, "f16") == 0  ? EMBER_F16
                         : strcmp(scale_dtype, "bf16") == 0 ? EMBER_BF16
                                                            : EMBER_DTYPE_INVALID;
        if (mo.scale_dtype == EMBER_DTYPE_INVALID)
            return cli_fail("quantize", "--scale-dtype must be f32, f16 or bf16");
    }
    if (ember_quantize_to_mlx(model, out, &mo, &err)) return cli_fail("quantize", "%s", err.msg);
    return 0;
}
