/* SPDX-License-Identifier: Apache-2.0 */
/* molmoact.h - the MolmoAct2-LIBERO robot policy as a C library (libmolmoact).
 *
 * One observation in (two camera frames, the robot state, a task sentence), one de-normalised
 * action chunk out ([10, 7] for LIBERO), numerically faithful to the PyTorch model.
 *
 * USAGE
 *
 *     #include <molmoact.h>
 *
 *     molmoact_options opt;
 *     molmoact_options_init(&opt);
 *     opt.model_dir = "/data/molmoact2-libero";        // a checkpoint, a LeRobot policy, or `molmoact compile` output
 *     molmoact *policy = NULL;
 *     molmoact_error err;
 *     if (molmoact_open(&opt, &policy, &err) != MOLMOACT_OK) { fprintf(stderr, "%s\n", err.message); return 1; }
 *
 *     molmoact_observation obs;
 *     molmoact_observation_init(&obs);
 *     obs.images[0] = (molmoact_image){agent_rgb, 256, 256, 0};   // uint8 HxWx3, any size
 *     obs.images[1] = (molmoact_image){wrist_rgb, 256, 256, 0};
 *     obs.state = state8;                                         // float[8]
 *     obs.state_dim = 8;
 *     obs.task = "put the bowl on the plate";
 *
 *     molmoact_result res;
 *     if (molmoact_infer(policy, &obs, &res, &err) == MOLMOACT_OK) {
 *         for (int k = 0; k < res.n_steps; k++)                   // res.actions[k * res.action_dim + j]
 *             send_to_robot(res.actions + k * res.action_dim, res.action_dim);
 *         molmoact_result_free(&res);
 *     }
 *     molmoact_close(&policy);                                    // policy is NULL afterwards
 *
 * Build against it with `pkg-config --cflags --libs molmoact`.
 *
 * THE MODEL DIRECTORY
 *   A Hugging Face MolmoAct2 checkpoint (config.json, model.safetensors or shards,
 *   norm_stats.json, tokenizer.json), used in place in its stored precision, or a context
 *   directory written by `molmoact compile` (per-component precision: f16, bf16, q8_0, q4_0).
 *   Weights are mapped from disk, never copied.
 *
 * PROCESSES AND THREADS
 *   By default the seven sessions run resident in six worker processes (vision, llm_split0..3,
 *   action), started by molmoact_open from the `molmoact` program (found next to this library:
 *   LIBDIR/../bin/molmoact or LIBDIR/molmoact, or set options.worker_exe); the calling process
 *   does the host glue. A worker that dies or misses its deadline fails that one call with an
 *   error naming it and is restarted; the next call runs normally. options.inproc = 1 runs
 *   everything in the calling process instead (same actions, bit for bit).
 *   An engine serves one call at a time: concurrent molmoact_infer calls on one engine are
 *   serialised by the engine (each gets a correct result), never interleaved. Separate engines
 *   may be used from separate threads. molmoact_close must not race with other calls on the
 *   same engine.
 *
 * ERRORS
 *   Every fallible function returns a molmoact_status (MOLMOACT_OK = 0) and, when err is not
 *   NULL, fills err->message with a sentence naming the field, file or worker at fault, e.g.
 *   "observation.state[3] is NaN" or "worker llm_split2 (pid 4242) died during the request
 *   (killed by signal 9); it was restarted". Nothing is left allocated on failure.
 *
 * OWNERSHIP
 *   The library never keeps a pointer into the caller's observation past molmoact_infer.
 *   A result's arrays are allocated by the library and released by molmoact_result_free.
 *   Strings in molmoact_options are copied by molmoact_open.
 */
#ifndef MOLMOACT_H
#define MOLMOACT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && !defined(MOLMOACT_STATIC)
#define MOLMOACT_API __attribute__((visibility("default")))
#else
#define MOLMOACT_API
#endif

#define MOLMOACT_VERSION_MAJOR 0
#define MOLMOACT_VERSION_MINOR 12
#define MOLMOACT_VERSION_PATCH 0
#define MOLMOACT_VERSION "0.12.0"

/* the library's version string ("0.12.0"); compare with MOLMOACT_VERSION to detect a header and
 * library mismatch */
MOLMOACT_API const char *molmoact_version(void);

