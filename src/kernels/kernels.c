/* SPDX-License-Identifier: Apache-2.0 */
#include "kernels/kernels.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/half.h"
#include "kernels/gemm.h"
#include "kernels/threads.h"
#include "kernels/vecmath.h"

void ma_kernel_set_threads(int n) { ma_threads_set(n); }

static int use_scalar; /* settings.kernels "scalar": every kernel context takes the scalar paths */

/* The process's kernel choices are made once, by the first engine (or program) that configures
 * them; a later one may ask for the same, or leave them to the process, but not change them under
 * an engine that is running (the set, the panel mode and the thread pool are per process, as a
 * thread pool is). Resident engines do not configure their orchestrator: each worker process
 * applies its engine's settings. */
static pthread_mutex_t configure_mu = PTHREAD_MUTEX_INITIALIZER;
static int configured;
static char chosen_kernels[MA_SETTINGS_WORD];
static int chosen_panels = -1, chosen_parts, chosen_threads;

static ma_status apply_kernels(const ma_settings *st, ma_error *err) {
    if (st->kernels[0]) {
        int gi = -1;
        char list[128] = "scalar";
        for (int i = 0; i < ma_gemm_kernel_count(); i++) {
            const char *n = ma_gemm_kernel_name(i);
            if (!strcmp(st->kernels, n)) gi = i;
            snprintf(list + strlen(list), sizeof list - strlen(list), ", %s", n);
        }
        const int scalar = !strcmp(st->kernels, "scalar");
        if (gi < 0 && !scalar)
            return ma_fail(err, MA_ERR_ARG,
                           "kernel set %s (MOLMOACT_KERNELS, options.kernels): not supported by this CPU or build "
                           "(this CPU and build have: %s)",
                           st->kernels, list);
        /* a GEMM set of the vector math's names (portable, avx2, avx512, neon) keeps the vector
         * math at that level too; scalar changes the kernel contexts only */
        int vi = ma_vecmath_count() - 1;
        for (int i = 0; i < ma_vecmath_count(); i++)
            if (!strcmp(st->kernels, ma_vecmath_name(i))) vi = i;
        ma_gemm_select(gi >= 0 ? gi : ma_gemm_kernel_count() - 1);
        ma_vecmath_select(vi);
        use_scalar = scalar;
        snprintf(chosen_kernels, sizeof chosen_kernels, "%s", st->kernels);
    }
    if (st->gemm_panels[0]) ma_gemm_set_in_place(chosen_panels = !strcmp(st->gemm_panels, "in_place"));
    if (st->gemm_parts > 0) ma_gemm_set_parts(chosen_parts = st->gemm_parts);
    if (st->threads > 0) ma_threads_set(chosen_threads = st->threads);
    return MA_OK;
}

/* a later engine's settings against the process's: the same, or left to the process */
static ma_status check_same(const ma_settings *st, ma_error *err) {
    const char *why = NULL;
    char have[64] = "";
    if (st->kernels[0] && strcmp(st->kernels, chosen_kernels[0] ? chosen_kernels : ma_gemm_kernels()))
        why = "kernel set", snprintf(have, sizeof have, "%s", chosen_kernels[0] ? chosen_kernels : ma_gemm_kernels());
    else if (st->gemm_panels[0] && (!strcmp(st->gemm_panels, "in_place") ? 1 : 0) != ma_gemm_in_place())
        why = "GEMM panel mode", snprintf(have, sizeof have, "%s", ma_gemm_in_place() ? "in_place" : "convert");
    else if (st->gemm_parts > 0 && st->gemm_parts != (chosen_parts ? chosen_parts : 1))
        why = "GEMM parts", snprintf(have, sizeof have, "%d", chosen_parts ? chosen_parts : 1);
    else if (st->threads > 0 && st->threads != ma_threads()) why = "thread count", snprintf(have, sizeof have, "%d", ma_threads());
    if (!why) return MA_OK;
    return ma_fail(err, MA_ERR_ARG,
                   "this process already runs an engine with %s %s: the kernel set, the panel mode and the threads "
                   "are per process (open this engine resident, whose workers take their own, or in another process)",
                   why, have);
}

