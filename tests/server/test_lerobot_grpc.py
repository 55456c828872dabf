# SPDX-License-Identifier: Apache-2.0
"""`molmoact serve --grpc-port`: LeRobot's async-inference service (transport.AsyncInference), driven
by Debian's python3-grpcio with hand-encoded protobuf (the four messages are one varint and one bytes
field: lerobot 7427f318 src/lerobot/transport/services.proto:71-87), payloads pickled by Python's own
pickle from dataclasses laid out as lerobot/async_inference/helpers.py:201-273 lays them out (the
recorded payloads of LeRobot's own client are in tests/fixtures/lerobot_async and
tests/server/test_pickle_fixtures.py; the unmodified robot_client runs in test_lerobot_client.py when
a LeRobot checkout is given). Replies are unpickled by pickle.loads into TimedAction objects holding
torch tensors, and compared with `molmoact run` on the same observation and the seed the server logged.

    MOLMOACT=build/molmoact /usr/bin/python3 -m pytest -q tests/server/test_lerobot_grpc.py
"""
import dataclasses
import io
import json
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import time
import types

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_server import BIN, Server, free_port, model  # noqa: E402

SVC = "/transport.AsyncInference/"
JOINTS = [f"joint{i}.pos" for i in range(8)]
TASK = "put the bowl on the plate"


# ---- the LeRobot dataclasses, under their module's name (helpers.py:201-273), for pickle --------
def _helpers():
    name = "lerobot.async_inference.helpers"
    if name in sys.modules:
        return sys.modules[name]
    for pkg in ("lerobot", "lerobot.async_inference"):
        sys.modules.setdefault(pkg, types.ModuleType(pkg))
    m = types.ModuleType(name)

    @dataclasses.dataclass
    class TimedData:
        timestamp: float
        timestep: int

        def get_timestamp(self):
            return self.timestamp

        def get_timestep(self):
            return self.timestep

    @dataclasses.dataclass
    class TimedAction(TimedData):
        action: object

        def get_action(self):
            return self.action

    @dataclasses.dataclass
    class TimedObservation(TimedData):
        observation: dict
        must_go: bool = False

    @dataclasses.dataclass
    class RemotePolicyConfig:
        policy_type: str
        pretrained_name_or_path: str
        lerobot_features: dict
        actions_per_chunk: int
        device: str = "cpu"
        rename_map: dict = dataclasses.field(default_factory=dict)

    for c in (TimedData, TimedAction, TimedObservation, RemotePolicyConfig):
        c.__module__ = name
        c.__qualname__ = c.__name__
        setattr(m, c.__name__, c)
    sys.modules[name] = m
    return m


H = _helpers()


def features(cams=("image", "wrist_image"), names=JOINTS, size=(48, 64)):
    """what robot_client sends: hw_to_dataset_features(robot.observation_features, "observation")
    (lerobot/utils/feature_utils.py:84-99)"""
    f = {"observation.state": {"dtype": "float32", "shape": (len(names),), "names": list(names)}}
    for c in cams:
        f[f"observation.images.{c}"] = {"dtype": "image", "shape": (*size, 3), "names": ["height", "width", "channels"],
                                        "info": None}
    return f


def policy(**kw):
    args = dict(policy_type="molmoact2", pretrained_name_or_path="allenai/MolmoAct2-LIBERO", lerobot_features=features(),
                actions_per_chunk=10, device="cpu", rename_map={})
    args.update(kw)
    return pickle.dumps(H.RemotePolicyConfig(**args))


def frames(seed, size=(48, 64)):
    g = np.random.default_rng(seed)
    return g.integers(0, 256, (*size, 3), dtype=np.uint8), g.integers(0, 256, (*size, 3), dtype=np.uint8)


def raw_obs(seed, cams=("image", "wrist_image"), order=None):
    a, b = frames(seed)
    state = np.random.default_rng(seed + 1000).uniform(-1, 1, 8)
    o = {}
    for i in (order or range(8)):  # the robot dict's own order; the server takes names' order
        o[JOINTS[i]] = float(state[i])
    o[cams[0]], o[cams[1]] = a, b
    o["task"] = TASK
    return o, state, a, b


