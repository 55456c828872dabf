/* SPDX-License-Identifier: Apache-2.0 */
/* molmoact bench: the latency table of the pipeline, or one session in process (--session). */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/util.h"
#include "commands.h"
#include "options.h"
#include "api/internal.h"
#include "io/jsonline.h"
#include "io/npz.h"
#include "kernels/cpu.h"
#include "kernels/gemm.h"
#include "kernels/kernels.h"
#include "kernels/threads.h"
#include "model/components.h"
#include "runtime/latency.h"

/* The weights session `which` reads in one run: the bytes of its context's tensors, less the
 * per-timestep modulation tables (one row of them per step). With --cold their mapping is flushed
 * from the caches before each run, as in the full model, whose expert does not fit in any cache.
 * 0 for a checkpoint directory (one mapping for every session). */
static size_t session_weight_bytes(const ma_model *m, int which, const ma_mapfile **map) {
    *map = NULL;
    if (!m->from_contexts) return 0;
    const ma_gguf *g = &m->ctx[which == 0 ? 0 : which + 1]; /* contexts: vision, embed, llm_split0..3, ... */
    size_t bytes = 0;
    for (size_t i = 0; i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, "molmoact.step_modulations") && strcmp(g->tensors[i].name, "molmoact.final_modulations"))
            bytes += g->tensors[i].nbytes;
    *map = &g->map;
    return bytes;
}

/* the flush of --cold, shared by the kernels' pool: its threads are then awake for the timed run,
 * as between the Euler steps of an observation (a serial flush of 20-70 MB left them asleep,
 * and waking one cost about 0.1 ms in each cold run) */
typedef struct {
    const char *p;
    unsigned long n;
} flush_job;

static void flush_task(void *ctx, int t, int T) {
    const flush_job *f = ctx;
    int64_t a, b;
    ma_split_blocks((int64_t)f->n, 4096, t, T, &a, &b); /* whole pages per thread */
    if (a < b) ma_cache_flush(f->p + a, (unsigned long)(b - a));
}

static void flush_weights(const void *p, unsigned long n) {
    flush_job f = {p, n};
    ma_parallel(flush_task, &f);
}

/* one session on the arrays of IO.npz named as its inputs (a golden's <session>_io.npz, or the
 * inputs bench/compare.sh writes): one warm-up, then --runs timed calls; median, min, mean.
 * action_step runs as steps 1..9 of the pipeline's Euler loop do: its context kept from the
 * warm-up (not sent or scanned again, so not brought back into the caches by the scan either) */
/* bench --session's line (or JSON object): median, min, mean and p90 of the timed runs' ms (sorted
 * here), the weights, peak memory and the GEMM products per run */
static void print_session_bench(const opts *o, const ma_engine *e, double *ms, size_t weight_bytes) {
    ma_gemm_counts fl;
    ma_gemm_counts_get(&fl);
    const double gflop = (fl.fp32 + fl.bf16 + fl.int8 + fl.f16) / o->runs / 1e9;
    double mean = 0;
    for (int i = 0; i < o->runs; i++) mean += ms[i] / o->runs;
    const double median = ma_median(ms, (size_t)o->runs); /* sorts ms: ms[0] is the minimum */
    const double p90 = ma_percentile(ms, (size_t)o->runs, 90);
    long self_kb, workers_kb;
    ma_engine_peak_rss(e, &self_kb, &workers_kb);
    if (o->json)
        printf(
            "{\"session\": \"%s\", \"runs\": %d, \"threads\": %d, \"kernels\": \"%s\", \"cold\": %s, \"median_ms\": %.4f, \"min_ms\": %.4f, "
            "\"mean_ms\": %.4f, \"p90_ms\": %.4f, \"weight_bytes\": %zu, \"peak_rss_kib\": %ld, "
            "\"gemm_gflop\": {\"fp32\": %.4f, \"bf16\": %.4f, \"int8\": %.4f, \"f16\": %.4f}}\n",
            o->session, o->runs, ma_kernel_threads(), ma_gemm_kernels(), o->cold ? "true" : "false", median, ms[0], mean, p90, weight_bytes,
            self_kb, fl.fp32 / o->runs / 1e9, fl.bf16 / o->runs / 1e9, fl.int8 / o->runs / 1e9, fl.f16 / o->runs / 1e9);
    else
        printf(
            "%s: median %.3f ms, min %.3f ms, mean %.3f ms, p90 %.3f ms over %d runs (%d threads, %s kernels%s), weights %.1f MiB, "
            "peak RSS %.1f MiB; GEMM products %.2f GFLOP per run (fp32 %.2f, bf16 %.2f, int8 %.2f, f16 %.2f), %.1f GFLOP/s at the median\n",
            o->session, median, ms[0], mean, p90, o->runs, ma_kernel_threads(), ma_gemm_kernels(), o->cold ? ", cold caches" : "",
            weight_bytes / 1048576.0, self_kb / 1024.0, gflop, fl.fp32 / o->runs / 1e9, fl.bf16 / o->runs / 1e9, fl.int8 / o->runs / 1e9,
            fl.f16 / o->runs / 1e9, median > 0 ? gflop / (median / 1e3) : 0.0);
}

