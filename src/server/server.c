/* SPDX-License-Identifier: Apache-2.0 */
/* `molmoact serve` (server.h): a poll() loop on this thread speaking HTTP/1.1 and websockets
 * over the parsers of http.h; decoding and inference on another thread.
 *
 * Why not libwebsockets: Debian 12's 4.1.6 answered two pipelined POSTs with two 400s after
 * running one, never answered a chunked body, Expect: 100-continue, HEAD or OPTIONS, and re-armed
 * its receive timeout per fragment (a byte every two seconds held a connection forever). Each of
 * these is a few lines here, and the parsers are fuzzed (fuzz/fuzz_http.c). */
#define _GNU_SOURCE
#include "server/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "core/util.h"
#include "io/jsonline.h"
#include "io/mapfile.h"
#include "model/components.h" /* the workers' names, for the messages a client may see */
#include "molmoact.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/wire.h"

#define HISTORY 64       /* requests kept for the status page */
#define HEALTH_RESERVE 8 /* connections beyond --max-clients that may only ask /healthz or /health */
#define LINGER_MS 2000   /* after our last bytes: read and drop what the client still sends */
#define READ_CHUNK 65536
/* unsent output a connection may hold before the server stops reading it: a client that
 * pipelines requests and reads no replies makes the server hold at most this much (plus the
 * one reply that crossed it), not a queue without end (issue 36 F3) */
#define OUT_PAUSE_BYTES (256u << 10)

/* ------------------------------------------------------------------------------ state */

enum { H_HEAD, H_BODY, H_BUSY };

typedef struct conn {
    struct conn *next;
    int fd;
    uint64_t id;
    char peer[64];
    int is_ws;
    int reserved; /* beyond --max-clients: health checks only */
    /* bytes read and not yet consumed */
    uint8_t *in;
    size_t in_len, in_cap;
    /* the message (websocket) or body (HTTP) being assembled */
    uint8_t *rx;
    size_t rx_len, rx_cap;
    double msg_start;    /* first byte of the current message or request (0: none pending) */
    double last_active;  /* the last complete request or reply (idle timers) */
    int busy;            /* a request of this client is queued or running */
    int closing;         /* no more requests: close once the output is written */
    double linger_until; /* after shutdown(SHUT_WR): when to close regardless */
    int shut;            /* SHUT_WR done: lingering */
    int peer_eof;        /* the client closed its side: nothing more comes */
    int dead;            /* a socket error: close now, unwritten output dropped */
    /* output */
    uint8_t *out;
    size_t out_len, out_off, out_cap;
    double out_since; /* when the oldest unwritten output was queued */
    /* HTTP */
    int hstate;
    ma_http_req req;
    ma_http_chunked chunk;
    uint64_t body_left; /* Content-Length bytes still to come */
    int head_only;      /* answering HEAD */
    int reset_route;    /* the body being read is POST /reset's */
    int keep_alive;
    /* websocket */
    ma_ws_frame frame;
    int in_frame;
    uint64_t frame_got;
    int msg_opcode; /* opcode of the message being assembled (0: none) */
    int n_replies;
    double last_reply_ms;
    double prev_total_ms; /* the previous request's whole cycle (openpi's prev_total_ms) */
    double cycle_start;   /* the end of the previous reply, or the connection's start */
    int ignored_logged;   /* keys the server ignores: logged once per connection */
    int paused;           /* input left unprocessed while the output is full (out_full) */
} conn;

typedef struct job {
    struct job *next;
    uint64_t conn_id;
    int is_ws, json;
    char peer[64];
    uint8_t *body;
    size_t bytes_in;
    size_t body_held; /* the body's bytes counted in S.rx_total until the job comes back */
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
} job;

/* Why a request failed: a bounded set (the reason label of /metrics and the status page's marks) */
enum { F_BAD_REQUEST, F_TOO_LARGE, F_TIMEOUT, F_UNAUTHORIZED, F_OVERLOADED, F_SHUTTING_DOWN, F_WORKER, F_INTERNAL, F_PROTOCOL, F_N };
static const char *const FAIL_REASON[F_N] = {"bad_request",   "too_large", "timeout",  "unauthorized", "overloaded",
                                             "shutting_down", "worker",    "internal", "protocol"};

/* the timed parts of a request: queue (from its first byte until the inference thread takes it:
 * receiving it and waiting), decode (JSON / msgpack, base64), then molmoact_timing's (total: the
 * engine's whole pipeline) */
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
static const char *const COMPONENT[C_N] = {"queue",      "decode",     "preprocess", "vision",         "llm_split0",
                                           "llm_split1", "llm_split2", "llm_split3", "action_context", "action_step",
                                           "transfer",   "host",       "total"};

typedef struct history_entry {
    double t;       /* s since the start */
    double request; /* ms: the first byte of the request to its reply (or refusal) */
    double c[C_N];  /* ms per component (successful requests) */
    int ok, ws, reason;
} history_entry;

static struct {
    const ma_serve_opts *o;
    molmoact *engine;
    molmoact_info info;
    char backend[16]; /* the engine's (molmoact_get_setting) */
    char model_name[256];
    uint8_t api_key[256];
    size_t api_key_len;
    int have_key;
    size_t max_bytes, rx_total, rx_total_max;
    uint64_t rng; /* the noise seeds' generator */
    int listen_fd, bound_port;
    int port_lock_fd; /* the abstract socket that claims the address while the engine loads */
    int wake[2];      /* the inference thread and the signal handler wake the loop */
    conn *conns;
    int n_conns;
    uint64_t next_id;
    int stopping;
    /* the queue to the inference thread and back */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *queue, **queue_tail, *done;
    int running, quit;
    int n_queued; /* jobs waiting for the inference thread */
    /* statistics */
    double t_start, wall_start;
    long served, failed;
    uint64_t requests[2]; /* http, websocket: answered or refused */
    uint64_t failures[F_N];
    ma_histogram req_hist, comp_hist[C_N];
    history_entry hist[HISTORY];
    int hist_n, hist_at;
    molmoact_component weights[16]; /* molmoact_get_component: each component's weights */
    int n_components;
} S;

static volatile sig_atomic_t g_stop;

static void wake_loop(void) {
    const char b = 1;
    ssize_t n = write(S.wake[1], &b, 1);
    (void)n;
}

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
    const int e = errno;
    wake_loop();
    errno = e;
}

/* ------------------------------------------------------------------------------ messages and log */


/* printable ASCII only (a client's key may be any bytes; a text frame must be UTF-8) */
static void printable(char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e) *s = '?';
}

/* What a client is told about a failed inference: built from the status and the parts of the
 * library's message that are made of fixed words (an observation field, a worker's name), never
 * a path or other internal text; the whole message goes to the log. */
static void client_error(int status, const char *msg, char *out, size_t cap) {
    if ((status == MOLMOACT_ERR_ARG || status == MOLMOACT_ERR_SHAPE || status == MOLMOACT_ERR_RANGE || status == MOLMOACT_ERR_FORMAT ||
         status == MOLMOACT_ERR_NOMEM || status == MOLMOACT_ERR_UNSUPPORTED) &&
        !strncmp(msg, "observation", 11)) {
        snprintf(out, cap, "%s", msg); /* the API's checks of the observation name only its fields */
        printable(out);
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
            printable(out);
            return;
        }
    }
    snprintf(out, cap, "server: the request failed (%s); the server log has the details", molmoact_status_name((molmoact_status)status));
}

static void log_line(const char *client, const char *proto, size_t bytes_in, size_t bytes_out, const job *j, const char *outcome) {
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
    }
    fputs(line, stderr);
    fputs(", \"outcome\": ", stderr);
    ma_json_write_string(stderr, outcome, strlen(outcome));
    fputs("}\n", stderr);
    fflush(stderr);
}

static void log_event(const char *event, const char *client, const char *detail) {
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
}

/* One inference request ends: answered (reason < 0) or refused. Every request is counted once,
 * here: the counters and histograms of /metrics (over the server's life) and the status page's
 * history (the last HISTORY requests, failures included). t_first: its first byte (0: now). */
static void account(int ws, int reason, double t_first, const job *j) {
    const double now = ma_now_ms();
    const double ms = t_first > 0 && t_first < now ? now - t_first : 0;
    S.requests[ws ? 1 : 0]++;
    if (reason >= 0) S.failures[reason]++, S.failed++;
    else S.served++;
    ma_hist_observe(&S.req_hist, ms / 1e3);
    history_entry *h = &S.hist[S.hist_at];
    S.hist_at = (S.hist_at + 1) % HISTORY;
    if (S.hist_n < HISTORY) S.hist_n++;
    memset(h, 0, sizeof *h);
    h->t = (now - S.t_start) / 1e3;
    h->request = ms;
    h->ok = reason < 0;
    h->ws = ws;
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
            ma_hist_observe(&S.comp_hist[i], h->c[i] / 1e3);
        }
    }
}

/* a refused inference request on connection c (its first byte: c->msg_start) */
static void refused(const conn *c, int ws, int reason) { account(ws, reason, c->msg_start, NULL); }

/* ------------------------------------------------------------------------------ inference thread */

/* main thread only (S.rx_total is the loop's) */
static void job_free(job *j) {
    S.rx_total -= j->body_held;
    free(j->body);
    ma_wire_request_free(&j->req);
    molmoact_result_free(&j->res);
    free(j);
}

