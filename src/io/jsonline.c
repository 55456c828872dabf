/* SPDX-License-Identifier: Apache-2.0 */
#include "io/jsonline.h"

#include <cjson/cJSON.h>

#include <stdlib.h>
#include <string.h>

#include "core/util.h"

static size_t skip_ws(const char *s, size_t len, size_t i) {
    while (i < len && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n')) i++;
    return i;
}

ma_status ma_json_parse_string(const char *s, size_t len, char **out, size_t *out_len, ma_error *err) {
    *out = NULL;
    size_t i = skip_ws(s, len, 0);
    if (i >= len || s[i] != '"') return ma_fail(err, MA_ERR_FORMAT, "expected a JSON string");
    const size_t start = i + 1, end = start + ma_json_string_end(s + start, len - start);
    if (end >= len) return ma_fail(err, MA_ERR_FORMAT, "unterminated JSON string");
    char *o = malloc(end - start + 1);
    if (!o) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
    size_t at;
    const char *why = ma_json_unescape(s + start, end - start, o, out_len, &at);
    if (why) {
        free(o);
        return ma_fail(err, MA_ERR_FORMAT, "not a valid JSON string at byte %zu: %s", start + at, why);
    }
    if (skip_ws(s, len, end + 1) != len) {
        free(o);
        return ma_fail(err, MA_ERR_FORMAT, "trailing characters after the JSON string");
    }
    *out = o;
    return MA_OK;
}

ma_status ma_json_parse_int_array(const char *s, size_t len, int64_t **out, size_t *n, ma_error *err) {
    *out = NULL;
    *n = 0;
    size_t i = skip_ws(s, len, 0);
    if (i >= len || s[i] != '[') return ma_fail(err, MA_ERR_FORMAT, "expected a JSON array of integers");
    int64_t *v = malloc(sizeof *v * (len / 2 + 1));
    if (!v) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
    size_t k = 0;
    i = skip_ws(s, len, i + 1);
    if (i < len && s[i] == ']') {
        i++;
        goto end;
    }
    for (;;) {
        int neg = 0;
        if (i < len && s[i] == '-') {
            neg = 1;
            i++;
        }
        if (i >= len || s[i] < '0' || s[i] > '9') {
            free(v);
            return ma_fail(err, MA_ERR_FORMAT, "array entry %zu is not an integer", k);
        }
        int64_t x = 0;
        while (i < len && s[i] >= '0' && s[i] <= '9') {
            if (x > (INT64_MAX - 9) / 10) {
                free(v);
                return ma_fail(err, MA_ERR_RANGE, "array entry %zu overflows", k);
            }
            x = x * 10 + (s[i++] - '0');
        }
        v[k++] = neg ? -x : x;
        i = skip_ws(s, len, i);
        if (i < len && s[i] == ',') {
            i = skip_ws(s, len, i + 1);
            continue;
        }
        if (i < len && s[i] == ']') {
            i++;
            break;
        }
        free(v);
        return ma_fail(err, MA_ERR_FORMAT, "expected , or ] after array entry %zu", k);
    }
end:
    if (skip_ws(s, len, i) != len) {
        free(v);
        return ma_fail(err, MA_ERR_FORMAT, "trailing characters after the array");
    }
    *out = v;
    *n = k;
    return MA_OK;
}

void ma_json_write_string(FILE *f, const char *s, size_t len) {
    fputc('"', f);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"') fputs("\\\"", f);
        else if (c == '\\') fputs("\\\\", f);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\r') fputs("\\r", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c < 0x20 || c == 0x7f) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

ma_status ma_json_parse_object(const char *text, size_t len, const char *label, cJSON **out, ma_error *err) {
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!*out) {
        size_t at = end && end >= text && end <= text + len ? (size_t)(end - text) : 0;
        long line = 1, col = 1;
        for (size_t i = 0; i < at; i++) {
            if (text[i] == '\n') {
                line++;
                col = 1;
            } else col++;
        }
        if (at >= len)
            return ma_fail(err, MA_ERR_FORMAT, "%s: JSON syntax error: unexpected end of the document (line %ld, column %ld)", label, line,
                           col);
        return ma_fail(err, MA_ERR_FORMAT, "%s: JSON syntax error at line %ld, column %ld", label, line, col);
    }
    if (!cJSON_IsObject(*out)) {
        cJSON_Delete(*out);
        *out = NULL;
        return ma_fail(err, MA_ERR_FORMAT, "%s: not a JSON object", label);
    }
    return MA_OK;
}
