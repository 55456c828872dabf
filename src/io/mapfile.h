/* Read-only memory-mapped files, and whole-file reads for small files. */
#ifndef MA_MAPFILE_H
#define MA_MAPFILE_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef struct ma_mapfile {
    const uint8_t *data;
    size_t size;
    char *path;
} ma_mapfile;

/* mmap `path` read-only (an empty file maps to data=NULL, size=0) */
ma_status ma_map_file(ma_mapfile *m, const char *path, ma_error *err);
void ma_unmap_file(ma_mapfile *m);

/* read a whole file into a NUL-terminated malloc'd buffer; refuses files larger than max_bytes */
ma_status ma_read_file(const char *path, size_t max_bytes, char **out, size_t *len, ma_error *err);

/* write a buffer to path atomically (path.tmp then rename) */
ma_status ma_write_file(const char *path, const void *data, size_t len, ma_error *err);

/* "dir/name" into a malloc'd string */
char *ma_path_join(const char *dir, const char *name);
int ma_is_file(const char *path);
int ma_is_dir(const char *path);

#endif
