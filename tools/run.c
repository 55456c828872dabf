/* SPDX-License-Identifier: Apache-2.0 */
/* molmoact run: one observation through the sessions, its report and outputs; and --stream. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/util.h"
#include "commands.h"
#include "options.h"
#include "api/internal.h"
#include "io/jsonline.h"
#include "io/mapfile.h"
#include "io/npz.h"
#include "runtime/latency.h"
#include "runtime/parity.h"

static void print_actions_json(const ma_result *r) {
    printf("\"actions\": [");
    for (int k = 0; k < r->n_steps; k++) {
        printf("%s[", k ? ", " : "");
        for (int j = 0; j < r->action_dim; j++)
            printf("%s%.9g", j ? ", " : "", r->actions[k * r->action_dim + j]); /* round-trips a float */
        printf("]");
    }
    printf("]");
}

static void print_actions(const ma_result *r) {
    printf("action chunk [%d, %d]\n step", r->n_steps, r->action_dim);
    for (int j = 0; j < r->action_dim; j++) printf("  %9s%d", "a", j);
    printf("\n");
    for (int k = 0; k < r->n_steps; k++) {
        printf(" %4d", k);
        for (int j = 0; j < r->action_dim; j++) printf("  %10.5f", r->actions[k * r->action_dim + j]);
        printf("\n");
    }
}

static ma_status write_result(const char *path, const ma_result *res, ma_error *err) {
    ma_npz_writer w;
    ma_npz_writer_init(&w);
    int64_t as[2] = {res->n_steps, res->action_dim}, ts[2] = {res->horizon, res->max_action_dim};
    ma_status s = ma_npz_add_f32(&w, "actions", 2, as, res->actions, err);
    if (!s) s = ma_npz_add_f32(&w, "trajectory", 2, ts, res->trajectory, err);
    if (!s) s = ma_npz_write(&w, path, 0, err);
    ma_npz_writer_free(&w);
    return s;
}

/* the parity table through the engine's sessions; returns 0 pass, 2 fail, 1 error */
static int run_parity(ma_engine *e, const opts *o) {
    ma_error err = {0};
    ma_parity_report rep;
    int e2e, rc;
    double gate = ma_parity_default_gate(&e->host, &e2e);
    if (o->gate > 0) gate = o->gate;
    if (ma_parity_run_runner(e->runner, o->golden, gate, e2e, &rep, &err)) return fail(&err);
    if (o->json) {
        printf(", \"parity\": ");
        ma_parity_print(&rep, stdout, 1);
    } else {
        printf("\nparity against %s\n", o->golden);
        ma_parity_print(&rep, stdout, 0);
    }
    rc = rep.pass ? 0 : 2;
    ma_parity_free(&rep);
    return rc;
}

/* one line of at most cap - 1 bytes into buf, without its newline. Returns its length, -1 at end
 * of input, or -2 for a longer line (read to its end and dropped; buf keeps its first bytes). */
#define MA_STREAM_LINE_MAX (2 * PATH_MAX + 2)
static volatile sig_atomic_t g_stream_stop; /* SIGINT / SIGTERM during --stream */

static void on_stream_signal(int sig) { g_stream_stop = sig; }

static long read_line(FILE *f, char *buf, size_t cap) {
    size_t n = 0;
    int c, over = 0, any = 0;
    while (!g_stream_stop && (c = getc(f)) != EOF) {
        any = 1;
        if (c == '\n') break;
        if (n + 1 < cap) buf[n++] = (char)c;
        else over = 1;
    }
    buf[n] = '\0';
    if (!any) return -1;
    return over ? -2 : (long)n;
}

static void stream_error(long index, const char *input, size_t input_len, const char *msg) {
    printf("{\"index\": %ld, \"input\": ", index);
    ma_json_write_string(stdout, input, input_len);
    printf(", \"error\": ");
    ma_json_write_string(stdout, msg, strlen(msg));
    printf("}\n");
    fflush(stdout);
}

/* one observation of --stream: IN.npz (line) through the sessions, the result written to out_path
 * (NULL: none); its JSON line, or an error line. Returns 0, or 1 when it failed. */
