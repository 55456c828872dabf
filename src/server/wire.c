/* msgpack-numpy and json_numpy <-> the API's observation and result (see wire.h). */
#include "server/wire.h"

#include <cjson/cJSON.h>
#include <libwebsockets.h>
#include <math.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/image.h"

#define MAX_STATE 64

void ma_wire_request_free(ma_wire_request *r) {
    if (!r) return;
    free(r->img[0]);
    free(r->img[1]);
    free(r->noise);
    free(r->task);
    memset(r, 0, sizeof *r);
}

/* ------------------------------------------------------------------------ msgpack sanity walk */

static uint64_t be(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = v << 8 | p[i];
    return v;
}

/* one object at *pos; returns 0 when it fits, advancing *pos */
static int walk(const uint8_t *b, size_t len, size_t *pos, int depth) {
    if (depth <= 0 || *pos >= len) return -1;
    const uint8_t t = b[(*pos)++];
    size_t rest = len - *pos;
    uint64_t n = 0, items = 0;
    int lenbytes = 0, skip = 0, pairs = 0;
    if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3) return 0;
    if (t >= 0x80 && t <= 0x8f) { items = t & 0x0f; pairs = 1; }
    else if (t >= 0x90 && t <= 0x9f) items = t & 0x0f;
    else if (t >= 0xa0 && t <= 0xbf) n = t & 0x1f;
    else switch (t) {
    case 0xc4: case 0xd9: lenbytes = 1; break;             /* bin8, str8 */
    case 0xc5: case 0xda: lenbytes = 2; break;             /* bin16, str16 */
    case 0xc6: case 0xdb: lenbytes = 4; break;             /* bin32, str32 */
    case 0xc7: lenbytes = 1; skip = 1; break;              /* ext8 */
    case 0xc8: lenbytes = 2; skip = 1; break;
    case 0xc9: lenbytes = 4; skip = 1; break;
    case 0xca: n = 4; break;
    case 0xcb: n = 8; break;
    case 0xcc: case 0xd0: n = 1; break;
    case 0xcd: case 0xd1: n = 2; break;
    case 0xce: case 0xd2: n = 4; break;
    case 0xcf: case 0xd3: n = 8; break;
    case 0xd4: n = 2; break;
    case 0xd5: n = 3; break;
    case 0xd6: n = 5; break;
    case 0xd7: n = 9; break;
    case 0xd8: n = 17; break;
    case 0xdc: case 0xdd: case 0xde: case 0xdf: { /* array16/32, map16/32 */
        const int nb = (t & 1) ? 4 : 2;
        if (rest < (size_t)nb) return -1;
        items = be(b + *pos, nb);
        *pos += (size_t)nb;
        pairs = t >= 0xde;
    } break;
    default: return -1; /* 0xc1: never used */
    }
    if (lenbytes) {
        if (rest < (size_t)lenbytes) return -1;
        n = be(b + *pos, lenbytes) + (uint64_t)skip;
        *pos += (size_t)lenbytes;
    }
    rest = len - *pos;
    if (n) {
        if (n > rest) return -1;
        *pos += (size_t)n;
        return 0;
    }
    if (pairs) items *= 2;
    if (items > rest) return -1; /* every element takes at least one byte */
    for (uint64_t i = 0; i < items; i++)
        if (walk(b, len, pos, depth - 1)) return -1;
    return 0;
}

int ma_wire_msgpack_sane(const uint8_t *buf, size_t len, int max_depth) {
    size_t pos = 0;
    return walk(buf, len, &pos, max_depth) == 0 && pos == len ? 0 : -1;
}

/* ------------------------------------------------------------------------ arrays */

typedef enum { DT_U8, DT_F32, DT_F64, DT_I64, DT_I32, DT_NONE } wdtype;

typedef struct {
    wdtype dt;
    int ndim;
    int64_t shape[4];
    const uint8_t *data;
    size_t nbytes;
} warray;

