/* SPDX-License-Identifier: Apache-2.0 */
/* AVX-512F micro-kernel (compiled with -mavx512f -mfma -mf16c; used only when the CPU has it):
 * 12 x 16 tiles, one zmm accumulator per row, so twelve independent FMA chains hide the FMA
 * latency on both ports. The panel loaders are the AVX2 ones, but for f16 / bf16 panels, which
 * convert 16 values an instruction here. */
#include <immintrin.h>

#include "kernels/gemm_impl.h"

#define NR MA_GEMM_NR
#define MR 12

/* 16 weights of a panel row as fp32: the converted buffer (f32) or a context's f16 / bf16 panels
 * straight from the mapping, converted in registers (on Zen 5 the conversion runs beside the
 * FMAs, so reading the stored precision costs nothing over a converted buffer) */
static inline __attribute__((always_inline)) __m512 load_w16(ma_dtype dt, const void *P, int64_t i) {
    if (dt == MA_DT_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)P + i)));
    if (dt == MA_DT_BF16)
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)P + i))), 16));
    return _mm512_loadu_ps((const float *)P + i);
}

/* one line of the next group's weights every `every` k (pf_step) */
#define PF_INIT(pf)                                                                                 \
    int64_t pf_next = 0;                                                                            \
    const int64_t pf_every = (pf).lines > 0 ? (kc / (pf).lines > 0 ? kc / (pf).lines : 1) : kc + 1; \
    const char *pf_p = (pf).p;                                                                      \
    int pf_left = (pf).lines;
#define PF_STEP(k)                                  \
    if ((k) == pf_next && pf_left > 0) {            \
        _mm_prefetch(pf_p, _MM_HINT_T1);            \
        pf_p += 64, pf_left--, pf_next += pf_every; \
    }

static inline __attribute__((always_inline)) void tile(int mr, ma_dtype dt, int64_t kc, const float *A, const void *P, float *C,
                                                       int64_t ldc, int nr, int accumulate, ma_tile_pf pf) {
    /* the C rows are read back at the end (K chunks after the first): fetch them meanwhile */
    if (accumulate)
        for (int r = 0; r < mr; r++) _mm_prefetch((const char *)(C + r * ldc), _MM_HINT_T0);
    __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
    __m512 c6 = c0, c7 = c0, c8 = c0, c9 = c0, c10 = c0, c11 = c0;
    PF_INIT(pf)
    for (int64_t k = 0; k < kc; k++) {
        const float *ak = A + k * MR;
        PF_STEP(k)
        const __m512 b = load_w16(dt, P, k * NR);
#define ROW(r) \
    if (mr > r) c##r = _mm512_fmadd_ps(_mm512_set1_ps(ak[r]), b, c##r);
        ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5) ROW(6) ROW(7) ROW(8) ROW(9) ROW(10) ROW(11)
#undef ROW
    }
    const __mmask16 m = (__mmask16)((1u << nr) - 1u);
    __m512 rows[MR] = {c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11};
    for (int r = 0; r < mr; r++) ma_store_row16(C + r * ldc, rows[r], m, accumulate);
}

/* 12 x 32 over two panels, the second pstride elements after the first: 24 accumulators, per k
 * two panel loads and twelve broadcasts for 24 FMAs (half the loads per FMA of the 12 x 16 tile) */
static inline __attribute__((always_inline)) void tile2(int mr, ma_dtype dt, int64_t kc, const float *A, const void *P, int64_t pstride,
                                                        float *C, int64_t ldc, int nr1, int accumulate, ma_tile_pf pf) {
    if (accumulate)
        for (int r = 0; r < mr; r++)
            _mm_prefetch((const char *)(C + r * ldc), _MM_HINT_T0), _mm_prefetch((const char *)(C + r * ldc + 16), _MM_HINT_T0);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0;
    __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0, b4 = a0, b5 = a0, b6 = a0, b7 = a0, b8 = a0, b9 = a0, b10 = a0, b11 = a0;
    PF_INIT(pf)
    for (int64_t k = 0; k < kc; k++) {
        const float *ak = A + k * MR;
        PF_STEP(k)
        const __m512 p0 = load_w16(dt, P, k * NR), p1 = load_w16(dt, P, pstride + k * NR);
#define ROW(r)                                  \
    if (mr > r) {                               \
        const __m512 x = _mm512_set1_ps(ak[r]); \
        a##r = _mm512_fmadd_ps(x, p0, a##r);    \
        b##r = _mm512_fmadd_ps(x, p1, b##r);    \
    }
        ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5) ROW(6) ROW(7) ROW(8) ROW(9) ROW(10) ROW(11)
#undef ROW
    }
    const __mmask16 m1 = (__mmask16)((1u << nr1) - 1u);
    __m512 ra[MR] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11};
    __m512 rb[MR] = {b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11};
    for (int r = 0; r < mr; r++) {
        ma_store_row16(C + r * ldc, ra[r], (__mmask16)0xffff, accumulate);
        ma_store_row16(C + r * ldc + 16, rb[r], m1, accumulate);
    }
}

