# SPDX-License-Identifier: Apache-2.0
"""LeRobot's own async-inference RobotClient (unmodified, imported from a lerobot checkout) driving a
simulated robot through scripts/lerobot_robot_loop.py.

    MOLMOACT_LEROBOT_SRC=~/lerobot [MOLMOACT_GRPC_SERVER=127.0.0.1:8080] /usr/bin/python3 -m pytest -q \
        tests/server/test_lerobot_client.py

Skipped unless MOLMOACT_LEROBOT_SRC names a lerobot checkout (huggingface/lerobot; the harness was
validated at 7427f31801f944f5ec9ce53cda02862ce7d1638b). The protocol test needs a running
AsyncInference server at MOLMOACT_GRPC_SERVER (policy type MOLMOACT_GRPC_POLICY_TYPE, default molmoact2);
it is to be wired to `molmoact serve --grpc-port` once that exists."""
import json
import os
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.normpath(os.path.join(HERE, "..", ".."))
SCRIPT = os.path.join(SRC, "scripts", "lerobot_robot_loop.py")
LEROBOT = os.environ.get("MOLMOACT_LEROBOT_SRC")
SERVER = os.environ.get("MOLMOACT_GRPC_SERVER")

pytestmark = pytest.mark.skipif(not LEROBOT, reason="MOLMOACT_LEROBOT_SRC (a lerobot checkout) is not set")


def _loop(tmp_path, *extra, timeout=120):
    out = tmp_path / "run.json"
    p = subprocess.run([sys.executable, SCRIPT, "--lerobot-src", LEROBOT, "--out", str(out), *extra],
                       capture_output=True, text=True, timeout=timeout)
    report = json.loads(out.read_text()) if out.exists() else None
    return p, report


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_server_is_a_failed_start(tmp_path):
    # Ready fails (UNAVAILABLE after the channel's retries): RobotClient.start() returns False, the harness exits 1
    p, r = _loop(tmp_path, "--server", f"127.0.0.1:{_free_port()}", "--ticks", "5", timeout=60)
    assert p.returncode == 1, p.stderr[-2000:]
    assert r["started"] is False and r["chunks_received"] == 0 and r["actions_executed"] == 0


@pytest.mark.skipif(not SERVER, reason="MOLMOACT_GRPC_SERVER (host:port of a running AsyncInference server) is not set")
def test_lerobot_robot_client_protocol(tmp_path):
    p, r = _loop(tmp_path, "--server", SERVER, "--policy-type", os.environ.get("MOLMOACT_GRPC_POLICY_TYPE", "molmoact2"),
                 "--pretrained", os.environ.get("MOLMOACT_GRPC_PRETRAINED", "molmoact2"), "--ticks", "150",
                 "--actions-per-chunk", "10", "--aggregate-fn", "latest_only", timeout=300)
    assert p.returncode == 0 and r["started"], p.stderr[-3000:]
    assert r["chunks_received"] >= 2 and r["actions_executed"] > 0
    obs = r["observations"]
    assert obs[0]["must_go"] and obs[0]["timestep"] == 0
    for c in r["chunks"]:
        o = obs[c["observation"]]  # each chunk answers one sent observation (row 0 timestamp == its timestamp)
        assert c["timesteps"] == list(range(o["timestep"], o["timestep"] + len(c["timesteps"])))
        assert 1 < len(c["timesteps"]) <= 10 and c["row_len"] >= r["config"]["action_dim"]
        assert c["dtype"] == "torch.float32"
    # latest_only: every executed action is a row of the chunk that last provided its timestep
    ts = [e["timestep"] for e in r["executed"]]
    assert ts == list(range(ts[0], ts[0] + len(ts)))
    chunks = {c["id"]: c for c in r["chunks"]}
    for e in r["executed"]:
        row = chunks[e["chunk"]]["actions"][e["row"]][:r["config"]["action_dim"]]
        assert max(abs(a - b) for a, b in zip(row, e["action"])) <= 1e-6


def test_robot_client_against_molmoact_serve(tmp_path):
    """LeRobot's unmodified RobotClient against `molmoact serve --grpc-port` (started here): it
    connects, streams observations and executes chunks; each chunk it received equals `molmoact run`
    on the observation it sent, with the seed the server logged for it."""
    import numpy as np
    sys.path.insert(0, HERE)
    from test_server import BIN, Server, free_port, model
    gport = free_port()
    s = Server("tiny-grid", "--grpc-port", str(gport), "--seed", "11")
    try:
        obs_dir = tmp_path / "obs"
        p, r = _loop(tmp_path, "--server", f"127.0.0.1:{gport}", "--policy-type", "molmoact2", "--pretrained",
                     model("tiny-grid"), "--ticks", "90", "--aggregate-fn", "latest_only", "--save-obs", str(obs_dir),
                     timeout=300)
        assert p.returncode == 0 and r["started"], p.stderr[-3000:]
        assert r["chunks_received"] >= 3 and r["actions_executed"] > 0
        lines = [l for l in s.log_lines() if l["proto"] == "grpc GetActions" and l["outcome"] == "ok"]
        assert len(lines) >= r["chunks_received"]
        picks = sorted({0, 1, r["chunks_received"] // 2, r["chunks_received"] - 1})
        for k in picks:
            c = r["chunks"][k]
            npz = obs_dir / f"obs_{c['observation']:05d}.npz"
            q = subprocess.run([BIN, "run", "--model", model("tiny-grid"), "--inputs", str(npz), "--seed", str(lines[k]["seed"]),
                                "--runs", "1", "--json"], capture_output=True, timeout=300)
            assert q.returncode == 0, q.stderr.decode()
            want = np.asarray(json.loads(q.stdout)["actions"], np.float32)
            got = np.asarray(c["actions"], np.float32)
            assert np.array_equal(got, want), (k, np.abs(got - want).max())
        # what it executed: rows of the chunks it received (latest_only), contiguous timesteps
        ts = [e["timestep"] for e in r["executed"]]
        assert ts == list(range(ts[0], ts[0] + len(ts)))
    finally:
        assert s.stop() == 0  # a clean drain (under ASan: no leak, no error)
