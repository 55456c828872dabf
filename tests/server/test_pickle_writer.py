# SPDX-License-Identifier: Apache-2.0
"""server/pickle.h's writers, read by Python as LeRobot's robot client reads a reply
(robot_client.py: pickle.loads, then timed_actions[0].get_action().device.type and action[i].item()).

    MA_PICKLE_TOOL=build/tests/pickle_tool /usr/bin/python3 -m pytest -q tests/server/test_pickle_writer.py

The reply names lerobot.async_inference.helpers.TimedAction. With MA_LEROBOT_PYTHONPATH pointing at a
folder holding LeRobot's real src/lerobot/async_inference/helpers.py (and PR #3048's
safe_serialization.py) with stand-ins for what they import (tests/fixtures/lerobot_async/README.md),
those are used; otherwise (CI has no LeRobot) a stand-in module with the same dataclass fields
(helpers.py at 7427f31801f944f5ec9ce53cda02862ce7d1638b: TimedData(timestamp, timestep),
TimedAction(+action)) stands for it, and PR #3048's format is read by hand."""
import dataclasses
import importlib
import json
import os
import pickle
import pickletools
import struct
import subprocess
import sys
import types
import warnings

import numpy as np
import pytest
import torch

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tool():
    cands = [os.environ.get("MA_PICKLE_TOOL", "")]
    if os.environ.get("MOLMOACT"):
        cands.append(os.path.join(os.path.dirname(os.environ["MOLMOACT"]), "tests", "pickle_tool"))
    cands.append(os.path.join(SRC, "build", "tests", "pickle_tool"))
    for c in cands:
        if c and os.access(c, os.X_OK):
            return c
    pytest.skip("pickle_tool not built (set MA_PICKLE_TOOL)")


