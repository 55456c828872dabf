/* SPDX-License-Identifier: Apache-2.0 */
/* Tensors: a dtype, up to MA_MAX_DIMS dimensions (row-major, last fastest) and a data pointer.
 * A tensor either owns its data (owned = 1, freed by ma_tensor_free) or views memory owned by
 * someone else (a mapped file, another tensor). */
#ifndef MA_TENSOR_H
#define MA_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

#define MA_MAX_DIMS 8

typedef enum {
    MA_DT_F32 = 0,
    MA_DT_F16,
    MA_DT_BF16,
    MA_DT_F64,
    MA_DT_I64,
    MA_DT_I32,
    MA_DT_I16,
    MA_DT_I8,
    MA_DT_U8,
    MA_DT_BOOL,
    MA_DT_Q8_0,  /* ggml block: f16 scale + 32 x int8 */
    MA_DT_Q4_0,  /* ggml block: f16 scale + 16 bytes of 4-bit values (offset 8) */
    MA_DT_STR32, /* numpy '<U' fixed-width UTF-32 strings; elem_size holds the width in bytes */
    MA_DT_COUNT
} ma_dtype;

typedef struct ma_tensor {
    ma_dtype dtype;
    int ndim;
    int64_t shape[MA_MAX_DIMS];
    void *data;
    size_t nbytes;
    size_t elem_size; /* bytes per element (0 for block types) */
    int owned;
} ma_tensor;

const char *ma_dtype_name(ma_dtype dt);
/* bytes per element for plain types, 0 for block-quantised types */
size_t ma_dtype_size(ma_dtype dt);
/* elements per block and bytes per block (1 and elem size for plain types) */
void ma_dtype_block(ma_dtype dt, int64_t *block_elems, size_t *block_bytes);

/* number of elements; -1 if a dimension is negative or the product overflows */
int64_t ma_shape_numel(int ndim, const int64_t *shape);
/* bytes needed for ndim/shape in dtype (last dim must fill whole blocks); 0 on error */
ma_status ma_shape_nbytes(ma_dtype dt, int ndim, const int64_t *shape, size_t *out, ma_error *err);

/* allocate an owned, zero-filled tensor */
ma_status ma_tensor_alloc(ma_tensor *t, ma_dtype dt, int ndim, const int64_t *shape, ma_error *err);
ma_status ma_tensor_alloc2(ma_tensor *t, ma_dtype dt, int64_t d0, int64_t d1, ma_error *err);
/* a non-owning view */
ma_tensor ma_tensor_view(ma_dtype dt, int ndim, const int64_t *shape, void *data);
void ma_tensor_free(ma_tensor *t);
int64_t ma_tensor_numel(const ma_tensor *t);
/* "[2, 729, 588]" */
const char *ma_shape_str(const ma_tensor *t, char *buf, size_t cap);
/* check dtype and shape; dims < 0 in `want` match anything. Names the tensor on failure. */
ma_status ma_tensor_expect(const ma_tensor *t, const char *name, ma_dtype dt, int ndim, const int64_t *want, ma_error *err);

#endif
