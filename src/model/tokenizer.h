/* SPDX-License-Identifier: Apache-2.0 */
/* Byte-level BPE tokenizer read from a Hugging Face tokenizer.json (Qwen2/Qwen3 family), with
 * the semantics of the Rust `tokenizers` library:
 *   1. added tokens with normalized=false are split out of the raw text (leftmost-longest
 *      matching; single_word / lstrip / rstrip honoured);
 *   2. the remaining pieces are normalised (NFC / NFD / NFKC / NFKD, utf8proc) and the
 *      normalized=true added tokens are split out of them;
 *   3. each piece is pre-tokenized by the Qwen2 split regex (or GPT-2's, for ByteLevel with
 *      use_regex), hand-written here with Oniguruma's leftmost-first backtracking results;
 *   4. every pre-token is mapped to byte-level symbols and merged by rank (a min-heap on
 *      (rank, position), as tokenizers' Word::merge_all), then looked up in the vocabulary.
 * Decoding maps tokens back through the byte-level alphabet and replaces invalid UTF-8 the
 * way Rust's String::from_utf8_lossy does. Invalid UTF-8 input is refused. */
#ifndef MA_TOKENIZER_H
#define MA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef struct ma_tokenizer ma_tokenizer;

ma_status ma_tokenizer_load(const char *path, ma_tokenizer **out, ma_error *err);
ma_status ma_tokenizer_parse(const char *json, size_t len, const char *label, ma_tokenizer **out, ma_error *err);
void ma_tokenizer_free(ma_tokenizer *t);

/* text: UTF-8 bytes (may contain NUL); no special tokens are added. *ids is malloc'd. */
ma_status ma_tokenizer_encode(const ma_tokenizer *t, const char *text, size_t len, int64_t **ids, size_t *n, ma_error *err);
/* ids -> UTF-8 (malloc'd, NUL-terminated, *len excludes the NUL); unknown ids are refused */
ma_status ma_tokenizer_decode(const ma_tokenizer *t, const int64_t *ids, size_t n, char **text, size_t *len, ma_error *err);
/* id of a token string (vocabulary or added), -1 if absent */
int64_t ma_tokenizer_token_id(const ma_tokenizer *t, const char *token);

#endif
