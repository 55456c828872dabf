/* SPDX-License-Identifier: Apache-2.0 */
/* Status codes and error messages.
 *
 * Every fallible function returns an ma_status and, on failure, fills an ma_error (which may be
 * NULL) with a message naming the file, tensor or field at fault. ma_fail() does both:
 *     return ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s has %d dims", path, name, nd);
 */
#ifndef MA_ERROR_H
#define MA_ERROR_H

#include <stddef.h>

typedef enum {
    MA_OK = 0,
    MA_ERR_ARG,         /* caller passed something invalid */
    MA_ERR_IO,          /* open/read/write/mmap failed */
    MA_ERR_FORMAT,      /* a file or input does not follow its format */
    MA_ERR_SHAPE,       /* a tensor has the wrong shape */
    MA_ERR_NOMEM,       /* allocation failed or would exceed a limit */
    MA_ERR_UNSUPPORTED, /* valid, but not implemented here */
    MA_ERR_RANGE,       /* a value is out of its allowed range (NaN, bad id, ...) */
    MA_ERR_PARITY,      /* a parity gate failed */
    MA_ERR_WORKER,      /* a resident worker died or missed its deadline (it is restarted) */
} ma_status;

typedef struct ma_error {
    ma_status code;
    char msg[1024];
} ma_error;

/* Record code + formatted message in err (if not NULL); returns code. */
ma_status ma_fail(ma_error *err, ma_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Prepend "context: " to an existing message (keeps the code); returns err->code or code. */
ma_status ma_error_wrap(ma_error *err, ma_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* untrusted text for a message (a file's or a client's): control characters as \xNN, at most
 * `shown` bytes of it, then "..."; written into buf (cap bytes), returned */
const char *ma_escape_text(const char *s, size_t shown, char *buf, size_t cap);

/* Checked allocation: n * size bytes, failing with MA_ERR_NOMEM naming `what` on overflow or
 * exhaustion. ma_calloc zero-fills. Both return NULL on failure. */
void *ma_malloc(size_t n, size_t size, ma_error *err, const char *what);
/* keep freed activation buffers (tens of MB, allocated per layer) in the heap instead of
 * returning them to the OS, so repeated inferences do not page-fault them in again; process
 * wide, called once by the CLI and the workers (glibc; a no-op elsewhere) */
void ma_keep_freed_memory(void);
void *ma_calloc(size_t n, size_t size, ma_error *err, const char *what);

/* Overflow-checked size arithmetic: returns 0 on overflow, 1 on success. */
int ma_mul_size(size_t a, size_t b, size_t *out);
int ma_add_size(size_t a, size_t b, size_t *out);

#endif
