/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer: the PNG (libpng) and JPEG (libjpeg-turbo) decoders behind ma_image_decode, then
 * the torch-exact resize of whatever decoded. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "model/image.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ma_image im;
    ma_error err;
    if (ma_image_decode(data, size, "fuzz", &im, &err) == MA_OK) {
        if ((size_t)im.h * im.w <= 1u << 20) {
            uint8_t *out = malloc(16 * 16 * 3);
            if (out) ma_resize_bilinear_u8(im.rgb, im.h, im.w, out, 16, 16);
            free(out);
        }
        ma_image_free(&im);
    }
    return 0;
}
