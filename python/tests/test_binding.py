# SPDX-License-Identifier: Apache-2.0
"""The Python binding (python/molmoact) against the command line: the same actions bit for bit on
both tiny variants, openpi's and MolmoAct2's keys, clear exceptions on bad input.

    MOLMOACT=build/molmoact MOLMOACT_LIBRARY=build/libmolmoact.so /usr/bin/python3 -m pytest -q python/tests
"""
import json
import os
import re
import shutil
import subprocess
import sys

import re
import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SRC, "python"))
import molmoact  # noqa: E402

BIN = os.environ.get("MOLMOACT", os.path.join(SRC, "build", "molmoact"))
IMG0, IMG1 = os.path.join(SRC, "fuzz/corpus/image/rgb.png"), os.path.join(SRC, "fuzz/corpus/image/rgb.jpg")
TASK = "put the bowl on the plate"
STATE = np.array([0.1, -0.2, 0.9, 3.0, -0.1, 0.05, 0.03, -0.03])
VARIANTS = ["tiny-grid", "tiny-original"]


def model(v):
    return os.path.join(SRC, "assets", v, "model")


def cli(v, noise_path=None, seed=None, image0=IMG0, image1=IMG1):
    args = [BIN, "run", "--model", model(v), "--image0", image0, "--image1", image1, "--task", TASK,
            "--state", ",".join(repr(float(np.float32(x))) for x in STATE), "--runs", "1", "--json"]
    args += ["--noise", noise_path] if noise_path else ["--seed", str(seed or 0)]
    p = subprocess.run(args, capture_output=True, timeout=300)
    assert p.returncode == 0, p.stderr.decode()
    return np.asarray(json.loads(p.stdout)["actions"], np.float32)


@pytest.fixture(scope="module")
def noise(tmp_path_factory):
    nz = np.random.default_rng(5).standard_normal((1, 10, 32)).astype(np.float32)
    path = str(tmp_path_factory.mktemp("noise") / "noise.npy")
    np.save(path, nz)
    return nz, path


def read(path):
    with open(path, "rb") as f:
        return f.read()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("inproc", [False, True])
def test_same_actions_as_the_cli(variant, inproc, noise):
    nz, nz_path = noise
    want = cli(variant, noise_path=nz_path)
    want_seed = cli(variant, seed=3)
    with molmoact.Policy(model(variant), inproc=inproc) as p:
        assert p.info["variant"] == ("grid" if variant == "tiny-grid" else "original")
        # openpi's keys, images as encoded bytes, float64 state as the LIBERO example sends it
        out = p.infer({"observation/image": read(IMG0), "observation/wrist_image": read(IMG1),
                       "observation/state": STATE, "prompt": TASK, "noise": nz})
        assert out["actions"].dtype == np.float32 and out["actions"].shape == (10, 7)
        assert np.array_equal(out["actions"], want)
        assert out["trajectory"].shape == (10, 32)
        assert out["timing"]["infer_ms"] > 0 and out["timing"]["vision_ms"] > 0
        # MolmoAct2's keys and a seed
        out = p.infer({"image": read(IMG0), "wrist_image": read(IMG1), "state": STATE.astype(np.float32),
                       "instruction": TASK, "seed": 3})
        assert np.array_equal(out["actions"], want_seed)


def test_raw_frames_equal_png_files(noise, tmp_path):
    from PIL import Image
    nz, nz_path = noise
    a = np.asarray(Image.open(IMG0).convert("RGB"))
    b = np.ascontiguousarray(np.asarray(Image.open(IMG0).convert("RGB"))[::-1])  # another frame
    pb = str(tmp_path / "b.png")
    Image.fromarray(b).save(pb)
    want = cli("tiny-grid", noise_path=nz_path, image0=IMG0, image1=pb)
    with molmoact.Policy(model("tiny-grid"), inproc=True) as p:
        out = p.infer({"image": a, "wrist_image": b, "state": STATE, "task": TASK, "noise": nz})
        assert np.array_equal(out["actions"], want)
        # a strided view (every other column) and its contiguous copy give the same actions
        wide = np.concatenate([a, a], axis=1)[:, ::2]
        out1 = p.infer({"image": wide, "wrist_image": b, "state": STATE, "task": TASK, "noise": nz})
        out2 = p.infer({"image": np.ascontiguousarray(wide), "wrist_image": b, "state": STATE, "task": TASK, "noise": nz})
        assert np.array_equal(out1["actions"], out2["actions"])


