/* SPDX-License-Identifier: Apache-2.0 */
/* Minimal JSON pieces for line-oriented tools: a string literal with every escape (including
 * \u0000 and surrogate pairs) to raw UTF-8 bytes, an array of integers, and escaping bytes back
 * into a JSON string. cJSON cannot carry NUL bytes inside strings, hence this. */
#ifndef MA_JSONLINE_H
#define MA_JSONLINE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/error.h"

/* parse one JSON string (surrounding whitespace allowed) into malloc'd bytes (ma_json_unescape:
 * its raw bytes valid UTF-8, no lone surrogates) */
ma_status ma_json_parse_string(const char *s, size_t len, char **out, size_t *out_len, ma_error *err);
/* parse a JSON array of integers into malloc'd int64 */
ma_status ma_json_parse_int_array(const char *s, size_t len, int64_t **out, size_t *n, ma_error *err);
/* parse a JSON document that must be an object (cJSON); a syntax error is reported with its line
 * and column, a valid document of another type as "not a JSON object". *out is cJSON_Delete's. */
struct cJSON;
ma_status ma_json_parse_object(const char *text, size_t len, const char *label, struct cJSON **out, ma_error *err);
/* write bytes (UTF-8) as a JSON string literal */
void ma_json_write_string(FILE *f, const char *s, size_t len);

#endif
