# SPDX-License-Identifier: Apache-2.0
"""The command line as a user meets it (issue 30): help for every command, --version, typos,
--opt=value, the README's command list and environment table generated from the same table as
the parser, the --suffix recipe of the README run as written, the prompt length recorded by
compile and used without an environment variable, progress lines, and the workers' names; a
switch set to 0 is off (issue 36), and the program holds no path of its source tree.

    MOLMOACT=build/molmoact MOLMOACT_SRC=. /usr/bin/python3 -m pytest -q tests/runtime/test_cli.py
"""
import json
import os
import platform
import shutil
import struct
import re
import subprocess
import time

import numpy as np
import pytest

BIN = os.path.abspath(os.environ.get("MOLMOACT", "build/molmoact"))
SRC = os.path.abspath(os.environ.get("MOLMOACT_SRC", "."))
MODEL = os.path.join(SRC, "assets/tiny-grid/model")
GOLDEN = os.path.join(SRC, "assets/tiny-grid/golden")
GOLDENS = os.environ.get("MOLMOACT_TEST_GOLDENS")  # scripts/make_test_goldens.sh's, where the run made them
COMMANDS = ["run", "bench", "parity", "compile", "inspect", "tokenize", "prompt", "preprocess", "serve", "help", "version"]


def run(*args, env=None, cwd=None, timeout=300, stdin=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("MOLMOACT_", "VISION_CTX", "LLM_CTX", "ACTION_CTX")) and k != "MOLMOACT2_PROMPT_SEQ"}
    e.update(env or {})
    p = subprocess.run([BIN, *args], capture_output=True, timeout=timeout, env=e, cwd=cwd, input=stdin)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def test_version():
    rc, out, err = run("--version")
    assert rc == 0 and re.match(r"molmoact \d+\.\d+\.\d+ ", out), (out, err)
    rc2, out2, _ = run("version")
    assert rc2 == 0 and out2 == out


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_command_has_help(cmd):
    rc, out, err = run(cmd, "--help")
    assert rc == 0 and err == "", err
    assert out.startswith(f"usage: molmoact {cmd}"), out[:200]
    rc2, out2, _ = run("help", cmd)
    assert rc2 == 0 and out2 == out  # `molmoact help CMD` is `molmoact CMD --help`
    rc3, out3, _ = run(cmd, "-h")
    assert rc3 == 0 and out3 == out


@pytest.mark.parametrize("cmd,options,env", [
    ("run", ["--model", "--inputs", "--image0", "--state", "--runs", "--golden", "--backend", "--qnn-perf", "--preload", "--threads"],
     ["MOLMOACT_THREADS", "MOLMOACT_PROMPT_SEQ", "MOLMOACT2_PROMPT_SEQ", "MOLMOACT_LLM_CTX_SUFFIX", "LLM_CTX_SUFFIX"]),
    ("compile", ["--out", "-o", "--vision", "--llm", "--action", "--suffix", "--prompt-seq", "--keep", "--quiet"], ["MOLMOACT_THREADS"]),
    ("serve", ["--host", "--port", "--api-key-file", "--max-message-mb", "--idle-timeout-s", "--seed"], ["MOLMOACT_BACKEND"]),
    ("inspect", ["--qnn-lib-dir"], []),
])
def test_help_lists_options_and_environment(cmd, options, env):
    rc, out, _ = run(cmd, "--help-all")
    for o in options:
        assert re.search(rf"(^|[ ,]){re.escape(o)}\b", out, re.M), (o, out)
    for v in env:
        assert v in out, (v, out)
    if env:
        assert "\nenvironment:\n" in out
    assert run("help", cmd, "all")[1] == out
    # the short help: the qnn backend's options left to --help-all, the variables named
    rc, short, _ = run(cmd, "--help")
    assert rc == 0 and "--qnn-" not in short and len(short.splitlines()) < len(out.splitlines()), short
    for o in options:
        assert o.startswith("--qnn-") or re.search(rf"(^|[ ,]){re.escape(o)}\b", short, re.M), (o, short)
    for v in env:
        assert v in short, (v, short)
    assert "  --help-all " in short
    rc, _, err = run("help", cmd, "everything")
    assert rc == 1 and "the second word may only be all" in err, err


