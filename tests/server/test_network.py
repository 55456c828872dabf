# SPDX-License-Identifier: Apache-2.0
"""The network layer of issue 38 over real sockets: the gate enumerated (every path x method x
upgrade x key, then the same from a health-check slot beyond --max-clients), and each budget
reached and named (--max-message-mb, --max-input-mb, --max-queued-mb, --max-output-kb), its use in
/metrics.

    MOLMOACT=build/molmoact /usr/bin/python3 -m pytest -q tests/server/test_network.py"""
import json
import os
import signal
import socket
import struct
import time

import pytest

from test_hardening import http_body, read_responses
from test_hardening3 import SANITIZED, vm, ws_handshake
from test_server import Server, curl

PATHS = ["/healthz", "/health", "/act", "/reset", "/", "/status.json", "/status.js", "/metrics", "/nope"]
METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS"]
KEYS = {"absent": b"", "wrong": b"Authorization: Api-Key nope\r\n", "right": b"Authorization: Api-Key s3cret\r\n"}


def expected(path, method, upgrade, key, reserved):
    """the status the rules of docs/SERVER.md ("Who may ask what") give, restated here"""
    plain_health = path in ("/healthz", "/health") and method in ("GET", "HEAD") and not upgrade
    if plain_health:
        return 200
    if reserved:
        return 503
    if key != "right":
        return 401
    if upgrade and method == "GET":
        return 101
    gets = {"/", "/status.json", "/status.js", "/metrics", "/act", "/healthz", "/health"}
    if path == "/act" and method == "POST":
        return 400  # an empty body (Content-Length: 0)
    if path == "/reset":
        return 200 if method == "POST" else 405
    if path in gets:
        return 200 if method in ("GET", "HEAD") else 405
    return 404


def status_of(port, path, method, upgrade, key):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    req = f"{method} {path} HTTP/1.1\r\nHost: x\r\n".encode() + KEYS[key]
    if upgrade:
        req += b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    if method not in ("GET", "HEAD"):
        req += b"Content-Length: 0\r\n"
    s.sendall(req + b"\r\n")
    buf = b""
    while b"\r\n" not in buf:
        d = s.recv(4096)
        if not d:
            break
        buf += d
    s.close()
    return int(buf.split(b" ")[1]) if buf else None


def test_gate_every_path_method_upgrade_key_and_slot(tmp_path):
    kf = tmp_path / "key"
    kf.write_text("s3cret\n")
    s = Server("tiny-grid", "--api-key-file", str(kf), "--max-clients", "2", "--idle-timeout-s", "0")
    try:
        time.sleep(0.3)  # the start-up probe's connection is gone
        wrong = []
        for reserved in (False, True):
            held = []
            if reserved:  # two websockets take both slots: the next connection gets a health-check slot
                for _ in range(2):
                    c, st = ws_handshake(s.port, "/", KEYS["right"])
                    assert st == 101
                    held.append(c)
                time.sleep(0.2)
            n = 0
            for path in PATHS:
                for method in METHODS:
                    for upgrade in (False, True):
                        for key in KEYS:
                            if reserved and (upgrade or method in ("PUT", "DELETE", "OPTIONS")) and key != "right":
                                continue  # the slot refuses before the key: the right key's case covers these
                            got = status_of(s.port, path, method, upgrade, key)
                            want = expected(path, method, upgrade, key, reserved)
                            n += 1
                            if got != want:
                                wrong.append((path, method, upgrade, key, reserved, got, want))
                            if got == 101:
                                time.sleep(0.05)  # the closed websocket's slot comes back
            assert n >= (324 if not reserved else 150), n
            for c in held:
                c.close()
            time.sleep(0.3)
        assert not wrong, wrong[:10]
    finally:
        assert s.stop() == 0


def metric(port, name, budget):
    code, text = curl(f"http://127.0.0.1:{port}/metrics")
    assert code == 200
    for line in text.splitlines():
        if line.startswith(name + "{") and f'budget="{budget}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise KeyError((name, budget))


def head(length, extra=b""):
    return (f"POST /act HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n".encode() + extra + b"\r\n")


