/* SPDX-License-Identifier: Apache-2.0 */
/* manifest.json of a context directory (manifest.h). */
#define _GNU_SOURCE
#include "model/manifest.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/jsonline.h"
#include "io/mapfile.h"

uint64_t ma_fnv1a64(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static int hex16(const char *s) {
    if (!s || strlen(s) != 16) return 0;
    for (int i = 0; i < 16; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

ma_status ma_manifest_load(const char *dir, ma_manifest *m, ma_error *err) {
    memset(m, 0, sizeof *m);
    char *path = ma_path_join(dir, MA_MANIFEST_FILE);
    if (!path) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
    if (!ma_is_file(path)) {
        ma_status s = ma_fail(err, MA_ERR_IO, "%s is missing", path);
        free(path);
        return s;
    }
    char *text = NULL;
    size_t len = 0;
    ma_status s = ma_read_file(path, 1u << 20, &text, &len, err);
    cJSON *root = NULL;
    if (!s) s = ma_json_parse_object(text, len, path, &root, err);
    free(text);
    if (!s) {
        const cJSON *ver = cJSON_GetObjectItemCaseSensitive(root, "molmoact_manifest");
        const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
        if (!cJSON_IsNumber(ver) || ver->valuedouble != 1) s = ma_fail(err, MA_ERR_FORMAT, "%s: molmoact_manifest must be 1", path);
        else if (!cJSON_IsObject(files)) s = ma_fail(err, MA_ERR_FORMAT, "%s: files must be an object", path);
        for (const cJSON *f = s ? NULL : files->child; f && !s; f = f->next) {
            ma_manifest_entry e;
            memset(&e, 0, sizeof e);
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(f, "compile_id"), *h = cJSON_GetObjectItemCaseSensitive(f, "fnv64");
            const cJSON *b = cJSON_GetObjectItemCaseSensitive(f, "bytes");
            if (strlen(f->string) >= sizeof e.name || strchr(f->string, '/') || !cJSON_IsNumber(b) || b->valuedouble < 0 ||
                (cJSON_IsString(id) ? !hex16(id->valuestring) : !(cJSON_IsString(h) && hex16(h->valuestring)))) {
                s = ma_fail(err, MA_ERR_FORMAT, "%s: entry \"%.64s\" is malformed", path, f->string);
                break;
            }
            snprintf(e.name, sizeof e.name, "%s", f->string);
            if (cJSON_IsString(id)) snprintf(e.compile_id, sizeof e.compile_id, "%s", id->valuestring);
            else snprintf(e.fnv64, sizeof e.fnv64, "%s", h->valuestring);
            e.bytes = (uint64_t)b->valuedouble;
            s = ma_manifest_put(m, &e, err);
        }
    }
    cJSON_Delete(root);
    free(path);
    return s;
}

const ma_manifest_entry *ma_manifest_find(const ma_manifest *m, const char *name) {
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->e[i].name, name)) return &m->e[i];
    return NULL;
}

ma_status ma_manifest_put(ma_manifest *m, const ma_manifest_entry *e, ma_error *err) {
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->e[i].name, e->name)) {
            m->e[i] = *e;
            return MA_OK;
        }
    if (m->n == MA_MANIFEST_MAX) return ma_fail(err, MA_ERR_RANGE, "manifest: more than %d files", MA_MANIFEST_MAX);
    m->e[m->n++] = *e;
    return MA_OK;
}

static int by_entry_name(const void *a, const void *b) {
    return strcmp(((const ma_manifest_entry *)a)->name, ((const ma_manifest_entry *)b)->name);
}

ma_status ma_manifest_write(const char *path, const ma_manifest *m, ma_error *err) {
    /* in name order: the same directory gives the same bytes, whatever order its entries came in */
    ma_manifest_entry *sorted = malloc(sizeof *sorted * (size_t)(m->n ? m->n : 1));
    if (!sorted) return ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", path);
    memcpy(sorted, m->e, sizeof *sorted * (size_t)m->n);
    qsort(sorted, (size_t)m->n, sizeof *sorted, by_entry_name);
    cJSON *root = cJSON_CreateObject(), *files = NULL;
    if (root) {
        cJSON_AddNumberToObject(root, "molmoact_manifest", 1);
        files = cJSON_AddObjectToObject(root, "files");
    }
    for (int i = 0; files && i < m->n; i++) {
        cJSON *f = cJSON_AddObjectToObject(files, sorted[i].name);
        if (!f) break;
        if (sorted[i].compile_id[0]) cJSON_AddStringToObject(f, "compile_id", sorted[i].compile_id);
        else cJSON_AddStringToObject(f, "fnv64", sorted[i].fnv64);
        cJSON_AddNumberToObject(f, "bytes", (double)sorted[i].bytes);
    }
    free(sorted);
    char *text = files ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) return ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", path);
    const size_t n = strlen(text);
    char *with_nl = realloc(text, n + 2);
    if (!with_nl) {
        free(text);
        return ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", path);
    }
    with_nl[n] = '\n';
    with_nl[n + 1] = '\0';
    ma_status s = ma_write_file(path, with_nl, n + 1, err);
    free(with_nl);
    return s;
}

ma_status ma_manifest_hash_file(const char *path, char out[17], uint64_t *bytes, ma_error *err) {
    char *text = NULL;
    size_t len = 0;
    ma_status s = ma_read_file(path, 512u << 20, &text, &len, err);
    if (s) return s;
    snprintf(out, 17, "%016llx", (unsigned long long)ma_fnv1a64(MA_FNV_OFFSET, text, len));
    *bytes = len;
    free(text);
    return MA_OK;
}
