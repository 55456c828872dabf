/* SPDX-License-Identifier: Apache-2.0 */
#include "model/image.h"

#include <stdio.h> /* before jpeglib.h, which uses FILE */
#include <jpeglib.h>
#include <math.h>
#include <png.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>

#include "io/mapfile.h"

void ma_image_free(ma_image *im) {
    if (!im) return;
    free(im->rgb);
    memset(im, 0, sizeof *im);
}

static ma_status check_size(int64_t h, int64_t w, const char *label, ma_error *err) {
    if (h <= 0 || w <= 0) return ma_fail(err, MA_ERR_FORMAT, "%s: image is empty (%lld x %lld)", label, (long long)h, (long long)w);
    if (h > MA_IMAGE_MAX_SIDE || w > MA_IMAGE_MAX_SIDE || (uint64_t)h * (uint64_t)w > MA_IMAGE_MAX_PIXELS)
        return ma_fail(err, MA_ERR_RANGE, "%s: image %lld x %lld exceeds the %u-pixel limit", label, (long long)h, (long long)w,
                       MA_IMAGE_MAX_PIXELS);
    return MA_OK;
}

/* ------------------------------------------------------------------------------ PNG */

typedef struct {
    const uint8_t *p;
    size_t len, at;
} png_src;
typedef struct {
    jmp_buf jb;
    char msg[200];
} png_err;

static void png_read_mem(png_structp png, png_bytep out, png_size_t n) {
    png_src *s = png_get_io_ptr(png);
    if (n > s->len - s->at) png_error(png, "truncated PNG data");
    memcpy(out, s->p + s->at, n);
    s->at += n;
}
static void png_on_error(png_structp png, png_const_charp msg) {
    png_err *e = png_get_error_ptr(png);
    snprintf(e->msg, sizeof e->msg, "%s", msg);
    longjmp(e->jb, 1);
}
static void png_on_warning(png_structp png, png_const_charp msg) {
    (void)png;
    (void)msg;
}

static ma_status decode_png(const uint8_t *buf, size_t len, const char *label, ma_image *out, ma_error *err) {
    /* the size from IHDR first, so an oversized image gets the same message as a JPEG does
     * (libpng's own limit would call it "Invalid IHDR data") */
    if (len >= 24 && !memcmp(buf + 12, "IHDR", 4)) {
        const uint32_t w = (uint32_t)buf[16] << 24 | (uint32_t)buf[17] << 16 | (uint32_t)buf[18] << 8 | buf[19];
        const uint32_t h = (uint32_t)buf[20] << 24 | (uint32_t)buf[21] << 16 | (uint32_t)buf[22] << 8 | buf[23];
        ma_status s = check_size(h, w, label, err);
        if (s) return s;
    }
    png_err pe;
    pe.msg[0] = '\0';
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &pe, png_on_error, png_on_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!png || !info) {
        png_destroy_read_struct(&png, &info, NULL);
        return ma_fail(err, MA_ERR_NOMEM, "%s: cannot initialise libpng", label);
    }
    png_src src = {buf, len, 0};
    uint8_t *volatile rgb = NULL;
    png_bytep *volatile rows = NULL;
    if (setjmp(pe.jb)) {
        free(rgb);
        free(rows);
        png_destroy_read_struct(&png, &info, NULL);
        return ma_fail(err, MA_ERR_FORMAT, "%s: corrupt PNG: %s", label, pe.msg);
    }
    png_set_read_fn(png, &src, png_read_mem);
    png_set_user_limits(png, MA_IMAGE_MAX_SIDE, MA_IMAGE_MAX_SIDE);
    png_read_info(png, info);
    png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    ma_status s = check_size(h, w, label, err);
    if (s) {
        png_destroy_read_struct(&png, &info, NULL);
        return s;
    }
    int ct = png_get_color_type(png, info);
    png_set_expand(png);   /* palette -> RGB, gray < 8 bits -> 8, tRNS -> alpha */
    png_set_strip_16(png); /* 16-bit samples keep their high byte */
    if (ct == PNG_COLOR_TYPE_GRAY || ct == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
    png_set_strip_alpha(png); /* as PIL's convert("RGB"): alpha dropped, not composited */
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    if (png_get_rowbytes(png, info) != (size_t)w * 3) png_error(png, "unexpected row layout");
    rgb = malloc((size_t)w * h * 3);
    rows = malloc(sizeof(png_bytep) * h);
    if (!rgb || !rows) png_error(png, "out of memory");
    for (png_uint_32 y = 0; y < h; y++) rows[y] = rgb + (size_t)y * w * 3;
    png_read_image(png, rows);
    png_read_end(png, NULL);
    png_destroy_read_struct(&png, &info, NULL);
    free(rows);
    out->h = (int)h;
    out->w = (int)w;
    out->rgb = rgb;
    return MA_OK;
}

