/* SPDX-License-Identifier: Apache-2.0 */
/* MolmoAct2 components: weights (views into a checkpoint or context) and forward passes.
 * Shapes: n images of P = patch_h*patch_w patches, T = pooled_h*pooled_w pooled tokens, K tokens
 * per image after the Grid Sampler (K = T without it), S prompt tokens, D LLM width, A action
 * horizon, Da = max_action_dim. All activations are fp32, row-major. */
#ifndef MA_MODEL_H
#define MA_MODEL_H

#include "kernels/kernels.h"
#include "model/config.h"
#include "model/weights.h"

/* ------------------------------------------------------------------------------ vision */
typedef struct ma_vit_attn_w {
    ma_mat wq, wk, wv, wo;
    float *bq, *bk, *bv, *bo;
} ma_vit_attn_w;

typedef struct ma_vit_block_w {
    float *ln1_w, *ln1_b, *ln2_w, *ln2_b;
    ma_vit_attn_w attn;
    ma_mat w1, w2;
    float *b1, *b2;
} ma_vit_block_w;

typedef enum { MA_SAMPLER_NONE = 0, MA_SAMPLER_AFTER_POOLING, MA_SAMPLER_AFTER_PROJECTOR } ma_sampler_place;

typedef struct ma_sampler_w {
    int channels, tokens, scout_hidden, coord_hidden;
    ma_mat scout0, scout2, coord0, coord2; /* Linear(C,h), Linear(h,2K), Linear(2,hc), Linear(hc,C) */
    float *scout0_b, *scout2_b, *coord0_b, *coord2_b;
} ma_sampler_w;

typedef struct ma_vision_w {
    ma_mat patch_w, pos; /* [Dv, 588], [P, Dv] */
    float *patch_b;
    ma_vit_block_w *blocks; /* vit_built of them */
    int n_blocks;
    ma_vit_attn_w pool; /* input n_taps*Dv -> pool_hidden */
    ma_mat proj_w1, proj_w2, proj_w3;
    ma_sampler_place sampler_place;
    ma_sampler_w sampler;
} ma_vision_w;

/* tokens per image leaving the vision session */
int ma_vision_tokens(const ma_config *cfg, const ma_vision_w *w);
ma_status ma_vision_bind(ma_weightset *ws, const ma_config *cfg, ma_vision_w *w, ma_error *err);
void ma_vision_unbind(ma_vision_w *w);

/* optional debugging outputs (any pointer may be NULL) */
typedef struct ma_vision_trace {
    float *taps;      /* [n, P, n_taps*Dv] */
    float *pooled;    /* [n, T, pool_hidden] */
    float *projected; /* [n, T or K, D] (before the sampler when it runs after the projector) */
    float *coords;    /* [n, K, 2] */
} ma_vision_trace;

/* pixels [n, P, 3*patch^2] (normalised to [-1, 1]) -> features [n*K, D] */
ma_status ma_vision_forward(const ma_config *cfg, const ma_vision_w *w, ma_kctx *kc, const float *pixels, int n, float *features,
                            const ma_vision_trace *trace, ma_error *err);

/* ------------------------------------------------------------------------------ LLM */
typedef struct ma_llm_layer_w {
    float *attn_norm, *ff_norm, *q_norm, *k_norm, *att_bias;
    ma_mat att_proj, attn_out, ff_proj, ff_out;
} ma_llm_layer_w;

typedef struct ma_llm_w {
    int first, last;        /* layer range [first, last) */
    ma_llm_layer_w *layers; /* last - first of them */
} ma_llm_w;

typedef struct ma_embed_w {
    ma_mat emb, new_emb; /* [vocab, D], [extra_vocab, D] */
} ma_embed_w;

ma_status ma_llm_bind(ma_weightset *ws, const ma_config *cfg, int first, int last, ma_llm_w *w, ma_error *err);
void ma_llm_unbind(ma_llm_w *w);
ma_status ma_embed_bind(ma_weightset *ws, const ma_config *cfg, ma_embed_w *w, ma_error *err);

/* hidden [S, D] in/out through layers [first, last); k_out/v_out [last-first, S, kvh, hd]
 * (post qk-norm, post RoPE keys; raw values) */
ma_status ma_llm_forward(const ma_config *cfg, const ma_llm_w *w, ma_kctx *kc, float *hidden, int64_t S, const uint8_t *image_mask,
                         const int64_t *positions, float *k_out, float *v_out, ma_error *err);

/* ------------------------------------------------------------------------------ action expert */
typedef struct ma_expert_block_w {
    ma_mat qkv, out, q, cout, gate, up, down, mod;
    float *qkv_b, *out_b, *q_b, *cout_b, *gate_b, *up_b, *down_b, *mod_b;
} ma_expert_block_w;

typedef struct ma_expert_w {
    ma_mat t1, t2, action_embed, ctx_k, ctx_v, final_mod, final_lin;
    float *t1_b, *t2_b, *ae_b, *final_mod_b, *final_lin_b;
    ma_expert_block_w *blocks;
    int n_blocks;
    /* optional: adaLN modulations precomputed for the flow timesteps t_i = i / steps (contexts
     * carry them; they depend only on t): [steps, L, 9*d] and [steps, 2*d] */
    const float *mod_table, *final_table;
    int table_steps;
} ma_expert_w;

/* bind the context projections (what action_context needs) and/or the step weights */
ma_status ma_expert_bind(ma_weightset *ws, const ma_config *cfg, int context, int step, ma_expert_w *w, ma_error *err);
void ma_expert_unbind(ma_expert_w *w);

/* adaLN modulations for time t: mods [L, 9*d] (shift/scale/gate x msa/mca/mlp) and final [2*d] */
ma_status ma_expert_modulations(const ma_config *cfg, const ma_expert_w *w, ma_kctx *kc, float t, float *mods, float *final, ma_error *err);

/* k, v [L, S, kvh*hd] -> ctx_k, ctx_v [L, S, He, hde] */
ma_status ma_expert_context(const ma_config *cfg, const ma_expert_w *w, ma_kctx *kc, const float *k, const float *v, int64_t L, int64_t S,
                            float *ctx_k, float *ctx_v, ma_error *err);

/* one flow step: x [A, Da], time t -> velocity [A, Da]; ctx [L, S, He, hde]; cross_valid [S] */
ma_status ma_expert_step(const ma_config *cfg, const ma_expert_w *w, ma_kctx *kc, const float *x, int64_t A, float t, const float *ctx_k,
                         const float *ctx_v, int64_t S, const uint8_t *cross_valid, float *velocity, ma_error *err);

#endif
