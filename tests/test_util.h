/* SPDX-License-Identifier: Apache-2.0 */
/* Shared helpers for the cmocka tests. */
#ifndef MA_TEST_UTIL_H
#define MA_TEST_UTIL_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "core/error.h"
#include "io/mapfile.h"

#ifndef MA_SOURCE_DIR
#define MA_SOURCE_DIR "."
#endif
#ifndef MA_BINARY_DIR
#define MA_BINARY_DIR "."
#endif

/* deterministic pseudo-random numbers in [-1, 1) */
static inline float tu_rand(uint64_t *state) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*state >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

static inline void tu_fill(float *x, size_t n, uint64_t seed) {
    uint64_t s = seed * 2654435761ull + 1;
    for (size_t i = 0; i < n; i++) x[i] = tu_rand(&s);
}

static inline double tu_cosine(const float *a, const float *b, size_t n) {
    double d = 0, na = 0, nb = 0;
    for (size_t i = 0; i < n; i++) {
        d += (double)a[i] * b[i];
        na += (double)a[i] * a[i];
        nb += (double)b[i] * b[i];
    }
    return (na == 0 && nb == 0) ? 1.0 : d / sqrt(na * nb);
}

static inline double tu_maxrel(const float *a, const float *b, size_t n) {
    double mx = 0, ss = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > mx) mx = d;
        ss += (double)b[i] * b[i];
    }
    double rms = sqrt(ss / (double)(n ? n : 1));
    return rms > 0 ? mx / rms : mx;
}

/* a fresh empty directory under the build tree */
static inline void tu_tmpdir(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/test-tmp/%s-%d", MA_BINARY_DIR, name, (int)getpid());
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", out, out);
    if (system(cmd) != 0) fail_msg("cannot create %s", out);
}

static inline void tu_rmdir(const char *path) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", path);
}

/* assert a failing call's message mentions `needle` */
#define assert_fails_naming(call, err, needle)                                                        \
    do {                                                                                              \
        ma_status _s = (call);                                                                        \
        if (_s == MA_OK) fail_msg("%s succeeded, expected an error naming %s", #call, needle);        \
        if (!strstr((err).msg, needle)) fail_msg("error \"%s\" does not name %s", (err).msg, needle); \
    } while (0)

#endif
