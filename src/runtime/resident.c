/* SPDX-License-Identifier: Apache-2.0 */
#define _GNU_SOURCE /* memfd_create */
#include "runtime/resident.h"
#include "core/progress.h"
#include "core/util.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* ------------------------------------------------------------------------------ wire format */

#define WIRE_MAGIC 0x4d414354u
enum { OP_READY = 1, OP_RUN, OP_REPLY, OP_NEED, OP_ERROR, OP_QUIT, OP_SHM };

/* the start message: the first packet on a worker's socket, this prefix and the engine's settings
 * (ma_settings_encode). The worker's OP_READY answers with what it applied and a hash of the
 * packet, which the orchestrator checks. */
#define START_PREFIX "molmoact-settings 1\n"
#define START_MAX (64 * 1024)

/* FNV-1a, 64 bits: the start message's echo */
static uint64_t fnv64(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 1099511628211ULL;
    return h;
}

typedef struct {
    uint32_t dtype, ndim;
    int64_t shape[MA_MAX_DIMS];
    uint64_t off, nbytes;
} wire_tensor;

typedef struct {
    uint32_t magic, op;
    int32_t which, debug, n, status;
    uint32_t kept; /* OP_RUN: inputs left in place by the previous request, not copied again */
    uint64_t need, shm_size;
    double compute_ms;
    wire_tensor t[MA_SESSION_MAX_IO];
    char msg[1024];
} wire_msg;


