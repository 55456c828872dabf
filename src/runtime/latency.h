/* SPDX-License-Identifier: Apache-2.0 */
/* The latency table: per-component means (and minima) over N requests, pure inference apart from
 * host glue and transfer, as text or JSON. */
#ifndef MA_LATENCY_H
#define MA_LATENCY_H

#include <stdio.h>

#include "runtime/pipeline.h"

#define MA_LATENCY_KEEP 4096 /* totals kept for the median and p90 */

typedef struct ma_latency {
    ma_timing sum, min, max;
    int n;
    double totals[MA_LATENCY_KEEP];
} ma_latency;

void ma_latency_init(ma_latency *l);
void ma_latency_add(ma_latency *l, const ma_timing *t);
/* mode: "resident" or "inproc"; flow_steps: action_step calls per request */
void ma_latency_print(const ma_latency *l, const char *mode, int flow_steps, FILE *f);
void ma_latency_print_json(const ma_latency *l, const char *mode, int flow_steps, FILE *f);

#endif
