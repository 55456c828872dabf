/* SPDX-License-Identifier: Apache-2.0 */
/* msgpack-numpy and json_numpy <-> the API's observation and result (see wire.h). */
#include "server/wire.h"

#include <float.h>
#include <math.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "model/image.h"
#include "server/b64.h"
#include "server/json.h"

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

/* one object at *pos; returns 0 when it fits, advancing *pos and adding to *objects the objects
 * it holds (itself included: what msgpack-c's unpacker would allocate a msgpack_object for) */
static int walk(const uint8_t *b, size_t len, size_t *pos, int depth, uint64_t *objects) {
    if (depth <= 0 || *pos >= len) return -1;
    (*objects)++;
    const uint8_t t = b[(*pos)++];
    size_t rest = len - *pos;
    uint64_t n = 0, items = 0;
    int lenbytes = 0, skip = 0, pairs = 0;
    if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3) return 0;
    if (t >= 0x80 && t <= 0x8f) {
        items = t & 0x0f;
        pairs = 1;
    } else if (t >= 0x90 && t <= 0x9f) items = t & 0x0f;
    else if (t >= 0xa0 && t <= 0xbf) n = t & 0x1f;
    else switch (t) {
        case 0xc4:
        case 0xd9: lenbytes = 1; break; /* bin8, str8 */
        case 0xc5:
        case 0xda: lenbytes = 2; break; /* bin16, str16 */
        case 0xc6:
        case 0xdb: lenbytes = 4; break; /* bin32, str32 */
        case 0xc7:
            lenbytes = 1;
            skip = 1;
            break; /* ext8 */
        case 0xc8:
            lenbytes = 2;
            skip = 1;
            break;
        case 0xc9:
            lenbytes = 4;
            skip = 1;
            break;
        case 0xca: n = 4; break;
        case 0xcb: n = 8; break;
        case 0xcc:
        case 0xd0: n = 1; break;
        case 0xcd:
        case 0xd1: n = 2; break;
        case 0xce:
        case 0xd2: n = 4; break;
        case 0xcf:
        case 0xd3: n = 8; break;
        case 0xd4: n = 2; break;
        case 0xd5: n = 3; break;
        case 0xd6: n = 5; break;
        case 0xd7: n = 9; break;
        case 0xd8: n = 17; break;
        case 0xdc:
        case 0xdd:
        case 0xde:
        case 0xdf: { /* array16/32, map16/32 */
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
        if (walk(b, len, pos, depth - 1, objects)) return -1;
    return 0;
}

int ma_wire_msgpack_sane(const uint8_t *buf, size_t len, int max_depth) {
    size_t pos = 0;
    uint64_t objects = 0;
    return walk(buf, len, &pos, max_depth, &objects) == 0 && pos == len ? 0 : -1;
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

static const struct {
    const char *name;
    wdtype dt;
    size_t size;
} DTYPES[] = {{"|u1", DT_U8, 1},      {"<u1", DT_U8, 1},  {"uint8", DT_U8, 1},    {"<f4", DT_F32, 4},
              {"float32", DT_F32, 4}, {"<f8", DT_F64, 8}, {"float64", DT_F64, 8}, {"<i8", DT_I64, 8},
              {"int64", DT_I64, 8},   {"<i4", DT_I32, 4}, {"int32", DT_I32, 4}};

static ma_status array_check(warray *a, const char *dtype, size_t dlen, const char *key, ma_error *err) {
    size_t es = 0;
    a->dt = DT_NONE;
    for (size_t i = 0; i < sizeof DTYPES / sizeof DTYPES[0]; i++)
        if (strlen(DTYPES[i].name) == dlen && !memcmp(DTYPES[i].name, dtype, dlen)) {
            a->dt = DTYPES[i].dt;
            es = DTYPES[i].size;
        }
    if (a->dt == DT_NONE)
        return ma_fail(err, MA_ERR_FORMAT, "%s: dtype '%.*s' is not supported (|u1, <f4, <f8, <i4, <i8)", key, (int)(dlen > 16 ? 16 : dlen),
                       dtype);
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
    case DT_F32: {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    case DT_F64: {
        double d;
        memcpy(&d, p + 8 * i, 8);
        return d;
    }
    case DT_I64: {
        int64_t v;
        memcpy(&v, p + 8 * i, 8);
        return (double)v;
    }
    case DT_I32: {
        int32_t v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    default: return 0;
    }
}

static void shape_str(const warray *a, char *out, size_t cap) {
    size_t k = (size_t)snprintf(out, cap, "[");
    for (int d = 0; d < a->ndim && k < cap; d++) k += (size_t)snprintf(out + k, cap - k, d ? ", %lld" : "%lld", (long long)a->shape[d]);
    if (k < cap) snprintf(out + k, cap - k, "]");
}

/* ------------------------------------------------------------------------ request -> observation */

/* What each key means. Keys of openpi (observation/...), of MolmoAct2's servers (image, state,
 * instruction, ...), of LeRobot batches (observation.images.image, observation.state, task) and
 * the aliases AllenAI's clients send; two keys of one role in a request contradict each other
 * and are refused by name; any other key is ignored (the server logs it once per connection). */
typedef enum {
    R_IMAGE,
    R_WRIST,
    R_STATE,
    R_TASK,
    R_NOISE,
    R_SEED,
    R_NORM_TAG,
    R_NUM_STEPS,
    R_N_ACTION_STEPS,
    R_IMAGES,
    R_EXECUTED,
    R_RTC,
    R_SESSION,
    R_NONE
} role;

static const struct {
    const char *key;
    role r;
} KEYS[] = {{"observation/image", R_IMAGE},
            {"image", R_IMAGE},
            {"observation.images.image", R_IMAGE},
            {"observation/wrist_image", R_WRIST},
            {"wrist_image", R_WRIST},
            {"observation.images.wrist_image", R_WRIST},
            {"observation/state", R_STATE},
            {"state", R_STATE},
            {"states", R_STATE},
            {"observation.state", R_STATE},
            {"prompt", R_TASK},
            {"instruction", R_TASK},
            {"task", R_TASK},
            {"question", R_TASK},
            {"noise", R_NOISE},
            {"seed", R_SEED},
            {"norm_tag", R_NORM_TAG},
            {"tag", R_NORM_TAG},
            {"normalization_tag", R_NORM_TAG},
            {"num_steps", R_NUM_STEPS},
            {"n_action_steps", R_N_ACTION_STEPS},
            {"images", R_IMAGES},
            {"executed", R_EXECUTED},
            {"rtc", R_RTC},
            {"session_id", R_SESSION}};

static const char *const ROLE_NAME[] = {"the agent camera",  "the wrist camera",   "the state",      "the task",         "the noise",
                                        "the seed",          "the norm tag",       "the flow steps", "the action steps", "both cameras",
                                        "the rows executed", "real-time chunking", "the session"};

static role role_of(const char *k, size_t n) {
    for (size_t i = 0; i < sizeof KEYS / sizeof KEYS[0]; i++)
        if (strlen(KEYS[i].key) == n && !memcmp(KEYS[i].key, k, n)) return KEYS[i].r;
    return R_NONE;
}

/* every key of a role, for messages: "observation/image, image, observation.images.image" */
static void role_keys(role r, char *out, size_t cap) {
    size_t k = 0;
    out[0] = '\0';
    for (size_t i = 0; i < sizeof KEYS / sizeof KEYS[0] && k < cap; i++)
        if (KEYS[i].r == r) k += (size_t)snprintf(out + k, cap - k, "%s%s", k ? ", " : "", KEYS[i].key);
}

/* a value as the request gives it: an array, encoded image bytes, a string or an integer */
typedef struct {
    int kind; /* 0 none, 1 array, 2 bytes, 3 string, 4 integer */
    warray a;
    const uint8_t *bytes;
    size_t nbytes;
    uint64_t u;
    char key[64];
    uint8_t *owned; /* what a and bytes point into when decoded here (freed after build) */
    int from_list;  /* a list of numbers (float64 here, whatever the client meant) */
    int claimed;    /* a key of this role was given */
} wvalue;

/* a key for role r: refused when another key already gave it */
static ma_status claim(wvalue *v, role r, const char *key, size_t kl, ma_error *err) {
    char k[64];
    snprintf(k, sizeof k, "%.*s", (int)(kl < 48 ? kl : 48), key);
    if (r == R_IMAGES) {
        for (int i = 0; i < 2; i++)
            if (v[i].claimed)
                return ma_fail(err, MA_ERR_ARG, "request: keys '%s' and '%s' both give %s; send one", v[i].key, k, ROLE_NAME[i]);
        for (int i = 0; i < 2; i++) {
            v[i].claimed = 1;
            snprintf(v[i].key, sizeof v[i].key, "%s[%d]", k, i);
        }
        return MA_OK;
    }
    if (v[r].claimed) {
        char prev[64];
        snprintf(prev, sizeof prev, "%s", v[r].key);
        char *br = strchr(prev, '[');
        if (br && (r == R_IMAGE || r == R_WRIST)) *br = '\0'; /* "images" */
        return ma_fail(err, MA_ERR_ARG, "request: keys '%s' and '%s' both give %s; send one", prev, k, ROLE_NAME[r]);
    }
    v[r].claimed = 1;
    snprintf(v[r].key, sizeof v[r].key, "%s", k);
    return MA_OK;
}

/* an ignored key, for the server's log */
static void note_ignored(ma_wire_request *r, const char *key, size_t kl) {
    size_t n = strlen(r->ignored);
    if (n + kl + 3 >= sizeof r->ignored) return;
    snprintf(r->ignored + n, sizeof r->ignored - n, "%s%.*s", n ? ", " : "", (int)kl, key);
    for (char *p = r->ignored + n; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e) *p = '?';
}

/* a frame given as an array: uint8 or float ([0, 1] or [0, 255]) or integer, [H, W, C],
 * [C, H, W] or [H, W] with C in {1, 3, 4}, with or without a batch dimension of 1: converted as
 * the CLI converts an .npz frame (ma_image_from_tensor), so both give the same pixels */
static ma_status array_image(const warray *a, const char *key, ma_image *out, ma_error *err) {
    char sh[64];
    shape_str(a, sh, sizeof sh);
    int nd = a->ndim, off = 0;
    if (nd == 4 && a->shape[0] == 1) nd = 3, off = 1; /* a batch of one */
    if (nd != 2 && nd != 3)
        return ma_fail(err, MA_ERR_SHAPE, "%s: shape %s, expected [H, W, 3] (or [3, H, W], [H, W], a batch of 1)", key, sh);
    for (int d = 0; d < nd; d++)
        if (a->shape[off + d] < 1) return ma_fail(err, MA_ERR_SHAPE, "%s: shape %s is empty", key, sh);
    for (int d = 0; d < nd; d++)
        if (a->shape[off + d] > MA_IMAGE_MAX_SIDE && a->shape[off + d] > 4)
            return ma_fail(err, MA_ERR_SHAPE, "%s: shape %s exceeds %d per side", key, sh, MA_IMAGE_MAX_SIDE);
    ma_tensor t;
    memset(&t, 0, sizeof t);
    t.ndim = nd;
    for (int d = 0; d < nd; d++) t.shape[d] = a->shape[off + d];
    const size_t n = a->nbytes / (a->dt == DT_U8 ? 1 : a->dt == DT_F32 || a->dt == DT_I32 ? 4 : 8);
    void *conv = NULL;
    if (a->dt == DT_U8 || a->dt == DT_F32 || a->dt == DT_F64) {
        t.dtype = a->dt == DT_U8 ? MA_DT_U8 : a->dt == DT_F32 ? MA_DT_F32 : MA_DT_F64;
        t.data = (void *)a->data;
    } else { /* integers: values 0..255 as uint8 */
        uint8_t *u = conv = malloc(n ? n : 1);
        if (!u) return ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", key);
        for (size_t i = 0; i < n; i++) {
            const double v = element(a, i);
            if (v < 0 || v > 255) {
                free(conv);
                return ma_fail(err, MA_ERR_RANGE, "%s: an integer frame's values must be in [0, 255] (%.0f at %zu)", key, v, i);
            }
            u[i] = (uint8_t)v;
        }
        t.dtype = MA_DT_U8;
        t.data = u;
    }
    t.nbytes = a->nbytes;
    const ma_status s = ma_image_from_tensor(&t, key, out, err);
    free(conv);
    return s;
}

static ma_status take_image(const wvalue *v, int slot, int flip, ma_wire_request *r, ma_error *err) {
    molmoact_image *im = &r->obs.images[slot];
    if (v->kind == 2) {
        if (!v->nbytes) return ma_fail(err, MA_ERR_FORMAT, "%s: empty image bytes", v->key);
        r->img[slot] = malloc(v->nbytes);
        if (!r->img[slot]) return ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", v->key);
        memcpy(r->img[slot], v->bytes, v->nbytes);
        *im = (molmoact_image){NULL, 0, 0, 0, r->img[slot], v->nbytes};
        return MA_OK;
    }
    if (v->kind != 1) return ma_fail(err, MA_ERR_FORMAT, "%s: expected an image array (uint8 [H, W, 3]) or PNG/JPEG bytes", v->key);
    const warray *a = &v->a;
    if (a->dt == DT_U8 && a->ndim == 1) { /* the bytes of a PNG/JPEG file as a uint8 array (np.frombuffer) */
        wvalue b = *v;
        b.kind = 2;
        b.bytes = a->data;
        b.nbytes = a->nbytes;
        return take_image(&b, slot, flip, r, err);
    }
    char sh[64];
    shape_str(a, sh, sizeof sh);
    if (a->dt == DT_U8 && a->ndim == 3 && a->shape[2] == 3 && a->shape[0] >= 1 && a->shape[1] >= 1 && a->shape[0] <= MA_IMAGE_MAX_SIDE &&
        a->shape[1] <= MA_IMAGE_MAX_SIDE) { /* the common case: as it is */
        r->img[slot] = malloc(a->nbytes);
        if (!r->img[slot]) return ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", v->key);
        memcpy(r->img[slot], a->data, a->nbytes);
        *im = (molmoact_image){r->img[slot], (int)a->shape[0], (int)a->shape[1], 0, NULL, 0};
        return MA_OK;
    }
    ma_image d;
    const ma_status s = array_image(a, v->key, &d, err);
    if (s) return s;
    r->img[slot] = d.rgb;
    *im = (molmoact_image){d.rgb, d.h, d.w, 0, NULL, 0};
    return MA_OK;
}

static ma_status image_strings(wvalue *v, ma_error *err);

static ma_status build(wvalue *v, int flip, const ma_wire_model *m, ma_wire_request *r, ma_error *err) {
    for (int k = 0; k < R_NONE; k++)
        if (v[k].kind == 5 && k != R_RTC) return ma_fail(err, MA_ERR_FORMAT, "%s: expected a value, not true or false", v[k].key);
    ma_status s;
    molmoact_observation_init(&r->obs);
    for (int i = 0; i < 4; i++)
        if (!v[i].kind) {
            char keys[200];
            role_keys((role)i, keys, sizeof keys);
            return ma_fail(err, MA_ERR_ARG, "missing key for %s: one of %s%s", ROLE_NAME[i], keys,
                           i < 2 ? ", or images (a list of two frames)" : "");
        }
    if ((s = image_strings(v, err))) return s;
    if ((s = take_image(&v[R_IMAGE], 0, flip, r, err)) || (s = take_image(&v[R_WRIST], 1, flip, r, err))) return s;
    /* state: float32 / float64 [n] or [1, n] (or a list of numbers) */
    const wvalue *st = &v[R_STATE];
    const int st2 = st->kind == 1 && st->a.ndim == 2 && st->a.shape[0] == 1;
    if (st->kind != 1 || (st->a.dt != DT_F32 && st->a.dt != DT_F64) || (st->a.ndim != 1 && !st2))
        return ma_fail(err, MA_ERR_FORMAT, "%s: expected a float32 or float64 [%d] array (or a list of numbers)", st->key, m->state_dim);
    const int64_t sn = st->a.shape[st->a.ndim - 1];
    if (sn != m->state_dim || sn > MAX_STATE)
        return ma_fail(err, MA_ERR_SHAPE, "%s: %lld values, the model's state has %d", st->key, (long long)sn, m->state_dim);
    for (int64_t i = 0; i < sn; i++) {
        const double d = element(&st->a, (size_t)i);
        if (isnan(d)) return ma_fail(err, MA_ERR_RANGE, "%s[%lld] is NaN", st->key, (long long)i);
        if (isinf(d)) return ma_fail(err, MA_ERR_RANGE, "%s[%lld] is infinite", st->key, (long long)i);
        if (fabs(d) > FLT_MAX) return ma_fail(err, MA_ERR_RANGE, "%s[%lld] is %g, beyond float32's range", st->key, (long long)i, d);
        r->state[i] = (float)d;
    }
    r->obs.state = r->state;
    r->obs.state_dim = (int)sn;
    if (v[R_TASK].kind != 3) return ma_fail(err, MA_ERR_FORMAT, "%s: expected a string (or a list of one string)", v[R_TASK].key);
    if (v[R_TASK].nbytes > 65536) return ma_fail(err, MA_ERR_NOMEM, "%s: longer than 65536 bytes", v[R_TASK].key);
    if (memchr(v[R_TASK].bytes, 0, v[R_TASK].nbytes)) return ma_fail(err, MA_ERR_FORMAT, "%s: contains a NUL byte", v[R_TASK].key);
    r->task = malloc(v[R_TASK].nbytes + 1);
    if (!r->task) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
    memcpy(r->task, v[R_TASK].bytes, v[R_TASK].nbytes);
    r->task[v[R_TASK].nbytes] = '\0';
    r->obs.task = r->task;
    if (v[R_NOISE].kind) {
        /* noise: [1, horizon, max_action_dim] (or without the leading 1), float32, or a nested list */
        const warray *a = &v[R_NOISE].a;
        const int H = m->horizon, A = m->max_action_dim;
        char sh[64];
        shape_str(a, sh, sizeof sh);
        if (v[R_NOISE].kind != 1) return ma_fail(err, MA_ERR_FORMAT, "noise: expected a float32 array [1, %d, %d]", H, A);
        if (a->dt != DT_F32 && !(a->dt == DT_F64 && v[R_NOISE].from_list))
            return ma_fail(err, MA_ERR_FORMAT, "noise: dtype must be float32 (<f4), expected [1, %d, %d]", H, A);
        const int ok3 = a->ndim == 3 && a->shape[0] == 1 && a->shape[1] == H && a->shape[2] == A;
        const int ok2 = a->ndim == 2 && a->shape[0] == H && a->shape[1] == A;
        if (!ok3 && !ok2) return ma_fail(err, MA_ERR_SHAPE, "noise: shape %s, expected [1, %d, %d] (or [%d, %d])", sh, H, A, H, A);
        const size_t n = (size_t)H * (size_t)A;
        r->noise = malloc(n * sizeof(float));
        if (!r->noise) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
        for (size_t i = 0; i < n; i++) {
            const double d = element(a, i);
            if (!isfinite(d) || fabs(d) > FLT_MAX) return ma_fail(err, MA_ERR_RANGE, "noise[%zu] is not a finite float32", i);
            r->noise[i] = (float)d;
        }
        r->obs.noise = r->noise;
        r->obs.noise_len = n;
    }
    if (v[R_NORM_TAG].kind) {
        const wvalue *t = &v[R_NORM_TAG];
        if (t->kind != 3 || !t->nbytes || t->nbytes > 63)
            return ma_fail(err, MA_ERR_FORMAT, "%s: expected a tag name (1 to 63 characters)", t->key);
        for (size_t i = 0; i < t->nbytes; i++)
            if (t->bytes[i] < 0x21 || t->bytes[i] > 0x7e) return ma_fail(err, MA_ERR_FORMAT, "%s: a tag name is printable ASCII", t->key);
        memcpy(r->norm_tag, t->bytes, t->nbytes);
        r->norm_tag[t->nbytes] = '\0';
        r->obs.norm_tag = r->norm_tag;
    }
    if (v[R_NUM_STEPS].kind) {
        if (v[R_NUM_STEPS].kind != 4 || v[R_NUM_STEPS].u < 1 || v[R_NUM_STEPS].u > 256)
            return ma_fail(err, MA_ERR_RANGE, "%s: expected an integer in [1, 256] (flow-matching steps)", v[R_NUM_STEPS].key);
        r->obs.flow_steps = (int)v[R_NUM_STEPS].u;
    }
    if (v[R_N_ACTION_STEPS].kind) {
        if (v[R_N_ACTION_STEPS].kind != 4 || v[R_N_ACTION_STEPS].u < 1 || v[R_N_ACTION_STEPS].u > (uint64_t)m->n_steps)
            return ma_fail(err, MA_ERR_RANGE, "%s: expected an integer in [1, %d] (the chunk has %d steps)", v[R_N_ACTION_STEPS].key,
                           m->n_steps, m->n_steps);
        r->n_action_steps = (int)v[R_N_ACTION_STEPS].u;
    }
    /* the session's timeline (timeline.c): rows of the previous chunk the robot executed before
     * this observation; whether to guide this chunk toward the rest (real-time chunking) */
    r->executed = -1;
    r->rtc = -1;
    if (v[R_EXECUTED].kind) {
        if (v[R_EXECUTED].kind != 4 || v[R_EXECUTED].u > 4096)
            return ma_fail(err, MA_ERR_RANGE, "executed: expected an integer in [0, 4096] (rows of the previous chunk executed)");
        r->executed = (int)v[R_EXECUTED].u;
    }
    if (v[R_SESSION].kind) { /* AllenAI's serve_policy.py clients send it in the body */
        const wvalue *t = &v[R_SESSION];
        int ok = t->kind == 3 && t->nbytes && t->nbytes < sizeof r->session_id;
        for (size_t i = 0; ok && i < t->nbytes; i++)
            ok = t->bytes[i] > 0x20 && t->bytes[i] < 0x7f && t->bytes[i] != '"' && t->bytes[i] != '\\';
        if (!ok)
            return ma_fail(err, MA_ERR_FORMAT, "session_id: 1 to %zu printable ASCII characters (no spaces, quotes or backslashes)",
                           sizeof r->session_id - 1);
        memcpy(r->session_id, t->bytes, t->nbytes);
        r->session_id[t->nbytes] = '\0';
    }
    if (v[R_RTC].kind) {
        if ((v[R_RTC].kind != 4 && v[R_RTC].kind != 5) || v[R_RTC].u > 1) return ma_fail(err, MA_ERR_FORMAT, "rtc: expected true or false");
        r->rtc = (int)v[R_RTC].u;
    }
    if (v[R_SEED].kind) {
        if (v[R_SEED].kind != 4) return ma_fail(err, MA_ERR_FORMAT, "seed: expected a non-negative integer");
        r->obs.have_seed = 1;
        r->obs.seed = v[R_SEED].u;
    }
    r->flip180 = flip;
    r->obs.rotate180 = flip; /* the API rotates the frames it decodes */
    return MA_OK;
}

/* an image given as a string: base64 PNG/JPEG bytes, or a data URL (data:image/png;base64,...) */
static ma_status b64_into(wvalue *v, const char *txt, size_t len, const char *what, ma_error *err);

static ma_status image_strings(wvalue *v, ma_error *err) {
    for (int i = 0; i < 2; i++) {
        if (v[i].kind != 3) continue;
        const char *t = (const char *)v[i].bytes;
        size_t n = v[i].nbytes;
        if (n >= 5 && !memcmp(t, "data:", 5)) {
            const char *comma = memchr(t, ',', n);
            if (!comma || comma - t < 12 || memcmp(comma - 7, ";base64", 7) || strncmp(t + 5, "image/", 6))
                return ma_fail(err, MA_ERR_FORMAT, "%s: a data URL must be data:image/...;base64,<bytes>", v[i].key);
            n -= (size_t)(comma + 1 - t);
            t = comma + 1;
        }
        ma_status s = b64_into(&v[i], t, n, "the image string (base64 PNG/JPEG bytes or a data:image URL)", err);
        if (s) return s;
        if (!v[i].nbytes) return ma_fail(err, MA_ERR_FORMAT, "%s: an empty image string", v[i].key);
        v[i].kind = 2;
    }
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

/* the objects under o, itself included (depth: the sanity walk's bound) */
static uint64_t obj_count(const msgpack_object *o, int depth) {
    uint64_t n = 1;
    if (depth <= 0) return n;
    if (o->type == MSGPACK_OBJECT_ARRAY)
        for (uint32_t i = 0; i < o->via.array.size; i++) n += obj_count(&o->via.array.ptr[i], depth - 1);
    else if (o->type == MSGPACK_OBJECT_MAP)
        for (uint32_t i = 0; i < o->via.map.size; i++)
            n += obj_count(&o->via.map.ptr[i].key, depth - 1) + obj_count(&o->via.map.ptr[i].val, depth - 1);
    return n;
}

static ma_status mp_value(const msgpack_object *o, wvalue *v, ma_error *err) {
    switch (o->type) {
    case MSGPACK_OBJECT_STR:
        v->kind = 3;
        v->bytes = (const uint8_t *)o->via.str.ptr;
        v->nbytes = o->via.str.size;
        return MA_OK;
    case MSGPACK_OBJECT_BIN:
        v->kind = 2;
        v->bytes = (const uint8_t *)o->via.bin.ptr;
        v->nbytes = o->via.bin.size;
        return MA_OK;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        v->kind = 4;
        v->u = o->via.u64;
        return MA_OK;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return ma_fail(err, MA_ERR_RANGE, "%s: negative", v->key);
    case MSGPACK_OBJECT_BOOLEAN: /* only "rtc" takes one (build() refuses it elsewhere) */
        v->kind = 5;
        v->u = o->via.boolean;
        return MA_OK;
    case MSGPACK_OBJECT_ARRAY: /* nested lists of numbers (from clients without numpy), or a batch of one string */
        if (o->via.array.size == 1 && o->via.array.ptr[0].type == MSGPACK_OBJECT_STR) return mp_value(&o->via.array.ptr[0], v, err);
        {
            int64_t shape[4];
            int ndim = 0;
            const msgpack_object *x = o;
            while (x->type == MSGPACK_OBJECT_ARRAY) {
                if (ndim == 4) return ma_fail(err, MA_ERR_SHAPE, "%s: a list nested deeper than 4 levels", v->key);
                shape[ndim++] = x->via.array.size;
                if (!x->via.array.size) break;
                x = &x->via.array.ptr[0];
            }
            /* The element count is the product of the first list's size at each level. Each size is
         * bounded by the bytes that follow it, but their product is not: four sizes can multiply
         * past 2^64 to a small number (27905 x 34724 x 49477 x 384773 = 2^64 + 4). Multiply with
         * a check against the objects this value holds (each leaf is one of them; the value
         * alone, not the list of frames it may be one of) before any
         * allocation; the walk below then writes exactly n leaves (every list's size is checked
         * against the shape) and never past n. */
            const uint64_t limit = obj_count(o, 16);
            uint64_t n = 1;
            for (int d = 0; d < ndim; d++) {
                if (!shape[d]) {
                    n = 0;
                    break;
                }
                if (n > limit / (uint64_t)shape[d])
                    return ma_fail(err, MA_ERR_SHAPE,
                                   "%s: nested lists that are not rectangular (the first lists' sizes multiply past the elements given)",
                                   v->key);
                n *= (uint64_t)shape[d];
            }
            if (!n) return ma_fail(err, MA_ERR_SHAPE, "%s: an empty list", v->key);
            double *vals = malloc(n * sizeof(double));
            if (!vals) return ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", v->key);
            v->owned = (uint8_t *)vals;
            size_t k = 0;
            /* walk every leaf in order, checking that the lists are rectangular */
            const msgpack_object *stack[4] = {o};
            uint32_t idx[4] = {0};
            int d = 0;
            for (;;) {
                const msgpack_object *cur = stack[d];
                if (cur->type != MSGPACK_OBJECT_ARRAY || cur->via.array.size != (uint32_t)shape[d])
                    return ma_fail(err, MA_ERR_SHAPE, "%s: the nested lists are not rectangular", v->key);
                if (idx[d] == cur->via.array.size) {
                    if (d == 0) break;
                    idx[d] = 0;
                    d--;
                    idx[d]++;
                    continue;
                }
                const msgpack_object *e = &cur->via.array.ptr[idx[d]];
                if (d + 1 < ndim) {
                    stack[++d] = e;
                    continue;
                }
                double dv;
                if (e->type == MSGPACK_OBJECT_FLOAT32 || e->type == MSGPACK_OBJECT_FLOAT64) dv = e->via.f64;
                else if (e->type == MSGPACK_OBJECT_POSITIVE_INTEGER) dv = (double)e->via.u64;
                else if (e->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) dv = (double)e->via.i64;
                else return ma_fail(err, MA_ERR_FORMAT, "%s: element %zu is not a number", v->key, k);
                if (k >= n) return ma_fail(err, MA_ERR_SHAPE, "%s: the nested lists are not rectangular", v->key);
                vals[k++] = dv;
                idx[d]++;
            }
            v->kind = 1;
            v->from_list = 1;
            v->a.dt = DT_F64;
            v->a.ndim = ndim;
            for (int i = 0; i < ndim; i++) v->a.shape[i] = shape[i];
            v->a.data = (const uint8_t *)vals;
            v->a.nbytes = n * sizeof(double);
            return MA_OK;
        }
    case MSGPACK_OBJECT_MAP: {
        const msgpack_object *nd = map_get(o, "__ndarray__"), *gen = map_get(o, "__npgeneric__");
        const msgpack_object *data = map_get(o, "data"), *dtype = map_get(o, "dtype"), *shape = map_get(o, "shape");
        if (gen && data && data->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
            v->kind = 4;
            v->u = data->via.u64;
            return MA_OK;
        }
        if (gen) return ma_fail(err, MA_ERR_FORMAT, "%s: a numpy scalar here is not supported", v->key);
        if (!nd || !data || !dtype || !shape || data->type != MSGPACK_OBJECT_BIN ||
            (dtype->type != MSGPACK_OBJECT_STR && dtype->type != MSGPACK_OBJECT_BIN) || shape->type != MSGPACK_OBJECT_ARRAY)
            return ma_fail(err, MA_ERR_FORMAT, "%s: not a msgpack-numpy array (__ndarray__, data, dtype, shape)", v->key);
        if (shape->via.array.size > 4) return ma_fail(err, MA_ERR_SHAPE, "%s: %u dimensions", v->key, shape->via.array.size);
        v->a.ndim = (int)shape->via.array.size;
        for (int d = 0; d < v->a.ndim; d++) {
            const msgpack_object *e = &shape->via.array.ptr[d];
            if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER || e->via.u64 > (1u << 30))
                return ma_fail(err, MA_ERR_SHAPE, "%s: bad shape", v->key);
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

/* the length and first byte of a msgpack str or bin at b (already walked: it fits); -1 otherwise */
static int str_at(const uint8_t *b, const char **p, size_t *n) {
    const uint8_t t = b[0];
    int lb = 0;
    if (t >= 0xa0 && t <= 0xbf) {
        *n = t & 0x1f;
        *p = (const char *)b + 1;
        return 0;
    }
    if (t == 0xd9 || t == 0xc4) lb = 1;
    else if (t == 0xda || t == 0xc5) lb = 2;
    else if (t == 0xdb || t == 0xc6) lb = 4;
    else return -1;
    *n = (size_t)be(b + 1, lb);
    *p = (const char *)b + 1 + lb;
    return 0;
}

/* 16 MiB beyond 4x (JSON has 4 MiB): a frame sent as nested lists of integers costs 128 bytes a
 * pixel here (4 objects) against 5-6 bytes of message; this lets such frames through to about
 * 400 x 400. One message is decoded at a time (the inference thread), so the constant is paid once. */
size_t ma_wire_msgpack_budget(size_t len) { return len > (SIZE_MAX - (16u << 20)) / 4 ? SIZE_MAX : 4 * len + (16u << 20); }

/* The top-level map is walked here, not unpacked whole: a value under a key that means nothing
 * costs nothing, and each value that is used is unpacked by msgpack-c on its own once its cost
 * is known. Its cost: one msgpack_object per object, and a double per element of a nested list
 * (at most one per object); all of them together must fit ma_wire_msgpack_budget (4x the
 * message + 16 MiB, the JSON path's form), counted before anything is allocated. */
ma_status ma_wire_decode_msgpack(const uint8_t *buf, size_t len, int flip180, const ma_wire_model *m, ma_wire_request *out, ma_error *err) {
    memset(out, 0, sizeof *out);
    if (ma_wire_msgpack_sane(buf, len, 16))
        return ma_fail(err, MA_ERR_FORMAT, "request: not a msgpack message (malformed, truncated or trailing bytes)");
    const uint8_t t = buf[0];
    uint64_t pairs;
    size_t pos;
    if (t >= 0x80 && t <= 0x8f) pairs = t & 0x0f, pos = 1;
    else if (t == 0xde) pairs = be(buf + 1, 2), pos = 3;
    else if (t == 0xdf) pairs = be(buf + 1, 4), pos = 5;
    else return ma_fail(err, MA_ERR_FORMAT, "request: expected a msgpack map of observation keys");
    const size_t budget = ma_wire_msgpack_budget(len);
    size_t cost = 0;
    msgpack_unpacked u[R_NONE];
    int n_u = 0;
    wvalue v[R_NONE];
    memset(v, 0, sizeof v);
    ma_status s = MA_OK;
    for (uint64_t i = 0; !s && i < pairs; i++) {
        const size_t kpos = pos;
        uint64_t objects = 0;
        if (walk(buf, len, &pos, 15, &objects)) {
            s = ma_fail(err, MA_ERR_FORMAT, "request: not a msgpack message");
            break;
        }
        const char *ks;
        size_t kl;
        if (str_at(buf + kpos, &ks, &kl)) {
            s = ma_fail(err, MA_ERR_FORMAT, "request: a key is not a string");
            break;
        }
        const size_t vpos = pos;
        objects = 0;
        if (walk(buf, len, &pos, 15, &objects)) {
            s = ma_fail(err, MA_ERR_FORMAT, "request: not a msgpack message");
            break;
        }
        const role r = role_of(ks, kl);
        if (r == R_NONE) {
            note_ignored(out, ks, kl);
            continue;
        }
        if ((s = claim(v, r, ks, kl, err))) break;
        const uint64_t need = objects * (sizeof(msgpack_object) + sizeof(double));
        if (need > budget - cost) {
            char k[64];
            snprintf(k, sizeof k, "%.*s", (int)(kl < 48 ? kl : 48), ks);
            s = ma_fail(err, MA_ERR_NOMEM,
                        "%s: decoding it would take %llu bytes, beyond what a message of %zu bytes may cost "
                        "(4x its size + 16 MiB): send arrays as msgpack-numpy (bin data) or frames as PNG/JPEG bytes",
                        k, (unsigned long long)(need + cost), len);
            break;
        }
        cost += (size_t)need;
        msgpack_unpacked *up = &u[n_u++];
        msgpack_unpacked_init(up);
        size_t off = 0;
        if (msgpack_unpack_next(up, (const char *)buf + vpos, pos - vpos, &off) != MSGPACK_UNPACK_SUCCESS || off != pos - vpos) {
            s = ma_fail(err, MA_ERR_FORMAT, "request: not a msgpack message");
            break;
        }
        const msgpack_object *val = &up->data;
        if (r == R_IMAGES) { /* a list of two frames (arrays or bytes) */
            if (val->type != MSGPACK_OBJECT_ARRAY || val->via.array.size != 2) {
                s = ma_fail(err, MA_ERR_FORMAT, "%.*s: expected a list of two frames (the agent camera, then the wrist camera)",
                            (int)(kl < 48 ? kl : 48), ks);
                break;
            }
            for (int c = 0; c < 2 && !s; c++) s = mp_value(&val->via.array.ptr[c], &v[c], err);
        } else s = mp_value(val, &v[r], err);
    }
    if (!s) s = build(v, flip180, m, out, err);
    for (int i = 0; i < R_NONE; i++) free(v[i].owned);
    for (int i = 0; i < n_u; i++) msgpack_unpacked_destroy(&u[i]);
    if (s) ma_wire_request_free(out);
    return s;
}

/* ------------------------------------------------------------------------------ json_numpy */

/* base64 into v->owned; the message says where it is invalid */
static ma_status b64_into(wvalue *v, const char *txt, size_t len, const char *what, ma_error *err) {
    free(v->owned);
    v->owned = malloc(ma_b64_decoded_max(len) + 1);
    if (!v->owned) return ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", v->key);
    size_t bad = 0;
    const long n = ma_b64_decode(txt, len, v->owned, &bad);
    if (n < 0) {
        if (bad >= len)
            return ma_fail(err, MA_ERR_FORMAT, "%s: %s is not base64 (its length, %zu, is not that of whole groups)", v->key, what, len);
        const unsigned char c = (unsigned char)txt[bad];
        return ma_fail(err, MA_ERR_FORMAT, "%s: %s is not base64 (character %zu is %s%c%s)", v->key, what, bad,
                       c >= 0x21 && c < 0x7f ? "'" : "byte 0x", c >= 0x21 && c < 0x7f ? c : '?', c >= 0x21 && c < 0x7f ? "'" : "");
    }
    v->bytes = v->owned;
    v->nbytes = (size_t)n;
    return MA_OK;
}

static const ma_jv *member(const ma_jv *o, const char *key) {
    for (const ma_jv *e = o->first; e; e = e->next)
        if (e->key_len == strlen(key) && !memcmp(e->key, key, e->key_len)) return e;
    return NULL;
}

static ma_status json_value(const ma_jv *j, wvalue *v, ma_error *err) {
    switch (j->kind) {
    case MA_JV_STR:
        v->kind = 3;
        v->bytes = (const uint8_t *)j->str;
        v->nbytes = j->len;
        return MA_OK;
    case MA_JV_NUM:
        if (j->num < 0 || j->num != floor(j->num) || j->num >= 1.8446744073709552e19)
            return ma_fail(err, MA_ERR_RANGE, "%s: expected a non-negative integer", v->key);
        /* past 2^53 a JSON number (a double here, as in most clients) no longer holds every
         * integer: 2^53 + 1 would arrive as 2^53. Refused rather than rounded (F18) */
        if (j->num >= 9007199254740992.0)
            return ma_fail(err, MA_ERR_RANGE,
                           "%s: %.17g is 2^53 or above, where JSON numbers are not exact; send a smaller integer "
                           "(or msgpack, which carries 64-bit integers)",
                           v->key, j->num);
        v->kind = 4;
        v->u = (uint64_t)j->num;
        return MA_OK;
    case MA_JV_BOOL:
        v->kind = 5;
        v->u = j->num != 0;
        return MA_OK;
    case MA_JV_NUMARR:
        if (!j->count) return ma_fail(err, MA_ERR_SHAPE, "%s: an empty list", v->key);
        v->kind = 1;
        v->from_list = 1;
        v->a.dt = DT_F64;
        v->a.ndim = j->ndim;
        for (int d = 0; d < j->ndim; d++) v->a.shape[d] = j->shape[d];
        v->a.data = (const uint8_t *)j->nums;
        v->a.nbytes = j->count * sizeof(double);
        return MA_OK;
    case MA_JV_ARR:
        if (j->len == 1 && j->first->kind == MA_JV_STR) return json_value(j->first, v, err); /* a batch of one string */
        return ma_fail(err, MA_ERR_SHAPE, "%s: nested lists that are not rectangular, not all numbers, or deeper than 4", v->key);
    case MA_JV_OBJ: {
        const ma_jv *b64 = member(j, "__numpy__"), *dt = member(j, "dtype"), *sh = member(j, "shape");
        if (!b64 || b64->kind != MA_JV_STR || !dt || dt->kind != MA_JV_STR || !sh || (sh->kind != MA_JV_NUMARR && sh->kind != MA_JV_ARR))
            return ma_fail(err, MA_ERR_FORMAT, "%s: not a json_numpy array (__numpy__, dtype, shape)", v->key);
        if (sh->kind == MA_JV_ARR || sh->ndim != 1) return ma_fail(err, MA_ERR_SHAPE, "%s: shape must be a list of integers", v->key);
        if (sh->count > 4) return ma_fail(err, MA_ERR_SHAPE, "%s: %zu dimensions", v->key, sh->count);
        v->a.ndim = (int)sh->count;
        for (size_t d = 0; d < sh->count; d++) {
            const double e = sh->nums[d];
            if (e < 0 || e > (1 << 30) || e != floor(e)) return ma_fail(err, MA_ERR_SHAPE, "%s: bad shape", v->key);
            v->a.shape[d] = (int64_t)e;
        }
        ma_status s = b64_into(v, b64->str, b64->len, "__numpy__", err);
        if (s) return s;
        v->a.data = v->owned;
        v->a.nbytes = v->nbytes;
        v->kind = 1;
        return array_check(&v->a, dt->str, dt->len, v->key, err);
    }
    default: return ma_fail(err, MA_ERR_FORMAT, "%s: expected %s", v->key, "an array, a string or a number (not true, false or null)");
    }
}

/* images: a list of two frames (each any image form), or one nested list of two frames */
static ma_status json_images(const ma_jv *j, wvalue *v, ma_error *err) {
    if (j->kind == MA_JV_ARR && j->len == 2) {
        ma_status s = json_value(j->first, &v[0], err);
        return s ? s : json_value(j->first->next, &v[1], err);
    }
    if (j->kind == MA_JV_NUMARR && j->shape[0] == 2 && j->ndim >= 3) {
        const size_t half = j->count / 2;
        for (int c = 0; c < 2; c++) {
            v[c].kind = 1;
            v[c].from_list = 1;
            v[c].a.dt = DT_F64;
            v[c].a.ndim = j->ndim - 1;
            for (int d = 1; d < j->ndim; d++) v[c].a.shape[d - 1] = j->shape[d];
            v[c].a.data = (const uint8_t *)(j->nums + (size_t)c * half);
            v[c].a.nbytes = half * sizeof(double);
        }
        return MA_OK;
    }
    return ma_fail(err, MA_ERR_FORMAT, "%s: expected a list of two frames (the agent camera, then the wrist camera)", j->key);
}

ma_status ma_wire_decode_json(const char *buf, size_t len, int flip180, const ma_wire_model *m, ma_wire_request *out, ma_error *err) {
    memset(out, 0, sizeof *out);
    ma_json *doc = NULL;
    /* what parsing may cost: numbers as doubles (8 bytes for at least 2 of text), strings once */
    ma_status s = ma_json_parse(buf, len, 4 * len + (4u << 20), &doc, err);
    if (s) return s;
    const ma_jv *root = ma_json_root(doc);
    /* OpenVLA's double encoding, also taken by MolmoAct2's serve_policy.py: {"encoded": "<the
     * request as a json_numpy string>"} */
    if (root->kind == MA_JV_OBJ && root->len == 1 && root->first->key_len == 7 && !memcmp(root->first->key, "encoded", 7)) {
        const ma_jv *enc = root->first;
        if (enc->kind != MA_JV_STR) s = ma_fail(err, MA_ERR_FORMAT, "encoded: expected the request as a JSON string");
        else {
            ma_json *inner = NULL;
            s = ma_json_parse(enc->str, enc->len, 4 * enc->len + (4u << 20), &inner, err);
            if (!s) {
                ma_json_free(doc);
                doc = inner;
                root = ma_json_root(doc);
            } else ma_error_wrap(err, s, "encoded");
        }
    }
    if (!s && root->kind != MA_JV_OBJ) s = ma_fail(err, MA_ERR_FORMAT, "request: expected a JSON object");
    wvalue v[R_NONE];
    memset(v, 0, sizeof v);
    for (const ma_jv *e = s ? NULL : root->first; e; e = e->next) {
        if (memchr(e->key, 0, e->key_len)) {
            s = ma_fail(err, MA_ERR_ARG, "request: a key contains a NUL character");
            break;
        }
        const role r = role_of(e->key, e->key_len);
        if (r == R_NONE) {
            note_ignored(out, e->key, e->key_len);
            continue;
        }
        if ((s = claim(v, r, e->key, e->key_len, err))) break;
        if (r == R_IMAGES) s = json_images(e, v, err);
        else s = json_value(e, &v[r], err);
        if (s) break;
    }
    if (!s) s = build(v, flip180, m, out, err);
    for (int i = 0; i < R_NONE; i++) free(v[i].owned);
    ma_json_free(doc);
    if (s) ma_wire_request_free(out);
    return s;
}

/* ------------------------------------------------------------------------------ replies */

static int buf_write(void *data, const char *p, size_t n) {
    ma_wire_buf *b = data;
    if (b->failed || (b->max && n > b->max - b->len) || ma_grow_array(&b->data, &b->cap, b->len, n, 1)) {
        b->failed = 1; /* and every later write with it: the message is lost whole */
        return -1;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

static void pack_str(msgpack_packer *pk, const char *s) { msgpack_pack_str_with_body(pk, s, strlen(s)); }
static void pack_bin_key(msgpack_packer *pk, const char *s) { msgpack_pack_bin_with_body(pk, s, strlen(s)); }

/* a fresh buffer, keeping the caller's bound */
static void buf_start(ma_wire_buf *out) {
    const size_t max = out->max;
    memset(out, 0, sizeof *out);
    out->max = max;
}

/* the end of an encoding: the message whole, or nothing */
static ma_status buf_finish(ma_wire_buf *out, const char *what, ma_error *err) {
    if (!out->failed && out->data) return MA_OK;
    free(out->data);
    buf_start(out);
    return ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", what);
}

ma_status ma_wire_encode_reply(const molmoact_result *res, double server_infer_ms, double prev_total_ms, ma_wire_buf *out, ma_error *err) {
    buf_start(out);
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
    pack_str(&pk, "infer_ms");
    msgpack_pack_double(&pk, t->total);
    pack_str(&pk, "preprocess_ms");
    msgpack_pack_double(&pk, t->preprocess);
    pack_str(&pk, "vision_ms");
    msgpack_pack_double(&pk, t->vision);
    pack_str(&pk, "llm_ms");
    msgpack_pack_double(&pk, t->llm_split[0] + t->llm_split[1] + t->llm_split[2] + t->llm_split[3]);
    pack_str(&pk, "action_context_ms");
    msgpack_pack_double(&pk, t->action_context);
    pack_str(&pk, "action_step_ms");
    msgpack_pack_double(&pk, t->action_step);
    pack_str(&pk, "transfer_ms");
    msgpack_pack_double(&pk, t->transfer);
    pack_str(&pk, "host_ms");
    msgpack_pack_double(&pk, t->host);
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
    return buf_finish(out, "reply", err);
}

ma_status ma_wire_encode_metadata(const molmoact_info *info, const char *model_name, ma_wire_buf *out, ma_error *err) {
    buf_start(out);
    msgpack_packer pk;
    msgpack_packer_init(&pk, out, buf_write);
    msgpack_pack_map(&pk, 9);
    pack_str(&pk, "model");
    pack_str(&pk, model_name);
    pack_str(&pk, "variant");
    pack_str(&pk, info->variant);
    pack_str(&pk, "action_horizon");
    msgpack_pack_int(&pk, info->n_steps);
    pack_str(&pk, "action_dim");
    msgpack_pack_int(&pk, info->action_dim);
    pack_str(&pk, "norm_tag");
    pack_str(&pk, info->norm_tag);
    pack_str(&pk, "precision");
    msgpack_pack_map(&pk, 3);
    pack_str(&pk, "vision");
    pack_str(&pk, info->precision[0]);
    pack_str(&pk, "llm");
    pack_str(&pk, info->precision[1]);
    pack_str(&pk, "action");
    pack_str(&pk, info->precision[2]);
    pack_str(&pk, "prompt_seq");
    msgpack_pack_int(&pk, info->prompt_seq);
    pack_str(&pk, "state_dim");
    msgpack_pack_int(&pk, info->state_dim);
    pack_str(&pk, "molmoact_version");
    pack_str(&pk, molmoact_version());
    return buf_finish(out, "metadata", err);
}
