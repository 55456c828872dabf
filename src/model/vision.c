/* Vision session: SigLIP ViT with two feature taps -> 2x2 attention pooling -> SwiGLU projector,
 * with the Grid Sampler (ActiveTokenSampler) after the pooling or after the projector.
 * Architecture doc sections 2-5. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

#define VB "model.vision_backbone."

/* ------------------------------------------------------------------------------ binding */

static ma_status bind_attn(ma_weightset *ws, const char *prefix, int in_dim, int heads, int kv_heads, int hd,
                           int out_dim, ma_vit_attn_w *a, ma_error *err) {
    char n[256];
    ma_status s;
#define MAT(field, leaf, r, c) do { snprintf(n, sizeof n, "%s%s.weight", prefix, leaf); if ((s = ma_ws_mat(ws, n, r, c, &a->field, err))) return s; } while (0)
#define VEC(field, leaf, len) do { snprintf(n, sizeof n, "%s%s.bias", prefix, leaf); if ((s = ma_ws_vec(ws, n, len, &a->field, err))) return s; } while (0)
    MAT(wq, "wq", heads * hd, in_dim);
    MAT(wk, "wk", kv_heads * hd, in_dim);
    MAT(wv, "wv", kv_heads * hd, in_dim);
    MAT(wo, "wo", out_dim, heads * hd);
    VEC(bq, "wq", heads * hd);
    VEC(bk, "wk", kv_heads * hd);
    VEC(bv, "wv", kv_heads * hd);
    VEC(bo, "wo", out_dim);
#undef MAT
#undef VEC
    return MA_OK;
}

/* the sampler's keys sit under an unknown prefix: find "...scout_mlp.0.weight" */
static ma_status bind_sampler(ma_weightset *ws, const ma_config *cfg, ma_vision_w *w, ma_error *err) {
    const char *hit = NULL;
    const char *suffix = "scout_mlp.0.weight";
    size_t sl = strlen(suffix);
    for (size_t i = 0; i < ws->count; i++) {
        const char *nm = ws->refs[i].name;
        size_t l = strlen(nm);
        if (l >= sl && strcmp(nm + l - sl, suffix) == 0 && (l == sl || nm[l - sl - 1] == '.')) {
            if (hit) return ma_fail(err, MA_ERR_FORMAT, "%s: two token samplers (%s, %s)", ws->label, hit, nm);
            hit = nm;
        }
    }
    if (!hit) {
        w->sampler_place = MA_SAMPLER_NONE;
        if (cfg->use_grid_sampler)
            return ma_fail(err, MA_ERR_FORMAT, "%s: config.json sets use_grid_token_sampler but the checkpoint has no "
                           "token sampler tensors (scout_mlp.0.weight)", ws->label);
        return MA_OK;
    }
    char prefix[256];
    size_t pl = strlen(hit) - sl;
    if (pl >= sizeof prefix) return ma_fail(err, MA_ERR_FORMAT, "%s: sampler name too long", ws->label);
    memcpy(prefix, hit, pl);
    prefix[pl] = '\0';
    const ma_wref *s0 = ma_ws_find(ws, hit);
    char n[320];
    snprintf(n, sizeof n, "%sscout_mlp.2.weight", prefix);
    const ma_wref *s2 = ma_ws_find(ws, n);
    snprintf(n, sizeof n, "%scoord_encoder.0.weight", prefix);
    const ma_wref *c0 = ma_ws_find(ws, n);
    if (!s2 || !c0 || s0->ndim != 2 || s2->ndim != 2 || c0->ndim != 2 || s2->shape[0] % 2 || s2->shape[0] == 0)
        return ma_fail(err, MA_ERR_FORMAT, "%s: token sampler under %s is incomplete or mis-shaped", ws->label, prefix);
    ma_sampler_w *sw = &w->sampler;
    sw->channels = (int)s0->shape[1];
    sw->scout_hidden = (int)s0->shape[0];
    sw->tokens = (int)s2->shape[0] / 2;
    sw->coord_hidden = (int)c0->shape[0];
    if (sw->channels == cfg->d) w->sampler_place = MA_SAMPLER_AFTER_PROJECTOR;
    else if (sw->channels == cfg->pool_hidden) w->sampler_place = MA_SAMPLER_AFTER_POOLING;
    else return ma_fail(err, MA_ERR_SHAPE, "%s: token sampler width %d matches neither the pooled (%d) nor the projected (%d) features",
                        ws->label, sw->channels, cfg->pool_hidden, cfg->d);
    ma_status s;
#define SM(field, leaf, r, c) do { snprintf(n, sizeof n, "%s%s.weight", prefix, leaf); if ((s = ma_ws_mat(ws, n, r, c, &sw->field, err))) return s; } while (0)
#define SV(field, leaf, len) do { snprintf(n, sizeof n, "%s%s.bias", prefix, leaf); if ((s = ma_ws_vec(ws, n, len, &sw->field, err))) return s; } while (0)
    SM(scout0, "scout_mlp.0", sw->scout_hidden, sw->channels);
    SM(scout2, "scout_mlp.2", 2 * sw->tokens, sw->scout_hidden);
    SM(coord0, "coord_encoder.0", sw->coord_hidden, 2);
    SM(coord2, "coord_encoder.2", sw->channels, sw->coord_hidden);
    SV(scout0_b, "scout_mlp.0", sw->scout_hidden);
    SV(scout2_b, "scout_mlp.2", 2 * sw->tokens);
    SV(coord0_b, "coord_encoder.0", sw->coord_hidden);
    SV(coord2_b, "coord_encoder.2", sw->channels);
#undef SM
#undef SV
    return MA_OK;
}

