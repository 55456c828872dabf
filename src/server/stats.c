/* SPDX-License-Identifier: Apache-2.0 */
/* The server's statistics and what its pages show (internal.h): the log lines, the accounting of
 * every inference request, /health, /status.json and /metrics (with each budget's use). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/util.h"
#include "io/jsonline.h"
#include "model/components.h" /* the workers' names, for the messages a client may see */
#include "server/internal.h"

const char *const FAIL_REASON[F_N] = {"bad_request",   "too_large", "timeout",  "unauthorized", "overloaded",
                                      "shutting_down", "worker",    "internal", "protocol"};
const char *const COMPONENT[C_N] = {"queue",      "decode",         "preprocess",  "vision",   "llm_split0", "llm_split1", "llm_split2",
                                    "llm_split3", "action_context", "action_step", "transfer", "host",       "total"};

/* the status page's headers: its script comes from /status.js, no inline script runs */
const char SRV_PAGE_CSP[] = "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; "
                            "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/* printable ASCII only (a client's key may be any bytes; a text frame must be UTF-8) */
void srv_printable(char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e) *s = '?';
}

/* What a client is told about a failed inference: built from the status and the parts of the
 * library's message that are made of fixed words (an observation field, a worker's name), never
 * a path or other internal text; the whole message goes to the log. */
void srv_client_error(int status, const char *msg, char *out, size_t cap) {
    if ((status == MOLMOACT_ERR_ARG || status == MOLMOACT_ERR_SHAPE || status == MOLMOACT_ERR_RANGE || status == MOLMOACT_ERR_FORMAT ||
         status == MOLMOACT_ERR_NOMEM || status == MOLMOACT_ERR_UNSUPPORTED) &&
        !strncmp(msg, "observation", 11)) {
        snprintf(out, cap, "%s", msg); /* the API's checks of the observation name only its fields */
        srv_printable(out);
        return;
    }
    if (status == MOLMOACT_ERR_WORKER) {
        for (size_t i = 0; i < MA_NUM_WORKERS; i++) {
            char pre[40];
            snprintf(pre, sizeof pre, "worker %s (pid ", MA_WORKER_NAMES[i]);
            if (strncmp(msg, pre, strlen(pre))) continue;
            const char *what = strchr(msg + strlen(pre), ')'); /* ") died during the request (signal); ..." */
            const char *semi = what ? strchr(what, ';') : NULL;
            const size_t n = semi ? (size_t)(semi - msg) : 0;
            const int restarted = strstr(msg, "; it was restarted") != NULL;
            if (n && n < 200)
                snprintf(out, cap, "%.*s; %s", (int)n, msg, restarted ? "it was restarted" : "restarting it failed (see the server log)");
            else snprintf(out, cap, "worker %s failed during the request (see the server log)", MA_WORKER_NAMES[i]);
            srv_printable(out);
            return;
        }
    }
    snprintf(out, cap, "server: the request failed (%s); the server log has the details", molmoact_status_name((molmoact_status)status));
}

void srv_log_line(const char *client, const char *proto, size_t bytes_in, size_t bytes_out, const job *j, const char *outcome) {
    char line[2048];
    size_t k = (size_t)snprintf(line, sizeof line, "{\"client\": \"%s\", \"proto\": \"%s\", \"bytes_in\": %zu, \"bytes_out\": %zu", client,
                                proto, bytes_in, bytes_out);
    if (j && j->status == MOLMOACT_OK && j->decoded) {
        const molmoact_timing *t = &j->res.timing;
        k += (size_t)snprintf(line + k, sizeof line - k,
                              ", \"ms\": {\"queue\": %.3f, \"total\": %.3f, \"vision\": %.3f, \"llm\": %.3f, \"action_context\": %.3f, "
                              "\"action_step\": %.3f, \"transfer\": %.3f, \"host\": %.3f}",
                              j->t_start - j->t_recv, t->total, t->vision,
                              t->llm_split[0] + t->llm_split[1] + t->llm_split[2] + t->llm_split[3], t->action_context, t->action_step,
                              t->transfer, t->host);
        if (j->server_seed) k += (size_t)snprintf(line + k, sizeof line - k, ", \"seed\": %llu", (unsigned long long)j->req.obs.seed);
        /* a guided chunk: what replays it (molmoact run --rtc-prefix ROWS --rtc-delay D) */
        if (j->rtc_guided && k < sizeof line)
            k += (size_t)snprintf(line + k, sizeof line - k, ", \"rtc\": {\"delay\": %d, \"prefix_rows\": %d, \"horizon\": %d}", j->rtc_d,
                                  j->req.obs.rtc_prefix_rows, j->req.obs.rtc_horizon);
    }
    flockfile(stderr); /* one line, whole: the inference thread logs too (a session evicted) */
    fputs(line, stderr);
    fputs(", \"outcome\": ", stderr);
    ma_json_write_string(stderr, outcome, strlen(outcome));
    fputs("}\n", stderr);
    fflush(stderr);
    funlockfile(stderr);
}

