/* SPDX-License-Identifier: Apache-2.0 */
/* its hand layout: clang-format 14 folds statement macros (DECL(0) DECL(1) ..., X-lists) into one
 * line with the code after them */
/* clang-format off */
/* Integer dot products for q8_0 / q4_0 weights with at most 12 rows of A (the action expert's 10
 * tokens), on AVX-512 VNNI + VBMI (compiled with -mavx512f -mavx512bw -mavx512vnni -mavx512vbmi
 * -mf16c; used only when the CPU has them).
 *
 * There the fp32 kernels are FMA-bound: every weight is converted and used only M times. Here,
 * as in ggml's q8_0 dot products, each row of A is quantised once per GEMM to int8 per block of
 * 32 k (a = d_a * q_a, d_a = max|a| / 127), and one VPDPBUSD does 64 int8 products. A block's sum
 * is exact in int32; the result is d_w * d_a * sum. What differs from fp32 math is the rounding
 * of A to 8 bits: at most d_a / 2 per element, below the weights' own q8_0 / q4_0 rounding.
 *
 * VPDPBUSD multiplies unsigned by signed bytes, so the weights go in offset to unsigned (q8_0:
 * w + 128, q4_0: the stored nibble, w + 8) and offset * sum(q_a) is taken off each block's sum.
 * Panel blocks hold 32 k x 16 columns k-major; one VPERMB turns four k rows of 16 columns into
 * the 16 lanes x 4 k that VPDPBUSD wants. */
#include <immintrin.h>
#include <string.h>

#include "kernels/gemm_impl.h"

#define NR MA_GEMM_NR
#define MR 12

/* the quantised A of one 32-k block: int8 q[row][32], the scales, and each row's sum of q times
 * minus the weights' offsets (q4_0: 8, q8_0: 128), the starting value of its block sum */
typedef struct qa_block {
    int8_t q[MR][32];
    float d[MR];
    int32_t neg8[MR], neg128[MR];
} qa_block;

_Static_assert(sizeof(qa_block) == MA_GEMM_QA_BLOCK, "qa block size");

static void qa_pack(const float *A, int64_t lda, int64_t m0, int64_t m1, int64_t k0, int kc, void *out) {
    qa_block *blk = out;
    for (int b = 0; b < kc / 32; b++, blk++) {
        for (int r = 0; r < MR; r++) {
            if (m0 + r >= m1) {
                memset(blk->q[r], 0, 32);
                blk->d[r] = 0.0f;
                blk->neg8[r] = blk->neg128[r] = 0;
                continue;
            }
            const float *a = A + (m0 + r) * lda + k0 + b * 32;
            const __m512 x0 = _mm512_loadu_ps(a), x1 = _mm512_loadu_ps(a + 16);
            const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
            const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
            /* round to nearest even, as nearbyintf; |q| <= 127 */
            const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, inv)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, inv));
            _mm_storeu_si128((__m128i *)blk->q[r], _mm512_cvtsepi32_epi8(q0));
            _mm_storeu_si128((__m128i *)(blk->q[r] + 16), _mm512_cvtsepi32_epi8(q1));
            blk->d[r] = amax / 127.0f;
            const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
            blk->neg8[r] = -8 * sum;
            blk->neg128[r] = -128 * sum;
        }
    }
}

/* byte 4c + j of the result = byte 16j + c of the source: four k rows of 16 columns -> 16
 * columns of four k */
static inline __m512i k4_transpose(__m512i v) {
    static const int8_t idx[64] = {
        0, 16, 32, 48, 1, 17, 33, 49, 2, 18, 34, 50, 3, 19, 35, 51, 4, 20, 36, 52, 5, 21, 37, 53,
        6, 22, 38, 54, 7, 23, 39, 55, 8, 24, 40, 56, 9, 25, 41, 57, 10, 26, 42, 58, 11, 27, 43, 59,
        12, 28, 44, 60, 13, 29, 45, 61, 14, 30, 46, 62, 15, 31, 47, 63};
    return _mm512_permutexvar_epi8(_mm512_loadu_si512(idx), v);
}

