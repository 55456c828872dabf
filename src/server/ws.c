/* SPDX-License-Identifier: Apache-2.0 */
/* openpi's websocket protocol on wslay (internal.h). wslay frames: frame headers, masking,
 * fragmentation and its rules, control frames (pings answered, closes echoed, payloads over 125
 * bytes refused), UTF-8 in closes, close codes. This file keeps the messages: wslay is set not to
 * buffer data messages (wslay_event_config_set_no_buffering), so each payload chunk comes here and
 * is counted against --max-message-mb and --max-input-mb as it arrives; nothing is reserved for
 * the length a frame header claims (with buffering wslay 1.1.1 allocates the claimed length of
 * each frame at its header, lib/wslay_event.c wslay_event_imsg_append_chunk, release-1.1.1).
 *
 * wslay sends control frames before queued data frames (wslay_event_send takes send_ctrl_queue
 * first) and nothing after a close: an error's text frame is therefore sent whole before its
 * close frame is queued (close_pending).
 *
 * Why wslay (Debian 12: 1.1.1): a websocket framing library alone, callback-driven over a socket
 * we poll, by nghttp2's author, used by aria2 and nghttp2's tools; libmicrohttpd 0.9.75 has no
 * websocket framing of its own, only the upgrade. */
#define _GNU_SOURCE
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <wslay/wslay.h>

#include "core/util.h"
#include "server/internal.h"

#define LINGER_MS 2000           /* after our last bytes: read and drop what the client still sends */
#define READ_PER_TURN (1u << 20) /* one client's large message does not keep the others waiting */
/* what a queued message costs besides its payload (wslay's message and queue cell, about 100
 * bytes): an empty pong is not free (a flood of empty pings never read would grow without end) */
#define MSG_OVERHEAD 128

typedef struct wsconn {
    ma_conn base;
    struct MHD_UpgradeResponseHandle *urh;
    wslay_event_context_ptr ctx;
    uint8_t *pre; /* bytes that came with the upgrade request */
    size_t pre_len, pre_off;
    srv_rx rx;        /* the message being assembled */
    int in_msg;       /* a data message is being received */
    int frame_data;   /* the frame being received is a data frame (a control frame may come between fragments) */
    int refused;      /* an error was sent: nothing more is read */
    double msg_start; /* the first byte of the message (or of bytes not yet a whole frame) */
    double last_active, cycle_start, prev_total_ms;
    int n_replies, ignored_logged;
    /* output */
    size_t out_held;  /* bytes of B_OUTPUT held: wslay's queued messages */
    double out_since; /* the last byte sent, or when output began to wait */
    int close_pending, close_code;
    double closing_since;
    char close_reason[64];
    /* the end */
    int closing, shut, peer_eof, dead;
    double linger_until;
    size_t read_turn;
    ma_timeline tl; /* the connection is a session (timeline.c) */
} wsconn;

/* ------------------------------------------------------------------------------ output */

/* B_OUTPUT follows what wslay holds; a close waits until every data frame before it is out */
static size_t queued_cost(wslay_event_context_ptr ctx) {
    return wslay_event_get_queued_msg_length(ctx) + MSG_OVERHEAD * wslay_event_get_queued_msg_count(ctx);
}

static void sync_out(wsconn *w) {
    const size_t q = queued_cost(w->ctx);
    if (!w->out_held) w->out_since = ma_now_ms(); /* output begins to wait now */
    ma_budget_give(&srv.budget[B_OUTPUT], w->out_held);
    ma_budget_hold(&srv.budget[B_OUTPUT], q);
    w->out_held = q;
}

static void flush(wsconn *w) {
    if (w->dead) return;
    for (int round = 0; round < 2; round++) {
        if (wslay_event_want_write(w->ctx) && wslay_event_send(w->ctx)) {
            w->dead = 1;
            break;
        }
        /* once nothing else is left to send (want_write: wslay drops queued control frames once a
         * close is queued without counting them out, so its message count is not a guide) */
        if (w->close_pending && !wslay_event_want_write(w->ctx)) {
            w->close_pending = 0;
            wslay_event_queue_close(w->ctx, (uint16_t)w->close_code, (const uint8_t *)w->close_reason, strlen(w->close_reason));
            continue; /* send it now */
        }
        break;
    }
    sync_out(w);
}