static const struct { const char *name; wdtype dt; size_t size; } DTYPES[] = {
    {"|u1", DT_U8, 1}, {"<u1", DT_U8, 1}, {"uint8", DT_U8, 1}, {"<f4", DT_F32, 4}, {"float32", DT_F32, 4},
    {"<f8", DT_F64, 8}, {"float64", DT_F64, 8}, {"<i8", DT_I64, 8}, {"int64", DT_I64, 8}, {"<i4", DT_I32, 4}, {"int32", DT_I32, 4}};

static ma_status array_check(warray *a, const char *dtype, size_t dlen, const char *key, ma_error *err) {
    size_t es = 0;
    a->dt = DT_NONE;
    for (size_t i = 0; i < sizeof DTYPES / sizeof DTYPES[0]; i++)
        if (strlen(DTYPES[i].name) == dlen && !memcmp(DTYPES[i].name, dtype, dlen)) { a->dt = DTYPES[i].dt; es = DTYPES[i].size; }
    if (a->dt == DT_NONE)
        return ma_fail(err, MA_ERR_FORMAT, "%s: dtype '%.*s' is not supported (|u1, <f4, <f8, <i4, <i8)", key, (int)(dlen > 16 ? 16 : dlen), dtype);
    uint64_t n = 1;
    for (int d = 0; d < a->ndim; d++) {
        if (a->shape[d] < 0 || a->shape[d] > (1 << 30)) return ma_fail(err, MA_ERR_SHAPE, "%s: bad shape", key);
        n *= (uint64_t)a->shape[d];
        if (n > (1ull << 34)) return ma_fail(err, MA_ERR_SHAPE, "%s: shape too large", key);
    }
    if (n * es != a->nbytes)
        return ma_fail(err, MA_ERR_SHAPE, "%s: %zu data bytes, dtype and shape need %llu", key, a->nbytes, (unsigned long long)(n * es));
    return MA_OK;
}

static double element(const warray *a, size_t i) {
    const uint8_t *p = a->data;
    switch (a->dt) {
    case DT_U8: return p[i];
    case DT_F32: { float f; memcpy(&f, p + 4 * i, 4); return f; }
    case DT_F64: { double d; memcpy(&d, p + 8 * i, 8); return d; }
    case DT_I64: { int64_t v; memcpy(&v, p + 8 * i, 8); return (double)v; }
    case DT_I32: { int32_t v; memcpy(&v, p + 4 * i, 4); return v; }
    default: return 0;
    }
}

static void shape_str(const warray *a, char *out, size_t cap) {
    size_t k = (size_t)snprintf(out, cap, "[");
    for (int d = 0; d < a->ndim && k < cap; d++) k += (size_t)snprintf(out + k, cap - k, d ? ", %lld" : "%lld", (long long)a->shape[d]);
    if (k < cap) snprintf(out + k, cap - k, "]");
}

/* ------------------------------------------------------------------------ request -> observation */

typedef enum { R_IMAGE, R_WRIST, R_STATE, R_TASK, R_NOISE, R_SEED, R_NONE } role;

static role role_of(const char *k, size_t n) {
    static const struct { const char *key; role r; } KEYS[] = {
        {"observation/image", R_IMAGE}, {"image", R_IMAGE}, {"observation/wrist_image", R_WRIST}, {"wrist_image", R_WRIST},
        {"observation/state", R_STATE}, {"state", R_STATE}, {"prompt", R_TASK}, {"instruction", R_TASK}, {"task", R_TASK},
        {"noise", R_NOISE}, {"seed", R_SEED}};
    for (size_t i = 0; i < sizeof KEYS / sizeof KEYS[0]; i++)
        if (strlen(KEYS[i].key) == n && !memcmp(KEYS[i].key, k, n)) return KEYS[i].r;
    return R_NONE;
}

static const char *ROLE_KEY[] = {"observation/image", "observation/wrist_image", "observation/state", "prompt", "noise", "seed"};

