/* SPDX-License-Identifier: Apache-2.0 */
#define _GNU_SOURCE
#include "runtime/compile.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <limits.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/progress.h"
#include "core/util.h"
#include "io/gguf.h"
#include "io/mapfile.h"
#include "kernels/gemm.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "model/checkpoint.h"
#include "model/lerobot.h"
#include "model/manifest.h"
#include "molmoact.h"

static int parse_precision(const char *p, ma_dtype *dt) {
    if (!strcmp(p, "f16")) *dt = MA_DT_F16;
    else if (!strcmp(p, "bf16")) *dt = MA_DT_BF16;
    else if (!strcmp(p, "q8_0")) *dt = MA_DT_Q8_0;
    else if (!strcmp(p, "q4_0")) *dt = MA_DT_Q4_0;
    else return 0;
    return 1;
}

/* q4_0 < q8_0 < f16 = bf16 */
static int precision_rank(ma_dtype dt) { return dt == MA_DT_Q4_0 ? 0 : dt == MA_DT_Q8_0 ? 1 : 2; }

/* does checkpoint tensor `name` belong to context slot s? */
static int in_slot(const ma_model *m, int slot, const char *name) {
    switch (slot) {
    case 0: return !strncmp(name, "model.vision_backbone.", 22);
    case 1: return !strncmp(name, "model.transformer.wte.", 22);
    case 6: return !strcmp(name, "model.action_expert.context_k_proj.weight") || !strcmp(name, "model.action_expert.context_v_proj.weight");
    case 7: return !strncmp(name, "model.action_expert.", 20) && !in_slot(m, 6, name);
    default: {
        int split = slot - 2;
        int layer;
        if (sscanf(name, "model.transformer.blocks.%d.", &layer) != 1) return 0;
        return layer >= m->split_first[split] && layer < m->split_last[split];
    }
    }
}

static ma_status copy_host_file(const char *from_dir, const char *to_dir, const char *name, int required, ma_error *err) {
    char *src = ma_path_join(from_dir, name), *dst = ma_path_join(to_dir, name);
    ma_status s = MA_OK;
    if (!src || !dst) s = ma_fail(err, MA_ERR_NOMEM, "out of memory");
    else if (ma_is_file(src)) {
        char *buf;
        size_t len;
        if (!(s = ma_read_file(src, 512u << 20, &buf, &len, err))) {
            s = ma_write_file(dst, buf, len, err);
            free(buf);
        }
    } else if (required) s = ma_fail(err, MA_ERR_IO, "%s: missing", src);
    free(src);
    free(dst);
    return s;
}

/* one checkpoint tensor into a context tensor: converted row by row to dt, matrices then put in
 * the GEMM's panel layout; the source pages are released from this process after (they stay in
 * the page cache), so compiling a checkpoint larger than memory holds one tensor at a time */
typedef struct fill_job {
    const ma_wref *r;
    ma_dtype dt;
    float wmax; /* the f16 compute plan's bound on |w| (MA_GEMM_F16_WMAX), 0: none */
} fill_job;

static ma_progress g_progress; /* the compile's progress (one compile per process at a time) */

static uint64_t ref_bytes(const ma_wref *r) {
    size_t n = 0;
    return ma_shape_nbytes(r->dtype, r->ndim, r->shape, &n, NULL) ? 0 : (uint64_t)n;
}

/* the checkpoint tensors a slot's context stores, as write_slot chooses them */
static int slot_takes(const ma_model *m, int slot, const ma_wref *r) {
    if (r->used != 1 || !in_slot(m, slot, r->name)) return 0;
    return !(slot == 7 && (strstr(r->name, "modulation.linear") || strstr(r->name, "time_embed.")));
}

/* the largest |x| a row may hold for every value of it to stay finite when stored in dt (a q8_0
 * block's f16 scale is amax / 127; q4_0's about amax / 8, bounded here by amax / 7) */
static float stored_limit(ma_dtype dt) {
    switch (dt) {
    case MA_DT_F16: return 65504.0f;
    case MA_DT_BF16: return 0x1.fep127f;
    case MA_DT_Q8_0: return 65504.0f * 127.0f;
    case MA_DT_Q4_0: return 65504.0f * 7.0f;
    default: return FLT_MAX;
    }
}

static const char *dtype_label(ma_dtype dt) {
    switch (dt) {
    case MA_DT_F16: return "f16";
    case MA_DT_BF16: return "bf16";
    case MA_DT_Q8_0: return "q8_0";
    case MA_DT_Q4_0: return "q4_0";
    default: return "f32";
    }
}

/* x rounded to dt (f16 or bf16) and back; other types unchanged */
static void round_to(ma_dtype dt, float *x, int64_t n, void *tmp) {
    if (dt != MA_DT_F16 && dt != MA_DT_BF16) return;
    ma_convert_from_f32(dt, x, n, tmp);
    ma_convert_to_f32(dt, tmp, 0, n, x);
}

/* an unmerged LoRA adapter merged as PEFT's merge_and_unload() merges it (its default, not
 * safe_merge; huggingface/peft 5d602fdbff04c33c1c4de55cda9d4ae1d7cb7e40,
 * src/peft/tuners/lora/layer.py: Linear.get_delta_weight and Linear.merge): the delta
 * (B @ A) * scaling computed in fp32, cast back to lora_B's dtype when that is f16 or bf16 (its
 * CPU path), then added to W in place, the sum rounded once to W's dtype. (safe_merge instead
 * casts the delta to W's dtype first: a second rounding.) */
static void lora_merge_row(const ma_wref *r, int64_t k, int64_t cols, const float *la, float *lb, float *delta, float *row, void *tmp) {
    const int64_t R = r->lora_rank;
    ma_convert_to_f32(r->lora_dtype_b, r->lora_b, k * R, R, lb);
    for (int64_t c = 0; c < cols; c++) delta[c] = 0.0f;
    for (int64_t t = 0; t < R; t++) {
        const float bt = lb[t], *at = la + t * cols;
        for (int64_t c = 0; c < cols; c++) delta[c] += bt * at[c];
    }
    for (int64_t c = 0; c < cols; c++) delta[c] *= r->lora_scale;
    round_to(r->lora_dtype_b, delta, cols, tmp);
    for (int64_t c = 0; c < cols; c++) row[c] += delta[c];
    round_to(r->dtype, row, cols, tmp);
}

