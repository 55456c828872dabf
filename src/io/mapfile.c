/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include "io/mapfile.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------ mapped files */

/* A file truncated (or rewritten smaller) while it is mapped makes every access past its new end
 * raise SIGBUS, which would kill the process without a word. Every mapping is registered here;
 * the SIGBUS handler maps zero pages over the faulting page of a registered mapping, marks it
 * and returns, so the computation finishes on zeros and the caller, which checks
 * ma_mapfile_check() after each request, fails that request with an error naming the file. A
 * fault elsewhere goes to the previous handler (or the default action). */
#define MAX_MAPS 128
typedef struct {
    _Atomic(uintptr_t) start, end;
    _Atomic int faulted;
    const char *path;
} map_slot;
static map_slot g_maps[MAX_MAPS];
static pthread_mutex_t g_maps_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sigaction g_prev_bus;
static pthread_once_t g_bus_once = PTHREAD_ONCE_INIT;
static _Atomic unsigned long g_faults;

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
    const uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < MAX_MAPS; i++) {
        const uintptr_t b = atomic_load(&g_maps[i].start), e = atomic_load(&g_maps[i].end);
        if (b && a >= b && a < e) {
            const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
            void *p = (void *)(a & ~(page - 1));
            if (mmap(p, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED) {
                atomic_store(&g_maps[i].faulted, 1);
                atomic_fetch_add(&g_faults, 1);
                return;
            }
        }
    }
    if (g_prev_bus.sa_flags & SA_SIGINFO && g_prev_bus.sa_sigaction) {
        g_prev_bus.sa_sigaction(sig, si, uc);
        return;
    }
    if (g_prev_bus.sa_handler != SIG_DFL && g_prev_bus.sa_handler != SIG_IGN && g_prev_bus.sa_handler) {
        g_prev_bus.sa_handler(sig);
        return;
    }
    signal(SIGBUS, SIG_DFL); /* not ours: the fault repeats and takes the default action */
}

static void install_bus_handler(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &g_prev_bus);
}

static void register_map(ma_mapfile *m) {
    pthread_once(&g_bus_once, install_bus_handler);
    pthread_mutex_lock(&g_maps_lock);
    for (int i = 0; i < MAX_MAPS; i++)
        if (!atomic_load(&g_maps[i].start)) {
            g_maps[i].path = m->path;
            atomic_store(&g_maps[i].faulted, 0);
            atomic_store(&g_maps[i].end, (uintptr_t)m->data + m->size);
            atomic_store(&g_maps[i].start, (uintptr_t)m->data);
            break;
        }
    pthread_mutex_unlock(&g_maps_lock);
}

static void unregister_map(const ma_mapfile *m) {
    pthread_mutex_lock(&g_maps_lock);
    for (int i = 0; i < MAX_MAPS; i++)
        if (atomic_load(&g_maps[i].start) == (uintptr_t)m->data) {
            atomic_store(&g_maps[i].start, 0);
            atomic_store(&g_maps[i].end, 0);
            g_maps[i].path = NULL;
        }
    pthread_mutex_unlock(&g_maps_lock);
}

void ma_mapfile_preload(const ma_mapfile *m) {
    if (!m->data || !m->size) return;
    madvise((void *)m->data, m->size, MADV_WILLNEED);
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    volatile uint8_t sink = 0;
    for (size_t off = 0; off < m->size; off += page) sink ^= m->data[off]; /* fault every page in now */
    (void)sink;
}

void ma_mapfile_release(const void *p, size_t n) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + page - 1) & ~(page - 1), b = ((uintptr_t)p + n) & ~(page - 1);
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

ma_status ma_mapfile_check(ma_error *err) {
    if (!atomic_load(&g_faults)) return MA_OK;
    ma_status s = MA_OK;
    pthread_mutex_lock(&g_maps_lock);
    for (int i = 0; i < MAX_MAPS && !s; i++)
        if (atomic_load(&g_maps[i].start) && atomic_load(&g_maps[i].faulted))
            s = ma_fail(err, MA_ERR_IO, "%s: the file was truncated or changed on disk while in use; restore it and restart",
                        g_maps[i].path ? g_maps[i].path : "a mapped file");
    pthread_mutex_unlock(&g_maps_lock);
    return s;
}