/* a value as the request gives it: an array, encoded image bytes, a string or an integer */
typedef struct {
    int kind; /* 0 none, 1 array, 2 bytes, 3 string, 4 integer */
    warray a;
    const uint8_t *bytes;
    size_t nbytes;
    uint64_t u;
    char key[64];
    uint8_t *owned; /* what a and bytes point into when decoded here (freed after build) */
} wvalue;

static void rotate180(uint8_t *rgb, int h, int w) {
    const size_t n = (size_t)h * w;
    for (size_t i = 0; i < n / 2; i++) {
        uint8_t *a = rgb + 3 * i, *b = rgb + 3 * (n - 1 - i), t[3];
        memcpy(t, a, 3);
        memcpy(a, b, 3);
        memcpy(b, t, 3);
    }
}

static ma_status take_image(const wvalue *v, int slot, int flip, ma_wire_request *r, ma_error *err) {
    molmoact_image *im = &r->obs.images[slot];
    if (v->kind == 2) {
        if (!v->nbytes) return ma_fail(err, MA_ERR_FORMAT, "%s: empty image bytes", v->key);
        if (flip) { /* rotate: decode here */
            ma_image d;
            ma_status s = ma_image_decode(v->bytes, v->nbytes, v->key, &d, err);
            if (s) return s;
            rotate180(d.rgb, d.h, d.w);
            r->img[slot] = d.rgb;
            *im = (molmoact_image){d.rgb, d.h, d.w, 0, NULL, 0};
            return MA_OK;
        }
        r->img[slot] = malloc(v->nbytes);
        if (!r->img[slot]) return ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", v->key);
        memcpy(r->img[slot], v->bytes, v->nbytes);
        *im = (molmoact_image){NULL, 0, 0, 0, r->img[slot], v->nbytes};
        return MA_OK;
    }
    if (v->kind != 1) return ma_fail(err, MA_ERR_FORMAT, "%s: expected a uint8 [H, W, 3] array or PNG/JPEG bytes", v->key);
    const warray *a = &v->a;
    char sh[64];
    shape_str(a, sh, sizeof sh);
    if (a->dt != DT_U8) return ma_fail(err, MA_ERR_FORMAT, "%s: dtype must be uint8 (|u1), the array has another", v->key);
    if (a->ndim != 3 || a->shape[2] != 3) return ma_fail(err, MA_ERR_SHAPE, "%s: shape %s, expected [H, W, 3]", v->key, sh);
    if (a->shape[0] < 1 || a->shape[1] < 1) return ma_fail(err, MA_ERR_SHAPE, "%s: shape %s is empty", v->key, sh);
    if (a->shape[0] > MA_IMAGE_MAX_SIDE || a->shape[1] > MA_IMAGE_MAX_SIDE)
        return ma_fail(err, MA_ERR_SHAPE, "%s: shape %s exceeds %d per side", v->key, sh, MA_IMAGE_MAX_SIDE);
    r->img[slot] = malloc(a->nbytes);
    if (!r->img[slot]) return ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", v->key);
    memcpy(r->img[slot], a->data, a->nbytes);
    if (flip) rotate180(r->img[slot], (int)a->shape[0], (int)a->shape[1]);
    *im = (molmoact_image){r->img[slot], (int)a->shape[0], (int)a->shape[1], 0, NULL, 0};
    return MA_OK;
}

