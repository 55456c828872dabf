/* SPDX-License-Identifier: Apache-2.0 */
/* The server's parts and what they share (server.h is the interface). Cut as Redis cuts its
 * server (ae.c / networking.c / server.c, connection.h's type table):
 *
 *   server.c   the process: options, the listening socket, the event loop (poll over libmicrohttpd's
 *              epoll descriptor, the inference thread's wake pipe and each upgraded connection),
 *              timers, the drain on SIGINT/SIGTERM;
 *   http.c     HTTP/1.1 over libmicrohttpd: every request passes gate.c once, then is answered or
 *              its body is read (counted against the budgets) and queued; websocket upgrades
 *              hand the socket to ws.c;
 *   ws.c       openpi's websocket protocol, framed by wslay: each message counted as it arrives,
 *              a request queued, its reply sent; reading stops while unsent output is over
 *              --max-output-kb;
 *   gate.c     the one decision on a request's route, key and slot;
 *   queue.c    the inference thread: decoding (wire.c) and molmoact_infer, FIFO;
 *   grpc.c     LeRobot's async-inference service (gRPC over HTTP/2 framed by nghttp2) on
 *              --grpc-port: one connection is one LeRobot client;
 *   lerobot.c  what LeRobot's payloads mean (read by pickle.c, never executed): the policy
 *              instructions and observations mapped to the model's inputs;
 *   timeline.c per-session action timelines (LeRobot clients, websockets, HTTP session_id): the
 *              last chunk, the rows executed, the predicted delay, real-time chunking's prefix;
 *   stats.c    the counters, histograms and history, and what GET /, /status.json, /metrics and
 *              /health show (the page and its script are files embedded at build time).
 * Everything but queue.c's thread runs on the loop's thread. */
#ifndef MA_SERVER_INTERNAL_H
#define MA_SERVER_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "molmoact.h"
#include "server/budget.h"
#include "server/metrics.h"
#include "server/server.h"
#include "server/wire.h"

#define HISTORY 64       /* requests kept for the status page */
#define HEALTH_RESERVE 8 /* connections beyond --max-clients that may only ask /healthz or /health */
#define RESET_BODY_MAX 65536

/* ------------------------------------------------------------------ connections (upgraded) */

/* A connection the loop polls itself (a websocket now; HTTP/2 for gRPC next): its type says how
 * to drive it, as Redis's ConnectionType does. HTTP/1.1 connections are libmicrohttpd's. */
struct ma_conn;
struct job;
struct ma_timeline;
typedef struct ma_conn_type {
    const char *name;
    short (*events)(struct ma_conn *c);                  /* poll() events wanted now */
    void (*on_events)(struct ma_conn *c, short revents); /* readable / writable / hung up */
    void (*on_job)(struct ma_conn *c, struct job *j);    /* its request's result (j freed by the caller) */
    void (*tick)(struct ma_conn *c, double now);         /* deadlines */
    void (*drain)(struct ma_conn *c);                    /* the server stops: finish and close */
    int (*finished)(struct ma_conn *c, double now);      /* may be freed now */
    void (*free)(struct ma_conn *c);                     /* release everything (the socket too) */
} ma_conn_type;

typedef struct ma_conn {
    const ma_conn_type *type;
    struct ma_conn *next;
    uint64_t id;
    int fd;
    int busy; /* a request of this connection is queued or running */
    char peer[64];
    struct ma_timeline *timeline; /* the connection's session (NULL: none yet) */
} ma_conn;

/* ------------------------------------------------------------------ jobs */

struct srv_rx;
typedef struct srv_rx srv_rx;

typedef struct job {
    struct job *next;
    uint64_t conn_id; /* the ma_conn or HTTP connection it answers */
    int proto;        /* 0: HTTP, 1: websocket, 2: gRPC (the protocol index of the counters) */
    int json;
    int predecoded; /* req was filled on the loop (gRPC): nothing to decode */
    char peer[64];
    uint8_t *body;
    size_t bytes_in;
    size_t body_held; /* bytes of the queued budget held until the job comes back */
    double t_recv, t_start, t_done;
    double t_infer;   /* the inference call alone (openpi's infer_ms, AllenAI's dt_ms) */
    double t_decoded; /* when decoding ended and the inference call began */
    ma_wire_request req;
    molmoact_result res;
    int decoded;     /* 0: the request itself was refused (400) */
    int server_seed; /* the noise's seed was drawn by the server */
    int list_format; /* HTTP ?format=list: actions as nested JSON lists */
    int status;      /* molmoact_status */
    char msg[1024];  /* for the client: built, never copied from internals */
    char log[1024];  /* for the log: the whole message */
    /* LeRobot (gRPC): the observation's labels; lr_safe: answer in PR #3048's format */
    int64_t lr_timestep;
    double lr_timestamp;
    int lr_safe;
    /* the session's timeline (timeline.c): its last chunk as it was when the request was queued
     * (tl_snapshot; the request's "executed" and "rtc" choose the RTC prefix in it: tl_apply),
     * whether the chunk is guided and with which delay */
    int rtc_guided, rtc_d, tl_base_d;
    double tl_fps;
    char session[80];            /* HTTP: the session_id's timeline */
    struct ma_timeline *http_tl; /* ... held busy by this job */
    float *tl_rows;
    int tl_n, tl_dim, tl_ticks, tl_rtc_default;
} job;

