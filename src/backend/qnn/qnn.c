/* SPDX-License-Identifier: Apache-2.0 */
#define _GNU_SOURCE
#include "backend/qnn/qnn.h"

#include <cjson/cJSON.h>
#include <dlfcn.h>
#include <errno.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <elf.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/qnn/qnn_abi.h"
#include "core/env.h"
#include "core/half.h"
#include "io/jsonline.h"
#include "io/mapfile.h"
#include "model/checkpoint.h"
#include "runtime/pipeline.h"

/* ------------------------------------------------------------------ the process's QNN state
 * One backend, device, log and power vote per process, shared by its sessions (the action worker
 * holds two) and torn down, in order, with the last of them. */
typedef void *(*rpcmem_alloc_fn)(int heap, uint32_t flags, int size);
typedef void (*rpcmem_free_fn)(void *p);
typedef int (*rpcmem_to_fd_fn)(void *p);

static struct {
    pthread_mutex_t mu;
    int refs;
    void *lib_htp, *lib_sys, *lib_stub, *lib_rpc;
    const qnn_interface *qi;
    qnn_system_table sys; /* the exported functions, else the provider's table */
    qnn_version sys_api;
    qnn_handle log, backend, device;
    char htp_path[1024], sys_path[1024];
    qnn_api_version api; /* the loaded library's (backendGetApiVersion, else its provider's) */
    /* the power vote (--qnn-perf): cast once the first context is loaded, renewed after each DSP
     * restart; a vote that fails is a warning (see vote_locked) */
    const qnn_htp_infrastructure *infra;
    uint32_t power_id;
    int voted;         /* power_id is live (destroyed before a new one is made, and at teardown) */
    int vote_tried;    /* the first vote of this process was attempted */
    unsigned restarts; /* DSP restarts (1007) seen by this process, named in its messages */
    int lost;          /* a 1011: the DSP restart did not recover, nothing QNN made here works again */
    /* zero-copy (--qnn-zero-copy) */
    rpcmem_alloc_fn rpc_alloc;
    rpcmem_free_fn rpc_free;
    rpcmem_to_fd_fn rpc_to_fd;
    /* the settings the libraries were loaded with (the first session's; one process, one set) */
    char lib_dir[MA_SETTINGS_PATH];
    char perf[MA_SETTINGS_WORD];
    long soc, arch;
} G = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* the published error codes, by name (the low 16 bits of an error handle; several components
 * share 1000-1100) */
static const struct {
    unsigned code;
    const char *name;
} QNN_ERRORS[] = {
    {1000, "NOT_SUPPORTED"},
    {1002, "MEM_ALLOC"},
    {1003, "SYSTEM"},
    {1004, "INVALID_ARGUMENT"},
    {1005, "OPERATION_NOT_PERMITTED"},
    {1006, "PLATFORM_NOT_SUPPORTED"},
    {1007, "SYSTEM_COMMUNICATION: the DSP subsystem restarted"},
    {1008, "INCOMPATIBLE_BINARIES"},
    {1009, "LOADING_BINARIES"},
    {1010, "RESOURCE_UNAVAILABLE"},
    {1011, "SYSTEM_COMMUNICATION_FATAL: the DSP subsystem restart did not recover"},
    {1100, "GENERAL"},
    {2000, "PROPERTY_UNKNOWN_KEY"},
    {4000, "BACKEND_CANNOT_INITIALIZE"},
    {4002, "BACKEND_TERMINATE_FAILED"},
    {4003, "BACKEND_NOT_SUPPORTED"},
    {4004, "BACKEND_INVALID_ARGUMENT"},
    {4010, "BACKEND_INCONSISTENT_CONFIG"},
    {4011, "BACKEND_INVALID_HANDLE"},
    {4012, "BACKEND_INVALID_CONFIG"},
    {5000, "CONTEXT_INVALID_ARGUMENT"},
    {5001, "CONTEXT_DOES_NOT_EXIST"},
    {5002, "CONTEXT_INVALID_HANDLE"},
    {5003, "CONTEXT_NOT_FINALIZED"},
    {5004, "CONTEXT_BINARY_VERSION"},
    {5005, "CONTEXT_CREATE_FROM_BINARY"},
    {5006, "CONTEXT_GET_BINARY_SIZE_FAILED"},
    {5007, "CONTEXT_GET_BINARY_FAILED"},
    {5008, "CONTEXT_BINARY_CONFIGURATION: not built for this device"},
    {5009, "CONTEXT_SET_PROFILE"},
    {5010, "CONTEXT_INVALID_CONFIG"},
    {5011, "CONTEXT_BINARY_SUBOPTIMAL"},
    {5012, "CONTEXT_ABORTED"},
    {5013, "CONTEXT_TIMED_OUT"},
    {6000, "GRAPH_INVALID_ARGUMENT"},
    {6001, "GRAPH_INVALID_HANDLE"},
    {6002, "GRAPH_DOES_NOT_EXIST"},
    {6003, "GRAPH_INVALID_NAME"},
    {6004, "GRAPH_INVALID_TENSOR"},
    {6005, "GRAPH_INVALID_OP_CONFIG"},
    {6023, "GRAPH_NOT_FINALIZED"},
    {6031, "GRAPH_ABORTED"},
    {6033, "GRAPH_TIMED_OUT"},
    {6034, "GRAPH_SUBGRAPH"},
    {6035, "GRAPH_DISABLED"},
    {6036, "GRAPH_DYNAMIC_TENSOR_SHAPE"},
    {6039, "GRAPH_INVALID_CONTEXT"},
    {7001, "TENSOR_INVALID_HANDLE"},
    {7002, "TENSOR_DOES_NOT_EXIST"},
    {7004, "TENSOR_INVALID_TENSOR_PARAM"},
    {7005, "TENSOR_UNSUPPORTED_TENSOR_PARAM"},
    {8000, "MEM_INVALID_ARGUMENT"},
    {8001, "MEM_INVALID_HANDLE"},
    {8002, "MEM_ALREADY_REGISTERED"},
    {8003, "MEM_MAPPING"},
    {8004, "MEM_INVALID_SHAPE"},
    {8005, "MEM_UNSUPPORTED_MEMTYPE"},
    {11002, "LOG_INITIALIZATION"},
    {11003, "LOG_INVALID_ARGUMENT"},
    {11004, "LOG_INVALID_HANDLE"},
    {13000, "PERF_INVALID_HANDLE_PTR"},
    {13001, "PERF_INVALID_INPUT"},
    {13002, "PERF_UNSUPPORTED_CONFIG"},
    {13003, "PERF_TRANSPORT"},
    {13004, "PERF_UNSUPPORTED"},
    {13005, "PERF_MEM_ALLOC"},
    {13006, "PERF_FAILED"},
    {14000, "DEVICE_INVALID_HANDLE"},
    {14001, "DEVICE_INVALID_CONFIG"},
    {14002, "DEVICE_HARDWARE_UNAVAILABLE"},
    {14003, "DEVICE_ASSOCIATED_TO_CONTEXT"},
    {30000, "SYSTEM_CONTEXT_INVALID_HANDLE"},
    {30001, "SYSTEM_CONTEXT_INVALID_ARGUMENT"},
    {30002, "SYSTEM_CONTEXT_OPERATION_FAILED"},
    {30010, "SYSTEM_CONTEXT_MALFORMED_BINARY"},
};

/* a published QNN error code's name (e.g. 5005 CONTEXT_CREATE_FROM_BINARY), NULL when unknown */
static const char *ma_qnn_error_name(unsigned code) {
    for (size_t i = 0; i < sizeof QNN_ERRORS / sizeof QNN_ERRORS[0]; i++)
        if (QNN_ERRORS[i].code == code) return QNN_ERRORS[i].name;
    return NULL;
}

static void log_cb(const char *fmt, uint32_t level, uint64_t ts, va_list args) {
    (void)ts;
    if (level > 2) return; /* errors and warnings */
    fprintf(stderr, "qnn %s: ", level == 1 ? "error" : "warning");
    vfprintf(stderr, fmt, args);
    if (!*fmt || fmt[strlen(fmt) - 1] != '\n') fputc('\n', stderr);
}

/* "QnnX_y on FILE: error N (ITS_NAME): the library's text" */
static ma_status qfail(ma_error *err, const char *fn, const char *file, qnn_err_t e) {
    const char *msg = NULL, *name = ma_qnn_error_name(QNN_CODE(e));
    if (G.qi && G.qi->t.error_get_message && G.qi->t.error_get_message(e, &msg) != QNN_OK) msg = NULL;
    return ma_fail(err, MA_ERR_IO, "%s on %s: error %u%s%s%s%s%s", fn, file, QNN_CODE(e), name ? " (" : "", name ? name : "",
                   name ? ")" : "", msg && *msg ? ": " : "", msg && *msg ? msg : "");
}

/* A library file is checked before dlopen maps it: the loader reads its headers and segments
 * through a mapping, so a truncated file kills the process with SIGBUS instead of failing. The
 * ELF header, the program headers and every segment's bytes must lie within the file, for this
 * machine's class and architecture. */
