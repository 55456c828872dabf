/* SPDX-License-Identifier: Apache-2.0 */
/* The option table and the command table of the molmoact program (options.h): each option once,
 * each command with the options it takes and its entry function (commands.h). */
#define _POSIX_C_SOURCE 200809L
#include "options.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"
#include "core/env.h"
#include "core/progress.h"
#include "io/mapfile.h"
#include "kernels/kernels.h"
#include "model/checkpoint.h"

_Static_assert(O_COUNT <= CLI_MAX_OPTS, "cli_args holds CLI_MAX_OPTS options");
const cli_opt OPTS[O_COUNT] = {
    [O_MODEL] = {"--model", NULL, "DIR", CLI_STR, 0, 0,
                 "a Hugging Face checkpoint directory, a LeRobot policy directory or a context directory (molmoact compile)"},
    [O_BASE] = {"--base", NULL, "DIR", CLI_STR, 0, 0,
                "the Hugging Face base directory of a LeRobot policy (default: found in the Hugging Face hub cache)"},
    [O_GOLDEN] = {"--golden", NULL, "DIR", CLI_STR, 0, 0, "a golden directory (reference/make_golden.py): the parity table against it"},
    [O_INPUTS] = {"--inputs", NULL, "IN.npz", CLI_STR, 0, 0,
                  "the observation as arrays: pixels or image0/image1, input_ids or task + state, optional noise"},
    [O_OUT] = {"--out", "-o", "OUT.npz", CLI_STR, 0, 0, "write the actions [10, 7] and the trajectory [10, 32]"},
    [O_DUMP] = {"--dump", NULL, "DIR", CLI_STR, 0, 0, "write every intermediate of the first run to DIR/intermediates.npz"},
    [O_NORM_TAG] = {"--norm-tag", NULL, "TAG", CLI_STR, 0, 0, "the norm_stats.json entry to normalise with (default libero)"},
    [O_IMAGE0] = {"--image0", NULL, "FILE", CLI_STR, 0, 0, "the first camera frame (PNG or JPEG)"},
    [O_IMAGE1] = {"--image1", NULL, "FILE", CLI_STR, 0, 0, "the second camera frame (PNG or JPEG)"},
    [O_TASK] = {"--task", NULL, "TEXT", CLI_STR, 0, 0, "the task sentence"},
    [O_STATE] = {"--state", NULL, "S0,..,S7", CLI_STR, 0, 0,
                 "the proprio state: comma-separated decimal numbers (spaces allowed after the commas)"},
    [O_NOISE] = {"--noise", NULL, "FILE", CLI_STR, 0, 0, "the initial noise [1, 10, 32]: an .npy, or an .npz holding noise"},
    [O_SEED] = {"--seed", NULL, "N", CLI_U64, 0, 0, "the noise from torch.randn with this seed (default 0)"},
    [O_SESSION] = {"--session", NULL, "NAME", CLI_STR, 0, 0, "one session in process: vision, llm_split0..3, action_context, action_step"},
    [O_JSON] = {"--json", NULL, NULL, CLI_FLAG, 0, 0, "print one JSON object instead of tables"},
    [O_STREAM] = {"--stream", NULL, NULL, CLI_FLAG, 0, 0,
                  "read IN.npz paths (optionally a tab and OUT.npz) from stdin, one JSON line per observation"},
    [O_INPROC] = {"--inproc", NULL, NULL, CLI_FLAG, 0, 0, "run every session in this process instead of six resident workers"},
    [O_COLD] = {"--cold", NULL, NULL, CLI_FLAG, 0, 0,
                "flush the session's weights from every cache level before each run (a context directory)"},
    [O_RUNS] = {"--runs", NULL, "N", CLI_INT, 1, 1000000, "requests of the same observation"},
    [O_THREADS] = {"--threads", NULL, "N", CLI_INT, 1, 64,
                   "GEMM threads per process (default: the cores this process may use; MOLMOACT_THREADS)"},
    [O_GATE] = {"--gate", NULL, "G", CLI_REAL, 1e-9, 1,
                "the cosine gate (default: by precision, 0.9999 for f16/bf16/f32 weights, 0.999 for q8_0, 0.99 for q4_0)"},
    [O_BACKEND] = {"--backend", NULL, "cpu|qnn", CLI_STR, 0, 0,
                   "where the sessions run (default cpu; qnn: QNN HTP context binaries, docs/QNN.md)"},
    [O_QNN_LIB_DIR] = {"--qnn-lib-dir", NULL, "DIR", CLI_STR, 0, 0, "qnn: the directory of libQnnHtp.so and libQnnSystem.so"},
    [O_QNN_IO_MAP] = {"--qnn-io-map", NULL, "MAP.json", CLI_STR, 0, 0, "qnn: {session: {our tensor name: graph tensor name}}"},
    [O_QNN_SOC] = {"--qnn-soc", NULL, "N", CLI_U64, 1, 4294967295.0,
                   "qnn: the SoC model sent as a device config (none unless given; 77 on the IQ-9075)"},
    [O_QNN_ARCH] = {"--qnn-arch", NULL, "N", CLI_U64, 1, 4294967295.0,
                    "qnn: the HTP architecture sent as a device config (none unless given; 73 on the IQ-9075)"},
    [O_PRELOAD] = {"--preload", NULL, NULL, CLI_FLAG, 0, 0,
                   "read every context in at open and run one warm-up request, so the first real request runs warm"},
    [O_VISION] =
        {"--vision", NULL, "P", CLI_STR, 0, 0,
         "the vision encoder's precision: f16 (default), bf16 (lossy from an f16 or fp32 checkpoint: gated end to end at 0.999 then), q8_0, q4_0"},
    [O_LLM] = {"--llm", NULL, "P", CLI_STR, 0, 0, "the LLM's precision (the four splits)"},
    [O_ACTION] = {"--action", NULL, "P", CLI_STR, 0, 0, "the action expert's precision (action_context and action_step)"},
    [O_SUFFIX] =
        {"--suffix", NULL, "S", CLI_STR, 0, 0,
         "name the files of the components given with --vision/--llm/--action vision{S}.gguf, llm_split0..3{S}.gguf, action_step{S}.gguf (picked at run time by MOLMOACT_*_CTX_SUFFIX=S); the other files keep their names"},
    [O_PROMPT_SEQ] = {"--prompt-seq", NULL, "N", CLI_INT, 1, MA_MAX_PROMPT_SEQ,
                      "the prompt length the static graphs are built for, recorded in the contexts (default 128, or MOLMOACT_PROMPT_SEQ)"},
    [O_COMPUTE] =
        {"--compute", NULL, "PLAN", CLI_STR, 0, 0,
         "how products are computed: fp32 (default), bf16 (operands rounded to bf16, sums in fp32: AMX or AVX512-BF16 where the CPU has them, else fp32), f16 (operands rounded to f16, summed in f16 per 32 products then in fp32: aarch64 CPUs with FP16 arithmetic such as the A78AE, else fp32; f16 weights up to |w| 64), or auto (bf16 where this CPU's bf16 unit pays and the weights are not int8, which keep their int8 kernels unless the CPU has AMX; says which and why), for every component or per component, e.g. --compute vision=bf16,llm=bf16"},
    [O_COMPUTE_KEEP] = {"--compute-keep", NULL, "PATTERN", CLI_LIST, 0, 0,
                        "matrices whose checkpoint name matches the glob PATTERN computed in fp32 in a bf16 or f16 component (repeatable)"},
    [O_KEEP] =
        {"--keep", NULL, "PATTERN=P", CLI_LIST, 0, 0,
         "matrices whose checkpoint name matches the glob PATTERN stored in P where P is more precise (repeatable), e.g. --keep '*scout_mlp*=f16'"},
    [O_QUIET] = {"--quiet", "-q", NULL, CLI_FLAG, 0, 0, "no progress lines (compile; the workers' start with --preload and in serve)"},
    [O_HOST] = {"--host", NULL, "ADDR", CLI_STR, 0, 0, "the address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)"},
    [O_PORT] = {"--port", NULL, "N", CLI_INT, 0, 65535, "the port (default 8000; 0: any free port, printed at start)"},
    [O_API_KEY_FILE] = {"--api-key-file", NULL, "FILE", CLI_STR, 0, 0,
                        "require this key (Authorization: Api-Key KEY, or Bearer KEY) on every request but /healthz and /health"},
    [O_MAX_MESSAGE_MB] = {"--max-message-mb", NULL, "MB", CLI_REAL, 1.0 / 1024, 4096,
                          "the largest request body or websocket message (default 32)"},
    [O_MAX_INPUT_MB] = {"--max-input-mb", NULL, "MB", CLI_REAL, 1.0 / 1024, 65536,
                        "every client's request data being received, together (default 128; a request over it: 503 / close 1013)"},
    [O_MAX_QUEUED_MB] = {"--max-queued-mb", NULL, "MB", CLI_REAL, 1.0 / 1024, 65536,
                         "the bodies of requests queued for or in inference, together (default 128; over it: 503 / close 1013)"},
    [O_MAX_OUTPUT_KB] = {"--max-output-kb", NULL, "KB", CLI_INT, 16, 1048576,
                         "unsent replies a websocket client may leave unread before the server stops reading it (default 256)"},
    [O_MAX_HEAD_KB] =
        {"--max-head-kb", NULL, "KB", CLI_INT, 4, 1024,
         "each HTTP connection's buffer: its request's line and header fields (larger: 431), what is read ahead of them (default 16)"},
    [O_MAX_CLIENTS] = {"--max-clients", NULL, "N", CLI_INT, 1, 100000, "connections at once (default 512; /healthz is answered beyond it)"},
    [O_RECV_TIMEOUT] = {"--recv-timeout-s", NULL, "S", CLI_INT, 1, 3600,
                        "the deadline for one whole request or message to arrive (default 30)"},
    [O_IDLE_TIMEOUT] =
        {"--idle-timeout-s", NULL, "S", CLI_INT, 0, 86400,
         "close a websocket or gRPC connection idle between requests this long (default 300; 0: never); an idle HTTP keep-alive connection closes after --recv-timeout-s"},
    [O_FLIP180] = {"--flip180", NULL, NULL, CLI_FLAG, 0, 0, "rotate every camera frame by 180 degrees (LIBERO's renders are upside down)"},
    [O_TOKENIZER] = {"--tokenizer", NULL, "FILE", CLI_STR, 0, 0, "a tokenizer.json"},
    [O_DECODE] = {"--decode", NULL, NULL, CLI_FLAG, 0, 0, "read id arrays and print the decoded strings"},
    [O_MARKDOWN] = {"--markdown", NULL, NULL, CLI_FLAG, 0, 0, "print the README's command list and environment table"},
    [O_QNN_PERF] =
        {"--qnn-perf", NULL, "default|high|burst", CLI_STR, 0, 0,
         "qnn: the HTP power vote (default: none; high: TURBO corner, 100 us sleep latency; burst: the highest corner, 40 us, RPC polling)"},
    [O_QNN_ZERO_COPY] =
        {"--qnn-zero-copy", NULL, NULL, CLI_FLAG, 0, 0,
         "qnn: the graphs' tensors in rpcmem buffers registered with the contexts (libcdsprpc.so), no copies into client buffers"},
    [O_VERBOSE] = {"--verbose", "-v", NULL, CLI_FLAG, 0, 0, "say more at open: each QNN context binary's graph count and names"},
    [O_GRPC_PORT] = {"--grpc-port", NULL, "N", CLI_INT, 0, 65535,
                     "serve LeRobot's async inference (gRPC, transport.AsyncInference) on this port too (default: off; 0: any free port)"},
    [O_GRPC_HOST] = {"--grpc-host", NULL, "ADDR", CLI_STR, 0, 0, "the address of --grpc-port (default: --host's)"},
    [O_FPS] = {"--fps", NULL, "HZ", CLI_REAL, 1e-3, 1000,
               "the robot's control rate: LeRobot's action timestamps (timestamp + i / fps) and delays in control ticks (default 30)"},
    [O_LEROBOT_POLICY_TYPES] = {"--lerobot-policy-types", NULL, "LIST", CLI_STR, 0, 0,
                                "the policy_type names a LeRobot client may ask for, comma-separated (default molmoact2)"},
    [O_LEROBOT_OBS_TIMEOUT] =
        {"--lerobot-obs-timeout-s", NULL, "S", CLI_REAL, 1e-3, 3600,
         "how long GetActions waits for an observation before an empty reply (default 2, LeRobot's obs_queue_timeout)"},
    [O_LEROBOT_SIMILARITY] =
        {"--lerobot-similarity-atol", NULL, "X", CLI_REAL, 0, 1e9,
         "LeRobot's similarity filter: drop an observation whose state is within X (L2) of the last one run, unless must_go (default 0: off)"},
    [O_MAX_SESSIONS] = {"--max-sessions", NULL, "N", CLI_INT, 1, 100000,
                        "HTTP session_id timelines kept, least recently used dropped first (default 64)"},
    [O_SESSION_TTL] = {"--session-ttl-s", NULL, "S", CLI_INT, 1, 604800, "an HTTP session idle this long is forgotten (default 300)"},
    [O_RTC] =
        {"--rtc", NULL, NULL, CLI_FLAG, 0, 0,
         "real-time chunking for every session: each chunk guided toward the rows of the last one still to run (a request may ask itself)"},
    [O_RTC_HORIZON] = {"--rtc-horizon", NULL, "H", CLI_INT, 1, 4096, "RTC's execution horizon in rows (default 10)"},
    [O_RTC_BETA] = {"--rtc-beta", NULL, "B", CLI_REAL, 1e-6, 1e6, "RTC's maximum guidance weight (default 10)"},
    [O_RTC_SCHEDULE] = {"--rtc-schedule", NULL, "S", CLI_STR, 0, 0,
                        "RTC's prefix weights between the delay and the horizon: linear (default), exp, ones, zeros"},
    [O_RTC_LATENCY_PCT] = {"--rtc-latency-percentile", NULL, "Q", CLI_REAL, 0, 100,
                           "the inference delay is predicted from this percentile of the session's recent latencies (default 95)"},
    [O_RTC_PREFIX] = {"--rtc-prefix", NULL, "FILE", CLI_STR, 0, 0,
                      "RTC: the previous chunk's rows still to run, normalised (.npy float32 [rows, dim]): replays a guided server chunk"},
    [O_RTC_DELAY] = {"--rtc-delay", NULL, "D", CLI_INT, 0, 4096, "RTC: the inference delay in control ticks (with --rtc-prefix)"},
    [O_REVISION] = {"--revision", NULL, "REV", CLI_STR, 0, 0, "a branch, tag or commit (default main; or ORG/NAME@REV)"},
    [O_INCLUDE] = {"--include", NULL, "GLOB", CLI_LIST, 0, 0,
                   "only the files whose path matches GLOB ('*' crosses '/'; repeatable; default: every file)"},
    [O_CACHE_DIR] = {"--cache-dir", NULL, "DIR", CLI_STR, 0, 0,
                     "the hub cache to write (default: HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub)"},
    [O_TOKEN_FILE] = {"--token-file", NULL, "FILE", CLI_STR, 0, 0,
                      "read the Hub token from FILE (default: HF_TOKEN, then HF_TOKEN_PATH or $HF_HOME/token when present)"},
    [O_ENDPOINT] = {"--endpoint", NULL, "URL", CLI_STR, 0, 0,
                    "the Hub to download from (default: HF_ENDPOINT, else https://huggingface.co)"},
    [O_RETRIES] = {"--retries", NULL, "N", CLI_INT, 0, 100,
                   "tries again per file after a dropped connection or a 5xx, resuming (default 5)"},
    [O_MIN_FREE_MB] = {"--min-free-mb", NULL, "MB", CLI_REAL, 0, 1e12,
                       "refuse to start unless the cache keeps this much free after the download (default 100)"},
    [O_NO_BASE] = {"--no-base", NULL, NULL, CLI_FLAG, 0, 0, "for a LeRobot policy: not the base repo its checkpoint_path names too"},
};

