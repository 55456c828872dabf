/* SPDX-License-Identifier: Apache-2.0 */
/* IEEE half (f16) and bfloat16 conversions, bit-exact and portable (no F16C needed). */
#ifndef MA_HALF_H
#define MA_HALF_H

#include <stdint.h>
#include <string.h>

static inline float ma_bits_to_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint32_t ma_f32_to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float ma_bf16_to_f32(uint16_t h) { return ma_bits_to_f32((uint32_t)h << 16); }

/* round to nearest even; NaN stays NaN (quiet) */
static inline uint16_t ma_f32_to_bf16(float f) {
    uint32_t u = ma_f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float ma_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        if (man == 0) return ma_bits_to_f32(sign);
        /* subnormal: value = man * 2^-24 */
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (exp == 31) return ma_bits_to_f32(sign | 0x7f800000u | (man << 13));
    return ma_bits_to_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

/* round to nearest even, overflow to inf, NaN preserved */
static inline uint16_t ma_f32_to_f16(float f) {
    uint32_t u = ma_f32_to_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (a < 0x38800000u) {                                   /* below the smallest normal */
        /* subnormal or zero: round(a_value / 2^-24) */
        float v = ma_bits_to_f32(a) * 16777216.0f;
        uint32_t m = (uint32_t)v;
        float rem = v - (float)m;
        if (rem > 0.5f || (rem == 0.5f && (m & 1u))) m++;
        return (uint16_t)(sign | m);
    }
    uint32_t exp = (a >> 23) - 112u;
    uint32_t man = a & 0x7fffffu;
    uint32_t h = (exp << 10) | (man >> 13);
    uint32_t rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

#endif
