/* SPDX-License-Identifier: Apache-2.0 */
#include "model/config.h"
#include "io/jsonline.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/mapfile.h"

/* Fields every transformers PretrainedConfig may carry; none changes inference. */
static const char *GENERIC[] = {"architectures",
                                "auto_map",
                                "dtype",
                                "torch_dtype",
                                "transformers_version",
                                "_name_or_path",
                                "bos_token_id",
                                "eos_token_id",
                                "pad_token_id",
                                "sep_token_id",
                                "decoder_start_token_id",
                                "tie_word_embeddings",
                                "use_cache",
                                "return_dict",
                                "output_hidden_states",
                                "output_attentions",
                                "torchscript",
                                "chunk_size_feed_forward",
                                "is_encoder_decoder",
                                "is_decoder",
                                "cross_attention_hidden_size",
                                "add_cross_attention",
                                "tie_encoder_decoder",
                                "finetuning_task",
                                "id2label",
                                "label2id",
                                "tokenizer_class",
                                "prefix",
                                "task_specific_params",
                                "problem_type",
                                "pruned_heads",
                                "_attn_implementation_autoset",
                                "output_scores",
                                "return_dict_in_generate",
                                "_commit_hash",
                                "attn_implementation",
                                "initializer_range",
                                "model_type",
                                "use_return_dict",
                                NULL};

static const char *VIT_KEYS[] = {
    "hidden_size",   "intermediate_size", "num_hidden_layers", "num_attention_heads",      "num_key_value_heads",
    "head_dim",      "hidden_act",        "layer_norm_eps",    "image_default_input_size", "image_patch_size",
    "image_num_pos", "attention_dropout", "residual_dropout",  "float32_attention",        NULL};
static const char *ADAPTER_KEYS[] = {"vit_layers",
                                     "pooling_attention_mask",
                                     "hidden_size",
                                     "num_attention_heads",
                                     "num_key_value_heads",
                                     "head_dim",
                                     "float32_attention",
                                     "attention_dropout",
                                     "residual_dropout",
                                     "hidden_act",
                                     "intermediate_size",
                                     "text_hidden_size",
                                     "image_feature_dropout",
                                     NULL};
static const char *TEXT_KEYS[] = {"hidden_size",
                                  "num_attention_heads",
                                  "num_key_value_heads",
                                  "head_dim",
                                  "vocab_size",
                                  "additional_vocab_size",
                                  "qkv_bias",
                                  "num_hidden_layers",
                                  "intermediate_size",
                                  "hidden_act",
                                  "embedding_dropout",
                                  "attention_dropout",
                                  "residual_dropout",
                                  "max_position_embeddings",
                                  "rope_theta",
                                  "rope_scaling",
                                  "rope_scaling_layers",
                                  "use_qk_norm",
                                  "qk_norm_type",
                                  "layer_norm_eps",
                                  "norm_after",
                                  "rope_parameters",
                                  NULL};
static const char *EXPERT_KEYS[] = {"max_action_horizon",
                                    "max_action_dim",
                                    "hidden_size",
                                    "num_layers",
                                    "num_heads",
                                    "mlp_ratio",
                                    "ffn_multiple_of",
                                    "timestep_embed_dim",
                                    "dropout",
                                    "attn_dropout",
                                    "context_layer_norm",
                                    "qk_norm",
                                    "qk_norm_eps",
                                    "rope",
                                    "causal_attn",
                                    NULL};
static const char *TOP_KEYS[] = {"vit_config",
                                 "adapter_config",
                                 "text_config",
                                 "action_expert_config",
                                 "image_start_token_id",
                                 "low_res_image_start_token_id",
                                 "image_end_token_id",
                                 "image_low_res_id",
                                 "image_patch_id",
                                 "image_high_res_id",
                                 "image_col_id",
                                 "frame_start_token_id",
                                 "frame_end_token_id",
                                 "use_frame_special_tokens",
                                 "add_action_expert",
                                 "max_action_dim",
                                 "max_action_horizon",
                                 "n_obs_steps",
                                 "action_mode",
                                 "state_format",
                                 "flow_matching_num_steps",
                                 "flow_matching_cutoff",
                                 "flow_matching_time_offset",
                                 "flow_matching_time_scale",
                                 "flow_matching_beta_alpha",
                                 "flow_matching_beta_beta",
                                 "mask_action_dim_padding",
                                 "enable_depth_reasoning",
                                 "num_depth_codes",
                                 "action_expert_depth_gate",
                                 "action_expert_depth_gate_per_layer",
                                 "action_expert_depth_gate_init_bias",
                                 "action_output_token_id",
                                 "action_start_token_id",
                                 "action_end_token_id",
                                 "action_token_start_id",
                                 "num_action_tokens",
                                 "depth_output_token_id",
                                 "depth_start_token_id",
                                 "depth_end_token_id",
                                 "depth_token_start_id",
                                 "num_depth_tokens",
                                 "state_start_token_id",
                                 "state_end_token_id",
                                 "state_token_start_id",
                                 "num_state_tokens",
                                 "add_setup_tokens",
                                 "add_control_tokens",
                                 "norm_stats_filename",
                                 "use_grid_token_sampler",
                                 "grid_token_sampler_num_tokens",
                                 "depth_mode",
                                 "molmoact_encoder_mask",
                                 NULL};