/* bytes ahead of the block being computed whose every line is prefetched: the weights stream
 * from memory (the full model's expert is 36 of these blocks' layers, no cache holds it); with
 * one prefetch per block, as before, most lines waited on the hardware prefetcher, and a cold
 * action_step took 25 % longer */
#define Q_AHEAD 4096
#define ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

/* one block's 8 weight vectors W[i] (k = 4i..4i+3 of the block) are ready: every row's int32
 * sum starts from its offset correction (a broadcast load, no ALU work) and takes eight
 * VPDPBUSD, issued k-group by k-group across the rows (each row's chain is 8 deep at 5 cycles a
 * step: interleaved, the rows' chains overlap from the first step); then each block sum is
 * scaled into the row's fp32 accumulator */
#define SUM_INIT(r) __m512i s##r = _mm512_setzero_si512(); if (mr > r) s##r = _mm512_set1_epi32(neg[r]);
#define SUM_STEP(r, i) if (mr > r) s##r = _mm512_dpbusd_epi32(s##r, w##i, _mm512_set1_epi32(((const int32_t *)qa->q[r])[i]));
#define SUM_FINISH(r) if (mr > r) c##r = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s##r), _mm512_mul_ps(dw, _mm512_set1_ps(qa->d[r])), c##r);
#define STEP_ALL(i) SUM_STEP(0, i) SUM_STEP(1, i) SUM_STEP(2, i) SUM_STEP(3, i) SUM_STEP(4, i) SUM_STEP(5, i) \
    SUM_STEP(6, i) SUM_STEP(7, i) SUM_STEP(8, i) SUM_STEP(9, i) SUM_STEP(10, i) SUM_STEP(11, i)
#define ROW_DOTS()                                                                               \
    do {                                                                                         \
        ROWS(SUM_INIT)                                                                           \
        STEP_ALL(0) STEP_ALL(1) STEP_ALL(2) STEP_ALL(3) STEP_ALL(4) STEP_ALL(5) STEP_ALL(6) STEP_ALL(7) \
        ROWS(SUM_FINISH)                                                                         \
    } while (0)
