/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer: the BPE encoder (added-token split, NFC, pre-tokenizer, merges) and the decoder on
 * arbitrary bytes, with a small real BPE vocabulary (fuzz/corpus/bpe_tokenizer.json, or the path
 * in MOLMOACT_FUZZ_TOKENIZER). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "model/tokenizer.h"

static ma_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *p = getenv("MOLMOACT_FUZZ_TOKENIZER");
    ma_error err;
    if (ma_tokenizer_load(p ? p : "fuzz/corpus/bpe_tokenizer.json", &tok, &err) != MA_OK) {
        fprintf(stderr, "fuzz_bpe: %s\n", err.msg);
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int64_t *ids;
    size_t n;
    ma_error err;
    if (ma_tokenizer_encode(tok, (const char *)data, size, &ids, &n, &err) == MA_OK) {
        char *text;
        size_t len;
        if (ma_tokenizer_decode(tok, ids, n, &text, &len, &err) == MA_OK) free(text);
        free(ids);
    }
    /* decoding arbitrary id sequences: ids from the input bytes */
    size_t k = size / 2 < 64 ? size / 2 : 64;
    int64_t some[64];
    for (size_t i = 0; i < k; i++) some[i] = (int64_t)(data[2 * i] | (data[2 * i + 1] << 8)) % 600;
    char *text;
    size_t len;
    if (ma_tokenizer_decode(tok, some, k, &text, &len, &err) == MA_OK) free(text);
    return 0;
}
