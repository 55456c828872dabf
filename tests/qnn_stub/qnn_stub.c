/* SPDX-License-Identifier: Apache-2.0 */
/* A stand-in for libQnnHtp.so and libQnnSystem.so with the same binary interface (our
 * declarations in src/backend/qnn/qnn_abi.h), for testing the qnn backend without the SDK or a
 * device. Its "context binaries" are files tests/qnn_stub/make_contexts.py writes:
 *
 *   MA-QNN-STUB 1\n{"graph": NAME, "session": SESSION, "model": CONTEXT_DIR,
 *                    "inputs": [{"name", "dims", "dtype", "scale", "offset"}...], "outputs": [...]}
 *
 * and a graph runs the named molmoact session with the cpu kernels on the GGUF contexts of
 * CONTEXT_DIR, converting its tensors from and to the declared types (float32, float16, ufixed16,
 * ufixed8, bool8, uint8, int32, int64) as an HTP graph's I/O would be.
 *
 * Faults for the tests, from the environment:
 *   MA_QNN_STUB_API=MAJOR.MINOR   the core API version the provider reports (default 2.20)
 *   MA_QNN_STUB_FAULT=KIND[:SESSION]  reject (contextCreateFromBinary fails), no_graph
 *                                  (graphRetrieve fails), execute_error, crash, crash_once, hang
 *   MA_QNN_STUB_MARK=FILE         crash_once: crash only while FILE does not exist (then create it)
 *   MA_QNN_STUB_LOG=FILE          append one line per call (the sequence test) */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/qnn/qnn_abi.h"
#include "core/half.h"
#include "kernels/threads.h"
#include "runtime/session.h"

#define EXPORT __attribute__((visibility("default")))
#define MAGIC "MA-QNN-STUB 1\n"

static void trace(const char *fmt, ...) {
    const char *p = getenv("MA_QNN_STUB_LOG");
    if (!p) return;
    FILE *f = fopen(p, "a");
    if (!f) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fclose(f);
}

static char last_error[256];
static qnn_err_t fail(unsigned code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return ((uint64_t)0xab << 32) | code; /* high bits: the library's own, as the real one */
}

/* the fault asked for this session, or NULL */
static const char *fault(const char *session) {
    static char kind[64];
    const char *f = getenv("MA_QNN_STUB_FAULT");
    if (!f || !*f) return NULL;
    const char *colon = strchr(f, ':');
    size_t n = colon ? (size_t)(colon - f) : strlen(f);
    if (n >= sizeof kind) return NULL;
    if (colon && session && strcmp(colon + 1, session)) return NULL;
    memcpy(kind, f, n);
    kind[n] = 0;
    return kind;
}

/* ------------------------------------------------------------------ tensor descriptors */

typedef struct stub_tensor {
    char name[64];
    uint32_t dims[MA_MAX_DIMS], rank, dtype;
    float scale;
    int32_t offset;
} stub_tensor;

typedef struct stub_graph {
    char name[64], session[32], model[1024];
    int n_in, n_out;
    stub_tensor in[MA_SESSION_MAX_IO], out[MA_SESSION_MAX_IO];
} stub_graph;

static uint32_t dtype_of(const char *s) {
    static const struct { const char *n; uint32_t dt; } t[] = {
        {"float32", QNN_DT_FLOAT_32}, {"float16", QNN_DT_FLOAT_16}, {"ufixed16", QNN_DT_UFIXED_16}, {"ufixed8", QNN_DT_UFIXED_8},
        {"bool8", QNN_DT_BOOL_8}, {"uint8", QNN_DT_UINT_8}, {"int32", QNN_DT_INT_32}, {"int64", QNN_DT_INT_64}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(s, t[i].n)) return t[i].dt;
    return 0;
}

static int parse_tensors(const cJSON *a, stub_tensor *t, int *n) {
    *n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) {
        if (*n >= MA_SESSION_MAX_IO) return -1;
        stub_tensor *x = &t[(*n)++];
        const cJSON *nm = cJSON_GetObjectItem(e, "name"), *dims = cJSON_GetObjectItem(e, "dims"), *dt = cJSON_GetObjectItem(e, "dtype");
        if (!cJSON_IsString(nm) || !cJSON_IsArray(dims) || !cJSON_IsString(dt)) return -1;
        snprintf(x->name, sizeof x->name, "%s", nm->valuestring);
        x->rank = 0;
        const cJSON *d;
        cJSON_ArrayForEach(d, dims) {
            if (x->rank >= MA_MAX_DIMS) return -1;
            x->dims[x->rank++] = (uint32_t)d->valuedouble;
        }
        if (!(x->dtype = dtype_of(dt->valuestring))) return -1;
        const cJSON *sc = cJSON_GetObjectItem(e, "scale"), *of = cJSON_GetObjectItem(e, "offset");
        x->scale = cJSON_IsNumber(sc) ? (float)sc->valuedouble : 1.0f;
        x->offset = cJSON_IsNumber(of) ? (int32_t)of->valuedouble : 0;
    }
    return 0;
}