ma_status ma_vision_bind(ma_weightset *ws, const ma_config *cfg, ma_vision_w *w, ma_error *err) {
    memset(w, 0, sizeof *w);
    char n[256];
    ma_status s;
    const int dv = cfg->vit_hidden, P = cfg->patch_h * cfg->patch_w, pp = 3 * cfg->patch * cfg->patch;
    if ((s = ma_ws_mat(ws, VB "image_vit.patch_embedding.weight", dv, pp, &w->patch_w, err))) return s;
    if ((s = ma_ws_vec(ws, VB "image_vit.patch_embedding.bias", dv, &w->patch_b, err))) return s;
    if ((s = ma_ws_mat(ws, VB "image_vit.positional_embedding", P, dv, &w->pos, err))) return s;
    w->n_blocks = cfg->vit_built;
    w->blocks = ma_calloc((size_t)w->n_blocks, sizeof *w->blocks, err, "vit blocks");
    if (!w->blocks) return MA_ERR_NOMEM;
    for (int b = 0; b < w->n_blocks; b++) {
        ma_vit_block_w *bw = &w->blocks[b];
        char pre[160];
        snprintf(pre, sizeof pre, VB "image_vit.transformer.resblocks.%d.", b);
        snprintf(n, sizeof n, "%sattention.", pre);
        if ((s = bind_attn(ws, n, dv, cfg->vit_heads, cfg->vit_kv_heads, cfg->vit_head_dim, dv, &bw->attn, err))) return s;
#define V(field, leaf, len) do { snprintf(n, sizeof n, "%s%s", pre, leaf); if ((s = ma_ws_vec(ws, n, len, &bw->field, err))) return s; } while (0)
        V(ln1_w, "attention_norm.weight", dv);
        V(ln1_b, "attention_norm.bias", dv);
        V(ln2_w, "ffn_norm.weight", dv);
        V(ln2_b, "ffn_norm.bias", dv);
        V(b1, "feed_forward.w1.bias", cfg->vit_inter);
        V(b2, "feed_forward.w2.bias", dv);
#undef V
        snprintf(n, sizeof n, "%sfeed_forward.w1.weight", pre);
        if ((s = ma_ws_mat(ws, n, cfg->vit_inter, dv, &bw->w1, err))) return s;
        snprintf(n, sizeof n, "%sfeed_forward.w2.weight", pre);
        if ((s = ma_ws_mat(ws, n, dv, cfg->vit_inter, &bw->w2, err))) return s;
    }
    /* upstream builds only max(taps)+1 blocks; a checkpoint with the full tower carries unused ones */
    for (int b = w->n_blocks; b < cfg->vit_layers; b++) {
        snprintf(n, sizeof n, VB "image_vit.transformer.resblocks.%d.", b);
        ma_ws_ignore(ws, n);
    }
    if ((s = bind_attn(ws, VB "image_pooling_2d.", cfg->n_taps * dv, cfg->pool_heads, cfg->pool_kv_heads,
                       cfg->pool_head_dim, cfg->pool_hidden, &w->pool, err))) return s;
    if ((s = ma_ws_mat(ws, VB "image_projector.w1.weight", cfg->proj_inter, cfg->pool_hidden, &w->proj_w1, err))) return s;
    if ((s = ma_ws_mat(ws, VB "image_projector.w3.weight", cfg->proj_inter, cfg->pool_hidden, &w->proj_w3, err))) return s;
    if ((s = ma_ws_mat(ws, VB "image_projector.w2.weight", cfg->d, cfg->proj_inter, &w->proj_w2, err))) return s;
    return bind_sampler(ws, cfg, w, err);
}

