/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer: config.json and norm_stats.json parsing (cJSON underneath) on arbitrary text. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
#include "model/normstats.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    ma_config c;
    ma_normstats ns;
    ma_error err;
    ma_config_parse(text, "fuzz", &c, &err);
    if (ma_normstats_parse(text, "fuzz", "libero", &ns, &err) == MA_OK) {
        float x[64] = {0}, y[64];
        ma_unnormalize(&ns, &ns.action, x, y, &err);
        if (ns.has_state) ma_normalize(&ns, &ns.state, x, y);
    }
    free(text);
    return 0;
}
