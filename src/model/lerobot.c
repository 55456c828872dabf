/* SPDX-License-Identifier: Apache-2.0 */
/* A LeRobot MolmoAct2 policy directory (lerobot.h). The formats are LeRobot's, read in
 * huggingface/lerobot at 7427f31801f944f5ec9ce53cda02862ce7d1638b (main) and at the releases
 * v0.6.0 (30da8e687a6dfc617fcd94afc367ac7071c376ce), v0.6.1 (7e241bd630a3719a56157a497ce5d08f244784f1)
 * and the first merge (24017e960c39a24fe1b6ea6248522460fa5aa4b3):
 *   - src/lerobot/policies/molmoact2/configuration_molmoact2.py: the policy config's fields;
 *   - src/lerobot/processor/pipeline.py: a pipeline's JSON ({"name", "steps": [{"registry_name",
 *     "config", "state_file"}]}) and its state files ("<pipeline>_step_<i>_<registry_name>
 *     .safetensors", flat, keys "<feature>.<stat>");
 *   - src/lerobot/policies/molmoact2/processor_molmoact2.py: the steps' registry names
 *     (molmoact2_masked_normalizer, molmoact2_clamp_normalized, molmoact2_pack_inputs,
 *     molmoact2_clamp_action, molmoact2_masked_unnormalizer) and their arithmetic;
 *   - src/lerobot/policies/molmoact2/modeling_molmoact2.py: chunk_size over the HF horizon,
 *     num_inference_steps, the encoder mask of a saved "continuous" policy, the LoRA wrapping;
 *   - huggingface_hub src/huggingface_hub/constants.py and file_download.py
 *     (ee0a4510f4bc15e26cb722be2efc2bdb01383ca0): the cache's place and layout. */
#define _GNU_SOURCE
#include "model/lerobot.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/jsonline.h"
#include "io/mapfile.h"
#include "io/safetensors.h"

static ma_status read_json(const char *dir, const char *name, cJSON **out, ma_error *err) {
    char *path = ma_path_join(dir, name), *text = NULL;
    size_t len = 0;
    if (!path) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
    ma_status s = ma_read_file(path, 16u << 20, &text, &len, err);
    if (!s) s = ma_json_parse_object(text, len, path, out, err);
    free(text);
    free(path);
    return s;
}

static const cJSON *get(const cJSON *o, const char *k) { return o ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL; }

int ma_is_lerobot_dir(const char *dir) {
    cJSON *c = NULL;
    if (read_json(dir, "config.json", &c, NULL)) return 0;
    const cJSON *t = get(c, "type");
    const int yes = cJSON_IsString(t) && !strcmp(t->valuestring, "molmoact2");
    cJSON_Delete(c);
    return yes;
}

/* ------------------------------------------------------------------------------ the base */

static int has_file(const char *dir, const char *name) {
    char *p = ma_path_join(dir, name);
    const int ok = p && ma_is_file(p);
    free(p);
    return ok;
}

/* the hub cache's directory, as huggingface_hub resolves it */
static void hub_cache(char *out, size_t cap) {
    const char *e;
    if ((e = getenv("HF_HUB_CACHE")) && *e) snprintf(out, cap, "%s", e);
    else if ((e = getenv("HUGGINGFACE_HUB_CACHE")) && *e) snprintf(out, cap, "%s", e);
    else if ((e = getenv("HF_HOME")) && *e) snprintf(out, cap, "%s/hub", e);
    else if ((e = getenv("XDG_CACHE_HOME")) && *e) snprintf(out, cap, "%s/huggingface/hub", e);
    else snprintf(out, cap, "%s/.cache/huggingface/hub", getenv("HOME") ? getenv("HOME") : "");
}

