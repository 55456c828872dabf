/* SPDX-License-Identifier: Apache-2.0 */
/* AVX2 + FMA + F16C micro-kernel and panel loaders (compiled with -mavx2 -mfma -mf16c; used
 * only when the CPU has them). The portable versions in gemm.c are the reference. */
#include <immintrin.h>
#include <string.h>

#include "kernels/gemm_impl.h"

#define NR MA_GEMM_NR

/* 6 x 16 tile: 12 accumulators in named registers (an array would be spilled), per k two loads
 * of the panel and six broadcasts of the packed A tile */
static inline __attribute__((always_inline)) void store_row(float *cr, __m256 lo, __m256 hi, int nr, int accumulate) {
    if (nr == NR) {
        if (accumulate) {
            lo = _mm256_add_ps(lo, _mm256_loadu_ps(cr));
            hi = _mm256_add_ps(hi, _mm256_loadu_ps(cr + 8));
        }
        _mm256_storeu_ps(cr, lo);
        _mm256_storeu_ps(cr + 8, hi);
        return;
    }
    _Alignas(32) float t[16];
    _mm256_store_ps(t, lo);
    _mm256_store_ps(t + 8, hi);
    for (int j = 0; j < nr; j++) cr[j] = accumulate ? cr[j] + t[j] : t[j];
}

static inline __attribute__((always_inline)) void tile(int mr, int64_t kc, const float *A, const float *P, float *C, int64_t ldc, int nr,
                                                       int accumulate) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    for (int64_t k = 0; k < kc; k++) {
        const float *ak = A + k * MA_GEMM_MR;
        const __m256 b0 = _mm256_load_ps(P + k * NR), b1 = _mm256_load_ps(P + k * NR + 8);
        __m256 a;
#define ROW(r)                                     \
    if (mr > r) {                                  \
        a = _mm256_broadcast_ss(ak + r);           \
        c##r##0 = _mm256_fmadd_ps(a, b0, c##r##0); \
        c##r##1 = _mm256_fmadd_ps(a, b1, c##r##1); \
    }
        ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5)
#undef ROW
    }
    store_row(C, c00, c01, nr, accumulate);
    if (mr > 1) store_row(C + ldc, c10, c11, nr, accumulate);
    if (mr > 2) store_row(C + 2 * ldc, c20, c21, nr, accumulate);
    if (mr > 3) store_row(C + 3 * ldc, c30, c31, nr, accumulate);
    if (mr > 4) store_row(C + 4 * ldc, c40, c41, nr, accumulate);
    if (mr > 5) store_row(C + 5 * ldc, c50, c51, nr, accumulate);
}

static void ukernel_avx2(int64_t kc, const float *A, const float *P, float *C, int64_t ldc, int mr, int nr, int accumulate) {
    switch (mr) {
    case 6: tile(6, kc, A, P, C, ldc, nr, accumulate); break;
    case 5: tile(5, kc, A, P, C, ldc, nr, accumulate); break;
    case 4: tile(4, kc, A, P, C, ldc, nr, accumulate); break;
    case 3: tile(3, kc, A, P, C, ldc, nr, accumulate); break;
    case 2: tile(2, kc, A, P, C, ldc, nr, accumulate); break;
    default: tile(1, kc, A, P, C, ldc, nr, accumulate); break;
    }
}

/* ------------------------------------------------------------------ panel layout loaders */

static void load_panels_f16(const ma_bmat *B, int64_t K, int64_t n0, int nr, int64_t k0, int kc, float *P) {
    (void)nr;
    const uint16_t *s = (const uint16_t *)B->data + (n0 / NR) * K * NR + k0 * NR;
    for (int64_t i = 0; i < (int64_t)kc * NR; i += 16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(s + i));
        _mm256_store_ps(P + i, _mm256_cvtph_ps(_mm256_castsi256_si128(h)));
        _mm256_store_ps(P + i + 8, _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)));
    }
}

