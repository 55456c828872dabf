/* SPDX-License-Identifier: Apache-2.0 */
/* The SIMD elementwise math, written once over a vector of VW floats and included by
 * vecmath_avx2.c (VW = 8) and vecmath_avx512.c (VW = 16), which define the V_* operations and
 * INSTALL. Same polynomial and the same results per lane at either width. */

/* exp(x): x = n ln2 + r, |r| <= ln2/2; exp(r) by Cephes' expf polynomial; 2^n put into the
 * exponent as 2 * 2^(n-1) so that n = 128 (x up to ln(FLT_MAX)) stays finite. Results below
 * 2^-125 (x < -87) are flushed to 0: they are far under every softmax weight that matters. */
static inline VF vexp(VF x) {
    const VF hi = V_SET1(88.72283f), lo = V_SET1(-87.0f);
    const VF x0 = x;
    x = V_MIN(V_MAX(x, lo), hi);
    const VF n = V_ROUND(V_MUL(x, V_SET1(1.44269504088896341f)));
    VF r = V_FNMADD(n, V_SET1(0.693359375f), x);
    r = V_FNMADD(n, V_SET1(-2.12194440e-4f), r);
    VF p = V_SET1(1.9875691500e-4f);
    p = V_FMADD(p, r, V_SET1(1.3981999507e-3f));
    p = V_FMADD(p, r, V_SET1(8.3334519073e-3f));
    p = V_FMADD(p, r, V_SET1(4.1665795894e-2f));
    p = V_FMADD(p, r, V_SET1(1.6666665459e-1f));
    p = V_FMADD(p, r, V_SET1(5.0000001201e-1f));
    p = V_FMADD(p, V_MUL(r, r), V_ADD(r, V_SET1(1.0f)));
    p = V_MUL(V_ADD(p, p), V_POW2M1(n));
    return V_ZERO_BELOW(p, x0, lo);
}

/* x / (1 + exp(-a x)) */
static inline VF sigmoid_mul(VF x, float a) { return V_DIV(x, V_ADD(V_SET1(1.0f), vexp(V_MUL(x, V_SET1(-a))))); }

static void silu(float *x, int64_t n) {
    int64_t i = 0;
    for (; i + VW <= n; i += VW) V_STORE(x + i, sigmoid_mul(V_LOAD(x + i), 1.0f));
    for (; i < n; i++) x[i] = x[i] / (1.0f + expf(-x[i]));
}

static void quick_gelu(float *x, int64_t n) {
    int64_t i = 0;
    for (; i + VW <= n; i += VW) V_STORE(x + i, sigmoid_mul(V_LOAD(x + i), 1.702f));
    for (; i < n; i++) x[i] = x[i] / (1.0f + expf(-1.702f * x[i]));
}

/* 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3) */
static void gelu_tanh(float *x, int64_t n) {
    const VF c = V_SET1(0.79788456080286536f), c3 = V_SET1(0.044715f), m2 = V_SET1(-2.0f), one = V_SET1(1.0f);
    int64_t i = 0;
    for (; i + VW <= n; i += VW) {
        const VF v = V_LOAD(x + i);
        const VF u = V_MUL(c, V_FMADD(V_MUL(c3, v), V_MUL(v, v), v));
        V_STORE(x + i, V_DIV(v, V_ADD(one, vexp(V_MUL(m2, u)))));
    }
    for (; i < n; i++) {
        float v = x[i];
        x[i] = 0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
    }
}

static float exp_scaled_sum(float *x, int64_t n, float s, float m) {
    const VF sv = V_SET1(s), sm = V_SET1(s * m);
    VF acc = V_ZERO();
    int64_t i = 0;
    for (; i + VW <= n; i += VW) {
        const VF e = vexp(V_FMSUB(V_LOAD(x + i), sv, sm));
        V_STORE(x + i, e);
        acc = V_ADD(acc, e);
    }
    float sum = V_HSUM(acc);
    for (; i < n; i++) {
        x[i] = expf(s * x[i] - s * m);
        sum += x[i];
    }
    return sum;
}

static float vmax(const float *x, int64_t n) {
    VF m = V_SET1(-INFINITY);
    int64_t i = 0;
    for (; i + VW <= n; i += VW) m = V_MAX(m, V_LOAD(x + i));
    float r = V_HMAX(m);
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

static void scale(float *x, int64_t n, float s) {
    const VF v = V_SET1(s);
    int64_t i = 0;
    for (; i + VW <= n; i += VW) V_STORE(x + i, V_MUL(V_LOAD(x + i), v));
    for (; i < n; i++) x[i] *= s;
}

static void mul(float *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + VW <= n; i += VW) V_STORE(y + i, V_MUL(V_LOAD(y + i), V_LOAD(x + i)));
    for (; i < n; i++) y[i] *= x[i];
}

