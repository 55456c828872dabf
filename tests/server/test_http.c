/* SPDX-License-Identifier: Apache-2.0 */
/* The server's wire primitives (server/http.h) on the cases their RFCs spell out, and the
 * text of /metrics and the status page's percentiles (server/metrics.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "server/http.h"
#include "server/metrics.h"

static int head(const char *text, ma_http_req *r, int *status) {
    char msg[160];
    return ma_http_parse_head((const uint8_t *)text, strlen(text), r, status, msg, sizeof msg);
}

static void test_heads(void **state) {
    (void)state;
    ma_http_req r;
    int st = 0;
    assert_int_equal(head("POST /act?format=list HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\nExpect: 100-Continue\r\n\r\nrest", &r, &st),
                     1);
    assert_int_equal(r.method, MA_HTTP_POST);
    assert_string_equal(r.path, "/act");
    assert_string_equal(r.query, "format=list");
    assert_int_equal(r.content_length, 12);
    assert_true(r.expect_continue && r.keep_alive && !r.chunked);
    assert_int_equal(r.head_len, strlen("POST /act?format=list HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\nExpect: 100-Continue\r\n\r\n"));
    /* bare LF, HTTP/1.0 closes by default, absolute form, a leading CRLF after a previous body */
    assert_int_equal(head("\r\nGET http://h:1/healthz HTTP/1.0\nHost: x\n\n", &r, &st), 1);
    assert_string_equal(r.path, "/healthz");
    assert_false(r.keep_alive);
    assert_int_equal(head("GET / HTTP/1.1\r\nConnection: keep-alive, Upgrade\r\nUpgrade: WebSocket\r\nSec-WebSocket-Version: 13\r\n"
                          "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
                          &r, &st),
                     1);
    assert_true(r.upgrade_websocket);
    assert_int_equal(r.ws_version, 13);
    /* HTTP/1.0: no chunked framing, no websocket upgrade (RFC 9112 6.1, RFC 6455 4.1; F19) */
    assert_int_equal(head("POST /act HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", &r, &st), -1);
    assert_int_equal(st, 400);
    assert_int_equal(head("GET / HTTP/1.0\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                          "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
                          &r, &st),
                     -1);
    assert_int_equal(st, 400);
    /* refusals */
    assert_int_equal(head("POST /act HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", &r, &st), -1);
    assert_int_equal(st, 400);
    assert_int_equal(head("POST /act HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", &r, &st), -1);
    assert_int_equal(st, 400);
    assert_int_equal(head("POST /act HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", &r, &st), 1); /* the same twice */
    assert_int_equal(head("POST /act HTTP/1.1\r\nContent-Length: -5\r\n\r\n", &r, &st), -1);
    assert_int_equal(head("POST /act HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", &r, &st), -1);
    assert_int_equal(st, 501);
    assert_int_equal(head("GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n", &r, &st), -1); /* obsolete folding */
    assert_int_equal(head("GET / HTTP/2.0\r\n\r\n", &r, &st), -1);
    assert_int_equal(st, 505);
    assert_int_equal(head("GET / HTTP/1.1\r\nExpect: something\r\n\r\n", &r, &st), -1);
    assert_int_equal(st, 417);
    assert_int_equal(head("GET nothing HTTP/1.1\r\n\r\n", &r, &st), -1);
    assert_int_equal(head("\x16\x03\x01\x02\x00\x01", &r, &st), -1); /* a TLS hello: refused at once */
    assert_int_equal(head("GET / HTTP/1.1\r\nHost: x", &r, &st), 0); /* more to come */
    static char big[MA_HTTP_MAX_HEAD + 10];
    memset(big, 'a', sizeof big - 1);
    memcpy(big, "GET / HTTP/1.1\r\nX: ", 19);
    assert_int_equal(head(big, &r, &st), -1);
    assert_int_equal(st, 431);
}

