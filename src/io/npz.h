/* SPDX-License-Identifier: Apache-2.0 */
/* numpy .npy / .npz reader and writer.
 *
 * .npy: "\x93NUMPY", version (1|2|3).0, header length (u16 for v1, u32 after), a Python dict
 * literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with spaces, then
 * the raw C-order data. Supported descr: <f4 <f8 <f2 <i8 <i4 <i2 |i1 |u1 |b1 <U<n>.
 * .npz: a zip archive of NAME.npy entries, stored or deflated (zlib), zip64 extra fields read.
 *
 * The reader refuses truncated or inconsistent archives, CRC mismatches, entries larger than
 * MA_NPZ_MAX_ENTRY, more than MA_NPZ_MAX_ENTRIES entries, Fortran order, unknown dtypes and
 * data whose length does not match the shape. Arrays are copied out (owned tensors).
 */
#ifndef MA_NPZ_H
#define MA_NPZ_H

#include <stddef.h>
#include <stdint.h>

#include "core/tensor.h"

#define MA_NPZ_MAX_ENTRY (2ull << 30)
#define MA_NPZ_MAX_ENTRIES 4096

typedef struct ma_npz_entry {
    char *name; /* without the .npy suffix */
    ma_tensor t;
} ma_npz_entry;

typedef struct ma_npz {
    ma_npz_entry *entries;
    size_t count;
} ma_npz;

/* parse one .npy image into an owned tensor */
ma_status ma_npy_parse(const uint8_t *buf, size_t len, const char *label, ma_tensor *out, ma_error *err);
ma_status ma_npz_parse(const uint8_t *buf, size_t len, const char *label, ma_npz *out, ma_error *err);
ma_status ma_npz_read(const char *path, ma_npz *out, ma_error *err);
const ma_tensor *ma_npz_get(const ma_npz *z, const char *name);
void ma_npz_free(ma_npz *z);

/* Writer: collects arrays, then writes the archive (entries in insertion order). */
typedef struct ma_npz_writer {
    char **names;
    uint8_t **blobs; /* serialised .npy */
    size_t *sizes;
    size_t count, cap;
} ma_npz_writer;

void ma_npz_writer_init(ma_npz_writer *w);
/* copies the tensor's data; dtype must be a plain numpy type */
ma_status ma_npz_add(ma_npz_writer *w, const char *name, const ma_tensor *t, ma_error *err);
ma_status ma_npz_add_f32(ma_npz_writer *w, const char *name, int ndim, const int64_t *shape, const float *data, ma_error *err);
ma_status ma_npz_write(ma_npz_writer *w, const char *path, int compress, ma_error *err);
/* the archive in memory (malloc'd *out), for a caller that writes it itself */
ma_status ma_npz_render(ma_npz_writer *w, int compress, uint8_t **out, size_t *out_len, ma_error *err);
void ma_npz_writer_free(ma_npz_writer *w);

/* UTF-32 numpy string element i of a STR32 tensor as UTF-8 (malloc'd); invalid code points refused */
ma_status ma_str32_to_utf8(const ma_tensor *t, int64_t index, char **out, ma_error *err);

#endif
