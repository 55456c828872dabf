/* SPDX-License-Identifier: Apache-2.0 */
/* The molmoact program's shared helpers (common.h). */
#define _POSIX_C_SOURCE 200809L
#include "common/common.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "api/internal.h"
#include "io/mapfile.h"
#include "kernels/gemm.h"
#include "kernels/kernels.h"

/* the settings of this run (common.h) */
ma_settings SET;

/* the engine options of the API carrying SET (the strings point into it); the API reads the
 * environment through the same table, so what SET took from it (and the variables no option
 * carries: ADSP_LIBRARY_PATH, the hub cache) reaches the engine the same */
void options_from_settings(const ma_settings *st, molmoact_options *o) {
    o->backend = st->backend[0] ? st->backend : NULL;
    o->threads = st->threads;
    o->vision_suffix = st->suffix[MA_SUFFIX_VISION];
    o->llm_suffix = st->suffix[MA_SUFFIX_LLM];
    o->action_suffix = st->suffix[MA_SUFFIX_ACTION];
    o->worker_exe = st->worker_exe[0] ? st->worker_exe : "/proc/self/exe"; /* this program, whatever its name */
    o->deadline_ms = st->worker_deadline_ms;
    o->base_dir = st->base_dir[0] ? st->base_dir : NULL;
    o->kernels = st->kernels[0] ? st->kernels : NULL;
    o->compute = st->compute[0] ? st->compute : NULL;
    o->gemm_panels = st->gemm_panels[0] ? st->gemm_panels : NULL;
    o->prompt_seq = st->prompt_seq;
    o->preload = st->preload;
    o->verbose = st->verbose;
    o->progress = st->progress;
    o->qnn_lib_dir = st->qnn_lib_dir[0] ? st->qnn_lib_dir : NULL;
    o->qnn_io_map = st->qnn_io_map[0] ? st->qnn_io_map : NULL;
    o->qnn_perf = st->qnn_perf[0] ? st->qnn_perf : NULL;
    o->qnn_soc = st->qnn_soc >= 0 ? st->qnn_soc : 0;
    o->qnn_arch = st->qnn_arch >= 0 ? st->qnn_arch : 0;
    o->qnn_zero_copy = st->qnn_zero_copy;
}

/* the backend SET names, from the registry */
const ma_backend *settings_backend(void) { return ma_backend_find(SET.backend); }

int fail(const ma_error *e) {
    fprintf(stderr, "molmoact: %s\n", e->msg);
    return 1;
}

void request_src_of(const opts *o, ma_request_src *src) {
    memset(src, 0, sizeof *src);
    src->inputs = o->inputs;
    src->image0 = o->image0;
    src->image1 = o->image1;
    src->task = o->task;
    src->state_csv = o->state;
    src->noise_path = o->noise;
    src->have_seed = o->have_seed;
    src->seed = o->seed;
    src->rtc_prefix_path = o->rtc_prefix;
    src->rtc_delay = o->rtc_delay;
    src->rtc_horizon = o->rtc_horizon;
    src->rtc_beta = o->rtc_beta;
    src->rtc_schedule = o->rtc_schedule;
}

/* the demo (the tiny Grid Sampler model and its golden), found from this program's own place:
 * PREFIX/share/molmoact/tiny-grid when it is installed (PREFIX/bin/molmoact), BUILD/share/molmoact/
 * tiny-grid in the build tree (a link to the source tree's assets/tiny-grid that CMake makes). No
 * path of the machine that built it is compiled in. */
static const char *demo_dir(void) {
    static char dir[PATH_MAX];
    char exe[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return NULL;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash) return NULL;
    *slash = '\0';
    static const char *const where[2] = {"../share/molmoact/tiny-grid", "share/molmoact/tiny-grid"};
    for (int i = 0; i < 2; i++) {
        snprintf(dir, sizeof dir, "%.*s/%s", PATH_MAX - 64, exe, where[i]);
        char probe[PATH_MAX + 16];
        snprintf(probe, sizeof probe, "%s/model", dir);
        if (ma_is_dir(probe)) return dir;
    }
    return NULL;
}

/* the request source of the command line; without --model, the demo: the shipped tiny model,
 * its golden and (with golden_observation, when no observation is given) the golden's inputs.
 * Returns 1 when the demo is used. */
