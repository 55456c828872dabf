/* SPDX-License-Identifier: Apache-2.0 */
/* The qnn backend: each session runs a QNN HTP context binary (the reference deployment's
 * ctx/<session><suffix>_socid77_archv73.bin) through libQnnHtp.so and libQnnSystem.so, loaded at
 * run time with dlopen (nothing links against the SDK, so one build runs with or without it).
 *
 * Environment (set by the CLI's options, inherited by the resident workers):
 *   MOLMOACT_QNN_LIB_DIR   directory of libQnnHtp.so / libQnnSystem.so (--qnn-lib-dir); default:
 *                          the loader's search (LD_LIBRARY_PATH); ADSP_LIBRARY_PATH is the DSP
 *                          side's, read by the libraries themselves
 *   MOLMOACT_QNN_IO_MAP    JSON {session: {our tensor name: graph tensor name}} (--qnn-io-map)
 *   MOLMOACT_QNN_SOC, MOLMOACT_QNN_ARCH  device configs (soc model 77, arch 73) (--qnn-soc/-arch)
 *   VISION_CTX_SUFFIX, LLM_CTX_SUFFIX, ACTION_CTX_SUFFIX  context variants, as the reference
 *                          deployment: vision, the four LLM splits, action_step
 *   MOLMOACT2_PROMPT_SEQ   the prompt length the graphs were built for (default 128)
 * Graph tensors bind to the session's io spec by name (or the io map), else by order and shape;
 * fp32 tensors convert to and from the graph's fp32, fp16 and (u)fixed 8/16 with scale / offset. */
#ifndef MA_QNN_H
#define MA_QNN_H

#include "runtime/session.h"

/* s: a session whose io spec is filled (ma_session_open_on); loads its context binary, binds the
 * graph's tensors and fixes the spec's -1 dimensions to the graph's */
ma_status ma_qnn_session_attach(ma_session *s, ma_error *err);

/* the context file of a session: ctx/<name><suffix>_socid77_archv73.bin */
void ma_qnn_context_name(const char *session, char *out, size_t cap);

#endif
