/* SPDX-License-Identifier: Apache-2.0 */
/* LeRobot's async-inference payloads read without executing anything (server/pickle.h).
 *
 * Facts relied on (huggingface/lerobot at 7427f31801f944f5ec9ce53cda02862ce7d1638b unless said):
 * - src/lerobot/async_inference/helpers.py: TimedData(timestamp, timestep), TimedAction(+action),
 *   TimedObservation(+observation, must_go), RemotePolicyConfig(policy_type, pretrained_name_or_path,
 *   lerobot_features, actions_per_chunk, device, rename_map) are plain @dataclass classes, so
 *   Python's pickler writes them as the class, an empty argument tuple, NEWOBJ, then BUILD with the
 *   instance's __dict__.
 * - src/lerobot/transport/utils.py, policy_server.py, robot_client.py: pickle.dumps with the default
 *   protocol (4 on Python 3.8-3.13, 5 on 3.14), so arrays come as NumPy's _reconstruct + BUILD
 *   (protocol <= 4) or numpy.core.numeric._frombuffer (protocol 5); NumPy 2 names numpy._core.
 * - lerobot PR #3048 at edbf3849f2db7d8c159db80a7f393d748a4f75a0,
 *   src/lerobot/async_inference/safe_serialization.py: payload = uint32 big-endian JSON length, the
 *   JSON, then safetensors bytes (none when there are no tensors); "type" is RemotePolicyConfig,
 *   TimedObservation (tensors named by observation key, other values in "scalar_data") or
 *   TimedActions (tensors action_0.., "actions": [{timestamp, timestep}]).
 * The opcode semantics are those of CPython's Lib/pickle.py (protocols 2..5). */
#include "server/pickle.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "server/pickle.c assumes a little-endian host (arrays are handed out little endian)"
#endif

/* ------------------------------------------------------------------------------------ the doc */

typedef struct blk {
    struct blk *next;
    union {
        max_align_t a;
        double d;
        long double ld;
    } data[];
} blk;

struct ma_pk_doc {
    ma_pk_limits lim;
    size_t used;
    blk *blocks;
    ma_pk *root;
};

/* internal values: only the opcode that expects them may consume them */
enum { IK_NONE, IK_GLOBAL, IK_DTYPE, IK_PENDING };

typedef struct node {
    ma_pk pk; /* first: a ma_pk * of this doc is a node * */
    int ik;
    int gid;          /* IK_GLOBAL */
    int has_internal; /* a tuple holding an internal value (directly or in a tuple) */
    int sealed;       /* inserted into a container / object: no more mutation */
    int built;        /* objects, dtypes: BUILD done */
    int hashable;
    int depth;
    uint64_t weight; /* node count with shared subtrees counted each time */
    uint64_t hash;
    size_t cap;     /* items (and keys) capacity */
    uint32_t *hidx; /* dicts: open addressing over item positions + 1 */
    size_t hcap;
    ma_pk_dtype dt; /* IK_DTYPE */
    char order;     /* IK_DTYPE: '<' '>' '|' '=' */
} node;

static node *N(const ma_pk *p) { return (node *)p; }

/* an internal value's pk.kind: none of ma_pk_kind, so no check on pk.kind mistakes it for one */
#define K_INTERNAL ((ma_pk_kind)99)


static void *doc_alloc(ma_pk_doc *d, size_t n, int zero) {
    size_t total;
    if (!ma_add_size(n, sizeof(blk), &total)) return NULL;
    if (total > d->lim.budget || d->used > d->lim.budget - total) return NULL;
    blk *b = zero ? calloc(1, total) : malloc(total);
    if (!b) return NULL;
    b->next = d->blocks;
    d->blocks = b;
    d->used += total;
    return b->data;
}

void ma_pk_free(ma_pk_doc *d) {
    if (!d) return;
    for (blk *b = d->blocks, *nx; b; b = nx) {
        nx = b->next;
        free(b);
    }
    free(d);
}

const ma_pk *ma_pk_root(const ma_pk_doc *d) { return d ? d->root : NULL; }
size_t ma_pk_used(const ma_pk_doc *d) { return d ? d->used : 0; }

