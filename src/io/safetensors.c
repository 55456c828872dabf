/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L
#include "io/safetensors.h"
#include "io/jsonline.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *tag;
    ma_dtype dt;
} ST_DTYPES[] = {{"F32", MA_DT_F32}, {"F16", MA_DT_F16}, {"BF16", MA_DT_BF16}};

static int st_dtype(const char *tag, ma_dtype *out) {
    for (size_t i = 0; i < sizeof ST_DTYPES / sizeof ST_DTYPES[0]; i++)
        if (strcmp(tag, ST_DTYPES[i].tag) == 0) {
            *out = ST_DTYPES[i].dt;
            return 1;
        }
    return 0;
}

static const char *st_tag(ma_dtype dt) {
    for (size_t i = 0; i < sizeof ST_DTYPES / sizeof ST_DTYPES[0]; i++)
        if (ST_DTYPES[i].dt == dt) return ST_DTYPES[i].tag;
    return NULL;
}

static uint64_t rd_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* a JSON number that is an exact non-negative integer < 2^53 */
static int json_uint(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return 0;
    double d = j->valuedouble;
    if (!(d >= 0.0) || d > 9007199254740992.0 || d != (double)(uint64_t)d) return 0;
    *out = (uint64_t)d;
    return 1;
}

void ma_st_free_tensors(ma_st_tensor *t, size_t count) {
    if (!t) return;
    for (size_t i = 0; i < count; i++) free(t[i].name);
    free(t);
}

static int by_name(const void *a, const void *b) { return strcmp(((const ma_st_tensor *)a)->name, ((const ma_st_tensor *)b)->name); }

typedef struct {
    size_t begin, end;
    const char *name;
} span;
static int by_begin(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end < y->end ? -1 : x->end > y->end);
}

ma_status ma_st_parse(const uint8_t *buf, size_t len, const char *label, ma_st_tensor **out, size_t *count, ma_error *err) {
    *out = NULL;
    *count = 0;
    if (len < 8) return ma_fail(err, MA_ERR_FORMAT, "%s: truncated (%zu bytes, no header length)", label, len);
    uint64_t hlen = rd_u64(buf);
    if (hlen < 2 || hlen > MA_ST_MAX_HEADER || hlen > len - 8)
        return ma_fail(err, MA_ERR_FORMAT, "%s: header length %llu does not fit the file (%zu bytes)", label, (unsigned long long)hlen,
                       len);
    const uint8_t *data = buf + 8 + hlen;
    size_t data_len = len - 8 - (size_t)hlen;
    cJSON *root;
    char hlabel[1100];
    snprintf(hlabel, sizeof hlabel, "%s: header", label);
    ma_status ps = ma_json_parse_object((const char *)buf + 8, (size_t)hlen, hlabel, &root, err);
    if (ps) return ps;
    size_t n = 0;
    for (cJSON *e = root->child; e; e = e->next)
        if (strcmp(e->string, "__metadata__") != 0) n++;
    ma_st_tensor *ts = ma_calloc(n ? n : 1, sizeof *ts, err, label);
    span *spans = ma_calloc(n ? n : 1, sizeof *spans, err, label);
    ma_status s = MA_OK;
    if (!ts || !spans) {
        s = MA_ERR_NOMEM;
        goto done;
    }
    size_t i = 0;
    for (cJSON *e = root->child; e; e = e->next) {
        const char *name = e->string;
        if (strcmp(name, "__metadata__") == 0) {
            if (!cJSON_IsObject(e)) {
                s = ma_fail(err, MA_ERR_FORMAT, "%s: __metadata__ is not an object", label);
                goto done;
            }
            continue;
        }
        ma_st_tensor *t = &ts[i];
        t->name = strdup(name);
        if (!t->name) {
            s = ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", label);
            goto done;
        }
        i++;
        const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
        const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        if (!cJSON_IsObject(e) || !cJSON_IsString(jd) || !cJSON_IsArray(js) || !cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2) {
            s = ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s: malformed entry (needs dtype, shape, data_offsets)", label, name);
            goto done;
        }
        if (!st_dtype(jd->valuestring, &t->dtype)) {
            s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: tensor %s: dtype %s is not supported (F32, F16, BF16)", label, name, jd->valuestring);
            goto done;
        }
        int nd = cJSON_GetArraySize(js);
        if (nd > MA_MAX_DIMS) {
            s = ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s: %d dims (max %d)", label, name, nd, MA_MAX_DIMS);
            goto done;
        }
        t->ndim = nd;
        int d = 0;
        for (const cJSON *x = js->child; x; x = x->next, d++) {
            uint64_t v;
            if (!json_uint(x, &v) || v > (uint64_t)INT64_MAX) {
                s = ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s: shape entry %d is not a non-negative integer", label, name, d);
                goto done;
            }
            t->shape[d] = (int64_t)v;
        }
        uint64_t b, en;
        if (!json_uint(jo->child, &b) || !json_uint(jo->child->next, &en) || b > en || en > data_len) {
            s = ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s: data_offsets outside the %zu-byte data section", label, name, data_len);
            goto done;
        }
        size_t need;
        if (ma_shape_nbytes(t->dtype, t->ndim, t->shape, &need, NULL) != MA_OK || need != en - b) {
            s = ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s: data_offsets span %llu bytes, shape needs %zu", label, name,
                        (unsigned long long)(en - b), need);
            goto done;
        }
        size_t esz = ma_dtype_size(t->dtype);
        if (((size_t)(8 + hlen + b)) % esz != 0) {
            s = ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s: data is not aligned to its %zu-byte elements", label, name, esz);
            goto done;
        }
        t->data = data + b;
        t->nbytes = need;
        spans[i - 1] = (span){(size_t)b, (size_t)en, t->name};
    }
    qsort(spans, n, sizeof *spans, by_begin);
    for (size_t k = 1; k < n; k++) {
        if (spans[k].begin < spans[k - 1].end && spans[k].begin != spans[k].end) {
            s = ma_fail(err, MA_ERR_FORMAT, "%s: tensors %s and %s overlap", label, spans[k - 1].name, spans[k].name);
            goto done;
        }
    }
    qsort(ts, n, sizeof *ts, by_name);
    for (size_t k = 1; k < n; k++)
        if (strcmp(ts[k].name, ts[k - 1].name) == 0) {
            s = ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s appears twice", label, ts[k].name);
            goto done;
        }
