/* SPDX-License-Identifier: Apache-2.0 */
#include "runtime/latency.h"

#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"

#define N_FIELDS ((int)(sizeof(ma_timing) / sizeof(double)))

static double *field(ma_timing *t, int i) { return (double *)t + i; }
static double cfield(const ma_timing *t, int i) { return ((const double *)t)[i]; }

void ma_latency_init(ma_latency *l) {
    memset(l, 0, sizeof *l);
    for (int i = 0; i < N_FIELDS; i++) *field(&l->min, i) = DBL_MAX;
}

void ma_latency_add(ma_latency *l, const ma_timing *t) {
    for (int i = 0; i < N_FIELDS; i++) {
        double v = cfield(t, i);
        *field(&l->sum, i) += v;
        if (v < cfield(&l->min, i)) *field(&l->min, i) = v;
        if (v > cfield(&l->max, i)) *field(&l->max, i) = v;
    }
    if (l->n < MA_LATENCY_KEEP) l->totals[l->n] = t->total;
    l->n++;
}

/* the nearest-rank percentile p of the kept totals (0 when there are none) */
static double total_percentile(const ma_latency *l, double p) {
    const int n = l->n < MA_LATENCY_KEEP ? l->n : MA_LATENCY_KEEP;
    if (n < 1) return 0.0;
    double s[MA_LATENCY_KEEP];
    memcpy(s, l->totals, sizeof(double) * (size_t)n);
    return ma_percentile(s, (size_t)n, p);
}

static ma_timing latency_mean(const ma_latency *l) {
    ma_timing m;
    memset(&m, 0, sizeof m);
    for (int i = 0; i < N_FIELDS && l->n; i++) *field(&m, i) = cfield(&l->sum, i) / l->n;
    return m;
}

static double inference(const ma_timing *t) {
    return t->vision + t->llm[0] + t->llm[1] + t->llm[2] + t->llm[3] + t->action_context + t->action_step;
}

typedef struct {
    const char *name;
    double mean, min, max;
} row;

static int rows(const ma_latency *l, int flow_steps, row *out) {
    ma_timing m = latency_mean(l);
    static char step_name[32];
    snprintf(step_name, sizeof step_name, "action_step x%d", flow_steps);
    const ma_timing *mn = &l->min, *mx = &l->max;
    int n = 0;
    out[n++] = (row){"vision", m.vision, mn->vision, mx->vision};
    for (int i = 0; i < 4; i++) out[n++] = (row){MA_SESSION_NAMES[1 + i], m.llm[i], mn->llm[i], mx->llm[i]};
    out[n++] = (row){"action_context", m.action_context, mn->action_context, mx->action_context};
    out[n++] = (row){step_name, m.action_step, mn->action_step, mx->action_step};
    /* min/max of a sum are not the sum of the minima: only the mean is shown for the inference total */
    out[n++] = (row){"inference", inference(&m), -1, -1};
    out[n++] = (row){"transfer", m.transfer, mn->transfer, mx->transfer};
    out[n++] = (row){"host glue", m.host, mn->host, mx->host};
    out[n++] = (row){"total", m.total, mn->total, mx->total};
    return n;
}

void ma_latency_print(const ma_latency *l, const char *mode, int flow_steps, FILE *f) {
    row r[16];
    int n = rows(l, flow_steps, r);
    fprintf(f, "latency over %d run%s (%s), milliseconds\n", l->n, l->n == 1 ? "" : "s", mode);
    fprintf(f, "  %-18s %11s %11s %11s\n", "component", "mean", "min", "max");
    for (int i = 0; i < n; i++) {
        if (i == 7) fprintf(f, "  %-18s %11s %11s %11s\n", "------------------", "-----------", "-----------", "-----------");
        if (r[i].min < 0) fprintf(f, "  %-18s %11.3f %11s %11s\n", r[i].name, r[i].mean, "", "");
        else fprintf(f, "  %-18s %11.3f %11.3f %11.3f\n", r[i].name, r[i].mean, r[i].min, r[i].max);
    }
}

void ma_latency_print_json(const ma_latency *l, const char *mode, int flow_steps, FILE *f) {
    ma_timing m = latency_mean(l);
    fprintf(f,
            "{\"runs\": %d, \"mode\": \"%s\", \"mean_ms\": {\"vision\": %.4f, \"llm_split0\": %.4f, \"llm_split1\": %.4f, "
            "\"llm_split2\": %.4f, \"llm_split3\": %.4f, \"action_context\": %.4f, \"action_step\": %.4f, "
            "\"action_step_calls\": %d, \"inference\": %.4f, \"transfer\": %.4f, \"host\": %.4f, \"total\": %.4f}, "
            "\"min_total_ms\": %.4f, \"max_total_ms\": %.4f, \"median_total_ms\": %.4f, \"p90_total_ms\": %.4f}",
            l->n, mode, m.vision, m.llm[0], m.llm[1], m.llm[2], m.llm[3], m.action_context, m.action_step, flow_steps, inference(&m),
            m.transfer, m.host, m.total, l->n ? l->min.total : 0.0, l->max.total, total_percentile(l, 50), total_percentile(l, 90));
}
