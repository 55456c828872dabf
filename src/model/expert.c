/* SPDX-License-Identifier: Apache-2.0 */
/* Flow-matching action expert: action_context (project the LLM K/V once per observation) and
 * action_step (one Euler step's velocity). docs/ARCHITECTURE.md "Action expert". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/threads.h"
#include "model/model.h"

#define AE "model.action_expert."

ma_status ma_expert_bind(ma_weightset *ws, const ma_config *cfg, int context, int step, ma_expert_w *w, ma_error *err) {
    memset(w, 0, sizeof *w);
    const int d = cfg->e_hidden, kvd = cfg->kv_heads * cfg->head_dim, inner = cfg->e_inner, Da = cfg->max_action_dim;
    char n[256];
    ma_status s;
#define M(field, name, r, c)                                           \
    do {                                                               \
        if ((s = ma_ws_mat(ws, name, r, c, &w->field, err))) return s; \
    } while (0)
#define V(field, name, len)                                           \
    do {                                                              \
        if ((s = ma_ws_vec(ws, name, len, &w->field, err))) return s; \
    } while (0)
    if (context) {
        M(ctx_k, AE "context_k_proj.weight", d, kvd);
        M(ctx_v, AE "context_v_proj.weight", d, kvd);
    }
    if (!step) return MA_OK;
    /* contexts carry the modulations of the compiled timesteps instead of the weights making them */
    ma_wref *mt = ma_ws_find(ws, "molmoact.step_modulations"), *ft = ma_ws_find(ws, "molmoact.final_modulations");
    int table = mt && ft;
    if (table) {
        if (mt->dtype != MA_DT_F32 || ft->dtype != MA_DT_F32 || mt->ndim != 2 || ft->ndim != 2 || mt->shape[0] != cfg->flow_steps ||
            ft->shape[0] != cfg->flow_steps || mt->shape[1] != (int64_t)cfg->e_layers * 9 * d || ft->shape[1] != 2 * d)
            return ma_fail(err, MA_ERR_SHAPE, "%s: the modulation tables do not match %d steps x %d blocks x %d", ws->label,
                           cfg->flow_steps, cfg->e_layers, d);
        mt->used = ft->used = 1;
        w->mod_table = mt->data;
        w->final_table = ft->data;
        w->table_steps = cfg->flow_steps;
    }
    if (!table || ma_ws_find(ws, AE "time_embed.1.weight")) {
        M(t1, AE "time_embed.1.weight", d, cfg->e_time_dim);
        V(t1_b, AE "time_embed.1.bias", d);
        M(t2, AE "time_embed.3.weight", d, d);
        V(t2_b, AE "time_embed.3.bias", d);
        M(final_mod, AE "final_layer.modulation.linear.weight", 2 * d, d);
        V(final_mod_b, AE "final_layer.modulation.linear.bias", 2 * d);
    }
    M(action_embed, AE "action_embed.weight", d, Da);
    V(ae_b, AE "action_embed.bias", d);
    M(final_lin, AE "final_layer.linear.weight", Da, d);
    V(final_lin_b, AE "final_layer.linear.bias", Da);
