/* SPDX-License-Identifier: Apache-2.0 */
/* The small tools of core/util.h at their edges: size arithmetic that would overflow, a buffer's
 * cap reached, the allocator refusing, empty input, truncated and ill-formed UTF-8, surrogates in
 * JSON escapes, percentiles against their definition. */
#define _POSIX_C_SOURCE 200809L /* clock_nanosleep */
#include "../test_util.h"

#include <time.h>

#include "core/util.h"

/* the allocator's refusal is part of what is tested: under AddressSanitizer a request past its
 * largest size returns NULL, as glibc's malloc does, instead of ending the program */
__attribute__((visibility("default"))) const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

/* ------------------------------------------------------------------------------ growth */

static void test_grow_cap(void **state) {
    (void)state;
    assert_int_equal(ma_grow_cap(0, 1, 16, SIZE_MAX), 16);
    assert_int_equal(ma_grow_cap(0, 17, 16, SIZE_MAX), 32);
    assert_int_equal(ma_grow_cap(16, 16, 16, SIZE_MAX), 16); /* already holds it */
    assert_int_equal(ma_grow_cap(16, 17, 16, SIZE_MAX), 32);
    assert_int_equal(ma_grow_cap(16, 100, 16, SIZE_MAX), 128);
    assert_int_equal(ma_grow_cap(16, 100, 16, 100), 100); /* clamped to max */
    assert_int_equal(ma_grow_cap(16, 100, 16, 120), 120);
    assert_int_equal(ma_grow_cap(16, 101, 16, 100), 0);     /* past max: nothing */
    assert_int_equal(ma_grow_cap(0, 10, 0, SIZE_MAX), 16);  /* first 0: from 1 */
    assert_int_equal(ma_grow_cap(0, 5, 65536, 1000), 1000); /* first past max: max */
    /* doubling near the top of size_t stops at max instead of wrapping to 0 */
    const size_t half = SIZE_MAX / 2 + 1;
    assert_true(ma_grow_cap(half, half + 1, 16, SIZE_MAX) == SIZE_MAX);
    assert_true(ma_grow_cap(SIZE_MAX / 3, SIZE_MAX / 3 + 1, 16, SIZE_MAX) == SIZE_MAX / 3 * 2);
}

static void test_grow_array(void **state) {
    (void)state;
    uint64_t *v = NULL;
    size_t cap = 0, n = 0;
    for (uint64_t i = 0; i < 1000; i++) {
        assert_int_equal(ma_grow_array(&v, &cap, n, 1, sizeof *v), MA_OK);
        assert_true(cap > n);
        v[n++] = i * i;
    }
    for (uint64_t i = 0; i < 1000; i++) assert_true(v[i] == i * i);
    assert_int_equal(cap, 1024); /* 16 doubled */
    uint64_t *const kept = v;
    const size_t kept_cap = cap;
    /* len + extra past size_t, and elements whose bytes would pass it: refused, unchanged */
    assert_int_equal(ma_grow_array(&v, &cap, SIZE_MAX - 1, 2, sizeof *v), MA_ERR_RANGE);
    assert_int_equal(ma_grow_array(&v, &cap, SIZE_MAX / 8, 1, 8), MA_ERR_RANGE);
    assert_int_equal(ma_grow_array(&v, &cap, 0, 1, 0), MA_ERR_RANGE);
    assert_ptr_equal(v, kept);
    assert_int_equal(cap, kept_cap);
    /* the allocator refuses (2^62 bytes): the array is as it was, still ours to free */
    assert_int_equal(ma_grow_array(&v, &cap, 0, SIZE_MAX / 32, 8), MA_ERR_NOMEM);
    assert_ptr_equal(v, kept);
    assert_int_equal(cap, kept_cap);
    for (uint64_t i = 0; i < 1000; i++) assert_true(v[i] == i * i);
    /* enough room: no change */
    assert_int_equal(ma_grow_array(&v, &cap, 1000, 24, sizeof *v), MA_OK);
    assert_int_equal(cap, 1024);
    free(v);
    /* extra 0 on an empty array: nothing to allocate */
    char *e = NULL;
    size_t ecap = 0;
    assert_int_equal(ma_grow_array(&e, &ecap, 0, 0, 1), MA_OK);
    assert_null(e);
}

