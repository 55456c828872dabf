/* SPDX-License-Identifier: Apache-2.0 */
/* norm_stats.json (format "molmoact2_norm_stats.v1"): per-tag action/state statistics and the
 * robot metadata. Normalisation follows upstream _FeatureNormalizer in fp32:
 *   q01_q99: s_n = clip(2 (s - q01) / max(q99 - q01, 1e-6) - 1, -1, 1); a = (clip(x) + 1) (q99 - q01) / 2 + q01
 *   min_max, q10_q90 alike; mean_std: (s - mean) / max(std, 1e-6), a = x std + mean; none: identity.
 * Where mask is false a dimension passes through (clipped on the way out); where min == max the
 * normalised state is 0.
 *
 * With arithmetic "lerobot", action_stats and state_stats may each carry their own "norm_mode"
 * and "eps" (LeRobot's normalization_mapping gives every feature type its own mode); the file's
 * norm_mode and eps are the defaults. Statistics whose range overflows float32 (q99 - q01, or
 * the de-normalised action at the ends of [-1, 1]) are refused at load, naming the file and key;
 * ma_unnormalize fails when any de-normalised value is not finite, so no non-finite action is
 * ever returned. */
#ifndef MA_NORMSTATS_H
#define MA_NORMSTATS_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

#define MA_NORM_MAX_DIM 64

typedef enum { MA_NORM_NONE, MA_NORM_MEAN_STD, MA_NORM_MIN_MAX, MA_NORM_Q01_Q99, MA_NORM_Q10_Q90 } ma_norm_mode;

typedef struct ma_normalizer {
    ma_norm_mode mode; /* this feature's mode (the file's norm_mode unless the stats name their own) */
    float eps;         /* LeRobot's eps for this feature (the file's unless the stats name their own) */
    int dim;
    int has_mean, has_std, has_min, has_max, has_low, has_high, has_mask;
    float mean[MA_NORM_MAX_DIM], std[MA_NORM_MAX_DIM], min[MA_NORM_MAX_DIM], max[MA_NORM_MAX_DIM];
    float low[MA_NORM_MAX_DIM], high[MA_NORM_MAX_DIM];
    uint8_t mask[MA_NORM_MAX_DIM]; /* 1 = normalise */
} ma_normalizer;

typedef struct ma_normstats {
    ma_norm_mode mode;
    /* LeRobot's arithmetic (its MolmoAct2 pipelines) instead of the HF model's: eps only for an
     * exactly zero range (MEAN_STD: added to std), no clip in the normaliser but a clamp of the
     * normalised dimensions to [-1, 1] after it, no "min == max -> 0" rule, a pass-through
     * dimension outside [-1, 1] refused, and every action dimension clamped before unnormalising */
    int lerobot;
    float eps;
    ma_normalizer action, state;
    int has_state;
    int action_horizon, n_action_steps; /* 0 when absent */
    int action_dim;                     /* the tag's declared (padded) action dim, 0 when absent; <= the config's max_action_dim */
    char setup_type[512], control_mode[512];
} ma_normstats;

ma_status ma_normstats_parse(const char *json, const char *label, const char *tag, ma_normstats *ns, ma_error *err);
/* the checks ma_normstats_parse makes of one feature's statistics (a norm_stats-style object:
 * mean, std, min, max, q01/q99 or q10/q90, mask), with messages "<where>: <prefix><key>[i] ...":
 * lets a caller that assembles the statistics from other files name those files. mode as in
 * norm_stats.json ("q01_q99", ...); action: the statistics de-normalise actions */
struct cJSON;
ma_status ma_normstats_check_feature(const struct cJSON *stats, const char *mode, double eps, int lerobot, int action, const char *where,
                                     const char *prefix, ma_error *err);
ma_status ma_normstats_load(const char *path, const char *tag, ma_normstats *ns, ma_error *err);
/* the tags of a norm_stats.json, comma-separated into out ("" when unreadable) */
void ma_normstats_tags(const char *path, char *out, size_t cap);
void ma_normalize(const ma_normstats *ns, const ma_normalizer *n, const float *x, float *y);
/* LeRobot refuses a pass-through (masked-out) state value outside [-1, 1]; MA_OK otherwise */
ma_status ma_normstats_check_state(const ma_normstats *ns, const float *x, int dim, ma_error *err);
/* de-normalise one action row; fails (MA_ERR_RANGE, naming the dimension) when any value of y is
 * not finite: a robot never receives inf or NaN. y is written either way. */
ma_status ma_unnormalize(const ma_normstats *ns, const ma_normalizer *n, const float *x, float *y, ma_error *err);

#endif
