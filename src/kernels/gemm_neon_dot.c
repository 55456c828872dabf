/* SPDX-License-Identifier: Apache-2.0 */
/* its hand layout: clang-format 14 folds statement macros (DECL(0) DECL(1) ..., X-lists) into one
 * line with the code after them */
/* clang-format off */
/* Integer dot products for q8_0 / q4_0 panels on aarch64 with the dot-product instructions
 * (ARMv8.2 SDOT, HWCAP asimddp: the Cortex-A78AE, not the A72; compiled with
 * -march=armv8.2-a+dotprod and used only where the CPU reports them).
 *
 * As gemm_vnni.c: A is quantised to int8 per row and block of 32 k (a = d_a q_a, d_a =
 * max|a| / 127, rounded to nearest even: the same numbers as the x86 int8 kernels), each block's
 * sum is exact in int32 and is scaled by d_w d_a into fp32. SDOT multiplies signed by signed, so
 * no offset correction is needed (q4_0's nibbles are taken as n - 8).
 *
 * A panel block holds 32 k x 16 columns k-major; SDOT wants each column's four k in one 32-bit
 * lane, so every four k rows are transposed with two rounds of ZIP (8-bit, then 16-bit) into
 * four vectors of four columns. Per block and row: 8 k-groups x 4 SDOT (by element: the row's
 * four int8 of the group from a vector lane), 32 SDOT for 512 multiply-adds. */
#include <arm_neon.h>
#include <string.h>

#include "kernels/gemm_impl.h"

#define NR MA_GEMM_NR
#define MR 12

/* the same block layout as gemm_vnni.c's (the driver sizes buffers by MA_GEMM_QA_BLOCK) */
typedef struct qa_block {
    int8_t q[MR][32];
    float d[MR];
    int32_t unused[2][MR];
} qa_block;

_Static_assert(sizeof(qa_block) == MA_GEMM_QA_BLOCK, "qa block size");

static void qa_pack(const float *A, int64_t lda, int64_t m0, int64_t m1, int64_t k0, int kc, void *out) {
    qa_block *blk = out;
    for (int b = 0; b < kc / 32; b++, blk++) {
        memset(blk->unused, 0, sizeof blk->unused);
        for (int r = 0; r < MR; r++) {
            if (m0 + r >= m1) {
                memset(blk->q[r], 0, 32);
                blk->d[r] = 0.0f;
                continue;
            }
            const float *a = A + (m0 + r) * lda + k0 + b * 32;
            float32x4_t x[8];
            float32x4_t mx = vdupq_n_f32(0.0f);
            for (int i = 0; i < 8; i++) {
                x[i] = vld1q_f32(a + 4 * i);
                mx = vmaxq_f32(mx, vabsq_f32(x[i]));
            }
            const float amax = vmaxvq_f32(mx);
            const float32x4_t inv = vdupq_n_f32(amax > 0.0f ? 127.0f / amax : 0.0f);
            for (int i = 0; i < 8; i += 2) {
                /* round to nearest even, as nearbyintf; |q| <= 127 */
                const int32x4_t q0 = vcvtnq_s32_f32(vmulq_f32(x[i], inv)), q1 = vcvtnq_s32_f32(vmulq_f32(x[i + 1], inv));
                const int16x8_t h = vcombine_s16(vqmovn_s32(q0), vqmovn_s32(q1));
                vst1_s8(blk->q[r] + 4 * i, vqmovn_s16(h));
            }
            blk->d[r] = amax / 127.0f;
        }
    }
}

/* four k rows of 16 columns (r0..r3) -> four vectors of four columns x four k */
static inline void k4_transpose(int8x16_t r0, int8x16_t r1, int8x16_t r2, int8x16_t r3, int8x16_t w[4]) {
    const int8x16_t t0 = vzip1q_s8(r0, r1), t1 = vzip2q_s8(r0, r1), u0 = vzip1q_s8(r2, r3), u1 = vzip2q_s8(r2, r3);
    w[0] = vreinterpretq_s8_s16(vzip1q_s16(vreinterpretq_s16_s8(t0), vreinterpretq_s16_s8(u0)));
    w[1] = vreinterpretq_s8_s16(vzip2q_s16(vreinterpretq_s16_s8(t0), vreinterpretq_s16_s8(u0)));
    w[2] = vreinterpretq_s8_s16(vzip1q_s16(vreinterpretq_s16_s8(t1), vreinterpretq_s16_s8(u1)));
    w[3] = vreinterpretq_s8_s16(vzip2q_s16(vreinterpretq_s16_s8(t1), vreinterpretq_s16_s8(u1)));
}