/* splitmix64 over the server's state: one seed per request that brings neither noise nor seed */
static uint64_t next_seed(void) {
    uint64_t z = (S.rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* decoding (JSON, msgpack, base64, PNG/JPEG, the 180-degree flip) runs here, never on the
 * network loop: a large request delays the queue behind it, not health checks or pings */
static void run_job(job *j) {
    j->t_start = ma_now_ms();
    ma_error e = {0};
    const ma_wire_model wm = {S.info.action_horizon, S.info.max_action_dim, S.info.state_dim, S.info.n_steps};
    const ma_status s = j->json ? ma_wire_decode_json((const char *)j->body, j->bytes_in, S.o->flip180, &wm, &j->req, &e)
                                : ma_wire_decode_msgpack(j->body, j->bytes_in, S.o->flip180, &wm, &j->req, &e);
    free(j->body);
    j->body = NULL;
    if (s) {
        j->status = MOLMOACT_ERR_ARG;
        snprintf(j->msg, sizeof j->msg, "%s", e.msg); /* wire.c names the client's keys, nothing else */
        printable(j->msg);
        snprintf(j->log, sizeof j->log, "%s", e.msg);
    } else {
        j->decoded = 1;
        /* neither noise nor seed: fresh noise per request, as openpi's and LeRobot's policies
         * draw it, from the server's generator (serve --seed N: a reproducible sequence) */
        if (!j->req.obs.noise && !j->req.obs.have_seed) {
            j->req.obs.have_seed = 1;
            j->req.obs.seed = next_seed();
            j->server_seed = 1;
        }
        molmoact_error err;
        j->t_infer = j->t_decoded = ma_now_ms();
        j->status = molmoact_infer(S.engine, &j->req.obs, &j->res, &err);
        j->t_infer = ma_now_ms() - j->t_infer;
        /* n_action_steps: the first steps of the chunk */
        if (!j->status && j->req.n_action_steps > 0 && j->req.n_action_steps < j->res.n_steps) j->res.n_steps = j->req.n_action_steps;
        if (j->status) {
            client_error(j->status, err.message, j->msg, sizeof j->msg);
            snprintf(j->log, sizeof j->log, "%s", err.message);
        }
    }
    /* a large request's parse tree and frames are gone: give their pages back */
    if (j->bytes_in > (4u << 20)) malloc_trim(0);
    j->t_done = ma_now_ms();
}

static void *infer_thread(void *arg) {
    (void)arg;
    pthread_mutex_lock(&S.mu);
    for (;;) {
        while (!S.queue && !S.quit) pthread_cond_wait(&S.cv, &S.mu);
        if (!S.queue) break;
        job *j = S.queue;
        S.queue = j->next;
        if (!S.queue) S.queue_tail = &S.queue;
        S.n_queued--;
        S.running = 1;
        pthread_mutex_unlock(&S.mu);
        run_job(j);
        pthread_mutex_lock(&S.mu);
        j->next = S.done;
        S.done = j;
        S.running = 0;
        wake_loop();
    }
    pthread_mutex_unlock(&S.mu);
    return NULL;
}

static void enqueue(job *j) {
    pthread_mutex_lock(&S.mu);
    j->next = NULL;
    *S.queue_tail = j;
    S.queue_tail = &j->next;
    S.n_queued++;
    pthread_cond_signal(&S.cv);
    pthread_mutex_unlock(&S.mu);
}

/* ------------------------------------------------------------------------------ connections */

static conn *find_conn(uint64_t id) {
    for (conn *c = S.conns; c; c = c->next)
        if (c->id == id) return c;
    return NULL;
}

static void conn_free(conn *c) {
    for (conn **p = &S.conns; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    S.n_conns--;
    S.rx_total -= c->rx_cap;
    close(c->fd);
    free(c->in);
    free(c->rx);
    free(c->out);
    free(c);
}

/* output: appended to one buffer per connection, written as the socket takes it */
static int out_append(conn *c, const void *data, size_t len) {
    if (c->out_off && c->out_off == c->out_len) c->out_off = c->out_len = 0;
    if (c->out_len + len > c->out_cap) {
        if (c->out_off) { /* compact first */
            memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
            c->out_len -= c->out_off;
            c->out_off = 0;
        }
        if (ma_grow_array(&c->out, &c->out_cap, c->out_len, len, 1)) return -1;
    }
    if (c->out_len == c->out_off) c->out_since = ma_now_ms();
    memcpy(c->out + c->out_len, data, len);
    c->out_len += len;
    return 0;
}

static int out_pending(const conn *c) { return c->out_len > c->out_off; }

/* over OUT_PAUSE_BYTES unsent: the connection's requests wait (and its socket is not read)
 * until the client has read its replies */
static int out_full(const conn *c) { return c->out_len - c->out_off > OUT_PAUSE_BYTES; }

/* ------------------------------------------------------------------------------ HTTP replies */

static const char *reason_phrase(int code) {
    switch (code) {
    case 100: return "Continue";
    case 101: return "Switching Protocols";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 417: return "Expectation Failed";
    case 426: return "Upgrade Required";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
    }
}

/* one response; `extra` is more header lines (each ending in CRLF). Closes the connection after
 * it when the request asked so, or when `close_after` (an unread body, a refused request). */
static void http_respond(conn *c, int code, const char *ctype, const void *body, size_t len, const char *extra, int close_after) {
    if (close_after || !c->keep_alive || S.stopping) c->closing = 1;
    char h[1024];
    const int n = snprintf(h, sizeof h,
                           "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nCache-Control: no-store\r\n"
                           "X-Content-Type-Options: nosniff\r\n%s%s\r\n",
                           code, reason_phrase(code), ctype, len, extra ? extra : "", c->closing ? "Connection: close\r\n" : "");
    if (out_append(c, h, (size_t)n) || (!c->head_only && len && out_append(c, body, len))) c->closing = 1;
    c->last_active = ma_now_ms();
}

static void http_json(conn *c, int code, cJSON *o, const char *extra, int close_after) {
    char *s = cJSON_PrintUnformatted(o);
    http_respond(c, code, "application/json", s ? s : "{}", s ? strlen(s) : 2, extra, close_after);
    free(s);
    cJSON_Delete(o);
}

static void http_error_x(conn *c, int code, const char *msg, const char *extra, int close_after) {
    char clean[1100];
    snprintf(clean, sizeof clean, "%s", msg);
    printable(clean);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "error", clean);
    http_json(c, code, o, extra ? extra : code == 401 ? "WWW-Authenticate: Api-Key\r\n" : NULL, close_after);
}

static void http_error(conn *c, int code, const char *msg, int close_after) { http_error_x(c, code, msg, NULL, close_after); }

/* ------------------------------------------------------------------------------ websocket replies */

static void ws_send(conn *c, int opcode, const void *data, size_t len) {
    uint8_t h[10];
    const size_t hl = ma_ws_frame_header(h, opcode, len);
    if (out_append(c, h, hl) || (len && out_append(c, data, len))) c->closing = 1;
}

/* a close frame with a code and reason; nothing more is read or sent after it */
static void ws_close(conn *c, int code, const char *reason) {
    if (c->closing) return;
    uint8_t p[125];
    size_t n = strlen(reason);
    if (n > 120) n = 120;
    p[0] = (uint8_t)(code >> 8);
    p[1] = (uint8_t)code;
    memcpy(p + 2, reason, n);
    ws_send(c, MA_WS_CLOSE, p, n + 2);
    c->closing = 1;
}

/* a websocket error: a text frame naming the fault, then the close code (as openpi's server) */
static void ws_error(conn *c, const char *msg, int code) {
    char clean[1100];
    snprintf(clean, sizeof clean, "%s", msg);
    printable(clean);
    ws_send(c, MA_WS_TEXT, clean, strlen(clean));
    ws_close(c, code, code == 1009 ? "message too big" : code == 1001 ? "server shutting down" : "request failed");
}

/* ------------------------------------------------------------------------------ pages */

static void add_precision(cJSON *j) {
    cJSON *pr = cJSON_AddObjectToObject(j, "precision");
    cJSON_AddStringToObject(pr, "vision", S.info.precision[0]);
    cJSON_AddStringToObject(pr, "llm", S.info.precision[1]);
    cJSON_AddStringToObject(pr, "action", S.info.precision[2]);
}

static cJSON *health_json(void) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "status", S.stopping ? "stopping" : "ok");
    cJSON_AddStringToObject(j, "model", S.model_name);
    cJSON_AddStringToObject(j, "repo_id", S.model_name);
    cJSON_AddStringToObject(j, "device", S.backend);
    char dt[64];
    snprintf(dt, sizeof dt, "%s/%s/%s", S.info.precision[0], S.info.precision[1], S.info.precision[2]);
    cJSON_AddStringToObject(j, "dtype", dt);
    cJSON_AddStringToObject(j, "variant", S.info.variant);
    add_precision(j);
    cJSON_AddStringToObject(j, "norm_tag", S.info.norm_tag);
    cJSON_AddNumberToObject(j, "num_cameras", 2);
    cJSON_AddNumberToObject(j, "state_dim", S.info.state_dim);
    cJSON_AddNumberToObject(j, "action_horizon", S.info.n_steps);
    cJSON_AddNumberToObject(j, "action_dim", S.info.action_dim);
    cJSON_AddStringToObject(j, "version", molmoact_version());
    return j;
}

