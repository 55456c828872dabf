/* SPDX-License-Identifier: Apache-2.0 */
/* JSON request bodies within a memory budget (see json.h). Written from RFC 8259. */
#include "server/json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"

#define MAX_DEPTH 32
#define CHUNK 65536

typedef struct block {
    struct block *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} block;

struct ma_json {
    block *blocks;   /* nodes and strings */
    double **arrays; /* numeric arrays (realloc'd as they grow) */
    size_t n_arrays, cap_arrays;
    size_t used, budget;
    ma_jv *root;
};

typedef struct {
    const char *b;
    size_t len, pos;
    ma_json *j;
    ma_error *err;
    int over_budget;
} parser;

/* ------------------------------------------------------------------------------ memory */

static int charge(parser *p, size_t n) {
    if (n > p->j->budget - p->j->used) {
        p->over_budget = 1;
        return -1;
    }
    p->j->used += n;
    return 0;
}

static void *arena(parser *p, size_t n) {
    n = (n + 15) & ~(size_t)15;
    block *bl = p->j->blocks;
    if (!bl || bl->cap - bl->used < n) {
        const size_t cap = n > CHUNK ? n : CHUNK;
        if (charge(p, sizeof(block) + cap)) return NULL;
        bl = malloc(sizeof(block) + cap);
        if (!bl) {
            p->over_budget = 1;
            return NULL;
        }
        bl->used = 0;
        bl->cap = cap;
        bl->next = p->j->blocks;
        p->j->blocks = bl;
    }
    void *r = bl->data + bl->used;
    bl->used += n;
    return r;
}

/* ------------------------------------------------------------------------------ errors */

static ma_status fail_at(parser *p, size_t at, const char *what) {
    if (p->err && p->err->code) return p->err->code; /* the first error wins */
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < p->len; i++) {
        if (p->b[i] == '\n') line++, col = 1;
        else col++;
    }
    return ma_fail(p->err, MA_ERR_FORMAT, "request: not valid JSON at byte %zu (line %zu, column %zu): %s", at, line, col, what);
}

static ma_status fail_budget(parser *p) {
    return ma_fail(p->err, MA_ERR_NOMEM,
                   "request: parsing this JSON needs more than %.1f MiB (the limit for a %.1f MiB body); "
                   "send large arrays as json_numpy (base64) or PNG/JPEG",
                   (double)p->j->budget / 1048576.0, (double)p->len / 1048576.0);
}

static void ws(parser *p) {
    while (p->pos < p->len && (p->b[p->pos] == ' ' || p->b[p->pos] == '\t' || p->b[p->pos] == '\n' || p->b[p->pos] == '\r')) p->pos++;
}

/* ------------------------------------------------------------------------------ scalars */

/* a number per RFC 8259's grammar; *ok 0 when malformed */
static double number(parser *p, int *ok) {
    const size_t s = p->pos;
    const char *b = p->b;
    size_t i = s;
    *ok = 0;
    if (i < p->len && b[i] == '-') i++;
    if (i >= p->len) return 0;
    if (b[i] == '0') i++;
    else if (b[i] >= '1' && b[i] <= '9')
        while (i < p->len && b[i] >= '0' && b[i] <= '9') i++;
    else return 0;
    if (i < p->len && b[i] == '.') {
        i++;
        if (i >= p->len || b[i] < '0' || b[i] > '9') return 0;
        while (i < p->len && b[i] >= '0' && b[i] <= '9') i++;
    }
    if (i < p->len && (b[i] == 'e' || b[i] == 'E')) {
        i++;
        if (i < p->len && (b[i] == '+' || b[i] == '-')) i++;
        if (i >= p->len || b[i] < '0' || b[i] > '9') return 0;
        while (i < p->len && b[i] >= '0' && b[i] <= '9') i++;
    }
    char tmp[64];
    const size_t n = i - s;
    double v;
    if (n < sizeof tmp) {
        memcpy(tmp, b + s, n);
        tmp[n] = '\0';
        v = strtod(tmp, NULL);
    } else { /* a long literal: digits beyond 60 cannot change a double much; read it whole */
        char *big = malloc(n + 1);
        if (!big) return 0;
        memcpy(big, b + s, n);
        big[n] = '\0';
        v = strtod(big, NULL);
        free(big);
    }
    p->pos = i;
    *ok = 1;
    return v;
}