def obs_payload(seed, timestep=0, must_go=True, timestamp=100.0, protocol=4, **kw):
    o, state, a, b = raw_obs(seed, **kw)
    return pickle.dumps(H.TimedObservation(timestamp=timestamp, timestep=timestep, observation=o, must_go=must_go),
                        protocol=protocol), state, a, b


# ---- protobuf by hand (services.proto:71-87) ------------------------------------------------------
def varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def pb_bytes(field, data):
    return varint(field << 3 | 2) + varint(len(data)) + data


def observation_msg(state, data):
    return (varint(1 << 3) + varint(state) if state else b"") + pb_bytes(2, data)


def chunks(payload, size=2 * 1024 * 1024):
    """transport/utils.py:46-71: END alone when it fits, else BEGIN, MIDDLE..., END"""
    out, sent = [], 0
    while sent < len(payload):
        st = 3 if sent + size >= len(payload) else (1 if sent == 0 else 2)
        out.append(observation_msg(st, payload[sent:sent + size]))
        sent += size
    return out


def pb_field1(msg):
    if not msg:
        return b""
    assert msg[0] == 0x0A
    n, shift, i = 0, 0, 1
    while True:
        b = msg[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            break
    return msg[i:i + n]


class Client:
    def __init__(self, port):
        self.ch = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(self.ch).result(timeout=30)

    def unary(self, name, req=b"", timeout=60):
        return self.ch.unary_unary(SVC + name)(req, timeout=timeout)

    def ready(self):
        return self.unary("Ready")

    def policy(self, payload):
        return self.unary("SendPolicyInstructions", pb_bytes(1, payload))

    def observe(self, msgs):
        return self.ch.stream_unary(SVC + "SendObservations")(iter(msgs), timeout=60)

    def actions(self, timeout=120):
        return pb_field1(self.unary("GetActions", timeout=timeout))

    def close(self):
        self.ch.close()


def start(*args, variant="tiny-grid"):
    gport = free_port()
    s = Server(variant, "--grpc-port", str(gport), "--seed", "7", *args)
    return s, Client(gport)


def cli(variant, state, a, b, seed, extra=(), task=TASK):
    from PIL import Image
    with tempfile.TemporaryDirectory() as d:
        pa, pb = os.path.join(d, "a.png"), os.path.join(d, "b.png")
        Image.fromarray(a).save(pa)
        Image.fromarray(b).save(pb)
        st = ",".join(repr(float(np.float32(x))) for x in state)
        out = os.path.join(d, "out.npz")
        p = subprocess.run([BIN, "run", "--model", model(variant), "--image0", pa, "--image1", pb, "--task", task, "--state", st,
                            "--seed", str(seed), "--runs", "1", "--json", "--out", out, *extra], capture_output=True, timeout=300)
        assert p.returncode == 0, p.stderr.decode()
        z = np.load(out)
        return np.asarray(json.loads(p.stdout)["actions"], np.float32), z["trajectory"].astype(np.float32)


def grpc_lines(s):
    return [l for l in s.log_lines() if l["proto"].startswith("grpc GetActions") and l["outcome"].startswith("ok")]


# ---- the protocol ------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", [4, 5])
def test_session_equals_cli(protocol):
    s, c = start()
    try:
        c.ready()
        c.policy(policy())
        payload, state, a, b = obs_payload(1, timestep=5, timestamp=123.5, protocol=protocol, order=[3, 1, 0, 7, 2, 6, 4, 5])
        assert c.observe([observation_msg(3, payload)]) == b""  # an Empty
        data = c.actions()
        rows = pickle.loads(data)
        assert len(rows) == 10 and all(type(r).__name__ == "TimedAction" for r in rows)
        for i, r in enumerate(rows):  # row i: timestep + i, timestamp + i / fps (policy_server.py _time_action_chunk)
            assert r.get_timestep() == 5 + i
            assert abs(r.get_timestamp() - (123.5 + i / 30.0)) < 1e-9
            assert isinstance(r.get_action(), torch.Tensor) and r.get_action().dtype == torch.float32
            assert r.get_action().shape == (7,) and r.get_action().device.type == "cpu"
        got = np.stack([r.get_action().numpy() for r in rows])
        seed = grpc_lines(s)[-1]["seed"]  # logged as an integer, to replay the chunk
        want, _ = cli("tiny-grid", state, a, b, seed)
        assert np.array_equal(got, want), np.abs(got - want).max()
    finally:
        c.close()
        assert s.stop() == 0  # a clean drain (under ASan: no leak, no error)


def test_rename_map_chunking_and_actions_per_chunk():
    s, c = start()
    try:
        c.ready()
        c.policy(policy(lerobot_features=features(cams=("front", "hand")), actions_per_chunk=4,
                        rename_map={"observation.images.front": "observation.images.image",
                                    "observation.images.hand": "observation.images.wrist_image"}))
        payload, state, a, b = obs_payload(2, timestep=0, cams=("front", "hand"))
        c.observe(chunks(payload, size=4096))  # BEGIN, MIDDLE..., END
        rows = pickle.loads(c.actions())
        assert [r.get_timestep() for r in rows] == [0, 1, 2, 3]
        seed = grpc_lines(s)[-1]["seed"]
        want, _ = cli("tiny-grid", state, a, b, seed)
        assert np.array_equal(np.stack([r.get_action().numpy() for r in rows]), want[:4])
    finally:
        c.close()
        assert s.stop() == 0  # a clean drain (under ASan: no leak, no error)


def test_refused_policy_instructions_name_the_field():
    s, c = start()
    try:
        c.ready()
        cases = [(dict(policy_type="act"), "policy_type"),
                 (dict(actions_per_chunk=11), "actions_per_chunk"),
                 (dict(lerobot_features=features(names=JOINTS[:7])), "7 joint names"),
                 (dict(lerobot_features=features(cams=("front", "wrist_image"))), "observation.images.image"),
                 (dict(lerobot_features={**features(), "action": {"dtype": "float32", "shape": (6,), "names": None}}), "action")]
        for kw, word in cases:
            with pytest.raises(grpc.RpcError) as e:
                c.policy(policy(**kw))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and word in e.value.details(), e.value.details()
        with pytest.raises(grpc.RpcError) as e:  # observations before any policy instructions
            c.observe([observation_msg(3, obs_payload(3)[0])])
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        c.policy(policy())  # the model is still served
        c.observe([observation_msg(3, obs_payload(3)[0])])
        assert len(pickle.loads(c.actions())) == 10
    finally:
        c.close()
        assert s.stop() == 0  # a clean drain (under ASan: no leak, no error)


def test_get_actions_long_poll_and_empty_reply():
    s, c = start("--lerobot-obs-timeout-s", "0.5")
    try:
        c.ready()
        c.policy(policy())
        t = time.time()
        assert c.actions() == b""  # nothing came within the timeout: an empty Actions
        assert 0.4 < time.time() - t < 5
    finally:
        c.close()
        assert s.stop() == 0  # a clean drain (under ASan: no leak, no error)


def test_transfer_states_refused():
    s, c = start()
    try:
        c.ready()
        c.policy(policy())
        payload = obs_payload(4)[0]
        for msgs, word in [([observation_msg(0, payload)], "transfer_state"),
                           ([observation_msg(1, payload[:100])], "TRANSFER_END"),
                           ([observation_msg(3, payload[:-5])], "")]:
            with pytest.raises(grpc.RpcError) as e:
                c.observe(msgs)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and word in e.value.details()
    finally:
        c.close()
        assert s.stop() == 0  # a clean drain (under ASan: no leak, no error)


# ---- hostile pickles: refused, nothing runs, the server keeps serving -----------------------------
def hostile(marker):
    cmd = f"touch {marker}".encode()
    yield b"\x80\x04" + b"cos\nsystem\n" + b"(" + b"X" + struct.pack("<I", len(cmd)) + cmd + b"tR."  # GLOBAL os.system + REDUCE
    yield b"\x80\x04" + b"\x8c\x08builtins\x8c\x04eval\x93" + b"\x8c" + bytes([len(cmd)]) + cmd + b"\x85R."
    yield b"\x80\x04" + b"\x8c\nsubprocess\x8c\x05Popen\x93" + b"\x8c\x05touch\x85R."
    yield b"\x80\x04" + b"\x8c\x05posix\x8c\x06system\x93" + b"\x8c\x05touch\x85R."
    yield b"\x80\x04" + b"(" * 200000 + b"."  # deep nesting
    yield b"\x80\x04" + b"]" * 100000 + b"."
    yield b"\x80\x05\x8e" + struct.pack("<Q", 1 << 62) + b"x"  # BINBYTES8 claiming 2^62 bytes
    yield b"\x80\x04\x95" + struct.pack("<Q", 1 << 40) + b"N."  # FRAME claiming a terabyte
    good = obs_payload(5)[0]
    for cut in (1, 2, 10, len(good) // 2, len(good) - 1):  # truncated
        yield good[:cut]


def test_hostile_pickles_are_refused():
    s, c = start()
    marker = os.path.join(tempfile.mkdtemp(), "pwned")
    try:
        c.ready()
        c.policy(policy())
        for p in hostile(marker):
            with pytest.raises(grpc.RpcError) as e:
                c.observe(chunks(p))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
            with pytest.raises(grpc.RpcError) as e:
                c.policy(p)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert not os.path.exists(marker)
        c.observe([observation_msg(3, obs_payload(6)[0])])  # still serving
        assert len(pickle.loads(c.actions())) == 10
        assert s.p.poll() is None
    finally:
        c.close()
        assert s.stop() == 0  # a clean drain (under ASan: no leak, no error)


# ---- real-time chunking across a session ---------------------------------------------------------
def test_rtc_session_replays_with_cli():
    """Two observations of one LeRobot session with --rtc: the second chunk is guided toward what is
    left of the first (rows from its timestep on), with the delay the server predicted; `molmoact run`
    with that prefix, delay and the logged seed gives the same chunk."""
    s, c = start("--rtc", "--fps", "1000")
    try:
        c.ready()
        c.policy(policy())
        p1, st1, a1, b1 = obs_payload(7, timestep=10)
        c.observe([observation_msg(3, p1)])
        rows1 = pickle.loads(c.actions())
        p2, st2, a2, b2 = obs_payload(8, timestep=13, must_go=False)
        c.observe([observation_msg(3, p2)])
        rows2 = pickle.loads(c.actions())
        lines = grpc_lines(s)
        seed1, seed2 = lines[-2]["seed"], lines[-1]["seed"]
        m = [l for l in lines if "rtc" in l["outcome"]]
        assert m, lines
        d = int(m[-1]["outcome"].split("rtc: d ")[1].split()[0])
        _, traj1 = cli("tiny-grid", st1, a1, b1, seed1)
        want1, _ = cli("tiny-grid", st1, a1, b1, seed1)
        assert np.array_equal(np.stack([r.get_action().numpy() for r in rows1]), want1)
        left = traj1[3:, :7]  # rows of chunk 1 from timestep 13 on (n_obs_steps 1)
        with tempfile.TemporaryDirectory() as dd:
            pf = os.path.join(dd, "prefix.npy")
            np.save(pf, np.ascontiguousarray(left, np.float32))
            want2, _ = cli("tiny-grid", st2, a2, b2, seed2, ["--rtc-prefix", pf, "--rtc-delay", str(d)])
            unguided, _ = cli("tiny-grid", st2, a2, b2, seed2)
        got2 = np.stack([r.get_action().numpy() for r in rows2])
        assert np.array_equal(got2, want2), np.abs(got2 - want2).max()
        assert not np.array_equal(got2, unguided)  # the guidance changed the chunk
    finally:
        c.close()
        assert s.stop() == 0  # a clean drain (under ASan: no leak, no error)


# ---- payloads recorded from LeRobot's own code (tests/fixtures/lerobot_async/README.md) -----------
FIX = os.path.join(HERE, "..", "fixtures", "lerobot_async")


def _recorded_observation(name):
    e = json.load(open(os.path.join(FIX, "expected.json")))[name]["expect"]["state"]["dict"]
    obs = dict((k["str"], v) for k, v in e)["observation"]["dict"]
    joints, cams, task = [], {}, None
    for k, v in obs:
        if "float" in v:
            joints.append((k["str"], struct.unpack(">d", bytes.fromhex(v["float"]))[0]))
        elif "array" in v:
            cams[k["str"]] = np.frombuffer(bytes.fromhex(v["data"]), np.uint8).reshape(v["shape"])
        elif "str" in v:
            task = v["str"]
    return joints, cams, task


def safe_actions(data):
    """PR #3048's reply (safe_serialization.py at edbf384: a big-endian u32 JSON length, the JSON,
    then safetensors: a little-endian u64 header length, the header, the tensors' bytes)"""
    n = struct.unpack(">I", data[:4])[0]
    head = json.loads(data[4:4 + n])
    st = data[4 + n:]
    hn = struct.unpack("<Q", st[:8])[0]
    th = json.loads(st[8:8 + hn])
    body = st[8 + hn:]
    rows = []
    for i, a in enumerate(head["actions"]):
        t = th[f"action_{i}"]
        assert t["dtype"] == "F32"
        lo, hi = t["data_offsets"]
        rows.append((a["timestep"], a["timestamp"], np.frombuffer(body[lo:hi], "<f4").reshape(t["shape"])))
    assert head["type"] == "TimedActions"
    return rows


@pytest.mark.parametrize("name", ["observation_p4.pkl", "observation_p5.pkl", "observation_p4_numpy2.pkl",
                                  "observation_p5_numpy2.pkl", "observation_pr3048.bin"])
def test_recorded_lerobot_observations(name):
    """Observations pickled (or PR #3048-serialised) by LeRobot's own code, over gRPC: the chunk equals
    `molmoact run` on the values they hold; a PR #3048 observation is answered in PR #3048's format."""
    joints, cams, task = _recorded_observation(name)
    s, c = start()
    try:
        c.ready()
        c.policy(policy(lerobot_features=features(cams=("front", "wrist"), names=[j for j, _ in joints], size=(24, 32)),
                        rename_map={"observation.images.front": "observation.images.image",
                                    "observation.images.wrist": "observation.images.wrist_image"}))
        c.observe(chunks(open(os.path.join(FIX, name), "rb").read()))
        data = c.actions()
        if name.endswith(".bin"):
            rows = safe_actions(data)
            got = np.stack([r[2] for r in rows])
            assert [r[0] for r in rows] == list(range(17, 27))
        else:
            rows = pickle.loads(data)
            got = np.stack([r.get_action().numpy() for r in rows])
            assert [r.get_timestep() for r in rows] == list(range(17, 27))
        want, _ = cli("tiny-grid", [v for _, v in joints], cams["front"], cams["wrist"], grpc_lines(s)[-1]["seed"], task=task)
        assert np.array_equal(got, want), np.abs(got - want).max()
    finally:
        c.close()
        assert s.stop() == 0  # a clean drain (under ASan: no leak, no error)


def test_recorded_policy_configs_and_torch_replies():
    """LeRobot's own RemotePolicyConfig pickles (policy "act", 50 actions per chunk) are read and
    refused for what they ask; a pickle of torch tensors (LeRobot's reply) is refused naming torch."""
    s, c = start("--lerobot-policy-types", "molmoact2,act")
    try:
        c.ready()
        for name in ("config_p4.pkl", "config_p5.pkl", "config_pr3048.bin"):
            with pytest.raises(grpc.RpcError) as e:
                c.policy(open(os.path.join(FIX, name), "rb").read())
            assert "actions_per_chunk 50" in e.value.details(), e.value.details()
        c.policy(policy())
        with pytest.raises(grpc.RpcError) as e:
            c.observe(chunks(open(os.path.join(FIX, "actions_torch_p4.pkl"), "rb").read()))
        assert "torch" in e.value.details()
    finally:
        c.close()
        assert s.stop() == 0  # a clean drain (under ASan: no leak, no error)


def test_sessions_on_metrics_and_status_page():
    """A LeRobot client's session on /metrics (per-session latency and delay in control ticks, the
    RTC counters) and on the status page, as /status.json has it."""
    import shutil
    import urllib.request
    from prometheus_client.parser import text_string_to_metric_families
    s, c = start("--rtc", "--fps", "50")
    try:
        c.ready()
        c.policy(policy())
        for i, step in enumerate((0, 2, 4)):
            c.observe([observation_msg(3, obs_payload(20 + i, timestep=step, must_go=False)[0])])
            assert len(pickle.loads(c.actions())) == 10
        st = json.loads(urllib.request.urlopen(s.http + "/status.json", timeout=30).read())
        sess = [e for e in st["sessions"] if e["session"].startswith("grpc:")]
        assert len(sess) == 1 and sess[0]["requests"] == 3 and sess[0]["fps"] == 50, st["sessions"]
        assert sess[0]["latency_p95_ms"] >= sess[0]["latency_p50_ms"] > 0 and sess[0]["delay_ticks"] >= 1
        assert "rtc_delay_predicted" in sess[0]
        fams = {f.name: f for f in text_string_to_metric_families(urllib.request.urlopen(s.http + "/metrics", timeout=30).read().decode())}
        lat = [x for x in fams["molmoact_session_latency_p95_ms"].samples if x.labels["session"] == sess[0]["session"]]
        assert len(lat) == 1 and abs(lat[0].value - sess[0]["latency_p95_ms"]) < 1e-3
        assert fams["molmoact_rtc_guided"].samples[0].value == 2  # the 2nd and 3rd chunks had rows left
        assert fams["molmoact_requests"].samples[-1].labels["protocol"] == "grpc"
        assert sum(x.value for x in fams["molmoact_requests"].samples if x.labels["protocol"] == "grpc") == 3
        assert [x for x in fams["molmoact_delay_ticks"].samples if x.name.endswith("_count")][0].value == 3
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        if chromium:
            dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=4000", "--dump-dom",
                                  s.http + "/"], capture_output=True, timeout=120).stdout.decode()
            assert sess[0]["session"] in dom, dom[-3000:]
    finally:
        c.close()
        assert s.stop() == 0  # a clean drain (under ASan: no leak, no error)


