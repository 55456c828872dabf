/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L
#include "io/gguf.h"
#include "io/mapfile.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"

/* ------------------------------------------------------------------------------ reading */

typedef struct {
    const uint8_t *p, *end;
} cursor;

static int take(cursor *c, size_t n, const uint8_t **out) {
    if ((size_t)(c->end - c->p) < n) return 0;
    *out = c->p;
    c->p += n;
    return 1;
}
static int rd_u32(cursor *c, uint32_t *v) {
    const uint8_t *b;
    if (!take(c, 4, &b)) return 0;
    *v = (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24);
    return 1;
}
static int rd_u64(cursor *c, uint64_t *v) {
    uint32_t lo, hi;
    if (!rd_u32(c, &lo) || !rd_u32(c, &hi)) return 0;
    *v = (uint64_t)lo | ((uint64_t)hi << 32);
    return 1;
}
static int rd_str(cursor *c, ma_gguf_str *s) {
    uint64_t n;
    const uint8_t *b;
    if (!rd_u64(c, &n) || n > (uint64_t)(c->end - c->p) || !take(c, (size_t)n, &b)) return 0;
    s->p = (const char *)b;
    s->len = n;
    return 1;
}

static size_t scalar_size(uint32_t type) {
    switch (type) {
    case MA_GGUF_U8:
    case MA_GGUF_I8:
    case MA_GGUF_BOOL: return 1;
    case MA_GGUF_U16:
    case MA_GGUF_I16: return 2;
    case MA_GGUF_U32:
    case MA_GGUF_I32:
    case MA_GGUF_F32: return 4;
    case MA_GGUF_U64:
    case MA_GGUF_I64:
    case MA_GGUF_F64: return 8;
    default: return 0;
    }
}

static uint64_t load_le(const uint8_t *b, size_t n) {
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = (v << 8) | b[i];
    return v;
}

/* decode one scalar of `type` at b into the kv union */
static void decode_scalar(ma_gguf_kv *kv, uint32_t type, const uint8_t *b) {
    uint64_t raw = load_le(b, scalar_size(type));
    switch (type) {
    case MA_GGUF_I8: kv->v.i = (int8_t)raw; break;
    case MA_GGUF_I16: kv->v.i = (int16_t)raw; break;
    case MA_GGUF_I32: kv->v.i = (int32_t)raw; break;
    case MA_GGUF_I64: kv->v.i = (int64_t)raw; break;
    case MA_GGUF_F32: {
        uint32_t u = (uint32_t)raw;
        float f;
        memcpy(&f, &u, 4);
        kv->v.f = f;
    } break;
    case MA_GGUF_F64: {
        double d;
        memcpy(&d, &raw, 8);
        kv->v.f = d;
    } break;
    case MA_GGUF_BOOL: kv->v.b = raw != 0; break;
    default: kv->v.u = raw; break;
    }
}

static int dtype_of_ggml(uint32_t t, ma_dtype *dt) {
    switch (t) {
    case MA_GGML_F32: *dt = MA_DT_F32; return 1;
    case MA_GGML_F16: *dt = MA_DT_F16; return 1;
    case MA_GGML_BF16: *dt = MA_DT_BF16; return 1;
    case MA_GGML_Q8_0: *dt = MA_DT_Q8_0; return 1;
    case MA_GGML_Q4_0: *dt = MA_DT_Q4_0; return 1;
    default: return 0;
    }
}

static int ggml_type_of(ma_dtype dt, uint32_t *out) {
    switch (dt) {
    case MA_DT_F32: *out = MA_GGML_F32; return 1;
    case MA_DT_F16: *out = MA_GGML_F16; return 1;
    case MA_DT_BF16: *out = MA_GGML_BF16; return 1;
    case MA_DT_Q8_0: *out = MA_GGML_Q8_0; return 1;
    case MA_DT_Q4_0: *out = MA_GGML_Q4_0; return 1;
    default: return 0;
    }
}

