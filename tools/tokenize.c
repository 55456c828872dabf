/* SPDX-License-Identifier: Apache-2.0 */
/* molmoact tokenize: text to ids and back, one JSON line each. */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "commands.h"
#include "options.h"
#include "io/jsonline.h"
#include "model/tokenizer.h"

static int cmd_tokenize(const char *path, int decode) {
    ma_error err = {0};
    ma_tokenizer *tok;
    if (ma_tokenizer_load(path, &tok, &err)) return fail(&err);
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    int rc = 0;
    long lineno = 0;
    while ((got = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        size_t len = (size_t)got;
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
        if (!len) continue;
        if (!decode) {
            char *text = NULL;
            size_t tl;
            int64_t *ids;
            size_t n;
            if (ma_json_parse_string(line, len, &text, &tl, &err) || ma_tokenizer_encode(tok, text, tl, &ids, &n, &err)) {
                fprintf(stderr, "molmoact: tokenize: line %ld: %s\n", lineno, err.msg);
                printf("null\n");
                free(text);
                text = NULL;
                rc = 1;
                if (err.code != MA_ERR_NOMEM) {
                    memset(&err, 0, sizeof err);
                    continue;
                }
                break;
            }
            printf("[");
            for (size_t i = 0; i < n; i++) printf(i ? ",%lld" : "%lld", (long long)ids[i]);
            printf("]\n");
            free(ids);
            free(text);
        } else {
            int64_t *ids = NULL;
            size_t n;
            char *text;
            size_t tl;
            if (ma_json_parse_int_array(line, len, &ids, &n, &err) || ma_tokenizer_decode(tok, ids, n, &text, &tl, &err)) {
                fprintf(stderr, "molmoact: tokenize --decode: line %ld: %s\n", lineno, err.msg);
                printf("null\n");
                free(ids);
                rc = 1;
                continue;
            }
            ma_json_write_string(stdout, text, tl);
            printf("\n");
            free(ids);
            free(text);
        }
    }
    free(line);
    ma_tokenizer_free(tok);
    return rc;
}

int cmd_tokenize_a(cli_args *a) {
    if (!a->str[O_TOKENIZER]) {
        fprintf(stderr, "molmoact tokenize: give the tokenizer with --tokenizer FILE\n");
        return 1;
    }
    return cmd_tokenize(a->str[O_TOKENIZER], a->given[O_DECODE]);
}