static ma_status fill_tensor(void *ctx, void *dst, size_t bytes, ma_error *err) {
    const fill_job *j = ctx;
    const ma_wref *r = j->r;
    int64_t rows = r->ndim == 1 ? 1 : r->shape[0], cols = r->ndim == 1 ? r->shape[0] : r->shape[1];
    const ma_weightset packed = {.panel_layout = 1};
    ma_wref out_ref = *r;
    out_ref.dtype = j->dt;
    const int pack = ma_ws_packed(&packed, &out_ref);
    if (pack && ma_panels_size(j->dt, rows, cols) != bytes) return ma_fail(err, MA_ERR_SHAPE, "%s: panel size", r->name);
    const int64_t R = r->has_lora ? r->lora_rank : 0;
    const size_t ncol = (size_t)(cols ? cols : 1);
    void *buf = pack ? malloc(bytes ? bytes : 1) : dst;
    float *row = malloc(sizeof(float) * ncol);
    float *la = R ? malloc(sizeof(float) * (size_t)R * ncol) : NULL, *lb = R ? malloc(sizeof(float) * (size_t)R) : NULL;
    float *delta = R ? malloc(sizeof(float) * ncol) : NULL, *tmp = R ? malloc(sizeof(float) * ncol) : NULL;
    ma_status s = MA_OK;
    if (!buf || !row || (R && (!la || !lb || !delta || !tmp))) s = ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", r->name);
    const size_t row_bytes = rows ? bytes / (size_t)rows : 0;
    size_t src_row = 0;
    const int64_t one[1] = {cols};
    if (ma_shape_nbytes(r->dtype, 1, one, &src_row, NULL)) src_row = 0;
    if (!s && R) ma_convert_to_f32(r->lora_dtype_a, r->lora_a, 0, R * cols, la);
    const float limit = stored_limit(j->dt);
    for (int64_t k = 0; k < rows && !s; k++) {
        ma_convert_to_f32(r->dtype, r->data, k * cols, cols, row);
        if (R) lora_merge_row(r, k, cols, la, lb, delta, row, tmp);
        for (int64_t c = 0; c < cols && j->wmax > 0 && pack && !s; c++) /* the panel layout: what the f16 tiles read */
            if (fabsf(row[c]) > j->wmax && isfinite(row[c]))
                s = ma_fail(err, MA_ERR_RANGE,
                            "%s: |w| = %g at [%lld, %lld], beyond the %g the f16 compute plan's f16 sums hold: compute it in fp32 with "
                            "--compute-keep '%s'",
                            r->name, (double)fabsf(row[c]), (long long)k, (long long)c, (double)j->wmax, r->name);
        /* every value stored must be finite: a broken adapter (NaN in lora_B, an absurd scaling),
         * a checkpoint's own NaN or Inf, or a value beyond what the stored type holds is refused */
        for (int64_t c = 0; c < cols && !s; c++)
            if (!(fabsf(row[c]) <= limit)) {
                float w0 = 0.0f;
                ma_convert_to_f32(r->dtype, r->data, k * cols + c, 1, &w0);
                if (R)
                    s = ma_fail(err, MA_ERR_RANGE,
                                "%s: the LoRA merge W + %g * lora_B @ lora_A gives %g at [%lld, %lld] (W %g, delta %g)%s: "
                                "the adapter or its lora_alpha is broken",
                                r->name, (double)r->lora_scale, (double)row[c], (long long)k, (long long)c, (double)w0, (double)delta[c],
                                isfinite(row[c]) ? ", beyond what the stored type holds" : "");
                else if (!isfinite(row[c]))
                    s = ma_fail(err, MA_ERR_RANGE, "%s: the checkpoint holds %g at [%lld, %lld]", r->name, (double)row[c], (long long)k,
                                (long long)c);
                else
                    s = ma_fail(err, MA_ERR_RANGE, "%s: %g at [%lld, %lld] is beyond what %s holds (|x| <= %g)%s", r->name, (double)row[c],
                                (long long)k, (long long)c, dtype_label(j->dt), (double)limit,
                                j->dt == MA_DT_BF16 ? "" : ": store this component in bf16");
            }
        if (s) break;
        ma_convert_from_f32(j->dt, row, cols, (uint8_t *)buf + (size_t)k * row_bytes);
        if (src_row && (k & 1023) == 1023) /* the source rows read so far leave this process */
            ma_mapfile_release((const uint8_t *)r->data + (size_t)(k - 1023) * src_row, 1024 * src_row);
    }
    free(la);
    free(lb);
    free(delta);
    free(tmp);
    if (!s && pack) ma_pack_panels(j->dt, buf, rows, cols, dst);
    if (pack) free(buf);
    free(row);
    if (s) return s;
    size_t src_bytes = 0;
    if (!ma_shape_nbytes(r->dtype, r->ndim, r->shape, &src_bytes, NULL)) ma_mapfile_release(r->data, src_bytes);
    ma_progress_add(&g_progress, ref_bytes(r), 1);
    return MA_OK;
}

/* --suffix names the files of the components it applies to (o->suffixed; all three when 0):
 * vision, llm_split0..3 and action_step (action_context keeps its name, as the reference
 * deployment's ACTION_CTX_SUFFIX selects action_step only) */
static const char *slot_suffix(const ma_compile_opts *o, int slot) {
    if (!o->suffix || !o->suffix[0] || slot == 1 || slot == 6) return "";
    const unsigned mask = o->suffixed ? o->suffixed : MA_COMPILE_SUFFIX_ALL;
    const unsigned bit = slot == 0 ? MA_COMPILE_SUFFIX_VISION : slot <= 5 ? MA_COMPILE_SUFFIX_LLM : MA_COMPILE_SUFFIX_ACTION;
    return (mask & bit) ? o->suffix : "";
}

