/* SPDX-License-Identifier: Apache-2.0 */
/* libmolmoact's public API (include/molmoact.h), used as a client would: through the shared
 * library (this test links libmolmoact.so, found by the real dynamic loader), on both tiny
 * variants, resident and in process:
 *   - the same actions as `molmoact run` on the same frames, state, task and noise, bit for bit
 *     (PNG and JPEG bytes, and the decoded frames given raw with a padded row stride);
 *   - every failure path returns its status and a message naming the field, file or worker,
 *     without leaking (ASan/LSan in the sanitizer build);
 *   - two threads calling molmoact_infer on one engine get correct, uncorrupted results. */
#define _POSIX_C_SOURCE 200809L
#include <molmoact.h>

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#ifndef MA_SOURCE_DIR
#define MA_SOURCE_DIR "."
#endif
#ifndef MA_BINARY_DIR
#define MA_BINARY_DIR "."
#endif
#define IMG0 MA_SOURCE_DIR "/fuzz/corpus/image/rgb.png"
#define IMG1 MA_SOURCE_DIR "/fuzz/corpus/image/rgb.jpg"
#define TASK "put the bowl on the plate"
#define STATE_CSV "0.1,-0.2,0.9,3.0,-0.1,0.05,0.03,-0.03"
static const float STATE[8] = {0.1f, -0.2f, 0.9f, 3.0f, -0.1f, 0.05f, 0.03f, -0.03f};

static unsigned char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n);
    if (fread(b, 1, (size_t)n, f) != (size_t)n) fail_msg("short read %s", path);
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* `molmoact run --json` on the same observation: its 70 actions */
static void cli_actions(const char *model, const char *noise_npz, float *out, int n) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s/molmoact' run --model '%s' --image0 '%s' --image1 '%s' --task '%s' --state %s %s%s --runs 1 --json",
             MA_BINARY_DIR, model, IMG0, IMG1, TASK, STATE_CSV, noise_npz ? "--noise " : "--seed 7", noise_npz ? noise_npz : "");
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    static char buf[1 << 20];
    size_t got = fread(buf, 1, sizeof buf - 1, p);
    buf[got] = '\0';
    assert_int_equal(pclose(p), 0);
    cJSON *j = cJSON_Parse(buf);
    assert_non_null(j);
    const cJSON *a = cJSON_GetObjectItem(j, "actions");
    int k = 0;
    for (const cJSON *row = a ? a->child : NULL; row; row = row->next)
        for (const cJSON *v = row->child; v; v = v->next) {
            assert_true(k < n);
            out[k++] = (float)v->valuedouble; /* printed with %.9g: round-trips the float */
        }
    assert_int_equal(k, n);
    cJSON_Delete(j);
}

static molmoact *open_engine(const char *model, int inproc) {
    molmoact_options opt;
    molmoact_options_init(&opt);
    opt.model_dir = model;
    opt.inproc = inproc;
    molmoact *e = NULL;
    molmoact_error err;
    if (molmoact_open(&opt, &e, &err) != MOLMOACT_OK) fail_msg("open %s: %s", model, err.message);
    return e;
}

/* deterministic noise [1, 10, 32] */
static void make_noise(float *noise) {
    for (int i = 0; i < 320; i++) noise[i] = (float)sin(0.37 * i) * 1.3f;
}

/* writes noise as an .npy file for the CLI */
static void write_npy(const char *path, const float *x, int n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    char hdr[128];
    int hl = snprintf(hdr, sizeof hdr, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 10, 32), }");
    int total = (10 + hl + 1 + 63) / 64 * 64;
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    unsigned short h = (unsigned short)(total - 10);
    fputc(h & 0xff, f);
    fputc(h >> 8, f);
    fwrite(hdr, 1, (size_t)hl, f);
    for (int i = 10 + hl; i < total - 1; i++) fputc(' ', f);
    fputc('\n', f);
    fwrite(x, sizeof(float), (size_t)n, f);
    fclose(f);
}

static void observation(molmoact_observation *obs, unsigned char *b0, size_t l0, unsigned char *b1, size_t l1) {
    molmoact_observation_init(obs);
    obs->images[0].encoded = b0;
    obs->images[0].encoded_len = l0;
    obs->images[1].encoded = b1;
    obs->images[1].encoded_len = l1;
    obs->state = STATE;
    obs->state_dim = 8;
    obs->task = TASK;
}

