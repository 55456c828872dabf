# SPDX-License-Identifier: Apache-2.0
"""`molmoact serve` with real clients: openpi's protocol from Python (python3-websockets +
python3-msgpack, as openpi-client does it) and from Node (npm ws + @msgpack/msgpack), curl for the
HTTP side, headless Chromium for the status page; faults, a soak, and a clean drain on SIGTERM.

    MOLMOACT=build/molmoact MOLMOACT_NODE_MODULES=out/node/node_modules /usr/bin/python3 -m pytest -q tests/server
MOLMOACT_SOAK_REQUESTS (default 1000) sizes the soak."""
import asyncio
import base64
import html.parser
import json
import math
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib

import numpy as np
import pytest
import websockets

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import openpi_client as oc  # noqa: E402

BIN = os.environ.get("MOLMOACT", os.path.join(SRC, "build", "molmoact"))
NODE_MODULES = os.environ.get("MOLMOACT_NODE_MODULES", os.path.join(SRC, "out", "node", "node_modules"))
IMG_PNG, IMG_JPG = os.path.join(SRC, "fuzz/corpus/image/rgb.png"), os.path.join(SRC, "fuzz/corpus/image/rgb.jpg")
PROMPT = "put both the alphabet soup and the tomato sauce in the basket"
STATE = np.array([0.02, -0.05, 0.9, 3.1, -0.1, 0.05, 0.03, -0.03])  # float64, as the LIBERO example sends it


def model(v):
    return os.path.join(SRC, "assets", v, "model")


_handed_out = set()


def free_port():
    """A port free now and not handed out before in this process: the kernel may give a closed
    port back at once, and a test asking for two (--port and --grpc-port) got the same one twice
    (a CI run: "--grpc-port must ... differ from --port")."""
    for _ in range(1000):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
        s.close()
        if p not in _handed_out:
            _handed_out.add(p)
            return p
    raise RuntimeError("no free port not handed out before")


def png_pixels(path):
    from PIL import Image
    return np.asarray(Image.open(path).convert("RGB"))