def test_help_overview_and_env():
    rc, out, _ = run("help")
    assert rc == 0 and all(f"  {c}" in out for c in COMMANDS)
    rc, out, _ = run("--help")
    assert rc == 0 and "commands:" in out
    rc, out, _ = run("help", "env")
    assert rc == 0 and "MOLMOACT_PROMPT_SEQ" in out and "ADSP_LIBRARY_PATH" in out


def test_inspect_help_does_not_open_a_file(tmp_path):
    rc, out, err = run("inspect", "--help", cwd=tmp_path)
    assert rc == 0 and "usage: molmoact inspect" in out and "cannot open" not in err


@pytest.mark.parametrize("typo,near", [("rnu", "run"), ("compil", "compile"), ("sevre", "serve"), ("inspcet", "inspect")])
def test_typo_gets_the_nearest_command_in_one_line(typo, near):
    rc, out, err = run(typo)
    assert rc == 1 and out == ""
    assert err.count("\n") == 1 and f"did you mean {near}?" in err, err


def test_unknown_word_without_a_near_command():
    rc, out, err = run("frobnicate")
    assert rc == 1 and err.count("\n") == 1 and "did you mean" not in err and "molmoact help" in err


def test_unknown_option_gets_the_nearest_option():
    rc, out, err = run("run", "--modle", MODEL)
    assert rc == 1 and "unknown option --modle" in err and "did you mean --model?" in err
    rc, out, err = run("compile", MODEL, "--sufix=x")
    assert rc == 1 and "did you mean --suffix?" in err


def test_opt_equals_value_is_opt_value(tmp_path):
    a, b = str(tmp_path / "a.npz"), str(tmp_path / "b.npz")
    rc, out1, err = run("run", "--model", MODEL, "--golden", GOLDEN, "--out", a, "--json")
    assert rc == 0, err
    rc, out2, err = run("run", f"--model={MODEL}", f"--golden={GOLDEN}", f"--out={b}", "--json", "--runs=1")
    assert rc == 0, err
    assert json.loads(out1)["actions"] == json.loads(out2)["actions"]
    assert np.array_equal(np.load(a)["actions"], np.load(b)["actions"])
    rc, _, err = run("run", "--json=yes")
    assert rc == 1 and "--json takes no value" in err
    rc, _, err = run("run", "--runs=")
    assert rc == 1 and "--runs" in err


def test_state_takes_spaces_after_commas():
    img = os.path.join(SRC, "fuzz/corpus/image/rgb.png")
    args = ["run", "--model", MODEL, "--image0", img, "--image1", img, "--task", "pick", "--json"]
    rc, a, err = run(*args, "--state", "0.1,0.2,0,0,0,0,0,1")
    assert rc == 0, err
    rc, b, err = run(*args, "--state", "0.1, 0.2, 0, 0, 0, 0, 0, 1")
    assert rc == 0, err
    assert json.loads(a)["actions"] == json.loads(b)["actions"]


def test_errors_use_the_cli_words(tmp_path):
    rc, _, err = run("run", "--model", str(tmp_path / "nope"))
    assert rc == 1 and "--model" in err and "is not a directory" in err and "options.model_dir" not in err
    rc, _, err = run("run", "--norm-tag", "bogus")
    assert rc == 1 and "--norm-tag bogus" in err and "libero" in err  # the valid tags listed
    readme = os.path.join(SRC, "README.md")
    rc, _, err = run("inspect", readme)
    assert rc == 1 and "is not a file inspect reads" in err


def test_run_prints_the_plan_and_one_run_by_default():
    rc, out, err = run("run")
    assert rc == 0, err
    assert "latency over 1 run" in out
    m = re.search(r"backend cpu, kernels (\S+), (\d+) threads per process, precision: vision \S+, llm \S+, action \S+", out)
    assert m, out
    rc, out, err = run("run", "--runs", "3", "--json")
    j = json.loads(out)
    assert j["latency"]["runs"] == 2  # the warm runs 2..3
    assert {"kernels", "threads", "precision", "backend", "first_request_ms", "warm_total_ms"} <= set(j), sorted(j)