/* one function per weight type, each with the row count dispatched to a constant */
#define TILE_FNS(suffix, DT)                                                                                                       \
    static void tile1_##suffix(int64_t kc, const float *A, const void *P, int64_t pstride, float *C, int64_t ldc, int mr, int nr,  \
                               int accumulate, ma_tile_pf pf) {                                                                    \
        (void)pstride;                                                                                                             \
        MA_DISPATCH_MR12(tile, DT, kc, A, P, C, ldc, nr, accumulate, pf)                                                           \
    }                                                                                                                              \
    static void tile2_##suffix(int64_t kc, const float *A, const void *P, int64_t pstride, float *C, int64_t ldc, int mr, int nr1, \
                               int accumulate, ma_tile_pf pf) {                                                                    \
        MA_DISPATCH_MR12(tile2, DT, kc, A, P, pstride, C, ldc, nr1, accumulate, pf)                                                \
    }
TILE_FNS(f32, MA_DT_F32)
TILE_FNS(f16, MA_DT_F16)
TILE_FNS(bf16, MA_DT_BF16)
#undef TILE_FNS

static void ukernel_avx512(int64_t kc, const float *A, const float *P, float *C, int64_t ldc, int mr, int nr, int accumulate) {
    MA_DISPATCH_MR12(tile, MA_DT_F32, kc, A, P, C, ldc, nr, accumulate, (ma_tile_pf){NULL, 0})
}

/* ---------------------------------------------------------------- small M: straight from panels
 * For at most 12 rows of A (the action expert's 10 tokens) every weight is used only M times,
 * so converting it into a panel buffer first costs as much as the FMAs. These kernels convert
 * the 16 values of each k in registers and feed them to the FMAs at once; the weights stream
 * sequentially through the panel layout. A is read where it lies (row-major, lda apart): a
 * broadcast load per row and k, from M short sequential streams that stay in L1, so nothing is
 * packed. */

/* bytes ahead of the weight stream to prefetch: a few lines past what the hardware prefetcher
 * has in flight at the start of each panel */
#define PREFETCH_AHEAD 1024

#define SMALL_ACC()                                                               \
    __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0; \
    __m512 c6 = c0, c7 = c0, c8 = c0, c9 = c0, c10 = c0, c11 = c0
#define SMALL_FMA(ak, b)                                                                      \
    do {                                                                                      \
        const __m512 b_ = (b);                                                                \
        const float *ak_ = (ak);                                                              \
        ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5) ROW(6) ROW(7) ROW(8) ROW(9) ROW(10) ROW(11) \
    } while (0)
#define ROW(r) \
    if (mr > r) c##r = _mm512_fmadd_ps(_mm512_set1_ps(ak_[r * lda]), b_, c##r);
#define SMALL_STORE()                                                                       \
    do {                                                                                    \
        const __mmask16 m_ = (__mmask16)((1u << nr) - 1u);                                  \
        __m512 rows_[MR] = {c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11};              \
        for (int r = 0; r < mr; r++) ma_store_row16(C + r * ldc, rows_[r], m_, accumulate); \
    } while (0)

/* f32 / f16 / bf16 panels (dt a constant at every call): 16 weights of each k converted in
 * registers; the half types, read at half the bytes, are prefetched ahead of the stream */
static inline __attribute__((always_inline)) void small_float(int mr, ma_dtype dt, const void *w, int kc, const float *A, int64_t lda,
                                                              float *C, int64_t ldc, int nr, int accumulate) {
    SMALL_ACC();
    for (int k = 0; k < kc; k++) {
        if (dt != MA_DT_F32) _mm_prefetch((const char *)((const uint16_t *)w + k * NR) + PREFETCH_AHEAD, _MM_HINT_T0);
        SMALL_FMA(A + k, load_w16(dt, w, k * NR));
    }
    SMALL_STORE();
}

