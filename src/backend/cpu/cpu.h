/* SPDX-License-Identifier: Apache-2.0 */
/* The cpu backend (see cpu.c). */
#ifndef MA_BACKEND_CPU_H
#define MA_BACKEND_CPU_H

#include "runtime/session.h"

/* s: a session whose io spec is filled; its weights must be loaded in this process */
ma_status ma_cpu_session_attach(ma_session *s, ma_error *err);

/* the cpu backend: this engine's kernels on the opened model's weights */
extern const ma_backend ma_cpu_backend;

#endif
