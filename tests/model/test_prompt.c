/* SPDX-License-Identifier: Apache-2.0 */
#include "../test_util.h"

#include "model/checkpoint.h"
#include "model/prompt.h"

static void expect_task(const char *in, const char *want) {
    char *out;
    ma_error err = {0};
    if (ma_normalize_task(in, strlen(in), &out, &err)) fail_msg("%s", err.msg);
    if (strcmp(out, want)) fail_msg("normalize(%s) = \"%s\", want \"%s\"", in, out, want);
    free(out);
}

static void test_task_normalisation(void **state) {
    (void)state;
    expect_task("Turn on the stove and put the moka pot on it.", "turn on the stove and put the moka pot on it");
    expect_task("Task: push the plate to the front of the stove", "push the plate to the front of the stove");
    expect_task("  \"pick up the book.\"  ", "pick up the book");
    expect_task("The task is to open the drawer!", "open the drawer");
    expect_task("open the drawer. Then close it?", "open the drawer; then close it");
    expect_task("   ", "");
    expect_task("goal:stack   the\tblocks", "stack the blocks");
    expect_task("\xc4\xb0STANBUL", "i\xcc\x87stanbul"); /* Python lower(): U+0130 -> i + U+0307 */
    expect_task("\xce\xa3\xce\x9f\xce\xa6\xce\x9f\xce\xa3", "\xcf\x83\xce\xbf\xcf\x86\xce\xbf\xcf\x82"); /* final sigma */
}

static void test_state_bins(void **state) {
    (void)state;
    assert_int_equal(ma_state_bin(NAN, 256), 128); /* nan -> 0 -> rint(127.5) = 128 */
    assert_int_equal(ma_state_bin(INFINITY, 256), 255);
    assert_int_equal(ma_state_bin(-INFINITY, 256), 0);
    assert_int_equal(ma_state_bin(-1.0f, 256), 0);
    assert_int_equal(ma_state_bin(1.0f, 256), 255);
    assert_int_equal(ma_state_bin(7.0f, 256), 255); /* clipped */
    assert_int_equal(ma_state_bin(1.0f / 255.0f, 256), 128);
}

static void test_prompt_layout(void **state) {
    (void)state;
    ma_model m;
    ma_error err = {0};
    assert_int_equal(ma_model_open(MA_SOURCE_DIR "/assets/tiny-grid/model", "libero", &m, &err), MA_OK);
    float st[8] = {0.1f, 0.2f, 1.0f, 3.0f, 0.1f, 0.1f, 0.02f, -0.02f};
    ma_prompt_opts o = {m.tokens_per_image, 2, m.col_tokens, 1};
    ma_prompt p;
    const char *task = "Task: put the bowl on the plate.";
    assert_int_equal(ma_build_prompt(&m.cfg, &m.ns, m.tok, &o, task, strlen(task), st, 8, &p, &err), MA_OK);
    assert_int_equal(p.ids[0], 151645);
    int patches = 0, states = 0;
    for (int64_t i = 0; i < p.n; i++) {
        patches += p.ids[i] == m.cfg.image_patch_id;
        states += p.ids[i] >= 151675 && p.ids[i] < 151675 + 256;
    }
    assert_int_equal(patches, 32);
    assert_int_equal(states, 8);
    assert_int_equal(p.ids[p.n - 1], 151931); /* <action_output> closes the prompt */
    assert_string_equal(p.task, "put the bowl on the plate");
    assert_non_null(strstr(p.text, "<setup_start>single franka robotic arm in libero<setup_end>"));
    ma_prompt_free(&p);
    assert_fails_naming(ma_build_prompt(&m.cfg, &m.ns, m.tok, &o, task, strlen(task), st, 7, &p, &err), err, "state has 7");
    assert_fails_naming(ma_build_prompt(&m.cfg, &m.ns, m.tok, &o, "\xff", 1, st, 8, &p, &err), err, "UTF-8");
    char *huge = malloc(MA_TASK_MAX_BYTES + 10);
    memset(huge, 'a', MA_TASK_MAX_BYTES + 10);
    assert_fails_naming(ma_build_prompt(&m.cfg, &m.ns, m.tok, &o, huge, MA_TASK_MAX_BYTES + 10, st, 8, &p, &err), err, "limit");
    free(huge);
    ma_model_close(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_task_normalisation),
        cmocka_unit_test(test_state_bins),
        cmocka_unit_test(test_prompt_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