ma_status ma_kernels_configure(const ma_settings *st, ma_error *err) {
    pthread_mutex_lock(&configure_mu);
    ma_status s = configured ? check_same(st, err) : apply_kernels(st, err);
    if (!s) configured = 1;
    pthread_mutex_unlock(&configure_mu);
    return s;
}
int ma_kernel_threads(void) { return ma_threads(); }

#define PANEL_FLOATS (1u << 20) /* 4 MiB of converted weights per sgemm call */

void ma_kctx_init(ma_kctx *c) {
    memset(c, 0, sizeof *c);
    c->scalar = use_scalar;
}

void ma_kctx_free(ma_kctx *c) {
    free(c->scratch);
    memset(c, 0, sizeof *c);
}

/* ensure n floats of scratch; returns NULL (and sets err) on failure */
static float *ma_kctx_scratch(ma_kctx *c, size_t n, ma_error *err) {
    if (n <= c->scratch_cap) return c->scratch;
    float *p = ma_malloc(n, sizeof(float), err, "kernel scratch");
    if (!p) return NULL;
    free(c->scratch);
    c->scratch = p;
    c->scratch_cap = n;
    return p;
}

/* ------------------------------------------------------------------------------ conversion */

static void dequant_q8_0(const uint8_t *blk, float *dst) {
    uint16_t d16 = (uint16_t)(blk[0] | (blk[1] << 8));
    float d = ma_f16_to_f32(d16);
    for (int i = 0; i < 32; i++) dst[i] = d * (float)(int8_t)blk[2 + i];
}

static void dequant_q4_0(const uint8_t *blk, float *dst) {
    uint16_t d16 = (uint16_t)(blk[0] | (blk[1] << 8));
    float d = ma_f16_to_f32(d16);
    for (int j = 0; j < 16; j++) {
        dst[j] = d * (float)((blk[2 + j] & 0x0f) - 8);
        dst[j + 16] = d * (float)((blk[2 + j] >> 4) - 8);
    }
}

void ma_convert_to_f32(ma_dtype dt, const void *src, int64_t first, int64_t n, float *dst) {
    switch (dt) {
    case MA_DT_F32: memcpy(dst, (const float *)src + first, (size_t)n * sizeof(float)); break;
    case MA_DT_F16: {
        const uint16_t *s = (const uint16_t *)src + first;
        for (int64_t i = 0; i < n; i++) dst[i] = ma_f16_to_f32(s[i]);
    } break;
    case MA_DT_BF16: {
        const uint16_t *s = (const uint16_t *)src + first;
        for (int64_t i = 0; i < n; i++) dst[i] = ma_bf16_to_f32(s[i]);
    } break;
    case MA_DT_Q8_0: {
        const uint8_t *s = (const uint8_t *)src + (first / 32) * 34;
        for (int64_t i = 0; i < n; i += 32) dequant_q8_0(s + (i / 32) * 34, dst + i);
    } break;
    case MA_DT_Q4_0: {
        const uint8_t *s = (const uint8_t *)src + (first / 32) * 18;
        for (int64_t i = 0; i < n; i += 32) dequant_q4_0(s + (i / 32) * 18, dst + i);
    } break;
    default: memset(dst, 0, (size_t)n * sizeof(float)); break;
    }
}

void ma_mat_row(const ma_mat *w, int64_t row, float *dst) {
    if (w->panels) ma_panels_row(w->dtype, w->data, w->cols, row, dst);
    else ma_convert_to_f32(w->dtype, w->data, row * w->cols, w->cols, dst);
}

/* ------------------------------------------------------------------------------ gemm */

