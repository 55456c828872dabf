/* SPDX-License-Identifier: Apache-2.0 */
#include "../test_util.h"

#include "io/npz.h"
#include "model/hostglue.h"
#include "model/normstats.h"

static void test_encoder_and_image_masks(void **state) {
    (void)state;
    ma_config c;
    memset(&c, 0, sizeof c);
    c.action_mode_both = 1;
    c.eos_id = 9;
    c.action_start_id = 5;
    c.action_end_id = 6;
    c.image_patch_id = 20;
    c.image_col_id = 21;
    c.image_start_id = 22;
    c.image_end_id = 23;
    c.low_res_start_id = -1;
    c.frame_start_id = -1;
    c.frame_end_id = -1;
    c.image_low_res_id = -1;
    int64_t ids[12] = {9, 1, 5, 2, 5, 6, 3, 6, 9, 4, 5, 1};
    uint8_t m[12];
    ma_encoder_mask(&c, ids, 12, m);
    const uint8_t want[12] = {0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0};
    assert_memory_equal(m, want, 12);
    c.action_mode_both = 0;
    ma_encoder_mask(&c, ids, 12, m);
    for (int i = 0; i < 12; i++) assert_int_equal(m[i], 1);
    int64_t img_ids[6] = {9, 22, 20, 21, 23, 4};
    ma_image_token_mask(&c, img_ids, 6, m);
    const uint8_t img_want[6] = {0, 1, 1, 1, 1, 0};
    assert_memory_equal(m, img_want, 6);
}

static void test_split_ranges(void **state) {
    (void)state;
    int f[4], l[4];
    ma_split_ranges(36, f, l);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(f[i], 9 * i);
        assert_int_equal(l[i], 9 * i + 9);
    }
    ma_split_ranges(6, f, l);
    const int wf[4] = {0, 2, 4, 5}, wl[4] = {2, 4, 5, 6};
    assert_memory_equal(f, wf, sizeof wf);
    assert_memory_equal(l, wl, sizeof wl);
    ma_split_ranges(2, f, l);
    assert_int_equal(l[3] - f[3], 0); /* fewer layers than splits: trailing splits are empty */
}

/* the committed golden's noise is torch.randn((1, 10, 32), generator=manual_seed(0)) */
static void test_torch_randn_matches_torch(void **state) {
    (void)state;
    ma_npz z;
    ma_error err = {0};
    assert_int_equal(ma_npz_read(MA_SOURCE_DIR "/assets/tiny-grid/golden/step0_boundary.npz", &z, &err), MA_OK);
    const ma_tensor *noise = ma_npz_get(&z, "noise");
    assert_non_null(noise);
    float mine[320];
    ma_torch_randn(0, 320, mine);
    const float *ref = noise->data;
    for (int i = 0; i < 320; i++)
        if (fabsf(mine[i] - ref[i]) > 1e-5f) fail_msg("randn[%d] = %g, torch %g", i, mine[i], ref[i]);
    ma_npz_free(&z);
}

