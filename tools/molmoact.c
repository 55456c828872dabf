/* molmoact: MolmoAct2-LIBERO inference from the command line.
 *
 *   molmoact run     [--model DIR] [--inputs IN.npz] [--out OUT.npz] [--dump DIR] [--seed N] [--json] [--golden DIR]
 *   molmoact parity  --model DIR --golden DIR [--gate 0.9999] [--json]
 *   molmoact inspect FILE|DIR
 */
#define _POSIX_C_SOURCE 200809L
#include <sys/types.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/gguf.h"
#include "io/jsonline.h"
#include "io/mapfile.h"
#include "io/npz.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "model/tokenizer.h"
#include "runtime/parity.h"
#include "runtime/compile.h"
#include "runtime/observation.h"
#include "runtime/pipeline.h"

#ifndef MA_SOURCE_DIR
#define MA_SOURCE_DIR "."
#endif

static void usage(FILE *f) {
    fprintf(f,
            "usage: molmoact <command> [options]\n"
            "  run      --model DIR (--inputs IN.npz | --image0 A.png --image1 B.png --state s0,..,s7 --task TEXT)\n"
            "           [--out OUT.npz] [--dump DIR] [--seed N | --noise FILE] [--golden DIR] [--json]\n"
            "           (no --model: the demo model and golden in assets/tiny-grid)\n"
            "  parity   --model DIR --golden DIR [--gate G] [--json]\n"
            "  compile  HF_DIR -o CTX_DIR [--vision P] [--llm P] [--action P] [--suffix S] [--prompt-seq N]\n"
            "           (P: f16 (default), bf16, q8_0, q4_0)\n"
            "  inspect  FILE.safetensors | FILE.npz | FILE.gguf | CHECKPOINT_DIR\n"
            "  tokenize --tokenizer tokenizer.json [--decode]   (stdin: one JSON string / id array per line)\n"
            "  prompt   --model DIR   (stdin: {\"task\": ..., \"state\": [...]} per line -> prompt ids)\n"
            "  preprocess --model DIR --image0 FILE [-o OUT.npz]   (pixels and the resized image)\n"
            "options: --norm-tag TAG (default libero)\n");
}

typedef struct {
    const char *model, *golden, *inputs, *out, *dump, *norm_tag, *image0, *image1, *task, *state, *noise;
    uint64_t seed;
    int have_seed, json;
    double gate;
} opts;

static int parse_opts(int argc, char **argv, int first, opts *o) {
    memset(o, 0, sizeof *o);
    o->gate = 0;
    o->norm_tag = "libero";
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define TAKE(field) do { if (!v) { fprintf(stderr, "molmoact: %s needs a value\n", a); return -1; } o->field = v; i++; } while (0)
        if (!strcmp(a, "--model")) TAKE(model);
        else if (!strcmp(a, "-o")) TAKE(out);
        else if (!strcmp(a, "--golden")) TAKE(golden);
        else if (!strcmp(a, "--inputs")) TAKE(inputs);
        else if (!strcmp(a, "--out")) TAKE(out);
        else if (!strcmp(a, "--dump")) TAKE(dump);
        else if (!strcmp(a, "--norm-tag")) TAKE(norm_tag);
        else if (!strcmp(a, "--image0")) TAKE(image0);
        else if (!strcmp(a, "--image1")) TAKE(image1);
        else if (!strcmp(a, "--task")) TAKE(task);
        else if (!strcmp(a, "--state")) TAKE(state);
        else if (!strcmp(a, "--noise")) TAKE(noise);
        else if (!strcmp(a, "--json")) o->json = 1;
        else if (!strcmp(a, "--seed") || !strcmp(a, "--gate")) {
            if (!v) { fprintf(stderr, "molmoact: %s needs a value\n", a); return -1; }
            char *end;
            errno = 0;
            if (!strcmp(a, "--seed")) {
                unsigned long long s = strtoull(v, &end, 10);
                if (errno || *end || v[0] == '-') { fprintf(stderr, "molmoact: --seed %s is not a non-negative integer\n", v); return -1; }
                o->seed = s;
                o->have_seed = 1;
            } else {
                o->gate = strtod(v, &end);
                if (errno || *end || !(o->gate > 0 && o->gate <= 1)) { fprintf(stderr, "molmoact: --gate %s must be in (0, 1]\n", v); return -1; }
            }
            i++;
        } else { fprintf(stderr, "molmoact: unknown option %s\n", a); return -1; }
#undef TAKE
    }
    return 0;
}

