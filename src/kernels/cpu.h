/* CPU features the SIMD kernels need, read once with CPUID (x86-64; elsewhere all false).
 * A feature counts only when the OS saves its registers too (XGETBV). */
#ifndef MA_CPU_H
#define MA_CPU_H

int ma_cpu_avx2_fma_f16c(void); /* AVX2 + FMA + F16C */
int ma_cpu_avx512f(void);
int ma_cpu_avx512_vnni_vbmi(void); /* AVX512-VNNI + AVX512-VBMI + AVX512BW */
/* AMX-TILE + AMX-BF16 + AVX512-BF16/BW, with the tile state granted to this process (Linux
 * asks for it once, with arch_prctl) */
int ma_cpu_amx_bf16(void);
/* the vendor is Intel: its cores convert f16 -> f32 (VCVTPH2PS) on the two FMA ports (2 uops for
 * 16 lanes), AMD's Zen 4 / Zen 5 beside them; the GEMM uses it to pick where panels are converted */
int ma_cpu_intel(void);

#endif