void ma_gemm_nt(ma_kctx *c, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    if (!c->scalar) {
        if (beta != 0.0f && beta != 1.0f)
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++) C[i * ldc + j] *= beta;
        ma_bmat b = {MA_B_ROWS, MA_DT_F32, B, ldb, 0, MA_COMPUTE_F32};
        ma_gemm(M, N, K, A, lda, &b, NULL, beta != 0.0f, C, ldc);
        return;
    }
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            float acc = 0.0f;
            const float *a = A + i * lda, *b = B + j * ldb;
            for (int64_t k = 0; k < K; k++) acc += a[k] * b[k];
            C[i * ldc + j] = beta == 0.0f ? acc : acc + beta * C[i * ldc + j];
        }
}

void ma_gemm_nn(ma_kctx *c, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb, float *C,
                int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    if (!c->scalar) {
        ma_bmat b = {MA_B_COLS, MA_DT_F32, B, ldb, 0, MA_COMPUTE_F32};
        ma_gemm(M, N, K, A, lda, &b, NULL, 0, C, ldc);
        return;
    }
    for (int64_t i = 0; i < M; i++) {
        float *crow = C + i * ldc;
        for (int64_t j = 0; j < N; j++) crow[j] = 0.0f;
        for (int64_t k = 0; k < K; k++) {
            float a = A[i * lda + k];
            const float *brow = B + k * ldb;
            for (int64_t j = 0; j < N; j++) crow[j] += a * brow[j];
        }
    }
}

ma_status ma_linear(ma_kctx *c, const float *x, int64_t M, const ma_mat *w, const float *bias, float *y, ma_error *err) {
    const int64_t N = w->rows, K = w->cols;
    if (!c->scalar) {
        ma_bmat b = {w->panels ? MA_B_PANELS : MA_B_ROWS, w->dtype, w->data, K, 0, w->compute};
        ma_gemm(M, N, K, x, K, &b, bias, 0, y, N);
        return MA_OK;
    }
    if (M > 0 && N > 0) {
        if (w->dtype == MA_DT_F32 && !w->panels) {
            ma_gemm_nt(c, M, N, K, x, K, (const float *)w->data, K, 0.0f, y, N);
        } else {
            int64_t panel = (int64_t)(PANEL_FLOATS / (size_t)(K > 0 ? K : 1));
            if (panel < 1) panel = 1;
            if (panel > N) panel = N;
            float *buf = ma_kctx_scratch(c, (size_t)(panel * K), err);
            if (!buf) return MA_ERR_NOMEM;
            for (int64_t n0 = 0; n0 < N; n0 += panel) {
                int64_t nr = N - n0 < panel ? N - n0 : panel;
                if (w->panels)
                    for (int64_t r = 0; r < nr; r++) ma_panels_row(w->dtype, w->data, K, n0 + r, buf + r * K);
                else ma_convert_to_f32(w->dtype, w->data, n0 * K, nr * K, buf);
                ma_gemm_nt(c, M, nr, K, x, K, buf, K, 0.0f, y + n0, N);
            }
        }
    }
    if (bias)
        for (int64_t i = 0; i < M; i++) ma_add(y + i * N, bias, N);
    return MA_OK;
}

