/* SPDX-License-Identifier: Apache-2.0 */
/* Vision session: SigLIP ViT with two feature taps -> 2x2 attention pooling -> SwiGLU projector,
 * with the Grid Sampler (ActiveTokenSampler) after the pooling or after the projector.
 * docs/ARCHITECTURE.md "Vision". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/gemm.h"
#include "kernels/threads.h"
#include "kernels/vecmath.h"
#include "model/model.h"

#define VB "model.vision_backbone."

/* ------------------------------------------------------------------------------ binding */

static ma_status bind_attn(ma_weightset *ws, const char *prefix, int in_dim, int heads, int kv_heads, int hd, int out_dim, ma_vit_attn_w *a,
                           ma_error *err) {
    char n[256];
    ma_status s;
#define MAT(field, leaf, r, c)                                      \
    do {                                                            \
        snprintf(n, sizeof n, "%s%s.weight", prefix, leaf);         \
        if ((s = ma_ws_mat(ws, n, r, c, &a->field, err))) return s; \
    } while (0)
#define VEC(field, leaf, len)                                      \
    do {                                                           \
        snprintf(n, sizeof n, "%s%s.bias", prefix, leaf);          \
        if ((s = ma_ws_vec(ws, n, len, &a->field, err))) return s; \
    } while (0)
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
            return ma_fail(err, MA_ERR_FORMAT,
                           "%s: config.json sets use_grid_token_sampler but the checkpoint has no "
                           "token sampler tensors (scout_mlp.0.weight)",
                           ws->label);
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
    if (cfg->use_grid_sampler_set && !cfg->use_grid_sampler)
        return ma_fail(err, MA_ERR_FORMAT,
                       "%s: config.json sets use_grid_token_sampler false but the checkpoint has a "
                       "token sampler (%sscout_mlp.0.weight)",
                       ws->label, prefix);
    if (cfg->grid_tokens_set && sw->tokens != cfg->grid_tokens)
        return ma_fail(err, MA_ERR_SHAPE,
                       "%s: config.json grid_token_sampler_num_tokens is %d but the token sampler "
                       "(%sscout_mlp.2.weight) samples %d",
                       ws->label, cfg->grid_tokens, prefix, sw->tokens);
    sw->coord_hidden = (int)c0->shape[0];
    if (sw->channels == cfg->d) w->sampler_place = MA_SAMPLER_AFTER_PROJECTOR;
    else if (sw->channels == cfg->pool_hidden) w->sampler_place = MA_SAMPLER_AFTER_POOLING;
    else
        return ma_fail(err, MA_ERR_SHAPE, "%s: token sampler width %d matches neither the pooled (%d) nor the projected (%d) features",
                       ws->label, sw->channels, cfg->pool_hidden, cfg->d);
    ma_status s;
#define SM(field, leaf, r, c)                                        \
    do {                                                             \
        snprintf(n, sizeof n, "%s%s.weight", prefix, leaf);          \
        if ((s = ma_ws_mat(ws, n, r, c, &sw->field, err))) return s; \
    } while (0)
#define SV(field, leaf, len)                                        \
    do {                                                            \
        snprintf(n, sizeof n, "%s%s.bias", prefix, leaf);           \
        if ((s = ma_ws_vec(ws, n, len, &sw->field, err))) return s; \
    } while (0)
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
#define V(field, leaf, len)                                         \
    do {                                                            \
        snprintf(n, sizeof n, "%s%s", pre, leaf);                   \
        if ((s = ma_ws_vec(ws, n, len, &bw->field, err))) return s; \
    } while (0)
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
    if ((s = bind_attn(ws, VB "image_pooling_2d.", cfg->n_taps * dv, cfg->pool_heads, cfg->pool_kv_heads, cfg->pool_head_dim,
                       cfg->pool_hidden, &w->pool, err)))
        return s;
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

/* ------------------------------------------------------------------------------ pooling */

/* rows [r0, r0 + n) of w as a GEMM operand: in the panel layout the covering whole panels
 * (*cols columns from row r0 - *skip) */
static ma_bmat weight_rows(const ma_mat *w, int64_t r0, int64_t n, int64_t *cols, int64_t *skip) {
    if (w->panels) {
        const int64_t p0 = r0 / MA_GEMM_NR, p1 = (r0 + n + MA_GEMM_NR - 1) / MA_GEMM_NR;
        *cols = (p1 - p0) * MA_GEMM_NR; /* the panel layout pads the last panel's rows */
        *skip = r0 - p0 * MA_GEMM_NR;
        return (ma_bmat){MA_B_PANELS, w->dtype, (const uint8_t *)w->data + (size_t)p0 * ma_panels_size(w->dtype, MA_GEMM_NR, w->cols),
                         w->cols,     0,        w->compute};
    }
    int64_t be;
    size_t bb;
    ma_dtype_block(w->dtype, &be, &bb);
    *cols = n;
    *skip = 0;
    return (ma_bmat){MA_B_ROWS, w->dtype, (const uint8_t *)w->data + (size_t)(r0 * w->cols / be) * bb, w->cols, 0, w->compute};
}

/* the weights the linear form of the pooling can read as B [K][N] (u = q_h Wk_g): float types */
static int pool_linear_ok(const ma_vit_attn_w *a) {
    const ma_dtype dt = a->wk.dtype;
    return dt == MA_DT_F32 || dt == MA_DT_F16 || dt == MA_DT_BF16;
}

typedef struct pool_pass {
    const float *x;       /* [tokens, 4, c2] slot features (invalid slots zero) */
    const uint8_t *valid; /* [tokens, 4] */
    float *u;             /* [tokens, H, c2] for H heads: Wk_g^T q_h in, the weighted slot mean out */
    int64_t tokens, c2;
    int H, mask;
    float scale;
} pool_pass;

/* per token and head: scores of the four slots against u, softmax, u <- sum_s p_s x_s */
static void pool_pass_task(void *ctx, int t, int T) {
    const pool_pass *pp = ctx;
    const ma_vecmath *vm = ma_vecmath_get();
    long lo, hi;
    ma_split_range((long)pp->tokens, t, T, &lo, &hi);
    for (long tok = lo; tok < hi; tok++) {
        const float *xs = pp->x + (int64_t)tok * 4 * pp->c2;
        int allowed[4], any = 0;
        for (int s = 0; s < 4; s++) any |= allowed[s] = !pp->mask || pp->valid[tok * 4 + s];
        if (!any) /* a fully masked row is uniform, as adding finfo.min to every score makes it */
            for (int s = 0; s < 4; s++) allowed[s] = 1;
        for (int h = 0; h < pp->H; h++) {
            float *u = pp->u + ((int64_t)tok * pp->H + h) * pp->c2, sc[4], mx = -INFINITY, sum = 0.0f;
            for (int s = 0; s < 4; s++) {
                sc[s] = allowed[s] ? vm->dot(u, xs + s * pp->c2, pp->c2) * pp->scale : -INFINITY;
                mx = sc[s] > mx ? sc[s] : mx;
            }
            for (int s = 0; s < 4; s++) {
                sc[s] = allowed[s] ? expf(sc[s] - mx) : 0.0f;
                sum += sc[s];
            }
            memset(u, 0, sizeof(float) * (size_t)pp->c2);
            for (int s = 0; s < 4; s++)
                if (sc[s] != 0.0f) vm->axpy(u, sc[s] / sum, xs + s * pp->c2, pp->c2);
        }
    }
}

/* The pooling as upstream computes it: keys and values of all four slots (the scalar path, the
 * tests' reference for the linear form, and quantised wk). */
static ma_status pool_attention_slots(const ma_config *cfg, const ma_vit_attn_w *a, ma_kctx *kc, const float *pool_in, const uint8_t *valid,
                                      const float *pq, int64_t nt, float *po, ma_error *err) {
    const int H = cfg->pool_heads, KV = cfg->pool_kv_heads, hd = cfg->pool_head_dim, grp = H / KV;
    const int64_t qd = (int64_t)H * hd, kd = (int64_t)KV * hd;
    float *pk = ma_malloc((size_t)(nt * 4 * kd), sizeof(float), err, "pool k");
    float *pv = ma_malloc((size_t)(nt * 4 * kd), sizeof(float), err, "pool v");
    ma_status s = MA_OK;
    if (!pk || !pv) {
        s = MA_ERR_NOMEM;
        goto done;
    }
    if ((s = ma_linear_fused(kc, pool_in, nt * 4, 2, (const ma_mat *[2]){&a->wk, &a->wv}, (const float *[2]){a->bk, a->bv},
                             (float *[2]){pk, pv}, err)))
        goto done;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int64_t tok = 0; tok < nt; tok++)
        for (int hh = 0; hh < H; hh++) {
            const float *qv = pq + tok * qd + hh * hd;
            float sc[4], mx = -INFINITY;
            for (int slot = 0; slot < 4; slot++) {
                const float *kv = pk + (tok * 4 + slot) * kd + (hh / grp) * hd;
                float acc = 0.0f;
                for (int e = 0; e < hd; e++) acc += qv[e] * kv[e];
                sc[slot] = (cfg->pool_mask && !valid[tok * 4 + slot]) ? -INFINITY : acc * scale;
                mx = sc[slot] > mx ? sc[slot] : mx;
            }
            if (mx == -INFINITY) /* fully masked: uniform, as adding finfo.min to every score makes it */
                for (int slot = 0; slot < 4; slot++) sc[slot] = 0.0f, mx = 0.0f;
            float sum = 0.0f;
            for (int slot = 0; slot < 4; slot++) {
                sc[slot] = expf(sc[slot] - mx);
                sum += sc[slot];
            }
            float *o = po + tok * qd + hh * hd;
            for (int e = 0; e < hd; e++) o[e] = 0.0f;
            for (int slot = 0; slot < 4; slot++) {
                const float *vv = pv + (tok * 4 + slot) * kd + (hh / grp) * hd;
                float p = sc[slot] / sum;
                for (int e = 0; e < hd; e++) o[e] += p * vv[e];
            }
        }
done:
    free(pk);
    free(pv);
    return s;
}

