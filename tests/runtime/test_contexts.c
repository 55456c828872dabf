/* SPDX-License-Identifier: Apache-2.0 */
/* GGUF contexts: compile, open (suffixes, prompt length), parity equal to the checkpoint's in
 * f16, documented gates in q8_0 / q4_0, refusal of corrupt or mismatched contexts. */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE
#include "../test_util.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "kernels/gemm.h"

#include "io/npz.h"
#include "backend/cpu/cpu.h"
#include "runtime/compile.h"
#include "runtime/parity.h"
#include "runtime/pipeline.h"

#define TINY MA_SOURCE_DIR "/assets/tiny-grid/model"
#define TINY_GOLDEN MA_SOURCE_DIR "/assets/tiny-grid/golden"

static void compile(const char *src, const char *dir, const char *v, const char *l, const char *a, const char *suffix) {
    ma_compile_opts o = {.vision = v, .llm = l, .action = a, .suffix = suffix, .prompt_seq = 128};
    ma_error err = {0};
    if (ma_compile(src, dir, &o, &err)) fail_msg("compile: %s", err.msg);
}

/* the demo observation's actions through a model */
static void actions_of(const char *model_dir, float *out70) {
    ma_model m;
    ma_error err = {0};
    if (ma_model_open(model_dir, "libero", &m, &err)) fail_msg("%s", err.msg);
    ma_npz v, st;
    assert_int_equal(ma_npz_read(TINY_GOLDEN "/vision_io.npz", &v, &err), MA_OK);
    assert_int_equal(ma_npz_read(TINY_GOLDEN "/step0_boundary.npz", &st, &err), MA_OK);
    const ma_tensor *px = ma_npz_get(&v, "pixels"), *ids = ma_npz_get(&st, "input_ids"), *nz = ma_npz_get(&st, "noise");
    ma_runner r;
    assert_int_equal(ma_runner_open(&ma_cpu_backend, &m, &r, &err), MA_OK);
    ma_obs obs = {px->data, 2, ids->data, ids->shape[0], nz->data, 0, 0, {0}};
    ma_result res;
    if (ma_runner_run(&r, &obs, &res, NULL, &err)) fail_msg("%s", err.msg);
    memcpy(out70, res.actions, sizeof(float) * 70);
    ma_result_free(&res);
    ma_runner_close(&r);
    ma_npz_free(&v);
    ma_npz_free(&st);
    ma_model_close(&m);
}

static void test_f16_contexts_equal_checkpoint(void **state) {
    (void)state;
    char dir[1024];
    tu_tmpdir(dir, sizeof dir, "ctx-f16");
    compile(TINY, dir, "f16", "f16", "f16", "");
    float a[70], b[70];
    /* same stored weights: with kernels that treat both layouts alike, bit-identical (avx2 on
     * x86). On aarch64 there is none: the neon sets read panels directly, and the portable C's
     * two loops do not give the same bits there either (measured under qemu: 25 of the 280
     * bytes differ). There the portable set, like the best, agrees to rounding. */
    int alike = 0;
    for (int i = 1; i < ma_gemm_kernel_count(); i++)
        if (!ma_gemm_kernel_small_panels(i)) alike = i;
    if (alike > 0) {
        assert_true(ma_gemm_select(alike));
        actions_of(TINY, a);
        actions_of(dir, b);
        assert_memory_equal(a, b, sizeof a);
    } else {
        assert_true(ma_gemm_select(0));
        actions_of(TINY, a);
        actions_of(dir, b);
        for (int i = 0; i < 70; i++) assert_true(fabsf(a[i] - b[i]) <= 1e-5f * (1.0f + fabsf(a[i])));
    }
    /* the best kernels read panel-layout weights of the 10-token expert directly (another
     * summation order): equal to rounding */
    ma_gemm_select_portable(0);
    actions_of(TINY, a);
    actions_of(dir, b);
    for (int i = 0; i < 70; i++) assert_true(fabsf(a[i] - b[i]) <= 1e-5f * (1.0f + fabsf(a[i])));
    ma_model m;
    ma_error err = {0};
    assert_int_equal(ma_model_open(dir, "libero", &m, &err), MA_OK);
    assert_true(m.from_contexts);
    assert_string_equal(m.precision[1], "f16");
    ma_parity_report rep;
    assert_int_equal(ma_parity_run(&ma_cpu_backend, &m, TINY_GOLDEN, 0.9999, &rep, &err), MA_OK);
    assert_true(rep.pass);
    ma_parity_free(&rep);
    ma_model_close(&m);
    tu_rmdir(dir);
}

