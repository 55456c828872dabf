/* SPDX-License-Identifier: Apache-2.0 */
/* The runtime a command uses: the seven sessions resident in six worker processes (default), or
 * in this process (--inproc). Both run the same pipeline (runtime/pipeline.h) over the same
 * sessions; only the link to the sessions differs. */
#ifndef MA_ENGINE_H
#define MA_ENGINE_H

#include "runtime/resident.h"

typedef struct ma_engine {
    ma_model host;   /* everything (inproc) or the host part only (resident) */
    ma_runner local; /* inproc */
    ma_resident *resident;
    ma_runner *runner; /* the active one */
    const ma_backend *backend;
    int inproc;
} ma_engine;

/* the model in dir with settings st on backend be (the caller's choice, from the registry in
 * src/backend/backends.h): the process's kernels configured from st, the backend's checks made,
 * then the sessions opened here (inproc) or in the resident workers, which get st in their start
 * message */
ma_status ma_engine_open(const char *dir, const char *norm_tag, int inproc, const ma_settings *st, const ma_backend *be,
                         const ma_resident_opts *ropts, ma_engine *e, ma_error *err);
ma_status ma_engine_run(ma_engine *e, const ma_obs *obs, ma_result *res, ma_trace *trace, ma_error *err);
/* peak resident memory in KiB: this process, and the live workers together (0 inproc) */
void ma_engine_peak_rss(const ma_engine *e, long *self_kb, long *workers_kb);
/* returns the number of workers that did not shut down cleanly (0 inproc) */
int ma_engine_close(ma_engine *e);

#endif
