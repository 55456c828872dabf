/* SPDX-License-Identifier: Apache-2.0 */
/* GEMM with fp32 activations and weights in their stored precision:
 *     C[M, N] (+)= A[M, K] B^T (+ bias),  B given as N x K.
 *
 * The driver follows GotoBLAS's blocking: K in chunks of MA_GEMM_KC, M in blocks of
 * MA_GEMM_MC (the A block stays in L2), N in panels of 16 columns (NR) that are converted to
 * fp32 once per (K chunk, M block) into an L1-sized buffer laid out [k][16], then a register-
 * blocked micro-kernel computes 6 x 16 tiles. Panels are shared among the pool's threads. The
 * AVX-512 tiles (12 x 16, 12 x 32) take a group of panels per K chunk and read f16 / bf16 / f32
 * context panels in place, converting in registers; other B are converted once per group.
 *
 * B layouts:
 *   MA_B_ROWS    row-major [N][ld] of F32 / F16 / BF16 / Q8_0 / Q4_0 (checkpoint tensors, K/V)
 *   MA_B_COLS    row-major [K][ld] of F32 / F16 / BF16, i.e. C = A B (attention's P V; a weight
 *                W [R][ld] from its row r0: C = A W[r0 : r0 + K], data pointing at row r0)
 *   MA_B_PANELS  the context layout written by `molmoact compile` (ma_pack_panels): per panel
 *                of 16 rows, K-major, so converting a panel is one sequential read
 *   MA_B_PANELS_T  an F32 / F16 / BF16 weight W [R][ld] in the panel layout used as MA_B_COLS
 *                uses it: C = A W[row0 : row0 + K] (row0 need not be a multiple of 16)
 *
 * The micro-kernel and panel loaders have a portable C version and, on x86-64 CPUs with
 * AVX2 + FMA + F16C, SIMD ones (AVX2 6 x 16 tiles; AVX-512F 12 x 16 / 12 x 32 tiles; "vnni":
 * int8 dot products for q8_0 / q4_0 with at most 12 rows; "amx": split-bf16 tiles) and, on
 * aarch64, NEON ones ("neon"; "neon_dot": SDOT int8 dot products), chosen at run time;
 * MOLMOACT_KERNELS=portable|avx2|avx512|vnni|amx|neon|neon_dot picks one. The fp32 ones use the
 * same K blocking, so they differ only by FMA rounding. CONTRIBUTING.md "Adding a kernel" says
 * how a set is added. */
#ifndef MA_GEMM_H
#define MA_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "core/tensor.h"

#define MA_GEMM_NR 16
#define MA_GEMM_MR 6      /* rows of the portable and AVX2 tiles */
#define MA_GEMM_MR_MAX 12 /* the AVX-512 tile */
#define MA_GEMM_KC 384
#define MA_GEMM_MC 144

typedef enum { MA_B_ROWS, MA_B_COLS, MA_B_PANELS, MA_B_PANELS_T, MA_B_LAYOUTS } ma_blayout;

/* How a product may be computed (a context's compute plan, `compile --compute`):
 *   MA_COMPUTE_F32   fp32 accuracy (the default): every kernel set, the AMX tiles through their
 *                    hi/lo split; except that the int8 kernel sets quantise the activations of
 *                    q8_0 / q4_0 products to int8 per 32-k block (gemm_vnni.c)
 *   MA_COMPUTE_BF16  both operands rounded to bf16 (8 significant bits, round to nearest even),
 *                    products summed in fp32: one AMX tile product instead of three, or
 *                    VDPBF16PS (AVX512-BF16: Zen 4/5, Cooper Lake and later) instead of FMA. Taken
 *                    by GEMMs of more than 12 rows on a CPU with either unit; elsewhere (fewer
 *                    rows, where the weights stream at memory speed, or no bf16 unit) the product
 *                    is computed as MA_COMPUTE_F32. A fused job takes it when all its parts do.
 *   MA_COMPUTE_EXACT fp32 activations wherever they are: not quantised to int8 for q8_0 / q4_0
 *                    weights on the int8 kernel sets (vnni, neon_dot, and amx for 12 rows or
 *                    fewer), which MA_COMPUTE_F32 allows. Never stored in a context: set by the
 *                    model code for a product whose errors its consumer amplifies (the Grid
 *                    Sampler's coordinate MLP, vision.c). */
