/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "kernels/gemm.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/half.h"
#include "kernels/cpu.h"
#include "kernels/gemm_impl.h"
#include "kernels/threads.h"

#define NR MA_GEMM_NR
#define MR MA_GEMM_MR
#define KC MA_GEMM_KC
#define MC MA_GEMM_MC
#define GROUP 32   /* panels converted per K chunk on the grouped path: 32 x 384 x 16 floats = 768 KiB (L2) */
#define AMX_MS 512 /* rows of A converted at a time on the AMX path: 512 x 384 x (hi, lo) bf16 = 768 KiB */

/* ------------------------------------------------------------------ portable micro-kernel */

static void ukernel_portable(int64_t kc, const float *A, const float *P, float *C, int64_t ldc, int mr, int nr, int accumulate) {
    float t[MR][NR];
    memset(t, 0, sizeof t);
    for (int64_t k = 0; k < kc; k++) {
        const float *p = P + k * NR;
        for (int r = 0; r < mr; r++) {
            const float a = A[k * MR + r];
            for (int j = 0; j < NR; j++) t[r][j] += a * p[j];
        }
    }
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++) C[r * ldc + j] = accumulate ? C[r * ldc + j] + t[r][j] : t[r][j];
}

/* ------------------------------------------------------------------ portable panel loaders */

static float elem_to_f32(ma_dtype dt, const void *base, int64_t i) {
    switch (dt) {
    case MA_DT_F16: return ma_f16_to_f32(((const uint16_t *)base)[i]);
    case MA_DT_BF16: return ma_bf16_to_f32(((const uint16_t *)base)[i]);
    default: return ((const float *)base)[i];
    }
}

static void load_rows_float(const ma_bmat *B, int64_t K, int64_t n0, int nr, int64_t k0, int kc, float *P) {
    (void)K;
    for (int k = 0; k < kc; k++)
        for (int r = 0; r < NR; r++) P[k * NR + r] = r < nr ? elem_to_f32(B->dtype, B->data, (n0 + r) * B->ld + k0 + k) : 0.0f;
}

static float block_scale(const uint8_t *p) { return ma_f16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }

static void load_rows_quant(const ma_bmat *B, int64_t K, int64_t n0, int nr, int64_t k0, int kc, float *P) {
    (void)K;
    const int q8 = B->dtype == MA_DT_Q8_0;
    const size_t bs = q8 ? 34 : 18;
    memset(P, 0, sizeof(float) * (size_t)kc * NR);
    for (int r = 0; r < nr; r++) {
        const uint8_t *row = (const uint8_t *)B->data + (size_t)(n0 + r) * (size_t)(B->ld / 32) * bs;
        for (int k = 0; k < kc; k += 32) {
            const uint8_t *blk = row + (size_t)((k0 + k) / 32) * bs;
            const float d = block_scale(blk);
            for (int i = 0; i < 32; i++) {
                int v = q8 ? (int8_t)blk[2 + i] : (i < 16 ? (blk[2 + i] & 0x0f) : (blk[2 + i - 16] >> 4)) - 8;
                P[(k + i) * NR + r] = d * (float)v;
            }
        }
    }
}

static void load_cols_float(const ma_bmat *B, int64_t K, int64_t n0, int nr, int64_t k0, int kc, float *P) {
    (void)K;
    for (int k = 0; k < kc; k++)
        for (int j = 0; j < NR; j++) P[k * NR + j] = j < nr ? elem_to_f32(B->dtype, B->data, (k0 + k) * B->ld + n0 + j) : 0.0f;
}

/* W's row r, columns n0..n0+15 sit 16 elements apart in its panel (r / 16, lane r % 16) */
static void load_panels_t_float(const ma_bmat *B, int64_t K, int64_t n0, int nr, int64_t k0, int kc, float *P) {
    (void)K;
    for (int k = 0; k < kc; k++) {
        const int64_t r = B->row0 + k0 + k, base = ((r / NR) * B->ld + n0) * NR + r % NR;
        for (int j = 0; j < NR; j++) P[k * NR + j] = j < nr ? elem_to_f32(B->dtype, B->data, base + (int64_t)j * NR) : 0.0f;
    }
}

static void load_panels_float(const ma_bmat *B, int64_t K, int64_t n0, int nr, int64_t k0, int kc, float *P) {
    (void)nr;
    const int64_t base = (n0 / NR) * K * NR + k0 * NR;
    for (int64_t i = 0; i < (int64_t)kc * NR; i++) P[i] = elem_to_f32(B->dtype, B->data, base + i);
}

static void load_panels_quant(const ma_bmat *B, int64_t K, int64_t n0, int nr, int64_t k0, int kc, float *P) {
    (void)nr;
    const int q8 = B->dtype == MA_DT_Q8_0;
    const size_t pb = q8 ? 544 : 288; /* bytes of one 32 x 16 block */
    const uint8_t *panel = (const uint8_t *)B->data + (size_t)(n0 / NR) * (size_t)(K / 32) * pb;
    for (int k = 0; k < kc; k += 32) {
        const uint8_t *blk = panel + (size_t)((k0 + k) / 32) * pb;
        float d[NR];
        for (int r = 0; r < NR; r++) d[r] = block_scale(blk + 2 * r);
        const uint8_t *q = blk + 32;
        for (int i = 0; i < 32; i++)
            for (int r = 0; r < NR; r++) {
                int v = q8 ? (int8_t)q[i * NR + r] : (i < 16 ? (q[i * NR + r] & 0x0f) : (q[(i - 16) * NR + r] >> 4)) - 8;
                P[(k + i) * NR + r] = d[r] * (float)v;
            }
    }
}

/* A[m0..m1) x [k0, k0 + kc) -> tiles of TR (the kernel's mr) rows, each [k][TR] (rows past m1
 * zero), so the micro-kernel reads one sequential stream of A */
static void pack_a_portable(const float *A, int64_t lda, int64_t m0, int64_t m1, int64_t k0, int kc, int TR, float *out) {
    for (int64_t m = m0; m < m1; m += TR) {
        const int mr = (int)(m1 - m < TR ? m1 - m : TR);
        float *t = out + (m - m0) * kc;
        for (int r = 0; r < mr; r++) {
            const float *a = A + (m + r) * lda + k0;
            for (int k = 0; k < kc; k++) t[k * TR + r] = a[k];
        }
        for (int r = mr; r < TR; r++)
            for (int k = 0; k < kc; k++) t[k * TR + r] = 0.0f;
    }
}

/* ------------------------------------------------------------------ dispatch */

static ma_gemm_kernels_t sets[5]; /* portable, then what the CPU has, best last */
/* the set in use: a pointer into sets[], switched atomically, so an engine that chooses a set
 * never rewrites a table another thread is calling through */
static _Atomic(ma_gemm_kernels_t *) active_p = &sets[0];
#define active (*atomic_load_explicit(&active_p, memory_order_acquire))
static int n_sets, best_set;
#if defined(MA_HAVE_AMX)
static int bf16_dot_default; /* whether VDPBF16PS pays on this CPU (ma_gemm_bf16_dot_cost) */
#endif
static double bf16_dot_cost = -1; /* what it costs, in FMAs (ma_gemm_bf16_dot_cost); -1: not timed */
static pthread_once_t active_once = PTHREAD_ONCE_INIT;

static int panels_in_place = 1; /* see ma_gemm_set_in_place */

static int in_place_default(void) { return !ma_cpu_intel(); }