void srv_log_event(const char *event, const char *client, const char *detail) {
    flockfile(stderr);
    fprintf(stderr, "{\"event\": ");
    ma_json_write_string(stderr, event, strlen(event));
    if (client) {
        fputs(", \"client\": ", stderr);
        ma_json_write_string(stderr, client, strlen(client));
    }
    if (detail) {
        fputs(", \"detail\": ", stderr);
        ma_json_write_string(stderr, detail, strlen(detail));
    }
    fputs("}\n", stderr);
    fflush(stderr);
    funlockfile(stderr);
}

/* One inference request ends: answered (reason < 0) or refused. Every request is counted once,
 * here: the counters and histograms of /metrics (over the server's life) and the status page's
 * history (the last HISTORY requests, failures included). t_first: its first byte (0: now). */
void srv_account(int proto, int reason, double t_first, const job *j) {
    const double now = ma_now_ms();
    const double ms = t_first > 0 && t_first < now ? now - t_first : 0;
    srv.requests[proto]++;
    if (reason >= 0) srv.failures[reason]++, srv.failed++;
    else srv.served++;
    ma_hist_observe(&srv.req_hist, ms / 1e3);
    history_entry *h = &srv.hist[srv.hist_at];
    srv.hist_at = (srv.hist_at + 1) % HISTORY;
    if (srv.hist_n < HISTORY) srv.hist_n++;
    memset(h, 0, sizeof *h);
    h->t = (now - srv.t_start) / 1e3;
    h->request = ms;
    h->ok = reason < 0;
    h->proto = proto;
    h->reason = reason;
    if (reason < 0 && j) {
        const molmoact_timing *t = &j->res.timing;
        const double c[C_N] = {j->t_start - j->t_recv,
                               j->t_decoded - j->t_start,
                               t->preprocess,
                               t->vision,
                               t->llm_split[0],
                               t->llm_split[1],
                               t->llm_split[2],
                               t->llm_split[3],
                               t->action_context,
                               t->action_step,
                               t->transfer,
                               t->host,
                               t->total};
        for (int i = 0; i < C_N; i++) {
            h->c[i] = c[i] > 0 ? c[i] : 0;
            ma_hist_observe(&srv.comp_hist[i], h->c[i] / 1e3);
        }
    }
}


static void add_precision(cJSON *j) {
    cJSON *pr = cJSON_AddObjectToObject(j, "precision");
    cJSON_AddStringToObject(pr, "vision", srv.info.precision[0]);
    cJSON_AddStringToObject(pr, "llm", srv.info.precision[1]);
    cJSON_AddStringToObject(pr, "action", srv.info.precision[2]);
}

cJSON *srv_health_json(void) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "status", srv.stopping ? "stopping" : "ok");
    cJSON_AddStringToObject(j, "model", srv.model_name);
    cJSON_AddStringToObject(j, "repo_id", srv.model_name);
    cJSON_AddStringToObject(j, "device", srv.backend);
    char dt[64];
    snprintf(dt, sizeof dt, "%s/%s/%s", srv.info.precision[0], srv.info.precision[1], srv.info.precision[2]);
    cJSON_AddStringToObject(j, "dtype", dt);
    cJSON_AddStringToObject(j, "variant", srv.info.variant);
    add_precision(j);
    cJSON_AddStringToObject(j, "norm_tag", srv.info.norm_tag);
    cJSON_AddNumberToObject(j, "num_cameras", 2);
    cJSON_AddNumberToObject(j, "state_dim", srv.info.state_dim);
    cJSON_AddNumberToObject(j, "action_horizon", srv.info.n_steps);
    cJSON_AddNumberToObject(j, "action_dim", srv.info.action_dim);
    cJSON_AddStringToObject(j, "version", molmoact_version());
    return j;
}

