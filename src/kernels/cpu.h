/* SPDX-License-Identifier: Apache-2.0 */
/* CPU features the SIMD kernels need, read with CPUID (x86-64) or the kernel's HWCAP (aarch64).
 * A feature counts only when the OS saves its registers too (XGETBV). */
#ifndef MA_CPU_H
#define MA_CPU_H

int ma_cpu_avx2_fma_f16c(void); /* AVX2 + FMA + F16C */
int ma_cpu_avx512f(void);
int ma_cpu_avx512_vnni_vbmi(void); /* AVX512-VNNI + AVX512-VBMI + AVX512BW */
/* AMX-TILE + AMX-BF16 + AVX512-BF16/BW, with the tile state granted to this process (Linux
 * asks for it once, with arch_prctl) */
int ma_cpu_amx_bf16(void);
int ma_cpu_avx512_bf16(void); /* AVX512-BF16 (VDPBF16PS) + AVX512BW */
/* the vendor is Intel: its cores convert f16 -> f32 (VCVTPH2PS) on the two FMA ports (2 uops for
 * 16 lanes), AMD's Zen 4 / Zen 5 beside them; the GEMM uses it to pick where panels are converted */
int ma_cpu_intel(void);
/* aarch64 (Linux, from getauxval(AT_HWCAP)): the dot-product instructions (asimddp: SDOT/UDOT);
 * Advanced SIMD itself is part of every aarch64 CPU */
int ma_cpu_arm_dotprod(void);
/* aarch64: FP16 arithmetic on vectors (asimdhp: FMLA on eight halves; Cortex-A55/A75 and later) */
int ma_cpu_arm_fp16(void);
/* write back and drop [p, p + n) from every cache level (x86-64 CLFLUSH, aarch64 DC CIVAC), so a
 * benchmark can time a pass over weights that come from memory, as they do in the full model;
 * 0 where the CPU has no such instruction (nothing is done; n = 0 only asks) */
int ma_cache_flush(const void *p, unsigned long n);

#endif
