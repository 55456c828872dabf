/* SPDX-License-Identifier: Apache-2.0 */
/* The C normaliser with LeRobot's arithmetic against what LeRobot's own code produced
 * (tests/fixtures/lerobot/recorded.json and its README): bit for bit. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "io/mapfile.h"
#include "model/normstats.h"
#include "model/prompt.h"

static cJSON *root;

static const cJSON *at(const cJSON *o, const char *path) { /* "a.b.c" (keys without dots) */
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *k = strtok(buf, "/"); k && o; k = strtok(NULL, "/")) o = cJSON_GetObjectItemCaseSensitive(o, k);
    return o;
}

static float hexf(const cJSON *s) {
    uint32_t u = (uint32_t)strtoul(s->valuestring, NULL, 16);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* the fixture's statistics as a norm_stats.json with LeRobot's arithmetic */
static void stats(ma_normstats *ns, const cJSON *sq01, const cJSON *sq99) {
    const cJSON *st = at(root, "stats"), *s = cJSON_GetObjectItemCaseSensitive(st, "observation.state"),
                *a = cJSON_GetObjectItemCaseSensitive(st, "action");
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "format", "molmoact2_norm_stats.v1");
    cJSON_AddStringToObject(doc, "norm_mode", "q01_q99");
    cJSON *meta = cJSON_AddObjectToObject(cJSON_AddObjectToObject(doc, "metadata_by_tag"), "t");
    cJSON_AddStringToObject(meta, "arithmetic", "lerobot");
    cJSON_AddNumberToObject(meta, "eps", at(root, "config/eps")->valuedouble);
    cJSON *ss = cJSON_AddObjectToObject(meta, "state_stats"), *as = cJSON_AddObjectToObject(meta, "action_stats");
    cJSON_AddItemToObject(ss, "q01", cJSON_Duplicate(sq01 ? sq01 : cJSON_GetObjectItemCaseSensitive(s, "q01"), 1));
    cJSON_AddItemToObject(ss, "q99", cJSON_Duplicate(sq99 ? sq99 : cJSON_GetObjectItemCaseSensitive(s, "q99"), 1));
    cJSON_AddItemToObject(ss, "mask", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(s, "mask"), 1));
    cJSON_AddItemToObject(as, "q01", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(a, "q01"), 1));
    cJSON_AddItemToObject(as, "q99", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(a, "q99"), 1));
    cJSON_AddItemToObject(as, "mask", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(a, "mask"), 1));
    char *text = cJSON_Print(doc);
    ma_error err = {0};
    assert_int_equal(ma_normstats_parse(text, "fixture", "t", ns, &err), MA_OK);
    free(text);
    cJSON_Delete(doc);
    assert_true(ns->lerobot);
}

static void rows(const cJSON *hexrows, int i, float *out, int n) {
    const cJSON *r = cJSON_GetArrayItem(hexrows, i);
    assert_int_equal(cJSON_GetArraySize(r), n);
    for (int k = 0; k < n; k++) out[k] = hexf(cJSON_GetArrayItem(r, k));
}

static void test_state_and_action_bit_for_bit(void **state) {
    (void)state;
    ma_normstats ns;
    stats(&ns, NULL, NULL);
    const cJSON *in = at(root, "inputs/state_f32_hex"), *want = at(root, "preprocessor_state/normalized_clamped_f32_hex");
    const cJSON *bins = at(root, "discrete_state/bins");
    for (int i = 0; i < cJSON_GetArraySize(in); i++) {
        float x[8], w[8], y[8];
        rows(in, i, x, 8);
        rows(want, i, w, 8);
        ma_error err = {0};
        assert_int_equal(ma_normstats_check_state(&ns, x, 8, &err), MA_OK);
        ma_normalize(&ns, &ns.state, x, y);
        for (int k = 0; k < 8; k++) {
            if (bits(y[k]) != bits(w[k])) fail_msg("state %d dim %d: %08x, LeRobot %08x", i, k, bits(y[k]), bits(w[k]));
            assert_int_equal(ma_state_bin(y[k], 256), cJSON_GetArrayItem(cJSON_GetArrayItem(bins, i), k)->valueint);
        }
    }
    const cJSON *ain = at(root, "inputs/action_f32_hex"), *aw = at(root, "postprocessor_action/unnormalized_f32_hex");
    for (int i = 0; i < cJSON_GetArraySize(ain); i++) {
        float x[7], w[7], y[7];
        rows(ain, i, x, 7);
        rows(aw, i, w, 7);
        ma_error err = {0};
        assert_int_equal(ma_unnormalize(&ns, &ns.action, x, y, &err), MA_OK);
        for (int k = 0; k < 7; k++)
            if (bits(y[k]) != bits(w[k])) fail_msg("action %d dim %d: %08x, LeRobot %08x", i, k, bits(y[k]), bits(w[k]));
    }
}

