#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Regenerate the committed tiny models and goldens in assets/ (the demo model and the C engine's
parity fixtures). Each asset records how it was made in REGENERATE.json.

  make_assets.py [--root ASSETS_DIR] [--check]

PyTorch's fp32 arithmetic differs in its last bits between CPUs and thread counts (another
machine's goldens differ by about 1e-5, a weight by one f16 ulp), so a file whose new contents
match the one already there within that noise is left as it is: regenerating on another machine
does not dirty the tree. A file that differs by more is replaced, and named. --check: compare only
(exit 1 when an asset does not reproduce), nothing written.
"""
import argparse
import json
import os
import shutil
import struct
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from molmoact_ref import checkpoint, golden  # noqa: E402

ASSETS = [
    dict(name="tiny-grid", config="tiny", variant="grid", placement="projector", seed=0, dtype="f16", golden_seed=0),
    dict(name="tiny-original", config="tiny", variant="original", seed=0, dtype="f16", golden_seed=0),
]


def _close(a, b):
    """two arrays equal within PyTorch's cross-machine noise: 1e-4 of the larger's RMS, or one
    f16 ulp (1e-3 relative) for f16 weights"""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not np.issubdtype(a.dtype, np.floating):
        return np.array_equal(a, b)
    x, y = a.astype(np.float64), b.astype(np.float64)
    scale = max(np.sqrt(np.mean(x * x)) if x.size else 0.0, np.sqrt(np.mean(y * y)) if y.size else 0.0, 1e-12)
    rel = 1e-3 if a.dtype == np.float16 else 1e-4
    return bool(np.all(np.abs(x - y) <= rel * np.maximum(np.abs(x), scale)))


def _safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    kinds = {"F16": np.float16, "F32": np.float32, "BF16": np.uint16, "I64": np.int64}
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        lo, hi = v["data_offsets"]
        out[k] = np.frombuffer(raw[8 + n + lo:8 + n + hi], dtype=kinds.get(v["dtype"], np.uint8)).reshape(v["shape"] if v["dtype"] in kinds else -1)
    return head.get("__metadata__"), out


def _json_close(a, b):
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= 1e-4 * max(abs(a), abs(b), 1e-3)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_json_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_json_close(x, y) for x, y in zip(a, b))
    return a == b


def same_within_noise(old, new):
    """whether file `new` matches `old` within the noise described above"""
    if open(old, "rb").read() == open(new, "rb").read():
        return True
    if new.endswith(".npz"):
        a, b = np.load(old), np.load(new)
        return sorted(a.files) == sorted(b.files) and all(_close(a[k], b[k]) for k in a.files)
    if new.endswith(".safetensors"):
        (ma, a), (mb, b) = _safetensors(old), _safetensors(new)
        return ma == mb and a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if new.endswith(".json"):
        return _json_close(json.load(open(old)), json.load(open(new)))
    return False


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets"))
    ap.add_argument("--check", action="store_true", help="compare only: exit 1 when an asset does not reproduce")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="make_assets.")
    differ = []
    try:
        for spec in ASSETS:
            make_one(spec, os.path.join(tmp, spec["name"]))
            differ += merge(os.path.join(tmp, spec["name"]), os.path.join(a.root, spec["name"]), a.check)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for f in differ:
        print(f"{'differs' if a.check else 'replaced'}: {f}")
    if not differ:
        print("every asset reproduces within PyTorch's cross-machine noise" + ("" if a.check else ": nothing changed"))
    return 1 if differ and a.check else 0


def merge(new_base, base, check):
    """new files into base: those matching within the noise left as they are; the others
    replaced (or, with check, only listed); files base has that the new set lacks removed"""
    changed = []
    for d, _, files in os.walk(new_base):
        for f in sorted(files):
            new = os.path.join(d, f)
            old = os.path.join(base, os.path.relpath(new, new_base))
            if os.path.exists(old) and same_within_noise(old, new):
                continue
            changed.append(old)
            if not check:
                os.makedirs(os.path.dirname(old), exist_ok=True)
                shutil.copyfile(new, old)
    for d, _, files in os.walk(base):
        for f in files:
            old = os.path.join(d, f)
            if not os.path.exists(os.path.join(new_base, os.path.relpath(old, base))):
                changed.append(old)
                if not check:
                    os.remove(old)
    return changed


def make_one(spec, base):
    model_dir, golden_dir = os.path.join(base, "model"), os.path.join(base, "golden")
    checkpoint.make(spec["config"], spec["variant"], spec["seed"], model_dir, dtype=spec["dtype"],
                    placement=spec.get("placement", "projector"))
    _, trace = golden.write(model_dir, golden_dir, seed=spec["golden_seed"])
    meta = {k: v for k, v in spec.items() if k != "name"}
    meta["commands"] = [
        f"/usr/bin/python3 reference/make_checkpoint.py --config {spec['config']} --variant {spec['variant']} "
        f"--seed {spec['seed']} --dtype {spec['dtype']}"
        + (f" --sampler-placement {spec['placement']}" if "placement" in spec else "") + f" -o assets/{spec['name']}/model",
        f"/usr/bin/python3 reference/make_golden.py --model assets/{spec['name']}/model "
        f"-o assets/{spec['name']}/golden --seed {spec['golden_seed']}",
    ]
    with open(os.path.join(base, "REGENERATE.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    print(f"{spec['name']}: S={trace['seq_len']}, {trace['tokens_per_image']} tokens/image")


if __name__ == "__main__":
    sys.exit(main())
