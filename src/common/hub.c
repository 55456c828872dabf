/* SPDX-License-Identifier: Apache-2.0 */
/* molmoact pull (hub.h): the Hub's protocol through libcurl, the cache layout, the checks. */
#define _GNU_SOURCE /* flock, statvfs, strcasestr */
#include "common/hub.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <stdarg.h>
#include <strings.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "model/lerobot.h"
#include "molmoact.h"

#define API_BODY_MAX \
    (4u << 20)                  /* one API reply (a page of the listing) held in memory: the Hub's are under 1 MiB, and cJSON's tree
                                  * of one takes up to ~30x its bytes */
#define LISTING_MAX (64u << 20) /* the listing's names and ids kept, over all its pages */
#define TREE_FILES_MAX 200000   /* files in one listing */
#define TREE_PAGES_MAX 1000
#define REDIRECTS_MAX 5

typedef struct {
    char *path, *oid, *lfs_oid, *xet;
    long long size, lfs_size; /* lfs_size -1: not LFS */
    int want;
} hub_file;

typedef struct {
    CURL *c;
    const ma_pull_opts *o;
    char *scheme, *host, *port; /* the endpoint's origin: the token goes only there */
    char repo_dir[PATH_MAX], lock_dir[PATH_MAX], commit[41];
    hub_file *f;
    int n, cap;
    long long total, done; /* bytes to fetch in this run, fetched so far (files finished) */
    size_t listed;         /* bytes of the listing kept (LISTING_MAX) */
    double t0, last_print;
    int index, count; /* the file being fetched, of count */
    const char *name; /* its path, for the progress */
    long long have, expect;
} hub;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------------------- names and paths */

const char *ma_hub_revision_problem(const char *rev) {
    const size_t n = strlen(rev);
    if (n < 1 || n > 200) return "a revision has 1 to 200 characters";
    if (rev[0] == '/' || rev[n - 1] == '/' || strstr(rev, "//")) return "a revision has no empty part between '/'";
    if (strstr(rev, "..")) return "'..' is not allowed in a revision";
    if (rev[0] == '.' || strstr(rev, "/.")) return "no part of a revision may start with '.'";
    for (size_t i = 0; i < n; i++) {
        const char c = rev[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' || c == '/'))
            return "only letters, digits, '-', '_', '.' and '/' are allowed in a revision";
    }
    return NULL;
}

const char *ma_hub_path_problem(const char *p) {
    const size_t n = strlen(p);
    if (n < 1 || n > 1024) return "a path has 1 to 1024 bytes";
    if (p[0] == '/') return "an absolute path";
    size_t part = 0;
    for (size_t i = 0; i <= n; i++) {
        const unsigned char c = (unsigned char)p[i];
        if (c == '/' || c == '\0') {
            const char *s = p + i - part;
            if (part == 0) return "an empty part between '/'";
            if ((part == 1 && s[0] == '.') || (part == 2 && s[0] == '.' && s[1] == '.')) return "a '.' or '..' part";
            part = 0;
            continue;
        }
        if (c < 0x20 || c > 0x7e) return "a byte that is not printable ASCII";
        if (c == '\\') return "a backslash";
        if (++part > 255) return "a part longer than 255 bytes";
    }
    return NULL;
}

static int hexn(const char *s, size_t n) {
    if (!s || strlen(s) != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

/* what a server said, made printable and bounded, for a message */
static const char *clean(const char *s, char *buf, size_t cap) {
    size_t k = 0;
    for (; s && *s && k + 1 < cap; s++) buf[k++] = (*s >= 0x20 && *s < 0x7f) ? *s : '?';
    buf[k] = '\0';
    return buf;
}

static int mkdirs(const char *path) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) return -1;
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            if (mkdir(p, 0777) && errno != EEXIST) return -1;
            *s = '/';
        }
    return (mkdir(p, 0777) && errno != EEXIST) ? -1 : 0;
}

static ma_status pathf(char *out, size_t cap, ma_error *err, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static ma_status pathf(char *out, size_t cap, ma_error *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap) return ma_fail(err, MA_ERR_RANGE, "a cache path is longer than %zu bytes: %.200s...", cap - 1, out);
    return MA_OK;
}

/* a new regular file, never through a symlink or over an existing name (a shared cache may hold
 * another user's links): O_EXCL | O_NOFOLLOW */
static int create_new(const char *path) { return open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644); }

