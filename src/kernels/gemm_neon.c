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

void ma_gemm_install_neon(ma_gemm_kernels_t *k) {
    k->name = "neon";
    k->mr = NMR;
    k->ukernel = ukernel_neon;
}
