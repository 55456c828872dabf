/* SPDX-License-Identifier: Apache-2.0 */
/* molmoact compile: a checkpoint into context directories. */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "options.h"
#include "io/mapfile.h"
#include "kernels/gemm.h"
#include "runtime/compile.h"

/* --compute PLAN: "fp32" / "bf16" / "f16" / "auto" for every component, or COMPONENT=PLAN[,...] (vision,
 * llm, action); a component it names counts as given for --suffix */
/* a plan's name as a string that outlives the command line, or NULL when it is none */
static const char *plan_name(const char *v) {
    static const char *const plans[] = {"fp32", "bf16", "f16", "auto"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(v, plans[i])) return plans[i];
    return NULL;
}

static int parse_compute(const char *v, ma_compile_opts *co) {
    static char buf[128];
    static const char *names[3] = {"vision", "llm", "action"};
    static const unsigned bits[3] = {MA_COMPILE_SUFFIX_VISION, MA_COMPILE_SUFFIX_LLM, MA_COMPILE_SUFFIX_ACTION};
    if (plan_name(v)) {
        for (int c = 0; c < 3; c++) co->compute[c] = plan_name(v);
        return 0;
    }
    if (strlen(v) >= sizeof buf) {
        fprintf(stderr, "molmoact compile: --compute %.40s...: too long\n", v);
        return 1;
    }
    snprintf(buf, sizeof buf, "%s", v);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(t, '=');
        int c = -1;
        if (eq) {
            *eq = '\0';
            for (int i = 0; i < 3; i++)
                if (!strcmp(t, names[i])) c = i;
        }
        if (c < 0 || !plan_name(eq + 1)) {
            fprintf(stderr,
                    "molmoact compile: --compute %s: must be fp32, bf16, f16, auto, or COMPONENT=PLAN[,...] with COMPONENT vision, llm or "
                    "action and PLAN fp32, bf16, f16 or auto\n",
                    v);
            return 1;
        }
        co->compute[c] = plan_name(eq + 1);
        co->suffixed |= bits[c];
    }
    return 0;
}

/* --compute auto: per component, the fastest plan this CPU pays for among those measured to hold
 * their gate at full size (docs/PERFORMANCE.md "Without AMX: the plan this CPU pays for"): bf16
 * products for f16 / bf16 / fp32 weights where a bf16 unit pays (the AMX tiles, or VDPBF16PS
 * where the kernels' own probe timed it at most MA_BF16_DOT_PAYS FMAs); for q8_0 / q4_0 weights
 * only on the AMX tiles (without them the int8 kernels, VNNI or SDOT, are faster than bf16), else
 * fp32. Decided for the CPU that compiles: a context is run where it is compiled, and a CPU
 * without the unit computes a bf16 context in fp32 anyway. Says which and why. */
static void resolve_auto(ma_compile_opts *co) {
    static const char *names[3] = {"vision", "llm", "action"};
    const char *weights[3] = {co->vision, co->llm, co->action};
    const int unit = ma_gemm_bf16() == MA_COMPUTE_BF16;
    const char *uname = ma_gemm_bf16_unit();
    const int amx = unit && !strcmp(uname, "amx");
    char why[160];
    if (amx) snprintf(why, sizeof why, "AMX bf16 tiles");
    else if (unit) snprintf(why, sizeof why, "AVX512-BF16, one VDPBF16PS timed at %.2f FMA", ma_gemm_bf16_dot_measured());
    else ma_gemm_bf16_off_reason(why, sizeof why);
    int any = 0;
    for (int c = 0; c < 3; c++) {
        if (!co->compute[c] || strcmp(co->compute[c], "auto")) continue;
        const int quant = !strcmp(weights[c], "q8_0") || !strcmp(weights[c], "q4_0");
        co->compute[c] = unit && (!quant || amx) ? "bf16" : "fp32";
        fprintf(stderr, "%s%s (%s weights) %s", any++ ? ", " : "compute auto: ", names[c], weights[c], co->compute[c]);
    }
    if (any) fprintf(stderr, " (%s)\n", why);
}

int cmd_compile_a(cli_args *a) {
    ma_compile_opts co = {.vision = "f16", .llm = "f16", .action = "f16", .suffix = "", .prompt_seq = 128};
    if (session_settings(a)) return 1;
    co.settings = &SET;
    if (SET.prompt_seq > 0) co.prompt_seq = SET.prompt_seq; /* MOLMOACT_PROMPT_SEQ; --prompt-seq below wins */
    if (a->given[O_PROMPT_SEQ]) co.prompt_seq = (int)a->i[O_PROMPT_SEQ];
    if (a->given[O_VISION]) {
        co.vision = a->str[O_VISION];
        co.suffixed |= MA_COMPILE_SUFFIX_VISION;
    }
    if (a->given[O_LLM]) {
        co.llm = a->str[O_LLM];
        co.suffixed |= MA_COMPILE_SUFFIX_LLM;
    }
    if (a->given[O_ACTION]) {
        co.action = a->str[O_ACTION];
        co.suffixed |= MA_COMPILE_SUFFIX_ACTION;
    }
    if (a->given[O_SUFFIX]) {
        co.suffix = a->str[O_SUFFIX];
        if (!co.suffixed && co.suffix[0]) {
            fprintf(
                stderr,
                "molmoact compile: --suffix %s names the files of the components given with --vision, --llm or --action: give at least one\n",
                co.suffix);
            return 1;
        }
    }
    static char keep[CLI_MAX_LIST][256];
    for (int k = 0; k < a->nlist[O_KEEP]; k++) {
        const char *v = a->list[O_KEEP][k];
        snprintf(keep[k], sizeof keep[k], "%s", v);
        char *eq = strrchr(keep[k], '=');
        if (!eq || strlen(v) >= sizeof keep[k] || k >= MA_COMPILE_MAX_KEEP) {
            fprintf(stderr, "molmoact compile: --keep %s: must be PATTERN=P (at most %d)\n", v, MA_COMPILE_MAX_KEEP);
            return 1;
        }
        *eq = '\0';
        co.keep_pattern[co.n_keep] = keep[k];
        co.keep_prec[co.n_keep++] = eq + 1;
    }
    if (a->given[O_COMPUTE] && parse_compute(a->str[O_COMPUTE], &co)) return 1;
    resolve_auto(&co);
    for (int k = 0; k < a->nlist[O_COMPUTE_KEEP]; k++) {
        if (k >= MA_COMPILE_MAX_KEEP) {
            fprintf(stderr, "molmoact compile: --compute-keep: at most %d patterns\n", MA_COMPILE_MAX_KEEP);
            return 1;
        }
        co.compute_keep[co.n_compute_keep++] = a->list[O_COMPUTE_KEEP][k];
    }
    const char *src = a->pos[0], *out = a->str[O_OUT];
    if (!out) {
        fprintf(stderr, "molmoact compile: give the output directory with -o CTX_DIR\n");
        return 1;
    }
    if (!ma_is_dir(src)) {
        fprintf(stderr, "molmoact compile: %s is not a directory\n", src);
        return 1;
    }
    ma_error err = {0};
    if (ma_compile(src, out, &co, &err)) return fail(&err);
    printf("compiled %s -> %s (vision %s, llm %s, action %s, prompt length %d%s%s)\n", src, out, co.vision, co.llm, co.action,
           co.prompt_seq, co.suffix[0] ? ", suffix " : "", co.suffix);
    return 0;
}