static ma_status build(wvalue *v, int flip, ma_wire_request *r, ma_error *err) {
    ma_status s;
    molmoact_observation_init(&r->obs);
    for (int i = 0; i < 4; i++)
        if (!v[i].kind) {
            static const char *alt[] = {"image", "wrist_image", "state", "instruction"};
            return ma_fail(err, MA_ERR_ARG, "missing key: %s (or %s)", ROLE_KEY[i], alt[i]);
        }
    if ((s = take_image(&v[R_IMAGE], 0, flip, r, err)) || (s = take_image(&v[R_WRIST], 1, flip, r, err))) return s;
    /* state: float32 / float64 [n] (or a list of numbers) */
    const wvalue *st = &v[R_STATE];
    if (st->kind != 1 || (st->a.dt != DT_F32 && st->a.dt != DT_F64) || st->a.ndim != 1)
        return ma_fail(err, MA_ERR_FORMAT, "%s: expected a float32 or float64 [8] array", st->key);
    if (st->a.shape[0] < 1 || st->a.shape[0] > MAX_STATE) return ma_fail(err, MA_ERR_SHAPE, "%s: %lld values", st->key, (long long)st->a.shape[0]);
    for (int64_t i = 0; i < st->a.shape[0]; i++) {
        const double d = element(&st->a, (size_t)i);
        if (!isfinite(d) || fabs(d) > 3e38) return ma_fail(err, MA_ERR_RANGE, "%s[%lld] is %s", st->key, (long long)i, isnan(d) ? "NaN" : "not finite");
        r->state[i] = (float)d;
    }
    r->obs.state = r->state;
    r->obs.state_dim = (int)st->a.shape[0];
    if (v[R_TASK].kind != 3) return ma_fail(err, MA_ERR_FORMAT, "%s: expected a string", v[R_TASK].key);
    if (v[R_TASK].nbytes > 65536) return ma_fail(err, MA_ERR_NOMEM, "%s: longer than 65536 bytes", v[R_TASK].key);
    if (memchr(v[R_TASK].bytes, 0, v[R_TASK].nbytes)) return ma_fail(err, MA_ERR_FORMAT, "%s: contains a NUL byte", v[R_TASK].key);
    r->task = malloc(v[R_TASK].nbytes + 1);
    if (!r->task) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
    memcpy(r->task, v[R_TASK].bytes, v[R_TASK].nbytes);
    r->task[v[R_TASK].nbytes] = '\0';
    r->obs.task = r->task;
    if (v[R_NOISE].kind) {
        const warray *a = &v[R_NOISE].a;
        if (v[R_NOISE].kind != 1 || a->dt != DT_F32) return ma_fail(err, MA_ERR_FORMAT, "noise: expected a float32 array [1, 10, 32]");
        r->noise = malloc(a->nbytes ? a->nbytes : 1);
        if (!r->noise) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
        memcpy(r->noise, a->data, a->nbytes);
        r->obs.noise = r->noise;
        r->obs.noise_len = a->nbytes / 4;
    }
    if (v[R_SEED].kind) {
        if (v[R_SEED].kind != 4) return ma_fail(err, MA_ERR_FORMAT, "seed: expected a non-negative integer");
        r->obs.have_seed = 1;
        r->obs.seed = v[R_SEED].u;
    }
    r->flip180 = flip;
    return MA_OK;
}

/* -------------------------------------------------------------------------------- msgpack */

static int obj_is(const msgpack_object *o, const char *s) {
    const size_t n = strlen(s);
    if (o->type == MSGPACK_OBJECT_STR) return o->via.str.size == n && !memcmp(o->via.str.ptr, s, n);
    if (o->type == MSGPACK_OBJECT_BIN) return o->via.bin.size == n && !memcmp(o->via.bin.ptr, s, n);
    return 0;
}

static const msgpack_object *map_get(const msgpack_object *m, const char *key) {
    for (uint32_t i = 0; i < m->via.map.size; i++)
        if (obj_is(&m->via.map.ptr[i].key, key)) return &m->via.map.ptr[i].val;
    return NULL;
}