#define POOL_HEADS 4 /* heads per pass: the [tokens, heads, c2] buffer of two images is 14 MB */

/* The pooling's keys and values are linear in the slot features x_s, so for head h (kv head g)
 *   score_s = q_h . (Wk_g x_s + bk_g) / sqrt(hd) = (Wk_g^T q_h) . x_s / sqrt(hd) + c, with c the same
 *   for every slot (the softmax drops it), and
 *   out_h = sum_s p_s (Wv_g x_s + bv_g) = Wv_g (sum_s p_s x_s) + bv_g   (sum_s p_s = 1).
 * wk and wv are then applied to one row per token and head instead of to four slot rows: a
 * quarter of their products (the two are most of the pooling's FLOPs). The same function in
 * exact arithmetic; in fp32 the sums run in another order. pq [nt, H*hd] in, po [nt, H*hd] out. */
static ma_status pool_attention_linear(const ma_config *cfg, const ma_vit_attn_w *a, const float *pool_in, const uint8_t *valid,
                                       const float *pq, int64_t nt, float *po, ma_error *err) {
    const int H = cfg->pool_heads, KV = cfg->pool_kv_heads, hd = cfg->pool_head_dim, grp = H / KV;
    const int64_t c2 = a->wk.cols, qd = (int64_t)H * hd;
    const int hg = H < POOL_HEADS ? H : POOL_HEADS;
    float *u = ma_malloc((size_t)(nt * hg * c2), sizeof(float), err, "pool u");
    float *o = ma_malloc((size_t)(nt * (hd + 2 * MA_GEMM_NR)), sizeof(float), err, "pool head out");
    if (!u || !o) {
        free(u);
        free(o);
        return MA_ERR_NOMEM;
    }
    const size_t es = ma_dtype_size(a->wk.dtype);
    for (int h0 = 0; h0 < H; h0 += hg) {
        const int nh = H - h0 < hg ? H - h0 : hg;
        for (int i = 0; i < nh; i++) { /* u_h = q_h Wk_g: Wk's rows g*hd.. read as B [hd][c2] */
            const int64_t r0 = (int64_t)((h0 + i) / grp) * hd;
            const ma_bmat wk = a->wk.panels ? (ma_bmat){MA_B_PANELS_T, a->wk.dtype, a->wk.data, c2, r0, a->wk.compute}
                                            : (ma_bmat){MA_B_COLS, a->wk.dtype, (const uint8_t *)a->wk.data + (size_t)(r0 * c2) * es,
                                                        c2,        0,           a->wk.compute};
            ma_gemm(nt, c2, hd, pq + (int64_t)(h0 + i) * hd, qd, &wk, NULL, 0, u + (int64_t)i * c2, nh * c2);
        }
        pool_pass pp = {pool_in, valid, u, nt, c2, nh, cfg->pool_mask, 1.0f / sqrtf((float)hd)};
        ma_parallel(pool_pass_task, &pp);
        for (int i = 0; i < nh; i++) { /* out_h = Wv_g ybar_h + bv_g */
            const int64_t r0 = (int64_t)((h0 + i) / grp) * hd;
            int64_t cols, skip;
            const ma_bmat wv = weight_rows(&a->wv, r0, hd, &cols, &skip);
            ma_gemm(nt, cols, c2, u + (int64_t)i * c2, nh * c2, &wv, NULL, 0, o, cols);
            for (int64_t t = 0; t < nt; t++) {
                float *dst = po + t * qd + (int64_t)(h0 + i) * hd;
                for (int e = 0; e < hd; e++) dst[e] = o[t * cols + skip + e] + a->bv[r0 + e];
            }
        }
    }
    free(u);
    free(o);
    return MA_OK;
}