static ma_status check_elf(const char *path, ma_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO here: refused below, not waited on */
    if (fd < 0)
        return ma_fail(err, MA_ERR_IO, "qnn: cannot load %s (%s)%s", path, strerror(errno), errno == ENOENT ? "; check --qnn-lib-dir" : "");
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
        if (pread(fd, &ph, sizeof ph, (off_t)(eh.e_phoff + (uint64_t)i * sizeof ph)) != (ssize_t)sizeof ph) {
            why = "unreadable";
            break;
        }
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
    const char *dir = G.lib_dir;
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

/* the power vote's release: before the device is freed */
static void unvote_locked(void) {
    if (G.voted && G.infra && G.infra->destroy_power_config_id) G.infra->destroy_power_config_id(G.power_id);
    G.voted = 0;
}

static void global_release_locked(void) {
    if (--G.refs > 0) return;
    if (G.qi) {
        unvote_locked();
        if (G.device && G.qi->t.device_free) G.qi->t.device_free(G.device);
        if (G.backend && G.qi->t.backend_free) G.qi->t.backend_free(G.backend);
        if (G.log && G.qi->t.log_free) G.qi->t.log_free(G.log);
    }
    if (G.lib_sys) dlclose(G.lib_sys);
    if (G.lib_htp) dlclose(G.lib_htp);
    if (G.lib_stub) dlclose(G.lib_stub);
    if (G.lib_rpc) dlclose(G.lib_rpc);
    pthread_mutex_t mu = G.mu;
    memset(&G, 0, sizeof G);
    G.mu = mu;
}

/* The HTP stub (libQnnHtpV73Stub.so) is opened by libQnnHtp.so by its bare name, which the loader
 * looks up in the LD_LIBRARY_PATH this process started with: --qnn-lib-dir set later would not
 * reach it. So the stub of the device's architecture is opened here first, by its full path
 * (the later lookup by name finds the library already loaded); and ma_qnn_prepare_env puts the
 * directory on LD_LIBRARY_PATH for the workers, which are started after. */
static ma_status preload_stub(ma_error *err) {
    const char *dir = G.lib_dir;
    if (!*dir) return MA_OK;
    const unsigned arch = G.arch >= 0 ? (unsigned)G.arch : 73u;
    char path[MA_SETTINGS_PATH + 64];
    snprintf(path, sizeof path, "%s/libQnnHtpV%uStub.so", dir, arch);
    if (access(path, F_OK) != 0) return MA_OK; /* not every installation has one (and the stand-in none) */
    ma_status st = check_elf(path, err);
    if (st) return st;
    if (!(G.lib_stub = dlopen(path, RTLD_NOW | RTLD_GLOBAL))) {
        const char *why = dlerror();
        return ma_fail(err, MA_ERR_IO, "qnn: cannot load %s (%s)", path, why ? why : "unknown reason");
    }
    return MA_OK;
}

/* the libraries and their interfaces, without creating anything (inspect reads binary infos
 * with this alone) */
static ma_status libs_open_locked(ma_error *err) {
    ma_status st = MA_OK;
    qnn_err_t e;
    if (!G.lib_htp && !(G.lib_htp = open_lib("libQnnHtp.so", G.htp_path, sizeof G.htp_path, err, &st))) return st;
    if (!G.qi) {
        qnn_get_providers_fn getp;
        *(void **)&getp = dlsym(G.lib_htp, "QnnInterface_getProviders");
        if (!getp) return ma_fail(err, MA_ERR_IO, "qnn: %s does not export QnnInterface_getProviders", G.htp_path);
        const qnn_interface **prov = NULL;
        uint32_t n = 0;
        if ((e = getp(&prov, &n)) != QNN_OK || !prov || !n)
            return ma_fail(err, MA_ERR_IO, "qnn: QnnInterface_getProviders of %s: error %u, %u providers", G.htp_path, QNN_CODE(e), n);
        char seen[256] = "";
        for (uint32_t i = 0; i < n; i++) {
            const qnn_api_version *v = &prov[i]->api_version;
            snprintf(seen + strlen(seen), sizeof seen - strlen(seen), "%s%u.%u.%u", i ? ", " : "", v->core.major, v->core.minor,
                     v->core.patch);
            if (v->core.major == MA_QNN_CORE_MAJOR && v->core.minor >= MA_QNN_CORE_MIN_MINOR && !G.qi) G.qi = prov[i];
        }
        if (!G.qi)
            return ma_fail(err, MA_ERR_IO, "qnn: %s provides QNN API %s; molmoact needs %u.%u or newer within %u.x", G.htp_path, seen,
                           MA_QNN_CORE_MAJOR, MA_QNN_CORE_MIN_MINOR, MA_QNN_CORE_MAJOR);
        const qnn_interface_table *t = &G.qi->t;
        if (!t->backend_create || !t->backend_free || !t->context_create_from_binary || !t->context_free || !t->graph_retrieve ||
            !t->graph_execute) {
            G.qi = NULL;
            return ma_fail(err, MA_ERR_IO,
                           "qnn: %s lacks a function molmoact needs (backendCreate, contextCreateFromBinary, graphRetrieve, graphExecute)",
                           G.htp_path);
        }
    }
    if (!G.lib_sys && !(G.lib_sys = open_lib("libQnnSystem.so", G.sys_path, sizeof G.sys_path, err, &st))) return st;
    if (!G.sys.context_create) {
        /* the exported functions first: SDK 2.44 changed the system interface table's layout by
         * mistake (API 2.34's notes), the functions' names and signatures stayed */
        *(void **)&G.sys.context_create = dlsym(G.lib_sys, "QnnSystemContext_create");
        *(void **)&G.sys.context_get_metadata = dlsym(G.lib_sys, "QnnSystemContext_getMetadata");
        *(void **)&G.sys.context_get_binary_info = dlsym(G.lib_sys, "QnnSystemContext_getBinaryInfo");
        *(void **)&G.sys.context_free = dlsym(G.lib_sys, "QnnSystemContext_free");
        qnn_system_get_providers_fn gets;
        *(void **)&gets = dlsym(G.lib_sys, "QnnSystemInterface_getProviders");
        const qnn_system_interface **sprov = NULL, *qs = NULL;
        uint32_t n = 0;
        char seen[256] = "";
        if (gets && (e = gets(&sprov, &n)) == QNN_OK && sprov)
            for (uint32_t i = 0; i < n; i++) {
                const qnn_version *v = &sprov[i]->api_version;
                snprintf(seen + strlen(seen), sizeof seen - strlen(seen), "%s%u.%u.%u", i ? ", " : "", v->major, v->minor, v->patch);
                if (v->major == MA_QNN_SYSTEM_MAJOR && !qs) qs = sprov[i];
            }
        if (qs) {
            G.sys_api = qs->api_version;
            if (!G.sys.context_create && !G.sys.context_free) { /* the table only where nothing is exported */
                G.sys.context_create = qs->t.context_create;
                G.sys.context_get_binary_info = qs->t.context_get_binary_info;
                G.sys.context_get_metadata = qs->t.context_get_metadata;
                G.sys.context_free = qs->t.context_free;
            }
        }
        if (!G.sys.context_create || !G.sys.context_free || (!G.sys.context_get_metadata && !G.sys.context_get_binary_info)) {
            memset(&G.sys, 0, sizeof G.sys);
            return ma_fail(err, MA_ERR_IO,
                           "qnn: %s provides neither QnnSystemContext_create/_getMetadata/_free nor a system interface "
                           "%u.x (it has: %s)",
                           G.sys_path, MA_QNN_SYSTEM_MAJOR, seen[0] ? seen : "none");
        }
    }
    return MA_OK;
}

/* settings.qnn_perf: 0 no vote ("" or default), 1 high, 2 burst (ma_settings_set allows no other) */
static int perf_mode(void) {
    const char *mode = G.perf;
    return !strcmp(mode, "high") ? 1 : !strcmp(mode, "burst") ? 2 : 0;
}

/* --qnn-perf high / burst: the HTP power vote, as onnxruntime's QNN provider makes it
 * (onnxruntime/onnxruntime-qnn @ cee6c0d91e583d43f5ecef6391e93c19b4042c0f
 * qnn_htp_power_config_manager.cc): DCVS off in performance mode, sleep latency 100 us at the
 * TURBO corner (high) or 40 us at the highest corner (burst), and for burst the RPC polling time
 * 9999 us and control latency 100 us that Qualcomm's HTP documentation recommends.
 *
 * When: once the process's first context is loaded, and again after each DSP restart (the old
 * power config id is destroyed first; after the restart its destruction may fail, which does not
 * matter). onnxruntime does the same: its per-thread power config id is made at the first run,
 * after the context binaries were loaded (QNNExecutionProvider::PerThreadContext,
 * microsoft/onnxruntime qnn_execution_provider.cc @ 00190a2cacfdac70864995b6f214cdb7c3cec0d6).
 * A vote is a request for clocks, not a condition for correct results: one that fails is a warning
 * on stderr (onnxruntime ignores those results alike) and the graphs run at the default clocks. */
static void vote_locked(const char *when) {
    const int mode = perf_mode();
    if (mode <= 0) return; /* none asked (a bad value was refused before anything was loaded) */
    const char *name = mode == 2 ? "burst" : "high";
    ma_error why = {0};
    qnn_err_t e;
    if (!G.infra) {
        void *infra = NULL;
        if (!G.qi->t.device_get_infrastructure) {
            ma_fail(&why, MA_ERR_UNSUPPORTED, "%s has no deviceGetInfrastructure", G.htp_path);
            goto warn;
        }
        if ((e = G.qi->t.device_get_infrastructure(&infra)) != QNN_OK || !infra) {
            qfail(&why, "QnnDevice_getInfrastructure", G.htp_path, e);
            goto warn;
        }
        const qnn_htp_infrastructure *hi = infra;
        if (hi->type != 0 || !hi->create_power_config_id || !hi->set_power_config || !hi->destroy_power_config_id) {
            ma_fail(&why, MA_ERR_UNSUPPORTED, "%s: the device infrastructure is not the HTP performance one", G.htp_path);
            goto warn;
        }
        G.infra = hi;
    }
    if (G.voted) G.infra->destroy_power_config_id(G.power_id); /* the previous vote's id: renewed */
    G.voted = 0;
    if ((e = G.infra->create_power_config_id(0, 0, &G.power_id)) != QNN_OK) {
        qfail(&why, "createPowerConfigId", G.htp_path, e);
        goto warn;
    }
    G.voted = 1;
    qnn_htp_power_config dcvs, latency, polling;
    memset(&dcvs, 0, sizeof dcvs);
    memset(&latency, 0, sizeof latency);
    memset(&polling, 0, sizeof polling);
    dcvs.option = QNN_HTP_POWER_DCVS_V3;
    qnn_htp_dcvs_v3 *d = &dcvs.u.dcvs;
    const uint32_t corner = mode == 2 ? QNN_HTP_CORNER_MAX : QNN_HTP_CORNER_TURBO;
    d->context_id = G.power_id;
    d->set_dcvs_enable = 1;
    d->dcvs_enable = 0;
    d->power_mode = QNN_HTP_POWER_MODE_PERFORMANCE;
    d->set_sleep_latency = 1;
    d->sleep_latency_us = mode == 2 ? 40 : 100;
    d->set_bus_params = d->set_core_params = 1;
    d->bus_corner_min = d->bus_corner_target = d->bus_corner_max = corner;
    d->core_corner_min = d->core_corner_target = d->core_corner_max = corner;
    latency.option = QNN_HTP_POWER_RPC_CONTROL_LATENCY;
    latency.u.rpc_control_latency_us = 100;
    polling.option = QNN_HTP_POWER_RPC_POLLING_TIME;
    polling.u.rpc_polling_time_us = 9999;
    const void *list[4] = {&dcvs, mode == 2 ? (const void *)&latency : NULL, mode == 2 ? (const void *)&polling : NULL, NULL};
    if ((e = G.infra->set_power_config(G.power_id, list)) != QNN_OK) {
        qfail(&why, "setPowerConfig", G.htp_path, e);
        goto warn; /* the id stays live: destroyed at the next vote or at teardown */
    }
    return;
warn:
    fprintf(stderr, "molmoact: qnn: warning: --qnn-perf %s: the power vote %s failed, the graphs run at the default clocks: %s\n", name,
            when, why.msg);
}

static ma_status global_acquire(const ma_settings *set, ma_error *err) {
    pthread_mutex_lock(&G.mu);
    if (G.refs > 0) {
        /* one process loads one set of QNN libraries: an engine asking for another needs its own
         * process (resident workers have one each) */
        const int same =
            !strcmp(G.lib_dir, set->qnn_lib_dir) && G.soc == set->qnn_soc && G.arch == set->qnn_arch && !strcmp(G.perf, set->qnn_perf);
        if (same) G.refs++;
        pthread_mutex_unlock(&G.mu);
        return same ? MA_OK
                    : ma_fail(err, MA_ERR_ARG,
                              "qnn: this process already runs the QNN libraries of --qnn-lib-dir \"%.200s\" (soc %ld, arch %ld, "
                              "perf %s): an engine with other QNN settings needs its own process (the resident workers have one each)",
                              G.lib_dir, G.soc, G.arch, G.perf[0] ? G.perf : "default");
    }
    G.refs++;
    snprintf(G.lib_dir, sizeof G.lib_dir, "%s", set->qnn_lib_dir);
    snprintf(G.perf, sizeof G.perf, "%s", set->qnn_perf);
    G.soc = set->qnn_soc;
    G.arch = set->qnn_arch;
    ma_status st = MA_OK;
    qnn_err_t e;
    if ((st = preload_stub(err)) || (st = libs_open_locked(err))) goto fail;
    const qnn_interface_table *t = &G.qi->t;
    if (t->log_create && (e = t->log_create(log_cb, 2, &G.log)) != QNN_OK) {
        st = qfail(err, "QnnLog_create", G.htp_path, e);
        goto fail;
    }
    if ((e = t->backend_create(G.log, NULL, &G.backend)) != QNN_OK) {
        st = qfail(err, "QnnBackend_create", G.htp_path, e);
        goto fail;
    }
    G.api = G.qi->api_version;
    qnn_api_version reported;
    if (t->backend_get_api_version && t->backend_get_api_version(&reported) == QNN_OK && reported.backend.major) G.api = reported;
    if (t->device_create) {
        /* Device configs only where --qnn-soc / --qnn-arch ask for them: the consumers that load
         * offline-prepared context binaries send none (Qualcomm's qrb_ros_nn_inference
         * qnn_inference.cpp @ 039cade0eae9cdada5da1c9799b615ff2d047756 creates its device with no
         * config), the binary names its SoC and arch itself. Their layout follows the loaded
         * library's HTP API version (qnn_abi.h). */
        const int has_soc = G.soc >= 0, has_arch = G.arch >= 0;
        const uint32_t soc = has_soc ? (uint32_t)G.soc : 0, arch = has_arch ? (uint32_t)G.arch : 0;
        const qnn_version *hv = &G.api.backend;
        const int wide = hv->major > 5 || (hv->major == 5 && hv->minor >= MA_QNN_HTP_DEVICE_CONFIG_PTR_MINOR);
        qnn_htp_device_config hs = {QNN_HTP_DEVICE_CONFIG_SOC, {.soc_model = soc}};
        qnn_htp_device_config ha = {QNN_HTP_DEVICE_CONFIG_ARCH, {.arch = {0, arch}}};
        qnn_htp_device_config_548 hs8 = {QNN_HTP_DEVICE_CONFIG_SOC, {.soc_model = soc}};
        qnn_htp_device_config_548 ha8 = {QNN_HTP_DEVICE_CONFIG_ARCH, {.arch = {0, arch}}};
        qnn_device_config cs = {QNN_DEVICE_CONFIG_CUSTOM, wide ? (const void *)&hs8 : (const void *)&hs};
        qnn_device_config ca = {QNN_DEVICE_CONFIG_CUSTOM, wide ? (const void *)&ha8 : (const void *)&ha};
        const qnn_device_config *cfg[3] = {NULL, NULL, NULL};
        int k = 0;
        if (has_soc) cfg[k++] = &cs;
        if (has_arch) cfg[k++] = &ca;
        if ((e = t->device_create(G.log, k ? cfg : NULL, &G.device)) != QNN_OK) {
            st = qfail(err, "QnnDevice_create", G.htp_path, e);
            goto fail;
        }
    }
    /* no power vote yet: it follows the first context (ma_qnn_session_attach) */
    if (!set->adsp_library_path[0] && !set->dsp_library_path[0] && set->qnn_lib_dir[0])
        fprintf(stderr,
                "molmoact: qnn: note: ADSP_LIBRARY_PATH is not set: the DSP side looks for libQnnHtpV%ldSkel.so only in its default "
                "directories (resident workers get --qnn-lib-dir; in this process set ADSP_LIBRARY_PATH=%s yourself)\n",
                set->qnn_arch >= 0 ? set->qnn_arch : 73L, set->qnn_lib_dir);
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
    void *buf;      /* calloc'd, or an rpcmem allocation (zero-copy) */
    int rpc;        /* buf is rpcmem's */
    qnn_handle mem; /* zero-copy: its registration with the context */
} qtensor;

typedef struct qnn_sess {
    char file[256];   /* ctx/... as the messages name it */
    char *path;       /* the binary, read again when the context is recreated after a DSP restart */
    char *graph_name; /* as the binary info gives it (up to 255 bytes, list_graphs) */
    int zero_copy;
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

static size_t dt_size(uint32_t dt) {
    return (dt & 0xff) == 0x08 ? 1 : (dt & 0xff) == 0x16 ? 2 : (dt & 0xff) == 0x32 ? 4 : (dt & 0xff) == 0x64 ? 8 : 0;
}

static int is_fixed(uint32_t dt) {
    return dt == QNN_DT_UFIXED_8 || dt == QNN_DT_UFIXED_16 || dt == QNN_DT_SFIXED_8 || dt == QNN_DT_SFIXED_16;
}

/* the graph types an io-spec type converts to and from */
static int convertible(ma_dtype ours, uint32_t dt) {
    if (!dt_name(dt)) return 0;
    if (ours == MA_DT_F32) return dt == QNN_DT_FLOAT_32 || dt == QNN_DT_FLOAT_16 || is_fixed(dt);
    return 1; /* masks and positions: integers, booleans or floats */
}

static const char *encoding_name(uint32_t e) {
    static const char *names[] = {"scale_offset",
                                  "axis_scale_offset",
                                  "bw_scale_offset",
                                  "bw_axis_scale_offset",
                                  "block",
                                  "blockwise_expansion",
                                  "vector",
                                  "float_block",
                                  "bw_axis_scale_offset_mapped",
                                  "bw_block_mapped",
                                  "bw_blockwise_expansion_mapped",
                                  "bw_float_block"};
    return e < sizeof names / sizeof names[0] ? names[e] : e == QNN_QENC_UNDEFINED ? "undefined" : "unknown";
}

static int is_fixed(uint32_t dt);

/* a graph tensor's descriptor, copied out of the binary info (which the system context frees):
 * its name and dimensions into q, its quantisation as a per-tensor scale and offset. Any other
 * encoding (per axis, per block, vector, ...) is refused by name rather than read as 1 and 0; so
 * is a fixed-point tensor without one. */
static ma_status copy_desc(qtensor *q, const qnn_tensor *src, const char *file, ma_error *err) {
    const qnn_tensor_v1 *v = &src->u.v1; /* version 2 begins with version 1's fields */
    q->version = src->version;
    q->name = strdup(v->name ? v->name : "");
    if (!q->name) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
    if (src->version != 1 && src->version != 2)
        return ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s has version %u (1 or 2 known)", file, q->name, src->version);
    q->rank = v->rank <= MA_MAX_DIMS ? v->rank : MA_MAX_DIMS + 1;
    if (v->rank && !v->dims) return ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s has rank %u and no dimensions", file, q->name, v->rank);
    for (uint32_t i = 0; i < v->rank && i < MA_MAX_DIMS; i++) q->dims[i] = v->dims[i];
    q->dtype = v->data_type;
    q->scale = 1.0f;
    q->offset = 0;
    const int defined = v->quant.definition == QNN_DEF_DEFINED;
    if (defined && v->quant.encoding == QNN_QENC_SCALE_OFFSET) {
        q->scale = v->quant.u.so.scale;
        q->offset = v->quant.u.so.offset;
    } else if (defined && v->quant.encoding == QNN_QENC_BW_SCALE_OFFSET) {
        q->scale = v->quant.u.bw.scale;
        q->offset = v->quant.u.bw.offset;
    } else if (defined && v->quant.encoding != QNN_QENC_UNDEFINED)
        return ma_fail(err, MA_ERR_UNSUPPORTED,
                       "%s: tensor %s is quantised with the %s encoding (%u); molmoact applies one scale and offset "
                       "per tensor (scale_offset, bw_scale_offset): rebuild the graph's I/O with per-tensor encodings",
                       file, q->name, encoding_name(v->quant.encoding), v->quant.encoding);
    else if (is_fixed(q->dtype))
        return ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s is fixed-point without a scale and offset (encoding %s)", file, q->name,
                       encoding_name(v->quant.encoding));
    memset(&q->desc, 0, sizeof q->desc);
    q->desc.version = src->version;
    q->desc.u.v1 = src->u.v1;
    if (src->version == 2) { /* sparse params are plain values; dynamic dims are not ours to keep */
        q->desc.u.v2.sparse = src->u.v2.sparse;
        q->desc.u.v2.dynamic_dims = NULL;
        q->desc.u.v2.produced = 0;
    }
    /* the union past the per-tensor encodings may hold pointers into the binary info: cleared */
    qnn_quant_params qp;
    memset(&qp, 0, sizeof qp);
    qp.definition = v->quant.definition;
    qp.encoding = v->quant.encoding;
    if (defined && v->quant.encoding == QNN_QENC_SCALE_OFFSET) qp.u.so = v->quant.u.so;
    if (defined && v->quant.encoding == QNN_QENC_BW_SCALE_OFFSET) qp.u.bw = v->quant.u.bw;
    q->desc.u.v1.quant = qp;
    q->desc.u.v1.name = q->name;
    q->desc.u.v1.dims = q->dims;
    return MA_OK;
}

static void describe(char *out, size_t cap, const qtensor *q) {
    int n = snprintf(out, cap, "%s %s [", q->name, dt_name(q->dtype) ? dt_name(q->dtype) : "unsupported type");
    for (uint32_t i = 0; i < q->rank && i < MA_MAX_DIMS && n > 0 && (size_t)n < cap; i++)
        n += snprintf(out + n, cap - (size_t)n, "%s%u", i ? ", " : "", q->dims[i]);
    if (n > 0 && (size_t)n < cap) snprintf(out + n, cap - (size_t)n, "]");
}

static void describe_ours(char *out, size_t cap, const ma_io *io) {
    int n = snprintf(out, cap, "%s %s [", io->name, ma_dtype_name(io->dtype));
    for (int i = 0; i < io->ndim && n > 0 && (size_t)n < cap; i++)
        n += snprintf(out + n, cap - (size_t)n, "%s%lld", i ? ", " : "", (long long)io->shape[i]);
    if (n > 0 && (size_t)n < cap) snprintf(out + n, cap - (size_t)n, "]");
}

/* both sides of a binding, for the error message */
static void sides(char *out, size_t cap, const ma_io *ours, int n_ours, const qtensor *g, int n_g) {
    size_t n = (size_t)snprintf(out, cap, "ours:");
    char d[160];
    for (int i = 0; i < n_ours && n < cap; i++) {
        describe_ours(d, sizeof d, &ours[i]);
        n += (size_t)snprintf(out + n, cap - n, " %s;", d);
    }
    if (n < cap) n += (size_t)snprintf(out + n, cap - n, " graph:");
    for (int i = 0; i < n_g && n < cap; i++) {
        describe(d, sizeof d, &g[i]);
        n += (size_t)snprintf(out + n, cap - n, " %s;", d);
    }
}

static int shape_fits(const ma_io *io, const qtensor *q) {
    if ((int)q->rank != io->ndim) return 0;
    for (int i = 0; i < io->ndim; i++)
        if (io->shape[i] >= 0 && (uint32_t)io->shape[i] != q->dims[i]) return 0;
    return 1;
}

/* the io map's graph name for (session, tensor), NULL when the map does not name it */
static ma_status io_map(const char *path, cJSON **root, ma_error *err) {
    *root = NULL;
    if (!*path) return MA_OK;
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
            st = ma_fail(err, MA_ERR_FORMAT,
                         "%s: \"%s\" is not a session (vision, llm_split0..3, action_context, action_step) with an object of names", path,
                         s->string);
            break;
        }
        for (cJSON *e = s->child; e && !st; e = e->next)
            if (!cJSON_IsString(e))
                st = ma_fail(err, MA_ERR_FORMAT, "%s: %s.%s must be a string (the graph's tensor name)", path, s->string, e->string);
    }
    if (st) {
        cJSON_Delete(*root);
        *root = NULL;
    }
    return st;
}