typedef enum { MA_COMPUTE_F32 = 0, MA_COMPUTE_BF16 = 1, MA_COMPUTE_EXACT = 2, MA_COMPUTE_F16 = 3 } ma_compute;
/* MA_COMPUTE_F16: both operands rounded to f16 (11 significant bits; A's rows first scaled by a
 * power of two per K chunk so that their largest |a| is in [8, 16)), the products of
 * MA_GEMM_F16_KB consecutive k summed in f16 (each step a fused multiply-add rounded to f16),
 * those block sums in fp32: FMLA on eight halves on aarch64 CPUs with FP16 arithmetic (asimdhp:
 * Cortex-A55/A75 and later, the A78AE), twice the lanes of fp32's. Taken by GEMMs of more than
 * 12 rows on f16 weights in the panel layout on such a CPU; elsewhere computed as
 * MA_COMPUTE_F32. Its block sums stay below f16's largest value for weights up to
 * MA_GEMM_F16_WMAX in magnitude: compile keeps fp32 compute for a matrix with larger ones. */
#define MA_GEMM_F16_KB 32
#define MA_GEMM_F16_WMAX 64.0f
/* the compute plan's name in contexts and settings: "fp32", "bf16", "f16" (EXACT: "fp32") */
const char *ma_compute_name(ma_compute c);

typedef struct ma_bmat {
    ma_blayout layout;
    ma_dtype dtype; /* MA_B_COLS, MA_B_PANELS_T: F32 / F16 / BF16 */
    const void *data;
    int64_t ld;         /* elements between rows (ROWS: >= K; COLS: >= N); PANELS_T: W's columns (>= N);
                     * unused for PANELS */
    int64_t row0;       /* PANELS_T: the row of W that is k = 0 */
    ma_compute compute; /* left 0 by the brace initialisers: fp32 */
} ma_bmat;

/* C = A B^T (+ C when accumulate) (+ bias[N] when bias); runs on the thread pool unless called
 * from inside a pool job. Quantised B needs K % 32 == 0 (and ld % 32 == 0). */
void ma_gemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const ma_bmat *B, const float *bias, int accumulate, float *C,
             int64_t ldc);
/* several products of the same A (q/k/v, gate/up): one job whose panels run over the parts in
 * turn, so A is packed once per block and the threads share all the parts' panels. The math
 * of each part is that of ma_gemm. */
#define MA_GEMM_MAX_PARTS 4
typedef struct ma_gemm_part {
    const ma_bmat *B;
    int64_t N;
    const float *bias; /* or NULL */
    float *C;
    int64_t ldc;
} ma_gemm_part;
void ma_gemm_fused(int64_t M, int64_t K, const float *A, int64_t lda, const ma_gemm_part *parts, int n_parts);
/* the same on the calling thread only */
void ma_gemm_serial(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const ma_bmat *B, const float *bias, int accumulate,
                    float *C, int64_t ldc);

/* the products this process's GEMMs computed since the last reset, 2 M N K each (the unit of the
 * peaks in bench/gemm_bench.c), by how: fp32 (FMA, or the AMX split), bf16 (the bf16 plan on
 * AMX or VDPBF16PS), int8 (the vnni / neon_dot kernels' int8 activations) */
typedef struct ma_gemm_counts {
    double fp32, bf16, int8, f16; /* f16: the f16 plan's tiles (aarch64 with asimdhp) */
} ma_gemm_counts;
void ma_gemm_counts_get(ma_gemm_counts *c);
void ma_gemm_counts_reset(void);

/* With timing on (off by default: a clock read per K chunk), the time the int8 kernels spent,
 * summed over threads, since the last reset: quantising activations (qa_s: every path), and
 * rearranging weights for many rows (qw_s: per K chunk and group of panels, the q8_0 offset or
 * the q4_0 nibble unpacking and the lane shuffle; the small-M kernels do theirs inline) */
typedef struct ma_gemm_phases {
    double qa_s, qw_s;
} ma_gemm_phases;
void ma_gemm_phase_timing(int on);
void ma_gemm_phases_get(ma_gemm_phases *p);
void ma_gemm_phases_reset(void);

/* bytes of an N x K matrix of dtype dt in the panel layout (N rounded up to 16 rows) */
size_t ma_panels_size(ma_dtype dt, int64_t N, int64_t K);
/* row-major [N][K] of dtype dt (F32/F16/BF16/Q8_0/Q4_0, the last two in ggml blocks) -> the
 * panel layout. Q8_0 panel block (per 32 k, 16 rows): 16 f16 scales, then 32 x 16 int8 (k-major);
 * Q4_0: 16 f16 scales, then 16 x 16 bytes, byte [j][r] = row r's values k = j (low nibble) and
 * k = j + 16 (high nibble), as in a ggml block. Same values and scales, permuted. */