ma_status ma_linear_fused(ma_kctx *c, const float *x, int64_t M, int n, const ma_mat *const *w, const float *const *bias, float *const *y,
                          ma_error *err) {
    if (n < 1 || n > MA_GEMM_MAX_PARTS) return ma_fail(err, MA_ERR_ARG, "ma_linear_fused: %d matrices (1..%d)", n, MA_GEMM_MAX_PARTS);
    for (int i = 1; i < n; i++)
        if (w[i]->cols != w[0]->cols)
            return ma_fail(err, MA_ERR_SHAPE, "fused linear: %s has %lld inputs, %s %lld", w[i]->name ? w[i]->name : "?",
                           (long long)w[i]->cols, w[0]->name ? w[0]->name : "?", (long long)w[0]->cols);
    if (c->scalar) {
        ma_status s = MA_OK;
        for (int i = 0; i < n && !s; i++) s = ma_linear(c, x, M, w[i], bias[i], y[i], err);
        return s;
    }
    ma_bmat b[MA_GEMM_MAX_PARTS];
    ma_gemm_part parts[MA_GEMM_MAX_PARTS];
    for (int i = 0; i < n; i++) {
        b[i] = (ma_bmat){w[i]->panels ? MA_B_PANELS : MA_B_ROWS, w[i]->dtype, w[i]->data, w[i]->cols, 0, w[i]->compute};
        parts[i] = (ma_gemm_part){&b[i], w[i]->rows, bias[i], y[i], w[i]->rows};
    }
    ma_gemm_fused(M, w[0]->cols, x, w[0]->cols, parts, n);
    return MA_OK;
}

/* ------------------------------------------------------------------------------ elementwise */

typedef struct {
    float *y;
    const float *x;
    int64_t n;
} add_job;

static void add_task(void *ctx, int t, int T) {
    const add_job *j = ctx;
    int64_t a, b;
    ma_split_blocks(j->n, 64, t, T, &a, &b); /* whole cache lines per thread */
    for (int64_t i = a; i < b; i++) j->y[i] += j->x[i];
}

/* large residual adds (the ViT's 1458 x 1152) are shared by the pool */
void ma_add(float *y, const float *x, int64_t n) {
    add_job j = {y, x, n};
    if (n >= (1 << 18)) ma_parallel(add_task, &j);
    else add_task(&j, 0, 1);
}

typedef struct {
    const float *x;
    int64_t n;
    _Atomic int64_t first;
} finite_job;

static void finite_task(void *ctx, int t, int T) {
    finite_job *j = ctx;
    int64_t a, b;
    ma_split_blocks(j->n, 1024, t, T, &a, &b); /* whole blocks of the scan per thread */
    if (a >= b) return;
    const int64_t k = a + ma_vecmath_get()->first_nonfinite(j->x + a, b - a);
    if (k == b) return;
    int64_t cur = atomic_load(&j->first); /* the smallest index any thread found */
    while (k < cur && !atomic_compare_exchange_weak(&j->first, &cur, k)) {}
}

int64_t ma_first_nonfinite(const float *x, int64_t n) {
    finite_job j = {.x = x, .n = n};
    atomic_init(&j.first, n);
    if (n >= (1 << 18)) ma_parallel(finite_task, &j);
    else finite_task(&j, 0, 1);
    return atomic_load(&j.first);
}

/* row sums in double: vecmath's sum / sum_sq (8 interleaved partial sums in a fixed order, so
 * the result depends neither on the thread count nor on the vector width) */
typedef struct {
    const float *x;
    float *y;
    int64_t rows, dim;
    const float *w, *b;
    float eps;
    int rms;
} norm_job;

static void norm_rows(const norm_job *j, int64_t r0, int64_t r1) {
    const int64_t dim = j->dim;
    const ma_vecmath *vm = ma_vecmath_get();
    for (int64_t r = r0; r < r1; r++) {
        const float *v = j->x + r * dim;
        float *y = j->y + r * dim;
        if (j->rms) {
            const float inv = 1.0f / sqrtf((float)(vm->sum_sq(v, dim, 0.0) / (double)dim) + j->eps);
            for (int64_t i = 0; i < dim; i++) y[i] = j->w ? j->w[i] * (v[i] * inv) : v[i] * inv;
        } else {
            const double mean = vm->sum(v, dim) / (double)dim;
            const double var = vm->sum_sq(v, dim, mean) / (double)dim;
            const float inv = (float)(1.0 / sqrt(var + (double)j->eps)), m = (float)mean;
            for (int64_t i = 0; i < dim; i++) {
                const float t = (v[i] - m) * inv;
                y[i] = (j->w ? t * j->w[i] : t) + (j->b ? j->b[i] : 0.0f);
            }
        }
    }
}

