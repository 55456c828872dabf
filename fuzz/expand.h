/* SPDX-License-Identifier: Apache-2.0 */
/* For the fuzzers of decoders whose size arithmetic only large inputs reach: an input that starts
 * with 0xc1 (a byte msgpack never uses and JSON never starts with) is a recipe, expanded before
 * decoding: pieces of [n: 1 byte][n bytes][count: 3 bytes, big-endian], each piece's bytes
 * repeated count times, up to 48 MiB in all. A few dozen bytes of recipe make a message of
 * hundreds of kilobytes (issue 36's F1 needed 0.5 MB). */
#ifndef MA_FUZZ_EXPAND_H
#define MA_FUZZ_EXPAND_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EXPANDED_MAX (48u << 20)

static inline uint8_t *fuzz_expand(const uint8_t *d, size_t n, size_t *out_len) {
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

#endif
