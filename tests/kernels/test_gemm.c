/* SPDX-License-Identifier: Apache-2.0 */
/* The blocked GEMM (portable and SIMD micro-kernels, every B layout and weight type, the panel
 * packing), the batched attention, the vector math and the thread pool, each against a plain
 * reference: a double-precision triple loop on the dequantised weights, ma_attention_head on
 * the scalar path, libm. Shapes include the edges: M = 1, M past a block, N odd, K past a chunk
 * and not a multiple of 8. */
#include "../test_util.h"

#include <stdatomic.h>

#include "core/half.h"
#include "kernels/gemm.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "kernels/threads.h"
#include "kernels/vecmath.h"

/* reference C = A W^T (+ C0) (+ bias) in double on the f32 values W holds after conversion */
static void reference(int64_t M, int64_t N, int64_t K, const float *A, const float *W, const float *bias, const float *C0, double *ref,
                      double *mag) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = C0 ? C0[m * N + n] : 0.0, a = C0 ? fabs(C0[m * N + n]) : 0.0;
            for (int64_t k = 0; k < K; k++) {
                s += (double)A[m * K + k] * W[n * K + k];
                a += fabs((double)A[m * K + k] * W[n * K + k]);
            }
            if (bias) {
                s += bias[n];
                a += fabs(bias[n]);
            }
            ref[m * N + n] = s;
            mag[m * N + n] = a;
        }
}

/* rel: of the sum of |products|; fp32 FMA chains stay within 2e-6 here, the AMX kernels (bf16
 * hi/lo split, see gemm_amx.c) within about 2^-17 per product */
/* with f32 weights (or f32 B: attention's operands) the AMX split of w is not exact either: a
 * 2^-17 residual of each operand plus the dropped lo x lo term (2^-18), 2.5 x 2^-17 = 1.9e-5 */
static double kernel_rel_dt(int ks, ma_dtype dt) {
    if (strcmp(ma_gemm_kernel_name(ks), "amx")) return 2e-6;
    return dt == MA_DT_F32 ? 3e-5 : 1.5e-5;
}

/* the int8-activation kernels' bound beyond fp32 rounding (gemm.h): sum over k of
 * |w| max|a of k's 32-block| / 254, with 1 % to spare for the scaling's own rounding */
static void int8_bound(int64_t M, int64_t N, int64_t K, const float *A, const float *W, double *qb) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double b = 0.0;
            for (int64_t k0 = 0; k0 < K; k0 += 32) {
                double amax = 0.0, wsum = 0.0;
                for (int64_t k = k0; k < k0 + 32 && k < K; k++) {
                    amax = fmax(amax, fabs(A[m * K + k]));
                    wsum += fabs(W[n * K + k]);
                }
                b += amax / 254.0 * wsum;
            }
            qb[m * N + n] = 1.01 * b;
        }
}

static void expect_close_q(const float *got, const double *ref, const double *mag, const double *qb, int64_t n, double rel,
                           const char *what) {
    for (int64_t i = 0; i < n; i++) {
        const double tol = rel * mag[i] + (qb ? qb[i] : 0.0) + 1e-6;
        if (!(fabs(got[i] - ref[i]) <= tol))
            fail_msg("%s: element %lld is %.9g, expected %.9g (tol %.3g)", what, (long long)i, got[i], ref[i], tol);
    }
}

static void expect_close(const float *got, const double *ref, const double *mag, int64_t n, double rel, const char *what) {
    for (int64_t i = 0; i < n; i++) {
        const double tol = rel * mag[i] + 1e-6;
        if (!(fabs(got[i] - ref[i]) <= tol))
            fail_msg("%s: element %lld is %.9g, expected %.9g (tol %.3g)", what, (long long)i, got[i], ref[i], tol);
    }
}

/* W [N][K] stored as dt, row-major (*rows) and in the panel layout (*panels, both malloc'ed), and
 * the f32 values they stand for (Wq) */
static void stored_weights(ma_dtype dt, int64_t N, int64_t K, const float *W, uint8_t **rows, uint8_t **panels, float *Wq) {
    *rows = malloc(ma_panels_size(dt, N, K) + 64);
    *panels = malloc(ma_panels_size(dt, N, K));
    ma_convert_from_f32(dt, W, N * K, *rows);
    for (int64_t n = 0; n < N; n++) {
        ma_mat wm = {dt, N, K, *rows, "w", 0, MA_COMPUTE_F32};
        ma_mat_row(&wm, n, Wq + n * K);
    }
    ma_pack_panels(dt, *rows, N, K, *panels);
}

/* one GEMM shape for one weight type, in both kernels and both layouts */
static void check_shape(ma_dtype dt, int64_t M, int64_t N, int64_t K, int with_bias, int accumulate, uint64_t seed) {
    float *A = malloc(sizeof(float) * M * K), *W = malloc(sizeof(float) * N * K), *Wq = malloc(sizeof(float) * N * K);
    float *bias = malloc(sizeof(float) * N), *C0 = malloc(sizeof(float) * M * N), *C = malloc(sizeof(float) * M * N);
    float *C2 = malloc(sizeof(float) * M * N);
    double *ref = malloc(sizeof(double) * M * N), *mag = malloc(sizeof(double) * M * N);
    tu_fill(A, M * K, seed);
    tu_fill(W, N * K, seed + 1);
    tu_fill(bias, N, seed + 2);
    tu_fill(C0, M * N, seed + 3);
    uint8_t *rows, *panels;
    stored_weights(dt, N, K, W, &rows, &panels, Wq);
    /* a row read back from the panel layout holds the same values */
    float *back = malloc(sizeof(float) * K);
    for (int64_t n = 0; n < N; n++) {
        ma_mat pm = {dt, N, K, panels, "w", 1, MA_COMPUTE_F32};
        ma_mat_row(&pm, n, back);
        assert_memory_equal(back, Wq + n * K, sizeof(float) * K);
    }
    free(back);
    reference(M, N, K, A, Wq, with_bias ? bias : NULL, accumulate ? C0 : NULL, ref, mag);
    const int quant = dt == MA_DT_Q8_0 || dt == MA_DT_Q4_0;
    double *qb = NULL;
    if (quant) {
        qb = malloc(sizeof(double) * M * N);
        int8_bound(M, N, K, A, Wq, qb);
    }
    char what[128];
    for (int ks = 0; ks < ma_gemm_kernel_count(); ks++) {
        ma_gemm_select(ks);
        const char *kname = ma_gemm_kernel_name(ks);
        float *first = NULL;
        for (int layout = 0; layout < 2; layout++) {
            ma_bmat b = {layout ? MA_B_PANELS : MA_B_ROWS, dt, layout ? (const void *)panels : (const void *)rows, K, 0, MA_COMPUTE_F32};
            float *out = layout ? C2 : C;
            memcpy(out, C0, sizeof(float) * M * N);
            ma_gemm(M, N, K, A, K, &b, with_bias ? bias : NULL, accumulate, out, N);
            snprintf(what, sizeof what, "%s %s %s M=%lld N=%lld K=%lld", ma_dtype_name(dt), kname, layout ? "panels" : "rows", (long long)M,
                     (long long)N, (long long)K);
            /* the int8 kernels (panels only) are held to the int8 bound on top; the amx set
             * takes them for 12 rows or fewer only (its tiles, fp32-accurate, beyond) */
            const int int8 = qb && layout && ma_gemm_kernel_int8_activations(ks) && (M <= MA_GEMM_MR_MAX || strcmp(kname, "amx"));
            expect_close_q(out, ref, mag, int8 ? qb : NULL, M * N, kernel_rel_dt(ks, dt), what);
            if (!first) first = out;
        }
        /* the two layouts feed the same values to the same micro-kernel: identical bits (except
         * where the AVX-512 small-M kernel, also the AMX set's, reads the panels directly:
         * another summation order) */
        const int small_direct = M <= MA_GEMM_MR_MAX && (!strcmp(kname, "avx512") || !strcmp(kname, "vnni") || !strcmp(kname, "amx") ||
                                                         !strcmp(kname, "neon") || !strcmp(kname, "neon_dot"));
        const int int8_panels = quant && (!strcmp(kname, "vnni") || !strcmp(kname, "neon_dot")); /* the rows layout stays fp32 */
        if (!small_direct && !int8_panels) assert_memory_equal(C, C2, sizeof(float) * M * N);
        /* f16 / bf16 / f32 panels read in place or converted into a shared buffer first (the
         * other choice than this CPU's default): the same values in the same order */
        ma_gemm_set_in_place(!ma_gemm_in_place());
        ma_bmat bp = {MA_B_PANELS, dt, panels, K, 0, MA_COMPUTE_F32};
        memcpy(C, C0, sizeof(float) * M * N);
        ma_gemm(M, N, K, A, K, &bp, with_bias ? bias : NULL, accumulate, C, N);
        ma_gemm_set_in_place(-1);
        assert_memory_equal(C, C2, sizeof(float) * M * N);
    }
    ma_gemm_select_portable(0);
    free(qb);
    free(A);
    free(W);
    free(Wq);
    free(bias);
    free(C0);
    free(C);
    free(C2);
    free(ref);
    free(mag);
    free(rows);
    free(panels);
}