static int fail(const ma_error *e) {
    fprintf(stderr, "molmoact: %s\n", e->msg);
    return 1;
}

static long peak_rss_kb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/* ---------------------------------------------------------------------------------- run */

static void print_actions(const ma_result *r, int json) {
    if (json) {
        printf("{\"actions\": [");
        for (int k = 0; k < r->n_steps; k++) {
            printf("%s[", k ? ", " : "");
            for (int j = 0; j < r->action_dim; j++) printf("%s%.7g", j ? ", " : "", r->actions[k * r->action_dim + j]);
            printf("]");
        }
        printf("]");
        return;
    }
    printf("action chunk [%d, %d]\n step", r->n_steps, r->action_dim);
    for (int j = 0; j < r->action_dim; j++) printf("  %9s%d", "a", j);
    printf("\n");
    for (int k = 0; k < r->n_steps; k++) {
        printf(" %4d", k);
        for (int j = 0; j < r->action_dim; j++) printf("  %10.5f", r->actions[k * r->action_dim + j]);
        printf("\n");
    }
}

static int cmd_run(opts *o) {
    ma_error err = {0};
    char demo_model[PATH_MAX], demo_golden[PATH_MAX], demo_inputs[PATH_MAX];
    int demo = !o->model;
    if (demo) {
        snprintf(demo_model, sizeof demo_model, "%s/assets/tiny-grid/model", MA_SOURCE_DIR);
        snprintf(demo_golden, sizeof demo_golden, "%s/assets/tiny-grid/golden", MA_SOURCE_DIR);
        snprintf(demo_inputs, sizeof demo_inputs, "%s/assets/tiny-grid/golden/step0_boundary.npz", MA_SOURCE_DIR);
        o->model = demo_model;
        if (!o->golden) o->golden = demo_golden;
        if (!o->json) printf("demo: model %s\n", demo_model);
    }
    ma_model m;
    if (ma_model_open(o->model, o->norm_tag, &m, &err)) return fail(&err);
    ma_npz in = {0}, vis = {0};
    ma_prepared prep;
    memset(&prep, 0, sizeof prep);
    ma_image imgs[2];
    memset(imgs, 0, sizeof imgs);
    char *task_buf = NULL;
    int rc = 1;
    const float *pixels = NULL, *noise = NULL;
    int n_images = 0;
    const int64_t *ids_data = NULL;
    int64_t seq_len = 0;
    if (!o->inputs && demo && !o->image0) {
        /* the demo observation: the golden's pixels, prompt and noise */
        char *vp = ma_path_join(o->golden, "vision_io.npz");
        ma_status s = ma_npz_read(demo_inputs, &in, &err);
        if (!s) s = ma_npz_read(vp, &vis, &err);
        free(vp);
        if (s) { fail(&err); goto out; }
        const ma_tensor *px = ma_npz_get(&vis, "pixels");
        if (!px) { fprintf(stderr, "molmoact: demo golden lacks pixels\n"); goto out; }
        pixels = px->data;
        n_images = (int)px->shape[0];
    } else if (o->inputs && ma_npz_read(o->inputs, &in, &err)) { fail(&err); goto out; }
    /* ---- camera frames: pixels | image0 + image1 (arrays or files) */
    if (!pixels) {
        const ma_tensor *px = ma_npz_get(&in, "pixels");
        if (px) {
            int64_t want[3] = {-1, m.cfg.patch_h * m.cfg.patch_w, 3 * m.cfg.patch * m.cfg.patch};
            if (ma_tensor_expect(px, "inputs pixels", MA_DT_F32, 3, want, &err)) { fail(&err); goto out; }
            pixels = px->data;
            n_images = (int)px->shape[0];
        } else {
            const char *files[2] = {o->image0, o->image1};
            for (int i = 0; i < 2; i++) {
                char key[16];
                snprintf(key, sizeof key, "image%d", i);
                const ma_tensor *t = ma_npz_get(&in, key);
                ma_status s;
                if (t) s = ma_image_from_tensor(t, key, &imgs[i], &err);
                else if (files[i]) s = ma_image_load(files[i], &imgs[i], &err);
                else { fprintf(stderr, "molmoact: inputs need `pixels`, or both camera frames (image0 and image1)\n"); goto out; }
                if (s) { fail(&err); goto out; }
            }
            n_images = 2;
        }
    }
    /* ---- prompt: input_ids | task + state */
    const ma_tensor *ids = ma_npz_get(&in, "input_ids");
    if (ids) {
        int64_t any[1] = {-1};
        if (ma_tensor_expect(ids, "inputs input_ids", MA_DT_I64, 1, any, &err)) { fail(&err); goto out; }
        ids_data = ids->data;
        seq_len = ids->shape[0];
    }
    if (!pixels || !ids_data) {
        const ma_tensor *tt = ma_npz_get(&in, "task"), *st = ma_npz_get(&in, "state");
        const char *task = o->task;
        size_t task_len = task ? strlen(task) : 0;
        if (tt) {
            if (tt->dtype != MA_DT_STR32 || ma_tensor_numel(tt) != 1) { fprintf(stderr, "molmoact: inputs task must be one string\n"); goto out; }
            if (ma_str32_to_utf8(tt, 0, &task_buf, &err)) { fail(&err); goto out; }
            task = task_buf;
            task_len = strlen(task_buf);
        }
        float state[MA_NORM_MAX_DIM];
        int state_dim = 0;
        if (st) {
            if (st->dtype != MA_DT_F32 || st->ndim != 1 || st->shape[0] < 1 || st->shape[0] > MA_NORM_MAX_DIM) {
                fprintf(stderr, "molmoact: inputs state must be float32 [%d]\n", m.ns.has_state ? m.ns.state.dim : 8);
                goto out;
            }
            state_dim = (int)st->shape[0];
            memcpy(state, st->data, sizeof(float) * (size_t)state_dim);
        } else if (o->state) {
            const char *p = o->state;
            while (*p && state_dim < MA_NORM_MAX_DIM) {
                char *end;
                state[state_dim++] = strtof(p, &end);
                if (end == p || (*end && *end != ',')) { fprintf(stderr, "molmoact: --state: %s is not a comma-separated list of numbers\n", o->state); goto out; }
                p = *end ? end + 1 : end;
            }
        }
        if (!ids_data && (!task || !state_dim)) {
            fprintf(stderr, "molmoact: inputs need `input_ids`, or `task` and `state` (--task, --state)\n");
            goto out;
        }
        if (!pixels || !ids_data) {
            if (pixels) { fprintf(stderr, "molmoact: pass either pixels + input_ids or raw frames + task + state\n"); goto out; }
            if (ma_prepare_observation(&m, imgs, n_images, task, task_len, state, state_dim, &prep, &err)) { fail(&err); goto out; }
            pixels = prep.pixels;
            if (!ids_data) { ids_data = prep.prompt.ids; seq_len = prep.prompt.n; }
        }
    }
    int action_dim = 0, A = 0, n_steps = 0;
    if (ma_action_plan(&m, &action_dim, &A, &n_steps, &err)) { fail(&err); goto out; }
    const ma_tensor *nz = ma_npz_get(&in, "noise");
    ma_npz noise_file = {0};
    ma_tensor noise_npy = {0};
    if (o->noise) {
        /* --noise FILE: an .npy array or an .npz holding `noise` */
        if (ma_npz_read(o->noise, &noise_file, &err) == MA_OK) nz = ma_npz_get(&noise_file, "noise");
        else {
            char *buf;
            size_t len;
            if (ma_read_file(o->noise, 64u << 20, &buf, &len, &err) || ma_npy_parse((uint8_t *)buf, len, o->noise, &noise_npy, &err)) {
                if (buf) free(buf);
                fail(&err);
                goto out;
            }
            free(buf);
            nz = &noise_npy;
        }
        if (!nz) { fprintf(stderr, "molmoact: %s holds no `noise` array\n", o->noise); ma_npz_free(&noise_file); goto out; }
    }
    if (nz && (!o->have_seed || o->noise)) {
        int64_t want[3] = {1, A, m.cfg.max_action_dim};
        if (ma_tensor_expect(nz, "noise", MA_DT_F32, 3, want, &err)) { fail(&err); ma_npz_free(&noise_file); ma_tensor_free(&noise_npy); goto out; }
        noise = nz->data;
    }
    ma_runner r;
    if (ma_runner_open(&m, &r, &err)) { fail(&err); ma_npz_free(&noise_file); ma_tensor_free(&noise_npy); goto out; }
    ma_obs obs = {pixels, n_images, ids_data, seq_len, noise, o->seed};
    ma_result res;
    ma_trace trace;
    ma_trace_init(&trace);
    if (ma_runner_run(&r, &obs, &res, o->dump ? &trace : NULL, &err)) {
        fail(&err);
        ma_trace_free(&trace);
        ma_runner_close(&r);
        ma_npz_free(&noise_file);
        ma_tensor_free(&noise_npy);
        goto out;
    }
    if (o->dump && prep.resized) {
        int64_t rs[4] = {n_images, m.cfg.image_h, m.cfg.image_w, 3}, bs[1] = {prep.prompt.state_dim};
        ma_tensor rt = ma_tensor_view(MA_DT_U8, 4, rs, prep.resized);
        int32_t bins32[MA_NORM_MAX_DIM];
        int64_t bins[MA_NORM_MAX_DIM];
        for (int i = 0; i < prep.prompt.state_dim; i++) { bins32[i] = prep.prompt.state_bins[i]; bins[i] = bins32[i]; }
        ma_tensor bt = ma_tensor_view(MA_DT_I64, 1, bs, bins);
        if (ma_trace_add(&trace, "resized_u8", &rt, &err) || ma_trace_add(&trace, "state_bins", &bt, &err) ||
            ma_trace_add_f32(&trace, "state_normalized", 1, bs, prep.prompt.state_norm, &err)) fail(&err);
    }
    print_actions(&res, o->json);
    if (o->out) {
        ma_npz_writer w;
        ma_npz_writer_init(&w);
        int64_t as[2] = {res.n_steps, res.action_dim}, ts[2] = {res.horizon, res.max_action_dim};
        ma_status s = ma_npz_add_f32(&w, "actions", 2, as, res.actions, &err);
        if (!s) s = ma_npz_add_f32(&w, "trajectory", 2, ts, res.trajectory, &err);
        if (!s) s = ma_npz_write(&w, o->out, 0, &err);
        ma_npz_writer_free(&w);
        if (s) { fail(&err); goto run_done; }
    }
    if (o->dump) {
        mkdir(o->dump, 0755);
        char *p = ma_path_join(o->dump, "intermediates.npz");
        ma_status s = p ? ma_trace_write_npz(&trace, p, &err) : MA_ERR_NOMEM;
        free(p);
        if (s) { fail(&err); goto run_done; }
    }
    const ma_timing *t = &r.last;
    if (o->json) {
        printf(", \"latency_ms\": {\"vision\": %.3f, \"llm_split0\": %.3f, \"llm_split1\": %.3f, \"llm_split2\": %.3f, "
               "\"llm_split3\": %.3f, \"action_context\": %.3f, \"action_step_x%d\": %.3f, \"host\": %.3f, \"total\": %.3f}, "
               "\"peak_rss_kb\": %ld", t->vision, t->llm[0], t->llm[1], t->llm[2], t->llm[3], t->action_context,
               m.cfg.flow_steps, t->action_step, t->host, t->total, peak_rss_kb());
    } else {
        printf("latency (ms): vision %.2f | llm %.2f %.2f %.2f %.2f | action_context %.2f | action_step x%d %.2f | host %.2f | total %.2f\n",
               t->vision, t->llm[0], t->llm[1], t->llm[2], t->llm[3], t->action_context, m.cfg.flow_steps, t->action_step,
               t->host, t->total);
        printf("peak RSS %.1f MiB\n", peak_rss_kb() / 1024.0);
    }
    rc = 0;
    if (o->golden) {
        ma_parity_report rep;
        int e2e;
        double gate = ma_parity_default_gate(&m, &e2e);
        if (o->gate > 0) gate = o->gate;
        if ((e2e ? ma_parity_run_e2e : ma_parity_run)(&m, o->golden, gate, &rep, &err)) { fail(&err); rc = 1; }
        else {
            if (o->json) { printf(", \"parity\": "); ma_parity_print(&rep, stdout, 1); }
            else { printf("\nparity against %s\n", o->golden); ma_parity_print(&rep, stdout, 0); }
            rc = rep.pass ? 0 : 2;
        }
        ma_parity_free(&rep);
    }
    if (o->json) printf("}\n");
run_done:
    ma_npz_free(&noise_file);
    ma_tensor_free(&noise_npy);
    ma_result_free(&res);
    ma_trace_free(&trace);
    ma_runner_close(&r);
out:
    ma_npz_free(&in);
    ma_npz_free(&vis);
    ma_prepared_free(&prep);
    ma_image_free(&imgs[0]);
    ma_image_free(&imgs[1]);
    free(task_buf);
    ma_model_close(&m);
    return rc;
}