static void send_msg(wsconn *w, int opcode, const void *data, size_t len) {
    struct wslay_event_msg m = {(uint8_t)opcode, data, len};
    if (wslay_event_queue_msg(w->ctx, &m)) w->dead = !w->closing && !w->close_pending;
}

/* a close with a code and reason, after what is queued; nothing more is read */
static void close_with(wsconn *w, int code, const char *reason) {
    if (w->closing) return;
    w->closing = 1;
    w->closing_since = ma_now_ms();
    w->close_pending = 1;
    w->close_code = code;
    snprintf(w->close_reason, sizeof w->close_reason, "%s", reason);
    wslay_event_shutdown_read(w->ctx);
}

/* an error: a text frame naming the fault, then the close code (as openpi's server) */
static void ws_error(wsconn *w, const char *msg, int code) {
    char clean[1100];
    snprintf(clean, sizeof clean, "%s", msg);
    srv_printable(clean);
    send_msg(w, WSLAY_TEXT_FRAME, clean, strlen(clean));
    close_with(w, code, code == 1009 ? "message too big" : code == 1001 ? "server shutting down" : "request failed");
}

/* the current message refused: counted, logged, the client told */
static void refuse(wsconn *w, int reason, const char *msg, int code) {
    if (w->refused) return;
    w->refused = 1;
    srv_account(1, reason, w->msg_start, NULL);
    srv_log_line(w->base.peer, "ws", w->rx.len, 0, NULL, msg);
    srv_rx_free(&w->rx);
    w->in_msg = 0;
    ws_error(w, msg, code);
}

/* ------------------------------------------------------------------------------ wslay's callbacks */

static ssize_t on_recv(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, int flags, void *user) {
    (void)flags;
    wsconn *w = user;
    if (w->pre_off < w->pre_len) {
        size_t n = w->pre_len - w->pre_off;
        if (n > len) n = len;
        memcpy(buf, w->pre + w->pre_off, n);
        w->pre_off += n;
        if (!w->msg_start) w->msg_start = ma_now_ms();
        return (ssize_t)n;
    }
    /* others' turn; or the client reads its replies first (pongs count: wslay queues one per ping
     * as it reads, within this very call) */
    if (w->read_turn >= READ_PER_TURN || queued_cost(ctx) > srv.max_output) {
        wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
        return -1;
    }
    for (;;) {
        const ssize_t n = recv(w->base.fd, buf, len, 0);
        if (n > 0) {
            w->read_turn += (size_t)n;
            if (!w->msg_start) w->msg_start = ma_now_ms();
            return n;
        }
        if (n == 0) w->peer_eof = 1; /* what it sent is answered, then we close */
        else if (errno == EINTR) continue;
        else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
            return -1;
        } else w->dead = 1;
        wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
        return -1;
    }
}

static ssize_t on_send(wslay_event_context_ptr ctx, const uint8_t *data, size_t len, int flags, void *user) {
    (void)flags;
    wsconn *w = user;
    for (;;) {
        const ssize_t n = send(w->base.fd, data, len, MSG_NOSIGNAL);
        if (n > 0) w->out_since = ma_now_ms(); /* progress: the client reads */
        if (n >= 0) return n;
        if (errno == EINTR) continue;
        wslay_event_set_error(ctx, errno == EAGAIN || errno == EWOULDBLOCK ? WSLAY_ERR_WOULDBLOCK : WSLAY_ERR_CALLBACK_FAILURE);
        return -1;
    }
}

