/* SPDX-License-Identifier: Apache-2.0 */
/* The C real-time chunking (src/runtime/rtc.c) against what LeRobot's own RTCProcessor produced
 * (tests/fixtures/lerobot_rtc/recorded.json and its README): prefix weights, guidance weights, single
 * guided steps and whole Euler loops, bit for bit (values compared: +0 == -0); and the checks of
 * ma_rtc_check. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "io/mapfile.h"
#include "runtime/rtc.h"

static cJSON *root;

static const cJSON *get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

static int num(const cJSON *o, const char *k) { return get(o, k)->valueint; }

static float hexf(const cJSON *s) {
    uint32_t u = (uint32_t)strtoul(s->valuestring, NULL, 16);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* a hex list of n floats, malloc'ed */
static float *floats(const cJSON *h, int n) {
    assert_int_equal(cJSON_GetArraySize(h), n);
    float *out = malloc(sizeof(float) * (size_t)n);
    assert_non_null(out);
    for (int i = 0; i < n; i++) out[i] = hexf(cJSON_GetArrayItem(h, i));
    return out;
}

static int schedule_of(const char *s) {
    const char *names[] = {"LINEAR", "EXP", "ONES", "ZEROS"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, names[i])) return i;
    fail_msg("schedule %s", s);
    return -1;
}

/* the largest difference seen where a tolerance applies (printed at the end) */
static double worst_exp;

/* got == want, value for value; tol > 0 (the EXP schedule: see rtc.c's expm1) allows
 * |got - want| <= tol * max(1, |want|) */
static void close_to(const float *got, const float *want, int n, double tol, const char *what, int index) {
    for (int i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - (double)want[i]), lim = tol * fmax(1.0, fabs((double)want[i]));
        if (tol > 0 && d > worst_exp) worst_exp = d;
        if (tol > 0 ? !(d <= lim) : !(got[i] == want[i]))
            fail_msg("%s %d [%d]: %.9g (%08x), LeRobot %.9g (%08x)", what, index, i, got[i], bits(got[i]), want[i], bits(want[i]));
    }
}

/* the tolerance of a case: 0 (bit for bit) unless its schedule is EXP, whose weights go through
 * torch.expm1 (SLEEF's, within 1 ulp; ours is the correctly rounded one) */
static double tol_of(const cJSON *c, double exp_tol) { return strcmp(get(c, "schedule")->valuestring, "EXP") ? 0.0 : exp_tol; }

static ma_rtc rtc_of(const cJSON *c, const float *prefix) {
    ma_rtc r = {prefix, num(c, "rows"), num(c, "dim"), num(c, "delay"), 0, 0.0f, schedule_of(get(c, "schedule")->valuestring)};
    const cJSON *h = get(c, "horizon");
    r.horizon = cJSON_IsNumber(h) ? h->valueint : 0; /* None: the config's 10 */
    r.beta = hexf(get(c, "beta_f32_hex"));
    return r;
}

static void test_prefix_weights(void **state) {
    (void)state;
    const cJSON *cases = get(root, "prefix_weights");
    assert_int_equal(cJSON_GetArraySize(cases), 68);
    for (int i = 0; i < cJSON_GetArraySize(cases); i++) {
        const cJSON *c = cJSON_GetArrayItem(cases, i);
        const int total = num(c, "total");
        float *want = floats(get(c, "weights_f32_hex"), total), got[64];
        ma_rtc_prefix_weights(schedule_of(get(c, "schedule")->valuestring), num(c, "delay"), num(c, "horizon"), total, got);
        close_to(got, want, total, tol_of(c, 1.2e-7), "weights case", i); /* EXP: 1 ulp of a weight <= 1 */
        free(want);
    }
}

static void test_guidance_weight(void **state) {
    (void)state;
    const cJSON *cases = get(root, "guidance_weight");
    assert_true(cJSON_GetArraySize(cases) >= 100);
    for (int i = 0; i < cJSON_GetArraySize(cases); i++) {
        const cJSON *c = cJSON_GetArrayItem(cases, i);
        const float tau = hexf(get(c, "tau_f32_hex")), beta = hexf(get(c, "beta_f32_hex")), want = hexf(get(c, "gw_f32_hex"));
        assert_true(tau == (float)((double)num(c, "k") / num(c, "steps"))); /* the pipeline's t_i */
        const float got = ma_rtc_guidance_weight(tau, beta);
        if (bits(got) != bits(want)) fail_msg("gw case %d (tau %.9g beta %g): %.9g, LeRobot %.9g", i, tau, beta, got, want);
    }
    assert_true(ma_rtc_guidance_weight(0.0f, 10.0f) == 10.0f); /* tau 0: c is +inf */
    assert_true(ma_rtc_guidance_weight(1.0f, 10.0f) == 0.0f);  /* tau 1: inf * 0 is NaN -> 0 */
}

