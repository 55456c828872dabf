/* SPDX-License-Identifier: Apache-2.0 */
#define _GNU_SOURCE /* sched_getaffinity */
#include "kernels/threads.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#define MAX_THREADS 64
#define SPIN_ROUNDS 20000 /* ~50 us of polling before a helper sleeps */

static struct {
    pthread_once_t once;
    int n;                   /* threads including the caller */
    int requested;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    atomic_ulong generation; /* bumped for every job */
    atomic_int pending;      /* helpers still working on the job */
    ma_task_fn fn;
    void *ctx;
    int active;              /* threads taking part in the current job */
    atomic_flag busy;        /* the pool is in use (nested or concurrent calls run serially) */
} pool = {PTHREAD_ONCE_INIT, 1, 0, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
          0, 0, NULL, NULL, 0, ATOMIC_FLAG_INIT};

static void *helper(void *arg) {
    const int t = (int)(long)arg;
    unsigned long seen = 0;
    for (;;) {
        unsigned long g;
        int spins = 0;
        while ((g = atomic_load_explicit(&pool.generation, memory_order_acquire)) == seen && spins < SPIN_ROUNDS) {
            ma_cpu_relax();
            spins++;
        }
        if (g == seen) {
            pthread_mutex_lock(&pool.mu);
            while ((g = atomic_load_explicit(&pool.generation, memory_order_acquire)) == seen)
                pthread_cond_wait(&pool.wake, &pool.mu);
            pthread_mutex_unlock(&pool.mu);
        }
        seen = g;
        if (t < pool.active) pool.fn(pool.ctx, t, pool.active);
        if (atomic_fetch_sub_explicit(&pool.pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&pool.mu);
            pthread_cond_signal(&pool.done);
            pthread_mutex_unlock(&pool.mu);
        }
    }
    return NULL;
}

static int default_threads(void) {
    const char *e = getenv("MOLMOACT_THREADS");
    if (e && atoi(e) > 0) return atoi(e);
#ifdef __linux__
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
    return 1;
}

static void start(void) {
    int n = pool.requested > 0 ? pool.requested : default_threads();
    if (n > MAX_THREADS) n = MAX_THREADS;
    pool.n = 1;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    for (int t = 1; t < n; t++) {
        pthread_t th;
        if (pthread_create(&th, &attr, helper, (void *)(long)t) != 0) break; /* fewer threads, still correct */
        pool.n++;
    }
    pthread_attr_destroy(&attr);
}

int ma_threads(void) {
    pthread_once(&pool.once, start);
    return pool.n;
}

void ma_threads_set(int n) {
    if (n > 0) pool.requested = n; /* takes effect if the pool has not started yet */
}

void ma_parallel_n(ma_task_fn fn, void *ctx, int max_threads) {
    pthread_once(&pool.once, start);
    int T = pool.n < max_threads ? pool.n : max_threads;
    if (T <= 1 || atomic_flag_test_and_set(&pool.busy)) {
        fn(ctx, 0, 1);
        return;
    }
    pool.fn = fn;
    pool.ctx = ctx;
    pool.active = T;
    atomic_store_explicit(&pool.pending, pool.n - 1, memory_order_release);
    pthread_mutex_lock(&pool.mu);
    atomic_fetch_add_explicit(&pool.generation, 1, memory_order_acq_rel);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mu);
    fn(ctx, 0, T);
    /* wait for the helpers: spin a little (they usually finish together), then sleep */
    int spins = 0;
    while (atomic_load_explicit(&pool.pending, memory_order_acquire) > 0 && spins < SPIN_ROUNDS) {
        ma_cpu_relax();
        spins++;
    }
    if (atomic_load_explicit(&pool.pending, memory_order_acquire) > 0) {
        pthread_mutex_lock(&pool.mu);
        while (atomic_load_explicit(&pool.pending, memory_order_acquire) > 0) pthread_cond_wait(&pool.done, &pool.mu);
        pthread_mutex_unlock(&pool.mu);
    }
    atomic_flag_clear(&pool.busy);
}

void ma_parallel(ma_task_fn fn, void *ctx) { ma_parallel_n(fn, ctx, MAX_THREADS); }
