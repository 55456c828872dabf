# SPDX-License-Identifier: Apache-2.0
"""`molmoact serve` against the second hostile-input campaign (issue 26): the API key, slow
senders and idle clients, the memory a request may cost, the drain, pipelining, bad addresses,
escaping on the status page, strict request checks and messages, and a soak of the limits.

    MOLMOACT=build/molmoact /usr/bin/python3 -m pytest -q tests/server/test_hardening.py"""
import asyncio
import base64
import json
import os
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time

import numpy as np
import pytest
import websockets

from test_server import (BIN, IMG_PNG, PROMPT, STATE, Server, actions_of, cli_actions, curl, fault, healthy, json_numpy, model,
                         observation, oc, png_pixels)

SRC = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def http_body(nz=None, **extra):
    img = png_pixels(IMG_PNG)
    req = {"image": json_numpy(img), "wrist_image": json_numpy(img), "state": json_numpy(STATE), "instruction": PROMPT}
    if nz is not None:
        req["noise"] = json_numpy(nz)
    req.update(extra)
    return json.dumps(req).encode()


def post(body, path="/act", extra=b""):
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n".encode() +
            extra + b"\r\n" + body)


def read_responses(sock, n, timeout=60):
    """n HTTP responses (status, headers, body) from a socket"""
    sock.settimeout(timeout)
    buf, out = b"", []
    while len(out) < n:
        while b"\r\n\r\n" not in buf:
            d = sock.recv(65536)
            if not d:
                return out, buf
            buf += d
        head, buf = buf.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        status = int(lines[0].split()[1])
        hdr = {l.split(":", 1)[0].lower(): l.split(":", 1)[1].strip() for l in lines[1:]}
        if status == 100:
            continue
        n_body = int(hdr.get("content-length", "0"))
        while len(buf) < n_body:
            d = sock.recv(65536)
            if not d:
                break
            buf += d
        out.append((status, hdr, buf[:n_body]))
        buf = buf[n_body:]
    return out, buf


def raw(port, data, n=1, timeout=30):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(data)
    r, _ = read_responses(s, n, timeout)
    s.close()
    return r


def closed_within(sock, seconds):
    """True when the server closes (EOF or reset) the socket within `seconds`"""
    sock.settimeout(seconds)
    t0 = time.time()
    try:
        while time.time() - t0 < seconds:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False
    return False


@pytest.fixture(scope="module")
def srv():
    s = Server("tiny-grid", "--recv-timeout-s", "3", "--idle-timeout-s", "4")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def noise():
    return np.random.default_rng(5).standard_normal((1, 10, 32)).astype(np.float32)


# ---------------------------------------------------------------------------------- E1: the key

@pytest.mark.parametrize("content,why", [(b"\x00secret", "NUL"), (b"sec\x00ret", "NUL"), (bytes(range(1, 33)), "printable"),
                                         (b"   \n", "empty"), ("kéy".encode(), "printable")])
def test_key_file_refused_at_start(tmp_path, content, why):
    key = tmp_path / "key"
    key.write_bytes(content)
    p = subprocess.run([BIN, "serve", "--model", model("tiny-grid"), "--port", "0", "--api-key-file", str(key)],
                       capture_output=True, timeout=60)
    assert p.returncode != 0 and why in p.stderr.decode(), p.stderr.decode()


def test_key_compared_whole(tmp_path):
    key = tmp_path / "key"
    key.write_text("abc123\n")
    s = Server("tiny-grid", "--api-key-file", str(key))
    try:
        for sent, want in (("abc123", 200), ("abc12", 401), ("abc1234", 401), ("", 401), ("abc123\t", 200)):
            code, _ = curl("-H", f"Authorization: Api-Key {sent}", f"{s.http}/status.json")
            assert code == want, (sent, code)
        # the scheme openpi-style clients send, as `serve --help` says; the health checks need none
        for auth, want in (("Bearer abc123", 200), ("Bearer abc12", 401), ("bearer abc123", 401), ("Basic abc123", 401)):
            code, _ = curl("-H", f"Authorization: {auth}", f"{s.http}/status.json")
            assert code == want, (auth, code)
        for path in ("/healthz", "/health"):
            assert curl(f"{s.http}{path}")[0] == 200, path
        # a NUL in a header field: libmicrohttpd 0.9.75 ends the field's value there (later versions
        # refuse it); what comes after the NUL never completes a key (docs/SERVER.md, limits)
        r = raw(s.port, b"GET /status.json HTTP/1.1\r\nHost: x\r\nAuthorization: Api-Key abc12\x003\r\n\r\n")
        assert r[0][0] in (400, 401)
        r = raw(s.port, b"GET /status.json HTTP/1.1\r\nHost: x\r\nAuthorization: Api-Key abc123\x00xx\r\n\r\n")
        assert r[0][0] in (400, 200)
    finally:
        assert s.stop() == 0


