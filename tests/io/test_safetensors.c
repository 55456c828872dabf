/* SPDX-License-Identifier: Apache-2.0 */
#include "../test_util.h"

#include "core/half.h"
#include "io/safetensors.h"

static void write_blob(const char *path, const void *p, size_t n) {
    ma_error err = {0};
    if (ma_write_file(path, p, n, &err)) fail_msg("%s", err.msg);
}

/* a valid file image with one F32 [2, 3] tensor "w", built by hand */
static size_t hand_file(uint8_t *buf, const char *header, size_t data_len) {
    size_t raw = strlen(header), hl = (raw + 7) / 8 * 8; /* pad with spaces so data starts 8-aligned */
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, raw);
    memset(buf + 8 + raw, ' ', hl - raw);
    for (size_t i = 0; i < data_len; i++) buf[8 + hl + i] = (uint8_t)i;
    return 8 + hl + data_len;
}

static void test_round_trip(void **state) {
    (void)state;
    char dir[1024], path[1100];
    tu_tmpdir(dir, sizeof dir, "st-rt");
    snprintf(path, sizeof path, "%s/x.safetensors", dir);
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t h[4], b[4];
    for (int i = 0; i < 4; i++) {
        h[i] = ma_f32_to_f16((float)i * 0.5f);
        b[i] = ma_f32_to_bf16((float)i * -1.25f);
    }
    int64_t sa[2] = {2, 3}, sh[1] = {4}, sb[2] = {2, 2};
    ma_st_entry e[3] = {{"zeta.f32", MA_DT_F32, 2, sa, a}, {"alpha.f16", MA_DT_F16, 1, sh, h}, {"mid.bf16", MA_DT_BF16, 2, sb, b}};
    ma_error err = {0};
    assert_int_equal(ma_st_write(path, e, 3, &err), MA_OK);
    ma_safetensors st;
    assert_int_equal(ma_st_open(&st, path, &err), MA_OK);
    assert_int_equal(st.count, 3);
    assert_string_equal(st.tensors[0].name, "alpha.f16"); /* sorted */
    const ma_st_tensor *t = ma_st_find(&st, "zeta.f32");
    assert_non_null(t);
    assert_int_equal(t->dtype, MA_DT_F32);
    assert_int_equal(t->shape[1], 3);
    assert_memory_equal(t->data, a, sizeof a);
    t = ma_st_find(&st, "mid.bf16");
    assert_memory_equal(t->data, b, sizeof b);
    assert_null(ma_st_find(&st, "nope"));
    ma_st_close(&st);
    tu_rmdir(dir);
}

static void expect_refused(const char *header, size_t data_len, const char *needle) {
    uint8_t buf[4096];
    size_t n = hand_file(buf, header, data_len);
    ma_st_tensor *ts;
    size_t count;
    ma_error err = {0};
    ma_status s = ma_st_parse(buf, n, "hostile", &ts, &count, &err);
    if (s == MA_OK) fail_msg("accepted: %s", header);
    if (needle && !strstr(err.msg, needle)) fail_msg("message \"%s\" lacks \"%s\"", err.msg, needle);
}

static void test_hostile_headers(void **state) {
    (void)state;
    /* the valid baseline (header of 72 bytes keeps the data 8-aligned) */
    const char *ok = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}";
    uint8_t buf[4096];
    size_t n = hand_file(buf, ok, 24);
    ma_st_tensor *ts;
    size_t count;
    ma_error err = {0};
    assert_int_equal(ma_st_parse(buf, n, "ok", &ts, &count, &err), MA_OK);
    ma_st_free_tensors(ts, count);
    expect_refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,28]}}", 24, "w"); /* beyond data */
    expect_refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,4],\"data_offsets\":[0,24]}}", 24, "w"); /* shape mismatch */
    expect_refused("{\"w\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[0,24]}}", 24, "I64"); /* dtype named */
    expect_refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[-2,3],\"data_offsets\":[0,24]}}", 24, "w");
    expect_refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3]}}", 24, "w"); /* no offsets */
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
                   24, "overlap");
    expect_refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[2,10]}}", 24, "aligned");
    expect_refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                   "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                   24, "twice");
    expect_refused("[1,2,3]", 0, "object");
    expect_refused("{\"w\": ", 0, "header: JSON syntax error");
    /* truncated: every prefix of the valid file is refused (no crash, no over-read under ASan) */
    for (size_t cut = 0; cut < n; cut++) {
        uint8_t *copy = malloc(cut ? cut : 1);
        memcpy(copy, buf, cut);
        assert_int_not_equal(ma_st_parse(copy, cut, "cut", &ts, &count, &err), MA_OK);
        free(copy);
    }
    /* header length larger than the file */
    uint8_t big[16] = {0};
    big[0] = 0xff;
    big[1] = 0xff;
    big[2] = 0xff;
    big[3] = 0x7f;
    assert_int_not_equal(ma_st_parse(big, sizeof big, "big", &ts, &count, &err), MA_OK);
}

static void test_sharded_index(void **state) {
    (void)state;
    char dir[1024], p[1200];
    tu_tmpdir(dir, sizeof dir, "st-shard");
    float a[2] = {1, 2}, b[3] = {3, 4, 5};
    int64_t sa[1] = {2}, sb[1] = {3};
    ma_error err = {0};
    ma_st_entry ea = {"t.a", MA_DT_F32, 1, sa, a}, eb = {"t.b", MA_DT_F32, 1, sb, b};
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    assert_int_equal(ma_st_write(p, &ea, 1, &err), MA_OK);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    assert_int_equal(ma_st_write(p, &eb, 1, &err), MA_OK);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    const char *idx = "{\"metadata\":{},\"weight_map\":{\"t.a\":\"model-00001-of-00002.safetensors\","
                      "\"t.b\":\"model-00002-of-00002.safetensors\"}}";
    write_blob(p, idx, strlen(idx));
    ma_safetensors st;
    assert_int_equal(ma_st_open(&st, dir, &err), MA_OK);
    assert_int_equal(st.count, 2);
    assert_int_equal(st.nfiles, 2);
    assert_memory_equal(ma_st_find(&st, "t.b")->data, b, sizeof b);
    ma_st_close(&st);
    /* the index places a tensor in the wrong shard */
    const char *wrong = "{\"weight_map\":{\"t.a\":\"model-00002-of-00002.safetensors\","
                        "\"t.b\":\"model-00002-of-00002.safetensors\"}}";
    write_blob(p, wrong, strlen(wrong));
    assert_fails_naming(ma_st_open(&st, dir, &err), err, "t.a");
    /* path traversal in a shard name */
    const char *evil = "{\"weight_map\":{\"t.a\":\"../x.safetensors\"}}";
    write_blob(p, evil, strlen(evil));
    assert_fails_naming(ma_st_open(&st, dir, &err), err, "plain file name");
    tu_rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_hostile_headers),
        cmocka_unit_test(test_sharded_index),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