static void gate(const char *src, const char *golden, const char *prec, double threshold) {
    char dir[1024];
    tu_tmpdir(dir, sizeof dir, prec);
    compile(src, dir, prec, prec, prec, "");
    ma_model m;
    ma_error err = {0};
    assert_int_equal(ma_model_open(dir, "libero", &m, &err), MA_OK);
    int e2e;
    double g = ma_parity_default_gate(&m, &e2e);
    assert_true(e2e && g == threshold);
    ma_parity_report rep;
    assert_int_equal(ma_parity_run_e2e(&ma_cpu_backend, &m, golden, g, &rep, &err), MA_OK);
    printf("  %-52s %-5s end-to-end action cosine %.6f (gate %.3g)\n", src, prec, rep.action_cosine, g);
    if (!rep.pass) {
        ma_parity_print(&rep, stderr, 0);
        fail_msg("%s %s below its gate", src, prec);
    }
    ma_parity_free(&rep);
    ma_model_close(&m);
    tu_rmdir(dir);
}

static void test_quantised_gates(void **state) {
    (void)state;
    gate(TINY, TINY_GOLDEN, "q8_0", 0.999);
    gate(TINY, TINY_GOLDEN, "q4_0", 0.99);
    gate(MA_SOURCE_DIR "/assets/tiny-original/model", MA_SOURCE_DIR "/assets/tiny-original/golden", "q8_0", 0.999);
    gate(MA_SOURCE_DIR "/assets/tiny-original/model", MA_SOURCE_DIR "/assets/tiny-original/golden", "q4_0", 0.99);
    const char *root = getenv("MOLMOACT_TEST_GOLDENS");
    char bm[1200], bg[1200];
    if (root && !getenv("MOLMOACT_SKIP_BENCH_CONTEXTS")) { /* the sanitizer run skips the slow bench compile */
        snprintf(bm, sizeof bm, "%s/bench-grid/model", root);
        snprintf(bg, sizeof bg, "%s/bench-grid/golden", root);
        if (ma_is_dir(bm)) {
            gate(bm, bg, "q8_0", 0.999);
            gate(bm, bg, "q4_0", 0.99);
        }
    }
}

/* compile --keep: matching matrices stored at the higher precision, listed in the context, and
 * accepted by the open check; an unlisted deviation is still refused */
