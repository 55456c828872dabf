/* SPDX-License-Identifier: Apache-2.0 */
#include "model/normstats.h"
#include "io/jsonline.h"

#include <cjson/cJSON.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/mapfile.h"

static const cJSON *get(const cJSON *o, const char *k) { return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL; }
static int absent(const cJSON *j) { return !j || cJSON_IsNull(j); }

/* text from a file in a message, at most 64 bytes shown */
static const char *esc(const char *s, char *buf, size_t cap) { return ma_escape_text(s, 64, buf, cap); }

static int mode_of(const char *m, ma_norm_mode *out) {
    static const char *const NAMES[] = {"none", "mean_std", "min_max", "q01_q99", "q10_q90"};
    for (int i = 0; i < 5; i++)
        if (!strcmp(m, NAMES[i])) {
            *out = (ma_norm_mode)i;
            return 1;
        }
    return 0;
}

static const char *mode_name(ma_norm_mode m) {
    static const char *const NAMES[] = {"none", "mean_std", "min_max", "q01_q99", "q10_q90"};
    return NAMES[m];
}

static int ranged(ma_norm_mode m) { return m == MA_NORM_MIN_MAX || m == MA_NORM_Q01_Q99 || m == MA_NORM_Q10_Q90; }
static float clip1(float v) { return v < -1.0f ? -1.0f : (v > 1.0f ? 1.0f : v); }

/* one de-normalised value of dimension i (x: the model's output), as ma_unnormalize computes it */
static float unnorm_one(int lerobot, const ma_normalizer *n, int i, float x) {
    const int pass = n->has_mask && !n->mask[i];
    if (lerobot) { /* LeRobot: every dimension clamped, then the masked unnormaliser */
        const float a = isnan(x) ? x : clip1(x);
        float d;
        if (pass) return a;
        switch (n->mode) {
        case MA_NORM_MEAN_STD: return a * n->std[i] + n->mean[i];
        case MA_NORM_MIN_MAX:
            d = n->max[i] - n->min[i];
            if (d == 0.0f) d = n->eps;
            return (a + 1.0f) / 2.0f * d + n->min[i];
        case MA_NORM_Q01_Q99:
        case MA_NORM_Q10_Q90:
            d = n->high[i] - n->low[i];
            if (d == 0.0f) d = n->eps;
            return (a + 1.0f) * d / 2.0f + n->low[i];
        case MA_NORM_NONE: break;
        }
        return a;
    }
    const float a = ranged(n->mode) ? clip1(x) : x;
    float v = a;
    switch (n->mode) {
    case MA_NORM_MEAN_STD: v = a * n->std[i] + n->mean[i]; break;
    case MA_NORM_MIN_MAX: v = (a + 1.0f) * (n->max[i] - n->min[i]) / 2.0f + n->min[i]; break;
    case MA_NORM_Q01_Q99:
    case MA_NORM_Q10_Q90: v = (a + 1.0f) * (n->high[i] - n->low[i]) / 2.0f + n->low[i]; break;
    case MA_NORM_NONE: break;
    }
    return pass ? a : v;
}

static ma_status read_vec(const cJSON *stats, const char *key, int *dim, float *out, int *has, const char *where, const char *name,
                          ma_error *err) {
    const cJSON *a = get(stats, key);
    *has = 0;
    if (absent(a)) return MA_OK;
    if (!cJSON_IsArray(a)) return ma_fail(err, MA_ERR_FORMAT, "%s: %s.%s must be a list", where, name, key);
    int n = cJSON_GetArraySize(a);
    if (n < 1 || n > MA_NORM_MAX_DIM)
        return ma_fail(err, MA_ERR_FORMAT, "%s: %s.%s has %d values (1..%d)", where, name, key, n, MA_NORM_MAX_DIM);
    if (*dim && n != *dim) return ma_fail(err, MA_ERR_FORMAT, "%s: %s.%s has %d values, other stats have %d", where, name, key, n, *dim);
    *dim = n;
    int i = 0;
    for (const cJSON *e = a->child; e; e = e->next, i++) {
        if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble))
            return ma_fail(err, MA_ERR_FORMAT, "%s: %s.%s[%d] is not a finite number", where, name, key, i);
        if (fabs(e->valuedouble) > FLT_MAX) /* the cast would be undefined */
            return ma_fail(err, MA_ERR_RANGE, "%s: %s.%s[%d] = %g is beyond float32", where, name, key, i, e->valuedouble);
        out[i] = (float)e->valuedouble;
    }
    *has = 1;
    return MA_OK;
}