static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static int send_msg(int fd, const wire_msg *m, int pass_fd) {
    struct iovec iov = {(void *)m, sizeof *m};
    struct msghdr h;
    memset(&h, 0, sizeof h);
    h.msg_iov = &iov;
    h.msg_iovlen = 1;
    char ctl[CMSG_SPACE(sizeof(int))];
    if (pass_fd >= 0) {
        memset(ctl, 0, sizeof ctl);
        h.msg_control = ctl;
        h.msg_controllen = sizeof ctl;
        struct cmsghdr *c = CMSG_FIRSTHDR(&h);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
    }
    ssize_t n;
    do n = sendmsg(fd, &h, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n == (ssize_t)sizeof *m ? 0 : -1;
}

/* 1 message, 0 peer closed, -1 error; *got_fd receives a passed descriptor (or -1) */
static int recv_msg(int fd, wire_msg *m, int *got_fd) {
    struct iovec iov = {m, sizeof *m};
    struct msghdr h;
    memset(&h, 0, sizeof h);
    char ctl[CMSG_SPACE(sizeof(int))];
    h.msg_iov = &iov;
    h.msg_iovlen = 1;
    h.msg_control = ctl;
    h.msg_controllen = sizeof ctl;
    if (got_fd) *got_fd = -1;
    ssize_t n;
    do n = recvmsg(fd, &h, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (n == 0) return 0;
    if (n < 0) return errno == ECONNRESET ? 0 : -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&h); c; c = CMSG_NXTHDR(&h, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            int f;
            memcpy(&f, CMSG_DATA(c), sizeof f);
            if (got_fd && *got_fd < 0) *got_fd = f;
            else close(f);
        }
    if (n != (ssize_t)sizeof *m || m->magic != WIRE_MAGIC) return -1;
    m->msg[sizeof m->msg - 1] = '\0';
    return 1;
}

/* ------------------------------------------------------------------------------ orchestrator */

/* nothing the worker holds may be taken as sent (a new worker, new memory, a failed request) */
static void forget_sent(ma_worker *w) {
    memset(w->sent, 0, sizeof w->sent);
    memset(w->sent_bytes, 0, sizeof w->sent_bytes);
    memset(w->sent_off, 0, sizeof w->sent_off);
}

static void shm_release(ma_worker *w) {
    forget_sent(w);
    if (w->shm) munmap(w->shm, w->shm_size);
    if (w->shm_fd >= 0) close(w->shm_fd);
    w->shm = NULL;
    w->shm_fd = -1;
    w->shm_size = 0;
}

/* reap a worker (already dead or killed); describe how it ended */
static void reap(ma_worker *w, char *how, size_t cap) {
    if (w->pid <= 0) {
        snprintf(how, cap, "not running");
        return;
    }
    int st = 0;
    pid_t p;
    do p = waitpid(w->pid, &st, 0);
    while (p < 0 && errno == EINTR);
    if (p == w->pid && WIFSIGNALED(st)) snprintf(how, cap, "killed by signal %d", WTERMSIG(st));
    else if (p == w->pid && WIFEXITED(st)) snprintf(how, cap, "exited with status %d", WEXITSTATUS(st));
    else snprintf(how, cap, "ended");
    w->pid = 0;
}

static void drop_worker(ma_worker *w, char *how, size_t cap) {
    if (w->pid > 0) kill(w->pid, SIGKILL);
    reap(w, how, cap);
    if (w->sock >= 0) close(w->sock);
    w->sock = -1;
    shm_release(w);
}

static int wait_readable(int fd, int timeout_ms) {
    struct pollfd p = {fd, POLLIN, 0};
    int n;
    do n = poll(&p, 1, timeout_ms);
    while (n < 0 && errno == EINTR);
    return n;
}

/* the spawner thread: forks and execs a worker on request (see resident.h) */
struct ma_spawner {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int have_req, quit;
    const char *exe;
    char *const *argv;
    char *const *envp;
    int keep_fd;
    pid_t pid;
    int err_no;
};

static void *spawner_main(void *arg) {
    ma_spawner *sp = arg;
    pthread_mutex_lock(&sp->mu);
    for (;;) {
        while (!sp->have_req && !sp->quit) pthread_cond_wait(&sp->cv, &sp->mu);
        if (sp->quit) break;
        pid_t pid = fork();
        if (pid == 0) { /* only async-signal-safe calls until exec */
            fcntl(sp->keep_fd, F_SETFD, 0);
#ifdef __linux__
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* a worker never outlives its orchestrator (this thread) */
#endif
            /* stopping is the orchestrator's business: Ctrl-C in a terminal or systemd's stop
             * signals the whole process group, and a worker that died of it would fail the
             * request in flight. Ignored dispositions survive exec; a worker ends when told to
             * or when its orchestrator dies (above). */
            struct sigaction ign;
            memset(&ign, 0, sizeof ign);
            ign.sa_handler = SIG_IGN;
            sigaction(SIGINT, &ign, NULL);
            sigaction(SIGTERM, &ign, NULL);
            sigaction(SIGHUP, &ign, NULL);
            execve(sp->exe, sp->argv, sp->envp);
            _exit(127);
        }
        sp->pid = pid;
        sp->err_no = pid < 0 ? errno : 0;
        sp->have_req = 0;
        pthread_cond_broadcast(&sp->cv);
    }
    pthread_mutex_unlock(&sp->mu);
    return NULL;
}

static ma_spawner *spawner_start(void) {
    ma_spawner *sp = calloc(1, sizeof *sp);
    if (!sp) return NULL;
    pthread_mutex_init(&sp->mu, NULL);
    pthread_cond_init(&sp->cv, NULL);
    if (pthread_create(&sp->th, NULL, spawner_main, sp) != 0) {
        pthread_mutex_destroy(&sp->mu);
        pthread_cond_destroy(&sp->cv);
        free(sp);
        return NULL;
    }
    return sp;
}

static void spawner_stop(ma_spawner *sp) {
    if (!sp) return;
    pthread_mutex_lock(&sp->mu);
    sp->quit = 1;
    pthread_cond_broadcast(&sp->cv);
    pthread_mutex_unlock(&sp->mu);
    pthread_join(sp->th, NULL);
    pthread_mutex_destroy(&sp->mu);
    pthread_cond_destroy(&sp->cv);
    free(sp);
}

/* fork + exec through the spawner; -1 with errno set on failure */
static pid_t spawner_run(ma_spawner *sp, const char *exe, char *const *argv, char *const *envp, int keep_fd) {
    pthread_mutex_lock(&sp->mu);
    while (sp->have_req) pthread_cond_wait(&sp->cv, &sp->mu);
    sp->exe = exe;
    sp->argv = argv;
    sp->envp = envp;
    sp->keep_fd = keep_fd;
    sp->have_req = 1;
    pthread_cond_broadcast(&sp->cv);
    while (sp->have_req) pthread_cond_wait(&sp->cv, &sp->mu);
    const pid_t pid = sp->pid;
    const int e = sp->err_no;
    pthread_mutex_unlock(&sp->mu);
    if (pid < 0) errno = e;
    return pid;
}

static ma_status spawn(ma_resident *r, int wi, ma_error *err) {
    ma_worker *w = &r->w[wi];
    /* the program first: an exec failure in the child is only an exit status 127 */
    if (access(r->exe, X_OK) != 0)
        return ma_fail(err, MA_ERR_IO, "worker %s: the worker program %s cannot be run: %s", w->name, r->exe, strerror(errno));
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        return ma_fail(err, MA_ERR_IO, "worker %s: socketpair: %s", w->name, strerror(errno));
    char fdarg[16], parts[16], delay[16];
    snprintf(fdarg, sizeof fdarg, "%d", sv[1]);
    snprintf(parts, sizeof parts, "%u", w->parts);
    snprintf(delay, sizeof delay, "%d", r->opts.worker_delay_ms);
    /* argv[0] names the worker in ps (molmoact:vision, ...); the worker sets its thread name too */
    char argv0[32];
    snprintf(argv0, sizeof argv0, "molmoact:%s", w->name);
    char *argv[] = {argv0, "__worker", fdarg, r->dir, r->tag, parts, delay, NULL};
    pid_t pid = spawner_run(r->spawner, r->exe, argv, r->envp, sv[1]);
    if (pid < 0) {
        const int e = errno;
        close(sv[0]);
        close(sv[1]);
        return ma_fail(err, MA_ERR_IO, "worker %s: fork: %s", w->name, strerror(e));
    }
    close(sv[1]);
    w->pid = pid;
    w->sock = sv[0];
    w->shm_fd = -1;
    wire_msg m;
    char how[64];
    /* its settings: the start message (a worker never reads them from the environment) */
    ssize_t sent;
    do sent = send(w->sock, r->start, r->start_len, MSG_NOSIGNAL);
    while (sent < 0 && errno == EINTR);
    int ready = sent == (ssize_t)r->start_len ? wait_readable(w->sock, r->opts.startup_ms) : -1;
    int got = ready > 0 ? recv_msg(w->sock, &m, NULL) : -1;
    char echo[32];
    snprintf(echo, sizeof echo, " settings=%016llx", (unsigned long long)fnv64(r->start, r->start_len));
    if (got == 1 && m.op == OP_READY && strstr(m.msg, echo)) {
        snprintf(w->ready, sizeof w->ready, "%s", m.msg);
        return MA_OK;
    }
    ma_status s;
    if (got == 1 && m.op == OP_READY) { /* it started with settings other than those sent */
        s = ma_fail(err, MA_ERR_WORKER, "worker %s started with other settings than it was sent (%s)", w->name, m.msg);
        drop_worker(w, how, sizeof how);
        return s;
    }
    const int told = got == 1 && m.op == OP_ERROR; /* the worker's own error, whatever its code */
    if (told) s = ma_fail(err, (ma_status)m.status, "worker %s: %s", w->name, m.msg);
    else if (ready == 0) s = ma_fail(err, MA_ERR_IO, "worker %s did not start within %d ms", w->name, r->opts.startup_ms);
    else s = MA_ERR_IO;
    drop_worker(w, how, sizeof how);
    if (!told && ready != 0) ma_fail(err, MA_ERR_IO, "worker %s failed to start (%s)", w->name, how);
    return s;
}

/* a fault during a request: the worker is dropped and started again; the request fails */
static ma_status fault(ma_resident *r, int wi, const char *what, ma_error *err) {
    ma_worker *w = &r->w[wi];
    pid_t pid = w->pid;
    char how[64];
    drop_worker(w, how, sizeof how);
    r->faults++;
    w->restarts++;
    ma_error e2 = {0};
    ma_status sp = spawn(r, wi, &e2);
    return ma_fail(err, MA_ERR_WORKER, "worker %s (pid %d) %s (%s); %s", w->name, (int)pid, what, how, sp ? e2.msg : "it was restarted");
}

/* give the worker a larger memfd; *ans is its answer: an empty acknowledgement, or the reply to a
 * request whose outputs did not fit (the worker keeps them until the new memory arrives) */
static ma_status grow(ma_resident *r, int wi, size_t need, wire_msg *ans, ma_error *err) {
    ma_worker *w = &r->w[wi];
    size_t size = align64(need) + (1u << 20);
    char name[64];
    snprintf(name, sizeof name, "molmoact-%s", w->name);
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0) return ma_fail(err, MA_ERR_IO, "worker %s: memfd_create: %s", w->name, strerror(errno));
    if (ftruncate(fd, (off_t)size) != 0) {
        close(fd);
        return ma_fail(err, MA_ERR_NOMEM, "worker %s: %zu bytes of shared memory: %s", w->name, size, strerror(errno));
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return ma_fail(err, MA_ERR_NOMEM, "worker %s: mmap: %s", w->name, strerror(errno));
    }
    wire_msg m;
    memset(&m, 0, sizeof m);
    m.magic = WIRE_MAGIC;
    m.op = OP_SHM;
    m.shm_size = size;
    int ok = send_msg(w->sock, &m, fd) == 0;
    int rd = ok ? wait_readable(w->sock, r->opts.deadline_ms) : -1;
    ok = ok && rd > 0 && recv_msg(w->sock, ans, NULL) == 1 && (ans->op == OP_REPLY || ans->op == OP_ERROR);
    if (!ok) {
        munmap(p, size);
        close(fd);
        return fault(r, wi, rd == 0 ? "did not answer within the deadline" : "died", err);
    }
    shm_release(w);
    w->shm = p;
    w->shm_fd = fd;
    w->shm_size = size;
    return MA_OK;
}

