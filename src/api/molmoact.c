/* SPDX-License-Identifier: Apache-2.0 */
/* libmolmoact: the public C API (include/molmoact.h) over the engine (runtime/engine.h).
 *
 * An engine is the resident runtime (or the in-process one) plus a mutex: molmoact_infer holds it
 * for the whole call, so concurrent callers are served one after the other. Observations are
 * validated field by field before anything runs, and turned into the pipeline's inputs exactly
 * as the command line does (frames -> torch-exact resize -> pixels; task + state -> prompt ->
 * tokens; noise or torch.randn(seed)), so the API and `molmoact run` give the same bits. */
#define _GNU_SOURCE /* dladdr */
#include "molmoact.h"

#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "api/internal.h"
#include "backend/backends.h"
#include "core/env.h"
#include "core/util.h"
#include "kernels/kernels.h"
#include "model/normstats.h"
#include "model/tokenizer.h"
#include "runtime/observation.h"

#define TASK_MAX_BYTES 65536

#define TAG_CACHE 8

struct molmoact {
    pthread_mutex_t lock;
    ma_engine engine;
    char *dir, *tag, *exe;
    /* norm_stats of other tags, read on first request (observation.norm_tag) */
    int n_tags;
    char tag_name[TAG_CACHE][64];
    ma_normstats tag_ns[TAG_CACHE];
};

const char *molmoact_version(void) { return MOLMOACT_VERSION; }

const char *molmoact_status_name(molmoact_status s) {
    switch (s) {
    case MOLMOACT_OK: return "MOLMOACT_OK";
    case MOLMOACT_ERR_ARG: return "MOLMOACT_ERR_ARG";
    case MOLMOACT_ERR_IO: return "MOLMOACT_ERR_IO";
    case MOLMOACT_ERR_FORMAT: return "MOLMOACT_ERR_FORMAT";
    case MOLMOACT_ERR_SHAPE: return "MOLMOACT_ERR_SHAPE";
    case MOLMOACT_ERR_NOMEM: return "MOLMOACT_ERR_NOMEM";
    case MOLMOACT_ERR_UNSUPPORTED: return "MOLMOACT_ERR_UNSUPPORTED";
    case MOLMOACT_ERR_RANGE: return "MOLMOACT_ERR_RANGE";
    case MOLMOACT_ERR_WORKER: return "MOLMOACT_ERR_WORKER";
    }
    return "MOLMOACT_ERR_UNKNOWN";
}

static molmoact_status to_public(ma_status s) {
    switch (s) {
    case MA_OK: return MOLMOACT_OK;
    case MA_ERR_ARG: return MOLMOACT_ERR_ARG;
    case MA_ERR_IO: return MOLMOACT_ERR_IO;
    case MA_ERR_FORMAT: return MOLMOACT_ERR_FORMAT;
    case MA_ERR_SHAPE: return MOLMOACT_ERR_SHAPE;
    case MA_ERR_NOMEM: return MOLMOACT_ERR_NOMEM;
    case MA_ERR_UNSUPPORTED: return MOLMOACT_ERR_UNSUPPORTED;
    case MA_ERR_RANGE: return MOLMOACT_ERR_RANGE;
    case MA_ERR_PARITY: return MOLMOACT_ERR_RANGE;
    case MA_ERR_WORKER: return MOLMOACT_ERR_WORKER;
    }
    return MOLMOACT_ERR_ARG;
}

/* fill the public error from an internal one; returns the public status */
molmoact_status molmoact_internal_report(molmoact_error *out, ma_status s, const ma_error *e) {
    const molmoact_status p = to_public(s);
    if (out) {
        out->code = p;
        snprintf(out->message, sizeof out->message, "%s", p == MOLMOACT_OK ? "" : e->msg);
    }
    return p;
}

static molmoact_status fail(molmoact_error *out, molmoact_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static molmoact_status fail(molmoact_error *out, molmoact_status code, const char *fmt, ...) {
    if (out) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(out->message, sizeof out->message, fmt, ap);
        va_end(ap);
        out->code = code;
    }
    return code;
}

