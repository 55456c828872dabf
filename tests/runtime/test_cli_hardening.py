# SPDX-License-Identifier: Apache-2.0
"""The CLI against hostile and careless input (issue 17): each case once crashed, hung, leaked,
replaced what it should not have, or accepted a contradiction (issue 36: numbers with spaces, '+'
or hex, a suffix that is a path, a --keep pattern that matches nothing). Runs the real binary.

    MOLMOACT=build/molmoact MOLMOACT_SRC=. /usr/bin/python3 -m pytest -q tests/runtime/test_cli_hardening.py
"""
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import time

import numpy as np
import pytest

BIN = os.environ.get("MOLMOACT", "build/molmoact")
SRC = os.environ.get("MOLMOACT_SRC", ".")
MODEL = os.path.join(SRC, "assets/tiny-grid/model")
GOLDEN = os.path.join(SRC, "assets/tiny-grid/golden")
# the zip64 reproducer of issue 17 (segfaulted run --inputs and killed run --stream)
ZIP48 = bytes.fromhex("934eade403504b0607864c204e06a40102010000782e6e7079504b0506060000000003ffffffff7120200320003c003c")


def run(*args, stdin=None, env=None, timeout=300):
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([BIN, *args], input=stdin, capture_output=True, timeout=timeout, env=e)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


@pytest.fixture(scope="module")
def obs(tmp_path_factory):
    d = tmp_path_factory.mktemp("obs")
    vis, step0 = np.load(GOLDEN + "/vision_io.npz"), np.load(GOLDEN + "/step0_boundary.npz")
    ok = str(d / "ok.npz")
    np.savez(ok, pixels=vis["pixels"], input_ids=step0["input_ids"], noise=step0["noise"])
    bad = str(d / "zip48.npz")
    with open(bad, "wb") as f:
        f.write(ZIP48)
    return {"ok": ok, "zip48": bad, "dir": d}


def test_zip64_reproducer_is_refused_and_the_stream_goes_on(obs):
    rc, out, err = run("run", "--model", MODEL, "--inputs", obs["zip48"], "--runs", "1")
    assert rc == 1, (rc, err)
    assert "zip64" in err and "zip48.npz" in err
    rc, out, err = run("run", "--model", MODEL, "--noise", obs["zip48"], "--inputs", obs["ok"], "--runs", "1")
    assert rc == 1 and "zip48.npz" in err, (rc, err)
    lines = f"{obs['zip48']}\n{obs['ok']}\n".encode()
    rc, out, err = run("run", "--model", MODEL, "--stream", stdin=lines)
    res = [json.loads(x) for x in out.splitlines()]
    assert rc == 3 and len(res) == 2, (rc, out, err)
    assert "zip64" in res[0]["error"] and "actions" in res[1]