class Server:
    def __init__(self, variant="tiny-grid", *args, nofile=None):
        """nofile: the server's RLIMIT_NOFILE (soft and hard), for the tests of running out"""
        self.port = free_port()
        self.uri = f"ws://127.0.0.1:{self.port}"
        self.http = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile("w+")  # gone when closed
        limit = None
        if nofile:
            import resource
            limit = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))  # noqa: E731
        self.p = subprocess.Popen([BIN, "serve", "--model", model(variant), "--port", str(self.port), *args],
                                  stdout=subprocess.DEVNULL, stderr=self.log, preexec_fn=limit)
        deadline = time.time() + 120
        while time.time() < deadline:  # the port opens once every session is loaded
            assert self.p.poll() is None, self.logs()
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("server did not start: " + self.logs())

    def logs(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def log_lines(self):
        return [json.loads(l) for l in self.logs().splitlines() if l.startswith("{\"client\"")]

    def children(self):
        out = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        if int(f.read().rsplit(")", 1)[1].split()[1]) == self.p.pid:
                            out.append(int(pid))
                except OSError:
                    pass
        return out

    def worker(self, parts):
        for pid in self.children():
            try:
                argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if len(argv) > 5 and argv[1] == b"__worker" and argv[5] == str(parts).encode():
                return pid
        raise RuntimeError(f"no worker with parts {parts}")

    def rss_kib(self):
        total = 0
        for pid in [self.p.pid] + self.children():
            try:
                for line in open(f"/proc/{pid}/status"):
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            except OSError:
                pass
        return total

    def fds(self):
        return len(os.listdir(f"/proc/{self.p.pid}/fd"))

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        rc = self.p.wait(timeout=60)
        self.log.close()
        return rc


@pytest.fixture(scope="module")
def grid():
    s = Server("tiny-grid")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def noise(tmp_path_factory):
    nz = np.random.default_rng(11).standard_normal((1, 10, 32)).astype(np.float32)
    d = tmp_path_factory.mktemp("noise")
    np.save(d / "noise.npy", nz)
    return nz, str(d / "noise.npy")


def cli_actions(variant, noise_path, image1=IMG_PNG, image0=IMG_PNG):
    st = ",".join(repr(float(np.float32(x))) for x in STATE)
    p = subprocess.run([BIN, "run", "--model", model(variant), "--image0", image0, "--image1", image1, "--task", PROMPT,
                        "--state", st, "--noise", noise_path, "--runs", "1", "--json"], capture_output=True, timeout=300)
    assert p.returncode == 0, p.stderr.decode()
    return np.asarray(json.loads(p.stdout)["actions"], np.float32)


def observation(nz=None, img0=None, img1=None, **extra):
    obs = {"observation/image": png_pixels(IMG_PNG) if img0 is None else img0,
           "observation/wrist_image": png_pixels(IMG_PNG) if img1 is None else img1,
           "observation/state": STATE, "prompt": PROMPT}
    if nz is not None:
        obs["noise"] = nz
    obs.update(extra)
    return obs


# ------------------------------------------------------------------------------------ clients

@pytest.mark.parametrize("variant", ["tiny-grid", "tiny-original"])
def test_python_openpi_client_equals_cli(variant, noise):
    nz, nz_path = noise
    want = cli_actions(variant, nz_path)
    want_jpeg = cli_actions(variant, nz_path, image1=IMG_JPG)
    s = Server(variant)
    try:
        meta, out = oc.infer_once(s.uri, observation(nz))
        assert meta["variant"] == ("grid" if variant == "tiny-grid" else "original")
        assert meta["action_horizon"] == 10 and meta["action_dim"] == 7 and meta["norm_tag"] == "libero"
        assert set(meta["precision"]) == {"vision", "llm", "action"} and meta["molmoact_version"]
        a = out["actions"]
        assert a.dtype == np.float32 and a.shape == (10, 7)
        assert np.array_equal(a, want)
        assert out["policy_timing"]["infer_ms"] > 0 and out["server_timing"]["infer_ms"] > 0
        # the wrist frame as JPEG bytes (decoded by the server as the CLI decodes the file)
        with open(IMG_JPG, "rb") as f:
            jpg = f.read()
        _, out = oc.infer_once(s.uri, observation(nz, img1=jpg))
        assert np.array_equal(out["actions"], want_jpeg)

        async def two():  # prev_total_ms from the second reply on
            async with oc.Client(s.uri) as c:
                r1 = await c.infer(observation(nz))
                r2 = await c.infer(observation(nz))
                return r1, r2
        r1, r2 = asyncio.run(two())
        assert "prev_total_ms" not in r1["server_timing"] and r2["server_timing"]["prev_total_ms"] > 0
        assert np.array_equal(r2["actions"], want)
    finally:
        assert s.stop() == 0


def node_request(tmp_path, jpeg=False, noise_f32=None):
    img = png_pixels(IMG_PNG)
    (tmp_path / "img.u8").write_bytes(img.tobytes())
    spec = {"raw": "img.u8", "shape": list(img.shape)}
    if jpeg:
        shutil.copy(IMG_JPG, tmp_path / "img.jpg")
    if noise_f32 is not None:
        (tmp_path / "noise.f32").write_bytes(noise_f32.tobytes())
    req = {"prompt": PROMPT, "state": STATE.tolist(), "noise": "noise.f32" if noise_f32 is not None else None,
           "images": [spec, {"encoded": "img.jpg"} if jpeg else spec]}
    (tmp_path / "req.json").write_text(json.dumps(req))
    return str(tmp_path / "req.json")


def have_node_modules():
    return os.path.isdir(os.path.join(NODE_MODULES, "ws")) and os.path.isdir(os.path.join(NODE_MODULES, "@msgpack", "msgpack"))


@pytest.mark.parametrize("variant", ["tiny-grid", "tiny-original"])
def test_node_client_equals_cli(variant, noise, tmp_path):
    if not have_node_modules():
        pytest.fail(f"npm packages ws and @msgpack/msgpack missing under {NODE_MODULES} (tests/server/setup_node.sh)")
    nz, nz_path = noise
    s = Server(variant)
    try:
        for jpeg in (False, True):
            want = cli_actions(variant, nz_path, image1=IMG_JPG if jpeg else IMG_PNG)
            req = node_request(tmp_path, jpeg=jpeg, noise_f32=nz)
            p = subprocess.run(["node", os.path.join(HERE, "node_client.mjs"), s.uri, req], capture_output=True, timeout=120,
                               env=dict(os.environ, MOLMOACT_NODE_MODULES=NODE_MODULES))
            out = json.loads(p.stdout.decode().strip().splitlines()[-1])
            assert "error" not in out, (out, p.stderr.decode())
            assert out["dtype"] == "<f4" and out["metadata"]["action_dim"] == 7
            assert np.array_equal(np.asarray(out["actions"], np.float32), want)
    finally:
        assert s.stop() == 0


def json_numpy(a):
    a = np.ascontiguousarray(a)
    return {"__numpy__": base64.b64encode(a.tobytes()).decode(), "dtype": a.dtype.str, "shape": list(a.shape)}


def actions_of(reply):
    """the reply's actions: a json_numpy array by default, nested lists with ?format=list"""
    a = reply["actions"]
    if isinstance(a, dict):
        assert a["dtype"] == "<f4"
        return np.frombuffer(base64.b64decode(a["__numpy__"]), np.float32).reshape(a["shape"])
    return np.asarray(a, np.float32)


def curl(*args, data=None):
    p = subprocess.run(["curl", "-s", "-S", "-m", "60", "-w", "\n%{http_code}", *args], input=data, capture_output=True, timeout=90)
    body, code = p.stdout.decode().rsplit("\n", 1)
    return int(code), body


def test_http_with_curl(grid, noise, tmp_path):
    nz, nz_path = noise
    assert curl(f"{grid.http}/healthz") == (200, "OK")
    code, body = curl(f"{grid.http}/health")
    assert code == 200 and json.loads(body)["status"] == "ok"
    code, body = curl(f"{grid.http}/act")
    assert code == 200 and json.loads(body)["variant"] == "grid"
    want = cli_actions("tiny-grid", nz_path)
    img = png_pixels(IMG_PNG)
    req = {"image": json_numpy(img), "wrist_image": json_numpy(img), "state": json_numpy(STATE), "instruction": PROMPT,
           "noise": json_numpy(nz)}
    (tmp_path / "req.json").write_text(json.dumps(req))
    code, body = curl("-X", "POST", "-H", "Content-Type: application/json", "--data-binary", f"@{tmp_path}/req.json",
                      f"{grid.http}/act")
    assert code == 200, body
    r = json.loads(body)
    assert np.array_equal(actions_of(r), want) and r["dt_ms"] > 0
    # task / prompt as the instruction's other names, images as base64 JPEG/PNG bytes
    with open(IMG_PNG, "rb") as f:
        b64png = base64.b64encode(f.read()).decode()
    req = {"image": b64png, "wrist_image": b64png, "state": STATE.tolist(), "task": PROMPT, "noise": json_numpy(nz)}
    code, body = curl("-X", "POST", "--data-binary", json.dumps(req), f"{grid.http}/act")
    assert code == 200 and np.array_equal(actions_of(json.loads(body)), want), body
    # errors: 400 naming the field, 404
    bad = dict(req, state=[0, 0, float("nan")] + [0] * 5)
    code, body = curl("-X", "POST", "--data-binary", json.dumps(bad).replace("NaN", "1e999"), f"{grid.http}/act")
    assert code == 400 and "state" in json.loads(body)["error"], body
    code, body = curl("-X", "POST", "--data-binary", "{not json", f"{grid.http}/act")
    assert code == 400 and "JSON" in json.loads(body)["error"]
    code, body = curl(f"{grid.http}/nope")
    assert code == 404
    code, body = curl(f"{grid.http}/status.json")
    st = json.loads(body)
    ok = [r for r in st["recent"] if r["ok"]]
    assert code == 200 and st["requests_served"] >= 2 and ok and ok[-1]["total"] > 0
    assert any(not r["ok"] for r in st["recent"])  # failures are plotted too
    code, body = curl(f"{grid.http}/")
    assert code == 200 and "<svg" in body and "molmoact serve" in body


class StatusDom(html.parser.HTMLParser):
    """the status page as Chromium left it: its tables' rows (cells as text), the y axis' tick labels,
    the failure marks and the text"""
    def __init__(self):
        super().__init__()
        self.tables, self.ticks, self.fail_marks, self.text = {}, [], 0, ""
        self.table = self.row = self.cell = self.tick = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self.table = a.get("id")
        elif tag == "tbody" and self.table:
            self.tables[self.table] = []
        elif tag == "tr" and self.table in self.tables:
            self.row = []
        elif tag == "td" and self.row is not None:
            self.cell = ""
        elif tag == "text" and a.get("class") == "tick":
            self.tick = ""
        elif tag == "g" and a.get("class") == "fail":
            self.fail_marks += 1

    def handle_endtag(self, tag):
        if tag == "td" and self.cell is not None:
            self.row.append(self.cell)
            self.cell = None
        elif tag == "tr" and self.row is not None:
            self.tables[self.table].append(self.row)
            self.row = None
        elif tag == "table":
            self.table = None
        elif tag == "text" and self.tick is not None:
            self.ticks.append(self.tick)
            self.tick = None

    def handle_data(self, data):
        self.text += data
        if self.cell is not None:
            self.cell += data
        if self.tick is not None:
            self.tick += data


def test_status_page_in_chromium(grid, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        pytest.fail("chromium is not installed (scripts/install_deps.sh installs it)")
    oc.infer_once(grid.uri, observation())  # at least one bar in the plot
    assert fault(grid.uri, b"\xc1 not msgpack")[0] == "error"  # and one failure, as a mark
    shot = tmp_path / "status.png"
    p = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=900,1300",
                        "--virtual-time-budget=4000", f"--screenshot={shot}", grid.http + "/"], capture_output=True, timeout=120)
    assert shot.exists(), p.stderr.decode()[-2000:]
    dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=4000", "--dump-dom",
                          grid.http + "/"], capture_output=True, timeout=120).stdout.decode()
    assert "requests served" in dom and "<rect" in dom, dom[:2000]  # the script filled the table and drew the bars
    code, body = curl(f"{grid.http}/status.json")  # what the page showed (no request in between)
    st = json.loads(body)
    page = StatusDom()
    page.feed(dom)
    # precision per component, with the dtype its weights are stored in
    prec = page.tables["precision"]
    assert [r[0] for r in prec] == [c["name"] for c in st["components"]] == \
        ["vision", "embed", "llm_split0", "llm_split1", "llm_split2", "llm_split3", "action_context", "action_step"], prec
    assert all(r[1] == "checkpoint" and r[2].startswith("f16 (") for r in prec), prec
    # p50/p90/p99 per component, as /status.json has them
    pct = page.tables["percentiles"]
    assert [r[0] for r in pct] == list(st["percentiles"]) and "vision" in st["percentiles"] and "total" in st["percentiles"], pct
    for name, *cells in pct:
        for cell, q in zip(cells, ("p50", "p90", "p99")):
            dec = len(cell.split(".")[1]) if "." in cell else 0
            assert abs(float(cell) - st["percentiles"][name][q]) <= 0.5 * 10 ** -dec + 1e-9, (name, q, cell, st["percentiles"][name])
    assert f"over the last {st['percentiles_over']} successful request" in page.text
    # every failure of the history a mark; the bars' scale in 1-2-5 steps from 0
    assert page.fail_marks == sum(not r["ok"] for r in st["recent"]) >= 1, page.fail_marks
    ticks = page.ticks
    step = float(ticks[1]) - float(ticks[0])
    mant = step / 10 ** math.floor(math.log10(step) + 1e-9)
    assert float(ticks[0]) == 0 and any(abs(mant - m) < 1e-6 for m in (1, 2, 5)), ticks
    assert all(abs(float(t) - i * step) < step * 1e-6 for i, t in enumerate(ticks)), ticks
    tallest = max(sum(r[k] for k in ("vision", "llm", "action_context", "action_step", "transfer", "host")) for r in st["recent"])
    assert float(ticks[-1]) >= tallest * (1 - 1e-9) and float(ticks[-2]) < tallest, (ticks, tallest)
    shutil.copy(shot, os.path.join(os.environ.get("MOLMOACT_ARTIFACTS", str(tmp_path)), "status_page.png"))


