/* SPDX-License-Identifier: Apache-2.0 */
/* HTTP/1.x request heads, chunked bodies, websocket frames and base64 (see http.h). Written
 * from RFC 9112 (HTTP/1.1 message syntax), RFC 6455 (websocket framing and handshake) and
 * RFC 4648 (base64). */
#include "server/http.h"

#include <ctype.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static int refuse(int *status, int code, char *msg, size_t cap, const char *text) {
    *status = code;
    snprintf(msg, cap, "%s", text);
    return -1;
}

/* RFC 9110 token characters */
static int tchar(uint8_t c) { return isalnum(c) || (c && strchr("!#$%&'*+-.^_`|~", c)); }

/* does the comma-separated list v[0..n) contain the token t (case-insensitive)? */
static int list_has(const char *v, size_t n, const char *t) {
    const size_t tl = strlen(t);
    size_t i = 0;
    while (i < n) {
        while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ',')) i++;
        size_t j = i;
        while (j < n && v[j] != ',') j++;
        size_t e = j;
        while (e > i && (v[e - 1] == ' ' || v[e - 1] == '\t')) e--;
        if (e - i == tl && !strncasecmp(v + i, t, tl)) return 1;
        i = j;
    }
    return 0;
}

static int field_is(const char *name, size_t n, const char *want) { return strlen(want) == n && !strncasecmp(name, want, n); }

