#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Write stand-in QNN context binaries (tests/qnn_stub/qnn_stub.c reads them) for a molmoact
context directory: CTX_DIR/ctx/<session>_socid77_archv73.bin, one graph each, whose tensors have
the session's names (or other names), fixed shapes (prompt length --seq) and the I/O types asked.

  make_contexts.py CTX_DIR --golden GOLDEN_DIR --seq N [--io float32|float16|ufixed16|ufixed8]
                   [--rename] [--extra-input SESSION] [--wrong-dim SESSION]
                   [--encoding ENC[:SESSION]]... [--decoy-graph SESSION]... [--graphs-form]
                   [--combine NAME=SESSION,SESSION...]... [--soc-model N] [--graph-name SESSION=NAME]...

Shapes come from the golden's session I/O (its prompt length replaced by --seq); fixed-point scales
and offsets span each tensor's golden range with a margin, as a calibrated HTP graph's would.

A file holds {"graph", "session", "model", "inputs", "outputs"} (one graph), or with --graphs-form,
--decoy-graph or --combine {"model", "graphs": [{"graph", "session", "inputs", "outputs"}...]}.
--encoding gives the fixed-point tensors (of SESSION, or all) another quantization encoding:
scale_offset (default), bw_scale_offset, axis_scale_offset and bw_axis_scale_offset (per channel of
the last axis), block (one block: the whole tensor), blockwise_expansion and vector (described
only; the stand-in refuses to execute them). --decoy-graph puts a second graph first in SESSION's
file, "<SESSION>_decoy_graph" with tensors named decoy_*, so only a client that retrieves the graph
by name and strides the graph-info array correctly finds the real one. --combine writes
ctx/NAME.bin besides, holding the graphs of the sessions listed. --graph-name gives SESSION's graph
another name than "<SESSION>_graph" (up to 255 bytes)."""
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


def quant_range(a):
    lo, hi = float(a.min()), float(a.max())
    span = max(hi - lo, 1e-6)
    return lo - 0.05 * span - 1e-3, hi + 0.05 * span + 1e-3


def encode(t, arr, encoding):
    """scale/offset (or per-channel scales/offsets) for fixed-point tensor t from its golden data"""
    levels = 65535.0 if t["dtype"] == "ufixed16" else 255.0
    bits = 16 if t["dtype"] == "ufixed16" else 8
    a = np.asarray(arr, dtype=np.float64)
    if encoding in ("scale_offset", "bw_scale_offset", "block"):
        lo, hi = quant_range(a)
        scale = (hi - lo) / levels
        if encoding == "block":
            t.update(encoding="block", block_size=list(t["dims"]), scales=[scale], offsets=[int(round(lo / scale))])
            return
        t["scale"], t["offset"] = scale, int(round(lo / scale))
        if encoding == "bw_scale_offset":
            t.update(encoding=encoding, bitwidth=bits)
        return
    # per channel of the last axis
    ch = t["dims"][-1]
    flat = a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1)
    scales, offsets = [], []
    for c in range(ch):
        col = flat[:, c % flat.shape[1]]
        lo, hi = quant_range(col)
        s = (hi - lo) / levels
        scales.append(s)
        offsets.append(int(round(lo / s)))
    t.update(encoding=encoding, axis=len(t["dims"]) - 1, scales=scales, offsets=offsets)
    if encoding in ("bw_axis_scale_offset", "vector"):
        t["bitwidth"] = bits
    if encoding == "blockwise_expansion":
        t.update(blocks_per_axis=1, block_scale_bitwidth=4)


def tensor(name, arr, seq, io, session, rename, index, kind, encoding=None):
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
    if dtype in ("ufixed16", "ufixed8"):
        encode(t, arr, encoding or "scale_offset")
    return t


def encoding_for(encodings, session):
    """the --encoding that applies to session: ENC:SESSION first, then a bare ENC"""
    for e in encodings:
        if ":" in e and e.split(":", 1)[1] == session:
            return e.split(":", 1)[0]
    for e in encodings:
        if ":" not in e:
            return e
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ctx_dir")
    ap.add_argument("--golden", required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--io", default="float32", choices=["float32", "float16", "ufixed16", "ufixed8"])
    ap.add_argument("--rename", action="store_true")
    ap.add_argument("--extra-input")
    ap.add_argument("--wrong-dim")
    ap.add_argument("--out", help="directory for ctx/ (default CTX_DIR)")
    ap.add_argument("--encoding", action="append", default=[], help="ENC[:SESSION], see above")
    ap.add_argument("--decoy-graph", action="append", default=[], metavar="SESSION")
    ap.add_argument("--graphs-form", action="store_true", help='write every file as {"model", "graphs": [...]}')
    ap.add_argument("--combine", action="append", default=[], metavar="NAME=SESSION,SESSION...")
    ap.add_argument("--soc-model", type=int, help="soc_model recorded in the files")
    ap.add_argument("--graph-name", action="append", default=[], metavar="SESSION=NAME")
    a = ap.parse_args()
    encs = ("scale_offset", "bw_scale_offset", "axis_scale_offset", "bw_axis_scale_offset", "block",
            "blockwise_expansion", "vector")
    for e in a.encoding:
        if e.split(":", 1)[0] not in encs:
            ap.error(f"--encoding {e}: one of {', '.join(encs)}")
    names = dict(g.split("=", 1) for g in a.graph_name if "=" in g)
    if len(names) != len(a.graph_name) or any(not n or len(n.encode()) > 255 for n in names.values()):
        ap.error("--graph-name SESSION=NAME, a name of 1 to 255 bytes")
    out = os.path.join(a.out or a.ctx_dir, "ctx")
    os.makedirs(out, exist_ok=True)
    model = os.path.abspath(a.ctx_dir)
    graphs = {}
    for session, gfile, ins, outs in SESSIONS:
        z = np.load(os.path.join(a.golden, gfile + ".npz"))
        enc = encoding_for(a.encoding, session)
        desc = {"graph": names.get(session, session + "_graph"), "session": session,
                "inputs": [tensor(n, z[n], a.seq, a.io, session, a.rename, i, "in", enc) for i, n in enumerate(ins)],
                "outputs": [tensor(n, z[n], a.seq, a.io, session, a.rename, i, "out", enc) for i, n in enumerate(outs)]}
        if session == a.extra_input:
            desc["inputs"].append({"name": "extra", "dims": [1], "dtype": "float32"})
        if session == a.wrong_dim:
            desc["inputs"][0]["dims"][-1] += 1
        graphs[session] = desc
        listed = [desc]
        if session in a.decoy_graph:
            decoy = json.loads(json.dumps(desc))
            decoy["graph"] = session + "_decoy_graph"
            for t in decoy["inputs"] + decoy["outputs"]:
                t["name"] = "decoy_" + t["name"]
            listed = [decoy, desc]
        if a.graphs_form or len(listed) > 1:
            doc = {"model": model, "graphs": listed}
        else:
            doc = {"graph": desc["graph"], "session": session, "model": model,
                   "inputs": desc["inputs"], "outputs": desc["outputs"]}
        write(out, f"{session}_socid77_archv73.bin", doc, a.soc_model)
    for c in a.combine:
        name, _, sessions = c.partition("=")
        missing = [s for s in sessions.split(",") if s not in graphs]
        if not name or not sessions or missing:
            ap.error(f"--combine {c}: NAME=SESSION,SESSION... of {', '.join(graphs)}")
        write(out, f"{name}.bin", {"model": model, "graphs": [graphs[s] for s in sessions.split(",")]}, a.soc_model)


def write(out, filename, doc, soc_model):
    if soc_model is not None:
        doc["soc_model"] = soc_model
    with open(os.path.join(out, filename), "wb") as f:
        f.write(b"MA-QNN-STUB 1\n" + json.dumps(doc).encode())


if __name__ == "__main__":
    main()
