/* `molmoact serve` (server.h): libwebsockets' event loop on this thread, inference on another. */
#define _GNU_SOURCE
#include "server/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <libwebsockets.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "io/jsonline.h"
#include "io/mapfile.h"
#include "molmoact.h"
#include "server/wire.h"

#define HISTORY 64 /* requests kept for the status page */

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* ------------------------------------------------------------------------------ state */

typedef struct conn {
    struct conn *next;
    struct lws *wsi;
    uint64_t id;
    int is_ws;
    char peer[64];
    uint8_t *rx;          /* the message (websocket) or body (HTTP) being received */
    size_t rx_len, rx_cap;
    int busy;             /* a request of this client is queued or running */
    /* what the next writeable callback sends */
    uint8_t *tx;          /* LWS_PRE bytes of headroom, then tx_len bytes */
    size_t tx_len;
    int tx_binary, tx_ready;
    int close_code;       /* close after sending tx (websocket), 0 = keep open */
    char close_reason[100];
    int meta_pending;
    int n_replies;
    double last_reply_ms; /* when the previous reply was sent (prev_total_ms) */
    /* HTTP */
    int post, http_headers_sent, http_status;
    const char *http_ctype;
    int refuse;           /* an HTTP response is set already (body ignored) */
} conn;

typedef struct job {
    struct job *next;
    uint64_t conn_id;
    int is_ws;
    char peer[64];
    size_t bytes_in;
    double t_recv, t_start, t_done;
    ma_wire_request req;
    molmoact_result res;
    int status; /* molmoact_status */
    char msg[1024];
} job;

typedef struct history_entry {
    double t, total, vision, llm, action_context, action_step, transfer, host, server_ms;
    int ok;
} history_entry;

static struct {
    const ma_serve_opts *o;
    molmoact *engine;
    molmoact_info info;
    char model_name[256];
    char api_key[256];
    size_t max_bytes;
    struct lws_context *ctx;
    conn *conns;
    int n_conns;
    uint64_t next_id;
    /* the queue to the inference thread and back */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *queue, **queue_tail, *done;
    int running, quit;
    /* statistics */
    double t_start;
    long served, failed;
    history_entry hist[HISTORY];
    int hist_n, hist_at;
} S;

static volatile sig_atomic_t g_stop;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
    if (S.ctx) lws_cancel_service(S.ctx);
}

/* a message for a client: no internal paths (an absolute path becomes its file name) */
static void client_message(const char *in, char *out, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; in[i] && k + 1 < cap; i++) {
        if (in[i] == '/' && (i == 0 || in[i - 1] == ' ' || in[i - 1] == '(' || in[i - 1] == '\'' || in[i - 1] == '"')) {
            size_t j = i, last = i;
            while (in[j] && in[j] != ' ' && in[j] != ':' && in[j] != ')' && in[j] != ',' && in[j] != '\'' && in[j] != '"') {
                if (in[j] == '/') last = j + 1;
                j++;
            }
            i = last - 1;
            continue;
        }
        out[k++] = in[i];
    }
    out[k] = '\0';
}

static void log_line(const char *client, const char *proto, size_t bytes_in, size_t bytes_out, const job *j, const char *outcome) {
    char line[2048];
    size_t k = (size_t)snprintf(line, sizeof line, "{\"client\": \"%s\", \"proto\": \"%s\", \"bytes_in\": %zu, \"bytes_out\": %zu", client, proto,
                                bytes_in, bytes_out);
    if (j && j->status == MOLMOACT_OK) {
        const molmoact_timing *t = &j->res.timing;
        k += (size_t)snprintf(line + k, sizeof line - k,
                              ", \"ms\": {\"queue\": %.3f, \"total\": %.3f, \"vision\": %.3f, \"llm\": %.3f, \"action_context\": %.3f, "
                              "\"action_step\": %.3f, \"transfer\": %.3f, \"host\": %.3f}",
                              j->t_start - j->t_recv, t->total, t->vision, t->llm_split[0] + t->llm_split[1] + t->llm_split[2] + t->llm_split[3],
                              t->action_context, t->action_step, t->transfer, t->host);
    }
    fputs(line, stderr);
    fputs(", \"outcome\": ", stderr);
    ma_json_write_string(stderr, outcome, strlen(outcome));
    fputs("}\n", stderr);
    fflush(stderr);
}

