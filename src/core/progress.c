/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L
#include "core/progress.h"
#include "core/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int g_quiet;

void ma_progress_set_quiet(int quiet) { g_quiet = quiet; }
int ma_progress_quiet(void) { return g_quiet; }

static void fmt_bytes(char *out, size_t cap, uint64_t b) {
    if (b >= (1ull << 30)) snprintf(out, cap, "%.2f GiB", (double)b / (1ull << 30));
    else if (b >= (1ull << 20)) snprintf(out, cap, "%.1f MiB", (double)b / (1ull << 20));
    else snprintf(out, cap, "%.1f KiB", (double)b / 1024.0);
}

static void fmt_time(char *out, size_t cap, double s) {
    if (s < 60) snprintf(out, cap, "%.0f s", s);
    else if (s < 3600) snprintf(out, cap, "%dm%02ds", (int)(s / 60), (int)s % 60);
    else snprintf(out, cap, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
}

/* the fraction done, by bytes where counted, else by items */
static double fraction(const ma_progress *p) {
    if (p->total_bytes) return p->bytes >= p->total_bytes ? 1.0 : (double)p->bytes / (double)p->total_bytes;
    if (p->total_items) return p->items >= p->total_items ? 1.0 : (double)p->items / (double)p->total_items;
    return 0.0;
}

static void line(const ma_progress *p, char *out, size_t cap, int final) {
    const double f = fraction(p), el = ma_now_s() - p->t0;
    char b1[32], b2[32], te[32], tr[32];
    size_t n = (size_t)snprintf(out, cap, "%s: ", p->what);
#define ADD(...)                                                           \
    do {                                                                   \
        if (n < cap) n += (size_t)snprintf(out + n, cap - n, __VA_ARGS__); \
    } while (0)
    if (p->total_items) ADD("%llu/%llu %s, ", (unsigned long long)p->items, (unsigned long long)p->total_items, p->item_unit);
    else if (p->items) ADD("%llu %s, ", (unsigned long long)p->items, p->item_unit);
    if (p->total_bytes) {
        fmt_bytes(b1, sizeof b1, p->bytes);
        fmt_bytes(b2, sizeof b2, p->total_bytes);
        ADD("%s of %s, ", b1, b2);
    }
    if ((p->total_bytes || p->total_items) && n >= 2 && n < cap) {
        n -= 2;
        ADD(" (%.0f%%), ", 100.0 * f);
    }
    fmt_time(te, sizeof te, el);
    ADD("%s%s", te, final ? " in all" : "");
    if (!final && f > 0.02 && f < 1.0) {
        fmt_time(tr, sizeof tr, el * (1.0 - f) / f);
        ADD(", about %s left", tr);
    }
#undef ADD
}

static void draw(ma_progress *p, int final) {
    char text[256];
    line(p, text, sizeof text, final);
    if (p->mode == 2) {
        const int width = 24, filled = (int)(fraction(p) * width + 0.5);
        char bar[32];
        for (int i = 0; i < width; i++) bar[i] = i < filled ? '#' : '.';
        bar[width] = '\0';
        fprintf(stderr, "\r\033[K[%s] %s%s", bar, text, final ? "\n" : "");
    } else fprintf(stderr, "%s\n", text);
    fflush(stderr);
    p->drawn = 1;
}

void ma_progress_begin(ma_progress *p, const char *what, uint64_t total_bytes, uint64_t total_items, const char *item_unit) {
    memset(p, 0, sizeof *p);
    snprintf(p->what, sizeof p->what, "%s", what);
    snprintf(p->item_unit, sizeof p->item_unit, "%s", item_unit ? item_unit : "");
    p->total_bytes = total_bytes;
    p->total_items = total_items;
    p->mode = g_quiet ? 0 : isatty(STDERR_FILENO) ? 2 : 1;
    p->t0 = p->last_draw = ma_now_s();
    p->last_tenth = 0;
    if (p->mode) draw(p, 0);
}

void ma_progress_add(ma_progress *p, uint64_t bytes, uint64_t items) {
    p->bytes += bytes;
    p->items += items;
    if (!p->mode) return;
    const double t = ma_now_s();
    const int tenth = (int)(fraction(p) * 10.0), known = p->total_bytes || p->total_items;
    if (p->mode == 2 ? t - p->last_draw >= 0.1
                     : (known && tenth > p->last_tenth && tenth < 10) || t - p->last_draw >= (known ? 30.0 : 10.0)) {
        p->last_draw = t;
        p->last_tenth = tenth;
        draw(p, 0);
    }
}

void ma_progress_end(ma_progress *p, int ok) {
    if (!p->mode) return;
    if (ok) draw(p, 1);
    else if (p->mode == 2 && p->drawn) {
        fprintf(stderr, "\n");
        fflush(stderr);
    }
    p->mode = 0;
}
