/* SPDX-License-Identifier: Apache-2.0 */
/* Prometheus' text exposition format 0.0.4 and nearest-rank percentiles (server/metrics.h). */
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
                                        "0.5", "1", "2.5", "5", "10", "30", "60"};

const ma_buckets ma_request_buckets = {(int)(sizeof REQ_LE / sizeof REQ_LE[0]), REQ_LE, REQ_TEXT};
const ma_buckets ma_component_buckets = {(int)(sizeof COMP_LE / sizeof COMP_LE[0]), COMP_LE, COMP_TEXT};

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
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        const size_t room = t->cap - t->len;
        const int n = vsnprintf(t->p ? t->p + t->len : NULL, t->p ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0) { t->failed = 1; return; }
        if (t->p && (size_t)n < room) { t->len += (size_t)n; return; }
        size_t cap = t->cap ? t->cap : 4096;
        while (cap < t->len + (size_t)n + 1) cap *= 2;
        char *p = realloc(t->p, cap);
        if (!p) { t->failed = 1; return; }
        t->p = p;
        t->cap = cap;
    }
}

void ma_tb_free(ma_textbuf *t) {
    free(t->p);
    memset(t, 0, sizeof *t);
}

/* the length of the valid UTF-8 sequence at s (0: not one); no overlongs, surrogates or > U+10FFFF */
static int utf8_len(const unsigned char *s) {
    const unsigned c = s[0];
    int n;
    unsigned lo = 0x80, hi = 0xbf;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) n = 2;
    else if (c >= 0xe0 && c <= 0xef) n = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
    else if (c >= 0xf0 && c <= 0xf4) n = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
    else return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xbf) return 0;
    return n;
}

void ma_tb_label_value(ma_textbuf *t, const char *v) {
    const unsigned char *s = (const unsigned char *)v;
    while (*s) {
        const int n = utf8_len(s);
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

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double ma_percentile(double *v, int n, double p) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    /* ceil(p / 100 * n) with the product rounded first, so that 90% of 10 is 9, not 9.000000000000002 */
    double rank = ceil(round(p * n * 1e6) / 1e8);
    int k = (int)rank;
    if (k < 1) k = 1;
    if (k > n) k = n;
    return v[k - 1];
}