/* compiling a suffixed variant into a directory that already holds this checkpoint's unsuffixed
 * file for a slot the suffix does not name: that file is kept (the variant is added beside the
 * set) when it is of this format, this checkpoint and this prompt length */
static int keep_existing(const char *out_dir, int slot, const ma_compile_opts *o, const char *fingerprint) {
    if (!o->suffix || !o->suffix[0] || slot_suffix(o, slot)[0]) return 0;
    char name[160];
    ma_context_name(slot, "", name, sizeof name);
    char *path = ma_path_join(out_dir, name);
    ma_gguf g;
    int keep = 0;
    if (path && ma_is_file(path) && ma_gguf_open(&g, path, NULL) == MA_OK) {
        int64_t fmt = 0, seq = -1;
        char fp[24] = "";
        ma_gguf_get_i64(&g, "molmoact.format", &fmt, NULL);
        ma_gguf_get_str(&g, "molmoact.source_fingerprint", fp, sizeof fp, NULL);
        if (slot >= 2 && ma_gguf_get_i64(&g, "molmoact.prompt_seq", &seq, NULL) != MA_OK) seq = -1;
        keep = fmt == MA_CONTEXT_FORMAT && !strcmp(fp, fingerprint) && (slot < 2 || seq == o->prompt_seq);
        ma_gguf_close(&g);
    }
    free(path);
    return keep;
}

/* name and a newline appended to the list b (a GGUF string of names, one per line) */
static ma_status append_line(ma_buf *b, const char *name, ma_error *err) {
    if (ma_buf_puts(b, name) || ma_buf_append(b, "\n", 1)) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
    return MA_OK;
}

static ma_status write_slot(const ma_model *m, int slot, const char *out_dir, const char *config_json, const char *fingerprint,
                            const char *compile_id, const char *prec, ma_dtype mat_type, const ma_compile_opts *o, ma_error *err) {
    ma_gguf_writer *w = ma_gguf_writer_new();
    if (!w) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
    fill_job *fills = calloc(m->ws.count + 1, sizeof *fills);
    ma_status s = fills ? MA_OK : ma_fail(err, MA_ERR_NOMEM, "out of memory");
    if (!s) s = ma_gguf_set_str(w, "general.architecture", "molmoact2", err);
    if (!s) s = ma_gguf_set_i64(w, "molmoact.format", MA_CONTEXT_FORMAT, err);
    if (!s) s = ma_gguf_set_str(w, "molmoact.component", ma_context_component(slot), err);
    if (!s) s = ma_gguf_set_str(w, "molmoact.precision", prec, err);
    if (!s && slot != 1) { /* what its matrices were in the checkpoint: bf16 contexts of f16 or f32 weights are rounded */
        int f32 = 0, f16 = 0, other = 0;
        for (size_t i = 0; i < m->ws.count; i++) {
            const ma_wref *r = &m->ws.refs[i];
            if (r->ndim != 2 || !slot_takes(m, slot, r)) continue;
            f32 |= r->dtype == MA_DT_F32, f16 |= r->dtype == MA_DT_F16,
                other |= r->dtype != MA_DT_BF16 && r->dtype != MA_DT_F32 && r->dtype != MA_DT_F16;
        }
        s = ma_gguf_set_str(w, "molmoact.source_dtype", f32 ? "f32" : f16 ? "f16" : other ? "other" : "bf16", err);
    }
    if (!s) s = ma_gguf_set_str(w, "molmoact.config_json", config_json, err);
    if (!s) s = ma_gguf_set_str(w, "molmoact.source_fingerprint", fingerprint, err);
    if (!s) s = ma_gguf_set_str(w, "molmoact.compile_id", compile_id, err);
    if (!s && slot >= 2 && slot <= 5) {
        s = ma_gguf_set_i64(w, "molmoact.layer_first", m->split_first[slot - 2], err);
        if (!s) s = ma_gguf_set_i64(w, "molmoact.layer_last", m->split_last[slot - 2], err);
    }
    /* the prompt length the static graphs of this context are built for (llm and action): a run
     * pads to it on the qnn backend; the cpu backend takes any length */
    if (!s && slot >= 2) s = ma_gguf_set_i64(w, "molmoact.prompt_seq", o->prompt_seq, err);
    if (!s && slot == 1) s = ma_gguf_set_i64(w, "molmoact.tokens_per_image", m->tokens_per_image, err);
    float *mods = NULL, *fins = NULL;
    if (!s && slot == 7) {
        /* the modulations depend only on t: evaluate them once for the flow timesteps, in f32 from
         * the checkpoint's weights, so the context needs neither time_embed nor modulation weights */
        const ma_config *c = &m->cfg;
        const int d = c->e_hidden, steps = c->flow_steps;
        mods = ma_malloc((size_t)steps * c->e_layers * 9 * d, sizeof(float), err, "modulation table");
        fins = ma_malloc((size_t)steps * 2 * d, sizeof(float), err, "modulation table");
        ma_kctx kc;
        ma_kctx_init(&kc);
        if (!mods || !fins) s = MA_ERR_NOMEM;
        for (int i = 0; i < steps && !s; i++)
            s = ma_expert_modulations(c, &m->expert, &kc, (float)((double)i / steps), mods + (size_t)i * c->e_layers * 9 * d,
                                      fins + (size_t)i * 2 * d, err);
        ma_kctx_free(&kc);
        int64_t ms[2] = {steps, (int64_t)c->e_layers * 9 * d}, fs[2] = {steps, 2 * d};
        if (!s) s = ma_gguf_add_tensor(w, "molmoact.step_modulations", MA_DT_F32, 2, ms, mods, err);
        if (!s) s = ma_gguf_add_tensor(w, "molmoact.final_modulations", MA_DT_F32, 2, fs, fins, err);
    }
    size_t n_fill = 0;
    ma_buf kept = {0}; /* names stored more precisely than the tag (--keep), one per line */
    for (size_t i = 0; i < m->ws.count && !s; i++) {
        const ma_wref *r = &m->ws.refs[i];
        if (!slot_takes(m, slot, r)) continue;
        ma_dtype dt = r->ndim == 1 ? MA_DT_F32 : mat_type;
        for (int k = 0; k < o->n_keep && r->ndim == 2; k++) {
            ma_dtype kt;
            if (!fnmatch(o->keep_pattern[k], r->name, 0) && parse_precision(o->keep_prec[k], &kt) &&
                precision_rank(kt) > precision_rank(dt))
                dt = kt;
        }
        int64_t cols = r->ndim == 1 ? r->shape[0] : r->shape[1];
        if ((dt == MA_DT_Q8_0 || dt == MA_DT_Q4_0) && cols % 32) dt = MA_DT_F16;
        if (r->ndim > 2) {
            s = ma_fail(err, MA_ERR_UNSUPPORTED, "tensor %s has %d dims", r->name, r->ndim);
            break;
        }
        if (r->ndim == 2 && dt != mat_type && !(dt == MA_DT_F16 && cols % 32) && (s = append_line(&kept, r->name, err))) break;
        /* converted when the file is written, one tensor in memory at a time */
        const int comp_f16 =
            slot != 1 && r->ndim == 2 && o->compute[ma_context_group(slot)] && !strcmp(o->compute[ma_context_group(slot)], "f16");
        int f16_keep = 0;
        for (int k = 0; k < o->n_compute_keep && comp_f16 && !f16_keep; k++) f16_keep = !fnmatch(o->compute_keep[k], r->name, 0);
        fills[n_fill] = (fill_job){r, dt, comp_f16 && !f16_keep && dt == MA_DT_F16 ? MA_GEMM_F16_WMAX : 0.0f};
        s = ma_gguf_add_tensor_fill(w, r->name, dt, r->ndim, r->shape, fill_tensor, &fills[n_fill], err);
        n_fill++;
    }
    if (!s && kept.data) s = ma_gguf_set_str(w, "molmoact.kept_tensors", kept.data, err);
    ma_buf_free(&kept);
    /* the compute plan (the embedding table's file has no products) */
    const int comp = ma_context_group(slot);
    const int bf16 = slot != 1 && o->compute[comp] && (!strcmp(o->compute[comp], "bf16") || !strcmp(o->compute[comp], "f16"));
    if (!s && slot != 1) s = ma_gguf_set_str(w, "molmoact.compute", bf16 ? o->compute[comp] : "fp32", err);
    ma_buf fp32 = {0}; /* --compute-keep: matrices of a bf16 or f16 component computed in fp32, one per line */
    for (size_t i = 0; i < m->ws.count && !s && bf16; i++) {
        const ma_wref *r = &m->ws.refs[i];
        if (!slot_takes(m, slot, r) || r->ndim != 2) continue;
        int keep = 0;
        for (int k = 0; k < o->n_compute_keep && !keep; k++) keep = !fnmatch(o->compute_keep[k], r->name, 0);
        if (keep) s = append_line(&fp32, r->name, err);
    }
    if (!s && fp32.data) s = ma_gguf_set_str(w, "molmoact.compute_fp32_tensors", fp32.data, err);
    ma_buf_free(&fp32);
    if (!s) {
        char name[160];
        ma_context_name(slot, slot_suffix(o, slot), name, sizeof name);
        char *path = ma_path_join(out_dir, name);
        s = path ? ma_gguf_write(w, path, err) : ma_fail(err, MA_ERR_NOMEM, "out of memory");
        free(path);
    }
    free(fills);
    free(mods);
    free(fins);
    ma_gguf_writer_free(w);
    return s;
}