/* ------------------------------------------------------------------------------ forward */

/* multi-head attention of x [n*L, dim] over itself per image (ViT blocks); out [n*L, dim] */
static ma_status vit_self_attention(const ma_config *cfg, const ma_vit_attn_w *a, ma_kctx *kc, const float *x, int n, int L, float *out,
                                    ma_error *err) {
    const int H = cfg->vit_heads, KV = cfg->vit_kv_heads, hd = cfg->vit_head_dim, grp = H / KV;
    const int64_t rows = (int64_t)n * L, qd = (int64_t)H * hd, kd = (int64_t)KV * hd;
    ma_status s = MA_OK;
    float *q = ma_malloc((size_t)(rows * qd), sizeof(float), err, "vit q");
    float *k = ma_malloc((size_t)(rows * kd), sizeof(float), err, "vit k");
    float *v = ma_malloc((size_t)(rows * kd), sizeof(float), err, "vit v");
    float *o = ma_malloc((size_t)(rows * qd), sizeof(float), err, "vit attn");
    if (!q || !k || !v || !o) {
        s = MA_ERR_NOMEM;
        goto done;
    }
    {
        const ma_mat *ws[3] = {&a->wq, &a->wk, &a->wv};
        const float *bs[3] = {a->bq, a->bk, a->bv};
        float *ys[3] = {q, k, v};
        if ((s = ma_linear_fused(kc, x, rows, 3, ws, bs, ys, err))) goto done;
    }
    ma_attn_args att = {n,
                        H,
                        H / grp,
                        L,
                        L,
                        hd,
                        q,
                        k,
                        v,
                        o,
                        qd,
                        kd,
                        kd,
                        qd,
                        (int64_t)L * qd,
                        (int64_t)L * kd,
                        (int64_t)L * kd,
                        (int64_t)L * qd,
                        NULL,
                        a->wq.compute};
    s = ma_attention(kc, &att, err);
    if (!s) s = ma_linear(kc, o, rows, &a->wo, a->bo, out, err);
done:
    free(q);
    free(k);
    free(v);
    free(o);
    return s;
}