/* the sizes of 0.10's structs: what a program built against 0.10 has room for (its options ended
 * with base_dir; its observation with flow_steps, padded to 8 bytes) */
#define OPTIONS_SIZE_0_10 (offsetof(molmoact_options, base_dir) + sizeof(const char *))
#define OBSERVATION_SIZE_0_10 ((offsetof(molmoact_observation, rotate180) + 7) & ~(size_t)7)
_Static_assert(OBSERVATION_SIZE_0_10 < offsetof(molmoact_observation, reserved) + sizeof(int[3]),
               "0.11's observation fields must lie beyond 0.10's struct");
/* 0.11's struct ended with reserved[3], padded to 8 bytes: the 0.12 fields lie beyond it */
_Static_assert(((offsetof(molmoact_observation, reserved) + sizeof(int[3]) + 7) & ~(size_t)7) <= offsetof(molmoact_observation, rtc_prefix),
               "0.12's observation fields must lie beyond 0.11's struct");
_Static_assert((int)MOLMOACT_RTC_LINEAR == (int)MA_RTC_LINEAR && (int)MOLMOACT_RTC_EXP == (int)MA_RTC_EXP &&
                   (int)MOLMOACT_RTC_ONES == (int)MA_RTC_ONES && (int)MOLMOACT_RTC_ZEROS == (int)MA_RTC_ZEROS,
               "the public RTC schedules are the runtime's");

/* zero a caller's struct of `size` bytes (at most 4096: open and infer refuse larger) */
static void init_sized(void *p, uint32_t *struct_size, uint32_t size) {
    if (!p) return;
    if (size > 4096) size = 4096;
    memset(p, 0, size);
    *struct_size = size;
}

void molmoact_options_init_sized(molmoact_options *opt, uint32_t size) {
    if (opt) init_sized(opt, &opt->struct_size, size);
}

void molmoact_observation_init_sized(molmoact_observation *obs, uint32_t size) {
    if (obs) init_sized(obs, &obs->struct_size, size);
}

/* the functions a program built against 0.10 calls (the header's macros take the sized ones) */
void(molmoact_options_init)(molmoact_options *opt) { molmoact_options_init_sized(opt, (uint32_t)OPTIONS_SIZE_0_10); }

void(molmoact_observation_init)(molmoact_observation *obs) { molmoact_observation_init_sized(obs, (uint32_t)OBSERVATION_SIZE_0_10); }

/* the molmoact program for the workers: settings.worker_exe (options.worker_exe or
 * MOLMOACT_WORKER_EXE), else next to this library (LIBDIR/molmoact, LIBDIR/../bin/molmoact: the
 * build tree and an installed prefix). NULL when none is found. */
static char *find_worker_exe(const ma_settings *st) {
    if (st->worker_exe[0]) return strdup(st->worker_exe);
    Dl_info info;
    char dir[PATH_MAX], cand[PATH_MAX + 32];
    if (dladdr((void *)molmoact_open, &info) && info.dli_fname && realpath(info.dli_fname, dir)) {
        char *slash = strrchr(dir, '/');
        if (slash) {
            *slash = '\0';
            const char *rel[] = {"/molmoact", "/../bin/molmoact"};
            for (int i = 0; i < 2; i++) {
                snprintf(cand, sizeof cand, "%s%s", dir, rel[i]);
                if (access(cand, X_OK) == 0 && ma_is_file(cand)) return strdup(cand);
            }
        }
    }
    return NULL;
}

/* the options present in a caller's struct (struct_size: an older caller's is shorter) */
#define HAS(opt, field) ((opt)->struct_size >= offsetof(molmoact_options, field) + sizeof((opt)->field))

/* one option into the settings, when given (a string not NULL, a number not 0) */
static ma_status opt_str(ma_settings *st, const char *key, const char *v, ma_error *err) {
    if (!v) return MA_OK;
    char from[48];
    snprintf(from, sizeof from, "options.%s", key);
    return ma_settings_set(st, key, v, from, err);
}

static ma_status opt_num(ma_settings *st, const char *key, long v, ma_error *err) {
    if (!v) return MA_OK;
    char num[32];
    snprintf(num, sizeof num, "%ld", v);
    return opt_str(st, key, num, err);
}

