/* SPDX-License-Identifier: Apache-2.0 */
/* The component vocabulary, named once: the eight context files of a compiled directory, the
 * seven sessions, the six resident workers, the three groups a precision or a compute plan is
 * given to, the parts a process binds, and the maps between them. Every other table of these
 * names is built from this one. */
#ifndef MA_COMPONENTS_H
#define MA_COMPONENTS_H

/* the files of a context directory (slots), in this order */
enum { MA_CTX_VISION, MA_CTX_EMBED, MA_CTX_LLM0, MA_CTX_ACTION_CONTEXT = MA_CTX_LLM0 + 4, MA_CTX_ACTION_STEP, MA_N_CONTEXTS };
/* the sessions (runtime/session.h): the contexts but the embedding table */
#define MA_N_SESSIONS 7
/* the resident workers: vision, llm_split0..3, action (action_context and action_step) */
#define MA_NUM_WORKERS 6
/* the groups a precision, a suffix or a compute plan is given to */
enum { MA_GROUP_VISION, MA_GROUP_LLM, MA_GROUP_ACTION, MA_N_GROUPS };

/* the parts a process binds (a worker opens only its own); a bit per context slot */
enum {
    MA_PART_VISION = 1u << MA_CTX_VISION,
    MA_PART_EMBED = 1u << MA_CTX_EMBED,
    MA_PART_LLM0 = 1u << MA_CTX_LLM0, /* LLM1..3 follow */
    MA_PART_ACTION_CONTEXT = 1u << MA_CTX_ACTION_CONTEXT,
    MA_PART_ACTION_STEP = 1u << MA_CTX_ACTION_STEP,
    MA_PART_ALL = 0xffu,
    MA_PART_LORA_OK = 1u << 16, /* unmerged LoRA adapters are accepted (compile merges them) */
};
#define MA_PART_LLM(i) (MA_PART_LLM0 << (i))

extern const char *const MA_CONTEXT_NAMES[MA_N_CONTEXTS]; /* vision, embed, llm_split0..3, action_context, action_step */
extern const char *const MA_SESSION_NAMES[MA_N_SESSIONS]; /* vision, llm_split0..3, action_context, action_step */
extern const char *const MA_WORKER_NAMES[MA_NUM_WORKERS]; /* vision, llm_split0..3, action */
extern const char *const MA_GROUP_NAMES[MA_N_GROUPS];     /* vision, llm, action */

/* a context slot's group (the embedding table is the llm's input) */
int ma_context_group(int slot);
/* what a context file says it holds (molmoact.component): vision, embed, llm, action_context, action_step */
const char *ma_context_component(int slot);
/* a context slot's part bit */
unsigned ma_context_part(int slot);
/* a session's context slot, its worker */
int ma_session_context(int session);
int ma_session_worker(int session);
/* the parts a worker binds */
unsigned ma_worker_parts(int worker);

#endif
