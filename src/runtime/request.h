/* SPDX-License-Identifier: Apache-2.0 */
/* One observation as the command line and the stream mode receive it, turned into the
 * pipeline's inputs (ma_obs): an IN.npz (DESIGN contract: pixels | image0 + image1, input_ids |
 * task + state, noise) and/or camera files, a task sentence and a state list; or a synthetic
 * LIBERO-like observation for benchmarks. Every refusal names the input at fault. */
#ifndef MA_REQUEST_H
#define MA_REQUEST_H

#include "io/npz.h"
#include "runtime/observation.h"
#include "runtime/pipeline.h"

typedef struct ma_request_src {
    const char *inputs;     /* IN.npz, or NULL */
    const char *pixels_npz; /* an npz whose `pixels` is used when inputs has none (the demo: vision_io.npz) */
    const char *image0, *image1, *task, *state_csv;
    const char *noise_path; /* .npy or .npz with `noise`; overrides inputs' noise */
    int have_seed;          /* --seed given: draw the noise from seed unless a noise file is named */
    uint64_t seed;
    /* real-time chunking: the previous chunk's leftover (.npy float32 [rows, dim] or [1, rows,
     * dim], or an .npz holding rtc_prefix), or NULL; the settings as ma_rtc's */
    const char *rtc_prefix_path;
    int rtc_delay, rtc_horizon, rtc_schedule;
    float rtc_beta;
} ma_request_src;

typedef struct ma_request {
    ma_obs obs; /* points into the members below */
    ma_npz in, pix, noise_file, rtc_file;
    ma_tensor noise_npy, rtc_npy;
    ma_prepared prep; /* set when the observation was raw (frames, task, state) */
    ma_image imgs[2];
    char *task_buf;
} ma_request;

ma_status ma_request_load(const ma_model *m, const ma_request_src *src, ma_request *q, ma_error *err);
/* two deterministic 256x256 camera frames, a LIBERO task and a mid-range state, noise from seed
 * (needs the model's tokenizer.json) */
ma_status ma_request_synthetic(const ma_model *m, uint64_t seed, ma_request *q, ma_error *err);
void ma_request_free(ma_request *q);

#endif
