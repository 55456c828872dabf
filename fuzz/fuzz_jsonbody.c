/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer: the JSON body parser (server/json.h) under a small budget and a large one, then
 * the json_numpy decoder on what parses; every value the tree holds is visited, so ASan sees
 * any pointer into freed or unowned memory. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "expand.h"
#include "server/json.h"
#include "server/wire.h"

static size_t walk(const ma_jv *v, int depth) {
    size_t n = 1;
    if (depth > 40) __builtin_trap(); /* the parser bounds the depth at 32 */
    if (v->key) n += strlen(v->key) <= v->key_len;
    if (v->kind == MA_JV_STR) n += v->str[v->len] == '\0';
    if (v->kind == MA_JV_NUMARR) {
        size_t c = 1;
        for (int d = 0; d < v->ndim; d++) c *= (size_t)v->shape[d];
        if (c != v->count) __builtin_trap();
        for (size_t i = 0; i < v->count; i++) n += v->nums[i] == v->nums[i];
    }
    for (const ma_jv *e = v->first; e; e = e->next) n += walk(e, depth + 1);
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ma_error err;
    uint8_t *big = NULL; /* a recipe (expand.h): a body past the 4 MiB constant of the budget */
    if (size && data[0] == 0xc1) {
        big = fuzz_expand(data, size, &size);
        if (!big) return 0;
        data = big;
    }
    const size_t budgets[2] = {4096, 4 * size + 65536};
    for (int b = 0; b < 2; b++) {
        ma_json *j = NULL;
        if (ma_json_parse((const char *)data, size, budgets[b], &j, &err) == MA_OK) {
            if (ma_json_used(j) > budgets[b]) __builtin_trap();
            walk(ma_json_root(j), 0);
            ma_json_free(j);
        }
    }
    ma_wire_request r;
    const ma_wire_model m = {10, 32, 8, 10}; /* horizon, max_action_dim, state_dim, n_steps */
    if (ma_wire_decode_json((const char *)data, size, 0, &m, &r, &err) == MA_OK) ma_wire_request_free(&r);
    free(big);
    return 0;
}