def test_similarity_filter_and_already_run_timesteps():
    """LeRobot's similarity filter, off by default, on with --lerobot-similarity-atol: a state within
    atol of the last one run is dropped (counted, logged) unless must_go; a timestep already run is
    skipped unless must_go (policy_server.py _obs_sanity_checks)"""
    s, c = start("--lerobot-similarity-atol", "1e6", "--lerobot-obs-timeout-s", "0.3")
    try:
        c.ready()
        c.policy(policy())
        c.observe([observation_msg(3, obs_payload(30, timestep=0)[0])])
        assert len(pickle.loads(c.actions())) == 10
        c.observe([observation_msg(3, obs_payload(31, timestep=4, must_go=False)[0])])  # similar: dropped
        assert c.actions() == b""
        c.observe([observation_msg(3, obs_payload(32, timestep=5, must_go=True)[0])])  # must_go: run
        assert [r.get_timestep() for r in pickle.loads(c.actions())][0] == 5
        log = s.logs()
        assert "filtered: the state is within --lerobot-similarity-atol" in log
    finally:
        c.close()
        assert s.stop() == 0
    s, c = start("--lerobot-obs-timeout-s", "0.3")  # off by default: nothing is similar
    try:
        c.ready()
        c.policy(policy())
        for step, want in ((0, True), (0, False), (3, True)):
            c.observe([observation_msg(3, obs_payload(40 + step, timestep=step, must_go=False)[0])])
            assert (c.actions() != b"") == want, step  # timestep 0 again: already run, skipped
        c.observe([observation_msg(3, obs_payload(50, timestep=3, must_go=True)[0])])  # must_go runs it again
        assert c.actions() != b""
        assert "skipped: timestep 0 was already run" in s.logs()
    finally:
        c.close()
        assert s.stop() == 0


