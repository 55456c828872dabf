#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Soak test of `molmoact serve`, over the network only (so it works against any version of the
server):

    scripts/soak_server.py --bin build/molmoact --minutes 10 --clients 64 [--json samples.json]

Starts the server (tiny-grid model, --recv-timeout-s 5, --idle-timeout-s 20 by default), then
keeps --clients connections busy with a random mix of traffic for --minutes:
  valid      ws_infer (openpi websocket: metadata, then 1-4 observations on one connection),
             http_act (POST /act JSON, 1-3 on one keep-alive connection), healthz_burst (2-32
             pipelined GET /healthz in one write, 1-3 bursts)
  malformed  slow (a byte a second: headers, HTTP body, websocket message), oversized (a
             Content-Length above --max-message-mb; a websocket message above it, in one frame
             or fragments), garbage bytes, bad chunked framing, bad JSON, bad websocket frames
             (unmasked, RSV bits, unknown opcode, long or fragmented control frames, a stray
             continuation, bad UTF-8), bad msgpack
  rude       disconnect mid-request (HTTP and websocket, before and after the whole request was
             sent, some with a reset), never read the replies (pipelined requests or observations
             with a small receive buffer, held past --recv-timeout-s)
Every valid request must get a valid reply within --valid-deadline-s; every malformed one an error
(HTTP >= 400, a websocket close or text frame) or a close within --recv-timeout-s + --slack-s,
never a success and never silence. Every --sample-s: the server's VmRSS (its main process, and
with its worker processes), open fds, CPU seconds, and /metrics.
At the end: per-kind counts, and PASS/FAIL on: RSS flat (the last sample under load at most 10 %
+ 8 MiB above the sample after --warmup-s, for the main process and for the total), fds back to
the count before the load once the clients are gone, every valid request answered, no malformed
request accepted or left hanging, the server still healthy, and exit status 0 on SIGTERM."""
import argparse
import asyncio
import base64
import json
import math
import os
import random
import re
import resource
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

import msgpack
import numpy as np

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
PROMPT = "put both the alphabet soup and the tomato sauce in the basket"
STATE = np.array([0.02, -0.05, 0.9, 3.1, -0.1, 0.05, 0.03, -0.03])  # float64, as LIBERO's example sends it
HOST = "127.0.0.1"

VALID = ("ws_infer", "http_act", "healthz_burst")
MALFORMED = ("slow", "oversized_http", "oversized_ws", "garbage", "bad_chunked", "bad_json", "bad_ws_frame", "bad_msgpack")
RUDE = ("disconnect_mid", "never_read")
MIX = {"ws_infer": 22, "http_act": 14, "healthz_burst": 14, "slow": 5, "oversized_http": 4, "oversized_ws": 4, "garbage": 5,
       "bad_chunked": 4, "bad_json": 3, "bad_ws_frame": 6, "bad_msgpack": 5, "disconnect_mid": 8, "never_read": 3}


# ------------------------------------------------------------------------------------ requests

def pack_array(obj):  # openpi_client/msgpack_numpy.py's encoding: bytes keys, numpy dtype strings
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": obj.shape}
    return obj


def json_numpy(a):
    a = np.ascontiguousarray(a)
    return {"__numpy__": base64.b64encode(a.tobytes()).decode(), "dtype": a.dtype.str, "shape": list(a.shape)}


def ws_frame(payload, opcode=2, fin=True, rsv=0, mask=True, length=None):
    """a client frame; `length` overrides the length field (for frames whose payload is not sent)"""
    n = len(payload) if length is None else length
    b0 = (0x80 if fin else 0) | (rsv << 4) | opcode
    mbit = 0x80 if mask else 0
    if n < 126:
        head = bytes([b0, mbit | n])
    elif n < 65536:
        head = bytes([b0, mbit | 126]) + struct.pack(">H", n)
    else:
        head = bytes([b0, mbit | 127]) + struct.pack(">Q", n)
    if not mask:
        return head + payload
    key = os.urandom(4)
    if payload:
        k = np.frombuffer(key * (len(payload) // 4 + 1), np.uint8)[:len(payload)]
        payload = (np.frombuffer(payload, np.uint8) ^ k).tobytes()
    return head + key + payload


class Reqs:
    """the valid requests, packed once"""

    def __init__(self, size, max_bytes):
        rng = np.random.default_rng(3)
        a = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        b = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        self.obs = msgpack.packb({"observation/image": a, "observation/wrist_image": b, "observation/state": STATE,
                                  "prompt": PROMPT}, default=pack_array)
        self.obs_frames = [ws_frame(self.obs) for _ in range(4)]  # a few masking keys
        body = json.dumps({"image": json_numpy(a), "wrist_image": json_numpy(b), "state": json_numpy(STATE),
                           "instruction": PROMPT}).encode()
        self.act_body = body
        self.act = post(body)
        self.max_bytes = max_bytes


def post(body, path="/act", extra=""):
    return (f"POST {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"{extra}\r\n").encode() + body


HEALTHZ = f"GET /healthz HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode()


# ------------------------------------------------------------------------------------ the protocol

class Closed(Exception):
    pass


async def read_http(reader):
    """one response: (status, headers, body); Closed on EOF or reset"""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        hdr = {}
        for l in lines[1:]:
            if ":" in l:
                k, v = l.split(":", 1)
                hdr[k.strip().lower()] = v.strip()
        body = await reader.readexactly(int(hdr.get("content-length", "0")))
    except (asyncio.IncompleteReadError, ConnectionError) as e:
        raise Closed(repr(e)) from None
    if status == 100:
        return await read_http(reader)
    return status, hdr, body


async def read_frame(reader):
    """one server frame: (opcode, payload); Closed on EOF or reset"""
    try:
        h = await reader.readexactly(2)
        n = h[1] & 0x7F
        if n == 126:
            n = struct.unpack(">H", await reader.readexactly(2))[0]
        elif n == 127:
            n = struct.unpack(">Q", await reader.readexactly(8))[0]
        if h[1] & 0x80:
            await reader.readexactly(4)  # a server must not mask; read it anyway
        return h[0] & 0x0F, await reader.readexactly(n)
    except (asyncio.IncompleteReadError, ConnectionError) as e:
        raise Closed(repr(e)) from None


async def connect(port, rcvbuf=None):
    if rcvbuf is None:
        return await asyncio.open_connection(HOST, port, limit=1 << 24)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.setblocking(False)
    await asyncio.get_running_loop().sock_connect(s, (HOST, port))
    return await asyncio.open_connection(sock=s, limit=1 << 24)


async def ws_open(port, rcvbuf=None):
    """a websocket after its metadata frame: (reader, writer, metadata)"""
    r, w = await connect(port, rcvbuf)
    key = base64.b64encode(os.urandom(16)).decode()
    w.write(f"GET / HTTP/1.1\r\nHost: {HOST}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            f"Sec-WebSocket-Version: 13\r\n\r\n".encode())
    try:
        head = await r.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError) as e:
        w.close()
        raise Closed(repr(e)) from None
    if not head.startswith(b"HTTP/1.1 101"):
        w.close()
        raise Closed(f"upgrade refused: {head[:60]!r}")
    op, meta = await read_frame(r)
    if op != 2:
        w.close()
        raise Closed(f"first frame opcode {op}, not binary metadata")
    return r, w, msgpack.unpackb(meta)


def abort(w, reset=False):
    try:
        if reset:
            s = w.get_extra_info("socket")
            if s is not None:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        w.close()
    except OSError:
        pass


# ------------------------------------------------------------------------------------ the soak

class Soak:
    def __init__(self, a, reqs, port, shape):
        self.a, self.reqs, self.port, self.shape = a, reqs, port, shape
        self.counts = {}  # kind -> outcome -> n
        self.lat = {k: [] for k in VALID}
        self.why = {}  # kind -> [first few reasons for a bad outcome]
        self.stop = False
        self.bad_deadline = a.recv_timeout_s + a.slack_s

    def count(self, kind, outcome, why=None):
        d = self.counts.setdefault(kind, {})
        d[outcome] = d.get(outcome, 0) + 1
        if why is not None and outcome not in ("answered", "error_reply", "closed", "done", "server_dropped", "still_open"):
            w = self.why.setdefault(kind, [])
            if len(w) < 8:
                w.append(f"{outcome}: {why}"[:300])

    # ---- checks
    def ws_reply_ok(self, op, payload):
        if op != 2:
            return f"opcode {op}: {payload[:200]!r}"
        try:
            m = msgpack.unpackb(payload)
            a = m["actions"]
            if a[b"dtype"] != "<f4" or tuple(a[b"shape"]) != self.shape or len(a[b"data"]) != 4 * self.shape[0] * self.shape[1]:
                return f"actions {a[b'dtype']} {a[b'shape']}"
        except Exception as e:  # noqa: BLE001 - a bad reply, reported
            return f"reply not understood: {e!r}"
        return None

    def act_reply_ok(self, status, body):
        if status != 200:
            return f"HTTP {status}: {body[:200]!r}"
        try:
            a = json.loads(body)["actions"]
            n = len(base64.b64decode(a["__numpy__"]))
            if a["dtype"] != "<f4" or tuple(a["shape"]) != self.shape or n != 4 * self.shape[0] * self.shape[1]:
                return f"actions {a['dtype']} {a['shape']}"
        except Exception as e:  # noqa: BLE001
            return f"reply not understood: {e!r}"
        return None

    # ---- valid traffic
    async def ws_infer(self, rng):
        n = rng.randint(1, 4)
        try:
            r, w, _ = await asyncio.wait_for(ws_open(self.port), self.a.valid_deadline_s)
        except (Closed, OSError, asyncio.TimeoutError) as e:
            for _ in range(n):
                self.count("ws_infer", "unanswered", f"connect: {e!r}")
            return
        try:
            for i in range(n):
                t0 = time.monotonic()
                w.write(rng.choice(self.reqs.obs_frames))
                try:
                    op, payload = await asyncio.wait_for(read_frame(r), self.a.valid_deadline_s)
                except (Closed, OSError, asyncio.TimeoutError) as e:
                    for _ in range(n - i):
                        self.count("ws_infer", "unanswered", repr(e))
                    return
                bad = self.ws_reply_ok(op, payload)
                if bad:
                    self.count("ws_infer", "unanswered", bad)
                else:
                    self.count("ws_infer", "answered")
                    self.lat["ws_infer"].append(time.monotonic() - t0)
            w.write(ws_frame(struct.pack(">H", 1000), opcode=8))
            await asyncio.sleep(0)
        finally:
            abort(w)

    async def http_act(self, rng):
        n = rng.randint(1, 3)
        try:
            r, w = await asyncio.wait_for(connect(self.port), self.a.valid_deadline_s)
        except (OSError, asyncio.TimeoutError) as e:
            for _ in range(n):
                self.count("http_act", "unanswered", f"connect: {e!r}")
            return
        try:
            for i in range(n):
                t0 = time.monotonic()
                w.write(self.reqs.act)
                try:
                    status, _, body = await asyncio.wait_for(read_http(r), self.a.valid_deadline_s)
                except (Closed, OSError, asyncio.TimeoutError) as e:
                    for _ in range(n - i):
                        self.count("http_act", "unanswered", repr(e))
                    return
                bad = self.act_reply_ok(status, body)
                if bad:
                    self.count("http_act", "unanswered", bad)
                else:
                    self.count("http_act", "answered")
                    self.lat["http_act"].append(time.monotonic() - t0)
        finally:
            abort(w)

    async def healthz_burst(self, rng):
        try:
            r, w = await asyncio.wait_for(connect(self.port), self.a.valid_deadline_s)
        except (OSError, asyncio.TimeoutError) as e:
            self.count("healthz_burst", "unanswered", f"connect: {e!r}")
            return
        try:
            for _ in range(rng.randint(1, 3)):
                k = rng.randint(2, 32)
                t0 = time.monotonic()
                w.write(HEALTHZ * k)
                for i in range(k):
                    try:
                        status, _, body = await asyncio.wait_for(read_http(r), self.a.valid_deadline_s)
                    except (Closed, OSError, asyncio.TimeoutError) as e:
                        for _ in range(k - i):
                            self.count("healthz_burst", "unanswered", repr(e))
                        return
                    if status == 200 and body == b"OK":
                        self.count("healthz_burst", "answered")
                    else:
                        self.count("healthz_burst", "unanswered", f"HTTP {status} {body[:100]!r}")
                self.lat["healthz_burst"].append(time.monotonic() - t0)
        finally:
            abort(w)

    # ---- malformed traffic: an error or a close within the deadline
    async def expect_http_refusal(self, kind, r, w, t_end, drip=None):
        """the reply to a malformed HTTP request; `drip`: bytes to send one a second meanwhile"""
        async def dripper():
            for i in range(len(drip)):
                await asyncio.sleep(1.0)
                w.write(drip[i:i + 1])
                await w.drain()
        task = asyncio.ensure_future(dripper()) if drip else None
        try:
            status, _, body = await asyncio.wait_for(read_http(r), max(0.1, t_end - time.monotonic()))
            if status >= 400:
                self.count(kind, "error_reply")
            else:
                self.count(kind, "accepted", f"HTTP {status} {body[:100]!r}")
        except (Closed, ConnectionError):
            self.count(kind, "closed")
        except asyncio.TimeoutError:
            self.count(kind, "hung", f"no reply or close in {self.bad_deadline} s")
        finally:
            if task:
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, OSError):
                    pass
            abort(w)

    async def expect_ws_refusal(self, kind, r, w, t_end, drip=None):
        async def dripper():
            for i in range(len(drip)):
                await asyncio.sleep(1.0)
                w.write(drip[i:i + 1])
                await w.drain()
        task = asyncio.ensure_future(dripper()) if drip else None
        try:
            op, payload = await asyncio.wait_for(read_frame(r), max(0.1, t_end - time.monotonic()))
            if op == 8:
                self.count(kind, "closed")
            elif op == 1 or (op == 2 and self.ws_reply_ok(op, payload)):
                self.count(kind, "error_reply")
            else:
                self.count(kind, "accepted", f"opcode {op} {payload[:100]!r}")
        except (Closed, ConnectionError):
            self.count(kind, "closed")
        except asyncio.TimeoutError:
            self.count(kind, "hung", f"no reply or close in {self.bad_deadline} s")
        finally:
            if task:
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, OSError):
                    pass
            abort(w)

    async def http_malformed(self, kind, data, drip=None):
        t_end = time.monotonic() + self.bad_deadline
        try:
            r, w = await connect(self.port)
            w.write(data)
        except OSError as e:
            self.count(kind, "closed", repr(e))
            return
        await self.expect_http_refusal(kind, r, w, t_end, drip)

    async def ws_malformed(self, kind, data, drip=None):
        try:
            r, w, _ = await asyncio.wait_for(ws_open(self.port), self.a.valid_deadline_s)
        except (Closed, OSError, asyncio.TimeoutError) as e:
            self.count(kind, "no_upgrade", repr(e))
            return
        t_end = time.monotonic() + self.bad_deadline
        try:
            w.write(data)
        except OSError:
            pass
        await self.expect_ws_refusal(kind, r, w, t_end, drip)

    async def slow(self, rng):
        v = rng.randrange(3)
        if v == 0:  # headers a byte a second
            await self.http_malformed("slow", b"G", drip=b"ET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 60 + b"\r\n\r\n")
        elif v == 1:  # a body a byte a second
            head = "POST /act HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n".encode()
            await self.http_malformed("slow", head + b"{", drip=b" " * 100)
        else:  # a websocket message a byte a second
            frame = ws_frame(b"\x80" * 1000)
            await self.ws_malformed("slow", frame[:20], drip=frame[20:120])

    async def oversized_http(self, rng):
        n = self.reqs.max_bytes + 1 + rng.randrange(1 << 20)
        head = f"POST /act HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {n}\r\n\r\n".encode()
        await self.http_malformed("oversized_http", head + b"{" * rng.randrange(0, 65536))

    async def oversized_ws(self, rng):
        n = self.reqs.max_bytes + 1 + rng.randrange(1 << 20)
        chunk = b"\x00" * rng.randrange(0, 65536)
        if rng.randrange(2):  # one frame announcing too much
            data = ws_frame(b"", length=n)[:-4] + b"\0\0\0\0" + chunk  # zero mask key: the chunk goes as it is
        else:  # fragments: a first one, then a continuation that takes the message over the limit
            data = ws_frame(b"\x00" * 1024, fin=False) + ws_frame(b"", opcode=0, length=n - 1024)[:-4] + b"\0\0\0\0" + chunk
        await self.ws_malformed("oversized_ws", data)

    async def garbage(self, rng):
        v = rng.randrange(5)
        if v == 0:
            data = os.urandom(rng.randint(1, 4096))
        elif v == 1:
            data = os.urandom(rng.randint(1, 512)) + b"\r\n\r\n"
        elif v == 2:
            data = b"GET / HTTP/9.9\r\nHost: x\r\n\r\n"
        elif v == 3:
            data = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * rng.randint(70000, 200000) + b"\r\n\r\n"
        else:
            data = b"POST /act HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\n{}{}{}{"
        await self.http_malformed("garbage", data)

    async def bad_chunked(self, rng):
        head = b"POST /act HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        body = rng.choice([b"zz\r\n{}\r\n0\r\n\r\n", b"ffffffffffffffffffff\r\n{}", b"2\r\n{}XX0\r\n\r\n",
                           b"-1\r\n{}\r\n0\r\n\r\n", b"2;" + b"x" * 70000 + b"\r\n{}\r\n0\r\n\r\n", b"1\r\n{\r\n1\r\n}\r\n0\r\nX"])
        await self.http_malformed("bad_chunked", head + body)

    async def bad_json(self, rng):
        body = rng.choice([b"{not json", b"[1,2,3]", b'{"image": 5}', self.reqs.act_body[:len(self.reqs.act_body) // 2],
                           b'{"instruction": "' + b"\xff\xfe" * 8 + b'"}', b"{" * 10000])
        await self.http_malformed("bad_json", post(body))

    async def bad_ws_frame(self, rng):
        data = rng.choice([ws_frame(b"\x80", mask=False), ws_frame(b"\x80", rsv=4), ws_frame(b"\x80", opcode=3),
                           ws_frame(b"x" * 200, opcode=9), ws_frame(b"x", opcode=9, fin=False), ws_frame(b"\x80", opcode=0),
                           ws_frame(b"\x03", opcode=8), ws_frame(b"\xff\xfe", opcode=1), ws_frame(b"", length=1 << 63)[:10]])
        await self.ws_malformed("bad_ws_frame", data)

    async def bad_msgpack(self, rng):
        payload = rng.choice([os.urandom(rng.randint(1, 2048)), msgpack.packb(5), msgpack.packb({"prompt": PROMPT}),
                              msgpack.packb({"observation/image": {b"__ndarray__": True, b"data": b"\0" * 10, b"dtype": "<f8",
                                                                   b"shape": [1000, 1000, 3]}, "prompt": PROMPT}),
                              self.reqs.obs[:len(self.reqs.obs) // 2], b"\xc1"])
        await self.ws_malformed("bad_msgpack", ws_frame(payload))

    # ---- rude clients: nothing is expected of the server but to go on serving the others
    async def disconnect_mid(self, rng):
        v = rng.randrange(4)
        reset = bool(rng.randrange(2))
        try:
            if v < 2:
                r, w = await connect(self.port)
                data = self.reqs.act if v == 1 else self.reqs.act[:rng.randrange(1, len(self.reqs.act))]
            else:
                r, w, _ = await asyncio.wait_for(ws_open(self.port), self.a.valid_deadline_s)
                f = self.reqs.obs_frames[0]
                data = f if v == 3 else f[:rng.randrange(1, len(f))]
            w.write(data)
            await asyncio.wait_for(w.drain(), 10)
            await asyncio.sleep(rng.random() * 0.2)
            abort(w, reset)
            self.count("disconnect_mid", "done")
        except (Closed, OSError, asyncio.TimeoutError) as e:
            self.count("disconnect_mid", "error", repr(e))

    async def never_read(self, rng):
        try:
            if rng.randrange(2):
                r, w = await connect(self.port, rcvbuf=4096)
                w.write(b"".join([f"GET /status.json HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode()] * rng.randint(50, 400)))
            else:
                r, w, _ = await asyncio.wait_for(ws_open(self.port, rcvbuf=4096), self.a.valid_deadline_s)
                w.write(b"".join(self.reqs.obs_frames[:rng.randint(1, 4)]))
        except (Closed, OSError, asyncio.TimeoutError) as e:
            self.count("never_read", "error", repr(e))
            return
        await asyncio.sleep(self.bad_deadline)
        # after the hold: read what is there; an EOF behind it means the server dropped us
        try:
            while True:
                d = await asyncio.wait_for(r.read(1 << 20), 1.0)
                if not d:
                    self.count("never_read", "server_dropped")
                    break
        except asyncio.TimeoutError:
            self.count("never_read", "still_open")
        except ConnectionError:
            self.count("never_read", "server_dropped")
        abort(w)

    async def slot(self, i, t_end):
        rng = random.Random(self.a.seed * 1000003 + i)
        kinds = list(self.a.mix)
        weights = [self.a.mix[k] for k in kinds]
        hard = self.a.valid_deadline_s * 3 + self.bad_deadline + 30
        while not self.stop and time.monotonic() < t_end:
            kind = rng.choices(kinds, weights)[0]
            try:
                await asyncio.wait_for(getattr(self, kind)(rng), hard)
            except asyncio.TimeoutError:
                self.count(kind, "hung", f"the whole exchange took over {hard} s")
            except Exception as e:  # noqa: BLE001 - a bug in this script or an unexpected server reply: counted
                self.count(kind, "client_error", repr(e))


# ------------------------------------------------------------------------------------ the server

def free_port():
    s = socket.socket()
    s.bind((HOST, 0))
    p = s.getsockname()[1]
    s.close()
    return p


def children(pid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except OSError:
                pass
    return out


def proc_rss_kib(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def proc_cpu_s(pid):
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


async def http_get(port, path, timeout=5.0):
    r, w = await asyncio.wait_for(connect(port), timeout)
    try:
        w.write(f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode())
        return await asyncio.wait_for(read_http(r), timeout)
    finally:
        abort(w)


METRIC_KEEP = re.compile(r"^molmoact_(requests_total|request_failures_total|connected_clients|websocket_clients|queue_depth|"
                         r"requests_processing|request_duration_seconds_(sum|count))\b")


async def metrics(port):
    try:
        status, _, body = await http_get(port, "/metrics")
    except (Closed, OSError, asyncio.TimeoutError):
        return None
    if status != 200:
        return None
    out = {}
    for line in body.decode(errors="replace").splitlines():
        if METRIC_KEEP.match(line):
            k, _, v = line.rpartition(" ")
            try:
                out[k] = float(v)
            except ValueError:
                pass
    return out


def sample(pid, t0, soak):
    kids = children(pid)
    return {"t": round(time.monotonic() - t0, 2), "rss_kib": proc_rss_kib(pid),
            "rss_total_kib": proc_rss_kib(pid) + sum(proc_rss_kib(k) for k in kids), "fds": fd_count(pid),
            "cpu_s": round(proc_cpu_s(pid), 2), "cpu_workers_s": round(sum(proc_cpu_s(k) for k in kids), 2),
            "answered": sum(soak.counts.get(k, {}).get("answered", 0) for k in VALID) if soak else 0}


async def healthy(port, soak):
    """GET /healthz and one websocket inference answered"""
    try:
        status, _, body = await http_get(port, "/healthz", 30)
        if (status, body) != (200, b"OK"):
            return f"GET /healthz: {status} {body[:80]!r}"
        r, w, _ = await asyncio.wait_for(ws_open(port), 30)
        try:
            w.write(soak.reqs.obs_frames[0])
            op, payload = await asyncio.wait_for(read_frame(r), 60)
            bad = soak.ws_reply_ok(op, payload)
            return f"websocket inference: {bad}" if bad else None
        finally:
            abort(w)
    except (Closed, OSError, asyncio.TimeoutError) as e:
        return repr(e)


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


async def run(a, srv, port):
    pid = srv.pid
    max_bytes = int(math.ceil(a.max_message_mb * 1048576.0))
    reqs = Reqs(a.image_size, max_bytes)
    # the reply's shape, from the metadata
    r, w, meta = await asyncio.wait_for(ws_open(port), 60)
    abort(w)
    shape = (int(meta["action_horizon"]), int(meta["action_dim"]))
    soak = Soak(a, reqs, port, shape)
    bad = await healthy(port, soak)
    if bad:
        raise RuntimeError(f"the server is not healthy before the load: {bad}")
    await asyncio.sleep(0.5)
    t0 = time.monotonic()
    start = sample(pid, t0, None)
    samples = [dict(start, phase="start", metrics=await metrics(port))]
    print(f"start: RSS {start['rss_kib']} KiB (with workers {start['rss_total_kib']} KiB), {start['fds']} fds", flush=True)

    duration = a.minutes * 60
    t_load = time.monotonic()
    t_end = t_load + duration
    slots = [asyncio.ensure_future(soak.slot(i, t_end)) for i in range(a.clients)]
    warm = None
    died = None
    next_sample = t_load + a.sample_s
    while time.monotonic() < t_end:
        await asyncio.sleep(max(0.0, min(next_sample, t_end) - time.monotonic()))
        if srv.poll() is not None:
            died = f"the server exited with {srv.returncode} under load"
            break
        if time.monotonic() >= next_sample or time.monotonic() >= t_end:
            s = sample(pid, t0, soak)
            s["phase"] = "load"
            s["metrics"] = await metrics(port)
            samples.append(s)
            if warm is None and time.monotonic() - t_load >= a.warmup_s:
                warm = s
                s["phase"] = "warm"
            n_bad = sum(v for k, d in soak.counts.items() for o, v in d.items() if o in ("unanswered", "hung", "accepted"))
            print(f"  t={s['t']:6.1f}s RSS {s['rss_kib']} KiB (total {s['rss_total_kib']}) fds {s['fds']} "
                  f"cpu {s['cpu_s']:.1f}+{s['cpu_workers_s']:.1f} s answered {s['answered']} bad {n_bad}"
                  + (" metrics unreachable" if s["metrics"] is None else ""), file=sys.stderr, flush=True)
            next_sample += a.sample_s
    end_load = samples[-1]
    soak.stop = True
    await asyncio.gather(*slots)
    t_clients_gone = time.monotonic()

    health = await healthy(port, soak) if died is None else died
    after = None
    if died is None and srv.poll() is None:
        after = sample(pid, t0, soak)
        after["phase"] = "after"
        after["metrics"] = await metrics(port)
        samples.append(after)
    # fds back to the count before the load (the health check's and /metrics' connections closed too)
    fds_end = None
    while srv.poll() is None and time.monotonic() - t_clients_gone < a.settle_s:
        fds_end = fd_count(pid)
        if fds_end <= start["fds"]:
            break
        await asyncio.sleep(0.5)
    settle = round(time.monotonic() - t_clients_gone, 1)
    if srv.poll() is not None and died is None:
        died = f"the server exited with {srv.returncode} after the load"
    return soak, samples, start, warm, end_load, after, fds_end, settle, health, died


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="the molmoact binary")
    ap.add_argument("--model", default=os.path.join(ROOT, "assets", "tiny-grid", "model"), help="default: assets/tiny-grid/model")
    ap.add_argument("--minutes", type=float, default=10.0, help="the load's duration (default 10)")
    ap.add_argument("--clients", type=int, default=64, help="concurrent connections (default 64)")
    ap.add_argument("--recv-timeout-s", type=int, default=5, help="passed to serve (default 5)")
    ap.add_argument("--idle-timeout-s", type=int, default=20, help="passed to serve (default 20)")
    ap.add_argument("--max-message-mb", type=float, default=32.0, help="passed to serve; the oversized requests exceed it (default 32)")
    ap.add_argument("--serve-arg", action="append", default=[], metavar="ARG", help="an extra argument for serve (repeat)")
    ap.add_argument("--valid-deadline-s", type=float, default=60.0, help="a valid request's reply is due within (default 60)")
    ap.add_argument("--slack-s", type=float, default=5.0,
                    help="a malformed request's error or close is due within --recv-timeout-s plus this (default 5)")
    ap.add_argument("--sample-s", type=float, default=5.0, help="sampling period (default 5)")
    ap.add_argument("--warmup-s", type=float, default=None,
                    help="the RSS reference is the first sample this long into the load (default: a fifth of it, at most 60 s)")
    ap.add_argument("--settle-s", type=float, default=None,
                    help="how long fds may take to come back once the clients are gone (default --idle-timeout-s + 10)")
    ap.add_argument("--image-size", type=int, default=224, help="square camera frames of this size (default 224)")
    ap.add_argument("--mix", default=",".join(f"{k}={v}" for k, v in MIX.items()), help="KIND=WEIGHT,... (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=1, help="the traffic's random seed (default 1)")
    ap.add_argument("--log", metavar="FILE", help="keep the server's log (stderr) here")
    ap.add_argument("--json", metavar="FILE", help="write the samples and the summary here")
    a = ap.parse_args()
    mix = {}
    for part in a.mix.split(","):
        k, sep, v = part.partition("=")
        if not sep or k not in MIX:
            ap.error(f"--mix: {part!r}: give KIND=WEIGHT with KIND one of {', '.join(MIX)}")
        mix[k] = float(v)
    a.mix = {k: v for k, v in mix.items() if v > 0}
    if not a.mix:
        ap.error("--mix: nothing to send")
    if a.warmup_s is None:
        a.warmup_s = min(60.0, a.minutes * 60 / 5)
    if a.settle_s is None:
        a.settle_s = a.idle_timeout_s + 10.0
    if not os.access(a.bin, os.X_OK):
        ap.error(f"--bin {a.bin}: not an executable")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    port = free_port()
    log = open(a.log, "w+") if a.log else tempfile.TemporaryFile("w+")
    argv = [a.bin, "serve", "--model", a.model, "--port", str(port), "--recv-timeout-s", str(a.recv_timeout_s),
            "--idle-timeout-s", str(a.idle_timeout_s), "--max-message-mb", f"{a.max_message_mb:g}", *a.serve_arg]
    print(f"# molmoact serve soak: {' '.join(argv)}")
    print(f"{a.clients} clients, {a.minutes:g} min, {os.cpu_count()} CPUs (the clients compete with the server for them), "
          f"mix {','.join(f'{k}={v:g}' for k, v in a.mix.items())}", flush=True)
    srv = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.time() + 120
    while True:
        if srv.poll() is not None:
            log.seek(0)
            sys.exit(f"the server exited with {srv.returncode}: {log.read()[-2000:]}")
        try:
            socket.create_connection((HOST, port), timeout=1).close()
            break
        except OSError:
            if time.time() > deadline:
                srv.kill()
                sys.exit("the server did not open its port in 120 s")
            time.sleep(0.1)
    try:
        soak, samples, start, warm, end_load, after, fds_end, settle, health, died = asyncio.run(run(a, srv, port))
    except BaseException:
        srv.kill()
        raise
    rc = None
    if srv.poll() is None:
        cpu = (proc_cpu_s(srv.pid), sum(proc_cpu_s(k) for k in children(srv.pid)))
        srv.send_signal(signal.SIGTERM)
        try:
            rc = srv.wait(timeout=60)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()
            rc = "hung on SIGTERM (killed)"
    else:
        cpu = (end_load["cpu_s"], end_load["cpu_workers_s"])
        rc = srv.returncode

    # ------------------------------------------------------------ summary
    warm = warm or end_load
    crit = {}
    for key, label in (("rss_kib", "main process"), ("rss_total_kib", "with workers")):
        bound = warm[key] * 1.10 + 8192
        crit[f"RSS flat ({label}): end of load {end_load[key]} KiB <= {bound:.0f} KiB (warm-up {warm[key]} KiB x 1.1 + 8 MiB)"] = \
            end_load[key] <= bound
    crit[f"fds back to baseline: {fds_end} after the clients left (in {settle} s), {start['fds']} before the load"] = \
        fds_end is not None and fds_end <= start["fds"]
    n_valid = {k: soak.counts.get(k, {}) for k in VALID if k in a.mix}
    unanswered = sum(sum(v for o, v in d.items() if o != "answered") for d in n_valid.values())
    answered = sum(d.get("answered", 0) for d in n_valid.values())
    crit[f"every valid request answered: {answered} answered, {unanswered} not"] = unanswered == 0 and answered > 0
    bad = {k: {o: v for o, v in soak.counts.get(k, {}).items() if o not in ("error_reply", "closed")}
           for k in MALFORMED if k in a.mix}
    n_bad = sum(sum(d.values()) for d in bad.values())
    crit[f"every malformed request refused in time: {n_bad} accepted, hung or not sent"] = n_bad == 0
    n_client = sum(d.get("client_error", 0) for d in soak.counts.values())
    crit[f"no exchange failed in this script (client_error): {n_client}"] = n_client == 0
    crit[f"server healthy at the end: {died or health or 'yes'}"] = health is None and died is None
    crit[f"server exits 0 on SIGTERM: {rc}"] = rc == 0

    print("\n## summary")
    print(f"- RSS main process: start {start['rss_kib']} KiB, after warm-up (t={warm['t']} s) {warm['rss_kib']} KiB, "
          f"end of load {end_load['rss_kib']} KiB, clients gone {after['rss_kib'] if after else '-'} KiB")
    print(f"- RSS with workers: start {start['rss_total_kib']} KiB, after warm-up {warm['rss_total_kib']} KiB, "
          f"end of load {end_load['rss_total_kib']} KiB, clients gone {after['rss_total_kib'] if after else '-'} KiB")
    print(f"- fds: start {start['fds']}, max under load {max(s['fds'] for s in samples)}, end {fds_end}")
    print(f"- CPU seconds since the start: server main process {cpu[0]:.1f}, workers {cpu[1]:.1f} ({a.minutes * 60:.0f} s of load)")
    m_end = (after or end_load).get("metrics")
    if m_end:
        fails = {k.split('"')[1]: int(v) for k, v in m_end.items() if k.startswith("molmoact_request_failures_total") and v}
        reqs = {k.split('"')[1]: int(v) for k, v in m_end.items() if k.startswith("molmoact_requests_total")}
        print(f"- /metrics at the end: requests {reqs}, failures {fails}")
    print("\n| kind | outcomes | p50 s | p99 s |\n|---|---|---:|---:|")
    for k in list(VALID) + list(MALFORMED) + list(RUDE):
        if k in soak.counts:
            lat = soak.lat.get(k, [])
            oc = ", ".join(f"{o} {v}" for o, v in sorted(soak.counts[k].items()))
            print(f"| {k} | {oc} | {pct(lat, 50):.3f} | {pct(lat, 99):.3f} |" if lat else f"| {k} | {oc} | | |")
    if soak.why:
        print("\nfirst reasons:")
        for k, ws in soak.why.items():
            for w in ws:
                print(f"- {k}: {w}")
    print()
    for c, ok in crit.items():
        print(f"- {'ok  ' if ok else 'FAIL'} {c}")
    passed = all(crit.values())
    print(f"\n{'PASS' if passed else 'FAIL'}")
    if not passed:
        log.flush()
        log.seek(0)
        tail = log.read().splitlines()[-15:]
        print("\nthe server log's last lines:\n" + "\n".join(tail))
    log.close()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"argv": argv, "clients": a.clients, "minutes": a.minutes, "cpus": os.cpu_count(), "mix": a.mix,
                       "samples": samples, "counts": soak.counts, "reasons": soak.why,
                       "latency_s": {k: {"p50": pct(v, 50), "p99": pct(v, 99), "n": len(v)} for k, v in soak.lat.items()},
                       "criteria": crit, "exit_code": rc, "pass": passed}, f, indent=1)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
