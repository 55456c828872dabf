/* SPDX-License-Identifier: Apache-2.0 */
/* The resident runtime (docs/ARCHITECTURE.md "The resident runtime"): six worker processes (vision, llm_split0..3, and
 * action holding action_context + action_step), each opening only its own sessions once; the
 * orchestrator does the host glue and passes tensors through shared memory.
 *
 * Transport: one AF_UNIX SOCK_SEQPACKET socket pair per worker for small messages, and one memfd
 * per worker for tensors (inputs at the start, outputs after them; the orchestrator grows it and
 * hands the new descriptor over with SCM_RIGHTS when a reply says it is too small). memfds leave
 * nothing in /dev/shm and vanish with the last descriptor.
 *
 * Supervision: every request has a deadline. A worker that dies (EOF on its socket) or does not
 * answer in time (it is then killed) fails the current request with an error naming it, is reaped
 * and started again. Shutdown asks each worker to quit, waits for it, and closes every descriptor.
 *
 * Workers are this program re-executed (`molmoact __worker ...`, opts.exe, default
 * /proc/self/exe), so they start from a clean process image. */
#ifndef MA_RESIDENT_H
#define MA_RESIDENT_H

#include <sys/types.h>

#include "runtime/pipeline.h"


typedef struct ma_resident_opts {
    const char *exe;     /* the molmoact binary for workers; NULL = /proc/self/exe */
    int deadline_ms;     /* per request and worker; 0 = settings.worker_deadline_ms or 60000 */
    int startup_ms;      /* a worker's time to open its contexts; 0 = 300000 */
    int worker_delay_ms; /* tests: workers sleep this long before answering */
    /* tests: called when a request has been sent to worker wi (pid) and before its answer is
     * awaited, i.e. while the request is in flight */
    void (*on_sent)(void *ctx, int wi, pid_t pid);
    void *hook_ctx;
} ma_resident_opts;

typedef struct ma_worker {
    const char *name;
    unsigned parts;
    pid_t pid;
    int sock;
    int shm_fd;
    void *shm;
    size_t shm_size;
    int restarts;
    char ready[256]; /* its OP_READY: the backend, threads and kernels it applied, its settings' hash */
    /* what the last request left in its shared memory: per input, the host data copied there and
     * where (an input the next request keeps, the same buffer at the same place, is not copied) */
    const void *sent[MA_SESSION_MAX_IO];
    size_t sent_bytes[MA_SESSION_MAX_IO], sent_off[MA_SESSION_MAX_IO];
} ma_worker;

/* Workers are forked by one thread that lives as long as the runtime: PR_SET_PDEATHSIG, which
 * kills a worker when its orchestrator dies, fires when the *thread* that forked it ends, so
 * forking from whichever thread made the request (a restart from a server's or a Python
 * caller's thread) would kill workers when that thread ends. */
typedef struct ma_spawner ma_spawner;

typedef struct ma_resident {
    const ma_model *model; /* the host part (borrowed); its settings are the workers' */
    const ma_backend *backend;
    char *start; /* the workers' start message (their settings) */
    size_t start_len;
    char **envp; /* the workers' environment */
    ma_spawner *spawner;
    char *dir, *tag, *exe;
    ma_resident_opts opts;
    ma_worker w[MA_NUM_WORKERS];
    ma_runner runner;
    int faults;        /* requests failed by a worker fault */
    int idle_restarts; /* workers found dead between requests and restarted before the next */
} ma_resident;

/* start the workers for the model in dir on backend be (host = the orchestrator's own ma_model of
 * that dir, opened with the settings the workers are sent) */
ma_status ma_resident_open(const ma_model *host, const ma_backend *be, const char *dir, const char *tag, const ma_resident_opts *opts,
                           ma_resident **out, ma_error *err);
/* ask every worker to quit, reap them, close every descriptor; returns how many workers did not
 * exit cleanly (status 0) and had to be killed or reported an error (e.g. a sanitizer finding) */
int ma_resident_close(ma_resident *r);

/* the worker side: read the start message on fd (the settings), open the parts on the backend
 * find(settings.backend) names, serve requests until told to quit (returns the exit status) */
typedef const ma_backend *(*ma_backend_finder)(const char *name);
int ma_worker_main(int fd, ma_backend_finder find, const char *dir, const char *tag, unsigned parts, int delay_ms);

#endif