static inline __m256 bf16x8(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }

static void load_panels_bf16(const ma_bmat *B, int64_t K, int64_t n0, int nr, int64_t k0, int kc, float *P) {
    (void)nr;
    const uint16_t *s = (const uint16_t *)B->data + (n0 / NR) * K * NR + k0 * NR;
    for (int64_t i = 0; i < (int64_t)kc * NR; i += 16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(s + i));
        _mm256_store_ps(P + i, bf16x8(_mm256_castsi256_si128(h)));
        _mm256_store_ps(P + i + 8, bf16x8(_mm256_extracti128_si256(h, 1)));
    }
}

static void load_panels_f32(const ma_bmat *B, int64_t K, int64_t n0, int nr, int64_t k0, int kc, float *P) {
    (void)nr;
    memcpy(P, (const float *)B->data + (n0 / NR) * K * NR + k0 * NR, sizeof(float) * (size_t)kc * NR);
}

/* 16 f16 scales of a panel block */
static inline void scales16(const uint8_t *blk, __m256 *d0, __m256 *d1) {
    __m256i h = _mm256_loadu_si256((const __m256i *)blk);
    *d0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    *d1 = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

static void load_panels_q8(const ma_bmat *B, int64_t K, int64_t n0, int nr, int64_t k0, int kc, float *P) {
    (void)nr;
    const uint8_t *panel = (const uint8_t *)B->data + (size_t)(n0 / NR) * (size_t)(K / 32) * 544;
    for (int k = 0; k < kc; k += 32) {
        const uint8_t *blk = panel + (size_t)((k0 + k) / 32) * 544;
        __m256 d0, d1;
        scales16(blk, &d0, &d1);
        const uint8_t *q = blk + 32;
        float *out = P + (size_t)k * NR;
        for (int i = 0; i < 32; i++) {
            __m128i v = _mm_loadu_si128((const __m128i *)(q + i * NR));
            __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
            __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)));
            _mm256_store_ps(out + i * NR, _mm256_mul_ps(lo, d0));
            _mm256_store_ps(out + i * NR + 8, _mm256_mul_ps(hi, d1));
        }
    }
}

static void load_panels_q4(const ma_bmat *B, int64_t K, int64_t n0, int nr, int64_t k0, int kc, float *P) {
    (void)nr;
    const uint8_t *panel = (const uint8_t *)B->data + (size_t)(n0 / NR) * (size_t)(K / 32) * 288;
    const __m128i low = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    for (int k = 0; k < kc; k += 32) {
        const uint8_t *blk = panel + (size_t)((k0 + k) / 32) * 288;
        __m256 d0, d1;
        scales16(blk, &d0, &d1);
        const uint8_t *q = blk + 32;
        float *out = P + (size_t)k * NR;
        for (int j = 0; j < 16; j++) {
            __m128i v = _mm_loadu_si128((const __m128i *)(q + j * NR));
            __m128i vl = _mm_sub_epi8(_mm_and_si128(v, low), eight);
            __m128i vh = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), low), eight);
            _mm256_store_ps(out + j * NR, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(vl)), d0));
            _mm256_store_ps(out + j * NR + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(vl, 8))), d1));
            _mm256_store_ps(out + (j + 16) * NR, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(vh)), d0));
            _mm256_store_ps(out + (j + 16) * NR + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(vh, 8))), d1));
        }
    }
}

/* ------------------------------------------------------------------ row-major loaders */

/* 8 x 8 transpose of r[0..7] (rows) into columns */
static inline void transpose8(__m256 r[8]) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xee);
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

static inline __m256 load8(ma_dtype dt, const void *base, int64_t i) {
    switch (dt) {
    case MA_DT_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i)));
    case MA_DT_BF16: return bf16x8(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i)));
    default: return _mm256_loadu_ps((const float *)base + i);
    }
}

