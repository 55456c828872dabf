#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""A simulated robot loop, measured: LeRobot's unmodified RobotClient (scripts/lerobot_robot_loop.py)
against `molmoact serve --grpc-port`, with real-time chunking off and on, same seeds; prints a
markdown table (docs/SERVER.md "Measured: a robot loop").

    /usr/bin/python3 scripts/robot_loop_table.py --lerobot-src ~/lerobot --model assets/tiny-grid/model \
        --fps 30 --ticks 300 [--runs 3] [--json out.json]

Per run: chunks received; observations sent, run, and not run (skipped as already run, replaced by
a newer one before it ran, or unanswered when the run ended); ticks the robot waited with an empty
queue after its first action; the L2 jump between consecutive executed actions at chunk boundaries
(mean, max) and, for scale, every step's; the switch gap: at the first tick a new chunk's row
runs, its distance from the row the previous chunk had planned for that step (what RTC pulls
together); the server's delay in control ticks (p50 of its
histogram), guided chunks, mispredicted delays and chunks whose delay reached the horizon (from
/metrics). The robot holds its state and its cameras pan slowly (--state-mode static), so what
changes from chunk to chunk is mostly the noise each chunk is drawn from: the boundary jump RTC
exists to remove. A benchmark: run it alone on the machine."""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics(port):
    out = {}
    for line in urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode().splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def delay_p50(m):
    buckets = sorted((float(k.split('le="')[1].split('"')[0]), v) for k, v in m.items()
                     if k.startswith("molmoact_delay_ticks_bucket") and "+Inf" not in k)
    total = m.get("molmoact_delay_ticks_count", 0)
    for le, c in buckets:
        if total and c >= total / 2:
            return le
    return float("nan")


def one(args, rtc, seed):
    http, grpc = free_port(), free_port()
    cmd = [args.molmoact, "serve", "--model", args.model, "--port", str(http), "--grpc-port", str(grpc), "--fps", str(args.fps),
           "--seed", str(seed), "--quiet"] + (["--rtc", "--rtc-horizon", str(args.rtc_horizon)] if rtc else [])
    log = tempfile.TemporaryFile("w+")
    srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.time() + 600
        while True:
            try:
                socket.create_connection(("127.0.0.1", grpc), timeout=1).close()
                break
            except OSError:
                if srv.poll() is not None or time.time() > deadline:
                    log.seek(0)
                    sys.exit("the server did not start: " + log.read()[-2000:])
                time.sleep(0.2)
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "run.json")
            p = subprocess.run([sys.executable, os.path.join(HERE, "lerobot_robot_loop.py"), "--lerobot-src", args.lerobot_src,
                                "--server", f"127.0.0.1:{grpc}", "--policy-type", "molmoact2", "--pretrained", args.model,
                                "--fps", f"{args.fps:g}", "--ticks", str(args.ticks), "--actions-per-chunk", str(args.actions_per_chunk),
                                "--aggregate-fn", args.aggregate_fn, "--state-mode", "static", "--seed", str(seed), "--out", out],
                               capture_output=True, text=True, timeout=args.ticks / args.fps * 4 + 300)
            if p.returncode:
                sys.exit("the robot loop failed: " + p.stderr[-3000:])
            r = json.load(open(out))
        m = metrics(http)
    finally:
        srv.send_signal(signal.SIGINT)
        srv.wait(timeout=60)
    run = r["observations_answered"]
    # the switch: at the first tick a new chunk's row runs, how far it is from the row the old
    # chunk had planned for that same step (what RTC pulls together; the boundary jump also holds
    # the trajectory's own step)
    chunks = {c["id"]: c for c in r["chunks"]}
    switch = []
    for prev, cur in zip(r["executed"], r["executed"][1:]):
        if cur["chunk"] == prev["chunk"]:
            continue
        old = chunks[prev["chunk"]]
        if cur["timestep"] in old["timesteps"]:
            a = old["actions"][old["timesteps"].index(cur["timestep"])][:len(cur["action"])]
            switch.append(sum((x - y) ** 2 for x, y in zip(a, cur["action"])) ** 0.5)
    return {"rtc": rtc, "seed": seed, "chunks": r["chunks_received"], "obs_sent": r["observations_sent"], "obs_run": run,
            "obs_not_run": r["observations_sent"] - run, "starved_after_first": r["ticks_starved_after_first_action"],
            "jump_mean": r["boundary_jump_l2"]["mean"], "jump_max": r["boundary_jump_l2"]["max"],
            "step_mean": r["step_l2_all"]["mean"], "delay_p50": delay_p50(m),
            "switch_mean": sum(switch) / len(switch) if switch else float("nan"), "switch_max": max(switch, default=float("nan")),
            "guided": m.get("molmoact_rtc_guided_total", 0), "mispredicted": m.get("molmoact_rtc_mispredicted_total", 0),
            "beyond_horizon": m.get("molmoact_rtc_beyond_horizon_total", 0)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lerobot-src", required=True)
    ap.add_argument("--model", default=os.path.join(SRC, "assets", "tiny-grid", "model"))
    ap.add_argument("--molmoact", default=os.environ.get("MOLMOACT", os.path.join(SRC, "build", "molmoact")))
    ap.add_argument("--fps", type=int, default=30)
    ap.add_argument("--ticks", type=int, default=300)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--actions-per-chunk", type=int, default=10)
    ap.add_argument("--aggregate-fn", default="latest_only")
    ap.add_argument("--rtc-horizon", type=int, default=10)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = [one(args, rtc, 100 + k) for k in range(args.runs) for rtc in (False, True)]
    print(f"model {os.path.basename(os.path.dirname(os.path.abspath(args.model)))}, {args.fps:g} Hz, {args.ticks} ticks, "
          f"{args.actions_per_chunk} actions per chunk, aggregate {args.aggregate_fn}")
    print("| RTC | seed | chunks | obs sent / run / not run | empty-queue ticks | delay p50 (ticks) | guided / mispredicted / d >= H "
          "| boundary jump mean / max | step mean | switch gap mean / max |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {'on' if r['rtc'] else 'off'} | {r['seed']} | {r['chunks']} | {r['obs_sent']} / {r['obs_run']} / {r['obs_not_run']} "
              f"| {r['starved_after_first']} | {r['delay_p50']:g} | {r['guided']:g} / {r['mispredicted']:g} / {r['beyond_horizon']:g} "
              f"| {r['jump_mean']:.3f} / {r['jump_max']:.3f} | {r['step_mean']:.3f} | {r['switch_mean']:.3f} / {r['switch_max']:.3f} |")
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