/* one feature's statistics. name: how messages call the object ("libero.action_stats", "action");
 * action: they de-normalise actions (their range is checked at both ends of [-1, 1]) */
static ma_status parse_normalizer(const cJSON *stats, ma_norm_mode mode, float eps, int lerobot, int action, const char *where,
                                  const char *name, ma_normalizer *n, ma_error *err) {
    memset(n, 0, sizeof *n);
    if (!cJSON_IsObject(stats)) return ma_fail(err, MA_ERR_FORMAT, "%s: %s must be an object", where, name);
    /* a mode and eps of the feature's own (LeRobot's per feature type normalization_mapping) */
    const cJSON *fm = get(stats, "norm_mode"), *fe = get(stats, "eps");
    if ((!absent(fm) || !absent(fe)) && !lerobot)
        return ma_fail(err, MA_ERR_UNSUPPORTED, "%s: %s.norm_mode / %s.eps of its own need arithmetic \"lerobot\"", where, name, name);
    if (!absent(fm)) {
        char e[300];
        if (!cJSON_IsString(fm)) return ma_fail(err, MA_ERR_FORMAT, "%s: %s.norm_mode must be a string", where, name);
        if (!mode_of(fm->valuestring, &mode))
            return ma_fail(err, MA_ERR_UNSUPPORTED, "%s: %s.norm_mode \"%s\" is unknown (none, mean_std, min_max, q01_q99, q10_q90)", where,
                           name, esc(fm->valuestring, e, sizeof e));
    }
    if (!absent(fe)) {
        if (!cJSON_IsNumber(fe) || !(fe->valuedouble > 0) || fe->valuedouble > 1)
            return ma_fail(err, MA_ERR_RANGE, "%s: %s.eps must be a number in (0, 1]", where, name);
        eps = (float)fe->valuedouble;
    }
    n->mode = mode;
    n->eps = eps;
    const char *lowk = mode == MA_NORM_Q10_Q90 ? "q10" : "q01", *highk = mode == MA_NORM_Q10_Q90 ? "q90" : "q99";
    ma_status s;
    if ((s = read_vec(stats, "mean", &n->dim, n->mean, &n->has_mean, where, name, err)) ||
        (s = read_vec(stats, "std", &n->dim, n->std, &n->has_std, where, name, err)) ||
        (s = read_vec(stats, "min", &n->dim, n->min, &n->has_min, where, name, err)) ||
        (s = read_vec(stats, "max", &n->dim, n->max, &n->has_max, where, name, err)) ||
        (s = read_vec(stats, lowk, &n->dim, n->low, &n->has_low, where, name, err)) ||
        (s = read_vec(stats, highk, &n->dim, n->high, &n->has_high, where, name, err)))
        return s;
    const cJSON *m = get(stats, "mask");
    if (!absent(m)) {
        if (cJSON_IsBool(m)) { /* a scalar mask broadcasts */
            n->has_mask = 1;
            for (int i = 0; i < MA_NORM_MAX_DIM; i++) n->mask[i] = (uint8_t)cJSON_IsTrue(m);
        } else {
            if (!cJSON_IsArray(m)) return ma_fail(err, MA_ERR_FORMAT, "%s: %s.mask must be a list of booleans", where, name);
            int k = cJSON_GetArraySize(m);
            if (k < 1 || k > MA_NORM_MAX_DIM || (n->dim && k != n->dim))
                return ma_fail(err, MA_ERR_FORMAT, "%s: %s.mask has %d entries, stats have %d", where, name, k, n->dim);
            int i = 0;
            for (const cJSON *e = m->child; e; e = e->next, i++) {
                if (!cJSON_IsBool(e)) return ma_fail(err, MA_ERR_FORMAT, "%s: %s.mask[%d] is not a boolean", where, name, i);
                n->mask[i] = (uint8_t)cJSON_IsTrue(e);
            }
            if (!n->dim) n->dim = k;
            n->has_mask = 1;
        }
    }
    if (!n->dim) return ma_fail(err, MA_ERR_FORMAT, "%s: %s has no statistics", where, name);
    if ((mode == MA_NORM_Q01_Q99 || mode == MA_NORM_Q10_Q90) && (!n->has_low || !n->has_high))
        return ma_fail(err, MA_ERR_FORMAT, "%s: %s: norm_mode %s needs %s and %s", where, name, mode_name(mode), lowk, highk);
    if (mode == MA_NORM_MIN_MAX && (!n->has_min || !n->has_max))
        return ma_fail(err, MA_ERR_FORMAT, "%s: %s: norm_mode min_max needs min and max", where, name);
    if (mode == MA_NORM_MEAN_STD && (!n->has_mean || !n->has_std))
        return ma_fail(err, MA_ERR_FORMAT, "%s: %s: norm_mode mean_std needs mean and std", where, name);
    /* ranges that map nothing to [-1, 1]: min == max is a constant dimension (mapped to 0), an
     * inverted range is a broken file; quantiles must be strictly ordered where they are used */
    for (int i = 0; i < n->dim; i++) {
        const int used = !n->has_mask || n->mask[i];
        if (n->has_min && n->has_max && n->min[i] > n->max[i])
            return ma_fail(err, MA_ERR_RANGE, "%s: %s.min[%d] = %g exceeds max[%d] = %g", where, name, i, n->min[i], i, n->max[i]);
        /* equal quantiles only for a constant dimension (min == max given: normalised to 0) */
        const int constant = n->has_min && n->has_max && n->min[i] == n->max[i];
        if (used && (mode == MA_NORM_Q01_Q99 || mode == MA_NORM_Q10_Q90) && !(n->low[i] < n->high[i]) &&
            !((constant || lerobot) && n->low[i] == n->high[i])) /* LeRobot: an equal pair divides by eps */
            return ma_fail(err, MA_ERR_RANGE, "%s: %s.%s[%d] = %g is not below %s[%d] = %g", where, name, lowk, i, n->low[i], highk, i,
                           n->high[i]);
        if (used && mode == MA_NORM_MEAN_STD && !(n->std[i] >= 0))
            return ma_fail(err, MA_ERR_RANGE, "%s: %s.std[%d] = %g is negative", where, name, i, n->std[i]);
        if (!used) continue;
        /* a range that overflows float32 normalises everything to 0 or NaN, and de-normalises to
         * inf: refused here, by the float32 arithmetic the normaliser itself uses */
        if (ranged(mode)) {
            const int mm = mode == MA_NORM_MIN_MAX;
            const float lo = mm ? n->min[i] : n->low[i], hi = mm ? n->max[i] : n->high[i];
            const float d = hi - lo;
            if (!isfinite(d))
                return ma_fail(err, MA_ERR_RANGE, "%s: %s.%s[%d] = %g and %s[%d] = %g: their range overflows float32", where, name,
                               mm ? "max" : highk, i, hi, mm ? "min" : lowk, i, lo);
        }
        if (action)
            for (int end = -1; end <= 1; end += 2) {
                const float y = unnorm_one(lerobot, n, i, (float)end);
                if (!isfinite(y)) {
                    const int mm = mode == MA_NORM_MIN_MAX;
                    const char *k = mode == MA_NORM_MEAN_STD ? "std" : mm ? "max" : highk;
                    const float v = mode == MA_NORM_MEAN_STD ? n->std[i] : mm ? n->max[i] : n->high[i];
                    return ma_fail(err, MA_ERR_RANGE, "%s: %s.%s[%d] = %g: de-normalising the action %+d gives %g, beyond float32 (%s)",
                                   where, name, k, i, v, end, y, mode_name(mode));
                }
            }
    }
    return MA_OK;
}

