/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L
#include "model/tokenizer.h"
#include "io/jsonline.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/util.h"
#include "io/mapfile.h"

/* ------------------------------------------------------------------------------ UTF-8 */

/* decode one code point at s[i] (valid input assumed); returns its byte length */
static int utf8_next(const uint8_t *s, size_t len, size_t i, uint32_t *cp) {
    uint8_t c = s[i];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if ((c >> 5) == 6 && i + 1 < len) {
        *cp = ((uint32_t)(c & 0x1f) << 6) | (s[i + 1] & 0x3f);
        return 2;
    }
    if ((c >> 4) == 14 && i + 2 < len) {
        *cp = ((uint32_t)(c & 0x0f) << 12) | ((uint32_t)(s[i + 1] & 0x3f) << 6) | (s[i + 2] & 0x3f);
        return 3;
    }
    if (i + 3 < len) {
        *cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[i + 1] & 0x3f) << 12) | ((uint32_t)(s[i + 2] & 0x3f) << 6) | (s[i + 3] & 0x3f);
        return 4;
    }
    *cp = 0xfffd;
    return 1;
}

/* ------------------------------------------------------------------------------ hash maps */

typedef struct {
    char *key;
    uint32_t klen;
    int32_t val;
} sent;
typedef struct {
    sent *e;
    size_t cap, n;
} strmap;

static uint64_t fnv(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

static int strmap_init(strmap *m, size_t n) {
    m->cap = 16;
    while (m->cap < 2 * n + 16) m->cap <<= 1;
    m->e = calloc(m->cap, sizeof *m->e);
    m->n = 0;
    return m->e != NULL;
}

static void strmap_free(strmap *m) {
    if (m->e)
        for (size_t i = 0; i < m->cap; i++) free(m->e[i].key);
    free(m->e);
    memset(m, 0, sizeof *m);
}

static int32_t strmap_get(const strmap *m, const char *k, size_t n) {
    if (!m->cap) return -1;
    for (size_t i = fnv(k, n) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        const sent *e = &m->e[i];
        if (!e->key) return -1;
        if (e->klen == n && !memcmp(e->key, k, n)) return e->val;
    }
}

/* 1 inserted, 0 already present (value kept), -1 out of memory */
static int strmap_put(strmap *m, const char *k, size_t n, int32_t v) {
    for (size_t i = fnv(k, n) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        sent *e = &m->e[i];
        if (!e->key) {
            if (2 * (m->n + 1) > m->cap) return -1; /* sized at init */
            e->key = malloc(n + 1);
            if (!e->key) return -1;
            memcpy(e->key, k, n);
            e->key[n] = '\0';
            e->klen = (uint32_t)n;
            e->val = v;
            m->n++;
            return 1;
        }
        if (e->klen == n && !memcmp(e->key, k, n)) return 0;
    }
}

typedef struct {
    uint64_t key;
    int32_t rank, id;
} pent; /* key = (left + 1) << 32 | right */
typedef struct {
    pent *e;
    size_t cap;
} pairmap;

static int pairmap_init(pairmap *m, size_t n) {
    m->cap = 16;
    while (m->cap < 2 * n + 16) m->cap <<= 1;
    m->e = calloc(m->cap, sizeof *m->e);
    return m->e != NULL;
}

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static const pent *pairmap_get(const pairmap *m, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)(a + 1) << 32) | (uint32_t)b;
    for (size_t i = mix(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (!m->e[i].key) return NULL;
        if (m->e[i].key == key) return &m->e[i];
    }
}