/* the options of everything that opens a model and runs its sessions */
#define SESSION_USES                                                                                                               \
    {O_NORM_TAG, NULL, NULL}, {O_THREADS, NULL, NULL}, {O_BASE, NULL, NULL}, {O_BACKEND, NULL, NULL}, {O_QNN_LIB_DIR, NULL, NULL}, \
        {O_QNN_IO_MAP, NULL, NULL}, {O_QNN_SOC, NULL, NULL}, {O_QNN_ARCH, NULL, NULL}, {O_QNN_PERF, NULL, NULL},                   \
        {O_QNN_ZERO_COPY, NULL, NULL}, {O_PRELOAD, NULL, NULL}, {O_VERBOSE, NULL, NULL}, {                                         \
        O_QUIET, NULL, NULL                                                                                                        \
    }

/* the same options by id (SESSION_USES's order) */
const int SESSION_OPTS[] = {O_NORM_TAG, O_THREADS,  O_BASE,          O_BACKEND, O_QNN_LIB_DIR, O_QNN_IO_MAP, O_QNN_SOC,
                            O_QNN_ARCH, O_QNN_PERF, O_QNN_ZERO_COPY, O_PRELOAD, O_VERBOSE,     O_QUIET};
const int N_SESSION_OPTS = (int)(sizeof SESSION_OPTS / sizeof SESSION_OPTS[0]);