static void test_gemm_every_type_and_edge(void **state) {
    (void)state;
    static const int64_t Ms[] = {1, 5, 7, 12, 13, 150}; /* the 6- and 12-row tiles, past a 144-row block */
    static const int64_t Ns[] = {1, 16, 17, 50};
    static const int64_t Kf[] = {1, 7, 64, 400}; /* float types: any K, past one 384 chunk */
    static const int64_t Kq[] = {32, 96, 416};   /* quantised: multiples of 32 */
    static const ma_dtype types[] = {MA_DT_F32, MA_DT_F16, MA_DT_BF16, MA_DT_Q8_0, MA_DT_Q4_0};
    uint64_t seed = 1;
    for (size_t t = 0; t < 5; t++) {
        const int quant = types[t] == MA_DT_Q8_0 || types[t] == MA_DT_Q4_0;
        const int64_t *Ks = quant ? Kq : Kf;
        const size_t nk = quant ? 3 : 4;
        for (size_t mi = 0; mi < 5; mi++)
            for (size_t ni = 0; ni < 4; ni++)
                for (size_t ki = 0; ki < nk; ki++, seed++)
                    check_shape(types[t], Ms[mi], Ns[ni], Ks[ki], (int)(seed % 2), (int)(seed % 3 == 0), seed);
    }
    /* past the big blocks: rows split across threads and past one AMX row block (512), more
     * panels than one converted group (32), K past a chunk and not a multiple of 32 */
    check_shape(MA_DT_F16, 600, 530, 400, 1, 0, 901);
    check_shape(MA_DT_BF16, 601, 33, 70, 0, 1, 902);
    check_shape(MA_DT_Q4_0, 577, 40, 416, 1, 1, 903);
    /* threads splitting the panels, each with more than one group (A packed once per K chunk) */
    check_shape(MA_DT_F16, 150, 1100, 400, 1, 1, 904);
}

/* ---------------------------------------------------------------- the bf16 compute plan */

/* x rounded to bf16, to nearest even (what VCVTNE2PS2BF16 does to finite values) */
static float bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* one shape with MA_COMPUTE_BF16 on every kernel set, both layouts: where the set has a bf16
 * unit and M > 12, the products of the bf16-rounded operands summed in fp32 (held to the fp32
 * kernels' bound against a double reference on the rounded values, and shown to be that plan:
 * somewhere far from the exact product); elsewhere the fp32 result */
static void check_bf16(ma_dtype dt, int64_t M, int64_t N, int64_t K, int with_bias, int accumulate, uint64_t seed) {
    float *A = malloc(sizeof(float) * M * K), *W = malloc(sizeof(float) * N * K), *Wq = malloc(sizeof(float) * N * K);
    float *Ar = malloc(sizeof(float) * M * K), *Wr = malloc(sizeof(float) * N * K);
    float *bias = malloc(sizeof(float) * N), *C0 = malloc(sizeof(float) * M * N), *C = malloc(sizeof(float) * M * N);
    double *ref = malloc(sizeof(double) * M * N), *mag = malloc(sizeof(double) * M * N);
    double *refr = malloc(sizeof(double) * M * N), *magr = malloc(sizeof(double) * M * N);
    tu_fill(A, M * K, seed);
    tu_fill(W, N * K, seed + 1);
    tu_fill(bias, N, seed + 2);
    tu_fill(C0, M * N, seed + 3);
    uint8_t *rows, *panels;
    stored_weights(dt, N, K, W, &rows, &panels, Wq);
    for (int64_t i = 0; i < M * K; i++) Ar[i] = bf16_round(A[i]);
    for (int64_t i = 0; i < N * K; i++) Wr[i] = bf16_round(Wq[i]);
    reference(M, N, K, A, Wq, with_bias ? bias : NULL, accumulate ? C0 : NULL, ref, mag);
    reference(M, N, K, Ar, Wr, with_bias ? bias : NULL, accumulate ? C0 : NULL, refr, magr);
    char what[160];
    int bf16_runs = 0;
    for (int ks = 0; ks < ma_gemm_kernel_count(); ks++) {
        ma_gemm_select(ks);
        const int bf16 = ma_gemm_kernel_bf16(ks) == MA_COMPUTE_BF16 && M > MA_GEMM_MR_MAX;
        for (int layout = 0; layout < 2; layout++) {
            ma_bmat b = {layout ? MA_B_PANELS : MA_B_ROWS, dt, layout ? (const void *)panels : (const void *)rows, K, 0, MA_COMPUTE_BF16};
            memcpy(C, C0, sizeof(float) * M * N);
            ma_gemm(M, N, K, A, K, &b, with_bias ? bias : NULL, accumulate, C, N);
            snprintf(what, sizeof what, "bf16 compute %s %s (%s) %s M=%lld N=%lld K=%lld", ma_dtype_name(dt), ma_gemm_kernel_name(ks),
                     bf16 ? ma_gemm_bf16_unit() : "fp32", layout ? "panels" : "rows", (long long)M, (long long)N, (long long)K);
            if (!bf16) { /* fp32 as the set computes it (its int8 kernels for quantised panels) */
                const int int8 = (dt == MA_DT_Q8_0 || dt == MA_DT_Q4_0) && layout && ma_gemm_kernel_int8_activations(ks);
                double *qb = NULL;
                if (int8) {
                    qb = malloc(sizeof(double) * M * N);
                    int8_bound(M, N, K, A, Wq, qb);
                }
                expect_close_q(C, ref, mag, qb, M * N, kernel_rel_dt(ks, dt), what);
                free(qb);
                continue;
            }
            bf16_runs++;
            expect_close(C, refr, magr, M * N, 4e-6, what);
            double far = 0.0; /* the largest departure from the exact product, in units of the fp32 bound */
            for (int64_t i = 0; i < M * N; i++) far = fmax(far, fabs(C[i] - ref[i]) / (2e-6 * mag[i] + 1e-6));
            if (far < 20.0) fail_msg("%s: within %.1f x the fp32 bound of the exact product: not the bf16 plan", what, far);
        }
    }
    ma_gemm_select_portable(0);
    /* a CPU with a bf16 unit ran the plan on its best set */
    if (M > MA_GEMM_MR_MAX && ma_gemm_kernel_bf16(ma_gemm_kernel_count() - 1) == MA_COMPUTE_BF16 && bf16_runs < 2)
        fail_msg("bf16 compute %s M=%lld: the bf16 plan ran %d times on a CPU with %s", ma_dtype_name(dt), (long long)M, bf16_runs,
                 ma_gemm_bf16_unit());
    free(A);
    free(W);
    free(Wq);
    free(Ar);
    free(Wr);
    free(bias);
    free(C0);
    free(C);
    free(ref);
    free(mag);
    free(refr);
    free(magr);
    free(rows);
    free(panels);
}

