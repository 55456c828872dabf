/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L
#include "model/checkpoint.h"
#include "io/jsonline.h"

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <zlib.h>

#include "io/mapfile.h"
#include "model/lerobot.h"
#include "core/env.h"
#include "model/manifest.h"

/* processor_config.json (as the HF converter writes it; its image processor nested under
 * "image_processor"): the column tokens of a single crop, and every image setting checked against
 * what this runtime implements, so a release that differs is refused by name instead of running
 * silently wrong. Absent file: the released processor's settings. */
static ma_status read_processor(ma_model *m, ma_error *err) {
    char *path = ma_path_join(m->host_dir ? m->host_dir : m->dir, "processor_config.json");
    if (!path) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
    m->col_tokens = 0;
    if (!ma_is_file(path)) {
        free(path);
        return MA_OK;
    }
    char *text;
    ma_status s = ma_read_file(path, 1u << 20, &text, NULL, err);
    if (s) {
        free(path);
        return s;
    }
    cJSON *root;
    s = ma_json_parse_object(text, strlen(text), path, &root, err);
    free(text);
    if (s) {
        free(path);
        return s;
    }
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(root, "use_single_crop_col_tokens");
    const cJSON *image = cJSON_GetObjectItemCaseSensitive(root, "image_use_col_tokens");
    if (cJSON_IsBool(single)) m->col_tokens = cJSON_IsTrue(single);
    else m->col_tokens = image ? cJSON_IsTrue(image) : 1;
    const ma_config *c = &m->cfg;
    const cJSON *ip = cJSON_GetObjectItemCaseSensitive(root, "image_processor");
    if (!ip) ip = root; /* an image processor config saved on its own */
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(ip, "crop_mode")) && !cJSON_IsNull(v) &&
        (!cJSON_IsString(v) || strcmp(v->valuestring, "resize")))
        s = ma_fail(err, MA_ERR_UNSUPPORTED,
                    "%s: image_processor.crop_mode \"%s\" is not implemented (only \"resize\": one 378x378 crop per "
                    "camera)",
                    path, cJSON_IsString(v) ? v->valuestring : "?");
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(ip, "size");
    if (!s && size && !cJSON_IsNull(size)) {
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(size, "height"), *w = cJSON_GetObjectItemCaseSensitive(size, "width");
        if (!cJSON_IsNumber(h) || !cJSON_IsNumber(w) || (int)h->valuedouble != c->image_h || (int)w->valuedouble != c->image_w)
            s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: image_processor.size is not {height: %d, width: %d}, the ViT's input size", path,
                        c->image_h, c->image_w);
    }
    if (!s && (v = cJSON_GetObjectItemCaseSensitive(ip, "resample")) && !cJSON_IsNull(v) && (!cJSON_IsNumber(v) || v->valuedouble != 2))
        s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: image_processor.resample must be 2 (bilinear, as implemented)", path);
    static const char *const norms[2] = {"image_mean", "image_std"};
    for (int k = 0; k < 2 && !s; k++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(ip, norms[k]);
        if (!a || cJSON_IsNull(a)) continue;
        int ok = cJSON_IsArray(a) && cJSON_GetArraySize(a) == 3;
        for (const cJSON *e = ok ? a->child : NULL; e; e = e->next) ok = ok && cJSON_IsNumber(e) && e->valuedouble == 0.5;
        if (!ok)
            s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: image_processor.%s must be [0.5, 0.5, 0.5] (pixels to [-1, 1], as implemented)", path,
                        norms[k]);
    }
    if (!s && (v = cJSON_GetObjectItemCaseSensitive(ip, "patch_size")) && !cJSON_IsNull(v) &&
        (!cJSON_IsNumber(v) || (int)v->valuedouble != c->patch))
        s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: image_processor.patch_size must be the ViT's patch, %d", path, c->patch);
    if (!s && (v = cJSON_GetObjectItemCaseSensitive(ip, "pooling_size")) && !cJSON_IsNull(v)) {
        int ok = cJSON_IsArray(v) && cJSON_GetArraySize(v) == 2;
        for (const cJSON *e = ok ? v->child : NULL; e; e = e->next) ok = ok && cJSON_IsNumber(e) && e->valuedouble == 2;
        if (!ok) s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: image_processor.pooling_size must be [2, 2] (as implemented)", path);
    }
    if (!s && (v = cJSON_GetObjectItemCaseSensitive(ip, "do_convert_rgb")) && cJSON_IsFalse(v))
        s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: image_processor.do_convert_rgb false is not implemented (frames are converted to RGB)",
                    path);
    cJSON_Delete(root);
    free(path);
    return s;
}

