/* SPDX-License-Identifier: Apache-2.0 */
/* The server's one decision on each request (server/gate.h), enumerated: every path x method x
 * upgrade x key x slot x drain x HTTP version, against the rules restated here; the key's
 * comparison; the budgets; the websocket accept key and base64 (server/b64.h); the text of
 * /metrics and the status page's percentiles (server/metrics.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "server/b64.h"
#include "server/budget.h"
#include "server/gate.h"
#include "server/internal.h"
#include "server/metrics.h"

static const char *const PATHS[] = {"/healthz", "/health", "/act", "/reset",    "/",        "/status.json", "/status.js",
                                    "/metrics", "/nope",   "",     "/healthz/", "/HEALTHZ", "/act?x=1"};
static const char *const METHODS[] = {"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "CONNECT", "get", ""};

static int is(const char *a, const char *b) { return !strcmp(a, b); }

/* what (path, method) serves when nothing refuses it: the route, or 405 / 404 */
static ma_route expected_route(const char *p, const char *m, int *status) {
    const int get = is(m, "GET") || is(m, "HEAD"), post = is(m, "POST");
    *status = 0;
    if (is(p, "/act")) {
        if (post) return MA_R_ACT;
        if (get) return MA_R_HEALTH;
        *status = 405;
        return MA_R_REFUSED;
    }
    if (is(p, "/reset")) {
        if (post) return MA_R_RESET;
        *status = 405;
        return MA_R_REFUSED;
    }
    struct {
        const char *p;
        ma_route r;
    } gets[] = {{"/healthz", MA_R_HEALTHZ},    {"/health", MA_R_HEALTH},       {"/", MA_R_PAGE},
                {"/status.json", MA_R_STATUS}, {"/status.js", MA_R_STATUS_JS}, {"/metrics", MA_R_METRICS}};
    for (size_t i = 0; i < sizeof gets / sizeof gets[0]; i++)
        if (is(p, gets[i].p)) {
            if (get) return gets[i].r;
            *status = 405;
            return MA_R_REFUSED;
        }
    *status = 404;
    return MA_R_REFUSED;
}

static void test_gate_enumerated(void **state) {
    (void)state;
    int n = 0, n_allowed = 0;
    for (size_t pi = 0; pi < sizeof PATHS / sizeof PATHS[0]; pi++)
        for (size_t mi = 0; mi < sizeof METHODS / sizeof METHODS[0]; mi++)
            for (int up = 0; up < 2; up++)
                for (int key = MA_KEY_ABSENT; key <= MA_KEY_RIGHT; key++)
                    for (int reserved = 0; reserved < 2; reserved++)
                        for (int stopping = 0; stopping < 2; stopping++)
                            for (int h10 = 0; h10 < 2; h10++) {
                                const char *p = PATHS[pi], *m = METHODS[mi];
                                const ma_gate_in in = {m, p, h10, up, key, reserved, stopping};
                                ma_gate g;
                                ma_gate_decide(&in, &g);
                                n++;
                                const int health = (is(p, "/healthz") || is(p, "/health")) && (is(m, "GET") || is(m, "HEAD")) && !up;
                                const int upgrade = up && is(m, "GET");
                                char where[160];
                                snprintf(where, sizeof where, "%s %s upgrade=%d key=%d reserved=%d stopping=%d http10=%d", m, p, up, key,
                                         reserved, stopping, h10);
                                /* the exemption is exactly a plain GET/HEAD of a health path */
                                if (g.health != health) fail_msg("health flag: %s", where);
                                if (g.inference != (upgrade || (is(m, "POST") && is(p, "/act")))) fail_msg("inference flag: %s", where);
                                /* nothing passes without the key or with a health slot, but the exemption */
                                if (g.route != MA_R_REFUSED && !health && (key != MA_KEY_RIGHT || reserved))
                                    fail_msg("let through: %s", where);
                                int want_status = 0;
                                ma_route want;
                                if (health) want = is(p, "/healthz") ? MA_R_HEALTHZ : MA_R_HEALTH;
                                else if (reserved) want = MA_R_REFUSED, want_status = 503;
                                else if (key != MA_KEY_RIGHT) want = MA_R_REFUSED, want_status = 401;
                                else if (upgrade) {
                                    want = h10 || stopping ? MA_R_REFUSED : MA_R_WEBSOCKET;
                                    want_status = h10 ? 400 : stopping ? 503 : 0;
                                } else {
                                    want = expected_route(p, m, &want_status);
                                    if (want == MA_R_ACT && stopping) want = MA_R_REFUSED, want_status = 503;
                                }
                                if (g.route != want) fail_msg("route %d, want %d: %s", g.route, want, where);
                                if (want == MA_R_REFUSED && g.status != want_status)
                                    fail_msg("status %d, want %d: %s", g.status, want_status, where);
                                if (g.route == MA_R_REFUSED && !g.msg[0]) fail_msg("no message: %s", where);
                                if (g.status == 405 && !g.allow) fail_msg("405 without Allow: %s", where);
                                if (g.route == MA_R_REFUSED && g.inference != (g.reason >= 0)) fail_msg("reason: %s", where);
                                n_allowed += g.route != MA_R_REFUSED;
                            }
    assert_int_equal(n, (int)(sizeof PATHS / sizeof PATHS[0] * sizeof METHODS / sizeof METHODS[0]) * 2 * 3 * 2 * 2 * 2);
    assert_true(n_allowed > 0);
}