/* the engine's settings: the environment's (unless ignore_env), then the options over them */
static ma_status settings_from_options(const molmoact_options *opt, ma_settings *st, ma_error *err) {
    ma_status s = HAS(opt, ignore_env) && opt->ignore_env ? (ma_settings_init(st), MA_OK) : ma_settings_from_env(st, err);
    if (s) return s;
    if ((s = opt_str(st, "backend", opt->backend, err)) || (s = opt_num(st, "threads", opt->threads, err)) ||
        (s = opt_str(st, "vision_suffix", opt->vision_suffix, err)) || (s = opt_str(st, "llm_suffix", opt->llm_suffix, err)) ||
        (s = opt_str(st, "action_suffix", opt->action_suffix, err)) || (s = opt_str(st, "worker_exe", opt->worker_exe, err)) ||
        (s = opt_num(st, "worker_deadline_ms", opt->deadline_ms, err)))
        return s;
    if (HAS(opt, base_dir) && (s = opt_str(st, "base_dir", opt->base_dir, err))) return s;
    if (!HAS(opt, ignore_env)) return MA_OK;
    const struct {
        const char *key, *v;
    } strs[] = {{"kernels", opt->kernels},         {"compute", opt->compute},       {"gemm_panels", opt->gemm_panels},
                {"qnn_lib_dir", opt->qnn_lib_dir}, {"qnn_io_map", opt->qnn_io_map}, {"qnn_perf", opt->qnn_perf}};
    const struct {
        const char *key;
        long v;
    } nums[] = {{"prompt_seq", opt->prompt_seq},      {"preload", opt->preload}, {"verbose", opt->verbose},
                {"progress", opt->progress},          {"qnn_soc", opt->qnn_soc}, {"qnn_arch", opt->qnn_arch},
                {"qnn_zero_copy", opt->qnn_zero_copy}};
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++)
        if ((s = opt_str(st, strs[i].key, strs[i].v, err))) return s;
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
        if ((s = opt_num(st, nums[i].key, nums[i].v, err))) return s;
    return MA_OK;
}

