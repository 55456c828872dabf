/* SPDX-License-Identifier: Apache-2.0 */
#define _GNU_SOURCE /* sched_getaffinity */
#include "kernels/threads.h"
#include "core/util.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>

#define MAX_THREADS 64
#define SPIN_ROUNDS 20000 /* ~50 us of polling before a helper sleeps */

/* A job's parts are claimed, not assigned: every thread (the caller included) takes the next
 * unclaimed part until none is left, and the caller returns once every part has finished. A
 * helper that has not woken yet (descheduled by another process on a busy machine) claims
 * nothing and holds nobody: the caller does its parts. Jobs live in two slots used in turn; a
 * helper that wakes late claims from the slot it saw, which holds either its own finished job
 * (nothing left to claim) or a later job whose parts it may then run as well. */
typedef struct job {
    ma_task_fn fn;
    void *ctx;
    /* the job's part count (high 32 bits) and the next part to claim (low 32 bits), in one word:
     * a claim reads both at once. With the count in a field of its own, a helper whose claim
     * came from a slot's finished job (nothing left) could read the count of the next job put in
     * that slot, and run a part that job's counter also hands out: one part twice (seen once in
     * 2000 rounds of test_thread_pool under load) */
    atomic_ullong next;
    atomic_int done; /* parts finished */
} job;

static struct {
    pthread_once_t once;
    int n; /* threads including the caller */
    int requested;
    pthread_mutex_t mu;
    pthread_cond_t wake, finished;
    atomic_ulong generation; /* bumped for every job; the job is slots[generation & 1] */
    job slots[2];
    atomic_int sleepers_wait; /* the caller sleeps on `finished` (helpers then signal it) */
    atomic_flag busy;         /* the pool is in use (nested or concurrent calls run serially) */
    /* is sharing paying? (kept by the caller holding `busy`) */
    double win_job, win_serial; /* this window's jobs: their time, and the caller's estimate of doing them alone */
    int win_n;
    long serial_left; /* jobs to run on the caller alone before trying the helpers again */
} pool = {.once = PTHREAD_ONCE_INIT,
          .n = 1,
          .mu = PTHREAD_MUTEX_INITIALIZER,
          .wake = PTHREAD_COND_INITIALIZER,
          .finished = PTHREAD_COND_INITIALIZER,
          .busy = ATOMIC_FLAG_INIT};

/* claim and run parts of j until none is left; returns how many this thread ran */
static int work(job *j) {
    int mine = 0;
    for (;;) {
        const unsigned long long v = atomic_fetch_add_explicit(&j->next, 1, memory_order_acq_rel);
        const int parts = (int)(v >> 32), p = (int)(v & 0xffffffffu);
        if (p >= parts) return mine; /* nothing left (of this job, or of a finished one) */
        /* a part of a live job: the slot is not reused before it is done, so fn and ctx hold */
        j->fn(j->ctx, p, parts);
        mine++;
        /* sequentially consistent with the caller's store to sleepers_wait and load of done
         * (store-then-load on both sides: one of the two sees the other's) */
        if (atomic_fetch_add(&j->done, 1) + 1 == parts && atomic_load(&pool.sleepers_wait)) {
            pthread_mutex_lock(&pool.mu);
            pthread_cond_signal(&pool.finished);
            pthread_mutex_unlock(&pool.mu);
        }
    }
}

static void *helper(void *arg) {
    (void)arg;
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
            while ((g = atomic_load_explicit(&pool.generation, memory_order_acquire)) == seen) pthread_cond_wait(&pool.wake, &pool.mu);
            pthread_mutex_unlock(&pool.mu);
        }
        seen = g;
        work(&pool.slots[g & 1]);
    }
    return NULL;
}

