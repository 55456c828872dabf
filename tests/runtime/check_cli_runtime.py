#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The resident runtime from the command line: `run --stream` (one JSON line per observation, bad
ones reported without stopping the stream), `run --json --runs N`, `bench --json` and `bench
--session` on a compiled context, with and without `--cold`.

usage: check_cli_runtime.py MOLMOACT_BINARY SOURCE_DIR WORK_DIR"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np


def cosine(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / np.sqrt((a @ a) * (b @ b)))


def main():
    binary, src, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    golden = os.path.join(src, "assets/tiny-grid/golden")
    model = os.path.join(src, "assets/tiny-grid/model")
    vis, step0 = np.load(golden + "/vision_io.npz"), np.load(golden + "/step0_boundary.npz")
    want = np.load(golden + "/intermediates.npz")["actions"]
    ok_in, raw_in, bad_in = (os.path.join(work, n) for n in ("ok.npz", "raw.npz", "bad.npz"))
    np.savez(ok_in, pixels=vis["pixels"], input_ids=step0["input_ids"], noise=step0["noise"])
    rng = np.random.default_rng(3)
    np.savez(raw_in, image0=rng.integers(0, 256, (256, 256, 3), dtype=np.uint8),
             image1=rng.integers(0, 256, (480, 640, 3), dtype=np.uint8),
             task=np.array("open the top drawer of the cabinet"), state=np.linspace(-1, 1, 8).astype(np.float32))
    np.savez(bad_in, image0=np.zeros((8, 8, 3), np.uint8), task=np.array("x"), state=np.zeros(8, np.float32))
    raw_out = os.path.join(work, "raw_out.npz")
    lines = f"{ok_in}\n{work}/missing.npz\n\n{raw_in}\t{raw_out}\n{bad_in}\n{ok_in}\n"
    p = subprocess.run([binary, "run", "--model", model, "--stream"], input=lines.encode(), capture_output=True, timeout=600)
    out = [json.loads(l) for l in p.stdout.decode().splitlines()]
    assert p.returncode == 3, (p.returncode, p.stderr)  # 3: some observations failed, the stream went on
    assert [o["index"] for o in out] == [0, 1, 2, 3, 4], out
    assert "error" in out[1] and "missing.npz" in out[1]["error"], out[1]
    assert "error" in out[3] and "image1" in out[3]["error"], out[3]
    for o in (out[0], out[4]):
        assert cosine(o["actions"], want) >= 0.9999, o
    assert out[0]["actions"] == out[4]["actions"]
    assert np.array_equal(np.load(raw_out)["actions"], np.asarray(out[2]["actions"], np.float32))
    assert np.isfinite(np.asarray(out[2]["actions"])).all()

    # run --json --runs 3 with the golden: actions, latency table, parity, memory
    p = subprocess.run([binary, "run", "--model", model, "--inputs", ok_in, "--golden", golden, "--runs", "3", "--json"],
                       capture_output=True, timeout=600)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert cosine(r["actions"], want) >= 0.9999
    # the table is over the warm runs 2..3; the first request is reported on its own
    assert r["latency"]["runs"] == 2 and r["latency"]["mode"] == "resident"
    lat = r["latency"]
    assert lat["min_total_ms"] <= r["warm_total_ms"] <= lat["max_total_ms"]
    assert abs(lat["mean_ms"]["total"] - r["warm_total_ms"]) < 1e-3 * lat["mean_ms"]["total"]
    assert r["first_request_ms"] > 0
    assert r["parity"]["pass"] and r["peak_rss_kb"]["workers"] > 0

    # the same with --inproc gives the same actions, bit for bit
    p = subprocess.run([binary, "run", "--model", model, "--inputs", ok_in, "--runs", "1", "--inproc", "--json"],
                       capture_output=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["actions"] == r["actions"]

    # --preload: the contexts read in and one warm-up request (blank frames) at open; what that
    # request leaves in the workers (kept inputs, the gathered K/V) must not change the answer
    for mode in ([], ["--inproc"]):
        p = subprocess.run([binary, "run", "--model", model, "--inputs", ok_in, "--runs", "1", "--preload", "--json"] + mode,
                           capture_output=True, timeout=600)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["actions"] == r["actions"], mode

    p = subprocess.run([binary, "bench", "--runs", "2", "--json"], capture_output=True, timeout=600)
    assert p.returncode == 0, p.stderr
    b = json.loads(p.stdout)
    m = b["latency"]["mean_ms"]
    parts = ["vision", "llm_split0", "llm_split1", "llm_split2", "llm_split3", "action_context", "action_step"]
    assert b["latency"]["runs"] == 2 and all(m[k] > 0 for k in parts)
    assert abs(sum(m[k] for k in parts) - m["inference"]) < 1e-2 * m["inference"]
    assert m["total"] >= m["inference"]

    # bench --session on a compiled context: the weights it reads, and --cold (flushed caches)
    ctx = os.path.join(work, "ctx-f16")
    p = subprocess.run([binary, "compile", model, "-o", ctx, "--vision", "f16", "--llm", "f16", "--action", "f16"],
                       capture_output=True, timeout=600)
    assert p.returncode == 0, p.stderr
    g = np.load(os.path.join(golden, "action_step_io.npz"))  # all ten steps: take the first
    io = os.path.join(work, "action_step_in.npz")
    np.savez(io, x=g["x"][0], t=g["t"][:1], ctx_k=g["ctx_k"], ctx_v=g["ctx_v"], cross_mask=g["cross_mask"])
    stored = os.path.getsize(os.path.join(ctx, "action_step.gguf"))
    for cold in ([], ["--cold"]):
        p = subprocess.run([binary, "bench", "--model", ctx, "--session", "action_step", "--inputs", io, "--runs", "3",
                            "--json"] + cold, capture_output=True, timeout=600)
        assert p.returncode == 0, p.stderr
        b = json.loads(p.stdout)
        assert b["cold"] == bool(cold) and b["runs"] == 3 and b["median_ms"] > 0, b
        # every matrix of the step, less the modulation tables (one row of them per step)
        assert 0.5 * stored < b["weight_bytes"] < stored, (b["weight_bytes"], stored)
    p = subprocess.run([binary, "bench", "--model", model, "--session", "action_step", "--inputs", io, "--cold"],
                       capture_output=True, timeout=600)
    assert p.returncode == 2 and b"--cold needs a context directory" in p.stderr, (p.returncode, p.stderr)
    print("stream, run --json, --inproc, bench --json and bench --session [--cold]: ok")
    shutil.rmtree(work)  # kept only when a check failed


if __name__ == "__main__":
    main()
