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
 *   - src/lerobot/processor/normalize_processor.py, _NormalizationMixin._apply_transform: the mode
 *     is looked up per feature type in the step's norm_map (the policy's normalization_mapping,
 *     configuration_molmoact2.py), so the state and the action may use different modes; each
 *     mode's float32 formula (normstats.c follows them);
 *   - huggingface_hub src/huggingface_hub/constants.py and file_download.py
 *     (ee0a4510f4bc15e26cb722be2efc2bdb01383ca0): the cache's place and layout; utils/_validators.py
 *     (validate_repo_id): what a repo id may be. */
#define _GNU_SOURCE
#include "model/lerobot.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

static const cJSON *get(const cJSON *o, const char *k) { return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL; }
static int absent(const cJSON *j) { return !j || cJSON_IsNull(j); }

/* text from a model directory in a message (a newline or an escape sequence in config.json is
 * never echoed raw), at most 96 bytes shown */
static const char *esc(const char *s, char *buf, size_t cap) { return ma_escape_text(s, 96, buf, cap); }

static int has_control(const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f) return 1;
    return 0;
}

/* typed fields of a JSON object: absent or null gives the default; another type, a fraction or
 * a number out of range is refused, naming the file (label), the object (pre) and the field.
 * Numbers are range-checked as doubles before any cast. */
static ma_status field_str(const cJSON *o, const char *key, const char *def, const char **out, const char *label, const char *pre,
                           ma_error *err) {
    const cJSON *j = get(o, key);
    *out = def;
    if (absent(j)) return MA_OK;
    if (!cJSON_IsString(j)) return ma_fail(err, MA_ERR_FORMAT, "%s: %s%s must be a string", label, pre, key);
    *out = j->valuestring;
    return MA_OK;
}

static ma_status field_bool(const cJSON *o, const char *key, int def, int *out, const char *label, const char *pre, ma_error *err) {
    const cJSON *j = get(o, key);
    *out = def;
    if (absent(j)) return MA_OK;
    if (!cJSON_IsBool(j)) return ma_fail(err, MA_ERR_FORMAT, "%s: %s%s must be true or false", label, pre, key);
    *out = cJSON_IsTrue(j);
    return MA_OK;
}

static ma_status field_int(const cJSON *o, const char *key, int lo, int hi, int def, int *out, const char *label, const char *pre,
                           ma_error *err) {
    const cJSON *j = get(o, key);
    *out = def;
    if (absent(j)) return MA_OK;
    if (!cJSON_IsNumber(j) || !(j->valuedouble >= lo && j->valuedouble <= hi) || j->valuedouble != floor(j->valuedouble))
        return ma_fail(err, MA_ERR_RANGE, "%s: %s%s must be an integer in [%d, %d]", label, pre, key, lo, hi);
    *out = (int)j->valuedouble;
    return MA_OK;
}

static ma_status field_num(const cJSON *o, const char *key, double lo, double hi, double def, double *out, const char *label,
                           const char *pre, ma_error *err) {
    const cJSON *j = get(o, key);
    *out = def;
    if (absent(j)) return MA_OK;
    if (!cJSON_IsNumber(j) || !(j->valuedouble > lo && j->valuedouble <= hi))
        return ma_fail(err, MA_ERR_RANGE, "%s: %s%s must be a number in (%g, %g]", label, pre, key, lo, hi);
    *out = j->valuedouble;
    return MA_OK;
}

int ma_is_lerobot_dir(const char *dir) {
    cJSON *c = NULL;
    if (read_json(dir, "config.json", &c, NULL)) return 0;
    const cJSON *t = get(c, "type");
    const int yes = cJSON_IsString(t) && !strcmp(t->valuestring, "molmoact2");
    cJSON_Delete(c);
    return yes;
}

/* ------------------------------------------------------------------------------ the base */

/* a file of the base: there and regular, else why not (missing, a symlink loop, a FIFO ...) */
static ma_status base_file(const char *dir, const char *name, const char *from, const char *need, const char *repo, ma_error *err) {
    char *p = ma_path_join(dir, name);
    if (!p) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
    struct stat st;
    ma_status s = MA_OK;
    const char *hint = repo[0] ? "; download it with: hf download " : "";
    if (stat(p, &st) != 0) {
        if (errno == ENOENT)
            s = ma_fail(err, MA_ERR_IO, "%s (the base, from %s): %s is missing (needed: %s)%s%s", dir, from, name, need, hint, repo);
        else s = ma_fail(err, MA_ERR_IO, "%s (the base, from %s): %s cannot be read: %s", dir, from, name, strerror(errno));
    } else if (!S_ISREG(st.st_mode))
        s = ma_fail(err, MA_ERR_IO, "%s (the base, from %s): %s is not a regular file%s", dir, from, name,
                    S_ISDIR(st.st_mode) ? " (a directory)" : "");
    free(p);
    return s;
}

