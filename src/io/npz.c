/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L
#include "io/npz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "core/util.h"
#include "io/mapfile.h"

/* ------------------------------------------------------------------------------ npy header */

static const struct {
    const char *descr;
    ma_dtype dt;
} NPY_TYPES[] = {{"<f4", MA_DT_F32}, {"<f8", MA_DT_F64}, {"<f2", MA_DT_F16}, {"<i8", MA_DT_I64}, {"<i4", MA_DT_I32},
                 {"<i2", MA_DT_I16}, {"|i1", MA_DT_I8},  {"|u1", MA_DT_U8},  {"|b1", MA_DT_BOOL}};

static const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n')) p++;
    return p;
}

/* find 'key': in the dict text; returns pointer after the colon */
static const char *dict_value(const char *h, const char *end, const char *key) {
    size_t kl = strlen(key);
    for (const char *p = h; p + kl + 2 < end; p++) {
        if ((*p == '\'' || *p == '"') && p[kl + 1] == *p && memcmp(p + 1, key, kl) == 0) {
            const char *q = skip_ws(p + kl + 2, end);
            if (q >= end || *q != ':') return NULL;
            q = skip_ws(q + 1, end);
            return q < end ? q : NULL; /* a key right at the header's end has no value */
        }
    }
    return NULL;
}

ma_status ma_npy_parse(const uint8_t *buf, size_t len, const char *label, ma_tensor *out, ma_error *err) {
    memset(out, 0, sizeof *out);
    if (len < 10 || memcmp(buf, "\x93NUMPY", 6) != 0) return ma_fail(err, MA_ERR_FORMAT, "%s: not a .npy array (bad magic)", label);
    int major = buf[6];
    size_t hl, hstart;
    if (major == 1) {
        hl = (size_t)buf[8] | ((size_t)buf[9] << 8);
        hstart = 10;
    } else if (major == 2 || major == 3) {
        if (len < 12) return ma_fail(err, MA_ERR_FORMAT, "%s: truncated .npy header", label);
        hl = (size_t)buf[8] | ((size_t)buf[9] << 8) | ((size_t)buf[10] << 16) | ((size_t)buf[11] << 24);
        hstart = 12;
    } else return ma_fail(err, MA_ERR_FORMAT, "%s: unsupported .npy version %d", label, major);
    if (hl > len - hstart || hl > (1u << 20)) return ma_fail(err, MA_ERR_FORMAT, "%s: truncated .npy header", label);
    const char *h = (const char *)buf + hstart, *end = h + hl;
    const char *d = dict_value(h, end, "descr");
    const char *fo = dict_value(h, end, "fortran_order");
    const char *sh = dict_value(h, end, "shape");
    if (!d || !fo || !sh || (*d != '\'' && *d != '"'))
        return ma_fail(err, MA_ERR_FORMAT, "%s: .npy header lacks descr, fortran_order or shape", label);
    char descr[16];
    size_t dl = 0;
    const char *p = d + 1;
    while (p < end && *p != *d && dl < sizeof descr - 1) descr[dl++] = *p++;
    descr[dl] = '\0';
    if (p >= end || *p != *d) return ma_fail(err, MA_ERR_FORMAT, "%s: bad descr in .npy header", label);
    if (end - fo >= 4 && memcmp(fo, "True", 4) == 0)
        return ma_fail(err, MA_ERR_UNSUPPORTED, "%s: Fortran-ordered arrays are not supported", label);
    if (end - fo < 5 || memcmp(fo, "False", 5) != 0) return ma_fail(err, MA_ERR_FORMAT, "%s: bad fortran_order", label);
    ma_dtype dt = MA_DT_COUNT;
    size_t esz = 0;
    for (size_t i = 0; i < sizeof NPY_TYPES / sizeof NPY_TYPES[0]; i++)
        if (strcmp(descr, NPY_TYPES[i].descr) == 0) {
            dt = NPY_TYPES[i].dt;
            esz = ma_dtype_size(dt);
        }
    if (dt == MA_DT_COUNT && descr[0] == '<' && descr[1] == 'U' && descr[2]) {
        char *e;
        long w = strtol(descr + 2, &e, 10);
        if (*e == '\0' && w > 65536)
            return ma_fail(err, MA_ERR_RANGE, "%s: a string of %ld characters exceeds the limit of 65536", label, w);
        if (*e == '\0' && w > 0) {
            dt = MA_DT_STR32;
            esz = (size_t)w * 4;
        }
    }
    if (dt == MA_DT_COUNT) return ma_fail(err, MA_ERR_UNSUPPORTED, "%s: numpy dtype '%s' is not supported", label, descr);
    if (*sh != '(') return ma_fail(err, MA_ERR_FORMAT, "%s: bad shape in .npy header", label);
    int nd = 0;
    int64_t shape[MA_MAX_DIMS];
    p = sh + 1;
    for (;;) {
        p = skip_ws(p, end);
        if (p < end && *p == ')') break;
        if (p >= end || *p < '0' || *p > '9' || nd >= MA_MAX_DIMS)
            return ma_fail(err, MA_ERR_FORMAT, "%s: bad shape in .npy header", label);
        int64_t v = 0;
        while (p < end && *p >= '0' && *p <= '9') {
            if (v > (INT64_MAX - 9) / 10) return ma_fail(err, MA_ERR_FORMAT, "%s: shape overflows", label);
            v = v * 10 + (*p++ - '0');
        }
        shape[nd++] = v;
        p = skip_ws(p, end);
        if (p < end && *p == ',') p++;
    }
    int64_t n = ma_shape_numel(nd, shape);
    size_t nbytes;
    if (n < 0 || !ma_mul_size((size_t)n, esz, &nbytes)) return ma_fail(err, MA_ERR_FORMAT, "%s: shape overflows", label);
    size_t avail = len - hstart - hl;
    if (nbytes != avail) return ma_fail(err, MA_ERR_FORMAT, "%s: data is %zu bytes, shape and dtype need %zu", label, avail, nbytes);
    void *data = ma_malloc(nbytes ? nbytes : 1, 1, err, label);
    if (!data) return MA_ERR_NOMEM;
    memcpy(data, buf + hstart + hl, nbytes);
    out->dtype = dt;
    out->ndim = nd;
    memcpy(out->shape, shape, sizeof(int64_t) * (size_t)nd);
    out->data = data;
    out->nbytes = nbytes;
    out->elem_size = esz;
    out->owned = 1;
    return MA_OK;
}

