# Quantized weights: kernels, GGUF models, quantize round trips, KL bounds.
ember_test(test_qkernels test_qkernels.c)
ember_test(test_quant_models test_quant_models.c)
# MLX affine group-wise quantization: format, kernels, models, KL bounds.
ember_test(test_mlx test_mlx.c)
