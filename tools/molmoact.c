/* SPDX-License-Identifier: Apache-2.0 */
/* molmoact: MolmoAct2-LIBERO inference from the command line.
 *
 * Commands: run (resident sessions, or --inproc), bench, parity, compile, inspect, tokenize,
 * prompt, preprocess, serve, help, version; the tables OPTS and CMDS below hold their options and
 * synopses, from which tools/cli.c parses the command line and prints `molmoact help`.
 * `__worker` is the resident worker process.
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
#include "core/env.h"
#include "core/progress.h"
#include "core/util.h"
#include "cli.h"
#include "model/manifest.h"
#include "backend/qnn/qnn.h"

/* ------------------------------------------------------------------------- the command line */

/* option ids (0 ends a command's list) */
enum {
    O_END, O_MODEL, O_BASE, O_GOLDEN, O_INPUTS, O_OUT, O_DUMP, O_NORM_TAG, O_IMAGE0, O_IMAGE1, O_TASK, O_STATE, O_NOISE, O_SEED,
    O_SESSION, O_JSON, O_STREAM, O_INPROC, O_COLD, O_RUNS, O_THREADS, O_GATE, O_BACKEND, O_QNN_LIB_DIR, O_QNN_IO_MAP,
    O_QNN_SOC, O_QNN_ARCH, O_PRELOAD, O_VISION, O_LLM, O_ACTION, O_SUFFIX, O_PROMPT_SEQ, O_KEEP, O_COMPUTE, O_COMPUTE_KEEP, O_QUIET, O_HOST, O_PORT,
    O_API_KEY_FILE, O_MAX_MESSAGE_MB, O_MAX_CLIENTS, O_RECV_TIMEOUT, O_IDLE_TIMEOUT, O_FLIP180, O_TOKENIZER, O_DECODE,
    O_MARKDOWN, O_QNN_PERF, O_QNN_ZERO_COPY, O_VERBOSE, O_COUNT
};

