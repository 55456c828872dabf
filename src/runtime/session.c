/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L
#include "runtime/session.h"
#include "core/util.h"
#include "io/mapfile.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


static void io_set(ma_io *io, const char *name, ma_dtype dt, int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    io->name = name;
    io->dtype = dt;
    io->ndim = ndim;
    int64_t d[4] = {d0, d1, d2, d3};
    for (int i = 0; i < ndim; i++) io->shape[i] = d[i];
}

ma_status ma_session_open(const ma_backend *be, const ma_model *m, const char *name, ma_session **out, ma_error *err) {
    *out = NULL;
    if (!be) return ma_fail(err, MA_ERR_ARG, "session %s: no backend", name);
    ma_session *s = calloc(1, sizeof *s);
    if (!s) return ma_fail(err, MA_ERR_NOMEM, "session %s: out of memory", name);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->model = m;
    s->backend = be;
    s->static_seq = ma_settings_prompt_seq(&m->set, be->static_prompt, m->prompt_seq);
    ma_kctx_init(&s->kc);
    const ma_config *c = &m->cfg;
    const int P = c->patch_h * c->patch_w, pp = 3 * c->patch * c->patch;
    if (!strcmp(name, "vision")) {
        s->kind = MA_SESS_VISION;
        s->n_in = 1;
        s->n_out = 1;
        io_set(&s->in[0], "pixels", MA_DT_F32, 3, -1, P, pp, 0);
        io_set(&s->out[0], "image_features", MA_DT_F32, 2, -1, c->d, 0, 0);
    } else if (!strncmp(name, "llm_split", 9) && name[9] >= '0' && name[9] < '0' + MA_NUM_SPLITS && !name[10]) {
        s->kind = MA_SESS_LLM;
        s->split = name[9] - '0';
        s->n_in = 3;
        s->n_out = 3;
        int nl = m->split_last[s->split] - m->split_first[s->split];
        io_set(&s->in[0], "hidden_in", MA_DT_F32, 2, -1, c->d, 0, 0);
        io_set(&s->in[1], "image_token_mask", MA_DT_U8, 1, -1, 0, 0, 0);
        io_set(&s->in[2], "position_ids", MA_DT_I64, 1, -1, 0, 0, 0);
        io_set(&s->out[0], "hidden_out", MA_DT_F32, 2, -1, c->d, 0, 0);
        io_set(&s->out[1], "k", MA_DT_F32, 4, nl, -1, c->kv_heads, c->head_dim);
        io_set(&s->out[2], "v", MA_DT_F32, 4, nl, -1, c->kv_heads, c->head_dim);
    } else if (!strcmp(name, "action_context")) {
        s->kind = MA_SESS_ACTION_CONTEXT;
        s->n_in = 2;
        s->n_out = 2;
        io_set(&s->in[0], "k", MA_DT_F32, 4, c->layers, -1, c->kv_heads, c->head_dim);
        io_set(&s->in[1], "v", MA_DT_F32, 4, c->layers, -1, c->kv_heads, c->head_dim);
        io_set(&s->out[0], "ctx_k", MA_DT_F32, 4, c->layers, -1, c->e_heads, c->e_head_dim);
        io_set(&s->out[1], "ctx_v", MA_DT_F32, 4, c->layers, -1, c->e_heads, c->e_head_dim);
    } else if (!strcmp(name, "action_step")) {
        s->kind = MA_SESS_ACTION_STEP;
        s->n_in = 5;
        s->n_out = 1;
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
    /* the backend (src/backend/) binds the session: runtime/ knows only this interface */
    ma_status st = be->attach(s, err);
    if (st) {
        ma_session_close(s);
        return st;
    }
    *out = s;
    return MA_OK;
}

void ma_session_set_debug(ma_session *s, int on) {
    if (s->kind != MA_SESS_VISION || !s->ops || !s->backend->debug_outputs) return; /* a backend that has them */
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

ma_status ma_session_dims_agree(const ma_session *s, const char *what, int64_t a, int64_t b, ma_error *err) {
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
    double t0 = ma_now_ms();
    st = s->ops->run(s, in, out, err);
    s->last_ms = ma_now_ms() - t0;
    /* a weight file truncated under us (now or before): its pages read as zeros, so every
     * result from then on is refused */
    if (!st) st = ma_mapfile_check(err);
    if (st)
        for (int i = 0; i < s->n_out; i++) ma_tensor_free(&out[i]);
    return st;
}
