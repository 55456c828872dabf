/* SPDX-License-Identifier: Apache-2.0 */
/* What LeRobot's async-inference payloads mean here (internal.h, issue 39), read from the trees
 * pickle.c builds (never from an executed pickle). The facts, from huggingface/lerobot at
 * 7427f31801f944f5ec9ce53cda02862ce7d1638b:
 *
 *  - RemotePolicyConfig (async_inference/helpers.py:266-273): policy_type, pretrained_name_or_path,
 *    lerobot_features, actions_per_chunk, device, rename_map. robot_client.py sends
 *    lerobot_features = hw_to_dataset_features(robot.observation_features, "observation")
 *    (utils/feature_utils.py:84-99): "observation.state" {dtype, shape (N,), names: the motor keys
 *    in the robot's order} and "observation.images.<cam>" {dtype "image", shape (H, W, C)}.
 *  - TimedObservation (helpers.py:229-232): timestamp, timestep (the last executed action's),
 *    observation (the robot's raw dict: one number per motor key, a uint8 HxWxC array per camera
 *    under the camera's own name, "task"), must_go.
 *  - The server builds the model's state from the raw dict in the order of the feature's names
 *    (feature_utils.py:131-132, build_dataset_frame), each camera from values[<cam>]
 *    (:133-134); rename_map renames feature keys to the policy's (policy_server.py).
 *
 * The model's two images: observation.images.image (the agent view, image0) and
 * observation.images.wrist_image (the wrist, image1), as LeRobot's LIBERO features name them;
 * other camera names reach them through rename_map. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/internal.h"
#include "server/pickle.h"

static const char *const CLS_CONFIG = "lerobot.async_inference.helpers.RemotePolicyConfig";
static const char *const IMG_PREFIX = "observation.images.";
static const char *const MODEL_CAMS[2] = {"observation.images.image", "observation.images.wrist_image"};

void lr_config_free(lr_config *c) {
    for (int i = 0; i < c->n_state; i++) free(c->state_names[i]);
    free(c->cam_key[0]);
    free(c->cam_key[1]);
    memset(c, 0, sizeof *c);
}

static char *dup_str(const ma_pk *v) {
    char *s = malloc(v->len + 1);
    if (s) {
        memcpy(s, v->s, v->len);
        s[v->len] = '\0';
    }
    return s;
}

static int is_str(const ma_pk *v) { return v && v->kind == MA_PK_STR; }

/* a class name's last part, or the subclass a fork adds (Rosetta's TimedObservationWithHistory) */
static int cls_is(const ma_pk *o, const char *name) {
    if (!o || o->kind != MA_PK_OBJECT || !o->cls) return 0;
    const char *dot = strrchr(o->cls, '.');
    const char *last = dot ? dot + 1 : o->cls;
    return !strcmp(last, name) || (!strcmp(name, "TimedObservation") && !strcmp(last, "TimedObservationWithHistory"));
}

/* the model camera a feature key stands for after rename_map: 0, 1, or -1 */
static int model_camera(const ma_pk *rename, const char *key, size_t key_len) {
    const char *name = key;
    size_t len = key_len;
    if (rename && rename->kind == MA_PK_DICT)
        for (size_t i = 0; i < rename->n; i++)
            if (is_str(rename->keys[i]) && rename->keys[i]->len == key_len && !memcmp(rename->keys[i]->s, key, key_len) &&
                is_str(rename->items[i])) {
                name = rename->items[i]->s;
                len = rename->items[i]->len;
            }
    for (int k = 0; k < 2; k++)
        if (strlen(MODEL_CAMS[k]) == len && !memcmp(MODEL_CAMS[k], name, len)) return k;
    return -1;
}

static int policy_type_ok(const char *t) {
    const char *list = srv.o->lerobot_policy_types && srv.o->lerobot_policy_types[0] ? srv.o->lerobot_policy_types : "molmoact2";
    const size_t n = strlen(t);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        const size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !memcmp(p, t, n)) return 1;
        p += len + (e ? 1 : 0);
    }
    return 0;
}