static void record(const job *j) {
    history_entry *h = &S.hist[S.hist_at];
    S.hist_at = (S.hist_at + 1) % HISTORY;
    if (S.hist_n < HISTORY) S.hist_n++;
    memset(h, 0, sizeof *h);
    h->t = (j->t_done - S.t_start) / 1e3;
    h->ok = j->status == MOLMOACT_OK;
    h->server_ms = j->t_done - j->t_start;
    if (h->ok) {
        const molmoact_timing *t = &j->res.timing;
        h->total = t->total;
        h->vision = t->vision;
        h->llm = t->llm_split[0] + t->llm_split[1] + t->llm_split[2] + t->llm_split[3];
        h->action_context = t->action_context;
        h->action_step = t->action_step;
        h->transfer = t->transfer;
        h->host = t->host;
        S.served++;
    } else S.failed++;
}

/* ------------------------------------------------------------------------------ inference thread */

static void *infer_thread(void *arg) {
    (void)arg;
    pthread_mutex_lock(&S.mu);
    for (;;) {
        while (!S.queue && !S.quit) pthread_cond_wait(&S.cv, &S.mu);
        if (!S.queue) break;
        job *j = S.queue;
        S.queue = j->next;
        if (!S.queue) S.queue_tail = &S.queue;
        S.running = 1;
        pthread_mutex_unlock(&S.mu);
        j->t_start = now_ms();
        molmoact_error err;
        j->status = molmoact_infer(S.engine, &j->req.obs, &j->res, &err);
        if (j->status) client_message(err.message, j->msg, sizeof j->msg);
        j->t_done = now_ms();
        pthread_mutex_lock(&S.mu);
        j->next = S.done;
        S.done = j;
        S.running = 0;
        lws_cancel_service(S.ctx);
    }
    pthread_mutex_unlock(&S.mu);
    return NULL;
}

static void enqueue(job *j) {
    pthread_mutex_lock(&S.mu);
    j->next = NULL;
    *S.queue_tail = j;
    S.queue_tail = &j->next;
    pthread_cond_signal(&S.cv);
    pthread_mutex_unlock(&S.mu);
}

static void job_free(job *j) {
    ma_wire_request_free(&j->req);
    molmoact_result_free(&j->res);
    free(j);
}

/* ------------------------------------------------------------------------------ connections */

static conn *find_conn(uint64_t id) {
    for (conn *c = S.conns; c; c = c->next)
        if (c->id == id) return c;
    return NULL;
}

static conn *conn_of(struct lws *wsi) {
    for (conn *c = S.conns; c; c = c->next)
        if (c->wsi == wsi) return c;
    return NULL;
}

/* connections are ours (malloc'd, found by wsi), not lws's per-session memory, whose life
 * does not follow the socket's for HTTP keep-alive */
static conn *conn_link(struct lws *wsi, int is_ws) {
    conn *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->wsi = wsi;
    c->id = ++S.next_id;
    c->is_ws = is_ws;
    c->next = S.conns;
    S.conns = c;
    S.n_conns++;
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (getpeername(lws_get_socket_fd(wsi), (struct sockaddr *)&sa, &sl) == 0) {
        if (sa.ss_family == AF_INET) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)&sa)->sin_addr, ip, sizeof ip);
            port = ntohs(((struct sockaddr_in *)&sa)->sin_port);
        } else if (sa.ss_family == AF_INET6) {
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&sa)->sin6_addr, ip, sizeof ip);
            port = ntohs(((struct sockaddr_in6 *)&sa)->sin6_port);
        }
    }
    snprintf(c->peer, sizeof c->peer, "%s:%d#%llu", ip, port, (unsigned long long)c->id);
    return c;
}

static void conn_release(struct lws *wsi) {
    conn *c = conn_of(wsi);
    if (!c) return;
    for (conn **p = &S.conns; *p; p = &(*p)->next)
        if (*p == c) { *p = c->next; break; }
    S.n_conns--;
    free(c->rx);
    free(c->tx);
    free(c);
}

static int rx_append(conn *c, const void *in, size_t len) {
    if (c->rx_len + len > S.max_bytes) return -1;
    if (c->rx_len + len > c->rx_cap) {
        size_t cap = c->rx_cap ? c->rx_cap : 65536;
        while (cap < c->rx_len + len) cap *= 2;
        if (cap > S.max_bytes) cap = S.max_bytes;
        uint8_t *p = realloc(c->rx, cap);
        if (!p) return -2;
        c->rx = p;
        c->rx_cap = cap;
    }
    memcpy(c->rx + c->rx_len, in, len);
    c->rx_len += len;
    return 0;
}

