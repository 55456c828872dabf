/* SPDX-License-Identifier: Apache-2.0 */
/* molmoact: MolmoAct2-LIBERO inference from the command line.
 *
 * Commands: run (resident sessions, or --inproc), bench, parity, compile, inspect, tokenize,
 * prompt, preprocess; `usage()` lists their options. `__worker` is the resident worker process.
 */
#define _POSIX_C_SOURCE 200809L
#include <sys/types.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "io/gguf.h"
#include "io/jsonline.h"
#include "io/mapfile.h"
#include "io/npz.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "model/tokenizer.h"
#include "runtime/parity.h"
#include "runtime/compile.h"
#include "runtime/observation.h"
#include "runtime/pipeline.h"
#include "runtime/engine.h"
#include "runtime/latency.h"
#include "runtime/request.h"
#include "api/internal.h"
#include "model/lerobot.h"
#include "server/server.h"
#include "kernels/cpu.h"
#include "kernels/gemm.h"
#include "kernels/kernels.h"
#include "kernels/threads.h"

#ifndef MA_SOURCE_DIR
#define MA_SOURCE_DIR "."
#endif

static void usage(FILE *f) {
    fprintf(f,
            "usage: molmoact <command> [options]\n"
            "  run      --model DIR (--inputs IN.npz | --image0 A.png --image1 B.png --state s0,..,s7 --task TEXT)\n"
            "           [--out OUT.npz] [--dump DIR] [--seed N | --noise FILE] [--golden DIR] [--runs N] [--json]\n"
            "           [--inproc] [--stream]   (--stream: IN.npz paths on stdin, one JSON result per line)\n"
            "           (no --model: the demo model and golden in assets/tiny-grid; --golden without an\n"
            "           observation: the golden's own)\n"
            "  bench    [--model DIR] [--runs N] [--inputs IN.npz] [--inproc] [--json]\n"
            "  bench    --model DIR --session NAME --inputs IO.npz [--runs N] [--cold] [--json]   (one session, in process;\n"
            "           --cold: its weights flushed from the caches before each run)\n"
            "  parity   --model DIR --golden DIR [--gate G] [--json]\n"
            "  compile  HF_DIR -o CTX_DIR [--vision P] [--llm P] [--action P] [--suffix S] [--prompt-seq N]\n"
            "           [--keep PATTERN=P ...]   (P: f16 (default), bf16, q8_0, q4_0; --keep: matrices whose name matches\n"
            "           the glob PATTERN stored in P where it is more precise, e.g. --keep '*scout_mlp*=f16')\n"
            "  inspect  FILE.safetensors | FILE.npz | FILE.gguf | CHECKPOINT_DIR\n"
            "  tokenize --tokenizer tokenizer.json [--decode]   (stdin: one JSON string / id array per line)\n"
            "  prompt   --model DIR   (stdin: {\"task\": ..., \"state\": [...]} per line -> prompt ids)\n"
            "  preprocess --model DIR --image0 FILE [-o OUT.npz]   (pixels and the resized image)\n"
            "  serve    --model DIR [--host 127.0.0.1] [--port 8000] [--api-key-file F] [--max-message-mb 32]\n"
            "           [--max-clients 512] [--recv-timeout-s 30] [--idle-timeout-s 300] [--seed N] [--flip180] [--inproc] [--threads N]\n"
            "           (openpi websocket + HTTP POST /act on one port; GET / status page, /healthz)\n"
            "options: --norm-tag TAG (default libero), --threads N (GEMM threads per process)\n"
            "backend (run, bench, parity, serve): --backend cpu|qnn (default cpu); with qnn: [--qnn-lib-dir DIR]\n"
            "           [--qnn-io-map MAP.json] [--qnn-soc 77] [--qnn-arch 73]; DIR/ctx/<session>_socid77_archv73.bin\n"
            "           --preload: read every context into memory at open and run one warm-up request (blank\n"
            "           frames), so the first real request pays neither page faults nor first-touch costs\n"
            "DIR: a Hugging Face checkpoint directory or a context directory from `molmoact compile`\n");
}

typedef struct {
    const char *model, *golden, *inputs, *out, *dump, *norm_tag, *image0, *image1, *task, *state, *noise, *session;
    uint64_t seed;
    int have_seed, json, runs, stream, inproc, threads, cold;
    double gate;
} opts;

/* every option once; contradictions refused (--seed with --noise, --inputs with raw-frame
 * options or --stream) rather than one silently winning */
