/* SPDX-License-Identifier: Apache-2.0 */
/* molmoact parity: every session on its golden inputs, the parity table. */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>

#include "commands.h"
#include "options.h"
#include "runtime/parity.h"

static int cmd_parity(opts *o) {
    if (!o->model || !o->golden) {
        fprintf(stderr, "molmoact: parity needs --model DIR and --golden DIR\n");
        return 1;
    }
    ma_error err = {0};
    ma_model m;
    if (ma_model_open_with(o->model, o->norm_tag, MA_PART_ALL, &SET, &m, &err)) return fail(&err);
    ma_parity_report rep;
    int rc, e2e;
    double gate = ma_parity_default_gate(&m, &e2e);
    if (o->gate > 0) gate = o->gate;
    if ((e2e ? ma_parity_run_e2e : ma_parity_run)(settings_backend(), &m, o->golden, gate, &rep, &err)) rc = fail(&err);
    else {
        ma_parity_print(&rep, stdout, o->json);
        rc = rep.pass ? 0 : 2;
    }
    ma_parity_free(&rep);
    ma_model_close(&m);
    return rc;
}

int cmd_parity_a(cli_args *a) {
    opts o;
    if (opts_from(a, &o) || session_settings(a)) return 1;
    return cmd_parity(&o);
}
