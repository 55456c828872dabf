# SPDX-License-Identifier: Apache-2.0
"""The qnn backend (issue 21) through a stand-in QNN library (tests/qnn_stub/qnn_stub.c, the same
binary interface as libQnnHtp.so / libQnnSystem.so) whose context binaries run the cpu kernels:
the real molmoact binary, resident (six worker processes) and --inproc, on both tiny variants.

    MA_BUILD_DIR=build MA_SOURCE_DIR=. /usr/bin/python3 -m pytest -q tests/qnn_stub/test_qnn_backend.py
"""
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

BUILD = os.environ.get("MA_BUILD_DIR", "build")
SRC = os.environ.get("MA_SOURCE_DIR", ".")
BIN = os.path.join(BUILD, "molmoact")
STUB = os.path.join(BUILD, "tests/qnn_stub/ok")
NOSYM = os.path.join(BUILD, "tests/qnn_stub/nosym")
MAKE = [os.path.join(SRC, "tests/qnn_stub/make_contexts.py")]
SEQ = 400  # longer than the tiny-grid prompt (378): every run pads


def run(*args, env=None, stdin=None, timeout=600, seq=SEQ):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("MA_QNN_STUB", "MOLMOACT"))}
    e["MOLMOACT2_PROMPT_SEQ"] = str(seq)
    e.update(env or {})
    e = {k: v for k, v in e.items() if v is not None}
    p = subprocess.run([BIN, *args], input=stdin, capture_output=True, timeout=timeout, env=e)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def qnn(*args, lib=STUB, **kw):
    return run(*args[:1], "--backend", "qnn", "--qnn-lib-dir", lib, *args[1:], **kw)


def make_ctx(model_dir, golden, seq=SEQ, *extra):
    subprocess.run(["/usr/bin/python3", *MAKE, model_dir, "--golden", golden, "--seq", str(seq), *extra], check=True)


@pytest.fixture(scope="module", params=["tiny-grid", "tiny-original"])
def variant(request, tmp_path_factory):
    name = request.param
    d = tmp_path_factory.mktemp(name)
    hf, golden = os.path.join(SRC, "assets", name, "model"), os.path.join(SRC, "assets", name, "golden")
    prompt = int(np.load(golden + "/llm_split0_io.npz")["hidden_in"].shape[0])
    seq = prompt + 22  # every run pads
    ctx = str(d / "ctx32")
    rc, out, err = run("compile", hf, "-o", ctx, "--prompt-seq", str(seq), seq=seq)
    assert rc == 0, err
    make_ctx(ctx, golden, seq)
    vis, step0 = np.load(golden + "/vision_io.npz"), np.load(golden + "/step0_boundary.npz")
    obs = str(d / "obs.npz")
    np.savez(obs, pixels=vis["pixels"], input_ids=step0["input_ids"], noise=step0["noise"])
    return {"name": name, "hf": hf, "golden": golden, "ctx": ctx, "obs": obs, "dir": d, "seq": seq, "prompt": prompt}


def actions(path):
    return np.load(path)["actions"]