/* a file written whole under a temporary name, then renamed over path */
static ma_status write_atomic(const char *path, const char *text, ma_error *err) {
    char tmp[PATH_MAX];
    ma_status s = pathf(tmp, sizeof tmp, err, "%s.%ld.tmp", path, (long)getpid());
    if (s) return s;
    int fd = create_new(tmp);
    if (fd < 0 && errno == EEXIST && !unlink(tmp)) fd = create_new(tmp); /* a leftover (or a link): removed, not followed */
    if (fd < 0) return ma_fail(err, MA_ERR_IO, "%s: %s", tmp, strerror(errno));
    const size_t n = strlen(text);
    size_t off = 0;
    while (off < n) {
        const ssize_t w = write(fd, text + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        off += (size_t)w;
    }
    const int bad = off != n;
    if (close(fd) || bad || rename(tmp, path)) {
        const int e = errno;
        unlink(tmp);
        return ma_fail(err, MA_ERR_IO, "%s: %s", path, strerror(e));
    }
    return MA_OK;
}

/* ----------------------------------------------------------------------------------- HTTP */

typedef struct {
    char *buf;
    size_t len, limit;
    int over;
} membuf;

static size_t to_mem(char *p, size_t sz, size_t n, void *u) {
    membuf *m = u;
    const size_t k = sz * n;
    if (k > m->limit - m->len) { /* counted before it is held */
        m->over = 1;
        return 0;
    }
    char *b = realloc(m->buf, m->len + k + 1);
    if (!b) return 0;
    memcpy(b + m->len, p, k);
    m->buf = b;
    m->len += k;
    b[m->len] = '\0';
    return k;
}

static const char *header(hub *h, const char *name) {
    struct curl_header *hh;
    return curl_easy_header(h->c, name, 0, CURLH_HEADER, -1, &hh) == CURLHE_OK ? hh->value : NULL;
}

/* same scheme, host and port as the endpoint: the only origin the token is sent to */
static int same_origin(hub *h, const char *url) {
    CURLU *u = curl_url();
    char *sc = NULL, *ho = NULL, *po = NULL;
    int same = 0;
    if (u && !curl_url_set(u, CURLUPART_URL, url, 0) && !curl_url_get(u, CURLUPART_SCHEME, &sc, 0) &&
        !curl_url_get(u, CURLUPART_HOST, &ho, 0) && !curl_url_get(u, CURLUPART_PORT, &po, CURLU_DEFAULT_PORT))
        same = !strcasecmp(sc, h->scheme) && !strcasecmp(ho, h->host) && !strcmp(po, h->port);
    curl_free(sc);
    curl_free(ho);
    curl_free(po);
    curl_url_cleanup(u);
    return same;
}

/* a request's options afresh: http and https only (libcurl 7.85's PROTOCOLS_STR: refused, the
 * request is not made), a connection within connect_timeout_s, a transfer that stays under
 * 1 KiB/s for stall_s fails (a server trickling bytes cannot hold it), the token only for the
 * endpoint's origin. libcurl (7.83 and later) drops that header itself on a redirect to another
 * host, port or scheme, which the body's GET follows. */
static int reset(hub *h, const char *url, struct curl_slist **hdrs, int identity) {
    curl_easy_reset(h->c);
    *hdrs = NULL;
    if (curl_easy_setopt(h->c, CURLOPT_PROTOCOLS_STR, "http,https") || curl_easy_setopt(h->c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https") ||
        curl_easy_setopt(h->c, CURLOPT_URL, url))
        return -1;
    curl_easy_setopt(h->c, CURLOPT_USERAGENT, "molmoact/" MOLMOACT_VERSION);
    curl_easy_setopt(h->c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h->c, CURLOPT_CONNECTTIMEOUT, h->o->connect_timeout_s > 0 ? h->o->connect_timeout_s : 30L);
    curl_easy_setopt(h->c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(h->c, CURLOPT_LOW_SPEED_TIME, h->o->stall_s > 0 ? h->o->stall_s : 60L);
    *hdrs = NULL;
    if (identity) *hdrs = curl_slist_append(*hdrs, "Accept-Encoding: identity");
    if (h->o->token && *h->o->token && same_origin(h, url)) {
        char a[1200];
        snprintf(a, sizeof a, "Authorization: Bearer %s", h->o->token);
        *hdrs = curl_slist_append(*hdrs, a);
        memset(a, 0, sizeof a);
    }
    curl_easy_setopt(h->c, CURLOPT_HTTPHEADER, *hdrs);
    return 0;
}

/* why a reply was not 2xx, in words: the Hub's X-Error-Code and X-Error-Message when it sent them */
static ma_status http_fail(hub *h, long code, const char *what, ma_error *err) {
    char ec[64], em[240];
    const char *xc = header(h, "X-Error-Code"), *xm = header(h, "X-Error-Message");
    clean(xc, ec, sizeof ec);
    clean(xm, em, sizeof em);
    const int tok = h->o->token && *h->o->token;
    const char *hint = "";
    if (code == 401 || code == 403)
        hint = tok ? " (the token was refused for this repo: is access granted on its page?)"
                   : " (a gated or private repo needs a token: HF_TOKEN, --token-file, or `hf auth login`'s token file)";
    else if (code == 404)
        hint = !strcmp(ec, "RevisionNotFound") ? " (no such revision)"
               : !strcmp(ec, "EntryNotFound")  ? " (no such file at this commit)"
                                               : (tok ? " (no such repo, or the token cannot see it)"
                                                      : " (no such repo; a private repo answers 404 without a token too)");
    return ma_fail(err, MA_ERR_IO, "%s: HTTP %ld%s%s%s%s%s", what, code, xc ? " " : "", ec, xm ? ": " : "", em, hint);
}

static ma_status curl_fail(CURLcode rc, const char *what, const char *ebuf, ma_error *err) {
    char e[CURL_ERROR_SIZE];
    return ma_fail(err, MA_ERR_IO, "%s: %s%s%s", what, curl_easy_strerror(rc), *ebuf ? ": " : "", clean(ebuf, e, sizeof e));
}

static int transient_http(long code) { return code == 408 || code == 429 || code >= 500; }

/* the pause before try `attempt` + 1: 1, 2, 4, 8, 8 ... s */
static void backoff(hub *h, int attempt, const char *what, const char *why) {
    const unsigned pause = attempt < 4 ? 1u << attempt : 8u;
    if (!h->o->quiet) fprintf(stderr, "%spull: %s: %s; trying again in %u s\n", h->o->tty ? "\r\033[K" : "", what, why, pause);
    sleep(pause);
}

/* one request to the endpoint, following redirects within its origin; *code is the last reply's
 * status; a redirect elsewhere stops with *code 3xx and its target in loc (for a HEAD) */
static ma_status request(hub *h, const char *url0, int head, membuf *body, long *code, char *loc, size_t loc_cap, ma_error *err) {
    char url[4096], ebuf[CURL_ERROR_SIZE];
    if (strlen(url0) >= sizeof url)
        return ma_fail(err, MA_ERR_RANGE, "a URL of %zu bytes (at most %zu): %.200s...", strlen(url0), sizeof url - 1, url0);
    snprintf(url, sizeof url, "%s", url0);
    for (int hop = 0, attempt = 0;; hop++) {
        struct curl_slist *hdrs;
        if (reset(h, url, &hdrs, head)) {
            curl_slist_free_all(hdrs);
            return ma_fail(err, MA_ERR_IO, "this libcurl refuses to limit a request to http and https (7.85 or newer is needed)");
        }
        ebuf[0] = '\0';
        curl_easy_setopt(h->c, CURLOPT_ERRORBUFFER, ebuf);
        curl_easy_setopt(h->c, CURLOPT_TIMEOUT, 300L);
        if (head) curl_easy_setopt(h->c, CURLOPT_NOBODY, 1L);
        else {
            body->len = 0;
            body->over = 0;
            curl_easy_setopt(h->c, CURLOPT_WRITEFUNCTION, to_mem);
            curl_easy_setopt(h->c, CURLOPT_WRITEDATA, body);
        }
        const CURLcode rc = curl_easy_perform(h->c);
        curl_slist_free_all(hdrs);
        if (!head && body->over)
            return ma_fail(err, MA_ERR_RANGE, "%s: the reply is larger than %u MiB (the limit on an API reply)", url0, API_BODY_MAX >> 20);
        if (!rc) curl_easy_getinfo(h->c, CURLINFO_RESPONSE_CODE, code);
        if ((rc || transient_http(*code)) && attempt < h->o->retries) { /* a dropped connection, a 5xx: the same request again */
            char why[160];
            if (rc) snprintf(why, sizeof why, "%s", curl_easy_strerror(rc));
            else snprintf(why, sizeof why, "HTTP %ld", *code);
            backoff(h, attempt++, url0, why);
            hop--;
            continue;
        }
        if (rc) return curl_fail(rc, url0, ebuf, err);
        if (*code < 300 || *code >= 400) return MA_OK;
        char *next = NULL;
        curl_easy_getinfo(h->c, CURLINFO_REDIRECT_URL, &next);
        if (!next) return ma_fail(err, MA_ERR_IO, "%s: HTTP %ld without a Location", url0, *code);
        if (!same_origin(h, next)) {
            if (!head) return ma_fail(err, MA_ERR_IO, "%s: redirected to another host, which an API reply may not be", url0);
            if (strlen(next) >= loc_cap) return ma_fail(err, MA_ERR_RANGE, "%s: the redirect's Location is too long", url0);
            snprintf(loc, loc_cap, "%s", next);
            return MA_OK;
        }
        if (hop >= REDIRECTS_MAX) return ma_fail(err, MA_ERR_IO, "%s: more than %d redirects", url0, REDIRECTS_MAX);
        if (strlen(next) >= sizeof url) return ma_fail(err, MA_ERR_RANGE, "%s: the redirect's Location is too long", url0);
        snprintf(url, sizeof url, "%s", next);
    }
}

/* a path with each part percent-encoded, '/' kept (huggingface_hub's quote(filename)) */
static ma_status quote_path(hub *h, const char *p, char *out, size_t cap, ma_error *err) {
    size_t k = 0;
    out[0] = '\0';
    while (*p) {
        const char *e = strchr(p, '/');
        const size_t n = e ? (size_t)(e - p) : strlen(p);
        char *q = curl_easy_escape(h->c, p, (int)n);
        if (!q) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
        const int w = snprintf(out + k, cap - k, "%s%s", q, e ? "/" : "");
        curl_free(q);
        if (w < 0 || (size_t)w >= cap - k) return ma_fail(err, MA_ERR_RANGE, "a URL is too long");
        k += (size_t)w;
        p += n + (e != NULL);
    }
    return MA_OK;
}

/* ------------------------------------------------------------------- the commit and the files */

static ma_status resolve_commit(hub *h, const char *rev, ma_error *err) {
    char url[4096], what[600];
    char *q = curl_easy_escape(h->c, rev, 0);
    ma_status s = pathf(url, sizeof url, err, "%s/api/models/%s/revision/%s", h->o->endpoint, h->o->repo, q ? q : "");
    curl_free(q);
    if (s) return s;
    snprintf(what, sizeof what, "%s at revision %s (%s)", h->o->repo, rev, h->o->endpoint);
    membuf b = {NULL, 0, API_BODY_MAX, 0};
    long code = 0;
    s = request(h, url, 0, &b, &code, NULL, 0, err);
    if (!s && code != 200) s = http_fail(h, code, what, err);
    cJSON *j = s ? NULL : cJSON_ParseWithLength(b.buf ? b.buf : "", b.len);
    free(b.buf);
    if (s) return s;
    const cJSON *sha = cJSON_GetObjectItemCaseSensitive(j, "sha");
    if (!cJSON_IsString(sha) || !hexn(sha->valuestring, 40)) {
        cJSON_Delete(j);
        return ma_fail(err, MA_ERR_FORMAT, "%s: the reply has no \"sha\" of 40 hex digits (is %s a Hugging Face Hub?)", what,
                       h->o->endpoint);
    }
    snprintf(h->commit, sizeof h->commit, "%s", sha->valuestring);
    cJSON_Delete(j);
    return MA_OK;
}

static char *dup_str(const cJSON *v) { return cJSON_IsString(v) ? strdup(v->valuestring) : NULL; }

static const char *file_id(const hub_file *f) { return f->lfs_oid ? f->lfs_oid : f->oid; }

static int cmp_id(const void *a, const void *b) {
    return strcmp(file_id(*(const hub_file *const *)a), file_id(*(const hub_file *const *)b));
}

static int cmp_file(const void *a, const void *b) { return strcmp(((const hub_file *)a)->path, ((const hub_file *)b)->path); }

/* the next page of a listing: Link: <URL>; rel="next" (RFC 8288; one parameter among others,
 * rel's value a space-separated list), the URL resolved against the page's own */
static int next_link(const char *link, const char *base, char *out, size_t cap) {
    for (const char *p = link; p && (p = strchr(p, '<'));) {
        const char *e = strchr(p, '>');
        if (!e) return 0;
        const char *q = e + 1, *end = strchr(q, ',');
        if (!end) end = q + strlen(q);
        int next = 0;
        while (q < end && !next) { /* ; name=value or ; name="v1 v2" */
            while (q < end && (*q == ';' || *q == ' ' || *q == '\t')) q++;
            const char *name = q;
            while (q < end && *q != '=' && *q != ';') q++;
            const int is_rel = q - name == 3 && !strncasecmp(name, "rel", 3);
            if (q < end && *q == '=') q++;
            const int quoted = q < end && *q == '"';
            q += quoted;
            const char *v = q;
            while (q < end && (quoted ? *q != '"' : (*q != ';' && *q != ' '))) q++;
            for (const char *w = v; is_rel && w < q;) {
                const char *we = w;
                while (we < q && *we != ' ') we++;
                next |= we - w == 4 && !strncasecmp(w, "next", 4);
                w = we + 1;
            }
            q += quoted && q < end;
        }
        if (next) {
            char rel[4096];
            if ((size_t)(e - p - 1) >= sizeof rel) return 0;
            snprintf(rel, sizeof rel, "%.*s", (int)(e - p - 1), p + 1);
            CURLU *u = curl_url();
            char *abs = NULL;
            int ok = u && !curl_url_set(u, CURLUPART_URL, base, 0) && !curl_url_set(u, CURLUPART_URL, rel, 0) &&
                     !curl_url_get(u, CURLUPART_URL, &abs, 0) && strlen(abs) < cap;
            if (ok) snprintf(out, cap, "%s", abs);
            curl_free(abs);
            curl_url_cleanup(u);
            return ok;
        }
        p = end;
    }
    return 0;
}

static ma_status add_entry(hub *h, const cJSON *it, const char *what, ma_error *err) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(it, "type");
    if (!cJSON_IsString(type)) return ma_fail(err, MA_ERR_FORMAT, "%s: an entry without a \"type\"", what);
    if (strcmp(type->valuestring, "file")) return MA_OK; /* a directory */
    const cJSON *path = cJSON_GetObjectItemCaseSensitive(it, "path"), *size = cJSON_GetObjectItemCaseSensitive(it, "size"),
                *oid = cJSON_GetObjectItemCaseSensitive(it, "oid"), *lfs = cJSON_GetObjectItemCaseSensitive(it, "lfs"),
                *xet = cJSON_GetObjectItemCaseSensitive(it, "xetHash");
    char e[200];
    if (!cJSON_IsString(path) || !cJSON_IsNumber(size) || size->valuedouble < 0 || size->valuedouble > 9e15 || !cJSON_IsString(oid))
        return ma_fail(err, MA_ERR_FORMAT, "%s: a file entry without a path, a size or an oid", what);
    /* bounded before it is kept (the whole listing is held): a path of at most 1024 bytes (checked
     * further before it becomes one, ma_hub_path_problem), ids of 40 or 64 hex digits, a xetHash
     * kept only when it is one */
    if (strlen(path->valuestring) > 1024)
        return ma_fail(err, MA_ERR_FORMAT, "%s: a path of %zu bytes (at most 1024)", what, strlen(path->valuestring));
    if (!hexn(oid->valuestring, 40))
        return ma_fail(err, MA_ERR_FORMAT, "%s: %s: the oid is not 40 hex digits", what, clean(path->valuestring, e, sizeof e));
    h->listed += strlen(path->valuestring) + 200;
    if (h->listed > LISTING_MAX) return ma_fail(err, MA_ERR_RANGE, "%s: more than %u MiB of names", what, LISTING_MAX >> 20);
    if (h->n >= TREE_FILES_MAX) return ma_fail(err, MA_ERR_RANGE, "%s: more than %d files", what, TREE_FILES_MAX);
    if (h->n == h->cap) {
        const int nc = h->cap ? 2 * h->cap : 64;
        hub_file *nf = realloc(h->f, (size_t)nc * sizeof *nf);
        if (!nf) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
        h->f = nf;
        h->cap = nc;
    }
    hub_file *f = &h->f[h->n];
    memset(f, 0, sizeof *f);
    f->path = strdup(path->valuestring);
    f->oid = dup_str(oid);
    f->size = (long long)size->valuedouble;
    f->lfs_size = -1;
    if (cJSON_IsObject(lfs)) {
        const cJSON *lo = cJSON_GetObjectItemCaseSensitive(lfs, "oid"), *ls = cJSON_GetObjectItemCaseSensitive(lfs, "size");
        if (!cJSON_IsString(lo) || !hexn(lo->valuestring, 64) || !cJSON_IsNumber(ls) || ls->valuedouble < 0 || ls->valuedouble > 9e15) {
            h->n++;
            return ma_fail(err, MA_ERR_FORMAT, "%s: %s: an lfs entry without an oid of 64 hex digits or a size", what,
                           clean(path->valuestring, e, sizeof e));
        }
        f->lfs_oid = strdup(lo->valuestring);
        f->lfs_size = (long long)ls->valuedouble;
    }
    if (cJSON_IsString(xet) && hexn(xet->valuestring, 64)) f->xet = strdup(xet->valuestring);
    h->n++;
    if (!f->path || !f->oid) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
    return MA_OK;
}

static ma_status list_files(hub *h, ma_error *err) {
    char url[4096], what[600];
    ma_status s =
        pathf(url, sizeof url, err, "%s/api/models/%s/tree/%s?recursive=true&expand=false", h->o->endpoint, h->o->repo, h->commit);
    if (s) return s;
    snprintf(what, sizeof what, "the file list of %s at %s", h->o->repo, h->commit);
    membuf b = {NULL, 0, API_BODY_MAX, 0};
    for (int page = 0; !s; page++) {
        if (page >= TREE_PAGES_MAX) {
            s = ma_fail(err, MA_ERR_RANGE, "%s: more than %d pages", what, TREE_PAGES_MAX);
            break;
        }
        long code = 0;
        if ((s = request(h, url, 0, &b, &code, NULL, 0, err))) break;
        if (code != 200) {
            s = http_fail(h, code, what, err);
            break;
        }
        const char *link = header(h, "Link");
        char next[4096];
        const int more = link && next_link(link, url, next, sizeof next);
        cJSON *j = cJSON_ParseWithLength(b.buf ? b.buf : "", b.len);
        if (!cJSON_IsArray(j)) s = ma_fail(err, MA_ERR_FORMAT, "%s: the reply is not a JSON array", what);
        const cJSON *it;
        cJSON_ArrayForEach(it, j) {
            if (s) break;
            s = add_entry(h, it, what, err);
        }
        const int empty = !s && cJSON_GetArraySize(j) == 0;
        cJSON_Delete(j);
        if (s || !more) break;
        if (empty || !strcmp(next, url))
            s = ma_fail(err, MA_ERR_FORMAT, "%s: page %d names a next page that cannot progress", what, page + 1);
        else if (!same_origin(h, next)) s = ma_fail(err, MA_ERR_IO, "%s: the next page is on another host", what);
        snprintf(url, sizeof url, "%s", next);
    }
    free(b.buf);
    if (s) return s;
    qsort(h->f, (size_t)h->n, sizeof *h->f, cmp_file);
    for (int i = 1; i < h->n; i++)
        if (!strcmp(h->f[i].path, h->f[i - 1].path)) {
            char e[200];
            return ma_fail(err, MA_ERR_FORMAT, "%s: %s is listed twice", what, clean(h->f[i].path, e, sizeof e));
        }
    return MA_OK;
}

static int included(const ma_pull_opts *o, const char *path) {
    if (!o->include || o->n_include == 0) return 1;
    for (int i = 0; i < o->n_include; i++) {
        char p[1100];
        const size_t n = strlen(o->include[i]);
        snprintf(p, sizeof p, "%s%s", o->include[i], n && o->include[i][n - 1] == '/' ? "*" : "");
        if (!fnmatch(p, path, 0)) return 1;
    }
    return 0;
}

/* huggingface_hub's tree cache (_tree_cache.py: trees/<commit>.json, json.dump(indent=1), the
 * files sorted by path), so that its offline snapshot_download can tell the snapshot complete.
 * Written only when every path is printable ASCII (json.dump would escape the rest) */
static ma_status write_tree_cache(hub *h, ma_error *err) {
    size_t cap = 256;
    for (int i = 0; i < h->n; i++) {
        if (ma_hub_path_problem(h->f[i].path) || strpbrk(h->f[i].path, "\"")) return MA_OK;
        if ((h->f[i].xet && !hexn(h->f[i].xet, 64)) || !hexn(h->f[i].oid, 40) || (h->f[i].lfs_oid && !hexn(h->f[i].lfs_oid, 64)))
            return MA_OK;
        cap += strlen(h->f[i].path) + 400;
    }
    char *t = malloc(cap), dir[PATH_MAX], path[PATH_MAX];
    if (!t) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
    size_t k = (size_t)snprintf(t, cap, "{\n \"format_version\": 1,\n \"files\": {");
    for (int i = 0; i < h->n; i++) {
        const hub_file *f = &h->f[i];
        k += (size_t)snprintf(t + k, cap - k, "%s\n  \"%s\": {\n   \"size\": %lld,\n   \"blob_id\": \"%s\"", i ? "," : "", f->path, f->size,
                              f->oid);
        if (f->lfs_oid)
            k += (size_t)snprintf(t + k, cap - k, ",\n   \"lfs_sha256\": \"%s\",\n   \"lfs_size\": %lld", f->lfs_oid, f->lfs_size);
        if (f->xet) k += (size_t)snprintf(t + k, cap - k, ",\n   \"xet_hash\": \"%s\"", f->xet);
        k += (size_t)snprintf(t + k, cap - k, "\n  }");
    }
    snprintf(t + k, cap - k, h->n ? "\n }\n}" : "}\n}");
    ma_status s = pathf(dir, sizeof dir, err, "%s/trees", h->repo_dir);
    if (!s) s = pathf(path, sizeof path, err, "%s/%s.json", dir, h->commit);
    if (!s && mkdirs(dir)) s = ma_fail(err, MA_ERR_IO, "%s: %s", dir, strerror(errno));
    if (!s) s = write_atomic(path, t, err);
    free(t);
    return s;
}

/* -------------------------------------------------------------------------------- progress */

static void human(double b, char *out, size_t cap) {
    const char *u[] = {"B", "kB", "MB", "GB", "TB"};
    int i = 0;
    while (b >= 1000 && i < 4) b /= 1000, i++;
    snprintf(out, cap, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

static void progress_line(hub *h, long long now_bytes, int final) {
    if (h->o->quiet) return;
    const double t = now_s();
    if (!final && t - h->last_print < (h->o->tty ? 0.2 : 10.0)) return;
    h->last_print = t;
    const long long got = h->done + now_bytes;
    const double rate = got / (t - h->t0 > 1e-3 ? t - h->t0 : 1e-3);
    char a[32], b[32], r[32], eta[32] = "";
    human((double)got, a, sizeof a);
    human((double)h->total, b, sizeof b);
    human(rate, r, sizeof r);
    if (rate > 0 && h->total > got) {
        const long s = (long)((double)(h->total - got) / rate);
        snprintf(eta, sizeof eta, s >= 3600 ? "  ETA %ldh%02ldm" : "  ETA %ldm%02lds", s >= 3600 ? s / 3600 : s / 60,
                 s >= 3600 ? (s / 60) % 60 : s % 60);
    }
    const double pct = h->total ? 100.0 * (double)got / (double)h->total : 100.0;
    if (h->o->tty) fprintf(stderr, "\r\033[K[%d/%d] %.40s  %s / %s (%.0f%%)  %s/s%s", h->index, h->count, h->name, a, b, pct, r, eta);
    else fprintf(stderr, "pull: [%d/%d] %s: %s of %s (%.0f%%), %s/s%s\n", h->index, h->count, h->name, a, b, pct, r, eta);
    fflush(stderr);
}

static int xferinfo(void *u, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ult, curl_off_t uln) {
    (void)dltotal, (void)ult, (void)uln;
    hub *h = u;
    (void)dlnow;
    progress_line(h, h->have, 0);
    return 0;
}

/* ----------------------------------------------------------------------------------- blobs */

typedef struct {
    hub *h;
    int fd;
    long long start, have, expect; /* bytes on disk when the request began, now, in all */
    EVP_MD_CTX *md;
    const EVP_MD *type;
    int lfs, checked, refused; /* refused: the reply was not the body asked for */
    long code;
    int over, io_errno;
    char why[200];
} sink;

static int digest_begin(sink *k) {
    if (!EVP_DigestInit_ex(k->md, k->type, NULL)) return -1;
    if (!k->lfs) { /* git's blob id: SHA-1 of "blob <size>\0" and the bytes */
        char pre[48];
        const int n = snprintf(pre, sizeof pre, "blob %lld", k->expect);
        if (!EVP_DigestUpdate(k->md, pre, (size_t)n + 1)) return -1;
    }
    return 0;
}

static size_t to_blob(char *p, size_t sz, size_t n, void *u) {
    sink *k = u;
    hub *h = k->h;
    const size_t len = sz * n;
    if (!k->checked) {
        k->checked = 1;
        curl_easy_getinfo(h->c, CURLINFO_RESPONSE_CODE, &k->code);
        if (k->code == 206) {
            const char *cr = header(h, "Content-Range");
            long long a = -1;
            if (!cr || sscanf(cr, "bytes %lld-", &a) != 1 || a != k->have) {
                snprintf(k->why, sizeof k->why, "a 206 reply for bytes %lld- that does not start there", k->have);
                k->refused = 1;
                return 0;
            }
        } else if (k->code == 200) {
            if (k->have > 0) { /* the Range was ignored: start again */
                if (ftruncate(k->fd, 0) || lseek(k->fd, 0, SEEK_SET) != 0 || digest_begin(k)) {
                    k->io_errno = errno;
                    return 0;
                }
                k->have = k->start = 0;
                h->have = 0;
            }
        } else {
            k->refused = 1;
            return 0;
        }
    }
    if ((long long)len > k->expect - k->have) { /* counted before it is written */
        k->over = 1;
        return 0;
    }
    for (size_t off = 0; off < len;) {
        const ssize_t w = write(k->fd, p + off, len - off);
        if (w < 0) {
            if (errno == EINTR) continue;
            k->io_errno = errno;
            return 0;
        }
        off += (size_t)w;
    }
    EVP_DigestUpdate(k->md, p, len);
    k->have += (long long)len;
    h->have = k->have;
    return len;
}

static ma_status link_pointer(hub *h, const hub_file *f, const char *etag, ma_error *err) {
    char ptr[PATH_MAX], dir[PATH_MAX], target[PATH_MAX], tmp[PATH_MAX];
    ma_status s = pathf(ptr, sizeof ptr, err, "%s/snapshots/%s/%s", h->repo_dir, h->commit, f->path);
    if (s) return s;
    snprintf(dir, sizeof dir, "%s", ptr);
    *strrchr(dir, '/') = '\0';
    if (mkdirs(dir)) return ma_fail(err, MA_ERR_IO, "%s: %s", dir, strerror(errno));
    size_t k = 0;
    for (const char *p = f->path; (p = strchr(p, '/')); p++) k++;
    int w = 0;
    for (size_t i = 0; i < k + 2; i++) w += snprintf(target + w, sizeof target - (size_t)w, "../");
    snprintf(target + w, sizeof target - (size_t)w, "blobs/%s", etag);
    char cur[PATH_MAX];
    const ssize_t r = readlink(ptr, cur, sizeof cur - 1);
    if (r >= 0) {
        cur[r] = '\0';
        if (!strcmp(cur, target)) return MA_OK;
    }
    if ((s = pathf(tmp, sizeof tmp, err, "%s.%ld.link", ptr, (long)getpid()))) return s;
    unlink(tmp);
    if (symlink(target, tmp) || rename(tmp, ptr)) {
        const int e = errno;
        unlink(tmp);
        return ma_fail(err, MA_ERR_IO, "%s: %s", ptr, strerror(e));
    }
    return MA_OK;
}

/* HEAD of the file's resolve URL: its etag, size and where its body is */
static ma_status file_meta(hub *h, const hub_file *f, char *etag, char *loc, size_t loc_cap, ma_error *err) {
    char q[3200], url[4096], what[1200], e[200];
    ma_status s = quote_path(h, f->path, q, sizeof q, err);
    if (s) return s;
    snprintf(url, sizeof url, "%s/%s/resolve/%s/%s", h->o->endpoint, h->o->repo, h->commit, q);
    snprintf(what, sizeof what, "%s (%s)", clean(f->path, e, sizeof e), h->o->repo);
    long code = 0;
    loc[0] = '\0';
    if ((s = request(h, url, 1, NULL, &code, loc, loc_cap, err))) return s;
    if (code >= 400 || code < 200) return http_fail(h, code, what, err);
    const char *rc = header(h, "X-Repo-Commit"), *le = header(h, "X-Linked-Etag"), *et = header(h, "ETag");
    const char *ls = header(h, "X-Linked-Size"), *cl = header(h, "Content-Length");
    if (!rc) return ma_fail(err, MA_ERR_FORMAT, "%s: the reply has no X-Repo-Commit (is %s a Hugging Face Hub?)", what, h->o->endpoint);
    if (strcmp(rc, h->commit))
        return ma_fail(err, MA_ERR_FORMAT, "%s: X-Repo-Commit %s, but the revision resolved to %s", what, clean(rc, e, sizeof e),
                       h->commit);
    const char *tag = le ? le : et;
    if (!tag) return ma_fail(err, MA_ERR_FORMAT, "%s: the reply has neither X-Linked-Etag nor ETag", what);
    if (!strncmp(tag, "W/", 2)) tag += 2; /* huggingface_hub's _normalize_etag */
    char t[80];
    size_t n = strlen(tag);
    if (n >= 2 && tag[0] == '"' && tag[n - 1] == '"') tag++, n -= 2;
    snprintf(t, sizeof t, "%.*s", (int)(n < 79 ? n : 79), tag);
    const char *sz = ls ? ls : (code >= 300 ? NULL : cl);
    char *end = NULL;
    const long long size = sz ? strtoll(sz, &end, 10) : -1;
    if (!sz || end == sz || *end || size < 0)
        return ma_fail(err, MA_ERR_FORMAT, "%s: the reply gives no size (X-Linked-Size or Content-Length)", what);
    /* the listing and the HEAD must name the same bytes */
    const char *want = f->lfs_oid ? f->lfs_oid : f->oid;
    const long long want_size = f->lfs_oid ? f->lfs_size : f->size;
    if (strcmp(t, want) || size != want_size)
        return ma_fail(err, MA_ERR_FORMAT, "%s: the file list says %s (%lld bytes), the file's HEAD %s (%lld bytes)", what, want, want_size,
                       clean(t, e, sizeof e), size);
    if (!hexn(t, f->lfs_oid ? 64 : 40))
        return ma_fail(err, MA_ERR_FORMAT, "%s: etag %s is not %d hex digits", what, clean(t, e, sizeof e), f->lfs_oid ? 64 : 40);
    snprintf(etag, 65, "%s", t);
    if (!loc[0]) snprintf(loc, loc_cap, "%s", url);
    return MA_OK;
}

/* the body into blobs/<etag>.incomplete (resumed), checked, renamed to blobs/<etag> */
/* *bad_digest: the body was fetched whole and did not match (then the partial file is gone);
 * *from_disk: bytes an earlier run left were part of it */
static ma_status fetch_blob(hub *h, const hub_file *f, const char *etag, const char *url, const char *blob, int *bad_digest, int *from_disk,
                            ma_error *err) {
    char part[PATH_MAX], e[200], ebuf[CURL_ERROR_SIZE];
    *bad_digest = *from_disk = 0;
    ma_status s = pathf(part, sizeof part, err, "%s.incomplete", blob);
    if (s) return s;
    /* never through a symlink someone left in a shared cache */
    const int fd = open(part, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return ma_fail(err, MA_ERR_IO, "%s: %s", part, errno == ELOOP ? "a symbolic link (not followed)" : strerror(errno));
    sink k = {.h = h, .fd = fd, .lfs = f->lfs_oid != NULL};
    k.expect = k.lfs ? f->lfs_size : f->size;
    k.type = k.lfs ? EVP_sha256() : EVP_sha1();
    k.md = EVP_MD_CTX_new();
    struct stat st;
    if (!k.md || fstat(fd, &st)) {
        s = ma_fail(err, MA_ERR_IO, "%s: %s", part, k.md ? strerror(errno) : "out of memory");
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        s = ma_fail(err, MA_ERR_IO, "%s: not a regular file", part);
        goto out;
    }
    if (st.st_size > k.expect && ftruncate(fd, 0)) {
        s = ma_fail(err, MA_ERR_IO, "%s: %s", part, strerror(errno));
        goto out;
    }
    if (digest_begin(&k)) {
        s = ma_fail(err, MA_ERR_IO, "the digest could not start");
        goto out;
    }
    /* what an earlier try left: hashed again, then resumed after it */
    char buf[1 << 16];
    for (;;) {
        const ssize_t r = read(fd, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            s = ma_fail(err, MA_ERR_IO, "%s: %s", part, strerror(errno));
            goto out;
        }
        if (r == 0) break;
        EVP_DigestUpdate(k.md, buf, (size_t)r);
        k.have += r;
    }
    *from_disk = k.have > 0;
    if (k.have && !h->o->quiet)
        fprintf(stderr, "%spull: %s: resuming after %lld of %lld bytes (%s)\n", h->o->tty ? "\r\033[K" : "", clean(f->path, e, sizeof e),
                k.have, k.expect, part);
    for (int attempt = 0;; attempt++) {
        if (k.have == k.expect) break;
        struct curl_slist *hdrs;
        if (reset(h, url, &hdrs, 0)) {
            curl_slist_free_all(hdrs);
            s = ma_fail(err, MA_ERR_IO, "this libcurl refuses to limit a request to http and https (7.85 or newer is needed)");
            goto out;
        }
        char range[48];
        snprintf(range, sizeof range, "%lld-", k.have);
        ebuf[0] = '\0';
        curl_easy_setopt(h->c, CURLOPT_ERRORBUFFER, ebuf);
        curl_easy_setopt(h->c, CURLOPT_FOLLOWLOCATION, 1L);
        curl_easy_setopt(h->c, CURLOPT_MAXREDIRS, (long)REDIRECTS_MAX);
        if (k.have) curl_easy_setopt(h->c, CURLOPT_RANGE, range);
        curl_easy_setopt(h->c, CURLOPT_WRITEFUNCTION, to_blob);
        curl_easy_setopt(h->c, CURLOPT_WRITEDATA, &k);
        curl_easy_setopt(h->c, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(h->c, CURLOPT_XFERINFOFUNCTION, xferinfo);
        curl_easy_setopt(h->c, CURLOPT_XFERINFODATA, h);
        k.start = k.have;
        k.checked = k.refused = k.over = k.io_errno = 0;
        k.code = 0;
        k.why[0] = '\0';
        h->have = k.have;
        const CURLcode rc = curl_easy_perform(h->c);
        curl_slist_free_all(hdrs);
        long code = k.code;
        if (!code) curl_easy_getinfo(h->c, CURLINFO_RESPONSE_CODE, &code);
        if (k.over) {
            s = ma_fail(err, MA_ERR_FORMAT, "%s: the server sent more than the %lld bytes the Hub's metadata gives",
                        clean(f->path, e, sizeof e), k.expect);
            if (ftruncate(fd, 0)) {}
            goto out;
        }
        if (k.io_errno) {
            s = ma_fail(err, MA_ERR_IO, "%s: %s", part, strerror(k.io_errno));
            goto out;
        }
        if (!rc && k.have == k.expect) break;
        if (k.why[0]) {
            s = ma_fail(err, MA_ERR_FORMAT, "%s: %s", clean(f->path, e, sizeof e), k.why);
            goto out;
        }
        if (code == 416 && k.have > 0 && attempt < h->o->retries) { /* the server has no such range: from the start */
            if (ftruncate(fd, 0) || lseek(fd, 0, SEEK_SET) != 0 || digest_begin(&k)) {
                s = ma_fail(err, MA_ERR_IO, "%s: %s", part, strerror(errno));
                goto out;
            }
            k.have = 0;
            *from_disk = 0;
            continue;
        }
        const int http_err = code >= 400 || (k.refused && code);
        const int transient = http_err ? (code == 408 || code == 429 || code >= 500) : 1;
        if (!transient || attempt >= h->o->retries) {
            char what[400];
            snprintf(what, sizeof what, "%s (%s), after %lld of %lld bytes", clean(f->path, e, sizeof e), h->o->repo, k.have, k.expect);
            if (http_err) s = http_fail(h, code, what, err);
            else if (rc) s = curl_fail(rc, what, ebuf, err);
            else s = ma_fail(err, MA_ERR_IO, "%s: the body ended early", what);
            if (k.have && code != 416) ma_error_wrap(err, s, "%s is kept: the same command resumes it", part);
            else if (ftruncate(fd, 0)) {}
            goto out;
        }
        const unsigned pause = attempt < 4 ? 1u << attempt : 8u;
        if (!h->o->quiet)
            fprintf(stderr, "%spull: %s: %s after %lld of %lld bytes; trying again in %u s\n", h->o->tty ? "\r\033[K" : "",
                    clean(f->path, e, sizeof e), rc ? curl_easy_strerror(rc) : "HTTP error", k.have, k.expect, pause);
        sleep(pause);
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned mdl = 0;
    char hex[2 * EVP_MAX_MD_SIZE + 1];
    EVP_DigestFinal_ex(k.md, md, &mdl);
    for (unsigned i = 0; i < mdl; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
    if (strcmp(hex, etag)) {
        s = ma_fail(err, MA_ERR_FORMAT,
                    "%s (%s): the body's %s is %s, but the Hub's etag is %s: not kept (a corrupt download or a server fault)",
                    clean(f->path, e, sizeof e), h->o->repo, k.lfs ? "SHA-256" : "git blob SHA-1", hex, etag);
        if (ftruncate(fd, 0)) {}
        close(fd);
        unlink(part);
        EVP_MD_CTX_free(k.md);
        *bad_digest = 1;
        return s;
    }
    if (fsync(fd) || close(fd)) {
        s = ma_fail(err, MA_ERR_IO, "%s: %s", part, strerror(errno));
        EVP_MD_CTX_free(k.md);
        return s;
    }
    EVP_MD_CTX_free(k.md);
    if (rename(part, blob)) return ma_fail(err, MA_ERR_IO, "%s: %s", blob, strerror(errno));
    return MA_OK;
out:
    close(fd);
    EVP_MD_CTX_free(k.md);
    return s;
}

/* the size of a regular file at path (a symlink is not followed: -1, as for none) */
static long long file_bytes(const char *path) {
    struct stat st;
    return lstat(path, &st) || !S_ISREG(st.st_mode) ? -1 : (long long)st.st_size;
}

static ma_status pull_file(hub *h, const hub_file *f, ma_error *err) {
    char etag[65], loc[4096], blob[PATH_MAX], lock[PATH_MAX], e[200];
    ma_status s = file_meta(h, f, etag, loc, sizeof loc, err);
    if (s) return s;
    if ((s = pathf(blob, sizeof blob, err, "%s/blobs/%s", h->repo_dir, etag))) return s;
    if ((s = pathf(lock, sizeof lock, err, "%s/%s.lock", h->lock_dir, etag))) return s;
    const int lfd = open(lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (lfd < 0) return ma_fail(err, MA_ERR_IO, "%s: %s", lock, strerror(errno));
    if (flock(lfd, LOCK_EX | LOCK_NB)) {
        if (!h->o->quiet) fprintf(stderr, "pull: %s: another download holds %s; waiting\n", clean(f->path, e, sizeof e), lock);
        while (flock(lfd, LOCK_EX) && errno == EINTR) {}
    }
    const long long want = f->lfs_oid ? f->lfs_size : f->size;
    const long long have = file_bytes(blob);
    if (have != want) {
        if (have >= 0) unlink(blob); /* a blob of the wrong size is not this etag's */
        h->name = f->path;
        int bad = 0, from_disk = 0;
        s = fetch_blob(h, f, etag, loc, blob, &bad, &from_disk, err);
        if (s && bad && from_disk) { /* what an earlier run left was wrong: once more from the start */
            if (!h->o->quiet) fprintf(stderr, "pull: %s: %s; fetching it again from the start\n", clean(f->path, e, sizeof e), err->msg);
            s = fetch_blob(h, f, etag, loc, blob, &bad, &from_disk, err);
        }
        if (!s) h->done += want;
    }
    if (!s) s = link_pointer(h, f, etag, err);
    flock(lfd, LOCK_UN);
    close(lfd);
    return s;
}

/* ----------------------------------------------------------------------------------- pull */

static ma_status check_space(hub *h, long long need, const char *dir, ma_error *err) {
    struct statvfs v;
    if (statvfs(dir, &v)) return MA_OK; /* unknown: the writes will say */
    const double free_b = (double)v.f_bavail * (double)v.f_frsize, keep = h->o->min_free_mb * 1048576.0;
    if ((double)need + keep > free_b) {
        char a[32], b[32];
        human((double)need, a, sizeof a);
        human(free_b, b, sizeof b);
        return ma_fail(err, MA_ERR_IO, "%s needs %s more on %s, which has %s free (and %.0f MB are kept free): nothing was downloaded",
                       h->o->repo, a, dir, b, h->o->min_free_mb);
    }
    return MA_OK;
}

static ma_status pull(hub *h, char *snapshot, size_t cap, ma_error *err) {
    const ma_pull_opts *o = h->o;
    const char *why = ma_repo_id_problem(o->repo);
    char e[200];
    if (why || !strchr(o->repo, '/'))
        return ma_fail(err, MA_ERR_ARG, "\"%s\" is not a repo id (ORG/NAME): %s", clean(o->repo, e, sizeof e), why ? why : "no '/'");
    const char *rev = o->revision && *o->revision ? o->revision : "main";
    if ((why = ma_hub_revision_problem(rev))) return ma_fail(err, MA_ERR_ARG, "revision \"%s\": %s", clean(rev, e, sizeof e), why);
    if (!o->cache || !*o->cache)
        return ma_fail(err, MA_ERR_ARG, "no Hugging Face cache directory is known (set HF_HUB_CACHE or HOME, or give --cache-dir)");
    char flat[300];
    snprintf(flat, sizeof flat, "models--%s", o->repo);
    char *slash = strchr(flat, '/');
    memmove(slash + 2, slash + 1, strlen(slash + 1) + 1);
    slash[0] = slash[1] = '-';
    ma_status s = pathf(h->repo_dir, sizeof h->repo_dir, err, "%s/%s", o->cache, flat);
    if (!s) s = pathf(h->lock_dir, sizeof h->lock_dir, err, "%s/.locks/%s", o->cache, flat);
    if (s) return s;
    if (hexn(rev, 40)) snprintf(h->commit, sizeof h->commit, "%s", rev);
    else if ((s = resolve_commit(h, rev, err))) return s;
    if ((s = list_files(h, err))) return s;
    int want = 0;
    for (int i = 0; i < h->n; i++) {
        h->f[i].want = included(o, h->f[i].path);
        if (!h->f[i].want) continue;
        if ((why = ma_hub_path_problem(h->f[i].path)))
            return ma_fail(err, MA_ERR_FORMAT, "%s lists a file named \"%s\": %s (refused)", o->repo, clean(h->f[i].path, e, sizeof e),
                           why);
        const char *id = h->f[i].lfs_oid ? h->f[i].lfs_oid : h->f[i].oid;
        if (!hexn(id, h->f[i].lfs_oid ? 64 : 40))
            return ma_fail(err, MA_ERR_FORMAT, "%s: %s has the id \"%s\", not %d hex digits", o->repo, h->f[i].path, clean(id, e, sizeof e),
                           h->f[i].lfs_oid ? 64 : 40);
        want++;
    }
    if (!want) return ma_fail(err, MA_ERR_ARG, "%s at %s: none of its %d files matches --include", o->repo, h->commit, h->n);
    char blobs[PATH_MAX], snap[PATH_MAX], tag[PATH_MAX];
    if ((s = pathf(blobs, sizeof blobs, err, "%s/blobs", h->repo_dir))) return s;
    if ((s = pathf(snap, sizeof snap, err, "%s/snapshots/%s", h->repo_dir, h->commit))) return s;
    if (mkdirs(blobs) || mkdirs(snap) || mkdirs(h->lock_dir))
        return ma_fail(err, MA_ERR_IO, "cannot create the cache entry %s: %s", h->repo_dir, strerror(errno));
    /* the bytes still to fetch (each blob once), against the free space, before the first byte */
    long long need = 0;
    h->total = 0;
    const hub_file **by_id = malloc(sizeof *by_id * (size_t)want);
    if (!by_id) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
    int nw = 0;
    for (int i = 0; i < h->n; i++)
        if (h->f[i].want) by_id[nw++] = &h->f[i];
    qsort(by_id, (size_t)nw, sizeof *by_id, cmp_id);
    for (int i = 0; i < nw && !s; i++) {
        const hub_file *f = by_id[i];
        const long long size = f->lfs_oid ? f->lfs_size : f->size;
        if (i > 0 && !strcmp(file_id(f), file_id(by_id[i - 1]))) { /* the same bytes at another path: fetched once */
            const hub_file *g = by_id[i - 1];
            if (size != (g->lfs_oid ? g->lfs_size : g->size))
                s = ma_fail(err, MA_ERR_FORMAT, "%s lists %s and %s with the same id %s but different sizes (refused)", o->repo,
                            clean(f->path, e, sizeof e), g->path, file_id(f));
            continue;
        }
        char b[PATH_MAX], p[PATH_MAX];
        if ((s = pathf(b, sizeof b, err, "%s/%s", blobs, file_id(f))) ||
            (s = pathf(p, sizeof p, err, "%s/%s.incomplete", blobs, file_id(f))))
            break;
        if (file_bytes(b) == size) continue;
        const long long part = file_bytes(p);
        if (size > (long long)1e18 - need) s = ma_fail(err, MA_ERR_RANGE, "%s: more than 1 EB to download (refused)", o->repo);
        need += size - (part > 0 && part <= size ? part : 0);
        h->total += size;
    }
    free(by_id);
    if (s) return s;
    if ((s = check_space(h, need, blobs, err))) return s;
    if ((s = pathf(tag, sizeof tag, err, "%s/CACHEDIR.TAG", o->cache))) return s;
    if (file_bytes(tag) < 0)
        write_atomic(tag,
                     "Signature: 8a477f597d28d172789f06886806bc55\n"
                     "# The Hugging Face hub cache (written by molmoact pull): backup tools may skip it.\n"
                     "# About cache directory tags: https://bford.info/cachedir/\n",
                     err);
    if (strcmp(rev, h->commit)) {
        char ref[PATH_MAX], rdir[PATH_MAX];
        if ((s = pathf(ref, sizeof ref, err, "%s/refs/%s", h->repo_dir, rev))) return s;
        snprintf(rdir, sizeof rdir, "%s", ref);
        *strrchr(rdir, '/') = '\0';
        if (mkdirs(rdir)) return ma_fail(err, MA_ERR_IO, "%s: %s", rdir, strerror(errno));
        if ((s = write_atomic(ref, h->commit, err))) return s;
    }
    if ((s = write_tree_cache(h, err))) return s;
    if (!o->quiet) {
        char a[32];
        human((double)need, a, sizeof a);
        fprintf(stderr, "pull: %s at %s (%s): %d of %d files, %s to download into %s\n", o->repo, h->commit, rev, want, h->n, a,
                h->repo_dir);
    }
    h->t0 = now_s();
    h->count = want;
    h->index = 0;
    for (int i = 0; i < h->n && !s; i++) {
        if (!h->f[i].want) continue;
        h->index++;
        s = pull_file(h, &h->f[i], err);
    }
    if (!o->quiet) {
        if (!s) progress_line(h, 0, 1);
        if (o->tty) fputc('\n', stderr);
    }
    if (!s) snprintf(snapshot, cap, "%s", snap);
    return s;
}

ma_status ma_hub_pull(const ma_pull_opts *o, char *snapshot, size_t cap, ma_error *err) {
    hub h;
    memset(&h, 0, sizeof h);
    h.o = o;
    if (curl_global_init(CURL_GLOBAL_DEFAULT)) return ma_fail(err, MA_ERR_IO, "libcurl could not start");
    h.c = curl_easy_init();
    CURLU *u = curl_url();
    ma_status s = MA_OK;
    char e[200];
    if (!h.c || !u) s = ma_fail(err, MA_ERR_NOMEM, "out of memory");
    else if (curl_url_set(u, CURLUPART_URL, o->endpoint, 0) || curl_url_get(u, CURLUPART_SCHEME, &h.scheme, 0) ||
             curl_url_get(u, CURLUPART_HOST, &h.host, 0) || curl_url_get(u, CURLUPART_PORT, &h.port, CURLU_DEFAULT_PORT) ||
             (strcmp(h.scheme, "https") && strcmp(h.scheme, "http")))
        s = ma_fail(err, MA_ERR_ARG, "the endpoint \"%s\" is not an http:// or https:// URL", clean(o->endpoint, e, sizeof e));
    if (!s) s = pull(&h, snapshot, cap, err);
    for (int i = 0; i < h.n; i++) free(h.f[i].path), free(h.f[i].oid), free(h.f[i].lfs_oid), free(h.f[i].xet);
    free(h.f);
    curl_free(h.scheme);
    curl_free(h.host);
    curl_free(h.port);
    curl_url_cleanup(u);
    curl_easy_cleanup(h.c);
    curl_global_cleanup();
    return s;
}
