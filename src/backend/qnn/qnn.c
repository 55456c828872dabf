/* SPDX-License-Identifier: Apache-2.0 */
#define _GNU_SOURCE
#include "backend/qnn/qnn.h"

#include <cjson/cJSON.h>
#include <dlfcn.h>
#include <errno.h>
#include <unistd.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <elf.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/qnn/qnn_abi.h"
#include "core/half.h"
#include "io/jsonline.h"
#include "io/mapfile.h"
#include "model/checkpoint.h"

/* ------------------------------------------------------------------ the process's QNN state
 * One backend, device and log per process, shared by its sessions (the action worker holds two)
 * and torn down, in order, with the last of them. */
static struct {
    pthread_mutex_t mu;
    int refs;
    void *lib_htp, *lib_sys;
    const qnn_interface *qi;
    const qnn_system_interface *qs;
    qnn_handle log, backend, device;
    char htp_path[1024];
} G = {PTHREAD_MUTEX_INITIALIZER, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, {0}};

static void log_cb(const char *fmt, uint32_t level, uint64_t ts, va_list args) {
    (void)ts;
    if (level > 2) return; /* errors and warnings */
    fprintf(stderr, "qnn %s: ", level == 1 ? "error" : "warning");
    vfprintf(stderr, fmt, args);
    if (!*fmt || fmt[strlen(fmt) - 1] != '\n') fputc('\n', stderr);
}

/* "QnnX_y on FILE: error N: the library's text" */
static ma_status qfail(ma_error *err, const char *fn, const char *file, qnn_err_t e) {
    const char *msg = NULL;
    if (G.qi && G.qi->t.error_get_message && G.qi->t.error_get_message(e, &msg) != QNN_OK) msg = NULL;
    return ma_fail(err, MA_ERR_IO, "%s on %s: error %u%s%s", fn, file, QNN_CODE(e), msg && *msg ? ": " : "", msg && *msg ? msg : "");
}

/* A library file is checked before dlopen maps it: the loader reads its headers and segments
 * through a mapping, so a truncated file kills the process with SIGBUS instead of failing. The
 * ELF header, the program headers and every segment's bytes must lie within the file, for this
 * machine's class and architecture. */
static ma_status check_elf(const char *path, ma_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ma_fail(err, MA_ERR_IO, "qnn: cannot load %s (%s)%s", path, strerror(errno), errno == ENOENT ? "; check --qnn-lib-dir" : "");
    struct stat st;
    Elf64_Ehdr eh;
    const char *why = NULL;
    char buf[160];
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) why = "not a regular file";
    else if (pread(fd, &eh, sizeof eh, 0) != (ssize_t)sizeof eh || memcmp(eh.e_ident, ELFMAG, SELFMAG)) why = "not an ELF file";
    else if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_ident[EI_DATA] != ELFDATA2LSB) why = "not a 64-bit little-endian ELF file";
#if defined(__aarch64__)
    else if (eh.e_machine != EM_AARCH64) why = "built for another architecture (not aarch64)";
#elif defined(__x86_64__)
    else if (eh.e_machine != EM_X86_64) why = "built for another architecture (not x86-64)";
#endif
    else if (eh.e_type != ET_DYN) why = "not a shared library";
    else if (eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum == 0 || eh.e_phoff > (uint64_t)st.st_size ||
             (uint64_t)eh.e_phnum * sizeof(Elf64_Phdr) > (uint64_t)st.st_size - eh.e_phoff)
        why = "truncated or malformed (its program headers lie outside the file)";
    for (int i = 0; !why && i < eh.e_phnum; i++) {
        Elf64_Phdr ph;
        if (pread(fd, &ph, sizeof ph, (off_t)(eh.e_phoff + (uint64_t)i * sizeof ph)) != (ssize_t)sizeof ph) { why = "unreadable"; break; }
        if ((ph.p_type == PT_LOAD || ph.p_type == PT_DYNAMIC) &&
            (ph.p_offset > (uint64_t)st.st_size || ph.p_filesz > (uint64_t)st.st_size - ph.p_offset)) {
            snprintf(buf, sizeof buf, "truncated: a segment ends at byte %llu of %lld", (unsigned long long)(ph.p_offset + ph.p_filesz),
                     (long long)st.st_size);
            why = buf;
        }
    }
    close(fd);
    return why ? ma_fail(err, MA_ERR_FORMAT, "qnn: %s is %s", path, why) : MA_OK;
}

static void *open_lib(const char *name, char *path, size_t cap, ma_error *err, ma_status *st) {
    const char *dir = getenv("MOLMOACT_QNN_LIB_DIR");
    if (dir && *dir) snprintf(path, cap, "%s/%s", dir, name);
    else snprintf(path, cap, "%s", name);
    if (strchr(path, '/') && (*st = check_elf(path, err))) return NULL;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        *st = ma_fail(err, MA_ERR_IO, "qnn: cannot load %s (%s)%s", path, why ? why : "unknown reason",
                      dir && *dir ? "" : "; set --qnn-lib-dir or LD_LIBRARY_PATH to the QNN libraries");
    }
    return h;
}

