/* SPDX-License-Identifier: Apache-2.0 */
/* Camera frames -> ViT pixels, as upstream preprocesses them (crop_mode "resize"):
 *   decode (PNG via libpng, JPEG via libjpeg-turbo) or take a raw buffer -> HxWx3 uint8 RGB
 *   (grayscale replicated, alpha dropped, channel-first moved last, float frames with max <= 1
 *   scaled by 255, clipped and truncated) -> torchvision Resize([378, 378], BILINEAR,
 *   antialias=False) on the uint8 tensor (float math, half-pixel centres, rounded half to even)
 *   -> p = u8/255*2-1 -> 14x14 patches [729, 588], patch row-major, inside (dy, dx, channel).
 * Zero-sized, truncated, corrupt or huge (> MA_IMAGE_MAX_PIXELS) images are refused. */
#ifndef MA_IMAGE_H
#define MA_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "core/tensor.h"
#include "model/config.h"

#define MA_IMAGE_MAX_SIDE 16384
#define MA_IMAGE_MAX_PIXELS (64u * 1024u * 1024u)

typedef struct ma_image {
    int h, w;
    uint8_t *rgb; /* h*w*3, owned */
} ma_image;

/* PNG or JPEG, detected from the magic bytes */
ma_status ma_image_decode(const uint8_t *buf, size_t len, const char *label, ma_image *out, ma_error *err);
ma_status ma_image_load(const char *path, ma_image *out, ma_error *err);
/* a raw array: u8 or f32/f64, [H, W], [H, W, C] or [C, H, W] with C in {1, 3, 4} */
ma_status ma_image_from_tensor(const ma_tensor *t, const char *label, ma_image *out, ma_error *err);
void ma_image_free(ma_image *im);

/* torch-exact bilinear resize of an HxWx3 uint8 image into out (oh*ow*3) */
void ma_resize_bilinear_u8(const uint8_t *in, int h, int w, uint8_t *out, int oh, int ow);
/* resize + normalise + patchify into pixels [patch_h*patch_w, 3*patch^2]; resized (may be
 * NULL) receives the image_h x image_w x 3 uint8 image */
ma_status ma_preprocess_image(const ma_config *cfg, const ma_image *im, float *pixels, uint8_t *resized, ma_error *err);

#endif
