#include "kernels/cpu.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <stdint.h>

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* 1: the OS saves YMM state; 2: and ZMM / opmask state */
static int os_vector_state(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0; /* OSXSAVE */
    const uint64_t x = xgetbv0();
    if ((x & 0x6) != 0x6) return 0;
    return (x & 0xe6) == 0xe6 ? 2 : 1;
}

int ma_cpu_avx2_fma_f16c(void) {
    unsigned a, b, c, d;
    if (os_vector_state() < 1 || !__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const int fma = (c >> 12) & 1, f16c = (c >> 29) & 1, avx = (c >> 28) & 1;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return fma && f16c && avx && ((b >> 5) & 1);
}

int ma_cpu_avx512f(void) {
    unsigned a, b, c, d;
    if (os_vector_state() < 2 || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return (b >> 16) & 1;
}
#else
int ma_cpu_avx2_fma_f16c(void) { return 0; }
int ma_cpu_avx512f(void) { return 0; }
#endif