static ma_status mp_value(const msgpack_object *o, wvalue *v, ma_error *err) {
    switch (o->type) {
    case MSGPACK_OBJECT_STR: v->kind = 3; v->bytes = (const uint8_t *)o->via.str.ptr; v->nbytes = o->via.str.size; return MA_OK;
    case MSGPACK_OBJECT_BIN: v->kind = 2; v->bytes = (const uint8_t *)o->via.bin.ptr; v->nbytes = o->via.bin.size; return MA_OK;
    case MSGPACK_OBJECT_POSITIVE_INTEGER: v->kind = 4; v->u = o->via.u64; return MA_OK;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return ma_fail(err, MA_ERR_RANGE, "%s: negative", v->key);
    case MSGPACK_OBJECT_ARRAY: { /* a plain list of numbers (a state, from clients without numpy) */
        const uint32_t n = o->via.array.size;
        if (n < 1 || n > MAX_STATE) return ma_fail(err, MA_ERR_SHAPE, "%s: a list of %u values", v->key, n);
        uint8_t *scratch = v->owned = malloc((size_t)n * 8);
        if (!scratch) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
        for (uint32_t i = 0; i < n; i++) {
            const msgpack_object *e = &o->via.array.ptr[i];
            double d;
            if (e->type == MSGPACK_OBJECT_FLOAT32 || e->type == MSGPACK_OBJECT_FLOAT64) d = e->via.f64;
            else if (e->type == MSGPACK_OBJECT_POSITIVE_INTEGER) d = (double)e->via.u64;
            else if (e->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) d = (double)e->via.i64;
            else return ma_fail(err, MA_ERR_FORMAT, "%s[%u]: not a number", v->key, i);
            memcpy(scratch + 8 * i, &d, 8);
        }
        v->kind = 1;
        v->a = (warray){DT_F64, 1, {n}, scratch, (size_t)n * 8};
        return MA_OK;
    }
    case MSGPACK_OBJECT_MAP: {
        const msgpack_object *nd = map_get(o, "__ndarray__"), *gen = map_get(o, "__npgeneric__");
        const msgpack_object *data = map_get(o, "data"), *dtype = map_get(o, "dtype"), *shape = map_get(o, "shape");
        if (gen && data && data->type == MSGPACK_OBJECT_POSITIVE_INTEGER) { v->kind = 4; v->u = data->via.u64; return MA_OK; }
        if (gen) return ma_fail(err, MA_ERR_FORMAT, "%s: a numpy scalar here is not supported", v->key);
        if (!nd || !data || !dtype || !shape || data->type != MSGPACK_OBJECT_BIN ||
            (dtype->type != MSGPACK_OBJECT_STR && dtype->type != MSGPACK_OBJECT_BIN) || shape->type != MSGPACK_OBJECT_ARRAY)
            return ma_fail(err, MA_ERR_FORMAT, "%s: not a msgpack-numpy array (__ndarray__, data, dtype, shape)", v->key);
        if (shape->via.array.size > 4) return ma_fail(err, MA_ERR_SHAPE, "%s: %u dimensions", v->key, shape->via.array.size);
        v->a.ndim = (int)shape->via.array.size;
        for (int d = 0; d < v->a.ndim; d++) {
            const msgpack_object *e = &shape->via.array.ptr[d];
            if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER || e->via.u64 > (1u << 30)) return ma_fail(err, MA_ERR_SHAPE, "%s: bad shape", v->key);
            v->a.shape[d] = (int64_t)e->via.u64;
        }
        v->a.data = (const uint8_t *)data->via.bin.ptr;
        v->a.nbytes = data->via.bin.size;
        const char *ds = dtype->type == MSGPACK_OBJECT_STR ? dtype->via.str.ptr : dtype->via.bin.ptr;
        const size_t dl = dtype->type == MSGPACK_OBJECT_STR ? dtype->via.str.size : dtype->via.bin.size;
        v->kind = 1;
        return array_check(&v->a, ds, dl, v->key, err);
    }
    default: return ma_fail(err, MA_ERR_FORMAT, "%s: unexpected msgpack type", v->key);
    }
}