static void on_frame_start(wslay_event_context_ptr ctx, const struct wslay_event_on_frame_recv_start_arg *a, void *user) {
    (void)ctx;
    wsconn *w = user;
    w->frame_data = a->opcode < 8;
    if (w->refused || a->opcode >= 8) return; /* control frames: wslay's */
    if (a->opcode != WSLAY_CONTINUATION_FRAME) {
        if (w->base.busy) {
            refuse(w, F_PROTOCOL, "protocol: one request at a time (wait for the reply)", 1008);
            return;
        }
        if (a->opcode == WSLAY_TEXT_FRAME) {
            refuse(w, F_BAD_REQUEST, "request: expected a binary msgpack frame, got text", 1011);
            return;
        }
        w->in_msg = 1;
        srv_rx_free(&w->rx);
    }
    if (a->payload_length > srv.max_bytes - w->rx.len) {
        char m[160];
        srv_rx_refusal(RX_OVER_MESSAGE, m, sizeof m);
        srv.budget[B_MESSAGE].refused++;
        refuse(w, F_TOO_LARGE, m, 1009);
    }
}

static void on_frame_chunk(wslay_event_context_ptr ctx, const struct wslay_event_on_frame_recv_chunk_arg *a, void *user) {
    (void)ctx;
    wsconn *w = user;
    if (w->refused || !w->in_msg || !w->frame_data) return; /* control frames' payloads are wslay's */
    const int s = srv_rx_append(&w->rx, a->data, a->data_length);
    if (!s) return;
    char m[200];
    srv_rx_refusal(s, m, sizeof m);
    refuse(w, s == RX_OVER_MESSAGE ? F_TOO_LARGE : F_OVERLOADED, m, s == RX_OVER_MESSAGE ? 1009 : s == RX_OVER_INPUT ? 1013 : 1011);
}

static void start_request(wsconn *w) {
    char m[200];
    job *j = srv_job_new(&w->rx, w->base.id, 1, 0, w->base.peer, w->msg_start ? w->msg_start : ma_now_ms(), m, sizeof m);
    w->in_msg = 0;
    if (!j) {
        refuse(w, F_OVERLOADED, m, 1013);
        return;
    }
    w->msg_start = 0;
    w->base.busy = 1;
    if (tl_snapshot(&w->tl, j, srv.o->fps, 0)) {
        srv_job_free(j);
        refuse(w, F_OVERLOADED, "server: out of memory", 1011);
        return;
    }
    srv_enqueue(j);
}

static void on_msg(wslay_event_context_ptr ctx, const struct wslay_event_on_msg_recv_arg *a, void *user) {
    wsconn *w = user;
    if (a->opcode == WSLAY_CONNECTION_CLOSE) { /* wslay echoes it */
        w->closing = 1;
        return;
    }
    if (a->opcode >= 8) {
        if (!w->in_msg) w->msg_start = 0; /* a ping is not a request */
        return;
    }
    if (w->refused || !w->in_msg) return;
    if (srv.stopping) {
        refuse(w, F_SHUTTING_DOWN, "server: shutting down", 1001);
        return;
    }
    (void)ctx;
    start_request(w);
}

static const struct wslay_event_callbacks CALLBACKS = {on_recv, on_send, NULL, on_frame_start, on_frame_chunk, NULL, on_msg};

/* ------------------------------------------------------------------------------ the connection type */

static short ws_events(ma_conn *c) {
    wsconn *w = (wsconn *)c;
    short ev = 0;
    if (w->dead) return 0;
    if (!w->peer_eof && (w->shut || (wslay_event_want_read(w->ctx) && queued_cost(w->ctx) <= srv.max_output))) ev |= POLLIN;
    if (!w->shut && wslay_event_want_write(w->ctx)) ev |= POLLOUT;
    return ev;
}