/* four independent FMA chains */
static float dot(const float *a, const float *b, int64_t n) {
    VF s0 = V_ZERO(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 4 * VW <= n; i += 4 * VW) {
        s0 = V_FMADD(V_LOAD(a + i), V_LOAD(b + i), s0);
        s1 = V_FMADD(V_LOAD(a + i + VW), V_LOAD(b + i + VW), s1);
        s2 = V_FMADD(V_LOAD(a + i + 2 * VW), V_LOAD(b + i + 2 * VW), s2);
        s3 = V_FMADD(V_LOAD(a + i + 3 * VW), V_LOAD(b + i + 3 * VW), s3);
    }
    for (; i + VW <= n; i += VW) s0 = V_FMADD(V_LOAD(a + i), V_LOAD(b + i), s0);
    float sum = V_HSUM(V_ADD(V_ADD(s0, s1), V_ADD(s2, s3)));
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

static void axpy(float *y, float a, const float *x, int64_t n) {
    const VF av = V_SET1(a);
    int64_t i = 0;
    for (; i + VW <= n; i += VW) V_STORE(y + i, V_FMADD(av, V_LOAD(x + i), V_LOAD(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

/* Attention of a few queries with the queries in the lanes (see ma_few_attn). A key's scores for
 * all the queries are one vector, sum over d of k_j[d] times the queries' dim d (a broadcast of
 * k_j[d]), so K is read where it lies, row by row, with no transpose or packing; the softmax
 * runs down the keys for every query at once; and out^T[d] = sum over j of v_j[d] times the
 * weights p_j likewise, V read in place. Eight keys (then eight dims) at a time: eight
 * independent FMA chains. Lanes past the last query hold zero queries and are not stored. */
#define FEW8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define FEW_ZERO(u) VF acc##u = V_ZERO();
#define FEW_SCORE(u) acc##u = V_FMADD(V_SET1(kr[(u)*a->k_row + d]), qv, acc##u);
#define FEW_SCORE_STORE(u) V_STORE(e + (j + (u)) * VW, acc##u);
#define FEW_PV(u) acc##u = V_FMADD(V_SET1(vr[u]), p, acc##u);
#define FEW_PV_STORE(u) V_STORE(ot + (u)*VW, V_MUL(acc##u, inv));

/* every line of rows [j, j + n) of one head (hd floats each): K and V rows are a whole model
 * width apart, so each head row sits in its own page, where the hardware prefetchers do not
 * follow; and K and V come from memory (the expert's weights stream through the caches) */
static inline void prefetch_rows(const float *base, int64_t stride, int64_t j, int64_t n, int hd) {
    for (int64_t r = j; r < j + n; r++)
        for (int off = 0; off < hd; off += 16) __builtin_prefetch(base + r * stride + off);
}

static void attend_few(const ma_few_attn *a) {
    const int64_t lk = a->lk;
    const int hd = a->hd;
    float *qt = a->work, *e = qt + (int64_t)hd * VW, *ot = e + lk * VW; /* hd x VW, lk x VW, 8 x VW */
    for (int g = 0; g < a->nq; g += VW) {
        const int nl = a->nq - g < VW ? a->nq - g : VW;
        for (int d = 0; d < hd; d++)
            for (int l = 0; l < VW; l++) qt[d * VW + l] = l < nl ? a->q[(g + l) * a->q_row + d] : 0.0f;
        int64_t j = 0;
        prefetch_rows(a->k, a->k_row, 0, lk < 16 ? lk : 16, hd);
        for (; j + 8 <= lk; j += 8) {
            const float *kr = a->k + j * a->k_row;
            if (j + 24 <= lk) prefetch_rows(a->k, a->k_row, j + 16, 8, hd);
            prefetch_rows(a->v, a->v_row, j, 8, hd); /* for the products with p below */
            FEW8(FEW_ZERO)
            for (int d = 0; d < hd; d++) {
                const VF qv = V_LOAD(qt + d * VW);
                FEW8(FEW_SCORE)
            }
            FEW8(FEW_SCORE_STORE)
        }
        prefetch_rows(a->v, a->v_row, j, lk - j, hd);
        for (; j < lk; j++) {
            const float *kr = a->k + j * a->k_row;
            VF s = V_ZERO();
            for (int d = 0; d < hd; d++) s = V_FMADD(V_SET1(kr[d]), V_LOAD(qt + d * VW), s);
            V_STORE(e + j * VW, s);
        }
        /* a masked key: its whole row of scores; causal: the keys past a lane's query, only
         * from the group's first query on */
        if (a->key_valid)
            for (j = 0; j < lk; j++)
                if (!a->key_valid[j]) V_STORE(e + j * VW, V_SET1(-INFINITY));
        if (a->causal)
            for (j = a->q0 + g + 1 > 0 ? a->q0 + g + 1 : 0; j < lk; j++)
                for (int l = 0; l < VW; l++)
                    if (j > a->q0 + g + l) e[j * VW + l] = -INFINITY;
        VF m = V_SET1(-INFINITY);
        for (j = 0; j < lk; j++) m = V_MAX(m, V_LOAD(e + j * VW));
        float mv[VW];
        V_STORE(mv, m);
        for (int l = 0; l < VW; l++)
            if (mv[l] == -INFINITY) { /* no visible key: uniform weights */
                for (j = 0; j < lk; j++) e[j * VW + l] = 0.0f;
                mv[l] = 0.0f;
            }
        const VF sv = V_SET1(a->scale), sm = V_MUL(V_LOAD(mv), sv);
        VF sum = V_ZERO();
        for (j = 0; j < lk; j++) {
            const VF p = vexp(V_FMSUB(V_LOAD(e + j * VW), sv, sm));
            V_STORE(e + j * VW, p);
            sum = V_ADD(sum, p);
        }
        const VF inv = V_DIV(V_SET1(1.0f), sum);
        int d = 0;
        for (; d + 8 <= hd; d += 8) {
            FEW8(FEW_ZERO)
            for (j = 0; j < lk; j++) {
                const VF p = V_LOAD(e + j * VW);
                const float *vr = a->v + j * a->v_row + d;
                FEW8(FEW_PV)
            }
            FEW8(FEW_PV_STORE)
            for (int l = 0; l < nl; l++)
                for (int u = 0; u < 8; u++) a->out[(g + l) * a->out_row + d + u] = ot[u * VW + l];
        }
        for (; d < hd; d++) {
            VF o = V_ZERO();
            for (j = 0; j < lk; j++) o = V_FMADD(V_SET1(a->v[j * a->v_row + d]), V_LOAD(e + j * VW), o);
            V_STORE(ot, V_MUL(o, inv));
            for (int l = 0; l < nl; l++) a->out[(g + l) * a->out_row + d] = ot[l];
        }
    }
}

/* The portable row sums lane for lane: eight doubles (D8, one or two vectors), lane j summing
 * elements j, j + 8, ..., with a separate multiply and add (no FMA), then the same tail and the
 * same order of combining: the same bits. */
/* x * 0 + acc stays 0 while every x is finite and turns NaN at an infinity or a NaN: four
 * chains of FMAs, checked once per block of 64 vectors; the element is looked for only in a
 * block that has one */
static int64_t first_nonfinite(const float *x, int64_t n) {
    const VF zero = V_ZERO();
    int64_t i = 0;
    while (i + 4 * VW <= n) {
        const int64_t end = n - i < 64 * VW ? i + (n - i) / (4 * VW) * (4 * VW) : i + 64 * VW;
        VF a0 = zero, a1 = zero, a2 = zero, a3 = zero;
        for (int64_t k = i; k < end; k += 4 * VW) {
            a0 = V_FMADD(V_LOAD(x + k), zero, a0);
            a1 = V_FMADD(V_LOAD(x + k + VW), zero, a1);
            a2 = V_FMADD(V_LOAD(x + k + 2 * VW), zero, a2);
            a3 = V_FMADD(V_LOAD(x + k + 3 * VW), zero, a3);
        }
        if (V_HSUM(V_ADD(V_ADD(a0, a1), V_ADD(a2, a3))) != 0.0f)
            for (int64_t k = i; k < end; k++)
                if (!isfinite(x[k])) return k;
        i = end;
    }
    for (; i < n; i++)
        if (!isfinite(x[i])) return i;
    return n;
}

static double sum8(const float *v, int64_t n) {
    D8 acc = D8_ZERO();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = D8_ADD(acc, D8_FROM_F32(v + i));
    double p[8];
    D8_STORE(p, acc);
    for (; i < n; i++) p[0] += (double)v[i];
    return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

static double sum_sq8(const float *v, int64_t n, double mean) {
    const D8 m = D8_SET1(mean);
    D8 acc = D8_ZERO();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const D8 d = D8_SUB(D8_FROM_F32(v + i), m);
        acc = D8_ADD(acc, D8_MUL(d, d));
    }
    double p[8];
    D8_STORE(p, acc);
    for (; i < n; i++) {
        const double d = (double)v[i] - mean;
        p[0] += d * d;
    }
    return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

void INSTALL(ma_vecmath *v) {
    v->dot = dot;
    v->axpy = axpy;
    v->attend_few = attend_few;
    v->sum = sum8;
    v->sum_sq = sum_sq8;
    v->first_nonfinite = first_nonfinite;
    v->silu = silu;
    v->gelu_tanh = gelu_tanh;
    v->quick_gelu = quick_gelu;
    v->exp_scaled_sum = exp_scaled_sum;
    v->max = vmax;
    v->scale = scale;
    v->mul = mul;
}
