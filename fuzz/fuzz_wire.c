/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer: the server's request decoders (msgpack-numpy, json_numpy) on arbitrary bytes.
 *
 * The decoders' size arithmetic (nested lists whose sizes multiply, decoding costs that grow
 * with the message) is reached only by messages of hundreds of kilobytes, past what a fuzzer
 * explores well. So an input that starts with 0xc1 (a byte msgpack never uses and JSON never
 * starts with) is a recipe, expanded before decoding: pieces of [n: 1 byte][n bytes][count: 3
 * bytes, big-endian], each piece's bytes repeated count times, up to 48 MiB in all. A few dozen
 * bytes of recipe make the message of issue 36's F1 (four list sizes whose product wraps). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/wire.h"

#define EXPANDED_MAX (48u << 20)

static uint8_t *expand(const uint8_t *d, size_t n, size_t *out_len) {
    size_t len = 0, at = 1;
    while (at < n) { /* the size first */
        const size_t k = d[at];
        if (at + 1 + k + 3 > n) break;
        const size_t count = (size_t)d[at + 1 + k] << 16 | (size_t)d[at + 2 + k] << 8 | d[at + 3 + k];
        if (k && count > (EXPANDED_MAX - len) / k) return NULL;
        len += k * count;
        at += 1 + k + 3;
    }
    uint8_t *o = malloc(len ? len : 1);
    if (!o) return NULL;
    size_t w = 0;
    for (at = 1; at < n;) {
        const size_t k = d[at];
        if (at + 1 + k + 3 > n) break;
        const size_t count = (size_t)d[at + 1 + k] << 16 | (size_t)d[at + 2 + k] << 8 | d[at + 3 + k];
        for (size_t i = 0; i < count; i++, w += k) memcpy(o + w, d + at + 1, k);
        at += 1 + k + 3;
    }
    *out_len = len;
    return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ma_wire_request r;
    ma_error err;
    const ma_wire_model m = {10, 32, 8, 10}; /* horizon, max_action_dim, state_dim, n_steps */
    uint8_t *big = NULL;
    if (size && data[0] == 0xc1) {
        big = expand(data, size, &size);
        if (!big) return 0;
        data = big;
    }
    for (int flip = 0; flip < 2; flip++) {
        if (ma_wire_decode_msgpack(data, size, flip, &m, &r, &err) == MA_OK) ma_wire_request_free(&r);
        if (!big && ma_wire_decode_json((const char *)data, size, flip, &m, &r, &err) == MA_OK) ma_wire_request_free(&r);
    }
    free(big);
    return 0;
}
