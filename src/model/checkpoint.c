#define _POSIX_C_SOURCE 200809L
#include "model/checkpoint.h"

#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "io/mapfile.h"

/* processor_config.json: single-crop column tokens (absent file: the released processor's
 * setting, none) */
static ma_status read_processor(ma_model *m, ma_error *err) {
    char *path = ma_path_join(m->dir, "processor_config.json");
    if (!path) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
    m->col_tokens = 0;
    if (!ma_is_file(path)) { free(path); return MA_OK; }
    char *text;
    ma_status s = ma_read_file(path, 1u << 20, &text, NULL, err);
    if (s) { free(path); return s; }
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(root)) { cJSON_Delete(root); s = ma_fail(err, MA_ERR_FORMAT, "%s: not a JSON object", path); free(path); return s; }
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(root, "use_single_crop_col_tokens");
    const cJSON *image = cJSON_GetObjectItemCaseSensitive(root, "image_use_col_tokens");
    if (cJSON_IsBool(single)) m->col_tokens = cJSON_IsTrue(single);
    else m->col_tokens = image ? cJSON_IsTrue(image) : 1;
    cJSON_Delete(root);
    free(path);
    return MA_OK;
}

static ma_status build_weightset(ma_model *m, ma_error *err) {
    size_t n = m->st.count;
    const char **names = ma_calloc(n ? n : 1, sizeof *names, err, "names");
    ma_dtype *dts = ma_calloc(n ? n : 1, sizeof *dts, err, "dtypes");
    int *nds = ma_calloc(n ? n : 1, sizeof *nds, err, "ndims");
    int64_t (*shapes)[MA_MAX_DIMS] = ma_calloc(n ? n : 1, sizeof *shapes, err, "shapes");
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
        s = ma_ws_init(&m->ws, m->dir, n, names, dts, nds, (const int64_t (*)[MA_MAX_DIMS])shapes, datas, err);
    }
    free(names); free(dts); free(nds); free(shapes); free(datas);
    return s;
}

ma_status ma_model_open(const char *dir, const char *norm_tag, ma_model *m, ma_error *err) {
    memset(m, 0, sizeof *m);
    ma_status s;
    m->dir = strdup(dir);
    char *cfg_path = ma_path_join(dir, "config.json");
    if (!m->dir || !cfg_path) { free(cfg_path); s = ma_fail(err, MA_ERR_NOMEM, "out of memory"); goto fail; }
    s = ma_config_load(cfg_path, &m->cfg, err);
    free(cfg_path);
    if (s) goto fail;
    char *ns_path = ma_path_join(dir, m->cfg.norm_stats_filename);
    if (!ns_path) { s = ma_fail(err, MA_ERR_NOMEM, "out of memory"); goto fail; }
    s = ma_normstats_load(ns_path, norm_tag ? norm_tag : "libero", &m->ns, err);
    free(ns_path);
    if (s) goto fail;
    if ((s = ma_st_open(&m->st, dir, err)) || (s = build_weightset(m, err))) goto fail;
    const ma_config *c = &m->cfg;
    if ((s = ma_vision_bind(&m->ws, c, &m->vision, err))) goto fail;
    if ((s = ma_embed_bind(&m->ws, c, &m->embed, err))) goto fail;
    ma_split_ranges(c->layers, m->split_first, m->split_last);
    for (int i = 0; i < MA_NUM_SPLITS; i++)
        if ((s = ma_llm_bind(&m->ws, c, m->split_first[i], m->split_last[i], &m->llm[i], err))) goto fail;
    if ((s = ma_expert_bind(&m->ws, c, 1, 1, &m->expert, err))) goto fail;
    /* present in released checkpoints, unused by continuous-action inference */
    ma_ws_ignore(&m->ws, "lm_head.weight");
    ma_ws_ignore(&m->ws, "model.transformer.ln_f.weight");
    ma_ws_ignore(&m->ws, "model.transformer.rotary_emb.inv_freq");
    if ((s = ma_ws_check_unused(&m->ws, err))) goto fail;
    m->tokens_per_image = ma_vision_tokens(c, &m->vision);
    if ((s = read_processor(m, err))) goto fail;
    char *tok_path = ma_path_join(dir, "tokenizer.json");
    if (!tok_path) { s = ma_fail(err, MA_ERR_NOMEM, "out of memory"); goto fail; }
    if (ma_is_file(tok_path)) s = ma_tokenizer_load(tok_path, &m->tok, err);
    free(tok_path);
    if (s) goto fail;
    if (m->ns.action.dim > c->max_action_dim) {
        s = ma_fail(err, MA_ERR_FORMAT, "%s: norm_stats action dim %d exceeds max_action_dim %d", dir, m->ns.action.dim, c->max_action_dim);
        goto fail;
    }
    return MA_OK;
fail:
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
    free(m->dir);
    memset(m, 0, sizeof *m);
}
