/* SPDX-License-Identifier: Apache-2.0 */
/* MolmoAct2 config.json (the Hugging Face schema of upstream configuration_molmoact2.py).
 *
 * Defaults are the upstream class defaults; unknown fields are refused by name, and so are
 * settings this engine does not implement (scaled RoPE, depth reasoning, ...). Derived values
 * (ViT blocks built, tap indices, pooled grid, expert MLP width) are filled in here.
 */
#ifndef MA_CONFIG_H
#define MA_CONFIG_H

#include <stdint.h>

#include "core/error.h"
#include "kernels/kernels.h"

#define MA_MAX_TAPS 8
/* upper bounds of the size-like fields that no weight shape checks (each multiplies memory or
 * time: the full model's 36 expert blocks x 256 steps of modulation tables are 170 MB) */
#define MA_MAX_ACTION_DIM 256
#define MA_MAX_ACTION_HORIZON 1024
#define MA_MAX_FLOW_STEPS 256

typedef struct ma_config {
    /* vit_config */
    int vit_hidden, vit_inter, vit_layers, vit_heads, vit_kv_heads, vit_head_dim, patch, num_pos;
    int image_h, image_w;
    float vit_eps;
    ma_act vit_act;
    /* adapter_config */
    int n_taps, taps[MA_MAX_TAPS]; /* block indices, in concatenation order */
    int vit_built;                 /* max(tap) + 1 blocks exist */
    int pool_hidden, pool_heads, pool_kv_heads, pool_head_dim, proj_inter, text_hidden;
    int pool_mask;
    ma_act proj_act;
    /* text_config */
    int d, heads, kv_heads, head_dim, vocab, extra_vocab, layers, inter;
    int max_positions; /* max_position_embeddings: the longest prompt the model takes */
    int qkv_bias, qk_norm, qk_norm_qwen3, norm_after;
    float eps;
    double rope_theta;
    ma_act act;
    /* action_expert_config */
    int e_hidden, e_layers, e_heads, e_head_dim, e_time_dim, e_inner;
    int e_ctx_norm, e_qk_norm, e_rope, e_causal;
    float e_qk_eps;
    /* top level */
    int max_action_dim, max_action_horizon, n_obs_steps, flow_steps, num_state_tokens;
    int mask_action_dim_padding, action_mode_both, add_setup_tokens, add_control_tokens;
    int64_t image_patch_id, image_col_id, image_start_id, image_end_id, low_res_start_id, image_low_res_id;
    int64_t frame_start_id, frame_end_id, eos_id, bos_id, pad_id;
    int64_t action_start_id, action_end_id, action_output_id, state_start_id, state_end_id, state_token_start_id;
    int use_grid_sampler, grid_tokens;         /* as written in config.json; they must agree with the weights */
    int use_grid_sampler_set, grid_tokens_set; /* 1 when config.json sets them (not the defaults) */
    /* derived */
    int patch_h, patch_w, pooled_h, pooled_w;
    char norm_stats_filename[256];
    int encoder_mask_prompt; /* the expert attends to every prompt token (LeRobot, continuous policy) */
    char unknown[512];       /* fields this parser does not know, ignored (inspect lists them) */
} ma_config;

/* parse config.json text; `label` names the file in messages */
ma_status ma_config_parse(const char *json, const char *label, ma_config *cfg, ma_error *err);
ma_status ma_config_load(const char *path, ma_config *cfg, ma_error *err);

#endif