/* the history's successful requests: a component's values (ms), oldest first; returns how many */
static int history_values(const char *key, double *v) {
    int n = 0;
    for (int i = 0; i < S.hist_n; i++) {
        const history_entry *h = &S.hist[(S.hist_at - S.hist_n + i + HISTORY) % HISTORY];
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

/* what the status page's percentile table lists: the whole request, then its parts */
static const char *const PCT_KEYS[] = {"request",        "queue",       "decode",     "preprocess", "vision",
                                       "llm_split0",     "llm_split1",  "llm_split2", "llm_split3", "llm",
                                       "action_context", "action_step", "transfer",   "host",       "total"};

static cJSON *status_json(void) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", S.model_name);
    cJSON_AddStringToObject(j, "variant", S.info.variant);
    cJSON_AddStringToObject(j, "version", molmoact_version());
    add_precision(j);
    cJSON_AddStringToObject(j, "mode", S.info.inproc ? "inproc" : "resident, 6 worker processes");
    cJSON_AddNumberToObject(j, "uptime_s", (ma_now_ms() - S.t_start) / 1e3);
    cJSON_AddNumberToObject(j, "requests_served", (double)S.served);
    cJSON_AddNumberToObject(j, "requests_failed", (double)S.failed);
    cJSON *fr = cJSON_AddObjectToObject(j, "failures");
    for (int i = 0; i < F_N; i++)
        if (S.failures[i]) cJSON_AddNumberToObject(fr, FAIL_REASON[i], (double)S.failures[i]);
    cJSON_AddNumberToObject(j, "clients", S.n_conns);
    /* each component's precision and the dtypes its weights are stored in (bytes) */
    cJSON *comps = cJSON_AddArrayToObject(j, "components");
    for (int i = 0; i < S.n_components; i++) {
        const molmoact_component *w = &S.weights[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", w->name);
        cJSON_AddStringToObject(e, "precision", w->precision);
        if (w->n_dtypes) cJSON_AddStringToObject(e, "dtype", w->dtype[0]);
        else cJSON_AddNullToObject(e, "dtype");
        cJSON *b = cJSON_AddObjectToObject(e, "bytes");
        for (int k = 0; k < w->n_dtypes; k++) cJSON_AddNumberToObject(b, w->dtype[k], (double)w->bytes[k]);
        cJSON_AddItemToArray(comps, e);
    }
    cJSON *arr = cJSON_AddArrayToObject(j, "recent");
    for (int i = 0; i < S.hist_n; i++) {
        const history_entry *h = &S.hist[(S.hist_at - S.hist_n + i + HISTORY) % HISTORY];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "t_s", h->t);
        cJSON_AddBoolToObject(e, "ok", h->ok);
        cJSON_AddStringToObject(e, "protocol", h->ws ? "websocket" : "http");
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
static char *metrics_text(size_t *len) {
    ma_textbuf t = {0};
    ma_tb_family(&t, "molmoact_info", "gauge",
                 "The server: molmoact's version, the model's name and variant, the backend and the mode (always 1).");
    ma_tb_printf(&t, "molmoact_info{version=\"");
    ma_tb_label_value(&t, molmoact_version());
    ma_tb_printf(&t, "\",model=\"");
    ma_tb_label_value(&t, S.model_name);
    ma_tb_printf(&t, "\",variant=\"");
    ma_tb_label_value(&t, S.info.variant);
    ma_tb_printf(&t, "\",backend=\"");
    ma_tb_label_value(&t, S.backend);
    ma_tb_printf(&t, "\",mode=\"%s\"} 1\n", S.info.inproc ? "inproc" : "resident");
    ma_tb_family(&t, "molmoact_component_precision_info", "gauge",
                 "Each component's precision (its context's, or checkpoint) and the dtype most of its weights are stored in (always 1).");
    for (int i = 0; i < S.n_components; i++) {
        const molmoact_component *w = &S.weights[i];
        ma_tb_printf(&t, "molmoact_component_precision_info{component=\"%s\",precision=\"", w->name);
        ma_tb_label_value(&t, w->precision);
        ma_tb_printf(&t, "\",dtype=\"%s\"} 1\n", w->n_dtypes ? w->dtype[0] : "unknown");
    }
    ma_tb_family(&t, "molmoact_start_time_seconds", "gauge", "When the server started listening, in seconds since the Unix epoch.");
    ma_tb_printf(&t, "molmoact_start_time_seconds %.3f\n", S.wall_start);
    ma_tb_family(&t, "molmoact_uptime_seconds", "gauge", "Seconds since the server started listening.");
    ma_tb_printf(&t, "molmoact_uptime_seconds %.3f\n", (ma_now_ms() - S.t_start) / 1e3);
    ma_tb_family(&t, "molmoact_requests_total", "counter",
                 "Inference requests (POST /act bodies, websocket request messages) the server finished, answered or refused.");
    ma_tb_printf(&t, "molmoact_requests_total{protocol=\"http\"} %llu\n", (unsigned long long)S.requests[0]);
    ma_tb_printf(&t, "molmoact_requests_total{protocol=\"websocket\"} %llu\n", (unsigned long long)S.requests[1]);
    ma_tb_family(&t, "molmoact_request_failures_total", "counter", "Inference requests that failed or were refused, by reason.");
    for (int i = 0; i < F_N; i++)
        ma_tb_printf(&t, "molmoact_request_failures_total{reason=\"%s\"} %llu\n", FAIL_REASON[i], (unsigned long long)S.failures[i]);
    ma_tb_family(&t, "molmoact_request_duration_seconds", "histogram",
                 "Inference requests' time from their first byte to their reply or refusal, in seconds.");
    ma_tb_histogram(&t, "molmoact_request_duration_seconds", NULL, &S.req_hist);
    ma_tb_family(&t, "molmoact_component_duration_seconds", "histogram",
                 "Successful requests' time per part, in seconds: queue (from the first byte until the inference thread takes it), "
                 "decode, preprocess, each session, shared-memory transfer, host glue, and total (the engine's whole pipeline).");
    for (int i = 0; i < C_N; i++) {
        char l[48];
        snprintf(l, sizeof l, "component=\"%s\"", COMPONENT[i]);
        ma_tb_histogram(&t, "molmoact_component_duration_seconds", l, &S.comp_hist[i]);
    }
    pthread_mutex_lock(&S.mu);
    const int queued = S.n_queued, running = S.running;
    pthread_mutex_unlock(&S.mu);
    int ws = 0;
    for (const conn *c = S.conns; c; c = c->next) ws += c->is_ws;
    ma_tb_family(&t, "molmoact_connected_clients", "gauge", "Open client connections (HTTP and websocket).");
    ma_tb_printf(&t, "molmoact_connected_clients %d\n", S.n_conns);
    ma_tb_family(&t, "molmoact_websocket_clients", "gauge", "Open websocket connections.");
    ma_tb_printf(&t, "molmoact_websocket_clients %d\n", ws);
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

/* The status page: static HTML, its script from /status.js (the Content-Security-Policy allows
 * no inline script), every value from /status.json placed with textContent or as SVG
 * attributes, never parsed as HTML. */
static const char STATUS_PAGE[] =
    "<!doctype html><html><head><meta charset=utf-8><title>molmoact serve</title><style>"
    "body{font:14px sans-serif;margin:24px;color:#222}table{border-collapse:collapse}td,th{padding:2px 12px 2px 0;text-align:left}"
    "th{color:#666;font-weight:normal;border-bottom:1px solid #ccc}td.n{text-align:right;font-variant-numeric:tabular-nums}"
    "h1{font-size:20px}h2{font-size:16px;margin-top:22px}.k{color:#666}#legend span{display:inline-block;margin-right:14px}"
    "#legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:middle}</style></head><body>"
    "<h1>molmoact serve</h1><table id=info></table>"
    "<h2>Precision per component</h2><table id=precision><thead><tr><th>component<th>precision<th>weights stored as</tr></thead>"
    "<tbody></tbody></table>"
    "<h2>Latency of the last requests (ms per component)</h2>"
    "<svg id=plot width=760 height=280 style='border:1px solid #ccc' xmlns='http://www.w3.org/2000/svg'></svg><div id=legend></div>"
    "<h2 id=pct-title>Percentiles (ms)</h2><table id=percentiles><thead><tr><th>component<th>p50<th>p90<th>p99</tr></thead>"
    "<tbody></tbody></table>"
    "<script src='status.js'></script></body></html>";

static const char STATUS_JS[] =
    "'use strict';\n"
    "const parts=[['vision','#4e79a7'],['llm','#f28e2b'],['action_context','#e15759'],['action_step','#76b7b2'],"
    "['transfer','#59a14f'],['host','#edc948']];\n"
    "const FAIL='#d62728';\n"
    "const NS='http://www.w3.org/2000/svg';\n"
    "function el(tag,attrs,text){const e=tag.startsWith('svg:')?document.createElementNS(NS,tag.slice(4)):document.createElement(tag);"
    "for(const k in attrs)e.setAttribute(k,attrs[k]);if(text!==undefined)e.textContent=String(text);return e}\n"
    /* axis ticks in steps of 1, 2 or 5 times a power of ten, about n intervals, from 0 to the
     * first tick at or above max; the labels with the step's decimals */
    "function niceTicks(max,n){n=n||5;if(!(max>0))max=1;const raw=max/n,mag=Math.pow(10,Math.floor(Math.log10(raw)));"
    "let step=10*mag;for(const m of [1,2,5])if(m*mag>=raw*(1-1e-12)){step=m*mag;break}\n"
    " const k=Math.max(1,Math.ceil(max/step*(1-1e-12))),dec=Math.max(0,-Math.floor(Math.log10(step)+1e-9)),labels=[];\n"
    " for(let i=0;i<=k;i++)labels.push((i*step).toFixed(dec));return {step:step,top:k*step,labels:labels}}\n"
    "function ms(v){return v>=100?v.toFixed(0):v>=10?v.toFixed(1):v.toFixed(2)}\n"
    "function bytes(b){return b>=1<<30?(b/(1<<30)).toFixed(1)+' GiB':b>=1<<20?(b/(1<<20)).toFixed(1)+' MiB':(b/1024).toFixed(1)+' KiB'}\n"
    "function dtypes(c){const b=c.bytes||{},ks=Object.keys(b);if(!ks.length)return 'unknown';let t=0;ks.forEach(k=>t+=b[k]);"
    "return ks.map(k=>ks.length>1?k+' '+(100*b[k]/t).toFixed(b[k]/t<0.01?1:0)+'%':k).join(', ')+' ('+bytes(t)+')'}\n"
    "function rows(id,list){const tb=document.querySelector('#'+id+' tbody');tb.replaceChildren();"
    "list.forEach(r=>{const tr=el('tr');r.forEach((v,i)=>tr.append(el('td',i&&id==='percentiles'?{class:'n'}:{},v)));tb.append(tr)})}\n"
    "function draw(s){\n"
    " const info=document.getElementById('info');info.replaceChildren();\n"
    " [['model',s.model],['variant',s.variant],['mode',s.mode],['uptime',s.uptime_s.toFixed(0)+' s'],['requests served',s.requests_served],"
    "['requests failed',s.requests_failed+(Object.keys(s.failures).length?' ('+Object.keys(s.failures).map(k=>k+' '+s.failures[k]).join(', ')+')':'')],"
    "['clients',s.clients],['version',s.version]].forEach(r=>{const tr=el('tr');tr.append(el('td',{class:'k'},r[0]),el('td',{},r[1]));"
    "info.append(tr)});\n"
    " rows('precision',s.components.map(c=>[c.name,c.precision,dtypes(c)]));\n"
    " document.getElementById('pct-title').textContent='Percentiles over the last '+s.percentiles_over+' successful request'+(s.percentiles_over===1?'':'s')+' (ms)';\n"
    " rows('percentiles',Object.keys(s.percentiles).map(k=>[k,ms(s.percentiles[k].p50),ms(s.percentiles[k].p90),ms(s.percentiles[k].p99)]));\n"
    " const svg=document.getElementById('plot'),W=760,H=280,L=50,B=20,T=12,R=10;let max=0;svg.replaceChildren();\n"
    " s.recent.forEach(r=>{let t=0;parts.forEach(p=>t+=r[p[0]]);max=Math.max(max,t)});\n"
    " const tk=niceTicks(max),top=tk.top,ph=H-B-T;\n"
    " tk.labels.forEach((lab,i)=>{const y=T+ph*(1-i/(tk.labels.length-1));"
    "svg.append(el('svg:line',{x1:L,y1:y,x2:W-R,y2:y,stroke:i?'#eee':'#999'}),el('svg:text',{class:'tick',x:L-6,y:y+4,'font-size':11,'text-anchor':'end'},lab))});\n"
    " svg.append(el('svg:line',{x1:L,y1:T,x2:L,y2:H-B,stroke:'#999'}));\n"
    " const n=s.recent.length,bw=n?Math.min(24,Math.max(2,(W-L-R-4)/n-2)):0;\n"
    " s.recent.forEach((r,i)=>{let y=H-B;const x=L+4+i*(bw+2);\n"
    "  if(!r.ok){const g=el('svg:g',{class:'fail'}),c=x+bw/2,h=Math.max(3,Math.min(6,bw/2+1));"
    "g.append(el('svg:title',{},'failed: '+r.reason+' ('+r.protocol+', '+ms(r.request)+' ms)'),"
    "el('svg:rect',{x:x,y:T,width:bw,height:ph,fill:FAIL,'fill-opacity':0.12}),"
    "el('svg:path',{d:'M'+(c-h)+' '+(H-B-2*h-2)+'l'+2*h+' '+2*h+'m0 '+(-2*h)+'l'+(-2*h)+' '+2*h,stroke:FAIL,'stroke-width':2}));svg.append(g);return}\n"
    "  parts.forEach(p=>{const h=ph*r[p[0]]/top;y-=h;svg.append(el('svg:rect',{x:x,y:y,width:bw,height:h,fill:p[1]}))})});\n"
    " svg.append(el('svg:text',{x:L+4,y:H-4,'font-size':11,fill:'#666'},'oldest'),el('svg:text',{x:W-R,y:H-4,'font-size':11,fill:'#666','text-anchor':'end'},'newest'));\n"
    " const lg=document.getElementById('legend');lg.replaceChildren();\n"
    " parts.concat([['failed request',FAIL]]).forEach(p=>{const sp=el('span'),i=el('i');i.style.background=p[1];sp.append(i,document.createTextNode(p[0]));lg.append(sp)})}\n"
    "function tick(){fetch('status.json').then(r=>r.json()).then(draw).catch(()=>{})}\n"
    "tick();setInterval(tick,2000);\n";

static const char PAGE_HEADERS[] =
    "Content-Security-Policy: default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; "
    "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'\r\n";

/* ------------------------------------------------------------------------------ requests */

static int authorised(const ma_http_req *r) {
    if (!S.have_key) return 1;
    static const char pre[] = "Api-Key ";
    const size_t pl = sizeof pre - 1;
    if (r->authorization_len < pl || strncmp(r->authorization, pre, pl)) return 0;
    const uint8_t *k = (const uint8_t *)r->authorization + pl;
    const size_t kl = r->authorization_len - pl;
    /* constant time in the key's length: every byte of the stored key is compared */
    unsigned diff = kl != S.api_key_len || r->authorization_len >= sizeof r->authorization;
    for (size_t i = 0; i < S.api_key_len; i++) diff |= (unsigned)(S.api_key[i] ^ (i < kl ? k[i] : 0));
    return diff == 0;
}

static int rx_reserve(conn *c, size_t need) {
    if (need <= c->rx_cap) return 0;
    if (need > S.max_bytes) return -1;
    const size_t cap = ma_grow_cap(c->rx_cap, need, 65536, S.max_bytes);
    if (S.rx_total - c->rx_cap + cap > S.rx_total_max) return -3; /* every client's buffers together */
    uint8_t *p = realloc(c->rx, cap);
    if (!p) return -2;
    S.rx_total += cap - c->rx_cap;
    c->rx = p;
    c->rx_cap = cap;
    return 0;
}

/* does the query string hold name=value? */
static int query_has(const char *q, const char *name, const char *value) {
    char want[96];
    snprintf(want, sizeof want, "%s=%s", name, value);
    const size_t wl = strlen(want);
    for (const char *p = q; p && *p;) {
        const char *amp = strchr(p, '&');
        const size_t n = amp ? (size_t)(amp - p) : strlen(p);
        if (n == wl && !memcmp(p, want, wl)) return 1;
        p = amp ? amp + 1 : NULL;
    }
    return 0;
}

/* the request data the server holds for its clients: every connection's buffers and the bodies
 * of requests queued or running; bounded by S.rx_total_max (issue 36 F5) */
static void start_request(conn *c, int json) {
    const char *proto = c->is_ws ? "ws" : "http";
    if (S.stopping) {
        refused(c, c->is_ws, F_SHUTTING_DOWN);
        log_line(c->peer, proto, c->rx_len, 0, NULL, "refused: shutting down");
        if (c->is_ws) ws_error(c, "server: shutting down", 1001);
        else http_error(c, 503, "server: shutting down", 1);
        c->rx_len = 0;
        return;
    }
    job *j = calloc(1, sizeof *j);
    if (!j) {
        refused(c, c->is_ws, F_OVERLOADED);
        if (c->is_ws) ws_error(c, "server: out of memory", 1011);
        else http_error(c, 500, "server: out of memory", 1);
        return;
    }
    j->conn_id = c->id;
    j->is_ws = c->is_ws;
    j->json = json;
    j->list_format = !c->is_ws && query_has(c->req.query, "format", "list");
    j->bytes_in = c->rx_len;
    j->body = c->rx;          /* handed over: the next message gets a new buffer */
    j->body_held = c->rx_cap; /* still counted in S.rx_total until the job comes back */
    c->rx = NULL;
    c->rx_len = c->rx_cap = 0;
    if (!j->body) j->body = calloc(1, 1);
    j->t_recv = c->msg_start ? c->msg_start : ma_now_ms();
    snprintf(j->peer, sizeof j->peer, "%s", c->peer);
    c->busy = 1;
    c->msg_start = 0;
    if (!c->is_ws) c->hstate = H_BUSY;
    enqueue(j);
}

static void process_http(conn *c);
static void process_ws(conn *c);

/* what is buffered, by the connection's protocol: HTTP, then the websocket an upgrade in it
 * began (its first frames may have come with the request) */
static void process_input(conn *c) {
    if (!c->is_ws) process_http(c);
    if (c->is_ws) process_ws(c);
}

/* the HTTP status of a failed job, and its reason */
static int job_http_code(const job *j) {
    return !j->decoded                                                         ? 400
           : j->status == MOLMOACT_ERR_WORKER                                  ? 503
           : (j->status == MOLMOACT_ERR_NOMEM || j->status == MOLMOACT_ERR_IO) ? 500
                                                                               : 400;
}

static int job_reason(const job *j) {
    const int code = job_http_code(j);
    return code == 503 ? F_WORKER : code == 500 ? F_INTERNAL : F_BAD_REQUEST;
}

static void finish_job(job *j) {
    conn *c = find_conn(j->conn_id);
    if (c && c->dead) c = NULL; /* gone this turn (reset, write error): nothing more for it */
    const char *proto = j->is_ws ? "ws" : "http";
    if (!c) {
        account(j->is_ws, j->status ? job_reason(j) : -1, j->t_recv, j);
        log_line(j->peer, proto, j->bytes_in, 0, j, j->status ? j->log : "ok (client gone before the reply)");
        job_free(j);
        return;
    }
    c->busy = 0;
    c->last_active = ma_now_ms();
    if (!c->is_ws) c->hstate = H_HEAD;
    if (j->req.ignored[0] && !c->ignored_logged) { /* once per connection */
        c->ignored_logged = 1;
        log_event("ignored keys", c->peer, j->req.ignored);
    }
    if (j->status) {
        log_line(c->peer, proto, j->bytes_in, strlen(j->msg), j, j->log);
        if (c->is_ws) ws_error(c, j->msg, 1011);
        else http_error(c, job_http_code(j), j->msg, 0);
        account(j->is_ws, job_reason(j), j->t_recv, j);
        job_free(j);
        if (!c->is_ws) process_input(c);
        return;
    }
    if (c->is_ws) {
        ma_wire_buf b = {0};
        ma_error err = {0};
        /* server_timing as openpi's server gives it: infer_ms this request's inference, and from
         * the second reply on prev_total_ms, the previous request's whole cycle (from the end of
         * the reply before it, or the connection's start, to the end of its own reply) */
        if (ma_wire_encode_reply(&j->res, j->t_infer, c->n_replies ? c->prev_total_ms : -1.0, &b, &err)) {
            ws_error(c, err.msg, 1011);
            account(1, F_INTERNAL, j->t_recv, j);
        } else {
            ws_send(c, MA_WS_BINARY, b.data, b.len);
            log_line(c->peer, proto, j->bytes_in, b.len, j, "ok");
            account(1, -1, j->t_recv, j);
        }
        free(b.data);
        c->n_replies++;
        const double t_end = ma_now_ms();
        c->prev_total_ms = t_end - c->cycle_start;
        c->cycle_start = t_end;
    } else {
        /* actions as AllenAI's servers return them: a json_numpy float32 [N, D] array; nested
         * lists with ?format=list */
        cJSON *o = cJSON_CreateObject();
        const size_t na = (size_t)j->res.n_steps * (size_t)j->res.action_dim;
        if (j->list_format) {
            cJSON *rows = cJSON_AddArrayToObject(o, "actions");
            for (int k = 0; k < j->res.n_steps; k++) {
                cJSON *r = cJSON_CreateArray();
                for (int d = 0; d < j->res.action_dim; d++) {
                    char num[32];
                    snprintf(num, sizeof num, "%.9g", j->res.actions[k * j->res.action_dim + d]); /* round-trips the float */
                    cJSON_AddItemToArray(r, cJSON_CreateRaw(num));
                }
                cJSON_AddItemToArray(rows, r);
            }
        } else {
            char *b64 = malloc(4 * ((na * 4 + 2) / 3) + 1);
            cJSON *a = cJSON_AddObjectToObject(o, "actions");
            if (b64 && a) {
                ma_b64_encode((const uint8_t *)j->res.actions, na * 4, b64); /* little-endian float32, as "<f4" says */
                cJSON_AddStringToObject(a, "__numpy__", b64);
                cJSON_AddStringToObject(a, "dtype", "<f4");
                const int shape[2] = {j->res.n_steps, j->res.action_dim};
                cJSON_AddItemToObject(a, "shape", cJSON_CreateIntArray(shape, 2));
            }
            free(b64);
        }
        cJSON_AddNumberToObject(o, "dt_ms", j->t_infer); /* model time, as AllenAI's servers report it */
        char *s = cJSON_PrintUnformatted(o);
        http_respond(c, 200, "application/json", s ? s : "{}", s ? strlen(s) : 2, NULL, 0);
        log_line(c->peer, proto, j->bytes_in, s ? strlen(s) : 0, j, "ok");
        account(0, -1, j->t_recv, j);
        free(s);
        cJSON_Delete(o);
    }
    job_free(j);
    if (!c->is_ws) process_input(c); /* a pipelined request waiting behind this one */
}

static void collect_done(void) {
    pthread_mutex_lock(&S.mu);
    job *d = S.done;
    S.done = NULL;
    pthread_mutex_unlock(&S.mu);
    job *rev = NULL; /* oldest first */
    while (d) {
        job *n = d->next;
        d->next = rev;
        rev = d;
        d = n;
    }
    while (rev) {
        job *n = rev->next;
        finish_job(rev);
        rev = n;
    }
}

/* ------------------------------------------------------------------------------ HTTP */

static void consume_in(conn *c, size_t n) {
    memmove(c->in, c->in + n, c->in_len - n);
    c->in_len -= n;
}

static const char NOT_FOUND[] =
    "not found: GET /healthz, /health, /act, /, /status.json, /metrics; POST /act, /reset; a websocket upgrade on any path";

static int has_body_too_big(const ma_http_req *r) { return r->content_length > 65536; }

static void finish_reset(conn *c) {
    c->hstate = H_HEAD;
    c->reset_route = 0;
    c->rx_len = 0;
    c->msg_start = 0;
    static const char body[] = "{\"status\":\"ok\",\"removed\":[]}";
    http_respond(c, 200, "application/json", body, sizeof body - 1, NULL, 0);
}

static void route(conn *c) {
    const ma_http_req *r = &c->req;
    const int get = r->method == MA_HTTP_GET || r->method == MA_HTTP_HEAD;
    const int has_body = r->chunked || r->content_length > 0;
    const char *p = r->path;
    /* the one exemption from the key and the client limit: a plain GET or HEAD of a health path;
     * a websocket upgrade there, or any other method, is decided like every other request
     * (issue 36 F7: an upgrade on /healthz skipped the key and then served inference) */
    const int health = (!strcmp(p, "/healthz") || !strcmp(p, "/health")) && get && !r->upgrade_websocket;
    c->head_only = r->method == MA_HTTP_HEAD;
    c->keep_alive = r->keep_alive;
    /* an inference request (counted in /metrics when refused here): POST /act, or a websocket
     * handshake (its refusal is the one request that connection makes) */
    const int upgrade = r->upgrade_websocket && r->method == MA_HTTP_GET;
    const int act_post = r->method == MA_HTTP_POST && !strcmp(p, "/act");
    if (c->reserved && !health) {
        if (act_post || upgrade) refused(c, upgrade, F_OVERLOADED);
        log_line(c->peer, "http", 0, 0, NULL, "refused: --max-clients reached");
        http_error(c, 503, "server: too many clients (--max-clients); /healthz and /health are still answered", 1);
        return;
    }
    if (!health && !authorised(r)) {
        if (act_post || upgrade) refused(c, upgrade, F_UNAUTHORIZED);
        log_line(c->peer, r->upgrade_websocket ? "ws" : "http", 0, 0, NULL, "refused: missing or wrong API key");
        http_error(c, 401, "missing or wrong API key (Authorization: Api-Key <key>)", has_body);
        return;
    }
    if (upgrade) {
        char accept[29];
        if (r->ws_version != 13) {
            refused(c, 1, F_BAD_REQUEST);
            http_respond(c, 426, "text/plain", "websocket version 13 only", 25, "Sec-WebSocket-Version: 13\r\n", 1);
            return;
        }
        if (ma_ws_accept_key(r->ws_key, accept)) {
            refused(c, 1, F_BAD_REQUEST);
            http_error(c, 400, "malformed Sec-WebSocket-Key", 1);
            return;
        }
        if (S.stopping) {
            refused(c, 1, F_SHUTTING_DOWN);
            http_error(c, 503, "server: shutting down", 1);
            return;
        }
        char h[256];
        const int n = snprintf(h, sizeof h,
                               "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                               "Sec-WebSocket-Accept: %s\r\n\r\n",
                               accept);
        out_append(c, h, (size_t)n);
        c->is_ws = 1;
        c->last_active = c->cycle_start = ma_now_ms();
        ma_wire_buf b = {0};
        ma_error err = {0};
        if (ma_wire_encode_metadata(&S.info, S.model_name, &b, &err)) {
            ws_close(c, 1011, "metadata");
            return;
        }
        ws_send(c, MA_WS_BINARY, b.data, b.len);
        free(b.data);
        return;
    }
    if (!strcmp(p, "/reset") && r->method == MA_HTTP_POST && has_body_too_big(r)) {
        http_error(c, 413, "POST /reset: a body of at most 64 KiB", 1);
        return;
    }
    if (!strcmp(p, "/reset") && r->method == MA_HTTP_POST) {
        /* MolmoAct2's serve_policy.py keeps sessions; this server keeps none: nothing to remove.
         * The body ({"session_id": ...}) is read and dropped. */
        c->hstate = H_BODY;
        c->body_left = r->chunked ? 0 : (uint64_t)(r->content_length > 0 ? r->content_length : 0);
        memset(&c->chunk, 0, sizeof c->chunk);
        c->rx_len = 0;
        c->reset_route = 1;
        if (!r->chunked && !c->body_left) finish_reset(c);
        return;
    }
    if (act_post) {
        if (!r->chunked && r->content_length < 0) {
            refused(c, 0, F_BAD_REQUEST);
            http_error(c, 411, "POST /act needs Content-Length or a chunked body", 1);
            return;
        }
        if (!r->chunked && r->content_length == 0) { /* what requests.post(url) sends: nothing will come (F4) */
            refused(c, 0, F_BAD_REQUEST);
            log_line(c->peer, "http", 0, 0, NULL, "request: POST /act with an empty body");
            http_error(c, 400, "request: POST /act with an empty body; send the observation (JSON, or msgpack over the websocket)", 0);
            return;
        }
        if (r->content_length > (int64_t)S.max_bytes) {
            refused(c, 0, F_TOO_LARGE);
            char m[160];
            snprintf(m, sizeof m, "request body of %lld bytes exceeds --max-message-mb %.4g", (long long)r->content_length,
                     S.o->max_message_mb);
            log_line(c->peer, "http", (size_t)r->content_length, 0, NULL, m);
            http_error(c, 413, m, 1);
            return;
        }
        if (r->expect_continue) out_append(c, "HTTP/1.1 100 Continue\r\n\r\n", 25);
        c->hstate = H_BODY;
        c->body_left = r->chunked ? 0 : (uint64_t)r->content_length;
        memset(&c->chunk, 0, sizeof c->chunk);
        c->rx_len = 0;
        if (!c->msg_start) c->msg_start = ma_now_ms();
        return;
    }
    /* everything else has no body: one that comes anyway is not read, and the connection closes */
    const int known = !strcmp(p, "/healthz") || !strcmp(p, "/health") || !strcmp(p, "/act") || !strcmp(p, "/") ||
                      !strcmp(p, "/status.json") || !strcmp(p, "/status.js") || !strcmp(p, "/metrics") || !strcmp(p, "/reset");
    if (known && (!get || !strcmp(p, "/reset"))) { /* /reset is POST only (F16) */
        char m[128];
        const char *allow = !strcmp(p, "/act") ? "GET, HEAD, POST" : !strcmp(p, "/reset") ? "POST" : "GET, HEAD";
        snprintf(m, sizeof m, "method %s is not allowed on %s (%s)", r->method_name, p, allow);
        char hdr[64];
        snprintf(hdr, sizeof hdr, "Allow: %s\r\n", allow);
        http_error_x(c, 405, m, hdr, has_body);
        return;
    }
    if (!known) {
        http_error(c, 404, NOT_FOUND, has_body);
        return;
    }
    if (!strcmp(p, "/healthz")) http_respond(c, 200, "text/plain", "OK", 2, NULL, has_body);
    else if (!strcmp(p, "/health") || !strcmp(p, "/act")) http_json(c, 200, health_json(), NULL, has_body);
    else if (!strcmp(p, "/")) http_respond(c, 200, "text/html; charset=utf-8", STATUS_PAGE, sizeof STATUS_PAGE - 1, PAGE_HEADERS, has_body);
    else if (!strcmp(p, "/status.js"))
        http_respond(c, 200, "text/javascript; charset=utf-8", STATUS_JS, sizeof STATUS_JS - 1, NULL, has_body);
    else if (!strcmp(p, "/metrics")) {
        size_t len = 0;
        char *text = metrics_text(&len);
        if (text) http_respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, len, NULL, has_body);
        else http_error(c, 500, "server: out of memory", has_body);
        free(text);
    } else http_json(c, 200, status_json(), NULL, has_body);
}

static void process_http(conn *c) {
    while (!c->closing && !c->is_ws) {
        if (c->hstate == H_BUSY) return; /* a pipelined request waits for the reply before it */
        if (c->hstate == H_HEAD) {
            if (!c->in_len) return;
            if (out_full(c)) {
                c->paused = 1;
                return;
            } /* F3: replies first */
            if (!c->msg_start) c->msg_start = ma_now_ms();
            c->head_only = 0; /* HEAD is the request's, not the connection's (F15) */
            int status = 0;
            char msg[160];
            const int r = ma_http_parse_head(c->in, c->in_len, &c->req, &status, msg, sizeof msg);
            if (r == 0) return;
            if (r < 0) {
                c->keep_alive = 0;
                log_line(c->peer, "http", c->in_len, 0, NULL, msg);
                http_error(c, status, msg, 1);
                return;
            }
            consume_in(c, c->req.head_len);
            route(c);
            if (c->hstate == H_HEAD) c->msg_start = 0; /* answered at once */
            continue;
        }
        /* H_BODY */
        if (!c->in_len) return;
        int r;
        size_t used = 0;
        char msg[160] = "";
        if (c->req.chunked) {
            size_t need = c->rx_len + c->in_len;
            if (need > S.max_bytes) need = S.max_bytes;
            r = rx_reserve(c, need);
            if (r == 0) {
                r = ma_http_chunked_feed(&c->chunk, c->in, c->in_len, &used, c->rx, &c->rx_len, c->rx_cap, msg, sizeof msg);
                if (r == -2 && c->rx_cap < S.max_bytes) r = -4; /* cannot happen: reserved for all of in */
                else if (r == -2) r = -1, snprintf(msg, sizeof msg, "request body exceeds --max-message-mb %.4g", S.o->max_message_mb);
                else if (r == -1) r = -5;
            } else r = r == -1 ? (snprintf(msg, sizeof msg, "request body exceeds --max-message-mb %.4g", S.o->max_message_mb), -1) : r;
        } else {
            used = c->in_len < c->body_left ? c->in_len : (size_t)c->body_left;
            r = rx_reserve(c, c->rx_len + used);
            if (r == 0) {
                memcpy(c->rx + c->rx_len, c->in, used);
                c->rx_len += used;
                c->body_left -= used;
                r = c->body_left == 0;
            }
        }
        if (r < 0) {
            const int code = r == -1 ? 413 : r == -5 ? 400 : 503;
            if (!c->reset_route) refused(c, 0, code == 413 ? F_TOO_LARGE : code == 400 ? F_BAD_REQUEST : F_OVERLOADED);
            if (r == -2 || r == -4) snprintf(msg, sizeof msg, "server: out of memory");
            if (r == -3) snprintf(msg, sizeof msg, "server: too much request data buffered from all clients; try again");
            log_line(c->peer, "http", c->rx_len + c->in_len, 0, NULL, msg);
            c->rx_len = 0;
            http_error(c, code, msg, 1);
            return;
        }
        consume_in(c, used);
        if (r == 1 && c->reset_route) finish_reset(c);
        else if (r == 1) start_request(c, 1);
    }
}

/* ------------------------------------------------------------------------------ websocket */

static void process_ws(conn *c) {
    while (!c->closing) {
        if (!c->in_frame) {
            if (!c->in_len) return;
            if (out_full(c)) {
                c->paused = 1;
                return;
            } /* pongs a client does not read (F3) */
            if (!c->msg_start) c->msg_start = ma_now_ms();
            char msg[128];
            const int r = ma_ws_parse_header(c->in, c->in_len, &c->frame, msg, sizeof msg);
            if (r == 0) return;
            if (r < 0) {
                refused(c, 1, F_PROTOCOL);
                log_line(c->peer, "ws", c->in_len, 0, NULL, msg);
                ws_close(c, 1002, "protocol error");
                return;
            }
            const ma_ws_frame *f = &c->frame;
            if (f->opcode >= 8) { /* control frames: whole in the buffer (at most 125 bytes) */
                if (c->in_len < f->header_len + f->len) return;
                uint8_t p[125];
                memcpy(p, c->in + f->header_len, (size_t)f->len);
                ma_ws_unmask(p, (size_t)f->len, f->mask, 0);
                consume_in(c, f->header_len + (size_t)f->len);
                if (!c->msg_opcode) c->msg_start = 0;
                if (f->opcode == MA_WS_PING) ws_send(c, MA_WS_PONG, p, (size_t)f->len);
                else if (f->opcode == MA_WS_CLOSE) {
                    int code = f->len >= 2 ? p[0] << 8 | p[1] : 1000;
                    if (f->len == 1) code = 1002;
                    ws_close(c, code == 1005 || code == 1006 || code == 1015 || code < 1000 ? 1002 : 1000, "");
                }
                continue;
            }
            if (f->opcode == MA_WS_CONT ? !c->msg_opcode : c->msg_opcode != 0) {
                refused(c, 1, F_PROTOCOL);
                log_line(c->peer, "ws", c->in_len, 0, NULL, "protocol: a continuation without a message, or a message inside another");
                ws_close(c, 1002, "protocol error");
                return;
            }
            if (c->busy) {
                refused(c, 1, F_PROTOCOL);
                log_line(c->peer, "ws", c->in_len, 0, NULL, "protocol: a request before the previous reply");
                ws_error(c, "protocol: one request at a time (wait for the reply)", 1008);
                return;
            }
            if (f->opcode == MA_WS_TEXT) {
                refused(c, 1, F_BAD_REQUEST);
                log_line(c->peer, "ws", (size_t)f->len, 0, NULL, "request: a text frame");
                ws_error(c, "request: expected a binary msgpack frame, got text", 1011);
                return;
            }
            if (f->opcode != MA_WS_CONT) c->msg_opcode = f->opcode, c->rx_len = 0;
            if (f->len > S.max_bytes - c->rx_len) {
                char m[160];
                snprintf(m, sizeof m, "request: the message exceeds --max-message-mb %.4g", S.o->max_message_mb);
                refused(c, 1, F_TOO_LARGE);
                log_line(c->peer, "ws", c->rx_len + (size_t)f->len, 0, NULL, m);
                ws_error(c, m, 1009);
                return;
            }
            /* nothing is reserved for the length a header claims: the buffer grows as the bytes
             * arrive (eight 14-byte headers claiming 32 MiB each held every client's budget,
             * issue 36 F2) */
            consume_in(c, f->header_len);
            c->in_frame = 1;
            c->frame_got = 0;
        }
        /* payload bytes of a data frame */
        const ma_ws_frame *f = &c->frame;
        size_t n = c->in_len;
        if ((uint64_t)n > f->len - c->frame_got) n = (size_t)(f->len - c->frame_got);
        const int rr = n ? rx_reserve(c, c->rx_len + n) : 0;
        if (rr) {
            refused(c, 1, F_OVERLOADED);
            const char *m = rr == -3 ? "server: too much request data buffered from all clients; try again" : "server: out of memory";
            log_line(c->peer, "ws", c->rx_len + n, 0, NULL, m);
            ws_error(c, m, rr == -3 ? 1013 : 1011);
            return;
        }
        if (n) {
            memcpy(c->rx + c->rx_len, c->in, n);
            ma_ws_unmask(c->rx + c->rx_len, n, f->mask, c->frame_got);
            c->rx_len += n;
            c->frame_got += n;
            consume_in(c, n);
        }
        if (c->frame_got < f->len) return;
        c->in_frame = 0;
        if (f->fin) {
            c->msg_opcode = 0;
            start_request(c, 0);
        }
    }
}

/* ------------------------------------------------------------------------------ the loop */

static void conn_read(conn *c) {
    /* at most 1 MiB per connection per turn of the loop: one client's large message does not
     * keep the others (health checks, pings) waiting */
    for (size_t taken = 0; taken < (1u << 20);) {
        if (out_full(c) && !c->shut) return; /* the client reads its replies first (F3) */
        if (c->in_cap - c->in_len < READ_CHUNK) {
            /* the input buffer holds at most a head or a frame header beyond what the parsers
             * consume (a connection waiting on its reply is not read) */
            if (c->in_len > MA_HTTP_MAX_HEAD + READ_CHUNK) return;
            const size_t cap = c->in_len + READ_CHUNK;
            uint8_t *p = realloc(c->in, cap);
            if (!p) {
                c->dead = 1;
                return;
            }
            c->in = p;
            c->in_cap = cap;
        }
        const size_t want = c->in_cap - c->in_len;
        const ssize_t n = recv(c->fd, c->in + c->in_len, want, 0);
        if (n > 0) {
            taken += (size_t)n;
            if (c->shut) continue; /* lingering: dropped */
            c->in_len += (size_t)n;
            if (!c->is_ws) process_http(c);
            if (c->is_ws) process_ws(c);  /* also the bytes after an upgrade */
            if ((size_t)n < want) return; /* drained for now */
            continue;
        }
        if (n == 0) { /* the client closed its side: what it sent is answered, then we close */
            c->peer_eof = 1;
            return;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) c->dead = 1;
        return;
    }
}

static void conn_write(conn *c) {
    while (out_pending(c)) {
        const ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (n > 0) {
            c->out_off += (size_t)n;
            c->out_since = ma_now_ms();
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        c->dead = 1; /* the peer is gone */
        return;
    }
}

static void accept_clients(void) {
    for (;;) {
        struct sockaddr_storage sa;
        socklen_t sl = sizeof sa;
        const int fd = accept4(S.listen_fd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        if (S.n_conns >= S.o->max_clients + HEALTH_RESERVE) {
            static const char busy[] = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
            ssize_t w = send(fd, busy, sizeof busy - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
            (void)w;
            close(fd);
            continue;
        }
        conn *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        const int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        c->fd = fd;
        c->id = ++S.next_id;
        c->reserved = S.n_conns >= S.o->max_clients;
        c->last_active = ma_now_ms();
        char ip[INET6_ADDRSTRLEN] = "?";
        int port = 0;
        if (sa.ss_family == AF_INET) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)&sa)->sin_addr, ip, sizeof ip);
            port = ntohs(((struct sockaddr_in *)&sa)->sin_port);
        } else if (sa.ss_family == AF_INET6) {
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&sa)->sin6_addr, ip, sizeof ip);
            port = ntohs(((struct sockaddr_in6 *)&sa)->sin6_port);
        }
        snprintf(c->peer, sizeof c->peer, "%s:%d#%llu", ip, port, (unsigned long long)c->id);
        c->next = S.conns;
        S.conns = c;
        S.n_conns++;
    }
}