static void test_keep_tensors_at_higher_precision(void **state) {
    (void)state;
    char dir[1024];
    tu_tmpdir(dir, sizeof dir, "ctx-keep");
    ma_compile_opts o = {.vision = "q4_0",
                         .llm = "q4_0",
                         .action = "q4_0",
                         .suffix = "",
                         .prompt_seq = 128,
                         .n_keep = 2,
                         .keep_pattern = {"*.ff_out.*", "*scout_mlp*"},
                         .keep_prec = {"q8_0", "f16"}};
    ma_error err = {0};
    if (ma_compile(TINY, dir, &o, &err)) fail_msg("compile: %s", err.msg);
    ma_model m;
    if (ma_model_open(dir, "libero", &m, &err)) fail_msg("%s", err.msg);
    const ma_gguf_tensor *t = ma_gguf_find_tensor(&m.ctx[2], "model.transformer.blocks.0.mlp.ff_out.weight");
    assert_non_null(t);
    assert_int_equal(t->dtype, MA_DT_Q8_0);
    const ma_gguf_tensor *a = ma_gguf_find_tensor(&m.ctx[2], "model.transformer.blocks.0.self_attn.att_proj.weight");
    assert_non_null(a);
    assert_int_equal(a->dtype, MA_DT_Q4_0);
    ma_model_close(&m);
    /* a lower precision than the tag is never taken, and a bad --keep is refused */
    o.keep_prec[0] = "q4_0";
    o.vision = o.llm = o.action = "q8_0";
    if (ma_compile(TINY, dir, &o, &err)) fail_msg("compile: %s", err.msg);
    if (ma_model_open(dir, "libero", &m, &err)) fail_msg("%s", err.msg);
    t = ma_gguf_find_tensor(&m.ctx[2], "model.transformer.blocks.0.mlp.ff_out.weight");
    assert_int_equal(t->dtype, MA_DT_Q8_0);
    ma_model_close(&m);
    o.keep_prec[0] = "q3_k";
    assert_fails_naming(ma_compile(TINY, dir, &o, &err), err, "--keep *.ff_out.*=q3_k");
    tu_rmdir(dir);
}

/* compile --compute / --compute-keep: each component's plan recorded and bound to its matrices
 * (the kept ones fp32), MOLMOACT_COMPUTE overriding it or refused by name, the parity gate held
 * with the plan, an unknown plan in a context refused by name */
