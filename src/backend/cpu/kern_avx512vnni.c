/*
 * kern_avx512vnni.c - the AVX-512 kernels built again with AVX512-VNNI
 * (vpdpbusd) for the quantized dot products. Built with -mavx512vnni and
 * only used when the CPU reports avx512vnni (cpu_backend.c picks it).
 * Results are bit-identical to the non-VNNI AVX-512 and AVX2 kernels: the
 * integer partial sums are exact either way (qkern.h).
 */
#define EMBER_VNNI 1
#define AVX512_TABLE ember_cpu_kernels_avx512vnni
#define AVX512_VARIANT "avx512-vnni"
#include "kern_avx512.c"