int request_setup(opts *o, ma_request_src *src, int golden_observation) {
    static char model[PATH_MAX], golden[PATH_MAX], inputs[PATH_MAX], pixels[PATH_MAX];
    request_src_of(o, src);
    if (o->model) {
        /* --golden DIR without an observation: the golden's own (its pixels, prompt and noise) */
        if (golden_observation && o->golden && !o->inputs && !o->image0 && !o->stream) {
            snprintf(inputs, sizeof inputs, "%s/step0_boundary.npz", o->golden);
            snprintf(pixels, sizeof pixels, "%s/vision_io.npz", o->golden);
            src->inputs = inputs;
            src->pixels_npz = pixels;
        }
        return 0;
    }
    const char *demo = demo_dir();
    if (!demo) {
        fprintf(stderr, "molmoact: no demo model (PREFIX/share/molmoact/tiny-grid for PREFIX/bin/molmoact, or share/molmoact/tiny-grid "
                        "beside molmoact in its build directory); give --model DIR\n");
        return -1;
    }
    snprintf(model, sizeof model, "%s/model", demo);
    snprintf(golden, sizeof golden, "%s/golden", demo);
    snprintf(inputs, sizeof inputs, "%s/step0_boundary.npz", golden);
    snprintf(pixels, sizeof pixels, "%s/vision_io.npz", golden);
    o->model = model;
    if (golden_observation && !o->golden) o->golden = golden;
    if (golden_observation && !o->inputs && !o->image0 && !o->stream) {
        src->inputs = inputs;
        src->pixels_npz = pixels;
    }
    return 1;
}

const char *mode_name(const ma_engine *e) { return e->inproc ? "inproc" : "resident, 6 worker processes"; }

/* what ran: the backend, the kernel set, the threads per process and the precision plan */
void print_plan(const ma_engine *e, int json) {
    const char *prec[3];
    for (int i = 0; i < 3; i++) prec[i] = e->host.precision[i][0] ? e->host.precision[i] : "checkpoint";
    const char *backend = e->backend->name;
    /* the compute plan: the contexts' (fp32 for a checkpoint), or MOLMOACT_COMPUTE's (the model
     * records it); a bf16 plan runs as fp32 where the CPU has no bf16 unit */
    const char *comp[3];
    int any_bf16 = 0, any_f16 = 0;
    for (int i = 0; i < 3; i++) {
        comp[i] = e->host.compute[i][0] ? e->host.compute[i] : "fp32";
        any_bf16 |= !strcmp(comp[i], "bf16");
        any_f16 |= !strcmp(comp[i], "f16");
    }
    const char *unit = e->backend->needs_weights ? ma_gemm_bf16_unit() : backend;
    if (json)
        printf(
            ", \"backend\": \"%s\", \"kernels\": \"%s\", \"threads\": %d, \"precision\": {\"vision\": \"%s\", \"llm\": \"%s\", \"action\": \"%s\"}"
            ", \"compute\": {\"vision\": \"%s\", \"llm\": \"%s\", \"action\": \"%s\", \"bf16_unit\": \"%s\", \"f16_unit\": \"%s\"}",
            backend, ma_gemm_kernels(), ma_kernel_threads(), prec[0], prec[1], prec[2], comp[0], comp[1], comp[2], unit,
            e->backend->needs_weights && ma_gemm_f16() == MA_COMPUTE_F16 ? "neon_fp16"
            : e->backend->needs_weights                                  ? "fp32"
                                                                         : backend);
    else {
        printf("backend %s, kernels %s, %d threads per process, precision: vision %s, llm %s, action %s", backend, ma_gemm_kernels(),
               ma_kernel_threads(), prec[0], prec[1], prec[2]);
        char why[160] = "", off[128];
        if (any_bf16 && !strcmp(unit, "fp32")) { /* where the plan runs as fp32, why */
            ma_gemm_bf16_off_reason(off, sizeof off);
            snprintf(why, sizeof why, ": %s, computed in fp32", off);
        }
        if (any_bf16 || any_f16) printf(", compute: vision %s, llm %s, action %s (", comp[0], comp[1], comp[2]);
        if (any_bf16) printf("bf16 on %s%s%s", unit, why, any_f16 ? "; " : ")");
        if (any_f16)
            printf("f16 %s)", !e->backend->needs_weights ? "as the backend's graphs compute"
                              : ma_gemm_f16() == MA_COMPUTE_F16
                                  ? "on the NEON FP16 tiles"
                                  : "computed in fp32: these kernels have no FP16 arithmetic (aarch64 asimdhp)");
        printf("\n");
    }
}