static const cli_opt OPTS[O_COUNT] = {
    [O_MODEL] = {"--model", NULL, "DIR", CLI_STR, 0, 0, "a Hugging Face checkpoint directory, a LeRobot policy directory or a context directory (molmoact compile)"},
    [O_BASE] = {"--base", NULL, "DIR", CLI_STR, 0, 0, "the Hugging Face base directory of a LeRobot policy (default: found in the Hugging Face hub cache)"},
    [O_GOLDEN] = {"--golden", NULL, "DIR", CLI_STR, 0, 0, "a golden directory (reference/make_golden.py): the parity table against it"},
    [O_INPUTS] = {"--inputs", NULL, "IN.npz", CLI_STR, 0, 0, "the observation as arrays: pixels or image0/image1, input_ids or task + state, optional noise"},
    [O_OUT] = {"--out", "-o", "OUT.npz", CLI_STR, 0, 0, "write the actions [10, 7] and the trajectory [10, 32]"},
    [O_DUMP] = {"--dump", NULL, "DIR", CLI_STR, 0, 0, "write every intermediate of the first run to DIR/intermediates.npz"},
    [O_NORM_TAG] = {"--norm-tag", NULL, "TAG", CLI_STR, 0, 0, "the norm_stats.json entry to normalise with (default libero)"},
    [O_IMAGE0] = {"--image0", NULL, "FILE", CLI_STR, 0, 0, "the first camera frame (PNG or JPEG)"},
    [O_IMAGE1] = {"--image1", NULL, "FILE", CLI_STR, 0, 0, "the second camera frame (PNG or JPEG)"},
    [O_TASK] = {"--task", NULL, "TEXT", CLI_STR, 0, 0, "the task sentence"},
    [O_STATE] = {"--state", NULL, "S0,..,S7", CLI_STR, 0, 0, "the proprio state: comma-separated decimal numbers (spaces allowed after the commas)"},
    [O_NOISE] = {"--noise", NULL, "FILE", CLI_STR, 0, 0, "the initial noise [1, 10, 32]: an .npy, or an .npz holding noise"},
    [O_SEED] = {"--seed", NULL, "N", CLI_U64, 0, 0, "the noise from torch.randn with this seed (default 0)"},
    [O_SESSION] = {"--session", NULL, "NAME", CLI_STR, 0, 0, "one session in process: vision, llm_split0..3, action_context, action_step"},
    [O_JSON] = {"--json", NULL, NULL, CLI_FLAG, 0, 0, "print one JSON object instead of tables"},
    [O_STREAM] = {"--stream", NULL, NULL, CLI_FLAG, 0, 0, "read IN.npz paths (optionally a tab and OUT.npz) from stdin, one JSON line per observation"},
    [O_INPROC] = {"--inproc", NULL, NULL, CLI_FLAG, 0, 0, "run every session in this process instead of six resident workers"},
    [O_COLD] = {"--cold", NULL, NULL, CLI_FLAG, 0, 0, "flush the session's weights from every cache level before each run (a context directory)"},
    [O_RUNS] = {"--runs", NULL, "N", CLI_INT, 1, 1000000, "requests of the same observation"},
    [O_THREADS] = {"--threads", NULL, "N", CLI_INT, 1, 64, "GEMM threads per process (default: the cores this process may use; MOLMOACT_THREADS)"},
    [O_GATE] = {"--gate", NULL, "G", CLI_REAL, 1e-9, 1, "the cosine gate (default: by precision, 0.9999 for f16/bf16/f32 weights, 0.999 for q8_0, 0.99 for q4_0)"},
    [O_BACKEND] = {"--backend", NULL, "cpu|qnn", CLI_STR, 0, 0, "where the sessions run (default cpu; qnn: QNN HTP context binaries, docs/QNN.md)"},
    [O_QNN_LIB_DIR] = {"--qnn-lib-dir", NULL, "DIR", CLI_STR, 0, 0, "qnn: the directory of libQnnHtp.so and libQnnSystem.so"},
    [O_QNN_IO_MAP] = {"--qnn-io-map", NULL, "MAP.json", CLI_STR, 0, 0, "qnn: {session: {our tensor name: graph tensor name}}"},
    [O_QNN_SOC] = {"--qnn-soc", NULL, "N", CLI_U64, 0, 4294967295.0, "qnn: the SoC model sent as a device config (none unless given; 77 on the IQ-9075)"},
    [O_QNN_ARCH] = {"--qnn-arch", NULL, "N", CLI_U64, 0, 4294967295.0, "qnn: the HTP architecture sent as a device config (none unless given; 73 on the IQ-9075)"},
    [O_PRELOAD] = {"--preload", NULL, NULL, CLI_FLAG, 0, 0, "read every context in at open and run one warm-up request, so the first real request runs warm"},
    [O_VISION] = {"--vision", NULL, "P", CLI_STR, 0, 0, "the vision encoder's precision: f16 (default), bf16, q8_0, q4_0"},
    [O_LLM] = {"--llm", NULL, "P", CLI_STR, 0, 0, "the LLM's precision (the four splits)"},
    [O_ACTION] = {"--action", NULL, "P", CLI_STR, 0, 0, "the action expert's precision (action_context and action_step)"},
    [O_SUFFIX] = {"--suffix", NULL, "S", CLI_STR, 0, 0, "name the files of the components given with --vision/--llm/--action vision{S}.gguf, llm_split0..3{S}.gguf, action_step{S}.gguf (picked at run time by MOLMOACT_*_CTX_SUFFIX=S); the other files keep their names"},
    [O_PROMPT_SEQ] = {"--prompt-seq", NULL, "N", CLI_INT, 1, MA_MAX_PROMPT_SEQ, "the prompt length the static graphs are built for, recorded in the contexts (default 128, or MOLMOACT_PROMPT_SEQ)"},
    [O_COMPUTE] = {"--compute", NULL, "PLAN", CLI_STR, 0, 0, "how products are computed: fp32 (default), or bf16 (operands rounded to bf16, sums in fp32: AMX or AVX512-BF16 where the CPU has them, else fp32), for every component or per component, e.g. --compute vision=bf16,llm=bf16"},
    [O_COMPUTE_KEEP] = {"--compute-keep", NULL, "PATTERN", CLI_LIST, 0, 0, "matrices whose checkpoint name matches the glob PATTERN computed in fp32 in a bf16 component (repeatable)"},
    [O_KEEP] = {"--keep", NULL, "PATTERN=P", CLI_LIST, 0, 0, "matrices whose checkpoint name matches the glob PATTERN stored in P where P is more precise (repeatable), e.g. --keep '*scout_mlp*=f16'"},
    [O_QUIET] = {"--quiet", "-q", NULL, CLI_FLAG, 0, 0, "no progress lines (compile; the workers' start with --preload and in serve)"},
    [O_HOST] = {"--host", NULL, "ADDR", CLI_STR, 0, 0, "the address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)"},
    [O_PORT] = {"--port", NULL, "N", CLI_INT, 0, 65535, "the port (default 8000; 0: any free port, printed at start)"},
    [O_API_KEY_FILE] = {"--api-key-file", NULL, "FILE", CLI_STR, 0, 0, "require this key (Authorization: Api-Key KEY, or Bearer KEY) on every request but /healthz"},
    [O_MAX_MESSAGE_MB] = {"--max-message-mb", NULL, "MB", CLI_REAL, 1.0 / 1024, 4096, "the largest request body or websocket message (default 32)"},
    [O_MAX_CLIENTS] = {"--max-clients", NULL, "N", CLI_INT, 1, 100000, "connections at once (default 512; /healthz is answered beyond it)"},
    [O_RECV_TIMEOUT] = {"--recv-timeout-s", NULL, "S", CLI_INT, 1, 3600, "the deadline for one whole request or message to arrive (default 30)"},
    [O_IDLE_TIMEOUT] = {"--idle-timeout-s", NULL, "S", CLI_INT, 0, 86400, "close a connection idle between requests this long (default 300; 0: never)"},
    [O_FLIP180] = {"--flip180", NULL, NULL, CLI_FLAG, 0, 0, "rotate every camera frame by 180 degrees (LIBERO's renders are upside down)"},
    [O_TOKENIZER] = {"--tokenizer", NULL, "FILE", CLI_STR, 0, 0, "a tokenizer.json"},
    [O_DECODE] = {"--decode", NULL, NULL, CLI_FLAG, 0, 0, "read id arrays and print the decoded strings"},
    [O_MARKDOWN] = {"--markdown", NULL, NULL, CLI_FLAG, 0, 0, "print the README's command list and environment table"},
    [O_QNN_PERF] = {"--qnn-perf", NULL, "default|high|burst", CLI_STR, 0, 0, "qnn: the HTP power vote (default: none; high: TURBO corner, 100 us sleep latency; burst: the highest corner, 40 us, RPC polling)"},
    [O_QNN_ZERO_COPY] = {"--qnn-zero-copy", NULL, NULL, CLI_FLAG, 0, 0, "qnn: the graphs' tensors in rpcmem buffers registered with the contexts (libcdsprpc.so), no copies into client buffers"},
    [O_VERBOSE] = {"--verbose", "-v", NULL, CLI_FLAG, 0, 0, "say more at open: each QNN context binary's graph count and names"},
};

static int cmd_run_a(cli_args *a);
static int cmd_bench_a(cli_args *a);
static int cmd_parity_a(cli_args *a);
static int cmd_compile_a(cli_args *a);
static int cmd_inspect_a(cli_args *a);
static int cmd_tokenize_a(cli_args *a);
static int cmd_prompt_a(cli_args *a);
static int cmd_preprocess_a(cli_args *a);
static int cmd_serve_a(cli_args *a);
static int cmd_help_a(cli_args *a);
static int cmd_version_a(cli_args *a);

/* the options of everything that opens a model and runs its sessions */
#define SESSION_USES {O_NORM_TAG, NULL, NULL}, {O_THREADS, NULL, NULL}, {O_BASE, NULL, NULL}, {O_BACKEND, NULL, NULL}, \
    {O_QNN_LIB_DIR, NULL, NULL}, {O_QNN_IO_MAP, NULL, NULL}, {O_QNN_SOC, NULL, NULL}, {O_QNN_ARCH, NULL, NULL}, {O_QNN_PERF, NULL, NULL}, \
    {O_QNN_ZERO_COPY, NULL, NULL}, {O_PRELOAD, NULL, NULL}, {O_VERBOSE, NULL, NULL}, {O_QUIET, NULL, NULL}

