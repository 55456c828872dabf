/* SPDX-License-Identifier: Apache-2.0 */
/* clang-format off */
/* The f16 compute plan (MA_COMPUTE_F16, gemm.h) on aarch64 CPUs with FP16 arithmetic (asimdhp:
 * Cortex-A55/A75 and later, the IQ-9075's Cortex-A78AE): FMLA on eight halves, twice the lanes
 * of an fp32 FMLA, for products of more than 12 rows on f16 context panels.
 *
 * Its arithmetic, which the scalar twin in tests/kernels/test_gemm.c repeats bit for bit:
 *  - each row of A, per K chunk, is multiplied by the power of two that brings its largest |a|
 *    into [8, 16) (exact), then rounded to f16 (to nearest, even); its inverse scales the row's
 *    sums back at the end (exact);
 *  - for each output, the products of MA_GEMM_F16_KB consecutive k are summed in f16, each step
 *    one fused multiply-add rounded to f16; each such block sum is added to an fp32 sum;
 *  - C = (accumulate ? C : 0) + inverse scale x the fp32 sum (a multiply, then an add).
 * The row scale keeps the f16 block sums below 16 x MA_GEMM_F16_WMAX x 32 = 32768, half f16's
 * largest value (65504), for weights up to MA_GEMM_F16_WMAX (64) in magnitude (compile keeps fp32
 * compute for a matrix with larger ones); the block length bounds how far f16's rounding (11
 * significant bits) accumulates.
 *
 * The tile: 8 rows x 8 columns (half a panel) at a time: 8 f16 accumulators (one per row), 16
 * fp32 ones, one vector of B (8 halves of a panel row) and one of A (the 8 rows' halves at this
 * k) per k step: 8 FMLA by lane per two 16-byte loads. A is packed as [kc][8] halves per tile of
 * 8 rows. Speed unmeasured: no board with such a core has been at hand (docs/PERFORMANCE.md). */
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "kernels/gemm_impl.h"

#define TR MA_GEMM_F16_TR
#define KB MA_GEMM_F16_KB

static void pack_a_f16(const float *A, int64_t lda, int64_t m0, int64_t m1, int64_t k0, int kc, uint16_t *out, float *inv) {
    const int64_t rows = (m1 - m0 + TR - 1) / TR * TR;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t m = m0 + r;
        uint16_t *t = out + (r / TR) * (int64_t)kc * TR + r % TR;
        if (m >= m1) {
            for (int k = 0; k < kc; k++) t[(int64_t)k * TR] = 0;
            inv[r] = 0.0f;
            continue;
        }
        const float *a = A + m * lda + k0;
        float amax = 0.0f;
        for (int k = 0; k < kc; k++) {
            const float v = fabsf(a[k]);
            amax = v > amax ? v : amax; /* a NaN never wins (the row's NaN reaches its outputs anyway) */
        }
        float scale = 1.0f;
        inv[r] = 1.0f;
        int e = 0;
        if (amax > 0.0f && isfinite(amax)) frexpf(amax, &e); /* amax = f 2^e, f in [0.5, 1) */
        /* times 2^(4 - e) it is in [8, 16); a row below 2^-100 stays unscaled (its f16 values are
         * 0, as its products are in fp32 to within 1e-30), so the scale is a finite float */
        if (e != 0 && e >= -100) {
            scale = ldexpf(1.0f, 4 - e);
            inv[r] = ldexpf(1.0f, e - 4);
        }
        int k = 0;
        for (; k + 4 <= kc; k += 4) {
            const float16x4_t h = vcvt_f16_f32(vmulq_n_f32(vld1q_f32(a + k), scale));
            uint16_t hb[4];
            vst1_u16(hb, vreinterpret_u16_f16(h));
            for (int i = 0; i < 4; i++) t[(int64_t)(k + i) * TR] = hb[i];
        }
        for (; k < kc; k++) {
            const float16x4_t h = vcvt_f16_f32(vdupq_n_f32(a[k] * scale));
            t[(int64_t)k * TR] = vget_lane_u16(vreinterpret_u16_f16(h), 0);
        }
    }
}