static char *dup_str(ma_gguf_str s) {
    char *p = malloc((size_t)s.len + 1);
    if (!p) return NULL;
    memcpy(p, s.p, (size_t)s.len);
    p[s.len] = '\0';
    return p;
}

void ma_gguf_close(ma_gguf *g) {
    if (!g) return;
    for (size_t i = 0; i < g->n_kv; i++) free(g->kv[i].key);
    for (size_t i = 0; i < g->n_tensors; i++) free(g->tensors[i].name);
    free(g->kv);
    free(g->tensors);
    ma_unmap_file(&g->map);
    memset(g, 0, sizeof *g);
}

typedef struct {
    uint64_t b, e;
    const char *name;
} gspan;
static int by_b(const void *x, const void *y) {
    const gspan *a = x, *b = y;
    return a->b < b->b ? -1 : a->b > b->b ? 1 : 0;
}

ma_status ma_gguf_parse(const uint8_t *buf, size_t len, const char *label, ma_gguf *g, ma_error *err) {
    ma_mapfile keep = g->map;
    memset(g, 0, sizeof *g);
    g->map = keep;
    cursor c = {buf, buf + len};
    uint32_t magic = 0, version = 0;
    uint64_t nt, nkv;
    if (!rd_u32(&c, &magic) || magic != 0x46554747u) return ma_fail(err, MA_ERR_FORMAT, "%s: not a GGUF file (bad magic)", label);
    if (!rd_u32(&c, &version)) return ma_fail(err, MA_ERR_FORMAT, "%s: truncated GGUF header", label);
    if (version != 3) return ma_fail(err, MA_ERR_FORMAT, "%s: GGUF version %u (only 3)", label, version);
    g->version = version;
    if (!rd_u64(&c, &nt) || !rd_u64(&c, &nkv)) return ma_fail(err, MA_ERR_FORMAT, "%s: truncated GGUF header", label);
    if (nt > MA_GGUF_MAX_TENSORS || nkv > MA_GGUF_MAX_KV)
        return ma_fail(err, MA_ERR_FORMAT, "%s: %llu tensors / %llu keys exceed the limits", label, (unsigned long long)nt,
                       (unsigned long long)nkv);
    /* each key needs >= 13 bytes and each tensor entry >= 32: refuse counts the file cannot hold */
    size_t left = (size_t)(c.end - c.p);
    if (nkv > left / 13 || nt > left / 32 || nkv * 13 + nt * 32 > left)
        return ma_fail(err, MA_ERR_FORMAT, "%s: %llu tensors / %llu keys cannot fit in %zu bytes", label, (unsigned long long)nt,
                       (unsigned long long)nkv, left);
    g->kv = ma_calloc(nkv ? nkv : 1, sizeof *g->kv, err, label);
    g->tensors = ma_calloc(nt ? nt : 1, sizeof *g->tensors, err, label);
    if (!g->kv || !g->tensors) return MA_ERR_NOMEM;
    g->alignment = 32;
    for (uint64_t i = 0; i < nkv; i++) {
        ma_gguf_kv *kv = &g->kv[i];
        ma_gguf_str key;
        if (!rd_str(&c, &key) || !rd_u32(&c, &kv->type))
            return ma_fail(err, MA_ERR_FORMAT, "%s: truncated metadata entry %llu", label, (unsigned long long)i);
        if (key.len == 0 || key.len > 65535 || memchr(key.p, '\0', (size_t)key.len))
            return ma_fail(err, MA_ERR_FORMAT, "%s: metadata entry %llu has a bad key", label, (unsigned long long)i);
        if (!(kv->key = dup_str(key))) return ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", label);
        g->n_kv = i + 1;
        for (uint64_t j = 0; j < i; j++)
            if (strcmp(g->kv[j].key, kv->key) == 0) return ma_fail(err, MA_ERR_FORMAT, "%s: key %s appears twice", label, kv->key);
        if (kv->type == MA_GGUF_STRING) {
            if (!rd_str(&c, &kv->v.s)) return ma_fail(err, MA_ERR_FORMAT, "%s: key %s: truncated string", label, kv->key);
        } else if (kv->type == MA_GGUF_ARRAY) {
            if (!rd_u32(&c, &kv->arr_type) || !rd_u64(&c, &kv->arr_count))
                return ma_fail(err, MA_ERR_FORMAT, "%s: key %s: truncated array", label, kv->key);
            kv->arr_data = c.p;
            if (kv->arr_type == MA_GGUF_STRING) {
                for (uint64_t k = 0; k < kv->arr_count; k++) {
                    ma_gguf_str s;
                    if (!rd_str(&c, &s)) return ma_fail(err, MA_ERR_FORMAT, "%s: key %s: truncated string array", label, kv->key);
                }
            } else {
                size_t es = scalar_size(kv->arr_type);
                const uint8_t *b;
                if (es == 0) return ma_fail(err, MA_ERR_FORMAT, "%s: key %s: array of type %u not supported", label, kv->key, kv->arr_type);
                if (kv->arr_count > (uint64_t)(c.end - c.p) / es || !take(&c, (size_t)kv->arr_count * es, &b))
                    return ma_fail(err, MA_ERR_FORMAT, "%s: key %s: truncated array", label, kv->key);
            }
        } else {
            size_t es = scalar_size(kv->type);
            const uint8_t *b;
            if (es == 0) return ma_fail(err, MA_ERR_FORMAT, "%s: key %s: unknown type %u", label, kv->key, kv->type);
            if (!take(&c, es, &b)) return ma_fail(err, MA_ERR_FORMAT, "%s: key %s: truncated value", label, kv->key);
            decode_scalar(kv, kv->type, b);
        }
        if (strcmp(kv->key, "general.alignment") == 0) {
            if (kv->type != MA_GGUF_U32 || kv->v.u == 0 || (kv->v.u & (kv->v.u - 1)) || kv->v.u > 65536)
                return ma_fail(err, MA_ERR_FORMAT, "%s: general.alignment must be a power of two u32", label);
            g->alignment = (size_t)kv->v.u;
        }
    }
    for (uint64_t i = 0; i < nt; i++) {
        ma_gguf_tensor *t = &g->tensors[i];
        ma_gguf_str name;
        if (!rd_str(&c, &name) || !rd_u32(&c, &t->n_dims))
            return ma_fail(err, MA_ERR_FORMAT, "%s: truncated tensor entry %llu", label, (unsigned long long)i);
        if (name.len == 0 || name.len > 65535 || memchr(name.p, '\0', (size_t)name.len))
            return ma_fail(err, MA_ERR_FORMAT, "%s: tensor entry %llu has a bad name", label, (unsigned long long)i);
        if (!(t->name = dup_str(name))) return ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", label);
        g->n_tensors = i + 1;
        if (t->n_dims == 0 || t->n_dims > MA_GGUF_MAX_DIMS)
            return ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s: %u dims", label, t->name, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) {
            uint64_t v;
            if (!rd_u64(&c, &v) || v > (uint64_t)INT64_MAX) return ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s: bad dims", label, t->name);
            t->ne[d] = (int64_t)v;
        }
        if (!rd_u32(&c, &t->ggml_type) || !rd_u64(&c, &t->offset))
            return ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s: truncated", label, t->name);
        if (!dtype_of_ggml(t->ggml_type, &t->dtype))
            return ma_fail(err, MA_ERR_UNSUPPORTED, "%s: tensor %s: ggml type %u not supported (F32, F16, BF16, Q8_0, Q4_0)", label,
                           t->name, t->ggml_type);
        int64_t shape[MA_GGUF_MAX_DIMS];
        for (uint32_t d = 0; d < t->n_dims; d++) shape[d] = t->ne[t->n_dims - 1 - d];
        if (ma_shape_nbytes(t->dtype, (int)t->n_dims, shape, &t->nbytes, NULL) != MA_OK)
            return ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s: dims do not fit %s blocks", label, t->name, ma_dtype_name(t->dtype));
        if (t->offset % g->alignment)
            return ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s: offset %llu not aligned to %zu", label, t->name,
                           (unsigned long long)t->offset, g->alignment);
        for (uint64_t j = 0; j < i; j++)
            if (strcmp(g->tensors[j].name, t->name) == 0) return ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s appears twice", label, t->name);
    }
    size_t pos = (size_t)(c.p - buf);
    size_t data_off = (pos + g->alignment - 1) / g->alignment * g->alignment;
    if (nt > 0 && data_off > len) return ma_fail(err, MA_ERR_FORMAT, "%s: truncated before the data section", label);
    g->data_offset = data_off;
    size_t data_len = data_off <= len ? len - data_off : 0;
    gspan *sp = ma_calloc(nt ? nt : 1, sizeof *sp, err, label);
    if (!sp) return MA_ERR_NOMEM;
    ma_status s = MA_OK;
    for (uint64_t i = 0; i < nt; i++) {
        ma_gguf_tensor *t = &g->tensors[i];
        if (t->offset > data_len || t->nbytes > data_len - t->offset) {
            s = ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s lies outside the data section", label, t->name);
            break;
        }
        t->data = buf + data_off + t->offset;
        sp[i] = (gspan){t->offset, t->offset + t->nbytes, t->name};
    }
    if (s == MA_OK) {
        qsort(sp, nt, sizeof *sp, by_b);
        for (uint64_t i = 1; i < nt; i++)
            if (sp[i].b < sp[i - 1].e) {
                s = ma_fail(err, MA_ERR_FORMAT, "%s: tensors %s and %s overlap", label, sp[i - 1].name, sp[i].name);
                break;
            }
    }
    free(sp);
    return s;
}

