/* SPDX-License-Identifier: Apache-2.0 */
/* Progress of long work (compile, --preload, serve's start-up): on a terminal one line redrawn
 * in place (a bar, counts, bytes, elapsed and remaining time), at most ten times a second; when
 * stderr is not a terminal, a plain line at every tenth of the work (and at least every 30 s);
 * nothing when quiet (--quiet, or ma_progress_set_quiet). Everything goes to stderr, so a
 * command's results on stdout are unchanged. */
#ifndef MA_PROGRESS_H
#define MA_PROGRESS_H

#include <stdint.h>

typedef struct ma_progress {
    char what[64];
    uint64_t total_bytes, total_items, bytes, items;
    double t0, last_draw;
    int mode; /* 0 silent, 1 plain lines, 2 terminal */
    int last_tenth, drawn;
    char item_unit[16];
} ma_progress;

void ma_progress_set_quiet(int quiet);
int ma_progress_quiet(void); /* what ma_progress_set_quiet set: other reports follow it */
/* total_bytes and total_items: either may be 0 (not counted); item_unit names the items ("tensors") */
void ma_progress_begin(ma_progress *p, const char *what, uint64_t total_bytes, uint64_t total_items, const char *item_unit);
void ma_progress_add(ma_progress *p, uint64_t bytes, uint64_t items);
/* the final line (done, elapsed); a failed run ends with ok = 0 */
void ma_progress_end(ma_progress *p, int ok);

#endif