static void global_release_locked(void) {
    if (--G.refs > 0) return;
    if (G.qi) {
        if (G.device && G.qi->t.device_free) G.qi->t.device_free(G.device);
        if (G.backend && G.qi->t.backend_free) G.qi->t.backend_free(G.backend);
        if (G.log && G.qi->t.log_free) G.qi->t.log_free(G.log);
    }
    if (G.lib_sys) dlclose(G.lib_sys);
    if (G.lib_htp) dlclose(G.lib_htp);
    G.lib_sys = G.lib_htp = NULL;
    G.qi = NULL;
    G.qs = NULL;
    G.log = G.backend = G.device = NULL;
    G.refs = 0;
}

static int env_u32(const char *name, uint32_t *v) {
    const char *e = getenv(name);
    if (!e || !*e) return 0;
    char *end;
    unsigned long x = strtoul(e, &end, 10);
    if (*end || x > 0xffffffffUL) return -1;
    *v = (uint32_t)x;
    return 1;
}

static ma_status global_acquire(ma_error *err) {
    pthread_mutex_lock(&G.mu);
    if (G.refs++ > 0) { pthread_mutex_unlock(&G.mu); return MA_OK; }
    ma_status st = MA_OK;
    char sys_path[1024];
    qnn_err_t e;
    if (!(G.lib_htp = open_lib("libQnnHtp.so", G.htp_path, sizeof G.htp_path, err, &st))) goto fail;
    qnn_get_providers_fn getp;
    *(void **)&getp = dlsym(G.lib_htp, "QnnInterface_getProviders");
    if (!getp) { st = ma_fail(err, MA_ERR_IO, "qnn: %s does not export QnnInterface_getProviders", G.htp_path); goto fail; }
    const qnn_interface **prov = NULL;
    uint32_t n = 0;
    if ((e = getp(&prov, &n)) != QNN_OK || !prov || !n) {
        st = ma_fail(err, MA_ERR_IO, "qnn: QnnInterface_getProviders of %s: error %u, %u providers", G.htp_path, QNN_CODE(e), n);
        goto fail;
    }
    char seen[256] = "";
    for (uint32_t i = 0; i < n; i++) {
        const qnn_api_version *v = &prov[i]->api_version;
        snprintf(seen + strlen(seen), sizeof seen - strlen(seen), "%s%u.%u.%u", i ? ", " : "", v->core.major, v->core.minor, v->core.patch);
        if (v->core.major == MA_QNN_CORE_MAJOR && v->core.minor >= MA_QNN_CORE_MIN_MINOR && !G.qi) G.qi = prov[i];
    }
    if (!G.qi) {
        st = ma_fail(err, MA_ERR_IO, "qnn: %s provides QNN API %s; molmoact needs %u.%u or newer within %u.x", G.htp_path, seen,
                     MA_QNN_CORE_MAJOR, MA_QNN_CORE_MIN_MINOR, MA_QNN_CORE_MAJOR);
        goto fail;
    }
    const qnn_interface_table *t = &G.qi->t;
    if (!t->backend_create || !t->backend_free || !t->context_create_from_binary || !t->context_free || !t->graph_retrieve ||
        !t->graph_execute) {
        st = ma_fail(err, MA_ERR_IO, "qnn: %s lacks a function molmoact needs (backendCreate, contextCreateFromBinary, graphRetrieve, graphExecute)", G.htp_path);
        goto fail;
    }
    if (!(G.lib_sys = open_lib("libQnnSystem.so", sys_path, sizeof sys_path, err, &st))) goto fail;
    qnn_system_get_providers_fn gets;
    *(void **)&gets = dlsym(G.lib_sys, "QnnSystemInterface_getProviders");
    if (!gets) { st = ma_fail(err, MA_ERR_IO, "qnn: %s does not export QnnSystemInterface_getProviders", sys_path); goto fail; }
    const qnn_system_interface **sprov = NULL;
    n = 0;
    if ((e = gets(&sprov, &n)) != QNN_OK || !sprov || !n) {
        st = ma_fail(err, MA_ERR_IO, "qnn: QnnSystemInterface_getProviders of %s: error %u, %u providers", sys_path, QNN_CODE(e), n);
        goto fail;
    }
    seen[0] = 0;
    for (uint32_t i = 0; i < n; i++) {
        const qnn_version *v = &sprov[i]->api_version;
        snprintf(seen + strlen(seen), sizeof seen - strlen(seen), "%s%u.%u.%u", i ? ", " : "", v->major, v->minor, v->patch);
        if (v->major == MA_QNN_SYSTEM_MAJOR && !G.qs) G.qs = sprov[i];
    }
    if (!G.qs || !G.qs->t.context_create || !G.qs->t.context_get_binary_info || !G.qs->t.context_free) {
        st = ma_fail(err, MA_ERR_IO, "qnn: %s provides QNN system API %s; molmoact needs %u.x", sys_path, seen, MA_QNN_SYSTEM_MAJOR);
        goto fail;
    }
    if (t->log_create && (e = t->log_create(log_cb, 2, &G.log)) != QNN_OK) { st = qfail(err, "QnnLog_create", G.htp_path, e); goto fail; }
    if ((e = t->backend_create(G.log, NULL, &G.backend)) != QNN_OK) { st = qfail(err, "QnnBackend_create", G.htp_path, e); goto fail; }
    if (t->device_create) {
        uint32_t soc = 0, arch = 0;
        int has_soc = env_u32("MOLMOACT_QNN_SOC", &soc), has_arch = env_u32("MOLMOACT_QNN_ARCH", &arch);
        if (has_soc < 0 || has_arch < 0) { st = ma_fail(err, MA_ERR_ARG, "MOLMOACT_QNN_SOC / MOLMOACT_QNN_ARCH must be unsigned integers"); goto fail; }
        qnn_htp_device_config hs = {QNN_HTP_DEVICE_CONFIG_SOC, {.soc_model = soc}};
        qnn_htp_device_config ha = {QNN_HTP_DEVICE_CONFIG_ARCH, {.arch = {0, arch}}};
        qnn_device_config cs = {QNN_DEVICE_CONFIG_CUSTOM, &hs}, ca = {QNN_DEVICE_CONFIG_CUSTOM, &ha};
        const qnn_device_config *cfg[3] = {NULL, NULL, NULL};
        int k = 0;
        if (has_soc) cfg[k++] = &cs;
        if (has_arch) cfg[k++] = &ca;
        if ((e = t->device_create(G.log, k ? cfg : NULL, &G.device)) != QNN_OK) { st = qfail(err, "QnnDevice_create", G.htp_path, e); goto fail; }
    }
    pthread_mutex_unlock(&G.mu);
    return MA_OK;
fail:
    global_release_locked();
    pthread_mutex_unlock(&G.mu);
    return st;
}

