/* SPDX-License-Identifier: Apache-2.0 */
#include "core/env.h"

#include <ctype.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define F(field) offsetof(ma_settings, field), sizeof(((ma_settings *)0)->field)
#define STR(key, field, choices) key, MA_SET_STR, F(field), 0, 0, choices
#define INT(key, field, lo, hi) key, MA_SET_INT, F(field), lo, hi, NULL
#define FLAG(key, field) key, MA_SET_FLAG, F(field), 0, 1, NULL
#define NOKEY NULL, MA_SET_NONE, 0, 0, 0, 0, NULL

/* who: the commands that read it ("sessions": run, bench, parity, serve and the library, i.e.
 * everything that opens a model and runs it) */
const ma_env_var MA_ENV_VARS[] = {
    {"MOLMOACT_THREADS", NULL, "N", "sessions, compile",
     "GEMM threads per process (default: the cores this process may use; the workers share them)", INT("threads", threads, 1, 64)},
    {"MOLMOACT_KERNELS", NULL, "SET", "sessions, bench",
     "force a kernel set: scalar, portable, avx2, avx512, vnni, amx, neon, neon_dot (default: the best this CPU has)",
     STR("kernels", kernels, "scalar|portable|avx2|avx512|vnni|amx|neon|neon_dot")},
    {"MOLMOACT_GEMM_PANELS", NULL, "in_place|convert", "sessions",
     "how f16/bf16 weights stored in panel layout meet the GEMM: read in place, or converted per block (default: convert on Intel CPUs, in place on others)",
     STR("gemm_panels", gemm_panels, "in_place|convert")},
    {"MOLMOACT_GEMM_PARTS", NULL, "N", "sessions", "for measuring: the parts a large GEMM is cut into per thread (default 1)",
     INT("gemm_parts", gemm_parts, 1, 64)},
    {"MOLMOACT_COMPUTE", NULL, "context|fp32|bf16", "sessions",
     "the compute plan of every weight matrix, overriding the contexts' (compile --compute): fp32, or bf16 products with fp32 sums where the CPU has AMX or AVX512-BF16 (default: context; the f16 plan comes only from contexts compiled with it, which checked their weights' range)",
     STR("compute", compute, "context|fp32|bf16")},
    {"MOLMOACT_PRELOAD", NULL, "1", "sessions", "same as --preload: read every context in at open and run one warm-up request",
     FLAG("preload", preload)},
    {"MOLMOACT_PROMPT_SEQ", "MOLMOACT2_PROMPT_SEQ", "N", "sessions",
     "the static prompt length: observations are padded to N tokens (default on qnn: the length the contexts were compiled for; on cpu: no padding)",
     INT("prompt_seq", prompt_seq, 1, 65536)},
    {"MOLMOACT_VISION_CTX_SUFFIX", "VISION_CTX_SUFFIX", "S", "sessions",
     "open vision{S}.gguf (qnn: ctx/vision{S}_socid77_archv73.bin), e.g. _w4a16", STR("vision_suffix", suffix[MA_SUFFIX_VISION], NULL)},
    {"MOLMOACT_LLM_CTX_SUFFIX", "LLM_CTX_SUFFIX", "S", "sessions", "open llm_split0..3{S} the same way",
     STR("llm_suffix", suffix[MA_SUFFIX_LLM], NULL)},
    {"MOLMOACT_ACTION_CTX_SUFFIX", "ACTION_CTX_SUFFIX", "S", "sessions",
     "open action_step{S} the same way (action_context keeps its name, as in the reference deployment)",
     STR("action_suffix", suffix[MA_SUFFIX_ACTION], NULL)},
    {"MOLMOACT_BACKEND", NULL, "cpu|qnn", "sessions", "same as --backend", STR("backend", backend, "cpu|qnn")},
    {"MOLMOACT_QNN_LIB_DIR", NULL, "DIR", "sessions (qnn)", "same as --qnn-lib-dir: where libQnnHtp.so and libQnnSystem.so are",
     STR("qnn_lib_dir", qnn_lib_dir, NULL)},
    {"MOLMOACT_QNN_IO_MAP", NULL, "FILE", "sessions (qnn)", "same as --qnn-io-map", STR("qnn_io_map", qnn_io_map, NULL)},
    {"MOLMOACT_QNN_SOC", NULL, "N", "sessions (qnn)", "same as --qnn-soc (none sent unless given)",
     INT("qnn_soc", qnn_soc, 1, 0xffffffffL)},
    {"MOLMOACT_QNN_ARCH", NULL, "N", "sessions (qnn)", "same as --qnn-arch (none sent unless given)",
     INT("qnn_arch", qnn_arch, 1, 0xffffffffL)},
    {"MOLMOACT_QNN_PERF", NULL, "default|high|burst", "sessions (qnn)", "same as --qnn-perf: the HTP power vote",
     STR("qnn_perf", qnn_perf, "default|high|burst")},
    {"MOLMOACT_QNN_ZERO_COPY", NULL, "1", "sessions (qnn)", "same as --qnn-zero-copy: tensors in registered rpcmem buffers",
     FLAG("qnn_zero_copy", qnn_zero_copy)},
    {"ADSP_LIBRARY_PATH", NULL, "DIR;DIR", "sessions (qnn)",
     "read by the QNN libraries: where the DSP side finds its skeleton libraries (libQnnHtpV73Skel.so); directories separated by ';'",
     STR("adsp_library_path", adsp_library_path, NULL)},
    {"DSP_LIBRARY_PATH", NULL, "DIR;DIR", "sessions (qnn)", "read by the QNN libraries instead of ADSP_LIBRARY_PATH when set",
     STR("dsp_library_path", dsp_library_path, NULL)},
    {"MOLMOACT_VERBOSE", NULL, "1", "sessions", "same as -v: each QNN context binary's graph count and names at open",
     FLAG("verbose", verbose)},
    {"MOLMOACT_BASE_DIR", NULL, "DIR", "sessions, compile, inspect", "same as --base: the Hugging Face base directory of a LeRobot policy",
     STR("base_dir", base_dir, NULL)},
    {"MOLMOACT_WORKER_EXE", NULL, "FILE", "library",
     "the molmoact program the library starts its workers from (default: beside the library)", STR("worker_exe", worker_exe, NULL)},
    {"MOLMOACT_WORKER_DEADLINE_MS", NULL, "N", "sessions",
     "how long a worker may take for one request before it is declared hung (default 60000)",
     INT("worker_deadline_ms", worker_deadline_ms, 1, 2147483647L)},
    {"MOLMOACT_LIBRARY", NULL, "FILE", "python", "the libmolmoact.so the Python binding loads", NOKEY},
    {"HF_HUB_CACHE", NULL, "DIR", "pull, sessions, compile, inspect",
     "the Hugging Face hub cache molmoact pull writes and a LeRobot policy's base is looked up in (else HUGGINGFACE_HUB_CACHE, $HF_HOME/hub, $XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub)",
     STR("hub_cache", hub_cache, NULL)},
    {"HF_ENDPOINT", NULL, "URL", "pull", "the Hugging Face Hub to download from, e.g. a mirror (default https://huggingface.co)",
     STR("hf_endpoint", hf_endpoint, NULL)},
    {"HF_TOKEN", NULL, "TOKEN", "pull",
     "the Hub token for gated or private repos (sent to HF_ENDPOINT's host only, never printed; --token-file overrides it)", NOKEY},
    {"HF_TOKEN_PATH", NULL, "FILE", "pull",
     "the file holding the token when HF_TOKEN is unset (default $HF_HOME/token, where `hf auth login` writes it)", NOKEY},
    {"HF_HOME", NULL, "DIR", "pull, sessions, compile, inspect",
     "the Hugging Face home: the hub cache at $HF_HOME/hub and the token at $HF_HOME/token (default $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface)",
     NOKEY},
    /* settings no variable fills: the command line's and the API's alone */
    {NULL, NULL, "1", "", "the workers' start as progress lines (serve, --preload)", FLAG("progress", progress)},
};
const int MA_ENV_COUNT = (int)(sizeof MA_ENV_VARS / sizeof MA_ENV_VARS[0]);