static int in_list(const char *k, const char **list) {
    for (int i = 0; list[i]; i++)
        if (strcmp(k, list[i]) == 0) return 1;
    return 0;
}

/* A field this parser does not know: it cannot be one that changes what is computed here (those
 * are known, and either implemented or refused by name below), so it is ignored and listed in
 * cfg->unknown for `inspect`. */
/* fields other configs of these model families carry that would change the computation and are
 * not implemented here: refused by name when set to anything but their neutral value */
static const struct {
    const char *key;
    const char *neutral;
} CHANGES[] = {{"sliding_window", "null"},
               {"use_sliding_window", "false"},
               {"max_window_layers", NULL},
               {"layer_types", NULL},
               {"partial_rotary_factor", "1"},
               {"attention_logit_softcapping", "null"},
               {"final_logit_softcapping", "null"},
               {"use_bidirectional_attention", "false"},
               {"attention_chunk_size", "null"},
               {"no_rope_layers", NULL},
               {NULL, NULL}};

static ma_status refuse_changing(const cJSON *obj, const char *where, const char *label, ma_error *err) {
    if (!cJSON_IsObject(obj)) return MA_OK; /* a section that is not an object is refused by the caller */
    for (const cJSON *e = obj->child; e; e = e->next)
        for (int i = 0; CHANGES[i].key; i++) {
            if (strcmp(e->string, CHANGES[i].key)) continue;
            const char *n = CHANGES[i].neutral;
            const int neutral =
                cJSON_IsNull(e) ||
                (n && ((!strcmp(n, "false") && cJSON_IsFalse(e)) || (!strcmp(n, "1") && cJSON_IsNumber(e) && e->valuedouble == 1.0)));
            if (!neutral)
                return ma_fail(err, MA_ERR_UNSUPPORTED, "%s: %s%s changes the computation and is not implemented", label, where, e->string);
        }
    return MA_OK;
}

static void note_unknown(const cJSON *obj, const char **known, const char *where, ma_config *cfg) {
    if (!cJSON_IsObject(obj)) return; /* an array's items have no names (the section is refused) */
    for (const cJSON *e = obj->child; e; e = e->next)
        if (!in_list(e->string, known) && !in_list(e->string, GENERIC)) {
            const size_t n = strlen(cfg->unknown);
            snprintf(cfg->unknown + n, sizeof cfg->unknown - n, "%s%s%s", n ? ", " : "", where, e->string);
        }
}

typedef struct {
    const char *label, *where;
    ma_error *err;
    ma_status s;
} ctx;

static const cJSON *get(const cJSON *o, const char *k) { return o ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL; }

/* an integer field in [min, max]; sizes are bounded by what the model and memory allow, so a
 * hostile config cannot make a later allocation or loop explode */
static void get_int(ctx *c, const cJSON *o, const char *k, int def, int *out, int min, int max) {
    const cJSON *j = get(o, k);
    *out = def;
    if (c->s || !j || cJSON_IsNull(j)) goto check;
    if (!cJSON_IsNumber(j) || j->valuedouble != floor(j->valuedouble) || j->valuedouble > 2147483647.0 || j->valuedouble < -2147483648.0) {
        c->s = ma_fail(c->err, MA_ERR_FORMAT, "%s: %s%s must be an integer", c->label, c->where, k);
        return;
    }
    *out = (int)j->valuedouble;
check:
    if (!c->s && (*out < min || *out > max))
        c->s = ma_fail(c->err, MA_ERR_RANGE, "%s: %s%s must be in [%d, %d], got %d", c->label, c->where, k, min, max, *out);
}

static void get_id(ctx *c, const cJSON *o, const char *k, int64_t *out) {
    const cJSON *j = get(o, k);
    *out = -1;
    if (c->s || !j || cJSON_IsNull(j)) return;
    if (!cJSON_IsNumber(j) || j->valuedouble != floor(j->valuedouble) || j->valuedouble < 0 || j->valuedouble > 4e9) {
        c->s = ma_fail(c->err, MA_ERR_FORMAT, "%s: %s%s must be a token id", c->label, c->where, k);
        return;
    }
    *out = (int64_t)j->valuedouble;
}