/* ---------------------------------------------------------------------------------- parity */

static int cmd_parity(opts *o) {
    if (!o->model || !o->golden) { fprintf(stderr, "molmoact: parity needs --model DIR and --golden DIR\n"); return 1; }
    ma_error err = {0};
    ma_model m;
    if (ma_model_open(o->model, o->norm_tag, &m, &err)) return fail(&err);
    ma_parity_report rep;
    int rc, e2e;
    double gate = ma_parity_default_gate(&m, &e2e);
    if (o->gate > 0) gate = o->gate;
    if ((e2e ? ma_parity_run_e2e : ma_parity_run)(&m, o->golden, gate, &rep, &err)) rc = fail(&err);
    else {
        ma_parity_print(&rep, stdout, o->json);
        rc = rep.pass ? 0 : 2;
    }
    ma_parity_free(&rep);
    ma_model_close(&m);
    return rc;
}

/* ---------------------------------------------------------------------------------- inspect */

static void print_shape(int nd, const int64_t *sh) {
    printf("[");
    for (int i = 0; i < nd; i++) printf(i ? ", %lld" : "%lld", (long long)sh[i]);
    printf("]");
}

static int cmd_inspect(int argc, char **argv) {
    if (argc < 3) { usage(stderr); return 1; }
    const char *path = argv[2];
    ma_error err = {0};
    if (ma_is_dir(path)) {
        ma_safetensors st;
        if (ma_st_open(&st, path, &err)) return fail(&err);
        printf("%s: %zu tensors in %d file(s)\n", path, st.count, st.nfiles);
        size_t total = 0;
        for (size_t i = 0; i < st.count; i++) {
            printf("  %-72s %-5s ", st.tensors[i].name, ma_dtype_name(st.tensors[i].dtype));
            print_shape(st.tensors[i].ndim, st.tensors[i].shape);
            printf("\n");
            total += st.tensors[i].nbytes;
        }
        printf("total %.1f MiB\n", total / 1048576.0);
        ma_st_close(&st);
        return 0;
    }
    ma_mapfile mf;
    if (ma_map_file(&mf, path, &err)) return fail(&err);
    int rc = 0;
    if (mf.size >= 4 && !memcmp(mf.data, "GGUF", 4)) {
        ma_unmap_file(&mf);
        ma_gguf g;
        if (ma_gguf_open(&g, path, &err)) return fail(&err);
        printf("%s: GGUF v%u, %zu metadata keys, %zu tensors, alignment %zu\n", path, g.version, g.n_kv, g.n_tensors, g.alignment);
        for (size_t i = 0; i < g.n_kv; i++) {
            const ma_gguf_kv *kv = &g.kv[i];
            printf("  %-48s ", kv->key);
            switch (kv->type) {
            case MA_GGUF_STRING: printf("\"%.*s\"\n", (int)(kv->v.s.len > 200 ? 200 : kv->v.s.len), kv->v.s.p); break;
            case MA_GGUF_F32: case MA_GGUF_F64: printf("%g\n", kv->v.f); break;
            case MA_GGUF_BOOL: printf("%s\n", kv->v.b ? "true" : "false"); break;
            case MA_GGUF_I8: case MA_GGUF_I16: case MA_GGUF_I32: case MA_GGUF_I64: printf("%lld\n", (long long)kv->v.i); break;
            case MA_GGUF_ARRAY: printf("array of %llu (type %u)\n", (unsigned long long)kv->arr_count, kv->arr_type); break;
            default: printf("%llu\n", (unsigned long long)kv->v.u); break;
            }
        }
        for (size_t i = 0; i < g.n_tensors; i++) {
            const ma_gguf_tensor *t = &g.tensors[i];
            int64_t sh[4];
            for (uint32_t d = 0; d < t->n_dims; d++) sh[d] = t->ne[t->n_dims - 1 - d];
            printf("  %-60s %-5s ", t->name, ma_dtype_name(t->dtype));
            print_shape((int)t->n_dims, sh);
            printf(" @%llu\n", (unsigned long long)t->offset);
        }
        ma_gguf_close(&g);
    } else if (mf.size >= 2 && mf.data[0] == 'P' && mf.data[1] == 'K') {
        ma_npz z;
        if (ma_npz_parse(mf.data, mf.size, path, &z, &err)) { ma_unmap_file(&mf); return fail(&err); }
        printf("%s: %zu arrays\n", path, z.count);
        for (size_t i = 0; i < z.count; i++) {
            printf("  %-32s %-6s ", z.entries[i].name, ma_dtype_name(z.entries[i].t.dtype));
            print_shape(z.entries[i].t.ndim, z.entries[i].t.shape);
            printf("\n");
        }
        ma_npz_free(&z);
        ma_unmap_file(&mf);
    } else {
        ma_st_tensor *ts;
        size_t n;
        if (ma_st_parse(mf.data, mf.size, path, &ts, &n, &err)) { ma_unmap_file(&mf); return fail(&err); }
        printf("%s: safetensors, %zu tensors\n", path, n);
        for (size_t i = 0; i < n; i++) {
            printf("  %-72s %-5s ", ts[i].name, ma_dtype_name(ts[i].dtype));
            print_shape(ts[i].ndim, ts[i].shape);
            printf("\n");
        }
        ma_st_free_tensors(ts, n);
        ma_unmap_file(&mf);
    }
    return rc;
}