static void global_release(void) {
    pthread_mutex_lock(&G.mu);
    global_release_locked();
    pthread_mutex_unlock(&G.mu);
}

/* ------------------------------------------------------------------ one session's graph */

typedef struct qtensor {
    char *name;
    uint32_t version;
    qnn_tensor desc; /* the graph's descriptor (name and dims pointing into this struct) */
    uint32_t dims[MA_MAX_DIMS];
    uint32_t rank, dtype;
    float scale;
    int32_t offset;
    size_t bytes;
    void *buf;
} qtensor;

typedef struct qnn_sess {
    char file[256];  /* ctx/... as the messages name it */
    char graph_name[128];
    qnn_handle context, graph;
    int n_in, n_out;
    qtensor in[MA_SESSION_MAX_IO], out[MA_SESSION_MAX_IO]; /* in our io order (bound) */
    qnn_tensor run_in[MA_SESSION_MAX_IO], run_out[MA_SESSION_MAX_IO];
} qnn_sess;

static const char *dt_name(uint32_t dt) {
    switch (dt) {
    case QNN_DT_FLOAT_32: return "float32";
    case QNN_DT_FLOAT_16: return "float16";
    case QNN_DT_UFIXED_8: return "ufixed8";
    case QNN_DT_UFIXED_16: return "ufixed16";
    case QNN_DT_SFIXED_8: return "sfixed8";
    case QNN_DT_SFIXED_16: return "sfixed16";
    case QNN_DT_INT_8: return "int8";
    case QNN_DT_INT_32: return "int32";
    case QNN_DT_INT_64: return "int64";
    case QNN_DT_UINT_8: return "uint8";
    case QNN_DT_UINT_32: return "uint32";
    case QNN_DT_BOOL_8: return "bool8";
    default: return NULL;
    }
}

static size_t dt_size(uint32_t dt) { return (dt & 0xff) == 0x08 ? 1 : (dt & 0xff) == 0x16 ? 2 : (dt & 0xff) == 0x32 ? 4 : (dt & 0xff) == 0x64 ? 8 : 0; }

static int is_fixed(uint32_t dt) { return dt == QNN_DT_UFIXED_8 || dt == QNN_DT_UFIXED_16 || dt == QNN_DT_SFIXED_8 || dt == QNN_DT_SFIXED_16; }

