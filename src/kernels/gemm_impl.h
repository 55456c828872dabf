/* SPDX-License-Identifier: Apache-2.0 */
/* Internal to the GEMM module: the micro-kernel and panel-loader signatures that the portable
 * and SIMD implementations provide. */
#ifndef MA_GEMM_IMPL_H
#define MA_GEMM_IMPL_H

#include "kernels/gemm.h"

/* C[mr, nr] (+)= A x P for a packed A tile [kc][kernel mr] and a panel P[kc][16]; accumulate:
 * add to C instead of storing */
typedef void (*ma_ukernel_fn)(int64_t kc, const float *A, const float *P, float *C, int64_t ldc, int mr, int nr, int accumulate);
/* P[kc][16] = columns n0..n0+nr-1 of B for k = k0..k0+kc-1, fp32; columns >= nr are zero */
typedef void (*ma_panel_fn)(const ma_bmat *B, int64_t K, int64_t n0, int nr, int64_t k0, int kc, float *P);

/* C[mr, nr] (+)= A x B for mr <= the kernel's mr, straight from B in the panel layout (any
 * weight type); A row-major (row r at A + r * lda, its column k0 first); kc a multiple of 32 for
 * quantised B */
typedef void (*ma_small_fn)(const ma_bmat *B, int64_t K, int64_t n0, int nr, int64_t k0, int kc, const float *A, int64_t lda, int mr,
                            float *C, int64_t ldc, int accumulate);

/* the grouped path's tiles on panels [kc][16] of one weight type read in place: fp32 (converted
 * panels, or f32 context panels) or f16 / bf16 context panels converted in registers.
 * tile1: C[mr, nr] (+)= A x P; tile2: two panels, the second pstride elements after the first,
 * C[mr, 16 + nr1] (+)= A x [P | P + pstride] (the first panel full). Both also prefetch pf.lines
 * lines from pf.p (the next group's weights) towards L2, one every kc / lines k: issued in a
 * burst before the call, they filled the core's miss buffers and the FMAs waited behind them */
typedef struct ma_tile_pf {
    const char *p;
    int lines;
} ma_tile_pf; /* lines to prefetch towards L2, spread over k */
typedef void (*ma_tile_fn)(int64_t kc, const float *A, const void *P, int64_t pstride, float *C, int64_t ldc, int mr, int nr,
                           int accumulate, ma_tile_pf pf);

/* A[m0..m1) x [k0, k0 + kc) -> tiles of TR rows, each [kc][TR], rows past m1 zero */
typedef void (*ma_pack_fn)(const float *A, int64_t lda, int64_t m0, int64_t m1, int64_t k0, int kc, int TR, float *out);

