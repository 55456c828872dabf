/* SPDX-License-Identifier: Apache-2.0 */
/* The backends behind the session interface (runtime/session.h): the one place that knows them
 * all, so that runtime/ depends on the interface only. */
#include "backend/cpu/cpu.h"
#include "backend/qnn/qnn.h"
#include "runtime/session.h"

ma_status ma_backend_attach(ma_backend b, ma_session *s, ma_error *err) {
    return b == MA_BACKEND_QNN ? ma_qnn_session_attach(s, err) : ma_cpu_session_attach(s, err);
}

ma_status ma_backend_prepare(ma_backend b, ma_error *err) {
    return b == MA_BACKEND_QNN ? ma_qnn_prepare_env(err) : MA_OK;
}

int ma_backend_process_lost(void) { return ma_qnn_process_lost(); }
