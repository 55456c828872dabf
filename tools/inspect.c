/* SPDX-License-Identifier: Apache-2.0 */
/* molmoact inspect: what a file or directory holds. */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "options.h"
#include "backend/qnn/qnn.h"
#include "io/gguf.h"
#include "io/mapfile.h"
#include "io/npz.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "model/lerobot.h"
#include "model/manifest.h"

static void print_shape(int nd, const int64_t *sh) {
    printf("[");
    for (int i = 0; i < nd; i++) printf(i ? ", %lld" : "%lld", (long long)sh[i]);
    printf("]");
}

/* a QNN context binary: its graphs through the QNN system library (--qnn-lib-dir) */
static int inspect_qnn_binary(const char *path) {
    ma_error err = {0};
    if (ma_qnn_inspect(&SET, path, stdout, &err)) {
        fprintf(stderr, "molmoact inspect: %s\n", err.msg);
        return 1;
    }
    return 0;
}

/* a context directory: its files as the manifest lists them, with what each context carries */
static int inspect_context_dir(const char *path) {
    ma_error err = {0};
    ma_manifest mf;
    if (ma_manifest_load(path, &mf, &err)) return fail(&err);
    printf("%s: a context directory (molmoact compile), %d files\n", path, mf.n);
    printf("  %-28s %-15s %-9s %-7s %-8s %-10s %-17s %s\n", "file", "component", "precision", "compute", "prompt", "layers", "compile",
           "size");
    char fingerprint[24] = "";
    double total = 0;
    for (int i = 0; i < mf.n; i++) {
        const ma_manifest_entry *e = &mf.e[i];
        total += (double)e->bytes;
        char *fp = ma_path_join(path, e->name);
        ma_gguf g;
        if (!e->compile_id[0] || !fp || ma_gguf_open(&g, fp, NULL) != MA_OK) {
            printf("  %-28s %-15s %-9s %-7s %-8s %-10s %-17s %.1f MiB\n", e->name, e->compile_id[0] ? "(unreadable)" : "host file", "", "",
                   "", "", e->compile_id[0] ? e->compile_id : "", (double)e->bytes / 1048576.0);
            free(fp);
            continue;
        }
        char comp[32] = "", prec[16] = "", seq[16] = "", layers[24] = "", compute[8] = "";
        int64_t v, a, b;
        ma_gguf_get_str(&g, "molmoact.component", comp, sizeof comp, NULL);
        ma_gguf_get_str(&g, "molmoact.precision", prec, sizeof prec, NULL);
        if (ma_gguf_get_str(&g, "molmoact.compute", compute, sizeof compute, NULL) != MA_OK && strcmp(comp, "embed"))
            snprintf(compute, sizeof compute, "fp32"); /* compiled before compute plans */
        if (!fingerprint[0]) ma_gguf_get_str(&g, "molmoact.source_fingerprint", fingerprint, sizeof fingerprint, NULL);
        if (ma_gguf_get_i64(&g, "molmoact.prompt_seq", &v, NULL) == MA_OK) snprintf(seq, sizeof seq, "%lld", (long long)v);
        if (ma_gguf_get_i64(&g, "molmoact.layer_first", &a, NULL) == MA_OK && ma_gguf_get_i64(&g, "molmoact.layer_last", &b, NULL) == MA_OK)
            snprintf(layers, sizeof layers, "%lld-%lld", (long long)a, (long long)b - 1);
        printf("  %-28s %-15s %-9s %-7s %-8s %-10s %-17s %.1f MiB\n", e->name, comp, prec, compute, seq, layers, e->compile_id,
               (double)e->bytes / 1048576.0);
        ma_gguf_close(&g);
        free(fp);
    }
    printf("total %.2f GiB; source checkpoint fingerprint %s\n", total / 1073741824.0, fingerprint[0] ? fingerprint : "?");
    printf("(molmoact inspect DIR/FILE.gguf lists a context's tensors; which files a run opens: MOLMOACT_*_CTX_SUFFIX)\n");
    return 0;
}

/* a checkpoint directory (Hugging Face or LeRobot): what it is, what of its config this runtime
 * ignores, and its tensors */