static int hex40(const char *s) {
    if (strlen(s) != 40) return 0;
    for (int i = 0; i < 40; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

static int word_char(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'; }

/* a Hugging Face repo id, by huggingface_hub's own rules (src/huggingface_hub/utils/_validators.py
 * at ee0a4510f4bc15e26cb722be2efc2bdb01383ca0: validate_repo_id and REPO_ID_REGEX): "NAME" or
 * "NAMESPACE/NAME"; letters, digits, '-', '_', '.'; each part starts and ends with a letter, digit
 * or '_'; the name 1 to 96 characters; no "--" or ".." anywhere; no ".git" at the end. Here
 * ASCII only, and the namespace 96 characters at most as well. NULL when valid, else why not. */
const char *ma_repo_id_problem(const char *id) {
    const char *slash = strchr(id, '/');
    if (slash && strchr(slash + 1, '/')) return "more than one '/' (a repo id is ORG/NAME)";
    if (strstr(id, "--")) return "'--' is not allowed in a repo id";
    if (strstr(id, "..")) return "'..' is not allowed in a repo id";
    const size_t len = strlen(id);
    if (len >= 4 && !strcmp(id + len - 4, ".git")) return "a repo id cannot end in .git";
    const char *parts[2] = {slash ? id : NULL, slash ? slash + 1 : id};
    const size_t lens[2] = {slash ? (size_t)(slash - id) : 0, slash ? len - (size_t)(slash - id) - 1 : len};
    for (int k = 0; k < 2; k++) {
        const char *p = parts[k];
        const size_t n = lens[k];
        if (!p) continue;
        if (n < 1 || n > 96) return k ? "the name must have 1 to 96 characters" : "the namespace must have 1 to 96 characters";
        for (size_t i = 0; i < n; i++)
            if (!word_char(p[i]) && p[i] != '-' && p[i] != '.') return "only letters, digits, '-', '_' and '.' are allowed in a repo id";
        if (!word_char(p[0]) || !word_char(p[n - 1])) return "each part of a repo id must start and end with a letter, digit or '_'";
    }
    return NULL;
}

/* a revision that names a file under refs/: a plain branch or tag name (no '/', no '..') */
static int plain_ref(const char *r) {
    const size_t n = strlen(r);
    if (n < 1 || n > 128 || r[0] == '.' || strstr(r, "..")) return 0;
    for (size_t i = 0; i < n; i++)
        if (!word_char(r[i]) && r[i] != '-' && r[i] != '.') return 0;
    return 1;
}

/* models--ORG--NAME/snapshots/<revision, or the commit refs/<revision or main> names>, as
 * huggingface_hub lays the cache out (file_download.py, repo_folder_name and the refs files).
 * Each way of failing has its own message. */
static ma_status from_cache(ma_lerobot *lr, const char *revision, ma_error *err) {
    static const char NEED[] = "config.json, tokenizer.json, tokenizer_config.json, processor_config.json";
    const char *repo = lr->repo_id; /* checked by repo_id_problem: at most 193 bytes, one '/' */
    char cache[PATH_MAX], flat[2 * sizeof lr->repo_id], folder[PATH_MAX], ref[PATH_MAX], snap[PATH_MAX], rv[300];
    /* the cache's directory: settings.hub_cache, which core/env.c resolves from the environment
     * as huggingface_hub does */
    if (!lr->hub_cache[0])
        return ma_fail(err, MA_ERR_ARG, "no Hugging Face cache directory is known (set HF_HUB_CACHE or HOME, or give --base)");
    snprintf(cache, sizeof cache, "%s", lr->hub_cache);
    size_t k = 0;
    for (const char *p = repo; *p; p++) { /* '/' becomes "--"; bounded by flat's size */
        if (k + 3 > sizeof flat) return ma_fail(err, MA_ERR_RANGE, "checkpoint_path: the repo id is too long");
        if (*p == '/') {
            flat[k++] = '-';
            flat[k++] = '-';
        } else flat[k++] = *p;
    }
    flat[k] = '\0';
    int n = snprintf(folder, sizeof folder, "%s/models--%s", cache, flat);
    if (n < 0 || (size_t)n >= sizeof folder) return ma_fail(err, MA_ERR_RANGE, "%s/models--%s: the path is too long", cache, flat);
    struct stat st;
    if (stat(folder, &st) != 0) {
        const int e = errno;
        if (e == ENOENT)
            return ma_fail(
                err, MA_ERR_IO,
                "%s is a LeRobot policy: its model config, tokenizer and processor come from the base repo %s (checkpoint_path), "
                "which is neither given (--base DIR) nor in the Hugging Face cache (%s). Download it with: "
                "molmoact pull %s --include '*.json', or hf download %s --include 'config.json' 'tokenizer*' "
                "'processor_config.json' 'norm_stats.json' (the files needed: %s)",
                lr->dir, repo, folder, repo, repo, NEED);
        return ma_fail(err, MA_ERR_IO, "%s (the Hugging Face cache entry of %s): %s", folder, repo, strerror(e));
    }
    if (!S_ISDIR(st.st_mode)) return ma_fail(err, MA_ERR_IO, "%s (the Hugging Face cache entry of %s): not a directory", folder, repo);
    const char *rev = revision ? revision : "main";
    char commit[48];
    if (hex40(rev)) snprintf(commit, sizeof commit, "%s", rev);
    else {
        if (!plain_ref(rev))
            return ma_fail(err, MA_ERR_FORMAT,
                           "%s/config.json: checkpoint_revision \"%s\" is neither a commit hash (40 hex digits) nor a plain "
                           "branch or tag name (letters, digits, '-', '_', '.'; no '/', no '..')",
                           lr->dir, esc(rev, rv, sizeof rv));
        n = snprintf(ref, sizeof ref, "%s/refs/%s", folder, rev);
        if (n < 0 || (size_t)n >= sizeof ref) return ma_fail(err, MA_ERR_RANGE, "%s/refs/%s: the path is too long", folder, rev);
        if (stat(ref, &st) != 0)
            return errno == ENOENT ? ma_fail(err, MA_ERR_IO,
                                             "%s: no such ref: %s is in the Hugging Face cache, but its revision %s was never "
                                             "downloaded (hf download %s --revision %s)",
                                             ref, repo, rev, repo, rev)
                                   : ma_fail(err, MA_ERR_IO, "%s: %s", ref, strerror(errno));
        char *text = NULL;
        size_t len = 0;
        ma_status s = ma_read_file(ref, 256, &text, &len, err); /* a regular file only: a FIFO is refused, not waited on */
        if (s) return ma_error_wrap(err, s, "the ref of %s", repo);
        while (len && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' ' || text[len - 1] == '\t')) text[--len] = '\0';
        if (strlen(text) != len || !hex40(text)) {
            s = ma_fail(err, MA_ERR_FORMAT, "%s holds \"%s\", not a commit hash (40 hex digits)", ref, esc(text, rv, sizeof rv));
            free(text);
            return s;
        }
        snprintf(commit, sizeof commit, "%s", text);
        free(text);
    }
    n = snprintf(snap, sizeof snap, "%s/snapshots/%s", folder, commit);
    if (n < 0 || (size_t)n >= sizeof snap) return ma_fail(err, MA_ERR_RANGE, "%s/snapshots/%s: the path is too long", folder, commit);
    if (stat(snap, &st) != 0) {
        const int e = errno;
        if (e == ENOENT && !hex40(rev))
            return ma_fail(err, MA_ERR_IO, "%s names commit %s, but %s is missing (an interrupted download? hf download %s)", ref, commit,
                           snap, repo);
        if (e == ENOENT)
            return ma_fail(err, MA_ERR_IO, "checkpoint_revision %s: %s is missing (hf download %s --revision %s)", commit, snap, repo,
                           commit);
        return ma_fail(err, MA_ERR_IO, "%s: %s", snap, strerror(e));
    }
    if (!S_ISDIR(st.st_mode)) return ma_fail(err, MA_ERR_IO, "%s: not a directory (the snapshot of %s)", snap, repo);
    snprintf(lr->base_dir, sizeof lr->base_dir, "%s", snap); /* snap and base_dir are both PATH_MAX */
    return MA_OK;
}

static ma_status resolve_base(ma_lerobot *lr, const char *base, const char *revision, ma_error *err) {
    static const char NEED[] = "config.json, tokenizer.json, tokenizer_config.json, processor_config.json";
    char e[300];
    if (base && *base) {
        if (!ma_is_dir(base)) return ma_fail(err, MA_ERR_IO, "--base %s is not a directory", base);
        if (strlen(base) >= sizeof lr->base_dir)
            return ma_fail(err, MA_ERR_RANGE, "--base: the path is longer than %d bytes", PATH_MAX - 1);
        snprintf(lr->base_dir, sizeof lr->base_dir, "%s", base);
        snprintf(lr->base_from, sizeof lr->base_from, "--base");
    } else if (!lr->repo_id[0])
        return ma_fail(err, MA_ERR_FORMAT, "%s/config.json: checkpoint_path is empty, and no --base DIR was given", lr->dir);
    else if (ma_is_dir(lr->repo_id)) {
        snprintf(lr->base_dir, sizeof lr->base_dir, "%s", lr->repo_id); /* checkpoint_path: a local directory */
        snprintf(lr->base_from, sizeof lr->base_from, "checkpoint_path");
    } else {
        const char *why = ma_repo_id_problem(lr->repo_id);
        if (why)
            return ma_fail(err, MA_ERR_FORMAT,
                           "%s/config.json: checkpoint_path \"%s\" is neither a directory nor a Hugging Face repo id: %s "
                           "(give the base with --base DIR)",
                           lr->dir, esc(lr->repo_id, e, sizeof e), why);
        ma_status s = from_cache(lr, revision, err);
        if (s) return s;
        snprintf(lr->base_from, sizeof lr->base_from, "the Hugging Face cache");
    }
    static const char *const required[] = {"config.json", "tokenizer.json"};
    for (int i = 0; i < 2; i++) {
        ma_status s = base_file(lr->base_dir, required[i], lr->base_from, NEED, lr->repo_id, err);
        if (s) return s;
    }
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

static const char *norm_mode_name(const char *lerobot_mode, ma_error *err, const char *where, const char *key, ma_status *s) {
    if (!strcmp(lerobot_mode, "QUANTILES")) return "q01_q99";
    if (!strcmp(lerobot_mode, "QUANTILE10")) return "q10_q90";
    if (!strcmp(lerobot_mode, "MIN_MAX")) return "min_max";
    if (!strcmp(lerobot_mode, "MEAN_STD")) return "mean_std";
    if (!strcmp(lerobot_mode, "IDENTITY")) return "none";
    char e[300];
    *s = ma_fail(err, MA_ERR_UNSUPPORTED,
                 "%s: %s: normalization mode %s is not one LeRobot defines here (QUANTILES, QUANTILE10, MIN_MAX, MEAN_STD, "
                 "IDENTITY)",
                 where, key, esc(lerobot_mode, e, sizeof e));
    return NULL;
}

/* a feature's statistics from a step's state file into a norm_stats-style object */
static ma_status stats_object(const ma_safetensors *st, const char *file, const char *feature, int dim, cJSON *out, ma_error *err) {
    static const char *const NAMES[] = {"mean", "std", "min", "max", "q01", "q99", "q10", "q90", "mask"};
    int found = 0;
    for (size_t k = 0; k < sizeof NAMES / sizeof NAMES[0]; k++) {
        char key[160];
        snprintf(key, sizeof key, "%s.%s", feature, NAMES[k]); /* feature: "action" or "observation.state" */
        const ma_st_tensor *t = ma_st_find(st, key);
        if (!t) continue;
        int64_t n = t->ndim == 1 ? t->shape[0] : -1;
        if (t->ndim != 1 || (t->dtype != MA_DT_F32 && t->dtype != MA_DT_F64 && t->dtype != MA_DT_BOOL))
            return ma_fail(err, MA_ERR_FORMAT, "%s: %s must be a float32 vector", file, key);
        if (n != dim)
            return ma_fail(err, MA_ERR_SHAPE, "%s: %s has %lld values, but the policy's %s has %d (config.json %s)", file, key,
                           (long long)n, feature, dim, !strcmp(feature, "action") ? "output_features" : "input_features");
        cJSON *arr = cJSON_CreateArray();
        for (int64_t i = 0; i < n; i++) {
            double v = t->dtype == MA_DT_F32   ? ((const float *)t->data)[i]
                       : t->dtype == MA_DT_F64 ? ((const double *)t->data)[i]
                                               : ((const uint8_t *)t->data)[i];
            if (!isfinite(v)) {
                cJSON_Delete(arr);
                return ma_fail(err, MA_ERR_RANGE, "%s: %s[%lld] is not finite", file, key, (long long)i);
            }
            if (fabs(v) > FLT_MAX) { /* a float64 beyond float32: the cast would be undefined */
                cJSON_Delete(arr);
                return ma_fail(err, MA_ERR_RANGE, "%s: %s[%lld] = %g is beyond float32", file, key, (long long)i, v);
            }
            if (k == 8) { /* the gripper mask, saved as float 1.0 / 0.0 */
                if (v != 0.0 && v != 1.0) {
                    cJSON_Delete(arr);
                    return ma_fail(err, MA_ERR_FORMAT, "%s: %s[%lld] is %g, not 0 or 1", file, key, (long long)i, v);
                }
                cJSON_AddItemToArray(arr, cJSON_CreateBool(v != 0.0));
            } else cJSON_AddItemToArray(arr, cJSON_CreateNumber((float)v));
        }
        cJSON_AddItemToObject(out, NAMES[k], arr);
        found++;
    }
    return found ? MA_OK
                 : ma_fail(err, MA_ERR_FORMAT, "%s holds no statistics of %s (%s.q01, %s.q99, ...)", file, feature, feature, feature);
}

/* the normaliser's or unnormaliser's step: its mode for a feature type, eps, and its statistics
 * (checked here, so that a bad value is named with its state file and key) */
static ma_status read_norm_step(const ma_lerobot *lr, const char *pipe_file, const char *const *names, int n_names, const char *feature,
                                const char *type, int dim, cJSON *stats, char *mode, double *eps, ma_error *err) {
    cJSON *pipe = NULL;
    ma_status s = read_json(lr->dir, pipe_file, &pipe, err);
    if (s) return ma_error_wrap(err, s, "%s: the LeRobot processor pipeline", lr->dir);
    const cJSON *step = find_step(pipe, names, n_names);
    char where[PATH_MAX + 64], pre[128], key[64], e[300];
    snprintf(where, sizeof where, "%s/%s", lr->dir, pipe_file);
    if (!step) {
        s = ma_fail(err, MA_ERR_FORMAT, "%s: no step named %s%s%s (the %s)", where, names[0], n_names > 1 ? " or " : "",
                    n_names > 1 ? names[1] : "", !strcmp(feature, "action") ? "unnormaliser" : "normaliser");
        goto done;
    }
    const cJSON *rn = get(step, "registry_name"), *cfg = get(step, "config");
    snprintf(pre, sizeof pre, "the %s step's config.", rn->valuestring); /* find_step: a registry name of ours */
    const cJSON *map = get(cfg, "norm_map"), *m = get(map, type);
    snprintf(key, sizeof key, "norm_map.%s", type);
    if (absent(m)) {
        s = ma_fail(err, MA_ERR_FORMAT, "%s: the %s step's norm_map has no %s mode", where, names[0], type);
        goto done;
    }
    if (!cJSON_IsString(m)) {
        s = ma_fail(err, MA_ERR_FORMAT, "%s: %s%s must be a string", where, pre, key);
        goto done;
    }
    const char *mm = norm_mode_name(m->valuestring, err, where, key, &s);
    if (!mm) goto done;
    snprintf(mode, 16, "%s", mm);
    if ((s = field_num(cfg, "eps", 0, 1, 1e-8, eps, where, pre, err))) goto done;
    const char *sf;
    if ((s = field_str(step, "state_file", NULL, &sf, where, "the step's ", err))) goto done;
    if (!sf || !*sf || strchr(sf, '/') || !strcmp(sf, ".") || !strcmp(sf, "..") || has_control(sf)) {
        s = ma_fail(err, MA_ERR_FORMAT, "%s: the %s step has no state_file (a file name in %s)%s%s%s", where, names[0], lr->dir,
                    sf ? ": \"" : "", sf ? esc(sf, e, sizeof e) : "", sf ? "\"" : "");
        goto done;
    }
    char *path = ma_path_join(lr->dir, sf);
    if (!path) {
        s = ma_fail(err, MA_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (!ma_is_file(path)) s = ma_fail(err, MA_ERR_IO, "%s: missing (the %s step's statistics, named by %s)", path, names[0], pipe_file);
    else {
        ma_safetensors st;
        if (!(s = ma_st_open(&st, path, err))) {
            s = stats_object(&st, path, feature, dim, stats, err);
            ma_st_close(&st);
        }
        if (!s) s = ma_normstats_check_feature(stats, mode, *eps, 1, !strcmp(feature, "action"), path, feature, err);
    }
    free(path);
done:
    cJSON_Delete(pipe);
    return s;
}

/* input_features / output_features: the feature's shape, [N] with N in [lo, hi] (0 when the
 * feature is absent and not required) */
static ma_status feature_dim(const cJSON *cfg, const char *group, const char *key, int lo, int hi, int required, int *out,
                             const char *label, ma_error *err) {
    const cJSON *features = get(cfg, group), *f = get(features, key);
    *out = 0;
    if (!absent(features) && !cJSON_IsObject(features)) return ma_fail(err, MA_ERR_FORMAT, "%s: %s must be an object", label, group);
    if (absent(f) && !required) return MA_OK;
    const cJSON *sh = get(f, "shape");
    if (!cJSON_IsArray(sh) || cJSON_GetArraySize(sh) != 1 || !cJSON_IsNumber(sh->child) || !(sh->child->valuedouble >= lo) ||
        !(sh->child->valuedouble <= hi) || sh->child->valuedouble != floor(sh->child->valuedouble))
        return ma_fail(err, MA_ERR_FORMAT, "%s: %s.%s.shape must be [N] with N an integer in [%d, %d]", label, group, key, lo, hi);
    *out = (int)sh->child->valuedouble;
    return MA_OK;
}

/* the prompt step's settings (setup, control mode, state bins, ...) */
static ma_status read_pack_step(ma_lerobot *lr, cJSON *stats_meta, ma_error *err) {
    char *path = ma_path_join(lr->dir, "policy_preprocessor.json");
    if (!path) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
    struct stat sb;
    const int there = stat(path, &sb) == 0 || errno != ENOENT;
    free(path);
    if (!there) return MA_OK; /* without a preprocessor: the base's settings */
    cJSON *pipe = NULL;
    ma_status s = read_json(lr->dir, "policy_preprocessor.json", &pipe, err);
    if (s) return ma_error_wrap(err, s, "%s: the LeRobot processor pipeline", lr->dir);
    static const char *const names[] = {"molmoact2_pack_inputs"};
    const cJSON *cfg = get(find_step(pipe, names, 1), "config");
    char where[PATH_MAX + 64];
    snprintf(where, sizeof where, "%s/policy_preprocessor.json", lr->dir);
    static const char PRE[] = "the molmoact2_pack_inputs step's config.";
    if (cfg) {
        lr->have_pack = 1;
        const char *setup, *control;
        if (!(s = field_str(cfg, "setup_type", NULL, &setup, where, PRE, err)) &&
            !(s = field_str(cfg, "control_mode", NULL, &control, where, PRE, err)) &&
            !(s = field_int(cfg, "num_state_tokens", 1, 1 << 16, 256, &lr->num_state_tokens, where, PRE, err)) &&
            !(s = field_bool(cfg, "add_setup_tokens", 1, &lr->add_setup_tokens, where, PRE, err)) &&
            !(s = field_bool(cfg, "add_control_tokens", 1, &lr->add_control_tokens, where, PRE, err)) &&
            !(s = field_bool(cfg, "normalize_language", 1, &lr->normalize_language, where, PRE, err))) {
            if (setup) cJSON_AddStringToObject(stats_meta, "setup_type", setup);
            if (control) cJSON_AddStringToObject(stats_meta, "control_mode", control);
        }
    }
    cJSON_Delete(pipe);
    return s;
}

/* ------------------------------------------------------------------------------ open */

ma_status ma_lerobot_open(const char *dir, const char *base, const char *hub_cache, ma_lerobot *lr, ma_error *err) {
    memset(lr, 0, sizeof *lr);
    if (strlen(dir) >= sizeof lr->dir) return ma_fail(err, MA_ERR_RANGE, "%.64s...: the path is longer than %d bytes", dir, PATH_MAX - 1);
    if (hub_cache && strlen(hub_cache) >= sizeof lr->hub_cache)
        return ma_fail(err, MA_ERR_RANGE, "the Hugging Face cache directory %.64s... is longer than %d bytes", hub_cache, PATH_MAX - 1);
    snprintf(lr->dir, sizeof lr->dir, "%s", dir);
    snprintf(lr->hub_cache, sizeof lr->hub_cache, "%s", hub_cache ? hub_cache : "");
    cJSON *cfg = NULL, *ns = NULL;
    ma_status s = read_json(dir, "config.json", &cfg, err);
    if (s) return s;
    char label[PATH_MAX + 16], e[300];
    snprintf(label, sizeof label, "%s/config.json", dir);
    const char *path, *rev, *mode, *inf, *train;
    int lora_vlm, lora_expert, peft, grid = -1;
    if ((s = field_str(cfg, "checkpoint_path", "", &path, label, "", err)) ||
        (s = field_str(cfg, "checkpoint_revision", NULL, &rev, label, "", err)) ||
        (s = field_int(cfg, "chunk_size", 0, 1024, 0, &lr->chunk_size, label, "", err)) ||
        (s = field_int(cfg, "n_action_steps", 0, 1024, 0, &lr->n_action_steps, label, "", err)) ||
        (s = field_int(cfg, "num_inference_steps", 0, 256, 0, &lr->num_inference_steps, label, "", err)) ||
        (s = field_str(cfg, "action_mode", "both", &mode, label, "", err)) ||
        (s = field_str(cfg, "inference_action_mode", NULL, &inf, label, "", err)) ||
        (s = field_str(cfg, "train_mode_vlm", NULL, &train, label, "", err)) ||
        (s = field_bool(cfg, "enable_lora_vlm", 0, &lora_vlm, label, "", err)) ||
        (s = field_bool(cfg, "enable_lora_action_expert", 0, &lora_expert, label, "", err)) ||
        (s = field_int(cfg, "lora_rank", 1, 1 << 16, 64, &lr->lora_rank, label, "", err)) ||
        (s = field_num(cfg, "lora_alpha", 0, 1e6, 16, &lr->lora_alpha, label, "", err)) ||
        (s = field_bool(cfg, "use_peft", 0, &peft, label, "", err)) ||
        (s = field_bool(cfg, "use_grid_token_sampler", -1, &grid, label, "", err)) ||
        (s = field_int(cfg, "grid_token_sampler_num_tokens", 1, 4096, 0, &lr->grid_tokens, label, "", err)) ||
        (s = feature_dim(cfg, "output_features", "action", 1, 32, 1, &lr->action_dim, label, err)) ||
        (s = feature_dim(cfg, "input_features", "observation.state", 1, MA_NORM_MAX_DIM, 0, &lr->state_dim, label, err)))
        goto done;
    /* checkpoint_path: a local directory or a Hub repo id (checked where it is used); nothing with a
     * control character, and nothing longer than this runtime keeps */
    if (has_control(path) || (rev && has_control(rev))) {
        s = ma_fail(err, MA_ERR_FORMAT, "%s: %s \"%s\" contains a control character", label,
                    has_control(path) ? "checkpoint_path" : "checkpoint_revision", esc(has_control(path) ? path : rev, e, sizeof e));
        goto done;
    }
    if (strlen(path) >= sizeof lr->repo_id) {
        s = ma_fail(err, MA_ERR_RANGE, "%s: checkpoint_path has %zu bytes (at most %zu)", label, strlen(path), sizeof lr->repo_id - 1);
        goto done;
    }
    snprintf(lr->repo_id, sizeof lr->repo_id, "%s", path);
    if (lr->chunk_size && lr->n_action_steps > lr->chunk_size) {
        s = ma_fail(err, MA_ERR_RANGE, "%s: n_action_steps %d exceeds chunk_size %d", label, lr->n_action_steps, lr->chunk_size);
        goto done;
    }
    /* the saved training mode decides the expert's encoder mask (modeling_molmoact2.py,
     * _encoder_attention_mask_for_action_expert): a "continuous" policy attends to the whole
     * prompt, a "both" policy drops EOS tokens and action spans as the HF model does */
    if (strcmp(mode, "continuous") && strcmp(mode, "both")) {
        s = ma_fail(err, MA_ERR_UNSUPPORTED,
                    "%s: action_mode \"%s\": this runtime runs continuous (flow-matching) actions, which need "
                    "\"continuous\" or \"both\"",
                    label, esc(mode, e, sizeof e));
        goto done;
    }
    snprintf(lr->action_mode, sizeof lr->action_mode, "%s", mode);
    if (inf && strcmp(inf, "continuous")) {
        s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: inference_action_mode \"%s\": only continuous actions are implemented", label,
                    esc(inf, e, sizeof e));
        goto done;
    }
    lr->full_encoder_mask = !strcmp(lr->action_mode, "continuous");
    /* LoRA: train_mode_vlm (main) or enable_lora_vlm (v0.6.x); the adapters stay unmerged */
    lr->lora = (train && !strcmp(train, "lora")) || lora_vlm || lora_expert;
    if (peft) {
        s = ma_fail(err, MA_ERR_UNSUPPORTED,
                    "%s: use_peft: the policy was wrapped by LeRobot's generic --peft route (adapter_model.safetensors "
                    "with adapter_config.json); merge it with PEFT (merge_and_unload) and save the policy, then compile",
                    label);
        goto done;
    }
    lr->grid_sampler = grid;
    if ((s = resolve_base(lr, base, rev, err))) goto done;
    /* the statistics, with LeRobot's arithmetic, as a norm_stats.json that the common parser
     * checks (lengths, order, masks). Each feature type has its own mode (LeRobot's
     * normalization_mapping, read per step from its norm_map): the action's is the file's
     * norm_mode, the state's is written into state_stats (normstats.h). */
    ns = cJSON_CreateObject();
    cJSON_AddStringToObject(ns, "format", "molmoact2_norm_stats.v1");
    cJSON_AddStringToObject(ns, "default_tag", "lerobot");
    cJSON *tags = cJSON_AddObjectToObject(ns, "metadata_by_tag"), *meta = cJSON_AddObjectToObject(tags, "lerobot");
    cJSON *as = cJSON_AddObjectToObject(meta, "action_stats");
    static const char *const NORM[] = {"molmoact2_masked_normalizer", "normalizer_processor"};
    static const char *const UNNORM[] = {"molmoact2_masked_unnormalizer", "unnormalizer_processor"};
    char mode_s[16] = "", mode_a[16] = "";
    double eps_s = 1e-8, eps_a = 1e-8;
    if ((s = read_norm_step(lr, "policy_postprocessor.json", UNNORM, 2, "action", "ACTION", lr->action_dim, as, mode_a, &eps_a, err)))
        goto done;
    if (lr->state_dim > 0) {
        cJSON *ss = cJSON_AddObjectToObject(meta, "state_stats");
        if ((s = read_norm_step(lr, "policy_preprocessor.json", NORM, 2, "observation.state", "STATE", lr->state_dim, ss, mode_s, &eps_s,
                                err)))
            goto done;
        cJSON_AddStringToObject(ss, "norm_mode", mode_s);
        cJSON_AddNumberToObject(ss, "eps", eps_s);
    }
    cJSON_AddStringToObject(ns, "norm_mode", mode_a);
    cJSON_AddStringToObject(meta, "arithmetic", "lerobot");
    cJSON_AddNumberToObject(meta, "eps", eps_a);
    if (lr->chunk_size) cJSON_AddNumberToObject(meta, "action_horizon", lr->chunk_size);
    if (lr->n_action_steps) cJSON_AddNumberToObject(meta, "n_action_steps", lr->n_action_steps);
    if ((s = read_pack_step(lr, meta, err))) goto done;
    char *text = cJSON_PrintUnformatted(ns);
    char where[PATH_MAX + 64];
    snprintf(where, sizeof where, "%s: the processor pipelines' statistics", dir);
    s = text ? ma_normstats_parse(text, where, "lerobot", &lr->ns, err) : ma_fail(err, MA_ERR_NOMEM, "out of memory");
    free(text);
    if (!s && lr->ns.action.dim != lr->action_dim)
        s = ma_fail(err, MA_ERR_SHAPE, "%s: the action statistics have %d values, output_features.action %d", dir, lr->ns.action.dim,
                    lr->action_dim);
done:
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
    cJSON_AddStringToObject(root, "norm_mode", MODES[ns->action.mode]); /* the state's own mode, where it differs, in state_stats */
    cJSON *meta = cJSON_AddObjectToObject(cJSON_AddObjectToObject(root, "metadata_by_tag"), tag);
    cJSON_AddStringToObject(meta, "arithmetic", "lerobot");
    cJSON_AddNumberToObject(meta, "eps", ns->action.eps);
    for (int which = 0; which < (ns->has_state ? 2 : 1); which++) {
        const ma_normalizer *n = which ? &ns->state : &ns->action;
        cJSON *o = cJSON_AddObjectToObject(meta, which ? "state_stats" : "action_stats");
        if (which && (n->mode != ns->action.mode || n->eps != ns->action.eps)) {
            cJSON_AddStringToObject(o, "norm_mode", MODES[n->mode]);
            cJSON_AddNumberToObject(o, "eps", n->eps);
        }
        const int q10 = n->mode == MA_NORM_Q10_Q90;
        const struct {
            const char *name;
            int has;
            const float *v;
        } F[] = {{"mean", n->has_mean, n->mean},
                 {"std", n->has_std, n->std},
                 {"min", n->has_min, n->min},
                 {"max", n->has_max, n->max},
                 {q10 ? "q10" : "q01", n->has_low, n->low},
                 {q10 ? "q90" : "q99", n->has_high, n->high}};
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