def _block(text, name):
    m = re.search(rf"<!-- {name}: generated.*?<!-- end of {name} -->", text, re.S)
    assert m, f"README has no generated {name} block"
    return m.group(0)


def test_readme_blocks_are_generated_from_the_table():
    rc, md, _ = run("help", "--markdown")
    assert rc == 0
    for name, doc in (("commands", "README.md"), ("environment", "docs/ENVIRONMENT.md")):
        text = open(os.path.join(SRC, doc), encoding="utf-8").read()
        assert _block(text, name) == _block(md, name), f"{doc}'s {name} block is stale: molmoact help --markdown"


def _recipe(name):
    readme = open(os.path.join(SRC, "README.md"), encoding="utf-8").read()
    m = re.search(rf"<!-- recipe: {name} -->\s*```sh\n(.*?)```", readme, re.S)
    assert m, f"README has no recipe {name}"
    return m.group(1)


def test_readme_frames_recipe_runs_as_written(tmp_path):
    """the README's sample-frames command, pasted into a shell at the repository's root"""
    script = _recipe("frames").replace("build/molmoact", BIN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOLMOACT")}
    p = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=SRC, capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0 and "action chunk [10, 7]" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]


def test_readme_stays_a_manual():
    """the README is the user's manual: at most about 250 lines; the rest lives in docs/"""
    lines = open(os.path.join(SRC, "README.md"), encoding="utf-8").read().splitlines()
    assert len(lines) <= 260, len(lines)


def test_readme_suffix_recipe_runs_as_written(tmp_path):
    """the README's --suffix recipe, pasted into a shell in a fresh directory"""
    script = _recipe("suffix").replace("build/molmoact", BIN)
    work = tmp_path / "work"
    work.mkdir()
    os.symlink(os.path.join(SRC, "assets"), work / "assets")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOLMOACT")}
    p = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=work, capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "llm q4_0" in p.stdout and "PASS" in p.stdout, p.stdout[-1500:]


def test_compile_suffix_names_only_the_given_components(tmp_path):
    d = str(tmp_path / "ctx")
    rc, out, err = run("compile", MODEL, "-o", d, "--action", "q8_0", "--suffix", "_q8", "--quiet")
    assert rc == 0, err
    files = sorted(os.listdir(d))
    assert "action_step_q8.gguf" in files and "action_context.gguf" in files and "vision.gguf" in files, files
    assert not any(f.startswith(("vision_", "llm_split0_", "action_context_")) for f in files), files
    rc, out, err = run("run", "--model", d, "--golden", GOLDEN, env={"ACTION_CTX_SUFFIX": "_q8"})
    assert rc == 0 and "action q8_0" in out, out + err
    # adding a variant keeps the files already there (same checkpoint)
    before = os.stat(os.path.join(d, "vision.gguf")).st_mtime_ns
    rc, out, err = run("compile", MODEL, "-o", d, "--llm", "q4_0", "--suffix", "_w4a16", "--quiet")
    assert rc == 0, err
    assert os.stat(os.path.join(d, "vision.gguf")).st_mtime_ns == before
    rc, out, err = run("run", "--model", d, "--golden", GOLDEN, env={"MOLMOACT_LLM_CTX_SUFFIX": "_w4a16", "ACTION_CTX_SUFFIX": "_q8"})
    assert rc == 0 and "llm q4_0, action q8_0" in out, out + err
    rc, _, err = run("compile", MODEL, "-o", d, "--suffix", "_x")
    assert rc == 1 and "--suffix _x names the files of the components given" in err
    rc, _, err = run("run", "--model", d, "--golden", GOLDEN, env={"MOLMOACT_LLM_CTX_SUFFIX": "_w4a16", "LLM_CTX_SUFFIX": "_other"})
    assert rc == 1 and "contradict" in err and "LLM_CTX_SUFFIX" in err


