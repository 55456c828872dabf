/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer: the whole request path of `molmoact serve` — the real event loop, libmicrohttpd,
 * wslay, the gate, the budgets, the queue and the decoders — over loopback sockets, into a
 * stand-in engine that answers at once (server.h's ma_serve_engine). The server runs on a thread
 * of this process with small limits, so a few kilobytes of input reach every budget's edge:
 * --max-message-mb 1/16 (64 KiB), --max-input-mb 1/4, --max-queued-mb 1/8, --max-output-kb 16,
 * --max-head-kb 4, --max-clients 6, an API key.
 *
 * An input is a script for up to four connections, interleaved:
 *   byte 0: how many connections (1 + b % 4), opened at the start;
 *   then operations, each starting with a byte op, c = op & 3 the connection:
 *     op < 0x80           send: [len: 2 bytes LE][len bytes] (cut at the input's end);
 *     0x80..0xbf          repeat: [count: 3 bytes BE][byte], that byte count times (at most 4 MiB);
 *     0xc0..0xdf          read what the server sent c, for up to 20 ms;
 *     0xe0..0xef          close c (bit 2: with a reset) and open it again;
 *     0xf0..0xff          wait 5 ms (the server's turn).
 * After the script every connection half-closes and is read for at most 0.3 s, then closed. Then a
 * fresh connection must get GET /healthz answered: a server that crashed, hung or leaked its
 * slots fails there. Sanitizers (ASan, UBSan) watch both sides. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/server.h"

/* ------------------------------------------------------------------ the stand-in engine */

static molmoact_status fake_open(const molmoact_options *opt, molmoact **out, molmoact_error *err) {
    (void)opt;
    (void)err;
    *out = (molmoact *)malloc(1);
    return *out ? MOLMOACT_OK : MOLMOACT_ERR_NOMEM;
}

static molmoact_status fake_info(molmoact *e, molmoact_info *info, molmoact_error *err) {
    (void)e;
    (void)err;
    memset(info, 0, sizeof *info);
    snprintf(info->variant, sizeof info->variant, "grid");
    info->action_horizon = 10;
    info->action_dim = 7;
    info->max_action_dim = 32;
    info->n_steps = 10;
    info->state_dim = 8;
    info->flow_steps = 10;
    for (int i = 0; i < 3; i++) snprintf(info->precision[i], sizeof info->precision[i], "f32");
    snprintf(info->norm_tag, sizeof info->norm_tag, "libero");
    info->inproc = 1;
    return MOLMOACT_OK;
}

/* answers at once: actions from the state; a task starting with "fail" fails as a worker would */
static molmoact_status fake_infer(molmoact *e, const molmoact_observation *obs, molmoact_result *res, molmoact_error *err) {
    (void)e;
    memset(res, 0, sizeof *res);
    if (obs->task && !strncmp(obs->task, "fail", 4)) {
        snprintf(err->message, sizeof err->message, "worker vision (pid 1) died during the request (signal 9); it was restarted");
        return MOLMOACT_ERR_WORKER;
    }
    res->n_steps = 10;
    res->action_dim = 7;
    res->actions = calloc(70, sizeof(float));
    if (!res->actions) return MOLMOACT_ERR_NOMEM;
    for (int i = 0; i < 70; i++) res->actions[i] = obs->state ? obs->state[i % 8] : (float)i;
    return MOLMOACT_OK;
}

static molmoact_status fake_close(molmoact **e) {
    free(*e);
    *e = NULL;
    return MOLMOACT_OK;
}

static const ma_serve_engine FAKE = {fake_open, fake_info, fake_infer, fake_close};

/* ------------------------------------------------------------------ the server thread */

static volatile int g_port, g_grpc_port;
static ma_serve_opts g_opts;

static void on_listening(int port, void *arg) {
    (void)arg;
    __atomic_store_n(&g_port, port, __ATOMIC_SEQ_CST);
}

static void on_grpc_listening(int port, void *arg) {
    (void)arg;
    __atomic_store_n(&g_grpc_port, port, __ATOMIC_SEQ_CST);
}

static void *serve_thread(void *arg) {
    (void)arg;
    const int rc = ma_serve(&g_opts);
    fprintf(stderr, "fuzz_server: the server returned %d\n", rc);
    abort(); /* it never should while the fuzzer runs */
}

static void start_server(void) {
    static char keyfile[] = "/tmp/fuzz_server_keyXXXXXX";
    const int kf = mkstemp(keyfile);
    if (kf < 0 || write(kf, "k3y\n", 4) != 4) abort();
    close(kf);
    memset(&g_opts, 0, sizeof g_opts);
    molmoact_options_init(&g_opts.engine);
    g_opts.engine.model_dir = "fuzz-stand-in";
    g_opts.host = "127.0.0.1";
    g_opts.port = 0;
    g_opts.api_key_file = keyfile;
    g_opts.max_message_mb = 1.0 / 16;
    g_opts.max_input_mb = 1.0 / 4;
    g_opts.max_queued_mb = 1.0 / 8;
    g_opts.max_output_kb = 16;
    g_opts.max_head_kb = 4;
    g_opts.max_clients = 6;
    g_opts.recv_timeout_s = 1;
    g_opts.idle_timeout_s = 2;
    g_opts.have_seed = 1;
    g_opts.seed = 1;
    g_opts.engine_ops = &FAKE;
    g_opts.on_listening = on_listening;
    /* LeRobot's service on a port of its own (the gRPC build's connections go there), sessions */
    g_opts.grpc_port = -1;
    g_opts.on_grpc_listening = on_grpc_listening;
    g_opts.fps = 30;
    g_opts.lerobot_obs_timeout_s = 0.2;
    g_opts.max_sessions = 4;
    g_opts.session_ttl_s = 2;
    g_opts.rtc.enabled = 1;
    g_opts.rtc.horizon = 10;
    g_opts.rtc.beta = 10;
    g_opts.rtc.latency_percentile = 95;
    signal(SIGPIPE, SIG_IGN);
    pthread_t th;
    if (pthread_create(&th, NULL, serve_thread, NULL)) abort();
    pthread_detach(th);
    for (int i = 0; i < 2000 && !__atomic_load_n(&g_grpc_port, __ATOMIC_SEQ_CST); i++) usleep(5000);
    unlink(keyfile); /* read at the start */
    if (!g_port || !g_grpc_port) abort();
}

/* ------------------------------------------------------------------ the clients */

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* FUZZ_GRPC (fuzz_grpc): the script's connections go to --grpc-port (nghttp2, gRPC, the
 * restricted pickle reader, LeRobot's semantics, the sessions); the health check stays HTTP */
#ifdef FUZZ_GRPC
#define SCRIPT_PORT g_grpc_port
#else
#define SCRIPT_PORT g_port
#endif

static int dial_port(int port) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    return fd;
}

static int dial(void) { return dial_port(SCRIPT_PORT); }

/* read and drop what is there, for up to ms; returns -1 once the server closed it */
static int drain(int fd, int ms) {
    char b[65536];
    const double end = now_ms() + ms;
    for (;;) {
        const ssize_t n = recv(fd, b, sizeof b, MSG_DONTWAIT);
        if (n > 0) continue;
        if (n == 0 || (errno != EAGAIN && errno != EINTR)) return -1;
        const double left = end - now_ms();
        if (left <= 0) return 0;
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, (int)left) <= 0) return 0;
    }
}