static int default_threads(void) {
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
    for (int s = 0; s < 2; s++) {            /* nothing to claim in either slot before the first job */
        atomic_init(&pool.slots[s].next, 0); /* 0 parts */
        atomic_init(&pool.slots[s].done, 0);
    }
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

/* Sharing pays when the helpers run beside the caller. When another process keeps them off the
 * cores, a helper that claimed a part and was then descheduled holds the caller at the join for
 * a whole time slice, which costs small jobs (the action expert's: tens of microseconds each)
 * far more than they gain. So the caller times its small jobs (those whose last run, of the same
 * function and parts, took under SMALL_S): over a window of WINDOW of them, the time they took
 * against its estimate of running them alone (the time it spent on its own parts, scaled to all
 * of them). When sharing was slower, the next SERIAL_JOBS small jobs run on the caller alone
 * (cut the same way, so the results are the same bits), then the helpers are tried again. Large
 * jobs are always shared: a slice lost to another process costs them little, and their parts
 * are cut finer than the threads. On a quiet machine the helpers pay and nothing changes. */
#define WINDOW 64
#define SERIAL_JOBS 2048
#define SMALL_S 500e-6

/* the last duration of a job of this function and part count (a small direct-mapped table) */
static struct {
    ma_task_fn fn;
    int parts;
    double s;
} last_seen[64];

static double *last_of(ma_task_fn fn, int parts) {
    const unsigned h = (unsigned)(((uintptr_t)fn >> 4) * 31u + (unsigned)parts) % 64u;
    if (last_seen[h].fn != fn || last_seen[h].parts != parts) {
        last_seen[h].fn = fn;
        last_seen[h].parts = parts;
        last_seen[h].s = 0.0; /* unknown: small until seen */
    }
    return &last_seen[h].s;
}

static void account(double job_s, double own_s, int mine, int parts) {
    pool.win_job += job_s;
    pool.win_serial += mine > 0 ? own_s * (double)parts / (double)mine : job_s;
    if (++pool.win_n < WINDOW) return;
    if (pool.win_job > pool.win_serial) pool.serial_left = SERIAL_JOBS;
    pool.win_job = pool.win_serial = 0.0;
    pool.win_n = 0;
}

void ma_parallel_parts(ma_task_fn fn, void *ctx, int parts) {
    pthread_once(&pool.once, start);
    if (parts <= 1 || pool.n <= 1 || atomic_flag_test_and_set(&pool.busy)) {
        fn(ctx, 0, 1); /* one part is the whole job */
        return;
    }
    double *last = last_of(fn, parts);
    const int small = *last < SMALL_S;
    const double t0 = ma_now_s();
    if (small && pool.serial_left > 0) { /* sharing did not pay lately (above) */
        pool.serial_left--;
        for (int p = 0; p < parts; p++) fn(ctx, p, parts);
        *last = (ma_now_s() - t0) / 2.0; /* as if shared: comparable with a shared run's time */
        atomic_flag_clear(&pool.busy);
        return;
    }
    const unsigned long g = atomic_load_explicit(&pool.generation, memory_order_relaxed) + 1;
    job *j = &pool.slots[g & 1];
    /* the slot's last job (g - 2) finished before its call returned; a late helper may still
     * try to claim from it, and its claim says there is nothing (its index is at or past that
     * job's count, read in the same word). The fields are set before `next` is reopened with
     * this job's count, so a claim that succeeds sees this job's. */
    j->fn = fn;
    j->ctx = ctx;
    atomic_store_explicit(&j->done, 0, memory_order_relaxed);
    atomic_store_explicit(&j->next, (unsigned long long)parts << 32, memory_order_release);
    pthread_mutex_lock(&pool.mu);
    atomic_store_explicit(&pool.generation, g, memory_order_release);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mu);
    const int mine = work(j);
    const double t1 = ma_now_s();
    /* every part claimed: wait for those other threads are still running (spin a little, as
     * they usually finish together, then sleep) */
    int spins = 0;
    while (atomic_load_explicit(&j->done, memory_order_acquire) < parts && spins < SPIN_ROUNDS) {
        ma_cpu_relax();
        spins++;
    }
    if (atomic_load_explicit(&j->done, memory_order_acquire) < parts) {
        pthread_mutex_lock(&pool.mu);
        atomic_store(&pool.sleepers_wait, 1);
        while (atomic_load(&j->done) < parts) pthread_cond_wait(&pool.finished, &pool.mu);
        atomic_store_explicit(&pool.sleepers_wait, 0, memory_order_release);
        pthread_mutex_unlock(&pool.mu);
    }
    const double t2 = ma_now_s();
    *last = t2 - t0;
    if (small) account(t2 - t0, t1 - t0, mine, parts);
    atomic_flag_clear(&pool.busy);
}

void ma_parallel_n(ma_task_fn fn, void *ctx, int max_threads) {
    pthread_once(&pool.once, start);
    ma_parallel_parts(fn, ctx, pool.n < max_threads ? pool.n : max_threads);
}

void ma_parallel(ma_task_fn fn, void *ctx) { ma_parallel_n(fn, ctx, MAX_THREADS); }
