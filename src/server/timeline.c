/* SPDX-License-Identifier: Apache-2.0 */
/* Per-session action timelines (internal.h, issue 39). A session is a LeRobot gRPC client (its
 * connection), a websocket connection, or an HTTP session_id. It keeps the last chunk it was sent
 * in the model's normalised space (the trajectory's executed rows), the control tick its row 0
 * stands for, and the latencies of its recent requests. From them:
 *
 *  - what is left of that chunk when the next observation comes: the client says how many rows it
 *    executed (LeRobot: its observation's timestep, the last executed action's; websocket and
 *    HTTP: the request's "executed"), never guessed from wall time;
 *  - the inference delay d in control ticks, predicted from a percentile of the session's recent
 *    latencies at its control rate (LeRobot's RTC uses the delay the same way:
 *    policies/rtc/action_queue.py, latency_tracker.py, lerobot 7427f318), and after the reply
 *    the delay it really took, logged and exported as the misprediction.
 *
 * Memory: a session holds at most one chunk (horizon x max_action_dim floats) and TL_LAT
 * latencies; HTTP sessions are at most --max-sessions, the least recently used one evicted, and
 * expire after --session-ttl-s. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/util.h"
#include "server/internal.h"

void tl_init(ma_timeline *t, const char *name) {
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->last_used = ma_now_ms();
}

void tl_reset(ma_timeline *t) {
    free(t->rows);
    char name[sizeof t->name];
    memcpy(name, t->name, sizeof name);
    const uint64_t n_req = t->requests;
    tl_init(t, name);
    t->requests = n_req;
}

void tl_free(ma_timeline *t) {
    free(t->rows);
    t->rows = NULL;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double tl_latency_percentile(const ma_timeline *t, double q) {
    if (!t->n_lat) return 0;
    double v[TL_LAT];
    memcpy(v, t->lat, (size_t)t->n_lat * sizeof v[0]);
    qsort(v, (size_t)t->n_lat, sizeof v[0], cmp_double);
    /* linear interpolation between closest ranks (numpy.quantile's default, as LeRobot's
     * LatencyTracker.percentile uses it) */
    const double pos = q / 100.0 * (t->n_lat - 1);
    const int lo = (int)floor(pos), hi = lo + 1 < t->n_lat ? lo + 1 : lo;
    return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

int tl_ticks(double ms, double fps) {
    if (!(ms > 0) || !(fps > 0)) return 0;
    const double ticks = ceil(ms * fps / 1000.0 - 1e-9);
    return ticks > 1e6 ? 1000000 : (int)ticks;
}

int tl_predict_delay(const ma_timeline *t, const ma_rtc_opts *o, double fps) {
    /* no history yet: nothing is known; the first request of a session runs unguided by delay
     * (d = 0 ticks beyond the base) and its latency starts the history */
    return tl_ticks(tl_latency_percentile(t, o->latency_percentile), fps);
}

int tl_store(ma_timeline *t, const float *trajectory, int horizon, int max_dim, int first, int n, int dim, int64_t step0) {
    if (n <= 0 || dim <= 0 || dim > max_dim || first < 0 || first + n > horizon) return -1;
    float *r = malloc((size_t)n * (size_t)dim * sizeof *r);
    if (!r) return -1;
    for (int i = 0; i < n; i++) memcpy(r + (size_t)i * dim, trajectory + (size_t)(first + i) * max_dim, (size_t)dim * sizeof *r);
    free(t->rows);
    t->rows = r;
    t->n = n;
    t->dim = dim;
    t->step0 = step0;
    t->t_sent = ma_now_ms();
    return 0;
}

void tl_observe_latency(ma_timeline *t, double ms) {
    t->lat[t->lat_at] = ms;
    t->lat_at = (t->lat_at + 1) % TL_LAT;
    if (t->n_lat < TL_LAT) t->n_lat++;
    t->last_ms = ms;
    t->requests++;
}

/* ------------------------------------------------------------------------------ HTTP sessions */