/* the history's successful requests: a component's values (ms), oldest first; returns how many */
static int history_values(const char *key, double *v) {
    int n = 0;
    for (int i = 0; i < srv.hist_n; i++) {
        const history_entry *h = &srv.hist[(srv.hist_at - srv.hist_n + i + HISTORY) % HISTORY];
        if (!h->ok) continue;
        double x = 0;
        if (!strcmp(key, "request")) x = h->request;
        else if (!strcmp(key, "llm")) x = h->c[C_LLM0] + h->c[C_LLM1] + h->c[C_LLM2] + h->c[C_LLM3];
        else
            for (int k = 0; k < C_N; k++)
                if (!strcmp(key, COMPONENT[k])) x = h->c[k];
        v[n++] = x;
    }
    return n;
}

/* the sessions (timeline.c): bounded by --max-sessions and the connections */
typedef struct session_metric_arg {
    ma_textbuf *t;
    int k;
} session_metric_arg;

static void session_metric(const ma_timeline *tl, void *arg) {
    session_metric_arg *a = arg;
    static const char *const NAME[3] = {"molmoact_session_latency_p50_ms", "molmoact_session_latency_p95_ms",
                                        "molmoact_session_delay_ticks"};
    const double v = a->k == 0 ? tl_latency_percentile(tl, 50) : a->k == 1 ? tl_latency_percentile(tl, 95) : tl->last_d_actual;
    ma_tb_printf(a->t, "%s{session=\"", NAME[a->k]);
    ma_tb_label_value(a->t, tl->name);
    ma_tb_printf(a->t, "\"} %.3f\n", v);
}

static void session_metrics(ma_textbuf *t) {
    static const char *const HELP[3][2] = {
        {"molmoact_session_latency_p50_ms",
         "Per session (a LeRobot gRPC client, a websocket, an HTTP session_id): the median latency of its last 100 requests, ms."},
        {"molmoact_session_latency_p95_ms", "Per session: the 95th percentile latency of its last 100 requests, ms."},
        {"molmoact_session_delay_ticks", "Per session: the delay its last request took, in control ticks (--fps)."}};
    for (int k = 0; k < 3; k++) {
        ma_tb_family(t, HELP[k][0], "gauge", HELP[k][1]);
        session_metric_arg a = {t, k};
        tl_for_each(session_metric, &a);
    }
}

static void session_json(const ma_timeline *tl, void *arg) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "session", tl->name);
    cJSON_AddNumberToObject(e, "requests", (double)tl->requests);
    cJSON_AddNumberToObject(e, "latency_p50_ms", tl_latency_percentile(tl, 50));
    cJSON_AddNumberToObject(e, "latency_p95_ms", tl_latency_percentile(tl, 95));
    cJSON_AddNumberToObject(e, "delay_ticks", tl->last_d_actual);
    if (tl->last_d >= 0) cJSON_AddNumberToObject(e, "rtc_delay_predicted", tl->last_d);
    cJSON_AddNumberToObject(e, "fps", tl->fps);
    cJSON_AddItemToArray((cJSON *)arg, e);
}

/* what the status page's percentile table lists: the whole request, then its parts */
static const char *const PCT_KEYS[] = {"request",        "queue",       "decode",     "preprocess", "vision",
                                       "llm_split0",     "llm_split1",  "llm_split2", "llm_split3", "llm",
                                       "action_context", "action_step", "transfer",   "host",       "total"};

