/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L
#include "runtime/session.h"
#include "backend/qnn/qnn.h"
#include "io/mapfile.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *const MA_SESSION_NAMES[7] = {"vision", "llm_split0", "llm_split1", "llm_split2", "llm_split3",
                                         "action_context", "action_step"};

static void io_set(ma_io *io, const char *name, ma_dtype dt, int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    io->name = name;
    io->dtype = dt;
    io->ndim = ndim;
    int64_t d[4] = {d0, d1, d2, d3};
    for (int i = 0; i < ndim; i++) io->shape[i] = d[i];
}

ma_status ma_backend_current(ma_backend *b, ma_error *err) {
    const char *e = getenv("MOLMOACT_BACKEND");
    *b = MA_BACKEND_CPU;
    if (!e || !*e || !strcmp(e, "cpu")) return MA_OK;
    if (!strcmp(e, "qnn")) { *b = MA_BACKEND_QNN; return MA_OK; }
    return ma_fail(err, MA_ERR_ARG, "MOLMOACT_BACKEND=%s: must be cpu or qnn", e);
}

const char *ma_backend_name(ma_backend b) { return b == MA_BACKEND_QNN ? "qnn" : "cpu"; }

static ma_status cpu_run(ma_session *s, const ma_tensor *in, ma_tensor *out, ma_error *err);
static const ma_session_ops cpu_ops = {"cpu", cpu_run, NULL};

ma_status ma_session_open(const ma_model *m, const char *name, ma_session **out, ma_error *err) {
    ma_backend b;
    ma_status st = ma_backend_current(&b, err);
    if (st) { *out = NULL; return st; }
    return ma_session_open_on(b, m, name, out, err);
}

ma_status ma_session_open_on(ma_backend backend, const ma_model *m, const char *name, ma_session **out, ma_error *err) {
    *out = NULL;
    ma_session *s = calloc(1, sizeof *s);
    if (!s) return ma_fail(err, MA_ERR_NOMEM, "session %s: out of memory", name);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->model = m;
    ma_kctx_init(&s->kc);
    const ma_config *c = &m->cfg;
    const int P = c->patch_h * c->patch_w, pp = 3 * c->patch * c->patch;
    if (!strcmp(name, "vision")) {
        s->kind = MA_SESS_VISION;
        s->n_in = 1; s->n_out = 1;
        io_set(&s->in[0], "pixels", MA_DT_F32, 3, -1, P, pp, 0);
        io_set(&s->out[0], "image_features", MA_DT_F32, 2, -1, c->d, 0, 0);
    } else if (!strncmp(name, "llm_split", 9) && name[9] >= '0' && name[9] < '0' + MA_NUM_SPLITS && !name[10]) {
        s->kind = MA_SESS_LLM;
        s->split = name[9] - '0';
        s->n_in = 3; s->n_out = 3;
        int nl = m->split_last[s->split] - m->split_first[s->split];
        io_set(&s->in[0], "hidden_in", MA_DT_F32, 2, -1, c->d, 0, 0);
        io_set(&s->in[1], "image_token_mask", MA_DT_U8, 1, -1, 0, 0, 0);
        io_set(&s->in[2], "position_ids", MA_DT_I64, 1, -1, 0, 0, 0);
        io_set(&s->out[0], "hidden_out", MA_DT_F32, 2, -1, c->d, 0, 0);
        io_set(&s->out[1], "k", MA_DT_F32, 4, nl, -1, c->kv_heads, c->head_dim);
        io_set(&s->out[2], "v", MA_DT_F32, 4, nl, -1, c->kv_heads, c->head_dim);
    } else if (!strcmp(name, "action_context")) {
        s->kind = MA_SESS_ACTION_CONTEXT;
        s->n_in = 2; s->n_out = 2;
        io_set(&s->in[0], "k", MA_DT_F32, 4, c->layers, -1, c->kv_heads, c->head_dim);
        io_set(&s->in[1], "v", MA_DT_F32, 4, c->layers, -1, c->kv_heads, c->head_dim);
        io_set(&s->out[0], "ctx_k", MA_DT_F32, 4, c->layers, -1, c->e_heads, c->e_head_dim);
        io_set(&s->out[1], "ctx_v", MA_DT_F32, 4, c->layers, -1, c->e_heads, c->e_head_dim);
    } else if (!strcmp(name, "action_step")) {
        s->kind = MA_SESS_ACTION_STEP;
        s->n_in = 5; s->n_out = 1;
        io_set(&s->in[0], "x", MA_DT_F32, 2, -1, c->max_action_dim, 0, 0);
        io_set(&s->in[1], "t", MA_DT_F32, 1, 1, 0, 0, 0);
        io_set(&s->in[2], "ctx_k", MA_DT_F32, 4, c->layers, -1, c->e_heads, c->e_head_dim);
        io_set(&s->in[3], "ctx_v", MA_DT_F32, 4, c->layers, -1, c->e_heads, c->e_head_dim);
        io_set(&s->in[4], "cross_mask", MA_DT_U8, 1, -1, 0, 0, 0);
        io_set(&s->out[0], "velocity", MA_DT_F32, 2, -1, c->max_action_dim, 0, 0);
    } else {
        ma_session_close(s);
        return ma_fail(err, MA_ERR_ARG, "unknown session %s (vision, llm_split0..3, action_context, action_step)", name);
    }
    if (backend == MA_BACKEND_QNN) {
        ma_status st = ma_qnn_session_attach(s, err);
        if (st) { ma_session_close(s); return st; }
        *out = s;
        return MA_OK;
    }
    s->ops = &cpu_ops;
    unsigned need = s->kind == MA_SESS_VISION ? MA_PART_VISION : s->kind == MA_SESS_LLM ? MA_PART_LLM(s->split)
                    : s->kind == MA_SESS_ACTION_CONTEXT ? MA_PART_ACTION_CONTEXT : MA_PART_ACTION_STEP;
    if (!(m->parts & need)) {
        ma_session_close(s);
        return ma_fail(err, MA_ERR_ARG, "session %s: its weights are not loaded in this process", name);
    }
    *out = s;
    return MA_OK;
}

