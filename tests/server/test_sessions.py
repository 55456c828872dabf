# SPDX-License-Identifier: Apache-2.0
"""Action timelines of websocket and HTTP sessions
(docs/SERVER.md "Sessions, action timelines and real-time chunking"): the request fields `executed` and `rtc`, the HTTP session from
`?session_id=`, `X-Session-Id` or the body's `session_id` (AllenAI's serve_policy.py sends it
there); a guided chunk replays with `molmoact run --rtc-prefix --rtc-delay` and the logged seed.

    MOLMOACT=build/molmoact /usr/bin/python3 -m pytest -q tests/server/test_sessions.py
"""
import asyncio
import base64
import json
import os
import subprocess
import sys
import tempfile
import urllib.request

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import openpi_client as oc  # noqa: E402
from test_server import BIN, IMG_PNG, PROMPT, STATE, Server, model, png_pixels  # noqa: E402


def jn(a):
    a = np.ascontiguousarray(a)
    return {"__numpy__": base64.b64encode(a.tobytes()).decode(), "dtype": a.dtype.str, "shape": list(a.shape)}


def post(s, body, query="", headers=None):
    req = urllib.request.Request(s.http + "/act" + query, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def actions_of(reply):
    a = reply["actions"]
    return np.frombuffer(base64.b64decode(a["__numpy__"]), a["dtype"]).reshape(a["shape"])


def body(state, **extra):
    b = {"image": jn(png_pixels(IMG_PNG)), "wrist_image": jn(png_pixels(IMG_PNG)), "state": jn(np.asarray(state, np.float32)),
         "instruction": PROMPT}
    b.update(extra)
    return b


def cli(state, seed, extra=()):
    st = ",".join(repr(float(np.float32(x))) for x in state)
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "o.npz")
        p = subprocess.run([BIN, "run", "--model", model("tiny-grid"), "--image0", IMG_PNG, "--image1", IMG_PNG, "--task", PROMPT,
                            "--state", st, "--seed", str(seed), "--runs", "1", "--json", "--out", out, *extra],
                           capture_output=True, timeout=300)
        assert p.returncode == 0, p.stderr.decode()
        z = np.load(out)
        return np.asarray(json.loads(p.stdout)["actions"], np.float32), z["trajectory"].astype(np.float32)


def replay_guided(state1, seed1, state2, seed2, executed, delay):
    _, traj1 = cli(state1, seed1)
    with tempfile.TemporaryDirectory() as d:
        pf = os.path.join(d, "prefix.npy")
        np.save(pf, np.ascontiguousarray(traj1[executed:, :7], np.float32))
        return cli(state2, seed2, ["--rtc-prefix", pf, "--rtc-delay", str(delay)])[0]


STATE2 = STATE + 0.05


@pytest.mark.parametrize("how", ["query", "header", "body"])
def test_http_session_guided_chunk_replays(how):
    s = Server("tiny-grid", "--seed", "3", "--fps", "200")
    try:
        q, h, extra = "", None, {}
        if how == "query":
            q = "?session_id=robot-1"
        elif how == "header":
            h = {"X-Session-Id": "robot-1"}
        else:
            extra = {"session_id": "robot-1"}
        code, r1 = post(s, body(STATE, **extra), q, h)
        assert code == 200, r1
        code, r2 = post(s, body(STATE2, executed=4, rtc=True, **extra), q, h)
        assert code == 200, r2
        lines = [l for l in s.log_lines() if l["proto"] == "http" and l["outcome"] == "ok"]
        assert "rtc" not in lines[0] and lines[1]["rtc"]["prefix_rows"] == 6, lines
        want = replay_guided(STATE, lines[0]["seed"], STATE2, lines[1]["seed"], 4, lines[1]["rtc"]["delay"])
        got = actions_of(r2)
        assert np.array_equal(got, want), np.abs(got - want).max()
        # without a session the same fields guide nothing (nothing was sent to it before)
        code, r3 = post(s, body(STATE2, executed=4, rtc=True))
        assert code == 200 and "rtc" not in s.log_lines()[-1]
        st = json.loads(urllib.request.urlopen(s.http + "/status.json", timeout=30).read())
        assert [e["session"] for e in st["sessions"]] == ["http:robot-1"] and st["sessions"][0]["requests"] == 2
    finally:
        assert s.stop() == 0  # a clean drain (under ASan: no leak, no error)


def test_http_session_id_refused_when_malformed():
    s = Server("tiny-grid")
    try:
        code, r = post(s, body(STATE), "?session_id=a%20b")
        assert code == 400 and "session_id" in r["error"]
        code, r = post(s, body(STATE, session_id="x" * 100))
        assert code == 400 and "session_id" in r["error"]
        code, r = post(s, body(STATE, executed=-1))
        assert code == 400 and "executed" in r["error"]
        code, r = post(s, body(STATE, rtc="yes"))
        assert code == 400 and "rtc" in r["error"]
        code, r = post(s, body(STATE, seed=True))
        assert code == 400 and "seed" in r["error"]
    finally:
        assert s.stop() == 0  # a clean drain (under ASan: no leak, no error)


def test_http_sessions_bounded():
    s = Server("tiny-grid", "--max-sessions", "2")
    try:
        for sid in ("a", "b", "c"):
            assert post(s, body(STATE), f"?session_id={sid}")[0] == 200
        st = json.loads(urllib.request.urlopen(s.http + "/status.json", timeout=30).read())
        assert sorted(e["session"] for e in st["sessions"]) == ["http:b", "http:c"]
        assert "session evicted" in s.logs()
    finally:
        assert s.stop() == 0  # a clean drain (under ASan: no leak, no error)


def test_websocket_session_guided_chunk_replays():
    s = Server("tiny-grid", "--seed", "5", "--fps", "200", "--rtc")
    try:
        obs1 = {"observation/image": png_pixels(IMG_PNG), "observation/wrist_image": png_pixels(IMG_PNG),
                "observation/state": STATE, "prompt": PROMPT}
        obs2 = dict(obs1, **{"observation/state": STATE2, "executed": 3})
        async def go():
            async with oc.Client(s.uri) as c:
                return [await c.infer(o) for o in (obs1, obs2)]
        r1, r2 = asyncio.run(go())
        lines = [l for l in s.log_lines() if l["proto"] == "ws" and l["outcome"] == "ok"]
        assert lines[1]["rtc"]["prefix_rows"] == 7  # --rtc: every request of the session
        want = replay_guided(STATE, lines[0]["seed"], STATE2, lines[1]["seed"], 3, lines[1]["rtc"]["delay"])
        assert np.array_equal(np.asarray(r2["actions"], np.float32), want)
    finally:
        assert s.stop() == 0  # a clean drain (under ASan: no leak, no error)


def test_reset_forgets_http_sessions():
    s = Server("tiny-grid")
    try:
        for sid in ("a", "b", "c"):
            assert post(s, body(STATE), f"?session_id={sid}")[0] == 200
        req = urllib.request.Request(s.http + "/reset?session_id=b", data=b"", method="POST")
        assert json.loads(urllib.request.urlopen(req, timeout=30).read()) == {"status": "ok", "removed": ["b"]}
        req = urllib.request.Request(s.http + "/reset", data=b"{}", method="POST")
        assert sorted(json.loads(urllib.request.urlopen(req, timeout=30).read())["removed"]) == ["a", "c"]
        st = json.loads(urllib.request.urlopen(s.http + "/status.json", timeout=30).read())
        assert st["sessions"] == []
    finally:
        assert s.stop() == 0  # a clean drain (under ASan: no leak, no error)