/* Why a request failed: a bounded set (the reason label of /metrics and the status page's marks) */
enum { F_BAD_REQUEST, F_TOO_LARGE, F_TIMEOUT, F_UNAUTHORIZED, F_OVERLOADED, F_SHUTTING_DOWN, F_WORKER, F_INTERNAL, F_PROTOCOL, F_N };
extern const char *const FAIL_REASON[F_N];

/* the timed parts of a request: queue (from its first byte until the inference thread takes it),
 * decode (JSON / msgpack, base64), then molmoact_timing's (total: the engine's whole pipeline) */
enum {
    C_QUEUE,
    C_DECODE,
    C_PREPROCESS,
    C_VISION,
    C_LLM0,
    C_LLM1,
    C_LLM2,
    C_LLM3,
    C_ACTION_CONTEXT,
    C_ACTION_STEP,
    C_TRANSFER,
    C_HOST,
    C_TOTAL,
    C_N
};
extern const char *const COMPONENT[C_N];

typedef struct history_entry {
    double t;              /* s since the start */
    double request;        /* ms: the first byte of the request to its reply (or refusal) */
    double c[C_N];         /* ms per component (successful requests) */
    int ok, proto, reason; /* proto: 0 HTTP, 1 websocket, 2 gRPC */
} history_entry;

/* the budgets (budget.h), by index in srv.budget */
enum { B_MESSAGE, B_INPUT, B_QUEUED, B_OUTPUT, B_N };

/* ------------------------------------------------------------------------------ sessions */

#define TL_LAT 100 /* latencies kept per session (LeRobot's LatencyTracker keeps 100) */
typedef struct ma_timeline {
    struct ma_timeline *next; /* HTTP sessions' list */
    char name[96];            /* "grpc:PEER", "ws:PEER", "http:ID" */
    float *rows;              /* the last chunk sent, normalised: n x dim, row i for control tick step0 + i */
    int n, dim;
    int64_t step0;
    double t_sent, last_used, fps;
    double lat[TL_LAT]; /* ms, from the observation's first byte to its reply */
    int n_lat, lat_at;
    double last_ms;
    uint64_t requests;
    int busy, doomed;          /* doomed: reset while its request ran (HTTP) */
    int last_d, last_d_actual; /* the last request's predicted delay (-1: unguided), taken delay */
} ma_timeline;

void tl_init(ma_timeline *t, const char *name);
void tl_reset(ma_timeline *t);
void tl_free(ma_timeline *t);
double tl_latency_percentile(const ma_timeline *t, double q);
int tl_ticks(double ms, double fps);
int tl_predict_delay(const ma_timeline *t, const ma_rtc_opts *o, double fps);
int tl_store(ma_timeline *t, const float *trajectory, int horizon, int max_dim, int first, int n, int dim, int64_t step0);
void tl_observe_latency(ma_timeline *t, double ms);
void tl_end(ma_timeline *t, job *j, int64_t step0);
int tl_snapshot(ma_timeline *t, job *j, double fps, int base_d);
void tl_apply(job *j); /* the prefix from the snapshot and the request's executed / rtc */
void tl_http_begin(const char *id, job *j);
void tl_http_end(job *j, int delivered); /* delivered: the reply reaches the client (else the chunk is not kept) */
struct cJSON;
void tl_http_remove(const char *id, struct cJSON *removed);
void tl_http_expire(double now);
void tl_http_free_all(void);
void tl_for_each(void (*fn)(const ma_timeline *t, void *arg), void *arg);

/* ------------------------------------------------------------------------------ LeRobot */

struct ma_pk;
typedef struct lr_config {
    int set;
    char policy_type[64];
    int actions_per_chunk;
    char *state_names[64]; /* the observation dict's keys, in the state's order */
    int n_state;
    char *cam_key[2]; /* the observation dict's keys of image0 and image1 */
} lr_config;
typedef struct lr_obs_meta {
    double timestamp;
    int64_t timestep;
    int must_go;
} lr_obs_meta;
ma_status lr_config_from(const struct ma_pk *root, const molmoact_info *info, lr_config *c, char *note, size_t note_cap, ma_error *err);
void lr_config_free(lr_config *c);
ma_status lr_obs_from(const struct ma_pk *root, const lr_config *c, ma_wire_request *r, lr_obs_meta *meta, ma_error *err);

