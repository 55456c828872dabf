/* SPDX-License-Identifier: Apache-2.0 */
/* Each component's precision and stored dtypes (server/components.h). */
#include "server/components.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/internal.h"
#include "io/gguf.h"
#include "io/mapfile.h"
#include "model/checkpoint.h"


static void add_bytes(ma_component_weights *c, ma_dtype dt, uint64_t bytes) {
    const char *name = ma_dtype_name(dt);
    for (int i = 0; i < c->n_dtypes; i++)
        if (!strcmp(c->dtype[i], name)) { c->bytes[i] += bytes; return; }
    if (c->n_dtypes == MA_COMPONENT_MAX_DTYPES) return;
    snprintf(c->dtype[c->n_dtypes], sizeof c->dtype[0], "%s", name);
    c->bytes[c->n_dtypes++] = bytes;
}

static void sort_dtypes(ma_component_weights *c) {
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

void ma_component_weights_read(molmoact *engine, const molmoact_info *info, ma_component_weights *out) {
    memset(out, 0, sizeof *out * MA_N_COMPONENTS);
    for (int i = 0; i < MA_N_COMPONENTS; i++) {
        out[i].name = MA_CONTEXT_NAMES[i];
        /* the API's three: vision, llm, action (the embedding table is the llm's input) */
        const int which = ma_context_group(i);
        snprintf(out[i].precision, sizeof out[i].precision, "%s", info->precision[which]);
    }
    ma_engine *e = molmoact_internal_engine(engine);
    if (!e) return;
    const ma_model *m = &e->host;
    if (m->from_contexts) {
        for (int slot = 0; slot < MA_N_COMPONENTS; slot++) {
            char name[160];
            ma_model_context_name(m, slot, name, sizeof name);
            char *path = ma_path_join(m->dir, name);
            ma_gguf g;
            if (path && ma_gguf_open(&g, path, NULL) == MA_OK) {
                char prec[16];
                if (ma_gguf_get_str(&g, "molmoact.precision", prec, sizeof prec, NULL) == MA_OK)
                    snprintf(out[slot].precision, sizeof out[slot].precision, "%s", prec);
                for (size_t t = 0; t < g.n_tensors; t++) add_bytes(&out[slot], g.tensors[t].dtype, g.tensors[t].nbytes);
                ma_gguf_close(&g);
            }
            free(path);
        }
    } else {
        for (size_t i = 0; i < m->ws.count; i++) {
            const ma_wref *r = &m->ws.refs[i];
            const int slot = slot_of(m, r->name);
            size_t n = 0;
            if (slot < 0 || ma_shape_nbytes(r->dtype, r->ndim, r->shape, &n, NULL)) continue;
            add_bytes(&out[slot], r->dtype, n);
        }
    }
    for (int i = 0; i < MA_N_COMPONENTS; i++) sort_dtypes(&out[i]);
}