/* queue a message for the client (copied after LWS_PRE headroom) */
static void send_msg(conn *c, const void *data, size_t len, int binary, int close_code, const char *reason) {
    free(c->tx);
    c->tx = malloc(LWS_PRE + len + 1);
    c->tx_len = c->tx ? len : 0;
    if (c->tx && len) memcpy(c->tx + LWS_PRE, data, len);
    c->tx_binary = binary;
    c->tx_ready = 1;
    c->close_code = close_code;
    snprintf(c->close_reason, sizeof c->close_reason, "%s", reason ? reason : "");
    lws_callback_on_writable(c->wsi);
}

static void send_http(conn *c, int status, const char *ctype, const char *body, size_t len) {
    send_msg(c, body, len, 0, 0, NULL);
    c->http_status = status;
    c->http_ctype = ctype;
    c->http_headers_sent = 0;
}

static void send_http_error(conn *c, int status, const char *msg) {
    char clean[1100];
    client_message(msg, clean, sizeof clean);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "error", clean);
    char *s = cJSON_PrintUnformatted(j);
    send_http(c, status, "application/json", s ? s : "{}", s ? strlen(s) : 2);
    free(s);
    cJSON_Delete(j);
    c->refuse = 1;
}

/* a websocket error: a text frame naming the fault, then close 1011 (as openpi's server) */
static void send_ws_error(conn *c, const char *msg, int code) {
    char clean[1100];
    client_message(msg, clean, sizeof clean);
    send_msg(c, clean, strlen(clean), 0, code, code == 1009 ? "message too big" : "request failed");
}

/* ------------------------------------------------------------------------------ HTTP pages */

static char *status_json(void) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", S.model_name);
    cJSON_AddStringToObject(j, "variant", S.info.variant);
    cJSON_AddStringToObject(j, "version", molmoact_version());
    cJSON *pr = cJSON_AddObjectToObject(j, "precision");
    cJSON_AddStringToObject(pr, "vision", S.info.precision[0]);
    cJSON_AddStringToObject(pr, "llm", S.info.precision[1]);
    cJSON_AddStringToObject(pr, "action", S.info.precision[2]);
    cJSON_AddStringToObject(j, "mode", S.info.inproc ? "inproc" : "resident, 6 worker processes");
    cJSON_AddNumberToObject(j, "uptime_s", (now_ms() - S.t_start) / 1e3);
    cJSON_AddNumberToObject(j, "requests_served", (double)S.served);
    cJSON_AddNumberToObject(j, "requests_failed", (double)S.failed);
    cJSON_AddNumberToObject(j, "clients", S.n_conns);
    cJSON *arr = cJSON_AddArrayToObject(j, "recent");
    for (int i = 0; i < S.hist_n; i++) {
        const history_entry *h = &S.hist[(S.hist_at - S.hist_n + i + HISTORY) % HISTORY];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "t_s", h->t);
        cJSON_AddBoolToObject(e, "ok", h->ok);
        cJSON_AddNumberToObject(e, "vision", h->vision);
        cJSON_AddNumberToObject(e, "llm", h->llm);
        cJSON_AddNumberToObject(e, "action_context", h->action_context);
        cJSON_AddNumberToObject(e, "action_step", h->action_step);
        cJSON_AddNumberToObject(e, "transfer", h->transfer);
        cJSON_AddNumberToObject(e, "host", h->host);
        cJSON_AddNumberToObject(e, "total", h->total);
        cJSON_AddItemToArray(arr, e);
    }
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return s;
}

/* the status page: a table of the server's state and a stacked bar per recent request (SVG),
 * refreshed from /status.json */
