/* SPDX-License-Identifier: Apache-2.0 */
/* Every kernel against its scalar twin, and the conversions against independent facts. */
#include "../test_util.h"

#include "kernels/gemm.h"

#include "core/half.h"
#include "core/env.h"
#include "kernels/kernels.h"

static void test_f16_bf16_conversions(void **state) {
    (void)state;
    /* every finite f16 survives f16 -> f32 -> f16 */
    for (uint32_t h = 0; h < 0x10000; h++) {
        uint16_t x = (uint16_t)h;
        if ((x & 0x7c00) == 0x7c00 && (x & 0x3ff)) continue; /* NaN payloads */
        assert_int_equal(ma_f32_to_f16(ma_f16_to_f32(x)), x);
    }
    assert_true(ma_f16_to_f32(0x3c00) == 1.0f);
    assert_true(ma_f16_to_f32(0xc000) == -2.0f);
    assert_true(ma_f16_to_f32(0x0001) == 5.9604644775390625e-08f); /* smallest subnormal */
    assert_true(ma_f16_to_f32(0x7bff) == 65504.0f);
    assert_int_equal(ma_f32_to_f16(65520.0f), 0x7c00);           /* rounds to inf */
    assert_int_equal(ma_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00); /* tie to even */
    assert_int_equal(ma_f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);
    assert_true(ma_bf16_to_f32(0x3f80) == 1.0f);
    assert_int_equal(ma_f32_to_bf16(1.0f + 1.0f / 256), 0x3f80); /* tie to even */
    assert_int_equal(ma_f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
    assert_true(isnan(ma_bf16_to_f32(ma_f32_to_bf16(NAN))));
}

/* quantise rows of w into q8_0 / q4_0 blocks (round to nearest, as ggml) */
static void quant_q8_0(const float *w, int64_t n, uint8_t *out) {
    for (int64_t b = 0; b < n / 32; b++) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(w[b * 32 + i]));
        float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        uint16_t dh = ma_f32_to_f16(d);
        out[b * 34] = (uint8_t)dh;
        out[b * 34 + 1] = (uint8_t)(dh >> 8);
        for (int i = 0; i < 32; i++) out[b * 34 + 2 + i] = (uint8_t)(int8_t)lroundf(w[b * 32 + i] * id);
    }
}