/* an idle worker has nothing to say: a hang-up or any pending message means it is gone or broken */
static int idle_dead(const ma_worker *w) {
    struct pollfd p = {w->sock, POLLIN, 0};
    int n;
    do n = poll(&p, 1, 0);
    while (n < 0 && errno == EINTR);
    return n != 0;
}

static ma_status remote_run(void *ctx, int which, int debug, unsigned kept, const ma_tensor *in, int n_in, ma_tensor *out, int *n_out,
                            double *compute_ms, double *transfer_ms, ma_error *err) {
    ma_resident *r = ctx;
    const int wi = ma_session_worker(which);
    ma_worker *w = &r->w[wi];
    const double t0 = ma_now_ms();
    *n_out = 0;
    for (int i = 0; i < MA_SESSION_MAX_IO; i++) memset(&out[i], 0, sizeof out[i]);
    if (w->pid > 0 && idle_dead(w)) {
        /* it died between requests: no request was in it, so start it again and go on */
        char how[64];
        pid_t pid = w->pid;
        drop_worker(w, how, sizeof how);
        w->restarts++;
        r->idle_restarts++;
        fprintf(stderr, "molmoact: worker %s (pid %d) ended while idle (%s); restarting it\n", w->name, (int)pid, how);
    }
    if (w->pid <= 0) {
        ma_status s = spawn(r, wi, err);
        if (s) return s;
    }
    size_t in_bytes = 0;
    for (int i = 0; i < n_in; i++) in_bytes += align64(in[i].nbytes);
    wire_msg m;
    if (w->shm_size < in_bytes + 4096) {
        ma_status s = grow(r, wi, 2 * in_bytes + 4096, &m, err);
        if (s) return s;
    }
    {
        memset(&m, 0, sizeof m);
        m.magic = WIRE_MAGIC;
        m.op = OP_RUN;
        m.which = which;
        m.debug = debug;
        m.n = n_in;
        size_t off = 0, offs[MA_SESSION_MAX_IO];
        for (int i = 0; i < n_in; i++) {
            offs[i] = off;
            m.t[i].dtype = (uint32_t)in[i].dtype;
            m.t[i].ndim = (uint32_t)in[i].ndim;
            memcpy(m.t[i].shape, in[i].shape, sizeof m.t[i].shape);
            m.t[i].off = off;
            m.t[i].nbytes = in[i].nbytes;
            /* kept, and still where the last request put it: the same bytes at the same offset
             * (earlier inputs of another size would have moved it; a request to the other
             * session of this worker leaves its own inputs on record instead) */
            const int in_place =
                ((kept >> i) & 1u) && w->sent[i] == in[i].data && w->sent_bytes[i] == in[i].nbytes && w->sent_off[i] == off;
            if (in_place) m.kept |= 1u << i;
            else memcpy((uint8_t *)w->shm + off, in[i].data, in[i].nbytes);
            off += align64(in[i].nbytes);
        }
        forget_sent(w); /* until the reply: a failure leaves the memory in an unknown state */
        if (send_msg(w->sock, &m, -1) != 0) return fault(r, wi, "died before the request", err);
        if (r->opts.on_sent) r->opts.on_sent(r->opts.hook_ctx, wi, w->pid);
        int rd = wait_readable(w->sock, r->opts.deadline_ms);
        if (rd == 0) {
            char what[96];
            snprintf(what, sizeof what, "did not answer within %d ms and was killed", r->opts.deadline_ms);
            return fault(r, wi, what, err);
        }
        int got = rd > 0 ? recv_msg(w->sock, &m, NULL) : -1;
        if (got != 1) return fault(r, wi, "died during the request", err);
        const int grew = m.op == OP_NEED;
        if (grew) {
            ma_status s = grow(r, wi, (size_t)m.need, &m, err);
            if (s) return s;
        }
        if (m.op == OP_ERROR) return ma_fail(err, (ma_status)m.status, "worker %s: %s", w->name, m.msg);
        if (m.op != OP_REPLY || m.n < 0 || m.n > MA_SESSION_MAX_IO) return fault(r, wi, "sent a malformed reply", err);
        for (int i = 0; i < m.n; i++) {
            const wire_tensor *t = &m.t[i];
            size_t want = 0;
            ma_status s = MA_OK;
            if (t->ndim > MA_MAX_DIMS || t->dtype >= MA_DT_COUNT || t->off > w->shm_size || t->nbytes > w->shm_size - t->off ||
                t->off % 64 != 0)
                s = ma_fail(err, MA_ERR_FORMAT, "worker %s: output %d outside shared memory", w->name, i);
            else if (ma_shape_nbytes((ma_dtype)t->dtype, (int)t->ndim, t->shape, &want, err) || want != t->nbytes)
                s = ma_fail(err, MA_ERR_FORMAT, "worker %s: output %d size mismatch", w->name, i);
            if (s) {
                for (int k = 0; k < MA_SESSION_MAX_IO; k++) memset(&out[k], 0, sizeof out[k]);
                return s;
            }
            /* not copied: a view of the worker's memory, valid until its next request (the
             * full-size K/V is 111 MB a request; a copy into fresh pages cost ~0.1 s) */
            out[i] = ma_tensor_view((ma_dtype)t->dtype, (int)t->ndim, t->shape, (uint8_t *)w->shm + t->off);
        }
        /* the inputs are where they were put unless the worker needed more memory (its outputs
         * then went to the start of the new one) */
        if (!grew) {
            for (int i = 0; i < n_in; i++) w->sent[i] = in[i].data, w->sent_bytes[i] = in[i].nbytes, w->sent_off[i] = offs[i];
        }
        *n_out = m.n;
        *compute_ms = m.compute_ms;
        *transfer_ms = ma_now_ms() - t0 - m.compute_ms;
        if (*transfer_ms < 0) *transfer_ms = 0;
        return MA_OK;
    }
}