@pytest.fixture
def helpers(monkeypatch):
    path = os.environ.get("MA_LEROBOT_PYTHONPATH")
    if path:
        monkeypatch.syspath_prepend(path)
        return importlib.import_module("lerobot.async_inference.helpers")
    mod = types.ModuleType("lerobot.async_inference.helpers")

    @dataclasses.dataclass
    class TimedData:
        timestamp: float
        timestep: int

    @dataclasses.dataclass
    class TimedAction(TimedData):
        action: torch.Tensor

        def get_action(self):
            return self.action

    for c in (TimedData, TimedAction):
        c.__module__ = mod.__name__
        c.__qualname__ = c.__name__
        setattr(mod, c.__name__, c)
    for name in ("lerobot", "lerobot.async_inference"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    return mod


def rows(n, dim, seed):
    r = np.random.default_rng(seed).normal(0, 50, (n, dim)).astype(np.float32)
    special = np.array([0x80000000, 0x7FC00001, 0x7F800000, 0xFF800000, 0x00000001, 0x7F7FFFFF, 0x3EAAAAAB], np.uint32).view(np.float32)
    flat = r.reshape(-1)
    flat[: min(len(special), flat.size)] = special[: flat.size]
    return r


def write(kind, r, t0, dt, step0, tmp_path):
    out = tmp_path / f"{kind}.bin"
    n, dim = r.shape
    subprocess.run([tool(), kind, str(n), str(dim), repr(t0), repr(dt), str(step0), str(out)], input=r.tobytes(), check=True)
    return out.read_bytes()


CASES = [(5, 7, 1756000000.123456, 1 / 30, 17), (1, 1, 0.0, 0.5, 0), (3, 32, -2.5, 0.1, 2**40), (2, 6, 1.0, 0.25, -(2**35)),
         (0, 7, 1.0, 0.1, 3), (1001, 2, 5.0, 0.01, 2**31 - 1)]


@pytest.mark.parametrize("n,dim,t0,dt,step0", CASES)
def test_pickle_reply_unpickles_to_timed_actions(helpers, tmp_path, n, dim, t0, dt, step0):
    r = rows(n, dim, n * 31 + dim)
    data = write("write", r, t0, dt, step0, tmp_path)
    # only the three names the reader's allowlist interprets, and protocol 5
    names, strings = set(), []
    for op, arg, _ in pickletools.genops(data):
        if op.name == "PROTO":
            assert arg == 5
        if isinstance(arg, str):
            strings.append(arg)
        if op.name == "STACK_GLOBAL":
            names.add(tuple(strings[-2:]))
    if n:
        assert names == {("lerobot.async_inference.helpers", "TimedAction"), ("torch", "from_numpy"), ("numpy", "frombuffer")}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. torch's warning on a non-writable buffer
        acts = pickle.loads(data)
    assert isinstance(acts, list) and len(acts) == n
    for i, a in enumerate(acts):
        assert type(a) is helpers.TimedAction
        assert type(a.timestamp) is float and a.timestamp == t0 + i * dt
        assert type(a.timestep) is int and a.timestep == step0 + i
        t = a.get_action()
        assert isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.device.type == "cpu" and tuple(t.shape) == (dim,)
        assert np.array_equal(t.numpy().view(np.uint32), r[i].view(np.uint32))  # bit for bit, NaN payloads too
        if dim:
            assert t[dim - 1].item() == float(r[i, dim - 1]) or np.isnan(r[i, dim - 1])
        t += 1  # writable, each row its own buffer
        if i + 1 < n:
            assert np.array_equal(acts[i + 1].action.numpy().view(np.uint32), r[i + 1].view(np.uint32))


def read_pr3048(data, helpers):
    """PR #3048's deserialize_actions when its file is there, else the same steps by hand"""
    if os.environ.get("MA_LEROBOT_PYTHONPATH"):
        ss = importlib.import_module("lerobot.async_inference.safe_serialization")
        return ss.deserialize_actions(data)
    (jl,) = struct.unpack(">I", data[:4])
    meta = json.loads(data[4 : 4 + jl].decode())
    assert meta["type"] == "TimedActions"
    rest = data[4 + jl :]
    tensors = {}
    if rest:
        (hl,) = struct.unpack("<Q", rest[:8])
        header = json.loads(rest[8 : 8 + hl])
        body = rest[8 + hl :]
        end = 0
        for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
            a, b = e["data_offsets"]
            assert e["dtype"] == "F32" and a == end and b - a == 4 * int(np.prod(e["shape"]))
            end = b
            tensors[name] = torch.from_numpy(np.frombuffer(bytearray(body[a:b]), "<f4").reshape(e["shape"]))
        assert end == len(body)
    return [helpers.TimedAction(timestamp=m["timestamp"], timestep=m["timestep"], action=tensors[f"action_{i}"])
            for i, m in enumerate(meta["actions"])]


@pytest.mark.parametrize("n,dim,t0,dt,step0", CASES)
def test_pr3048_reply_reads_back(helpers, tmp_path, n, dim, t0, dt, step0):
    r = rows(n, dim, n * 17 + dim)
    data = write("write-safe", r, t0, dt, step0, tmp_path)
    assert data[0] == 0
    acts = read_pr3048(data, helpers)
    assert len(acts) == n
    for i, a in enumerate(acts):
        assert type(a.timestamp) is float and a.timestamp == t0 + i * dt
        assert type(a.timestep) is int and a.timestep == step0 + i
        assert a.action.dtype == torch.float32 and tuple(a.action.shape) == (dim,)
        assert np.array_equal(a.action.numpy().view(np.uint32), r[i].view(np.uint32))


def test_fixtures_decode_as_recorded():
    """pickle_tool decode of each recorded fixture equals expected.json (dicts in any order)"""
    d = os.path.join(SRC, "tests", "fixtures", "lerobot_async")
    with open(os.path.join(d, "expected.json")) as f:
        expected = json.load(f)

    def norm(x):
        if isinstance(x, dict) and "dict" in x:
            return {"dict": sorted((json.dumps(norm(k), sort_keys=True), norm(v)) for k, v in x["dict"])}
        if isinstance(x, dict):
            return {k: norm(v) for k, v in x.items()}
        if isinstance(x, list):
            return [norm(v) for v in x]
        return x

    for name, want in sorted(expected.items()):
        p = subprocess.run([tool(), "decode", os.path.join(d, name)], capture_output=True, text=True)
        if "error" in want:
            assert p.returncode == 1 and want["error"] in p.stdout, (name, p.stdout)
        else:
            assert p.returncode == 0, (name, p.stdout)
            assert norm(json.loads(p.stdout)) == norm(want["expect"]), name