void ma_pack_panels(ma_dtype dt, const void *rows, int64_t N, int64_t K, void *out);

/* row `row` of an N x K panel-layout matrix as fp32 (embedding lookups, the scalar path) */
void ma_panels_row(ma_dtype dt, const void *panels, int64_t K, int64_t row, float *dst);

/* the name of the kernels in use: "amx", "vnni", "avx512", "avx2" or "portable" */
const char *ma_gemm_kernels(void);
/* the kernel sets this CPU can run, best last: "portable" first, then "avx2", "avx512", "vnni", "amx" */
int ma_gemm_kernel_count(void);
const char *ma_gemm_kernel_name(int i);
/* whether kernel set i (or the active one) quantises A to int8 per 32 k for q8_0 / q4_0 weights
 * in the panel layout ("vnni": any M; "amx" on top of it: at most 12 rows; gemm_vnni.c): then
 * each product's error is at most |w| max|a of its block| / 254 beyond the fp32 rounding */
int ma_gemm_kernel_int8_activations(int i);
int ma_gemm_int8_activations(void);
/* whether kernel set i reads panel-layout weights directly for a few rows (M <= 12: the action
 * expert), in another summation order than it uses for row-layout weights ("avx512" and up,
 * "neon"); the others give the same bits for both layouts */
int ma_gemm_kernel_small_panels(int i);
/* the compute a MA_COMPUTE_BF16 product of more than 12 rows gets with kernel set i (or the
 * active one): MA_COMPUTE_BF16 where the set has a bf16 unit (AMX tiles, or AVX512-BF16 on the
 * avx512 / vnni sets of a CPU that has it), else MA_COMPUTE_F32; and the unit's name ("amx",
 * "avx512_bf16", or "fp32") */
ma_compute ma_gemm_kernel_bf16(int i);
ma_compute ma_gemm_bf16(void);
/* what one VDPBF16PS cost against one FMA when this process chose its kernels (timed in
 * assembly, the same at every optimisation level); -1 where it was not timed (no AVX512-BF16) */
double ma_gemm_bf16_dot_measured(void);
/* VDPBF16PS is used where one costs at most this many FMAs (twice the products per
 * instruction: a bf16 product rate at least 4/3 of fp32's) */
#define MA_BF16_DOT_PAYS 1.5
/* MA_COMPUTE_F16 where kernel set i (or the active one) has the f16 tiles (aarch64 with asimdhp),
 * else MA_COMPUTE_F32 */
ma_compute ma_gemm_kernel_f16(int i);
ma_compute ma_gemm_f16(void);
/* why the kernels in use have no bf16 unit (the probe's cost above MA_BF16_DOT_PAYS, a kernel
 * set without it, or no AVX512-BF16 / AMX at all): one phrase for run's plan line and compile's
 * --compute auto */
void ma_gemm_bf16_off_reason(char *out, size_t cap);
const char *ma_gemm_bf16_unit(void);
/* tests, benchmarks: the VDPBF16PS tile on the sets of a CPU with AVX512-BF16 even where it does
 * not pay (1), never (0), or where it does (-1, the default: its rate is measured at start) */
void ma_gemm_set_bf16_dot(int on);
/* use kernel set i (tests, benchmarks; not while a GEMM runs); returns 0 if there is none */
int ma_gemm_select(int i);
/* tests: switch between the portable and the best kernels */
void ma_gemm_select_portable(int portable);
/* Where f16 / bf16 / f32 context panels are read on the grouped path (M > 12, tiles that read
 * them): 1 = in place, converted in registers by every A tile; 0 = converted once per K chunk
 * into an fp32 buffer in L2 that the tiles share. Same values either way, same bits. On Intel
 * the conversion takes the FMA ports (in place measured 10-25 % slower there), on AMD it does
 * not (in place faster: no buffer); the default follows the vendor, MOLMOACT_GEMM_PANELS=
 * in_place|convert overrides it, and ma_gemm_set_in_place(-1) restores it. */
void ma_gemm_set_in_place(int in_place);
/* the parts a large GEMM is cut into per thread (1..64; for measuring) */
void ma_gemm_set_parts(int n);
int ma_gemm_in_place(void);

#endif
