/* SPDX-License-Identifier: Apache-2.0 */
/* GEMM micro-benchmark: molmoact's kernels with f32 / f16 / bf16 / q8_0 / q4_0 weights in the
 * context (panel) layout against OpenBLAS sgemm on f32 weights and the measured FMA peak, for
 * M = 10 (action expert), 128 (LLM prompt), 729 (one camera's ViT tokens) and the K x N of each
 * real layer. Measurements only; nothing here is a test.
 *
 *   gemm_bench [--quick] [--json]      threads: MOLMOACT_THREADS (default: all CPUs)
 *   gemm_bench --peaks                 only the peaks, one JSON line
 *
 * Peaks measured here, each from independent chains on every thread: FMA (the fp32 kernels),
 * the AMX split and bf16 tile products, VPDPBUSD (the int8 kernels). */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/env.h"
#include "core/util.h"
#include "kernels/gemm.h"
#include "kernels/kernels.h"
#include <stdint.h>
#include "kernels/quant.h"
#include "kernels/threads.h"
#if defined(__x86_64__) && defined(MA_HAVE_AVX2)
#include <immintrin.h>
#endif

/* ---- FMA peak: independent FMA chains on every thread */
#if defined(__x86_64__) && defined(MA_HAVE_AVX2)
__attribute__((target("avx2,fma"))) static double fma_chains(long iters) {
    __m256 a[12];
    for (int i = 0; i < 12; i++) a[i] = _mm256_set1_ps(0.001f * (float)i);
    const __m256 b = _mm256_set1_ps(0.9999f), c = _mm256_set1_ps(1e-4f);
    for (long it = 0; it < iters; it++) {
        a[0] = _mm256_fmadd_ps(a[0], b, c);
        a[1] = _mm256_fmadd_ps(a[1], b, c);
        a[2] = _mm256_fmadd_ps(a[2], b, c);
        a[3] = _mm256_fmadd_ps(a[3], b, c);
        a[4] = _mm256_fmadd_ps(a[4], b, c);
        a[5] = _mm256_fmadd_ps(a[5], b, c);
        a[6] = _mm256_fmadd_ps(a[6], b, c);
        a[7] = _mm256_fmadd_ps(a[7], b, c);
        a[8] = _mm256_fmadd_ps(a[8], b, c);
        a[9] = _mm256_fmadd_ps(a[9], b, c);
        a[10] = _mm256_fmadd_ps(a[10], b, c);
        a[11] = _mm256_fmadd_ps(a[11], b, c);
    }
    float s[8], acc = 0;
    for (int i = 0; i < 12; i++) {
        _mm256_storeu_ps(s, a[i]);
        acc += s[0];
    }
    return acc;
}
#endif

#if defined(__x86_64__) && defined(MA_HAVE_AVX512)
/* the same with 16-wide FMAs: the peak the AVX-512 kernels are held to */
__attribute__((target("avx512f"))) static double fma_chains512(long iters) {
    __m512 a[12];
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps(0.001f * (float)i);
    const __m512 b = _mm512_set1_ps(0.9999f), c = _mm512_set1_ps(1e-4f);
    for (long it = 0; it < iters; it++) {
        a[0] = _mm512_fmadd_ps(a[0], b, c);
        a[1] = _mm512_fmadd_ps(a[1], b, c);
        a[2] = _mm512_fmadd_ps(a[2], b, c);
        a[3] = _mm512_fmadd_ps(a[3], b, c);
        a[4] = _mm512_fmadd_ps(a[4], b, c);
        a[5] = _mm512_fmadd_ps(a[5], b, c);
        a[6] = _mm512_fmadd_ps(a[6], b, c);
        a[7] = _mm512_fmadd_ps(a[7], b, c);
        a[8] = _mm512_fmadd_ps(a[8], b, c);
        a[9] = _mm512_fmadd_ps(a[9], b, c);
        a[10] = _mm512_fmadd_ps(a[10], b, c);
        a[11] = _mm512_fmadd_ps(a[11], b, c);
    }
    float acc = 0;
    for (int i = 0; i < 12; i++) acc += _mm512_reduce_add_ps(a[i]);
    return acc;
}
#endif

