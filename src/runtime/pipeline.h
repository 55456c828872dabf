/* SPDX-License-Identifier: Apache-2.0 */
/* The host pipeline of one observation (docs/ARCHITECTURE.md "One observation, end to end"), written against sessions only:
 * vision -> embed + scatter -> llm_split0..3 (K/V collected) -> action_context -> 10 x
 * action_step with the Euler update and padding mask -> slice and de-normalise. */
#ifndef MA_PIPELINE_H
#define MA_PIPELINE_H

#include "model/checkpoint.h"
#include "runtime/rtc.h"
#include "runtime/session.h"
#include "runtime/trace.h"

typedef struct ma_obs {
    const float *pixels; /* [n_images, P, 3*patch^2], normalised to [-1, 1] */
    int n_images;
    const int64_t *input_ids; /* [S], a complete prompt with BOS and image tokens */
    int64_t seq_len;
    const float *noise; /* [A * Da] initial noise, or NULL to draw torch.randn(seed) */
    uint64_t seed;
    int flow_steps; /* Euler steps; 0: the config's */
    ma_rtc rtc;     /* real-time chunking (rtc.prefix NULL: none): the previous chunk's leftover */
} ma_obs;

typedef struct ma_result {
    float *actions; /* [n_steps, action_dim] de-normalised */
    int n_steps, action_dim;
    float *trajectory; /* [horizon, max_action_dim]: x after the last Euler step */
    int horizon, max_action_dim;
} ma_result;

/* latency of one request, milliseconds: pure inference per component (summed over the 10
 * action steps), transfer (moving tensors to and from the sessions beyond their compute), host
 * glue (everything else) and total */
typedef struct ma_timing {
    double vision, llm[4], action_context, action_step, transfer, host, total;
} ma_timing;

/* How the pipeline reaches its sessions: in this process (ma_session) or in resident worker
 * processes (runtime/resident.h). run() executes session `which` (index into MA_SESSION_NAMES)
 * and fills its output tensors (out has room for MA_SESSION_MAX_IO): owned, or views of the
 * worker's shared memory that stay valid until the next call to a session of the same worker
 * (ma_tensor_free is right for both; a caller that feeds an output back to that worker copies it
 * first). debug asks vision for its debugging outputs. */
typedef struct ma_session_link {
    /* kept: bit i set when in[i] is the previous call's input i of this session, unchanged at the
     * same address (the link need not send it again, nor the session scan it again) */
    ma_status (*run)(void *ctx, int which, int debug, unsigned kept, const ma_tensor *in, int n_in, ma_tensor *out, int *n_out,
                     double *compute_ms, double *transfer_ms, ma_error *err);
    void *ctx;
} ma_session_link;

/* action_step's inputs that are the same for every Euler step of an observation (ctx_k, ctx_v,
 * the context mask): kept on steps 1..9 */
#define MA_STEP_KEPT_INPUTS ((1u << 2) | (1u << 3) | (1u << 4))

typedef struct ma_runner {
    const ma_model *model;
    int64_t static_seq;  /* the prompt length observations are padded to (0: none) */
    ma_session *sess[7]; /* vision, llm_split0..3, action_context, action_step (local link) */
    ma_session_link link;
    ma_timing last;
    /* the gathered K/V [L, S, kvh, hd], kept between requests of the same prompt length: at full
     * size 111 MB that would otherwise be faulted in afresh for every request */
    ma_tensor kv[2];
} ma_runner;

/* sessions opened in this process, on backend be */
ma_status ma_runner_open(const ma_backend *be, const ma_model *m, ma_runner *r, ma_error *err);
/* sessions reached through a link, on backend be (the model supplies the host part: config,
 * embedding, stats) */
void ma_runner_open_link(const ma_backend *be, const ma_model *m, const ma_session_link *link, ma_runner *r);
void ma_runner_close(ma_runner *r);
/* trace (optional) receives every intermediate under the golden's names */
ma_status ma_runner_run(ma_runner *r, const ma_obs *obs, ma_result *res, ma_trace *trace, ma_error *err);
void ma_result_free(ma_result *res);

/* (action_dim, horizon, n_action_steps) from norm_stats and the config */
ma_status ma_action_plan(const ma_model *m, int *action_dim, int *horizon, int *n_steps, ma_error *err);

#endif
