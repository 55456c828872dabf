#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Side-by-side benchmark of `molmoact serve` binaries, over the network only (so it works
against any version of the server):

    scripts/bench_server.py --bin old=/work/old-build/molmoact --bin new=build/molmoact [--seconds 5]

Each --bin NAME=PATH is started with `serve --model M --port P` (all of them once, at the start;
only the one being measured has load). For each binary:
  healthz  GET /healthz at 1, 4, 64 concurrent keep-alive clients (wrk when installed, else a
           Python asyncio client): requests/s, latency p50/p99
  ws       openpi websocket round trips (metadata frame, then binary msgpack observation ->
           binary msgpack reply) at 1, 4, 64 clients: requests/s, p50/p99
  act      HTTP POST /act (JSON, json_numpy arrays) at 1, 4 keep-alive clients
  rss      on a freshly started server (one for each kind), the server process's VmRSS before and after 500 idle keep-alive HTTP connections (each
           answered one GET /healthz) and 200 idle websockets (after their metadata frame): KiB
           per connection
Every point is measured for each binary in turn before the next point (with --rounds R > 1 the
order alternates A,B,B,A,... and the median is reported), so machine noise affects all alike.
Ratios are each binary over the first one. Prints a markdown table; --json FILE writes it all.
The load generator runs on the same machine and competes with the server for its cores."""
import argparse
import asyncio
import base64
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import msgpack
import numpy as np
import websockets

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
PROMPT = "put both the alphabet soup and the tomato sauce in the basket"
STATE = np.array([0.02, -0.05, 0.9, 3.1, -0.1, 0.05, 0.03, -0.03])  # float64, as LIBERO's example sends it


# ------------------------------------------------------------------------------------ requests

def images(size):
    rng = np.random.default_rng(7)
    return (rng.integers(0, 256, (size, size, 3), dtype=np.uint8), rng.integers(0, 256, (size, size, 3), dtype=np.uint8))


def pack_array(obj):  # openpi_client/msgpack_numpy.py's encoding: bytes keys, numpy dtype strings
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": obj.shape}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    return obj


def ws_observation(size):
    a, b = images(size)
    return msgpack.packb({"observation/image": a, "observation/wrist_image": b, "observation/state": STATE, "prompt": PROMPT},
                         default=pack_array)


def json_numpy(a):
    a = np.ascontiguousarray(a)
    return {"__numpy__": base64.b64encode(a.tobytes()).decode(), "dtype": a.dtype.str, "shape": list(a.shape)}


def act_request(size, port):
    a, b = images(size)
    body = json.dumps({"image": json_numpy(a), "wrist_image": json_numpy(b), "state": json_numpy(STATE),
                       "instruction": PROMPT}).encode()
    return (f"POST /act HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def ws_reply_ok(r):
    if not isinstance(r, bytes):
        return False
    m = msgpack.unpackb(r)
    a = m.get("actions") if isinstance(m, dict) else None
    return isinstance(a, dict) and b"shape" in a and len(a[b"shape"]) == 2


# ------------------------------------------------------------------------------------ the servers

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Server:
    def __init__(self, name, path, model, extra):
        self.name, self.path = name, path
        self.port = free_port()
        self.log = tempfile.TemporaryFile("w+")
        self.p = subprocess.Popen([path, "serve", "--model", model, "--port", str(self.port), *extra],
                                  stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + 120
        while time.time() < deadline:  # the port opens once every session is loaded
            if self.p.poll() is not None:
                raise RuntimeError(f"{name}: the server exited with {self.p.returncode}: {self.logs()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"{name}: the server did not open its port in 120 s")

    def logs(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def rss_kib(self, field="VmRSS"):
        for line in open(f"/proc/{self.p.pid}/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1])
        return 0

    def cpu_s(self):
        f = open(f"/proc/{self.p.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        try:
            rc = self.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = self.p.wait()
        self.log.close()
        return rc


def version(path):
    try:
        return subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"? ({e})"


# ------------------------------------------------------------------------------------ load

def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


async def read_http(reader):
    """one response: (status, body)"""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    n = 0
    for l in lines[1:]:
        if l.lower().startswith("content-length:"):
            n = int(l.split(":", 1)[1])
    return status, await reader.readexactly(n)


async def timed_clients(n, warmup, seconds, connect, one, close):
    """n clients: each connects, then repeats `one` until the window closes. The window opens
    `warmup` s after the start, and not before every client has had one reply (64 clients queued
    on one inference thread wait seconds for their first); returns the latencies (s) of the
    requests that completed in the window, and the errors"""
    done, errors = [], []
    t0 = time.perf_counter()
    win = {"w0": None, "w1": None}
    first = {"n": 0}
    all_first = asyncio.Event()

    async def client():
        try:
            conn = await connect()
        except Exception as e:  # noqa: BLE001 - counted and reported
            errors.append(f"connect: {e!r}")
            first["n"] += 1
            if first["n"] == n:
                all_first.set()
            return
        counted = False
        try:
            while win["w1"] is None or time.perf_counter() < win["w1"]:
                t = time.perf_counter()
                ok = await one(conn)
                e = time.perf_counter()
                if not ok:
                    errors.append("bad reply")
                done.append((t, e))
                if not counted:
                    counted = True
                    first["n"] += 1
                    if first["n"] == n:
                        all_first.set()
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))
        finally:
            if not counted:
                first["n"] += 1
                if first["n"] == n:
                    all_first.set()
            try:
                await close(conn)
            except Exception:  # noqa: BLE001
                pass

    async def window():
        await all_first.wait()
        win["w0"] = max(time.perf_counter(), t0 + warmup)
        win["w1"] = win["w0"] + seconds

    await asyncio.gather(window(), *(client() for _ in range(n)))
    w0, w1 = win["w0"], win["w1"]
    return [e - t for t, e in done if w0 <= e <= w1], errors


def run_http(port, n, warmup, seconds, request, check):
    async def connect():
        return await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)

    async def one(conn):
        conn[1].write(request)
        status, body = await read_http(conn[0])
        return check(status, body)

    async def close(conn):
        conn[1].close()
    return asyncio.run(timed_clients(n, warmup, seconds, connect, one, close))


def run_ws(port, n, warmup, seconds, obs):
    async def connect():
        ws = await websockets.connect(f"ws://127.0.0.1:{port}", compression=None, max_size=1 << 26, open_timeout=60,
                                      ping_interval=None)
        meta = msgpack.unpackb(await ws.recv())
        if not isinstance(meta, dict):
            raise RuntimeError("the metadata frame is not a map")
        return ws

    async def one(ws):
        await ws.send(obs)
        return ws_reply_ok(await ws.recv())

    async def close(ws):
        await ws.close()
    return asyncio.run(timed_clients(n, warmup, seconds, connect, one, close))


def unit_s(v):
    m = re.match(r"([\d.]+)(us|ms|s|m)$", v)
    x, u = float(m.group(1)), m.group(2)
    return x * {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}[u]


def run_wrk(port, n, warmup, seconds):
    url = f"http://127.0.0.1:{port}/healthz"
    threads = str(max(1, min(n, os.cpu_count() or 1)))
    if warmup > 0:
        subprocess.run(["wrk", "-t", threads, "-c", str(n), "-d", f"{max(1, round(warmup))}s", url], capture_output=True)
    out = subprocess.run(["wrk", "-t", threads, "-c", str(n), "-d", f"{max(1, round(seconds))}s", "--latency", url],
                         capture_output=True, text=True).stdout
    rps = float(re.search(r"Requests/sec:\s*([\d.]+)", out).group(1))
    p = {q: unit_s(re.search(rf"^\s*{q}%\s+(\S+)", out, re.M).group(1)) for q in (50, 99)}
    errs = []
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if m:
        errs.append(f"{m.group(1)} non-2xx")
    m = re.search(r"Socket errors: (.*)", out)
    if m:
        errs.append("socket errors: " + m.group(1))
    return {"rps": rps, "p50_ms": p[50] * 1e3, "p99_ms": p[99] * 1e3, "n": int(round(rps * seconds)), "errors": errs}


def summarise(lat, errors, seconds):
    return {"rps": len(lat) / seconds, "p50_ms": pct(lat, 50) * 1e3, "p99_ms": pct(lat, 99) * 1e3, "n": len(lat),
            "errors": sorted(set(errors))[:5] + ([f"{len(errors)} errors"] if errors else [])}


# ------------------------------------------------------------------------------------ idle memory

def recv_until(s, token):
    buf = b""
    while token not in buf:
        d = s.recv(65536)
        if not d:
            raise RuntimeError("closed by the server")
        buf += d
    return buf


def idle_http(port, n):
    socks = []
    req = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(req)
        buf = recv_until(s, b"\r\n\r\n")
        head, rest = buf.split(b"\r\n\r\n", 1)
        if b" 200 " not in head.split(b"\r\n")[0]:
            raise RuntimeError(f"GET /healthz: {head[:80]!r}")
        m = re.search(rb"(?i)content-length:\s*(\d+)", head)
        need = int(m.group(1)) if m else 0
        while len(rest) < need:
            rest += s.recv(65536)
        socks.append(s)
    return socks


def idle_ws(port, n):
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        s.sendall(f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
        buf = recv_until(s, b"\r\n\r\n")
        head, rest = buf.split(b"\r\n\r\n", 1)
        if b" 101 " not in head.split(b"\r\n")[0]:
            raise RuntimeError(f"websocket upgrade: {head[:80]!r}")
        while len(rest) < 2:
            rest += s.recv(65536)
        ln = rest[1] & 0x7F
        hl = 2 + (2 if ln == 126 else 8 if ln == 127 else 0)
        while len(rest) < hl:
            rest += s.recv(65536)
        if ln >= 126:
            ln = int.from_bytes(rest[2:hl], "big")
        while len(rest) < hl + ln:
            rest += s.recv(65536)
        if rest[0] & 0x0F != 2:
            raise RuntimeError("the first frame is not binary metadata")
        socks.append(s)
    return socks


def settle_rss(srv):
    time.sleep(0.5)
    return srv.rss_kib("VmRSS"), srv.rss_kib("RssAnon")


def measure_rss(srv, kind, n):
    """VmRSS (and RssAnon, which leaves out the binary's pages touched for the first time) before
    and after opening n idle connections; 16 opened first (and held), so that the first
    connections' one-time costs are not counted"""
    out = {}
    opener = idle_http if kind == "http" else idle_ws
    if n > 0:
        first = opener(srv.port, min(n, 16))  # kept open: their memory is not reused by the n
        before = settle_rss(srv)
        socks = opener(srv.port, n)
        after = settle_rss(srv)
        for s in socks + first:
            s.close()
        out[kind] = {"before_kib": before[0], "after_kib": after[0], "kib_per_conn": (after[0] - before[0]) / n,
                     "anon_before_kib": before[1], "anon_after_kib": after[1], "anon_kib_per_conn": (after[1] - before[1]) / n,
                     "n": n}
    return out


# ------------------------------------------------------------------------------------ main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", action="append", required=True, metavar="NAME=PATH",
                    help="a server binary to measure (repeat; ratios are over the first)")
    ap.add_argument("--model", default=os.path.join(ROOT, "assets", "tiny-grid", "model"), help="default: assets/tiny-grid/model")
    ap.add_argument("--seconds", type=float, default=5.0, help="measured seconds per point and binary (default 5)")
    ap.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each point (default 1)")
    ap.add_argument("--rounds", type=int, default=1, help="repeat each point, alternating the order; medians reported")
    ap.add_argument("--healthz-clients", default="1,4,64", help="default 1,4,64")
    ap.add_argument("--ws-clients", default="1,4,64", help="default 1,4,64")
    ap.add_argument("--act-clients", default="1,4", help="default 1,4")
    ap.add_argument("--idle-http", type=int, default=500, help="idle HTTP connections for the RSS point (default 500)")
    ap.add_argument("--idle-ws", type=int, default=200, help="idle websockets for the RSS point (default 200)")
    ap.add_argument("--image-size", type=int, default=224, help="square camera frames of this size (default 224)")
    ap.add_argument("--only", default="healthz,ws,act,rss", help="which measurements (default healthz,ws,act,rss)")
    ap.add_argument("--loadgen", choices=("auto", "wrk", "python"), default="auto",
                    help="GET /healthz load: wrk (apt-get install wrk) or Python asyncio; auto: wrk if installed")
    ap.add_argument("--serve-arg", action="append", default=[], metavar="ARG", help="an extra argument for serve (repeat)")
    ap.add_argument("--json", metavar="FILE", help="write the configuration and every result here")
    a = ap.parse_args()

    bins = []
    for b in a.bin:
        name, sep, path = b.partition("=")
        if not sep or not name or not path:
            ap.error(f"--bin {b}: give NAME=PATH")
        if not os.access(path, os.X_OK):
            ap.error(f"--bin {b}: {path} is not an executable")
        bins.append((name, os.path.abspath(path)))
    if len({n for n, _ in bins}) != len(bins):
        ap.error("--bin: the names must differ")
    only = set(a.only.split(","))
    if only - {"healthz", "ws", "act", "rss"}:
        ap.error(f"--only: unknown {sorted(only - {'healthz', 'ws', 'act', 'rss'})}")
    loadgen = a.loadgen
    if loadgen == "auto":
        loadgen = "wrk" if shutil.which("wrk") else "python"
    elif loadgen == "wrk" and not shutil.which("wrk"):
        ap.error("--loadgen wrk: wrk is not installed (apt-get install wrk)")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731

    points = []
    if "healthz" in only:
        points += [("healthz", n) for n in ints(a.healthz_clients)]
    if "ws" in only:
        points += [("ws", n) for n in ints(a.ws_clients)]
    if "act" in only:
        points += [("act", n) for n in ints(a.act_clients)]
    if "rss" in only:
        points += [("rss", 0)]

    cpus = os.cpu_count()
    aff = len(os.sched_getaffinity(0))
    info = {"cpus": cpus, "cpus_usable": aff, "loadgen": loadgen, "seconds": a.seconds, "warmup": a.warmup, "rounds": a.rounds,
            "model": a.model, "image_size": a.image_size, "serve_args": a.serve_arg,
            "bins": {n: {"path": p, "version": version(p)} for n, p in bins},
            "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "host": os.uname().nodename}
    print(f"# molmoact serve: {' vs '.join(n for n, _ in bins)}", flush=True)
    print(f"{cpus} CPUs ({aff} usable); the load generator ({loadgen} for /healthz, Python asyncio for ws and /act) "
          f"runs on the same machine and competes with the server for them: compare the binaries, not the absolute numbers.")
    for n, p in bins:
        print(f"- {n}: {p} ({info['bins'][n]['version']})")
    print("Ratios are over the first binary: req/s higher is better, latencies and KiB lower are better.")
    print(f"{a.seconds:g} s per point after {a.warmup:g} s warm-up, {a.rounds} round(s), model {os.path.relpath(a.model, ROOT)}, "
          f"{a.image_size}x{a.image_size} frames\n", flush=True)

    servers = {}
    results = {}  # (kind, clients) -> name -> [per-round result]
    try:
        for n, p in bins:
            servers[n] = Server(n, p, a.model, a.serve_arg)
        obs = ws_observation(a.image_size)
        for kind, clients in points:
            for r in range(a.rounds):
                order = bins if r % 2 == 0 else bins[::-1]
                for name, _ in order:
                    srv = servers[name]
                    if srv.p.poll() is not None:
                        raise RuntimeError(f"{name}: the server exited with {srv.p.returncode}: {srv.logs()[-2000:]}")
                    c0 = srv.cpu_s()
                    if kind == "healthz":
                        if loadgen == "wrk":
                            res = run_wrk(srv.port, clients, a.warmup, a.seconds)
                        else:
                            req = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\n\r\n".encode()
                            res = summarise(*run_http(srv.port, clients, a.warmup, a.seconds, req,
                                                      lambda st, b: st == 200 and b == b"OK"), a.seconds)
                    elif kind == "ws":
                        res = summarise(*run_ws(srv.port, clients, a.warmup, a.seconds, obs), a.seconds)
                    elif kind == "act":
                        res = summarise(*run_http(srv.port, clients, a.warmup, a.seconds, act_request(a.image_size, srv.port),
                                                  lambda st, b: st == 200 and b'"actions"' in b), a.seconds)
                    else:  # on a fresh server: the heap a loaded one freed would be reused and hide the cost
                        res = {}
                        for k, n_idle in (("http", a.idle_http), ("ws", a.idle_ws)):
                            fresh = Server(name, srv.path, a.model, a.serve_arg)
                            try:
                                res.update(measure_rss(fresh, k, n_idle))
                            finally:
                                fresh.stop()
                    res["server_cpu_s"] = srv.cpu_s() - c0
                    results.setdefault((kind, clients), {}).setdefault(name, []).append(res)
                    brief = (f"{res['rps']:.1f} req/s p50 {res['p50_ms']:.2f} ms p99 {res['p99_ms']:.2f} ms"
                             if kind != "rss" else
                             ", ".join(f"{k} {v['kib_per_conn']:.2f} KiB/conn" for k, v in res.items() if isinstance(v, dict)))
                    errs = res.get("errors")
                    print(f"  {kind} c={clients} {name} round {r + 1}: {brief}" + (f"  ERRORS {errs}" if errs else ""),
                          file=sys.stderr, flush=True)
    finally:
        rcs = {n: s.stop() for n, s in servers.items()}

    # ---------------------------------------------------------------- the table
    names = [n for n, _ in bins]
    base = names[0]
    rows = []
    hdr = ["point"] + [f"{n} {m}" for n in names for m in ("req/s", "p50 ms", "p99 ms")] + \
          [f"{n}/{base} {m}" for n in names[1:] for m in ("req/s", "p50", "p99")]
    summary = {}
    for key in results:
        kind, clients = key
        if kind == "rss":
            continue
        vals = {}
        for n in names:
            rs = results[key][n]
            vals[n] = {m: statistics.median(r[m] for r in rs) for m in ("rps", "p50_ms", "p99_ms", "server_cpu_s")}
            vals[n]["errors"] = sum((r["errors"] for r in rs), [])
        summary[f"{kind} c={clients}"] = vals
        row = [f"{kind} c={clients}"]
        for n in names:
            row += [f"{vals[n]['rps']:.1f}", f"{vals[n]['p50_ms']:.2f}", f"{vals[n]['p99_ms']:.2f}"]
        for n in names[1:]:
            row += [ratio(vals[n]["rps"], vals[base]["rps"]), ratio(vals[n]["p50_ms"], vals[base]["p50_ms"]),
                    ratio(vals[n]["p99_ms"], vals[base]["p99_ms"])]
        rows.append(row)
    if rows:
        print(md_table(hdr, rows))

    if ("rss", 0) in results:
        hdr = ["idle connections"] + [f"{n} KiB/conn" for n in names] + [f"{n}/{base}" for n in names[1:]] + \
              [f"{n} anon KiB/conn" for n in names]
        rows = []
        for kind in ("http", "ws"):
            vals, anon = {}, {}
            for n in names:
                rs = [r[kind] for r in results[("rss", 0)][n] if kind in r]
                if rs:
                    vals[n] = statistics.median(r["kib_per_conn"] for r in rs)
                    anon[n] = statistics.median(r["anon_kib_per_conn"] for r in rs)
            if len(vals) != len(names):
                continue
            summary[f"rss {kind}"] = {"vmrss_kib_per_conn": vals, "rssanon_kib_per_conn": anon}
            n_conn = results[("rss", 0)][names[0]][0][kind]["n"]
            rows.append([f"{n_conn} {'keep-alive HTTP' if kind == 'http' else 'websockets'}"] +
                        [f"{vals[n]:.2f}" for n in names] + [ratio(vals[n], vals[base]) for n in names[1:]] +
                        [f"{anon[n]:.2f}" for n in names])
        print()
        print(md_table(hdr, rows))
        print("(VmRSS of the server's main process; anon: RssAnon, without file pages touched for the first time. "
              "Each on a fresh server; RSS grows in 4 KiB pages, so expect +-0.1 KiB/conn.)")
    errs = {f"{k[0]} c={k[1]} {n}": r["errors"] for k, v in results.items() for n, rs in v.items() for r in rs if r.get("errors")}
    if errs:
        print("\nerrors:")
        for k, e in errs.items():
            print(f"- {k}: {e}")
    print("\nserver exit codes on SIGTERM: " + ", ".join(f"{n} {rc}" for n, rc in rcs.items()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"info": info, "summary": summary, "exit_codes": rcs,
                       "results": {f"{k[0]} c={k[1]}": v for k, v in results.items()}}, f, indent=1)
    return 0 if not errs and all(rc == 0 for rc in rcs.values()) else 1


def ratio(x, y):
    return f"{x / y:.2f}" if y and y == y and x == x else "-"


def md_table(hdr, rows):
    out = ["| " + " | ".join(hdr) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in range(len(hdr))) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