static ma_status build_weightset(ma_model *m, ma_error *err) {
    size_t n = m->st.count;
    const char **names = ma_calloc(n ? n : 1, sizeof *names, err, "names");
    ma_dtype *dts = ma_calloc(n ? n : 1, sizeof *dts, err, "dtypes");
    int *nds = ma_calloc(n ? n : 1, sizeof *nds, err, "ndims");
    int64_t(*shapes)[MA_MAX_DIMS] = ma_calloc(n ? n : 1, sizeof *shapes, err, "shapes");
    const void **datas = ma_calloc(n ? n : 1, sizeof *datas, err, "datas");
    ma_status s = MA_ERR_NOMEM;
    if (names && dts && nds && shapes && datas) {
        for (size_t i = 0; i < n; i++) {
            const ma_st_tensor *t = &m->st.tensors[i];
            names[i] = t->name;
            dts[i] = t->dtype;
            nds[i] = t->ndim;
            memcpy(shapes[i], t->shape, sizeof shapes[i]);
            datas[i] = t->data;
        }
        s = ma_ws_init(&m->ws, m->dir, n, names, dts, nds, (const int64_t(*)[MA_MAX_DIMS])shapes, datas, err);
    }
    free(names);
    free(dts);
    free(nds);
    free(shapes);
    free(datas);
    return s;
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static int by_tensor_name(const void *a, const void *b) {
    const ma_st_tensor *x = *(const ma_st_tensor *const *)a, *y = *(const ma_st_tensor *const *)b;
    return strcmp(x->name, y->name);
}

ma_status ma_checkpoint_fingerprint(const ma_safetensors *st, char out[17], ma_error *err) {
    const ma_st_tensor **order = ma_calloc(st->count ? st->count : 1, sizeof *order, err, "fingerprint");
    if (!order) return MA_ERR_NOMEM;
    for (size_t i = 0; i < st->count; i++) order[i] = &st->tensors[i];
    qsort(order, st->count, sizeof *order, by_tensor_name);
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < st->count; i++) {
        const ma_st_tensor *t = order[i];
        uLong crc = crc32(0L, Z_NULL, 0);
        for (size_t off = 0; off < t->nbytes;) {
            const size_t chunk = t->nbytes - off > (1u << 30) ? (1u << 30) : t->nbytes - off;
            crc = crc32(crc, (const Bytef *)t->data + off, (uInt)chunk);
            off += chunk;
        }
        ma_mapfile_release(t->data, t->nbytes); /* read once: not kept resident (a full-size checkpoint is 11 GB) */
        const int64_t desc[4] = {(int64_t)t->dtype, (int64_t)t->ndim, (int64_t)t->nbytes, (int64_t)crc};
        h = fnv1a(h, t->name, strlen(t->name) + 1);
        h = fnv1a(h, desc, sizeof desc);
        h = fnv1a(h, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    }
    free(order);
    snprintf(out, 17, "%016llx", (unsigned long long)h);
    return MA_OK;
}


/* the variable that picks a slot's variant: action_step only for the action expert, as the
 * reference deployment's ACTION_CTX_SUFFIX (action_context is one small context, kept as is) */
static const char *slot_suffix(const ma_settings *st, int slot) {
    if (!st) return "";
    if (slot == 0) return st->suffix[MA_SUFFIX_VISION];
    if (slot >= 2 && slot <= 5) return st->suffix[MA_SUFFIX_LLM];
    if (slot == 7) return st->suffix[MA_SUFFIX_ACTION];
    return "";
}

void ma_context_name(int slot, const char *suffix, char *out, size_t cap) {
    const char *sfx = suffix ? suffix : "";
    if (slot == 1 || slot == 6) sfx = "";
    snprintf(out, cap, "%s%s.gguf", MA_CONTEXT_NAMES[slot], sfx);
}

void ma_model_context_name(const ma_model *m, int slot, char *out, size_t cap) {
    ma_context_name(slot, slot_suffix(&m->set, slot), out, cap);
}

int ma_is_context_dir(const char *dir) { return ma_is_context_dir_with(dir, NULL); }

int ma_is_context_dir_with(const char *dir, const ma_settings *st) {
    char name[128];
    ma_context_name(0, slot_suffix(st, 0), name, sizeof name);
    char *p = ma_path_join(dir, name);
    int ok = p && ma_is_file(p);
    free(p);
    if (ok) return 1;
    p = ma_path_join(dir, "embed.gguf");
    ok = p && ma_is_file(p);
    free(p);
    return ok;
}


/* a context's recorded prompt length (llm and action contexts; the llm contexts of an older
 * compile have none): every context of the set must agree */
static ma_status note_prompt_seq(ma_model *m, int slot, const ma_gguf *g, const char *name, ma_error *err) {
    if (slot < 2) return MA_OK;
    int64_t seq;
    ma_status s = ma_gguf_get_i64(g, "molmoact.prompt_seq", &seq, NULL);
    if (s) return slot >= 6 ? ma_fail(err, MA_ERR_FORMAT, "%s: metadata key molmoact.prompt_seq is missing", name) : MA_OK;
    if (seq < 1 || seq > MA_MAX_PROMPT_SEQ)
        return ma_fail(err, MA_ERR_FORMAT, "%s: molmoact.prompt_seq %lld out of range", name, (long long)seq);
    if (m->prompt_seq && m->prompt_seq != seq)
        return ma_fail(err, MA_ERR_FORMAT, "%s: compiled for prompt length %lld, %s for %d: compile them again with one --prompt-seq", name,
                       (long long)seq, m->prompt_seq_file, m->prompt_seq);
    if (!m->prompt_seq) snprintf(m->prompt_seq_file, sizeof m->prompt_seq_file, "%s", name);
    m->prompt_seq = (int)seq;
    return MA_OK;
}

static int precision_type(const char *p, ma_dtype *dt) {
    if (!strcmp(p, "f16")) *dt = MA_DT_F16;
    else if (!strcmp(p, "bf16")) *dt = MA_DT_BF16;
    else if (!strcmp(p, "q8_0")) *dt = MA_DT_Q8_0;
    else if (!strcmp(p, "q4_0")) *dt = MA_DT_Q4_0;
    else if (!strcmp(p, "f32")) *dt = MA_DT_F32;
    else return 0;
    return 1;
}

/* open and check one context file: format, component, precision tag against its tensors,
 * layer range, prompt length, and the embedded config (equal across files) */
/* the set's fingerprint, and the first file that gave it (for the error naming both) */
typedef struct {
    char fp[24], file[160];
    char *config_json;
    char config_file[160];
    ma_manifest mf;
    char id[8][24], id_file[8][160]; /* each context's compile id, checked once every fingerprint is */
} set_check;

static void note_compile_id(set_check *sc, int slot, const ma_gguf *g, const char *file) {
    if (ma_gguf_get_str(g, "molmoact.compile_id", sc->id[slot], sizeof sc->id[slot], NULL) != MA_OK)
        snprintf(sc->id[slot], sizeof sc->id[slot], "?");
    snprintf(sc->id_file[slot], sizeof sc->id_file[slot], "%s", file);
}

/* every context was written by the compile the directory's manifest names for it */
static ma_status check_compile_ids(const set_check *sc, ma_error *err) {
    for (int slot = 0; slot < 8; slot++) {
        if (!sc->id_file[slot][0]) continue;
        const char *file = sc->id_file[slot], *id = sc->id[slot];
        const ma_manifest_entry *e = ma_manifest_find(&sc->mf, file);
        if (!e || !e->compile_id[0])
            return ma_fail(err, MA_ERR_FORMAT,
                           "%s is not listed in manifest.json (left by a compile that did not finish, or copied in?); "
                           "compile the directory again",
                           file);
        if (!strcmp(id, "?")) return ma_fail(err, MA_ERR_FORMAT, "%s: metadata key molmoact.compile_id is missing", file);
        if (strcmp(id, e->compile_id))
            return ma_fail(err, MA_ERR_FORMAT,
                           "%s was written by compile %s, but manifest.json lists compile %s for it: the directory "
                           "mixes two compiles (one interrupted while it moved files in?); compile it again",
                           file, id, e->compile_id);
    }
    return MA_OK;
}

/* the host files (config, norm stats, tokenizer, processor config) are those compile wrote */
static ma_status check_host_files(const char *dir, const set_check *sc, const char *norm_stats, ma_error *err) {
    const char *names[4] = {norm_stats, "tokenizer.json", "processor_config.json", "config.json"};
    for (int i = 0; i < 4; i++) {
        const ma_manifest_entry *e = ma_manifest_find(&sc->mf, names[i]);
        char *p = ma_path_join(dir, names[i]);
        if (!p) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
        const int present = ma_is_file(p);
        ma_status s = MA_OK;
        char h[17];
        uint64_t bytes = 0;
        if (!e && present)
            s = ma_fail(err, MA_ERR_FORMAT, "%s: %s is not listed in manifest.json (not written by compile); remove it or compile again",
                        dir, names[i]);
        else if (e && !present) s = ma_fail(err, MA_ERR_IO, "%s: %s is missing (manifest.json lists it)", dir, names[i]);
        else if (e && !(s = ma_manifest_hash_file(p, h, &bytes, err)) && (strcmp(h, e->fnv64) || bytes != e->bytes))
            s = ma_fail(err, MA_ERR_FORMAT,
                        "%s: %s changed after compile (%llu bytes, hash %s; manifest.json: %llu bytes, hash %s); "
                        "restore it, or compile the directory again",
                        dir, names[i], (unsigned long long)bytes, h, (unsigned long long)e->bytes, e->fnv64);
        free(p);
        if (s) return s;
    }
    return MA_OK;
}

static ma_status check_fingerprint(set_check *sc, const ma_gguf *g, const char *file, ma_error *err) {
    char fp[24];
    ma_status s = ma_gguf_get_str(g, "molmoact.source_fingerprint", fp, sizeof fp, err);
    if (s) return ma_error_wrap(err, s, "%s (compiled by an older molmoact? compile it again)", file);
    if (!sc->fp[0]) {
        snprintf(sc->fp, sizeof sc->fp, "%s", fp);
        snprintf(sc->file, sizeof sc->file, "%s", file);
    } else if (strcmp(sc->fp, fp))
        return ma_fail(err, MA_ERR_FORMAT,
                       "%s and %s were compiled from different checkpoints (fingerprints %s and %s); "
                       "every context of a directory must come from one checkpoint",
                       sc->file, file, sc->fp, fp);
    return MA_OK;
}

/* is `name` a line of the context's molmoact.kept_tensors? */
static int name_listed(const ma_gguf *g, const char *key, const char *name) {
    const ma_gguf_kv *kv = ma_gguf_find_kv(g, key);
    if (!kv || kv->type != MA_GGUF_STRING) return 0;
    const size_t l = strlen(name);
    const char *p = kv->v.s.p, *end = p + kv->v.s.len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        if (n == l && !memcmp(p, name, l)) return 1;
        p += n + 1;
    }
    return 0;
}