static const cli_cmd CMDS[] = {
    {"run", "[--model DIR] [(--inputs IN.npz | --image0 A --image1 B --state S --task T)] [options]",
     "Run one observation through the sessions (resident in six worker processes) and print the action chunk, the latency per component, peak memory and, with --golden, the parity table.",
     "Without --model: the demo model (assets/tiny-grid) and its golden observation. --golden DIR without an observation runs the golden's own. With --runs N the latency table is over the warm runs (2..N) and the first request is reported on its own line; every run must give the same chunk. Exit status: 0, 1 an error, 2 a failed parity gate, 3 (--stream) an observation failed, 128+N stopped by signal N.",
     0, 0, "sessions",
     {{O_MODEL, NULL, "a Hugging Face checkpoint, LeRobot policy or context directory (default: the demo model, assets/tiny-grid)"}, {O_INPUTS, NULL, NULL}, {O_IMAGE0, NULL, NULL}, {O_IMAGE1, NULL, NULL},
      {O_TASK, NULL, NULL}, {O_STATE, NULL, NULL}, {O_NOISE, NULL, NULL}, {O_SEED, NULL, NULL}, {O_OUT, NULL, NULL},
      {O_DUMP, NULL, NULL}, {O_GOLDEN, NULL, NULL}, {O_GATE, NULL, NULL}, {O_RUNS, NULL, "requests of the same observation (default 1)"},
      {O_STREAM, NULL, NULL}, {O_INPROC, NULL, NULL}, {O_JSON, NULL, NULL}, SESSION_USES},
     cmd_run_a},
    {"bench", "[--model DIR] [--runs N] [--inputs IN.npz] [options]  |  --model DIR --session NAME --inputs IO.npz",
     "Time the pipeline on a synthetic LIBERO-like observation (or --inputs) after one warm-up request; or, with --session, one session in process on the arrays of IO.npz named as its inputs.",
     "Prints the latency table, the kernel set, the precision plan and the threads, peak memory and the time to open. Nothing asserts a time.",
     0, 0, "sessions",
     {{O_MODEL, NULL, "a Hugging Face checkpoint, LeRobot policy or context directory (default: the demo model, assets/tiny-grid)"}, {O_INPUTS, NULL, "IN.npz (pipeline) or IO.npz (--session: a golden's <session>_io.npz)"},
      {O_IMAGE0, NULL, NULL}, {O_IMAGE1, NULL, NULL}, {O_TASK, NULL, NULL}, {O_STATE, NULL, NULL},
      {O_SEED, NULL, "the synthetic observation's and the noise's seed (default 0)"}, {O_RUNS, NULL, "timed requests after the warm-up (default 5)"},
      {O_SESSION, NULL, NULL}, {O_COLD, NULL, NULL}, {O_INPROC, NULL, NULL}, {O_JSON, NULL, NULL}, SESSION_USES},
     cmd_bench_a},
    {"parity", "--model DIR --golden DIR [--gate G] [--json]",
     "Feed every session its golden inputs and print cosine, max |diff| and the share within 1e-3 x rms per output, then the end-to-end action cosine.",
     "Exit status 2 when the gate fails. For quantised contexts only the end-to-end actions are gated.", 0, 0, "sessions",
     {{O_MODEL, NULL, NULL}, {O_GOLDEN, NULL, NULL}, {O_GATE, NULL, NULL}, {O_JSON, NULL, NULL}, SESSION_USES}, cmd_parity_a},
    {"compile", "SRC_DIR -o CTX_DIR [--vision P] [--llm P] [--action P] [--suffix S] [--prompt-seq N] [--keep PATTERN=P ...]",
     "Compile a checkpoint (Hugging Face or LeRobot directory; LoRA adapters merged) into one GGUF context per session plus the host files and manifest.json.",
     "Matrices are stored in the component's precision (f16, bf16, q8_0, q4_0), vectors in f32. A new directory appears whole; into an existing one the files are moved in only when all are written. A variant with --suffix is added beside the files already there: e.g. `molmoact compile SRC -o CTX --llm q4_0 --suffix _w4a16`, then `MOLMOACT_LLM_CTX_SUFFIX=_w4a16 molmoact run --model CTX`.",
     1, 1, "compile",
     {{O_OUT, "CTX_DIR", "the output directory (created; or an existing one, the new files added)"}, {O_VISION, NULL, NULL}, {O_LLM, NULL, NULL}, {O_ACTION, NULL, NULL}, {O_SUFFIX, NULL, NULL},
      {O_PROMPT_SEQ, NULL, NULL}, {O_KEEP, NULL, NULL}, {O_COMPUTE, NULL, NULL}, {O_COMPUTE_KEEP, NULL, NULL}, {O_BASE, NULL, NULL}, {O_THREADS, NULL, NULL}, {O_QUIET, NULL, NULL}},
     cmd_compile_a},
    {"inspect", "FILE.gguf | FILE.safetensors | FILE.npz | FILE.bin | DIR",
     "Show what a file or directory holds: tensors, shapes and dtypes; a checkpoint's kind and the config fields this runtime ignores; a context directory's sessions, precisions, prompt length and compile; a QNN context binary's graphs.",
     NULL, 1, 1, "inspect", {{O_BASE, NULL, NULL}, {O_QNN_LIB_DIR, NULL, "for FILE.bin: the directory of libQnnSystem.so"}}, cmd_inspect_a},
    {"tokenize", "--tokenizer tokenizer.json [--decode]",
     "Tokenise stdin, one JSON string per line, printing one id array per line (--decode: the reverse).", NULL, 0, 0, NULL,
     {{O_TOKENIZER, NULL, NULL}, {O_DECODE, NULL, NULL}}, cmd_tokenize_a},
    {"prompt", "--model DIR",
     "Build the prompt ids of {\"task\": ..., \"state\": [...]} lines on stdin, one id array per line.", NULL, 0, 0, NULL,
     {{O_MODEL, NULL, NULL}, {O_NORM_TAG, NULL, NULL}, {O_BASE, NULL, NULL}}, cmd_prompt_a},
    {"preprocess", "--model DIR --image0 FILE [-o OUT.npz]",
     "Decode a frame and write it, its 378x378 resize and the pixels the vision encoder takes (default preprocessed.npz).", NULL, 0, 0, NULL,
     {{O_MODEL, NULL, NULL}, {O_IMAGE0, NULL, NULL}, {O_OUT, NULL, "the output (default preprocessed.npz)"}, {O_BASE, NULL, NULL}},
     cmd_preprocess_a},
    {"serve", "--model DIR [--host ADDR] [--port N] [options]",
     "Serve robots on one port: the openpi websocket protocol (msgpack), HTTP POST /act (JSON, json_numpy), GET / (a status page), /healthz, /metrics (Prometheus).",
     "docs/SERVER.md describes the protocols, the keys and the replies. SIGTERM or SIGINT drains: requests in flight are answered, then it exits.",
     0, 0, "sessions",
     {{O_MODEL, NULL, NULL}, {O_HOST, NULL, NULL}, {O_PORT, NULL, NULL}, {O_API_KEY_FILE, NULL, NULL}, {O_MAX_MESSAGE_MB, NULL, NULL},
      {O_MAX_CLIENTS, NULL, NULL}, {O_RECV_TIMEOUT, NULL, NULL}, {O_IDLE_TIMEOUT, NULL, NULL},
      {O_SEED, NULL, "seed the generator that gives each request without noise or seed its own (default: seeded at random, logged)"},
      {O_FLIP180, NULL, NULL}, {O_INPROC, NULL, NULL}, SESSION_USES},
     cmd_serve_a},
    {"help", "[COMMAND | env]", "This overview, a command's help, or the environment variables.", NULL, 0, 1, NULL,
     {{O_MARKDOWN, NULL, NULL}}, cmd_help_a},
    {"version", "", "Print the version.", NULL, 0, 0, NULL, {{O_END, NULL, NULL}}, cmd_version_a},
};
#define N_CMDS ((int)(sizeof CMDS / sizeof CMDS[0]))

