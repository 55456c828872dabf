/* A MolmoAct2 model opened from a Hugging Face checkpoint directory: config.json, the mapped
 * safetensors (single or sharded; F32 / F16 / BF16 / mixed; HF or LeRobot keys), norm_stats.json,
 * and every component bound. Opening checks the whole checkpoint: a missing or mis-shaped
 * tensor, or one the configuration does not use, is refused by name. */
#ifndef MA_CHECKPOINT_H
#define MA_CHECKPOINT_H

#include "io/safetensors.h"
#include "model/hostglue.h"
#include "model/model.h"
#include "model/normstats.h"
#include "model/tokenizer.h"

typedef struct ma_model {
    char *dir;
    ma_config cfg;
    ma_safetensors st;
    ma_weightset ws;
    ma_normstats ns;
    ma_vision_w vision;
    ma_embed_w embed;
    int split_first[MA_NUM_SPLITS], split_last[MA_NUM_SPLITS];
    ma_llm_w llm[MA_NUM_SPLITS];
    ma_expert_w expert;
    int tokens_per_image;
    ma_tokenizer *tok; /* tokenizer.json of the directory, NULL when absent */
    int col_tokens;    /* processor_config.json: <im_col> after each pooled row (original variant) */
} ma_model;

/* norm_tag: the norm_stats.json tag ("libero") */
ma_status ma_model_open(const char *dir, const char *norm_tag, ma_model *m, ma_error *err);
void ma_model_close(ma_model *m);

#endif