/* deadlines: a message or body not complete within --recv-timeout-s of its first byte, a reply
 * the client does not read for as long, an idle websocket or keep-alive connection */
static void check_timers(conn *c, double now) {
    const double recv_ms = S.o->recv_timeout_s * 1e3;
    if (c->shut || c->dead) return;
    if (c->msg_start && !c->closing && now - c->msg_start > recv_ms) {
        char m[160];
        snprintf(m, sizeof m, "request: not complete within --recv-timeout-s %d", S.o->recv_timeout_s);
        if (c->is_ws || (c->hstate == H_BODY && !c->reset_route)) refused(c, c->is_ws, F_TIMEOUT);
        log_line(c->peer, c->is_ws ? "ws" : "http", c->rx_len + c->in_len, 0, NULL, m);
        c->msg_start = 0;
        if (c->is_ws) ws_error(c, m, 1008);
        else {
            c->keep_alive = 0;
            http_error(c, 408, m, 1);
        }
        return;
    }
    if (out_pending(c) && now - c->out_since > recv_ms) { /* the client reads nothing */
        log_event("dropped", c->peer, "the client did not read its reply within --recv-timeout-s");
        c->out_off = c->out_len;
        c->closing = 1;
        return;
    }
    if (!c->busy && !c->msg_start && !c->closing) {
        if (c->is_ws && S.o->idle_timeout_s > 0 && now - c->last_active > S.o->idle_timeout_s * 1e3) {
            log_event("idle", c->peer, "no request within --idle-timeout-s: closed with 1001");
            ws_close(c, 1001, "idle");
        } else if (!c->is_ws && !c->in_len && !out_pending(c) && now - c->last_active > recv_ms) c->closing = 1;
    }
}