def test_budgets_named_and_counted():
    s = Server("tiny-grid", "--max-message-mb", "1", "--max-input-mb", "2", "--max-queued-mb", "1", "--recv-timeout-s", "20")
    try:
        assert metric(s.port, "molmoact_budget_limit_bytes", "input") == 2 * 1048576
        # the message: a declared length over it is refused before any byte is read
        c = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        c.sendall(head(2 * 1048576))
        r, _ = read_responses(c, 1)
        assert r[0][0] == 413 and "--max-message-mb 1" in json.loads(r[0][2])["error"], r
        c.close()
        # the input: two bodies of 1000000 bytes held back before their end hold 2 x 1 MiB (the
        # buffers grow as bytes arrive); a third is refused when its buffer would grow past it
        held = []
        for _ in range(2):
            c = socket.create_connection(("127.0.0.1", s.port), timeout=30)
            c.sendall(head(1000000) + b"{" + b" " * 999000)
            held.append(c)
        time.sleep(0.5)
        assert metric(s.port, "molmoact_budget_used_bytes", "input") >= 1.9 * 1048576
        c = socket.create_connection(("127.0.0.1", s.port), timeout=30)
        c.sendall(head(1000000) + b"{" + b" " * 999998 + b"}")
        r, _ = read_responses(c, 1)
        assert r[0][0] == 503 and "--max-input-mb 2" in json.loads(r[0][2])["error"], r
        c.close()
        assert metric(s.port, "molmoact_budget_refusals_total", "input") >= 1
        for c in held:
            c.close()
        time.sleep(0.5)
        assert metric(s.port, "molmoact_budget_used_bytes", "input") == 0  # given back
        # queued: the inference thread held (a worker stopped), one body of 600 kB queued holds
        # its 1 MiB buffer; the next is refused by name
        vision = s.worker(1)
        os.kill(vision, signal.SIGSTOP)
        try:
            good = http_body(padding="x" * 600000)  # an observation: it waits in the engine
            first = socket.create_connection(("127.0.0.1", s.port), timeout=60)
            first.sendall(head(len(good)) + good)
            body = b"{" + b" " * 599998 + b"}"
            time.sleep(0.5)
            c = socket.create_connection(("127.0.0.1", s.port), timeout=60)
            c.sendall(head(len(body)) + body)
            r, _ = read_responses(c, 1)
            assert r[0][0] == 503 and "--max-queued-mb 1" in json.loads(r[0][2])["error"], r
            c.close()
            assert metric(s.port, "molmoact_budget_used_bytes", "queued") >= 600000
        finally:
            os.kill(vision, signal.SIGCONT)
        r, _ = read_responses(first, 1, 60)
        assert r[0][0] == 200  # answered once the engine was back
        first.close()
        time.sleep(0.3)
        assert metric(s.port, "molmoact_budget_used_bytes", "queued") == 0
    finally:
        assert s.stop() == 0


def test_output_budget_stops_reading_a_websocket_that_reads_nothing():
    """pings whose pongs are never read: past --max-output-kb the server stops reading the client,
    so what it holds stays bounded; other clients are answered meanwhile"""
    s = Server("tiny-grid", "--max-output-kb", "64", "--recv-timeout-s", "4", "--idle-timeout-s", "0")
    try:
        c, st = ws_handshake(s.port)
        assert st == 101
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        c.settimeout(0.5)
        ping = bytes([0x89, 0x80 | 125]) + b"\x01\x02\x03\x04" + bytes(125)
        base = vm(s.p.pid, "VmRSS")
        sent, t0 = 0, time.time()
        while time.time() - t0 < 5 and sent < (64 << 20):
            try:
                sent += c.send(ping * 512)
            except (socket.timeout, BlockingIOError):
                break  # the server stopped reading
            except OSError:
                break  # dropped: it read nothing for --recv-timeout-s
        grown = vm(s.p.pid, "VmRSS") - base
        assert SANITIZED or grown < 32 * 1024, (grown, sent)
        assert sent < (64 << 20), sent
        # the limit, plus the pongs of one read (4 KiB of pings: 30 pongs of 125 bytes and their overhead)
        assert metric(s.port, "molmoact_budget_peak_bytes", "output") <= 64 * 1024 + 16 * 1024
        assert curl(f"{s.http}/healthz") == (200, "OK")
        c.close()
    finally:
        assert s.stop() == 0


def test_a_frame_header_claiming_2_to_63_is_a_protocol_error(tmp_path):
    s = Server("tiny-grid")
    try:
        c, st = ws_handshake(s.port)
        c.sendall(bytes([0x82, 0xff]) + struct.pack(">Q", 1 << 63) + b"\x01\x02\x03\x04")
        c.settimeout(5)
        data = b""
        try:
            while True:
                d = c.recv(4096)
                if not d:
                    break
                data += d
        except (socket.timeout, ConnectionResetError):
            pass
        assert b"\x88" in data  # a close frame (1002)
        assert curl(f"{s.http}/healthz") == (200, "OK")
    finally:
        assert s.stop() == 0


# ---------------------------------------------------------------- the review's findings (issue 38)

def frame(payload, opcode=2, fin=True, masked=True):
    n = len(payload)
    h = bytes([(0x80 if fin else 0) | opcode])
    m = 0x80 if masked else 0
    if n < 126:
        h += bytes([m | n])
    elif n < 65536:
        h += bytes([m | 126]) + struct.pack(">H", n)
    else:
        h += bytes([m | 127]) + struct.pack(">Q", n)
    if not masked:
        return h + payload
    key = b"\x0a\x0b\x0c\x0d"
    return h + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def read_until_eof(sock, seconds):
    sock.settimeout(0.5)
    data, t0 = b"", time.time()
    while time.time() - t0 < seconds:
        try:
            d = sock.recv(65536)
        except socket.timeout:
            continue
        except ConnectionResetError:
            return data, True
        if not d:
            return data, True
        data += d
    return data, False


