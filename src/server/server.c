/* SPDX-License-Identifier: Apache-2.0 */
/* `molmoact serve` (server.h): the process — options, the listening socket, the event loop and the
 * drain. The parts and what they share: internal.h. */
#define _GNU_SOURCE
#include "server/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "core/util.h"
#include "io/jsonline.h"
#include "io/mapfile.h"
#include "server/internal.h"

ma_server srv;
static volatile sig_atomic_t g_stop;

void srv_wake(void) {
    const char b = 1;
    ssize_t n = write(srv.wake[1], &b, 1);
    (void)n;
}

void ma_serve_stop(void) {
    g_stop = 1;
    const int e = errno;
    if (srv.wake[1] >= 0) srv_wake();
    errno = e;
}

static void on_signal(int sig) {
    (void)sig;
    ma_serve_stop();
}

static const ma_serve_engine MOLMOACT_ENGINE = {molmoact_open, molmoact_get_info, molmoact_infer, molmoact_close};

uint64_t srv_new_id(void) { return ++srv.next_id; }

void srv_conn_add(ma_conn *c) {
    c->next = srv.conns;
    srv.conns = c;
}

ma_conn *srv_conn_find(uint64_t id) {
    for (ma_conn *c = srv.conns; c; c = c->next)
        if (c->id == id) return c;
    return NULL;
}

/* ------------------------------------------------------------------------------ request data */

int srv_rx_append(srv_rx *r, const void *data, size_t n) {
    if (!n) return 0;
    if (n > srv.max_bytes - r->len) {
        srv.budget[B_MESSAGE].refused++;
        return RX_OVER_MESSAGE;
    }
    if (r->len + n > r->cap) {
        const size_t cap = ma_grow_cap(r->cap, r->len + n, 65536, srv.max_bytes);
        if (ma_budget_take(&srv.budget[B_INPUT], cap - r->cap)) return RX_OVER_INPUT;
        uint8_t *p = realloc(r->p, cap);
        if (!p) {
            ma_budget_give(&srv.budget[B_INPUT], cap - r->cap);
            return -1;
        }
        r->p = p;
        r->cap = cap;
    }
    memcpy(r->p + r->len, data, n);
    r->len += n;
    if (r->len > srv.budget[B_MESSAGE].peak) srv.budget[B_MESSAGE].peak = r->len; /* the largest message so far */
    return 0;
}

void srv_rx_refusal(int s, char *msg, size_t cap) {
    if (s == RX_OVER_MESSAGE) snprintf(msg, cap, "request: the message exceeds --max-message-mb %.4g", srv.o->max_message_mb);
    else if (s == RX_OVER_INPUT)
        snprintf(msg, cap, "server: too much request data buffered from all clients (--max-input-mb %.4g); try again", srv.o->max_input_mb);
    else snprintf(msg, cap, "server: out of memory");
}

void srv_rx_free(srv_rx *r) {
    ma_budget_give(&srv.budget[B_INPUT], r->cap);
    free(r->p);
    memset(r, 0, sizeof *r);
}

uint8_t *srv_rx_take(srv_rx *r, size_t *len, size_t *cap) {
    uint8_t *p = r->p;
    *len = r->len;
    *cap = r->cap;
    ma_budget_give(&srv.budget[B_INPUT], r->cap); /* srv_job_new takes it into B_QUEUED */
    memset(r, 0, sizeof *r);
    return p;
}

/* ------------------------------------------------------------------------------ the loop */

static void dispatch_done(void) {
    for (job *j = srv_take_done(), *n; j; j = n) {
        n = j->next;
        if (!j->proto) {
            srv_http_job_done(j);
            continue;
        }
        ma_conn *c = srv_conn_find(j->conn_id);
        if (c) c->type->on_job(c, j);
        else {
            srv_account(j->proto, j->status ? srv_job_reason(j) : -1, j->t_recv, j);
            srv_log_line(j->peer, j->proto == 2 ? "grpc" : "ws", j->bytes_in, 0, j,
                         j->status ? j->log : "ok (client gone before the reply)");
        }
        srv_job_free(j);
    }
}