# ------------------------------------------------------------------------------------ faults

async def raw_exchange(uri, payload, headers=None, text=False):
    """send one frame, return ("reply", obj) / ("error", text, close code)"""
    async with websockets.connect(uri, compression=None, max_size=2 ** 26, extra_headers=headers) as ws:
        oc.unpackb(await ws.recv())
        await (ws.send(payload.decode() if text else payload))
        r = await ws.recv()
        if isinstance(r, str):
            try:
                await asyncio.wait_for(ws.recv(), 10)
            except websockets.ConnectionClosed as e:
                return ("error", r, e.rcvd.code if e.rcvd else None)
            return ("error", r, None)
        return ("reply", oc.unpackb(r))


def fault(uri, payload, **kw):
    return asyncio.run(raw_exchange(uri, payload, **kw))


def healthy(s):
    _, out = oc.infer_once(s.uri, observation())
    return out["actions"].shape == (10, 7)


@pytest.mark.parametrize("name,obs,needle", [
    ("missing key", {"observation/image": np.zeros((8, 8, 3), np.uint8)}, "missing key"),
    ("wrong dtype", None, "dtype '<i2'"),
    ("wrong shape", None, "channels"),
    ("nan state", None, "observation/state[2] is NaN"),
    ("huge image", None, "exceeds"),
])
def test_bad_requests_named(grid, name, obs, needle):
    o = observation()
    if name == "wrong dtype":
        o["observation/image"] = np.zeros((8, 8, 3), np.int16)
    elif name == "wrong shape":
        o["observation/wrist_image"] = np.zeros((8, 8, 5), np.uint8)
    elif name == "nan state":
        o["observation/state"] = np.array([0, 0, np.nan, 0, 0, 0, 0, 0])
    elif name == "huge image":
        o["observation/image"] = np.zeros((1, 20000, 3), np.uint8)
    else:
        o = obs
    kind, msg, code = fault(grid.uri, oc.packb(o))
    assert kind == "error" and needle in msg and code == 1011, (kind, msg, code)
    assert "/" not in msg.replace("observation/", "").replace("[H, W, 3]", "") or name == "wrong shape"  # no paths
    assert healthy(grid)


