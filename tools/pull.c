/* SPDX-License-Identifier: Apache-2.0 */
/* molmoact pull ORG/NAME[@REV]: a repo of the Hugging Face Hub into its cache (common/hub.h), and
 * for a LeRobot policy the base repo its checkpoint_path names. The snapshot directory is printed
 * on stdout, what happens on stderr. */
#define _POSIX_C_SOURCE 200809L

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "options.h"
#include "core/env.h"
#include "io/mapfile.h"
#include "model/lerobot.h"
#ifdef MA_HAVE_CURL
#include "common/hub.h"
#endif

#ifndef MA_HAVE_CURL
int cmd_pull_a(cli_args *a) {
    (void)a;
    fprintf(stderr,
            "molmoact pull: this build has no libcurl (install libcurl4-openssl-dev and build again; the device build leaves it out)\n");
    return 1;
}
#else

/* the token: --token-file, else HF_TOKEN, else HF_TOKEN_PATH or $HF_HOME/token when the file is
 * there (huggingface_hub's order: constants.py HF_TOKEN_PATH, utils/_auth.py). Never printed. */
static int read_token(const cli_args *a, char *tok, size_t cap) {
    tok[0] = '\0';
    const char *file = a->given[O_TOKEN_FILE] ? a->str[O_TOKEN_FILE] : NULL, *env = ma_env_get("HF_TOKEN");
    char dflt[4096];
    const char *from = "--token-file";
    if (!file && env && *env) {
        snprintf(tok, cap, "%s", env);
        for (size_t n = strlen(tok); n && (tok[n - 1] == '\n' || tok[n - 1] == '\r' || tok[n - 1] == ' ');) tok[--n] = '\0';
        from = "HF_TOKEN";
    } else if (!file) {
        const char *tp = ma_env_get("HF_TOKEN_PATH");
        char home[4000];
        if (tp && *tp) snprintf(dflt, sizeof dflt, "%s", tp);
        else if (ma_env_hf_home(home, sizeof home)) snprintf(dflt, sizeof dflt, "%s/token", home);
        else return 0;
        if (access(dflt, R_OK)) return 0;
        file = dflt;
        from = dflt;
    }
    if (file) {
        ma_error err = {0};
        char *text = NULL;
        size_t len = 0;
        if (ma_read_file(file, 4096, &text, &len, &err)) {
            fprintf(stderr, "molmoact pull: the token: %s\n", err.msg);
            return -1;
        }
        while (len && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' ' || text[len - 1] == '\t')) text[--len] = '\0';
        snprintf(tok, cap, "%s", text);
        memset(text, 0, len);
        free(text);
    }
    const size_t n = strlen(tok);
    int ok = n > 0 && n < cap - 1;
    for (size_t i = 0; i < n && ok; i++) ok = tok[i] > 0x20 && tok[i] < 0x7f; /* no space or line break: it goes in a header */
    if (!ok) {
        memset(tok, 0, cap);
        fprintf(stderr, "molmoact pull: the token from %s is not one word of printable ASCII (1 to %zu characters)\n", from, cap - 2);
        return -1;
    }
    return 0;
}

/* a LeRobot policy's base repo (checkpoint_path, checkpoint_revision), when it names one */
static int lerobot_base(const char *snapshot, char *repo, size_t rcap, char *rev, size_t vcap) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", snapshot);
    if (!ma_is_lerobot_dir(snapshot)) return 0;
    char *text = NULL;
    size_t len = 0;
    ma_error err = {0};
    if (ma_read_file(path, 1 << 20, &text, &len, &err)) return 0;
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *cp = cJSON_GetObjectItemCaseSensitive(j, "checkpoint_path"),
                *cr = cJSON_GetObjectItemCaseSensitive(j, "checkpoint_revision");
    int found = 0;
    if (cJSON_IsString(cp) && strlen(cp->valuestring) < rcap) {
        snprintf(repo, rcap, "%s", cp->valuestring);
        snprintf(rev, vcap, "%s", cJSON_IsString(cr) && strlen(cr->valuestring) < vcap ? cr->valuestring : "");
        found = 1;
    }
    cJSON_Delete(j);
    return found;
}