static int parse_opts(int argc, char **argv, int first, opts *o) {
    static const char *names[] = {"--model", "-o", "--golden", "--inputs", "--out", "--dump", "--norm-tag", "--image0",
                                  "--image1", "--task", "--state", "--noise", "--session", "--json", "--stream", "--inproc",
                                  "--cold", "--runs", "--threads", "--seed", "--gate", NULL};
    unsigned long seen = 0;
    memset(o, 0, sizeof *o);
    o->gate = 0;
    o->norm_tag = "libero";
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        for (int k = 0; names[k]; k++)
            if (!strcmp(a, names[k])) {
                /* -o and --out are one option */
                const int id = !strcmp(a, "-o") ? 4 : k;
                if (seen & (1ul << id)) { fprintf(stderr, "molmoact: %s is given twice\n", a); return -1; }
                seen |= 1ul << id;
            }
#define TAKE(field) do { if (!v) { fprintf(stderr, "molmoact: %s needs a value\n", a); return -1; } o->field = v; i++; } while (0)
        if (!strcmp(a, "--model")) TAKE(model);
        else if (!strcmp(a, "-o")) TAKE(out);
        else if (!strcmp(a, "--golden")) TAKE(golden);
        else if (!strcmp(a, "--inputs")) TAKE(inputs);
        else if (!strcmp(a, "--out")) TAKE(out);
        else if (!strcmp(a, "--dump")) TAKE(dump);
        else if (!strcmp(a, "--norm-tag")) TAKE(norm_tag);
        else if (!strcmp(a, "--image0")) TAKE(image0);
        else if (!strcmp(a, "--image1")) TAKE(image1);
        else if (!strcmp(a, "--task")) TAKE(task);
        else if (!strcmp(a, "--state")) TAKE(state);
        else if (!strcmp(a, "--noise")) TAKE(noise);
        else if (!strcmp(a, "--session")) TAKE(session);
        else if (!strcmp(a, "--json")) o->json = 1;
        else if (!strcmp(a, "--stream")) o->stream = 1;
        else if (!strcmp(a, "--inproc")) o->inproc = 1;
        else if (!strcmp(a, "--cold")) o->cold = 1;
        else if (!strcmp(a, "--runs") || !strcmp(a, "--threads")) {
            char *end;
            errno = 0;
            long n = v ? strtol(v, &end, 10) : 0;
            const long max = !strcmp(a, "--runs") ? 1000000 : 64;
            if (!v || !*v || *end || errno || n < 1 || n > max) {
                fprintf(stderr, "molmoact: %s needs an integer in [1, %ld]\n", a, max);
                return -1;
            }
            if (!strcmp(a, "--runs")) o->runs = (int)n;
            else o->threads = (int)n;
            i++;
        }
        else if (!strcmp(a, "--seed") || !strcmp(a, "--gate")) {
            if (!v) { fprintf(stderr, "molmoact: %s needs a value\n", a); return -1; }
            char *end;
            errno = 0;
            if (!strcmp(a, "--seed")) {
                unsigned long long s = strtoull(v, &end, 10);
                if (errno || !*v || *end || v[0] == '-' || v[0] == '+') { fprintf(stderr, "molmoact: --seed %s is not a non-negative integer\n", v); return -1; }
                o->seed = s;
                o->have_seed = 1;
            } else {
                o->gate = strtod(v, &end);
                if (errno || *end || !(o->gate > 0 && o->gate <= 1)) { fprintf(stderr, "molmoact: --gate %s must be in (0, 1]\n", v); return -1; }
            }
            i++;
        } else { fprintf(stderr, "molmoact: unknown option %s\n", a); return -1; }
#undef TAKE
    }
    if (o->have_seed && o->noise) { fprintf(stderr, "molmoact: --seed and --noise contradict each other (give one)\n"); return -1; }
    if (o->inputs && (o->image0 || o->image1 || o->task || o->state)) {
        fprintf(stderr, "molmoact: --inputs and --image0/--image1/--task/--state contradict each other (give one observation)\n");
        return -1;
    }
    if (o->stream && (o->inputs || o->image0 || o->image1 || o->task || o->state || o->out || o->dump || o->golden)) {
        fprintf(stderr, "molmoact: --stream reads its observations and output paths from stdin: it takes no --inputs, "
                        "--image0/--image1/--task/--state, --out, --dump or --golden\n");
        return -1;
    }
    return 0;
}

static int fail(const ma_error *e) {
    fprintf(stderr, "molmoact: %s\n", e->msg);
    return 1;
}


/* ---------------------------------------------------------------------------------- run */