void ma_session_set_debug(ma_session *s, int on) {
    if (s->kind != MA_SESS_VISION || s->ops != &cpu_ops) return; /* the debugging outputs are the cpu backend's */
    const ma_config *c = &s->model->cfg;
    const int T = c->pooled_h * c->pooled_w;
    s->debug = on;
    s->n_out = 1;
    if (!on) return;
    const int after_proj = s->model->vision.sampler_place == MA_SAMPLER_AFTER_PROJECTOR;
    const int proj_rows = s->model->vision.sampler_place == MA_SAMPLER_AFTER_POOLING ? s->model->tokens_per_image : T;
    io_set(&s->out[1], "pooled", MA_DT_F32, 3, -1, T, c->pool_hidden, 0);
    io_set(&s->out[2], "projected", MA_DT_F32, 3, -1, after_proj ? T : proj_rows, c->d, 0);
    s->n_out = 3;
    if (s->model->vision.sampler_place != MA_SAMPLER_NONE) {
        io_set(&s->out[3], "sample_coords", MA_DT_F32, 3, -1, s->model->tokens_per_image, 2, 0);
        s->n_out = 4;
    }
}

void ma_session_close(ma_session *s) {
    if (!s) return;
    if (s->ops && s->ops->close) s->ops->close(s);
    ma_kctx_free(&s->kc);
    free(s);
}

int ma_session_input_index(const ma_session *s, const char *name) {
    for (int i = 0; i < s->n_in; i++)
        if (!strcmp(s->in[i].name, name)) return i;
    return -1;
}