# ---------------------------------------------------------------------------------- E2: slow and idle

def test_slow_http_body_dropped_at_the_deadline(srv):
    body = http_body()
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(post(body)[:-len(body)] + body[:10])
    t0 = time.time()
    dropped = False
    for i in range(10, 40):  # a byte every 0.5 s: each arrives well within --recv-timeout-s
        try:
            s.sendall(body[i:i + 1])
        except (BrokenPipeError, ConnectionResetError):
            dropped = True
            break
        time.sleep(0.5)
        if closed_after_408(s):
            dropped = True
            break
    assert dropped and time.time() - t0 < 8, time.time() - t0
    s.close()
    assert healthy(srv)


def closed_after_408(s):
    s.setblocking(False)
    try:
        d = s.recv(65536)
        return d == b"" or b" 408 " in d
    except BlockingIOError:
        return False
    except (ConnectionResetError, BrokenPipeError):
        return True
    finally:
        s.setblocking(True)


def test_slow_http_head_and_ws_frame_dropped(srv):
    s = socket.create_connection(("127.0.0.1", srv.port))
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 200
    t0 = time.time()
    gone = False
    for b in head:
        try:
            s.sendall(bytes([b]))
        except (BrokenPipeError, ConnectionResetError):
            gone = True
            break
        if closed_after_408(s):
            gone = True
            break
        time.sleep(0.1)
        if time.time() - t0 > 10:
            break
    assert gone and time.time() - t0 < 8
    s.close()
    # a websocket frame trickled in
    from test_server import ws_handshake
    w = ws_handshake(srv.port)
    mask = os.urandom(4)
    w.sendall(bytes([0x82, 0x80 | 126]) + struct.pack(">H", 1000) + mask)
    t0 = time.time()
    gone = False
    for i in range(40):
        try:
            w.sendall(bytes([i ^ mask[i % 4]]))
        except (BrokenPipeError, ConnectionResetError):
            gone = True
            break
        time.sleep(0.4)
        w.setblocking(False)
        try:
            d = w.recv(65536)
            if d == b"" or b"not complete" in d:
                gone = True
                break
        except BlockingIOError:
            pass
        except ConnectionResetError:
            gone = True
            break
        finally:
            w.setblocking(True)
    assert gone and time.time() - t0 < 8
    w.close()


def test_idle_http_keep_alive_closed_after_recv_timeout(srv):
    """an HTTP keep-alive connection idle after its reply: closed after --recv-timeout-s (3 here),
    as `serve --help` and docs/SERVER.md say (--idle-timeout-s, 4 here, is the websockets')"""
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    s.settimeout(10)
    assert s.recv(4096).startswith(b"HTTP/1.1 200")
    t0 = time.time()
    try:
        d = s.recv(4096)
    except ConnectionResetError:
        d = b""
    dt = time.time() - t0
    s.close()
    assert d == b"" and 2 < dt < 8, (d, dt)


def test_idle_websocket_closed_with_1001(srv):
    async def go():
        async with websockets.connect(srv.uri, compression=None, ping_interval=1) as ws:  # pings do not count
            await ws.recv()
            t0 = time.time()
            try:
                await asyncio.wait_for(ws.recv(), 15)
            except websockets.ConnectionClosed as e:
                return e.rcvd.code if e.rcvd else None, time.time() - t0
            return None, time.time() - t0
    code, dt = asyncio.run(go())
    assert code == 1001 and 3 < dt < 10, (code, dt)
    assert any(json.loads(l).get("event") == "idle" for l in srv.logs().splitlines() if l.startswith("{\"event\""))