static void get_bool(ctx *c, const cJSON *o, const char *k, int def, int *out) {
    const cJSON *j = get(o, k);
    *out = def;
    if (c->s || !j || cJSON_IsNull(j)) return;
    if (!cJSON_IsBool(j)) {
        c->s = ma_fail(c->err, MA_ERR_FORMAT, "%s: %s%s must be true or false", c->label, c->where, k);
        return;
    }
    *out = cJSON_IsTrue(j);
}

static void get_num(ctx *c, const cJSON *o, const char *k, double def, double *out) {
    const cJSON *j = get(o, k);
    *out = def;
    if (c->s || !j || cJSON_IsNull(j)) return;
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble)) {
        c->s = ma_fail(c->err, MA_ERR_FORMAT, "%s: %s%s must be a number", c->label, c->where, k);
        return;
    }
    *out = j->valuedouble;
}

/* an epsilon or a frequency base: > 0 and finite as a float (0 or less surfaces later as NaN) */
static void positive(ctx *c, const char *field, double v) {
    if (!c->s && !(v > 0 && v < 3e38 && (float)v > 0))
        c->s = ma_fail(c->err, MA_ERR_RANGE, "%s: %s must be > 0, got %g", c->label, field, v);
}

static void get_act(ctx *c, const cJSON *o, const char *k, const char *def, ma_act *out) {
    const cJSON *j = get(o, k);
    const char *v = def;
    if (c->s) return;
    if (j && !cJSON_IsNull(j)) {
        if (!cJSON_IsString(j)) {
            c->s = ma_fail(c->err, MA_ERR_FORMAT, "%s: %s%s must be a string", c->label, c->where, k);
            return;
        }
        v = j->valuestring;
    }
    if (!strcmp(v, "silu") || !strcmp(v, "swish")) *out = MA_ACT_SILU;
    else if (!strcmp(v, "gelu")) *out = MA_ACT_GELU;
    else if (!strcmp(v, "gelu_pytorch_tanh") || !strcmp(v, "gelu_new")) *out = MA_ACT_GELU_TANH;
    else if (!strcmp(v, "relu")) *out = MA_ACT_RELU;
    else if (!strcmp(v, "quick_gelu")) *out = MA_ACT_QUICK_GELU;
    else c->s = ma_fail(c->err, MA_ERR_UNSUPPORTED, "%s: %s%s %s is not supported", c->label, c->where, k, v);
}

static void need(ctx *c, int cond, const char *msg) {
    if (!c->s && !cond) c->s = ma_fail(c->err, MA_ERR_UNSUPPORTED, "%s: %s", c->label, msg);
}

static void check_attn_impl(ctx *c, const cJSON *o, const char *where) {
    const cJSON *j = get(o, "attn_implementation");
    if (c->s || !j || cJSON_IsNull(j)) return;
    if (!cJSON_IsString(j) || (strcmp(j->valuestring, "sdpa") && strcmp(j->valuestring, "eager")))
        c->s = ma_fail(c->err, MA_ERR_UNSUPPORTED, "%s: %sattn_implementation is not supported (sdpa semantics only)", c->label, where);
}

/* text_config.rope_scaling: an object whose type ("rope_type", or the older "type") is "default"
 * changes nothing (transformers' default RoPE reads only rope_theta), so it is accepted; a
 * rope_theta in it must agree with the one in use; its other keys are unused and listed for
 * inspect. Any other type is refused by name. */
static void check_rope_scaling(ctx *c, const cJSON *rs, ma_config *cfg) {
    if (c->s) return;
    if (!cJSON_IsObject(rs)) {
        c->s = ma_fail(c->err, MA_ERR_FORMAT, "%s: text_config.rope_scaling must be an object or null", c->label);
        return;
    }
    int typed = 0;
    for (const cJSON *e = rs->child; e && !c->s; e = e->next) {
        if (!strcmp(e->string, "rope_type") || !strcmp(e->string, "type")) {
            typed = 1;
            if (!cJSON_IsString(e) || strcmp(e->valuestring, "default"))
                c->s = ma_fail(c->err, MA_ERR_UNSUPPORTED, "%s: text_config.rope_scaling.%s %s is not supported (default RoPE only)",
                               c->label, e->string, cJSON_IsString(e) ? e->valuestring : "(not a string)");
        } else if (!strcmp(e->string, "rope_theta")) {
            if (cJSON_IsNull(e)) continue;
            if (!cJSON_IsNumber(e))
                c->s = ma_fail(c->err, MA_ERR_FORMAT, "%s: text_config.rope_scaling.rope_theta must be a number", c->label);
            else if (e->valuedouble != cfg->rope_theta)
                c->s = ma_fail(c->err, MA_ERR_FORMAT, "%s: text_config.rope_scaling.rope_theta %g disagrees with text_config.rope_theta %g",
                               c->label, e->valuedouble, cfg->rope_theta);
        } else {
            const size_t n = strlen(cfg->unknown);
            snprintf(cfg->unknown + n, sizeof cfg->unknown - n, "%stext_config.rope_scaling.%s", n ? ", " : "", e->string);
        }
    }
    if (!c->s && !typed)
        c->s = ma_fail(c->err, MA_ERR_UNSUPPORTED, "%s: text_config.rope_scaling has no rope_type (default RoPE only)", c->label);
}