static inline float load1(ma_dtype dt, const void *base, int64_t i) {
    switch (dt) {
    case MA_DT_F16: return _cvtsh_ss(((const uint16_t *)base)[i]);
    case MA_DT_BF16: {
        uint32_t u = (uint32_t)((const uint16_t *)base)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    default: return ((const float *)base)[i];
    }
}

static void load_rows_float(const ma_bmat *B, int64_t K, int64_t n0, int nr, int64_t k0, int kc, float *P) {
    (void)K;
    const ma_dtype dt = B->dtype;
    int k = 0;
    for (; k + 8 <= kc; k += 8)
        for (int half = 0; half < 2; half++) {
            __m256 r[8];
            for (int i = 0; i < 8; i++) {
                const int row = half * 8 + i;
                r[i] = row < nr ? load8(dt, B->data, (n0 + row) * B->ld + k0 + k) : _mm256_setzero_ps();
            }
            transpose8(r);
            for (int i = 0; i < 8; i++) _mm256_store_ps(P + (k + i) * NR + half * 8, r[i]);
        }
    for (; k < kc; k++)
        for (int r = 0; r < NR; r++) P[k * NR + r] = r < nr ? load1(dt, B->data, (n0 + r) * B->ld + k0 + k) : 0.0f;
}

static void load_cols_f32(const ma_bmat *B, int64_t K, int64_t n0, int nr, int64_t k0, int kc, float *P) {
    (void)K;
    const float *b = (const float *)B->data + k0 * B->ld + n0;
    if (nr == NR) {
        for (int k = 0; k < kc; k++) {
            _mm256_store_ps(P + k * NR, _mm256_loadu_ps(b + k * B->ld));
            _mm256_store_ps(P + k * NR + 8, _mm256_loadu_ps(b + k * B->ld + 8));
        }
        return;
    }
    for (int k = 0; k < kc; k++)
        for (int j = 0; j < NR; j++) P[k * NR + j] = j < nr ? b[k * B->ld + j] : 0.0f;
}

/* f16 / bf16 rows of a weight used as B [K][N] */
static void load_cols_half(const ma_bmat *B, int64_t K, int64_t n0, int nr, int64_t k0, int kc, float *P) {
    (void)K;
    const uint16_t *b = (const uint16_t *)B->data + k0 * B->ld + n0;
    const int bf = B->dtype == MA_DT_BF16;
    for (int k = 0; k < kc; k++) {
        const uint16_t *row = b + k * B->ld;
        if (nr == NR) {
            const __m256i h = _mm256_loadu_si256((const __m256i *)row);
            const __m128i lo = _mm256_castsi256_si128(h), hi = _mm256_extracti128_si256(h, 1);
            _mm256_store_ps(P + k * NR, bf ? bf16x8(lo) : _mm256_cvtph_ps(lo));
            _mm256_store_ps(P + k * NR + 8, bf ? bf16x8(hi) : _mm256_cvtph_ps(hi));
        } else
            for (int j = 0; j < NR; j++) P[k * NR + j] = j < nr ? load1(B->dtype, B->data, (k0 + k) * B->ld + n0 + j) : 0.0f;
    }
}

/* MA_B_PANELS_T: the rows of a panel that B's k range covers are one 16 x 16 block per 16
 * columns ([column][lane], contiguous): converted whole, then read across */
static void load_panels_t(const ma_bmat *B, int64_t K, int64_t n0, int nr, int64_t k0, int kc, float *P) {
    (void)K;
    _Alignas(32) float t[NR][NR]; /* t[j][lane] */
    for (int k = 0; k < kc;) {
        const int64_t r = B->row0 + k0 + k;
        const int lane0 = (int)(r % NR), m = NR - lane0 < kc - k ? NR - lane0 : kc - k;
        const int64_t base = ((r / NR) * B->ld + n0) * NR;
        for (int j = 0; j < NR; j++) {
            if (j >= nr) {
                memset(t[j], 0, sizeof t[j]);
                continue;
            }
            if (B->dtype == MA_DT_F32) {
                memcpy(t[j], (const float *)B->data + base + j * NR, sizeof t[j]);
                continue;
            }
            const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)B->data + base + j * NR));
            const __m128i lo = _mm256_castsi256_si128(h), hi = _mm256_extracti128_si256(h, 1);
            const int bf = B->dtype == MA_DT_BF16;
            _mm256_store_ps(t[j], bf ? bf16x8(lo) : _mm256_cvtph_ps(lo));
            _mm256_store_ps(t[j] + 8, bf ? bf16x8(hi) : _mm256_cvtph_ps(hi));
        }
        for (int i = 0; i < m; i++)
            for (int j = 0; j < NR; j++) P[(k + i) * NR + j] = t[j][lane0 + i];
        k += m;
    }
}

