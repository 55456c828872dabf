#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Write stand-in QNN context binaries (tests/qnn_stub/qnn_stub.c reads them) for a molmoact
context directory: CTX_DIR/ctx/<session>_socid77_archv73.bin, one graph each, whose tensors have
the session's names (or other names), fixed shapes (prompt length --seq) and the I/O types asked.

  make_contexts.py CTX_DIR --golden GOLDEN_DIR --seq N [--io float32|float16|ufixed16]
                   [--rename] [--extra-input SESSION] [--wrong-dim SESSION]

Shapes come from the golden's session I/O (its prompt length replaced by --seq); ufixed16 scales
and offsets span each tensor's golden range with a margin, as a calibrated HTP graph's would."""
import argparse
import json
import os

import numpy as np

# (session, golden file, inputs, outputs); the axis that is the prompt length per tensor
SESSIONS = [
    ("vision", "vision_io", ["pixels"], ["image_features"]),
    ("llm_split0", "llm_split0_io", ["hidden_in", "image_token_mask", "position_ids"], ["hidden_out", "k", "v"]),
    ("llm_split1", "llm_split1_io", ["hidden_in", "image_token_mask", "position_ids"], ["hidden_out", "k", "v"]),
    ("llm_split2", "llm_split2_io", ["hidden_in", "image_token_mask", "position_ids"], ["hidden_out", "k", "v"]),
    ("llm_split3", "llm_split3_io", ["hidden_in", "image_token_mask", "position_ids"], ["hidden_out", "k", "v"]),
    ("action_context", "action_context_io", ["k", "v"], ["ctx_k", "ctx_v"]),
    ("action_step", "action_step_io", ["x", "t", "ctx_k", "ctx_v", "cross_mask"], ["velocity"]),
]
SEQ_AXIS = {"hidden_in": 0, "image_token_mask": 0, "position_ids": 0, "hidden_out": 0, "k": 1, "v": 1,
            "ctx_k": 1, "ctx_v": 1, "cross_mask": 0}


def tensor(name, arr, seq, io, session, rename, index, kind):
    shape = list(arr.shape)
    if session == "action_step" and name in ("x", "t"):  # golden holds every Euler step
        shape = shape[1:] if name == "x" else [1]
    if session == "action_step" and name == "velocity":
        shape = shape[1:]
    if name in SEQ_AXIS and session != "vision":
        shape[SEQ_AXIS[name]] = seq
    if arr.dtype == np.uint8:
        dtype = "bool8"
    elif arr.dtype == np.int64:
        dtype = "int64"
    elif name == "t":  # the flow time picks a precomputed embedding: it stays exact (fp32)
        dtype = "float32"
    else:
        dtype = io
    t = {"name": f"{kind}_{index}" if rename else name, "dims": shape, "dtype": dtype}
    if dtype == "ufixed16":
        lo, hi = float(arr.min()), float(arr.max())
        span = max(hi - lo, 1e-6)
        lo, hi = lo - 0.05 * span - 1e-3, hi + 0.05 * span + 1e-3
        scale = (hi - lo) / 65535.0
        t["scale"] = scale
        t["offset"] = int(round(lo / scale))
    return t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ctx_dir")
    ap.add_argument("--golden", required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--io", default="float32", choices=["float32", "float16", "ufixed16"])
    ap.add_argument("--rename", action="store_true")
    ap.add_argument("--extra-input")
    ap.add_argument("--wrong-dim")
    ap.add_argument("--out", help="directory for ctx/ (default CTX_DIR)")
    a = ap.parse_args()
    out = os.path.join(a.out or a.ctx_dir, "ctx")
    os.makedirs(out, exist_ok=True)
    model = os.path.abspath(a.ctx_dir)
    for session, gfile, ins, outs in SESSIONS:
        z = np.load(os.path.join(a.golden, gfile + ".npz"))
        desc = {"graph": session + "_graph", "session": session, "model": model,
                "inputs": [tensor(n, z[n], a.seq, a.io, session, a.rename, i, "in") for i, n in enumerate(ins)],
                "outputs": [tensor(n, z[n], a.seq, a.io, session, a.rename, i, "out") for i, n in enumerate(outs)]}
        if session == a.extra_input:
            desc["inputs"].append({"name": "extra", "dims": [1], "dtype": "float32"})
        if session == a.wrong_dim:
            desc["inputs"][0]["dims"][-1] += 1
        with open(os.path.join(out, f"{session}_socid77_archv73.bin"), "wb") as f:
            f.write(b"MA-QNN-STUB 1\n" + json.dumps(desc).encode())


if __name__ == "__main__":
    main()