def test_more_faults(grid):
    # bytes that are not msgpack, a text frame, a 1x1 image (valid: resized), truncated msgpack
    for payload, text in ((b"\xc1\xc1 not msgpack", False), (b"hello", True), (oc.packb(observation())[:-3], False)):
        kind, msg, code = fault(grid.uri, payload, text=text)
        assert kind == "error" and code == 1011 and ("msgpack" in msg or "binary" in msg), (msg, code)
    kind, out = fault(grid.uri, oc.packb(observation(img0=np.zeros((1, 1, 3), np.uint8))))
    assert kind == "reply" and out["actions"].shape == (10, 7)
    assert healthy(grid)


def test_message_over_the_limit_and_api_key(tmp_path):
    key = tmp_path / "key"
    key.write_text("s3cret-key\n")
    s = Server("tiny-grid", "--max-message-mb", "0.5", "--api-key-file", str(key))
    try:
        with pytest.raises(websockets.InvalidStatusCode):  # refused at the handshake, nothing parsed
            fault(s.uri, oc.packb(observation()))
        with pytest.raises(websockets.InvalidStatusCode):
            fault(s.uri, oc.packb(observation()), headers={"Authorization": "Api-Key wrong"})
        hdr = {"Authorization": "Api-Key s3cret-key"}
        kind, msg, code = fault(s.uri, oc.packb(observation(img0=np.zeros((600, 600, 3), np.uint8))), headers=hdr)
        assert kind == "error" and "max-message-mb" in msg and code == 1009, (kind, msg, code)
        kind, out = fault(s.uri, oc.packb(observation()), headers=hdr)
        assert kind == "reply"
        assert curl(f"{s.http}/healthz") == (200, "OK")  # health checks need no key
        code, body = curl(f"{s.http}/status.json")
        assert code == 401
        code, body = curl("-H", "Authorization: Api-Key s3cret-key", f"{s.http}/status.json")
        assert code == 200
        assert any("API key" in l["outcome"] for l in s.log_lines())
    finally:
        assert s.stop() == 0