size_t ma_pk_dtype_size(ma_pk_dtype t) {
    switch (t) {
    case MA_PK_U8:
    case MA_PK_I8:
    case MA_PK_BOOL8: return 1;
    case MA_PK_U16:
    case MA_PK_I16:
    case MA_PK_F16: return 2;
    case MA_PK_I32:
    case MA_PK_F32: return 4;
    case MA_PK_I64:
    case MA_PK_F64: return 8;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------ the reader's state */

typedef struct {
    ma_pk_doc *d;
    const uint8_t *buf;
    size_t len, pos, op_off;
    int op;              /* the opcode being run, -1 outside the pickle machine */
    const char *context; /* "pickle" or "PR #3048 payload" */
    node **stack;
    size_t sp, scap;
    size_t *marks;
    size_t nmarks, mcap;
    node **memo;
    size_t nmemo, memocap, memoset;
    uint64_t weight_cap;
    ma_error *err;
    ma_status code;
    /* PR #3048: the JSON's number tokens in document order */
    struct numtok {
        int is_int;
        int64_t i;
    } * nums;
    size_t nnums, inum;
} rd;

static const char *opname(int op) {
    switch (op) {
    case 0x80: return "PROTO";
    case 0x95: return "FRAME";
    case 0x8c: return "SHORT_BINUNICODE";
    case 'X': return "BINUNICODE";
    case 0x8d: return "BINUNICODE8";
    case 0x94: return "MEMOIZE";
    case 'q': return "BINPUT";
    case 'r': return "LONG_BINPUT";
    case 'h': return "BINGET";
    case 'j': return "LONG_BINGET";
    case 0x93: return "STACK_GLOBAL";
    case 'c': return "GLOBAL";
    case ')': return "EMPTY_TUPLE";
    case 't': return "TUPLE";
    case 0x85: return "TUPLE1";
    case 0x86: return "TUPLE2";
    case 0x87: return "TUPLE3";
    case 0x81: return "NEWOBJ";
    case '}': return "EMPTY_DICT";
    case ']': return "EMPTY_LIST";
    case '(': return "MARK";
    case 's': return "SETITEM";
    case 'u': return "SETITEMS";
    case 'a': return "APPEND";
    case 'e': return "APPENDS";
    case 'b': return "BUILD";
    case 'G': return "BINFLOAT";
    case 'J': return "BININT";
    case 'K': return "BININT1";
    case 'M': return "BININT2";
    case 0x8a: return "LONG1";
    case 0x88: return "NEWTRUE";
    case 0x89: return "NEWFALSE";
    case 'N': return "NONE";
    case 'R': return "REDUCE";
    case 'C': return "SHORT_BINBYTES";
    case 'B': return "BINBYTES";
    case 0x8e: return "BINBYTES8";
    case 0x96: return "BYTEARRAY8";
    case '.': return "STOP";
    /* refused, named for the message */
    case 'I': return "INT";
    case 'L': return "LONG";
    case 'S': return "STRING";
    case 'V': return "UNICODE";
    case 'F': return "FLOAT";
    case 'i': return "INST";
    case 'o': return "OBJ";
    case 'p': return "PUT";
    case 'g': return "GET";
    case 'P': return "PERSID";
    case 'Q': return "BINPERSID";
    case 'l': return "LIST";
    case 'd': return "DICT";
    case '0': return "POP";
    case '1': return "POP_MARK";
    case '2': return "DUP";
    case 'T': return "BINSTRING";
    case 'U': return "SHORT_BINSTRING";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    case 0x8b: return "LONG4";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case 0x92: return "NEWOBJ_EX";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    }
    return "unknown";
}

static ma_status rfail(rd *r, ma_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static ma_status rfail(rd *r, ma_status code, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->code = code;
    if (r->op >= 0)
        return ma_fail(r->err, code, "%s: opcode 0x%02x (%s) at offset %zu: %s", r->context, r->op, opname(r->op), r->op_off, msg);
    return ma_fail(r->err, code, "%s: %s", r->context, msg);
}

static void *ralloc(rd *r, size_t n, int zero, const char *what) {
    void *p = doc_alloc(r->d, n, zero);
    if (!p)
        rfail(r, MA_ERR_NOMEM, "%s (%zu bytes) would pass the decode's budget of %zu bytes (%zu used)", what, n, r->d->lim.budget,
              r->d->used);
    return p;
}

/* grow an array of `size`-byte elements to hold at least `need`; the old block stays counted */
static int grow(rd *r, void **arr, size_t *cap, size_t need, size_t size, const char *what) {
    if (need <= *cap) return 1;
    size_t nc = *cap ? *cap : 8, bytes;
    while (nc < need) {
        if (nc > SIZE_MAX / 2) return rfail(r, MA_ERR_NOMEM, "%s: too many entries", what), 0;
        nc *= 2;
    }
    if (!ma_mul_size(nc, size, &bytes)) return rfail(r, MA_ERR_NOMEM, "%s: too many entries", what), 0;
    void *p = ralloc(r, bytes, 0, what);
    if (!p) return 0;
    if (*cap) memcpy(p, *arr, *cap * size);
    *arr = p;
    *cap = nc;
    return 1;
}

/* ------------------------------------------------------------------------------------ nodes */

static uint64_t fnv(const void *p, size_t n, uint64_t h) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static uint64_t hash_int(int64_t v) { return fnv(&v, sizeof v, 14695981039346656037ull ^ 0x11); }

static uint64_t hash_float(double f) {
    /* 1 == 1.0 == True as dict keys (Python): an integral float hashes as the int */
    if (f == floor(f) && f >= -9223372036854775808.0 && f < 9223372036854775808.0) return hash_int((int64_t)f);
    if (f == 0) f = 0; /* -0.0 == 0.0 */
    return fnv(&f, sizeof f, 14695981039346656037ull ^ 0x22);
}

static node *new_node(rd *r, ma_pk_kind kind) {
    node *n = ralloc(r, sizeof(node), 1, "a value");
    if (!n) return NULL;
    n->pk.kind = kind;
    n->depth = 0;
    n->weight = 1;
    n->hashable = 1;
    switch (kind) {
    case MA_PK_NONE: n->hash = 0x9e3779b97f4a7c15ull; break;
    case MA_PK_LIST:
    case MA_PK_DICT:
    case MA_PK_OBJECT:
    case MA_PK_ARRAY:
        n->hashable = 0;
        n->depth = 1;
        break;
    default: break;
    }
    return n;
}

static node *new_internal(rd *r, int ik) {
    node *n = new_node(r, MA_PK_NONE);
    if (!n) return NULL;
    n->pk.kind = K_INTERNAL;
    n->ik = ik;
    n->hashable = 0;
    return n;
}

static node *new_int(rd *r, int64_t v) {
    node *n = new_node(r, MA_PK_INT);
    if (n) n->pk.i = v, n->hash = hash_int(v);
    return n;
}
static node *new_bool(rd *r, int v) {
    node *n = new_node(r, MA_PK_BOOL);
    if (n) n->pk.i = v != 0, n->hash = hash_int(v != 0);
    return n;
}
static node *new_float(rd *r, double v) {
    node *n = new_node(r, MA_PK_FLOAT);
    if (n) n->pk.f = v, n->hash = hash_float(v);
    return n;
}

/* strict UTF-8 (no overlongs, no surrogates, <= U+10FFFF); returns the offset of the first bad
 * byte or n */
static size_t utf8_bad(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        uint32_t cp, min;
        if (c >= 0xc2 && c <= 0xdf) k = 1, cp = c & 0x1f, min = 0x80;
        else if (c >= 0xe0 && c <= 0xef) k = 2, cp = c & 0x0f, min = 0x800;
        else if (c >= 0xf0 && c <= 0xf4) k = 3, cp = c & 0x07, min = 0x10000;
        else return i;
        if (n - i <= k) return i;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xc0) != 0x80) return i;
            cp = (cp << 6) | (s[i + j] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
        i += k + 1;
    }
    return n;
}

/* a str or bytes node holding a copy of p[0..n) (NUL-terminated either way) */
static node *new_text(rd *r, ma_pk_kind kind, const uint8_t *p, size_t n) {
    if (kind == MA_PK_STR) {
        size_t bad = utf8_bad(p, n);
        if (bad != n) return rfail(r, MA_ERR_FORMAT, "a string of %zu bytes is not UTF-8 (byte %zu)", n, bad), NULL;
    }
    node *x = new_node(r, kind);
    if (!x) return NULL;
    size_t total;
    if (!ma_add_size(n, 1, &total)) return rfail(r, MA_ERR_NOMEM, "a string of %zu bytes", n), NULL;
    char *s = ralloc(r, total, 0, kind == MA_PK_STR ? "a string" : "a bytes value");
    if (!s) return NULL;
    if (n) memcpy(s, p, n);
    s[n] = 0;
    x->pk.s = s;
    x->pk.len = n;
    x->hash = fnv(p, n, kind == MA_PK_STR ? 14695981039346656037ull : 14695981039346656037ull ^ 0x33);
    return x;
}

static int insertable(const node *x) { return x->ik == IK_NONE && !x->has_internal; }

static const char *kind_name(const node *x) {
    switch (x->ik) {
    case IK_GLOBAL: return "a global";
    case IK_DTYPE: return "a numpy.dtype";
    case IK_PENDING: return "an unfinished numpy array";
    default: break;
    }
    switch (x->pk.kind) {
    case MA_PK_NONE: return "None";
    case MA_PK_BOOL: return "a bool";
    case MA_PK_INT: return "an int";
    case MA_PK_FLOAT: return "a float";
    case MA_PK_STR: return "a str";
    case MA_PK_BYTES: return "a bytes";
    case MA_PK_LIST: return "a list";
    case MA_PK_TUPLE: return x->has_internal ? "a tuple holding internal values" : "a tuple";
    case MA_PK_DICT: return "a dict";
    case MA_PK_OBJECT: return "an object";
    case MA_PK_ARRAY: return "an array";
    default: break;
    }
    return "?";
}

/* child c goes under parent p: depth, expanded size, sealing */
static int adopt(rd *r, node *p, node *c) {
    if (c->depth + 1 > r->d->lim.max_depth) return rfail(r, MA_ERR_RANGE, "nesting deeper than %d containers", r->d->lim.max_depth), 0;
    if (c->depth + 1 > p->depth) p->depth = c->depth + 1;
    p->weight = c->weight > r->weight_cap - p->weight ? r->weight_cap + 1 : p->weight + c->weight;
    if (p->weight > r->weight_cap)
        return rfail(r, MA_ERR_RANGE, "the value would expand to more than %llu nodes (shared values counted each time)",
                     (unsigned long long)r->weight_cap),
               0;
    c->sealed = 1;
    return 1;
}

static int items_room(rd *r, node *c, size_t extra, int keys) {
    size_t need;
    if (!ma_add_size(c->pk.n, extra, &need) || need > r->d->lim.max_items)
        return rfail(r, MA_ERR_RANGE, "more than %zu elements in one %s", r->d->lim.max_items, c->pk.kind == MA_PK_DICT ? "dict" : "list"),
               0;
    if (need <= c->cap) return 1;
    size_t cap = c->cap;
    void *items = c->pk.items;
    if (!grow(r, &items, &cap, need, sizeof(ma_pk *), "a container's elements")) return 0;
    if (keys) {
        size_t kcap = c->cap;
        void *k = c->pk.keys;
        if (!grow(r, &k, &kcap, need, sizeof(ma_pk *), "a dict's keys")) return 0;
        c->pk.keys = k;
    }
    c->pk.items = items;
    c->cap = cap;
    return 1;
}

static int list_append(rd *r, node *list, node *item) {
    if (list->pk.kind != MA_PK_LIST) return rfail(r, MA_ERR_FORMAT, "appending to %s, not a list", kind_name(list)), 0;
    if (list->sealed) return rfail(r, MA_ERR_FORMAT, "appending to a list already stored elsewhere"), 0;
    if (!insertable(item)) return rfail(r, MA_ERR_FORMAT, "%s cannot be a list element", kind_name(item)), 0;
    if (item == list) return rfail(r, MA_ERR_FORMAT, "a list cannot hold itself"), 0;
    if (!items_room(r, list, 1, 0) || !adopt(r, list, item)) return 0;
    list->pk.items[list->pk.n++] = &item->pk;
    return 1;
}

/* Python's == for hashable keys (numbers across bool/int/float, str, bytes, None, tuples) */
static int key_eq(const node *a, const node *b, int depth) {
    if (a == b) return 1; /* identity: equal, NaN too (as in Python's dict) */
    if (a->hash != b->hash || depth > 64) return 0;
    int an = a->pk.kind == MA_PK_BOOL || a->pk.kind == MA_PK_INT || a->pk.kind == MA_PK_FLOAT;
    int bn = b->pk.kind == MA_PK_BOOL || b->pk.kind == MA_PK_INT || b->pk.kind == MA_PK_FLOAT;
    if (an && bn) {
        if (a->pk.kind == MA_PK_FLOAT && b->pk.kind == MA_PK_FLOAT) return a->pk.f == b->pk.f;
        if (a->pk.kind != MA_PK_FLOAT && b->pk.kind != MA_PK_FLOAT) return a->pk.i == b->pk.i;
        const node *f = a->pk.kind == MA_PK_FLOAT ? a : b, *i = a->pk.kind == MA_PK_FLOAT ? b : a;
        double v = f->pk.f;
        if (!(v == floor(v) && v >= -9223372036854775808.0 && v < 9223372036854775808.0)) return 0;
        return (int64_t)v == i->pk.i;
    }
    if (a->pk.kind != b->pk.kind) return 0;
    switch (a->pk.kind) {
    case MA_PK_NONE: return 1;
    case MA_PK_STR:
    case MA_PK_BYTES: return a->pk.len == b->pk.len && !memcmp(a->pk.s, b->pk.s, a->pk.len);
    case MA_PK_TUPLE:
        if (a->pk.n != b->pk.n) return 0;
        for (size_t i = 0; i < a->pk.n; i++)
            if (!key_eq(N(a->pk.items[i]), N(b->pk.items[i]), depth + 1)) return 0;
        return 1;
    default: return 0;
    }
}

enum { KEY_MAX_WEIGHT = 256 }; /* a tuple key's expanded size: keeps key comparisons short */
/* slots one key may visit in a dict's index: keys that share a slot (NaN keys, which all hash
 * alike and never compare equal, or keys found to collide in the unkeyed hash) had made each
 * insertion walk every earlier one, a decode quadratic in the keys on the network loop (90,000
 * NaN keys in 32 MiB: 37 s). Honest dicts, at most half full, walk one or two. */
enum { DICT_MAX_PROBES = 64 };
static const char COLLIDING[] = "a dict whose keys collide (NaN keys, or keys made to share a hash): refused";

static int dict_set(rd *r, node *dict, node *key, node *val) {
    if (dict->pk.kind != MA_PK_DICT) return rfail(r, MA_ERR_FORMAT, "setting an item of %s, not a dict", kind_name(dict)), 0;
    if (dict->sealed) return rfail(r, MA_ERR_FORMAT, "setting an item of a dict already stored elsewhere"), 0;
    if (!insertable(key) || !key->hashable || key->weight > KEY_MAX_WEIGHT)
        return rfail(r, MA_ERR_FORMAT, "%s cannot be a dict key", key->weight > KEY_MAX_WEIGHT ? "a tuple this large" : kind_name(key)), 0;
    if (!insertable(val)) return rfail(r, MA_ERR_FORMAT, "%s cannot be a dict value", kind_name(val)), 0;
    if (val == dict) return rfail(r, MA_ERR_FORMAT, "a dict cannot hold itself"), 0;
    /* look the key up */
    if (dict->hcap) {
        size_t m = dict->hcap - 1, walked = 0;
        for (size_t h = key->hash & m;; h = (h + 1) & m) {
            uint32_t e = dict->hidx[h];
            if (!e) break;
            if (++walked > DICT_MAX_PROBES) return rfail(r, MA_ERR_FORMAT, "%s", COLLIDING), 0;
            if (key_eq(N(dict->pk.keys[e - 1]), key, 0)) {
                if (!adopt(r, dict, val)) return 0; /* depth / size of the new value */
                dict->pk.items[e - 1] = &val->pk;
                return 1;
            }
        }
    }
    if (!items_room(r, dict, 1, 1)) return 0;
    if ((dict->pk.n + 1) * 2 > dict->hcap) { /* rebuild the index at twice the size */
        size_t nc = dict->hcap ? dict->hcap * 2 : 16, bytes;
        while ((dict->pk.n + 1) * 2 > nc) nc *= 2;
        if (!ma_mul_size(nc, sizeof(uint32_t), &bytes)) return rfail(r, MA_ERR_NOMEM, "a dict's index"), 0;
        uint32_t *idx = ralloc(r, bytes, 1, "a dict's index");
        if (!idx) return 0;
        for (size_t i = 0; i < dict->pk.n; i++) {
            size_t h = N(dict->pk.keys[i])->hash & (nc - 1), walked = 0;
            while (idx[h]) {
                if (++walked > DICT_MAX_PROBES) return rfail(r, MA_ERR_FORMAT, "%s", COLLIDING), 0;
                h = (h + 1) & (nc - 1);
            }
            idx[h] = (uint32_t)(i + 1);
        }
        dict->hidx = idx;
        dict->hcap = nc;
    }
    if (!adopt(r, dict, key) || !adopt(r, dict, val)) return 0;
    size_t h = key->hash & (dict->hcap - 1);
    while (dict->hidx[h]) h = (h + 1) & (dict->hcap - 1);
    dict->hidx[h] = (uint32_t)(dict->pk.n + 1);
    dict->pk.keys[dict->pk.n] = &key->pk;
    dict->pk.items[dict->pk.n] = &val->pk;
    dict->pk.n++;
    return 1;
}

static node *new_tuple(rd *r, node **items, size_t n) {
    if (n > r->d->lim.max_items) return rfail(r, MA_ERR_RANGE, "more than %zu elements in one tuple", r->d->lim.max_items), NULL;
    node *t = new_node(r, MA_PK_TUPLE);
    if (!t) return NULL;
    t->depth = 1;
    t->hash = 0x345678;
    if (n) {
        size_t bytes;
        if (!ma_mul_size(n, sizeof(ma_pk *), &bytes)) return rfail(r, MA_ERR_NOMEM, "a tuple"), NULL;
        t->pk.items = ralloc(r, bytes, 0, "a tuple's elements");
        if (!t->pk.items) return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        node *c = items[i];
        if (c->ik != IK_NONE || c->has_internal) t->has_internal = 1;
        else if (!c->hashable) t->hashable = 0;
        if (c->ik == IK_NONE && !adopt(r, t, c)) return NULL;
        if (c->ik != IK_NONE) c->sealed = 1;
        t->pk.items[i] = &c->pk;
        t->hash = (t->hash ^ c->hash) * 1000003ull;
    }
    t->pk.n = n;
    if (t->has_internal) t->hashable = 0;
    return t;
}

/* ------------------------------------------------------------------------------------ globals */

enum {
    G_REMOTE_POLICY_CONFIG,
    G_TIMED_OBSERVATION,
    G_TIMED_ACTION,
    G_TIMED_DATA,
    G_ROSETTA_OBS_HISTORY,
    G_NP_RECONSTRUCT,
    G_NP_NDARRAY,
    G_NP_DTYPE,
    G_NP_SCALAR,
    G_NP_FROMBUFFER_P5,
    G_NP_FROMBUFFER,
    G_TORCH_FROM_NUMPY,
    G_CODECS_ENCODE,
};

static const struct {
    const char *module, *name;
    int gid;
    const char *cls; /* a dataclass: the object's cls */
} GLOBALS[] = {
    {"lerobot.async_inference.helpers", "RemotePolicyConfig", G_REMOTE_POLICY_CONFIG, "lerobot.async_inference.helpers.RemotePolicyConfig"},
    {"lerobot.async_inference.helpers", "TimedObservation", G_TIMED_OBSERVATION, "lerobot.async_inference.helpers.TimedObservation"},
    {"lerobot.async_inference.helpers", "TimedAction", G_TIMED_ACTION, "lerobot.async_inference.helpers.TimedAction"},
    {"lerobot.async_inference.helpers", "TimedData", G_TIMED_DATA, "lerobot.async_inference.helpers.TimedData"},
    /* iblnkn/rosetta @ 674b7e8570c0daf23e2d8c3b1b9677358938d1bc, rosetta/common/obs_history.py: a
     * TimedObservation dataclass with a `history` list */
    {"rosetta.common.obs_history", "TimedObservationWithHistory", G_ROSETTA_OBS_HISTORY,
     "rosetta.common.obs_history.TimedObservationWithHistory"},
    {"numpy.core.multiarray", "_reconstruct", G_NP_RECONSTRUCT, NULL},
    {"numpy._core.multiarray", "_reconstruct", G_NP_RECONSTRUCT, NULL},
    {"numpy", "ndarray", G_NP_NDARRAY, NULL},
    {"numpy", "dtype", G_NP_DTYPE, NULL},
    {"numpy.core.multiarray", "scalar", G_NP_SCALAR, NULL},
    {"numpy._core.multiarray", "scalar", G_NP_SCALAR, NULL},
    {"numpy.core.numeric", "_frombuffer", G_NP_FROMBUFFER_P5, NULL},
    {"numpy._core.numeric", "_frombuffer", G_NP_FROMBUFFER_P5, NULL},
    {"numpy", "frombuffer", G_NP_FROMBUFFER, NULL},
    {"torch", "from_numpy", G_TORCH_FROM_NUMPY, NULL},
    {"_codecs", "encode", G_CODECS_ENCODE, NULL}, /* protocol 2's bytes: _codecs.encode(str, "latin1") */
};

static const char *gname(int gid) {
    for (size_t i = 0; i < sizeof GLOBALS / sizeof GLOBALS[0]; i++)
        if (GLOBALS[i].gid == gid) return GLOBALS[i].cls ? GLOBALS[i].cls : GLOBALS[i].name;
    return "?";
}

static int is_class(int gid) { return gid <= G_ROSETTA_OBS_HISTORY; }

static node *find_global(rd *r, const uint8_t *mod, size_t ml, const uint8_t *name, size_t nl) {
    for (size_t i = 0; i < sizeof GLOBALS / sizeof GLOBALS[0]; i++)
        if (strlen(GLOBALS[i].module) == ml && !memcmp(GLOBALS[i].module, mod, ml) && strlen(GLOBALS[i].name) == nl &&
            !memcmp(GLOBALS[i].name, name, nl)) {
            node *g = new_internal(r, IK_GLOBAL);
            if (g) g->gid = GLOBALS[i].gid;
            return g;
        }
    char m[160], n[160], em[200], en[200];
    snprintf(m, sizeof m, "%.*s", (int)(ml < 150 ? ml : 150), (const char *)mod);
    snprintf(n, sizeof n, "%.*s", (int)(nl < 150 ? nl : 150), (const char *)name);
    /* a NUL inside the name would cut the message short; the escape shows what is there */
    for (size_t i = 0; i < ml && i < 150; i++)
        if (!mod[i]) m[i] = '?';
    for (size_t i = 0; i < nl && i < 150; i++)
        if (!name[i]) n[i] = '?';
    ma_escape_text(m, 96, em, sizeof em);
    ma_escape_text(n, 96, en, sizeof en);
    if ((ml == 5 && !memcmp(mod, "torch", 5)) || (ml > 5 && !memcmp(mod, "torch.", 6)))
        rfail(r, MA_ERR_UNSUPPORTED, "global %s.%s: torch tensors are not read (send numpy arrays, or PR #3048's safetensors payload)", em,
              en);
    else
        rfail(r, MA_ERR_FORMAT,
              "global %s.%s is not allowed (only LeRobot's async-inference dataclasses and NumPy arrays / scalars are read; nothing is "
              "called)",
              em, en);
    return NULL;
}

/* ------------------------------------------------------------------------------------ NumPy */

static int parse_dtype(rd *r, const char *s, size_t n, ma_pk_dtype *dt, char *order) {
    *order = '=';
    if (n && strchr("<>|=", s[0])) *order = s[0], s++, n--;
    static const struct {
        const char *code;
        ma_pk_dtype dt;
    } T[] = {{"u1", MA_PK_U8},  {"i1", MA_PK_I8},  {"u2", MA_PK_U16}, {"i2", MA_PK_I16}, {"i4", MA_PK_I32},
             {"i8", MA_PK_I64}, {"f2", MA_PK_F16}, {"f4", MA_PK_F32}, {"f8", MA_PK_F64}, {"b1", MA_PK_BOOL8}};
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
        if (n == 2 && !memcmp(s, T[i].code, 2)) {
            *dt = T[i].dt;
            if (ma_pk_dtype_size(*dt) == 1) *order = '|';
            else if (*order == '|') break;
            return 1;
        }
    char raw[40], e[80];
    snprintf(raw, sizeof raw, "%.*s", (int)(n < 32 ? n : 32), s);
    rfail(r, MA_ERR_UNSUPPORTED, "NumPy dtype '%s' is not supported (u1 i1 u2 i2 i4 i8 f2 f4 f8 b1 are)",
          ma_escape_text(raw, 32, e, sizeof e));
    return 0;
}

static double half_to_double(uint16_t h) {
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v;
    if (e == 0) v = ldexp(m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexp(m | 0x400, e - 25);
    return (h & 0x8000) ? -v : v;
}

static void swap_bytes(uint8_t *p, size_t count, size_t size) {
    if (size < 2) return;
    for (size_t i = 0; i < count; i++, p += size)
        for (size_t a = 0, b = size - 1; a < b; a++, b--) {
            uint8_t t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
}

/* fill `a` (a new node, or the pending one) as an array of data `src` (a bytes node) */
static int make_array(rd *r, node *a, const node *src, const node *dtype, const int64_t *shape, int ndim, int fortran) {
    if (dtype->ik != IK_DTYPE) return rfail(r, MA_ERR_FORMAT, "an array's dtype is %s", kind_name(dtype)), 0;
    if (src->pk.kind != MA_PK_BYTES || !insertable(src))
        return rfail(r, MA_ERR_FORMAT, "an array's data is %s, not bytes", kind_name(src)), 0;
    if (ndim < 0 || ndim > 8) return rfail(r, MA_ERR_UNSUPPORTED, "an array of %d dimensions (at most 8)", ndim), 0;
    size_t isz = ma_pk_dtype_size(dtype->dt), count = 1, nbytes;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return rfail(r, MA_ERR_FORMAT, "an array's dimension %d is %lld", i, (long long)shape[i]), 0;
        if ((uint64_t)shape[i] > SIZE_MAX || !ma_mul_size(count, (size_t)shape[i], &count))
            return rfail(r, MA_ERR_RANGE, "an array's shape overflows"), 0;
    }
    if (!ma_mul_size(count, isz, &nbytes)) return rfail(r, MA_ERR_RANGE, "an array's shape overflows"), 0;
    if (nbytes != src->pk.len)
        return rfail(r, MA_ERR_FORMAT, "an array's shape and dtype make %zu bytes but its data has %zu", nbytes, src->pk.len), 0;
    const uint8_t *data = (const uint8_t *)src->pk.s;
    int swap = dtype->order == '>' && isz > 1, transpose = fortran && ndim > 1 && count > 1;
    if (swap || transpose) {
        uint8_t *out = ralloc(r, nbytes ? nbytes : 1, 0, "an array's data");
        if (!out) return 0;
        if (transpose) { /* Fortran order -> C order: walk the C index, read at the F offset */
            int64_t idx[8] = {0};
            size_t fstride[8];
            fstride[0] = isz;
            for (int k = 1; k < ndim; k++) fstride[k] = fstride[k - 1] * (size_t)shape[k - 1];
            for (size_t e = 0; e < count; e++) {
                size_t off = 0;
                for (int k = 0; k < ndim; k++) off += (size_t)idx[k] * fstride[k];
                memcpy(out + e * isz, data + off, isz);
                for (int k = ndim - 1; k >= 0; k--) {
                    if (++idx[k] < shape[k]) break;
                    idx[k] = 0;
                }
            }
        } else {
            memcpy(out, data, nbytes);
        }
        if (swap) swap_bytes(out, count, isz);
        data = out;
    }
    a->ik = IK_NONE;
    a->pk.kind = MA_PK_ARRAY;
    a->hashable = 0;
    a->depth = 1;
    a->weight = 1;
    a->pk.dtype = dtype->dt;
    a->pk.ndim = ndim;
    for (int i = 0; i < ndim; i++) a->pk.shape[i] = shape[i];
    a->pk.data = data;
    a->pk.nbytes = nbytes;
    return 1;
}

static int int_of(const node *x, int64_t *v) {
    if (x->ik != IK_NONE || (x->pk.kind != MA_PK_INT && x->pk.kind != MA_PK_BOOL)) return 0;
    *v = x->pk.i;
    return 1;
}

static int shape_of(rd *r, const node *t, int64_t *shape, int *ndim) {
    if (t->ik != IK_NONE || t->pk.kind != MA_PK_TUPLE)
        return rfail(r, MA_ERR_FORMAT, "an array's shape is %s, not a tuple", kind_name(t)), 0;
    if (t->pk.n > 8) return rfail(r, MA_ERR_UNSUPPORTED, "an array of %zu dimensions (at most 8)", t->pk.n), 0;
    for (size_t i = 0; i < t->pk.n; i++)
        if (N(t->pk.items[i])->pk.kind != MA_PK_INT || !int_of(N(t->pk.items[i]), &shape[i]))
            return rfail(r, MA_ERR_FORMAT, "an array's dimension %zu is not an int", i), 0;
    *ndim = (int)t->pk.n;
    return 1;
}

static node *arg(node *args, size_t i) { return N(args->pk.items[i]); }

/* REDUCE: callable(*args), for the callables that are data constructors */
static node *reduce(rd *r, node *fn, node *args) {
    if (fn->ik != IK_GLOBAL) return rfail(r, MA_ERR_FORMAT, "calling %s", kind_name(fn)), NULL;
    if (args->ik != IK_NONE || args->pk.kind != MA_PK_TUPLE)
        return rfail(r, MA_ERR_FORMAT, "%s's arguments are %s, not a tuple", gname(fn->gid), kind_name(args)), NULL;
    size_t n = args->pk.n;
    switch (fn->gid) {
    case G_NP_RECONSTRUCT: { /* _reconstruct(ndarray, (0,), b"b"): an array BUILD fills */
        int64_t z;
        if (n != 3 || arg(args, 0)->ik != IK_GLOBAL || arg(args, 0)->gid != G_NP_NDARRAY || arg(args, 1)->pk.kind != MA_PK_TUPLE ||
            arg(args, 1)->pk.n != 1 || !int_of(N(arg(args, 1)->pk.items[0]), &z) || z != 0 || arg(args, 2)->pk.kind != MA_PK_BYTES ||
            arg(args, 2)->pk.len != 1 || arg(args, 2)->pk.s[0] != 'b')
            return rfail(r, MA_ERR_FORMAT, "numpy _reconstruct's arguments are not (numpy.ndarray, (0,), b'b')"), NULL;
        return new_internal(r, IK_PENDING);
    }
    case G_NP_DTYPE: { /* dtype("f4", False, True) */
        int64_t align = 0, copy = 1;
        if (n < 1 || n > 3 || arg(args, 0)->pk.kind != MA_PK_STR || arg(args, 0)->ik != IK_NONE ||
            (n > 1 && !int_of(arg(args, 1), &align)) || (n > 2 && !int_of(arg(args, 2), &copy)) || align)
            return rfail(r, MA_ERR_FORMAT, "numpy.dtype's arguments are not (str, False, True)"), NULL;
        node *t = new_internal(r, IK_DTYPE);
        if (!t) return NULL;
        if (!parse_dtype(r, arg(args, 0)->pk.s, arg(args, 0)->pk.len, &t->dt, &t->order)) return NULL;
        return t;
    }
    case G_NP_SCALAR: { /* scalar(dtype, bytes) -> a number */
        node *dt = n == 2 ? arg(args, 0) : NULL, *b = n == 2 ? arg(args, 1) : NULL;
        if (!dt || dt->ik != IK_DTYPE || b->ik != IK_NONE || b->pk.kind != MA_PK_BYTES)
            return rfail(r, MA_ERR_FORMAT, "numpy scalar's arguments are not (dtype, bytes)"), NULL;
        size_t isz = ma_pk_dtype_size(dt->dt);
        if (b->pk.len != isz) return rfail(r, MA_ERR_FORMAT, "a numpy scalar of %zu bytes has %zu", isz, b->pk.len), NULL;
        uint8_t v[8];
        memcpy(v, b->pk.s, isz);
        if (dt->order == '>') swap_bytes(v, 1, isz);
        switch (dt->dt) {
        case MA_PK_F16: {
            uint16_t h;
            memcpy(&h, v, 2);
            return new_float(r, half_to_double(h));
        }
        case MA_PK_F32: {
            float f;
            memcpy(&f, v, 4);
            return new_float(r, f);
        }
        case MA_PK_F64: {
            double f;
            memcpy(&f, v, 8);
            return new_float(r, f);
        }
        case MA_PK_BOOL8: return new_bool(r, v[0]);
        case MA_PK_U8: return new_int(r, v[0]);
        case MA_PK_I8: return new_int(r, (int8_t)v[0]);
        case MA_PK_U16: {
            uint16_t x;
            memcpy(&x, v, 2);
            return new_int(r, x);
        }
        case MA_PK_I16: {
            int16_t x;
            memcpy(&x, v, 2);
            return new_int(r, x);
        }
        case MA_PK_I32: {
            int32_t x;
            memcpy(&x, v, 4);
            return new_int(r, x);
        }
        case MA_PK_I64: {
            int64_t x;
            memcpy(&x, v, 8);
            return new_int(r, x);
        }
        }
        return NULL;
    }
    case G_NP_FROMBUFFER_P5: { /* _frombuffer(buffer, dtype, shape, order) */
        int64_t shape[8];
        int ndim;
        if (n != 4 || arg(args, 3)->pk.kind != MA_PK_STR || arg(args, 3)->pk.len != 1 || !strchr("CF", arg(args, 3)->pk.s[0]))
            return rfail(r, MA_ERR_FORMAT, "numpy _frombuffer's arguments are not (buffer, dtype, shape, 'C' | 'F')"), NULL;
        if (!shape_of(r, arg(args, 2), shape, &ndim)) return NULL;
        node *a = new_node(r, MA_PK_ARRAY);
        if (!a || !make_array(r, a, arg(args, 0), arg(args, 1), shape, ndim, arg(args, 3)->pk.s[0] == 'F')) return NULL;
        return a;
    }
    case G_NP_FROMBUFFER: { /* numpy.frombuffer(buffer, dtype="<f4" | dtype, count=-1, offset=0) */
        int64_t count = -1, offset = 0;
        if (n < 1 || n > 4 || (n > 2 && !int_of(arg(args, 2), &count)) || (n > 3 && !int_of(arg(args, 3), &offset)) || count != -1 ||
            offset != 0)
            return rfail(r, MA_ERR_FORMAT, "numpy.frombuffer's arguments are not (buffer, dtype)"), NULL;
        node tmp = {0}, *dt = &tmp;
        tmp.ik = IK_DTYPE;
        tmp.dt = MA_PK_F64;
        tmp.order = '=';
        if (n > 1) {
            node *d = arg(args, 1);
            if (d->ik == IK_DTYPE) dt = d;
            else if (d->pk.kind == MA_PK_STR && d->ik == IK_NONE) {
                if (!parse_dtype(r, d->pk.s, d->pk.len, &tmp.dt, &tmp.order)) return NULL;
            } else return rfail(r, MA_ERR_FORMAT, "numpy.frombuffer's dtype is %s", kind_name(d)), NULL;
        }
        node *b = arg(args, 0);
        size_t isz = ma_pk_dtype_size(dt->dt);
        if (b->pk.kind != MA_PK_BYTES || b->ik != IK_NONE)
            return rfail(r, MA_ERR_FORMAT, "numpy.frombuffer's buffer is %s", kind_name(b)), NULL;
        if (b->pk.len % isz)
            return rfail(r, MA_ERR_FORMAT, "numpy.frombuffer: %zu bytes are not a whole number of %zu-byte elements", b->pk.len, isz), NULL;
        int64_t shape[1] = {(int64_t)(b->pk.len / isz)};
        node *a = new_node(r, MA_PK_ARRAY);
        if (!a || !make_array(r, a, b, dt, shape, 1, 0)) return NULL;
        return a;
    }
    case G_TORCH_FROM_NUMPY: /* the tensor of an array: the array */
        if (n != 1 || arg(args, 0)->ik != IK_NONE || arg(args, 0)->pk.kind != MA_PK_ARRAY)
            return rfail(r, MA_ERR_FORMAT, "torch.from_numpy's argument is not an array"), NULL;
        return arg(args, 0);
    case G_CODECS_ENCODE: { /* _codecs.encode(str, "latin1"): code points < 256 as bytes */
        node *s = n == 2 ? arg(args, 0) : NULL, *enc = n == 2 ? arg(args, 1) : NULL;
        if (!s || s->pk.kind != MA_PK_STR || enc->pk.kind != MA_PK_STR || s->ik || enc->ik ||
            (strcmp(enc->pk.s, "latin1") && strcmp(enc->pk.s, "latin-1")))
            return rfail(r, MA_ERR_FORMAT, "_codecs.encode's arguments are not (str, 'latin1')"), NULL;
        uint8_t *out = ralloc(r, s->pk.len + 1, 0, "a bytes value");
        if (!out) return NULL;
        size_t k = 0;
        for (size_t i = 0; i < s->pk.len; i++) {
            uint8_t c = (uint8_t)s->pk.s[i];
            if (c < 0x80) out[k++] = c;
            else if ((c == 0xc2 || c == 0xc3) && i + 1 < s->pk.len)
                out[k++] = (uint8_t)(((c & 0x1f) << 6) | ((uint8_t)s->pk.s[++i] & 0x3f));
            else return rfail(r, MA_ERR_FORMAT, "_codecs.encode: a code point beyond latin-1"), NULL;
        }
        node *b = new_node(r, MA_PK_BYTES);
        if (!b) return NULL;
        out[k] = 0;
        b->pk.s = (const char *)out;
        b->pk.len = k;
        b->hash = fnv(out, k, 14695981039346656037ull ^ 0x33);
        return b;
    }
    default: break;
    }
    return rfail(r, MA_ERR_FORMAT, "REDUCE of %s: it is not read as a data constructor", gname(fn->gid)), NULL;
}

/* BUILD: obj.__setstate__(state) for objects, dtypes and arrays */
static int build(rd *r, node *obj, node *st) {
    if (obj->ik == IK_NONE && obj->pk.kind == MA_PK_OBJECT) {
        if (obj->sealed || obj->built) return rfail(r, MA_ERR_FORMAT, "BUILD of a %s that has its state already", obj->pk.cls), 0;
        if (st->ik != IK_NONE || st->pk.kind != MA_PK_DICT)
            return rfail(r, MA_ERR_FORMAT, "the state of a %s is %s, not a dict", obj->pk.cls, kind_name(st)), 0;
        obj->depth = 1;
        obj->weight = 1;
        if (!adopt(r, obj, st)) return 0;
        obj->pk.state = &st->pk;
        obj->built = 1;
        return 1;
    }
    if (obj->ik == IK_DTYPE) { /* (3, byteorder, None, None, None, -1, -1, 0) */
        int64_t v[4];
        node *bo = st->pk.kind == MA_PK_TUPLE && st->pk.n == 8 ? arg(st, 1) : NULL;
        if (obj->built || !bo || !int_of(arg(st, 0), &v[0]) || v[0] != 3 || bo->pk.kind != MA_PK_STR || bo->pk.len != 1 ||
            !strchr("<>|=", bo->pk.s[0]) || arg(st, 2)->pk.kind != MA_PK_NONE || arg(st, 3)->pk.kind != MA_PK_NONE ||
            arg(st, 4)->pk.kind != MA_PK_NONE || !int_of(arg(st, 5), &v[1]) || !int_of(arg(st, 6), &v[2]) || !int_of(arg(st, 7), &v[3]) ||
            v[1] != -1 || v[2] != -1 || v[3] != 0)
            return rfail(
                       r, MA_ERR_UNSUPPORTED,
                       "a numpy.dtype's state is not (3, byteorder, None, None, None, -1, -1, 0) (structured or object dtypes are not read)"),
                   0;
        char o = bo->pk.s[0];
        size_t isz = ma_pk_dtype_size(obj->dt);
        if ((o == '|') != (isz == 1) && !(isz == 1 && o != '>'))
            return rfail(r, MA_ERR_FORMAT, "a numpy.dtype of %zu-byte elements with byte order '%c'", isz, o), 0;
        obj->order = isz == 1 ? '|' : o;
        obj->built = 1;
        return 1;
    }
    if (obj->ik == IK_PENDING) { /* (1, shape, dtype, is_fortran, raw bytes) */
        int64_t ver, fortran, shape[8];
        int ndim;
        if (st->pk.kind != MA_PK_TUPLE || st->pk.n != 5 || !int_of(arg(st, 0), &ver) || ver != 1 || !int_of(arg(st, 3), &fortran))
            return rfail(r, MA_ERR_FORMAT, "a numpy array's state is not (1, shape, dtype, is_fortran, bytes)"), 0;
        if (!shape_of(r, arg(st, 1), shape, &ndim)) return 0;
        return make_array(r, obj, arg(st, 4), arg(st, 2), shape, ndim, fortran != 0);
    }
    return rfail(r, MA_ERR_FORMAT, "BUILD of %s", kind_name(obj)), 0;
}

/* ------------------------------------------------------------------------------------ the machine */

static int push(rd *r, node *x) {
    if (!x) return 0;
    if (r->sp == r->scap) {
        void *s = r->stack;
        if (!grow(r, &s, &r->scap, r->sp + 1, sizeof(node *), "the pickle stack")) return 0;
        r->stack = s;
    }
    r->stack[r->sp++] = x;
    return 1;
}

static size_t floor_of(const rd *r) { return r->nmarks ? r->marks[r->nmarks - 1] : 0; }

static node *pop(rd *r) {
    if (r->sp <= floor_of(r)) return rfail(r, MA_ERR_FORMAT, "stack underflow"), NULL;
    return r->stack[--r->sp];
}

static node *top(rd *r) {
    if (r->sp <= floor_of(r)) return rfail(r, MA_ERR_FORMAT, "stack underflow"), NULL;
    return r->stack[r->sp - 1];
}

/* the items since the last MARK: stack[*from .. sp); the MARK is dropped */
static int pop_mark(rd *r, size_t *from) {
    if (!r->nmarks) return rfail(r, MA_ERR_FORMAT, "no MARK to close"), 0;
    *from = r->marks[--r->nmarks];
    return 1;
}

static int need(rd *r, size_t n) {
    if (n > r->len - r->pos) return rfail(r, MA_ERR_FORMAT, "needs %zu bytes but the payload ends after %zu", n, r->len - r->pos), 0;
    return 1;
}

static uint64_t le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static int memo_put(rd *r, uint64_t idx) {
    node *x = top(r);
    if (!x) return 0;
    if (idx >= r->d->lim.max_items)
        return rfail(r, MA_ERR_RANGE, "memo index %llu beyond the limit of %zu", (unsigned long long)idx, r->d->lim.max_items), 0;
    if (idx >= r->nmemo) {
        if (idx >= r->memocap) {
            size_t oldcap = r->memocap;
            void *m = r->memo;
            if (!grow(r, &m, &r->memocap, (size_t)idx + 1, sizeof(node *), "the pickle memo")) return 0;
            r->memo = m;
            memset(r->memo + oldcap, 0, (r->memocap - oldcap) * sizeof(node *));
        }
        r->nmemo = (size_t)idx + 1;
    }
    if (!r->memo[idx]) r->memoset++;
    r->memo[idx] = x;
    return 1;
}

static int memo_get(rd *r, uint64_t idx) {
    if (idx >= r->nmemo || !r->memo[idx]) return rfail(r, MA_ERR_FORMAT, "memo entry %llu was never stored", (unsigned long long)idx), 0;
    return push(r, r->memo[idx]);
}

static int run_pickle(rd *r) {
    const uint8_t *b = r->buf;
    for (;;) {
        r->op = -1;
        if (r->pos >= r->len) return rfail(r, MA_ERR_FORMAT, "the payload ends at offset %zu before STOP", r->pos), 0;
        r->op_off = r->pos;
        r->op = b[r->pos++];
        switch (r->op) {
        case 0x80: /* PROTO */
            if (!need(r, 1)) return 0;
            if (b[r->pos] < 2 || b[r->pos] > 5) return rfail(r, MA_ERR_UNSUPPORTED, "protocol %d (2..5 are read)", b[r->pos]), 0;
            r->pos++;
            break;
        case 0x95: { /* FRAME: a length hint */
            if (!need(r, 8)) return 0;
            uint64_t n = le(b + r->pos, 8);
            r->pos += 8;
            if (n > r->len - r->pos)
                return rfail(r, MA_ERR_FORMAT, "a frame of %llu bytes but %zu remain", (unsigned long long)n, r->len - r->pos), 0;
            break;
        }
        case 0x8c:
        case 'X':
        case 0x8d:
        case 'C':
        case 'B':
        case 0x8e:
        case 0x96: {
            int w = (r->op == 0x8c || r->op == 'C') ? 1 : (r->op == 'X' || r->op == 'B') ? 4 : 8;
            if (!need(r, (size_t)w)) return 0;
            uint64_t n = le(b + r->pos, w);
            r->pos += (size_t)w;
            if (n > r->len - r->pos)
                return rfail(r, MA_ERR_FORMAT, "a length of %llu bytes but %zu remain", (unsigned long long)n, r->len - r->pos), 0;
            int str = r->op == 0x8c || r->op == 'X' || r->op == 0x8d;
            if (!push(r, new_text(r, str ? MA_PK_STR : MA_PK_BYTES, b + r->pos, (size_t)n))) return 0;
            r->pos += (size_t)n;
            break;
        }
        case 0x94: /* MEMOIZE */
            if (!memo_put(r, r->memoset)) return 0;
            break;
        case 'q':
        case 'r': {
            int w = r->op == 'q' ? 1 : 4;
            if (!need(r, (size_t)w)) return 0;
            uint64_t i = le(b + r->pos, w);
            r->pos += (size_t)w;
            if (!memo_put(r, i)) return 0;
            break;
        }
        case 'h':
        case 'j': {
            int w = r->op == 'h' ? 1 : 4;
            if (!need(r, (size_t)w)) return 0;
            uint64_t i = le(b + r->pos, w);
            r->pos += (size_t)w;
            if (!memo_get(r, i)) return 0;
            break;
        }
        case 0x93: { /* STACK_GLOBAL */
            node *name = pop(r), *mod = name ? pop(r) : NULL;
            if (!mod) return 0;
            if (mod->pk.kind != MA_PK_STR || name->pk.kind != MA_PK_STR || mod->ik || name->ik)
                return rfail(r, MA_ERR_FORMAT, "STACK_GLOBAL's module and name are not strings"), 0;
            if (!push(r, find_global(r, (const uint8_t *)mod->pk.s, mod->pk.len, (const uint8_t *)name->pk.s, name->pk.len))) return 0;
            break;
        }
        case 'c': { /* GLOBAL "module\nname\n" */
            const uint8_t *m = b + r->pos, *e1 = memchr(m, '\n', r->len - r->pos);
            if (!e1) return rfail(r, MA_ERR_FORMAT, "the module name has no end of line"), 0;
            const uint8_t *n = e1 + 1, *e2 = memchr(n, '\n', (size_t)(b + r->len - n));
            if (!e2) return rfail(r, MA_ERR_FORMAT, "the global's name has no end of line"), 0;
            r->pos = (size_t)(e2 + 1 - b);
            if (!push(r, find_global(r, m, (size_t)(e1 - m), n, (size_t)(e2 - n)))) return 0;
            break;
        }
        case ')':
            if (!push(r, new_tuple(r, NULL, 0))) return 0;
            break;
        case 't': {
            size_t from;
            if (!pop_mark(r, &from)) return 0;
            node *t = new_tuple(r, r->stack + from, r->sp - from);
            r->sp = from;
            if (!push(r, t)) return 0;
            break;
        }
        case 0x85:
        case 0x86:
        case 0x87: {
            size_t k = (size_t)(r->op - 0x84);
            if (r->sp < floor_of(r) + k) return rfail(r, MA_ERR_FORMAT, "stack underflow"), 0;
            node *t = new_tuple(r, r->stack + r->sp - k, k);
            r->sp -= k;
            if (!push(r, t)) return 0;
            break;
        }
        case 0x81: { /* NEWOBJ: cls.__new__(cls, *args) */
            node *args = pop(r), *cls = args ? pop(r) : NULL;
            if (!cls) return 0;
            if (cls->ik != IK_GLOBAL || !is_class(cls->gid))
                return rfail(r, MA_ERR_FORMAT, "NEWOBJ of %s (only LeRobot's async-inference dataclasses)",
                             cls->ik == IK_GLOBAL ? gname(cls->gid) : kind_name(cls)),
                       0;
            if (args->ik || args->pk.kind != MA_PK_TUPLE || args->pk.n)
                return rfail(r, MA_ERR_FORMAT, "NEWOBJ of %s with arguments (a dataclass takes none)", gname(cls->gid)), 0;
            node *o = new_node(r, MA_PK_OBJECT);
            if (!o) return 0;
            o->pk.cls = gname(cls->gid);
            if (!push(r, o)) return 0;
            break;
        }
        case '}':
        case ']':
            if (!push(r, new_node(r, r->op == '}' ? MA_PK_DICT : MA_PK_LIST))) return 0;
            break;
        case '(':
            if (r->nmarks >= (size_t)r->d->lim.max_depth + 4)
                return rfail(r, MA_ERR_RANGE, "more than %d MARKs open", r->d->lim.max_depth + 4), 0;
            if (r->nmarks == r->mcap) {
                void *m = r->marks;
                if (!grow(r, &m, &r->mcap, r->nmarks + 1, sizeof(size_t), "the MARK stack")) return 0;
                r->marks = m;
            }
            r->marks[r->nmarks++] = r->sp;
            break;
        case 's': {
            node *v = pop(r), *k = v ? pop(r) : NULL, *d = k ? top(r) : NULL;
            if (!d || !dict_set(r, d, k, v)) return 0;
            break;
        }
        case 'u': {
            size_t from;
            if (!pop_mark(r, &from)) return 0;
            if (from <= floor_of(r)) return rfail(r, MA_ERR_FORMAT, "stack underflow"), 0;
            node *d = r->stack[from - 1];
            if ((r->sp - from) % 2) return rfail(r, MA_ERR_FORMAT, "an odd number (%zu) of keys and values", r->sp - from), 0;
            for (size_t i = from; i < r->sp; i += 2)
                if (!dict_set(r, d, r->stack[i], r->stack[i + 1])) return 0;
            r->sp = from;
            break;
        }
        case 'a': {
            node *v = pop(r), *l = v ? top(r) : NULL;
            if (!l || !list_append(r, l, v)) return 0;
            break;
        }
        case 'e': {
            size_t from;
            if (!pop_mark(r, &from)) return 0;
            if (from <= floor_of(r)) return rfail(r, MA_ERR_FORMAT, "stack underflow"), 0;
            node *l = r->stack[from - 1];
            for (size_t i = from; i < r->sp; i++)
                if (!list_append(r, l, r->stack[i])) return 0;
            r->sp = from;
            break;
        }
        case 'b': {
            node *st = pop(r), *o = st ? top(r) : NULL;
            if (!o || !build(r, o, st)) return 0;
            break;
        }
        case 'G': {
            if (!need(r, 8)) return 0;
            uint64_t v = 0;
            for (int i = 0; i < 8; i++) v = (v << 8) | b[r->pos + (size_t)i];
            double f;
            memcpy(&f, &v, 8);
            r->pos += 8;
            if (!push(r, new_float(r, f))) return 0;
            break;
        }
        case 'J':
        case 'K':
        case 'M': {
            int w = r->op == 'J' ? 4 : r->op == 'K' ? 1 : 2;
            if (!need(r, (size_t)w)) return 0;
            uint64_t v = le(b + r->pos, w);
            r->pos += (size_t)w;
            if (!push(r, new_int(r, r->op == 'J' ? (int64_t)(int32_t)(uint32_t)v : (int64_t)v))) return 0;
            break;
        }
        case 0x8a: { /* LONG1: n bytes, two's complement, little endian */
            if (!need(r, 1)) return 0;
            size_t n = b[r->pos++];
            if (n > 8) return rfail(r, MA_ERR_UNSUPPORTED, "an integer of %zu bytes (ints beyond int64 are not read)", n), 0;
            if (!need(r, n)) return 0;
            uint64_t v = n ? le(b + r->pos, (int)n) : 0;
            if (n && n < 8 && (b[r->pos + n - 1] & 0x80)) v |= ~0ull << (8 * n);
            r->pos += n;
            if (!push(r, new_int(r, (int64_t)v))) return 0;
            break;
        }
        case 0x88:
        case 0x89:
            if (!push(r, new_bool(r, r->op == 0x88))) return 0;
            break;
        case 'N':
            if (!push(r, new_node(r, MA_PK_NONE))) return 0;
            break;
        case 'R': {
            node *args = pop(r), *fn = args ? pop(r) : NULL;
            if (!fn || !push(r, reduce(r, fn, args))) return 0;
            break;
        }
        case '.': { /* STOP */
            if (r->nmarks) return rfail(r, MA_ERR_FORMAT, "%zu MARKs still open", r->nmarks), 0;
            if (r->sp != 1) return rfail(r, MA_ERR_FORMAT, "%zu values on the stack (1 expected)", r->sp), 0;
            node *x = r->stack[0];
            if (!insertable(x)) return rfail(r, MA_ERR_FORMAT, "the result is %s", kind_name(x)), 0;
            if (r->pos != r->len) return rfail(r, MA_ERR_FORMAT, "%zu bytes after STOP", r->len - r->pos), 0;
            r->d->root = &x->pk;
            return 1;
        }
        default: return rfail(r, MA_ERR_UNSUPPORTED, "this opcode is not read (LeRobot's payloads do not use it)"), 0;
        }
    }
}

/* ------------------------------------------------------------------------------------ PR #3048 */

/* the JSON's number tokens in order: int or float (cJSON keeps only a double); \u0000 refused */
static int scan_numbers(rd *r, const char *s, size_t n) {
    size_t count = 0;
    for (int pass = 0; pass < 2; pass++) {
        size_t k = 0;
        for (size_t i = 0; i < n;) {
            char c = s[i];
            if (c == '"') {
                for (i++; i < n && s[i] != '"'; i++)
                    if (s[i] == '\\') {
                        if (i + 5 < n && s[i + 1] == 'u' && !memcmp(s + i + 2, "0000", 4))
                            return rfail(r, MA_ERR_FORMAT, "the JSON holds a string with \\u0000"), 0;
                        i++;
                    }
                i++;
            } else if (c == '-' || (c >= '0' && c <= '9')) {
                size_t j = i;
                int isf = 0;
                while (j < n && strchr("0123456789+-.eE", s[j])) {
                    if (s[j] == '.' || s[j] == 'e' || s[j] == 'E') isf = 1;
                    j++;
                }
                if (pass) {
                    r->nums[k].is_int = !isf;
                    r->nums[k].i = 0;
                    if (!isf) {
                        int neg = s[i] == '-';
                        uint64_t v = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
                        for (size_t q = i + (size_t)neg; q < j; q++) {
                            if (v > (lim - (uint64_t)(s[q] - '0')) / 10)
                                return rfail(r, MA_ERR_UNSUPPORTED, "a JSON integer beyond int64 at offset %zu", i), 0;
                            v = v * 10 + (uint64_t)(s[q] - '0');
                        }
                        r->nums[k].i = neg ? (int64_t)(0 - v) : (int64_t)v;
                    }
                }
                k++;
                i = j;
            } else i++;
        }
        if (!pass) {
            count = k;
            size_t bytes;
            if (count) {
                if (!ma_mul_size(count, sizeof *r->nums, &bytes)) return rfail(r, MA_ERR_NOMEM, "JSON numbers"), 0;
                if (!(r->nums = ralloc(r, bytes, 0, "the JSON's numbers"))) return 0;
            }
            r->nnums = count;
        }
    }
    return 1;
}

static node *str_node(rd *r, const char *s) { return new_text(r, MA_PK_STR, (const uint8_t *)s, strlen(s)); }

static node *from_json(rd *r, const cJSON *j, int depth) {
    if (depth > r->d->lim.max_depth) return rfail(r, MA_ERR_RANGE, "JSON nested deeper than %d", r->d->lim.max_depth), NULL;
    if (cJSON_IsNull(j)) return new_node(r, MA_PK_NONE);
    if (cJSON_IsBool(j)) return new_bool(r, cJSON_IsTrue(j));
    if (cJSON_IsString(j)) return str_node(r, j->valuestring);
    if (cJSON_IsNumber(j)) {
        if (r->inum >= r->nnums) return rfail(r, MA_ERR_FORMAT, "the JSON's numbers do not line up"), NULL;
        const struct numtok *t = &r->nums[r->inum++];
        return t->is_int ? new_int(r, t->i) : new_float(r, j->valuedouble);
    }
    if (cJSON_IsArray(j) || cJSON_IsObject(j)) {
        node *c = new_node(r, cJSON_IsArray(j) ? MA_PK_LIST : MA_PK_DICT);
        if (!c) return NULL;
        for (const cJSON *e = j->child; e; e = e->next) {
            node *v = from_json(r, e, depth + 1);
            if (!v) return NULL;
            if (c->pk.kind == MA_PK_LIST) {
                if (!list_append(r, c, v)) return NULL;
            } else {
                node *k = str_node(r, e->string ? e->string : "");
                if (!k || !dict_set(r, c, k, v)) return NULL;
            }
        }
        return c;
    }
    return rfail(r, MA_ERR_FORMAT, "an unexpected JSON value"), NULL;
}

/* parse n bytes of JSON into a tree; cJSON's own memory is counted (as a bound, 64 bytes a
 * byte of text) while it lives */
static node *parse_json(rd *r, const char *s, size_t n, const char *what) {
    size_t est;
    if (!ma_mul_size(n + 1, 64, &est) || est > r->d->lim.budget || r->d->used > r->d->lim.budget - est)
        return rfail(r, MA_ERR_NOMEM, "%s of %zu bytes would pass the decode's budget of %zu bytes", what, n, r->d->lim.budget), NULL;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(s, n, &end, 0);
    if (!j) return rfail(r, MA_ERR_FORMAT, "%s is not JSON (near byte %zu)", what, end ? (size_t)(end - s) : 0), NULL;
    size_t used = (size_t)(end - s);
    while (used < n && strchr(" \t\r\n", s[used])) used++;
    node *x = NULL;
    r->d->used += est;
    r->nums = NULL;
    r->nnums = r->inum = 0;
    if (used != n) rfail(r, MA_ERR_FORMAT, "%s has %zu bytes after its end", what, n - used);
    else if (scan_numbers(r, s, n)) x = from_json(r, j, 0);
    r->d->used -= est;
    cJSON_Delete(j);
    return x;
}

static const node *get(const node *d, const char *k) { return N(ma_pk_get(&d->pk, k)); }

/* safetensors (u64 little-endian header length, JSON header, data) -> a dict name -> array */
static node *parse_safetensors(rd *r, const uint8_t *p, size_t n) {
    node *out = new_node(r, MA_PK_DICT);
    if (!out || !n) return out;
    if (n < 8) return rfail(r, MA_ERR_FORMAT, "safetensors part of %zu bytes (an 8-byte header length at least)", n), NULL;
    uint64_t hl = le(p, 8);
    if (hl > n - 8) return rfail(r, MA_ERR_FORMAT, "safetensors header of %llu bytes but %zu remain", (unsigned long long)hl, n - 8), NULL;
    node *h = parse_json(r, (const char *)p + 8, (size_t)hl, "the safetensors header");
    if (!h) return NULL;
    if (h->pk.kind != MA_PK_DICT) return rfail(r, MA_ERR_FORMAT, "the safetensors header is not an object"), NULL;
    const uint8_t *data = p + 8 + hl;
    size_t dlen = n - 8 - (size_t)hl;
    static const struct {
        const char *name;
        ma_pk_dtype dt;
    } T[] = {{"U8", MA_PK_U8},   {"I8", MA_PK_I8},   {"U16", MA_PK_U16}, {"I16", MA_PK_I16}, {"I32", MA_PK_I32},
             {"I64", MA_PK_I64}, {"F16", MA_PK_F16}, {"F32", MA_PK_F32}, {"F64", MA_PK_F64}, {"BOOL", MA_PK_BOOL8}};
    for (size_t i = 0; i < h->pk.n; i++) {
        const node *k = N(h->pk.keys[i]), *e = N(h->pk.items[i]);
        char en[200];
        ma_escape_text(k->pk.s, 96, en, sizeof en);
        if (!strcmp(k->pk.s, "__metadata__")) continue;
        const node *dt = e->pk.kind == MA_PK_DICT ? get(e, "dtype") : NULL, *sh = dt ? get(e, "shape") : NULL,
                   *off = sh ? get(e, "data_offsets") : NULL;
        if (!off || dt->pk.kind != MA_PK_STR || sh->pk.kind != MA_PK_LIST || off->pk.kind != MA_PK_LIST || off->pk.n != 2 ||
            N(off->pk.items[0])->pk.kind != MA_PK_INT || N(off->pk.items[1])->pk.kind != MA_PK_INT)
            return rfail(r, MA_ERR_FORMAT, "safetensors tensor '%s' lacks dtype / shape / data_offsets", en), NULL;
        int64_t b0 = off->pk.items[0]->i, b1 = off->pk.items[1]->i;
        if (b0 < 0 || b1 < b0 || (uint64_t)b1 > dlen)
            return rfail(r, MA_ERR_FORMAT, "safetensors tensor '%s': data_offsets [%lld, %lld] outside the %zu data bytes", en,
                         (long long)b0, (long long)b1, dlen),
                   NULL;
        node tmp = {0};
        tmp.ik = IK_DTYPE;
        tmp.order = '<';
        size_t t = 0;
        while (t < sizeof T / sizeof T[0] && strcmp(T[t].name, dt->pk.s)) t++;
        if (t == sizeof T / sizeof T[0]) {
            char ed[80];
            return rfail(r, MA_ERR_UNSUPPORTED, "safetensors tensor '%s' has dtype %s (not read)", en,
                         ma_escape_text(dt->pk.s, 16, ed, sizeof ed)),
                   NULL;
        }
        tmp.dt = T[t].dt;
        int64_t shape[8];
        if (sh->pk.n > 8) return rfail(r, MA_ERR_UNSUPPORTED, "safetensors tensor '%s' has %zu dimensions (at most 8)", en, sh->pk.n), NULL;
        for (size_t q = 0; q < sh->pk.n; q++) {
            if (sh->pk.items[q]->kind != MA_PK_INT)
                return rfail(r, MA_ERR_FORMAT, "safetensors tensor '%s': a dimension is not an int", en), NULL;
            shape[q] = sh->pk.items[q]->i;
        }
        node *bytes = new_text(r, MA_PK_BYTES, data + b0, (size_t)(b1 - b0)), *a = bytes ? new_node(r, MA_PK_ARRAY) : NULL;
        if (!a) return NULL;
        if (!make_array(r, a, bytes, &tmp, shape, (int)sh->pk.n, 0))
            return ma_error_wrap(r->err, r->code, "safetensors tensor '%s'", en), NULL;
        node *key = str_node(r, k->pk.s);
        if (!key || !dict_set(r, out, key, a)) return NULL;
    }
    return out;
}

static node *new_object(rd *r, const char *cls, node *state) {
    node *o = new_node(r, MA_PK_OBJECT);
    if (!o) return NULL;
    o->pk.cls = cls;
    if (!adopt(r, o, state)) return NULL;
    o->pk.state = &state->pk;
    o->built = 1;
    return o;
}

static int set_str(rd *r, node *d, const char *k, node *v) {
    node *key = v ? str_node(r, k) : NULL;
    return key && dict_set(r, d, key, v);
}

static node *need_field(rd *r, const node *meta, const char *k, const char *type) {
    const node *v = get(meta, k);
    if (!v) return rfail(r, MA_ERR_FORMAT, "%s without \"%s\"", type, k), NULL;
    return (node *)v;
}

static int run_3048(rd *r) {
    const uint8_t *b = r->buf;
    if (r->len < 4) return rfail(r, MA_ERR_FORMAT, "%zu bytes (a 4-byte JSON length at least)", r->len), 0;
    uint64_t jl = ((uint64_t)b[0] << 24) | ((uint64_t)b[1] << 16) | ((uint64_t)b[2] << 8) | b[3];
    if (jl > r->len - 4)
        return rfail(r, MA_ERR_FORMAT, "a JSON length of %llu bytes but %zu remain", (unsigned long long)jl, r->len - 4), 0;
    node *meta = parse_json(r, (const char *)b + 4, (size_t)jl, "the JSON");
    if (!meta) return 0;
    if (meta->pk.kind != MA_PK_DICT) return rfail(r, MA_ERR_FORMAT, "the JSON is not an object"), 0;
    const node *type = get(meta, "type");
    if (!type || type->pk.kind != MA_PK_STR) return rfail(r, MA_ERR_FORMAT, "the JSON has no \"type\" string"), 0;
    node *tensors = parse_safetensors(r, b + 4 + jl, r->len - 4 - (size_t)jl);
    if (!tensors) return 0;
    node *root = NULL;
    if (!strcmp(type->pk.s, "RemotePolicyConfig")) { /* safe_serialization.py:69-114 */
        static const char *const req[] = {"policy_type", "pretrained_name_or_path", "lerobot_features", "actions_per_chunk"};
        node *st = new_node(r, MA_PK_DICT);
        if (!st) return 0;
        for (size_t i = 0; i < 4; i++) {
            node *v = need_field(r, meta, req[i], "a RemotePolicyConfig");
            if (!v || !set_str(r, st, req[i], (v))) return 0;
        }
        node *dev = N(ma_pk_get(&meta->pk, "device")), *ren = N(ma_pk_get(&meta->pk, "rename_map"));
        if (!set_str(r, st, "device", dev ? dev : str_node(r, "cpu")) || !set_str(r, st, "rename_map", ren ? ren : new_node(r, MA_PK_DICT)))
            return 0;
        root = new_object(r, "lerobot.async_inference.helpers.RemotePolicyConfig", st);
    } else if (!strcmp(type->pk.s, "TimedObservation")) { /* :117-169 */
        node *st = new_node(r, MA_PK_DICT), *obs = st ? new_node(r, MA_PK_DICT) : NULL;
        if (!obs) return 0;
        node *ts = need_field(r, meta, "timestamp", "a TimedObservation"),
             *step = ts ? need_field(r, meta, "timestep", "a TimedObservation") : NULL,
             *sc = step ? need_field(r, meta, "scalar_data", "a TimedObservation") : NULL;
        if (!sc) return 0;
        if (sc->pk.kind != MA_PK_DICT) return rfail(r, MA_ERR_FORMAT, "a TimedObservation's scalar_data is not an object"), 0;
        for (size_t i = 0; i < sc->pk.n; i++)
            if (!dict_set(r, obs, (N(sc->pk.keys[i])), (N(sc->pk.items[i])))) return 0;
        for (size_t i = 0; i < tensors->pk.n; i++)
            if (!dict_set(r, obs, (N(tensors->pk.keys[i])), (N(tensors->pk.items[i])))) return 0;
        node *mg = N(ma_pk_get(&meta->pk, "must_go"));
        if (!set_str(r, st, "timestamp", (ts)) || !set_str(r, st, "timestep", (step)) || !set_str(r, st, "observation", obs) ||
            !set_str(r, st, "must_go", mg ? mg : new_bool(r, 0)))
            return 0;
        root = new_object(r, "lerobot.async_inference.helpers.TimedObservation", st);
    } else if (!strcmp(type->pk.s, "TimedActions")) { /* :172-210 */
        node *acts = need_field(r, meta, "actions", "a TimedActions");
        if (!acts) return 0;
        if (acts->pk.kind != MA_PK_LIST) return rfail(r, MA_ERR_FORMAT, "TimedActions' actions is not a list"), 0;
        node *list = new_node(r, MA_PK_LIST);
        if (!list) return 0;
        for (size_t i = 0; i < acts->pk.n; i++) {
            node *m = N(acts->pk.items[i]), *st = new_node(r, MA_PK_DICT);
            char name[40];
            snprintf(name, sizeof name, "action_%zu", i);
            node *t = N(ma_pk_get(&tensors->pk, name));
            if (!st) return 0;
            if (m->pk.kind != MA_PK_DICT) return rfail(r, MA_ERR_FORMAT, "TimedActions' action %zu is not an object", i), 0;
            if (!t) return rfail(r, MA_ERR_FORMAT, "TimedActions without the tensor %s", name), 0;
            node *ts = need_field(r, m, "timestamp", "a TimedAction"), *step = ts ? need_field(r, m, "timestep", "a TimedAction") : NULL;
            if (!step || !set_str(r, st, "timestamp", (ts)) || !set_str(r, st, "timestep", (step)) || !set_str(r, st, "action", (t)))
                return 0;
            node *o = new_object(r, "lerobot.async_inference.helpers.TimedAction", st);
            if (!o || !list_append(r, list, o)) return 0;
        }
        root = list;
    } else {
        char e[120];
        return rfail(r, MA_ERR_UNSUPPORTED, "the JSON's type \"%s\" is not RemotePolicyConfig, TimedObservation or TimedActions",
                     ma_escape_text(type->pk.s, 64, e, sizeof e)),
               0;
    }
    if (!root) return 0;
    r->d->root = &root->pk;
    return 1;
}

ma_status ma_pk_decode(const uint8_t *buf, size_t len, const ma_pk_limits *lim, ma_pk_doc **out, ma_error *err) {
    if (out) *out = NULL;
    if (!out || !lim || (!buf && len) || lim->max_depth < 1 || !lim->max_items)
        return ma_fail(err, MA_ERR_ARG, "ma_pk_decode: no output, limits or input");
    ma_pk_doc *d = calloc(1, sizeof *d);
    if (!d) return ma_fail(err, MA_ERR_NOMEM, "ma_pk_decode: out of memory");
    d->lim = *lim;
    if (d->lim.max_items > UINT32_MAX - 1) d->lim.max_items = UINT32_MAX - 1; /* dict indexes are 32-bit */
    rd r = {0};
    r.d = d;
    r.buf = buf;
    r.len = len;
    r.op = -1;
    r.err = err;
    r.weight_cap = lim->budget / sizeof(ma_pk);
    if (r.weight_cap < 64) r.weight_cap = 64;
    int ok;
    if (len && buf[0] == 0x80) {
        r.context = "pickle";
        ok = run_pickle(&r);
    } else if (len && buf[0] == 0x00) {
        r.context = "PR #3048 payload";
        ok = run_3048(&r);
    } else {
        r.context = "payload";
        ok = 0;
        if (len) rfail(&r, MA_ERR_FORMAT, "first byte 0x%02x is neither a pickle's PROTO (0x80) nor a PR #3048 JSON length (0x00)", buf[0]);
        else rfail(&r, MA_ERR_FORMAT, "empty");
    }
    if (!ok) {
        ma_pk_free(d);
        return r.code ? r.code : MA_ERR_FORMAT;
    }
    *out = d;
    return MA_OK;
}

/* ------------------------------------------------------------------------------------ tree helpers */

const ma_pk *ma_pk_get(const ma_pk *dict, const char *key) {
    if (!dict || dict->kind != MA_PK_DICT || !key) return NULL;
    size_t kl = strlen(key);
    for (size_t i = 0; i < dict->n; i++) {
        const ma_pk *k = dict->keys[i];
        if (k->kind == MA_PK_STR && k->len == kl && !memcmp(k->s, key, kl)) return dict->items[i];
    }
    return NULL;
}

const ma_pk *ma_pk_attr(const ma_pk *obj, const char *key) {
    if (!obj || obj->kind != MA_PK_OBJECT) return NULL;
    return ma_pk_get(obj->state, key);
}

/* ------------------------------------------------------------------------------------ writers */

typedef struct {
    uint8_t *p;
    size_t n, cap, max;
    int bad;
} wbuf;

static void put(wbuf *w, const void *src, size_t n) {
    if (w->bad) return;
    if (n > w->max || w->n > w->max - n) {
        w->bad = 1;
        return;
    }
    if (w->n + n > w->cap) {
        size_t nc = w->cap ? w->cap : 256;
        while (nc < w->n + n) nc = nc > SIZE_MAX / 2 ? w->n + n : nc * 2;
        uint8_t *q = realloc(w->p, nc);
        if (!q) {
            w->bad = 1;
            return;
        }
        w->p = q;
        w->cap = nc;
    }
    memcpy(w->p + w->n, src, n);
    w->n += n;
}
static void put1(wbuf *w, uint8_t b) { put(w, &b, 1); }
static void puts_(wbuf *w, const char *s) { put(w, s, strlen(s)); }
static void put_le(wbuf *w, uint64_t v, int n) {
    uint8_t b[8];
    for (int i = 0; i < n; i++) b[i] = (uint8_t)(v >> (8 * i));
    put(w, b, (size_t)n);
}

static uint8_t *finish(wbuf *w, size_t *len) {
    if (w->bad) {
        free(w->p);
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = w->n;
    return w->p;
}

/* a memoized string or global: written once, BINGET after */
typedef struct {
    uint32_t next;
    int64_t memo[16];
} wmemo;

static void memo_ref(wbuf *w, wmemo *m, int slot) {
    if (m->memo[slot] < 256) put1(w, 'h'), put1(w, (uint8_t)m->memo[slot]);
    else put1(w, 'j'), put_le(w, (uint64_t)m->memo[slot], 4);
}

static void w_str(wbuf *w, wmemo *m, int slot, const char *s) {
    if (m->memo[slot] >= 0) return memo_ref(w, m, slot);
    size_t n = strlen(s);
    put1(w, 0x8c), put1(w, (uint8_t)n), put(w, s, n);
    put1(w, 0x94);
    m->memo[slot] = m->next++;
}

static void w_global(wbuf *w, wmemo *m, int slot, int mslot, const char *mod, int nslot, const char *name) {
    if (m->memo[slot] >= 0) return memo_ref(w, m, slot);
    w_str(w, m, mslot, mod);
    w_str(w, m, nslot, name);
    put1(w, 0x93), put1(w, 0x94);
    m->memo[slot] = m->next++;
}

enum { S_HELPERS, S_TIMEDACTION, S_CLS, S_TORCH, S_FROMNP, S_G_FROMNP, S_NUMPY, S_FROMBUF, S_G_FROMBUF, S_F4, S_TS, S_STEP, S_ACTION };

static void put_be_double(wbuf *w, double f) {
    uint64_t v;
    memcpy(&v, &f, 8);
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (56 - 8 * i));
    put(w, b, 8);
}

uint8_t *ma_pk_write_actions(const float *rows, int n, int dim, double t0, double dt, int64_t step0, size_t max, size_t *len) {
    if (len) *len = 0;
    if (n < 0 || dim < 0 || (!rows && n && dim)) return NULL;
    wbuf w = {NULL, 0, 0, max, 0};
    wmemo m;
    m.next = 0;
    for (int i = 0; i < 16; i++) m.memo[i] = -1;
    put1(&w, 0x80), put1(&w, 5);   /* PROTO 5 (BYTEARRAY8) */
    put1(&w, ']'), put1(&w, 0x94); /* the list */
    m.next++;
    for (int i = 0; i < n; i++) {
        if (i % 1000 == 0) put1(&w, '('); /* APPENDS in batches, as Python's pickler */
        w_global(&w, &m, S_CLS, S_HELPERS, "lerobot.async_inference.helpers", S_TIMEDACTION, "TimedAction");
        put1(&w, ')'), put1(&w, 0x81); /* EMPTY_TUPLE NEWOBJ */
        put1(&w, '}'), put1(&w, '(');  /* the state dict */
        w_str(&w, &m, S_TS, "timestamp");
        put1(&w, 'G'), put_be_double(&w, t0 + (double)i * dt);
        w_str(&w, &m, S_STEP, "timestep");
        int64_t step = step0 + i;
        if (step >= INT32_MIN && step <= INT32_MAX) put1(&w, 'J'), put_le(&w, (uint64_t)step, 4);
        else put1(&w, 0x8a), put1(&w, 8), put_le(&w, (uint64_t)step, 8);
        w_str(&w, &m, S_ACTION, "action");
        w_global(&w, &m, S_G_FROMNP, S_TORCH, "torch", S_FROMNP, "from_numpy");
        w_global(&w, &m, S_G_FROMBUF, S_NUMPY, "numpy", S_FROMBUF, "frombuffer");
        size_t nb = (size_t)dim * 4;
        put1(&w, 0x96), put_le(&w, nb, 8); /* BYTEARRAY8: writable, so torch does not warn */
        for (int k = 0; k < dim; k++) {
            uint32_t v;
            memcpy(&v, &rows[(size_t)i * (size_t)dim + (size_t)k], 4);
            put_le(&w, v, 4);
        }
        w_str(&w, &m, S_F4, "<f4");
        put1(&w, 0x86), put1(&w, 'R'); /* numpy.frombuffer(bytes, "<f4") */
        put1(&w, 0x85), put1(&w, 'R'); /* torch.from_numpy(that) */
        put1(&w, 'u'), put1(&w, 'b');  /* SETITEMS BUILD */
        if (i % 1000 == 999 || i == n - 1) put1(&w, 'e');
    }
    put1(&w, '.');
    return finish(&w, len);
}

static void put_json_double(wbuf *w, double f) {
    char s[40];
    int k = snprintf(s, sizeof s, "%.17g", f);
    if (!strpbrk(s, ".eEn")) s[k++] = '.', s[k++] = '0', s[k] = 0; /* a float stays a float in Python's json */
    put(w, s, strlen(s));
}

uint8_t *ma_pk_write_actions_safe(const float *rows, int n, int dim, double t0, double dt, int64_t step0, size_t max, size_t *len) {
    if (len) *len = 0;
    if (n < 0 || dim < 0 || (!rows && n && dim)) return NULL;
    for (int i = 0; i < n; i++)
        if (!isfinite(t0 + (double)i * dt)) return NULL; /* JSON has no NaN */
    wbuf j = {NULL, 0, 0, max, 0}, h = {NULL, 0, 0, max, 0}, w = {NULL, 0, 0, max, 0};
    char s[96];
    puts_(&j, "{\"type\": \"TimedActions\", \"actions\": [");
    for (int i = 0; i < n; i++) {
        puts_(&j, i ? ", {\"timestamp\": " : "{\"timestamp\": ");
        put_json_double(&j, t0 + (double)i * dt);
        snprintf(s, sizeof s, ", \"timestep\": %lld}", (long long)(step0 + i));
        put(&j, s, strlen(s));
    }
    put(&j, "]}", 2);
    /* safetensors: tensors action_0.. of shape [dim], F32, back to back */
    size_t nb = (size_t)dim * 4;
    if (n) {
        put1(&h, '{');
        for (int i = 0; i < n; i++) {
            snprintf(s, sizeof s, "%s\"action_%d\":{\"dtype\":\"F32\",\"shape\":[%d],\"data_offsets\":[%zu,%zu]}", i ? "," : "", i, dim,
                     (size_t)i * nb, (size_t)(i + 1) * nb);
            put(&h, s, strlen(s));
        }
        put1(&h, '}');
        while (!h.bad && h.n % 8) put1(&h, ' ');
    }
    if (j.bad || h.bad || j.n > UINT32_MAX) {
        free(j.p), free(h.p);
        return NULL;
    }
    uint8_t be[4] = {(uint8_t)(j.n >> 24), (uint8_t)(j.n >> 16), (uint8_t)(j.n >> 8), (uint8_t)j.n};
    put(&w, be, 4);
    put(&w, j.p, j.n);
    if (n) {
        put_le(&w, h.n, 8);
        put(&w, h.p, h.n);
        for (size_t e = 0; e < (size_t)n * (size_t)dim; e++) {
            uint32_t v;
            memcpy(&v, &rows[e], 4);
            put_le(&w, v, 4);
        }
    }
    free(j.p), free(h.p);
    return finish(&w, len);
}