/* ---------------------------------------------------------------------------------- prompt */

#include <cjson/cJSON.h>
#include <math.h>

static int cmd_prompt(opts *o) {
    if (!o->model) { fprintf(stderr, "molmoact: prompt needs --model DIR\n"); return 1; }
    ma_error err = {0};
    ma_model m;
    if (ma_model_open(o->model, o->norm_tag, &m, &err)) return fail(&err);
    if (!m.tok) { fprintf(stderr, "molmoact: %s has no tokenizer.json\n", o->model); ma_model_close(&m); return 1; }
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    int rc = 0;
    ma_prompt_opts po = {m.tokens_per_image, 2, m.col_tokens, 1};
    while ((got = getline(&line, &cap, stdin)) >= 0) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *task = j ? cJSON_GetObjectItemCaseSensitive(j, "task") : NULL, *state = j ? cJSON_GetObjectItemCaseSensitive(j, "state") : NULL;
        float st[MA_NORM_MAX_DIM];
        int n = 0, ok = cJSON_IsString(task) && cJSON_IsArray(state);
        for (const cJSON *e = ok ? state->child : NULL; e && ok; e = e->next) {
            if (n >= MA_NORM_MAX_DIM) ok = 0;
            else if (cJSON_IsNumber(e)) st[n++] = (float)e->valuedouble;
            else if (cJSON_IsString(e) && !strcmp(e->valuestring, "nan")) st[n++] = NAN;
            else if (cJSON_IsString(e) && !strcmp(e->valuestring, "inf")) st[n++] = INFINITY;
            else if (cJSON_IsString(e) && !strcmp(e->valuestring, "-inf")) st[n++] = -INFINITY;
            else ok = 0;
        }
        ma_prompt p;
        if (!ok) { fprintf(stderr, "molmoact: prompt: expected {\"task\": string, \"state\": [numbers]}\n"); printf("null\n"); rc = 1; }
        else if (ma_build_prompt(&m.cfg, &m.ns, m.tok, &po, task->valuestring, strlen(task->valuestring), st, n, &p, &err)) {
            fprintf(stderr, "molmoact: prompt: %s\n", err.msg);
            printf("null\n");
            rc = 1;
        } else {
            printf("[");
            for (int64_t i = 0; i < p.n; i++) printf(i ? ",%lld" : "%lld", (long long)p.ids[i]);
            printf("]\n");
            ma_prompt_free(&p);
        }
        cJSON_Delete(j);
    }
    free(line);
    ma_model_close(&m);
    return rc;
}

