/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L
#include "runtime/trace.h"

#include <stdlib.h>
#include <string.h>

#include "core/util.h"

void ma_trace_init(ma_trace *t) { memset(t, 0, sizeof *t); }

void ma_trace_free(ma_trace *t) {
    for (size_t i = 0; i < t->count; i++) {
        free(t->names[i]);
        ma_tensor_free(&t->tensors[i]);
    }
    free(t->names);
    free(t->tensors);
    memset(t, 0, sizeof *t);
}

ma_status ma_trace_add(ma_trace *t, const char *name, const ma_tensor *x, ma_error *err) {
    ma_tensor copy;
    ma_status s = ma_tensor_alloc(&copy, x->dtype, x->ndim, x->shape, err);
    if (s) return s;
    memcpy(copy.data, x->data, copy.nbytes);
    for (size_t i = 0; i < t->count; i++)
        if (!strcmp(t->names[i], name)) {
            ma_tensor_free(&t->tensors[i]);
            t->tensors[i] = copy;
            return MA_OK;
        }
    /* two arrays of one capacity: each grown on its own, the smaller capacity kept */
    size_t cap_names = t->cap, cap_tensors = t->cap;
    const int grown = !ma_grow_array(&t->names, &cap_names, t->count, 1, sizeof *t->names) &&
                      !ma_grow_array(&t->tensors, &cap_tensors, t->count, 1, sizeof *t->tensors);
    t->cap = cap_names < cap_tensors ? cap_names : cap_tensors;
    if (!grown) {
        ma_tensor_free(&copy);
        return ma_fail(err, MA_ERR_NOMEM, "trace: out of memory");
    }
    t->names[t->count] = strdup(name);
    if (!t->names[t->count]) {
        ma_tensor_free(&copy);
        return ma_fail(err, MA_ERR_NOMEM, "trace: out of memory");
    }
    t->tensors[t->count++] = copy;
    return MA_OK;
}

ma_status ma_trace_add_f32(ma_trace *t, const char *name, int ndim, const int64_t *shape, const float *data, ma_error *err) {
    ma_tensor v = ma_tensor_view(MA_DT_F32, ndim, shape, (void *)data);
    return ma_trace_add(t, name, &v, err);
}

const ma_tensor *ma_trace_get(const ma_trace *t, const char *name) {
    for (size_t i = 0; i < t->count; i++)
        if (!strcmp(t->names[i], name)) return &t->tensors[i];
    return NULL;
}