/* send everything, reading meanwhile (a server that stops reading until we read is not a
 * deadlock); gives up after 1.5 s without progress or when the server closed */
static void send_all(int fd, const uint8_t *p, size_t n) {
    double last = now_ms();
    while (n) {
        const ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            last = now_ms();
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EINTR) return;
        if (drain(fd, 2) < 0 || now_ms() - last > 1500) return;
    }
}

static void reopen(int *fd, int reset) {
    if (*fd >= 0) {
        if (reset) {
            struct linger l = {1, 0};
            setsockopt(*fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
        }
        close(*fd);
    }
    *fd = dial();
}

/* GET /healthz on a fresh connection, answered within 5 s (connections the script left behind
 * may still hold slots for a moment: it dials again until then) */
static int health_ok(void) {
    const double end = now_ms() + 5000;
    while (now_ms() < end) {
        const int fd = dial_port(g_port);
        if (fd < 0) return 0;
        static const char req[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
        send_all(fd, (const uint8_t *)req, sizeof req - 1);
        char b[512];
        size_t got = 0;
        while (got < sizeof b - 1 && now_ms() < end) {
            struct pollfd p = {fd, POLLIN, 0};
            if (poll(&p, 1, 50) <= 0) continue;
            const ssize_t n = recv(fd, b + got, sizeof b - 1 - got, 0);
            if (n <= 0) break;
            got += (size_t)n;
            b[got] = '\0';
            if (strstr(b, "\r\n\r\nOK")) break;
        }
        close(fd);
        b[got] = '\0';
        if (strstr(b, "200 OK") && strstr(b, "\r\n\r\nOK")) return 1;
        usleep(20000);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    if (!g_port) start_server();
    if (!n) return 0;
    int fds[4] = {-1, -1, -1, -1};
    const int nc = 1 + d[0] % 4;
    for (int i = 0; i < nc; i++) fds[i] = dial();
    uint8_t *rep = NULL;
    for (size_t at = 1; at < n;) {
        const uint8_t op = d[at++];
        const int c = (op & 3) % nc;
        if (op < 0x80) {
            size_t len = at + 2 <= n ? (size_t)(d[at] | d[at + 1] << 8) : 0;
            at += 2;
            if (at > n) break;
            if (len > n - at) len = n - at;
            if (fds[c] >= 0) send_all(fds[c], d + at, len);
            at += len;
        } else if (op < 0xc0) {
            if (at + 4 > n) break;
            size_t count = (size_t)d[at] << 16 | (size_t)d[at + 1] << 8 | d[at + 2];
            const uint8_t byte = d[at + 3];
            at += 4;
            count *= 1 + (op >> 2 & 15) / 4; /* up to 4 x 16 Mi - 1: capped below */
            if (count > (4u << 20)) count = 4u << 20;
            uint8_t *r = realloc(rep, count ? count : 1);
            if (!r) break;
            rep = r;
            memset(rep, byte, count);
            if (fds[c] >= 0) send_all(fds[c], rep, count);
        } else if (op < 0xe0) {
            if (fds[c] >= 0) drain(fds[c], 20);
        } else if (op < 0xf0) reopen(&fds[c], op & 4);
        else usleep(5000);
    }
    free(rep);
    for (int i = 0; i < nc; i++)
        if (fds[i] >= 0) shutdown(fds[i], SHUT_WR);
    for (int i = 0; i < nc; i++)
        if (fds[i] >= 0) {
            drain(fds[i], 300);
            close(fds[i]);
        }
    if (!health_ok()) {
        fprintf(stderr, "fuzz_server: GET /healthz was not answered after this input\n");
        abort();
    }
    return 0;
}