/* ------------------------------------------------------------------------------ zip reading */

static uint32_t rd16(const uint8_t *p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 8); }
static uint32_t rd32(const uint8_t *p) { return rd16(p) | (rd16(p + 2) << 16); }
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | ((uint64_t)rd32(p + 4) << 32); }

void ma_npz_free(ma_npz *z) {
    if (!z) return;
    for (size_t i = 0; i < z->count; i++) {
        free(z->entries[i].name);
        ma_tensor_free(&z->entries[i].t);
    }
    free(z->entries);
    memset(z, 0, sizeof *z);
}

static ma_status inflate_entry(const uint8_t *src, size_t clen, uint8_t *dst, size_t ulen, const char *label, ma_error *err) {
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (inflateInit2(&zs, -MAX_WBITS) != Z_OK) return ma_fail(err, MA_ERR_NOMEM, "%s: zlib init failed", label);
    size_t in_done = 0, out_done = 0;
    int rc = Z_OK;
    while (rc == Z_OK) {
        size_t in_chunk = clen - in_done, out_chunk = ulen - out_done;
        if (in_chunk > (1u << 30)) in_chunk = 1u << 30;
        if (out_chunk > (1u << 30)) out_chunk = 1u << 30;
        zs.next_in = (Bytef *)(src + in_done);
        zs.avail_in = (uInt)in_chunk;
        zs.next_out = dst + out_done;
        zs.avail_out = (uInt)out_chunk;
        rc = inflate(&zs, Z_NO_FLUSH);
        in_done += in_chunk - zs.avail_in;
        out_done += out_chunk - zs.avail_out;
        if (rc == Z_OK && in_chunk == 0 && out_chunk == 0) break;
        if (rc == Z_BUF_ERROR && out_done == ulen) break;
    }
    inflateEnd(&zs);
    if (rc != Z_STREAM_END || out_done != ulen) return ma_fail(err, MA_ERR_FORMAT, "%s: corrupt deflate stream", label);
    return MA_OK;
}