/* the workers' environment: this process's, with the backend's variables added (a ':'-list
 * prepended to; any other kept as the user set it); built before any fork, as nothing may be
 * allocated between fork and exec */
static ma_status worker_envp(ma_resident *r, ma_error *err) {
    ma_worker_var vars[MA_MAX_WORKER_VARS];
    const int nv = r->backend->worker_env ? r->backend->worker_env(&r->model->set, vars, MA_MAX_WORKER_VARS) : 0;
    size_t n = 0;
    while (environ[n]) n++;
    r->envp = calloc(n + (size_t)nv + 1, sizeof *r->envp);
    if (!r->envp) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
    size_t k = 0;
    int done[MA_MAX_WORKER_VARS] = {0};
    for (size_t i = 0; i < n; i++) {
        const char *e = environ[i];
        int v = -1;
        for (int j = 0; j < nv && v < 0; j++) {
            const size_t l = strlen(vars[j].name);
            if (!strncmp(e, vars[j].name, l) && e[l] == '=') v = j;
        }
        if (v < 0 || !vars[v].prepend) { /* a value the user set stands: only a path list is added to */
            r->envp[k++] = strdup(e);
            if (v >= 0) done[v] = 1;
        } else {
            const char *old = strchr(e, '=') + 1;
            const size_t len = strlen(vars[v].name) + strlen(vars[v].value) + strlen(old) + 3;
            if ((r->envp[k] = malloc(len)))
                snprintf(r->envp[k], len, "%s=%s%s%s", vars[v].name, vars[v].value, vars[v].prepend && *old ? ":" : "",
                         vars[v].prepend ? old : "");
            k++;
            done[v] = 1;
        }
        if (!r->envp[k - 1]) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
    }
    for (int j = 0; j < nv; j++)
        if (!done[j]) {
            const size_t len = strlen(vars[j].name) + strlen(vars[j].value) + 2;
            if (!(r->envp[k] = malloc(len))) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
            snprintf(r->envp[k++], len, "%s=%s", vars[j].name, vars[j].value);
        }
    return MA_OK;
}

