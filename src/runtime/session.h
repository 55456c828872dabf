/* SPDX-License-Identifier: Apache-2.0 */
/* Sessions: one loaded component with named, shaped inputs and outputs (docs/ARCHITECTURE.md "Sessions").
 *
 *   vision          in  pixels f32 [n, P, 3*patch^2]            out image_features f32 [n*K, D]
 *   llm_split0..3   in  hidden_in f32 [S, D], image_token_mask u8 [S], position_ids i64 [S]
 *                   out hidden_out f32 [S, D], k f32 [n, S, kvh, hd], v f32 [n, S, kvh, hd]
 *   action_context  in  k, v f32 [L, S, kvh, hd]                out ctx_k, ctx_v f32 [L, S, He, hde]
 *   action_step     in  x f32 [A, Da], t f32 [1], ctx_k, ctx_v f32 [L, S, He, hde], cross_mask u8 [S]
 *                   out velocity f32 [A, Da]
 * A dimension of -1 in the io spec is dynamic (S, n, A); it must agree across a call's inputs.
 * Inputs are validated (dtype, shape, finite values) and refused with the tensor's name.
 * The cpu backend borrows the weights of an opened ma_model; outputs are owned tensors that the
 * caller frees with ma_tensor_free. */
#ifndef MA_SESSION_H
#define MA_SESSION_H

#include "core/tensor.h"
#include "kernels/kernels.h"
#include "model/checkpoint.h"

#define MA_SESSION_MAX_IO 8

typedef enum { MA_SESS_VISION, MA_SESS_LLM, MA_SESS_ACTION_CONTEXT, MA_SESS_ACTION_STEP } ma_session_kind;

typedef struct ma_io {
    const char *name;
    ma_dtype dtype;
    int ndim;
    int64_t shape[MA_MAX_DIMS];
} ma_io;

typedef struct ma_session ma_session;

/* A backend behind the sessions (docs/ARCHITECTURE.md "Sessions"): the session's io spec is the same for
 * every backend; run() gets inputs already checked against it (dtype, shape, finite values) and
 * fills the outputs as owned fp32 / u8 tensors. cpu: this engine's kernels on the opened model's
 * weights; qnn: a QNN HTP context binary per session (src/backend/qnn). */
typedef struct ma_session_ops {
    const char *name;
    ma_status (*run)(ma_session *s, const ma_tensor *in, ma_tensor *out, ma_error *err);
    void (*close)(ma_session *s); /* the backend's part (impl) */
} ma_session_ops;

/* One environment variable a backend's worker process needs (qnn: LD_LIBRARY_PATH, for the
 * libraries QNN loads by name; ADSP_LIBRARY_PATH, for FastRPC): set in the worker's environment
 * at its start, never in this process's. prepend: a ':'-list the value goes in front of. */
typedef struct ma_worker_var {
    char name[32];
    char value[MA_SETTINGS_PATH];
    int prepend;
} ma_worker_var;
#define MA_MAX_WORKER_VARS 4

/* A backend, as the runtime sees it: chosen at the top (the API, a command, a worker's start
 * message) from the registry in src/backend/backends.h and handed down; runtime/ names none. */
typedef struct ma_backend {
    const char *name;  /* "cpu", "qnn" */
    int static_prompt; /* its graphs have a fixed prompt length: observations are padded to it */
    int needs_weights; /* its sessions compute from the model's weights (cpu); else from their own
                        * files (qnn: context binaries), and a worker opens the host part only */
    int debug_outputs; /* vision's debugging outputs (pooled, projected, sample_coords) */
    /* checks of the settings before anything opens (qnn: the DSP search paths, the power vote) */
    ma_status (*prepare)(const ma_settings *st, ma_error *err);
    /* bind a session whose io spec is filled: its ops, impl, and the spec's dynamic dimensions
     * where the backend fixes them */
    ma_status (*attach)(ma_session *s, ma_error *err);
    /* 1 when its state in this process is lost beyond repair (qnn: error 1011, the DSP restart did
     * not recover): a resident worker then exits after answering, to be started afresh */
    int (*process_lost)(void);
    /* the variables its worker processes need (out[cap]); returns how many */
    int (*worker_env)(const ma_settings *st, ma_worker_var *out, int cap);
} ma_backend;

struct ma_session {
    const ma_session_ops *ops;
    void *impl;
    ma_session_kind kind;
    char name[32];
    int split;
    const ma_model *model;
    const ma_backend *backend;
    int64_t static_seq; /* the prompt length a fixed-shape backend's graphs take (0: dynamic) */
    ma_kctx kc;
    int n_in, n_out;
    ma_io in[MA_SESSION_MAX_IO], out[MA_SESSION_MAX_IO];
    double last_ms;                         /* wall time of the last run's compute */
    const void *checked[MA_SESSION_MAX_IO]; /* each input's data as last found finite (address, bytes) */
    size_t checked_bytes[MA_SESSION_MAX_IO];
    int debug; /* vision: also output pooled, projected (and sample_coords with a sampler) */
};

/* name: vision, llm_split0..3, action_context, action_step, on backend be (fixed-shape backends
 * replace the io spec's -1 dimensions by their graphs' sizes) */
ma_status ma_session_open(const ma_backend *be, const ma_model *m, const char *name, ma_session **out, ma_error *err);
/* for the backends: two dimensions that must agree across a session's inputs */
ma_status ma_session_dims_agree(const ma_session *s, const char *what, int64_t a, int64_t b, ma_error *err);
/* inputs in io-spec order; outputs[n_out] receive owned tensors */
ma_status ma_session_run(ma_session *s, const ma_tensor *inputs, ma_tensor *outputs, ma_error *err);
/* the same, where bit i of `kept` says input i holds the data of this session's previous call,
 * unchanged, at the same address (action_step's context over the ten Euler steps): its values
 * are not scanned again when they were found finite there (its shape always is checked) */
ma_status ma_session_run_kept(ma_session *s, const ma_tensor *inputs, ma_tensor *outputs, unsigned kept, ma_error *err);
/* forget what was checked (the memory behind the inputs was replaced) */
void ma_session_forget_inputs(ma_session *s);
void ma_session_close(ma_session *s);
/* vision only: add the debugging outputs pooled [n, T, Dp], projected [n, T or K, D] and, with
 * a Grid Sampler, sample_coords [n, K, 2] */
void ma_session_set_debug(ma_session *s, int on);
/* index of the named input/output, -1 if absent */
int ma_session_input_index(const ma_session *s, const char *name);
int ma_session_output_index(const ma_session *s, const char *name);


#endif