/* A packing with 4 x 4 transposes: four rows' k..k+3 become four [k][r0..r0+3] stores */
static void pack_a_sse(const float *A, int64_t lda, int64_t m0, int64_t m1, int64_t k0, int kc, int TR, float *out) {
    for (int64_t m = m0; m < m1; m += TR) {
        const int mr = (int)(m1 - m < TR ? m1 - m : TR);
        float *t = out + (m - m0) * kc;
        int r = 0;
        for (; r + 4 <= mr; r += 4) {
            const float *a0 = A + (m + r) * lda + k0, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
            int k = 0;
            for (; k + 4 <= kc; k += 4) {
                __m128 x0 = _mm_loadu_ps(a0 + k), x1 = _mm_loadu_ps(a1 + k), x2 = _mm_loadu_ps(a2 + k), x3 = _mm_loadu_ps(a3 + k);
                _MM_TRANSPOSE4_PS(x0, x1, x2, x3);
                _mm_storeu_ps(t + (k + 0) * TR + r, x0);
                _mm_storeu_ps(t + (k + 1) * TR + r, x1);
                _mm_storeu_ps(t + (k + 2) * TR + r, x2);
                _mm_storeu_ps(t + (k + 3) * TR + r, x3);
            }
            for (; k < kc; k++) {
                t[k * TR + r] = a0[k];
                t[k * TR + r + 1] = a1[k];
                t[k * TR + r + 2] = a2[k];
                t[k * TR + r + 3] = a3[k];
            }
        }
        for (; r < mr; r++) {
            const float *a = A + (m + r) * lda + k0;
            for (int k = 0; k < kc; k++) t[k * TR + r] = a[k];
        }
        for (; r < TR; r++)
            for (int k = 0; k < kc; k++) t[k * TR + r] = 0.0f;
    }
}

void ma_gemm_install_avx2(ma_gemm_kernels_t *k) {
    k->name = "avx2";
    k->pack_a = pack_a_sse;
    k->ukernel = ukernel_avx2;
    k->load[MA_B_PANELS][MA_DT_F16] = load_panels_f16;
    k->load[MA_B_PANELS][MA_DT_BF16] = load_panels_bf16;
    k->load[MA_B_PANELS][MA_DT_F32] = load_panels_f32;
    k->load[MA_B_PANELS][MA_DT_Q8_0] = load_panels_q8;
    k->load[MA_B_PANELS][MA_DT_Q4_0] = load_panels_q4;
    k->load[MA_B_ROWS][MA_DT_F16] = load_rows_float;
    k->load[MA_B_ROWS][MA_DT_BF16] = load_rows_float;
    k->load[MA_B_ROWS][MA_DT_F32] = load_rows_float;
    k->load[MA_B_COLS][MA_DT_F32] = load_cols_f32;
    k->load[MA_B_COLS][MA_DT_F16] = k->load[MA_B_COLS][MA_DT_BF16] = load_cols_half;
    k->load[MA_B_PANELS_T][MA_DT_F32] = k->load[MA_B_PANELS_T][MA_DT_F16] = k->load[MA_B_PANELS_T][MA_DT_BF16] = load_panels_t;
}