static void choose_kernels(void) {
    ma_gemm_kernels_t *p = &sets[0];
    p->name = "portable";
    p->mr = MR;
    p->ukernel = ukernel_portable;
    p->pack_a = pack_a_portable;
    ma_dtype floats[3] = {MA_DT_F32, MA_DT_F16, MA_DT_BF16};
    for (int i = 0; i < 3; i++) {
        p->load[MA_B_ROWS][floats[i]] = load_rows_float;
        p->load[MA_B_PANELS][floats[i]] = load_panels_float;
    }
    p->load[MA_B_ROWS][MA_DT_Q8_0] = p->load[MA_B_ROWS][MA_DT_Q4_0] = load_rows_quant;
    p->load[MA_B_PANELS][MA_DT_Q8_0] = p->load[MA_B_PANELS][MA_DT_Q4_0] = load_panels_quant;
    for (int i = 0; i < 3; i++) {
        p->load[MA_B_COLS][floats[i]] = load_cols_float;
        p->load[MA_B_PANELS_T][floats[i]] = load_panels_t_float;
    }
    n_sets = 1;
#if defined(__x86_64__) && defined(MA_HAVE_AVX2)
    if (ma_cpu_avx2_fma_f16c()) {
        sets[n_sets] = sets[0];
        ma_gemm_install_avx2(&sets[n_sets++]);
#if defined(MA_HAVE_AVX512)
        if (ma_cpu_avx512f()) {
            sets[n_sets] = sets[n_sets - 1];
            ma_gemm_install_avx512(&sets[n_sets++]);
#if defined(MA_HAVE_AMX)
            if (ma_cpu_avx512_bf16()) { /* the vnni and amx sets inherit it */
                bf16_dot_cost = ma_gemm_bf16_dot_cost();
                bf16_dot_default = bf16_dot_cost <= MA_BF16_DOT_PAYS;
                ma_gemm_install_bf16(&sets[n_sets - 1], bf16_dot_default);
            }
#endif
#if defined(MA_HAVE_VNNI)
            if (ma_cpu_avx512_vnni_vbmi()) {
                sets[n_sets] = sets[n_sets - 1];
                ma_gemm_install_vnni(&sets[n_sets++]);
            }
#endif
#if defined(MA_HAVE_AMX)
            if (ma_cpu_amx_bf16()) {
                sets[n_sets] = sets[n_sets - 1];
                ma_gemm_install_amx(&sets[n_sets++]);
            }
#endif
        }
#endif
    }
#endif
#if defined(__aarch64__)
    sets[n_sets] = sets[0]; /* Advanced SIMD is part of every aarch64 CPU */
    ma_gemm_install_neon(&sets[n_sets++]);
    if (ma_cpu_arm_fp16()) ma_gemm_install_neon_fp16(&sets[n_sets - 1]); /* neon_dot inherits it */
    if (ma_cpu_arm_dotprod()) {
        sets[n_sets] = sets[n_sets - 1];
        ma_gemm_install_neon_dot(&sets[n_sets++]);
    }
#endif
    best_set = n_sets - 1;
    panels_in_place = in_place_default();
    atomic_store_explicit(&active_p, &sets[best_set], memory_order_release); /* settings.kernels chooses another (ma_kernels_configure) */
}

double ma_gemm_bf16_dot_measured(void) {
    pthread_once(&active_once, choose_kernels);
    return bf16_dot_cost;
}

void ma_gemm_bf16_off_reason(char *out, size_t cap) {
    pthread_once(&active_once, choose_kernels);
    if (bf16_dot_cost > MA_BF16_DOT_PAYS)
        snprintf(out, cap, "AVX512-BF16 without the unit: one VDPBF16PS timed at %.2f FMA, above %.1f", bf16_dot_cost, MA_BF16_DOT_PAYS);
    else if (bf16_dot_cost > 0) snprintf(out, cap, "kernel set %s has no bf16 unit", active.name);
    else snprintf(out, cap, "no bf16 unit on this CPU");
}

const char *ma_gemm_kernels(void) {
    pthread_once(&active_once, choose_kernels);
    return active.name;
}

int ma_gemm_kernel_count(void) {
    pthread_once(&active_once, choose_kernels);
    return n_sets;
}

const char *ma_gemm_kernel_name(int i) {
    pthread_once(&active_once, choose_kernels);
    return i >= 0 && i < n_sets ? sets[i].name : NULL;
}

int ma_gemm_kernel_int8_activations(int i) {
    pthread_once(&active_once, choose_kernels);
    return i >= 0 && i < n_sets && sets[i].q_panels != NULL;
}

void ma_gemm_set_bf16_dot(int on) {
    pthread_once(&active_once, choose_kernels);
#if defined(MA_HAVE_AMX)
    if (!ma_cpu_avx512_bf16()) return;
    const int with = on < 0 ? bf16_dot_default : on;
    for (int i = 0; i < n_sets; i++)
        if (sets[i].amx_pack_a) ma_gemm_install_bf16(&sets[i], with); /* the active one among them */
#else
    (void)on;
#endif
}

const char *ma_compute_name(ma_compute c) { return c == MA_COMPUTE_BF16 ? "bf16" : c == MA_COMPUTE_F16 ? "f16" : "fp32"; }

static ma_compute set_f16(const ma_gemm_kernels_t *k) { return k->f16_tile ? MA_COMPUTE_F16 : MA_COMPUTE_F32; }

ma_compute ma_gemm_kernel_f16(int i) {
    pthread_once(&active_once, choose_kernels);
    return i >= 0 && i < n_sets ? set_f16(&sets[i]) : MA_COMPUTE_F32;
}

ma_compute ma_gemm_f16(void) {
    pthread_once(&active_once, choose_kernels);
    return set_f16(&active);
}

static ma_compute set_bf16(const ma_gemm_kernels_t *k) { return k->amx_tile || k->bf16_tile ? MA_COMPUTE_BF16 : MA_COMPUTE_F32; }

ma_compute ma_gemm_kernel_bf16(int i) {
    pthread_once(&active_once, choose_kernels);
    return i >= 0 && i < n_sets ? set_bf16(&sets[i]) : MA_COMPUTE_F32;
}

ma_compute ma_gemm_bf16(void) {
    pthread_once(&active_once, choose_kernels);
    return set_bf16(&active);
}

const char *ma_gemm_bf16_unit(void) {
    pthread_once(&active_once, choose_kernels);
    return active.amx_tile ? "amx" : active.bf16_tile ? "avx512_bf16" : "fp32";
}

int ma_gemm_kernel_small_panels(int i) {
    pthread_once(&active_once, choose_kernels);
    return i >= 0 && i < n_sets && sets[i].small_panels != NULL;
}

int ma_gemm_int8_activations(void) {
    pthread_once(&active_once, choose_kernels);
    return active.q_panels != NULL;
}

int ma_gemm_select(int i) {
    pthread_once(&active_once, choose_kernels);
    if (i < 0 || i >= n_sets) return 0;
    atomic_store_explicit(&active_p, &sets[i], memory_order_release);
    return 1;
}

void ma_gemm_select_portable(int portable) {
    pthread_once(&active_once, choose_kernels);
    atomic_store_explicit(&active_p, &sets[portable ? 0 : best_set], memory_order_release);
}

void ma_gemm_set_in_place(int in_place) {
    pthread_once(&active_once, choose_kernels);
    panels_in_place = in_place < 0 ? in_place_default() : in_place != 0;
}

int ma_gemm_in_place(void) {
    pthread_once(&active_once, choose_kernels);
    return panels_in_place;
}

/* ------------------------------------------------------------------ driver */