def test_health_answered_at_the_client_limit():
    s = Server("tiny-grid", "--max-clients", "3", "--recv-timeout-s", "3", "--idle-timeout-s", "0")
    try:
        async def go():
            held = []
            for _ in range(3):
                c = await websockets.connect(s.uri, compression=None)
                await c.recv()
                held.append(c)
            code, body = curl(f"{s.http}/healthz")
            assert (code, body) == (200, "OK")
            code, body = curl(f"{s.http}/health")
            assert code == 200 and json.loads(body)["status"] == "ok"
            code, body = curl(f"{s.http}/status.json")  # anything else: 503 while at the limit
            assert code == 503 and "max-clients" in json.loads(body)["error"], body
            with pytest.raises(websockets.InvalidStatusCode):
                await websockets.connect(s.uri, compression=None, open_timeout=10)
            await held[0].close()
            await asyncio.sleep(0.3)
            c = await websockets.connect(s.uri, compression=None)  # a slot is free again
            await c.recv()
            await c.close()
            for c in held[1:]:
                await c.close()
        asyncio.run(go())
    finally:
        assert s.stop() == 0


def test_soak_of_the_limits():
    """max-clients slow senders and idle sockets together: health checks answered throughout,
    every bad connection dropped by its deadline, then normal clients served"""
    s = Server("tiny-grid", "--max-clients", "24", "--recv-timeout-s", "2", "--idle-timeout-s", "3")
    try:
        socks = []
        for i in range(24):
            c = socket.create_connection(("127.0.0.1", s.port))
            if i % 3 == 0:
                c.sendall(b"POST /act HTTP/1.1\r\nContent-Length: 1000\r\n\r\n{")
            elif i % 3 == 1:
                c.sendall(b"GET / HTTP/1.1\r\nHost")
            socks.append(c)
        t_end = time.time() + 8
        worst = 0.0
        while time.time() < t_end:
            for c in socks[::3]:
                try:
                    c.sendall(b" ")
                except OSError:
                    pass
            t0 = time.time()
            code, body = curl(f"{s.http}/healthz")
            worst = max(worst, time.time() - t0)
            assert (code, body) == (200, "OK")
            time.sleep(0.4)
        assert worst < 2.0, worst
        alive = sum(0 if closed_within(c, 0.05) else 1 for c in socks)
        assert alive == 0, alive
        for c in socks:
            c.close()
        time.sleep(0.3)
        assert healthy(s)
        code, body = curl(f"{s.http}/status.json")
        assert json.loads(body)["clients"] <= 1
    finally:
        assert s.stop() == 0


# ---------------------------------------------------------------------------------- E3: memory

class HealthProbe:
    """/healthz latencies measured by curl in a separate process (not a thread of this one,
    whose interpreter lock the client's packing may hold)"""

    def __init__(self, url, path):
        self.path = path
        self.p = subprocess.Popen(["bash", "-c", f"while true; do curl -s -o /dev/null -m 30 -w '%{{time_total}}\\n' {url}/healthz; "
                                   f"sleep 0.05; done > {path}"])

    def stop(self):
        self.p.kill()
        self.p.wait()
        with open(self.path) as f:
            got = [float(x) for x in f.read().split()]
        os.unlink(self.path)
        return got


def rss_kib(pid, field):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def test_large_json_costs_bounded_memory_and_is_given_back(srv):
    n = 15 * 1024 * 1024  # 15 M numbers "0," in 30 MiB: 1.2 GB as a cJSON tree
    body = http_body()[:-1] + b', "noise": [[' + b"0," * (n - 1) + b"0]]}"
    pid = srv.p.pid
    rss0, hwm0 = rss_kib(pid, "VmRSS"), rss_kib(pid, "VmHWM")
    probe = HealthProbe(srv.http, os.path.join(os.environ.get("TMPDIR", "/tmp"), f"health-{srv.port}.txt"))
    time.sleep(0.3)
    r = raw(srv.port, post(body), timeout=120)
    lat = probe.stop()
    assert r[0][0] == 400 and "noise" in json.loads(r[0][2])["error"], r[0]
    hwm1, rss1 = rss_kib(pid, "VmHWM"), rss_kib(pid, "VmRSS")
    # the body (30 MiB) + the numbers as doubles (120 MiB) at most, not a tree (1.2 GB); under
    # ASan every block carries redzones and freed ones wait in its quarantine (256 MiB), so
    # there the bound is looser and memory is not expected back at once
    sanitized = os.environ.get("MOLMOACT_SANITIZED") in ("1", "ON", "TRUE")
    assert hwm1 - max(hwm0, rss0) < (640 if sanitized else 220) * 1024, (hwm0, hwm1)
    if not sanitized:
        assert rss1 - rss0 < 48 * 1024, (rss0, rss1)  # given back
    assert len(lat) > 3 and max(lat) < 1.0, lat  # parsed off the network loop


