/* AVX2 + FMA elementwise math (compiled with -mavx2 -mfma). */
#include <immintrin.h>
#include <math.h>

#include "kernels/vecmath.h"

/* exp(x): x = n ln2 + r, |r| <= ln2/2; exp(r) by Cephes' expf polynomial; 2^n put into the
 * exponent as 2 * 2^(n-1) so that n = 128 (x up to ln(FLT_MAX)) stays finite. Results below
 * 2^-125 (x < -87) are flushed to 0: they are far under every softmax weight that matters. */
static inline __m256 exp8(__m256 x) {
    const __m256 hi = _mm256_set1_ps(88.72283f), lo = _mm256_set1_ps(-87.0f);
    const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(126)), 23);
    p = _mm256_mul_ps(_mm256_add_ps(p, p), _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(underflow, p);
}

/* x / (1 + exp(-a x)) */
static inline __m256 sigmoid_mul8(__m256 x, float a) {
    const __m256 t = exp8(_mm256_mul_ps(x, _mm256_set1_ps(-a)));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), t));
}

static void silu(float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, sigmoid_mul8(_mm256_loadu_ps(x + i), 1.0f));
    for (; i < n; i++) x[i] = x[i] / (1.0f + expf(-x[i]));
}

static void quick_gelu(float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, sigmoid_mul8(_mm256_loadu_ps(x + i), 1.702f));
    for (; i < n; i++) x[i] = x[i] / (1.0f + expf(-1.702f * x[i]));
}

/* 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3) */
static void gelu_tanh(float *x, int64_t n) {
    const __m256 c = _mm256_set1_ps(0.79788456080286536f), c3 = _mm256_set1_ps(0.044715f), m2 = _mm256_set1_ps(-2.0f);
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 u = _mm256_mul_ps(c, _mm256_fmadd_ps(_mm256_mul_ps(c3, v), _mm256_mul_ps(v, v), v));
        _mm256_storeu_ps(x + i, _mm256_div_ps(v, _mm256_add_ps(one, exp8(_mm256_mul_ps(m2, u)))));
    }
    for (; i < n; i++) {
        float v = x[i];
        x[i] = 0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
    }
}

static float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static float exp_shift_sum(float *x, int64_t n, float shift) {
    const __m256 sh = _mm256_set1_ps(shift);
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), sh));
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float sum = hsum8(acc);
    for (; i < n; i++) { x[i] = expf(x[i] - shift); sum += x[i]; }
    return sum;
}

static float vmax(const float *x, int64_t n) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    float r = _mm_cvtss_f32(s);
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

static void scale(float *x, int64_t n, float s) {
    const __m256 v = _mm256_set1_ps(s);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), v));
    for (; i < n; i++) x[i] *= s;
}

static void mul(float *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
    for (; i < n; i++) y[i] *= x[i];
}

void ma_vecmath_install_avx2(ma_vecmath *v) {
    v->silu = silu;
    v->gelu_tanh = gelu_tanh;
    v->quick_gelu = quick_gelu;
    v->exp_shift_sum = exp_shift_sum;
    v->max = vmax;
    v->scale = scale;
    v->mul = mul;
}
