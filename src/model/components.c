/* SPDX-License-Identifier: Apache-2.0 */
#include "model/components.h"

const char *const MA_CONTEXT_NAMES[MA_N_CONTEXTS] = {"vision",     "embed",      "llm_split0",     "llm_split1",
                                                     "llm_split2", "llm_split3", "action_context", "action_step"};
const char *const MA_SESSION_NAMES[MA_N_SESSIONS] = {"vision",     "llm_split0",     "llm_split1", "llm_split2",
                                                     "llm_split3", "action_context", "action_step"};
const char *const MA_WORKER_NAMES[MA_NUM_WORKERS] = {"vision", "llm_split0", "llm_split1", "llm_split2", "llm_split3", "action"};
const char *const MA_GROUP_NAMES[MA_N_GROUPS] = {"vision", "llm", "action"};

int ma_context_group(int slot) {
    return slot == MA_CTX_VISION ? MA_GROUP_VISION : slot < MA_CTX_ACTION_CONTEXT ? MA_GROUP_LLM : MA_GROUP_ACTION;
}

const char *ma_context_component(int slot) { return slot >= MA_CTX_LLM0 && slot < MA_CTX_ACTION_CONTEXT ? "llm" : MA_CONTEXT_NAMES[slot]; }

unsigned ma_context_part(int slot) { return 1u << slot; }

int ma_session_context(int session) { return session == 0 ? MA_CTX_VISION : session + 1; }

int ma_session_worker(int session) { return session <= 4 ? session : 5; }

unsigned ma_worker_parts(int worker) {
    if (worker == 0) return MA_PART_VISION;
    if (worker <= 4) return MA_PART_LLM(worker - 1);
    return MA_PART_ACTION_CONTEXT | MA_PART_ACTION_STEP;
}