molmoact_status molmoact_open(const molmoact_options *opt, molmoact **out, molmoact_error *err) {
    if (out) *out = NULL;
    if (err) {
        err->code = MOLMOACT_OK;
        err->message[0] = '\0';
    }
    if (!opt || !out) return fail(err, MOLMOACT_ERR_ARG, "molmoact_open: %s is NULL", opt ? "out" : "options");
    if (opt->struct_size < offsetof(molmoact_options, deadline_ms) + sizeof(int) || opt->struct_size > 4096)
        return fail(err, MOLMOACT_ERR_ARG, "options.struct_size is %u (call molmoact_options_init)", opt->struct_size);
    if (!opt->model_dir || !*opt->model_dir) return fail(err, MOLMOACT_ERR_ARG, "options.model_dir is not set");
    if (opt->threads < 0 || opt->threads > 64) return fail(err, MOLMOACT_ERR_ARG, "options.threads %d: 0..64", opt->threads);
    if (opt->deadline_ms < 0) return fail(err, MOLMOACT_ERR_ARG, "options.deadline_ms %d is negative", opt->deadline_ms);
    if (opt->inproc != 0 && opt->inproc != 1) return fail(err, MOLMOACT_ERR_ARG, "options.inproc must be 0 or 1");
    ma_error me = {0};
    ma_settings *st = malloc(sizeof *st);
    if (!st) return fail(err, MOLMOACT_ERR_NOMEM, "out of memory");
    ma_status ss = settings_from_options(opt, st, &me);
    if (ss) {
        free(st);
        return molmoact_internal_report(err, ss, &me);
    }
    if (!ma_is_dir(opt->model_dir)) {
        free(st);
        return fail(err, MOLMOACT_ERR_IO, "options.model_dir %s is not a directory", opt->model_dir);
    }
    if (HAS(opt, base_dir) && opt->base_dir && (!*opt->base_dir || !ma_is_dir(opt->base_dir))) {
        free(st);
        return fail(err, MOLMOACT_ERR_IO, "options.base_dir %s is not a directory", opt->base_dir);
    }
    /* the backend, from the registry (runtime/ is handed it) */
    const ma_backend *be = ma_backend_find(st->backend);
    if (!be) {
        fail(err, MOLMOACT_ERR_ARG, "backend %s: not in this build", st->backend);
        free(st);
        return MOLMOACT_ERR_ARG;
    }
    molmoact *e = calloc(1, sizeof *e);
    if (!e) {
        free(st);
        return fail(err, MOLMOACT_ERR_NOMEM, "out of memory");
    }
    pthread_mutex_init(&e->lock, NULL);
    e->dir = strdup(opt->model_dir);
    e->tag = strdup(opt->norm_tag ? opt->norm_tag : "libero");
    if (!opt->inproc) e->exe = find_worker_exe(st);
    if (!e->dir || !e->tag) {
        free(st);
        molmoact_close(&e);
        return fail(err, MOLMOACT_ERR_NOMEM, "out of memory");
    }
    if (!opt->inproc && !e->exe) {
        free(st);
        molmoact_close(&e);
        return fail(err, MOLMOACT_ERR_IO,
                    "the molmoact program for the resident workers was not found next to the library "
                    "(LIBDIR/molmoact or LIBDIR/../bin/molmoact): set options.worker_exe or MOLMOACT_WORKER_EXE, or use inproc");
    }
    ma_resident_opts ro;
    memset(&ro, 0, sizeof ro);
    ro.exe = e->exe;
    ma_status s = ma_engine_open(e->dir, e->tag, opt->inproc, st, be, &ro, &e->engine, &me);
    const int preload = st->preload;
    free(st); /* the engine's model holds its copy */
    if (s) {
        e->engine.runner = NULL;
        molmoact_close(&e);
        return molmoact_internal_report(err, s, &me);
    }
    /* --preload: the contexts were read in as they were mapped; one untimed request on blank
     * frames now faults in what only a request touches (every process's activations and scratch,
     * the shared memory of each worker), so the first real request runs as fast as the next
     * (measured at full size on an AMD EPYC VM: without it the first request after --preload
     * took 1.6x a warm one, every component slower) */
    if (preload) {
        molmoact_info info;
        molmoact_status ws = molmoact_get_info(e, &info, err);
        static const uint8_t gray[32 * 32 * 3] = {0};
        float state[64] = {0};
        if (!ws && (info.state_dim < 1 || info.state_dim > 64))
            ws = fail(err, MOLMOACT_ERR_FORMAT, "preload warm-up: the model's state has %d values", info.state_dim);
        if (!ws) {
            molmoact_observation obs;
            molmoact_observation_init(&obs);
            for (int i = 0; i < 2; i++) obs.images[i] = (molmoact_image){gray, 32, 32, 0, NULL, 0};
            obs.state = state;
            obs.state_dim = info.state_dim;
            obs.task = "warm up";
            molmoact_result res;
            ws = molmoact_infer(e, &obs, &res, err);
            if (!ws) molmoact_result_free(&res);
        }
        if (ws) {
            char msg[sizeof err->message];
            snprintf(msg, sizeof msg, "%s", err ? err->message : "");
            molmoact_close(&e);
            return fail(err, ws, "preload warm-up request: %s", msg);
        }
    }
    *out = e;
    return MOLMOACT_OK;
}

molmoact_status molmoact_close(molmoact **engine) {
    if (!engine || !*engine) return MOLMOACT_OK;
    molmoact *e = *engine;
    *engine = NULL;
    int bad = e->engine.runner ? ma_engine_close(&e->engine) : 0;
    pthread_mutex_destroy(&e->lock);
    free(e->dir);
    free(e->tag);
    free(e->exe);
    free(e);
    return bad ? MOLMOACT_ERR_WORKER : MOLMOACT_OK;
}

void molmoact_result_free(molmoact_result *res) {
    if (!res) return;
    free(res->actions);
    free(res->trajectory);
    memset(res, 0, sizeof *res);
}