ma_status ma_gguf_open(ma_gguf *g, const char *path, ma_error *err) {
    memset(g, 0, sizeof *g);
    ma_status s = ma_map_file(&g->map, path, err);
    if (s) return s;
    s = ma_gguf_parse(g->map.data, g->map.size, path, g, err);
    if (s) ma_gguf_close(g);
    return s;
}

const ma_gguf_kv *ma_gguf_find_kv(const ma_gguf *g, const char *key) {
    for (size_t i = 0; i < g->n_kv; i++)
        if (strcmp(g->kv[i].key, key) == 0) return &g->kv[i];
    return NULL;
}

const ma_gguf_tensor *ma_gguf_find_tensor(const ma_gguf *g, const char *name) {
    for (size_t i = 0; i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0) return &g->tensors[i];
    return NULL;
}

static int is_int_type(uint32_t t) {
    return t == MA_GGUF_U8 || t == MA_GGUF_I8 || t == MA_GGUF_U16 || t == MA_GGUF_I16 || t == MA_GGUF_U32 || t == MA_GGUF_I32 ||
           t == MA_GGUF_U64 || t == MA_GGUF_I64;
}
static int is_signed(uint32_t t) { return t == MA_GGUF_I8 || t == MA_GGUF_I16 || t == MA_GGUF_I32 || t == MA_GGUF_I64; }