static int stream_one(molmoact *api, const opts *o, long index, const char *line, const char *out_path) {
    ma_engine *e = molmoact_internal_engine(api);
    ma_request_src src;
    request_src_of(o, &src);
    src.inputs = line;
    src.image0 = src.image1 = NULL;
    ma_error err = {0};
    ma_request q;
    ma_result res;
    memset(&res, 0, sizeof res);
    ma_status s = out_path && !*out_path ? ma_fail(&err, MA_ERR_ARG, "empty output path after the tab") : MA_OK;
    ma_timing tm;
    if (!s) s = ma_request_load(&e->host, &src, &q, &err);
    if (!s) {
        s = api_run(api, &q, &res, &tm, NULL, &err);
        ma_request_free(&q);
    }
    if (!s && out_path) s = write_result(out_path, &res, &err);
    if (s) {
        stream_error(index, line, strlen(line), err.msg);
        ma_result_free(&res);
        return 1;
    }
    printf("{\"index\": %ld, \"input\": ", index);
    ma_json_write_string(stdout, line, strlen(line));
    const ma_timing *t = &tm;
    printf(", ");
    print_actions_json(&res);
    printf(", \"latency_ms\": {\"inference\": %.4f, \"transfer\": %.4f, \"host\": %.4f, \"total\": %.4f}",
           t->vision + t->llm[0] + t->llm[1] + t->llm[2] + t->llm[3] + t->action_context + t->action_step, t->transfer, t->host, t->total);
    printf("}\n");
    fflush(stdout);
    ma_result_free(&res);
    return 0;
}

/* --stream: one IN.npz path per line on stdin (optionally a tab and an OUT.npz path); one JSON
 * line per observation on stdout. A bad observation gets an error line; the stream goes on.
 * Lines are at most 2 x PATH_MAX bytes: a longer one is refused (its first 64 bytes echoed).
 * SIGINT or SIGTERM (to this process or its whole group: the workers ignore them) finishes the
 * observation in progress, writes its line, stops the workers and exits 128 + the signal. */
static int run_stream(molmoact *api, const opts *o) {
    static char line[MA_STREAM_LINE_MAX];
    long n;
    int failures = 0;
    long index = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stream_signal; /* no SA_RESTART: a read of stdin returns at once */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    while (!g_stream_stop && (n = read_line(stdin, line, sizeof line)) != -1) {
        if (n == -2) {
            char msg[128];
            snprintf(msg, sizeof msg, "line longer than %d bytes (IN.npz [TAB OUT.npz] expected)", MA_STREAM_LINE_MAX - 1);
            stream_error(index++, line, 64, msg);
            failures++;
            continue;
        }
        while (n > 0 && line[n - 1] == '\r') line[--n] = '\0';
        if (n == 0) continue;
        char *out_path = strchr(line, '\t');
        if (out_path) *out_path++ = '\0';
        if (out_path && strchr(out_path, '\t')) {
            out_path[-1] = '\t';
            stream_error(index++, line, strlen(line), "more than two tab-separated fields (IN.npz [TAB OUT.npz] expected)");
            failures++;
            continue;
        }
        failures += stream_one(api, o, index++, line, out_path);
    }
    if (g_stream_stop) return 128 + g_stream_stop;
    return failures ? 3 : 0;
}

/* --out and --dump are checked before anything runs, written together at the end, and committed
 * only when both are complete: a failing run leaves no new output */
static int check_outputs(const opts *o) {
    struct stat st;
    if (o->out && (!o->out[0] || (stat(o->out, &st) == 0 && S_ISDIR(st.st_mode)))) {
        fprintf(stderr, "molmoact: --out %s: %s\n", o->out, o->out[0] ? "is a directory" : "empty path");
        return 1;
    }
    if (o->dump && (!o->dump[0] || (stat(o->dump, &st) == 0 && !S_ISDIR(st.st_mode)))) {
        fprintf(stderr, "molmoact: --dump %s: %s\n", o->dump, o->dump[0] ? "exists and is not a directory" : "empty path");
        return 1;
    }
    return 0;
}