#undef M
#undef V
    w->n_blocks = cfg->e_layers;
    w->blocks = ma_calloc((size_t)w->n_blocks, sizeof *w->blocks, err, "expert blocks");
    if (!w->blocks) return MA_ERR_NOMEM;
    for (int l = 0; l < w->n_blocks; l++) {
        ma_expert_block_w *b = &w->blocks[l];
#define BM(field, leaf, r, c)                                       \
    do {                                                            \
        snprintf(n, sizeof n, AE "blocks.%d.%s.weight", l, leaf);   \
        if ((s = ma_ws_mat(ws, n, r, c, &b->field, err))) return s; \
    } while (0)
#define BV(field, leaf, len)                                       \
    do {                                                           \
        snprintf(n, sizeof n, AE "blocks.%d.%s.bias", l, leaf);    \
        if ((s = ma_ws_vec(ws, n, len, &b->field, err))) return s; \
    } while (0)
        BM(qkv, "self_attn.qkv", 3 * d, d);
        BV(qkv_b, "self_attn.qkv", 3 * d);
        BM(out, "self_attn.out_proj", d, d);
        BV(out_b, "self_attn.out_proj", d);
        BM(q, "cross_attn.q_proj", d, d);
        BV(q_b, "cross_attn.q_proj", d);
        BM(cout, "cross_attn.out_proj", d, d);
        BV(cout_b, "cross_attn.out_proj", d);
        BM(gate, "mlp.gate_proj", inner, d);
        BV(gate_b, "mlp.gate_proj", inner);
        BM(up, "mlp.up_proj", inner, d);
        BV(up_b, "mlp.up_proj", inner);
        BM(down, "mlp.down_proj", d, inner);
        BV(down_b, "mlp.down_proj", d);
        if (!table || w->t1.data) {
            BM(mod, "modulation.linear", 9 * d, d);
            BV(mod_b, "modulation.linear", 9 * d);
        }
#undef BM
#undef BV
    }
    return MA_OK;
}

void ma_expert_unbind(ma_expert_w *w) {
    free(w->blocks);
    memset(w, 0, sizeof *w);
}

ma_status ma_expert_context(const ma_config *cfg, const ma_expert_w *w, ma_kctx *kc, const float *k, const float *v, int64_t L, int64_t S,
                            float *ctx_k, float *ctx_v, ma_error *err) {
    const int d = cfg->e_hidden, H = cfg->e_heads, hd = cfg->e_head_dim;
    ma_status s = ma_linear(kc, k, L * S, &w->ctx_k, NULL, ctx_k, err);
    if (!s) s = ma_linear(kc, v, L * S, &w->ctx_v, NULL, ctx_v, err);
    if (s) return s;
    if (cfg->e_ctx_norm) { /* weightless RMS over the whole width, before splitting heads */
        ma_rmsnorm(ctx_k, L * S, d, NULL, 1e-6f);
        ma_rmsnorm(ctx_v, L * S, d, NULL, 1e-6f);
    }
    if (cfg->e_qk_norm) ma_rmsnorm(ctx_k, L * S * H, hd, NULL, cfg->e_qk_eps); /* cross_attn.k_norm, weightless */
    return MA_OK;
}

/* half-split RoPE for the expert: inv_freq_j = base^(-j/half) */
/* cos and sin of pos / 10000^(j / half) for pos < A, j < half: [A][half] each */
static void expert_rope_table(int64_t A, int hd, float *cs, float *sn) {
    const int half = hd / 2;
    for (int64_t pos = 0; pos < A; pos++)
        for (int j = 0; j < half; j++) {
            float inv = 1.0f / powf(10000.0f, (float)j / (float)half);
            float f = (float)pos * inv;
            cs[pos * half + j] = cosf(f);
            sn[pos * half + j] = sinf(f);
        }
}

/* conditioning c(t) = L2(SiLU(L1([sin(t f), cos(t f)]))), f_j = exp(-ln(1e4) j / (half-1)) */
static ma_status time_conditioning(const ma_config *cfg, const ma_expert_w *w, ma_kctx *kc, float t, float *c, ma_error *err) {
    const int dim = cfg->e_time_dim, half = dim / 2, d = cfg->e_hidden;
    float *emb = ma_calloc((size_t)dim, sizeof(float), err, "time embedding");
    float *h = ma_malloc((size_t)d, sizeof(float), err, "time embedding");
    ma_status s = MA_OK;
    if (!emb || !h) {
        s = MA_ERR_NOMEM;
        goto done;
    }
    const float step = (float)(-log(10000.0) / (half - 1 > 1 ? half - 1 : 1));
    for (int j = 0; j < half; j++) {
        float f = expf((float)j * step);
        float a = t * f;
        emb[j] = sinf(a);
        emb[half + j] = cosf(a);
    }
    if ((s = ma_linear(kc, emb, 1, &w->t1, w->t1_b, h, err))) goto done;
    ma_activate_ctx(kc, h, d, MA_ACT_SILU);
    s = ma_linear(kc, h, 1, &w->t2, w->t2_b, c, err);
done:
    free(emb);
    free(h);
    return s;
}