#define ACC_DECL(r) __m512 c##r = _mm512_setzero_ps();
#define ACC_STORE(r) \
    if (mr > r) ma_store_row16(C + r * ldc, c##r, m, accumulate);

static inline __attribute__((always_inline)) void dot_q8(int mr, const uint8_t *blk, const qa_block *qa, int nb, float *C,
                                                          int64_t ldc, int nr, int accumulate) {
    ROWS(ACC_DECL)
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (int b = 0; b < nb; b++, blk += 544, qa++) {
        for (int off = 0; off < 544; off += 64) _mm_prefetch((const char *)blk + Q_AHEAD + off, _MM_HINT_T0);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        const int32_t *neg = qa->neg128;
        const uint8_t *q = blk + 32;
        const __m512i w0 = k4_transpose(_mm512_xor_si512(_mm512_loadu_si512(q), flip));
        const __m512i w1 = k4_transpose(_mm512_xor_si512(_mm512_loadu_si512(q + 64), flip));
        const __m512i w2 = k4_transpose(_mm512_xor_si512(_mm512_loadu_si512(q + 128), flip));
        const __m512i w3 = k4_transpose(_mm512_xor_si512(_mm512_loadu_si512(q + 192), flip));
        const __m512i w4 = k4_transpose(_mm512_xor_si512(_mm512_loadu_si512(q + 256), flip));
        const __m512i w5 = k4_transpose(_mm512_xor_si512(_mm512_loadu_si512(q + 320), flip));
        const __m512i w6 = k4_transpose(_mm512_xor_si512(_mm512_loadu_si512(q + 384), flip));
        const __m512i w7 = k4_transpose(_mm512_xor_si512(_mm512_loadu_si512(q + 448), flip));
        ROW_DOTS();
    }
    const __mmask16 m = (__mmask16)((1u << nr) - 1u);
    ROWS(ACC_STORE)
}

/* q4_0 panel block: byte [j][c] holds column c's k = j (low nibble) and k = j + 16 (high) */
static inline __attribute__((always_inline)) void dot_q4(int mr, const uint8_t *blk, const qa_block *qa, int nb, float *C,
                                                          int64_t ldc, int nr, int accumulate) {
    ROWS(ACC_DECL)
    const __m512i low = _mm512_set1_epi8(0x0f);
    for (int b = 0; b < nb; b++, blk += 288, qa++) {
        for (int off = 0; off < 288; off += 64) _mm_prefetch((const char *)blk + Q_AHEAD + off, _MM_HINT_T0);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        const int32_t *neg = qa->neg8;
        const uint8_t *q = blk + 32;
        const __m512i v0 = _mm512_loadu_si512(q), v1 = _mm512_loadu_si512(q + 64);
        const __m512i v2 = _mm512_loadu_si512(q + 128), v3 = _mm512_loadu_si512(q + 192);
        const __m512i w0 = k4_transpose(_mm512_and_si512(v0, low));
        const __m512i w1 = k4_transpose(_mm512_and_si512(v1, low));
        const __m512i w2 = k4_transpose(_mm512_and_si512(v2, low));
        const __m512i w3 = k4_transpose(_mm512_and_si512(v3, low));
        const __m512i w4 = k4_transpose(_mm512_and_si512(_mm512_srli_epi16(v0, 4), low));
        const __m512i w5 = k4_transpose(_mm512_and_si512(_mm512_srli_epi16(v1, 4), low));
        const __m512i w6 = k4_transpose(_mm512_and_si512(_mm512_srli_epi16(v2, 4), low));
        const __m512i w7 = k4_transpose(_mm512_and_si512(_mm512_srli_epi16(v3, 4), low));
        ROW_DOTS();
    }
    const __mmask16 m = (__mmask16)((1u << nr) - 1u);
    ROWS(ACC_STORE)
}


static void q_panels(const ma_bmat *B, int64_t K, int64_t n0, int nr, int64_t k0, int kc, const void *qa, int mr,
                     float *C, int64_t ldc, int accumulate) {
    const int64_t p = n0 / NR;
    const int nb = kc / 32;
    const qa_block *a = qa;
    if (B->dtype == MA_DT_Q8_0) {
        const uint8_t *blk = (const uint8_t *)B->data + ((size_t)p * (size_t)(K / 32) + (size_t)(k0 / 32)) * 544;
        MA_DISPATCH_MR12(dot_q8, blk, a, nb, C, ldc, nr, accumulate)
    } else {
        const uint8_t *blk = (const uint8_t *)B->data + ((size_t)p * (size_t)(K / 32) + (size_t)(k0 / 32)) * 288;
        MA_DISPATCH_MR12(dot_q4, blk, a, nb, C, ldc, nr, accumulate)
    }
}

/* ---- many row tiles: weights rearranged once per K chunk (q_transform), then read as they are
 * by every 12-row tile (q_tile). The xor / nibble mask and the VPERMB per weight vector were
 * redone by each tile; at M = 729 that is 61 times per block. */

static void q_transform(const ma_bmat *B, int64_t K, int64_t n0, int64_t k0, int kc, void *out) {
    const int64_t p = n0 / NR;
    const int nb = kc / 32;
    uint8_t *o = out;
    if (B->dtype == MA_DT_Q8_0) {
        const uint8_t *blk = (const uint8_t *)B->data + ((size_t)p * (size_t)(K / 32) + (size_t)(k0 / 32)) * 544;
        const __m512i flip = _mm512_set1_epi8((char)0x80);
        for (int b = 0; b < nb; b++, blk += 544, o += MA_GEMM_QW_BLOCK) {
            for (int i = 0; i < 8; i++)
                _mm512_store_si512(o + 64 * i, k4_transpose(_mm512_xor_si512(_mm512_loadu_si512(blk + 32 + 64 * i), flip)));
            _mm512_store_ps(o + 512, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk)));
        }
        return;
    }
    const uint8_t *blk = (const uint8_t *)B->data + ((size_t)p * (size_t)(K / 32) + (size_t)(k0 / 32)) * 288;
    const __m512i low = _mm512_set1_epi8(0x0f);
    for (int b = 0; b < nb; b++, blk += 288, o += MA_GEMM_QW_BLOCK) {
        for (int i = 0; i < 4; i++) {
            const __m512i v = _mm512_loadu_si512(blk + 32 + 64 * i);
            _mm512_store_si512(o + 64 * i, k4_transpose(_mm512_and_si512(v, low)));
            _mm512_store_si512(o + 64 * (i + 4), k4_transpose(_mm512_and_si512(_mm512_srli_epi16(v, 4), low)));
        }
        _mm512_store_ps(o + 512, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk)));
    }
}