ma_status ma_normstats_check_feature(const cJSON *stats, const char *mode, double eps, int lerobot, int action, const char *where,
                                     const char *prefix, ma_error *err) {
    ma_norm_mode m;
    char e[300];
    if (!mode_of(mode, &m)) return ma_fail(err, MA_ERR_UNSUPPORTED, "%s: unknown norm_mode %s", where, esc(mode, e, sizeof e));
    ma_normalizer *n = malloc(sizeof *n);
    if (!n) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
    ma_status s = parse_normalizer(stats, m, (float)eps, lerobot, action, where, prefix, n, err);
    free(n);
    return s;
}

/* an optional string of the tag's metadata ("" when absent); another type, or one too long for
 * dst, is refused */
static ma_status copy_str(char *dst, size_t cap, const cJSON *o, const char *key, const char *where, ma_error *err) {
    const cJSON *j = get(o, key);
    dst[0] = '\0';
    if (absent(j)) return MA_OK;
    if (!cJSON_IsString(j)) return ma_fail(err, MA_ERR_FORMAT, "%s.%s must be a string", where, key);
    if (strlen(j->valuestring) >= cap)
        return ma_fail(err, MA_ERR_RANGE, "%s.%s has %zu bytes (at most %zu)", where, key, strlen(j->valuestring), cap - 1);
    snprintf(dst, cap, "%s", j->valuestring);
    return MA_OK;
}