static int cmd_bench_session(opts *o) {
    ma_error err = {0};
    if (!o->model || !o->inputs) {
        fprintf(stderr, "molmoact: bench --session needs --model DIR and --inputs IO.npz\n");
        return 2;
    }
    int which = -1;
    for (int i = 0; i < 7; i++)
        if (!strcmp(o->session, MA_SESSION_NAMES[i])) which = i;
    if (which < 0) {
        fprintf(stderr, "molmoact: unknown session %s (vision, llm_split0..3, action_context, action_step)\n", o->session);
        return 2;
    }
    if (o->runs < 1) o->runs = 5;
    ma_npz z = {0};
    if (ma_npz_read(o->inputs, &z, &err)) return fail(&err);
    ma_engine e;
    if (ma_engine_open(o->model, o->norm_tag, 1, &SET, settings_backend(), NULL, &e, &err)) {
        ma_npz_free(&z);
        return fail(&err);
    }
    const ma_session *sess = e.runner->sess[which];
    ma_tensor in[MA_SESSION_MAX_IO], out[MA_SESSION_MAX_IO];
    int rc = 0;
    for (int i = 0; i < sess->n_in && !rc; i++) {
        const ma_tensor *t = ma_npz_get(&z, sess->in[i].name);
        if (!t) {
            fprintf(stderr, "molmoact: %s: no array %s (input of %s)\n", o->inputs, sess->in[i].name, o->session);
            rc = 2;
        } else in[i] = *t;
    }
    /* a golden's action_step_io.npz holds all ten steps (x [steps, rows, dim], t [steps]): the
     * first step's x and t are a view of it, as the pipeline's first Euler step sees them */
    for (int i = 0; i < sess->n_in && !rc && which == 6; i++) {
        const ma_tensor x = in[i];
        if (strcmp(sess->in[i].name, "x") || x.ndim != 3 || x.shape[0] < 1) continue;
        for (int k = 0; k < sess->n_in; k++)
            if (!strcmp(sess->in[k].name, "t") && in[k].ndim == 1 && in[k].shape[0] == x.shape[0]) {
                in[k].shape[0] = 1;
                in[k].nbytes = in[k].elem_size;
                in[i].ndim = 2;
                in[i].shape[0] = x.shape[1];
                in[i].shape[1] = x.shape[2];
                in[i].nbytes = (size_t)(x.shape[1] * x.shape[2]) * x.elem_size;
                fprintf(stderr, "molmoact: %s holds %lld steps of action_step: timing the first (x[0], t[0])\n", o->inputs,
                        (long long)x.shape[0]);
                break;
            }
    }
    const ma_mapfile *map;
    const size_t weight_bytes = session_weight_bytes(sess->model, which, &map);
    if (o->cold && !map) {
        fprintf(stderr, "molmoact: bench --cold needs a context directory (molmoact compile)\n");
        rc = 2;
    }
    if (o->cold && map && !ma_cache_flush(map->data, 0)) {
        fprintf(stderr, "molmoact: bench --cold: this CPU has no cache flush\n");
        rc = 2;
    }
    double *ms = calloc((size_t)o->runs, sizeof *ms);
    if (!ms) rc = 1;
    for (int i = 0; i <= o->runs && !rc; i++) {
        int n_out;
        double compute, transfer;
        if (o->cold) flush_weights(map->data, map->size);
        const unsigned kept = which == 6 && i > 0 ? MA_STEP_KEPT_INPUTS : 0u;
        if (e.runner->link.run(e.runner->link.ctx, which, 0, kept, in, sess->n_in, out, &n_out, &compute, &transfer, &err)) {
            rc = fail(&err);
            break;
        }
        for (int k = 0; k < n_out; k++) ma_tensor_free(&out[k]);
        if (i > 0) ms[i - 1] = compute;
        else ma_gemm_counts_reset(); /* the timed runs' products only */
    }
    if (!rc) print_session_bench(o, &e, ms, weight_bytes);
    free(ms);
    ma_npz_free(&z);
    ma_engine_close(&e);
    return rc;
}