/* the hub cache's directory, as huggingface_hub resolves it (huggingface_hub constants.py: HF_HUB_CACHE,
 * then the deprecated HUGGINGFACE_HUB_CACHE, then HF_HOME/hub, XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub) */
static ma_status hub_cache(ma_settings *s, ma_error *err) {
    const char *e, *from;
    char v[MA_SETTINGS_PATH + 64];
    if ((e = getenv(from = "HF_HUB_CACHE")) && *e) snprintf(v, sizeof v, "%s", e);
    else if ((e = getenv(from = "HUGGINGFACE_HUB_CACHE")) && *e) snprintf(v, sizeof v, "%s", e);
    else if ((e = ma_env_get(from = "HF_HOME")) && *e) snprintf(v, sizeof v, "%s/hub", e);
    else if ((e = getenv(from = "XDG_CACHE_HOME")) && *e) snprintf(v, sizeof v, "%s/huggingface/hub", e);
    else if ((e = getenv(from = "HOME")) && *e) snprintf(v, sizeof v, "%s/.cache/huggingface/hub", e);
    else return MA_OK;
    /* a value that cannot be a setting (longer than a path, a line break) leaves the cache
     * unknown: only a LeRobot policy without --base needs it, and it says so then */
    ma_error ignored = {0};
    (void)err;
    if (ma_settings_set(s, "hub_cache", v, from, &ignored)) s->hub_cache[0] = '\0';
    return MA_OK;
}

