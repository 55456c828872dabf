/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "core/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------------------ growth */

size_t ma_grow_cap(size_t cap, size_t need, size_t first, size_t max) {
    if (need <= cap) return cap;
    if (need > max) return 0;
    size_t c = cap ? cap : (first ? first : 1);
    while (c < need) {
        if (c > max / 2) return max; /* the next doubling would pass max (or size_t) */
        c *= 2;
    }
    return c < max ? c : max;
}

ma_status ma_grow_array(void *arrayp, size_t *cap, size_t len, size_t extra, size_t elem) {
    size_t need;
    if (!elem || !ma_add_size(len, extra, &need) || need > SIZE_MAX / elem) return MA_ERR_RANGE;
    if (need <= *cap) return MA_OK;
    const size_t c = ma_grow_cap(*cap, need, 16, SIZE_MAX / elem);
    /* arrayp is a T ** of the caller's: its pointer is read and written as bytes, which is
     * defined for any object pointer type of the same representation as void * (POSIX) */
    void *old;
    memcpy(&old, arrayp, sizeof old);
    void *p = realloc(old, c * elem);
    if (!p) return MA_ERR_NOMEM;
    memcpy(arrayp, &p, sizeof p);
    *cap = c;
    return MA_OK;
}

ma_status ma_buf_reserve(ma_buf *b, size_t extra) {
    const size_t max = b->max && b->max < SIZE_MAX ? b->max : SIZE_MAX - 1; /* + the NUL */
    if (b->len > max || extra > max - b->len) return MA_ERR_RANGE;
    const size_t need = b->len + extra + 1;
    if (b->data && need <= b->cap) return MA_OK;
    const size_t c = ma_grow_cap(b->cap, need, 64, max + 1);
    char *p = realloc(b->data, c);
    if (!p) return MA_ERR_NOMEM;
    if (!b->data) p[0] = '\0';
    b->data = p;
    b->cap = c;
    return MA_OK;
}

ma_status ma_buf_append(ma_buf *b, const void *p, size_t n) {
    const ma_status s = ma_buf_reserve(b, n);
    if (s) return s;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return MA_OK;
}

ma_status ma_buf_puts(ma_buf *b, const char *s) { return ma_buf_append(b, s, strlen(s)); }

ma_status ma_buf_vprintf(ma_buf *b, const char *fmt, va_list ap) {
    ma_status s = ma_buf_reserve(b, 0);
    if (s) return s;
    for (;;) {
        va_list aq;
        va_copy(aq, ap);
        const size_t room = b->cap - b->len; /* the NUL's byte included */
        const int n = vsnprintf(b->data + b->len, room, fmt, aq);
        va_end(aq);
        if (n < 0) {
            b->data[b->len] = '\0';
            return MA_ERR_FORMAT;
        }
        if ((size_t)n < room) {
            b->len += (size_t)n;
            return MA_OK;
        }
        /* vsnprintf wrote a truncated text past len: the buffer ends at len again whatever the
         * reservation gives */
        b->data[b->len] = '\0';
        if ((s = ma_buf_reserve(b, (size_t)n))) return s;
    }
}

ma_status ma_buf_printf(ma_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const ma_status s = ma_buf_vprintf(b, fmt, ap);
    va_end(ap);
    return s;
}

void ma_buf_free(ma_buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* ------------------------------------------------------------------------------ UTF-8 */

size_t ma_utf8_seq(const uint8_t *s, size_t len) {
    if (!len) return 0;
    const uint8_t c = s[0];
    if (c < 0x80) return 1;
    size_t n;
    uint8_t lo = 0x80, hi = 0xbf; /* the second byte's range: narrower after E0, ED, F0, F4 */
    if (c >= 0xc2 && c <= 0xdf) n = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        if (c == 0xe0) lo = 0xa0; /* overlong */
        if (c == 0xed) hi = 0x9f; /* surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        if (c == 0xf0) lo = 0x90; /* overlong */
        if (c == 0xf4) hi = 0x8f; /* past U+10FFFF */
    } else return 0;
    if (len < n || s[1] < lo || s[1] > hi) return 0;
    for (size_t k = 2; k < n; k++)
        if ((s[k] & 0xc0) != 0x80) return 0;
    return n;
}