static void quant_q4_0(const float *w, int64_t n, uint8_t *out) {
    for (int64_t b = 0; b < n / 32; b++) {
        float amax = 0, mx = 0;
        for (int i = 0; i < 32; i++)
            if (fabsf(w[b * 32 + i]) > amax) {
                amax = fabsf(w[b * 32 + i]);
                mx = w[b * 32 + i];
            }
        float d = mx / -8.0f, id = d ? 1.0f / d : 0.0f;
        uint16_t dh = ma_f32_to_f16(d);
        out[b * 18] = (uint8_t)dh;
        out[b * 18 + 1] = (uint8_t)(dh >> 8);
        for (int j = 0; j < 16; j++) {
            int lo = (int)fminf(15.0f, floorf(w[b * 32 + j] * id + 8.5f));
            int hi = (int)fminf(15.0f, floorf(w[b * 32 + j + 16] * id + 8.5f));
            out[b * 18 + 2 + j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

/* y = x W^T with the weight in dtype dt: fast path vs scalar path vs a double reference on the
 * dequantised weights */
static void check_linear(ma_dtype dt, int64_t M, int64_t N, int64_t K, uint64_t seed) {
    float *x = malloc(sizeof(float) * M * K), *wf = malloc(sizeof(float) * N * K), *deq = malloc(sizeof(float) * N * K);
    float *bias = malloc(sizeof(float) * N), *y1 = malloc(sizeof(float) * M * N), *y2 = malloc(sizeof(float) * M * N);
    tu_fill(x, M * K, seed);
    tu_fill(wf, N * K, seed + 1);
    tu_fill(bias, N, seed + 2);
    size_t nb;
    int64_t shape[2] = {N, K};
    assert_int_equal(ma_shape_nbytes(dt, 2, shape, &nb, NULL), MA_OK);
    uint8_t *wq = malloc(nb);
    for (int64_t r = 0; r < N; r++) {
        const float *row = wf + r * K;
        if (dt == MA_DT_F32) memcpy(wq + r * K * 4, row, K * 4);
        else if (dt == MA_DT_F16)
            for (int64_t k = 0; k < K; k++) ((uint16_t *)wq)[r * K + k] = ma_f32_to_f16(row[k]);
        else if (dt == MA_DT_BF16)
            for (int64_t k = 0; k < K; k++) ((uint16_t *)wq)[r * K + k] = ma_f32_to_bf16(row[k]);
        else if (dt == MA_DT_Q8_0) quant_q8_0(row, K, wq + r * (K / 32) * 34);
        else quant_q4_0(row, K, wq + r * (K / 32) * 18);
    }
    ma_mat w = {dt, N, K, wq, "w", 0, MA_COMPUTE_F32};
    for (int64_t r = 0; r < N; r++) ma_mat_row(&w, r, deq + r * K);
    ma_kctx fast, slow;
    ma_kctx_init(&fast);
    ma_kctx_init(&slow);
    fast.scalar = 0;
    slow.scalar = 1;
    ma_error err = {0};
    assert_int_equal(ma_linear(&fast, x, M, &w, bias, y1, &err), MA_OK);
    assert_int_equal(ma_linear(&slow, x, M, &w, bias, y2, &err), MA_OK);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double ref = bias[j];
            for (int64_t k = 0; k < K; k++) ref += (double)x[i * K + k] * deq[j * K + k];
            double tol = 1e-5 * (double)K + 1e-5;
            if (fabs(y1[i * N + j] - ref) > tol || fabs(y2[i * N + j] - ref) > tol)
                fail_msg("%s M=%lld N=%lld K=%lld at (%lld,%lld): fast %g scalar %g ref %g", ma_dtype_name(dt), (long long)M, (long long)N,
                         (long long)K, (long long)i, (long long)j, y1[i * N + j], y2[i * N + j], ref);
        }
    /* dequantisation error of the stored precision is bounded */
    double err_max = 0;
    for (int64_t i = 0; i < N * K; i++) err_max = fmax(err_max, fabs(deq[i] - wf[i]));
    double bound = dt == MA_DT_F32 ? 0 : dt == MA_DT_F16 ? 1e-3 : dt == MA_DT_BF16 ? 8e-3 : dt == MA_DT_Q8_0 ? 1e-2 : 0.15;
    assert_true(err_max <= bound);
    ma_kctx_free(&fast);
    ma_kctx_free(&slow);
    free(x);
    free(wf);
    free(deq);
    free(bias);
    free(y1);
    free(y2);
    free(wq);
}

static void test_linear_all_types(void **state) {
    (void)state;
    const ma_dtype types[] = {MA_DT_F32, MA_DT_F16, MA_DT_BF16, MA_DT_Q8_0, MA_DT_Q4_0};
    const int64_t shapes[][3] = {{1, 1, 32}, {1, 7, 64}, {10, 33, 96}, {3, 257, 32}, {17, 5, 160}, {128, 64, 64}};
    for (size_t t = 0; t < 5; t++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            check_linear(types[t], shapes[s][0], shapes[s][1], shapes[s][2], 10 * t + s);
    /* K not a multiple of 32 for the plain types */
    for (size_t t = 0; t < 3; t++) check_linear(types[t], 5, 9, 37, 99 + t);
}

/* attention against a direct double-precision softmax, with every mask kind */
static void check_attention(int64_t lq, int64_t lk, int64_t hd, const ma_attn_mask *mask, int scalar) {
    float *q = malloc(sizeof(float) * lq * hd), *k = malloc(sizeof(float) * lk * hd), *v = malloc(sizeof(float) * lk * hd);
    float *o = malloc(sizeof(float) * lq * hd);
    tu_fill(q, lq * hd, 5);
    tu_fill(k, lk * hd, 6);
    tu_fill(v, lk * hd, 7);
    ma_kctx kc;
    ma_kctx_init(&kc);
    kc.scalar = scalar;
    ma_error err = {0};
    assert_int_equal(ma_attention_head(&kc, q, hd, k, hd, v, hd, o, hd, lq, lk, hd, mask, &err), MA_OK);
    double *p = malloc(sizeof(double) * lk);
    for (int64_t i = 0; i < lq; i++) {
        double mx = -1e300, sum = 0;
        int any = 0;
        for (int64_t j = 0; j < lk; j++) {
            int ok = !mask || ((!mask->key_valid || mask->key_valid[j]) &&
                               (!mask->causal || j <= i || (mask->bidir && mask->bidir[i] && mask->bidir[j])));
            double sc = 0;
            for (int64_t e = 0; e < hd; e++) sc += (double)q[i * hd + e] * k[j * hd + e];
            p[j] = ok ? sc / sqrt((double)hd) : -INFINITY;
            any |= ok;
        }
        for (int64_t j = 0; j < lk; j++) {
            if (!any) p[j] = 0;
            mx = fmax(mx, p[j]);
        }
        for (int64_t j = 0; j < lk; j++) {
            p[j] = exp(p[j] - mx);
            sum += p[j];
        }
        for (int64_t e = 0; e < hd; e++) {
            double ref = 0;
            for (int64_t j = 0; j < lk; j++) ref += p[j] / sum * v[j * hd + e];
            if (fabs(ref - o[i * hd + e]) > 2e-5) fail_msg("attention row %lld: %g vs %g", (long long)i, o[i * hd + e], ref);
        }
    }
    ma_kctx_free(&kc);
    free(q);
    free(k);
    free(v);
    free(o);
    free(p);
}

static void test_attention_masks(void **state) {
    (void)state;
    uint8_t valid[9] = {0, 1, 1, 1, 0, 1, 1, 1, 0}, img[9] = {0, 1, 1, 0, 0, 1, 1, 0, 0}, none[9] = {0};
    ma_attn_mask keymask = {valid, 0, NULL}, causal = {NULL, 1, NULL}, llm = {NULL, 1, img}, empty = {none, 0, NULL};
    for (int scalar = 0; scalar < 2; scalar++) {
        check_attention(9, 9, 16, NULL, scalar);
        check_attention(3, 9, 8, &keymask, scalar);
        check_attention(9, 9, 8, &causal, scalar);
        check_attention(9, 9, 8, &llm, scalar);
        check_attention(2, 9, 8, &empty, scalar); /* no visible key: uniform, like finfo.min masks */
    }
}

static void test_norms_and_activations(void **state) {
    (void)state;
    float x[8] = {1, -2, 3, -4, 5, -6, 7, -8}, w[8] = {1, 2, 1, 2, 1, 2, 1, 2}, y[8];
    memcpy(y, x, sizeof x);
    ma_rmsnorm(y, 1, 8, w, 1e-6f);
    double ms = 0;
    for (int i = 0; i < 8; i++) ms += x[i] * x[i];
    for (int i = 0; i < 8; i++) assert_true(fabs(y[i] - w[i] * x[i] / sqrt(ms / 8 + 1e-6)) < 1e-6);
    memcpy(y, x, sizeof x);
    ma_layernorm(y, 2, 4, NULL, NULL, 1e-6f);
    for (int r = 0; r < 2; r++) {
        double m = 0, v = 0;
        for (int i = 0; i < 4; i++) m += y[r * 4 + i];
        for (int i = 0; i < 4; i++) v += y[r * 4 + i] * y[r * 4 + i];
        assert_true(fabs(m) < 1e-6 && fabs(v / 4 - 1) < 1e-5);
    }
    float g[3] = {-1.0f, 0.0f, 2.0f};
    ma_activate(g, 3, MA_ACT_GELU_TANH);
    assert_true(fabs(g[0] - (-0.158808)) < 1e-5 && g[1] == 0 && fabs(g[2] - 1.954598) < 1e-5);
    float s[2] = {-1.0f, 3.0f};
    ma_activate(s, 2, MA_ACT_SILU);
    assert_true(fabs(s[0] - (-0.268941)) < 1e-5 && fabs(s[1] - 2.857722) < 1e-5);
}

/* many rows (shared by the pool) and widths that are no multiple of the 8 partial sums: against
 * a plain double reference, and each row equal to the same row normalised alone */
/* ma_add on the pool (large n) is the plain sum, to the last element */
static void test_add_large(void **state) {
    (void)state;
    const int64_t n = (1 << 19) + 5;
    float *y = malloc(sizeof(float) * n), *x = malloc(sizeof(float) * n), *ref = malloc(sizeof(float) * n);
    tu_fill(y, (size_t)n, 91);
    tu_fill(x, (size_t)n, 92);
    for (int64_t i = 0; i < n; i++) ref[i] = y[i] + x[i];
    ma_add(y, x, n);
    assert_memory_equal(y, ref, sizeof(float) * n);
    free(y);
    free(x);
    free(ref);
}

/* ma_gemm_nt (every beta) and ma_gemm_nn: the fast path against the scalar one */
static void test_gemm_nt_nn(void **state) {
    (void)state;
    /* the AMX set splits both fp32 operands into two bf16 terms: about 2^-16 of each product
     * (tests/kernels/test_gemm.c holds it to that against double sums); FMA kernels 1e-5 */
    const float tol = strcmp(ma_gemm_kernels(), "amx") ? 1e-5f : 1e-4f;
    const int64_t M = 19, N = 23, K = 41, ld = 45;
    float A[19 * 45], B[41 * 45], C0[19 * 45], C[2][19 * 45];
    tu_fill(A, 19 * 45, 81);
    tu_fill(B, 41 * 45, 82);
    tu_fill(C0, 19 * 45, 83);
    const float betas[] = {0.0f, 1.0f, 0.5f, -2.0f};
    ma_kctx kc[2];
    for (int s = 0; s < 2; s++) ma_kctx_init(&kc[s]), kc[s].scalar = s;
    for (int b = 0; b < 4; b++) {
        for (int s = 0; s < 2; s++) {
            memcpy(C[s], C0, sizeof C0);
            ma_gemm_nt(&kc[s], M, N, K, A, ld, B, ld, betas[b], C[s], ld);
        }
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < ld; j++) {
                const float want = j < N ? C[1][i * ld + j] : C0[i * ld + j]; /* columns past N untouched */
                assert_true(fabsf(C[0][i * ld + j] - want) <= tol * (1.0f + fabsf(want)));
            }
    }
    for (int s = 0; s < 2; s++) ma_gemm_nn(&kc[s], M, N, K, A, ld, B, ld, C[s], ld); /* B as [K][N] */
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) assert_true(fabsf(C[0][i * ld + j] - C[1][i * ld + j]) <= tol * (1.0f + fabsf(C[1][i * ld + j])));
    for (int s = 0; s < 2; s++) ma_kctx_free(&kc[s]);
}

/* ma_glu: fast (pool, SIMD) against the scalar path, strided rows, out aliasing gate, every act */
static void test_glu(void **state) {
    (void)state;
    const int64_t rows = 37, n = 4100, ld = 2 * n + 3;
    const ma_act acts[] = {MA_ACT_SILU, MA_ACT_GELU_TANH, MA_ACT_QUICK_GELU, MA_ACT_RELU};
    float *in = malloc(sizeof(float) * rows * ld), *a = malloc(sizeof(float) * rows * n), *b = malloc(sizeof(float) * rows * ld);
    float *up = malloc(sizeof(float) * rows * n);
    tu_fill(in, (size_t)(rows * ld), 77);
    for (int64_t i = 0; i < rows * ld; i++) in[i] *= 8.0f;
    for (int64_t r = 0; r < rows; r++) memcpy(up + r * n, in + r * ld, sizeof(float) * n);
    ma_kctx fast, slow;
    ma_kctx_init(&fast);
    ma_kctx_init(&slow);
    slow.scalar = 1;
    for (size_t k = 0; k < 4; k++) {
        /* gate = second half of each row, up = first half (the LLM's layout) */
        ma_glu(&fast, a, n, in + n, ld, up, n, rows, n, acts[k]);
        memcpy(b, in, sizeof(float) * rows * ld);
        ma_glu(&slow, b + n, ld, b + n, ld, b, ld, rows, n, acts[k]); /* in place */
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < n; i++) {
                const float want = b[r * ld + n + i], got = a[r * n + i];
                if (!(fabsf(got - want) <= 2e-6f * (fabsf(want) + 1.0f)))
                    fail_msg("glu act %d row %lld [%lld]: %.9g, expected %.9g", (int)acts[k], (long long)r, (long long)i, got, want);
            }
    }
    ma_kctx_free(&fast);
    ma_kctx_free(&slow);
    free(in);
    free(a);
    free(b);
    free(up);
}

static void test_norms_many_rows(void **state) {
    (void)state;
    static const int64_t dims[] = {1, 7, 72, 1153};
    for (size_t di = 0; di < 4; di++) {
        const int64_t dim = dims[di], rows = (1 << 16) / dim + 3;
        float *x = malloc(sizeof(float) * rows * dim), *y = malloc(sizeof(float) * rows * dim);
        float *one = malloc(sizeof(float) * dim), *w = malloc(sizeof(float) * dim), *b = malloc(sizeof(float) * dim);
        tu_fill(x, (size_t)(rows * dim), 40 + di);
        tu_fill(w, (size_t)dim, 50 + di);
        tu_fill(b, (size_t)dim, 60 + di);
        for (int rms = 0; rms < 2; rms++) {
            memcpy(y, x, sizeof(float) * rows * dim);
            if (rms) ma_rmsnorm(y, rows, dim, w, 1e-6f);
            else ma_layernorm(y, rows, dim, w, b, 1e-6f);
            for (int64_t r = 0; r < rows; r++) {
                const float *v = x + r * dim;
                double m = 0, q = 0;
                if (!rms) {
                    for (int64_t i = 0; i < dim; i++) m += v[i];
                    m /= (double)dim;
                }
                for (int64_t i = 0; i < dim; i++) q += (v[i] - m) * (v[i] - m);
                const double inv = 1.0 / sqrt(q / (double)dim + 1e-6);
                for (int64_t i = 0; i < dim; i++) {
                    const double ref = rms ? w[i] * v[i] * inv : (v[i] - m) * inv * w[i] + b[i];
                    if (!(fabs(y[r * dim + i] - ref) <= 2e-6 * (fabs(ref) + 1.0)))
                        fail_msg("%s dim %lld row %lld [%lld]: %.9g, expected %.9g", rms ? "rmsnorm" : "layernorm", (long long)dim,
                                 (long long)r, (long long)i, y[r * dim + i], ref);
                }
                if (r % 97 == 0) {
                    /* out of place: the same bits, the input untouched */
                    float *z = one;
                    if (rms) ma_rmsnorm_to(z, v, 1, dim, w, 1e-6f);
                    else ma_layernorm_to(z, v, 1, dim, w, b, 1e-6f);
                    assert_memory_equal(z, y + r * dim, sizeof(float) * dim);
                    memcpy(one, v, sizeof(float) * dim);
                    if (rms) ma_rmsnorm(one, 1, dim, w, 1e-6f);
                    else ma_layernorm(one, 1, dim, w, b, 1e-6f);
                    assert_memory_equal(one, y + r * dim, sizeof(float) * dim);
                }
            }
        }
        free(x);
        free(y);
        free(one);
        free(w);
        free(b);
    }
}

int main(void) {
    /* MOLMOACT_KERNELS=<set> holds that set to the scalar twin (read through the one table) */
    ma_settings st;
    ma_error err = {0};
    if (ma_settings_from_env(&st, &err) || ma_kernels_configure(&st, &err)) {
        fprintf(stderr, "test_kernels: %s\n", err.msg);
        return 2;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_bf16_conversions), cmocka_unit_test(test_linear_all_types),
        cmocka_unit_test(test_attention_masks),      cmocka_unit_test(test_norms_and_activations),
        cmocka_unit_test(test_norms_many_rows),      cmocka_unit_test(test_glu),
        cmocka_unit_test(test_gemm_nt_nn),           cmocka_unit_test(test_add_large),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
