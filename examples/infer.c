/* SPDX-License-Identifier: Apache-2.0 */
/* A minimal libmolmoact client: open a model, run one observation from two image files (PNG or
 * JPEG, decoded by the library), print the action chunk.
 *
 *   cc infer.c $(pkg-config --cflags --libs molmoact) -o infer
 *   ./infer MODEL_DIR AGENT.png WRIST.png "put the bowl on the plate" [s0,...,s7] [--inproc]
 */
#include <molmoact.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *buf = NULL;
    size_t cap = 0, n = 0, got;
    do {
        if (n == cap) {
            unsigned char *nb = realloc(buf, cap = cap ? 2 * cap : 65536);
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        got = fread(buf + n, 1, cap - n, f);
        n += got;
    } while (got > 0);
    fclose(f);
    *len = n;
    return buf;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL_DIR AGENT_IMAGE WRIST_IMAGE TASK [s0,...,s7] [--inproc]\n", argv[0]);
        return 2;
    }
    float state[8] = {0};
    int inproc = 0;
    for (int i = 5; i < argc; i++) {
        if (!strcmp(argv[i], "--inproc")) inproc = 1;
        else if (sscanf(argv[i], "%f,%f,%f,%f,%f,%f,%f,%f", &state[0], &state[1], &state[2], &state[3], &state[4], &state[5], &state[6],
                        &state[7]) != 8) {
            fprintf(stderr, "state must be 8 comma-separated numbers\n");
            return 2;
        }
    }
    size_t len[2];
    unsigned char *img[2];
    for (int i = 0; i < 2; i++)
        if (!(img[i] = read_all(argv[2 + i], &len[i]))) {
            fprintf(stderr, "cannot read %s\n", argv[2 + i]);
            return 1;
        }

    molmoact_options opt;
    molmoact_options_init(&opt);
    opt.model_dir = argv[1];
    opt.inproc = inproc;
    molmoact *policy = NULL;
    molmoact_error err;
    if (molmoact_open(&opt, &policy, &err) != MOLMOACT_OK) {
        fprintf(stderr, "open: %s\n", err.message);
        return 1;
    }
    molmoact_observation obs;
    molmoact_observation_init(&obs);
    for (int i = 0; i < 2; i++) {
        obs.images[i].encoded = img[i];
        obs.images[i].encoded_len = len[i];
    }
    obs.state = state;
    obs.state_dim = 8;
    obs.task = argv[4];
    obs.have_seed = 1;
    obs.seed = 0;
    molmoact_result res;
    int rc = 0;
    if (molmoact_infer(policy, &obs, &res, &err) != MOLMOACT_OK) {
        fprintf(stderr, "infer: %s\n", err.message);
        rc = 1;
    } else {
        printf("molmoact %s: action chunk [%d, %d] in %.1f ms\n", molmoact_version(), res.n_steps, res.action_dim, res.timing.total);
        for (int k = 0; k < res.n_steps; k++) {
            for (int j = 0; j < res.action_dim; j++) printf("%s%.6f", j ? " " : "", res.actions[k * res.action_dim + j]);
            printf("\n");
        }
        molmoact_result_free(&res);
    }
    if (molmoact_close(&policy) != MOLMOACT_OK) rc = 1;
    free(img[0]);
    free(img[1]);
    return rc;
}