ma_status ma_resident_open(const ma_model *host, const ma_backend *be, const char *dir, const char *tag, const ma_resident_opts *opts,
                           ma_resident **out, ma_error *err) {
    *out = NULL;
    signal(SIGPIPE, SIG_IGN);
    ma_resident *r = calloc(1, sizeof *r);
    if (!r) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
    for (int i = 0; i < MA_NUM_WORKERS; i++) r->w[i].sock = r->w[i].shm_fd = -1;
    if (opts) r->opts = *opts;
    r->backend = be;
    r->model = host;
    if (r->opts.deadline_ms <= 0) r->opts.deadline_ms = host->set.worker_deadline_ms > 0 ? host->set.worker_deadline_ms : 60000;
    r->start = malloc(START_MAX);
    const size_t pl = strlen(START_PREFIX);
    const size_t sl = r->start ? ma_settings_encode(&host->set, r->start + pl, START_MAX - pl) : 0;
    if (!sl) {
        ma_resident_close(r);
        return ma_fail(err, MA_ERR_NOMEM, "the workers' settings do not fit their start message");
    }
    memcpy(r->start, START_PREFIX, pl);
    r->start_len = pl + sl;
    ma_status es = worker_envp(r, err);
    if (es) {
        ma_resident_close(r);
        return es;
    }
    if (r->opts.startup_ms <= 0) r->opts.startup_ms = 300000;
    r->dir = strdup(dir);
    r->tag = strdup(tag ? tag : "libero");
    r->exe = strdup(r->opts.exe ? r->opts.exe : "/proc/self/exe");
    for (int i = 0; i < MA_NUM_WORKERS; i++) r->w[i].sock = r->w[i].shm_fd = -1;
    r->spawner = spawner_start();
    if (!r->dir || !r->tag || !r->exe || !r->spawner) {
        ma_resident_close(r);
        return ma_fail(err, MA_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < MA_NUM_WORKERS; i++) {
        r->w[i].name = MA_WORKER_NAMES[i];
        r->w[i].parts = ma_worker_parts(i);
        r->w[i].sock = -1;
        r->w[i].shm_fd = -1;
        forget_sent(&r->w[i]);
    }
    /* with --preload (each worker reads its contexts in) and at serve's start-up, the workers'
     * start shows progress (settings.progress: set by serve) */
    ma_progress pg;
    const int show = host->set.preload || host->set.progress;
    if (show) ma_progress_begin(&pg, host->set.preload ? "open (--preload)" : "open", 0, MA_NUM_WORKERS, "workers ready");
    for (int i = 0; i < MA_NUM_WORKERS; i++) {
        ma_status s = spawn(r, i, err);
        if (s) {
            if (show) ma_progress_end(&pg, 0);
            ma_resident_close(r);
            return s;
        }
        if (show) ma_progress_add(&pg, 0, 1);
    }
    if (show) ma_progress_end(&pg, 1);
    ma_session_link link = {remote_run, r};
    ma_runner_open_link(be, host, &link, &r->runner);
    *out = r;
    return MA_OK;
}

int ma_resident_close(ma_resident *r) {
    if (!r) return 0;
    int unclean = 0;
    for (int i = 0; i < MA_NUM_WORKERS; i++) {
        ma_worker *w = &r->w[i];
        if (w->pid <= 0) continue;
        int clean = 0;
        wire_msg m;
        memset(&m, 0, sizeof m);
        m.magic = WIRE_MAGIC;
        m.op = OP_QUIT;
        if (w->sock >= 0 && send_msg(w->sock, &m, -1) == 0) {
            /* a worker that quits closes its end of the socket; then it is reaped, up to 5 s */
            for (int k = 0; k < 50 && wait_readable(w->sock, 100) > 0; k++)
                if (recv_msg(w->sock, &m, NULL) != 1) break;
            for (int k = 0; k < 250; k++) {
                int st;
                pid_t p = waitpid(w->pid, &st, WNOHANG);
                if (p == w->pid) {
                    clean = WIFEXITED(st) && WEXITSTATUS(st) == 0;
                    if (!clean)
                        fprintf(stderr, "molmoact: worker %s (pid %d) %s at shutdown\n", w->name, (int)w->pid,
                                WIFEXITED(st) ? "exited with an error" : "was killed by a signal");
                    w->pid = 0;
                    break;
                }
                struct timespec ts = {0, 20 * 1000 * 1000};
                nanosleep(&ts, NULL);
            }
        }
        if (w->pid > 0) fprintf(stderr, "molmoact: worker %s (pid %d) did not quit; killing it\n", w->name, (int)w->pid);
        unclean += !clean;
        char how[64];
        drop_worker(w, how, sizeof how); /* kills and reaps whatever did not quit */
    }
    spawner_stop(r->spawner);    /* after the workers: its end would kill them (PR_SET_PDEATHSIG) */
    ma_runner_close(&r->runner); /* the buffers it keeps between requests (no sessions of its own) */
    for (size_t i = 0; r->envp && r->envp[i]; i++) free(r->envp[i]);
    free(r->envp);
    free(r->start);
    free(r->dir);
    free(r->tag);
    free(r->exe);
    free(r);
    return unclean;
}

/* ------------------------------------------------------------------------------ worker */

/* put a session's outputs into shared memory from offset off; 0 when they do not fit */
static int place_outputs(wire_msg *rep, const ma_session *se, const ma_tensor *out, void *shm, size_t shm_size, size_t off) {
    size_t need = off;
    for (int i = 0; i < se->n_out; i++) need += align64(out[i].nbytes);
    if (need > shm_size) {
        rep->op = OP_NEED;
        rep->need = need;
        return 0;
    }
    rep->op = OP_REPLY;
    rep->n = se->n_out;
    rep->compute_ms = se->last_ms;
    for (int i = 0; i < se->n_out; i++) {
        rep->t[i].dtype = (uint32_t)out[i].dtype;
        rep->t[i].ndim = (uint32_t)out[i].ndim;
        memcpy(rep->t[i].shape, out[i].shape, sizeof rep->t[i].shape);
        rep->t[i].off = off;
        rep->t[i].nbytes = out[i].nbytes;
        memcpy((uint8_t *)shm + off, out[i].data, out[i].nbytes);
        off += align64(out[i].nbytes);
    }
    return 1;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* the start message: the settings this worker runs with */
static ma_status read_start(int fd, ma_settings *st, uint64_t *hash, ma_error *err) {
    char *buf = malloc(START_MAX);
    if (!buf) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
    ssize_t n;
    do n = recv(fd, buf, START_MAX, 0);
    while (n < 0 && errno == EINTR);
    const size_t pl = strlen(START_PREFIX);
    ma_status s = MA_OK;
    if (n < (ssize_t)pl || memcmp(buf, START_PREFIX, pl)) s = ma_fail(err, MA_ERR_FORMAT, "the start message is not one (%zd bytes)", n);
    else if (!(s = ma_settings_decode(st, buf + pl, (size_t)n - pl, err))) {
        /* the hash of what was understood, written again: a value the decoding changed (a
         * default, a bound) would not echo what the orchestrator sent */
        memcpy(buf, START_PREFIX, pl);
        const size_t m = ma_settings_encode(st, buf + pl, START_MAX - pl);
        if (!m) s = ma_fail(err, MA_ERR_FORMAT, "the start message's settings do not fit again");
        else *hash = fnv64(buf, pl + m);
    }
    free(buf);
    return s;
}

int ma_worker_main(int fd, ma_backend_finder find, const char *dir, const char *tag, unsigned parts, int delay_ms) {
    signal(SIGPIPE, SIG_IGN);
#ifdef __linux__
    /* the name top and ps -o comm show (15 bytes: llm_splitN becomes llmN) */
    for (int i = 0; i < MA_NUM_WORKERS; i++)
        if (ma_worker_parts(i) == parts) {
            char comm[16];
            const char *n = MA_WORKER_NAMES[i];
            if (!strncmp(n, "llm_split", 9)) snprintf(comm, sizeof comm, "molmoact:llm%s", n + 9);
            else snprintf(comm, sizeof comm, "molmoact:%s", n);
            prctl(PR_SET_NAME, comm, 0, 0, 0);
        }
#endif
    wire_msg m;
    memset(&m, 0, sizeof m);
    m.magic = WIRE_MAGIC;
    ma_error err = {0};
    ma_model model;
    memset(&model, 0, sizeof model);
    ma_session *sess[7] = {0};
    ma_settings *st = malloc(sizeof *st);
    uint64_t hash = 0;
    const ma_backend *be = NULL;
    ma_status s = st ? read_start(fd, st, &hash, &err) : ma_fail(&err, MA_ERR_NOMEM, "out of memory");
    if (!s) s = ma_kernels_configure(st, &err);
    if (!s && !(be = find(st->backend))) s = ma_fail(&err, MA_ERR_ARG, "backend %s: not in this build", st->backend);
    /* a backend that runs its own files (qnn: context binaries) needs of the model only the
     * config (read with the host part) */
    if (!s) s = ma_model_open_with(dir, tag, be->needs_weights ? parts : MA_PART_EMBED, st, &model, &err);
    for (int i = 0; i < 7 && !s; i++)
        if (ma_worker_parts(ma_session_worker(i)) == parts) s = ma_session_open(be, &model, MA_SESSION_NAMES[i], &sess[i], &err);
    if (s) {
        m.op = OP_ERROR;
        m.status = (int32_t)s;
        snprintf(m.msg, sizeof m.msg, "%s", err.msg);
        send_msg(fd, &m, -1);
        for (int i = 0; i < 7; i++) ma_session_close(sess[i]);
        if (model.dir) ma_model_close(&model);
        free(st);
        close(fd);
        return 1;
    }
    m.op = OP_READY;
    snprintf(m.msg, sizeof m.msg, "backend=%s threads=%d kernels=%s settings=%016llx", be->name, ma_kernel_threads(), ma_gemm_kernels(),
             (unsigned long long)hash);
    free(st);
    if (send_msg(fd, &m, -1) != 0) {
        ma_model_close(&model);
        return 1;
    }
    void *shm = NULL;
    size_t shm_size = 0;
    int shm_fd = -1;
    ma_tensor out[MA_SESSION_MAX_IO];
    memset(out, 0, sizeof out);
    ma_session *pending = NULL; /* a finished request whose outputs wait for more shared memory */
    int status = 0;             /* the worker's exit status */
    for (;;) {
        int passed;
        int got = recv_msg(fd, &m, &passed);
        if (got != 1 || m.op == OP_QUIT) {
            if (got == 1 && passed >= 0) close(passed);
            break;
        }
        wire_msg rep;
        memset(&rep, 0, sizeof rep);
        rep.magic = WIRE_MAGIC;
        if (m.op == OP_SHM) {
            void *p = passed >= 0 ? mmap(NULL, (size_t)m.shm_size, PROT_READ | PROT_WRITE, MAP_SHARED, passed, 0) : MAP_FAILED;
            if (p == MAP_FAILED) {
                if (passed >= 0) close(passed);
                break;
            }
            if (shm) munmap(shm, shm_size);
            if (shm_fd >= 0) close(shm_fd);
            shm = p;
            shm_size = (size_t)m.shm_size;
            shm_fd = passed;
            for (int i = 0; i < 7; i++) ma_session_forget_inputs(sess[i]); /* new memory behind every input */
            rep.op = OP_REPLY;
            if (pending && !place_outputs(&rep, pending, out, shm, shm_size, 0)) {
                rep.op = OP_ERROR;
                rep.status = MA_ERR_NOMEM;
                snprintf(rep.msg, sizeof rep.msg, "outputs do not fit the %zu bytes of shared memory given", shm_size);
            }
            if (pending) {
                for (int i = 0; i < MA_SESSION_MAX_IO; i++) ma_tensor_free(&out[i]);
                pending = NULL;
            }
            if (send_msg(fd, &rep, -1) != 0) break;
            continue;
        }
        if (passed >= 0) close(passed);
        for (int i = 0; i < MA_SESSION_MAX_IO; i++) ma_tensor_free(&out[i]);
        pending = NULL;
        ma_session *se = m.op == OP_RUN && m.which >= 0 && m.which < 7 ? sess[m.which] : NULL;
        ma_tensor in[MA_SESSION_MAX_IO];
        s = MA_OK;
        if (!se) s = ma_fail(&err, MA_ERR_ARG, "request for a session this worker does not hold");
        else if (!shm || m.n != se->n_in) s = ma_fail(&err, MA_ERR_ARG, "malformed request");
        size_t end = 0;
        for (int i = 0; i < m.n && !s; i++) {
            const wire_tensor *t = &m.t[i];
            if (t->ndim > MA_MAX_DIMS || t->dtype >= MA_DT_COUNT || t->off > shm_size || t->nbytes > shm_size - t->off) {
                s = ma_fail(&err, MA_ERR_ARG, "input %d outside shared memory", i);
                break;
            }
            in[i] = ma_tensor_view((ma_dtype)t->dtype, (int)t->ndim, t->shape, (uint8_t *)shm + t->off);
            if (in[i].nbytes != t->nbytes)
                s = ma_fail(&err, MA_ERR_ARG, "input %d (%s) holds %llu bytes, its shape needs %zu", i, ma_dtype_name(in[i].dtype),
                            (unsigned long long)t->nbytes, in[i].nbytes);
            if (t->off + align64(t->nbytes) > end) end = (size_t)(t->off + align64(t->nbytes));
        }
        if (!s && delay_ms > 0) sleep_ms(delay_ms);
        if (!s) {
            ma_session_set_debug(se, m.debug);
            s = ma_session_run_kept(se, in, out, m.kept, &err);
        }
        if (s) {
            rep.op = OP_ERROR;
            rep.status = (int32_t)s;
            snprintf(rep.msg, sizeof rep.msg, "%s", err.msg);
        } else if (!place_outputs(&rep, se, out, shm, shm_size, end)) {
            pending = se; /* keep the outputs; the orchestrator sends a larger memfd next */
        } else {
            for (int i = 0; i < MA_SESSION_MAX_IO; i++) ma_tensor_free(&out[i]);
        }
        if (send_msg(fd, &rep, -1) != 0) break;
        if (s && be->process_lost && be->process_lost()) { /* answered; a new process recovers (the next request restarts it) */
            fprintf(stderr, "molmoact: worker %s: its backend cannot recover in this process; exiting to be started afresh\n",
                    se ? se->name : "?");
            status = 3;
            break;
        }
    }
    for (int i = 0; i < MA_SESSION_MAX_IO; i++) ma_tensor_free(&out[i]);
    if (shm) munmap(shm, shm_size);
    if (shm_fd >= 0) close(shm_fd);
    for (int i = 0; i < 7; i++) ma_session_close(sess[i]);
    ma_model_close(&model);
    close(fd);
    return status;
}
