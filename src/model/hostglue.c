/* SPDX-License-Identifier: Apache-2.0 */
#include "model/hostglue.h"

#include <math.h>
#include <string.h>

ma_status ma_embed_tokens(const ma_config *cfg, const ma_embed_w *w, const int64_t *ids, int64_t S, float *out, ma_error *err) {
    for (int64_t i = 0; i < S; i++) {
        int64_t id = ids[i] == -1 ? 0 : ids[i];
        float *row = out + i * cfg->d;
        if (id >= 0 && id < cfg->vocab) ma_mat_row(&w->emb, id, row);
        else if (id >= cfg->vocab && id < (int64_t)cfg->vocab + cfg->extra_vocab) ma_mat_row(&w->new_emb, id - cfg->vocab, row);
        else
            return ma_fail(err, MA_ERR_RANGE, "input_ids[%lld] = %lld is outside the vocabulary (0..%d)", (long long)i, (long long)ids[i],
                           cfg->vocab + cfg->extra_vocab - 1);
    }
    return MA_OK;
}

ma_status ma_scatter_features(const ma_config *cfg, const int64_t *ids, int64_t S, float *hidden, const float *features, int64_t n_features,
                              ma_error *err) {
    int64_t count = 0;
    for (int64_t i = 0; i < S; i++) count += ids[i] == cfg->image_patch_id;
    if (count != n_features)
        return ma_fail(err, MA_ERR_SHAPE, "the prompt has %lld <im_patch> tokens but vision produced %lld features", (long long)count,
                       (long long)n_features);
    int64_t j = 0;
    for (int64_t i = 0; i < S; i++)
        if (ids[i] == cfg->image_patch_id) ma_add(hidden + i * cfg->d, features + (j++) * cfg->d, cfg->d);
    return MA_OK;
}

void ma_image_token_mask(const ma_config *cfg, const int64_t *ids, int64_t S, uint8_t *mask) {
    const int64_t set[] = {cfg->image_patch_id, cfg->image_col_id, cfg->image_start_id, cfg->low_res_start_id,
                           cfg->frame_start_id, cfg->image_end_id, cfg->frame_end_id,   cfg->image_low_res_id};
    for (int64_t i = 0; i < S; i++) {
        mask[i] = 0;
        for (size_t k = 0; k < sizeof set / sizeof set[0]; k++)
            if (set[k] >= 0 && ids[i] == set[k]) mask[i] = 1;
    }
}

void ma_encoder_mask(const ma_config *cfg, const int64_t *ids, int64_t S, uint8_t *mask) {
    for (int64_t i = 0; i < S; i++) mask[i] = ids[i] != -1;
    if (!cfg->action_mode_both || cfg->encoder_mask_prompt) return;
    for (int64_t i = 0; i < S; i++)
        if (ids[i] == cfg->eos_id) mask[i] = 0;
    if (cfg->action_start_id < 0 || cfg->action_end_id < 0) return;
    /* each start pairs with the first unused end at or after it; an unterminated span runs to the end */
    int64_t e = 0;
    for (int64_t s = 0; s < S; s++) {
        if (ids[s] != cfg->action_start_id) continue;
        while (e < S && (ids[e] != cfg->action_end_id || e < s)) e++;
        if (e >= S) {
            for (int64_t i = s; i < S; i++) mask[i] = 0;
            return;
        }
        for (int64_t i = s; i <= e; i++) mask[i] = 0;
        e++;
    }
}

void ma_split_ranges(int layers, int first[MA_NUM_SPLITS], int last[MA_NUM_SPLITS]) {
    int base = layers / MA_NUM_SPLITS, extra = layers % MA_NUM_SPLITS, at = 0;
    for (int i = 0; i < MA_NUM_SPLITS; i++) {
        first[i] = at;
        at += base + (i < extra ? 1 : 0);
        last[i] = at;
    }
}

/* ---- mt19937 as seeded by at::CPUGeneratorImpl */
typedef struct {
    uint32_t s[624];
    int i;
} mt19937;

static void mt_seed(mt19937 *m, uint64_t seed) {
    m->s[0] = (uint32_t)(seed & 0xffffffffu);
    for (int j = 1; j < 624; j++) m->s[j] = 1812433253u * (m->s[j - 1] ^ (m->s[j - 1] >> 30)) + (uint32_t)j;
    m->i = 624;
}

static uint32_t mt_next(mt19937 *m) {
    if (m->i >= 624) {
        for (int k = 0; k < 624; k++) {
            uint32_t y = (m->s[k] & 0x80000000u) | (m->s[(k + 1) % 624] & 0x7fffffffu);
            m->s[k] = m->s[(k + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
        }
        m->i = 0;
    }
    uint32_t y = m->s[m->i++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

static float uniform24(mt19937 *m) { return (float)((double)(mt_next(m) & 0xffffffu) * (1.0 / 16777216.0)); }

static void normal16(float *d) {
    for (int j = 0; j < 8; j++) {
        float u1 = 1.0f - d[j], u2 = d[j + 8];
        float radius = sqrtf(-2.0f * logf(u1));
        float theta = 2.0f * (float)3.14159265358979323846 * u2;
        d[j] = radius * cosf(theta);
        d[j + 8] = radius * sinf(theta);
    }
}

void ma_torch_randn(uint64_t seed, int64_t n, float *out) {
    mt19937 m;
    mt_seed(&m, seed);
    if (n < 16) { /* ATen's scalar path: one Box-Muller pair per two values, caching the second */
        for (int64_t i = 0; i < n; i++) {
            double u1 = (double)(mt_next(&m) & 0xffffffu) / 16777216.0;
            double u2 = (double)(mt_next(&m) & 0xffffffu) / 16777216.0;
            out[i] = (float)(sqrt(-2.0 * log(1.0 - u2)) * cos(2.0 * 3.14159265358979323846 * u1));
        }
        return;
    }
    for (int64_t i = 0; i < n; i++) out[i] = uniform24(&m);
    for (int64_t i = 0; i + 16 <= n; i += 16) normal16(out + i);
    if (n % 16) {
        float *tail = out + n - 16;
        for (int k = 0; k < 16; k++) tail[k] = uniform24(&m);
        normal16(tail);
    }
}