/* an optional positive integer of the tag's metadata (0 when absent); anything else is refused */
static ma_status opt_int(const cJSON *o, const char *key, int max, int *out, const char *where, ma_error *err) {
    const cJSON *j = get(o, key);
    *out = 0;
    if (absent(j)) return MA_OK;
    if (!cJSON_IsNumber(j) || j->valuedouble != floor(j->valuedouble) || j->valuedouble < 1 || j->valuedouble > max)
        return ma_fail(err, MA_ERR_RANGE, "%s.%s must be an integer in [1, %d]", where, key, max);
    *out = (int)j->valuedouble;
    return MA_OK;
}

ma_status ma_normstats_parse(const char *json, const char *label, const char *tag, ma_normstats *ns, ma_error *err) {
    memset(ns, 0, sizeof *ns);
    cJSON *root = NULL;
    char e1[300], e2[300];
    ma_status s = ma_json_parse_object(json, strlen(json), label, &root, err);
    if (s) return s;
    const cJSON *fmt = get(root, "format");
    if (!cJSON_IsObject(root) || !cJSON_IsString(fmt) || strcmp(fmt->valuestring, "molmoact2_norm_stats.v1") != 0) {
        s = ma_fail(err, MA_ERR_FORMAT, "%s: format must be \"molmoact2_norm_stats.v1\"", label);
        goto done;
    }
    const cJSON *mode = get(root, "norm_mode");
    if (!absent(mode) && !cJSON_IsString(mode)) {
        s = ma_fail(err, MA_ERR_FORMAT, "%s: norm_mode must be a string", label);
        goto done;
    }
    const char *m = cJSON_IsString(mode) ? mode->valuestring : "min_max";
    if (!mode_of(m, &ns->mode)) {
        s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: unknown norm_mode %s", label, esc(m, e1, sizeof e1));
        goto done;
    }
    const cJSON *tags = get(root, "metadata_by_tag");
    const cJSON *meta = get(tags, tag);
    /* the statistics of a LeRobot checkpoint (written by compile) have no tag of their own: the
     * file's only tag, named by default_tag, serves whatever tag is asked */
    const cJSON *dflt = get(root, "default_tag");
    if (!absent(dflt) && !cJSON_IsString(dflt)) {
        s = ma_fail(err, MA_ERR_FORMAT, "%s: default_tag must be a string", label);
        goto done;
    }
    if (!meta && cJSON_IsString(dflt) && cJSON_IsObject(tags) && cJSON_GetArraySize(tags) == 1) meta = get(tags, dflt->valuestring);
    if (!cJSON_IsObject(meta)) {
        char have[256] = "";
        size_t n = 0;
        for (const cJSON *t = cJSON_IsObject(tags) ? tags->child : NULL; t && n + 4 < sizeof have; t = t->next)
            n += (size_t)snprintf(have + n, sizeof have - n, "%s%s", n ? ", " : "", esc(t->string, e2, 72));
        s = ma_fail(err, MA_ERR_ARG, "%s: no statistics for --norm-tag %s (it has: %s)", label, esc(tag, e1, sizeof e1), n ? have : "none");
        goto done;
    }
    esc(tag, e1, sizeof e1);
    const cJSON *arith = get(meta, "arithmetic");
    ns->eps = 1e-6f;
    if (!absent(arith)) {
        if (!cJSON_IsString(arith) || (strcmp(arith->valuestring, "lerobot") && strcmp(arith->valuestring, "hf"))) {
            s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: %s.arithmetic must be \"hf\" or \"lerobot\"", label, e1);
            goto done;
        }
        ns->lerobot = !strcmp(arith->valuestring, "lerobot");
        const cJSON *eps = get(meta, "eps");
        ns->eps = 1e-8f;
        if (!absent(eps) && (!cJSON_IsNumber(eps) || !(eps->valuedouble > 0) || eps->valuedouble > 1)) {
            s = ma_fail(err, MA_ERR_RANGE, "%s: %s.eps must be a number in (0, 1]", label, e1);
            goto done;
        }
        if (!absent(eps)) ns->eps = (float)eps->valuedouble;
    }
    char name[400];
    snprintf(name, sizeof name, "%s.action_stats", e1);
    if ((s = parse_normalizer(get(meta, "action_stats"), ns->mode, ns->eps, ns->lerobot, 1, label, name, &ns->action, err))) goto done;
    const cJSON *st = get(meta, "state_stats");
    if (!absent(st)) {
        snprintf(name, sizeof name, "%s.state_stats", e1);
        if ((s = parse_normalizer(st, ns->mode, ns->eps, ns->lerobot, 0, label, name, &ns->state, err))) goto done;
        ns->has_state = 1;
    }
    char where[4096 + 400];
    snprintf(where, sizeof where, "%s: %s", label, e1);
    int action_dim;
    if ((s = opt_int(meta, "action_horizon", 1 << 20, &ns->action_horizon, where, err)) ||
        (s = opt_int(meta, "n_action_steps", 1 << 20, &ns->n_action_steps, where, err)) ||
        (s = opt_int(meta, "action_dim", 1 << 20, &action_dim, where, err)) ||
        (s = copy_str(ns->setup_type, sizeof ns->setup_type, meta, "setup_type", where, err)) ||
        (s = copy_str(ns->control_mode, sizeof ns->control_mode, meta, "control_mode", where, err)))
        goto done;
    ns->action_dim = action_dim;
