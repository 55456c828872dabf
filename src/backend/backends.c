/* SPDX-License-Identifier: Apache-2.0 */
#include "backend/backends.h"
#include "backend/cpu/cpu.h"
#include "backend/qnn/qnn.h"

#include <string.h>

static const ma_backend *const ALL[] = {&ma_cpu_backend, &ma_qnn_backend};
#define N_BACKENDS ((int)(sizeof ALL / sizeof ALL[0]))

const ma_backend *ma_backend_find(const char *name) {
    if (!name || !*name) return ALL[0];
    for (int i = 0; i < N_BACKENDS; i++)
        if (!strcmp(ALL[i]->name, name)) return ALL[i];
    return NULL;
}

const ma_backend *ma_backend_at(int i) { return i >= 0 && i < N_BACKENDS ? ALL[i] : NULL; }

int ma_backend_count(void) { return N_BACKENDS; }
