/* SPDX-License-Identifier: Apache-2.0 */
#define _DEFAULT_SOURCE /* syscall(), for arch_prctl */
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

int ma_cpu_avx512_vnni_vbmi(void) {
    unsigned a, b, c, d;
    if (!ma_cpu_avx512f() || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return ((b >> 30) & 1) && ((c >> 1) & 1) && ((c >> 11) & 1); /* AVX512BW, VBMI, VNNI */
}

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
static int os_grants_tiles(void) { return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0; }
#else
static int os_grants_tiles(void) { return 0; }
#endif

int ma_cpu_amx_bf16(void) {
    unsigned a, b, c, d;
    if (!ma_cpu_avx512f() || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    const int bw = (b >> 30) & 1, amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
    if (!bw || !amx_bf16 || !amx_tile || !__get_cpuid_count(7, 1, &a, &b, &c, &d) || !((a >> 5) & 1)) return 0;
    if ((xgetbv0() & 0x60000) != 0x60000) return 0; /* XTILECFG and XTILEDATA enabled by the OS */
    return os_grants_tiles();
}

int ma_cpu_avx512_bf16(void) {
    unsigned a, b, c, d;
    if (!ma_cpu_avx512f() || !__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((b >> 30) & 1)) return 0; /* AVX512BW */
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 5) & 1);
}

int ma_cpu_intel(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return 0;
    return b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu; /* "Genu" "ineI" "ntel" */
}
#else
int ma_cpu_avx2_fma_f16c(void) { return 0; }
int ma_cpu_intel(void) { return 0; }
int ma_cpu_avx512f(void) { return 0; }
int ma_cpu_avx512_vnni_vbmi(void) { return 0; }
int ma_cpu_amx_bf16(void) { return 0; }
int ma_cpu_avx512_bf16(void) { return 0; }
#endif

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
/* the kernel's HWCAP bits (asm/hwcap.h): asimddp 1 << 20 */
int ma_cpu_arm_dotprod(void) { return (getauxval(AT_HWCAP) >> 20) & 1; }
/* asimdhp 1 << 10: FP16 arithmetic on vectors */
int ma_cpu_arm_fp16(void) { return (getauxval(AT_HWCAP) >> 10) & 1; }
#else
int ma_cpu_arm_dotprod(void) { return 0; }
int ma_cpu_arm_fp16(void) { return 0; }
#endif

int ma_cache_flush(const void *p, unsigned long n) {
    const unsigned long line = 64; /* the smallest line of the CPUs we run on; a larger one is hit more than once */
    const char *c = (const char *)((unsigned long)p & ~(line - 1)), *end = (const char *)p + n;
#if defined(__x86_64__)
    for (; c < end; c += line) __asm__ volatile("clflush (%0)" ::"r"(c) : "memory");
    __asm__ volatile("mfence" ::: "memory");
    return 1;
#elif defined(__aarch64__)
    for (; c < end; c += line) __asm__ volatile("dc civac, %0" ::"r"(c) : "memory");
    __asm__ volatile("dsb ish" ::: "memory");
    return 1;
#else
    (void)c, (void)end;
    return 0;
#endif
}