static void pairmap_put(pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id) {
    uint64_t key = ((uint64_t)(uint32_t)(a + 1) << 32) | (uint32_t)b;
    for (size_t i = mix(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (!m->e[i].key) {
            m->e[i] = (pent){key, rank, id};
            return;
        }
        if (m->e[i].key == key) return; /* the first (lowest-rank) merge of a pair wins */
    }
}

/* ------------------------------------------------------------------------------ tokenizer */

typedef struct {
    char *content;
    size_t len;
    int32_t id;
    int single_word, lstrip, rstrip, normalized, special;
} added_tok;

typedef struct {
    int32_t *child;
    size_t cap;
    int32_t *tok;
    int32_t nodes, node_cap;
} trie; /* tok: added index or -1 */

typedef enum { PRE_NONE, PRE_QWEN2, PRE_GPT2 } pre_kind;
typedef enum { NORM_NONE, NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD } norm_kind;

struct ma_tokenizer {
    strmap vocab;       /* byte-level token string -> id */
    char **id_to_token; /* all ids (vocab and added) */
    size_t n_ids;
    pairmap merges;
    int32_t byte_id[256];  /* id of each single byte-level symbol (-1 if absent) */
    char byte_sym[256][4]; /* the byte-level alphabet, UTF-8 */
    int byte_sym_len[256];
    int32_t sym_to_byte[512]; /* code point (< 512) -> byte, -1 if not a byte symbol */
    added_tok *added;
    size_t n_added;
    strmap added_map; /* content -> id */
    trie raw, normed;
    int n_norm;
    norm_kind norms[4];
    pre_kind pre;
    int pre_isolated;
    int ignore_merges;
};

/* trie over bytes; child table is an open-addressing map (node, byte) -> node */
static int trie_init(trie *t, size_t expect) {
    memset(t, 0, sizeof *t);
    t->cap = 64;
    while (t->cap < 2 * expect + 64) t->cap <<= 1;
    t->child = malloc(sizeof(int32_t) * 2 * t->cap);
    t->node_cap = (int32_t)(expect + 2);
    t->tok = malloc(sizeof(int32_t) * (size_t)t->node_cap);
    if (!t->child || !t->tok) return 0;
    for (size_t i = 0; i < 2 * t->cap; i++) t->child[i] = -1;
    t->nodes = 1;
    t->tok[0] = -1;
    return 1;
}
static void trie_free(trie *t) {
    free(t->child);
    free(t->tok);
    memset(t, 0, sizeof *t);
}

static int32_t trie_step(const trie *t, int32_t node, uint8_t b) {
    uint64_t key = ((uint64_t)(uint32_t)node << 8) | b;
    for (size_t i = mix(key + 1) & (t->cap - 1);; i = (i + 1) & (t->cap - 1)) {
        if (t->child[2 * i] < 0) return -1;
        /* slot = (parent node, child node << 8 | byte) */
        if (t->child[2 * i] == node && ((uint32_t)t->child[2 * i + 1] & 0xff) == b) return (int32_t)((uint32_t)t->child[2 * i + 1] >> 8);
    }
}

static int trie_add(trie *t, const char *s, size_t n, int32_t tok) {
    int32_t node = 0;
    for (size_t k = 0; k < n; k++) {
        uint8_t b = (uint8_t)s[k];
        int32_t nx = trie_step(t, node, b);
        if (nx < 0) {
            if ((size_t)t->nodes * 2 + 2 > t->cap || t->nodes >= t->node_cap) return 0;
            nx = t->nodes++;
            t->tok[nx] = -1;
            uint64_t key = ((uint64_t)(uint32_t)node << 8) | b;
            size_t i = mix(key + 1) & (t->cap - 1);
            while (t->child[2 * i] >= 0) i = (i + 1) & (t->cap - 1);
            t->child[2 * i] = node;
            t->child[2 * i + 1] = (int32_t)(((uint32_t)nx << 8) | b);
        }
        node = nx;
    }
    if (t->tok[node] < 0) t->tok[node] = tok; /* first token of that content wins */
    return 1;
}

/* longest added token starting at s[i]: returns its index and sets *end, or -1 */
static int32_t trie_longest(const trie *t, const uint8_t *s, size_t len, size_t i, size_t *end) {
    int32_t node = 0, best = -1;
    for (size_t k = i; k < len; k++) {
        node = trie_step(t, node, s[k]);
        if (node < 0) break;
        if (t->tok[node] >= 0) {
            best = t->tok[node];
            *end = k + 1;
        }
    }
    return best;
}

void ma_tokenizer_free(ma_tokenizer *t) {
    if (!t) return;
    strmap_free(&t->vocab);
    strmap_free(&t->added_map);
    if (t->id_to_token)
        for (size_t i = 0; i < t->n_ids; i++) free(t->id_to_token[i]);
    free(t->id_to_token);
    free(t->merges.e);
    for (size_t i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    trie_free(&t->raw);
    trie_free(&t->normed);
    free(t);
}

/* GPT-2 byte-level alphabet: printable bytes map to themselves, the others to U+0100 + n */
static void byte_alphabet(ma_tokenizer *t) {
    int n = 0;
    for (int i = 0; i < 512; i++) t->sym_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
        uint32_t cp = keep ? (uint32_t)b : 256u + (uint32_t)n++;
        t->byte_sym_len[b] = ma_utf8_put(cp, t->byte_sym[b]);
        t->sym_to_byte[cp] = b;
    }
}

static ma_status parse_norm(ma_tokenizer *t, const cJSON *n, const char *label, ma_error *err) {
    if (!n || cJSON_IsNull(n)) return MA_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(n, "type");
    if (!cJSON_IsString(type)) return ma_fail(err, MA_ERR_FORMAT, "%s: normalizer without a type", label);
    const char *ty = type->valuestring;
    if (!strcmp(ty, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        for (const cJSON *e = cJSON_IsArray(list) ? list->child : NULL; e; e = e->next) {
            ma_status s = parse_norm(t, e, label, err);
            if (s) return s;
        }
        return MA_OK;
    }
    norm_kind k;
    if (!strcmp(ty, "NFC")) k = NORM_NFC;
    else if (!strcmp(ty, "NFD")) k = NORM_NFD;
    else if (!strcmp(ty, "NFKC")) k = NORM_NFKC;
    else if (!strcmp(ty, "NFKD")) k = NORM_NFKD;
    else return ma_fail(err, MA_ERR_UNSUPPORTED, "%s: normalizer %s is not supported (NFC, NFD, NFKC, NFKD)", label, ty);
    if (t->n_norm >= 4) return ma_fail(err, MA_ERR_UNSUPPORTED, "%s: too many normalizers", label);
    t->norms[t->n_norm++] = k;
    return MA_OK;
}

static const char *QWEN2_SPLIT =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static ma_status parse_pre(ma_tokenizer *t, const cJSON *p, const char *label, ma_error *err) {
    if (!p || cJSON_IsNull(p)) return ma_fail(err, MA_ERR_UNSUPPORTED, "%s: a byte-level pre_tokenizer is required", label);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
    const char *ty = cJSON_IsString(type) ? type->valuestring : "";
    if (!strcmp(ty, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        int have_bl = 0;
        for (const cJSON *e = cJSON_IsArray(list) ? list->child : NULL; e; e = e->next) {
            const cJSON *et = cJSON_GetObjectItemCaseSensitive(e, "type");
            const char *etn = cJSON_IsString(et) ? et->valuestring : "";
            if (!strcmp(etn, "Split")) {
                const cJSON *pat = cJSON_GetObjectItemCaseSensitive(e, "pattern");
                const cJSON *rx = pat ? cJSON_GetObjectItemCaseSensitive(pat, "Regex") : NULL;
                const cJSON *beh = cJSON_GetObjectItemCaseSensitive(e, "behavior");
                const cJSON *inv = cJSON_GetObjectItemCaseSensitive(e, "invert");
                if (!cJSON_IsString(rx) || strcmp(rx->valuestring, QWEN2_SPLIT))
                    return ma_fail(err, MA_ERR_UNSUPPORTED, "%s: only the Qwen2 split regex is implemented", label);
                if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") || cJSON_IsTrue(inv))
                    return ma_fail(err, MA_ERR_UNSUPPORTED, "%s: Split behavior must be Isolated, not inverted", label);
                t->pre = PRE_QWEN2;
            } else if (!strcmp(etn, "ByteLevel")) {
                if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "add_prefix_space")))
                    return ma_fail(err, MA_ERR_UNSUPPORTED, "%s: ByteLevel add_prefix_space is not supported", label);
                if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "use_regex"))) {
                    if (t->pre != PRE_NONE) return ma_fail(err, MA_ERR_UNSUPPORTED, "%s: two split regexes", label);
                    t->pre = PRE_GPT2;
                }
                have_bl = 1;
            } else return ma_fail(err, MA_ERR_UNSUPPORTED, "%s: pre_tokenizer %s is not supported", label, etn);
        }
        if (!have_bl) return ma_fail(err, MA_ERR_UNSUPPORTED, "%s: a ByteLevel pre_tokenizer is required", label);
        return MA_OK;
    }
    if (!strcmp(ty, "ByteLevel")) {
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "add_prefix_space")))
            return ma_fail(err, MA_ERR_UNSUPPORTED, "%s: ByteLevel add_prefix_space is not supported", label);
        const cJSON *ur = cJSON_GetObjectItemCaseSensitive(p, "use_regex");
        t->pre = (!ur || cJSON_IsTrue(ur)) ? PRE_GPT2 : PRE_NONE;
        return MA_OK;
    }
    return ma_fail(err, MA_ERR_UNSUPPORTED, "%s: pre_tokenizer %s is not supported", label, ty);
}

