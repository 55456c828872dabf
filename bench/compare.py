# SPDX-License-Identifier: Apache-2.0
"""Side-by-side component benchmark: the PyTorch reference (fp32) and ONNX Runtime (fp32, and
4-bit MatMulNBits for action_step) on one checkpoint, with the same inputs molmoact times.

    compare.py prepare --model HF_DIR --work DIR [--seq 128] [--images 2]
        writes DIR/inputs/<session>.npz (the arrays `molmoact bench --session` reads),
        DIR/onnx/<session>.onnx (+ action_step_q4.onnx) and DIR/inputs/<session>/ raw tensors
        for the Node.js runner
    compare.py torch --model HF_DIR --work DIR [--runs N] [--threads T] [--session NAME]
        times every session (or one) in PyTorch; prints one JSON line per session

Weights are the checkpoint's, upcast to fp32 (the reference's loader); inputs are seeded random
values of the real shapes. Nothing here asserts a time: it is a measurement.
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from molmoact_ref import loader, npzio  # noqa: E402
from molmoact_ref.model import attention, expert_rope, llm_attention_bias, llm_rope, rotate_half  # noqa: E402

SESSIONS = ["vision", "llm_split0", "action_context", "action_step"]


def session_inputs(cfg, seq, images, seed=0):
    """name -> {input name: array} with the shapes and dtypes the C sessions take."""
    g = np.random.default_rng(seed)
    v, t, e = cfg["vit_config"], cfg["text_config"], cfg["action_expert_config"]
    patches = (v["image_default_input_size"][0] // v["image_patch_size"]) ** 2
    pp = 3 * v["image_patch_size"] ** 2
    layers, kvh, hd = t["num_hidden_layers"], t["num_key_value_heads"], t["head_dim"]
    eh, ehd = e["num_heads"], e["hidden_size"] // e["num_heads"]
    img = np.zeros(seq, np.uint8)
    img[4:4 + min(seq - 8, 2 * 16 + 8)] = 1     # image-structure tokens attend bidirectionally
    f32 = np.float32
    return {
        "vision": {"pixels": g.uniform(-1, 1, (images, patches, pp)).astype(f32)},
        "llm_split0": {"hidden_in": g.standard_normal((seq, t["hidden_size"])).astype(f32),
                       "image_token_mask": img, "position_ids": np.arange(seq, dtype=np.int64)},
        "action_context": {"k": g.standard_normal((layers, seq, kvh, hd)).astype(f32),
                           "v": g.standard_normal((layers, seq, kvh, hd)).astype(f32)},
        "action_step": {"x": g.standard_normal((cfg["max_action_horizon"], cfg["max_action_dim"])).astype(f32),
                        "t": np.array([STEP_T], f32),
                        "ctx_k": (g.standard_normal((layers, seq, eh, ehd)) * 0.3).astype(f32),
                        "ctx_v": g.standard_normal((layers, seq, eh, ehd)).astype(f32),
                        "cross_mask": np.ones(seq, np.uint8)},
    }


class Vision(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, pixels):
        return self.m.vision(pixels)


class LlmSplit(torch.nn.Module):
    """one split (layers [first, last)); the mask and RoPE are built inside, as the session does"""

    def __init__(self, m, cfg, first, last):
        super().__init__()
        self.m, self.t, self.first, self.last = m, cfg["text_config"], first, last

    def forward(self, hidden, image_token_mask, position_ids):
        cos, sin = llm_rope(position_ids, self.t["head_dim"], self.t["rope_theta"])
        bias, _ = llm_attention_bias(image_token_mask)
        ks, vs = [], []
        for block in self.m.model.transformer.blocks[self.first:self.last]:
            hidden, k, v = block(hidden, cos, sin, bias)
            ks.append(k)
            vs.append(v)
        return hidden, torch.stack(ks), torch.stack(vs)


def repeat_heads(x, group):
    """[kvh, S, hd] -> [kvh * group, S, hd], each head repeated in place (= repeat_interleave on
    dim 0, which torch 1.13 exports to ONNX as a broken Expand chain)"""
    kvh, s, hd = x.shape
    return x[:, None].expand(kvh, group, s, hd).reshape(kvh * group, s, hd)


def llm_block_for_export(block, x, cos, sin, bias):
    """LlmBlock.forward with the GQA head repeat written for the ONNX exporter; same math"""
    a = block.self_attn

    def attn(h):
        n = h.shape[0]
        q_dim, kv_dim = a.heads * a.head_dim, a.kv_heads * a.head_dim
        q, k, v = a.att_proj(h).split([q_dim, kv_dim, kv_dim], dim=-1)
        if a.qk_norm_type == "olmo":
            q, k = a.q_norm(q), a.k_norm(k)
        q, k, v = q.view(n, a.heads, a.head_dim), k.view(n, a.kv_heads, a.head_dim), v.view(n, a.kv_heads, a.head_dim)
        if a.qk_norm_type == "qwen3":
            q, k = a.q_norm(q), a.k_norm(k)
        q = q * cos[:, None] + rotate_half(q) * sin[:, None]
        k = k * cos[:, None] + rotate_half(k) * sin[:, None]
        g = a.heads // a.kv_heads
        out = attention(q.transpose(0, 1), repeat_heads(k.transpose(0, 1), g), repeat_heads(v.transpose(0, 1), g), bias[None])
        return a.attn_out(out.transpose(0, 1).reshape(n, q_dim)), k, v

    if block.norm_after:
        h, k, v = attn(x)
        x = x + block.attn_norm(h)
        return x + block.ff_norm(block.mlp(x)), k, v
    h, k, v = attn(block.attn_norm(x))
    x = x + h
    return x + block.mlp(block.ff_norm(x)), k, v


class LlmSplitForExport(LlmSplit):
    def forward(self, hidden, image_token_mask, position_ids):
        cos, sin = llm_rope(position_ids, self.t["head_dim"], self.t["rope_theta"])
        bias, _ = llm_attention_bias(image_token_mask)
        ks, vs = [], []
        for block in self.m.model.transformer.blocks[self.first:self.last]:
            hidden, k, v = llm_block_for_export(block, hidden, cos, sin, bias)
            ks.append(k)
            vs.append(v)
        return hidden, torch.stack(ks), torch.stack(vs)


class ActionContext(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.e = m.model.action_expert

    def forward(self, k, v):
        lyr, s = k.shape[0], k.shape[1]
        return self.e.context(k.reshape(lyr, s, -1), v.reshape(lyr, s, -1))


class ActionStep(torch.nn.Module):
    """one Euler step. The block modulations depend only on t, so (as molmoact's context does)
    they are computed once here for the benchmark's t and kept as constants: every engine then
    does the same per-step work."""

    def __init__(self, m, t):
        super().__init__()
        self.e = m.model.action_expert
        with torch.no_grad():
            block_mods, final_mod = self.e.modulations(self.e.time_conditioning(torch.tensor([t])))
        self.block_mods = [tuple(x.clone() for x in b) for b in block_mods]
        self.final_mod = tuple(x.clone() for x in final_mod)

    def forward(self, x, t, ctx_k, ctx_v, cross_mask):
        del t  # folded into the modulations
        bias = ((1.0 - cross_mask.to(torch.float32)) * torch.finfo(torch.float32).min)[None]
        rope = expert_rope(x.shape[0], self.e.head_dim) if self.e.e["rope"] else None
        h = self.e.action_embed(x[None])
        for i, block in enumerate(self.e.blocks):
            h = block(h, self.block_mods[i], ctx_k[i][None], ctx_v[i][None], bias, rope)
        return self.e.final_layer(h, self.final_mod)[0]


class StepWithoutT(torch.nn.Module):
    def __init__(self, step):
        super().__init__()
        self.step = step

    def forward(self, x, ctx_k, ctx_v, cross_mask):
        return self.step(x, None, ctx_k, ctx_v, cross_mask)


STEP_T = 0.3


def modules(model, cfg):
    n = cfg["text_config"]["num_hidden_layers"]
    per = (n + 3) // 4
    return {"vision": Vision(model), "llm_split0": LlmSplit(model, cfg, 0, per),
            "action_context": ActionContext(model), "action_step": ActionStep(model, STEP_T)}


def to_torch(arrays):
    out = []
    for a in arrays.values():
        tt = torch.from_numpy(np.ascontiguousarray(a))
        out.append(tt.bool() if a.dtype == np.uint8 else tt)
    return out


def quantise_q4(w):
    """[N, K] fp32 -> MatMulNBits blobs (uint8 [N, K/32, 16]) and scales [N * K/32], with the
    ggml Q4_0 rule (scale = signed max / -8, zero point 8), low nibble first."""
    n, k = w.shape
    b = w.reshape(n, k // 32, 32)
    idx = np.abs(b).argmax(-1)
    mx = np.take_along_axis(b, idx[..., None], -1)[..., 0]
    d = mx / -8.0
    inv = np.where(d != 0, 1.0 / np.where(d != 0, d, 1), 0)
    q = np.clip(np.floor(b * inv[..., None] + 8.5), 0, 15).astype(np.uint8)
    blob = q[..., 0::2] | (q[..., 1::2] << 4)
    return blob, d.astype(np.float32).reshape(-1)


def to_matmul_nbits(src, dst):
    """every MatMul whose weight is an initializer [K, N] with K % 32 == 0 -> com.microsoft
    MatMulNBits (4 bits, blocks of 32); returns how many were replaced"""
    import onnx
    from onnx import helper, numpy_helper
    m = onnx.load(src)
    g = m.graph
    inits = {i.name: i for i in g.initializer}
    new_nodes, replaced, drop = [], 0, set()
    for node in g.node:
        w = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if w is None or len(w.dims) != 2 or w.dims[0] % 32:
            new_nodes.append(node)
            continue
        wt = numpy_helper.to_array(w).T.astype(np.float32)   # [N, K]
        n, k = wt.shape
        blob, scales = quantise_q4(wt)
        bname, sname = node.input[1] + "_q4", node.input[1] + "_scales"
        g.initializer.extend([numpy_helper.from_array(blob, bname), numpy_helper.from_array(scales, sname)])
        drop.add(node.input[1])
        new_nodes.append(helper.make_node("MatMulNBits", [node.input[0], bname, sname], list(node.output),
                                          domain="com.microsoft", K=k, N=n, bits=4, block_size=32,
                                          name=(node.name or "mm") + "_q4"))
        replaced += 1
    keep = [i for i in g.initializer if i.name not in drop]
    del g.initializer[:]
    g.initializer.extend(keep)
    del g.node[:]
    g.node.extend(new_nodes)
    if not any(o.domain == "com.microsoft" for o in m.opset_import):
        m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(m, dst)
    return replaced


def write_raw(arrays, folder):
    """the inputs as raw little-endian files + manifest.json for bench/ort_bench.js"""
    os.makedirs(folder, exist_ok=True)
    manifest = []
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        kind = {np.float32: "float32", np.int64: "int64", np.uint8: "bool"}[a.dtype.type]
        a.tofile(os.path.join(folder, name + ".bin"))
        manifest.append({"name": name, "type": kind, "dims": list(a.shape)})
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        json.dump(manifest, f)


def cmd_prepare(a):
    cfg, model = loader.load(a.model)
    ins = session_inputs(cfg, a.seq, a.images)
    mods = modules(model, cfg)
    os.makedirs(os.path.join(a.work, "inputs"), exist_ok=True)
    os.makedirs(os.path.join(a.work, "onnx"), exist_ok=True)
    for name in SESSIONS:
        npzio.save(os.path.join(a.work, "inputs", name + ".npz"), ins[name])
        write_raw(ins[name], os.path.join(a.work, "inputs", name))
        path = os.path.join(a.work, "onnx", name + ".onnx")
        mod, arrays = mods[name], dict(ins[name])
        if name == "action_step":   # t is folded into the modulations: the graph has no t input
            mod, _ = StepWithoutT(mod), arrays.pop("t")
        if name == "llm_split0":
            ref = mod
            mod = LlmSplitForExport(ref.m, cfg, ref.first, ref.last)
            with torch.no_grad():   # the export form computes what the reference computes
                for want, got in zip(ref(*to_torch(arrays)), mod(*to_torch(arrays))):
                    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        with torch.no_grad():
            torch.onnx.export(mod, tuple(to_torch(arrays)), path, opset_version=17,
                              input_names=list(arrays), do_constant_folding=True)
        print(f"exported {path}", file=sys.stderr)
    n = to_matmul_nbits(os.path.join(a.work, "onnx", "action_step.onnx"),
                        os.path.join(a.work, "onnx", "action_step_q4.onnx"))
    print(f"action_step_q4.onnx: {n} MatMul -> MatMulNBits", file=sys.stderr)


def cmd_torch(a):
    torch.set_num_threads(a.threads)
    cfg, model = loader.load(a.model)
    mods = modules(model, cfg)
    order = session_inputs(cfg, 1, 1)
    for name in ([a.session] if a.session else SESSIONS):
        z = np.load(os.path.join(a.work, "inputs", name + ".npz"))
        args = to_torch({k: z[k] for k in order[name]})   # the forward's argument order
        times = []
        with torch.no_grad():
            for i in range(a.runs + 1):
                t0 = time.perf_counter()
                mods[name](*args)
                if i:
                    times.append((time.perf_counter() - t0) * 1e3)
        print(json.dumps({"engine": "pytorch", "session": name, "median_ms": statistics.median(times),
                          "min_ms": min(times), "runs": a.runs, "threads": a.threads}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--model", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--images", type=int, default=2)
    t = sub.add_parser("torch")
    t.add_argument("--model", required=True)
    t.add_argument("--work", required=True)
    t.add_argument("--runs", type=int, default=5)
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--session", choices=SESSIONS, help="only this one (default: all)")
    a = ap.parse_args()
    {"prepare": cmd_prepare, "torch": cmd_torch}[a.cmd](a)


if __name__ == "__main__":
    main()