cJSON *srv_status_json(void) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", srv.model_name);
    cJSON_AddStringToObject(j, "variant", srv.info.variant);
    cJSON_AddStringToObject(j, "version", molmoact_version());
    add_precision(j);
    cJSON_AddStringToObject(j, "mode", srv.info.inproc ? "inproc" : "resident, 6 worker processes");
    cJSON_AddNumberToObject(j, "uptime_s", (ma_now_ms() - srv.t_start) / 1e3);
    cJSON_AddNumberToObject(j, "requests_served", (double)srv.served);
    cJSON_AddNumberToObject(j, "requests_failed", (double)srv.failed);
    cJSON *fr = cJSON_AddObjectToObject(j, "failures");
    for (int i = 0; i < F_N; i++)
        if (srv.failures[i]) cJSON_AddNumberToObject(fr, FAIL_REASON[i], (double)srv.failures[i]);
    cJSON_AddNumberToObject(j, "clients", srv.n_http);
    /* each component's precision and the dtypes its weights are stored in (bytes) */
    cJSON *comps = cJSON_AddArrayToObject(j, "components");
    for (int i = 0; i < srv.n_components; i++) {
        const molmoact_component *w = &srv.weights[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", w->name);
        cJSON_AddStringToObject(e, "precision", w->precision);
        if (w->n_dtypes) cJSON_AddStringToObject(e, "dtype", w->dtype[0]);
        else cJSON_AddNullToObject(e, "dtype");
        cJSON *b = cJSON_AddObjectToObject(e, "bytes");
        for (int k = 0; k < w->n_dtypes; k++) cJSON_AddNumberToObject(b, w->dtype[k], (double)w->bytes[k]);
        cJSON_AddItemToArray(comps, e);
    }
    cJSON_AddNumberToObject(j, "grpc_clients", srv.n_grpc);
    tl_for_each(session_json, cJSON_AddArrayToObject(j, "sessions"));
    cJSON *arr = cJSON_AddArrayToObject(j, "recent");
    for (int i = 0; i < srv.hist_n; i++) {
        const history_entry *h = &srv.hist[(srv.hist_at - srv.hist_n + i + HISTORY) % HISTORY];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "t_s", h->t);
        cJSON_AddBoolToObject(e, "ok", h->ok);
        cJSON_AddStringToObject(e, "protocol", h->proto == 2 ? "grpc" : h->proto ? "websocket" : "http");
        if (!h->ok) cJSON_AddStringToObject(e, "reason", FAIL_REASON[h->reason]);
        cJSON_AddNumberToObject(e, "request", h->request);
        for (int k = 0; k < C_N; k++) {
            cJSON_AddNumberToObject(e, COMPONENT[k], h->c[k]);
            if (k == C_LLM3) cJSON_AddNumberToObject(e, "llm", h->c[C_LLM0] + h->c[C_LLM1] + h->c[C_LLM2] + h->c[C_LLM3]);
        }
        cJSON_AddItemToArray(arr, e);
    }
    /* p50/p90/p99 of each part over the successful requests of "recent" (nearest rank) */
    double v[HISTORY];
    const int n = history_values("request", v);
    cJSON_AddNumberToObject(j, "percentiles_over", n);
    cJSON *pct = cJSON_AddObjectToObject(j, "percentiles");
    for (size_t k = 0; n && k < sizeof PCT_KEYS / sizeof PCT_KEYS[0]; k++) {
        cJSON *e = cJSON_AddObjectToObject(pct, PCT_KEYS[k]);
        static const double P[3] = {50, 90, 99};
        static const char *const PN[3] = {"p50", "p90", "p99"};
        for (int q = 0; q < 3; q++) {
            history_values(PCT_KEYS[k], v);
            cJSON_AddNumberToObject(e, PN[q], ma_percentile(v, n, P[q]));
        }
    }
    return j;
}