static void test_chunked(void **state) {
    (void)state;
    const char *body = "4\r\nWiki\r\n5;name=v\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nX-T: 1\r\n\r\nNEXT";
    uint8_t out[64];
    size_t n = 0, used = 0;
    char msg[128];
    ma_http_chunked c;
    memset(&c, 0, sizeof c);
    assert_int_equal(ma_http_chunked_feed(&c, (const uint8_t *)body, strlen(body), &used, out, &n, sizeof out, msg, sizeof msg), 1);
    assert_int_equal(n, 23);
    assert_memory_equal(out, "Wikipedia in\r\n\r\nchunks.", 23);
    assert_int_equal(used, strlen(body) - 4);
    /* byte by byte gives the same */
    memset(&c, 0, sizeof c);
    n = 0;
    int r = 0;
    size_t total = 0;
    for (size_t i = 0; r == 0; i++) {
        r = ma_http_chunked_feed(&c, (const uint8_t *)body + i, 1, &used, out, &n, sizeof out, msg, sizeof msg);
        total += used;
    }
    assert_int_equal(r, 1);
    assert_int_equal(total, strlen(body) - 4);
    /* over the limit, malformed */
    memset(&c, 0, sizeof c);
    n = 0;
    assert_int_equal(ma_http_chunked_feed(&c, (const uint8_t *)"ff\r\n", 4, &used, out, &n, 8, msg, sizeof msg), 0);
    assert_int_equal(ma_http_chunked_feed(&c, (const uint8_t *)"0123456789", 10, &used, out, &n, 8, msg, sizeof msg), -2);
    memset(&c, 0, sizeof c);
    n = 0;
    assert_int_equal(ma_http_chunked_feed(&c, (const uint8_t *)"zz\r\n", 4, &used, out, &n, sizeof out, msg, sizeof msg), -1);
    memset(&c, 0, sizeof c);
    assert_int_equal(ma_http_chunked_feed(&c, (const uint8_t *)"1234567890abcdef0\r\n", 19, &used, out, &n, sizeof out, msg, sizeof msg),
                     -1);
    memset(&c, 0, sizeof c);
    n = 0;
    assert_int_equal(ma_http_chunked_feed(&c, (const uint8_t *)"2\r\nabc\r\n", 8, &used, out, &n, sizeof out, msg, sizeof msg), -1);
    /* whitespace after the size only before an extension (issue 36 F19: "2 9" was read as 2) */
    memset(&c, 0, sizeof c);
    n = 0;
    assert_int_equal(ma_http_chunked_feed(&c, (const uint8_t *)"2 9\r\nab\r\n0\r\n\r\n", 17, &used, out, &n, sizeof out, msg, sizeof msg),
                     -1);
    assert_non_null(strstr(msg, "after the chunk size"));
    memset(&c, 0, sizeof c);
    n = 0;
    assert_int_equal(
        ma_http_chunked_feed(&c, (const uint8_t *)"2 \t; a=b\r\nab\r\n0\r\n\r\n", 22, &used, out, &n, sizeof out, msg, sizeof msg), 1);
    assert_int_equal(n, 2);
}