/* 4 rows x up to 3 panels of rearranged blocks: 12 int32 sums and 12 fp32 accumulators in
 * registers; per k group one weight vector per panel and one broadcast per row, each used 3 and
 * 4 times (the 12-row x 1-panel form took a broadcast load per VPDPBUSD, and with VPDPBUSD
 * issuing twice a cycle the load ports were as busy as the vector ports). The same sums in the
 * same order per element as dot_q8 / dot_q4, so the same bits. Keeping the fp32 sums in C
 * instead (to spare 12 registers) measured 10-20 % slower. */
static inline __attribute__((always_inline)) void dot_t(int R, int NP, const uint8_t *wt, size_t ws, const qa_block *qa, int r0,
                                                         int nb, int q4, float *C, int64_t ldc, int nr_last, int accumulate) {
    __m512 c[4][3];
    for (int r = 0; r < R; r++)
        for (int p = 0; p < NP; p++) c[r][p] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++, wt += MA_GEMM_QW_BLOCK, qa++) {
        const int32_t *neg = q4 ? qa->neg8 : qa->neg128;
        __m512i sum[4][3];
        for (int r = 0; r < R; r++)
            for (int p = 0; p < NP; p++) sum[r][p] = _mm512_set1_epi32(neg[r0 + r]);
        for (int i = 0; i < 8; i++) {
            __m512i w[3];
            for (int p = 0; p < NP; p++) w[p] = _mm512_load_si512(wt + p * ws + 64 * i);
            for (int r = 0; r < R; r++) {
                const __m512i x = _mm512_set1_epi32(((const int32_t *)qa->q[r0 + r])[i]);
                for (int p = 0; p < NP; p++) sum[r][p] = _mm512_dpbusd_epi32(sum[r][p], w[p], x);
            }
        }
        for (int r = 0; r < R; r++)
            for (int p = 0; p < NP; p++)
                c[r][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r][p]),
                                          _mm512_mul_ps(_mm512_load_ps(wt + p * ws + 512), _mm512_set1_ps(qa->d[r0 + r])), c[r][p]);
    }
    for (int p = 0; p < NP; p++) {
        const int nr = p == NP - 1 ? nr_last : NR;
        const __mmask16 m = (__mmask16)((1u << nr) - 1u);
        for (int r = 0; r < R; r++) ma_store_row16(C + r * ldc + p * NR, c[r][p], m, accumulate);
    }
}

#define DOT_T(R, NP) dot_t(R, NP, w, ws, a, r0, nb, q4, C + r0 * ldc, ldc, nr_last, accumulate)
#define DOT_R(NP)                                   \
    switch (rows) {                                 \
    case 4: DOT_T(4, NP); break;                    \
    case 3: DOT_T(3, NP); break;                    \
    case 2: DOT_T(2, NP); break;                    \
    default: DOT_T(1, NP); break;                   \
    }

/* C[mr <= 12, 16 (np - 1) + nr_last] (+)= a 12-row tile of quantised A x np <= 3 rearranged
 * panels (ws bytes apart), 4 rows at a time */
static void q_tile(ma_dtype dt, const void *wt, size_t ws, int np, int kc, const void *qa, int mr, float *C, int64_t ldc,
                   int nr_last, int accumulate) {
    const int nb = kc / 32, q4 = dt == MA_DT_Q4_0;
    const uint8_t *w = wt;
    const qa_block *a = qa;
    for (int r0 = 0; r0 < mr; r0 += 4) {
        const int rows = mr - r0 < 4 ? mr - r0 : 4;
        if (np == 3) { DOT_R(3) }
        else if (np == 2) { DOT_R(2) }
        else { DOT_R(1) }
    }
}

void ma_gemm_install_vnni(ma_gemm_kernels_t *k) {
    k->name = "vnni";
    k->qa_pack = qa_pack;
    k->q_panels = q_panels;
    k->q_transform = q_transform;
    k->q_tile = q_tile;
}