/* GET /metrics: Prometheus' text format 0.0.4. Counters and histograms over the server's life. */
char *srv_metrics_text(size_t *len) {
    ma_textbuf t = {0};
    ma_tb_family(&t, "molmoact_info", "gauge",
                 "The server: molmoact's version, the model's name and variant, the backend and the mode (always 1).");
    ma_tb_printf(&t, "molmoact_info{version=\"");
    ma_tb_label_value(&t, molmoact_version());
    ma_tb_printf(&t, "\",model=\"");
    ma_tb_label_value(&t, srv.model_name);
    ma_tb_printf(&t, "\",variant=\"");
    ma_tb_label_value(&t, srv.info.variant);
    ma_tb_printf(&t, "\",backend=\"");
    ma_tb_label_value(&t, srv.backend);
    ma_tb_printf(&t, "\",mode=\"%s\"} 1\n", srv.info.inproc ? "inproc" : "resident");
    ma_tb_family(&t, "molmoact_component_precision_info", "gauge",
                 "Each component's precision (its context's, or checkpoint) and the dtype most of its weights are stored in (always 1).");
    for (int i = 0; i < srv.n_components; i++) {
        const molmoact_component *w = &srv.weights[i];
        ma_tb_printf(&t, "molmoact_component_precision_info{component=\"%s\",precision=\"", w->name);
        ma_tb_label_value(&t, w->precision);
        ma_tb_printf(&t, "\",dtype=\"%s\"} 1\n", w->n_dtypes ? w->dtype[0] : "unknown");
    }
    ma_tb_family(&t, "molmoact_start_time_seconds", "gauge", "When the server started listening, in seconds since the Unix epoch.");
    ma_tb_printf(&t, "molmoact_start_time_seconds %.3f\n", srv.wall_start);
    ma_tb_family(&t, "molmoact_uptime_seconds", "gauge", "Seconds since the server started listening.");
    ma_tb_printf(&t, "molmoact_uptime_seconds %.3f\n", (ma_now_ms() - srv.t_start) / 1e3);
    ma_tb_family(
        &t, "molmoact_requests_total", "counter",
        "Inference requests (POST /act bodies, websocket request messages, LeRobot observations run over gRPC) the server finished, answered or refused.");
    ma_tb_printf(&t, "molmoact_requests_total{protocol=\"http\"} %llu\n", (unsigned long long)srv.requests[0]);
    ma_tb_printf(&t, "molmoact_requests_total{protocol=\"websocket\"} %llu\n", (unsigned long long)srv.requests[1]);
    ma_tb_printf(&t, "molmoact_requests_total{protocol=\"grpc\"} %llu\n", (unsigned long long)srv.requests[2]);
    ma_tb_family(&t, "molmoact_request_failures_total", "counter", "Inference requests that failed or were refused, by reason.");
    for (int i = 0; i < F_N; i++)
        ma_tb_printf(&t, "molmoact_request_failures_total{reason=\"%s\"} %llu\n", FAIL_REASON[i], (unsigned long long)srv.failures[i]);
    ma_tb_family(&t, "molmoact_request_duration_seconds", "histogram",
                 "Inference requests' time from their first byte to their reply or refusal, in seconds.");
    ma_tb_histogram(&t, "molmoact_request_duration_seconds", NULL, &srv.req_hist);
    ma_tb_family(&t, "molmoact_component_duration_seconds", "histogram",
                 "Successful requests' time per part, in seconds: queue (from the first byte until the inference thread takes it), "
                 "decode, preprocess, each session, shared-memory transfer, host glue, and total (the engine's whole pipeline).");
    for (int i = 0; i < C_N; i++) {
        char l[48];
        snprintf(l, sizeof l, "component=\"%s\"", COMPONENT[i]);
        ma_tb_histogram(&t, "molmoact_component_duration_seconds", l, &srv.comp_hist[i]);
    }
    pthread_mutex_lock(&srv.mu);
    const int queued = srv.n_queued, running = srv.running;
    pthread_mutex_unlock(&srv.mu);
    ma_tb_family(&t, "molmoact_connected_clients", "gauge", "Open client connections (HTTP and websocket).");
    ma_tb_printf(&t, "molmoact_connected_clients %d\n", srv.n_http);
    ma_tb_family(&t, "molmoact_websocket_clients", "gauge", "Open websocket connections.");
    ma_tb_printf(&t, "molmoact_websocket_clients %d\n", srv.n_ws);
    /* the budgets: "message" and "output" bound each connection (used: all connections' bytes
     * together), "input" and "queued" bound the server */
    ma_tb_family(&t, "molmoact_budget_limit_bytes", "gauge",
                 "Each budget's limit in bytes (scope connection: per connection; server: all clients together), and its option.");
    for (int i = 0; i < B_N; i++)
        ma_tb_printf(&t, "molmoact_budget_limit_bytes{budget=\"%s\",scope=\"%s\",option=\"%s\"} %zu\n", srv.budget[i].name,
                     i == B_MESSAGE || i == B_OUTPUT ? "connection" : "server", srv.budget[i].option, srv.budget[i].limit);
    ma_tb_family(&t, "molmoact_budget_used_bytes", "gauge",
                 "Bytes each budget holds now (output: every connection's together; message: see input).");
    for (int i = B_INPUT; i < B_N; i++)
        ma_tb_printf(&t, "molmoact_budget_used_bytes{budget=\"%s\"} %zu\n", srv.budget[i].name, srv.budget[i].used);
    ma_tb_family(&t, "molmoact_budget_peak_bytes", "gauge", "The most bytes each budget has held at once (message: the largest one).");
    for (int i = 0; i < B_N; i++)
        ma_tb_printf(&t, "molmoact_budget_peak_bytes{budget=\"%s\"} %zu\n", srv.budget[i].name, srv.budget[i].peak);
    ma_tb_family(&t, "molmoact_budget_refusals_total", "counter", "Requests, messages or reads refused because a budget was full.");
    for (int i = 0; i < B_N; i++)
        ma_tb_printf(&t, "molmoact_budget_refusals_total{budget=\"%s\"} %llu\n", srv.budget[i].name,
                     (unsigned long long)srv.budget[i].refused);
    ma_tb_family(&t, "molmoact_grpc_clients", "gauge", "Open gRPC connections (LeRobot async-inference clients, --grpc-port).");
    ma_tb_printf(&t, "molmoact_grpc_clients %d\n", srv.n_grpc);
    ma_tb_family(&t, "molmoact_lerobot_filtered_total", "counter",
                 "LeRobot observations dropped by the similarity filter (--lerobot-similarity-atol; off by default).");
    ma_tb_printf(&t, "molmoact_lerobot_filtered_total %llu\n", (unsigned long long)srv.lerobot_filtered);
    ma_tb_family(&t, "molmoact_rtc_guided_total", "counter",
                 "Requests run with real-time chunking's guidance (a previous chunk's rows left).");
    ma_tb_printf(&t, "molmoact_rtc_guided_total %llu\n", (unsigned long long)srv.rtc_guided);
    ma_tb_family(&t, "molmoact_rtc_beyond_horizon_total", "counter",
                 "Guided requests whose predicted delay reached the execution horizon: RTC could not help them.");
    ma_tb_printf(&t, "molmoact_rtc_beyond_horizon_total %llu\n", (unsigned long long)srv.rtc_beyond);
    ma_tb_family(&t, "molmoact_rtc_mispredicted_total", "counter",
                 "Guided requests that took more control ticks than the delay predicted for them (the frozen prefix was too short).");
    ma_tb_printf(&t, "molmoact_rtc_mispredicted_total %llu\n", (unsigned long long)srv.rtc_mispredicted);
    ma_tb_family(&t, "molmoact_delay_ticks", "histogram",
                 "Each session request's delay in control ticks (--fps): from the observation's first byte to its reply, plus the "
                 "step LeRobot labels row 0 with.");
    ma_tb_histogram(&t, "molmoact_delay_ticks", NULL, &srv.delay_hist);
    session_metrics(&t);
    ma_tb_family(&t, "molmoact_queue_depth", "gauge", "Requests waiting for the inference thread.");
    ma_tb_printf(&t, "molmoact_queue_depth %d\n", queued);
    ma_tb_family(&t, "molmoact_requests_processing", "gauge", "Requests being decoded or run now (0 or 1).");
    ma_tb_printf(&t, "molmoact_requests_processing %d\n", running);
    if (t.failed) {
        ma_tb_free(&t);
        return NULL;
    }
    *len = t.b.len;
    return t.b.data;
}
