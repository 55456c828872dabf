/* SPDX-License-Identifier: Apache-2.0 */
/* The cpu backend: each session runs this engine's kernels (src/model, src/kernels) on the opened
 * model's weights, in their stored precision. */
#include "backend/cpu/cpu.h"

#include <string.h>

#include "model/model.h"

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
        if ((st = ma_session_dims_agree(s, "sequence lengths", S, in[1].shape[0], err)) ||
            (st = ma_session_dims_agree(s, "sequence lengths", S, in[2].shape[0], err)))
            break;
        if (S < 1) {
            st = ma_fail(err, MA_ERR_SHAPE, "%s: empty prompt", s->name);
            break;
        }
        const ma_llm_w *w = &m->llm[s->split];
        int64_t kshape[4] = {w->last - w->first, S, c->kv_heads, c->head_dim};
        if ((st = ma_tensor_alloc2(&out[0], MA_DT_F32, S, c->d, err)) || (st = ma_tensor_alloc(&out[1], MA_DT_F32, 4, kshape, err)) ||
            (st = ma_tensor_alloc(&out[2], MA_DT_F32, 4, kshape, err)))
            break;
        memcpy(out[0].data, in[0].data, out[0].nbytes);
        st = ma_llm_forward(c, w, &s->kc, out[0].data, S, in[1].data, in[2].data, out[1].data, out[2].data, err);
    } break;
    case MA_SESS_ACTION_CONTEXT: {
        int64_t S = in[0].shape[1];
        if ((st = ma_session_dims_agree(s, "sequence lengths", S, in[1].shape[1], err))) break;
        int64_t shape[4] = {c->layers, S, c->e_heads, c->e_head_dim};
        if ((st = ma_tensor_alloc(&out[0], MA_DT_F32, 4, shape, err)) || (st = ma_tensor_alloc(&out[1], MA_DT_F32, 4, shape, err))) break;
        st = ma_expert_context(c, &m->expert, &s->kc, in[0].data, in[1].data, c->layers, S, out[0].data, out[1].data, err);
    } break;
    case MA_SESS_ACTION_STEP: {
        int64_t A = in[0].shape[0], S = in[2].shape[1];
        if ((st = ma_session_dims_agree(s, "sequence lengths", S, in[3].shape[1], err)) ||
            (st = ma_session_dims_agree(s, "sequence lengths", S, in[4].shape[0], err)))
            break;
        if (A < 1 || A > c->max_action_horizon) {
            st = ma_fail(err, MA_ERR_SHAPE, "action_step input x: %lld steps (1..%d)", (long long)A, c->max_action_horizon);
            break;
        }
        if ((st = ma_tensor_alloc2(&out[0], MA_DT_F32, A, c->max_action_dim, err))) break;
        st = ma_expert_step(c, &m->expert, &s->kc, in[0].data, A, ((const float *)in[1].data)[0], in[2].data, in[3].data, S, in[4].data,
                            out[0].data, err);
    } break;
    }
    return st;
}

static const ma_session_ops cpu_ops = {"cpu", cpu_run, NULL};

ma_status ma_cpu_session_attach(ma_session *s, ma_error *err) {
    const ma_model *m = s->model;
    const unsigned need = s->kind == MA_SESS_VISION           ? MA_PART_VISION
                          : s->kind == MA_SESS_LLM            ? MA_PART_LLM(s->split)
                          : s->kind == MA_SESS_ACTION_CONTEXT ? MA_PART_ACTION_CONTEXT
                                                              : MA_PART_ACTION_STEP;
    if (!(m->parts & need)) return ma_fail(err, MA_ERR_ARG, "session %s: its weights are not loaded in this process", s->name);
    s->ops = &cpu_ops;
    return MA_OK;
}

const ma_backend ma_cpu_backend = {
    .name = "cpu",
    .static_prompt = 0,
    .needs_weights = 1,
    .debug_outputs = 1,
    .attach = ma_cpu_session_attach,
};