/* the graph types an io-spec type converts to and from */
static int convertible(ma_dtype ours, uint32_t dt) {
    if (!dt_name(dt)) return 0;
    if (ours == MA_DT_F32) return dt == QNN_DT_FLOAT_32 || dt == QNN_DT_FLOAT_16 || is_fixed(dt);
    return 1; /* masks and positions: integers, booleans or floats */
}

static void copy_desc(qtensor *q, const qnn_tensor *src) {
    const qnn_tensor_v1 *v = &src->u.v1; /* version 2 begins with version 1's fields */
    q->version = src->version;
    q->name = strdup(v->name ? v->name : "");
    q->rank = v->rank <= MA_MAX_DIMS ? v->rank : MA_MAX_DIMS + 1;
    for (uint32_t i = 0; i < v->rank && i < MA_MAX_DIMS; i++) q->dims[i] = v->dims ? v->dims[i] : 0;
    q->dtype = v->data_type;
    q->scale = 1.0f;
    q->offset = 0;
    if (v->quant.encoding == QNN_QENC_SCALE_OFFSET) { q->scale = v->quant.u.so.scale; q->offset = v->quant.u.so.offset; }
    else if (v->quant.encoding == QNN_QENC_BW_SCALE_OFFSET) { q->scale = v->quant.u.bw.scale; q->offset = v->quant.u.bw.offset; }
    memset(&q->desc, 0, sizeof q->desc);
    q->desc.version = src->version == 2 ? 2 : 1;
    if (src->version == 2) q->desc.u.v2 = src->u.v2;
    else q->desc.u.v1 = src->u.v1;
    q->desc.u.v1.name = q->name;
    q->desc.u.v1.dims = q->dims;
    if (q->desc.version == 2) {
        q->desc.u.v2.dynamic_dims = NULL;
        q->desc.u.v2.produced = 0;
    }
}

static void describe(char *out, size_t cap, const qtensor *q) {
    int n = snprintf(out, cap, "%s %s [", q->name, dt_name(q->dtype) ? dt_name(q->dtype) : "unsupported type");
    for (uint32_t i = 0; i < q->rank && i < MA_MAX_DIMS && n > 0 && (size_t)n < cap; i++)
        n += snprintf(out + n, cap - (size_t)n, "%s%u", i ? ", " : "", q->dims[i]);
    if (n > 0 && (size_t)n < cap) snprintf(out + n, cap - (size_t)n, "]");
}

static void describe_ours(char *out, size_t cap, const ma_io *io) {
    int n = snprintf(out, cap, "%s %s [", io->name, ma_dtype_name(io->dtype));
    for (int i = 0; i < io->ndim && n > 0 && (size_t)n < cap; i++) n += snprintf(out + n, cap - (size_t)n, "%s%lld", i ? ", " : "", (long long)io->shape[i]);
    if (n > 0 && (size_t)n < cap) snprintf(out + n, cap - (size_t)n, "]");
}

/* both sides of a binding, for the error message */
static void sides(char *out, size_t cap, const ma_io *ours, int n_ours, const qtensor *g, int n_g) {
    size_t n = (size_t)snprintf(out, cap, "ours:");
    char d[160];
    for (int i = 0; i < n_ours && n < cap; i++) { describe_ours(d, sizeof d, &ours[i]); n += (size_t)snprintf(out + n, cap - n, " %s;", d); }
    if (n < cap) n += (size_t)snprintf(out + n, cap - n, " graph:");
    for (int i = 0; i < n_g && n < cap; i++) { describe(d, sizeof d, &g[i]); n += (size_t)snprintf(out + n, cap - n, " %s;", d); }
}

static int shape_fits(const ma_io *io, const qtensor *q) {
    if ((int)q->rank != io->ndim) return 0;
    for (int i = 0; i < io->ndim; i++)
        if (io->shape[i] >= 0 && (uint32_t)io->shape[i] != q->dims[i]) return 0;
    return 1;
}

/* the io map's graph name for (session, tensor), NULL when the map does not name it */
static ma_status io_map(const char *session, cJSON **root, ma_error *err) {
    *root = NULL;
    const char *path = getenv("MOLMOACT_QNN_IO_MAP");
    if (!path || !*path) return MA_OK;
    char *text = NULL;
    size_t len = 0;
    ma_status st = ma_read_file(path, 1 << 20, &text, &len, err);
    if (st) return ma_error_wrap(err, st, "--qnn-io-map");
    st = ma_json_parse_object(text, len, path, root, err);
    free(text);
    if (st) return st;
    for (cJSON *s = (*root)->child; s; s = s->next) {
        int known = 0;
        for (int i = 0; i < 7; i++) known |= !strcmp(s->string, MA_SESSION_NAMES[i]);
        if (!known || !cJSON_IsObject(s)) {
            st = ma_fail(err, MA_ERR_FORMAT, "%s: \"%s\" is not a session (vision, llm_split0..3, action_context, action_step) with an object of names", path, s->string);
            break;
        }
        for (cJSON *e = s->child; e && !st; e = e->next)
            if (!cJSON_IsString(e)) st = ma_fail(err, MA_ERR_FORMAT, "%s: %s.%s must be a string (the graph's tensor name)", path, s->string, e->string);
    }
    (void)session;
    if (st) { cJSON_Delete(*root); *root = NULL; }
    return st;
}