static int hex40(const char *s) {
    if (strlen(s) != 40) return 0;
    for (int i = 0; i < 40; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

/* models--ORG--NAME/snapshots/<revision, or the commit refs/<revision or main> names> */
static int from_cache(const char *repo, const char *revision, char *out, size_t cap, char *where, size_t wcap) {
    char cache[PATH_MAX], folder[PATH_MAX];
    hub_cache(cache, sizeof cache);
    char flat[300];
    snprintf(flat, sizeof flat, "%s", repo);
    for (char *p = flat; *p; p++)
        if (*p == '/') { memmove(p + 2, p + 1, strlen(p + 1) + 1); p[0] = '-'; p[1] = '-'; p++; }
    snprintf(folder, sizeof folder, "%s/models--%s", cache, flat);
    snprintf(where, wcap, "%s", folder);
    char commit[128] = "";
    const char *rev = revision && *revision ? revision : "main";
    if (hex40(rev)) snprintf(commit, sizeof commit, "%s", rev);
    else {
        char ref[PATH_MAX + 64];
        snprintf(ref, sizeof ref, "%s/refs/%s", folder, rev);
        FILE *f = fopen(ref, "r");
        if (!f) return 0;
        if (!fgets(commit, sizeof commit, f)) commit[0] = '\0';
        fclose(f);
        commit[strcspn(commit, "\r\n \t")] = '\0';
        if (!hex40(commit)) return 0;
    }
    snprintf(out, cap, "%s/snapshots/%s", folder, commit);
    return ma_is_dir(out);
}

static ma_status resolve_base(ma_lerobot *lr, const char *base, const char *revision, ma_error *err) {
    static const char NEED[] = "config.json, tokenizer.json, tokenizer_config.json, processor_config.json";
    if (base && *base) {
        if (!ma_is_dir(base)) return ma_fail(err, MA_ERR_IO, "--base %s is not a directory", base);
        snprintf(lr->base_dir, sizeof lr->base_dir, "%s", base);
        snprintf(lr->base_from, sizeof lr->base_from, "--base");
    } else if (lr->repo_id[0] && ma_is_dir(lr->repo_id)) {
        snprintf(lr->base_dir, sizeof lr->base_dir, "%s", lr->repo_id); /* checkpoint_path: a local directory */
        snprintf(lr->base_from, sizeof lr->base_from, "checkpoint_path");
    } else {
        char where[PATH_MAX];
        if (!lr->repo_id[0])
            return ma_fail(err, MA_ERR_FORMAT, "%s/config.json: checkpoint_path is empty, and no --base DIR was given", lr->dir);
        if (!from_cache(lr->repo_id, revision, lr->base_dir, sizeof lr->base_dir, where, sizeof where))
            return ma_fail(err, MA_ERR_IO,
                           "%s is a LeRobot policy: its model config, tokenizer and processor come from the base repo %s (checkpoint_path), "
                           "which is neither given (--base DIR) nor in the Hugging Face cache (%s). Download it with: "
                           "hf download %s --include 'config.json' 'tokenizer*' 'processor_config.json' 'norm_stats.json' "
                           "(the files needed: %s)", lr->dir, lr->repo_id, where, lr->repo_id, NEED);
        snprintf(lr->base_from, sizeof lr->base_from, "the Hugging Face cache");
    }
    static const char *const required[] = {"config.json", "tokenizer.json"};
    for (int i = 0; i < 2; i++)
        if (!has_file(lr->base_dir, required[i]))
            return ma_fail(err, MA_ERR_IO, "%s (the base, from %s): %s is missing (needed: %s)%s%s", lr->base_dir, lr->base_from, required[i],
                           NEED, lr->repo_id[0] ? "; download it with: hf download " : "", lr->repo_id[0] ? lr->repo_id : "");
    return MA_OK;
}

/* ------------------------------------------------------------------------------ the pipelines */

/* the step of a pipeline whose registry_name is one of names (releases differ in index) */
static const cJSON *find_step(const cJSON *pipe, const char *const *names, int n) {
    const cJSON *steps = get(pipe, "steps");
    for (const cJSON *st = cJSON_IsArray(steps) ? steps->child : NULL; st; st = st->next) {
        const cJSON *rn = get(st, "registry_name");
        for (int i = 0; cJSON_IsString(rn) && i < n; i++)
            if (!strcmp(rn->valuestring, names[i])) return st;
    }
    return NULL;
}

static const char *norm_mode_name(const char *lerobot_mode, ma_error *err, const char *where, ma_status *s) {
    if (!strcmp(lerobot_mode, "QUANTILES")) return "q01_q99";
    if (!strcmp(lerobot_mode, "QUANTILE10")) return "q10_q90";
    if (!strcmp(lerobot_mode, "MIN_MAX")) return "min_max";
    if (!strcmp(lerobot_mode, "MEAN_STD")) return "mean_std";
    if (!strcmp(lerobot_mode, "IDENTITY")) return "none";
    *s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: normalization mode %s is not one LeRobot defines here (QUANTILES, QUANTILE10, MIN_MAX, MEAN_STD, IDENTITY)",
                 where, lerobot_mode);
    return NULL;
}

/* a feature's statistics from a step's state file into a norm_stats-style object */
static ma_status stats_object(const ma_safetensors *st, const char *file, const char *feature, int dim, cJSON *out, ma_error *err) {
    static const char *const NAMES[] = {"mean", "std", "min", "max", "q01", "q99", "q10", "q90", "mask"};
    int found = 0;
    for (size_t k = 0; k < sizeof NAMES / sizeof NAMES[0]; k++) {
        char key[160];
        snprintf(key, sizeof key, "%s.%s", feature, NAMES[k]);
        const ma_st_tensor *t = ma_st_find(st, key);
        if (!t) continue;
        int64_t n = t->ndim == 1 ? t->shape[0] : -1;
        if (t->ndim != 1 || (t->dtype != MA_DT_F32 && t->dtype != MA_DT_F64 && t->dtype != MA_DT_BOOL))
            return ma_fail(err, MA_ERR_FORMAT, "%s: %s must be a float32 vector", file, key);
        if (n != dim)
            return ma_fail(err, MA_ERR_SHAPE, "%s: %s has %lld values, but the policy's %s has %d (config.json %s)", file, key, (long long)n,
                           feature, dim, !strcmp(feature, "action") ? "output_features" : "input_features");
        cJSON *arr = cJSON_CreateArray();
        for (int64_t i = 0; i < n; i++) {
            double v = t->dtype == MA_DT_F32 ? ((const float *)t->data)[i] : t->dtype == MA_DT_F64 ? ((const double *)t->data)[i]
                                                                                                : ((const uint8_t *)t->data)[i];
            if (!isfinite(v)) { cJSON_Delete(arr); return ma_fail(err, MA_ERR_RANGE, "%s: %s[%lld] is not finite", file, key, (long long)i); }
            if (k == 8) { /* the gripper mask, saved as float 1.0 / 0.0 */
                if (v != 0.0 && v != 1.0) { cJSON_Delete(arr); return ma_fail(err, MA_ERR_FORMAT, "%s: %s[%lld] is %g, not 0 or 1", file, key, (long long)i, v); }
                cJSON_AddItemToArray(arr, cJSON_CreateBool(v != 0.0));
            } else cJSON_AddItemToArray(arr, cJSON_CreateNumber((float)v));
        }
        cJSON_AddItemToObject(out, NAMES[k], arr);
        found++;
    }
    return found ? MA_OK : ma_fail(err, MA_ERR_FORMAT, "%s holds no statistics of %s (%s.q01, %s.q99, ...)", file, feature, feature, feature);
}

/* the normaliser's or unnormaliser's step: its mode for a feature type, eps, and its statistics */
static ma_status read_norm_step(const ma_lerobot *lr, const char *pipe_file, const char *const *names, int n_names, const char *feature,
                                const char *type, int dim, cJSON *stats, char *mode, double *eps, ma_error *err) {
    cJSON *pipe = NULL;
    ma_status s = read_json(lr->dir, pipe_file, &pipe, err);
    if (s) return ma_error_wrap(err, s, "%s: the LeRobot processor pipeline", lr->dir);
    const cJSON *step = find_step(pipe, names, n_names);
    char where[PATH_MAX + 64];
    snprintf(where, sizeof where, "%s/%s", lr->dir, pipe_file);
    if (!step) {
        s = ma_fail(err, MA_ERR_FORMAT, "%s: no step named %s%s%s (the %s)", where, names[0], n_names > 1 ? " or " : "", n_names > 1 ? names[1] : "",
                    !strcmp(feature, "action") ? "unnormaliser" : "normaliser");
        goto done;
    }
    const cJSON *cfg = get(step, "config"), *map = get(cfg, "norm_map"), *m = get(map, type), *e = get(cfg, "eps"), *sf = get(step, "state_file");
    if (!cJSON_IsString(m)) { s = ma_fail(err, MA_ERR_FORMAT, "%s: the %s step's norm_map has no %s mode", where, names[0], type); goto done; }
    const char *mm = norm_mode_name(m->valuestring, err, where, &s);
    if (!mm) goto done;
    snprintf(mode, 16, "%s", mm);
    *eps = cJSON_IsNumber(e) ? e->valuedouble : 1e-8;
    if (!cJSON_IsString(sf) || strchr(sf->valuestring, '/')) { s = ma_fail(err, MA_ERR_FORMAT, "%s: the %s step has no state_file", where, names[0]); goto done; }
    char *path = ma_path_join(lr->dir, sf->valuestring);
    if (!path) { s = ma_fail(err, MA_ERR_NOMEM, "out of memory"); goto done; }
    if (!ma_is_file(path)) s = ma_fail(err, MA_ERR_IO, "%s: missing (the %s step's statistics, named by %s)", path, names[0], pipe_file);
    else {
        ma_safetensors st;
        if (!(s = ma_st_open(&st, path, err))) {
            s = stats_object(&st, path, feature, dim, stats, err);
            ma_st_close(&st);
        }
    }
    free(path);
done:
    cJSON_Delete(pipe);
    return s;
}

static int feature_dim(const cJSON *features, const char *key, int def) {
    const cJSON *sh = get(get(features, key), "shape");
    if (cJSON_IsArray(sh) && cJSON_GetArraySize(sh) == 1 && cJSON_IsNumber(sh->child)) return (int)sh->child->valuedouble;
    return def;
}

/* the prompt step's settings (setup, control mode, state bins, ...) */
static void read_pack_step(ma_lerobot *lr, cJSON *stats_meta) {
    cJSON *pipe = NULL;
    if (read_json(lr->dir, "policy_preprocessor.json", &pipe, NULL)) return;
    static const char *const names[] = {"molmoact2_pack_inputs"};
    const cJSON *cfg = get(find_step(pipe, names, 1), "config");
    if (cfg) {
        lr->have_pack = 1;
        const cJSON *v;
        if (cJSON_IsString(v = get(cfg, "setup_type"))) cJSON_AddStringToObject(stats_meta, "setup_type", v->valuestring);
        if (cJSON_IsString(v = get(cfg, "control_mode"))) cJSON_AddStringToObject(stats_meta, "control_mode", v->valuestring);
        lr->num_state_tokens = cJSON_IsNumber(v = get(cfg, "num_state_tokens")) ? (int)v->valuedouble : 256;
        lr->add_setup_tokens = (v = get(cfg, "add_setup_tokens")) ? cJSON_IsTrue(v) : 1;
        lr->add_control_tokens = (v = get(cfg, "add_control_tokens")) ? cJSON_IsTrue(v) : 1;
        lr->normalize_language = (v = get(cfg, "normalize_language")) ? cJSON_IsTrue(v) : 1;
    }
    cJSON_Delete(pipe);
}

/* ------------------------------------------------------------------------------ open */

ma_status ma_lerobot_open(const char *dir, const char *base, ma_lerobot *lr, ma_error *err) {
    memset(lr, 0, sizeof *lr);
    snprintf(lr->dir, sizeof lr->dir, "%s", dir);
    cJSON *cfg = NULL, *ns = NULL;
    ma_status s = read_json(dir, "config.json", &cfg, err);
    if (s) return s;
    char label[PATH_MAX + 16];
    snprintf(label, sizeof label, "%s/config.json", dir);
    const cJSON *v;
    if (cJSON_IsString(v = get(cfg, "checkpoint_path"))) snprintf(lr->repo_id, sizeof lr->repo_id, "%s", v->valuestring);
    const cJSON *rev = get(cfg, "checkpoint_revision");
    lr->chunk_size = cJSON_IsNumber(v = get(cfg, "chunk_size")) ? (int)v->valuedouble : 0;
    lr->n_action_steps = cJSON_IsNumber(v = get(cfg, "n_action_steps")) ? (int)v->valuedouble : 0;
    lr->num_inference_steps = cJSON_IsNumber(v = get(cfg, "num_inference_steps")) ? (int)v->valuedouble : 0;
    if (lr->chunk_size < 0 || lr->chunk_size > 1024 || lr->n_action_steps < 0 || lr->n_action_steps > 1024 || lr->num_inference_steps < 0 ||
        lr->num_inference_steps > 256)
        s = ma_fail(err, MA_ERR_RANGE, "%s: chunk_size, n_action_steps or num_inference_steps out of range", label);
    else if (lr->chunk_size && lr->n_action_steps > lr->chunk_size)
        s = ma_fail(err, MA_ERR_RANGE, "%s: n_action_steps %d exceeds chunk_size %d", label, lr->n_action_steps, lr->chunk_size);
    /* the saved training mode decides the expert's encoder mask (modeling_molmoact2.py,
     * _encoder_attention_mask_for_action_expert): a "continuous" policy attends to the whole
     * prompt, a "both" policy drops EOS tokens and action spans as the HF model does */
    snprintf(lr->action_mode, sizeof lr->action_mode, "%s", cJSON_IsString(v = get(cfg, "action_mode")) ? v->valuestring : "both");
    const cJSON *inf = get(cfg, "inference_action_mode");
    if (!s && strcmp(lr->action_mode, "continuous") && strcmp(lr->action_mode, "both"))
        s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: action_mode \"%s\": this runtime runs continuous (flow-matching) actions, which need "
                    "\"continuous\" or \"both\"", label, lr->action_mode);
    if (!s && cJSON_IsString(inf) && strcmp(inf->valuestring, "continuous"))
        s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: inference_action_mode \"%s\": only continuous actions are implemented", label, inf->valuestring);
    lr->full_encoder_mask = !strcmp(lr->action_mode, "continuous");
    /* LoRA: train_mode_vlm (main) or enable_lora_vlm (v0.6.x); the adapters stay unmerged */
    lr->lora = (cJSON_IsString(v = get(cfg, "train_mode_vlm")) && !strcmp(v->valuestring, "lora")) || cJSON_IsTrue(get(cfg, "enable_lora_vlm")) ||
               cJSON_IsTrue(get(cfg, "enable_lora_action_expert"));
    lr->lora_rank = cJSON_IsNumber(v = get(cfg, "lora_rank")) ? (int)v->valuedouble : 64;
    lr->lora_alpha = cJSON_IsNumber(v = get(cfg, "lora_alpha")) ? v->valuedouble : 16;
    if (!s && (lr->lora_rank < 1 || !(lr->lora_alpha > 0)))
        s = ma_fail(err, MA_ERR_RANGE, "%s: lora_rank and lora_alpha must be positive", label);
    if (!s && cJSON_IsTrue(get(cfg, "use_peft")))
        s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: use_peft: the policy was wrapped by LeRobot's generic --peft route (adapter_model.safetensors "
                    "with adapter_config.json); merge it with PEFT (merge_and_unload) and save the policy, then compile", label);
    lr->grid_sampler = (v = get(cfg, "use_grid_token_sampler")) ? cJSON_IsTrue(v) : -1;
    lr->grid_tokens = cJSON_IsNumber(v = get(cfg, "grid_token_sampler_num_tokens")) ? (int)v->valuedouble : 0;
    const cJSON *fin = get(cfg, "input_features"), *fout = get(cfg, "output_features");
    lr->state_dim = feature_dim(fin, "observation.state", 0);
    lr->action_dim = feature_dim(fout, "action", 0);
    if (!s && (lr->action_dim < 1 || lr->action_dim > 32 || lr->state_dim < 0 || lr->state_dim > 64))
        s = ma_fail(err, MA_ERR_FORMAT, "%s: output_features.action needs a shape [1..32] and input_features.observation.state [0..64]", label);
    if (!s) s = resolve_base(lr, base, cJSON_IsString(rev) ? rev->valuestring : NULL, err);
    /* the statistics, with LeRobot's arithmetic, as a norm_stats.json that the common parser
     * checks (lengths, order, masks) */
    if (!s) {
        ns = cJSON_CreateObject();
        cJSON_AddStringToObject(ns, "format", "molmoact2_norm_stats.v1");
        cJSON_AddStringToObject(ns, "default_tag", "lerobot");
        cJSON *tags = cJSON_AddObjectToObject(ns, "metadata_by_tag"), *meta = cJSON_AddObjectToObject(tags, "lerobot");
        cJSON *as = cJSON_AddObjectToObject(meta, "action_stats");
        static const char *const NORM[] = {"molmoact2_masked_normalizer", "normalizer_processor"};
        static const char *const UNNORM[] = {"molmoact2_masked_unnormalizer", "unnormalizer_processor"};
        char mode_s[16] = "", mode_a[16] = "";
        double eps_s = 1e-8, eps_a = 1e-8;
        s = read_norm_step(lr, "policy_postprocessor.json", UNNORM, 2, "action", "ACTION", lr->action_dim, as, mode_a, &eps_a, err);
        if (!s && lr->state_dim > 0) {
            cJSON *ss = cJSON_AddObjectToObject(meta, "state_stats");
            s = read_norm_step(lr, "policy_preprocessor.json", NORM, 2, "observation.state", "STATE", lr->state_dim, ss, mode_s, &eps_s, err);
            if (!s && strcmp(mode_s, mode_a))
                s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: the state is normalised with %s and the action with %s; one mode for both is implemented",
                            dir, mode_s, mode_a);
        }
        if (!s) {
            cJSON_AddStringToObject(ns, "norm_mode", mode_a);
            cJSON_AddStringToObject(meta, "arithmetic", "lerobot");
            cJSON_AddNumberToObject(meta, "eps", eps_a);
            if (lr->chunk_size) cJSON_AddNumberToObject(meta, "action_horizon", lr->chunk_size);
            if (lr->n_action_steps) cJSON_AddNumberToObject(meta, "n_action_steps", lr->n_action_steps);
            read_pack_step(lr, meta);
            char *text = cJSON_PrintUnformatted(ns);
            char where[PATH_MAX + 64];
            snprintf(where, sizeof where, "%s: the processor pipelines' statistics", dir);
            s = text ? ma_normstats_parse(text, where, "lerobot", &lr->ns, err) : ma_fail(err, MA_ERR_NOMEM, "out of memory");
            free(text);
            if (!s && lr->ns.action.dim != lr->action_dim)
                s = ma_fail(err, MA_ERR_SHAPE, "%s: the action statistics have %d values, output_features.action %d", dir, lr->ns.action.dim, lr->action_dim);
        }
    }
    cJSON_Delete(ns);
    cJSON_Delete(cfg);
    return s;
}