/* one output matrix of a job; a fused job's panels run over its parts end to end */
typedef struct gemm_seg {
    const ma_bmat *B;
    int64_t N, ldc, p0; /* p0: the job's index of this part's first panel */
    const float *bias;
    float *C;
    ma_panel_fn load;
} gemm_seg;

typedef struct gemm_job {
    int64_t M, K, lda, panels;
    const float *A;
    int accumulate, n_seg, split_m, small, amx;
    int bf16;         /* MA_COMPUTE_BF16 on this set's bf16 unit (ma_gemm_bf16) */
    int f16;          /* MA_COMPUTE_F16 on this set's f16 tiles (ma_gemm_f16) */
    void *qa;         /* small path with int8 parts: A quantised once (K / 32 blocks) */
    int qa_todo;      /* qa not yet filled: a job of its own quantises it first */
    void *qa_all;     /* more rows with int8 parts, cut by panels: every 12-row tile of A quantised
                          * once, tile t's K blocks from block t K / 32 (NULL: per thread and K chunk) */
    atomic_long next; /* small path: the next chunk of panels a thread takes */
    int64_t chunk;    /* panels per chunk */
    gemm_seg seg[MA_GEMM_MAX_PARTS];
} gemm_job;


static inline int quantised(ma_dtype dt) { return dt == MA_DT_Q8_0 || dt == MA_DT_Q4_0; }

/* the bytes of panel n0's K chunk [k0, k0 + kc) in a panel-layout B (one contiguous run) */
static size_t panel_span(const ma_bmat *B, int64_t K, int64_t n0, int64_t k0, int kc, const uint8_t **p) {
    const int64_t panel = n0 / NR;
    if (quantised(B->dtype)) {
        const size_t pb = B->dtype == MA_DT_Q8_0 ? 544 : 288;
        *p = (const uint8_t *)B->data + ((size_t)panel * (size_t)(K / 32) + (size_t)(k0 / 32)) * pb;
        return (size_t)(kc / 32) * pb;
    }
    const size_t es = B->dtype == MA_DT_F32 ? 4 : 2;
    *p = (const uint8_t *)B->data + ((size_t)panel * (size_t)K + (size_t)k0) * NR * es;
    return (size_t)kc * NR * es;
}

/* ask for panel n0's K chunk [k0, k0 + kc) of a panel-layout B to be on its way to L2 while the
 * micro-kernels work on the previous panel (the hardware prefetcher stops at page ends) */
static void prefetch_panel(const ma_bmat *B, int64_t K, int64_t n0, int64_t k0, int kc) {
    if (B->layout != MA_B_PANELS) return;
    const uint8_t *p;
    const size_t bytes = panel_span(B, K, n0, k0, kc, &p);
    for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 2);
}

/* The weights of the next group of panels, fetched towards L2 a few lines at a time while the
 * micro-kernels work on this group, so the conversion that follows finds them there rather than
 * waiting on memory (at M = 128 it otherwise stalls for as long as the stream takes). */
typedef struct ahead {
    const uint8_t *p[GROUP];
    size_t bytes[GROUP];
    int n, i;
    size_t off, step; /* bytes per call of ahead_step */
} ahead;

static inline void ahead_step(ahead *a) {
    for (size_t done = 0; done < a->step && a->i < a->n; done += 64) {
        __builtin_prefetch(a->p[a->i] + a->off, 0, 2);
        a->off += 64;
        if (a->off >= a->bytes[a->i]) a->off = 0, a->i++;
    }
}

/* this call's share of the fetch, for a tile kernel to spread over its k (at most to the end of
 * the current panel's run; the rest comes with the next call) */
static inline ma_tile_pf ahead_take(ahead *a) {
    ma_tile_pf pf = {NULL, 0};
    if (a->i >= a->n) return pf;
    size_t left = a->bytes[a->i] - a->off, want = a->step < left ? a->step : left;
    pf.p = (const char *)a->p[a->i] + a->off;
    pf.lines = (int)((want + 63) / 64);
    a->off += (size_t)pf.lines * 64;
    if (a->off >= a->bytes[a->i]) a->off = 0, a->i++;
    return pf;
}

/* rows x 32 floats of C at c */
static inline void prefetch_c(const float *c, int64_t ldc, int rows) {
    for (int r = 0; r < rows; r++) {
        __builtin_prefetch(c + r * ldc, 1, 3);
        __builtin_prefetch(c + r * ldc + 16, 1, 3);
    }
}

/* the part holding job panel p (parts are visited in order: *s only moves forward), the panel's
 * first column in that part and its width */
static inline const gemm_seg *panel_at(const gemm_job *j, int64_t p, int *s, int64_t *n0, int *nr) {
    while (*s + 1 < j->n_seg && p >= j->seg[*s + 1].p0) (*s)++;
    const gemm_seg *g = &j->seg[*s];
    *n0 = (p - g->p0) * NR;
    *nr = (int)(g->N - *n0 < NR ? g->N - *n0 : NR);
    return g;
}

/* plan the fetch of panels [q0, q1) of K chunk k0 over `calls` steps */
static void ahead_plan(ahead *a, const gemm_job *j, int64_t q0, int64_t q1, int64_t k0, int kc, int64_t calls) {
    a->n = a->i = 0;
    a->off = 0;
    size_t total = 0;
    int s = 0;
    for (int64_t p = q0; p < q1 && k0 < j->K; p++) {
        int64_t n0;
        int nr;
        const gemm_seg *g = panel_at(j, p, &s, &n0, &nr);
        if (g->B->layout != MA_B_PANELS) continue;
        a->bytes[a->n] = panel_span(g->B, j->K, n0, k0, kc, &a->p[a->n]);
        total += a->bytes[a->n++];
    }
    a->step = calls > 0 ? (total / (size_t)calls + 63) / 64 * 64 : total;
}

/* plan the group after the one ending at q1 in K chunk k0 within the thread's panels [p_lo, p_hi): later
 * panels of this chunk, or the first ones of the next */
static void ahead_next(ahead *a, const gemm_job *j, int64_t q1, int64_t p_lo, int64_t p_hi, int64_t k0, int64_t calls) {
    const int64_t nq0 = q1 < p_hi ? q1 : p_lo, nk0 = q1 < p_hi ? k0 : k0 + KC;
    const int64_t nq1 = p_hi - nq0 < GROUP ? p_hi : nq0 + GROUP;
    ahead_plan(a, j, nq0, nq1, nk0, (int)(j->K - nk0 < KC ? j->K - nk0 : KC), calls);
}

/* Buffers per thread, grown on demand and freed when the thread exits; NULL when memory is short.
 * abuf_key: A packed for a whole K chunk of a thread's rows, so the grouped path packs each A
 * element once per K chunk instead of once per group of panels (without it, per M block).
 * qa_key: the int8 kernels' quantised A of a job (small_qa, qa_all), filled before the job. */
typedef struct abuf {
    size_t cap;
} abuf;              /* bytes after the header */
#define ABUF_HEAD 64 /* the header's bytes: keeps the data 64-byte aligned */
static pthread_key_t abuf_key, qa_key;
static pthread_once_t keys_once = PTHREAD_ONCE_INIT;
static int keys_ok;
static void keys_init(void) {
    keys_ok = pthread_key_create(&abuf_key, free) == 0;
    keys_ok = keys_ok && pthread_key_create(&qa_key, free) == 0;
}

