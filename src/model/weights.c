/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L
#include "model/weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"

static int ref_cmp(const void *a, const void *b) { return strcmp(((const ma_wref *)a)->name, ((const ma_wref *)b)->name); }

/* name with `from` replaced by `to` at its end (NULL when it does not end so) */
static char *swap_suffix(const char *name, const char *from, const char *to) {
    const size_t n = strlen(name), f = strlen(from), t = strlen(to);
    if (n < f || strcmp(name + n - f, from)) return NULL;
    char *r = malloc(n - f + t + 1);
    if (!r) return NULL;
    memcpy(r, name, n - f);
    memcpy(r + n - f, to, t + 1);
    return r;
}

ma_status ma_ws_init(ma_weightset *ws, const char *label, size_t n, const char *const *names, const ma_dtype *dtypes, const int *ndims,
                     const int64_t (*shapes)[MA_MAX_DIMS], const void *const *datas, ma_error *err) {
    memset(ws, 0, sizeof *ws);
    ws->label = label;
    ws->compute_force = -1;
    /* the prefix every key carries: "model." (LeRobot), "model.base_model.model." (LeRobot with
     * its VLM wrapped for LoRA), or none (the HF layout) */
    int lerobot = n > 0, peft = n > 0, has_double = 0;
    for (size_t i = 0; i < n; i++) {
        if (strncmp(names[i], "model.", 6) != 0) lerobot = 0;
        if (strncmp(names[i], "model.base_model.model.", 23) != 0) peft = 0;
        if (strncmp(names[i], "model.model.", 12) == 0) has_double = 1;
    }
    const size_t skip = peft ? 23 : (lerobot && has_double) ? 6 : 0;
    ws->refs = ma_calloc(n ? n : 1, sizeof *ws->refs, err, label);
    ws->names = ma_calloc(n ? n : 1, sizeof *ws->names, err, label);
    if (!ws->refs || !ws->names) {
        ma_ws_free(ws);
        return MA_ERR_NOMEM;
    }
    ma_status s = MA_OK;
    for (size_t i = 0; i < n && !s; i++) {
        const char *nm = names[i] + skip;
        if (strstr(nm, ".lora_A.") || strstr(nm, ".lora_B.") || strstr(nm, ".lora_embedding_")) continue; /* attached below */
        char *own = swap_suffix(nm, ".base_layer.weight", ".weight");
        if (!own) own = swap_suffix(nm, ".base_layer.bias", ".bias");
        if (!own) own = strdup(nm);
        if (!own) {
            s = ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", label);
            break;
        }
        ma_wref *r = &ws->refs[ws->count];
        ws->names[ws->count] = own;
        r->name = own;
        r->dtype = dtypes[i];
        r->ndim = ndims[i];
        memcpy(r->shape, shapes[i], sizeof r->shape);
        r->data = datas[i];
        ws->count++;
    }
    if (!s) qsort(ws->refs, ws->count, sizeof *ws->refs, ref_cmp);
    for (size_t i = 1; !s && i < ws->count; i++)
        if (strcmp(ws->refs[i].name, ws->refs[i - 1].name) == 0)
            s = ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s appears twice", label, ws->refs[i].name);
    /* the adapters: X.lora_A.<adapter>.weight [r, cols] and X.lora_B.<adapter>.weight [rows, r] */
    for (size_t i = 0; i < n && !s; i++) {
        const char *nm = names[i] + skip, *a = strstr(nm, ".lora_A."), *b = strstr(nm, ".lora_B.");
        if (strstr(nm, ".lora_embedding_")) {
            s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: tensor %s: LoRA on an embedding is not supported", label, names[i]);
            break;
        }
        if (!a && !b) continue;
        const char *at = a ? a : b;
        if (strcmp(at + 8, "default.weight") && strcmp(at + 8, "weight")) {
            s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: tensor %s: a LoRA adapter other than the default one, or a LoRA bias", label,
                        names[i]);
            break;
        }
        char base[512];
        snprintf(base, sizeof base, "%.*s.weight", (int)(at - nm), nm);
        ma_wref *w = ma_ws_find(ws, base);
        if (!w || w->ndim != 2 || ndims[i] != 2) {
            s = ma_fail(err, MA_ERR_FORMAT, "%s: LoRA tensor %s has no matrix %s to adapt", label, names[i], base);
            break;
        }
        if (a) {
            if (shapes[i][1] != w->shape[1]) {
                s = ma_fail(err, MA_ERR_SHAPE, "%s: %s is [%lld, %lld], %s has %lld columns", label, names[i], (long long)shapes[i][0],
                            (long long)shapes[i][1], base, (long long)w->shape[1]);
                break;
            }
            w->lora_a = datas[i];
            w->lora_dtype_a = dtypes[i];
            if (w->lora_rank && w->lora_rank != shapes[i][0]) {
                s = ma_fail(err, MA_ERR_SHAPE, "%s: %s: rank %lld, lora_B says %lld", label, names[i], (long long)shapes[i][0],
                            (long long)w->lora_rank);
                break;
            }
            w->lora_rank = shapes[i][0];
        } else {
            if (shapes[i][0] != w->shape[0]) {
                s = ma_fail(err, MA_ERR_SHAPE, "%s: %s is [%lld, %lld], %s has %lld rows", label, names[i], (long long)shapes[i][0],
                            (long long)shapes[i][1], base, (long long)w->shape[0]);
                break;
            }
            w->lora_b = datas[i];
            w->lora_dtype_b = dtypes[i];
            if (w->lora_rank && w->lora_rank != shapes[i][1]) {
                s = ma_fail(err, MA_ERR_SHAPE, "%s: %s: rank %lld, lora_A says %lld", label, names[i], (long long)shapes[i][1],
                            (long long)w->lora_rank);
                break;
            }
            w->lora_rank = shapes[i][1];
        }
        if (w->lora_a && w->lora_b && !w->has_lora) {
            w->has_lora = 1;
            if (!ws->n_lora++) snprintf(ws->lora_first, sizeof ws->lora_first, "%s", w->name);
        }
    }
    for (size_t i = 0; !s && i < ws->count; i++)
        if ((ws->refs[i].lora_a != NULL) != (ws->refs[i].lora_b != NULL))
            s = ma_fail(err, MA_ERR_FORMAT, "%s: %s has lora_%s but not lora_%s", label, ws->refs[i].name, ws->refs[i].lora_a ? "A" : "B",
                        ws->refs[i].lora_a ? "B" : "A");
    if (s) ma_ws_free(ws);
    return s;
}