static void bf16_cases(void) {
    static const int64_t Ms[] = {12, 13, 31, 33, 150};
    static const int64_t Ns[] = {1, 17, 50};
    static const int64_t Kf[] = {7, 64, 400, 800}; /* past one chunk of the hi-only layout (768) */
    static const ma_dtype types[] = {MA_DT_F32, MA_DT_F16, MA_DT_BF16, MA_DT_Q8_0};
    uint64_t seed = 5000;
    for (size_t t = 0; t < 4; t++)
        for (size_t mi = 0; mi < 5; mi++)
            for (size_t ni = 0; ni < 3; ni++)
                for (size_t ki = 0; ki < 4; ki++, seed++) {
                    const int64_t K = types[t] == MA_DT_Q8_0 ? (Kf[ki] + 31) / 32 * 32 : Kf[ki];
                    check_bf16(types[t], Ms[mi], Ns[ni], K, (int)(seed % 2), (int)(seed % 3 == 0), seed);
                }
    /* rows split across the threads and past one row block (512), panels past a group (32),
     * the vision MLP's K (4304: six chunks) */
    check_bf16(MA_DT_F16, 600, 530, 1152, 1, 0, 5901);
    check_bf16(MA_DT_F16, 64, 40, 4304, 0, 1, 5902);
}

static void test_gemm_bf16_compute(void **state) {
    (void)state;
    bf16_cases();
    /* the VDPBF16PS tile too where the CPU has it and the AMX tiles or its own speed made the
     * kernels pass it by */
    ma_gemm_set_bf16_dot(1);
    bf16_cases();
    ma_gemm_set_bf16_dot(-1);
    /* a fused job takes the plan only when every part does */
    const int64_t M = 40, K = 64;
    float *A = malloc(sizeof(float) * M * K), *W = malloc(sizeof(float) * 2 * 16 * K), *C1 = malloc(sizeof(float) * M * 16),
          *C2 = malloc(sizeof(float) * M * 16), *S1 = malloc(sizeof(float) * M * 16);
    tu_fill(A, M * K, 77);
    tu_fill(W, 2 * 16 * K, 78);
    ma_bmat b1 = {MA_B_ROWS, MA_DT_F32, W, K, 0, MA_COMPUTE_BF16}, b2 = {MA_B_ROWS, MA_DT_F32, W + 16 * K, K, 0, MA_COMPUTE_F32};
    ma_gemm_part parts[2] = {{&b1, 16, NULL, C1, 16}, {&b2, 16, NULL, C2, 16}};
    ma_gemm_fused(M, K, A, K, parts, 2);
    ma_bmat b1f = b1;
    b1f.compute = MA_COMPUTE_F32;
    ma_gemm(M, 16, K, A, K, &b1f, NULL, 0, S1, 16);
    assert_memory_equal(C1, S1, sizeof(float) * M * 16);
    free(A);
    free(W);
    free(C1);
    free(C2);
    free(S1);
}

/* ------------------------------------------------------------------ the f16 plan's scalar twin
 * MA_COMPUTE_F16's arithmetic (gemm.h) written out with scalar code and libm, independent of the
 * NEON tiles: per K chunk of MA_GEMM_KC, each row of A scaled by the power of two that brings its
 * largest |a| into [8, 16), rounded to f16; per output, f16 fused multiply-adds over blocks of
 * MA_GEMM_F16_KB k, each block sum added to an fp32 sum; C (+)= inverse scale x that sum. */

/* round to f16, to nearest even (a value exact in double; f16 subnormals kept) */
static uint16_t twin_d2h(double x) {
    if (isnan(x)) return 0x7e00u;
    const uint16_t sign = signbit(x) ? 0x8000u : 0;
    const double a = fabs(x);
    if (a >= 65520.0) return (uint16_t)(sign | 0x7c00u);
    double q = 5.9604644775390625e-08; /* 2^-24: the subnormals' step */
    if (a >= 6.103515625e-05) {
        int e;
        frexp(a, &e);
        q = ldexp(1.0, e - 11);
    }
    return (uint16_t)(sign | ma_f32_to_f16((float)(nearbyint(a / q) * q)));
}

static void twin_f16(int64_t M, int64_t N, int64_t K, const float *A, const uint16_t *Wh, int accumulate, float *C) {
    uint16_t *ah = malloc(sizeof(uint16_t) * (size_t)K);
    for (int64_t m = 0; m < M; m++)
        for (int64_t k0 = 0; k0 < K; k0 += MA_GEMM_KC) {
            const int64_t kc = K - k0 < MA_GEMM_KC ? K - k0 : MA_GEMM_KC;
            float amax = 0.0f, scale = 1.0f, inv = 1.0f;
            for (int64_t k = 0; k < kc; k++) amax = fabsf(A[m * K + k0 + k]) > amax ? fabsf(A[m * K + k0 + k]) : amax;
            int e = 0;
            if (amax > 0.0f && isfinite(amax)) frexpf(amax, &e);
            if (e != 0 && e >= -100) {
                scale = ldexpf(1.0f, 4 - e);
                inv = ldexpf(1.0f, e - 4);
            }
            for (int64_t k = 0; k < kc; k++) ah[k] = ma_f32_to_f16(A[m * K + k0 + k] * scale);
            for (int64_t n = 0; n < N; n++) {
                float s32 = 0.0f;
                for (int64_t b = 0; b < kc; b += MA_GEMM_F16_KB) {
                    uint16_t h = 0;
                    for (int64_t k = b; k < kc && k < b + MA_GEMM_F16_KB; k++)
                        h = twin_d2h((double)ma_f16_to_f32(ah[k]) * (double)ma_f16_to_f32(Wh[n * K + k0 + k]) + (double)ma_f16_to_f32(h));
                    s32 = s32 + ma_f16_to_f32(h);
                }
                const float v = inv * s32;
                C[m * N + n] = (accumulate || k0 > 0) ? C[m * N + n] + v : v;
            }
        }
    free(ah);
}

/* MA_COMPUTE_F16 on f16 panels: on a kernel set with the f16 tiles (aarch64 with asimdhp; under
 * qemu, cortex-a76), bit for bit the scalar twin; on the others, bit for bit the fp32 plan. Rows
 * of very different magnitudes (the scale), a zero row, K past a chunk and not a whole block, N
 * not a whole panel (the half tiles), rows past a block of MA_GEMM_MC. */
