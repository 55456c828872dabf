# SPDX-License-Identifier: Apache-2.0
"""Each engine keeps its own settings (issue 37): two engines in one process, opened from two
threads through the Python binding, one on the cpu backend and one on the qnn backend (the
stand-in QNN library of tests/qnn_stub), with different thread counts, base directories and
verbosity. A worker of each is killed; after the restart each engine's new worker runs with its
own engine's settings (read from outside, from /proc: its threads, its environment, the libraries
it mapped), and the process's environment was never written.

    MOLMOACT=build/molmoact MOLMOACT_LIBRARY=build/libmolmoact.so MA_BUILD_DIR=build \
        /usr/bin/python3 -m pytest -q python/tests/test_settings.py
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.normpath(os.path.join(HERE, "..", ".."))
BIN = os.environ.get("MOLMOACT", os.path.join(SRC, "build", "molmoact"))
BUILD = os.environ.get("MA_BUILD_DIR", os.path.dirname(os.path.abspath(BIN)))
STUB = os.path.join(BUILD, "tests/qnn_stub/ok")
TINY = os.path.join(SRC, "assets", "tiny-grid")

# run in a child process: its stderr (the workers' too) is the test's to read, and the
# environment it starts with is exactly this one
SCRIPT = textwrap.dedent(r'''
    import ctypes, json, os, signal, sys, threading, time
    import numpy as np
    sys.path.insert(0, os.path.join(sys.argv[1], "python"))
    import molmoact
    cfg = json.loads(sys.argv[2])
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    WATCH = ("MOLMOACT_BACKEND", "MOLMOACT_THREADS", "MOLMOACT_BASE_DIR", "MOLMOACT_QNN_LIB_DIR", "LD_LIBRARY_PATH",
             "ADSP_LIBRARY_PATH", "MOLMOACT_VERBOSE", "MOLMOACT2_PROMPT_SEQ", "MOLMOACT_PROMPT_SEQ")
    env0 = {k: libc.getenv(k.encode()) for k in WATCH}
    pols, errs = {}, []

    def open_one(name):
        try:
            pols[name] = molmoact.Policy(cfg[name]["model"], **cfg[name]["options"])
        except Exception as e:  # noqa: BLE001
            errs.append(f"{name}: {e}")

    th = [threading.Thread(target=open_one, args=(n,)) for n in ("a", "b")]
    [t.start() for t in th]
    [t.join() for t in th]
    assert not errs, errs
    obs = np.load(cfg["obs"])
    def infer(name, out):
        try:
            p = pols[name]
            r = p.infer({"image": obs["image0"], "wrist_image": obs["image1"], "state": obs["state"], "task": "put the bowl on the plate",
                         "seed": 7})
            out[name] = np.asarray(r["actions"])
        except Exception as e:  # noqa: BLE001
            errs.append(f"{name}: {e}")

    def both():
        out = {}
        th = [threading.Thread(target=infer, args=(n, out)) for n in ("a", "b")]
        [t.start() for t in th]
        [t.join() for t in th]
        assert not errs, errs
        return out

    def workers(model):
        """{worker name: pid} of this process's workers for a model directory"""
        found = {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if ppid == os.getpid() and len(argv) > 3 and argv[1] == b"__worker" and argv[3] == model.encode():
                found[argv[0].decode().split(":", 1)[1]] = int(pid)
        return found

    first = both()
    killed = {"a": cfg["a"]["kill"], "b": cfg["b"]["kill"]}
    old = {}
    for n in ("a", "b"):
        pid = workers(cfg[n]["model"])[killed[n]]
        old[n] = pid
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.3)
    second = both()  # the dead workers are found between requests and started again
    report = {"env0": {k: v.decode() if v else None for k, v in env0.items()},
              "env1": {k: (libc.getenv(k.encode()) or b"").decode() or None for k in WATCH}, "workers": {}, "settings": {},
              "same": {n: bool(np.array_equal(first[n], second[n])) for n in ("a", "b")}}
    for n in ("a", "b"):
        pid = workers(cfg[n]["model"])[killed[n]]
        assert pid != old[n]
        with open(f"/proc/{pid}/environ", "rb") as f:
            wenv = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        with open(f"/proc/{pid}/maps") as f:
            maps = f.read()
        report["workers"][n] = {"threads": len(os.listdir(f"/proc/{pid}/task")),
                                "adsp": (wenv.get(b"ADSP_LIBRARY_PATH") or b"").decode(),
                                "ld": (wenv.get(b"LD_LIBRARY_PATH") or b"").decode(),
                                "qnn_mapped": "libQnnHtp.so" in maps}
        report["settings"][n] = {k: pols[n].setting(k) for k in ("backend", "threads", "base_dir", "verbose", "prompt_seq")}
    for p in pols.values():
        p.close()
    print(json.dumps(report))