int ma_http_parse_head(const uint8_t *buf, size_t len, ma_http_req *r, int *status, char *msg, size_t cap) {
    memset(r, 0, sizeof *r);
    r->content_length = -1;
    /* empty lines before the request line are ignored (RFC 9112 2.2): a client may send a CRLF
     * after a body */
    size_t p = 0;
    while (p < len && p < 8 && (buf[p] == '\r' || buf[p] == '\n')) p++;
    /* the end of the head: a blank line (CRLF CRLF, or bare LFs) */
    const size_t lim = len < MA_HTTP_MAX_HEAD ? len : MA_HTTP_MAX_HEAD;
    size_t end = 0;
    for (size_t i = p; i < lim; i++)
        if (buf[i] == '\n' && ((i >= 1 && buf[i - 1] == '\n') || (i >= 2 && buf[i - 1] == '\r' && buf[i - 2] == '\n'))) {
            end = i + 1;
            break;
        }
    if (!end) {
        if (len >= MA_HTTP_MAX_HEAD) return refuse(status, 431, msg, cap, "request head larger than 16 KiB");
        /* refuse early what can never become a request line */
        for (size_t i = p; i < len && buf[i] != ' ' && buf[i] != '\r' && buf[i] != '\n'; i++)
            if (!tchar(buf[i]) || i - p >= 15) return refuse(status, 400, msg, cap, "not an HTTP request");
        return 0;
    }
    r->head_len = end;
    /* request line: method SP target SP HTTP/1.x */
    size_t q = p;
    while (q < end && tchar(buf[q])) q++;
    if (q == p || q - p >= sizeof r->method_name || buf[q] != ' ') return refuse(status, 400, msg, cap, "malformed request line");
    memcpy(r->method_name, buf + p, q - p);
    r->method = !strcmp(r->method_name, "GET")    ? MA_HTTP_GET
                : !strcmp(r->method_name, "HEAD") ? MA_HTTP_HEAD
                : !strcmp(r->method_name, "POST") ? MA_HTTP_POST
                                                  : MA_HTTP_OTHER;
    const size_t t0 = ++q;
    while (q < end && buf[q] > 0x20 && buf[q] < 0x7f) q++;
    if (q == t0 || buf[q] != ' ') return refuse(status, 400, msg, cap, "malformed request target");
    const uint8_t *target = buf + t0;
    size_t tl = q - t0;
    if (tl >= 7 && (!strncasecmp((const char *)target, "http://", 7) || (tl >= 8 && !strncasecmp((const char *)target, "https://", 8)))) {
        /* absolute form: the path starts at the first '/' after the authority */
        size_t k = (target[4] == ':' ? 7 : 8);
        while (k < tl && target[k] != '/') k++;
        target += k;
        tl -= k;
        if (!tl) target = (const uint8_t *)"/", tl = 1;
    }
    if (tl == 1 && target[0] == '*') target = (const uint8_t *)"*", tl = 1;
    else if (target[0] != '/') return refuse(status, 400, msg, cap, "malformed request target");
    size_t pl = 0;
    while (pl < tl && target[pl] != '?') pl++;
    if (pl >= sizeof r->path || (pl < tl && tl - pl - 1 >= sizeof r->query))
        return refuse(status, 414, msg, cap, "request target too long");
    memcpy(r->path, target, pl);
    if (pl < tl) memcpy(r->query, target + pl + 1, tl - pl - 1);
    q++;
    static const char V[] = "HTTP/1.";
    if (end - q < 8 || memcmp(buf + q, V, 7)) {
        if (end - q >= 5 && !memcmp(buf + q, "HTTP/", 5))
            return refuse(status, 505, msg, cap, "HTTP version not supported (HTTP/1.0 and 1.1)");
        return refuse(status, 400, msg, cap, "malformed request line");
    }
    if (buf[q + 7] != '0' && buf[q + 7] != '1') return refuse(status, 505, msg, cap, "HTTP version not supported (HTTP/1.0 and 1.1)");
    r->minor = buf[q + 7] - '0';
    q += 8;
    if (q < end && buf[q] == '\r') q++;
    if (q >= end || buf[q] != '\n') return refuse(status, 400, msg, cap, "malformed request line");
    q++;
    /* header fields */
    int fields = 0, conn_close = 0, conn_keep = 0, conn_upgrade = 0, upgrade_ws = 0, have_te = 0;
    while (q < end) {
        size_t e = q;
        while (e < end && buf[e] != '\n') e++;
        size_t le = e; /* the line without its CR LF */
        if (le > q && buf[le - 1] == '\r') le--;
        if (le == q) break; /* the blank line */
        if (++fields > MA_HTTP_MAX_FIELDS) return refuse(status, 431, msg, cap, "more than 100 header fields");
        if (buf[q] == ' ' || buf[q] == '\t') return refuse(status, 400, msg, cap, "obsolete line folding in a header field");
        size_t c = q;
        while (c < le && tchar(buf[c])) c++;
        if (c == q || c >= le || buf[c] != ':') return refuse(status, 400, msg, cap, "malformed header field");
        const char *name = (const char *)buf + q;
        const size_t nl = c - q;
        size_t v0 = c + 1, v1 = le;
        for (size_t k = v0; k < v1; k++)
            if ((buf[k] < 0x20 && buf[k] != '\t') || buf[k] == 0x7f)
                return refuse(status, 400, msg, cap, "a control character in a header field");
        while (v0 < v1 && (buf[v0] == ' ' || buf[v0] == '\t')) v0++;
        while (v1 > v0 && (buf[v1 - 1] == ' ' || buf[v1 - 1] == '\t')) v1--;
        const char *v = (const char *)buf + v0;
        const size_t vl = v1 - v0;
        if (field_is(name, nl, "content-length")) {
            if (!vl || vl > 18) return refuse(status, 400, msg, cap, "malformed Content-Length");
            int64_t n = 0;
            for (size_t k = 0; k < vl; k++) {
                if (v[k] < '0' || v[k] > '9') return refuse(status, 400, msg, cap, "malformed Content-Length");
                n = n * 10 + (v[k] - '0');
            }
            if (r->content_length >= 0 && r->content_length != n)
                return refuse(status, 400, msg, cap, "two different Content-Length values");
            r->content_length = n;
        } else if (field_is(name, nl, "transfer-encoding")) {
            if (have_te || !(vl == 7 && !strncasecmp(v, "chunked", 7)))
                return refuse(status, 501, msg, cap, "Transfer-Encoding other than chunked is not supported");
            have_te = 1;
            r->chunked = 1;
        } else if (field_is(name, nl, "expect")) {
            if (vl == 12 && !strncasecmp(v, "100-continue", 12)) r->expect_continue = 1;
            else return refuse(status, 417, msg, cap, "unsupported Expect (only 100-continue)");
        } else if (field_is(name, nl, "connection")) {
            conn_close |= list_has(v, vl, "close");
            conn_keep |= list_has(v, vl, "keep-alive");
            conn_upgrade |= list_has(v, vl, "upgrade");
        } else if (field_is(name, nl, "upgrade")) {
            upgrade_ws |= list_has(v, vl, "websocket");
        } else if (field_is(name, nl, "sec-websocket-version")) {
            int n = vl && vl <= 6 ? 0 : -1;
            for (size_t k = 0; n >= 0 && k < vl; k++) n = isdigit((unsigned char)v[k]) ? n * 10 + (v[k] - '0') : -1;
            r->ws_version = n > 0 ? n : -1;
        } else if (field_is(name, nl, "sec-websocket-key")) {
            if (vl >= sizeof r->ws_key) return refuse(status, 400, msg, cap, "malformed Sec-WebSocket-Key");
            memcpy(r->ws_key, v, vl);
            r->ws_key[vl] = '\0';
        } else if (field_is(name, nl, "authorization")) {
            r->authorization_len = vl;
            memcpy(r->authorization, v, vl < sizeof r->authorization - 1 ? vl : sizeof r->authorization - 1);
        } else if (field_is(name, nl, "accept")) {
            const size_t n = vl < sizeof r->accept - 1 ? vl : sizeof r->accept - 1;
            memcpy(r->accept, v, n);
            r->accept[n] = '\0';
        }
        q = e + 1;
    }
    if (r->chunked && r->content_length >= 0) return refuse(status, 400, msg, cap, "both Content-Length and Transfer-Encoding");
    /* RFC 9112 6.1: Transfer-Encoding in an HTTP/1.0 message is faulty framing; RFC 6455 4.1:
     * the opening handshake is HTTP/1.1 at least (issue 36 F19) */
    if (r->chunked && r->minor == 0) return refuse(status, 400, msg, cap, "Transfer-Encoding in an HTTP/1.0 request");
    if (upgrade_ws && conn_upgrade && r->minor == 0) return refuse(status, 400, msg, cap, "a websocket upgrade needs HTTP/1.1");
    r->keep_alive = r->minor == 1 ? !conn_close : (conn_keep && !conn_close);
    r->upgrade_websocket = upgrade_ws && conn_upgrade;
    return 1;
}

