/* SPDX-License-Identifier: Apache-2.0 */
/* The server's statistics as Prometheus reads them (GET /metrics, the text exposition format
 * 0.0.4).
 *
 * A histogram keeps one count per bucket (not cumulative), the count and the sum; writing it
 * gives the cumulative _bucket{le=...} lines, +Inf equal to _count, then _sum and _count. Values
 * are in seconds, the base unit. The text is built in a growing buffer (ma_textbuf); a failed
 * allocation is remembered and the caller answers 500 instead of a truncated page. */
#ifndef MA_SERVER_METRICS_H
#define MA_SERVER_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "core/util.h"

#define MA_HIST_MAX_BUCKETS 24

typedef struct ma_buckets {
    int n;
    const double *le;        /* upper bounds, increasing (+Inf implied after the last) */
    const char *const *text; /* the same bounds as the le="..." label shows them */
} ma_buckets;

/* the request's whole time: 10 ms to 60 s; a component's: 1 ms to 60 s */
extern const ma_buckets ma_request_buckets, ma_component_buckets;
/* a delay in control ticks: 0 to 50 */
extern const ma_buckets ma_tick_buckets;

typedef struct ma_histogram {
    const ma_buckets *b;
    uint64_t count;
    double sum;
    uint64_t in[MA_HIST_MAX_BUCKETS + 1]; /* per bucket; the last: above every bound */
} ma_histogram;

void ma_hist_init(ma_histogram *h, const ma_buckets *b);
/* a negative or NaN value is counted as 0 */
void ma_hist_observe(ma_histogram *h, double seconds);

typedef struct ma_textbuf {
    ma_buf b;   /* the text: b.data, b.len */
    int failed; /* an allocation failed: the text is incomplete */
} ma_textbuf;

void ma_tb_printf(ma_textbuf *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ma_tb_free(ma_textbuf *t);
/* a label value with \, " and newline escaped as the format asks */
void ma_tb_label_value(ma_textbuf *t, const char *v);
/* "# HELP name help\n# TYPE name type\n" */
void ma_tb_family(ma_textbuf *t, const char *name, const char *type, const char *help);
/* name_bucket{labels,le="..."} (cumulative, +Inf last), name_sum{labels}, name_count{labels};
 * labels: NULL, or `key="value"` pairs already escaped, without braces */
void ma_tb_histogram(ma_textbuf *t, const char *name, const char *labels, const ma_histogram *h);

#endif
