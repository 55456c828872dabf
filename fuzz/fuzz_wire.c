/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer: the server's request decoders (msgpack-numpy, json_numpy) on arbitrary bytes. */
#include <stddef.h>
#include <stdint.h>

#include "server/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ma_wire_request r;
    ma_error err;
    const ma_wire_model m = {10, 32, 8, 10}; /* horizon, max_action_dim, state_dim, n_steps */
    for (int flip = 0; flip < 2; flip++) {
        if (ma_wire_decode_msgpack(data, size, flip, &m, &r, &err) == MA_OK) ma_wire_request_free(&r);
        if (ma_wire_decode_json((const char *)data, size, flip, &m, &r, &err) == MA_OK) ma_wire_request_free(&r);
    }
    return 0;
}
