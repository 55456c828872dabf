# SPDX-License-Identifier: Apache-2.0
"""Checkpoints and the reference at any size without holding the model in memory (issue 22).

write(): a random checkpoint written tensor by tensor, with exactly checkpoint.make()'s
initialisation (one generator, parameters in sorted-name order, the same rules, the attention
sink calibrated by a streamed forward pass and patched into its shard), sharded with
model.safetensors.index.json as released checkpoints are. The model is built on the meta device
(shapes only); peak memory is the largest tensor plus the streamed forward's working set.

load(): the reference model on the meta device whose weights are read from the mapped shards
(upcast to fp32) only while the block using them runs: each LLM layer, ViT block and expert
block (and each expert modulation) is loaded before its forward and dropped after; the small
rest (embeddings, vision stem and head, expert stem) stays loaded. lm_head is never loaded.
"""

import json
import os
import struct

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from . import progress, checkpoint, synthetic
from . import config as cfglib
from . import loader
from .model import MolmoAct2, rope_inv_freq

_ST_DTYPE = {torch.float32: ("F32", 4), torch.float16: ("F16", 2), torch.bfloat16: ("BF16", 2)}


class _Meta(TorchFunctionMode):
    """large tensor factories on the meta device, so module construction allocates no weights;
    small ones (the buffers modules compute, e.g. the pooling's index tables) stay real"""
    FACTORIES = {torch.empty, torch.zeros, torch.ones, torch.randn, torch.rand, torch.full}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in self.FACTORIES:
            shape = args[0] if args and isinstance(args[0], (tuple, list, torch.Size)) else args
            try:
                n = int(np.prod([int(x) for x in shape], dtype=np.int64))
            except (TypeError, ValueError):
                n = 0
            if n >= 65536:
                kwargs["device"] = "meta"
        return func(*args, **kwargs)


def meta_model(cfg, spec):
    """the model with every parameter on the meta device (shapes only) and its buffers real"""
    with _Meta():
        model = MolmoAct2(cfg, spec).eval()
    for name, p in list(model.named_parameters()):
        owner, _, leaf = name.rpartition(".")
        sub = model.get_submodule(owner) if owner else model
        sub._parameters[leaf] = torch.nn.Parameter(torch.empty(tuple(p.shape), device="meta"), requires_grad=False)
    return model


def _plan_shards(entries, max_bytes):
    shards, cur, size = [], [], 0
    for e in entries:
        if cur and size + e["nbytes"] > max_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(e)
        size += e["nbytes"]
    if cur:
        shards.append(cur)
    return shards


def _tensor_bytes(t):
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().tobytes()
    return t.contiguous().numpy().tobytes()


def write(config_name, variant, seed, out_dir, dtype="bf16", shard_mb=4096, overrides=None, log=print):
    """-> cfg. Same files as checkpoint.make(..., shard_mb=...) with the same tensors."""
    cfg = cfglib.preset(config_name, variant)
    if overrides:
        cfg = checkpoint.apply_overrides(cfg, overrides)
    ids = cfglib.preset_ids(config_name)
    os.makedirs(out_dir, exist_ok=True)
    cfglib.save(cfg, os.path.join(out_dir, "config.json"))
    synthetic.write_json(synthetic.libero_norm_stats(), os.path.join(out_dir, "norm_stats.json"))
    synthetic.write_json(synthetic.tokenizer_json(cfg, ids), os.path.join(out_dir, "tokenizer.json"))
    synthetic.write_json(synthetic.PROCESSOR_CONFIG, os.path.join(out_dir, "processor_config.json"))
    spec = checkpoint.sampler_spec(cfg, variant, "projector")
    model = meta_model(cfg, spec)
    state = model.state_dict()
    dtypes = checkpoint.storage_dtypes(model, dtype)
    with_lm_head = config_name != "tiny"
    names = sorted(n for n in state if with_lm_head or n != "lm_head.weight")
    entries = []
    for n in names:
        tag, es = _ST_DTYPE[dtypes[n]]
        entries.append({"name": n, "shape": list(state[n].shape), "tag": tag, "dtype": dtypes[n],
                        "nbytes": int(np.prod(state[n].shape, dtype=np.int64)) * es})
    shards = _plan_shards(entries, shard_mb * 1024 * 1024)
    # the generator's draws follow checkpoint.init_weights: parameters in sorted-name order
    params = dict(model.named_parameters())
    g = torch.Generator().manual_seed(int(seed))
    pending = sorted(params)
    values = {}

    def draw_until(name):
        """advance the generator through the sorted parameters up to name (tensors are written
        in state-dict name order, which interleaves buffers and the skipped lm_head)"""
        while pending and pending[0] <= name:
            p = pending.pop(0)
            t = checkpoint.init_tensor(p, tuple(params[p].shape), g, cfg, ids, all_rows=False)
            if p == name:
                return t
            if p == "lm_head.weight":
                continue  # drawn (the generator must advance) even when not written
            values[p] = t
        return values.pop(name, None)

    weight_map, offsets, total = {}, {}, 0
    n_shards = len(shards)
    bar = progress.Progress("make_checkpoint: tensors", total_bytes=sum(e["nbytes"] for e in entries),
                            total_items=len(entries), unit="tensors")
    for i, part in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"
        header, off = {}, 0
        for e in part:
            header[e["name"]] = {"dtype": e["tag"], "shape": e["shape"], "data_offsets": [off, off + e["nbytes"]]}
            off += e["nbytes"]
        hb = json.dumps(header, separators=(",", ":")).encode()
        hb += b" " * ((8 - len(hb) % 8) % 8)
        path = os.path.join(out_dir, fname)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(hb)))
            f.write(hb)
            for e in part:
                n = e["name"]
                if n in params:
                    t = draw_until(n)
                else:  # buffers
                    t = _buffer(n, cfg)
                t = t.to(e["dtype"])
                f.write(_tensor_bytes(t))
                weight_map[n] = fname
                offsets[n] = (path, 8 + len(hb) + header[n]["data_offsets"][0], e["dtype"], tuple(e["shape"]))
                total += e["nbytes"]
                bar.add(e["nbytes"], 1)
                del t
        log(f"  {fname}: {len(part)} tensors, {off / 2**30:.2f} GiB")
    bar.end()
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
    _calibrate_sink(out_dir, cfg, seed, offsets)
    return cfg


