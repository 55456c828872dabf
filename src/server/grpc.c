/* SPDX-License-Identifier: Apache-2.0 */
/* LeRobot's async-inference service over gRPC (internal.h, issue 39), on its own port
 * (`molmoact serve --grpc-port N`), as a connection type of the server's loop.
 *
 * HTTP/2 is nghttp2's (Debian 12: 1.52, with the rapid-reset and CONTINUATION-flood limits): it
 * frames, decodes HPACK, keeps streams and flow control, from bytes we read and to bytes we write
 * (nghttp2_session_mem_recv / mem_send), as wslay does for websockets. gRPC over it is small and
 * written here: a 5-byte prefix per message (a compressed flag, a big-endian length), the
 * response's headers, its messages and the grpc-status trailers; the messages of this service are
 * three trivial protobufs, read and written here (one varint, one bytes field).
 *
 * The service, as lerobot 7427f318 declares it (src/lerobot/transport/services.proto:38-87) and
 * its client uses it (async_inference/robot_client.py, transport/utils.py):
 *   /transport.AsyncInference/Ready                   Empty -> Empty; resets the client's state
 *   /transport.AsyncInference/SendPolicyInstructions  PolicySetup{bytes data = 1} -> Empty
 *   /transport.AsyncInference/SendObservations        stream Observation{TransferState
 *       transfer_state = 1; bytes data = 2} -> Empty; a payload in 2 MiB chunks, BEGIN, MIDDLE...,
 *       END; one that fits a chunk comes as END alone (transport/utils.py:46-71)
 *   /transport.AsyncInference/GetActions              Empty -> Actions{bytes data = 1}; a long
 *       poll: the chunk for the newest observation, or an empty Actions when none came within
 *       --lerobot-obs-timeout-s (LeRobot's obs_queue_timeout, 2 s: async_inference/constants.py:23)
 * The payloads are pickles (or lerobot PR #3048's JSON + safetensors), read by pickle.c, never
 * executed. One connection is one LeRobot client: its session (configuration, last observation,
 * action timeline) lives as long as the connection, and Ready starts it afresh.
 *
 * What a client can make us hold, each counted: its DATA bytes not yet a whole message and the
 * payload being reassembled (--max-message-mb each, --max-input-mb together), the observation
 * waiting for inference (--max-queued-mb), unsent output (--max-output-kb: reading stops beyond
 * it); nghttp2's own state is bounded by the settings we announce (concurrent streams, header
 * list size) and its flood limits. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/util.h"
#include "server/gate.h"
#include "server/internal.h"
#include "server/pickle.h"

#define GRPC_MAX_MSG (4u << 20) /* LeRobot's channel limits (transport/utils.py:36) */
#define MAX_STREAMS 16
#define MAX_HEADER_BYTES 16384
#define READ_CHUNK 65536
#define LINGER_MS 2000
#define RX_OVER_CONN 100 /* on_data: the connection's share */

enum { M_UNKNOWN, M_READY, M_POLICY, M_OBS, M_ACTIONS };
static const char *const METHOD_NAME[] = {"?", "Ready", "SendPolicyInstructions", "SendObservations", "GetActions"};

/* gRPC status codes (grpc/doc/statuscodes.md) */
enum {
    G_OK = 0,
    G_INVALID_ARGUMENT = 3,
    G_RESOURCE_EXHAUSTED = 8,
    G_FAILED_PRECONDITION = 9,
    G_UNIMPLEMENTED = 12,
    G_INTERNAL = 13,
    G_UNAVAILABLE = 14,
    G_UNAUTHENTICATED = 16
};

typedef struct gstream {
    struct gstream *next;
    struct h2conn *conn;
    int32_t id;
    int method;
    int key;      /* MA_KEY_* from the authorization header */
    int grpc_ct;  /* content-type application/grpc[+proto] */
    int bad_path; /* a :path of another service */
    size_t head_bytes;
    srv_rx rx;      /* DATA bytes not yet a whole gRPC message */
    srv_rx payload; /* the LeRobot payload being reassembled from Observation chunks */
    int in_payload;
    int n_msgs;
    int ended, responded, closed;
    int waiting; /* GetActions parked until an observation or the timeout */
    double t_first, t_wait;
    double t_between; /* SendObservations: its last whole observation (the stream open, no byte since) */
    /* the response */
    uint8_t *out;
    size_t out_len, out_off;
    int status;
    char msg[512];
} gstream;

typedef struct h2conn {
    ma_conn base;
    nghttp2_session *h2;
    gstream *streams;
    const uint8_t *pend; /* nghttp2's bytes not yet written */
    size_t pend_len;
    size_t out_held;
    double last_active, out_since;
    int dead, peer_eof, shut, goaway;
    double linger_until;
    /* the LeRobot client */
    lr_config cfg;
    ma_timeline tl;
    job *pending; /* the newest observation, decoded, waiting for a GetActions */
    lr_obs_meta pending_meta;
    int in_flight;     /* its inference is running */
    int stale;         /* ... for an observation from before the last Ready: its chunk is not the session's */
    int64_t last_step; /* the timestep of the observation last run (-1: none) */
    float last_state[64];
    int have_last_state;
    uint64_t filtered, received;
} h2conn;

static nghttp2_session_callbacks *CALLBACKS;

/* ------------------------------------------------------------------------------ output */

static size_t stream_out_bytes(h2conn *c) {
    size_t n = 0;
    for (gstream *s = c->streams; s; s = s->next) n += s->out_len - s->out_off;
    return n + c->pend_len;
}

static void sync_out(h2conn *c) {
    const size_t q = stream_out_bytes(c) + nghttp2_session_get_outbound_queue_size(c->h2) * 64;
    if (!c->out_held) c->out_since = ma_now_ms();
    ma_budget_give(&srv.budget[B_OUTPUT], c->out_held);
    ma_budget_hold(&srv.budget[B_OUTPUT], q);
    c->out_held = q;
}

