/* SPDX-License-Identifier: Apache-2.0 */
/* Read-only memory-mapped files, and whole-file reads for small files. */
#ifndef MA_MAPFILE_H
#define MA_MAPFILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/error.h"

typedef struct ma_mapfile {
    const uint8_t *data;
    size_t size;
    char *path;
} ma_mapfile;

/* mmap `path` read-only (an empty file maps to data=NULL, size=0) */
ma_status ma_map_file(ma_mapfile *m, const char *path, ma_error *err);
void ma_unmap_file(ma_mapfile *m);

/* Mapped files truncated or changed on disk while in use: accesses past the new end fault
 * (SIGBUS); a process-wide handler turns the faulting pages of a mapping made here into zeros
 * and marks it. ma_mapfile_check() fails, naming the file, once any mapping still open has
 * faulted: call it after each request so the request's (partly zero) result is refused. */
ma_status ma_mapfile_check(ma_error *err);
/* read every page of the mapping in now and map it into this process (--preload: the first
 * request then does not pay the page faults) */
void ma_mapfile_preload(const ma_mapfile *m);
/* drop the whole pages inside [p, p + n) of a read-only file mapping from this process's
 * resident set (they stay in the page cache and are read again if touched) */
void ma_mapfile_release(const void *p, size_t n);

/* read a whole file into a NUL-terminated malloc'd buffer; refuses files larger than max_bytes */
ma_status ma_read_file(const char *path, size_t max_bytes, char **out, size_t *len, ma_error *err);

/* An output file. A regular file or a new path is written to a temporary file beside it
 * (PATH.tmp-XXXXXX, the mode of the file it replaces) and renamed over it at commit, so readers
 * never see half a file and a failure leaves nothing behind; a device, FIFO or socket is written
 * in place, never replaced (a FIFO without a reader is refused at once, not waited for);
 * symlinks are followed to their target; a directory or an empty path is refused. Errors name
 * the path and the reason (ENOSPC, EISDIR, ...).
 *   ma_out_open -> ma_out_write ... -> ma_out_finish (everything written and flushed: errors
 *   surface here) -> ma_out_commit (the rename), or ma_out_abort at any point. */
typedef struct ma_outfile {
    FILE *f;
    char *path;   /* as given, for messages */
    char *target; /* after symlinks */
    char *tmp;    /* the temporary file, NULL when written in place */
    int in_place, err_no;
} ma_outfile;

ma_status ma_out_open(ma_outfile *o, const char *path, ma_error *err);
int ma_out_write(ma_outfile *o, const void *data, size_t len); /* 0 after a failure (reported at finish) */
ma_status ma_out_finish(ma_outfile *o, ma_error *err);         /* aborts on failure */
ma_status ma_out_commit(ma_outfile *o, ma_error *err);         /* finishes if needed; aborts on failure */
void ma_out_abort(ma_outfile *o);

/* write a buffer to path as one output file (above) */
ma_status ma_write_file(const char *path, const void *data, size_t len, ma_error *err);

/* "dir/name" into a malloc'd string */
char *ma_path_join(const char *dir, const char *name);
int ma_is_file(const char *path);
int ma_is_dir(const char *path);

#endif
