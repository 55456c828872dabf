/* SPDX-License-Identifier: Apache-2.0 */
/* LLM split session: a contiguous range of Qwen3-style decoder layers over the whole prompt
 * (one prefill), returning each layer's K (post qk-norm, post RoPE) and V.
 * docs/ARCHITECTURE.md "LLM". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

#define TB "model.transformer."

ma_status ma_embed_bind(ma_weightset *ws, const ma_config *cfg, ma_embed_w *w, ma_error *err) {
    memset(w, 0, sizeof *w);
    ma_status s = ma_ws_mat(ws, TB "wte.embedding", cfg->vocab, cfg->d, &w->emb, err);
    if (s) return s;
    if (cfg->extra_vocab > 0) return ma_ws_mat(ws, TB "wte.new_embedding", cfg->extra_vocab, cfg->d, &w->new_emb, err);
    return MA_OK;
}

ma_status ma_llm_bind(ma_weightset *ws, const ma_config *cfg, int first, int last, ma_llm_w *w, ma_error *err) {
    memset(w, 0, sizeof *w);
    if (first < 0 || last > cfg->layers || first > last)
        return ma_fail(err, MA_ERR_ARG, "layer range [%d, %d) outside the model's %d layers", first, last, cfg->layers);
    w->first = first;
    w->last = last;
    w->layers = ma_calloc((size_t)(last - first ? last - first : 1), sizeof *w->layers, err, "llm layers");
    if (!w->layers) return MA_ERR_NOMEM;
    const int D = cfg->d, qd = cfg->heads * cfg->head_dim, kvd = cfg->kv_heads * cfg->head_dim;
    char n[256];
    ma_status s;
    for (int l = first; l < last; l++) {
        ma_llm_layer_w *lw = &w->layers[l - first];
#define M(field, leaf, r, c)                                         \
    do {                                                             \
        snprintf(n, sizeof n, TB "blocks.%d.%s", l, leaf);           \
        if ((s = ma_ws_mat(ws, n, r, c, &lw->field, err))) return s; \
    } while (0)
#define V(field, leaf, len)                                         \
    do {                                                            \
        snprintf(n, sizeof n, TB "blocks.%d.%s", l, leaf);          \
        if ((s = ma_ws_vec(ws, n, len, &lw->field, err))) return s; \
    } while (0)
        V(attn_norm, "attn_norm.weight", D);
        V(ff_norm, "ff_norm.weight", D);
        M(att_proj, "self_attn.att_proj.weight", qd + 2 * kvd, D);
        M(attn_out, "self_attn.attn_out.weight", D, qd);
        M(ff_proj, "mlp.ff_proj.weight", 2 * cfg->inter, D);
        M(ff_out, "mlp.ff_out.weight", D, cfg->inter);
        if (cfg->qkv_bias) V(att_bias, "self_attn.att_proj.bias", qd + 2 * kvd);
        if (cfg->qk_norm) {
            V(q_norm, "self_attn.q_norm.weight", cfg->qk_norm_qwen3 ? cfg->head_dim : qd);
            V(k_norm, "self_attn.k_norm.weight", cfg->qk_norm_qwen3 ? cfg->head_dim : kvd);
        }
#undef M
#undef V
    }
    return MA_OK;
}

void ma_llm_unbind(ma_llm_w *w) {
    free(w->layers);
    memset(w, 0, sizeof *w);
}

/* cos/sin [S, hd/2]: inv_freq_j = 1 / theta^(2j/hd) (fp32, as upstream rebuilds it) */
static void rope_tables(const ma_config *cfg, const int64_t *pos, int64_t S, float *cs, float *sn) {
    const int half = cfg->head_dim / 2;
    for (int j = 0; j < half; j++) {
        float expo = (float)(2 * j) / (float)cfg->head_dim;
        float inv = 1.0f / powf((float)cfg->rope_theta, expo);
        for (int64_t i = 0; i < S; i++) {
            float f = (float)pos[i] * inv;
            cs[i * half + j] = cosf(f);
            sn[i * half + j] = sinf(f);
        }
    }
}

/* rotate_half RoPE on one head vector: [x1 cos - x2 sin, x2 cos + x1 sin] */
static void rope_apply(float *x, int hd, const float *cs, const float *sn) {
    const int half = hd / 2;
    for (int j = 0; j < half; j++) {
        float a = x[j], b = x[j + half];
        x[j] = a * cs[j] - b * sn[j];
        x[j + half] = b * cs[j] + a * sn[j];
    }
}

