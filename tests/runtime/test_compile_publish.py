# SPDX-License-Identifier: Apache-2.0
"""`molmoact compile` publishing its contexts (issue 26: E7, E22, E23): the manifest ties every
file of a context directory to the compile that wrote it; an interrupted compile leaves neither a
staging directory nor a mix of plans; edited host files are refused. Issue 36: an output in the
source refused (F11), the same compile giving the same bytes, LoRA merged as PEFT's
merge_and_unload() merges (bit for bit against torch) and broken adapters refused (F20), `prompt`
on a LoRA policy.

    MOLMOACT=build/molmoact MOLMOACT_SRC=. /usr/bin/python3 -m pytest -q tests/runtime/test_compile_publish.py
"""
import fcntl
import glob
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

BIN = os.environ.get("MOLMOACT", "build/molmoact")
SRC = os.environ.get("MOLMOACT_SRC", ".")
TINY = os.path.join(SRC, "assets/tiny-grid/model")
GOLDEN = os.path.join(SRC, "assets/tiny-grid/golden")
PY = "/usr/bin/python3"


def run(*args, timeout=600):
    p = subprocess.run([BIN, *args], capture_output=True, timeout=timeout)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def opens(ctx):
    """the directory opens and gives its golden's actions (parity exits 0)"""
    return run("parity", "--model", ctx, "--golden", GOLDEN)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """a checkpoint whose compile takes seconds (real widths), to be interrupted"""
    goldens = os.environ.get("MOLMOACT_TEST_GOLDENS", "")
    for cand in sorted(glob.glob(os.path.join(goldens, "bench*", "model"))):
        if os.path.isfile(os.path.join(cand, "config.json")):
            return cand
    d = tmp_path_factory.mktemp("bench") / "model"
    subprocess.run(["/usr/bin/python3", os.path.join(SRC, "reference/make_checkpoint.py"), "--config", "bench", "--variant", "grid",
                    "--seed", "3", "-o", str(d)], check=True, capture_output=True, timeout=900)
    return str(d)


def interrupt_compile(src, out, sig, extra=()):
    p = subprocess.Popen([BIN, "compile", src, "-o", out, *extra], stderr=subprocess.PIPE)
    parent, base = os.path.split(out)
    deadline = time.time() + 120
    while time.time() < deadline:  # the staging directory exists and holds a context
        st = glob.glob(os.path.join(parent, base + ".compile-*", "*.gguf*"))
        if st:
            break
        assert p.poll() is None, p.stderr.read().decode()
        time.sleep(0.01)
    time.sleep(0.3)
    assert p.poll() is None, "compile ended before the signal"
    p.send_signal(sig)
    rc = p.wait(timeout=60)
    return rc, p.stderr.read().decode()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_compile_into_a_new_directory_leaves_nothing(big, tmp_path, sig):
    out = str(tmp_path / "ctx")
    rc, err = interrupt_compile(big, out, sig)
    assert rc == -sig, (rc, err)  # killed by the signal, after cleaning up
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)


def test_interrupted_compile_into_an_existing_directory_keeps_it_whole(big, tmp_path):
    out = str(tmp_path / "ctx")
    q4 = ("--vision", "q4_0", "--llm", "q4_0", "--action", "q4_0")  # a third of f16's disk
    rc, _, err = run("compile", big, "-o", out, *q4)
    assert rc == 0, err
    before = json.load(open(os.path.join(out, "manifest.json")))
    rc, err = interrupt_compile(big, out, signal.SIGINT, ("--llm", "q8_0"))
    assert rc == -signal.SIGINT, (rc, err)
    assert sorted(os.listdir(tmp_path)) == ["ctx"]
    assert json.load(open(os.path.join(out, "manifest.json"))) == before
    rc, out_, err = run("bench", "--model", out, "--runs", "1", "--inproc")
    assert rc == 0, err  # the old plan opens, unchanged


