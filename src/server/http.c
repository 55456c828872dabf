/* SPDX-License-Identifier: Apache-2.0 */
/* HTTP/1.1 on libmicrohttpd (internal.h). The library frames everything: the request line and
 * header fields, Content-Length and chunked bodies, Expect: 100-continue, pipelining, HEAD, keep-
 * alive, the replies' framing. What this file adds is policy: each request passes the gate once
 * (route, key, slot), a few framing rules stricter than the library's (HTTP/1.0 with
 * Transfer-Encoding, Transfer-Encoding beside Content-Length or other than chunked, two
 * Content-Lengths), bodies counted against the budgets as they arrive, the queue, the replies.
 *
 * Why libmicrohttpd (Debian 12: 0.9.75): it decodes chunked request bodies, answers
 * Expect: 100-continue and pipelined requests in order, bounds each connection's memory
 * (MHD_OPTION_CONNECTION_MEMORY_LIMIT: the head and read buffer), suspends a connection while its
 * request runs (no reading behind it), and hands an upgraded socket to us for the websocket
 * (framed by wslay, ws.c). libwebsockets 4.1.6 decodes no chunked request body. The facts used
 * here are from libmicrohttpd v0.9.75's src/microhttpd/connection.c (commit of tag v0.9.75): a
 * response may be queued at the first call or after the body, not in the middle of it (so a body
 * refused half way is read to its end and dropped, counted against nothing); an upgrade reply
 * needs both Upgrade and Connection: Upgrade set by the application. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "core/util.h"
#include "server/b64.h"
#include "server/gate.h"
#include "server/internal.h"

enum { P_HEAD, P_PENDING, P_BODY, P_QUEUED, P_ANSWERED };

struct hreq;
typedef struct hconn {
    struct hconn *next, *prev;
    struct MHD_Connection *mc;
    uint64_t id;
    int fd;
    int reserved; /* beyond --max-clients: health checks only */
    char peer[64];
    double t_mark;      /* accepted, or its last reply done: the next head is due within --recv-timeout-s */
    struct hreq *req;   /* the request from its head to its end */
    int upgraded;       /* the socket is the websocket's (ws.c) */
    int killed;         /* shut down by a deadline or the drain */
    int ignored_logged; /* keys the server ignores: logged once per connection */
} hconn;

typedef struct hreq {
    hconn *hc;
    ma_gate g;
    int phase;
    int head_only;
    int list_format;
    char session[72];  /* ?session_id= or X-Session-Id: the session's timeline (timeline.c) */
    int session_named; /* POST /reset named one (even one no session can have) */
    srv_rx rx;
    double t_first;
    /* a body refused half way: read to its end and dropped, then answered with this */
    int refuse_code, refuse_reason;
    char refuse_msg[200];
    job *result; /* back from the queue */
    size_t out_held;
    /* libmicrohttpd 0.9.75 closes a connection whose reply is queued at the first call (connection.c,
     * MHD_queue_response: "response was queued early, refuse to read body / footers or further
     * requests"): a request without a body is answered at the next call, which comes at once,
     * so keep-alive and pipelining work; a refused request with a body is answered at once, and
     * its body is not read */
    int defer;
    struct MHD_Response *pending;
    int pending_code;
} hreq;

static hconn *g_conns;

static hconn *conn_of(struct MHD_Connection *mc) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? (hconn *)ci->socket_context : NULL;
}

static hconn *find_hconn(uint64_t id) {
    for (hconn *h = g_conns; h; h = h->next)
        if (h->id == id) return h;
    return NULL;
}

/* ------------------------------------------------------------------------------ replies */

static enum MHD_Result respond(struct MHD_Connection *mc, hreq *r, int code, const char *ctype, const void *body, size_t len,
                               const char *hname, const char *hvalue) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", ctype);
    MHD_add_response_header(resp, "Cache-Control", "no-store");
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    if (hname) MHD_add_response_header(resp, hname, hvalue);
    if (srv.stopping) MHD_add_response_header(resp, "Connection", "close");
    enum MHD_Result ok = MHD_YES;
    if (r && r->defer) {
        r->pending = resp;
        r->pending_code = code;
    } else {
        ok = MHD_queue_response(mc, (unsigned)code, resp);
        MHD_destroy_response(resp);
    }
    if (r) {
        r->phase = r->defer ? P_PENDING : P_ANSWERED;
        if (ok == MHD_YES && !r->out_held) { /* the copy libmicrohttpd holds until it is sent */
            r->out_held = len;
            ma_budget_hold(&srv.budget[B_OUTPUT], len);
        }
    }
    return ok;
}