def test_json_over_its_budget_refused_by_name(srv):
    body = b'{"x": [' + b"{}," * 2000000 + b"{}]}"  # 6 MB of empty objects: nodes, not numbers
    r = raw(srv.port, post(body))
    assert r[0][0] == 400 and "MiB" in json.loads(r[0][2])["error"], r[0]


# ---------------------------------------------------------------------------------- E4, E20: drain

def test_sigterm_answers_every_queued_http_reply(noise):
    s = Server("tiny-grid")
    want = cli_actions_for(noise)
    socks = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(4)]
    for c in socks:
        c.sendall(post(http_body(noise)))
    time.sleep(0.05)
    s.p.send_signal(signal.SIGTERM)
    for c in socks:
        r, _ = read_responses(c, 1)
        assert r and r[0][0] == 200, r
        assert np.array_equal(actions_of(json.loads(r[0][2])), want)
        c.close()
    assert s.p.wait(timeout=60) == 0
    s.log.close()


_want = {}


def cli_actions_for(nz):
    if "a" not in _want:
        d = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"noise-{os.getpid()}.npy")
        np.save(d, nz)
        _want["a"] = cli_actions("tiny-grid", d)
        os.unlink(d)
    return _want["a"]


def test_sigterm_in_flight_websocket_gets_reply_then_1001():
    s = Server("tiny-grid")
    got = {}

    async def go():
        async with websockets.connect(s.uri, compression=None) as ws:
            await ws.recv()
            await ws.send(oc.packb(observation()))
            await asyncio.sleep(0.02)
            s.p.send_signal(signal.SIGTERM)
            got["reply"] = oc.unpackb(await ws.recv())
            try:
                await asyncio.wait_for(ws.recv(), 20)
            except websockets.ConnectionClosed as e:
                got["code"] = e.rcvd.code if e.rcvd else None
    asyncio.run(go())
    assert got["reply"]["actions"].shape == (10, 7) and got["code"] == 1001, got
    assert s.p.wait(timeout=60) == 0
    s.log.close()


# ---------------------------------------------------------------------------------- E6: pipelining

