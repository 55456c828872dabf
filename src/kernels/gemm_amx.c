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
 * The operands are split and laid out by gemm_bf16.c (the layouts are described there); this file
 * holds what needs the tile unit.
 *
 * With the bf16 compute plan (MA_COMPUTE_BF16, gemm.h) only a_hi w_hi is computed: one tile
 * product instead of three (f16 weights) or two (bf16 weights). */
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

/* C tiles 0..3 = rows 0-15 / 16-31 x columns 0-15 / 16-31; A in tiles 4, 5; B in 6, 7. R row
 * tiles and NP panels, constants after inlining (tile numbers must be immediates). */
static inline __attribute__((always_inline)) void tiles(int R, int NP, int nb, const uint16_t *A, const uint16_t *B, size_t ts, float *C,
                                                        int64_t ldc, int load_c, int lo) {
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
    const size_t bs = lo ? 2 * TILE_U16 : TILE_U16; /* the split layout, or hi alone (bf16 compute) */
    for (int j = 0; j < nb; j++) {
        const uint16_t *a = A + (size_t)j * bs, *b = B + (size_t)j * bs;
        if (!lo && j + 1 < nb) { /* bf16 plan: the next block's B tiles (L2) towards L1 while these compute (the split
                                  * layout's twice as many lines measured no faster) */
            const char *nb0 = (const char *)(b + bs), *nb1 = (const char *)(b + b1 + bs);
            for (int l = 0; l < 16; l++) {
                _mm_prefetch(nb0 + 64 * l, _MM_HINT_T0);
                if (NP == 2) _mm_prefetch(nb1 + 64 * l, _MM_HINT_T0);
            }
        }
        /* B streams from L2 and A stays in L1: each B tile is loaded once, A_hi twice */
        _tile_loadd(4, a, 64); /* a_hi w_hi */
        if (R == 2) _tile_loadd(5, a + a1, 64);
        _tile_loadd(6, b, 64);
        if (NP == 2) _tile_loadd(7, b + b1, 64);
        DP4();
        if (lo & MA_AMX_A_LO) { /* a_lo w_hi */
            _tile_loadd(4, a + TILE_U16, 64);
            if (R == 2) _tile_loadd(5, a + a1 + TILE_U16, 64);
            DP4();
        }
        if (lo & MA_AMX_B_LO) { /* a_hi w_lo */
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

static void run_tiles(int R, int NP, int nb, const uint16_t *A, const uint16_t *B, size_t ts, float *C, int64_t ldc, int load_c, int lo) {
    if (R == 2 && NP == 2) tiles(2, 2, nb, A, B, ts, C, ldc, load_c, lo);
    else if (R == 2) tiles(2, 1, nb, A, B, ts, C, ldc, load_c, lo);
    else if (NP == 2) tiles(1, 2, nb, A, B, ts, C, ldc, load_c, lo);
    else tiles(1, 1, nb, A, B, ts, C, ldc, load_c, lo);
}

/* C[mr, ncols] (+)= A x B over nb 32-k blocks, mr <= 32 (A tiles from amx_pack_a), ncols <= 32
 * (one or two panels from amx_pack_b); the second row tile and panel start ts uint16 after the
 * first. Partial tiles go through a local 32 x 32 block. */
static void amx_tile(int nb, const uint16_t *A, const uint16_t *B, size_t ts, float *C, int64_t ldc, int mr, int ncols, int accumulate,
                     int lo) {
    const int R = mr > 16 ? 2 : 1, NP = ncols > 16 ? 2 : 1;
    if (mr == 16 * R && ncols == 16 * NP) {
        run_tiles(R, NP, nb, A, B, ts, C, ldc, accumulate, lo);
        return;
    }
    _Alignas(64) float T[32 * 32];
    if (accumulate) {
        memset(T, 0, sizeof T);
        for (int r = 0; r < mr; r++) memcpy(T + r * 32, C + r * ldc, sizeof(float) * (size_t)ncols);
    }
    run_tiles(R, NP, nb, A, B, ts, T, 32, accumulate, lo);
    for (int r = 0; r < mr; r++) memcpy(C + r * ldc, T + r * 32, sizeof(float) * (size_t)ncols);
}

void ma_gemm_install_amx(ma_gemm_kernels_t *k) {
    k->name = "amx";
    k->amx_begin = amx_begin;
    k->amx_end = amx_end;
    k->amx_tile = amx_tile;
}