static void test_zero_range_uses_eps(void **state) {
    (void)state;
    ma_normstats ns;
    stats(&ns, at(root, "zero_range_case/state_q01"), at(root, "zero_range_case/state_q99"));
    const cJSON *in = at(root, "zero_range_case/input_state_f32_hex"), *want = at(root, "zero_range_case/normalized_clamped_f32_hex");
    const cJSON *bins = at(root, "zero_range_case/discrete_state_bins");
    for (int i = 0; i < cJSON_GetArraySize(in); i++) {
        float x[8], w[8], y[8];
        rows(in, i, x, 8);
        rows(want, i, w, 8);
        ma_normalize(&ns, &ns.state, x, y);
        for (int k = 0; k < 8; k++) {
            if (bits(y[k]) != bits(w[k])) fail_msg("state %d dim %d: %08x, LeRobot %08x", i, k, bits(y[k]), bits(w[k]));
            assert_int_equal(ma_state_bin(y[k], 256), cJSON_GetArrayItem(cJSON_GetArrayItem(bins, i), k)->valueint);
        }
    }
}

static void test_bins_at_the_edges(void **state) {
    (void)state;
    const cJSON *cases = at(root, "discrete_state_extra_cases/cases");
    for (int i = 0; i < cJSON_GetArraySize(cases); i++) {
        const cJSON *c = cJSON_GetArrayItem(cases, i), *h = cJSON_GetObjectItemCaseSensitive(c, "input_f32_hex");
        const cJSON *nb = cJSON_GetObjectItemCaseSensitive(c, "num_state_tokens");
        for (int k = 0; k < cJSON_GetArraySize(h); k++) {
            const float x = hexf(cJSON_GetArrayItem(h, k));
            const int want = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(c, "bins"), k)->valueint;
            assert_int_equal(ma_state_bin(x, nb ? nb->valueint : 256), want);
        }
    }
}

static void test_pass_through_outside_the_range_is_refused(void **state) {
    (void)state;
    ma_normstats ns;
    stats(&ns, NULL, NULL);
    const cJSON *r = cJSON_GetArrayItem(at(root, "passthrough_out_of_range_error/input_state"), 0);
    float x[8];
    for (int k = 0; k < 8; k++) x[k] = (float)cJSON_GetArrayItem(r, k)->valuedouble;
    ma_error err = {0};
    assert_int_equal(ma_normstats_check_state(&ns, x, 8, &err), MA_ERR_RANGE); /* LeRobot raises ValueError */
    assert_non_null(strstr(err.msg, "observation.state[7]"));
}

static void test_task_text(void **state) {
    (void)state;
    const cJSON *ps = at(root, "prompt_and_tokens/prompts");
    for (int i = 0; i < cJSON_GetArraySize(ps); i++) {
        const cJSON *p = cJSON_GetArrayItem(ps, i);
        const char *task = cJSON_GetObjectItemCaseSensitive(p, "task")->valuestring;
        const char *want = cJSON_GetObjectItemCaseSensitive(p, "task_normalized")->valuestring;
        char *got = NULL;
        ma_error err = {0};
        assert_int_equal(ma_normalize_task(task, strlen(task), &got, &err), MA_OK);
        assert_string_equal(got, want);
        free(got);
    }
}

/* issue 36 (F12): statistics whose de-normalised range overflows float32 are refused at load,
 * naming the key; a non-finite de-normalised action fails ma_unnormalize (the one point every
 * action passes), whatever the statistics */
