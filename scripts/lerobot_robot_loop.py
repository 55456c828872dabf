#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Drive LeRobot's own, unmodified async-inference RobotClient against a policy server, with a
simulated robot, and report what the robot executed.

    /usr/bin/python3 scripts/lerobot_robot_loop.py --lerobot-src ~/lerobot --server 127.0.0.1:8080 \
        --policy-type molmoact2 --pretrained /models/libero --ticks 150 --out run.json [--save-obs DIR]

What runs is LeRobot's code, imported from --lerobot-src (a checkout; its src/ is used when present)
or from an installed `lerobot`: src/lerobot/async_inference/robot_client.py (RobotClient: start,
receive_actions, control_loop, send_observation, _aggregate_action_queues), helpers.py, configs.py
(RobotClientConfig, the aggregate functions), constants.py, transport/utils.py and
utils/feature_utils.py. Nothing of LeRobot is copied here. This script only

  * builds RobotClientConfig and RobotClient directly (no draccus CLI) and runs them the way
    robot_client.py's async_client() does: start() (Ready, then SendPolicyInstructions), a daemon
    thread on receive_actions(), control_loop(task) on the main thread, stop() in `finally`;
  * hands RobotClient a simulated robot by replacing the module global `make_robot_from_config`
    of robot_client (the one place where RobotClient builds its robot);
  * wraps a few instance methods to *observe* the loop without changing what it does:
    actions_available (one call per control tick: counts ticks, starved ticks, and ends the run
    after --ticks / --duration-s by setting shutdown_event, as a Ctrl-C would end control_loop),
    control_loop_action (which timestep was executed), send_observation (what was sent),
    _aggregate_action_queues (what chunks arrived) and stub.GetActions (reply sizes, empty replies).

