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
    if (!out->pixels || !out->resized) { ma_prepared_free(out); return MA_ERR_NOMEM; }
    out->n_images = n_images;
    ma_status s = MA_OK;
    for (int i = 0; i < n_images && !s; i++) {
        if (!images[i].rgb) s = ma_fail(err, MA_ERR_ARG, "image%d is missing", i);
        else s = ma_preprocess_image(c, &images[i], out->pixels + (size_t)i * P * pp, out->resized + (size_t)i * hw, err);
    }
    ma_prompt_opts po = {m->tokens_per_image, n_images, m->col_tokens, 1};
    if (!s) s = ma_build_prompt(c, &m->ns, m->tok, &po, task, task_len, state, state_dim, &out->prompt, err);
    if (!s && out->prompt.n > 36864)
        s = ma_fail(err, MA_ERR_RANGE, "the prompt has %lld tokens, more than the model's 36864 positions", (long long)out->prompt.n);
    if (s) ma_prepared_free(out);
    return s;
}