/* one camera frame -> an owned contiguous RGB image (runtime/observation.c checks and decodes it) */
static ma_status take_image(const molmoact_image *im, int i, int rotate180, ma_image *out, ma_error *err) {
    char label[48];
    snprintf(label, sizeof label, "observation.images[%d]", i);
    const ma_frame f = {im->data, im->height, im->width, im->stride, im->encoded, im->encoded_len};
    ma_status s = ma_frame_image(&f, label, out, err);
    if (!s && rotate180) { /* pixel i and pixel n-1-i trade places */
        const size_t n = (size_t)out->h * (size_t)out->w;
        for (size_t k = 0; k < n / 2; k++) {
            uint8_t *a = out->rgb + 3 * k, *b = out->rgb + 3 * (n - 1 - k), t[3];
            memcpy(t, a, 3);
            memcpy(a, b, 3);
            memcpy(b, t, 3);
        }
    }
    return s;
}

/* the observation, checked field by field, as the pipeline's inputs (frames and prompt prepared
 * as `molmoact run` prepares them) */
typedef struct {
    ma_obs obs;
    ma_image imgs[2];
    ma_prepared prep;
} prepared_obs;

static void prepared_free(prepared_obs *p) {
    for (int i = 0; i < 2; i++) ma_image_free(&p->imgs[i]);
    ma_prepared_free(&p->prep);
    memset(p, 0, sizeof *p);
}

