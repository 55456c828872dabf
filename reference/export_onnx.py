#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""ONNX graphs of the seven sessions, the input of the QNN toolchain (qairt-converter, then
qnn-context-binary-generator; README.md "Run on the NPU"), laid out as the reference deployment's
onnx/ folder: one folder per component, opset 20, large weights as external data beside the graph.
Static shapes; input and output names exactly those of src/runtime/session.h.

    export_onnx.py --model HF_DIR -o DIR [--prompt-seq 128] [--images 2] [--opset 20|17]
                   [--external-data auto|always|never] [--streaming] [--verify NODE_MODULES_DIR]
                   [--sessions vision,llm_split0,...,llm,vision_fused,action_step_fused]

Writes DIR/<name>/<name>.onnx (+ <name>.onnx.data) and DIR/inputs/<name>/ (seeded inputs of the
real shapes, raw little-endian + manifest.json) for each name:
  vision, llm_split0..3, action_context, action_step   the seven sessions, the ones compiled
  llm                 every LLM layer in one graph (a reference, as the deployment ships it)
  vision_fused        ViT blocks' wq/wk/wv, the pooling's wk/wv and the projector's w1/w3, each
                      group as one MatMul over the concatenated weights and a Split
  action_step_fused   the expert MLPs' gate_proj/up_proj likewise
--external-data auto writes a graph's weights beside it where protobuf's 2 GiB could not hold them
(at full size the LLM graphs; vision and action_step, 1.6 and 1.8 GiB in fp32, stay inside. The
deployment's vision.onnx is self-contained too; its action_step has its weights beside it:
--external-data always does that).
--streaming reads only the graph's own weights from the checkpoint, one graph at a time: how a
full-size model is exported within a workstation's memory. `llm` is then made of the four split
graphs (compose_llm: no weight read into memory) and checked against the splits' references
computed in turn.

