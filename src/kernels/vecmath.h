/* SPDX-License-Identifier: Apache-2.0 */
/* Elementwise math over float arrays: exp, the activations and the softmax, with a portable
 * version and AVX2 + FMA / AVX-512F ones (one source, vecmath_simd.h; chosen by CPU features). The SIMD exp is a degree-6
 * polynomial after range reduction (relative error about 2e-7); arguments below -87 give 0.
 * Also the attention of a few queries (the action expert's 10), written over the same vectors. */
#ifndef MA_VECMATH_H
#define MA_VECMATH_H

#include <stdint.h>

/* One head's attention for at most MA_FEW_Q queries: out[i] = softmax(scale q_i K^T + mask) V,
 * rows the given strides apart. Masked keys: key_valid[j] == 0, and with causal, j > q0 + i (q0:
 * the first query's position). A query with no visible key gets uniform weights, as in
 * ma_attention_head. work: ma_few_attn_work(lk, hd) floats. */
#define MA_FEW_Q 16
typedef struct ma_few_attn {
    const float *q, *k, *v;
    float *out;
    int64_t q_row, k_row, v_row, out_row;
    int nq, hd;
    int64_t lk, q0;
    float scale;
    const uint8_t *key_valid;
    int causal;
    float *work;
} ma_few_attn;

static inline int64_t ma_few_attn_work(int64_t lk, int64_t hd) { return MA_FEW_Q * (lk + hd + 8); }

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
    void (*attend_few)(const ma_few_attn *a);
    /* sum of x, and of (x - mean)^2, in double over 8 interleaved partial sums (lane j: elements
     * j, j + 8, ...) combined in a fixed order: the same bits in every set */
    double (*sum)(const float *x, int64_t n);
    double (*sum_sq)(const float *x, int64_t n, double mean);
    /* the index of the first NaN or infinity in x, or n when there is none */
    int64_t (*first_nonfinite)(const float *x, int64_t n);
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
#if defined(__aarch64__)
/* NEON (aarch64) */
void ma_vecmath_install_neon(ma_vecmath *v);
#endif

#endif