ma_status lr_config_from(const ma_pk *root, const molmoact_info *info, lr_config *c, char *note, size_t note_cap, ma_error *err) {
    memset(c, 0, sizeof *c);
    note[0] = '\0';
    if (!root || root->kind != MA_PK_OBJECT || strcmp(root->cls, CLS_CONFIG))
        return ma_fail(err, MA_ERR_ARG, "SendPolicyInstructions: expected a %s, got %s", CLS_CONFIG,
                       root && root->kind == MA_PK_OBJECT ? root->cls : "another value");
    const ma_pk *pt = ma_pk_attr(root, "policy_type"), *feat = ma_pk_attr(root, "lerobot_features");
    const ma_pk *apc = ma_pk_attr(root, "actions_per_chunk"), *rename = ma_pk_attr(root, "rename_map");
    const ma_pk *path = ma_pk_attr(root, "pretrained_name_or_path");
    if (!is_str(pt)) return ma_fail(err, MA_ERR_ARG, "RemotePolicyConfig.policy_type: missing or not a string");
    if (!policy_type_ok(pt->s))
        return ma_fail(err, MA_ERR_ARG, "RemotePolicyConfig.policy_type \"%.64s\": this server serves %s (--lerobot-policy-types)", pt->s,
                       srv.o->lerobot_policy_types && srv.o->lerobot_policy_types[0] ? srv.o->lerobot_policy_types : "molmoact2");
    snprintf(c->policy_type, sizeof c->policy_type, "%s", pt->s);
    if (!apc || apc->kind != MA_PK_INT) return ma_fail(err, MA_ERR_ARG, "RemotePolicyConfig.actions_per_chunk: missing or not an integer");
    if (apc->i < 1 || apc->i > info->n_steps)
        return ma_fail(err, MA_ERR_ARG, "RemotePolicyConfig.actions_per_chunk %lld: the model gives chunks of %d actions (1..%d)",
                       (long long)apc->i, info->n_steps, info->n_steps);
    c->actions_per_chunk = (int)apc->i;
    if (rename && rename->kind != MA_PK_DICT && rename->kind != MA_PK_NONE)
        return ma_fail(err, MA_ERR_ARG, "RemotePolicyConfig.rename_map: not a dict");
    if (!feat || feat->kind != MA_PK_DICT) return ma_fail(err, MA_ERR_ARG, "RemotePolicyConfig.lerobot_features: missing or not a dict");
    const ma_pk *st = ma_pk_get(feat, "observation.state");
    if (!st || st->kind != MA_PK_DICT)
        return ma_fail(err, MA_ERR_ARG, "RemotePolicyConfig.lerobot_features[\"observation.state\"]: missing (the robot's joint readings)");
    const ma_pk *names = ma_pk_get(st, "names");
    if (!names || (names->kind != MA_PK_LIST && names->kind != MA_PK_TUPLE))
        return ma_fail(err, MA_ERR_ARG, "lerobot_features[\"observation.state\"][\"names\"]: missing or not a list");
    if ((int)names->n != info->state_dim)
        return ma_fail(err, MA_ERR_ARG, "lerobot_features[\"observation.state\"]: %zu joint names, the model's state has %d values",
                       names->n, info->state_dim);
    ma_status s = MA_OK;
    for (size_t i = 0; i < names->n && !s; i++) {
        if (!is_str(names->items[i]) || !names->items[i]->len)
            s = ma_fail(err, MA_ERR_ARG, "lerobot_features[\"observation.state\"][\"names\"][%zu]: not a string", i);
        else if (!(c->state_names[c->n_state++] = dup_str(names->items[i]))) s = ma_fail(err, MA_ERR_NOMEM, "out of memory");
    }
    /* the action features, when a client sends them (LeRobot's robot_client sends observation
     * features only): their width must be the model's */
    const ma_pk *act = ma_pk_get(feat, "action");
    if (!s && act && act->kind == MA_PK_DICT) {
        const ma_pk *sh = ma_pk_get(act, "shape");
        if (sh && (sh->kind == MA_PK_TUPLE || sh->kind == MA_PK_LIST) && sh->n == 1 && sh->items[0]->kind == MA_PK_INT &&
            sh->items[0]->i != info->action_dim)
            s = ma_fail(err, MA_ERR_ARG, "lerobot_features[\"action\"]: the robot takes %lld action values, the model gives %d",
                        (long long)sh->items[0]->i, info->action_dim);
    }
    /* the cameras */
    char cams[256] = "";
    size_t cl = 0;
    for (size_t i = 0; i < feat->n && !s; i++) {
        const ma_pk *k = feat->keys[i];
        if (!is_str(k) || k->len <= strlen(IMG_PREFIX) || memcmp(k->s, IMG_PREFIX, strlen(IMG_PREFIX))) continue;
        const int m = model_camera(rename, k->s, k->len);
        if (cl < sizeof cams - 1) cl += (size_t)snprintf(cams + cl, sizeof cams - cl, "%s%.64s", cl ? ", " : "", k->s);
        if (m < 0) continue;
        if (c->cam_key[m]) s = ma_fail(err, MA_ERR_ARG, "lerobot_features: two cameras map to %s", MODEL_CAMS[m]);
        else if (!(c->cam_key[m] = malloc(k->len - strlen(IMG_PREFIX) + 1))) s = ma_fail(err, MA_ERR_NOMEM, "out of memory");
        else {
            memcpy(c->cam_key[m], k->s + strlen(IMG_PREFIX), k->len - strlen(IMG_PREFIX));
            c->cam_key[m][k->len - strlen(IMG_PREFIX)] = '\0';
        }
    }
    for (int m = 0; m < 2 && !s; m++)
        if (!c->cam_key[m])
            s = ma_fail(err, MA_ERR_ARG,
                        "lerobot_features: no camera maps to %s (the robot's cameras: %s); name it so or map it with rename_map, e.g. "
                        "{\"observation.images.<yours>\": \"%s\"}",
                        MODEL_CAMS[m], cl ? cams : "none", MODEL_CAMS[m]);
    if (s) {
        lr_config_free(c);
        return s;
    }
    /* the model is the one loaded at start, whatever the client names: said once, in the log */
    if (is_str(path) && path->len && strcmp(path->s, srv.model_name) && !strstr(srv.o->engine.model_dir, path->s))
        snprintf(note, note_cap, "pretrained_name_or_path \"%.100s\" ignored: this server serves %s, loaded at start", path->s,
                 srv.model_name);
    /* fields beyond LeRobot's (forks add some): ignored, listed */
    static const char *const KNOWN[] = {"policy_type", "pretrained_name_or_path", "lerobot_features", "actions_per_chunk", "device",
                                        "rename_map"};
    const ma_pk *state = root->state;
    size_t nl = strlen(note);
    for (size_t i = 0; state && state->kind == MA_PK_DICT && i < state->n; i++) {
        const ma_pk *k = state->keys[i];
        int known = 0;
        for (size_t q = 0; q < sizeof KNOWN / sizeof KNOWN[0]; q++) known |= is_str(k) && !strcmp(k->s, KNOWN[q]);
        if (!known && is_str(k) && nl < note_cap - 1)
            nl += (size_t)snprintf(note + nl, note_cap - nl, "%sfield %.40s ignored", nl ? "; " : "", k->s);
    }
    c->set = 1;
    return MA_OK;
}