/* Whether to close now. After the last byte is written: half-close, then read and drop until
 * the client closes or LINGER_MS pass (a close() with unread input would reset the connection
 * and could lose the reply). A client that closed its side is closed once its replies are out. */
static int finish_close(conn *c, double now) {
    if (c->dead) return 1;
    if (c->busy || out_pending(c)) return 0;
    if (c->peer_eof) return 1; /* nothing more can complete a request */
    if (!c->closing) return 0;
    if (!c->shut) {
        shutdown(c->fd, SHUT_WR);
        c->shut = 1;
        c->linger_until = now + LINGER_MS;
        return 0;
    }
    return now > c->linger_until;
}

/* input beyond the blank lines a client may send between requests: a request begun, or one
 * waiting behind a reply the client has not read */
static int unanswered_input(const conn *c) {
    for (size_t i = 0; i < c->in_len; i++)
        if (c->in[i] != '\r' && c->in[i] != '\n') return 1;
    return 0;
}

static int loop_once(int timeout_ms) {
    struct pollfd *pf = calloc((size_t)S.n_conns + 2, sizeof *pf);
    conn **pc = calloc((size_t)S.n_conns + 2, sizeof *pc);
    if (!pf || !pc) {
        free(pf);
        free(pc);
        usleep(10000);
        return 0;
    }
    int n = 0;
    pf[n++] = (struct pollfd){S.wake[0], POLLIN, 0};
    if (S.listen_fd >= 0) pf[n++] = (struct pollfd){S.listen_fd, POLLIN, 0};
    const int base = n;
    for (conn *c = S.conns; c; c = c->next) {
        short ev = 0;
        /* read while: lingering, or open and not waiting on a reply (a websocket is read during
         * its inference: pings, closes) */
        if (!c->peer_eof && !c->dead && (c->shut || (!c->closing && !out_full(c) && (c->is_ws || c->hstate != H_BUSY)))) ev |= POLLIN;
        if (out_pending(c) && !c->dead) ev |= POLLOUT;
        pc[n] = c;
        pf[n++] = (struct pollfd){c->fd, ev, 0};
    }
    const int r = poll(pf, (nfds_t)n, timeout_ms);
    if (r > 0) {
        if (pf[0].revents) {
            char b[64];
            while (read(S.wake[0], b, sizeof b) > 0) {}
        }
        for (int i = base; i < n; i++) {
            conn *c = pc[i];
            if (pf[i].revents & (POLLIN | POLLHUP | POLLERR)) conn_read(c);
            /* POLLHUP on TCP: the peer reset, or closed while we had shut our side: nothing we
             * send can arrive, and poll reports it again at once however full the input is
             * (F14: a reset after 80 KiB of pipelined requests spun the loop) */
            if (pf[i].revents & (POLLHUP | POLLERR)) c->dead = 1;
            if (out_pending(c) && !c->dead) conn_write(c);
        }
        if (S.listen_fd >= 0 && pf[1].revents & POLLIN) accept_clients();
    }
    free(pf);
    free(pc);
    collect_done();
    const double now = ma_now_ms();
    for (conn *c = S.conns, *next; c; c = next) {
        next = c->next;
        if (out_pending(c) && !c->dead) conn_write(c);
        if (c->paused && !out_full(c) && !c->dead) { /* the client read its replies: go on */
            c->paused = 0;
            process_input(c);
        }
        check_timers(c, now);
        if (finish_close(c, now)) conn_free(c);
    }
    return r;
}