@pytest.mark.parametrize("obs,exc,needle", [
    ({"image": b"x", "wrist_image": b"x", "state": STATE, "prompt": TASK}, molmoact.MolmoActError, "images[0]"),
    ({"image": np.zeros((8, 8, 3), np.complex64), "wrist_image": b"x", "state": STATE, "prompt": TASK}, molmoact.MolmoActError, "complex64"),
    ({"image": np.zeros((8, 8, 5), np.uint8), "wrist_image": b"x", "state": STATE, "prompt": TASK}, molmoact.MolmoActError, "5 channels"),
    ({"image": np.zeros((0, 8, 3), np.uint8), "wrist_image": np.zeros((8, 8, 3), np.uint8), "state": STATE, "prompt": TASK},
     molmoact.MolmoActError, "(0, 8, 3) is empty"),
    ({"image": np.zeros((8, 8, 3), np.uint8), "wrist_image": np.zeros((8, 8, 3), np.uint8),
      "state": np.array([0, 0, np.nan, 0, 0, 0, 0, 0]), "prompt": TASK}, molmoact.MolmoActError, "state[2] is NaN"),
    ({"image": np.zeros((8, 8, 3), np.uint8), "wrist_image": np.zeros((8, 8, 3), np.uint8),
      "state": np.zeros(7), "prompt": TASK}, molmoact.MolmoActError, "state_dim is 7"),
    ({"image": np.zeros((8, 8, 3), np.uint8), "wrist_image": np.zeros((8, 8, 3), np.uint8), "state": STATE},
     ValueError, "missing key: observation/state" if False else "missing key"),
    ({"image": np.zeros((8, 8, 3), np.uint8), "observation/image": np.zeros((8, 8, 3), np.uint8),
      "wrist_image": np.zeros((8, 8, 3), np.uint8), "state": STATE, "prompt": TASK}, molmoact.MolmoActError, "both give the image"),
    ({"image": np.zeros((8, 8, 3), np.uint8), "wrist_image": np.zeros((8, 8, 3), np.uint8), "state": STATE,
      "prompt": TASK, "noise": np.zeros((1, 10, 31), np.float32)}, molmoact.MolmoActError, "noise has 310 values"),
    ({"image": np.zeros((8, 8, 3), np.uint8), "wrist_image": np.zeros((8, 8, 3), np.uint8), "state": STATE,
      "prompt": TASK, "seed": -1}, ValueError, "seed"),
    ({"image": np.zeros((8, 8, 3), np.uint8), "wrist_image": np.zeros((8, 8, 3), np.uint8), "state": STATE,
      "prompt": 5}, ValueError, "prompt: expected a string"),
])
def test_bad_input_raises_clearly(obs, exc, needle):
    with molmoact.Policy(model("tiny-grid"), inproc=True) as p:
        with pytest.raises(exc) as e:
            p.infer(obs)
        assert needle in str(e.value), str(e.value)
        # and the policy still serves
        ok = p.infer({"image": np.zeros((8, 8, 3), np.uint8), "wrist_image": np.zeros((8, 8, 3), np.uint8),
                      "state": STATE, "prompt": TASK})
        assert np.isfinite(ok["actions"]).all()