def test_prompt_length_recorded_and_used_without_environment(tmp_path):
    d = str(tmp_path / "ctx")
    rc, out, err = run("compile", MODEL, "-o", d, "--prompt-seq", "400", "--quiet")
    assert rc == 0 and "prompt length 400" in out, err
    rc, out, err = run("inspect", d)
    assert rc == 0, err
    for name in ("llm_split0.gguf", "llm_split3.gguf", "action_context.gguf", "action_step.gguf"):
        line = next(l for l in out.splitlines() if l.strip().startswith(name))
        assert " 400 " in line, line
    rc, out, err = run("run", "--model", d, "--golden", GOLDEN)  # no MOLMOACT_PROMPT_SEQ
    assert rc == 0 and "PASS" in out, err
    rc, out, err = run("run", "--model", d, "--golden", GOLDEN, env={"MOLMOACT2_PROMPT_SEQ": "400"})
    assert rc == 0, err  # padded to the compiled length: the same actions
    rc, out, err = run("run", "--model", d, "--golden", GOLDEN, env={"MOLMOACT_PROMPT_SEQ": "128"})
    assert rc == 1 and "compiled for prompt length 400" in err and "MOLMOACT_PROMPT_SEQ" in err and "is 128" in err


def test_compile_progress_lines_when_not_a_terminal(tmp_path):
    rc, out, err = run("compile", MODEL, "-o", str(tmp_path / "a"))
    assert rc == 0, err
    lines = [l for l in err.splitlines() if l.startswith("compile: ")]
    assert len(lines) >= 3, err  # the start, some tenths, the end
    assert re.search(r"compile: (\d+)/\1 tensors, [\d.]+ MiB of [\d.]+ MiB \(100%\), .* in all", lines[-1]), lines[-1]
    assert "\r" not in err  # plain lines, no redrawing, on a pipe
    rc, out, err = run("compile", MODEL, "-o", str(tmp_path / "b"), "--quiet")
    assert rc == 0 and "compile:" not in err, err


def test_preload_shows_the_workers_start(tmp_path):
    rc, out, err = run("run", "--preload")
    assert rc == 0, err
    assert re.search(r"open \(--preload\): 6/6 workers ready", err), err
    rc, out, err = run("run", "--preload", "--quiet")
    assert rc == 0 and "workers ready" not in err


def test_preload_zero_is_not_labelled_preload():
    """issue 36 F23: MOLMOACT_PRELOAD=0 (off, as the library reads it) was still labelled (--preload)"""
    rc, out, err = run("run", "--runs", "1", env={"MOLMOACT_PRELOAD": "0"})
    assert rc == 0, err
    assert re.search(r"^open [0-9.]+ ms, first request [0-9.]+ ms$", out, re.M) and "--preload" not in out + err, out + err
    rc, out, err = run("run", "--runs", "1", env={"MOLMOACT_PRELOAD": "1"})
    assert rc == 0 and re.search(r"first request [0-9.]+ ms \(--preload\)", out) and "open (--preload)" in err, out + err


def test_the_program_embeds_no_source_path(tmp_path):
    """issue 36: the binary carried the source tree's path (MA_SOURCE_DIR) as its demo's fallback,
    into every install; the demo is found from the program's own place. (Debug information, which
    names the sources, is left out of the check.)"""
    import shutil
    exe = str(tmp_path / "molmoact")
    if shutil.which("objcopy"):
        subprocess.run(["objcopy", "--strip-debug", BIN, exe], check=True)
    else:
        shutil.copy(BIN, exe)
    data = open(exe, "rb").read()
    # a sanitizer build names its sources in its reports: the check is for release builds
    if b"__ubsan_handle" not in data and b"__asan_init" not in data:
        assert SRC.encode() not in data
    rc, out, err = run("run", "--runs", "1")
    assert rc == 0 and "PASS" in out, out + err


