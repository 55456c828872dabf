/* SPDX-License-Identifier: Apache-2.0 */
/* `molmoact serve`: the robot-facing policy server, on the public API (include/molmoact.h).
 *
 * One port, two protocols (HTTP/1.1 from libmicrohttpd, websocket framing from wslay; the parts:
 * internal.h):
 *   - openpi's websocket protocol: any path upgrades (no subprotocol); the server sends one
 *     binary msgpack frame of metadata, then answers each binary msgpack-numpy request with one
 *     binary reply (actions, policy_timing, server_timing); an error is a text frame with a
 *     message naming the field or component, then close code 1011;
 *   - HTTP: GET /healthz ("OK"), GET /health and GET /act (health JSON), POST /act (json_numpy
 *     body -> {"actions": [[...]], "dt_ms": ...}, errors {"error": ...} with 400/413/500/503),
 *     GET / (a status page), GET /status.json (its data) and GET /metrics (Prometheus' text
 *     format 0.0.4: requests, failures by reason, latency histograms, clients, queue depth, each
 *     budget's use); both need the API key when the server has one, as every path but a plain
 *     GET or HEAD of /healthz and /health.
 * Every byte a client can make the server hold is counted against a named budget (budget.h):
 * --max-message-mb per message, --max-input-mb for all messages being received, --max-queued-mb
 * for the bodies queued for inference, --max-output-kb of unsent replies per websocket (reading
 * stops beyond it), --max-head-kb per HTTP connection (libmicrohttpd's memory pool).
 * A port in use is one line on stderr and exit status 1, at once also when another molmoact
 * serve holds it while still loading (an abstract socket claims the address from the bind on).
 * Requests queue FIFO to one resident engine on an inference thread, which also decodes them, so
 * the network loop is never blocked by parsing or inference. SIGINT/SIGTERM drain what is queued,
 * close websockets with 1001, stop the workers and return 0. One JSON log line per request on
 * stderr. */
#ifndef MA_SERVER_H
#define MA_SERVER_H

#include "molmoact.h"

/* The engine the server drives: molmoact's public API when NULL. A harness may give a stand-in
 * (fuzz/fuzz_server.c drives the whole request path into one that answers at once). */
typedef struct ma_serve_engine {
    molmoact_status (*open)(const molmoact_options *opt, molmoact **out, molmoact_error *err);
    molmoact_status (*get_info)(molmoact *e, molmoact_info *info, molmoact_error *err);
    molmoact_status (*infer)(molmoact *e, const molmoact_observation *obs, molmoact_result *res, molmoact_error *err);
    molmoact_status (*close)(molmoact **e);
} ma_serve_engine;

/* real-time chunking (LeRobot's RTC "guided" mode, policies/rtc/, lerobot 7427f318) */
typedef struct ma_rtc_opts {
    int enabled;               /* for every session (--rtc); a request may ask for it too */
    int horizon;               /* the execution horizon H (default 10) */
    float beta;                /* max_guidance_weight (default 10) */
    int schedule;              /* MOLMOACT_RTC_* (default LINEAR) */
    double latency_percentile; /* the delay is predicted from this percentile of recent latencies (default 95) */
} ma_rtc_opts;

typedef struct ma_serve_opts {
    /* the engine: model_dir, backend, threads, ... (molmoact_open's options; the CLI fills them) */
    molmoact_options engine;
    const char *host;         /* default 127.0.0.1 */
    int port;                 /* default 8000 */
    const char *api_key_file; /* NULL: no key */
    double max_message_mb;    /* default 32 */
    double max_input_mb;      /* all connections' request data being received (default 128) */
    double max_queued_mb;     /* bodies queued for or in inference (default 128) */
    int max_output_kb;        /* unsent output per websocket before reading stops (default 256) */
    int max_head_kb;          /* each HTTP connection's buffer: its head and what is read ahead (default 16) */
    int max_clients;          /* default 512 */
    int flip180;              /* rotate raw frames by 180 degrees (clients sending raw renders) */
    int recv_timeout_s;       /* a message, body or head not complete this long after its first byte
                                * closes the client; so does a reply it does not read (default 30) */
    int idle_timeout_s;       /* a websocket without a request for this long is closed (1001); 0: never */
    int have_seed;            /* seed: the generator of the noise seeds of requests that bring */
    unsigned long long seed;  /* neither noise nor seed (else seeded at random) */
    /* LeRobot's async inference (grpc.c): off unless grpc_port > 0 (0: off; -1: any free port) */
    int grpc_port;
    const char *grpc_host;            /* default: host */
    const char *lerobot_policy_types; /* policy_type names accepted, comma-separated (default "molmoact2") */
    double lerobot_obs_timeout_s;     /* GetActions' long poll (default 2, LeRobot's obs_queue_timeout) */
    double lerobot_similarity_atol;   /* LeRobot's similarity filter on the state; 0: off (default) */
    /* control and sessions (timeline.c) */
    double fps;        /* the robot's control rate: LeRobot's labels (timestamp + i / fps) and delays in ticks (default 30) */
    int max_sessions;  /* HTTP session_id timelines kept (default 64) */
    int session_ttl_s; /* an idle HTTP session is forgotten after this (default 300) */
    ma_rtc_opts rtc;
    const ma_serve_engine *engine_ops;              /* NULL: molmoact's */
    void (*on_listening)(int port, void *arg);      /* called once the port is open (port 0: the one bound) */
    void (*on_grpc_listening)(int port, void *arg); /* the same for --grpc-port */
    void *arg;
} ma_serve_opts;

/* runs until SIGINT/SIGTERM or ma_serve_stop(); returns the process exit status (0 after a clean
 * drain). One server per process. */
int ma_serve(const ma_serve_opts *o);
/* the drain, as a signal starts it (async-signal-safe) */
void ma_serve_stop(void);

#endif