Stand-ins (Debian 12 only). Where an import of the real module fails, and only then, this script
generates a minimal stand-in into a temporary directory at run time and loads it under the module's
name; each is labelled "STAND-IN" and listed in the report (`lerobot.stand_ins`). They exist because
Debian 12 lacks packages a LeRobot install brings (draccus, huggingface_hub, a protobuf >= 6 runtime,
grpcio >= 1.73, opencv/zmq/serial for lerobot.robots/cameras, the policies' dependencies):
  - draccus: `wrap()` (identity) and `choice_types.ChoiceRegistry` (an empty class);
  - huggingface_hub.constants: HF_HOME only (read by lerobot/utils/constants.py);
  - lerobot.transport.services_pb2 / services_pb2_grpc: regenerated from the checkout's own
    transport/services.proto with protoc + grpc_python_plugin (Debian: protobuf-compiler,
    protobuf-compiler-grpc), because the checked-in gencode needs protobuf 6.31 / grpcio 1.73;
  - lerobot.configs: a package whose path is the real configs/ directory, re-exporting the real
    configs.types.FeatureType / PolicyFeature (the real __init__ pulls in the training configs);
  - lerobot.policies: the six config names helpers.py imports for registration, as empty classes;
  - lerobot.robots (+ .config, .robot and the robot submodule names robot_client.py imports),
    lerobot.cameras.opencv, lerobot.cameras.zmq.configuration_zmq: empty placeholders (the robot is
    the simulated one below in every case).
On a real LeRobot install (Python >= 3.12, `pip install lerobot[async]`) none of them is used.

WHAT A SERVER MUST DO FOR THIS CLIENT (read from robot_client.py / helpers.py / transport/utils.py
at huggingface/lerobot 7427f31801f944f5ec9ce53cda02862ce7d1638b; line numbers at that commit):
 1. Channel: insecure (h2c) gRPC, service `transport.AsyncInference`; the client's channel options
    (transport/utils.py grpc_channel_options) cap messages at 4 MiB both ways and retry
    UNAVAILABLE / DEADLINE_EXCEEDED up to 5 attempts with initial backoff 1/fps.
 2. Order: `Ready(Empty)` then `SendPolicyInstructions(PolicySetup{data=pickle(RemotePolicyConfig)})`
    (robot_client.py start(), :161 and :176), both before any other call. Any RpcError in either
    makes start() return False and the client exits without running (async_client: `if client.start()`).
    RemotePolicyConfig(policy_type, pretrained_name_or_path, lerobot_features, actions_per_chunk,
    device, rename_map={}) - the client never validates policy_type (the server does, against
    SUPPORTED_POLICIES, which lacks "molmoact2" at that commit) and never sets rename_map or fps.
 3. Then, concurrently on one HTTP/2 connection:
    - a GetActions(Empty) loop with NO deadline (:291). A reply whose `data` is empty -> `continue`,
      i.e. the client calls again at once: the server must hold the call (LeRobot: up to
      obs_queue_timeout = 2 s waiting for an observation) instead of answering empty immediately,
      or the client spins. An RpcError is logged and the loop also retries at once (:371-372).
    - one client-streaming SendObservations call per observation (send_observation, :209-220),
      the pickle cut by send_bytes_in_chunks into <= 2 MiB messages (END only when <= 2 MiB;
      BEGIN, [MIDDLE...], END above). The reply (Empty) is ignored; an RpcError loses that
      observation (logged).
 4. Reply `Actions.data` = pickle of a list of lerobot.async_inference.helpers.TimedAction (the class
    must resolve on the client). The client reads only: len(list); element [0].get_action().device.type;
    per element get_timestep() and get_action() (a torch.Tensor indexed [i].item() for i in
    range(len(robot.action_features)) - a row shorter than the robot's action features raises
    IndexError in control_loop_action, which is not guarded: the control loop dies). get_timestamp()
    is only logged (verbose). A pickled EMPTY list is not ignored: _aggregate_action_queues replaces
    the queue with an empty one (drops all queued actions) and must_go is re-armed.
 5. Labels: row i of the chunk answering observation o must have timestep = o.timestep + i
    (LeRobot: _time_action_chunk; timestamp = o.timestamp + i/server_fps). The client drops every
    row whose timestep <= the last executed timestep (:259), and o.timestep = max(last executed, 0)
    at capture (:435), so row 0 is never executed except for the very first chunk (last executed
    = -1), and rows that elapsed during inference are skipped - this is the latency compensation.
    Rows for timesteps already queued are merged with aggregate_fn(old, new) (configs.py
    AGGREGATE_FUNCTIONS; latest_only keeps the new one); queued timesteps NOT in the new chunk are
    discarded (the queue is replaced, :279-280). The chunk length seen (max over replies) is the
    denominator of the send threshold: an observation is sent on a tick when
    qsize / max_chunk_len <= chunk_size_threshold (:416-419). Before the first chunk that is
    0 / -1 -> true on EVERY tick: the client sends one observation per tick (timestep 0) until a
    chunk arrives, so the server must keep only the newest pending observation (LeRobot: a queue of
    size 1, the older one replaced) rather than queue them all.
 6. must_go (TimedObservation.must_go, :441-442) = the client's must_go event is set AND its action
    queue is empty at capture. The event is set at start and after every non-empty GetActions
    reply, and cleared after a must_go observation is sent. LeRobot's server always enqueues a
    must_go observation, bypassing its filters (timestep already predicted; joint-state L2 distance
    to the last processed observation < 1, helpers.observations_similar); the client relies on that
    to get out of an empty queue - a server that filters must never filter a must_go observation.
 7. Raw observation = the robot's get_observation() dict (joint floats by name, cameras as HxWxC
    uint8 numpy arrays) plus "task": str; lerobot_features (hw_to_dataset_features) says which keys
    form observation.state (names, in order) and observation.images.<camera>.
 8. Shutdown: the client closes the channel; the parked GetActions is cancelled by the client.