static void test_guided_steps(void **state) {
    (void)state;
    const cJSON *cases = get(root, "steps");
    for (int i = 0; i < cJSON_GetArraySize(cases); i++) {
        const cJSON *c = cJSON_GetArrayItem(cases, i);
        const int T = num(c, "T"), Da = num(c, "max_action_dim"), n = T * Da;
        float *x = floats(get(c, "x_f32_hex"), n), *v = floats(get(c, "v_f32_hex"), n), *want = floats(get(c, "guided_f32_hex"), n);
        float *prefix = floats(get(c, "prefix_f32_hex"), num(c, "rows") * num(c, "dim"));
        float *prev = malloc(sizeof(float) * (size_t)n), w[64];
        assert_non_null(prev);
        const ma_rtc r = rtc_of(c, prefix);
        ma_rtc_layout(&r, T, Da, 0, prev, w);
        ma_rtc_guide(T, Da, x, prev, w, hexf(get(c, "tau_f32_hex")), r.beta, v);
        close_to(v, want, n, tol_of(c, 1e-6), "step case", i);
        free(x), free(v), free(want), free(prefix), free(prev);
    }
}

/* each loop replayed with its recorded velocities, masked as pipeline.c masks */
static void test_euler_loops(void **state) {
    (void)state;
    const cJSON *cases = get(root, "loops");
    int guided = 0;
    for (int i = 0; i < cJSON_GetArraySize(cases); i++) {
        const cJSON *c = cJSON_GetArrayItem(cases, i);
        const int T = num(c, "T"), Da = num(c, "max_action_dim"), adim = num(c, "action_dim"), steps = num(c, "steps"), n = T * Da;
        float *x = floats(get(c, "noise_f32_hex"), n), *vs = floats(get(c, "v_f32_hex"), steps * n);
        float *xs = floats(get(c, "x_f32_hex"), steps * n), *gs = floats(get(c, "guided_f32_hex"), steps * n);
        float *fin = floats(get(c, "final_f32_hex"), n), *prev = malloc(sizeof(float) * (size_t)n), w[64];
        float *prefix = NULL;
        assert_non_null(prev);
        ma_rtc r = {0};
        if (!cJSON_IsNull(get(c, "prefix_f32_hex"))) {
            prefix = floats(get(c, "prefix_f32_hex"), num(c, "rows") * num(c, "dim"));
            r = rtc_of(c, prefix);
            guided++;
        }
        ma_rtc_layout(&r, T, Da, 0, prev, w);
        const float dt = (float)(1.0 / steps);
        for (int k = 0; k < n; k++)
            if (k % Da >= adim) x[k] = 0.0f;
        for (int s = 0; s < steps; s++) {
            close_to(x, xs + (size_t)s * n, n, tol_of(c, 1e-6), "loop x", i * 100 + s);
            float *v = vs + (size_t)s * n;
            if (r.prefix) ma_rtc_guide(T, Da, x, prev, w, (float)((double)s / steps), r.beta, v);
            close_to(v, gs + (size_t)s * n, n, tol_of(c, 1e-6), "loop velocity", i * 100 + s);
            for (int k = 0; k < n; k++) {
                const float nx = x[k] + dt * v[k];
                x[k] = k % Da >= adim ? 0.0f : nx;
            }
        }
        close_to(x, fin, n, tol_of(c, 1e-6), "loop final", i);
        free(x), free(vs), free(xs), free(gs), free(fin), free(prev), free(prefix);
    }
    assert_true(guided >= 6);
}