/* ------------------------------------------------------------------------------ staging */

#define LOCK_NAME ".compile.lock" /* held (flock) by the compile that owns a staging directory */

/* remove a directory of regular files, with async-signal-safe calls only (it runs in the
 * signal handler too) */
static void remove_flat_dir(const char *dir) {
    const int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        char buf[4096];
        for (;;) {
            const long n = syscall(SYS_getdents64, fd, buf, sizeof buf);
            if (n <= 0) break;
            for (long off = 0; off < n;) {
                struct {
                    uint64_t ino;
                    int64_t off;
                    unsigned short reclen;
                    unsigned char type;
                    char name[];
                } *e = (void *)(buf + off);
                if (!(e->name[0] == '.' && (!e->name[1] || (e->name[1] == '.' && !e->name[2])))) unlinkat(fd, e->name, 0);
                off += e->reclen;
            }
        }
        close(fd);
    }
    rmdir(dir);
}

/* a compile interrupted by SIGINT, SIGTERM or SIGHUP removes its staging directory (gigabytes at
 * full size) before it dies; while the files are moved into place the signals wait */
static char g_staging[PATH_MAX];
static volatile sig_atomic_t g_have_staging;
static struct sigaction g_old[3];
static const int SIGS[3] = {SIGINT, SIGTERM, SIGHUP};

static void on_compile_signal(int sig) {
    if (g_have_staging) remove_flat_dir(g_staging);
    g_have_staging = 0;
    for (int i = 0; i < 3; i++)
        if (SIGS[i] == sig) sigaction(sig, &g_old[i], NULL);
    raise(sig);
}

static void signals_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_compile_signal;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 3; i++) sigaddset(&sa.sa_mask, SIGS[i]);
    for (int i = 0; i < 3; i++) sigaction(SIGS[i], &sa, &g_old[i]);
}

static void signals_restore(void) {
    for (int i = 0; i < 3; i++) sigaction(SIGS[i], &g_old[i], NULL);
}

static void signals_block(int block, sigset_t *old) {
    sigset_t set;
    sigemptyset(&set);
    for (int i = 0; i < 3; i++) sigaddset(&set, SIGS[i]);
    sigprocmask(block ? SIG_BLOCK : SIG_SETMASK, block ? &set : old, block ? old : NULL);
}

/* staging directories of compiles into out_dir that were killed (SIGKILL, a power cut): no
 * process holds their lock; removed, with a note */