static enum MHD_Result respond_json(struct MHD_Connection *mc, hreq *r, int code, cJSON *o, const char *hname, const char *hvalue) {
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    const enum MHD_Result ok = respond(mc, r, code, "application/json", s ? s : "{}", s ? strlen(s) : 2, hname, hvalue);
    free(s);
    return ok;
}

static enum MHD_Result respond_error(struct MHD_Connection *mc, hreq *r, int code, const char *msg, const char *hname, const char *hvalue) {
    char clean[1100];
    snprintf(clean, sizeof clean, "%s", msg);
    srv_printable(clean);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "error", clean);
    if (code == 401 && !hname) hname = "WWW-Authenticate", hvalue = "Api-Key";
    return respond_json(mc, r, code, o, hname, hvalue);
}

/* A reply written on the socket directly, for a request libmicrohttpd is still reading a body of
 * (it queues no reply then): a deadline passed, or the server stops. One fixed, complete message
 * with Connection: close; the connection is then shut down and the library closes it. */
static void abort_with(hconn *hc, int code, const char *msg) {
    if (hc->killed) return;
    hc->killed = 1;
    char clean[400], body[512], out[1024];
    snprintf(clean, sizeof clean, "%s", msg);
    srv_printable(clean);
    const int bl = snprintf(body, sizeof body, "{\"error\":\"%s\"}", clean); /* printable, no quotes or backslashes in our messages */
    const int n = snprintf(out, sizeof out,
                           "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nCache-Control: no-store\r\n"
                           "X-Content-Type-Options: nosniff\r\nConnection: close\r\n\r\n%s",
                           code, code == 408 ? "Request Timeout" : "Service Unavailable", bl, body);
    if (n > 0 && n < (int)sizeof out) {
        ssize_t w = send(hc->fd, out, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)w;
    }
    shutdown(hc->fd, SHUT_RDWR);
}

static void kill_conn(hconn *hc) {
    if (hc->killed) return;
    hc->killed = 1;
    shutdown(hc->fd, SHUT_RDWR); /* libmicrohttpd reads the end and closes it */
}

/* ------------------------------------------------------------------------------ routes */

static const char *header(struct MHD_Connection *mc, const char *name) { return MHD_lookup_connection_value(mc, MHD_HEADER_KIND, name); }

/* does a comma-separated header value hold this token (case-insensitive)? */
static int has_token(const char *v, const char *tok) {
    const size_t tl = strlen(tok);
    for (const char *p = v; p && *p;) {
        while (*p == ' ' || *p == '\t' || *p == ',') p++;
        const char *e = p;
        while (*e && *e != ',') e++;
        const char *t = e;
        while (t > p && (t[-1] == ' ' || t[-1] == '\t')) t--;
        if ((size_t)(t - p) == tl && !strncasecmp(p, tok, tl)) return 1;
        p = e;
    }
    return 0;
}

typedef struct {
    int n_cl;
} count_ctx;

static enum MHD_Result count_cl(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    (void)value;
    if (!strcasecmp(key, "Content-Length")) ((count_ctx *)cls)->n_cl++;
    return MHD_YES;
}

static void on_upgrade(void *cls, struct MHD_Connection *mc, void *req_cls, const char *extra, size_t extra_len, MHD_socket sock,
                       struct MHD_UpgradeResponseHandle *urh) {
    (void)mc;
    (void)req_cls;
    hconn *hc = cls;
    hc->upgraded = 1;
    if (srv_ws_open(sock, urh, extra, extra_len, hc->peer)) MHD_upgrade_action(urh, MHD_UPGRADE_ACTION_CLOSE);
}