/* one image's feature map as a square grid [S*S, Cm] (channels last): itself when square, else
 * average-pooled to S = min(H, W) into *fmap */
static const float *square_map(const float *tokens, int Cm, int H, int W, float **fmap, ma_error *err) {
    if (H == W) return tokens;
    const int S = H < W ? H : W;
    *fmap = ma_calloc((size_t)S * S * Cm, sizeof(float), err, "sampler");
    if (!*fmap) return NULL;
    for (int oi = 0; oi < S; oi++)
        for (int oj = 0; oj < S; oj++) {
            int h0 = (int)floor((double)oi * H / S), h1 = (int)ceil((double)(oi + 1) * H / S);
            int w0 = (int)floor((double)oj * W / S), w1 = (int)ceil((double)(oj + 1) * W / S);
            float *dst = *fmap + ((size_t)oi * S + oj) * Cm;
            for (int c = 0; c < Cm; c++) {
                double acc = 0.0;
                for (int i = h0; i < h1; i++)
                    for (int j = w0; j < w1; j++) acc += tokens[((size_t)i * W + j) * Cm + c];
                dst[c] = (float)(acc / ((double)(h1 - h0) * (w1 - w0)));
            }
        }
    return *fmap;
}

/* grid_sample(bilinear, align_corners=False, zeros) of an S x S map at (x, y) in [0, 1]: pixel
 * centres at (i + 0.5) / S */
