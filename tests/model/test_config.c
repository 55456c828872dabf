/* SPDX-License-Identifier: Apache-2.0 */
#define _DEFAULT_SOURCE /* symlink */
#include "../test_util.h"

#include "model/config.h"
#include "runtime/observation.h"
#include "io/mapfile.h"

#include <cjson/cJSON.h>
#include <unistd.h>

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
    assert_int_equal(c.vit_built, 8); /* taps (-3, -9) of 10 -> blocks 7 and 1 */
    assert_int_equal(c.taps[0], 7);
    assert_int_equal(c.taps[1], 1);
    assert_int_equal(c.layers, 4);
    assert_int_equal(c.e_layers, 4);
    assert_int_equal(c.e_inner, 256); /* round_up(int(64 * 8/3) = 170, 256) */
    assert_int_equal(c.image_patch_id, 155650);
    assert_int_equal(c.eos_id, 151645);
    assert_true(c.qk_norm && c.qk_norm_qwen3 && c.pool_mask && c.action_mode_both);
    assert_true(c.rope_theta == 5e6);
    assert_int_equal(c.max_positions, 36864);
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
    assert_int_equal(parse(buf, &err), MA_OK); /* upstream defaults, expert = one block per LLM layer */
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
    assert_fails_naming(parse("{\"adapter_config\": [2, -4], \"text_config\": [{\"a\": 1}]}", &err), err,
                        "adapter_config is not an object");
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
                              "\"layer_norm_eps\": -1e-6}}",
                              &err),
                        err, "vit_config.layer_norm_eps");
    snprintf(buf, sizeof buf, base, "", ", \"grid_token_sampler_num_tokens\": -3");
    assert_fails_naming(parse(buf, &err), err, "grid_token_sampler_num_tokens");
    /* a syntax error gives its line and column */
    assert_fails_naming(parse("{\n  \"a\": 1,\n  \"b\" 2\n}", &err), err, "line 3, column 7");
    assert_fails_naming(parse("[1, 2]", &err), err, "not a JSON object");
    /* upstream's default image_num_pos (577) does not fit the 27x27 patch grid */
    assert_fails_naming(parse("{\"image_patch_id\": 5, \"eos_token_id\": 1}", &err), err, "image_num_pos");
}

/* issue 36: a rope_scaling of type "default" changes nothing and is accepted (its theta, when
 * given, must agree); any other type is still refused by name */