#if defined(__x86_64__) && defined(MA_HAVE_AMX)
/* AMX bf16 peak: four independent accumulator tiles (the AMX kernels' 32 x 32 block) */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;
static const tile_config amx_config = {1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};
__attribute__((target("amx-tile,amx-bf16"))) static double amx_chains(long iters) {
    _Alignas(64) static _Thread_local uint16_t src[512];
    _Alignas(64) float out[256];
    _tile_loadconfig(&amx_config);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, src, 64);
    _tile_loadd(5, src, 64);
    _tile_loadd(6, src, 64);
    _tile_loadd(7, src, 64);
    for (long i = 0; i < iters; i++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, out, 64);
    _tile_release();
    return out[0];
}
#endif

#if defined(__x86_64__) && defined(MA_HAVE_VNNI)
/* VNNI peak: 16 independent VPDPBUSD chains (64 int8 products each) */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static double vnni_chains(long iters) {
    __m512i a[16];
    for (int i = 0; i < 16; i++) a[i] = _mm512_set1_epi32(i);
    __m512i x = _mm512_set1_epi8(1);
    const __m512i y = _mm512_set1_epi8(2);
    for (long it = 0; it < iters; it++) {
        a[0] = _mm512_dpbusd_epi32(a[0], x, y);
        a[1] = _mm512_dpbusd_epi32(a[1], x, y);
        a[2] = _mm512_dpbusd_epi32(a[2], x, y);
        a[3] = _mm512_dpbusd_epi32(a[3], x, y);
        a[4] = _mm512_dpbusd_epi32(a[4], x, y);
        a[5] = _mm512_dpbusd_epi32(a[5], x, y);
        a[6] = _mm512_dpbusd_epi32(a[6], x, y);
        a[7] = _mm512_dpbusd_epi32(a[7], x, y);
        a[8] = _mm512_dpbusd_epi32(a[8], x, y);
        a[9] = _mm512_dpbusd_epi32(a[9], x, y);
        a[10] = _mm512_dpbusd_epi32(a[10], x, y);
        a[11] = _mm512_dpbusd_epi32(a[11], x, y);
        a[12] = _mm512_dpbusd_epi32(a[12], x, y);
        a[13] = _mm512_dpbusd_epi32(a[13], x, y);
        a[14] = _mm512_dpbusd_epi32(a[14], x, y);
        a[15] = _mm512_dpbusd_epi32(a[15], x, y);
        __asm__ volatile("" : "+v"(x));
    }
    long acc = 0;
    for (int i = 0; i < 16; i++) acc += _mm512_reduce_add_epi32(a[i]);
    return (double)acc;
}
#endif

typedef struct {
    long iters;
    int wide;
    double sink;
} peak_job;
static void peak_task(void *ctx, int t, int T) {
    (void)t;
    (void)T;
    peak_job *j = ctx;
#if defined(__x86_64__) && defined(MA_HAVE_AVX512)
    if (j->wide) {
        j->sink += fma_chains512(j->iters);
        return;
    }
#endif
#if defined(__x86_64__) && defined(MA_HAVE_AVX2)
    j->sink += fma_chains(j->iters);
#else
    (void)j;
#endif
}

/* FMA peak of the vector width the active kernels use (8 floats for avx2; 16 for avx512, vnni
 * and amx, whose fp32 kernels are the AVX-512 ones) */
static double fma_peak_gflops_n(long iters) {
#if defined(__x86_64__) && defined(MA_HAVE_AVX2)
    const char *ks = ma_gemm_kernels();
    const int wide = !strcmp(ks, "avx512") || !strcmp(ks, "vnni") || !strcmp(ks, "amx");
    peak_job j = {iters, wide, 0};
    ma_parallel(peak_task, &j); /* warm */
    double t0 = ma_now_s();
    ma_parallel(peak_task, &j);
    double dt = ma_now_s() - t0;
    return (double)ma_threads() * j.iters * 12 * (wide ? 32 : 16) / dt / 1e9;
#else
    (void)iters;
    return 0;
#endif
}
static double fma_peak_gflops(void) { return fma_peak_gflops_n(50000000); }

/* seconds for one call of task on every thread, after a warm-up call */
static double time_on_threads(ma_task_fn task, peak_job *j) {
    ma_parallel(task, j);
    double t0 = ma_now_s();
    ma_parallel(task, j);
    return ma_now_s() - t0;
}

#if defined(__x86_64__) && defined(MA_HAVE_VNNI)
static void vnni_task(void *ctx, int t, int T) {
    (void)t;
    (void)T;
    peak_job *j = ctx;
    j->sink += vnni_chains(j->iters);
}
#endif
/* the int8 kernels' peak: VPDPBUSD on every thread, two operations per int8 product (the units
 * of the GFLOP/s columns); 0 without VNNI */
