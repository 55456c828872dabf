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


# ------------------------------------------------------------------------------- hardening (issue 36)

@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """a full fine-tune without a golden: for the checks that stop at load or compare with numpy"""
    d = tmp_path_factory.mktemp("plain")
    out, eff = make(d, "policy")
    return {"dir": out, "eff": eff, "tmp": d}


def copy_policy(plain, tmp_path, name="p"):
    d = tmp_path / name
    shutil.copytree(plain["dir"], d)
    return d


def one_line(err):
    """every message is one line: nothing untrusted is echoed with its control characters"""
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("path,needle", [
    ("a/" * 127, "checkpoint_path"),                      # F9: 127 '/' overflowed flat[300] in from_cache
    ("a/" * 300 + "b", "checkpoint_path"),                # and a longer one
    ("org/name/extra", "checkpoint_path"),                # more than one '/'
    ("org/na--me", "'--'"),
    ("org/na..me", "'..'"),
    ("../etc/passwd", "checkpoint_path"),
    ("org/.name", "checkpoint_path"),
    ("org/name-", "checkpoint_path"),
    ("org/name.git", ".git"),
    ("org/" + "n" * 97, "96"),
    ("org/na me", "checkpoint_path"),
    ("org/na\nme", "checkpoint_path"),                    # F22: a control character, not echoed raw
    ("org/na\x1b[2Jme", "checkpoint_path"),
])
def test_checkpoint_path_must_be_a_repo_id(plain, tmp_path, path, needle):
    d = copy_policy(plain, tmp_path)
    edit_json(d / "config.json", lambda c: c.update(checkpoint_path=path))
    rc, out, err = run("inspect", str(d), env={"HF_HUB_CACHE": str(tmp_path / "empty")}, timeout=60)
    assert rc == 1 and needle in err and "checkpoint_path" in err, (rc, err)
    line = one_line(err)
    assert "\x1b" not in line
    assert "hf download" not in line  # not a repo id: no download command for it


def test_checkpoint_path_valid_ids_still_looked_up(plain, tmp_path):
    """what huggingface_hub's validate_repo_id accepts goes on to the cache (and its download hint)"""
    for rid in ("Org_1/Name-2.v3", "gpt2"):
        d = copy_policy(plain, tmp_path, rid.replace("/", "_"))
        edit_json(d / "config.json", lambda c: c.update(checkpoint_path=rid))
        rc, out, err = run("inspect", str(d), env={"HF_HUB_CACHE": str(tmp_path / "empty")}, timeout=60)
        assert rc == 1 and "hf download " + rid in err, err


def fifo_or_skip(path):
    try:
        os.mkfifo(path)
    except (AttributeError, OSError) as e:
        pytest.skip(f"no FIFO here: {e}")


