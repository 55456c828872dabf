/* SPDX-License-Identifier: Apache-2.0 */
#include "kernels/quant.h"

#include <math.h>
#include <string.h>

#include "core/half.h"

static void put_f16(uint8_t *p, float v) {
    uint16_t h = ma_f32_to_f16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

void ma_quantize_q8_0(const float *x, int64_t n, uint8_t *out) {
    for (int64_t b = 0; b < n / 32; b++) {
        const float *v = x + b * 32;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(v[i]));
        const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        uint8_t *blk = out + b * 34;
        put_f16(blk, d);
        for (int i = 0; i < 32; i++) blk[2 + i] = (uint8_t)(int8_t)roundf(v[i] * id);
    }
}

/* x[n] -> 18-byte Q4_0 blocks (ggml layout, value = d * (nibble - 8)); the scale is chosen by a
 * small least-squares search around ggml's max/-8 instead of taking it as is */
static void quantize_q4_0(const float *x, int64_t n, uint8_t *out) {
    for (int64_t b = 0; b < n / 32; b++) {
        const float *v = x + b * 32;
        float amax = 0.0f, max = 0.0f;
        for (int i = 0; i < 32; i++)
            if (fabsf(v[i]) > amax) {
                amax = fabsf(v[i]);
                max = v[i];
            }
        /* candidate scales around ggml's max/-8; for each, the least-squares d of the rounded
         * levels; keep the one with the smallest squared error (as f16 stores it) */
        int8_t best_q[32] = {0}, q[32];
        float best_d = 0.0f, best_err = INFINITY;
        for (int k = -6; k <= 6 && max != 0.0f; k += 2) {
            const float iscale = -(8.0f + 0.1f * (float)k) / max;
            double sxq = 0, sqq = 0;
            for (int i = 0; i < 32; i++) {
                int l = (int)lroundf(v[i] * iscale);
                l = l < -8 ? -8 : (l > 7 ? 7 : l);
                q[i] = (int8_t)l;
                sxq += (double)v[i] * l;
                sqq += (double)l * l;
            }
            if (sqq <= 0) continue;
            const float d = ma_f16_to_f32(ma_f32_to_f16((float)(sxq / sqq)));
            double e = 0;
            for (int i = 0; i < 32; i++) {
                double r = v[i] - (double)d * q[i];
                e += r * r;
            }
            if (e < best_err) {
                best_err = (float)e;
                best_d = d;
                memcpy(best_q, q, sizeof q);
            }
        }
        uint8_t *blk = out + b * 18;
        put_f16(blk, best_d);
        for (int j = 0; j < 16; j++) blk[2 + j] = (uint8_t)((best_q[j] + 8) | ((best_q[j + 16] + 8) << 4));
    }
}

void ma_convert_from_f32(ma_dtype dt, const float *x, int64_t n, void *out) {
    switch (dt) {
    case MA_DT_F32: memcpy(out, x, (size_t)n * sizeof(float)); break;
    case MA_DT_F16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)out)[i] = ma_f32_to_f16(x[i]);
        break;
    case MA_DT_BF16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)out)[i] = ma_f32_to_bf16(x[i]);
        break;
    case MA_DT_Q8_0: ma_quantize_q8_0(x, n, out); break;
    case MA_DT_Q4_0: quantize_q4_0(x, n, out); break;
    default: break;
    }
}