/* ------------------------------------------------------------------------------ JPEG */

typedef struct {
    struct jpeg_error_mgr mgr;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
} jpg_err;

static void jpg_on_error(j_common_ptr ci) {
    jpg_err *e = (jpg_err *)ci->err;
    (*ci->err->format_message)(ci, e->msg);
    longjmp(e->jb, 1);
}
static void jpg_on_message(j_common_ptr ci, int level) {
    if (level < 0) ci->err->num_warnings++; /* corrupt-data warnings, e.g. premature end of file */
}

/* A progressive JPEG may hold any number of scans, each a pass over every block: 4,000 scans that
 * each skip every block by end-of-band runs (101 bytes a scan, a 535 KB file) held the inference
 * thread 64 s (an attacker review). Encoders write about 10 (libjpeg's jpeg_simple_progression:
 * 10 for colour, 6 for grey); past MA_JPEG_MAX_SCANS the image is refused, as libjpeg-turbo's
 * djpeg -maxscans does, from its progress monitor. */
#define MA_JPEG_MAX_SCANS 64

static void jpg_on_progress(j_common_ptr ci) {
    const j_decompress_ptr d = (j_decompress_ptr)ci;
    if (ci->is_decompressor && d->input_scan_number > MA_JPEG_MAX_SCANS) {
        jpg_err *e = (jpg_err *)ci->err;
        snprintf(e->msg, sizeof e->msg, "more than %d scans", MA_JPEG_MAX_SCANS);
        longjmp(e->jb, 1);
    }
}

static ma_status decode_jpeg(const uint8_t *buf, size_t len, const char *label, ma_image *out, ma_error *err) {
    struct jpeg_decompress_struct ci;
    struct jpeg_progress_mgr progress = {.progress_monitor = jpg_on_progress};
    jpg_err je;
    ci.err = jpeg_std_error(&je.mgr);
    je.mgr.error_exit = jpg_on_error;
    je.mgr.emit_message = jpg_on_message;
    uint8_t *volatile rgb = NULL;
    if (setjmp(je.jb)) {
        jpeg_destroy_decompress(&ci);
        free(rgb);
        return ma_fail(err, MA_ERR_FORMAT, "%s: corrupt JPEG: %s", label, je.msg);
    }
    jpeg_create_decompress(&ci);
    ci.progress = &progress;
    jpeg_mem_src(&ci, buf, (unsigned long)len);
    jpeg_read_header(&ci, TRUE);
    if (ci.jpeg_color_space == JCS_CMYK || ci.jpeg_color_space == JCS_YCCK) {
        jpeg_destroy_decompress(&ci);
        return ma_fail(err, MA_ERR_UNSUPPORTED, "%s: CMYK JPEG images are not supported", label);
    }
    ma_status s = check_size(ci.image_height, ci.image_width, label, err);
    if (s) {
        jpeg_destroy_decompress(&ci);
        return s;
    }
    ci.out_color_space = JCS_RGB; /* grayscale is replicated by libjpeg */
    jpeg_start_decompress(&ci);
    if (ci.output_components != 3) {
        jpeg_destroy_decompress(&ci);
        return ma_fail(err, MA_ERR_FORMAT, "%s: JPEG did not decode to RGB", label);
    }
    size_t stride = (size_t)ci.output_width * 3;
    rgb = malloc(stride * ci.output_height);
    if (!rgb) {
        jpeg_destroy_decompress(&ci);
        return ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", label);
    }
    while (ci.output_scanline < ci.output_height) {
        JSAMPROW row = rgb + stride * ci.output_scanline;
        jpeg_read_scanlines(&ci, &row, 1);
    }
    jpeg_finish_decompress(&ci);
    if (je.mgr.num_warnings > 0) {
        jpeg_destroy_decompress(&ci);
        free(rgb);
        return ma_fail(err, MA_ERR_FORMAT, "%s: corrupt or truncated JPEG data", label);
    }
    out->h = (int)ci.output_height;
    out->w = (int)ci.output_width;
    jpeg_destroy_decompress(&ci);
    out->rgb = rgb;
    return MA_OK;
}