static void print_actions_json(const ma_result *r) {
    printf("\"actions\": [");
    for (int k = 0; k < r->n_steps; k++) {
        printf("%s[", k ? ", " : "");
        for (int j = 0; j < r->action_dim; j++) printf("%s%.9g", j ? ", " : "", r->actions[k * r->action_dim + j]); /* round-trips a float */
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

static void request_src_of(const opts *o, ma_request_src *src) {
    memset(src, 0, sizeof *src);
    src->inputs = o->inputs;
    src->image0 = o->image0;
    src->image1 = o->image1;
    src->task = o->task;
    src->state_csv = o->state;
    src->noise_path = o->noise;
    src->have_seed = o->have_seed;
    src->seed = o->seed;
}

/* the request source of the command line; without --model, the demo: the shipped tiny model,
 * its golden and (with golden_observation, when no observation is given) the golden's inputs.
 * Returns 1 when the demo is used. */
static int request_setup(opts *o, ma_request_src *src, int golden_observation) {
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
    snprintf(model, sizeof model, "%s/assets/tiny-grid/model", MA_SOURCE_DIR);
    snprintf(golden, sizeof golden, "%s/assets/tiny-grid/golden", MA_SOURCE_DIR);
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

static const char *mode_name(const ma_engine *e) { return e->inproc ? "inproc" : "resident, 6 worker processes"; }

static void print_memory(const ma_engine *e, int json) {
    long self_kb, workers_kb;
    ma_engine_peak_rss(e, &self_kb, &workers_kb);
    if (json) printf(", \"peak_rss_kb\": {\"orchestrator\": %ld, \"workers\": %ld}", self_kb, workers_kb);
    else if (e->inproc) printf("peak RSS %.1f MiB\n", self_kb / 1024.0);
    else printf("peak RSS %.1f MiB orchestrator + %.1f MiB workers\n", self_kb / 1024.0, workers_kb / 1024.0);
}

/* the parity table through the engine's sessions; returns 0 pass, 2 fail, 1 error */
static int run_parity(ma_engine *e, const opts *o) {
    ma_error err = {0};
    ma_parity_report rep;
    int e2e, rc;
    double gate = ma_parity_default_gate(&e->host, &e2e);
    if (o->gate > 0) gate = o->gate;
    if (ma_parity_run_runner(e->runner, o->golden, gate, e2e, &rep, &err)) return fail(&err);
    if (o->json) { printf(", \"parity\": "); ma_parity_print(&rep, stdout, 1); }
    else { printf("\nparity against %s\n", o->golden); ma_parity_print(&rep, stdout, 0); }
    rc = rep.pass ? 0 : 2;
    ma_parity_free(&rep);
    return rc;
}

/* ------------------------------------------------------------------ inference through the API */

/* run, bench and the stream infer through the public API (include/molmoact.h), linked
 * statically; the engine behind a handle serves the parity table and the memory report */
static int api_open(const opts *o, molmoact **out) {
    molmoact_options opt;
    molmoact_options_init(&opt);
    opt.model_dir = o->model;
    opt.inproc = o->inproc;
    opt.norm_tag = o->norm_tag;
    opt.worker_exe = "/proc/self/exe"; /* this program, whatever its name */
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
}

static ma_timing timing_of(const molmoact_timing *t) {
    ma_timing r = {t->vision, {t->llm_split[0], t->llm_split[1], t->llm_split[2], t->llm_split[3]}, t->action_context,
                   t->action_step, t->transfer, t->host, t->total};
    return r;
}

/* one inference through the API (with a trace: the internal run that also records it) */
static ma_status api_run(molmoact *api, const ma_request *q, ma_result *out, ma_timing *t, ma_trace *trace, ma_error *err) {
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

static int api_close(molmoact **api) { return molmoact_close(api) != MOLMOACT_OK; }

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

/* --stream: one IN.npz path per line on stdin (optionally a tab and an OUT.npz path); one JSON
 * line per observation on stdout. A bad observation gets an error line; the stream goes on.
 * Lines are at most 2 x PATH_MAX bytes: a longer one is refused (its first 64 bytes echoed).
 * SIGINT or SIGTERM (to this process or its whole group: the workers ignore them) finishes the
 * observation in progress, writes its line, stops the workers and exits 128 + the signal. */
static int run_stream(molmoact *api, const opts *o) {
    ma_engine *e = molmoact_internal_engine(api);
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
            stream_error(index++, line, strlen(line), err.msg);
            failures++;
            ma_result_free(&res);
            continue;
        }
        printf("{\"index\": %ld, \"input\": ", index++);
        ma_json_write_string(stdout, line, strlen(line));
        const ma_timing *t = &tm;
        printf(", ");
        print_actions_json(&res);
        printf(", \"latency_ms\": {\"inference\": %.4f, \"transfer\": %.4f, \"host\": %.4f, \"total\": %.4f}",
               t->vision + t->llm[0] + t->llm[1] + t->llm[2] + t->llm[3] + t->action_context + t->action_step,
               t->transfer, t->host, t->total);
        printf("}\n");
        fflush(stdout);
        ma_result_free(&res);
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
    if (!s && have_df) { s = ma_out_commit(&df, err); have_df = 0; }
    if (!s && have_of) { s = ma_out_commit(&of, err); have_of = 0; }
    if (have_df) ma_out_abort(&df);
    if (have_of) ma_out_abort(&of);
    if (s && made_dir) rmdir(o->dump);
    free(dpath);
    free(ob);
    free(db);
    return s;
}

static int cmd_run(opts *o) {
    ma_error err = {0};
    ma_request_src src;
    if (check_outputs(o)) return 1;
    if (request_setup(o, &src, 1) && !o->json && !o->stream) printf("demo: model %s\n", o->model);
    if (o->runs < 1) o->runs = 5;
    molmoact *api;
    struct timespec t_open0, t_open1;
    clock_gettime(CLOCK_MONOTONIC, &t_open0);
    if (api_open(o, &api)) return 1;
    clock_gettime(CLOCK_MONOTONIC, &t_open1);
    const double open_ms = (t_open1.tv_sec - t_open0.tv_sec) * 1e3 + (t_open1.tv_nsec - t_open0.tv_nsec) / 1e6;
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
    if (ma_request_load(&ep->host, &src, &q, &err)) { fail(&err); goto out; }
    /* N runs of the same observation on the resident sessions; all must give the same chunk */
    for (int i = 0; i < o->runs; i++) {
        ma_result_free(&res);
        ma_timing tm;
        if (api_run(api, &q, &res, &tm, o->dump && i == 0 ? &trace : NULL, &err)) { fail(&err); goto out; }
        ma_latency_add(&lat, &tm);
        if (i == 0) { first_ms = tm.total; first = res; memset(&res, 0, sizeof res); continue; }
        warm_sum += tm.total;
        if (memcmp(first.actions, res.actions, sizeof(float) * (size_t)res.n_steps * res.action_dim) != 0) {
            fprintf(stderr, "molmoact: run %d gave a different action chunk than run 1 (the pipeline is not deterministic)\n", i + 1);
            goto out;
        }
    }
    if (o->dump && q.prep.resized) {
        int64_t rs[4] = {q.obs.n_images, ep->host.cfg.image_h, ep->host.cfg.image_w, 3}, bs[1] = {q.prep.prompt.state_dim};
        ma_tensor rt = ma_tensor_view(MA_DT_U8, 4, rs, q.prep.resized);
        int64_t bins[MA_NORM_MAX_DIM];
        for (int i = 0; i < q.prep.prompt.state_dim; i++) bins[i] = q.prep.prompt.state_bins[i];
        ma_tensor bt = ma_tensor_view(MA_DT_I64, 1, bs, bins);
        if (ma_trace_add(&trace, "resized_u8", &rt, &err) || ma_trace_add(&trace, "state_bins", &bt, &err) ||
            ma_trace_add_f32(&trace, "state_normalized", 1, bs, q.prep.prompt.state_norm, &err)) { fail(&err); goto out; }
    }
    if ((o->out || o->dump) && write_outputs(o, &first, &trace, &err)) { fail(&err); goto out; }
    if (o->json) { printf("{"); print_actions_json(&first); }
    else print_actions(&first);
    if (o->json) { printf(", \"latency\": "); ma_latency_print_json(&lat, ep->inproc ? "inproc" : "resident", ep->host.cfg.flow_steps, stdout); }
    else { printf("\n"); ma_latency_print(&lat, mode_name(ep), ep->host.cfg.flow_steps, stdout); }
    print_memory(ep, o->json);
    /* the open (sessions started, contexts mapped; with --preload also read in) and the first
     * request after it, which pays the page faults --preload moves into the open */
    if (o->json) {
        printf(", \"open_ms\": %.3f, \"first_request_ms\": %.3f", open_ms, first_ms);
        if (o->runs > 1) printf(", \"warm_total_ms\": %.3f", warm_sum / (o->runs - 1));
    } else {
        printf("open %.1f ms, first request %.1f ms%s", open_ms, first_ms, getenv("MOLMOACT_PRELOAD") ? " (--preload)" : "");
        if (o->runs > 1) printf(", warm (runs 2-%d) %.1f ms", o->runs, warm_sum / (o->runs - 1));
        printf("\n");
    }
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

/* ---------------------------------------------------------------------------------- bench */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

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
typedef struct { const char *p; unsigned long n; } flush_job;

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
static int cmd_bench_session(opts *o) {
    ma_error err = {0};
    if (!o->model || !o->inputs) { fprintf(stderr, "molmoact: bench --session needs --model DIR and --inputs IO.npz\n"); return 2; }
    int which = -1;
    for (int i = 0; i < 7; i++)
        if (!strcmp(o->session, MA_SESSION_NAMES[i])) which = i;
    if (which < 0) { fprintf(stderr, "molmoact: unknown session %s (vision, llm_split0..3, action_context, action_step)\n", o->session); return 2; }
    if (o->runs < 1) o->runs = 5;
    ma_npz z = {0};
    if (ma_npz_read(o->inputs, &z, &err)) return fail(&err);
    ma_engine e;
    if (ma_engine_open(o->model, o->norm_tag, 1, NULL, &e, &err)) { ma_npz_free(&z); return fail(&err); }
    const ma_session *sess = e.runner->sess[which];
    ma_tensor in[MA_SESSION_MAX_IO], out[MA_SESSION_MAX_IO];
    int rc = 0;
    for (int i = 0; i < sess->n_in && !rc; i++) {
        const ma_tensor *t = ma_npz_get(&z, sess->in[i].name);
        if (!t) { fprintf(stderr, "molmoact: %s: no array %s (input of %s)\n", o->inputs, sess->in[i].name, o->session); rc = 2; }
        else in[i] = *t;
    }
    const ma_mapfile *map;
    const size_t weight_bytes = session_weight_bytes(sess->model, which, &map);
    if (o->cold && !map) { fprintf(stderr, "molmoact: bench --cold needs a context directory (molmoact compile)\n"); rc = 2; }
    if (o->cold && map && !ma_cache_flush(map->data, 0)) { fprintf(stderr, "molmoact: bench --cold: this CPU has no cache flush\n"); rc = 2; }
    double *ms = calloc((size_t)o->runs, sizeof *ms);
    if (!ms) rc = 1;
    for (int i = 0; i <= o->runs && !rc; i++) {
        int n_out;
        double compute, transfer;
        if (o->cold) flush_weights(map->data, map->size);
        const unsigned kept = which == 6 && i > 0 ? MA_STEP_KEPT_INPUTS : 0u;
        if (e.runner->link.run(e.runner->link.ctx, which, 0, kept, in, sess->n_in, out, &n_out, &compute, &transfer, &err)) { rc = fail(&err); break; }
        for (int k = 0; k < n_out; k++) ma_tensor_free(&out[k]);
        if (i > 0) ms[i - 1] = compute;
    }
    if (!rc) {
        double mean = 0;
        for (int i = 0; i < o->runs; i++) mean += ms[i] / o->runs;
        qsort(ms, (size_t)o->runs, sizeof *ms, cmp_double);
        double median = o->runs % 2 ? ms[o->runs / 2] : 0.5 * (ms[o->runs / 2 - 1] + ms[o->runs / 2]);
        long self_kb, workers_kb;
        ma_engine_peak_rss(&e, &self_kb, &workers_kb);
        if (o->json)
            printf("{\"session\": \"%s\", \"runs\": %d, \"threads\": %d, \"cold\": %s, \"median_ms\": %.4f, \"min_ms\": %.4f, "
                   "\"mean_ms\": %.4f, \"weight_bytes\": %zu, \"peak_rss_kib\": %ld}\n", o->session, o->runs, ma_kernel_threads(),
                   o->cold ? "true" : "false", median, ms[0], mean, weight_bytes, self_kb);
        else
            printf("%s: median %.3f ms, min %.3f ms, mean %.3f ms over %d runs (%d threads, %s kernels%s), weights %.1f MiB, "
                   "peak RSS %.1f MiB\n", o->session, median, ms[0], mean, o->runs, ma_kernel_threads(), ma_gemm_kernels(),
                   o->cold ? ", cold caches" : "", weight_bytes / 1048576.0, self_kb / 1024.0);
    }
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
    request_setup(o, &src, 0); /* the demo model, but a synthetic observation */
    if (o->runs < 1) o->runs = 5;
    molmoact *api;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (api_open(o, &api)) return 1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ma_engine *ep = molmoact_internal_engine(api);
    /* opening: workers started, contexts mapped and checked (files already in the page cache
     * after the first run, so this is the cost beyond reading them) */
    const double open_ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    ma_request q;
    ma_status s = src.inputs || src.image0 ? ma_request_load(&ep->host, &src, &q, &err) : ma_request_synthetic(&ep->host, o->seed, &q, &err);
    if (s) { api_close(&api); return fail(&err); }
    ma_latency lat;
    ma_latency_init(&lat);
    int rc = 0;
    for (int i = 0; i <= o->runs && !rc; i++) {
        ma_result res;
        ma_timing tm;
        if (api_run(api, &q, &res, &tm, NULL, &err)) { rc = fail(&err); break; }
        if (i > 0) ma_latency_add(&lat, &tm); /* run 0 warms caches and page mappings */
        ma_result_free(&res);
    }
    if (!rc) {
        const char *prec[3] = {ep->host.precision[0][0] ? ep->host.precision[0] : "checkpoint",
                               ep->host.precision[1][0] ? ep->host.precision[1] : "checkpoint",
                               ep->host.precision[2][0] ? ep->host.precision[2] : "checkpoint"};
        if (o->json) {
            printf("{\"model\": ");
            ma_json_write_string(stdout, o->model, strlen(o->model));
            printf(", \"precision\": {\"vision\": \"%s\", \"llm\": \"%s\", \"action\": \"%s\"}, \"prompt_tokens\": %lld, \"latency\": ",
                   prec[0], prec[1], prec[2], (long long)q.obs.seq_len);
            ma_latency_print_json(&lat, ep->inproc ? "inproc" : "resident", ep->host.cfg.flow_steps, stdout);
            print_memory(ep, 1);
            printf(", \"open_ms\": %.3f}\n", open_ms);
        } else {
            printf("bench: %s (vision %s, llm %s, action %s), prompt %lld tokens, %d threads\n", o->model, prec[0], prec[1],
                   prec[2], (long long)q.obs.seq_len, ma_kernel_threads());
            ma_latency_print(&lat, mode_name(ep), ep->host.cfg.flow_steps, stdout);
            print_memory(ep, 0);
            printf("open %.1f ms (sessions started, contexts mapped and checked)\n", open_ms);
        }
    }
    ma_request_free(&q);
    if (api_close(&api) && !rc) rc = 1;
    return rc;
}

/* ---------------------------------------------------------------------------------- parity */

static int cmd_parity(opts *o) {
    if (!o->model || !o->golden) { fprintf(stderr, "molmoact: parity needs --model DIR and --golden DIR\n"); return 1; }
    ma_error err = {0};
    ma_model m;
    if (ma_model_open(o->model, o->norm_tag, &m, &err)) return fail(&err);
    ma_parity_report rep;
    int rc, e2e;
    double gate = ma_parity_default_gate(&m, &e2e);
    if (o->gate > 0) gate = o->gate;
    if ((e2e ? ma_parity_run_e2e : ma_parity_run)(&m, o->golden, gate, &rep, &err)) rc = fail(&err);
    else {
        ma_parity_print(&rep, stdout, o->json);
        rc = rep.pass ? 0 : 2;
    }
    ma_parity_free(&rep);
    ma_model_close(&m);
    return rc;
}

/* ---------------------------------------------------------------------------------- inspect */

static void print_shape(int nd, const int64_t *sh) {
    printf("[");
    for (int i = 0; i < nd; i++) printf(i ? ", %lld" : "%lld", (long long)sh[i]);
    printf("]");
}

static int cmd_inspect(int argc, char **argv) {
    if (argc < 3) { usage(stderr); return 1; }
    const char *path = argv[2];
    ma_error err = {0};
    if (ma_is_dir(path)) {
        /* what the directory is, and what of its config this runtime ignores */
        ma_config cfg;
        char *cj = NULL;
        if (ma_is_lerobot_dir(path)) {
            ma_lerobot *lr = calloc(1, sizeof *lr);
            if (!lr) return 1;
            if (ma_lerobot_open(path, getenv("MOLMOACT_BASE_DIR"), lr, &err)) { free(lr); return fail(&err); }
            printf("%s: a LeRobot MolmoAct2 policy; base %s (from %s; checkpoint_path %s)\n", path, lr->base_dir, lr->base_from, lr->repo_id);
            printf("  action_mode %s (the expert attends to %s), chunk_size %d, n_action_steps %d, %s%s\n", lr->action_mode,
                   lr->full_encoder_mask ? "every prompt token" : "the prompt less EOS and action spans", lr->chunk_size, lr->n_action_steps,
                   lr->lora ? "LoRA (compile merges it)" : "full fine-tune or frozen VLM", "");
            printf("  statistics: state %d, action %d values (LeRobot's arithmetic, eps %g)\n", lr->ns.has_state ? lr->ns.state.dim : 0,
                   lr->ns.action.dim, (double)lr->ns.eps);
            if (!ma_lerobot_config_json(lr, &cj, &err) && !ma_config_parse(cj, lr->base_dir, &cfg, NULL) && cfg.unknown[0])
                printf("  config fields this runtime ignores: %s\n", cfg.unknown);
            free(cj);
            free(lr);
        } else {
            char *cp = ma_path_join(path, "config.json");
            if (cp && ma_is_file(cp) && !ma_config_load(cp, &cfg, NULL) && cfg.unknown[0]) printf("%s/config.json: fields this runtime ignores: %s\n", path, cfg.unknown);
            free(cp);
        }
        ma_safetensors st;
        if (ma_st_open(&st, path, &err)) return fail(&err);
        printf("%s: %zu tensors in %d file(s)\n", path, st.count, st.nfiles);
        size_t total = 0;
        for (size_t i = 0; i < st.count; i++) {
            printf("  %-72s %-5s ", st.tensors[i].name, ma_dtype_name(st.tensors[i].dtype));
            print_shape(st.tensors[i].ndim, st.tensors[i].shape);
            printf("\n");
            total += st.tensors[i].nbytes;
        }
        printf("total %.1f MiB\n", total / 1048576.0);
        ma_st_close(&st);
        return 0;
    }
    ma_mapfile mf;
    if (ma_map_file(&mf, path, &err)) return fail(&err);
    int rc = 0;
    if (mf.size >= 4 && !memcmp(mf.data, "GGUF", 4)) {
        ma_unmap_file(&mf);
        ma_gguf g;
        if (ma_gguf_open(&g, path, &err)) return fail(&err);
        printf("%s: GGUF v%u, %zu metadata keys, %zu tensors, alignment %zu\n", path, g.version, g.n_kv, g.n_tensors, g.alignment);
        for (size_t i = 0; i < g.n_kv; i++) {
            const ma_gguf_kv *kv = &g.kv[i];
            printf("  %-48s ", kv->key);
            switch (kv->type) {
            case MA_GGUF_STRING: printf("\"%.*s\"\n", (int)(kv->v.s.len > 200 ? 200 : kv->v.s.len), kv->v.s.p); break;
            case MA_GGUF_F32: case MA_GGUF_F64: printf("%g\n", kv->v.f); break;
            case MA_GGUF_BOOL: printf("%s\n", kv->v.b ? "true" : "false"); break;
            case MA_GGUF_I8: case MA_GGUF_I16: case MA_GGUF_I32: case MA_GGUF_I64: printf("%lld\n", (long long)kv->v.i); break;
            case MA_GGUF_ARRAY: printf("array of %llu (type %u)\n", (unsigned long long)kv->arr_count, kv->arr_type); break;
            default: printf("%llu\n", (unsigned long long)kv->v.u); break;
            }
        }
        for (size_t i = 0; i < g.n_tensors; i++) {
            const ma_gguf_tensor *t = &g.tensors[i];
            int64_t sh[4];
            for (uint32_t d = 0; d < t->n_dims; d++) sh[d] = t->ne[t->n_dims - 1 - d];
            printf("  %-60s %-5s ", t->name, ma_dtype_name(t->dtype));
            print_shape((int)t->n_dims, sh);
            printf(" @%llu\n", (unsigned long long)t->offset);
        }
        ma_gguf_close(&g);
    } else if (mf.size >= 2 && mf.data[0] == 'P' && mf.data[1] == 'K') {
        ma_npz z;
        if (ma_npz_parse(mf.data, mf.size, path, &z, &err)) { ma_unmap_file(&mf); return fail(&err); }
        printf("%s: %zu arrays\n", path, z.count);
        for (size_t i = 0; i < z.count; i++) {
            printf("  %-32s %-6s ", z.entries[i].name, ma_dtype_name(z.entries[i].t.dtype));
            print_shape(z.entries[i].t.ndim, z.entries[i].t.shape);
            printf("\n");
        }
        ma_npz_free(&z);
        ma_unmap_file(&mf);
    } else {
        ma_st_tensor *ts;
        size_t n;
        if (ma_st_parse(mf.data, mf.size, path, &ts, &n, &err)) { ma_unmap_file(&mf); return fail(&err); }
        printf("%s: safetensors, %zu tensors\n", path, n);
        for (size_t i = 0; i < n; i++) {
            printf("  %-72s %-5s ", ts[i].name, ma_dtype_name(ts[i].dtype));
            print_shape(ts[i].ndim, ts[i].shape);
            printf("\n");
        }
        ma_st_free_tensors(ts, n);
        ma_unmap_file(&mf);
    }
    return rc;
}

/* ---------------------------------------------------------------------------------- prompt */

#include <cjson/cJSON.h>
#include <math.h>

static int cmd_prompt(opts *o) {
    if (!o->model) { fprintf(stderr, "molmoact: prompt needs --model DIR\n"); return 1; }
    ma_error err = {0};
    ma_model m;
    if (ma_model_open(o->model, o->norm_tag, &m, &err)) return fail(&err);
    if (!m.tok) { fprintf(stderr, "molmoact: %s has no tokenizer.json\n", o->model); ma_model_close(&m); return 1; }
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    int rc = 0;
    ma_prompt_opts po = {m.tokens_per_image, 2, m.col_tokens, 1};
    while ((got = getline(&line, &cap, stdin)) >= 0) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *task = j ? cJSON_GetObjectItemCaseSensitive(j, "task") : NULL, *state = j ? cJSON_GetObjectItemCaseSensitive(j, "state") : NULL;
        float st[MA_NORM_MAX_DIM];
        int n = 0, ok = cJSON_IsString(task) && cJSON_IsArray(state);
        for (const cJSON *e = ok ? state->child : NULL; e && ok; e = e->next) {
            if (n >= MA_NORM_MAX_DIM) ok = 0;
            else if (cJSON_IsNumber(e)) st[n++] = (float)e->valuedouble;
            else if (cJSON_IsString(e) && !strcmp(e->valuestring, "nan")) st[n++] = NAN;
            else if (cJSON_IsString(e) && !strcmp(e->valuestring, "inf")) st[n++] = INFINITY;
            else if (cJSON_IsString(e) && !strcmp(e->valuestring, "-inf")) st[n++] = -INFINITY;
            else ok = 0;
        }
        ma_prompt p;
        if (!ok) { fprintf(stderr, "molmoact: prompt: expected {\"task\": string, \"state\": [numbers]}\n"); printf("null\n"); rc = 1; }
        else if (ma_build_prompt(&m.cfg, &m.ns, m.tok, &po, task->valuestring, strlen(task->valuestring), st, n, &p, &err)) {
            fprintf(stderr, "molmoact: prompt: %s\n", err.msg);
            printf("null\n");
            rc = 1;
        } else {
            printf("[");
            for (int64_t i = 0; i < p.n; i++) printf(i ? ",%lld" : "%lld", (long long)p.ids[i]);
            printf("]\n");
            ma_prompt_free(&p);
        }
        cJSON_Delete(j);
    }
    free(line);
    ma_model_close(&m);
    return rc;
}

/* ---------------------------------------------------------------------------------- preprocess */

static int cmd_preprocess(opts *o) {
    if (!o->model || !o->image0) { fprintf(stderr, "molmoact: preprocess needs --model DIR and --image0 FILE\n"); return 1; }
    ma_error err = {0};
    ma_config cfg;
    char *cp = ma_path_join(o->model, "config.json");
    ma_status s = cp ? ma_config_load(cp, &cfg, &err) : MA_ERR_NOMEM;
    free(cp);
    if (s) return fail(&err);
    ma_image im;
    if (ma_image_load(o->image0, &im, &err)) return fail(&err);
    int64_t ps[2] = {cfg.patch_h * cfg.patch_w, 3 * cfg.patch * cfg.patch}, rs[3] = {cfg.image_h, cfg.image_w, 3};
    int64_t os[3] = {im.h, im.w, 3};
    float *pixels = malloc(sizeof(float) * (size_t)(ps[0] * ps[1]));
    uint8_t *resized = malloc((size_t)(rs[0] * rs[1] * 3));
    int rc = 1;
    if (pixels && resized && !ma_preprocess_image(&cfg, &im, pixels, resized, &err)) {
        ma_npz_writer w;
        ma_npz_writer_init(&w);
        ma_tensor a = ma_tensor_view(MA_DT_U8, 3, os, im.rgb), b = ma_tensor_view(MA_DT_U8, 3, rs, resized);
        if (!ma_npz_add(&w, "image", &a, &err) && !ma_npz_add(&w, "resized_u8", &b, &err) &&
            !ma_npz_add_f32(&w, "pixels", 2, ps, pixels, &err) && !ma_npz_write(&w, o->out ? o->out : "preprocessed.npz", 0, &err))
            rc = 0;
        ma_npz_writer_free(&w);
    }
    if (rc) fail(&err);
    free(pixels);
    free(resized);
    ma_image_free(&im);
    return rc;
}

/* ---------------------------------------------------------------------------------- compile */

static int parse_prompt_seq(const char *what, const char *v, int *out) {
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (!*v || *end || errno || n < 1 || n > MA_MAX_PROMPT_SEQ) {
        fprintf(stderr, "molmoact: %s %s: must be an integer in [1, %d]\n", what, v, MA_MAX_PROMPT_SEQ);
        return -1;
    }
    *out = (int)n;
    return 0;
}

/* the index of option a in the NULL-terminated list valued (options that take a value), -1 when
 * it is none of them, -2 (reported) when its value is missing or it was given before */
static int valued_option(const char *const *valued, const char *a, const char *v, unsigned *seen) {
    int k = 0;
    while (valued[k] && strcmp(a, valued[k])) k++;
    if (!valued[k]) return -1;
    if (!v) { fprintf(stderr, "molmoact: %s needs a value\n", a); return -2; }
    if (*seen & (1u << k)) { fprintf(stderr, "molmoact: %s is given twice\n", a); return -2; }
    *seen |= 1u << k;
    return k;
}

static int cmd_compile(int argc, char **argv) {
    ma_compile_opts co = {"f16", "f16", "f16", "", 128, 0, {NULL}, {NULL}};
    const char *src = NULL, *out = NULL;
    const char *env = getenv("MOLMOACT2_PROMPT_SEQ");
    if (env && *env && parse_prompt_seq("MOLMOACT2_PROMPT_SEQ", env, &co.prompt_seq)) return 1;
    static const char *const valued[] = {"-o", "--vision", "--llm", "--action", "--suffix", "--prompt-seq", NULL};
    unsigned seen = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (valued_option(valued, a, v, &seen) == -2) return 1;
        if (!strcmp(a, "-o")) out = argv[++i];
        else if (!strcmp(a, "--vision")) co.vision = argv[++i];
        else if (!strcmp(a, "--llm")) co.llm = argv[++i];
        else if (!strcmp(a, "--action")) co.action = argv[++i];
        else if (!strcmp(a, "--suffix")) co.suffix = argv[++i];
        else if (!strcmp(a, "--prompt-seq")) { if (parse_prompt_seq("--prompt-seq", argv[++i], &co.prompt_seq)) return 1; }
        else if (!strcmp(a, "--keep")) { /* repeatable: PATTERN=P */
            if (!v) { fprintf(stderr, "molmoact: --keep needs PATTERN=P\n"); return 1; }
            char *eq = strrchr(argv[++i], '=');
            if (!eq || co.n_keep == MA_COMPILE_MAX_KEEP) {
                fprintf(stderr, "molmoact: --keep %s: must be PATTERN=P (at most %d)\n", v, MA_COMPILE_MAX_KEEP);
                return 1;
            }
            *eq = '\0';
            co.keep_pattern[co.n_keep] = argv[i];
            co.keep_prec[co.n_keep++] = eq + 1;
        }
        else if (a[0] == '-') { fprintf(stderr, "molmoact: compile: unknown option %s\n", a); return 1; }
        else if (!src) src = a;
        else { fprintf(stderr, "molmoact: compile: unexpected argument %s\n", a); return 1; }
    }
    if (!src || !out) { fprintf(stderr, "molmoact: compile needs HF_DIR and -o CTX_DIR\n"); return 1; }
    ma_error err = {0};
    if (ma_env_check(&err) || ma_compile(src, out, &co, &err)) return fail(&err);
    printf("compiled %s -> %s (vision %s, llm %s, action %s, prompt length %d%s%s)\n", src, out, co.vision, co.llm, co.action,
           co.prompt_seq, co.suffix[0] ? ", suffix " : "", co.suffix);
    return 0;
}

/* ---------------------------------------------------------------------------------- serve */

static int cmd_serve(int argc, char **argv) {
    ma_serve_opts so = {NULL, "127.0.0.1", 8000, NULL, 32.0, 512, "libero", 0, 0, 0, 30, "/proc/self/exe", 300, 0, 0};
    static const char *const valued[] = {"--model", "--host", "--port", "--api-key-file", "--max-message-mb", "--max-clients",
                                         "--norm-tag", "--threads", "--recv-timeout-s", "--idle-timeout-s", "--seed", NULL};
    unsigned seen = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        const int k = valued_option(valued, a, v, &seen);
        if (k == -2) return 1;
        if (k >= 0) {
            i++;
            char *end;
            errno = 0;
            if (k == 0) so.model_dir = v;
            else if (k == 1) so.host = v;
            else if (k == 3) so.api_key_file = v;
            else if (k == 6) so.norm_tag = v;
            else if (k == 10) {
                so.seed = strtoull(v, &end, 10);
                if (!*v || *v == '-' || errno || *end) { fprintf(stderr, "molmoact: --seed must be a non-negative integer\n"); return 1; }
                so.have_seed = 1;
            } else if (k == 4) {
                so.max_message_mb = strtod(v, &end);
                if (errno || *end || !(so.max_message_mb >= 1.0 / 1024 && so.max_message_mb <= 4096)) { fprintf(stderr, "molmoact: --max-message-mb must be in [0.001, 4096] (1 KiB to 4 GiB)\n"); return 1; }
            } else {
                long n = strtol(v, &end, 10);
                const long lo = k == 2 || k == 9 ? 0 : 1, hi = k == 2 ? 65535 : k == 5 ? 100000 : k == 7 ? 64 : k == 9 ? 86400 : 3600;
                if (!*v || errno || *end || n < lo || n > hi) { fprintf(stderr, "molmoact: %s must be an integer in [%ld, %ld]\n", a, lo, hi); return 1; }
                if (k == 2) so.port = (int)n;
                else if (k == 5) so.max_clients = (int)n;
                else if (k == 7) so.threads = (int)n;
                else if (k == 9) so.idle_timeout_s = (int)n;
                else so.recv_timeout_s = (int)n;
            }
        } else if (!strcmp(a, "--inproc")) so.inproc = 1;
        else if (!strcmp(a, "--flip180")) so.flip180 = 1;
        else { fprintf(stderr, "molmoact: serve: unknown option %s\n", a); return 1; }
    }
    if (!so.model_dir) { fprintf(stderr, "molmoact: serve needs --model DIR\n"); return 1; }
    if (so.threads > 0) {
        char n[16];
        snprintf(n, sizeof n, "%d", so.threads);
        setenv("MOLMOACT_THREADS", n, 1);
        ma_kernel_set_threads(so.threads);
    }
    return ma_serve(&so);
}

/* ---------------------------------------------------------------------------------- tokenize */

static int cmd_tokenize(int argc, char **argv) {
    const char *path = NULL;
    int decode = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "--decode")) decode = 1;
        else { fprintf(stderr, "molmoact: tokenize: unknown option %s\n", argv[i]); return 1; }
    }
    if (!path) { fprintf(stderr, "molmoact: tokenize needs --tokenizer FILE\n"); return 1; }
    ma_error err = {0};
    ma_tokenizer *tok;
    if (ma_tokenizer_load(path, &tok, &err)) return fail(&err);
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    int rc = 0;
    long lineno = 0;
    while ((got = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        size_t len = (size_t)got;
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
        if (!len) continue;
        if (!decode) {
            char *text = NULL;
            size_t tl;
            int64_t *ids;
            size_t n;
            if (ma_json_parse_string(line, len, &text, &tl, &err) || ma_tokenizer_encode(tok, text, tl, &ids, &n, &err)) {
                fprintf(stderr, "molmoact: tokenize: line %ld: %s\n", lineno, err.msg);
                printf("null\n");
                free(text);
                text = NULL;
                rc = 1;
                if (err.code != MA_ERR_NOMEM) { memset(&err, 0, sizeof err); continue; }
                break;
            }
            printf("[");
            for (size_t i = 0; i < n; i++) printf(i ? ",%lld" : "%lld", (long long)ids[i]);
            printf("]\n");
            free(ids);
            free(text);
        } else {
            int64_t *ids = NULL;
            size_t n;
            char *text;
            size_t tl;
            if (ma_json_parse_int_array(line, len, &ids, &n, &err) || ma_tokenizer_decode(tok, ids, n, &text, &tl, &err)) {
                fprintf(stderr, "molmoact: tokenize --decode: line %ld: %s\n", lineno, err.msg);
                printf("null\n");
                free(ids);
                rc = 1;
                continue;
            }
            ma_json_write_string(stdout, text, tl);
            printf("\n");
            free(ids);
            free(text);
        }
    }
    free(line);
    ma_tokenizer_free(tok);
    return rc;
}