/* blk: panel blocks of 32 k (16 f16 scales, then the values); kc a multiple of 32 */
static inline __attribute__((always_inline)) void small_q8(int mr, const uint8_t *blk, int kc, const float *A, int64_t lda, float *C,
                                                           int64_t ldc, int nr, int accumulate) {
    SMALL_ACC();
    for (int k = 0; k < kc; k += 32, blk += 544) {
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        for (int i = 0; i < 32; i++) {
            if (!(i & 3)) _mm_prefetch((const char *)(blk + 32 + i * NR) + PREFETCH_AHEAD, _MM_HINT_T0);
            const __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 32 + i * NR)));
            SMALL_FMA(A + k + i, _mm512_mul_ps(_mm512_cvtepi32_ps(q), d));
        }
    }
    SMALL_STORE();
}

static inline __attribute__((always_inline)) void small_q4(int mr, const uint8_t *blk, int kc, const float *A, int64_t lda, float *C,
                                                           int64_t ldc, int nr, int accumulate) {
    SMALL_ACC();
    const __m128i low = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    for (int k = 0; k < kc; k += 32, blk += 288) {
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        for (int j = 0; j < 16; j++) {
            if (!(j & 3)) _mm_prefetch((const char *)(blk + 32 + j * NR) + PREFETCH_AHEAD, _MM_HINT_T0);
            const __m128i v = _mm_loadu_si128((const __m128i *)(blk + 32 + j * NR));
            const __m128i lo = _mm_sub_epi8(_mm_and_si128(v, low), eight);
            const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), low), eight);
            SMALL_FMA(A + k + j, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)), d));
            SMALL_FMA(A + k + j + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)), d));
        }
    }
    SMALL_STORE();
}
#undef ROW

/* Two panels side by side (32 columns, the second pstride elements after the first): each row's
 * A value is broadcast into a register once and feeds two FMAs, so the FMAs take register
 * operands (no indexed memory operand, which Intel cores split into two uops) and the A loads
 * are halved. 2 x 12 accumulators, two weight vectors and the broadcast fit in the 32 registers. */
#define PAIR_ACC()                                               \
    SMALL_ACC();                                                 \
    __m512 e0 = c0, e1 = c0, e2 = c0, e3 = c0, e4 = c0, e5 = c0; \
    __m512 e6 = c0, e7 = c0, e8 = c0, e9 = c0, e10 = c0, e11 = c0
#define ROW(r)                                          \
    if (mr > r) {                                       \
        const __m512 a_ = _mm512_set1_ps(ak_[r * lda]); \
        c##r = _mm512_fmadd_ps(a_, b0_, c##r);          \
        e##r = _mm512_fmadd_ps(a_, b1_, e##r);          \
    }
#define PAIR_FMA(ak, b0, b1)                                                                  \
    do {                                                                                      \
        const __m512 b0_ = (b0), b1_ = (b1);                                                  \
        const float *ak_ = (ak);                                                              \
        ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5) ROW(6) ROW(7) ROW(8) ROW(9) ROW(10) ROW(11) \
    } while (0)
#define PAIR_STORE()                                                              \
    do {                                                                          \
        const __mmask16 m_ = (__mmask16)((1u << nr1) - 1u);                       \
        __m512 rows_[MR] = {c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11};    \
        __m512 rows2_[MR] = {e0, e1, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11};   \
        for (int r = 0; r < mr; r++) {                                            \
            ma_store_row16(C + r * ldc, rows_[r], (__mmask16)0xffff, accumulate); \
            ma_store_row16(C + r * ldc + NR, rows2_[r], m_, accumulate);          \
        }                                                                         \
    } while (0)

/* f32 / f16 / bf16 panels (dt a constant at every call), as small_float */
static inline __attribute__((always_inline)) void pair_float(int mr, ma_dtype dt, const void *w, int64_t pstride, int kc, const float *A,
                                                             int64_t lda, float *C, int64_t ldc, int nr1, int accumulate) {
    PAIR_ACC();
    for (int k = 0; k < kc; k++) {
        if (dt != MA_DT_F32 && !(k & 1)) {
            _mm_prefetch((const char *)((const uint16_t *)w + k * NR) + PREFETCH_AHEAD, _MM_HINT_T0);
            _mm_prefetch((const char *)((const uint16_t *)w + pstride + k * NR) + PREFETCH_AHEAD, _MM_HINT_T0);
        }
        PAIR_FMA(A + k, load_w16(dt, w, k * NR), load_w16(dt, w, pstride + k * NR));
    }
    PAIR_STORE();
}
#undef ROW

/* panels n0 (full) and n0 + 16 (nr1 columns) of one f32 / f16 / bf16 B; 0 for other types (the
 * caller then takes them one at a time) */
