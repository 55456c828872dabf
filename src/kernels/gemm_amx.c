/* SPDX-License-Identifier: Apache-2.0 */
/* AMX tiles for the GEMM at fp32 accuracy (compiled with -mamx-tile -mamx-bf16 -mavx512f
 * -mavx512bw -mavx512bf16; used only where the CPU has AMX-BF16 and the OS grants the tile state).
 *
 * AMX multiplies bf16 (8 significant bits) and accumulates in fp32, 16 x 16 x 32 per
 * instruction, sixteen times the FMA throughput of AVX-512. To keep fp32 activations we split
 * both operands into two bf16 terms, x = hi + lo with hi = bf16(x), lo = bf16(x - hi), and sum
 * three products:
 *     a w  ~  a_hi w_hi + a_lo w_hi + a_hi w_lo        (a_lo w_lo, about 2^-18 a w, is dropped)
 * For f16 and bf16 weights the split of w is exact (an f16 has 11 significant bits); for bf16
 * weights w_lo is zero and its product is skipped. What remains is at most about 2^-17 of each
 * product: fp32-like, and 30 times below the rounding of the f16 weights themselves.
 *
 * Layouts (uint16 bf16 values, one 1 KiB tile = 16 rows x 64 bytes):
 *   A: per 16-row tile, per 32-k block: hi [16 rows][32 k], then lo
 *   B: per 16-column panel, per 32-k block: hi [16 k pairs][16 columns][2], then lo
 *      (the pair layout TDPBF16PS reads)
 * Rows past M, columns past N and k past K are zero in both, so they add nothing. */
#include <immintrin.h>
#include <string.h>

#include "kernels/gemm_impl.h"

#define TILE_U16 512 /* uint16 values in one tile */

typedef struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* all eight tiles 16 rows x 64 bytes. A static object: GCC 12 drops the stores to a local
 * one before LDTILECFG (it does not see the instruction read them). */
static const tile_config config = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

static void amx_begin(void) { _tile_loadconfig(&config); }

static void amx_end(void) { _tile_release(); }

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

static void amx_pack_a(const float *A, int64_t lda, int64_t m0, int64_t m1, int64_t k0, int kc, uint16_t *out) {
    const int nb = (kc + 31) / 32;
    for (int64_t m = m0; m < m1; m += 16) {
        uint16_t *t = out + (m - m0) / 16 * nb * 2 * TILE_U16;
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
                _mm512_store_si512(t + (size_t)b * 2 * TILE_U16 + r * 32, hi);
                _mm512_store_si512(t + (size_t)b * 2 * TILE_U16 + TILE_U16 + r * 32, lo);
            }
        }
    }
}

