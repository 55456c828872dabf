#include "kernels/vecmath.h"

#include "kernels/cpu.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static void silu_portable(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] / (1.0f + expf(-x[i]));
}

static void gelu_tanh_portable(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        x[i] = 0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
    }
}

static void quick_gelu_portable(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] / (1.0f + expf(-1.702f * x[i]));
}

static float exp_scaled_sum_portable(float *x, int64_t n, float s, float m) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) { x[i] = expf(s * x[i] - s * m); sum += x[i]; }
    return (float)sum;
}

static float max_portable(const float *x, int64_t n) {
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

static void scale_portable(float *x, int64_t n, float s) {
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

static void mul_portable(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] *= x[i];
}

static float dot_portable(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void axpy_portable(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static ma_vecmath portable_t, best_t, table;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void choose(void) {
    portable_t = (ma_vecmath){silu_portable, gelu_tanh_portable, quick_gelu_portable, exp_scaled_sum_portable, max_portable,
                              scale_portable, mul_portable, dot_portable, axpy_portable};
    best_t = portable_t;
#if defined(__x86_64__) && defined(MA_HAVE_AVX2)
    if (ma_cpu_avx2_fma_f16c()) ma_vecmath_install_avx2(&best_t);
#endif
    const char *e = getenv("MOLMOACT_KERNELS");
    table = e && !strcmp(e, "portable") ? portable_t : best_t;
}

const ma_vecmath *ma_vecmath_get(void) {
    pthread_once(&once, choose);
    return &table;
}

void ma_vecmath_select_portable(int portable) {
    pthread_once(&once, choose);
    table = portable ? portable_t : best_t;
}