done:
    free(spans);
    cJSON_Delete(root);
    if (s != MA_OK) {
        ma_st_free_tensors(ts, n);
        return s;
    }
    *out = ts;
    *count = n;
    return MA_OK;
}

const ma_st_tensor *ma_st_find(const ma_safetensors *st, const char *name) {
    size_t lo = 0, hi = st->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(st->tensors[mid].name, name);
        if (c == 0) return &st->tensors[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

void ma_st_close(ma_safetensors *st) {
    if (!st) return;
    ma_st_free_tensors(st->tensors, st->count);
    for (int i = 0; i < st->nfiles; i++) ma_unmap_file(&st->files[i]);
    free(st->files);
    memset(st, 0, sizeof *st);
}

/* append one mapped file's tensors */
static ma_status st_add_file(ma_safetensors *st, const char *path, ma_error *err) {
    ma_mapfile *files = realloc(st->files, (size_t)(st->nfiles + 1) * sizeof *files);
    if (!files) return ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", path);
    st->files = files;
    ma_mapfile *m = &st->files[st->nfiles];
    ma_status s = ma_map_file(m, path, err);
    if (s) return s;
    st->nfiles++;
    ma_st_tensor *ts;
    size_t n;
    s = ma_st_parse(m->data, m->size, path, &ts, &n, err);
    if (s) return s;
    ma_st_tensor *all = realloc(st->tensors, (st->count + n + 1) * sizeof *all);
    if (!all) {
        ma_st_free_tensors(ts, n);
        return ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", path);
    }
    st->tensors = all;
    for (size_t i = 0; i < n; i++) {
        ts[i].file = st->nfiles - 1;
        st->tensors[st->count++] = ts[i];
    }
    free(ts);
    return MA_OK;
}

static ma_status st_finish(ma_safetensors *st, const char *label, ma_error *err) {
    qsort(st->tensors, st->count, sizeof *st->tensors, by_name);
    for (size_t k = 1; k < st->count; k++)
        if (strcmp(st->tensors[k].name, st->tensors[k - 1].name) == 0)
            return ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s appears in two shards", label, st->tensors[k].name);
    return MA_OK;
}

static ma_status st_open_index(ma_safetensors *st, const char *dir, const char *index, ma_error *err) {
    char *text = NULL;
    ma_status s = ma_read_file(index, 64u << 20, &text, NULL, err);
    if (s) return s;
    cJSON *root;
    s = ma_json_parse_object(text, strlen(text), index, &root, err);
    free(text);
    if (s) return s;
    const cJSON *map = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!cJSON_IsObject(map) || !map->child) {
        cJSON_Delete(root);
        return ma_fail(err, MA_ERR_FORMAT, "%s: missing or empty weight_map", index);
    }
    /* open each distinct shard once, in order of first appearance */
    for (const cJSON *e = map->child; e && s == MA_OK; e = e->next) {
        if (!cJSON_IsString(e) || !e->valuestring[0] || strchr(e->valuestring, '/') || strcmp(e->valuestring, "..") == 0 ||
            strcmp(e->valuestring, ".") == 0) {
            s = ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s: shard must be a plain file name", index, e->string);
            break;
        }
        int seen = 0;
        for (int f = 0; f < st->nfiles && !seen; f++) {
            const char *base = strrchr(st->files[f].path, '/');
            seen = strcmp(base ? base + 1 : st->files[f].path, e->valuestring) == 0;
        }
        if (seen) continue;
        char *path = ma_path_join(dir, e->valuestring);
        if (!path) {
            s = ma_fail(err, MA_ERR_NOMEM, "out of memory");
            break;
        }
        s = st_add_file(st, path, err);
        free(path);
    }
    if (s == MA_OK) s = st_finish(st, index, err);
    /* every index entry must be found, in the shard the index names */
    size_t listed = 0;
    for (const cJSON *e = map->child; e && s == MA_OK; e = e->next, listed++) {
        const ma_st_tensor *t = ma_st_find(st, e->string);
        if (!t) {
            s = ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s is listed but not in shard %s", index, e->string, e->valuestring);
            break;
        }
        const char *base = strrchr(st->files[t->file].path, '/');
        if (strcmp(base ? base + 1 : st->files[t->file].path, e->valuestring) != 0)
            s = ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s is in %s, the index says %s", index, e->string, st->files[t->file].path,
                        e->valuestring);
    }
    if (s == MA_OK && listed != st->count)
        s = ma_fail(err, MA_ERR_FORMAT, "%s: shards hold %zu tensors but the index lists %zu", index, st->count, listed);
    cJSON_Delete(root);
    return s;
}