done:
    cJSON_Delete(root);
    return s;
}

ma_status ma_normstats_load(const char *path, const char *tag, ma_normstats *ns, ma_error *err) {
    char *text = NULL;
    ma_status s = ma_read_file(path, 16u << 20, &text, NULL, err);
    if (s) return s;
    s = ma_normstats_parse(text, path, tag, ns, err);
    free(text);
    return s;
}


/* LeRobot's MolmoAct2 normaliser (its masked normaliser, then the clamp of the normalised
 * dimensions), in its float32 operation order: huggingface/lerobot
 * 7427f31801f944f5ec9ce53cda02862ce7d1638b, src/lerobot/processor/normalize_processor.py
 * (_NormalizationMixin._apply_transform: the feature type's own mode from norm_map; a zero range
 * replaced by eps; MEAN_STD divides by std + eps) and policies/molmoact2/processor_molmoact2.py
 * (the mask, molmoact2_clamp_normalized, molmoact2_clamp_action) */
static void normalize_lerobot(const ma_normalizer *n, const float *x, float *y) {
    for (int i = 0; i < n->dim; i++) {
        if (n->has_mask && !n->mask[i]) {
            y[i] = x[i];
            continue;
        } /* passes through */
        float v = x[i], d;
        switch (n->mode) { /* each feature its own mode and eps (LeRobot's normalization_mapping) */
        case MA_NORM_MEAN_STD: v = (x[i] - n->mean[i]) / (n->std[i] + n->eps); break;
        case MA_NORM_MIN_MAX:
            d = n->max[i] - n->min[i];
            if (d == 0.0f) d = n->eps;
            v = 2.0f * (x[i] - n->min[i]) / d - 1.0f;
            break;
        case MA_NORM_Q01_Q99:
        case MA_NORM_Q10_Q90:
            d = n->high[i] - n->low[i];
            if (d == 0.0f) d = n->eps;
            v = 2.0f * (x[i] - n->low[i]) / d - 1.0f;
            break;
        case MA_NORM_NONE: break;
        }
        y[i] = isnan(v) ? v : clip1(v);
    }
}

