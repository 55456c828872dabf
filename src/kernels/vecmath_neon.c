/* SPDX-License-Identifier: Apache-2.0 */
/* NEON elementwise math (aarch64, Advanced SIMD is always there): vecmath_simd.h on 4 floats.
 * The same polynomial as the AVX2 / AVX-512 sets, so the same results per lane; the row sums
 * in double keep the portable set's eight partial sums lane for lane (the same bits). */
#include <arm_neon.h>
#include <math.h>

#include "kernels/vecmath.h"

#define VW 4
#define VF float32x4_t
#define V_LOAD vld1q_f32
#define V_STORE vst1q_f32
#define V_SET1 vdupq_n_f32
#define V_ZERO() vdupq_n_f32(0.0f)
#define V_ADD vaddq_f32
#define V_MUL vmulq_f32
#define V_DIV vdivq_f32
#define V_MAX vmaxq_f32
#define V_MIN vminq_f32
/* a * b + c, a * b - c, -(a * b) + c: fused, as _mm256_fmadd_ps / fmsub / fnmadd */
#define V_FMADD(a, b, c) vfmaq_f32((c), (a), (b))
#define V_FMSUB(a, b, c) vfmaq_f32(vnegq_f32(c), (a), (b))
#define V_FNMADD(a, b, c) vfmsq_f32((c), (a), (b))
#define V_ROUND(x) vrndnq_f32(x) /* to nearest, ties to even: as _MM_FROUND_TO_NEAREST_INT */
/* 2^(n-1) for integral n */
#define V_POW2M1(n) vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(126)), 23))
#define V_ZERO_BELOW(p, x, lo) vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(p), vcltq_f32((x), (lo))))
#define INSTALL ma_vecmath_install_neon

/* the x86 sets' horizontal order for 4 lanes: (0 + 2) + (1 + 3) */
static inline float V_HSUM(float32x4_t v) {
    const float32x2_t s = vadd_f32(vget_low_f32(v), vget_high_f32(v));
    return vget_lane_f32(s, 0) + vget_lane_f32(s, 1);
}

static inline float V_HMAX(float32x4_t m) { return vmaxvq_f32(m); }

/* eight doubles as four vectors (lanes 0-1, 2-3, 4-5, 6-7) */
typedef struct {
    float64x2_t v[4];
} D8;
static inline D8 D8_ZERO(void) {
    D8 r;
    for (int i = 0; i < 4; i++) r.v[i] = vdupq_n_f64(0.0);
    return r;
}
static inline D8 D8_SET1(double x) {
    D8 r;
    for (int i = 0; i < 4; i++) r.v[i] = vdupq_n_f64(x);
    return r;
}
static inline D8 D8_ADD(D8 a, D8 b) {
    for (int i = 0; i < 4; i++) a.v[i] = vaddq_f64(a.v[i], b.v[i]);
    return a;
}
static inline D8 D8_SUB(D8 a, D8 b) {
    for (int i = 0; i < 4; i++) a.v[i] = vsubq_f64(a.v[i], b.v[i]);
    return a;
}
static inline D8 D8_MUL(D8 a, D8 b) {
    for (int i = 0; i < 4; i++) a.v[i] = vmulq_f64(a.v[i], b.v[i]);
    return a;
}
static inline D8 D8_FROM_F32(const float *p) {
    const float32x4_t lo = vld1q_f32(p), hi = vld1q_f32(p + 4);
    D8 r = {{vcvt_f64_f32(vget_low_f32(lo)), vcvt_high_f64_f32(lo), vcvt_f64_f32(vget_low_f32(hi)), vcvt_high_f64_f32(hi)}};
    return r;
}
static inline void D8_STORE(double *p, D8 v) {
    for (int i = 0; i < 4; i++) vst1q_f64(p + 2 * i, v.v[i]);
}

#include "kernels/vecmath_simd.h"