void print_memory(const ma_engine *e, int json) {
    long self_kb, workers_kb;
    ma_engine_peak_rss(e, &self_kb, &workers_kb);
    if (json) printf(", \"peak_rss_kb\": {\"orchestrator\": %ld, \"workers\": %ld}", self_kb, workers_kb);
    else if (e->inproc) printf("peak RSS %.1f MiB\n", self_kb / 1024.0);
    else printf("peak RSS %.1f MiB orchestrator + %.1f MiB workers\n", self_kb / 1024.0, workers_kb / 1024.0);
}

/* ------------------------------------------------------------------ inference through the API */

/* run, bench and the stream infer through the public API (include/molmoact.h), linked
 * statically; the engine behind a handle serves the parity table and the memory report */
int api_open(const opts *o, molmoact **out) {
    molmoact_options opt;
    molmoact_options_init(&opt);
    options_from_settings(&SET, &opt);
    opt.model_dir = o->model;
    opt.inproc = o->inproc;
    opt.norm_tag = o->norm_tag;
    molmoact_error err;
    if (molmoact_open(&opt, out, &err)) {
        fprintf(stderr, "molmoact: %s\n", err.message);
        return 1;
    }
    return 0;
}

/* a request (npz, files, or synthetic) as an API observation: its prepared pixels and prompt,
 * and its noise or seed */
static void api_observation(molmoact *api, const ma_request *q, molmoact_observation *obs) {
    const ma_model *m = &molmoact_internal_engine(api)->host;
    molmoact_observation_init(obs);
    obs->pixels = q->obs.pixels;
    obs->n_pixel_images = q->obs.n_images;
    obs->input_ids = q->obs.input_ids;
    obs->seq_len = q->obs.seq_len;
    if (q->obs.noise) {
        int action_dim, A, n_steps;
        ma_action_plan(m, &action_dim, &A, &n_steps, NULL);
        obs->noise = q->obs.noise;
        obs->noise_len = (size_t)A * (size_t)m->cfg.max_action_dim;
    } else {
        obs->have_seed = 1;
        obs->seed = q->obs.seed;
    }
    const ma_rtc *r = &q->obs.rtc;
    obs->rtc_prefix = r->prefix;
    obs->rtc_prefix_rows = r->rows;
    obs->rtc_prefix_dim = r->dim;
    obs->rtc_delay = r->delay;
    obs->rtc_horizon = r->horizon;
    obs->rtc_beta = r->beta;
    obs->rtc_schedule = r->schedule;
}

static ma_timing timing_of(const molmoact_timing *t) {
    ma_timing r = {t->vision,         {t->llm_split[0], t->llm_split[1], t->llm_split[2], t->llm_split[3]},
                   t->action_context, t->action_step,
                   t->transfer,       t->host,
                   t->total};
    return r;
}

/* one inference through the API (with a trace: the internal run that also records it) */
ma_status api_run(molmoact *api, const ma_request *q, ma_result *out, ma_timing *t, ma_trace *trace, ma_error *err) {
    molmoact_observation obs;
    api_observation(api, q, &obs);
    molmoact_result r;
    memset(out, 0, sizeof *out);
    ma_status s;
    if (trace) s = molmoact_internal_run(api, &obs, &r, trace, err);
    else {
        molmoact_error pe;
        s = molmoact_infer(api, &obs, &r, &pe) ? ma_fail(err, (ma_status)pe.code, "%s", pe.message) : MA_OK;
    }
    if (s) return s;
    out->actions = r.actions;
    out->n_steps = r.n_steps;
    out->action_dim = r.action_dim;
    out->trajectory = r.trajectory;
    out->horizon = r.horizon;
    out->max_action_dim = r.max_action_dim;
    if (t) *t = timing_of(&r.timing);
    return MA_OK;
}

int api_close(molmoact **api) { return molmoact_close(api) != MOLMOACT_OK; }
