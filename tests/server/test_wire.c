/* SPDX-License-Identifier: Apache-2.0 */
/* The request decoders (server/wire.h) on messages built to reach their size arithmetic: nested
 * lists whose first sizes multiply past 2^64 (issue 36 F1), and messages whose decoding would
 * cost many times their size (F8). Each message is built here byte by byte from the msgpack
 * specification, not with our own encoder. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/util.h"
#include "server/wire.h"

typedef struct {
    uint8_t *p;
    size_t n, cap;
} mbuf;

static void put(mbuf *b, const void *d, size_t n) {
    assert_int_equal(ma_grow_array(&b->p, &b->cap, b->n, n, 1), MA_OK);
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void byte(mbuf *b, uint8_t v) { put(b, &v, 1); }
static void be32(mbuf *b, uint8_t tag, uint32_t v) {
    const uint8_t h[5] = {tag, (uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    put(b, h, 5);
}
static void str(mbuf *b, const char *s) {
    byte(b, (uint8_t)(0xa0 | strlen(s)));
    put(b, s, strlen(s));
}
static void nils(mbuf *b, size_t n) {
    for (size_t i = 0; i < n; i++) byte(b, 0xc0);
}

static const ma_wire_model M = {10, 32, 8, 10};

/* F1: 27905 x 34724 x 49477 x 384773 = 2^64 + 4. The first list at each level has the next
 * size; the other elements are nils (one byte each), so every size is within the bytes after it
 * and the sanity walk passes. Before the fix: a 32-byte buffer and 384,773 doubles written. */
static void test_list_sizes_whose_product_wraps(void **state) {
    (void)state;
    static const uint32_t S[4] = {27905, 34724, 49477, 384773};
    mbuf b = {0};
    byte(&b, 0x81);
    str(&b, "state");
    for (int d = 0; d < 4; d++) be32(&b, 0xdd, S[d]);
    for (uint32_t i = 0; i < S[3]; i++) byte(&b, 0x00); /* the leaves: fixint 0 */
    for (int d = 2; d >= 0; d--) nils(&b, S[d] - 1);    /* the rest of each outer list */
    assert_int_equal(ma_wire_msgpack_sane(b.p, b.n, 16), 0);
    ma_wire_request r;
    ma_error err = {0};
    assert_int_not_equal(ma_wire_decode_msgpack(b.p, b.n, 0, &M, &r, &err), MA_OK);
    /* its decoding cost (497k objects x 32 bytes) fits 4x the message + 16 MiB: the product's
     * own check refuses it */
    assert_non_null(strstr(err.msg, "state"));
    assert_non_null(strstr(err.msg, "rectangular"));
    free(b.p);
}

/* a nested list that is rectangular in its first lists only: the leaf count is checked */
static void test_ragged_list_refused(void **state) {
    (void)state;
    mbuf b = {0};
    byte(&b, 0x81);
    str(&b, "state");
    byte(&b, 0x92); /* [ [1, 2], [3] ] */
    byte(&b, 0x92), byte(&b, 1), byte(&b, 2);
    byte(&b, 0x91), byte(&b, 3);
    ma_wire_request r;
    ma_error err = {0};
    assert_int_not_equal(ma_wire_decode_msgpack(b.p, b.n, 0, &M, &r, &err), MA_OK);
    assert_non_null(strstr(err.msg, "rectangular"));
    free(b.p);
}

/* F8: 8 MiB of nils under a key that means nothing costs nothing (it is skipped, never
 * unpacked): the request is then refused for its missing keys, not for memory. Under a key that
 * is used, the same list is refused by its cost before msgpack-c allocates (24 bytes a nil). */
static void test_decoding_cost_bounded(void **state) {
    (void)state;
    const size_t N = 8u << 20;
    for (int used = 0; used < 2; used++) {
        mbuf b = {0};
        byte(&b, 0x81);
        str(&b, used ? "noise" : "padding");
        be32(&b, 0xdd, (uint32_t)N);
        nils(&b, N);
        ma_wire_request r;
        ma_error err = {0};
        assert_int_not_equal(ma_wire_decode_msgpack(b.p, b.n, 0, &M, &r, &err), MA_OK);
        if (used) {
            assert_non_null(strstr(err.msg, "noise: decoding it would take"));
            assert_non_null(strstr(err.msg, "4x its size + 16 MiB"));
        } else assert_non_null(strstr(err.msg, "missing key"));
        free(b.p);
    }
    assert_true(ma_wire_msgpack_budget(1000) == 4000 + (16u << 20));
    assert_true(ma_wire_msgpack_budget(SIZE_MAX / 2) == SIZE_MAX);
}

