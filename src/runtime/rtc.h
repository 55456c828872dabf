/* SPDX-License-Identifier: Apache-2.0 */
/* Real-time chunking (RTC), "guided" mode, as LeRobot guides MolmoAct2's flow matching
 * (huggingface/lerobot 7427f31801f944f5ec9ce53cda02862ce7d1638b: policies/rtc/modeling_rtc.py
 * :122-303 and policies/molmoact2/modeling_molmoact2.py:1875-1891), in float32 and in LeRobot's
 * order of operations, so that it agrees with LeRobot's (and reference/molmoact_ref/rtc.py's)
 * results bit for bit.
 *
 * In MolmoAct2's frame (flow time tau: 0 = noise -> 1 = data; v the action expert's velocity),
 * one Euler step's guided velocity is v + gw(tau) * W * (prev - (x + (1 - tau) * v)): prev is the
 * previous chunk's leftover right-padded with zeros, W the prefix weights per row, gw the guidance
 * weight capped at beta. The leftover's row 0 lies on trajectory row `offset` (the pipeline's
 * n_obs_steps - 1, the first row it returns; LeRobot's row 0 when n_obs_steps is 1), and the
 * weights are those of a chunk of T - offset rows from there (0 before it). */
#ifndef MA_RTC_H
#define MA_RTC_H

#include "core/error.h"

/* LeRobot's RTCAttentionSchedule (configs/types.py:48-52), numbered as molmoact.h's MOLMOACT_RTC_* */
enum { MA_RTC_LINEAR = 0, MA_RTC_EXP = 1, MA_RTC_ONES = 2, MA_RTC_ZEROS = 3, MA_RTC_N_SCHEDULES = 4 };
#define MA_RTC_DEFAULT_HORIZON 10 /* configuration_rtc.py:48 */
#define MA_RTC_DEFAULT_BETA 10.0f /* configuration_rtc.py:47 */

typedef struct ma_rtc {
    const float *prefix; /* [rows, dim] normalised leftover; NULL: no guidance */
    int rows, dim;
    int delay;    /* d >= 0 */
    int horizon;  /* H; 0: 10; clipped to rows */
    float beta;   /* > 0; 0: 10 */
    int schedule; /* MA_RTC_* */
} ma_rtc;

/* the fields of r for a trajectory of rows_max rows from the offset (horizon - offset) and
 * action dims action_dim of max_action_dim: rows 1..rows_max, dim action_dim or max_action_dim,
 * finite values, delay >= 0, horizon >= 0, beta finite and > 0 (or 0), a known schedule. Errors
 * name the field as `pfx` + "prefix_rows" etc. (pfx "observation.rtc_" for the API). */
ma_status ma_rtc_check(const ma_rtc *r, int rows_max, int action_dim, int max_action_dim, const char *pfx, ma_error *err);

/* get_prefix_weights(start, end, total) (modeling_rtc.py:256-303) into w[total] */
void ma_rtc_prefix_weights(int schedule, int start, int end, int total, float *w);

/* the guidance weight at flow time tau, capped at beta (modeling_rtc.py:226-232): beta at tau 0,
 * 0 at tau 1 */
float ma_rtc_guidance_weight(float tau, float beta);

/* r's leftover zero-padded into prev[T * Da] with its row 0 on row `offset`, and the weights
 * w[T] (0 before the offset); r checked (ma_rtc_check) */
void ma_rtc_layout(const ma_rtc *r, int T, int Da, int offset, float *prev, float *w);

/* one Euler step: v[T * Da] (the masked velocity at x, flow time tau) becomes the guided velocity */
void ma_rtc_guide(int T, int Da, const float *x, const float *prev, const float *w, float tau, float beta, float *v);

#endif
