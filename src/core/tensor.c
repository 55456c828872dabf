/* SPDX-License-Identifier: Apache-2.0 */
#include "core/tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    size_t size;
    int64_t block;
    size_t block_bytes;
} DT[MA_DT_COUNT] = {
    [MA_DT_F32] = {"f32", 4, 1, 4},     [MA_DT_F16] = {"f16", 2, 1, 2},     [MA_DT_BF16] = {"bf16", 2, 1, 2},
    [MA_DT_F64] = {"f64", 8, 1, 8},     [MA_DT_I64] = {"i64", 8, 1, 8},     [MA_DT_I32] = {"i32", 4, 1, 4},
    [MA_DT_I16] = {"i16", 2, 1, 2},     [MA_DT_I8] = {"i8", 1, 1, 1},       [MA_DT_U8] = {"u8", 1, 1, 1},
    [MA_DT_BOOL] = {"bool", 1, 1, 1},   [MA_DT_Q8_0] = {"q8_0", 0, 32, 34}, [MA_DT_Q4_0] = {"q4_0", 0, 32, 18},
    [MA_DT_STR32] = {"str32", 0, 1, 0},
};

const char *ma_dtype_name(ma_dtype dt) { return (unsigned)dt < MA_DT_COUNT ? DT[dt].name : "?"; }
size_t ma_dtype_size(ma_dtype dt) { return (unsigned)dt < MA_DT_COUNT ? DT[dt].size : 0; }

void ma_dtype_block(ma_dtype dt, int64_t *block_elems, size_t *block_bytes) {
    *block_elems = (unsigned)dt < MA_DT_COUNT ? DT[dt].block : 1;
    *block_bytes = (unsigned)dt < MA_DT_COUNT ? DT[dt].block_bytes : 0;
}

int64_t ma_shape_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return -1;
        if (shape[i] != 0 && n > INT64_MAX / shape[i]) return -1;
        n *= shape[i];
    }
    return n;
}

ma_status ma_shape_nbytes(ma_dtype dt, int ndim, const int64_t *shape, size_t *out, ma_error *err) {
    if (ndim < 0 || ndim > MA_MAX_DIMS) return ma_fail(err, MA_ERR_SHAPE, "%d dimensions (max %d)", ndim, MA_MAX_DIMS);
    int64_t n = ma_shape_numel(ndim, shape);
    if (n < 0) return ma_fail(err, MA_ERR_SHAPE, "negative or overflowing shape");
    int64_t be;
    size_t bb;
    ma_dtype_block(dt, &be, &bb);
    if (bb == 0) return ma_fail(err, MA_ERR_ARG, "dtype %s has no fixed size", ma_dtype_name(dt));
    if (be > 1 && (ndim == 0 || shape[ndim - 1] % be != 0))
        return ma_fail(err, MA_ERR_SHAPE, "last dimension must be a multiple of %lld for %s", (long long)be, ma_dtype_name(dt));
    if (!ma_mul_size((size_t)(n / be), bb, out)) return ma_fail(err, MA_ERR_SHAPE, "tensor size overflows");
    return MA_OK;
}

ma_status ma_tensor_alloc(ma_tensor *t, ma_dtype dt, int ndim, const int64_t *shape, ma_error *err) {
    memset(t, 0, sizeof *t);
    size_t nb;
    ma_status s = ma_shape_nbytes(dt, ndim, shape, &nb, err);
    if (s) return s;
    void *p = ma_calloc(1, nb, err, "tensor");
    if (!p) return MA_ERR_NOMEM;
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->data = p;
    t->nbytes = nb;
    t->elem_size = ma_dtype_size(dt);
    t->owned = 1;
    return MA_OK;
}

ma_status ma_tensor_alloc2(ma_tensor *t, ma_dtype dt, int64_t d0, int64_t d1, ma_error *err) {
    int64_t shape[2] = {d0, d1};
    return ma_tensor_alloc(t, dt, 2, shape, err);
}

ma_tensor ma_tensor_view(ma_dtype dt, int ndim, const int64_t *shape, void *data) {
    ma_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.ndim = ndim;
    for (int i = 0; i < ndim && i < MA_MAX_DIMS; i++) t.shape[i] = shape[i];
    t.data = data;
    t.elem_size = ma_dtype_size(dt);
    size_t nb = 0;
    if (ma_shape_nbytes(dt, ndim, shape, &nb, NULL) == MA_OK) t.nbytes = nb;
    return t;
}

void ma_tensor_free(ma_tensor *t) {
    if (!t) return;
    if (t->owned) free(t->data);
    memset(t, 0, sizeof *t);
}

int64_t ma_tensor_numel(const ma_tensor *t) { return ma_shape_numel(t->ndim, t->shape); }

const char *ma_shape_str(const ma_tensor *t, char *buf, size_t cap) {
    size_t n = 0;
    n += (size_t)snprintf(buf + n, cap - n, "[");
    for (int i = 0; i < t->ndim && n < cap; i++) n += (size_t)snprintf(buf + n, cap - n, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

ma_status ma_tensor_expect(const ma_tensor *t, const char *name, ma_dtype dt, int ndim, const int64_t *want, ma_error *err) {
    char have[128];
    if (!t || !t->data) return ma_fail(err, MA_ERR_ARG, "%s: missing", name);
    if (t->dtype != dt) return ma_fail(err, MA_ERR_FORMAT, "%s: dtype %s, expected %s", name, ma_dtype_name(t->dtype), ma_dtype_name(dt));
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = want[i] < 0 || want[i] == t->shape[i];
    if (!ok) {
        char exp[128];
        size_t n = 0;
        n += (size_t)snprintf(exp + n, sizeof exp - n, "[");
        for (int i = 0; i < ndim && n < sizeof exp; i++)
            n += (size_t)(want[i] < 0 ? snprintf(exp + n, sizeof exp - n, i ? ", *" : "*")
                                      : snprintf(exp + n, sizeof exp - n, i ? ", %lld" : "%lld", (long long)want[i]));
        if (n < sizeof exp) snprintf(exp + n, sizeof exp - n, "]");
        return ma_fail(err, MA_ERR_SHAPE, "%s: shape %s, expected %s", name, ma_shape_str(t, have, sizeof have), exp);
    }
    return MA_OK;
}