/* bind our ios to graph tensors: io map, then names, then order and shape */
static ma_status bind(const char *session, const char *file, const ma_io *ours, int n_ours, const qtensor *g, int n_g, const cJSON *map,
                      int *idx, const char *what, ma_error *err) {
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
            return ma_fail(err, MA_ERR_SHAPE, "%s (%s): --qnn-io-map names %s for %s, the graph has no such tensor (%s)", file, session,
                           want, ours[i].name, both);
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
            return ma_fail(err, MA_ERR_SHAPE, "%s (%s): %s %s does not fit graph tensor %s (bound by %s; %s)", file, session, what, a, b,
                           by_name ? "name" : "order", both);
        }
    }
    return MA_OK;
}

/* the prompt length the graphs must be built for: the session's static length (settings.prompt_seq,
 * else the length the directory's contexts were compiled for, else 128), handed down by the runtime */
static int expected_seq(const ma_session *s) {
    const int64_t v = s->static_seq;
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
                    return ma_fail(err, MA_ERR_SHAPE, "%s (%s): the graph's prompt lengths disagree (%lld and %lld at %s)", q->file,
                                   s->name, (long long)S, (long long)io[i].shape[d], io[i].name);
            }
    }
    if (S >= 0) {
        int want = expected_seq(s);
        if (S != want)
            return ma_fail(err, MA_ERR_SHAPE,
                           "%s (%s): built for prompt length %lld, the run pads to %d (MOLMOACT_PROMPT_SEQ, or the "
                           "length the directory was compiled for)",
                           q->file, s->name, (long long)S, want);
    }
    if (s->kind == MA_SESS_VISION && s->out[0].shape[0] != s->in[0].shape[0] * s->model->tokens_per_image)
        return ma_fail(err, MA_ERR_SHAPE, "%s (vision): %lld feature rows for %lld images of %d tokens", q->file,
                       (long long)s->out[0].shape[0], (long long)s->in[0].shape[0], s->model->tokens_per_image);
    if (s->kind == MA_SESS_ACTION_STEP && s->in[0].shape[0] != s->out[0].shape[0])
        return ma_fail(err, MA_ERR_SHAPE, "%s (action_step): x has %lld steps, velocity %lld", q->file, (long long)s->in[0].shape[0],
                       (long long)s->out[0].shape[0]);
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
    case QNN_DT_UFIXED_8:
        lo = 0;
        hi = 255;
        break;
    case QNN_DT_UFIXED_16:
        lo = 0;
        hi = 65535;
        break;
    case QNN_DT_SFIXED_8:
        lo = -128;
        hi = 127;
        break;
    default:
        lo = -32768;
        hi = 32767;
        break;
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
    if (t->dtype == MA_DT_F32 && g->dtype == QNN_DT_FLOAT_32) {
        memcpy(g->buf, t->data, n * 4);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const double v = ours_get(t, i);
        switch (g->dtype) {
        case QNN_DT_FLOAT_32: ((float *)g->buf)[i] = (float)v; break;
        case QNN_DT_FLOAT_16: ((uint16_t *)g->buf)[i] = ma_f32_to_f16((float)v); break;
        case QNN_DT_UFIXED_8:
        case QNN_DT_UFIXED_16:
        case QNN_DT_SFIXED_8:
        case QNN_DT_SFIXED_16: fixed_put(g->dtype, g->buf, i, (float)v, g->scale, g->offset); break;
        case QNN_DT_INT_8: ((int8_t *)g->buf)[i] = (int8_t)v; break;
        case QNN_DT_UINT_8:
        case QNN_DT_BOOL_8: ((uint8_t *)g->buf)[i] = (uint8_t)v; break;
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

/* ------------------------------------------------------------------ binary info */

#define MA_QNN_MAX_GRAPHS 64

typedef struct graph_view {
    uint32_t version;
    const char *name;
    uint32_t n_in, n_out;
    const qnn_tensor *in, *out;
} graph_view;


static int name_ok(const char *p) { return p && memchr(p, '\0', 256) && p[0]; }

/* every graph of a binary info, checked: its version, the graphs' versions against the stride,
 * names (NUL-terminated, at most 255 bytes), counts and pointers */
static ma_status list_graphs(const qnn_binary_info *info, const char *file, graph_view *out, uint32_t *n, char *about, size_t about_cap,
                             ma_error *err) {
    *n = 0;
    uint32_t count;
    const uint8_t *base;
    const char *build = NULL, *soc = NULL;
    if (info->version == 1 || info->version == 2) {
        count = info->u.v1.n_graphs;
        base = info->u.v1.graphs;
        build = info->u.v1.build_id;
        soc = info->u.v1.soc_version;
    } else if (info->version == 3) {
        count = info->u.v3.n_graphs;
        base = info->u.v3.graphs;
        build = info->u.v3.build_id;
        soc = info->u.v3.soc_version;
    } else return ma_fail(err, MA_ERR_FORMAT, "%s: binary info version %u (1..3 known)", file, info->version);
    const qnn_version *core = info->version == 3 ? &info->u.v3.core_api : &info->u.v1.core_api;
    if (about)
        snprintf(about, about_cap, "binary info v%u, built by %.80s (QNN API %u.%u.%u)%s%.40s", info->version, name_ok(build) ? build : "?",
                 core->major, core->minor, core->patch, name_ok(soc) ? ", soc " : "", name_ok(soc) ? soc : "");
    if (count == 0 || !base) return ma_fail(err, MA_ERR_FORMAT, "%s: holds no graph", file);
    if (count > MA_QNN_MAX_GRAPHS)
        return ma_fail(err, MA_ERR_FORMAT, "%s: holds %u graphs (at most %d read)", file, count, MA_QNN_MAX_GRAPHS);
    const uint32_t minor = G.qi ? G.qi->api_version.core.minor : 0;
    const int verified = G.qi && minor <= MA_QNN_CORE_MINOR_VERIFIED;
    if (count > 1 && !G.qi)
        return ma_fail(err, MA_ERR_UNSUPPORTED,
                       "%s: holds %u graphs, and without libQnnHtp.so (its API version) the graph list's layout is not known", file, count);
    const uint32_t stride = ma_qnn_graph_stride(minor);
    for (uint32_t k = 0; k < count; k++) {
        const qnn_graph_info *g = (const qnn_graph_info *)(const void *)(base + (size_t)k * stride);
        const qnn_graph_info_v1 *v = &g->u.v1;
        const char *why = NULL;
        if (g->version < 1 || g->version > 3) why = "an unknown graph info version";
        else if ((g->version == 3 && stride < MA_QNN_GRAPH_STRIDE_V3) || (g->version == 2 && stride < MA_QNN_GRAPH_STRIDE_V2))
            why = "a graph info version newer than the library's layout";
        else if (!name_ok(v->name)) why = "no name, or one longer than 255 bytes";
        else if (v->n_inputs > MA_SESSION_MAX_IO * 4 || v->n_outputs > MA_SESSION_MAX_IO * 4) why = "more than 64 inputs or outputs";
        else if ((v->n_inputs && !v->inputs) || (v->n_outputs && !v->outputs)) why = "tensor counts without tensors";
        if (why) {
            if (count > 1 && !verified)
                return ma_fail(err, MA_ERR_UNSUPPORTED,
                               "%s: holds %u graphs and this library's QNN API %u.%u is newer than the versions whose "
                               "graph list layout is known (up to 2.%u, SDK 2.43): graph %u has %s at stride %u",
                               file, count, G.qi->api_version.core.major, minor, MA_QNN_CORE_MINOR_VERIFIED, k, why, stride);
            return ma_fail(err, MA_ERR_FORMAT, "%s: graph %u of %u has %s (graph info version %u, stride %u for QNN API 2.%u)", file, k,
                           count, why, g->version, stride, minor);
        }
        out[k] = (graph_view){g->version, v->name, v->n_inputs, v->n_outputs, v->inputs, v->outputs};
    }
    *n = count;
    return MA_OK;
}

/* the binary info of a mapped context binary (mf, the file at path): getMetadata (a const buffer)
 * first; where the library lacks it or it fails, the deprecated getBinaryInfo. That one takes a
 * writable buffer: it is given a second mapping of the file, private and made writable, so that
 * nothing is copied (a full-size context is 1.8 GB) unless the library writes to a page (then that
 * page alone, copy-on-write), and neither the file nor mf, which contextCreateFromBinary reads,
 * can change. *wmf holds that mapping until the binary info is no longer used (it may point into
 * it). *how names the function that answered. */
static ma_status binary_info(qnn_handle sys, const ma_mapfile *mf, const char *path, const char *file, const qnn_binary_info **info,
                             ma_mapfile *wmf, const char **how, ma_error *err) {
    qnn_err_t e;
    ma_error first = {0};
    *info = NULL;
    *how = NULL;
    if (G.sys.context_get_metadata) {
        if ((e = G.sys.context_get_metadata(sys, mf->data, mf->size, info)) == QNN_OK && *info) {
            *how = "getMetadata";
            return MA_OK;
        }
        if (e == QNN_OK) ma_fail(&first, MA_ERR_FORMAT, "QnnSystemContext_getMetadata on %s gave no binary info", file);
        else qfail(&first, "QnnSystemContext_getMetadata", file, e);
        *info = NULL;
        if (!G.sys.context_get_binary_info) return ma_fail(err, MA_ERR_IO, "%s", first.msg);
    }
    ma_status st = ma_map_file(wmf, path, err);
    if (!st && wmf->size != mf->size)
        st = ma_fail(err, MA_ERR_IO, "%s: the file changed while it was read (%zu bytes, then %zu)", file, mf->size, wmf->size);
    if (!st && mprotect((void *)wmf->data, wmf->size, PROT_READ | PROT_WRITE) != 0)
        st = ma_fail(err, MA_ERR_IO, "%s: a writable private mapping for QnnSystemContext_getBinaryInfo: %s", file, strerror(errno));
    uint64_t info_size = 0;
    if (!st && ((e = G.sys.context_get_binary_info(sys, (void *)wmf->data, wmf->size, info, &info_size)) != QNN_OK || !*info)) {
        if (e == QNN_OK) st = ma_fail(err, MA_ERR_FORMAT, "QnnSystemContext_getBinaryInfo on %s gave no binary info", file);
        else st = qfail(err, "QnnSystemContext_getBinaryInfo", file, e);
        *info = NULL;
    }
    if (st && first.msg[0]) { /* both failed: name both */
        char second[sizeof err->msg];
        snprintf(second, sizeof second, "%s", err->msg);
        return ma_fail(err, st, "%s; then %s", first.msg, second);
    }
    if (!st) *how = first.msg[0] ? "getBinaryInfo (getMetadata failed)" : "getBinaryInfo";
    return st;
}

static void print_tensor(FILE *f, const qnn_tensor *t) {
    const qnn_tensor_v1 *v = &t->u.v1;
    fprintf(f, "%s %s [", name_ok(v->name) ? v->name : "?", dt_name(v->data_type) ? dt_name(v->data_type) : "unsupported type");
    for (uint32_t d = 0; v->dims && d < v->rank && d < 8; d++) fprintf(f, "%s%u", d ? ", " : "", v->dims[d]);
    fprintf(f, "]");
    if (v->quant.definition == QNN_DEF_DEFINED && v->quant.encoding == QNN_QENC_SCALE_OFFSET)
        fprintf(f, " scale %g offset %d", (double)v->quant.u.so.scale, v->quant.u.so.offset);
    else if (v->quant.definition == QNN_DEF_DEFINED && v->quant.encoding != QNN_QENC_UNDEFINED)
        fprintf(f, " encoding %s", encoding_name(v->quant.encoding));
}

ma_status ma_qnn_inspect(const ma_settings *set, const char *path, FILE *f, ma_error *err) {
    pthread_mutex_lock(&G.mu);
    if (G.refs > 0 && strcmp(G.lib_dir, set->qnn_lib_dir)) {
        pthread_mutex_unlock(&G.mu);
        return ma_fail(err, MA_ERR_ARG, "qnn: this process already runs the QNN libraries of --qnn-lib-dir \"%.200s\"", G.lib_dir);
    }
    if (G.refs++ == 0) snprintf(G.lib_dir, sizeof G.lib_dir, "%s", set->qnn_lib_dir);
    ma_status st = libs_open_locked(err);
    ma_mapfile mf = {0};
    ma_mapfile wmf = {0};
    qnn_handle sys = NULL;
    qnn_err_t e;
    if (!st && !(st = ma_map_file(&mf, path, err)) && (e = G.sys.context_create(&sys)) != QNN_OK)
        st = qfail(err, "QnnSystemContext_create", path, e);
    const qnn_binary_info *info = NULL;
    const char *how = NULL;
    if (!st) st = binary_info(sys, &mf, path, path, &info, &wmf, &how, err);
    graph_view gv[MA_QNN_MAX_GRAPHS];
    uint32_t n = 0;
    char about[256] = "";
    if (!st) st = list_graphs(info, path, gv, &n, about, sizeof about, err);
    if (!st) {
        fprintf(f, "%s: %u graph%s:", path, n, n == 1 ? "" : "s");
        for (uint32_t k = 0; k < n; k++) fprintf(f, "%s %s", k ? "," : "", gv[k].name);
        fprintf(f, " (%s; read with %s, QNN API %u.%u)\n", about, how, G.qi ? G.qi->api_version.core.major : 0,
                G.qi ? G.qi->api_version.core.minor : 0);
        for (uint32_t k = 0; k < n; k++) {
            fprintf(f, "  graph %s (graph info v%u)\n", gv[k].name, gv[k].version);
            for (uint32_t i = 0; i < gv[k].n_in; i++) {
                fprintf(f, "    input  ");
                print_tensor(f, &gv[k].in[i]);
                fprintf(f, "\n");
            }
            for (uint32_t i = 0; i < gv[k].n_out; i++) {
                fprintf(f, "    output ");
                print_tensor(f, &gv[k].out[i]);
                fprintf(f, "\n");
            }
        }
    }
    if (sys) G.sys.context_free(sys);
    ma_unmap_file(&wmf);
    ma_unmap_file(&mf);
    global_release_locked();
    pthread_mutex_unlock(&G.mu);
    return st;
}

/* before anything opens: the DSP search paths (';' separates their directories) */
static ma_status qnn_prepare(const ma_settings *set, ma_error *err) {
    const char *adsp = set->adsp_library_path, *dsp = set->dsp_library_path;
    if (strchr(adsp, ':'))
        return ma_fail(err, MA_ERR_ARG,
                       "ADSP_LIBRARY_PATH=%s: the DSP loader separates directories with ';', not ':' "
                       "(e.g. ADSP_LIBRARY_PATH=\"$PWD/dsp_libs;/usr/lib/rfsa/adsp;/dsp\")",
                       adsp);
    if (strchr(dsp, ':'))
        return ma_fail(err, MA_ERR_ARG, "DSP_LIBRARY_PATH=%s: the DSP loader separates directories with ';', not ':'", dsp);
    /* FastRPC looks the DSP libraries up in DSP_LIBRARY_PATH instead of ADSP_LIBRARY_PATH when
     * the former is set (qualcomm/fastrpc src/apps_std_imp.c @ 29851fde11d4e2a4ce221536485d0f7d46ffca30,
     * apps_std_fopen_with_env): say so, a value in ADSP_LIBRARY_PATH then counts for nothing */
    if (*dsp)
        fprintf(stderr,
                "molmoact: qnn: warning: DSP_LIBRARY_PATH=%s is set: FastRPC looks for the HTP skel there and ignores "
                "ADSP_LIBRARY_PATH%s%s%s\n",
                dsp, *adsp ? " (" : "", adsp, *adsp ? ")" : "");
    return MA_OK;
}

/* A qnn worker's environment, set at its start (never in this process):
 * - LD_LIBRARY_PATH with --qnn-lib-dir in front: libQnnHtp.so opens the HTP stub
 *   (libQnnHtpV73Stub.so) by its bare name, which the loader looks up in the LD_LIBRARY_PATH the
 *   process started with;
 * - ADSP_LIBRARY_PATH, when neither it nor DSP_LIBRARY_PATH is set: --qnn-lib-dir's directory.
 *   FastRPC (libcdsprpc.so, under libQnnHtp.so) reads it with getenv when the HTP's DSP session
 *   opens, to find libQnnHtpV<arch>Skel.so; when it is unset onnxruntime's QNN provider sets it
 *   to its own library directory before loading the backend (QnnBackendManager::LoadBackend,
 *   microsoft/onnxruntime qnn_backend_manager.cc @ 015f13cb6ae89a676f5f8fc5b92f27eb02c6e983), and
 *   newer FastRPC appends its default search path to whatever the variable holds
 *   (get_dirlist_from_env, qualcomm/fastrpc src/apps_std_imp.c @ 29851fde11d4e2a4ce221536485d0f7d46ffca30). */
static int qnn_worker_env(const ma_settings *set, ma_worker_var *out, int cap) {
    const char *dir = set->qnn_lib_dir;
    if (!*dir || cap < 2) return 0;
    char abs[MA_SETTINGS_PATH];
    const char *d = realpath(dir, abs) ? abs : dir; /* absolute: whatever directory the lookup runs in */
    int n = 0;
    snprintf(out[n].name, sizeof out[n].name, "LD_LIBRARY_PATH");
    snprintf(out[n].value, sizeof out[n].value, "%s", d);
    out[n++].prepend = 1;
    if (!set->adsp_library_path[0] && !set->dsp_library_path[0]) { /* else the user's choice stands */
        snprintf(out[n].name, sizeof out[n].name, "ADSP_LIBRARY_PATH");
        snprintf(out[n].value, sizeof out[n].value, "%s", d);
        out[n++].prepend = 0;
    }
    return n;
}

/* ------------------------------------------------------------------ zero-copy */

static ma_status rpc_open_locked(ma_error *err) {
    if (G.rpc_alloc) return MA_OK;
    char path[MA_SETTINGS_PATH + 32];
    const char *dir = G.lib_dir;
    G.lib_rpc = NULL;
    if (*dir) { /* the directory first (a stand-in for tests), then the system's */
        snprintf(path, sizeof path, "%s/libcdsprpc.so", dir);
        if (access(path, F_OK) == 0) {
            ma_status st = check_elf(path, err);
            if (st) return st;
            G.lib_rpc = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        }
    }
    if (!G.lib_rpc) G.lib_rpc = dlopen("libcdsprpc.so", RTLD_NOW | RTLD_LOCAL);
    if (!G.lib_rpc) {
        const char *why = dlerror();
        return ma_fail(err, MA_ERR_IO,
                       "qnn: --qnn-zero-copy needs libcdsprpc.so (the FastRPC library of the device), which cannot be loaded (%s)",
                       why ? why : "not found");
    }
    *(void **)&G.rpc_alloc = dlsym(G.lib_rpc, "rpcmem_alloc");
    *(void **)&G.rpc_free = dlsym(G.lib_rpc, "rpcmem_free");
    *(void **)&G.rpc_to_fd = dlsym(G.lib_rpc, "rpcmem_to_fd");
    if (!G.rpc_alloc || !G.rpc_free || !G.rpc_to_fd) {
        G.rpc_alloc = NULL;
        return ma_fail(err, MA_ERR_IO, "qnn: libcdsprpc.so lacks rpcmem_alloc, rpcmem_free or rpcmem_to_fd");
    }
    return MA_OK;
}

/* the tensors' buffers from rpcmem, registered with the session's (new) context */
static ma_status register_buffers(qnn_sess *q, ma_error *err) {
    qnn_err_t e;
    for (int side = 0; side < 2; side++)
        for (int i = 0; i < (side ? q->n_out : q->n_in); i++) {
            qtensor *t = side ? &q->out[i] : &q->in[i];
            if (!t->rpc) {
                if (t->bytes > 0x7fffffffu)
                    return ma_fail(err, MA_ERR_SHAPE, "%s: tensor %s holds %zu bytes (rpcmem_alloc takes at most 2 GiB)", q->file, t->name,
                                   t->bytes);
                void *p = G.rpc_alloc(MA_RPCMEM_HEAP_ID_SYSTEM, MA_RPCMEM_DEFAULT_FLAGS, (int)(t->bytes ? t->bytes : 1));
                if (!p) return ma_fail(err, MA_ERR_NOMEM, "%s: rpcmem_alloc of %zu bytes for tensor %s failed", q->file, t->bytes, t->name);
                free(t->buf);
                t->buf = p;
                t->rpc = 1;
            }
            const int fd = G.rpc_to_fd(t->buf);
            if (fd < 0) return ma_fail(err, MA_ERR_IO, "%s: rpcmem_to_fd for tensor %s gave no descriptor", q->file, t->name);
            qnn_mem_descriptor d;
            memset(&d, 0, sizeof d);
            d.shape.rank = t->rank;
            d.shape.dims = t->dims;
            d.data_type = t->dtype;
            d.mem_type = QNN_MEMTYPE_ION;
            d.u.ion_fd = fd;
            t->mem = NULL;
            if ((e = G.qi->t.mem_register(q->context, &d, 1, &t->mem)) != QNN_OK || !t->mem) {
                t->mem = NULL;
                return qfail(err, "QnnMem_register", q->file, e);
            }
        }
    return MA_OK;
}

static void deregister_buffers(qnn_sess *q) {
    for (int side = 0; side < 2; side++)
        for (int i = 0; i < MA_SESSION_MAX_IO; i++) {
            qtensor *t = side ? &q->out[i] : &q->in[i];
            if (t->mem && G.qi && G.qi->t.mem_deregister) G.qi->t.mem_deregister(&t->mem, 1);
            t->mem = NULL;
        }
}

/* ------------------------------------------------------------------ the session ops */

static void free_sess(qnn_sess *q) {
    if (!q) return;
    for (int i = 0; i < MA_SESSION_MAX_IO; i++) {
        qtensor *t[2] = {&q->in[i], &q->out[i]};
        for (int k = 0; k < 2; k++) {
            free(t[k]->name);
            if (t[k]->rpc && G.rpc_free) G.rpc_free(t[k]->buf);
            else free(t[k]->buf);
        }
    }
    free(q->path);
    free(q->graph_name);
    free(q);
}

static void qnn_close(ma_session *s) {
    qnn_sess *q = s->impl;
    if (!q) return;
    deregister_buffers(q); /* before the context, the buffers after it */
    if (q->context && G.qi) G.qi->t.context_free(q->context, NULL);
    q->context = NULL;
    free_sess(q);
    s->impl = NULL;
    global_release();
}

/* QNN_COMMON_ERROR_SYSTEM_COMMUNICATION_FATAL (1011): "SSR occurrence (unsuccessful recovery)",
 * the subsystem restart left this process's backend unusable; the QnnContext_create documentation
 * in QnnContext.h lists it with 1007 ("successful recovery"), and onnxruntime's QNN provider names
 * the two so. Nothing this process made can be used again: every later request fails at once, and
 * a resident worker exits after answering so that its supervisor starts it afresh (a new process,
 * a new FastRPC session: ma_qnn_process_lost). */
#define LOST_WHY                                                                                                           \
    "the DSP subsystem restarted and did not recover; this process's QNN backend cannot be used again (a resident worker " \
    "exits and is started afresh for the next request; with --inproc restart molmoact, or the device's cDSP if it persists)"

static void note_error(qnn_err_t e) {
    if (QNN_CODE(e) == QNN_ERR_COMMON_SYSTEM_COMMUNICATION_FATAL) __atomic_store_n(&G.lost, 1, __ATOMIC_SEQ_CST);
}

int ma_qnn_process_lost(void) { return __atomic_load_n(&G.lost, __ATOMIC_SEQ_CST); }

/* the context and graph of a session, from its binary (at open, and after a DSP restart). On
 * failure nothing half-made stays: no context, no graph handle (qnn_run then creates them again). */
static ma_status create_context(qnn_sess *q, const ma_mapfile *mf, ma_error *err) {
    qnn_err_t e;
    ma_status st;
    q->context = q->graph = NULL;
    if ((e = G.qi->t.context_create_from_binary(G.backend, G.device, NULL, mf->data, mf->size, &q->context, NULL)) != QNN_OK) {
        note_error(e);
        q->context = NULL;
        return qfail(err, "QnnContext_createFromBinary", q->file, e);
    }
    if ((e = G.qi->t.graph_retrieve(q->context, q->graph_name, &q->graph)) != QNN_OK) {
        note_error(e);
        st = qfail(err, "QnnGraph_retrieve", q->file, e);
    } else if (!q->graph) {
        st = ma_fail(err, MA_ERR_IO, "QnnGraph_retrieve on %s: graph %s: no handle given", q->file, q->graph_name);
    } else if (!q->zero_copy || !(st = register_buffers(q, err))) {
        return MA_OK;
    }
    deregister_buffers(q);
    G.qi->t.context_free(q->context, NULL);
    q->context = q->graph = NULL;
    return st;
}

/* After a DSP subsystem restart (1007, recovered) the contexts, graphs, memory registrations and
 * power votes of this process are gone: this session's context is created again from its file
 * (the other session of the process does the same at its next request), the vote renewed. */
static ma_status recover(qnn_sess *q, ma_error *err) {
    deregister_buffers(q);
    if (q->context) G.qi->t.context_free(q->context, NULL); /* its handle is stale: the result does not matter */
    q->context = q->graph = NULL;
    ma_mapfile mf = {0};
    ma_status st = ma_map_file(&mf, q->path, err);
    if (!st) st = create_context(q, &mf, err);
    ma_unmap_file(&mf);
    if (!st) {
        pthread_mutex_lock(&G.mu);
        if (G.vote_tried) vote_locked("after the DSP restart");
        pthread_mutex_unlock(&G.mu);
    }
    return st;
}

static qnn_err_t execute(qnn_sess *q) {
    for (int i = 0; i < q->n_in; i++) {
        q->run_in[i] = q->in[i].desc;
        if (q->zero_copy) {
            q->run_in[i].u.v1.mem_type = QNN_MEM_HANDLE;
            q->run_in[i].u.v1.buf.mem = q->in[i].mem;
        } else {
            q->run_in[i].u.v1.mem_type = QNN_MEM_RAW;
            q->run_in[i].u.v1.buf.client.data = q->in[i].buf;
            q->run_in[i].u.v1.buf.client.size = (uint32_t)q->in[i].bytes;
        }
    }
    for (int i = 0; i < q->n_out; i++) {
        q->run_out[i] = q->out[i].desc;
        if (q->zero_copy) {
            q->run_out[i].u.v1.mem_type = QNN_MEM_HANDLE;
            q->run_out[i].u.v1.buf.mem = q->out[i].mem;
        } else {
            q->run_out[i].u.v1.mem_type = QNN_MEM_RAW;
            q->run_out[i].u.v1.buf.client.data = q->out[i].buf;
            q->run_out[i].u.v1.buf.client.size = (uint32_t)q->out[i].bytes;
        }
    }
    return G.qi->t.graph_execute(q->graph, q->run_in, (uint32_t)q->n_in, q->run_out, (uint32_t)q->n_out, NULL, NULL);
}

static ma_status qnn_run(ma_session *s, const ma_tensor *in, ma_tensor *out, ma_error *err) {
    qnn_sess *q = s->impl;
    ma_status st = MA_OK;
    if (ma_qnn_process_lost())
        return ma_fail(err, MA_ERR_IO, "%s (%s): error 1011 (SYSTEM_COMMUNICATION_FATAL) earlier in this process: %s", q->file, s->name,
                       LOST_WHY);
    if (!q->context) { /* a recovery that failed before: try again */
        if ((st = recover(q, err)))
            return ma_error_wrap(err, st, "%s (%s): the context lost in a DSP restart cannot be created again", q->file, s->name);
    }
    for (int i = 0; i < q->n_in; i++) to_graph(&in[i], &q->in[i]);
    qnn_err_t e = execute(q);
    if (QNN_CODE(e) == QNN_ERR_COMMON_SYSTEM_COMMUNICATION) {
        pthread_mutex_lock(&G.mu);
        const unsigned n = ++G.restarts;
        pthread_mutex_unlock(&G.mu);
        fprintf(stderr,
                "molmoact: qnn: %s (%s): the DSP subsystem restarted (error 1007); creating the context again and retrying "
                "(restart %u seen by this process)\n",
                q->file, s->name, n);
        if ((st = recover(q, err)))
            return ma_error_wrap(err, st,
                                 "%s (%s): after a DSP subsystem restart (error 1007, SYSTEM_COMMUNICATION) the context cannot be "
                                 "created again",
                                 q->file, s->name);
        for (int i = 0; i < q->n_in; i++) to_graph(&in[i], &q->in[i]); /* zero-copy buffers may be new */
        e = execute(q);
    }
    note_error(e);
    if (QNN_CODE(e) == QNN_ERR_COMMON_SYSTEM_COMMUNICATION_FATAL)
        return ma_fail(err, MA_ERR_IO, "QnnGraph_execute on %s (%s): error 1011 (SYSTEM_COMMUNICATION_FATAL): %s", q->file, s->name,
                       LOST_WHY);
    if (e != QNN_OK) return qfail(err, "QnnGraph_execute", q->file, e);
    for (int i = 0; i < q->n_out && !st; i++) {
        if ((st = ma_tensor_alloc(&out[i], MA_DT_F32, s->out[i].ndim, s->out[i].shape, err))) break;
        if (from_graph(&q->out[i], &out[i]))
            st = ma_fail(err, MA_ERR_RANGE, "%s (%s): output %s holds a value that is not finite", q->file, s->name, s->out[i].name);
    }
    return st;
}

static const ma_session_ops qnn_ops = {"qnn", qnn_run, qnn_close};

/* the context file of a session: ctx/<name><suffix>_socid77_archv73.bin (the settings' suffix) */
static void ma_qnn_context_name(const ma_settings *set, const char *session, char *out, size_t cap) {
    const int which = !strcmp(session, "vision")          ? MA_SUFFIX_VISION
                      : !strncmp(session, "llm_split", 9) ? MA_SUFFIX_LLM
                      : !strcmp(session, "action_step")   ? MA_SUFFIX_ACTION
                                                          : -1;
    snprintf(out, cap, "ctx/%s%s_socid77_archv73.bin", session, which >= 0 ? set->suffix[which] : "");
}

/* the session's graph: the only one, or (several) the one named as the session or by the io
 * map's "@graph" entry; never chosen by its position */
static ma_status pick_graph(const ma_session *s, const char *file, const graph_view *gv, uint32_t n, const cJSON *map, uint32_t *k,
                            ma_error *err) {
    if (n == 1) {
        *k = 0;
        return MA_OK;
    }
    const cJSON *sm = map ? cJSON_GetObjectItemCaseSensitive(map, s->name) : NULL;
    const cJSON *named = sm ? cJSON_GetObjectItemCaseSensitive(sm, "@graph") : NULL;
    const char *want = named ? named->valuestring : s->name;
    for (uint32_t i = 0; i < n; i++)
        if (!strcmp(gv[i].name, want)) {
            *k = i;
            return MA_OK;
        }
    char names[1024] = "";
    size_t l = 0;
    for (uint32_t i = 0; i < n && l + 2 < sizeof names; i++)
        l += (size_t)snprintf(names + l, sizeof names - l, "%s%.64s", i ? ", " : "", gv[i].name);
    return ma_fail(err, MA_ERR_FORMAT, "%s: holds %u graphs (%s) and none is named %s%s", file, n, names, want,
                   named ? " (--qnn-io-map's @graph)"
                         : "; name the session's graph in --qnn-io-map: {\"SESSION\": {\"@graph\": \"NAME\"}}");
}

ma_status ma_qnn_session_attach(ma_session *s, ma_error *err) {
    qnn_sess *q = calloc(1, sizeof *q);
    if (!q) return ma_fail(err, MA_ERR_NOMEM, "session %s: out of memory", s->name);
    const ma_settings *set = &s->model->set;
    ma_qnn_context_name(set, s->name, q->file, sizeof q->file);
    if (expected_seq(s) < 0) {
        free(q);
        return ma_fail(err, MA_ERR_ARG, "session %s: the prompt length %lld is not in [1, %d]", s->name, (long long)s->static_seq,
                       MA_MAX_PROMPT_SEQ);
    }
    q->zero_copy = set->qnn_zero_copy;
    ma_status st = global_acquire(set, err);
    if (st) {
        free(q);
        return st;
    }
    s->impl = q;
    s->ops = &qnn_ops; /* from here qnn_close undoes everything */
    q->path = ma_path_join(s->model->dir, q->file);
    ma_mapfile mf = {0}, wmf = {0};
    cJSON *map = NULL;
    qnn_handle sys = NULL;
    qnn_err_t e;
    if (!q->path) {
        st = ma_fail(err, MA_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (q->zero_copy) {
        pthread_mutex_lock(&G.mu);
        st = rpc_open_locked(err);
        pthread_mutex_unlock(&G.mu);
        if (st) goto done;
    }
    if ((st = ma_map_file(&mf, q->path, err))) {
        st = ma_error_wrap(err, st, "qnn context for %s", s->name);
        goto done;
    }
    if (!mf.size) {
        st = ma_fail(err, MA_ERR_FORMAT, "%s: empty context binary", q->file);
        goto done;
    }
    if ((st = io_map(set->qnn_io_map, &map, err))) goto done;
    if ((e = G.sys.context_create(&sys)) != QNN_OK) {
        st = qfail(err, "QnnSystemContext_create", q->file, e);
        goto done;
    }
    const qnn_binary_info *info = NULL;
    const char *how = NULL;
    if ((st = binary_info(sys, &mf, q->path, q->file, &info, &wmf, &how, err))) goto done;
    graph_view gv[MA_QNN_MAX_GRAPHS];
    uint32_t n_graphs = 0, k = 0;
    char about[256];
    if ((st = list_graphs(info, q->file, gv, &n_graphs, about, sizeof about, err))) goto done;
    if (set->verbose) {
        fprintf(stderr, "molmoact: qnn: %s: %u graph%s:", q->file, n_graphs, n_graphs == 1 ? "" : "s");
        for (uint32_t i = 0; i < n_graphs; i++) fprintf(stderr, "%s %s", i ? "," : "", gv[i].name);
        fprintf(stderr, " (%s; read with %s)\n", about, how);
    }
    if ((st = pick_graph(s, q->file, gv, n_graphs, map, &k, err))) goto done;
    const graph_view *gi = &gv[k];
    if (!(q->graph_name = strdup(gi->name))) {
        st = ma_fail(err, MA_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (gi->n_in > MA_SESSION_MAX_IO || gi->n_out > MA_SESSION_MAX_IO) {
        st = ma_fail(err, MA_ERR_SHAPE, "%s: graph %s has %u inputs and %u outputs, the session %d and %d", q->file, q->graph_name,
                     gi->n_in, gi->n_out, s->n_in, s->n_out);
        goto done;
    }
    /* copied out now: the system context owns the binary info */
    qtensor gin[MA_SESSION_MAX_IO], gout[MA_SESSION_MAX_IO];
    memset(gin, 0, sizeof gin);
    memset(gout, 0, sizeof gout);
    for (uint32_t i = 0; i < gi->n_in && !st; i++) st = copy_desc(&gin[i], &gi->in[i], q->file, err);
    for (uint32_t i = 0; i < gi->n_out && !st; i++) st = copy_desc(&gout[i], &gi->out[i], q->file, err);
    int bi[MA_SESSION_MAX_IO], bo[MA_SESSION_MAX_IO];
    if (!st) st = bind(s->name, q->file, s->in, s->n_in, gin, (int)gi->n_in, map, bi, "inputs", err);
    if (!st) st = bind(s->name, q->file, s->out, s->n_out, gout, (int)gi->n_out, map, bo, "outputs", err);
    if (!st) {
        for (int i = 0; i < s->n_in; i++) {
            q->in[i] = gin[bi[i]];
            gin[bi[i]].name = NULL;
        }
        for (int i = 0; i < s->n_out; i++) {
            q->out[i] = gout[bo[i]];
            gout[bo[i]].name = NULL;
        }
        q->n_in = s->n_in;
        q->n_out = s->n_out;
        for (int i = 0; i < q->n_in; i++) {
            q->in[i].desc.u.v1.name = q->in[i].name;
            q->in[i].desc.u.v1.dims = q->in[i].dims;
        }
        for (int i = 0; i < q->n_out; i++) {
            q->out[i].desc.u.v1.name = q->out[i].name;
            q->out[i].desc.u.v1.dims = q->out[i].dims;
        }
    }
    for (int i = 0; i < MA_SESSION_MAX_IO; i++) {
        free(gin[i].name);
        free(gout[i].name);
    }
    if (st) goto done;
    G.sys.context_free(sys); /* nothing of the binary info is used after this */
    sys = NULL;
    if ((st = fix_dims(s, q, err))) goto done;
    for (int side = 0; side < 2 && !st; side++)
        for (int i = 0; i < (side ? q->n_out : q->n_in) && !st; i++) {
            qtensor *t = side ? &q->out[i] : &q->in[i];
            size_t n = 1;
            for (uint32_t d = 0; d < t->rank; d++) n *= t->dims[d];
            t->bytes = n * dt_size(t->dtype);
            if (t->bytes > 0xffffffffu) {
                st = ma_fail(err, MA_ERR_SHAPE, "%s: tensor %s holds %zu bytes (a client buffer takes at most 4 GiB)", q->file, t->name,
                             t->bytes);
                break;
            }
            if (!(t->buf = calloc(t->bytes ? t->bytes : 1, 1)))
                st = ma_fail(err, MA_ERR_NOMEM, "%s: out of memory for tensor %s", q->file, t->name);
            if (is_fixed(t->dtype) && !(t->scale > 0.0f && isfinite(t->scale)))
                st = ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s is %s with scale %g (must be positive)", q->file, t->name,
                             dt_name(t->dtype), (double)t->scale);
        }
    if (st) goto done;
    ma_unmap_file(&wmf); /* after the system context (freed above): nothing points into it now */
    if ((st = create_context(q, &mf, err))) goto done;
    pthread_mutex_lock(&G.mu);
    if (!G.vote_tried) { /* the process's first context is loaded: its power vote (vote_locked) */
        G.vote_tried = 1;
        vote_locked("at start");
    }
    pthread_mutex_unlock(&G.mu);
done:
    if (sys) G.sys.context_free(sys);
    ma_unmap_file(&wmf);
    cJSON_Delete(map);
    ma_unmap_file(&mf);
    return st; /* on failure the caller's ma_session_close runs qnn_close */
}

const ma_backend ma_qnn_backend = {
    .name = "qnn",
    .static_prompt = 1,
    .needs_weights = 0,
    .debug_outputs = 0,
    .prepare = qnn_prepare,
    .attach = ma_qnn_session_attach,
    .process_lost = ma_qnn_process_lost,
    .worker_env = qnn_worker_env,
};
