/* SPDX-License-Identifier: Apache-2.0 */
/* A MolmoAct2 model opened from a Hugging Face checkpoint directory: config.json, the mapped
 * safetensors (single or sharded; F32 / F16 / BF16 / mixed; HF or LeRobot keys), norm_stats.json,
 * and every component bound. Opening checks the whole checkpoint: a missing or mis-shaped
 * tensor, or one the configuration does not use, is refused by name. */
#ifndef MA_CHECKPOINT_H
#define MA_CHECKPOINT_H

#include "core/settings.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "model/components.h"
#include "model/hostglue.h"
#include "model/model.h"
#include "model/normstats.h"
#include "model/tokenizer.h"


#define MA_MAX_PROMPT_SEQ 65536    /* the longest prompt a context may be shaped for */
#define MA_LORA_MAX_SCALING 1024.0 /* the largest LoRA scaling lora_alpha / r taken (compile merges) */
/* 2: matrices with a multiple of 16 rows are stored in the GEMM panel layout (kernels/gemm.h);
 * 3: molmoact.source_fingerprint in every context;
 * 4: molmoact.compile_id in every context, and the directory's manifest.json (model/manifest.h) */
#define MA_CONTEXT_FORMAT 4

typedef struct ma_model {
    ma_settings set; /* the settings it was opened with (suffixes, prompt length, compute, base, ...) */
    char *dir;
    char *host_dir; /* config.json, tokenizer.json, processor_config.json: dir, or a LeRobot policy's base */
    int lerobot;    /* dir is a LeRobot policy directory */
    unsigned parts;
    int from_contexts;
    ma_gguf ctx[8];            /* vision, embed, llm_split0..3, action_context, action_step */
    char precision[3][8];      /* vision, llm, action: as the contexts say ("" for a checkpoint) */
    char source_dtype[3][8];   /* what their matrices were in the checkpoint (molmoact.source_dtype; "" when not recorded) */
    char compute[3][8];        /* their compute plans, "fp32", "bf16" or "f16" ("" for a checkpoint), or MOLMOACT_COMPUTE's */
    ma_compute ctx_compute[8]; /* each opened context's plan */
    int prompt_seq;            /* contexts: the prompt length their static graphs are built for (0: none recorded) */
    char prompt_seq_file[64];  /* the context it was first read from */
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

/* norm_tag: the norm_stats.json tag ("libero"). dir is a Hugging Face checkpoint directory or a
 * context directory written by `molmoact compile`. The settings (core/settings.h; NULL: the
 * defaults) choose context variants (the suffixes), the compute plan, --preload, a LeRobot
 * policy's base; their prompt_seq, when set, must be the length the contexts were compiled for.
 * ma_model_open binds everything with the defaults; ma_model_open_parts only the given parts. */
ma_status ma_model_open_with(const char *dir, const char *norm_tag, unsigned parts, const ma_settings *st, ma_model *m, ma_error *err);
ma_status ma_model_open(const char *dir, const char *norm_tag, ma_model *m, ma_error *err);
ma_status ma_model_open_parts(const char *dir, const char *norm_tag, unsigned parts, ma_model *m, ma_error *err);
/* the context file name of slot i (0 vision, 1 embed, 2..5 llm_split0..3, 6 action_context,
 * 7 action_step) with `suffix` (NULL: none); ma_model_context_name with the model's settings */
void ma_context_name(int slot, const char *suffix, char *out, size_t cap);
void ma_model_context_name(const struct ma_model *m, int slot, char *out, size_t cap);
int ma_is_context_dir(const char *dir);
int ma_is_context_dir_with(const char *dir, const ma_settings *st);
void ma_model_close(ma_model *m);

/* The fingerprint of a checkpoint: 16 hex digits over every tensor's name, dtype, shape and data
 * (zlib's CRC-32 of each tensor's bytes, folded with its description into a 64-bit FNV-1a hash,
 * in name order, so resharding does not change it). `molmoact compile` writes it into every
 * context; opening refuses contexts that disagree, naming both files (contexts of one
 * checkpoint in several precisions agree). */
ma_status ma_checkpoint_fingerprint(const ma_safetensors *st, char out[17], ma_error *err);

#endif