/* bind our ios to graph tensors: io map, then names, then order and shape */
static ma_status bind(const char *session, const char *file, const ma_io *ours, int n_ours, const qtensor *g, int n_g,
                      const cJSON *map, int *idx, const char *what, ma_error *err) {
    char both[2048];
    if (n_ours != n_g) {
        sides(both, sizeof both, ours, n_ours, g, n_g);
        return ma_fail(err, MA_ERR_SHAPE, "%s (%s): the graph has %d %s, the session %d (%s)", file, session, n_g, what, n_ours, both);
    }
    const cJSON *sm = map ? cJSON_GetObjectItemCaseSensitive(map, session) : NULL;
    int by_name = 1;
    for (int i = 0; i < n_ours; i++) {
        const cJSON *m = sm ? cJSON_GetObjectItemCaseSensitive(sm, ours[i].name) : NULL;
        const char *want = m ? m->valuestring : ours[i].name;
        idx[i] = -1;
        for (int j = 0; j < n_g; j++)
            if (!strcmp(g[j].name, want)) idx[i] = j;
        if (idx[i] < 0 && m) {
            sides(both, sizeof both, ours, n_ours, g, n_g);
            return ma_fail(err, MA_ERR_SHAPE, "%s (%s): --qnn-io-map names %s for %s, the graph has no such tensor (%s)", file, session, want, ours[i].name, both);
        }
        if (idx[i] < 0) by_name = 0;
    }
    if (!by_name) /* by order, where every shape fits */
        for (int i = 0; i < n_ours; i++) idx[i] = i;
    for (int i = 0; i < n_ours; i++) {
        const qtensor *q = &g[idx[i]];
        if (!shape_fits(&ours[i], q) || !convertible(ours[i].dtype, q->dtype)) {
            sides(both, sizeof both, ours, n_ours, g, n_g);
            char a[160], b[160];
            describe_ours(a, sizeof a, &ours[i]);
            describe(b, sizeof b, q);
            return ma_fail(err, MA_ERR_SHAPE, "%s (%s): %s %s does not fit graph tensor %s (bound by %s; %s)", file, session, what,
                           a, b, by_name ? "name" : "order", both);
        }
    }
    return MA_OK;
}

static int expected_seq(void) {
    const char *e = getenv("MOLMOACT2_PROMPT_SEQ");
    if (!e || !*e) return 128;
    long v = strtol(e, NULL, 10);
    return v > 0 && v <= MA_MAX_PROMPT_SEQ ? (int)v : -1;
}

/* the -1 dimensions of the io spec take the graph's sizes; the same quantity must agree */
static ma_status fix_dims(ma_session *s, qnn_sess *q, ma_error *err) {
    int64_t S = -1;
    for (int side = 0; side < 2; side++) {
        ma_io *io = side ? s->out : s->in;
        qtensor *g = side ? q->out : q->in;
        int n = side ? s->n_out : s->n_in;
        for (int i = 0; i < n; i++)
            for (int d = 0; d < io[i].ndim; d++) {
                if (io[i].shape[d] >= 0) continue;
                io[i].shape[d] = g[i].dims[d];
                /* every dynamic dimension but vision's image count and the expert's horizon is S */
                const int is_seq = s->kind == MA_SESS_LLM || s->kind == MA_SESS_ACTION_CONTEXT ||
                                   (s->kind == MA_SESS_ACTION_STEP && strcmp(io[i].name, "x") && strcmp(io[i].name, "velocity"));
                if (!is_seq) continue;
                if (S < 0) S = io[i].shape[d];
                else if (S != io[i].shape[d])
                    return ma_fail(err, MA_ERR_SHAPE, "%s (%s): the graph's prompt lengths disagree (%lld and %lld at %s)", q->file, s->name,
                                   (long long)S, (long long)io[i].shape[d], io[i].name);
            }
    }
    if (S >= 0) {
        int want = expected_seq();
        if (S != want)
            return ma_fail(err, MA_ERR_SHAPE, "%s (%s): built for prompt length %lld, MOLMOACT2_PROMPT_SEQ is %d", q->file, s->name, (long long)S, want);
    }
    if (s->kind == MA_SESS_VISION && s->out[0].shape[0] != s->in[0].shape[0] * s->model->tokens_per_image)
        return ma_fail(err, MA_ERR_SHAPE, "%s (vision): %lld feature rows for %lld images of %d tokens", q->file, (long long)s->out[0].shape[0],
                       (long long)s->in[0].shape[0], s->model->tokens_per_image);
    if (s->kind == MA_SESS_ACTION_STEP && s->in[0].shape[0] != s->out[0].shape[0])
        return ma_fail(err, MA_ERR_SHAPE, "%s (action_step): x has %lld steps, velocity %lld", q->file, (long long)s->in[0].shape[0], (long long)s->out[0].shape[0]);
    return MA_OK;
}