def test_pipelined_requests_answered_in_order(srv, noise):
    want = cli_actions_for(noise)
    body = http_body(noise)
    r = raw(srv.port, post(body) + post(b"{not json") + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" + post(body), n=4)
    assert [x[0] for x in r] == [200, 400, 200, 200], [x[0] for x in r]
    assert np.array_equal(actions_of(json.loads(r[0][2])), want)
    assert np.array_equal(actions_of(json.loads(r[3][2])), want)
    assert r[2][2] == b"OK"


def test_chunked_and_expect_continue(srv, noise):
    want = cli_actions_for(noise)
    body = http_body(noise)
    chunks = b"".join(b"%x\r\n" % len(body[i:i + 1000]) + body[i:i + 1000] + b"\r\n" for i in range(0, len(body), 1000))
    req = b"POST /act HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
    r = raw(srv.port, req)
    assert r[0][0] == 200 and np.array_equal(actions_of(json.loads(r[0][2])), want)
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
    s.sendall(post(b"", extra=b"Expect: 100-continue\r\n").replace(b"Content-Length: 0", b"Content-Length: %d" % len(body)))
    assert s.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
    s.sendall(body)
    r, _ = read_responses(s, 1)
    assert r[0][0] == 200
    s.close()


# ---------------------------------------------------------------------------------- E8: addresses

@pytest.mark.parametrize("host,needle", [("203.0.113.7", "not an address of this machine"), ("no-such-host.invalid", "cannot resolve")])
def test_bad_host_fails_at_once(host, needle):
    t0 = time.time()
    p = subprocess.run([BIN, "serve", "--model", model("tiny-grid"), "--host", host, "--port", "0"], capture_output=True, timeout=60)
    assert p.returncode != 0 and needle in p.stderr.decode() and host in p.stderr.decode(), p.stderr.decode()
    assert "listening" not in p.stderr.decode() and time.time() - t0 < 30


def first_json_line(p):
    """the first JSON line of a server's stderr (the workers' start comes before it as progress lines)"""
    for line in p.stderr:
        if line.startswith(b"{"):
            return json.loads(line)
    raise AssertionError("no JSON line on stderr")


def test_port_zero_logs_the_bound_port():
    p = subprocess.Popen([BIN, "serve", "--model", model("tiny-grid"), "--port", "0"], stderr=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        line = first_json_line(p)
        assert line["event"] == "listening" and line["port"] > 0
        assert curl(f"http://127.0.0.1:{line['port']}/healthz") == (200, "OK")
        # and a line for a person on stdout, with the URLs to give a client (waited for, not hung on)
        import select
        assert select.select([p.stdout], [], [], 30)[0], "no line on stdout within 30 s"
        human = p.stdout.readline().decode()
        port = line["port"]
        assert human.startswith("molmoact serve: tiny-grid (grid, resident) on ") and f"http://127.0.0.1:{port}/" in human, human
        assert f"ws://127.0.0.1:{port} " in human and "Ctrl-C stops" in human, human
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 0


# ---------------------------------------------------------------------------------- E10: escaping

def test_hostile_model_name_is_escaped(tmp_path):
    import shutil
    name = '<img src=x onerror="document.title=\'pwned\'">"\\'
    d = tmp_path / name
    shutil.copytree(model("tiny-grid"), d)
    p = subprocess.Popen([BIN, "serve", "--model", str(d), "--port", "0"], stderr=subprocess.PIPE)
    try:
        line = first_json_line(p)  # the log line is valid JSON
        assert line["model"] == name
        port = line["port"]
        code, body = curl(f"http://127.0.0.1:{port}/health")
        assert code == 200 and json.loads(body)["model"] == name
        hdr = subprocess.run(["curl", "-s", "-D", "-", "-o", "/dev/null", f"http://127.0.0.1:{port}/"], capture_output=True).stdout.decode()
        assert "content-security-policy: default-src 'none'" in hdr.lower() and "x-content-type-options: nosniff" in hdr.lower()
        chromium = shutil.which("chromium")
        dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=4000", "--dump-dom",
                              f"http://127.0.0.1:{port}/"], capture_output=True, timeout=120).stdout.decode()
        assert "requests served" in dom  # the script ran
        assert "<img" not in dom and "pwned" not in dom.split("<title>")[1].split("</title>")[0]
        assert "&lt;img src=x" in dom  # shown as text
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 0


# ---------------------------------------------------------------------------------- E11, E12, E15, E16: strict requests

def test_noise_shape_checked(srv):
    for nz in (np.zeros(320, np.float32), np.zeros((1, 32, 10), np.float32), np.zeros((2, 10, 32), np.float32)):
        kind, msg, code = fault(srv.uri, oc.packb(observation(nz)))
        assert kind == "error" and "noise: shape" in msg and "[1, 10, 32]" in msg, msg
    kind, out = fault(srv.uri, oc.packb(observation(np.zeros((10, 32), np.float32))))  # documented: [10, 32] too
    assert kind == "reply"


def test_nul_in_task_and_trailing_bytes_refused(srv):
    body = http_body()
    for b, needle in ((body.replace(PROMPT.encode(), b"put it\\u0000 away"), "NUL"),
                      (body + b" {}", "after the JSON value"), (body + body, "after the JSON value"),
                      (body.replace(b'"instruction"', b'"instruction\\u0000x"'), "NUL")):
        r = raw(srv.port, post(b))
        assert r[0][0] == 400 and needle in json.loads(r[0][2])["error"], r[0]


