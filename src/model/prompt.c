/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L
#include "model/prompt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/util.h"

/* ------------------------------------------------------------------------------ code points */

typedef struct {
    uint32_t *c;
    size_t n, cap;
} cps;

static int cps_push(cps *v, uint32_t c) {
    if (ma_grow_array(&v->c, &v->cap, v->n, 1, sizeof *v->c)) return 0;
    v->c[v->n++] = c;
    return 1;
}

static int decode(const char *s, size_t len, cps *out) {
    for (size_t i = 0; i < len;) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(len - i), &c);
        if (k <= 0) return 0;
        if (!cps_push(out, (uint32_t)c)) return 0;
        i += (size_t)k;
    }
    return 1;
}

static char *encode(const uint32_t *c, size_t n) {
    char *o = malloc(4 * n + 1);
    if (!o) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += (size_t)utf8proc_encode_char((utf8proc_int32_t)c[i], (utf8proc_uint8_t *)o + k);
    o[k] = '\0';
    return o;
}

/* Python str.isspace() / the re module's \s on str */
static int py_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
           c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

static int in_set(uint32_t c, const uint32_t *set) {
    for (; *set; set++)
        if (*set == c) return 1;
    return 0;
}

static const uint32_t TRAIL_PUNCT[] = {'.', ',', '!', '?', ';', ':', 0x2026, 0};
static const uint32_t TRAIL_CLOSE[] = {'"', '\'', 0x201d, 0x2019, ')', ']', '}', 0};
static const uint32_t SURROUND[] = {'"', '\'', '`', 0x201c, 0x201d, 0x2018, 0x2019, '[', ']', '(', ')', '{', '}', 0};

static void strip_set(cps *v, size_t *a, size_t *b, const uint32_t *set, int left) {
    while (*b > *a && (set ? in_set(v->c[*b - 1], set) : py_space(v->c[*b - 1]))) (*b)--;
    while (left && *a < *b && (set ? in_set(v->c[*a], set) : py_space(v->c[*a]))) (*a)++;
}

/* Python re IGNORECASE match of an ASCII keyword (with the Unicode folds that reach ASCII) */
static int ci_eq(uint32_t c, char k) {
    if (c < 0x80) return (c | 0x20) == (uint32_t)(k | 0x20);
    if (c == 0x17f) return k == 's' || k == 'S';  /* long s */
    if (c == 0x212a) return k == 'k' || k == 'K'; /* Kelvin sign */
    return 0;
}

static size_t match_word(const cps *v, size_t i, size_t end, const char *w) {
    size_t k = 0;
    for (; w[k]; k++)
        if (i + k >= end || !ci_eq(v->c[i + k], w[k])) return 0;
    return k;
}

/* ^(?:task|instruction|language[_ ]instruction|goal)\s*[:\-]\s*  -> length matched or 0 */
static size_t prefix1(const cps *v, size_t a, size_t b) {
    const char *words[] = {"task", "instruction", "language_instruction", "language instruction", "goal"};
    for (int w = 0; w < 5; w++) {
        size_t k = match_word(v, a, b, words[w]);
        if (!k) continue;
        size_t i = a + k;
        while (i < b && py_space(v->c[i])) i++;
        if (i < b && (v->c[i] == ':' || v->c[i] == '-')) {
            i++;
            while (i < b && py_space(v->c[i])) i++;
            return i - a;
        }
    }
    return 0;
}

/* ^(?:the\s+task\s+is\s+to|your\s+task\s+is\s+to)\s+ */
static size_t prefix2(const cps *v, size_t a, size_t b) {
    const char *first[] = {"the", "your"};
    const char *rest[] = {"task", "is", "to"};
    for (int f = 0; f < 2; f++) {
        size_t i = a, k = match_word(v, i, b, first[f]);
        if (!k) continue;
        i += k;
        int ok = 1;
        for (int r = 0; r < 3 && ok; r++) {
            size_t sp = i;
            while (i < b && py_space(v->c[i])) i++;
            if (i == sp) {
                ok = 0;
                break;
            }
            k = match_word(v, i, b, rest[r]);
            if (!k) ok = 0;
            i += k;
        }
        if (!ok) continue;
        size_t sp = i;
        while (i < b && py_space(v->c[i])) i++;
        if (i > sp) return i - a;
    }
    return 0;
}

