/* SPDX-License-Identifier: Apache-2.0 */
/* Binding checkpoint tensors to the model's weight structs.
 *
 * A weight set is a name-sorted list of tensor references from a safetensors checkpoint (or a
 * GGUF context). Matrices stay views into the mapped file in their stored dtype; vectors
 * (biases, norm weights) are small and are converted to fp32 once, owned by the weight set.
 * Every bind call checks presence and shape and names the tensor when either is wrong; after
 * binding, ma_ws_check_unused refuses tensors nobody asked for.
 */
#ifndef MA_WEIGHTS_H
#define MA_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "core/tensor.h"
#include "kernels/kernels.h"

typedef struct ma_wref {
    const char *name; /* normalised (LeRobot prefix removed) */
    ma_dtype dtype;
    int ndim;
    int64_t shape[MA_MAX_DIMS];
    const void *data;
    int used;           /* 0 unclaimed, 1 bound, 2 known but not needed (ma_ws_ignore) */
    ma_compute compute; /* a context's compute plan for this matrix (compile --compute) */
    /* unmerged LoRA (LeRobot's PEFT wrapping: base_layer + lora_A.default + lora_B.default):
     * W + lora_scale * B A, merged by compile (B [rows, r], A [r, cols]) */
    int has_lora;
    ma_dtype lora_dtype_a, lora_dtype_b;
    int64_t lora_rank;
    const void *lora_a, *lora_b;
    float lora_scale;
} ma_wref;

typedef struct ma_weightset {
    int panel_layout; /* contexts: matrices with a multiple of 16 rows are in the GEMM panel layout */
    ma_wref *refs;    /* sorted by name */
    size_t count;
    char **names; /* owned normalised names */
    void **owned; /* converted vectors */
    size_t n_owned, cap_owned;
    const char *label;
    int compute_force;    /* -1: each matrix's own plan; else the ma_compute every matrix gets (MOLMOACT_COMPUTE) */
    size_t n_lora;        /* matrices with unmerged LoRA adapters */
    char lora_first[256]; /* the first of them, for messages */
} ma_weightset;

/* Build from parallel arrays (names need not be sorted). A LeRobot layout (every key under
 * "model." with "model.model." present, or under "model.base_model.model." when the VLM was
 * wrapped for LoRA) is mapped onto the HF layout; LoRA adapters are attached to their matrix
 * (X.base_layer.weight becomes X.weight; X.lora_A.default.weight and X.lora_B.default.weight
 * its adapters) and counted in n_lora, their scale left at 0 for the caller to set. */
ma_status ma_ws_init(ma_weightset *ws, const char *label, size_t n, const char *const *names, const ma_dtype *dtypes, const int *ndims,
                     const int64_t (*shapes)[MA_MAX_DIMS], const void *const *datas, ma_error *err);
void ma_ws_free(ma_weightset *ws);
ma_wref *ma_ws_find(const ma_weightset *ws, const char *name);
/* a [rows, cols] matrix view */
/* is r stored in the panel layout? (the one rule compile and load share) */
int ma_ws_packed(const ma_weightset *ws, const ma_wref *r);
ma_status ma_ws_mat(ma_weightset *ws, const char *name, int64_t rows, int64_t cols, ma_mat *out, ma_error *err);
/* a [n] vector converted to fp32 */
ma_status ma_ws_vec(ma_weightset *ws, const char *name, int64_t n, float **out, ma_error *err);
/* mark names starting with prefix as known-but-unused (e.g. lm_head) */
void ma_ws_ignore(ma_weightset *ws, const char *name);
/* fail naming the first tensor no bind call used */
ma_status ma_ws_check_unused(const ma_weightset *ws, ma_error *err);

#endif
