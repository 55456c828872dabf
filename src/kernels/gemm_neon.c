/* SPDX-License-Identifier: Apache-2.0 */
/* its hand layout: clang-format 14 folds statement macros (DECL(0) DECL(1) ..., X-lists) into one
 * line with the code after them */
/* clang-format off */
/* NEON GEMM micro-kernel (aarch64): C[6, 16] (+)= A x P with fp32 FMAs, the portable set's tile
 * and packing. Per k: four 4-float loads of the panel row, one 4-float and one 2-float load of
 * the six A values, and 24 FMAs (VFMLA by lane: no broadcast instructions), on 24 accumulator
 * registers + 4 panel + 2 A = 30 of the 32 vector registers. The weight conversion (f16 via
 * FCVTL, bf16 by a shift) stays in the panel loaders. */
#include <arm_neon.h>
#include <string.h>

#include "kernels/gemm_impl.h"

#define NMR 6

#define ROW(r, av, lane, get)                                         \
    c##r##0 = get(c##r##0, b0, av, lane);                            \
    c##r##1 = get(c##r##1, b1, av, lane);                            \
    c##r##2 = get(c##r##2, b2, av, lane);                            \
    c##r##3 = get(c##r##3, b3, av, lane);

#define DECL(r) float32x4_t c##r##0 = vdupq_n_f32(0.0f), c##r##1 = c##r##0, c##r##2 = c##r##0, c##r##3 = c##r##0;
#define SPILL(r) vst1q_f32(t[r], c##r##0); vst1q_f32(t[r] + 4, c##r##1); vst1q_f32(t[r] + 8, c##r##2); vst1q_f32(t[r] + 12, c##r##3);

static void ukernel_neon(int64_t kc, const float *A, const float *P, float *C, int64_t ldc, int mr, int nr, int accumulate) {
    DECL(0) DECL(1) DECL(2) DECL(3) DECL(4) DECL(5)
    for (int64_t k = 0; k < kc; k++) {
        const float *p = P + k * 16, *a = A + k * NMR;
        const float32x4_t b0 = vld1q_f32(p), b1 = vld1q_f32(p + 4), b2 = vld1q_f32(p + 8), b3 = vld1q_f32(p + 12);
        const float32x4_t a03 = vld1q_f32(a);
        const float32x2_t a45 = vld1_f32(a + 4);
        ROW(0, a03, 0, vfmaq_laneq_f32)
        ROW(1, a03, 1, vfmaq_laneq_f32)
        ROW(2, a03, 2, vfmaq_laneq_f32)
        ROW(3, a03, 3, vfmaq_laneq_f32)
        ROW(4, a45, 0, vfmaq_lane_f32)
        ROW(5, a45, 1, vfmaq_lane_f32)
    }
    float t[NMR][16];
    SPILL(0) SPILL(1) SPILL(2) SPILL(3) SPILL(4) SPILL(5)
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++) C[r * ldc + j] = accumulate ? C[r * ldc + j] + t[r][j] : t[r][j];
}

/* ---------------------------------------------------------------- small M: straight from panels
 * At most 12 rows of A (the action expert's tokens): every weight is used only M times, so the
 * weights are converted in registers and fed to the FMAs at once (no panel buffer), and A is read
 * where it lies (row r at A + r * lda). The 16 columns of a panel go in two halves of 8, so that
 * 12 rows x 2 vectors = 24 accumulators stay in registers. Per two k and half: 2 weight loads
 * (f16 / bf16: one 16-byte load of 8 values each, widened by FCVTL / FCVTL2 or SHLL / SHLL2; f32:
 * two), one 8-byte load of A per row and 4 FMAs by lane per row: 48 FMAs for mr = 12, on
 * 24 + 4 + 1 = 29 of the 32 vector registers. q8_0 / q4_0 (the no-dotprod fallback: with SDOT
 * the int8 kernels take them) are widened a 32 k block at a time into 32 x 8 floats first. */

#define SACC()                                                                                 \
    float32x4_t c0a = vdupq_n_f32(0.0f), c0b = c0a, c1a = c0a, c1b = c0a, c2a = c0a, c2b = c0a;  \
    float32x4_t c3a = c0a, c3b = c0a, c4a = c0a, c4b = c0a, c5a = c0a, c5b = c0a;                \
    float32x4_t c6a = c0a, c6b = c0a, c7a = c0a, c7b = c0a, c8a = c0a, c8b = c0a;                \
    float32x4_t c9a = c0a, c9b = c0a, c10a = c0a, c10b = c0a, c11a = c0a, c11b = c0a
/* two k: weights b0 (k) and b1 (k + 1), a..b the half's two 4-column vectors */
#define SROW2(r)                                                   \
    if (mr > r) {                                                  \
        const float32x2_t a_ = vld1_f32(ak_ + (r) * lda);          \
        c##r##a = vfmaq_lane_f32(c##r##a, b0a, a_, 0);             \
        c##r##b = vfmaq_lane_f32(c##r##b, b0b, a_, 0);             \
        c##r##a = vfmaq_lane_f32(c##r##a, b1a, a_, 1);             \
        c##r##b = vfmaq_lane_f32(c##r##b, b1b, a_, 1);             \
    }
