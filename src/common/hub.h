/* SPDX-License-Identifier: Apache-2.0 */
/* molmoact pull: a repository of the Hugging Face Hub downloaded into the Hub's own cache layout,
 * over HTTP(S) with libcurl, so that huggingface_hub, `hf` and molmoact share the files:
 *
 *   CACHE/models--ORG--NAME/blobs/<etag>          each file once, named by its etag (an LFS file's
 *                                                 SHA-256, else its git blob id)
 *   CACHE/models--ORG--NAME/snapshots/<commit>/P  a relative symlink to ../../blobs/<etag>
 *   CACHE/models--ORG--NAME/refs/<revision>       the commit a branch or tag named
 *   CACHE/models--ORG--NAME/trees/<commit>.json   the commit's file listing (huggingface_hub's tree cache)
 *   CACHE/.locks/models--ORG--NAME/<etag>.lock    flock(2)ed while a blob is written (huggingface_hub
 *                                                 takes the same lock through filelock)
 *
 * What it relies on, read in huggingface/huggingface_hub at ee0a4510f4bc15e26cb722be2efc2bdb01383ca0
 * (docs/PULL.md says it in full): the commit from GET {endpoint}/api/models/{repo}/revision/{rev}
 * ("sha"; hf_api.py model_info), the files from GET .../tree/{commit}?recursive=true, paged by a
 * Link header (hf_api.py list_repo_tree, utils/_pagination.py), each file's metadata from a HEAD of
 * {endpoint}/{repo}/resolve/{commit}/{path} that follows redirects within the endpoint's origin
 * (huggingface_hub: relative ones) (X-Repo-Commit,
 * X-Linked-Etag or ETag, X-Linked-Size or Content-Length, Location: file_download.py
 * get_hf_file_metadata), the body from the Location, without the token when the host differs.
 *
 * Beyond it: each body's digest is checked against its etag before it is linked (SHA-256 for an
 * LFS file, the git blob SHA-1 otherwise; huggingface_hub checks only the size), the listing and
 * the HEAD must agree, a partial blob is kept as blobs/<etag>.incomplete and resumed with a Range
 * request (here and by the next run), the free space is checked before the first byte, and every
 * name the server sends is checked before it becomes a path. */
#ifndef MA_COMMON_HUB_H
#define MA_COMMON_HUB_H

#include <stddef.h>

#include "core/error.h"

typedef struct {
    const char *repo;           /* ORG/NAME */
    const char *revision;       /* a branch, tag or commit; NULL: main */
    const char *endpoint;       /* e.g. https://huggingface.co (no trailing '/') */
    const char *cache;          /* the hub cache directory */
    const char *token;          /* NULL: none; sent only to the endpoint's own origin, never printed */
    const char *const *include; /* glob patterns (fnmatch, '*' crosses '/'); NULL or none: every file */
    int n_include;
    int retries;                     /* further tries of a blob after a dropped connection or a 5xx */
    int quiet;                       /* no progress */
    int tty;                         /* progress as one redrawn line (else a plain line every 10 s) */
    long connect_timeout_s, stall_s; /* a connection's setup; a body with no byte for this long fails */
    double min_free_mb;              /* free space to leave on the cache's file system */
} ma_pull_opts;

/* the repository's files into the cache; snapshot receives the snapshot directory */
ma_status ma_hub_pull(const ma_pull_opts *o, char *snapshot, size_t cap, ma_error *err);

/* NULL when rev can be a revision here (letters, digits, '-', '_', '.', '/'; no "..", no empty
 * part, at most 200 bytes), else why not */
const char *ma_hub_revision_problem(const char *rev);

/* NULL when p can be a file's path in a snapshot (printable ASCII but '\\', relative, no empty,
 * "." or ".." part, at most 1024 bytes, a part at most 255), else why not */
const char *ma_hub_path_problem(const char *p);

#endif
