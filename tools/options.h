/* SPDX-License-Identifier: Apache-2.0 */
/* The command line of the molmoact program as data, in one place (tools/options.c): every option
 * (OPTS, by its O_* id) and every command with the options it takes (CMDS); common/cli.h parses
 * and prints help from them. opts_from and session_settings turn a command's parsed options into
 * common.h's opts and SET. */
#ifndef MA_TOOLS_OPTIONS_H
#define MA_TOOLS_OPTIONS_H

#include "common/cli.h"
#include "common/common.h"

/* option ids (0 ends a command's list) */
enum {
    O_END,
    O_MODEL,
    O_BASE,
    O_GOLDEN,
    O_INPUTS,
    O_OUT,
    O_DUMP,
    O_NORM_TAG,
    O_IMAGE0,
    O_IMAGE1,
    O_TASK,
    O_STATE,
    O_NOISE,
    O_SEED,
    O_SESSION,
    O_JSON,
    O_STREAM,
    O_INPROC,
    O_COLD,
    O_RUNS,
    O_THREADS,
    O_GATE,
    O_BACKEND,
    O_QNN_LIB_DIR,
    O_QNN_IO_MAP,
    O_QNN_SOC,
    O_QNN_ARCH,
    O_PRELOAD,
    O_VISION,
    O_LLM,
    O_ACTION,
    O_SUFFIX,
    O_PROMPT_SEQ,
    O_KEEP,
    O_COMPUTE,
    O_COMPUTE_KEEP,
    O_QUIET,
    O_HOST,
    O_PORT,
    O_API_KEY_FILE,
    O_MAX_MESSAGE_MB,
    O_MAX_INPUT_MB,
    O_MAX_QUEUED_MB,
    O_MAX_OUTPUT_KB,
    O_MAX_HEAD_KB,
    O_MAX_CLIENTS,
    O_RECV_TIMEOUT,
    O_IDLE_TIMEOUT,
    O_FLIP180,
    O_TOKENIZER,
    O_DECODE,
    O_MARKDOWN,
    O_QNN_PERF,
    O_QNN_ZERO_COPY,
    O_VERBOSE,
    O_GRPC_PORT,
    O_GRPC_HOST,
    O_FPS,
    O_LEROBOT_POLICY_TYPES,
    O_LEROBOT_OBS_TIMEOUT,
    O_LEROBOT_SIMILARITY,
    O_MAX_SESSIONS,
    O_SESSION_TTL,
    O_RTC,
    O_RTC_HORIZON,
    O_RTC_BETA,
    O_RTC_SCHEDULE,
    O_RTC_LATENCY_PCT,
    O_RTC_PREFIX,
    O_RTC_DELAY,
    O_REVISION,
    O_INCLUDE,
    O_CACHE_DIR,
    O_TOKEN_FILE,
    O_ENDPOINT,
    O_RETRIES,
    O_MIN_FREE_MB,
    O_NO_BASE,
    O_COUNT
};

extern const cli_opt OPTS[O_COUNT];
extern const cli_cmd CMDS[];
extern const int N_CMDS;
/* the options of everything that opens a model and runs its sessions (SESSION_USES), by id: the
 * group `molmoact help --markdown` prints once below its table */
extern const int SESSION_OPTS[];
extern const int N_SESSION_OPTS;

/* SET from the environment and the command line; 1 (said on stderr) when a value is refused */
int session_settings(const cli_args *a);
/* the options of run, bench, parity, prompt and preprocess; -1 (said on stderr) when refused */
int opts_from(const cli_args *a, opts *o);

/* the command of that name, or NULL; unknown_command says so (with the nearest name) and returns 1 */
const cli_cmd *find_cmd(const char *name);
int unknown_command(const char *name);

#endif