def test_stale_staging_removed_and_a_live_one_kept(tmp_path):
    out = str(tmp_path / "ctx")
    stale = tmp_path / "ctx.compile-abc123"
    stale.mkdir()
    (stale / "vision.gguf").write_bytes(b"x" * 1000)
    (stale / ".compile.lock").write_bytes(b"")
    live = tmp_path / "ctx.compile-live01"
    live.mkdir()
    (live / ".compile.lock").write_bytes(b"")
    fd = os.open(live / ".compile.lock", os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as a compile running now holds it
    try:
        rc, _, err = run("compile", TINY, "-o", out)
        assert rc == 0, err
        assert not stale.exists() and "interrupted compile" in err and str(stale.name) in err
        assert live.exists()
    finally:
        os.close(fd)
    unrelated = tmp_path / "other.compile-abc123"  # another target's: not ours to remove
    unrelated.mkdir()
    rc, _, err = run("compile", TINY, "-o", out)
    assert rc == 0 and unrelated.exists()


def test_a_mix_of_two_compiles_is_refused(tmp_path):
    """what a compile killed while it moved files in leaves: some files new, the manifest old"""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    assert run("compile", TINY, "-o", a)[0] == 0
    assert run("compile", TINY, "-o", b, "--vision", "q8_0", "--llm", "q8_0")[0] == 0
    assert opens(a)[0] == 0
    shutil.copy(os.path.join(b, "vision.gguf"), os.path.join(a, "vision.gguf"))
    rc, _, err = opens(a)
    assert rc != 0 and "vision.gguf" in err and "mixes two compiles" in err, err
    os.unlink(os.path.join(a, "manifest.json"))
    rc, _, err = opens(a)
    assert rc != 0 and "manifest" in err, err


def test_suffix_variants_keep_their_manifest_entries(tmp_path):
    out = str(tmp_path / "ctx")
    assert run("compile", TINY, "-o", out)[0] == 0
    assert run("compile", TINY, "-o", out, "--llm", "q4_0", "--suffix", "_w4a16")[0] == 0
    mf = json.load(open(os.path.join(out, "manifest.json")))["files"]
    assert "llm_split0.gguf" in mf and "llm_split0_w4a16.gguf" in mf
    assert mf["llm_split0.gguf"]["compile_id"] != mf["llm_split0_w4a16.gguf"]["compile_id"]
    assert opens(out)[0] == 0


def test_edited_host_files_are_refused(tmp_path):
    out = str(tmp_path / "ctx")
    assert run("compile", TINY, "-o", out)[0] == 0
    ns = os.path.join(out, "norm_stats.json")
    orig = open(ns).read()
    first_number = next(t for t in orig.replace(",", " ").split() if t[:1].isdigit() or t[:1] == "-")
    open(ns, "w").write(orig.replace(first_number, first_number + "1", 1))  # one statistic edited
    rc, _, err = opens(out)
    assert rc != 0 and "norm_stats.json changed after compile" in err, err
    open(ns, "w").write(orig)
    assert opens(out)[0] == 0
    shutil.copy(os.path.join(SRC, "assets/tiny-original/model/config.json"), os.path.join(out, "config.json"))
    rc, _, err = opens(out)
    assert rc != 0 and "config.json changed after compile" in err, err


# ----------------------------------------------------------------------------- issue 36

def tree(d):
    """every file under d with its bytes"""
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, d)] = open(p, "rb").read()
    return out


def test_an_output_in_the_source_is_refused(tmp_path):
    """F11: `compile SRC -o SRC` turned the checkpoint into a context directory; an output inside
    it, or reached through a link, wrote into it too"""
    src = tmp_path / "src"
    shutil.copytree(TINY, src)
    (tmp_path / "link").symlink_to(src)
    before = tree(src)
    for out in (str(src), str(src) + "/", str(src / "ctx"), str(src / "a" / "b"), str(tmp_path / "link"),
                str(tmp_path / "link" / "ctx"), os.path.join(str(src), "..", "src", "ctx")):
        rc, _, err = run("compile", str(src), "-o", out)
        assert rc == 1 and f"-o {out} is" in err and "the source directory" in err, (out, rc, err)
        assert tree(src) == before, out
        assert sorted(os.listdir(tmp_path)) == ["link", "src"], os.listdir(tmp_path)
    rc, _, err = run("compile", str(src), "-o", str(tmp_path / "ctx"), "--quiet")  # beside it: fine
    assert rc == 0, err


