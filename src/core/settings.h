/* SPDX-License-Identifier: Apache-2.0 */
/* The settings of one engine: everything that chooses how a model is opened and run (backend,
 * threads, kernels, compute plan, prompt length, context suffixes, directories, deadlines, the
 * QNN options). One struct, filled once at the edge -- from the command line's option table,
 * from molmoact_options in the C API, from the Python binding -- and passed down as an argument.
 * The process environment is one more input at that edge, read in one place (core/env.c, through
 * the table `molmoact help env` prints) and never written by the library. The resident workers
 * receive their engine's settings in their start message (runtime/resident.c), so two engines in
 * one process, or a worker started again after a fault, never take each other's settings.
 *
 * Every field has a row in the table (core/env.c): its key (the field's name), its variable, its
 * type and its range. ma_settings_set checks a value against its row wherever it comes from and
 * names the source in the error ("--threads", "MOLMOACT_THREADS", "options.threads"). */
#ifndef MA_SETTINGS_H
#define MA_SETTINGS_H

#include "core/error.h"

#include <stddef.h>

#define MA_SETTINGS_PATH 4096 /* a directory or file name, with its NUL */
#define MA_SETTINGS_SUFFIX 65 /* a context suffix: at most 64 characters */
#define MA_SETTINGS_WORD 16   /* a name such as "cpu", "avx512", "burst" */

enum { MA_SUFFIX_VISION, MA_SUFFIX_LLM, MA_SUFFIX_ACTION };

typedef struct ma_settings {
    char backend[MA_SETTINGS_WORD];     /* "cpu" (the default) or "qnn" */
    int threads;                        /* kernel threads per process; 0: the cores it may use */
    char kernels[MA_SETTINGS_WORD];     /* a kernel set by name; "": the best this CPU has */
    char gemm_panels[MA_SETTINGS_WORD]; /* "in_place" or "convert"; "": by CPU vendor */
    int gemm_parts;                     /* parts a large GEMM is cut into per thread; 0: 1 */
    char compute[MA_SETTINGS_WORD];     /* "context" (""), "fp32" or "bf16" (the f16 plan only from contexts) */
    int preload;                        /* read every context in at open, then one warm-up request */
    int prompt_seq;                     /* the static prompt length; 0: the backend's default */
    char suffix[3][MA_SETTINGS_SUFFIX]; /* vision, llm, action context suffixes (MA_SUFFIX_*) */
    char base_dir[MA_SETTINGS_PATH];    /* a LeRobot policy's Hugging Face base directory */
    char hub_cache[MA_SETTINGS_PATH];   /* the Hugging Face hub cache the base is looked up in */
    char hf_endpoint[MA_SETTINGS_PATH]; /* the Hub molmoact pull downloads from; "": https://huggingface.co */
    char worker_exe[MA_SETTINGS_PATH];  /* the program the workers run; "": found */
    int worker_deadline_ms;             /* per request and worker; 0: 60000 */
    int verbose;                        /* each QNN context's graphs at open */
    int progress;                       /* the workers' start as progress lines on stderr */
    char qnn_lib_dir[MA_SETTINGS_PATH]; /* where libQnnHtp.so and libQnnSystem.so are */
    char qnn_io_map[MA_SETTINGS_PATH];  /* a JSON file naming the context binaries' tensors */
    long qnn_soc, qnn_arch;             /* -1: none sent (the device's own) */
    char qnn_perf[MA_SETTINGS_WORD];    /* "default" (""), "high", "burst" */
    int qnn_zero_copy;
    /* read, never set: FastRPC's own variables, checked and handed to qnn workers */
    char adsp_library_path[MA_SETTINGS_PATH], dsp_library_path[MA_SETTINGS_PATH];
} ma_settings;

/* the defaults: every field empty or 0, qnn_soc and qnn_arch -1 */
void ma_settings_init(ma_settings *s);

/* one field by its key ("threads", "qnn_perf", "vision_suffix", ...), its value written as on a
 * command line; `from` names where it came from for the error. A value outside the row's range,
 * type or choices is refused. Empty strings reset a string field. */
ma_status ma_settings_set(ma_settings *s, const char *key, const char *value, const char *from, ma_error *err);

/* the value of a field as text (what ma_settings_set takes back); NULL for an unknown key */
const char *ma_settings_get(const ma_settings *s, const char *key, char *buf, size_t cap);

/* every field as "key=value\n" lines: what a worker's start message carries. Returns the length
 * written, or 0 when cap is too small. */
size_t ma_settings_encode(const ma_settings *s, char *out, size_t cap);
/* the reverse, over ma_settings_init's defaults; an unknown key or a bad line refused */
ma_status ma_settings_decode(ma_settings *s, const char *text, size_t len, ma_error *err);

/* the static prompt's length for a backend that pads prompts (qnn) or not (cpu), given the length
 * the contexts were compiled for (0: none recorded): settings.prompt_seq when given, else that
 * length, else the reference deployment's 128; 0 (no padding) on a backend that does not pad */
long ma_settings_prompt_seq(const ma_settings *s, int backend_pads, long compiled);

#endif
