/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer: .npz (zip + deflate) and .npy parsing on arbitrary bytes. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "io/npz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ma_npz z;
    ma_error err;
    if (ma_npz_parse(data, size, "fuzz", &z, &err) == MA_OK) ma_npz_free(&z);
    ma_tensor t;
    if (ma_npy_parse(data, size, "fuzz", &t, &err) == MA_OK) {
        if (t.dtype == MA_DT_STR32 && ma_tensor_numel(&t) > 0) {
            char *s;
            if (ma_str32_to_utf8(&t, 0, &s, &err) == MA_OK) free(s);
        }
        ma_tensor_free(&t);
    }
    return 0;
}
