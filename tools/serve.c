/* SPDX-License-Identifier: Apache-2.0 */
/* molmoact serve: robots on one port (src/server). */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "options.h"
#include "io/mapfile.h"
#include "server/server.h"

int cmd_serve_a(cli_args *a) {
    ma_serve_opts so;
    memset(&so, 0, sizeof so);
    so.host = "127.0.0.1";
    so.port = 8000;
    so.max_message_mb = 32.0;
    so.max_input_mb = 128.0;
    so.max_queued_mb = 128.0;
    so.max_output_kb = 256;
    so.max_head_kb = 16;
    so.max_clients = 512;
    so.recv_timeout_s = 30;
    so.idle_timeout_s = 300;
    if (session_settings(a)) return 1;
    if (!a->given[O_QUIET]) SET.progress = 1; /* the workers' start, as progress lines */
    molmoact_options_init(&so.engine);
    options_from_settings(&SET, &so.engine);
    so.engine.model_dir = a->str[O_MODEL];
    so.engine.norm_tag = a->given[O_NORM_TAG] ? a->str[O_NORM_TAG] : "libero";
    so.engine.inproc = a->given[O_INPROC];
    if (a->given[O_HOST]) so.host = a->str[O_HOST];
    if (a->given[O_PORT]) so.port = (int)a->i[O_PORT];
    so.api_key_file = a->str[O_API_KEY_FILE];
    if (a->given[O_MAX_MESSAGE_MB]) so.max_message_mb = a->r[O_MAX_MESSAGE_MB];
    if (a->given[O_MAX_INPUT_MB]) so.max_input_mb = a->r[O_MAX_INPUT_MB];
    if (a->given[O_MAX_QUEUED_MB]) so.max_queued_mb = a->r[O_MAX_QUEUED_MB];
    if (a->given[O_MAX_OUTPUT_KB]) so.max_output_kb = (int)a->i[O_MAX_OUTPUT_KB];
    if (a->given[O_MAX_HEAD_KB]) so.max_head_kb = (int)a->i[O_MAX_HEAD_KB];
    if (a->given[O_MAX_CLIENTS]) so.max_clients = (int)a->i[O_MAX_CLIENTS];
    if (a->given[O_RECV_TIMEOUT]) so.recv_timeout_s = (int)a->i[O_RECV_TIMEOUT];
    if (a->given[O_IDLE_TIMEOUT]) so.idle_timeout_s = (int)a->i[O_IDLE_TIMEOUT];
    /* the totals hold two messages at least unless given */
    if (!a->given[O_MAX_INPUT_MB] && so.max_input_mb < 2 * so.max_message_mb) so.max_input_mb = 2 * so.max_message_mb;
    if (!a->given[O_MAX_QUEUED_MB] && so.max_queued_mb < 2 * so.max_message_mb) so.max_queued_mb = 2 * so.max_message_mb;
    so.grpc_port = a->given[O_GRPC_PORT] ? (a->i[O_GRPC_PORT] ? (int)a->i[O_GRPC_PORT] : -1) : 0;
    so.grpc_host = a->str[O_GRPC_HOST];
    so.fps = a->given[O_FPS] ? a->r[O_FPS] : 30.0;
    so.lerobot_policy_types = a->str[O_LEROBOT_POLICY_TYPES];
    so.lerobot_obs_timeout_s = a->given[O_LEROBOT_OBS_TIMEOUT] ? a->r[O_LEROBOT_OBS_TIMEOUT] : 2.0;
    so.lerobot_similarity_atol = a->given[O_LEROBOT_SIMILARITY] ? a->r[O_LEROBOT_SIMILARITY] : 0.0;
    so.max_sessions = a->given[O_MAX_SESSIONS] ? (int)a->i[O_MAX_SESSIONS] : 64;
    so.session_ttl_s = a->given[O_SESSION_TTL] ? (int)a->i[O_SESSION_TTL] : 300;
    so.rtc.enabled = a->given[O_RTC];
    so.rtc.horizon = a->given[O_RTC_HORIZON] ? (int)a->i[O_RTC_HORIZON] : 10;
    so.rtc.beta = a->given[O_RTC_BETA] ? (float)a->r[O_RTC_BETA] : 10.0f;
    so.rtc.latency_percentile = a->given[O_RTC_LATENCY_PCT] ? a->r[O_RTC_LATENCY_PCT] : 95.0;
    so.rtc.schedule = MOLMOACT_RTC_LINEAR;
    if (a->given[O_RTC_SCHEDULE]) {
        static const char *const S[] = {"linear", "exp", "ones", "zeros"};
        so.rtc.schedule = -1;
        for (int k = 0; k < 4; k++)
            if (!strcmp(a->str[O_RTC_SCHEDULE], S[k])) so.rtc.schedule = k;
        if (so.rtc.schedule < 0) {
            fprintf(stderr, "molmoact serve: --rtc-schedule %s: linear, exp, ones or zeros\n", a->str[O_RTC_SCHEDULE]);
            return 1;
        }
    }
    so.have_seed = a->given[O_SEED];
    so.seed = a->u[O_SEED];
    so.flip180 = a->given[O_FLIP180];
    const char *model = so.engine.model_dir;
    if (!model) {
        fprintf(stderr, "molmoact serve: give the model with --model DIR\n");
        return 1;
    }
    if (!*model || !ma_is_dir(model)) {
        fprintf(stderr, "molmoact serve: --model %s is not a directory\n", model);
        return 1;
    }
    return ma_serve(&so);
}