typedef struct {
    const char *model, *golden, *inputs, *out, *dump, *norm_tag, *image0, *image1, *task, *state, *noise, *session;
    uint64_t seed;
    int have_seed, json, runs, stream, inproc, threads, cold;
    double gate;
} opts;

/* the session options become the environment the sessions and the workers read (--backend
 * MOLMOACT_BACKEND, --qnn-* MOLMOACT_QNN_*, --preload MOLMOACT_PRELOAD, --base MOLMOACT_BASE_DIR,
 * --threads MOLMOACT_THREADS) */
static int session_env(const cli_args *a) {
    const char *name = a->cmd->name;
    if (a->given[O_BACKEND] && strcmp(a->str[O_BACKEND], "cpu") && strcmp(a->str[O_BACKEND], "qnn")) {
        fprintf(stderr, "molmoact %s: --backend %s: must be cpu or qnn\n", name, a->str[O_BACKEND]);
        return 1;
    }
    const int qnn_opts = a->given[O_QNN_LIB_DIR] || a->given[O_QNN_IO_MAP] || a->given[O_QNN_SOC] || a->given[O_QNN_ARCH] ||
                         a->given[O_QNN_PERF] || a->given[O_QNN_ZERO_COPY];
    if (qnn_opts && strcmp(a->cmd->name, "inspect") && !a->given[O_BACKEND] && !getenv("MOLMOACT_BACKEND")) {
        fprintf(stderr, "molmoact %s: the --qnn-* options need --backend qnn\n", name);
        return 1;
    }
    static const struct { int id; const char *var; } map[] = {
        {O_BACKEND, "MOLMOACT_BACKEND"}, {O_QNN_LIB_DIR, "MOLMOACT_QNN_LIB_DIR"}, {O_QNN_IO_MAP, "MOLMOACT_QNN_IO_MAP"},
        {O_QNN_SOC, "MOLMOACT_QNN_SOC"}, {O_QNN_ARCH, "MOLMOACT_QNN_ARCH"}, {O_THREADS, "MOLMOACT_THREADS"}, {O_QNN_PERF, "MOLMOACT_QNN_PERF"}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (a->given[map[i].id]) setenv(map[i].var, a->str[map[i].id], 1);
    if (a->given[O_PRELOAD]) setenv("MOLMOACT_PRELOAD", "1", 1);
    if (a->given[O_QNN_ZERO_COPY]) setenv("MOLMOACT_QNN_ZERO_COPY", "1", 1);
    if (a->given[O_VERBOSE]) setenv("MOLMOACT_VERBOSE", "1", 1);
    if (a->given[O_THREADS]) ma_kernel_set_threads((int)a->i[O_THREADS]);
    if (a->given[O_BASE]) {
        struct stat st;
        const char *v = a->str[O_BASE];
        if (!*v || stat(v, &st) || !S_ISDIR(st.st_mode)) { fprintf(stderr, "molmoact %s: --base %s is not a directory\n", name, v); return 1; }
        setenv("MOLMOACT_BASE_DIR", v, 1);
    }
    if (a->given[O_QUIET]) ma_progress_set_quiet(1);
    ma_error err = {0};
    if (ma_env_check(&err)) { fprintf(stderr, "molmoact %s: %s\n", name, err.msg); return 1; }
    return 0;
}

/* the options of run, bench, parity, prompt and preprocess; contradictions refused (--seed with
 * --noise, --inputs with raw-frame options or --stream) rather than one silently winning */
static int opts_from(const cli_args *a, opts *o) {
    memset(o, 0, sizeof *o);
    const char *name = a->cmd->name;
    o->model = a->str[O_MODEL];
    o->golden = a->str[O_GOLDEN];
    o->inputs = a->str[O_INPUTS];
    o->out = a->str[O_OUT];
    o->dump = a->str[O_DUMP];
    o->norm_tag = a->given[O_NORM_TAG] ? a->str[O_NORM_TAG] : "libero";
    o->image0 = a->str[O_IMAGE0];
    o->image1 = a->str[O_IMAGE1];
    o->task = a->str[O_TASK];
    o->state = a->str[O_STATE];
    o->noise = a->str[O_NOISE];
    o->session = a->str[O_SESSION];
    o->have_seed = a->given[O_SEED];
    o->seed = a->u[O_SEED];
    o->json = a->given[O_JSON];
    o->stream = a->given[O_STREAM];
    o->inproc = a->given[O_INPROC];
    o->cold = a->given[O_COLD];
    o->runs = a->given[O_RUNS] ? (int)a->i[O_RUNS] : 0;
    o->threads = a->given[O_THREADS] ? (int)a->i[O_THREADS] : 0;
    o->gate = a->given[O_GATE] ? a->r[O_GATE] : 0;
    if (o->model && (!*o->model || !ma_is_dir(o->model))) {
        fprintf(stderr, "molmoact %s: --model %s is not a directory\n", name, o->model);
        return -1;
    }
    if (o->have_seed && o->noise) { fprintf(stderr, "molmoact %s: --seed and --noise contradict each other (give one)\n", name); return -1; }
    if (o->inputs && (o->image0 || o->image1 || o->task || o->state)) {
        fprintf(stderr, "molmoact %s: --inputs and --image0/--image1/--task/--state contradict each other (give one observation)\n", name);
        return -1;
    }
    if (o->stream && (o->inputs || o->image0 || o->image1 || o->task || o->state || o->out || o->dump || o->golden)) {
        fprintf(stderr, "molmoact %s: --stream reads its observations and output paths from stdin: it takes no --inputs, "
                        "--image0/--image1/--task/--state, --out, --dump or --golden\n", name);
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

/* what ran: the backend, the kernel set, the threads per process and the precision plan */
static void print_plan(const ma_engine *e, int json) {
    const char *prec[3];
    for (int i = 0; i < 3; i++) prec[i] = e->host.precision[i][0] ? e->host.precision[i] : "checkpoint";
    ma_backend b = MA_BACKEND_CPU;
    ma_backend_current(&b, NULL);
    const char *backend = b == MA_BACKEND_QNN ? "qnn" : "cpu";
    /* the compute plan: the contexts' (fp32 for a checkpoint), or MOLMOACT_COMPUTE's (the model
     * records it); a bf16 plan runs as fp32 where the CPU has no bf16 unit */
    const char *comp[3];
    int any_bf16 = 0;
    for (int i = 0; i < 3; i++) {
        comp[i] = e->host.compute[i][0] ? e->host.compute[i] : "fp32";
        any_bf16 |= !strcmp(comp[i], "bf16");
    }
    const char *unit = b == MA_BACKEND_QNN ? "qnn" : ma_gemm_bf16_unit();
    if (json)
        printf(", \"backend\": \"%s\", \"kernels\": \"%s\", \"threads\": %d, \"precision\": {\"vision\": \"%s\", \"llm\": \"%s\", \"action\": \"%s\"}"
               ", \"compute\": {\"vision\": \"%s\", \"llm\": \"%s\", \"action\": \"%s\", \"bf16_unit\": \"%s\"}",
               backend, ma_gemm_kernels(), ma_kernel_threads(), prec[0], prec[1], prec[2], comp[0], comp[1], comp[2], unit);
    else {
        printf("backend %s, kernels %s, %d threads per process, precision: vision %s, llm %s, action %s", backend, ma_gemm_kernels(),
               ma_kernel_threads(), prec[0], prec[1], prec[2]);
        if (any_bf16)
            printf(", compute: vision %s, llm %s, action %s (bf16 on %s%s)", comp[0], comp[1], comp[2], unit,
                   strcmp(unit, "fp32") ? "" : ": no bf16 unit on this CPU, computed in fp32");
        printf("\n");
    }
}

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
    if (ma_request_load(&ep->host, &src, &q, &err)) { fail(&err); goto out; }
    /* N runs of the same observation on the resident sessions; all must give the same chunk */
    for (int i = 0; i < o->runs; i++) {
        ma_result_free(&res);
        ma_timing tm;
        if (api_run(api, &q, &res, &tm, o->dump && i == 0 ? &trace : NULL, &err)) { fail(&err); goto out; }
        if (i > 0 || o->runs == 1) ma_latency_add(&lat, &tm); /* the table: the warm runs (2..N), or the only one */
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
    else {
        printf("\n");
        char mode[96];
        if (o->runs > 1) snprintf(mode, sizeof mode, "%s; the warm runs 2-%d, the first on its own below", mode_name(ep), o->runs);
        else snprintf(mode, sizeof mode, "%s", mode_name(ep));
        ma_latency_print(&lat, mode, ep->host.cfg.flow_steps, stdout);
    }
    print_plan(ep, o->json);
    print_memory(ep, o->json);
    /* the open (sessions started, contexts mapped; with --preload also read in) and the first
     * request after it, which pays the page faults --preload moves into the open */
    if (o->json) {
        printf(", \"open_ms\": %.3f, \"first_request_ms\": %.3f", open_ms, first_ms);
        if (o->runs > 1) printf(", \"warm_total_ms\": %.3f", warm_sum / (o->runs - 1));
    } else {
        printf("open %.1f ms, first request %.1f ms%s", open_ms, first_ms, ma_env_flag("MOLMOACT_PRELOAD") ? " (--preload)" : "");
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
        else ma_gemm_counts_reset(); /* the timed runs' products only */
    }
    ma_gemm_counts fl;
    ma_gemm_counts_get(&fl);
    const double gflop = (fl.fp32 + fl.bf16 + fl.int8) / o->runs / 1e9;
    if (!rc) {
        double mean = 0;
        for (int i = 0; i < o->runs; i++) mean += ms[i] / o->runs;
        const double median = ma_median(ms, (size_t)o->runs); /* sorts ms: ms[0] is the minimum */
        const double p90 = ma_percentile(ms, (size_t)o->runs, 90);
        long self_kb, workers_kb;
        ma_engine_peak_rss(&e, &self_kb, &workers_kb);
        if (o->json)
            printf("{\"session\": \"%s\", \"runs\": %d, \"threads\": %d, \"kernels\": \"%s\", \"cold\": %s, \"median_ms\": %.4f, \"min_ms\": %.4f, "
                   "\"mean_ms\": %.4f, \"p90_ms\": %.4f, \"weight_bytes\": %zu, \"peak_rss_kib\": %ld, "
                   "\"gemm_gflop\": {\"fp32\": %.4f, \"bf16\": %.4f, \"int8\": %.4f}}\n", o->session, o->runs, ma_kernel_threads(),
                   ma_gemm_kernels(), o->cold ? "true" : "false", median, ms[0], mean, p90, weight_bytes, self_kb, fl.fp32 / o->runs / 1e9,
                   fl.bf16 / o->runs / 1e9, fl.int8 / o->runs / 1e9);
        else
            printf("%s: median %.3f ms, min %.3f ms, mean %.3f ms, p90 %.3f ms over %d runs (%d threads, %s kernels%s), weights %.1f MiB, "
                   "peak RSS %.1f MiB; GEMM products %.2f GFLOP per run (fp32 %.2f, bf16 %.2f, int8 %.2f), %.1f GFLOP/s at the median\n",
                   o->session, median, ms[0], mean, p90, o->runs, ma_kernel_threads(), ma_gemm_kernels(), o->cold ? ", cold caches" : "",
                   weight_bytes / 1048576.0, self_kb / 1024.0, gflop, fl.fp32 / o->runs / 1e9, fl.bf16 / o->runs / 1e9, fl.int8 / o->runs / 1e9,
                   median > 0 ? gflop / (median / 1e3) : 0.0);
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

/* a QNN context binary: its graphs through the QNN system library (--qnn-lib-dir) */
static int inspect_qnn_binary(const char *path) {
    ma_error err = {0};
    if (ma_qnn_inspect(path, stdout, &err)) {
        fprintf(stderr, "molmoact inspect: %s\n", err.msg);
        return 1;
    }
    return 0;
}

/* a context directory: its files as the manifest lists them, with what each context carries */
static int inspect_context_dir(const char *path) {
    ma_error err = {0};
    ma_manifest mf;
    if (ma_manifest_load(path, &mf, &err)) return fail(&err);
    printf("%s: a context directory (molmoact compile), %d files\n", path, mf.n);
    printf("  %-28s %-15s %-9s %-7s %-8s %-10s %-17s %s\n", "file", "component", "precision", "compute", "prompt", "layers", "compile", "size");
    char fingerprint[24] = "";
    double total = 0;
    for (int i = 0; i < mf.n; i++) {
        const ma_manifest_entry *e = &mf.e[i];
        total += (double)e->bytes;
        char *fp = ma_path_join(path, e->name);
        ma_gguf g;
        if (!e->compile_id[0] || !fp || ma_gguf_open(&g, fp, NULL) != MA_OK) {
            printf("  %-28s %-15s %-9s %-7s %-8s %-10s %-17s %.1f MiB\n", e->name, e->compile_id[0] ? "(unreadable)" : "host file", "", "", "", "",
                   e->compile_id[0] ? e->compile_id : "", (double)e->bytes / 1048576.0);
            free(fp);
            continue;
        }
        char comp[32] = "", prec[16] = "", seq[16] = "", layers[24] = "", compute[8] = "";
        int64_t v, a, b;
        ma_gguf_get_str(&g, "molmoact.component", comp, sizeof comp, NULL);
        ma_gguf_get_str(&g, "molmoact.precision", prec, sizeof prec, NULL);
        if (ma_gguf_get_str(&g, "molmoact.compute", compute, sizeof compute, NULL) != MA_OK && strcmp(comp, "embed"))
            snprintf(compute, sizeof compute, "fp32"); /* compiled before compute plans */
        if (!fingerprint[0]) ma_gguf_get_str(&g, "molmoact.source_fingerprint", fingerprint, sizeof fingerprint, NULL);
        if (ma_gguf_get_i64(&g, "molmoact.prompt_seq", &v, NULL) == MA_OK) snprintf(seq, sizeof seq, "%lld", (long long)v);
        if (ma_gguf_get_i64(&g, "molmoact.layer_first", &a, NULL) == MA_OK && ma_gguf_get_i64(&g, "molmoact.layer_last", &b, NULL) == MA_OK)
            snprintf(layers, sizeof layers, "%lld-%lld", (long long)a, (long long)b - 1);
        printf("  %-28s %-15s %-9s %-7s %-8s %-10s %-17s %.1f MiB\n", e->name, comp, prec, compute, seq, layers, e->compile_id,
               (double)e->bytes / 1048576.0);
        ma_gguf_close(&g);
        free(fp);
    }
    printf("total %.2f GiB; source checkpoint fingerprint %s\n", total / 1073741824.0, fingerprint[0] ? fingerprint : "?");
    printf("(molmoact inspect DIR/FILE.gguf lists a context's tensors; which files a run opens: MOLMOACT_*_CTX_SUFFIX)\n");
    return 0;
}

static int cmd_inspect(const char *path) {
    ma_error err = {0};
    if (ma_is_dir(path) && ma_is_context_dir(path)) return inspect_context_dir(path);
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
    } else if (mf.size >= 6 && !memcmp(mf.data, "\x93NUMPY", 6)) {
        ma_tensor t;
        ma_status st = ma_npy_parse(mf.data, mf.size, path, &t, &err);
        ma_unmap_file(&mf);
        if (st) return fail(&err);
        printf("%s: .npy, %s ", path, ma_dtype_name(t.dtype));
        print_shape(t.ndim, t.shape);
        printf("\n");
        ma_tensor_free(&t);
    } else if (!(mf.size >= 9 && mf.data[8] == '{')) {
        /* a safetensors file begins with its header's length and '{' */
        const size_t nl = strlen(path);
        ma_unmap_file(&mf);
        if (nl > 4 && !strcmp(path + nl - 4, ".bin")) return inspect_qnn_binary(path);
        fprintf(stderr, "molmoact inspect: %s is not a file inspect reads (GGUF, safetensors, .npz, .npy, a QNN context binary .bin, "
                        "or a checkpoint or context directory)\n", path);
        return 1;
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
    /* a prompt needs the configuration, the statistics and the tokenizer, not the weights: the
     * embedding part only (as the resident engine's host opens), unmerged LoRA adapters accepted */
    if (ma_model_open_parts(o->model, o->norm_tag, MA_PART_EMBED | MA_PART_LORA_OK, &m, &err)) return fail(&err);
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

/* ---------------------------------------------------------------------------------- tokenize */

static int cmd_tokenize(const char *path, int decode) {
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

/* ---------------------------------------------------------------------------------- commands */

static int cmd_run_a(cli_args *a) {
    opts o;
    if (opts_from(a, &o) || session_env(a)) return 1;
    return cmd_run(&o);
}

static int cmd_bench_a(cli_args *a) {
    opts o;
    if (opts_from(a, &o) || session_env(a)) return 1;
    if (o.cold && !o.session) { fprintf(stderr, "molmoact bench: --cold times one session: give --session NAME\n"); return 1; }
    return cmd_bench(&o);
}

static int cmd_parity_a(cli_args *a) {
    opts o;
    if (opts_from(a, &o) || session_env(a)) return 1;
    return cmd_parity(&o);
}

static int cmd_prompt_a(cli_args *a) {
    opts o;
    if (opts_from(a, &o) || session_env(a)) return 1;
    return cmd_prompt(&o);
}

static int cmd_preprocess_a(cli_args *a) {
    opts o;
    if (opts_from(a, &o) || session_env(a)) return 1;
    return cmd_preprocess(&o);
}

/* --compute PLAN: "fp32" / "bf16" for every component, or COMPONENT=PLAN[,...] (vision, llm,
 * action); a component it names counts as given for --suffix */
static int parse_compute(const char *v, ma_compile_opts *co) {
    static char buf[128];
    static const char *names[3] = {"vision", "llm", "action"};
    static const unsigned bits[3] = {MA_COMPILE_SUFFIX_VISION, MA_COMPILE_SUFFIX_LLM, MA_COMPILE_SUFFIX_ACTION};
    if (!strcmp(v, "fp32") || !strcmp(v, "bf16")) {
        for (int c = 0; c < 3; c++) co->compute[c] = !strcmp(v, "bf16") ? "bf16" : "fp32";
        return 0;
    }
    if (strlen(v) >= sizeof buf) { fprintf(stderr, "molmoact compile: --compute %.40s...: too long\n", v); return 1; }
    snprintf(buf, sizeof buf, "%s", v);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(t, '=');
        int c = -1;
        if (eq) {
            *eq = '\0';
            for (int i = 0; i < 3; i++)
                if (!strcmp(t, names[i])) c = i;
        }
        if (c < 0 || (strcmp(eq + 1, "fp32") && strcmp(eq + 1, "bf16"))) {
            fprintf(stderr, "molmoact compile: --compute %s: must be fp32, bf16, or COMPONENT=PLAN[,...] with COMPONENT vision, llm or action and "
                            "PLAN fp32 or bf16\n", v);
            return 1;
        }
        co->compute[c] = !strcmp(eq + 1, "bf16") ? "bf16" : "fp32";
        co->suffixed |= bits[c];
    }
    return 0;
}

static int cmd_compile_a(cli_args *a) {
    ma_compile_opts co = {"f16", "f16", "f16", "", 0, 128, 0, {NULL}, {NULL}, {NULL, NULL, NULL}, 0, {NULL}};
    if (session_env(a)) return 1;
    const char *env = ma_env("MOLMOACT_PROMPT_SEQ");
    if (env && *env) co.prompt_seq = atoi(env); /* a plain decimal in range: session_env's ma_env_check refused others */
    if (a->given[O_PROMPT_SEQ]) co.prompt_seq = (int)a->i[O_PROMPT_SEQ];
    if (a->given[O_VISION]) { co.vision = a->str[O_VISION]; co.suffixed |= MA_COMPILE_SUFFIX_VISION; }
    if (a->given[O_LLM]) { co.llm = a->str[O_LLM]; co.suffixed |= MA_COMPILE_SUFFIX_LLM; }
    if (a->given[O_ACTION]) { co.action = a->str[O_ACTION]; co.suffixed |= MA_COMPILE_SUFFIX_ACTION; }
    if (a->given[O_SUFFIX]) {
        co.suffix = a->str[O_SUFFIX];
        if (!co.suffixed && co.suffix[0]) {
            fprintf(stderr, "molmoact compile: --suffix %s names the files of the components given with --vision, --llm or --action: give at least one\n", co.suffix);
            return 1;
        }
    }
    static char keep[CLI_MAX_LIST][256];
    for (int k = 0; k < a->nlist[O_KEEP]; k++) {
        const char *v = a->list[O_KEEP][k];
        snprintf(keep[k], sizeof keep[k], "%s", v);
        char *eq = strrchr(keep[k], '=');
        if (!eq || strlen(v) >= sizeof keep[k] || k >= MA_COMPILE_MAX_KEEP) {
            fprintf(stderr, "molmoact compile: --keep %s: must be PATTERN=P (at most %d)\n", v, MA_COMPILE_MAX_KEEP);
            return 1;
        }
        *eq = '\0';
        co.keep_pattern[co.n_keep] = keep[k];
        co.keep_prec[co.n_keep++] = eq + 1;
    }
    if (a->given[O_COMPUTE] && parse_compute(a->str[O_COMPUTE], &co)) return 1;
    for (int k = 0; k < a->nlist[O_COMPUTE_KEEP]; k++) {
        if (k >= MA_COMPILE_MAX_KEEP) {
            fprintf(stderr, "molmoact compile: --compute-keep: at most %d patterns\n", MA_COMPILE_MAX_KEEP);
            return 1;
        }
        co.compute_keep[co.n_compute_keep++] = a->list[O_COMPUTE_KEEP][k];
    }
    const char *src = a->pos[0], *out = a->str[O_OUT];
    if (!out) { fprintf(stderr, "molmoact compile: give the output directory with -o CTX_DIR\n"); return 1; }
    if (!ma_is_dir(src)) { fprintf(stderr, "molmoact compile: %s is not a directory\n", src); return 1; }
    ma_error err = {0};
    if (ma_compile(src, out, &co, &err)) return fail(&err);
    printf("compiled %s -> %s (vision %s, llm %s, action %s, prompt length %d%s%s)\n", src, out, co.vision, co.llm, co.action,
           co.prompt_seq, co.suffix[0] ? ", suffix " : "", co.suffix);
    return 0;
}

static int cmd_serve_a(cli_args *a) {
    ma_serve_opts so = {NULL, "127.0.0.1", 8000, NULL, 32.0, 512, "libero", 0, 0, 0, 30, "/proc/self/exe", 300, 0, 0};
    if (session_env(a)) return 1;
    so.model_dir = a->str[O_MODEL];
    if (a->given[O_HOST]) so.host = a->str[O_HOST];
    if (a->given[O_PORT]) so.port = (int)a->i[O_PORT];
    so.api_key_file = a->str[O_API_KEY_FILE];
    if (a->given[O_MAX_MESSAGE_MB]) so.max_message_mb = a->r[O_MAX_MESSAGE_MB];
    if (a->given[O_MAX_CLIENTS]) so.max_clients = (int)a->i[O_MAX_CLIENTS];
    if (a->given[O_NORM_TAG]) so.norm_tag = a->str[O_NORM_TAG];
    if (a->given[O_THREADS]) so.threads = (int)a->i[O_THREADS];
    if (a->given[O_RECV_TIMEOUT]) so.recv_timeout_s = (int)a->i[O_RECV_TIMEOUT];
    if (a->given[O_IDLE_TIMEOUT]) so.idle_timeout_s = (int)a->i[O_IDLE_TIMEOUT];
    so.have_seed = a->given[O_SEED];
    so.seed = a->u[O_SEED];
    so.inproc = a->given[O_INPROC];
    so.flip180 = a->given[O_FLIP180];
    if (!so.model_dir) { fprintf(stderr, "molmoact serve: give the model with --model DIR\n"); return 1; }
    if (!a->given[O_QUIET]) setenv("MOLMOACT_OPEN_PROGRESS", "1", 1); /* the workers' start, as progress lines */
    if (!*so.model_dir || !ma_is_dir(so.model_dir)) { fprintf(stderr, "molmoact serve: --model %s is not a directory\n", so.model_dir); return 1; }
    return ma_serve(&so);
}

static int cmd_tokenize_a(cli_args *a) {
    if (!a->str[O_TOKENIZER]) { fprintf(stderr, "molmoact tokenize: give the tokenizer with --tokenizer FILE\n"); return 1; }
    return cmd_tokenize(a->str[O_TOKENIZER], a->given[O_DECODE]);
}

static int cmd_inspect_a(cli_args *a) {
    if (session_env(a)) return 1;
    if (a->given[O_QNN_LIB_DIR]) setenv("MOLMOACT_QNN_LIB_DIR", a->str[O_QNN_LIB_DIR], 1);
    return cmd_inspect(a->pos[0]);
}

static int cmd_version_a(cli_args *a) {
    (void)a;
    printf("molmoact %s (kernels: %s; %s)\n", molmoact_version(), ma_gemm_kernels(), "Apache-2.0");
    return 0;
}

static const cli_cmd *find_cmd(const char *name) {
    for (int i = 0; i < N_CMDS; i++)
        if (!strcmp(CMDS[i].name, name)) return &CMDS[i];
    return NULL;
}

static int unknown_command(const char *name) {
    const char *names[N_CMDS];
    for (int i = 0; i < N_CMDS; i++) names[i] = CMDS[i].name;
    const char *near = cli_nearest(name, names, N_CMDS);
    if (near) fprintf(stderr, "molmoact: unknown command %s (did you mean %s? `molmoact help` lists the commands)\n", name, near);
    else fprintf(stderr, "molmoact: unknown command %s (`molmoact help` lists the commands)\n", name);
    return 1;
}

static int cmd_help_a(cli_args *a) {
    if (a->given[O_MARKDOWN]) {
        static const int session[] = {O_NORM_TAG, O_THREADS, O_BASE, O_BACKEND, O_QNN_LIB_DIR, O_QNN_IO_MAP, O_QNN_SOC, O_QNN_ARCH,
                                      O_QNN_PERF, O_QNN_ZERO_COPY, O_PRELOAD, O_VERBOSE, O_QUIET};
        cli_print_markdown(stdout, OPTS, CMDS, N_CMDS, session, (int)(sizeof session / sizeof session[0]));
        return 0;
    }
    if (!a->npos) { cli_print_overview(stdout, CMDS, N_CMDS); return 0; }
    if (!strcmp(a->pos[0], "env") || !strcmp(a->pos[0], "environment")) {
        printf("environment variables (molmoact help COMMAND shows those a command reads):\n");
        cli_print_env(stdout, NULL);
        return 0;
    }
    const cli_cmd *c = find_cmd(a->pos[0]);
    if (!c) return unknown_command(a->pos[0]);
    cli_print_command_help(stdout, OPTS, c);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) { cli_print_overview(stderr, CMDS, N_CMDS); return 1; }
    const char *name = argv[1];
    if (!strcmp(name, "__worker")) { /* a resident worker process, started by the orchestrator */
        if (argc != 7) { fprintf(stderr, "molmoact: __worker is started by molmoact run, not by hand\n"); return 2; }
        /* A qnn worker's ADSP_LIBRARY_PATH (where FastRPC finds the HTP skel), defaulted to
         * --qnn-lib-dir when neither it nor DSP_LIBRARY_PATH is set, as onnxruntime does for its
         * own process (ma_qnn_worker_adsp_path). Set here by the program, not by the library (which
         * never touches the environment): this process has no other thread yet and has loaded
         * nothing, and the value reaches nothing but this worker. */
        char adsp[4096];
        if (ma_qnn_worker_adsp_path(adsp, sizeof adsp)) setenv("ADSP_LIBRARY_PATH", adsp, 1);
        return ma_worker_main(atoi(argv[2]), argv[3], argv[4], (unsigned)strtoul(argv[5], NULL, 10), atoi(argv[6]));
    }
    if (!strcmp(name, "--help") || !strcmp(name, "-h")) { cli_print_overview(stdout, CMDS, N_CMDS); return 0; }
    if (!strcmp(name, "--version") || !strcmp(name, "-V")) return cmd_version_a(NULL);
    const cli_cmd *c = find_cmd(name);
    if (!c) return unknown_command(name);
    ma_keep_freed_memory();
    cli_args *a = calloc(1, sizeof *a);
    if (!a) return 1;
    int rc = cli_parse(OPTS, O_COUNT, c, argc, argv, 2, a);
    if (rc == 2) rc = 0; /* --help */
    else if (rc == 0) rc = c->run(a);
    free(a);
    return rc;
}
