/* SPDX-License-Identifier: Apache-2.0 */
/* The qnn backend: each session runs a QNN HTP context binary (the reference deployment's
 * ctx/<session><suffix>_socid77_archv73.bin) through libQnnHtp.so and libQnnSystem.so, loaded at
 * run time with dlopen (nothing links against the SDK, so one build runs with or without it).
 *
 * Settings (core/settings.h; the model's, from the options or their MOLMOACT_ variables):
 *   qnn_lib_dir     directory of libQnnHtp.so / libQnnSystem.so (--qnn-lib-dir); default: the
 *                   loader's search (LD_LIBRARY_PATH). A resident worker starts with it in front
 *                   of LD_LIBRARY_PATH, and as ADSP_LIBRARY_PATH (the DSP side's, read by the
 *                   libraries themselves) when that and DSP_LIBRARY_PATH are unset
 *   qnn_io_map      JSON {session: {our tensor name: graph tensor name}} (--qnn-io-map)
 *   qnn_soc, qnn_arch  HTP device configs, sent only when set (--qnn-soc/-arch; 77 and 73 on the
 *                   IQ-9075), in the loaded library's layout
 *   qnn_perf        default | high | burst: the HTP power vote (--qnn-perf), cast once the first
 *                   context is loaded and renewed after a DSP restart; a warning if it fails
 *   qnn_zero_copy   tensors in rpcmem buffers registered with the context (--qnn-zero-copy)
 *   verbose         each context binary's graph count and names at open (-v)
 *   the suffixes    context variants: vision, the four LLM splits, action_step
 *   prompt_seq      the prompt length the graphs were built for (the session's static_seq:
 *                   default the length the directory was compiled for, else 128)
 * Graph tensors bind to the session's io spec by name (or the io map), else by order and shape;
 * fp32 tensors convert to and from the graph's fp32, fp16 and (u)fixed 8/16 with scale / offset. */
#ifndef MA_QNN_H
#define MA_QNN_H

#include <stdio.h>

#include "runtime/session.h"

/* the qnn backend (runtime/session.h): its sessions run QNN HTP context binaries; its settings
 * (qnn_lib_dir, qnn_soc, ...) come from the model a session is opened on */
extern const ma_backend ma_qnn_backend;

/* s: a session whose io spec is filled (ma_session_open); loads its context binary, binds the
 * graph's tensors and fixes the spec's -1 dimensions to the graph's */
ma_status ma_qnn_session_attach(ma_session *s, ma_error *err);


/* `molmoact inspect FILE.bin`: the binary info (version, producer) and every graph with its
 * inputs and outputs, read through libQnnSystem.so (and libQnnHtp.so for its API version) of
 * set->qnn_lib_dir */
ma_status ma_qnn_inspect(const ma_settings *set, const char *path, FILE *f, ma_error *err);

/* 1 once a QNN call of this process returned 1011 (SYSTEM_COMMUNICATION_FATAL): the DSP restart
 * did not recover and nothing QNN made in this process works again (a resident worker then exits
 * so that its supervisor starts a new one) */
int ma_qnn_process_lost(void);


#endif