static double vnni_peak_gops(long iters) {
#if defined(__x86_64__) && defined(MA_HAVE_VNNI)
    if (!ma_gemm_int8_activations()) return 0;
    peak_job j = {iters, 0, 0};
    return (double)ma_threads() * j.iters * 16 * 64 * 2 / time_on_threads(vnni_task, &j) / 1e9;
#else
    (void)iters;
    return 0;
#endif
}

#if defined(__x86_64__) && defined(MA_HAVE_AMX)
static void amx_task(void *ctx, int t, int T) {
    (void)t;
    (void)T;
    peak_job *j = ctx;
    j->sink += amx_chains(j->iters);
}
#endif
/* the AMX kernels' fp32-accuracy peak: the bf16 tile peak over three (a_hi w_hi, a_lo w_hi,
 * a_hi w_lo per product, see gemm_amx.c); 0 without the amx kernels */
static double amx_split_peak_gflops(long iters) {
#if defined(__x86_64__) && defined(MA_HAVE_AMX)
    if (strcmp(ma_gemm_kernels(), "amx")) return 0;
    peak_job j = {iters, 0, 0};
    return (double)ma_threads() * j.iters * 4 * 16384 / time_on_threads(amx_task, &j) / 1e9 / 3;
#else
    (void)iters;
    return 0;
#endif
}

/* ---- memory read bandwidth: sum a buffer far larger than the caches. Integer sums in eight
 * independent chains (one 64-byte line per iteration), so the loop issues loads faster than memory
 * delivers them: a chain of float adds is bound by the add latency instead (about 12 GB/s per
 * core at 3 GHz, below what one core can pull from memory). */
typedef struct {
    const uint64_t *buf;
    size_t n;
    uint64_t sums[64];
} bw_job;
static void bw_task(void *ctx, int t, int T) {
    bw_job *j = ctx;
    long lo, hi;
    ma_split_range((long)(j->n / 8), t, T, &lo, &hi);
    uint64_t s[8] = {0};
    for (long i = lo * 8; i < hi * 8; i += 8)
        for (int k = 0; k < 8; k++) s[k] += j->buf[i + k];
    j->sums[t] = s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

static double read_bandwidth_gbs(void) {
    const size_t n = (size_t)512 << 20 >> 3; /* 512 MiB: twice the largest L3 seen on these VMs */
    uint64_t *buf = malloc(n * sizeof *buf);
    if (!buf) return 0;
    for (size_t i = 0; i < n; i++) buf[i] = i & 7;
    bw_job j = {buf, n, {0}};
    ma_parallel(bw_task, &j);
    double best = 0;
    for (int r = 0; r < 5; r++) {
        double t0 = ma_now_s();
        ma_parallel(bw_task, &j);
        double g = n * sizeof *buf / (ma_now_s() - t0) / 1e9;
        if (g > best) best = g;
    }
    free(buf);
    return best;
}

typedef struct {
    const char *layer;
    int K, N;
} shape;

/* seconds per call: the best of five batches of at least min_s / 5 each. These VMs' speed
 * drifts by 30 % and more within seconds; the best batch, like the peak it is compared with
 * (the best of two measurements), is what the code can do on this machine, not the drift. */
static double time_it(void (*fn)(void *), void *ctx, double min_s) {
    fn(ctx); /* warm */
    double best = 1e30;
    for (int b = 0; b < 5; b++) {
        int reps = 0;
        double t0 = ma_now_s(), dt;
        do {
            fn(ctx);
            reps++;
            dt = ma_now_s() - t0;
        } while (dt < min_s / 5);
        if (dt / reps < best) best = dt / reps;
    }
    return best;
}

typedef struct {
    int M, N, K;
    const float *A;
    ma_bmat B;
    float *C;
    const float *W32;
} call;
static void run_ours(void *p) {
    call *c = p;
    ma_gemm(c->M, c->N, c->K, c->A, c->K, &c->B, NULL, 0, c->C, c->N);
}

/* the int8 kernels' time by phase over a few calls (ma_gemm_phase_timing): activation
 * quantisation and weight rearrangement as shares of the threads' time; out[0], out[1] */
static void int8_phases(call *c, double out[2]) {
    ma_gemm_phases_reset();
    ma_gemm_phase_timing(1);
    const int reps = 5;
    const double t0 = ma_now_s();
    for (int i = 0; i < reps; i++) run_ours(c);
    const double wall = (ma_now_s() - t0) * ma_threads();
    ma_gemm_phase_timing(0);
    ma_gemm_phases ph;
    ma_gemm_phases_get(&ph);
    out[0] = ph.qa_s / wall;
    out[1] = ph.qw_s / wall;
}
static void run_blas(void *p) {
    call *c = p;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, c->M, c->N, c->K, 1.0f, c->A, c->K, c->W32, c->K, 0.0f, c->C, c->N);
}

