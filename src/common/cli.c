/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/env.h"

static int edit_distance(const char *a, const char *b) {
    const size_t la = strlen(a), lb = strlen(b);
    if (la > 62 || lb > 62) return 99;
    int prev[64], cur[64];
    for (size_t j = 0; j <= lb; j++) prev[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int best = prev[j - 1] + (a[i - 1] != b[j - 1]);
            if (prev[j] + 1 < best) best = prev[j] + 1;
            if (cur[j - 1] + 1 < best) best = cur[j - 1] + 1;
            /* a transposition counts one */
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && prev[j - 2] + 1 < best) best = prev[j - 2] + 1;
            cur[j] = best;
        }
        memcpy(prev, cur, sizeof(int) * (lb + 1));
    }
    return prev[lb];
}

const char *cli_nearest(const char *word, const char *const *names, int n) {
    const char *best = NULL;
    int bd = 3;
    const size_t wl = strlen(word);
    for (int i = 0; i < n; i++) {
        if (!names[i]) continue;
        int d = edit_distance(word, names[i]);
        if (wl >= 3 && !strncmp(names[i], word, wl)) d = d < 1 ? d : 1; /* a prefix */
        if (d < bd) {
            bd = d;
            best = names[i];
        }
    }
    return best;
}

static const cli_use *find_use(const cli_opt *opts, const cli_cmd *cmd, const char *name, size_t len) {
    for (int k = 0; k < CLI_MAX_USES && cmd->uses[k].id > 0; k++) {
        const cli_opt *o = &opts[cmd->uses[k].id];
        if ((strlen(o->name) == len && !strncmp(o->name, name, len)) ||
            (o->alias && strlen(o->alias) == len && !strncmp(o->alias, name, len)))
            return &cmd->uses[k];
    }
    return NULL;
}

static int bad(const cli_cmd *cmd, const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "molmoact %s: ", cmd->name);
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    return 1;
}

static int set_value(const cli_opt *o, int id, const char *v, const cli_cmd *cmd, cli_args *a) {
    char *end;
    errno = 0;
    char range[96];
    switch (o->kind) {
    case CLI_STR: a->str[id] = v; return 0;
    case CLI_LIST:
        if (a->nlist[id] == CLI_MAX_LIST) return bad(cmd, "%s: at most 16 times%s", o->name, "");
        a->list[id][a->nlist[id]++] = v;
        a->str[id] = v;
        return 0;
    case CLI_INT: {
        long long x = strtoll(v, &end, 10);
        snprintf(range, sizeof range, "must be an integer in [%.0f, %.0f]", o->lo, o->hi);
        /* plain decimal only: strtoll alone takes " 2" and "+1" */
        if (!ma_plain_decimal(v, 0) || *end || errno || (double)x < o->lo || (double)x > o->hi) {
            fprintf(stderr, "molmoact %s: %s %s: %s\n", cmd->name, o->name, v, range);
            return 1;
        }
        a->i[id] = x;
        a->str[id] = v;
        return 0;
    }
    case CLI_U64: {
        unsigned long long x = strtoull(v, &end, 10);
        /* digits only: strtoull takes " -1" as 2^64 - 1 */
        if (!ma_plain_decimal(v, 0) || v[0] == '-' || *end || errno || (o->hi > 0 && (double)x > o->hi)) {
            fprintf(stderr, "molmoact %s: %s %s: must be a non-negative integer", cmd->name, o->name, v);
            if (o->hi > 0) fprintf(stderr, " up to %.0f", o->hi);
            fprintf(stderr, "\n");
            return 1;
        }
        a->u[id] = x;
        a->str[id] = v;
        return 0;
    }
    case CLI_REAL: {
        double x = strtod(v, &end);
        /* plain decimal only: strtod takes " 2", "+1", "0x1p-3" and "infinity" */
        if (!ma_plain_decimal(v, 1) || *end || errno || !isfinite(x) || x < o->lo || x > o->hi) {
            fprintf(stderr, "molmoact %s: %s %s: must be a number in [%g, %g]\n", cmd->name, o->name, v, o->lo, o->hi);
            return 1;
        }
        a->r[id] = x;
        a->str[id] = v;
        return 0;
    }
    case CLI_FLAG: break;
    }
    return 1;
}