ma_status ma_npz_parse(const uint8_t *buf, size_t len, const char *label, ma_npz *out, ma_error *err) {
    memset(out, 0, sizeof *out);
    if (len < 22) return ma_fail(err, MA_ERR_FORMAT, "%s: not a zip archive (too short)", label);
    /* end of central directory: search backwards over the comment */
    size_t eocd = (size_t)-1;
    size_t lowest = len > 22 + 65535 ? len - 22 - 65535 : 0;
    for (size_t i = len - 22 + 1; i-- > lowest;)
        if (rd32(buf + i) == 0x06054b50u) {
            eocd = i;
            break;
        }
    if (eocd == (size_t)-1) return ma_fail(err, MA_ERR_FORMAT, "%s: not a zip archive (no end record)", label);
    uint64_t n_entries = rd16(buf + eocd + 10);
    uint64_t cd_size = rd32(buf + eocd + 12), cd_off = rd32(buf + eocd + 16);
    if ((n_entries == 0xffff || cd_off == 0xffffffffu || cd_size == 0xffffffffu) && eocd >= 20 && rd32(buf + eocd - 20) == 0x07064b50u) {
        uint64_t z64 = rd64(buf + eocd - 20 + 8);
        if (len < 56 || z64 > len - 56 || rd32(buf + z64) != 0x06064b50u)
            return ma_fail(err, MA_ERR_FORMAT, "%s: bad zip64 end record", label);
        n_entries = rd64(buf + z64 + 32);
        cd_size = rd64(buf + z64 + 40);
        cd_off = rd64(buf + z64 + 48);
    }
    if (cd_off > len || cd_size > len - cd_off) return ma_fail(err, MA_ERR_FORMAT, "%s: central directory outside the file", label);
    if (n_entries > MA_NPZ_MAX_ENTRIES)
        return ma_fail(err, MA_ERR_FORMAT, "%s: %llu entries (max %d)", label, (unsigned long long)n_entries, MA_NPZ_MAX_ENTRIES);
    out->entries = ma_calloc(n_entries ? n_entries : 1, sizeof *out->entries, err, label);
    if (!out->entries) return MA_ERR_NOMEM;
    size_t p = (size_t)cd_off, cd_end = (size_t)(cd_off + cd_size);
    ma_status s = MA_OK;
    for (uint64_t e = 0; e < n_entries && s == MA_OK; e++) {
        if (p > cd_end || cd_end - p < 46 || rd32(buf + p) != 0x02014b50u) {
            s = ma_fail(err, MA_ERR_FORMAT, "%s: corrupt central directory", label);
            break;
        }
        uint32_t flags = rd16(buf + p + 8), method = rd16(buf + p + 10), crc = rd32(buf + p + 16);
        uint64_t csize = rd32(buf + p + 20), usize = rd32(buf + p + 24);
        size_t nl = rd16(buf + p + 28), xl = rd16(buf + p + 30), cl = rd16(buf + p + 32);
        uint64_t loff = rd32(buf + p + 42);
        if (cd_end - p - 46 < nl + xl + cl) {
            s = ma_fail(err, MA_ERR_FORMAT, "%s: corrupt central directory", label);
            break;
        }
        const uint8_t *name = buf + p + 46, *x = name + nl, *xend = x + xl;
        while (xend - x >= 4) { /* zip64 extended information */
            uint32_t id = rd16(x), sz = rd16(x + 2);
            if ((size_t)(xend - x - 4) < sz) break;
            if (id == 0x0001) {
                const uint8_t *q = x + 4, *qe = q + sz;
                if (usize == 0xffffffffu && qe - q >= 8) {
                    usize = rd64(q);
                    q += 8;
                }
                if (csize == 0xffffffffu && qe - q >= 8) {
                    csize = rd64(q);
                    q += 8;
                }
                if (loff == 0xffffffffu && qe - q >= 8) { loff = rd64(q); }
            }
            x += 4 + sz;
        }
        p += 46 + nl + xl + cl;
        if (flags & 1u) {
            s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: encrypted zip entries are not supported", label);
            break;
        }
        if (nl == 0 || nl > 1024) {
            s = ma_fail(err, MA_ERR_FORMAT, "%s: bad entry name", label);
            break;
        }
        char *ename = ma_malloc(nl + 1, 1, err, label);
        if (!ename) {
            s = MA_ERR_NOMEM;
            break;
        }
        memcpy(ename, name, nl);
        ename[nl] = '\0';
        if (memchr(ename, '\0', nl)) {
            free(ename);
            s = ma_fail(err, MA_ERR_FORMAT, "%s: bad entry name", label);
            break;
        }
        if (nl > 4 && strcmp(ename + nl - 4, ".npy") == 0) ename[nl - 4] = '\0';
        out->entries[out->count].name = ename;
        out->count++;
        if (usize > MA_NPZ_MAX_ENTRY) {
            s = ma_fail(err, MA_ERR_NOMEM, "%s: entry %s is %llu bytes (limit %llu)", label, ename, (unsigned long long)usize,
                        (unsigned long long)MA_NPZ_MAX_ENTRY);
            break;
        }
        if (loff > len || len - loff < 30 || rd32(buf + loff) != 0x04034b50u) {
            s = ma_fail(err, MA_ERR_FORMAT, "%s: entry %s: bad local header", label, ename);
            break;
        }
        size_t data_off = (size_t)loff + 30 + rd16(buf + loff + 26) + rd16(buf + loff + 28);
        if (data_off > len || csize > len - data_off) {
            s = ma_fail(err, MA_ERR_FORMAT, "%s: entry %s: data outside the file", label, ename);
            break;
        }
        const uint8_t *src = buf + data_off;
        uint8_t *raw = NULL;
        const uint8_t *img;
        if (method == 0) {
            if (csize != usize) {
                s = ma_fail(err, MA_ERR_FORMAT, "%s: entry %s: stored sizes differ", label, ename);
                break;
            }
            img = src;
        } else if (method == 8) {
            /* deflate expands at most 1032:1: a larger claim is a lie, refused before allocating */
            if (usize > csize * 1032 + 1024) {
                s = ma_fail(err, MA_ERR_FORMAT, "%s: entry %s: %llu bytes claimed from %llu compressed", label, ename,
                            (unsigned long long)usize, (unsigned long long)csize);
                break;
            }
            raw = ma_malloc(usize ? usize : 1, 1, err, label);
            if (!raw) {
                s = MA_ERR_NOMEM;
                break;
            }
            if ((s = inflate_entry(src, (size_t)csize, raw, (size_t)usize, ename, err))) {
                free(raw);
                break;
            }
            img = raw;
        } else {
            s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: entry %s: compression method %u (stored and deflate only)", label, ename, method);
            break;
        }
        uLong c = crc32(0L, Z_NULL, 0);
        for (size_t off = 0; off < usize;) {
            size_t chunk = usize - off > (1u << 30) ? (1u << 30) : (size_t)(usize - off);
            c = crc32(c, img + off, (uInt)chunk);
            off += chunk;
        }
        if ((uint32_t)c != crc) {
            free(raw);
            s = ma_fail(err, MA_ERR_FORMAT, "%s: entry %s: CRC mismatch", label, ename);
            break;
        }
        char elabel[1200];
        snprintf(elabel, sizeof elabel, "%s:%s", label, ename);
        s = ma_npy_parse(img, (size_t)usize, elabel, &out->entries[out->count - 1].t, err);
        free(raw);
    }
    for (size_t i = 0; s == MA_OK && i < out->count; i++)
        for (size_t j = 0; j < i; j++)
            if (strcmp(out->entries[i].name, out->entries[j].name) == 0) {
                s = ma_fail(err, MA_ERR_FORMAT, "%s: entry %s appears twice", label, out->entries[i].name);
                break;
            }
    if (s) ma_npz_free(out);
    return s;
}

