/* cpu.c - CPU feature detection through the compiler's cpuid wrappers. */
#define _POSIX_C_SOURCE 200809L
#include "cpu.h"

#include <unistd.h>

void ember_cpu_detect(ember_cpu_features *f) {
    *f = (ember_cpu_features){0};
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    f->avx2 = __builtin_cpu_supports("avx2");
    f->fma = __builtin_cpu_supports("fma");
    f->f16c = __builtin_cpu_supports("f16c");
    f->avx512f = __builtin_cpu_supports("avx512f");
    f->avx512bw = __builtin_cpu_supports("avx512bw");
    f->avx512vl = __builtin_cpu_supports("avx512vl");
    f->avx512dq = __builtin_cpu_supports("avx512dq");
    f->avx512bf16 = __builtin_cpu_supports("avx512bf16");
    f->avx512vnni = __builtin_cpu_supports("avx512vnni");
    f->avxvnni = __builtin_cpu_supports("avxvnni");
#endif
}

bool ember_isa_supported(ember_isa isa) {
    ember_cpu_features f;
    ember_cpu_detect(&f);
    switch (isa) {
    case EMBER_ISA_AUTO:
    case EMBER_ISA_SCALAR: return true;
    case EMBER_ISA_AVX2: return f.avx2 && f.fma && f.f16c;
    case EMBER_ISA_AVX512:
        return f.avx2 && f.fma && f.f16c && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
    }
    return false;
}

ember_isa ember_isa_detect(void) {
    if (ember_isa_supported(EMBER_ISA_AVX512)) return EMBER_ISA_AVX512;
    if (ember_isa_supported(EMBER_ISA_AVX2)) return EMBER_ISA_AVX2;
    return EMBER_ISA_SCALAR;
}

const char *ember_isa_name(ember_isa isa) {
    switch (isa) {
    case EMBER_ISA_AUTO: return "auto";
    case EMBER_ISA_SCALAR: return "scalar";
    case EMBER_ISA_AVX2: return "avx2";
    case EMBER_ISA_AVX512: return "avx512";
    }
    return "unknown";
}

int ember_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}