static enum MHD_Result upgrade(struct MHD_Connection *mc, hconn *hc, hreq *r) {
    const char *ver = header(mc, "Sec-WebSocket-Version");
    if (!ver || strcmp(ver, "13")) {
        srv_account(1, F_BAD_REQUEST, r->t_first, NULL);
        return respond(mc, r, 426, "text/plain", "websocket version 13 only", 25, "Sec-WebSocket-Version", "13");
    }
    const char *key = header(mc, "Sec-WebSocket-Key");
    char accept[29];
    if (!key || ma_ws_accept_key(key, accept)) {
        srv_account(1, F_BAD_REQUEST, r->t_first, NULL);
        return respond_error(mc, r, 400, "malformed Sec-WebSocket-Key", NULL, NULL);
    }
    struct MHD_Response *resp = MHD_create_response_for_upgrade(on_upgrade, hc);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Upgrade", "websocket");
    MHD_add_response_header(resp, "Connection", "Upgrade");
    MHD_add_response_header(resp, "Sec-WebSocket-Accept", accept);
    const enum MHD_Result ok = MHD_queue_response(mc, MHD_HTTP_SWITCHING_PROTOCOLS, resp);
    MHD_destroy_response(resp);
    r->phase = P_ANSWERED;
    return ok;
}