/* a context's compute plan (compile --compute): molmoact.compute, "fp32" when absent (contexts
 * compiled before plans existed) */
static ma_status context_compute(const ma_gguf *g, const char *label, ma_compute *out, ma_error *err) {
    *out = MA_COMPUTE_F32;
    const ma_gguf_kv *kv = ma_gguf_find_kv(g, "molmoact.compute");
    if (!kv) return MA_OK;
    if (kv->type != MA_GGUF_STRING) return ma_fail(err, MA_ERR_FORMAT, "%s: metadata key molmoact.compute is not a string", label);
    if (kv->v.s.len == 4 && !memcmp(kv->v.s.p, "bf16", 4)) *out = MA_COMPUTE_BF16;
    else if (kv->v.s.len == 3 && !memcmp(kv->v.s.p, "f16", 3)) *out = MA_COMPUTE_F16;
    else if (!(kv->v.s.len == 4 && !memcmp(kv->v.s.p, "fp32", 4)))
        return ma_fail(err, MA_ERR_FORMAT, "%s: compute plan \"%.*s\" (this build knows fp32, bf16 and f16)", label,
                       kv->v.s.len > 32 ? 32 : (int)kv->v.s.len, kv->v.s.p);
    return MA_OK;
}

/* settings.compute: -1 ("" or "context": each matrix's own plan), or the plan every matrix gets
 * (ma_settings_set allows no other value) */