static void *thread_buffer(pthread_key_t *key, size_t bytes) {
    pthread_once(&keys_once, keys_init);
    if (!keys_ok) return NULL;
    abuf *b = pthread_getspecific(*key);
    if (b && b->cap >= bytes) return (char *)b + ABUF_HEAD;
    abuf *nb = aligned_alloc(64, (ABUF_HEAD + bytes + 63) / 64 * 64);
    if (!nb) return NULL;
    free(b);
    nb->cap = bytes;
    if (pthread_setspecific(*key, nb)) {
        free(nb);
        return NULL;
    }
    return (char *)nb + ABUF_HEAD;
}

static float *thread_abuf(size_t floats) { return thread_buffer(&abuf_key, floats * sizeof(float)); }

/* the int8 kernels' phase timers (ma_gemm_phase_timing): nanoseconds, summed over threads */
static atomic_int phase_timing;
static atomic_ullong phase_ns[2]; /* activation quantisation, weight rearrangement */

static inline unsigned long long phase_clock(void) {
    if (!atomic_load_explicit(&phase_timing, memory_order_relaxed)) return 0;
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}

static inline void phase_add(int which, unsigned long long t0) {
    if (t0) atomic_fetch_add_explicit(&phase_ns[which], phase_clock() - t0, memory_order_relaxed);
}

void ma_gemm_phase_timing(int on) { atomic_store(&phase_timing, on != 0); }

void ma_gemm_phases_get(ma_gemm_phases *p) {
    p->qa_s = 1e-9 * (double)atomic_load(&phase_ns[0]);
    p->qw_s = 1e-9 * (double)atomic_load(&phase_ns[1]);
}

void ma_gemm_phases_reset(void) {
    for (int i = 0; i < 2; i++) atomic_store(&phase_ns[i], 0);
}

/* a part the int8 kernels take: q8_0 / q4_0 panels, where the active set has them, unless the
 * product asks for fp32 activations (MA_COMPUTE_EXACT) */
static inline int int8_part(const gemm_seg *g) {
    return active.q_panels && g->B->layout == MA_B_PANELS && quantised(g->B->dtype) && g->B->compute != MA_COMPUTE_EXACT;
}

/* more than 12 rows on q8_0 / q4_0 panels with the int8 kernels: A quantised in 12-row tiles
 * (gemm_vnni.c), once per job before it (j->qa_all, m_lo then a multiple of 12) or, where that
 * buffer could not be had, per K chunk for the thread's rows; then each group of panels (L2) is
 * used by every tile */
static void compute_int8(const gemm_job *j, int64_t m_lo, int64_t m_hi, int64_t p_lo, int64_t p_hi) {
    const int64_t tiles = (m_hi - m_lo + MA_GEMM_MR_MAX - 1) / MA_GEMM_MR_MAX;
    const int64_t kb = j->K / 32;
    size_t tile_bytes = (size_t)(KC / 32) * MA_GEMM_QA_BLOCK;
    unsigned char *qa = j->qa_all ? NULL : (unsigned char *)thread_abuf(((size_t)tiles * tile_bytes + 3) / 4);
    _Alignas(64) static _Thread_local unsigned char one[(KC / 32) * MA_GEMM_QA_BLOCK];
    if (j->qa_all) tile_bytes = (size_t)kb * MA_GEMM_QA_BLOCK;
    for (int64_t k0 = 0; k0 < j->K; k0 += KC) {
        const int kc = (int)(j->K - k0 < KC ? j->K - k0 : KC);
        const int acc = j->accumulate || k0 > 0;
        if (j->qa_all) /* this chunk's blocks of the thread's first tile; tiles tile_bytes apart */
            qa = (unsigned char *)j->qa_all + ((size_t)(m_lo / MA_GEMM_MR_MAX) * (size_t)kb + (size_t)(k0 / 32)) * MA_GEMM_QA_BLOCK;
        else if (qa) {
            const unsigned long long t0 = phase_clock();
            for (int64_t t = 0; t < tiles; t++) {
                const int64_t m = m_lo + t * MA_GEMM_MR_MAX, me = m_hi - m < MA_GEMM_MR_MAX ? m_hi : m + MA_GEMM_MR_MAX;
                active.qa_pack(j->A, j->lda, m, me, k0, kc, qa + (size_t)t * tile_bytes);
            }
            phase_add(0, t0);
        }
        for (int64_t q0 = p_lo; q0 < p_hi; q0 += GROUP) {
            const int64_t q1 = p_hi - q0 < GROUP ? p_hi : q0 + GROUP;
            if (qa && tiles > 1 && active.q_transform) {
                /* the group's weight blocks rearranged once (about 220 KiB, L2), then every row tile */
                const size_t pstride = (size_t)(kc / 32) * MA_GEMM_QW_BLOCK;
                _Alignas(64) static _Thread_local unsigned char Wt[GROUP * (KC / 32) * MA_GEMM_QW_BLOCK];
                int s = 0;
                const gemm_seg *gs[GROUP];
                int64_t n0s[GROUP];
                int nrs[GROUP];
                const unsigned long long t0 = phase_clock();
                for (int64_t p = q0; p < q1; p++) {
                    gs[p - q0] = panel_at(j, p, &s, &n0s[p - q0], &nrs[p - q0]);
                    active.q_transform(gs[p - q0]->B, j->K, n0s[p - q0], k0, kc, Wt + (size_t)(p - q0) * pstride);
                }
                phase_add(1, t0);
                for (int64_t t = 0; t < tiles; t++) {
                    const int64_t m = m_lo + t * MA_GEMM_MR_MAX, me = m_hi - m < MA_GEMM_MR_MAX ? m_hi : m + MA_GEMM_MR_MAX;
                    const unsigned char *at = qa + (size_t)t * tile_bytes;
                    for (int64_t i = 0; i < q1 - q0;) {
                        /* up to three consecutive full panels of one part (the last may be partial) */
                        int np = 1;
                        while (np < 3 && i + np < q1 - q0 && gs[i + np] == gs[i] && nrs[i + np - 1] == NR) np++;
                        active.q_tile(gs[i]->B->dtype, Wt + (size_t)i * pstride, pstride, np, kc, at, (int)(me - m),
                                      gs[i]->C + m * gs[i]->ldc + n0s[i], gs[i]->ldc, nrs[i + np - 1], acc);
                        i += np;
                    }
                }
                continue;
            }
            ahead next;
            ahead_next(&next, j, q1, p_lo, p_hi, k0, tiles * (q1 - q0));
            for (int64_t t = 0; t < tiles; t++) {
                const int64_t m = m_lo + t * MA_GEMM_MR_MAX, me = m_hi - m < MA_GEMM_MR_MAX ? m_hi : m + MA_GEMM_MR_MAX;
                const unsigned char *at = qa ? qa + (size_t)t * tile_bytes : one;
                if (!qa) active.qa_pack(j->A, j->lda, m, me, k0, kc, one); /* memory short: per tile and group */
                int s = 0;
                for (int64_t p = q0; p < q1; p++) {
                    int64_t n0;
                    int nr;
                    const gemm_seg *g = panel_at(j, p, &s, &n0, &nr);
                    ahead_step(&next);
                    active.q_panels(g->B, j->K, n0, nr, k0, kc, at, (int)(me - m), g->C + m * g->ldc + n0, g->ldc, acc);
                }
            }
        }
    }
}

static void compute_f32(const gemm_job *j, int64_t m_lo, int64_t m_hi, int64_t p_lo, int64_t p_hi);

/* rows [m_lo, m_hi) x panels [p_lo, p_hi): the kernels, then biases (and zeros for K = 0). With
 * int8 kernels, each part of a fused job takes the path its weight type takes alone. */