static void test_compute_plan(void **state) {
    (void)state;
    char dir[1024];
    tu_tmpdir(dir, sizeof dir, "ctx-compute");
    ma_compile_opts o = {.vision = "f16",
                         .llm = "f16",
                         .action = "f16",
                         .suffix = "",
                         .prompt_seq = 128,
                         .compute = {"bf16", "fp32", "bf16"},
                         .n_compute_keep = 1,
                         .compute_keep = {"*scout*"}};
    ma_error err = {0};
    if (ma_compile(TINY, dir, &o, &err)) fail_msg("compile: %s", err.msg);
    ma_model m;
    ma_settings st;
    ma_settings_init(&st);
    if (ma_model_open(dir, "libero", &m, &err)) fail_msg("%s", err.msg);
    assert_string_equal(m.compute[0], "bf16");
    assert_string_equal(m.compute[1], "fp32");
    assert_string_equal(m.compute[2], "bf16");
    assert_int_equal(m.vision.blocks[0].attn.wq.compute, MA_COMPUTE_BF16);
    assert_int_equal(m.vision.blocks[0].w2.compute, MA_COMPUTE_BF16);
    assert_int_equal(m.vision.sampler.scout0.compute, MA_COMPUTE_F32); /* --compute-keep */
    assert_int_equal(m.llm[0].layers[0].ff_out.compute, MA_COMPUTE_F32);
    assert_int_equal(m.expert.blocks[0].qkv.compute, MA_COMPUTE_BF16);
    ma_model_close(&m);
    /* the settings' plan overrides every matrix, and a value it does not know is refused */
    assert_int_equal(ma_settings_set(&st, "compute", "fp32", "MOLMOACT_COMPUTE", &err), MA_OK);
    if (ma_model_open_with(dir, "libero", MA_PART_ALL, &st, &m, &err)) fail_msg("%s", err.msg);
    assert_int_equal(m.vision.blocks[0].attn.wq.compute, MA_COMPUTE_F32);
    ma_model_close(&m);
    assert_int_equal(ma_settings_set(&st, "compute", "bf16", "MOLMOACT_COMPUTE", &err), MA_OK);
    if (ma_model_open_with(dir, "libero", MA_PART_ALL, &st, &m, &err)) fail_msg("%s", err.msg);
    assert_int_equal(m.llm[0].layers[0].ff_out.compute, MA_COMPUTE_BF16);
    assert_int_equal(m.vision.sampler.scout0.compute, MA_COMPUTE_BF16);
    /* bf16 everywhere (where this CPU has a bf16 unit): the gate it gets, held */
    int e2e = 0;
    const double g = ma_parity_default_gate(&m, &e2e);
    if (ma_gemm_bf16() == MA_COMPUTE_BF16) {
        assert_true(g <= 0.999 + 1e-12);
        assert_int_equal(e2e, 1);
    }
    /* held as `molmoact parity` holds it: a reduced plan end to end only (with random weights the
     * Grid Sampler's steep coordinates can take the vision row below 0.999 on one bf16 unit and
     * not on another: 0.99897 on VDPBF16PS, above 0.999 on AMX) */
    ma_parity_report rep;
    if ((e2e ? ma_parity_run_e2e : ma_parity_run)(&ma_cpu_backend, &m, TINY_GOLDEN, g, &rep, &err)) fail_msg("%s", err.msg);
    if (!rep.pass) {
        for (size_t i = 0; i < rep.n; i++)
            if (!rep.rows[i].pass) printf("  below the gate: %s %s %.9f\n", rep.rows[i].session, rep.rows[i].tensor, rep.rows[i].c.cosine);
        fail_msg("bf16 compute (%s): action cosine %.9f, gate %.4g%s", ma_gemm_bf16_unit(), rep.action_cosine, g, e2e ? " end to end" : "");
    }
    ma_parity_free(&rep);
    ma_model_close(&m);
    assert_fails_naming(ma_settings_set(&st, "compute", "fp16", "MOLMOACT_COMPUTE", &err), err, "MOLMOACT_COMPUTE=fp16");
    /* a bad plan to compile, and a context whose plan this build does not know */
    o.compute[1] = "int4";
    char dir2[1024];
    tu_tmpdir(dir2, sizeof dir2, "ctx-compute-bad");
    assert_fails_naming(ma_compile(TINY, dir2, &o, &err), err, "llm's plan int4");
    char path[1200];
    snprintf(path, sizeof path, "%s/vision.gguf", dir);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    char *buf = malloc((size_t)n);
    fseek(f, 0, SEEK_SET);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    const char key[] = "molmoact.compute";
    long at = -1;
    for (long i = 0; i + (long)sizeof key + 16 < n && at < 0; i++)
        if (!memcmp(buf + i, key, sizeof key - 1) && !memcmp(buf + i + sizeof key - 1 + 12, "bf16", 4)) at = i + (long)sizeof key - 1 + 12;
    assert_true(at > 0); /* key, then a u32 type and a u64 length */
    fseek(f, at, SEEK_SET);
    fwrite("bq16", 1, 4, f);
    fclose(f);
    free(buf);
    assert_fails_naming(ma_model_open(dir, "libero", &m, &err), err, "compute plan \"bq16\"");
    tu_rmdir(dir);
    tu_rmdir(dir2);
}