/* HTTP sessions are found from the loop (a query's or header's session_id) and from the
 * inference thread (a body's, known once decoded): the list and those timelines under tl_mu */
static ma_timeline *http_sessions;
static int n_http_sessions;
static pthread_mutex_t tl_mu = PTHREAD_MUTEX_INITIALIZER;

static void session_unlink(ma_timeline *s) {
    for (ma_timeline **p = &http_sessions; *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            n_http_sessions--;
            tl_free(s);
            free(s);
            return;
        }
}

void tl_http_expire(double now) {
    const double ttl = srv.o->session_ttl_s * 1e3;
    pthread_mutex_lock(&tl_mu);
    for (ma_timeline *s = http_sessions, *n; s; s = n) {
        n = s->next;
        if (!s->busy && now - s->last_used > ttl) session_unlink(s);
    }
    pthread_mutex_unlock(&tl_mu);
}

static ma_timeline *http_session(const char *id, int create) {
    for (ma_timeline *s = http_sessions; s; s = s->next)
        if (!strcmp(s->name + 5, id) && !s->doomed) { /* "http:" + id */
            s->last_used = ma_now_ms();
            return s;
        }
    if (!create) return NULL;
    if (n_http_sessions >= srv.o->max_sessions) { /* the least recently used idle one goes */
        ma_timeline *old = NULL;
        for (ma_timeline *s = http_sessions; s; s = s->next)
            if (!s->busy && (!old || s->last_used < old->last_used)) old = s;
        if (!old) return NULL;
        srv_log_event("session evicted", NULL, old->name);
        session_unlink(old);
    }
    ma_timeline *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    char name[80];
    snprintf(name, sizeof name, "http:%s", id);
    tl_init(s, name);
    s->next = http_sessions;
    http_sessions = s;
    n_http_sessions++;
    return s;
}

void tl_http_free_all(void) {
    pthread_mutex_lock(&tl_mu);
    while (http_sessions) session_unlink(http_sessions);
    pthread_mutex_unlock(&tl_mu);
}

/* POST /reset: session `id` (NULL: every one) forgotten, its name added to `removed` (a cJSON
 * array); a session whose request is running is forgotten when it ends */
void tl_http_remove(const char *id, struct cJSON *removed) {
    pthread_mutex_lock(&tl_mu);
    for (ma_timeline *s = http_sessions, *n; s; s = n) {
        n = s->next;
        if (id && strcmp(s->name + 5, id)) continue;
        cJSON_AddItemToArray(removed, cJSON_CreateString(s->name + 5));
        if (s->busy) s->doomed = 1;
        else session_unlink(s);
    }
    pthread_mutex_unlock(&tl_mu);
}

/* a request of HTTP session `id` is queued (loop) or decoded (inference thread): the session's
 * last chunk goes with it, unless another request of the session is running */
void tl_http_begin(const char *id, job *j) {
    pthread_mutex_lock(&tl_mu);
    ma_timeline *t = http_session(id, 1);
    if (t && !t->busy && !tl_snapshot(t, j, srv.o->fps, 0)) {
        snprintf(j->session, sizeof j->session, "%s", id);
        j->http_tl = t;
    }
    pthread_mutex_unlock(&tl_mu);
}

void tl_http_end(job *j, int delivered) {
    pthread_mutex_lock(&tl_mu);
    ma_timeline *t = j->http_tl; /* held busy by this job: never freed meanwhile (reset marks it doomed) */
    if (t && delivered) tl_end(t, j, 0);
    else if (t) t->busy = 0;
    if (t && t->doomed) session_unlink(t);
    pthread_mutex_unlock(&tl_mu);
}

/* every session for the pages: HTTP ones here, the connections' through their type */
void tl_for_each(void (*fn)(const ma_timeline *t, void *arg), void *arg) {
    pthread_mutex_lock(&tl_mu);
    for (ma_timeline *s = http_sessions; s; s = s->next) fn(s, arg);
    pthread_mutex_unlock(&tl_mu);
    for (ma_conn *c = srv.conns; c; c = c->next)
        if (c->timeline) fn(c->timeline, arg);
}