static int parse_graph(const void *buf, uint64_t size, stub_graph *g) {
    memset(g, 0, sizeof *g);
    if (size < strlen(MAGIC) || memcmp(buf, MAGIC, strlen(MAGIC))) return -1;
    cJSON *j = cJSON_ParseWithLength((const char *)buf + strlen(MAGIC), (size_t)size - strlen(MAGIC));
    if (!j) return -1;
    int rc = -1;
    const cJSON *gn = cJSON_GetObjectItem(j, "graph"), *se = cJSON_GetObjectItem(j, "session"), *mo = cJSON_GetObjectItem(j, "model");
    if (cJSON_IsString(gn) && cJSON_IsString(se) && cJSON_IsString(mo)) {
        snprintf(g->name, sizeof g->name, "%s", gn->valuestring);
        snprintf(g->session, sizeof g->session, "%s", se->valuestring);
        snprintf(g->model, sizeof g->model, "%s", mo->valuestring);
        if (!parse_tensors(cJSON_GetObjectItem(j, "inputs"), g->in, &g->n_in) &&
            !parse_tensors(cJSON_GetObjectItem(j, "outputs"), g->out, &g->n_out))
            rc = 0;
    }
    cJSON_Delete(j);
    return rc;
}

static void fill_desc(qnn_tensor *q, const stub_tensor *t, uint32_t type) {
    memset(q, 0, sizeof *q);
    q->version = 2;
    qnn_tensor_v1 *v = &q->u.v1;
    v->name = t->name;
    v->type = type;
    v->data_type = t->dtype;
    v->quant.definition = QNN_DEF_DEFINED;
    v->quant.encoding = (t->dtype & 0xff00) == 0x0400 ? QNN_QENC_SCALE_OFFSET : QNN_QENC_UNDEFINED;
    v->quant.u.so.scale = t->scale;
    v->quant.u.so.offset = t->offset;
    v->rank = t->rank;
    v->dims = (uint32_t *)t->dims;
    v->mem_type = QNN_MEM_RAW;
}

/* ------------------------------------------------------------------ the system interface */

typedef struct sys_ctx {
    stub_graph g;
    qnn_tensor in[MA_SESSION_MAX_IO], out[MA_SESSION_MAX_IO];
    qnn_graph_info gi;
    qnn_binary_info bi;
} sys_ctx;

static qnn_err_t sys_create(qnn_handle *h) {
    trace("systemContextCreate");
    *h = calloc(1, sizeof(sys_ctx));
    return *h ? QNN_OK : fail(1002, "out of memory");
}

static qnn_err_t sys_binary_info(qnn_handle h, void *buf, uint64_t size, const qnn_binary_info **info, uint64_t *info_size) {
    trace("systemContextGetBinaryInfo");
    sys_ctx *s = h;
    if (!s || !buf || !info) return fail(30001, "invalid argument");
    if (parse_graph(buf, size, &s->g)) return fail(30010, "not a stub context binary (malformed)");
    for (int i = 0; i < s->g.n_in; i++) fill_desc(&s->in[i], &s->g.in[i], QNN_TENSOR_APP_WRITE);
    for (int i = 0; i < s->g.n_out; i++) fill_desc(&s->out[i], &s->g.out[i], QNN_TENSOR_APP_READ);
    s->gi.version = 1;
    s->gi.g.name = s->g.name;
    s->gi.g.n_inputs = (uint32_t)s->g.n_in;
    s->gi.g.inputs = s->in;
    s->gi.g.n_outputs = (uint32_t)s->g.n_out;
    s->gi.g.outputs = s->out;
    s->bi.version = 1;
    s->bi.b.backend_id = QNN_BACKEND_HTP;
    s->bi.b.build_id = "molmoact-stub";
    s->bi.b.n_graphs = 1;
    s->bi.b.graphs = &s->gi;
    *info = &s->bi;
    if (info_size) *info_size = sizeof s->bi;
    return QNN_OK;
}

static qnn_err_t sys_free(qnn_handle h) {
    trace("systemContextFree");
    free(h);
    return QNN_OK;
}