int cli_parse(const cli_opt *opts, int n_opts, const cli_cmd *cmd, int argc, char **argv, int first, cli_args *a) {
    (void)n_opts;
    memset(a, 0, sizeof *a);
    a->cmd = cmd;
    int only_pos = 0;
    for (int i = first; i < argc; i++) {
        const char *arg = argv[i];
        if (!only_pos && (!strcmp(arg, "--help") || !strcmp(arg, "-h") || !strcmp(arg, "--help-all"))) {
            cli_print_command_help(stdout, opts, cmd, !strcmp(arg, "--help-all"));
            return 2;
        }
        if (!only_pos && !strcmp(arg, "--")) {
            only_pos = 1;
            continue;
        }
        if (only_pos || arg[0] != '-' || !arg[1]) {
            if (a->npos == cmd->pos_max || a->npos == CLI_MAX_POS) {
                if (cmd->pos_max == 0)
                    return bad(cmd, "unexpected argument %s (options begin with --; `molmoact help %s`)", arg, cmd->name);
                return bad(cmd, "unexpected argument %s (`molmoact help %s`)", arg, cmd->name);
            }
            a->pos[a->npos++] = arg;
            continue;
        }
        const char *eq = strncmp(arg, "--", 2) ? NULL : strchr(arg, '=');
        const size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        const cli_use *u = find_use(opts, cmd, arg, len);
        if (!u) {
            const char *names[CLI_MAX_USES];
            int n = 0;
            for (int k = 0; k < CLI_MAX_USES && cmd->uses[k].id > 0; k++) names[n++] = opts[cmd->uses[k].id].name;
            char word[64];
            snprintf(word, sizeof word, "%.*s", (int)(len < 63 ? len : 63), arg);
            const char *near = cli_nearest(word, names, n);
            if (near)
                fprintf(stderr, "molmoact %s: unknown option %s (did you mean %s? `molmoact help %s` lists the options)\n", cmd->name, word,
                        near, cmd->name);
            else fprintf(stderr, "molmoact %s: unknown option %s (`molmoact help %s` lists the options)\n", cmd->name, word, cmd->name);
            return 1;
        }
        const int id = u->id;
        const cli_opt *o = &opts[id];
        if (a->given[id] && o->kind != CLI_LIST) return bad(cmd, "%s is given twice%s", o->name, "");
        a->given[id]++;
        if (o->kind == CLI_FLAG) {
            if (eq) return bad(cmd, "%s takes no value (given %s)", o->name, arg);
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) {
            fprintf(stderr, "molmoact %s: %s needs a value (%s)\n", cmd->name, o->name, u->meta ? u->meta : o->meta);
            return 1;
        }
        if (set_value(o, id, v, cmd, a)) return 1;
    }
    if (a->npos < cmd->pos_min) {
        fprintf(stderr, "molmoact %s: usage: molmoact %s %s (`molmoact help %s`)\n", cmd->name, cmd->name, cmd->synopsis, cmd->name);
        return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------- help */

static void wrap(FILE *f, const char *text, int indent, int first_col, int width) {
    int col = first_col;
    const char *p = text;
    while (*p) {
        if (*p == '\n') {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
            p++;
            continue;
        }
        const char *w = p;
        while (*p && *p != ' ' && *p != '\n') p++;
        const int wl = (int)(p - w);
        if (col > indent && col + 1 + wl > width) {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
        } else if (col > indent) {
            fputc(' ', f);
            col++;
        }
        fprintf(f, "%.*s", wl, w);
        col += wl;
        while (*p == ' ') p++;
    }
}

static int env_applies(const ma_env_var *e, const char *who) {
    if (!who || !*who) return 0;
    /* who is a list of words; e->who too: any word in common */
    char buf[128];
    snprintf(buf, sizeof buf, "%s", who);
    for (char *save = NULL, *w = strtok_r(buf, ", ", &save); w; w = strtok_r(NULL, ", ", &save)) {
        const size_t wl = strlen(w);
        for (const char *p = e->who; (p = strstr(p, w)); p += wl)
            if ((p == e->who || p[-1] == ' ' || p[-1] == ',' || p[-1] == '(') && (!p[wl] || p[wl] == ',' || p[wl] == ' ' || p[wl] == ')'))
                return 1;
    }
    return 0;
}

/* the qnn backend's options and variables: in a command's short help only with --help-all */
static int qnn_only(const char *name) {
    return !strncmp(name, "--qnn-", 6) || strstr(name, "QNN") != NULL || strstr(name, "DSP_LIBRARY_PATH") != NULL;
}

static void print_env(FILE *f, const char *who, int all) {
    for (int i = 0; i < MA_ENV_COUNT; i++) {
        const ma_env_var *e = &MA_ENV_VARS[i];
        if (!e->name || (who && !env_applies(e, who)) || (!all && qnn_only(e->name))) continue;
        char head[96];
        snprintf(head, sizeof head, "  %s=%s", e->name, e->value);
        fprintf(f, "%s", head);
        int col = (int)strlen(head);
        if (col >= 34) {
            fprintf(f, "\n%*s", 34, "");
            col = 34;
        } else {
            fprintf(f, "%*s", 34 - col, "");
            col = 34;
        }
        char text[512];
        if (e->alias) snprintf(text, sizeof text, "%s (also read as %s)", e->help, e->alias);
        else snprintf(text, sizeof text, "%s", e->help);
        wrap(f, text, 34, col, 100);
        fprintf(f, "\n");
    }
}

void cli_print_env(FILE *f, const char *who) { print_env(f, who, 1); }

void cli_print_command_help(FILE *f, const cli_opt *opts, const cli_cmd *cmd, int all) {
    int hidden = 0; /* what the short help leaves to --help-all */
    fprintf(f, "usage: molmoact %s %s\n\n", cmd->name, cmd->synopsis);
    wrap(f, cmd->summary, 0, 0, 100);
    fprintf(f, "\n");
    if (cmd->details) {
        fprintf(f, "\n");
        wrap(f, cmd->details, 0, 0, 100);
        fprintf(f, "\n");
    }
    if (cmd->uses[0].id > 0) fprintf(f, "\noptions:\n");
    for (int k = 0; k < CLI_MAX_USES && cmd->uses[k].id > 0; k++) {
        const cli_use *u = &cmd->uses[k];
        const cli_opt *o = &opts[u->id];
        if (!all && qnn_only(o->name)) {
            hidden++;
            continue;
        }
        const char *meta = u->meta ? u->meta : o->meta;
        char head[96];
        if (o->alias) snprintf(head, sizeof head, "  %s, %s%s%s", o->alias, o->name, meta ? " " : "", meta ? meta : "");
        else snprintf(head, sizeof head, "  %s%s%s", o->name, meta ? " " : "", meta ? meta : "");
        fprintf(f, "%s", head);
        int col = (int)strlen(head);
        if (col >= 30) {
            fprintf(f, "\n%*s", 30, "");
            col = 30;
        } else {
            fprintf(f, "%*s", 30 - col, "");
            col = 30;
        }
        wrap(f, u->help ? u->help : o->help, 30, col, 100);
        fprintf(f, "\n");
    }
    fprintf(f, "  -h, --help                  this help\n");
    int any = 0;
    for (int i = 0; i < MA_ENV_COUNT; i++) {
        const ma_env_var *e = &MA_ENV_VARS[i];
        if (!e->name || !env_applies(e, cmd->env)) continue;
        if (!all && qnn_only(e->name)) hidden++;
        else any = 1;
    }
    if (!all && (any || hidden))
        fprintf(f, "  --help-all                  this help with what each variable does%s\n",
                hidden ? " and the qnn backend's options" : "");
    if (!any) return;
    fprintf(f, "\nenvironment:\n");
    if (all) {
        print_env(f, cmd->env, 1);
        return;
    }
    /* the short help names the variables (what each does: --help-all, or molmoact help env) */
    char line[4096];
    size_t n = 0;
    line[0] = '\0';
    for (int i = 0; i < MA_ENV_COUNT && n < sizeof line - 128; i++) {
        const ma_env_var *e = &MA_ENV_VARS[i];
        if (!e->name || !env_applies(e, cmd->env) || qnn_only(e->name)) continue;
        n += (size_t)snprintf(line + n, sizeof line - n, "%s%s", n ? ", " : "", e->name);
        if (e->alias) n += (size_t)snprintf(line + n, sizeof line - n, " (or %s)", e->alias);
    }
    fprintf(f, "  ");
    wrap(f, line, 2, 2, 100);
    fprintf(f, "\n");
}

void cli_print_overview(FILE *f, const cli_cmd *cmds, int n_cmds) {
    fprintf(f, "usage: molmoact <command> [options]     (molmoact help <command>, molmoact <command> --help)\n\ncommands:\n");
    for (int i = 0; i < n_cmds; i++) {
        fprintf(f, "  %-11s", cmds[i].name);
        wrap(f, cmds[i].summary, 13, 13, 100);
        fprintf(f, "\n");
    }
    fprintf(f, "\n  molmoact help env      the environment variables\n  molmoact --version     the version\n");
}

/* a markdown table cell: '|' escaped */
static void md(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '|') fputc('\\', f);
        fputc(*s, f);
    }
}