static int json_flag(const cJSON *o, const char *k, int def) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsBool(j) ? cJSON_IsTrue(j) : def;
}

static ma_status set_id(ma_tokenizer *t, int64_t id, const char *s, size_t n, const char *label, ma_error *err) {
    if (id < 0 || (size_t)id >= t->n_ids) return ma_fail(err, MA_ERR_FORMAT, "%s: token id %lld out of range", label, (long long)id);
    if (t->id_to_token[id]) return MA_OK; /* vocabulary entry kept; added tokens may repeat it */
    t->id_to_token[id] = malloc(n + 1);
    if (!t->id_to_token[id]) return ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", label);
    memcpy(t->id_to_token[id], s, n);
    t->id_to_token[id][n] = '\0';
    return MA_OK;
}

ma_status ma_tokenizer_parse(const char *json, size_t len, const char *label, ma_tokenizer **out, ma_error *err) {
    *out = NULL;
    cJSON *root;
    ma_status ps = ma_json_parse_object(json, len, label, &root, err);
    if (ps) return ps;
    ma_tokenizer *t = calloc(1, sizeof *t);
    ma_status s = MA_OK;
    if (!t) {
        cJSON_Delete(root);
        return ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", label);
    }
    byte_alphabet(t);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *type = model ? cJSON_GetObjectItemCaseSensitive(model, "type") : NULL;
    const cJSON *vocab = model ? cJSON_GetObjectItemCaseSensitive(model, "vocab") : NULL;
    const cJSON *merges = model ? cJSON_GetObjectItemCaseSensitive(model, "merges") : NULL;
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "BPE")) {
        s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: model.type must be BPE", label);
        goto done;
    }
    if (!cJSON_IsObject(vocab)) {
        s = ma_fail(err, MA_ERR_FORMAT, "%s: model.vocab must be an object", label);
        goto done;
    }
    if (merges && !cJSON_IsNull(merges) && !cJSON_IsArray(merges)) {
        s = ma_fail(err, MA_ERR_FORMAT, "%s: model.merges must be a list", label);
        goto done;
    }
    if (json_flag(model, "byte_fallback", 0)) {
        s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: byte_fallback is not supported", label);
        goto done;
    }
    const cJSON *csp = cJSON_GetObjectItemCaseSensitive(model, "continuing_subword_prefix");
    const cJSON *eow = cJSON_GetObjectItemCaseSensitive(model, "end_of_word_suffix");
    if ((cJSON_IsString(csp) && csp->valuestring[0]) || (cJSON_IsString(eow) && eow->valuestring[0])) {
        s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: subword prefixes/suffixes are not supported", label);
        goto done;
    }
    const cJSON *drop = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (drop && !cJSON_IsNull(drop) && !(cJSON_IsNumber(drop) && drop->valuedouble == 0.0)) {
        s = ma_fail(err, MA_ERR_UNSUPPORTED, "%s: BPE dropout is not supported", label);
        goto done;
    }
    t->ignore_merges = json_flag(model, "ignore_merges", 0);
    if ((s = parse_norm(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), label, err))) goto done;
    if ((s = parse_pre(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), label, err))) goto done;
    /* ids: the largest of vocab and added tokens */
    int64_t max_id = -1;
    size_t nv = 0, na = 0;
    for (const cJSON *e = vocab->child; e; e = e->next, nv++) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > 16777216.0 || e->valuedouble != (double)(int64_t)e->valuedouble) {
            s = ma_fail(err, MA_ERR_FORMAT, "%s: vocab entry %s has a bad id", label, e->string);
            goto done;
        }
        if ((int64_t)e->valuedouble > max_id) max_id = (int64_t)e->valuedouble;
    }
    for (const cJSON *e = cJSON_IsArray(added) ? added->child : NULL; e; e = e->next, na++) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id"), *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > 16777216.0 || !cJSON_IsString(c) || !c->valuestring[0]) {
            s = ma_fail(err, MA_ERR_FORMAT, "%s: added token %zu needs an id and a non-empty content", label, na);
            goto done;
        }
        if ((int64_t)id->valuedouble > max_id) max_id = (int64_t)id->valuedouble;
    }
    t->n_ids = (size_t)(max_id + 1);
    t->id_to_token = calloc(t->n_ids ? t->n_ids : 1, sizeof *t->id_to_token);
    if (!t->id_to_token || !strmap_init(&t->vocab, nv) || !strmap_init(&t->added_map, na)) {
        s = ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", label);
        goto done;
    }
    for (const cJSON *e = vocab->child; e; e = e->next) {
        size_t kl = strlen(e->string);
        int r = strmap_put(&t->vocab, e->string, kl, (int32_t)e->valuedouble);
        if (r < 0) {
            s = ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", label);
            goto done;
        }
        if ((s = set_id(t, (int64_t)e->valuedouble, e->string, kl, label, err))) goto done;
    }
    for (int b = 0; b < 256; b++) t->byte_id[b] = strmap_get(&t->vocab, t->byte_sym[b], (size_t)t->byte_sym_len[b]);
    /* merges: "a b" strings or ["a", "b"] pairs; rank = position */
    size_t nm = cJSON_IsArray(merges) ? (size_t)cJSON_GetArraySize(merges) : 0;
    if (!pairmap_init(&t->merges, nm)) {
        s = ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", label);
        goto done;
    }
    int32_t rank = 0;
    char buf[1024];
    for (const cJSON *e = nm ? merges->child : NULL; e; e = e->next, rank++) {
        const char *a, *b;
        size_t al, bl;
        if (cJSON_IsString(e)) {
            const char *sp = strchr(e->valuestring, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                s = ma_fail(err, MA_ERR_FORMAT, "%s: merge %d is not \"a b\"", label, rank);
                goto done;
            }
            a = e->valuestring;
            al = (size_t)(sp - a);
            b = sp + 1;
            bl = strlen(b);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(e->child) && cJSON_IsString(e->child->next)) {
            a = e->child->valuestring;
            al = strlen(a);
            b = e->child->next->valuestring;
            bl = strlen(b);
        } else {
            s = ma_fail(err, MA_ERR_FORMAT, "%s: merge %d is malformed", label, rank);
            goto done;
        }
        int32_t ia = strmap_get(&t->vocab, a, al), ib = strmap_get(&t->vocab, b, bl);
        if (al + bl >= sizeof buf || ia < 0 || ib < 0) {
            s = ma_fail(err, MA_ERR_FORMAT, "%s: merge %d uses tokens missing from the vocabulary", label, rank);
            goto done;
        }
        memcpy(buf, a, al);
        memcpy(buf + al, b, bl);
        int32_t im = strmap_get(&t->vocab, buf, al + bl);
        if (im < 0) {
            s = ma_fail(err, MA_ERR_FORMAT, "%s: merge %d produces a token missing from the vocabulary", label, rank);
            goto done;
        }
        pairmap_put(&t->merges, ia, ib, rank, im);
    }
    /* added tokens: split into the raw and the normalized matching sets */
    t->added = calloc(na ? na : 1, sizeof *t->added);
    size_t raw_bytes = 0, norm_bytes = 0;
    for (const cJSON *e = na ? added->child : NULL; e; e = e->next) {
        const char *c = cJSON_GetObjectItemCaseSensitive(e, "content")->valuestring;
        *(json_flag(e, "normalized", !json_flag(e, "special", 0)) ? &norm_bytes : &raw_bytes) += strlen(c) * 4 + 8;
    }
    if (!t->added || !trie_init(&t->raw, raw_bytes) || !trie_init(&t->normed, norm_bytes)) {
        s = ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", label);
        goto done;
    }
    for (const cJSON *e = na ? added->child : NULL; e; e = e->next) {
        added_tok *a = &t->added[t->n_added];
        const char *c = cJSON_GetObjectItemCaseSensitive(e, "content")->valuestring;
        a->id = (int32_t)cJSON_GetObjectItemCaseSensitive(e, "id")->valuedouble;
        a->special = json_flag(e, "special", 0);
        a->normalized = json_flag(e, "normalized", !a->special);
        a->single_word = json_flag(e, "single_word", 0);
        a->lstrip = json_flag(e, "lstrip", 0);
        a->rstrip = json_flag(e, "rstrip", 0);
        a->len = strlen(c);
        a->content = strdup(c);
        if (!a->content) {
            s = ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", label);
            goto done;
        }
        t->n_added++;
        if (strmap_put(&t->added_map, c, a->len, a->id) < 0 || (s = set_id(t, a->id, c, a->len, label, err))) {
            if (!s) s = ma_fail(err, MA_ERR_NOMEM, "%s: out of memory", label);
            goto done;
        }
        /* normalized tokens are matched in their normalised form */
        const uint8_t *pat = (const uint8_t *)c;
        utf8proc_uint8_t *normed = NULL;
        size_t pl = a->len;
        if (a->normalized && t->n_norm) {
            normed = (utf8proc_uint8_t *)strdup(c);
            for (int k = 0; k < t->n_norm && normed; k++) {
                int opts = UTF8PROC_STABLE | (t->norms[k] == NORM_NFC || t->norms[k] == NORM_NFKC ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE) |
                           (t->norms[k] == NORM_NFKC || t->norms[k] == NORM_NFKD ? UTF8PROC_COMPAT : 0);
                utf8proc_uint8_t *nx = NULL;
                utf8proc_ssize_t r = utf8proc_map(normed, (utf8proc_ssize_t)strlen((char *)normed), &nx, (utf8proc_option_t)opts);
                free(normed);
                normed = r < 0 ? NULL : nx;
            }
            if (!normed) {
                s = ma_fail(err, MA_ERR_FORMAT, "%s: added token %s cannot be normalised", label, c);
                goto done;
            }
            pat = normed;
            pl = strlen((char *)normed);
        }
        if (!trie_add(a->normalized ? &t->normed : &t->raw, (const char *)pat, pl, (int32_t)(t->n_added - 1)))
            s = ma_fail(err, MA_ERR_NOMEM, "%s: added-token table overflow", label);
        free(normed);
        if (s) goto done;
    }