"""
import argparse
import importlib
import importlib.util
import json
import math
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import types
from dataclasses import dataclass

import numpy as np

STAND_IN_HEADER = ("# STAND-IN generated by molmoact scripts/lerobot_robot_loop.py for a package Debian 12 lacks;\n"
                   "# not LeRobot code. Used only because importing the real module failed.\n")

# ------------------------------------------------------------------------------------------------
# Locating LeRobot and, where needed, the stand-ins
# ------------------------------------------------------------------------------------------------

_STANDINS = {
    "draccus": (
        "def wrap(*args, **kwargs):\n"
        "    return lambda fn: fn\n", None),
    "draccus.choice_types": (
        "class ChoiceRegistry:\n"
        "    pass\n", None),
    "huggingface_hub": ("", None),
    "huggingface_hub.constants": (
        "import os\n"
        "HF_HOME = os.path.expanduser(os.getenv('HF_HOME', os.path.join(os.getenv('XDG_CACHE_HOME', '~/.cache'),"
        " 'huggingface')))\n", None),
    # a package over the real configs/ directory; only the names async_inference and feature_utils use
    "lerobot.configs": (
        "from lerobot.configs.types import FeatureType, PolicyFeature, NormalizationMode\n", "configs"),
    "lerobot.policies": (
        "class ACTConfig: pass\nclass DiffusionConfig: pass\nclass PI0Config: pass\nclass PI05Config: pass\n"
        "class SmolVLAConfig: pass\nclass VQBeTConfig: pass\n", None),
    "lerobot.robots.config": ("class RobotConfig:\n    pass\n", None),
    "lerobot.robots.robot": ("class Robot:\n    pass\n", None),
    "lerobot.robots": (
        "import types\n"
        "from lerobot.robots.config import RobotConfig\n"
        "from lerobot.robots.robot import Robot\n"
        "def make_robot_from_config(config):\n"
        "    raise RuntimeError('stand-in: lerobot_robot_loop.py supplies the simulated robot')\n"
        "for _n in ('bi_so_follower', 'koch_follower', 'omx_follower', 'so_follower', 'unitree_g1'):\n"
        "    globals()[_n] = types.ModuleType('lerobot.robots.' + _n)\n", None),
    "lerobot.cameras": ("", None),
    "lerobot.cameras.opencv": ("class OpenCVCameraConfig:\n    pass\n", None),
    "lerobot.cameras.zmq": ("", None),
    "lerobot.cameras.zmq.configuration_zmq": ("class ZMQCameraConfig:\n    pass\n", None),
}


class LeRobotEnv:
    """Imports LeRobot's async-inference modules; records which stand-ins were needed."""

    def __init__(self, lerobot_src=None, log=None):
        self.log = log or (lambda msg: print(msg, file=sys.stderr))
        self.stand_ins = []
        self.tmp = None
        self.pkg_dir = None
        if lerobot_src:
            src = os.path.abspath(os.path.expanduser(lerobot_src))
            root = os.path.join(src, "src") if os.path.isdir(os.path.join(src, "src", "lerobot")) else src
            if not os.path.isfile(os.path.join(root, "lerobot", "__init__.py")):
                raise SystemExit(f"--lerobot-src {lerobot_src}: no lerobot/__init__.py under it or its src/")
            sys.path.insert(0, root)
        try:
            import lerobot  # noqa: F401
        except ImportError as e:
            raise SystemExit(f"lerobot is not importable ({e}); give --lerobot-src DIR (a lerobot checkout)")
        self.pkg_dir = os.path.dirname(os.path.abspath(sys.modules["lerobot"].__file__))
        try:
            self.robot_client = importlib.import_module("lerobot.async_inference.robot_client")
            self.mode = "real"
        except Exception as e:  # noqa: BLE001 - any failure: fall back to stand-ins
            self.log(f"[lerobot_robot_loop] real lerobot.async_inference.robot_client failed to import "
                     f"({type(e).__name__}: {e}); using stand-ins for what is missing")
            for name in [n for n in sys.modules if n == "lerobot.async_inference" or
                         n.startswith("lerobot.async_inference.")]:
                del sys.modules[name]
            self._install_stand_ins()
            self.robot_client = importlib.import_module("lerobot.async_inference.robot_client")
            self.mode = "stand-ins" if self.stand_ins else "real"
        self.helpers = importlib.import_module("lerobot.async_inference.helpers")
        self.configs = importlib.import_module("lerobot.async_inference.configs")
        self.constants = importlib.import_module("lerobot.async_inference.constants")
        self.transport_utils = importlib.import_module("lerobot.transport.utils")
        self.services_pb2 = importlib.import_module("lerobot.transport.services_pb2")
        self.services_pb2_grpc = importlib.import_module("lerobot.transport.services_pb2_grpc")

    # -- helpers ----------------------------------------------------------------------------------
    def _tmpdir(self):
        if self.tmp is None:
            self.tmp = tempfile.mkdtemp(prefix="lerobot_standins_")
        return self.tmp

    def _try_real(self, name):
        try:
            importlib.import_module(name)
            return True
        except Exception:  # noqa: BLE001
            return False

    def _load_file(self, name, path, search=None):
        spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=search)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        parent, _, leaf = name.rpartition(".")
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        if parent and parent in sys.modules:
            setattr(sys.modules[parent], leaf, mod)
        return mod

    def _stand_in(self, name):
        body, real_subdir = _STANDINS[name]
        path = os.path.join(self._tmpdir(), "standin_" + name.replace(".", "_") + ".py")
        with open(path, "w") as f:
            f.write(STAND_IN_HEADER + body)
        search = None
        if real_subdir is not None:
            search = [os.path.join(self.pkg_dir, real_subdir)]
        elif any(k.startswith(name + ".") for k in _STANDINS):
            search = []  # a package: its stand-in submodules are registered by name
        self._load_file(name, path, search)
        self.stand_ins.append(name)

    def _ensure(self, name):
        if not self._try_real(name):
            self._stand_in(name)

    def _generate_grpc(self):
        proto = os.path.join(self.pkg_dir, "transport", "services.proto")
        out = os.path.join(self._tmpdir(), "gen")
        os.makedirs(os.path.join(out, "lerobot", "transport"), exist_ok=True)
        shutil.copyfile(proto, os.path.join(out, "lerobot", "transport", "services.proto"))
        plugin = shutil.which("grpc_python_plugin")
        protoc = shutil.which("protoc")
        if not plugin or not protoc:
            raise SystemExit("the checked-in services_pb2 does not import here and protoc / grpc_python_plugin are "
                             "missing (Debian: apt install protobuf-compiler protobuf-compiler-grpc)")
        subprocess.run([protoc, "-I", out, f"--python_out={out}", f"--grpc_python_out={out}",
                        f"--plugin=protoc-gen-grpc_python={plugin}", "lerobot/transport/services.proto"],
                       check=True)
        for leaf in ("services_pb2", "services_pb2_grpc"):
            path = os.path.join(out, "lerobot", "transport", leaf + ".py")
            with open(path) as f:
                code = f.read()
            with open(path, "w") as f:
                f.write(STAND_IN_HEADER.replace("for a package Debian 12 lacks", "from LeRobot's own "
                        "transport/services.proto with Debian's protoc/grpc_python_plugin") + code)
            self._load_file("lerobot.transport." + leaf, path)
            self.stand_ins.append("lerobot.transport." + leaf + " (regenerated)")

    def _install_stand_ins(self):
        for name in ("draccus", "draccus.choice_types", "huggingface_hub", "huggingface_hub.constants"):
            if name.startswith("draccus.") and "draccus" not in self.stand_ins:
                continue  # real draccus present: its submodule is real too
            if name.startswith("huggingface_hub.") and "huggingface_hub" not in self.stand_ins:
                continue
            self._ensure(name)
        if "draccus.choice_types" in self.stand_ins:
            sys.modules["draccus"].choice_types = sys.modules["draccus.choice_types"]
        if not self._try_real("lerobot.transport"):
            raise SystemExit("lerobot.transport does not import (is grpc installed? Debian: python3-grpcio)")
        if not (self._try_real("lerobot.transport.services_pb2") and
                self._try_real("lerobot.transport.services_pb2_grpc")):
            for leaf in ("services_pb2", "services_pb2_grpc"):
                sys.modules.pop("lerobot.transport." + leaf, None)
            self._generate_grpc()
        self._ensure("lerobot.configs")
        self._ensure("lerobot.policies")
        if not self._try_real("lerobot.robots"):
            for name in ("lerobot.robots.config", "lerobot.robots.robot", "lerobot.robots"):
                sys.modules.pop(name, None)
                self._stand_in(name)
        for name in ("lerobot.cameras.opencv", "lerobot.cameras.zmq.configuration_zmq"):
            if not self._try_real(name):
                for part in ("lerobot.cameras", "lerobot.cameras.zmq"):
                    if part in name and part not in self.stand_ins and not self._try_real(part):
                        self._stand_in(part)
                self._stand_in(name)

    def cleanup(self):
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)


