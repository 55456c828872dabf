/* SPDX-License-Identifier: Apache-2.0 */
#include "kernels/vecmath.h"

#include "kernels/cpu.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
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
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(s * x[i] - s * m);
        sum += x[i];
    }
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

/* query by query, as ma_attention_head does it */
static void attend_few_portable(const ma_few_attn *a) {
    float *e = a->work;
    for (int i = 0; i < a->nq; i++) {
        const float *q = a->q + i * a->q_row;
        float m = -INFINITY;
        for (int64_t j = 0; j < a->lk; j++) {
            const float *k = a->k + j * a->k_row;
            float s = dot_portable(q, k, a->hd);
            if ((a->key_valid && !a->key_valid[j]) || (a->causal && j > a->q0 + i)) s = -INFINITY;
            e[j] = s;
            m = s > m ? s : m;
        }
        if (m == -INFINITY) { /* no visible key: uniform weights */
            for (int64_t j = 0; j < a->lk; j++) e[j] = 0.0f;
            m = 0.0f;
        }
        const float sum = exp_scaled_sum_portable(e, a->lk, a->scale, m), inv = 1.0f / sum;
        float *o = a->out + i * a->out_row;
        for (int d = 0; d < a->hd; d++) o[d] = 0.0f;
        for (int64_t j = 0; j < a->lk; j++) axpy_portable(o, e[j], a->v + j * a->v_row, a->hd);
        scale_portable(o, a->hd, inv);
    }
}

static double sum_portable(const float *v, int64_t n) {
    double p[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) p[j] += (double)v[i + j];
    for (; i < n; i++) p[0] += (double)v[i];
    return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

static double sum_sq_portable(const float *v, int64_t n, double mean) {
    double p[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) {
            const double d = (double)v[i + j] - mean;
            p[j] += d * d;
        }
    for (; i < n; i++) {
        const double d = (double)v[i] - mean;
        p[0] += d * d;
    }
    return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

/* an all-ones exponent, branch-free over blocks (vectorised by the compiler); the element is
 * looked for only in a block that has one */
static int64_t first_nonfinite_portable(const float *x, int64_t n) {
    for (int64_t b = 0; b < n; b += 1024) {
        const int64_t e = n - b < 1024 ? n : b + 1024;
        uint32_t bad = 0;
        for (int64_t k = b; k < e; k++) {
            uint32_t u;
            memcpy(&u, x + k, 4);
            bad |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
        }
        if (bad)
            for (int64_t k = b; k < e; k++)
                if (!isfinite(x[k])) return k;
    }
    return n;
}

static ma_vecmath sets[3]; /* portable, then what the CPU has, best last */
/* the set in use: a pointer into sets[], switched atomically (see gemm.c's active) */
static _Atomic(ma_vecmath *) table_p = &sets[0];
static const char *set_names[3];
static int n_sets;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void choose(void) {
    sets[0] = (ma_vecmath){silu_portable,
                           gelu_tanh_portable,
                           quick_gelu_portable,
                           exp_scaled_sum_portable,
                           max_portable,
                           scale_portable,
                           mul_portable,
                           dot_portable,
                           axpy_portable,
                           attend_few_portable,
                           sum_portable,
                           sum_sq_portable,
                           first_nonfinite_portable};
    set_names[0] = "portable";
    n_sets = 1;
#if defined(__x86_64__) && defined(MA_HAVE_AVX2)
    if (ma_cpu_avx2_fma_f16c()) {
        sets[n_sets] = sets[0];
        ma_vecmath_install_avx2(&sets[n_sets]);
        set_names[n_sets++] = "avx2";
#if defined(MA_HAVE_AVX512)
        if (ma_cpu_avx512f()) {
            sets[n_sets] = sets[0];
            ma_vecmath_install_avx512(&sets[n_sets]);
            set_names[n_sets++] = "avx512";
        }
#endif
    }
#endif
#if defined(__aarch64__)
    sets[n_sets] = sets[0];
    ma_vecmath_install_neon(&sets[n_sets]);
    set_names[n_sets++] = "neon";
#endif
    atomic_store_explicit(&table_p, &sets[n_sets - 1], memory_order_release); /* settings.kernels chooses another (ma_kernels_configure) */
}

const ma_vecmath *ma_vecmath_get(void) {
    pthread_once(&once, choose);
    return atomic_load_explicit(&table_p, memory_order_acquire);
}

int ma_vecmath_count(void) {
    pthread_once(&once, choose);
    return n_sets;
}

const char *ma_vecmath_name(int i) {
    pthread_once(&once, choose);
    return i >= 0 && i < n_sets ? set_names[i] : NULL;
}

void ma_vecmath_select(int i) {
    pthread_once(&once, choose);
    if (i >= 0 && i < n_sets) atomic_store_explicit(&table_p, &sets[i], memory_order_release);
}
