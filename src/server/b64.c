/* SPDX-License-Identifier: Apache-2.0 */
/* Strict base64 (RFC 4648) for json_numpy and data URLs, and the websocket handshake's accept key
 * (RFC 6455 section 4.2.2; SHA-1 from OpenSSL's libcrypto). */
#include "server/b64.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>

int ma_ws_accept_key(const char *key, char out[29]) {
    uint8_t raw[24];
    size_t bad;
    if (strlen(key) != 24 || ma_b64_decode(key, 24, raw, &bad) != 16) return -1;
    char cat[24 + 36 + 1];
    snprintf(cat, sizeof cat, "%s258EAFA5-E914-47DA-95CA-C5AB0DC85B11", key); /* RFC 6455 1.3 */
    uint8_t md[EVP_MAX_MD_SIZE];
    unsigned mdl = 0;
    if (!EVP_Digest(cat, strlen(cat), md, &mdl, EVP_sha1(), NULL) || mdl != 20) return -1;
    ma_b64_encode(md, 20, out);
    return 0;
}

/* ------------------------------------------------------------------------- base64 */

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int b64val(uint8_t c) {
    return c >= 'A' && c <= 'Z'   ? c - 'A'
           : c >= 'a' && c <= 'z' ? c - 'a' + 26
           : c >= '0' && c <= '9' ? c - '0' + 52
           : c == '+'             ? 62
           : c == '/'             ? 63
                                  : -1;
}

size_t ma_b64_decoded_max(size_t len) { return len / 4 * 3 + 3; }

long ma_b64_decode(const char *in, size_t len, uint8_t *out, size_t *bad_at) {
    size_t n = len, pad = 0;
    if (n >= 1 && in[n - 1] == '=') {
        n--;
        pad++;
    }
    if (n >= 1 && in[n - 1] == '=') {
        n--;
        pad++;
    }
    if (pad && len % 4) {
        *bad_at = len;
        return -1;
    }
    if (n % 4 == 1) {
        *bad_at = len;
        return -1;
    }
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        const int v = b64val((uint8_t)in[i]);
        if (v < 0) {
            *bad_at = i;
            return -1;
        }
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (uint8_t)(acc >> bits);
        }
    }
    /* the unused low bits of the last group must be zero (a canonical encoding) */
    if (bits && (acc & ((1u << bits) - 1))) {
        *bad_at = n - 1;
        return -1;
    }
    return (long)o;
}

size_t ma_b64_encode(const uint8_t *in, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        const uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0) | (i + 2 < n ? in[i + 2] : 0);
        out[o++] = B64[v >> 18 & 63];
        out[o++] = B64[v >> 12 & 63];
        out[o++] = i + 1 < n ? B64[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? B64[v & 63] : '=';
    }
    out[o] = '\0';
    return o;
}
