# SPDX-License-Identifier: Apache-2.0
"""`molmoact serve` against the robot clients users have (issue 29): request shapes written from
AllenAI's MolmoAct2 servers and clients (DROID-style /act, serve_policy.py), OpenVLA's encoded
wrapper, openpi's websocket client and LIBERO example, LeRobot batches; python-requests (Debian's
python3-requests) with keep-alive and generator (chunked) bodies; json_numpy replies decoded as
json_numpy.loads does; fresh noise per request; a process-group stop.

The request shapes follow the public code (cited in docs/SERVER.md), written here in our words:
    MOLMOACT=build/molmoact /usr/bin/python3 -m pytest -q tests/server/test_clients.py"""
import asyncio
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import numpy as np
import pytest
import requests
import websockets

from test_server import (BIN, IMG_JPG, IMG_PNG, PROMPT, STATE, Server, curl, fault, json_numpy, model, oc, png_pixels)


def jn_decode(o):
    """what json_numpy.loads does with an object: {"__numpy__", "dtype", "shape"} -> ndarray"""
    if isinstance(o, dict) and "__numpy__" in o:
        a = np.frombuffer(base64.b64decode(o["__numpy__"]), dtype=np.dtype(o["dtype"]))
        return a.reshape(o["shape"]) if o["shape"] else a[0]
    return o


def jn_loads(text):
    return json.loads(text, object_hook=jn_decode)


def jn_dumps(obj):
    """json_numpy.dumps: every ndarray as {"__numpy__": base64 of its C-order bytes, "dtype", "shape"}"""
    def default(o):
        if isinstance(o, np.ndarray):
            return json_numpy(o)
        raise TypeError(type(o))
    return json.dumps(obj, default=default)


def cli(args, noise=None, seed=None, tmp=None):
    extra = ["--noise", noise] if noise else ["--seed", str(seed)]
    p = subprocess.run([BIN, "run", "--model", model("tiny-grid"), *args, *extra, "--runs", "1", "--json"], capture_output=True, timeout=300)
    assert p.returncode == 0, p.stderr.decode()
    return np.asarray(json.loads(p.stdout)["actions"], np.float32)