static void test_buf(void **state) {
    (void)state;
    ma_buf b = {0};
    /* empty: an append of nothing still gives a string */
    assert_int_equal(ma_buf_append(&b, "", 0), MA_OK);
    assert_non_null(b.data);
    assert_string_equal(b.data, "");
    assert_int_equal(b.len, 0);
    for (int i = 0; i < 500; i++) assert_int_equal(ma_buf_printf(&b, "%d,", i), MA_OK);
    char want[4096];
    size_t wl = 0;
    for (int i = 0; i < 500; i++) wl += (size_t)snprintf(want + wl, sizeof want - wl, "%d,", i);
    assert_int_equal(b.len, wl);
    assert_string_equal(b.data, want);
    assert_true(b.cap > b.len);
    /* bytes with NULs inside, and a printf longer than the room left */
    assert_int_equal(ma_buf_append(&b, "a\0b", 3), MA_OK);
    assert_memory_equal(b.data + wl, "a\0b", 4);
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    assert_int_equal(ma_buf_printf(&b, "[%s]", big), MA_OK);
    assert_int_equal(b.len, wl + 3 + 2 + sizeof big - 1);
    assert_true(b.data[b.len - 1] == ']' && b.data[b.len] == '\0');
    ma_buf_free(&b);
    assert_null(b.data);
    assert_int_equal(b.len + b.cap, 0);
    ma_buf_free(&b); /* twice: harmless */
}

static void test_buf_cap(void **state) {
    (void)state;
    ma_buf b = {.max = 10};
    assert_int_equal(ma_buf_puts(&b, "0123456789"), MA_OK); /* exactly the cap */
    assert_true(b.cap <= 11);
    /* one byte more: refused, the text as it was */
    assert_int_equal(ma_buf_append(&b, "x", 1), MA_ERR_RANGE);
    assert_int_equal(ma_buf_printf(&b, "%s", "y"), MA_ERR_RANGE);
    assert_int_equal(b.len, 10);
    assert_string_equal(b.data, "0123456789");
    ma_buf_free(&b);
    assert_int_equal(b.max, 10); /* kept */
    /* a printf that does not fit: what vsnprintf wrote past the end is cut off again */
    assert_int_equal(ma_buf_puts(&b, "abc"), MA_OK);
    assert_int_equal(ma_buf_printf(&b, "%s", "defghijklmn"), MA_ERR_RANGE);
    assert_int_equal(b.len, 3);
    assert_string_equal(b.data, "abc");
    assert_int_equal(ma_buf_printf(&b, "%s", "defghij"), MA_OK); /* to the cap exactly */
    assert_string_equal(b.data, "abcdefghij");
    ma_buf_free(&b);
    /* size arithmetic past size_t, and a size the allocator refuses */
    ma_buf u = {0};
    assert_int_equal(ma_buf_puts(&u, "ab"), MA_OK);
    assert_int_equal(ma_buf_reserve(&u, SIZE_MAX), MA_ERR_RANGE);
    assert_int_equal(ma_buf_reserve(&u, SIZE_MAX - 2), MA_ERR_RANGE); /* + the NUL: one past */
    assert_int_equal(ma_buf_reserve(&u, SIZE_MAX / 4), MA_ERR_NOMEM);
    assert_int_equal(ma_buf_append(&u, "c", (size_t)-1), MA_ERR_RANGE);
    assert_int_equal(u.len, 2);
    assert_string_equal(u.data, "ab");
    ma_buf_free(&u);
    ma_buf z = {.max = 1};
    assert_int_equal(ma_buf_reserve(&z, 2), MA_ERR_RANGE);
    assert_null(z.data);
    assert_int_equal(ma_buf_reserve(&z, 1), MA_OK);
    ma_buf_free(&z);
}

/* ------------------------------------------------------------------------------ UTF-8 */

/* an independent reading of the rules: decode by the lead byte's pattern, then refuse overlongs,
 * surrogates and values past U+10FFFF by the decoded value */
static size_t ref_seq(const uint8_t *s, size_t len, uint32_t *cp) {
    if (!len) return 0;
    size_t n;
    uint32_t v, min;
    if (s[0] < 0x80) {
        *cp = s[0];
        return 1;
    }
    if ((s[0] & 0xe0) == 0xc0) n = 2, v = s[0] & 0x1f, min = 0x80;
    else if ((s[0] & 0xf0) == 0xe0) n = 3, v = s[0] & 0x0f, min = 0x800;
    else if ((s[0] & 0xf8) == 0xf0) n = 4, v = s[0] & 0x07, min = 0x10000;
    else return 0;
    if (len < n) return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        v = v << 6 | (s[i] & 0x3f);
    }
    if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
    *cp = v;
    return n;
}