/* ------------------------------------------------------------------ conversions */

static float fixed_get(uint32_t dt, const void *p, size_t i, float scale, int32_t offset) {
    double v;
    switch (dt) {
    case QNN_DT_UFIXED_8: v = ((const uint8_t *)p)[i]; break;
    case QNN_DT_UFIXED_16: v = ((const uint16_t *)p)[i]; break;
    case QNN_DT_SFIXED_8: v = ((const int8_t *)p)[i]; break;
    default: v = ((const int16_t *)p)[i]; break;
    }
    return (float)((v + offset) * scale);
}

static void fixed_put(uint32_t dt, void *p, size_t i, float x, float scale, int32_t offset) {
    double q = nearbyint((double)x / scale) - offset, lo, hi;
    switch (dt) {
    case QNN_DT_UFIXED_8: lo = 0; hi = 255; break;
    case QNN_DT_UFIXED_16: lo = 0; hi = 65535; break;
    case QNN_DT_SFIXED_8: lo = -128; hi = 127; break;
    default: lo = -32768; hi = 32767; break;
    }
    q = q < lo ? lo : q > hi ? hi : q;
    switch (dt) {
    case QNN_DT_UFIXED_8: ((uint8_t *)p)[i] = (uint8_t)q; break;
    case QNN_DT_UFIXED_16: ((uint16_t *)p)[i] = (uint16_t)q; break;
    case QNN_DT_SFIXED_8: ((int8_t *)p)[i] = (int8_t)q; break;
    default: ((int16_t *)p)[i] = (int16_t)q; break;
    }
}

/* one value of our tensor (f32, u8 or i64) as a double */
static double ours_get(const ma_tensor *t, size_t i) {
    switch (t->dtype) {
    case MA_DT_F32: return ((const float *)t->data)[i];
    case MA_DT_U8: return ((const uint8_t *)t->data)[i];
    default: return (double)((const int64_t *)t->data)[i];
    }
}

static void to_graph(const ma_tensor *t, qtensor *g) {
    const size_t n = (size_t)ma_tensor_numel(t);
    if (t->dtype == MA_DT_F32 && g->dtype == QNN_DT_FLOAT_32) { memcpy(g->buf, t->data, n * 4); return; }
    for (size_t i = 0; i < n; i++) {
        const double v = ours_get(t, i);
        switch (g->dtype) {
        case QNN_DT_FLOAT_32: ((float *)g->buf)[i] = (float)v; break;
        case QNN_DT_FLOAT_16: ((uint16_t *)g->buf)[i] = ma_f32_to_f16((float)v); break;
        case QNN_DT_UFIXED_8: case QNN_DT_UFIXED_16: case QNN_DT_SFIXED_8: case QNN_DT_SFIXED_16:
            fixed_put(g->dtype, g->buf, i, (float)v, g->scale, g->offset); break;
        case QNN_DT_INT_8: ((int8_t *)g->buf)[i] = (int8_t)v; break;
        case QNN_DT_UINT_8: case QNN_DT_BOOL_8: ((uint8_t *)g->buf)[i] = (uint8_t)v; break;
        case QNN_DT_INT_32: ((int32_t *)g->buf)[i] = (int32_t)v; break;
        case QNN_DT_UINT_32: ((uint32_t *)g->buf)[i] = (uint32_t)v; break;
        default: ((int64_t *)g->buf)[i] = (int64_t)v; break;
        }
    }
}

