/* SPDX-License-Identifier: Apache-2.0 */
#include "runtime/observation.h"

#include <stdlib.h>
#include <string.h>

void ma_prepared_free(ma_prepared *p) {
    free(p->pixels);
    free(p->resized);
    ma_prompt_free(&p->prompt);
    memset(p, 0, sizeof *p);
}

ma_status ma_prepare_observation(const ma_model *m, const ma_image *images, int n_images, const char *task, size_t task_len,
                                 const float *state, int state_dim, ma_prepared *out, ma_error *err) {
    memset(out, 0, sizeof *out);
    const ma_config *c = &m->cfg;
    if (!m->tok) return ma_fail(err, MA_ERR_FORMAT, "%s: tokenizer.json is missing; task + state need it", m->dir);
    if (n_images < 1 || n_images > 16) return ma_fail(err, MA_ERR_ARG, "%d camera images (1..16)", n_images);
    const size_t P = (size_t)c->patch_h * c->patch_w, pp = 3u * c->patch * c->patch, hw = (size_t)c->image_h * c->image_w * 3;
    out->pixels = ma_malloc((size_t)n_images * P * pp, sizeof(float), err, "pixels");
    out->resized = ma_malloc((size_t)n_images * hw, 1, err, "resized images");
    if (!out->pixels || !out->resized) {
        ma_prepared_free(out);
        return MA_ERR_NOMEM;
    }
    out->n_images = n_images;
    ma_status s = MA_OK;
    for (int i = 0; i < n_images && !s; i++) {
        if (!images[i].rgb) s = ma_fail(err, MA_ERR_ARG, "image%d is missing", i);
        else s = ma_preprocess_image(c, &images[i], out->pixels + (size_t)i * P * pp, out->resized + (size_t)i * hw, err);
    }
    ma_prompt_opts po = {m->tokens_per_image, n_images, m->col_tokens, 1};
    if (!s) s = ma_build_prompt(c, &m->ns, m->tok, &po, task, task_len, state, state_dim, &out->prompt, err);
    /* positions 0..n-1: past max_position_embeddings the model was never trained (config.json) */
    if (!s && out->prompt.n > c->max_positions)
        s = ma_fail(err, MA_ERR_RANGE,
                    "the prompt has %lld tokens, more than the model's %d positions (text_config.max_position_embeddings)",
                    (long long)out->prompt.n, c->max_positions);
    if (s) ma_prepared_free(out);
    return s;
}

ma_status ma_frame_image(const ma_frame *f, const char *label, ma_image *out, ma_error *err) {
    memset(out, 0, sizeof *out);
    if (f->encoded) {
        if (f->data) return ma_fail(err, MA_ERR_ARG, "%s: give data or encoded, not both", label);
        if (!f->encoded_len) return ma_fail(err, MA_ERR_FORMAT, "%s: encoded image is empty", label);
        return ma_image_decode(f->encoded, f->encoded_len, label, out, err);
    }
    if (!f->data) return ma_fail(err, MA_ERR_ARG, "%s: no frame (data and encoded are NULL)", label);
    if (f->height <= 0 || f->width <= 0)
        return ma_fail(err, MA_ERR_SHAPE, "%s: frame is %d x %d pixels (empty)", label, f->height, f->width);
    if (f->height > MA_IMAGE_MAX_SIDE || f->width > MA_IMAGE_MAX_SIDE || (uint64_t)f->height * (uint64_t)f->width > MA_IMAGE_MAX_PIXELS)
        return ma_fail(err, MA_ERR_NOMEM, "%s: frame %d x %d exceeds the limit (%d per side, %u pixels)", label, f->height, f->width,
                       MA_IMAGE_MAX_SIDE, MA_IMAGE_MAX_PIXELS);
    const size_t row = (size_t)f->width * 3, stride = f->stride ? f->stride : row;
    if (stride < row) return ma_fail(err, MA_ERR_SHAPE, "%s: stride %zu is below 3 x width = %zu", label, stride, row);
    out->rgb = ma_malloc((size_t)f->height, row, err, label);
    if (!out->rgb) return MA_ERR_NOMEM;
    for (int y = 0; y < f->height; y++) memcpy(out->rgb + (size_t)y * row, f->data + (size_t)y * stride, row);
    out->h = f->height;
    out->w = f->width;
    return MA_OK;
}

ma_status ma_prepare_pixels(const ma_model *m, const ma_image *images, int n, float **pixels, ma_error *err) {
    const ma_config *c = &m->cfg;
    const size_t P = (size_t)c->patch_h * c->patch_w, pp = 3u * c->patch * c->patch;
    *pixels = NULL;
    if (n < 1 || n > 16) return ma_fail(err, MA_ERR_ARG, "%d camera images (1..16)", n);
    float *px = ma_malloc((size_t)n * P * pp, sizeof(float), err, "pixels");
    if (!px) return MA_ERR_NOMEM;
    for (int i = 0; i < n; i++) {
        ma_status s = ma_preprocess_image(c, &images[i], px + (size_t)i * P * pp, NULL, err);
        if (s) {
            free(px);
            return s;
        }
    }
    *pixels = px;
    return MA_OK;
}
