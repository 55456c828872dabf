/* SPDX-License-Identifier: Apache-2.0 */
#define _GNU_SOURCE
#include "runtime/request.h"

#include <math.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/mapfile.h"

void ma_request_free(ma_request *q) {
    ma_npz_free(&q->in);
    ma_npz_free(&q->pix);
    ma_npz_free(&q->noise_file);
    ma_tensor_free(&q->noise_npy);
    ma_npz_free(&q->rtc_file);
    ma_tensor_free(&q->rtc_npy);
    ma_prepared_free(&q->prep);
    ma_image_free(&q->imgs[0]);
    ma_image_free(&q->imgs[1]);
    free(q->task_buf);
    memset(q, 0, sizeof *q);
}

/* --state: comma-separated decimal numbers (no hex, inf or nan, no empty field) */
static int decimal_token(const char *p, const char *end) {
    if (p < end && (*p == '+' || *p == '-')) p++;
    int digits = 0;
    while (p < end && *p >= '0' && *p <= '9') {
        p++;
        digits++;
    }
    if (p < end && *p == '.') {
        p++;
        while (p < end && *p >= '0' && *p <= '9') {
            p++;
            digits++;
        }
    }
    if (!digits) return 0;
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') return 0;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    return p == end;
}

static ma_status parse_state(const char *csv, float *state, int *dim, ma_error *err) {
    const char *p = csv;
    *dim = 0;
    for (;;) {
        const char *end = strchr(p, ',');
        if (!end) end = p + strlen(p);
        const char *next = end;
        while (p < end && (*p == ' ' || *p == '\t')) p++; /* "0.1, 0.2": spaces around a value */
        while (end > p && (end[-1] == ' ' || end[-1] == '\t')) end--;
        if (*dim == MA_NORM_MAX_DIM) return ma_fail(err, MA_ERR_ARG, "--state: more than %d values", MA_NORM_MAX_DIM);
        if (!decimal_token(p, end))
            return ma_fail(err, MA_ERR_ARG, "--state: value %d (\"%.*s\") is not a decimal number (%s)", *dim + 1,
                           (int)(end - p > 32 ? 32 : end - p), p, "a comma-separated list of numbers expected");
        const float v = strtof(p, NULL);
        if (!isfinite(v)) return ma_fail(err, MA_ERR_RANGE, "--state: value %d is out of the float range", *dim + 1);
        state[(*dim)++] = v;
        if (!*next) break;
        p = next + 1;
    }
    return MA_OK;
}

/* --noise FILE (--rtc-prefix FILE): an .npy array, or an .npz holding `key` (told apart by their
 * magic bytes, so the error is the real one: a malformed entry of an .npz is not "bad magic") */
static ma_status load_array_file(const char *path, const char *key, ma_npz *npz, ma_tensor *npy, const ma_tensor **nz, ma_error *err) {
    unsigned char magic[6] = {0};
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO is refused, not waited on */
    if (fd < 0) return ma_fail(err, MA_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        return ma_fail(err, MA_ERR_IO, "%s: not a regular file", path);
    }
    const ssize_t rd = pread(fd, magic, sizeof magic, 0);
    const size_t got = rd > 0 ? (size_t)rd : 0;
    close(fd);
    if (got >= 2 && magic[0] == 'P' && magic[1] == 'K') {
        ma_status s = ma_npz_read(path, npz, err);
        if (s) return s;
        *nz = ma_npz_get(npz, key);
        return *nz ? MA_OK : ma_fail(err, MA_ERR_FORMAT, "%s holds no `%s` array", path, key);
    }
    if (got < 6 || memcmp(magic, "\x93NUMPY", 6))
        return ma_fail(err, MA_ERR_FORMAT, "%s: neither an .npy array nor an .npz archive (by its first bytes)", path);
    char *buf = NULL;
    size_t len;
    ma_status s = ma_read_file(path, 64u << 20, &buf, &len, err);
    if (!s) s = ma_npy_parse((uint8_t *)buf, len, path, npy, err);
    free(buf);
    *nz = npy;
    return s;
}