static int small_pair(const ma_bmat *B, int64_t K, int64_t n0, int nr1, int64_t k0, int kc, const float *A, int64_t lda, int mr, float *C,
                      int64_t ldc, int accumulate) {
    const int64_t p = n0 / NR, pstride = K * NR;
    switch (B->dtype) {
    case MA_DT_F16: {
        const uint16_t *w = (const uint16_t *)B->data + (p * K + k0) * NR;
        MA_DISPATCH_MR12(pair_float, MA_DT_F16, w, pstride, kc, A, lda, C, ldc, nr1, accumulate)
    }
        return 1;
    case MA_DT_BF16: {
        const uint16_t *w = (const uint16_t *)B->data + (p * K + k0) * NR;
        MA_DISPATCH_MR12(pair_float, MA_DT_BF16, w, pstride, kc, A, lda, C, ldc, nr1, accumulate)
    }
        return 1;
    case MA_DT_F32: {
        const float *w = (const float *)B->data + (p * K + k0) * NR;
        MA_DISPATCH_MR12(pair_float, MA_DT_F32, w, pstride, kc, A, lda, C, ldc, nr1, accumulate)
    }
        return 1;
    default: return 0;
    }
}

static void small_panels(const ma_bmat *B, int64_t K, int64_t n0, int nr, int64_t k0, int kc, const float *A, int64_t lda, int mr, float *C,
                         int64_t ldc, int accumulate) {
    const int64_t p = n0 / NR;
    switch (B->dtype) {
    case MA_DT_F16: {
        const uint16_t *w = (const uint16_t *)B->data + (p * K + k0) * NR;
        MA_DISPATCH_MR12(small_float, MA_DT_F16, w, kc, A, lda, C, ldc, nr, accumulate)
    } break;
    case MA_DT_BF16: {
        const uint16_t *w = (const uint16_t *)B->data + (p * K + k0) * NR;
        MA_DISPATCH_MR12(small_float, MA_DT_BF16, w, kc, A, lda, C, ldc, nr, accumulate)
    } break;
    case MA_DT_F32: {
        const float *w = (const float *)B->data + (p * K + k0) * NR;
        MA_DISPATCH_MR12(small_float, MA_DT_F32, w, kc, A, lda, C, ldc, nr, accumulate)
    } break;
    case MA_DT_Q8_0: {
        const uint8_t *blk = (const uint8_t *)B->data + ((size_t)p * (size_t)(K / 32) + (size_t)(k0 / 32)) * 544;
        MA_DISPATCH_MR12(small_q8, blk, kc, A, lda, C, ldc, nr, accumulate)
    } break;
    default: {
        const uint8_t *blk = (const uint8_t *)B->data + ((size_t)p * (size_t)(K / 32) + (size_t)(k0 / 32)) * 288;
        MA_DISPATCH_MR12(small_q4, blk, kc, A, lda, C, ldc, nr, accumulate)
    } break;
    }
}

/* f16 / bf16 context panels into the fp32 panel buffer, 16 values per instruction (the AVX2
 * loaders take two conversions and a lane extract for the same 16) */
static void load_panels_f16(const ma_bmat *B, int64_t K, int64_t n0, int nr, int64_t k0, int kc, float *P) {
    (void)nr;
    const uint16_t *s = (const uint16_t *)B->data + (n0 / NR) * K * NR + k0 * NR;
    for (int64_t i = 0; i < (int64_t)kc * NR; i += 16) _mm512_store_ps(P + i, load_w16(MA_DT_F16, s, i));
}

static void load_panels_bf16(const ma_bmat *B, int64_t K, int64_t n0, int nr, int64_t k0, int kc, float *P) {
    (void)nr;
    const uint16_t *s = (const uint16_t *)B->data + (n0 / NR) * K * NR + k0 * NR;
    for (int64_t i = 0; i < (int64_t)kc * NR; i += 16) _mm512_store_ps(P + i, load_w16(MA_DT_BF16, s, i));
}

void ma_gemm_install_avx512(ma_gemm_kernels_t *k) {
    k->name = "avx512";
    k->ukernel = ukernel_avx512;
    k->mr = MR;
    k->small_panels = small_panels;
    k->small_pair = small_pair;
    k->tile1[MA_DT_F32] = tile1_f32;
    k->tile2[MA_DT_F32] = tile2_f32;
    k->tile1[MA_DT_F16] = tile1_f16;
    k->tile2[MA_DT_F16] = tile2_f16;
    k->tile1[MA_DT_BF16] = tile1_bf16;
    k->tile2[MA_DT_BF16] = tile2_bf16;
    k->load[MA_B_PANELS][MA_DT_F16] = load_panels_f16;
    k->load[MA_B_PANELS][MA_DT_BF16] = load_panels_bf16;
}