static void check_f16_plan(int64_t M, int64_t N, int64_t K, int accumulate, uint64_t seed, int *runs) {
    float *A = malloc(sizeof(float) * M * K), *W = malloc(sizeof(float) * N * K), *C0 = malloc(sizeof(float) * M * N);
    float *C = malloc(sizeof(float) * M * N), *T = malloc(sizeof(float) * M * N);
    uint16_t *Wh = malloc(sizeof(uint16_t) * N * K);
    uint8_t *panels = malloc(ma_panels_size(MA_DT_F16, N, K));
    tu_fill(A, M * K, seed);
    tu_fill(W, N * K, seed + 1);
    tu_fill(C0, M * N, seed + 2);
    for (int64_t m = 0; m < M; m++) {
        const float mag = m % 7 == 1 ? 3e4f : m % 7 == 2 ? 1e-5f : m % 7 == 3 ? 0.0f : m % 7 == 4 ? 1e-39f : m % 7 == 5 ? 1e30f : 1.0f;
        for (int64_t k = 0; k < K; k++) A[m * K + k] *= mag;
    }
    for (int64_t i = 0; i < N * K; i++) Wh[i] = ma_f32_to_f16(W[i] * 3.0f);
    ma_pack_panels(MA_DT_F16, Wh, N, K, panels);
    ma_bmat b = {MA_B_PANELS, MA_DT_F16, panels, K, 0, MA_COMPUTE_F16}, b32 = b;
    b32.compute = MA_COMPUTE_F32;
    for (int ks = 0; ks < ma_gemm_kernel_count(); ks++) {
        ma_gemm_select(ks);
        memcpy(C, C0, sizeof(float) * M * N);
        ma_gemm(M, N, K, A, K, &b, NULL, accumulate, C, N);
        memcpy(T, C0, sizeof(float) * M * N);
        if (ma_gemm_kernel_f16(ks) == MA_COMPUTE_F16 && M > MA_GEMM_MR_MAX) {
            twin_f16(M, N, K, A, Wh, accumulate, T);
            (*runs)++;
        } else ma_gemm(M, N, K, A, K, &b32, NULL, accumulate, T, N);
        for (int64_t i = 0; i < M * N; i++)
            if (memcmp(&C[i], &T[i], sizeof(float)))
                fail_msg("f16 plan, kernels %s, M=%lld N=%lld K=%lld acc=%d: C[%lld][%lld] = %.9g, the %s gives %.9g",
                         ma_gemm_kernel_name(ks), (long long)M, (long long)N, (long long)K, accumulate, (long long)(i / N),
                         (long long)(i % N), C[i], ma_gemm_kernel_f16(ks) == MA_COMPUTE_F16 ? "scalar twin" : "fp32 plan", T[i]);
    }
    ma_gemm_select_portable(0);
    free(A), free(W), free(C0), free(C), free(T), free(Wh), free(panels);
}

static void test_gemm_f16_compute(void **state) {
    (void)state;
    int runs = 0;
    check_f16_plan(40, 37, 100, 0, 7001, &runs);
    check_f16_plan(13, 16, 800, 1, 7002, &runs);
    check_f16_plan(150, 5, 390, 1, 7003, &runs);
    check_f16_plan(12, 20, 64, 0, 7004, &runs);   /* 12 rows: the small path, fp32 */
    check_f16_plan(29, 26, 64, 1, 7005, &runs);   /* the last panel 10 wide: both halves, the second short */
    check_f16_plan(300, 40, 100, 0, 7006, &runs); /* rows split across the threads (m_lo not a multiple of 8) */
    /* a CPU with the f16 tiles ran the plan on its best set */
    if (ma_gemm_kernel_f16(ma_gemm_kernel_count() - 1) == MA_COMPUTE_F16 && runs < 3)
        fail_msg("the f16 plan ran %d times on a CPU with asimdhp", runs);
}

/* one fused job over parts of several types and widths = separate GEMMs, bit for bit; the scalar
 * ma_linear on panels = on rows */
static void check_fused(int64_t M) {
    const int64_t K = 96;
    const int64_t Ns[3] = {17, 48, 5};
    const ma_dtype dts[3] = {MA_DT_F16, MA_DT_Q4_0, MA_DT_Q8_0};
    float *A = malloc(sizeof(float) * M * K), *W = malloc(sizeof(float) * 48 * K), bias[48];
    tu_fill(A, M * K, 21);
    tu_fill(bias, 48, 22);
    uint8_t *st[3];
    ma_bmat b[3];
    ma_gemm_part parts[3];
    float *fused[3], *single[3];
    for (int i = 0; i < 3; i++) {
        tu_fill(W, Ns[i] * K, 30 + i);
        uint8_t *rows = malloc(ma_panels_size(dts[i], Ns[i], K));
        st[i] = malloc(ma_panels_size(dts[i], Ns[i], K));
        ma_convert_from_f32(dts[i], W, Ns[i] * K, rows);
        ma_pack_panels(dts[i], rows, Ns[i], K, st[i]);
        free(rows);
        b[i] = (ma_bmat){MA_B_PANELS, dts[i], st[i], K, 0, MA_COMPUTE_F32};
        fused[i] = malloc(sizeof(float) * M * Ns[i]);
        single[i] = malloc(sizeof(float) * M * Ns[i]);
        parts[i] = (ma_gemm_part){&b[i], Ns[i], i == 1 ? NULL : bias, fused[i], Ns[i]};
    }
    for (int ks = 0; ks < ma_gemm_kernel_count(); ks++) {
        ma_gemm_select(ks);
        ma_gemm_fused(M, K, A, K, parts, 3);
        for (int i = 0; i < 3; i++) {
            ma_gemm(M, Ns[i], K, A, K, &b[i], i == 1 ? NULL : bias, 0, single[i], Ns[i]);
            assert_memory_equal(fused[i], single[i], sizeof(float) * M * Ns[i]);
        }
    }
    ma_gemm_select_portable(0);
    /* ma_linear_fused and the scalar path on panel-layout weights */
    ma_kctx kc;
    ma_kctx_init(&kc);
    ma_error err = {0};
    ma_mat wp = {MA_DT_Q4_0, 48, K, st[1], "w1", 1, MA_COMPUTE_F32};
    float *y1 = malloc(sizeof(float) * M * 48), *y2 = malloc(sizeof(float) * M * 48);
    assert_int_equal(ma_linear_fused(&kc, A, M, 1, (const ma_mat *[1]){&wp}, (const float *[1]){bias}, (float *[1]){y1}, &err), MA_OK);
    kc.scalar = 1;
    assert_int_equal(ma_linear(&kc, A, M, &wp, bias, y2, &err), MA_OK);
    /* the int8 kernels (M <= 12, where the CPU has them) differ from the scalar path by the
     * rounding of A to 8 bits: at most sum |w| max|a| / 254 per output (|w| < 1 here) */
    double slack = 0.0;
    if (ma_gemm_int8_activations()) {
        double amax = 0.0;
        for (int64_t i = 0; i < M * K; i++) amax = fmax(amax, fabs(A[i]));
        slack = 1.01 * amax / 254.0 * (double)K;
    }
    for (int64_t i = 0; i < M * 48; i++) assert_true(fabsf(y1[i] - y2[i]) <= 1e-4f * (1.0f + fabsf(y2[i])) + slack);
    ma_mat other = {MA_DT_F16, 17, K + 1, st[0], "w2", 1, MA_COMPUTE_F32};
    assert_int_equal(
        ma_linear_fused(&kc, A, M, 2, (const ma_mat *[2]){&wp, &other}, (const float *[2]){NULL, NULL}, (float *[2]){y1, y2}, &err),
        MA_ERR_SHAPE);
    assert_non_null(strstr(err.msg, "w2"));
    ma_kctx_free(&kc);
    for (int i = 0; i < 3; i++) {
        free(st[i]);
        free(fused[i]);
        free(single[i]);
    }
    free(A);
    free(W);
    free(y1);
    free(y2);
}

/* MA_COMPUTE_EXACT: q8_0 / q4_0 products keep fp32 activations on every kernel set, the int8
 * ones included (held to the fp32 tolerance, not the int8 bound), in the small-M path (<= 12
 * rows, where the amx set uses the int8 kernels too) and past it; a fused job of an exact part
 * and an ordinary one keeps each part's own path */
