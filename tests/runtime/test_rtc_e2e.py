# SPDX-License-Identifier: Apache-2.0
"""Real-time chunking end to end (issue 39): `molmoact run --rtc-prefix ...` (and the Python
binding's rtc_* keys) against the PyTorch reference with the same prefix (reference/molmoact_ref
pipeline.run's rtc_* arguments, whose RTC math tests/fixtures/lerobot_rtc holds to LeRobot's own)
on the tiny test model: actions and trajectory to fp32 rounding; without a prefix (or with
all-zero prefix weights) bit for bit the run without RTC; the refusals named.

    MOLMOACT=build/molmoact MOLMOACT_SRC=. /usr/bin/python3 -m pytest -q tests/runtime/test_rtc_e2e.py"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

BIN = os.environ.get("MOLMOACT", "build/molmoact")
SRC = os.environ.get("MOLMOACT_SRC", ".")
sys.path.insert(0, os.path.join(SRC, "reference"))
TINY = os.path.join(SRC, "assets", "tiny-grid")
TOL = 1e-5  # of max(1, |reference|): what the existing C-vs-reference end-to-end checks allow


def run(*args):
    p = subprocess.run([BIN, *args], capture_output=True, timeout=600)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def variant(tmp, name):
    """tiny-grid as it is (an action dim of 7 of max_action_dim 32: the padded dims masked, a
    prefix of 7 columns zero-padded); "obs2": n_obs_steps 2 (the prefix's row 0 on trajectory row 1,
    8 actions returned)"""
    src = os.path.join(TINY, "model")
    if name == "tiny-grid":
        return src
    d = os.path.join(tmp, name)
    shutil.copytree(src, d)
    with open(os.path.join(d, "norm_stats.json")) as f:
        ns = json.load(f)
    for meta in ns["metadata_by_tag"].values():
        meta["n_action_steps"] = 8
    with open(os.path.join(d, "norm_stats.json"), "w") as f:
        json.dump(ns, f)
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    cfg["n_obs_steps"] = 2
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    return d


@pytest.fixture(scope="module", params=["tiny-grid", "obs2"])
def base(request, tmp_path_factory):
    import torch
    from molmoact_ref import loader, pipeline, processing
    tmp = str(tmp_path_factory.mktemp(request.param))
    mdir = variant(tmp, request.param)
    cfg, model = loader.load(mdir)
    norm = processing.NormStats.load(os.path.join(mdir, "norm_stats.json"))
    gdir = os.path.join(TINY, "golden")
    vis, step0 = np.load(os.path.join(gdir, "vision_io.npz")), np.load(os.path.join(gdir, "step0_boundary.npz"))
    px, ids, noise = vis["pixels"], step0["input_ids"], step0["noise"]
    inp = os.path.join(tmp, "in.npz")
    np.savez(inp, pixels=px, input_ids=ids, noise=noise)

    def ref(**rtc):
        with torch.no_grad():
            out = pipeline.run(model, cfg, norm, px, ids, noise, **rtc)
        return {"actions": out["actions"].numpy(), "trajectory": out["traj_final"].numpy()}

    def c(*args, name="out"):
        out = os.path.join(tmp, name + ".npz")
        rc, _, err = run("run", "--model", mdir, "--inputs", inp, "--out", out, "--runs", "1", "--inproc", *args)
        assert rc == 0, err
        got = np.load(out)
        return {"actions": got["actions"], "trajectory": got["trajectory"]}
    plain = ref()
    return {"name": request.param, "dir": mdir, "tmp": tmp, "cfg": cfg, "ref": ref, "c": c, "plain": plain,
            "action_dim": plain["actions"].shape[1], "obs": (px, ids, noise)}


def prefix_of(b, rows, full):
    """a previous chunk's leftover: the plain chunk's rows from the first returned one, moved"""
    traj, off = b["plain"]["trajectory"], b["cfg"]["n_obs_steps"] - 1
    width = traj.shape[1] if full else b["action_dim"]
    rows = min(rows, traj.shape[0] - off)
    p = traj[off:off + rows, :width] + 0.5 * np.sin(np.arange(rows * width, dtype=np.float32).reshape(rows, width))
    return np.ascontiguousarray(p, dtype=np.float32)


CASES = [  # rows, full width, delay, horizon (None: 10), beta (None: 10), schedule
    (10, False, 3, None, None, "linear"),
    (10, True, 2, 5, 5.0, "exp"),
    (4, False, 1, 10, 2.5, "ones"),
    (6, True, 4, 8, None, "zeros"),
    (7, False, 12, 6, 0.5, "linear"),
]


def cli_args(path, d, h, beta, sch):
    a = ["--rtc-prefix", path, "--rtc-delay", str(d), "--rtc-schedule", sch]
    if h is not None:
        a += ["--rtc-horizon", str(h)]
    if beta is not None:
        a += ["--rtc-beta", repr(beta)]
    return a


MEASURED = {}


@pytest.mark.parametrize("case", range(len(CASES)))
def test_c_equals_reference_with_rtc(base, case):
    rows, full, d, h, beta, sch = CASES[case]
    p = prefix_of(base, rows, full)
    path = os.path.join(base["tmp"], f"prefix{case}.npy")
    np.save(path, p)
    want = base["ref"](rtc_prefix=p, rtc_delay=d, rtc_horizon=h, rtc_beta=beta, rtc_schedule=sch.upper())
    got = base["c"](*cli_args(path, d, h, beta, sch), name=f"rtc{case}")
    for k in ("actions", "trajectory"):
        diff = float(np.abs(got[k] - want[k]).max())
        MEASURED[(base["name"], case, k)] = diff
        assert diff <= TOL * max(1.0, float(np.abs(want[k]).max())), (k, diff)
    # the guidance did something, in the same direction in both: the first rows toward the prefix
    moved = float(np.abs(want["trajectory"] - base["plain"]["trajectory"]).max())
    assert moved > 1e-2, moved
    off, n = base["cfg"]["n_obs_steps"] - 1, max(1, min(d, rows))
    w = p.shape[1]
    before = np.abs(base["plain"]["trajectory"][off:off + n, :w] - p[:n]).mean()
    after = np.abs(got["trajectory"][off:off + n, :w] - p[:n]).mean()
    assert after < before, (after, before)
    if not full and base["action_dim"] < got["trajectory"].shape[1]:
        assert not got["trajectory"][:, base["action_dim"]:].any()  # the padded dims stay masked


def test_no_prefix_and_zero_weights_are_bit_identical(base):
    """no RTC, RTC whose weights are all 0 (ZEROS with delay 0) and the binding without a prefix:
    the same bits, in C and in the reference"""
    plain = base["c"](name="plain")
    p = prefix_of(base, 5, False)
    path = os.path.join(base["tmp"], "zero.npy")
    np.save(path, p)
    zero = base["c"]("--rtc-prefix", path, "--rtc-delay", "0", "--rtc-schedule", "zeros", name="zero")
    ref_zero = base["ref"](rtc_prefix=p, rtc_delay=0, rtc_schedule="ZEROS")
    for k in ("actions", "trajectory"):
        assert np.array_equal(plain[k], zero[k]), k
        assert np.array_equal(base["plain"][k], ref_zero[k]), k


@pytest.fixture(scope="module")
def policy(base):
    if os.environ.get("MOLMOACT_SKIP_BINDING") == "1":
        pytest.skip("an instrumented library cannot load into Python")
    os.environ.setdefault("MOLMOACT_LIBRARY", os.path.join(os.path.dirname(os.path.abspath(BIN)), "libmolmoact.so"))
    sys.path.insert(0, os.path.join(SRC, "python"))
    import molmoact
    with molmoact.Policy(base["dir"], inproc=True) as pol:
        yield pol


def binding_obs(base, **extra):
    px, ids, noise = base["obs"]
    # the binding takes raw frames; a golden's preprocessed arrays go through molmoact_infer's
    # advanced fields, which it does not expose: compare the binding with itself and the CLI on frames
    rng = np.random.default_rng(3)
    frame = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    o = {"image": frame, "wrist_image": frame[::-1].copy(), "state": np.linspace(-0.5, 0.5, 8).astype(np.float32),
         "prompt": "pick up the bowl", "noise": noise}
    o.update(extra)
    return o


def test_binding(base, policy, tmp_path):
    a = policy.infer(binding_obs(base))
    b = policy.infer(binding_obs(base, rtc_prefix=None))
    assert np.array_equal(a["trajectory"], b["trajectory"]) and np.array_equal(a["actions"], b["actions"])
    p = prefix_of(base, 8, False)
    g = policy.infer(binding_obs(base, rtc_prefix=p, rtc_delay=2, rtc_horizon=6, rtc_beta=4.0, rtc_schedule="exp"))
    g2 = policy.infer(binding_obs(base, prev_chunk_left_over=p[None], inference_delay=2, execution_horizon=6, rtc_beta=4.0,
                                  rtc_schedule="EXP"))  # LeRobot's names and a batch of one
    assert np.array_equal(g["trajectory"], g2["trajectory"])
    assert np.abs(g["trajectory"] - a["trajectory"]).max() > 1e-2
    import molmoact
    bad = [({"rtc_prefix": p[:, :5]}, "observation.rtc_prefix_dim is 5"),
           ({"rtc_prefix": np.full((11, base["action_dim"]), 0.1, np.float32)}, "observation.rtc_prefix_rows is 11"),
           ({"rtc_prefix": np.where(np.arange(p.size).reshape(p.shape) == 3, np.nan, p)}, "observation.rtc_prefix[3]"),
           ({"rtc_delay": 2}, "rtc_delay: needs rtc_prefix"),
           ({"rtc_prefix": p, "rtc_schedule": "sigmoid"}, "rtc_schedule: one of"),
           ({"rtc_prefix": p, "rtc_beta": float("inf")}, "rtc_beta: expected a finite number")]
    if base["cfg"]["n_obs_steps"] == 2:
        bad.append(({"rtc_prefix": np.full((10, base["action_dim"]), 0.1, np.float32)}, "observation.rtc_prefix_rows is 10: 1..9"))
    for extra, needle in bad:
        with pytest.raises(molmoact.MolmoActError) as e:
            policy.infer(binding_obs(base, **extra))
        assert needle in str(e.value), (needle, str(e.value))


def test_cli_refusals(base):
    p = prefix_of(base, 4, False)
    ok = os.path.join(base["tmp"], "ok.npy")
    np.save(ok, p)
    nan = os.path.join(base["tmp"], "nan.npy")
    q = p.copy()
    q[1, 2] = np.inf
    np.save(nan, q)
    wide = os.path.join(base["tmp"], "wide.npy")
    np.save(wide, np.zeros((3, 5), np.float32))
    f64 = os.path.join(base["tmp"], "f64.npy")
    np.save(f64, p.astype(np.float64))
    inp = os.path.join(base["tmp"], "in.npz")
    cases = [(["--rtc-delay", "2"], "need --rtc-prefix"),
             (["--rtc-prefix", ok, "--rtc-schedule", "sigmoid"], "--rtc-schedule sigmoid: linear, exp, ones or zeros"),
             (["--rtc-prefix", nan], "rtc_prefix[" + str(1 * p.shape[1] + 2) + "] (row 1, column 2) is not finite"),
             (["--rtc-prefix", wide], "rtc_prefix_dim is 5"),
             (["--rtc-prefix", f64], "expected float32 [rows, dim]"),
             (["--rtc-prefix", os.path.join(base["tmp"], "absent.npy")], "absent.npy: cannot open")]
    for args, needle in cases:
        rc, _, err = run("run", "--model", base["dir"], "--inputs", inp, "--inproc", *args)
        assert rc != 0 and needle in err, (args, err)


def test_report_measurements():
    """prints the largest |C - reference| of each case (pytest -s)"""
    for k, v in sorted(MEASURED.items()):
        print("rtc e2e", k, f"{v:.3g}")