def test_worker_killed_during_a_request(grid):
    action = grid.worker(64 | 128)
    os.kill(action, signal.SIGSTOP)  # the request will wait on it ...
    result = {}

    def send():
        result["r"] = fault(grid.uri, oc.packb(observation()))
    t = threading.Thread(target=send)
    t.start()
    time.sleep(1.5)
    os.kill(action, signal.SIGKILL)  # ... and it dies during the request
    t.join(60)
    kind, msg, code = result["r"]
    assert kind == "error" and "worker action" in msg and "restarted" in msg and code == 1011, result
    assert healthy(grid)  # the next request is correct
    assert len(grid.children()) == 6


def test_disconnect_mid_request_and_idle_connections(grid):
    async def go():
        ws = await websockets.connect(grid.uri, compression=None)
        await ws.recv()
        await ws.send(oc.packb(observation()))
        ws.transport.abort()  # gone before the reply, without a close handshake
        idle = []
        for _ in range(200):  # 200 idle connections, each holding its socket
            c = await websockets.connect(grid.uri, compression=None, open_timeout=30)
            await c.recv()
            idle.append(c)
        async with oc.Client(grid.uri) as c:  # still served
            out = await c.infer(observation())
        for c in idle:
            await c.close()
        return out
    out = asyncio.run(go())
    assert out["actions"].shape == (10, 7)
    time.sleep(0.5)
    code, body = curl(f"{grid.http}/status.json")
    assert json.loads(body)["clients"] <= 2, body  # every closed connection released
    assert healthy(grid)