static void test_gemm_exact_activations(void **state) {
    (void)state;
    static const int64_t Ms[] = {2, 12, 40};
    const int64_t N = 50, K = 96;
    int int8_sets = 0;
    for (int t = 0; t < 2; t++) {
        const ma_dtype dt = t ? MA_DT_Q4_0 : MA_DT_Q8_0;
        for (size_t mi = 0; mi < 3; mi++) {
            const int64_t M = Ms[mi];
            float *A = malloc(sizeof(float) * M * K), *W = malloc(sizeof(float) * N * K), *Wq = malloc(sizeof(float) * N * K);
            float *C = malloc(sizeof(float) * M * N), *C2 = malloc(sizeof(float) * M * N);
            double *ref = malloc(sizeof(double) * M * N), *mag = malloc(sizeof(double) * M * N);
            tu_fill(A, M * K, 500 + (uint64_t)mi);
            tu_fill(W, N * K, 600 + (uint64_t)t);
            uint8_t *rows, *panels;
            stored_weights(dt, N, K, W, &rows, &panels, Wq);
            reference(M, N, K, A, Wq, NULL, NULL, ref, mag);
            char what[128];
            for (int ks = 0; ks < ma_gemm_kernel_count(); ks++) {
                ma_gemm_select(ks);
                int8_sets += ma_gemm_kernel_int8_activations(ks);
                const ma_bmat exact = {MA_B_PANELS, dt, panels, K, 0, MA_COMPUTE_EXACT};
                const ma_bmat plain = {MA_B_PANELS, dt, panels, K, 0, MA_COMPUTE_F32};
                ma_gemm(M, N, K, A, K, &exact, NULL, 0, C, N);
                snprintf(what, sizeof what, "exact %s %s M=%lld", ma_dtype_name(dt), ma_gemm_kernel_name(ks), (long long)M);
                expect_close(C, ref, mag, M * N, kernel_rel_dt(ks, dt), what);
                /* fused with the same weights on the default path: the exact part as alone */
                const ma_gemm_part parts[2] = {{&exact, N, NULL, C2, N}, {&plain, N, NULL, C, N}};
                ma_gemm_fused(M, K, A, K, parts, 2);
                snprintf(what, sizeof what, "exact part of a fused job %s %s M=%lld", ma_dtype_name(dt), ma_gemm_kernel_name(ks),
                         (long long)M);
                expect_close(C2, ref, mag, M * N, kernel_rel_dt(ks, dt), what);
            }
            ma_gemm_select_portable(0);
            free(A);
            free(W);
            free(Wq);
            free(C);
            free(C2);
            free(ref);
            free(mag);
            free(rows);
            free(panels);
        }
    }
    if (!int8_sets) printf("  (no int8 kernel set on this CPU: the exact path is the only one)\n");
}

/* the int8 kernels' phase timers (gemm_bench's shares): nothing counted while off; with timing
 * on, a q8_0 product on an int8 set counts its activation quantisation, and for more than 12
 * rows (vnni: rearranged weights) its weight rearrangement */
static void test_gemm_phase_timers(void **state) {
    (void)state;
    const int64_t M = 40, N = 64, K = 256;
    float *A = malloc(sizeof(float) * M * K), *W = malloc(sizeof(float) * N * K), *Wq = malloc(sizeof(float) * N * K);
    float *C = malloc(sizeof(float) * M * N);
    tu_fill(A, M * K, 41);
    tu_fill(W, N * K, 42);
    uint8_t *rows, *panels;
    stored_weights(MA_DT_Q8_0, N, K, W, &rows, &panels, Wq);
    const ma_bmat b = {MA_B_PANELS, MA_DT_Q8_0, panels, K, 0, MA_COMPUTE_F32};
    for (int ks = 0; ks < ma_gemm_kernel_count(); ks++) {
        ma_gemm_select(ks);
        ma_gemm_phases ph;
        ma_gemm_phases_reset();
        ma_gemm_phase_timing(0);
        ma_gemm(M, N, K, A, K, &b, NULL, 0, C, N);
        ma_gemm_phases_get(&ph);
        assert_true(ph.qa_s == 0.0 && ph.qw_s == 0.0);
        ma_gemm_phase_timing(1);
        for (int i = 0; i < 3; i++) {
            ma_gemm(M, N, K, A, K, &b, NULL, 0, C, N);
            ma_gemm(4, N, K, A, K, &b, NULL, 0, C, N);
        }
        ma_gemm_phase_timing(0);
        ma_gemm_phases_get(&ph);
        const char *k = ma_gemm_kernel_name(ks);
        if (ma_gemm_kernel_int8_activations(ks)) assert_true(ph.qa_s > 0.0);
        else assert_true(ph.qa_s == 0.0);
        if (!strcmp(k, "vnni")) assert_true(ph.qw_s > 0.0);
    }
    ma_gemm_select_portable(0);
    ma_gemm_phases_reset();
    free(A);
    free(W);
    free(Wq);
    free(C);
    free(rows);
    free(panels);
}

static void test_gemm_fused_parts(void **state) {
    (void)state;
    check_fused(23); /* the blocked path */
    check_fused(7);  /* the small-M path where the CPU has one */
}

static void test_gemm_cols_layout(void **state) {
    (void)state;
    /* C = A B with B [K][N] row-major (attention's P V), against the NT form on B^T */
    const int64_t M = 70, N = 37, K = 300;
    float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N), *Bt = malloc(sizeof(float) * N * K);
    float *C = malloc(sizeof(float) * M * N);
    double *ref = malloc(sizeof(double) * M * N), *mag = malloc(sizeof(double) * M * N);
    tu_fill(A, M * K, 9);
    tu_fill(B, K * N, 10);
    for (int64_t k = 0; k < K; k++)
        for (int64_t n = 0; n < N; n++) Bt[n * K + k] = B[k * N + n];
    reference(M, N, K, A, Bt, NULL, NULL, ref, mag);
    for (int ks = 0; ks < ma_gemm_kernel_count(); ks++) {
        ma_gemm_select(ks);
        ma_bmat b = {MA_B_COLS, MA_DT_F32, B, N, 0, MA_COMPUTE_F32};
        ma_gemm(M, N, K, A, K, &b, NULL, 0, C, N);
        expect_close(C, ref, mag, M * N, kernel_rel_dt(ks, MA_DT_F32), "cols layout");
    }
    ma_gemm_select_portable(0);
    free(A);
    free(B);
    free(Bt);
    free(C);
    free(ref);
    free(mag);
}

/* a weight W [R][C] used from row r0 as B [K][N] (the pooling's q_h W_h): the rows layout
 * (MA_B_COLS at row r0) and the panel layout (MA_B_PANELS_T, r0 not on a panel boundary), every
 * kernel set against the double reference */
static void test_gemm_weight_as_cols(void **state) {
    (void)state;
    const int64_t R = 100, Cw = 50, r0 = 13;
    static const int64_t Ms[] = {5, 30, 150}, Ns[] = {50, 37}, Ks[] = {72, 1, 87};
    static const ma_dtype types[] = {MA_DT_F32, MA_DT_F16, MA_DT_BF16};
    float *W = malloc(sizeof(float) * R * Cw), *Wq = malloc(sizeof(float) * R * Cw);
    float *A = malloc(sizeof(float) * 150 * 87), *C = malloc(sizeof(float) * 150 * 50), *Bt = malloc(sizeof(float) * 50 * 87);
    double *ref = malloc(sizeof(double) * 150 * 50), *mag = malloc(sizeof(double) * 150 * 50);
    uint8_t *rows = malloc(ma_panels_size(MA_DT_F32, R, Cw)), *panels = malloc(ma_panels_size(MA_DT_F32, R, Cw));
    tu_fill(W, R * Cw, 61);
    tu_fill(A, 150 * 87, 62);
    char what[128];
    for (size_t t = 0; t < 3; t++) {
        const ma_dtype dt = types[t];
        ma_convert_from_f32(dt, W, R * Cw, rows);
        ma_convert_to_f32(dt, rows, 0, R * Cw, Wq);
        ma_pack_panels(dt, rows, R, Cw, panels);
        const size_t es = ma_dtype_size(dt);
        for (size_t mi = 0; mi < 3; mi++)
            for (size_t ni = 0; ni < 2; ni++)
                for (size_t ki = 0; ki < 3; ki++) {
                    const int64_t M = Ms[mi], N = Ns[ni], K = Ks[ki];
                    for (int64_t n = 0; n < N; n++)
                        for (int64_t k = 0; k < K; k++) Bt[n * K + k] = Wq[(r0 + k) * Cw + n];
                    reference(M, N, K, A, Bt, NULL, NULL, ref, mag);
                    for (int ks = 0; ks < ma_gemm_kernel_count(); ks++) {
                        ma_gemm_select(ks);
                        for (int layout = 0; layout < 2; layout++) {
                            ma_bmat b = layout ? (ma_bmat){MA_B_PANELS_T, dt, panels, Cw, r0, MA_COMPUTE_F32}
                                               : (ma_bmat){MA_B_COLS, dt, rows + (size_t)(r0 * Cw) * es, Cw, 0, MA_COMPUTE_F32};
                            for (int64_t i = 0; i < M * N; i++) C[i] = NAN;
                            ma_gemm(M, N, K, A, K, &b, NULL, 0, C, N);
                            snprintf(what, sizeof what, "%s %s %s M=%lld N=%lld K=%lld", ma_dtype_name(dt), ma_gemm_kernel_name(ks),
                                     layout ? "panels_t" : "cols", (long long)M, (long long)N, (long long)K);
                            expect_close(C, ref, mag, M * N, kernel_rel_dt(ks, dt), what);
                        }
                    }
                }
    }
    ma_gemm_select_portable(0);
    free(W);
    free(Wq);
    free(A);
    free(C);
    free(Bt);
    free(ref);
    free(mag);
    free(rows);
    free(panels);
}