static void bilinear(const float *map, int S, int Cm, float x, float y, float *dst) {
    float gx = x * 2.0f - 1.0f, gy = y * 2.0f - 1.0f;
    float ix = ((gx + 1.0f) * (float)S - 1.0f) / 2.0f, iy = ((gy + 1.0f) * (float)S - 1.0f) / 2.0f;
    float x0f = floorf(ix), y0f = floorf(iy);
    int x0 = (int)x0f, y0 = (int)y0f;
    float wx = ix - x0f, wy = iy - y0f;
    float wts[4] = {(1 - wy) * (1 - wx), (1 - wy) * wx, wy * (1 - wx), wy * wx};
    int xs[4] = {x0, x0 + 1, x0, x0 + 1}, ys[4] = {y0, y0, y0 + 1, y0 + 1};
    for (int c = 0; c < Cm; c++) dst[c] = 0.0f;
    for (int q = 0; q < 4; q++) {
        if (xs[q] < 0 || xs[q] >= S || ys[q] < 0 || ys[q] >= S) continue;
        const float *src = map + ((size_t)ys[q] * S + xs[q]) * Cm;
        for (int c = 0; c < Cm; c++) dst[c] += wts[q] * src[c];
    }
}

/* The Grid Sampler over n images at once (each linear runs once over all the images' rows):
 * tokens [n, H*W, Cm] -> out [n, K, C], coords_out [n, K, 2] (x, y) or NULL.
 * The sampler reads its feature map only through averages and bilinear weights, both linear.
 * With `lift` the map holds the projector's hidden activations (Cm channels) instead of its
 * output, and lift (the projector's last, bias-free linear) maps the global mean and the K samples
 * to the C channels: the same features from K + 1 rows of that linear instead of H*W (in exact
 * arithmetic; in fp32 the sums are taken in another order). lift NULL: Cm == C. */