/* write what nghttp2 has for the peer until the socket would block */
static void flush(h2conn *c) {
    while (!c->dead) {
        if (!c->pend_len) {
            const uint8_t *p;
            const ssize_t n = nghttp2_session_mem_send(c->h2, &p);
            if (n < 0) {
                c->dead = 1;
                break;
            }
            if (!n) break;
            c->pend = p;
            c->pend_len = (size_t)n;
        }
        const ssize_t w = send(c->base.fd, c->pend, c->pend_len, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) c->dead = 1;
            break;
        }
        c->out_since = ma_now_ms();
        c->pend += w;
        c->pend_len -= (size_t)w;
        if (c->pend_len) break;
    }
    sync_out(c);
}

static ssize_t read_body(nghttp2_session *h2, int32_t id, uint8_t *buf, size_t len, uint32_t *flags, nghttp2_data_source *src, void *user) {
    (void)h2;
    (void)id;
    (void)user;
    gstream *s = src->ptr;
    size_t n = s->out_len - s->out_off;
    if (n > len) n = len;
    memcpy(buf, s->out + s->out_off, n);
    s->out_off += n;
    if (s->out_off == s->out_len) {
        *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
        char code[8];
        snprintf(code, sizeof code, "%d", s->status);
        nghttp2_nv tr[] = {{(uint8_t *)"grpc-status", (uint8_t *)code, 11, strlen(code), NGHTTP2_NV_FLAG_NONE}};
        nghttp2_submit_trailer(s->conn->h2, s->id, tr, 1);
    }
    return (ssize_t)n;
}

/* grpc-message is percent-encoded (grpc/doc/PROTOCOL-HTTP2.md): bytes outside 0x20..0x7e and '%' */
static void percent_encode(const char *in, char *out, size_t cap) {
    static const char hex[] = "0123456789ABCDEF";
    size_t k = 0;
    for (const unsigned char *p = (const unsigned char *)in; *p && k + 4 < cap; p++) {
        if (*p >= 0x20 && *p <= 0x7e && *p != '%') out[k++] = (char)*p;
        else {
            out[k++] = '%';
            out[k++] = hex[*p >> 4];
            out[k++] = hex[*p & 15];
        }
    }
    out[k] = '\0';
}

/* a response: one message (body, len; NULL for none) and grpc-status; or, on an error, the
 * trailers-only form (one HEADERS frame with the status and the message) */
static void respond(gstream *s, int status, const char *msg, const uint8_t *body, size_t len) {
    if (s->responded || s->closed) return;
    s->responded = 1;
    s->waiting = 0;
    s->status = status;
    h2conn *c = s->conn;
    if (status != G_OK) {
        char text[600];
        snprintf(s->msg, sizeof s->msg, "%s", msg ? msg : "");
        srv_printable(s->msg);
        percent_encode(s->msg, text, sizeof text);
        char code[8];
        snprintf(code, sizeof code, "%d", status);
        nghttp2_nv h[] = {{(uint8_t *)":status", (uint8_t *)"200", 7, 3, NGHTTP2_NV_FLAG_NONE},
                          {(uint8_t *)"content-type", (uint8_t *)"application/grpc", 12, 16, NGHTTP2_NV_FLAG_NONE},
                          {(uint8_t *)"grpc-status", (uint8_t *)code, 11, strlen(code), NGHTTP2_NV_FLAG_NONE},
                          {(uint8_t *)"grpc-message", (uint8_t *)text, 12, strlen(text), NGHTTP2_NV_FLAG_NONE}};
        nghttp2_submit_response(c->h2, s->id, h, 4, NULL);
        return;
    }
    /* the message: the 5-byte prefix (not compressed, the length) then the protobuf */
    s->out = malloc(len + 5);
    if (!s->out) {
        s->responded = 0;
        respond(s, G_INTERNAL, "server: out of memory", NULL, 0);
        return;
    }
    s->out[0] = 0;
    s->out[1] = (uint8_t)(len >> 24);
    s->out[2] = (uint8_t)(len >> 16);
    s->out[3] = (uint8_t)(len >> 8);
    s->out[4] = (uint8_t)len;
    if (len) memcpy(s->out + 5, body, len);
    s->out_len = len + 5;
    s->out_off = 0;
    nghttp2_nv h[] = {{(uint8_t *)":status", (uint8_t *)"200", 7, 3, NGHTTP2_NV_FLAG_NONE},
                      {(uint8_t *)"content-type", (uint8_t *)"application/grpc", 12, 16, NGHTTP2_NV_FLAG_NONE}};
    nghttp2_data_provider dp = {.source.ptr = s, .read_callback = read_body};
    nghttp2_submit_response(c->h2, s->id, h, 2, &dp);
}

/* an empty protobuf message (Empty, or Actions with no data) */
static void respond_empty(gstream *s) { respond(s, G_OK, NULL, (const uint8_t *)"", 0); }