ma_status ma_llm_forward(const ma_config *cfg, const ma_llm_w *w, ma_kctx *kc, float *x, int64_t S, const uint8_t *image_mask,
                         const int64_t *positions, float *k_out, float *v_out, ma_error *err) {
    const int D = cfg->d, H = cfg->heads, KV = cfg->kv_heads, hd = cfg->head_dim, grp = H / KV;
    const int64_t qd = (int64_t)H * hd, kvd = (int64_t)KV * hd, qkvd = qd + 2 * kvd, F = cfg->inter;
    ma_status s = MA_OK;
    float *h = ma_malloc((size_t)(S * D), sizeof(float), err, "llm hidden");
    float *qkv = ma_malloc((size_t)(S * qkvd), sizeof(float), err, "llm qkv");
    float *q = ma_malloc((size_t)(S * qd), sizeof(float), err, "llm q");
    float *att = ma_malloc((size_t)(S * qd), sizeof(float), err, "llm attention");
    float *ff = ma_malloc((size_t)(S * 2 * F), sizeof(float), err, "llm mlp");
    float *act = ma_malloc((size_t)(S * F), sizeof(float), err, "llm mlp");
    float *cs = ma_malloc((size_t)(S * (hd / 2)), sizeof(float), err, "rope");
    float *sn = ma_malloc((size_t)(S * (hd / 2)), sizeof(float), err, "rope");
    if (!h || !qkv || !q || !att || !ff || !act || !cs || !sn) {
        s = MA_ERR_NOMEM;
        goto done;
    }
    rope_tables(cfg, positions, S, cs, sn);
    ma_attn_mask mask = {NULL, 1, image_mask}; /* causal, plus bidirectional among image tokens */
    for (int l = w->first; l < w->last; l++) {
        const ma_llm_layer_w *lw = &w->layers[l - w->first];
        float *K = k_out + (int64_t)(l - w->first) * S * kvd, *V = v_out + (int64_t)(l - w->first) * S * kvd;
        if (!cfg->norm_after) ma_rmsnorm_to(h, x, S, D, lw->attn_norm, cfg->eps);
        else memcpy(h, x, sizeof(float) * (size_t)(S * D));
        if ((s = ma_linear(kc, h, S, &lw->att_proj, lw->att_bias, qkv, err))) goto done;
        for (int64_t i = 0; i < S; i++) {
            float *row = qkv + i * qkvd;
            memcpy(q + i * qd, row, sizeof(float) * (size_t)qd);
            memcpy(K + i * kvd, row + qd, sizeof(float) * (size_t)kvd);
            memcpy(V + i * kvd, row + qd + kvd, sizeof(float) * (size_t)kvd);
        }
        if (cfg->qk_norm) {
            if (cfg->qk_norm_qwen3) { /* per head, weights shared by all heads */
                ma_rmsnorm(q, S * H, hd, lw->q_norm, cfg->eps);
                ma_rmsnorm(K, S * KV, hd, lw->k_norm, cfg->eps);
            } else { /* olmo: over the whole projection */
                ma_rmsnorm(q, S, qd, lw->q_norm, cfg->eps);
                ma_rmsnorm(K, S, kvd, lw->k_norm, cfg->eps);
            }
        }
        for (int64_t i = 0; i < S; i++) {
            for (int hh = 0; hh < H; hh++) rope_apply(q + i * qd + hh * hd, hd, cs + i * (hd / 2), sn + i * (hd / 2));
            for (int hh = 0; hh < KV; hh++) rope_apply(K + i * kvd + hh * hd, hd, cs + i * (hd / 2), sn + i * (hd / 2));
        }
        ma_attn_args aa = {1, H, H / grp, S, S, hd, q, K, V, att, qd, kvd, kvd, qd, 0, 0, 0, 0, &mask, MA_COMPUTE_F32};
        s = ma_attention(kc, &aa, err);
        if (s) goto done;
        if ((s = ma_linear(kc, att, S, &lw->attn_out, NULL, h, err))) goto done;
        if (cfg->norm_after) ma_rmsnorm(h, S, D, lw->attn_norm, cfg->eps);
        ma_add(x, h, S * D);
        if (!cfg->norm_after) ma_rmsnorm_to(h, x, S, D, lw->ff_norm, cfg->eps);
        else memcpy(h, x, sizeof(float) * (size_t)(S * D));
        if ((s = ma_linear(kc, h, S, &lw->ff_proj, NULL, ff, err))) goto done;
        /* OLMo order: up = first half, gate = second half */
        ma_glu(kc, act, F, ff + F, 2 * F, ff, 2 * F, S, F, cfg->act);
        if ((s = ma_linear(kc, act, S, &lw->ff_out, NULL, h, err))) goto done;
        if (cfg->norm_after) ma_rmsnorm(h, S, D, lw->ff_norm, cfg->eps);
        ma_add(x, h, S * D);
    }
done:
    free(h);
    free(qkv);
    free(q);
    free(att);
    free(ff);
    free(act);
    free(cs);
    free(sn);
    return s;
}