static void check_variant(const char *variant) {
    char model[1024], npy[1024];
    snprintf(model, sizeof model, "%s/assets/%s/model", MA_SOURCE_DIR, variant);
    snprintf(npy, sizeof npy, "%s/api-noise-%s.npy", MA_BINARY_DIR, variant);
    float noise[320], want[70], want_seed[70];
    make_noise(noise);
    write_npy(npy, noise, 320);
    cli_actions(model, npy, want, 70);
    cli_actions(model, NULL, want_seed, 70);
    size_t l0, l1;
    unsigned char *b0 = slurp(IMG0, &l0), *b1 = slurp(IMG1, &l1);
    for (int inproc = 0; inproc < 2; inproc++) {
        molmoact *e = open_engine(model, inproc);
        molmoact_info info;
        molmoact_error err;
        assert_int_equal(molmoact_get_info(e, &info, &err), MOLMOACT_OK);
        assert_string_equal(info.variant, strcmp(variant, "tiny-grid") ? "original" : "grid");
        assert_int_equal(info.n_steps, 10);
        assert_int_equal(info.action_dim, 7);
        assert_int_equal(info.inproc, inproc);
        molmoact_observation obs;
        observation(&obs, b0, l0, b1, l1);
        obs.noise = noise;
        obs.noise_len = 320;
        molmoact_result res;
        assert_int_equal(molmoact_infer(e, &obs, &res, &err), MOLMOACT_OK);
        assert_int_equal(res.n_steps, 10);
        assert_int_equal(res.action_dim, 7);
        assert_memory_equal(res.actions, want, sizeof want);
        assert_true(res.timing.total > 0 && res.timing.vision > 0 && res.timing.action_step > 0);
        molmoact_result_free(&res);
        /* a seed instead of noise: as --seed */
        obs.noise = NULL;
        obs.noise_len = 0;
        obs.have_seed = 1;
        obs.seed = 7;
        assert_int_equal(molmoact_infer(e, &obs, &res, &err), MOLMOACT_OK);
        assert_memory_equal(res.actions, want_seed, sizeof want_seed);
        molmoact_result_free(&res);
        assert_int_equal(molmoact_close(&e), MOLMOACT_OK);
        assert_null(e);
    }
    free(b0);
    free(b1);
    remove(npy);
}

static void test_equals_cli_grid(void **state) {
    (void)state;
    check_variant("tiny-grid");
}
static void test_equals_cli_original(void **state) {
    (void)state;
    check_variant("tiny-original");
}

/* raw frames: the same pixels at stride 3 x width (or 0) and with padded rows give the same actions */
static void test_raw_frames_with_stride(void **state) {
    (void)state;
    molmoact *e = open_engine(MA_SOURCE_DIR "/assets/tiny-grid/model", 1);
    const int h = 37, w = 53;
    const size_t pad = (size_t)w * 3 + 13;
    unsigned char *tight = malloc((size_t)h * w * 3), *padded = malloc((size_t)h * pad);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w * 3; x++) {
            const unsigned char v = (unsigned char)((x * 7 + y * 13) & 255);
            tight[(size_t)y * w * 3 + x] = v;
            padded[(size_t)y * pad + x] = v;
            if (x < 13) padded[(size_t)y * pad + (size_t)w * 3 + x] = 0xee; /* junk past the row */
        }
    molmoact_observation obs;
    molmoact_observation_init(&obs);
    obs.images[0] = (molmoact_image){tight, h, w, 0, NULL, 0};
    obs.images[1] = (molmoact_image){tight, h, w, (size_t)w * 3, NULL, 0};
    obs.state = STATE;
    obs.state_dim = 8;
    obs.task = TASK;
    molmoact_result a, b;
    molmoact_error err;
    assert_int_equal(molmoact_infer(e, &obs, &a, &err), MOLMOACT_OK);
    obs.images[0].data = obs.images[1].data = padded;
    obs.images[0].stride = obs.images[1].stride = pad;
    assert_int_equal(molmoact_infer(e, &obs, &b, &err), MOLMOACT_OK);
    assert_memory_equal(a.actions, b.actions, sizeof(float) * 70);
    molmoact_result_free(&b);
    /* rotate180: the frames turned by 180 degrees before the model sees them, so the tight frame
     * turned by hand gives the same actions as the tight frame with the flag (and not the same as
     * the tight frame without it) */
    unsigned char *turned = malloc((size_t)h * w * 3);
    for (size_t k = 0, n = (size_t)h * w; k < n; k++) memcpy(turned + 3 * (n - 1 - k), tight + 3 * k, 3);
    obs.images[0] = obs.images[1] = (molmoact_image){turned, h, w, 0, NULL, 0};
    assert_int_equal(molmoact_infer(e, &obs, &b, &err), MOLMOACT_OK);
    molmoact_result c;
    obs.images[0] = obs.images[1] = (molmoact_image){tight, h, w, 0, NULL, 0};
    obs.rotate180 = 1;
    assert_int_equal(molmoact_infer(e, &obs, &c, &err), MOLMOACT_OK);
    assert_memory_equal(b.actions, c.actions, sizeof(float) * 70);
    assert_memory_not_equal(a.actions, c.actions, sizeof(float) * 70);
    molmoact_result_free(&c);
    obs.rotate180 = 2;
    assert_int_equal(molmoact_infer(e, &obs, &c, &err), MOLMOACT_ERR_ARG);
    assert_non_null(strstr(err.message, "rotate180"));
    molmoact_result_free(&a);
    molmoact_result_free(&b);
    free(turned);
    free(tight);
    free(padded);
    molmoact_close(&e);
}

