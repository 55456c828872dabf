/* SPDX-License-Identifier: Apache-2.0 */
/* Real-time chunking, LeRobot's "guided" mode (rtc.h). Each float operation is a statement of its
 * own so that no compiler contracts two into a fused multiply-add: LeRobot's tensors round after
 * every operation, and so do we. */
#include "runtime/rtc.h"

#include <math.h>
#include <string.h>

ma_status ma_rtc_check(const ma_rtc *r, int rows_max, int action_dim, int max_action_dim, const char *pfx, ma_error *err) {
    if (!r->prefix) {
        if (r->rows || r->dim)
            return ma_fail(err, MA_ERR_ARG, "%sprefix is NULL but %sprefix_rows/_dim are %d/%d", pfx, pfx, r->rows, r->dim);
        return MA_OK;
    }
    if (r->rows < 1 || r->rows > rows_max)
        return ma_fail(err, MA_ERR_SHAPE, "%sprefix_rows is %d: 1..%d (the chunk's rows)", pfx, r->rows, rows_max);
    if (r->dim != action_dim && r->dim != max_action_dim)
        return ma_fail(err, MA_ERR_SHAPE, "%sprefix_dim is %d: the action dim %d or max_action_dim %d", pfx, r->dim, action_dim,
                       max_action_dim);
    for (long i = 0; i < (long)r->rows * r->dim; i++)
        if (!isfinite(r->prefix[i]))
            return ma_fail(err, MA_ERR_RANGE, "%sprefix[%ld] (row %ld, column %ld) is not finite", pfx, i, i / r->dim, i % r->dim);
    if (r->delay < 0) return ma_fail(err, MA_ERR_RANGE, "%sdelay is %d: >= 0", pfx, r->delay);
    if (r->horizon < 0) return ma_fail(err, MA_ERR_RANGE, "%shorizon is %d: >= 0 (0: %d)", pfx, r->horizon, MA_RTC_DEFAULT_HORIZON);
    if (!isfinite(r->beta) || r->beta < 0.0f)
        return ma_fail(err, MA_ERR_RANGE, "%sbeta is %g: finite and > 0 (0: %g)", pfx, (double)r->beta, (double)MA_RTC_DEFAULT_BETA);
    if (r->schedule < 0 || r->schedule >= MA_RTC_N_SCHEDULES)
        return ma_fail(err, MA_ERR_RANGE, "%sschedule is %d: 0 linear, 1 exp, 2 ones, 3 zeros", pfx, r->schedule);
    return MA_OK;
}

/* torch.linspace(1, 0, n)[i] in float32 as torch's CPU kernel computes it on its scalar path: the
 * first half start + step * i, the second end - step * (n - 1 - i), each rounded once (torch's
 * AVX2/AVX512 kernels are built with FMA, and the compiler fuses them: measured with Debian's
 * torch 1.13, tests/fixtures/lerobot_rtc). For n >= 16 torch takes a vectorised path that
 * rounds differently; MolmoAct2's 10-row chunks never reach it (n <= 12). */
static float linspace_1_0(int n, int i) {
    const float step = (0.0f - 1.0f) / (float)(n - 1);
    if (i < n / 2) return fmaf(step, (float)i, 1.0f);
    return fmaf(-step, (float)(n - 1 - i), 0.0f);
}

void ma_rtc_prefix_weights(int schedule, int start, int end, int total, float *w) {
    if (start > end) start = end; /* modeling_rtc.py:257 */
    for (int i = 0; i < total; i++) w[i] = 0.0f;
    if (schedule == MA_RTC_ZEROS) { /* ones before the delay (:259-261) */
        for (int i = 0; i < start && i < total; i++) w[i] = 1.0f;
        return;
    }
    if (schedule == MA_RTC_ONES) { /* ones up to the horizon (:262-264) */
        for (int i = 0; i < end && i < total; i++) w[i] = 1.0f;
        return;
    }
    /* LINEAR, EXP (:265-303): [ones(min(start, total))] + ramp + [zeros(total - end)], the ramp
     * linspace(1, 0, L + 2) without its ends, L = total - max(total - end, 0) - start */
    const int ones = start < total ? start : total;
    const int ramp = total - (total - end > 0 ? total - end : 0) - start;
    for (int i = 0; i < ones; i++) w[i] = 1.0f;
    if (end <= start || ramp <= 0) return;
    const float e1 = (float)(2.718281828459045 - 1.0); /* math.e - 1, rounded to float32 by .div */
    for (int i = 0; i < ramp && ones + i < total; i++) {
        float l = linspace_1_0(ramp + 2, i + 1);
        if (schedule == MA_RTC_EXP) {                 /* l * (expm1(l) / (e - 1)) (:271) */
            const float em = (float)expm1((double)l); /* torch's float expm1 is correctly rounded here; glibc's expm1f is not always */
            const float q = em / e1;
            l = l * q;
        }
        w[ones + i] = l;
    }
}

/* torch.nan_to_num(x, posinf=beta): NaN -> 0, +inf -> beta, -inf -> the lowest float */
static float nan_to_num(float x, float beta) {
    if (isnan(x)) return 0.0f;
    if (isinf(x)) return x > 0 ? beta : -3.402823466e+38f;
    return x;
}

float ma_rtc_guidance_weight(float tau, float beta) {
    const float omt = 1.0f - tau;
    const float omt2 = omt * omt;
    const float tau2 = tau * tau;
    const float num = omt2 + tau2;
    const float inv_r2 = num / omt2;
    const float c = nan_to_num(omt / tau, beta);
    const float prod = c * inv_r2;
    const float gw = nan_to_num(prod, beta);
    return gw < beta ? gw : beta; /* torch.minimum (no NaN can reach it) */
}

void ma_rtc_layout(const ma_rtc *r, int T, int Da, int offset, float *prev, float *w) {
    memset(prev, 0, sizeof(float) * (size_t)T * (size_t)Da);
    for (int t = 0; t < T; t++) w[t] = 0.0f;
    if (!r->prefix) return;
    int h = r->horizon > 0 ? r->horizon : MA_RTC_DEFAULT_HORIZON;
    if (h > r->rows) h = r->rows; /* modeling_rtc.py:192-195 */
    for (int i = 0; i < r->rows && offset + i < T; i++)
        memcpy(prev + (size_t)(offset + i) * Da, r->prefix + (size_t)i * r->dim, sizeof(float) * (size_t)(r->dim < Da ? r->dim : Da));
    if (offset < T) ma_rtc_prefix_weights(r->schedule, r->delay, h, T - offset, w + offset);
}

void ma_rtc_guide(int T, int Da, const float *x, const float *prev, const float *w, float tau, float beta, float *v) {
    const float time = (float)(1.0 - (double)tau); /* the processor's time 1 - tau, a float32 scalar in its product */
    const float gw = ma_rtc_guidance_weight(tau, beta);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < Da; j++) {
            const size_t k = (size_t)t * Da + j;
            const float tv = time * v[k];
            const float x1 = x[k] + tv; /* the predicted clean chunk */
            const float diff = prev[k] - x1;
            const float e = diff * w[t]; /* the weighted error: LeRobot's correction (:221-224) */
            const float g = gw * e;
            v[k] = v[k] + g;
        }
}