def make_nodes(d):
    """a null and a full device made in d (never the machine's own); None where mknod is refused"""
    null, full = os.path.join(d, "null"), os.path.join(d, "full")
    try:
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        os.mknod(full, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
        os.close(os.open(null, os.O_WRONLY))
    except OSError:
        pytest.skip("mknod or device nodes not allowed here")
    return null, full


def test_out_never_replaces_a_device_or_a_symlink(obs, tmp_path):
    null, full = make_nodes(str(tmp_path))
    rc, out, err = run("run", "--model", MODEL, "--inputs", obs["ok"], "--runs", "1", "--out", null)
    assert rc == 0, err
    assert stat.S_ISCHR(os.stat(null).st_mode)
    rc, out, err = run("run", "--model", MODEL, "--inputs", obs["ok"], "--runs", "1", "--out", full)
    assert rc == 1 and "No space left on device" in err and full in err, err
    assert stat.S_ISCHR(os.stat(full).st_mode)
    # a symlink: its target is written, the link stays
    target, link = tmp_path / "target.npz", tmp_path / "link.npz"
    target.write_bytes(b"old")
    os.symlink("target.npz", link)
    rc, out, err = run("run", "--model", MODEL, "--inputs", obs["ok"], "--runs", "1", "--out", str(link))
    assert rc == 0, err
    assert os.path.islink(link) and np.load(target)["actions"].shape == (10, 7)
    # preprocess -o and the stream's OUT column take the same path
    rc, out, err = run("preprocess", "--model", MODEL, "--image0", os.path.join(SRC, "fuzz/corpus/image/rgb.png"), "-o", null)
    assert rc == 0 and stat.S_ISCHR(os.stat(null).st_mode), err
    rc, out, err = run("run", "--model", MODEL, "--stream", stdin=f"{obs['ok']}\t{null}\n".encode())
    assert rc == 0 and stat.S_ISCHR(os.stat(null).st_mode), err
    assert sorted(os.listdir(tmp_path)) == ["full", "link.npz", "null", "target.npz"]  # no temporary left


def test_failed_run_leaves_no_output(obs, tmp_path):
    out_path, dump = tmp_path / "out.npz", tmp_path / "dump"
    dump.write_bytes(b"a regular file")
    rc, out, err = run("run", "--model", MODEL, "--inputs", obs["ok"], "--runs", "1", "--out", str(out_path), "--dump", str(dump))
    assert rc == 1 and "--dump" in err and "not a directory" in err, err
    assert not out_path.exists()
    # --out a directory, or empty
    rc, out, err = run("run", "--model", MODEL, "--inputs", obs["ok"], "--runs", "1", "--out", str(tmp_path))
    assert rc == 1 and "is a directory" in err
    rc, out, err = run("run", "--model", MODEL, "--inputs", obs["ok"], "--runs", "1", "--out", "")
    assert rc == 1 and "empty path" in err
    # both given and fine: both written
    dump.unlink()
    rc, out, err = run("run", "--model", MODEL, "--inputs", obs["ok"], "--runs", "1", "--out", str(out_path), "--dump", str(dump))
    assert rc == 0, err
    assert out_path.exists() and (dump / "intermediates.npz").exists()


def test_stream_lines_are_capped_and_checked(obs, tmp_path):
    long_line = "x" * 20000
    lines = f"{long_line}\n{obs['ok']}\t{tmp_path}/a.npz\textra\n{obs['ok']}\n".encode()
    rc, out, err = run("run", "--model", MODEL, "--stream", stdin=lines)
    res = [json.loads(x) for x in out.splitlines()]
    assert rc == 3 and len(res) == 3, (rc, out, err)
    assert "longer than" in res[0]["error"] and len(res[0]["input"]) <= 64
    assert "tab-separated" in res[1]["error"] and not os.path.exists(f"{tmp_path}/a.npz")
    assert "actions" in res[2]
    assert len(out) < 4096  # nothing long echoed


def test_truncated_context_in_the_orchestrator_is_an_error_not_sigbus(obs, tmp_path):
    ctx = str(tmp_path / "ctx")
    rc, out, err = run("compile", MODEL, "-o", ctx)
    assert rc == 0, err
    p = subprocess.Popen([BIN, "run", "--model", ctx, "--stream"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        p.stdin.write(f"{obs['ok']}\n".encode())
        p.stdin.flush()
        first = json.loads(p.stdout.readline())
        assert "actions" in first, first
        os.truncate(os.path.join(ctx, "embed.gguf"), 4096)  # the orchestrator maps it (the embedding)
        p.stdin.write(f"{obs['ok']}\n{obs['ok']}\n".encode())
        p.stdin.close()
        rest = [json.loads(x) for x in p.stdout.read().decode().splitlines()]
        rc = p.wait(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert rc == 3, (rc, p.stderr.read())  # not 135 (SIGBUS)
    assert len(rest) == 2 and all("embed.gguf" in r.get("error", "") for r in rest), rest


def test_tokenize_decode_error_path(tmp_path):
    rc, out, err = run("tokenize", "--tokenizer", os.path.join(MODEL, "tokenizer.json"), "--decode", stdin=b"[-1]\n[72, 105]\n")
    assert rc == 1, (rc, err)  # LSan (sanitizer build) would exit 23 on the leaked id array
    assert out.splitlines() == ["null", '"Hi"'], out
    rc, out, err = run("tokenize", "--tokenizer", os.path.join(MODEL, "tokenizer.json"), stdin=b"\"unterminated\n")
    assert rc == 1, (rc, err)


def test_fifo_input_is_refused_at_once(obs, tmp_path):
    fifo = str(tmp_path / "in.npz")
    os.mkfifo(fifo)
    t0 = time.monotonic()
    rc, out, err = run("run", "--model", MODEL, "--inputs", fifo, "--runs", "1", timeout=60)
    assert rc == 1 and "not a regular file" in err, err
    rc, out, err = run("run", "--model", MODEL, "--inputs", obs["ok"], "--noise", fifo, "--runs", "1", timeout=60)
    assert rc == 1 and "in.npz" in err, err
    assert time.monotonic() - t0 < 50


def test_json_errors_give_line_and_column(tmp_path):
    d = tmp_path / "model"
    shutil.copytree(MODEL, d)
    (d / "config.json").write_text('{\n  "a": 1,\n  "b" 2\n}\n')
    rc, out, err = run("run", "--model", str(d), "--runs", "1", "--inputs", os.path.join(GOLDEN, "step0_boundary.npz"))
    assert rc == 1 and "line 3, column 7" in err, err


def test_oversized_png_named_like_a_jpeg(tmp_path):
    import zlib
    import struct

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 40000, 40000, 8, 2, 0, 0, 0)) + chunk(b"IEND", b"")
    big = tmp_path / "big.png"
    big.write_bytes(png)
    rc, out, err = run("preprocess", "--model", MODEL, "--image0", str(big), "-o", str(tmp_path / "o.npz"))
    assert rc == 1 and "exceeds the" in err and "pixel limit" in err, err
    assert not (tmp_path / "o.npz").exists()


def test_long_task_string_named(tmp_path):
    p = str(tmp_path / "task.npz")
    np.savez(p, image0=np.zeros((8, 8, 3), np.uint8), image1=np.zeros((8, 8, 3), np.uint8),
             task=np.array("x" * 70000), state=np.zeros(8, np.float32))
    rc, out, err = run("run", "--model", MODEL, "--inputs", p, "--runs", "1")
    assert rc == 1 and "task" in err and "exceeds the limit" in err, err


@pytest.mark.parametrize("args,needle", [
    (["--seed", "1", "--noise", "n.npz"], "--seed and --noise"),
    (["--inputs", "a.npz", "--image0", "a.png"], "--inputs and --image0"),
    (["--inputs", "a.npz", "--stream"], "--stream"),
    (["--model", "a", "--model", "b"], "--model is given twice"),
    (["--out", "a.npz", "-o", "b.npz"], "--out is given twice"),
    (["--runs", "0"], "--runs"),
    (["--threads", "abc"], "--threads"),
    (["--seed", "-1"], "--seed"),
])
def test_contradictions_refused(args, needle):
    rc, out, err = run("run", *args)
    assert rc == 1 and needle in err, (rc, err)


@pytest.mark.parametrize("state,needle", [
    ("1,2,3,4,5,6,7,", "value 8"),
    ("0x1,0,0,0,0,0,0,0", "\"0x1\""),
    ("1,2,nan,4,5,6,7,8", "\"nan\""),
    ("1,,3,4,5,6,7,8", "value 2"),
    ("1e99,0,0,0,0,0,0,0", "float range"),
])
def test_state_must_be_decimal_numbers(state, needle):
    img = os.path.join(SRC, "fuzz/corpus/image/rgb.png")
    rc, out, err = run("run", "--model", MODEL, "--image0", img, "--image1", img, "--task", "pick", "--state", state, "--runs", "1")
    assert rc == 1 and "--state" in err and needle in err, (rc, err)


@pytest.mark.parametrize("env,needle", [
    ({"MOLMOACT_KERNELS": "bogus"}, "unknown kernel set"),
    ({"MOLMOACT_THREADS": "abc"}, "MOLMOACT_THREADS=abc"),
    ({"MOLMOACT_THREADS": "0"}, "MOLMOACT_THREADS=0"),
    ({"MOLMOACT_WORKER_DEADLINE_MS": "0"}, "MOLMOACT_WORKER_DEADLINE_MS=0"),
    ({"MOLMOACT_WORKER_DEADLINE_MS": "-5"}, "MOLMOACT_WORKER_DEADLINE_MS=-5"),
    ({"MOLMOACT_GEMM_PANELS": "sideways"}, "MOLMOACT_GEMM_PANELS"),
    ({"MOLMOACT2_PROMPT_SEQ": "12x"}, "MOLMOACT2_PROMPT_SEQ"),
])
def test_environment_checked(env, needle, obs):
    rc, out, err = run("run", "--model", MODEL, "--inputs", obs["ok"], "--runs", "1", env=env)
    assert rc == 1 and needle in err, (rc, err)


def test_unavailable_kernel_set_named(obs):
    cpuinfo = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    if " amx_tile" in cpuinfo:
        pytest.skip("this CPU has AMX")
    rc, out, err = run("run", "--model", MODEL, "--inputs", obs["ok"], "--runs", "1", env={"MOLMOACT_KERNELS": "amx"})
    assert rc == 1 and "not supported by this CPU" in err, err


def test_compile_options_checked(tmp_path):
    rc, out, err = run("compile", MODEL, "-o", str(tmp_path / "c"), "--prompt-seq", "99999999999")
    assert rc == 1 and "--prompt-seq 99999999999" in err, err
    rc, out, err = run("compile", MODEL, "-o", str(tmp_path / "c"), "--llm", "q4_0", "--llm", "f16")
    assert rc == 1 and "given twice" in err, err
    assert not (tmp_path / "c").exists()


def test_unbounded_flow_steps_refused(tmp_path):
    d = tmp_path / "model"
    shutil.copytree(MODEL, d)
    cfg = (d / "config.json").read_text().replace('"flow_matching_num_steps": 10', '"flow_matching_num_steps": 100000')
    (d / "config.json").write_text(cfg)
    rc, out, err = run("compile", str(d), "-o", str(tmp_path / "c"), timeout=60)
    assert rc == 1 and "flow_matching_num_steps" in err, err
    assert sorted(os.listdir(tmp_path)) == ["model"]
    rc, out, err = run("run", "--model", str(d), "--runs", "1", "--inputs", os.path.join(GOLDEN, "step0_boundary.npz"), timeout=60)
    assert rc == 1 and "flow_matching_num_steps" in err, err


def test_malformed_noise_entry_in_an_npz_is_named(tmp_path):
    """issue 26 E16: a bad `noise` entry of an .npz was reported as the .npy 'bad magic'"""
    import zipfile
    p = str(tmp_path / "noise.npz")
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("noise.npy", b"\x93NUMPY\x01\x00" + b"\x10\x00" + b"{'descr': '<f4'" + b" " * 10)
    rc, out, err = run("run", "--model", MODEL, "--golden", GOLDEN, "--noise", p, "--runs", "1")
    assert rc == 1 and "bad magic" not in err and "noise.npz" in err, err
    rc, out, err2 = run("inspect", p)
    assert rc != 0
    q = str(tmp_path / "garbage.bin")
    open(q, "wb").write(b"hello world")
    rc, out, err = run("run", "--model", MODEL, "--golden", GOLDEN, "--noise", q, "--runs", "1")
    assert rc == 1 and "neither an .npy array nor an .npz" in err, err


# issue 36 F23: numbers are plain decimals, suffixes are not paths, patterns must match

@pytest.mark.parametrize("args", [
    ["--runs", " 2"], ["--runs", "+2"], ["--runs", "2 "], ["--runs", "0x2"], ["--runs", "１"],
    ["--seed", " -1"], ["--seed", "+1"], ["--seed", "-1"], ["--seed", "0x10"],
    ["--gate", "0x1p-1"], ["--gate", " 0.5"], ["--gate", "+0.5"], ["--gate", "nan"], ["--gate", "infinity"], ["--gate", ".5e"],
    ["--threads", "\t2"],
])
def test_numbers_are_plain_decimals(args):
    rc, out, err = run("run", "--model", MODEL, "--golden", GOLDEN, *args)
    assert rc == 1 and args[0] in err and "must be" in err, (args, rc, err)


def test_plain_decimals_are_taken():
    rc, out, err = run("run", "--model", MODEL, "--golden", GOLDEN, "--runs", "1", "--seed", "0", "--gate", "1e-3", "--threads", "2")
    assert rc == 0, err
    rc, out, err = run("parity", "--model", MODEL, "--golden", GOLDEN, "--gate", "-.5")
    assert rc == 1 and "--gate -.5" in err, err  # a number, out of range


@pytest.mark.parametrize("var,value", [
    ("MOLMOACT_THREADS", " 2"), ("MOLMOACT_THREADS", "+2"), ("MOLMOACT_THREADS", "2 "),
    ("MOLMOACT_WORKER_DEADLINE_MS", "+1000"), ("MOLMOACT_PROMPT_SEQ", " 128"), ("MOLMOACT2_PROMPT_SEQ", "+128"),
])
def test_environment_numbers_are_plain_decimals(var, value, obs):
    rc, out, err = run("run", "--model", MODEL, "--inputs", obs["ok"], "--runs", "1", env={var: value})
    assert rc == 1 and f"{var}={value}" in err, (rc, err)


@pytest.mark.parametrize("var", ["MOLMOACT_VISION_CTX_SUFFIX", "LLM_CTX_SUFFIX", "MOLMOACT_ACTION_CTX_SUFFIX"])
@pytest.mark.parametrize("value", ["/../../x", "a/b", "..", "x" * 65])
def test_context_suffix_is_not_a_path(var, value, obs, tmp_path):
    ctx = str(tmp_path / "ctx")
    rc, out, err = run("compile", MODEL, "-o", ctx, "--quiet")
    assert rc == 0, err
    rc, out, err = run("run", "--model", ctx, "--inputs", obs["ok"], "--runs", "1", env={var: value})
    assert rc == 1 and var in err and "suffix" in err, (rc, err)
    rc, out, err = run("compile", MODEL, "-o", str(tmp_path / "ctx2"), env={var: value})
    assert rc == 1 and var in err, (rc, err)


def test_keep_patterns_must_match(tmp_path):
    out = str(tmp_path / "c")
    rc, _, err = run("compile", MODEL, "-o", out, "--llm", "q4_0", "--keep", "*ff_out*=q8_0", "--keep", "*.ff_0ut.*=q8_0")
    assert rc == 1 and "--keep *.ff_0ut.*=q8_0" in err and "matches no matrix" in err, err
    rc, _, err = run("compile", MODEL, "-o", out, "--compute-keep", "*scout*")  # no component computed in bf16
    assert rc == 1 and "--compute-keep *scout*" in err, err
    rc, _, err = run("compile", MODEL, "-o", out, "--compute", "llm=bf16", "--compute-keep", "*scout*")  # scout: vision, fp32
    assert rc == 1 and "--compute-keep *scout*" in err, err
    assert not os.path.exists(out)
    rc, _, err = run("compile", MODEL, "-o", out, "--llm", "q4_0", "--keep", "*ff_out*=q8_0", "--compute", "vision=bf16",
                     "--compute-keep", "*scout*", "--quiet")
    assert rc == 0, err
    assert "--keep" not in err, err  # --quiet: no report
    # each override reported, and a pattern that changes nothing said so
    rc, _, err = run("compile", MODEL, "-o", str(tmp_path / "c2"), "--llm", "q4_0", "--keep", "*ff_out*=q8_0", "--keep", "*attn_out*=f16")
    assert rc == 0, err
    assert re.search(r"--keep \*ff_out\*=q8_0: [1-9]\d* matri(x|ces) stored in q8_0 \(first: model\.transformer\.blocks\.\d+\.mlp\.ff_out\.weight\)", err), err
    rc, _, err = run("compile", MODEL, "-o", str(tmp_path / "c3"), "--keep", "*ff_out*=q8_0")
    assert rc == 0 and "--keep *ff_out*=q8_0: 0 matrices stored in q8_0 (the pattern's matrices are that precise already)" in err, err