static void test_gemm_strides_and_empty(void **state) {
    (void)state;
    /* lda, ld and ldc wider than the matrices; K = 0 gives zeros (or the bias) */
    const int64_t M = 9, N = 20, K = 40, lda = 50, ld = 45, ldc = 33;
    float *A = calloc(M * lda, sizeof(float)), *W = calloc(N * ld, sizeof(float)), *C = calloc(M * ldc, sizeof(float));
    tu_fill(A, M * lda, 3);
    tu_fill(W, N * ld, 4);
    for (int64_t i = 0; i < M * ldc; i++) C[i] = 77.0f;
    ma_bmat b = {MA_B_ROWS, MA_DT_F32, W, ld, 0, MA_COMPUTE_F32};
    ma_gemm(M, N, K, A, lda, &b, NULL, 0, C, ldc);
    for (int64_t m = 0; m < M; m++) {
        for (int64_t n = 0; n < N; n++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++) s += (double)A[m * lda + k] * W[n * ld + k];
            assert_true(fabs(C[m * ldc + n] - s) < 1e-4);
        }
        for (int64_t n = N; n < ldc; n++) assert_true(C[m * ldc + n] == 77.0f); /* untouched */
    }
    float bias[20];
    for (int i = 0; i < 20; i++) bias[i] = (float)i;
    ma_gemm(M, N, 0, A, lda, &b, bias, 0, C, ldc);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) assert_true(C[m * ldc + n] == (float)n);
    free(A);
    free(W);
    free(C);
}

static void test_panel_packing_layout(void **state) {
    (void)state;
    /* documented byte layout: f16 panel element (k, r) at (p*K + k)*16 + r; Q8_0 block scales first */
    const int64_t N = 20, K = 64;
    uint16_t *rows = malloc(2 * N * K), *pk = malloc(ma_panels_size(MA_DT_F16, N, K));
    for (int64_t i = 0; i < N * K; i++) rows[i] = (uint16_t)i;
    ma_pack_panels(MA_DT_F16, rows, N, K, pk);
    assert_int_equal(ma_panels_size(MA_DT_F16, N, K), 32 * K * 2);
    for (int64_t n = 0; n < 32; n++)
        for (int64_t k = 0; k < K; k++) assert_int_equal(pk[((n / 16) * K + k) * 16 + n % 16], n < N ? (uint16_t)(n * K + k) : 0);
    float w[32 * 64];
    tu_fill(w, 32 * 64, 5);
    uint8_t q[32 * 2 * 34], qp[32 * 2 * 34];
    ma_quantize_q8_0(w, 32 * 64, q);
    ma_pack_panels(MA_DT_Q8_0, q, 32, 64, qp);
    /* panel 1, k-block 1, row 3: scale at 2*3, value k=5 at 32 + 5*16 + 3 */
    const uint8_t *blk = qp + (1 * 2 + 1) * 544, *src = q + ((16 + 3) * 2 + 1) * 34;
    assert_memory_equal(blk + 6, src, 2);
    assert_int_equal(blk[32 + 5 * 16 + 3], src[2 + 5]);
    free(rows);
    free(pk);
}

/* ---- attention: fast batched path vs the scalar per-head path */
static void check_attention(int n_seq, int heads, int kv, int64_t lq, int64_t lk, int64_t hd, const ma_attn_mask *mask, uint64_t seed) {
    const int64_t qd = heads * hd, kd = kv * hd;
    float *q = malloc(sizeof(float) * n_seq * lq * qd), *k = malloc(sizeof(float) * n_seq * lk * kd);
    float *v = malloc(sizeof(float) * n_seq * lk * kd), *o1 = malloc(sizeof(float) * n_seq * lq * qd);
    float *o2 = malloc(sizeof(float) * n_seq * lq * qd);
    tu_fill(q, n_seq * lq * qd, seed);
    tu_fill(k, n_seq * lk * kd, seed + 1);
    tu_fill(v, n_seq * lk * kd, seed + 2);
    for (int64_t i = 0; i < n_seq * lq * qd; i++) q[i] *= 3.0f; /* peaky softmax */
    ma_attn_args a = {n_seq, heads, kv, lq, lk, hd, q, k, v, o1, qd, kd, kd, qd, lq * qd, lk * kd, lk * kd, lq * qd, mask, MA_COMPUTE_F32};
    ma_kctx fast, slow;
    ma_kctx_init(&fast);
    ma_kctx_init(&slow);
    fast.scalar = 0;
    slow.scalar = 1;
    ma_error err = {0};
    assert_int_equal(ma_attention(&fast, &a, &err), MA_OK);
    a.out = o2;
    assert_int_equal(ma_attention(&slow, &a, &err), MA_OK);
    for (int64_t i = 0; i < n_seq * lq * qd; i++)
        if (fabsf(o1[i] - o2[i]) > 2e-5f)
            fail_msg("attention %lld x %lld: element %lld %.7g vs %.7g", (long long)lq, (long long)lk, (long long)i, o1[i], o2[i]);
    ma_kctx_free(&fast);
    ma_kctx_free(&slow);
    free(q);
    free(k);
    free(v);
    free(o1);
    free(o2);
}