ma_status ma_npz_read(const char *path, ma_npz *out, ma_error *err) {
    ma_mapfile m;
    memset(out, 0, sizeof *out);
    ma_status s = ma_map_file(&m, path, err);
    if (s) return s;
    s = ma_npz_parse(m.data, m.size, path, out, err);
    ma_unmap_file(&m);
    return s;
}

const ma_tensor *ma_npz_get(const ma_npz *z, const char *name) {
    for (size_t i = 0; i < z->count; i++)
        if (strcmp(z->entries[i].name, name) == 0) return &z->entries[i].t;
    return NULL;
}

/* ------------------------------------------------------------------------------ writing */

/* one tensor as .npy (malloc'd) */
static ma_status npy_serialize(const ma_tensor *t, uint8_t **out, size_t *len, ma_error *err) {
    const char *descr = NULL;
    char ubuf[16];
    for (size_t i = 0; i < sizeof NPY_TYPES / sizeof NPY_TYPES[0]; i++)
        if (NPY_TYPES[i].dt == t->dtype) descr = NPY_TYPES[i].descr;
    if (t->dtype == MA_DT_STR32) {
        snprintf(ubuf, sizeof ubuf, "<U%zu", t->elem_size / 4);
        descr = ubuf;
    }
    if (!descr) return ma_fail(err, MA_ERR_UNSUPPORTED, "dtype %s cannot be written to .npy", ma_dtype_name(t->dtype));
    char header[512];
    int n = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (int d = 0; d < t->ndim; d++)
        n += snprintf(header + n, sizeof header - (size_t)n, t->ndim == 1 ? "%lld," : (d ? ", %lld" : "%lld"), (long long)t->shape[d]);
    n += snprintf(header + n, sizeof header - (size_t)n, "), }");
    size_t total_h = (size_t)(10 + n + 1 + 63) / 64 * 64; /* pad so data starts 64-aligned */
    size_t hl = total_h - 10;
    size_t esz = t->dtype == MA_DT_STR32 ? t->elem_size : ma_dtype_size(t->dtype);
    size_t nb;
    int64_t numel = ma_tensor_numel(t);
    if (numel < 0 || !ma_mul_size((size_t)numel, esz, &nb)) return ma_fail(err, MA_ERR_SHAPE, "bad shape");
    uint8_t *buf = ma_malloc(total_h + nb, 1, err, "npy");
    if (!buf) return MA_ERR_NOMEM;
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (uint8_t)(hl & 0xff);
    buf[9] = (uint8_t)(hl >> 8);
    memcpy(buf + 10, header, (size_t)n);
    memset(buf + 10 + n, ' ', hl - (size_t)n - 1);
    buf[total_h - 1] = '\n';
    if (nb) memcpy(buf + total_h, t->data, nb);
    *out = buf;
    *len = total_h + nb;
    return MA_OK;
}