def binary_replies(data):
    """the payloads of the unmasked binary frames in data"""
    out, i = [], 0
    while i + 2 <= len(data):
        op, n = data[i] & 15, data[i + 1] & 127
        i += 2
        if n == 126:
            n = struct.unpack(">H", data[i:i + 2])[0]
            i += 2
        elif n == 127:
            n = struct.unpack(">Q", data[i:i + 8])[0]
            i += 8
        if i + n > len(data):
            break
        if op == 2:
            out.append(data[i:i + n])
        i += n
    return out


def test_empty_pings_never_read_cost_bounded_memory():
    """each queued pong costs wslay memory beyond its payload: empty pings count too"""
    s = Server("tiny-grid", "--max-output-kb", "64", "--recv-timeout-s", "4", "--idle-timeout-s", "0")
    try:
        c, st = ws_handshake(s.port)
        assert st == 101
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        c.settimeout(0.5)
        pings = frame(b"", opcode=9) * 50000
        base = vm(s.p.pid, "VmRSS")
        sent, t0 = 0, time.time()
        while time.time() - t0 < 6 and sent < (256 << 20):
            try:
                sent += c.send(pings)
            except (socket.timeout, BlockingIOError):
                break
            except OSError:
                break
        grown = vm(s.p.pid, "VmRSS") - base
        assert SANITIZED or grown < 32 * 1024, (grown, sent)  # before the fix: about 16 bytes per byte sent
        assert curl(f"{s.http}/healthz") == (200, "OK")
        c.close()
    finally:
        assert s.stop() == 0


def test_a_frame_wslay_refuses_after_a_ping_closes_the_connection():
    """a ping, then an unmasked frame, in one packet: the server closes (before: held forever
    with --idle-timeout-s 0)"""
    s = Server("tiny-grid", "--recv-timeout-s", "2", "--idle-timeout-s", "0")
    try:
        c, st = ws_handshake(s.port)
        assert st == 101
        c.sendall(frame(b"", opcode=9) + frame(b"abc", masked=False))
        data, eof = read_until_eof(c, 12)
        assert eof and b"\x88" in data, data[-40:]
        c.close()
        assert metric(s.port, "molmoact_budget_refusals_total", "input") == 0
        code, text = curl(f"{s.http}/metrics")
        assert 'molmoact_request_failures_total{reason="protocol"} 1' in text, [l for l in text.splitlines() if "protocol" in l]
    finally:
        assert s.stop() == 0


def test_a_ping_between_fragments_is_not_part_of_the_message():
    from test_server import observation, oc
    s = Server("tiny-grid")
    try:
        # the frames are parsed from the first byte after the handshake's head: a read that brought
        # the head and the metadata frame's first bytes together had lost them, and the parse
        # then never found the reply (a flake in about 1 run of 20, 2026-12-07)
        c, st, data = ws_handshake(s.port, with_rest=True)
        msg = oc.packb(observation())
        half = len(msg) // 2
        c.sendall(frame(msg[:half], fin=False) + frame(b"ping!", opcode=9) + frame(msg[half:], opcode=0))
        c.settimeout(30)
        try:
            while not [r for r in binary_replies(data) if "actions" in oc.unpackb(r)]:  # (the metadata may come first)
                d = c.recv(65536)
                assert d
                data += d
        except (TimeoutError, socket.timeout) as e:  # a rare timeout seen once (2026-12-07): keep what it tells
            raise AssertionError(f"no reply within 30 s ({len(data)} bytes received: {data[:64]!r} ... {data[-48:]!r}); "
                                 f"the server's log:\n{s.logs()}") from e
        reply = [oc.unpackb(r) for r in binary_replies(data) if "actions" in oc.unpackb(r)][0]
        assert reply["actions"].shape == (10, 7)
        c.close()
    finally:
        assert s.stop() == 0


def test_a_message_sent_with_the_upgrade_is_answered():
    from test_server import observation, oc
    s = Server("tiny-grid")
    try:
        c = socket.create_connection(("127.0.0.1", s.port), timeout=30)
        c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                  b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n" + frame(oc.packb(observation())))
        data = b""
        while True:
            d = c.recv(65536)
            assert d
            data += d
            if b"\r\n\r\n" in data and len(binary_replies(data.split(b"\r\n\r\n", 1)[1])) >= 2:
                break  # the metadata, then the reply
        reply = oc.unpackb(binary_replies(data.split(b"\r\n\r\n", 1)[1])[1])
        assert reply["actions"].shape == (10, 7)
        c.close()
    finally:
        assert s.stop() == 0