/* Python str.lower(): full lowercase mapping (U+0130 -> i + U+0307) and final sigma */
static int lower_into(const uint32_t *c, size_t n, cps *out) {
    for (size_t i = 0; i < n; i++) {
        uint32_t x = c[i];
        if (x == 0x130) {
            if (!cps_push(out, 'i') || !cps_push(out, 0x307)) return 0;
            continue;
        }
        if (x == 0x3a3) {
            int before = 0, after = 0;
            for (size_t k = i; k-- > 0;) {
                utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c[k]);
                if (cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_ME || cat == UTF8PROC_CATEGORY_CF) continue;
                before =
                    utf8proc_islower((utf8proc_int32_t)c[k]) || utf8proc_isupper((utf8proc_int32_t)c[k]) || cat == UTF8PROC_CATEGORY_LT;
                break;
            }
            for (size_t k = i + 1; k < n; k++) {
                utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c[k]);
                if (cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_ME || cat == UTF8PROC_CATEGORY_CF) continue;
                after = utf8proc_islower((utf8proc_int32_t)c[k]) || utf8proc_isupper((utf8proc_int32_t)c[k]) || cat == UTF8PROC_CATEGORY_LT;
                break;
            }
            if (!cps_push(out, before && !after ? 0x3c2 : 0x3c3)) return 0;
            continue;
        }
        if (!cps_push(out, (uint32_t)utf8proc_tolower((utf8proc_int32_t)x))) return 0;
    }
    return 1;
}

ma_status ma_normalize_task(const char *task, size_t len, char **out, ma_error *err) {
    *out = NULL;
    if (len > MA_TASK_MAX_BYTES) return ma_fail(err, MA_ERR_RANGE, "task: %zu bytes (limit %d)", len, MA_TASK_MAX_BYTES);
    cps in = {0}, v = {0}, low = {0};
    ma_status s = MA_OK;
    if (!decode(task, len, &in)) {
        s = ma_fail(err, MA_ERR_FORMAT, "task is not valid UTF-8");
        goto done;
    }
    /* re.sub(r"\s+", " ") then strip() */
    for (size_t i = 0; i < in.n; i++) {
        if (py_space(in.c[i])) {
            if (v.n && v.c[v.n - 1] == ' ' && i > 0 && py_space(in.c[i - 1])) continue;
            if (!cps_push(&v, ' ')) goto oom;
        } else if (!cps_push(&v, in.c[i])) goto oom;
    }
    size_t a = 0, b = v.n;
    strip_set(&v, &a, &b, NULL, 1);
    if (a < b) {
        for (;;) {
            size_t pa = a, pb = b;
            strip_set(&v, &a, &b, NULL, 1);
            strip_set(&v, &a, &b, SURROUND, 1);
            strip_set(&v, &a, &b, NULL, 1);
            size_t k = prefix1(&v, a, b);
            a += k;
            strip_set(&v, &a, &b, NULL, 1);
            k = prefix2(&v, a, b);
            a += k;
            strip_set(&v, &a, &b, NULL, 1);
            strip_set(&v, &a, &b, TRAIL_PUNCT, 0);
            strip_set(&v, &a, &b, NULL, 0);
            strip_set(&v, &a, &b, TRAIL_CLOSE, 0);
            strip_set(&v, &a, &b, NULL, 0);
            strip_set(&v, &a, &b, TRAIL_PUNCT, 0);
            strip_set(&v, &a, &b, NULL, 0);
            if ((a == pa && b == pb) || a >= b) break;
        }
    }
    /* re.split(r"[.!?]+") -> stripped non-empty chunks joined by "; " when more than one */
    cps joined = {0};
    size_t chunks = 0;
    for (size_t i = a; i < b;) {
        size_t j = i;
        while (j < b && v.c[j] != '.' && v.c[j] != '!' && v.c[j] != '?') j++;
        size_t ca = i, cb = j;
        strip_set(&v, &ca, &cb, NULL, 1);
        if (ca < cb) {
            if (chunks++ && (!cps_push(&joined, ';') || !cps_push(&joined, ' '))) {
                free(joined.c);
                goto oom;
            }
            for (size_t k = ca; k < cb; k++)
                if (!cps_push(&joined, v.c[k])) {
                    free(joined.c);
                    goto oom;
                }
        }
        while (j < b && (v.c[j] == '.' || v.c[j] == '!' || v.c[j] == '?')) j++;
        i = j;
    }
    const uint32_t *src = chunks > 1 ? joined.c : v.c ? v.c + a : NULL; /* an empty task has no buffer */
    size_t sn = chunks > 1 ? joined.n : b - a;
    if (!lower_into(src, sn, &low)) {
        free(joined.c);
        goto oom;
    }
    free(joined.c);
    *out = encode(low.c, low.n);
    if (!*out) goto oom;
    goto done;
oom:
    s = ma_fail(err, MA_ERR_NOMEM, "task: out of memory");
done:
    free(in.c);
    free(v.c);
    free(low.c);
    return s;
}

