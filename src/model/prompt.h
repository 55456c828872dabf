/* SPDX-License-Identifier: Apache-2.0 */
/* The MolmoAct2 robot prompt (docs/ARCHITECTURE.md "The prompt"; upstream _build_robot_text and the
 * processor): task normalisation, quantile-normalised 256-bin state tokens, the LIBERO template
 * with the setup/control strings from norm_stats, <|image|> expansion (K patches per image for
 * the Grid Sampler, the pooled rows otherwise), tokenisation and BOS insertion. */
#ifndef MA_PROMPT_H
#define MA_PROMPT_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"
#include "model/normstats.h"
#include "model/tokenizer.h"

#define MA_TASK_MAX_BYTES 65536

typedef struct ma_prompt_opts {
    int tokens_per_image; /* K */
    int n_images;         /* 2 for LIBERO */
    int col_tokens;       /* original variant: an <im_col> after each pooled row */
    int normalize_language;
} ma_prompt_opts;

typedef struct ma_prompt {
    int64_t *ids; /* [S] */
    int64_t n;
    char *text; /* the prompt before <|image|> expansion (malloc'd) */
    char *task; /* the normalised task */
    float state_norm[MA_NORM_MAX_DIM];
    int state_bins[MA_NORM_MAX_DIM];
    int state_dim;
} ma_prompt;

/* upstream _normalize_question_text on UTF-8 (malloc'd result) */
ma_status ma_normalize_task(const char *task, size_t len, char **out, ma_error *err);
/* nan->0, +inf->1, -inf->-1, clip [-1, 1], rint((s + 1) / 2 * (n - 1)) with ties to even */
int ma_state_bin(float s, int num_bins);

ma_status ma_build_prompt(const ma_config *cfg, const ma_normstats *ns, const ma_tokenizer *tok, const ma_prompt_opts *o, const char *task,
                          size_t task_len, const float *state, int state_dim, ma_prompt *out, ma_error *err);
void ma_prompt_free(ma_prompt *p);

#endif