static void test_suffixes_and_prompt_length(void **state) {
    (void)state;
    char dir[1024];
    tu_tmpdir(dir, sizeof dir, "ctx-sfx");
    compile(TINY, dir, "f16", "f16", "f16", "");
    compile(TINY, dir, "f16", "q4_0", "q8_0", "_w4a16");
    ma_model m;
    ma_error err = {0};
    ma_settings st;
    ma_settings_init(&st);
    assert_int_equal(ma_settings_set(&st, "llm_suffix", "_w4a16", "LLM_CTX_SUFFIX", &err), MA_OK);
    assert_int_equal(ma_model_open_with(dir, "libero", MA_PART_ALL, &st, &m, &err), MA_OK);
    assert_string_equal(m.precision[0], "f16");
    assert_string_equal(m.precision[1], "q4_0");
    assert_string_equal(m.precision[2], "f16");
    ma_model_close(&m);
    assert_int_equal(ma_settings_set(&st, "action_suffix", "_w4a16", "ACTION_CTX_SUFFIX", &err), MA_OK);
    assert_int_equal(ma_model_open_with(dir, "libero", MA_PART_ALL, &st, &m, &err), MA_OK);
    assert_string_equal(m.precision[2], "q8_0");
    ma_model_close(&m);
    ma_settings_init(&st);
    assert_int_equal(ma_settings_set(&st, "vision_suffix", "_nope", "VISION_CTX_SUFFIX", &err), MA_OK);
    assert_fails_naming(ma_model_open_with(dir, "libero", MA_PART_ALL, &st, &m, &err), err, "vision_nope.gguf");
    ma_settings_init(&st);
    assert_int_equal(ma_settings_set(&st, "prompt_seq", "488", "MOLMOACT2_PROMPT_SEQ", &err), MA_OK);
    assert_fails_naming(ma_model_open_with(dir, "libero", MA_PART_ALL, &st, &m, &err), err, "prompt length 128");
    assert_fails_naming(ma_settings_set(&st, "prompt_seq", "abc", "MOLMOACT2_PROMPT_SEQ", &err), err, "MOLMOACT2_PROMPT_SEQ");
    /* a worker opens only its part */
    assert_int_equal(ma_model_open_parts(dir, "libero", MA_PART_LLM(2), &m, &err), MA_OK);
    ma_session *s;
    assert_int_equal(ma_session_open(&ma_cpu_backend, &m, "llm_split2", &s, &err), MA_OK);
    ma_session_close(s);
    assert_fails_naming(ma_session_open(&ma_cpu_backend, &m, "vision", &s, &err), err, "not loaded");
    ma_model_close(&m);
    tu_rmdir(dir);
}

static void patch(const char *path, const char *from, const char *to) {
    char *buf;
    size_t len;
    ma_error err = {0};
    assert_int_equal(ma_read_file(path, 64u << 20, &buf, &len, &err), MA_OK);
    size_t fl = strlen(from);
    for (size_t i = 0; i + fl <= len; i++)
        if (!memcmp(buf + i, from, fl)) {
            memcpy(buf + i, to, fl);
            break;
        }
    assert_int_equal(ma_write_file(path, buf, len, &err), MA_OK);
    free(buf);
}

static void copy(const char *from, const char *to) {
    char *buf;
    size_t len;
    ma_error err = {0};
    assert_int_equal(ma_read_file(from, 64u << 20, &buf, &len, &err), MA_OK);
    assert_int_equal(ma_write_file(to, buf, len, &err), MA_OK);
    free(buf);
}

static void test_bad_contexts_refused(void **state) {
    (void)state;
    char dir[1024], p[1200], q[1200];
    ma_model m;
    ma_error err = {0};
    tu_tmpdir(dir, sizeof dir, "ctx-bad");
    compile(TINY, dir, "bf16", "bf16", "bf16", "");
    /* wrong layer range: split 1's layers under split 0's name */
    snprintf(p, sizeof p, "%s/llm_split0.gguf", dir);
    snprintf(q, sizeof q, "%s/llm_split1.gguf", dir);
    copy(q, p);
    assert_fails_naming(ma_model_open(dir, "libero", &m, &err), err, "llm_split0.gguf: holds layers [1, 2)");
    compile(TINY, dir, "bf16", "bf16", "bf16", "");
    /* precision tag that does not match the tensors */
    snprintf(p, sizeof p, "%s/action_step.gguf", dir);
    patch(p, "bf16", "q8_0");
    assert_fails_naming(ma_model_open(dir, "libero", &m, &err), err, "precision tag q8_0");
    compile(TINY, dir, "bf16", "bf16", "bf16", "");
    /* a context from another model */
    char other[1024];
    tu_tmpdir(other, sizeof other, "ctx-other");
    compile(MA_SOURCE_DIR "/assets/tiny-original/model", other, "bf16", "bf16", "bf16", "");
    snprintf(q, sizeof q, "%s/vision.gguf", other);
    snprintf(p, sizeof p, "%s/vision.gguf", dir);
    copy(q, p);
    assert_fails_naming(ma_model_open(dir, "libero", &m, &err), err, "were compiled from different checkpoints");
    assert_true(strstr(err.msg, "vision.gguf") && strstr(err.msg, "embed.gguf")); /* both files named */
    compile(TINY, dir, "bf16", "bf16", "bf16", "");
    /* truncated, then corrupted contexts */
    snprintf(p, sizeof p, "%s/llm_split3.gguf", dir);
    assert_int_equal(truncate(p, 5000), 0);
    assert_fails_naming(ma_model_open(dir, "libero", &m, &err), err, "llm_split3.gguf");
    compile(TINY, dir, "bf16", "bf16", "bf16", "");
    patch(p, "GGUF", "GGUX");
    assert_fails_naming(ma_model_open(dir, "libero", &m, &err), err, "magic");
    tu_rmdir(dir);
    tu_rmdir(other);
}