/* the first call: the head is complete */
static enum MHD_Result on_head(struct MHD_Connection *mc, hconn *hc, const char *url, const char *method, const char *version,
                               void **req_cls) {
    hreq *r = calloc(1, sizeof *r);
    if (!r) return MHD_NO;
    r->hc = hc;
    r->t_first = ma_now_ms();
    *req_cls = r;
    if (hc) hc->req = r;
    r->head_only = !strcmp(method, "HEAD");
    const int http10 = !strcmp(version, MHD_HTTP_VERSION_1_0);
    const char *te = header(mc, "Transfer-Encoding");
    const char *cl = header(mc, "Content-Length");
    count_ctx cc = {0};
    MHD_get_connection_values(mc, MHD_HEADER_KIND, count_cl, &cc);
    const char *up = header(mc, "Upgrade"), *conn = header(mc, "Connection");
    const int is_upgrade = up && conn && has_token(up, "websocket") && has_token(conn, "upgrade");
    /* the framing rules libmicrohttpd leaves to us: anything ambiguous is refused before its body */
    const char *bad = NULL;
    if (te && http10) bad = "request: Transfer-Encoding in an HTTP/1.0 request (its framing is not defined there)";
    else if (te && cl) bad = "request: both Transfer-Encoding and Content-Length";
    else if (te && strcasecmp(te, "chunked")) bad = "request: Transfer-Encoding other than chunked";
    else if (cc.n_cl > 1) bad = "request: more than one Content-Length";
    const int body = te || (cl && strcmp(cl, "0"));
    r->defer = !body;
    if (bad) {
        srv_log_line(hc ? hc->peer : "?", "http", 0, 0, NULL, bad);
        return respond_error(mc, r, 400, bad, NULL, NULL);
    }
    size_t al = 0;
    const char *auth = NULL;
    if (MHD_lookup_connection_value_n(mc, MHD_HEADER_KIND, "Authorization", 13, &auth, &al) != MHD_YES) auth = NULL;
    while (auth && al && (auth[al - 1] == ' ' || auth[al - 1] == '\t')) al--; /* trailing whitespace is not the value's (RFC 9110 5.5) */
    const ma_gate_in in = {method,
                           url,
                           http10,
                           is_upgrade,
                           srv.have_key ? ma_gate_key(auth, al, srv.api_key, srv.api_key_len) : MA_KEY_RIGHT,
                           !hc || hc->reserved,
                           srv.stopping};
    ma_gate_decide(&in, &r->g);
    const ma_gate *g = &r->g;
    const char *peer = hc ? hc->peer : "?";
    if (g->route == MA_R_REFUSED) {
        if (g->inference) srv_account(is_upgrade, g->reason, r->t_first, NULL);
        if (g->status != 404 && g->status != 405) srv_log_line(peer, is_upgrade ? "ws" : "http", 0, 0, NULL, g->msg);
        return respond_error(mc, r, g->status, g->msg, g->allow ? "Allow" : NULL, g->allow);
    }
    switch (g->route) {
    case MA_R_WEBSOCKET: return upgrade(mc, hc, r);
    case MA_R_ACT: {
        const char *q = MHD_lookup_connection_value(mc, MHD_GET_ARGUMENT_KIND, "format");
        r->list_format = q && !strcmp(q, "list");
        const char *sid = MHD_lookup_connection_value(mc, MHD_GET_ARGUMENT_KIND, "session_id");
        if (!sid) sid = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "X-Session-Id");
        if (sid) {
            int ok = *sid && strlen(sid) < sizeof r->session - 1;
            for (const char *c = sid; ok && *c; c++) ok = *c > 0x20 && *c < 0x7f && *c != '"' && *c != '\\';
            if (!ok) {
                srv_account(0, F_BAD_REQUEST, r->t_first, NULL);
                return respond_error(mc, r, 400, "session_id: 1 to 70 printable ASCII characters (no spaces, quotes or backslashes)", NULL,
                                     NULL);
            }
            snprintf(r->session, sizeof r->session, "%s", sid);
        }
        if (!te && !cl) {
            srv_account(0, F_BAD_REQUEST, r->t_first, NULL);
            return respond_error(mc, r, 411, "POST /act needs Content-Length or a chunked body", NULL, NULL);
        }
        if (!te && !strcmp(cl, "0")) { /* what requests.post(url) sends: nothing will come (F4) */
            srv_account(0, F_BAD_REQUEST, r->t_first, NULL);
            srv_log_line(peer, "http", 0, 0, NULL, "request: POST /act with an empty body");
            return respond_error(mc, r, 400,
                                 "request: POST /act with an empty body; send the observation (JSON, or msgpack over the websocket)", NULL,
                                 NULL);
        }
        const unsigned long long n = cl ? strtoull(cl, NULL, 10) : 0;
        if (n > srv.max_bytes) {
            char m[200];
            snprintf(m, sizeof m, "request body of %llu bytes exceeds --max-message-mb %.4g", n, srv.o->max_message_mb);
            srv.budget[B_MESSAGE].refused++;
            srv_account(0, F_TOO_LARGE, r->t_first, NULL);
            srv_log_line(peer, "http", (size_t)n, 0, NULL, m);
            return respond_error(mc, r, 413, m, NULL, NULL);
        }
        r->phase = P_BODY; /* libmicrohttpd answers Expect: 100-continue */
        r->defer = 0;
        return MHD_YES;
    }
    case MA_R_RESET: {
        const char *sid = MHD_lookup_connection_value(mc, MHD_GET_ARGUMENT_KIND, "session_id");
        if (!sid) sid = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "X-Session-Id");
        r->session_named = sid != NULL;
        if (sid && strlen(sid) < sizeof r->session) snprintf(r->session, sizeof r->session, "%s", sid);
    }
        if (cl && strtoull(cl, NULL, 10) > RESET_BODY_MAX)
            return respond_error(mc, r, 413, "POST /reset: a body of at most 64 KiB", NULL, NULL);
        r->phase = P_BODY; /* kept (64 KiB at most): it may name the session */
        r->defer = 0;
        return MHD_YES;
    default: break;
    }
    /* the rest have no body: one that comes anyway is not read (the library closes after the reply) */
    switch (g->route) {
    case MA_R_HEALTHZ: return respond(mc, r, 200, "text/plain", "OK", 2, NULL, NULL);
    case MA_R_HEALTH: return respond_json(mc, r, 200, srv_health_json(), NULL, NULL);
    case MA_R_PAGE:
        return respond(mc, r, 200, "text/html; charset=utf-8", SRV_STATUS_HTML, SRV_STATUS_HTML_LEN, "Content-Security-Policy",
                       SRV_PAGE_CSP);
    case MA_R_STATUS_JS: return respond(mc, r, 200, "text/javascript; charset=utf-8", SRV_STATUS_JS, SRV_STATUS_JS_LEN, NULL, NULL);
    case MA_R_STATUS: return respond_json(mc, r, 200, srv_status_json(), NULL, NULL);
    case MA_R_METRICS: {
        size_t len = 0;
        char *text = srv_metrics_text(&len);
        if (!text) return respond_error(mc, r, 500, "server: out of memory", NULL, NULL);
        const enum MHD_Result ok = respond(mc, r, 200, "text/plain; version=0.0.4; charset=utf-8", text, len, NULL, NULL);
        free(text);
        return ok;
    }
    default: return respond_error(mc, r, 500, "server: no route", NULL, NULL);
    }
}

static void refuse_body(hreq *r, int code, int reason, const char *msg) {
    if (r->refuse_code) return;
    r->refuse_code = code;
    r->refuse_reason = reason;
    snprintf(r->refuse_msg, sizeof r->refuse_msg, "%s", msg);
    srv_rx_free(&r->rx);
}