ma_status ma_image_decode(const uint8_t *buf, size_t len, const char *label, ma_image *out, ma_error *err) {
    memset(out, 0, sizeof *out);
    if (len >= 8 && !memcmp(buf, "\x89PNG\r\n\x1a\n", 8)) return decode_png(buf, len, label, out, err);
    if (len >= 3 && buf[0] == 0xff && buf[1] == 0xd8 && buf[2] == 0xff) return decode_jpeg(buf, len, label, out, err);
    return ma_fail(err, MA_ERR_UNSUPPORTED, "%s: not a PNG or JPEG image", label);
}

ma_status ma_image_load(const char *path, ma_image *out, ma_error *err) {
    ma_mapfile m;
    memset(out, 0, sizeof *out);
    ma_status s = ma_map_file(&m, path, err);
    if (s) return s;
    s = ma_image_decode(m.data, m.size, path, out, err);
    ma_unmap_file(&m);
    return s;
}

/* ------------------------------------------------------------------------------ raw arrays */

/* element i of a float32 or float64 tensor; the data may be unaligned (a view into a msgpack
 * message), so it is read with memcpy */
static double float_at(const ma_tensor *t, int64_t i) {
    if (t->dtype == MA_DT_F32) {
        float f;
        memcpy(&f, (const unsigned char *)t->data + (size_t)i * sizeof f, sizeof f);
        return f;
    }
    double d;
    memcpy(&d, (const unsigned char *)t->data + (size_t)i * sizeof d, sizeof d);
    return d;
}

ma_status ma_image_from_tensor(const ma_tensor *t, const char *label, ma_image *out, ma_error *err) {
    memset(out, 0, sizeof *out);
    if (t->dtype != MA_DT_U8 && t->dtype != MA_DT_F32 && t->dtype != MA_DT_F64)
        return ma_fail(err, MA_ERR_FORMAT, "%s: image dtype %s (uint8 or float)", label, ma_dtype_name(t->dtype));
    int64_t h, w, c;
    int chw = 0;
    if (t->ndim == 2) {
        h = t->shape[0];
        w = t->shape[1];
        c = 1;
    } else if (t->ndim == 3) {
        h = t->shape[0];
        w = t->shape[1];
        c = t->shape[2];
        int64_t c0 = t->shape[0];
        if ((c0 == 1 || c0 == 3 || c0 == 4) && !(c == 1 || c == 3 || c == 4)) {
            chw = 1;
            c = c0;
            h = t->shape[1];
            w = t->shape[2];
        }
    } else return ma_fail(err, MA_ERR_SHAPE, "%s: image must be [H, W] or [H, W, C], got %d dims", label, t->ndim);
    if (c != 1 && c != 3 && c != 4) return ma_fail(err, MA_ERR_SHAPE, "%s: image has %lld channels (1, 3 or 4)", label, (long long)c);
    ma_status s = check_size(h, w, label, err);
    if (s) return s;
    const int64_t n = h * w;
    /* float frames: scaled by 255 when max <= 1, then clipped and truncated */
    double scale = 1.0;
    if (t->dtype != MA_DT_U8) {
        double mx = -INFINITY;
        for (int64_t i = 0; i < n * c; i++) {
            const double v = float_at(t, i);
            if (!isfinite(v)) return ma_fail(err, MA_ERR_RANGE, "%s: image has NaN or infinite values", label);
            if (v > mx) mx = v;
        }
        if (mx <= 1.0) scale = 255.0;
    }
    uint8_t *rgb = ma_malloc((size_t)n * 3, 1, err, label);
    if (!rgb) return MA_ERR_NOMEM;
    for (int64_t p = 0; p < n; p++)
        for (int ch = 0; ch < 3; ch++) {
            int64_t src_c = c == 1 ? 0 : ch;
            int64_t idx = chw ? src_c * n + p : p * c + src_c;
            uint8_t u;
            if (t->dtype == MA_DT_U8) u = ((const uint8_t *)t->data)[idx];
            else {
                double v = float_at(t, idx) * scale;
                if (t->dtype == MA_DT_F32) v = (double)(float)v; /* numpy scales float32 in float32 */
                v = v < 0 ? 0 : (v > 255 ? 255 : v);
                u = (uint8_t)v;
            }
            rgb[p * 3 + ch] = u;
        }
    out->h = (int)h;
    out->w = (int)w;
    out->rgb = rgb;
    return MA_OK;
}

