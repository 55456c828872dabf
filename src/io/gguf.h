/* SPDX-License-Identifier: Apache-2.0 */
/* GGUF v3 reader (mmap) and writer.
 *
 * Layout (little-endian):
 *   u32 magic "GGUF", u32 version (3), u64 n_tensors, u64 n_kv
 *   n_kv x { string key, u32 type, value }     string = u64 length + bytes (no NUL)
 *     types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool, 8 string,
 *            9 array (u32 elem type, u64 count, elems), 10 u64, 11 i64, 12 f64
 *   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset }
 *   padding to `general.alignment` (default 32), then the data section; each tensor's offset
 *   is relative to it and aligned. ne[0] is the fastest dimension (a PyTorch [N, K] matrix has
 *   ne = {K, N}).
 *   ggml types: 0 F32, 1 F16, 2 Q4_0, 8 Q8_0, 30 BF16. Q8_0 block (32 values) = f16 scale d +
 *   32 x int8 q, x = d*q. Q4_0 block = f16 d + 16 bytes; byte j holds value j (low nibble) and
 *   j+16 (high nibble), x = d*(nibble - 8).
 *
 * The reader refuses: bad magic or version, truncation anywhere, counts beyond limits, strings
 * longer than the file, nested arrays, unknown types, duplicate keys or tensor names, tensors
 * outside the data section, misaligned or overlapping tensors, rows that do not fill blocks.
 */
#ifndef MA_GGUF_H
#define MA_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "core/tensor.h"
#include "io/mapfile.h"

#define MA_GGUF_MAX_TENSORS (1u << 20)
#define MA_GGUF_MAX_KV (1u << 16)
#define MA_GGUF_MAX_DIMS 4

enum {
    MA_GGUF_U8 = 0,
    MA_GGUF_I8,
    MA_GGUF_U16,
    MA_GGUF_I16,
    MA_GGUF_U32,
    MA_GGUF_I32,
    MA_GGUF_F32,
    MA_GGUF_BOOL,
    MA_GGUF_STRING,
    MA_GGUF_ARRAY,
    MA_GGUF_U64,
    MA_GGUF_I64,
    MA_GGUF_F64
};
enum { MA_GGML_F32 = 0, MA_GGML_F16 = 1, MA_GGML_Q4_0 = 2, MA_GGML_Q8_0 = 8, MA_GGML_BF16 = 30 };

typedef struct ma_gguf_str {
    const char *p;
    uint64_t len;
} ma_gguf_str; /* not NUL-terminated */

typedef struct ma_gguf_kv {
    char *key;
    uint32_t type;
    union {
        uint64_t u;
        int64_t i;
        double f;
        int b;
        ma_gguf_str s;
    } v;
    uint32_t arr_type; /* for arrays */
    uint64_t arr_count;
    const uint8_t *arr_data; /* raw elements (strings: length-prefixed) */
} ma_gguf_kv;

typedef struct ma_gguf_tensor {
    char *name;
    uint32_t ggml_type;
    ma_dtype dtype;
    uint32_t n_dims;
    int64_t ne[MA_GGUF_MAX_DIMS];
    uint64_t offset;
    const void *data;
    size_t nbytes;
} ma_gguf_tensor;

typedef struct ma_gguf {
    ma_mapfile map;
    uint32_t version;
    ma_gguf_kv *kv;
    size_t n_kv;
    ma_gguf_tensor *tensors;
    size_t n_tensors;
    size_t alignment;
    size_t data_offset;
} ma_gguf;

ma_status ma_gguf_parse(const uint8_t *buf, size_t len, const char *label, ma_gguf *g, ma_error *err);
ma_status ma_gguf_open(ma_gguf *g, const char *path, ma_error *err);
void ma_gguf_close(ma_gguf *g);

const ma_gguf_kv *ma_gguf_find_kv(const ma_gguf *g, const char *key);
const ma_gguf_tensor *ma_gguf_find_tensor(const ma_gguf *g, const char *name);
/* typed getters: fail (naming the key) when missing or of another type; integers accept any
 * integer type whose value fits */
ma_status ma_gguf_get_i64(const ma_gguf *g, const char *key, int64_t *out, ma_error *err);
ma_status ma_gguf_get_f64(const ma_gguf *g, const char *key, double *out, ma_error *err);
ma_status ma_gguf_get_str(const ma_gguf *g, const char *key, char *out, size_t cap, ma_error *err);
ma_status ma_gguf_get_bool(const ma_gguf *g, const char *key, int *out, ma_error *err);
/* an array of integers into out[cap]; *n receives the count */
ma_status ma_gguf_get_i64_array(const ma_gguf *g, const char *key, int64_t *out, size_t cap, size_t *n, ma_error *err);

/* ---- writer: collect metadata and tensors (data pointers must stay valid until write) */
typedef struct ma_gguf_writer ma_gguf_writer;
ma_gguf_writer *ma_gguf_writer_new(void);
void ma_gguf_writer_free(ma_gguf_writer *w);
ma_status ma_gguf_set_u32(ma_gguf_writer *w, const char *key, uint32_t v, ma_error *err);
ma_status ma_gguf_set_i64(ma_gguf_writer *w, const char *key, int64_t v, ma_error *err);
ma_status ma_gguf_set_f32(ma_gguf_writer *w, const char *key, float v, ma_error *err);
ma_status ma_gguf_set_f64(ma_gguf_writer *w, const char *key, double v, ma_error *err);
ma_status ma_gguf_set_bool(ma_gguf_writer *w, const char *key, int v, ma_error *err);
ma_status ma_gguf_set_str(ma_gguf_writer *w, const char *key, const char *v, ma_error *err);
ma_status ma_gguf_set_i64_array(ma_gguf_writer *w, const char *key, const int64_t *v, size_t n, ma_error *err);
/* shape in PyTorch order (slowest first); stored reversed as ggml ne */
ma_status ma_gguf_add_tensor(ma_gguf_writer *w, const char *name, ma_dtype dt, int ndim, const int64_t *shape, const void *data,
                             ma_error *err);
/* the same with the data produced at write time: fill(ctx, dst, nbytes, err) writes the tensor's
 * bytes into a buffer the writer allocates for it and frees after writing it, so a file is
 * written with one tensor in memory at a time (molmoact compile at full size) */
typedef ma_status (*ma_gguf_fill_fn)(void *ctx, void *dst, size_t nbytes, ma_error *err);
ma_status ma_gguf_add_tensor_fill(ma_gguf_writer *w, const char *name, ma_dtype dt, int ndim, const int64_t *shape, ma_gguf_fill_fn fill,
                                  void *ctx, ma_error *err);
ma_status ma_gguf_write(ma_gguf_writer *w, const char *path, ma_error *err);

#endif