@pytest.mark.parametrize("where", ["refs", "snapshot_config", "policy_config", "pipeline"])
def test_a_fifo_is_refused_not_waited_for(plain, tmp_path, where):
    """F10: a FIFO at refs/main (or any metadata file) hung inspect/run/compile/serve forever"""
    cache = hub_cache(tmp_path)
    folder = cache / "models--test-org--tiny-grid"
    d = copy_policy(plain, tmp_path)
    if where == "refs":
        os.unlink(folder / "refs" / "main")
        fifo_or_skip(str(folder / "refs" / "main"))
    elif where == "snapshot_config":
        snap = next((folder / "snapshots").iterdir())
        os.unlink(snap / "config.json")
        fifo_or_skip(str(snap / "config.json"))
    elif where == "policy_config":
        os.unlink(d / "policy_postprocessor.json")
        fifo_or_skip(str(d / "policy_postprocessor.json"))
    else:
        os.unlink(d / "policy_preprocessor.json")
        fifo_or_skip(str(d / "policy_preprocessor.json"))
    for verb in (["inspect", str(d)], ["compile", str(d), "-o", str(tmp_path / "ctx")]):
        try:
            rc, out, err = run(*verb, env={"HF_HUB_CACHE": str(cache)}, timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{verb[0]} waited on the FIFO ({where})")
        assert rc != 0 and "not a regular file" in err, (verb[0], err)


REV = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize("case,needles", [
    ("no_repo", ["nor in the Hugging Face cache", "hf download test-org/tiny-grid"]),
    ("no_ref", ["refs/main", "no such ref"]),
    ("missing_snapshot", ["refs/main names commit " + "f" * 40, "snapshots/" + "f" * 40, "missing"]),
    ("ref_traversal", ["refs/main", "not a commit hash", "../../../etc"]),
    ("ref_newline_inside", ["refs/main", "not a commit hash", "\\x0a"]),
    ("snapshot_loop", ["snapshots/" + REV, "symbolic links"]),
    ("snapshot_is_file", ["snapshots/" + REV, "not a directory"]),
    ("config_loop", ["config.json", "symbolic links"]),
    ("revision_traversal", ["checkpoint_revision", "../../x"]),
    ("revision_slash", ["checkpoint_revision", "a/b"]),
    ("revision_missing", ["refs/v1", "no such ref"]),
])
def test_hub_cache_errors_say_what_is_wrong(plain, tmp_path, case, needles):
    """F22: each failure of the cache lookup with its own message, not all 'not in the cache'"""
    cache = hub_cache(tmp_path)
    folder = cache / "models--test-org--tiny-grid"
    snap = folder / "snapshots" / REV
    d = copy_policy(plain, tmp_path)
    if case == "no_repo":
        shutil.rmtree(folder)
    elif case == "no_ref":
        os.unlink(folder / "refs" / "main")
    elif case == "missing_snapshot":
        (folder / "refs" / "main").write_text("f" * 40)
    elif case == "ref_traversal":
        (folder / "refs" / "main").write_text("../../../etc")
    elif case == "ref_newline_inside":
        (folder / "refs" / "main").write_text(REV[:20] + "\n" + REV[20:])
    elif case == "snapshot_loop":
        shutil.rmtree(snap)
        os.symlink(str(snap), str(snap))
    elif case == "snapshot_is_file":
        shutil.rmtree(snap)
        snap.write_text("x")
    elif case == "config_loop":
        os.unlink(snap / "config.json")
        os.symlink(str(snap / "config.json"), str(snap / "config.json"))
    elif case.startswith("revision_"):
        rev = {"revision_traversal": "../../x", "revision_slash": "a/b", "revision_missing": "v1"}[case]
        edit_json(d / "config.json", lambda c: c.update(checkpoint_revision=rev))
    rc, out, err = run("inspect", str(d), env={"HF_HUB_CACHE": str(cache)}, timeout=60)
    line = one_line(err)
    assert rc == 1 and all(n in line for n in needles), (case, err)
    if case != "no_repo":
        assert "nor in the Hugging Face cache" not in line, (case, err)


def test_hub_cache_revision_by_hash_and_by_ref(plain, tmp_path):
    cache = hub_cache(tmp_path)
    folder = cache / "models--test-org--tiny-grid"
    (folder / "refs" / "v1.0").write_text(REV + "\n")
    for rev in (REV, "v1.0", None):
        d = copy_policy(plain, tmp_path, "p" + str(rev))
        edit_json(d / "config.json", lambda c: c.update(checkpoint_revision=rev))
        rc, out, err = run("inspect", str(d), env={"HF_HUB_CACHE": str(cache)}, timeout=60)
        assert rc == 0, (rev, err)


@pytest.mark.parametrize("file,path,value,needle", [
    # F22: wrong JSON types were ignored (a default used instead)
    ("config.json", ["action_mode"], 3, "action_mode must be a string"),
    ("config.json", ["inference_action_mode"], ["continuous"], "inference_action_mode must be a string"),
    ("config.json", ["checkpoint_path"], 7, "checkpoint_path must be a string"),
    ("config.json", ["checkpoint_revision"], 1, "checkpoint_revision must be a string"),
    ("config.json", ["chunk_size"], "10", "chunk_size must be an integer"),
    ("config.json", ["use_grid_token_sampler"], "yes", "use_grid_token_sampler must be true or false"),
    ("config.json", ["use_peft"], 1, "use_peft must be true or false"),
    ("config.json", ["lora_alpha"], "16", "lora_alpha must be a number"),
    ("config.json", ["train_mode_vlm"], True, "train_mode_vlm must be a string"),
    ("config.json", ["output_features", "action", "shape"], ["7"], "output_features.action.shape"),
    ("config.json", ["input_features", "observation.state", "shape"], [8.5], "input_features.observation.state.shape"),
    ("policy_postprocessor.json", ["steps", 1, "config", "eps"], "x", "eps must be a number"),
    ("policy_postprocessor.json", ["steps", 1, "config", "eps"], -1, "eps must be a number in (0, 1]"),
    ("policy_preprocessor.json", ["steps", 3, "config", "eps"], "x", "eps must be a number"),
    ("policy_preprocessor.json", ["steps", 5, "config", "num_state_tokens"], "256", "num_state_tokens must be an integer"),
    ("policy_preprocessor.json", ["steps", 5, "config", "add_setup_tokens"], "false", "add_setup_tokens must be true or false"),
    ("policy_preprocessor.json", ["steps", 5, "config", "setup_type"], 5, "setup_type must be a string"),
    # F21: numbers beyond int were cast with (int) (undefined; UBSan stops)
    ("config.json", ["chunk_size"], 1e10, "chunk_size must be an integer in [0, 1024]"),
    ("config.json", ["n_action_steps"], -1e19, "n_action_steps must be an integer in [0, 1024]"),
    ("config.json", ["num_inference_steps"], 1e20, "num_inference_steps must be an integer in [0, 256]"),
    ("config.json", ["lora_rank"], 1e15, "lora_rank must be an integer in [1, 65536]"),
    ("config.json", ["grid_token_sampler_num_tokens"], 3e9, "grid_token_sampler_num_tokens must be an integer"),
    ("config.json", ["output_features", "action", "shape"], [1e12], "output_features.action.shape"),
    ("config.json", ["input_features", "observation.state", "shape"], [-1e18], "input_features.observation.state.shape"),
    ("policy_preprocessor.json", ["steps", 5, "config", "num_state_tokens"], 1e11, "num_state_tokens must be an integer"),
])
def test_wrong_types_and_huge_numbers_named(plain, tmp_path, file, path, value, needle):
    d = copy_policy(plain, tmp_path)

    def setp(doc):
        o = doc
        for k in path[:-1]:
            o = o[k]
        o[path[-1]] = value
    edit_json(d / file, setp)
    rc, out, err = run("inspect", str(d), "--base", TINY, timeout=60)
    assert rc == 1 and needle in err and file in err, (path, err)
    one_line(err)


def test_control_characters_in_modes_are_escaped(plain, tmp_path):
    d = copy_policy(plain, tmp_path)
    edit_json(d / "config.json", lambda c: c.update(action_mode="disc\nrete\x07"))
    rc, out, err = run("inspect", str(d), "--base", TINY, timeout=60)
    assert rc == 1 and "disc\\x0arete\\x07" in one_line(err), err
    edit_json(d / "config.json", lambda c: c.update(action_mode="continuous"))
    edit_json(d / "policy_postprocessor.json", lambda p: p["steps"][1]["config"]["norm_map"].update(ACTION="QUANT\nILES"))
    rc, out, err = run("inspect", str(d), "--base", TINY, timeout=60)
    assert rc == 1 and "QUANT\\x0aILES" in one_line(err), err


# F12: statistics whose de-normalised range overflows float32 (inf actions with exit 0, invalid JSON)

def set_stats(d, fname, updates):
    from molmoact_ref import safetensors as stio
    f = d / fname
    t = {k: v.clone() for k, v in stio.load_file(str(f)).items()}
    for k, (i, v) in updates.items():
        t[k][i] = v  # float32 tensors: 3e38 and 1e38 are representable
    stio.save_file(t, str(f))


POST = "policy_postprocessor_step_1_molmoact2_masked_unnormalizer.safetensors"
PRE = "policy_preprocessor_step_3_molmoact2_masked_normalizer.safetensors"


@pytest.mark.parametrize("fname,updates,needle", [
    (POST, {"action.q99": (0, 3e38), "action.q01": (0, -3e38)}, "action.q99[0]"),   # q99 - q01 = inf
    (POST, {"action.q99": (2, 1e38), "action.q01": (2, -1e38)}, "action.q99[2]"),   # (a + 1) (q99 - q01) = inf
    (PRE, {"observation.state.q99": (1, 3e38), "observation.state.q01": (1, -3e38)}, "observation.state.q99[1]"),
])
def test_lerobot_stats_that_overflow_are_refused(plain, tmp_path, fname, updates, needle):
    d = copy_policy(plain, tmp_path)
    set_stats(d, fname, updates)
    rc, out, err = run("inspect", str(d), "--base", TINY, timeout=60)
    line = one_line(err)
    assert rc == 1 and fname in line and needle in line and "float32" in line, err


def hf_copy(tmp_path, edit):
    d = tmp_path / "hf"
    shutil.copytree(TINY, d)
    edit_json(d / "norm_stats.json", lambda n: edit(n, n["metadata_by_tag"]["libero"]))
    return d


def hf_inputs(tmp_path):
    g = os.path.join(SRC, "assets/tiny-grid/golden")
    v, s = np.load(os.path.join(g, "vision_io.npz")), np.load(os.path.join(g, "step0_boundary.npz"))
    inp = str(tmp_path / "in.npz")
    np.savez(inp, pixels=v["pixels"], input_ids=s["input_ids"], noise=s["noise"])
    return inp


def test_hf_stats_that_overflow_are_refused(tmp_path):
    def edit(n, m):
        m["action_stats"]["q99"][0] = 3e38
        m["action_stats"]["q01"][0] = -3e38
    d = hf_copy(tmp_path, edit)
    rc, out, err = run("run", "--model", str(d), "--inputs", hf_inputs(tmp_path), "--runs", "1", "--inproc", "--json", timeout=120)
    line = one_line(err)
    assert rc == 1 and "norm_stats.json" in line and "libero.action_stats" in line and "q99[0]" in line and "float32" in line, (out, err)
    # a value beyond float32 itself (1e39 is finite as a double)
    d2 = tmp_path / "hf2"
    shutil.copytree(d, d2)
    edit_json(d2 / "norm_stats.json", lambda n: n["metadata_by_tag"]["libero"]["action_stats"].update(q99=[1e39] * 7, q01=[0.0] * 7))
    rc, out, err = run("prompt", "--model", str(d2), timeout=60)
    assert rc == 1 and "q99[0]" in err and "float32" in err, err


def test_non_finite_action_fails_the_request(tmp_path):
    """mean_std leaves the model's output unclipped (HF arithmetic): statistics that are finite at
    +-1 std can still overflow; the de-normalisation step refuses the request"""
    inp = hf_inputs(tmp_path)
    ok = str(tmp_path / "ok.npz")
    rc, _, err = run("run", "--model", TINY, "--inputs", inp, "--out", ok, "--runs", "1", "--inproc", timeout=120)
    assert rc == 0, err
    traj = np.load(ok)["trajectory"][:, :7]
    assert np.abs(traj).max() > 1.01  # the premise: the model's output goes beyond one std

    def edit(n, m):
        n["norm_mode"] = "mean_std"
        m["action_stats"]["mean"] = [0.0] * 7
        m["action_stats"]["std"] = [3.4e38] * 7
        m["action_stats"]["mask"] = [True] * 7
    d = hf_copy(tmp_path, edit)
    for extra in (["--json"], ["--out", str(tmp_path / "o.npz")], []):
        rc, out, err = run("run", "--model", str(d), "--inputs", inp, "--runs", "1", "--inproc", *extra, timeout=120)
        assert rc == 1 and "not finite" in err and "inf" not in out, (extra, out, err)
    assert not os.path.exists(tmp_path / "o.npz")


# mixed normalisation modes: each feature type with its own mode (LeRobot's normalization_mapping)

def lerobot_normalize(x, st, mode, eps=np.float32(1e-8)):
    """LeRobot's _NormalizationMixin._apply_transform (src/lerobot/processor/normalize_processor.py at
    huggingface/lerobot 7427f31801f944f5ec9ce53cda02862ce7d1638b), forward, in float32, then the
    MolmoAct2 mask and clamp steps (policies/molmoact2/processor_molmoact2.py)"""
    f = np.float32
    x = x.astype(f)
    if mode == "MEAN_STD":
        y = (x - st["mean"]) / (st["std"] + eps)
    elif mode == "IDENTITY":
        y = x.copy()
    else:
        lo, hi = (st["min"], st["max"]) if mode == "MIN_MAX" else (st["q01"], st["q99"])
        den = hi - lo
        den = np.where(den == 0, eps, den).astype(f)
        y = f(2) * (x - lo) / den - f(1)
    m = st["mask"].astype(bool)
    return np.where(m, np.clip(y, -1, 1), x).astype(f)


def lerobot_unnormalize(a, st, mode, eps=np.float32(1e-8)):
    """the inverse branch of the same function, after molmoact2_clamp_action"""
    f = np.float32
    a = np.clip(a.astype(f), -1, 1)
    if mode == "MEAN_STD":
        y = a * st["std"] + st["mean"]
    elif mode == "IDENTITY":
        y = a.copy()
    elif mode == "MIN_MAX":
        den = st["max"] - st["min"]
        den = np.where(den == 0, eps, den).astype(f)
        y = (a + f(1)) / f(2) * den + st["min"]
    else:
        den = st["q99"] - st["q01"]
        den = np.where(den == 0, eps, den).astype(f)
        y = (a + f(1)) * den / f(2) + st["q01"]
    return np.where(st["mask"].astype(bool), y, a).astype(f)


@pytest.mark.parametrize("state_mode,action_mode", [
    ("MIN_MAX", "QUANTILES"), ("QUANTILES", "MIN_MAX"), ("MEAN_STD", "QUANTILES"), ("QUANTILES", "MEAN_STD"), ("IDENTITY", "MIN_MAX"),
])
def test_mixed_normalisation_modes(plain, tmp_path, state_mode, action_mode):
    """state and action with different modes: run and compile, against numpy with LeRobot's formulas"""
    from molmoact_ref import safetensors as stio, synthetic
    d = copy_policy(plain, tmp_path)
    for f in ("policy_preprocessor.json", "policy_postprocessor.json"):
        edit_json(d / f, lambda p: [s["config"]["norm_map"].update(STATE=state_mode, ACTION=action_mode)
                                    for s in p["steps"] if "norm_map" in s.get("config", {})])
    edit_json(d / "config.json", lambda c: c["normalization_mapping"].update(STATE=state_mode, ACTION=action_mode))
    pre = {k: np.asarray(v, np.float32) for k, v in stio.load_file(str(d / PRE)).items()}
    post = {k: np.asarray(v, np.float32) for k, v in stio.load_file(str(d / POST)).items()}
    sst = {k.split(".")[-1]: v for k, v in pre.items() if k.startswith("observation.state.")}
    ast = {k.split(".")[-1]: v for k, v in post.items() if k.startswith("action.")}
    obs = synthetic.synthetic_observation(3)
    rng = np.random.default_rng(11)
    state = np.asarray(obs["state"], np.float32)
    state[6:] = np.clip(state[6:], -1, 1)  # the pass-through (gripper) dims stay in [-1, 1]
    state[0] = sst["max"][0] + 0.5 if state_mode != "IDENTITY" else 0.25  # beyond the range: clamped
    noise = rng.standard_normal((1, 10, 32)).astype(np.float32)
    inp = str(tmp_path / "in.npz")
    np.savez(inp, image0=obs["image0"], image1=obs["image1"], task=np.array(obs["task"]), state=state, noise=noise)
    ctx = str(tmp_path / "ctx")
    rc, _, err = run("compile", str(d), "--base", TINY, "-o", ctx, timeout=600)
    assert rc == 0, err
    for model, extra in ((str(d), ["--base", TINY]), (ctx, [])):
        dump = tmp_path / ("dump-" + os.path.basename(model))
        rc, _, err = run("run", "--model", model, *extra, "--inputs", inp, "--dump", str(dump), "--runs", "1", "--inproc", timeout=300)
        assert rc == 0, err
        got = np.load(dump / "intermediates.npz")
        want_state = lerobot_normalize(state, sst, state_mode)
        assert np.array_equal(got["state_normalized"], want_state), (model, got["state_normalized"], want_state)
        traj = got["trajectory"].reshape(-1, got["trajectory"].shape[-1])
        want = lerobot_unnormalize(traj[: got["actions"].shape[0], :7], ast, action_mode)
        np.testing.assert_allclose(got["actions"], want, rtol=2e-7, atol=1e-7, err_msg=model)


def test_serve_refuses_non_finite_action(tmp_path):
    """F12 through serve: the request fails (no 200 with inf in the body), the server stays up"""
    import base64
    import socket
    import time
    import urllib.error
    import urllib.request
    from molmoact_ref import synthetic
    obs = synthetic.synthetic_observation(2)
    noise = np.random.default_rng(5).standard_normal((1, 10, 32)).astype(np.float32)
    state = np.clip(np.asarray(obs["state"], np.float32), -1, 1)
    inp = str(tmp_path / "in.npz")
    np.savez(inp, image0=obs["image0"], image1=obs["image1"], task=np.array(obs["task"]), state=state, noise=noise)
    ok = str(tmp_path / "ok.npz")
    rc, _, err = run("run", "--model", TINY, "--inputs", inp, "--out", ok, "--runs", "1", "--inproc", timeout=120)
    assert rc == 0, err
    assert np.abs(np.load(ok)["trajectory"][:, :7]).max() > 1.01  # the premise: beyond one std

    def edit(n, m):
        n["norm_mode"] = "mean_std"
        m["action_stats"].update(mean=[0.0] * 7, std=[3.4e38] * 7, mask=[True] * 7)
    d = hf_copy(tmp_path, edit)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    e = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MOLMOACT_BASE"))}
    log = open(tmp_path / "serve.log", "w+")
    p = subprocess.Popen([BIN, "serve", "--model", str(d), "--port", str(port)], stdout=subprocess.DEVNULL, stderr=log, env=e)
    try:
        deadline = time.time() + 120
        while True:
            assert p.poll() is None and time.time() < deadline, open(tmp_path / "serve.log").read()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)

        def j(a):
            a = np.ascontiguousarray(a)
            return {"__numpy__": base64.b64encode(a.tobytes()).decode(), "dtype": a.dtype.str, "shape": list(a.shape)}
        req = json.dumps({"image": j(obs["image0"]), "wrist_image": j(obs["image1"]), "state": j(state), "instruction": obs["task"],
                          "noise": j(noise)}).encode()
        try:
            with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/act", data=req, method="POST"), timeout=120) as r:
                code, body = r.status, r.read().decode()
        except urllib.error.HTTPError as ex:
            code, body = ex.code, ex.read().decode()
        assert code != 200 and "error" in json.loads(body), (code, body[:500])
        assert p.poll() is None
    finally:
        p.terminate()
        p.wait(timeout=60)
        log.close()
    assert "not finite" in open(tmp_path / "serve.log").read()  # the server's log names it