static void norm_task(void *ctx, int t, int T) {
    const norm_job *j = ctx;
    long lo, hi;
    ma_split_range((long)j->rows, t, T, &lo, &hi);
    norm_rows(j, lo, hi);
}

/* rows are independent: large ones are shared by the pool (each row's math is the same either way) */
static void norm_run(const norm_job *j) {
    if (j->rows > 1 && j->rows * j->dim >= (1 << 15)) ma_parallel_n(norm_task, (void *)j, (int)(j->rows < 64 ? j->rows : 64));
    else norm_rows(j, 0, j->rows);
}

void ma_layernorm(float *x, int64_t rows, int64_t dim, const float *w, const float *b, float eps) {
    ma_layernorm_to(x, x, rows, dim, w, b, eps);
}

void ma_layernorm_to(float *y, const float *x, int64_t rows, int64_t dim, const float *w, const float *b, float eps) {
    const norm_job j = {x, y, rows, dim, w, b, eps, 0};
    norm_run(&j);
}

void ma_rmsnorm(float *x, int64_t rows, int64_t dim, const float *w, float eps) { ma_rmsnorm_to(x, x, rows, dim, w, eps); }

void ma_rmsnorm_to(float *y, const float *x, int64_t rows, int64_t dim, const float *w, float eps) {
    const norm_job j = {x, y, rows, dim, w, NULL, eps, 1};
    norm_run(&j);
}

typedef struct {
    float *x;
    int64_t n;
    void (*fn)(float *, int64_t);
} act_job;

static void act_task(void *ctx, int t, int T) {
    act_job *j = ctx;
    int64_t a, b;
    ma_split_blocks(j->n, 64, t, T, &a, &b); /* whole cache lines per thread */
    if (a < b) j->fn(j->x + a, b - a);
}

static void activate_scalar(float *x, int64_t n, ma_act act);

void ma_activate_ctx(const ma_kctx *c, float *x, int64_t n, ma_act act) {
    const ma_vecmath *v = ma_vecmath_get();
    void (*fn)(float *, int64_t) = act == MA_ACT_SILU         ? v->silu
                                   : act == MA_ACT_GELU_TANH  ? v->gelu_tanh
                                   : act == MA_ACT_QUICK_GELU ? v->quick_gelu
                                                              : NULL;
    if (c->scalar || !fn) {
        activate_scalar(x, n, act);
        return;
    }
    act_job j = {x, n, fn};
    ma_parallel_n(act_task, &j, n < 32768 ? 1 : 64);
}

typedef struct {
    float *out;
    const float *gate, *up;
    int64_t ldo, ldg, ldu, rows, n, blocks; /* blocks of GLU_BLOCK per row */
    void (*fn)(float *, int64_t);
    void (*mul)(float *, const float *, int64_t);
} glu_job;

#define GLU_BLOCK 2048

static void glu_task(void *ctx, int t, int T) {
    const glu_job *j = ctx;
    long lo, hi;
    ma_split_range((long)(j->rows * j->blocks), t, T, &lo, &hi);
    for (long u = lo; u < hi; u++) {
        const int64_t r = u / j->blocks, c0 = (u % j->blocks) * GLU_BLOCK, len = j->n - c0 < GLU_BLOCK ? j->n - c0 : GLU_BLOCK;
        float *o = j->out + r * j->ldo + c0;
        const float *g = j->gate + r * j->ldg + c0;
        if (o != g) memcpy(o, g, sizeof(float) * (size_t)len);
        j->fn(o, len);
        j->mul(o, j->up + r * j->ldu + c0, len);
    }
}