ma_status ma_expert_modulations(const ma_config *cfg, const ma_expert_w *w, ma_kctx *kc, float t, float *mods, float *final,
                                ma_error *err) {
    const int d = cfg->e_hidden;
    float *c = ma_malloc((size_t)d, sizeof(float), err, "expert");
    if (!c) return MA_ERR_NOMEM;
    ma_status s = time_conditioning(cfg, w, kc, t, c, err);
    if (!s) ma_activate_ctx(kc, c, d, MA_ACT_SILU); /* the modulations see SiLU(c) */
    for (int l = 0; l < w->n_blocks && !s; l++)
        s = ma_linear(kc, c, 1, &w->blocks[l].mod, w->blocks[l].mod_b, mods + (size_t)l * 9 * d, err);
    if (!s) s = ma_linear(kc, c, 1, &w->final_mod, w->final_mod_b, final, err);
    free(c);
    return s;
}

/* The work between the GEMMs, row by row (each action token's row is independent), on the
 * pool: the residual add, the norm and the modulation of a row in one pass while it is in L1,
 * and the per-head q / k norms and rotation. Serial, they left the second core idle for about
 * a seventh of a q4_0 step. Every row's arithmetic is the same whichever thread runs it. */
typedef struct rows_job {
    int64_t rows;
    int d;
    float *x; /* x += gate * y (when gate) */
    const float *y, *gate;
    float *h; /* then h = RMS(x) * (1 + scale) + shift (when h; h may be x) */
    const float *shift, *scale;
    /* or, with heads: q and k heads of rows `stride` apart normed (qk_norm) and rotated (cs, sn) */
    float *q, *k;
    int64_t stride;
    int heads, hd, qk_norm;
    float qk_eps;
    const float *cs, *sn; /* [rows][hd/2] each, or NULL */
} rows_job;

static void rows_task(void *ctx, int t, int T) {
    const rows_job *j = ctx;
    long lo, hi;
    ma_split_range((long)j->rows, t, T, &lo, &hi);
    const int d = j->d, hd = j->hd, half = hd / 2;
    for (int64_t r = lo; r < hi; r++) {
        if (j->heads) {
            for (int hh = 0; hh < j->heads; hh++) {
                float *heads2[2] = {j->q + r * j->stride + hh * hd, j->k ? j->k + r * j->stride + hh * hd : NULL};
                for (int w = 0; w < 2 && heads2[w]; w++) {
                    float *x = heads2[w];
                    if (j->qk_norm) ma_rmsnorm(x, 1, hd, NULL, j->qk_eps);
                    if (j->cs) /* half-split rotation by this position's angles */
                        for (int i = 0; i < half; i++) {
                            const float a = x[i], b = x[i + half], c = j->cs[r * half + i], sn = j->sn[r * half + i];
                            x[i] = a * c - b * sn;
                            x[i + half] = a * sn + b * c;
                        }
                }
            }
            continue;
        }
        float *x = j->x + r * d;
        if (j->gate) {
            const float *y = j->y + r * d;
            for (int i = 0; i < d; i++) x[i] += j->gate[i] * y[i];
        }
        if (j->h) {
            float *h = j->h + r * d;
            ma_rmsnorm_to(h, x, 1, d, NULL, 1e-6f);
            for (int i = 0; i < d; i++) h[i] = h[i] * (1.0f + j->scale[i]) + j->shift[i];
        }
    }
}