static void attention_cases(void) {
    check_attention(2, 4, 2, 150, 150, 24, NULL, 1); /* 2 images, GQA, 3 query blocks */
    check_attention(1, 3, 3, 10, 77, 16, NULL, 2);   /* expert cross attention */
    check_attention(1, 2, 2, 260, 40, 24, NULL, 6);  /* a block of 256, then one of 4 */
    check_attention(1, 8, 8, 10, 10, 96, NULL, 7);   /* expert self attention, real head width */
    uint8_t valid[77], bidir[130];
    for (int i = 0; i < 77; i++) valid[i] = i % 5 != 0;
    ma_attn_mask km = {valid, 0, NULL};
    check_attention(1, 3, 1, 10, 77, 16, &km, 3);
    for (int i = 0; i < 130; i++) bidir[i] = i >= 20 && i < 60;
    ma_attn_mask causal = {NULL, 1, bidir};
    check_attention(1, 8, 2, 130, 130, 32, &causal, 4); /* LLM prefill with image block */
    uint8_t none[12] = {0};
    ma_attn_mask all_masked = {none, 0, NULL}; /* uniform rows, as PyTorch */
    check_attention(1, 2, 2, 5, 12, 8, &all_masked, 5);
    /* the few-query path (lq <= MA_FEW_Q): edge sizes of queries, keys and head width */
    check_attention(1, 2, 2, 1, 1, 8, NULL, 8);     /* one query, one key */
    check_attention(2, 4, 2, 16, 130, 72, NULL, 9); /* 16 queries (two AVX2 groups), GQA, 72 wide */
    check_attention(1, 3, 3, 7, 9, 100, NULL, 10);  /* 9 keys: one block of 8 and one; 100 = 12 x 8 + 4 */
    check_attention(1, 2, 2, 17, 20, 8, NULL, 11);  /* 17: the GEMM path again */
    check_attention(1, 1, 1, 3, 5, 3, NULL, 12);    /* head narrower than a block of 8 */
    ma_attn_mask causal_only = {NULL, 1, NULL};
    check_attention(1, 2, 1, 10, 10, 96, &causal_only, 13); /* a causal expert */
    uint8_t some[20];
    for (int i = 0; i < 20; i++) some[i] = i >= 3 && i % 4 != 1;
    ma_attn_mask key_causal = {some, 1, NULL}; /* queries 0..2 see no key: uniform */
    check_attention(1, 2, 2, 12, 20, 24, &key_causal, 14);
    check_attention(1, 2, 2, 12, 12, 16, &all_masked, 15);
    ma_attn_mask key_only = {some, 0, NULL};
    check_attention(3, 2, 1, 4, 20, 40, &key_only, 16);
    /* few queries over many keys (the action expert's cross-attention), with long runs of
     * masked keys at either end, and none visible (uniform over all the keys) */
    static uint8_t front[140], back[140], sparse[135], nothing[140];
    for (int i = 0; i < 140; i++) {
        front[i] = i >= 80;
        back[i] = i < 50;
        nothing[i] = 0;
    }
    for (int i = 0; i < 135; i++) sparse[i] = i % 7 == 3;
    ma_attn_mask m_front = {front, 0, NULL}, m_back = {back, 0, NULL}, m_sparse = {sparse, 0, NULL}, m_nothing = {nothing, 0, NULL};
    check_attention(1, 8, 8, 10, 135, 96, NULL, 17); /* the release's shape */
    check_attention(1, 8, 8, 10, 135, 96, &m_sparse, 18);
    check_attention(2, 4, 2, 10, 140, 24, &m_front, 19);
    check_attention(1, 2, 2, 16, 140, 20, &m_back, 20);
    check_attention(1, 2, 1, 3, 140, 16, &m_nothing, 21);
    check_attention(1, 1, 1, 1, 128, 8, NULL, 22);
    check_attention(1, 2, 2, 10, 1000, 16, NULL, 23);
}

/* every vector-math set (portable, avx2, avx512 where the CPU has them): the few-query path
 * is written once per set */
static void test_attention_batched(void **state) {
    (void)state;
    const int n = ma_vecmath_count();
    for (int set = 0; set < n; set++) {
        ma_vecmath_select(set);
        attention_cases();
    }
    ma_vecmath_select(n - 1);
}

/* ---- vector math against libm */
static void test_vecmath(void **state) {
    (void)state;
    enum { N = 4099 };
    float x[N], y[N], z[N];
    /* the row sums of every set: the portable set's bits, at every length mod 8, and near a
     * double sum */
    tu_fill(x, N, 77);
    for (int i = 0; i < N; i++) x[i] = (x[i] + 0.1f) * (float)(1 << (i * 7 % 23)); /* magnitudes 1..4e6: rounding shows order */
    ma_vecmath_select(0);
    double s0[80], q0[80];
    for (int n = 0; n < 80; n++) s0[n] = ma_vecmath_get()->sum(x, n), q0[n] = ma_vecmath_get()->sum_sq(x + 3, n, 2.5);
    double ref = 0, refq = 0;
    for (int i = 0; i < 79; i++) ref += x[i], refq += ((double)x[i + 3] - 2.5) * ((double)x[i + 3] - 2.5);
    assert_true(fabs(s0[79] - ref) <= 1e-12 * fabs(ref) + 1e-3);
    assert_true(fabs(q0[79] - refq) <= 1e-12 * refq);
    for (int set = 1; set < ma_vecmath_count(); set++) {
        ma_vecmath_select(set);
        for (int n = 0; n < 80; n++) {
            if (ma_vecmath_get()->sum(x, n) != s0[n])
                fail_msg("%s sum of %d: %.17g vs %.17g", ma_vecmath_name(set), n, ma_vecmath_get()->sum(x, n), s0[n]);
            if (ma_vecmath_get()->sum_sq(x + 3, n, 2.5) != q0[n]) fail_msg("%s sum_sq of %d differs", ma_vecmath_name(set), n);
        }
    }
    for (int set = 0; set < ma_vecmath_count(); set++) {
        ma_vecmath_select(set);
        const ma_vecmath *vm = ma_vecmath_get();
        for (int i = 0; i < N; i++) x[i] = -100.0f + 200.0f * (float)i / (N - 1);
        memcpy(y, x, sizeof y);
        float sum = vm->exp_scaled_sum(y, N, 1.0f, 1.5f);
        double ref_sum = 0;
        for (int i = 0; i < N; i++) {
            double e = exp((double)(x[i] - 1.5f)); /* the float argument the kernels see */
            if (e > 3.4028234e38) {
                assert_true(y[i] >= 3.4e38f);
                continue;
            } /* overflow: huge (SIMD) or inf (libm) */
            ref_sum += e;
            if (!(fabs(y[i] - e) <= 4e-7 * e + 2e-38)) fail_msg("exp(%.7g) = %.9g, expected %.9g", x[i] - 1.5, y[i], e);
        }
        if (!isinf(sum)) assert_true(fabs(sum - ref_sum) <= 1e-6 * ref_sum);
        memcpy(y, x, sizeof y);
        sum = vm->exp_scaled_sum(y, N / 2, 1.0f, 1.5f); /* no overflow in the first half */
        ref_sum = 0;
        for (int i = 0; i < N / 2; i++) ref_sum += exp((double)(x[i] - 1.5f));
        assert_true(fabs(sum - ref_sum) <= 1e-6 * ref_sum);
        for (int i = 0; i < N; i++) x[i] = -12.0f + 24.0f * (float)i / (N - 1);
        memcpy(y, x, sizeof y);
        vm->silu(y, N);
        memcpy(z, x, sizeof z);
        vm->gelu_tanh(z, N);
        for (int i = 0; i < N; i++) {
            double s = x[i] / (1.0 + exp(-(double)x[i]));
            double g = 0.5 * x[i] * (1.0 + tanh(0.79788456080286536 * (x[i] + 0.044715 * pow(x[i], 3))));
            assert_true(fabs(y[i] - s) <= 1e-6 * fabs(s) + 1e-7);
            assert_true(fabs(z[i] - g) <= 1e-6 * fabs(g) + 1e-7);
        }
        assert_true(vm->max(x, N) == x[N - 1]);
        /* the attention's form: exp(s x - s max), masked entries (-inf) give 0 */
        for (int i = 0; i < N; i++) y[i] = x[i] * 9.0f;
        y[5] = -INFINITY;
        memcpy(z, y, sizeof z);
        const float sc = 0.11785113f, mx = vm->max(y, N);
        sum = vm->exp_scaled_sum(z, N, sc, mx);
        ref_sum = 0;
        for (int i = 0; i < N; i++) {
            const double arg = (double)sc * y[i] - (double)sc * mx, e = i == 5 ? 0.0 : exp(arg);
            ref_sum += e;
            /* the float argument carries a rounding of s x (and of s max): |arg| ulps of the result */
            if (i == 5 ? z[i] != 0.0f : !(fabs(z[i] - e) <= (1e-6 + 2.4e-7 * fabs(arg)) * e + 2e-38))
                fail_msg("%s exp_scaled_sum [%d] %.9g, expected %.9g", ma_vecmath_name(set), i, z[i], e);
        }
        assert_true(fabs(sum - ref_sum) <= 1e-6 * ref_sum);
        memcpy(y, x, sizeof y);
        vm->quick_gelu(y, N);
        for (int i = 0; i < N; i++) {
            const double q = x[i] / (1.0 + exp(-1.702 * (double)x[i]));
            assert_true(fabs(y[i] - q) <= 1e-6 * fabs(q) + 1e-7);
        }
        /* dot and axpy against double sums, at every length mod 32 */
        tu_fill(y, N, 71);
        tu_fill(z, N, 72);
        for (int n = 0; n < 70; n++) {
            double d = 0, mag = 0;
            for (int i = 0; i < n; i++) d += (double)y[i] * z[i], mag += fabs((double)y[i] * z[i]);
            assert_true(fabs(vm->dot(y, z, n) - d) <= 1e-6 * mag + 1e-30);
        }
        double d = 0, mag = 0;
        for (int i = 0; i < N; i++) d += (double)y[i] * z[i], mag += fabs((double)y[i] * z[i]);
        assert_true(fabs(vm->dot(y, z, N) - d) <= 1e-6 * mag);
        memcpy(x, z, sizeof x);
        vm->axpy(x, 0.37f, y, N - 3);
        for (int i = 0; i < N; i++) {
            const double want = i < N - 3 ? (double)z[i] + 0.37 * y[i] : z[i];
            assert_true(fabs(x[i] - want) <= 1e-6 * (fabs(z[i]) + fabs(y[i])) + 1e-30);
        }
    }
    ma_vecmath_select(ma_vecmath_count() - 1);
}

