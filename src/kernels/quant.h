/* SPDX-License-Identifier: Apache-2.0 */
/* Weight conversion into the stored precisions of contexts: f16, bf16, and ggml's Q8_0 / Q4_0
 * blocks (32 values per block; round-to-nearest as ggml's reference quantisers). */
#ifndef MA_QUANT_H
#define MA_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "core/tensor.h"

/* x[n] -> 34-byte Q8_0 blocks (n % 32 == 0): d = max|x| / 127, q = round(x / d) */
void ma_quantize_q8_0(const float *x, int64_t n, uint8_t *out);
/* convert n f32 values into dtype dt (F32, F16, BF16, Q8_0, Q4_0) at out */
void ma_convert_from_f32(ma_dtype dt, const float *x, int64_t n, void *out);

#endif
