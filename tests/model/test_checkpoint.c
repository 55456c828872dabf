/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L
/* Loading checkpoints in every layout; refusing broken ones by name. Variants are written from
 * the committed f16 tiny checkpoint with the C safetensors writer. */
#include "../test_util.h"

#include "core/half.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "backend/cpu/cpu.h"
#include "runtime/parity.h"

#define SRC MA_SOURCE_DIR "/assets/tiny-grid/model"
#define GOLDEN MA_SOURCE_DIR "/assets/tiny-grid/golden"

static void copy_file(const char *from, const char *dir, const char *name) {
    char *buf, *to = ma_path_join(dir, name);
    size_t len;
    ma_error err = {0};
    if (ma_read_file(from, 64u << 20, &buf, &len, &err)) fail_msg("%s", err.msg);
    if (ma_write_file(to, buf, len, &err)) fail_msg("%s", err.msg);
    free(buf);
    free(to);
}

typedef enum { V_F32, V_SHARDED, V_LEROBOT, V_DROP, V_MISSHAPE, V_EXTRA } variant;

/* write a variant of the committed checkpoint into dir */
static void make_variant(const char *dir, variant v) {
    copy_file(SRC "/config.json", dir, "config.json");
    copy_file(SRC "/norm_stats.json", dir, "norm_stats.json");
    ma_safetensors st;
    ma_error err = {0};
    if (ma_st_open(&st, SRC, &err)) fail_msg("%s", err.msg);
    ma_st_entry *e = calloc(st.count + 1, sizeof *e);
    char **names = calloc(st.count + 1, sizeof *names);
    void **bufs = calloc(st.count + 1, sizeof *bufs);
    int64_t(*shapes)[MA_MAX_DIMS] = calloc(st.count + 1, sizeof *shapes);
    size_t n = 0;
    for (size_t i = 0; i < st.count; i++) {
        const ma_st_tensor *t = &st.tensors[i];
        if (v == V_DROP && !strcmp(t->name, "model.transformer.blocks.2.mlp.ff_out.weight")) continue;
        names[n] = malloc(strlen(t->name) + 8);
        sprintf(names[n], "%s%s", v == V_LEROBOT ? "model." : "", t->name);
        memcpy(shapes[n], t->shape, sizeof shapes[n]);
        e[n] = (ma_st_entry){names[n], t->dtype, t->ndim, shapes[n], t->data};
        if (v == V_F32 && t->dtype == MA_DT_F16) {
            size_t cnt = t->nbytes / 2;
            float *f = malloc(cnt * sizeof(float) + 1);
            for (size_t k = 0; k < cnt; k++) f[k] = ma_f16_to_f32(((const uint16_t *)t->data)[k]);
            bufs[n] = f;
            e[n].dtype = MA_DT_F32;
            e[n].data = f;
        }
        if (v == V_MISSHAPE && !strcmp(t->name, "model.action_expert.blocks.1.self_attn.qkv.weight")) {
            shapes[n][0] = t->shape[1];
            shapes[n][1] = t->shape[0];
        }
        n++;
    }
    if (v == V_EXTRA) {
        static float extra[2];
        static int64_t es[1] = {2};
        e[n++] = (ma_st_entry){"model.extra.thing", MA_DT_F32, 1, es, extra};
    }
    if (v == V_SHARDED) {
        /* three shards plus the index */
        char *ip = ma_path_join(dir, "model.safetensors.index.json");
        FILE *idx = fopen(ip, "w");
        free(ip);
        fprintf(idx, "{\"metadata\": {}, \"weight_map\": {");
        size_t per = (n + 2) / 3;
        for (int s = 0; s < 3; s++) {
            size_t a = s * per, b = a + per > n ? n : a + per;
            char shard[64], *p;
            snprintf(shard, sizeof shard, "model-%05d-of-00003.safetensors", s + 1);
            p = ma_path_join(dir, shard);
            if (ma_st_write(p, e + a, b - a, &err)) fail_msg("%s", err.msg);
            free(p);
            for (size_t k = a; k < b; k++) fprintf(idx, "%s\"%s\": \"%s\"", k ? ", " : "", e[k].name, shard);
        }
        fprintf(idx, "}}\n");
        fclose(idx);
    } else {
        char *p = ma_path_join(dir, "model.safetensors");
        if (ma_st_write(p, e, n, &err)) fail_msg("%s", err.msg);
        free(p);
    }
    for (size_t i = 0; i <= st.count; i++) {
        free(names[i]);
        free(bufs[i]);
    }
    free(e);
    free(names);
    free(bufs);
    free(shapes);
    ma_st_close(&st);
}