/* ------------------------------------------------------------------------------ main */

/* The API key: one line of printable ASCII (what an Authorization header can carry), surrounding
 * whitespace ignored. A file with a NUL or other control byte is refused at start: a binary key
 * (head -c 32 /dev/urandom) cannot be sent in a header; encode it (base64) first. */
static int read_key(const char *path) {
    char *text = NULL;
    size_t len;
    ma_error err = {0};
    if (ma_read_file(path, 4096, &text, &len, &err)) {
        fprintf(stderr, "molmoact serve: %s\n", err.msg);
        return -1;
    }
    size_t a = 0, b = len;
    while (a < b && (text[a] == ' ' || text[a] == '\n' || text[a] == '\r' || text[a] == '\t')) a++;
    while (b > a && (text[b - 1] == ' ' || text[b - 1] == '\n' || text[b - 1] == '\r' || text[b - 1] == '\t')) b--;
    const char *why = NULL;
    if (b == a) why = "it is empty";
    else if (b - a > 255) why = "it is longer than 255 bytes";
    for (size_t i = a; !why && i < b; i++)
        if ((unsigned char)text[i] < 0x21 || (unsigned char)text[i] > 0x7e)
            why = text[i] == '\0'
                      ? "it contains a NUL byte (a binary key? encode it, e.g. base64)"
                      : "it contains a byte that is not printable ASCII (spaces, control bytes and UTF-8 cannot travel in the header)";
    if (!why) {
        memcpy(S.api_key, text + a, b - a);
        S.api_key_len = b - a;
        S.have_key = 1;
    }
    free(text);
    if (why) {
        fprintf(stderr, "molmoact serve: --api-key-file %s: %s; the key must be one line of printable ASCII\n", path, why);
        return -1;
    }
    return 0;
}

