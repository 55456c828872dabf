/* SPDX-License-Identifier: Apache-2.0 */
/* AVX-512F elementwise math (compiled with -mavx512f): vecmath_simd.h on 16 floats (twice the
 * lanes per instruction, where the CPU runs 512-bit operations at full width, as Zen 5 does). */
#include <immintrin.h>
#include <math.h>

#include "kernels/vecmath.h"

#define VW 16
#define VF __m512
#define V_LOAD _mm512_loadu_ps
#define V_STORE _mm512_storeu_ps
#define V_SET1 _mm512_set1_ps
#define V_ZERO _mm512_setzero_ps
#define V_ADD _mm512_add_ps
#define V_MUL _mm512_mul_ps
#define V_DIV _mm512_div_ps
#define V_MAX _mm512_max_ps
#define V_MIN _mm512_min_ps
#define V_FMADD _mm512_fmadd_ps
#define V_FMSUB _mm512_fmsub_ps
#define V_FNMADD _mm512_fnmadd_ps
#define V_ROUND(x) _mm512_roundscale_ps((x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
/* 2^(n-1) for integral n */
#define V_POW2M1(n) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(126)), 23))
#define V_ZERO_BELOW(p, x, lo) _mm512_maskz_mov_ps(_mm512_cmp_ps_mask((x), (lo), _CMP_NLT_UQ), (p))
#define V_HSUM _mm512_reduce_add_ps
#define V_HMAX _mm512_reduce_max_ps
#define INSTALL ma_vecmath_install_avx512
#define D8 __m512d
#define D8_ZERO _mm512_setzero_pd
#define D8_SET1 _mm512_set1_pd
#define D8_ADD _mm512_add_pd
#define D8_SUB _mm512_sub_pd
#define D8_MUL _mm512_mul_pd
#define D8_FROM_F32(p) _mm512_cvtps_pd(_mm256_loadu_ps(p))
#define D8_STORE _mm512_storeu_pd

#include "kernels/vecmath_simd.h"
