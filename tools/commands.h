/* SPDX-License-Identifier: Apache-2.0 */
/* The commands of the molmoact program, one file each under tools/ (run.c, bench.c, parity.c,
 * compile.c, inspect.c, tokenize.c, prompt.c, preprocess.c, serve.c, help.c, pull.c): the entry each
 * takes its parsed command line at, named in the command table (tools/options.c). Each returns
 * the program's exit status. */
#ifndef MA_TOOLS_COMMANDS_H
#define MA_TOOLS_COMMANDS_H

#include "common/cli.h"

int cmd_run_a(cli_args *a);
int cmd_bench_a(cli_args *a);
int cmd_parity_a(cli_args *a);
int cmd_compile_a(cli_args *a);
int cmd_inspect_a(cli_args *a);
int cmd_tokenize_a(cli_args *a);
int cmd_prompt_a(cli_args *a);
int cmd_preprocess_a(cli_args *a);
int cmd_serve_a(cli_args *a);
int cmd_help_a(cli_args *a);
int cmd_version_a(cli_args *a);
int cmd_pull_a(cli_args *a);

#endif