/* the port is taken: one line, whether bind() saw it or listen() did (two servers that bound the
 * port before either listened: SO_REUSEADDR lets both bind, the second listen() fails) */
static void port_in_use(const char *host, int port) {
    fprintf(stderr, "molmoact serve: port %d is already in use on %s (another server?); choose another with --port\n", port, host);
}

/* the listening socket, bound (listen() comes once the engine is loaded): the host must resolve
 * to an address of this machine */
static int open_listener(const char *host, int port) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    const int g = getaddrinfo(host, ps, &hints, &res);
    if (g) {
        fprintf(stderr, "molmoact serve: --host %s: cannot resolve it (%s)\n", host, gai_strerror(g));
        return -1;
    }
    int fd = -1, e = 0;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            e = errno;
            continue;
        }
        const int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen)) {
            e = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) {
        if (e == EADDRINUSE) port_in_use(host, port);
        else
            fprintf(stderr, "molmoact serve: cannot listen on %s port %d: %s%s\n", host, port, strerror(e),
                    e == EADDRNOTAVAIL ? " (not an address of this machine)" : "");
        return -1;
    }
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    S.bound_port = port;
    char ip[INET6_ADDRSTRLEN] = "?";
    if (!getsockname(fd, (struct sockaddr *)&sa, &sl)) {
        const int v6 = sa.ss_family == AF_INET6;
        S.bound_port = ntohs(v6 ? ((struct sockaddr_in6 *)&sa)->sin6_port : ((struct sockaddr_in *)&sa)->sin_port);
        inet_ntop(sa.ss_family, v6 ? (void *)&((struct sockaddr_in6 *)&sa)->sin6_addr : (void *)&((struct sockaddr_in *)&sa)->sin_addr, ip,
                  sizeof ip);
    }
    /* SO_REUSEADDR lets a second server bind the address while the first is still loading (the
     * port is listened on only once the engine is ready); the second would load the whole model
     * to fail at listen(). An abstract socket named after the address, held by this process
     * alone (close-on-exec: not by the workers) and released by the kernel when it exits, makes
     * the second one fail here, at once. */
    if (port) {
        struct sockaddr_un un;
        memset(&un, 0, sizeof un);
        un.sun_family = AF_UNIX;
        const int n = snprintf(un.sun_path + 1, sizeof un.sun_path - 1, "molmoact-serve:%s:%d", ip, S.bound_port);
        const int lk = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (lk >= 0 && bind(lk, (struct sockaddr *)&un, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n))) {
            const int be = errno;
            close(lk);
            if (be == EADDRINUSE) {
                port_in_use(host, port);
                close(fd);
                return -1;
            }
        } else if (lk >= 0) S.port_lock_fd = lk;
    }
    return fd;
}

