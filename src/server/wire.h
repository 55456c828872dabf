/* SPDX-License-Identifier: Apache-2.0 */
/* The robot-facing wire formats, mapped to and from the public API's observation and result:
 *
 *  - openpi's msgpack-numpy (openpi_client/msgpack_numpy.py): a request is a msgpack map with
 *    string keys; arrays are maps whose keys are msgpack bin (b"__ndarray__", b"data", b"dtype",
 *    b"shape"; b"__npgeneric__" for scalars), dtype strings as numpy writes them ("<f4", "|u1");
 *  - json_numpy (allenai's MolmoAct2 servers, OpenVLA's deploy.py): arrays are objects
 *    {"__numpy__": base64, "dtype": "<f4", "shape": [...]}.
 *
 * Request keys (wire.c's KEYS table): openpi's observation/image, observation/wrist_image,
 * observation/state, prompt; MolmoAct2's image, wrist_image, state, instruction (question, task),
 * images (a list of two frames), states; LeRobot's observation.images.image,
 * observation.images.wrist_image, observation.state, task; optional noise ([1, 10, 32] or
 * [10, 32]), seed, norm_tag (tag, normalization_tag), num_steps (flow steps), n_action_steps;
 * executed and rtc (the session's timeline: rows of the previous chunk executed, real-time
 * chunking on or off).
 * Other keys are ignored and listed in ma_wire_request.ignored; two keys of one role are refused.
 * A frame: an array (uint8, or float in [0, 1] or [0, 255], or integers; [H, W, C], [C, H, W],
 * [H, W], a batch of 1), nested lists, PNG/JPEG bytes, or a base64 string / data:image URL of
 * them. Every refusal names the key at fault; nothing here trusts a length it has not checked. */
#ifndef MA_SERVER_WIRE_H
#define MA_SERVER_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "molmoact.h"

/* a decoded request: the observation points into the owned buffers here */
typedef struct ma_wire_request {
    molmoact_observation obs;
    uint8_t *img[2]; /* raw frames or encoded bytes (owned copies) */
    float state[64];
    float *noise;
    char *task;
    int flip180;
    char norm_tag[64];   /* obs.norm_tag points here when the request names a tag */
    int n_action_steps;  /* the request's n_action_steps (0: the whole chunk) */
    int executed;        /* "executed": rows of the session's previous chunk run before this observation (-1: not given) */
    int rtc;             /* "rtc": guide this chunk (1), not (0), the server's --rtc (-1) */
    char session_id[72]; /* "session_id": the HTTP session (AllenAI's serve_policy.py sends it in the body) */
    char ignored[256];   /* keys the request gave that mean nothing here, comma-separated */
} ma_wire_request;

void ma_wire_request_free(ma_wire_request *r);

/* what a request is checked against: the model's dimensions */
typedef struct ma_wire_model {
    int horizon, max_action_dim, state_dim, n_steps;
} ma_wire_model;

/* msgpack-numpy request -> observation. flip180 rotates raw frames by 180 degrees. Decoding
 * costs at most ma_wire_msgpack_budget(len) (4x the message + 16 MiB), counted before any
 * allocation; values under keys that mean nothing are skipped, never unpacked. */
ma_status ma_wire_decode_msgpack(const uint8_t *buf, size_t len, int flip180, const ma_wire_model *m, ma_wire_request *out, ma_error *err);
/* json_numpy request -> observation; parsing costs at most 4x the body + 4 MiB (server/json.h) */
ma_status ma_wire_decode_json(const char *buf, size_t len, int flip180, const ma_wire_model *m, ma_wire_request *out, ma_error *err);

/* a checked walk over msgpack bytes: one complete object, every length within the buffer, at
 * most `max_depth` levels; 0 when well formed. Guards msgpack-c against claims of huge maps. */
int ma_wire_msgpack_sane(const uint8_t *buf, size_t len, int max_depth);
/* what decoding a msgpack message of len bytes may allocate: 4 * len + 16 MiB */
size_t ma_wire_msgpack_budget(size_t len);

/* the growing output buffer the encoders write to (malloc'd data). max: the most it may hold (0:
 * no bound but memory); a write that does not fit fails the whole message (failed), never leaves
 * a hole that later writes would close over */
typedef struct ma_wire_buf {
    uint8_t *data;
    size_t len, cap, max;
    int failed;
} ma_wire_buf;

/* the openpi reply: actions (msgpack-numpy float32 [n, d]), policy_timing, server_timing */
ma_status ma_wire_encode_reply(const molmoact_result *res, double server_infer_ms, double prev_total_ms, ma_wire_buf *out, ma_error *err);
/* the metadata sent once on connect: a msgpack map of string -> (string | int | map) */
ma_status ma_wire_encode_metadata(const molmoact_info *info, const char *model_name, ma_wire_buf *out, ma_error *err);

#endif
