/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer: the GGUF v3 parser and its typed getters on arbitrary bytes. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "io/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ma_gguf g;
    ma_error err;
    memset(&g, 0, sizeof g);
    if (ma_gguf_parse(data, size, "fuzz", &g, &err) == MA_OK) {
        char s[64];
        int64_t v, arr[8];
        double d;
        size_t n;
        for (size_t i = 0; i < g.n_kv; i++) {
            ma_gguf_get_str(&g, g.kv[i].key, s, sizeof s, &err);
            ma_gguf_get_i64(&g, g.kv[i].key, &v, &err);
            ma_gguf_get_f64(&g, g.kv[i].key, &d, &err);
            ma_gguf_get_i64_array(&g, g.kv[i].key, arr, 8, &n, &err);
        }
        volatile uint8_t sink = 0;
        for (size_t i = 0; i < g.n_tensors; i++)
            if (g.tensors[i].nbytes) sink ^= ((const uint8_t *)g.tensors[i].data)[g.tensors[i].nbytes - 1];
        (void)sink;
    }
    ma_gguf_close(&g);
    return 0;
}