ma_status ma_wire_decode_msgpack(const uint8_t *buf, size_t len, int flip180, ma_wire_request *out, ma_error *err) {
    memset(out, 0, sizeof *out);
    if (ma_wire_msgpack_sane(buf, len, 16)) return ma_fail(err, MA_ERR_FORMAT, "request: not a msgpack message (malformed, truncated or trailing bytes)");
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    ma_status s = MA_OK;
    if (msgpack_unpack_next(&u, (const char *)buf, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len)
        s = ma_fail(err, MA_ERR_FORMAT, "request: not a msgpack message");
    else if (u.data.type != MSGPACK_OBJECT_MAP) s = ma_fail(err, MA_ERR_FORMAT, "request: expected a msgpack map of observation keys");
    wvalue v[R_NONE];
    memset(v, 0, sizeof v);
    for (uint32_t i = 0; !s && i < u.data.via.map.size; i++) {
        const msgpack_object *k = &u.data.via.map.ptr[i].key;
        const char *ks = k->type == MSGPACK_OBJECT_STR ? k->via.str.ptr : k->type == MSGPACK_OBJECT_BIN ? k->via.bin.ptr : NULL;
        const size_t kl = k->type == MSGPACK_OBJECT_STR ? k->via.str.size : k->type == MSGPACK_OBJECT_BIN ? k->via.bin.size : 0;
        if (!ks) { s = ma_fail(err, MA_ERR_FORMAT, "request: a key is not a string"); break; }
        const role r = role_of(ks, kl);
        if (r == R_NONE) { s = ma_fail(err, MA_ERR_ARG, "request: unknown key '%.*s'", (int)(kl > 48 ? 48 : kl), ks); break; }
        if (v[r].kind) { s = ma_fail(err, MA_ERR_ARG, "request: key '%.*s' repeats %s", (int)kl, ks, ROLE_KEY[r]); break; }
        snprintf(v[r].key, sizeof v[r].key, "%.*s", (int)kl, ks);
        s = mp_value(&u.data.via.map.ptr[i].val, &v[r], err);
    }
    if (!s) s = build(v, flip180, out, err);
    for (int i = 0; i < R_NONE; i++) free(v[i].owned);
    msgpack_unpacked_destroy(&u);
    if (s) ma_wire_request_free(out);
    return s;
}

/* ------------------------------------------------------------------------------ json_numpy */

static ma_status json_value(const cJSON *j, wvalue *v, ma_error *err) {
    uint8_t **owned = &v->owned;
    if (cJSON_IsString(j)) { v->kind = 3; v->bytes = (const uint8_t *)j->valuestring; v->nbytes = strlen(j->valuestring); return MA_OK; }
    if (cJSON_IsNumber(j)) {
        if (j->valuedouble < 0 || j->valuedouble != floor(j->valuedouble) || j->valuedouble > 1.8e19)
            return ma_fail(err, MA_ERR_RANGE, "%s: expected a non-negative integer", v->key);
        v->kind = 4;
        v->u = (uint64_t)j->valuedouble;
        return MA_OK;
    }
    if (cJSON_IsArray(j)) { /* a list of numbers */
        const int n = cJSON_GetArraySize(j);
        if (n < 1 || n > MAX_STATE) return ma_fail(err, MA_ERR_SHAPE, "%s: a list of %d values", v->key, n);
        *owned = malloc((size_t)n * 8);
        if (!*owned) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
        int i = 0;
        for (const cJSON *e = j->child; e; e = e->next, i++) {
            if (!cJSON_IsNumber(e)) return ma_fail(err, MA_ERR_FORMAT, "%s[%d]: not a number", v->key, i);
            memcpy(*owned + 8 * i, &e->valuedouble, 8);
        }
        v->kind = 1;
        v->a = (warray){DT_F64, 1, {n}, *owned, (size_t)n * 8};
        return MA_OK;
    }
    const cJSON *b64 = cJSON_GetObjectItemCaseSensitive(j, "__numpy__"), *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype"),
                *sh = cJSON_GetObjectItemCaseSensitive(j, "shape");
    if (!cJSON_IsString(b64) || !cJSON_IsString(dt) || !cJSON_IsArray(sh))
        return ma_fail(err, MA_ERR_FORMAT, "%s: not a json_numpy array (__numpy__, dtype, shape)", v->key);
    if (cJSON_GetArraySize(sh) > 4) return ma_fail(err, MA_ERR_SHAPE, "%s: %d dimensions", v->key, cJSON_GetArraySize(sh));
    v->a.ndim = 0;
    for (const cJSON *e = sh->child; e; e = e->next) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > (1 << 30) || e->valuedouble != floor(e->valuedouble))
            return ma_fail(err, MA_ERR_SHAPE, "%s: bad shape", v->key);
        v->a.shape[v->a.ndim++] = (int64_t)e->valuedouble;
    }
    const size_t bl = strlen(b64->valuestring);
    if (bl > (size_t)INT32_MAX / 2) return ma_fail(err, MA_ERR_NOMEM, "%s: too large", v->key);
    *owned = malloc(bl / 4 * 3 + 4);
    if (!*owned) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
    const int n = lws_b64_decode_string(b64->valuestring, (char *)*owned, (int)(bl / 4 * 3 + 4));
    if (n < 0) return ma_fail(err, MA_ERR_FORMAT, "%s: __numpy__ is not base64", v->key);
    v->a.data = *owned;
    v->a.nbytes = (size_t)n;
    v->kind = 1;
    return array_check(&v->a, dt->valuestring, strlen(dt->valuestring), v->key, err);
}