static void test_utf8_edges(void **state) {
    (void)state;
    static const struct {
        const char *s;
        size_t len, want;
    } C[] = {
        {"", 0, 0}, /* empty */
        {"a", 1, 1},
        {"\x7f", 1, 1},
        {"\x80", 1, 0},     /* stray continuation */
        {"\xc0\xaf", 2, 0}, /* overlong '/' */
        {"\xc1\xbf", 2, 0},
        {"\xc2\x80", 2, 2}, /* U+0080 */
        {"\xc2\x80", 1, 0}, /* cut by len */
        {"\xdf\xbf", 2, 2},
        {"\xe0\x9f\xbf", 3, 0},     /* overlong */
        {"\xe0\xa0\x80", 3, 3},     /* U+0800 */
        {"\xe2\x82\xac", 3, 3},     /* euro */
        {"\xe2\x82", 2, 0},         /* truncated */
        {"\xe2\x82\xac", 2, 0},     /* truncated by len */
        {"\xe2\x28\xa1", 3, 0},     /* bad second byte */
        {"\xe2\x82\x28", 3, 0},     /* bad third byte */
        {"\xed\x9f\xbf", 3, 3},     /* U+D7FF */
        {"\xed\xa0\x80", 3, 0},     /* U+D800: a surrogate */
        {"\xed\xbf\xbf", 3, 0},     /* U+DFFF */
        {"\xee\x80\x80", 3, 3},     /* U+E000 */
        {"\xef\xbf\xbf", 3, 3},     /* U+FFFF */
        {"\xf0\x8f\xbf\xbf", 4, 0}, /* overlong */
        {"\xf0\x90\x80\x80", 4, 4}, /* U+10000 */
        {"\xf0\x9f\x98\x80", 3, 0}, /* truncated by len */
        {"\xf4\x8f\xbf\xbf", 4, 4}, /* U+10FFFF */
        {"\xf4\x90\x80\x80", 4, 0}, /* past U+10FFFF */
        {"\xf5\x80\x80\x80", 4, 0},
        {"\xff", 1, 0},
    };
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        const size_t got = ma_utf8_seq((const uint8_t *)C[i].s, C[i].len);
        if (got != C[i].want) fail_msg("case %zu: %zu, want %zu", i, got, C[i].want);
    }
    assert_int_equal(ma_utf8_valid_prefix((const uint8_t *)"", 0), 0);
    assert_int_equal(ma_utf8_valid_prefix((const uint8_t *)"ab\xe2\x82\xac"
                                                           "c",
                                          6),
                     6);
    assert_int_equal(ma_utf8_valid_prefix((const uint8_t *)"ab\xe2\x82", 4), 2);       /* cut at the end */
    assert_int_equal(ma_utf8_valid_prefix((const uint8_t *)"a\0b\xed\xa0\x80", 6), 3); /* NUL is valid */
}

/* every sequence of up to three bytes, and every four-byte one over its interesting trailing bytes */
static void test_utf8_exhaustive(void **state) {
    (void)state;
    uint8_t s[4];
    uint32_t cp;
    for (uint32_t x = 0; x < (1u << 24); x++) {
        s[0] = (uint8_t)(x >> 16), s[1] = (uint8_t)(x >> 8), s[2] = (uint8_t)x;
        for (size_t len = 1; len <= 3; len++)
            if (ma_utf8_seq(s, len) != ref_seq(s, len, &cp)) fail_msg("%02x %02x %02x (len %zu)", s[0], s[1], s[2], len);
    }
    static const uint8_t T[] = {0x00, 0x3f, 0x7f, 0x80, 0x8f, 0x90, 0xa0, 0xbf, 0xc0, 0xff};
    for (uint32_t x = 0xf00000; x < 0x1000000; x += 0x100)
        for (size_t a = 0; a < sizeof T; a++)
            for (size_t b = 0; b < sizeof T; b++) {
                s[0] = (uint8_t)(x >> 16), s[1] = (uint8_t)(x >> 8), s[2] = T[a], s[3] = T[b];
                if (ma_utf8_seq(s, 4) != ref_seq(s, 4, &cp)) fail_msg("%02x %02x %02x %02x", s[0], s[1], s[2], s[3]);
            }
}

static void test_utf8_put(void **state) {
    (void)state;
    for (uint32_t c = 0; c <= 0x10ffff; c++) {
        if (c >= 0xd800 && c <= 0xdfff) continue;
        char o[4];
        uint32_t back = 0;
        const size_t n = ma_utf8_put(c, o);
        if (n != (c < 0x80 ? 1u : c < 0x800 ? 2u : c < 0x10000 ? 3u : 4u) || ref_seq((const uint8_t *)o, n, &back) != n || back != c)
            fail_msg("U+%04X", c);
    }
}