ma_status ma_gguf_get_i64(const ma_gguf *g, const char *key, int64_t *out, ma_error *err) {
    const ma_gguf_kv *kv = ma_gguf_find_kv(g, key);
    if (!kv) return ma_fail(err, MA_ERR_FORMAT, "%s: metadata key %s is missing", g->map.path ? g->map.path : "gguf", key);
    if (!is_int_type(kv->type)) return ma_fail(err, MA_ERR_FORMAT, "metadata key %s is not an integer", key);
    if (!is_signed(kv->type) && kv->v.u > (uint64_t)INT64_MAX) return ma_fail(err, MA_ERR_RANGE, "metadata key %s overflows", key);
    *out = is_signed(kv->type) ? kv->v.i : (int64_t)kv->v.u;
    return MA_OK;
}

ma_status ma_gguf_get_f64(const ma_gguf *g, const char *key, double *out, ma_error *err) {
    const ma_gguf_kv *kv = ma_gguf_find_kv(g, key);
    if (!kv) return ma_fail(err, MA_ERR_FORMAT, "%s: metadata key %s is missing", g->map.path ? g->map.path : "gguf", key);
    if (kv->type != MA_GGUF_F32 && kv->type != MA_GGUF_F64) return ma_fail(err, MA_ERR_FORMAT, "metadata key %s is not a float", key);
    *out = kv->v.f;
    return MA_OK;
}

