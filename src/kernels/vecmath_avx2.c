/* SPDX-License-Identifier: Apache-2.0 */
/* AVX2 + FMA elementwise math (compiled with -mavx2 -mfma): vecmath_simd.h on 8 floats. */
#include <immintrin.h>
#include <math.h>

#include "kernels/vecmath.h"

#define VW 8
#define VF __m256
#define V_LOAD _mm256_loadu_ps
#define V_STORE _mm256_storeu_ps
#define V_SET1 _mm256_set1_ps
#define V_ZERO _mm256_setzero_ps
#define V_ADD _mm256_add_ps
#define V_MUL _mm256_mul_ps
#define V_DIV _mm256_div_ps
#define V_MAX _mm256_max_ps
#define V_MIN _mm256_min_ps
#define V_FMADD _mm256_fmadd_ps
#define V_FMSUB _mm256_fmsub_ps
#define V_FNMADD _mm256_fnmadd_ps
#define V_ROUND(x) _mm256_round_ps((x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
/* 2^(n-1) for integral n */
#define V_POW2M1(n) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(126)), 23))
#define V_ZERO_BELOW(p, x, lo) _mm256_andnot_ps(_mm256_cmp_ps((x), (lo), _CMP_LT_OQ), (p))
#define INSTALL ma_vecmath_install_avx2

static inline float V_HSUM(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float V_HMAX(__m256 m) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* eight doubles as two vectors (lanes 0-3, 4-7) */
typedef struct {
    __m256d lo, hi;
} D8;
static inline D8 D8_ZERO(void) { return (D8){_mm256_setzero_pd(), _mm256_setzero_pd()}; }
static inline D8 D8_SET1(double x) { return (D8){_mm256_set1_pd(x), _mm256_set1_pd(x)}; }
static inline D8 D8_ADD(D8 a, D8 b) { return (D8){_mm256_add_pd(a.lo, b.lo), _mm256_add_pd(a.hi, b.hi)}; }
static inline D8 D8_SUB(D8 a, D8 b) { return (D8){_mm256_sub_pd(a.lo, b.lo), _mm256_sub_pd(a.hi, b.hi)}; }
static inline D8 D8_MUL(D8 a, D8 b) { return (D8){_mm256_mul_pd(a.lo, b.lo), _mm256_mul_pd(a.hi, b.hi)}; }
static inline D8 D8_FROM_F32(const float *p) { return (D8){_mm256_cvtps_pd(_mm_loadu_ps(p)), _mm256_cvtps_pd(_mm_loadu_ps(p + 4))}; }
static inline void D8_STORE(double *p, D8 v) { _mm256_storeu_pd(p, v.lo), _mm256_storeu_pd(p + 4, v.hi); }

#include "kernels/vecmath_simd.h"