const cli_cmd CMDS[] = {
    {"pull",
     "ORG/NAME[@REV] [--include GLOB]... [options]",
     "Download a model or LeRobot policy from the Hugging Face Hub into its cache (shared with huggingface_hub and hf), each file's SHA-256 checked, and print the snapshot directory.",
     "A partial file is kept and resumed by the same command. For a LeRobot policy the base repo its checkpoint_path names is fetched too (config.json, tokenizer*, processor_config.json). docs/PULL.md says what it checks.",
     1,
     1,
     "pull",
     {{O_REVISION, NULL, NULL},
      {O_INCLUDE, NULL, NULL},
      {O_CACHE_DIR, NULL, NULL},
      {O_TOKEN_FILE, NULL, NULL},
      {O_ENDPOINT, NULL, NULL},
      {O_RETRIES, NULL, NULL},
      {O_MIN_FREE_MB, NULL, NULL},
      {O_NO_BASE, NULL, NULL},
      {O_QUIET, NULL, "no progress"}},
     cmd_pull_a},
    {"run",
     "[--model DIR] [(--inputs IN.npz | --image0 A --image1 B --state S --task T)] [options]",
     "Run one observation through the sessions (resident in six worker processes) and print the action chunk, the latency per component, peak memory and, with --golden, the parity table.",
     "Without --model: the demo model (assets/tiny-grid) and its golden observation. --golden DIR without an observation runs the golden's own. With --runs N the latency table is over the warm runs (2..N) and the first request is reported on its own line; every run must give the same chunk. Exit status: 0, 1 an error, 2 a failed parity gate, 3 (--stream) an observation failed, 128+N stopped by signal N.",
     0,
     0,
     "sessions",
     {{O_MODEL, NULL, "a Hugging Face checkpoint, LeRobot policy or context directory (default: the demo model, assets/tiny-grid)"},
      {O_INPUTS, NULL, NULL},
      {O_IMAGE0, NULL, NULL},
      {O_IMAGE1, NULL, NULL},
      {O_TASK, NULL, NULL},
      {O_STATE, NULL, NULL},
      {O_NOISE, NULL, NULL},
      {O_SEED, NULL, NULL},
      {O_RTC_PREFIX, NULL, NULL},
      {O_RTC_DELAY, NULL, NULL},
      {O_RTC_HORIZON, NULL, "RTC: the execution horizon in rows (with --rtc-prefix; default 10, clipped to the prefix's rows)"},
      {O_RTC_BETA, NULL, "RTC: the maximum guidance weight (with --rtc-prefix; default 10)"},
      {O_RTC_SCHEDULE, NULL,
       "RTC: the prefix weights between the delay and the horizon (with --rtc-prefix): linear (default), exp, ones, zeros"},
      {O_OUT, NULL, NULL},
      {O_DUMP, NULL, NULL},
      {O_GOLDEN, NULL, NULL},
      {O_GATE, NULL, NULL},
      {O_RUNS, NULL, "requests of the same observation (default 1)"},
      {O_STREAM, NULL, NULL},
      {O_INPROC, NULL, NULL},
      {O_JSON, NULL, NULL},
      SESSION_USES},
     cmd_run_a},
    {"bench",
     "[--model DIR] [--runs N] [--inputs IN.npz] [options]  |  --model DIR --session NAME --inputs IO.npz",
     "Time the pipeline on a synthetic LIBERO-like observation (or --inputs) after one warm-up request; or, with --session, one session in process on the arrays of IO.npz named as its inputs.",
     "Prints the latency table, the kernel set, the precision plan and the threads, peak memory and the time to open. Nothing asserts a time.",
     0,
     0,
     "sessions",
     {{O_MODEL, NULL, "a Hugging Face checkpoint, LeRobot policy or context directory (default: the demo model, assets/tiny-grid)"},
      {O_INPUTS, NULL, "IN.npz (pipeline) or IO.npz (--session: a golden's <session>_io.npz)"},
      {O_IMAGE0, NULL, NULL},
      {O_IMAGE1, NULL, NULL},
      {O_TASK, NULL, NULL},
      {O_STATE, NULL, NULL},
      {O_SEED, NULL, "the synthetic observation's and the noise's seed (default 0)"},
      {O_RUNS, NULL, "timed requests after the warm-up (default 5)"},
      {O_SESSION, NULL, NULL},
      {O_COLD, NULL, NULL},
      {O_INPROC, NULL, NULL},
      {O_JSON, NULL, NULL},
      SESSION_USES},
     cmd_bench_a},
    {"parity",
     "--model DIR --golden DIR [--gate G] [--json]",
     "Feed every session its golden inputs and print cosine, max |diff| and the share within 1e-3 x rms per output, then the end-to-end action cosine.",
     "Exit status 2 when the gate fails. For quantised contexts only the end-to-end actions are gated.",
     0,
     0,
     "sessions",
     {{O_MODEL, NULL, NULL}, {O_GOLDEN, NULL, NULL}, {O_GATE, NULL, NULL}, {O_JSON, NULL, NULL}, SESSION_USES},
     cmd_parity_a},
    {"compile",
     "SRC_DIR -o CTX_DIR [--vision P] [--llm P] [--action P] [--suffix S] [--prompt-seq N] [--keep PATTERN=P ...]",
     "Compile a checkpoint (Hugging Face or LeRobot directory; LoRA adapters merged) into one GGUF context per session plus the host files and manifest.json.",
     "Matrices are stored in the component's precision (f16, bf16, q8_0, q4_0), vectors in f32. A new directory appears whole; into an existing one the files are moved in only when all are written. A variant with --suffix is added beside the files already there: e.g. `molmoact compile SRC -o CTX --llm q4_0 --suffix _w4a16`, then `MOLMOACT_LLM_CTX_SUFFIX=_w4a16 molmoact run --model CTX`.",
     1,
     1,
     "compile",
     {{O_OUT, "CTX_DIR", "the output directory (created; or an existing one, the new files added)"},
      {O_VISION, NULL, NULL},
      {O_LLM, NULL, NULL},
      {O_ACTION, NULL, NULL},
      {O_SUFFIX, NULL, NULL},
      {O_PROMPT_SEQ, NULL, NULL},
      {O_KEEP, NULL, NULL},
      {O_COMPUTE, NULL, NULL},
      {O_COMPUTE_KEEP, NULL, NULL},
      {O_BASE, NULL, NULL},
      {O_THREADS, NULL, NULL},
      {O_QUIET, NULL, NULL}},
     cmd_compile_a},
    {"inspect",
     "FILE.gguf | FILE.safetensors | FILE.npz | FILE.bin | DIR",
     "Show what a file or directory holds: tensors, shapes and dtypes; a checkpoint's kind and the config fields this runtime ignores; a context directory's sessions, precisions, prompt length and compile; a QNN context binary's graphs.",
     NULL,
     1,
     1,
     "inspect",
     {{O_BASE, NULL, NULL}, {O_QNN_LIB_DIR, NULL, "for FILE.bin: the directory of libQnnSystem.so"}},
     cmd_inspect_a},
    {"tokenize",
     "--tokenizer tokenizer.json [--decode]",
     "Tokenise stdin, one JSON string per line, printing one id array per line (--decode: the reverse).",
     NULL,
     0,
     0,
     NULL,
     {{O_TOKENIZER, NULL, NULL}, {O_DECODE, NULL, NULL}},
     cmd_tokenize_a},
    {"prompt",
     "--model DIR",
     "Build the prompt ids of {\"task\": ..., \"state\": [...]} lines on stdin, one id array per line.",
     NULL,
     0,
     0,
     NULL,
     {{O_MODEL, NULL, NULL}, {O_NORM_TAG, NULL, NULL}, {O_BASE, NULL, NULL}},
     cmd_prompt_a},
    {"preprocess",
     "--model DIR --image0 FILE [-o OUT.npz]",
     "Decode a frame and write it, its 378x378 resize and the pixels the vision encoder takes (default preprocessed.npz).",
     NULL,
     0,
     0,
     NULL,
     {{O_MODEL, NULL, NULL}, {O_IMAGE0, NULL, NULL}, {O_OUT, NULL, "the output (default preprocessed.npz)"}, {O_BASE, NULL, NULL}},
     cmd_preprocess_a},
    {"serve",
     "--model DIR [--host ADDR] [--port N] [options]",
     "Serve robots on one port: the openpi websocket protocol (msgpack), HTTP POST /act (JSON, json_numpy), GET / (a status page), /healthz, /metrics (Prometheus).",
     "docs/SERVER.md describes the protocols, the keys and the replies. SIGTERM or SIGINT drains: requests in flight are answered, then it exits.",
     0,
     0,
     "sessions",
     {{O_MODEL, NULL, NULL},
      {O_HOST, NULL, NULL},
      {O_PORT, NULL, NULL},
      {O_API_KEY_FILE, NULL, NULL},
      {O_MAX_MESSAGE_MB, NULL, NULL},
      {O_MAX_INPUT_MB, NULL, NULL},
      {O_MAX_QUEUED_MB, NULL, NULL},
      {O_MAX_OUTPUT_KB, NULL, NULL},
      {O_MAX_HEAD_KB, NULL, NULL},
      {O_MAX_CLIENTS, NULL, NULL},
      {O_RECV_TIMEOUT, NULL, NULL},
      {O_IDLE_TIMEOUT, NULL, NULL},
      {O_SEED, NULL, "seed the generator that gives each request without noise or seed its own (default: seeded at random, logged)"},
      {O_FLIP180, NULL, NULL},
      {O_GRPC_PORT, NULL, NULL},
      {O_GRPC_HOST, NULL, NULL},
      {O_FPS, NULL, NULL},
      {O_LEROBOT_POLICY_TYPES, NULL, NULL},
      {O_LEROBOT_OBS_TIMEOUT, NULL, NULL},
      {O_LEROBOT_SIMILARITY, NULL, NULL},
      {O_MAX_SESSIONS, NULL, NULL},
      {O_SESSION_TTL, NULL, NULL},
      {O_RTC, NULL, NULL},
      {O_RTC_HORIZON, NULL, NULL},
      {O_RTC_BETA, NULL, NULL},
      {O_RTC_SCHEDULE, NULL, NULL},
      {O_RTC_LATENCY_PCT, NULL, NULL},
      {O_INPROC, NULL, NULL},
      SESSION_USES},
     cmd_serve_a},
    {"help",
     "[COMMAND [all] | env]",
     "This overview, a command's help (with all: the qnn backend's options and variables too, as COMMAND --help-all), or the environment variables.",
     NULL,
     0,
     2,
     NULL,
     {{O_MARKDOWN, NULL, NULL}},
     cmd_help_a},
    {"version", "", "Print the version.", NULL, 0, 0, NULL, {{O_END, NULL, NULL}}, cmd_version_a},
};
#define CMDS_N ((int)(sizeof CMDS / sizeof CMDS[0]))
const int N_CMDS = CMDS_N;

