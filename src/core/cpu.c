/* cpu.c - CPU feature detection through the compiler's cpuid wrappers. */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* syscall */
#include "cpu.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

/* Reads CPUID directly (not the compiler's feature-name builtins, whose
   names differ between compilers) and checks with XGETBV that the OS saves
   the AVX and AVX-512 register state. With EMBER_CPU_NO_VNNI set in the
   environment it reports a CPU without AVX-VNNI, AVX512-VNNI and AMX (the
   kernels' A/B switch: the same binary as on an older CPU of the tier). */
void ember_cpu_detect(ember_cpu_features *f) {
    *f = (ember_cpu_features){0};
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    bool osxsave = c >> 27 & 1, avx = c >> 28 & 1;
    bool fma = c >> 12 & 1, f16c = c >> 29 & 1;
    uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    bool ymm = avx && (xcr0 & 0x6) == 0x6;    /* SSE and AVX state */
    bool zmm = ymm && (xcr0 & 0xe0) == 0xe0;  /* opmask, ZMM_Hi256, Hi16_ZMM */
    f->fma = ymm && fma;
    f->f16c = ymm && f16c;
    unsigned max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf < 7) return;
    __cpuid_count(7, 0, a, b, c, d);
    unsigned sub_max = a;
    f->avx2 = ymm && (b >> 5 & 1);
    f->avx512f = zmm && (b >> 16 & 1);
    f->avx512dq = zmm && (b >> 17 & 1);
    f->avx512bw = zmm && (b >> 30 & 1);
    f->avx512vl = zmm && (b >> 31 & 1);
    f->avx512vnni = zmm && (c >> 11 & 1);
    bool tiles = (xcr0 & 0x60000) == 0x60000; /* XTILECFG and XTILEDATA */
    f->amx_tile = tiles && (d >> 24 & 1);
    f->amx_int8 = f->amx_tile && (d >> 25 & 1);
    f->amx_bf16 = f->amx_tile && (d >> 22 & 1);
    if (sub_max >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        f->avxvnni = ymm && (a >> 4 & 1);
        f->avx512bf16 = zmm && (a >> 5 & 1);
    }
    if (getenv("EMBER_CPU_NO_VNNI")) /* a CPU without VNNI, for A/B runs */
        f->avx512vnni = f->avxvnni = f->amx_tile = f->amx_int8 = f->amx_bf16 = false;
#endif
}

static bool amx_ok;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

/* Asks Linux for the tile data state (ARCH_REQ_XCOMP_PERM = 0x1023,
   XFEATURE_XTILEDATA = 18); without the grant the first tile instruction
   would kill the process with SIGILL. */
static void amx_init(void) {
    ember_cpu_features f;
    ember_cpu_detect(&f);
    if (!(f.amx_tile && f.amx_int8 && f.amx_bf16 && f.avx512bf16 && f.avx512vnni && f.avx512f && f.avx512bw &&
          f.avx512vl && f.avx512dq))
        return;
#if defined(__linux__) && defined(__x86_64__) && defined(SYS_arch_prctl)
    amx_ok = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#endif
}

bool ember_cpu_amx_ready(void) {
    pthread_once(&amx_once, amx_init);
    return amx_ok;
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
    case EMBER_ISA_AMX: return ember_isa_supported(EMBER_ISA_AVX512) && ember_cpu_amx_ready();
    }
    return false;
}

ember_isa ember_isa_detect(void) {
    if (ember_isa_supported(EMBER_ISA_AMX)) return EMBER_ISA_AMX;
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
    case EMBER_ISA_AMX: return "amx";
    }
    return "unknown";
}

int ember_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}
