/* SPDX-License-Identifier: Apache-2.0 */
#include "../test_util.h"

#include "model/tokenizer.h"

#define BYTE_TOK MA_SOURCE_DIR "/assets/tiny-grid/model/tokenizer.json"
#define BPE_TOK MA_SOURCE_DIR "/fuzz/corpus/bpe_tokenizer.json"

static void encode(const ma_tokenizer *t, const char *s, size_t n, int64_t **ids, size_t *k) {
    ma_error err = {0};
    if (ma_tokenizer_encode(t, s, n, ids, k, &err)) fail_msg("encode: %s", err.msg);
}

static void test_byte_level_and_specials(void **state) {
    (void)state;
    ma_tokenizer *t;
    ma_error err = {0};
    assert_int_equal(ma_tokenizer_load(BYTE_TOK, &t, &err), MA_OK);
    int64_t *ids;
    size_t n;
    const char s[] = "ab<|im_end|>c\0d<state_7>";
    encode(t, s, sizeof s - 1, &ids, &n);
    const int64_t want[] = {97, 98, 151645, 99, 0, 100, 151675 + 7};
    assert_int_equal(n, 7);
    assert_memory_equal(ids, want, sizeof want);
    char *back;
    size_t bl;
    assert_int_equal(ma_tokenizer_decode(t, ids, n, &back, &bl, &err), MA_OK);
    assert_int_equal(bl, sizeof s - 1);
    assert_memory_equal(back, s, bl);
    free(back);
    free(ids);
    assert_int_equal(ma_tokenizer_token_id(t, "<im_patch>"), 155650);
    assert_int_equal(ma_tokenizer_token_id(t, "<nope>"), -1);
    /* invalid UTF-8 is refused with its offset; unknown ids are refused when decoding */
    assert_fails_naming(ma_tokenizer_encode(t, "ok\xc3(", 4, &ids, &n, &err), err, "byte 2");
    assert_fails_naming(ma_tokenizer_encode(t, "\xed\xa0\x80", 3, &ids, &n, &err), err, "UTF-8"); /* surrogate */
    int64_t bad[2] = {97, 99999999};
    assert_fails_naming(ma_tokenizer_decode(t, bad, 2, &back, &bl, &err), err, "99999999");
    ma_tokenizer_free(t);
}

static void test_bpe_merges(void **state) {
    (void)state;
    ma_tokenizer *t;
    ma_error err = {0};
    assert_int_equal(ma_tokenizer_load(BPE_TOK, &t, &err), MA_OK);
    const char *s = "pick up the black bowl and place it on the plate";
    int64_t *ids;
    size_t n;
    encode(t, s, strlen(s), &ids, &n);
    assert_true(n < strlen(s) / 2); /* merges applied */
    char *back;
    size_t bl;
    assert_int_equal(ma_tokenizer_decode(t, ids, n, &back, &bl, &err), MA_OK);
    assert_string_equal(back, s);
    free(back);
    free(ids);
    /* a 200k-letter word: the heap keeps BPE n log n (no hang) */
    size_t big = 200000;
    char *word = malloc(big);
    for (size_t i = 0; i < big; i++) word[i] = "picktheblw"[i % 10];
    encode(t, word, big, &ids, &n);
    assert_true(n > 0 && n < big);
    free(ids);
    free(word);
    /* NFC: the decomposed and the composed e-acute tokenise alike */
    int64_t *a, *b;
    size_t na, nb;
    encode(t, "caf\xc3\xa9", 5, &a, &na);
    encode(t, "cafe\xcc\x81", 6, &b, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na * sizeof *a);
    free(a);
    free(b);
    ma_tokenizer_free(t);
}

static void test_hostile_tokenizer_files(void **state) {
    (void)state;
    ma_tokenizer *t;
    ma_error err = {0};
    struct {
        const char *json, *needle;
    } cases[] = {
        {"not json", "JSON"},
        {"{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", "BPE"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
         "merge 0"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -4}}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}", "bad id"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"normalizer\": {\"type\": \"Lowercase\"}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
         "Lowercase"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": \"Whitespace\"}}", "Whitespace"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"byte_fallback\": true}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
         "byte_fallback"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"added_tokens\": [{\"id\": 3}]}",
         "added token"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_fails_naming(ma_tokenizer_parse(cases[i].json, strlen(cases[i].json), "tok", &t, &err), err, cases[i].needle);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_byte_level_and_specials),
        cmocka_unit_test(test_bpe_merges),
        cmocka_unit_test(test_hostile_tokenizer_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
