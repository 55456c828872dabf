/* SPDX-License-Identifier: Apache-2.0 */
#include "../test_util.h"

#include "model/config.h"

static const char *upstream_config(void) {
    static char path[1200];
    const char *env = getenv("MOLMOACT_UPSTREAM_FIXTURE");
    snprintf(path, sizeof path, "%s/full/config.json", env ? env : MA_SOURCE_DIR "/tests/fixtures/upstream-tiny");
    return path;
}

static void test_committed_tiny_config(void **state) {
    (void)state;
    ma_config c;
    ma_error err = {0};
    assert_int_equal(ma_config_load(MA_SOURCE_DIR "/assets/tiny-grid/model/config.json", &c, &err), MA_OK);
    assert_int_equal(c.patch_h, 27);
    assert_int_equal(c.pooled_h, 14);
    assert_int_equal(c.vit_built, 8);          /* taps (-3, -9) of 10 -> blocks 7 and 1 */
    assert_int_equal(c.taps[0], 7);
    assert_int_equal(c.taps[1], 1);
    assert_int_equal(c.layers, 4);
    assert_int_equal(c.e_layers, 4);
    assert_int_equal(c.e_inner, 256);          /* round_up(int(64 * 8/3) = 170, 256) */
    assert_int_equal(c.image_patch_id, 155650);
    assert_int_equal(c.eos_id, 151645);
    assert_true(c.qk_norm && c.qk_norm_qwen3 && c.pool_mask && c.action_mode_both);
    assert_true(c.rope_theta == 5e6);
}

static void test_upstream_fixture_config(void **state) {
    (void)state;
    const char *p = upstream_config();
    if (!ma_is_file(p)) skip();
    ma_config c;
    ma_error err = {0};
    assert_int_equal(ma_config_load(p, &c, &err), MA_OK);
    assert_int_equal(c.d, 96);
    assert_int_equal(c.e_heads, 2);
    assert_int_equal(c.e_head_dim, 32);
    assert_int_equal(c.max_action_horizon, 10);
}

static ma_status parse(const char *json, ma_error *err) {
    ma_config c;
    return ma_config_parse(json, "config.json", &c, err);
}