def test_api_key_per_call():
    """With --api-key-file every gRPC call needs the key as metadata (decided once per call);
    another service or content type is refused"""
    key = tempfile.NamedTemporaryFile("w", delete=False)
    key.write("s3cret\n")
    key.close()
    s, c = start("--api-key-file", key.name)
    try:
        for md, code in [(None, grpc.StatusCode.UNAUTHENTICATED), ((("authorization", "Bearer nope"),), grpc.StatusCode.UNAUTHENTICATED)]:
            with pytest.raises(grpc.RpcError) as e:
                c.ch.unary_unary(SVC + "Ready")(b"", timeout=30, metadata=md)
            assert e.value.code() == code and "key" in e.value.details()
        for auth in ("Bearer s3cret", "Api-Key s3cret"):
            assert c.ch.unary_unary(SVC + "Ready")(b"", timeout=30, metadata=(("authorization", auth),)) == b""
        with pytest.raises(grpc.RpcError) as e:
            c.ch.unary_unary("/other.Service/Ready")(b"", timeout=30, metadata=(("authorization", "Bearer s3cret"),))
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        lines = [l for l in s.log_lines() if "unauthorized" in l["outcome"]]
        assert len(lines) == 2
    finally:
        c.close()
        assert s.stop() == 0
        os.unlink(key.name)
