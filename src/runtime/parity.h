/* SPDX-License-Identifier: Apache-2.0 */
/* The parity gate (docs/ARCHITECTURE.md "Sessions"): every session fed its golden inputs, each output
 * compared with the golden (cosine, max |diff|, share within 1e-3 x rms), then the end-to-end
 * actions. Gate: cosine >= threshold for every row. */
#ifndef MA_PARITY_H
#define MA_PARITY_H

#include <stdio.h>

#include "runtime/pipeline.h"

typedef struct ma_cmp {
    double cosine, max_abs, rms, within, max_rel; /* max_rel = max_abs / rms(reference) */
} ma_cmp;

typedef struct ma_parity_row {
    char session[32], tensor[32];
    ma_cmp c;
    int pass;
    int info; /* a diagnostic row (the vision session's intermediates): printed, never gated */
} ma_parity_row;

typedef struct ma_parity_report {
    ma_parity_row *rows;
    size_t n, cap;
    double gate, action_cosine;
    int end_to_end_only; /* quantised contexts: session rows are reported, only the actions gated */
    int pass;
} ma_parity_report;

/* the documented gate for a model's precisions: 0.9999 on every row for f16/bf16/f32 weights;
 * for quantised contexts the end-to-end actions only, 0.999 with q8_0 and 0.99 with q4_0 */
double ma_parity_default_gate(const ma_model *m, int *end_to_end_only);

ma_status ma_parity_run(const ma_backend *be, const ma_model *m, const char *golden_dir, double gate, ma_parity_report *rep, ma_error *err);
/* parity through an existing runner (e.g. the resident workers' link) */
ma_status ma_parity_run_runner(ma_runner *r, const char *golden_dir, double gate, int e2e_only, ma_parity_report *rep, ma_error *err);
/* the same with the gate applied to the end-to-end actions only */
ma_status ma_parity_run_e2e(const ma_backend *be, const ma_model *m, const char *golden_dir, double gate, ma_parity_report *rep,
                            ma_error *err);
void ma_parity_print(const ma_parity_report *rep, FILE *f, int json);
void ma_parity_free(ma_parity_report *rep);

#endif