/* top-level maps of every size class, keys as str8 / str16 / bin8: each read at its length */
static void test_map_and_key_forms(void **state) {
    (void)state;
    static const uint8_t forms[][4] = {{0xde, 0x00, 0x01}, {0xdf, 0x00, 0x00, 0x00}};
    for (int f = 0; f < 2; f++)
        for (int k = 0; k < 3; k++) {
            mbuf b = {0};
            if (f == 0) put(&b, forms[0], 3);
            else {
                put(&b, forms[1], 4);
                byte(&b, 0x01);
            }
            static const uint8_t key_hdr[3][3] = {{0xd9, 5}, {0xda, 0, 5}, {0xc4, 5}};
            put(&b, key_hdr[k], k == 1 ? 3 : 2);
            put(&b, "state", 5);
            byte(&b, 0x92), byte(&b, 0x01), byte(&b, 0x02); /* [1, 2] */
            ma_wire_request r;
            ma_error err = {0};
            assert_int_not_equal(ma_wire_decode_msgpack(b.p, b.n, 0, &M, &r, &err), MA_OK);
            /* the key was read as "state" (its role claimed), then the rest is missing */
            assert_non_null(strstr(err.msg, "missing key for the agent camera"));
            b.p[b.n - 3] = 0xc0; /* a nil, then two bytes past the map: refused whole */
            assert_int_not_equal(ma_wire_decode_msgpack(b.p, b.n, 0, &M, &r, &err), MA_OK);
            free(b.p);
        }
    uint8_t trunc[] = {0xde, 0x00, 0x02, 0xa1, 'a', 0xc0}; /* two pairs promised, one given */
    ma_wire_request r;
    ma_error err = {0};
    assert_int_not_equal(ma_wire_decode_msgpack(trunc, sizeof trunc, 0, &M, &r, &err), MA_OK);
    assert_non_null(strstr(err.msg, "not a msgpack message"));
}

/* a reply whose large part (the actions) does not fit is lost whole: the small writes after it
 * must not close over the hole and leave a message that says OK with the actions missing */
static void test_reply_lost_whole_when_a_part_does_not_fit(void **state) {
    (void)state;
    float actions[70];
    for (int i = 0; i < 70; i++) actions[i] = (float)i;
    molmoact_result res;
    memset(&res, 0, sizeof res);
    res.actions = actions;
    res.n_steps = 10;
    res.action_dim = 7;
    ma_error err = {0};
    ma_wire_buf b = {0};
    assert_int_equal(ma_wire_encode_reply(&res, 1.0, -1.0, &b, &err), MA_OK); /* unbounded: whole */
    const size_t whole = b.len;
    free(b.data);
    memset(&b, 0, sizeof b);
    b.max = 96; /* room for the head and the small fields, not for the 280 bytes of actions */
    assert_int_equal(ma_wire_encode_reply(&res, 1.0, -1.0, &b, &err), MA_ERR_NOMEM);
    assert_null(b.data);
    assert_int_equal(b.len, 0);
    assert_non_null(strstr(err.msg, "reply"));
    memset(&b, 0, sizeof b);
    b.max = whole; /* exactly enough */
    assert_int_equal(ma_wire_encode_reply(&res, 1.0, -1.0, &b, &err), MA_OK);
    assert_int_equal(b.len, whole);
    free(b.data);
    molmoact_info info;
    memset(&info, 0, sizeof info);
    memset(&b, 0, sizeof b);
    b.max = 40;
    assert_int_equal(ma_wire_encode_metadata(&info, "a model name long enough not to fit in forty bytes at all", &b, &err), MA_ERR_NOMEM);
    assert_null(b.data);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_list_sizes_whose_product_wraps), cmocka_unit_test(test_ragged_list_refused),
                                       cmocka_unit_test(test_decoding_cost_bounded), cmocka_unit_test(test_map_and_key_forms),
                                       cmocka_unit_test(test_reply_lost_whole_when_a_part_does_not_fit)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