ma_status ma_lerobot_norm_stats_json(const ma_lerobot *lr, const char *tag, char **out, ma_error *err) {
    /* written from the parsed statistics, so what a compiled directory reads is what was checked */
    const ma_normstats *ns = &lr->ns;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", "molmoact2_norm_stats.v1");
    cJSON_AddStringToObject(root, "default_tag", tag);
    static const char *const MODES[] = {"none", "mean_std", "min_max", "q01_q99", "q10_q90"};
    cJSON_AddStringToObject(root, "norm_mode", MODES[ns->mode]);
    cJSON *meta = cJSON_AddObjectToObject(cJSON_AddObjectToObject(root, "metadata_by_tag"), tag);
    cJSON_AddStringToObject(meta, "arithmetic", "lerobot");
    cJSON_AddNumberToObject(meta, "eps", ns->eps);
    for (int which = 0; which < (ns->has_state ? 2 : 1); which++) {
        const ma_normalizer *n = which ? &ns->state : &ns->action;
        cJSON *o = cJSON_AddObjectToObject(meta, which ? "state_stats" : "action_stats");
        const struct { const char *name; int has; const float *v; } F[] = {
            {"mean", n->has_mean, n->mean}, {"std", n->has_std, n->std}, {"min", n->has_min, n->min}, {"max", n->has_max, n->max},
            {ns->mode == MA_NORM_Q10_Q90 ? "q10" : "q01", n->has_low, n->low}, {ns->mode == MA_NORM_Q10_Q90 ? "q90" : "q99", n->has_high, n->high}};
        for (size_t k = 0; k < sizeof F / sizeof F[0]; k++) {
            if (!F[k].has) continue;
            cJSON *a = cJSON_AddArrayToObject(o, F[k].name);
            for (int i = 0; i < n->dim; i++) {
                char num[32];
                snprintf(num, sizeof num, "%.9g", F[k].v[i]); /* round-trips the float */
                cJSON_AddItemToArray(a, cJSON_CreateRaw(num));
            }
        }
        if (n->has_mask) {
            cJSON *a = cJSON_AddArrayToObject(o, "mask");
            for (int i = 0; i < n->dim; i++) cJSON_AddItemToArray(a, cJSON_CreateBool(n->mask[i]));
        }
    }
    if (ns->action_horizon) cJSON_AddNumberToObject(meta, "action_horizon", ns->action_horizon);
    if (ns->n_action_steps) cJSON_AddNumberToObject(meta, "n_action_steps", ns->n_action_steps);
    if (ns->setup_type[0]) cJSON_AddStringToObject(meta, "setup_type", ns->setup_type);
    if (ns->control_mode[0]) cJSON_AddStringToObject(meta, "control_mode", ns->control_mode);
    *out = cJSON_Print(root);
    cJSON_Delete(root);
    return *out ? MA_OK : ma_fail(err, MA_ERR_NOMEM, "out of memory");
}