static int settings_compute(const ma_settings *st) {
    const char *e = st->compute;
    if (!*e || !strcmp(e, "context")) return -1;
    return !strcmp(e, "bf16") ? MA_COMPUTE_BF16 : !strcmp(e, "f16") ? MA_COMPUTE_F16 : MA_COMPUTE_F32;
}

/* each matrix's compute: its context's plan, except the tensors it lists in
 * molmoact.compute_fp32_tensors (compile --compute-keep); settings.compute overrides all */
static ma_status apply_compute(ma_model *m, ma_error *err) {
    (void)err;
    const int force = settings_compute(&m->set);
    m->ws.compute_force = force;
    if (force >= 0) /* what every matrix gets, for the reports and the parity gate */
        for (int i = 0; i < 3; i++) snprintf(m->compute[i], sizeof m->compute[i], "%s", ma_compute_name((ma_compute)force));
    if (!m->from_contexts) return MA_OK;
    for (int i = 0; i < 8; i++)
        for (size_t j = 0; j < m->ctx[i].n_tensors && (m->ctx_compute[i] == MA_COMPUTE_BF16 || m->ctx_compute[i] == MA_COMPUTE_F16); j++) {
            const ma_gguf_tensor *t = &m->ctx[i].tensors[j];
            ma_wref *r = ma_ws_find(&m->ws, t->name);
            if (r && r->ndim == 2 && !name_listed(&m->ctx[i], "molmoact.compute_fp32_tensors", t->name)) r->compute = m->ctx_compute[i];
        }
    return MA_OK;
}

/* a context file that is not there, where the directory holds variants of it with a suffix
 * (compile --suffix for every component): the error names one and the variable that picks it */
static ma_status missing_context_hint(const ma_model *m, int slot, const char *name, ma_status s, ma_error *err) {
    static const char *vars[8] = {
        "MOLMOACT_VISION_CTX_SUFFIX", NULL, "MOLMOACT_LLM_CTX_SUFFIX",   "MOLMOACT_LLM_CTX_SUFFIX", "MOLMOACT_LLM_CTX_SUFFIX",
        "MOLMOACT_LLM_CTX_SUFFIX",    NULL, "MOLMOACT_ACTION_CTX_SUFFIX"};
    if (!vars[slot]) return s;
    DIR *d = opendir(m->dir);
    if (!d) return s;
    const char *base = MA_CONTEXT_NAMES[slot];
    const size_t bl = strlen(base);
    char found[128] = "";
    for (struct dirent *e; (e = readdir(d)) && !found[0];) {
        const size_t n = strlen(e->d_name);
        /* BASE + S + ".gguf" with S a suffix (llm_split0 must not take llm_split00's files) */
        if (n > bl + 5 && !strncmp(e->d_name, base, bl) && !strcmp(e->d_name + n - 5, ".gguf") &&
            !(e->d_name[bl] >= '0' && e->d_name[bl] <= '9') && n - bl - 5 < sizeof found)
            snprintf(found, sizeof found, "%.*s", (int)(n - bl - 5), e->d_name + bl);
    }
    closedir(d);
    if (!found[0]) return s;
    return ma_fail(err, MA_ERR_IO, "%s/%s: not there; the directory holds %s%s.gguf: pick it with %s=%s", m->dir, name, base, found,
                   vars[slot], found);
}