/* ---------------------------------------------------------------------------------- preprocess */

static int cmd_preprocess(opts *o) {
    if (!o->model || !o->image0) { fprintf(stderr, "molmoact: preprocess needs --model DIR and --image0 FILE\n"); return 1; }
    ma_error err = {0};
    ma_config cfg;
    char *cp = ma_path_join(o->model, "config.json");
    ma_status s = cp ? ma_config_load(cp, &cfg, &err) : MA_ERR_NOMEM;
    free(cp);
    if (s) return fail(&err);
    ma_image im;
    if (ma_image_load(o->image0, &im, &err)) return fail(&err);
    int64_t ps[2] = {cfg.patch_h * cfg.patch_w, 3 * cfg.patch * cfg.patch}, rs[3] = {cfg.image_h, cfg.image_w, 3};
    int64_t os[3] = {im.h, im.w, 3};
    float *pixels = malloc(sizeof(float) * (size_t)(ps[0] * ps[1]));
    uint8_t *resized = malloc((size_t)(rs[0] * rs[1] * 3));
    int rc = 1;
    if (pixels && resized && !ma_preprocess_image(&cfg, &im, pixels, resized, &err)) {
        ma_npz_writer w;
        ma_npz_writer_init(&w);
        ma_tensor a = ma_tensor_view(MA_DT_U8, 3, os, im.rgb), b = ma_tensor_view(MA_DT_U8, 3, rs, resized);
        if (!ma_npz_add(&w, "image", &a, &err) && !ma_npz_add(&w, "resized_u8", &b, &err) &&
            !ma_npz_add_f32(&w, "pixels", 2, ps, pixels, &err) && !ma_npz_write(&w, o->out ? o->out : "preprocessed.npz", 0, &err))
            rc = 0;
        ma_npz_writer_free(&w);
    }
    if (rc) fail(&err);
    free(pixels);
    free(resized);
    ma_image_free(&im);
    return rc;
}