static void run_rows(rows_job *j) { ma_parallel_n(rows_task, j, (int)(j->rows < 64 ? j->rows : 64)); }

/* x += gate * y (gate may be NULL), then h = RMS(x) * (1 + scale) + shift (h may be NULL) */
static void residual_norm(int64_t A, int d, float *x, const float *y, const float *gate, float *h, const float *shift, const float *scale) {
    rows_job j = {A, d, x, y, gate, h, shift, scale, NULL, NULL, 0, 0, 0, 0, 0.0f, NULL, NULL};
    run_rows(&j);
}

/* q (and k) heads of each row normed (with eps) when norm, and rotated when cs */
static void heads_norm_rope(int64_t A, float *q, float *k, int64_t stride, int heads, int hd, int norm, float eps, const float *cs,
                            const float *sn) {
    rows_job j = {A, 0, NULL, NULL, NULL, NULL, NULL, NULL, q, k, stride, heads, hd, norm, eps, cs, sn};
    run_rows(&j);
}

/* the precomputed row for t when t is one of the table's timesteps, else -1 */
static int table_row(const ma_expert_w *w, float t) {
    for (int i = 0; i < w->table_steps; i++)
        if ((float)((double)i / w->table_steps) == t) return i;
    return -1;
}

ma_status ma_expert_step(const ma_config *cfg, const ma_expert_w *w, ma_kctx *kc, const float *xin, int64_t A, float t, const float *ctx_k,
                         const float *ctx_v, int64_t S, const uint8_t *cross_valid, float *velocity, ma_error *err) {
    const int d = cfg->e_hidden, H = cfg->e_heads, hd = cfg->e_head_dim, inner = cfg->e_inner;
    ma_status s = MA_OK;
    float *mods = NULL, *fin = NULL;
    float *x = ma_malloc((size_t)(A * d), sizeof(float), err, "expert");
    float *h = ma_malloc((size_t)(A * d), sizeof(float), err, "expert");
    float *qkv = ma_malloc((size_t)(A * 3 * d), sizeof(float), err, "expert");
    float *q = ma_malloc((size_t)(A * d), sizeof(float), err, "expert");
    float *att = ma_malloc((size_t)(A * d), sizeof(float), err, "expert");
    float *g = ma_malloc((size_t)(A * inner), sizeof(float), err, "expert");
    float *u = ma_malloc((size_t)(A * inner), sizeof(float), err, "expert");
    float *rope = ma_malloc((size_t)(A * hd), sizeof(float), err, "expert rope");
    if (!x || !h || !qkv || !q || !att || !g || !u || !rope) {
        s = MA_ERR_NOMEM;
        goto done;
    }
    const int64_t half = hd / 2;
    if (cfg->e_rope) expert_rope_table(A, hd, rope, rope + A * half); /* once per step, not per head */
    const float *mod_all, *final_mod;
    int row = table_row(w, t);
    if (row >= 0) {
        mod_all = w->mod_table + (size_t)row * w->n_blocks * 9 * d;
        final_mod = w->final_table + (size_t)row * 2 * d;
    } else {
        if (!w->blocks || !w->blocks[0].mod.data) {
            s = ma_fail(err, MA_ERR_RANGE, "action_step: t = %g is not one of the compiled timesteps", t);
            goto done;
        }
        mods = ma_malloc((size_t)w->n_blocks * 9 * d, sizeof(float), err, "expert");
        fin = ma_malloc((size_t)2 * d, sizeof(float), err, "expert");
        if (!mods || !fin) {
            s = MA_ERR_NOMEM;
            goto done;
        }
        if ((s = ma_expert_modulations(cfg, w, kc, t, mods, fin, err))) goto done;
        mod_all = mods;
        final_mod = fin;
    }
    if ((s = ma_linear(kc, xin, A, &w->action_embed, w->ae_b, x, err))) goto done;
    const int64_t ctx_layer = S * H * hd;
    ma_attn_mask self_mask = {NULL, cfg->e_causal, NULL};
    ma_attn_mask cross_mask = {cross_valid, 0, NULL};
    for (int l = 0; l < w->n_blocks; l++) {
        const ma_expert_block_w *b = &w->blocks[l];
        const float *mod = mod_all + (size_t)l * 9 * d;
        const float *shift_msa = mod, *scale_msa = mod + d;
        const float *shift_mca = mod + 3 * d, *scale_mca = mod + 4 * d, *gate_mca = mod + 5 * d;
        const float *shift_mlp = mod + 6 * d, *scale_mlp = mod + 7 * d;
        const float *gate_prev = l ? mod_all + (size_t)(l - 1) * 9 * d + 8 * d : NULL; /* the last block's MLP gate */
        /* self-attention over the A action tokens (after the last block's MLP residual) */
        residual_norm(A, d, x, h, gate_prev, h, shift_msa, scale_msa);
        if ((s = ma_linear(kc, h, A, &b->qkv, b->qkv_b, qkv, err))) goto done;
        /* rows are [3, H, hd]: q | k | v */
        if (cfg->e_qk_norm || cfg->e_rope)
            heads_norm_rope(A, qkv, qkv + d, 3 * d, H, hd, cfg->e_qk_norm, cfg->e_qk_eps, cfg->e_rope ? rope : NULL, rope + A * half);
        ma_attn_args sa = {1,     H,     H,     A, A, hd, qkv, qkv + d, qkv + 2 * d, att,
                           3 * d, 3 * d, 3 * d, d, 0, 0,  0,   0,       &self_mask,  MA_COMPUTE_F32};
        s = ma_attention(kc, &sa, err);
        if (s) goto done;
        if ((s = ma_linear(kc, att, A, &b->out, b->out_b, h, err))) goto done;
        /* cross-attention to the projected LLM context of layer l */
        residual_norm(A, d, x, h, mod + 2 * d, h, shift_mca, scale_mca);
        if ((s = ma_linear(kc, h, A, &b->q, b->q_b, q, err))) goto done;
        if (cfg->e_qk_norm) heads_norm_rope(A, q, NULL, d, H, hd, 1, cfg->e_qk_eps, NULL, NULL);
        const float *Kc = ctx_k + (int64_t)l * ctx_layer, *Vc = ctx_v + (int64_t)l * ctx_layer;
        ma_attn_args ca = {
            1, H, H, A, S, hd, q, Kc, Vc, att, d, (int64_t)H * hd, (int64_t)H * hd, d, 0, 0, 0, 0, &cross_mask, MA_COMPUTE_F32};
        s = ma_attention(kc, &ca, err);
        if (s) goto done;
        if ((s = ma_linear(kc, att, A, &b->cout, b->cout_b, h, err))) goto done;
        /* SwiGLU MLP with biases */
        residual_norm(A, d, x, h, gate_mca, h, shift_mlp, scale_mlp);
        if ((s = ma_linear_fused(kc, h, A, 2, (const ma_mat *[2]){&b->gate, &b->up}, (const float *[2]){b->gate_b, b->up_b},
                                 (float *[2]){g, u}, err)))
            goto done;
        ma_glu(kc, g, inner, g, inner, u, inner, A, inner, MA_ACT_SILU);
        if ((s = ma_linear(kc, g, A, &b->down, b->down_b, h, err))) goto done;
    }
    /* the last MLP residual, then the final norm and modulation in place */
    residual_norm(A, d, x, h, w->n_blocks ? mod_all + (size_t)(w->n_blocks - 1) * 9 * d + 8 * d : NULL, x, final_mod, final_mod + d);
    s = ma_linear(kc, x, A, &w->final_lin, w->final_lin_b, velocity, err);
done:
    free(mods);
    free(fin);
    free(x);
    free(h);
    free(qkv);
    free(q);
    free(att);
    free(g);
    free(u);
    free(rope);
    return s;
}
