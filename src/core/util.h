/* SPDX-License-Identifier: Apache-2.0 */
/* Small tools that were written again and again: growing arrays and byte buffers, UTF-8
 * validity, JSON string literals, the monotonic clock, percentiles.
 *
 * They know nothing of their callers, so they fill no ma_error: each returns a status (or a
 * reason) and the caller's message names the request, file or field at fault. None aborts. */
#ifndef MA_UTIL_H
#define MA_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

/* ------------------------------------------------------------------------------ growth */

/* The capacity to grow to so that `need` fits: cap (or `first` when cap is 0) doubled until it
 * holds need, and never more than `max` (the doubling stops there). cap itself when it already
 * holds need; 0 when need > max. */
size_t ma_grow_cap(size_t cap, size_t need, size_t first, size_t max);

/* Room for len + extra elements of `elem` bytes in the array at *arrayp (the address of the
 * caller's T *, any T) of *cap elements: realloc'd to a capacity from ma_grow_cap (doubling from
 * 16) when it has less, *cap updated. MA_ERR_RANGE when len + extra elements would not fit in
 * size_t bytes, MA_ERR_NOMEM when the allocator refuses; on failure the array and *cap are as
 * they were (still the caller's to free). */
ma_status ma_grow_array(void *arrayp, size_t *cap, size_t len, size_t extra, size_t elem);

/* A growing byte buffer. {0} is an empty one with no limit. After a successful call data is
 * allocated and NUL-terminated at len (text can be read as a string; bytes may hold NULs).
 * A call that fails leaves the buffer as it was: MA_ERR_RANGE when len would pass `max` (or
 * size_t), MA_ERR_NOMEM when the allocator refuses, MA_ERR_FORMAT when vsnprintf fails. */
typedef struct ma_buf {
    char *data;
    size_t len;
    size_t cap; /* bytes allocated, the terminating NUL's included */
    size_t max; /* the most bytes it may hold; 0: no limit but size_t */
} ma_buf;

ma_status ma_buf_reserve(ma_buf *b, size_t extra); /* room for len + extra bytes */
ma_status ma_buf_append(ma_buf *b, const void *p, size_t n);
ma_status ma_buf_puts(ma_buf *b, const char *s);
ma_status ma_buf_printf(ma_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
ma_status ma_buf_vprintf(ma_buf *b, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
void ma_buf_free(ma_buf *b); /* and back to {0}, its max kept */

/* ------------------------------------------------------------------------------ UTF-8 */

/* The length (1 to 4) of the valid UTF-8 sequence at s, of which at most len bytes may be read;
 * 0 when there is none: a stray continuation byte, C0, C1, F5..FF, an overlong form, a
 * surrogate (U+D800..U+DFFF), a code point past U+10FFFF, or a sequence cut short by len
 * (Unicode's table of well-formed byte sequences, 3.9). len 0: 0. */
size_t ma_utf8_seq(const uint8_t *s, size_t len);

/* the offset of the first invalid sequence in s, or len when all of it is valid UTF-8 */
size_t ma_utf8_valid_prefix(const uint8_t *s, size_t len);

/* cp (at most U+10FFFF, not checked here) written as UTF-8 at out (4 bytes of room); its length */
size_t ma_utf8_put(uint32_t cp, char *out);

/* ------------------------------------------------------------------------------ JSON strings */

/* The offset of the quote that closes the JSON string literal whose text starts at s (just
 * after its opening quote): the first '"' not escaped by a backslash; len when there is none. */
size_t ma_json_string_end(const char *s, size_t len);

/* The body of a JSON string literal (RFC 8259 7; s[0..len), without its quotes) decoded into
 * out, which has room for len + 1 bytes (the decoded text is never longer than the literal).
 * out is NUL-terminated and *out_len its length (a \u0000 gives a NUL inside it). Refused, with
 * NULL returned: a raw control character (< 0x20), raw bytes that are not valid UTF-8
 * (ma_utf8_seq), an escape other than \" \\ \/ \b \f \n \r \t \uXXXX, a \u without four hex
 * digits, a lone surrogate (a low one, or a high one not followed by a \u low one). Returns
 * NULL on success, else what is wrong, with *at the offset in s of the fault (the backslash of
 * an escape). */
const char *ma_json_unescape(const char *s, size_t len, char *out, size_t *out_len, size_t *at);

/* ------------------------------------------------------------------------------ time */

/* CLOCK_MONOTONIC in milliseconds and in seconds (durations only: the origin is arbitrary) */
double ma_now_ms(void);
double ma_now_s(void);

/* ------------------------------------------------------------------------------ statistics */

/* The nearest-rank percentile (p in (0, 100]) of n > 0 values: the smallest value with at least
 * p% of them at or below it, the ceil(p / 100 * n)-th in ascending order (p * n rounded to 1e-6
 * first, so that 90% of 10 is the 9th). No interpolation: always one of the values. Sorts v in
 * place (NaN not allowed). */
double ma_percentile(double *v, size_t n, double p);

/* The median of n > 0 values: the middle one for odd n, the mean of the two middle ones for even
 * n. Sorts v in place. */
double ma_median(double *v, size_t n);

/* v in ascending order (NaN not allowed) */
void ma_sort_doubles(double *v, size_t n);

#endif
