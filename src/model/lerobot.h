/* SPDX-License-Identifier: Apache-2.0 */
/* A LeRobot MolmoAct2 policy directory, as LeRobot saves one (docs/CHECKPOINTS.md has the facts
 * and where each was read in LeRobot's code):
 *
 *   config.json                 LeRobot's policy config: "type": "molmoact2", checkpoint_path (the
 *                               HF base repo: its config.json, tokenizer, processor config),
 *                               chunk_size, n_action_steps, action_mode, train_mode_vlm / LoRA ...
 *   model.safetensors           the policy's state dict: HF keys under "model." (full fine-tune,
 *                               frozen VLM), or "model.base_model.model." with unmerged LoRA
 *                               (base_layer, lora_A.default, lora_B.default)
 *   policy_preprocessor.json    the input pipeline: the normaliser step (found by its registry
 *                               name) and its state file (observation.state.q01, ...), the clamp
 *                               step, the prompt step (setup_type, control_mode, ...)
 *   policy_postprocessor.json   the output pipeline: the unnormaliser step and its state file
 *
 * The base files come from `base` (a HF MolmoAct2 directory), else from the Hugging Face hub
 * cache entry of the repo checkpoint_path names ($HF_HUB_CACHE, $HF_HOME/hub or
 * ~/.cache/huggingface/hub; refs/main, then snapshots/REV), else the error names the repo, the
 * files needed and the download command. checkpoint_path must then be a repo id by huggingface_hub's
 * rules ([NAMESPACE/]NAME), checkpoint_revision a commit hash or a plain branch or tag name; each
 * way the lookup can fail (no entry, no ref, a ref that is not a commit hash, a missing snapshot,
 * a symlink loop, a FIFO) has its own message. Every field of config.json and of the pipelines'
 * steps is type- and range-checked, naming the file and the field; the state and the action may
 * each have their own normalisation mode (LeRobot's normalization_mapping). */
#ifndef MA_LEROBOT_H
#define MA_LEROBOT_H

#include <limits.h>

#include "core/error.h"
#include "model/normstats.h"

typedef struct ma_lerobot {
    char dir[PATH_MAX];
    char base_dir[PATH_MAX];                             /* the HF files: config.json, tokenizer.json, processor_config.json */
    char base_from[64];                                  /* "--base", "checkpoint_path", "the Hugging Face cache" */
    char hub_cache[PATH_MAX];                            /* the Hugging Face hub cache (settings.hub_cache) */
    char repo_id[256];                                   /* checkpoint_path as written */
    int chunk_size, n_action_steps, num_inference_steps; /* 0: not set */
    char action_mode[16];                                /* the saved training mode: continuous, discrete, both */
    int full_encoder_mask;                               /* LeRobot runs a continuous checkpoint's expert over the whole prompt */
    int lora;                                            /* the VLM trained with LoRA (adapters unmerged in model.safetensors) */
    int lora_rank;
    double lora_alpha;
    int grid_sampler;          /* -1: the config says nothing; else use_grid_token_sampler */
    int grid_tokens;           /* grid_token_sampler_num_tokens (0: not set) */
    int state_dim, action_dim; /* from input_features / output_features */
    ma_normstats ns;           /* from the pipelines, with LeRobot's arithmetic (ns.lerobot) */
    int have_pack;             /* the prompt step's settings were found */
    int num_state_tokens, add_setup_tokens, add_control_tokens, normalize_language;
} ma_lerobot;

/* NULL when id is a Hugging Face repo id by huggingface_hub's rules ([NAMESPACE/]NAME: letters,
 * digits, '-', '_', '.'; no "--" or ".."), else why not */
const char *ma_repo_id_problem(const char *id);
/* is dir a LeRobot policy directory (its config.json has "type": "molmoact2")? */
int ma_is_lerobot_dir(const char *dir);
/* read the policy: config, pipelines, statistics, base directory (base: NULL or "" to resolve
 * checkpoint_path, as a directory or in the hub cache hub_cache: NULL or "" for none) */
ma_status ma_lerobot_open(const char *dir, const char *base, const char *hub_cache, ma_lerobot *lr, ma_error *err);
/* the base's config.json with what LeRobot changes at load applied (max_action_horizon =
 * chunk_size, flow_matching_num_steps = num_inference_steps, the expert's encoder mask), as the
 * JSON text a context embeds (malloc'd) */
ma_status ma_lerobot_config_json(const ma_lerobot *lr, char **out, ma_error *err);
/* the statistics as a norm_stats.json (tag "lerobot" holding LeRobot's arithmetic), for compile */
ma_status ma_lerobot_norm_stats_json(const ma_lerobot *lr, const char *tag, char **out, ma_error *err);

#endif