static void gemm_block(const gemm_job *j, int64_t m_lo, int64_t m_hi, int64_t p_lo, int64_t p_hi) {
    if (p_lo >= p_hi || m_lo >= m_hi) return;
    if (!j->small && !j->amx && active.q_panels) {
        int s = 0;
        for (int64_t p = p_lo; p < p_hi;) {
            int64_t n0;
            int nr;
            panel_at(j, p, &s, &n0, &nr);
            const int64_t end = s + 1 < j->n_seg && j->seg[s + 1].p0 < p_hi ? j->seg[s + 1].p0 : p_hi;
            if (int8_part(&j->seg[s])) compute_int8(j, m_lo, m_hi, p, end);
            else compute_f32(j, m_lo, m_hi, p, end);
            p = end;
        }
    } else compute_f32(j, m_lo, m_hi, p_lo, p_hi);
    for (int s = 0; s < j->n_seg; s++) {
        const gemm_seg *g = &j->seg[s];
        const int64_t g_panels = (g->N + NR - 1) / NR;
        const int64_t lo = p_lo > g->p0 ? p_lo - g->p0 : 0, hi = p_hi - g->p0 < g_panels ? p_hi - g->p0 : g_panels;
        if (lo >= hi) continue;
        const int64_t c0 = lo * NR, c1 = hi * NR < g->N ? hi * NR : g->N;
        for (int64_t m = m_lo; m < m_hi; m++) {
            float *c = g->C + m * g->ldc;
            if (j->K == 0 && !j->accumulate) memset(c + c0, 0, sizeof(float) * (size_t)(c1 - c0));
            if (g->bias)
                for (int64_t n = c0; n < c1; n++) c[n] += g->bias[n];
        }
    }
}

/* rows [m_lo, m_hi) x the job's panels [p_lo, p_hi) on fp32 A (and the small path, whose int8
 * parts go to the int8 kernels): every K chunk and M block; the A block is packed once and used
 * for all the panels of every part */
