/* SPDX-License-Identifier: Apache-2.0 */
/* Compute kernels: fp32 activations, weights in their stored precision.
 *
 * A weight matrix (ma_mat) is a row-major [rows = N out features, cols = K in features] view of
 * F32 / F16 / BF16 / Q8_0 / Q4_0 data (a mapped checkpoint or context). ma_linear computes
 * y[M, N] = x[M, K] W^T (+ bias) with the GEMM of kernels/gemm.h, which reads the weights in their
 * stored precision (no fp32 copy of a matrix ever exists); the scalar path converts a few MB of
 * rows at a time into the context's scratch.
 *
 * Every kernel has a plain scalar path (ctx->scalar = 1, or MOLMOACT_KERNELS=scalar in the
 * environment) that the tests compare the fast path against.
 */
#ifndef MA_KERNELS_H
#define MA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "core/settings.h"
#include "core/tensor.h"
#include "kernels/gemm.h"

typedef struct ma_mat {
    ma_dtype dtype;
    int64_t rows, cols;
    const void *data;
    const char *name;
    int panels;         /* stored in the panel layout of kernels/gemm.h (contexts), else row-major */
    ma_compute compute; /* the context's compute plan for this matrix (gemm.h; 0: fp32) */
} ma_mat;

typedef struct ma_kctx {
    float *scratch; /* panel conversion and attention scores */
    size_t scratch_cap;
    int scalar; /* 1: plain C loops everywhere */
} ma_kctx;

/* threads of the kernels' pool for this process (before its first use); worker processes read
 * MOLMOACT_THREADS */
void ma_kernel_set_threads(int n);

/* the process's kernel choices from an engine's settings (kernels, gemm_panels, gemm_parts,
 * threads): process-wide, as a thread pool is; an unavailable kernel set refused, naming those this
 * CPU and build have. Called at the top (the API's open, a worker's start, a command) */
ma_status ma_kernels_configure(const ma_settings *st, ma_error *err);
int ma_kernel_threads(void);

void ma_kctx_init(ma_kctx *c);
void ma_kctx_free(ma_kctx *c);

/* dequantise/convert n consecutive elements starting at element `first` of a row-major buffer */
void ma_convert_to_f32(ma_dtype dt, const void *src, int64_t first, int64_t n, float *dst);
/* the same for one matrix row */
void ma_mat_row(const ma_mat *w, int64_t row, float *dst);

/* y[M, N] = x[M, K] W^T + bias (bias may be NULL); x rows have stride K, y rows stride N */
ma_status ma_linear(ma_kctx *c, const float *x, int64_t M, const ma_mat *w, const float *bias, float *y, ma_error *err);

/* y_i = x W_i^T + b_i for n (<= 4) matrices sharing x (q/k/v, gate/up): one fused GEMM job;
 * each y_i is [M, rows_i]. The same numbers as n ma_linear calls. */
ma_status ma_linear_fused(ma_kctx *c, const float *x, int64_t M, int n, const ma_mat *const *w, const float *const *bias, float *const *y,
                          ma_error *err);

/* C[M, N] = A[M, K] B[N, K]^T  (+ beta * C) */
void ma_gemm_nt(ma_kctx *c, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                int64_t ldc);
/* C[M, N] = A[M, K] B[K, N] */
void ma_gemm_nn(ma_kctx *c, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb, float *C,
                int64_t ldc);

/* ---- elementwise and normalisation (in place unless noted) */
void ma_layernorm(float *x, int64_t rows, int64_t dim, const float *w, const float *b, float eps);
/* x <- x * rsqrt(mean(x^2) + eps) (* w if w) */
void ma_rmsnorm(float *x, int64_t rows, int64_t dim, const float *w, float eps);
/* the same from x into y (the same numbers; no copy of x first) */
void ma_layernorm_to(float *y, const float *x, int64_t rows, int64_t dim, const float *w, const float *b, float eps);
void ma_rmsnorm_to(float *y, const float *x, int64_t rows, int64_t dim, const float *w, float eps);
typedef enum { MA_ACT_SILU, MA_ACT_GELU, MA_ACT_GELU_TANH, MA_ACT_RELU, MA_ACT_QUICK_GELU } ma_act;
void ma_activate(float *x, int64_t n, ma_act act);
/* the same, honouring c->scalar, on the thread pool for large n */
void ma_activate_ctx(const ma_kctx *c, float *x, int64_t n, ma_act act);
void ma_add(float *y, const float *x, int64_t n);
/* the index of the first NaN or infinity in x, or n when every element is finite (inputs are
 * checked with it: the action context is 1.2 MB a layer, shared by the pool) */
int64_t ma_first_nonfinite(const float *x, int64_t n);
/* gated linear unit over rows: out[r][i] = act(gate[r][i]) * up[r][i] for i < n (row strides ldo,
 * ldg, ldu; out may be gate), on the thread pool for large inputs, honouring c->scalar */
void ma_glu(const ma_kctx *c, float *out, int64_t ldo, const float *gate, int64_t ldg, const float *up, int64_t ldu, int64_t rows,
            int64_t n, ma_act act);

/* ---- attention. allowed(q, k) = key_valid[k] (if given) and (!causal or k <= q or both
 * bidir[q] and bidir[k]). A row with no allowed key becomes uniform over all keys, as adding
 * finfo.min to every score does in PyTorch. */
typedef struct ma_attn_mask {
    const uint8_t *key_valid;
    int causal;
    const uint8_t *bidir;
} ma_attn_mask;

/* out[Lq, hd] = softmax(q k^T / sqrt(hd) + mask) v for one head; rows have the given strides */
ma_status ma_attention_head(ma_kctx *c, const float *q, int64_t q_stride, const float *k, int64_t k_stride, const float *v,
                            int64_t v_stride, float *out, int64_t out_stride, int64_t lq, int64_t lk, int64_t hd, const ma_attn_mask *mask,
                            ma_error *err);

/* Many heads (and sequences) at once: head h of sequence s reads q + s*q_seq + h*hd (rows
 * q_row apart), k and v at s*k_seq + (h / (heads / kv_heads))*hd, writes out likewise. The work
 * is split over the thread pool by (sequence, head, block of 256 queries); a block's scores
 * (256 x lk) are the only ones held at a time. At most MA_FEW_Q queries without an image block
 * (the action expert) go to vecmath's attend_few, which reads K and V in place instead of
 * packing them for the GEMM. ctx->scalar runs ma_attention_head instead. */
typedef struct ma_attn_args {
    int n_seq, heads, kv_heads;
    int64_t lq, lk, hd;
    const float *q, *k, *v;
    float *out;
    int64_t q_row, k_row, v_row, out_row; /* elements between rows */
    int64_t q_seq, k_seq, v_seq, out_seq; /* elements between sequences */
    const ma_attn_mask *mask;
    ma_compute compute; /* of the score and value products (the component's plan; gemm.h) */
} ma_attn_args;

ma_status ma_attention(ma_kctx *c, const ma_attn_args *a, ma_error *err);

#endif
