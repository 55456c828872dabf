/* SPDX-License-Identifier: Apache-2.0 */
/* molmoact help and version. */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "options.h"
#include "kernels/gemm.h"

int cmd_version_a(cli_args *a) {
    (void)a;
    printf("molmoact %s (kernels: %s; %s)\n", molmoact_version(), ma_gemm_kernels(), "Apache-2.0");
    return 0;
}

int cmd_help_a(cli_args *a) {
    if (a->given[O_MARKDOWN]) {
        cli_print_markdown(stdout, OPTS, CMDS, N_CMDS, SESSION_OPTS, N_SESSION_OPTS);
        return 0;
    }
    if (!a->npos) {
        cli_print_overview(stdout, CMDS, N_CMDS);
        return 0;
    }
    if (!strcmp(a->pos[0], "env") || !strcmp(a->pos[0], "environment")) {
        printf("environment variables (molmoact help COMMAND shows those a command reads):\n");
        cli_print_env(stdout, NULL);
        return 0;
    }
    const cli_cmd *c = find_cmd(a->pos[0]);
    if (!c) return unknown_command(a->pos[0]);
    if (a->npos > 1 && strcmp(a->pos[1], "all")) {
        fprintf(stderr, "molmoact help %s %s: the second word may only be all (molmoact help %s all)\n", a->pos[0], a->pos[1], a->pos[0]);
        return 1;
    }
    cli_print_command_help(stdout, OPTS, c, a->npos > 1 && !strcmp(a->pos[1], "all"));
    return 0;
}
