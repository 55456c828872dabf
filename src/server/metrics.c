/* SPDX-License-Identifier: Apache-2.0 */
/* Prometheus' text exposition format 0.0.4 (server/metrics.h). */
#include "server/metrics.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double REQ_LE[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
static const char *const REQ_TEXT[] = {"0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "30", "60"};
static const double COMP_LE[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
static const char *const COMP_TEXT[] = {"0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25",
                                        "0.5",   "1",      "2.5",   "5",    "10",    "30",   "60"};

const ma_buckets ma_request_buckets = {(int)(sizeof REQ_LE / sizeof REQ_LE[0]), REQ_LE, REQ_TEXT};
const ma_buckets ma_component_buckets = {(int)(sizeof COMP_LE / sizeof COMP_LE[0]), COMP_LE, COMP_TEXT};
static const double TICK_LE[] = {0, 1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50};
static const char *const TICK_TEXT[] = {"0", "1", "2", "3", "4", "5", "6", "8", "10", "15", "20", "30", "50"};
const ma_buckets ma_tick_buckets = {(int)(sizeof TICK_LE / sizeof TICK_LE[0]), TICK_LE, TICK_TEXT};

void ma_hist_init(ma_histogram *h, const ma_buckets *b) {
    memset(h, 0, sizeof *h);
    h->b = b;
}

void ma_hist_observe(ma_histogram *h, double v) {
    if (!(v > 0)) v = 0; /* NaN too */
    int i = 0;
    while (i < h->b->n && v > h->b->le[i]) i++; /* le: a value equal to the bound is in its bucket */
    h->in[i]++;
    h->count++;
    h->sum += v;
}

void ma_tb_printf(ma_textbuf *t, const char *fmt, ...) {
    if (t->failed) return;
    va_list ap;
    va_start(ap, fmt);
    if (ma_buf_vprintf(&t->b, fmt, ap)) t->failed = 1;
    va_end(ap);
}

void ma_tb_free(ma_textbuf *t) {
    ma_buf_free(&t->b);
    memset(t, 0, sizeof *t);
}

void ma_tb_label_value(ma_textbuf *t, const char *v) {
    const unsigned char *s = (const unsigned char *)v, *const end = s + strlen(v);
    while (*s) {
        const int n = (int)ma_utf8_seq(s, (size_t)(end - s)); /* 0: not UTF-8 */
        if (*s == '\\') ma_tb_printf(t, "\\\\");
        else if (*s == '"') ma_tb_printf(t, "\\\"");
        else if (*s == '\n') ma_tb_printf(t, "\\n");
        else if (!n || *s < 0x20 || *s == 0x7f) ma_tb_printf(t, "?"); /* the format is UTF-8 text: a stray byte or control is replaced */
        else ma_tb_printf(t, "%.*s", n, (const char *)s);
        s += n ? n : 1;
    }
}

void ma_tb_family(ma_textbuf *t, const char *name, const char *type, const char *help) {
    ma_tb_printf(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* a sum as Go's strconv (what Prometheus writes) would: the shortest form that reads back */
static void print_value(ma_textbuf *t, double v) {
    char s[40];
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(s, sizeof s, "%.*g", prec, v);
        if (strtod(s, NULL) == v) break;
    }
    ma_tb_printf(t, "%s", s);
}

void ma_tb_histogram(ma_textbuf *t, const char *name, const char *labels, const ma_histogram *h) {
    const char *sep = labels && *labels ? "," : "";
    if (!labels) labels = "";
    uint64_t cum = 0;
    for (int i = 0; i < h->b->n; i++) {
        cum += h->in[i];
        ma_tb_printf(t, "%s_bucket{%s%sle=\"%s\"} %llu\n", name, labels, sep, h->b->text[i], (unsigned long long)cum);
    }
    cum += h->in[h->b->n];
    ma_tb_printf(t, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep, (unsigned long long)cum);
    ma_tb_printf(t, "%s_sum%s%s%s ", name, *labels ? "{" : "", labels, *labels ? "}" : "");
    print_value(t, h->sum);
    ma_tb_printf(t, "\n%s_count%s%s%s %llu\n", name, *labels ? "{" : "", labels, *labels ? "}" : "", (unsigned long long)h->count);
}