ma_status ma_gguf_get_bool(const ma_gguf *g, const char *key, int *out, ma_error *err) {
    const ma_gguf_kv *kv = ma_gguf_find_kv(g, key);
    if (!kv) return ma_fail(err, MA_ERR_FORMAT, "%s: metadata key %s is missing", g->map.path ? g->map.path : "gguf", key);
    if (kv->type != MA_GGUF_BOOL) return ma_fail(err, MA_ERR_FORMAT, "metadata key %s is not a bool", key);
    *out = kv->v.b;
    return MA_OK;
}

ma_status ma_gguf_get_str(const ma_gguf *g, const char *key, char *out, size_t cap, ma_error *err) {
    const ma_gguf_kv *kv = ma_gguf_find_kv(g, key);
    if (!kv) return ma_fail(err, MA_ERR_FORMAT, "%s: metadata key %s is missing", g->map.path ? g->map.path : "gguf", key);
    if (kv->type != MA_GGUF_STRING) return ma_fail(err, MA_ERR_FORMAT, "metadata key %s is not a string", key);
    if (kv->v.s.len >= cap) return ma_fail(err, MA_ERR_RANGE, "metadata key %s: string too long", key);
    memcpy(out, kv->v.s.p, (size_t)kv->v.s.len);
    out[kv->v.s.len] = '\0';
    return MA_OK;
}

ma_status ma_gguf_get_i64_array(const ma_gguf *g, const char *key, int64_t *out, size_t cap, size_t *n, ma_error *err) {
    const ma_gguf_kv *kv = ma_gguf_find_kv(g, key);
    if (!kv) return ma_fail(err, MA_ERR_FORMAT, "metadata key %s is missing", key);
    if (kv->type != MA_GGUF_ARRAY || !is_int_type(kv->arr_type))
        return ma_fail(err, MA_ERR_FORMAT, "metadata key %s is not an integer array", key);
    if (kv->arr_count > cap)
        return ma_fail(err, MA_ERR_RANGE, "metadata key %s has %llu entries (max %zu)", key, (unsigned long long)kv->arr_count, cap);
    size_t es = scalar_size(kv->arr_type);
    for (uint64_t i = 0; i < kv->arr_count; i++) {
        ma_gguf_kv tmp;
        decode_scalar(&tmp, kv->arr_type, kv->arr_data + i * es);
        out[i] = is_signed(kv->arr_type) ? tmp.v.i : (int64_t)tmp.v.u;
    }
    *n = (size_t)kv->arr_count;
    return MA_OK;
}

/* ------------------------------------------------------------------------------ writing */

typedef struct {
    char *key;
    uint32_t type;
    uint8_t *payload; /* encoded value (after the type field) */
    size_t len;
} wkv;

typedef struct {
    char *name;
    ma_dtype dt;
    int ndim;
    int64_t shape[MA_GGUF_MAX_DIMS];
    const void *data;
    size_t nbytes;
    ma_gguf_fill_fn fill; /* data produced at write time (data NULL) */
    void *fill_ctx;
} wtensor;

struct ma_gguf_writer {
    wkv *kv;
    size_t n_kv, cap_kv;
    wtensor *t;
    size_t n_t, cap_t;
};

ma_gguf_writer *ma_gguf_writer_new(void) { return calloc(1, sizeof(ma_gguf_writer)); }

void ma_gguf_writer_free(ma_gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].payload);
    }
    for (size_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->kv);
    free(w->t);
    free(w);
}

