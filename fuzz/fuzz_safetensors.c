/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer: the safetensors header parser on arbitrary bytes. */
#include <stddef.h>
#include <stdint.h>

#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ma_st_tensor *t;
    size_t n;
    ma_error err;
    if (ma_st_parse(data, size, "fuzz", &t, &n, &err) == MA_OK) {
        volatile uint8_t sink = 0;
        for (size_t i = 0; i < n; i++) /* touch every tensor's first and last byte */
            if (t[i].nbytes) sink ^= ((const uint8_t *)t[i].data)[0] ^ ((const uint8_t *)t[i].data)[t[i].nbytes - 1];
        (void)sink;
        ma_st_free_tensors(t, n);
    }
    return 0;
}