void ma_vision_unbind(ma_vision_w *w) {
    free(w->blocks);
    memset(w, 0, sizeof *w);
}

int ma_vision_tokens(const ma_config *cfg, const ma_vision_w *w) {
    return w->sampler_place != MA_SAMPLER_NONE ? w->sampler.tokens : cfg->pooled_h * cfg->pooled_w;
}

/* ------------------------------------------------------------------------------ forward */

/* multi-head attention of x [n*L, dim] over itself per image (ViT blocks); out [n*L, dim] */
static ma_status vit_self_attention(const ma_config *cfg, const ma_vit_attn_w *a, ma_kctx *kc, const float *x,
                                    int n, int L, float *out, ma_error *err) {
    const int H = cfg->vit_heads, KV = cfg->vit_kv_heads, hd = cfg->vit_head_dim, grp = H / KV;
    const int64_t rows = (int64_t)n * L, qd = (int64_t)H * hd, kd = (int64_t)KV * hd;
    ma_status s = MA_OK;
    float *q = ma_malloc((size_t)(rows * qd), sizeof(float), err, "vit q");
    float *k = ma_malloc((size_t)(rows * kd), sizeof(float), err, "vit k");
    float *v = ma_malloc((size_t)(rows * kd), sizeof(float), err, "vit v");
    float *o = ma_malloc((size_t)(rows * qd), sizeof(float), err, "vit attn");
    if (!q || !k || !v || !o) { s = MA_ERR_NOMEM; goto done; }
    {
        const ma_mat *ws[3] = {&a->wq, &a->wk, &a->wv};
        const float *bs[3] = {a->bq, a->bk, a->bv};
        float *ys[3] = {q, k, v};
        if ((s = ma_linear_fused(kc, x, rows, 3, ws, bs, ys, err))) goto done;
    }
    ma_attn_args att = {n, H, H / grp, L, L, hd, q, k, v, o, qd, kd, kd, qd,
                        (int64_t)L * qd, (int64_t)L * kd, (int64_t)L * kd, (int64_t)L * qd, NULL};
    s = ma_attention(kc, &att, err);
    if (!s) s = ma_linear(kc, o, rows, &a->wo, a->bo, out, err);
done:
    free(q); free(k); free(v); free(o);
    return s;
}

