/* SPDX-License-Identifier: Apache-2.0 */
/* manifest.json of a context directory: written last by `molmoact compile`, it names every file
 * of the directory that a run reads and ties it to the compile that wrote it:
 *
 *   {"molmoact_manifest": 1,
 *    "files": {"vision.gguf": {"compile_id": "9f2c...", "bytes": 123},
 *              "norm_stats.json": {"fnv64": "ab12...", "bytes": 456}, ...}}
 *
 * A context (GGUF) carries its compile's id (molmoact.compile_id: a hash of the compile's input
 * and options, so the same compile gives the same bytes; runtime/compile.c) and must carry the
 * one the manifest lists for its name; a host file (config.json, norm_stats.json, tokenizer.json,
 * processor_config.json) must hash (64-bit FNV-1a) to the listed value. So a compile interrupted
 * while it moved files in (some new, the manifest still the old one), an edited norm_stats.json
 * or another model's config.json is refused by name instead of being used. */
#ifndef MA_MANIFEST_H
#define MA_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

#define MA_MANIFEST_FILE "manifest.json"
#define MA_MANIFEST_MAX 64

typedef struct ma_manifest_entry {
    char name[160];
    char compile_id[17]; /* contexts ("" for a host file) */
    char fnv64[17];      /* host files ("" for a context) */
    uint64_t bytes;
} ma_manifest_entry;

typedef struct ma_manifest {
    int n;
    ma_manifest_entry e[MA_MANIFEST_MAX];
} ma_manifest;

uint64_t ma_fnv1a64(uint64_t h, const void *p, size_t n);
#define MA_FNV_OFFSET 0xcbf29ce484222325ull

/* dir/manifest.json: MA_ERR_IO when absent, MA_ERR_FORMAT when malformed */
ma_status ma_manifest_load(const char *dir, ma_manifest *m, ma_error *err);
const ma_manifest_entry *ma_manifest_find(const ma_manifest *m, const char *name);
/* add or replace an entry */
ma_status ma_manifest_put(ma_manifest *m, const ma_manifest_entry *e, ma_error *err);
/* the entries in name order */
ma_status ma_manifest_write(const char *path, const ma_manifest *m, ma_error *err);
/* the FNV-1a 64 of a file as 16 hex digits, and its size */
ma_status ma_manifest_hash_file(const char *path, char out[17], uint64_t *bytes, ma_error *err);

#endif