/* a copy of the tiny checkpoint with one weight value changed: a "fine-tune" with the same config */
static void make_finetune(const char *to) {
    char cmd[2400];
    snprintf(cmd, sizeof cmd, "cp -r '%s/.' '%s/'", TINY, to);
    assert_int_equal(system(cmd), 0);
    char st[1200];
    snprintf(st, sizeof st, "%s/model.safetensors", to);
    FILE *f = fopen(st, "r+b");
    assert_non_null(f);
    fseek(f, -3, SEEK_END); /* inside the last tensor's data */
    int c = fgetc(f);
    fseek(f, -3, SEEK_END);
    fputc(c ^ 0x10, f);
    fclose(f);
}

static void test_fingerprint_refuses_mixed_checkpoints(void **state) {
    (void)state;
    char dir[1024], tuned[1024], tuned_ctx[1024], p[1200], q[1200];
    ma_model m;
    ma_error err = {0};
    tu_tmpdir(dir, sizeof dir, "ctx-fp");
    tu_tmpdir(tuned, sizeof tuned, "ckpt-tuned");
    tu_tmpdir(tuned_ctx, sizeof tuned_ctx, "ctx-tuned");
    make_finetune(tuned);
    compile(TINY, dir, "f16", "f16", "f16", "");
    compile(tuned, tuned_ctx, "f16", "f16", "f16", "");
    /* one llm_split of the fine-tune among the original's: same config, refused, both files named */
    snprintf(q, sizeof q, "%s/llm_split2.gguf", tuned_ctx);
    snprintf(p, sizeof p, "%s/llm_split2.gguf", dir);
    copy(q, p);
    assert_fails_naming(ma_model_open(dir, "libero", &m, &err), err, "compiled from different checkpoints");
    assert_true(strstr(err.msg, "llm_split2.gguf") && strstr(err.msg, "vision.gguf"));
    /* every process refuses it, also one that opens only another part (a resident worker) */
    assert_fails_naming(ma_model_open_parts(dir, "libero", MA_PART_LLM(0), &m, &err), err, "llm_split2.gguf");
    assert_fails_naming(ma_model_open_parts(dir, "libero", MA_PART_EMBED, &m, &err), err, "different checkpoints");
    /* contexts of one checkpoint in several precisions agree */
    compile(TINY, dir, "f16", "f16", "f16", "");
    compile(TINY, dir, "f16", "q4_0", "f16", "_w4a16");
    ma_settings st;
    ma_settings_init(&st);
    assert_int_equal(ma_settings_set(&st, "llm_suffix", "_w4a16", "LLM_CTX_SUFFIX", &err), MA_OK);
    assert_int_equal(ma_model_open_with(dir, "libero", MA_PART_ALL, &st, &m, &err), MA_OK);
    ma_model_close(&m);
    /* ... but a quantised split of the fine-tune does not */
    compile(tuned, tuned_ctx, "f16", "q4_0", "f16", "_w4a16");
    snprintf(q, sizeof q, "%s/llm_split1_w4a16.gguf", tuned_ctx);
    snprintf(p, sizeof p, "%s/llm_split1_w4a16.gguf", dir);
    copy(q, p);
    assert_fails_naming(ma_model_open_with(dir, "libero", MA_PART_ALL, &st, &m, &err), err, "llm_split1_w4a16.gguf");
    tu_rmdir(dir);
    tu_rmdir(tuned);
    tu_rmdir(tuned_ctx);
}

