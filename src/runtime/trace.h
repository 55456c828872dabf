/* SPDX-License-Identifier: Apache-2.0 */
/* A trace: named copies of intermediate tensors, for --dump and the parity tests. */
#ifndef MA_TRACE_H
#define MA_TRACE_H

#include "core/tensor.h"

typedef struct ma_trace {
    char **names;
    ma_tensor *tensors;
    size_t count, cap;
} ma_trace;

void ma_trace_init(ma_trace *t);
void ma_trace_free(ma_trace *t);
/* copy a tensor in under name (replacing an earlier one of that name) */
ma_status ma_trace_add(ma_trace *t, const char *name, const ma_tensor *x, ma_error *err);
ma_status ma_trace_add_f32(ma_trace *t, const char *name, int ndim, const int64_t *shape, const float *data, ma_error *err);
const ma_tensor *ma_trace_get(const ma_trace *t, const char *name);

#endif