#define EXPECT_FAIL(call, code, needle)                                                                                             \
    do {                                                                                                                            \
        molmoact_status _s = (call);                                                                                                \
        if (_s != (code))                                                                                                           \
            fail_msg("%s returned %s, expected %s (%s)", #call, molmoact_status_name(_s), molmoact_status_name(code), err.message); \
        if (!strstr(err.message, needle)) fail_msg("\"%s\" does not name %s", err.message, needle);                                 \
    } while (0)

static void test_failures_named(void **state) {
    (void)state;
    molmoact_error err;
    molmoact *e = NULL;
    molmoact_options opt;
    molmoact_options_init(&opt);
    EXPECT_FAIL(molmoact_open(&opt, &e, &err), MOLMOACT_ERR_ARG, "model_dir");
    EXPECT_FAIL(molmoact_open(NULL, &e, &err), MOLMOACT_ERR_ARG, "options");
    EXPECT_FAIL(molmoact_open(&opt, NULL, &err), MOLMOACT_ERR_ARG, "out");
    opt.model_dir = MA_SOURCE_DIR "/no/such/model";
    EXPECT_FAIL(molmoact_open(&opt, &e, &err), MOLMOACT_ERR_IO, "no/such/model");
    opt.model_dir = MA_SOURCE_DIR "/assets"; /* a directory, but no model in it */
    EXPECT_FAIL(molmoact_open(&opt, &e, &err), MOLMOACT_ERR_IO, "config.json");
    assert_null(e);
    opt.model_dir = MA_SOURCE_DIR "/assets/tiny-grid/model";
    opt.backend = "gpu";
    EXPECT_FAIL(molmoact_open(&opt, &e, &err), MOLMOACT_ERR_ARG, "backend");
    opt.backend = "qnn"; /* no QNN libraries here: named as such, and the environment is left as it was */
    EXPECT_FAIL(molmoact_open(&opt, &e, &err), MOLMOACT_ERR_IO, "qnn: cannot load");
    assert_null(getenv("MOLMOACT_BACKEND"));
    opt.backend = NULL;
    opt.struct_size = 3;
    EXPECT_FAIL(molmoact_open(&opt, &e, &err), MOLMOACT_ERR_ARG, "struct_size");
    opt.struct_size = sizeof opt;
    opt.worker_exe = "/nonexistent/molmoact";
    EXPECT_FAIL(molmoact_open(&opt, &e, &err), MOLMOACT_ERR_IO, "worker");
    assert_null(e);

    e = open_engine(MA_SOURCE_DIR "/assets/tiny-grid/model", 0); /* resident: errors cross the processes too */
    /* its settings and components, through the public API */
    char val[64];
    assert_int_equal(molmoact_get_setting(e, "backend", val, sizeof val, &err), MOLMOACT_OK);
    assert_true(!strcmp(val, "") || !strcmp(val, "cpu"));
    assert_int_equal(molmoact_get_setting(e, "qnn_soc", val, sizeof val, &err), MOLMOACT_OK);
    assert_string_equal(val, "-1");
    assert_int_equal(molmoact_get_setting(e, "first_action_row", val, sizeof val, &err), MOLMOACT_OK);
    assert_string_equal(val, "0"); /* n_obs_steps 1 */
    EXPECT_FAIL(molmoact_get_setting(e, "no_such", val, sizeof val, &err), MOLMOACT_ERR_ARG, "no_such");
    EXPECT_FAIL(molmoact_get_setting(e, "threads", val, 1, &err), MOLMOACT_ERR_RANGE, "threads");
    assert_int_equal(molmoact_component_count(), 8);
    molmoact_component comp;
    memset(&comp, 0, sizeof comp);
    EXPECT_FAIL(molmoact_get_component(e, 0, &comp, &err), MOLMOACT_ERR_ARG, "struct_size");
    comp.struct_size = sizeof comp;
    EXPECT_FAIL(molmoact_get_component(e, 8, &comp, &err), MOLMOACT_ERR_RANGE, "index 8");
    assert_int_equal(molmoact_get_component(e, 2, &comp, &err), MOLMOACT_OK);
    assert_string_equal(comp.name, "llm_split0");
    assert_string_equal(comp.precision, "checkpoint");
    assert_true(comp.n_dtypes >= 1 && comp.bytes[0] > 0);
    molmoact_observation obs;
    molmoact_result res;
    static unsigned char px[16 * 16 * 3];
    molmoact_observation_init(&obs);
    obs.images[0] = (molmoact_image){px, 16, 16, 0, NULL, 0};
    obs.images[1] = (molmoact_image){px, 16, 16, 0, NULL, 0};
    float st[8] = {0};
    obs.state = st;
    obs.state_dim = 8;
    obs.task = TASK;
    EXPECT_FAIL(molmoact_infer(e, NULL, &res, &err), MOLMOACT_ERR_ARG, "observation is NULL");
    EXPECT_FAIL(molmoact_infer(e, &obs, NULL, &err), MOLMOACT_ERR_ARG, "result is NULL");
    obs.images[1].height = 0;
    EXPECT_FAIL(molmoact_infer(e, &obs, &res, &err), MOLMOACT_ERR_SHAPE, "images[1]: frame is 0 x 16");
    obs.images[1] = (molmoact_image){px, 1, 100000, 0, NULL, 0};
    EXPECT_FAIL(molmoact_infer(e, &obs, &res, &err), MOLMOACT_ERR_NOMEM, "images[1]: frame 1 x 100000 exceeds");
    obs.images[1] = (molmoact_image){NULL, 16, 16, 0, NULL, 0};
    EXPECT_FAIL(molmoact_infer(e, &obs, &res, &err), MOLMOACT_ERR_ARG, "images[1]: no frame");
    obs.images[1] = (molmoact_image){px, 16, 16, 5, NULL, 0};
    EXPECT_FAIL(molmoact_infer(e, &obs, &res, &err), MOLMOACT_ERR_SHAPE, "stride 5");
    static const unsigned char junk[] = "definitely not a png";
    obs.images[1] = (molmoact_image){NULL, 0, 0, 0, junk, sizeof junk};
    EXPECT_FAIL(molmoact_infer(e, &obs, &res, &err), MOLMOACT_ERR_UNSUPPORTED, "images[1]: not a PNG or JPEG");
    obs.images[1] = (molmoact_image){px, 16, 16, 0, NULL, 0};
    st[3] = NAN;
    EXPECT_FAIL(molmoact_infer(e, &obs, &res, &err), MOLMOACT_ERR_RANGE, "observation.state[3] is NaN");
    st[3] = INFINITY;
    EXPECT_FAIL(molmoact_infer(e, &obs, &res, &err), MOLMOACT_ERR_RANGE, "observation.state[3] is infinite");
    st[3] = 0;
    obs.state_dim = 7;
    EXPECT_FAIL(molmoact_infer(e, &obs, &res, &err), MOLMOACT_ERR_SHAPE, "state_dim is 7");
    obs.state_dim = 8;
    obs.state = NULL;
    EXPECT_FAIL(molmoact_infer(e, &obs, &res, &err), MOLMOACT_ERR_ARG, "observation.state is NULL");
    obs.state = st;
    obs.task = NULL;
    EXPECT_FAIL(molmoact_infer(e, &obs, &res, &err), MOLMOACT_ERR_ARG, "observation.task is NULL");
    obs.task = TASK;
    float noise[320] = {0};
    obs.noise = noise;
    obs.noise_len = 319;
    EXPECT_FAIL(molmoact_infer(e, &obs, &res, &err), MOLMOACT_ERR_SHAPE, "noise has 319 values");
    obs.noise_len = 320;
    noise[5] = NAN;
    EXPECT_FAIL(molmoact_infer(e, &obs, &res, &err), MOLMOACT_ERR_RANGE, "noise[5]");
    noise[5] = 0;
    obs.have_seed = 1;
    EXPECT_FAIL(molmoact_infer(e, &obs, &res, &err), MOLMOACT_ERR_ARG, "noise and seed");
    obs.have_seed = 0;
    obs.struct_size = 0;
    EXPECT_FAIL(molmoact_infer(e, &obs, &res, &err), MOLMOACT_ERR_ARG, "struct_size");
    { /* never initialised (issue 36 F6): a stack's leftovers in every field, norm_tag included;
       * refused by its size before any later field is read */
        molmoact_observation junk;
        memset(&junk, 0x41, sizeof junk);
        EXPECT_FAIL(molmoact_infer(e, &junk, &res, &err), MOLMOACT_ERR_ARG, "struct_size");
    }
    obs.struct_size = sizeof obs;
    { /* a task that is not UTF-8: refused as the observation's fault (F17) */
        const char *task = obs.task;
        obs.task = "put \xff the bowl";
        EXPECT_FAIL(molmoact_infer(e, &obs, &res, &err), MOLMOACT_ERR_FORMAT, "observation.task is not valid UTF-8");
        obs.task = task;
    }
    static const int64_t bad_ids[3] = {1, 999999999, 2};
    obs.input_ids = bad_ids;
    obs.seq_len = 3;
    EXPECT_FAIL(molmoact_infer(e, &obs, &res, &err), MOLMOACT_ERR_RANGE, "input_ids");
    obs.input_ids = NULL;
    /* after all that the engine still serves */
    assert_int_equal(molmoact_infer(e, &obs, &res, &err), MOLMOACT_OK);
    molmoact_result_free(&res);
    assert_int_equal(molmoact_close(&e), MOLMOACT_OK);
    /* a call after close: the handle is NULL, refused without touching freed memory */
    EXPECT_FAIL(molmoact_infer(e, &obs, &res, &err), MOLMOACT_ERR_ARG, "closed");
    EXPECT_FAIL(molmoact_get_info(e, NULL, &err), MOLMOACT_ERR_ARG, "closed");
    assert_int_equal(molmoact_close(&e), MOLMOACT_OK);
    assert_int_equal(molmoact_close(NULL), MOLMOACT_OK);
    molmoact_result_free(NULL);
    assert_string_equal(molmoact_version(), MOLMOACT_VERSION);
}

typedef struct {
    molmoact *e;
    const molmoact_observation *obs;
    const float *want;
    int ok, runs;
} thread_arg;

static void *worker(void *p) {
    thread_arg *a = p;
    for (int i = 0; i < a->runs; i++) {
        molmoact_result res;
        molmoact_error err;
        if (molmoact_infer(a->e, a->obs, &res, &err) != MOLMOACT_OK) return NULL;
        int same = !memcmp(res.actions, a->want, sizeof(float) * 70);
        molmoact_result_free(&res);
        if (!same) return NULL;
    }
    a->ok = 1;
    return NULL;
}

/* A program built against 0.10 calls the exported initialisers with 0.10's structs (88 and 192
 * bytes): they write no further, and an engine opens and infers with them (the 0.11 fields, past
 * struct_size, are not read) */
static void test_abi_of_0_10_callers(void **state) {
    (void)state;
    unsigned char buf[512];
    memset(buf, 0xa5, sizeof buf);
    molmoact_options *opt = (molmoact_options *)(void *)buf;
    (molmoact_options_init)(opt);
    assert_int_equal(opt->struct_size, 88);
    for (size_t i = 88; i < sizeof buf; i++) assert_int_equal(buf[i], 0xa5);
    opt->model_dir = MA_SOURCE_DIR "/assets/tiny-grid/model";
    opt->inproc = 1;
    molmoact *e = NULL;
    molmoact_error err;
    if (molmoact_open(opt, &e, &err)) fail_msg("open with 0.10's options: %s", err.message);
    unsigned char ob[512];
    memset(ob, 0xa5, sizeof ob);
    molmoact_observation *obs = (molmoact_observation *)(void *)ob;
    (molmoact_observation_init)(obs);
    assert_int_equal(obs->struct_size, 192);
    for (size_t i = 192; i < sizeof ob; i++) assert_int_equal(ob[i], 0xa5); /* rotate180 lies there: 0xa5a5a5a5 is not read */
    static unsigned char px[16 * 16 * 3];
    obs->images[0] = (molmoact_image){px, 16, 16, 0, NULL, 0};
    obs->images[1] = (molmoact_image){px, 16, 16, 0, NULL, 0};
    obs->state = STATE;
    obs->state_dim = 8;
    obs->task = TASK;
    molmoact_result res;
    if (molmoact_infer(e, obs, &res, &err)) fail_msg("infer with 0.10's observation: %s", err.message);
    molmoact_result_free(&res);
    molmoact_close(&e);
}

/* A program built against 0.11 (its observation ends with reserved[3], padded to 8 bytes): the
 * 0.12 RTC fields past its struct_size are not read (here 0xa5 bytes: a wild rtc_prefix pointer),
 * and its result is the bits of a 0.12 observation without a prefix; a 0.12 observation's RTC
 * fields are checked and named */
static void test_abi_of_0_11_callers_and_rtc_fields(void **state) {
    (void)state;
    molmoact *e = open_engine(MA_SOURCE_DIR "/assets/tiny-grid/model", 1);
    const uint32_t size_0_11 = (uint32_t)((offsetof(molmoact_observation, reserved) + sizeof(int[3]) + 7) & ~(size_t)7);
    assert_true(size_0_11 <= offsetof(molmoact_observation, rtc_prefix));
    unsigned char ob[sizeof(molmoact_observation)];
    memset(ob, 0xa5, sizeof ob);
    molmoact_observation *old = (molmoact_observation *)(void *)ob, cur;
    molmoact_observation_init_sized(old, size_0_11);
    for (size_t i = size_0_11; i < sizeof ob; i++) assert_int_equal(ob[i], 0xa5);
    molmoact_observation_init(&cur);
    static unsigned char px[16 * 16 * 3];
    molmoact_observation *both[2] = {old, &cur};
    for (int k = 0; k < 2; k++) {
        both[k]->images[0] = (molmoact_image){px, 16, 16, 0, NULL, 0};
        both[k]->images[1] = (molmoact_image){px, 16, 16, 0, NULL, 0};
        both[k]->state = STATE;
        both[k]->state_dim = 8;
        both[k]->task = TASK;
    }
    molmoact_result r0, r1;
    molmoact_error err;
    if (molmoact_infer(e, old, &r0, &err)) fail_msg("infer with 0.11's observation: %s", err.message);
    if (molmoact_infer(e, &cur, &r1, &err)) fail_msg("infer with 0.12's observation: %s", err.message);
    assert_memory_equal(r0.trajectory, r1.trajectory, sizeof(float) * (size_t)r0.horizon * (size_t)r0.max_action_dim);
    static float prefix[10 * 32];
    cur.rtc_prefix = prefix;
    cur.rtc_prefix_rows = 4;
    cur.rtc_prefix_dim = r1.action_dim;
    molmoact_result r2;
    if (molmoact_infer(e, &cur, &r2, &err)) fail_msg("infer with a prefix: %s", err.message);
    assert_memory_not_equal(r2.trajectory, r1.trajectory, sizeof(float) * (size_t)r1.horizon * (size_t)r1.max_action_dim);
    molmoact_result_free(&r2);
    struct {
        int rows, dim, delay, horizon, schedule;
        float beta;
        molmoact_status code;
        const char *msg;
    } bad[] = {
        {11, 7, 0, 0, 0, 0.0f, MOLMOACT_ERR_SHAPE, "observation.rtc_prefix_rows is 11: 1..10"},
        {4, 9, 0, 0, 0, 0.0f, MOLMOACT_ERR_SHAPE, "observation.rtc_prefix_dim is 9"},
        {4, 7, -2, 0, 0, 0.0f, MOLMOACT_ERR_RANGE, "observation.rtc_delay is -2"},
        {4, 7, 0, -1, 0, 0.0f, MOLMOACT_ERR_RANGE, "observation.rtc_horizon is -1"},
        {4, 7, 0, 0, 7, 0.0f, MOLMOACT_ERR_RANGE, "observation.rtc_schedule is 7"},
        {4, 7, 0, 0, 0, -1.0f, MOLMOACT_ERR_RANGE, "observation.rtc_beta is -1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cur.rtc_prefix_rows = bad[i].rows;
        cur.rtc_prefix_dim = bad[i].dim;
        cur.rtc_delay = bad[i].delay;
        cur.rtc_horizon = bad[i].horizon;
        cur.rtc_schedule = bad[i].schedule;
        cur.rtc_beta = bad[i].beta;
        assert_int_equal(molmoact_infer(e, &cur, &r2, &err), bad[i].code);
        if (!strstr(err.message, bad[i].msg)) fail_msg("case %zu: \"%s\" lacks \"%s\"", i, err.message, bad[i].msg);
    }
    molmoact_result_free(&r0);
    molmoact_result_free(&r1);
    molmoact_close(&e);
}

/* in one process, inproc engines share the kernel set, the panel mode and the threads: a second
 * one asking for others is refused (not switched under the first); asking for the same is fine */
static void test_inproc_engines_share_the_process_kernels(void **state) {
    (void)state;
    molmoact *a = open_engine(MA_SOURCE_DIR "/assets/tiny-grid/model", 1); /* the default set (never "scalar") */
    const char *other = "scalar";
    molmoact_options opt;
    molmoact_options_init(&opt);
    opt.model_dir = MA_SOURCE_DIR "/assets/tiny-grid/model";
    opt.inproc = 1;
    molmoact *b = NULL;
    molmoact_error err;
    opt.kernels = other;
    assert_int_equal(molmoact_open(&opt, &b, &err), MOLMOACT_ERR_ARG);
    if (!strstr(err.message, "per process")) fail_msg("%s", err.message);
    assert_null(b);
    opt.kernels = NULL; /* the process's */
    if (molmoact_open(&opt, &b, &err)) fail_msg("the process's kernels: %s", err.message);
    molmoact_close(&b);
    molmoact_close(&a);
}

static void test_two_threads_one_engine(void **state) {
    (void)state;
    for (int inproc = 0; inproc < 2; inproc++) {
        molmoact *e = open_engine(MA_SOURCE_DIR "/assets/tiny-original/model", inproc);
        size_t l0, l1;
        unsigned char *b0 = slurp(IMG0, &l0), *b1 = slurp(IMG1, &l1);
        molmoact_observation o1, o2;
        observation(&o1, b0, l0, b1, l1);
        observation(&o2, b1, l1, b0, l0); /* another observation: cameras swapped, another seed */
        o2.have_seed = 1;
        o2.seed = 99;
        float w1[70], w2[70];
        molmoact_result r;
        molmoact_error err;
        assert_int_equal(molmoact_infer(e, &o1, &r, &err), MOLMOACT_OK);
        memcpy(w1, r.actions, sizeof w1);
        molmoact_result_free(&r);
        assert_int_equal(molmoact_infer(e, &o2, &r, &err), MOLMOACT_OK);
        memcpy(w2, r.actions, sizeof w2);
        molmoact_result_free(&r);
        assert_memory_not_equal(w1, w2, sizeof w1);
        thread_arg a[2] = {{e, &o1, w1, 0, 6}, {e, &o2, w2, 0, 6}};
        pthread_t t[2];
        for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, worker, &a[i]);
        for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
        assert_true(a[0].ok && a[1].ok);
        molmoact_close(&e);
        free(b0);
        free(b1);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equals_cli_grid),
        cmocka_unit_test(test_equals_cli_original),
        cmocka_unit_test(test_raw_frames_with_stride),
        cmocka_unit_test(test_failures_named),
        cmocka_unit_test(test_two_threads_one_engine),
        cmocka_unit_test(test_abi_of_0_10_callers),
        cmocka_unit_test(test_abi_of_0_11_callers_and_rtc_fields),
        cmocka_unit_test(test_inproc_engines_share_the_process_kernels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