void ma_npz_writer_init(ma_npz_writer *w) { memset(w, 0, sizeof *w); }

void ma_npz_writer_free(ma_npz_writer *w) {
    for (size_t i = 0; i < w->count; i++) {
        free(w->names[i]);
        free(w->blobs[i]);
    }
    free(w->names);
    free(w->blobs);
    free(w->sizes);
    memset(w, 0, sizeof *w);
}

ma_status ma_npz_add(ma_npz_writer *w, const char *name, const ma_tensor *t, ma_error *err) {
    /* three arrays of one capacity: each grown on its own, the smallest capacity kept */
    size_t c_names = w->cap, c_blobs = w->cap, c_sizes = w->cap;
    const int grown = !ma_grow_array(&w->names, &c_names, w->count, 1, sizeof *w->names) &&
                      !ma_grow_array(&w->blobs, &c_blobs, w->count, 1, sizeof *w->blobs) &&
                      !ma_grow_array(&w->sizes, &c_sizes, w->count, 1, sizeof *w->sizes);
    w->cap = c_names < c_blobs ? c_names : c_blobs;
    if (c_sizes < w->cap) w->cap = c_sizes;
    if (!grown) return ma_fail(err, MA_ERR_NOMEM, "npz writer: out of memory");
    uint8_t *blob;
    size_t len;
    ma_status s = npy_serialize(t, &blob, &len, err);
    if (s) return ma_error_wrap(err, s, "npz entry %s", name);
    char *nm = strdup(name);
    if (!nm) {
        free(blob);
        return ma_fail(err, MA_ERR_NOMEM, "npz writer: out of memory");
    }
    w->names[w->count] = nm;
    w->blobs[w->count] = blob;
    w->sizes[w->count] = len;
    w->count++;
    return MA_OK;
}