/* ------------------------------------------------------------------------------ resize */

/* ATen's linear taps: the source coordinate scale * (dst + 0.5) - 0.5 is evaluated in double
 * (float scale), clamped at 0 and truncated; lambda1 = (float)(src - i0), lambda0 = 1 - lambda1 in
 * float; i1 = i0 + (i0 < in - 1) */
static void linear_taps(int in, int out, int *i0, int *i1, float *l0, float *l1) {
    const float scale = (float)in / (float)out;
    for (int d = 0; d < out; d++) {
        double src = (double)scale * ((double)d + 0.5) - 0.5;
        if (src < 0.0) src = 0.0;
        int a = (int)src;
        double lam = src - (double)a;
        lam = lam < 0.0 ? 0.0 : (lam > 1.0 ? 1.0 : lam);
        i0[d] = a;
        i1[d] = a + (a < in - 1 ? 1 : 0);
        l1[d] = (float)lam;
        l0[d] = 1.0f - l1[d];
    }
}

/* torch's channels-last bilinear kernel (an HWC uint8 frame permuted to CHW is channels-last):
 * float corner weights w_ij = wy_i * wx_j, the four products summed and rounded once; then
 * torchvision rounds half to even and casts back to uint8. Verified bit-exact against torch. */
void ma_resize_bilinear_u8(const uint8_t *in, int h, int w, uint8_t *out, int oh, int ow) {
    int *y0 = malloc(sizeof(int) * oh), *y1 = malloc(sizeof(int) * oh), *x0 = malloc(sizeof(int) * ow), *x1 = malloc(sizeof(int) * ow);
    float *wy0 = malloc(sizeof(float) * oh), *wy1 = malloc(sizeof(float) * oh), *wx0 = malloc(sizeof(float) * ow),
          *wx1 = malloc(sizeof(float) * ow);
    if (!y0 || !y1 || !x0 || !x1 || !wy0 || !wy1 || !wx0 || !wx1) goto done;
    linear_taps(h, oh, y0, y1, wy0, wy1);
    linear_taps(w, ow, x0, x1, wx0, wx1);
    for (int y = 0; y < oh; y++)
        for (int x = 0; x < ow; x++) {
            const float w00 = wy0[y] * wx0[x], w01 = wy0[y] * wx1[x], w10 = wy1[y] * wx0[x], w11 = wy1[y] * wx1[x];
            const uint8_t *p00 = in + ((size_t)y0[y] * w + x0[x]) * 3, *p01 = in + ((size_t)y0[y] * w + x1[x]) * 3;
            const uint8_t *p10 = in + ((size_t)y1[y] * w + x0[x]) * 3, *p11 = in + ((size_t)y1[y] * w + x1[x]) * 3;
            for (int c = 0; c < 3; c++) {
                double v = (double)w00 * p00[c] + (double)w01 * p01[c] + (double)w10 * p10[c] + (double)w11 * p11[c];
                float r = nearbyintf((float)v);
                out[((size_t)y * ow + x) * 3 + c] = (uint8_t)(r < 0.0f ? 0.0f : (r > 255.0f ? 255.0f : r));
            }
        }
done:
    free(y0);
    free(y1);
    free(x0);
    free(x1);
    free(wy0);
    free(wy1);
    free(wx0);
    free(wx1);
}

ma_status ma_preprocess_image(const ma_config *cfg, const ma_image *im, float *pixels, uint8_t *resized, ma_error *err) {
    const int H = cfg->image_h, W = cfg->image_w, p = cfg->patch;
    uint8_t *r = resized ? resized : ma_malloc((size_t)H * W * 3, 1, err, "resized image");
    if (!r) return MA_ERR_NOMEM;
    ma_resize_bilinear_u8(im->rgb, im->h, im->w, r, H, W);
    const int ph = H / p, pw = W / p, pp = 3 * p * p;
    for (int py = 0; py < ph; py++)
        for (int px = 0; px < pw; px++) {
            float *dst = pixels + ((size_t)py * pw + px) * pp;
            for (int dy = 0; dy < p; dy++)
                for (int dx = 0; dx < p; dx++)
                    for (int c = 0; c < 3; c++) {
                        uint8_t u = r[((size_t)(py * p + dy) * W + (px * p + dx)) * 3 + c];
                        *dst++ = (float)u / 255.0f * 2.0f - 1.0f;
                    }
        }
    if (!resized) free(r);
    return MA_OK;
}
