/* SPDX-License-Identifier: Apache-2.0 */
/* The settings struct (core/settings.h): each value checked against its row wherever it comes
 * from, the source named in the error; the start message's encoding round-trips every field; the
 * environment read through the table only, never written. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "core/env.h"
#include "core/settings.h"

static void expect_fail(ma_status s, const ma_error *err, const char *needle) {
    assert_int_not_equal(s, MA_OK);
    if (!strstr(err->msg, needle)) fail_msg("\"%s\" does not say \"%s\"", err->msg, needle);
}

static void test_values_checked_and_sources_named(void **state) {
    (void)state;
    ma_settings st;
    ma_settings_init(&st);
    ma_error err = {0};
    assert_int_equal(st.qnn_soc, -1);
    assert_int_equal(ma_settings_set(&st, "threads", "4", "--threads", &err), MA_OK);
    assert_int_equal(st.threads, 4);
    expect_fail(ma_settings_set(&st, "threads", "0", "MOLMOACT_THREADS", &err), &err, "MOLMOACT_THREADS=0: must be an integer in [1, 64]");
    expect_fail(ma_settings_set(&st, "threads", " 2", "--threads", &err), &err, "--threads  2");
    expect_fail(ma_settings_set(&st, "threads", "+2", "options.threads", &err), &err, "options.threads +2");
    expect_fail(ma_settings_set(&st, "threads", "99999999999999999999", "x", &err), &err, "must be an integer");
    expect_fail(ma_settings_set(&st, "backend", "npu", "--backend", &err), &err, "--backend npu: must be cpu or qnn");
    expect_fail(ma_settings_set(&st, "qnn_perf", "turbo", "MOLMOACT_QNN_PERF", &err), &err, "must be default, high or burst");
    expect_fail(ma_settings_set(&st, "kernels", "sse9", "MOLMOACT_KERNELS", &err), &err, "unknown kernel set");
    expect_fail(ma_settings_set(&st, "llm_suffix", "a/b", "LLM_CTX_SUFFIX", &err), &err, "LLM_CTX_SUFFIX=a/b: a suffix");
    expect_fail(ma_settings_set(&st, "llm_suffix", "..", "LLM_CTX_SUFFIX", &err), &err, "suffix");
    char longer[200];
    memset(longer, 'x', sizeof longer - 1);
    longer[sizeof longer - 1] = '\0';
    expect_fail(ma_settings_set(&st, "vision_suffix", longer, "options.vision_suffix", &err), &err, "suffix");
    expect_fail(ma_settings_set(&st, "qnn_perf", longer, "--qnn-perf", &err), &err, "must be");
    expect_fail(ma_settings_set(&st, "base_dir", "a\nb", "--base", &err), &err, "line break");
    expect_fail(ma_settings_set(&st, "nothing", "1", "--x", &err), &err, "no setting is called nothing");
    expect_fail(ma_settings_set(&st, "preload", "yes", "MOLMOACT_PRELOAD", &err), &err, "must be 0 or 1");
    char *path = malloc(MA_SETTINGS_PATH + 10);
    memset(path, 'p', MA_SETTINGS_PATH + 9);
    path[MA_SETTINGS_PATH + 9] = '\0';
    expect_fail(ma_settings_set(&st, "qnn_lib_dir", path, "--qnn-lib-dir", &err), &err, "longer than 4095");
    free(path);
    assert_int_equal(ma_settings_set(&st, "qnn_soc", "4294967295", "--qnn-soc", &err), MA_OK);
    assert_int_equal(st.qnn_soc, 4294967295L);
    expect_fail(ma_settings_set(&st, "qnn_soc", "4294967296", "--qnn-soc", &err), &err, "[1, 4294967295]");
    assert_int_equal(ma_settings_set(&st, "backend", "", "--backend", &err), MA_OK); /* "" resets */
    assert_string_equal(st.backend, "");
}

