# SPDX-License-Identifier: Apache-2.0
"""make_assets.py regenerates the committed assets without dirtying the tree: files that match
within PyTorch's cross-machine noise are left as they are; a real change is written and named;
--check only reports."""
import os
import shutil
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "reference", "make_assets.py")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=600)


def test_regenerating_keeps_the_committed_bytes_and_names_a_real_change(tmp_path):
    assets = tmp_path / "assets"
    for name in ("tiny-grid", "tiny-original"):
        shutil.copytree(os.path.join(ROOT, "assets", name), assets / name)
    before = {p: open(p, "rb").read() for p in map(str, assets.rglob("*")) if os.path.isfile(p)}
    p = run("--root", str(assets))
    assert p.returncode == 0 and "nothing changed" in p.stdout, p.stdout + p.stderr
    after = {p: open(p, "rb").read() for p in map(str, assets.rglob("*")) if os.path.isfile(p)}
    assert after == before  # not one byte rewritten
    # a golden that no longer matches its model: --check names it and writes nothing ...
    vio = assets / "tiny-grid" / "golden" / "vision_io.npz"
    z = dict(np.load(vio))
    z["image_features"] = z["image_features"] * 1.01
    np.savez(vio, **z)
    stale = open(vio, "rb").read()
    p = run("--root", str(assets), "--check")
    assert p.returncode == 1 and f"differs: {vio}" in p.stdout, p.stdout + p.stderr
    assert open(vio, "rb").read() == stale
    # ... and a run replaces it (and only it)
    p = run("--root", str(assets))
    assert p.returncode == 0 and f"replaced: {vio}" in p.stdout and p.stdout.count("replaced: ") == 1, p.stdout
    assert open(vio, "rb").read() == before[str(vio)] or run("--root", str(assets), "--check").returncode == 0