void ma_ws_free(ma_weightset *ws) {
    if (!ws) return;
    if (ws->names)
        for (size_t i = 0; i < ws->count; i++) free(ws->names[i]);
    for (size_t i = 0; i < ws->n_owned; i++) free(ws->owned[i]);
    free(ws->names);
    free(ws->refs);
    free(ws->owned);
    memset(ws, 0, sizeof *ws);
}

ma_wref *ma_ws_find(const ma_weightset *ws, const char *name) {
    size_t lo = 0, hi = ws->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(ws->refs[mid].name, name);
        if (c == 0) return &ws->refs[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

static int float_type(ma_dtype dt) {
    return dt == MA_DT_F32 || dt == MA_DT_F16 || dt == MA_DT_BF16 || dt == MA_DT_Q8_0 || dt == MA_DT_Q4_0;
}

static ma_status shape_err(const ma_weightset *ws, const ma_wref *r, const char *want, ma_error *err) {
    char have[128];
    ma_tensor t = ma_tensor_view(r->dtype, r->ndim, r->shape, NULL);
    return ma_fail(err, MA_ERR_SHAPE, "%s: tensor %s has shape %s, expected %s", ws->label, r->name, ma_shape_str(&t, have, sizeof have),
                   want);
}

int ma_ws_packed(const ma_weightset *ws, const ma_wref *r) {
    return ws->panel_layout && r->ndim == 2 && r->shape[0] % 16 == 0 && strncmp(r->name, "molmoact.", 9) != 0;
}

ma_status ma_ws_mat(ma_weightset *ws, const char *name, int64_t rows, int64_t cols, ma_mat *out, ma_error *err) {
    ma_wref *r = ma_ws_find(ws, name);
    if (!r) return ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s is missing", ws->label, name);
    char want[96];
    snprintf(want, sizeof want, "[%lld, %lld]", (long long)rows, (long long)cols);
    if (r->ndim != 2 || r->shape[0] != rows || r->shape[1] != cols) return shape_err(ws, r, want, err);
    if (!float_type(r->dtype)) return ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s has dtype %s", ws->label, name, ma_dtype_name(r->dtype));
    r->used = 1;
    out->dtype = r->dtype;
    out->rows = rows;
    out->cols = cols;
    out->data = r->data;
    out->name = r->name;
    out->panels = ma_ws_packed(ws, r);
    out->compute = ws->compute_force >= 0 ? (ma_compute)ws->compute_force : r->compute;
    return MA_OK;
}

/* an optional vector: *out = NULL when absent */
static ma_status vec_opt(ma_weightset *ws, const char *name, int64_t n, float **out, ma_error *err) {
    *out = NULL;
    ma_wref *r = ma_ws_find(ws, name);
    if (!r) return MA_OK;
    char want[64];
    snprintf(want, sizeof want, "[%lld]", (long long)n);
    if (r->ndim != 1 || r->shape[0] != n) return shape_err(ws, r, want, err);
    if (!float_type(r->dtype) || r->dtype == MA_DT_Q8_0 || r->dtype == MA_DT_Q4_0)
        return ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s has dtype %s", ws->label, name, ma_dtype_name(r->dtype));
    if (ma_grow_array(&ws->owned, &ws->cap_owned, ws->n_owned, 1, sizeof *ws->owned))
        return ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", ws->label);
    float *v = ma_malloc((size_t)(n ? n : 1), sizeof(float), err, name);
    if (!v) return MA_ERR_NOMEM;
    ma_convert_to_f32(r->dtype, r->data, 0, n, v);
    ws->owned[ws->n_owned++] = v;
    r->used = 1;
    *out = v;
    return MA_OK;
}

ma_status ma_ws_vec(ma_weightset *ws, const char *name, int64_t n, float **out, ma_error *err) {
    ma_status s = vec_opt(ws, name, n, out, err);
    if (s) return s;
    if (!*out) return ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s is missing", ws->label, name);
    return MA_OK;
}

void ma_ws_ignore(ma_weightset *ws, const char *name) {
    size_t len = strlen(name);
    for (size_t i = 0; i < ws->count; i++)
        if (strncmp(ws->refs[i].name, name, len) == 0) ws->refs[i].used = 2; /* known, not needed */
}

ma_status ma_ws_check_unused(const ma_weightset *ws, ma_error *err) {
    for (size_t i = 0; i < ws->count; i++)
        if (!ws->refs[i].used)
            return ma_fail(err, MA_ERR_FORMAT, "%s: tensor %s is not part of this model configuration", ws->label, ws->refs[i].name);
    return MA_OK;
}