def test_open_errors_and_close():
    with pytest.raises(molmoact.MolmoActError) as e:
        molmoact.Policy(os.path.join(SRC, "no-such-model"))
    assert "no-such-model" in str(e.value) and e.value.status == "MOLMOACT_ERR_IO"
    with pytest.raises(TypeError) as e:
        molmoact.Policy(model("tiny-grid"), bogus=1)
    assert "bogus" in str(e.value)
    p = molmoact.Policy(model("tiny-grid"))
    p.close()
    p.close()  # twice is fine
    with pytest.raises(molmoact.MolmoActError) as e:
        p.infer({})
    assert "closed" in str(e.value)


@pytest.mark.parametrize("shape", [(1, 320), (32, 10), (1, 32, 10), (320,), (2, 10, 32)])
def test_noise_of_the_right_size_but_wrong_shape_refused(shape):
    """issue 36 (E11): the shape is checked, not only the count, as the server checks it"""
    with molmoact.Policy(model("tiny-grid"), inproc=True) as p:
        obs = {"image": np.zeros((8, 8, 3), np.uint8), "wrist_image": np.zeros((8, 8, 3), np.uint8), "state": STATE,
               "prompt": TASK, "noise": np.zeros(shape, np.float32)}
        with pytest.raises(molmoact.MolmoActError) as e:
            p.infer(obs)
        assert "expected [1, 10, 32] (or [10, 32])" in str(e.value), str(e.value)
        obs["noise"] = np.zeros((10, 32), np.float32)
        assert p.infer(obs)["actions"].shape == (10, 7)