static ma_status open_context(ma_model *m, int slot, set_check *sc, ma_error *err) {
    char name[160], label[64], comp[64], prec[16];
    ma_model_context_name(m, slot, name, sizeof name);
    char *path = ma_path_join(m->dir, name);
    if (!path) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
    ma_gguf *g = &m->ctx[slot];
    ma_status s = ma_gguf_open(g, path, err);
    if (s && !ma_is_file(path)) s = missing_context_hint(m, slot, name, s, err);
    free(path);
    if (s) return s;
    snprintf(label, sizeof label, "%s", name);
    int64_t fmt;
    if ((s = ma_gguf_get_i64(g, "molmoact.format", &fmt, err)) || (s = ma_gguf_get_str(g, "molmoact.component", comp, sizeof comp, err)))
        return ma_error_wrap(err, s, "%s", label);
    if (fmt != MA_CONTEXT_FORMAT)
        return ma_fail(err, MA_ERR_FORMAT, "%s: context format %lld (this build reads %d)", label, (long long)fmt, MA_CONTEXT_FORMAT);
    if (strcmp(comp, ma_context_component(slot)))
        return ma_fail(err, MA_ERR_FORMAT, "%s: holds component %s, expected %s", label, comp, ma_context_component(slot));
    ma_dtype want;
    if ((s = ma_gguf_get_str(g, "molmoact.precision", prec, sizeof prec, err))) return ma_error_wrap(err, s, "%s", label);
    if (!precision_type(prec, &want)) return ma_fail(err, MA_ERR_FORMAT, "%s: unknown precision tag %s", label, prec);
    for (size_t i = 0; i < g->n_tensors; i++) {
        const ma_gguf_tensor *t = &g->tensors[i];
        int vec = t->n_dims == 1 || !strncmp(t->name, "molmoact.", 9); /* vectors and f32 tables */
        /* matrices: the tagged type, or f16 where rows do not fill quantisation blocks */
        /* matrices: the tagged type, f16 where rows do not fill quantisation blocks, or a more
         * precise type for a tensor the context lists as kept (compile --keep) */
        int ok = vec ? t->dtype == MA_DT_F32
                     : (t->dtype == want || (t->dtype == MA_DT_F16 && (want == MA_DT_Q8_0 || want == MA_DT_Q4_0) && t->ne[0] % 32));
        if (!ok && !vec && name_listed(g, "molmoact.kept_tensors", t->name))
            ok = (want == MA_DT_Q4_0 && (t->dtype == MA_DT_Q8_0 || t->dtype == MA_DT_F16 || t->dtype == MA_DT_BF16)) ||
                 (want == MA_DT_Q8_0 && (t->dtype == MA_DT_F16 || t->dtype == MA_DT_BF16));
        if (!ok)
            return ma_fail(err, MA_ERR_FORMAT, "%s: precision tag %s but tensor %s is %s", label, prec, t->name, ma_dtype_name(t->dtype));
    }
    int which = ma_context_group(slot);
    if (slot != 1) snprintf(m->precision[which], sizeof m->precision[which], "%s", prec);
    if (slot != 1) ma_gguf_get_str(g, "molmoact.source_dtype", m->source_dtype[which], sizeof m->source_dtype[which], NULL);
    if ((s = context_compute(g, label, &m->ctx_compute[slot], err))) return s;
    if (slot != 1) snprintf(m->compute[which], sizeof m->compute[which], "%s", ma_compute_name(m->ctx_compute[slot]));
    if ((s = check_fingerprint(sc, g, label, err))) return s;
    note_compile_id(sc, slot, g, label);
    /* --preload: this process's own contexts read in at open (the others it only checks) */
    if (m->set.preload) ma_mapfile_preload(&g->map);
    const ma_gguf_kv *cj = ma_gguf_find_kv(g, "molmoact.config_json");
    if (!cj || cj->type != MA_GGUF_STRING) return ma_fail(err, MA_ERR_FORMAT, "%s: metadata key molmoact.config_json is missing", label);
    if (!sc->config_json) {
        sc->config_json = malloc((size_t)cj->v.s.len + 1);
        if (!sc->config_json) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
        memcpy(sc->config_json, cj->v.s.p, (size_t)cj->v.s.len);
        sc->config_json[cj->v.s.len] = '\0';
        snprintf(sc->config_file, sizeof sc->config_file, "%s", label);
    } else if (strlen(sc->config_json) != cj->v.s.len || memcmp(sc->config_json, cj->v.s.p, (size_t)cj->v.s.len))
        return ma_fail(err, MA_ERR_FORMAT, "%s and %s embed different configs (compiled from different models)", sc->config_file, label);
    return MA_OK;
}