/* a string at p->pos (the opening quote): decoded into the arena */
static ma_status string(parser *p, const char **out, size_t *out_len) {
    const size_t start = ++p->pos;
    /* find the end first: the decoded string is never longer than the literal */
    const size_t e = start + ma_json_string_end(p->b + start, p->len - start);
    if (e >= p->len) return fail_at(p, start - 1, "unterminated string");
    char *o = arena(p, e - start + 1);
    if (!o) return fail_budget(p);
    size_t at;
    const char *why = ma_json_unescape(p->b + start, e - start, o, out_len, &at);
    if (why) return fail_at(p, start + at, why);
    p->pos = e + 1;
    *out = o;
    return MA_OK;
}

/* ------------------------------------------------------------------------------ numeric arrays */

typedef struct {
    double *v;
    size_t n, cap;
    int leaf;       /* depth of the arrays holding numbers (-1: none yet) */
    int deepest;    /* deepest array opened */
    int64_t dim[4]; /* length per depth (-1: not yet known) */
} numarr;

/* a rectangular array of numbers at p->pos; 1 parsed, 0 not such an array (p->pos unchanged
 * by the caller's rewind), -1 an error (budget, or a malformed number) */
static int numarr_level(parser *p, numarr *a, int d) {
    if (d >= 4) return 0;
    if (d > a->deepest) a->deepest = d;
    p->pos++; /* '[' */
    int64_t count = 0;
    ws(p);
    if (p->pos < p->len && p->b[p->pos] == ']') {
        p->pos++;
    } else {
        for (;;) {
            ws(p);
            if (p->pos >= p->len) return 0;
            const char c = p->b[p->pos];
            if (c == '[') {
                if (a->leaf >= 0 && a->leaf <= d) return 0;
                const int r = numarr_level(p, a, d + 1);
                if (r <= 0) return r;
            } else if (c == '-' || (c >= '0' && c <= '9')) {
                if (a->leaf >= 0 ? a->leaf != d : a->deepest != d) return 0;
                a->leaf = d;
                int ok;
                const double v = number(p, &ok);
                if (!ok) return 0; /* the general parser reports it */
                if (a->n == a->cap) {
                    /* doubling, but never past the numbers the rest of the text can hold (each
                     * takes two bytes at least) */
                    const size_t most = a->n + (p->len - p->pos) / 2 + 1;
                    const size_t cap = ma_grow_cap(a->cap, a->n + 1, 64, most);
                    if (charge(p, (cap - a->cap) * sizeof(double))) return -1;
                    double *nv = realloc(a->v, cap * sizeof(double));
                    if (!nv) {
                        p->over_budget = 1;
                        return -1;
                    }
                    a->v = nv;
                    a->cap = cap;
                }
                a->v[a->n++] = v;
            } else return 0;
            count++;
            ws(p);
            if (p->pos >= p->len) return 0;
            if (p->b[p->pos] == ',') {
                p->pos++;
                continue;
            }
            if (p->b[p->pos] == ']') {
                p->pos++;
                break;
            }
            return 0;
        }
    }
    if (a->dim[d] < 0) a->dim[d] = count;
    else if (a->dim[d] != count) return 0; /* ragged */
    return 1;
}

static ma_status value(parser *p, ma_jv *v, int depth);

static ma_status try_numarr(parser *p, ma_jv *v, int *done) {
    *done = 0;
    const size_t start = p->pos;
    const size_t used = p->j->used;
    numarr a = {NULL, 0, 0, -1, -1, {-1, -1, -1, -1}};
    const int r = numarr_level(p, &a, 0);
    if (r < 0) {
        free(a.v);
        return fail_budget(p);
    }
    const int ndim = a.leaf >= 0 ? a.leaf + 1 : a.deepest + 1;
    if (r == 0 || ndim < 1) { /* not a rectangular numeric array: the general parser takes it */
        free(a.v);
        p->j->used = used;
        p->pos = start;
        return MA_OK;
    }
    const size_t had = p->j->cap_arrays;
    if (ma_grow_array(&p->j->arrays, &p->j->cap_arrays, p->j->n_arrays, 1, sizeof *p->j->arrays) ||
        charge(p, (p->j->cap_arrays - had) * sizeof *p->j->arrays)) {
        free(a.v);
        return fail_budget(p);
    }
    p->j->arrays[p->j->n_arrays++] = a.v;
    v->kind = MA_JV_NUMARR;
    v->nums = a.v;
    v->ndim = ndim;
    v->count = a.n;
    for (int d = 0; d < ndim; d++) v->shape[d] = a.dim[d] < 0 ? 0 : a.dim[d];
    v->len = (size_t)v->shape[0];
    *done = 1;
    return MA_OK;
}

/* ------------------------------------------------------------------------------ values */