ma_status ma_normstats_check_state(const ma_normstats *ns, const float *x, int dim, ma_error *err) {
    const ma_normalizer *n = &ns->state;
    if (!ns->lerobot || !ns->has_state || !n->has_mask) return MA_OK;
    for (int i = 0; i < dim && i < n->dim; i++)
        if (!n->mask[i] && !(x[i] >= -1.0f && x[i] <= 1.0f))
            return ma_fail(err, MA_ERR_RANGE,
                           "observation.state[%d] is %g: this dimension passes through unnormalised (the checkpoint's "
                           "mask; normalize_gripper false) and must lie in [-1, 1], as LeRobot requires",
                           i, (double)x[i]);
    return MA_OK;
}

void ma_normalize(const ma_normstats *ns, const ma_normalizer *n, const float *x, float *y) {
    if (ns->lerobot) {
        normalize_lerobot(n, x, y);
        return;
    }
    const float eps = 1e-6f;
    for (int i = 0; i < n->dim; i++) {
        float v = x[i];
        switch (n->mode) {
        case MA_NORM_MEAN_STD: v = (x[i] - n->mean[i]) / fmaxf(n->std[i], eps); break;
        case MA_NORM_MIN_MAX: v = 2.0f * (x[i] - n->min[i]) / fmaxf(n->max[i] - n->min[i], eps) - 1.0f; break;
        case MA_NORM_Q01_Q99:
        case MA_NORM_Q10_Q90: v = 2.0f * (x[i] - n->low[i]) / fmaxf(n->high[i] - n->low[i], eps) - 1.0f; break;
        case MA_NORM_NONE: break;
        }
        if (ranged(n->mode) && !isnan(v)) v = clip1(v);
        if (n->has_mask && !n->mask[i]) v = x[i];
        int zero = (n->mode == MA_NORM_MIN_MAX || (ranged(n->mode) && n->has_min && n->has_max)) && n->min[i] == n->max[i];
        y[i] = zero ? 0.0f : v;
    }
}

ma_status ma_unnormalize(const ma_normstats *ns, const ma_normalizer *n, const float *x, float *y, ma_error *err) {
    ma_status s = MA_OK;
    for (int i = 0; i < n->dim; i++) {
        y[i] = unnorm_one(ns->lerobot, n, i, x[i]);
        /* the one place every action passes (run, serve, the API): nothing non-finite leaves it */
        if (!isfinite(y[i]) && !s)
            s = ma_fail(err, MA_ERR_RANGE,
                        "the de-normalised action[%d] is %g, not finite (the model's output %g, norm_mode %s): the request is "
                        "refused",
                        i, (double)y[i], (double)x[i], mode_name(n->mode));
    }
    return s;
}

void ma_normstats_tags(const char *path, char *out, size_t cap) {
    out[0] = '\0';
    char *text = NULL;
    if (ma_read_file(path, 64u << 20, &text, NULL, NULL)) return;
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *tags = root ? cJSON_GetObjectItemCaseSensitive(root, "metadata_by_tag") : NULL;
    size_t k = 0;
    char e[80];
    for (const cJSON *t = cJSON_IsObject(tags) ? tags->child : NULL; t && k + 1 < cap; t = t->next)
        k += (size_t)snprintf(out + k, cap - k, "%s%s", k ? ", " : "", esc(t->string, e, sizeof e));
    cJSON_Delete(root);
}