def ws_handshake(port):
    """a raw TCP websocket handshake (to send frames websockets would never send)"""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += sock.recv(4096)
    assert b" 101 " in buf.split(b"\r\n", 1)[0], buf
    return sock


def test_slow_sender_times_out_alone():
    s = Server("tiny-grid", "--recv-timeout-s", "2")
    try:
        slow = ws_handshake(s.port)
        # a masked binary frame that claims 1000 bytes and brings 100
        mask = os.urandom(4)
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(b"\x00" * 100))
        slow.sendall(bytes([0x82, 0x80 | 126]) + struct.pack(">H", 1000) + mask + payload)
        t0 = time.time()
        _, out = oc.infer_once(s.uri, observation())  # others are served meanwhile
        assert out["actions"].shape == (10, 7)
        slow.settimeout(20)
        closed = False
        try:
            while True:
                d = slow.recv(65536)
                if not d:
                    closed = True
                    break
        except (ConnectionResetError, socket.timeout):
            closed = True
        dt = time.time() - t0
        assert closed and dt < 15, dt  # dropped after --recv-timeout-s, not held forever
        slow.close()
        time.sleep(0.3)
        code, body = curl(f"{s.http}/status.json")
        assert json.loads(body)["clients"] <= 1, body
    finally:
        assert s.stop() == 0


# ------------------------------------------------------------------------------------ soak