def _buffer(name, cfg):
    if name.endswith("rotary_emb.inv_freq"):
        t = cfg["text_config"]
        return rope_inv_freq(t["head_dim"], t["rope_theta"])
    raise AssertionError(f"no rule for buffer {name}")


@torch.no_grad()
def _calibrate_sink(out_dir, cfg, seed, offsets):
    """checkpoint.calibrate_attention_sink on the streamed model; the new biases (rounded to
    their storage type, as make() rounds them) overwrite the random ones in their shards"""
    model = load(out_dir)
    before = {}
    for l, block in enumerate(model.model.action_expert.blocks):
        before[l] = f"model.action_expert.blocks.{l}.cross_attn.q_proj.bias"
    # calibrate writes q_proj.bias of every block: make them real, loaded tensors first
    for l, block in enumerate(model.model.action_expert.blocks):
        name = before[l]
        block.cross_attn.q_proj.bias = torch.nn.Parameter(model._reader.get(name), requires_grad=False)
    checkpoint.calibrate_attention_sink(model, cfg, out_dir, seed)
    for l, block in enumerate(model.model.action_expert.blocks):
        path, off, dt, shape = offsets[before[l]]
        data = _tensor_bytes(block.cross_attn.q_proj.bias.detach().to(dt))
        with open(path, "r+b") as f:
            f.seek(off)
            f.write(data)
    model._reader.close()


class Reader:
    """tensors of a (sharded) checkpoint, read on demand with pread (so the file's pages stay in
    the page cache, not in this process's resident memory), as fp32"""

    def __init__(self, model_dir):
        idx = os.path.join(model_dir, "model.safetensors.index.json")
        files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
        self.where, self.fds = {}, []
        self.progress = None  # a progress.Progress counting the streamed blocks run
        for fn in files:
            fd = os.open(os.path.join(model_dir, fn), os.O_RDONLY)
            self.fds.append(fd)
            (n,) = struct.unpack("<Q", os.pread(fd, 8, 0))
            header = json.loads(os.pread(fd, n, 8))
            header.pop("__metadata__", None)
            for name, info in header.items():
                a, b = info["data_offsets"]
                self.where[loader_key(name)] = (fd, 8 + n + a, b - a, info["dtype"], info["shape"])

    def shape(self, name):
        return self.where[name][4]

    def get(self, name):
        fd, off, nbytes, tag, shape = self.where[name]
        buf = bytearray(nbytes)
        view, done = memoryview(buf), 0
        while done < nbytes:
            got = os.preadv(fd, [view[done:]], off + done)
            if got <= 0:
                raise loader.CheckpointError(f"tensor {name!r}: the file ends early")
            done += got
        if tag == "BF16":
            return torch.frombuffer(buf, dtype=torch.int16).view(torch.bfloat16).to(torch.float32).reshape(shape)
        dt = {"F32": torch.float32, "F16": torch.float16}[tag]
        return torch.frombuffer(buf, dtype=dt).to(torch.float32).reshape(shape)

    def close(self):
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def loader_key(name):
    """LeRobot-style keys ("model.model....") to the reference's names"""
    return name[len("model."):] if name.startswith("model.model.") else name