def test_workers_are_named_after_their_session(tmp_path):
    p = subprocess.Popen([BIN, "run", "--model", MODEL, "--stream"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        want = {"molmoact:vision", "molmoact:llm0", "molmoact:llm1", "molmoact:llm2", "molmoact:llm3", "molmoact:action"}
        names, deadline = set(), time.time() + 60
        while time.time() < deadline and names != want:
            names = set()
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    if open(f"/proc/{pid}/stat").read().split(") ")[1].split()[1] != str(p.pid):
                        continue
                    argv0 = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[0].decode()
                    if not argv0:  # a child exiting (a zombie's cmdline reads empty): not a worker
                        continue
                    names.add(open(f"/proc/{pid}/comm").read().strip())
                    assert argv0.startswith("molmoact:"), argv0
                except (FileNotFoundError, ProcessLookupError, IndexError):
                    pass
            time.sleep(0.2)
        assert names == want, names
    finally:
        p.stdin.close()
        p.wait(timeout=60)


def test_compute_plan_compiled_shown_and_run(tmp_path):
    d = str(tmp_path / "ctx")
    rc, out, err = run("compile", MODEL, "-o", d, "--compute", "vision=bf16,action=bf16", "--compute-keep", "*scout*", "--quiet")
    assert rc == 0, err
    rc, out, err = run("inspect", d)
    assert rc == 0, err
    plan = {l.split()[0]: l.split()[3] for l in out.splitlines() if l.strip().endswith("MiB") and ".gguf" in l and "embed" not in l}
    assert plan["vision.gguf"] == "bf16" and plan["action_step.gguf"] == "bf16" and plan["llm_split0.gguf"] == "fp32", out
    rc, out, err = run("run", "--model", d, "--golden", GOLDEN)
    assert rc == 0 and "PASS" in out, err
    assert re.search(r"compute: vision bf16, llm fp32, action bf16 \(bf16 on (amx|avx512_bf16|fp32)", out), out
    rc, out, err = run("run", "--model", d, "--golden", GOLDEN, env={"MOLMOACT_COMPUTE": "fp32"})
    assert rc == 0 and "compute:" not in out, out
    for bad in ("vision=bf17", "optics=bf16", "fp8"):
        rc, _, err = run("compile", MODEL, "-o", str(tmp_path / "bad"), "--compute", bad)
        assert rc == 1 and f"--compute {bad}: must be fp32, bf16, f16, auto, or COMPONENT=PLAN" in err, err
    rc, _, err = run("run", "--model", d, "--golden", GOLDEN, env={"MOLMOACT_COMPUTE": "half"})
    assert rc == 1 and "MOLMOACT_COMPUTE=half" in err, err


def test_compute_auto_follows_the_cpu(tmp_path):
    """--compute auto: bf16 products where this CPU's bf16 unit pays and the weights are not
    int8 (int8 weights keep their kernels unless the unit is AMX); it says which and why, and the
    contexts record what it said"""
    d = str(tmp_path / "ctx")
    rc, out, err = run("compile", MODEL, "-o", d, "--llm", "q8_0", "--compute", "auto", "--quiet")
    assert rc == 0, err
    m = re.search(r"compute auto: vision \(f16 weights\) (\w+), llm \(q8_0 weights\) (\w+), action \(f16 weights\) (\w+) \((.*)\)", err)
    assert m, err
    vision, llm, action, why = m.groups()
    if why.startswith("AMX"):
        want = ("bf16", "bf16", "bf16")
    elif re.match(r"AVX512-BF16, one VDPBF16PS timed at [0-9.]+ FMA$", why):
        want = ("bf16", "fp32", "bf16")
    else:
        assert why.startswith("AVX512-BF16 without the unit") or why.startswith("no bf16 unit"), why
        want = ("fp32", "fp32", "fp32")
    assert (vision, llm, action) == want, err
    rc, out, _ = run("inspect", d)
    plan = {l.split()[0]: l.split()[3] for l in out.splitlines() if l.strip().endswith("MiB") and ".gguf" in l and "embed" not in l}
    assert (plan["vision.gguf"], plan["llm_split0.gguf"], plan["action_step.gguf"]) == want, out
    rc, out, err = run("compile", MODEL, "-o", str(tmp_path / "one"), "--compute", "vision=auto", "--quiet")
    assert rc == 0 and "compute auto: vision (f16 weights)" in err and "llm (" not in err, err
    # a bf16 context run on a kernel set without the unit says why it computes in fp32
    if "bf16" in want and " avx2 " in open("/proc/cpuinfo").read():
        rc, out, err = run("run", "--model", d, "--golden", GOLDEN, env={"MOLMOACT_KERNELS": "avx2"})
        assert "(bf16 on fp32: kernel set avx2 has no bf16 unit, computed in fp32)" in out, out + err


def test_bf16_weights_gated_as_what_they_are(tmp_path):
    """bf16 weights rounded from the f16 demo are lossy: gated end to end at 0.999 (they lose
    vision's last digits, which a 0.9999 row gate failed); from a bf16 checkpoint they are its own
    weights and keep 0.9999 on every row. (The FAIL line's wording: test_parity's test_fail_line.)"""
    d = str(tmp_path / "ctx")
    rc, _, err = run("compile", MODEL, "-o", d, "--vision", "bf16", "--quiet")
    assert rc == 0, err
    rc, out, err = run("parity", "--model", d, "--golden", GOLDEN)
    assert rc == 0 and out.strip().splitlines()[-1].endswith("(gate 0.999, reduced precision: end to end only): PASS"), out + err
    bf16_src = os.path.join(GOLDENS, "tiny-grid-bf16") if GOLDENS else None
    if not bf16_src or not os.path.isdir(bf16_src):
        pytest.skip("the generated goldens (tiny-grid-bf16) are not here")
    d2 = str(tmp_path / "ctx2")
    rc, _, err = run("compile", os.path.join(bf16_src, "model"), "-o", d2, "--vision", "bf16", "--llm", "bf16", "--action", "bf16", "--quiet")
    assert rc == 0, err
    rc, out, err = run("parity", "--model", d2, "--golden", os.path.join(bf16_src, "golden"))
    assert rc == 0 and out.strip().splitlines()[-1].endswith("(gate 0.9999): PASS"), out + err


def test_bench_action_step_on_the_goldens_ten_steps(tmp_path):
    """bench --session action_step takes a golden's action_step_io.npz (x [10, 10, 32], t [10]):
    the first step, said so; an x of another rank is still refused naming its shape"""
    rc, out, err = run("bench", "--model", MODEL, "--session", "action_step", "--inputs", os.path.join(GOLDEN, "action_step_io.npz"),
                       "--runs", "2", "--json")
    assert rc == 0 and "holds 10 steps of action_step: timing the first" in err, err
    assert json.loads(out.strip().splitlines()[-1])["session"] == "action_step", out
    z = dict(np.load(os.path.join(GOLDEN, "action_step_io.npz")))
    z["x"] = z["x"][None]  # [1, 10, 10, 32]
    bad = str(tmp_path / "bad.npz")
    np.savez(bad, **z)
    rc, out, err = run("bench", "--model", MODEL, "--session", "action_step", "--inputs", bad, "--runs", "1")
    assert rc != 0 and "action_step input x: shape [1, 10, 10, 32]" in err, err


def test_suffix_only_directory_names_the_variable(tmp_path):
    """a directory compiled with --suffix for every component, opened without the suffix: the
    error names the file there and the variable that picks it; with it, the run passes"""
    d = str(tmp_path / "ctx")
    rc, _, err = run("compile", MODEL, "-o", d, "--vision", "f16", "--llm", "f16", "--action", "f16", "--suffix", "_s", "--quiet")
    assert rc == 0, err
    rc, out, err = run("run", "--model", d, "--golden", GOLDEN)
    assert rc != 0 and "vision.gguf: not there; the directory holds vision_s.gguf: pick it with MOLMOACT_VISION_CTX_SUFFIX=_s" in err, err
    assert str(tmp_path) in err or "/ctx/" in err, err
    env = {"MOLMOACT_VISION_CTX_SUFFIX": "_s", "MOLMOACT_LLM_CTX_SUFFIX": "_s", "MOLMOACT_ACTION_CTX_SUFFIX": "_s"}
    rc, out, err = run("run", "--model", d, "--golden", GOLDEN, env=env)
    assert rc == 0 and "PASS" in out, out + err
    os.remove(os.path.join(d, "vision_s.gguf"))  # no variant there: the plain error
    rc, out, err = run("run", "--model", d, "--golden", GOLDEN)
    assert rc != 0 and "vision.gguf" in err and "pick it with" not in err, err


def test_run_prints_parity_after_latency_plan_and_memory():
    """the order docs/QNN.md and the README give for run's report (the same on every backend): the
    chunk, the latency table, the plan, the peak memory, the open line, then the parity rows"""
    rc, out, err = run("run", "--model", os.path.join(SRC, "assets/tiny-grid/model"), "--golden", os.path.join(SRC, "assets/tiny-grid/golden"),
                       "--inproc")
    assert rc == 0, err
    marks = ["action chunk [10, 7]", "latency over", "backend cpu", "peak RSS", "first request", "parity against", "end-to-end action cosine"]
    at = [out.find(m) for m in marks]
    assert -1 not in at and at == sorted(at), list(zip(marks, at))


def test_compute_f16_plan(tmp_path):
    """--compute f16 (the NEON FP16 tiles' plan): recorded in the contexts, per component too; on a
    CPU without FP16 arithmetic (every x86) computed in fp32, saying so, at the fp32 gate; a weight
    beyond what its f16 sums hold (|w| > 64) refused by name with the way out, which works"""
    d = str(tmp_path / "ctx")
    rc, out, err = run("compile", MODEL, "-o", d, "--compute", "f16", "--quiet")
    assert rc == 0, err
    rc, out, _ = run("inspect", d)
    plan = {l.split()[0]: l.split()[3] for l in out.splitlines() if l.strip().endswith("MiB") and ".gguf" in l and "embed" not in l}
    assert set(plan.values()) == {"f16"}, out
    rc, out, err = run("run", "--model", d, "--golden", GOLDEN, "--inproc")
    assert rc == 0, out + err
    if platform.machine() == "x86_64":
        assert "(f16 computed in fp32: these kernels have no FP16 arithmetic (aarch64 asimdhp))" in out, out
        assert "end-to-end action cosine 1.000000000 (gate 0.9999): PASS" in out, out
    rc, out, err = run("compile", MODEL, "-o", str(tmp_path / "one"), "--compute", "llm=f16", "--quiet")
    assert rc == 0, err
    rc, out, err = run("compile", MODEL, "-o", str(tmp_path / "bad"), "--compute", "f17")
    assert rc == 1 and "fp32, bf16, f16, auto" in err, err
    rc, out, err = run("compile", MODEL, "-o", str(tmp_path / "bad"), "--llm", "q8_0", "--compute", "f16")
    assert rc == 1 and "llm is stored as q8_0" in err and "--compute vision=f16" in err, err
    # only contexts carry the f16 plan (their weights' range was checked): not the environment
    rc, out, err = run("run", "--model", d, "--golden", GOLDEN, "--inproc", env={"MOLMOACT_COMPUTE": "f16"})
    assert rc == 1 and "MOLMOACT_COMPUTE=f16" in err, err
    # one weight of 100 in a copy of the demo checkpoint
    src = tmp_path / "big"
    shutil.copytree(MODEL, src)
    st = src / "model.safetensors"
    raw = bytearray(st.read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    name = "model.action_expert.action_embed.weight"
    off = 8 + n + head[name]["data_offsets"][0]
    raw[off:off + 2] = np.array([100.0], dtype=np.float16).tobytes()
    st.write_bytes(bytes(raw))
    rc, out, err = run("compile", str(src), "-o", str(tmp_path / "c2"), "--compute", "f16", "--quiet")
    assert rc == 1 and name in err and "|w| = 100" in err and f"--compute-keep '{name}'" in err, err
    assert not (tmp_path / "c2").exists()
    rc, out, err = run("compile", str(src), "-o", str(tmp_path / "c3"), "--compute", "f16", "--compute-keep", name, "--quiet")
    assert rc == 0, err
