# SPDX-License-Identifier: Apache-2.0
"""`molmoact compile` publishing its contexts (issue 26: E7, E22, E23): the manifest ties every
file of a context directory to the compile that wrote it; an interrupted compile leaves neither a
staging directory nor a mix of plans; edited host files are refused.

    MOLMOACT=build/molmoact MOLMOACT_SRC=. /usr/bin/python3 -m pytest -q tests/runtime/test_compile_publish.py
"""
import fcntl
import glob
import json
import os
import shutil
import signal
import subprocess
import time

import pytest

BIN = os.environ.get("MOLMOACT", "build/molmoact")
SRC = os.environ.get("MOLMOACT_SRC", ".")
TINY = os.path.join(SRC, "assets/tiny-grid/model")
GOLDEN = os.path.join(SRC, "assets/tiny-grid/golden")


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