typedef struct ma_gemm_kernels_t {
    const char *name;
    int mr; /* rows of the micro-kernel's tile (the A packing follows it); <= MA_GEMM_MR_MAX */
    ma_ukernel_fn ukernel;
    ma_panel_fn load[MA_B_LAYOUTS][MA_DT_COUNT]; /* [layout][dtype]; NULL = not supported */
    ma_small_fn small_panels;                    /* optional: M <= small_mr on panel-layout B */
    int small_mr;                                /* rows small_panels takes (<= MA_GEMM_MR_MAX); 0: mr */
    /* optional: as small_panels on panels n0 (full) and n0 + 16 (nr1 columns) of one B at once;
     * returns 0 (nothing done) for a weight type it does not take */
    int (*small_pair)(const ma_bmat *B, int64_t K, int64_t n0, int nr1, int64_t k0, int kc, const float *A, int64_t lda, int mr, float *C,
                      int64_t ldc, int accumulate);
    ma_pack_fn pack_a;
    /* optional (then B is used a group of panels at a time, each converted once per K chunk unless
     * tile2 has its type, which is then read from the panels in place): [dtype], F32 required */
    ma_tile_fn tile1[MA_DT_COUNT], tile2[MA_DT_COUNT];
    /* optional AMX tiles (gemm_amx.c, layouts there): for M >= MA_GEMM_AMX_MIN_M the driver
     * splits A and the converted panels into bf16 hi/lo tiles and runs 32 x 32 blocks */
    void (*amx_begin)(void); /* load the tile configuration on this thread */
    void (*amx_end)(void);
    /* split: hi and lo terms per 32-k block (fp32 accuracy), else hi alone (bf16 compute) */
    void (*amx_pack_a)(const float *A, int64_t lda, int64_t m0, int64_t m1, int64_t k0, int kc, int split, uint16_t *out);
    void (*amx_pack_b)(const float *P, int kc, int split, uint16_t *out);
    /* panel n0 of B for k0..k0 + kc straight into the B tiles where the layout and type allow
     * (returns 1), else 0 */
    int (*amx_load_b)(const ma_bmat *B, int64_t K, int64_t n0, int64_t k0, int kc, int split, uint16_t *out);
    /* C[mr <= 32, ncols <= 32] (+)= A x B over nb 32-k blocks; the second row tile / panel ts
     * uint16 after the first; lo: which lo terms to add to a_hi w_hi (MA_AMX_A_LO: a_lo w_hi,
     * MA_AMX_B_LO: a_hi w_lo; then both operands are in the split layout), or 0: the bf16
     * compute plan, on the hi-only layout */
    void (*amx_tile)(int nb, const uint16_t *A, const uint16_t *B, size_t ts, float *C, int64_t ldc, int mr, int ncols, int accumulate,
                     int lo);
    /* optional (gemm_bf16.c, AVX512-BF16 without AMX): the bf16 compute plan's tile, as amx_tile
     * with lo = 0, on the same layouts (amx_pack_a, amx_pack_b, amx_load_b, which gemm_bf16.c
     * provides for both) */
    void (*bf16_tile)(int nb, const uint16_t *A, const uint16_t *B, size_t ts, float *C, int64_t ldc, int mr, int ncols, int accumulate);
    /* optional int8 dot products for q8_0 / q4_0 panels with M <= mr (gemm_vnni.c): A's rows
     * m0..m1 (at most 12) for k0..k0 + kc (a multiple of 32) quantised to MA_GEMM_QA_BLOCK bytes
     * per 32 k, then used by q_panels as small_panels uses the packed fp32 A */
    void (*qa_pack)(const float *A, int64_t lda, int64_t m0, int64_t m1, int64_t k0, int kc, void *out);
    void (*q_panels)(const ma_bmat *B, int64_t K, int64_t n0, int nr, int64_t k0, int kc, const void *qa, int mr, float *C, int64_t ldc,
                     int accumulate);
    /* optional, for many row tiles (M > 12): panel n0's blocks k0..k0 + kc laid out once as the
     * dot products read them (MA_GEMM_QW_BLOCK bytes per 32 k), then q_tile as q_panels on them,
     * so a weight block is rearranged once per K chunk instead of once per 12-row tile */
    void (*q_transform)(const ma_bmat *B, int64_t K, int64_t n0, int64_t k0, int kc, void *out);
    void (*q_tile)(ma_dtype dt, const void *wt, size_t ws, int np, int kc, const void *qa, int mr, float *C, int64_t ldc, int nr_last,
                   int accumulate); /* np <= 3 panels of one type, ws bytes apart, the last nr_last columns wide */
    /* optional (gemm_neon_fp16.c, aarch64 with FP16 arithmetic): the f16 compute plan on f16
     * context panels. f16_pack_a: A's rows m0..m1 for k0..k0 + kc, each scaled by a power of two
     * (its inverse in inv[row - m0]) and rounded to f16, in tiles of MA_GEMM_F16_TR rows
     * [kc][MA_GEMM_F16_TR] (rows past m1 zero); f16_tile: C[mr <= MA_GEMM_F16_TR, nr <= 16] (+)=
     * one such tile x a panel [kc][16] read in place (arithmetic in gemm.h) */
    void (*f16_pack_a)(const float *A, int64_t lda, int64_t m0, int64_t m1, int64_t k0, int kc, uint16_t *out, float *inv);
    void (*f16_tile)(int kc, const uint16_t *A, const float *inv, const uint16_t *P, float *C, int64_t ldc, int mr, int nr, int accumulate);
} ma_gemm_kernels_t;