def cli_frames(tmp_path, img0, img1, nz, task=PROMPT, state=STATE, tag=None):
    p = str(tmp_path / "in.npz")
    np.savez(p, image0=img0, image1=img1, task=np.array(task), state=np.asarray(state, np.float32), noise=nz)
    args = ["--inputs", p] + (["--norm-tag", tag] if tag else [])
    r = subprocess.run([BIN, "run", "--model", model_dir_for(tag), *args, "--runs", "1", "--json"], capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode()
    return np.asarray(json.loads(r.stdout)["actions"], np.float32)


_two_tags = {}


def model_dir_for(tag):
    return _two_tags.get("dir", model("tiny-grid")) if tag else model("tiny-grid")


@pytest.fixture(scope="module")
def two_tags(tmp_path_factory):
    """the tiny model with a second norm-stats tag (other action statistics)"""
    d = tmp_path_factory.mktemp("tags") / "model"
    shutil.copytree(model("tiny-grid"), d)
    ns = json.loads((d / "norm_stats.json").read_text())
    tags = ns["metadata_by_tag"]
    alt = json.loads(json.dumps(tags["libero"]))
    for k in ("q01", "q99", "min", "max", "mean"):
        if k in alt["action_stats"]:
            alt["action_stats"][k] = [v * 0.5 for v in alt["action_stats"][k]]
    tags["libero_half"] = alt
    (d / "norm_stats.json").write_text(json.dumps(ns))
    _two_tags["dir"] = str(d)
    return str(d)


@pytest.fixture(scope="module")
def srv(two_tags):
    s = Server.__new__(Server)
    start(s, two_tags, "--seed", "7")
    yield s
    assert s.stop() == 0


def start(s, model_dir, *args):
    from test_server import free_port
    s.port = free_port()
    s.uri, s.http = f"ws://127.0.0.1:{s.port}", f"http://127.0.0.1:{s.port}"
    s.log = tempfile.TemporaryFile("w+")  # gone when closed
    s.p = subprocess.Popen([BIN, "serve", "--model", model_dir, "--port", str(s.port), *args], stdout=subprocess.DEVNULL, stderr=s.log,
                           start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        assert s.p.poll() is None, s.logs()
        try:
            socket.create_connection(("127.0.0.1", s.port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(s.logs())


@pytest.fixture(scope="module")
def nz():
    return np.random.default_rng(21).standard_normal((1, 10, 32)).astype(np.float32)


def img():
    return png_pixels(IMG_PNG)


def post(s, body, path="/act", **kw):
    return requests.post(s.http + path, data=body, headers={"Content-Type": "application/json"}, timeout=120, **kw)


# ------------------------------------------------------------------------------- AllenAI's shapes

def test_droid_style_client_and_health(srv, tmp_path, nz):
    """AllenAI's DROID/YAM-style client: json_numpy body, instruction, float64 state, timestamp and
    normalization_tag (ignored by their servers, honoured here), num_steps; the reply is json_numpy
    {"actions": float32 [N, D], "dt_ms"} decoded with json_numpy.loads; GET /act is their health check"""
    h = requests.get(srv.http + "/act", timeout=30).json()
    for k, want in (("status", "ok"), ("norm_tag", "libero"), ("num_cameras", 2), ("state_dim", 8), ("variant", "grid")):
        assert h[k] == want, (k, h)
    assert set(h["precision"]) == {"vision", "llm", "action"} and h["version"] and h["model"] and h["repo_id"]
    with requests.Session() as sess:  # keep-alive, as their client holds one session
        for _ in range(2):
            body = jn_dumps({"image": img(), "wrist_image": img(), "instruction": PROMPT, "state": STATE.astype(np.float64),
                             "timestamp": time.time(), "normalization_tag": "libero", "num_steps": 10, "noise": nz})
            r = sess.post(srv.http + "/act", data=body, headers={"Content-Type": "application/json"}, timeout=120)
            assert r.status_code == 200, r.text
            out = jn_loads(r.text)
            a = np.asarray(out["actions"])
            assert a.dtype == np.float32 and a.shape == (10, 7) and out["dt_ms"] > 0
    assert np.array_equal(a, cli_frames(tmp_path, img(), img(), nz))
    ignored = [json.loads(l) for l in srv.logs().splitlines() if '"ignored keys"' in l]
    assert ignored and "timestamp" in ignored[-1]["detail"]
    r = requests.post(srv.http + "/act?format=list", data=body, timeout=120)
    assert np.array_equal(np.asarray(r.json()["actions"], np.float32), a)


def test_serve_policy_style_aliases(srv, tmp_path, nz):
    """serve_policy.py's keys: images (a list), states [n_obs_steps, 8], question, tag, n_action_steps,
    session_id; and POST /reset"""
    body = jn_dumps({"images": [img(), img()], "states": STATE[None].astype(np.float32), "question": PROMPT, "tag": "libero",
                     "n_action_steps": 4, "session_id": "robot-1", "noise": nz})
    r = post(srv, body)
    assert r.status_code == 200, r.text
    a = jn_loads(r.text)["actions"]
    assert a.shape == (4, 7) and np.array_equal(a, cli_frames(tmp_path, img(), img(), nz)[:4])
    r = requests.post(srv.http + "/reset", json={"session_id": "robot-1"}, timeout=30)  # its action timeline
    assert r.status_code == 200 and r.json() == {"status": "ok", "removed": ["robot-1"]}
    r = requests.post(srv.http + "/reset", json={"session_id": "robot-1"}, timeout=30)
    assert r.status_code == 200 and r.json() == {"status": "ok", "removed": []}


def test_openvla_encoded_wrapper(srv, tmp_path, nz):
    inner = jn_dumps({"image": img(), "wrist_image": img(), "instruction": PROMPT, "state": STATE, "noise": nz})
    r = requests.post(srv.http + "/act", json={"encoded": inner}, timeout=120)
    assert r.status_code == 200, r.text
    assert np.array_equal(jn_loads(r.text)["actions"], cli_frames(tmp_path, img(), img(), nz))


def test_per_request_norm_tag(srv, tmp_path, nz):
    base = {"image": img(), "wrist_image": img(), "instruction": PROMPT, "state": STATE, "noise": nz}
    a = jn_loads(post(srv, jn_dumps(base)).text)["actions"]
    b = jn_loads(post(srv, jn_dumps(dict(base, norm_tag="libero_half"))).text)["actions"]
    assert not np.array_equal(a, b)
    assert np.array_equal(b, cli_frames(tmp_path, img(), img(), nz, tag="libero_half"))
    r = post(srv, jn_dumps(dict(base, normalization_tag="no_such_tag")))
    assert r.status_code == 400 and "no_such_tag" in r.json()["error"] and "libero_half" in r.json()["error"], r.text


# ------------------------------------------------------------------------------- frames in every form

def forms():
    from PIL import Image
    rgb = img()
    f01 = rgb.astype(np.float32) / 255.0
    return {
        "float01_hwc": f01, "float255": rgb.astype(np.float32), "chw": np.ascontiguousarray(rgb.transpose(2, 0, 1)),
        "gray": rgb[:, :, 0].copy(), "rgba": np.asarray(Image.open(IMG_PNG).convert("RGBA")),
        "batch1": rgb[None], "float64_chw01": np.ascontiguousarray(f01.transpose(2, 0, 1)).astype(np.float64),
    }


@pytest.mark.parametrize("form", ["float01_hwc", "float255", "chw", "gray", "rgba", "batch1", "float64_chw01"])
def test_frames_over_both_protocols_equal_the_cli(srv, tmp_path, nz, form):
    a = forms()[form]
    want = cli_frames(tmp_path, a[0] if form == "batch1" else a, img(), nz)
    r = post(srv, jn_dumps({"image": a, "wrist_image": img(), "instruction": PROMPT, "state": STATE, "noise": nz}))
    assert r.status_code == 200, r.text
    assert np.array_equal(jn_loads(r.text)["actions"], want), form
    kind, out = fault(srv.uri, oc.packb({"observation/image": a, "observation/wrist_image": img(), "observation/state": STATE,
                                         "prompt": PROMPT, "noise": nz}))
    assert kind == "reply" and np.array_equal(out["actions"], want), form


def test_nested_lists_data_urls_and_file_bytes(srv, tmp_path, nz):
    want = cli_frames(tmp_path, img(), img(), nz)
    png = open(IMG_PNG, "rb").read()
    cases = [
        {"image": img().tolist(), "wrist_image": img().tolist()},                       # nested JSON lists
        {"images": [img().tolist(), img().tolist()]},
        {"image": "data:image/png;base64," + base64.b64encode(png).decode(), "wrist_image": base64.b64encode(png).decode()},
        {"image": np.frombuffer(png, np.uint8), "wrist_image": img()},                   # a file's bytes as uint8 [n]
    ]
    for extra in cases:
        body = dict({"instruction": PROMPT, "state": STATE.tolist(), "noise": nz.tolist()}, **extra)
        r = post(srv, jn_dumps(body))
        assert r.status_code == 200, r.text
        assert np.array_equal(jn_loads(r.text)["actions"], want), list(extra)


# ------------------------------------------------------------------------------- LeRobot batches over the websocket

def test_lerobot_batch_over_the_websocket(srv, tmp_path, nz):
    f = (img().astype(np.float32) / 255.0).transpose(2, 0, 1)[None]  # float32 [1, 3, H, W] in [0, 1]
    obs = {"observation.images.image": np.ascontiguousarray(f), "observation.images.wrist_image": np.ascontiguousarray(f),
           "observation.state": STATE[None].astype(np.float32), "task": [PROMPT], "noise": nz, "index": np.array([3])}
    kind, out = fault(srv.uri, oc.packb(obs))
    assert kind == "reply", out
    assert np.array_equal(out["actions"], cli_frames(tmp_path, f[0], f[0], nz))


# ------------------------------------------------------------------------------- refusals and messages

@pytest.mark.parametrize("extra,needle", [
    ({"image": "x", "observation/image": "y"}, "keys 'image' and 'observation/image' both give the agent camera"),
    ({"images": [1, 2], "wrist_image": "y"}, "both give the wrist camera"),
    ({"state": [0.0] * 7}, "state: 7 values"),
    ({"observation.state": [0.0] * 9}, "observation.state: 9 values"),
    ({"n_action_steps": 11}, "n_action_steps: expected an integer in [1, 10]"),
    ({"num_steps": 0}, "num_steps"),
])
def test_refusals_name_the_key(srv, extra, needle):
    body = {"wrist_image": base64.b64encode(open(IMG_PNG, "rb").read()).decode(), "instruction": PROMPT, "state": STATE.tolist()}
    if "images" not in extra:
        body["image"] = body["wrist_image"]
    body.update(extra)
    if "images" in extra:
        body.pop("image", None)
    if "observation.state" in extra:
        body.pop("state")
    r = post(srv, json.dumps(body))
    assert r.status_code == 400 and needle in r.json()["error"], (needle, r.text)


def test_missing_key_lists_every_alias(srv):
    r = post(srv, json.dumps({"image": "x", "wrist_image": "x", "state": STATE.tolist()}))
    msg = r.json()["error"]
    assert r.status_code == 400 and all(k in msg for k in ("prompt", "instruction", "task", "question")), msg


# ------------------------------------------------------------------------------- noise, timing

def server_seeds(s):
    return [l["seed"] for l in s.log_lines() if "seed" in l]


def test_fresh_noise_per_request_and_a_reproducible_sequence(two_tags, tmp_path):
    body = jn_dumps({"image": img(), "wrist_image": img(), "instruction": PROMPT, "state": STATE})
    runs = []
    for _ in range(2):
        s = Server.__new__(Server)
        start(s, two_tags, "--seed", "123")
        try:
            runs.append([jn_loads(post(s, body).text)["actions"] for _ in range(2)])
            seeds = server_seeds(s)
        finally:
            assert s.stop() == 0
    assert not np.array_equal(runs[0][0], runs[0][1])  # identical observations, fresh noise
    assert all(np.array_equal(x, y) for x, y in zip(runs[0], runs[1]))  # --seed: the same sequence
    # the seed a request used is in the log: the CLI with it gives the same actions
    p = str(tmp_path / "in.npz")
    np.savez(p, image0=img(), image1=img(), task=np.array(PROMPT), state=STATE.astype(np.float32))
    r = subprocess.run([BIN, "run", "--model", two_tags, "--inputs", p, "--seed", str(seeds[1]), "--runs", "1", "--json"],
                       capture_output=True, timeout=300)
    assert np.array_equal(np.asarray(json.loads(r.stdout)["actions"], np.float32), runs[1][1])


def test_prev_total_ms_is_the_previous_cycle(srv):
    async def go():
        async with websockets.connect(srv.uri, compression=None, max_size=2 ** 26) as ws:
            await ws.recv()
            t0 = time.monotonic()
            await asyncio.sleep(0.6)  # the wait for a request counts in its cycle, as openpi measures it
            await ws.send(oc.packb({"observation/image": img(), "observation/wrist_image": img(), "observation/state": STATE,
                                    "prompt": PROMPT}))
            r1 = oc.unpackb(await ws.recv())
            cycle = time.monotonic() - t0
            await ws.send(oc.packb({"observation/image": img(), "observation/wrist_image": img(), "observation/state": STATE,
                                    "prompt": PROMPT}))
            r2 = oc.unpackb(await ws.recv())
            return r1, r2, cycle
    r1, r2, cycle = asyncio.run(go())
    assert "prev_total_ms" not in r1["server_timing"]
    prev = r2["server_timing"]["prev_total_ms"]
    assert 600 - 5 <= prev <= cycle * 1e3 + 5, (prev, cycle)  # the first request's cycle, the wait for it included
    assert r1["server_timing"]["infer_ms"] < r2["server_timing"]["prev_total_ms"]


# ------------------------------------------------------------------------------- the wire as requests sends it

def test_requests_generator_body_is_chunked(srv, tmp_path, nz):
    body = jn_dumps({"image": img(), "wrist_image": img(), "instruction": PROMPT, "state": STATE, "noise": nz}).encode()

    def gen():
        for i in range(0, len(body), 4096):
            yield body[i:i + 4096]
    r = requests.post(srv.http + "/act", data=gen(), timeout=120)  # Transfer-Encoding: chunked
    assert r.status_code == 200, r.text
    assert np.array_equal(jn_loads(r.text)["actions"], cli_frames(tmp_path, img(), img(), nz))
    assert any("chunked" in l.get("outcome", "") or l.get("proto") == "http" for l in srv.log_lines())


def test_curl_expect_continue_is_fast(srv, tmp_path):
    big = {"image": img(), "wrist_image": np.zeros((1600, 1600, 3), np.uint8), "instruction": PROMPT, "state": STATE}
    (tmp_path / "big.json").write_text(jn_dumps(big))
    assert (tmp_path / "big.json").stat().st_size > 1 << 20  # curl sends Expect: 100-continue above 1 MiB
    t0 = time.monotonic()
    code, out = curl("-X", "POST", "-H", "Content-Type: application/json", "--data-binary", f"@{tmp_path}/big.json", f"{srv.http}/act")
    assert code == 200, out
    assert time.monotonic() - t0 < 0.9 + 5, "waited for curl's 1 s Expect timeout"  # (inference included)
    v = subprocess.run(["curl", "-s", "-v", "-o", "/dev/null", "-X", "POST", "--data-binary", f"@{tmp_path}/big.json", f"{srv.http}/act"],
                       capture_output=True, timeout=120).stderr.decode()
    assert "HTTP/1.1 100 Continue" in v, v[-2000:]


# ------------------------------------------------------------------------------- stopping

@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_process_group_signal_drains(two_tags, sig):
    """Ctrl-C in a terminal and systemd's stop signal the whole group: the request in flight is
    answered, the workers are not restarted, the exit status is 0"""
    s = Server.__new__(Server)
    start(s, two_tags)
    got = {}

    async def go():
        async with websockets.connect(s.uri, compression=None, max_size=2 ** 26) as ws:
            await ws.recv()
            await ws.send(oc.packb({"observation/image": img(), "observation/wrist_image": img(), "observation/state": STATE,
                                    "prompt": PROMPT}))
            await asyncio.sleep(0.02)
            os.killpg(s.p.pid, sig)
            got["reply"] = oc.unpackb(await ws.recv())
            try:
                await asyncio.wait_for(ws.recv(), 20)
            except websockets.ConnectionClosed as e:
                got["code"] = e.rcvd.code if e.rcvd else None
    asyncio.run(go())
    rc = s.p.wait(timeout=60)
    logs = s.logs()
    s.log.close()
    assert got["reply"]["actions"].shape == (10, 7) and got["code"] == 1001, got
    assert rc == 0, logs
    assert "did not quit" not in logs and "restart" not in logs and "died" not in logs, logs


def test_process_group_signal_during_run_stream(tmp_path):
    inp = str(tmp_path / "in.npz")
    np.savez(inp, image0=img(), image1=img(), task=np.array(PROMPT), state=STATE.astype(np.float32))
    p = subprocess.Popen([BIN, "run", "--model", model("tiny-grid"), "--stream"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True)
    p.stdin.write(f"{inp}\n".encode())
    p.stdin.flush()
    first = p.stdout.readline()
    assert b"actions" in first
    os.killpg(p.pid, signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, (p.returncode, err.decode())
    assert b"did not quit" not in err and b"restart" not in err, err.decode()