static ma_status prepare(const ma_engine *eng, const molmoact_observation *o, prepared_obs *p, ma_error *err) {
    const ma_model *m = &eng->host;
    const ma_config *c = &m->cfg;
    memset(p, 0, sizeof *p);
    if (o->struct_size < offsetof(molmoact_observation, seq_len) + sizeof(int64_t) || o->struct_size > 4096)
        return ma_fail(err, MA_ERR_ARG, "observation.struct_size is %u (call molmoact_observation_init)", o->struct_size);
    ma_status s;
    const int need_prompt = !o->input_ids, need_frames = !o->pixels;
    const int rotate = o->struct_size >= offsetof(molmoact_observation, reserved) + sizeof o->reserved ? o->rotate180 : 0;
    if (rotate != 0 && rotate != 1) return ma_fail(err, MA_ERR_ARG, "observation.rotate180 is %d: 0 or 1", rotate);
    if (o->input_ids) {
        if (o->seq_len < 1 || o->seq_len > (1 << 20))
            return ma_fail(err, MA_ERR_SHAPE, "observation.seq_len %lld: 1..%d", (long long)o->seq_len, 1 << 20);
        p->obs.input_ids = o->input_ids;
        p->obs.seq_len = o->seq_len;
    }
    if (o->pixels) {
        if (o->n_pixel_images < 1 || o->n_pixel_images > 16)
            return ma_fail(err, MA_ERR_SHAPE, "observation.n_pixel_images %d: 1..16", o->n_pixel_images);
        p->obs.pixels = o->pixels;
        p->obs.n_images = o->n_pixel_images;
    }
    float state[MA_NORM_MAX_DIM];
    if (need_prompt) {
        if (!o->task) return ma_fail(err, MA_ERR_ARG, "observation.task is NULL");
        const size_t tl = strnlen(o->task, TASK_MAX_BYTES + 1);
        if (tl > TASK_MAX_BYTES) return ma_fail(err, MA_ERR_NOMEM, "observation.task exceeds %d bytes", TASK_MAX_BYTES);
        if (!o->state) return ma_fail(err, MA_ERR_ARG, "observation.state is NULL");
        const int want = m->ns.has_state ? m->ns.state.dim : o->state_dim;
        if (o->state_dim < 1 || o->state_dim > MA_NORM_MAX_DIM || o->state_dim != want)
            return ma_fail(err, MA_ERR_SHAPE, "observation.state_dim is %d, the model's state has %d values", o->state_dim, want);
        for (int i = 0; i < o->state_dim; i++) {
            if (!isfinite(o->state[i]))
                return ma_fail(err, MA_ERR_RANGE, "observation.state[%d] is %s", i, isnan(o->state[i]) ? "NaN" : "infinite");
            state[i] = o->state[i];
        }
    }
    if (need_frames || need_prompt) {
        for (int i = 0; i < 2; i++)
            if ((s = take_image(&o->images[i], i, rotate, &p->imgs[i], err))) return s;
        if (need_prompt) {
            const size_t ok = ma_utf8_valid_prefix((const uint8_t *)o->task, strlen(o->task));
            if (ok != strlen(o->task)) return ma_fail(err, MA_ERR_FORMAT, "observation.task is not valid UTF-8 (at byte %zu)", ok);
            s = ma_prepare_observation(m, p->imgs, 2, o->task, strlen(o->task), state, o->state_dim, &p->prep, err);
            /* what the task makes too long is the observation's fault: said as such (a server
             * passes on only messages about the observation, issue 36 F17) */
            if (s == MA_ERR_RANGE && (!strncmp(err->msg, "the prompt has", 14) || !strncmp(err->msg, "task", 4)))
                ma_error_wrap(err, s, "observation.task");
            if (s) return s;
            p->obs.input_ids = p->prep.prompt.ids;
            p->obs.seq_len = p->prep.prompt.n;
        } else if ((s = ma_prepare_pixels(m, p->imgs, 2, &p->prep.pixels, err))) return s;
        if (need_frames) {
            p->obs.pixels = p->prep.pixels;
            p->obs.n_images = 2;
        }
    }
    int action_dim, A, n_steps;
    if ((s = ma_action_plan(m, &action_dim, &A, &n_steps, err))) return s;
    if (o->noise) {
        if (o->have_seed) return ma_fail(err, MA_ERR_ARG, "observation: noise and seed contradict each other (give one)");
        const size_t want = (size_t)A * (size_t)c->max_action_dim;
        if (o->noise_len != want)
            return ma_fail(err, MA_ERR_SHAPE, "observation.noise has %zu values, the model needs [1, %d, %d] = %zu", o->noise_len, A,
                           c->max_action_dim, want);
        for (size_t i = 0; i < want; i++)
            if (!isfinite(o->noise[i])) return ma_fail(err, MA_ERR_RANGE, "observation.noise[%zu] is not finite", i);
        p->obs.noise = o->noise;
    } else if (o->noise_len) return ma_fail(err, MA_ERR_ARG, "observation.noise_len is %zu but noise is NULL", o->noise_len);
    p->obs.seed = o->have_seed ? o->seed : 0;
    if (o->struct_size >= offsetof(molmoact_observation, flow_steps) + sizeof(int) && o->flow_steps) {
        const int n = o->flow_steps;
        if (n < 1 || n > MA_MAX_FLOW_STEPS) return ma_fail(err, MA_ERR_RANGE, "observation.flow_steps %d: 1..%d", n, MA_MAX_FLOW_STEPS);
        if (m->from_contexts && c->flow_steps % n)
            return ma_fail(err, MA_ERR_RANGE,
                           "observation.flow_steps %d: this context directory holds the modulations of %d steps; "
                           "use a divisor of %d (or run the checkpoint directory)",
                           n, c->flow_steps, c->flow_steps);
        p->obs.flow_steps = n;
    }
    /* since 0.12: real-time chunking (a 0.11 caller's struct ends before these fields) */
    if (o->struct_size >= offsetof(molmoact_observation, rtc_schedule) + sizeof(int)) {
        const ma_rtc r = {o->rtc_prefix, o->rtc_prefix_rows, o->rtc_prefix_dim, o->rtc_delay, o->rtc_horizon, o->rtc_beta, o->rtc_schedule};
        if ((s = ma_rtc_check(&r, A - (c->n_obs_steps - 1), action_dim, c->max_action_dim, "observation.rtc_", err))) return s;
        p->obs.rtc = r;
    }
    return MA_OK;
}