static void test_normstats_formulas(void **state) {
    (void)state;
    const char *json = "{\"format\": \"molmoact2_norm_stats.v1\", \"norm_mode\": \"q01_q99\", \"metadata_by_tag\": {\"libero\": {"
                       "\"action_horizon\": 10, \"setup_type\": \"s\", \"control_mode\": \"c\","
                       "\"action_stats\": {\"q01\": [-1.0, 0.0, 2.0], \"q99\": [1.0, 4.0, 2.0], \"mask\": [true, true, false]},"
                       "\"state_stats\": {\"q01\": [-1.0, 0.0, 2.0], \"q99\": [1.0, 4.0, 2.0], \"min\": [-2, -1, 2], \"max\": [2, 5, 2],"
                       "\"mask\": [true, false, true]}}}}";
    ma_normstats ns;
    ma_error err = {0};
    assert_int_equal(ma_normstats_parse(json, "ns", "libero", &ns, &err), MA_OK);
    assert_int_equal(ns.action.dim, 3);
    assert_int_equal(ns.action_horizon, 10);
    float x[3] = {0.5f, -7.0f, 0.7f}, y[3];
    assert_int_equal(ma_unnormalize(&ns, &ns.action, x, y, &err), MA_OK);
    assert_true(fabsf(y[0] - ((0.5f + 1) / 2 * 2 - 1)) < 1e-6f);
    assert_true(fabsf(y[1] - 0.0f) < 1e-6f); /* clipped to -1 -> q01 */
    assert_true(y[2] == 0.7f);               /* mask false: clipped value passes through */
    float s[3] = {0.5f, 0.03f, 2.0f};
    ma_normalize(&ns, &ns.state, s, y);
    assert_true(fabsf(y[0] - 0.5f) < 1e-6f);
    assert_true(y[1] == 0.03f);
    assert_true(y[2] == 0.0f); /* min == max -> 0 */
    assert_fails_naming(ma_normstats_parse(json, "ns", "droid", &ns, &err), err, "droid");
    assert_fails_naming(ma_normstats_parse("{\"format\": \"v0\"}", "ns", "libero", &ns, &err), err, "format");
    const char *bad = "{\"format\": \"molmoact2_norm_stats.v1\", \"norm_mode\": \"q01_q99\", \"metadata_by_tag\": {\"libero\": {"
                      "\"action_stats\": {\"q01\": [0.0, 1.0], \"q99\": [1.0]}}}}";
    assert_fails_naming(ma_normstats_parse(bad, "ns", "libero", &ns, &err), err, "q99");
    /* inverted or empty ranges, a negative horizon, a declared action dim, are refused by name */
    const char *tmpl = "{\"format\": \"molmoact2_norm_stats.v1\", \"norm_mode\": \"q01_q99\", \"metadata_by_tag\": {\"libero\": {"
                       "%s \"action_stats\": {\"q01\": [%s], \"q99\": [1.0, 1.0]%s}}}}";
    char b[512];
    snprintf(b, sizeof b, tmpl, "", "-1.0, 1.0", "");
    assert_fails_naming(ma_normstats_parse(b, "ns", "libero", &ns, &err), err, "q01[1] = 1 is not below q99[1] = 1");
    snprintf(b, sizeof b, tmpl, "", "-1.0, 2.0", "");
    assert_fails_naming(ma_normstats_parse(b, "ns", "libero", &ns, &err), err, "q01[1]");
    snprintf(b, sizeof b, tmpl, "", "-1.0, 2.0", ", \"mask\": [true, false]"); /* unused dimension */
    assert_int_equal(ma_normstats_parse(b, "ns", "libero", &ns, &err), MA_OK);
    snprintf(b, sizeof b, tmpl, "", "-1.0, 0.0", ", \"min\": [0, 3], \"max\": [1, 2]");
    assert_fails_naming(ma_normstats_parse(b, "ns", "libero", &ns, &err), err, "min[1] = 3 exceeds max[1] = 2");
    snprintf(b, sizeof b, tmpl, "\"action_horizon\": -10,", "-1.0, 0.0", "");
    assert_fails_naming(ma_normstats_parse(b, "ns", "libero", &ns, &err), err, "action_horizon");
    snprintf(b, sizeof b, tmpl, "\"n_action_steps\": 2.5,", "-1.0, 0.0", "");
    assert_fails_naming(ma_normstats_parse(b, "ns", "libero", &ns, &err), err, "n_action_steps");
    snprintf(b, sizeof b, tmpl, "\"action_dim\": 64,", "-1.0, 0.0", "");
    assert_int_equal(ma_normstats_parse(b, "ns", "libero", &ns, &err), MA_OK);
    assert_int_equal(ns.action_dim, 64); /* checked against max_action_dim by ma_model_open */
    assert_fails_naming(ma_normstats_parse("{\"format\": ", "ns.json", "libero", &ns, &err), err, "ns.json: JSON syntax error");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encoder_and_image_masks),
        cmocka_unit_test(test_split_ranges),
        cmocka_unit_test(test_torch_randn_matches_torch),
        cmocka_unit_test(test_normstats_formulas),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