void ma_glu(const ma_kctx *c, float *out, int64_t ldo, const float *gate, int64_t ldg, const float *up, int64_t ldu, int64_t rows,
            int64_t n, ma_act act) {
    const ma_vecmath *v = ma_vecmath_get();
    void (*fn)(float *, int64_t) = act == MA_ACT_SILU         ? v->silu
                                   : act == MA_ACT_GELU_TANH  ? v->gelu_tanh
                                   : act == MA_ACT_QUICK_GELU ? v->quick_gelu
                                                              : NULL;
    if (c->scalar || !fn) {
        for (int64_t r = 0; r < rows; r++) {
            float *o = out + r * ldo;
            const float *g = gate + r * ldg, *u = up + r * ldu;
            if (o != g) memmove(o, g, sizeof(float) * (size_t)n);
            activate_scalar(o, n, act);
            for (int64_t i = 0; i < n; i++) o[i] *= u[i];
        }
        return;
    }
    glu_job j = {out, gate, up, ldo, ldg, ldu, rows, n, (n + GLU_BLOCK - 1) / GLU_BLOCK, fn, v->mul};
    const int64_t units = rows * j.blocks;
    ma_parallel_n(glu_task, &j, rows * n < 4096 ? 1 : (int)(units < 64 ? units : 64));
}

void ma_activate(float *x, int64_t n, ma_act act) {
    ma_kctx c;
    memset(&c, 0, sizeof c);
    ma_activate_ctx(&c, x, n, act);
}

static void activate_scalar(float *x, int64_t n, ma_act act) {
    switch (act) {
    case MA_ACT_SILU:
        for (int64_t i = 0; i < n; i++) x[i] = x[i] / (1.0f + expf(-x[i]));
        break;
    case MA_ACT_GELU:
        for (int64_t i = 0; i < n; i++) x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
        break;
    case MA_ACT_GELU_TANH:
        for (int64_t i = 0; i < n; i++) {
            float v = x[i];
            x[i] = 0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
        }
        break;
    case MA_ACT_RELU:
        for (int64_t i = 0; i < n; i++) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
        break;
    case MA_ACT_QUICK_GELU:
        for (int64_t i = 0; i < n; i++) x[i] = x[i] / (1.0f + expf(-1.702f * x[i]));
        break;
    }
}

static void ma_softmax_row(float *x, int64_t n) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

/* ------------------------------------------------------------------------------ attention */

ma_status ma_attention_head(ma_kctx *c, const float *q, int64_t q_stride, const float *k, int64_t k_stride, const float *v,
                            int64_t v_stride, float *out, int64_t out_stride, int64_t lq, int64_t lk, int64_t hd, const ma_attn_mask *mask,
                            ma_error *err) {
    float *s = ma_kctx_scratch(c, (size_t)(lq * lk), err);
    if (!s) return MA_ERR_NOMEM;
    ma_gemm_nt(c, lq, lk, hd, q, q_stride, k, k_stride, 0.0f, s, lk);
    const float scale = 1.0f / sqrtf((float)hd);
    for (int64_t i = 0; i < lq; i++) {
        float *row = s + i * lk;
        int any = 0;
        for (int64_t j = 0; j < lk; j++) {
            int ok = 1;
            if (mask) {
                if (mask->key_valid && !mask->key_valid[j]) ok = 0;
                else if (mask->causal && j > i && !(mask->bidir && mask->bidir[i] && mask->bidir[j])) ok = 0;
            }
            row[j] = ok ? row[j] * scale : -INFINITY;
            any |= ok;
        }
        if (!any)
            for (int64_t j = 0; j < lk; j++) row[j] = 0.0f;
        ma_softmax_row(row, lk);
    }
    ma_gemm_nn(c, lq, hd, lk, s, lk, v, v_stride, out, out_stride);
    return MA_OK;
}

/* ------------------------------------------------------------------------------ batched attention */

#define ATT_QB 256 /* queries per block: K and V are converted for the GEMM once per block */