done:
    cJSON_Delete(root);
    if (s) {
        ma_tokenizer_free(t);
        return s;
    }
    *out = t;
    return MA_OK;
}

ma_status ma_tokenizer_load(const char *path, ma_tokenizer **out, ma_error *err) {
    char *text;
    size_t len;
    ma_status s = ma_read_file(path, 256u << 20, &text, &len, err);
    if (s) return s;
    s = ma_tokenizer_parse(text, len, path, out, err);
    free(text);
    return s;
}

int64_t ma_tokenizer_token_id(const ma_tokenizer *t, const char *token) {
    int32_t v = strmap_get(&t->added_map, token, strlen(token));
    if (v >= 0) return v;
    return strmap_get(&t->vocab, token, strlen(token));
}

/* ------------------------------------------------------------------------------ encoding */

typedef struct {
    int64_t *v;
    size_t n, cap;
} idvec;

static int push(idvec *o, int64_t id) {
    if (ma_grow_array(&o->v, &o->cap, o->n, 1, sizeof *o->v)) return 0;
    o->v[o->n++] = id;
    return 1;
}

/* Oniguruma's \s with Unicode: White_Space */
static int is_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0d) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 ||
           c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}
static int is_letter(uint32_t c) {
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT || k == UTF8PROC_CATEGORY_LM ||
           k == UTF8PROC_CATEGORY_LO;
}
static int is_number(uint32_t c) {
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}
static int is_crlf(uint32_t c) { return c == '\r' || c == '\n'; }
static int is_other(uint32_t c) { return !is_space(c) && !is_letter(c) && !is_number(c); }
/* the contraction letters under (?i): Unicode simple case folding */
static int fold_is(uint32_t c, char l) {
    if (c < 0x80) return (c | 0x20) == (uint32_t)l;
    return l == 's' && c == 0x17f; /* LATIN SMALL LETTER LONG S folds to s */
}