static void test_key(void **state) {
    (void)state;
    const unsigned char k[] = "s3cret";
    assert_int_equal(ma_gate_key(NULL, 0, k, 6), MA_KEY_ABSENT);
    assert_int_equal(ma_gate_key("Api-Key s3cret", 14, k, 6), MA_KEY_RIGHT);
    assert_int_equal(ma_gate_key("Bearer s3cret", 13, k, 6), MA_KEY_RIGHT);
    assert_int_equal(ma_gate_key("Api-Key s3cre", 13, k, 6), MA_KEY_WRONG);
    assert_int_equal(ma_gate_key("Api-Key s3cretx", 15, k, 6), MA_KEY_WRONG);
    assert_int_equal(ma_gate_key("Api-Key s3cret\0x", 16, k, 6), MA_KEY_WRONG); /* the header's whole length counts */
    assert_int_equal(ma_gate_key("api-key s3cret", 14, k, 6), MA_KEY_WRONG);
    assert_int_equal(ma_gate_key("s3cret", 6, k, 6), MA_KEY_WRONG);
    assert_int_equal(ma_gate_key("Api-Key ", 8, k, 6), MA_KEY_WRONG);
}

static void test_budget(void **state) {
    (void)state;
    ma_budget a = {"a", "--a", "", 100, 0, 0, 0}, b = {"b", "--b", "", 50, 0, 0, 0};
    assert_int_equal(ma_budget_take(&a, 60), 0);
    assert_int_equal(ma_budget_take(&a, 41), -1); /* nothing taken */
    assert_int_equal(a.used, 60);
    assert_int_equal(a.refused, 1);
    assert_int_equal(ma_budget_take(&a, 40), 0);
    assert_int_equal(ma_budget_take(&a, SIZE_MAX), -1); /* no wrap */
    assert_int_equal(ma_budget_move(&a, &b, 60), -1);   /* b refuses: a keeps it */
    assert_int_equal(a.used, 100);
    assert_int_equal(ma_budget_move(&a, &b, 50), 0);
    assert_true(a.used == 50 && b.used == 50 && a.peak == 100);
    ma_budget_give(&b, 80); /* never below 0 */
    assert_int_equal(b.used, 0);
}

static void test_accept_key(void **state) {
    (void)state;
    char acc[29];
    assert_int_equal(ma_ws_accept_key("dGhlIHNhbXBsZSBub25jZQ==", acc), 0); /* RFC 6455 section 1.3 */
    assert_string_equal(acc, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    assert_int_equal(ma_ws_accept_key("short", acc), -1);
    assert_int_equal(ma_ws_accept_key("dGhlIHNhbXBsZSBub25jZQ=!", acc), -1);
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
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_gate_enumerated), cmocka_unit_test(test_key),
                                       cmocka_unit_test(test_budget),          cmocka_unit_test(test_accept_key),
                                       cmocka_unit_test(test_base64),          cmocka_unit_test(test_percentiles),
                                       cmocka_unit_test(test_metrics_text)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