def _set_param(module, pname, value):
    module._parameters[pname] = torch.nn.Parameter(value, requires_grad=False)


def _stream(module, prefix, reader):
    """load module's meta parameters before its forward, drop them after"""
    loaded = []

    def pre(mod, args):
        for name, p in list(mod.named_parameters()):
            if p.is_meta:
                owner, _, leaf = name.rpartition(".")
                sub = mod.get_submodule(owner) if owner else mod
                _set_param(sub, leaf, reader.get(prefix + name))
                loaded.append((sub, leaf, tuple(p.shape)))

    def post(mod, args, out):
        if reader.progress is not None:
            reader.progress.add(sum(int(np.prod(sh, dtype=np.int64)) for _, _, sh in loaded) * 4, 1)
        while loaded:
            sub, leaf, shape = loaded.pop()
            sub._parameters[leaf] = torch.nn.Parameter(torch.empty(shape, device="meta"), requires_grad=False)
        return out

    module.register_forward_pre_hook(pre)
    module.register_forward_hook(post)


def _open(model_dir):
    """-> (cfg, reader, the model on the meta device with its buffers real)"""
    cfg = cfglib.load(os.path.join(model_dir, "config.json"))
    reader = Reader(model_dir)
    names = set(reader.where)
    spec = None
    if any(n.endswith("scout_mlp.0.weight") for n in names):
        shapes = {n: reader.shape(n) for n in names}
        _, spec = loader.find_sampler({n: torch.empty(s, device="meta") for n, s in shapes.items()})
    model = meta_model(cfg, spec)
    for name, b in list(model.named_buffers()):
        owner, _, leaf = name.rpartition(".")
        sub = model.get_submodule(owner)
        if name.endswith("rotary_emb.inv_freq"):
            sub._buffers[leaf] = _buffer(name, cfg)
        elif name in reader.where:
            sub._buffers[leaf] = reader.get(name)
    model._reader = reader
    model.cfg = cfg
    return cfg, reader, model


def _load_param(model, reader, name):
    if name not in reader.where:
        raise loader.CheckpointError(f"tensor {name!r} is missing from the checkpoint")
    owner, _, leaf = name.rpartition(".")
    _set_param(model.get_submodule(owner), leaf, reader.get(name))


def load(model_dir):
    """-> the streamed reference model (model.cfg set; model._reader the shard reader)"""
    cfg, reader, model = _open(model_dir)
    streamed = []
    t = model.model.transformer
    streamed += [(b, f"model.transformer.blocks.{i}.") for i, b in enumerate(t.blocks)]
    vit = model.model.vision_backbone.image_vit
    streamed += [(b, f"model.vision_backbone.image_vit.transformer.resblocks.{i}.") for i, b in enumerate(vit.transformer.resblocks)]
    e = model.model.action_expert
    for i, b in enumerate(e.blocks):
        streamed.append((b.modulation, f"model.action_expert.blocks.{i}.modulation."))
        streamed.append((b, f"model.action_expert.blocks.{i}."))
    streamed.append((e.final_layer.modulation, "model.action_expert.final_layer.modulation."))
    inside = set()
    for mod, prefix in streamed:
        _stream(mod, prefix, reader)
        for n, _ in mod.named_parameters():
            inside.add(prefix + n)
    # everything else (but lm_head) loaded now
    for name, p in list(model.named_parameters()):
        if name in inside or name == "lm_head.weight":
            continue
        _load_param(model, reader, name)
    return model


def load_parts(model_dir, prefixes):
    """-> the reference model with only the parameters under `prefixes` loaded (fp32) and the
    rest left on the meta device, which fails any forward that touches it: one session's
    weights, e.g. to export that session's graph at full size (reader closed: nothing streams)"""
    _, reader, model = _open(model_dir)
    n = 0
    for name, _ in list(model.named_parameters()):
        if name.startswith(tuple(prefixes)):
            _load_param(model, reader, name)
            n += 1
    reader.close()
    if n == 0:
        raise loader.CheckpointError(f"{model_dir}: no tensor under {', '.join(prefixes)}")
    return model