#define MA_GEMM_F16_TR 8

#define MA_AMX_A_LO 1
#define MA_AMX_B_LO 2

#define MA_GEMM_QA_BLOCK 528
#define MA_GEMM_QW_BLOCK \
    576 /* 8 x 64 bytes of unsigned weights, 16 fp32 scales */ /* 12 rows x 32 int8, 12 float scales, 2 x 12 int32 offset corrections */

/* one instantiation per row count (1..12) of an always-inline tile function fn(mr, ...), so the
 * accumulators stay in registers (the AVX-512 and int8 kernels) */
#define MA_DISPATCH_MR12(fn, ...)        \
    switch (mr) {                        \
    case 12: fn(12, __VA_ARGS__); break; \
    case 11: fn(11, __VA_ARGS__); break; \
    case 10: fn(10, __VA_ARGS__); break; \
    case 9: fn(9, __VA_ARGS__); break;   \
    case 8: fn(8, __VA_ARGS__); break;   \
    case 7: fn(7, __VA_ARGS__); break;   \
    case 6: fn(6, __VA_ARGS__); break;   \
    case 5: fn(5, __VA_ARGS__); break;   \
    case 4: fn(4, __VA_ARGS__); break;   \
    case 3: fn(3, __VA_ARGS__); break;   \
    case 2: fn(2, __VA_ARGS__); break;   \
    default: fn(1, __VA_ARGS__); break;  \
    }

#if defined(__AVX512F__)
#include <immintrin.h>
/* the first lanes (mask m) of one C row from an accumulator, added to C when accumulating */
static inline __attribute__((always_inline)) void ma_store_row16(float *cr, __m512 c, __mmask16 m, int accumulate) {
    if (accumulate) c = _mm512_add_ps(c, _mm512_maskz_loadu_ps(m, cr));
    _mm512_mask_storeu_ps(cr, m, c);
}
#endif

#if defined(__x86_64__) && defined(MA_HAVE_AVX2)
/* replaces the entries the AVX2 + FMA + F16C code provides */
void ma_gemm_install_avx2(ma_gemm_kernels_t *k);
#endif
#if defined(__x86_64__) && defined(MA_HAVE_AVX512)
/* the AVX-512F micro-kernel on top of the AVX2 loaders */
void ma_gemm_install_avx512(ma_gemm_kernels_t *k);
#endif
#if defined(__x86_64__) && defined(MA_HAVE_VNNI)
/* int8 dot products for q8_0 / q4_0 with few rows, on top of the AVX-512 kernels */
void ma_gemm_install_vnni(ma_gemm_kernels_t *k);
#endif
#if defined(__x86_64__) && defined(MA_HAVE_AMX)
/* the AMX tiles on top of the AVX-512 kernels (which still serve M < MA_GEMM_AMX_MIN_M) */
void ma_gemm_install_amx(ma_gemm_kernels_t *k);
/* gemm_bf16.c: the bf16 packers (which the AMX tiles need too) and, with_tile, the VDPBF16PS
 * tile; whether that tile multiplies faster than the FMA kernels here (measured once) */
void ma_gemm_install_bf16(ma_gemm_kernels_t *k, int with_tile);
/* the time of one VDPBF16PS over one FMA, timed in assembly (gemm_bf16.c) */
double ma_gemm_bf16_dot_cost(void);
#endif
#if defined(__aarch64__)
/* the NEON micro-kernel (aarch64) on top of the portable loaders */
void ma_gemm_install_neon(ma_gemm_kernels_t *k);
/* SDOT int8 dot products for q8_0 / q4_0 (where the CPU has asimddp), on top of the NEON set */
void ma_gemm_install_neon_dot(ma_gemm_kernels_t *k);
/* the f16 compute plan's tiles (where the CPU has asimdhp), added to the NEON set */
void ma_gemm_install_neon_fp16(ma_gemm_kernels_t *k);
#endif

#endif