# ------------------------------------------------------------------------------------------------
# The simulated robot
# ------------------------------------------------------------------------------------------------

@dataclass
class SimRobotConfig:
    """Not a LeRobot RobotConfig: RobotClient only passes it to make_robot_from_config (replaced)."""
    seed: int = 0
    height: int = 256
    width: int = 256
    state_dim: int = 8
    action_dim: int = 7
    state_mode: str = "random"  # random: a fresh state each frame (never "similar"); static: constant
    state_scale: float = 10.0
    type: str = "molmoact_sim"
    id: str = "sim"


class SimRobot:
    """Two cameras ("image", "wrist_image": HxWx3 uint8, the LIBERO names) and state_dim joint floats.
    Frame k (the k-th get_observation call) is a pure function of (seed, k); send_action records."""
    name = "molmoact_sim"

    def __init__(self, config):
        self.config = config
        self.joints = [f"joint{i}.pos" for i in range(config.state_dim)]
        self.action_names = [f"action{i}" for i in range(config.action_dim)]
        self.cameras = ["image", "wrist_image"]
        base = np.random.default_rng([config.seed, 0xCA])
        self._base = {c: base.integers(0, 256, (config.height, config.width, 3), dtype=np.uint8) for c in self.cameras}
        self.frames = 0
        self.executed = []  # [(time.time(), [floats])]
        self.connected = False
        self._lock = threading.Lock()

    @property
    def observation_features(self):
        feats = {j: float for j in self.joints}
        for c in self.cameras:
            feats[c] = (self.config.height, self.config.width, 3)
        return feats

    @property
    def action_features(self):
        return {a: float for a in self.action_names}

    @property
    def is_connected(self):
        return self.connected

    def connect(self, calibrate=True):
        self.connected = True

    def disconnect(self):
        self.connected = False

    def frame(self, k):
        """The observation of frame k (without "task"), exactly as get_observation returned it."""
        cfg = self.config
        if cfg.state_mode == "static":
            state = np.random.default_rng([cfg.seed, 0x57]).uniform(-1, 1, cfg.state_dim) * cfg.state_scale
        else:
            state = np.random.default_rng([cfg.seed, 0x57, k]).uniform(-1, 1, cfg.state_dim) * cfg.state_scale
        obs = {j: float(v) for j, v in zip(self.joints, state)}
        for i, c in enumerate(self.cameras):
            obs[c] = np.ascontiguousarray(np.roll(self._base[c], shift=(3 * k + 5 * i) % cfg.width, axis=1))
        return obs

    def get_observation(self):
        with self._lock:
            k = self.frames
            self.frames += 1
            self.last_frame = k
        return self.frame(k)

    def send_action(self, action):
        vals = [float(action[a]) for a in self.action_names]
        with self._lock:
            self.executed.append((time.time(), vals))
        return action