int ma_state_bin(float s, int num_bins) {
    if (isnan(s)) s = 0.0f;
    else if (isinf(s)) s = s > 0 ? 1.0f : -1.0f;
    s = s < -1.0f ? -1.0f : (s > 1.0f ? 1.0f : s);
    float scaled = (s + 1.0f) / 2.0f * (float)(num_bins - 1);
    long b = lrintf(scaled); /* round half to even, as np.rint */
    return (int)(b < 0 ? 0 : (b > num_bins - 1 ? num_bins - 1 : b));
}

void ma_prompt_free(ma_prompt *p) {
    free(p->ids);
    free(p->text);
    free(p->task);
    memset(p, 0, sizeof *p);
}

/* 1 when appended (the prompt's pieces are chained with &&) */
static int sb_add(ma_buf *b, const char *s, size_t n) { return ma_buf_append(b, s, n) == MA_OK; }
static int sb_str(ma_buf *b, const char *s) { return ma_buf_puts(b, s) == MA_OK; }

static int wrap(ma_buf *b, const char *text, const char *start, const char *end, int enabled) {
    size_t tl = strlen(text), sl = strlen(start), el = strlen(end);
    if (tl >= sl + el && !strncmp(text, start, sl) && !strcmp(text + tl - el, end)) return sb_str(b, text);
    if (!tl || !enabled) return sb_str(b, text);
    return sb_str(b, start) && sb_str(b, text) && sb_str(b, end);
}