static void remove_stale_staging(const char *out_dir, size_t ol) {
    char parent[PATH_MAX], base[NAME_MAX + 1];
    const char *slash = NULL;
    for (size_t i = 0; i < ol; i++)
        if (out_dir[i] == '/') slash = out_dir + i;
    if (slash) snprintf(parent, sizeof parent, "%.*s", (int)(slash - out_dir == 0 ? 1 : slash - out_dir), out_dir);
    else snprintf(parent, sizeof parent, ".");
    snprintf(base, sizeof base, "%.*s", (int)(slash ? ol - (size_t)(slash - out_dir) - 1 : ol), slash ? slash + 1 : out_dir);
    DIR *d = opendir(parent);
    if (!d) return;
    struct dirent *e;
    const size_t bl = strlen(base);
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, base, bl) || strncmp(e->d_name + bl, ".compile-", 9) || strlen(e->d_name + bl + 9) != 6) continue;
        char path[PATH_MAX], lock[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", parent, e->d_name);
        snprintf(lock, sizeof lock, "%s/%s", path, LOCK_NAME);
        struct stat st;
        if (lstat(path, &st) || !S_ISDIR(st.st_mode)) continue;
        const int fd = open(lock, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO planted here: not waited on */
        if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB)) {
            close(fd);
            continue;
        } /* a compile running now */
        /* only a directory of regular files, as compile leaves them */
        int flat = 1;
        DIR *sd = opendir(path);
        for (struct dirent *f; sd && (f = readdir(sd));) {
            if (!strcmp(f->d_name, ".") || !strcmp(f->d_name, "..")) continue;
            char fp[PATH_MAX];
            snprintf(fp, sizeof fp, "%s/%s", path, f->d_name);
            if (lstat(fp, &st) || !S_ISREG(st.st_mode)) flat = 0;
        }
        if (sd) closedir(sd);
        if (flat) {
            remove_flat_dir(path);
            fprintf(stderr, "molmoact compile: removed %s, left by an interrupted compile\n", path);
        }
        if (fd >= 0) close(fd);
    }
    closedir(d);
}

/* the manifest of out_dir after this compile: the existing one's entries for files that remain,
 * this compile's contexts and host files */
static ma_status build_manifest(const char *staging, const char *out_dir, int exists, const char *compile_id, ma_manifest *mf,
                                ma_error *err) {
    ma_manifest old;
    memset(mf, 0, sizeof *mf);
    if (exists && ma_manifest_load(out_dir, &old, NULL) == MA_OK)
        for (int i = 0; i < old.n; i++) {
            char *p = ma_path_join(out_dir, old.e[i].name);
            if (p && ma_is_file(p)) ma_manifest_put(mf, &old.e[i], NULL);
            free(p);
        }
    DIR *d = opendir(staging);
    if (!d) return ma_fail(err, MA_ERR_IO, "%s: cannot read: %s", staging, strerror(errno));
    ma_status s = MA_OK;
    for (struct dirent *e; !s && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        ma_manifest_entry me;
        memset(&me, 0, sizeof me);
        snprintf(me.name, sizeof me.name, "%s", e->d_name);
        char *p = ma_path_join(staging, e->d_name);
        struct stat st;
        if (!p || stat(p, &st)) s = ma_fail(err, MA_ERR_IO, "%s: cannot stat", e->d_name);
        else {
            const size_t nl = strlen(e->d_name);
            me.bytes = (uint64_t)st.st_size;
            if (nl > 5 && !strcmp(e->d_name + nl - 5, ".gguf")) snprintf(me.compile_id, sizeof me.compile_id, "%s", compile_id);
            else s = ma_manifest_hash_file(p, me.fnv64, &me.bytes, err);
            if (!s) s = ma_manifest_put(mf, &me, err);
        }
        free(p);
    }
    closedir(d);
    return s;
}

/* move the files of the staging directory into out_dir (which exists), the manifest last */
static ma_status publish_staging(const char *staging, const char *out_dir, ma_error *err) {
    DIR *d = opendir(staging);
    if (!d) return ma_fail(err, MA_ERR_IO, "%s: cannot read: %s", staging, strerror(errno));
    ma_status s = MA_OK;
    struct dirent *e;
    for (int pass = 0; pass < 2 && !s; pass++) {
        rewinddir(d);
        while (!s && (e = readdir(d))) {
            if (e->d_name[0] == '.' || (strcmp(e->d_name, MA_MANIFEST_FILE) != 0) == pass) continue;
            char *from = ma_path_join(staging, e->d_name), *to = ma_path_join(out_dir, e->d_name);
            if (!from || !to) s = ma_fail(err, MA_ERR_NOMEM, "out of memory");
            else if (rename(from, to) != 0) s = ma_fail(err, MA_ERR_IO, "%s: cannot write: %s", to, strerror(errno));
            free(from);
            free(to);
        }
    }
    closedir(d);
    return s;
}

/* is `path` (which need not exist yet) the directory `dir` (1) or inside it (2)? Its longest existing
 * part is made canonical (symlinks followed), then it and each of its ancestors is compared with
 * dir by device and inode (a bind mount of dir is dir too). An output that only contains the
 * source (compile ./model -o .) writes beside it, not into it, and is not refused. */
static int path_within(const char *path, const char *dir) {
    struct stat ds, st;
    char buf[PATH_MAX], real[PATH_MAX];
    if (stat(dir, &ds) || strlen(path) >= sizeof buf) return 0;
    snprintf(buf, sizeof buf, "%s", path);
    int below = 0; /* components of path that do not exist yet */
    for (;; below++) {
        size_t l = strlen(buf);
        while (l > 1 && buf[l - 1] == '/') buf[--l] = '\0';
        if (!stat(buf, &st)) break;
        char *slash = strrchr(buf, '/');
        if (!slash) snprintf(buf, sizeof buf, ".");
        else if (slash == buf) buf[1] = '\0';
        else *slash = '\0';
    }
    if (!realpath(buf, real)) return 0;
    for (int up = 0;; up++) {
        if (!stat(real, &st) && st.st_dev == ds.st_dev && st.st_ino == ds.st_ino) return up || below ? 2 : 1;
        char *slash = strrchr(real, '/');
        if (!slash || !strcmp(real, "/")) return 0;
        if (slash == real) real[1] = '\0';
        else *slash = '\0';
    }
}