/* open for reading without blocking on a FIFO or a device, and refuse anything but a regular file */
static int open_regular(const char *path, struct stat *st, ma_error *err, ma_status *s) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        *s = ma_fail(err, MA_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
        const int dir = S_ISDIR(st->st_mode);
        close(fd);
        *s = ma_fail(err, MA_ERR_IO, "%s: not a regular file%s", path, dir ? " (a directory)" : "");
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

ma_status ma_map_file(ma_mapfile *m, const char *path, ma_error *err) {
    memset(m, 0, sizeof *m);
    struct stat st;
    ma_status s = MA_OK;
    int fd = open_regular(path, &st, err, &s);
    if (fd < 0) return s;
    m->size = (size_t)st.st_size;
    if (m->size > 0) {
        void *p = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            return ma_fail(err, MA_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
        }
        m->data = p;
    }
    close(fd);
    m->path = strdup(path);
    if (!m->path) {
        ma_unmap_file(m);
        return ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", path);
    }
    if (m->size) register_map(m);
    return MA_OK;
}

void ma_unmap_file(ma_mapfile *m) {
    if (!m) return;
    if (m->data && m->size) {
        if (m->path) unregister_map(m);
        munmap((void *)m->data, m->size);
    }
    free(m->path);
    memset(m, 0, sizeof *m);
}

ma_status ma_read_file(const char *path, size_t max_bytes, char **out, size_t *len, ma_error *err) {
    *out = NULL;
    struct stat st;
    ma_status s = MA_OK;
    int fd = open_regular(path, &st, err, &s);
    if (fd < 0) return s;
    if ((uint64_t)st.st_size > max_bytes) {
        close(fd);
        return ma_fail(err, MA_ERR_FORMAT, "%s: %lld bytes exceeds the %zu-byte limit", path, (long long)st.st_size, max_bytes);
    }
    size_t n = (size_t)st.st_size;
    char *buf = ma_malloc(n + 1, 1, err, path);
    if (!buf) {
        close(fd);
        return MA_ERR_NOMEM;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (got != n) {
        free(buf);
        return ma_fail(err, MA_ERR_IO, "%s: short read (the file changed while read?)", path);
    }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return MA_OK;
}

/* ------------------------------------------------------------------------------ output files */

/* follow symlinks (up to 40) to the path that would be written: an existing target, or the new
 * file a dangling link names. Returns a malloc'd path or NULL (errno set). */
static char *resolve_links(const char *path) {
    char *cur = strdup(path);
    for (int hop = 0; cur && hop < 40; hop++) {
        struct stat st;
        if (lstat(cur, &st) != 0 || !S_ISLNK(st.st_mode)) return cur;
        char target[PATH_MAX];
        ssize_t n = readlink(cur, target, sizeof target - 1);
        if (n < 0) {
            free(cur);
            return NULL;
        }
        target[n] = '\0';
        char *next;
        const char *slash = strrchr(cur, '/');
        if (target[0] == '/' || !slash) next = strdup(target);
        else {
            size_t dl = (size_t)(slash - cur) + 1;
            next = malloc(dl + (size_t)n + 1);
            if (next) {
                memcpy(next, cur, dl);
                memcpy(next + dl, target, (size_t)n + 1);
            }
        }
        free(cur);
        cur = next;
    }
    if (cur) {
        free(cur);
        errno = ELOOP;
    }
    return NULL;
}

static mode_t creation_mode(void) {
    mode_t um = umask(022);
    umask(um);
    return 0666 & ~um;
}

ma_status ma_out_open(ma_outfile *o, const char *path, ma_error *err) {
    memset(o, 0, sizeof *o);
    if (!path || !path[0]) return ma_fail(err, MA_ERR_ARG, "empty output path");
    o->path = strdup(path);
    o->target = resolve_links(path);
    if (!o->path || !o->target) {
        int e = errno;
        ma_out_abort(o);
        return ma_fail(err, MA_ERR_IO, "%s: cannot write: %s", path, strerror(e ? e : ENOMEM));
    }
    struct stat st;
    int fd = -1;
    if (stat(o->target, &st) == 0 && !S_ISREG(st.st_mode)) {
        if (S_ISDIR(st.st_mode)) {
            ma_out_abort(o);
            return ma_fail(err, MA_ERR_IO, "%s: cannot write: %s", path, strerror(EISDIR));
        }
        /* a device, FIFO or socket: written in place, never replaced. Non-blocking open so a
         * FIFO without a reader fails at once instead of hanging; blocking writes after */
        o->in_place = 1;
        fd = open(o->target, O_WRONLY | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            ma_out_abort(o);
            return ma_fail(err, MA_ERR_IO, "%s: cannot write: %s", path, e == ENXIO ? "a FIFO with no reader" : strerror(e));
        }
        int fl = fcntl(fd, F_GETFL);
        if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    } else {
        /* a regular file or a new path: a temporary file beside it, renamed over it at commit */
        const int replacing = stat(o->target, &st) == 0;
        size_t tl = strlen(o->target);
        o->tmp = malloc(tl + 16);
        if (!o->tmp) {
            ma_out_abort(o);
            return ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", path);
        }
        snprintf(o->tmp, tl + 16, "%s.tmp-XXXXXX", o->target);
        fd = mkstemp(o->tmp);
        if (fd < 0) {
            int e = errno;
            free(o->tmp);
            o->tmp = NULL;
            ma_out_abort(o);
            return ma_fail(err, MA_ERR_IO, "%s: cannot create: %s", path, strerror(e));
        }
        fchmod(fd, replacing ? (st.st_mode & 07777) : creation_mode());
    }
    o->f = fdopen(fd, "wb");
    if (!o->f) {
        int e = errno;
        close(fd);
        ma_out_abort(o);
        return ma_fail(err, MA_ERR_IO, "%s: cannot write: %s", path, strerror(e));
    }
    return MA_OK;
}

int ma_out_write(ma_outfile *o, const void *data, size_t len) {
    if (o->err_no) return 0;
    if (len && fwrite(data, 1, len, o->f) != len) {
        o->err_no = errno ? errno : EIO;
        return 0;
    }
    return 1;
}

ma_status ma_out_finish(ma_outfile *o, ma_error *err) {
    if (!o->f) return ma_fail(err, MA_ERR_ARG, "%s: not open", o->path ? o->path : "output");
    if (!o->err_no && fflush(o->f) != 0) o->err_no = errno ? errno : EIO;
    if (fclose(o->f) != 0 && !o->err_no) o->err_no = errno ? errno : EIO;
    o->f = NULL;
    if (o->err_no) {
        ma_status s = ma_fail(err, MA_ERR_IO, "%s: cannot write: %s", o->path, strerror(o->err_no));
        ma_out_abort(o);
        return s;
    }
    return MA_OK;
}

ma_status ma_out_commit(ma_outfile *o, ma_error *err) {
    ma_status s = MA_OK;
    if (o->f && (s = ma_out_finish(o, err))) return s;
    if (o->tmp && rename(o->tmp, o->target) != 0) {
        s = ma_fail(err, MA_ERR_IO, "%s: cannot write: %s", o->path, strerror(errno));
        ma_out_abort(o);
        return s;
    }
    free(o->tmp);
    o->tmp = NULL;
    ma_out_abort(o);
    return MA_OK;
}

void ma_out_abort(ma_outfile *o) {
    if (o->f) fclose(o->f);
    if (o->tmp) unlink(o->tmp);
    free(o->tmp);
    free(o->target);
    free(o->path);
    memset(o, 0, sizeof *o);
}

ma_status ma_write_file(const char *path, const void *data, size_t len, ma_error *err) {
    ma_outfile o;
    ma_status s = ma_out_open(&o, path, err);
    if (s) return s;
    ma_out_write(&o, data, len);
    return ma_out_commit(&o, err);
}

char *ma_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t n = a;
    if (n && p[n - 1] != '/') p[n++] = '/';
    memcpy(p + n, name, b + 1);
    return p;
}

int ma_is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int ma_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}
