/* SPDX-License-Identifier: Apache-2.0 */
/* bf16 operands for the GEMM (compiled with -mavx512f -mavx512bw -mavx512bf16; used only where
 * the CPU has AVX512-BF16: Cooper Lake, Sapphire Rapids and later, Zen 4 and later).
 *
 * Two uses of one layout:
 *  - the AMX tiles (gemm_amx.c) at fp32 accuracy: each operand split into two bf16 terms,
 *    x = hi + lo with hi = bf16(x) (round to nearest even) and lo = bf16(x - hi);
 *  - the bf16 compute plan (MA_COMPUTE_BF16, gemm.h) on a CPU without AMX: a_hi w_hi only, by
 *    VDPBF16PS, which multiplies two bf16 pairs exactly and adds both products to fp32 lanes.
 *
 * Layouts (uint16 bf16 values, one 1 KiB tile = 16 rows x 64 bytes):
 *   A: per 16-row tile, per 32-k block: hi [16 rows][32 k], then lo (split; hi alone for bf16)
 *   B: per 16-column panel, per 32-k block: hi [16 k pairs][16 columns][2], then lo (split)
 *      (the pair layout TDPBF16PS and VDPBF16PS read: one 64-byte row is k = 2p, 2p + 1 of the
 *      16 columns)
 * so row r's pair p of A is one 32-bit word (hi at r * 32 + 2p), broadcast to every lane, and a
 * pair row of B is one vector. Rows past M, columns past N and k past K are zero in both, so
 * they add nothing. */
#define _POSIX_C_SOURCE 200809L
#include <immintrin.h>
#include <string.h>
#include <time.h>

#include "core/util.h"
#include "kernels/gemm_impl.h"

#define TILE_U16 512 /* uint16 values in one tile */

/* 16 fp32 -> their bf16 hi terms as fp32 (exact) */
static inline __m512 widen_bf16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

/* x0, x1 (k 0..15 and 16..31, or two rows) -> hi and lo, each 32 bf16 in (x0, x1) order */
static inline void split32(__m512 x0, __m512 x1, __m512i *hi, __m512i *lo) {
    const __m512i h = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
    const __m512 l0 = _mm512_sub_ps(x0, widen_bf16(_mm512_castsi512_si256(h)));
    const __m512 l1 = _mm512_sub_ps(x1, widen_bf16(_mm512_extracti64x4_epi64(h, 1)));
    *hi = h;
    *lo = (__m512i)_mm512_cvtne2ps_pbh(l1, l0);
}

static void amx_pack_a(const float *A, int64_t lda, int64_t m0, int64_t m1, int64_t k0, int kc, int split, uint16_t *out) {
    const int nb = (kc + 31) / 32, bs = split ? 2 * TILE_U16 : TILE_U16;
    for (int64_t m = m0; m < m1; m += 16) {
        uint16_t *t = out + (m - m0) / 16 * nb * bs;
        for (int r = 0; r < 16; r++) {
            const float *a = A + (m + r) * lda + k0;
            for (int b = 0; b < nb; b++) {
                __m512i hi = _mm512_setzero_si512(), lo = hi;
                if (m + r < m1) {
                    const int n = kc - 32 * b;
                    const __mmask16 k0m = n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1u);
                    const __mmask16 k1m = n >= 32 ? 0xffff : n <= 16 ? 0 : (__mmask16)((1u << (n - 16)) - 1u);
                    split32(_mm512_maskz_loadu_ps(k0m, a + 32 * b), _mm512_maskz_loadu_ps(k1m, a + 32 * b + 16), &hi, &lo);
                }
                _mm512_store_si512(t + (size_t)b * bs + r * 32, hi);
                if (split) _mm512_store_si512(t + (size_t)b * bs + TILE_U16 + r * 32, lo);
            }
        }
    }
}

