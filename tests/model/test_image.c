/* SPDX-License-Identifier: Apache-2.0 */
#include "../test_util.h"

#include "model/image.h"

static void test_decoders(void **state) {
    (void)state;
    struct {
        const char *file;
        int h, w;
    } cases[] = {{"rgb.png", 9, 11}, {"gray.png", 9, 11}, {"rgba.png", 8, 8}, {"rgb.jpg", 16, 8}};
    for (size_t i = 0; i < 4; i++) {
        char path[1200];
        snprintf(path, sizeof path, MA_SOURCE_DIR "/fuzz/corpus/image/%s", cases[i].file);
        ma_image im;
        ma_error err = {0};
        if (ma_image_load(path, &im, &err)) fail_msg("%s", err.msg);
        assert_int_equal(im.h, cases[i].h);
        assert_int_equal(im.w, cases[i].w);
        if (!strcmp(cases[i].file, "gray.png"))
            for (int p = 0; p < im.h * im.w; p++) assert_true(im.rgb[3 * p] == im.rgb[3 * p + 1] && im.rgb[3 * p] == im.rgb[3 * p + 2]);
        ma_image_free(&im);
    }
    ma_image im;
    ma_error err = {0};
    assert_fails_naming(ma_image_decode((const uint8_t *)"GIF89a....", 10, "x.gif", &im, &err), err, "not a PNG or JPEG");
    assert_fails_naming(ma_image_decode((const uint8_t *)"", 0, "empty", &im, &err), err, "empty");
}

/* ---- a progressive greyscale JPEG of 64 x 64 with one DC scan and `scans` AC scans that skip
 * every block by an end-of-band run (written from the JPEG standard's marker and Huffman rules:
 * one-symbol tables, code '0') */
