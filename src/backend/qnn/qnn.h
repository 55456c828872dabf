/* SPDX-License-Identifier: Apache-2.0 */
/* The qnn backend: each session runs a QNN HTP context binary (the reference deployment's
 * ctx/<session><suffix>_socid77_archv73.bin) through libQnnHtp.so and libQnnSystem.so, loaded at
 * run time with dlopen (nothing links against the SDK, so one build runs with or without it).
 *
 * Environment (set by the CLI's options, inherited by the resident workers):
 *   MOLMOACT_QNN_LIB_DIR   directory of libQnnHtp.so / libQnnSystem.so (--qnn-lib-dir); default:
 *                          the loader's search (LD_LIBRARY_PATH); ADSP_LIBRARY_PATH is the DSP
 *                          side's, read by the libraries themselves (a resident worker starts
 *                          with --qnn-lib-dir there when it and DSP_LIBRARY_PATH are unset)
 *   MOLMOACT_QNN_IO_MAP    JSON {session: {our tensor name: graph tensor name}} (--qnn-io-map)
 *   MOLMOACT_QNN_SOC, MOLMOACT_QNN_ARCH  HTP device configs, sent only when set (--qnn-soc/-arch;
 *                          77 and 73 on the IQ-9075), in the loaded library's layout
 *   MOLMOACT_QNN_PERF      default | high | burst: the HTP power vote (--qnn-perf), cast once the
 *                          first context is loaded and renewed after a DSP restart; a warning if it fails
 *   MOLMOACT_QNN_ZERO_COPY 1: tensors in rpcmem buffers registered with the context (--qnn-zero-copy)
 *   MOLMOACT_VERBOSE       1: each context binary's graph count and names at open (-v)
 *   MOLMOACT_VISION_CTX_SUFFIX, _LLM_, _ACTION_ (or the reference deployment's VISION_CTX_SUFFIX,
 *                          LLM_CTX_SUFFIX, ACTION_CTX_SUFFIX)  context variants: vision, the four
 *                          LLM splits, action_step
 *   MOLMOACT_PROMPT_SEQ (or MOLMOACT2_PROMPT_SEQ)  the prompt length the graphs were built for
 *                          (default: the length the directory was compiled for, else 128)
 * Graph tensors bind to the session's io spec by name (or the io map), else by order and shape;
 * fp32 tensors convert to and from the graph's fp32, fp16 and (u)fixed 8/16 with scale / offset. */
#ifndef MA_QNN_H
#define MA_QNN_H

#include <stdio.h>

#include "runtime/session.h"

/* s: a session whose io spec is filled (ma_session_open_on); loads its context binary, binds the
 * graph's tensors and fixes the spec's -1 dimensions to the graph's */
ma_status ma_qnn_session_attach(ma_session *s, ma_error *err);

/* before any qnn worker starts: --qnn-lib-dir onto LD_LIBRARY_PATH (the HTP stub is loaded by its
 * bare name), ADSP_LIBRARY_PATH checked (';' separates its directories), --qnn-perf checked */
ma_status ma_qnn_prepare_env(ma_error *err);

/* `molmoact inspect FILE.bin`: the binary info (version, producer) and every graph with its
 * inputs and outputs, read through libQnnSystem.so (and libQnnHtp.so for its API version) */
ma_status ma_qnn_inspect(const char *path, FILE *f, ma_error *err);

/* 1 once a QNN call of this process returned 1011 (SYSTEM_COMMUNICATION_FATAL): the DSP restart
 * did not recover and nothing QNN made in this process works again (a resident worker then exits
 * so that its supervisor starts a new one) */
int ma_qnn_process_lost(void);

/* the ADSP_LIBRARY_PATH a qnn worker process should start with, when neither it nor
 * DSP_LIBRARY_PATH is set: --qnn-lib-dir's directory. Fills out and returns 1, else 0. The library
 * sets nothing: the worker program's main sets it, before anything is loaded. */
int ma_qnn_worker_adsp_path(char *out, size_t cap);

#endif