size_t ma_utf8_valid_prefix(const uint8_t *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        const size_t n = ma_utf8_seq(s + i, len - i);
        if (!n) return i;
        i += n;
    }
    return len;
}

size_t ma_utf8_put(uint32_t cp, char *o) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* ------------------------------------------------------------------------------ JSON strings */

size_t ma_json_string_end(const char *s, size_t len) {
    size_t i = 0;
    while (i < len && s[i] != '"') i += s[i] == '\\' ? 2 : 1;
    return i < len ? i : len;
}

/* four hex digits at s[i..i+4) within len: their value, or -1 */
static long hex4(const char *s, size_t len, size_t i) {
    if (i > len || len - i < 4) return -1;
    long v = 0;
    for (int k = 0; k < 4; k++) {
        const char c = s[i + (size_t)k];
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v << 4 | d;
    }
    return v;
}

const char *ma_json_unescape(const char *s, size_t len, char *out, size_t *out_len, size_t *at) {
    size_t k = 0, i = 0;
    *out_len = 0;
    out[0] = '\0';
    while (i < len) {
        const unsigned char c = (unsigned char)s[i];
        *at = i;
        if (c < 0x20) return "a control character inside a string (escape it)";
        if (c != '\\') {
            const size_t n = ma_utf8_seq((const uint8_t *)s + i, len - i);
            if (!n) return "a string is not valid UTF-8";
            memcpy(out + k, s + i, n);
            k += n;
            i += n;
            continue;
        }
        if (i + 1 >= len) return "an unknown escape";
        const char x = s[i + 1];
        i += 2;
        switch (x) {
        case '"': out[k++] = '"'; break;
        case '\\': out[k++] = '\\'; break;
        case '/': out[k++] = '/'; break;
        case 'b': out[k++] = '\b'; break;
        case 'f': out[k++] = '\f'; break;
        case 'n': out[k++] = '\n'; break;
        case 'r': out[k++] = '\r'; break;
        case 't': out[k++] = '\t'; break;
        case 'u': {
            long v = hex4(s, len, i);
            if (v < 0) return "a malformed \\u escape";
            i += 4;
            if (v >= 0xdc00 && v <= 0xdfff) return "a lone low surrogate (\\udc00-\\udfff)";
            if (v >= 0xd800 && v <= 0xdbff) {
                const long lo = i + 1 < len && s[i] == '\\' && s[i + 1] == 'u' ? hex4(s, len, i + 2) : -1;
                if (lo < 0xdc00 || lo > 0xdfff) return "a high surrogate without its low surrogate";
                v = 0x10000 + ((v - 0xd800) << 10) + (lo - 0xdc00);
                i += 6;
            }
            k += ma_utf8_put((uint32_t)v, out + k);
            break;
        }
        default: return "an unknown escape";
        }
    }
    out[k] = '\0';
    *out_len = k;
    return NULL;
}

/* ------------------------------------------------------------------------------ time */

double ma_now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

double ma_now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------------------------ statistics */

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void ma_sort_doubles(double *v, size_t n) {
    if (n > 1) qsort(v, n, sizeof *v, cmp_double);
}

double ma_percentile(double *v, size_t n, double p) {
    ma_sort_doubles(v, n);
    /* ceil(p / 100 * n) with p * n rounded first, so that 90% of 10 is 9, not 9.000000000000002 */
    const double rank = ceil(round(p * (double)n * 1e6) / 1e8);
    const size_t k = !(rank >= 1) ? 1 : rank > (double)n ? n : (size_t)rank;
    return v[k - 1];
}

double ma_median(double *v, size_t n) {
    ma_sort_doubles(v, n);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
