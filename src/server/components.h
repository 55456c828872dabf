/* SPDX-License-Identifier: Apache-2.0 */
/* The weights of each component the server runs, for its status page: the precision its context
 * was compiled in (molmoact.precision; "checkpoint" when the model is a Hugging Face or LeRobot
 * checkpoint) and the dtypes its tensors are stored in, with their bytes (a q4_0 context also
 * holds f16 rows that do not fill 32-value blocks, and f32 vectors). Read once, at start, from the
 * files the engine opened: the context files of a context directory (their headers), the
 * checkpoint's tensor table otherwise. */
#ifndef MA_SERVER_COMPONENTS_H
#define MA_SERVER_COMPONENTS_H

#include <stdint.h>

#include "model/components.h"
#include "molmoact.h"

#define MA_N_COMPONENTS MA_N_CONTEXTS /* model/components.h: vision, embed, llm_split0..3, action_context, action_step */
#define MA_COMPONENT_MAX_DTYPES 6

typedef struct ma_component_weights {
    const char *name;
    char precision[16];
    int n_dtypes;                               /* 0: the component's weights could not be read */
    char dtype[MA_COMPONENT_MAX_DTYPES][8];     /* by bytes, the largest share first */
    uint64_t bytes[MA_COMPONENT_MAX_DTYPES];
} ma_component_weights;

/* fills out[MA_N_COMPONENTS]; never fails (a component that cannot be read has no dtypes) */
void ma_component_weights_read(molmoact *engine, const molmoact_info *info, ma_component_weights *out);

#endif
