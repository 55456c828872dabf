/* SPDX-License-Identifier: Apache-2.0 */
/* What the molmoact program itself needs beyond the public API (include/molmoact.h): the engine
 * behind a handle (for --golden parity, bench's memory report) and a run that also records every
 * intermediate (--dump). Not exported from libmolmoact.so; the program links the API statically. */
#ifndef MA_API_INTERNAL_H
#define MA_API_INTERNAL_H

#include "molmoact.h"
#include "runtime/engine.h"
#include "runtime/trace.h"

ma_engine *molmoact_internal_engine(molmoact *e);
/* the public error and status of an internal one */
molmoact_status molmoact_internal_report(molmoact_error *out, ma_status s, const ma_error *e);
/* molmoact_infer without the lock and with an optional trace; internal status and message */
ma_status molmoact_internal_run(molmoact *e, const molmoact_observation *obs, molmoact_result *res, ma_trace *trace, ma_error *err);

#endif
