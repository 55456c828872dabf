/* SPDX-License-Identifier: Apache-2.0 */
#include "runtime/engine.h"

#include "core/env.h"
#include "kernels/gemm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

/* an environment variable that must be a positive integer up to max, when set */
static ma_status env_positive(const char *name, long max, ma_error *err) {
    const char *e = getenv(name);
    if (!e) return MA_OK;
    char *end;
    errno = 0;
    long v = strtol(e, &end, 10);
    if (!ma_plain_decimal(e, 0) || *end || errno || v < 1 || v > max) /* strtol alone takes " 2" and "+1" */
        return ma_fail(err, MA_ERR_ARG, "%s=%s: must be an integer in [1, %ld]", name, e, max);
    return MA_OK;
}

ma_status ma_env_check(ma_error *err) {
    static const char *known[] = {"portable", "avx2", "avx512", "vnni", "amx", "neon", "neon_dot", "scalar", NULL};
    const char *k = getenv("MOLMOACT_KERNELS");
    if (k) {
        int available = !strcmp(k, "scalar"), is_known = 0;
        char list[128] = "scalar";
        for (int i = 0; i < ma_gemm_kernel_count(); i++) {
            const char *n = ma_gemm_kernel_name(i);
            available |= !strcmp(k, n);
            snprintf(list + strlen(list), sizeof list - strlen(list), ", %s", n);
        }
        for (int i = 0; known[i]; i++) is_known |= !strcmp(k, known[i]);
        if (!available)
            return ma_fail(err, MA_ERR_ARG, "MOLMOACT_KERNELS=%s: %s (this CPU and build have: %s)", k,
                           is_known ? "not supported by this CPU or build" : "unknown kernel set", list);
    }
    ma_backend backend;
    ma_status bs = ma_backend_current(&backend, err);
    if (bs) return bs;
    const char *p = getenv("MOLMOACT_GEMM_PANELS");
    if (p && strcmp(p, "in_place") && strcmp(p, "convert"))
        return ma_fail(err, MA_ERR_ARG, "MOLMOACT_GEMM_PANELS=%s: must be in_place or convert", p);
    ma_status s;
    if ((s = env_positive("MOLMOACT_THREADS", 64, err)) || (s = env_positive("MOLMOACT_WORKER_DEADLINE_MS", 86400000L, err)) ||
        (s = env_positive("MOLMOACT_PROMPT_SEQ", MA_MAX_PROMPT_SEQ, err)) ||
        (s = env_positive("MOLMOACT2_PROMPT_SEQ", MA_MAX_PROMPT_SEQ, err)) || (s = ma_env_check_aliases(err)) ||
        (s = ma_env_check_suffixes(err)))
        return s;
    return MA_OK;
}

ma_status ma_engine_open(const char *dir, const char *norm_tag, int inproc, const ma_resident_opts *ropts, ma_engine *e,
                         ma_error *err) {
    memset(e, 0, sizeof *e);
    e->inproc = inproc;
    ma_status s = ma_env_check(err);
    if (s) return s;
    ma_backend backend;
    if ((s = ma_backend_current(&backend, err))) return s;
    if ((s = ma_backend_prepare(backend, err))) return s;
    /* in process on the cpu backend, the host holds every weight; otherwise only the embedding */
    s = inproc && backend == MA_BACKEND_CPU ? ma_model_open(dir, norm_tag, &e->host, err)
                                            : ma_model_open_parts(dir, norm_tag, MA_PART_EMBED, &e->host, err);
    if (s) return s;
    if (inproc) {
        s = ma_runner_open(&e->host, &e->local, err);
        e->runner = &e->local;
    } else {
        s = ma_resident_open(&e->host, dir, norm_tag, ropts, &e->resident, err);
        if (!s) e->runner = &e->resident->runner;
    }
    if (s) {
        ma_model_close(&e->host);
        memset(e, 0, sizeof *e);
    }
    return s;
}

ma_status ma_engine_run(ma_engine *e, const ma_obs *obs, ma_result *res, ma_trace *trace, ma_error *err) {
    return ma_runner_run(e->runner, obs, res, trace, err);
}

/* VmHWM of a process from /proc, KiB (0 when unreadable) */
static long vm_hwm_kb(pid_t pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kb = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) { sscanf(line + 6, "%ld", &kb); break; }
    fclose(f);
    return kb;
}

void ma_engine_peak_rss(const ma_engine *e, long *self_kb, long *workers_kb) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    *self_kb = ru.ru_maxrss;
    *workers_kb = 0;
    if (e->resident)
        for (int i = 0; i < MA_NUM_WORKERS; i++)
            if (e->resident->w[i].pid > 0) *workers_kb += vm_hwm_kb(e->resident->w[i].pid);
}

int ma_engine_close(ma_engine *e) {
    int unclean = 0;
    if (e->inproc && e->runner) ma_runner_close(&e->local);
    if (e->resident) unclean = ma_resident_close(e->resident);
    if (e->runner) ma_model_close(&e->host);
    memset(e, 0, sizeof *e);
    return unclean;
}