static int number_of(const ma_pk *v, double *out) {
    if (!v) return 0;
    if (v->kind == MA_PK_FLOAT) *out = v->f;
    else if (v->kind == MA_PK_INT || v->kind == MA_PK_BOOL) *out = (double)v->i;
    else if (v->kind == MA_PK_ARRAY && v->nbytes == ma_pk_dtype_size(v->dtype)) { /* a 0-d or one-element array */ switch (v->dtype) {
        case MA_PK_F32: {
            float f;
            memcpy(&f, v->data, 4);
            *out = f;
            break;
        }
        case MA_PK_F64: memcpy(out, v->data, 8); break;
        case MA_PK_I64: {
            int64_t i;
            memcpy(&i, v->data, 8);
            *out = (double)i;
            break;
        }
        case MA_PK_I32: {
            int32_t i;
            memcpy(&i, v->data, 4);
            *out = i;
            break;
        }
        default: return 0;
        }
    } else return 0;
    return 1;
}

ma_status lr_obs_from(const ma_pk *root, const lr_config *c, ma_wire_request *r, lr_obs_meta *meta, ma_error *err) {
    memset(meta, 0, sizeof *meta);
    if (!cls_is(root, "TimedObservation"))
        return ma_fail(err, MA_ERR_ARG, "SendObservations: expected a TimedObservation, got %s",
                       root && root->kind == MA_PK_OBJECT ? root->cls : "another value");
    const ma_pk *ts = ma_pk_attr(root, "timestamp"), *step = ma_pk_attr(root, "timestep"), *ob = ma_pk_attr(root, "observation");
    const ma_pk *mg = ma_pk_attr(root, "must_go");
    if (!number_of(ts, &meta->timestamp) || !isfinite(meta->timestamp))
        return ma_fail(err, MA_ERR_ARG, "TimedObservation.timestamp: missing or not a finite number");
    /* at most 2^53: the reply labels row i with timestep + i (no int64 overflow) and PR #3048's
     * JSON carries it exactly */
    if (!step || step->kind != MA_PK_INT || step->i < 0 || step->i > ((int64_t)1 << 53))
        return ma_fail(err, MA_ERR_ARG, "TimedObservation.timestep: missing or not an integer in [0, 2^53]");
    meta->timestep = step->i;
    meta->must_go = mg && (mg->kind == MA_PK_BOOL || mg->kind == MA_PK_INT) && mg->i;
    if (!ob || ob->kind != MA_PK_DICT) return ma_fail(err, MA_ERR_ARG, "TimedObservation.observation: missing or not a dict");
    memset(r, 0, sizeof *r);
    molmoact_observation_init(&r->obs);
    for (int i = 0; i < c->n_state; i++) {
        double v;
        const ma_pk *x = ma_pk_get(ob, c->state_names[i]);
        if (!x) return ma_fail(err, MA_ERR_ARG, "observation[\"%.64s\"]: missing (a joint of observation.state)", c->state_names[i]);
        if (!number_of(x, &v)) return ma_fail(err, MA_ERR_ARG, "observation[\"%.64s\"]: not a number", c->state_names[i]);
        if (!isfinite(v)) return ma_fail(err, MA_ERR_ARG, "observation[\"%.64s\"] is not finite", c->state_names[i]);
        r->state[i] = (float)v;
    }
    r->obs.state = r->state;
    r->obs.state_dim = c->n_state;
    for (int k = 0; k < 2; k++) {
        const ma_pk *a = ma_pk_get(ob, c->cam_key[k]);
        if (!a) return ma_fail(err, MA_ERR_ARG, "observation[\"%.64s\"]: missing (the camera for %s)", c->cam_key[k], MODEL_CAMS[k]);
        if (a->kind != MA_PK_ARRAY || a->dtype != MA_PK_U8 || a->ndim != 3 || a->shape[2] != 3 || a->shape[0] < 1 || a->shape[1] < 1 ||
            a->shape[0] > 8192 || a->shape[1] > 8192)
            return ma_fail(err, MA_ERR_ARG, "observation[\"%.64s\"]: expected a uint8 array [H, W, 3] (H, W at most 8192)", c->cam_key[k]);
        const size_t n = (size_t)a->shape[0] * (size_t)a->shape[1] * 3;
        if (a->nbytes != n) return ma_fail(err, MA_ERR_ARG, "observation[\"%.64s\"]: %zu bytes for its shape", c->cam_key[k], a->nbytes);
        if (!(r->img[k] = malloc(n))) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
        memcpy(r->img[k], a->data, n);
        r->obs.images[k] = (molmoact_image){r->img[k], (int)a->shape[0], (int)a->shape[1], (size_t)a->shape[1] * 3, NULL, 0};
    }
    const ma_pk *task = ma_pk_get(ob, "task");
    if (task && !is_str(task)) return ma_fail(err, MA_ERR_ARG, "observation[\"task\"]: not a string");
    if (!(r->task = task ? dup_str(task) : calloc(1, 1))) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
    r->obs.task = r->task;
    r->obs.rotate180 = srv.o->flip180;
    return MA_OK;
}
