#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The server path measured (a measurement, not a test):
  - the latency `molmoact serve` adds over the engine per request: the client's round trip minus
    the engine's own time for the request (policy_timing infer_ms + preprocess_ms: the pipeline,
    what `molmoact run` reports as total, and the frames' and prompt's preparation), median over N requests from one local openpi-style client (msgpack serialisation,
    websocket transfer, queueing, decode);
  - requests per second with 1 and 4 concurrent clients.
    bench/serve_bench.py --model DIR [--requests 100] [--clients 1,4] [--image 256] [--inproc]"""
import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(SRC, "tests", "server"))
import openpi_client as oc  # noqa: E402
import websockets  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--clients", default="1,4")
    ap.add_argument("--image", type=int, default=256)
    ap.add_argument("--inproc", action="store_true")
    ap.add_argument("--binary", default=os.path.join(SRC, "build", "molmoact"))
    a = ap.parse_args()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    log = open(os.devnull, "w")
    p = subprocess.Popen([a.binary, "serve", "--model", a.model, "--port", str(port)] + (["--inproc"] if a.inproc else []),
                         stderr=log)
    uri = f"ws://127.0.0.1:{port}"
    for _ in range(6000):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    rng = np.random.default_rng(0)
    obs = {"observation/image": rng.integers(0, 256, (a.image, a.image, 3), dtype=np.uint8),
           "observation/wrist_image": rng.integers(0, 256, (a.image, a.image, 3), dtype=np.uint8),
           "observation/state": np.linspace(-0.5, 0.5, 8), "prompt": "put the bowl on the plate", "seed": 1}
    payload = oc.packb(obs)
    try:
        async def one_client(n, rt, eng):
            async with websockets.connect(uri, compression=None, max_size=2 ** 26) as ws:
                await ws.recv()
                for _ in range(n):
                    t0 = time.perf_counter()
                    await ws.send(payload)
                    r = oc.unpackb(await ws.recv())
                    rt.append((time.perf_counter() - t0) * 1e3)
                    eng.append(r["policy_timing"]["infer_ms"] + r["policy_timing"]["preprocess_ms"])

        rt, eng = [], []
        asyncio.run(one_client(3, [], []))  # warm-up
        asyncio.run(one_client(a.requests, rt, eng))
        over = [x - y for x, y in zip(rt, eng)]
        print(f"model {a.model}, {a.image}x{a.image} frames, request {len(payload)} bytes, "
              f"{'inproc' if a.inproc else 'resident'}")
        print(f"round trip median {statistics.median(rt):.2f} ms, engine (molmoact run's total) median "
              f"{statistics.median(eng):.2f} ms, added by the server path median {statistics.median(over):.3f} ms "
              f"(p10 {np.percentile(over, 10):.3f}, p90 {np.percentile(over, 90):.3f}) over {a.requests} requests")
        for c in [int(x) for x in a.clients.split(",") if x and int(x) > 0]:
            per = max(1, a.requests // c)

            async def many():
                await asyncio.gather(*(one_client(per, [], []) for _ in range(c)))
            t0 = time.perf_counter()
            asyncio.run(many())
            dt = time.perf_counter() - t0
            print(f"{c} client(s): {per * c} requests in {dt:.2f} s = {per * c / dt:.2f} requests/s")
        rss = 0
        for pid in [p.pid] + [int(x) for x in subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True,
                                                              text=True).stdout.split()]:
            for line in open(f"/proc/{pid}/status"):
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1])
        print(f"RSS of server + workers after the run: {rss / 1024:.1f} MiB")
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)


if __name__ == "__main__":
    main()
