/* SPDX-License-Identifier: Apache-2.0 */
/* The command line as data: every option once (its name, value, range and help), every command
 * with the options it takes, and from those one parser (--opt value, --opt=value, -o value, `--`
 * before paths that begin with '-'), each command's --help, `molmoact help`, and the README's
 * command list and environment table (`molmoact help --markdown`, checked by the tests). */
#ifndef MA_CLI_H
#define MA_CLI_H

#include <stdio.h>

typedef enum { CLI_FLAG, CLI_STR, CLI_INT, CLI_U64, CLI_REAL, CLI_LIST } cli_kind;

typedef struct cli_opt {
    const char *name;  /* "--model" */
    const char *alias; /* another spelling ("-o"), or NULL */
    const char *meta;  /* the value's name in the help ("DIR"); NULL for a flag */
    cli_kind kind;
    double lo, hi; /* CLI_INT, CLI_U64, CLI_REAL: the accepted range */
    const char *help;
} cli_opt;

/* an option as a command uses it: its meta and help may differ from the option's own */
typedef struct cli_use {
    int id;
    const char *meta, *help;
} cli_use;

#define CLI_MAX_USES 64
#define CLI_MAX_OPTS 96 /* option ids */
#define CLI_MAX_LIST 16
#define CLI_MAX_POS 4

struct cli_args;

typedef struct cli_cmd {
    const char *name;
    const char *synopsis;       /* what follows `molmoact NAME` in the usage line */
    const char *summary;        /* one line */
    const char *details;        /* paragraphs after the usage, or NULL */
    int pos_min, pos_max;       /* positional arguments */
    const char *env;            /* which environment variables it reads: words matched against ma_env_var.who */
    cli_use uses[CLI_MAX_USES]; /* ends with id 0 (option ids start at 1) */
    int (*run)(struct cli_args *a);
} cli_cmd;

typedef struct cli_args {
    const cli_cmd *cmd;
    int given[CLI_MAX_OPTS];
    const char *str[CLI_MAX_OPTS]; /* the value as given (CLI_STR, and the text of every valued option) */
    long long i[CLI_MAX_OPTS];
    unsigned long long u[CLI_MAX_OPTS];
    double r[CLI_MAX_OPTS];
    const char *list[CLI_MAX_OPTS][CLI_MAX_LIST];
    int nlist[CLI_MAX_OPTS];
    const char *pos[CLI_MAX_POS];
    int npos;
} cli_args;

/* parse argv[first..] for cmd: 0, or 1 with one line on stderr (an unknown option gets the nearest
 * one), or 2 when --help / -h was given (its help printed on stdout) */
int cli_parse(const cli_opt *opts, int n_opts, const cli_cmd *cmd, int argc, char **argv, int first, cli_args *a);

/* the nearest of names (edit distance at most 2 or a prefix), NULL when none is near */
const char *cli_nearest(const char *word, const char *const *names, int n);

/* all: the qnn backend's options and variables too (--help-all); the short help names how many */
void cli_print_command_help(FILE *f, const cli_opt *opts, const cli_cmd *cmd, int all);
void cli_print_overview(FILE *f, const cli_cmd *cmds, int n_cmds);
void cli_print_env(FILE *f, const char *who);
/* the README's blocks: the command list and the environment table */
/* common: the option group printed once below the table (omitted from rows that take all of it) */
void cli_print_markdown(FILE *f, const cli_opt *opts, const cli_cmd *cmds, int n_cmds, const int *common, int n_common);

#endif