static ma_status render_result(const ma_result *res, uint8_t **buf, size_t *len, ma_error *err) {
    ma_npz_writer w;
    ma_npz_writer_init(&w);
    int64_t as[2] = {res->n_steps, res->action_dim}, ts[2] = {res->horizon, res->max_action_dim};
    ma_status s = ma_npz_add_f32(&w, "actions", 2, as, res->actions, err);
    if (!s) s = ma_npz_add_f32(&w, "trajectory", 2, ts, res->trajectory, err);
    if (!s) s = ma_npz_render(&w, 0, buf, len, err);
    ma_npz_writer_free(&w);
    return s;
}

static ma_status write_outputs(const opts *o, const ma_result *res, const ma_trace *trace, ma_error *err) {
    uint8_t *ob = NULL, *db = NULL;
    size_t ol = 0, dl = 0;
    ma_outfile of, df;
    int have_of = 0, have_df = 0, made_dir = 0;
    char *dpath = NULL;
    ma_status s = MA_OK;
    if (o->out) s = render_result(res, &ob, &ol, err);
    if (!s && o->dump) {
        ma_npz_writer w;
        ma_npz_writer_init(&w);
        for (size_t i = 0; i < trace->count && !s; i++) s = ma_npz_add(&w, trace->names[i], &trace->tensors[i], err);
        if (!s) s = ma_npz_render(&w, 1, &db, &dl, err);
        ma_npz_writer_free(&w);
    }
    if (!s && o->out && !(s = ma_out_open(&of, o->out, err))) {
        have_of = 1;
        ma_out_write(&of, ob, ol);
        s = ma_out_finish(&of, err);
        if (s) have_of = 0;
    }
    if (!s && o->dump) {
        if (!ma_is_dir(o->dump)) {
            if (mkdir(o->dump, 0777) != 0) s = ma_fail(err, MA_ERR_IO, "--dump %s: cannot create: %s", o->dump, strerror(errno));
            else made_dir = 1;
        }
        if (!s && !(dpath = ma_path_join(o->dump, "intermediates.npz"))) s = ma_fail(err, MA_ERR_NOMEM, "out of memory");
        if (!s && !(s = ma_out_open(&df, dpath, err))) {
            have_df = 1;
            ma_out_write(&df, db, dl);
            s = ma_out_finish(&df, err);
            if (s) have_df = 0;
        }
    }
    if (!s && have_df) {
        s = ma_out_commit(&df, err);
        have_df = 0;
    }
    if (!s && have_of) {
        s = ma_out_commit(&of, err);
        have_of = 0;
    }
    if (have_df) ma_out_abort(&df);
    if (have_of) ma_out_abort(&of);
    if (s && made_dir) rmdir(o->dump);
    free(dpath);
    free(ob);
    free(db);
    return s;
}

/* --dump: the request's preparation (the resized frames, the state's bins and normalised values)
 * beside the first run's intermediates */
static ma_status trace_add_prep(ma_trace *trace, const ma_engine *ep, const ma_request *q, ma_error *err) {
    int64_t rs[4] = {q->obs.n_images, ep->host.cfg.image_h, ep->host.cfg.image_w, 3}, bs[1] = {q->prep.prompt.state_dim};
    ma_tensor rt = ma_tensor_view(MA_DT_U8, 4, rs, q->prep.resized);
    int64_t bins[MA_NORM_MAX_DIM];
    for (int i = 0; i < q->prep.prompt.state_dim; i++) bins[i] = q->prep.prompt.state_bins[i];
    ma_tensor bt = ma_tensor_view(MA_DT_I64, 1, bs, bins);
    ma_status s = ma_trace_add(trace, "resized_u8", &rt, err);
    if (!s) s = ma_trace_add(trace, "state_bins", &bt, err);
    if (!s) s = ma_trace_add_f32(trace, "state_normalized", 1, bs, q->prep.prompt.state_norm, err);
    return s;
}

/* the action chunk, the latency table, what ran, peak memory, the open and the first request:
 * tables, or (--json) the object's opening "{" and these members (the caller adds the parity
 * and closes it) */