def test_close_while_another_thread_infers():
    """issue 36 (F13): close() waits for a running infer() and later calls raise; before, the
    interpreter died (SIGSEGV / SIGFPE). Run in a child so a crash is a failure, not the end."""
    code = f"""
import sys, threading, time
sys.path.insert(0, {os.path.join(SRC, "python")!r})
import numpy as np, molmoact
p = molmoact.Policy({model("tiny-grid")!r}, inproc=True)
obs = {{"image": np.zeros((8, 8, 3), np.uint8), "wrist_image": np.zeros((8, 8, 3), np.uint8),
        "state": np.zeros(8), "prompt": "put the bowl on the plate"}}
out = {{"ok": 0, "closed": 0, "other": []}}
def loop():
    for _ in range(200):
        try:
            p.infer(obs)
            out["ok"] += 1
        except molmoact.MolmoActError as e:
            if "closed" in str(e):
                out["closed"] += 1
            else:
                out["other"].append(str(e))
ts = [threading.Thread(target=loop) for _ in range(3)]
for t in ts:
    t.start()
time.sleep(0.5)
p.close()
for t in ts:
    t.join()
print(out["ok"] > 0, out["closed"] > 0, out["other"])
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, MOLMOACT_LIBRARY=os.environ.get("MOLMOACT_LIBRARY", "")) if os.environ.get("MOLMOACT_LIBRARY") else None)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.strip() == "True True []", r.stdout


def test_import_without_a_library_says_where_it_looked(tmp_path):
    pkg = tmp_path / "pkg" / "molmoact"
    shutil.copytree(os.path.join(SRC, "python", "molmoact"), pkg)
    env = {k: v for k, v in os.environ.items() if k != "MOLMOACT_LIBRARY"}
    env["LD_LIBRARY_PATH"] = ""
    p = subprocess.run([sys.executable, "-c", "import molmoact"], cwd=str(tmp_path / "pkg"), env=env,
                       capture_output=True, timeout=60)
    err = p.stderr.decode()
    assert p.returncode != 0 and "libmolmoact.so not found" in err, err
    assert "next to the package" in err and "dynamic loader" in err, err


# ---------------------------------------------------------------------------- issue 26: E13, E17

def import_with(env_lib):
    """import molmoact in a fresh interpreter with MOLMOACT_LIBRARY=env_lib: (ok, message)"""
    code = ("import sys; sys.path.insert(0, %r)\ntry:\n import molmoact; print('LOADED', molmoact.library_path)\n"
            "except ImportError as e: print('IMPORTERROR', e)\nexcept Exception as e: print('OTHER', type(e).__name__, e)") % os.path.join(SRC, "python")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, env=dict(os.environ, MOLMOACT_LIBRARY=env_lib))
    return p.stdout.decode().strip()


def test_explicit_library_fails_loudly(tmp_path):
    missing = str(tmp_path / "nope.so")
    out = import_with(missing)
    assert out.startswith("IMPORTERROR") and missing in out, out
    broken = tmp_path / "broken.so"
    broken.write_bytes(b"\x7fELF" + b"\0" * 60)
    out = import_with(str(broken))
    assert out.startswith("IMPORTERROR") and str(broken) in out, out
    import ctypes.util
    foreign = ctypes.util.find_library("z")  # a real library that is not libmolmoact
    out = import_with(foreign)
    assert out.startswith("IMPORTERROR") and "not libmolmoact" in out, out


@pytest.mark.parametrize("opts,needle", [
    ({"threads": 2 ** 40}, "threads"), ({"threads": -1}, "threads"), ({"deadline_ms": 2 ** 32 + 5000}, "deadline_ms"),
    ({"threads": 1.5}, "threads"), ({"inproc": "yes"}, "inproc"), ({"norm_tag": "lib\0ero"}, "NUL"),
    ({"backend": "gpu"}, "backend"),
])
def test_options_checked(opts, needle):
    with pytest.raises(molmoact.MolmoActError) as e:
        molmoact.Policy(model("tiny-grid"), inproc=opts.pop("inproc", True), **opts)
    assert needle in str(e.value), str(e.value)


def test_path_with_nul_refused():
    with pytest.raises(molmoact.MolmoActError, match="NUL"):
        molmoact.Policy(model("tiny-grid") + "\0/elsewhere", inproc=True)


def test_bad_text_is_a_molmoact_error():
    with molmoact.Policy(model("tiny-grid"), inproc=True) as p:
        img = np.zeros((8, 8, 3), np.uint8)
        for task in ("bad \udc80 surrogate", b"\xff\xfe not utf-8"):
            with pytest.raises(molmoact.MolmoActError, match="UTF-8"):
                p.infer({"image": img, "wrist_image": img, "state": STATE, "instruction": task})
    assert issubclass(molmoact.MolmoActError, ValueError)


def test_backend_and_worker_program_messages(tmp_path):
    """issue 26 E16: the API named qnn as unavailable while the CLI ran it; a missing worker
    program was 'failed to start (status 127)'"""
    with pytest.raises(molmoact.MolmoActError) as e:
        molmoact.Policy(model("tiny-grid"), backend="qnn", inproc=True)
    assert "this build has the cpu backend" not in str(e.value) and "qnn" in str(e.value).lower(), str(e.value)
    missing = str(tmp_path / "no-such-molmoact")
    with pytest.raises(molmoact.MolmoActError) as e:
        molmoact.Policy(model("tiny-grid"), worker_exe=missing)
    assert missing in str(e.value) and "No such file" in str(e.value), str(e.value)
    os.environ.pop("MOLMOACT_BACKEND", None)  # the library sets it for its workers


# ---------------------------------------------------------------------------- issue 29: LeRobot-style use

def frame_forms():
    """one camera frame in the forms a robot stack hands over, each with what the CLI reads"""
    from PIL import Image
    rgb = np.asarray(Image.open(IMG0).convert("RGB"))
    rgba = np.asarray(Image.open(IMG0).convert("RGBA"))
    f01 = (rgb.astype(np.float32) / 255.0)
    return {
        "uint8_hwc": rgb, "float01_chw": np.ascontiguousarray(f01.transpose(2, 0, 1)),
        "float255_hwc": rgb.astype(np.float32), "float64_01": f01.astype(np.float64), "gray": rgb[:, :, 1].copy(),
        "rgba": rgba, "batch_chw": np.ascontiguousarray(f01.transpose(2, 0, 1))[None],
    }


def cli_inputs(tmp_path, img0, img1, nz):
    p = str(tmp_path / "in.npz")
    np.savez(p, image0=img0, image1=img1, task=np.array(TASK), state=STATE.astype(np.float32), noise=nz)
    r = subprocess.run([BIN, "run", "--model", model("tiny-grid"), "--inputs", p, "--runs", "1", "--json"], capture_output=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr.decode()
    return np.asarray(json.loads(r.stdout)["actions"], np.float32)


@pytest.mark.parametrize("form", ["uint8_hwc", "float01_chw", "float255_hwc", "float64_01", "gray", "rgba", "batch_chw"])
def test_frames_in_every_form_equal_the_cli(form, tmp_path):
    forms = frame_forms()
    a = forms[form]
    nz = np.random.default_rng(3).standard_normal((1, 10, 32)).astype(np.float32)
    cli_a = a[0] if form == "batch_chw" else a  # the CLI's npz takes [C, H, W] / [H, W, C] / [H, W]
    want = cli_inputs(tmp_path, cli_a, forms["uint8_hwc"], nz)
    with molmoact.Policy(model("tiny-grid"), inproc=True) as p:
        got = p.infer({"observation.images.image": a, "observation.images.wrist_image": forms["uint8_hwc"],
                       "observation.state": STATE[None].astype(np.float32), "task": [TASK], "noise": nz})["actions"]
    assert np.array_equal(got, want), form


class FakeTensor:
    """an object with __array__ (what a CPU torch tensor offers), without torch"""
    def __init__(self, a):
        self.a = a

    def __array__(self, dtype=None):
        return self.a if dtype is None else self.a.astype(dtype)


def lerobot_batch(step=0):
    forms = frame_forms()
    return {"observation.images.image": FakeTensor(forms["batch_chw"]),
            "observation.images.wrist_image": FakeTensor(forms["batch_chw"]),
            "observation.state": FakeTensor((STATE[None] + 0.01 * step).astype(np.float32)),
            "task": [TASK], "index": FakeTensor(np.array([step])), "robot_type": ["franka"]}  # extra keys ignored


def test_lerobot_adapter_in_an_eval_loop():
    """LeRobot's loop: reset at each episode, select_action every step; the queue is refilled from
    a new chunk every n_action_steps"""
    with molmoact.Policy(model("tiny-grid"), inproc=True) as p:
        calls = []
        inner = p.infer

        def counting(obs):
            calls.append(1)
            return inner(dict(obs, seed=len(calls)))
        p.infer = counting
        pol = molmoact.LeRobotPolicy(p, n_action_steps=4)
        for episode in range(2):
            pol.reset()
            got = []
            for step in range(10):
                a = pol.select_action(lerobot_batch(step))
                assert a.shape == (1, 7) and a.dtype == np.float32
                got.append(a[0])
            assert len(calls) == 3 * (episode + 1)  # steps 0, 4, 8 ask for a chunk
        chunk = pol.predict_action_chunk(lerobot_batch())
        assert chunk.shape == (1, 10, 7)
        # the queued actions are the chunk's first four, in order
        p.infer = lambda obs: inner(dict(obs, seed=99))
        pol.reset()
        first = p.infer(lerobot_batch(0))["actions"]
        seq = [pol.select_action(lerobot_batch(0))[0] for _ in range(4)]
        assert np.array_equal(np.stack(seq), first[:4])
        with pytest.raises(molmoact.MolmoActError):
            molmoact.LeRobotPolicy(p, n_action_steps=11)


def test_version():
    assert molmoact.__version__ == molmoact.version and re.fullmatch(r"\d+\.\d+\.\d+", molmoact.__version__)
    out = subprocess.run([os.environ.get("MOLMOACT", "build/molmoact"), "version"], capture_output=True, text=True).stdout
    assert out.startswith(f"molmoact {molmoact.__version__} "), out
    changelog = open(os.path.join(os.path.dirname(__file__), "..", "..", "CHANGELOG.md")).read()
    assert f"## {molmoact.__version__} " in changelog  # the version has its section


def test_lerobot_adapter_opens_a_directory():
    """LeRobotPolicy("dir") opens the Policy itself (options passed on) and closes it; anything
    else that is not a Policy is refused by name"""
    with molmoact.LeRobotPolicy(model("tiny-grid"), n_action_steps=2, inproc=True) as pol:
        a = pol.select_action(lerobot_batch(0))
        assert a.shape == (1, 7) and np.all(np.isfinite(a))
        assert len(pol._queue) == 1
        inner = pol.policy
    with pytest.raises(molmoact.MolmoActError):
        inner.infer(lerobot_batch(0))  # closed with the adapter
    with pytest.raises(TypeError, match="expected a molmoact.Policy or a model directory, got int"):
        molmoact.LeRobotPolicy(42)
    with pytest.raises(TypeError, match="unknown option"):
        molmoact.LeRobotPolicy(model("tiny-grid"), no_such_option=1)
    with pytest.raises(molmoact.MolmoActError):
        molmoact.LeRobotPolicy(model("tiny-grid"), n_action_steps=0, inproc=True)


def test_openpi_chunk_broker_in_a_loop():
    with molmoact.Policy(model("tiny-grid"), inproc=True) as p:
        calls = []
        inner = p.infer

        def counting(obs):
            calls.append(1)
            return inner(obs)
        p.infer = counting
        broker = molmoact.ActionChunkBroker(p, action_horizon=5)
        obs = {"observation/image": frame_forms()["uint8_hwc"], "observation/wrist_image": frame_forms()["uint8_hwc"],
               "observation/state": STATE, "prompt": TASK, "seed": 4}
        acts = [broker.infer(obs)["actions"] for _ in range(12)]
        assert len(calls) == 3 and all(a.shape == (7,) for a in acts)
        full = inner(obs)["actions"]
        assert np.array_equal(np.stack(acts[:5]), full[:5]) and np.array_equal(np.stack(acts[5:10]), full[:5])
        broker.reset()
        broker.infer(obs)
        assert len(calls) == 4


def test_aliases_and_per_request_choices():
    forms = frame_forms()
    img = forms["uint8_hwc"]
    with molmoact.Policy(model("tiny-grid"), inproc=True) as p:
        base = p.infer({"image": img, "wrist_image": img, "state": STATE, "instruction": TASK, "seed": 1})["actions"]
        same = p.infer({"images": [img, img], "states": STATE[None], "question": TASK, "seed": 1, "timestamp": 12.5,
                        "normalization_tag": "libero"})["actions"]
        assert np.array_equal(base, same)
        four = p.infer({"image": img, "wrist_image": img, "state": STATE, "instruction": TASK, "seed": 1, "n_action_steps": 4})["actions"]
        assert np.array_equal(four, base[:4])
        five = p.infer({"image": img, "wrist_image": img, "state": STATE, "instruction": TASK, "seed": 1, "num_steps": 5})["actions"]
        assert five.shape == base.shape and not np.array_equal(five, base)
        ten = p.infer({"image": img, "wrist_image": img, "state": STATE, "instruction": TASK, "seed": 1, "num_steps": 10})["actions"]
        assert np.array_equal(ten, base)
        with pytest.raises(molmoact.MolmoActError, match=r"norm_tag \"nope\" is not a tag .*known: libero"):
            p.infer({"image": img, "wrist_image": img, "state": STATE, "instruction": TASK, "tag": "nope"})
        with pytest.raises(molmoact.MolmoActError, match="both give"):
            p.infer({"images": [img, img], "image": img, "state": STATE, "instruction": TASK})