static int uses_all(const cli_cmd *c, const int *ids, int n) {
    for (int i = 0; i < n; i++) {
        int found = 0;
        for (int k = 0; k < CLI_MAX_USES && c->uses[k].id > 0; k++) found |= c->uses[k].id == ids[i];
        if (!found) return 0;
    }
    return n > 0;
}

void cli_print_markdown(FILE *f, const cli_opt *opts, const cli_cmd *cmds, int n_cmds, const int *common, int n_common) {
    fprintf(f, "<!-- commands: generated by `molmoact help --markdown`; the tests check it is current -->\n");
    fprintf(f, "| command | what it does | options |\n|---|---|---|\n");
    for (int i = 0; i < n_cmds; i++) {
        const int group = uses_all(&cmds[i], common, n_common);
        fprintf(f, "| `molmoact %s", cmds[i].name);
        if (cmds[i].synopsis[0]) {
            fputc(' ', f);
            md(f, cmds[i].synopsis);
        }
        fprintf(f, "` | ");
        md(f, cmds[i].summary);
        fprintf(f, " | ");
        int first = 1;
        for (int k = 0; k < CLI_MAX_USES && cmds[i].uses[k].id > 0; k++) {
            int in_group = 0;
            for (int g = 0; g < n_common && group; g++) in_group |= common[g] == cmds[i].uses[k].id;
            if (in_group) continue;
            const cli_opt *o = &opts[cmds[i].uses[k].id];
            const char *meta = cmds[i].uses[k].meta ? cmds[i].uses[k].meta : o->meta;
            fprintf(f, "%s`%s%s", first ? "" : " ", o->name, meta ? " " : "");
            if (meta) md(f, meta);
            fprintf(f, "`");
            first = 0;
        }
        if (group) fprintf(f, "%sthe session options", first ? "" : " + ");
        fprintf(f, " |\n");
    }
    fprintf(f, "\nThe session options (run, bench, parity, serve):");
    for (int g = 0; g < n_common; g++) {
        const cli_opt *o = &opts[common[g]];
        fprintf(f, "%s `%s%s%s`", g ? "," : "", o->name, o->meta ? " " : "", o->meta ? o->meta : "");
    }
    fprintf(f, ". `molmoact help COMMAND` gives each option's meaning and default.\n");
    fprintf(f, "<!-- end of commands -->\n\n");
    fprintf(f, "<!-- environment: generated by `molmoact help --markdown`; the tests check it is current -->\n");
    fprintf(f, "| variable | also read as | read by | meaning |\n|---|---|---|---|\n");
    for (int i = 0; i < MA_ENV_COUNT; i++) {
        const ma_env_var *e = &MA_ENV_VARS[i];
        if (!e->name) continue;
        fprintf(f, "| `%s=", e->name);
        md(f, e->value);
        fprintf(f, "` | %s%s%s | %s | ", e->alias ? "`" : "", e->alias ? e->alias : "", e->alias ? "`" : "", e->who);
        md(f, e->help);
        fprintf(f, " |\n");
    }
    fprintf(f, "<!-- end of environment -->\n");
}