ma_status ma_wire_decode_json(const char *buf, size_t len, int flip180, ma_wire_request *out, ma_error *err) {
    memset(out, 0, sizeof *out);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
    if (!root) return ma_fail(err, MA_ERR_FORMAT, "request: not JSON (syntax error at byte %zu)", end && end >= buf ? (size_t)(end - buf) : 0);
    ma_status s = MA_OK;
    if (!cJSON_IsObject(root)) s = ma_fail(err, MA_ERR_FORMAT, "request: expected a JSON object");
    wvalue v[R_NONE];
    memset(v, 0, sizeof v);
    for (const cJSON *e = root->child; !s && e; e = e->next) {
        const role r = role_of(e->string, strlen(e->string));
        if (r == R_NONE) { s = ma_fail(err, MA_ERR_ARG, "request: unknown key '%.48s'", e->string); break; }
        if (v[r].kind) { s = ma_fail(err, MA_ERR_ARG, "request: key '%.48s' repeats %s", e->string, ROLE_KEY[r]); break; }
        snprintf(v[r].key, sizeof v[r].key, "%s", e->string);
        s = json_value(e, &v[r], err);
    }
    /* an image as a base64 string of PNG/JPEG bytes */
    for (int i = 0; i < 2 && !s; i++)
        if (v[i].kind == 3) {
            const size_t bl = v[i].nbytes;
            v[i].owned = malloc(bl / 4 * 3 + 4);
            if (!v[i].owned) { s = ma_fail(err, MA_ERR_NOMEM, "out of memory"); break; }
            const int n = lws_b64_decode_string((const char *)v[i].bytes, (char *)v[i].owned, (int)(bl / 4 * 3 + 4));
            if (n <= 0) { s = ma_fail(err, MA_ERR_FORMAT, "%s: expected a json_numpy array or base64 PNG/JPEG bytes", v[i].key); break; }
            v[i].kind = 2;
            v[i].bytes = v[i].owned;
            v[i].nbytes = (size_t)n;
        }
    if (!s) s = build(v, flip180, out, err);
    for (int i = 0; i < R_NONE; i++) free(v[i].owned);
    cJSON_Delete(root);
    if (s) ma_wire_request_free(out);
    return s;
}

/* ------------------------------------------------------------------------------ replies */

static int buf_write(void *data, const char *p, size_t n) {
    ma_wire_buf *b = data;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->len + n) cap *= 2;
        uint8_t *d = realloc(b->data, cap);
        if (!d) return -1;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

static void pack_str(msgpack_packer *pk, const char *s) { msgpack_pack_str_with_body(pk, s, strlen(s)); }
static void pack_bin_key(msgpack_packer *pk, const char *s) { msgpack_pack_bin_with_body(pk, s, strlen(s)); }