/* ---- the scan for NaN / infinity that checks every float input: each set, each position of the
 * first bad element (before, inside and after a 64-vector block and the tail), the smallest of
 * two, large finite values and -0 (not bad); then the pool's version on 1.5 M floats, with bad
 * elements near the threads' boundaries */
/* the bf16 unit follows the probe's measurement: VDPBF16PS (avx512_bf16) is chosen on a CPU
 * without AMX exactly where one instruction cost at most MA_BF16_DOT_PAYS FMAs; no time asserted */
static void test_bf16_probe(void **state) {
    (void)state;
    const double cost = ma_gemm_bf16_dot_measured();
    const char *unit = ma_gemm_bf16_unit();
    print_message("bf16 probe: one VDPBF16PS = %.2f FMA, unit %s (kernels %s)\n", cost, unit, ma_gemm_kernels());
    if (cost == -1.0) {
        if (strcmp(unit, "avx512_bf16") == 0) fail_msg("VDPBF16PS in use without the probe having timed it");
        return;
    }
    if (!(cost > 0.0 && cost < 1e6)) fail_msg("bf16 probe: cost %g is not a measurement", cost);
    const int best = ma_gemm_kernel_count() - 1; /* the avx512 sets and above carry the unit */
    if (strcmp(ma_gemm_kernel_name(best), "amx") != 0 && (ma_gemm_kernel_bf16(best) == MA_COMPUTE_BF16) != (cost <= MA_BF16_DOT_PAYS))
        fail_msg("bf16 on %s against a measured cost of %.2f FMA (pays at <= %.1f)", ma_gemm_kernel_name(best), cost, MA_BF16_DOT_PAYS);
}

static void test_first_nonfinite(void **state) {
    (void)state;
    enum { N = 2200 };
    static float x[N];
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    for (int set = 0; set < ma_vecmath_count(); set++) {
        ma_vecmath_select(set);
        const ma_vecmath *vm = ma_vecmath_get();
        for (int i = 0; i < N; i++) x[i] = i % 7 == 0 ? -0.0f : (i % 2 ? 3.4e38f : -1e-40f * (float)i);
        for (int n = 0; n <= 80; n++) assert_int_equal(vm->first_nonfinite(x, n), n);
        assert_int_equal(vm->first_nonfinite(x, N), N);
        for (int pos = 0; pos < N; pos += (pos < 80 || (pos > 1000 && pos < 1060) || pos > 2120) ? 1 : 37) {
            const float keep = x[pos];
            x[pos] = bad[pos % 3];
            if (vm->first_nonfinite(x, N) != pos)
                fail_msg("%s: bad element at %d found at %lld", ma_vecmath_name(set), pos, (long long)vm->first_nonfinite(x, N));
            assert_int_equal(vm->first_nonfinite(x, pos), pos); /* just past the end: not seen */
            assert_int_equal(vm->first_nonfinite(x + pos, N - pos), 0);
            if (pos + 500 < N) {
                x[pos + 500] = NAN;
                assert_int_equal(vm->first_nonfinite(x, N), pos);
                x[pos + 500] = 1.0f;
            }
            x[pos] = keep;
        }
    }
    ma_vecmath_select(ma_vecmath_count() - 1);
    const int64_t big = 3 << 19;
    float *y = calloc((size_t)big, sizeof *y);
    assert_non_null(y);
    assert_int_equal(ma_first_nonfinite(y, big), big);
    const int64_t at[] = {0, 1023, 1024, big / 2 - 1, big / 2, big / 2 + 1, big - 1};
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        y[at[i]] = INFINITY;
        assert_int_equal(ma_first_nonfinite(y, big), at[i]);
        y[big - 1] = NAN; /* a later one in another thread's share does not win */
        assert_int_equal(ma_first_nonfinite(y, big), at[i]);
        y[big - 1] = 0.0f;
        y[at[i]] = 0.0f;
    }
    free(y);
}

/* ---- the pool: every part runs once per call; nested calls run serially */
typedef struct {
    atomic_int hits[64];
    atomic_int nested;
    int T;
} pool_probe;

static void inner_task(void *ctx, int t, int T) {
    pool_probe *p = ctx;
    (void)t;
    if (T == 1) atomic_fetch_add(&p->nested, 1);
}

static void outer_task(void *ctx, int t, int T) {
    pool_probe *p = ctx;
    p->T = T;
    atomic_fetch_add(&p->hits[t], 1);
    ma_parallel(inner_task, p);
}

static void test_thread_pool(void **state) {
    (void)state;
    for (int round = 0; round < 2000; round++) {
        pool_probe p;
        memset(&p, 0, sizeof p);
        ma_parallel(outer_task, &p);
        assert_true(p.T >= 1 && p.T <= ma_threads());
        for (int t = 0; t < p.T; t++) assert_int_equal(atomic_load(&p.hits[t]), 1);
        assert_int_equal(atomic_load(&p.nested), p.T);
    }
    /* more parts than threads: each claimed and run exactly once, whichever thread comes */
    for (int round = 0; round < 2000; round++) {
        pool_probe p;
        memset(&p, 0, sizeof p);
        const int parts = 1 + round % 13;
        ma_parallel_parts(outer_task, &p, parts);
        assert_int_equal(p.T, parts);
        for (int t = 0; t < 64; t++) assert_int_equal(atomic_load(&p.hits[t]), t < parts ? 1 : 0);
    }
    long lo, hi, total = 0;
    for (int t = 0; t < 7; t++) {
        ma_split_range(100, t, 7, &lo, &hi);
        total += hi - lo;
        assert_true(hi - lo == 14 || hi - lo == 15);
    }
    assert_int_equal(total, 100);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_every_type_and_edge),
        cmocka_unit_test(test_gemm_fused_parts),
        cmocka_unit_test(test_gemm_exact_activations),
        cmocka_unit_test(test_gemm_phase_timers),
        cmocka_unit_test(test_gemm_bf16_compute),
        cmocka_unit_test(test_gemm_f16_compute),
        cmocka_unit_test(test_gemm_cols_layout),
        cmocka_unit_test(test_gemm_weight_as_cols),
        cmocka_unit_test(test_gemm_strides_and_empty),
        cmocka_unit_test(test_panel_packing_layout),
        cmocka_unit_test(test_attention_batched),
        cmocka_unit_test(test_vecmath),
        cmocka_unit_test(test_bf16_probe),
        cmocka_unit_test(test_first_nonfinite),
        cmocka_unit_test(test_thread_pool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
