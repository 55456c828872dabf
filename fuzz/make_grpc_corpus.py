#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Writes the seeds of fuzz_grpc (fuzz/corpus/grpc): the bytes Debian's python3-grpcio sends to
`molmoact serve --grpc-port` for LeRobot's service (recorded through a TCP proxy, so the HTTP/2
framing and HPACK are grpcio's own), as fuzz_server.c scripts of one connection: each chunk the
client wrote is a send, followed by a read.

    /usr/bin/python3 fuzz/make_grpc_corpus.py build/molmoact

The payloads are those of tests/server/test_lerobot_grpc.py (small frames), hostile pickles and the
recorded LeRobot fixtures; the API key is fuzz_server's ("k3y"), sent as gRPC metadata."""
import os
import pickle
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
OUT = os.path.join(HERE, "corpus", "grpc")
sys.path.insert(0, os.path.join(SRC, "tests", "server"))
import grpc  # noqa: E402
import test_lerobot_grpc as t  # noqa: E402

KEY = (("authorization", "Bearer k3y"),)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Recorder:
    """a TCP proxy that keeps what each client connection sent, chunk by chunk"""

    def __init__(self, target):
        self.target, self.conns = target, []
        self.ls = socket.socket()
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(8)
        self.port = self.ls.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            u = socket.create_connection(("127.0.0.1", self.target))
            rec = []
            self.conns.append(rec)
            threading.Thread(target=self.pump, args=(c, u, rec), daemon=True).start()
            threading.Thread(target=self.pump, args=(u, c, None), daemon=True).start()

    @staticmethod
    def pump(a, b, rec):
        while True:
            try:
                d = a.recv(65536)
            except OSError:
                d = b""
            if not d:
                try:
                    b.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            if rec is not None:
                rec.append(d)
            try:
                b.sendall(d)
            except OSError:
                return


def script(chunks):
    out = bytearray([0])  # one connection
    for d in chunks:
        for i in range(0, len(d), 65535):
            part = d[i:i + 65535]
            out += bytes([0]) + struct.pack("<H", len(part)) + part
        out += bytes([0xC0])  # read what the server sent
    return bytes(out)


def scenarios():
    def unary(ch, name, req=b""):
        try:
            return ch.unary_unary(t.SVC + name)(req, timeout=30, metadata=KEY)
        except grpc.RpcError:
            return None

    def observe(ch, msgs):
        try:
            return ch.stream_unary(t.SVC + "SendObservations")(iter(msgs), timeout=30, metadata=KEY)
        except grpc.RpcError:
            return None

    small = dict(lerobot_features=t.features(size=(12, 16)))
    fix = os.path.join(SRC, "tests", "fixtures", "lerobot_async")

    def obs(seed, **kw):
        o, *_ = t.raw_obs(seed)
        for c in ("image", "wrist_image"):
            o[c] = o[c][:12, :16].copy()
        return pickle.dumps(t.H.TimedObservation(timestamp=1.0, timestep=kw.get("timestep", 0), observation=o,
                                                 must_go=kw.get("must_go", True)), protocol=kw.get("protocol", 4))

    def session(ch):  # the whole protocol, twice (the second chunk guided)
        unary(ch, "Ready")
        unary(ch, "SendPolicyInstructions", t.pb_bytes(1, t.policy(**small)))
        observe(ch, [t.observation_msg(3, obs(1))])
        unary(ch, "GetActions")
        observe(ch, [t.observation_msg(3, obs(2, timestep=3, must_go=False, protocol=5))])
        unary(ch, "GetActions")

    def chunked(ch):
        unary(ch, "Ready")
        unary(ch, "SendPolicyInstructions", t.pb_bytes(1, t.policy(**small)))
        observe(ch, t.chunks(obs(3), size=700))
        unary(ch, "GetActions")

    def hostile(ch):
        unary(ch, "SendPolicyInstructions", t.pb_bytes(1, t.policy(**small)))
        for p in list(t.hostile("/tmp/x"))[:4]:
            observe(ch, [t.observation_msg(3, p)])

    def recorded(ch):
        unary(ch, "SendPolicyInstructions", t.pb_bytes(1, t.policy(
            lerobot_features=t.features(cams=("front", "wrist"), names=["shoulder_pan.pos", "shoulder_lift.pos", "elbow_flex.pos",
                                                                       "wrist_flex.pos", "wrist_roll.pos", "gripper.pos",
                                                                       "base_x.pos", "base_y.pos"], size=(24, 32)),
            rename_map={"observation.images.front": "observation.images.image",
                        "observation.images.wrist": "observation.images.wrist_image"})))
        observe(ch, [t.observation_msg(3, open(os.path.join(fix, "observation_pr3048.bin"), "rb").read())])
        unary(ch, "GetActions")

    def poll_empty(ch):
        unary(ch, "SendPolicyInstructions", t.pb_bytes(1, t.policy(**small)))
        unary(ch, "GetActions")
        unary(ch, "Nope")

    def config_refused(ch):
        unary(ch, "SendPolicyInstructions", t.pb_bytes(1, open(os.path.join(fix, "config_p4.pkl"), "rb").read()))
        unary(ch, "SendPolicyInstructions", t.pb_bytes(1, t.policy(policy_type="act")))

    return [("session", session), ("chunked", chunked), ("hostile", hostile), ("recorded_pr3048", recorded),
            ("poll_empty", poll_empty), ("config_refused", config_refused)]


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(SRC, "build", "molmoact")
    http, gport = free_port(), free_port()
    with tempfile.NamedTemporaryFile("w", delete=False) as f:
        f.write("k3y\n")
    srv = subprocess.Popen([binary, "serve", "--model", os.path.join(SRC, "assets", "tiny-grid", "model"), "--port", str(http),
                            "--grpc-port", str(gport), "--api-key-file", f.name, "--lerobot-obs-timeout-s", "0.2", "--rtc", "--quiet"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", gport), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        os.makedirs(OUT, exist_ok=True)
        rec = Recorder(gport)
        for name, fn in scenarios():
            before = len(rec.conns)
            ch = grpc.insecure_channel(f"127.0.0.1:{rec.port}")
            grpc.channel_ready_future(ch).result(timeout=30)
            fn(ch)
            ch.close()
            time.sleep(0.3)
            chunks = [d for c in rec.conns[before:] for d in c]
            with open(os.path.join(OUT, name), "wb") as out:
                out.write(script(chunks))
            print(name, sum(map(len, chunks)), "bytes")
        rec.ls.close()
    finally:
        srv.terminate()
        srv.wait(timeout=60)
        os.unlink(f.name)


if __name__ == "__main__":
    main()