/* (k, k + 1) x 16 columns -> [column][pair]: element 2n + e comes from e * 16 + n */
static const uint16_t pair_order[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                        8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

/* one fp32 panel P[kc][16] (as the panel loaders write it) -> the B layout; rows past kc zero */
static void amx_pack_b(const float *P, int kc, int split, uint16_t *out) {
    const __m512i idx = _mm512_loadu_si512(pair_order);
    const int nb = (kc + 31) / 32, bs = split ? 2 * TILE_U16 : TILE_U16;
    for (int b = 0; b < nb; b++)
        for (int p = 0; p < 16; p++) {
            const int k = 32 * b + 2 * p;
            const __m512 x0 = k < kc ? _mm512_load_ps(P + (size_t)k * 16) : _mm512_setzero_ps();
            const __m512 x1 = k + 1 < kc ? _mm512_load_ps(P + (size_t)(k + 1) * 16) : _mm512_setzero_ps();
            __m512i hi, lo;
            split32(x0, x1, &hi, &lo);
            _mm512_store_si512(out + (size_t)b * bs + p * 32, _mm512_permutexvar_epi16(idx, hi));
            if (split) _mm512_store_si512(out + (size_t)b * bs + TILE_U16 + p * 32, _mm512_permutexvar_epi16(idx, lo));
        }
}

/* B in the panel layout, f16 or bf16, straight into the B layout: two k rows of 16 columns are
 * 64 contiguous bytes there. Returns 0 for the other layouts and types (then the fp32 panel
 * loaders and amx_pack_b are used). */
static int amx_load_b(const ma_bmat *B, int64_t K, int64_t n0, int64_t k0, int kc, int split, uint16_t *out) {
    if (B->layout != MA_B_PANELS || (B->dtype != MA_DT_F16 && B->dtype != MA_DT_BF16)) return 0;
    const __m512i idx = _mm512_loadu_si512(pair_order);
    const uint16_t *src = (const uint16_t *)B->data + ((n0 / 16) * K + k0) * 16;
    const int nb = (kc + 31) / 32, bf16 = B->dtype == MA_DT_BF16, bs = split ? 2 * TILE_U16 : TILE_U16;
    for (int b = 0; b < nb; b++)
        for (int p = 0; p < 16; p++) {
            const int k = 32 * b + 2 * p;
            const __mmask32 m = k + 1 < kc ? 0xffffffffu : k < kc ? 0xffffu : 0;
            const __m512i w = _mm512_maskz_loadu_epi16(m, src + (size_t)k * 16);
            uint16_t *o = out + (size_t)b * bs + p * 32;
            if (bf16) { /* already the hi term; lo is zero and never read (no MA_AMX_B_LO) */
                _mm512_store_si512(o, _mm512_permutexvar_epi16(idx, w));
                continue;
            }
            const __m512 x0 = _mm512_cvtph_ps(_mm512_castsi512_si256(w)), x1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(w, 1));
            if (!split) { /* hi only: bf16(w), rounded to nearest even */
                _mm512_store_si512(o, _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(x1, x0)));
                continue;
            }
            __m512i hi, lo;
            split32(x0, x1, &hi, &lo);
            _mm512_store_si512(o, _mm512_permutexvar_epi16(idx, hi));
            _mm512_store_si512(o + TILE_U16, _mm512_permutexvar_epi16(idx, lo));
        }
    return 1;
}

/* C[rows <= 8, 16 NP] (+)= the 8-row half `half` of a 16-row A tile x NP panels, over nb 32-k
 * blocks: 8 x NP accumulators; per k pair one B vector per panel and one broadcast per row */
static inline __attribute__((always_inline)) void dp_rows(int ROWS, int NP, int nb, const uint16_t *A, const uint16_t *B, size_t ts,
                                                          float *C, int64_t ldc, int ncols, int accumulate) {
    __m512 acc[8][2];
    for (int r = 0; r < ROWS; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint16_t *a = A + (size_t)b * TILE_U16, *w = B + (size_t)b * TILE_U16; /* hi only */
        for (int p = 0; p < 16; p++) {
            const __m512bh w0 = (__m512bh)_mm512_load_si512(w + p * 32);
            const __m512bh w1 = NP == 2 ? (__m512bh)_mm512_load_si512(w + ts + p * 32) : w0;
            for (int r = 0; r < ROWS; r++) {
                uint32_t pair;
                memcpy(&pair, a + r * 32 + 2 * p, 4);
                const __m512bh x = (__m512bh)_mm512_set1_epi32((int)pair);
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, w0);
                if (NP == 2) acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, w1);
            }
        }
    }
    const __mmask16 m0 = ncols >= 16 ? 0xffff : (__mmask16)((1u << ncols) - 1u);
    const __mmask16 m1 = ncols >= 32 ? 0xffff : ncols <= 16 ? 0 : (__mmask16)((1u << (ncols - 16)) - 1u);
    for (int r = 0; r < ROWS; r++) {
        float *c = C + r * ldc;
        __m512 v0 = acc[r][0], v1 = acc[r][1];
        if (accumulate) {
            v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, c));
            if (NP == 2) v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, c + 16));
        }
        _mm512_mask_storeu_ps(c, m0, v0);
        if (NP == 2) _mm512_mask_storeu_ps(c + 16, m1, v1);
    }
}

#define DP_ROWS(R, ...) (NP == 2 ? dp_rows(R, 2, __VA_ARGS__) : dp_rows(R, 1, __VA_ARGS__))

/* the bf16 compute plan's tile: C[mr <= 32, ncols <= 32] (+)= A_hi x B_hi over nb 32-k blocks,
 * in the layouts above (the second row tile and panel ts uint16 after the first), 8 rows at a
 * time */
