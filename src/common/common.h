/* SPDX-License-Identifier: Apache-2.0 */
/* What several commands of the molmoact program share (tools/): the settings of a run, the
 * options of run, bench, parity, prompt and preprocess, the demo model, inference through the
 * public API and the lines that say what ran. The static library molmoact_common, linked by the
 * program only (never part of libmolmoact.so); it knows no option ids (tools/options.h has the
 * option table) and no command. */
#ifndef MA_COMMON_H
#define MA_COMMON_H

#include <stdint.h>

#include "molmoact.h"
#include "core/settings.h"
#include "runtime/engine.h"
#include "runtime/pipeline.h"
#include "runtime/request.h"
#include "runtime/trace.h"
#include "backend/backends.h"

/* the options of run, bench, parity, prompt and preprocess (from the command line by opts_from,
 * tools/options.h) */
typedef struct {
    const char *model, *golden, *inputs, *out, *dump, *norm_tag, *image0, *image1, *task, *state, *noise, *session;
    uint64_t seed;
    int have_seed, json, runs, stream, inproc, threads, cold;
    double gate;
    /* run --rtc-*: real-time chunking toward the leftover in rtc_prefix (.npy), else none */
    const char *rtc_prefix;
    int rtc_delay, rtc_horizon, rtc_schedule; /* 0: 10 for the horizon; MOLMOACT_RTC_* */
    float rtc_beta;                           /* 0: 10 */
} opts;

/* The settings of this run (core/settings.h): the environment's, through the one table
 * (`molmoact help env`), then the command line's options over them, each checked and named in an
 * error as the user wrote it. Passed down as an argument: to the API's open for run, bench and
 * serve (which then read no environment of their own), to the model, compile and inspect. */
extern ma_settings SET;

/* the engine options of the API carrying st (the strings point into it) */
void options_from_settings(const ma_settings *st, molmoact_options *o);
/* the backend SET names, from the registry */
const ma_backend *settings_backend(void);

/* "molmoact: MESSAGE" on stderr; returns 1 */
int fail(const ma_error *e);

/* the request source of the options, and the demo when there is no --model (request_setup:
 * returns 1 when the demo is used, -1 (said on stderr) when there is none) */
void request_src_of(const opts *o, ma_request_src *src);
int request_setup(opts *o, ma_request_src *src, int golden_observation);

/* "inproc" or "resident, 6 worker processes" */
const char *mode_name(const ma_engine *e);
/* what ran (backend, kernels, threads, precision and compute plans), and the peak memory: a line,
 * or with json the members of the object being printed */
void print_plan(const ma_engine *e, int json);
void print_memory(const ma_engine *e, int json);

/* inference through the public API (include/molmoact.h), linked statically: api_open and
 * api_close return 0 or 1 (said on stderr); api_run with a trace records every intermediate */
int api_open(const opts *o, molmoact **out);
ma_status api_run(molmoact *api, const ma_request *q, ma_result *out, ma_timing *t, ma_trace *trace, ma_error *err);
int api_close(molmoact **api);

#endif