static int inspect_checkpoint_dir(const char *path) {
    ma_error err = {0};
    ma_config cfg;
    char *cj = NULL;
    if (ma_is_lerobot_dir(path)) {
        ma_lerobot *lr = calloc(1, sizeof *lr);
        if (!lr) return 1;
        if (ma_lerobot_open(path, SET.base_dir, SET.hub_cache, lr, &err)) {
            free(lr);
            return fail(&err);
        }
        printf("%s: a LeRobot MolmoAct2 policy; base %s (from %s; checkpoint_path %s)\n", path, lr->base_dir, lr->base_from, lr->repo_id);
        printf("  action_mode %s (the expert attends to %s), chunk_size %d, n_action_steps %d, %s%s\n", lr->action_mode,
               lr->full_encoder_mask ? "every prompt token" : "the prompt less EOS and action spans", lr->chunk_size, lr->n_action_steps,
               lr->lora ? "LoRA (compile merges it)" : "full fine-tune or frozen VLM", "");
        printf("  statistics: state %d, action %d values (LeRobot's arithmetic, eps %g)\n", lr->ns.has_state ? lr->ns.state.dim : 0,
               lr->ns.action.dim, (double)lr->ns.eps);
        if (!ma_lerobot_config_json(lr, &cj, &err) && !ma_config_parse(cj, lr->base_dir, &cfg, NULL) && cfg.unknown[0])
            printf("  config fields this runtime ignores: %s\n", cfg.unknown);
        free(cj);
        free(lr);
    } else {
        char *cp = ma_path_join(path, "config.json");
        if (cp && ma_is_file(cp) && !ma_config_load(cp, &cfg, NULL) && cfg.unknown[0])
            printf("%s/config.json: fields this runtime ignores: %s\n", path, cfg.unknown);
        free(cp);
    }
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

/* a GGUF file: its metadata and its tensors */
static int inspect_gguf(const char *path) {
    ma_error err = {0};
    ma_gguf g;
    if (ma_gguf_open(&g, path, &err)) return fail(&err);
    printf("%s: GGUF v%u, %zu metadata keys, %zu tensors, alignment %zu\n", path, g.version, g.n_kv, g.n_tensors, g.alignment);
    for (size_t i = 0; i < g.n_kv; i++) {
        const ma_gguf_kv *kv = &g.kv[i];
        printf("  %-48s ", kv->key);
        switch (kv->type) {
        case MA_GGUF_STRING: printf("\"%.*s\"\n", (int)(kv->v.s.len > 200 ? 200 : kv->v.s.len), kv->v.s.p); break;
        case MA_GGUF_F32:
        case MA_GGUF_F64: printf("%g\n", kv->v.f); break;
        case MA_GGUF_BOOL: printf("%s\n", kv->v.b ? "true" : "false"); break;
        case MA_GGUF_I8:
        case MA_GGUF_I16:
        case MA_GGUF_I32:
        case MA_GGUF_I64: printf("%lld\n", (long long)kv->v.i); break;
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
    return 0;
}

/* a mapped .npz: its arrays (the mapping is unmapped) */
static int inspect_npz(ma_mapfile *mf, const char *path) {
    ma_error err = {0};
    ma_npz z;
    if (ma_npz_parse(mf->data, mf->size, path, &z, &err)) {
        ma_unmap_file(mf);
        return fail(&err);
    }
    printf("%s: %zu arrays\n", path, z.count);
    for (size_t i = 0; i < z.count; i++) {
        printf("  %-32s %-6s ", z.entries[i].name, ma_dtype_name(z.entries[i].t.dtype));
        print_shape(z.entries[i].t.ndim, z.entries[i].t.shape);
        printf("\n");
    }
    ma_npz_free(&z);
    ma_unmap_file(mf);
    return 0;
}

/* a mapped .npy: its array (the mapping is unmapped) */
static int inspect_npy(ma_mapfile *mf, const char *path) {
    ma_error err = {0};
    ma_tensor t;
    ma_status st = ma_npy_parse(mf->data, mf->size, path, &t, &err);
    ma_unmap_file(mf);
    if (st) return fail(&err);
    printf("%s: .npy, %s ", path, ma_dtype_name(t.dtype));
    print_shape(t.ndim, t.shape);
    printf("\n");
    ma_tensor_free(&t);
    return 0;
}

/* a mapped safetensors file: its tensors (the mapping is unmapped) */
static int inspect_safetensors_file(ma_mapfile *mf, const char *path) {
    ma_error err = {0};
    ma_st_tensor *ts;
    size_t n;
    if (ma_st_parse(mf->data, mf->size, path, &ts, &n, &err)) {
        ma_unmap_file(mf);
        return fail(&err);
    }
    printf("%s: safetensors, %zu tensors\n", path, n);
    for (size_t i = 0; i < n; i++) {
        printf("  %-72s %-5s ", ts[i].name, ma_dtype_name(ts[i].dtype));
        print_shape(ts[i].ndim, ts[i].shape);
        printf("\n");
    }
    ma_st_free_tensors(ts, n);
    ma_unmap_file(mf);
    return 0;
}

/* what the path is, told by its kind (a directory) or its first bytes */
static int cmd_inspect(const char *path) {
    ma_error err = {0};
    if (ma_is_dir(path) && ma_is_context_dir(path)) return inspect_context_dir(path);
    if (ma_is_dir(path)) return inspect_checkpoint_dir(path);
    ma_mapfile mf;
    if (ma_map_file(&mf, path, &err)) return fail(&err);
    if (mf.size >= 4 && !memcmp(mf.data, "GGUF", 4)) {
        ma_unmap_file(&mf);
        return inspect_gguf(path);
    }
    if (mf.size >= 2 && mf.data[0] == 'P' && mf.data[1] == 'K') return inspect_npz(&mf, path);
    if (mf.size >= 6 && !memcmp(mf.data, "\x93NUMPY", 6)) return inspect_npy(&mf, path);
    /* a safetensors file begins with its header's length and '{' */
    if (mf.size >= 9 && mf.data[8] == '{') return inspect_safetensors_file(&mf, path);
    const size_t nl = strlen(path);
    ma_unmap_file(&mf);
    if (nl > 4 && !strcmp(path + nl - 4, ".bin")) return inspect_qnn_binary(path);
    fprintf(stderr,
            "molmoact inspect: %s is not a file inspect reads (GGUF, safetensors, .npz, .npy, a QNN context binary .bin, "
            "or a checkpoint or context directory)\n",
            path);
    return 1;
}

int cmd_inspect_a(cli_args *a) {
    if (session_settings(a)) return 1;
    return cmd_inspect(a->pos[0]);
}