static void bf16_tile(int nb, const uint16_t *A, const uint16_t *B, size_t ts, float *C, int64_t ldc, int mr, int ncols, int accumulate) {
    const int NP = ncols > 16 ? 2 : 1;
    for (int r0 = 0; r0 < mr; r0 += 8) {
        const int rows = mr - r0 < 8 ? mr - r0 : 8;
        const uint16_t *a = A + (size_t)(r0 / 16) * ts + (r0 % 16) * 32;
        float *c = C + r0 * ldc;
        switch (rows) {
        case 8: DP_ROWS(8, nb, a, B, ts, c, ldc, ncols, accumulate); break;
        case 7: DP_ROWS(7, nb, a, B, ts, c, ldc, ncols, accumulate); break;
        case 6: DP_ROWS(6, nb, a, B, ts, c, ldc, ncols, accumulate); break;
        case 5: DP_ROWS(5, nb, a, B, ts, c, ldc, ncols, accumulate); break;
        case 4: DP_ROWS(4, nb, a, B, ts, c, ldc, ncols, accumulate); break;
        case 3: DP_ROWS(3, nb, a, B, ts, c, ldc, ncols, accumulate); break;
        case 2: DP_ROWS(2, nb, a, B, ts, c, ldc, ncols, accumulate); break;
        default: DP_ROWS(1, nb, a, B, ts, c, ldc, ncols, accumulate); break;
        }
    }
}

/* Whether VDPBF16PS multiplies faster than FMA on this CPU: it does twice the products per
 * instruction, but its throughput is not the same everywhere (measured: on Zen 4 / 5 it issues
 * as fast as an FMA; on a Sapphire Rapids-class Xeon at a quarter of the FMA rate, where the bf16
 * plan goes to the AMX tiles instead). Timed once per process, about 0.2 ms: the tile is used
 * where the bf16 product rate is at least 4/3 of the fp32 one (an instruction no slower than 1.5
 * FMAs). Read, not assumed from a CPU model.
 *
 * The two timed loops are written in assembly, counter included, on 16 independent zmm
 * accumulators whose operands never leave the registers, so the instructions timed are the same
 * whatever the compiler's optimisation level (in C, an -O0 build kept the accumulators in memory
 * and timed loads and stores instead: a debug build chose another unit than a release build). The
 * registers are zeroed inside the timed block (18 moves against 32,000 products), so no value is
 * ever denormal. */
/* clang-format off */
#define PROBE1(op, r) op " %%zmm16, %%zmm17, %%zmm" #r "\n\t"
#define PROBE16(op) PROBE1(op, 0) PROBE1(op, 1) PROBE1(op, 2) PROBE1(op, 3) PROBE1(op, 4) PROBE1(op, 5) PROBE1(op, 6) \
    PROBE1(op, 7) PROBE1(op, 8) PROBE1(op, 9) PROBE1(op, 10) PROBE1(op, 11) PROBE1(op, 12) PROBE1(op, 13) PROBE1(op, 14) \
    PROBE1(op, 15)
#define ZERO1(r) "vmovdqa64 %%zmm0, %%zmm" #r "\n\t"
#define PROBE_ZERO "vpxord %%zmm0, %%zmm0, %%zmm0\n\t" ZERO1(1) ZERO1(2) ZERO1(3) ZERO1(4) ZERO1(5) ZERO1(6) ZERO1(7) \
    ZERO1(8) ZERO1(9) ZERO1(10) ZERO1(11) ZERO1(12) ZERO1(13) ZERO1(14) ZERO1(15) ZERO1(16) ZERO1(17)
/* clang-format on */
#define PROBE_CLOBBERS                                                                                                                    \
    "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", \
        "xmm16", "xmm17", "cc"

/* n iterations of 16 instructions; the seconds they took */
__attribute__((noinline)) static double time_fma(long n) {
    const double t = ma_now_s();
    __asm__ volatile(PROBE_ZERO "1:\n\t" PROBE16("vfmadd231ps") "dec %0\n\tjnz 1b\n\t" : "+r"(n) : : PROBE_CLOBBERS);
    return ma_now_s() - t;
}

__attribute__((noinline)) static double time_dp(long n) {
    const double t = ma_now_s();
    __asm__ volatile(PROBE_ZERO "1:\n\t" PROBE16("vdpbf16ps") "dec %0\n\tjnz 1b\n\t" : "+r"(n) : : PROBE_CLOBBERS);
    return ma_now_s() - t;
}

double ma_gemm_bf16_dot_cost(void) {
    double f = 1e9, d = 1e9;
    for (int r = 0; r < 5; r++) { /* the best of five: a descheduled moment only slows one */
        const double tf = time_fma(2000), td = time_dp(2000);
        if (tf < f) f = tf;
        if (td < d) d = td;
    }
    return f > 0 ? d / f : 1e9;
}

void ma_gemm_install_bf16(ma_gemm_kernels_t *k, int with_tile) {
    k->amx_pack_a = amx_pack_a;
    k->amx_pack_b = amx_pack_b;
    k->amx_load_b = amx_load_b;
    k->bf16_tile = with_tile ? bf16_tile : NULL;
}