static ma_status check_not_within(const char *out_dir, const char *dir, const char *what, ma_error *err) {
    const int w = path_within(out_dir, dir);
    if (!w) return MA_OK;
    return ma_fail(err, MA_ERR_ARG, "-o %s is %s%s %s: compile would write its contexts into it; give an output directory outside it",
                   out_dir, w == 1 ? "" : "inside ", what, dir);
}

/* every --keep and --compute-keep pattern must match a matrix it can act on: a pattern that
 * matches nothing (a typo, a name as another tool spells it) is refused by name rather than
 * compiling a plan the user did not ask for */
static ma_status check_patterns(const ma_model *m, const ma_compile_opts *o, const char *hf_dir, ma_error *err) {
    for (int k = 0; k < o->n_keep + o->n_compute_keep; k++) {
        const int is_keep = k < o->n_keep;
        const char *pat = is_keep ? o->keep_pattern[k] : o->compute_keep[k - o->n_keep];
        const char *tags[3] = {o->vision, o->llm, o->action};
        ma_dtype kt = MA_DT_F16;
        if (is_keep) parse_precision(o->keep_prec[k], &kt);
        int hit = 0;
        size_t raised = 0; /* --keep: the matrices it stores more precisely than their component's tag */
        const char *first = NULL;
        for (size_t i = 0; i < m->ws.count && (!hit || is_keep); i++) {
            const ma_wref *r = &m->ws.refs[i];
            if (r->ndim != 2 || fnmatch(pat, r->name, 0)) continue;
            for (int slot = 0; slot < 8; slot++) {
                if (!slot_takes(m, slot, r)) continue;
                const int comp = ma_context_group(slot);
                ma_dtype base = MA_DT_F16;
                if (is_keep && parse_precision(tags[comp], &base) && precision_rank(kt) > precision_rank(base) && !raised++)
                    first = r->name;
                hit |=
                    is_keep || (slot != 1 && o->compute[comp] && (!strcmp(o->compute[comp], "bf16") || !strcmp(o->compute[comp], "f16")));
                break;
            }
        }
        /* each override reported, as llama.cpp's quantize does (and what it leaves as it was) */
        if (hit && is_keep && !ma_progress_quiet())
            fprintf(stderr, "molmoact compile: --keep %s=%s: %zu matri%s stored in %s%s%s%s\n", pat, o->keep_prec[k], raised,
                    raised == 1 ? "x" : "ces", o->keep_prec[k], first ? " (first: " : " (the pattern's matrices are that precise already)",
                    first ? first : "", first ? ")" : "");
        if (hit) continue;
        if (is_keep)
            return ma_fail(err, MA_ERR_ARG, "--keep %s=%s: the pattern matches no matrix of %s (`molmoact inspect %s` lists their names)",
                           pat, o->keep_prec[k], hf_dir, hf_dir);
        return ma_fail(err, MA_ERR_ARG,
                       "--compute-keep %s: the pattern matches no matrix of a component computed in bf16 or f16 (--compute) in %s "
                       "(`molmoact inspect %s` lists their names)",
                       pat, hf_dir, hf_dir);
    }
    return MA_OK;
}

/* the compile's id (molmoact.compile_id, the manifest's compile_id): derived from what the
 * contexts are made of, so compiling the same input with the same options gives the same bytes,
 * while files of compiles of different inputs or options carry different ids and are not taken
 * for one set. It hashes this program's version and context format, the kernel set (the step
 * modulation table is computed with it, so its last bits follow the CPU), the checkpoint's fingerprint
 * (every tensor's name, dtype, shape and bytes, the LoRA adapters' included), the config the
 * contexts embed, the source's own config.json (a LeRobot policy's LoRA settings), the
 * statistics written, and every option (64-bit FNV-1a over length-prefixed fields). */
static void id_field(uint64_t *h, const char *s) {
    const uint64_t n = s ? (uint64_t)strlen(s) : UINT64_MAX;
    *h = ma_fnv1a64(*h, &n, sizeof n);
    if (s) *h = ma_fnv1a64(*h, s, strlen(s));
}

static void derive_compile_id(const char *fingerprint, const char *config_json, const char *src_config, const char *stats,
                              const ma_compile_opts *o, char out[17]) {
    uint64_t h = MA_FNV_OFFSET;
    char num[64];
    id_field(&h, "molmoact compile " MOLMOACT_VERSION);
    id_field(&h, ma_gemm_kernels());
    /* a kernel set asked for by name: scalar, and the vector math's set, follow it too */
    id_field(&h, o->settings && o->settings->kernels[0] ? o->settings->kernels : NULL);
    snprintf(num, sizeof num, "format %d prompt_seq %d suffixed %u keep %d compute_keep %d", MA_CONTEXT_FORMAT, o->prompt_seq, o->suffixed,
             o->n_keep, o->n_compute_keep);
    id_field(&h, num);
    id_field(&h, fingerprint);
    id_field(&h, config_json);
    id_field(&h, src_config);
    id_field(&h, stats);
    id_field(&h, o->vision);
    id_field(&h, o->llm);
    id_field(&h, o->action);
    id_field(&h, o->suffix ? o->suffix : "");
    for (int c = 0; c < 3; c++) id_field(&h, o->compute[c] ? o->compute[c] : "fp32");
    for (int k = 0; k < o->n_keep; k++) {
        id_field(&h, o->keep_pattern[k]);
        id_field(&h, o->keep_prec[k]);
    }
    for (int k = 0; k < o->n_compute_keep; k++) id_field(&h, o->compute_keep[k]);
    snprintf(out, 17, "%016llx", (unsigned long long)h);
}