typedef struct {
    uint8_t *p;
    size_t n, cap;
} jbuf;
static void jb_put(jbuf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void jb_seg(jbuf *b, uint8_t marker, const uint8_t *body, size_t n) {
    const uint8_t h[4] = {0xff, marker, (uint8_t)((n + 2) >> 8), (uint8_t)(n + 2)};
    jb_put(b, h, 4);
    jb_put(b, body, n);
}
/* entropy-coded bits (a string of '0' and '1'), padded with ones, 0xff stuffed */
static void jb_bits(jbuf *b, const char *bits) {
    size_t n = strlen(bits);
    for (size_t i = 0; i < n; i += 8) {
        unsigned v = 0;
        for (size_t k = 0; k < 8; k++) v = v << 1 | (i + k < n ? (unsigned)(bits[i + k] == '1') : 1u);
        const uint8_t byte = (uint8_t)v, zero = 0;
        jb_put(b, &byte, 1);
        if (byte == 0xff) jb_put(b, &zero, 1);
    }
}
static jbuf progressive_jpeg(int scans) {
    jbuf b = {0};
    jb_put(&b, "\xff\xd8", 2);
    uint8_t dqt[65] = {0};
    memset(dqt + 1, 1, 64);
    jb_seg(&b, 0xdb, dqt, sizeof dqt);
    const uint8_t sof[] = {8, 0, 64, 0, 64, 1, 1, 0x11, 0};
    jb_seg(&b, 0xc2, sof, sizeof sof);
    uint8_t dht[18] = {0x00, 1};
    dht[17] = 0x00; /* DC: category 0 */
    jb_seg(&b, 0xc4, dht, sizeof dht);
    dht[0] = 0x10, dht[17] = 0xe0; /* AC: an end-of-band run with 14 more bits */
    jb_seg(&b, 0xc4, dht, sizeof dht);
    const uint8_t sos_dc[] = {1, 1, 0x00, 0, 0, 0}, sos_ac[] = {1, 1, 0x00, 1, 63, 0};
    jb_seg(&b, 0xda, sos_dc, sizeof sos_dc);
    char dc[65];
    memset(dc, '0', 64), dc[64] = 0; /* 64 blocks, each a zero difference */
    jb_bits(&b, dc);
    for (int i = 0; i < scans; i++) {
        jb_seg(&b, 0xda, sos_ac, sizeof sos_ac);
        jb_bits(&b, "011111111111111"); /* a run of 32767 blocks: all of them */
    }
    jb_put(&b, "\xff\xd9", 2);
    return b;
}

static void test_progressive_scans(void **state) {
    (void)state;
    ma_image im;
    ma_error err = {0};
    jbuf ok = progressive_jpeg(10), many = progressive_jpeg(65);
    if (ma_image_decode(ok.p, ok.n, "ten scans", &im, &err)) fail_msg("%s", err.msg);
    assert_int_equal(im.h, 64);
    assert_int_equal(im.w, 64);
    ma_image_free(&im);
    /* 65 scans: refused from libjpeg's progress monitor, before the rest is decoded */
    assert_fails_naming(ma_image_decode(many.p, many.n, "many scans", &im, &err), err, "more than 64 scans");
    assert_non_null(strstr(err.msg, "many scans"));
    free(ok.p);
    free(many.p);
}

static void test_raw_buffers(void **state) {
    (void)state;
    ma_image im;
    ma_error err = {0};
    uint8_t gray[6] = {0, 50, 100, 150, 200, 250};
    int64_t s2[2] = {2, 3};
    ma_tensor t = ma_tensor_view(MA_DT_U8, 2, s2, gray);
    assert_int_equal(ma_image_from_tensor(&t, "gray", &im, &err), MA_OK);
    assert_int_equal(im.rgb[3 * 4 + 2], 200);
    ma_image_free(&im);
    float chw[3 * 2 * 2] = {0, 0.25f, 0.5f, 1.0f, 0, 0, 0, 0, 1, 1, 1, 1};
    int64_t s3[3] = {3, 2, 2};
    t = ma_tensor_view(MA_DT_F32, 3, s3, chw);
    assert_int_equal(ma_image_from_tensor(&t, "chw", &im, &err), MA_OK);
    assert_int_equal(im.h, 2);
    assert_int_equal(im.rgb[0 * 3 + 0], 0);
    assert_int_equal(im.rgb[1 * 3 + 0], 63); /* 0.25 * 255 = 63.75, truncated */
    assert_int_equal(im.rgb[3 * 3 + 0], 255);
    assert_int_equal(im.rgb[3 * 3 + 2], 255);
    ma_image_free(&im);
    chw[2] = NAN;
    assert_fails_naming(ma_image_from_tensor(&t, "nan", &im, &err), err, "NaN");
    int64_t s0[3] = {0, 4, 3};
    t = ma_tensor_view(MA_DT_U8, 3, s0, gray);
    assert_fails_naming(ma_image_from_tensor(&t, "zero", &im, &err), err, "empty");
    int64_t sh[3] = {100000, 100000, 3};
    t = ma_tensor_view(MA_DT_U8, 3, sh, gray);
    assert_fails_naming(ma_image_from_tensor(&t, "huge", &im, &err), err, "limit");
    int64_t s5[3] = {2, 3, 5};
    t = ma_tensor_view(MA_DT_U8, 3, s5, gray);
    assert_fails_naming(ma_image_from_tensor(&t, "five", &im, &err), err, "channels");
}

static void test_resize_identity_and_constant(void **state) {
    (void)state;
    uint8_t in[4 * 5 * 3], out[4 * 5 * 3], big[37 * 23 * 3];
    for (int i = 0; i < 60; i++) in[i] = (uint8_t)(i * 7);
    ma_resize_bilinear_u8(in, 4, 5, out, 4, 5);
    assert_memory_equal(in, out, sizeof in);
    memset(in, 77, sizeof in);
    ma_resize_bilinear_u8(in, 4, 5, big, 37, 23);
    for (size_t i = 0; i < sizeof big; i++) assert_int_equal(big[i], 77);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decoders),
        cmocka_unit_test(test_progressive_scans),
        cmocka_unit_test(test_raw_buffers),
        cmocka_unit_test(test_resize_identity_and_constant),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