static void put_le(uint8_t *p, uint64_t v, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static ma_status add_kv(ma_gguf_writer *w, const char *key, uint32_t type, const void *payload, size_t len, ma_error *err) {
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, key) == 0) return ma_fail(err, MA_ERR_ARG, "gguf writer: key %s set twice", key);
    if (ma_grow_array(&w->kv, &w->cap_kv, w->n_kv, 1, sizeof *w->kv)) return ma_fail(err, MA_ERR_NOMEM, "gguf writer: out of memory");
    wkv *kv = &w->kv[w->n_kv];
    kv->key = strdup(key);
    kv->payload = malloc(len ? len : 1);
    if (!kv->key || !kv->payload) {
        free(kv->key);
        free(kv->payload);
        return ma_fail(err, MA_ERR_NOMEM, "gguf writer: out of memory");
    }
    memcpy(kv->payload, payload, len);
    kv->len = len;
    kv->type = type;
    w->n_kv++;
    return MA_OK;
}

ma_status ma_gguf_set_u32(ma_gguf_writer *w, const char *key, uint32_t v, ma_error *err) {
    uint8_t b[4];
    put_le(b, v, 4);
    return add_kv(w, key, MA_GGUF_U32, b, 4, err);
}
ma_status ma_gguf_set_i64(ma_gguf_writer *w, const char *key, int64_t v, ma_error *err) {
    uint8_t b[8];
    put_le(b, (uint64_t)v, 8);
    return add_kv(w, key, MA_GGUF_I64, b, 8, err);
}
ma_status ma_gguf_set_f32(ma_gguf_writer *w, const char *key, float v, ma_error *err) {
    uint32_t u;
    memcpy(&u, &v, 4);
    uint8_t b[4];
    put_le(b, u, 4);
    return add_kv(w, key, MA_GGUF_F32, b, 4, err);
}
ma_status ma_gguf_set_f64(ma_gguf_writer *w, const char *key, double v, ma_error *err) {
    uint64_t u;
    memcpy(&u, &v, 8);
    uint8_t b[8];
    put_le(b, u, 8);
    return add_kv(w, key, MA_GGUF_F64, b, 8, err);
}
ma_status ma_gguf_set_bool(ma_gguf_writer *w, const char *key, int v, ma_error *err) {
    uint8_t b = v ? 1 : 0;
    return add_kv(w, key, MA_GGUF_BOOL, &b, 1, err);
}
ma_status ma_gguf_set_str(ma_gguf_writer *w, const char *key, const char *v, ma_error *err) {
    size_t n = strlen(v);
    uint8_t *b = malloc(8 + n);
    if (!b) return ma_fail(err, MA_ERR_NOMEM, "gguf writer: out of memory");
    put_le(b, n, 8);
    memcpy(b + 8, v, n);
    ma_status s = add_kv(w, key, MA_GGUF_STRING, b, 8 + n, err);
    free(b);
    return s;
}
ma_status ma_gguf_set_i64_array(ma_gguf_writer *w, const char *key, const int64_t *v, size_t n, ma_error *err) {
    uint8_t *b = malloc(12 + 8 * n);
    if (!b) return ma_fail(err, MA_ERR_NOMEM, "gguf writer: out of memory");
    put_le(b, MA_GGUF_I64, 4);
    put_le(b + 4, n, 8);
    for (size_t i = 0; i < n; i++) put_le(b + 12 + 8 * i, (uint64_t)v[i], 8);
    ma_status s = add_kv(w, key, MA_GGUF_ARRAY, b, 12 + 8 * n, err);
    free(b);
    return s;
}

ma_status ma_gguf_add_tensor(ma_gguf_writer *w, const char *name, ma_dtype dt, int ndim, const int64_t *shape, const void *data,
                             ma_error *err) {
    uint32_t gt;
    if (!ggml_type_of(dt, &gt)) return ma_fail(err, MA_ERR_UNSUPPORTED, "gguf writer: tensor %s: dtype %s", name, ma_dtype_name(dt));
    if (ndim < 1 || ndim > MA_GGUF_MAX_DIMS) return ma_fail(err, MA_ERR_SHAPE, "gguf writer: tensor %s: %d dims", name, ndim);
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0) return ma_fail(err, MA_ERR_ARG, "gguf writer: tensor %s added twice", name);
    size_t nb;
    ma_status s = ma_shape_nbytes(dt, ndim, shape, &nb, err);
    if (s) return ma_error_wrap(err, s, "gguf writer: tensor %s", name);
    if (ma_grow_array(&w->t, &w->cap_t, w->n_t, 1, sizeof *w->t)) return ma_fail(err, MA_ERR_NOMEM, "gguf writer: out of memory");
    wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return ma_fail(err, MA_ERR_NOMEM, "gguf writer: out of memory");
    t->dt = dt;
    t->ndim = ndim;
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
    t->data = data;
    t->nbytes = nb;
    w->n_t++;
    return MA_OK;
}