static void compute_f32(const gemm_job *j, int64_t m_lo, int64_t m_hi, int64_t p_lo, int64_t p_hi) {
    _Alignas(64) float P[2 * KC * NR]; /* the AMX path's bf16 plan takes K chunks of up to 2 KC */
    _Alignas(64) static _Thread_local float Apack[(MC + MA_GEMM_MR_MAX) * KC];
    _Alignas(64) static _Thread_local float Bc[GROUP * KC * NR];
    const ma_ukernel_fn uk = active.ukernel;
    const int TR = active.mr;
    if (j->small) { /* the whole K of each panel in one kernel call, weights straight from the panels */
        const int mr = (int)(m_hi - m_lo);
        const float *a = j->A + m_lo * j->lda;
        int s = 0;
        for (int64_t p = p_lo; p < p_hi; p++) {
            int64_t n0;
            int nr;
            const gemm_seg *g = panel_at(j, p, &s, &n0, &nr);
            float *c = g->C + m_lo * g->ldc + n0;
            if (int8_part(g) && j->qa) /* int8 A, quantised once for the job (small_qa) */
                active.q_panels(g->B, j->K, n0, nr, 0, (int)j->K, j->qa, mr, c, g->ldc, j->accumulate);
            else if (active.small_pair && p + 1 < p_hi && nr == NR && n0 + NR < g->N &&
                     active.small_pair(g->B, j->K, n0, (int)(g->N - n0 - NR < NR ? g->N - n0 - NR : NR), 0, (int)j->K, a, j->lda, mr, c,
                                       g->ldc, j->accumulate))
                p++; /* the next panel of this part came along */
            else active.small_panels(g->B, j->K, n0, nr, 0, (int)j->K, a, j->lda, mr, c, g->ldc, j->accumulate);
        }
    } else if (j->amx) {
        /* per K chunk: a block of A rows is split into bf16 tiles once, then each group of
         * panels is converted and split once and used by every 32-row tile of the block */
        _Alignas(64) static _Thread_local uint16_t Aa[AMX_MS * KC * 2];
        uint16_t *Bt = (uint16_t *)Bc;             /* a panel of kc x 16 takes the bytes of its fp32 form */
        const int tiles = active.amx_tile != NULL; /* else the VDPBF16PS tile (j->bf16) */
        if (tiles) active.amx_begin();
        /* the hi-only layout of the bf16 plan takes twice the k in the same buffers: K chunks
         * of up to 2 KC, as even as 32-k blocks allow, halve the C tiles' loads and stores */
        const int64_t kmax = j->bf16 ? 2 * KC : KC, n_chunks = (j->K + kmax - 1) / kmax;
        int64_t kstep = ((j->K + n_chunks - 1) / n_chunks + 31) / 32 * 32;
        if (kstep > kmax) kstep = kmax;
        for (int64_t k0 = 0; k0 < j->K; k0 += kstep) {
            const int kc = (int)(j->K - k0 < kstep ? j->K - k0 : kstep), nb = (kc + 31) / 32;
            const int acc = j->accumulate || k0 > 0;
            const int split = !j->bf16;
            const size_t pstride = (size_t)nb * 32 * NR * (split ? 2 : 1); /* uint16 per converted panel */
            for (int64_t ms = m_lo; ms < m_hi; ms += AMX_MS) {
                const int64_t me = m_hi - ms < AMX_MS ? m_hi : ms + AMX_MS;
                active.amx_pack_a(j->A, j->lda, ms, me, k0, kc, split, Aa);
                for (int64_t q0 = p_lo; q0 < p_hi; q0 += GROUP) {
                    const int64_t q1 = p_hi - q0 < GROUP ? p_hi : q0 + GROUP;
                    const gemm_seg *gs[GROUP];
                    int nrs[GROUP];
                    int64_t n0s[GROUP];
                    int s = 0;
                    for (int64_t p = q0; p < q1; p++) {
                        const int64_t i = p - q0;
                        const gemm_seg *g = gs[i] = panel_at(j, p, &s, &n0s[i], &nrs[i]);
                        if (n0s[i] + NR < g->N) prefetch_panel(g->B, j->K, n0s[i] + NR, k0, kc);
                        uint16_t *bt = Bt + (size_t)i * pstride;
                        if (!active.amx_load_b(g->B, j->K, n0s[i], k0, kc, split, bt)) {
                            g->load(g->B, j->K, n0s[i], nrs[i], k0, kc, P);
                            active.amx_pack_b(P, kc, split, bt);
                        }
                    }
                    for (int64_t m = ms; m < me; m += 32) {
                        const int mr = (int)(me - m < 32 ? me - m : 32);
                        const uint16_t *at = Aa + (size_t)((m - ms) / 16) * pstride;
                        for (int64_t i = 0; i < q1 - q0;) {
                            const gemm_seg *g = gs[i];
                            const int lo = j->bf16 ? 0 : MA_AMX_A_LO | (g->B->dtype != MA_DT_BF16 ? MA_AMX_B_LO : 0);
                            const int pair = i + 1 < q1 - q0 && gs[i + 1] == g && nrs[i] == NR;
                            const int64_t nx = i + (pair ? 2 : 1);
                            /* the next block's C rows (ldc apart: one line each, rarely in cache)
                             * are fetched while this one computes; the tile loads would stall */
                            if (nx < q1 - q0) prefetch_c(gs[nx]->C + m * gs[nx]->ldc + n0s[nx], gs[nx]->ldc, mr);
                            float *c = g->C + m * g->ldc + n0s[i];
                            const int ncols = pair ? NR + nrs[i + 1] : nrs[i];
                            if (tiles) active.amx_tile(nb, at, Bt + (size_t)i * pstride, pstride, c, g->ldc, mr, ncols, acc, lo);
                            else active.bf16_tile(nb, at, Bt + (size_t)i * pstride, pstride, c, g->ldc, mr, ncols, acc);
                            i += pair ? 2 : 1;
                        }
                    }
                }
            }
        }
        if (tiles) active.amx_end();
    } else if (j->f16) {
        /* per K chunk and M block: A's rows scaled and rounded to f16 once, then used with every
         * panel of the job, each read in place */
        _Alignas(64) static _Thread_local uint16_t Ah[(MC + MA_GEMM_F16_TR) * KC];
        _Alignas(64) static _Thread_local float inv[MC + MA_GEMM_F16_TR];
        for (int64_t k0 = 0; k0 < j->K; k0 += KC) {
            const int kc = (int)(j->K - k0 < KC ? j->K - k0 : KC);
            const int acc = j->accumulate || k0 > 0;
            for (int64_t m0 = m_lo; m0 < m_hi; m0 += MC) {
                const int64_t m1 = m_hi - m0 < MC ? m_hi : m0 + MC;
                active.f16_pack_a(j->A, j->lda, m0, m1, k0, kc, Ah, inv);
                int s = 0;
                for (int64_t p = p_lo; p < p_hi; p++) {
                    int64_t n0;
                    int nr;
                    const gemm_seg *g = panel_at(j, p, &s, &n0, &nr);
                    const uint8_t *src;
                    panel_span(g->B, j->K, n0, k0, kc, &src);
                    if (n0 + NR < g->N) prefetch_panel(g->B, j->K, n0 + NR, k0, kc);
                    for (int64_t m = m0; m < m1; m += MA_GEMM_F16_TR) {
                        const int mr = (int)(m1 - m < MA_GEMM_F16_TR ? m1 - m : MA_GEMM_F16_TR);
                        active.f16_tile(kc, Ah + (m - m0) * kc, inv + (m - m0), (const uint16_t *)src, g->C + m * g->ldc + n0, g->ldc, mr,
                                        nr, acc);
                    }
                }
            }
        }
    } else if (active.tile2[MA_DT_F32]) {
        /* per K chunk, a group of panels is shared by every A tile of every M block: panels of a
         * type the tiles read in place (f32 context panels; f16 / bf16 ones unless this CPU
         * converts them first, ma_gemm_set_in_place) are used straight from the weights, the
         * others are converted once into Bc (L2); two panels per tile call */
        const int64_t rows = (m_hi - m_lo + TR - 1) / TR * TR;
        /* one group, or rows past 16 MiB of packed A (none in this model): pack per M block */
        float *whole = p_hi - p_lo > GROUP && rows * KC <= (1 << 22) ? thread_abuf((size_t)rows * KC) : NULL;
        const int64_t mb = whole ? rows : MC;
        for (int64_t k0 = 0; k0 < j->K; k0 += KC) {
            const int kc = (int)(j->K - k0 < KC ? j->K - k0 : KC);
            const int acc = j->accumulate || k0 > 0;
            if (whole) active.pack_a(j->A, j->lda, m_lo, m_hi, k0, kc, TR, whole);
            for (int64_t q0 = p_lo; q0 < p_hi; q0 += GROUP) {
                const int64_t q1 = p_hi - q0 < GROUP ? p_hi : q0 + GROUP;
                const gemm_seg *gs[GROUP];
                const void *bp[GROUP]; /* each panel's K chunk: in place or in Bc */
                int nrs[GROUP];
                int64_t n0s[GROUP], pstride[GROUP]; /* elements to the next panel */
                ma_dtype bdt[GROUP];
                int s = 0;
                for (int64_t p = q0; p < q1; p++) {
                    const int64_t i = p - q0;
                    const gemm_seg *g = gs[i] = panel_at(j, p, &s, &n0s[i], &nrs[i]);
                    if (g->B->layout == MA_B_PANELS && active.tile2[g->B->dtype] && (panels_in_place || g->B->dtype == MA_DT_F32)) {
                        const uint8_t *src;
                        panel_span(g->B, j->K, n0s[i], k0, kc, &src);
                        bp[i] = src, bdt[i] = g->B->dtype, pstride[i] = j->K * NR;
                        continue;
                    }
                    if (q0 == p_lo && k0 == 0 && n0s[i] + NR < g->N) prefetch_panel(g->B, j->K, n0s[i] + NR, k0, kc);
                    g->load(g->B, j->K, n0s[i], nrs[i], k0, kc, Bc + i * kc * NR);
                    bp[i] = Bc + i * kc * NR, bdt[i] = MA_DT_F32, pstride[i] = (int64_t)kc * NR;
                }
                ahead next; /* one step per tile call (a pair of panels) */
                ahead_next(&next, j, q1, p_lo, p_hi, k0, (m_hi - m_lo + TR - 1) / TR * ((q1 - q0 + 1) / 2));
                for (int64_t m0 = m_lo; m0 < m_hi; m0 += mb) {
                    const int64_t m1 = m_hi - m0 < mb ? m_hi : m0 + mb;
                    const float *ap = whole ? whole + (m0 - m_lo) * kc : Apack;
                    if (!whole) active.pack_a(j->A, j->lda, m0, m1, k0, kc, TR, Apack);
                    for (int64_t m = m0; m < m1; m += TR) {
                        const int mr = (int)(m1 - m < TR ? m1 - m : TR);
                        const float *at = ap + (m - m0) * kc;
                        for (int64_t i = 0; i < q1 - q0;) {
                            const gemm_seg *g = gs[i];
                            float *c = g->C + m * g->ldc + n0s[i];
                            const ma_tile_pf pf = ahead_take(&next);
                            /* a pair: the next panel continues the same output */
                            if (i + 1 < q1 - q0 && gs[i + 1] == g && nrs[i] == NR) {
                                active.tile2[bdt[i]](kc, at, bp[i], pstride[i], c, g->ldc, mr, nrs[i + 1], acc, pf);
                                i += 2;
                            } else {
                                active.tile1[bdt[i]](kc, at, bp[i], pstride[i], c, g->ldc, mr, nrs[i], acc, pf);
                                i += 1;
                            }
                        }
                    }
                }
            }
        }
    } else
        for (int64_t k0 = 0; k0 < j->K; k0 += KC) {
            const int kc = (int)(j->K - k0 < KC ? j->K - k0 : KC);
            const int acc = j->accumulate || k0 > 0;
            for (int64_t m0 = m_lo; m0 < m_hi; m0 += MC) {
                const int64_t m1 = m_hi - m0 < MC ? m_hi : m0 + MC;
                active.pack_a(j->A, j->lda, m0, m1, k0, kc, TR, Apack);
                int s = 0;
                for (int64_t p = p_lo; p < p_hi; p++) {
                    int64_t n0;
                    int nr;
                    const gemm_seg *g = panel_at(j, p, &s, &n0, &nr);
                    if (n0 + NR < g->N) prefetch_panel(g->B, j->K, n0 + NR, k0, kc);
                    g->load(g->B, j->K, n0, nr, k0, kc, P);
                    for (int64_t m = m0; m < m1; m += TR) {
                        const int mr = (int)(m1 - m < TR ? m1 - m : TR);
                        uk(kc, Apack + (m - m0) * kc, P, g->C + m * g->ldc + n0, g->ldc, mr, nr, acc);
                    }
                }
            }
        }
}