static const char STATUS_PAGE[] =
    "<!doctype html><html><head><meta charset=utf-8><title>molmoact serve</title><style>"
    "body{font:14px sans-serif;margin:24px;color:#222}table{border-collapse:collapse}td{padding:2px 12px 2px 0}"
    "h1{font-size:20px}.k{color:#666}#legend span{display:inline-block;margin-right:14px}"
    "#legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:middle}</style></head><body>"
    "<h1>molmoact serve</h1><table id=info></table><h2 style='font-size:16px'>Latency of the last requests (ms per component)</h2>"
    "<svg id=plot width=760 height=280 style='border:1px solid #ccc'></svg><div id=legend></div>"
    "<script>\n"
    "const parts=[['vision','#4e79a7'],['llm','#f28e2b'],['action_context','#e15759'],['action_step','#76b7b2'],"
    "['transfer','#59a14f'],['host','#edc948']];\n"
    "function row(k,v){return '<tr><td class=k>'+k+'</td><td>'+v+'</td></tr>'}\n"
    "function draw(s){\n"
    " document.getElementById('info').innerHTML=row('model',s.model)+row('variant',s.variant)+row('precision',"
    "s.precision.vision+' / '+s.precision.llm+' / '+s.precision.action)+row('mode',s.mode)+row('uptime',s.uptime_s.toFixed(0)+' s')"
    "+row('requests served',s.requests_served)+row('requests failed',s.requests_failed)+row('clients',s.clients)+row('version',s.version);\n"
    " const svg=document.getElementById('plot'),W=760,H=280,L=50,B=20,T=12;let max=1;\n"
    " s.recent.forEach(r=>{let t=0;parts.forEach(p=>t+=r[p[0]]);max=Math.max(max,t)});\n"
    " let g='<line x1='+L+' y1='+T+' x2='+L+' y2='+(H-B)+' stroke=#999 />';\n"
    " for(let i=0;i<=4;i++){const y=T+(H-B-T)*(1-i/4);g+='<text x=4 y='+(y+4)+' font-size=11>'+(max*i/4).toFixed(1)+'</text>'}\n"
    " const n=s.recent.length,bw=n?Math.min(24,Math.max(2,(W-L-10)/n-2)):0;\n"
    " s.recent.forEach((r,i)=>{let y=H-B;const x=L+4+i*(bw+2);parts.forEach(p=>{const h=(H-B-T)*r[p[0]]/max;y-=h;"
    "g+='<rect x='+x+' y='+y+' width='+bw+' height='+h+' fill='+p[1]+' />'});if(!r.ok)g+='<text x='+x+' y='+(H-4)+' font-size=11 fill=red>x</text>'});\n"
    " svg.innerHTML=g;\n"
    " document.getElementById('legend').innerHTML=parts.map(p=>'<span><i style=background:'+p[1]+'></i>'+p[0]+'</span>').join('');}\n"
    "function tick(){fetch('status.json').then(r=>r.json()).then(draw).catch(()=>{})}\n"
    "tick();setInterval(tick,2000);\n"
    "</script></body></html>";

/* ------------------------------------------------------------------------------ requests */

static void start_request(conn *c, int json) {
    ma_error err = {0};
    job *j = calloc(1, sizeof *j);
    if (!j) {
        if (c->is_ws) send_ws_error(c, "server: out of memory", 1011);
        else send_http_error(c, 500, "server: out of memory");
        return;
    }
    j->conn_id = c->id;
    j->is_ws = c->is_ws;
    j->bytes_in = c->rx_len;
    j->t_recv = now_ms();
    snprintf(j->peer, sizeof j->peer, "%s", c->peer);
    ma_status s = json ? ma_wire_decode_json((const char *)c->rx, c->rx_len, S.o->flip180, &j->req, &err)
                       : ma_wire_decode_msgpack(c->rx, c->rx_len, S.o->flip180, &j->req, &err);
    c->rx_len = 0;
    if (s) {
        log_line(c->peer, c->is_ws ? "ws" : "http", j->bytes_in, 0, NULL, err.msg);
        S.failed++;
        if (c->is_ws) send_ws_error(c, err.msg, 1011);
        else send_http_error(c, 400, err.msg);
        job_free(j);
        return;
    }
    if (g_stop) {
        log_line(c->peer, c->is_ws ? "ws" : "http", j->bytes_in, 0, NULL, "refused: shutting down");
        if (c->is_ws) send_ws_error(c, "server: shutting down", 1001);
        else send_http_error(c, 503, "server: shutting down");
        job_free(j);
        return;
    }
    c->busy = 1;
    lws_rx_flow_control(c->wsi, 0); /* strictly one request, one reply: read nothing meanwhile */
    enqueue(j);
}