static const qnn_system_interface sys_provider = {QNN_BACKEND_HTP, "molmoact-stub", {1, 5, 0}, {sys_create, sys_binary_info, NULL, sys_free}};
static const qnn_system_interface *sys_list[1] = {&sys_provider};

EXPORT qnn_err_t QnnSystemInterface_getProviders(const qnn_system_interface ***list, uint32_t *n) {
    *list = (const qnn_system_interface **)sys_list;
    *n = 1;
    return QNN_OK;
}

/* ------------------------------------------------------------------ the core interface */

typedef struct stub_ctx {
    stub_graph g;
    ma_model model;
    ma_session *sess;
} stub_ctx;

static int handles_live; /* backend + device + log + contexts: must be 0 after teardown */

static qnn_err_t log_create(qnn_log_cb cb, uint32_t level, qnn_handle *log) {
    (void)cb; (void)level;
    trace("logCreate");
    handles_live++;
    *log = (qnn_handle)0x10;
    return QNN_OK;
}
static qnn_err_t log_free(qnn_handle log) { (void)log; trace("logFree"); handles_live--; return QNN_OK; }
static qnn_err_t backend_create(qnn_handle log, const void **cfg, qnn_handle *b) {
    (void)cfg;
    trace("backendCreate log=%s", log ? "yes" : "no");
    handles_live++;
    *b = (qnn_handle)0x20;
    return QNN_OK;
}
static qnn_err_t backend_free(qnn_handle b) { (void)b; trace("backendFree"); handles_live--; return QNN_OK; }
static qnn_err_t device_create(qnn_handle log, const qnn_device_config *const *cfg, qnn_handle *d) {
    (void)log;
    char what[128] = "";
    for (int i = 0; cfg && cfg[i]; i++) {
        const qnn_htp_device_config *h = cfg[i]->custom;
        size_t l = strlen(what);
        if (h->option == QNN_HTP_DEVICE_CONFIG_SOC) snprintf(what + l, sizeof what - l, " soc=%u", h->u.soc_model);
        else if (h->option == QNN_HTP_DEVICE_CONFIG_ARCH) snprintf(what + l, sizeof what - l, " arch=%u", h->u.arch.arch);
    }
    trace("deviceCreate%s", what);
    handles_live++;
    *d = (qnn_handle)0x30;
    return QNN_OK;
}
static qnn_err_t device_free(qnn_handle d) {
    (void)d;
    trace("deviceFree live=%d", handles_live - 1);
    handles_live--;
    return QNN_OK;
}

static qnn_err_t context_create(qnn_handle backend, qnn_handle device, const void **cfg, const void *buf, uint64_t size,
                                qnn_handle *out, qnn_handle profile) {
    (void)cfg; (void)profile;
    if (backend != (qnn_handle)0x20 || (device && device != (qnn_handle)0x30)) return fail(5001, "invalid backend or device handle");
    stub_ctx *c = calloc(1, sizeof *c);
    if (!c) return fail(1002, "out of memory");
    if (parse_graph(buf, size, &c->g)) { free(c); return fail(5010, "context binary is malformed"); }
    trace("contextCreateFromBinary %s", c->g.session);
    const char *f = fault(c->g.session);
    if (f && !strcmp(f, "reject")) {
        free(c);
        return fail(5006, "context binary rejected: built for soc 99 (stub fault)");
    }
    int slot = -1;
    for (int i = 0; i < 7; i++)
        if (!strcmp(MA_SESSION_NAMES[i], c->g.session)) slot = i;
    static const unsigned parts[7] = {MA_PART_VISION, MA_PART_LLM(0), MA_PART_LLM(1), MA_PART_LLM(2), MA_PART_LLM(3),
                                      MA_PART_ACTION_CONTEXT, MA_PART_ACTION_STEP};
    ma_error err = {0};
    /* this library's copy of the kernels runs on the calling thread only: helper threads would
     * outlive the library (dlclose unmaps their code and the futexes they wait on) */
    ma_threads_set(1);
    if (slot < 0 || ma_model_open_parts(c->g.model, "libero", parts[slot], &c->model, &err) ||
        ma_session_open_on(MA_BACKEND_CPU, &c->model, c->g.session, &c->sess, &err)) {
        if (c->model.dir) ma_model_close(&c->model);
        free(c);
        return fail(5002, "cannot open the model behind the stub context: %s", err.msg);
    }
    handles_live++;
    *out = c;
    return QNN_OK;
}

static qnn_err_t context_free(qnn_handle h, qnn_handle profile) {
    (void)profile;
    stub_ctx *c = h;
    trace("contextFree %s", c->g.session);
    ma_session_close(c->sess);
    ma_model_close(&c->model);
    free(c);
    handles_live--;
    return QNN_OK;
}