def test_methods_head_and_limits(srv):
    r = raw(srv.port, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", n=2)
    assert r[0][0] == 200 and r[0][1]["content-length"] == "2" and r[1][2] == b"OK"  # HEAD: no body
    for m in ("OPTIONS", "PUT", "PATCH", "DELETE"):
        r = raw(srv.port, f"{m} /act HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode())
        assert r[0][0] == 405 and "POST" in r[0][1]["allow"], (m, r)
    r = raw(srv.port, b"POST /act HTTP/1.1\r\nHost: x\r\n\r\n")
    assert r[0][0] == 411
    for v in ("1e-9", "0", "-1", "nan"):
        p = subprocess.run([BIN, "serve", "--model", model("tiny-grid"), "--max-message-mb", v], capture_output=True, timeout=30)
        assert p.returncode != 0 and "max-message-mb" in p.stderr.decode()


def test_messages_say_what_is_wrong(srv):
    body = json.loads(http_body())
    cases = [
        (dict(body, image={"__numpy__": "@@@@", "dtype": "|u1", "shape": [1, 1, 3]}), "not base64 (character 0 is '@')"),
        (dict(body, state=[0, 0, 1e39, 0, 0, 0, 0, 0]), "beyond float32's range"),
        (dict(body, noise=[0.0] * 320), "noise: shape [320]"),
        (dict(body, image="not/base64!"), "not base64"),
    ]
    for req, needle in cases:
        r = raw(srv.port, post(json.dumps(req).encode()))
        assert r[0][0] == 400 and needle in json.loads(r[0][2])["error"], (needle, r[0][2])
    code, body = curl(f"{srv.http}/nope")
    assert code == 404 and "GET /healthz, /health, /act, /, /status.json, /metrics; POST /act" in json.loads(body)["error"]


# ---------------------------------------------------------------------------------- E14: no paths

def test_no_path_reaches_a_client(tmp_path):
    """a context truncated under a running server: the client learns a request failed and which
    worker, never a file name or path (relative or absolute)"""
    import shutil
    ctx = tmp_path / "secret-dir-name"
    p = subprocess.run([BIN, "compile", model("tiny-grid"), "-o", str(ctx)], capture_output=True, timeout=300)
    assert p.returncode == 0, p.stderr.decode()
    rel = os.path.relpath(ctx)
    s2 = ServerAt(rel, "--inproc")
    try:
        with open(ctx / "action_step.gguf", "r+b") as f:
            f.truncate(4096)
        kind, msg, code = fault(s2.uri, oc.packb(observation()))
        assert kind == "error" and "secret-dir-name" not in msg and ".gguf" not in msg and "/" not in msg.replace("observation/", ""), msg
        assert "server log" in msg
        assert "action_step.gguf" in s2.logs()  # the whole message is in the log
    finally:
        s2.stop()
        shutil.rmtree(ctx, ignore_errors=True)


class ServerAt(Server):
    def __init__(self, model_dir, *args):
        from test_server import free_port
        self.port = free_port()
        self.uri = f"ws://127.0.0.1:{self.port}"
        self.http = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile("w+")  # gone when closed
        self.p = subprocess.Popen([BIN, "serve", "--model", model_dir, "--port", str(self.port), *args],
                                  stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + 120
        while time.time() < deadline:
            assert self.p.poll() is None, self.logs()
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("server did not start: " + self.logs())


# ---------------------------------------------------------------------------------- E19: decoding off the loop

def test_flip180_decoding_does_not_stall_health(tmp_path):
    from PIL import Image
    big = tmp_path / "big.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (4000, 4000, 3), np.uint8)).save(big, compress_level=1)
    data = big.read_bytes()
    s = Server("tiny-grid", "--flip180", "--max-message-mb", "200")
    try:
        probe = HealthProbe(s.http, str(tmp_path / "health.txt"))
        time.sleep(0.3)
        kind, out = fault(s.uri, oc.packb(observation(img0=data, img1=data)))
        lat = probe.stop()
        assert kind == "reply" and out["actions"].shape == (10, 7)
        assert len(lat) > 3 and max(lat) < 1.0, lat
    finally:
        assert s.stop() == 0