/* the 32 x 16 int8 weights of one block as w[group][4], then every row's dot products */
static inline void block_dots(const int8x16_t (*w)[4], const float *dw16, const qa_block *qa, int mr, float (*acc)[NR]) {
    const float32x4_t dw[4] = {vld1q_f32(dw16), vld1q_f32(dw16 + 4), vld1q_f32(dw16 + 8), vld1q_f32(dw16 + 12)};
    for (int r = 0; r < mr; r++) {
        const int8x16_t a0 = vld1q_s8(qa->q[r]), a1 = vld1q_s8(qa->q[r] + 16);
        int32x4_t s0 = vdupq_n_s32(0), s1 = s0, s2 = s0, s3 = s0;
#define GROUP(g, av, lane)                                \
        s0 = vdotq_laneq_s32(s0, w[g][0], av, lane);       \
        s1 = vdotq_laneq_s32(s1, w[g][1], av, lane);       \
        s2 = vdotq_laneq_s32(s2, w[g][2], av, lane);       \
        s3 = vdotq_laneq_s32(s3, w[g][3], av, lane);
        GROUP(0, a0, 0) GROUP(1, a0, 1) GROUP(2, a0, 2) GROUP(3, a0, 3)
        GROUP(4, a1, 0) GROUP(5, a1, 1) GROUP(6, a1, 2) GROUP(7, a1, 3)
#undef GROUP
        const float32x4_t da = vdupq_n_f32(qa->d[r]);
        float *c = acc[r];
        vst1q_f32(c, vfmaq_f32(vld1q_f32(c), vcvtq_f32_s32(s0), vmulq_f32(dw[0], da)));
        vst1q_f32(c + 4, vfmaq_f32(vld1q_f32(c + 4), vcvtq_f32_s32(s1), vmulq_f32(dw[1], da)));
        vst1q_f32(c + 8, vfmaq_f32(vld1q_f32(c + 8), vcvtq_f32_s32(s2), vmulq_f32(dw[2], da)));
        vst1q_f32(c + 12, vfmaq_f32(vld1q_f32(c + 12), vcvtq_f32_s32(s3), vmulq_f32(dw[3], da)));
    }
}

static inline void scales16(const uint8_t *blk, float *dw) {
    const float16x8_t h0 = vreinterpretq_f16_u8(vld1q_u8(blk)), h1 = vreinterpretq_f16_u8(vld1q_u8(blk + 16));
    vst1q_f32(dw, vcvt_f32_f16(vget_low_f16(h0)));
    vst1q_f32(dw + 4, vcvt_high_f32_f16(h0));
    vst1q_f32(dw + 8, vcvt_f32_f16(vget_low_f16(h1)));
    vst1q_f32(dw + 12, vcvt_high_f32_f16(h1));
}

static void q_panels(const ma_bmat *B, int64_t K, int64_t n0, int nr, int64_t k0, int kc, const void *qa_, int mr,
                     float *C, int64_t ldc, int accumulate) {
    const int64_t p = n0 / NR;
    const int nb = kc / 32;
    const qa_block *qa = qa_;
    const int q8 = B->dtype == MA_DT_Q8_0;
    const size_t bs = q8 ? 544 : 288;
    const uint8_t *blk = (const uint8_t *)B->data + ((size_t)p * (size_t)(K / 32) + (size_t)(k0 / 32)) * bs;
    float acc[MR][NR];
    memset(acc, 0, sizeof acc);
    for (int b = 0; b < nb; b++, blk += bs, qa++) {
        __builtin_prefetch(blk + 4 * bs);
        float dw[NR];
        scales16(blk, dw);
        int8x16_t w[8][4];
        const uint8_t *q = blk + 32;
        if (q8) {
            for (int g = 0; g < 8; g++)
                k4_transpose(vld1q_s8((const int8_t *)q + 64 * g), vld1q_s8((const int8_t *)q + 64 * g + 16),
                             vld1q_s8((const int8_t *)q + 64 * g + 32), vld1q_s8((const int8_t *)q + 64 * g + 48), w[g]);
        } else { /* byte [j][c]: column c's k = j (low nibble) and k = j + 16 (high), each n - 8 */
            const uint8x16_t low = vdupq_n_u8(0x0f);
            const int8x16_t eight = vdupq_n_s8(8);
            for (int g = 0; g < 4; g++) {
                const uint8x16_t v0 = vld1q_u8(q + 64 * g), v1 = vld1q_u8(q + 64 * g + 16), v2 = vld1q_u8(q + 64 * g + 32),
                                 v3 = vld1q_u8(q + 64 * g + 48);
#define LO(v) vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, low)), eight)
#define HI(v) vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), eight)
                k4_transpose(LO(v0), LO(v1), LO(v2), LO(v3), w[g]);
                k4_transpose(HI(v0), HI(v1), HI(v2), HI(v3), w[g + 4]);
#undef LO
#undef HI
            }
        }
        block_dots((const int8x16_t(*)[4])w, dw, qa, mr, acc);
    }
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++) C[r * ldc + j] = accumulate ? C[r * ldc + j] + acc[r][j] : acc[r][j];
}

void ma_gemm_install_neon_dot(ma_gemm_kernels_t *k) {
    k->name = "neon_dot";
    k->qa_pack = qa_pack;
    k->q_panels = q_panels;
}