static void test_encoding_round_trips(void **state) {
    (void)state;
    ma_settings a, b;
    ma_settings_init(&a);
    ma_error err = {0};
    const char *kv[][2] = {{"backend", "qnn"},
                           {"threads", "3"},
                           {"kernels", "portable"},
                           {"gemm_panels", "convert"},
                           {"gemm_parts", "2"},
                           {"compute", "bf16"},
                           {"preload", "1"},
                           {"prompt_seq", "400"},
                           {"vision_suffix", "_a"},
                           {"llm_suffix", "_w4a16"},
                           {"action_suffix", "_q"},
                           {"base_dir", "/b a se"},
                           {"hub_cache", "/h=c"},
                           {"worker_exe", "/bin/x"},
                           {"worker_deadline_ms", "1234"},
                           {"verbose", "1"},
                           {"progress", "1"},
                           {"qnn_lib_dir", "/q l"},
                           {"qnn_io_map", "/m.json"},
                           {"qnn_soc", "77"},
                           {"qnn_perf", "burst"},
                           {"qnn_zero_copy", "1"},
                           {"adsp_library_path", "/d;/e"}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        if (ma_settings_set(&a, kv[i][0], kv[i][1], "test", &err)) fail_msg("%s: %s", kv[i][0], err.msg);
    char buf[65536];
    const size_t n = ma_settings_encode(&a, buf, sizeof buf);
    assert_true(n > 0);
    assert_int_equal(ma_settings_decode(&b, buf, n, &err), MA_OK);
    assert_memory_equal(&a, &b, sizeof a); /* every field, qnn_arch's -1 included */
    assert_int_equal(b.qnn_arch, -1);
    assert_int_equal(ma_settings_encode(&a, buf, 10), 0); /* too small: nothing half-written taken */
    /* a start message that is not one */
    expect_fail(ma_settings_decode(&b, "threads=2", 9, &err), &err, "no end");
    expect_fail(ma_settings_decode(&b, "nope=1\n", 7, &err), &err, "nope");
    expect_fail(ma_settings_decode(&b, "threads=abc\n", 12, &err), &err, "threads");
    expect_fail(ma_settings_decode(&b, "garbage\n", 8, &err), &err, "malformed");
}

static void test_environment_read_through_the_table(void **state) {
    (void)state;
    ma_settings st;
    ma_error err = {0};
    setenv("MOLMOACT_THREADS", "5", 1);
    setenv("LLM_CTX_SUFFIX", "_old", 1); /* the reference deployment's name */
    setenv("MOLMOACT_PRELOAD", "", 1);   /* empty: off, as it always was */
    setenv("HF_HOME", "/hf", 1);
    unsetenv("HF_HUB_CACHE");
    unsetenv("HUGGINGFACE_HUB_CACHE");
    assert_int_equal(ma_settings_from_env(&st, &err), MA_OK);
    assert_int_equal(st.threads, 5);
    assert_string_equal(st.suffix[MA_SUFFIX_LLM], "_old");
    assert_int_equal(st.preload, 0);
    assert_string_equal(st.hub_cache, "/hf/hub");
    setenv("MOLMOACT_LLM_CTX_SUFFIX", "_new", 1);
    expect_fail(ma_settings_from_env(&st, &err), &err, "contradict");
    unsetenv("MOLMOACT_LLM_CTX_SUFFIX");
    setenv("MOLMOACT_THREADS", "abc", 1);
    expect_fail(ma_settings_from_env(&st, &err), &err, "MOLMOACT_THREADS=abc");
    unsetenv("MOLMOACT_THREADS");
    unsetenv("LLM_CTX_SUFFIX");
    unsetenv("MOLMOACT_PRELOAD");
    unsetenv("HF_HOME");
    /* every settings field has one row, and every row with a variable names a field or none */
    int rows = 0;
    for (int i = 0; i < MA_ENV_COUNT; i++) {
        const ma_env_var *e = &MA_ENV_VARS[i];
        if (!e->key) continue;
        rows++;
        assert_true(e->off + e->size <= sizeof(ma_settings));
        for (int j = 0; j < i; j++) assert_true(!MA_ENV_VARS[j].key || strcmp(MA_ENV_VARS[j].key, e->key));
    }
    assert_true(rows >= 25);
}

static void test_prompt_length_rule(void **state) {
    (void)state;
    ma_settings st;
    ma_settings_init(&st);
    assert_int_equal(ma_settings_prompt_seq(&st, 0, 400), 0);   /* a dynamic backend pads nothing */
    assert_int_equal(ma_settings_prompt_seq(&st, 1, 400), 400); /* the compiled length */
    assert_int_equal(ma_settings_prompt_seq(&st, 1, 0), 128);   /* the reference deployment's */
    st.prompt_seq = 300;
    assert_int_equal(ma_settings_prompt_seq(&st, 0, 400), 300);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values_checked_and_sources_named),
        cmocka_unit_test(test_encoding_round_trips),
        cmocka_unit_test(test_environment_read_through_the_table),
        cmocka_unit_test(test_prompt_length_rule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