# ------------------------------------------------------------------------------------------------
# Running RobotClient
# ------------------------------------------------------------------------------------------------

def _l2(a, b):
    return math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))


def run_client(env, args):
    rc = env.robot_client
    sim_cfg = SimRobotConfig(seed=args.seed, height=args.height, width=args.width, state_dim=args.state_dim,
                             action_dim=args.action_dim, state_mode=args.state_mode, state_scale=args.state_scale)
    robots = []

    def make_sim_robot(config):
        robot = SimRobot(config)
        robots.append(robot)
        return robot

    # The one injection: RobotClient.__init__ calls the module global make_robot_from_config(config.robot).
    rc.make_robot_from_config = make_sim_robot

    cfg = env.configs.RobotClientConfig(
        policy_type=args.policy_type, pretrained_name_or_path=args.pretrained, robot=sim_cfg,
        actions_per_chunk=args.actions_per_chunk, task=args.task, server_address=args.server,
        policy_device=args.policy_device, chunk_size_threshold=args.chunk_size_threshold, fps=args.fps,
        aggregate_fn_name=args.aggregate_fn)
    client = rc.RobotClient(cfg)
    robot = robots[0]

    rec_lock = threading.Lock()
    t0 = time.time()
    state = {"ticks": 0, "starved": 0, "starved_before_first": 0, "first_exec_tick": None, "stop_reason": None}
    chunks, sent_obs, executed, replies = [], [], [], {"empty": 0, "nonempty": 0, "errors": 0, "sizes": []}
    source = {}  # timestep -> (chunk id, row) of the chunk that last provided it
    dumped = {"obs": False, "actions": False}
    deadline = t0 + args.duration_s if args.duration_s else None

    orig_available = client.actions_available
    orig_ready = client._ready_to_send_observation
    orig_action = client.control_loop_action
    orig_send = client.send_observation
    orig_aggregate = client._aggregate_action_queues
    orig_get_actions = client.stub.GetActions

    def actions_available():
        # called once at the top of every control_loop tick
        if not client.running:
            return False
        if (args.ticks and state["ticks"] >= args.ticks) or (deadline and time.time() >= deadline):
            state["stop_reason"] = "ticks" if args.ticks and state["ticks"] >= args.ticks else "duration"
            client.shutdown_event.set()  # control_loop's `while self.running` ends after this tick
            return False
        state["ticks"] += 1
        avail = orig_available()
        if not avail:
            state["starved"] += 1
            if state["first_exec_tick"] is None:
                state["starved_before_first"] += 1
        elif state["first_exec_tick"] is None:
            state["first_exec_tick"] = state["ticks"] - 1
        return avail

    def ready_to_send_observation():
        return client.running and orig_ready()

    def control_loop_action(verbose=False):
        with rec_lock:
            n = len(robot.executed)
            out = orig_action(verbose)
            ts = client.latest_action
            t_exec, vals = robot.executed[n]
            cid, row = source.get(ts, (None, None))
        executed.append({"tick": state["ticks"] - 1, "time": t_exec - t0, "timestep": ts, "chunk": cid,
                         "row": row, "action": vals})
        return out

    def send_observation(obs):
        k = getattr(robot, "last_frame", None)
        data = pickle.dumps(obs)
        entry = {"index": len(sent_obs), "frame": k, "timestep": obs.get_timestep(), "timestamp": obs.get_timestamp(),
                 "time": time.time() - t0, "must_go": bool(obs.must_go), "task": obs.observation.get("task"),
                 "state": [obs.observation[j] for j in robot.joints], "pickle_bytes": len(data),
                 "grpc_messages": max(1, math.ceil(len(data) / env.transport_utils.CHUNK_SIZE)),
                 "answered_by_chunk": None}
        if args.dump_pickles and not dumped["obs"]:
            dumped["obs"] = True
            with open(os.path.join(args.dump_pickles, "observation.pkl"), "wb") as f:
                f.write(data)
        if args.save_obs:
            raw = obs.observation
            np.savez(os.path.join(args.save_obs, f"obs_{len(sent_obs):05d}.npz"), image0=raw["image"],
                     image1=raw["wrist_image"], state=np.array(entry["state"], dtype=np.float32),
                     task=np.array(raw.get("task", "")))
        ok = orig_send(obs)
        entry["sent_ok"] = bool(ok)
        sent_obs.append(entry)
        return ok

    def get_actions(request, *a, **kw):
        try:
            reply = orig_get_actions(request, *a, **kw)
        except Exception:
            replies["errors"] += 1
            raise
        n = len(reply.data)
        if n == 0:
            replies["empty"] += 1
        else:
            replies["nonempty"] += 1
            replies["sizes"].append(n)
            if args.dump_pickles and not dumped["actions"]:
                dumped["actions"] = True
                with open(os.path.join(args.dump_pickles, "actions.pkl"), "wb") as f:
                    f.write(reply.data)
        return reply

    def aggregate(incoming, aggregate_fn=None):
        with rec_lock:
            before = client.latest_action
            orig_aggregate(incoming, aggregate_fn)
            cid = len(chunks)
            steps = [a.get_timestep() for a in incoming]
            for row, a in enumerate(incoming):
                if a.get_timestep() > before:
                    source[a.get_timestep()] = (cid, row)
            qsize = client.action_queue.qsize()
        first_ts = incoming[0].get_timestamp() if incoming else None
        ans = None
        for o in reversed(sent_obs):
            if first_ts is not None and o["timestamp"] == first_ts:
                ans = o["index"]
                o["answered_by_chunk"] = cid
                break
        dt = (incoming[1].get_timestamp() - incoming[0].get_timestamp()) if len(incoming) > 1 else None
        chunks.append({"id": cid, "time": time.time() - t0, "observation": ans, "timesteps": steps,
                       "first_timestamp": first_ts, "label_dt": dt, "latest_executed_at_arrival": before,
                       "rows_dropped_as_past": sum(1 for s in steps if s <= before), "queue_after": qsize,
                       "dtype": str(incoming[0].get_action().dtype) if incoming else None,
                       "row_len": int(incoming[0].get_action().numel()) if incoming else None,
                       "actions": [[float(x) for x in a.get_action().reshape(-1).tolist()] for a in incoming]})

    client.actions_available = actions_available
    client._ready_to_send_observation = ready_to_send_observation
    client.control_loop_action = control_loop_action
    client.send_observation = send_observation
    client._aggregate_action_queues = aggregate
    client.stub.GetActions = get_actions

    started = False
    # As robot_client.py async_client(): start(), receiver thread, control loop, stop() in finally.
    if client.start():
        started = True
        receiver = threading.Thread(target=client.receive_actions, daemon=True)
        receiver.start()
        try:
            client.control_loop(task=args.task)
        finally:
            client.stop()
            receiver.join(timeout=10)
    else:
        client.stop()

    # boundary jumps: consecutive executed actions whose source chunk differs
    jumps, all_steps = [], []
    for prev, cur in zip(executed, executed[1:]):
        d = _l2(prev["action"], cur["action"])
        all_steps.append(d)
        if prev["chunk"] != cur["chunk"]:
            jumps.append({"tick": cur["tick"], "from_chunk": prev["chunk"], "to_chunk": cur["chunk"], "l2": d})
    starved_after = state["starved"] - state["starved_before_first"]
    report = {
        "lerobot": {"mode": env.mode, "stand_ins": env.stand_ins, "package": env.pkg_dir,
                    "python": sys.version.split()[0], "pickle_default_protocol": pickle.DEFAULT_PROTOCOL},
        "config": {"server": args.server, "policy_type": args.policy_type, "pretrained": args.pretrained,
                   "fps": args.fps, "actions_per_chunk": args.actions_per_chunk,
                   "chunk_size_threshold": args.chunk_size_threshold, "aggregate_fn": args.aggregate_fn,
                   "task": args.task, "ticks": args.ticks, "duration_s": args.duration_s, "seed": args.seed,
                   "height": args.height, "width": args.width, "state_dim": args.state_dim,
                   "action_dim": args.action_dim, "state_mode": args.state_mode, "state_scale": args.state_scale},
        "started": started, "stop_reason": state["stop_reason"], "wall_s": time.time() - t0,
        "ticks": state["ticks"], "ticks_starved": state["starved"],
        "ticks_starved_before_first_action": state["starved_before_first"],
        "ticks_starved_after_first_action": starved_after,
        "chunks_received": len(chunks), "get_actions_replies": replies,
        "observations_sent": len(sent_obs),
        "observations_must_go": sum(1 for o in sent_obs if o["must_go"]),
        "observations_answered": sum(1 for o in sent_obs if o["answered_by_chunk"] is not None),
        "observations_unanswered": sum(1 for o in sent_obs if o["answered_by_chunk"] is None),
        "actions_executed": len(executed),
        "boundary_jump_l2": {"count": len(jumps), "max": max((j["l2"] for j in jumps), default=None),
                             "mean": (sum(j["l2"] for j in jumps) / len(jumps)) if jumps else None},
        "step_l2_all": {"max": max(all_steps, default=None),
                        "mean": (sum(all_steps) / len(all_steps)) if all_steps else None},
        "boundaries": jumps, "executed": executed, "chunks": chunks, "observations": sent_obs,
    }
    return report


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lerobot-src", help="a lerobot checkout (its src/ is used if present); default: installed lerobot")
    p.add_argument("--server", default="127.0.0.1:8080", help="host:port of the AsyncInference server")
    p.add_argument("--policy-type", default="molmoact2",
                   help="RemotePolicyConfig.policy_type (molmoact's server: molmoact2; LeRobot's own server: "
                        "one of its SUPPORTED_POLICIES, e.g. act)")
    p.add_argument("--pretrained", default="molmoact2", help="RemotePolicyConfig.pretrained_name_or_path")
    p.add_argument("--policy-device", default="cpu")
    p.add_argument("--fps", type=int, default=30)
    p.add_argument("--actions-per-chunk", type=int, default=10)
    p.add_argument("--chunk-size-threshold", type=float, default=0.5)
    p.add_argument("--aggregate-fn", default="latest_only",
                   help="weighted_average | latest_only | average | conservative (LeRobot's default is "
                        "weighted_average; latest_only makes executed actions rows of the chunks, for parity)")
    p.add_argument("--ticks", type=int, default=0, help="stop after this many control ticks")
    p.add_argument("--duration-s", type=float, default=0.0, help="stop after this many seconds")
    p.add_argument("--task", default="put the bowl on the plate")
    p.add_argument("--seed", type=int, default=0, help="the simulated robot's frames and states")
    p.add_argument("--height", type=int, default=256)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--state-dim", type=int, default=8)
    p.add_argument("--action-dim", type=int, default=7, help="the robot's action features (a reply row must have "
                                                             "at least this many values)")
    p.add_argument("--state-mode", choices=["random", "static"], default="random",
                   help="random: a new state each frame (LeRobot's similarity filter never drops); static: one state")
    p.add_argument("--state-scale", type=float, default=10.0)
    p.add_argument("--out", help="write the report as JSON here")
    p.add_argument("--save-obs", metavar="DIR", help="write each sent observation as DIR/obs_NNNNN.npz "
                                                     "(image0, image1, state, task: `molmoact run --inputs`)")
    p.add_argument("--dump-pickles", metavar="DIR", help="write the first observation pickle and the first "
                                                         "non-empty Actions.data to DIR")
    p.add_argument("-v", "--verbose", action="store_true", help="show LeRobot's log on stderr")
    args = p.parse_args(argv)
    if not args.ticks and not args.duration_s:
        args.duration_s = 5.0
    # absolute: main() runs LeRobot from a temporary directory (its loggers create logs/ in the cwd)
    for name in ("save_obs", "dump_pickles", "out", "lerobot_src"):
        if getattr(args, name):
            setattr(args, name, os.path.abspath(os.path.expanduser(getattr(args, name))))
    for d in (args.save_obs, args.dump_pickles):
        if d:
            os.makedirs(d, exist_ok=True)
    return args


