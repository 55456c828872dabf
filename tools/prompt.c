/* SPDX-License-Identifier: Apache-2.0 */
/* molmoact prompt: the prompt ids of {"task", "state"} lines. */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include <cjson/cJSON.h>

#include "commands.h"
#include "options.h"
#include "model/checkpoint.h"
#include "model/prompt.h"

static int cmd_prompt(opts *o) {
    if (!o->model) {
        fprintf(stderr, "molmoact: prompt needs --model DIR\n");
        return 1;
    }
    ma_error err = {0};
    ma_model m;
    /* a prompt needs the configuration, the statistics and the tokenizer, not the weights: the
     * embedding part only (as the resident engine's host opens), unmerged LoRA adapters accepted */
    if (ma_model_open_with(o->model, o->norm_tag, MA_PART_EMBED | MA_PART_LORA_OK, &SET, &m, &err)) return fail(&err);
    if (!m.tok) {
        fprintf(stderr, "molmoact: %s has no tokenizer.json\n", o->model);
        ma_model_close(&m);
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    int rc = 0;
    ma_prompt_opts po = {m.tokens_per_image, 2, m.col_tokens, 1};
    while ((got = getline(&line, &cap, stdin)) >= 0) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *task = j ? cJSON_GetObjectItemCaseSensitive(j, "task") : NULL,
                    *state = j ? cJSON_GetObjectItemCaseSensitive(j, "state") : NULL;
        float st[MA_NORM_MAX_DIM];
        int n = 0, ok = cJSON_IsString(task) && cJSON_IsArray(state);
        for (const cJSON *e = ok ? state->child : NULL; e && ok; e = e->next) {
            if (n >= MA_NORM_MAX_DIM) ok = 0;
            else if (cJSON_IsNumber(e)) st[n++] = (float)e->valuedouble;
            else if (cJSON_IsString(e) && !strcmp(e->valuestring, "nan")) st[n++] = NAN;
            else if (cJSON_IsString(e) && !strcmp(e->valuestring, "inf")) st[n++] = INFINITY;
            else if (cJSON_IsString(e) && !strcmp(e->valuestring, "-inf")) st[n++] = -INFINITY;
            else ok = 0;
        }
        ma_prompt p;
        if (!ok) {
            fprintf(stderr, "molmoact: prompt: expected {\"task\": string, \"state\": [numbers]}\n");
            printf("null\n");
            rc = 1;
        } else if (ma_build_prompt(&m.cfg, &m.ns, m.tok, &po, task->valuestring, strlen(task->valuestring), st, n, &p, &err)) {
            fprintf(stderr, "molmoact: prompt: %s\n", err.msg);
            printf("null\n");
            rc = 1;
        } else {
            printf("[");
            for (int64_t i = 0; i < p.n; i++) printf(i ? ",%lld" : "%lld", (long long)p.ids[i]);
            printf("]\n");
            ma_prompt_free(&p);
        }
        cJSON_Delete(j);
    }
    free(line);
    ma_model_close(&m);
    return rc;
}

int cmd_prompt_a(cli_args *a) {
    opts o;
    if (opts_from(a, &o) || session_settings(a)) return 1;
    return cmd_prompt(&o);
}