/* ------------------------------------------------------------------------------ one request */

/* After the reply is sent: the chunk becomes the session's (rows from the engine's first
 * executed row, labelled from step0), the latency joins the history, the delay it really took
 * is compared with the one predicted. */
void tl_end(ma_timeline *t, job *j, int64_t step0) {
    t->busy = 0;
    if (j->rtc_guided) {
        srv.rtc_guided++;
        /* RTC cannot help once the delay reaches the horizon (clipped to the rows left): every row
         * it could guide runs before the chunk arrives; said, not hidden */
        const molmoact_observation *ob = &j->req.obs;
        const int hh = ob->rtc_horizon < ob->rtc_prefix_rows ? ob->rtc_horizon : ob->rtc_prefix_rows;
        if (j->rtc_d >= hh) {
            srv.rtc_beyond++;
            char m[200];
            snprintf(m, sizeof m, "the predicted delay %d ticks reaches the execution horizon %d: guidance cannot help this chunk",
                     j->rtc_d, hh);
            srv_log_event("rtc", t->name, m);
        }
    }
    if (j->status || !j->res.trajectory) return;
    const double ms = ma_now_ms() - j->t_recv;
    tl_observe_latency(t, ms);
    tl_store(t, j->res.trajectory, j->res.horizon, j->res.max_action_dim, srv.first_row, j->res.n_steps, j->res.action_dim, step0);
    t->last_d_actual = j->tl_base_d + tl_ticks(ms, j->tl_fps);
    t->last_d = j->rtc_guided ? j->rtc_d : -1;
    ma_hist_observe(&srv.delay_hist, t->last_d_actual);
    if (j->rtc_guided && t->last_d_actual > j->rtc_d) srv.rtc_mispredicted++;
}

/* Before the request runs: the session's chunk goes with it (copied: the inference thread reads
 * it while the loop goes on), with the delay predicted now. base_d: 1 on LeRobot's protocol (its
 * row 0 is labelled with the step already executed), 0 for openpi / AllenAI chunks (row 0 is the
 * first to run after the observation). */
int tl_snapshot(ma_timeline *t, job *j, double fps, int base_d) {
    t->busy = 1;
    t->last_used = ma_now_ms();
    t->fps = fps;
    j->tl_fps = fps;
    j->tl_base_d = base_d;
    j->tl_rtc_default = srv.o->rtc.enabled;
    if (!t->rows) return 0;
    const size_t n = (size_t)t->n * (size_t)t->dim;
    if (!(j->tl_rows = malloc(n * sizeof(float)))) {
        t->busy = 0;
        return -1;
    }
    memcpy(j->tl_rows, t->rows, n * sizeof(float));
    j->tl_n = t->n;
    j->tl_dim = t->dim;
    j->tl_ticks = tl_predict_delay(t, &srv.o->rtc, fps);
    return 0;
}

/* the request decoded (the inference thread; the loop for LeRobot's, decoded there): with
 * "executed" given and guidance asked (or the server's --rtc), the snapshot's rows from
 * "executed" on guide the new chunk, d = base_d + the predicted ticks */
void tl_apply(job *j) {
    const int e = j->req.executed, on = j->req.rtc >= 0 ? j->req.rtc : j->tl_rtc_default;
    if (!on || e < 0 || e >= j->tl_n) return;
    const ma_rtc_opts *o = &srv.o->rtc;
    molmoact_observation *ob = &j->req.obs;
    ob->rtc_prefix = j->tl_rows + (size_t)e * (size_t)j->tl_dim;
    ob->rtc_prefix_rows = j->tl_n - e;
    ob->rtc_prefix_dim = j->tl_dim;
    ob->rtc_delay = j->tl_base_d + j->tl_ticks;
    ob->rtc_horizon = o->horizon > 0 ? o->horizon : 10;
    ob->rtc_beta = o->beta;
    ob->rtc_schedule = o->schedule;
    j->rtc_d = ob->rtc_delay;
    j->rtc_guided = 1;
}