ma_status ma_wire_encode_reply(const molmoact_result *res, double server_infer_ms, double prev_total_ms, ma_wire_buf *out,
                               ma_error *err) {
    memset(out, 0, sizeof *out);
    msgpack_packer pk;
    msgpack_packer_init(&pk, out, buf_write);
    msgpack_pack_map(&pk, 3);
    pack_str(&pk, "actions"); /* msgpack-numpy: bin keys, as openpi's unpack_array reads them */
    msgpack_pack_map(&pk, 4);
    pack_bin_key(&pk, "__ndarray__");
    msgpack_pack_true(&pk);
    pack_bin_key(&pk, "data");
    msgpack_pack_bin_with_body(&pk, res->actions, sizeof(float) * (size_t)res->n_steps * (size_t)res->action_dim);
    pack_bin_key(&pk, "dtype");
    pack_str(&pk, "<f4");
    pack_bin_key(&pk, "shape");
    msgpack_pack_array(&pk, 2);
    msgpack_pack_int(&pk, res->n_steps);
    msgpack_pack_int(&pk, res->action_dim);
    const molmoact_timing *t = &res->timing;
    pack_str(&pk, "policy_timing");
    msgpack_pack_map(&pk, 9);
    pack_str(&pk, "infer_ms"); msgpack_pack_double(&pk, t->total);
    pack_str(&pk, "preprocess_ms"); msgpack_pack_double(&pk, t->preprocess);
    pack_str(&pk, "vision_ms"); msgpack_pack_double(&pk, t->vision);
    pack_str(&pk, "llm_ms"); msgpack_pack_double(&pk, t->llm_split[0] + t->llm_split[1] + t->llm_split[2] + t->llm_split[3]);
    pack_str(&pk, "action_context_ms"); msgpack_pack_double(&pk, t->action_context);
    pack_str(&pk, "action_step_ms"); msgpack_pack_double(&pk, t->action_step);
    pack_str(&pk, "transfer_ms"); msgpack_pack_double(&pk, t->transfer);
    pack_str(&pk, "host_ms"); msgpack_pack_double(&pk, t->host);
    pack_str(&pk, "llm_split_ms");
    msgpack_pack_array(&pk, 4);
    for (int i = 0; i < 4; i++) msgpack_pack_double(&pk, t->llm_split[i]);
    pack_str(&pk, "server_timing");
    msgpack_pack_map(&pk, prev_total_ms >= 0 ? 2 : 1);
    pack_str(&pk, "infer_ms");
    msgpack_pack_double(&pk, server_infer_ms);
    if (prev_total_ms >= 0) {
        pack_str(&pk, "prev_total_ms");
        msgpack_pack_double(&pk, prev_total_ms);
    }
    if (!out->data) return ma_fail(err, MA_ERR_NOMEM, "reply: out of memory");
    return MA_OK;
}

ma_status ma_wire_encode_metadata(const molmoact_info *info, const char *model_name, ma_wire_buf *out, ma_error *err) {
    memset(out, 0, sizeof *out);
    msgpack_packer pk;
    msgpack_packer_init(&pk, out, buf_write);
    msgpack_pack_map(&pk, 9);
    pack_str(&pk, "model"); pack_str(&pk, model_name);
    pack_str(&pk, "variant"); pack_str(&pk, info->variant);
    pack_str(&pk, "action_horizon"); msgpack_pack_int(&pk, info->n_steps);
    pack_str(&pk, "action_dim"); msgpack_pack_int(&pk, info->action_dim);
    pack_str(&pk, "norm_tag"); pack_str(&pk, info->norm_tag);
    pack_str(&pk, "precision");
    msgpack_pack_map(&pk, 3);
    pack_str(&pk, "vision"); pack_str(&pk, info->precision[0]);
    pack_str(&pk, "llm"); pack_str(&pk, info->precision[1]);
    pack_str(&pk, "action"); pack_str(&pk, info->precision[2]);
    pack_str(&pk, "prompt_seq"); msgpack_pack_int(&pk, info->prompt_seq);
    pack_str(&pk, "state_dim"); msgpack_pack_int(&pk, info->state_dim);
    pack_str(&pk, "molmoact_version"); pack_str(&pk, molmoact_version());
    if (!out->data) return ma_fail(err, MA_ERR_NOMEM, "metadata: out of memory");
    return MA_OK;
}