static ma_status sampler_forward(const ma_sampler_w *w, ma_kctx *kc, const float *tokens, int n, int Cm, const ma_mat *lift, int H, int W,
                                 float *out, float *coords_out, ma_error *err) {
    const int C = w->channels, K = w->tokens, S = H < W ? H : W,
              hmax = w->scout_hidden > w->coord_hidden ? w->scout_hidden : w->coord_hidden;
    const int64_t nk = (int64_t)n * K;
    ma_status s = MA_OK;
    float *fmap = NULL;
    float *gm = ma_malloc((size_t)n * (size_t)Cm, sizeof(float), err, "sampler");
    float *glob = lift ? ma_malloc((size_t)n * (size_t)C, sizeof(float), err, "sampler") : gm;
    float *coords = ma_malloc((size_t)(2 * nk), sizeof(float), err, "sampler");
    float *hid = ma_malloc((size_t)(nk > n ? nk : n) * (size_t)hmax, sizeof(float), err, "sampler");
    float *cemb = ma_malloc((size_t)nk * (size_t)C, sizeof(float), err, "sampler");
    float *samp = lift ? ma_malloc((size_t)nk * (size_t)Cm, sizeof(float), err, "sampler") : out;
    double *sums = ma_malloc((size_t)Cm, sizeof(double), err, "sampler");
    if (!gm || !glob || !coords || !hid || !cemb || !samp || !sums) {
        s = MA_ERR_NOMEM;
        goto done;
    }
    /* the global mean, row by row: every channel's sum in the same order as a column walk, but
     * Cm independent chains instead of one (Cm is the projector's 9728 with lift) */
    for (int img = 0; img < n; img++) {
        const float *map = square_map(tokens + (size_t)img * H * W * Cm, Cm, H, W, &fmap, err);
        if (!map) {
            s = MA_ERR_NOMEM;
            goto done;
        }
        memset(sums, 0, sizeof(double) * (size_t)Cm);
        for (int i = 0; i < S * S; i++)
            for (int c = 0; c < Cm; c++) sums[c] += map[(size_t)i * Cm + c];
        for (int c = 0; c < Cm; c++) gm[(size_t)img * Cm + c] = (float)(sums[c] / (S * S));
        free(fmap);
        fmap = NULL;
    }
    /* The coordinates: the global mean -> (lift) -> scout MLP -> sigmoid. The sampled features
     * are a bilinear read of the map at them, as sensitive to a coordinate as the map is rough,
     * and the sigmoid is steep where it is not saturated: with q8_0 weights, int8 activations
     * in these three products moved the full-size model's coordinates by up to 0.15 of the
     * image, against 0.10 from the weights' rounding alone, and the image features' cosine from
     * 0.971 to 0.924. So they keep fp32 activations on every kernel set (MA_COMPUTE_EXACT: n
     * rows each, no measurable time; a bf16 plan's products of n <= 12 rows are fp32 anyway). */
    ma_mat lift_x = lift ? *lift : (ma_mat){0}, scout0 = w->scout0, scout2 = w->scout2;
    lift_x.compute = scout0.compute = scout2.compute = MA_COMPUTE_EXACT;
    if (lift && (s = ma_linear(kc, gm, n, &lift_x, NULL, glob, err))) goto done;
    /* scout MLP: Linear -> ReLU -> Linear -> Sigmoid; output 2k is x (width), 2k+1 is y */
    if ((s = ma_linear(kc, glob, n, &scout0, w->scout0_b, hid, err))) goto done;
    ma_activate_ctx(kc, hid, (int64_t)n * w->scout_hidden, MA_ACT_RELU);
    if ((s = ma_linear(kc, hid, n, &scout2, w->scout2_b, coords, err))) goto done;
    for (int64_t i = 0; i < 2 * nk; i++) coords[i] = 1.0f / (1.0f + expf(-coords[i]));
    for (int img = 0; img < n; img++) {
        const float *map = square_map(tokens + (size_t)img * H * W * Cm, Cm, H, W, &fmap, err);
        if (!map) {
            s = MA_ERR_NOMEM;
            goto done;
        }
        for (int k = 0; k < K; k++) {
            const int64_t r = (int64_t)img * K + k;
            bilinear(map, S, Cm, coords[2 * r], coords[2 * r + 1], samp + r * Cm);
        }
        free(fmap);
        fmap = NULL;
    }
    if (lift && (s = ma_linear(kc, samp, nk, lift, NULL, out, err))) goto done;
    /* coordinate embedding of each (x, y) point in [0, 1], added to its sample */
    if ((s = ma_linear(kc, coords, nk, &w->coord0, w->coord0_b, hid, err))) goto done;
    ma_activate_ctx(kc, hid, nk * w->coord_hidden, MA_ACT_RELU);
    if ((s = ma_linear(kc, hid, nk, &w->coord2, w->coord2_b, cemb, err))) goto done;
    ma_add(out, cemb, nk * C);
    if (coords_out) memcpy(coords_out, coords, sizeof(float) * 2 * (size_t)nk);
done:
    free(fmap);
    free(gm);
    free(coords);
    free(hid);
    free(cemb);
    free(sums);
    if (lift) {
        free(glob);
        free(samp);
    }
    return s;
}