#define SROW1(r)                                                   \
    if (mr > r) {                                                  \
        const float a_ = ak_[(r) * lda];                           \
        c##r##a = vfmaq_n_f32(c##r##a, b0a, a_);                   \
        c##r##b = vfmaq_n_f32(c##r##b, b0b, a_);                   \
    }
#define SK2(ak)                                                                                          \
    do {                                                                                                 \
        const float *ak_ = (ak);                                                                         \
        SROW2(0) SROW2(1) SROW2(2) SROW2(3) SROW2(4) SROW2(5) SROW2(6) SROW2(7) SROW2(8) SROW2(9) SROW2(10) \
        SROW2(11)                                                                                        \
    } while (0)
#define SK1(ak)                                                                                          \
    do {                                                                                                 \
        const float *ak_ = (ak);                                                                         \
        SROW1(0) SROW1(1) SROW1(2) SROW1(3) SROW1(4) SROW1(5) SROW1(6) SROW1(7) SROW1(8) SROW1(9) SROW1(10) \
        SROW1(11)                                                                                        \
    } while (0)
#define SOUT(r)                                  \
    if (mr > r) {                                \
        vst1q_f32(t[r] + 8 * h, c##r##a);        \
        vst1q_f32(t[r] + 8 * h + 4, c##r##b);    \
    }

/* the 8 weights of half h at k (16 per k in the panel), as two fp32 vectors */
static inline __attribute__((always_inline)) void load8(ma_dtype dt, const void *w, int64_t k, int h, float32x4_t *lo,
                                                         float32x4_t *hi) {
    if (dt == MA_DT_F32) {
        const float *p = (const float *)w + k * 16 + 8 * h;
        *lo = vld1q_f32(p);
        *hi = vld1q_f32(p + 4);
    } else {
        const uint16x8_t x = vld1q_u16((const uint16_t *)w + k * 16 + 8 * h);
        if (dt == MA_DT_F16) {
            *lo = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(x)));
            *hi = vcvt_high_f32_f16(vreinterpretq_f16_u16(x));
        } else { /* bf16: the upper half of an fp32 */
            *lo = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(x), 16));
            *hi = vreinterpretq_f32_u32(vshll_high_n_u16(x, 16));
        }
    }
}

/* half h of a q8_0 / q4_0 panel block (16 f16 scales, then the values; panel layout in gemm.h)
 * as out[32 k][8] fp32 */
static inline void widen_block(int q8, const uint8_t *blk, int h, float (*out)[8]) {
    const float16x8_t d = vreinterpretq_f16_u16(vld1q_u16((const uint16_t *)blk + 8 * h));
    const float32x4_t dlo = vcvt_f32_f16(vget_low_f16(d)), dhi = vcvt_high_f32_f16(d);
    const uint8_t *q = blk + 32 + 8 * h;
#define PUT(k, v8)                                                                                        \
    do {                                                                                                  \
        const int16x8_t w_ = vmovl_s8(v8);                                                                \
        vst1q_f32(out[k], vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(w_))), dlo));                    \
        vst1q_f32(out[k] + 4, vmulq_f32(vcvtq_f32_s32(vmovl_high_s16(w_)), dhi));                         \
    } while (0)
    if (q8) {
        for (int i = 0; i < 32; i++) PUT(i, vld1_s8((const int8_t *)q + 16 * i));
    } else { /* byte [j][c]: column c's k = j (low nibble) and k = j + 16 (high), each n - 8 */
        const uint8x8_t low = vdup_n_u8(0x0f);
        const int8x8_t eight = vdup_n_s8(8);
        for (int j = 0; j < 16; j++) {
            const uint8x8_t v = vld1_u8(q + 16 * j);
            PUT(j, vsub_s8(vreinterpret_s8_u8(vand_u8(v, low)), eight));
            PUT(j + 16, vsub_s8(vreinterpret_s8_u8(vshr_n_u8(v, 4)), eight));
        }
    }
#undef PUT
}

/* C[mr, nr] (+)= A x one panel, k = 0..kc (w: the panel at its first k; quantised: its first
 * block); mr a constant at every call (MA_DISPATCH_MR12) */