static qnn_err_t graph_retrieve(qnn_handle ctx, const char *name, qnn_handle *g) {
    stub_ctx *c = ctx;
    trace("graphRetrieve %s", name);
    const char *f = fault(c->g.session);
    if ((f && !strcmp(f, "no_graph")) || strcmp(name, c->g.name)) return fail(6013, "graph %s is not in this context", name);
    *g = c;
    return QNN_OK;
}

static double get_val(uint32_t dt, const void *p, size_t i, float scale, int32_t offset) {
    switch (dt) {
    case QNN_DT_FLOAT_32: return ((const float *)p)[i];
    case QNN_DT_FLOAT_16: return ma_f16_to_f32(((const uint16_t *)p)[i]);
    case QNN_DT_UFIXED_16: return ((double)((const uint16_t *)p)[i] + offset) * scale;
    case QNN_DT_UFIXED_8: return ((double)((const uint8_t *)p)[i] + offset) * scale;
    case QNN_DT_BOOL_8: case QNN_DT_UINT_8: return ((const uint8_t *)p)[i];
    case QNN_DT_INT_32: return ((const int32_t *)p)[i];
    default: return (double)((const int64_t *)p)[i];
    }
}

static void put_val(uint32_t dt, void *p, size_t i, double x, float scale, int32_t offset) {
    double q;
    switch (dt) {
    case QNN_DT_FLOAT_32: ((float *)p)[i] = (float)x; break;
    case QNN_DT_FLOAT_16: ((uint16_t *)p)[i] = ma_f32_to_f16((float)x); break;
    case QNN_DT_UFIXED_16:
        q = nearbyint(x / scale) - offset;
        ((uint16_t *)p)[i] = (uint16_t)(q < 0 ? 0 : q > 65535 ? 65535 : q);
        break;
    case QNN_DT_UFIXED_8:
        q = nearbyint(x / scale) - offset;
        ((uint8_t *)p)[i] = (uint8_t)(q < 0 ? 0 : q > 255 ? 255 : q);
        break;
    case QNN_DT_BOOL_8: case QNN_DT_UINT_8: ((uint8_t *)p)[i] = (uint8_t)x; break;
    case QNN_DT_INT_32: ((int32_t *)p)[i] = (int32_t)x; break;
    default: ((int64_t *)p)[i] = (int64_t)x; break;
    }
}

static size_t elem_bytes(uint32_t dt) { return (dt & 0xff) == 0x08 ? 1 : (dt & 0xff) == 0x16 ? 2 : (dt & 0xff) == 0x32 ? 4 : 8; }

/* the client's tensor against the graph's descriptor: name, type, rank, dims, buffer size */
static qnn_err_t check_tensor(const qnn_tensor *t, const stub_tensor *d, const char *what) {
    const qnn_tensor_v1 *v = &t->u.v1;
    if (t->version != 1 && t->version != 2) return fail(6004, "%s %s: tensor version %u", what, d->name, t->version);
    if (!v->name || strcmp(v->name, d->name)) return fail(6004, "%s: tensor %s where %s was expected", what, v->name ? v->name : "(null)", d->name);
    if (v->data_type != d->dtype || v->rank != d->rank) return fail(6004, "%s %s: type or rank differs from the graph's", what, d->name);
    size_t n = 1;
    for (uint32_t k = 0; k < d->rank; k++) {
        if (!v->dims || v->dims[k] != d->dims[k]) return fail(6004, "%s %s: dimension %u differs from the graph's", what, d->name, k);
        n *= d->dims[k];
    }
    if (v->mem_type != QNN_MEM_RAW || !v->buf.client.data || v->buf.client.size < n * elem_bytes(d->dtype))
        return fail(6004, "%s %s: client buffer of %u bytes, %zu needed", what, d->name, v->buf.client.size, n * elem_bytes(d->dtype));
    return QNN_OK;
}

