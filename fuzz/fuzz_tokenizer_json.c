/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer: tokenizer.json loading on arbitrary bytes, then encoding a fixed sentence with
 * whatever loaded. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "model/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ma_tokenizer *t;
    ma_error err;
    if (ma_tokenizer_parse((const char *)data, size, "fuzz", &t, &err) == MA_OK) {
        static const char s[] = "Pick up the bowl <|im_end|> 42 caf\xc3\xa9!";
        int64_t *ids;
        size_t n;
        if (ma_tokenizer_encode(t, s, sizeof s - 1, &ids, &n, &err) == MA_OK) {
            char *text;
            size_t len;
            if (ma_tokenizer_decode(t, ids, n, &text, &len, &err) == MA_OK) free(text);
            free(ids);
        }
        ma_tokenizer_free(t);
    }
    return 0;
}
