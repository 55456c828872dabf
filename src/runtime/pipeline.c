/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L
#include "runtime/pipeline.h"
#include "core/env.h"
#include "core/util.h"
#include "io/mapfile.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/hostglue.h"
#include "runtime/rtc.h"

static ma_status local_run(void *ctx, int which, int debug, unsigned kept, const ma_tensor *in, int n_in, ma_tensor *out, int *n_out,
                           double *compute_ms, double *transfer_ms, ma_error *err) {
    ma_runner *r = ctx;
    ma_session *s = r->sess[which];
    (void)n_in;
    ma_session_set_debug(s, debug);
    ma_status st = ma_session_run_kept(s, in, out, kept, err);
    *n_out = s->n_out;
    *compute_ms = s->last_ms;
    *transfer_ms = 0.0;
    return st;
}

ma_status ma_runner_open(const ma_backend *be, const ma_model *m, ma_runner *r, ma_error *err) {
    memset(r, 0, sizeof *r);
    r->model = m;
    r->static_seq = ma_settings_prompt_seq(&m->set, be->static_prompt, m->prompt_seq);
    for (int i = 0; i < 7; i++) {
        ma_status s = ma_session_open(be, m, MA_SESSION_NAMES[i], &r->sess[i], err);
        if (s) {
            ma_runner_close(r);
            return s;
        }
    }
    r->link.run = local_run;
    r->link.ctx = r;
    return MA_OK;
}

void ma_runner_open_link(const ma_backend *be, const ma_model *m, const ma_session_link *link, ma_runner *r) {
    memset(r, 0, sizeof *r);
    r->model = m;
    r->static_seq = ma_settings_prompt_seq(&m->set, be->static_prompt, m->prompt_seq);
    r->link = *link;
}

void ma_runner_close(ma_runner *r) {
    for (int i = 0; i < 7; i++) ma_session_close(r->sess[i]);
    ma_tensor_free(&r->kv[0]);
    ma_tensor_free(&r->kv[1]);
    memset(r, 0, sizeof *r);
}

void ma_result_free(ma_result *res) {
    free(res->actions);
    free(res->trajectory);
    memset(res, 0, sizeof *res);
}

ma_status ma_action_plan(const ma_model *m, int *action_dim, int *horizon, int *n_steps, ma_error *err) {
    const ma_config *c = &m->cfg;
    *action_dim = m->ns.action.dim;
    *horizon = m->ns.action_horizon ? m->ns.action_horizon : c->max_action_horizon;
    if (*horizon > c->max_action_horizon)
        return ma_fail(err, MA_ERR_RANGE, "norm_stats action_horizon %d exceeds max_action_horizon %d", *horizon, c->max_action_horizon);
    *n_steps = m->ns.n_action_steps ? m->ns.n_action_steps : *horizon;
    if (*n_steps > *horizon || c->n_obs_steps - 1 + *n_steps > *horizon)
        return ma_fail(err, MA_ERR_RANGE, "n_action_steps %d does not fit the horizon %d", *n_steps, *horizon);
    return MA_OK;
}

#define TRACE(name, t)                                          \
    do {                                                        \
        if (trace && !s) s = ma_trace_add(trace, name, t, err); \
    } while (0)

