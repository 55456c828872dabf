/* SPDX-License-Identifier: Apache-2.0 */
/* Each component's precision and stored dtypes (molmoact_get_component, include/molmoact.h): read
 * from the files the engine opened, the context files of a context directory (their headers), the
 * checkpoint's tensor table otherwise. */
#include "molmoact.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/internal.h"
#include "io/gguf.h"
#include "io/mapfile.h"
#include "model/checkpoint.h"


static void add_bytes(molmoact_component *c, ma_dtype dt, uint64_t bytes) {
    const char *name = ma_dtype_name(dt);
    for (int i = 0; i < c->n_dtypes; i++)
        if (!strcmp(c->dtype[i], name)) {
            c->bytes[i] += bytes;
            return;
        }
    if (c->n_dtypes == MOLMOACT_MAX_DTYPES) return;
    snprintf(c->dtype[c->n_dtypes], sizeof c->dtype[0], "%s", name);
    c->bytes[c->n_dtypes++] = bytes;
}

static void sort_dtypes(molmoact_component *c) {
    for (int i = 1; i < c->n_dtypes; i++)
        for (int k = i; k > 0 && c->bytes[k] > c->bytes[k - 1]; k--) {
            char t[8];
            memcpy(t, c->dtype[k], sizeof t);
            memcpy(c->dtype[k], c->dtype[k - 1], sizeof t);
            memcpy(c->dtype[k - 1], t, sizeof t);
            const uint64_t b = c->bytes[k];
            c->bytes[k] = c->bytes[k - 1];
            c->bytes[k - 1] = b;
        }
}

/* the component (slot) of a checkpoint tensor, as `molmoact compile` places it (runtime/compile.c) */
static int slot_of(const ma_model *m, const char *name) {
    if (!strncmp(name, "model.vision_backbone.", 22)) return 0;
    if (!strncmp(name, "model.transformer.wte.", 22)) return 1;
    if (!strcmp(name, "model.action_expert.context_k_proj.weight") || !strcmp(name, "model.action_expert.context_v_proj.weight")) return 6;
    if (!strncmp(name, "model.action_expert.", 20)) return 7;
    int layer;
    if (sscanf(name, "model.transformer.blocks.%d.", &layer) == 1)
        for (int s = 0; s < 4; s++)
            if (layer >= m->split_first[s] && layer < m->split_last[s]) return 2 + s;
    return -1;
}

int molmoact_component_count(void) { return MA_N_CONTEXTS; }

molmoact_status molmoact_get_component(molmoact *engine, int index, molmoact_component *out, molmoact_error *err) {
    if (err) {
        err->code = MOLMOACT_OK;
        err->message[0] = '\0';
    }
    ma_error me = {0};
    ma_status st = MA_OK;
    ma_engine *e = engine ? molmoact_internal_engine(engine) : NULL;
    if (!e) st = ma_fail(&me, MA_ERR_ARG, "molmoact_get_component: the engine is NULL (closed, or never opened)");
    else if (!out || out->struct_size != sizeof *out)
        st = ma_fail(&me, MA_ERR_ARG, "molmoact_get_component: out%s", out ? ".struct_size is not sizeof(molmoact_component)" : " is NULL");
    else if (index < 0 || index >= MA_N_CONTEXTS)
        st = ma_fail(&me, MA_ERR_RANGE, "molmoact_get_component: index %d is not in [0, %d)", index, MA_N_CONTEXTS);
    if (st) return molmoact_internal_report(err, st, &me);
    const uint32_t size = out->struct_size;
    memset(out, 0, sizeof *out);
    out->struct_size = size;
    const ma_model *m = &e->host;
    snprintf(out->name, sizeof out->name, "%s", MA_CONTEXT_NAMES[index]);
    const char *prec = m->precision[ma_context_group(index)];
    snprintf(out->precision, sizeof out->precision, "%s", prec[0] ? prec : "checkpoint");
    if (m->from_contexts) {
        char name[160];
        ma_model_context_name(m, index, name, sizeof name);
        char *path = ma_path_join(m->dir, name);
        ma_gguf g;
        if (path && ma_gguf_open(&g, path, NULL) == MA_OK) {
            char p[16];
            if (ma_gguf_get_str(&g, "molmoact.precision", p, sizeof p, NULL) == MA_OK)
                snprintf(out->precision, sizeof out->precision, "%s", p);
            for (size_t t = 0; t < g.n_tensors; t++) add_bytes(out, g.tensors[t].dtype, g.tensors[t].nbytes);
            ma_gguf_close(&g);
        }
        free(path);
    } else {
        for (size_t i = 0; i < m->ws.count; i++) {
            const ma_wref *r = &m->ws.refs[i];
            size_t n = 0;
            if (slot_of(m, r->name) != index || ma_shape_nbytes(r->dtype, r->ndim, r->shape, &n, NULL)) continue;
            add_bytes(out, r->dtype, n);
        }
    }
    sort_dtypes(out);
    return MOLMOACT_OK;
}