static void ws_on_events(ma_conn *c, short re) {
    wsconn *w = (wsconn *)c;
    w->read_turn = 0;
    if (re & (POLLIN | POLLHUP | POLLERR)) {
        if (w->shut) { /* lingering: read and dropped */
            char b[4096];
            const ssize_t n = recv(c->fd, b, sizeof b, 0);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) w->peer_eof = 1;
        } else if (wslay_event_want_read(w->ctx) && wslay_event_recv(w->ctx) && !w->peer_eof && !w->dead && !w->closing) {
            /* a protocol violation wslay refused (it queued a close): counted, then closed */
            w->closing = 1;
            w->closing_since = ma_now_ms();
            srv_account(1, F_PROTOCOL, w->msg_start, NULL);
            srv_log_line(c->peer, "ws", 0, 0, NULL, "protocol: a malformed frame (closed)");
        }
    }
    /* POLLHUP on TCP: the peer reset, or closed while we had shut our side: nothing we send can
     * arrive, and poll reports it again at once (F14: a reset client spun the loop) */
    if (re & (POLLHUP | POLLERR)) w->dead = 1;
    if (wslay_event_get_close_received(w->ctx) && !w->closing) {
        w->closing = 1;
        w->closing_since = ma_now_ms();
    }
    /* wslay refused a frame itself (unmasked, reserved bits or opcodes, a stray continuation, a bad
     * close code or UTF-8): it queued a close and stopped reading, and returned 0 */
    if (!w->shut && !w->closing && !w->dead && !w->peer_eof && !wslay_event_get_read_enabled(w->ctx)) {
        w->closing = 1;
        w->closing_since = ma_now_ms();
        srv_account(1, F_PROTOCOL, w->msg_start, NULL);
        srv_log_line(c->peer, "ws", 0, 0, NULL, "protocol: a malformed frame (closed)");
    }
    flush(w);
}

static void ws_on_job(ma_conn *c, job *j) {
    wsconn *w = (wsconn *)c;
    c->busy = 0;
    w->last_active = ma_now_ms();
    tl_end(&w->tl, j, 0);
    if (j->req.ignored[0] && !w->ignored_logged) { /* once per connection */
        w->ignored_logged = 1;
        srv_log_event("ignored keys", c->peer, j->req.ignored);
    }
    if (j->status) {
        srv_log_line(c->peer, "ws", j->bytes_in, strlen(j->msg), j, j->log);
        ws_error(w, j->msg, 1011);
        srv_account(1, srv_job_reason(j), j->t_recv, j);
        flush(w);
        return;
    }
    ma_wire_buf b = {0};
    ma_error err = {0};
    /* server_timing as openpi's server gives it: infer_ms this request's inference, and from the
     * second reply on prev_total_ms, the previous request's whole cycle (from the end of the reply
     * before it, or the connection's start, to the end of its own reply) */
    if (ma_wire_encode_reply(&j->res, j->t_infer, w->n_replies ? w->prev_total_ms : -1.0, &b, &err)) {
        ws_error(w, err.msg, 1011);
        srv_account(1, F_INTERNAL, j->t_recv, j);
    } else {
        send_msg(w, WSLAY_BINARY_FRAME, b.data, b.len);
        srv_log_line(c->peer, "ws", j->bytes_in, b.len, j, "ok");
        srv_account(1, -1, j->t_recv, j);
    }
    free(b.data);
    w->n_replies++;
    const double t_end = ma_now_ms();
    w->prev_total_ms = t_end - w->cycle_start;
    w->cycle_start = t_end;
    flush(w);
}

static void ws_tick(ma_conn *c, double now) {
    wsconn *w = (wsconn *)c;
    const double recv_ms = srv.o->recv_timeout_s * 1e3;
    if (w->shut || w->dead) return;
    if (w->msg_start && !w->closing && !c->busy && now - w->msg_start > recv_ms) {
        char m[160];
        snprintf(m, sizeof m, "request: not complete within --recv-timeout-s %d", srv.o->recv_timeout_s);
        if (w->in_msg) refuse(w, F_TIMEOUT, m, 1008);
        else {
            srv_log_line(c->peer, "ws", 0, 0, NULL, m);
            w->refused = 1;
            ws_error(w, m, 1008);
        }
        flush(w);
        return;
    }
    if (w->closing && w->closing_since && now - w->closing_since > recv_ms + LINGER_MS) { /* the close never completed */
        w->dead = 1;
        return;
    }
    if ((w->out_held || wslay_event_want_write(w->ctx)) && now - w->out_since > recv_ms) { /* the client reads nothing */
        srv_log_event("dropped", c->peer, "the client did not read its reply within --recv-timeout-s");
        w->dead = 1;
        return;
    }
    if (!c->busy && !w->msg_start && !w->closing && srv.o->idle_timeout_s > 0 && now - w->last_active > srv.o->idle_timeout_s * 1e3) {
        srv_log_event("idle", c->peer, "no request within --idle-timeout-s: closed with 1001");
        close_with(w, 1001, "idle");
        flush(w);
    }
}

