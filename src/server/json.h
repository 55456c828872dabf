/* SPDX-License-Identifier: Apache-2.0 */
/* JSON request bodies, parsed within a memory budget.
 *
 * A request is mostly arrays of numbers (frames as nested lists, a state, noise) or base64
 * strings. A general tree (cJSON) costs about 80 bytes per number, 40 times the text of a
 * list like "0,1,2,"; a 32 MiB body became a 1.3 GB tree. Here a rectangular array of numbers
 * (up to 4 levels: [3], [10, 32], [224, 224, 3], [1, 10, 32]) is stored as doubles with its
 * shape, at most 4 bytes per byte of text; strings are decoded once; everything else is a small
 * node. Every allocation counts against a budget given by the caller, so the memory a request
 * may cost is bounded before it is spent. Strict RFC 8259: one value, nothing after it but
 * whitespace, strings in valid UTF-8 (lone surrogates refused), at most 32 levels. */
#ifndef MA_SERVER_JSON_H
#define MA_SERVER_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef enum { MA_JV_NULL, MA_JV_BOOL, MA_JV_NUM, MA_JV_STR, MA_JV_ARR, MA_JV_OBJ, MA_JV_NUMARR } ma_jv_kind;

typedef struct ma_jv {
    ma_jv_kind kind;
    struct ma_jv *next; /* the next element of the array or member of the object */
    const char *key;    /* as a member of an object: its name (NUL-terminated; key_len bytes) */
    size_t key_len;
    double num;          /* MA_JV_NUM; MA_JV_BOOL: 0 or 1 */
    const char *str;     /* MA_JV_STR: decoded UTF-8, NUL-terminated, `len` bytes (may hold NULs) */
    size_t len;          /* MA_JV_STR: bytes; MA_JV_ARR / MA_JV_OBJ: elements */
    struct ma_jv *first; /* MA_JV_ARR / MA_JV_OBJ */
    const double *nums;  /* MA_JV_NUMARR: row-major values */
    int ndim;            /* MA_JV_NUMARR: 1..4 */
    int64_t shape[4];
    size_t count; /* MA_JV_NUMARR: product of shape */
} ma_jv;

typedef struct ma_json ma_json;

/* Parse buf[0..len). budget: the bytes the parse may allocate. On failure *out is NULL and err
 * says what and where (byte offset, line and column). */
ma_status ma_json_parse(const char *buf, size_t len, size_t budget, ma_json **out, ma_error *err);
const ma_jv *ma_json_root(const ma_json *j);
size_t ma_json_used(const ma_json *j); /* bytes allocated */
void ma_json_free(ma_json *j);

#endif