static ma_status check_context_ranges(ma_model *m, int slot, ma_error *err) {
    char name[160];
    ma_model_context_name(m, slot, name, sizeof name);
    const ma_gguf *g = &m->ctx[slot];
    ma_status s;
    if (slot >= 2 && slot <= 5) {
        int64_t first, last;
        if ((s = ma_gguf_get_i64(g, "molmoact.layer_first", &first, err)) || (s = ma_gguf_get_i64(g, "molmoact.layer_last", &last, err)))
            return ma_error_wrap(err, s, "%s", name);
        if (first != m->split_first[slot - 2] || last != m->split_last[slot - 2])
            return ma_fail(err, MA_ERR_FORMAT, "%s: holds layers [%lld, %lld), split %d is [%d, %d)", name, (long long)first,
                           (long long)last, slot - 2, m->split_first[slot - 2], m->split_last[slot - 2]);
    }
    return note_prompt_seq(m, slot, g, name, err);
}

static ma_status weightset_from_contexts(ma_model *m, ma_error *err) {
    size_t n = 0;
    for (int i = 0; i < 8; i++) n += m->ctx[i].n_tensors;
    const char **names = ma_calloc(n ? n : 1, sizeof *names, err, "names");
    ma_dtype *dts = ma_calloc(n ? n : 1, sizeof *dts, err, "dtypes");
    int *nds = ma_calloc(n ? n : 1, sizeof *nds, err, "ndims");
    int64_t(*shapes)[MA_MAX_DIMS] = ma_calloc(n ? n : 1, sizeof *shapes, err, "shapes");
    const void **datas = ma_calloc(n ? n : 1, sizeof *datas, err, "datas");
    ma_status s = MA_ERR_NOMEM;
    if (names && dts && nds && shapes && datas) {
        size_t k = 0;
        for (int i = 0; i < 8; i++)
            for (size_t j = 0; j < m->ctx[i].n_tensors; j++, k++) {
                const ma_gguf_tensor *t = &m->ctx[i].tensors[j];
                names[k] = t->name;
                dts[k] = t->dtype;
                nds[k] = (int)t->n_dims;
                for (uint32_t d = 0; d < t->n_dims; d++) shapes[k][d] = t->ne[t->n_dims - 1 - d];
                datas[k] = t->data;
            }
        s = ma_ws_init(&m->ws, m->dir, n, names, dts, nds, (const int64_t(*)[MA_MAX_DIMS])shapes, datas, err);
        if (!s) m->ws.panel_layout = 1; /* contexts store matrices as GEMM panels */
    }
    free(names);
    free(dts);
    free(nds);
    free(shapes);
    free(datas);
    return s;
}

ma_status ma_model_open(const char *dir, const char *norm_tag, ma_model *m, ma_error *err) {
    return ma_model_open_with(dir, norm_tag, MA_PART_ALL, NULL, m, err);
}

ma_status ma_model_open_parts(const char *dir, const char *norm_tag, unsigned parts, ma_model *m, ma_error *err) {
    return ma_model_open_with(dir, norm_tag, parts, NULL, m, err);
}