static void ws_drain(ma_conn *c) {
    wsconn *w = (wsconn *)c;
    if (c->busy || w->closing) return;
    close_with(w, 1001, "server shutting down");
    flush(w);
}

/* Whether to free it now. After the close is out: half-close, then read and drop until the client
 * closes or LINGER_MS pass (a close() with unread input would reset the connection and could lose
 * the reply). A client that closed its side is closed once its replies are out. */
static int ws_finished(ma_conn *c, double now) {
    wsconn *w = (wsconn *)c;
    if (w->dead) return 1;
    if (c->busy || wslay_event_want_write(w->ctx) || w->close_pending) return 0;
    if (w->peer_eof) return 1;
    if (!w->closing) return 0;
    if (!w->shut) {
        shutdown(c->fd, SHUT_WR);
        w->shut = 1;
        w->linger_until = now + LINGER_MS;
        return 0;
    }
    return now > w->linger_until;
}

static void ws_free(ma_conn *c) {
    wsconn *w = (wsconn *)c;
    srv_rx_free(&w->rx);
    tl_free(&w->tl);
    ma_budget_give(&srv.budget[B_OUTPUT], w->out_held);
    wslay_event_context_free(w->ctx);
    free(w->pre);
    MHD_upgrade_action(w->urh, MHD_UPGRADE_ACTION_CLOSE); /* the library closes the socket */
    srv.n_ws--;
    free(w);
}

const ma_conn_type ma_ws_type = {"websocket", ws_events, ws_on_events, ws_on_job, ws_tick, ws_drain, ws_finished, ws_free};

int srv_ws_open(int fd, void *urh, const char *extra, size_t extra_len, const char *peer) {
    wsconn *w = calloc(1, sizeof *w);
    if (!w) return -1;
    if (extra_len && !(w->pre = malloc(extra_len))) {
        free(w);
        return -1;
    }
    if (extra_len) memcpy(w->pre, extra, extra_len);
    w->pre_len = extra_len;
    if (wslay_event_context_server_init(&w->ctx, &CALLBACKS, w)) {
        free(w->pre);
        free(w);
        return -1;
    }
    wslay_event_config_set_no_buffering(w->ctx, 1);
    /* our own checks refuse a message over --max-message-mb, with a message; wslay's per-frame
     * check (a close without one) stays out of their way */
    wslay_event_config_set_max_recv_msg_length(w->ctx, (uint64_t)INT64_MAX);
    w->base.type = &ma_ws_type;
    w->base.fd = fd;
    char name[96];
    snprintf(name, sizeof name, "ws:%s", peer);
    tl_init(&w->tl, name);
    w->base.timeline = &w->tl;
    w->base.id = srv_new_id();
    snprintf(w->base.peer, sizeof w->base.peer, "%s", peer);
    w->urh = urh;
    /* libmicrohttpd corks and uncorks its sockets around its writes (TCP_CORK, TCP_NODELAY); the
     * socket it hands over is made ours: every message leaves at once (a reply split in a header and
     * a payload otherwise waits for the client's delayed ACK: 40 ms per request) */
    MHD_upgrade_action(urh, MHD_UPGRADE_ACTION_CORK_OFF);
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    w->last_active = w->cycle_start = w->out_since = ma_now_ms();
    srv.n_ws++;
    srv_conn_add(&w->base);
    /* openpi's handshake: the server speaks first, one binary msgpack frame of metadata */
    ma_wire_buf b = {0};
    ma_error err = {0};
    if (ma_wire_encode_metadata(&srv.info, srv.model_name, &b, &err)) close_with(w, 1011, "metadata");
    else send_msg(w, WSLAY_BINARY_FRAME, b.data, b.len);
    free(b.data);
    if (srv.stopping) close_with(w, 1001, "server shutting down");
    flush(w);
    if (w->pre_len) ws_on_events(&w->base, POLLIN); /* frames that came with the upgrade: no POLLIN will say so */
    return 0;
}
