#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""ONNX graphs of the seven sessions, the input of the QNN toolchain (qairt-converter, then
qnn-context-binary-generator; README "Run on the NPU"): static shapes, input and output names
exactly those of src/runtime/session.h, opset 17 (GridSample needs 16).

    export_onnx.py --model HF_DIR -o DIR [--prompt-seq 128] [--images 2]
                   [--verify NODE_MODULES_DIR] [--sessions vision,llm_split0,...]

Writes DIR/<session>.onnx and DIR/inputs/<session>/ (seeded inputs of the real shapes, raw
little-endian + manifest.json). With --verify, every graph runs in ONNX Runtime (npm
onnxruntime-node, CPU) on those inputs and each output is compared with the PyTorch reference
(fp32): the cosines go to DIR/verify.json, and any below 0.99999 fails the command.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
from molmoact_ref import loader  # noqa: E402
from molmoact_ref.model import llm_attention_bias, llm_rope  # noqa: E402
import compare  # noqa: E402  (the export forms of the sessions, shared with the benchmark)

SESSIONS = ["vision", "llm_split0", "llm_split1", "llm_split2", "llm_split3", "action_context", "action_step"]
OUTPUTS = {"vision": ["image_features"], "action_context": ["ctx_k", "ctx_v"], "action_step": ["velocity"]}
GATE = 0.99999


class LlmSplit(torch.nn.Module):
    """layers [first, last) in the exporter's form (GQA head repeat without repeat_interleave)"""

    def __init__(self, m, cfg, first, last):
        super().__init__()
        self.m, self.t, self.first, self.last = m, cfg["text_config"], first, last

    def forward(self, hidden_in, image_token_mask, position_ids):
        cos, sin = llm_rope(position_ids, self.t["head_dim"], self.t["rope_theta"])
        bias, _ = llm_attention_bias(image_token_mask)
        ks, vs = [], []
        hidden = hidden_in
        for block in self.m.model.transformer.blocks[self.first:self.last]:
            hidden, k, v = compare.llm_block_for_export(block, hidden, cos, sin, bias)
            ks.append(k)
            vs.append(v)
        return hidden, torch.stack(ks), torch.stack(vs)


class ActionStep(torch.nn.Module):
    """one Euler step with t an input (the modulations computed from it in the graph)"""

    def __init__(self, m):
        super().__init__()
        self.e = m.model.action_expert

    def forward(self, x, t, ctx_k, ctx_v, cross_mask):
        bias = ((1.0 - cross_mask.to(torch.float32)) * torch.finfo(torch.float32).min)[None]
        return self.e.step(x[None], t, ctx_k[:, None], ctx_v[:, None], bias)[0]


def splits(layers):
    """the four layer ranges (src/model/hostglue.c ma_split_ranges)"""
    base, extra, at, out = layers // 4, layers % 4, 0, []
    for i in range(4):
        n = base + (1 if i < extra else 0)
        out.append((at, at + n))
        at += n
    return out


def inputs_for(cfg, seq, images):
    ins = compare.session_inputs(cfg, seq, images)
    g = np.random.default_rng(7)
    out = {"vision": ins["vision"], "action_context": ins["action_context"], "action_step": dict(ins["action_step"])}
    out["action_step"]["t"] = np.array([0.3], np.float32)
    for i in range(4):
        d = dict(ins["llm_split0"])
        d["hidden_in"] = g.standard_normal(d["hidden_in"].shape).astype(np.float32)
        out[f"llm_split{i}"] = d
    return out


def module_for(name, model, cfg):
    if name == "vision":
        return compare.Vision(model)
    if name == "action_context":
        return compare.ActionContext(model)
    if name == "action_step":
        return ActionStep(model)
    i = int(name[-1])
    first, last = splits(cfg["text_config"]["num_hidden_layers"])[i]
    return LlmSplit(model, cfg, first, last)


def output_names(name):
    return OUTPUTS.get(name, ["hidden_out", "k", "v"])


def to_torch(arrays):
    return [torch.from_numpy(np.ascontiguousarray(a)).bool() if a.dtype == np.uint8 else torch.from_numpy(np.ascontiguousarray(a))
            for a in arrays.values()]


def cosine(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return 1.0 if na == 0 and nb == 0 else float(a @ b / (na * nb))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--prompt-seq", type=int, default=128)
    ap.add_argument("--images", type=int, default=2)
    ap.add_argument("--verify", metavar="NODE_MODULES_DIR")
    ap.add_argument("--sessions", default=",".join(SESSIONS))
    a = ap.parse_args()
    torch.manual_seed(0)
    cfg, model = loader.load(a.model)
    model.eval()
    ins = inputs_for(cfg, a.prompt_seq, a.images)
    os.makedirs(a.out, exist_ok=True)
    report, worst = {}, 1.0
    for name in a.sessions.split(","):
        if name not in SESSIONS:
            sys.exit(f"export_onnx: unknown session {name} ({', '.join(SESSIONS)})")
        mod, arrays = module_for(name, model, cfg), ins[name]
        path = os.path.join(a.out, name + ".onnx")
        with torch.no_grad():
            ref = mod(*to_torch(arrays))
            ref = [ref] if isinstance(ref, torch.Tensor) else list(ref)
            torch.onnx.export(mod, tuple(to_torch(arrays)), path, opset_version=17, input_names=list(arrays),
                              output_names=output_names(name), do_constant_folding=True)
        folder = os.path.join(a.out, "inputs", name)
        compare.write_raw(arrays, folder)
        print(f"exported {path}", file=sys.stderr)
        if not a.verify:
            continue
        got_dir = os.path.join(a.out, "ort", name)
        env = dict(os.environ, NODE_PATH=a.verify)
        subprocess.run(["node", os.path.join(HERE, "ort_run.js"), path, folder, got_dir], check=True, env=env)
        with open(os.path.join(got_dir, "manifest.json")) as f:
            man = {m["name"]: m for m in json.load(f)}
        rows = {}
        for oname, want in zip(output_names(name), ref):
            m = man[oname]
            got = np.fromfile(os.path.join(got_dir, oname + ".bin"), np.float32).reshape(m["dims"])
            if list(got.shape) != list(want.shape):
                sys.exit(f"export_onnx: {name}.{oname}: ONNX Runtime gives {list(got.shape)}, the reference {list(want.shape)}")
            c = cosine(got, want.numpy())
            rows[oname] = {"cosine": c, "max_abs_diff": float(np.abs(got - want.numpy()).max()), "shape": list(got.shape)}
            worst = min(worst, c)
            print(f"  {name:15s} {oname:15s} cosine {c:.9f}", file=sys.stderr)
        report[name] = rows
    if a.verify:
        with open(os.path.join(a.out, "verify.json"), "w") as f:
            json.dump({"gate": GATE, "prompt_seq": a.prompt_seq, "images": a.images, "sessions": report}, f, indent=1)
        if worst < GATE:
            sys.exit(f"export_onnx: an output's cosine {worst:.9f} is below {GATE}")


if __name__ == "__main__":
    main()
