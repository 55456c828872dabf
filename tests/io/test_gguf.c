/* SPDX-License-Identifier: Apache-2.0 */
#include "../test_util.h"

#include "core/half.h"
#include "io/gguf.h"
#include "kernels/kernels.h"

static void test_round_trip(void **state) {
    (void)state;
    char dir[1024], path[1100];
    tu_tmpdir(dir, sizeof dir, "gguf-rt");
    snprintf(path, sizeof path, "%s/x.gguf", dir);
    float f[6] = {1, 2, 3, 4, 5, 6};
    uint16_t h[64];
    for (int i = 0; i < 64; i++) h[i] = ma_f32_to_f16((float)i / 8);
    uint8_t q8[2 * 34] = {0};
    q8[0] = 0x00;
    q8[1] = 0x3c; /* d = 1.0 */
    for (int i = 0; i < 32; i++) q8[2 + i] = (uint8_t)(int8_t)(i - 16);
    q8[34] = 0x00;
    q8[35] = 0x38; /* d = 0.5 */
    for (int i = 0; i < 32; i++) q8[36 + i] = (uint8_t)(int8_t)(3 * i - 40);
    uint8_t q4[18] = {0x00, 0x3c};
    for (int j = 0; j < 16; j++) q4[2 + j] = (uint8_t)((j & 0xf) | ((15 - j) << 4));
    ma_gguf_writer *w = ma_gguf_writer_new();
    ma_error err = {0};
    int64_t arr[3] = {9, 0, 27};
    assert_int_equal(ma_gguf_set_str(w, "general.architecture", "molmoact2", &err), MA_OK);
    assert_int_equal(ma_gguf_set_i64(w, "molmoact.layers", 36, &err), MA_OK);
    assert_int_equal(ma_gguf_set_u32(w, "molmoact.heads", 32, &err), MA_OK);
    assert_int_equal(ma_gguf_set_f32(w, "molmoact.eps", 1e-6f, &err), MA_OK);
    assert_int_equal(ma_gguf_set_f64(w, "molmoact.theta", 5e6, &err), MA_OK);
    assert_int_equal(ma_gguf_set_bool(w, "molmoact.qk_norm", 1, &err), MA_OK);
    assert_int_equal(ma_gguf_set_i64_array(w, "molmoact.range", arr, 3, &err), MA_OK);
    assert_int_not_equal(ma_gguf_set_u32(w, "molmoact.heads", 1, &err), MA_OK); /* duplicate key */
    int64_t sf[2] = {2, 3}, sh[2] = {2, 32}, sq8[2] = {1, 64}, sq4[1] = {32};
    assert_int_equal(ma_gguf_add_tensor(w, "w.f32", MA_DT_F32, 2, sf, f, &err), MA_OK);
    assert_int_equal(ma_gguf_add_tensor(w, "w.f16", MA_DT_F16, 2, sh, h, &err), MA_OK);
    assert_int_equal(ma_gguf_add_tensor(w, "w.q8", MA_DT_Q8_0, 2, sq8, q8, &err), MA_OK);
    assert_int_equal(ma_gguf_add_tensor(w, "w.q4", MA_DT_Q4_0, 1, sq4, q4, &err), MA_OK);
    int64_t bad[1] = {33};
    assert_int_not_equal(ma_gguf_add_tensor(w, "w.badq", MA_DT_Q8_0, 1, bad, q8, &err), MA_OK); /* not whole blocks */
    assert_int_equal(ma_gguf_write(w, path, &err), MA_OK);
    ma_gguf_writer_free(w);

    ma_gguf g;
    assert_int_equal(ma_gguf_open(&g, path, &err), MA_OK);
    assert_int_equal(g.version, 3);
    assert_int_equal(g.n_tensors, 4);
    char s[64];
    assert_int_equal(ma_gguf_get_str(&g, "general.architecture", s, sizeof s, &err), MA_OK);
    assert_string_equal(s, "molmoact2");
    int64_t v;
    assert_int_equal(ma_gguf_get_i64(&g, "molmoact.layers", &v, &err), MA_OK);
    assert_int_equal(v, 36);
    assert_int_equal(ma_gguf_get_i64(&g, "molmoact.heads", &v, &err), MA_OK);
    assert_int_equal(v, 32);
    double d;
    assert_int_equal(ma_gguf_get_f64(&g, "molmoact.theta", &d, &err), MA_OK);
    assert_true(d == 5e6);
    int b;
    assert_int_equal(ma_gguf_get_bool(&g, "molmoact.qk_norm", &b, &err), MA_OK);
    assert_true(b);
    int64_t got[4];
    size_t n;
    assert_int_equal(ma_gguf_get_i64_array(&g, "molmoact.range", got, 4, &n, &err), MA_OK);
    assert_int_equal(n, 3);
    assert_int_equal(got[2], 27);
    assert_fails_naming(ma_gguf_get_i64(&g, "molmoact.missing", &v, &err), err, "molmoact.missing");
    const ma_gguf_tensor *t = ma_gguf_find_tensor(&g, "w.f32");
    assert_non_null(t);
    assert_int_equal(t->ne[0], 3); /* ggml order: fastest first */
    assert_int_equal(t->ne[1], 2);
    assert_memory_equal(t->data, f, sizeof f);
    assert_int_equal(((uintptr_t)t->data - (uintptr_t)g.map.data) % 32, 0);
    t = ma_gguf_find_tensor(&g, "w.q8");
    float deq[64];
    ma_convert_to_f32(MA_DT_Q8_0, t->data, 0, 64, deq);
    assert_true(deq[0] == -16.0f && deq[31] == 15.0f && deq[32] == -20.0f && deq[63] == 0.5f * (3 * 31 - 40));
    t = ma_gguf_find_tensor(&g, "w.q4");
    ma_convert_to_f32(MA_DT_Q4_0, t->data, 0, 32, deq);
    for (int j = 0; j < 16; j++) {
        assert_true(deq[j] == (float)(j - 8));
        assert_true(deq[j + 16] == (float)(15 - j - 8));
    }
    ma_gguf_close(&g);

    /* every truncation that loses any tensor byte is refused (the trailing alignment padding
     * after the last tensor is not needed) */
    char *buf;
    size_t len, data_end = 0;
    assert_int_equal(ma_read_file(path, 1 << 20, &buf, &len, &err), MA_OK);
    assert_int_equal(ma_gguf_open(&g, path, &err), MA_OK);
    for (size_t i = 0; i < g.n_tensors; i++) {
        size_t end = g.data_offset + (size_t)g.tensors[i].offset + g.tensors[i].nbytes;
        if (end > data_end) data_end = end;
    }
    ma_gguf_close(&g);
    for (size_t cut = 0; cut < data_end; cut++) {
        ma_gguf gg;
        memset(&gg, 0, sizeof gg);
        ma_status st = ma_gguf_parse((uint8_t *)buf, cut, "cut", &gg, &err);
        ma_gguf_close(&gg);
        if (st == MA_OK) fail_msg("truncation at %zu accepted", cut);
    }
    /* byte flips never crash */
    for (size_t i = 0; i < len; i++) {
        uint8_t *copy = malloc(len);
        memcpy(copy, buf, len);
        copy[i] ^= 0xa5;
        ma_gguf gg;
        memset(&gg, 0, sizeof gg);
        ma_gguf_parse(copy, len, "flip", &gg, &err);
        ma_gguf_close(&gg);
        free(copy);
    }
    free(buf);
    tu_rmdir(dir);
}

static void test_hostile_headers(void **state) {
    (void)state;
    uint8_t buf[64] = {'G', 'G', 'U', 'F', 2, 0, 0, 0};
    ma_gguf g;
    ma_error err = {0};
    memset(&g, 0, sizeof g);
    assert_fails_naming(ma_gguf_parse(buf, 24, "v2", &g, &err), err, "version");
    ma_gguf_close(&g);
    buf[4] = 3;
    for (int i = 8; i < 24; i++) buf[i] = 0xff; /* absurd counts */
    memset(&g, 0, sizeof g);
    assert_fails_naming(ma_gguf_parse(buf, 24, "counts", &g, &err), err, "limits");
    ma_gguf_close(&g);
    memset(&g, 0, sizeof g);
    buf[0] = 'X';
    assert_fails_naming(ma_gguf_parse(buf, 24, "magic", &g, &err), err, "magic");
    ma_gguf_close(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_hostile_headers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
