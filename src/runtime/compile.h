/* SPDX-License-Identifier: Apache-2.0 */
/* `molmoact compile`: a Hugging Face checkpoint directory -> one GGUF context per session
 * (vision, llm_split0..3, action_context, action_step) plus the host files (embed.gguf with the
 * embedding table, norm_stats.json, tokenizer.json, processor_config.json, config.json).
 *
 * Every context carries: molmoact.format, molmoact.component, molmoact.precision, the full
 * config.json (molmoact.config_json), the fingerprint of the source checkpoint
 * (molmoact.source_fingerprint: opening refuses contexts of different checkpoints), the layer range
 * (llm), and the prompt length the static graphs are built for (llm and action contexts:
 * molmoact.prompt_seq, which a run on the qnn backend pads to), the compute plan (molmoact.compute:
 * fp32, or bf16 products with fp32 sums; kernels/gemm.h). Tensors keep their checkpoint names;
 * matrices are stored in the component's precision (f16, bf16, q8_0, q4_0; rows that do not fill
 * 32-value blocks fall back to f16), vectors in f32.
 *
 * With a suffix, the files of the components it names are vision{S}.gguf, llm_split0..3{S}.gguf,
 * action_step{S}.gguf; the others keep their names and, where the directory already holds them
 * for the same checkpoint, are kept as they are (a variant is added beside the set).
 *
 * Files are written into a staging directory beside out_dir (out_dir.compile-XXXXXX) and moved
 * into out_dir (created, or an existing directory: other precisions may already be there) only
 * when all are complete; a failed compile leaves nothing new behind. */
#ifndef MA_COMPILE_H
#define MA_COMPILE_H

#include "core/error.h"
#include "core/settings.h"

#define MA_COMPILE_MAX_KEEP 16
#define MA_COMPILE_SUFFIX_VISION 1u
#define MA_COMPILE_SUFFIX_LLM 2u
#define MA_COMPILE_SUFFIX_ACTION 4u /* action_step only: action_context keeps its name */
#define MA_COMPILE_SUFFIX_ALL 7u

typedef struct ma_compile_opts {
    const ma_settings *settings;       /* the base directory, hub cache, kernels (NULL: the defaults) */
    const char *vision, *llm, *action; /* precisions */
    const char *suffix;                /* appended to the context names of the components in suffixed */
    unsigned suffixed;                 /* MA_COMPILE_SUFFIX_*: the components --suffix names (0: all) */
    int prompt_seq;
    /* per-tensor choices (--keep PATTERN=P): matrices whose checkpoint name matches the glob
     * PATTERN (fnmatch) are stored in P instead of their component's precision, where P is the
     * more precise of the two (a sensitive tensor kept at higher precision in a quantised plan) */
    int n_keep;
    const char *keep_pattern[MA_COMPILE_MAX_KEEP], *keep_prec[MA_COMPILE_MAX_KEEP];
    /* the compute plan of vision, llm and action (--compute): "fp32" (or NULL), "bf16" or "f16"
     * (f16 weights only; each panel-layout weight checked to |w| <= MA_GEMM_F16_WMAX), recorded in
     * each context as molmoact.compute; matrices matching a --compute-keep glob stay fp32 in a
     * bf16 or f16 component (listed in molmoact.compute_fp32_tensors) */
    const char *compute[3];
    int n_compute_keep;
    const char *compute_keep[MA_COMPILE_MAX_KEEP];
} ma_compile_opts;

ma_status ma_compile(const char *hf_dir, const char *out_dir, const ma_compile_opts *o, ma_error *err);

#endif