def test_the_same_compile_gives_the_same_bytes(tmp_path):
    """every compile wrote a random compile_id: now it is derived from the input and the options"""
    a, b, c = str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "c")
    for d in (a, b):
        rc, _, err = run("compile", TINY, "-o", d, "--llm", "q8_0", "--quiet")
        assert rc == 0, err
    ta, tb = tree(a), tree(b)
    assert sorted(ta) == sorted(tb) and "manifest.json" in ta
    for name in ta:
        assert ta[name] == tb[name], name
    assert run("compile", TINY, "-o", c, "--quiet")[0] == 0  # other options: another id

    def cid(d):
        return json.load(open(os.path.join(d, "manifest.json")))["files"]["action_step.gguf"]["compile_id"]

    assert cid(a) != cid(c)
    # the step modulations are computed with the kernel set: another one, other last bits, another id
    s = str(tmp_path / "s")
    p = subprocess.run([BIN, "compile", TINY, "-o", s, "--llm", "q8_0", "--quiet"], capture_output=True, timeout=600,
                       env=dict(os.environ, MOLMOACT_KERNELS="scalar"))
    assert p.returncode == 0, p.stderr
    if "kernels: scalar" not in subprocess.run([BIN, "--version"], capture_output=True, text=True).stdout:
        assert cid(s) != cid(a)


# LoRA policies (reference/make_lerobot.py: LeRobot's layout, PEFT's keys, fp32 adapters)

def make_policy(d, *args):
    subprocess.run([PY, os.path.join(SRC, "reference/make_lerobot.py"), "--model", TINY, "-o", str(d), "--repo-id", "test-org/tiny-grid",
                    "--lora", *args], check=True, capture_output=True, timeout=300)
    return str(d)


@pytest.fixture(scope="module")
def lora_policy(tmp_path_factory):
    return make_policy(tmp_path_factory.mktemp("lora") / "policy")


def policy_tensors(policy):
    sys.path.insert(0, os.path.join(SRC, "reference"))
    from molmoact_ref import safetensors as stio
    return stio, stio.load_file(os.path.join(policy, "model.safetensors"))


def gguf_tensors(path):
    """the tensors of a GGUF file as compile writes it: name -> (ggml type, shape, bytes); matrices
    of a multiple of 16 rows are in the panel layout (kernels/gemm.h)"""
    b = open(path, "rb").read()
    assert b[:4] == b"GGUF"
    n_t, n_kv = struct.unpack_from("<QQ", b, 8)
    pos = 24
    fmt = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}

    def string(pos):
        n = struct.unpack_from("<Q", b, pos)[0]
        return b[pos + 8:pos + 8 + n].decode(), pos + 8 + n

    def value(t, pos):
        if t == 8:
            return string(pos)
        if t == 9:
            et, n = struct.unpack_from("<IQ", b, pos)
            pos += 12
            for _ in range(n):
                _, pos = value(et, pos)
            return None, pos
        return struct.unpack_from(fmt[t], b, pos)[0], pos + struct.calcsize(fmt[t])

    kv = {}
    for _ in range(n_kv):
        k, pos = string(pos)
        t = struct.unpack_from("<I", b, pos)[0]
        kv[k], pos = value(t, pos + 4)
    infos = []
    for _ in range(n_t):
        name, pos = string(pos)
        nd = struct.unpack_from("<I", b, pos)[0]
        dims = struct.unpack_from("<%dQ" % nd, b, pos + 4)
        gt, off = struct.unpack_from("<IQ", b, pos + 4 + 8 * nd)
        pos += 4 + 8 * nd + 12
        infos.append((name, gt, list(reversed(dims)), off))
    align = kv.get("general.alignment", 32)
    start = (pos + align - 1) // align * align
    return {name: (gt, shape, b, start + off) for name, gt, shape, off in infos}