static void on_body(hreq *r, const char *data, size_t n) {
    /* libmicrohttpd reads a body a pool's worth at a time (--max-head-kb): the window it opens is
     * small, and the ACK that announces it waited for the delayed-ACK timer, holding a client's last
     * segments 60-100 ms (1 request in 200 at 200 kB). Each chunk re-arms quick ACKs. */
    if (r->hc) {
        const int one = 1;
        setsockopt(r->hc->fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof one);
    }
    if (r->refuse_code) return; /* dropped */
    if (r->g.route == MA_R_RESET) {
        if (r->rx.len + n > RESET_BODY_MAX) refuse_body(r, 413, -1, "POST /reset: a body of at most 64 KiB");
        else if (srv_rx_append(&r->rx, data, n)) refuse_body(r, 503, -1, "server: too much request data buffered; try again");
        return;
    }
    const int s = srv_rx_append(&r->rx, data, n);
    if (!s) return;
    char m[200];
    srv_rx_refusal(s, m, sizeof m);
    refuse_body(r, s == RX_OVER_MESSAGE ? 413 : 503, s == RX_OVER_MESSAGE ? F_TOO_LARGE : F_OVERLOADED, m);
}

static enum MHD_Result on_body_end(struct MHD_Connection *mc, hconn *hc, hreq *r) {
    const char *peer = hc ? hc->peer : "?";
    if (r->refuse_code) {
        if (r->refuse_reason >= 0) srv_account(0, r->refuse_reason, r->t_first, NULL);
        srv_log_line(peer, "http", r->rx.len, 0, NULL, r->refuse_msg);
        return respond_error(mc, r, r->refuse_code, r->refuse_msg, NULL, NULL);
    }
    if (r->g.route == MA_R_RESET) {
        /* the HTTP sessions' timelines (timeline.c): the one named by ?session_id=, X-Session-Id or
         * the body's "session_id" (MolmoAct2's serve_policy.py), else every one */
        char id[72];
        snprintf(id, sizeof id, "%s", r->session);
        cJSON *b = !id[0] && r->rx.len ? cJSON_ParseWithLength((const char *)r->rx.p, r->rx.len) : NULL;
        const cJSON *sid = b ? cJSON_GetObjectItemCaseSensitive(b, "session_id") : NULL;
        const int named = r->session_named || (sid && !cJSON_IsNull(sid));
        if (cJSON_IsString(sid) && strlen(sid->valuestring) < sizeof id) snprintf(id, sizeof id, "%s", sid->valuestring);
        cJSON_Delete(b);
        srv_rx_free(&r->rx);
        cJSON *o = cJSON_CreateObject(), *removed = cJSON_AddArrayToObject(o, "removed");
        cJSON_AddStringToObject(o, "status", "ok");
        if (id[0] || !named) tl_http_remove(id[0] ? id : NULL, removed); /* a name no session can have: none */
        return respond_json(mc, r, 200, o, NULL, NULL);
    }
    if (srv.stopping) {
        srv_rx_free(&r->rx);
        srv_account(0, F_SHUTTING_DOWN, r->t_first, NULL);
        srv_log_line(peer, "http", 0, 0, NULL, "refused: shutting down");
        return respond_error(mc, r, 503, "server: shutting down", NULL, NULL);
    }
    char m[200];
    const size_t len = r->rx.len;
    job *j = srv_job_new(&r->rx, hc ? hc->id : 0, 0, 1, peer, r->t_first, m, sizeof m);
    if (!j) {
        srv_account(0, F_OVERLOADED, r->t_first, NULL);
        srv_log_line(peer, "http", len, 0, NULL, m);
        return respond_error(mc, r, 503, m, NULL, NULL);
    }
    j->list_format = r->list_format;
    if (r->session[0]) tl_http_begin(r->session, j); /* the session's last chunk goes with the request (timeline.c) */
    r->phase = P_QUEUED;
    MHD_suspend_connection(mc); /* nothing more is read from it until the reply */
    srv_enqueue(j);
    return MHD_YES;
}

/* the reply to a job: actions as AllenAI's servers return them (a json_numpy float32 [N, D]
 * array; nested lists with ?format=list), or the error */