typedef enum molmoact_status {
    MOLMOACT_OK = 0,
    MOLMOACT_ERR_ARG = 1,         /* a NULL where none is allowed, a bad option, a closed engine */
    MOLMOACT_ERR_IO = 2,          /* a file could not be opened, read or mapped */
    MOLMOACT_ERR_FORMAT = 3,      /* a model file or an encoded image is malformed */
    MOLMOACT_ERR_SHAPE = 4,       /* an input has the wrong size */
    MOLMOACT_ERR_NOMEM = 5,       /* out of memory, or an input over a size limit */
    MOLMOACT_ERR_UNSUPPORTED = 6, /* valid, but not implemented here */
    MOLMOACT_ERR_RANGE = 7,       /* a value out of its range (NaN, infinity, an unknown token) */
    MOLMOACT_ERR_WORKER = 9,      /* a worker process died or missed its deadline (restarted) */
} molmoact_status;

typedef struct molmoact_error {
    molmoact_status code;
    char message[1024];
} molmoact_error;

/* a short name of a status ("MOLMOACT_ERR_SHAPE") */
MOLMOACT_API const char *molmoact_status_name(molmoact_status s);

/* ------------------------------------------------------------------------------------ open */

typedef struct molmoact_options {
    uint32_t struct_size; /* sizeof(molmoact_options), set by molmoact_options_init */
    /* required: a Hugging Face MolmoAct2 checkpoint, a LeRobot policy directory (its
     * pretrained_model; the MolmoAct2 base it names is found through base_dir below), or the
     * context directory `molmoact compile` writes */
    const char *model_dir;
    const char *backend; /* "cpu" or "qnn" (NULL = MOLMOACT_BACKEND, else "cpu") */
    /* Every option left NULL or 0 takes the value of its environment variable (`molmoact help
     * env`) unless ignore_env, else its default. The environment is read once, at open; nothing
     * is ever written to it: each engine keeps its own settings, which its workers receive in
     * their start message (engines with different settings may live in one process) */
    int inproc;           /* 0: six resident worker processes (default); 1: this process */
    int threads;          /* kernel threads per process; 0 = MOLMOACT_THREADS or all CPUs */
    const char *norm_tag; /* norm_stats.json tag; NULL = "libero" */
    /* context variants (compile --suffix): NULL = the VISION_/LLM_/ACTION_CTX_SUFFIX variables */
    const char *vision_suffix, *llm_suffix, *action_suffix;
    const char *worker_exe; /* the molmoact program the workers run; NULL = found (above) */
    int deadline_ms;        /* per request and worker; 0 = MOLMOACT_WORKER_DEADLINE_MS or 60000 */
    /* since 0.9: a LeRobot policy directory's base (the HF MolmoAct2 directory its config.json,
     * tokenizer and processor config come from); NULL = MOLMOACT_BASE_DIR, else the Hugging Face
     * cache entry of the policy's checkpoint_path */
    const char *base_dir;
    /* since 0.11: the other settings (each also read from its variable, above) */
    const char *kernels;     /* a kernel set: "scalar", "portable", "avx2", "avx512", "vnni", "amx", "neon", "neon_dot" */
    const char *compute;     /* every matrix's compute plan: "context", "fp32", "bf16", "f16" */
    const char *gemm_panels; /* "in_place" or "convert" */
    int prompt_seq;          /* the static prompt length (contexts: must be the compiled one) */
    int preload;             /* 1: read every context in at open and run one warm-up request */
    int verbose;             /* 1: each QNN context's graphs at open, on stderr */
    int progress;            /* 1: the workers' start as progress lines on stderr */
    const char *qnn_lib_dir; /* where libQnnHtp.so and libQnnSystem.so are */
    const char *qnn_io_map;  /* a JSON file naming the graphs' tensors */
    const char *qnn_perf;    /* the HTP power vote: "default", "high", "burst" */
    long qnn_soc, qnn_arch;  /* HTP device configs (0: none sent) */
    int qnn_zero_copy;       /* 1: tensors in registered rpcmem buffers */
    int ignore_env;          /* 1: no environment variable is read */
} molmoact_options;

/* Zeroes *opt and sets struct_size to the caller's sizeof(molmoact_options) (the macro passes it),
 * so a program built against an older header keeps working with a newer library and the reverse.
 * The function molmoact_options_init itself, which programs built against 0.10 call, fills 0.10's
 * layout only. */
MOLMOACT_API void molmoact_options_init_sized(molmoact_options *opt, uint32_t size);
MOLMOACT_API void molmoact_options_init(molmoact_options *opt);
#define molmoact_options_init(opt) molmoact_options_init_sized((opt), (uint32_t)sizeof *(opt))

typedef struct molmoact molmoact; /* an open engine (opaque) */

