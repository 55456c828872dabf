/* SPDX-License-Identifier: Apache-2.0 */
/* molmoact: MolmoAct2-LIBERO inference from the command line.
 *
 * Commands: run (resident sessions, or --inproc), bench, parity, compile, inspect, tokenize,
 * prompt, preprocess, serve; `molmoact help` lists them and their options. `__worker` is the
 * resident worker process.
 *
 * Each command is a file of tools/ (commands.h), its options in the table of tools/options.c;
 * what several share is the static library molmoact_common (src/common/).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "options.h"
#include "core/error.h"
#include "runtime/resident.h"

int main(int argc, char **argv) {
    if (argc < 2) {
        cli_print_overview(stderr, CMDS, N_CMDS);
        return 1;
    }
    const char *name = argv[1];
    if (!strcmp(name, "__worker")) { /* a resident worker process, started by the orchestrator */
        if (argc != 7) {
            fprintf(stderr, "molmoact: __worker is started by molmoact run, not by hand\n");
            return 2;
        }
        /* its settings come in its start message; its environment (a qnn worker's LD_LIBRARY_PATH
         * and ADSP_LIBRARY_PATH) was set by the orchestrator at its exec */
        return ma_worker_main(atoi(argv[2]), ma_backend_find, argv[3], argv[4], (unsigned)strtoul(argv[5], NULL, 10), atoi(argv[6]));
    }
    if (!strcmp(name, "--help") || !strcmp(name, "-h")) {
        cli_print_overview(stdout, CMDS, N_CMDS);
        return 0;
    }
    if (!strcmp(name, "--version") || !strcmp(name, "-V")) return cmd_version_a(NULL);
    const cli_cmd *c = find_cmd(name);
    if (!c) return unknown_command(name);
    ma_keep_freed_memory();
    cli_args *a = calloc(1, sizeof *a);
    if (!a) return 1;
    int rc = cli_parse(OPTS, O_COUNT, c, argc, argv, 2, a);
    if (rc == 2) rc = 0; /* --help */
    else if (rc == 0) rc = c->run(a);
    free(a);
    return rc;
}