/* ---------------------------------------------------------------------------------- compile */

static int cmd_compile(int argc, char **argv) {
    ma_compile_opts co = {"f16", "f16", "f16", "", 128};
    const char *src = NULL, *out = NULL;
    const char *env = getenv("MOLMOACT2_PROMPT_SEQ");
    if (env && *env) co.prompt_seq = atoi(env);
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if ((!strcmp(a, "-o") || !strcmp(a, "--vision") || !strcmp(a, "--llm") || !strcmp(a, "--action") ||
             !strcmp(a, "--suffix") || !strcmp(a, "--prompt-seq")) && !v) { fprintf(stderr, "molmoact: %s needs a value\n", a); return 1; }
        if (!strcmp(a, "-o")) out = argv[++i];
        else if (!strcmp(a, "--vision")) co.vision = argv[++i];
        else if (!strcmp(a, "--llm")) co.llm = argv[++i];
        else if (!strcmp(a, "--action")) co.action = argv[++i];
        else if (!strcmp(a, "--suffix")) co.suffix = argv[++i];
        else if (!strcmp(a, "--prompt-seq")) co.prompt_seq = atoi(argv[++i]);
        else if (a[0] == '-') { fprintf(stderr, "molmoact: compile: unknown option %s\n", a); return 1; }
        else if (!src) src = a;
        else { fprintf(stderr, "molmoact: compile: unexpected argument %s\n", a); return 1; }
    }
    if (!src || !out) { fprintf(stderr, "molmoact: compile needs HF_DIR and -o CTX_DIR\n"); return 1; }
    ma_error err = {0};
    if (ma_compile(src, out, &co, &err)) return fail(&err);
    printf("compiled %s -> %s (vision %s, llm %s, action %s, prompt length %d%s%s)\n", src, out, co.vision, co.llm, co.action,
           co.prompt_seq, co.suffix[0] ? ", suffix " : "", co.suffix);
    return 0;
}