/* Opens the model and starts its sessions (the workers are loaded when it returns).
 * On success *out is the engine; on failure *out is NULL and err says why. */
MOLMOACT_API molmoact_status molmoact_open(const molmoact_options *opt, molmoact **out, molmoact_error *err);

/* Stops the workers and releases everything; sets *engine to NULL (a call with that NULL then
 * fails with MOLMOACT_ERR_ARG instead of touching freed memory). Returns MOLMOACT_ERR_WORKER
 * when a worker did not shut down cleanly (everything is released all the same). */
MOLMOACT_API molmoact_status molmoact_close(molmoact **engine);

/* ----------------------------------------------------------------------------------- infer */

/* A camera frame: raw RGB (data, height x width x 3 uint8, rows `stride` bytes apart; 0 means
 * 3 * width), or an encoded PNG / JPEG (encoded, encoded_len; data NULL). Any size up to 16384
 * per side and 64 Mpixel: the model resizes to 378 x 378 as upstream does. */
typedef struct molmoact_image {
    const uint8_t *data;
    int height, width;
    size_t stride;
    const uint8_t *encoded;
    size_t encoded_len;
} molmoact_image;

typedef struct molmoact_observation {
    uint32_t struct_size;     /* sizeof(molmoact_observation), set by molmoact_observation_init */
    molmoact_image images[2]; /* the agent view, then the wrist camera */
    const float *state;       /* the robot state (8 values for LIBERO); finite */
    int state_dim;
    const char *task; /* the task sentence, UTF-8, at most 65536 bytes */
    /* optional: the flow-matching noise, float [1, horizon, max_action_dim] ([1, 10, 32]) for a
     * reproducible run; else drawn as torch.randn from `seed` (0 unless have_seed) */
    const float *noise;
    size_t noise_len; /* number of floats in noise */
    int have_seed;
    uint64_t seed;
    /* advanced (validation against goldens): already preprocessed inputs, used instead of the
     * frames and/or the prompt when not NULL: pixels float [n_images, 729, 588] in [-1, 1],
     * input_ids int64 [seq_len] (a complete prompt; -1 is padding) */
    const float *pixels;
    int n_pixel_images;
    const int64_t *input_ids;
    int64_t seq_len;
    /* since 0.9 (read when struct_size covers them): per-request choices, 0 / NULL for the
     * engine's. norm_tag: another tag of norm_stats.json for this request's state and actions
     * (an unknown tag is refused, naming the known ones). flow_steps: the flow-matching Euler
     * steps, 1..256 (a context directory holds the modulations of its compiled count: a
     * divisor of that count is accepted, another is refused). */
    const char *norm_tag;
    int flow_steps;
    /* since 0.11: 1 rotates both frames by 180 degrees after decoding (LIBERO renders upside
     * down; `molmoact serve --flip180`) */
    int rotate180;
    int reserved[3]; /* zero (so that 0.11's struct is larger than 0.10's, padding included) */
    /* since 0.12 (read when struct_size covers them): real-time chunking (RTC), LeRobot's
     * "guided" mode as its RTCProcessor steers MolmoAct2's flow matching
     * (policies/rtc/modeling_rtc.py): each Euler step's velocity is pulled toward rtc_prefix,
     * the actions of the previous chunk still to be executed, in the model's normalised space
     * (what molmoact_result.trajectory holds, from its row n_obs_steps - 1, the first action
     * returned: the prefix's row 0 lies there; with n_obs_steps 1, LeRobot's alignment).
     * rtc_prefix_rows x rtc_prefix_dim floats, finite: rows 1 .. horizon - (n_obs_steps - 1),
     * rtc_prefix_dim the action dim or max_action_dim; fewer rows and narrower rows are
     * zero-padded, as LeRobot pads them. rtc_delay: the inference delay d >= 0 in control ticks
     * (rows that run before this chunk arrives: weight 1); rtc_horizon: the execution horizon H
     * (0: 10), clipped to rtc_prefix_rows; rtc_beta: the guidance weight's cap, > 0 (0: 10);
     * rtc_schedule: the prefix weights between d and H (MOLMOACT_RTC_LINEAR, the default, _EXP,
     * _ONES, _ZEROS). rtc_prefix NULL (with rows and dim 0): no guidance, the result bit for bit
     * as without RTC. `molmoact run --rtc-prefix FILE` replays a request with a prefix. */
    const float *rtc_prefix;
    int rtc_prefix_rows, rtc_prefix_dim;
    int rtc_delay, rtc_horizon;
    float rtc_beta;
    int rtc_schedule;
} molmoact_observation;