static void finish_job(job *j) {
    record(j);
    conn *c = find_conn(j->conn_id);
    const char *proto = j->is_ws ? "ws" : "http";
    if (!c) {
        log_line(j->peer, proto, j->bytes_in, 0, j, j->status ? j->msg : "ok (client gone before the reply)");
        job_free(j);
        return;
    }
    c->busy = 0;
    lws_rx_flow_control(c->wsi, 1);
    if (j->status) {
        log_line(c->peer, proto, j->bytes_in, strlen(j->msg), j, j->msg);
        if (c->is_ws) send_ws_error(c, j->msg, 1011);
        else send_http_error(c, j->status == MOLMOACT_ERR_WORKER ? 503 : (j->status == MOLMOACT_ERR_NOMEM || j->status == MOLMOACT_ERR_IO) ? 500 : 400, j->msg);
        job_free(j);
        return;
    }
    const double server_ms = j->t_done - j->t_recv;
    if (c->is_ws) {
        ma_wire_buf b;
        ma_error err = {0};
        const double prev = c->n_replies ? now_ms() - c->last_reply_ms : -1.0;
        if (ma_wire_encode_reply(&j->res, server_ms, prev, &b, &err)) send_ws_error(c, err.msg, 1011);
        else {
            send_msg(c, b.data, b.len, 1, 0, NULL);
            log_line(c->peer, proto, j->bytes_in, b.len, j, "ok");
        }
        free(b.data);
        c->n_replies++;
        c->last_reply_ms = now_ms();
    } else {
        cJSON *o = cJSON_CreateObject(), *rows = cJSON_AddArrayToObject(o, "actions");
        for (int k = 0; k < j->res.n_steps; k++) {
            cJSON *r = cJSON_CreateArray();
            for (int d = 0; d < j->res.action_dim; d++) {
                char num[32];
                snprintf(num, sizeof num, "%.9g", j->res.actions[k * j->res.action_dim + d]); /* round-trips the float */
                cJSON_AddItemToArray(r, cJSON_CreateRaw(num));
            }
            cJSON_AddItemToArray(rows, r);
        }
        cJSON_AddNumberToObject(o, "dt_ms", server_ms);
        char *s = cJSON_PrintUnformatted(o);
        send_http(c, 200, "application/json", s ? s : "{}", s ? strlen(s) : 2);
        log_line(c->peer, proto, j->bytes_in, s ? strlen(s) : 0, j, "ok");
        free(s);
        cJSON_Delete(o);
    }
    job_free(j);
}

static void collect_done(void) {
    pthread_mutex_lock(&S.mu);
    job *d = S.done;
    S.done = NULL;
    pthread_mutex_unlock(&S.mu);
    /* oldest first */
    job *rev = NULL;
    while (d) { job *n = d->next; d->next = rev; rev = d; d = n; }
    while (rev) { job *n = rev->next; finish_job(rev); rev = n; }
}

static int authorised(struct lws *wsi) {
    if (!S.api_key[0]) return 1;
    char h[400];
    if (lws_hdr_copy(wsi, h, sizeof h, WSI_TOKEN_HTTP_AUTHORIZATION) <= 0) return 0;
    const char *pre = "Api-Key ";
    if (strncmp(h, pre, strlen(pre))) return 0;
    const char *k = h + strlen(pre);
    size_t a = strlen(k), b = strlen(S.api_key);
    unsigned diff = (unsigned)(a ^ b);
    for (size_t i = 0; i < b; i++) diff |= (unsigned)(k[i < a ? i : 0] ^ S.api_key[i]);
    return diff == 0;
}

/* ------------------------------------------------------------------------------ the callback */

static int write_pending(conn *c) {
    if (!c->tx_ready) return 0;
    if (!c->is_ws) {
        if (!c->http_headers_sent) {
            uint8_t hb[LWS_PRE + 512], *start = hb + LWS_PRE, *p = start, *end = hb + sizeof hb - 1;
            if (lws_add_http_common_headers(c->wsi, (unsigned)c->http_status, c->http_ctype, c->tx_len, &p, end) ||
                lws_add_http_header_by_name(c->wsi, (const unsigned char *)"cache-control:", (const unsigned char *)"no-store", 8, &p, end) ||
                lws_finalize_write_http_header(c->wsi, start, &p, end))
                return -1;
            c->http_headers_sent = 1;
            lws_callback_on_writable(c->wsi);
            return 0;
        }
        c->tx_ready = 0;
        if (lws_write(c->wsi, c->tx + LWS_PRE, c->tx_len, LWS_WRITE_HTTP_FINAL) != (int)c->tx_len) return -1;
        free(c->tx);
        c->tx = NULL;
        c->refuse = 0;
        c->post = 0;
        return lws_http_transaction_completed(c->wsi) ? -1 : 0;
    }
    c->tx_ready = 0;
    if (c->tx_len && lws_write(c->wsi, c->tx + LWS_PRE, c->tx_len, c->tx_binary ? LWS_WRITE_BINARY : LWS_WRITE_TEXT) != (int)c->tx_len) return -1;
    free(c->tx);
    c->tx = NULL;
    if (c->close_code) {
        lws_close_reason(c->wsi, (enum lws_close_status)c->close_code, (unsigned char *)c->close_reason, strlen(c->close_reason));
        return -1;
    }
    return 0;
}

