/* Elementwise math over float arrays: exp, the activations and the softmax, with a portable
 * version and AVX2 + FMA / AVX-512F ones (one source, vecmath_simd.h; chosen by CPU features). The SIMD exp is a degree-6
 * polynomial after range reduction (relative error about 2e-7); arguments below -87 give 0. */
#ifndef MA_VECMATH_H
#define MA_VECMATH_H

#include <stdint.h>

typedef struct ma_vecmath {
    void (*silu)(float *x, int64_t n);
    void (*gelu_tanh)(float *x, int64_t n);
    void (*quick_gelu)(float *x, int64_t n);
    /* x <- exp(s x - s m) (s > 0, m = max x: the largest term is 1); returns their sum */
    float (*exp_scaled_sum)(float *x, int64_t n, float s, float m);
    float (*max)(const float *x, int64_t n);
    void (*scale)(float *x, int64_t n, float s);
    /* y[i] *= x[i] */
    void (*mul)(float *y, const float *x, int64_t n);
    float (*dot)(const float *a, const float *b, int64_t n);
    /* y[i] += a x[i] */
    void (*axpy)(float *y, float a, const float *x, int64_t n);
} ma_vecmath;

const ma_vecmath *ma_vecmath_get(void);
/* the versions this CPU can run, "portable" first, best last (the default); tests switch with
 * ma_vecmath_select (not while the math runs) */
int ma_vecmath_count(void);
const char *ma_vecmath_name(int i);
void ma_vecmath_select(int i);

#if defined(__x86_64__) && defined(MA_HAVE_AVX2)
void ma_vecmath_install_avx2(ma_vecmath *v);
#endif
#if defined(__x86_64__) && defined(MA_HAVE_AVX512)
void ma_vecmath_install_avx512(ma_vecmath *v);
#endif

#endif