static void print_run_report(const opts *o, const ma_engine *ep, const ma_result *first, const ma_latency *lat, double open_ms,
                             double first_ms, double warm_sum) {
    if (o->json) {
        printf("{");
        print_actions_json(first);
    } else print_actions(first);
    if (o->json) {
        printf(", \"latency\": ");
        ma_latency_print_json(lat, ep->inproc ? "inproc" : "resident", ep->host.cfg.flow_steps, stdout);
    } else {
        printf("\n");
        char mode[96];
        if (o->runs > 1) snprintf(mode, sizeof mode, "%s; the warm runs 2-%d, the first on its own below", mode_name(ep), o->runs);
        else snprintf(mode, sizeof mode, "%s", mode_name(ep));
        ma_latency_print(lat, mode, ep->host.cfg.flow_steps, stdout);
    }
    print_plan(ep, o->json);
    print_memory(ep, o->json);
    /* the open (sessions started, contexts mapped; with --preload also read in) and the first
     * request after it, which pays the page faults --preload moves into the open */
    if (o->json) {
        printf(", \"open_ms\": %.3f, \"first_request_ms\": %.3f", open_ms, first_ms);
        if (o->runs > 1) printf(", \"warm_total_ms\": %.3f", warm_sum / (o->runs - 1));
    } else {
        printf("open %.1f ms, first request %.1f ms%s", open_ms, first_ms, SET.preload ? " (--preload)" : "");
        if (o->runs > 1) printf(", warm (runs 2-%d) %.1f ms", o->runs, warm_sum / (o->runs - 1));
        printf("\n");
    }
}

static int cmd_run(opts *o) {
    ma_error err = {0};
    ma_request_src src;
    if (check_outputs(o)) return 1;
    const int demo = request_setup(o, &src, 1);
    if (demo < 0) return 1;
    if (demo && !o->json && !o->stream) printf("demo: model %s\n", o->model);
    if (o->runs < 1) o->runs = 1;
    molmoact *api;
    const double t_open0 = ma_now_ms();
    if (api_open(o, &api)) return 1;
    const double open_ms = ma_now_ms() - t_open0;
    double first_ms = 0.0, warm_sum = 0.0; /* warm: the runs after the first */
    if (o->stream) {
        int rc = run_stream(api, o);
        if (api_close(&api) && !rc) rc = 1;
        return rc;
    }
    ma_engine *ep = molmoact_internal_engine(api);
    int rc = 1;
    ma_request q;
    ma_result res, first;
    memset(&res, 0, sizeof res);
    memset(&first, 0, sizeof first);
    ma_trace trace;
    ma_trace_init(&trace);
    ma_latency lat;
    ma_latency_init(&lat);
    if (ma_request_load(&ep->host, &src, &q, &err)) {
        fail(&err);
        goto out;
    }
    /* N runs of the same observation on the resident sessions; all must give the same chunk */
    for (int i = 0; i < o->runs; i++) {
        ma_result_free(&res);
        ma_timing tm;
        if (api_run(api, &q, &res, &tm, o->dump && i == 0 ? &trace : NULL, &err)) {
            fail(&err);
            goto out;
        }
        if (i > 0 || o->runs == 1) ma_latency_add(&lat, &tm); /* the table: the warm runs (2..N), or the only one */
        if (i == 0) {
            first_ms = tm.total;
            first = res;
            memset(&res, 0, sizeof res);
            continue;
        }
        warm_sum += tm.total;
        if (memcmp(first.actions, res.actions, sizeof(float) * (size_t)res.n_steps * res.action_dim) != 0) {
            fprintf(stderr, "molmoact: run %d gave a different action chunk than run 1 (the pipeline is not deterministic)\n", i + 1);
            goto out;
        }
    }
    if (o->dump && q.prep.resized && trace_add_prep(&trace, ep, &q, &err)) {
        fail(&err);
        goto out;
    }
    if ((o->out || o->dump) && write_outputs(o, &first, &trace, &err)) {
        fail(&err);
        goto out;
    }
    print_run_report(o, ep, &first, &lat, open_ms, first_ms, warm_sum);
    rc = o->golden ? run_parity(ep, o) : 0;
    if (o->json) printf("}\n");
out:
    ma_request_free(&q);
    ma_result_free(&res);
    ma_result_free(&first);
    ma_trace_free(&trace);
    if (api_close(&api) && !rc) rc = 1; /* a worker that did not shut down cleanly fails the run */
    return rc;
}

int cmd_run_a(cli_args *a) {
    opts o;
    if (opts_from(a, &o) || session_settings(a)) return 1;
    return cmd_run(&o);
}
