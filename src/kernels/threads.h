/* SPDX-License-Identifier: Apache-2.0 */
/* A persistent pool of compute threads (created once, never per call).
 *
 * ma_parallel(fn, ctx) runs fn(ctx, t, T) once for each part t = 0..T-1 (T: the threads), and
 * returns when all have finished. Parts are claimed, not assigned: each thread, the caller
 * included, takes the next unclaimed part until none is left, so a helper that another process
 * keeps off its core holds nobody up (the others run its parts), and ma_parallel_parts can cut
 * the work finer than the threads so that a thread that runs slower takes fewer parts. A part
 * must therefore not wait for another part (no barriers inside a job: split it in two jobs).
 * Helpers spin briefly for the next job, then sleep, so an idle process (a resident worker
 * between requests) costs no CPU. Calls from inside a job, or while another thread holds the
 * pool, run their parts serially on the caller.
 *
 * Threads: MOLMOACT_THREADS, else the CPUs this process may use; ma_threads_set() changes it
 * before first use. */
#ifndef MA_THREADS_H
#define MA_THREADS_H

#include <stdint.h>

typedef void (*ma_task_fn)(void *ctx, int t, int T);

void ma_parallel(ma_task_fn fn, void *ctx);
/* fn(ctx, p, parts) for p = 0..parts-1, claimed by the threads as they come */
void ma_parallel_parts(ma_task_fn fn, void *ctx, int parts);
/* run with at most max_threads (e.g. the number of independent pieces of work) */
void ma_parallel_n(ma_task_fn fn, void *ctx, int max_threads);
int ma_threads(void);
void ma_threads_set(int n);

/* one step of a spin-wait loop (a hint to the core, and on a hyperthread to its sibling) */
static inline void ma_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}
/* split [0, n) into T near-equal ranges; range t is [*lo, *hi) */
static inline void ma_split_range(long n, int t, int T, long *lo, long *hi) {
    long q = n / T, r = n % T;
    *lo = t * q + (t < r ? t : r);
    *hi = *lo + q + (t < r ? 1 : 0);
}
/* the same over whole blocks of `block` elements (cache lines, pages): elements [*a, *b) of n */
static inline void ma_split_blocks(int64_t n, int64_t block, int t, int T, int64_t *a, int64_t *b) {
    long lo, hi;
    ma_split_range((long)((n + block - 1) / block), t, T, &lo, &hi);
    *a = lo * block;
    *b = hi * block < n ? hi * block : n;
}

#endif