/* ------------------------------------------------------------------------------ JSON strings */

static const char *unescape(const char *lit, char *out, size_t *out_len, size_t *at) {
    return ma_json_unescape(lit, strlen(lit), out, out_len, at);
}

static void test_json_unescape(void **state) {
    (void)state;
    char o[64];
    size_t n, at = 99;
    assert_null(unescape("", o, &n, &at)); /* empty */
    assert_int_equal(n, 0);
    assert_string_equal(o, "");
    assert_null(unescape("a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t", o, &n, &at));
    assert_string_equal(o, "a\"b\\c/d\b\f\n\r\t");
    assert_null(unescape("\\u0041\\u00e9\\u20AC\\ud83d\\ude00", o, &n, &at)); /* upper and lower hex */
    assert_string_equal(o, "A\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
    assert_null(unescape("x\\u0000y", o, &n, &at)); /* a NUL inside */
    assert_int_equal(n, 3);
    assert_memory_equal(o, "x\0y", 4);
    assert_null(unescape("\xc3\xa9\xf0\x9f\x98\x80", o, &n, &at)); /* raw UTF-8 kept */
    assert_string_equal(o, "\xc3\xa9\xf0\x9f\x98\x80");
    assert_null(unescape("\\udbff\\udfff", o, &n, &at)); /* U+10FFFF */
    assert_string_equal(o, "\xf4\x8f\xbf\xbf");
    static const struct {
        const char *lit;
        size_t at;
        const char *why;
    } BAD[] = {
        {"ab\\udc00", 2, "lone low surrogate"},
        {"\\ud800", 0, "high surrogate without"}, /* at the end */
        {"x\\ud800y", 1, "high surrogate without"},
        {"\\ud800\\u0041", 0, "high surrogate without"}, /* followed by no low one */
        {"\\ud800\\ud800", 0, "high surrogate without"},
        {"\\ud800\\udc0", 0, "high surrogate without"}, /* its low one cut short */
        {"\\ud800\\n", 0, "high surrogate without"},
        {"ab\\u12", 2, "malformed \\u"}, /* truncated */
        {"\\u12g4", 0, "malformed \\u"},
        {"\\u", 0, "malformed \\u"},
        {"a\\x", 1, "unknown escape"},
        {"a\\'", 1, "unknown escape"},
        {"ab\\", 2, "unknown escape"}, /* a backslash at the end */
        {"a\tb", 1, "control character"},
        {"a\x1f", 1, "control character"},
        {"a\xc0\xaf", 1, "not valid UTF-8"},      /* overlong */
        {"ab\xed\xa0\x80", 2, "not valid UTF-8"}, /* a raw surrogate */
        {"abc\xe2\x82", 3, "not valid UTF-8"},    /* truncated */
        {"\xff", 0, "not valid UTF-8"},
    };
    /* the literal ends where len says, not at a NUL: an escape cut there is refused, not read on */
    assert_non_null(ma_json_unescape("ab\\n", 3, o, &n, &at));
    assert_int_equal(at, 2);
    assert_non_null(ma_json_unescape("\\u0041", 5, o, &n, &at));
    assert_non_null(ma_json_unescape("\\ud83d\\ude00", 11, o, &n, &at));
    assert_non_null(ma_json_unescape("\xc3\xa9", 1, o, &n, &at));
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        const char *why = unescape(BAD[i].lit, o, &n, &at);
        if (!why || !strstr(why, BAD[i].why) || at != BAD[i].at)
            fail_msg("case %zu: %s at %zu, want %s at %zu", i, why ? why : "(accepted)", at, BAD[i].why, BAD[i].at);
    }
}

static void test_json_string_end(void **state) {
    (void)state;
    assert_int_equal(ma_json_string_end("", 0), 0);
    assert_int_equal(ma_json_string_end("\"", 1), 0);
    assert_int_equal(ma_json_string_end("abc\"def", 7), 3);
    assert_int_equal(ma_json_string_end("a\\\"b\"", 5), 4); /* an escaped quote is inside */
    assert_int_equal(ma_json_string_end("a\\\\\"b", 5), 3); /* an escaped backslash, then the end */
    assert_int_equal(ma_json_string_end("abc", 3), 3);      /* unterminated */
    assert_int_equal(ma_json_string_end("abc\\", 4), 4);    /* a backslash at the very end */
    assert_int_equal(ma_json_string_end("ab\\\"", 4), 4);
}

