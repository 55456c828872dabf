/* SPDX-License-Identifier: Apache-2.0 */
/* LeRobot's async-inference payloads, read without executing anything (issue 39).
 *
 * LeRobot's policy server and robot client exchange pickles of small dataclasses
 * (lerobot/async_inference/helpers.py: RemotePolicyConfig, TimedObservation, TimedAction) holding
 * dicts, lists, strings, numbers and NumPy arrays. Unpickling them with Python's pickle runs any
 * callable the sender names (lerobot #3047, CVE-2026-25874). This reader is a bounded stack
 * machine over the opcodes those payloads use: GLOBAL / STACK_GLOBAL only resolve names of an
 * allowlist, each interpreted as a data constructor (a dataclass instance becomes an object with
 * its state dict; NumPy's array reconstruction becomes an array of known dtype and shape); any
 * other name, opcode, depth or size is refused with a message naming it, and nothing is called.
 *
 * The same tree is built from the pickle-free format proposed in lerobot PR #3048 (a 4-byte
 * big-endian JSON length, the JSON, then safetensors bytes); a payload's first byte tells them
 * apart (a pickle starts with 0x80, PROTO; a #3048 payload with 0x00, the length's high byte).
 *
 * Every allocation of one decode counts against its budget (bytes) before it is made. */
#ifndef MA_SERVER_PICKLE_H
#define MA_SERVER_PICKLE_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef enum {
    MA_PK_NONE,
    MA_PK_BOOL,   /* i */
    MA_PK_INT,    /* i (Python ints beyond int64 are refused) */
    MA_PK_FLOAT,  /* f (a NumPy float scalar becomes one too) */
    MA_PK_STR,    /* s, len: UTF-8, NUL-terminated */
    MA_PK_BYTES,  /* s, len: bytes / bytearray */
    MA_PK_LIST,   /* items, n */
    MA_PK_TUPLE,  /* items, n */
    MA_PK_DICT,   /* keys, items, n (keys in insertion order; a repeated key keeps its last value) */
    MA_PK_OBJECT, /* cls (an allowlisted "module.QualName"), state: its __dict__ (MA_PK_DICT; NULL if the
                     pickle never BUILDs it) */
    MA_PK_ARRAY   /* dtype, ndim, shape, data (C order, little endian, nbytes; aligned for any element
                     type). Fortran-order arrays are transposed, big-endian ones swapped. */
} ma_pk_kind;

/* array element types (NumPy's dtype strings "|u1", "<f4", ...) */
typedef enum { MA_PK_U8, MA_PK_I8, MA_PK_U16, MA_PK_I16, MA_PK_I32, MA_PK_I64, MA_PK_F16, MA_PK_F32, MA_PK_F64, MA_PK_BOOL8 } ma_pk_dtype;

typedef struct ma_pk {
    ma_pk_kind kind;
    int64_t i;
    double f;
    const char *s;
    size_t len;
    struct ma_pk **items;
    struct ma_pk **keys;
    size_t n;
    const char *cls;
    struct ma_pk *state;
    ma_pk_dtype dtype;
    int ndim;
    int64_t shape[8];
    const void *data;
    size_t nbytes;
} ma_pk;

typedef struct ma_pk_doc ma_pk_doc; /* owns every node and buffer of one decode */

typedef struct ma_pk_limits {
    size_t budget;    /* bytes the decode may allocate (nodes, strings, arrays) */
    int max_depth;    /* nesting of containers / objects (e.g. 32) */
    size_t max_items; /* elements of one container (e.g. 1 << 20) */
} ma_pk_limits;

/* a pickle (protocols 2..5) or a PR #3048 payload -> a tree. On failure *out is NULL and err
 * names the opcode / global / key and the byte offset.
 * - Values may be shared (a pickle's memo): the same node under two parents. The tree has no
 *   cycles (a container stored somewhere cannot change afterwards), its depth is at most
 *   max_depth, and walked as a tree (shared values once per place) it has at most
 *   budget / sizeof(ma_pk) nodes.
 * - torch tensors (what LeRobot's own policy server sends) are refused, naming torch; the reader
 *   takes torch.from_numpy(numpy.frombuffer(..)) (what ma_pk_write_actions writes) as the array.
 * - PR #3048 payloads give the same objects as the pickles (RemotePolicyConfig, TimedObservation
 *   with tensors in `observation`, a list of TimedAction), except that what JSON cannot tell
 *   apart comes as JSON has it: a feature's "shape" is a MA_PK_LIST where a pickle has a
 *   MA_PK_TUPLE; a dict key is always a str. A JSON number with '.', 'e' or 'E' is a float, else
 *   an int; JSON's NaN / Infinity (which Python's json writes) are refused. */
ma_status ma_pk_decode(const uint8_t *buf, size_t len, const ma_pk_limits *lim, ma_pk_doc **out, ma_error *err);
const ma_pk *ma_pk_root(const ma_pk_doc *d);
size_t ma_pk_used(const ma_pk_doc *d);
void ma_pk_free(ma_pk_doc *d);

/* helpers for readers of the tree: a dict's value under a string key (NULL if absent), an
 * object's state value */
const ma_pk *ma_pk_get(const ma_pk *dict, const char *key);
const ma_pk *ma_pk_attr(const ma_pk *obj, const char *key);
size_t ma_pk_dtype_size(ma_pk_dtype t);

/* The reply: a pickle of list[TimedAction] that LeRobot's client unpickles (pickle.loads) into
 * TimedAction(timestamp, timestep, action: a float32 CPU torch tensor of `dim` values) per row.
 * Row i: timestamp t0 + i * dt, timestep step0 + i, action rows[i * dim .. + dim). Each tensor
 * is built as torch.from_numpy(numpy.frombuffer(bytearray, "<f4")) (protocol 5): no legacy
 * torch.save blob, writable, deterministic. Returns the malloc'd bytes (NULL on out of memory,
 * or when the size would pass max). */
uint8_t *ma_pk_write_actions(const float *rows, int n, int dim, double t0, double dt, int64_t step0, size_t max, size_t *len);
/* the same reply in PR #3048's format (JSON header + safetensors action_0..action_{n-1}); NULL
 * also for a non-finite timestamp (JSON has none) */
uint8_t *ma_pk_write_actions_safe(const float *rows, int n, int dim, double t0, double dt, int64_t step0, size_t max, size_t *len);

#endif