enum { MOLMOACT_RTC_LINEAR = 0, MOLMOACT_RTC_EXP = 1, MOLMOACT_RTC_ONES = 2, MOLMOACT_RTC_ZEROS = 3 };

/* as molmoact_options_init: the macro passes the caller's sizeof; the function fills 0.10's layout */
MOLMOACT_API void molmoact_observation_init_sized(molmoact_observation *obs, uint32_t size);
MOLMOACT_API void molmoact_observation_init(molmoact_observation *obs);
#define molmoact_observation_init(obs) molmoact_observation_init_sized((obs), (uint32_t)sizeof *(obs))

/* per-component time of one call, in milliseconds: pure inference in each session (the action
 * step summed over the Euler steps), shared-memory transfer, host glue, and the whole pipeline
 * (total); preprocess is the observation's preparation before it (frame decode and resize,
 * prompt and tokens), so a call takes about total + preprocess */
typedef struct molmoact_timing {
    double vision, llm_split[4], action_context, action_step, transfer, host, total, preprocess;
} molmoact_timing;

typedef struct molmoact_result {
    float *actions; /* [n_steps][action_dim], de-normalised: what the robot executes */
    int n_steps, action_dim;
    float *trajectory; /* [horizon][max_action_dim]: x after the last Euler step, normalised */
    int horizon, max_action_dim;
    molmoact_timing timing;
} molmoact_result;

/* One observation -> one action chunk. On success res holds malloc'd arrays (release with
 * molmoact_result_free); on failure res is zeroed and err names the field, file or worker. */
MOLMOACT_API molmoact_status molmoact_infer(molmoact *engine, const molmoact_observation *obs, molmoact_result *res, molmoact_error *err);

MOLMOACT_API void molmoact_result_free(molmoact_result *res);

/* ------------------------------------------------------------------------------------ info */

typedef struct molmoact_info {
    char variant[16]; /* "grid" (Grid Sampler) or "original" */
    int action_horizon, action_dim, max_action_dim, n_steps, state_dim, flow_steps;
    int prompt_seq;        /* the contexts' prompt length (0 for a checkpoint) */
    char precision[3][16]; /* vision, llm, action: "f16", "q4_0", ... or "checkpoint" */
    char norm_tag[64];
    int inproc;
    long peak_rss_kib, workers_peak_rss_kib; /* this process, the live workers together */
} molmoact_info;

MOLMOACT_API molmoact_status molmoact_get_info(molmoact *engine, molmoact_info *info, molmoact_error *err);

/* since 0.11: the weights of each component (vision, embed, llm_split0..3, action_context,
 * action_step), for reports and status pages: the precision its context was compiled in
 * ("checkpoint" for a Hugging Face or LeRobot checkpoint) and the dtypes its tensors are stored
 * in, the largest share first, with their bytes (a q4_0 context also holds f16 rows and f32
 * vectors). index 0 .. molmoact_component_count() - 1; out->struct_size set by the caller. */
#define MOLMOACT_MAX_DTYPES 6
typedef struct molmoact_component {
    uint32_t struct_size; /* sizeof(molmoact_component) */
    char name[32];
    char precision[16];
    int n_dtypes; /* 0: its weights could not be read */
    char dtype[MOLMOACT_MAX_DTYPES][8];
    uint64_t bytes[MOLMOACT_MAX_DTYPES];
} molmoact_component;

MOLMOACT_API int molmoact_component_count(void);
MOLMOACT_API molmoact_status molmoact_get_component(molmoact *engine, int index, molmoact_component *out, molmoact_error *err);

/* since 0.11: one of the engine's settings as text, by the name of its options field or of its
 * row in `molmoact help env` ("backend", "threads", "kernels", "prompt_seq", "qnn_lib_dir", ...):
 * what the engine and its workers run with. An unknown name is MOLMOACT_ERR_ARG; a value longer
 * than cap - 1 is MOLMOACT_ERR_RANGE. Numbers left at their default read "0" ("-1" for qnn_soc
 * and qnn_arch), strings "". Since 0.12 also "first_action_row": the model's, the trajectory row
 * the first action comes from (n_obs_steps - 1; what an RTC prefix's row 0 stands for). */
MOLMOACT_API molmoact_status molmoact_get_setting(molmoact *engine, const char *name, char *value, size_t cap, molmoact_error *err);

#ifdef __cplusplus
}
#endif

#endif