/* observation.norm_tag: the statistics of that tag (read once, kept) */
static ma_status tag_stats(molmoact *e, const char *tag, const ma_normstats **out, ma_error *err) {
    for (int i = 0; i < e->n_tags; i++)
        if (!strcmp(e->tag_name[i], tag)) {
            *out = &e->tag_ns[i];
            return MA_OK;
        }
    if (strlen(tag) >= sizeof e->tag_name[0] || !*tag) return ma_fail(err, MA_ERR_ARG, "observation.norm_tag: 1 to 63 characters");
    const ma_model *m = &e->engine.host;
    char *path = ma_path_join(m->dir, m->cfg.norm_stats_filename);
    if (!path) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
    ma_normstats ns;
    ma_error le = {0};
    ma_status s = ma_normstats_load(path, tag, &ns, &le);
    if (s) {
        char known[512] = "";
        ma_normstats_tags(path, known, sizeof known);
        s = ma_fail(err, MA_ERR_ARG, "observation.norm_tag \"%.63s\" is not a tag of %s (known: %s)", tag, m->cfg.norm_stats_filename,
                    known[0] ? known : "none");
    } else if (ns.action.dim != m->ns.action.dim || ns.state.dim != m->ns.state.dim || ns.action_horizon != m->ns.action_horizon)
        s = ma_fail(err, MA_ERR_SHAPE,
                    "observation.norm_tag \"%s\": its action/state dimensions or horizon differ from the engine's tag "
                    "\"%s\" (open the engine with this tag instead)",
                    tag, e->tag);
    free(path);
    if (s) return s;
    const int slot = e->n_tags < TAG_CACHE ? e->n_tags++ : TAG_CACHE - 1;
    snprintf(e->tag_name[slot], sizeof e->tag_name[slot], "%s", tag);
    e->tag_ns[slot] = ns;
    *out = &e->tag_ns[slot];
    return MA_OK;
}

static void copy_timing(const ma_timing *t, molmoact_timing *out) {
    out->vision = t->vision;
    for (int i = 0; i < 4; i++) out->llm_split[i] = t->llm[i];
    out->action_context = t->action_context;
    out->action_step = t->action_step;
    out->transfer = t->transfer;
    out->host = t->host;
    out->total = t->total;
}

ma_status molmoact_internal_run(molmoact *e, const molmoact_observation *obs, molmoact_result *res, ma_trace *trace, ma_error *err) {
    prepared_obs p;
    const double t0 = ma_now_ms();
    /* another norm tag for this request: its statistics stand in for the engine's while it runs
     * (calls are serialised by the engine's lock) */
    /* the size first: an observation never initialised has any struct_size, and none of its
     * later fields may be read until that size is known good (issue 36 F6) */
    if (obs->struct_size < offsetof(molmoact_observation, seq_len) + sizeof(int64_t) || obs->struct_size > 4096)
        return ma_fail(err, MA_ERR_ARG, "observation.struct_size is %u (call molmoact_observation_init)", obs->struct_size);
    const char *tag = obs->struct_size >= offsetof(molmoact_observation, norm_tag) + sizeof(char *) ? obs->norm_tag : NULL;
    ma_normstats saved;
    int swapped = 0;
    if (tag && strcmp(tag, e->tag)) {
        const ma_normstats *ns = NULL;
        ma_status ts = tag_stats(e, tag, &ns, err);
        if (ts) return ts;
        saved = e->engine.host.ns;
        e->engine.host.ns = *ns;
        swapped = 1;
    }
    ma_status s = prepare(&e->engine, obs, &p, err);
    const double t1 = ma_now_ms();
    if (!s) {
        ma_result r;
        s = ma_engine_run(&e->engine, &p.obs, &r, trace, err);
        if (!s) {
            res->actions = r.actions;
            res->n_steps = r.n_steps;
            res->action_dim = r.action_dim;
            res->trajectory = r.trajectory;
            res->horizon = r.horizon;
            res->max_action_dim = r.max_action_dim;
            copy_timing(&e->engine.runner->last, &res->timing);
            res->timing.preprocess = t1 - t0;
        }
    }
    prepared_free(&p);
    if (swapped) e->engine.host.ns = saved;
    return s;
}

molmoact_status molmoact_infer(molmoact *engine, const molmoact_observation *obs, molmoact_result *res, molmoact_error *err) {
    if (err) {
        err->code = MOLMOACT_OK;
        err->message[0] = '\0';
    }
    if (res) memset(res, 0, sizeof *res);
    if (!engine) return fail(err, MOLMOACT_ERR_ARG, "molmoact_infer: the engine is NULL (closed, or never opened)");
    if (!obs || !res) return fail(err, MOLMOACT_ERR_ARG, "molmoact_infer: %s is NULL", obs ? "result" : "observation");
    ma_error me = {0};
    pthread_mutex_lock(&engine->lock);
    ma_status s = molmoact_internal_run(engine, obs, res, NULL, &me);
    pthread_mutex_unlock(&engine->lock);
    if (s) memset(res, 0, sizeof *res);
    return molmoact_internal_report(err, s, &me);
}

