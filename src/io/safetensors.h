/* SPDX-License-Identifier: Apache-2.0 */
/* safetensors reader (mmap) and writer.
 *
 * File layout: u64 little-endian N, then N bytes of JSON header
 *   {"name": {"dtype": "F32"|"F16"|"BF16", "shape": [d0, ...], "data_offsets": [begin, end]},
 *    ..., "__metadata__": {string: string}}
 * then the data section; offsets are relative to its start. Tensors are row-major little-endian.
 *
 * The reader refuses: a truncated file, a header longer than the file or MA_ST_MAX_HEADER, bad
 * JSON, a malformed entry, dtypes other than F32/F16/BF16 (named), offsets outside the data
 * section, an offset span that does not match dtype x shape, overlapping tensors, data not
 * aligned to its element size, duplicate names. It never reads outside the mapping.
 *
 * A directory opens `model.safetensors`, or the shards listed by `model.safetensors.index.json`
 * (each tensor must be in the shard the index names, shard names must be plain file names).
 */
#ifndef MA_SAFETENSORS_H
#define MA_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/tensor.h"
#include "io/mapfile.h"

#define MA_ST_MAX_HEADER (100u * 1024u * 1024u)

typedef struct ma_st_tensor {
    char *name;
    ma_dtype dtype;
    int ndim;
    int64_t shape[MA_MAX_DIMS];
    const void *data;
    size_t nbytes;
    int file; /* index of the shard holding it */
} ma_st_tensor;

typedef struct ma_safetensors {
    ma_mapfile *files;
    int nfiles;
    ma_st_tensor *tensors; /* sorted by name */
    size_t count;
} ma_safetensors;

/* Validate one safetensors image in memory; tensors point into buf, names are malloc'd.
 * `label` names the file in messages. Free with ma_st_free_tensors. */
ma_status ma_st_parse(const uint8_t *buf, size_t len, const char *label, ma_st_tensor **out, size_t *count, ma_error *err);
void ma_st_free_tensors(ma_st_tensor *t, size_t count);

/* open a .safetensors file or a checkpoint directory (single file or sharded) */
ma_status ma_st_open(ma_safetensors *st, const char *path, ma_error *err);
const ma_st_tensor *ma_st_find(const ma_safetensors *st, const char *name);
void ma_st_close(ma_safetensors *st);

typedef struct ma_st_entry {
    const char *name;
    ma_dtype dtype; /* F32, F16 or BF16 */
    int ndim;
    const int64_t *shape;
    const void *data;
} ma_st_entry;

/* write entries (sorted by name in the header, header padded to 8 bytes) */
ma_status ma_st_write(const char *path, const ma_st_entry *entries, size_t n, ma_error *err);

#endif