ma_status ma_st_open(ma_safetensors *st, const char *path, ma_error *err) {
    memset(st, 0, sizeof *st);
    ma_status s;
    if (ma_is_dir(path)) {
        char *index = ma_path_join(path, "model.safetensors.index.json");
        char *single = ma_path_join(path, "model.safetensors");
        if (!index || !single) s = ma_fail(err, MA_ERR_NOMEM, "out of memory");
        else if (ma_is_file(index)) s = st_open_index(st, path, index, err);
        else if (ma_is_file(single)) {
            s = st_add_file(st, single, err);
            if (!s) s = st_finish(st, single, err);
        } else s = ma_fail(err, MA_ERR_IO, "%s: no model.safetensors or model.safetensors.index.json", path);
        free(index);
        free(single);
    } else {
        s = st_add_file(st, path, err);
        if (!s) s = st_finish(st, path, err);
    }
    if (s) ma_st_close(st);
    return s;
}

static int entry_cmp(const void *a, const void *b) {
    return strcmp((*(const ma_st_entry *const *)a)->name, (*(const ma_st_entry *const *)b)->name);
}

ma_status ma_st_write(const char *path, const ma_st_entry *entries, size_t n, ma_error *err) {
    const ma_st_entry **order = ma_calloc(n ? n : 1, sizeof *order, err, path);
    if (!order) return MA_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) order[i] = &entries[i];
    qsort(order, n, sizeof *order, entry_cmp);
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_CreateObject();
    ma_status s = MA_OK;
    size_t offset = 0;
    cJSON_AddStringToObject(meta, "format", "pt");
    cJSON_AddItemToObject(root, "__metadata__", meta);
    for (size_t i = 0; i < n && s == MA_OK; i++) {
        const ma_st_entry *e = order[i];
        size_t nb;
        const char *tag = st_tag(e->dtype);
        if (!tag) {
            s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: tensor %s: dtype %s cannot be stored", path, e->name, ma_dtype_name(e->dtype));
            break;
        }
        if ((s = ma_shape_nbytes(e->dtype, e->ndim, e->shape, &nb, err))) break;
        cJSON *t = cJSON_CreateObject();
        cJSON_AddStringToObject(t, "dtype", tag);
        cJSON *shape = cJSON_AddArrayToObject(t, "shape");
        for (int d = 0; d < e->ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)e->shape[d]));
        cJSON *offs = cJSON_AddArrayToObject(t, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)offset));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(offset + nb)));
        cJSON_AddItemToObject(root, e->name, t);
        offset += nb;
    }
    char *header = s == MA_OK ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (s == MA_OK && !header) s = ma_fail(err, MA_ERR_NOMEM, "%s: cannot render header", path);
    ma_outfile f;
    if (s == MA_OK && !(s = ma_out_open(&f, path, err))) {
        size_t hl = strlen(header), padded = (hl + 7) / 8 * 8;
        uint8_t len8[8];
        for (int k = 0; k < 8; k++) len8[k] = (uint8_t)((uint64_t)padded >> (8 * k));
        ma_out_write(&f, len8, 8);
        ma_out_write(&f, header, hl);
        for (size_t k = hl; k < padded; k++) ma_out_write(&f, " ", 1);
        for (size_t i = 0; i < n; i++) {
            size_t nb;
            ma_shape_nbytes(order[i]->dtype, order[i]->ndim, order[i]->shape, &nb, NULL);
            ma_out_write(&f, order[i]->data, nb);
        }
        s = ma_out_commit(&f, err);
    }
    free(header);
    free(order);
    return s;
}