/* units (a head, or a head's block of queries) go to the threads as they finish the last: a
 * thread slowed by its sibling or the hypervisor does fewer, and no thread waits at the join
 * for another's fixed share (the expert's 8 heads: one thread was idle a quarter of the time) */
typedef struct att_job {
    const ma_attn_args *a;
    int64_t q_blocks, units;
    int failed;
    atomic_llong next;
} att_job;

static int64_t next_unit(att_job *j) { return (int64_t)atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed); }

/* mask and unnormalised softmax of one raw score row (query qi): row <- exp(scale (row - max));
 * returns the sum, by which the caller divides the output row (hd values instead of lk) */
static float softmax_masked(const ma_vecmath *vm, float *row, int64_t lk, int64_t qi, float scale, const ma_attn_mask *mask) {
    if (mask && mask->causal && !mask->key_valid) {
        /* the LLM's mask: keys up to the query, and past it only image keys for an image query;
         * the query's own key is always allowed, so a row is never empty */
        if (mask->bidir && mask->bidir[qi])
            for (int64_t j = qi + 1; j < lk; j++) row[j] = mask->bidir[j] ? row[j] : -INFINITY;
        else
            for (int64_t j = qi + 1; j < lk; j++) row[j] = -INFINITY;
    } else if (mask && (mask->key_valid || mask->causal)) {
        int any = 0;
        for (int64_t j = 0; j < lk; j++) {
            int ok = !(mask->key_valid && !mask->key_valid[j]) &&
                     !(mask->causal && j > qi && !(mask->bidir && mask->bidir[qi] && mask->bidir[j]));
            if (!ok) row[j] = -INFINITY;
            any |= ok;
        }
        if (!any)
            for (int64_t j = 0; j < lk; j++) row[j] = 0.0f;
    }
    /* exp(scale x - scale max): scale > 0 keeps the max where it was */
    return vm->exp_scaled_sum(row, lk, scale, vm->max(row, lk));
}

static void att_task(void *ctx, int t, int T) {
    att_job *j = ctx;
    const ma_attn_args *a = j->a;
    const ma_vecmath *vm = ma_vecmath_get();
    const int64_t qb_max = a->lq < ATT_QB ? a->lq : ATT_QB;
    float *S = malloc(sizeof(float) * (size_t)(qb_max * a->lk));
    if (!S) {
        j->failed = 1;
        return;
    }
    const int grp = a->heads / a->kv_heads;
    const float scale = 1.0f / sqrtf((float)a->hd);
    (void)t, (void)T;
    for (int64_t u = next_unit(j); u < j->units; u = next_unit(j)) {
        const int64_t blk = u % j->q_blocks, sh = u / j->q_blocks;
        const int h = (int)(sh % a->heads), seq = (int)(sh / a->heads);
        const int64_t q0 = blk * ATT_QB, qb = a->lq - q0 < ATT_QB ? a->lq - q0 : ATT_QB;
        const float *q = a->q + seq * a->q_seq + h * a->hd + q0 * a->q_row;
        const float *k = a->k + seq * a->k_seq + (h / grp) * a->hd;
        const float *v = a->v + seq * a->v_seq + (h / grp) * a->hd;
        float *o = a->out + seq * a->out_seq + h * a->hd + q0 * a->out_row;
        ma_bmat kb = {MA_B_ROWS, MA_DT_F32, k, a->k_row, 0, a->compute}, vb = {MA_B_COLS, MA_DT_F32, v, a->v_row, 0, a->compute};
        ma_gemm_serial(qb, a->lk, a->hd, q, a->q_row, &kb, NULL, 0, S, a->lk);
        float sums[ATT_QB];
        for (int64_t i = 0; i < qb; i++) sums[i] = softmax_masked(vm, S + i * a->lk, a->lk, q0 + i, scale, a->mask);
        ma_gemm_serial(qb, a->hd, a->lk, S, a->lk, &vb, NULL, 0, o, a->out_row);
        for (int64_t i = 0; i < qb; i++) vm->scale(o + i * a->out_row, a->hd, 1.0f / sums[i]);
    }
    free(S);
}