const char *ma_env_get(const char *name) {
    for (int i = 0; i < MA_ENV_COUNT; i++)
        if (MA_ENV_VARS[i].name && !strcmp(MA_ENV_VARS[i].name, name)) return getenv(name);
    return NULL; /* not in the table: not read */
}

int ma_env_hf_home(char *out, size_t cap) {
    const char *e;
    int n;
    if ((e = ma_env_get("HF_HOME")) && *e) n = snprintf(out, cap, "%s", e);
    else if ((e = getenv("XDG_CACHE_HOME")) && *e) n = snprintf(out, cap, "%s/huggingface", e);
    else if ((e = getenv("HOME")) && *e) n = snprintf(out, cap, "%s/.cache/huggingface", e);
    else return 0;
    return n > 0 && (size_t)n < cap;
}

ma_status ma_settings_from_env(ma_settings *s, ma_error *err) {
    ma_settings_init(s);
    for (int i = 0; i < MA_ENV_COUNT; i++) {
        const ma_env_var *e = &MA_ENV_VARS[i];
        if (!e->name || !e->key || !strcmp(e->key, "hub_cache")) continue;
        const char *a = getenv(e->name), *b = e->alias ? getenv(e->alias) : NULL;
        if (a && b && strcmp(a, b))
            return ma_fail(err, MA_ERR_ARG, "%s=%.200s and %s=%.200s contradict each other (%s is the older name of %s: set one)", e->name,
                           a, e->alias, b, e->alias, e->name);
        const char *v = a ? a : b;
        if (!v) continue;
        if (e->type == MA_SET_FLAG && !*v) continue; /* MOLMOACT_PRELOAD= is off, as it always was */
        ma_status st = ma_settings_set(s, e->key, e->type == MA_SET_FLAG ? (strcmp(v, "0") ? "1" : "0") : v, a ? e->name : e->alias, err);
        if (st) return st;
    }
    return hub_cache(s, err);
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