int main(int argc, char **argv) {
    int quick = 0, json = 0, bw_only = 0, peaks_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--bandwidth")) bw_only = 1;
        else if (!strcmp(argv[i], "--peaks")) peaks_only = 1;
        else if (!strcmp(argv[i], "--openblas-core")) {
            printf("%s\n", openblas_get_corename());
            return 0;
        } else {
            fprintf(stderr, "usage: gemm_bench [--quick] [--json] [--bandwidth | --peaks | --openblas-core]\n");
            return 2;
        }
    }
    { /* MOLMOACT_THREADS, MOLMOACT_KERNELS, ... through the one table (molmoact help env) */
        ma_settings st;
        ma_error err = {0};
        if (ma_settings_from_env(&st, &err) || ma_kernels_configure(&st, &err)) {
            fprintf(stderr, "gemm_bench: %s\n", err.msg);
            return 2;
        }
    }
    if (bw_only) { /* only the read bandwidth (bench/compare.sh's stream times) */
        const double bw = read_bandwidth_gbs();
        if (json) printf("{\"threads\": %d, \"read_bandwidth_gbs\": %.2f}\n", ma_threads(), bw);
        else printf("read bandwidth %.1f GB/s (%d threads)\n", bw, ma_threads());
        return bw > 0 ? 0 : 1;
    }
    if (peaks_only) { /* the peaks the kernels in use are held to, one JSON line (bench/fullsize.sh) */
        const double fma = fma_peak_gflops(), split = amx_split_peak_gflops(2000000), vnni = vnni_peak_gops(20000000);
        const double bw = read_bandwidth_gbs(); /* the memory-bound sessions' limit (the action steps) */
        printf("{\"kernels\": \"%s\", \"threads\": %d, \"fma_peak_gflops\": %.1f, \"amx_split_peak_gflops\": %.1f, "
               "\"amx_bf16_peak_gflops\": %.1f, \"vnni_peak_gops\": %.1f, \"bf16_unit\": \"%s\", "
               "\"bf16_dot_fma_cost\": %.2f, \"read_bandwidth_gbs\": %.2f}\n",
               ma_gemm_kernels(), ma_threads(), fma, split, 3 * split, vnni, ma_gemm_bf16_unit(), ma_gemm_bf16_dot_measured(), bw);
        return 0;
    }
    openblas_set_num_threads(ma_threads());
    const double peak = fma_peak_gflops(), bw = read_bandwidth_gbs(), amx_peak = amx_split_peak_gflops(2000000),
                 vnni_peak = vnni_peak_gops(20000000);
    static const shape shapes[] = {
        {"vit qkv (fused)", 1152, 3456}, {"vit out", 1152, 1152},           {"vit fc1", 1152, 4304}, {"vit fc2", 4304, 1152},
        {"llm q", 2560, 4096},           {"llm kv (fused)", 2560, 2048},    {"llm o", 4096, 2560},   {"llm gate+up (fused)", 2560, 19456},
        {"llm down", 9728, 2560},        {"expert qkv (fused)", 768, 2304}, {"expert o", 768, 768},  {"expert gate+up", 768, 6144},
        {"expert down", 3072, 768}, /* the released expert's MLP: mlp_ratio 4.0, 3,072 wide (reference/molmoact_ref/config.py) */
    };
    static const int Ms[] = {10, 128, 729};
    static const ma_dtype types[] = {MA_DT_F32, MA_DT_F16, MA_DT_BF16, MA_DT_Q8_0, MA_DT_Q4_0};
    const double min_s = quick ? 0.05 : 0.3;
    if (json)
        printf("{\"kernels\": \"%s\", \"threads\": %d, \"fma_peak_gflops\": %.1f, \"amx_split_peak_gflops\": %.1f, "
               "\"vnni_peak_gops\": %.1f, \"read_bandwidth_gbs\": %.2f, \"openblas_core\": \"%s\", \"rows\": [",
               ma_gemm_kernels(), ma_threads(), peak, amx_peak, vnni_peak, bw, openblas_get_corename());
    else {
        printf("kernels %s, %d threads, OpenBLAS core %s; FMA peak %.1f GFLOP/s", ma_gemm_kernels(), ma_threads(), openblas_get_corename(),
               peak);
        if (amx_peak > 0) printf(", AMX split peak %.1f GFLOP/s", amx_peak);
        if (vnni_peak > 0) printf(", VNNI peak %.1f GOP/s", vnni_peak);
        printf(", read bandwidth %.1f GB/s\n", bw);
        printf("bf16 compute on %s\n", ma_gemm_bf16_unit());
        printf("%-20s %5s %5s %5s | %9s | %9s %9s %9s %9s %9s %9s | %6s %6s %6s %7s %6s %6s | %5s %5s\n", "layer", "M", "K", "N",
               "openblas", "f32", "f16", "bf16", "q8_0", "q4_0", "f16*bf16", "f16/pk", "f16/ax", "f16/bl", "*bf16/1", "q8/vn", "q4/vn",
               "q8a/w", "q4a/u");
    }
    /* ours for every shape first, then OpenBLAS: its threads spin for a while after each call
     * (up to 2^28 cycles by default), and timed between them our threads shared the cores with
     * them (on two vCPUs that cost 15-45 % of our measured speed) */
    enum { N_SHAPES = sizeof shapes / sizeof *shapes, N_M = sizeof Ms / sizeof *Ms };
    static double g_ours[N_SHAPES][N_M][6], g_blas[N_SHAPES][N_M], peaks[N_SHAPES][N_M][2], phases[N_SHAPES][N_M][2][2];
    /* where the int8 kernels run (for more than 12 rows the amx set uses its tiles instead) */
    const int int8_small = ma_gemm_int8_activations(), int8_large = int8_small && strcmp(ma_gemm_kernels(), "amx");
    for (int pass = 0; pass < 2; pass++)
        for (size_t s = 0; s < N_SHAPES; s++) {
            const int K = shapes[s].K, N = shapes[s].N;
            float *W = malloc(sizeof(float) * (size_t)N * K);
            uint64_t st = 12345 + s;
            for (size_t i = 0; i < (size_t)N * K; i++) {
                st = st * 6364136223846793005ull + 1442695040888963407ull;
                W[i] = ((float)(st >> 40) / 16777216.0f - 0.5f) * 0.05f;
            }
            void *packed[5] = {0}, *rows = malloc((size_t)N * K * 4);
            for (int t = 0; t < 5 && pass == 0; t++) {
                ma_convert_from_f32(types[t], W, (int64_t)N * K, rows);
                packed[t] = malloc(ma_panels_size(types[t], N, K));
                ma_pack_panels(types[t], rows, N, K, packed[t]);
            }
            for (size_t mi = 0; mi < N_M; mi++) {
                const int M = Ms[mi];
                if (quick && M == 729 && N > 5000) continue;
                float *A = malloc(sizeof(float) * (size_t)M * K), *C = malloc(sizeof(float) * (size_t)M * N);
                for (size_t i = 0; i < (size_t)M * K; i++) A[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
                const double flop = 2.0 * M * N * K;
                call c = {M, N, K, A, {MA_B_PANELS, MA_DT_F32, NULL, 0, 0, MA_COMPUTE_F32}, C, W};
                if (pass == 1) g_blas[s][mi] = flop / time_it(run_blas, &c, min_s) / 1e9;
                for (int t = 0; t < 5 && pass == 0; t++) {
                    c.B.dtype = types[t];
                    c.B.data = packed[t];
                    g_ours[s][mi][t] = flop / time_it(run_ours, &c, min_s) / 1e9;
                    if (t >= 3 && (M > MA_GEMM_MR_MAX ? int8_large : int8_small)) int8_phases(&c, phases[s][mi][t - 3]);
                }
                if (pass == 0) { /* f16 weights, the bf16 compute plan (fp32 where the CPU has no bf16 unit) */
                    c.B.dtype = MA_DT_F16;
                    c.B.data = packed[1];
                    c.B.compute = MA_COMPUTE_BF16;
                    g_ours[s][mi][5] = flop / time_it(run_ours, &c, min_s) / 1e9;
                    c.B.compute = MA_COMPUTE_F32;
                }
                if (pass == 0) {
                    /* this machine's speed drifts: the percentage is against a peak measured right
                     * here (the best of this one and the first) */
                    double pk = fma_peak_gflops_n(10000000), ax = amx_peak > 0 ? amx_split_peak_gflops(400000) : 0;
                    peaks[s][mi][0] = pk < peak ? peak : pk;
                    peaks[s][mi][1] = M <= MA_GEMM_MR_MAX ? 0 : ax < amx_peak ? amx_peak : ax; /* M <= 12: the AVX-512 small-M kernels */
                }
                free(A);
                free(C);
            }
            for (int t = 0; t < 5; t++) free(packed[t]);
            free(rows);
            free(W);
        }
    int first = 1;
    for (size_t s = 0; s < N_SHAPES; s++)
        for (size_t mi = 0; mi < N_M; mi++) {
            const int M = Ms[mi], K = shapes[s].K, N = shapes[s].N;
            if (quick && M == 729 && N > 5000) continue;
            const double *g = g_ours[s][mi], pk = peaks[s][mi][0], ax = peaks[s][mi][1], gb = g_blas[s][mi];
            if (json) {
                printf(
                    "%s{\"layer\": \"%s\", \"M\": %d, \"K\": %d, \"N\": %d, \"openblas_f32\": %.2f, \"f32\": %.2f, \"f16\": %.2f, "
                    "\"bf16\": %.2f, \"q8_0\": %.2f, \"q4_0\": %.2f, \"f16_compute_bf16\": %.2f, \"fma_peak\": %.2f, \"amx_split_peak\": %.2f, "
                    "\"q8_0_quantise_share\": %.4f, \"q8_0_rearrange_share\": %.4f, \"q4_0_quantise_share\": %.4f, \"q4_0_unpack_share\": %.4f}",
                    first ? "" : ", ", shapes[s].layer, M, K, N, gb, g[0], g[1], g[2], g[3], g[4], g[5], pk, ax, phases[s][mi][0][0],
                    phases[s][mi][0][1], phases[s][mi][1][0], phases[s][mi][1][1]);
                first = 0;
            } else {
                char axs[16] = "     -", ax1[16] = "      -";
                if (ax > 0) snprintf(axs, sizeof axs, "%5.0f%%", 100 * g[1] / ax);
                if (ax > 0) snprintf(ax1, sizeof ax1, "%6.0f%%", 100 * g[5] / (3 * ax)); /* one tile product instead of three */
                char v8[16] = "     -", v4[16] = "     -";
                if (vnni_peak > 0 && M > MA_GEMM_MR_MAX && strcmp(ma_gemm_kernels(), "amx")) { /* amx: tiles for M > 12, not VNNI */
                    snprintf(v8, sizeof v8, "%5.0f%%", 100 * g[3] / vnni_peak);
                    snprintf(v4, sizeof v4, "%5.0f%%", 100 * g[4] / vnni_peak);
                }
                char p8[16] = "    -", p4[16] = "    -";
                if (M > MA_GEMM_MR_MAX ? int8_large : int8_small) {
                    snprintf(p8, sizeof p8, "%2.0f/%-2.0f", 100 * phases[s][mi][0][0], 100 * phases[s][mi][0][1]);
                    snprintf(p4, sizeof p4, "%2.0f/%-2.0f", 100 * phases[s][mi][1][0], 100 * phases[s][mi][1][1]);
                }
                printf("%-20s %5d %5d %5d | %9.1f | %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f | %5.0f%% %6s %5.2fx %7s %6s %6s | %5s %5s\n",
                       shapes[s].layer, M, K, N, gb, g[0], g[1], g[2], g[3], g[4], g[5], pk > 0 ? 100 * g[1] / pk : 0, axs, g[1] / gb, ax1,
                       v8, v4, p8, p4);
            }
        }
    if (json) printf("]}\n");
    else
        printf("GFLOP/s; f16/pk = f16 against the FMA peak, f16/ax = against the AMX split peak (amx kernels, M > 12),\n"
               "f16/bl = f16 against OpenBLAS on f32 weights; f16*bf16 = f16 weights with the bf16 compute plan, *bf16/1 = it\n"
               "against the AMX bf16 peak (one tile product: three times the split peak); q8/vn, q4/vn = q8_0, q4_0 against\n"
               "the VNNI peak (VPDPBUSD chains: 2 operations per int8 product; vnni kernels, M > 12); q8a/w, q4a/u = the\n"
               "int8 kernels' share of their threads' time, in %%, quantising activations / rearranging q8_0 or unpacking\n"
               "q4_0 weights (for more than 12 rows, once per K chunk and group of panels; fewer rows do it inline)\n");
    return 0;
}
