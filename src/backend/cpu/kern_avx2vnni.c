/*
 * kern_avx2vnni.c - the AVX2 kernels built again with AVX-VNNI (the VEX
 * vpdpbusd of Alder Lake and later Intel cores and of AMD Zen 4 and later)
 * for the quantized dot products. Built with -mavxvnni and only used when
 * the CPU reports avxvnni (cpu_backend.c picks it for the AVX2 tier).
 * Results are bit-identical to the plain AVX2, AVX-512 and scalar kernels:
 * the integer partial sums are exact either way (qkern.h).
 */
#define EMBER_VNNI 1
#define AVX2_TABLE ember_cpu_kernels_avx2vnni
#define AVX2_VARIANT "avx2-vnni"
#include "kern_avx2.c"