/* a graph output into our fp32 tensor; 1 when a value is not finite */
static int from_graph(const qtensor *g, ma_tensor *t) {
    const size_t n = (size_t)ma_tensor_numel(t);
    float *o = t->data;
    for (size_t i = 0; i < n; i++) {
        switch (g->dtype) {
        case QNN_DT_FLOAT_32: o[i] = ((const float *)g->buf)[i]; break;
        case QNN_DT_FLOAT_16: o[i] = ma_f16_to_f32(((const uint16_t *)g->buf)[i]); break;
        default: o[i] = fixed_get(g->dtype, g->buf, i, g->scale, g->offset); break;
        }
        if (!isfinite(o[i])) return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------ the session ops */

static void free_sess(qnn_sess *q) {
    if (!q) return;
    for (int i = 0; i < MA_SESSION_MAX_IO; i++) {
        free(q->in[i].name); free(q->in[i].buf);
        free(q->out[i].name); free(q->out[i].buf);
    }
    free(q);
}

static void qnn_close(ma_session *s) {
    qnn_sess *q = s->impl;
    if (!q) return;
    if (q->context && G.qi) G.qi->t.context_free(q->context, NULL);
    free_sess(q);
    s->impl = NULL;
    global_release();
}

static ma_status qnn_run(ma_session *s, const ma_tensor *in, ma_tensor *out, ma_error *err) {
    qnn_sess *q = s->impl;
    ma_status st = MA_OK;
    for (int i = 0; i < q->n_in; i++) {
        to_graph(&in[i], &q->in[i]);
        q->run_in[i] = q->in[i].desc;
        q->run_in[i].u.v1.mem_type = QNN_MEM_RAW;
        q->run_in[i].u.v1.buf.client.data = q->in[i].buf;
        q->run_in[i].u.v1.buf.client.size = (uint32_t)q->in[i].bytes;
    }
    for (int i = 0; i < q->n_out; i++) {
        q->run_out[i] = q->out[i].desc;
        q->run_out[i].u.v1.mem_type = QNN_MEM_RAW;
        q->run_out[i].u.v1.buf.client.data = q->out[i].buf;
        q->run_out[i].u.v1.buf.client.size = (uint32_t)q->out[i].bytes;
    }
    qnn_err_t e = G.qi->t.graph_execute(q->graph, q->run_in, (uint32_t)q->n_in, q->run_out, (uint32_t)q->n_out, NULL, NULL);
    if (e != QNN_OK) return qfail(err, "QnnGraph_execute", q->file, e);
    for (int i = 0; i < q->n_out && !st; i++) {
        if ((st = ma_tensor_alloc(&out[i], MA_DT_F32, s->out[i].ndim, s->out[i].shape, err))) break;
        if (from_graph(&q->out[i], &out[i])) st = ma_fail(err, MA_ERR_RANGE, "%s (%s): output %s holds a value that is not finite", q->file, s->name, s->out[i].name);
    }
    return st;
}

static const ma_session_ops qnn_ops = {"qnn", qnn_run, qnn_close};

void ma_qnn_context_name(const char *session, char *out, size_t cap) {
    const char *var = !strcmp(session, "vision") ? "VISION_CTX_SUFFIX"
                      : !strncmp(session, "llm_split", 9) ? "LLM_CTX_SUFFIX"
                      : !strcmp(session, "action_step") ? "ACTION_CTX_SUFFIX" : NULL;
    const char *suffix = var ? getenv(var) : NULL;
    snprintf(out, cap, "ctx/%s%s_socid77_archv73.bin", session, suffix ? suffix : "");
}

ma_status ma_qnn_session_attach(ma_session *s, ma_error *err) {
    qnn_sess *q = calloc(1, sizeof *q);
    if (!q) return ma_fail(err, MA_ERR_NOMEM, "session %s: out of memory", s->name);
    ma_qnn_context_name(s->name, q->file, sizeof q->file);
    if (expected_seq() < 0) { free(q); return ma_fail(err, MA_ERR_ARG, "MOLMOACT2_PROMPT_SEQ=%s is not a positive integer", getenv("MOLMOACT2_PROMPT_SEQ")); }
    ma_status st = global_acquire(err);
    if (st) { free(q); return st; }
    s->impl = q;
    s->ops = &qnn_ops; /* from here qnn_close undoes everything */
    char *path = ma_path_join(s->model->dir, q->file);
    ma_mapfile mf = {0};
    cJSON *map = NULL;
    qnn_handle sys = NULL;
    qnn_err_t e;
    if (!path) { st = ma_fail(err, MA_ERR_NOMEM, "out of memory"); goto done; }
    if ((st = ma_map_file(&mf, path, err))) { st = ma_error_wrap(err, st, "qnn context for %s", s->name); goto done; }
    if (!mf.size) { st = ma_fail(err, MA_ERR_FORMAT, "%s: empty context binary", q->file); goto done; }
    if ((st = io_map(s->name, &map, err))) goto done;
    if ((e = G.qs->t.context_create(&sys)) != QNN_OK) { st = qfail(err, "QnnSystemContext_create", q->file, e); goto done; }
    const qnn_binary_info *info = NULL;
    uint64_t info_size = 0;
    if ((e = G.qs->t.context_get_binary_info(sys, (void *)mf.data, mf.size, &info, &info_size)) != QNN_OK || !info) {
        st = qfail(err, "QnnSystemContext_getBinaryInfo", q->file, e);
        goto done;
    }
    if (info->version < 1 || info->version > 3) { st = ma_fail(err, MA_ERR_FORMAT, "%s: binary info version %u (1..3 known)", q->file, info->version); goto done; }
    const qnn_binary_info_common *b = &info->b;
    /* the graph info array's stride grows with its version, so only a single-graph binary (every
     * reference context) is read without knowing the library's struct size */
    if (b->n_graphs != 1 || !b->graphs) { st = ma_fail(err, MA_ERR_FORMAT, "%s: holds %u graphs; molmoact reads single-graph context binaries", q->file, b->n_graphs); goto done; }
    const qnn_graph_info *gi = &b->graphs[0];
    if (gi->version < 1 || gi->version > 3 || !gi->g.name) { st = ma_fail(err, MA_ERR_FORMAT, "%s: graph info version %u (1..3 known)", q->file, gi->version); goto done; }
    snprintf(q->graph_name, sizeof q->graph_name, "%s", gi->g.name);
    if (gi->g.n_inputs > MA_SESSION_MAX_IO || gi->g.n_outputs > MA_SESSION_MAX_IO) {
        st = ma_fail(err, MA_ERR_SHAPE, "%s: graph %s has %u inputs and %u outputs, the session %d and %d", q->file, q->graph_name,
                     gi->g.n_inputs, gi->g.n_outputs, s->n_in, s->n_out);
        goto done;
    }
    qtensor gin[MA_SESSION_MAX_IO], gout[MA_SESSION_MAX_IO];
    memset(gin, 0, sizeof gin);
    memset(gout, 0, sizeof gout);
    for (uint32_t i = 0; i < gi->g.n_inputs; i++) copy_desc(&gin[i], &gi->g.inputs[i]);
    for (uint32_t i = 0; i < gi->g.n_outputs; i++) copy_desc(&gout[i], &gi->g.outputs[i]);
    int bi[MA_SESSION_MAX_IO], bo[MA_SESSION_MAX_IO];
    st = bind(s->name, q->file, s->in, s->n_in, gin, (int)gi->g.n_inputs, map, bi, "inputs", err);
    if (!st) st = bind(s->name, q->file, s->out, s->n_out, gout, (int)gi->g.n_outputs, map, bo, "outputs", err);
    if (!st) {
        for (int i = 0; i < s->n_in; i++) { q->in[i] = gin[bi[i]]; gin[bi[i]].name = NULL; }
        for (int i = 0; i < s->n_out; i++) { q->out[i] = gout[bo[i]]; gout[bo[i]].name = NULL; }
        q->n_in = s->n_in;
        q->n_out = s->n_out;
        for (int i = 0; i < q->n_in; i++) { q->in[i].desc.u.v1.name = q->in[i].name; q->in[i].desc.u.v1.dims = q->in[i].dims; }
        for (int i = 0; i < q->n_out; i++) { q->out[i].desc.u.v1.name = q->out[i].name; q->out[i].desc.u.v1.dims = q->out[i].dims; }
    }
    for (int i = 0; i < MA_SESSION_MAX_IO; i++) { free(gin[i].name); free(gout[i].name); }
    if (st) goto done;
    if ((st = fix_dims(s, q, err))) goto done;
    for (int side = 0; side < 2 && !st; side++)
        for (int i = 0; i < (side ? q->n_out : q->n_in) && !st; i++) {
            qtensor *t = side ? &q->out[i] : &q->in[i];
            size_t n = 1;
            for (uint32_t d = 0; d < t->rank; d++) n *= t->dims[d];
            t->bytes = n * dt_size(t->dtype);
            if (t->bytes > 0xffffffffu) { st = ma_fail(err, MA_ERR_SHAPE, "%s: tensor %s holds %zu bytes (a client buffer takes at most 4 GiB)", q->file, t->name, t->bytes); break; }
            if (!(t->buf = calloc(t->bytes ? t->bytes : 1, 1))) st = ma_fail(err, MA_ERR_NOMEM, "%s: out of memory for tensor %s", q->file, t->name);
            if (is_fixed(t->dtype) && !(t->scale > 0.0f && isfinite(t->scale)))
                st = ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s is %s with scale %g (must be positive)", q->file, t->name, dt_name(t->dtype), (double)t->scale);
        }
    if (st) goto done;
    if ((e = G.qi->t.context_create_from_binary(G.backend, G.device, NULL, mf.data, mf.size, &q->context, NULL)) != QNN_OK) {
        q->context = NULL;
        st = qfail(err, "QnnContext_createFromBinary", q->file, e);
        goto done;
    }
    if ((e = G.qi->t.graph_retrieve(q->context, q->graph_name, &q->graph)) != QNN_OK) {
        st = qfail(err, "QnnGraph_retrieve", q->file, e);
        goto done;
    }
done:
    if (sys) G.qs->t.context_free(sys);
    cJSON_Delete(map);
    ma_unmap_file(&mf);
    free(path);
    return st; /* on failure the caller's ma_session_close runs qnn_close */
}
