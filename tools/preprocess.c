/* SPDX-License-Identifier: Apache-2.0 */
/* molmoact preprocess: a frame as the vision encoder takes it. */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>

#include "commands.h"
#include "options.h"
#include "io/mapfile.h"
#include "io/npz.h"
#include "model/config.h"
#include "model/image.h"

static int cmd_preprocess(opts *o) {
    if (!o->model || !o->image0) {
        fprintf(stderr, "molmoact: preprocess needs --model DIR and --image0 FILE\n");
        return 1;
    }
    ma_error err = {0};
    ma_config cfg;
    char *cp = ma_path_join(o->model, "config.json");
    ma_status s = cp ? ma_config_load(cp, &cfg, &err) : MA_ERR_NOMEM;
    free(cp);
    if (s) return fail(&err);
    ma_image im;
    if (ma_image_load(o->image0, &im, &err)) return fail(&err);
    int64_t ps[2] = {cfg.patch_h * cfg.patch_w, 3 * cfg.patch * cfg.patch}, rs[3] = {cfg.image_h, cfg.image_w, 3};
    int64_t os[3] = {im.h, im.w, 3};
    float *pixels = malloc(sizeof(float) * (size_t)(ps[0] * ps[1]));
    uint8_t *resized = malloc((size_t)(rs[0] * rs[1] * 3));
    int rc = 1;
    if (pixels && resized && !ma_preprocess_image(&cfg, &im, pixels, resized, &err)) {
        ma_npz_writer w;
        ma_npz_writer_init(&w);
        ma_tensor a = ma_tensor_view(MA_DT_U8, 3, os, im.rgb), b = ma_tensor_view(MA_DT_U8, 3, rs, resized);
        if (!ma_npz_add(&w, "image", &a, &err) && !ma_npz_add(&w, "resized_u8", &b, &err) &&
            !ma_npz_add_f32(&w, "pixels", 2, ps, pixels, &err) && !ma_npz_write(&w, o->out ? o->out : "preprocessed.npz", 0, &err))
            rc = 0;
        ma_npz_writer_free(&w);
    }
    if (rc) fail(&err);
    free(pixels);
    free(resized);
    ma_image_free(&im);
    return rc;
}

int cmd_preprocess_a(cli_args *a) {
    opts o;
    if (opts_from(a, &o) || session_settings(a)) return 1;
    return cmd_preprocess(&o);
}
