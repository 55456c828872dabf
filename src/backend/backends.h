/* SPDX-License-Identifier: Apache-2.0 */
/* The registry of backends: the one place that knows them all. The API, a command or a worker's
 * start picks one by name and hands it down (runtime/session.h, ma_backend); runtime/ names none. */
#ifndef MA_BACKENDS_H
#define MA_BACKENDS_H

#include "runtime/session.h"

/* the backend called name ("cpu", "qnn"; NULL or "" is "cpu"), NULL when this build has none */
const ma_backend *ma_backend_find(const char *name);
/* the backends this build has, in order, and how many */
const ma_backend *ma_backend_at(int i);
int ma_backend_count(void);

#endif