/* thread t's share of the K blocks of the small path's int8 A */
static void quantise_a(gemm_job *j, int t, int T) {
    long lo, hi;
    ma_split_range((long)(j->K / 32), t, T, &lo, &hi);
    if (hi <= lo) return;
    const unsigned long long t0 = phase_clock();
    active.qa_pack(j->A, j->lda, 0, j->M, lo * 32, (int)((hi - lo) * 32), (unsigned char *)j->qa + (size_t)lo * MA_GEMM_QA_BLOCK);
    phase_add(0, t0);
}

static void quantise_task(void *ctx, int t, int T) { quantise_a(ctx, t, T); }

/* thread t's share of the 12-row tiles of a larger job's int8 A (qa_all), over all of K */
static void quantise_all_task(void *ctx, int t, int T) {
    gemm_job *j = ctx;
    long lo, hi;
    ma_split_range((long)((j->M + MA_GEMM_MR_MAX - 1) / MA_GEMM_MR_MAX), t, T, &lo, &hi);
    const unsigned long long t0 = phase_clock();
    for (long i = lo; i < hi; i++) {
        const int64_t m = (int64_t)i * MA_GEMM_MR_MAX, me = j->M - m < MA_GEMM_MR_MAX ? j->M : m + MA_GEMM_MR_MAX;
        active.qa_pack(j->A, j->lda, m, me, 0, (int)j->K, (unsigned char *)j->qa_all + (size_t)i * (size_t)(j->K / 32) * MA_GEMM_QA_BLOCK);
    }
    phase_add(0, t0);
}

/* the parts a large GEMM is cut into per thread: 1 (finer cuts cost 4-8 % on a quiet machine,
 * bench model llm_split0, and gained nothing measurable under a busy process: the claiming alone
 * lets the caller take a late helper's part); settings.gemm_parts overrides, for measuring */
static atomic_int parts_setting = 1;

void ma_gemm_set_parts(int n) { atomic_store_explicit(&parts_setting, n >= 1 && n <= 64 ? n : 1, memory_order_relaxed); }

#define PARTS_PER_THREAD atomic_load_explicit(&parts_setting, memory_order_relaxed)

/* Threads share the panels, except for tall A (the ViT's 1458 rows), where they take row
 * ranges instead, so none packs A rows that another one also packs. On the small path (nothing
 * packed, every panel its own work) they take chunks of panels as they finish the last, so a
 * thread that runs slower (a busy sibling core, a descheduled vCPU) does less of the work
 * instead of holding the others at the join. */
static void gemm_task(void *ctx, int t, int T) {
    gemm_job *j = ctx;
    long lo, hi;
    if (j->small && T > 1) {
        for (;;) {
            const int64_t p0 = atomic_fetch_add_explicit(&j->next, j->chunk, memory_order_relaxed);
            if (p0 >= j->panels) return;
            gemm_block(j, 0, j->M, p0, p0 + j->chunk < j->panels ? p0 + j->chunk : j->panels);
        }
    }
    if (j->split_m) {
        const int TR = j->amx ? 32 : active.mr;
        ma_split_range((long)((j->M + TR - 1) / TR), t, T, &lo, &hi);
        gemm_block(j, lo * TR, hi * TR < j->M ? hi * TR : j->M, 0, j->panels);
        return;
    }
    ma_split_range((long)j->panels, t, T, &lo, &hi);
    gemm_block(j, 0, j->M, lo, hi);
}

/* the small path's int8 A: every row of A quantised once per job, into a buffer of the calling
 * thread (read by all of them during the job), by a job of its own (each part a share of the K
 * blocks, quantise_a) before the panels' job. NULL without int8 parts, or when that
 * buffer cannot grow: the quantised parts then take the fp32 small kernels. */
static void *small_qa(const gemm_job *j) {
    int any = 0;
    for (int s = 0; s < j->n_seg; s++) any |= int8_part(&j->seg[s]);
    if (!any || j->K <= 0) return NULL;
    return thread_buffer(&qa_key, (size_t)(j->K / 32) * MA_GEMM_QA_BLOCK);
}

static int prepare(gemm_job *j, int64_t M, int64_t K, const float *A, int64_t lda, const ma_gemm_part *parts, int n, int accumulate) {
    pthread_once(&active_once, choose_kernels);
    if (n < 1 || n > MA_GEMM_MAX_PARTS) abort(); /* a programming error */
    memset(j, 0, sizeof *j);
    *j = (gemm_job){.M = M, .K = K, .lda = lda, .A = A, .accumulate = accumulate};
    for (int i = 0; i < n; i++) {
        const ma_bmat *B = parts[i].B;
        if (parts[i].N <= 0) continue;
        if ((unsigned)B->layout >= MA_B_LAYOUTS || (unsigned)B->dtype >= MA_DT_COUNT) abort();
        gemm_seg *g = &j->seg[j->n_seg++];
        *g = (gemm_seg){B, parts[i].N, parts[i].ldc, j->panels, parts[i].bias, parts[i].C, active.load[B->layout][B->dtype]};
        if (!g->load) abort();
        j->panels += (parts[i].N + NR - 1) / NR;
    }
    /* the small-M kernels when every part is in the panel layout */
    j->small = active.small_panels && M <= (active.small_mr ? active.small_mr : active.mr) && j->n_seg > 0;
    for (int s = 0; s < j->n_seg; s++)
        if (j->seg[s].B->layout != MA_B_PANELS) j->small = 0;
    if (j->small && M > 0) j->qa = small_qa(j);
    j->qa_todo = j->qa != NULL;
    j->bf16 = !j->small && M > MA_GEMM_MR_MAX && K > 0 && j->n_seg > 0 && set_bf16(&active) == MA_COMPUTE_BF16;
    for (int s = 0; s < j->n_seg; s++)
        if (j->seg[s].B->compute != MA_COMPUTE_BF16) j->bf16 = 0;
    /* the f16 plan: every part f16 context panels that ask for it */
    j->f16 = !j->small && M > MA_GEMM_MR_MAX && K > 0 && j->n_seg > 0 && active.f16_tile != NULL;
    for (int s = 0; s < j->n_seg; s++) {
        const ma_bmat *B = j->seg[s].B;
        if (B->compute != MA_COMPUTE_F16 || B->layout != MA_B_PANELS || B->dtype != MA_DT_F16) j->f16 = 0;
    }
    /* the bf16 layouts: AMX tiles (split, or hi only for bf16 compute), or VDPBF16PS */
    j->amx = !j->small && M > MA_GEMM_MR_MAX && K > 0 && (active.amx_tile || (j->bf16 && active.bf16_tile));
    return M > 0 && j->n_seg > 0;
}