/* ------------------------------------------------------------------------- chunked bodies */

enum { C_SIZE, C_BWS, C_EXT, C_SIZE_LF, C_DATA, C_DATA_CR, C_DATA_LF, C_TRAILER_START, C_TRAILER_LINE, C_END_LF };

static int hexval(uint8_t c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static int cfail(char *msg, size_t cap, const char *why) {
    snprintf(msg, cap, "malformed chunked body: %s", why);
    return -1;
}

int ma_http_chunked_feed(ma_http_chunked *c, const uint8_t *in, size_t len, size_t *consumed, uint8_t *out, size_t *out_len, size_t out_cap,
                         char *msg, size_t cap) {
    size_t i = 0;
    while (i < len) {
        const uint8_t b = in[i];
        switch (c->state) {
        case C_SIZE: {
            const int h = hexval(b);
            if (h >= 0) {
                if (++c->digits > 15) return cfail(msg, cap, "chunk size too long");
                c->remaining = c->remaining * 16 + (uint64_t)h;
            } else if (!c->digits) return cfail(msg, cap, "expected a hexadecimal chunk size");
            else if (b == ';') c->state = C_EXT, c->line = 0;
            else if (b == ' ' || b == '\t') c->state = C_BWS, c->line = 0;
            else if (b == '\r') c->state = C_SIZE_LF;
            else if (b == '\n') goto size_done;
            else return cfail(msg, cap, "bad character after the chunk size");
            i++;
            continue;
        }
        case C_BWS: /* RFC 9112 7.1.1: whitespace after the size only before an extension's ';'
                     * ("2 9" is not a size of 2, F19) */
            if (b == ';') c->state = C_EXT;
            else if (b == '\r') c->state = C_SIZE_LF;
            else if (b == '\n') {
                i++;
                goto size_done;
            } else if ((b != ' ' && b != '\t') || ++c->line > 4096) return cfail(msg, cap, "bad character after the chunk size");
            i++;
            continue;
        case C_EXT:
            if (b == '\r') c->state = C_SIZE_LF;
            else if (b == '\n') {
                i++;
                goto size_done;
            } else if ((b < 0x20 && b != '\t') || ++c->line > 4096) return cfail(msg, cap, "bad chunk extension");
            i++;
            continue;
        case C_SIZE_LF:
            if (b != '\n') return cfail(msg, cap, "expected LF after the chunk size");
            i++;
        size_done:
            if (c->state == C_SIZE) i++;
            c->digits = 0;
            c->line = 0;
            c->state = c->remaining ? C_DATA : C_TRAILER_START;
            continue;
        case C_DATA: {
            size_t n = len - i;
            if ((uint64_t)n > c->remaining) n = (size_t)c->remaining;
            if (n > out_cap - *out_len) return -2;
            memcpy(out + *out_len, in + i, n);
            *out_len += n;
            c->remaining -= n;
            i += n;
            if (!c->remaining) c->state = C_DATA_CR;
            continue;
        }
        case C_DATA_CR:
            if (b == '\r') c->state = C_DATA_LF;
            else if (b == '\n') c->state = C_SIZE;
            else return cfail(msg, cap, "chunk data longer than its size");
            i++;
            continue;
        case C_DATA_LF:
            if (b != '\n') return cfail(msg, cap, "expected LF after chunk data");
            c->state = C_SIZE;
            i++;
            continue;
        case C_TRAILER_START:
            if (b == '\r') c->state = C_END_LF;
            else if (b == '\n') {
                *consumed = i + 1;
                return 1;
            } else c->state = C_TRAILER_LINE;
            i++;
            continue;
        case C_TRAILER_LINE:
            if (++c->line > 8192) return cfail(msg, cap, "trailer too long");
            if (b == '\n') c->state = C_TRAILER_START;
            i++;
            continue;
        case C_END_LF:
            if (b != '\n') return cfail(msg, cap, "expected LF at the end");
            *consumed = i + 1;
            return 1;
        default: return cfail(msg, cap, "internal state");
        }
    }
    *consumed = len;
    return 0;
}

/* ------------------------------------------------------------------------- websocket */

int ma_ws_parse_header(const uint8_t *buf, size_t len, ma_ws_frame *f, char *msg, size_t cap) {
    if (len < 2) return 0;
    memset(f, 0, sizeof *f);
    f->fin = buf[0] >> 7;
    f->opcode = buf[0] & 15;
    f->masked = buf[1] >> 7;
    if (buf[0] & 0x70) {
        snprintf(msg, cap, "reserved bits set (no extension was negotiated)");
        return -1;
    }
    if (!(f->opcode <= 2 || (f->opcode >= 8 && f->opcode <= 10))) {
        snprintf(msg, cap, "reserved opcode %d", f->opcode);
        return -1;
    }
    if (!f->masked) {
        snprintf(msg, cap, "an unmasked client frame");
        return -1;
    }
    size_t h = 2;
    uint64_t n = buf[1] & 127;
    if (n == 126) {
        if (len < 4) return 0;
        n = (uint64_t)buf[2] << 8 | buf[3];
        h = 4;
    } else if (n == 127) {
        if (len < 10) return 0;
        if (buf[2] & 0x80) {
            snprintf(msg, cap, "a 64-bit length with its top bit set");
            return -1;
        }
        n = 0;
        for (int i = 0; i < 8; i++) n = n << 8 | buf[2 + i];
        h = 10;
    }
    if (f->opcode >= 8 && (!f->fin || n > 125)) {
        snprintf(msg, cap, "a fragmented or oversized control frame");
        return -1;
    }
    if (len < h + 4) return 0;
    memcpy(f->mask, buf + h, 4);
    f->len = n;
    f->header_len = h + 4;
    return 1;
}

void ma_ws_unmask(uint8_t *p, size_t n, const uint8_t mask[4], uint64_t offset) {
    for (size_t i = 0; i < n; i++) p[i] ^= mask[(offset + i) & 3];
}

size_t ma_ws_frame_header(uint8_t out[10], int opcode, uint64_t len) {
    out[0] = (uint8_t)(0x80 | (opcode & 15));
    if (len < 126) {
        out[1] = (uint8_t)len;
        return 2;
    }
    if (len < 65536) {
        out[1] = 126;
        out[2] = (uint8_t)(len >> 8);
        out[3] = (uint8_t)len;
        return 4;
    }
    out[1] = 127;
    for (int i = 0; i < 8; i++) out[2 + i] = (uint8_t)(len >> (56 - 8 * i));
    return 10;
}

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
