# SPDX-License-Identifier: Apache-2.0
"""LeRobot MolmoAct2 policy directories (issue 27): written by reference/make_lerobot.py in the
layout LeRobot saves, run with --base and through the Hugging Face cache, compiled (LoRA merged),
against the PyTorch reference's golden of the equivalent HF directory; LeRobot's arithmetic and
prompt against the reference; bad directories refused by name.

    MOLMOACT=build/molmoact MOLMOACT_SRC=. /usr/bin/python3 -m pytest -q tests/model/test_lerobot.py"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

BIN = os.environ.get("MOLMOACT", "build/molmoact")
SRC = os.environ.get("MOLMOACT_SRC", ".")
PY = "/usr/bin/python3"
TINY = os.path.join(SRC, "assets/tiny-grid/model")
sys.path.insert(0, os.path.join(SRC, "reference"))


def run(*args, env=None, timeout=600):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MOLMOACT_BASE"))}
    e.update(env or {})
    p = subprocess.run([BIN, *args], capture_output=True, timeout=timeout, env=e)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def make(tmp, name, *args):
    out, eff = str(tmp / name), str(tmp / (name + "-hf"))
    subprocess.run([PY, os.path.join(SRC, "reference/make_lerobot.py"), "--model", TINY, "-o", out, "--effective", eff,
                    "--repo-id", "test-org/tiny-grid", *args], check=True, capture_output=True, timeout=300)
    return out, eff


def golden(eff, out, inputs=None):
    cmd = [PY, os.path.join(SRC, "reference/make_golden.py"), "--model", eff, "-o", out]
    if inputs:
        cmd += ["--inputs", inputs]
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    return out


@pytest.fixture(scope="module")
def fft(tmp_path_factory):
    """a full fine-tune, saved by LeRobot main, continuous mode"""
    d = tmp_path_factory.mktemp("fft")
    out, eff = make(d, "policy", "--constant-state-dim", "5")
    return {"dir": out, "eff": eff, "golden": golden(eff, str(d / "golden")), "tmp": d}


@pytest.fixture(scope="module")
def lora(tmp_path_factory):
    """LoRA on the VLM, saved by LeRobot v0.6 (normaliser at step 3 ... and v0.6's field names), both mode"""
    d = tmp_path_factory.mktemp("lora")
    out, eff = make(d, "policy", "--lora", "--action-mode", "both", "--release", "v0.6")
    return {"dir": out, "eff": eff, "golden": golden(eff, str(d / "golden")), "tmp": d}


def test_parity_with_base(fft):
    rc, out, err = run("parity", "--model", fft["dir"], "--base", TINY, "--golden", fft["golden"])
    assert rc == 0 and "PASS" in out, out + err


@pytest.mark.parametrize("mode", ["--inproc", "resident"])
def test_raw_observation_end_to_end(fft, mode, tmp_path):
    """frames, task and state through LeRobot's statistics and prompt: the C engine against the
    reference's golden of the same raw observation"""
    from molmoact_ref import synthetic
    obs = synthetic.synthetic_observation(3)
    rng = np.random.default_rng(4)
    state = np.asarray(obs["state"], np.float32)
    state[5] = 9.0  # beyond the range: clamped; dim 5 has q01 == q99 (LeRobot's eps rule)
    noise = rng.standard_normal((1, 10, 32)).astype(np.float32)
    inp = str(tmp_path / "in.npz")
    np.savez(inp, image0=obs["image0"], image1=obs["image1"], task=np.array(obs["task"]), state=state, noise=noise)
    g = golden(fft["eff"], str(tmp_path / "g"), inp)
    want = np.load(os.path.join(g, "intermediates.npz"))
    out = str(tmp_path / "out.npz")
    extra = [mode] if mode != "resident" else []
    rc, _, err = run("run", "--model", fft["dir"], "--base", TINY, "--inputs", inp, "--out", out, "--runs", "1", *extra)
    assert rc == 0, err
    got = np.load(out)["actions"]
    assert np.abs(got - want["actions"]).max() <= 1e-5 * max(1.0, np.abs(want["actions"]).max()), (got, want["actions"])


def test_prompt_ids_equal_the_reference(fft):
    """the state normalised with LeRobot's arithmetic and binned: ids as the reference builds them"""
    from molmoact_ref import config as cfglib, processing
    cfg = cfglib.load(os.path.join(fft["eff"], "config.json"))
    norm = processing.NormStats.load(os.path.join(fft["eff"], "norm_stats.json"))
    tok = processing.load_tokenizer(os.path.join(fft["eff"], "tokenizer.json"))
    rng = np.random.default_rng(9)
    lines, want = [], []
    for i in range(12):
        st = rng.uniform(-2, 2, 8).astype(np.float32)
        st[6:] = rng.uniform(-1, 1, 2)  # the pass-through (gripper) dims stay in [-1, 1]
        lines.append(json.dumps({"task": "Put the bowl on the plate.", "state": [float(x) for x in st]}))
        want.append(processing.build_prompt_ids(cfg, tok, "Put the bowl on the plate.", st, norm, 16)["input_ids"].tolist())
    p = subprocess.run([BIN, "prompt", "--model", fft["dir"], "--base", TINY], input="\n".join(lines).encode(), capture_output=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    got = [json.loads(l) for l in p.stdout.decode().splitlines()]
    assert [g["input_ids"] if isinstance(g, dict) else g for g in got] == want


def test_pass_through_state_outside_the_range_is_refused(fft):
    p = subprocess.run([BIN, "prompt", "--model", fft["dir"], "--base", TINY],
                       input=json.dumps({"task": "x", "state": [0, 0, 0, 0, 0, 0, 1.5, 0]}).encode(), capture_output=True, timeout=60)
    assert "observation.state[6] is 1.5" in (p.stdout + p.stderr).decode(), (p.stdout + p.stderr).decode()


def test_lora_needs_compile_which_merges_as_peft(lora, tmp_path):
    rc, _, err = run("run", "--model", lora["dir"], "--base", TINY, "--golden", lora["golden"], "--runs", "1", "--inproc")
    assert rc != 0 and "unmerged LoRA" in err and "compile" in err, err
    ctx = str(tmp_path / "ctx")
    rc, _, err = run("compile", lora["dir"], "--base", TINY, "-o", ctx)
    assert rc == 0, err
    rc, out, err = run("parity", "--model", ctx, "--golden", lora["golden"])
    assert rc == 0 and "PASS" in out, out + err
    # the context directory stands alone: its statistics keep LeRobot's arithmetic
    ns = json.load(open(os.path.join(ctx, "norm_stats.json")))
    assert ns["metadata_by_tag"]["lerobot"]["arithmetic"] == "lerobot"


def test_continuous_and_both_differ(fft, lora):
    """the saved action_mode chooses the expert's encoder mask: the goldens of the two differ"""
    a = np.load(os.path.join(fft["golden"], "intermediates.npz"))["encoder_mask"]
    b = np.load(os.path.join(lora["golden"], "intermediates.npz"))["encoder_mask"]
    assert a.sum() > b.sum()  # continuous: every prompt token; both: EOS tokens hidden


def hub_cache(tmp_path, repo="test-org/tiny-grid", rev="0123456789abcdef0123456789abcdef01234567"):
    cache = tmp_path / "hub"
    snap = cache / ("models--" + repo.replace("/", "--")) / "snapshots" / rev
    snap.mkdir(parents=True)
    for f in ("config.json", "tokenizer.json", "processor_config.json", "norm_stats.json"):
        shutil.copy(os.path.join(TINY, f), snap / f)
    (cache / ("models--" + repo.replace("/", "--")) / "refs").mkdir()
    (cache / ("models--" + repo.replace("/", "--")) / "refs" / "main").write_text(rev)
    return cache


def test_base_from_the_hub_cache(fft, tmp_path):
    cache = hub_cache(tmp_path)
    for env in ({"HF_HUB_CACHE": str(cache)}, {"HF_HOME": str(cache.parent), "HF_HUB_CACHE": ""}):
        if "HF_HOME" in env:
            (cache.parent / "hubx").mkdir(exist_ok=True)
            shutil.move(str(cache), str(cache.parent / "hub"))  # $HF_HOME/hub
        rc, out, err = run("parity", "--model", fft["dir"], "--golden", fft["golden"], env=env)
        assert rc == 0 and "PASS" in out, out + err
    rc, _, err = run("parity", "--model", fft["dir"], "--golden", fft["golden"], env={"HF_HUB_CACHE": str(tmp_path / "empty")})
    assert rc != 0 and "test-org/tiny-grid" in err and "hf download test-org/tiny-grid" in err and "--base" in err, err


@pytest.mark.skipif(os.environ.get("MOLMOACT_SKIP_BINDING") == "1", reason="an instrumented library cannot load into Python")
def test_python_binding_and_api_take_the_base(fft):
    os.environ.setdefault("MOLMOACT_LIBRARY", os.path.join(os.path.dirname(os.path.abspath(BIN)), "libmolmoact.so"))
    sys.path.insert(0, os.path.join(SRC, "python"))
    import molmoact
    from molmoact_ref import synthetic
    obs = synthetic.synthetic_observation(5)
    with molmoact.Policy(fft["dir"], base=TINY, inproc=True) as p:
        out = p.infer({"image": obs["image0"], "wrist_image": obs["image1"], "state": np.clip(obs["state"], -1, 1), "task": obs["task"], "seed": 1})
    assert out["actions"].shape == (10, 7)


# ------------------------------------------------------------------------------- bad directories

def broken(fft, tmp_path, edit):
    d = tmp_path / "broken"
    shutil.copytree(fft["dir"], d)
    edit(d)
    return str(d)


def edit_json(path, fn):
    data = json.load(open(path))
    fn(data)
    json.dump(data, open(path, "w"))


@pytest.mark.parametrize("case,needle", [
    ("no_postprocessor", "policy_postprocessor.json"),
    ("stats_wrong_length", "has 6 values, but the policy's action has 7"),
    ("no_state_file", "policy_postprocessor_step_1_molmoact2_masked_unnormalizer.safetensors: missing"),
    ("renamed_step", "no step named molmoact2_masked_unnormalizer"),
    ("discrete", "action_mode \"discrete\""),
    ("lora_without_settings", "no LoRA settings"),
    ("peft_route", "use_peft"),
    ("grid_flag_contradicts", "use_grid_token_sampler"),
])
def test_bad_directories_named(fft, lora, tmp_path, case, needle):
    from molmoact_ref import safetensors as stio
    src = lora if case == "lora_without_settings" else fft

    def edit(d):
        if case == "no_postprocessor":
            os.unlink(d / "policy_postprocessor.json")
        elif case == "stats_wrong_length":
            f = d / "policy_postprocessor_step_1_molmoact2_masked_unnormalizer.safetensors"
            t = stio.load_file(str(f))
            stio.save_file({k: v[:6] for k, v in t.items()}, str(f))
        elif case == "no_state_file":
            os.unlink(d / "policy_postprocessor_step_1_molmoact2_masked_unnormalizer.safetensors")
        elif case == "renamed_step":
            edit_json(d / "policy_postprocessor.json", lambda p: p["steps"][1].update(registry_name="something_else"))
        elif case == "discrete":
            edit_json(d / "config.json", lambda c: c.update(action_mode="discrete"))
        elif case == "lora_without_settings":
            edit_json(d / "config.json", lambda c: (c.pop("enable_lora_vlm", None), c.update(train_mode_vlm="fft")))
        elif case == "peft_route":
            edit_json(d / "config.json", lambda c: c.update(use_peft=True))
        elif case == "grid_flag_contradicts":
            edit_json(d / "config.json", lambda c: c.update(use_grid_token_sampler=False))
    d = broken(src, tmp_path, edit)
    verb = ["compile", d, "-o", str(tmp_path / "ctx")] if case == "lora_without_settings" else ["parity", "--model", d, "--golden", src["golden"]]
    rc, out, err = run(*verb, "--base", TINY)
    assert rc != 0 and needle in err, (case, err)


def test_hf_config_fields(tmp_path):
    """a transformers-5 rope_parameters, depth_mode and an unknown field: read, ignored and listed"""
    d = tmp_path / "hf"
    shutil.copytree(TINY, d)
    cfg = json.load(open(d / "config.json"))
    theta = cfg["text_config"].pop("rope_theta", 1000000.0)
    cfg["text_config"]["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    cfg["depth_mode"] = 2
    cfg["some_future_field"] = {"x": 1}
    json.dump(cfg, open(d / "config.json", "w"))
    rc, out, err = run("parity", "--model", str(d), "--golden", os.path.join(SRC, "assets/tiny-grid/golden"))
    assert rc == 0 and "PASS" in out, out + err
    rc, out, err = run("inspect", str(d))
    assert "some_future_field" in out and "depth_mode" not in out.split("ignores:")[-1].split("\n")[0], out
    cfg["text_config"]["rope_parameters"]["rope_type"] = "linear"
    json.dump(cfg, open(d / "config.json", "w"))
    rc, out, err = run("parity", "--model", str(d), "--golden", os.path.join(SRC, "assets/tiny-grid/golden"))
    assert rc != 0 and "rope_parameters.rope_type linear" in err, err


@pytest.mark.parametrize("field,value,needle", [
    ("crop_mode", "overlap-and-resize-c2", "crop_mode \"overlap-and-resize-c2\" is not implemented"),
    ("image_mean", [0.48145466, 0.4578275, 0.40821073], "image_mean must be [0.5, 0.5, 0.5]"),
    ("resample", 3, "resample must be 2"),
    ("size", {"height": 336, "width": 336}, "image_processor.size"),
])
def test_processor_config_checked(tmp_path, field, value, needle):
    d = tmp_path / "hf"
    shutil.copytree(TINY, d)
    edit_json(d / "processor_config.json", lambda p: p["image_processor"].update({field: value}))
    rc, out, err = run("parity", "--model", str(d), "--golden", os.path.join(SRC, "assets/tiny-grid/golden"))
    assert rc != 0 and needle in err, err


@pytest.mark.parametrize("variant", ["tiny-grid", "tiny-original"])
def test_molmoact_equals_lerobots_padded_layout(variant, tmp_path):
    """LeRobot left-pads the prompt to a multiple of 8 before BOS and derives positions from the
    mask (reference pipeline.lerobot_layout); molmoact runs the prompt unpadded. The real tokens
    have the same positions and see the same keys, so the actions agree to fp32 rounding."""
    import torch
    from molmoact_ref import config as cfglib, loader, pipeline, processing
    mdir, gdir = os.path.join(SRC, "assets", variant, "model"), os.path.join(SRC, "assets", variant, "golden")
    cfg = cfglib.load(os.path.join(mdir, "config.json"))
    cfg, model = loader.load(mdir)
    norm = processing.NormStats.load(os.path.join(mdir, "norm_stats.json"))
    vis, step0 = np.load(os.path.join(gdir, "vision_io.npz")), np.load(os.path.join(gdir, "step0_boundary.npz"))
    ids = step0["input_ids"]
    padded, valid, pos = pipeline.lerobot_layout(cfg, ids)
    assert len(padded) % 8 == 1 and (len(ids) - 1) % 8 != 0  # padding happens: 8k + 1 wide
    assert pos[valid].tolist() == list(range(len(ids)))
    with torch.no_grad():
        lr = pipeline.run(model, cfg, norm, vis["pixels"], ids, step0["noise"], layout="lerobot")
    inp = str(tmp_path / "in.npz")
    np.savez(inp, pixels=vis["pixels"], input_ids=ids, noise=step0["noise"])
    out = str(tmp_path / "out.npz")
    rc, _, err = run("run", "--model", mdir, "--inputs", inp, "--out", out, "--runs", "1", "--inproc")
    assert rc == 0, err
    got = np.load(out)
    for k, ref in (("actions", lr["actions"].numpy()), ("trajectory", lr["traj_final"].numpy())):
        scale = max(1.0, float(np.abs(ref).max()))
        assert np.abs(got[k] - ref).max() <= 1e-5 * scale, (k, np.abs(got[k] - ref).max())