static ma_status value(parser *p, ma_jv *v, int depth) {
    ws(p);
    if (p->pos >= p->len) return fail_at(p, p->pos, "expected a value");
    if (depth > MAX_DEPTH) return fail_at(p, p->pos, "nested deeper than 32 levels");
    const char c = p->b[p->pos];
    ma_status s;
    if (c == '{' || c == '[') {
        if (c == '[') {
            int done;
            if ((s = try_numarr(p, v, &done)) || done) return s;
        }
        const char close = c == '{' ? '}' : ']';
        v->kind = c == '{' ? MA_JV_OBJ : MA_JV_ARR;
        p->pos++;
        ws(p);
        if (p->pos < p->len && p->b[p->pos] == close) {
            p->pos++;
            return MA_OK;
        }
        ma_jv **tail = &v->first;
        for (;;) {
            ma_jv *e = arena(p, sizeof *e);
            if (!e) return fail_budget(p);
            memset(e, 0, sizeof *e);
            if (v->kind == MA_JV_OBJ) {
                ws(p);
                if (p->pos >= p->len || p->b[p->pos] != '"') return fail_at(p, p->pos, "expected a member name (a string)");
                if ((s = string(p, &e->key, &e->key_len))) return s;
                ws(p);
                if (p->pos >= p->len || p->b[p->pos] != ':') return fail_at(p, p->pos, "expected ':' after a member name");
                p->pos++;
            }
            if ((s = value(p, e, depth + 1))) return s;
            *tail = e;
            tail = &e->next;
            v->len++;
            ws(p);
            if (p->pos >= p->len) return fail_at(p, p->pos, v->kind == MA_JV_OBJ ? "unterminated object" : "unterminated array");
            if (p->b[p->pos] == ',') {
                p->pos++;
                continue;
            }
            if (p->b[p->pos] == close) {
                p->pos++;
                return MA_OK;
            }
            return fail_at(p, p->pos, v->kind == MA_JV_OBJ ? "expected ',' or '}'" : "expected ',' or ']'");
        }
    }
    if (c == '"') {
        v->kind = MA_JV_STR;
        return string(p, &v->str, &v->len);
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        int ok;
        v->kind = MA_JV_NUM;
        v->num = number(p, &ok);
        return ok ? MA_OK : fail_at(p, p->pos, "a malformed number");
    }
    static const struct {
        const char *w;
        ma_jv_kind k;
        double n;
    } WORDS[] = {{"true", MA_JV_BOOL, 1}, {"false", MA_JV_BOOL, 0}, {"null", MA_JV_NULL, 0}};
    for (int i = 0; i < 3; i++) {
        const size_t n = strlen(WORDS[i].w);
        if (p->len - p->pos >= n && !memcmp(p->b + p->pos, WORDS[i].w, n)) {
            v->kind = WORDS[i].k;
            v->num = WORDS[i].n;
            p->pos += n;
            return MA_OK;
        }
    }
    return fail_at(p, p->pos, c == 'N' || c == 'I' ? "NaN and Infinity are not JSON" : "expected a value");
}

ma_status ma_json_parse(const char *buf, size_t len, size_t budget, ma_json **out, ma_error *err) {
    *out = NULL;
    if (err) err->code = MA_OK;
    ma_json *j = calloc(1, sizeof *j);
    if (!j) return ma_fail(err, MA_ERR_NOMEM, "request: out of memory");
    j->budget = budget;
    parser p = {buf, len, 0, j, err, 0};
    ma_status s = MA_OK;
    ma_jv *root = arena(&p, sizeof *root);
    if (!root) s = fail_budget(&p);
    else {
        memset(root, 0, sizeof *root);
        s = value(&p, root, 0);
    }
    if (!s) {
        ws(&p);
        if (p.pos != len)
            s = ma_fail(err, MA_ERR_FORMAT, "request: %zu bytes after the JSON value (at byte %zu); send one object per request",
                        len - p.pos, p.pos);
    }
    if (s) {
        ma_json_free(j);
        return s;
    }
    j->root = root;
    *out = j;
    return MA_OK;
}

const ma_jv *ma_json_root(const ma_json *j) { return j->root; }
size_t ma_json_used(const ma_json *j) { return j->used; }

void ma_json_free(ma_json *j) {
    if (!j) return;
    for (block *b = j->blocks, *n; b; b = n) {
        n = b->next;
        free(b);
    }
    for (size_t i = 0; i < j->n_arrays; i++) free(j->arrays[i]);
    free(j->arrays);
    free(j);
}