static int count_entries(const char *parent, const char *prefix) {
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "exit $(ls -A '%s' | grep -c '^%s')", parent, prefix);
    int rc = system(cmd);
    return WEXITSTATUS(rc);
}

/* compile in a child whose files may not exceed 1 MB: vision.gguf (0.4 MB) is written, then
 * embed.gguf (20 MB) fails with EFBIG, as a full disk would. 0 when compile failed naming it. */
static int compile_with_file_limit(const char *src, const char *out) {
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit rl = {1u << 20, 1u << 20};
        signal(SIGXFSZ, SIG_IGN);
        setrlimit(RLIMIT_FSIZE, &rl);
        ma_compile_opts o = {.vision = "f16", .llm = "f16", .action = "f16", .suffix = "", .prompt_seq = 128};
        ma_error err = {0};
        ma_status s = ma_compile(src, out, &o, &err);
        _exit(s != MA_OK && strstr(err.msg, "embed.gguf") && strstr(err.msg, "File too large") ? 0 : 1);
    }
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 2;
}

static void test_failed_compile_leaves_nothing(void **state) {
    (void)state;
    char parent[1024], out[1200], p[1200];
    ma_error err = {0};
    tu_tmpdir(parent, sizeof parent, "compile-out");
    snprintf(out, sizeof out, "%s/ctx", parent);
    assert_int_equal(compile_with_file_limit(TINY, out), 0);
    assert_int_equal(count_entries(parent, ""), 0); /* no ctx, no ctx.compile-* */
    /* into an existing directory: what was there stays, nothing is added */
    assert_int_equal(mkdir(out, 0755), 0);
    snprintf(p, sizeof p, "%s/keep.txt", out);
    assert_int_equal(ma_write_file(p, "k", 1, &err), MA_OK);
    assert_int_equal(compile_with_file_limit(TINY, out), 0);
    assert_int_equal(count_entries(out, ""), 1);
    assert_int_equal(count_entries(parent, "ctx.compile"), 0);
    /* a successful compile into a new directory gives it the usual mode */
    tu_rmdir(out);
    compile(TINY, out, "f16", "f16", "f16", "");
    struct stat st;
    assert_int_equal(stat(out, &st), 0);
    mode_t um = umask(0);
    umask(um);
    assert_int_equal(st.st_mode & 0777, 0777 & ~um);
    /* prompt length and suffix are checked */
    ma_compile_opts o = {.vision = "f16", .llm = "f16", .action = "f16", .suffix = "", .prompt_seq = 0};
    assert_fails_naming(ma_compile(TINY, out, &o, &err), err, "--prompt-seq 0");
    o.prompt_seq = 128;
    o.suffix = "/../../x";
    assert_fails_naming(ma_compile(TINY, out, &o, &err), err, "--suffix");
    tu_rmdir(parent);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fingerprint_refuses_mixed_checkpoints),
        cmocka_unit_test(test_failed_compile_leaves_nothing),
        cmocka_unit_test(test_f16_contexts_equal_checkpoint),
        cmocka_unit_test(test_quantised_gates),
        cmocka_unit_test(test_keep_tensors_at_higher_precision),
        cmocka_unit_test(test_compute_plan),
        cmocka_unit_test(test_suffixes_and_prompt_length),
        cmocka_unit_test(test_bad_contexts_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