static void test_refusals_name_the_field(void **state) {
    (void)state;
    ma_error err = {0};
    const char *base = "{\"image_patch_id\": 5, \"eos_token_id\": 1, \"vit_config\": {\"image_num_pos\": 729}, "
                       "\"text_config\": {\"hidden_size\": 3584%s}%s}";
    char buf[512];
    snprintf(buf, sizeof buf, base, "", "");
    assert_int_equal(parse(buf, &err), MA_OK);   /* upstream defaults, expert = one block per LLM layer */
    snprintf(buf, sizeof buf, base, ", \"sliding_window\": 4", "");
    assert_fails_naming(parse(buf, &err), err, "text_config.sliding_window");
    snprintf(buf, sizeof buf, base, ", \"rope_scaling\": {\"type\": \"yarn\"}", "");
    assert_fails_naming(parse(buf, &err), err, "rope_scaling");
    snprintf(buf, sizeof buf, base, ", \"sliding_window\": null", "");
    assert_int_equal(parse(buf, &err), MA_OK); /* its neutral value */
    /* a field nobody here knows: ignored, listed for inspect */
    snprintf(buf, sizeof buf, base, "", ", \"surprise\": 1");
    ma_config cu;
    assert_int_equal(ma_config_parse(buf, "config.json", &cu, &err), MA_OK);
    assert_string_equal(cu.unknown, "surprise");
    snprintf(buf, sizeof buf, base, ", \"num_hidden_layers\": 2.5", "");
    assert_fails_naming(parse(buf, &err), err, "num_hidden_layers");
    snprintf(buf, sizeof buf, base, "", ", \"action_mode\": \"discrete\"");
    assert_fails_naming(parse(buf, &err), err, "action_mode");
    snprintf(buf, sizeof buf, base, "", ", \"enable_depth_reasoning\": true");
    assert_fails_naming(parse(buf, &err), err, "enable_depth_reasoning");
    snprintf(buf, sizeof buf, base, "", ", \"action_expert_config\": {\"num_layers\": 3}");
    assert_fails_naming(parse(buf, &err), err, "num_layers");
    /* the expert's inner width: a hostile hidden_size x mlp_ratio or multiple must not overflow */
    snprintf(buf, sizeof buf, base, "", ", \"action_expert_config\": {\"hidden_size\": 2000000000, \"num_heads\": 1}");
    assert_fails_naming(parse(buf, &err), err, "action_expert_config.hidden_size must be in");
    snprintf(buf, sizeof buf, base, "", ", \"action_expert_config\": {\"mlp_ratio\": 1e300}");
    assert_fails_naming(parse(buf, &err), err, "mlp_ratio");
    snprintf(buf, sizeof buf, base, "", ", \"action_expert_config\": {\"ffn_multiple_of\": 2147483647}");
    assert_fails_naming(parse(buf, &err), err, "ffn_multiple_of");
    snprintf(buf, sizeof buf, base, "", ", \"adapter_config\": {\"vit_layers\": [-30]}");
    assert_fails_naming(parse(buf, &err), err, "vit_layers");
    assert_fails_naming(parse("{not json", &err), err, "JSON");
    assert_fails_naming(parse("{\"vit_config\": 3}", &err), err, "vit_config");
    /* a section that is an array: its items have no names (fuzz_json found the unknown-key
     * listing reading them as NULL) */
    assert_fails_naming(parse("{\"adapter_config\": [2, -4], \"text_config\": [{\"a\": 1}]}", &err), err, "adapter_config is not an object");
    /* size-like fields are bounded (a huge flow_matching_num_steps hung run and made compile
     * allocate 512 GB), epsilons and the RoPE base must be positive */
    snprintf(buf, sizeof buf, base, "", ", \"flow_matching_num_steps\": 100000");
    assert_fails_naming(parse(buf, &err), err, "flow_matching_num_steps must be in [1, 256]");
    snprintf(buf, sizeof buf, base, "", ", \"flow_matching_num_steps\": 1e9");
    assert_fails_naming(parse(buf, &err), err, "flow_matching_num_steps");
    snprintf(buf, sizeof buf, base, "", ", \"max_action_horizon\": 5000000");
    assert_fails_naming(parse(buf, &err), err, "max_action_horizon");
    snprintf(buf, sizeof buf, base, "", ", \"max_action_dim\": 100000");
    assert_fails_naming(parse(buf, &err), err, "max_action_dim");
    snprintf(buf, sizeof buf, base, ", \"vocab_size\": 2000000000", "");
    assert_fails_naming(parse(buf, &err), err, "text_config.vocab_size");
    snprintf(buf, sizeof buf, base, ", \"rope_theta\": 0", "");
    assert_fails_naming(parse(buf, &err), err, "text_config.rope_theta must be > 0");
    snprintf(buf, sizeof buf, base, ", \"rope_theta\": -5", "");
    assert_fails_naming(parse(buf, &err), err, "rope_theta");
    snprintf(buf, sizeof buf, base, ", \"layer_norm_eps\": 0", "");
    assert_fails_naming(parse(buf, &err), err, "text_config.layer_norm_eps must be > 0");
    assert_fails_naming(parse("{\"image_patch_id\": 5, \"eos_token_id\": 1, \"vit_config\": {\"image_num_pos\": 729, "
                              "\"layer_norm_eps\": -1e-6}}", &err), err, "vit_config.layer_norm_eps");
    snprintf(buf, sizeof buf, base, "", ", \"grid_token_sampler_num_tokens\": -3");
    assert_fails_naming(parse(buf, &err), err, "grid_token_sampler_num_tokens");
    /* a syntax error gives its line and column */
    assert_fails_naming(parse("{\n  \"a\": 1,\n  \"b\" 2\n}", &err), err, "line 3, column 7");
    assert_fails_naming(parse("[1, 2]", &err), err, "not a JSON object");
    /* upstream's default image_num_pos (577) does not fit the 27x27 patch grid */
    assert_fails_naming(parse("{\"image_patch_id\": 5, \"eos_token_id\": 1}", &err), err, "image_num_pos");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_committed_tiny_config),
        cmocka_unit_test(test_upstream_fixture_config),
        cmocka_unit_test(test_refusals_name_the_field),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