ma_status ma_runner_run(ma_runner *r, const ma_obs *obs, ma_result *res, ma_trace *trace, ma_error *err) {
    const ma_model *m = r->model;
    const ma_config *c = &m->cfg;
    memset(res, 0, sizeof *res);
    memset(&r->last, 0, sizeof r->last);
    const int64_t D = c->d, P = c->patch_h * c->patch_w, pp = 3 * c->patch * c->patch;
    const int L = c->layers, kvd = c->kv_heads * c->head_dim;
    int action_dim = 0, A = 0, n_steps = 0;
    ma_status s = ma_action_plan(m, &action_dim, &A, &n_steps, err);
    if (s) return s;
    if ((s = ma_rtc_check(&obs->rtc, A - (c->n_obs_steps - 1), action_dim, c->max_action_dim, "rtc_", err))) return s;
    if (obs->seq_len < 1 || obs->seq_len > (1 << 20)) return ma_fail(err, MA_ERR_SHAPE, "input_ids: %lld tokens", (long long)obs->seq_len);
    /* a static prompt length (fixed-shape contexts): pad after every real token with -1, which the
     * masks treat as padding (no image token, no cross-attention), so the causal prefill leaves
     * the real tokens' K/V as they are */
    int64_t S = obs->seq_len;
    const int64_t static_seq = r->static_seq;
    if (static_seq > 0 && S > static_seq)
        return ma_fail(err, MA_ERR_SHAPE,
                       "the prompt has %lld tokens, the contexts take %lld (MOLMOACT_PROMPT_SEQ, or compile --prompt-seq)", (long long)S,
                       (long long)static_seq);
    int64_t *padded = NULL;
    const int64_t *input_ids = obs->input_ids;
    if (static_seq > S) {
        if (!(padded = ma_malloc((size_t)static_seq, sizeof(int64_t), err, "input_ids"))) return MA_ERR_NOMEM;
        memcpy(padded, obs->input_ids, sizeof(int64_t) * (size_t)S);
        for (int64_t i = S; i < static_seq; i++) padded[i] = -1;
        input_ids = padded;
        S = static_seq;
    }
    if (obs->n_images < 1 || obs->n_images > 64) return ma_fail(err, MA_ERR_SHAPE, "pixels: %d images", obs->n_images);
    double t_start = ma_now_ms(), t_sessions = 0.0;
    ma_tensor vout[MA_SESSION_MAX_IO] = {0}, lout[MA_SESSION_MAX_IO] = {0}, cout[MA_SESSION_MAX_IO] = {0}, sout[MA_SESSION_MAX_IO] = {0};
    ma_tensor hidden = {0}, enc = {0}, img = {0}, pos = {0}, x = {0}, tt = {0}, ctx[2] = {{0}};
    float *vel = NULL, *rtc = NULL;

    /* ---- vision */
    int64_t pshape[3] = {obs->n_images, P, pp};
    ma_tensor px = ma_tensor_view(MA_DT_F32, 3, pshape, (void *)obs->pixels);
    static const char *VISION_DEBUG[4] = {"image_features", "pooled", "projected", "sample_coords"};
    int n_vout = 0;
    double cms = 0, tms = 0;
    if ((s = r->link.run(r->link.ctx, 0, trace != NULL, 0, &px, 1, vout, &n_vout, &cms, &tms, err))) goto done;
    r->last.vision = cms;
    r->last.transfer += tms;
    t_sessions += cms + tms;
    TRACE("pixels", &px);
    TRACE("image_features", &vout[0]);
    if (trace)
        for (int o = 1; o < n_vout && o < 4; o++) TRACE(VISION_DEBUG[o], &vout[o]);

    /* ---- host: embedding, scatter, masks, positions */
    int64_t ishape[1] = {S};
    ma_tensor ids = ma_tensor_view(MA_DT_I64, 1, ishape, (void *)input_ids);
    if ((s = ma_tensor_alloc2(&hidden, MA_DT_F32, S, D, err))) goto done;
    if ((s = ma_embed_tokens(c, &m->embed, input_ids, S, hidden.data, err))) goto done;
    TRACE("input_ids", &ids);
    TRACE("wte_out", &hidden);
    if ((s = ma_scatter_features(c, input_ids, S, hidden.data, vout[0].data, vout[0].shape[0], err))) goto done;
    TRACE("llm_input", &hidden);
    if ((s = ma_tensor_alloc(&img, MA_DT_U8, 1, ishape, err)) || (s = ma_tensor_alloc(&pos, MA_DT_I64, 1, ishape, err)) ||
        (s = ma_tensor_alloc(&enc, MA_DT_U8, 1, ishape, err)))
        goto done;
    ma_image_token_mask(c, input_ids, S, img.data);
    for (int64_t i = 0; i < S; i++) ((int64_t *)pos.data)[i] = i;
    ma_encoder_mask(c, input_ids, S, enc.data);
    TRACE("image_token_mask", &img);
    TRACE("encoder_mask", &enc);

    /* ---- llm splits, chained; K/V gathered into [L, S, kvh, hd] */
    int64_t kvshape[4] = {L, S, c->kv_heads, c->head_dim};
    for (int j = 0; j < 2; j++) {
        ma_tensor *t = &r->kv[j];
        if (t->data && t->ndim == 4 && !memcmp(t->shape, kvshape, sizeof kvshape)) continue;
        ma_tensor_free(t);
        if ((s = ma_tensor_alloc(t, MA_DT_F32, 4, kvshape, err))) goto done;
    }
    ma_tensor kall = r->kv[0], vall = r->kv[1]; /* every layer is written below */
    for (int i = 0; i < MA_NUM_SPLITS; i++) {
        ma_tensor lin[3] = {hidden, img, pos};
        int n_lout = 0;
        if ((s = r->link.run(r->link.ctx, 1 + i, 0, 0, lin, 3, lout, &n_lout, &cms, &tms, err))) goto done;
        r->last.llm[i] = cms;
        r->last.transfer += tms;
        t_sessions += cms + tms;
        size_t off = (size_t)m->split_first[i] * (size_t)S * (size_t)kvd;
        memcpy((float *)kall.data + off, lout[1].data, lout[1].nbytes);
        memcpy((float *)vall.data + off, lout[2].data, lout[2].nbytes);
        memcpy(hidden.data, lout[0].data, hidden.nbytes);
        if (trace) {
            char nm[32];
            snprintf(nm, sizeof nm, "hidden_split%d", i);
            TRACE(nm, &lout[0]);
        }
        for (int o = 0; o < MA_SESSION_MAX_IO; o++) ma_tensor_free(&lout[o]);
    }
    TRACE("llm_k", &kall);
    TRACE("llm_v", &vall);

    /* ---- action_context */
    ma_tensor cin[2] = {kall, vall};
    int n_cout = 0;
    if ((s = r->link.run(r->link.ctx, 5, 0, 0, cin, 2, cout, &n_cout, &cms, &tms, err))) goto done;
    r->last.action_context = cms;
    r->last.transfer += tms;
    t_sessions += cms + tms;
    TRACE("ctx_k", &cout[0]);
    TRACE("ctx_v", &cout[1]);
    /* the context goes back to the worker that made it with every step: a view of that worker's
     * memory would be overwritten by the step's own inputs, so it is copied out once */
    for (int j = 0; j < 2; j++) {
        if (cout[j].owned) {
            ctx[j] = cout[j];
            memset(&cout[j], 0, sizeof cout[j]);
            continue;
        }
        if ((s = ma_tensor_alloc(&ctx[j], cout[j].dtype, cout[j].ndim, cout[j].shape, err))) goto done;
        memcpy(ctx[j].data, cout[j].data, ctx[j].nbytes);
    }

    /* ---- Euler loop: x0 = mask(noise); x <- mask(x + dt * mask(v(x, t_i))), t_i = i / steps */
    const int Da = c->max_action_dim, steps = obs->flow_steps > 0 ? obs->flow_steps : c->flow_steps;
    const int masking = c->mask_action_dim_padding && action_dim < Da;
    int64_t xshape[2] = {A, Da}, tshape[1] = {1}, vshape[3] = {steps, A, Da};
    if ((s = ma_tensor_alloc(&x, MA_DT_F32, 2, xshape, err)) || (s = ma_tensor_alloc(&tt, MA_DT_F32, 1, tshape, err))) goto done;
    float *xv = x.data;
    if (obs->noise) {
        for (int64_t i = 0; i < (int64_t)A * Da; i++)
            if (!isfinite(obs->noise[i])) {
                s = ma_fail(err, MA_ERR_RANGE, "noise: element %lld is not finite", (long long)i);
                goto done;
            }
        memcpy(xv, obs->noise, x.nbytes);
    } else ma_torch_randn(obs->seed, (int64_t)A * Da, xv);
    TRACE("noise", &x);
    if (masking)
        for (int a = 0; a < A; a++)
            for (int j = action_dim; j < Da; j++) xv[a * Da + j] = 0.0f;
    TRACE("x0", &x);
    if (trace) vel = ma_calloc((size_t)steps * A * Da * 2, sizeof(float), err, "trace");
    if (trace && !vel) {
        s = MA_ERR_NOMEM;
        goto done;
    }
    /* real-time chunking (runtime/rtc.h): the leftover padded to [A, Da] from row n_obs_steps - 1,
     * its weights, and the guided velocity of each step */
    const int guided = obs->rtc.prefix != NULL;
    const float beta = obs->rtc.beta > 0.0f ? obs->rtc.beta : MA_RTC_DEFAULT_BETA;
    if (guided) {
        if (!(rtc = ma_malloc((size_t)A * (2 * (size_t)Da + 1), sizeof(float), err, "rtc"))) {
            s = MA_ERR_NOMEM;
            goto done;
        }
        ma_rtc_layout(&obs->rtc, A, Da, c->n_obs_steps - 1, rtc, rtc + (size_t)A * Da);
        int64_t pshape[2] = {A, Da}, wshape[1] = {A};
        if (trace && ((s = ma_trace_add_f32(trace, "rtc_prefix_padded", 2, pshape, rtc, err)) ||
                      (s = ma_trace_add_f32(trace, "rtc_weights", 1, wshape, rtc + (size_t)A * Da, err))))
            goto done;
    }
    const float dt = (float)(1.0 / steps);
    for (int i = 0; i < steps; i++) {
        ((float *)tt.data)[0] = (float)((double)i / steps);
        if (vel) memcpy(vel + (size_t)(steps + i) * A * Da, xv, x.nbytes);
        ma_tensor sin_[5] = {x, tt, ctx[0], ctx[1], enc};
        int n_sout = 0;
        /* the context and its mask are the same for every step: sent and scanned once */
        const unsigned kept = i > 0 ? MA_STEP_KEPT_INPUTS : 0u;
        if ((s = r->link.run(r->link.ctx, 6, 0, kept, sin_, 5, sout, &n_sout, &cms, &tms, err))) goto done;
        r->last.action_step += cms;
        r->last.transfer += tms;
        t_sessions += cms + tms;
        float *v = sout[0].data;
        if (vel) memcpy(vel + (size_t)i * A * Da, v, sout[0].nbytes);
        if (guided) { /* LeRobot guides the masked velocity (modeling_molmoact2.py:1871-1891) */
            float *g = rtc + (size_t)A * Da + A;
            for (int a = 0; a < A; a++)
                for (int j = 0; j < Da; j++) g[a * Da + j] = (masking && j >= action_dim) ? 0.0f : v[a * Da + j];
            ma_rtc_guide(A, Da, xv, rtc, rtc + (size_t)A * Da, ((const float *)tt.data)[0], beta, g);
            v = g;
        }
        for (int a = 0; a < A; a++)
            for (int j = 0; j < Da; j++) {
                float vj = (masking && j >= action_dim) ? 0.0f : v[a * Da + j];
                float nx = xv[a * Da + j] + dt * vj;
                xv[a * Da + j] = (masking && j >= action_dim) ? 0.0f : nx;
            }
        for (int o = 0; o < MA_SESSION_MAX_IO; o++) ma_tensor_free(&sout[o]);
    }
    if (vel) {
        if (!s) s = ma_trace_add_f32(trace, "velocity", 3, vshape, vel, err);
        if (!s) s = ma_trace_add_f32(trace, "flow_x", 3, vshape, vel + (size_t)steps * A * Da, err);
    }
    TRACE("trajectory", &x);

    /* ---- slice [n_obs_steps - 1, + n_steps) x [0, action_dim) and de-normalise */
    res->n_steps = n_steps;
    res->action_dim = action_dim;
    res->horizon = A;
    res->max_action_dim = Da;
    res->actions = ma_malloc((size_t)n_steps * action_dim, sizeof(float), err, "actions");
    res->trajectory = ma_malloc((size_t)A * Da, sizeof(float), err, "trajectory");
    if (!res->actions || !res->trajectory) {
        s = MA_ERR_NOMEM;
        goto done;
    }
    memcpy(res->trajectory, xv, x.nbytes);
    for (int k = 0; k < n_steps && !s; k++) /* fails on a non-finite action: the request is refused */
        if ((s = ma_unnormalize(&m->ns, &m->ns.action, xv + (size_t)(c->n_obs_steps - 1 + k) * Da, res->actions + (size_t)k * action_dim,
                                err)))
            ma_error_wrap(err, s, "step %d", k);
    if (trace && !s) {
        int64_t ashape[2] = {n_steps, action_dim};
        s = ma_trace_add_f32(trace, "actions", 2, ashape, res->actions, err);
    }
done:
    for (int o = 0; o < MA_SESSION_MAX_IO; o++) ma_tensor_free(&vout[o]);
    for (int o = 0; o < MA_SESSION_MAX_IO; o++) ma_tensor_free(&lout[o]);
    for (int o = 0; o < MA_SESSION_MAX_IO; o++) ma_tensor_free(&cout[o]);
    for (int o = 0; o < MA_SESSION_MAX_IO; o++) ma_tensor_free(&sout[o]);
    ma_tensor_free(&hidden);
    ma_tensor_free(&ctx[0]);
    ma_tensor_free(&ctx[1]);
    ma_tensor_free(&enc);
    ma_tensor_free(&img);
    ma_tensor_free(&pos);
    ma_tensor_free(&x);
    ma_tensor_free(&tt);
    free(vel);
    free(rtc);
    free(padded);
    r->last.total = ma_now_ms() - t_start;
    r->last.host = r->last.total - t_sessions;
    if (r->last.host < 0) r->last.host = 0;
    /* the host's own mappings (embed.gguf) truncated during the request: refuse its result */
    if (!s) s = ma_mapfile_check(err);
    if (s) ma_result_free(res);
    return s;
}