/* run, bench, parity, serve: the backend options become the environment the sessions and the
 * workers read (--backend MOLMOACT_BACKEND, --qnn-lib-dir MOLMOACT_QNN_LIB_DIR, --qnn-io-map
 * MOLMOACT_QNN_IO_MAP, --qnn-soc / --qnn-arch MOLMOACT_QNN_SOC / _ARCH) and are removed from argv */
static int take_backend_options(int *argc, char **argv) {
    static const char *const names[] = {"--backend", "--qnn-lib-dir", "--qnn-io-map", "--qnn-soc", "--qnn-arch", NULL};
    static const char *const vars[] = {"MOLMOACT_BACKEND", "MOLMOACT_QNN_LIB_DIR", "MOLMOACT_QNN_IO_MAP", "MOLMOACT_QNN_SOC", "MOLMOACT_QNN_ARCH"};
    unsigned seen = 0;
    int w = 2;
    for (int i = 2; i < *argc; i++) {
        int k = -1;
        for (int j = 0; names[j]; j++)
            if (!strcmp(argv[i], names[j])) k = j;
        if (!strcmp(argv[i], "--preload")) { setenv("MOLMOACT_PRELOAD", "1", 1); continue; }
        if (k < 0) { argv[w++] = argv[i]; continue; }
        if (i + 1 >= *argc) { fprintf(stderr, "molmoact: %s needs a value\n", argv[i]); return -1; }
        if (seen & (1u << k)) { fprintf(stderr, "molmoact: %s is given twice\n", argv[i]); return -1; }
        seen |= 1u << k;
        const char *v = argv[++i];
        if (k == 0 && strcmp(v, "cpu") && strcmp(v, "qnn")) { fprintf(stderr, "molmoact: --backend %s: must be cpu or qnn\n", v); return -1; }
        if (k >= 3) {
            char *end;
            errno = 0;
            unsigned long n = strtoul(v, &end, 10);
            if (!*v || *end || errno || v[0] == '-' || n > 0xffffffffUL) { fprintf(stderr, "molmoact: %s %s: must be an unsigned integer\n", names[k], v); return -1; }
        }
        setenv(vars[k], v, 1);
    }
    if ((seen & ~1u) && !(seen & 1u) && !getenv("MOLMOACT_BACKEND")) {
        fprintf(stderr, "molmoact: the --qnn-* options need --backend qnn\n");
        return -1;
    }
    argv[w] = NULL;
    *argc = w;
    return 0;
}