static enum MHD_Result answer(struct MHD_Connection *mc, hconn *hc, hreq *r) {
    job *j = r->result;
    r->result = NULL;
    enum MHD_Result ok;
    if (j->req.ignored[0] && !hc->ignored_logged) {
        hc->ignored_logged = 1;
        srv_log_event("ignored keys", hc->peer, j->req.ignored);
    }
    if (j->status) {
        srv_log_line(hc->peer, "http", j->bytes_in, strlen(j->msg), j, j->log);
        srv_account(0, srv_job_reason(j), j->t_recv, j);
        ok = respond_error(mc, r, srv_job_http_code(j), j->msg, NULL, NULL);
        srv_job_free(j);
        return ok;
    }
    cJSON *o = cJSON_CreateObject();
    const size_t na = (size_t)j->res.n_steps * (size_t)j->res.action_dim;
    if (j->list_format) {
        cJSON *rows = cJSON_AddArrayToObject(o, "actions");
        for (int k = 0; k < j->res.n_steps; k++) {
            cJSON *row = cJSON_CreateArray();
            for (int d = 0; d < j->res.action_dim; d++) {
                char num[32];
                snprintf(num, sizeof num, "%.9g", j->res.actions[k * j->res.action_dim + d]); /* round-trips the float */
                cJSON_AddItemToArray(row, cJSON_CreateRaw(num));
            }
            cJSON_AddItemToArray(rows, row);
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
    cJSON_Delete(o);
    ok = respond(mc, r, 200, "application/json", s ? s : "{}", s ? strlen(s) : 2, NULL, NULL);
    srv_log_line(hc->peer, "http", j->bytes_in, s ? strlen(s) : 0, j, "ok");
    srv_account(0, -1, j->t_recv, j);
    free(s);
    srv_job_free(j);
    return ok;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url, const char *method, const char *version,
                                  const char *data, size_t *size, void **req_cls) {
    (void)cls;
    hconn *hc = conn_of(mc);
    hreq *r = *req_cls;
    if (!r) return on_head(mc, hc, url, method, version, req_cls);
    if (hc && hc->killed) return MHD_NO;
    switch (r->phase) {
    case P_BODY:
        if (*size) {
            on_body(r, data, *size);
            *size = 0;
            return MHD_YES;
        }
        return on_body_end(mc, hc, r);
    case P_PENDING: {
        struct MHD_Response *resp = r->pending;
        r->pending = NULL;
        r->phase = P_ANSWERED;
        *size = 0;
        const enum MHD_Result ok = MHD_queue_response(mc, (unsigned)r->pending_code, resp);
        MHD_destroy_response(resp);
        return ok;
    }
    case P_QUEUED: return r->result && hc ? answer(mc, hc, r) : MHD_YES;
    default: *size = 0; return MHD_YES;
    }
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **req_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)mc;
    (void)toe;
    hreq *r = *req_cls;
    if (!r) return;
    *req_cls = NULL;
    if (r->result) { /* answered by nobody: the connection went away as it resumed */
        srv_account(0, r->result->status ? srv_job_reason(r->result) : -1, r->result->t_recv, r->result);
        srv_log_line(r->result->peer, "http", r->result->bytes_in, 0, r->result, "ok (client gone before the reply)");
        srv_job_free(r->result);
    }
    if (r->pending) MHD_destroy_response(r->pending);
    srv_rx_free(&r->rx);
    ma_budget_give(&srv.budget[B_OUTPUT], r->out_held);
    if (r->hc && r->hc->req == r) {
        r->hc->req = NULL;
        r->hc->t_mark = ma_now_ms();
    }
    free(r);
}

static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_context, enum MHD_ConnectionNotificationCode toe) {
    (void)cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        hconn *hc = calloc(1, sizeof *hc);
        *socket_context = hc;
        srv.n_http++;
        if (!hc) return; /* on_head treats it as a health-check slot */
        hc->mc = mc;
        hc->id = srv_new_id();
        hc->reserved = srv.n_http > srv.o->max_clients;
        hc->t_mark = ma_now_ms();
        const union MHD_ConnectionInfo *fi = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        hc->fd = fi ? fi->connect_fd : -1;
        const int one = 1;
        if (hc->fd >= 0) setsockopt(hc->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        const union MHD_ConnectionInfo *ai = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        char ip[INET6_ADDRSTRLEN] = "?";
        int port = 0;
        const struct sockaddr *sa = ai ? ai->client_addr : NULL;
        if (sa && sa->sa_family == AF_INET) {
            inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, ip, sizeof ip);
            port = ntohs(((const struct sockaddr_in *)sa)->sin_port);
        } else if (sa && sa->sa_family == AF_INET6) {
            inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, ip, sizeof ip);
            port = ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
        }
        snprintf(hc->peer, sizeof hc->peer, "%s:%d#%llu", ip, port, (unsigned long long)hc->id);
        hc->next = g_conns;
        if (g_conns) g_conns->prev = hc;
        g_conns = hc;
        return;
    }
    srv.n_http--;
    hconn *hc = *socket_context;
    if (!hc) return;
    if (hc->prev) hc->prev->next = hc->next;
    else g_conns = hc->next;
    if (hc->next) hc->next->prev = hc->prev;
    if (hc->req) hc->req->hc = NULL;
    free(hc);
}