def test_soak_with_faults(noise):
    nz, _ = noise
    n_total = int(os.environ.get("MOLMOACT_SOAK_REQUESTS", "1000"))
    s = Server("tiny-grid")
    try:
        good = oc.packb(observation(nz))
        bad = oc.packb({"observation/image": np.zeros((4, 4, 3), np.uint8)})
        counts = {"ok": 0, "error": 0}
        lock = threading.Lock()
        want = oc.infer_once(s.uri, observation(nz))[1]["actions"]

        async def client(k, n, sample):
            i = 0
            while i < n:
                try:
                    async with websockets.connect(s.uri, compression=None, max_size=2 ** 26) as ws:
                        await ws.recv()
                        while i < n:
                            if i % 97 == 13:  # a bad request: an error, then the server closes this connection
                                await ws.send(bad)
                                r = await ws.recv()
                                assert isinstance(r, str)
                                with lock:
                                    counts["error"] += 1
                                i += 1
                                break
                            await ws.send(good)
                            r = await ws.recv()
                            if isinstance(r, str):
                                assert "worker" in r, r
                                with lock:
                                    counts["error"] += 1
                                i += 1
                                break
                            assert np.array_equal(oc.unpackb(r)["actions"], want)
                            with lock:
                                counts["ok"] += 1
                            i += 1
                            if k == 0 and i == sample[0]:
                                sample[1] = s.rss_kib()
                except websockets.ConnectionClosed:
                    pass

        warm = n_total // 8
        sample = [warm // 4, 0]
        fds0 = None

        async def run(n):
            per = n // 4
            await asyncio.gather(*(client(k, per, sample) for k in range(4)))

        asyncio.run(run(warm))  # warm-up
        rss0, fds0 = s.rss_kib(), s.fds()
        stop_kills = threading.Event()

        def killer():  # a worker killed now and then
            while not stop_kills.wait(7.0):
                try:
                    os.kill(s.worker(1), signal.SIGKILL)
                except (RuntimeError, ProcessLookupError):
                    pass
        kt = threading.Thread(target=killer)
        kt.start()
        before = dict(counts)
        asyncio.run(run(n_total - warm))
        stop_kills.set()
        kt.join()
        done = counts["ok"] + counts["error"] - before["ok"] - before["error"]
        assert done == (n_total - warm) // 4 * 4, (counts, before)  # every request answered exactly once
        time.sleep(1.0)
        assert healthy(s)
        rss1, fds1 = s.rss_kib(), s.fds()
        print(f"soak: {counts}, RSS {rss0} -> {rss1} KiB, fds {fds0} -> {fds1}")
        if os.environ.get("MOLMOACT_SANITIZED") not in ("1", "ON", "TRUE"):  # ASan's quarantine grows by design
            assert rss1 - rss0 <= 1024, (rss0, rss1)
        assert fds1 <= fds0, (fds0, fds1)
        assert len(s.children()) == 6
        assert counts["error"] >= n_total // 100
    finally:
        assert s.stop() == 0


# ------------------------------------------------------------------------------------ shutdown

def test_sigterm_drains_and_closes_with_1001():
    s = Server("tiny-grid")
    got = {}

    async def go():
        async with websockets.connect(s.uri, compression=None) as idle:
            await idle.recv()
            async with websockets.connect(s.uri, compression=None) as busy:
                await busy.recv()
                await busy.send(oc.packb(observation()))
                await asyncio.sleep(0.05)
                s.p.send_signal(signal.SIGTERM)
                r = await busy.recv()  # the request in flight is answered
                got["reply"] = oc.unpackb(r)
                try:
                    await asyncio.wait_for(idle.recv(), 20)
                except websockets.ConnectionClosed as e:
                    got["code"] = e.rcvd.code if e.rcvd else None
    asyncio.run(go())
    assert got["reply"]["actions"].shape == (10, 7) and got["code"] == 1001, got
    assert s.p.wait(timeout=60) == 0
    assert not s.children()
    s.log.close()


def test_pings_and_health_during_a_long_inference(grid):
    """the network loop never waits on inference: a request held 10 s by a stopped worker, while
    pings, health checks and a second client's handshake are answered at once"""
    vision = grid.worker(1)
    os.kill(vision, signal.SIGSTOP)
    result = {}

    def send():
        result["r"] = fault(grid.uri, oc.packb(observation()))
    t = threading.Thread(target=send)
    t.start()
    try:
        time.sleep(0.5)

        async def probe():
            async with websockets.connect(grid.uri, compression=None) as ws:
                meta = oc.unpackb(await asyncio.wait_for(ws.recv(), 2))
                t0 = time.monotonic()
                pong = await ws.ping()
                await asyncio.wait_for(pong, 2)
                return meta, time.monotonic() - t0
        t0 = time.monotonic()
        meta, ping_s = asyncio.run(probe())
        code, body = curl(f"{grid.http}/healthz")
        assert code == 200 and body == "OK" and meta["action_dim"] == 7
        assert ping_s < 1.0 and time.monotonic() - t0 < 3.0, ping_s
        time.sleep(9.5)  # the request is still held: 10 s in all
        assert t.is_alive()
    finally:
        os.kill(vision, signal.SIGCONT)
    t.join(60)
    kind, out = result["r"][0], result["r"][1]
    assert kind == "reply" and out["actions"].shape == (10, 7), result