/* few queries (the action expert's 10 over its 10 or S keys): one unit per (sequence, head),
 * vecmath's attend_few reading K and V in place; packing them for the GEMM cost more than the
 * products themselves */
static void few_task(void *ctx, int t, int T) {
    att_job *j = ctx;
    const ma_attn_args *a = j->a;
    const ma_vecmath *vm = ma_vecmath_get();
    float *work = malloc(sizeof(float) * (size_t)ma_few_attn_work(a->lk, a->hd));
    if (!work) {
        j->failed = 1;
        return;
    }
    const int grp = a->heads / a->kv_heads;
    const ma_attn_mask *mask = a->mask;
    (void)t, (void)T;
    for (int64_t u = next_unit(j); u < j->units; u = next_unit(j)) {
        const int h = (int)(u % a->heads), seq = (int)(u / a->heads);
        const ma_few_attn f = {a->q + seq * a->q_seq + h * a->hd,
                               a->k + seq * a->k_seq + (h / grp) * a->hd,
                               a->v + seq * a->v_seq + (h / grp) * a->hd,
                               a->out + seq * a->out_seq + h * a->hd,
                               a->q_row,
                               a->k_row,
                               a->v_row,
                               a->out_row,
                               (int)a->lq,
                               (int)a->hd,
                               a->lk,
                               0,
                               1.0f / sqrtf((float)a->hd),
                               mask ? mask->key_valid : NULL,
                               mask ? mask->causal : 0,
                               work};
        vm->attend_few(&f);
    }
    free(work);
}

ma_status ma_attention(ma_kctx *c, const ma_attn_args *a, ma_error *err) {
    if (a->lq <= 0 || a->lk <= 0 || a->n_seq <= 0) return MA_OK;
    if (a->kv_heads <= 0 || a->heads % a->kv_heads)
        return ma_fail(err, MA_ERR_ARG, "attention: %d heads over %d kv heads", a->heads, a->kv_heads);
    if (c->scalar) {
        const int grp = a->heads / a->kv_heads;
        for (int s = 0; s < a->n_seq; s++)
            for (int h = 0; h < a->heads; h++) {
                ma_status st = ma_attention_head(c, a->q + s * a->q_seq + h * a->hd, a->q_row, a->k + s * a->k_seq + (h / grp) * a->hd,
                                                 a->k_row, a->v + s * a->v_seq + (h / grp) * a->hd, a->v_row,
                                                 a->out + s * a->out_seq + h * a->hd, a->out_row, a->lq, a->lk, a->hd, a->mask, err);
                if (st) return st;
            }
        return MA_OK;
    }
    if (a->lq <= MA_FEW_Q && a->hd <= INT32_MAX && !(a->mask && a->mask->bidir)) {
        att_job j = {.a = a, .q_blocks = 1, .units = (int64_t)a->n_seq * a->heads};
        atomic_init(&j.next, 0);
        ma_parallel_n(few_task, &j, (int)(j.units < 64 ? j.units : 64));
        if (j.failed) return ma_fail(err, MA_ERR_NOMEM, "attention: out of memory for %lld keys", (long long)a->lk);
        return MA_OK;
    }
    att_job j = {.a = a, .q_blocks = (a->lq + ATT_QB - 1) / ATT_QB};
    atomic_init(&j.next, 0);
    j.units = (int64_t)a->n_seq * a->heads * j.q_blocks;
    ma_parallel_n(att_task, &j, (int)(j.units < 64 ? j.units : 64));
    if (j.failed) return ma_fail(err, MA_ERR_NOMEM, "attention: out of memory for %lld x %lld scores", (long long)ATT_QB, (long long)a->lk);
    return MA_OK;
}
