/*
 * kern_mlx_avx2vnni.c - the AVX2 MLX gemm again, with AVX-VNNI's vpdpbusd
 * computing the exact lane partials (kern_mlx_avx2.c explains the kernel).
 * Built with -mavxvnni in addition to the AVX2 flags; used with the
 * avx2-vnni kernel table.
 */
#define MLX_AVXVNNI 1
#include "kern_mlx_avx2.c"
