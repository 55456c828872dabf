/* SPDX-License-Identifier: Apache-2.0 */
/* Named byte budgets: every byte a client can make the server hold is taken from one of these
 * before it is allocated and given back when it is freed. A budget that would go over its limit
 * refuses (the caller answers 413/503/1009/1013 naming budget->option); /metrics exports each
 * one's use, peak, limit and refusals. Single-threaded: the network loop owns them. */
#ifndef MA_SERVER_BUDGET_H
#define MA_SERVER_BUDGET_H

#include <stddef.h>
#include <stdint.h>

typedef struct ma_budget {
    const char *name;   /* the metrics label, e.g. "input" */
    const char *option; /* the option that sets the limit, e.g. "--max-input-mb" */
    const char *help;   /* one line for /metrics and docs */
    size_t limit;       /* bytes */
    size_t used, peak;
    uint64_t refused;
} ma_budget;

/* take n bytes: 0, or -1 (nothing taken, b->refused counted) when used + n would exceed the limit */
int ma_budget_take(ma_budget *b, size_t n);
void ma_budget_give(ma_budget *b, size_t n);
/* count n bytes held whatever the limit (a per-connection limit checked by the caller) */
void ma_budget_hold(ma_budget *b, size_t n);
/* move n bytes from one budget to another: 0, or -1 (nothing moved) when `to` refuses */
int ma_budget_move(ma_budget *from, ma_budget *to, size_t n);

#endif