static ma_status load(const ma_model *m, const ma_request_src *src, ma_request *q, ma_error *err) {
    const ma_config *c = &m->cfg;
    ma_status s;
    if (src->inputs && (s = ma_npz_read(src->inputs, &q->in, err))) return s;
    if (src->pixels_npz && (s = ma_npz_read(src->pixels_npz, &q->pix, err))) return s;
    const char *label = src->inputs ? src->inputs : "inputs";

    /* ---- camera frames: pixels | image0 + image1 (arrays or files) */
    const ma_tensor *px = ma_npz_get(&q->in, "pixels");
    if (!px) px = ma_npz_get(&q->pix, "pixels");
    if (px) {
        int64_t want[3] = {-1, (int64_t)c->patch_h * c->patch_w, 3 * c->patch * c->patch};
        if ((s = ma_tensor_expect(px, "pixels", MA_DT_F32, 3, want, err))) return ma_error_wrap(err, s, "%s", label);
        if (px->shape[0] < 1 || px->shape[0] > 16)
            return ma_fail(err, MA_ERR_ARG, "%s: pixels hold %lld images (1..16)", label, (long long)px->shape[0]);
        q->obs.pixels = px->data;
        q->obs.n_images = (int)px->shape[0];
    } else {
        const char *files[2] = {src->image0, src->image1};
        for (int i = 0; i < 2; i++) {
            char key[16];
            snprintf(key, sizeof key, "image%d", i);
            const ma_tensor *t = ma_npz_get(&q->in, key);
            if (t) s = ma_image_from_tensor(t, key, &q->imgs[i], err);
            else if (files[i]) s = ma_image_load(files[i], &q->imgs[i], err);
            else if (!src->inputs && !src->image0 && !src->image1)
                return ma_fail(err, MA_ERR_ARG,
                               "no observation: give --inputs IN.npz, or --image0 A --image1 B --task T --state S, "
                               "or --golden DIR (its own observation)");
            else return ma_fail(err, MA_ERR_ARG, "%s: needs `pixels`, or both camera frames (image0 and image1)", label);
            if (s) return s;
        }
        q->obs.n_images = 2;
    }

    /* ---- prompt: input_ids | task + state */
    const ma_tensor *ids = ma_npz_get(&q->in, "input_ids");
    if (ids) {
        int64_t any[1] = {-1};
        if ((s = ma_tensor_expect(ids, "input_ids", MA_DT_I64, 1, any, err))) return ma_error_wrap(err, s, "%s", label);
        q->obs.input_ids = ids->data;
        q->obs.seq_len = ids->shape[0];
    }
    if (!q->obs.pixels || !q->obs.input_ids) {
        if (q->obs.pixels) return ma_fail(err, MA_ERR_ARG, "%s: pass either pixels + input_ids or raw frames + task + state", label);
        const ma_tensor *tt = ma_npz_get(&q->in, "task"), *st = ma_npz_get(&q->in, "state");
        const char *task = src->task;
        if (tt) {
            if (tt->dtype != MA_DT_STR32 || ma_tensor_numel(tt) != 1) return ma_fail(err, MA_ERR_ARG, "%s: task must be one string", label);
            if ((s = ma_str32_to_utf8(tt, 0, &q->task_buf, err))) return s;
            task = q->task_buf;
        }
        float state[MA_NORM_MAX_DIM];
        int state_dim = 0;
        if (st) {
            if (st->dtype != MA_DT_F32 || st->ndim != 1 || st->shape[0] < 1 || st->shape[0] > MA_NORM_MAX_DIM)
                return ma_fail(err, MA_ERR_ARG, "%s: state must be float32 [%d]", label, m->ns.has_state ? m->ns.state.dim : 8);
            state_dim = (int)st->shape[0];
            memcpy(state, st->data, sizeof(float) * (size_t)state_dim);
        } else if (src->state_csv && (s = parse_state(src->state_csv, state, &state_dim, err))) return s;
        if (!q->obs.input_ids && (!task || !state_dim))
            return ma_fail(err, MA_ERR_ARG, "%s: needs `input_ids`, or `task` and `state` (--task, --state)", label);
        if (!task || !state_dim) { /* a given prompt with raw frames: preprocess the frames only */
            const size_t P = (size_t)c->patch_h * c->patch_w, pp = 3u * c->patch * c->patch;
            q->prep.pixels = ma_malloc((size_t)q->obs.n_images * P * pp, sizeof(float), err, "pixels");
            if (!q->prep.pixels) return MA_ERR_NOMEM;
            for (int i = 0; i < q->obs.n_images; i++)
                if ((s = ma_preprocess_image(c, &q->imgs[i], q->prep.pixels + (size_t)i * P * pp, NULL, err))) return s;
        } else if ((s = ma_prepare_observation(m, q->imgs, q->obs.n_images, task, strlen(task), state, state_dim, &q->prep, err))) return s;
        q->obs.pixels = q->prep.pixels;
        if (!q->obs.input_ids) {
            q->obs.input_ids = q->prep.prompt.ids;
            q->obs.seq_len = q->prep.prompt.n;
        }
    }

    /* ---- noise: --noise FILE | --seed N | the inputs' noise | seed 0 */
    int action_dim, A, n_steps;
    if ((s = ma_action_plan(m, &action_dim, &A, &n_steps, err))) return s;
    const ma_tensor *nz = ma_npz_get(&q->in, "noise");
    if (src->noise_path && (s = load_array_file(src->noise_path, "noise", &q->noise_file, &q->noise_npy, &nz, err))) return s;
    if (src->have_seed && !src->noise_path) nz = NULL;
    if (nz) {
        int64_t want[3] = {1, A, c->max_action_dim};
        if ((s = ma_tensor_expect(nz, "noise", MA_DT_F32, 3, want, err))) return s;
        q->obs.noise = nz->data;
    }
    q->obs.seed = src->seed;

    /* ---- real-time chunking: --rtc-prefix FILE and its settings */
    if (src->rtc_prefix_path) {
        const char *path = src->rtc_prefix_path;
        const ma_tensor *t = NULL;
        if ((s = load_array_file(path, "rtc_prefix", &q->rtc_file, &q->rtc_npy, &t, err))) return s;
        if (t->dtype != MA_DT_F32 || (t->ndim != 2 && !(t->ndim == 3 && t->shape[0] == 1)))
            return ma_fail(err, MA_ERR_SHAPE, "--rtc-prefix %s: expected float32 [rows, dim] (or [1, rows, dim]): the normalised leftover",
                           path);
        const int64_t rows = t->shape[t->ndim - 2], dim = t->shape[t->ndim - 1];
        if (rows < 1 || rows > A || dim < 1 || dim > c->max_action_dim)
            return ma_fail(err, MA_ERR_SHAPE, "--rtc-prefix %s: [%lld, %lld] does not fit the chunk [%d, %d]", path, (long long)rows,
                           (long long)dim, A, c->max_action_dim);
        const ma_rtc r = {t->data, (int)rows, (int)dim, src->rtc_delay, src->rtc_horizon, src->rtc_beta, src->rtc_schedule};
        if ((s = ma_rtc_check(&r, A - (c->n_obs_steps - 1), action_dim, c->max_action_dim, "rtc_", err)))
            return ma_error_wrap(err, s, "--rtc-prefix %s", path);
        q->obs.rtc = r;
    }
    return MA_OK;
}