int ma_serve(const ma_serve_opts *o) {
    memset(&S, 0, sizeof S);
    S.o = o;
    S.queue_tail = &S.queue;
    S.listen_fd = S.port_lock_fd = -1;
    S.wake[0] = S.wake[1] = -1;
    ma_hist_init(&S.req_hist, &ma_request_buckets);
    for (int i = 0; i < C_N; i++) ma_hist_init(&S.comp_hist[i], &ma_component_buckets);
    pthread_mutex_init(&S.mu, NULL);
    pthread_cond_init(&S.cv, NULL);
    /* the limit must leave room for a request: 1 KiB at least */
    if (!(o->max_message_mb >= 1.0 / 1024 && o->max_message_mb <= 4096)) {
        fprintf(stderr, "molmoact serve: --max-message-mb must be in [0.001, 4096]\n");
        return 1;
    }
    if (o->port < 0 || o->port > 65535) {
        fprintf(stderr, "molmoact serve: --port must be in [0, 65535]\n");
        return 1;
    }
    if (o->max_clients < 1 || o->max_clients > 100000) {
        fprintf(stderr, "molmoact serve: --max-clients must be in [1, 100000]\n");
        return 1;
    }
    S.max_bytes = (size_t)(o->max_message_mb * 1048576.0);
    if (o->have_seed) S.rng = o->seed;
    else if (getrandom(&S.rng, sizeof S.rng, 0) != (ssize_t)sizeof S.rng) S.rng = (uint64_t)time(NULL) ^ (uint64_t)getpid() << 32;
    S.rx_total_max = S.max_bytes * 4 > (256u << 20) ? S.max_bytes * 4 : (256u << 20);
    if (o->api_key_file && read_key(o->api_key_file)) return 1;
    /* the model's name: its directory's (the parent's for .../NAME/model), never the path */
    char full[PATH_MAX];
    if (!realpath(o->engine.model_dir, full)) snprintf(full, sizeof full, "%s", o->engine.model_dir);
    char *last = strrchr(full, '/');
    if (last && !strcmp(last + 1, "model") && last != full) {
        *last = '\0';
        last = strrchr(full, '/');
    }
    snprintf(S.model_name, sizeof S.model_name, "%s", last ? last + 1 : full);
    /* the address before the engine: a wrong --host fails in a moment, not after loading */
    S.listen_fd = open_listener(o->host, o->port);
    if (S.listen_fd < 0) return 1;
    if (pipe2(S.wake, O_NONBLOCK | O_CLOEXEC)) {
        fprintf(stderr, "molmoact serve: pipe: %s\n", strerror(errno));
        close(S.listen_fd);
        if (S.port_lock_fd >= 0) close(S.port_lock_fd);
        return 1;
    }

    /* the engine next; the port opens (listen) only once every session is loaded */
    molmoact_options opt;
    opt = o->engine;
    molmoact_error err;
    int rc = 1;
    if (molmoact_open(&opt, &S.engine, &err)) {
        fprintf(stderr, "molmoact serve: %s\n", err.message);
        goto out;
    }
    if (molmoact_get_info(S.engine, &S.info, &err) || molmoact_get_setting(S.engine, "backend", S.backend, sizeof S.backend, &err)) {
        fprintf(stderr, "molmoact serve: %s\n", err.message);
        goto out;
    }
    if (!S.backend[0]) snprintf(S.backend, sizeof S.backend, "cpu");
    S.n_components = molmoact_component_count();
    if (S.n_components > (int)(sizeof S.weights / sizeof S.weights[0])) S.n_components = (int)(sizeof S.weights / sizeof S.weights[0]);
    for (int i = 0; i < S.n_components; i++) {
        S.weights[i].struct_size = sizeof S.weights[i];
        if (molmoact_get_component(S.engine, i, &S.weights[i], &err)) {
            fprintf(stderr, "molmoact serve: %s\n", err.message);
            goto out;
        }
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (listen(S.listen_fd, 511)) {
        if (errno == EADDRINUSE) port_in_use(o->host, o->port);
        else fprintf(stderr, "molmoact serve: cannot listen on %s port %d: %s\n", o->host, o->port, strerror(errno));
        goto out;
    }
    S.t_start = ma_now_ms();
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    S.wall_start = (double)wall.tv_sec + (double)wall.tv_nsec / 1e9;
    pthread_t th;
    if (pthread_create(&th, NULL, infer_thread, NULL)) {
        fprintf(stderr, "molmoact serve: cannot start the inference thread\n");
        goto out;
    }
    fprintf(stderr, "{\"event\": \"listening\", \"host\": ");
    ma_json_write_string(stderr, o->host, strlen(o->host));
    fprintf(stderr, ", \"port\": %d, \"model\": ", S.bound_port);
    ma_json_write_string(stderr, S.model_name, strlen(S.model_name));
    fprintf(stderr, ", \"variant\": \"%s\", \"mode\": \"%s\"}\n", S.info.variant, S.info.inproc ? "inproc" : "resident");
    fflush(stderr);

    /* serve; on a signal: no new connections or requests; finish what is queued or running and
     * write every reply; then close every websocket with 1001 and every connection */
    double deadline = 0;
    for (;;) {
        loop_once(100);
        if (g_stop && !S.stopping) {
            S.stopping = 1;
            close(S.listen_fd);
            S.listen_fd = -1;
            log_event("draining", NULL, "a signal: finishing the queued requests");
        }
        if (!S.stopping) continue;
        pthread_mutex_lock(&S.mu);
        const int idle = !S.queue && !S.running && !S.done;
        pthread_mutex_unlock(&S.mu);
        if (!idle) continue;
        if (!deadline) deadline = ma_now_ms() + 5000;
        for (conn *c = S.conns; c; c = c->next) {
            if (c->busy || c->closing) continue;
            if (c->is_ws) ws_close(c, 1001, "server shutting down");
            else if (c->hstate == H_BODY || unanswered_input(c)) { /* a request not answered: told, not dropped (F19) */
                if (c->hstate == H_BODY && !c->reset_route) refused(c, 0, F_SHUTTING_DOWN);
                log_line(c->peer, "http", c->rx_len + c->in_len, 0, NULL, "refused: shutting down (a request not answered)");
                c->keep_alive = 0;
                http_error(c, 503, "server: shutting down; the request was not answered", 1);
            } else c->closing = 1; /* after the reply it may still be writing */
        }
        if (!S.conns || ma_now_ms() > deadline) break;
    }
    while (S.conns) conn_free(S.conns);
    pthread_mutex_lock(&S.mu);
    S.quit = 1;
    pthread_cond_signal(&S.cv);
    pthread_mutex_unlock(&S.mu);
    pthread_join(th, NULL);
    collect_done(); /* nothing is left; frees anything that is */
    rc = 0;
out:
    if (S.listen_fd >= 0) close(S.listen_fd);
    S.listen_fd = -1;
    if (S.port_lock_fd >= 0) close(S.port_lock_fd);
    S.port_lock_fd = -1;
    if (S.engine && molmoact_close(&S.engine) != MOLMOACT_OK) rc = 1;
    if (!rc) fprintf(stderr, "{\"event\": \"stopped\", \"served\": %ld, \"failed\": %ld}\n", S.served, S.failed);
    if (S.wake[0] >= 0) close(S.wake[0]);
    if (S.wake[1] >= 0) close(S.wake[1]);
    pthread_mutex_destroy(&S.mu);
    pthread_cond_destroy(&S.cv);
    return rc;
}