/* (k, k + 1) x 16 columns -> [column][pair]: element 2n + e comes from e * 16 + n */
static const uint16_t pair_order[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                        8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

/* one fp32 panel P[kc][16] (as the panel loaders write it) -> the B layout; rows past kc zero */
static void amx_pack_b(const float *P, int kc, uint16_t *out) {
    const __m512i idx = _mm512_loadu_si512(pair_order);
    const int nb = (kc + 31) / 32;
    for (int b = 0; b < nb; b++)
        for (int p = 0; p < 16; p++) {
            const int k = 32 * b + 2 * p;
            const __m512 x0 = k < kc ? _mm512_load_ps(P + (size_t)k * 16) : _mm512_setzero_ps();
            const __m512 x1 = k + 1 < kc ? _mm512_load_ps(P + (size_t)(k + 1) * 16) : _mm512_setzero_ps();
            __m512i hi, lo;
            split32(x0, x1, &hi, &lo);
            _mm512_store_si512(out + (size_t)b * 2 * TILE_U16 + p * 32, _mm512_permutexvar_epi16(idx, hi));
            _mm512_store_si512(out + (size_t)b * 2 * TILE_U16 + TILE_U16 + p * 32, _mm512_permutexvar_epi16(idx, lo));
        }
}

/* B in the panel layout, f16 or bf16, straight into the B layout: two k rows of 16 columns are
 * 64 contiguous bytes there. Returns 0 for the other layouts and types (then the fp32 panel
 * loaders and amx_pack_b are used). */
static int amx_load_b(const ma_bmat *B, int64_t K, int64_t n0, int64_t k0, int kc, uint16_t *out) {
    if (B->layout != MA_B_PANELS || (B->dtype != MA_DT_F16 && B->dtype != MA_DT_BF16)) return 0;
    const __m512i idx = _mm512_loadu_si512(pair_order);
    const uint16_t *src = (const uint16_t *)B->data + ((n0 / 16) * K + k0) * 16;
    const int nb = (kc + 31) / 32, bf16 = B->dtype == MA_DT_BF16;
    for (int b = 0; b < nb; b++)
        for (int p = 0; p < 16; p++) {
            const int k = 32 * b + 2 * p;
            const __mmask32 m = k + 1 < kc ? 0xffffffffu : k < kc ? 0xffffu : 0;
            const __m512i w = _mm512_maskz_loadu_epi16(m, src + (size_t)k * 16);
            uint16_t *o = out + (size_t)b * 2 * TILE_U16 + p * 32;
            if (bf16) { /* already the hi term; lo is zero and never read (b_lo = 0) */
                _mm512_store_si512(o, _mm512_permutexvar_epi16(idx, w));
                continue;
            }
            __m512i hi, lo;
            split32(_mm512_cvtph_ps(_mm512_castsi512_si256(w)), _mm512_cvtph_ps(_mm512_extracti64x4_epi64(w, 1)), &hi, &lo);
            _mm512_store_si512(o, _mm512_permutexvar_epi16(idx, hi));
            _mm512_store_si512(o + TILE_U16, _mm512_permutexvar_epi16(idx, lo));
        }
    return 1;
}

/* C tiles 0..3 = rows 0-15 / 16-31 x columns 0-15 / 16-31; A in tiles 4, 5; B in 6, 7. R row
 * tiles and NP panels, constants after inlining (tile numbers must be immediates). */
static inline __attribute__((always_inline)) void tiles(int R, int NP, int nb, const uint16_t *A, const uint16_t *B,
                                                         size_t ts, float *C, int64_t ldc, int load_c, int b_lo) {
    const size_t st = (size_t)ldc * 4;
    const size_t a1 = ts, b1 = ts; /* the second row tile / panel */
    if (load_c) {
        _tile_loadd(0, C, st);
        if (NP == 2) _tile_loadd(1, C + 16, st);
        if (R == 2) _tile_loadd(2, C + 16 * ldc, st);
        if (R == 2 && NP == 2) _tile_loadd(3, C + 16 * ldc + 16, st);
    } else {
        _tile_zero(0);
        if (NP == 2) _tile_zero(1);
        if (R == 2) _tile_zero(2);
        if (R == 2 && NP == 2) _tile_zero(3);
    }
#define DP4()                                           \
    do {                                                \
        _tile_dpbf16ps(0, 4, 6);                        \
        if (NP == 2) _tile_dpbf16ps(1, 4, 7);           \
        if (R == 2) _tile_dpbf16ps(2, 5, 6);            \
        if (R == 2 && NP == 2) _tile_dpbf16ps(3, 5, 7); \
    } while (0)
    for (int j = 0; j < nb; j++) {
        const uint16_t *a = A + (size_t)j * 2 * TILE_U16, *b = B + (size_t)j * 2 * TILE_U16;
        /* B streams from L2 and A stays in L1: each B tile is loaded once, A_hi twice */
        _tile_loadd(4, a, 64); /* a_hi w_hi */
        if (R == 2) _tile_loadd(5, a + a1, 64);
        _tile_loadd(6, b, 64);
        if (NP == 2) _tile_loadd(7, b + b1, 64);
        DP4();
        _tile_loadd(4, a + TILE_U16, 64); /* a_lo w_hi */
        if (R == 2) _tile_loadd(5, a + a1 + TILE_U16, 64);
        DP4();
        if (b_lo) { /* a_hi w_lo */
            _tile_loadd(4, a, 64);
            if (R == 2) _tile_loadd(5, a + a1, 64);
            _tile_loadd(6, b + TILE_U16, 64);
            if (NP == 2) _tile_loadd(7, b + b1 + TILE_U16, 64);
            DP4();
        }
    }
#undef DP4
    _tile_stored(0, C, st);
    if (NP == 2) _tile_stored(1, C + 16, st);
    if (R == 2) _tile_stored(2, C + 16 * ldc, st);
    if (R == 2 && NP == 2) _tile_stored(3, C + 16 * ldc + 16, st);
}

static void run_tiles(int R, int NP, int nb, const uint16_t *A, const uint16_t *B, size_t ts, float *C, int64_t ldc,
                      int load_c, int b_lo) {
    if (R == 2 && NP == 2) tiles(2, 2, nb, A, B, ts, C, ldc, load_c, b_lo);
    else if (R == 2) tiles(2, 1, nb, A, B, ts, C, ldc, load_c, b_lo);
    else if (NP == 2) tiles(1, 2, nb, A, B, ts, C, ldc, load_c, b_lo);
    else tiles(1, 1, nb, A, B, ts, C, ldc, load_c, b_lo);
}

/* C[mr, ncols] (+)= A x B over nb 32-k blocks, mr <= 32 (A tiles from amx_pack_a), ncols <= 32
 * (one or two panels from amx_pack_b); the second row tile and panel start ts uint16 after the
 * first. Partial tiles go through a local 32 x 32 block. */
static void amx_tile(int nb, const uint16_t *A, const uint16_t *B, size_t ts, float *C, int64_t ldc, int mr, int ncols,
                     int accumulate, int b_lo) {
    const int R = mr > 16 ? 2 : 1, NP = ncols > 16 ? 2 : 1;
    if (mr == 16 * R && ncols == 16 * NP) {
        run_tiles(R, NP, nb, A, B, ts, C, ldc, accumulate, b_lo);
        return;
    }
    _Alignas(64) float T[32 * 32];
    if (accumulate) {
        memset(T, 0, sizeof T);
        for (int r = 0; r < mr; r++) memcpy(T + r * 32, C + r * ldc, sizeof(float) * (size_t)ncols);
    }
    run_tiles(R, NP, nb, A, B, ts, T, 32, accumulate, b_lo);
    for (int r = 0; r < mr; r++) memcpy(C + r * ldc, T + r * 32, sizeof(float) * (size_t)ncols);
}

void ma_gemm_install_amx(ma_gemm_kernels_t *k) {
    k->name = "amx";
    k->amx_begin = amx_begin;
    k->amx_end = amx_end;
    k->amx_pack_a = amx_pack_a;
    k->amx_pack_b = amx_pack_b;
    k->amx_load_b = amx_load_b;
    k->amx_tile = amx_tile;
}
