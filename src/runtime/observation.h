/* SPDX-License-Identifier: Apache-2.0 */
/* A raw robot observation -> the pipeline's inputs: camera frames preprocessed into pixels, the
 * task and state built into the prompt and tokenised with the model's tokenizer.json. */
#ifndef MA_OBSERVATION_H
#define MA_OBSERVATION_H

#include "model/checkpoint.h"
#include "model/image.h"
#include "model/prompt.h"

typedef struct ma_prepared {
    float *pixels;    /* [n_images, P, 3*patch^2] */
    uint8_t *resized; /* [n_images, image_h, image_w, 3] */
    int n_images;
    ma_prompt prompt; /* ids, text, normalised task, state bins */
} ma_prepared;

ma_status ma_prepare_observation(const ma_model *m, const ma_image *images, int n_images, const char *task, size_t task_len,
                                 const float *state, int state_dim, ma_prepared *out, ma_error *err);
void ma_prepared_free(ma_prepared *p);

/* a camera frame as a client hands it over: RGB rows (stride bytes apart; 0: 3 x width) or encoded
 * PNG/JPEG bytes, one of the two */
typedef struct ma_frame {
    const uint8_t *data;
    int height, width;
    size_t stride;
    const uint8_t *encoded;
    size_t encoded_len;
} ma_frame;

/* the frame, checked (sizes, limits, strides) and copied or decoded into an owned image; label
 * names it in errors */
ma_status ma_frame_image(const ma_frame *f, const char *label, ma_image *out, ma_error *err);
/* the pixels the vision session takes, of n images (owned: free) */
ma_status ma_prepare_pixels(const ma_model *m, const ma_image *images, int n, float **pixels, ma_error *err);

#endif