static int callback(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len) {
    (void)user;
    conn *c = wsi ? conn_of(wsi) : NULL;
    switch (reason) {
    case LWS_CALLBACK_EVENT_WAIT_CANCELLED:
        collect_done();
        return 0;

    case LWS_CALLBACK_FILTER_NETWORK_CONNECTION:
        return S.n_conns >= S.o->max_clients || g_stop ? -1 : 0;

    case LWS_CALLBACK_HTTP_CONFIRM_UPGRADE: /* a websocket handshake: the key before anything */
        if (!authorised(wsi)) {
            log_line("handshake", "ws", 0, 0, NULL, "refused: missing or wrong API key");
            /* written whole: lws' header helpers answer an upgrade request as HTTP/1.0 here */
            static const char resp[] = "HTTP/1.1 401 Unauthorized\r\ncontent-type: text/plain\r\ncontent-length: 37\r\n"
                                       "connection: close\r\n\r\nmissing or wrong API key (Api-Key ...)";
            uint8_t hb[LWS_PRE + sizeof resp];
            memcpy(hb + LWS_PRE, resp, sizeof resp - 1);
            lws_write(wsi, hb + LWS_PRE, sizeof resp - 1, LWS_WRITE_HTTP_HEADERS);
            return -1;
        }
        return 0;

    case LWS_CALLBACK_ESTABLISHED: {
        conn_release(wsi); /* HTTP transactions before the upgrade */
        if (!(c = conn_link(wsi, 1))) return -1;
        ma_wire_buf b;
        ma_error err = {0};
        if (ma_wire_encode_metadata(&S.info, S.model_name, &b, &err)) return -1;
        send_msg(c, b.data, b.len, 1, 0, NULL);
        free(b.data);
        return 0;
    }

    case LWS_CALLBACK_RECEIVE: {
        if (!c) return -1;
        if (c->busy) { send_ws_error(c, "protocol: one request at a time (wait for the reply)", 1008); return 0; }
        if (c->close_code) return 0;
        if (lws_is_first_fragment(wsi) && c->rx_len) c->rx_len = 0;
        const int r = rx_append(c, in, len);
        if (r) {
            char m[160];
            snprintf(m, sizeof m, "request: the message exceeds --max-message-mb %.4g", S.o->max_message_mb);
            log_line(c->peer, "ws", c->rx_len + len, 0, NULL, r == -1 ? m : "out of memory");
            c->rx_len = 0;
            send_ws_error(c, r == -1 ? m : "server: out of memory", r == -1 ? 1009 : 1011);
            return 0;
        }
        if (!lws_is_final_fragment(wsi) || lws_remaining_packet_payload(wsi)) {
            lws_set_timeout(wsi, PENDING_TIMEOUT_USER_OK, S.o->recv_timeout_s); /* a partial sender */
            return 0;
        }
        lws_set_timeout(wsi, NO_PENDING_TIMEOUT, 0);
        if (!lws_frame_is_binary(wsi)) {
            log_line(c->peer, "ws", c->rx_len, 0, NULL, "request: a text frame");
            c->rx_len = 0;
            send_ws_error(c, "request: expected a binary msgpack frame, got text", 1011);
            return 0;
        }
        start_request(c, 0);
        return 0;
    }

    case LWS_CALLBACK_SERVER_WRITEABLE:
        if (!c) return 0;
        return write_pending(c);

    case LWS_CALLBACK_CLOSED:
        conn_release(wsi);
        return 0;

    case LWS_CALLBACK_HTTP: {
        const char *path = in ? (const char *)in : "/";
        if (!c && !(c = conn_link(wsi, 0))) return -1;
        c->post = lws_hdr_total_length(wsi, WSI_TOKEN_POST_URI) > 0;
        c->rx_len = 0;
        c->refuse = 0;
        const int health = !strcmp(path, "/healthz") || !strcmp(path, "/health");
        if (!health && !authorised(wsi)) {
            log_line(c->peer, "http", 0, 0, NULL, "refused: missing or wrong API key");
            send_http_error(c, 401, "missing or wrong API key (Authorization: Api-Key <key>)");
            return 0;
        }
        if (c->post) {
            if (strcmp(path, "/act")) { send_http_error(c, 404, "not found (POST /act)"); return 0; }
            char cl[32];
            if (lws_hdr_copy(wsi, cl, sizeof cl, WSI_TOKEN_HTTP_CONTENT_LENGTH) > 0 && strtod(cl, NULL) > (double)S.max_bytes) {
                send_http_error(c, 413, "request body exceeds --max-message-mb");
                return 0;
            }
            lws_set_timeout(wsi, PENDING_TIMEOUT_HTTP_CONTENT, S.o->recv_timeout_s);
            return 0;
        }
        if (!strcmp(path, "/healthz")) { send_http(c, 200, "text/plain", "OK", 2); return 0; }
        if (!strcmp(path, "/health") || !strcmp(path, "/act")) {
            char b[512];
            int n = snprintf(b, sizeof b, "{\"status\": \"ok\", \"model\": \"%s\", \"variant\": \"%s\", \"version\": \"%s\"}", S.model_name,
                             S.info.variant, molmoact_version());
            send_http(c, 200, "application/json", b, (size_t)n);
            return 0;
        }
        if (!strcmp(path, "/")) { send_http(c, 200, "text/html; charset=utf-8", STATUS_PAGE, sizeof STATUS_PAGE - 1); return 0; }
        if (!strcmp(path, "/status.json")) {
            char *s = status_json();
            send_http(c, 200, "application/json", s ? s : "{}", s ? strlen(s) : 2);
            free(s);
            return 0;
        }
        send_http_error(c, 404, "not found (GET /healthz, /health, /act, /, /status.json; POST /act; any other path: websocket)");
        return 0;
    }

    case LWS_CALLBACK_HTTP_BODY:
        if (!c || c->refuse) return 0;
        if (rx_append(c, in, len)) {
            c->rx_len = 0;
            send_http_error(c, 413, "request body exceeds --max-message-mb");
        }
        return 0;

    case LWS_CALLBACK_HTTP_BODY_COMPLETION:
        if (!c || c->refuse) return 0;
        lws_set_timeout(wsi, NO_PENDING_TIMEOUT, 0);
        start_request(c, 1);
        return 0;

    case LWS_CALLBACK_HTTP_WRITEABLE:
        if (!c) return 0;
        return write_pending(c);

    case LWS_CALLBACK_CLOSED_HTTP:
    case LWS_CALLBACK_WSI_DESTROY:
        conn_release(wsi);
        return 0;

    default:
        return 0;
    }
}