''')


def make_contexts(tmp):
    """tiny-grid compiled for a static prompt, with the stand-in's context binaries"""
    golden = os.path.join(TINY, "golden")
    prompt = int(np.load(golden + "/llm_split0_io.npz")["hidden_in"].shape[0])
    seq = prompt + 64  # room for the task below: every run pads
    ctx = str(tmp / "ctx")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MOLMOACT", "MA_QNN_STUB"))}
    subprocess.run([BIN, "compile", os.path.join(TINY, "model"), "-o", ctx, "--prompt-seq", str(seq), "--quiet"], check=True, env=env,
                   capture_output=True, timeout=600)
    subprocess.run(["/usr/bin/python3", os.path.join(SRC, "tests/qnn_stub/make_contexts.py"), ctx, "--golden", golden, "--seq", str(seq)],
                   check=True, capture_output=True, timeout=600)
    rng = np.random.default_rng(3)
    obs = str(tmp / "obs.npz")
    np.savez(obs, image0=rng.integers(0, 256, (96, 128, 3), dtype=np.uint8), image1=rng.integers(0, 256, (64, 64, 3), dtype=np.uint8),
             state=np.array([0.1, -0.2, 0.9, 3.0, -0.1, 0.05, 0.03, -0.03], np.float32))
    return ctx, seq, obs


@pytest.mark.skipif(not os.path.exists(os.path.join(STUB, "libQnnHtp.so")), reason="the stand-in QNN library is not built")
def test_two_engines_keep_their_settings_across_worker_restarts(tmp_path):
    ctx, seq, obs = make_contexts(tmp_path)
    base_a, base_b = tmp_path / "base-a", tmp_path / "base-b"
    base_a.mkdir()
    base_b.mkdir()
    cfg = {"obs": obs,
           "a": {"model": os.path.join(TINY, "model"), "kill": "llm_split1",
                 "options": {"backend": "cpu", "threads": 3, "base": str(base_a), "worker_exe": BIN}},
           "b": {"model": ctx, "kill": "vision",
                 "options": {"backend": "qnn", "threads": 1, "base": str(base_b), "worker_exe": BIN, "qnn_lib_dir": STUB,
                             "verbose": True, "prompt_seq": seq}}}
    import json
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MOLMOACT_", "MA_QNN_STUB", "ADSP_", "DSP_"))}
    env.pop("MOLMOACT2_PROMPT_SEQ", None)
    if "MOLMOACT_LIBRARY" in os.environ:
        env["MOLMOACT_LIBRARY"] = os.environ["MOLMOACT_LIBRARY"]
    p = subprocess.run(["/usr/bin/python3", "-c", SCRIPT, SRC, json.dumps(cfg)], capture_output=True, timeout=600, env=env)
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 0, err
    r = json.loads(p.stdout.decode().strip().splitlines()[-1])
    # the process's environment was never written (setenv is not thread-safe, and workers
    # restarted later would have inherited whatever the last open put there)
    assert r["env1"] == r["env0"], (r["env0"], r["env1"])
    # each engine reports its own settings
    assert r["settings"]["a"] == {"backend": "cpu", "threads": "3", "base_dir": str(base_a), "verbose": "0", "prompt_seq": "0"}
    assert r["settings"]["b"] == {"backend": "qnn", "threads": "1", "base_dir": str(base_b), "verbose": "1", "prompt_seq": str(seq)}
    # the restarted workers run with their own engine's settings
    a, b = r["workers"]["a"], r["workers"]["b"]
    assert a["threads"] == 3 and not a["qnn_mapped"] and a["adsp"] == "" and not a["ld"].startswith(os.path.realpath(STUB)), a
    assert b["qnn_mapped"] and b["adsp"] == os.path.realpath(STUB) and b["ld"].startswith(os.path.realpath(STUB)), b
    # the same actions before and after the restart, on each engine
    assert r["same"] == {"a": True, "b": True}
    # -v is engine b's alone: its vision worker said its graphs at its start and at its restart
    assert err.count("vision_socid77_archv73.bin") == 2, err