ma_status ma_model_open_with(const char *dir, const char *norm_tag, unsigned parts, const ma_settings *st, ma_model *m, ma_error *err) {
    memset(m, 0, sizeof *m);
    if (st) m->set = *st;
    else ma_settings_init(&m->set);
    ma_status s;
    set_check sc;
    memset(&sc, 0, sizeof sc);
    ma_lerobot *lr = NULL;
    m->dir = strdup(dir);
    m->parts = parts;
    if (!m->dir) {
        s = ma_fail(err, MA_ERR_NOMEM, "out of memory");
        goto fail;
    }
    m->from_contexts = ma_is_context_dir_with(dir, &m->set);
    if (m->from_contexts) {
        if ((s = ma_manifest_load(dir, &sc.mf, err))) {
            if (s == MA_ERR_IO)
                s = ma_error_wrap(err, MA_ERR_FORMAT,
                                  "a context directory needs its manifest (compiled by an older molmoact, or by a compile that "
                                  "did not finish? compile it again)");
            goto fail;
        }
        for (int slot = 0; slot < 8; slot++)
            if ((parts & ma_context_part(slot)) && (s = open_context(m, slot, &sc, err))) goto fail;
        if (!sc.config_json) {
            s = ma_fail(err, MA_ERR_ARG, "%s: no context requested", dir);
            goto fail;
        }
        /* the contexts this process does not open: their precision tags (for parity gates,
         * reports) and their fingerprints, so that every process refuses a mixed set (a file
         * that cannot be read is left to the process that opens it) */
        for (int slot = 0; slot < 8; slot++) {
            int which = ma_context_group(slot);
            if (parts & ma_context_part(slot)) continue;
            char name[160];
            ma_model_context_name(m, slot, name, sizeof name);
            char *path = ma_path_join(dir, name);
            ma_gguf g;
            if (path && ma_gguf_open(&g, path, NULL) == MA_OK) {
                if (slot != 1 && (!m->precision[which][0] || slot == 7)) { /* action: action_step's, the bulk of its weights */
                    ma_gguf_get_str(&g, "molmoact.precision", m->precision[which], sizeof m->precision[which], NULL);
                    ma_gguf_get_str(&g, "molmoact.source_dtype", m->source_dtype[which], sizeof m->source_dtype[which], NULL);
                    ma_compute cp;
                    if (context_compute(&g, name, &cp, NULL) == MA_OK)
                        snprintf(m->compute[which], sizeof m->compute[which], "%s", ma_compute_name(cp));
                }
                s = check_fingerprint(&sc, &g, name, err);
                if (!s) s = note_prompt_seq(m, slot, &g, name, err);
                note_compile_id(&sc, slot, &g, name);
                ma_gguf_close(&g);
            }
            free(path);
            if (s) goto fail;
        }
        if ((s = check_compile_ids(&sc, err))) goto fail;
        if ((s = ma_config_parse(sc.config_json, dir, &m->cfg, err))) goto fail;
        if ((s = check_host_files(dir, &sc, m->cfg.norm_stats_filename, err))) goto fail;
    } else if (ma_is_lerobot_dir(dir)) {
        /* a LeRobot policy: the base's HF config as LeRobot changes it at load, the statistics
         * of its processor pipelines, its base's tokenizer and processor config */
        lr = calloc(1, sizeof *lr);
        if (!lr) {
            s = ma_fail(err, MA_ERR_NOMEM, "out of memory");
            goto fail;
        }
        if ((s = ma_lerobot_open(dir, m->set.base_dir, m->set.hub_cache, lr, err))) goto fail;
        char *cj = NULL, label[PATH_MAX + 64];
        if ((s = ma_lerobot_config_json(lr, &cj, err))) goto fail;
        snprintf(label, sizeof label, "%s/config.json (the base of %s)", lr->base_dir, dir);
        s = ma_config_parse(cj, label, &m->cfg, err);
        free(cj);
        if (s) goto fail;
        m->lerobot = 1;
        if (!(m->host_dir = strdup(lr->base_dir))) {
            s = ma_fail(err, MA_ERR_NOMEM, "out of memory");
            goto fail;
        }
    } else {
        char *cfg_path = ma_path_join(dir, "config.json");
        if (!cfg_path) {
            s = ma_fail(err, MA_ERR_NOMEM, "out of memory");
            goto fail;
        }
        s = ma_config_load(cfg_path, &m->cfg, err);
        free(cfg_path);
        if (s) goto fail;
    }
    const ma_config *c = &m->cfg;
    ma_split_ranges(c->layers, m->split_first, m->split_last);
    if (m->from_contexts)
        for (int slot = 0; slot < 8; slot++)
            if ((parts & ma_context_part(slot)) && (s = check_context_ranges(m, slot, err))) goto fail;
    if (m->from_contexts) { /* a static prompt length asked for must be the compiled one */
        const int want = m->set.prompt_seq;
        if (want && m->prompt_seq && want != m->prompt_seq) {
            s = ma_fail(err, MA_ERR_ARG,
                        "%s: compiled for prompt length %d, the prompt length asked for (MOLMOACT_PROMPT_SEQ, "
                        "options.prompt_seq) is %d (leave it unset: the length is read from the contexts)",
                        m->prompt_seq_file, m->prompt_seq, want);
            goto fail;
        }
    }
    if (lr) m->ns = lr->ns; /* the policy's own statistics: no tags */
    else {
        char *ns_path = ma_path_join(dir, c->norm_stats_filename);
        if (!ns_path) {
            s = ma_fail(err, MA_ERR_NOMEM, "out of memory");
            goto fail;
        }
        s = ma_normstats_load(ns_path, norm_tag ? norm_tag : "libero", &m->ns, err);
        free(ns_path);
        if (s) goto fail;
    }
    if (m->from_contexts) s = weightset_from_contexts(m, err);
    else if (!(s = ma_st_open(&m->st, dir, err))) s = build_weightset(m, err);
    if (!s) s = apply_compute(m, err);
    if (s) goto fail;
    if (m->ws.n_lora) {
        if (!(parts & MA_PART_LORA_OK)) {
            s = ma_fail(err, MA_ERR_UNSUPPORTED,
                        "%s: %zu matrices carry unmerged LoRA adapters (%s, ...): compile the directory first, which merges "
                        "them (molmoact compile %s%s%s -o CTX_DIR), then run CTX_DIR",
                        dir, m->ws.n_lora, m->ws.lora_first, dir, m->set.base_dir[0] ? " --base " : "", m->set.base_dir);
            goto fail;
        }
        if (!lr || !lr->lora) {
            s = ma_fail(err, MA_ERR_FORMAT,
                        "%s: LoRA adapters (%s, ...) but no LoRA settings in config.json (train_mode_vlm \"lora\", lora_rank, "
                        "lora_alpha)%s",
                        dir, m->ws.lora_first, lr ? "" : ": a LeRobot policy's config.json (or PEFT's adapter_config.json) is needed");
            goto fail;
        }
        /* PEFT's scaling: lora_alpha / r (rsLoRA is not used by LeRobot's MolmoAct2); a scaling that
         * is not finite or is absurd (PEFT's configs use alpha about r to 4 r) is refused before
         * it is cast to float (undefined beyond float's range) */
        const double scaling = lr->lora_alpha / lr->lora_rank;
        if (!(scaling > 0 && scaling <= MA_LORA_MAX_SCALING)) {
            s = ma_fail(err, MA_ERR_RANGE, "%s: config.json lora_alpha %g / lora_rank %d = %g: the LoRA scaling must be in (0, %g]", dir,
                        lr->lora_alpha, lr->lora_rank, scaling, MA_LORA_MAX_SCALING);
            goto fail;
        }
        for (size_t i = 0; i < m->ws.count; i++)
            if (m->ws.refs[i].has_lora) {
                if (m->ws.refs[i].lora_rank != lr->lora_rank) {
                    s = ma_fail(err, MA_ERR_SHAPE, "%s: %s has LoRA rank %lld, config.json lora_rank %d", dir, m->ws.refs[i].name,
                                (long long)m->ws.refs[i].lora_rank, lr->lora_rank);
                    goto fail;
                }
                m->ws.refs[i].lora_scale = (float)scaling;
            }
    }
    if ((parts & MA_PART_VISION) && (s = ma_vision_bind(&m->ws, c, &m->vision, err))) goto fail;
    if ((parts & MA_PART_EMBED) && (s = ma_embed_bind(&m->ws, c, &m->embed, err))) goto fail;
    for (int i = 0; i < MA_NUM_SPLITS; i++)
        if ((parts & MA_PART_LLM(i)) && (s = ma_llm_bind(&m->ws, c, m->split_first[i], m->split_last[i], &m->llm[i], err))) goto fail;
    if ((parts & (MA_PART_ACTION_CONTEXT | MA_PART_ACTION_STEP)) &&
        (s = ma_expert_bind(&m->ws, c, !!(parts & MA_PART_ACTION_CONTEXT), !!(parts & MA_PART_ACTION_STEP), &m->expert, err)))
        goto fail;
    /* present in released checkpoints, unused by continuous-action inference */
    ma_ws_ignore(&m->ws, "lm_head.weight");
    ma_ws_ignore(&m->ws, "model.transformer.ln_f.weight");
    ma_ws_ignore(&m->ws, "model.transformer.rotary_emb.inv_freq");
    if ((m->from_contexts || parts == MA_PART_ALL) && (s = ma_ws_check_unused(&m->ws, err))) goto fail;
    if (parts & MA_PART_VISION) m->tokens_per_image = ma_vision_tokens(c, &m->vision);
    else {
        /* the sampler's size without binding the vision weights */
        m->tokens_per_image = c->pooled_h * c->pooled_w;
        for (size_t i = 0; i < m->ws.count; i++) {
            const char *nm = m->ws.refs[i].name;
            size_t l = strlen(nm);
            if (l >= 18 && !strcmp(nm + l - 18, "scout_mlp.2.weight") && m->ws.refs[i].ndim == 2)
                m->tokens_per_image = (int)(m->ws.refs[i].shape[0] / 2);
        }
        if (m->from_contexts) {
            int64_t k;
            if (ma_gguf_get_i64(&m->ctx[1], "molmoact.tokens_per_image", &k, NULL) == MA_OK) m->tokens_per_image = (int)k;
        }
    }
    if ((s = read_processor(m, err))) goto fail;
    char *tok_path = ma_path_join(m->host_dir ? m->host_dir : dir, "tokenizer.json");
    if (!tok_path) {
        s = ma_fail(err, MA_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((parts & MA_PART_EMBED) && ma_is_file(tok_path)) s = ma_tokenizer_load(tok_path, &m->tok, err);
    free(tok_path);
    if (s) goto fail;
    if (m->ns.action.dim > c->max_action_dim || m->ns.action_dim > c->max_action_dim) {
        s = ma_fail(err, MA_ERR_RANGE, "%s: norm_stats action_dim %d exceeds max_action_dim %d", c->norm_stats_filename,
                    m->ns.action_dim > c->max_action_dim ? m->ns.action_dim : m->ns.action.dim, c->max_action_dim);
        goto fail;
    }
    if (m->ns.action_horizon > c->max_action_horizon) {
        s = ma_fail(err, MA_ERR_RANGE, "%s: norm_stats action_horizon %d exceeds max_action_horizon %d", c->norm_stats_filename,
                    m->ns.action_horizon, c->max_action_horizon);
        goto fail;
    }
    free(sc.config_json);
    free(lr);
    return MA_OK;
fail:
    free(sc.config_json);
    free(lr);
    ma_model_close(m);
    return s;
}

void ma_model_close(ma_model *m) {
    if (!m) return;
    ma_vision_unbind(&m->vision);
    for (int i = 0; i < MA_NUM_SPLITS; i++) ma_llm_unbind(&m->llm[i]);
    ma_expert_unbind(&m->expert);
    ma_tokenizer_free(m->tok);
    ma_ws_free(&m->ws);
    ma_st_close(&m->st);
    for (int i = 0; i < 8; i++) ma_gguf_close(&m->ctx[i]);
    free(m->dir);
    free(m->host_dir);
    memset(m, 0, sizeof *m);
}
