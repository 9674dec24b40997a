/*
 * kern_mlx_avx512vnni.c - the AVX-512 MLX gemm again, with VNNI's
 * vpdpbusd computing the exact lane partials (kern_mlx_avx512.c explains
 * the kernel). Built with -mavx512vnni in addition to the AVX-512 flags.
 */
#define MLX_VNNI 1
#define MLX_AVX512_NAME cpu_mlx_gemm_avx512vnni
#include "kern_mlx_avx512.c"
