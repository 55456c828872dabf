/* SPDX-License-Identifier: Apache-2.0 */
#include "model/normstats.h"
#include "io/jsonline.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/mapfile.h"

static ma_status read_vec(const cJSON *stats, const char *key, int *dim, float *out, int *has, const char *where,
                          ma_error *err) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(stats, key);
    *has = 0;
    if (!a || cJSON_IsNull(a)) return MA_OK;
    if (!cJSON_IsArray(a)) return ma_fail(err, MA_ERR_FORMAT, "%s.%s must be a list", where, key);
    int n = cJSON_GetArraySize(a);
    if (n < 1 || n > MA_NORM_MAX_DIM) return ma_fail(err, MA_ERR_FORMAT, "%s.%s has %d values (1..%d)", where, key, n, MA_NORM_MAX_DIM);
    if (*dim && n != *dim) return ma_fail(err, MA_ERR_FORMAT, "%s.%s has %d values, other stats have %d", where, key, n, *dim);
    *dim = n;
    int i = 0;
    for (const cJSON *e = a->child; e; e = e->next, i++) {
        if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble))
            return ma_fail(err, MA_ERR_FORMAT, "%s.%s[%d] is not a finite number", where, key, i);
        out[i] = (float)e->valuedouble;
    }
    *has = 1;
    return MA_OK;
}

static ma_status parse_normalizer(const cJSON *stats, ma_norm_mode mode, int lerobot, const char *where, ma_normalizer *n, ma_error *err) {
    memset(n, 0, sizeof *n);
    if (!cJSON_IsObject(stats)) return ma_fail(err, MA_ERR_FORMAT, "%s must be an object", where);
    const char *lowk = mode == MA_NORM_Q10_Q90 ? "q10" : "q01", *highk = mode == MA_NORM_Q10_Q90 ? "q90" : "q99";
    ma_status s;
    if ((s = read_vec(stats, "mean", &n->dim, n->mean, &n->has_mean, where, err)) ||
        (s = read_vec(stats, "std", &n->dim, n->std, &n->has_std, where, err)) ||
        (s = read_vec(stats, "min", &n->dim, n->min, &n->has_min, where, err)) ||
        (s = read_vec(stats, "max", &n->dim, n->max, &n->has_max, where, err)) ||
        (s = read_vec(stats, lowk, &n->dim, n->low, &n->has_low, where, err)) ||
        (s = read_vec(stats, highk, &n->dim, n->high, &n->has_high, where, err)))
        return s;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(stats, "mask");
    if (m && !cJSON_IsNull(m)) {
        if (cJSON_IsBool(m)) {   /* a scalar mask broadcasts */
            n->has_mask = 1;
            for (int i = 0; i < MA_NORM_MAX_DIM; i++) n->mask[i] = (uint8_t)cJSON_IsTrue(m);
        } else {
            if (!cJSON_IsArray(m)) return ma_fail(err, MA_ERR_FORMAT, "%s.mask must be a list of booleans", where);
            int k = cJSON_GetArraySize(m);
            if (k < 1 || k > MA_NORM_MAX_DIM || (n->dim && k != n->dim))
                return ma_fail(err, MA_ERR_FORMAT, "%s.mask has %d entries, stats have %d", where, k, n->dim);
            int i = 0;
            for (const cJSON *e = m->child; e; e = e->next, i++) {
                if (!cJSON_IsBool(e)) return ma_fail(err, MA_ERR_FORMAT, "%s.mask[%d] is not a boolean", where, i);
                n->mask[i] = (uint8_t)cJSON_IsTrue(e);
            }
            if (!n->dim) n->dim = k;
            n->has_mask = 1;
        }
    }
    if (!n->dim) return ma_fail(err, MA_ERR_FORMAT, "%s has no statistics", where);
    if ((mode == MA_NORM_Q01_Q99 || mode == MA_NORM_Q10_Q90) && (!n->has_low || !n->has_high))
        return ma_fail(err, MA_ERR_FORMAT, "%s: norm_mode needs %s and %s", where, lowk, highk);
    if (mode == MA_NORM_MIN_MAX && (!n->has_min || !n->has_max)) return ma_fail(err, MA_ERR_FORMAT, "%s: norm_mode min_max needs min and max", where);
    if (mode == MA_NORM_MEAN_STD && (!n->has_mean || !n->has_std)) return ma_fail(err, MA_ERR_FORMAT, "%s: norm_mode mean_std needs mean and std", where);
    /* ranges that map nothing to [-1, 1]: min == max is a constant dimension (mapped to 0), an
     * inverted range is a broken file; quantiles must be strictly ordered where they are used */
    for (int i = 0; i < n->dim; i++) {
        const int used = !n->has_mask || n->mask[i];
        if (n->has_min && n->has_max && n->min[i] > n->max[i])
            return ma_fail(err, MA_ERR_RANGE, "%s: min[%d] = %g exceeds max[%d] = %g", where, i, n->min[i], i, n->max[i]);
        /* equal quantiles only for a constant dimension (min == max given: normalised to 0) */
        const int constant = n->has_min && n->has_max && n->min[i] == n->max[i];
        if (used && (mode == MA_NORM_Q01_Q99 || mode == MA_NORM_Q10_Q90) && !(n->low[i] < n->high[i]) &&
            !((constant || lerobot) && n->low[i] == n->high[i])) /* LeRobot: an equal pair divides by eps */
            return ma_fail(err, MA_ERR_RANGE, "%s: %s[%d] = %g is not below %s[%d] = %g", where, lowk, i, n->low[i], highk, i, n->high[i]);
        if (used && mode == MA_NORM_MEAN_STD && !(n->std[i] >= 0))
            return ma_fail(err, MA_ERR_RANGE, "%s: std[%d] = %g is negative", where, i, n->std[i]);
    }
    return MA_OK;
}