static void on_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char m[512];
    vsnprintf(m, sizeof m, fmt, ap);
    size_t n = strlen(m);
    while (n && (m[n - 1] == '\n' || m[n - 1] == ' ')) m[--n] = '\0';
    srv_log_event("http", NULL, m);
}

/* ------------------------------------------------------------------------------ the loop's side */

int srv_http_start(void) {
    const unsigned pool = (unsigned)srv.o->max_head_kb * 1024u; /* the head, what is read ahead, the reply's head */
    srv.mhd = MHD_start_daemon(MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_ALLOW_UPGRADE | MHD_USE_ERROR_LOG, 0, NULL, NULL, on_request,
                               NULL, MHD_OPTION_EXTERNAL_LOGGER, on_log, NULL, MHD_OPTION_LISTEN_SOCKET, (MHD_socket)srv.listen_fd,
                               MHD_OPTION_CONNECTION_LIMIT, (unsigned)(srv.o->max_clients + HEALTH_RESERVE), MHD_OPTION_CONNECTION_TIMEOUT,
                               (unsigned)srv.o->recv_timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)pool,
                               MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL, MHD_OPTION_NOTIFY_CONNECTION, on_connection, NULL,
                               MHD_OPTION_STRICT_FOR_CLIENT, 1, MHD_OPTION_SIGPIPE_HANDLED_BY_APP, 1, MHD_OPTION_END);
    return srv.mhd ? 0 : -1;
}

void srv_http_job_done(job *j) {
    hconn *hc = find_hconn(j->conn_id);
    hreq *r = hc ? hc->req : NULL;
    const int gone = !r || r->phase != P_QUEUED || r->result;
    /* a chunk the client will not receive does not become its session's */
    if (j->session[0]) tl_http_end(j, !gone);
    if (gone) {
        srv_account(0, j->status ? srv_job_reason(j) : -1, j->t_recv, j);
        srv_log_line(j->peer, "http", j->bytes_in, 0, j, j->status ? j->log : "ok (client gone before the reply)");
        srv_job_free(j);
        return;
    }
    r->result = j;
    MHD_resume_connection(hc->mc);
}

void srv_http_tick(double now) {
    const double recv_ms = srv.o->recv_timeout_s * 1e3;
    for (hconn *hc = g_conns; hc; hc = hc->next) {
        if (hc->upgraded || hc->killed) continue;
        hreq *r = hc->req;
        if (!r && now - hc->t_mark > recv_ms) kill_conn(hc); /* no complete head in time (or idle that long) */
        else if (r && r->phase == P_BODY && now - r->t_first > recv_ms) {
            char m[160];
            snprintf(m, sizeof m, "request: not complete within --recv-timeout-s %d", srv.o->recv_timeout_s);
            if (r->g.route == MA_R_ACT) srv_account(0, F_TIMEOUT, r->t_first, NULL);
            srv_log_line(hc->peer, "http", r->rx.len, 0, NULL, m);
            abort_with(hc, 408, m);
        }
    }
}

void srv_http_drain(void) {
    for (hconn *hc = g_conns; hc; hc = hc->next) {
        if (hc->upgraded || hc->killed) continue;
        hreq *r = hc->req;
        if (r && r->phase == P_BODY) { /* a request not answered: told, not dropped (F19) */
            if (r->g.route == MA_R_ACT) srv_account(0, F_SHUTTING_DOWN, r->t_first, NULL);
            srv_log_line(hc->peer, "http", r->rx.len, 0, NULL, "refused: shutting down (a request not answered)");
            abort_with(hc, 503, "server: shutting down; the request was not answered");
        } else if (!r) kill_conn(hc);
    }
}

int srv_http_open(void) {
    int n = 0;
    for (hconn *hc = g_conns; hc; hc = hc->next) n += !hc->upgraded;
    return n;
}

void srv_http_stop(void) {
    if (srv.mhd) MHD_stop_daemon(srv.mhd);
    srv.mhd = NULL;
}