def cosine(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_padding_keeps_the_actions(variant, tmp_path):
    """a prompt padded to the static length gives the unpadded actions to fp32 rounding"""
    a, b = str(tmp_path / "a.npz"), str(tmp_path / "b.npz")
    rc, _, err = run("run", "--model", variant["hf"], "--inputs", variant["obs"], "--out", a, "--inproc", "--runs", "1",
                     env={"MOLMOACT2_PROMPT_SEQ": None}, seq=variant["seq"])
    assert rc == 0, err
    rc, _, err = run("run", "--model", variant["hf"], "--inputs", variant["obs"], "--out", b, "--inproc", "--runs", "1", seq=variant["seq"])
    assert rc == 0, err
    x, y = np.load(a), np.load(b)
    for k in ("actions", "trajectory"):
        assert np.abs(x[k] - y[k]).max() <= 1e-5 * max(1.0, np.abs(x[k]).max()), k


def test_prompt_longer_than_the_contexts_is_refused(variant):
    rc, _, err = run("run", "--model", variant["hf"], "--inputs", variant["obs"], "--inproc", "--runs", "1",
                     env={"MOLMOACT2_PROMPT_SEQ": "300"}, seq=variant["seq"])
    assert rc != 0 and f"{variant['prompt']} tokens" in err and "300" in err, err


@pytest.mark.parametrize("mode", ["resident", "inproc"])
def test_qnn_gives_the_cpu_backend_actions_bit_for_bit(variant, mode, tmp_path):
    cpu, q = str(tmp_path / "cpu.npz"), str(tmp_path / "qnn.npz")
    extra = ["--inproc"] if mode == "inproc" else []
    rc, _, err = run("run", "--model", variant["ctx"], "--inputs", variant["obs"], "--out", cpu, "--runs", "1", *extra, seq=variant["seq"])
    assert rc == 0, err
    rc, out, err = qnn("run", "--model", variant["ctx"], "--inputs", variant["obs"], "--out", q, "--runs", "2", *extra, seq=variant["seq"])
    assert rc == 0, err
    assert np.array_equal(np.load(cpu)["actions"], np.load(q)["actions"])
    assert np.array_equal(np.load(cpu)["trajectory"], np.load(q)["trajectory"])
    assert "latency over 1 run" in out and "warm (runs 2-2)" in out


@pytest.mark.parametrize("io", ["float16", "ufixed16"])
def test_half_and_fixed_point_io_within_the_gate(variant, io, tmp_path):
    d = str(tmp_path / io)
    shutil.copytree(variant["ctx"], d, ignore=shutil.ignore_patterns("ctx"))
    make_ctx(d, variant["golden"], variant["seq"], "--io", io)
    cpu, q = str(tmp_path / "cpu.npz"), str(tmp_path / "q.npz")
    rc, _, err = run("run", "--model", variant["ctx"], "--inputs", variant["obs"], "--out", cpu, "--runs", "1", "--inproc", seq=variant["seq"])
    assert rc == 0, err
    rc, _, err = qnn("run", "--model", d, "--inputs", variant["obs"], "--out", q, "--runs", "1", seq=variant["seq"])
    assert rc == 0, err
    assert cosine(actions(cpu), actions(q)) >= 0.9999


def test_parity_passes_through_qnn(variant, tmp_path):
    """contexts at the golden's own prompt length: every session's outputs against the golden"""
    seq = int(np.load(variant["golden"] + "/llm_split0_io.npz")["hidden_in"].shape[0])
    d = str(tmp_path / "native")
    rc, _, err = run("compile", variant["hf"], "-o", d, "--prompt-seq", str(seq), seq=variant["seq"])
    assert rc == 0, err
    make_ctx(d, variant["golden"], seq)
    rc, out, err = qnn("parity", "--model", d, "--golden", variant["golden"], env={"MOLMOACT2_PROMPT_SEQ": str(seq)}, seq=variant["seq"])
    assert rc == 0 and "PASS" in out, (out, err)
    assert out.count(" ok") >= 16, out


# ---------------------------------------------------------------- faults: named and survived

@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    d = tmp_path_factory.mktemp("grid")
    golden = os.path.join(SRC, "assets/tiny-grid/golden")
    ctx = str(d / "ctx")
    assert run("compile", os.path.join(SRC, "assets/tiny-grid/model"), "-o", ctx, "--prompt-seq", str(SEQ))[0] == 0
    make_ctx(ctx, golden)
    vis, step0 = np.load(golden + "/vision_io.npz"), np.load(golden + "/step0_boundary.npz")
    obs = str(d / "obs.npz")
    np.savez(obs, pixels=vis["pixels"], input_ids=step0["input_ids"], noise=step0["noise"])
    return {"ctx": ctx, "obs": obs, "golden": golden, "dir": d}


def variant_ctx(grid, tmp_path, *extra):
    d = str(tmp_path / "v")
    shutil.copytree(grid["ctx"], d, ignore=shutil.ignore_patterns("ctx"))
    make_ctx(d, grid["golden"], SEQ, *extra)
    return d


@pytest.mark.parametrize("mode", ["--inproc", "resident"])
@pytest.mark.parametrize("case,needle", [
    ({"lib": "/nonexistent/qnn"}, "cannot load /nonexistent/qnn/libQnnHtp.so"),
    ({"lib": NOSYM}, "does not export QnnInterface_getProviders"),
    ({"env": {"MA_QNN_STUB_API": "2.9"}}, "provides QNN API 2.9.0; molmoact needs 2.14 or newer"),
    ({"env": {"MA_QNN_STUB_FAULT": "reject:llm_split1"}},
     "QnnContext_createFromBinary on ctx/llm_split1_socid77_archv73.bin: error 5008 (CONTEXT_BINARY_CONFIGURATION: not built for "
     "this device): QNN_CONTEXT_ERROR_BINARY_CONFIGURATION: context binary rejected"),
    ({"env": {"MA_QNN_STUB_FAULT": "no_graph:action_step"}},
     "QnnGraph_retrieve on ctx/action_step_socid77_archv73.bin: error 6002 (GRAPH_DOES_NOT_EXIST): "
     "QNN_GRAPH_ERROR_GRAPH_DOES_NOT_EXIST: graph action_step_graph is not in this context"),
    ({"env": {"MA_QNN_STUB_FAULT": "execute_error:llm_split2"}},
     "QnnGraph_execute on ctx/llm_split2_socid77_archv73.bin: error 1100 (GENERAL): QNN_COMMON_ERROR_GENERAL: graph execution failed"),
    ({"env": {"MA_QNN_STUB_FAULT": "dsp_restart_fatal:llm_split0", "MA_QNN_STUB_MARK": "/nonexistent/dir/mark"}},
     "error 1011 (SYSTEM_COMMUNICATION_FATAL): the DSP subsystem restarted and did not recover"),
    ({"env": {"ADSP_LIBRARY_PATH": "/a/dsp_libs:/b"}}, "ADSP_LIBRARY_PATH=/a/dsp_libs:/b: the DSP loader separates directories with ';'"),
    ({"env": {"MOLMOACT_QNN_PERF": "turbo"}}, "MOLMOACT_QNN_PERF=turbo: must be default, high or burst"),
])
def test_faults_are_named(grid, mode, case, needle):
    extra = [mode] if mode != "resident" else []
    rc, out, err = qnn("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--runs", "1", *extra,
                       lib=case.get("lib", STUB), env=case.get("env"))
    assert rc != 0 and needle in err, (rc, err)
    assert "Traceback" not in err and "AddressSanitizer" not in err and "LeakSanitizer" not in err, err


@pytest.mark.parametrize("extra,needle", [
    (["--extra-input", "llm_split0"], "the graph has 4 inputs, the session 3"),
    (["--wrong-dim", "action_context"], "does not fit graph tensor"),
])
def test_io_mismatch_refused_listing_both_sides(grid, tmp_path, extra, needle):
    d = variant_ctx(grid, tmp_path, *extra)
    rc, out, err = qnn("run", "--model", d, "--inputs", grid["obs"], "--runs", "1", "--inproc")
    assert rc != 0 and needle in err and "ours:" in err and "graph:" in err, err


def test_renamed_tensors_bind_by_order_or_by_the_io_map(grid, tmp_path):
    d = variant_ctx(grid, tmp_path, "--rename")
    ref = str(tmp_path / "ref.npz")
    assert run("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--out", ref, "--runs", "1", "--inproc")[0] == 0
    a = str(tmp_path / "a.npz")
    rc, _, err = qnn("run", "--model", d, "--inputs", grid["obs"], "--out", a, "--runs", "1", "--inproc")
    assert rc == 0, err
    assert np.array_equal(actions(ref), actions(a))
    # an explicit map (action_context's k and v have one shape: order alone could not tell them apart)
    m = {"action_context": {"k": "in_0", "v": "in_1", "ctx_k": "out_0", "ctx_v": "out_1"}}
    mp = str(tmp_path / "map.json")
    with open(mp, "w") as f:
        json.dump(m, f)
    b = str(tmp_path / "b.npz")
    rc, _, err = qnn("run", "--model", d, "--inputs", grid["obs"], "--out", b, "--runs", "1", "--inproc", "--qnn-io-map", mp)
    assert rc == 0, err
    assert np.array_equal(actions(ref), actions(b))
    m["action_context"]["k"] = "no_such_tensor"
    with open(mp, "w") as f:
        json.dump(m, f)
    rc, _, err = qnn("run", "--model", d, "--inputs", grid["obs"], "--runs", "1", "--inproc", "--qnn-io-map", mp)
    assert rc != 0 and "--qnn-io-map names no_such_tensor for k" in err and "graph: in_0" in err, err
    with open(mp, "w") as f:
        f.write('{"action_kontext": {}}')
    rc, _, err = qnn("run", "--model", d, "--inputs", grid["obs"], "--runs", "1", "--inproc", "--qnn-io-map", mp)
    assert rc != 0 and "action_kontext" in err and "is not a session" in err, err


def test_crash_restarts_the_worker_and_the_next_request_is_correct(grid, tmp_path):
    ref = str(tmp_path / "ref.npz")
    assert run("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--out", ref, "--runs", "1", "--inproc")[0] == 0
    out2 = str(tmp_path / "second.npz")
    lines = f"{grid['obs']}\n{grid['obs']}\t{out2}\n".encode()
    env = {"MA_QNN_STUB_FAULT": "crash_once:llm_split0", "MA_QNN_STUB_MARK": str(tmp_path / "crashed")}
    rc, out, err = qnn("run", "--model", grid["ctx"], "--stream", stdin=lines, env=env)
    res = [json.loads(x) for x in out.splitlines()]
    assert len(res) == 2, (out, err)
    assert "llm_split0" in res[0]["error"], res[0]
    assert "actions" in res[1], res[1]
    assert np.array_equal(actions(ref), actions(out2))


def test_hang_fires_the_deadline(grid):
    env = {"MA_QNN_STUB_FAULT": "hang:action_context", "MOLMOACT_WORKER_DEADLINE_MS": "3000"}
    rc, out, err = qnn("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--runs", "1", env=env, timeout=120)
    assert rc != 0 and "action" in err and "3000 ms" in err, err


def test_call_sequence_and_teardown(grid, tmp_path):
    """providers, log, backend, device (soc 77 / arch 73 when asked), binary info, context,
    graph, execute; then contexts, device, backend and log freed, in that order"""
    log = str(tmp_path / "calls")
    rc, _, err = qnn("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--runs", "1", "--inproc",
                     "--qnn-soc", "77", "--qnn-arch", "73", env={"MA_QNN_STUB_LOG": log})
    assert rc == 0, err
    calls = open(log).read().split("\n")[:-1]
    first = [c.split()[0] for c in calls[:4]]
    assert first == ["getProviders", "logCreate", "backendCreate", "deviceCreate"], calls[:6]
    assert calls[3] == "deviceCreate soc=77 arch=73"
    assert sum(c.startswith("contextCreateFromBinary") for c in calls) == 7
    assert sum(c.startswith("contextFree") for c in calls) == 7
    assert sum(c == "systemContextCreate" for c in calls) == sum(c == "systemContextFree" for c in calls) == 7
    assert [c.split()[0] for c in calls[-3:]] == ["deviceFree", "backendFree", "logFree"], calls[-5:]
    last_ctx = max(i for i, c in enumerate(calls) if c.startswith("contextFree"))
    assert last_ctx < len(calls) - 3
    n_exec = sum(c.startswith("graphExecute") for c in calls)
    assert n_exec >= 16 and n_exec % 16 == 0, n_exec  # per request: vision, 4 LLM splits, context, 10 steps


def test_cpu_backend_is_the_default_and_bad_backends_are_refused(grid):
    rc, _, err = run("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--runs", "1", "--backend", "npu")
    assert rc != 0 and "--backend npu: must be cpu or qnn" in err
    rc, _, err = run("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--runs", "1", "--qnn-lib-dir", STUB)
    assert rc != 0 and "need --backend qnn" in err
    rc, _, err = run("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--runs", "1", env={"MOLMOACT_BACKEND": "gpu"})
    assert rc != 0 and "MOLMOACT_BACKEND=gpu" in err


@pytest.mark.parametrize("mode", ["--inproc", "resident"])
@pytest.mark.parametrize("cut", [64, 4096, 0.5])
def test_truncated_library_is_named_not_sigbus(grid, tmp_path, mode, cut):
    """issue 26 E21: a truncated libQnnHtp.so killed the process with SIGBUS inside dlopen"""
    lib = tmp_path / "lib"
    lib.mkdir()
    for name in ("libQnnHtp.so", "libQnnSystem.so"):
        shutil.copy(os.path.join(STUB, name), lib / name)
    data = (lib / "libQnnHtp.so").read_bytes()
    (lib / "libQnnHtp.so").write_bytes(data[:cut] if cut >= 1 else data[:int(len(data) * cut)])
    extra = [mode] if mode != "resident" else []
    rc, out, err = qnn("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--runs", "1", *extra, lib=str(lib))
    assert rc == 1 and f"{lib}/libQnnHtp.so is" in err and ("truncated" in err or "not an ELF" in err), (rc, err)
    assert "signal" not in err, err


# ------------------------------------------------- the real SDKs' layouts (issue 28)

@pytest.fixture(scope="module")
def cpu_ref(grid, tmp_path_factory):
    ref = str(tmp_path_factory.mktemp("ref") / "ref.npz")
    rc, _, err = run("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--out", ref, "--runs", "1", "--inproc")
    assert rc == 0, err
    return ref


# (core API, binary info version): SDK 2.22 (48-byte graph infos, binary info 1), 2.25 (64 bytes,
# binary info 2), 2.43 (88 bytes, binary info 3), and 2.43 answering with an older binary info
SDKS = [("2.15", "1"), ("2.18", "2"), ("2.18", "1"), ("2.32", "3"), ("2.32", "2"), ("2.32", "1")]


@pytest.mark.parametrize("api,binfo", SDKS)
def test_every_binary_info_layout_gives_the_cpu_actions(grid, cpu_ref, tmp_path, api, binfo):
    q = str(tmp_path / "q.npz")
    rc, _, err = qnn("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--out", q, "--runs", "1", "--inproc",
                     env={"MA_QNN_STUB_API": api, "MA_QNN_STUB_BINFO": binfo})
    assert rc == 0, err
    assert np.array_equal(actions(cpu_ref), actions(q))


@pytest.mark.parametrize("api,binfo", SDKS)
def test_multi_graph_binaries_pick_the_graph_by_name(grid, cpu_ref, tmp_path, api, binfo):
    """a second graph first in the file: found by name through the io map's @graph at the
    library's stride, never taken by position"""
    d = variant_ctx(grid, tmp_path, "--decoy-graph", "action_step", "--decoy-graph", "llm_split2")
    env = {"MA_QNN_STUB_API": api, "MA_QNN_STUB_BINFO": binfo}
    rc, _, err = qnn("run", "--model", d, "--inputs", grid["obs"], "--runs", "1", "--inproc", env=env)
    assert rc != 0 and "holds 2 graphs (llm_split2_decoy_graph, llm_split2_graph) and none is named llm_split2" in err and "@graph" in err, err
    mp = str(tmp_path / "map.json")
    with open(mp, "w") as f:
        json.dump({"action_step": {"@graph": "action_step_graph"}, "llm_split2": {"@graph": "llm_split2_graph"}}, f)
    q = str(tmp_path / "q.npz")
    rc, _, err = qnn("run", "--model", d, "--inputs", grid["obs"], "--out", q, "--runs", "1", "--inproc", "--qnn-io-map", mp, env=env)
    assert rc == 0, err
    assert np.array_equal(actions(cpu_ref), actions(q))


def test_multi_graph_with_an_unverified_newer_library(grid, tmp_path):
    """a library newer than the headers read (API 2.40 here): single-graph binaries need no
    stride; a multi-graph one is read only if every entry checks out at the newest known stride"""
    d = variant_ctx(grid, tmp_path, "--decoy-graph", "action_step")
    mp = str(tmp_path / "map.json")
    with open(mp, "w") as f:
        json.dump({"action_step": {"@graph": "action_step_graph"}}, f)
    rc, _, err = qnn("run", "--model", d, "--inputs", grid["obs"], "--runs", "1", "--inproc", "--qnn-io-map", mp,
                     env={"MA_QNN_STUB_API": "2.40"})
    assert rc == 0, err


def test_inspect_lists_the_graphs_of_a_binary(grid, tmp_path):
    d = variant_ctx(grid, tmp_path, "--combine", "both=action_context,action_step")
    rc, out, err = run("inspect", os.path.join(d, "ctx", "both.bin"), "--qnn-lib-dir", STUB)
    assert rc == 0, err
    first = out.splitlines()[0]
    assert "both.bin: 2 graphs: action_context_graph, action_step_graph (binary info v3" in first, first
    assert "input  x float32 [10, 32]" in out and "output velocity float32 [10, 32]" in out, out
    rc, out, err = run("inspect", os.path.join(d, "ctx", "vision_socid77_archv73.bin"), "--qnn-lib-dir", STUB,
                       env={"MA_QNN_STUB_API": "2.15", "MA_QNN_STUB_BINFO": "1"})
    assert rc == 0 and ": 1 graph: vision_graph (binary info v1" in out.splitlines()[0], (out, err)


def test_verbose_open_names_the_graphs(grid):
    rc, out, err = qnn("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--runs", "1", "--inproc", "-v")
    assert rc == 0, err
    assert "qnn: ctx/vision_socid77_archv73.bin: 1 graph: vision_graph (binary info v3" in err, err
    assert err.count(": 1 graph: ") == 7, err


@pytest.mark.parametrize("encoding", ["axis_scale_offset", "bw_axis_scale_offset", "block", "vector"])
def test_other_encodings_are_refused_by_name(grid, tmp_path, encoding):
    d = variant_ctx(grid, tmp_path, "--io", "ufixed16", "--encoding", f"{encoding}:llm_split1")
    rc, _, err = qnn("run", "--model", d, "--inputs", grid["obs"], "--runs", "1", "--inproc")
    assert rc != 0 and "ctx/llm_split1_socid77_archv73.bin: tensor" in err and f"the {encoding} encoding" in err, err


def test_bw_scale_offset_is_applied(grid, cpu_ref, tmp_path):
    d = variant_ctx(grid, tmp_path, "--io", "ufixed16", "--encoding", "bw_scale_offset")
    q = str(tmp_path / "q.npz")
    rc, _, err = qnn("run", "--model", d, "--inputs", grid["obs"], "--out", q, "--runs", "1", "--inproc")
    assert rc == 0, err
    assert cosine(actions(cpu_ref), actions(q)) >= 0.9999


@pytest.mark.parametrize("mode", ["--inproc", "resident"])
def test_dsp_restart_recreates_the_context_and_retries(grid, cpu_ref, tmp_path, mode):
    log = str(tmp_path / "calls")
    q = str(tmp_path / "q.npz")
    env = {"MA_QNN_STUB_FAULT": "dsp_restart:llm_split1", "MA_QNN_STUB_MARK": str(tmp_path / "restarted"), "MA_QNN_STUB_LOG": log}
    extra = [mode] if mode != "resident" else []
    rc, out, err = qnn("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--out", q, "--runs", "2", "--qnn-perf", "high", *extra, env=env)
    assert rc == 0, err
    assert "ctx/llm_split1_socid77_archv73.bin (llm_split1): the DSP subsystem restarted (error 1007)" in err, err
    assert np.array_equal(actions(cpu_ref), actions(q))
    calls = open(log).read().splitlines()
    assert sum(c == "graphExecute llm_split1: subsystem restart" for c in calls) == 1, [c for c in calls if "restart" in c]
    # the lost context freed and created again from its file, then the request retried
    i = calls.index("graphExecute llm_split1: subsystem restart")
    after = [c.split()[0] for c in calls[i + 1:i + 8]]
    assert "contextFree" in after and "contextCreateFromBinary" in after, calls[i:i + 8]
    # the power vote renewed after the restart: created twice in the worker that restarted
    assert sum(c.startswith("createPowerConfigId") for c in calls) >= 2, [c for c in calls if "Power" in c]


@pytest.mark.parametrize("perf,want", [("burst", ["dcvs=0 power_mode=0x10", "sleep_latency=40", "bus=0xa0/0xa0/0xa0", "core=0xa0/0xa0/0xa0",
                                                  "rpc_control_latency=100", "rpc_polling_time=9999"]),
                                       ("high", ["dcvs=0 power_mode=0x10", "sleep_latency=100", "bus=0x80/0x80/0x80", "core=0x80/0x80/0x80"])])
def test_perf_vote(grid, tmp_path, perf, want):
    log = str(tmp_path / "calls")
    rc, _, err = qnn("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--runs", "1", "--inproc", "--qnn-perf", perf,
                     env={"MA_QNN_STUB_LOG": log})
    assert rc == 0, err
    calls = open(log).read().splitlines()
    votes = [c for c in calls if "Power" in c or "setPowerConfig" in c or "dcvs" in c.lower() or "rpc" in c.lower()]
    text = "\n".join(votes)
    for w in want:
        assert w in text, (w, votes)
    names = [c.split()[0] for c in calls]
    assert names.index("createPowerConfigId") > names.index("deviceCreate")
    assert names.index("destroyPowerConfigId") < names.index("deviceFree"), names[-8:]
    assert "refused" not in text, votes
    if perf == "high":
        assert "rpc_polling_time" not in text
    rc, _, err = qnn("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--runs", "1", "--inproc", env={"MA_QNN_STUB_LOG": log + "2"})
    assert rc == 0 and "PowerConfig" not in open(log + "2").read()  # default: no vote


@pytest.mark.parametrize("mode", ["--inproc", "resident"])
def test_zero_copy_gives_the_same_actions(grid, cpu_ref, tmp_path, mode):
    log = str(tmp_path / "calls")
    q = str(tmp_path / "q.npz")
    extra = [mode] if mode != "resident" else []
    rc, _, err = qnn("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--out", q, "--runs", "2", "--qnn-zero-copy", *extra,
                     env={"MA_QNN_STUB_LOG": log})
    assert rc == 0, err
    assert np.array_equal(actions(cpu_ref), actions(q))
    calls = [c.split()[0] for c in open(log).read().splitlines()]
    n_reg, n_dereg = calls.count("memRegister"), calls.count("memDeRegister")
    assert n_reg == 36, n_reg  # every tensor of the seven sessions once: 2 + 4 x 6 + 4 + 6
    assert n_reg == n_dereg, (n_reg, n_dereg)
    # every registration released before its context is freed, the last one before the device
    assert max(i for i, c in enumerate(calls) if c == "memDeRegister") < max(i for i, c in enumerate(calls) if c == "contextFree")


def test_zero_copy_without_libcdsprpc_is_named(grid, tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    for name in ("libQnnHtp.so", "libQnnSystem.so"):
        shutil.copy(os.path.join(STUB, name), lib / name)
    rc, _, err = qnn("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--runs", "1", "--inproc", "--qnn-zero-copy", lib=str(lib))
    assert rc != 0 and "--qnn-zero-copy needs libcdsprpc.so" in err, err


def test_workers_get_the_library_directory_on_their_loader_path(grid):
    """libQnnHtp.so opens its HTP stub by bare name: the workers must start with --qnn-lib-dir on
    LD_LIBRARY_PATH (the loader reads it only at a process's start)"""
    e = {k: v for k, v in os.environ.items() if not k.startswith(("MA_QNN_STUB", "MOLMOACT"))}
    e["MOLMOACT2_PROMPT_SEQ"] = str(SEQ)
    e.pop("LD_LIBRARY_PATH", None)
    p = subprocess.Popen([BIN, "run", "--backend", "qnn", "--qnn-lib-dir", os.path.abspath(STUB), "--model", grid["ctx"], "--stream"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e)
    try:
        import time
        seen, deadline = {}, time.time() + 60
        while time.time() < deadline and len(seen) < 6:
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    if open(f"/proc/{pid}/stat").read().split(") ")[1].split()[1] != str(p.pid):
                        continue
                    env = dict(x.split("=", 1) for x in open(f"/proc/{pid}/environ", "rb").read().decode().split("\0") if "=" in x)
                    seen[pid] = env.get("LD_LIBRARY_PATH", "")
                except (FileNotFoundError, ProcessLookupError, IndexError):
                    pass
            time.sleep(0.2)
        assert len(seen) == 6 and all(v.split(":")[0] == os.path.abspath(STUB) for v in seen.values()), seen
    finally:
        p.stdin.close()
        p.wait(timeout=60)


# ------------------------------------------------- issue 36: the review against the SDKs and their consumers

def stream(grid, tmp_path, extra, env):
    """two requests on one process set (--stream): the second after whatever the first left"""
    out2 = str(tmp_path / "second.npz")
    lines = f"{grid['obs']}\n{grid['obs']}\t{out2}\n".encode()
    rc, out, err = qnn("run", "--model", grid["ctx"], "--stream", *extra, stdin=lines, env=env)
    res = [json.loads(x) for x in out.splitlines()]
    assert len(res) == 2, (out, err)
    return res, out2, err


def test_vote_follows_the_first_context(grid, tmp_path):
    """F1: the power vote is cast once a context is loaded (onnxruntime votes at the first run,
    after loading its contexts), not between deviceCreate and the first context"""
    log = str(tmp_path / "calls")
    rc, _, err = qnn("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--runs", "1", "--inproc", "--qnn-perf", "burst",
                     env={"MA_QNN_STUB_LOG": log})
    assert rc == 0, err
    names = [c.split()[0] for c in open(log).read().splitlines()]
    first_ctx = names.index("contextCreateFromBinary")
    assert names.index("createPowerConfigId") > names.index("graphRetrieve") > first_ctx, names[:20]
    assert names.count("createPowerConfigId") == 1, names.count("createPowerConfigId")


@pytest.mark.parametrize("mode", ["--inproc", "resident"])
@pytest.mark.parametrize("kind,needle", [("vote_fail", "setPowerConfig on"), ("vote_id_fail", "createPowerConfigId on")])
def test_a_failed_vote_is_a_warning(grid, cpu_ref, tmp_path, mode, kind, needle):
    """F1: a vote that fails leaves the graphs at the default clocks; the run goes on, and an id
    that was made is still destroyed"""
    log = str(tmp_path / "calls")
    q = str(tmp_path / "q.npz")
    extra = [mode] if mode != "resident" else []
    rc, _, err = qnn("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--out", q, "--runs", "1", "--qnn-perf", "high", *extra,
                     env={"MA_QNN_STUB_FAULT": kind, "MA_QNN_STUB_LOG": log})
    assert rc == 0, err
    assert "warning: --qnn-perf high: the power vote at start failed" in err and needle in err, err
    assert np.array_equal(actions(cpu_ref), actions(q))
    calls = open(log).read().splitlines()
    made = sum(c.startswith("createPowerConfigId") and "refused" not in c for c in calls)
    gone = sum(c.startswith("destroyPowerConfigId") and "refused" not in c for c in calls)
    assert made == gone, [c for c in calls if "Power" in c]


@pytest.mark.parametrize("mode", ["--inproc", "resident"])
def test_dsp_restart_renews_the_vote_without_leaking_its_id(grid, cpu_ref, tmp_path, mode):
    """F4: the vote after a restart destroys the previous power config id before making one"""
    log = str(tmp_path / "calls")
    q = str(tmp_path / "q.npz")
    env = {"MA_QNN_STUB_FAULT": "dsp_restart:llm_split1", "MA_QNN_STUB_MARK": str(tmp_path / "restarted"), "MA_QNN_STUB_LOG": log}
    extra = [mode] if mode != "resident" else []
    rc, _, err = qnn("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--out", q, "--runs", "2", "--qnn-perf", "burst", *extra, env=env)
    assert rc == 0, err
    assert np.array_equal(actions(cpu_ref), actions(q))
    calls = open(log).read().splitlines()
    votes = [c for c in calls if "PowerConfigId" in c]
    made = [c for c in votes if c.startswith("createPowerConfigId") and "refused" not in c]
    gone = [c for c in votes if c.startswith("destroyPowerConfigId") and "refused" not in c]
    assert len(made) == len(gone) and len(made) >= 2, votes
    i = calls.index("graphExecute llm_split1: subsystem restart")
    after = [c.split()[0] for c in calls[i:]]
    # after the restart: the context again, then the old id destroyed, then a new one
    assert after.index("contextCreateFromBinary") < after.index("destroyPowerConfigId") < after.index("createPowerConfigId"), after[:12]
    assert "restart 1 seen by this process" in err, err  # the count of restarts is kept, and said


@pytest.mark.parametrize("htp", ["5.43", "5.48", "5.50"])
def test_device_config_in_the_library_s_layout(grid, cpu_ref, tmp_path, htp):
    """F2: from HTP API 5.48 the device config's union holds a pointer: soc and arch at byte 8"""
    log = str(tmp_path / "calls")
    q = str(tmp_path / "q.npz")
    env = {"MA_QNN_STUB_HTP_API": htp, "MA_QNN_STUB_LOG": log}
    rc, _, err = qnn("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--out", q, "--runs", "1", "--inproc",
                     "--qnn-soc", "77", "--qnn-arch", "73", env=env)
    assert rc == 0, err
    assert "deviceCreate soc=77 arch=73" in open(log).read().splitlines(), [c for c in open(log) if "device" in c]
    assert np.array_equal(actions(cpu_ref), actions(q))
    # no device config unless asked for
    rc, _, err = qnn("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--runs", "1", "--inproc", env={**env, "MA_QNN_STUB_LOG": log + "2"})
    assert rc == 0 and "deviceCreate" in open(log + "2").read().splitlines(), err


def test_help_says_no_device_config_by_default():
    rc, out, _ = run("help", "run", "all")  # the qnn options: --help-all
    assert rc == 0 and "default 77" not in out and "default 73" not in out and "none unless given" in out, out


def adsp_seen(log):
    return [c.split("adsp=", 1)[1].split(" dsp=")[0] for c in open(log).read().splitlines() if c.startswith("backendCreate")]


def test_workers_default_adsp_library_path(grid, tmp_path):
    """F3: a resident worker starts with ADSP_LIBRARY_PATH = --qnn-lib-dir when neither it nor
    DSP_LIBRARY_PATH is set; a value given stands; DSP_LIBRARY_PATH is warned about"""
    log = str(tmp_path / "calls")
    none = {"ADSP_LIBRARY_PATH": None, "DSP_LIBRARY_PATH": None}
    rc, _, err = qnn("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--runs", "1", env={**none, "MA_QNN_STUB_LOG": log})
    assert rc == 0, err
    seen = adsp_seen(log)
    assert len(seen) == 6 and set(seen) == {os.path.realpath(STUB)}, seen
    rc, _, err = qnn("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--runs", "1",
                     env={**none, "ADSP_LIBRARY_PATH": "/opt/dsp;/usr/lib/rfsa/adsp", "MA_QNN_STUB_LOG": log + "2"})
    assert rc == 0, err
    assert set(adsp_seen(log + "2")) == {"/opt/dsp;/usr/lib/rfsa/adsp"}, adsp_seen(log + "2")
    rc, _, err = qnn("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--runs", "1",
                     env={**none, "DSP_LIBRARY_PATH": "/opt/dsp", "MA_QNN_STUB_LOG": log + "3"})
    assert rc == 0, err
    assert "warning: DSP_LIBRARY_PATH=/opt/dsp is set: FastRPC looks for the HTP skel there and ignores ADSP_LIBRARY_PATH" in err, err
    assert set(adsp_seen(log + "3")) == {"(unset)"}, adsp_seen(log + "3")
    # in-process the library sets nothing: a note says what to do
    rc, _, err = qnn("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--runs", "1", "--inproc", env={**none, "MA_QNN_STUB_LOG": log + "4"})
    assert rc == 0 and "ADSP_LIBRARY_PATH is not set" in err, err
    assert set(adsp_seen(log + "4")) == {"(unset)"}


@pytest.mark.parametrize("mode", ["--inproc", "resident"])
def test_failed_retrieve_in_recovery_is_not_kept(grid, cpu_ref, tmp_path, mode):
    """F4: a graphRetrieve that fails while recovering from a DSP restart leaves no context with
    a bad graph handle: the next request creates it again and runs"""
    env = {"MA_QNN_STUB_FAULT": "dsp_restart_retrieve:llm_split1", "MA_QNN_STUB_MARK": str(tmp_path / "restarted")}
    res, out2, err = stream(grid, tmp_path, [mode] if mode != "resident" else [], env)
    assert "QnnGraph_retrieve" in res[0]["error"] and "6002" in res[0]["error"], res[0]
    assert "actions" in res[1], (res[1], err)
    assert np.array_equal(actions(cpu_ref), actions(out2))


def test_metadata_failure_falls_back_to_binary_info_on_the_mapped_file(grid, cpu_ref, tmp_path):
    """F5: getMetadata failing is retried with getBinaryInfo, given the file's own (private,
    writable) mapping rather than a copy; its writes reach neither the file nor the context"""
    log = str(tmp_path / "calls")
    q = str(tmp_path / "q.npz")
    before = {f: open(os.path.join(grid["ctx"], "ctx", f), "rb").read() for f in os.listdir(os.path.join(grid["ctx"], "ctx"))}
    rc, _, err = qnn("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--out", q, "--runs", "1", "--inproc",
                     env={"MA_QNN_STUB_FAULT": "metadata_fail", "MA_QNN_STUB_LOG": log})
    assert rc == 0, err
    assert np.array_equal(actions(cpu_ref), actions(q))
    bufs = [c.split("buffer=", 1)[1] for c in open(log).read().splitlines() if c.startswith("systemContextGetBinaryInfo")]
    want = sorted(os.path.realpath(os.path.join(grid["ctx"], "ctx", f)) for f in before)
    assert sorted(bufs) == want, bufs
    assert all(open(os.path.join(grid["ctx"], "ctx", f), "rb").read() == b for f, b in before.items())
    rc, out, err = run("inspect", os.path.join(grid["ctx"], "ctx", "vision_socid77_archv73.bin"), "--qnn-lib-dir", STUB,
                       env={"MA_QNN_STUB_FAULT": "metadata_fail"})
    assert rc == 0 and "read with getBinaryInfo (getMetadata failed)" in out, (out, err)


def test_graph_names_up_to_255_bytes(grid, cpu_ref, tmp_path):
    """F5: a 200-byte graph name reaches graphRetrieve whole"""
    name = "llm_split2_" + "x" * 189
    d = variant_ctx(grid, tmp_path, "--graph-name", f"llm_split2={name}")
    log = str(tmp_path / "calls")
    q = str(tmp_path / "q.npz")
    rc, _, err = qnn("run", "--model", d, "--inputs", grid["obs"], "--out", q, "--runs", "1", "--inproc", env={"MA_QNN_STUB_LOG": log})
    assert rc == 0, err
    assert f"graphRetrieve {name}" in open(log).read().splitlines()
    assert np.array_equal(actions(cpu_ref), actions(q))


def test_fatal_dsp_restart_restarts_the_worker(grid, cpu_ref, tmp_path):
    """F5: after 1011 (the restart did not recover) the worker answers, then exits; the supervisor
    starts a fresh one and the next request is served"""
    env = {"MA_QNN_STUB_FAULT": "dsp_restart_fatal:llm_split0", "MA_QNN_STUB_MARK": str(tmp_path / "fatal")}
    res, out2, err = stream(grid, tmp_path, [], env)
    assert "error 1011 (SYSTEM_COMMUNICATION_FATAL)" in res[0]["error"], res[0]
    assert "actions" in res[1], (res[1], err)
    assert np.array_equal(actions(cpu_ref), actions(out2))
    assert "exiting to be started afresh" in err and "llm_split0" in err, err
    # in-process nothing can be restarted: the next request is refused at once, naming it
    res, _, err = stream(grid, tmp_path, ["--inproc"], {**env, "MA_QNN_STUB_MARK": str(tmp_path / "fatal2")})
    assert "error 1011" in res[0]["error"] and "earlier in this process" in res[1].get("error", ""), res


def test_a_fifo_as_the_qnn_library_is_refused_not_waited_on(grid, tmp_path):
    """a FIFO where libQnnHtp.so should be: refused as not a regular file (before: open() waited
    for a writer forever)"""
    lib = tmp_path / "lib"
    lib.mkdir()
    for f in os.listdir(STUB):
        if f != "libQnnHtp.so":
            os.symlink(os.path.join(os.path.abspath(STUB), f), lib / f)
    os.mkfifo(lib / "libQnnHtp.so")
    rc, _, err = qnn("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--runs", "1", "--inproc", lib=str(lib), timeout=60)
    assert rc != 0 and "not a regular file" in err, err


@pytest.mark.parametrize("value", [" 77", "+77", "0x4d", "77 "])
def test_qnn_soc_from_the_environment_is_plain_decimal(grid, value):
    rc, _, err = qnn("run", "--model", grid["ctx"], "--inputs", grid["obs"], "--runs", "1", "--inproc", env={"MOLMOACT_QNN_SOC": value})
    assert rc != 0 and "MOLMOACT_QNN_SOC" in err, err