static struct lws_protocols PROTOCOLS[] = {
    {"molmoact", callback, 0, 65536, 0, NULL, 0},
    {NULL, NULL, 0, 0, 0, NULL, 0},
};

/* ------------------------------------------------------------------------------ main */

static int read_key(const char *path) {
    char *text = NULL;
    size_t len;
    ma_error err = {0};
    if (ma_read_file(path, 4096, &text, &len, &err)) { fprintf(stderr, "molmoact serve: %s\n", err.msg); return -1; }
    size_t a = 0, b = len;
    while (a < b && (text[a] == ' ' || text[a] == '\n' || text[a] == '\r' || text[a] == '\t')) a++;
    while (b > a && (text[b - 1] == ' ' || text[b - 1] == '\n' || text[b - 1] == '\r' || text[b - 1] == '\t')) b--;
    int bad = b == a || b - a >= sizeof S.api_key || memchr(text + a, '\n', b - a) != NULL;
    if (!bad) snprintf(S.api_key, sizeof S.api_key, "%.*s", (int)(b - a), text + a);
    free(text);
    if (bad) { fprintf(stderr, "molmoact serve: %s: the API key must be one non-empty line of at most 255 bytes\n", path); return -1; }
    return 0;
}

int ma_serve(const ma_serve_opts *o) {
    memset(&S, 0, sizeof S);
    S.o = o;
    S.queue_tail = &S.queue;
    pthread_mutex_init(&S.mu, NULL);
    pthread_cond_init(&S.cv, NULL);
    if (o->max_message_mb <= 0 || o->max_message_mb > 4096) { fprintf(stderr, "molmoact serve: --max-message-mb must be in (0, 4096]\n"); return 1; }
    if (o->port < 0 || o->port > 65535) { fprintf(stderr, "molmoact serve: --port must be in [0, 65535]\n"); return 1; }
    if (o->max_clients < 1 || o->max_clients > 100000) { fprintf(stderr, "molmoact serve: --max-clients must be in [1, 100000]\n"); return 1; }
    S.max_bytes = (size_t)(o->max_message_mb * 1048576.0);
    if (o->api_key_file && read_key(o->api_key_file)) return 1;
    /* the model's name: its directory's (the parent's for .../NAME/model), never the path */
    char full[PATH_MAX];
    if (!realpath(o->model_dir, full)) snprintf(full, sizeof full, "%s", o->model_dir);
    char *last = strrchr(full, '/');
    if (last && !strcmp(last + 1, "model") && last != full) {
        *last = '\0';
        last = strrchr(full, '/');
    }
    snprintf(S.model_name, sizeof S.model_name, "%s", last ? last + 1 : full);

    /* the engine first: the port opens only once every session is loaded */
    molmoact_options opt;
    molmoact_options_init(&opt);
    opt.model_dir = o->model_dir;
    opt.inproc = o->inproc;
    opt.threads = o->threads;
    opt.norm_tag = o->norm_tag;
    opt.worker_exe = o->worker_exe;
    molmoact_error err;
    if (molmoact_open(&opt, &S.engine, &err)) { fprintf(stderr, "molmoact serve: %s\n", err.message); return 1; }
    if (molmoact_get_info(S.engine, &S.info, &err)) { fprintf(stderr, "molmoact serve: %s\n", err.message); molmoact_close(&S.engine); return 1; }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    lws_set_log_level(LLL_ERR, NULL);

    struct lws_context_creation_info info;
    memset(&info, 0, sizeof info);
    info.port = o->port;
    info.iface = o->host;
    info.protocols = PROTOCOLS;
    info.options = LWS_SERVER_OPTION_DISABLE_IPV6 * (strchr(o->host, ':') == NULL);
    info.max_http_header_data = 4096;
    info.timeout_secs = o->recv_timeout_s;
    info.pt_serv_buf_size = 65536;
    S.ctx = lws_create_context(&info);
    if (!S.ctx) {
        fprintf(stderr, "molmoact serve: cannot listen on %s:%d (in use, or not an address of this machine)\n", o->host, o->port);
        molmoact_close(&S.engine);
        return 1;
    }
    S.t_start = now_ms();
    pthread_t th;
    if (pthread_create(&th, NULL, infer_thread, NULL)) {
        fprintf(stderr, "molmoact serve: cannot start the inference thread\n");
        lws_context_destroy(S.ctx);
        molmoact_close(&S.engine);
        return 1;
    }
    fprintf(stderr, "{\"event\": \"listening\", \"host\": \"%s\", \"port\": %d, \"model\": \"%s\", \"variant\": \"%s\", \"mode\": \"%s\"}\n",
            o->host, o->port, S.model_name, S.info.variant, S.info.inproc ? "inproc" : "resident");
    fflush(stderr);

    /* serve; on a signal: finish what is queued or running, then close every client (1001) */
    int phase = 0;
    double deadline = 0;
    while (phase < 3) {
        lws_service(S.ctx, 250);
        if (g_stop && phase == 0) phase = 1;
        if (phase == 1) {
            pthread_mutex_lock(&S.mu);
            const int idle = !S.queue && !S.running && !S.done;
            pthread_mutex_unlock(&S.mu);
            if (idle) {
                for (conn *c = S.conns; c; c = c->next)
                    if (c->is_ws && !c->tx_ready) send_msg(c, NULL, 0, 0, LWS_CLOSE_STATUS_GOINGAWAY, "server shutting down");
                phase = 2;
                deadline = now_ms() + 3000;
            }
        }
        if (phase == 2) {
            int ws_left = 0;
            for (conn *c = S.conns; c; c = c->next) ws_left += c->is_ws;
            if (!ws_left || now_ms() > deadline) phase = 3;
        }
    }
    pthread_mutex_lock(&S.mu);
    S.quit = 1;
    pthread_cond_signal(&S.cv);
    pthread_mutex_unlock(&S.mu);
    pthread_join(th, NULL);
    lws_context_destroy(S.ctx);
    S.ctx = NULL;
    collect_done(); /* nothing is left; frees anything that is */
    const int bad = molmoact_close(&S.engine) != MOLMOACT_OK;
    fprintf(stderr, "{\"event\": \"stopped\", \"served\": %ld, \"failed\": %ld}\n", S.served, S.failed);
    pthread_mutex_destroy(&S.mu);
    pthread_cond_destroy(&S.cv);
    return bad ? 1 : 0;
}