/* The sampler reads its feature map only through averages and bilinear weights, both linear.
 * With `lift` the map holds the projector's hidden activations [H*W, Cm] instead of its output,
 * and lift (the projector's last, bias-free linear) maps the global mean and the K samples to the
 * C channels: the same features from K + 1 rows of that linear instead of H*W (in exact
 * arithmetic; in fp32 the sums are taken in another order). lift NULL: Cm == C. */
static ma_status sampler_forward(const ma_sampler_w *w, ma_kctx *kc, const float *tokens, int Cm, const ma_mat *lift,
                                 int H, int W, float *out, float *coords_out, ma_error *err) {
    const int C = w->channels, K = w->tokens;
    ma_status s = MA_OK;
    int S = H < W ? H : W;
    float *fmap = NULL, *hid = NULL, *cemb = NULL, *glob = NULL, *samp = NULL, *glob_m = NULL;
    double *sums = NULL;
    glob = ma_malloc((size_t)C, sizeof(float), err, "sampler");
    float *coords = ma_malloc((size_t)(2 * K), sizeof(float), err, "sampler");
    hid = ma_malloc((size_t)(w->scout_hidden > w->coord_hidden ? w->scout_hidden : w->coord_hidden), sizeof(float), err, "sampler");
    cemb = ma_malloc((size_t)C, sizeof(float), err, "sampler");
    if (lift) {
        glob_m = ma_malloc((size_t)Cm, sizeof(float), err, "sampler");
        samp = ma_malloc((size_t)K * (size_t)Cm, sizeof(float), err, "sampler");
    }
    if (!glob || !coords || !hid || !cemb || (lift && (!glob_m || !samp))) { s = MA_ERR_NOMEM; goto done; }
    /* feature map [S*S, Cm] row-major cells (channels-last); non-square grids are average-pooled */
    const float *map = tokens;
    if (H != W) {
        fmap = ma_calloc((size_t)S * S * Cm, sizeof(float), err, "sampler");
        if (!fmap) { s = MA_ERR_NOMEM; goto done; }
        for (int oi = 0; oi < S; oi++)
            for (int oj = 0; oj < S; oj++) {
                int h0 = (int)floor((double)oi * H / S), h1 = (int)ceil((double)(oi + 1) * H / S);
                int w0 = (int)floor((double)oj * W / S), w1 = (int)ceil((double)(oj + 1) * W / S);
                float *dst = fmap + ((size_t)oi * S + oj) * Cm;
                for (int c = 0; c < Cm; c++) {
                    double acc = 0.0;
                    for (int i = h0; i < h1; i++)
                        for (int j = w0; j < w1; j++) acc += tokens[((size_t)i * W + j) * Cm + c];
                    dst[c] = (float)(acc / ((double)(h1 - h0) * (w1 - w0)));
                }
            }
        map = fmap;
        H = W = S;
    }
    /* the global mean, row by row: every channel's sum in the same order as a column walk, but
     * Cm independent chains instead of one (Cm is the projector's 9728 with lift) */
    float *gm = lift ? glob_m : glob;
    sums = ma_calloc((size_t)Cm, sizeof(double), err, "sampler");
    if (!sums) { s = MA_ERR_NOMEM; goto done; }
    for (int i = 0; i < H * W; i++)
        for (int c = 0; c < Cm; c++) sums[c] += map[(size_t)i * Cm + c];
    for (int c = 0; c < Cm; c++) gm[c] = (float)(sums[c] / (H * W));
    if (lift && (s = ma_linear(kc, glob_m, 1, lift, NULL, glob, err))) goto done;
    /* scout MLP: Linear -> ReLU -> Linear -> Sigmoid; output 2k is x (width), 2k+1 is y */
    if ((s = ma_linear(kc, glob, 1, &w->scout0, w->scout0_b, hid, err))) goto done;
    ma_activate_ctx(kc, hid, w->scout_hidden, MA_ACT_RELU);
    if ((s = ma_linear(kc, hid, 1, &w->scout2, w->scout2_b, coords, err))) goto done;
    for (int i = 0; i < 2 * K; i++) coords[i] = 1.0f / (1.0f + expf(-coords[i]));
    for (int k = 0; k < K; k++) {
        /* grid_sample(bilinear, align_corners=False, zeros): pixel centres at (i + 0.5) / W */
        float gx = coords[2 * k] * 2.0f - 1.0f, gy = coords[2 * k + 1] * 2.0f - 1.0f;
        float ix = ((gx + 1.0f) * (float)W - 1.0f) / 2.0f, iy = ((gy + 1.0f) * (float)H - 1.0f) / 2.0f;
        float x0f = floorf(ix), y0f = floorf(iy);
        int x0 = (int)x0f, y0 = (int)y0f;
        float wx = ix - x0f, wy = iy - y0f;
        float wts[4] = {(1 - wy) * (1 - wx), (1 - wy) * wx, wy * (1 - wx), wy * wx};
        int xs[4] = {x0, x0 + 1, x0, x0 + 1}, ys[4] = {y0, y0, y0 + 1, y0 + 1};
        float *dst = (lift ? samp : out) + (size_t)k * Cm;
        for (int c = 0; c < Cm; c++) dst[c] = 0.0f;
        for (int q = 0; q < 4; q++) {
            if (xs[q] < 0 || xs[q] >= W || ys[q] < 0 || ys[q] >= H) continue;
            const float *src = map + ((size_t)ys[q] * W + xs[q]) * Cm;
            for (int c = 0; c < Cm; c++) dst[c] += wts[q] * src[c];
        }
    }
    if (lift && (s = ma_linear(kc, samp, K, lift, NULL, out, err))) goto done;
    for (int k = 0; k < K; k++) {
        /* coordinate embedding of the (x, y) point in [0, 1] */
        if ((s = ma_linear(kc, coords + 2 * k, 1, &w->coord0, w->coord0_b, hid, err))) goto done;
        ma_activate_ctx(kc, hid, w->coord_hidden, MA_ACT_RELU);
        if ((s = ma_linear(kc, hid, 1, &w->coord2, w->coord2_b, cemb, err))) goto done;
        ma_add(out + (size_t)k * C, cemb, C);
    }
    if (coords_out) memcpy(coords_out, coords, sizeof(float) * 2 * (size_t)K);
done:
    free(fmap); free(glob); free(coords); free(hid); free(cemb); free(glob_m); free(samp); free(sums);
    return s;
}

