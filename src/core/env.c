/* SPDX-License-Identifier: Apache-2.0 */
#include "core/env.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

/* who: the commands that read it ("sessions": run, bench, parity, serve and the library, i.e.
 * everything that opens a model and runs it) */
const ma_env_var MA_ENV_VARS[] = {
    {"MOLMOACT_THREADS", NULL, "N", "sessions, compile", "GEMM threads per process (default: the cores this process may use; the workers share them)"},
    {"MOLMOACT_KERNELS", NULL, "SET", "sessions, bench", "force a kernel set: scalar, portable, avx2, avx512, vnni, amx, neon, neon_dot (default: the best this CPU has)"},
    {"MOLMOACT_GEMM_PANELS", NULL, "in_place|convert", "sessions", "how f16/bf16 weights stored in panel layout meet the GEMM: read in place, or converted per block (default: convert on Intel CPUs, in place on others)"},
    {"MOLMOACT_COMPUTE", NULL, "context|fp32|bf16", "sessions", "the compute plan of every weight matrix, overriding the contexts' (compile --compute): fp32, or bf16 products with fp32 sums where the CPU has AMX or AVX512-BF16 (default: context)"},
    {"MOLMOACT_PRELOAD", NULL, "1", "sessions", "same as --preload: read every context in at open and run one warm-up request"},
    {"MOLMOACT_PROMPT_SEQ", "MOLMOACT2_PROMPT_SEQ", "N", "sessions", "the static prompt length: observations are padded to N tokens (default on qnn: the length the contexts were compiled for; on cpu: no padding)"},
    {"MOLMOACT_VISION_CTX_SUFFIX", "VISION_CTX_SUFFIX", "S", "sessions", "open vision{S}.gguf (qnn: ctx/vision{S}_socid77_archv73.bin), e.g. _w4a16"},
    {"MOLMOACT_LLM_CTX_SUFFIX", "LLM_CTX_SUFFIX", "S", "sessions", "open llm_split0..3{S} the same way"},
    {"MOLMOACT_ACTION_CTX_SUFFIX", "ACTION_CTX_SUFFIX", "S", "sessions", "open action_step{S} the same way (action_context keeps its name, as in the reference deployment)"},
    {"MOLMOACT_BACKEND", NULL, "cpu|qnn", "sessions", "same as --backend"},
    {"MOLMOACT_QNN_LIB_DIR", NULL, "DIR", "sessions (qnn)", "same as --qnn-lib-dir: where libQnnHtp.so and libQnnSystem.so are"},
    {"MOLMOACT_QNN_IO_MAP", NULL, "FILE", "sessions (qnn)", "same as --qnn-io-map"},
    {"MOLMOACT_QNN_SOC", NULL, "N", "sessions (qnn)", "same as --qnn-soc (none sent unless given)"},
    {"MOLMOACT_QNN_ARCH", NULL, "N", "sessions (qnn)", "same as --qnn-arch (none sent unless given)"},
    {"MOLMOACT_QNN_PERF", NULL, "default|high|burst", "sessions (qnn)", "same as --qnn-perf: the HTP power vote"},
    {"MOLMOACT_QNN_ZERO_COPY", NULL, "1", "sessions (qnn)", "same as --qnn-zero-copy: tensors in registered rpcmem buffers"},
    {"ADSP_LIBRARY_PATH", NULL, "DIR;DIR", "sessions (qnn)", "read by the QNN libraries: where the DSP side finds its skeleton libraries (libQnnHtpV73Skel.so); directories separated by ';'"},
    {"MOLMOACT_VERBOSE", NULL, "1", "sessions", "same as -v: each QNN context binary's graph count and names at open"},
    {"MOLMOACT_BASE_DIR", NULL, "DIR", "sessions, compile, inspect", "same as --base: the Hugging Face base directory of a LeRobot policy"},
    {"MOLMOACT_WORKER_EXE", NULL, "FILE", "library", "the molmoact program the library starts its workers from (default: beside the library)"},
    {"MOLMOACT_WORKER_DEADLINE_MS", NULL, "N", "sessions", "how long a worker may take for one request before it is declared hung (default 60000)"},
    {"MOLMOACT_LIBRARY", NULL, "FILE", "python", "the libmolmoact.so the Python binding loads"},
    {"HF_HUB_CACHE", NULL, "DIR", "sessions, compile, inspect", "the Hugging Face hub cache a LeRobot policy's base is looked up in (else HUGGINGFACE_HUB_CACHE, $HF_HOME/hub, $XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub)"},
};
const int MA_ENV_COUNT = (int)(sizeof MA_ENV_VARS / sizeof MA_ENV_VARS[0]);

static const ma_env_var *find(const char *name) {
    for (int i = 0; i < MA_ENV_COUNT; i++)
        if (!strcmp(MA_ENV_VARS[i].name, name)) return &MA_ENV_VARS[i];
    return NULL;
}

const char *ma_env(const char *name) {
    const char *v = getenv(name);
    if (v) return v;
    const ma_env_var *e = find(name);
    return e && e->alias ? getenv(e->alias) : NULL;
}

const char *ma_env_source(const char *name) {
    if (getenv(name)) return name;
    const ma_env_var *e = find(name);
    return e && e->alias && getenv(e->alias) ? e->alias : name;
}

ma_status ma_env_check_aliases(ma_error *err) {
    for (int i = 0; i < MA_ENV_COUNT; i++) {
        const ma_env_var *e = &MA_ENV_VARS[i];
        if (!e->alias) continue;
        const char *a = getenv(e->name), *b = getenv(e->alias);
        if (a && b && strcmp(a, b))
            return ma_fail(err, MA_ERR_ARG, "%s=%s and %s=%s contradict each other (%s is the older name of %s: set one)", e->name, a,
                           e->alias, b, e->alias, e->name);
    }
    return MA_OK;
}

int ma_env_flag(const char *name) {
    const char *v = ma_env(name);
    return v && *v && strcmp(v, "0") != 0;
}

ma_status ma_env_check_suffixes(ma_error *err) {
    static const char *vars[] = {"MOLMOACT_VISION_CTX_SUFFIX", "MOLMOACT_LLM_CTX_SUFFIX", "MOLMOACT_ACTION_CTX_SUFFIX"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = ma_env(vars[i]);
        if (v && (strchr(v, '/') || strlen(v) > 64 || !strcmp(v, ".") || !strcmp(v, "..")))
            return ma_fail(err, MA_ERR_ARG, "%s=%.80s: a suffix of file names (at most 64 characters, no '/', not . or ..)",
                           ma_env_source(vars[i]), v);
    }
    return MA_OK;
}

static const char *digits(const char *p) {
    const char *q = p;
    while (isdigit((unsigned char)*q)) q++;
    return q;
}

int ma_plain_decimal(const char *s, int real) {
    const char *p = s + (*s == '-');
    const char *q = digits(p);
    int any = q > p;
    if (real && *q == '.') {
        const char *f = digits(q + 1);
        any |= f > q + 1;
        q = f;
    }
    if (!any) return 0;
    if (real && (*q == 'e' || *q == 'E')) {
        const char *e = q + 1 + (q[1] == '-' || q[1] == '+');
        q = digits(e);
        if (q == e) return 0;
    }
    return *q == '\0';
}
