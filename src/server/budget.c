/* SPDX-License-Identifier: Apache-2.0 */
#include "server/budget.h"

int ma_budget_take(ma_budget *b, size_t n) {
    if (n > b->limit || b->used > b->limit - n) {
        b->refused++;
        return -1;
    }
    ma_budget_hold(b, n);
    return 0;
}

void ma_budget_hold(ma_budget *b, size_t n) {
    b->used += n;
    if (b->used > b->peak) b->peak = b->used;
}

void ma_budget_give(ma_budget *b, size_t n) { b->used = n > b->used ? 0 : b->used - n; }

int ma_budget_move(ma_budget *from, ma_budget *to, size_t n) {
    if (ma_budget_take(to, n)) return -1;
    ma_budget_give(from, n);
    return 0;
}