static void test_websocket(void **state) {
    (void)state;
    char acc[29];
    assert_int_equal(ma_ws_accept_key("dGhlIHNhbXBsZSBub25jZQ==", acc), 0); /* RFC 6455 section 1.3 */
    assert_string_equal(acc, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    assert_int_equal(ma_ws_accept_key("short", acc), -1);
    ma_ws_frame f;
    char msg[128];
    const uint8_t small[] = {0x82, 0x85, 1, 2, 3, 4, 'h' ^ 1, 'e' ^ 2, 'l' ^ 3, 'l' ^ 4, 'o' ^ 1};
    assert_int_equal(ma_ws_parse_header(small, sizeof small, &f, msg, sizeof msg), 1);
    assert_true(f.fin && f.opcode == MA_WS_BINARY && f.len == 5 && f.header_len == 6);
    uint8_t p[5];
    memcpy(p, small + 6, 5);
    ma_ws_unmask(p, 5, f.mask, 0);
    assert_memory_equal(p, "hello", 5);
    const uint8_t mid[] = {0x02, 0xfe, 0x01, 0x00, 9, 9, 9, 9};
    assert_int_equal(ma_ws_parse_header(mid, sizeof mid, &f, msg, sizeof msg), 1);
    assert_true(!f.fin && f.len == 256 && f.header_len == 8);
    assert_int_equal(ma_ws_parse_header(mid, 5, &f, msg, sizeof msg), 0);
    const uint8_t unmasked[] = {0x82, 0x05};
    assert_int_equal(ma_ws_parse_header(unmasked, 2, &f, msg, sizeof msg), -1);
    const uint8_t rsv[] = {0xc2, 0x80, 0, 0, 0, 0};
    assert_int_equal(ma_ws_parse_header(rsv, sizeof rsv, &f, msg, sizeof msg), -1);
    const uint8_t bigping[] = {0x89, 0xfe, 0x00, 0x80, 0, 0, 0, 0};
    assert_int_equal(ma_ws_parse_header(bigping, sizeof bigping, &f, msg, sizeof msg), -1);
    const uint8_t fragclose[] = {0x08, 0x80, 0, 0, 0, 0};
    assert_int_equal(ma_ws_parse_header(fragclose, sizeof fragclose, &f, msg, sizeof msg), -1);
    const uint8_t top[] = {0x82, 0xff, 0x80, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0};
    assert_int_equal(ma_ws_parse_header(top, sizeof top, &f, msg, sizeof msg), -1);
    uint8_t h[10];
    assert_int_equal(ma_ws_frame_header(h, MA_WS_BINARY, 125), 2);
    assert_int_equal(ma_ws_frame_header(h, MA_WS_BINARY, 126), 4);
    assert_int_equal(ma_ws_frame_header(h, MA_WS_BINARY, 70000), 10);
    assert_int_equal(h[0], 0x82);
}

static void test_base64(void **state) {
    (void)state;
    uint8_t out[16];
    size_t bad = 0;
    assert_int_equal(ma_b64_decode("aGVsbG8=", 8, out, &bad), 5);
    assert_memory_equal(out, "hello", 5);
    assert_int_equal(ma_b64_decode("aGVsbG8", 7, out, &bad), 5); /* unpadded */
    assert_int_equal(ma_b64_decode("", 0, out, &bad), 0);
    assert_int_equal(ma_b64_decode("aGV@bG8=", 8, out, &bad), -1);
    assert_int_equal(bad, 3);
    assert_int_equal(ma_b64_decode("aGVsbG8==", 9, out, &bad), -1);
    assert_int_equal(ma_b64_decode("a", 1, out, &bad), -1);
    assert_int_equal(ma_b64_decode("aGVsbG9=", 8, out, &bad), -1); /* non-zero unused bits */
    assert_int_equal(ma_b64_decode("aGVs bG8=", 9, out, &bad), -1);
    char enc[16];
    assert_int_equal(ma_b64_encode((const uint8_t *)"hello", 5, enc), 8);
    assert_string_equal(enc, "aGVsbG8=");
}

/* nearest rank: the ceil(p / 100 * n)-th smallest */
static void test_percentiles(void **state) {
    (void)state;
    double one[1] = {7};
    assert_true(ma_percentile(one, 1, 50) == 7 && ma_percentile(one, 1, 99) == 7);
    double v[10];
    for (int p = 0; p < 3; p++) {
        static const double P[3] = {50, 90, 99}, WANT[3] = {5, 9, 10};
        for (int i = 0; i < 10; i++) v[i] = 10 - i; /* 10 .. 1: sorted in place */
        assert_true(ma_percentile(v, 10, P[p]) == WANT[p]);
    }
    double w[64];
    for (int i = 0; i < 64; i++) w[i] = i + 1;
    assert_true(ma_percentile(w, 64, 50) == 32 && ma_percentile(w, 64, 90) == 58 && ma_percentile(w, 64, 99) == 64);
}

/* buckets cumulative, +Inf equal to the count, a value on a bound in that bucket; label values escaped */
static void test_metrics_text(void **state) {
    (void)state;
    ma_histogram h;
    ma_hist_init(&h, &ma_request_buckets);
    ma_hist_observe(&h, 0.01);
    ma_hist_observe(&h, 0.3);
    ma_hist_observe(&h, 1e9);
    ma_hist_observe(&h, -1);
    ma_textbuf t = {0};
    ma_tb_histogram(&t, "x_seconds", "a=\"b\"", &h);
    assert_false(t.failed);
    assert_non_null(strstr(t.b.data, "x_seconds_bucket{a=\"b\",le=\"0.01\"} 2\n"));
    assert_non_null(strstr(t.b.data, "x_seconds_bucket{a=\"b\",le=\"0.25\"} 2\n"));
    assert_non_null(strstr(t.b.data, "x_seconds_bucket{a=\"b\",le=\"0.5\"} 3\n"));
    assert_non_null(strstr(t.b.data, "x_seconds_bucket{a=\"b\",le=\"60\"} 3\n"));
    assert_non_null(strstr(t.b.data, "x_seconds_bucket{a=\"b\",le=\"+Inf\"} 4\n"));
    assert_non_null(strstr(t.b.data, "x_seconds_count{a=\"b\"} 4\n"));
    assert_non_null(strstr(t.b.data, "x_seconds_sum{a=\"b\"} 1000000000.31\n"));
    ma_tb_free(&t);
    ma_tb_label_value(&t, "q\"b\\n\nl\x01\xff\xc3\xa9");
    assert_string_equal(t.b.data, "q\\\"b\\\\n\\nl??\xc3\xa9");
    ma_tb_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_heads),       cmocka_unit_test(test_chunked),
                                       cmocka_unit_test(test_websocket),   cmocka_unit_test(test_base64),
                                       cmocka_unit_test(test_percentiles), cmocka_unit_test(test_metrics_text)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