torch.onnx.export here (Debian's torch 1.13) writes opset 17; --opset 20 carries each graph to 20
by the rules of upgrade_opset(), which refuses an operator it has no rule for. With --verify every
graph runs in ONNX Runtime (npm onnxruntime-node, CPU) on those inputs, each output is compared
with the PyTorch reference (fp32), and a fused graph also with its unfused twin (max |diff|): the
results go to DIR/verify.json, and a cosine below 0.99999 fails the command.
"""
import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
from molmoact_ref import config as cfglib  # noqa: E402
from molmoact_ref import loader, streaming  # noqa: E402
from molmoact_ref import model as refmodel  # noqa: E402
from molmoact_ref.model import llm_attention_bias, llm_rope  # noqa: E402
import compare  # noqa: E402  (the export forms of the sessions, shared with the benchmark)

SESSIONS = ["vision", "llm_split0", "llm_split1", "llm_split2", "llm_split3", "action_context", "action_step"]
FUSED = {"vision_fused": "vision", "action_step_fused": "action_step"}
NAMES = SESSIONS + ["llm"] + list(FUSED)
OUTPUTS = {"vision": ["image_features"], "action_context": ["ctx_k", "ctx_v"], "action_step": ["velocity"]}
GATE = 0.99999
EXTERNAL_AUTO = (2 << 30) - (64 << 20)  # weights from which --external-data auto writes them beside the graph


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
    out["llm"] = out["llm_split0"]
    for fused, base in FUSED.items():
        out[fused] = out[base]
    return out


def module_for(name, model, cfg):
    name = FUSED.get(name, name)
    if name == "vision":
        return compare.Vision(model)
    if name == "action_context":
        return compare.ActionContext(model)
    if name == "action_step":
        return ActionStep(model)
    if name == "llm":
        return LlmSplit(model, cfg, 0, cfg["text_config"]["num_hidden_layers"])
    i = int(name[-1])
    first, last = splits(cfg["text_config"]["num_hidden_layers"])[i]
    return LlmSplit(model, cfg, first, last)


def parts_for(name, cfg):
    """the checkpoint tensors a graph reads (by name prefix), for --streaming"""
    name = FUSED.get(name, name)
    if name == "vision":
        return ["model.vision_backbone."]
    if name == "action_context":
        return ["model.action_expert.context_k_proj.", "model.action_expert.context_v_proj."]
    if name == "action_step":
        return ["model.action_expert."]
    if name == "llm":
        return ["model.transformer.blocks."]
    first, last = splits(cfg["text_config"]["num_hidden_layers"])[int(name[-1])]
    return [f"model.transformer.blocks.{j}." for j in range(first, last)]


def output_names(name):
    return OUTPUTS.get(FUSED.get(name, name), ["hidden_out", "k", "v"])


# ---- fusion: parallel projections of one input as a single MatMul + Split


class _FusedGroup:
    """Linears that read the same input, computed as one product over their concatenated
    weights (a bias concatenated likewise) and split: each member returns its slice. The product
    is made again whenever a member sees another input than the last one, so a forward that
    feeds the members different tensors still gets each its own result."""

    def __init__(self, linears):
        self.linears = linears
        with torch.no_grad():  # constants of the traced graph, as the weights are
            self.weight = torch.cat([lin.weight for lin in linears], 0)
            self.bias = None
            if any(lin.bias is not None for lin in linears):
                self.bias = torch.cat([lin.bias if lin.bias is not None else torch.zeros(lin.out_features) for lin in linears])
        self.sizes = [lin.out_features for lin in linears]
        self.x, self.parts = None, None

    def member(self, i):
        def forward(x):
            if self.x is not x:
                self.x, self.parts = x, torch.split(F.linear(x, self.weight, self.bias), self.sizes, dim=-1)
            return self.parts[i]
        return forward


def fusion_groups(model, base):
    """the groups the deployment fused: vision (ViT wq/wk/wv per block, the pooling's wk/wv, the
    projector's w1/w3) and action_step (each expert MLP's gate_proj/up_proj)"""
    groups = []
    for mod in model.modules():
        if base == "vision" and isinstance(mod, refmodel.VitBlock):
            groups.append([mod.attention.wq, mod.attention.wk, mod.attention.wv])
        elif base == "vision" and isinstance(mod, refmodel.VisionBackbone):
            groups.append([mod.image_pooling_2d.wk, mod.image_pooling_2d.wv])
        elif base == "vision" and isinstance(mod, refmodel.ProjectorMlp):
            groups.append([mod.w1, mod.w3])
        elif base == "action_step" and isinstance(mod, refmodel.ExpertMlp):
            groups.append([mod.gate_proj, mod.up_proj])
    return groups


@contextlib.contextmanager
def fused(model, base):
    groups = [_FusedGroup(g) for g in fusion_groups(model, base)]
    if not groups:
        sys.exit(f"export_onnx: {base}: nothing to fuse in this model")
    try:
        for g in groups:
            for i, lin in enumerate(g.linears):
                lin.forward = g.member(i)  # an instance attribute: nn.Module's __call__ takes it
        yield len(groups)
    finally:
        for g in groups:
            for lin in g.linears:
                del lin.forward


# ---- opset 17 -> 20


# the operators the exports hold, each with what opsets 18, 19 and 20 changed in it (the ONNX
# operator changelog): "same" where only new types or optional inputs/attributes came, which
# leave a graph of ours meaning what it meant
_SAME = {"Add", "And", "Clip", "Concat", "Constant", "Cos", "Div", "Einsum", "Expand", "Gather", "Gemm",
         "LayerNormalization", "MatMul", "Mul", "Neg", "Not", "Or", "Pow", "ReduceSum", "Relu", "Round",
         "Sigmoid", "Sin", "Slice", "Softmax", "Sqrt", "Squeeze", "Sub", "Tanh", "Tile", "Transpose", "Trilu",
         "Unsqueeze", "Where", "Erf", "Gelu", "Exp", "Log", "Max", "Min", "Abs", "Floor", "Ceil", "Less",
         "Greater", "LessOrEqual", "GreaterOrEqual", "Range", "CumSum", "ArgMax", "Flatten", "Sign", "Reciprocal",
         "ScatterND", "GatherND", "GatherElements", "Xor", "Mod", "IsNaN", "IsInf", "Softplus", "Elu", "HardSigmoid",
         # 19: float8 and other new types (Cast/CastLike gained 'saturate', which acts on float8 only)
         "Cast", "CastLike", "Equal", "Identity", "Reshape", "Shape", "Size",
         # 20: new types
         "ConstantOfShape",
         # 18: Split gained the optional num_outputs (our Splits keep their 'split' input)
         "Split"}
# 18: these reductions take their axes as an input instead of an attribute
_AXES_TO_INPUT = {"ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
                  "ReduceLogSumExp", "ReduceSumSquare"}
# 20: GridSample's modes renamed (and N-d inputs allowed)
_GRID_MODES = {b"bilinear": b"linear", b"bicubic": b"cubic", b"nearest": b"nearest"}


def upgrade_opset(m, to):
    """carry a graph of the default domain from opset 17 to `to` (18-20) by the changelog's
    rules above; an operator without a rule is refused by name"""
    have = {o.domain: o.version for o in m.opset_import}
    if have.get("", have.get("ai.onnx")) != 17:
        raise ValueError(f"the graph is opset {have}, 17 expected")
    unknown = sorted({n.op_type for n in m.graph.node if n.domain in ("", "ai.onnx")} - _SAME - _AXES_TO_INPUT - {"GridSample"})
    if unknown:
        raise ValueError(f"no rule to carry {', '.join(unknown)} from opset 17 to {to}")
    for k, n in enumerate(m.graph.node):
        if n.op_type in _AXES_TO_INPUT and to >= 18:
            axes = [a for a in n.attribute if a.name == "axes"]
            if axes:
                name = f"{n.name or n.op_type}_axes_{k}"
                m.graph.initializer.append(numpy_helper.from_array(np.array(axes[0].ints, np.int64), name))
                n.attribute.remove(axes[0])
                n.input.append(name)
        elif n.op_type == "GridSample" and to >= 20:
            for a in n.attribute:
                if a.name == "mode":
                    if a.s not in _GRID_MODES:
                        raise ValueError(f"GridSample mode {a.s!r} has no opset-20 name")
                    a.s = _GRID_MODES[a.s]
    for o in m.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = to
    m.ir_version = max(m.ir_version, {18: 8, 19: 9, 20: 9}[to])
    return m


def weight_bytes(m):
    return sum(int(np.prod(t.dims, dtype=np.int64)) * (8 if t.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.DOUBLE) else 4)
               for t in m.graph.initializer)


def trace(name, mod, arrays, raw):
    """torch.onnx.export at opset 17 to `raw` (torch writes the weights beside it past 2 GiB)"""
    with torch.no_grad():
        torch.onnx.export(mod, tuple(to_torch(arrays)), raw, opset_version=17, input_names=list(arrays),
                          output_names=output_names(name), do_constant_folding=True)


def finish(name, raw, out_dir, opset, external):
    """the traced graph carried to `opset`, its weights placed as asked, written to
    out_dir/NAME.onnx; -> (path, weights written beside it or not)"""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name + ".onnx")
    data = name + ".onnx.data"
    for old in (path, os.path.join(out_dir, data)):
        if os.path.exists(old):
            os.unlink(old)
    m = onnx.load(raw)
    if opset != 17:
        m = upgrade_opset(m, opset)
    beside = external == "always" or (external == "auto" and weight_bytes(m) >= EXTERNAL_AUTO)
    if beside:
        onnx.save_model(m, path, save_as_external_data=True, all_tensors_to_one_file=True, location=data,
                        size_threshold=1024)
    else:
        onnx.save_model(m, path)
    return path, beside


def compose_llm(out, name="llm"):
    """the unsplit LLM as one graph made of the four split graphs already in `out`: each split's
    names prefixed, split i's hidden_in fed by split i-1's hidden_out, the K/V of all four
    concatenated. The weights are never read into memory: the splits' external data files are
    copied one after another into NAME.onnx.data and each tensor's offset moved by its file's
    start (weights held inside a split's graph stay inside). How --streaming writes `llm` at full
    size, where one export would hold all 36 layers' weights at once. -> (path, beside)"""
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    path, data = os.path.join(d, name + ".onnx"), name + ".onnx.data"
    parts = [onnx.load(os.path.join(out, f"llm_split{i}", f"llm_split{i}.onnx"), load_external_data=False) for i in range(4)]
    nodes, inits, infos, beside = [], [], [], False
    shared = {"image_token_mask", "position_ids"}
    with open(os.path.join(d, data), "wb") as dst:
        for i, m in enumerate(parts):
            def ren(x, i=i):
                if x == "" or x in shared:
                    return x
                if x == "hidden_in":
                    return x if i == 0 else f"split{i - 1}/hidden_out"
                if x == "hidden_out" and i == 3:
                    return x
                return f"split{i}/{x}"
            for n in m.graph.node:
                if any(at.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for at in n.attribute):
                    raise ValueError(f"llm_split{i}: node {n.name} holds a subgraph, which compose_llm does not rename")
                n.name = f"split{i}/{n.name}"
                n.input[:] = [ren(x) for x in n.input]
                n.output[:] = [ren(x) for x in n.output]
                nodes.append(n)
            # each of this split's data files appended, streamed; then its tensors' offsets moved
            starts = {}
            for t in m.graph.initializer:
                if t.data_location != onnx.TensorProto.EXTERNAL:
                    continue
                loc = next(x.value for x in t.external_data if x.key == "location")
                if loc not in starts:
                    starts[loc] = dst.tell()
                    with open(os.path.join(out, f"llm_split{i}", loc), "rb") as src:
                        shutil.copyfileobj(src, dst, 64 << 20)
                    beside = True
            for t in m.graph.initializer:
                t.name = ren(t.name)
                if t.data_location == onnx.TensorProto.EXTERNAL:
                    e = {x.key: x.value for x in t.external_data}
                    del t.external_data[:]
                    t.external_data.add(key="location", value=data)
                    t.external_data.add(key="offset", value=str(starts[e["location"]] + int(e.get("offset", "0"))))
                    t.external_data.add(key="length", value=e["length"])
                inits.append(t)
            for vi in m.graph.value_info:
                vi.name = ren(vi.name)
                infos.append(vi)
    if not beside:
        os.unlink(os.path.join(d, data))
    first, last = parts[0].graph, parts[3].graph
    layers = {o.name: o for o in first.output}
    for kv in ("k", "v"):
        nodes.append(onnx.helper.make_node("Concat", [f"split{i}/{kv}" for i in range(4)], [kv], name=f"concat_{kv}", axis=0))
    outs = []
    for o in ("hidden_out", "k", "v"):
        vi = onnx.ValueInfoProto()
        vi.CopyFrom(({x.name: x for x in last.output}["hidden_out"]) if o == "hidden_out" else layers[o])
        if o != "hidden_out":  # every layer's K/V: the four splits' layer counts summed
            n = sum({x.name: x for x in m.graph.output}[o].type.tensor_type.shape.dim[0].dim_value for m in parts)
            vi.type.tensor_type.shape.dim[0].dim_value = n
        outs.append(vi)
    g = onnx.helper.make_graph(nodes, name, list(first.input), outs, initializer=inits, value_info=infos)
    model = onnx.helper.make_model(g, opset_imports=list(parts[0].opset_import), producer_name="molmoact export_onnx compose_llm")
    model.ir_version = parts[0].ir_version
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path, beside


def chained_reference(model_dir, cfg, arrays):
    """the unsplit LLM's outputs computed split by split, each split's weights loaded in turn"""
    hidden, ks, vs = torch.from_numpy(arrays["hidden_in"]), [], []
    rest = to_torch({k: v for k, v in arrays.items() if k != "hidden_in"})
    for i in range(4):
        part = streaming.load_parts(model_dir, parts_for(f"llm_split{i}", cfg))
        first, last = splits(cfg["text_config"]["num_hidden_layers"])[i]
        with torch.no_grad():
            hidden, k, v = LlmSplit(part, cfg, first, last)(hidden, *rest)
        ks.append(k)
        vs.append(v)
        part = None
    return [hidden, torch.cat(ks), torch.cat(vs)]


def to_torch(arrays):
    return [torch.from_numpy(np.ascontiguousarray(a)).bool() if a.dtype == np.uint8 else torch.from_numpy(np.ascontiguousarray(a))
            for a in arrays.values()]


def cosine(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return 1.0 if na == 0 and nb == 0 else float(a @ b / (na * nb))


def peak_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmHWM:"))


def run_ort(node_modules, path, inputs, out):
    subprocess.run(["node", os.path.join(HERE, "ort_run.js"), path, inputs, out], check=True,
                   env=dict(os.environ, NODE_PATH=node_modules))
    with open(os.path.join(out, "manifest.json")) as f:
        return {m["name"]: np.fromfile(os.path.join(out, m["name"] + ".bin"), np.float32).reshape(m["dims"])
                for m in json.load(f)}


def export_one(a, name, cfg, model, arrays):
    """one graph traced and finished; -> (the reference's outputs, path, beside, groups fused)"""
    if a.streaming:
        model = streaming.load_parts(a.model, parts_for(name, cfg))
    mod = module_for(name, model, cfg)
    with tempfile.TemporaryDirectory(dir=a.out) as tmp:
        raw = os.path.join(tmp, name + ".onnx")
        with contextlib.ExitStack() as stack:
            groups = stack.enter_context(fused(model, FUSED[name])) if name in FUSED else 0
            with torch.no_grad():
                ref = mod(*to_torch(arrays))
            ref = [ref] if isinstance(ref, torch.Tensor) else list(ref)
            trace(name, mod, arrays, raw)
        mod = model = None  # with --streaming its weights go before the graph's copy of them is read
        path, beside = finish(name, raw, os.path.join(a.out, name), a.opset, a.external_data)
    return ref, path, beside, groups


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--prompt-seq", type=int, default=128)
    ap.add_argument("--images", type=int, default=2)
    ap.add_argument("--opset", type=int, default=20, choices=[17, 18, 19, 20])
    ap.add_argument("--external-data", default="auto", choices=["auto", "always", "never"])
    ap.add_argument("--streaming", action="store_true",
                    help="load only each graph's own weights, one graph at a time (full size)")
    ap.add_argument("--verify", metavar="NODE_MODULES_DIR")
    ap.add_argument("--sessions", default=",".join(NAMES))
    a = ap.parse_args()
    names = a.sessions.split(",")
    for name in names:
        if name not in NAMES:
            sys.exit(f"export_onnx: unknown graph {name} ({', '.join(NAMES)})")
    # a fused graph is checked against its unfused twin, and with --streaming the unsplit LLM is
    # made of the four splits: those go first
    need = {FUSED[n] for n in names if n in FUSED and a.verify}
    if a.streaming and "llm" in names:
        need |= {f"llm_split{i}" for i in range(4)}
    names = [b for b in SESSIONS if b in names or b in need] + [n for n in names if n not in SESSIONS]
    torch.manual_seed(0)
    if a.streaming:
        cfg, model = cfglib.load(os.path.join(a.model, "config.json")), None
    else:
        cfg, model = loader.load(a.model)
        model.eval()
    ins = inputs_for(cfg, a.prompt_seq, a.images)
    os.makedirs(a.out, exist_ok=True)
    report, worst, got_by = {}, 1.0, {}
    for name in names:
        arrays, groups = ins[name], 0
        if a.streaming and name == "llm":
            ref = chained_reference(a.model, cfg, arrays) if a.verify else []
            path, beside = compose_llm(a.out)
        else:
            ref, path, beside, groups = export_one(a, name, cfg, model, arrays)
        folder = os.path.join(a.out, "inputs", name)
        compare.write_raw(arrays, folder)
        print(f"exported {path} (opset {a.opset}{', weights in ' + name + '.onnx.data' if beside else ''}"
              f"{f', {groups} groups fused' if groups else ''})", file=sys.stderr)
        if not a.verify:
            continue
        got = run_ort(a.verify, path, folder, os.path.join(a.out, "ort", name))
        got_by[name] = got
        rows = {}
        for oname, want in zip(output_names(name), ref):
            g = got[oname]
            if list(g.shape) != list(want.shape):
                sys.exit(f"export_onnx: {name}.{oname}: ONNX Runtime gives {list(g.shape)}, the reference {list(want.shape)}")
            c = cosine(g, want.numpy())
            rows[oname] = {"cosine": c, "max_abs_diff": float(np.abs(g - want.numpy()).max()), "shape": list(g.shape)}
            if name in FUSED:  # the fused graph against the unfused one, both in ONNX Runtime
                rows[oname]["max_abs_diff_unfused"] = float(np.abs(g - got_by[FUSED[name]][oname]).max())
            worst = min(worst, c)
            extra = f", max|diff| to unfused {rows[oname]['max_abs_diff_unfused']:.3g}" if name in FUSED else ""
            print(f"  {name:17s} {oname:15s} cosine {c:.9f}{extra}", file=sys.stderr)
        report[name] = {"outputs": rows, "opset": a.opset, "external_data": beside, "fused_groups": groups,
                        "composed_of_splits": bool(a.streaming and name == "llm")}
        print(f"  exporter peak {peak_mib()} MiB so far", file=sys.stderr)
    if a.verify:
        with open(os.path.join(a.out, "verify.json"), "w") as f:
            json.dump({"gate": GATE, "prompt_seq": a.prompt_seq, "images": a.images, "sessions": report}, f, indent=1)
        if worst < GATE:
            sys.exit(f"export_onnx: an output's cosine {worst:.9f} is below {GATE}")


if __name__ == "__main__":
    main()