int cmd_pull_a(cli_args *a) {
    ma_error err = {0};
    if (ma_settings_from_env(&SET, &err)) {
        fprintf(stderr, "molmoact pull: %s\n", err.msg);
        return 1;
    }
    char repo[300], rev[256] = "", endpoint[4096], tok[1100];
    snprintf(repo, sizeof repo, "%s", a->pos[0]);
    char *at = strchr(repo, '@');
    if (at) {
        *at = '\0';
        snprintf(rev, sizeof rev, "%s", at + 1);
        if (a->given[O_REVISION] && strcmp(rev, a->str[O_REVISION])) {
            fprintf(stderr, "molmoact pull: %s names revision %s, --revision %s another\n", a->pos[0], rev, a->str[O_REVISION]);
            return 1;
        }
    }
    if (a->given[O_REVISION]) snprintf(rev, sizeof rev, "%s", a->str[O_REVISION]);
    snprintf(endpoint, sizeof endpoint, "%s",
             a->given[O_ENDPOINT] ? a->str[O_ENDPOINT]
             : SET.hf_endpoint[0] ? SET.hf_endpoint
                                  : "https://huggingface.co");
    for (size_t n = strlen(endpoint); n && endpoint[n - 1] == '/';) endpoint[--n] = '\0';
    if (read_token(a, tok, sizeof tok)) return 1;
    ma_pull_opts o = {0};
    o.repo = repo;
    o.revision = rev;
    o.endpoint = endpoint;
    o.cache = a->given[O_CACHE_DIR] ? a->str[O_CACHE_DIR] : SET.hub_cache;
    o.token = tok;
    o.include = a->list[O_INCLUDE];
    o.n_include = a->nlist[O_INCLUDE];
    o.retries = a->given[O_RETRIES] ? (int)a->i[O_RETRIES] : 5;
    o.min_free_mb = a->given[O_MIN_FREE_MB] ? a->r[O_MIN_FREE_MB] : 100;
    o.quiet = a->given[O_QUIET];
    o.tty = isatty(2);
    char snap[4200];
    ma_status s = ma_hub_pull(&o, snap, sizeof snap, &err);
    if (s) {
        memset(tok, 0, sizeof tok);
        fprintf(stderr, "molmoact pull: %s\n", err.msg);
        return 1;
    }
    char base[300], base_rev[256];
    if (!a->given[O_NO_BASE] && lerobot_base(snap, base, sizeof base, base_rev, sizeof base_rev)) {
        const char *why = ma_repo_id_problem(base);
        if (why || !strchr(base, '/')) {
            if (!o.quiet)
                fprintf(
                    stderr,
                    "pull: a LeRobot policy whose checkpoint_path \"%.200s\" is not a Hub repo id: give its base with --base DIR when you run it\n",
                    base);
        } else {
            static const char *const need[] = {"config.json", "tokenizer*", "processor_config.json", "norm_stats.json"};
            ma_pull_opts b = o;
            b.repo = base;
            b.revision = base_rev;
            b.include = need;
            b.n_include = 4;
            char bsnap[4200];
            if (!o.quiet) fprintf(stderr, "pull: a LeRobot policy: its base %s (checkpoint_path) too\n", base);
            if (ma_hub_pull(&b, bsnap, sizeof bsnap, &err)) {
                memset(tok, 0, sizeof tok);
                fprintf(stderr, "molmoact pull: the policy is in %s, but its base %s: %s\n", snap, base, err.msg);
                return 1;
            }
            if (!o.quiet) fprintf(stderr, "pull: the base is in %s (found there by run, compile and serve)\n", bsnap);
        }
    }
    memset(tok, 0, sizeof tok);
    printf("%s\n", snap);
    return 0;
}
#endif