ma_status ma_sampler_forward(const ma_sampler_w *w, ma_kctx *kc, const float *tokens, int H, int W, float *out,
                             float *coords_out, ma_error *err) {
    return sampler_forward(w, kc, tokens, w->channels, NULL, H, W, out, coords_out, err);
}

/* apply the sampler to every image: x [n, T, Cm] -> y [n, K, C] (Cm, lift: sampler_forward) */
static ma_status sample_images(const ma_config *cfg, const ma_vision_w *w, ma_kctx *kc, const float *x, int Cm,
                               const ma_mat *lift, int n, float *y, float *coords, ma_error *err) {
    const int T = cfg->pooled_h * cfg->pooled_w, C = w->sampler.channels, K = w->sampler.tokens;
    for (int img = 0; img < n; img++) {
        ma_status s = sampler_forward(&w->sampler, kc, x + (size_t)img * T * Cm, Cm, lift, cfg->pooled_h, cfg->pooled_w,
                                      y + (size_t)img * K * C, coords ? coords + (size_t)img * K * 2 : NULL, err);
        if (s) return s;
    }
    return MA_OK;
}

/* the projector's SwiGLU hidden activations: silu(x W1^T) * (x W3^T), [rows, proj_inter] */
static ma_status projector_hidden(const ma_config *cfg, const ma_vision_w *w, ma_kctx *kc, const float *x, int64_t rows,
                                  float *g, ma_error *err) {
    ma_status s = MA_OK;
    float *u = ma_malloc((size_t)(rows * cfg->proj_inter), sizeof(float), err, "projector");
    if (!u) return MA_ERR_NOMEM;
    {
        const ma_mat *ws[2] = {&w->proj_w1, &w->proj_w3};
        const float *bs[2] = {NULL, NULL};
        float *ys[2] = {g, u};
        if ((s = ma_linear_fused(kc, x, rows, 2, ws, bs, ys, err))) goto done;
    }
    ma_activate_ctx(kc, g, rows * cfg->proj_inter, cfg->proj_act);
    for (int64_t i = 0; i < rows * cfg->proj_inter; i++) g[i] *= u[i];
done:
    free(u);
    return s;
}

