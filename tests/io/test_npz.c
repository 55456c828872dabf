/* SPDX-License-Identifier: Apache-2.0 */
#include "../test_util.h"

#include "io/npz.h"

static void test_round_trip_stored_and_deflated(void **state) {
    (void)state;
    char dir[1024], path[1100];
    tu_tmpdir(dir, sizeof dir, "npz-rt");
    float f[12];
    tu_fill(f, 12, 1);
    int64_t ids[5] = {258, 1, -1, 155650, 7};
    uint8_t m[3] = {1, 0, 1};
    int64_t sf[3] = {2, 3, 2}, si[1] = {5}, sm[1] = {3};
    for (int compress = 0; compress < 2; compress++) {
        snprintf(path, sizeof path, "%s/x%d.npz", dir, compress);
        ma_npz_writer w;
        ma_npz_writer_init(&w);
        ma_error err = {0};
        ma_tensor tf = ma_tensor_view(MA_DT_F32, 3, sf, f), ti = ma_tensor_view(MA_DT_I64, 1, si, ids),
                  tm = ma_tensor_view(MA_DT_U8, 1, sm, m), t0 = ma_tensor_view(MA_DT_F32, 0, sf, f);
        assert_int_equal(ma_npz_add(&w, "floats", &tf, &err), MA_OK);
        assert_int_equal(ma_npz_add(&w, "ids", &ti, &err), MA_OK);
        assert_int_equal(ma_npz_add(&w, "mask", &tm, &err), MA_OK);
        assert_int_equal(ma_npz_add(&w, "scalar", &t0, &err), MA_OK);
        assert_int_equal(ma_npz_write(&w, path, compress, &err), MA_OK);
        ma_npz_writer_free(&w);
        ma_npz z;
        assert_int_equal(ma_npz_read(path, &z, &err), MA_OK);
        assert_int_equal(z.count, 4);
        const ma_tensor *g = ma_npz_get(&z, "floats");
        assert_non_null(g);
        assert_int_equal(g->ndim, 3);
        assert_memory_equal(g->data, f, sizeof f);
        assert_memory_equal(ma_npz_get(&z, "ids")->data, ids, sizeof ids);
        assert_int_equal(ma_npz_get(&z, "mask")->dtype, MA_DT_U8);
        assert_int_equal(ma_npz_get(&z, "scalar")->ndim, 0);
        assert_true(*(float *)ma_npz_get(&z, "scalar")->data == f[0]);
        ma_npz_free(&z);
    }
    tu_rmdir(dir);
}

/* files written by numpy / Python zipfile: the committed goldens (deflate) */
static void test_reads_python_written_goldens(void **state) {
    (void)state;
    ma_npz z;
    ma_error err = {0};
    assert_int_equal(ma_npz_read(MA_SOURCE_DIR "/assets/tiny-grid/golden/step0_boundary.npz", &z, &err), MA_OK);
    const ma_tensor *ids = ma_npz_get(&z, "input_ids");
    assert_non_null(ids);
    assert_int_equal(ids->dtype, MA_DT_I64);
    assert_int_equal(((int64_t *)ids->data)[0], 151645); /* BOS = <|im_end|> */
    assert_non_null(ma_npz_get(&z, "noise"));
    ma_npz_free(&z);
}