ma_status ma_config_parse(const char *json, const char *label, ma_config *cfg, ma_error *err) {
    memset(cfg, 0, sizeof *cfg);
    cJSON *root;
    ma_status ps = ma_json_parse_object(json, strlen(json), label, &root, err);
    if (ps) return ps;
    const cJSON *vit = get(root, "vit_config"), *ad = get(root, "adapter_config"), *tx = get(root, "text_config"),
                *ex = get(root, "action_expert_config");
    ctx c = {label, "", err, MA_OK};
    const char *sect_names[] = {"vit_config", "adapter_config", "text_config", "action_expert_config"};
    const cJSON *sects[] = {vit, ad, tx, ex};
    for (int i = 0; i < 4 && !c.s; i++)
        if (sects[i] && !cJSON_IsNull(sects[i]) && !cJSON_IsObject(sects[i]))
            c.s = ma_fail(err, MA_ERR_FORMAT, "%s: %s is not an object", label, sect_names[i]);
    for (int i = 0; i < 4 && !c.s; i++)
        c.s = refuse_changing(sects[i],
                              i == 0   ? "vit_config."
                              : i == 1 ? "adapter_config."
                              : i == 2 ? "text_config."
                                       : "action_expert_config.",
                              label, err);
    if (!c.s) c.s = refuse_changing(root, "", label, err);
    note_unknown(root, TOP_KEYS, "", cfg);
    note_unknown(vit, VIT_KEYS, "vit_config.", cfg);
    note_unknown(ad, ADAPTER_KEYS, "adapter_config.", cfg);
    note_unknown(tx, TEXT_KEYS, "text_config.", cfg);
    note_unknown(ex, EXPERT_KEYS, "action_expert_config.", cfg);

    /* ---- vit */
    c.where = "vit_config.";
    get_int(&c, vit, "hidden_size", 1152, &cfg->vit_hidden, 1, 1 << 15);
    get_int(&c, vit, "intermediate_size", 4304, &cfg->vit_inter, 1, 1 << 18);
    get_int(&c, vit, "num_hidden_layers", 27, &cfg->vit_layers, 1, 512);
    get_int(&c, vit, "num_attention_heads", 16, &cfg->vit_heads, 1, 1024);
    get_int(&c, vit, "num_key_value_heads", 16, &cfg->vit_kv_heads, 1, 1024);
    get_int(&c, vit, "head_dim", 72, &cfg->vit_head_dim, 1, 4096);
    get_int(&c, vit, "image_patch_size", 14, &cfg->patch, 1, 1024);
    get_int(&c, vit, "image_num_pos", 577, &cfg->num_pos, 1, 1 << 20);
    double d;
    get_num(&c, vit, "layer_norm_eps", 1e-6, &d);
    cfg->vit_eps = (float)d;
    positive(&c, "vit_config.layer_norm_eps", d);
    get_act(&c, vit, "hidden_act", "gelu_pytorch_tanh", &cfg->vit_act);
    check_attn_impl(&c, vit, "vit_config.");
    cfg->image_h = cfg->image_w = 378;
    const cJSON *size = get(vit, "image_default_input_size");
    if (!c.s && size && !cJSON_IsNull(size)) {
        if (!cJSON_IsArray(size) || cJSON_GetArraySize(size) != 2 || !cJSON_IsNumber(size->child) || !cJSON_IsNumber(size->child->next) ||
            size->child->valuedouble < 1 || size->child->next->valuedouble < 1 || size->child->valuedouble > 8192 ||
            size->child->next->valuedouble > 8192)
            c.s = ma_fail(err, MA_ERR_FORMAT, "%s: vit_config.image_default_input_size must be two positive integers", label);
        else {
            cfg->image_h = (int)size->child->valuedouble;
            cfg->image_w = (int)size->child->next->valuedouble;
        }
    }
    /* ---- adapter */
    c.where = "adapter_config.";
    get_int(&c, ad, "hidden_size", 1152, &cfg->pool_hidden, 1, 1 << 15);
    get_int(&c, ad, "num_attention_heads", 16, &cfg->pool_heads, 1, 1024);
    get_int(&c, ad, "num_key_value_heads", 16, &cfg->pool_kv_heads, 1, 1024);
    get_int(&c, ad, "head_dim", 72, &cfg->pool_head_dim, 1, 4096);
    get_int(&c, ad, "intermediate_size", 18944, &cfg->proj_inter, 1, 1 << 18);
    get_int(&c, ad, "text_hidden_size", 3584, &cfg->text_hidden, 1, 1 << 15);
    get_bool(&c, ad, "pooling_attention_mask", 0, &cfg->pool_mask);
    get_act(&c, ad, "hidden_act", "silu", &cfg->proj_act);
    check_attn_impl(&c, ad, "adapter_config.");
    const cJSON *vl = get(ad, "vit_layers");
    if (!c.s) {
        int defaults[2] = {-3, -9};
        int n = 0, raw[MA_MAX_TAPS];
        if (vl && !cJSON_IsNull(vl)) {
            if (!cJSON_IsArray(vl) || cJSON_GetArraySize(vl) < 1 || cJSON_GetArraySize(vl) > MA_MAX_TAPS)
                c.s = ma_fail(err, MA_ERR_FORMAT, "%s: adapter_config.vit_layers must be a list of 1..%d integers", label, MA_MAX_TAPS);
            for (const cJSON *e = vl->child; e && !c.s; e = e->next) {
                if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || fabs(e->valuedouble) > 1e6)
                    c.s = ma_fail(err, MA_ERR_FORMAT, "%s: adapter_config.vit_layers entries must be integers", label);
                else raw[n++] = (int)e->valuedouble;
            }
        } else {
            raw[0] = defaults[0];
            raw[1] = defaults[1];
            n = 2;
        }
        cfg->n_taps = n;
        cfg->vit_built = 0;
        for (int i = 0; i < n && !c.s; i++) {
            int idx = raw[i] < 0 ? raw[i] + cfg->vit_layers : raw[i];
            if (idx < 0 || idx >= cfg->vit_layers)
                c.s = ma_fail(err, MA_ERR_FORMAT, "%s: adapter_config.vit_layers entry %d is out of range", label, raw[i]);
            cfg->taps[i] = idx;
            if (idx + 1 > cfg->vit_built) cfg->vit_built = idx + 1;
        }
    }
    /* ---- text */
    c.where = "text_config.";
    get_int(&c, tx, "hidden_size", 3584, &cfg->d, 1, 1 << 15);
    get_int(&c, tx, "num_attention_heads", 28, &cfg->heads, 1, 1024);
    get_int(&c, tx, "num_key_value_heads", 4, &cfg->kv_heads, 1, 1024);
    if (!c.s && get(tx, "num_key_value_heads") && cJSON_IsNull(get(tx, "num_key_value_heads"))) cfg->kv_heads = cfg->heads;
    get_int(&c, tx, "head_dim", 128, &cfg->head_dim, 1, 4096);
    get_int(&c, tx, "vocab_size", 152064, &cfg->vocab, 1, 1 << 23);
    get_int(&c, tx, "additional_vocab_size", 128, &cfg->extra_vocab, 0, 1 << 20);
    get_int(&c, tx, "num_hidden_layers", 48, &cfg->layers, 1, 512);
    get_int(&c, tx, "intermediate_size", 18944, &cfg->inter, 1, 1 << 18);
    get_int(&c, tx, "max_position_embeddings", 4096, &cfg->max_positions, 1, 1 << 24);
    get_bool(&c, tx, "qkv_bias", 1, &cfg->qkv_bias);
    get_bool(&c, tx, "use_qk_norm", 0, &cfg->qk_norm);
    get_bool(&c, tx, "norm_after", 0, &cfg->norm_after);
    get_num(&c, tx, "layer_norm_eps", 1e-6, &d);
    cfg->eps = (float)d;
    positive(&c, "text_config.layer_norm_eps", d);
    get_num(&c, tx, "rope_theta", 1000000.0, &cfg->rope_theta);
    /* transformers 5 moves RoPE's settings into rope_parameters {rope_type, rope_theta}: the
     * default RoPE is implemented, a scaled one is refused by name; a theta in both places must
     * agree */
    if (!c.s && get(tx, "rope_parameters") && !cJSON_IsNull(get(tx, "rope_parameters"))) {
        const cJSON *rp = get(tx, "rope_parameters"), *ty = get(rp, "rope_type"), *th = get(rp, "rope_theta");
        if (!cJSON_IsObject(rp)) c.s = ma_fail(err, MA_ERR_FORMAT, "%s: text_config.rope_parameters must be an object", label);
        else if (ty && !cJSON_IsNull(ty) && (!cJSON_IsString(ty) || strcmp(ty->valuestring, "default")))
            c.s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: text_config.rope_parameters.rope_type %s is not supported (default RoPE only)",
                          label, cJSON_IsString(ty) ? ty->valuestring : "(not a string)");
        else if (th && !cJSON_IsNull(th)) {
            if (!cJSON_IsNumber(th))
                c.s = ma_fail(err, MA_ERR_FORMAT, "%s: text_config.rope_parameters.rope_theta must be a number", label);
            else if (get(tx, "rope_theta") && !cJSON_IsNull(get(tx, "rope_theta")) && th->valuedouble != cfg->rope_theta)
                c.s = ma_fail(err, MA_ERR_FORMAT, "%s: text_config.rope_theta %g and rope_parameters.rope_theta %g disagree", label,
                              cfg->rope_theta, th->valuedouble);
            else cfg->rope_theta = th->valuedouble;
        }
        for (const cJSON *e = cJSON_IsObject(rp) ? rp->child : NULL; !c.s && e; e = e->next)
            if (strcmp(e->string, "rope_type") && strcmp(e->string, "rope_theta"))
                c.s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: text_config.rope_parameters.%s is not supported (default RoPE only)", label,
                              e->string);
    }
    positive(&c, "text_config.rope_theta", cfg->rope_theta);
    get_act(&c, tx, "hidden_act", "silu", &cfg->act);
    check_attn_impl(&c, tx, "text_config.");
    if (!c.s) {
        const cJSON *qt = get(tx, "qk_norm_type");
        const char *t = qt && cJSON_IsString(qt) ? qt->valuestring : "olmo";
        if (qt && !cJSON_IsNull(qt) && !cJSON_IsString(qt))
            c.s = ma_fail(err, MA_ERR_FORMAT, "%s: text_config.qk_norm_type must be a string", label);
        else if (strcmp(t, "qwen3") && strcmp(t, "olmo"))
            c.s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: text_config.qk_norm_type %s is unknown", label, t);
        cfg->qk_norm_qwen3 = strcmp(t, "qwen3") == 0;
        const cJSON *rs = get(tx, "rope_scaling"), *rl = get(tx, "rope_scaling_layers");
        if (rs && !cJSON_IsNull(rs)) check_rope_scaling(&c, rs, cfg);
        if (!c.s && rl && !cJSON_IsNull(rl))
            c.s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: text_config.rope_scaling_layers is not supported", label);
    }
    /* ---- expert */
    c.where = "action_expert_config.";
    int have_expert = ex && !cJSON_IsNull(ex);
    get_int(&c, ex, "hidden_size", 1024, &cfg->e_hidden, 1, 1 << 15);
    get_int(&c, ex, "num_layers", have_expert ? 32 : cfg->layers, &cfg->e_layers, 1, 512);
    get_int(&c, ex, "num_heads", 16, &cfg->e_heads, 1, 1024);
    get_int(&c, ex, "timestep_embed_dim", 256, &cfg->e_time_dim, 1, 1 << 15);
    int multiple;
    get_int(&c, ex, "ffn_multiple_of", 256, &multiple, 0, 1 << 16);
    double ratio;
    get_num(&c, ex, "mlp_ratio", 8.0 / 3.0, &ratio);
    get_bool(&c, ex, "context_layer_norm", 1, &cfg->e_ctx_norm);
    get_bool(&c, ex, "qk_norm", 1, &cfg->e_qk_norm);
    get_bool(&c, ex, "rope", 1, &cfg->e_rope);
    get_bool(&c, ex, "causal_attn", 0, &cfg->e_causal);
    get_num(&c, ex, "qk_norm_eps", 1e-6, &d);
    cfg->e_qk_eps = (float)d;
    if (!c.s && !(d >= 0 && d < 1))
        c.s = ma_fail(err, MA_ERR_RANGE, "%s: action_expert_config.qk_norm_eps must be in [0, 1), got %g", label, d);
    if (!c.s) {
        /* int() truncation as upstream, then up to the multiple; checked in doubles and int64
         * before anything becomes an int (a hostile hidden_size x mlp_ratio overflows it) */
        const double want = (double)cfg->e_hidden * ratio;
        int64_t inner = 0;
        if (!(ratio > 0) || ratio > 64) c.s = ma_fail(err, MA_ERR_FORMAT, "%s: action_expert_config.mlp_ratio out of range", label);
        else if (want < 1 || want > (double)(1 << 24))
            c.s = ma_fail(err, MA_ERR_FORMAT, "%s: action_expert_config.hidden_size x mlp_ratio out of range", label);
        else {
            inner = (int64_t)want;
            if (multiple > 0) inner = (inner + multiple - 1) / multiple * multiple;
            if (inner > (1 << 24)) c.s = ma_fail(err, MA_ERR_FORMAT, "%s: action_expert_config.ffn_multiple_of out of range", label);
            else cfg->e_inner = (int)inner;
        }
    }
    /* ---- top */
    c.where = "";
    get_int(&c, root, "max_action_dim", 32, &cfg->max_action_dim, 1, MA_MAX_ACTION_DIM);
    get_int(&c, root, "max_action_horizon", 30, &cfg->max_action_horizon, 1, MA_MAX_ACTION_HORIZON);
    get_int(&c, root, "n_obs_steps", 30, &cfg->n_obs_steps, 1, MA_MAX_ACTION_HORIZON);
    get_int(&c, root, "flow_matching_num_steps", 10, &cfg->flow_steps, 1, MA_MAX_FLOW_STEPS);
    get_int(&c, root, "num_state_tokens", 256, &cfg->num_state_tokens, 1, 1 << 16);
    get_int(&c, root, "grid_token_sampler_num_tokens", 16, &cfg->grid_tokens, 1, 4096);
    get_bool(&c, root, "use_grid_token_sampler", 0, &cfg->use_grid_sampler);
    cfg->use_grid_sampler_set = get(root, "use_grid_token_sampler") && !cJSON_IsNull(get(root, "use_grid_token_sampler"));
    cfg->grid_tokens_set = get(root, "grid_token_sampler_num_tokens") && !cJSON_IsNull(get(root, "grid_token_sampler_num_tokens"));
    get_bool(&c, root, "mask_action_dim_padding", 1, &cfg->mask_action_dim_padding);
    get_bool(&c, root, "add_setup_tokens", 1, &cfg->add_setup_tokens);
    get_bool(&c, root, "add_control_tokens", 1, &cfg->add_control_tokens);
    get_id(&c, root, "image_patch_id", &cfg->image_patch_id);
    get_id(&c, root, "image_col_id", &cfg->image_col_id);
    get_id(&c, root, "image_start_token_id", &cfg->image_start_id);
    get_id(&c, root, "image_end_token_id", &cfg->image_end_id);
    get_id(&c, root, "low_res_image_start_token_id", &cfg->low_res_start_id);
    get_id(&c, root, "image_low_res_id", &cfg->image_low_res_id);
    get_id(&c, root, "frame_start_token_id", &cfg->frame_start_id);
    get_id(&c, root, "frame_end_token_id", &cfg->frame_end_id);
    get_id(&c, root, "eos_token_id", &cfg->eos_id);
    get_id(&c, root, "bos_token_id", &cfg->bos_id);
    get_id(&c, root, "pad_token_id", &cfg->pad_id);
    get_id(&c, root, "action_start_token_id", &cfg->action_start_id);
    get_id(&c, root, "action_end_token_id", &cfg->action_end_id);
    get_id(&c, root, "action_output_token_id", &cfg->action_output_id);
    get_id(&c, root, "state_start_token_id", &cfg->state_start_id);
    get_id(&c, root, "state_end_token_id", &cfg->state_end_id);
    get_id(&c, root, "state_token_start_id", &cfg->state_token_start_id);
    snprintf(cfg->norm_stats_filename, sizeof cfg->norm_stats_filename, "norm_stats.json");
    if (!c.s) {
        const cJSON *j;
        if ((j = get(root, "action_mode")) && !cJSON_IsNull(j)) {
            if (!cJSON_IsString(j)) c.s = ma_fail(err, MA_ERR_FORMAT, "%s: action_mode must be a string", label);
            else if (!strcmp(j->valuestring, "both")) cfg->action_mode_both = 1;
            else if (!strcmp(j->valuestring, "continuous")) cfg->action_mode_both = 0;
            else
                c.s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: action_mode %s: continuous actions need 'both' or 'continuous'", label,
                              j->valuestring);
        } else cfg->action_mode_both = 1;
        /* the expert's encoder mask: "action_mode" (the HF model's rule) or "prompt" (every prompt
         * token: LeRobot's for a policy saved in continuous mode; written by compile) */
        if (!c.s && (j = get(root, "molmoact_encoder_mask")) && !cJSON_IsNull(j)) {
            if (!cJSON_IsString(j) || (strcmp(j->valuestring, "prompt") && strcmp(j->valuestring, "action_mode")))
                c.s = ma_fail(err, MA_ERR_FORMAT, "%s: molmoact_encoder_mask must be \"prompt\" or \"action_mode\"", label);
            else cfg->encoder_mask_prompt = !strcmp(j->valuestring, "prompt");
        }
        if (!c.s && (j = get(root, "state_format")) && !cJSON_IsNull(j) && (!cJSON_IsString(j) || strcmp(j->valuestring, "discrete")))
            c.s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: state_format must be 'discrete'", label);
        if (!c.s && (j = get(root, "add_action_expert")) && !cJSON_IsNull(j) && !cJSON_IsTrue(j))
            c.s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: add_action_expert must be true (continuous actions)", label);
        if (!c.s && (j = get(root, "enable_depth_reasoning")) && cJSON_IsTrue(j))
            c.s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: enable_depth_reasoning is not supported", label);
        if (!c.s && (j = get(root, "action_expert_depth_gate")) && cJSON_IsTrue(j))
            c.s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: action_expert_depth_gate is not supported", label);
        if (!c.s && (j = get(root, "norm_stats_filename")) && !cJSON_IsNull(j)) {
            if (!cJSON_IsString(j) || !j->valuestring[0] || strchr(j->valuestring, '/') ||
                strlen(j->valuestring) >= sizeof cfg->norm_stats_filename)
                c.s = ma_fail(err, MA_ERR_FORMAT, "%s: norm_stats_filename must be a plain file name", label);
            else snprintf(cfg->norm_stats_filename, sizeof cfg->norm_stats_filename, "%s", j->valuestring);
        }
    }
    cJSON_Delete(root);
    if (c.s) return c.s;

    /* ---- derived values and consistency */
    cfg->e_head_dim = cfg->e_hidden / cfg->e_heads;
    cfg->patch_h = cfg->image_h / cfg->patch;
    cfg->patch_w = cfg->image_w / cfg->patch;
    cfg->pooled_h = (cfg->patch_h + 1) / 2;
    cfg->pooled_w = (cfg->patch_w + 1) / 2;
    int side = (int)lround(sqrt((double)cfg->num_pos));
    need(&c, cfg->patch_h > 0 && cfg->patch_w > 0, "vit_config.image_default_input_size is smaller than one patch");
    need(&c, side * side == cfg->num_pos && side == cfg->patch_h && side == cfg->patch_w,
         "vit_config.image_num_pos does not match the patch grid (positional-embedding interpolation is not implemented)");
    need(&c, cfg->vit_heads % cfg->vit_kv_heads == 0, "vit_config.num_attention_heads must be a multiple of num_key_value_heads");
    need(&c, cfg->vit_heads * cfg->vit_head_dim == cfg->vit_hidden, "vit_config.num_attention_heads * head_dim must equal hidden_size");
    need(&c, cfg->pool_heads % cfg->pool_kv_heads == 0, "adapter_config.num_attention_heads must be a multiple of num_key_value_heads");
    need(&c, cfg->pool_heads * cfg->pool_head_dim == cfg->pool_hidden,
         "adapter_config.num_attention_heads * head_dim must equal hidden_size");
    need(&c, cfg->heads % cfg->kv_heads == 0, "text_config.num_attention_heads must be a multiple of num_key_value_heads");
    need(&c, cfg->head_dim % 2 == 0, "text_config.head_dim must be even (RoPE)");
    need(&c, cfg->text_hidden == cfg->d, "adapter_config.text_hidden_size must equal text_config.hidden_size");
    need(&c, cfg->e_hidden % cfg->e_heads == 0, "action_expert_config.hidden_size must be divisible by num_heads");
    need(&c, !cfg->e_rope || cfg->e_head_dim % 2 == 0, "action_expert_config: RoPE needs an even head dim");
    need(&c, cfg->e_layers == cfg->layers, "action_expert_config.num_layers must equal text_config.num_hidden_layers");
    need(&c, cfg->image_patch_id >= 0, "image_patch_id is missing");
    need(&c, cfg->eos_id >= 0, "eos_token_id is missing");
    need(&c, cfg->n_obs_steps <= cfg->max_action_horizon, "n_obs_steps exceeds max_action_horizon");
    need(&c, cfg->e_time_dim >= 2, "action_expert_config.timestep_embed_dim must be >= 2");
    return c.s;
}

ma_status ma_config_load(const char *path, ma_config *cfg, ma_error *err) {
    char *text = NULL;
    ma_status s = ma_read_file(path, 16u << 20, &text, NULL, err);
    if (s) return s;
    s = ma_config_parse(text, path, cfg, err);
    free(text);
    return s;
}