#define ROWFMA(r) h##r = vfmaq_laneq_f16(h##r, b, a, r);
#define FLUSH(r)                                                   \
    c##r##a = vaddq_f32(c##r##a, vcvt_f32_f16(vget_low_f16(h##r))); \
    c##r##b = vaddq_f32(c##r##b, vcvt_high_f32_f16(h##r));          \
    h##r = zero;

/* C[mr <= 8, nr <= 8] (+)= A x P for columns c0..c0 + nr of a panel [kc][16] */
static void tile_half(int kc, const uint16_t *A, const float *inv, const uint16_t *P, int c0, float *C, int64_t ldc, int mr, int nr,
                      int accumulate) {
    const float16x8_t zero = vdupq_n_f16(0);
    float16x8_t h0 = zero, h1 = zero, h2 = zero, h3 = zero, h4 = zero, h5 = zero, h6 = zero, h7 = zero;
    const float32x4_t z = vdupq_n_f32(0.0f);
    float32x4_t c0a = z, c0b = z, c1a = z, c1b = z, c2a = z, c2b = z, c3a = z, c3b = z;
    float32x4_t c4a = z, c4b = z, c5a = z, c5b = z, c6a = z, c6b = z, c7a = z, c7b = z;
    for (int k0 = 0; k0 < kc; k0 += KB) {
        const int k1 = kc - k0 < KB ? kc : k0 + KB;
        for (int k = k0; k < k1; k++) {
            const float16x8_t b = vreinterpretq_f16_u16(vld1q_u16(P + (int64_t)k * MA_GEMM_NR + c0));
            const float16x8_t a = vreinterpretq_f16_u16(vld1q_u16(A + (int64_t)k * TR));
            ROWFMA(0) ROWFMA(1) ROWFMA(2) ROWFMA(3) ROWFMA(4) ROWFMA(5) ROWFMA(6) ROWFMA(7)
        }
        FLUSH(0) FLUSH(1) FLUSH(2) FLUSH(3) FLUSH(4) FLUSH(5) FLUSH(6) FLUSH(7)
    }
    float t[TR][8];
    vst1q_f32(t[0], c0a); vst1q_f32(t[0] + 4, c0b); vst1q_f32(t[1], c1a); vst1q_f32(t[1] + 4, c1b);
    vst1q_f32(t[2], c2a); vst1q_f32(t[2] + 4, c2b); vst1q_f32(t[3], c3a); vst1q_f32(t[3] + 4, c3b);
    vst1q_f32(t[4], c4a); vst1q_f32(t[4] + 4, c4b); vst1q_f32(t[5], c5a); vst1q_f32(t[5] + 4, c5b);
    vst1q_f32(t[6], c6a); vst1q_f32(t[6] + 4, c6b); vst1q_f32(t[7], c7a); vst1q_f32(t[7] + 4, c7b);
    for (int r = 0; r < mr; r++) {
        float *cr = C + r * ldc + c0;
        for (int j = 0; j < nr; j++) {
            const float v = inv[r] * t[r][j];
            cr[j] = accumulate ? cr[j] + v : v;
        }
    }
}

static void tile_f16(int kc, const uint16_t *A, const float *inv, const uint16_t *P, float *C, int64_t ldc, int mr, int nr, int accumulate) {
    tile_half(kc, A, inv, P, 0, C, ldc, mr, nr < 8 ? nr : 8, accumulate);
    if (nr > 8) tile_half(kc, A, inv, P, 8, C, ldc, mr, nr - 8, accumulate);
}

void ma_gemm_install_neon_fp16(ma_gemm_kernels_t *k) {
    k->f16_pack_a = pack_a_f16;
    k->f16_tile = tile_f16;
}
