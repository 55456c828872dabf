/* SPDX-License-Identifier: Apache-2.0 */
/* The inference queue (internal.h): one thread takes jobs FIFO, decodes them (wire.c) and runs
 * molmoact_infer on the one resident engine; finished jobs go back to the loop, which it wakes. */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "server/internal.h"

void srv_queue_start(void) {
    srv.queue_tail = &srv.queue;
    pthread_mutex_init(&srv.mu, NULL);
    pthread_cond_init(&srv.cv, NULL);
}

/* loop thread only (the budgets are the loop's) */
void srv_job_free(job *j) {
    ma_budget_give(&srv.budget[B_QUEUED], j->body_held);
    free(j->body);
    ma_wire_request_free(&j->req);
    molmoact_result_free(&j->res);
    free(j->tl_rows);
    free(j);
}

job *srv_job_new(srv_rx *rx, uint64_t conn_id, int proto, int json, const char *peer, double t_recv, char *why, size_t why_cap) {
    size_t len, held;
    uint8_t *body = srv_rx_take(rx, &len, &held);
    if (ma_budget_take(&srv.budget[B_QUEUED], held)) {
        snprintf(why, why_cap, "server: too many request bytes queued (--max-queued-mb %.4g); try again", srv.o->max_queued_mb);
        free(body);
        return NULL;
    }
    job *j = calloc(1, sizeof *j);
    if (!j) {
        ma_budget_give(&srv.budget[B_QUEUED], held);
        snprintf(why, why_cap, "server: out of memory");
        free(body);
        return NULL;
    }
    j->conn_id = conn_id;
    j->proto = proto;
    j->json = json;
    j->body = body ? body : calloc(1, 1);
    j->bytes_in = len;
    j->body_held = held;
    j->t_recv = t_recv;
    snprintf(j->peer, sizeof j->peer, "%s", peer);
    return j;
}

int srv_job_http_code(const job *j) {
    return !j->decoded                                                         ? 400
           : j->status == MOLMOACT_ERR_WORKER                                  ? 503
           : (j->status == MOLMOACT_ERR_NOMEM || j->status == MOLMOACT_ERR_IO) ? 500
                                                                               : 400;
}

int srv_job_reason(const job *j) {
    const int code = srv_job_http_code(j);
    return code == 503 ? F_WORKER : code == 500 ? F_INTERNAL : F_BAD_REQUEST;
}

/* splitmix64 over the server's state: one seed per request that brings neither noise nor seed */
static uint64_t next_seed(void) {
    uint64_t z = (srv.rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* decoding (JSON, msgpack, base64, PNG/JPEG, the 180-degree flip) runs here, never on the
 * network loop: a large request delays the queue behind it, not health checks or pings */
static void run_job(job *j) {
    j->t_start = ma_now_ms();
    ma_error e = {0};
    const ma_wire_model wm = {srv.info.action_horizon, srv.info.max_action_dim, srv.info.state_dim, srv.info.n_steps};
    const ma_status s = j->predecoded ? MA_OK
                        : j->json     ? ma_wire_decode_json((const char *)j->body, j->bytes_in, srv.o->flip180, &wm, &j->req, &e)
                                      : ma_wire_decode_msgpack(j->body, j->bytes_in, srv.o->flip180, &wm, &j->req, &e);
    free(j->body);
    j->body = NULL;
    if (s) {
        j->status = MOLMOACT_ERR_ARG;
        snprintf(j->msg, sizeof j->msg, "%s", e.msg); /* wire.c names the client's keys, nothing else */
        srv_printable(j->msg);
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
        /* an HTTP body's session_id (no query or header named one): its timeline now */
        if (!j->proto && !j->session[0] && j->req.session_id[0]) tl_http_begin(j->req.session_id, j);
        if (!j->predecoded && (j->tl_rows || j->session[0])) tl_apply(j); /* LeRobot's: applied on the loop */
        molmoact_error err;
        j->t_infer = j->t_decoded = ma_now_ms();
        j->status = srv.ops->infer(srv.engine, &j->req.obs, &j->res, &err);
        j->t_infer = ma_now_ms() - j->t_infer;
        /* n_action_steps: the first steps of the chunk */
        if (!j->status && j->req.n_action_steps > 0 && j->req.n_action_steps < j->res.n_steps) j->res.n_steps = j->req.n_action_steps;
        if (j->status) {
            srv_client_error(j->status, err.message, j->msg, sizeof j->msg);
            snprintf(j->log, sizeof j->log, "%s", err.message);
        }
    }
    /* a large request's parse tree and frames are gone: give their pages back */
    if (j->bytes_in > (4u << 20)) malloc_trim(0);
    j->t_done = ma_now_ms();
}

static void *infer_thread(void *arg) {
    (void)arg;
    pthread_mutex_lock(&srv.mu);
    for (;;) {
        while (!srv.queue && !srv.quit) pthread_cond_wait(&srv.cv, &srv.mu);
        if (!srv.queue) break;
        job *j = srv.queue;
        srv.queue = j->next;
        if (!srv.queue) srv.queue_tail = &srv.queue;
        srv.n_queued--;
        srv.running = 1;
        pthread_mutex_unlock(&srv.mu);
        run_job(j);
        pthread_mutex_lock(&srv.mu);
        j->next = srv.done;
        srv.done = j;
        srv.running = 0;
        srv_wake();
    }
    pthread_mutex_unlock(&srv.mu);
    return NULL;
}

void srv_enqueue(job *j) {
    pthread_mutex_lock(&srv.mu);
    j->next = NULL;
    *srv.queue_tail = j;
    srv.queue_tail = &j->next;
    srv.n_queued++;
    pthread_cond_signal(&srv.cv);
    pthread_mutex_unlock(&srv.mu);
}


int srv_queue_thread(pthread_t *th) { return pthread_create(th, NULL, infer_thread, NULL); }

job *srv_take_done(void) {
    pthread_mutex_lock(&srv.mu);
    job *d = srv.done;
    srv.done = NULL;
    pthread_mutex_unlock(&srv.mu);
    job *rev = NULL; /* oldest first */
    while (d) {
        job *n = d->next;
        d->next = rev;
        rev = d;
        d = n;
    }
    return rev;
}

int srv_queue_idle(void) {
    pthread_mutex_lock(&srv.mu);
    const int idle = !srv.queue && !srv.running && !srv.done;
    pthread_mutex_unlock(&srv.mu);
    return idle;
}