def main(argv=None):
    args = parse_args(argv)
    # RobotClient's logger (helpers.get_logger) writes logs/robot_client_<time>.log under the cwd.
    logdir = tempfile.mkdtemp(prefix="lerobot_robot_loop_logs_")
    cwd = os.getcwd()
    os.chdir(logdir)
    env = None
    try:
        env = LeRobotEnv(args.lerobot_src)
        import logging
        if not args.verbose:
            for h in logging.getLogger().handlers:
                if not hasattr(h, "baseFilename"):
                    h.setLevel(logging.WARNING)
        report = run_client(env, args)
    finally:
        os.chdir(cwd)
        if env is not None:
            env.cleanup()  # the generated stand-ins (modules already loaded stay usable)
    report["client_log_dir"] = logdir
    summary = {k: report[k] for k in ("started", "stop_reason", "ticks", "ticks_starved_before_first_action",
                                      "ticks_starved_after_first_action", "chunks_received", "observations_sent",
                                      "observations_answered", "actions_executed", "boundary_jump_l2",
                                      "get_actions_replies")}
    summary["lerobot"] = {"mode": report["lerobot"]["mode"], "stand_ins": report["lerobot"]["stand_ins"]}
    summary["get_actions_replies"] = {k: v for k, v in report["get_actions_replies"].items() if k != "sizes"}
    print(json.dumps(summary, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if report["started"] else 1


if __name__ == "__main__":
    sys.exit(main())