static qnn_err_t graph_execute(qnn_handle g, const qnn_tensor *in, uint32_t n_in, qnn_tensor *out, uint32_t n_out, qnn_handle profile,
                               qnn_handle signal) {
    (void)profile; (void)signal;
    stub_ctx *c = g;
    trace("graphExecute %s", c->g.session);
    const char *f = fault(c->g.session);
    if (f && !strcmp(f, "execute_error")) return fail(6020, "graph execution failed on the device (stub fault)");
    if (f && !strcmp(f, "hang")) for (;;) pause();
    if (f && (!strcmp(f, "crash") || !strcmp(f, "crash_once"))) {
        const char *mark = getenv("MA_QNN_STUB_MARK");
        int crash = 1;
        if (!strcmp(f, "crash_once")) {
            crash = !mark || access(mark, F_OK) != 0;
            if (crash && mark) { int fd = open(mark, O_CREAT | O_WRONLY, 0600); if (fd >= 0) close(fd); }
        }
        if (crash) raise(SIGSEGV);
    }
    if ((int)n_in != c->g.n_in || (int)n_out != c->g.n_out)
        return fail(6004, "graph %s takes %d inputs and %d outputs, got %u and %u", c->g.name, c->g.n_in, c->g.n_out, n_in, n_out);
    ma_session *s = c->sess;
    ma_tensor tin[MA_SESSION_MAX_IO], tout[MA_SESSION_MAX_IO];
    memset(tin, 0, sizeof tin);
    memset(tout, 0, sizeof tout);
    qnn_err_t rc = QNN_OK;
    ma_error err = {0};
    for (uint32_t i = 0; i < n_in && rc == QNN_OK; i++) {
        const stub_tensor *d = &c->g.in[i];
        if ((rc = check_tensor(&in[i], d, "input")) != QNN_OK) break;
        /* the session's input of that name (the graph's names are ours here, or in order) */
        int k = ma_session_input_index(s, d->name);
        if (k < 0) k = (int)i;
        int64_t shape[MA_MAX_DIMS];
        for (uint32_t r = 0; r < d->rank; r++) shape[r] = d->dims[r];
        if (ma_tensor_alloc(&tin[k], s->in[k].dtype, (int)d->rank, shape, &err)) { rc = fail(1002, "out of memory"); break; }
        const size_t n = (size_t)ma_tensor_numel(&tin[k]);
        for (size_t e = 0; e < n; e++) {
            const double x = get_val(d->dtype, in[i].u.v1.buf.client.data, e, d->scale, d->offset);
            if (tin[k].dtype == MA_DT_F32) ((float *)tin[k].data)[e] = (float)x;
            else if (tin[k].dtype == MA_DT_U8) ((uint8_t *)tin[k].data)[e] = (uint8_t)x;
            else ((int64_t *)tin[k].data)[e] = (int64_t)x;
        }
    }
    if (rc == QNN_OK && ma_session_run(s, tin, tout, &err)) rc = fail(6020, "execution failed: %s", err.msg);
    for (uint32_t i = 0; i < n_out && rc == QNN_OK; i++) {
        const stub_tensor *d = &c->g.out[i];
        if ((rc = check_tensor(&out[i], d, "output")) != QNN_OK) break;
        int k = ma_session_output_index(s, d->name);
        if (k < 0) k = (int)i;
        const size_t n = (size_t)ma_tensor_numel(&tout[k]);
        for (size_t e = 0; e < n; e++) put_val(d->dtype, out[i].u.v1.buf.client.data, e, ((const float *)tout[k].data)[e], d->scale, d->offset);
    }
    for (int i = 0; i < MA_SESSION_MAX_IO; i++) { ma_tensor_free(&tin[i]); ma_tensor_free(&tout[i]); }
    return rc;
}

static qnn_err_t error_message(qnn_err_t e, const char **msg) {
    (void)e;
    *msg = last_error;
    return QNN_OK;
}

static qnn_err_t api_version(qnn_api_version *v);

static qnn_interface provider = {
    QNN_BACKEND_HTP, "molmoact-stub", {{2, 20, 0}, {5, 0, 0}},
    {.log_create = log_create, .log_free = log_free, .backend_create = backend_create, .backend_free = backend_free,
     .backend_get_api_version = api_version, .device_create = device_create, .device_free = device_free,
     .context_create_from_binary = context_create, .context_free = context_free, .graph_retrieve = graph_retrieve,
     .graph_execute = graph_execute, .error_get_message = error_message}};
static qnn_err_t api_version(qnn_api_version *v) {
    *v = provider.api_version;
    return QNN_OK;
}

#ifndef STUB_NO_INTERFACE
static const qnn_interface *providers[1] = {&provider};

EXPORT qnn_err_t QnnInterface_getProviders(const qnn_interface ***list, uint32_t *n) {
    const char *api = getenv("MA_QNN_STUB_API");
    unsigned major, minor;
    if (api && sscanf(api, "%u.%u", &major, &minor) == 2) {
        provider.api_version.core.major = major;
        provider.api_version.core.minor = minor;
    }
    trace("getProviders");
    *list = (const qnn_interface **)providers;
    *n = 1;
    return QNN_OK;
}
#endif