/* length in code points of the pre-token starting at i (cps[0..n)) */
static size_t match_qwen2(const uint32_t *c, size_t n, size_t i) {
    /* (?i:'s|'t|'re|'ve|'m|'ll|'d) */
    if (c[i] == '\'' && i + 1 < n) {
        if (fold_is(c[i + 1], 's') || fold_is(c[i + 1], 't') || fold_is(c[i + 1], 'm') || fold_is(c[i + 1], 'd')) return 2;
        if (i + 2 < n && ((fold_is(c[i + 1], 'r') && fold_is(c[i + 2], 'e')) || (fold_is(c[i + 1], 'v') && fold_is(c[i + 2], 'e')) ||
                          (fold_is(c[i + 1], 'l') && fold_is(c[i + 2], 'l'))))
            return 3;
    }
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    {
        size_t j = i;
        if (!is_crlf(c[j]) && !is_letter(c[j]) && !is_number(c[j]) && j + 1 < n && is_letter(c[j + 1])) j++;
        if (is_letter(c[j])) {
            while (j < n && is_letter(c[j])) j++;
            return j - i;
        }
    }
    /* \p{N} */
    if (is_number(c[i])) return 1;
    /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
    {
        size_t j = i;
        if (c[j] == ' ' && j + 1 < n && is_other(c[j + 1])) j++;
        if (is_other(c[j])) {
            while (j < n && is_other(c[j])) j++;
            while (j < n && is_crlf(c[j])) j++;
            return j - i;
        }
    }
    /* whitespace runs */
    size_t j = i;
    while (j < n && is_space(c[j])) j++;
    /* \s*[\r\n]+ : up to the last CR/LF of the run */
    for (size_t k = j; k > i; k--)
        if (is_crlf(c[k - 1])) return k - i;
    /* \s+(?!\S) : the run, leaving its last space when a non-space follows */
    if (j == n) return j - i;
    if (j - i >= 2) return j - 1 - i;
    /* \s+ */
    return j - i;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t match_gpt2(const uint32_t *c, size_t n, size_t i) {
    if (c[i] == '\'' && i + 1 < n) {
        uint32_t a = c[i + 1];
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
        if (i + 2 < n && ((a == 'r' && c[i + 2] == 'e') || (a == 'v' && c[i + 2] == 'e') || (a == 'l' && c[i + 2] == 'l'))) return 3;
    }
    int (*cls[3])(uint32_t) = {is_letter, is_number, is_other};
    for (int k = 0; k < 3; k++) {
        size_t j = i;
        if (c[j] == ' ' && j + 1 < n && cls[k](c[j + 1])) j++;
        if (cls[k](c[j])) {
            while (j < n && cls[k](c[j])) j++;
            return j - i;
        }
    }
    size_t j = i;
    while (j < n && is_space(c[j])) j++;
    if (j == n) return j - i;
    if (j - i >= 2) return j - 1 - i;
    return j - i;
}

/* BPE of one pre-token (bytes): symbols per byte, then the (rank, position) min-heap */
typedef struct {
    int32_t id, prev, next, len;
} sym;
typedef struct {
    int32_t rank, pos, id;
} mrg;

static int mrg_less(mrg a, mrg b) { return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos; }

static void heap_push(mrg *h, size_t *n, mrg m) {
    size_t i = (*n)++;
    h[i] = m;
    while (i && mrg_less(h[i], h[(i - 1) / 2])) {
        mrg t = h[i];
        h[i] = h[(i - 1) / 2];
        h[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}
static mrg heap_pop(mrg *h, size_t *n) {
    mrg top = h[0];
    h[0] = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < *n && mrg_less(h[l], h[m])) m = l;
        if (r < *n && mrg_less(h[r], h[m])) m = r;
        if (m == i) break;
        mrg t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
    return top;
}

static ma_status bpe_word(const ma_tokenizer *t, const uint8_t *w, size_t len, idvec *out, ma_error *err) {
    if (t->ignore_merges) {
        char buf[512];
        size_t bl = 0;
        for (size_t i = 0; i < len && bl + 4 < sizeof buf; i++) {
            memcpy(buf + bl, t->byte_sym[w[i]], (size_t)t->byte_sym_len[w[i]]);
            bl += (size_t)t->byte_sym_len[w[i]];
        }
        int32_t id = len * 4 < sizeof buf ? strmap_get(&t->vocab, buf, bl) : -1;
        if (id >= 0) return push(out, id) ? MA_OK : ma_fail(err, MA_ERR_NOMEM, "tokenizer: out of memory");
    }
    sym *s = malloc(sizeof *s * (len ? len : 1));
    mrg *h = malloc(sizeof *h * (4 * len + 4));
    if (!s || !h) {
        free(s);
        free(h);
        return ma_fail(err, MA_ERR_NOMEM, "tokenizer: out of memory");
    }
    size_t ns = 0, nh = 0;
    for (size_t i = 0; i < len; i++) {
        int32_t id = t->byte_id[w[i]];
        if (id < 0) continue; /* no unk token: the symbol is dropped, as tokenizers does */
        s[ns] = (sym){id, (int32_t)ns - 1, (int32_t)ns + 1, 1};
        ns++;
    }
    if (ns) s[ns - 1].next = -1;
    for (size_t i = 0; i + 1 < ns; i++) {
        const pent *m = pairmap_get(&t->merges, s[i].id, s[i + 1].id);
        if (m) heap_push(h, &nh, (mrg){m->rank, (int32_t)i, m->id});
    }
    while (nh) {
        mrg top = heap_pop(h, &nh);
        sym *cur = &s[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        sym right = s[cur->next];
        const pent *m = pairmap_get(&t->merges, cur->id, right.id);
        if (!m || m->id != top.id) continue; /* expired entry */
        cur->id = top.id;
        cur->len += right.len;
        s[cur->next].len = 0;
        cur->next = right.next;
        if (right.next >= 0) s[right.next].prev = top.pos;
        if (nh + 2 > 4 * len + 4) continue;
        if (cur->prev >= 0) {
            const pent *pm = pairmap_get(&t->merges, s[cur->prev].id, cur->id);
            if (pm) heap_push(h, &nh, (mrg){pm->rank, cur->prev, pm->id});
        }
        if (cur->next >= 0) {
            const pent *nm = pairmap_get(&t->merges, cur->id, s[cur->next].id);
            if (nm) heap_push(h, &nh, (mrg){nm->rank, top.pos, nm->id});
        }
    }
    ma_status st = MA_OK;
    for (size_t i = 0; i < ns && !st; i++)
        if (s[i].len && !push(out, s[i].id)) st = ma_fail(err, MA_ERR_NOMEM, "tokenizer: out of memory");
    free(s);
    free(h);
    return st;
}

/* pre-tokenize + BPE one normalised piece */
static ma_status encode_piece(const ma_tokenizer *t, const uint8_t *p, size_t len, idvec *out, ma_error *err) {
    if (!len) return MA_OK;
    if (t->pre == PRE_NONE) return bpe_word(t, p, len, out, err);
    uint32_t *cps = malloc(sizeof *cps * len);
    size_t *off = malloc(sizeof *off * (len + 1));
    if (!cps || !off) {
        free(cps);
        free(off);
        return ma_fail(err, MA_ERR_NOMEM, "tokenizer: out of memory");
    }
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        off[n] = i;
        i += (size_t)utf8_next(p, len, i, &cps[n]);
        n++;
    }
    off[n] = len;
    ma_status s = MA_OK;
    for (size_t i = 0; i < n && !s;) {
        size_t k = t->pre == PRE_QWEN2 ? match_qwen2(cps, n, i) : match_gpt2(cps, n, i);
        if (k == 0) k = 1;
        s = bpe_word(t, p + off[i], off[i + k] - off[i], out, err);
        i += k;
    }
    free(cps);
    free(off);
    return s;
}

static ma_status normalise(const ma_tokenizer *t, const uint8_t *p, size_t len, uint8_t **out, size_t *olen, ma_error *err) {
    uint8_t *cur = malloc(len + 1);
    if (!cur) return ma_fail(err, MA_ERR_NOMEM, "tokenizer: out of memory");
    memcpy(cur, p, len);
    size_t cl = len;
    for (int k = 0; k < t->n_norm; k++) {
        int opts = UTF8PROC_STABLE | (t->norms[k] == NORM_NFC || t->norms[k] == NORM_NFKC ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE) |
                   (t->norms[k] == NORM_NFKC || t->norms[k] == NORM_NFKD ? UTF8PROC_COMPAT : 0);
        utf8proc_uint8_t *nx = NULL;
        utf8proc_ssize_t r = utf8proc_map(cur, (utf8proc_ssize_t)cl, &nx, (utf8proc_option_t)opts);
        free(cur);
        if (r < 0) return ma_fail(err, MA_ERR_FORMAT, "tokenizer: normalisation failed: %s", utf8proc_errmsg(r));
        cur = nx;
        cl = (size_t)r;
    }
    *out = cur;
    *olen = cl;
    return MA_OK;
}

/* a word character for single_word tokens: letters, marks, numbers, connectors */
static int is_word(uint32_t c) {
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return is_letter(c) || is_number(c) || k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_MC || k == UTF8PROC_CATEGORY_ME ||
           k == UTF8PROC_CATEGORY_PC;
}

static uint32_t last_cp(const uint8_t *s, size_t end) {
    size_t i = end;
    while (i > 0 && (s[i - 1] & 0xc0) == 0x80) i--;
    if (i == 0) return 0;
    uint32_t cp;
    utf8_next(s, end, i - 1, &cp);
    return cp;
}

/* split text by the added tokens of trie `tr`; non-token pieces go to `piece` */
typedef ma_status (*piece_fn)(const ma_tokenizer *t, const uint8_t *p, size_t len, idvec *out, ma_error *err);

static ma_status split_added(const ma_tokenizer *t, const trie *tr, const uint8_t *s, size_t len, piece_fn piece, idvec *out,
                             ma_error *err) {
    size_t start = 0, i = 0;
    ma_status st = MA_OK;
    while (i < len && !st) {
        size_t end = 0;
        int32_t k = tr->nodes > 1 ? trie_longest(tr, s, len, i, &end) : -1;
        if (k < 0) {
            i++;
            continue;
        }
        const added_tok *a = &t->added[k];
        size_t ms = i, me = end;
        if (a->single_word) {
            uint32_t before = ms > 0 ? last_cp(s, ms) : 0, after = 0;
            if (me < len) utf8_next(s, len, me, &after);
            if ((ms > 0 && is_word(before)) || (me < len && is_word(after))) {
                i++;
                continue;
            }
        }
        if (a->lstrip)
            while (ms > start) {
                size_t b = ms - 1;
                while (b > start && (s[b] & 0xc0) == 0x80) b--;
                uint32_t cp;
                utf8_next(s, len, b, &cp);
                if (!is_space(cp)) break;
                ms = b;
            }
        if (a->rstrip)
            while (me < len) {
                uint32_t cp;
                int l = utf8_next(s, len, me, &cp);
                if (!is_space(cp)) break;
                me += (size_t)l;
            }
        if (ms > start) st = piece(t, s + start, ms - start, out, err);
        if (!st && !push(out, a->id)) st = ma_fail(err, MA_ERR_NOMEM, "tokenizer: out of memory");
        start = i = me;
    }
    if (!st && start < len) st = piece(t, s + start, len - start, out, err);
    return st;
}

static ma_status normalized_piece(const ma_tokenizer *t, const uint8_t *p, size_t len, idvec *out, ma_error *err) {
    uint8_t *n = NULL;
    size_t nl = 0;
    ma_status s = normalise(t, p, len, &n, &nl, err);
    if (s) return s;
    s = split_added(t, &t->normed, n, nl, encode_piece, out, err);
    free(n);
    return s;
}

ma_status ma_tokenizer_encode(const ma_tokenizer *t, const char *text, size_t len, int64_t **ids, size_t *n, ma_error *err) {
    *ids = NULL;
    *n = 0;
    size_t bad = ma_utf8_valid_prefix((const uint8_t *)text, len);
    if (bad != len) return ma_fail(err, MA_ERR_FORMAT, "text is not valid UTF-8 (byte %zu)", bad);
    idvec out = {0};
    ma_status s = split_added(t, &t->raw, (const uint8_t *)text, len, normalized_piece, &out, err);
    if (s) {
        free(out.v);
        return s;
    }
    *ids = out.v ? out.v : malloc(sizeof(int64_t));
    *n = out.n;
    return MA_OK;
}

/* ------------------------------------------------------------------------------ decoding */

ma_status ma_tokenizer_decode(const ma_tokenizer *t, const int64_t *ids, size_t n, char **text, size_t *len, ma_error *err) {
    *text = NULL;
    size_t cap = 64, bl = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (size_t)ids[i] >= t->n_ids || !t->id_to_token[ids[i]])
            return ma_fail(err, MA_ERR_RANGE, "token id %lld is not in the vocabulary", (long long)ids[i]);
        cap += strlen(t->id_to_token[ids[i]]);
    }
    uint8_t *bytes = malloc(cap);
    if (!bytes) return ma_fail(err, MA_ERR_NOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i < n; i++) {
        const uint8_t *tok = (const uint8_t *)t->id_to_token[ids[i]];
        size_t tl = strlen((const char *)tok), start = bl;
        int all = 1;
        for (size_t k = 0; k < tl && all;) {
            uint32_t cp;
            k += (size_t)utf8_next(tok, tl, k, &cp);
            if (cp < 512 && t->sym_to_byte[cp] >= 0) bytes[bl++] = (uint8_t)t->sym_to_byte[cp];
            else all = 0;
        }
        if (!all) { /* not byte-level symbols: the token's own UTF-8 */
            bl = start;
            memcpy(bytes + bl, tok, tl);
            bl += tl;
        }
    }
    /* String::from_utf8_lossy: each maximal invalid subpart becomes U+FFFD */
    uint8_t *o = malloc(bl * 3 + 1);
    if (!o) {
        free(bytes);
        return ma_fail(err, MA_ERR_NOMEM, "tokenizer: out of memory");
    }
    size_t ol = 0;
    for (size_t i = 0; i < bl;) {
        size_t k = ma_utf8_seq(bytes + i, bl - i);
        if (k) {
            memcpy(o + ol, bytes + i, k);
            ol += k;
            i += k;
            continue;
        }
        /* length of the maximal prefix of a valid sequence starting here (at least 1) */
        size_t m = 1;
        uint8_t c = bytes[i];
        size_t need = (c >= 0xc2 && c <= 0xdf) ? 2 : (c >= 0xe0 && c <= 0xef) ? 3 : (c >= 0xf0 && c <= 0xf4) ? 4 : 1;
        if (need > 1) {
            uint8_t lo = 0x80, hi = 0xbf;
            if (c == 0xe0) lo = 0xa0;
            if (c == 0xed) hi = 0x9f;
            if (c == 0xf0) lo = 0x90;
            if (c == 0xf4) hi = 0x8f;
            if (i + 1 < bl && bytes[i + 1] >= lo && bytes[i + 1] <= hi) {
                m = 2;
                while (m < need && i + m < bl && (bytes[i + m] & 0xc0) == 0x80) m++;
            }
        }
        o[ol++] = 0xef;
        o[ol++] = 0xbf;
        o[ol++] = 0xbd;
        i += m;
    }
    o[ol] = '\0';
    free(bytes);
    *text = (char *)o;
    if (len) *len = ol;
    return MA_OK;
}