/* ---------------------------------------------------------------------------------- tokenize */

static int cmd_tokenize(int argc, char **argv) {
    const char *path = NULL;
    int decode = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "--decode")) decode = 1;
        else { fprintf(stderr, "molmoact: tokenize: unknown option %s\n", argv[i]); return 1; }
    }
    if (!path) { fprintf(stderr, "molmoact: tokenize needs --tokenizer FILE\n"); return 1; }
    ma_error err = {0};
    ma_tokenizer *tok;
    if (ma_tokenizer_load(path, &tok, &err)) return fail(&err);
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    int rc = 0;
    long lineno = 0;
    while ((got = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        size_t len = (size_t)got;
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
        if (!len) continue;
        if (!decode) {
            char *text;
            size_t tl;
            int64_t *ids;
            size_t n;
            if (ma_json_parse_string(line, len, &text, &tl, &err) || ma_tokenizer_encode(tok, text, tl, &ids, &n, &err)) {
                fprintf(stderr, "molmoact: tokenize: line %ld: %s\n", lineno, err.msg);
                printf("null\n");
                rc = 1;
                if (err.code != MA_ERR_NOMEM) { memset(&err, 0, sizeof err); continue; }
                break;
            }
            printf("[");
            for (size_t i = 0; i < n; i++) printf(i ? ",%lld" : "%lld", (long long)ids[i]);
            printf("]\n");
            free(ids);
            free(text);
        } else {
            int64_t *ids;
            size_t n;
            char *text;
            size_t tl;
            if (ma_json_parse_int_array(line, len, &ids, &n, &err) || ma_tokenizer_decode(tok, ids, n, &text, &tl, &err)) {
                fprintf(stderr, "molmoact: tokenize --decode: line %ld: %s\n", lineno, err.msg);
                printf("null\n");
                rc = 1;
                continue;
            }
            ma_json_write_string(stdout, text, tl);
            printf("\n");
            free(ids);
            free(text);
        }
    }
    free(line);
    ma_tokenizer_free(tok);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) { usage(argc < 2 ? stderr : stdout); return argc < 2; }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "inspect")) return cmd_inspect(argc, argv);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(argc, argv);
    if (!strcmp(cmd, "compile")) return cmd_compile(argc, argv);
    opts o;
    if (parse_opts(argc, argv, 2, &o)) return 1;
    if (!strcmp(cmd, "run")) return cmd_run(&o);
    if (!strcmp(cmd, "parity")) return cmd_parity(&o);
    if (!strcmp(cmd, "prompt")) return cmd_prompt(&o);
    if (!strcmp(cmd, "preprocess")) return cmd_preprocess(&o);
    fprintf(stderr, "molmoact: unknown command %s\n", cmd);
    usage(stderr);
    return 1;
}
