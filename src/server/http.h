/* SPDX-License-Identifier: Apache-2.0 */
/* The server's wire primitives, pure functions over byte buffers (no sockets, no allocation
 * beyond what the caller passes), so each can be fuzzed on its own:
 *
 *  - an HTTP/1.x request head parser (RFC 9112): request line, header fields, the framing of the
 *    body (Content-Length or chunked), Expect, Connection, the websocket upgrade fields and
 *    Authorization; anything ambiguous is refused (a request smuggling guard: Content-Length with
 *    Transfer-Encoding, two different lengths, obsolete line folding, control bytes);
 *  - a chunked body decoder that runs on whatever part of the body has arrived;
 *  - websocket (RFC 6455) frame headers, masking, server frames and the handshake's accept key;
 *  - strict base64 (RFC 4648, padded or not, no whitespace), reporting where it is invalid. */
#ifndef MA_SERVER_HTTP_H
#define MA_SERVER_HTTP_H

#include <stddef.h>
#include <stdint.h>

#define MA_HTTP_MAX_HEAD 16384 /* request line + header fields */
#define MA_HTTP_MAX_FIELDS 100

typedef enum { MA_HTTP_GET, MA_HTTP_HEAD, MA_HTTP_POST, MA_HTTP_OTHER } ma_http_method;

typedef struct ma_http_req {
    ma_http_method method;
    char method_name[16];
    char path[1024];         /* the target before '?', percent-escapes kept */
    char query[1024];        /* after '?', may be empty */
    int minor;               /* HTTP/1.<minor> */
    int64_t content_length;  /* -1: none given */
    int chunked;             /* Transfer-Encoding: chunked */
    int expect_continue;     /* Expect: 100-continue */
    int keep_alive;          /* after this request (HTTP/1.1 default, Connection: close/keep-alive) */
    int upgrade_websocket;   /* Upgrade: websocket and Connection: upgrade */
    int ws_version;          /* Sec-WebSocket-Version (0: absent) */
    char ws_key[64];         /* Sec-WebSocket-Key */
    char authorization[512]; /* as sent (truncated values are refused, not cut) */
    size_t authorization_len;
    char accept[256]; /* Accept */
    size_t head_len;  /* bytes of the head, including the blank line */
} ma_http_req;

/* Parse the head at the start of buf. Returns 1 when complete (r filled, r->head_len set), 0
 * when more bytes are needed (and fewer than MA_HTTP_MAX_HEAD have arrived), -1 when the request
 * is refused: *status is the HTTP status to answer (400, 414, 431, 501, 505) and msg says why. */
int ma_http_parse_head(const uint8_t *buf, size_t len, ma_http_req *r, int *status, char *msg, size_t cap);

/* A chunked body, decoded as it arrives. */
typedef struct ma_http_chunked {
    int state;          /* internal */
    uint64_t remaining; /* of the current chunk's data */
    int digits;         /* of the current size line */
    size_t line;        /* bytes of the current size line or trailer line */
} ma_http_chunked;

/* Decode from in[0..len): data bytes are appended to out (at *out_len, at most out_cap in all).
 * Returns 1 when the body is complete (*consumed: the bytes of in that belong to it), 0 when
 * all of in was consumed and more is needed, -1 on a malformed body (msg), -2 when the data
 * would exceed out_cap. */
int ma_http_chunked_feed(ma_http_chunked *c, const uint8_t *in, size_t len, size_t *consumed, uint8_t *out, size_t *out_len, size_t out_cap,
                         char *msg, size_t cap);

/* ------------------------------------------------------------------------- websocket */

enum { MA_WS_CONT = 0, MA_WS_TEXT = 1, MA_WS_BINARY = 2, MA_WS_CLOSE = 8, MA_WS_PING = 9, MA_WS_PONG = 10 };

typedef struct ma_ws_frame {
    int fin, opcode, masked;
    uint64_t len; /* payload bytes */
    uint8_t mask[4];
    size_t header_len;
} ma_ws_frame;

/* A client frame's header at the start of buf: 1 complete, 0 more bytes needed, -1 a protocol
 * violation (msg; answer close 1002): reserved bits or opcodes, an unmasked frame, a
 * fragmented or oversized control frame, a non-minimal or 64-bit length with the top bit set. */
int ma_ws_parse_header(const uint8_t *buf, size_t len, ma_ws_frame *f, char *msg, size_t cap);
/* XOR p[0..n) with the mask, p[0] being byte `offset` of the payload */
void ma_ws_unmask(uint8_t *p, size_t n, const uint8_t mask[4], uint64_t offset);
/* a server frame header (FIN set, unmasked) for `len` payload bytes; returns its size (<= 10) */
size_t ma_ws_frame_header(uint8_t out[10], int opcode, uint64_t len);
/* Sec-WebSocket-Accept for a key: base64(SHA-1(key + the RFC's GUID)); out holds 29 bytes.
 * Returns 0, or -1 when the key is not the base64 of 16 bytes. */
int ma_ws_accept_key(const char *key, char out[29]);

/* ------------------------------------------------------------------------- base64 */

/* Decode base64 text (standard alphabet, '=' padding optional but only at the end) into out
 * (room for ma_b64_decoded_max(len) bytes). Returns the byte count, or -1 with *bad_at the
 * offset of the first invalid character (or len for a truncated last group). */
long ma_b64_decode(const char *in, size_t len, uint8_t *out, size_t *bad_at);
size_t ma_b64_decoded_max(size_t len);
/* encode n bytes; out holds 4 * ((n + 2) / 3) + 1 bytes; returns the length written */
size_t ma_b64_encode(const uint8_t *in, size_t n, char *out);

#endif
