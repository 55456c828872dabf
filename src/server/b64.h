/* SPDX-License-Identifier: Apache-2.0 */
/* Strict base64 and the websocket accept key (b64.c). */
#ifndef MA_SERVER_B64_H
#define MA_SERVER_B64_H

#include <stddef.h>
#include <stdint.h>

/* Sec-WebSocket-Accept for a key: base64(SHA-1(key + the RFC's GUID)); out holds 29 bytes.
 * Returns 0, or -1 when the key is not the base64 of 16 bytes. */
int ma_ws_accept_key(const char *key, char out[29]);

/* Decode base64 text (standard alphabet, '=' padding optional but only at the end) into out
 * (room for ma_b64_decoded_max(len) bytes). Returns the byte count, or -1 with *bad_at the
 * offset of the first invalid character (or len for a truncated last group). */
long ma_b64_decode(const char *in, size_t len, uint8_t *out, size_t *bad_at);
size_t ma_b64_decoded_max(size_t len);
/* encode n bytes; out holds 4 * ((n + 2) / 3) + 1 bytes; returns the length written */
size_t ma_b64_encode(const uint8_t *in, size_t n, char *out);

#endif