typedef struct ma_server {
    const ma_serve_opts *o;
    const ma_serve_engine *ops;
    molmoact *engine;
    molmoact_info info;
    char backend[16];
    char model_name[256];
    uint8_t api_key[256];
    size_t api_key_len;
    int have_key;
    size_t max_bytes;  /* --max-message-mb in bytes */
    size_t max_output; /* --max-output-kb in bytes: per connection */
    ma_budget budget[B_N];
    uint64_t rng;
    int listen_fd, bound_port;
    int port_lock_fd;
    int wake[2];
    struct MHD_Daemon *mhd;
    ma_conn *conns; /* upgraded connections */
    int n_http;     /* libmicrohttpd's connections (an upgraded one counts until it is closed) */
    int n_ws, n_grpc;
    int grpc_fd, grpc_port, grpc_lock_fd;
    double grpc_accept_after; /* ma_now_ms before which the gRPC listener is not polled (out of descriptors) */
    int first_row;            /* the trajectory's first executed row (n_obs_steps - 1) */
    uint64_t lerobot_filtered, rtc_guided, rtc_beyond, rtc_mispredicted;
    ma_histogram delay_hist; /* the delay each request took, in control ticks */
    uint64_t next_id;
    int stopping;
    /* the queue to the inference thread and back */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *queue, **queue_tail, *done;
    int running, quit;
    int n_queued;
    /* statistics */
    double t_start, wall_start;
    long served, failed;
    uint64_t requests[3];
    uint64_t failures[F_N];
    ma_histogram req_hist, comp_hist[C_N];
    history_entry hist[HISTORY];
    int hist_n, hist_at;
    molmoact_component weights[16];
    int n_components;
} ma_server;

extern ma_server srv;

/* server.c */
void srv_wake(void);
void srv_conn_add(ma_conn *c);
ma_conn *srv_conn_find(uint64_t id);
uint64_t srv_new_id(void);

/* messages and the log (stats.c) */
void srv_printable(char *s);
void srv_client_error(int status, const char *msg, char *out, size_t cap);
void srv_log_line(const char *client, const char *proto, size_t bytes_in, size_t bytes_out, const job *j, const char *outcome);
void srv_log_event(const char *event, const char *client, const char *detail);
/* one inference request ends: answered (reason < 0) or refused; t_first its first byte (0: now) */
void srv_account(int proto, int reason, double t_first, const job *j);
/* the pages' content */
struct cJSON *srv_health_json(void);
struct cJSON *srv_status_json(void);
char *srv_metrics_text(size_t *len);
extern const char SRV_STATUS_HTML[], SRV_STATUS_JS[];
extern const size_t SRV_STATUS_HTML_LEN, SRV_STATUS_JS_LEN;
extern const char SRV_PAGE_CSP[];

/* queue.c */
void srv_queue_start(void);
int srv_queue_thread(pthread_t *th);
void srv_enqueue(job *j);
void srv_job_free(job *j);
job *srv_take_done(void); /* oldest first, as a list */
int srv_queue_idle(void);
/* the HTTP status of a failed job, and its reason */
int srv_job_http_code(const job *j);
int srv_job_reason(const job *j);
/* a job for a whole message or body: takes the request data of rx (from B_INPUT into B_QUEUED);
 * NULL when the queued budget refuses or memory fails, with the client's message in why */
job *srv_job_new(srv_rx *rx, uint64_t conn_id, int proto, int json, const char *peer, double t_recv, char *why, size_t why_cap);

/* http.c */
int srv_http_start(void);
void srv_http_job_done(job *j); /* a job of an HTTP connection came back */
void srv_http_tick(double now); /* deadlines of HTTP connections */
void srv_http_drain(void);      /* the server stops: answer what is half sent, close idle ones */
int srv_http_open(void);        /* HTTP connections still open */
void srv_http_stop(void);

/* grpc.c */
extern const ma_conn_type ma_grpc_type;
int srv_grpc_init(void);
void srv_grpc_accept(int listen_fd);
void srv_grpc_stop(void);

/* ws.c */
extern const ma_conn_type ma_ws_type;
/* a websocket on `fd` (handed over by libmicrohttpd's upgrade `urh`; `extra` are bytes already read) */
int srv_ws_open(int fd, void *urh, const char *extra, size_t extra_len, const char *peer);

/* the request data of one connection: a buffer that grows as bytes arrive, never from a claimed
 * length; its bytes are taken from B_INPUT first. Returns 0, RX_OVER_MESSAGE (over
 * --max-message-mb), RX_OVER_INPUT (B_INPUT refused) or -1 (out of memory). */
enum { RX_OVER_MESSAGE = 1, RX_OVER_INPUT = 2 };
struct srv_rx {
    uint8_t *p;
    size_t len, cap;
};
int srv_rx_append(srv_rx *r, const void *data, size_t n);
/* what the client is told when srv_rx_append refused (s: its result) */
void srv_rx_refusal(int s, char *msg, size_t cap);
void srv_rx_free(srv_rx *r);
/* the buffer handed over (its bytes move from B_INPUT to B_QUEUED with the job) */
uint8_t *srv_rx_take(srv_rx *r, size_t *len, size_t *cap);

#endif
