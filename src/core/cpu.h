/*
 * cpu.h - what the running CPU can do, for runtime kernel dispatch.
 */
#ifndef EMBER_CORE_CPU_H
#define EMBER_CORE_CPU_H

#include <stdbool.h>

#include "ember.h"

typedef struct ember_cpu_features {
    bool avx2, fma, f16c;
    bool avx512f, avx512bw, avx512vl, avx512dq;
    bool avx512bf16, avx512vnni, avxvnni;
    bool amx_tile, amx_int8, amx_bf16; /* CPUID and XCR0 (tile state) only */
} ember_cpu_features;

/* Reads the features of the running CPU (and OS support for their state). */
void ember_cpu_detect(ember_cpu_features *f);

/* true once the process may use AMX tiles: the CPU has AMX-TILE, AMX-INT8
   and AMX-BF16 with AVX-512 VNNI and BF16 (every CPU with AMX so far), the OS enables the tile state in XCR0, and
   (Linux) the kernel granted this process the tile data permission
   (arch_prctl ARCH_REQ_XCOMP_PERM, asked once, on the first call; the
   grant is process-wide). Thread-safe. */
bool ember_cpu_amx_ready(void);

/* true if the running CPU can execute kernels of the given ISA. */
bool ember_isa_supported(ember_isa isa);

/* Number of online CPU cores (at least 1). */
int ember_cpu_count(void);

#endif