static void test_hostile_archives(void **state) {
    (void)state;
    char dir[1024], path[1100];
    tu_tmpdir(dir, sizeof dir, "npz-bad");
    snprintf(path, sizeof path, "%s/x.npz", dir);
    float f[64];
    tu_fill(f, 64, 2);
    int64_t sh[1] = {64};
    ma_npz_writer w;
    ma_npz_writer_init(&w);
    ma_error err = {0};
    ma_tensor t = ma_tensor_view(MA_DT_F32, 1, sh, f);
    assert_int_equal(ma_npz_add(&w, "a", &t, &err), MA_OK);
    assert_int_equal(ma_npz_write(&w, path, 1, &err), MA_OK);
    ma_npz_writer_free(&w);
    char *buf;
    size_t len;
    assert_int_equal(ma_read_file(path, 1 << 20, &buf, &len, &err), MA_OK);
    ma_npz z;
    /* every truncation is refused cleanly */
    for (size_t cut = 0; cut < len; cut++) assert_int_not_equal(ma_npz_parse((uint8_t *)buf, cut, "cut", &z, &err), MA_OK);
    /* every single-byte corruption is either refused or yields the same entries (never a crash) */
    for (size_t i = 0; i < len; i++) {
        uint8_t *copy = malloc(len);
        memcpy(copy, buf, len);
        copy[i] ^= 0x5a;
        if (ma_npz_parse(copy, len, "flip", &z, &err) == MA_OK) ma_npz_free(&z);
        free(copy);
    }
    /* a stored entry whose npy header claims a huge shape */
    const char *npy_hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999), }";
    uint8_t npy[256];
    memcpy(npy, "\x93NUMPY\x01\x00", 8);
    size_t hl = strlen(npy_hdr);
    npy[8] = (uint8_t)hl;
    npy[9] = 0;
    memcpy(npy + 10, npy_hdr, hl);
    ma_tensor out;
    assert_int_not_equal(ma_npy_parse(npy, 10 + hl, "huge", &out, &err), MA_OK);
    const char *fortran = "{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }";
    hl = strlen(fortran);
    npy[8] = (uint8_t)hl;
    memcpy(npy + 10, fortran, hl);
    memset(npy + 10 + hl, 0, 4);
    assert_fails_naming(ma_npy_parse(npy, 10 + hl + 4, "fortran", &out, &err), err, "Fortran");
    const char *obj = "{'descr': '|O', 'fortran_order': False, 'shape': (1,), }";
    hl = strlen(obj);
    npy[8] = (uint8_t)hl;
    memcpy(npy + 10, obj, hl);
    assert_fails_naming(ma_npy_parse(npy, 10 + hl + 8, "object", &out, &err), err, "|O");
    /* a header that ends right after a key's colon: no value to read (was a 1-byte over-read) */
    const char *cut = "{'fortran_order': False, 'shape': (2,), 'descr':";
    hl = strlen(cut);
    uint8_t *exact = malloc(10 + hl); /* nothing after the header: ASan sees any over-read */
    memcpy(exact, "\x93NUMPY\x01\x00", 8);
    exact[8] = (uint8_t)hl;
    exact[9] = 0;
    memcpy(exact + 10, cut, hl);
    assert_fails_naming(ma_npy_parse(exact, 10 + hl, "cut", &out, &err), err, "descr");
    free(exact);
    /* a string wider than the limit is named as such, not as an unknown dtype */
    const char *wide = "{'descr': '<U1054000', 'fortran_order': False, 'shape': (), }";
    hl = strlen(wide);
    npy[8] = (uint8_t)hl;
    memcpy(npy + 10, wide, hl);
    assert_fails_naming(ma_npy_parse(npy, 10 + hl, "task", &out, &err), err, "string of 1054000 characters exceeds");
    /* a 48-byte file whose zip64 locator points past a file shorter than the zip64 record (the
     * bound len - 56 wrapped: segfault) */
    static const char *hex48 = "934eade403504b0607864c204e06a40102010000782e6e7079504b0506060000000003ffffffff7120200320003c003c";
    uint8_t *z48 = malloc(48);
    for (int i = 0; i < 48; i++) sscanf(hex48 + 2 * i, "%2hhx", &z48[i]);
    assert_fails_naming(ma_npz_parse(z48, 48, "z48", &z, &err), err, "zip64");
    free(z48);
    /* a deflated entry claiming far more than deflate can expand to: refused before the 2 GiB
     * allocation (the npz fuzzer's out-of-memory reproducer) */
    char *oom;
    size_t ol;
    assert_int_equal(ma_read_file(MA_SOURCE_DIR "/fuzz/corpus/npz/deflate_claim.npz", 1 << 20, &oom, &ol, &err), MA_OK);
    assert_int_not_equal(ma_npz_parse((uint8_t *)oom, ol, "oom", &z, &err), MA_OK);
    free(oom);
    free(buf);
    tu_rmdir(dir);
}

static void test_unicode_strings(void **state) {
    (void)state;
    /* numpy '<U5' holding "ké☃" padded with NULs */
    uint32_t cps[5] = {'k', 0xe9, 0x2603, 0, 0};
    int64_t sh[1] = {1};
    ma_tensor t = ma_tensor_view(MA_DT_STR32, 0, sh, cps);
    t.elem_size = 20;
    char *s;
    ma_error err = {0};
    assert_int_equal(ma_str32_to_utf8(&t, 0, &s, &err), MA_OK);
    assert_string_equal(s, "k\xc3\xa9\xe2\x98\x83");
    free(s);
    cps[1] = 0xd800;
    assert_int_not_equal(ma_str32_to_utf8(&t, 0, &s, &err), MA_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_stored_and_deflated),
        cmocka_unit_test(test_reads_python_written_goldens),
        cmocka_unit_test(test_hostile_archives),
        cmocka_unit_test(test_unicode_strings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