/* SET from the environment and the command line; 1 (said on stderr) when a value is refused */
int session_settings(const cli_args *a) {
    const char *name = a->cmd->name;
    ma_error err = {0};
    if (ma_settings_from_env(&SET, &err)) {
        fprintf(stderr, "molmoact %s: %s\n", name, err.msg);
        return 1;
    }
    const int qnn_opts = a->given[O_QNN_LIB_DIR] || a->given[O_QNN_IO_MAP] || a->given[O_QNN_SOC] || a->given[O_QNN_ARCH] ||
                         a->given[O_QNN_PERF] || a->given[O_QNN_ZERO_COPY];
    if (qnn_opts && strcmp(name, "inspect") && !a->given[O_BACKEND] && strcmp(SET.backend, "qnn")) {
        fprintf(stderr, "molmoact %s: the --qnn-* options need --backend qnn\n", name);
        return 1;
    }
    static const struct {
        int id;
        const char *key;
    } map[] = {{O_BACKEND, "backend"},
               {O_QNN_LIB_DIR, "qnn_lib_dir"},
               {O_QNN_IO_MAP, "qnn_io_map"},
               {O_QNN_PERF, "qnn_perf"},
               {O_BASE, "base_dir"}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (a->given[map[i].id] && ma_settings_set(&SET, map[i].key, a->str[map[i].id], OPTS[map[i].id].name, &err)) {
            fprintf(stderr, "molmoact %s: %s\n", name, err.msg);
            return 1;
        }
    if (a->given[O_THREADS]) SET.threads = (int)a->i[O_THREADS]; /* ranges checked by the option table */
    if (a->given[O_QNN_SOC]) SET.qnn_soc = (long)a->u[O_QNN_SOC];
    if (a->given[O_QNN_ARCH]) SET.qnn_arch = (long)a->u[O_QNN_ARCH];
    if (a->given[O_PROMPT_SEQ] && strcmp(name, "compile")) SET.prompt_seq = (int)a->i[O_PROMPT_SEQ];
    if (a->given[O_PRELOAD]) SET.preload = 1;
    if (a->given[O_QNN_ZERO_COPY]) SET.qnn_zero_copy = 1;
    if (a->given[O_VERBOSE]) SET.verbose = 1;
    if (a->given[O_BASE]) {
        struct stat st;
        const char *v = a->str[O_BASE];
        if (!*v || stat(v, &st) || !S_ISDIR(st.st_mode)) {
            fprintf(stderr, "molmoact %s: --base %s is not a directory\n", name, v);
            return 1;
        }
    }
    if (a->given[O_QUIET]) ma_progress_set_quiet(1);
    /* the kernel choices of this process (the workers make their own from their start message) */
    if (ma_kernels_configure(&SET, &err)) {
        fprintf(stderr, "molmoact %s: %s\n", name, err.msg);
        return 1;
    }
    return 0;
}

/* the options of run, bench, parity, prompt and preprocess; contradictions refused (--seed with
 * --noise, --inputs with raw-frame options or --stream) rather than one silently winning */
int opts_from(const cli_args *a, opts *o) {
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
    if (o->have_seed && o->noise) {
        fprintf(stderr, "molmoact %s: --seed and --noise contradict each other (give one)\n", name);
        return -1;
    }
    /* real-time chunking (run): the previous chunk's leftover and LeRobot's RTC settings */
    o->rtc_prefix = a->str[O_RTC_PREFIX];
    o->rtc_delay = a->given[O_RTC_DELAY] ? (int)a->i[O_RTC_DELAY] : 0;
    o->rtc_horizon = a->given[O_RTC_HORIZON] ? (int)a->i[O_RTC_HORIZON] : 0;
    o->rtc_beta = a->given[O_RTC_BETA] ? (float)a->r[O_RTC_BETA] : 0.0f;
    o->rtc_schedule = MOLMOACT_RTC_LINEAR;
    if (!o->rtc_prefix && (a->given[O_RTC_DELAY] || a->given[O_RTC_HORIZON] || a->given[O_RTC_BETA] || a->given[O_RTC_SCHEDULE])) {
        fprintf(stderr, "molmoact %s: --rtc-delay, --rtc-horizon, --rtc-beta and --rtc-schedule need --rtc-prefix FILE\n", name);
        return -1;
    }
    if (a->given[O_RTC_SCHEDULE]) {
        static const char *const names[] = {"linear", "exp", "ones", "zeros"}; /* MOLMOACT_RTC_* order */
        o->rtc_schedule = -1;
        for (int k = 0; k < 4; k++)
            if (!strcmp(a->str[O_RTC_SCHEDULE], names[k])) o->rtc_schedule = k;
        if (o->rtc_schedule < 0) {
            fprintf(stderr, "molmoact %s: --rtc-schedule %s: linear, exp, ones or zeros\n", name, a->str[O_RTC_SCHEDULE]);
            return -1;
        }
    }
    if (o->inputs && (o->image0 || o->image1 || o->task || o->state)) {
        fprintf(stderr, "molmoact %s: --inputs and --image0/--image1/--task/--state contradict each other (give one observation)\n", name);
        return -1;
    }
    if (o->stream && (o->inputs || o->image0 || o->image1 || o->task || o->state || o->out || o->dump || o->golden)) {
        fprintf(stderr,
                "molmoact %s: --stream reads its observations and output paths from stdin: it takes no --inputs, "
                "--image0/--image1/--task/--state, --out, --dump or --golden\n",
                name);
        return -1;
    }
    return 0;
}

const cli_cmd *find_cmd(const char *name) {
    for (int i = 0; i < CMDS_N; i++)
        if (!strcmp(CMDS[i].name, name)) return &CMDS[i];
    return NULL;
}

int unknown_command(const char *name) {
    const char *names[CMDS_N];
    for (int i = 0; i < CMDS_N; i++) names[i] = CMDS[i].name;
    const char *near = cli_nearest(name, names, CMDS_N);
    if (near) fprintf(stderr, "molmoact: unknown command %s (did you mean %s? `molmoact help` lists the commands)\n", name, near);
    else fprintf(stderr, "molmoact: unknown command %s (`molmoact help` lists the commands)\n", name);
    return 1;
}