static ma_status parse_one(const char *mode, const char *arith, const char *action_stats, const char *state_stats, ma_normstats *ns,
                           ma_error *err) {
    char text[2048];
    snprintf(
        text, sizeof text,
        "{\"format\": \"molmoact2_norm_stats.v1\", \"norm_mode\": \"%s\", \"metadata_by_tag\": {\"t\": {%s \"action_stats\": {%s}%s%s%s}}}",
        mode, arith, action_stats, state_stats ? ", \"state_stats\": {" : "", state_stats ? state_stats : "", state_stats ? "}" : "");
    return ma_normstats_parse(text, "ns.json", "t", ns, err);
}

static void test_overflowing_statistics_refused(void **state) {
    (void)state;
    ma_normstats ns;
    ma_error err = {0};
    static const char *const ARITH[2] = {"", "\"arithmetic\": \"lerobot\","};
    for (int a = 0; a < 2; a++) {
        /* q99 - q01 overflows */
        assert_int_equal(parse_one("q01_q99", ARITH[a], "\"q01\": [0, -3e38], \"q99\": [1, 3e38]", NULL, &ns, &err), MA_ERR_RANGE);
        assert_non_null(strstr(err.msg, "t.action_stats.q99[1] = 3e+38"));
        assert_non_null(strstr(err.msg, "float32"));
        /* the range is finite, (a + 1) (q99 - q01) is not */
        assert_int_equal(parse_one("q01_q99", ARITH[a], "\"q01\": [-1e38], \"q99\": [1e38]", NULL, &ns, &err), MA_ERR_RANGE);
        assert_non_null(strstr(err.msg, "q99[0]"));
        assert_int_equal(parse_one("min_max", ARITH[a], "\"min\": [-3e38], \"max\": [3e38]", NULL, &ns, &err), MA_ERR_RANGE);
        assert_non_null(strstr(err.msg, "max[0]"));
        /* mean + std */
        assert_int_equal(parse_one("mean_std", ARITH[a], "\"mean\": [3e38], \"std\": [1e38]", NULL, &ns, &err), MA_ERR_RANGE);
        assert_non_null(strstr(err.msg, "std[0]"));
        /* a value beyond float32 itself: refused before the (undefined) cast */
        assert_int_equal(parse_one("q01_q99", ARITH[a], "\"q01\": [0], \"q99\": [1e39]", NULL, &ns, &err), MA_ERR_RANGE);
        assert_non_null(strstr(err.msg, "q99[0] = 1e+39 is beyond float32"));
        /* the state's range as well (the normaliser divides by it) */
        assert_int_equal(parse_one("q01_q99", ARITH[a], "\"q01\": [0], \"q99\": [1]", "\"q01\": [-3e38], \"q99\": [3e38]", &ns, &err),
                         MA_ERR_RANGE);
        assert_non_null(strstr(err.msg, "t.state_stats.q99[0]"));
        /* a pass-through dimension's statistics are not used */
        assert_int_equal(
            parse_one("q01_q99", ARITH[a], "\"q01\": [0, -3e38], \"q99\": [1, 3e38], \"mask\": [true, false]", NULL, &ns, &err), MA_OK);
        /* large but sound: accepted */
        assert_int_equal(parse_one("q01_q99", ARITH[a], "\"q01\": [-1e37], \"q99\": [1e37]", NULL, &ns, &err), MA_OK);
    }
}

static void test_non_finite_action_refused(void **state) {
    (void)state;
    ma_normstats ns;
    ma_error err = {0};
    /* HF mean_std leaves the model's output unclipped: finite statistics, an infinite action */
    assert_int_equal(parse_one("mean_std", "", "\"mean\": [0, 0], \"std\": [1, 3e38]", NULL, &ns, &err), MA_OK);
    float x[2] = {0.5f, 2.0f}, y[2];
    assert_int_equal(ma_unnormalize(&ns, &ns.action, x, y, &err), MA_ERR_RANGE);
    assert_non_null(strstr(err.msg, "action[1] is inf, not finite"));
    x[1] = 0.5f;
    assert_int_equal(ma_unnormalize(&ns, &ns.action, x, y, &err), MA_OK);
    /* NaN from the model, in every mode and arithmetic, masked or not */
    static const char *const ARITH[2] = {"", "\"arithmetic\": \"lerobot\","};
    static const char *const MODE[4] = {"q01_q99", "min_max", "mean_std", "none"};
    for (int a = 0; a < 2; a++)
        for (int m = 0; m < 4; m++) {
            assert_int_equal(parse_one(MODE[m], ARITH[a],
                                       "\"q01\": [0, 0], \"q99\": [1, 1], \"min\": [0, 0], \"max\": [1, 1], \"mean\": [0, 0], "
                                       "\"std\": [1, 1], \"mask\": [true, false]",
                                       NULL, &ns, &err),
                             MA_OK);
            for (int d = 0; d < 2; d++) {
                float xn[2] = {0.0f, 0.0f};
                xn[d] = NAN;
                err.msg[0] = '\0';
                assert_int_equal(ma_unnormalize(&ns, &ns.action, xn, y, &err), MA_ERR_RANGE);
                char want[32];
                snprintf(want, sizeof want, "action[%d]", d);
                assert_non_null(strstr(err.msg, want));
            }
        }
}

