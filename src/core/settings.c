/* SPDX-License-Identifier: Apache-2.0 */
#include "core/settings.h"
#include "core/env.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ma_settings_init(ma_settings *s) {
    memset(s, 0, sizeof *s);
    s->qnn_soc = s->qnn_arch = -1;
}

static const ma_env_var *row(const char *key) {
    for (int i = 0; i < MA_ENV_COUNT; i++)
        if (MA_ENV_VARS[i].key && !strcmp(MA_ENV_VARS[i].key, key)) return &MA_ENV_VARS[i];
    return NULL;
}

/* "--threads abc", "options.threads abc", "MOLMOACT_THREADS=abc": how each source writes a value */
static const char *sep(const char *from) { return from[0] == '-' || strchr(from, '.') ? " " : "="; }

static int in_choices(const char *v, const char *choices) {
    const size_t n = strlen(v);
    for (const char *p = choices; p && *p;) {
        const char *bar = strchr(p, '|');
        const size_t l = bar ? (size_t)(bar - p) : strlen(p);
        if (l == n && !strncmp(p, v, n)) return 1;
        p += l + (bar ? 1 : 0);
    }
    return 0;
}

ma_status ma_settings_set(ma_settings *s, const char *key, const char *value, const char *from, ma_error *err) {
    const ma_env_var *r = row(key);
    if (!r) return ma_fail(err, MA_ERR_ARG, "%s: no setting is called %s", from, key);
    if (!value) value = "";
    char *field = (char *)s + r->off;
    if (r->type == MA_SET_STR) {
        if (strchr(value, '\n')) return ma_fail(err, MA_ERR_ARG, "%s%s%.80s: a line break in a setting", from, sep(from), value);
        if (*value && r->choices && !in_choices(value, r->choices)) {
            char list[160]; /* "a, b or c" */
            size_t n = 0;
            for (const char *p = r->choices; *p && n + 8 < sizeof list; p++) {
                if (*p != '|') {
                    list[n++] = *p;
                    continue;
                }
                const int last = !strchr(p + 1, '|');
                memcpy(list + n, last ? " or " : ", ", last ? 4 : 2);
                n += last ? 4 : 2;
            }
            list[n] = '\0';
            if (!strcmp(key, "kernels")) /* which of them this CPU has is the kernel layer's check */
                return ma_fail(err, MA_ERR_ARG, "%s%s%.80s: unknown kernel set (one of %s)", from, sep(from), value, list);
            return ma_fail(err, MA_ERR_ARG, "%s%s%.80s: must be %s", from, sep(from), value, list);
        }
        if (strstr(key, "_suffix") && (strchr(value, '/') || strlen(value) > 64 || !strcmp(value, ".") || !strcmp(value, "..")))
            return ma_fail(err, MA_ERR_ARG, "%s%s%.80s: a suffix of file names (at most 64 characters, no '/', not . or ..)", from,
                           sep(from), value);
        if (strlen(value) >= r->size)
            return ma_fail(err, MA_ERR_ARG, "%s%s%.80s...: longer than %zu characters", from, sep(from), value, r->size - 1);
        memcpy(field, value, strlen(value) + 1);
        return MA_OK;
    }
    long v;
    if (r->type == MA_SET_FLAG) {
        if (strcmp(value, "0") && strcmp(value, "1")) return ma_fail(err, MA_ERR_ARG, "%s%s%.80s: must be 0 or 1", from, sep(from), value);
        v = value[0] == '1';
    } else {
        char *end;
        errno = 0;
        v = strtol(value, &end, 10);
        if (!ma_plain_decimal(value, 0) || *end || errno || v < r->lo || v > r->hi) /* strtol alone takes " 2" and "+1" */
            return ma_fail(err, MA_ERR_ARG, "%s%s%.80s: must be an integer in [%ld, %ld]", from, sep(from), value, r->lo, r->hi);
    }
    if (r->size == sizeof(long)) *(long *)(void *)field = v;
    else *(int *)(void *)field = (int)v;
    return MA_OK;
}

const char *ma_settings_get(const ma_settings *s, const char *key, char *buf, size_t cap) {
    const ma_env_var *r = row(key);
    if (!r || !cap) return NULL;
    const char *field = (const char *)s + r->off;
    if (r->type == MA_SET_STR) return field;
    long v = r->size == sizeof(long) ? *(const long *)(const void *)field : *(const int *)(const void *)field;
    snprintf(buf, cap, "%ld", v);
    return buf;
}

size_t ma_settings_encode(const ma_settings *s, char *out, size_t cap) {
    size_t n = 0;
    for (int i = 0; i < MA_ENV_COUNT; i++) {
        const ma_env_var *r = &MA_ENV_VARS[i];
        if (!r->key) continue;
        char num[32];
        const char *v = ma_settings_get(s, r->key, num, sizeof num);
        const int w = snprintf(out + n, n < cap ? cap - n : 0, "%s=%s\n", r->key, v);
        if (w < 0 || (size_t)w >= cap - n) return 0;
        n += (size_t)w;
    }
    return n;
}

ma_status ma_settings_decode(ma_settings *s, const char *text, size_t len, ma_error *err) {
    ma_settings_init(s);
    const ma_settings def = *s; /* the defaults, which an integer left unset is written as */
    for (size_t i = 0; i < len;) {
        const char *line = text + i, *nl = memchr(line, '\n', len - i);
        if (!nl) return ma_fail(err, MA_ERR_FORMAT, "settings: the last line has no end");
        const char *eq = memchr(line, '=', (size_t)(nl - line));
        char key[64], value[MA_SETTINGS_PATH];
        if (!eq || (size_t)(eq - line) >= sizeof key || (size_t)(nl - eq - 1) >= sizeof value)
            return ma_fail(err, MA_ERR_FORMAT, "settings: a malformed line at byte %zu", i);
        memcpy(key, line, (size_t)(eq - line));
        key[eq - line] = '\0';
        memcpy(value, eq + 1, (size_t)(nl - eq - 1));
        value[nl - eq - 1] = '\0';
        const ma_env_var *r = row(key);
        /* an integer left at its default is written as the default (0, or -1 for qnn_soc and
         * qnn_arch): taken back as exactly that; every other value through its row's checks */
        char num[32];
        const char *dv = r && r->type == MA_SET_INT ? ma_settings_get(&def, key, num, sizeof num) : NULL;
        if (!(dv && !strcmp(value, dv))) {
            char from[80];
            snprintf(from, sizeof from, "settings.%s", key);
            ma_status st = ma_settings_set(s, key, value, from, err);
            if (st) return st;
        }
        i = (size_t)(nl - text) + 1;
    }
    return MA_OK;
}

long ma_settings_prompt_seq(const ma_settings *s, int backend_pads, long compiled) {
    if (s && s->prompt_seq > 0) return s->prompt_seq;
    if (!backend_pads) return 0;
    return compiled > 0 ? compiled : 128; /* the compiled length, else the reference deployment's */
}