static void test_rope_scaling_default_is_accepted(void **state) {
    (void)state;
    ma_error err = {0};
    const char *base = "{\"image_patch_id\": 5, \"eos_token_id\": 1, \"vit_config\": {\"image_num_pos\": 729}, "
                       "\"text_config\": {\"rope_theta\": 5000000.0, \"rope_scaling\": %s}}";
    char buf[512];
    const char *ok[] = {"{\"rope_type\": \"default\"}", "{\"type\": \"default\"}",
                        "{\"rope_type\": \"default\", \"type\": \"default\", \"rope_theta\": 5e6}",
                        "{\"rope_type\": \"default\", \"rope_theta\": null}", NULL};
    for (int i = 0; ok[i]; i++) {
        snprintf(buf, sizeof buf, base, ok[i]);
        ma_config c;
        if (ma_config_parse(buf, "config.json", &c, &err)) fail_msg("%s: %s", ok[i], err.msg);
        assert_true(c.rope_theta == 5e6);
        assert_string_equal(c.unknown, "");
    }
    /* a key the default RoPE does not read: accepted, listed for inspect */
    snprintf(buf, sizeof buf, base, "{\"rope_type\": \"default\", \"factor\": 1.0}");
    ma_config cu;
    assert_int_equal(ma_config_parse(buf, "config.json", &cu, &err), MA_OK);
    assert_string_equal(cu.unknown, "text_config.rope_scaling.factor");
    struct {
        const char *rs, *needle;
    } bad[] = {
        {"{\"rope_type\": \"yarn\", \"factor\": 2.0}", "text_config.rope_scaling.rope_type yarn is not supported"},
        {"{\"type\": \"linear\", \"factor\": 2.0}", "text_config.rope_scaling.type linear"},
        {"{\"rope_type\": \"default\", \"type\": \"dynamic\"}", "rope_scaling.type dynamic"},
        {"{\"factor\": 2.0}", "rope_scaling has no rope_type"},
        {"{\"rope_type\": 1}", "rope_scaling.rope_type (not a string)"},
        {"{\"rope_type\": \"default\", \"rope_theta\": 10000}",
         "rope_scaling.rope_theta 10000 disagrees with text_config.rope_theta 5e+06"},
        {"{\"rope_type\": \"default\", \"rope_theta\": \"x\"}", "rope_scaling.rope_theta must be a number"},
        {"\"default\"", "rope_scaling must be an object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(buf, sizeof buf, base, bad[i].rs);
        assert_fails_naming(parse(buf, &err), err, bad[i].needle);
    }
}

/* issue 36: the position limit is the config's max_position_embeddings (upstream's default 4096
 * when absent), bounded like the other size-like fields */
static void test_max_position_embeddings(void **state) {
    (void)state;
    ma_error err = {0};
    const char *base = "{\"image_patch_id\": 5, \"eos_token_id\": 1, \"vit_config\": {\"image_num_pos\": 729}, "
                       "\"text_config\": {\"hidden_size\": 3584%s}}";
    char buf[512];
    ma_config c;
    snprintf(buf, sizeof buf, base, "");
    assert_int_equal(ma_config_parse(buf, "config.json", &c, &err), MA_OK);
    assert_int_equal(c.max_positions, 4096);
    snprintf(buf, sizeof buf, base, ", \"max_position_embeddings\": 16384");
    assert_int_equal(ma_config_parse(buf, "config.json", &c, &err), MA_OK);
    assert_int_equal(c.max_positions, 16384);
    snprintf(buf, sizeof buf, base, ", \"max_position_embeddings\": 0");
    assert_fails_naming(parse(buf, &err), err, "text_config.max_position_embeddings must be in");
    snprintf(buf, sizeof buf, base, ", \"max_position_embeddings\": 1e12");
    assert_fails_naming(parse(buf, &err), err, "text_config.max_position_embeddings");
}

/* the tiny model with config.json's max_position_embeddings set to `limit` (the other files linked) */
static void tiny_with_limit(const char *dir, int limit) {
    const char *src = MA_SOURCE_DIR "/assets/tiny-grid/model";
    const char *files[] = {"model.safetensors", "tokenizer.json", "norm_stats.json", "processor_config.json"};
    char a[1400], b[1400];
    for (int i = 0; i < 4; i++) {
        snprintf(a, sizeof a, "%s/%s", src, files[i]);
        snprintf(b, sizeof b, "%s/%s", dir, files[i]);
        if (symlink(a, b)) fail_msg("cannot link %s", b);
    }
    ma_error err = {0};
    char *text = NULL;
    snprintf(a, sizeof a, "%s/config.json", src);
    if (ma_read_file(a, 1u << 20, &text, NULL, &err)) fail_msg("%s", err.msg);
    cJSON *root = cJSON_Parse(text);
    free(text);
    assert_non_null(root);
    cJSON *tx = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    assert_non_null(tx);
    cJSON_ReplaceItemInObjectCaseSensitive(tx, "max_position_embeddings", cJSON_CreateNumber(limit));
    char *out = cJSON_Print(root);
    cJSON_Delete(root);
    snprintf(b, sizeof b, "%s/config.json", dir);
    FILE *f = fopen(b, "w");
    assert_non_null(f);
    fputs(out, f);
    fclose(f);
    free(out);
}

static ma_status prepare(const ma_model *m, const char *task, ma_prepared *p, ma_error *err) {
    static uint8_t px[8 * 8 * 3];
    const ma_image im[2] = {{8, 8, px}, {8, 8, px}};
    const float st[8] = {0};
    return ma_prepare_observation(m, im, 2, task, strlen(task), st, 8, p, err);
}

/* issue 36: a prompt longer than the config's max_position_embeddings is refused, the error
 * naming the limit (it was a hard-coded 36864) */
static void test_long_prompt_refused_at_the_configs_limit(void **state) {
    (void)state;
    ma_model m;
    ma_prepared p;
    ma_error err = {0};
    /* the committed model (36864 positions) takes a prompt of a few hundred tokens */
    if (ma_model_open(MA_SOURCE_DIR "/assets/tiny-grid/model", "libero", &m, &err)) fail_msg("%s", err.msg);
    if (prepare(&m, "pick up the bowl", &p, &err)) fail_msg("%s", err.msg);
    const int64_t n_short = p.prompt.n;
    ma_prepared_free(&p);
    ma_model_close(&m);
    char task[2048];
    memset(task, 'a', sizeof task - 1); /* 2047 bytes of words: the byte-level stand-in makes a token of each */
    for (size_t i = 5; i < sizeof task - 1; i += 6) task[i] = ' ';
    task[sizeof task - 1] = 0;
    char dir[1024];
    tu_tmpdir(dir, sizeof dir, "max-positions");
    const int limit = (int)n_short + 50;
    tiny_with_limit(dir, limit);
    if (ma_model_open(dir, "libero", &m, &err)) fail_msg("%s: %s", dir, err.msg);
    assert_int_equal(m.cfg.max_positions, limit);
    if (prepare(&m, "pick up the bowl", &p, &err)) fail_msg("a prompt of %lld tokens under %d: %s", (long long)n_short, limit, err.msg);
    ma_prepared_free(&p);
    char needle[96];
    snprintf(needle, sizeof needle, "more than the model's %d positions (text_config.max_position_embeddings)", limit);
    assert_fails_naming(prepare(&m, task, &p, &err), err, needle);
    ma_model_close(&m);
    tu_rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_committed_tiny_config),   cmocka_unit_test(test_upstream_fixture_config),
        cmocka_unit_test(test_refusals_name_the_field), cmocka_unit_test(test_rope_scaling_default_is_accepted),
        cmocka_unit_test(test_max_position_embeddings), cmocka_unit_test(test_long_prompt_refused_at_the_configs_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