/* --base DIR (a LeRobot policy's HF base directory) becomes MOLMOACT_BASE_DIR, which the model
 * loader and the workers read; removed from argv */
static int take_base_option(int *argc, char **argv) {
    int w = 2, seen = 0;
    for (int i = 2; i < *argc; i++) {
        const char *v = NULL;
        if (!strcmp(argv[i], "--base")) {
            if (i + 1 >= *argc) { fprintf(stderr, "molmoact: --base needs a directory\n"); return -1; }
            v = argv[++i];
        } else if (!strncmp(argv[i], "--base=", 7)) v = argv[i] + 7;
        if (!v) { argv[w++] = argv[i]; continue; }
        if (seen++) { fprintf(stderr, "molmoact: --base is given twice\n"); return -1; }
        struct stat st;
        if (!*v || stat(v, &st) || !S_ISDIR(st.st_mode)) { fprintf(stderr, "molmoact: --base %s is not a directory\n", v); return -1; }
        setenv("MOLMOACT_BASE_DIR", v, 1);
    }
    argv[w] = NULL;
    *argc = w;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) { usage(argc < 2 ? stderr : stdout); return argc < 2; }
    const char *cmd = argv[1];
    ma_keep_freed_memory();
    if ((!strcmp(cmd, "run") || !strcmp(cmd, "bench") || !strcmp(cmd, "parity") || !strcmp(cmd, "serve")) &&
        take_backend_options(&argc, argv))
        return 1;
    if (strcmp(cmd, "__worker") && take_base_option(&argc, argv)) return 1;
    if (strcmp(cmd, "__worker")) {
        ma_error err = {0};
        if (ma_env_check(&err)) return fail(&err);
    }
    if (!strcmp(cmd, "__worker")) { /* a resident worker process, started by the orchestrator */
        if (argc != 7) { fprintf(stderr, "molmoact: __worker is started by molmoact run, not by hand\n"); return 2; }
        return ma_worker_main(atoi(argv[2]), argv[3], argv[4], (unsigned)strtoul(argv[5], NULL, 10), atoi(argv[6]));
    }
    if (!strcmp(cmd, "inspect")) return cmd_inspect(argc, argv);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(argc, argv);
    if (!strcmp(cmd, "compile")) return cmd_compile(argc, argv);
    if (!strcmp(cmd, "serve")) return cmd_serve(argc, argv);
    opts o;
    if (parse_opts(argc, argv, 2, &o)) return 1;
    if (o.threads > 0) {
        char n[16];
        snprintf(n, sizeof n, "%d", o.threads);
        setenv("MOLMOACT_THREADS", n, 1); /* for the workers */
        ma_kernel_set_threads(o.threads);
    }
    if (!strcmp(cmd, "run")) return cmd_run(&o);
    if (!strcmp(cmd, "bench")) return cmd_bench(&o);
    if (!strcmp(cmd, "parity")) return cmd_parity(&o);
    if (!strcmp(cmd, "prompt")) return cmd_prompt(&o);
    if (!strcmp(cmd, "preprocess")) return cmd_preprocess(&o);
    fprintf(stderr, "molmoact: unknown command %s\n", cmd);
    usage(stderr);
    return 1;
}