/* the projector's SwiGLU hidden activations: silu(x W1^T) * (x W3^T), [rows, proj_inter] */
static ma_status projector_hidden(const ma_config *cfg, const ma_vision_w *w, ma_kctx *kc, const float *x, int64_t rows, float *g,
                                  ma_error *err) {
    ma_status s = MA_OK;
    float *u = ma_malloc((size_t)(rows * cfg->proj_inter), sizeof(float), err, "projector");
    if (!u) return MA_ERR_NOMEM;
    {
        const ma_mat *ws[2] = {&w->proj_w1, &w->proj_w3};
        const float *bs[2] = {NULL, NULL};
        float *ys[2] = {g, u};
        if ((s = ma_linear_fused(kc, x, rows, 2, ws, bs, ys, err))) goto done;
    }
    ma_glu(kc, g, cfg->proj_inter, g, cfg->proj_inter, u, cfg->proj_inter, rows, cfg->proj_inter, cfg->proj_act);
done:
    free(u);
    return s;
}

static ma_status projector(const ma_config *cfg, const ma_vision_w *w, ma_kctx *kc, const float *x, int64_t rows, float *out,
                           ma_error *err) {
    float *g = ma_malloc((size_t)(rows * cfg->proj_inter), sizeof(float), err, "projector");
    if (!g) return MA_ERR_NOMEM;
    ma_status s = projector_hidden(cfg, w, kc, x, rows, g, err);
    if (!s) s = ma_linear(kc, g, rows, &w->proj_w2, NULL, out, err);
    free(g);
    return s;
}