ma_status ma_lerobot_config_json(const ma_lerobot *lr, char **out, ma_error *err) {
    cJSON *cfg = NULL;
    ma_status s = read_json(lr->base_dir, "config.json", &cfg, err);
    if (s) return s;
    /* what LeRobot changes in the HF config at load (modeling_molmoact2.py, _load_hf_model):
     * the horizon is the policy's chunk_size; the Euler steps its num_inference_steps */
    if (lr->chunk_size) {
        cJSON_DeleteItemFromObjectCaseSensitive(cfg, "max_action_horizon");
        cJSON_AddNumberToObject(cfg, "max_action_horizon", lr->chunk_size);
    }
    if (lr->num_inference_steps) {
        cJSON_DeleteItemFromObjectCaseSensitive(cfg, "flow_matching_num_steps");
        cJSON_AddNumberToObject(cfg, "flow_matching_num_steps", lr->num_inference_steps);
    }
    /* the expert's encoder mask as LeRobot runs this policy; the HF model's own action_mode
     * stays as the base has it */
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, "molmoact_encoder_mask");
    cJSON_AddStringToObject(cfg, "molmoact_encoder_mask", lr->full_encoder_mask ? "prompt" : "action_mode");
    /* the prompt step's settings where it saved them (processor_molmoact2.py, MolmoAct2PackInputs) */
    if (lr->have_pack) {
        static const char *const keys[3] = {"num_state_tokens", "add_setup_tokens", "add_control_tokens"};
        for (int i = 0; i < 3; i++) cJSON_DeleteItemFromObjectCaseSensitive(cfg, keys[i]);
        cJSON_AddNumberToObject(cfg, "num_state_tokens", lr->num_state_tokens);
        cJSON_AddBoolToObject(cfg, "add_setup_tokens", lr->add_setup_tokens);
        cJSON_AddBoolToObject(cfg, "add_control_tokens", lr->add_control_tokens);
    }
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, "norm_stats_filename"); /* a compiled directory's statistics are in norm_stats.json */
    if (lr->grid_sampler >= 0) {
        cJSON_DeleteItemFromObjectCaseSensitive(cfg, "use_grid_token_sampler");
        cJSON_AddBoolToObject(cfg, "use_grid_token_sampler", lr->grid_sampler);
        if (lr->grid_tokens) {
            cJSON_DeleteItemFromObjectCaseSensitive(cfg, "grid_token_sampler_num_tokens");
            cJSON_AddNumberToObject(cfg, "grid_token_sampler_num_tokens", lr->grid_tokens);
        }
    }
    *out = cJSON_Print(cfg);
    cJSON_Delete(cfg);
    return *out ? MA_OK : ma_fail(err, MA_ERR_NOMEM, "out of memory");
}