static void copy_str(char *dst, size_t cap, const cJSON *o, const char *key) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    dst[0] = '\0';
    if (cJSON_IsString(j)) snprintf(dst, cap, "%s", j->valuestring);
}

/* an optional positive integer of the tag's metadata (0 when absent); anything else is refused */
static ma_status opt_int(const cJSON *o, const char *key, int max, int *out, const char *where, ma_error *err) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = 0;
    if (!j || cJSON_IsNull(j)) return MA_OK;
    if (!cJSON_IsNumber(j) || j->valuedouble != floor(j->valuedouble) || j->valuedouble < 1 || j->valuedouble > max)
        return ma_fail(err, MA_ERR_RANGE, "%s.%s must be an integer in [1, %d]", where, key, max);
    *out = (int)j->valuedouble;
    return MA_OK;
}

ma_status ma_normstats_parse(const char *json, const char *label, const char *tag, ma_normstats *ns, ma_error *err) {
    memset(ns, 0, sizeof *ns);
    cJSON *root = NULL;
    ma_status s = ma_json_parse_object(json, strlen(json), label, &root, err);
    if (s) return s;
    const cJSON *fmt = root ? cJSON_GetObjectItemCaseSensitive(root, "format") : NULL;
    if (!cJSON_IsObject(root) || !cJSON_IsString(fmt) || strcmp(fmt->valuestring, "molmoact2_norm_stats.v1") != 0) {
        s = ma_fail(err, MA_ERR_FORMAT, "%s: format must be \"molmoact2_norm_stats.v1\"", label);
        goto done;
    }
    const cJSON *mode = cJSON_GetObjectItemCaseSensitive(root, "norm_mode");
    const char *m = cJSON_IsString(mode) ? mode->valuestring : "min_max";
    if (!strcmp(m, "none")) ns->mode = MA_NORM_NONE;
    else if (!strcmp(m, "mean_std")) ns->mode = MA_NORM_MEAN_STD;
    else if (!strcmp(m, "min_max")) ns->mode = MA_NORM_MIN_MAX;
    else if (!strcmp(m, "q01_q99")) ns->mode = MA_NORM_Q01_Q99;
    else if (!strcmp(m, "q10_q90")) ns->mode = MA_NORM_Q10_Q90;
    else { s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: unknown norm_mode %s", label, m); goto done; }
    const cJSON *tags = cJSON_GetObjectItemCaseSensitive(root, "metadata_by_tag");
    const cJSON *meta = cJSON_IsObject(tags) ? cJSON_GetObjectItemCaseSensitive(tags, tag) : NULL;
    /* the statistics of a LeRobot checkpoint (written by compile) have no tag of their own: the
     * file's only tag, named by default_tag, serves whatever tag is asked */
    const cJSON *dflt = cJSON_GetObjectItemCaseSensitive(root, "default_tag");
    if (!meta && cJSON_IsString(dflt) && cJSON_GetArraySize(tags) == 1) meta = cJSON_GetObjectItemCaseSensitive(tags, dflt->valuestring);
    if (!cJSON_IsObject(meta)) {
        char have[256] = "";
        size_t n = 0;
        for (const cJSON *t = cJSON_IsObject(tags) ? tags->child : NULL; t && n + 4 < sizeof have; t = t->next)
            n += (size_t)snprintf(have + n, sizeof have - n, "%s%.64s", n ? ", " : "", t->string);
        s = ma_fail(err, MA_ERR_ARG, "%s: no statistics for --norm-tag %s (it has: %s)", label, tag, n ? have : "none");
        goto done;
    }
    const cJSON *arith = cJSON_GetObjectItemCaseSensitive(meta, "arithmetic");
    ns->eps = 1e-6f;
    if (arith && !cJSON_IsNull(arith)) {
        if (!cJSON_IsString(arith) || (strcmp(arith->valuestring, "lerobot") && strcmp(arith->valuestring, "hf"))) {
            s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: %s.arithmetic must be \"hf\" or \"lerobot\"", label, tag);
            goto done;
        }
        ns->lerobot = !strcmp(arith->valuestring, "lerobot");
        const cJSON *eps = cJSON_GetObjectItemCaseSensitive(meta, "eps");
        ns->eps = 1e-8f;
        if (eps && (!cJSON_IsNumber(eps) || !(eps->valuedouble > 0) || eps->valuedouble > 1)) {
            s = ma_fail(err, MA_ERR_RANGE, "%s: %s.eps must be in (0, 1]", label, tag);
            goto done;
        }
        if (eps) ns->eps = (float)eps->valuedouble;
    }
    char where[300];
    snprintf(where, sizeof where, "%s: %s.action_stats", label, tag);
    if ((s = parse_normalizer(cJSON_GetObjectItemCaseSensitive(meta, "action_stats"), ns->mode, ns->lerobot, where, &ns->action, err))) goto done;
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(meta, "state_stats");
    if (st && !cJSON_IsNull(st)) {
        snprintf(where, sizeof where, "%s: %s.state_stats", label, tag);
        if ((s = parse_normalizer(st, ns->mode, ns->lerobot, where, &ns->state, err))) goto done;
        ns->has_state = 1;
    }
    snprintf(where, sizeof where, "%s: %s", label, tag);
    int action_dim;
    if ((s = opt_int(meta, "action_horizon", 1 << 20, &ns->action_horizon, where, err)) ||
        (s = opt_int(meta, "n_action_steps", 1 << 20, &ns->n_action_steps, where, err)) ||
        (s = opt_int(meta, "action_dim", 1 << 20, &action_dim, where, err)))
        goto done;
    ns->action_dim = action_dim;
    copy_str(ns->setup_type, sizeof ns->setup_type, meta, "setup_type");
    copy_str(ns->control_mode, sizeof ns->control_mode, meta, "control_mode");
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


static int ranged(ma_norm_mode m) { return m == MA_NORM_MIN_MAX || m == MA_NORM_Q01_Q99 || m == MA_NORM_Q10_Q90; }
static float clip1(float v) { return v < -1.0f ? -1.0f : (v > 1.0f ? 1.0f : v); }

/* LeRobot's MolmoAct2 normaliser (its masked normaliser, then the clamp of the normalised
 * dimensions), in its float32 operation order */
static void normalize_lerobot(const ma_normstats *ns, const ma_normalizer *n, const float *x, float *y) {
    for (int i = 0; i < n->dim; i++) {
        if (n->has_mask && !n->mask[i]) { y[i] = x[i]; continue; } /* passes through */
        float v = x[i], d;
        switch (ns->mode) {
        case MA_NORM_MEAN_STD: v = (x[i] - n->mean[i]) / (n->std[i] + ns->eps); break;
        case MA_NORM_MIN_MAX:
            d = n->max[i] - n->min[i];
            if (d == 0.0f) d = ns->eps;
            v = 2.0f * (x[i] - n->min[i]) / d - 1.0f;
            break;
        case MA_NORM_Q01_Q99:
        case MA_NORM_Q10_Q90:
            d = n->high[i] - n->low[i];
            if (d == 0.0f) d = ns->eps;
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
            return ma_fail(err, MA_ERR_RANGE, "observation.state[%d] is %g: this dimension passes through unnormalised (the checkpoint's "
                           "mask; normalize_gripper false) and must lie in [-1, 1], as LeRobot requires", i, (double)x[i]);
    return MA_OK;
}

void ma_normalize(const ma_normstats *ns, const ma_normalizer *n, const float *x, float *y) {
    if (ns->lerobot) { normalize_lerobot(ns, n, x, y); return; }
    const float eps = 1e-6f;
    for (int i = 0; i < n->dim; i++) {
        float v = x[i];
        switch (ns->mode) {
        case MA_NORM_MEAN_STD: v = (x[i] - n->mean[i]) / fmaxf(n->std[i], eps); break;
        case MA_NORM_MIN_MAX: v = 2.0f * (x[i] - n->min[i]) / fmaxf(n->max[i] - n->min[i], eps) - 1.0f; break;
        case MA_NORM_Q01_Q99:
        case MA_NORM_Q10_Q90: v = 2.0f * (x[i] - n->low[i]) / fmaxf(n->high[i] - n->low[i], eps) - 1.0f; break;
        case MA_NORM_NONE: break;
        }
        if (ranged(ns->mode) && !isnan(v)) v = clip1(v);
        if (n->has_mask && !n->mask[i]) v = x[i];
        int zero = (ns->mode == MA_NORM_MIN_MAX || (ranged(ns->mode) && n->has_min && n->has_max)) && n->min[i] == n->max[i];
        y[i] = zero ? 0.0f : v;
    }
}

void ma_unnormalize(const ma_normstats *ns, const ma_normalizer *n, const float *x, float *y) {
    if (ns->lerobot) { /* LeRobot: every dimension clamped, then the masked unnormaliser */
        for (int i = 0; i < n->dim; i++) {
            const float a = isnan(x[i]) ? x[i] : clip1(x[i]);
            float v = a, d;
            if (!n->has_mask || n->mask[i]) switch (ns->mode) {
                case MA_NORM_MEAN_STD: v = a * n->std[i] + n->mean[i]; break;
                case MA_NORM_MIN_MAX:
                    d = n->max[i] - n->min[i];
                    if (d == 0.0f) d = ns->eps;
                    v = (a + 1.0f) / 2.0f * d + n->min[i];
                    break;
                case MA_NORM_Q01_Q99:
                case MA_NORM_Q10_Q90:
                    d = n->high[i] - n->low[i];
                    if (d == 0.0f) d = ns->eps;
                    v = (a + 1.0f) * d / 2.0f + n->low[i];
                    break;
                case MA_NORM_NONE: break;
                }
            y[i] = v;
        }
        return;
    }
    for (int i = 0; i < n->dim; i++) {
        float a = ranged(ns->mode) ? clip1(x[i]) : x[i];
        float v = a;
        switch (ns->mode) {
        case MA_NORM_MEAN_STD: v = a * n->std[i] + n->mean[i]; break;
        case MA_NORM_MIN_MAX: v = (a + 1.0f) * (n->max[i] - n->min[i]) / 2.0f + n->min[i]; break;
        case MA_NORM_Q01_Q99:
        case MA_NORM_Q10_Q90: v = (a + 1.0f) * (n->high[i] - n->low[i]) / 2.0f + n->low[i]; break;
        case MA_NORM_NONE: break;
        }
        y[i] = (n->has_mask && !n->mask[i]) ? a : v;
    }
}

void ma_normstats_tags(const char *path, char *out, size_t cap) {
    out[0] = '\0';
    char *text = NULL;
    if (ma_read_file(path, 64u << 20, &text, NULL, NULL)) return;
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *tags = root ? cJSON_GetObjectItemCaseSensitive(root, "metadata_by_tag") : NULL;
    size_t k = 0;
    for (const cJSON *t = cJSON_IsObject(tags) ? tags->child : NULL; t && k + 1 < cap; t = t->next)
        k += (size_t)snprintf(out + k, cap - k, "%s%s", k ? ", " : "", t->string);
    cJSON_Delete(root);
}