/* ------------------------------------------------------------------------------ time */

static void test_clock(void **state) {
    (void)state;
    double last = ma_now_ms();
    for (int i = 0; i < 1000; i++) {
        const double t = ma_now_ms();
        assert_true(t >= last);
        last = t;
    }
    const double a = ma_now_ms(), as = ma_now_s();
    const struct timespec d = {0, 5 * 1000 * 1000};
    assert_int_equal(clock_nanosleep(CLOCK_MONOTONIC, 0, &d, NULL), 0);
    const double b = ma_now_ms(), bs = ma_now_s();
    assert_true(b - a >= 4.999); /* the same clock as nanosleep's: it advanced at least 5 ms */
    assert_true(bs - as >= 0.004999);
    assert_true(fabs(as * 1e3 - a) < 1e3 && fabs(bs * 1e3 - b) < 1e3); /* one clock, two units */
}

/* ------------------------------------------------------------------------------ statistics */

static void test_percentile(void **state) {
    (void)state;
    static double v[4096];
    /* every n to 512, then a sample to the latency summary's 4096 values */
    for (size_t n = 1; n <= 4096; n += n < 512 ? 1 : 37) {
        static const int P[3] = {50, 90, 99};
        for (int q = 0; q < 3; q++) {
            for (size_t i = 0; i < n; i++) v[i] = (double)((i * 7919) % n + 1); /* 1..n, shuffled */
            /* nearest rank by definition: the smallest k with k / n >= p / 100 */
            size_t k = 1;
            while (100 * k < (size_t)P[q] * n) k++;
            const double got = ma_percentile(v, n, P[q]);
            if (got != (double)k) fail_msg("n %zu p %d: %g, want %zu", n, P[q], got, k);
            /* the rank the latency summary and bench --session computed before (q * n rounded up,
             * 1e-6 allowed for the product's rounding): the same for their p50 and p90 */
            if (P[q] != 99) {
                const int old = (int)((P[q] == 50 ? 0.5 : 0.9) * (double)n + 0.999999);
                if ((double)old != got) fail_msg("n %zu p %d: %g, the old rank %d", n, P[q], got, old);
            }
        }
        for (size_t i = 1; i < n; i++) assert_true(v[i - 1] <= v[i]); /* sorted in place */
    }
    double one[1] = {7};
    assert_true(ma_percentile(one, 1, 50) == 7 && ma_percentile(one, 1, 99) == 7 && ma_percentile(one, 1, 100) == 7);
    double ten[10] = {10, 9, 8, 7, 6, 5, 4, 3, 2, 1};
    assert_true(ma_percentile(ten, 10, 90) == 9); /* not the 10th: 90% of 10 is exactly 9 */
    double hundred[100];
    for (int i = 0; i < 100; i++) hundred[i] = 100 - i;
    assert_true(ma_percentile(hundred, 100, 0.07 * 100) == 7); /* p 7.000000000000001: p * n rounded first */
    assert_true(ma_percentile(ten, 10, 0.001) == 1);           /* a rank below 1: the smallest */
    assert_true(ma_percentile(ten, 10, 100) == 10);
}

static void test_median(void **state) {
    (void)state;
    double a[1] = {3};
    assert_true(ma_median(a, 1) == 3);
    double b[2] = {4, 1};
    assert_true(ma_median(b, 2) == 2.5);
    double c[5] = {5, 1, 4, 2, 3};
    assert_true(ma_median(c, 5) == 3);
    assert_true(c[0] == 1 && c[4] == 5); /* sorted in place */
    double d[4] = {0.1, 0.7, 0.3, 0.2};
    assert_true(ma_median(d, 4) == 0.5 * (0.2 + 0.3));
    double e[3] = {-1, -1, -1};
    assert_true(ma_median(e, 3) == -1);
    ma_sort_doubles(NULL, 0); /* nothing to sort */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grow_cap), cmocka_unit_test(test_grow_array),    cmocka_unit_test(test_buf),
        cmocka_unit_test(test_buf_cap),  cmocka_unit_test(test_utf8_edges),    cmocka_unit_test(test_utf8_exhaustive),
        cmocka_unit_test(test_utf8_put), cmocka_unit_test(test_json_unescape), cmocka_unit_test(test_json_string_end),
        cmocka_unit_test(test_clock),    cmocka_unit_test(test_percentile),    cmocka_unit_test(test_median),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