static inline __attribute__((always_inline)) void small_tile(int mr, ma_dtype dt, const void *w, int kc, const float *A,
                                                              int64_t lda, float *C, int64_t ldc, int nr, int accumulate) {
    float t[MA_GEMM_MR_MAX][16];
    for (int h = 0; h < 2; h++) {
        SACC();
        float32x4_t b0a, b0b, b1a, b1b;
        if (dt == MA_DT_Q8_0 || dt == MA_DT_Q4_0) {
            const size_t bs = dt == MA_DT_Q8_0 ? 544 : 288;
            const uint8_t *blk = w;
            for (int k0 = 0; k0 < kc; k0 += 32, blk += bs) {
                float wb[32][8];
                widen_block(dt == MA_DT_Q8_0, blk, h, wb);
                for (int k = 0; k < 32; k += 2) {
                    b0a = vld1q_f32(wb[k]);
                    b0b = vld1q_f32(wb[k] + 4);
                    b1a = vld1q_f32(wb[k + 1]);
                    b1b = vld1q_f32(wb[k + 1] + 4);
                    SK2(A + k0 + k);
                }
            }
        } else {
            int k = 0;
            for (; k + 2 <= kc; k += 2) {
                load8(dt, w, k, h, &b0a, &b0b);
                load8(dt, w, k + 1, h, &b1a, &b1b);
                SK2(A + k);
            }
            if (k < kc) {
                load8(dt, w, k, h, &b0a, &b0b);
                SK1(A + k);
            }
        }
        SOUT(0) SOUT(1) SOUT(2) SOUT(3) SOUT(4) SOUT(5) SOUT(6) SOUT(7) SOUT(8) SOUT(9) SOUT(10) SOUT(11)
    }
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++) C[r * ldc + j] = accumulate ? C[r * ldc + j] + t[r][j] : t[r][j];
}

static void small_panels(const ma_bmat *B, int64_t K, int64_t n0, int nr, int64_t k0, int kc, const float *A, int64_t lda,
                         int mr, float *C, int64_t ldc, int accumulate) {
    const int64_t p = n0 / MA_GEMM_NR;
    switch (B->dtype) {
    case MA_DT_F16: {
        const uint16_t *w = (const uint16_t *)B->data + (p * K + k0) * MA_GEMM_NR;
        MA_DISPATCH_MR12(small_tile, MA_DT_F16, w, kc, A, lda, C, ldc, nr, accumulate)
    } break;
    case MA_DT_BF16: {
        const uint16_t *w = (const uint16_t *)B->data + (p * K + k0) * MA_GEMM_NR;
        MA_DISPATCH_MR12(small_tile, MA_DT_BF16, w, kc, A, lda, C, ldc, nr, accumulate)
    } break;
    case MA_DT_F32: {
        const float *w = (const float *)B->data + (p * K + k0) * MA_GEMM_NR;
        MA_DISPATCH_MR12(small_tile, MA_DT_F32, w, kc, A, lda, C, ldc, nr, accumulate)
    } break;
    case MA_DT_Q8_0: {
        const uint8_t *blk = (const uint8_t *)B->data + ((size_t)p * (size_t)(K / 32) + (size_t)(k0 / 32)) * 544;
        MA_DISPATCH_MR12(small_tile, MA_DT_Q8_0, blk, kc, A, lda, C, ldc, nr, accumulate)
    } break;
    default: {
        const uint8_t *blk = (const uint8_t *)B->data + ((size_t)p * (size_t)(K / 32) + (size_t)(k0 / 32)) * 288;
        MA_DISPATCH_MR12(small_tile, MA_DT_Q4_0, blk, kc, A, lda, C, ldc, nr, accumulate)
    } break;
    }
}

/* f16 / bf16 context panels into the fp32 panel buffer of the large-M path, 8 values per load */
static void load_panels_half(const ma_bmat *B, int64_t K, int64_t n0, int nr, int64_t k0, int kc, float *P) {
    (void)nr;
    const uint16_t *s = (const uint16_t *)B->data + (n0 / MA_GEMM_NR) * K * MA_GEMM_NR + k0 * MA_GEMM_NR;
    const int64_t n = (int64_t)kc * MA_GEMM_NR;
    if (B->dtype == MA_DT_F16)
        for (int64_t i = 0; i < n; i += 8) {
            const float16x8_t x = vreinterpretq_f16_u16(vld1q_u16(s + i));
            vst1q_f32(P + i, vcvt_f32_f16(vget_low_f16(x)));
            vst1q_f32(P + i + 4, vcvt_high_f32_f16(x));
        }
    else
        for (int64_t i = 0; i < n; i += 8) {
            const uint16x8_t x = vld1q_u16(s + i);
            vst1q_f32(P + i, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(x), 16)));
            vst1q_f32(P + i + 4, vreinterpretq_f32_u32(vshll_high_n_u16(x, 16)));
        }
}

void ma_gemm_install_neon(ma_gemm_kernels_t *k) {
    k->name = "neon";
    k->mr = NMR;
    k->small_mr = MA_GEMM_MR_MAX;
    k->ukernel = ukernel_neon;
    k->small_panels = small_panels;
    k->load[MA_B_PANELS][MA_DT_F16] = load_panels_half;
    k->load[MA_B_PANELS][MA_DT_BF16] = load_panels_half;
}
