/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer: the server's HTTP request heads, chunked bodies (fed in pieces of every size the
 * input suggests, which must decode the same as whole), websocket frame headers and base64. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/http.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ma_http_req r;
    int status;
    char msg[256];
    const int h = ma_http_parse_head(data, size, &r, &status, msg, sizeof msg);
    if (h == 1 && (r.head_len > size || r.head_len == 0)) __builtin_trap();
    if (h < 0 && (status < 400 || status > 505)) __builtin_trap();
    /* the bytes after a head (or all of them) as a chunked body: whole, then byte by byte */
    const size_t off = h == 1 ? r.head_len : 0;
    const size_t cap = 1 << 16;
    uint8_t *a = malloc(cap), *b = malloc(cap);
    if (a && b) {
        ma_http_chunked c1, c2;
        memset(&c1, 0, sizeof c1);
        memset(&c2, 0, sizeof c2);
        size_t used1 = 0, n1 = 0, n2 = 0, used2 = 0;
        const int r1 = ma_http_chunked_feed(&c1, data + off, size - off, &used1, a, &n1, cap, msg, sizeof msg);
        int r2 = 0;
        for (size_t i = off; i < size && r2 == 0; i++) {
            size_t u = 0;
            r2 = ma_http_chunked_feed(&c2, data + i, 1, &u, b, &n2, cap, msg, sizeof msg);
            used2 += u;
        }
        if (r1 == 1 && (r2 != 1 || used1 != used2 || n1 != n2 || memcmp(a, b, n1))) __builtin_trap();
        if (r1 == 1 && used1 > size - off) __builtin_trap();
    }
    free(a);
    free(b);
    /* websocket frame headers */
    ma_ws_frame f;
    if (ma_ws_parse_header(data, size, &f, msg, sizeof msg) == 1 && (f.header_len > size || f.header_len < 6)) __builtin_trap();
    uint8_t hdr[10];
    if (size >= 8) {
        uint64_t len;
        memcpy(&len, data, 8);
        if (ma_ws_frame_header(hdr, 2, len >> 1) > 10) __builtin_trap();
    }
    /* base64 round trip */
    uint8_t *dec = malloc(ma_b64_decoded_max(size) + 1);
    size_t bad;
    const long n = dec ? ma_b64_decode((const char *)data, size, dec, &bad) : -1;
    if (n >= 0) {
        char *enc = malloc(4 * (((size_t)n + 2) / 3) + 1);
        if (enc) {
            const size_t el = ma_b64_encode(dec, (size_t)n, enc);
            uint8_t *dec2 = malloc(ma_b64_decoded_max(el) + 1);
            if (dec2 && (ma_b64_decode(enc, el, dec2, &bad) != n || memcmp(dec, dec2, (size_t)n))) __builtin_trap();
            free(dec2);
            free(enc);
        }
    }
    free(dec);
    return 0;
}