def bf16_matrix(entry):
    """a bf16 context matrix as uint16 [rows, cols], out of the panel layout"""
    gt, shape, b, off = entry
    assert gt == 30, gt  # GGML bf16
    n, k = shape
    a = np.frombuffer(b, dtype=np.uint16, count=n * k, offset=off)
    return a.reshape(n // 16, k, 16).transpose(0, 2, 1).reshape(n, k) if n % 16 == 0 else a.reshape(n, k)


@pytest.mark.parametrize("adapter_dtype", ["float32", "bfloat16"])
def test_lora_merged_as_peft_merge_and_unload_bit_for_bit(lora_policy, tmp_path, adapter_dtype):
    """each merged weight against PEFT's merge in torch (huggingface/peft
    5d602fdbff04c33c1c4de55cda9d4ae1d7cb7e40, src/peft/tuners/lora/layer.py, Linear.get_delta_weight
    and Linear.merge with safe_merge False, merge_and_unload's default): the delta (B @ A) * scaling
    in fp32, cast back to the adapters' dtype when they are 16-bit (on a CPU), added to W in place:
    fp32 adapters round once, to W's dtype (bf16). The adapters hold small dyadic values, so B @ A is
    exact in fp32 whatever order a GEMM sums in: only the roundings can differ."""
    import torch
    policy = str(tmp_path / "policy")
    shutil.copytree(lora_policy, policy)
    stio, ts = policy_tensors(policy)
    g = torch.Generator().manual_seed(1)
    dt = getattr(torch, adapter_dtype)
    for name in list(ts):
        if ".lora_A.default." in name or ".lora_B.default." in name:  # k / 2^12, |k| < 64: exact in bf16 and fp32
            ts[name] = (torch.randint(-63, 64, ts[name].shape, generator=g).float() / 4096).to(dt)
    stio.save_file(ts, os.path.join(policy, "model.safetensors"))
    cfg = json.load(open(os.path.join(policy, "config.json")))
    scaling = cfg["lora_alpha"] / cfg["lora_rank"]
    ctx = str(tmp_path / "ctx")
    rc, _, err = run("compile", policy, "--base", TINY, "-o", ctx, "--vision", "bf16", "--llm", "bf16", "--quiet")
    assert rc == 0, err
    stored = {}
    for f in glob.glob(os.path.join(ctx, "*.gguf")):
        stored.update(gguf_tensors(f))
    prefix = "model.base_model.model."
    checked = differ = 0
    for name in sorted(ts):
        if not name.endswith(".base_layer.weight"):
            continue
        base = name[:-len(".base_layer.weight")]
        hf = base[len(prefix):] + ".weight"
        if hf not in stored:  # lm_head: not used by continuous actions, not compiled
            continue
        w, a, b = ts[name], ts[base + ".lora_A.default.weight"], ts[base + ".lora_B.default.weight"]
        assert w.dtype == torch.bfloat16
        # Linear.get_delta_weight (device cpu)
        cast_to_fp32 = b.dtype in (torch.float16, torch.bfloat16)
        wa, wb = (a.float(), b.float()) if cast_to_fp32 else (a, b)
        delta = (wb @ wa) * scaling
        if cast_to_fp32:
            delta = delta.to(dtype=b.dtype)
        # Linear.merge, safe_merge=False: base_layer.weight.data += delta_weight
        merged = w.clone()
        merged += delta
        want = merged.view(torch.int16).numpy().view(np.uint16)
        got = bf16_matrix(stored[hf])
        assert got.shape == want.shape, hf
        bad = np.argwhere(got != want)
        assert len(bad) == 0, f"{hf}: {len(bad)} of {want.size} differ, first at {bad[0].tolist()}"
        # the rounding this checks: the safe_merge order (delta cast to W's dtype first) differs
        two = w.clone()
        two += delta.to(w.dtype)
        differ += int((two.view(torch.int16) != merged.view(torch.int16)).sum())
        checked += 1
    assert checked >= 10, checked
    if adapter_dtype == "float32":
        assert differ > 0  # else the test could not tell one rounding from two


def test_broken_lora_is_refused_by_name(lora_policy, tmp_path):
    """F20: a NaN in lora_B, or a lora_alpha of 1e300 (or merely absurd), compiled and exited 0"""
    import torch
    policy = str(tmp_path / "policy")
    shutil.copytree(lora_policy, policy)
    stio, ts = policy_tensors(policy)
    orig = dict(ts)
    name = sorted(n for n in ts if n.endswith(".blocks.1.mlp.ff_out.lora_B.default.weight"))[0]
    ts[name] = ts[name].clone()
    ts[name][3, 1] = float("nan")
    stio.save_file(ts, os.path.join(policy, "model.safetensors"))
    out = str(tmp_path / "ctx")
    rc, _, err = run("compile", policy, "--base", TINY, "-o", out, "--quiet")
    assert rc == 1 and "model.transformer.blocks.1.mlp.ff_out.weight" in err and "LoRA" in err and "[3, " in err, err
    assert not os.path.exists(out) and not glob.glob(out + ".compile-*")
    stio.save_file(orig, os.path.join(policy, "model.safetensors"))
    cfg_path = os.path.join(policy, "config.json")
    cfg = json.load(open(cfg_path))
    for alpha in (1e300, 1e6, -16):
        json.dump(dict(cfg, lora_alpha=alpha), open(cfg_path, "w"))
        rc, _, err = run("compile", policy, "--base", TINY, "-o", out, "--quiet")
        assert rc == 1 and "lora_alpha" in err, (alpha, err)
        assert not os.path.exists(out)
    json.dump(cfg, open(cfg_path, "w"))
    rc, _, err = run("compile", policy, "--base", TINY, "-o", out, "--quiet")
    assert rc == 0, err


def test_a_mix_of_compiles_of_different_inputs_is_refused(lora_policy, tmp_path):
    """two compiles of one policy's tensors with different lora_alpha (the same fingerprint and
    embedded config, other merged weights): only the compile id tells their files apart"""
    p2 = str(tmp_path / "policy2")
    shutil.copytree(lora_policy, p2)
    cfg = json.load(open(os.path.join(p2, "config.json")))
    json.dump(dict(cfg, lora_alpha=cfg["lora_alpha"] / 2), open(os.path.join(p2, "config.json"), "w"))
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    assert run("compile", lora_policy, "--base", TINY, "-o", a, "--quiet")[0] == 0
    assert run("compile", p2, "--base", TINY, "-o", b, "--quiet")[0] == 0
    assert open(os.path.join(a, "llm_split0.gguf"), "rb").read() != open(os.path.join(b, "llm_split0.gguf"), "rb").read()
    shutil.copy(os.path.join(b, "llm_split0.gguf"), os.path.join(a, "llm_split0.gguf"))
    rc, _, err = run("run", "--model", a, "--runs", "1", "--inproc")
    assert rc != 0 and "llm_split0.gguf" in err and "mixes two compiles" in err, err


def test_a_weight_that_cannot_be_stored_is_refused(tmp_path):
    """beside F20: a checkpoint's own Inf, or an f32 value beyond f16's range, was stored as Inf"""
    sys.path.insert(0, os.path.join(SRC, "reference"))
    from molmoact_ref import safetensors as stio
    src = tmp_path / "src"
    shutil.copytree(TINY, src)
    path = str(src / "model.safetensors")
    orig = stio.load_file(path)
    name = "model.transformer.blocks.0.mlp.ff_out.weight"
    for value, dtype, needle in ((float("inf"), None, "holds inf at [0, 5]"), (1e5, "float32", "beyond what f16 holds")):
        ts = dict(orig)
        ts[name] = orig[name].clone() if dtype is None else orig[name].float()
        ts[name].view(-1)[5] = value
        stio.save_file(ts, path)
        rc, _, err = run("compile", str(src), "-o", str(tmp_path / "ctx"), "--quiet")
        assert rc == 1 and name in err and needle in err, err
        assert not (tmp_path / "ctx").exists()
    rc, _, err = run("compile", str(src), "-o", str(tmp_path / "ctx"), "--llm", "bf16", "--quiet")  # 1e5 fits bf16
    assert rc == 0, err


def test_a_lora_policy_compiles_reproducibly_and_not_into_its_base(lora_policy, tmp_path):
    base = tmp_path / "base"
    shutil.copytree(TINY, base)
    before = tree(base)
    rc, _, err = run("compile", lora_policy, "--base", str(base), "-o", str(base / "ctx"), "--quiet")
    assert rc == 1 and "the policy's base directory" in err, err
    assert tree(base) == before
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for d in (a, b):
        rc, _, err = run("compile", lora_policy, "--base", str(base), "-o", d, "--quiet")
        assert rc == 0, err
    assert tree(a) == tree(b)


def test_prompt_takes_a_lora_policy(lora_policy, tmp_path):
    """a prompt needs no weights: `prompt` refused a LoRA policy (unmerged adapters)"""
    ctx = str(tmp_path / "ctx")
    assert run("compile", lora_policy, "--base", TINY, "-o", ctx, "--quiet")[0] == 0
    line = json.dumps({"task": "put the bowl on the plate", "state": [0.1, -0.2, 0.3, 0.05, 0.0, 0.2, 0.01, -0.01]}) + "\n"

    def prompt(*args):
        p = subprocess.run([BIN, "prompt", *args], input=line.encode(), capture_output=True, timeout=300)
        return p.returncode, p.stdout.decode(), p.stderr.decode()

    rc, out, err = prompt("--model", lora_policy, "--base", TINY)
    assert rc == 0, err
    rc2, out2, err2 = prompt("--model", ctx)
    assert rc2 == 0, err2
    ids = json.loads(out)
    assert ids == json.loads(out2) and len(ids) > 10