/* the latency table on a synthetic LIBERO-like observation (or --inputs), after one warm-up */
static int cmd_bench(opts *o) {
    if (o->session) return cmd_bench_session(o);
    ma_error err = {0};
    ma_request_src src;
    if (request_setup(o, &src, 0) < 0) return 1; /* the demo model, but a synthetic observation */
    if (o->runs < 1) o->runs = 5;
    molmoact *api;
    const double t0 = ma_now_ms();
    if (api_open(o, &api)) return 1;
    const double t1 = ma_now_ms();
    ma_engine *ep = molmoact_internal_engine(api);
    /* opening: workers started, contexts mapped and checked (files already in the page cache
     * after the first run, so this is the cost beyond reading them) */
    const double open_ms = t1 - t0;
    ma_request q;
    ma_status s =
        src.inputs || src.image0 ? ma_request_load(&ep->host, &src, &q, &err) : ma_request_synthetic(&ep->host, o->seed, &q, &err);
    if (s) {
        api_close(&api);
        return fail(&err);
    }
    ma_latency lat;
    ma_latency_init(&lat);
    int rc = 0;
    for (int i = 0; i <= o->runs && !rc; i++) {
        ma_result res;
        ma_timing tm;
        if (api_run(api, &q, &res, &tm, NULL, &err)) {
            rc = fail(&err);
            break;
        }
        if (i > 0) ma_latency_add(&lat, &tm); /* run 0 warms caches and page mappings */
        ma_result_free(&res);
    }
    if (!rc) {
        if (o->json) {
            printf("{\"model\": ");
            ma_json_write_string(stdout, o->model, strlen(o->model));
            print_plan(ep, 1);
            printf(", \"prompt_tokens\": %lld, \"runs\": %d, \"latency\": ", (long long)q.obs.seq_len, o->runs);
            ma_latency_print_json(&lat, ep->inproc ? "inproc" : "resident", ep->host.cfg.flow_steps, stdout);
            print_memory(ep, 1);
            printf(", \"open_ms\": %.3f}\n", open_ms);
        } else {
            printf("bench: %s, prompt %lld tokens, %d runs after one warm-up\n", o->model, (long long)q.obs.seq_len, o->runs);
            print_plan(ep, 0);
            ma_latency_print(&lat, mode_name(ep), ep->host.cfg.flow_steps, stdout);
            print_memory(ep, 0);
            printf("open %.1f ms (sessions started, contexts mapped and checked)\n", open_ms);
        }
    }
    ma_request_free(&q);
    if (api_close(&api) && !rc) rc = 1;
    return rc;
}

int cmd_bench_a(cli_args *a) {
    opts o;
    if (opts_from(a, &o) || session_settings(a)) return 1;
    if (o.cold && !o.session) {
        fprintf(stderr, "molmoact bench: --cold times one session: give --session NAME\n");
        return 1;
    }
    return cmd_bench(&o);
}
