# SPDX-License-Identifier: Apache-2.0
"""Minimal safetensors reader/writer (the format: u64 LE header length, a JSON header mapping
tensor names to {dtype, shape, data_offsets}, then raw little-endian data).

Written here because PyPI (and thus the `safetensors` package) is not reachable. Supports
F32 / F16 / BF16 (plus the integer types torch checkpoints sometimes carry), single files and
sharded checkpoints (`model.safetensors.index.json`).
"""

import json
import os
import struct

import numpy as np
import torch

# safetensors dtype tag -> (torch dtype, bytes per element)
_DTYPES = {
    "F32": (torch.float32, 4),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
    "F64": (torch.float64, 8),
    "I64": (torch.int64, 8),
    "I32": (torch.int32, 4),
    "I16": (torch.int16, 2),
    "I8": (torch.int8, 1),
    "U8": (torch.uint8, 1),
    "BOOL": (torch.bool, 1),
}
_TAG_OF = {v[0]: k for k, v in _DTYPES.items()}

MAX_HEADER_BYTES = 100 * 1024 * 1024


class SafetensorsError(ValueError):
    pass


def read_header(path):
    """Return (header dict without __metadata__, metadata dict, data start offset)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise SafetensorsError(f"{path}: truncated (no 8-byte header length)")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise SafetensorsError(f"{path}: header length {n} exceeds the file ({size} bytes)")
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SafetensorsError(f"{path}: header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    meta = header.pop("__metadata__", {}) or {}
    data_len = size - 8 - n
    spans = []
    for name, info in header.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise SafetensorsError(f"{path}: tensor {name!r}: malformed entry")
        if info["dtype"] not in _DTYPES:
            raise SafetensorsError(f"{path}: tensor {name!r}: unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        nelem = int(np.prod(info["shape"], dtype=np.int64)) if info["shape"] else 1
        if not (0 <= begin <= end <= data_len) or end - begin != nelem * _DTYPES[info["dtype"]][1]:
            raise SafetensorsError(f"{path}: tensor {name!r}: data_offsets {begin}..{end} "
                                   f"do not match shape {info['shape']} / file size")
        spans.append((begin, end, name))
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise SafetensorsError(f"{path}: tensors {n0!r} and {n1!r} overlap")
    return header, meta, 8 + n


def load_file(path):
    """Load every tensor of one .safetensors file into a dict name -> torch.Tensor (stored dtype)."""
    header, _, start = read_header(path)
    out = {}
    with open(path, "rb") as f:
        for name, info in header.items():
            dtype, _ = _DTYPES[info["dtype"]]
            begin, end = info["data_offsets"]
            f.seek(start + begin)
            buf = bytearray(f.read(end - begin))
            t = torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)
            out[name] = t.reshape(info["shape"]).clone()
    return out


def load_checkpoint_dir(model_dir):
    """Load model.safetensors or a sharded model-*.safetensors set (via the index file)."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.isfile(index):
        with open(index, "r", encoding="utf-8") as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise SafetensorsError(f"{index}: missing or empty weight_map")
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            if os.path.basename(shard) != shard:
                raise SafetensorsError(f"{index}: shard name {shard!r} must be a plain file name")
            part = load_file(os.path.join(model_dir, shard))
            for name, t in part.items():
                if weight_map.get(name) != shard:
                    raise SafetensorsError(f"{index}: tensor {name!r} found in {shard} "
                                           f"but the index places it in {weight_map.get(name)}")
                tensors[name] = t
        missing = set(weight_map) - set(tensors)
        if missing:
            raise SafetensorsError(f"{index}: tensor {sorted(missing)[0]!r} listed but not in its shard")
        return tensors
    if os.path.isfile(single):
        return load_file(single)
    raise SafetensorsError(f"{model_dir}: no model.safetensors or model.safetensors.index.json")


def save_file(tensors, path, metadata=None):
    """Write tensors (name -> torch.Tensor) with keys sorted and the header padded to 8 bytes."""
    header = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    blobs = []
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        if t.dtype not in _TAG_OF:
            raise SafetensorsError(f"tensor {name!r}: dtype {t.dtype} cannot be stored")
        raw = _tensor_bytes(t)
        header[name] = {"dtype": _TAG_OF[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hbytes += b" " * ((8 - len(hbytes) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hbytes)))
        f.write(hbytes)
        for raw in blobs:
            f.write(raw)
    os.replace(tmp, path)


def save_sharded(tensors, model_dir, max_shard_bytes):
    """Write model-0000i-of-0000n.safetensors shards plus model.safetensors.index.json."""
    shards, cur, cur_bytes = [], {}, 0
    for name in sorted(tensors):
        nbytes = tensors[name].numel() * tensors[name].element_size()
        if cur and cur_bytes + nbytes > max_shard_bytes:
            shards.append(cur)
            cur, cur_bytes = {}, 0
        cur[name] = tensors[name]
        cur_bytes += nbytes
    if cur:
        shards.append(cur)
    weight_map, total = {}, 0
    for i, part in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(part, os.path.join(model_dir, fname))
        for name, t in part.items():
            weight_map[name] = fname
            total += t.numel() * t.element_size()
    with open(os.path.join(model_dir, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)


def _tensor_bytes(t):
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()
