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
} ember_cpu_features;

/* Reads the features of the running CPU (and OS support for their state). */
void ember_cpu_detect(ember_cpu_features *f);

/* true if the running CPU can execute kernels of the given ISA. */
bool ember_isa_supported(ember_isa isa);

/* Number of online CPU cores (at least 1). */
int ember_cpu_count(void);

#endif