static void expect_parity(const char *dir) {
    ma_model m;
    ma_error err = {0};
    if (ma_model_open(dir, "libero", &m, &err)) fail_msg("%s: %s", dir, err.msg);
    ma_parity_report rep;
    if (ma_parity_run(&ma_cpu_backend, &m, GOLDEN, 0.9999, &rep, &err)) fail_msg("%s", err.msg);
    if (!rep.pass) {
        ma_parity_print(&rep, stderr, 0);
        fail_msg("%s: parity failed", dir);
    }
    assert_true(rep.action_cosine > 0.99999);
    ma_parity_free(&rep);
    ma_model_close(&m);
}

static void test_layouts(void **state) {
    (void)state;
    const variant vs[] = {V_F32, V_SHARDED, V_LEROBOT};
    const char *names[] = {"f32", "sharded", "lerobot"};
    for (int i = 0; i < 3; i++) {
        char dir[1024];
        tu_tmpdir(dir, sizeof dir, names[i]);
        make_variant(dir, vs[i]);
        expect_parity(dir);
        tu_rmdir(dir);
    }
}

static void test_broken_checkpoints_are_named(void **state) {
    (void)state;
    struct {
        variant v;
        const char *needle;
    } cases[] = {
        {V_DROP, "model.transformer.blocks.2.mlp.ff_out.weight"},
        {V_MISSHAPE, "model.action_expert.blocks.1.self_attn.qkv.weight"},
        {V_EXTRA, "model.extra.thing"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[1024];
        tu_tmpdir(dir, sizeof dir, "broken");
        make_variant(dir, cases[i].v);
        ma_model m;
        ma_error err = {0};
        assert_fails_naming(ma_model_open(dir, "libero", &m, &err), err, cases[i].needle);
        tu_rmdir(dir);
    }
    /* a truncated weights file */
    char dir[1024];
    tu_tmpdir(dir, sizeof dir, "trunc");
    make_variant(dir, V_F32);
    char *p = ma_path_join(dir, "model.safetensors");
    assert_int_equal(truncate(p, 100000), 0);
    ma_model m;
    ma_error err = {0};
    assert_fails_naming(ma_model_open(dir, "libero", &m, &err), err, "model.safetensors");
    free(p);
    tu_rmdir(dir);
    ma_error e2 = {0};
    assert_fails_naming(ma_model_open(MA_SOURCE_DIR "/assets", "libero", &m, &e2), e2, "config.json");
}

/* the tiny checkpoint with one string of a JSON file replaced */
static void patched_copy(const char *dir, const char *file, const char *from, const char *to) {
    char cmd[2400];
    snprintf(cmd, sizeof cmd, "cp -r '%s/.' '%s/'", SRC, dir);
    assert_int_equal(system(cmd), 0);
    char *p = ma_path_join(dir, file), *buf;
    size_t len;
    ma_error err = {0};
    assert_int_equal(ma_read_file(p, 1u << 20, &buf, &len, &err), MA_OK);
    char *at = strstr(buf, from);
    assert_non_null(at);
    size_t fl = strlen(from), tl = strlen(to);
    char *out = malloc(len - fl + tl + 1);
    memcpy(out, buf, (size_t)(at - buf));
    memcpy(out + (at - buf), to, tl);
    memcpy(out + (at - buf) + tl, at + fl, len - (size_t)(at - buf) - fl + 1);
    assert_int_equal(ma_write_file(p, out, strlen(out), &err), MA_OK);
    free(out);
    free(buf);
    free(p);
}

/* config.json and norm_stats.json fields that contradict the weights or the config */
static void test_contradicting_fields_refused(void **state) {
    (void)state;
    struct {
        const char *file, *from, *to, *needle;
    } cases[] = {
        {"config.json", "\"use_grid_token_sampler\": true", "\"use_grid_token_sampler\": false", "use_grid_token_sampler false"},
        {"config.json", "\"grid_token_sampler_num_tokens\": 16", "\"grid_token_sampler_num_tokens\": 8",
         "grid_token_sampler_num_tokens is 8 but the token sampler"},
        {"norm_stats.json", "\"action_dim\": 32", "\"action_dim\": 33", "action_dim 33 exceeds max_action_dim 32"},
        {"norm_stats.json", "\"action_horizon\": 10", "\"action_horizon\": 31", "action_horizon 31 exceeds max_action_horizon 10"},
        {"norm_stats.json", "\"action_horizon\": 10", "\"action_horizon\": -1", "action_horizon must be an integer"},
        {"config.json", "\"flow_matching_num_steps\": 10", "\"flow_matching_num_steps\": 100000", "flow_matching_num_steps"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[1024];
        tu_tmpdir(dir, sizeof dir, "contradict");
        patched_copy(dir, cases[i].file, cases[i].from, cases[i].to);
        ma_model m;
        ma_error err = {0};
        assert_fails_naming(ma_model_open(dir, "libero", &m, &err), err, cases[i].needle);
        tu_rmdir(dir);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layouts),
        cmocka_unit_test(test_broken_checkpoints_are_named),
        cmocka_unit_test(test_contradicting_fields_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