static void run_job(gemm_job *j) {
    int64_t n_total = 0;
    for (int s = 0; s < j->n_seg; s++) n_total += j->seg[s].N;
    /* below ~64 kFLOP per thread the hand-off costs more than it saves */
    const int64_t work = j->M * n_total * (j->K ? j->K : 1);
    int max_t = work < (1 << 17) ? 1 : (int)(j->panels < 64 ? j->panels : 64);
    /* tall A, or too few panels to share out evenly (a head's 5 panels over 2 threads): rows */
    const int T = ma_threads();
    j->split_m = j->M >= 2 * MC * T || (j->panels < 8 * T && j->M >= 8 * MA_GEMM_MR_MAX * T && !j->small);
    /* int8 parts of more rows in a job cut by panels: A quantised once for the job, before it.
     * Each thread had quantised all the rows per K chunk for its panels, so every row once per
     * thread: 4-14 % of the threads' time at M = 128 (gemm_bench), halved by this. (Cut by rows,
     * as from 2 MC T rows, each thread quantises only its own rows already; cutting those jobs
     * by panels instead measured slower for N <= 1152.) */
    if (!j->split_m && !j->small && !j->amx && active.q_panels && j->M > MA_GEMM_MR_MAX && j->K > 0 && max_t > 1) {
        int any = 0;
        for (int s = 0; s < j->n_seg; s++) any |= int8_part(&j->seg[s]);
        if (any)
            j->qa_all =
                thread_buffer(&qa_key, (size_t)((j->M + MA_GEMM_MR_MAX - 1) / MA_GEMM_MR_MAX) * (size_t)(j->K / 32) * MA_GEMM_QA_BLOCK);
    }
    /* small path: about four chunks a thread, so the last one to finish waits little */
    j->chunk = ((j->panels + 4 * T - 1) / (4 * T) + 1) / 2 * 2; /* even: panels go in pairs */
    atomic_init(&j->next, 0);
    if (j->qa_todo) { /* the int8 A first, shared out as a job of its own (a job's parts never wait for each other) */
        ma_parallel_n(quantise_task, j, max_t);
        j->qa_todo = 0;
    }
    if (j->qa_all) ma_parallel_n(quantise_all_task, j, max_t);
    /* parts are claimed by the threads as they come (kernels/threads.h): cut finer than the
     * threads (the small path takes its chunks from j->next already), a thread that another
     * process slows down takes fewer of them instead of setting the time */
    int parts = max_t < T ? max_t : T;
    if (!j->small && T > 1 && max_t > T) {
        const int64_t units = j->split_m ? (j->M + (j->amx ? 32 : active.mr) - 1) / (j->amx ? 32 : active.mr) : j->panels;
        parts = (int)(units < (int64_t)PARTS_PER_THREAD * T ? units : (int64_t)PARTS_PER_THREAD * T);
        if (parts < T) parts = T;
    }
    ma_parallel_parts(gemm_task, j, parts);
}

/* 2 M N K per job, by how it is computed (ma_gemm_counts) */
static atomic_ullong counted[4]; /* fp32, bf16, int8, f16 */

static void count_job(const gemm_job *j) {
    for (int s = 0; s < j->n_seg; s++) {
        const unsigned long long f = 2ull * (unsigned long long)j->M * (unsigned long long)j->seg[s].N * (unsigned long long)j->K;
        const int int8 = int8_part(&j->seg[s]) && (j->small ? j->qa != NULL : !j->amx);
        atomic_fetch_add_explicit(&counted[j->bf16 ? 1 : j->f16 ? 3 : int8 ? 2 : 0], f, memory_order_relaxed);
    }
}

void ma_gemm_counts_get(ma_gemm_counts *c) {
    c->fp32 = (double)atomic_load(&counted[0]);
    c->bf16 = (double)atomic_load(&counted[1]);
    c->int8 = (double)atomic_load(&counted[2]);
    c->f16 = (double)atomic_load(&counted[3]);
}

void ma_gemm_counts_reset(void) {
    for (int i = 0; i < 4; i++) atomic_store(&counted[i], 0);
}

void ma_gemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const ma_bmat *B, const float *bias, int accumulate, float *C,
             int64_t ldc) {
    gemm_job j;
    const ma_gemm_part part = {B, N, bias, C, ldc};
    if (prepare(&j, M, K, A, lda, &part, 1, accumulate)) {
        count_job(&j);
        run_job(&j);
    }
}

void ma_gemm_fused(int64_t M, int64_t K, const float *A, int64_t lda, const ma_gemm_part *parts, int n_parts) {
    gemm_job j;
    if (prepare(&j, M, K, A, lda, parts, n_parts, 0)) {
        count_job(&j);
        run_job(&j);
    }
}

void ma_gemm_serial(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const ma_bmat *B, const float *bias, int accumulate,
                    float *C, int64_t ldc) {
    gemm_job j;
    const ma_gemm_part part = {B, N, bias, C, ldc};
    if (prepare(&j, M, K, A, lda, &part, 1, accumulate)) {
        count_job(&j);
        if (j.qa_todo) quantise_a(&j, 0, 1);
        gemm_block(&j, 0, M, 0, j.panels);
    }
}

/* ------------------------------------------------------------------ packing */

size_t ma_panels_size(ma_dtype dt, int64_t N, int64_t K) {
    const size_t rows = (size_t)((N + NR - 1) / NR) * NR;
    switch (dt) {
    case MA_DT_Q8_0: return rows * (size_t)(K / 32) * 34;
    case MA_DT_Q4_0: return rows * (size_t)(K / 32) * 18;
    case MA_DT_F32: return rows * (size_t)K * 4;
    default: return rows * (size_t)K * 2;
    }
}

void ma_panels_row(ma_dtype dt, const void *panels, int64_t K, int64_t row, float *dst) {
    const int64_t p = row / NR;
    const int r = (int)(row % NR);
    if (dt == MA_DT_Q8_0 || dt == MA_DT_Q4_0) {
        const int q8 = dt == MA_DT_Q8_0;
        const size_t pb = q8 ? 544 : 288, nb = (size_t)(K / 32);
        for (size_t b = 0; b < nb; b++) {
            const uint8_t *blk = (const uint8_t *)panels + ((size_t)p * nb + b) * pb, *q = blk + 32;
            const float d = block_scale(blk + 2 * r);
            for (int i = 0; i < 32; i++) {
                int v = q8 ? (int8_t)q[i * NR + r] : (i < 16 ? (q[i * NR + r] & 0x0f) : (q[(i - 16) * NR + r] >> 4)) - 8;
                dst[b * 32 + (size_t)i] = d * (float)v;
            }
        }
        return;
    }
    for (int64_t k = 0; k < K; k++) dst[k] = elem_to_f32(dt, panels, (p * K + k) * NR + r);
}

void ma_pack_panels(ma_dtype dt, const void *rows, int64_t N, int64_t K, void *out) {
    const int64_t panels = (N + NR - 1) / NR;
    memset(out, 0, ma_panels_size(dt, N, K));
    if (dt == MA_DT_Q8_0 || dt == MA_DT_Q4_0) {
        const int q8 = dt == MA_DT_Q8_0;
        const size_t bs = q8 ? 34 : 18, pb = 16 * bs, nb = (size_t)(K / 32);
        for (int64_t p = 0; p < panels; p++)
            for (size_t b = 0; b < nb; b++) {
                uint8_t *dst = (uint8_t *)out + ((size_t)p * nb + b) * pb;
                for (int r = 0; r < NR && p * NR + r < N; r++) {
                    const uint8_t *src = (const uint8_t *)rows + ((size_t)(p * NR + r) * nb + b) * bs;
                    dst[2 * r] = src[0];
                    dst[2 * r + 1] = src[1];
                    const int vals = q8 ? 32 : 16;
                    for (int i = 0; i < vals; i++) dst[32 + i * NR + r] = src[2 + i];
                }
            }
        return;
    }
    const size_t es = dt == MA_DT_F32 ? 4 : 2;
    for (int64_t p = 0; p < panels; p++)
        for (int r = 0; r < NR && p * NR + r < N; r++)
            for (int64_t k = 0; k < K; k++)
                memcpy((uint8_t *)out + ((size_t)(p * K + k) * NR + r) * es, (const uint8_t *)rows + ((size_t)(p * NR + r) * K + k) * es,
                       es);
}