/* LeRobot's normalization_mapping: each feature its own mode (and eps) */
static void test_per_feature_modes(void **state) {
    (void)state;
    ma_normstats ns;
    ma_error err = {0};
    assert_int_equal(parse_one("q01_q99", "\"arithmetic\": \"lerobot\",", "\"q01\": [-1], \"q99\": [3]",
                               "\"norm_mode\": \"min_max\", \"eps\": 0.5, \"min\": [0], \"max\": [0]", &ns, &err),
                     MA_OK);
    assert_int_equal(ns.action.mode, MA_NORM_Q01_Q99);
    assert_int_equal(ns.state.mode, MA_NORM_MIN_MAX);
    assert_true(ns.state.eps == 0.5f && ns.action.eps == 1e-8f);
    float x[1] = {0.125f}, y[1];
    ma_normalize(&ns, &ns.state, x, y);
    assert_true(y[0] == 2.0f * 0.125f / 0.5f - 1.0f); /* LeRobot: a zero range divides by eps */
    /* the HF arithmetic has one mode for the file */
    assert_int_equal(
        parse_one("q01_q99", "", "\"q01\": [-1], \"q99\": [3]", "\"norm_mode\": \"min_max\", \"min\": [0], \"max\": [1]", &ns, &err),
        MA_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "t.state_stats.norm_mode"));
    assert_int_equal(parse_one("q01_q99", "\"arithmetic\": \"lerobot\",", "\"q01\": [-1], \"q99\": [3], \"norm_mode\": 3", NULL, &ns, &err),
                     MA_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "t.action_stats.norm_mode must be a string"));
    assert_int_equal(
        parse_one("q01_q99", "\"arithmetic\": \"lerobot\",", "\"q01\": [-1], \"q99\": [3], \"norm_mode\": \"x\\ny\"", NULL, &ns, &err),
        MA_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "\"x\\x0ay\"")); /* escaped, not echoed raw */
    assert_int_equal(parse_one("q01_q99", "\"arithmetic\": \"lerobot\", \"eps\": \"x\",", "\"q01\": [-1], \"q99\": [3]", NULL, &ns, &err),
                     MA_ERR_RANGE);
    assert_non_null(strstr(err.msg, "t.eps must be a number"));
    assert_int_equal(parse_one("q01_q99", "\"setup_type\": 5,", "\"q01\": [-1], \"q99\": [3]", NULL, &ns, &err), MA_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "setup_type must be a string"));
}

int main(void) {
    char *text = NULL;
    ma_error err = {0};
    if (ma_read_file(MA_SOURCE_DIR "/tests/fixtures/lerobot/recorded.json", 8u << 20, &text, NULL, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    root = cJSON_Parse(text);
    free(text);
    if (!root) return 1;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_state_and_action_bit_for_bit),
                                       cmocka_unit_test(test_zero_range_uses_eps),
                                       cmocka_unit_test(test_bins_at_the_edges),
                                       cmocka_unit_test(test_pass_through_outside_the_range_is_refused),
                                       cmocka_unit_test(test_task_text),
                                       cmocka_unit_test(test_overflowing_statistics_refused),
                                       cmocka_unit_test(test_non_finite_action_refused),
                                       cmocka_unit_test(test_per_feature_modes)};
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    cJSON_Delete(root);
    return rc;
}