ma_status ma_gguf_add_tensor_fill(ma_gguf_writer *w, const char *name, ma_dtype dt, int ndim, const int64_t *shape, ma_gguf_fill_fn fill,
                                  void *ctx, ma_error *err) {
    ma_status s = ma_gguf_add_tensor(w, name, dt, ndim, shape, NULL, err);
    if (s) return s;
    w->t[w->n_t - 1].fill = fill;
    w->t[w->n_t - 1].fill_ctx = ctx;
    return MA_OK;
}

ma_status ma_gguf_write(ma_gguf_writer *w, const char *path, ma_error *err) {
    const size_t align = 32;
    ma_outfile f;
    ma_status s = ma_out_open(&f, path, err);
    if (s) return s;
    uint8_t b[16];
    size_t pos = 0;
#define W(ptr, n)                     \
    do {                              \
        ma_out_write(&f, (ptr), (n)); \
        pos += (n);                   \
    } while (0)
    put_le(b, 0x46554747u, 4);
    put_le(b + 4, 3, 4);
    W(b, 8);
    put_le(b, w->n_t, 8);
    put_le(b + 8, w->n_kv + 1, 8);
    W(b, 16);
    { /* alignment first, so readers know it before the data */
        const char *k = "general.alignment";
        put_le(b, strlen(k), 8);
        W(b, 8);
        W(k, strlen(k));
        put_le(b, MA_GGUF_U32, 4);
        put_le(b + 4, align, 4);
        W(b, 8);
    }
    for (size_t i = 0; i < w->n_kv; i++) {
        size_t kl = strlen(w->kv[i].key);
        put_le(b, kl, 8);
        W(b, 8);
        W(w->kv[i].key, kl);
        put_le(b, w->kv[i].type, 4);
        W(b, 4);
        W(w->kv[i].payload, w->kv[i].len);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        wtensor *t = &w->t[i];
        size_t nl = strlen(t->name);
        uint32_t gt = 0;
        ggml_type_of(t->dt, &gt);
        put_le(b, nl, 8);
        W(b, 8);
        W(t->name, nl);
        put_le(b, (uint64_t)t->ndim, 4);
        W(b, 4);
        for (int d = t->ndim - 1; d >= 0; d--) {
            put_le(b, (uint64_t)t->shape[d], 8);
            W(b, 8);
        }
        put_le(b, gt, 4);
        put_le(b + 4, off, 8);
        W(b, 12);
        off += (t->nbytes + align - 1) / align * align;
    }
    static const uint8_t zeros[64];
    size_t pad = (align - pos % align) % align;
    W(zeros, pad);
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        if (t->fill) {
            void *buf = malloc(t->nbytes ? t->nbytes : 1);
            if (!buf) s = ma_fail(err, MA_ERR_NOMEM, "gguf writer: tensor %s: cannot allocate %zu bytes", t->name, t->nbytes);
            else if ((s = t->fill(t->fill_ctx, buf, t->nbytes, err))) ma_error_wrap(err, s, "gguf writer: tensor %s", t->name);
            else W(buf, t->nbytes);
            free(buf);
            if (s) {
                ma_out_abort(&f);
                return s;
            }
        } else W(t->data, t->nbytes);
        pad = (align - t->nbytes % align) % align;
        W(zeros, pad);
    }
#undef W
    return ma_out_commit(&f, err);
}