static ma_status projector(const ma_config *cfg, const ma_vision_w *w, ma_kctx *kc, const float *x, int64_t rows,
                           float *out, ma_error *err) {
    float *g = ma_malloc((size_t)(rows * cfg->proj_inter), sizeof(float), err, "projector");
    if (!g) return MA_ERR_NOMEM;
    ma_status s = projector_hidden(cfg, w, kc, x, rows, g, err);
    if (!s) s = ma_linear(kc, g, rows, &w->proj_w2, NULL, out, err);
    free(g);
    return s;
}

ma_status ma_vision_forward(const ma_config *cfg, const ma_vision_w *w, ma_kctx *kc, const float *pixels, int n,
                            float *features, const ma_vision_trace *trace, ma_error *err) {
    const int P = cfg->patch_h * cfg->patch_w, dv = cfg->vit_hidden, pp = 3 * cfg->patch * cfg->patch;
    const int T = cfg->pooled_h * cfg->pooled_w, c2 = cfg->n_taps * dv, dp = cfg->pool_hidden;
    const int64_t rows = (int64_t)n * P;
    ma_status s = MA_OK;
    float *px = NULL, *x = NULL, *h = NULL, *taps = NULL, *mlp = NULL, *pool_in = NULL, *query = NULL;
    float *pq = NULL, *pk = NULL, *pv = NULL, *po = NULL, *pooled = NULL, *stage = NULL, *posrow = NULL;
    px = ma_malloc((size_t)(rows * pp), sizeof(float), err, "pixels");
    x = ma_malloc((size_t)(rows * dv), sizeof(float), err, "vit hidden");
    h = ma_malloc((size_t)(rows * dv), sizeof(float), err, "vit hidden");
    taps = ma_malloc((size_t)(rows * c2), sizeof(float), err, "vit taps");
    mlp = ma_malloc((size_t)(rows * cfg->vit_inter), sizeof(float), err, "vit mlp");
    posrow = ma_malloc((size_t)dv, sizeof(float), err, "pos");
    if (!px || !x || !h || !taps || !mlp || !posrow) { s = MA_ERR_NOMEM; goto done; }
    /* upstream canonicalises float pixels onto the uint8 grid before the ViT */
    for (int64_t i = 0; i < rows * pp; i++) {
        float u = nearbyintf((pixels[i] + 1.0f) * 0.5f * 255.0f);
        u = u < 0.0f ? 0.0f : (u > 255.0f ? 255.0f : u);
        px[i] = u / 255.0f * 2.0f - 1.0f;
    }
    if ((s = ma_linear(kc, px, rows, &w->patch_w, w->patch_b, x, err))) goto done;
    for (int p = 0; p < P; p++) {
        ma_mat_row(&w->pos, p, posrow);
        for (int img = 0; img < n; img++) ma_add(x + ((int64_t)img * P + p) * dv, posrow, dv);
    }
    for (int b = 0; b < w->n_blocks; b++) {
        const ma_vit_block_w *bw = &w->blocks[b];
        memcpy(h, x, sizeof(float) * (size_t)(rows * dv));
        ma_layernorm(h, rows, dv, bw->ln1_w, bw->ln1_b, cfg->vit_eps);
        if ((s = vit_self_attention(cfg, &bw->attn, kc, h, n, P, mlp, err))) goto done;
        ma_add(x, mlp, rows * dv);
        memcpy(h, x, sizeof(float) * (size_t)(rows * dv));
        ma_layernorm(h, rows, dv, bw->ln2_w, bw->ln2_b, cfg->vit_eps);
        if ((s = ma_linear(kc, h, rows, &bw->w1, bw->b1, mlp, err))) goto done;
        ma_activate_ctx(kc, mlp, rows * cfg->vit_inter, cfg->vit_act);
        if ((s = ma_linear(kc, mlp, rows, &bw->w2, bw->b2, h, err))) goto done;
        ma_add(x, h, rows * dv);
        for (int t = 0; t < cfg->n_taps; t++)
            if (cfg->taps[t] == b)
                for (int64_t r = 0; r < rows; r++) memcpy(taps + r * c2 + (int64_t)t * dv, x + r * dv, sizeof(float) * (size_t)dv);
    }
    if (trace && trace->taps) memcpy(trace->taps, taps, sizeof(float) * (size_t)(rows * c2));

    /* ---- 2x2 attention pooling: gather, masked-mean query, 4 masked keys */
    const int64_t nt = (int64_t)n * T;
    const int PH = cfg->pooled_h * 2, PW = cfg->pooled_w * 2;
    const int top = (PH - cfg->patch_h) / 2, left = (PW - cfg->patch_w) / 2;
    const int Hp = cfg->pool_heads, KVp = cfg->pool_kv_heads, hdp = cfg->pool_head_dim, grp = Hp / KVp;
    const int64_t qd = (int64_t)Hp * hdp, kd = (int64_t)KVp * hdp;
    pool_in = ma_calloc((size_t)(nt * 4 * c2), sizeof(float), err, "pool input");
    query = ma_calloc((size_t)(nt * c2), sizeof(float), err, "pool query");
    pq = ma_malloc((size_t)(nt * qd), sizeof(float), err, "pool q");
    pk = ma_malloc((size_t)(nt * 4 * kd), sizeof(float), err, "pool k");
    pv = ma_malloc((size_t)(nt * 4 * kd), sizeof(float), err, "pool v");
    po = ma_malloc((size_t)(nt * qd), sizeof(float), err, "pool out");
    pooled = ma_malloc((size_t)(nt * dp), sizeof(float), err, "pooled");
    uint8_t *valid = ma_calloc((size_t)(nt * 4), 1, err, "pool mask");
    if (!pool_in || !query || !pq || !pk || !pv || !po || !pooled || !valid) { free(valid); s = MA_ERR_NOMEM; goto done; }
    for (int img = 0; img < n; img++)
        for (int ti = 0; ti < cfg->pooled_h; ti++)
            for (int tj = 0; tj < cfg->pooled_w; tj++) {
                int64_t tok = (int64_t)img * T + ti * cfg->pooled_w + tj;
                int count = 0;
                for (int slot = 0; slot < 4; slot++) {
                    int r = 2 * ti + slot / 2 - top, c = 2 * tj + slot % 2 - left;
                    if (r < 0 || r >= cfg->patch_h || c < 0 || c >= cfg->patch_w) continue;
                    valid[tok * 4 + slot] = 1;
                    count++;
                    memcpy(pool_in + (tok * 4 + slot) * c2, taps + ((int64_t)img * P + r * cfg->patch_w + c) * c2, sizeof(float) * (size_t)c2);
                }
                float *qrow = query + tok * c2;
                for (int slot = 0; slot < 4; slot++) ma_add(qrow, pool_in + (tok * 4 + slot) * c2, c2);
                float denom = cfg->pool_mask ? (float)(count ? count : 1) : 4.0f;
                for (int c = 0; c < c2; c++) qrow[c] /= denom;
            }
    if ((s = ma_linear(kc, query, nt, &w->pool.wq, w->pool.bq, pq, err)) ||
        (s = ma_linear_fused(kc, pool_in, nt * 4, 2, (const ma_mat *[2]){&w->pool.wk, &w->pool.wv},
                             (const float *[2]){w->pool.bk, w->pool.bv}, (float *[2]){pk, pv}, err))) { free(valid); goto done; }
    const float scale = 1.0f / sqrtf((float)hdp);
    for (int64_t tok = 0; tok < nt; tok++)
        for (int hh = 0; hh < Hp; hh++) {
            const float *qv = pq + tok * qd + hh * hdp;
            float sc[4], mx = -INFINITY;
            for (int slot = 0; slot < 4; slot++) {
                const float *kv = pk + (tok * 4 + slot) * kd + (hh / grp) * hdp;
                float acc = 0.0f;
                for (int e = 0; e < hdp; e++) acc += qv[e] * kv[e];
                sc[slot] = (cfg->pool_mask && !valid[tok * 4 + slot]) ? -INFINITY : acc * scale;
                mx = sc[slot] > mx ? sc[slot] : mx;
            }
            float sum = 0.0f;
            for (int slot = 0; slot < 4; slot++) { sc[slot] = expf(sc[slot] - mx); sum += sc[slot]; }
            float *o = po + tok * qd + hh * hdp;
            for (int e = 0; e < hdp; e++) o[e] = 0.0f;
            for (int slot = 0; slot < 4; slot++) {
                const float *vv = pv + (tok * 4 + slot) * kd + (hh / grp) * hdp;
                float p = sc[slot] / sum;
                for (int e = 0; e < hdp; e++) o[e] += p * vv[e];
            }
        }
    free(valid);
    if ((s = ma_linear(kc, po, nt, &w->pool.wo, w->pool.bo, pooled, err))) goto done;
    if (trace && trace->pooled) memcpy(trace->pooled, pooled, sizeof(float) * (size_t)(nt * dp));

    /* ---- Grid Sampler and projector, in the checkpoint's order */
    const int K = ma_vision_tokens(cfg, w);
    const int64_t nk = (int64_t)n * K;
    float *coords = trace ? trace->coords : NULL;
    if (w->sampler_place == MA_SAMPLER_AFTER_POOLING) {
        stage = ma_malloc((size_t)(nk * dp), sizeof(float), err, "sampled");
        if (!stage) { s = MA_ERR_NOMEM; goto done; }
        if ((s = sample_images(cfg, w, kc, pooled, dp, NULL, n, stage, coords, err))) goto done;
        if ((s = projector(cfg, w, kc, stage, nk, features, err))) goto done;
        if (trace && trace->projected) memcpy(trace->projected, features, sizeof(float) * (size_t)(nk * cfg->d));
    } else if (w->sampler_place == MA_SAMPLER_AFTER_PROJECTOR) {
        /* the sampler reads the projector's hidden activations and applies its last linear to
         * K + 1 rows per image (sampler_forward); the full projection only for a trace */
        stage = ma_malloc((size_t)(nt * cfg->proj_inter), sizeof(float), err, "projector hidden");
        if (!stage) { s = MA_ERR_NOMEM; goto done; }
        if ((s = projector_hidden(cfg, w, kc, pooled, nt, stage, err))) goto done;
        if (trace && trace->projected && (s = ma_linear(kc, stage, nt, &w->proj_w2, NULL, trace->projected, err))) goto done;
        if ((s = sample_images(cfg, w, kc, stage, cfg->proj_inter, &w->proj_w2, n, features, coords, err))) goto done;
    } else {
        if ((s = projector(cfg, w, kc, pooled, nt, features, err))) goto done;
        if (trace && trace->projected) memcpy(trace->projected, features, sizeof(float) * (size_t)(nt * cfg->d));
    }
done:
    free(px); free(x); free(h); free(taps); free(mlp); free(pool_in); free(query); free(posrow);
    free(pq); free(pk); free(pv); free(po); free(pooled); free(stage);
    return s;
}
