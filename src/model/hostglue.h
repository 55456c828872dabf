/* SPDX-License-Identifier: Apache-2.0 */
/* Host glue between the sessions (docs/ARCHITECTURE.md "LLM", "Action expert", "Flow matching" and
 * "Sessions"): embedding lookup, the image-feature scatter, the LLM image-token mask, the expert's
 * cross-attention mask, LLM split ranges, torch-compatible initial noise, and the Euler-loop
 * padding mask. */
#ifndef MA_HOSTGLUE_H
#define MA_HOSTGLUE_H

#include <stdint.h>

#include "model/model.h"

#define MA_NUM_SPLITS 4

/* out[S, D] = concat(wte.embedding, wte.new_embedding)[ids]; id -1 reads row 0 (upstream);
 * any other id outside the table is refused, naming its position */
ma_status ma_embed_tokens(const ma_config *cfg, const ma_embed_w *w, const int64_t *ids, int64_t S, float *out, ma_error *err);
/* hidden[rows where id == <im_patch>] += features, in order; counts must match */
ma_status ma_scatter_features(const ma_config *cfg, const int64_t *ids, int64_t S, float *hidden, const float *features, int64_t n_features,
                              ma_error *err);
/* 1 for image-structure tokens (patch, col, start, low-res start, frame start/end, end, low-res) */
void ma_image_token_mask(const ma_config *cfg, const int64_t *ids, int64_t S, uint8_t *mask);
/* cross-attention key mask: id != -1; under action_mode both also id != eos and outside
 * <action_start>..<action_end> spans */
void ma_encoder_mask(const ma_config *cfg, const int64_t *ids, int64_t S, uint8_t *mask);
/* contiguous, as even as possible, earlier splits take the remainder */
void ma_split_ranges(int layers, int first[MA_NUM_SPLITS], int last[MA_NUM_SPLITS]);
/* torch.randn(n, generator=torch.Generator().manual_seed(seed)) for float32 (CPU mt19937 +
 * Box-Muller in blocks of 16, as ATen's normal_fill); equal to torch up to libm rounding */
void ma_torch_randn(uint64_t seed, int64_t n, float *out);

#endif