int ma_session_output_index(const ma_session *s, const char *name) {
    for (int i = 0; i < s->n_out; i++)
        if (!strcmp(s->out[i].name, name)) return i;
    return -1;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* dtype, rank, fixed dims, finite floats (unless kept: the same data, already found finite) */
static ma_status check_input(ma_session *s, int i, const ma_tensor *t, int kept, ma_error *err) {
    const ma_io *io = &s->in[i];
    char label[96];
    snprintf(label, sizeof label, "%s input %s", s->name, io->name);
    ma_status st = ma_tensor_expect(t, label, io->dtype, io->ndim, io->shape, err);
    if (st) return st;
    if (kept && t->data == s->checked[i] && t->nbytes == s->checked_bytes[i]) return MA_OK;
    s->checked[i] = NULL;
    if (io->dtype == MA_DT_F32) {
        const float *p = t->data;
        const int64_t n = ma_tensor_numel(t), k = ma_first_nonfinite(p, n);
        if (k < n) return ma_fail(err, MA_ERR_RANGE, "%s: element %lld is %s", label, (long long)k, isnan(p[k]) ? "NaN" : "infinite");
    }
    s->checked[i] = t->data;
    s->checked_bytes[i] = t->nbytes;
    return MA_OK;
}

void ma_session_forget_inputs(ma_session *s) {
    if (!s) return;
    memset(s->checked, 0, sizeof s->checked);
    memset(s->checked_bytes, 0, sizeof s->checked_bytes);
}

static ma_status dims_agree(const ma_session *s, const char *what, int64_t a, int64_t b, ma_error *err) {
    if (a == b) return MA_OK;
    return ma_fail(err, MA_ERR_SHAPE, "%s: %s disagree across inputs (%lld vs %lld)", s->name, what, (long long)a, (long long)b);
}

ma_status ma_session_run(ma_session *s, const ma_tensor *in, ma_tensor *out, ma_error *err) {
    return ma_session_run_kept(s, in, out, 0, err);
}

ma_status ma_session_run_kept(ma_session *s, const ma_tensor *in, ma_tensor *out, unsigned kept, ma_error *err) {
    ma_status st = MA_OK;
    for (int i = 0; i < s->n_out; i++) memset(&out[i], 0, sizeof out[i]);
    for (int i = 0; i < s->n_in; i++)
        if ((st = check_input(s, i, &in[i], (int)((kept >> i) & 1u), err))) return st;
    double t0 = now_ms();
    st = s->ops->run(s, in, out, err);
    s->last_ms = now_ms() - t0;
    /* a weight file truncated under us (now or before): its pages read as zeros, so every
     * result from then on is refused */
    if (!st) st = ma_mapfile_check(err);
    if (st)
        for (int i = 0; i < s->n_out; i++) ma_tensor_free(&out[i]);
    return st;
}

static ma_status cpu_run(ma_session *s, const ma_tensor *in, ma_tensor *out, ma_error *err) {
    const ma_model *m = s->model;
    const ma_config *c = &m->cfg;
    ma_status st = MA_OK;
    switch (s->kind) {
    case MA_SESS_VISION: {
        int64_t n = in[0].shape[0];
        if (n < 1 || n > 64) return ma_fail(err, MA_ERR_SHAPE, "vision input pixels: %lld images (1..64)", (long long)n);
        if ((st = ma_tensor_alloc2(&out[0], MA_DT_F32, n * m->tokens_per_image, c->d, err))) break;
        ma_vision_trace tr = {0};
        for (int o = 1; o < s->n_out; o++) {
            int64_t shape[MA_MAX_DIMS];
            memcpy(shape, s->out[o].shape, sizeof shape);
            shape[0] = n;
            if ((st = ma_tensor_alloc(&out[o], MA_DT_F32, s->out[o].ndim, shape, err))) break;
        }
        if (st) break;
        if (s->debug) {
            tr.pooled = out[1].data;
            tr.projected = out[2].data;
            tr.coords = s->n_out > 3 ? out[3].data : NULL;
        }
        st = ma_vision_forward(c, &m->vision, &s->kc, in[0].data, (int)n, out[0].data, s->debug ? &tr : NULL, err);
    } break;
    case MA_SESS_LLM: {
        int64_t S = in[0].shape[0];
        if ((st = dims_agree(s, "sequence lengths", S, in[1].shape[0], err)) || (st = dims_agree(s, "sequence lengths", S, in[2].shape[0], err))) break;
        if (S < 1) { st = ma_fail(err, MA_ERR_SHAPE, "%s: empty prompt", s->name); break; }
        const ma_llm_w *w = &m->llm[s->split];
        int64_t kshape[4] = {w->last - w->first, S, c->kv_heads, c->head_dim};
        if ((st = ma_tensor_alloc2(&out[0], MA_DT_F32, S, c->d, err)) || (st = ma_tensor_alloc(&out[1], MA_DT_F32, 4, kshape, err)) ||
            (st = ma_tensor_alloc(&out[2], MA_DT_F32, 4, kshape, err))) break;
        memcpy(out[0].data, in[0].data, out[0].nbytes);
        st = ma_llm_forward(c, w, &s->kc, out[0].data, S, in[1].data, in[2].data, out[1].data, out[2].data, err);
    } break;
    case MA_SESS_ACTION_CONTEXT: {
        int64_t S = in[0].shape[1];
        if ((st = dims_agree(s, "sequence lengths", S, in[1].shape[1], err))) break;
        int64_t shape[4] = {c->layers, S, c->e_heads, c->e_head_dim};
        if ((st = ma_tensor_alloc(&out[0], MA_DT_F32, 4, shape, err)) || (st = ma_tensor_alloc(&out[1], MA_DT_F32, 4, shape, err))) break;
        st = ma_expert_context(c, &m->expert, &s->kc, in[0].data, in[1].data, c->layers, S, out[0].data, out[1].data, err);
    } break;
    case MA_SESS_ACTION_STEP: {
        int64_t A = in[0].shape[0], S = in[2].shape[1];
        if ((st = dims_agree(s, "sequence lengths", S, in[3].shape[1], err)) || (st = dims_agree(s, "sequence lengths", S, in[4].shape[0], err))) break;
        if (A < 1 || A > c->max_action_horizon) { st = ma_fail(err, MA_ERR_SHAPE, "action_step input x: %lld steps (1..%d)", (long long)A, c->max_action_horizon); break; }
        if ((st = ma_tensor_alloc2(&out[0], MA_DT_F32, A, c->max_action_dim, err))) break;
        st = ma_expert_step(c, &m->expert, &s->kc, in[0].data, A, ((const float *)in[1].data)[0], in[2].data, in[3].data, S,
                            in[4].data, out[0].data, err);
    } break;
    }
    return st;
}
