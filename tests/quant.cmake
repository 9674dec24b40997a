# Quantized weights: kernels, GGUF models, quantize round trips, KL bounds.
ember_test(test_qkernels test_qkernels.c)
ember_test(test_quant_models test_quant_models.c)
# Hybrid linear attention (qwen3next, qwen35, qwen35moe) through GGUF in llama.cpp's layout.
ember_test(test_gguf_hybrid test_gguf_hybrid.c)
# MLX affine group-wise quantization: format, kernels, models, KL bounds.
ember_test(test_mlx test_mlx.c)
# Mixture of experts (qwen3moe, glm4moe) through GGUF in llama.cpp's layout.
ember_test(test_gguf_moe test_gguf_moe.c)
# CPU backend ops through the backend interface (matmul_each against matmul).
ember_test(test_backend_ops test_backend_ops.c)
# bf16 weights on AMX-BF16 tiles (src/backend/cpu/kern_bamx.h): batch invariance,
# precision, packing invisible; skipped without AMX.
ember_test(test_bamx test_bamx.c)
# Weights prepared once at load (backend.h prepare_weight): packed in place, invisible to
# read / get_rows / write, out of memory while preparing, every model matrix prepared.
ember_test(test_prepare test_prepare.c)
# MLX quantization of the mixture-of-experts families (mlx-lm's stacked experts).
ember_test(test_mlx_moe test_mlx_moe.c)
# MLX quantization of Gemma 4 with per-layer inputs (gemma4_text_ple).
ember_test(test_mlx_ple test_mlx_ple.c)
# MLX quantization of phi3, gemma2 and gemma3_text on every ISA: KL, greedy ids, batch invariance.
ember_test(test_mlx_families test_mlx_families.c)
# Gemma 4 (gemma4_text, its PLE and MoE variants) through GGUF in llama.cpp's layout: every
# `ember quantize` type, the reference on every ISA, the file's layout, refusals, batch invariance.
ember_test(test_gguf_gemma4 test_gguf_gemma4.c)
