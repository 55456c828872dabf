/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer: the server's request decoders (msgpack-numpy, json_numpy) on arbitrary bytes.
 * An input starting with 0xc1 is a recipe for a large message (expand.h): the decoders' size
 * arithmetic (nested lists whose sizes multiply, decoding costs that grow with the message)
 * needs hundreds of kilobytes. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "expand.h"
#include "server/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ma_wire_request r;
    ma_error err;
    const ma_wire_model m = {10, 32, 8, 10}; /* horizon, max_action_dim, state_dim, n_steps */
    uint8_t *big = NULL;
    if (size && data[0] == 0xc1) {
        big = fuzz_expand(data, size, &size);
        if (!big) return 0;
        data = big;
    }
    for (int flip = 0; flip < 2; flip++) {
        if (ma_wire_decode_msgpack(data, size, flip, &m, &r, &err) == MA_OK) ma_wire_request_free(&r);
        if (!big && ma_wire_decode_json((const char *)data, size, flip, &m, &r, &err) == MA_OK) ma_wire_request_free(&r);
    }
    free(big);
    return 0;
}