ma_status ma_build_prompt(const ma_config *cfg, const ma_normstats *ns, const ma_tokenizer *tok, const ma_prompt_opts *o, const char *task,
                          size_t task_len, const float *state, int state_dim, ma_prompt *out, ma_error *err) {
    memset(out, 0, sizeof *out);
    ma_status s = MA_OK;
    if (ns->has_state && state_dim != ns->state.dim)
        return ma_fail(err, MA_ERR_SHAPE, "state has %d values, norm_stats expects %d", state_dim, ns->state.dim);
    if (state_dim < 1 || state_dim > MA_NORM_MAX_DIM) return ma_fail(err, MA_ERR_SHAPE, "state has %d values", state_dim);
    if (ma_utf8_valid_prefix((const uint8_t *)task, task_len) != task_len) return ma_fail(err, MA_ERR_FORMAT, "task is not valid UTF-8");
    if (memchr(task, '\0', task_len)) { /* keep it: upstream passes NUL through to the tokenizer */
    }
    out->state_dim = state_dim;
    if ((s = ma_normstats_check_state(ns, state, state_dim, err))) return s; /* LeRobot's refusal of pass-through values */
    if (ns->has_state) ma_normalize(ns, &ns->state, state, out->state_norm);
    else memcpy(out->state_norm, state, sizeof(float) * (size_t)state_dim);
    for (int i = 0; i < state_dim; i++) out->state_bins[i] = ma_state_bin(out->state_norm[i], cfg->num_state_tokens);
    if (o->normalize_language) {
        if ((s = ma_normalize_task(task, task_len, &out->task, err))) return s;
    } else {
        if (task_len > MA_TASK_MAX_BYTES) return ma_fail(err, MA_ERR_RANGE, "task: %zu bytes (limit %d)", task_len, MA_TASK_MAX_BYTES);
        out->task = malloc(task_len + 1);
        if (!out->task) return ma_fail(err, MA_ERR_NOMEM, "out of memory");
        memcpy(out->task, task, task_len);
        out->task[task_len] = '\0';
    }
    size_t tl = o->normalize_language ? strlen(out->task) : task_len;
    ma_buf b = {0};
    int ok = 1;
    if (o->n_images == 1) ok = sb_str(&b, "<|image|>");
    else
        for (int i = 0; i < o->n_images && ok; i++) {
            char img[32];
            snprintf(img, sizeof img, "Image %d<|image|>", i + 1);
            ok = sb_str(&b, img);
        }
    ok = ok && sb_str(&b, "<|im_start|>user\nThe task is to ") && sb_add(&b, out->task, tl) && sb_str(&b, ". The setup is ") &&
         wrap(&b, ns->setup_type, "<setup_start>", "<setup_end>", cfg->add_setup_tokens) && sb_str(&b, ".");
    ok = ok && sb_str(&b, " The current state of the robot is <state_start>");
    for (int i = 0; i < state_dim && ok; i++) {
        char t[32];
        snprintf(t, sizeof t, "<state_%d>", out->state_bins[i]);
        ok = sb_str(&b, t);
    }
    ok = ok && sb_str(&b, "<state_end>. The expected control mode is ") &&
         wrap(&b, ns->control_mode, "<control_start>", "<control_end>", cfg->add_control_tokens) &&
         sb_str(&b,
                ". Given these, what action should the robot take to complete the task?<|im_end|>\n<|im_start|>assistant\n<action_output>");
    if (!ok) {
        ma_buf_free(&b);
        ma_prompt_free(out);
        return ma_fail(err, MA_ERR_NOMEM, "prompt: out of memory");
    }
    out->text = b.data;
    /* expand <|image|>: <im_start> + patches (+ <im_col> per row) + <im_end> */
    ma_buf img = {0};
    ok = sb_str(&img, "<im_start>");
    int grid = cfg->pooled_h * cfg->pooled_w;
    if (o->tokens_per_image != grid || !o->col_tokens)
        for (int k = 0; k < o->tokens_per_image && ok; k++) ok = sb_str(&img, "<im_patch>");
    else
        for (int r = 0; r < cfg->pooled_h && ok; r++) {
            for (int c = 0; c < cfg->pooled_w && ok; c++) ok = sb_str(&img, "<im_patch>");
            ok = ok && sb_str(&img, "<im_col>");
        }
    ok = ok && sb_str(&img, "<im_end>");
    ma_buf full = {0};
    const char *p = out->text, *hit;
    while (ok && (hit = strstr(p, "<|image|>"))) {
        ok = sb_add(&full, p, (size_t)(hit - p)) && sb_add(&full, img.data, img.len);
        p = hit + strlen("<|image|>");
    }
    ok = ok && sb_str(&full, p);
    ma_buf_free(&img);
    if (!ok) {
        ma_buf_free(&full);
        ma_prompt_free(out);
        return ma_fail(err, MA_ERR_NOMEM, "prompt: out of memory");
    }
    int64_t *ids;
    size_t n;
    s = ma_tokenizer_encode(tok, full.data, full.len, &ids, &n, err);
    ma_buf_free(&full);
    if (s) {
        ma_prompt_free(out);
        return s;
    }
    int64_t bos = cfg->bos_id >= 0 ? cfg->bos_id : cfg->eos_id;
    if (n == 0 || ids[0] != bos) {
        int64_t *w = realloc(ids, sizeof *w * (n + 1));
        if (!w) {
            free(ids);
            ma_prompt_free(out);
            return ma_fail(err, MA_ERR_NOMEM, "prompt: out of memory");
        }
        memmove(w + 1, w, sizeof *w * n);
        w[0] = bos;
        ids = w;
        n++;
    }
    out->ids = ids;
    out->n = (int64_t)n;
    return MA_OK;
}
