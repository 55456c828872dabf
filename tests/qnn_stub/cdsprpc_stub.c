/* SPDX-License-Identifier: Apache-2.0 */
/* A stand-in for libcdsprpc.so's rpcmem API (the FastRPC shared-memory allocator that zero-copy
 * QNN HTP clients dlopen by bare name), for tests/qnn_stub: each buffer is a memfd named
 * "ma-rpcmem" mapped shared, so rpcmem_to_fd gives a descriptor that the stand-in libQnnHtp.so's
 * memRegister recognises and maps itself (the same pages, as the DSP would see them).
 *
 *   void *rpcmem_alloc(int heapid, uint32_t flags, int size)      heapid 25 = system heap, flags 1 = cached
 *   void *rpcmem_alloc2(int heapid, uint32_t flags, size_t size)
 *   void  rpcmem_free(void *po)                                    ignores pointers it did not hand out
 *   int   rpcmem_to_fd(void *po)                                   -1 for them
 *   void  rpcmem_init(void), rpcmem_deinit(void)                   no-ops (older clients call them)
 *
 * MA_QNN_STUB_LOG=FILE appends one line per call. MA_QNN_STUB_FAULT=rpcmem_alloc makes every
 * allocation fail (NULL). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define HEAP_ID_SYSTEM 25

typedef struct block {
    struct block *next;
    void *ptr;
    size_t size;
    int fd;
} block;

static block *blocks;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void trace(const char *fmt, ...) {
    const char *p = getenv("MA_QNN_STUB_LOG");
    if (!p) return;
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    int fd = open(p, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    size_t n = strlen(line);
    line[n] = '\n';
    if (write(fd, line, n + 1) < 0) { /* nothing to do */
    }
    close(fd);
}

EXPORT void *rpcmem_alloc2(int heapid, uint32_t flags, size_t size) {
    const char *f = getenv("MA_QNN_STUB_FAULT");
    if (size == 0 || heapid < 0 || (f && !strcmp(f, "rpcmem_alloc"))) {
        trace("rpcmem_alloc heap=%d flags=%u size=%zu refused", heapid, flags, size);
        return NULL;
    }
    block *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->fd = memfd_create("ma-rpcmem", MFD_CLOEXEC);
    if (b->fd < 0 || ftruncate(b->fd, (off_t)size) != 0) goto fail;
    b->ptr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd, 0);
    if (b->ptr == MAP_FAILED) goto fail;
    b->size = size;
    pthread_mutex_lock(&lock);
    b->next = blocks;
    blocks = b;
    pthread_mutex_unlock(&lock);
    trace("rpcmem_alloc heap=%d flags=%u size=%zu fd=%d", heapid, flags, size, b->fd);
    return b->ptr;
fail:
    if (b->fd >= 0) close(b->fd);
    free(b);
    trace("rpcmem_alloc heap=%d flags=%u size=%zu failed", heapid, flags, size);
    return NULL;
}

EXPORT void *rpcmem_alloc(int heapid, uint32_t flags, int size) {
    if (size <= 0) {
        trace("rpcmem_alloc heap=%d flags=%u size=%d refused", heapid, flags, size);
        return NULL;
    }
    return rpcmem_alloc2(heapid, flags, (size_t)size);
}

EXPORT void rpcmem_free(void *po) {
    block *b = NULL;
    pthread_mutex_lock(&lock);
    for (block **pp = &blocks; *pp; pp = &(*pp)->next)
        if ((*pp)->ptr == po) {
            b = *pp;
            *pp = b->next;
            break;
        }
    pthread_mutex_unlock(&lock);
    if (!b) {
        trace("rpcmem_free %s ignored", po ? "unknown pointer" : "NULL");
        return;
    }
    trace("rpcmem_free size=%zu fd=%d", b->size, b->fd);
    munmap(b->ptr, b->size);
    close(b->fd);
    free(b);
}

EXPORT int rpcmem_to_fd(void *po) {
    int fd = -1;
    pthread_mutex_lock(&lock);
    for (block *b = blocks; b; b = b->next)
        if (b->ptr == po) fd = b->fd;
    pthread_mutex_unlock(&lock);
    return fd;
}

EXPORT void rpcmem_init(void) {}
EXPORT void rpcmem_deinit(void) {}

/* the heap id a client would pass, for a test that wants to check it */
EXPORT int ma_rpcmem_stub_heap_id_system(void) { return HEAP_ID_SYSTEM; }
