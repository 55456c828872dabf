/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer: LeRobot async-inference payloads (server/pickle.h), pickles and PR #3048's JSON +
 * safetensors, on arbitrary bytes; a decoded tree is walked whole (shared values once per place,
 * which the decoder bounds). The input's floats also go through both reply writers and back,
 * which must give them bit for bit. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/pickle.h"

static size_t walk(const ma_pk *x, int depth) {
    if (depth > 64) abort(); /* the decoder's max_depth is 32 */
    size_t n = 1;
    switch (x->kind) {
    case MA_PK_STR:
    case MA_PK_BYTES: n += x->len ? (uint8_t)x->s[x->len - 1] & 1 : 0; break;
    case MA_PK_LIST:
    case MA_PK_TUPLE:
        for (size_t i = 0; i < x->n; i++) n += walk(x->items[i], depth + 1);
        break;
    case MA_PK_DICT:
        for (size_t i = 0; i < x->n; i++) n += walk(x->keys[i], depth + 1) + walk(x->items[i], depth + 1);
        break;
    case MA_PK_OBJECT:
        if (!x->cls) abort();
        if (x->state) n += walk(x->state, depth + 1);
        break;
    case MA_PK_ARRAY: {
        size_t count = 1;
        for (int k = 0; k < x->ndim; k++) count *= (size_t)x->shape[k];
        if (x->ndim < 0 || x->ndim > 8 || x->nbytes != count * ma_pk_dtype_size(x->dtype)) abort();
        if (x->nbytes) n += ((const uint8_t *)x->data)[x->nbytes - 1] & 1;
        break;
    }
    default: break;
    }
    return n;
}

static void roundtrip(const uint8_t *data, size_t size) {
    int dim = 1 + data[0] % 8, n = (int)((size - 1) / 4 / (size_t)dim);
    if (n > 8) n = 8; /* a few rows: the decoders are what is fuzzed */
    float *rows = malloc((size_t)n * (size_t)dim * 4 + 4);
    if (!rows) return;
    memcpy(rows, data + 1, (size_t)n * (size_t)dim * 4);
    const ma_pk_limits lim = {16u << 20, 32, 1u << 16};
    for (int safe = 0; safe < 2; safe++) {
        size_t len;
        uint8_t *p = (safe ? ma_pk_write_actions_safe : ma_pk_write_actions)(rows, n, dim, 1.5, 0.25, data[0], 1u << 24, &len);
        if (!p) abort();
        ma_pk_doc *d;
        ma_error err;
        if (ma_pk_decode(p, len, &lim, &d, &err) != MA_OK) abort();
        const ma_pk *r = ma_pk_root(d);
        if (r->kind != MA_PK_LIST || r->n != (size_t)n) abort();
        for (int i = 0; i < n; i++) {
            const ma_pk *a = ma_pk_attr(r->items[i], "action"), *s = ma_pk_attr(r->items[i], "timestep");
            if (!a || !s || s->i != data[0] + i || a->nbytes != (size_t)dim * 4 ||
                memcmp(a->data, rows + (size_t)i * (size_t)dim, a->nbytes))
                abort();
        }
        ma_pk_free(d);
        free(p);
    }
    free(rows);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const ma_pk_limits lim = {16u << 20, 32, 1u << 16};
    ma_pk_doc *d = NULL;
    ma_error err;
    if (ma_pk_decode(data, size, &lim, &d, &err) == MA_OK) {
        walk(ma_pk_root(d), 0);
        if (ma_pk_used(d) > lim.budget) abort();
        ma_pk_free(d);
    } else if (d || !err.msg[0]) {
        abort();
    }
    if (size > 1 && size < 4096) roundtrip(data, size);
    return 0;
}
