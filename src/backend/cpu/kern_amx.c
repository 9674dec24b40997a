/*
 * kern_amx.c - the AVX-512 VNNI kernels built once more with AMX-INT8
 * tiles for the quantized matmuls of several rows (kern_qamx.h). Built with
 * -mamx-tile -mamx-int8 and only used once ember_cpu_amx_ready() says the
 * CPU has AMX and the OS granted the tile state (cpu_backend.c picks it
 * for EMBER_ISA_AMX). Results are bit-identical to every other table.
 */
#define EMBER_VNNI 1
#define EMBER_AMX 1
#define AVX512_TABLE ember_cpu_kernels_amx
#define AVX512_VARIANT "amx"
#define AVX512_ISA EMBER_ISA_AMX
#include "kern_avx512.c"
