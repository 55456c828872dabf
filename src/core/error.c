/* SPDX-License-Identifier: Apache-2.0 */
#include "core/error.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

ma_status ma_fail(ma_error *err, ma_status code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

ma_status ma_error_wrap(ma_error *err, ma_status code, const char *fmt, ...) {
    if (!err) return code;
    char prefix[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    char old[sizeof err->msg];
    memcpy(old, err->msg, sizeof old);
    old[sizeof old - 1] = '\0';
    snprintf(err->msg, sizeof err->msg, "%s: %s", prefix, old);
    if (err->code == MA_OK) err->code = code;
    return err->code;
}

int ma_mul_size(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return 0;
    *out = a * b;
    return 1;
}

int ma_add_size(size_t a, size_t b, size_t *out) {
    if (b > SIZE_MAX - a) return 0;
    *out = a + b;
    return 1;
}

void ma_keep_freed_memory(void) {
#if defined(__GLIBC__)
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

void *ma_malloc(size_t n, size_t size, ma_error *err, const char *what) {
    size_t total;
    if (!ma_mul_size(n, size, &total)) {
        ma_fail(err, MA_ERR_NOMEM, "%s: size overflow (%zu x %zu)", what, n, size);
        return NULL;
    }
    void *p = malloc(total ? total : 1);
    if (!p) ma_fail(err, MA_ERR_NOMEM, "%s: cannot allocate %zu bytes", what, total);
    return p;
}

void *ma_calloc(size_t n, size_t size, ma_error *err, const char *what) {
    size_t total;
    if (!ma_mul_size(n, size, &total)) {
        ma_fail(err, MA_ERR_NOMEM, "%s: size overflow (%zu x %zu)", what, n, size);
        return NULL;
    }
    void *p = calloc(total ? total : 1, 1);
    if (!p) ma_fail(err, MA_ERR_NOMEM, "%s: cannot allocate %zu bytes", what, total);
    return p;
}

const char *ma_escape_text(const char *s, size_t shown, char *buf, size_t cap) {
    size_t k = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p && k + 5 < cap; p++) {
        if ((size_t)(p - (const unsigned char *)s) >= shown) {
            k += (size_t)snprintf(buf + k, cap - k, "...");
            break;
        }
        if (*p < 0x20 || *p == 0x7f) k += (size_t)snprintf(buf + k, cap - k, "\\x%02x", *p);
        else buf[k++] = (char)*p;
    }
    buf[k] = '\0';
    return buf;
}