ma_status ma_request_load(const ma_model *m, const ma_request_src *src, ma_request *q, ma_error *err) {
    memset(q, 0, sizeof *q);
    ma_status s = load(m, src, q, err);
    if (s) ma_request_free(q);
    return s;
}

ma_status ma_request_synthetic(const ma_model *m, uint64_t seed, ma_request *q, ma_error *err) {
    memset(q, 0, sizeof *q);
    ma_status s = MA_OK;
    /* smooth colour gradients with a moving square: real-looking statistics, no files needed */
    for (int i = 0; i < 2 && !s; i++) {
        ma_image *im = &q->imgs[i];
        im->h = im->w = 256;
        im->rgb = ma_malloc(256 * 256 * 3, 1, err, "synthetic frame");
        if (!im->rgb) {
            s = MA_ERR_NOMEM;
            break;
        }
        const int ox = (int)((seed * 37 + (uint64_t)i * 91) % 160), oy = (int)((seed * 53 + (uint64_t)i * 29) % 160);
        for (int y = 0; y < 256; y++)
            for (int x = 0; x < 256; x++) {
                uint8_t *p = im->rgb + ((size_t)y * 256 + x) * 3;
                int in_box = x >= ox && x < ox + 64 && y >= oy && y < oy + 64;
                p[0] = (uint8_t)(in_box ? 200 : (x + i * 40) & 255);
                p[1] = (uint8_t)(in_box ? 40 : (y * 3 / 4 + 30) & 255);
                p[2] = (uint8_t)(in_box ? 60 : ((x + y) / 2 + i * 70) & 255);
            }
    }
    const char *task = "put both the alphabet soup and the tomato sauce in the basket";
    float state[8] = {0.02f, -0.05f, 0.9f, 3.1f, -0.1f, 0.05f, 0.03f, -0.03f};
    int dim = m->ns.has_state && m->ns.state.dim < 8 ? m->ns.state.dim : 8;
    if (!s) s = ma_prepare_observation(m, q->imgs, 2, task, strlen(task), state, dim, &q->prep, err);
    if (s) {
        ma_request_free(q);
        return s;
    }
    q->obs.pixels = q->prep.pixels;
    q->obs.n_images = 2;
    q->obs.input_ids = q->prep.prompt.ids;
    q->obs.seq_len = q->prep.prompt.n;
    q->obs.seed = seed;
    return MA_OK;
}