ma_status ma_compile(const char *hf_dir, const char *out_dir, const ma_compile_opts *o, ma_error *err) {
    ma_dtype tv, tl, ta;
    if (!parse_precision(o->vision, &tv))
        return ma_fail(err, MA_ERR_ARG, "--vision %s: precision must be f16, bf16, q8_0 or q4_0", o->vision);
    if (!parse_precision(o->llm, &tl)) return ma_fail(err, MA_ERR_ARG, "--llm %s: precision must be f16, bf16, q8_0 or q4_0", o->llm);
    if (!parse_precision(o->action, &ta))
        return ma_fail(err, MA_ERR_ARG, "--action %s: precision must be f16, bf16, q8_0 or q4_0", o->action);
    for (int k = 0; k < o->n_keep; k++) {
        ma_dtype kt;
        if (!o->keep_pattern[k][0] || !parse_precision(o->keep_prec[k], &kt))
            return ma_fail(err, MA_ERR_ARG, "--keep %s=%s: must be PATTERN=P, P one of f16, bf16, q8_0, q4_0", o->keep_pattern[k],
                           o->keep_prec[k]);
    }
    for (int c = 0; c < 3; c++)
        if (o->compute[c] && strcmp(o->compute[c], "fp32") && strcmp(o->compute[c], "bf16") && strcmp(o->compute[c], "f16"))
            return ma_fail(err, MA_ERR_ARG, "--compute: %s's plan %s (fp32, bf16 or f16)",
                           c == 0   ? "vision"
                           : c == 1 ? "llm"
                                    : "action",
                           o->compute[c]);
    for (int c = 0; c < 3; c++) { /* the f16 tiles multiply f16 weights: another storage would not run them */
        const char *tag = c == 0 ? o->vision : c == 1 ? o->llm : o->action, *name = c == 0 ? "vision" : c == 1 ? "llm" : "action";
        if (o->compute[c] && !strcmp(o->compute[c], "f16") && tag && strcmp(tag, "f16"))
            return ma_fail(err, MA_ERR_ARG,
                           "--compute f16: %s is stored as %s, and the f16 plan multiplies f16 weights (give it to the f16 components "
                           "only, e.g. --compute vision=f16)",
                           name, tag);
    }
    for (int k = 0; k < o->n_compute_keep; k++)
        if (!o->compute_keep[k][0]) return ma_fail(err, MA_ERR_ARG, "--compute-keep: an empty pattern");
    if (o->prompt_seq < 1 || o->prompt_seq > MA_MAX_PROMPT_SEQ)
        return ma_fail(err, MA_ERR_ARG, "--prompt-seq %d: must be in [1, %d]", o->prompt_seq, MA_MAX_PROMPT_SEQ);
    if (o->suffix && (strchr(o->suffix, '/') || strlen(o->suffix) > 64 || !strcmp(o->suffix, ".") || !strcmp(o->suffix, "..")))
        return ma_fail(err, MA_ERR_ARG, "--suffix %s: at most 64 characters, no '/'", o->suffix);
    if (!out_dir[0]) return ma_fail(err, MA_ERR_ARG, "-o: empty output directory");
    if (ma_is_context_dir(hf_dir)) return ma_fail(err, MA_ERR_ARG, "%s is already a context directory", hf_dir);
    ma_status s = check_not_within(out_dir, hf_dir, "the source directory", err);
    if (s) return s;
    struct stat st;
    const int exists = stat(out_dir, &st) == 0;
    if (exists && !S_ISDIR(st.st_mode)) return ma_fail(err, MA_ERR_IO, "%s: exists and is not a directory", out_dir);
    ma_model m;
    s = ma_model_open_with(hf_dir, "libero", MA_PART_ALL | MA_PART_LORA_OK, o->settings, &m, err);
    if (s) return s;
    /* a LeRobot policy's base is a source too: its config and tokenizer are read */
    if (m.host_dir && (s = check_not_within(out_dir, m.host_dir, "the policy's base directory", err))) {
        ma_model_close(&m);
        return s;
    }
    if ((s = check_patterns(&m, o, hf_dir, err))) {
        ma_model_close(&m);
        return s;
    }
    /* the time embedding and adaLN modulations are evaluated here for the table of step
     * modulations: from merged weights only */
    for (size_t i = 0; i < m.ws.count; i++)
        if (m.ws.refs[i].has_lora && !strncmp(m.ws.refs[i].name, "model.action_expert.", 20) &&
            (strstr(m.ws.refs[i].name, "modulation") || strstr(m.ws.refs[i].name, "time_embed"))) {
            s = ma_fail(err, MA_ERR_UNSUPPORTED,
                        "%s: %s carries a LoRA adapter: merge the action expert's adapters first (PEFT merge_and_unload)", hf_dir,
                        m.ws.refs[i].name);
            ma_model_close(&m);
            return s;
        }
    /* what the contexts are made of: the config they embed (for a LeRobot policy, the HF config
     * as LeRobot runs it, and its statistics), the checkpoint's fingerprint; the compile's id
     * derived from them and the options */
    char fingerprint[17] = "", compile_id[17] = "";
    char *config_json = NULL, *lr_stats = NULL, *src_config = NULL;
    ma_lerobot *lr = NULL;
    char *cfg_path = ma_path_join(hf_dir, "config.json");
    s = cfg_path ? ma_read_file(cfg_path, 16u << 20, &src_config, NULL, err) : ma_fail(err, MA_ERR_NOMEM, "out of memory");
    free(cfg_path);
    if (!s && m.lerobot) {
        lr = calloc(1, sizeof *lr);
        s = lr ? ma_lerobot_open(hf_dir, m.set.base_dir, m.set.hub_cache, lr, err) : ma_fail(err, MA_ERR_NOMEM, "out of memory");
        if (!s) s = ma_lerobot_config_json(lr, &config_json, err);
        if (!s) s = ma_lerobot_norm_stats_json(lr, "lerobot", &lr_stats, err);
    } else if (!s && !(config_json = strdup(src_config))) s = ma_fail(err, MA_ERR_NOMEM, "out of memory");
    if (!s) s = ma_checkpoint_fingerprint(&m.st, fingerprint, err);
    if (!s) derive_compile_id(fingerprint, config_json, src_config, lr_stats, o, compile_id);
    free(src_config);
    if (s) {
        free(config_json);
        free(lr_stats);
        free(lr);
        ma_model_close(&m);
        return s;
    }
    /* everything is written into a staging directory beside out_dir and moved there only when
     * every file is complete: a failed compile leaves nothing new behind */
    size_t ol = strlen(out_dir);
    while (ol > 1 && out_dir[ol - 1] == '/') ol--;
    char *staging = malloc(ol + 32);
    if (staging) {
        /* the directories above out_dir, as mkdir -p makes them (compile -o ~/models/libero) */
        snprintf(staging, ol + 32, "%.*s", (int)ol, out_dir);
        for (char *p = staging + 1; *p; p++)
            if (*p == '/' && p[1]) {
                *p = '\0';
                mkdir(staging, 0777); /* an existing one is fine; a failure shows in mkdtemp below */
                *p = '/';
            }
        snprintf(staging, ol + 32, "%.*s.compile-XXXXXX", (int)ol, out_dir);
        remove_stale_staging(out_dir, ol);
    }
    if (!staging || ol + 32 > sizeof g_staging || !mkdtemp(staging)) {
        s = staging ? ma_fail(err, MA_ERR_IO, "%.*s: cannot create a directory beside it: %s", (int)ol, out_dir, strerror(errno))
                    : ma_fail(err, MA_ERR_NOMEM, "out of memory");
        free(staging);
        free(config_json);
        free(lr_stats);
        free(lr);
        ma_model_close(&m);
        return s;
    }
    snprintf(g_staging, sizeof g_staging, "%s", staging);
    g_have_staging = 1;
    signals_install();
    int lock_fd = -1;
    char *lock = ma_path_join(staging, LOCK_NAME);
    if (lock) lock_fd = open(lock, O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0600);
    if (lock_fd >= 0) flock(lock_fd, LOCK_EX);
    free(lock);
    const char *precs[8] = {o->vision, "f16", o->llm, o->llm, o->llm, o->llm, o->action, o->action};
    /* the host embedding table stays f16 (bf16 when the LLM is bf16): a lookup reads one row */
    ma_dtype types[8] = {tv, tl == MA_DT_BF16 ? MA_DT_BF16 : MA_DT_F16, tl, tl, tl, tl, ta, ta};
    precs[1] = tl == MA_DT_BF16 ? "bf16" : "f16";
    int keep[8] = {0};
    uint64_t total_bytes = 0, total_tensors = 0;
    for (int slot = 0; slot < 8 && !s; slot++) {
        keep[slot] = exists && keep_existing(out_dir, slot, o, fingerprint);
        for (size_t i = 0; i < m.ws.count && !keep[slot]; i++)
            if (slot_takes(&m, slot, &m.ws.refs[i])) {
                total_bytes += ref_bytes(&m.ws.refs[i]);
                total_tensors++;
            }
    }
    if (!s) ma_progress_begin(&g_progress, "compile", total_bytes, total_tensors, "tensors");
    for (int slot = 0; slot < 8 && !s; slot++)
        if (!keep[slot]) s = write_slot(&m, slot, staging, config_json, fingerprint, compile_id, precs[slot], types[slot], o, err);
    if (g_progress.mode || !s) ma_progress_end(&g_progress, !s);
    if (lr) { /* config.json and norm_stats.json written, the tokenizer and processor from the base */
        char *p1 = ma_path_join(staging, "config.json"), *p2 = ma_path_join(staging, "norm_stats.json");
        if (!s) s = p1 ? ma_write_file(p1, config_json, strlen(config_json), err) : MA_ERR_NOMEM;
        if (!s) s = p2 ? ma_write_file(p2, lr_stats, strlen(lr_stats), err) : MA_ERR_NOMEM;
        free(p1);
        free(p2);
        if (!s) s = copy_host_file(lr->base_dir, staging, "tokenizer.json", 1, err);
        if (!s) s = copy_host_file(lr->base_dir, staging, "processor_config.json", 0, err);
    } else {
        const char *host[] = {m.cfg.norm_stats_filename, "tokenizer.json", "processor_config.json", "config.json"};
        for (int i = 0; i < 4 && !s; i++) s = copy_host_file(hf_dir, staging, host[i], i == 0, err);
    }
    free(lr_stats);
    free(lr);
    if (!s && !exists) { /* mkdtemp made it 0700: the mode mkdir would have given */
        mode_t um = umask(022);
        umask(um);
        chmod(staging, 0777 & ~um);
    }
    ma_manifest mf;
    if (!s) s = build_manifest(staging, out_dir, exists, compile_id, &mf, err);
    if (!s) {
        char *mp = ma_path_join(staging, MA_MANIFEST_FILE);
        s = mp ? ma_manifest_write(mp, &mf, err) : ma_fail(err, MA_ERR_NOMEM, "out of memory");
        free(mp);
    }
    if (!s) {
        /* publishing: a new directory appears whole (one rename); into an existing one the files
         * move in, the manifest last, with the signals held until it is done */
        sigset_t old;
        signals_block(1, &old);
        if (!exists) {
            char *lk = ma_path_join(staging, LOCK_NAME);
            if (lk) unlink(lk);
            free(lk);
        }
        if (!exists && rename(staging, out_dir) != 0 && !(errno == EEXIST || errno == ENOTEMPTY))
            s = ma_fail(err, MA_ERR_IO, "%s: cannot create: %s", out_dir, strerror(errno));
        else if (exists || ma_is_dir(staging)) s = publish_staging(staging, out_dir, err);
        if (!ma_is_dir(staging)) g_have_staging = 0;
        signals_block(0, &old);
    }
    if (ma_is_dir(staging)) remove_flat_dir(staging);
    g_have_staging = 0;
    signals_restore();
    if (lock_fd >= 0) close(lock_fd);
    free(staging);
    free(config_json);
    ma_model_close(&m);
    return s;
}