molmoact_status molmoact_get_info(molmoact *engine, molmoact_info *info, molmoact_error *err) {
    if (err) {
        err->code = MOLMOACT_OK;
        err->message[0] = '\0';
    }
    if (!engine) return fail(err, MOLMOACT_ERR_ARG, "molmoact_get_info: the engine is NULL (closed, or never opened)");
    if (!info) return fail(err, MOLMOACT_ERR_ARG, "molmoact_get_info: info is NULL");
    memset(info, 0, sizeof *info);
    pthread_mutex_lock(&engine->lock);
    const ma_model *m = &engine->engine.host;
    const ma_config *c = &m->cfg;
    ma_error me = {0};
    int action_dim = 0, A = 0, n_steps = 0;
    ma_status s = ma_action_plan(m, &action_dim, &A, &n_steps, &me);
    /* the Grid Sampler's K tokens per image, or the pooled grid's */
    snprintf(info->variant, sizeof info->variant, "%s", m->tokens_per_image != c->pooled_h * c->pooled_w ? "grid" : "original");
    info->action_horizon = A;
    info->action_dim = action_dim;
    info->max_action_dim = c->max_action_dim;
    info->n_steps = n_steps;
    info->state_dim = m->ns.has_state ? m->ns.state.dim : 0;
    info->flow_steps = c->flow_steps;
    info->prompt_seq = m->prompt_seq;
    for (int i = 0; i < 3; i++)
        snprintf(info->precision[i], sizeof info->precision[i], "%s", m->precision[i][0] ? m->precision[i] : "checkpoint");
    snprintf(info->norm_tag, sizeof info->norm_tag, "%s", engine->tag);
    info->inproc = engine->engine.inproc;
    ma_engine_peak_rss(&engine->engine, &info->peak_rss_kib, &info->workers_peak_rss_kib);
    pthread_mutex_unlock(&engine->lock);
    return molmoact_internal_report(err, s, &me);
}

ma_engine *molmoact_internal_engine(molmoact *e) { return e ? &e->engine : NULL; }

molmoact_status molmoact_get_setting(molmoact *engine, const char *name, char *value, size_t cap, molmoact_error *err) {
    if (err) {
        err->code = MOLMOACT_OK;
        err->message[0] = '\0';
    }
    if (!engine) return fail(err, MOLMOACT_ERR_ARG, "molmoact_get_setting: the engine is NULL (closed, or never opened)");
    if (!name || !value || !cap)
        return fail(err, MOLMOACT_ERR_ARG, "molmoact_get_setting: %s", !name ? "name is NULL" : "no room for the value");
    /* the options' names where they differ from the settings' */
    const char *key = !strcmp(name, "deadline_ms") ? "worker_deadline_ms" : name;
    char num[32];
    pthread_mutex_lock(&engine->lock);
    const char *v = ma_settings_get(&engine->engine.host.set, key, num, sizeof num);
    /* since 0.12, one of the model's: the trajectory row of the first action (n_obs_steps - 1),
     * where an RTC prefix's row 0 goes */
    if (!v && !strcmp(name, "first_action_row")) {
        snprintf(num, sizeof num, "%d", engine->engine.host.cfg.n_obs_steps - 1);
        v = num;
    }
    const size_t n = v ? strlen(v) : 0;
    if (v && n < cap) memcpy(value, v, n + 1);
    pthread_mutex_unlock(&engine->lock);
    if (!v) return fail(err, MOLMOACT_ERR_ARG, "molmoact_get_setting: no setting is called %.64s", name);
    if (n >= cap) return fail(err, MOLMOACT_ERR_RANGE, "molmoact_get_setting: %s is %zu bytes, the buffer %zu", name, n + 1, cap);
    return MOLMOACT_OK;
}