static void loop_once(int timeout_ms) {
    int n_conns = 0;
    for (ma_conn *c = srv.conns; c; c = c->next) n_conns++;
    struct pollfd *pf = calloc((size_t)n_conns + 3, sizeof *pf);
    ma_conn **pc = calloc((size_t)n_conns + 3, sizeof *pc);
    if (!pf || !pc) {
        free(pf);
        free(pc);
        usleep(10000);
        return;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(srv.mhd, MHD_DAEMON_INFO_EPOLL_FD);
    int n = 0;
    pf[n++] = (struct pollfd){srv.wake[0], POLLIN, 0};
    pf[n++] = (struct pollfd){di ? di->epoll_fd : -1, POLLIN, 0};
    pf[n++] = (struct pollfd){srv.stopping || ma_now_ms() < srv.grpc_accept_after ? -1 : srv.grpc_fd, POLLIN, 0};
    for (ma_conn *c = srv.conns; c; c = c->next) {
        pc[n] = c;
        pf[n++] = (struct pollfd){c->fd, c->type->events(c), 0};
    }
    MHD_UNSIGNED_LONG_LONG mt;
    if (MHD_get_timeout(srv.mhd, &mt) == MHD_YES && mt < (MHD_UNSIGNED_LONG_LONG)timeout_ms) timeout_ms = (int)mt;
    const int r = poll(pf, (nfds_t)n, timeout_ms);
    if (r > 0 && pf[0].revents) {
        char b[64];
        while (read(srv.wake[0], b, sizeof b) > 0) {}
    }
    MHD_run(srv.mhd);
    if (r > 0 && pf[2].revents) srv_grpc_accept(srv.grpc_fd);
    for (int i = 3; r > 0 && i < n; i++)
        if (pf[i].revents) pc[i]->type->on_events(pc[i], pf[i].revents);
    free(pf);
    free(pc);
    dispatch_done();
    MHD_run(srv.mhd); /* the replies of connections just resumed */
    const double now = ma_now_ms();
    srv_http_tick(now);
    tl_http_expire(now);
    for (ma_conn **p = &srv.conns; *p;) {
        ma_conn *c = *p;
        c->type->tick(c, now);
        if (c->type->finished(c, now)) {
            *p = c->next;
            c->type->free(c);
        } else p = &c->next;
    }
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
        memcpy(srv.api_key, text + a, b - a);
        srv.api_key_len = b - a;
        srv.have_key = 1;
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
static int open_listener(const char *host, int port, int *bound) {
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
    *bound = port;
    char ip[INET6_ADDRSTRLEN] = "?";
    if (!getsockname(fd, (struct sockaddr *)&sa, &sl)) {
        const int v6 = sa.ss_family == AF_INET6;
        *bound = ntohs(v6 ? ((struct sockaddr_in6 *)&sa)->sin6_port : ((struct sockaddr_in *)&sa)->sin_port);
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
        const int n = snprintf(un.sun_path + 1, sizeof un.sun_path - 1, "molmoact-serve:%s:%d", ip, *bound);
        const int lk = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (lk >= 0 && bind(lk, (struct sockaddr *)&un, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n))) {
            const int be = errno;
            close(lk);
            if (be == EADDRINUSE) {
                port_in_use(host, port);
                close(fd);
                return -1;
            }
        } else if (lk >= 0) {
            if (srv.port_lock_fd < 0) srv.port_lock_fd = lk;
            else srv.grpc_lock_fd = lk;
        }
    }
    return fd;
}

static void budgets_init(const ma_serve_opts *o) {
    static const struct {
        const char *name, *option, *help;
    } B[B_N] = {
        [B_MESSAGE] = {"message", "--max-message-mb", "one request body or websocket message, as it arrives"},
        [B_INPUT] = {"input", "--max-input-mb", "every connection's request data being received, together"},
        [B_QUEUED] = {"queued", "--max-queued-mb", "the bodies of requests queued for or in inference, together"},
        [B_OUTPUT] = {"output", "--max-output-kb", "unsent replies per connection (reading stops beyond it)"},
    };
    for (int i = 0; i < B_N; i++) {
        srv.budget[i].name = B[i].name;
        srv.budget[i].option = B[i].option;
        srv.budget[i].help = B[i].help;
    }
    srv.budget[B_MESSAGE].limit = srv.max_bytes;
    srv.budget[B_INPUT].limit = (size_t)(o->max_input_mb * 1048576.0);
    srv.budget[B_QUEUED].limit = (size_t)(o->max_queued_mb * 1048576.0);
    srv.budget[B_OUTPUT].limit = srv.max_output;
}

int ma_serve(const ma_serve_opts *o) {
    memset(&srv, 0, sizeof srv);
    g_stop = 0;
    srv.o = o;
    srv.ops = o->engine_ops ? o->engine_ops : &MOLMOACT_ENGINE;
    srv.listen_fd = srv.port_lock_fd = srv.grpc_fd = srv.grpc_lock_fd = -1;
    srv.wake[0] = srv.wake[1] = -1;
    ma_hist_init(&srv.req_hist, &ma_request_buckets);
    for (int i = 0; i < C_N; i++) ma_hist_init(&srv.comp_hist[i], &ma_component_buckets);
    ma_hist_init(&srv.delay_hist, &ma_tick_buckets);
    srv_queue_start();
    /* the limit must leave room for a request: 1 KiB at least */
    if (!(o->max_message_mb >= 1.0 / 1024 && o->max_message_mb <= 4096)) {
        fprintf(stderr, "molmoact serve: --max-message-mb must be in [0.001, 4096]\n");
        return 1;
    }
    if (!(o->max_input_mb >= o->max_message_mb && o->max_input_mb <= 65536)) {
        fprintf(stderr, "molmoact serve: --max-input-mb must be at least --max-message-mb (%.4g) and at most 65536\n", o->max_message_mb);
        return 1;
    }
    if (!(o->max_queued_mb >= o->max_message_mb && o->max_queued_mb <= 65536)) {
        fprintf(stderr, "molmoact serve: --max-queued-mb must be at least --max-message-mb (%.4g) and at most 65536\n", o->max_message_mb);
        return 1;
    }
    if (o->max_output_kb < 16 || o->max_output_kb > 1048576) {
        fprintf(stderr, "molmoact serve: --max-output-kb must be in [16, 1048576]\n");
        return 1;
    }
    if (o->max_head_kb < 4 || o->max_head_kb > 1024) {
        fprintf(stderr, "molmoact serve: --max-head-kb must be in [4, 1024]\n");
        return 1;
    }
    if (o->port < 0 || o->port > 65535) {
        fprintf(stderr, "molmoact serve: --port must be in [0, 65535]\n");
        return 1;
    }
    if (o->grpc_port < -1 || o->grpc_port > 65535 || (o->grpc_port > 0 && o->grpc_port == o->port)) {
        fprintf(stderr, "molmoact serve: --grpc-port must be in [1, 65535] and differ from --port\n");
        return 1;
    }
    if (!(o->fps > 0 && o->fps <= 1000)) {
        fprintf(stderr, "molmoact serve: --fps must be in (0, 1000]\n");
        return 1;
    }
    if (!(o->lerobot_obs_timeout_s > 0 && o->lerobot_obs_timeout_s <= 3600) || !(o->lerobot_similarity_atol >= 0)) {
        fprintf(stderr, "molmoact serve: --lerobot-obs-timeout-s must be in (0, 3600] and --lerobot-similarity-atol at least 0\n");
        return 1;
    }
    if (o->max_sessions < 1 || o->max_sessions > 100000 || o->session_ttl_s < 1) {
        fprintf(stderr, "molmoact serve: --max-sessions must be in [1, 100000] and --session-ttl-s at least 1\n");
        return 1;
    }
    if (o->rtc.horizon < 0 || o->rtc.horizon > 4096 || !(o->rtc.beta >= 0 && o->rtc.beta <= 1e6) || o->rtc.schedule < 0 ||
        o->rtc.schedule > 3 || !(o->rtc.latency_percentile >= 0 && o->rtc.latency_percentile <= 100)) {
        fprintf(stderr,
                "molmoact serve: --rtc-horizon must be in [0, 4096], --rtc-beta in [0, 1e6], --rtc-latency-percentile in [0, 100]\n");
        return 1;
    }
    if (o->max_clients < 1 || o->max_clients > 100000) {
        fprintf(stderr, "molmoact serve: --max-clients must be in [1, 100000]\n");
        return 1;
    }
    srv.max_bytes = (size_t)(o->max_message_mb * 1048576.0);
    srv.max_output = (size_t)o->max_output_kb * 1024;
    budgets_init(o);
    if (o->have_seed) srv.rng = o->seed;
    else if (getrandom(&srv.rng, sizeof srv.rng, 0) != (ssize_t)sizeof srv.rng) srv.rng = (uint64_t)time(NULL) ^ (uint64_t)getpid() << 32;
    if (o->api_key_file && read_key(o->api_key_file)) return 1;
    /* the model's name: its directory's (the parent's for .../NAME/model), never the path */
    char full[PATH_MAX];
    if (!realpath(o->engine.model_dir, full)) snprintf(full, sizeof full, "%s", o->engine.model_dir);
    char *last = strrchr(full, '/');
    if (last && !strcmp(last + 1, "model") && last != full) {
        *last = '\0';
        last = strrchr(full, '/');
    }
    snprintf(srv.model_name, sizeof srv.model_name, "%s", last ? last + 1 : full);
    /* the address before the engine: a wrong --host fails in a moment, not after loading */
    srv.listen_fd = open_listener(o->host, o->port, &srv.bound_port);
    if (srv.listen_fd < 0) return 1;
    if (o->grpc_port) {
        srv.grpc_fd = open_listener(o->grpc_host ? o->grpc_host : o->host, o->grpc_port < 0 ? 0 : o->grpc_port, &srv.grpc_port);
        if (srv.grpc_fd < 0 || srv_grpc_init()) {
            close(srv.listen_fd);
            if (srv.grpc_fd >= 0) close(srv.grpc_fd);
            if (srv.port_lock_fd >= 0) close(srv.port_lock_fd);
            return 1;
        }
    }
    if (pipe2(srv.wake, O_NONBLOCK | O_CLOEXEC)) {
        fprintf(stderr, "molmoact serve: pipe: %s\n", strerror(errno));
        close(srv.listen_fd);
        if (srv.port_lock_fd >= 0) close(srv.port_lock_fd);
        return 1;
    }

    /* the engine next; the port opens (listen) only once every session is loaded */
    molmoact_options opt;
    opt = o->engine;
    molmoact_error err;
    int rc = 1, have_thread = 0;
    pthread_t th;
    if (srv.ops->open(&opt, &srv.engine, &err)) {
        fprintf(stderr, "molmoact serve: %s\n", err.message);
        goto out;
    }
    if (srv.ops->get_info(srv.engine, &srv.info, &err)) {
        fprintf(stderr, "molmoact serve: %s\n", err.message);
        goto out;
    }
    snprintf(srv.backend, sizeof srv.backend, "%s", o->engine_ops ? "stand-in" : "cpu");
    if (!o->engine_ops) { /* the backend and each component's weights, for the pages */
        char be[16] = "";
        if (molmoact_get_setting(srv.engine, "backend", be, sizeof be, &err)) {
            fprintf(stderr, "molmoact serve: %s\n", err.message);
            goto out;
        }
        if (be[0]) snprintf(srv.backend, sizeof srv.backend, "%s", be);
        char fr[16] = "0";
        if (molmoact_get_setting(srv.engine, "first_action_row", fr, sizeof fr, &err)) {
            fprintf(stderr, "molmoact serve: %s\n", err.message);
            goto out;
        }
        srv.first_row = atoi(fr);
        srv.n_components = molmoact_component_count();
        if (srv.n_components > (int)(sizeof srv.weights / sizeof srv.weights[0]))
            srv.n_components = (int)(sizeof srv.weights / sizeof srv.weights[0]);
        for (int i = 0; i < srv.n_components; i++) {
            srv.weights[i].struct_size = sizeof srv.weights[i];
            if (molmoact_get_component(srv.engine, i, &srv.weights[i], &err)) {
                fprintf(stderr, "molmoact serve: %s\n", err.message);
                goto out;
            }
        }
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (listen(srv.listen_fd, 511)) {
        if (errno == EADDRINUSE) port_in_use(o->host, o->port);
        else fprintf(stderr, "molmoact serve: cannot listen on %s port %d: %s\n", o->host, o->port, strerror(errno));
        goto out;
    }
    if (srv.grpc_fd >= 0 && listen(srv.grpc_fd, 511)) {
        fprintf(stderr, "molmoact serve: cannot listen on --grpc-port %d: %s\n", o->grpc_port, strerror(errno));
        goto out;
    }
    if (srv_http_start()) {
        fprintf(stderr, "molmoact serve: cannot start the HTTP server (libmicrohttpd)\n");
        goto out;
    }
    srv.listen_fd = -1; /* libmicrohttpd's from here: it closes it */
    srv.t_start = ma_now_ms();
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    srv.wall_start = (double)wall.tv_sec + (double)wall.tv_nsec / 1e9;
    if (srv_queue_thread(&th)) {
        fprintf(stderr, "molmoact serve: cannot start the inference thread\n");
        goto out;
    }
    have_thread = 1;
    fprintf(stderr, "{\"event\": \"listening\", \"host\": ");
    ma_json_write_string(stderr, o->host, strlen(o->host));
    fprintf(stderr, ", \"port\": %d, ", srv.bound_port);
    if (srv.grpc_fd >= 0) fprintf(stderr, "\"grpc_port\": %d, ", srv.grpc_port);
    fprintf(stderr, "\"model\": ");
    ma_json_write_string(stderr, srv.model_name, strlen(srv.model_name));
    fprintf(stderr, ", \"variant\": \"%s\", \"mode\": \"%s\"}\n", srv.info.variant, srv.info.inproc ? "inproc" : "resident");
    fflush(stderr);
    { /* and for a person at the terminal: where to point a client (the log above is for machines) */
        const int v6 = strchr(o->host, ':') != NULL;
        char hp[300];
        snprintf(hp, sizeof hp, "%s%s%s:%d", v6 ? "[" : "", o->host, v6 ? "]" : "", srv.bound_port);
        printf("molmoact serve: %s (%s, %s) on http://%s/ (status page; POST /act) and ws://%s (openpi's websocket)", srv.model_name,
               srv.info.variant, srv.info.inproc ? "inproc" : "resident", hp, hp);
        if (srv.grpc_fd >= 0) printf(", LeRobot's gRPC on port %d", srv.grpc_port);
        printf("; Ctrl-C stops\n");
        fflush(stdout);
    }
    if (o->on_listening) o->on_listening(srv.bound_port, o->arg);
    if (o->on_grpc_listening && srv.grpc_fd >= 0) o->on_grpc_listening(srv.grpc_port, o->arg);

    /* serve; on a signal: no new connections or requests; finish what is queued or running and
     * write every reply; then close every websocket with 1001 and every connection */
    double deadline = 0;
    for (;;) {
        loop_once(100);
        if (g_stop && !srv.stopping) {
            srv.stopping = 1;
            const MHD_socket l = MHD_quiesce_daemon(srv.mhd); /* no new connections */
            if (l != MHD_INVALID_SOCKET) close(l);
            srv.listen_fd = -1;
            if (srv.grpc_fd >= 0) close(srv.grpc_fd);
            srv.grpc_fd = -1;
            srv_log_event("draining", NULL, "a signal: finishing the queued requests");
        }
        if (!srv.stopping || !srv_queue_idle()) continue;
        if (!deadline) deadline = ma_now_ms() + 5000;
        srv_http_drain();
        for (ma_conn *c = srv.conns; c; c = c->next) c->type->drain(c);
        if ((!srv.conns && !srv_http_open()) || ma_now_ms() > deadline) break;
    }
    rc = 0;
out:
    while (srv.conns) {
        ma_conn *c = srv.conns;
        srv.conns = c->next;
        c->type->free(c);
    }
    if (have_thread) {
        pthread_mutex_lock(&srv.mu);
        srv.quit = 1;
        pthread_cond_signal(&srv.cv);
        pthread_mutex_unlock(&srv.mu);
        pthread_join(th, NULL);
        dispatch_done(); /* nothing is left; frees anything that is */
    }
    srv_http_stop();
    srv_grpc_stop();
    tl_http_free_all();
    if (srv.grpc_fd >= 0) close(srv.grpc_fd);
    if (srv.grpc_lock_fd >= 0) close(srv.grpc_lock_fd);
    srv.grpc_fd = srv.grpc_lock_fd = -1;
    if (srv.listen_fd >= 0) close(srv.listen_fd);
    srv.listen_fd = -1;
    if (srv.port_lock_fd >= 0) close(srv.port_lock_fd);
    srv.port_lock_fd = -1;
    if (srv.engine && srv.ops->close(&srv.engine) != MOLMOACT_OK) rc = 1;
    if (!rc) fprintf(stderr, "{\"event\": \"stopped\", \"served\": %ld, \"failed\": %ld}\n", srv.served, srv.failed);
    if (srv.wake[0] >= 0) close(srv.wake[0]);
    if (srv.wake[1] >= 0) close(srv.wake[1]);
    srv.wake[0] = srv.wake[1] = -1;
    pthread_mutex_destroy(&srv.mu);
    pthread_cond_destroy(&srv.cv);
    return rc;
}