static void test_offset_and_checks(void **state) {
    (void)state;
    float prefix[2 * 7], prev[10 * 32], w[10], w9[9];
    for (int i = 0; i < 14; i++) prefix[i] = 1.0f;
    ma_rtc r = {prefix, 2, 7, 1, 10, 0.0f, MA_RTC_LINEAR};
    ma_error err = {0};
    assert_int_equal(ma_rtc_check(&r, 9, 7, 32, "observation.rtc_", &err), MA_OK);
    /* the prefix's row 0 on row 1: no weight on row 0, LeRobot's weights of a 9-row chunk after it */
    ma_rtc_layout(&r, 10, 32, 1, prev, w);
    ma_rtc_prefix_weights(MA_RTC_LINEAR, 1, 2, 9, w9);
    assert_true(w[0] == 0.0f && !memcmp(w + 1, w9, sizeof w9));
    assert_true(prev[0] == 0.0f && prev[32] == 1.0f && prev[32 + 7] == 0.0f && prev[2 * 32 + 6] == 1.0f && prev[3 * 32] == 0.0f);
    struct {
        ma_rtc r;
        ma_status code;
        const char *msg;
    } bad[] = {
        {{prefix, 0, 7, 0, 0, 0.0f, 0}, MA_ERR_SHAPE, "observation.rtc_prefix_rows is 0: 1..9"},
        {{prefix, 10, 7, 0, 0, 0.0f, 0}, MA_ERR_SHAPE, "observation.rtc_prefix_rows is 10: 1..9"},
        {{prefix, 2, 8, 0, 0, 0.0f, 0}, MA_ERR_SHAPE, "observation.rtc_prefix_dim is 8"},
        {{prefix, 2, 7, -1, 0, 0.0f, 0}, MA_ERR_RANGE, "observation.rtc_delay is -1"},
        {{prefix, 2, 7, 0, -3, 0.0f, 0}, MA_ERR_RANGE, "observation.rtc_horizon is -3"},
        {{prefix, 2, 7, 0, 0, -1.0f, 0}, MA_ERR_RANGE, "observation.rtc_beta is -1"},
        {{prefix, 2, 7, 0, 0, INFINITY, 0}, MA_ERR_RANGE, "observation.rtc_beta is inf"},
        {{prefix, 2, 7, 0, 0, NAN, 0}, MA_ERR_RANGE, "observation.rtc_beta is"},
        {{prefix, 2, 7, 0, 0, 0.0f, 4}, MA_ERR_RANGE, "observation.rtc_schedule is 4"},
        {{prefix, 2, 7, 0, 0, 0.0f, -1}, MA_ERR_RANGE, "observation.rtc_schedule is -1"},
        {{NULL, 2, 7, 0, 0, 0.0f, 0}, MA_ERR_ARG, "observation.rtc_prefix is NULL"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&err, 0, sizeof err);
        assert_int_equal(ma_rtc_check(&bad[i].r, 9, 7, 32, "observation.rtc_", &err), bad[i].code);
        if (!strstr(err.msg, bad[i].msg)) fail_msg("case %zu: \"%s\" lacks \"%s\"", i, err.msg, bad[i].msg);
    }
    prefix[9] = NAN;
    assert_int_equal(ma_rtc_check(&r, 9, 7, 32, "observation.rtc_", &err), MA_ERR_RANGE);
    assert_non_null(strstr(err.msg, "observation.rtc_prefix[9] (row 1, column 2) is not finite"));
    /* the full width is accepted too; no prefix, nothing checked */
    ma_rtc wide = {prev, 3, 32, 0, 0, 0.0f, 0}, none = {0};
    memset(prev, 0, sizeof prev);
    assert_int_equal(ma_rtc_check(&wide, 9, 7, 32, "x", &err), MA_OK);
    none.delay = -5;
    assert_int_equal(ma_rtc_check(&none, 9, 7, 32, "x", &err), MA_OK);
}

int main(void) {
    char *text = NULL;
    ma_error err = {0};
    if (ma_read_file(MA_SOURCE_DIR "/tests/fixtures/lerobot_rtc/recorded.json", 8u << 20, &text, NULL, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    root = cJSON_Parse(text);
    free(text);
    if (!root) return 1;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_prefix_weights), cmocka_unit_test(test_guidance_weight),
                                       cmocka_unit_test(test_guided_steps), cmocka_unit_test(test_euler_loops),
                                       cmocka_unit_test(test_offset_and_checks)};
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    printf("EXP schedule: largest |C - LeRobot| %.3g (every other case bit for bit)\n", worst_exp);
    cJSON_Delete(root);
    return rc;
}
