/* SPDX-License-Identifier: Apache-2.0 */
/* A driver of server/pickle.h for tests/server/test_pickle_writer.py:
 *     pickle_tool decode FILE          the tree as JSON (tests/fixtures/lerobot_async/make_fixtures.py's form)
 *     pickle_tool write N DIM T0 DT STEP0 OUT       ma_pk_write_actions of N*DIM float32 read from stdin
 *     pickle_tool write-safe N DIM T0 DT STEP0 OUT  ma_pk_write_actions_safe, the same */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/pickle.h"

static void hex(const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) printf("%02x", b[i]);
}

static void str(const char *s, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

static const char *dtname(ma_pk_dtype t) {
    static const char *const names[] = {"u1", "i1", "u2", "i2", "i4", "i8", "f2", "f4", "f8", "b1"};
    return names[t];
}

static void dump(const ma_pk *x) {
    switch (x->kind) {
    case MA_PK_NONE: printf("null"); break;
    case MA_PK_BOOL: printf(x->i ? "true" : "false"); break;
    case MA_PK_INT: printf("{\"int\": \"%" PRId64 "\"}", x->i); break;
    case MA_PK_FLOAT: {
        uint64_t v;
        memcpy(&v, &x->f, 8);
        printf("{\"float\": \"%016" PRIx64 "\"}", v);
        break;
    }
    case MA_PK_STR: printf("{\"str\": "), str(x->s, x->len), putchar('}'); break;
    case MA_PK_BYTES: printf("{\"bytes\": \""), hex(x->s, x->len), printf("\"}"); break;
    case MA_PK_LIST:
    case MA_PK_TUPLE:
        printf("{\"%s\": [", x->kind == MA_PK_LIST ? "list" : "tuple");
        for (size_t i = 0; i < x->n; i++) printf(i ? ", " : ""), dump(x->items[i]);
        printf("]}");
        break;
    case MA_PK_DICT:
        printf("{\"dict\": [");
        for (size_t i = 0; i < x->n; i++) printf(i ? ", [" : "["), dump(x->keys[i]), printf(", "), dump(x->items[i]), putchar(']');
        printf("]}");
        break;
    case MA_PK_OBJECT:
        printf("{\"object\": \"%s\", \"state\": ", x->cls);
        if (x->state) dump(x->state);
        else printf("null");
        putchar('}');
        break;
    case MA_PK_ARRAY:
        printf("{\"array\": \"%s\", \"shape\": [", dtname(x->dtype));
        for (int i = 0; i < x->ndim; i++) printf(i ? ", %" PRId64 : "%" PRId64, x->shape[i]);
        printf("], \"data\": \"");
        hex(x->data, x->nbytes);
        printf("\"}");
        break;
    }
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "decode")) {
        FILE *f = fopen(argv[2], "rb");
        if (!f) return perror(argv[2]), 2;
        static uint8_t buf[1 << 24];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        ma_pk_limits lim = {64u << 20, 32, 1u << 20};
        ma_pk_doc *d;
        ma_error err;
        if (ma_pk_decode(buf, n, &lim, &d, &err) != MA_OK) return printf("error: %s\n", err.msg), 1;
        dump(ma_pk_root(d));
        putchar('\n');
        ma_pk_free(d);
        return 0;
    }
    if (argc == 8 && (!strcmp(argv[1], "write") || !strcmp(argv[1], "write-safe"))) {
        int n = atoi(argv[2]), dim = atoi(argv[3]);
        size_t count = (size_t)n * (size_t)dim;
        float *rows = malloc(count * sizeof(float) + 1);
        if (!rows || fread(rows, sizeof(float), count, stdin) != count) return fprintf(stderr, "pickle_tool: short input\n"), 2;
        size_t len;
        uint8_t *(*w)(const float *, int, int, double, double, int64_t, size_t, size_t *) =
            argv[1][5] ? ma_pk_write_actions_safe : ma_pk_write_actions;
        uint8_t *out = w(rows, n, dim, strtod(argv[4], NULL), strtod(argv[5], NULL), strtoll(argv[6], NULL, 10), (size_t)1 << 30, &len);
        if (!out) return fprintf(stderr, "pickle_tool: the writer failed\n"), 1;
        FILE *f = fopen(argv[7], "wb");
        if (!f || fwrite(out, 1, len, f) != len || fclose(f)) return perror(argv[7]), 2;
        free(out);
        free(rows);
        return 0;
    }
    fprintf(stderr, "usage: pickle_tool decode FILE | write[-safe] N DIM T0 DT STEP0 OUT\n");
    return 2;
}