/* a protobuf of one bytes field (field 1, wire type 2): Actions */
static void respond_bytes(gstream *s, const uint8_t *data, size_t len) {
    uint8_t *m = malloc(len + 11);
    if (!m) {
        respond(s, G_INTERNAL, "server: out of memory", NULL, 0);
        return;
    }
    size_t k = 0;
    m[k++] = 0x0a;
    for (uint64_t v = len;; v >>= 7) {
        m[k++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        if (v <= 0x7f) break;
    }
    memcpy(m + k, data, len);
    respond(s, G_OK, NULL, m, k + len);
    free(m);
}

/* ------------------------------------------------------------------------------ protobuf */

static int read_varint(const uint8_t *p, size_t n, size_t *at, uint64_t *v) {
    *v = 0;
    for (int shift = 0; shift < 64 && *at < n; shift += 7) {
        const uint8_t b = p[(*at)++];
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return 0;
    }
    return -1;
}

/* a message of this service: the varint of field `enum_field` (0: none) and the bytes of field
 * `bytes_field`; other fields skipped as proto3 asks. -1: malformed. */
static int pb_parse(const uint8_t *p, size_t n, int enum_field, uint64_t *en, int bytes_field, const uint8_t **b, size_t *blen) {
    size_t at = 0;
    *b = NULL;
    *blen = 0;
    if (en) *en = 0;
    while (at < n) {
        uint64_t tag, v;
        if (read_varint(p, n, &at, &tag) || (tag >> 3) == 0) return -1;
        const int field = (int)(tag >> 3), wt = (int)(tag & 7);
        if (wt == 0) {
            if (read_varint(p, n, &at, &v)) return -1;
            if (field == enum_field && en) *en = v;
        } else if (wt == 2) {
            if (read_varint(p, n, &at, &v) || v > n - at) return -1;
            if (field == bytes_field) {
                *b = p + at;
                *blen = (size_t)v;
            }
            at += (size_t)v;
        } else if (wt == 1) {
            if (n - at < 8) return -1;
            at += 8;
        } else if (wt == 5) {
            if (n - at < 4) return -1;
            at += 4;
        } else return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------------ the service */

static void log_call(h2conn *c, gstream *s, size_t in, const char *outcome) {
    char proto[48];
    snprintf(proto, sizeof proto, "grpc %s", METHOD_NAME[s->method]);
    srv_log_line(c->base.peer, proto, in, 0, NULL, outcome);
}

/* decode a whole LeRobot payload (pickle or PR #3048) on the loop: bounded by its size, and a
 * plain walk over bytes (no inference, no image decoding) */
static ma_status decode_payload(const uint8_t *p, size_t n, ma_pk_doc **doc, ma_error *err) {
    const ma_pk_limits lim = {n * 2 + (1u << 20), 32, 1u << 20};
    return ma_pk_decode(p, n, &lim, doc, err);
}

static void start_inference(h2conn *c);

static void on_ready(h2conn *c, gstream *s) {
    /* a client (re)starts: its observation, configuration and timeline are forgotten; the model
     * stays loaded (lerobot #2866: LeRobot's server reloads the policy per client) */
    if (c->pending) {
        srv_job_free(c->pending);
        c->pending = NULL;
    }
    lr_config_free(&c->cfg);
    tl_reset(&c->tl);
    c->stale = c->in_flight;
    c->last_step = -1;
    c->have_last_state = 0;
    srv_log_event("lerobot client ready", c->base.peer, NULL);
    respond_empty(s);
}

static void on_policy(h2conn *c, gstream *s, const uint8_t *data, size_t len) {
    ma_pk_doc *doc = NULL;
    ma_error err = {0};
    if (decode_payload(data, len, &doc, &err)) {
        log_call(c, s, len, err.msg);
        respond(s, G_INVALID_ARGUMENT, err.msg, NULL, 0);
        return;
    }
    lr_config cfg;
    char note[400];
    const ma_status st = lr_config_from(ma_pk_root(doc), &srv.info, &cfg, note, sizeof note, &err);
    ma_pk_free(doc);
    if (st) {
        log_call(c, s, len, err.msg);
        respond(s, G_INVALID_ARGUMENT, err.msg, NULL, 0);
        return;
    }
    lr_config_free(&c->cfg);
    c->cfg = cfg;
    char d[600];
    snprintf(d, sizeof d, "policy %s, %d actions per chunk, state from %d joints, image0 <- %s, image1 <- %s%s%s", cfg.policy_type,
             cfg.actions_per_chunk, cfg.n_state, cfg.cam_key[0], cfg.cam_key[1], note[0] ? "; " : "", note);
    srv_log_event("lerobot policy instructions", c->base.peer, d);
    respond_empty(s);
}

/* one whole observation payload: decoded now (a refusal is the stream's status), kept as the
 * client's newest observation; the oldest unserved one is replaced (LeRobot's observation queue
 * holds one: policy_server.py) */
static int on_observation(h2conn *c, gstream *s, char *why, size_t why_cap) {
    if (!c->cfg.set) {
        srv_rx_free(&s->payload);
        snprintf(why, why_cap, "SendObservations before SendPolicyInstructions: send the policy instructions first");
        return G_FAILED_PRECONDITION;
    }
    /* the payload becomes the job's: its bytes move from --max-input-mb to --max-queued-mb and
     * stay counted there while the decoded observation (no larger) waits and runs */
    char m[200];
    job *j = srv_job_new(&s->payload, c->base.id, 2, 0, c->base.peer, s->t_first ? s->t_first : ma_now_ms(), m, sizeof m);
    if (!j) {
        snprintf(why, why_cap, "%s", m);
        return G_RESOURCE_EXHAUSTED;
    }
    ma_pk_doc *doc = NULL;
    ma_error err = {0};
    const size_t len = j->bytes_in;
    j->lr_safe = len && j->body[0] == 0x00; /* PR #3048's format: answered in it */
    const ma_status ds = decode_payload(j->body, len, &doc, &err);
    free(j->body);
    j->body = NULL;
    if (ds) {
        srv_job_free(j);
        snprintf(why, why_cap, "%s", err.msg);
        return G_INVALID_ARGUMENT;
    }
    lr_obs_meta meta;
    const ma_status st = lr_obs_from(ma_pk_root(doc), &c->cfg, &j->req, &meta, &err);
    ma_pk_free(doc);
    if (st) {
        srv_job_free(j);
        snprintf(why, why_cap, "%s", err.msg);
        return G_INVALID_ARGUMENT;
    }
    /* the decoded observation is what waits, and it may be larger than its payload (a pickle's
     * memo writes one array once for both cameras; each camera gets its own copy): held under
     * --max-queued-mb for what it is */
    size_t decoded = j->req.task ? strlen(j->req.task) + 1 : 0;
    for (int k = 0; k < 2; k++) decoded += (size_t)j->req.obs.images[k].height * j->req.obs.images[k].stride;
    if (decoded > j->body_held) {
        if (ma_budget_take(&srv.budget[B_QUEUED], decoded - j->body_held)) {
            srv_job_free(j);
            snprintf(why, why_cap, "server: too many request bytes queued (--max-queued-mb %.4g): the decoded observation holds %zu bytes",
                     srv.o->max_queued_mb, decoded);
            return G_RESOURCE_EXHAUSTED;
        }
        j->body_held = decoded;
    }
    j->predecoded = 1;
    j->bytes_in = len;
    c->received++;
    /* LeRobot's similarity filter (policy_server.py _obs_sanity_checks: the state's L2 distance
     * under atol 1.0 drops the observation unless must_go); off unless --lerobot-similarity-atol
     * (lerobot #1557, #3204: it dropped nearly every observation) */
    const double atol = srv.o->lerobot_similarity_atol;
    if (atol > 0 && !meta.must_go && c->have_last_state) {
        double d2 = 0;
        for (int i = 0; i < j->req.obs.state_dim; i++)
            d2 += (double)(j->req.state[i] - c->last_state[i]) * (j->req.state[i] - c->last_state[i]);
        if (sqrt(d2) < atol) {
            c->filtered++;
            srv.lerobot_filtered++;
            srv_job_free(j);
            snprintf(why, why_cap, "filtered: the state is within --lerobot-similarity-atol of the last one run");
            return G_OK;
        }
    }
    /* a timestep already run is not run again (LeRobot: "already processed") unless must_go */
    if (!meta.must_go && c->last_step >= 0 && meta.timestep <= c->last_step) {
        srv_job_free(j);
        snprintf(why, why_cap, "skipped: timestep %lld was already run", (long long)meta.timestep);
        return G_OK;
    }
    if (c->pending) srv_job_free(c->pending);
    c->pending = j;
    c->pending_meta = meta;
    why[0] = '\0';
    start_inference(c);
    return G_OK;
}

/* the chunk for a parked GetActions: a pending observation runs once nothing else of this
 * client's does */
static gstream *waiting_stream(h2conn *c) {
    for (gstream *s = c->streams; s; s = s->next)
        if (s->waiting && s->method == M_ACTIONS && !s->responded) return s;
    return NULL;
}

static void start_inference(h2conn *c) {
    if (!c->pending || c->in_flight || !waiting_stream(c)) return;
    if (srv.stopping) return;
    job *j = c->pending;
    c->pending = NULL;
    const lr_obs_meta *m = &c->pending_meta;
    j->lr_timestep = m->timestep;
    j->lr_timestamp = m->timestamp;
    /* the chunk is the client's actions_per_chunk rows: the timeline keeps those, no more */
    j->req.n_action_steps = c->cfg.actions_per_chunk;
    /* the timeline: row 0 of the new chunk is labelled with the observation's timestep (the step
     * the robot last executed: policy_server.py _time_action_chunk), so the previous chunk's row
     * for that step lines up with it, and it is already done (base delay 1) */
    const int64_t ahead = m->timestep - c->tl.step0; /* both in [0, 2^53] */
    const int first_row = c->tl.rows && ahead >= 0 && ahead <= c->tl.n ? (int)ahead : -1;
    j->req.executed = first_row;
    j->req.rtc = -1;                                         /* the server's --rtc */
    if (!tl_snapshot(&c->tl, j, srv.o->fps, 1)) tl_apply(j); /* out of memory: unguided */
    memcpy(c->last_state, j->req.state, sizeof c->last_state);
    c->have_last_state = 1;
    c->last_step = m->timestep;
    c->in_flight = 1;
    c->base.busy = 1;
    srv_enqueue(j);
}

static void grpc_on_job(ma_conn *base, job *j) {
    h2conn *c = (h2conn *)base;
    c->in_flight = 0;
    c->base.busy = 0;
    c->last_active = ma_now_ms();
    gstream *s = waiting_stream(c);
    /* a chunk no GetActions takes never reaches the robot, and one of an observation from before
     * Ready belongs to the run Ready ended: the timeline keeps the one it has */
    if ((s || j->status) && !c->stale) tl_end(&c->tl, j, j->lr_timestep);
    else c->tl.busy = 0;
    c->stale = 0;
    if (j->status) {
        srv_log_line(c->base.peer, "grpc GetActions", j->bytes_in, 0, j, j->log);
        srv_account(2, srv_job_reason(j), j->t_recv, j);
        if (s) respond(s, j->status == MOLMOACT_ERR_WORKER ? G_UNAVAILABLE : G_INVALID_ARGUMENT, j->msg, NULL, 0);
    } else {
        /* exactly actions_per_chunk rows, row i labelled timestep + i and timestamp + i / fps */
        const int n = c->cfg.actions_per_chunk < j->res.n_steps ? c->cfg.actions_per_chunk : j->res.n_steps;
        size_t len = 0;
        uint8_t *p = j->lr_safe ? ma_pk_write_actions_safe(j->res.actions, n, j->res.action_dim, j->lr_timestamp, 1.0 / srv.o->fps,
                                                           j->lr_timestep, GRPC_MAX_MSG - 16, &len)
                                : ma_pk_write_actions(j->res.actions, n, j->res.action_dim, j->lr_timestamp, 1.0 / srv.o->fps,
                                                      j->lr_timestep, GRPC_MAX_MSG - 16, &len);
        if (!p) {
            srv_account(2, F_INTERNAL, j->t_recv, j);
            if (s) respond(s, G_INTERNAL, "server: out of memory", NULL, 0);
        } else {
            char outcome[200] = "ok";
            if (c->tl.last_d >= 0)
                snprintf(outcome, sizeof outcome, "ok (rtc: d %d predicted, %d taken)", c->tl.last_d, c->tl.last_d_actual);
            if (s) respond_bytes(s, p, len);
            else snprintf(outcome, sizeof outcome, "ok (the client stopped polling before the reply)");
            srv_log_line(c->base.peer, "grpc GetActions", j->bytes_in, len, j, outcome);
            srv_account(2, -1, j->t_recv, j);
            free(p);
        }
    }
    flush(c);
    start_inference(c); /* a newer observation may be waiting */
}

/* a stream's request is whole (END_STREAM): answer it, or park it */
static void on_request(h2conn *c, gstream *s) {
    if (s->responded) return;
    if (s->rx.len) { /* bytes that are not a whole message */
        log_call(c, s, s->rx.len, "protocol: a truncated gRPC message");
        respond(s, G_INVALID_ARGUMENT, "protocol: the stream ended inside a gRPC message", NULL, 0);
        return;
    }
    switch (s->method) {
    case M_READY: on_ready(c, s); break;
    case M_OBS:
        /* each whole payload was taken as it completed; an unfinished one is refused */
        if (s->in_payload) {
            log_call(c, s, s->payload.len, "SendObservations: the stream ended before TRANSFER_END");
            respond(s, G_INVALID_ARGUMENT, "SendObservations: the stream ended before a TRANSFER_END chunk", NULL, 0);
        } else respond_empty(s);
        break;
    case M_POLICY:
        if (s->n_msgs != 1) respond(s, G_INVALID_ARGUMENT, "SendPolicyInstructions: expected one PolicySetup message", NULL, 0);
        else on_policy(c, s, s->payload.p, s->payload.len);
        srv_rx_free(&s->payload);
        break;
    case M_ACTIONS:
        if (s->n_msgs != 1) {
            respond(s, G_INVALID_ARGUMENT, "GetActions: expected one Empty message", NULL, 0);
            break;
        }
        if (srv.stopping) {
            respond(s, G_UNAVAILABLE, "server: shutting down", NULL, 0);
            break;
        }
        s->waiting = 1;
        s->t_wait = ma_now_ms();
        start_inference(c);
        break;
    default: respond(s, G_UNIMPLEMENTED, "unknown method", NULL, 0);
    }
}

/* one whole gRPC message of a stream */
static int on_message(h2conn *c, gstream *s, const uint8_t *m, size_t n) {
    s->n_msgs++;
    const uint8_t *b;
    size_t blen;
    uint64_t state = 0;
    char why[600];
    switch (s->method) {
    case M_READY:
    case M_ACTIONS:
        if (pb_parse(m, n, 0, NULL, 0, &b, &blen)) goto bad;
        return 0;
    case M_POLICY: {
        if (pb_parse(m, n, 0, NULL, 1, &b, &blen)) goto bad;
        if (s->n_msgs > 1) return 0;
        const int r = srv_rx_append(&s->payload, b, blen);
        if (r) {
            srv_rx_refusal(r, why, sizeof why);
            respond(s, r == RX_OVER_MESSAGE ? G_RESOURCE_EXHAUSTED : G_UNAVAILABLE, why, NULL, 0);
            return -1;
        }
        return 0;
    }
    case M_OBS: {
        if (pb_parse(m, n, 1, &state, 2, &b, &blen)) goto bad;
        /* transport/utils.py:74-111: BEGIN starts afresh, MIDDLE and END append, END completes;
         * any other state is an error */
        if (state < 1 || state > 3) {
            snprintf(why, sizeof why, "SendObservations: transfer_state %llu (expected BEGIN, MIDDLE or END)", (unsigned long long)state);
            log_call(c, s, n, why);
            respond(s, G_INVALID_ARGUMENT, why, NULL, 0);
            return -1;
        }
        if (state == 1) srv_rx_free(&s->payload);
        const int r = srv_rx_append(&s->payload, b, blen);
        if (r) {
            srv_rx_refusal(r, why, sizeof why);
            log_call(c, s, s->payload.len + blen, why);
            srv_account(2, r == RX_OVER_MESSAGE ? F_TOO_LARGE : F_OVERLOADED, s->t_first, NULL);
            respond(s, r == RX_OVER_MESSAGE ? G_RESOURCE_EXHAUSTED : G_UNAVAILABLE, why, NULL, 0);
            return -1;
        }
        s->in_payload = 1;
        if (state != 3) return 0;
        s->in_payload = 0;
        const size_t plen = s->payload.len;
        const int g = on_observation(c, s, why, sizeof why);
        srv_rx_free(&s->payload);
        if (g != G_OK) {
            log_call(c, s, plen, why);
            srv_account(2, g == G_RESOURCE_EXHAUSTED ? F_OVERLOADED : F_BAD_REQUEST, s->t_first, NULL);
            respond(s, g, why, NULL, 0);
            return -1;
        }
        if (why[0]) log_call(c, s, plen, why); /* filtered or skipped */
        s->t_first = 0;
        s->t_between = ma_now_ms();
        return 0;
    }
    default: return 0;
    }
bad:
    log_call(c, s, n, "protocol: a malformed protobuf message");
    respond(s, G_INVALID_ARGUMENT, "protocol: a malformed protobuf message", NULL, 0);
    return -1;
}

/* ------------------------------------------------------------------------------ nghttp2's callbacks */

static gstream *stream_of(nghttp2_session *h2, int32_t id) { return nghttp2_session_get_stream_user_data(h2, id); }

static int on_begin_headers(nghttp2_session *h2, const nghttp2_frame *f, void *user) {
    h2conn *c = user;
    if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
    gstream *s = calloc(1, sizeof *s);
    if (!s) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE; /* the stream is reset */
    s->conn = c;
    s->id = f->hd.stream_id;
    s->key = srv.have_key ? MA_KEY_ABSENT : MA_KEY_RIGHT;
    s->t_first = ma_now_ms();
    s->next = c->streams;
    c->streams = s;
    nghttp2_session_set_stream_user_data(h2, s->id, s);
    return 0;
}

static int on_header(nghttp2_session *h2, const nghttp2_frame *f, const uint8_t *name, size_t nlen, const uint8_t *value, size_t vlen,
                     uint8_t flags, void *user) {
    (void)flags;
    (void)user;
    gstream *s = stream_of(h2, f->hd.stream_id);
    if (!s || f->hd.type != NGHTTP2_HEADERS) return 0;
    s->head_bytes += nlen + vlen + 32;
    if (s->head_bytes > MAX_HEADER_BYTES) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
#define IS(lit) (nlen == sizeof(lit) - 1 && !memcmp(name, lit, nlen))
    if (IS(":path")) {
        static const char pre[] = "/transport.AsyncInference/";
        const size_t pl = sizeof pre - 1;
        s->method = M_UNKNOWN;
        if (vlen > pl && !memcmp(value, pre, pl)) {
            for (int m = M_READY; m <= M_ACTIONS; m++)
                if (vlen - pl == strlen(METHOD_NAME[m]) && !memcmp(value + pl, METHOD_NAME[m], vlen - pl)) s->method = m;
        } else s->bad_path = 1;
    } else if (IS("content-type")) {
        s->grpc_ct = (vlen >= 16 && !memcmp(value, "application/grpc", 16) && (vlen == 16 || value[16] == '+' || value[16] == ';'));
    } else if (IS("authorization") && srv.have_key) {
        s->key = ma_gate_key((const char *)value, vlen, srv.api_key, srv.api_key_len);
    } else if (IS("grpc-encoding") && !(vlen == 8 && !memcmp(value, "identity", 8))) {
        s->grpc_ct = -1; /* compressed messages are not accepted */
    }
#undef IS
    return 0;
}

/* the request's head is whole: the one decision on it (route, key, drain), as gate.c makes it
 * for HTTP */
static void decide(h2conn *c, gstream *s) {
    const char *why = NULL;
    int status = G_OK, reason = -1;
    if (s->grpc_ct == -1) status = G_UNIMPLEMENTED, why = "grpc-encoding: compressed messages are not accepted (send identity)";
    else if (!s->grpc_ct) status = G_INVALID_ARGUMENT, why = "content-type: expected application/grpc";
    else if (s->key == MA_KEY_ABSENT)
        status = G_UNAUTHENTICATED, reason = F_UNAUTHORIZED,
        why = "unauthorized: this server needs its API key (metadata authorization: Bearer KEY)";
    else if (s->key == MA_KEY_WRONG) status = G_UNAUTHENTICATED, reason = F_UNAUTHORIZED, why = "unauthorized: wrong API key";
    else if (s->method == M_UNKNOWN)
        status = G_UNIMPLEMENTED, why = "unknown method: this port serves transport.AsyncInference (LeRobot's async inference)";
    else if (srv.stopping) status = G_UNAVAILABLE, reason = F_SHUTTING_DOWN, why = "server: shutting down";
    if (status == G_OK) return;
    if (reason >= 0 && (s->method == M_OBS || s->method == M_ACTIONS)) srv_account(2, reason, s->t_first, NULL);
    log_call(c, s, 0, why);
    respond(s, status, why, NULL, 0);
}

static int on_frame(nghttp2_session *h2, const nghttp2_frame *f, void *user) {
    h2conn *c = user;
    gstream *s = stream_of(h2, f->hd.stream_id);
    if (!s) return 0;
    if (f->hd.type == NGHTTP2_HEADERS && f->headers.cat == NGHTTP2_HCAT_REQUEST) decide(c, s);
    if ((f->hd.type == NGHTTP2_HEADERS || f->hd.type == NGHTTP2_DATA) && (f->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
        s->ended = 1;
        if (!s->responded) on_request(c, s);
    }
    return 0;
}

/* the last frame of a reply gone out to a request the client has not ended (an error answered on
 * its headers: a call without the key, another service's path): RST_STREAM with NO_ERROR, as a
 * server that has sent a complete response may ask (RFC 9113 section 8.1). The half-open stream
 * had held the connection, and kept --idle-timeout-s away, for as long as the client liked: a
 * client without the key could take every --max-clients slot (an attacker review). Sent from
 * here, after the reply, so it cannot overtake it. */
static int on_frame_sent(nghttp2_session *h2, const nghttp2_frame *f, void *user) {
    (void)user;
    if ((f->hd.type == NGHTTP2_HEADERS || f->hd.type == NGHTTP2_DATA) && (f->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
        gstream *s = stream_of(h2, f->hd.stream_id);
        if (s && !s->ended) nghttp2_submit_rst_stream(h2, NGHTTP2_FLAG_NONE, f->hd.stream_id, NGHTTP2_NO_ERROR);
    }
    return 0;
}

static int on_data(nghttp2_session *h2, uint8_t flags, int32_t id, const uint8_t *data, size_t len, void *user) {
    (void)flags;
    h2conn *c = user;
    gstream *s = stream_of(h2, id);
    if (!s || s->responded) return 0; /* answered already (refused): the rest is dropped */
    c->last_active = ma_now_ms();
    if (!s->t_first) s->t_first = ma_now_ms();
    char why[200];
    /* one connection's calls together hold at most two messages (a LeRobot client streams one
     * observation at a time): 16 streams of one client do not take 16 shares of --max-input-mb */
    size_t held = 0;
    for (gstream *o = c->streams; o; o = o->next) held += o->rx.len + o->payload.len;
    int r = held + len > 2 * srv.max_bytes ? RX_OVER_CONN : srv_rx_append(&s->rx, data, len);
    if (r == RX_OVER_CONN) {
        snprintf(why, sizeof why, "server: this connection's calls hold more than 2 x --max-message-mb %.4g of request data",
                 srv.o->max_message_mb);
        r = RX_OVER_INPUT;
        srv.budget[B_INPUT].refused++;
    } else if (r) srv_rx_refusal(r, why, sizeof why);
    if (r) {
        log_call(c, s, s->rx.len + len, why);
        srv_account(2, r == RX_OVER_MESSAGE ? F_TOO_LARGE : F_OVERLOADED, s->t_first, NULL);
        respond(s, r == RX_OVER_MESSAGE ? G_RESOURCE_EXHAUSTED : G_UNAVAILABLE, why, NULL, 0);
        srv_rx_free(&s->rx);
        return 0;
    }
    /* whole messages out of the buffer */
    size_t at = 0;
    while (!s->responded && s->rx.len - at >= 5) {
        const uint8_t *p = s->rx.p + at;
        const size_t mlen = (size_t)p[1] << 24 | (size_t)p[2] << 16 | (size_t)p[3] << 8 | p[4];
        if (p[0] != 0) {
            log_call(c, s, mlen, "grpc: a compressed message");
            respond(s, G_UNIMPLEMENTED, "grpc: compressed messages are not accepted", NULL, 0);
            break;
        }
        if (mlen > GRPC_MAX_MSG) {
            snprintf(why, sizeof why, "grpc: a message of %zu bytes (at most %u, LeRobot's limit)", mlen, GRPC_MAX_MSG);
            log_call(c, s, mlen, why);
            if (s->method == M_OBS) srv_account(2, F_TOO_LARGE, s->t_first, NULL);
            respond(s, G_RESOURCE_EXHAUSTED, why, NULL, 0);
            break;
        }
        if (s->rx.len - at - 5 < mlen) break;
        at += 5 + mlen;
        if (on_message(c, s, p + 5, mlen)) break;
    }
    if (s->responded) srv_rx_free(&s->rx);
    else if (at) {
        memmove(s->rx.p, s->rx.p + at, s->rx.len - at);
        s->rx.len -= at;
    }
    return 0;
}

static void stream_free(gstream *s) {
    srv_rx_free(&s->rx);
    srv_rx_free(&s->payload);
    free(s->out);
    free(s);
}

static int on_close(nghttp2_session *h2, int32_t id, uint32_t code, void *user) {
    (void)code;
    h2conn *c = user;
    gstream *s = stream_of(h2, id);
    if (!s) return 0;
    for (gstream **p = &c->streams; *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            break;
        }
    nghttp2_session_set_stream_user_data(h2, id, NULL);
    stream_free(s);
    return 0;
}

/* ------------------------------------------------------------------------------ the connection type */

static short g_events(ma_conn *base) {
    h2conn *c = (h2conn *)base;
    if (c->dead) return 0;
    short ev = 0;
    if (c->shut) return POLLIN;
    if (!c->peer_eof && nghttp2_session_want_read(c->h2) && c->out_held <= srv.max_output) ev |= POLLIN;
    if (c->pend_len || nghttp2_session_want_write(c->h2)) ev |= POLLOUT;
    return ev;
}

static void g_on_events(ma_conn *base, short re) {
    h2conn *c = (h2conn *)base;
    if (re & (POLLIN | POLLHUP | POLLERR)) {
        uint8_t buf[READ_CHUNK];
        for (size_t turn = 0; turn < (1u << 20) && !c->dead && c->out_held <= srv.max_output;) {
            const ssize_t n = recv(base->fd, buf, sizeof buf, 0);
            if (n == 0) {
                c->peer_eof = 1;
                break;
            }
            if (n < 0) {
                if (errno == EINTR) continue;
                if (errno != EAGAIN && errno != EWOULDBLOCK) c->dead = 1;
                break;
            }
            if (c->shut) continue; /* lingering: read and dropped */
            turn += (size_t)n;
            c->last_active = ma_now_ms();
            const ssize_t r = nghttp2_session_mem_recv(c->h2, buf, (size_t)n);
            if (r < 0) { /* not HTTP/2, or a violation nghttp2 refused (it queued a GOAWAY) */
                srv_account(2, F_PROTOCOL, 0, NULL);
                srv_log_line(base->peer, "grpc", (size_t)n, 0, NULL, "protocol: not HTTP/2, or a frame HTTP/2 forbids (closed)");
                c->goaway = 1;
                break;
            }
            flush(c); /* SETTINGS, PING and WINDOW_UPDATE answers go at once */
        }
    }
    if (re & (POLLHUP | POLLERR)) c->dead = 1;
    flush(c);
}

static void g_tick(ma_conn *base, double now) {
    h2conn *c = (h2conn *)base;
    if (c->dead || c->shut) return;
    /* output left unsent since before this tick (judged first: a reply made below is not yet
     * written, and out_since is the last write) */
    if ((c->pend_len || stream_out_bytes(c)) && now - c->out_since > srv.o->recv_timeout_s * 1e3) {
        srv_log_event("dropped", base->peer, "the client did not read its reply within --recv-timeout-s");
        c->dead = 1;
        return;
    }
    const double timeout = srv.o->lerobot_obs_timeout_s * 1e3;
    int any = 0;
    for (gstream *s = c->streams; s; s = s->next) {
        /* a SendObservations left open after a whole observation: a connection idle between
         * requests (its open stream must not keep --idle-timeout-s away) */
        if (!s->ended && !s->responded && !s->t_first && s->t_between && srv.o->idle_timeout_s > 0 &&
            now - s->t_between > srv.o->idle_timeout_s * 1e3) {
            log_call(c, s, 0, "request: no observation within --idle-timeout-s on an open stream");
            respond(s, G_UNAVAILABLE, "request: no observation within --idle-timeout-s", NULL, 0);
            nghttp2_submit_rst_stream(c->h2, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_CANCEL);
            any = 1;
        }
        /* a long poll with nothing to run: an empty Actions, as LeRobot's server answers */
        if (s->waiting && !s->responded && !c->in_flight && !c->pending && now - s->t_wait > timeout) {
            respond_empty(s);
            any = 1;
        }
        /* a request not whole within --recv-timeout-s */
        if (!s->ended && !s->responded && s->t_first && now - s->t_first > srv.o->recv_timeout_s * 1e3) {
            char m[160];
            snprintf(m, sizeof m, "request: not complete within --recv-timeout-s %d", srv.o->recv_timeout_s);
            log_call(c, s, s->rx.len + s->payload.len, m);
            if (s->method == M_OBS) srv_account(2, F_TIMEOUT, s->t_first, NULL);
            respond(s, G_UNAVAILABLE, m, NULL, 0);
            nghttp2_submit_rst_stream(c->h2, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_CANCEL);
            any = 1;
        }
    }
    if (!base->busy && !c->streams && srv.o->idle_timeout_s > 0 && now - c->last_active > srv.o->idle_timeout_s * 1e3 && !c->goaway) {
        srv_log_event("idle", base->peer, "no request within --idle-timeout-s: GOAWAY");
        nghttp2_session_terminate_session(c->h2, NGHTTP2_NO_ERROR);
        c->goaway = 1;
        any = 1;
    }
    if (any) flush(c);
}

static void g_drain(ma_conn *base) {
    h2conn *c = (h2conn *)base;
    if (base->busy) return;
    for (gstream *s = c->streams; s; s = s->next)
        if (!s->responded) respond(s, G_UNAVAILABLE, "server: shutting down", NULL, 0);
    if (!c->goaway) {
        nghttp2_session_terminate_session(c->h2, NGHTTP2_NO_ERROR);
        c->goaway = 1;
    }
    flush(c);
}

static int g_finished(ma_conn *base, double now) {
    h2conn *c = (h2conn *)base;
    if (c->dead) return 1;
    if (base->busy || c->pend_len || nghttp2_session_want_write(c->h2)) return 0;
    if (c->peer_eof) return 1;
    if (!c->goaway && nghttp2_session_want_read(c->h2)) return 0;
    if (!c->shut) { /* the GOAWAY is out: half-close, then read and drop a while */
        shutdown(base->fd, SHUT_WR);
        c->shut = 1;
        c->linger_until = now + LINGER_MS;
        return 0;
    }
    return now > c->linger_until;
}

static void g_free(ma_conn *base) {
    h2conn *c = (h2conn *)base;
    nghttp2_session_del(c->h2); /* closes the streams: on_close frees them */
    while (c->streams) {
        gstream *s = c->streams;
        c->streams = s->next;
        stream_free(s);
    }
    if (c->pending) srv_job_free(c->pending);
    lr_config_free(&c->cfg);
    tl_free(&c->tl);
    ma_budget_give(&srv.budget[B_OUTPUT], c->out_held);
    close(base->fd);
    srv.n_grpc--;
    free(c);
}

const ma_conn_type ma_grpc_type = {"grpc", g_events, g_on_events, grpc_on_job, g_tick, g_drain, g_finished, g_free};

/* ------------------------------------------------------------------------------ accepting */

int srv_grpc_init(void) {
    if (nghttp2_session_callbacks_new(&CALLBACKS)) return -1;
    nghttp2_session_callbacks_set_on_begin_headers_callback(CALLBACKS, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(CALLBACKS, on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(CALLBACKS, on_frame);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(CALLBACKS, on_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(CALLBACKS, on_close);
    nghttp2_session_callbacks_set_on_frame_send_callback(CALLBACKS, on_frame_sent);
    return 0;
}

void srv_grpc_stop(void) {
    if (CALLBACKS) nghttp2_session_callbacks_del(CALLBACKS);
    CALLBACKS = NULL;
}

void srv_grpc_accept(int lfd) {
    for (int i = 0; i < 64; i++) {
        struct sockaddr_storage sa;
        socklen_t sl = sizeof sa;
        const int fd = accept4(lfd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            /* out of descriptors (or kernel memory): the connection stays queued and the listener
             * readable, and polling it at once again had spun the loop (3.35 s of CPU in 5 s, the
             * health check unanswered: an attacker review); so it rests 100 ms */
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                srv.grpc_accept_after = ma_now_ms() + 100.0;
                srv_log_event("refused", "?", "grpc: out of file descriptors; not accepting for 100 ms");
            }
            return;
        }
        char peer[64] = "?";
        char ip[INET6_ADDRSTRLEN] = "?";
        const int v6 = sa.ss_family == AF_INET6;
        inet_ntop(sa.ss_family, v6 ? (void *)&((struct sockaddr_in6 *)&sa)->sin6_addr : (void *)&((struct sockaddr_in *)&sa)->sin_addr, ip,
                  sizeof ip);
        snprintf(peer, sizeof peer, "%s:%d", ip,
                 ntohs(v6 ? ((struct sockaddr_in6 *)&sa)->sin6_port : ((struct sockaddr_in *)&sa)->sin_port));
        if (srv.stopping || srv.n_grpc >= srv.o->max_clients) {
            srv_log_event("refused", peer, srv.stopping ? "grpc: shutting down" : "grpc: --max-clients connections are open");
            close(fd);
            continue;
        }
        h2conn *c = calloc(1, sizeof *c);
        nghttp2_option *opt = NULL;
        if (!c || nghttp2_option_new(&opt)) {
            free(c);
            close(fd);
            return;
        }
        /* nothing of ours rides on HTTP semantics beyond gRPC's; nghttp2 checks the messaging
         * rules (pseudo-headers, content-length) itself */
        nghttp2_option_set_max_outbound_ack(opt, 1000);
        const int bad = nghttp2_session_server_new2(&c->h2, CALLBACKS, c, opt);
        nghttp2_option_del(opt);
        if (bad) {
            free(c);
            close(fd);
            return;
        }
        /* what we take: at most MAX_STREAMS at once, header lists of MAX_HEADER_BYTES, 1 MiB in
         * flight per stream (a 2 MiB chunk in two windows; the bytes are counted as they come) */
        nghttp2_settings_entry iv[] = {{NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, MAX_STREAMS},
                                       {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, MAX_HEADER_BYTES},
                                       {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1u << 20}};
        nghttp2_submit_settings(c->h2, NGHTTP2_FLAG_NONE, iv, sizeof iv / sizeof iv[0]);
        nghttp2_session_set_local_window_size(c->h2, NGHTTP2_FLAG_NONE, 0, 4u << 20);
        const int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        c->base.type = &ma_grpc_type;
        c->base.fd = fd;
        c->base.id = srv_new_id();
        snprintf(c->base.peer, sizeof c->base.peer, "%s", peer);
        char name[96];
        snprintf(name, sizeof name, "grpc:%s", peer);
        tl_init(&c->tl, name);
        c->base.timeline = &c->tl;
        c->last_step = -1;
        c->last_active = c->out_since = ma_now_ms();
        srv.n_grpc++;
        srv_conn_add(&c->base);
        flush(c);
    }
}