ma_status ma_vision_forward(const ma_config *cfg, const ma_vision_w *w, ma_kctx *kc, const float *pixels, int n, float *features,
                            const ma_vision_trace *trace, ma_error *err) {
    const int P = cfg->patch_h * cfg->patch_w, dv = cfg->vit_hidden, pp = 3 * cfg->patch * cfg->patch;
    const int T = cfg->pooled_h * cfg->pooled_w, c2 = cfg->n_taps * dv, dp = cfg->pool_hidden;
    const int64_t rows = (int64_t)n * P;
    ma_status s = MA_OK;
    float *px = NULL, *x = NULL, *h = NULL, *taps = NULL, *mlp = NULL, *pool_in = NULL, *query = NULL;
    float *pq = NULL, *po = NULL, *pooled = NULL, *stage = NULL, *posrow = NULL;
    px = ma_malloc((size_t)(rows * pp), sizeof(float), err, "pixels");
    x = ma_malloc((size_t)(rows * dv), sizeof(float), err, "vit hidden");
    h = ma_malloc((size_t)(rows * dv), sizeof(float), err, "vit hidden");
    taps = ma_malloc((size_t)(rows * c2), sizeof(float), err, "vit taps");
    mlp = ma_malloc((size_t)(rows * cfg->vit_inter), sizeof(float), err, "vit mlp");
    posrow = ma_malloc((size_t)dv, sizeof(float), err, "pos");
    if (!px || !x || !h || !taps || !mlp || !posrow) {
        s = MA_ERR_NOMEM;
        goto done;
    }
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
        ma_layernorm_to(h, x, rows, dv, bw->ln1_w, bw->ln1_b, cfg->vit_eps);
        if ((s = vit_self_attention(cfg, &bw->attn, kc, h, n, P, mlp, err))) goto done;
        ma_add(x, mlp, rows * dv);
        ma_layernorm_to(h, x, rows, dv, bw->ln2_w, bw->ln2_b, cfg->vit_eps);
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
    const int64_t qd = (int64_t)cfg->pool_heads * cfg->pool_head_dim;
    pool_in = ma_calloc((size_t)(nt * 4 * c2), sizeof(float), err, "pool input");
    query = ma_calloc((size_t)(nt * c2), sizeof(float), err, "pool query");
    pq = ma_malloc((size_t)(nt * qd), sizeof(float), err, "pool q");
    po = ma_malloc((size_t)(nt * qd), sizeof(float), err, "pool out");
    pooled = ma_malloc((size_t)(nt * dp), sizeof(float), err, "pooled");
    uint8_t *valid = ma_calloc((size_t)(nt * 4), 1, err, "pool mask");
    if (!pool_in || !query || !pq || !po || !pooled || !valid) {
        free(valid);
        s = MA_ERR_NOMEM;
        goto done;
    }
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
                    memcpy(pool_in + (tok * 4 + slot) * c2, taps + ((int64_t)img * P + r * cfg->patch_w + c) * c2,
                           sizeof(float) * (size_t)c2);
                }
                float *qrow = query + tok * c2;
                for (int slot = 0; slot < 4; slot++) ma_add(qrow, pool_in + (tok * 4 + slot) * c2, c2);
                float denom = cfg->pool_mask ? (float)(count ? count : 1) : 4.0f;
                for (int c = 0; c < c2; c++) qrow[c] /= denom;
            }
    if ((s = ma_linear(kc, query, nt, &w->pool.wq, w->pool.bq, pq, err))) {
        free(valid);
        goto done;
    }
    s = !kc->scalar && pool_linear_ok(&w->pool) ? pool_attention_linear(cfg, &w->pool, pool_in, valid, pq, nt, po, err)
                                                : pool_attention_slots(cfg, &w->pool, kc, pool_in, valid, pq, nt, po, err);
    free(valid);
    if (s) goto done;
    if ((s = ma_linear(kc, po, nt, &w->pool.wo, w->pool.bo, pooled, err))) goto done;
    if (trace && trace->pooled) memcpy(trace->pooled, pooled, sizeof(float) * (size_t)(nt * dp));

    /* ---- Grid Sampler and projector, in the checkpoint's order */
    const int K = ma_vision_tokens(cfg, w);
    const int64_t nk = (int64_t)n * K;
    float *coords = trace ? trace->coords : NULL;
    if (w->sampler_place == MA_SAMPLER_AFTER_POOLING) {
        stage = ma_malloc((size_t)(nk * dp), sizeof(float), err, "sampled");
        if (!stage) {
            s = MA_ERR_NOMEM;
            goto done;
        }
        if ((s = sampler_forward(&w->sampler, kc, pooled, n, dp, NULL, cfg->pooled_h, cfg->pooled_w, stage, coords, err))) goto done;
        if ((s = projector(cfg, w, kc, stage, nk, features, err))) goto done;
        if (trace && trace->projected) memcpy(trace->projected, features, sizeof(float) * (size_t)(nk * cfg->d));
    } else if (w->sampler_place == MA_SAMPLER_AFTER_PROJECTOR) {
        /* the sampler reads the projector's hidden activations and applies its last linear to
         * K + 1 rows per image (sampler_forward); the full projection only for a trace */
        stage = ma_malloc((size_t)(nt * cfg->proj_inter), sizeof(float), err, "projector hidden");
        if (!stage) {
            s = MA_ERR_NOMEM;
            goto done;
        }
        if ((s = projector_hidden(cfg, w, kc, pooled, nt, stage, err))) goto done;
        if (trace && trace->projected && (s = ma_linear(kc, stage, nt, &w->proj_w2, NULL, trace->projected, err))) goto done;
        if ((s = sampler_forward(&w->sampler, kc, stage, n, cfg->proj_inter, &w->proj_w2, cfg->pooled_h, cfg->pooled_w, features, coords,
                                 err)))
            goto done;
    } else {
        if ((s = projector(cfg, w, kc, pooled, nt, features, err))) goto done;
        if (trace && trace->projected) memcpy(trace->projected, features, sizeof(float) * (size_t)(nt * cfg->d));
    }
done:
    free(px);
    free(x);
    free(h);
    free(taps);
    free(mlp);
    free(pool_in);
    free(query);
    free(posrow);
    free(pq);
    free(po);
    free(pooled);
    free(stage);
    return s;
}
