/* SPDX-License-Identifier: Apache-2.0 */
#include "runtime/engine.h"

#include "kernels/gemm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

ma_status ma_engine_open(const char *dir, const char *norm_tag, int inproc, const ma_settings *st, const ma_backend *be,
                         const ma_resident_opts *ropts, ma_engine *e, ma_error *err) {
    memset(e, 0, sizeof *e);
    ma_settings defaults;
    if (!st) {
        ma_settings_init(&defaults);
        st = &defaults;
    }
    e->inproc = inproc;
    e->backend = be;
    ma_status s;
    /* in process, the engine computes here: the process's kernels from its settings (the first
     * engine's; a later one may not change them). Resident, the workers apply their own. */
    if (inproc && (s = ma_kernels_configure(st, err))) return s;
    if (be->prepare && (s = be->prepare(st, err))) return s;
    /* in process on a backend that computes from the weights, the host holds every weight;
     * otherwise only the embedding */
    s = ma_model_open_with(dir, norm_tag, inproc && be->needs_weights ? MA_PART_ALL : MA_PART_EMBED, st, &e->host, err);
    if (s) return s;
    if (inproc) {
        s = ma_runner_open(be, &e->host, &e->local, err);
        e->runner = &e->local;
    } else {
        s = ma_resident_open(&e->host, be, dir, norm_tag, ropts, &e->resident, err);
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
        if (!strncmp(line, "VmHWM:", 6)) {
            sscanf(line + 6, "%ld", &kb);
            break;
        }
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