ma_status ma_npz_add_f32(ma_npz_writer *w, const char *name, int ndim, const int64_t *shape, const float *data, ma_error *err) {
    ma_tensor t = ma_tensor_view(MA_DT_F32, ndim, shape, (void *)data);
    return ma_npz_add(w, name, &t, err);
}

static void put16(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v) {
    put16(p, v & 0xffff);
    put16(p + 2, v >> 16);
}

ma_status ma_npz_render(ma_npz_writer *w, int compress, uint8_t **out, size_t *out_len, ma_error *err) {
    const char *path = "npz";
    *out = NULL;
    *out_len = 0;
    /* worst case sizes: each entry data (deflate bound) + headers */
    size_t cap = 22;
    for (size_t i = 0; i < w->count; i++) {
        size_t nl = strlen(w->names[i]) + 4;
        size_t body = compress ? (size_t)compressBound((uLong)w->sizes[i]) + 64 : w->sizes[i];
        cap += 30 + 46 + 2 * nl + body;
        if (w->sizes[i] > 0xfffffff0u) return ma_fail(err, MA_ERR_UNSUPPORTED, "%s: entry %s exceeds 4 GiB", path, w->names[i]);
    }
    uint8_t *buf = ma_malloc(cap, 1, err, path);
    if (!buf) return MA_ERR_NOMEM;
    uint32_t *offsets = ma_calloc(w->count ? w->count : 1, sizeof *offsets, err, path);
    uint32_t *csizes = ma_calloc(w->count ? w->count : 1, sizeof *csizes, err, path);
    uint32_t *crcs = ma_calloc(w->count ? w->count : 1, sizeof *crcs, err, path);
    ma_status s = MA_OK;
    if (!offsets || !csizes || !crcs) {
        s = MA_ERR_NOMEM;
        goto out;
    }
    size_t pos = 0;
    for (size_t i = 0; i < w->count; i++) {
        char ename[1100];
        snprintf(ename, sizeof ename, "%s.npy", w->names[i]);
        size_t nl = strlen(ename);
        uint32_t crc = (uint32_t)crc32(crc32(0L, Z_NULL, 0), w->blobs[i], (uInt)w->sizes[i]);
        uint8_t *lh = buf + pos;
        size_t data_pos = pos + 30 + nl;
        size_t csize;
        if (compress) {
            z_stream zs;
            memset(&zs, 0, sizeof zs);
            if (deflateInit2(&zs, 6, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
                s = ma_fail(err, MA_ERR_NOMEM, "zlib init failed");
                goto out;
            }
            zs.next_in = w->blobs[i];
            zs.avail_in = (uInt)w->sizes[i];
            zs.next_out = buf + data_pos;
            zs.avail_out = (uInt)(cap - data_pos);
            int rc = deflate(&zs, Z_FINISH);
            csize = zs.total_out;
            deflateEnd(&zs);
            if (rc != Z_STREAM_END) {
                s = ma_fail(err, MA_ERR_FORMAT, "%s: deflate failed", path);
                goto out;
            }
        } else {
            memcpy(buf + data_pos, w->blobs[i], w->sizes[i]);
            csize = w->sizes[i];
        }
        put32(lh, 0x04034b50u);
        put16(lh + 4, 20);
        put16(lh + 6, 0);
        put16(lh + 8, compress ? 8 : 0);
        put16(lh + 10, 0); /* 1980-01-01 00:00: deterministic */
        put16(lh + 12, 0x21);
        put32(lh + 14, crc);
        put32(lh + 18, (uint32_t)csize);
        put32(lh + 22, (uint32_t)w->sizes[i]);
        put16(lh + 26, (uint32_t)nl);
        put16(lh + 28, 0);
        memcpy(lh + 30, ename, nl);
        offsets[i] = (uint32_t)pos;
        csizes[i] = (uint32_t)csize;
        crcs[i] = crc;
        pos = data_pos + csize;
    }
    size_t cd_start = pos;
    for (size_t i = 0; i < w->count; i++) {
        char ename[1100];
        snprintf(ename, sizeof ename, "%s.npy", w->names[i]);
        size_t nl = strlen(ename);
        uint8_t *c = buf + pos;
        memset(c, 0, 46);
        put32(c, 0x02014b50u);
        put16(c + 4, 20);
        put16(c + 6, 20);
        put16(c + 10, compress ? 8 : 0);
        put16(c + 14, 0x21);
        put32(c + 16, crcs[i]);
        put32(c + 20, csizes[i]);
        put32(c + 24, (uint32_t)w->sizes[i]);
        put16(c + 28, (uint32_t)nl);
        put32(c + 38, 0644u << 16);
        put32(c + 42, offsets[i]);
        memcpy(c + 46, ename, nl);
        pos += 46 + nl;
    }
    uint8_t *e = buf + pos;
    memset(e, 0, 22);
    put32(e, 0x06054b50u);
    put16(e + 8, (uint32_t)w->count);
    put16(e + 10, (uint32_t)w->count);
    put32(e + 12, (uint32_t)(pos - cd_start));
    put32(e + 16, (uint32_t)cd_start);
    pos += 22;
    if (pos > 0xffffffffu) {
        s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: archive exceeds 4 GiB", path);
        goto out;
    }
    *out = buf;
    *out_len = pos;
    buf = NULL;
out:
    free(offsets);
    free(csizes);
    free(crcs);
    free(buf);
    return s;
}

ma_status ma_npz_write(ma_npz_writer *w, const char *path, int compress, ma_error *err) {
    uint8_t *buf;
    size_t len;
    ma_status s = ma_npz_render(w, compress, &buf, &len, err);
    if (s) return ma_error_wrap(err, s, "%s", path);
    s = ma_write_file(path, buf, len, err);
    free(buf);
    return s;
}

ma_status ma_str32_to_utf8(const ma_tensor *t, int64_t index, char **out, ma_error *err) {
    *out = NULL;
    if (t->dtype != MA_DT_STR32) return ma_fail(err, MA_ERR_FORMAT, "not a string array");
    int64_t n = ma_tensor_numel(t);
    if (index < 0 || index >= n) return ma_fail(err, MA_ERR_RANGE, "string index out of range");
    size_t width = t->elem_size / 4;
    const uint8_t *p = (const uint8_t *)t->data + (size_t)index * t->elem_size;
    char *s = ma_malloc(width * 4 + 1, 1, err, "string");
    if (!s) return MA_ERR_NOMEM;
    size_t k = 0;
    for (size_t i = 0; i < width; i++) {
        uint32_t c = rd32(p + 4 * i);
        if (c == 0) break; /* numpy pads with NUL */
        if (c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) {
            free(s);
            return ma_fail(err, MA_ERR_FORMAT, "string has invalid code point U+%X", c);
        }
        k += ma_utf8_put(c, s + k);
    }
    s[k] = '\0';
    *out = s;
    return MA_OK;
}
