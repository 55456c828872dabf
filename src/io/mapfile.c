#define _POSIX_C_SOURCE 200809L
#include "io/mapfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

ma_status ma_map_file(ma_mapfile *m, const char *path, ma_error *err) {
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ma_fail(err, MA_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return ma_fail(err, MA_ERR_IO, "%s: not a regular file", path);
    }
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
    return MA_OK;
}

void ma_unmap_file(ma_mapfile *m) {
    if (!m) return;
    if (m->data && m->size) munmap((void *)m->data, m->size);
    free(m->path);
    memset(m, 0, sizeof *m);
}

ma_status ma_read_file(const char *path, size_t max_bytes, char **out, size_t *len, ma_error *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return ma_fail(err, MA_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return ma_fail(err, MA_ERR_IO, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > max_bytes) {
        fclose(f);
        return ma_fail(err, MA_ERR_FORMAT, "%s: %lld bytes exceeds the %zu-byte limit", path,
                       (long long)st.st_size, max_bytes);
    }
    size_t n = (size_t)st.st_size;
    char *buf = ma_malloc(n + 1, 1, err, path);
    if (!buf) { fclose(f); return MA_ERR_NOMEM; }
    if (n && fread(buf, 1, n, f) != n) {
        free(buf);
        fclose(f);
        return ma_fail(err, MA_ERR_IO, "%s: short read", path);
    }
    fclose(f);
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return MA_OK;
}

ma_status ma_write_file(const char *path, const void *data, size_t len, ma_error *err) {
    size_t plen = strlen(path);
    char *tmp = ma_malloc(plen + 5, 1, err, path);
    if (!tmp) return MA_ERR_NOMEM;
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        ma_status s = ma_fail(err, MA_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        return s;
    }
    int ok = (len == 0 || fwrite(data, 1, len, f) == len);
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        free(tmp);
        return ma_fail(err, MA_ERR_IO, "%s: write failed", path);
    }
    free(tmp);
    return MA_OK;
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
