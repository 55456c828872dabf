# SPDX-License-Identifier: Apache-2.0
"""Review findings on `molmoact serve --grpc-port` (issue 39): one test per finding, each failing on
the code before its fix. Debian's python3-grpcio where a well-behaved client suffices; a raw HTTP/2
client (hand-framed, HPACK literals without indexing) where the finding needs frames grpcio never
sends (a request left open, a call cancelled right after it is sent).

    MOLMOACT=build/molmoact /usr/bin/python3 -m pytest -q tests/server/test_grpc_review.py
"""
import os
import pickle
import socket
import struct
import sys
import time

import pytest

grpc = pytest.importorskip("grpc")
pytest.importorskip("torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_lerobot_grpc import (SVC, grpc_lines, obs_payload, observation_msg, pb_bytes, policy,  # noqa: E402
                               start)
from test_server import Server, free_port  # noqa: E402


# ---- a raw HTTP/2 client -----------------------------------------------------------------------
DATA, HEADERS, RST_STREAM, SETTINGS, GOAWAY = 0, 1, 3, 4, 7
END_STREAM, END_HEADERS, ACK = 1, 4, 1


def frame(ftype, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", sid) + payload


def _hlen(n):
    assert n < 127
    return bytes([n])


def header_block(path):
    """HPACK: every field a literal without indexing, new name, no Huffman (RFC 7541 6.2.2)"""
    out = b""
    for k, v in ((":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "127.0.0.1"),
                 ("content-type", "application/grpc"), ("te", "trailers")):
        out += b"\x00" + _hlen(len(k)) + k.encode() + _hlen(len(v)) + v.encode()
    return out


def grpc_msg(m):
    return b"\x00" + struct.pack(">I", len(m)) + m


class H2:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(SETTINGS, 0, 0))
        self.buf = b""
        self.next_id = 1

    def call_frames(self, method, msg, end=True):
        """a unary call's frames: HEADERS, then the message in DATA frames of at most 16 KiB"""
        sid = self.next_id
        self.next_id += 2
        out = frame(HEADERS, END_HEADERS, sid, header_block(SVC + method))
        if msg is not None:
            body = grpc_msg(msg)
            for i in range(0, len(body), 16384):
                last = i + 16384 >= len(body)
                out += frame(DATA, END_STREAM if (last and end) else 0, sid, body[i:i + 16384])
        return sid, out

    def read_frame(self, deadline):
        while len(self.buf) < 9 or len(self.buf) < 9 + struct.unpack(">I", b"\x00" + self.buf[:3])[0]:
            left = deadline - time.time()
            if left <= 0:
                return None
            self.s.settimeout(left)
            try:
                b = self.s.recv(65536)
            except socket.timeout:
                return None
            if not b:
                return "eof"
            self.buf += b
        n = struct.unpack(">I", b"\x00" + self.buf[:3])[0]
        ftype, flags, sid = self.buf[3], self.buf[4], struct.unpack(">I", self.buf[5:9])[0] & 0x7FFFFFFF
        payload, self.buf = self.buf[9:9 + n], self.buf[9 + n:]
        if ftype == SETTINGS and not flags & ACK:
            self.s.sendall(frame(SETTINGS, ACK, 0))
        return ftype, flags, sid, payload

    def wait_end(self, sid, timeout):
        """until stream sid ends (END_STREAM or RST_STREAM): its frames, or None at the deadline"""
        deadline, got = time.time() + timeout, []
        while True:
            f = self.read_frame(deadline)
            if f is None or f == "eof":
                return None
            if f[2] == sid:
                got.append(f)
                if f[0] == RST_STREAM or (f[0] in (HEADERS, DATA) and f[1] & END_STREAM):
                    return got

    def unary(self, method, msg, timeout=60):
        sid, out = self.call_frames(method, msg)
        self.s.sendall(out)
        got = self.wait_end(sid, timeout)
        assert got is not None, f"{method}: no answer"
        return got

    def close(self):
        self.s.close()


def wait_log(s, pred, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        lines = [l for l in s.log_lines() if pred(l)]
        if lines:
            return lines
        time.sleep(0.05)
    raise AssertionError("no such log line: " + s.logs()[-3000:])


# ---- F1: a timestep near INT64_MAX -------------------------------------------------------------
def test_f1_huge_timestep_refused_not_wrapped():
    """TimedObservation.timestep 2**63 - 1 passed the reader (an int64) and the reply labelled row i
    with step0 + i: a signed overflow (UB), rows 1.. labelled -2**63... Either it is refused naming
    the field, or every row's label is exact."""
    s, c = start()
    try:
        c.ready()
        c.policy(policy())
        big = 2 ** 63 - 1
        try:
            c.observe([observation_msg(3, obs_payload(1, timestep=big)[0])])
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "timestep" in e.details(), e.details()
        else:
            rows = pickle.loads(c.actions())
            assert [r.get_timestep() for r in rows] == [big + i for i in range(len(rows))]
        assert "runtime error" not in s.logs()  # UBSan's report, under MA_SANITIZE
    finally:
        c.close()
        assert s.stop() == 0


# ---- F2: first_row truncated to int ------------------------------------------------------------
def test_f2_timestep_far_ahead_is_not_guided_by_stale_rows():
    """The previous chunk's row for the new observation is timestep - step0, cast to int: 2**32 + 3
    steps later it became row 3, and the new chunk was guided toward rows the robot ran 4 billion
    steps ago."""
    s, c = start("--rtc", "--fps", "1000")
    try:
        c.ready()
        c.policy(policy())
        c.observe([observation_msg(3, obs_payload(7, timestep=10)[0])])
        assert len(pickle.loads(c.actions())) == 10
        c.observe([observation_msg(3, obs_payload(8, timestep=10 + 2 ** 32 + 3, must_go=False)[0])])
        assert len(pickle.loads(c.actions())) == 10
        last = grpc_lines(s)[-1]
        assert "rtc" not in last, last  # nothing of the old chunk is left for that step
    finally:
        c.close()
        assert s.stop() == 0


# ---- F3: a GetActions request left open ---------------------------------------------------------
def test_f3_incomplete_get_actions_times_out():
    """A GetActions whose request never ends (HEADERS, no END_STREAM) was exempt from
    --recv-timeout-s, and an open stream kept --idle-timeout-s away: one such stream held a
    connection (of --max-clients) forever. It is answered within the timeout now."""
    gport = free_port()
    s = Server("tiny-grid", "--grpc-port", str(gport), "--recv-timeout-s", "1", "--idle-timeout-s", "2")
    h = H2(gport)
    try:
        sid, out = h.call_frames("GetActions", None)
        h.s.sendall(out)
        t = time.time()
        got = h.wait_end(sid, 8)
        assert got is not None, "the open GetActions was never answered"
        assert time.time() - t < 6
    finally:
        h.close()
        assert s.stop() == 0


# ---- F4: a chunk the client never got became its timeline's ---------------------------------------
def test_f4_undelivered_chunk_does_not_guide_the_next():
    """GetActions cancelled (RST_STREAM) while its inference runs: the reply goes nowhere, yet the
    chunk was stored as the session's, and the next observation was guided toward rows the robot
    never had. With no chunk delivered, nothing guides the next one."""
    gport = free_port()
    s = Server("tiny-grid", "--grpc-port", str(gport), "--seed", "7", "--rtc", "--fps", "1000")
    h = H2(gport)
    try:
        h.unary("Ready", b"")
        h.unary("SendPolicyInstructions", pb_bytes(1, policy()))
        h.unary("SendObservations", observation_msg(3, obs_payload(7, timestep=10)[0]))
        sid, out = h.call_frames("GetActions", b"")
        h.s.sendall(out + frame(RST_STREAM, 0, sid, struct.pack(">I", 8)))  # CANCEL at once
        wait_log(s, lambda l: l["proto"] == "grpc GetActions" and "stopped polling" in l["outcome"])
        h.unary("SendObservations", observation_msg(3, obs_payload(8, timestep=13, must_go=False)[0]))
        got = h.unary("GetActions", b"")
        assert any(f[0] == DATA and len(f[3]) > 5 for f in got), got  # a chunk
        last = grpc_lines(s)[-1]
        assert "rtc" not in last, last
    finally:
        h.close()
        assert s.stop() == 0


# ---- F5: rows the client never got in the prefix ----------------------------------------------
def test_f5_prefix_is_only_rows_the_client_got():
    """actions_per_chunk 4: the client gets rows for timesteps 10..13; the timeline kept all 10 rows
    of the chunk, so the next observation (timestep 12) was guided toward 8 rows, 6 of which the
    robot never had. The prefix is what is left of what was sent: rows 12 and 13."""
    s, c = start("--rtc", "--fps", "1000")
    try:
        c.ready()
        c.policy(policy(actions_per_chunk=4))
        c.observe([observation_msg(3, obs_payload(7, timestep=10)[0])])
        assert [r.get_timestep() for r in pickle.loads(c.actions())] == [10, 11, 12, 13]
        c.observe([observation_msg(3, obs_payload(8, timestep=12, must_go=False)[0])])
        assert [r.get_timestep() for r in pickle.loads(c.actions())] == [12, 13, 14, 15]
        last = grpc_lines(s)[-1]
        assert last["rtc"]["prefix_rows"] == 2, last
    finally:
        c.close()
        assert s.stop() == 0


# ---- F6: POST /reset naming a session that cannot exist forgot every session ----------------------
def test_f6_reset_of_an_impossible_session_id_forgets_nothing():
    """A session_id of 72+ characters (query) or one that is not a string (body) was dropped as if
    none had been named, and POST /reset then forgot every client's session."""
    import json
    import urllib.request
    from test_sessions import STATE, body, post
    s = Server("tiny-grid")
    try:
        for sid in ("a", "b"):
            assert post(s, body(STATE), f"?session_id={sid}")[0] == 200
        for query, data in ((f"?session_id={'x' * 80}", b""), ("", b'{"session_id": 123}'), ("", json.dumps({"session_id": "y" * 80}).encode())):
            req = urllib.request.Request(s.http + "/reset" + query, data=data, method="POST")
            assert json.loads(urllib.request.urlopen(req, timeout=30).read()) == {"status": "ok", "removed": []}, (query, data)
        st = json.loads(urllib.request.urlopen(s.http + "/status.json", timeout=30).read())
        assert sorted(e["session"] for e in st["sessions"]) == ["http:a", "http:b"]
    finally:
        assert s.stop() == 0


# ---- F7: the decoded observation is counted, not only its payload --------------------------------
def test_f7_decoded_observation_counted_under_queued():
    """Python's pickle writes one array once when both cameras hold it (the memo): the payload
    counted under --max-queued-mb was half of what the decoded observation held (each camera its
    own copy). With a budget the payload fits and the decoded observation does not: refused."""
    import numpy as np
    from test_lerobot_grpc import JOINTS, H, features
    s, c = start("--max-message-mb", "0.25", "--max-queued-mb", "0.25")
    try:
        c.ready()
        c.policy(policy(lerobot_features=features(size=(200, 240))))
        img = np.random.default_rng(1).integers(0, 256, (200, 240, 3), dtype=np.uint8)  # 144,000 bytes

        def payload(step, wrist):
            o = {j: 0.1 for j in JOINTS}
            o["image"], o["wrist_image"], o["task"] = img, wrist, "t"
            return pickle.dumps(H.TimedObservation(timestamp=1.0, timestep=step, observation=o, must_go=True), protocol=4)

        p = payload(0, img)  # the same array twice: written once
        assert len(p) < 0.25 * 1048576 < 2 * img.nbytes
        with pytest.raises(grpc.RpcError) as e:
            c.observe([observation_msg(3, p)])
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "--max-queued-mb" in e.value.details(), e.value.details()
        c.observe([observation_msg(3, payload(1, img[:100].copy()))])  # 216,000 bytes decoded: fits
        assert len(pickle.loads(c.actions())) == 10
    finally:
        c.close()
        assert s.stop() == 0


# ---- F8: Ready while the client's inference runs -------------------------------------------------
def test_f8_ready_forgets_the_chunk_in_flight():
    """Ready forgets the client's state, but a chunk still running for an observation from before it
    became the new session's timeline when it came back: the first observation after Ready (timestep
    12, a new robot run) was guided toward a chunk of the old one."""
    gport = free_port()
    s = Server("tiny-grid", "--grpc-port", str(gport), "--seed", "7", "--rtc", "--fps", "1000")
    h = H2(gport)
    try:
        h.unary("Ready", b"")
        h.unary("SendPolicyInstructions", pb_bytes(1, policy()))
        h.unary("SendObservations", observation_msg(3, obs_payload(7, timestep=10)[0]))
        sid, out = h.call_frames("GetActions", b"")
        rid, out2 = h.call_frames("Ready", b"")
        h.s.sendall(out + out2)  # one read: Ready comes while the chunk runs
        assert h.wait_end(sid, 60) is not None
        h.unary("SendPolicyInstructions", pb_bytes(1, policy()))
        h.unary("SendObservations", observation_msg(3, obs_payload(8, timestep=12, must_go=True)[0]))
        got = h.unary("GetActions", b"")
        assert any(f[0] == DATA and len(f[3]) > 5 for f in got), got
        last = grpc_lines(s)[-1]
        assert "rtc" not in last, last
    finally:
        h.close()
        assert s.stop() == 0


# ---- F9: a reply made by the tick judged as unread ------------------------------------------------
def test_f9_long_poll_reply_is_not_taken_for_a_stalled_reader():
    """The empty reply of a long poll is made in the loop's tick, and the tick then judged the
    connection's unsent output against the last time anything was sent: with
    --lerobot-obs-timeout-s at or beyond --recv-timeout-s, every empty reply dropped its
    connection ("the client did not read its reply") before it was written."""
    s, c = start("--recv-timeout-s", "1", "--lerobot-obs-timeout-s", "1.5")
    try:
        c.ready()
        c.policy(policy())
        for _ in range(2):
            assert c.actions(timeout=30) == b""
        assert "did not read its reply" not in s.logs()
    finally:
        c.close()
        assert s.stop() == 0


# ---- F10: a SendObservations stream left open after a whole observation -------------------------
def test_f10_open_observation_stream_does_not_hold_the_connection_forever():
    """After a whole observation a SendObservations stream's deadline was cleared until the next
    byte, and an open stream kept --idle-timeout-s away: a stream left open after one observation
    held its connection (of --max-clients) forever. It is answered once --idle-timeout-s passes
    without another observation."""
    gport = free_port()
    s = Server("tiny-grid", "--grpc-port", str(gport), "--recv-timeout-s", "1", "--idle-timeout-s", "2")
    h = H2(gport)
    try:
        h.unary("Ready", b"")
        h.unary("SendPolicyInstructions", pb_bytes(1, policy()))
        sid, out = h.call_frames("SendObservations", observation_msg(3, obs_payload(1, timestep=1)[0]), end=False)
        h.s.sendall(out)
        t = time.time()
        got = h.wait_end(sid, 10)
        assert got is not None, "the open SendObservations was never answered"
        assert time.time() - t < 8
    finally:
        h.close()
        assert s.stop() == 0


def test_one_connection_holds_at_most_two_messages_of_input():
    """16 streams of one client each half-sending an observation do not take 16 shares of
    --max-input-mb: past 2 x --max-message-mb the connection's next data is refused"""
    s, _c = start("--max-message-mb", "1", "--max-input-mb", "64")
    _c.close()
    h = H2(int(s.p.args[s.p.args.index("--grpc-port") + 1]))
    try:
        h.unary("SendPolicyInstructions", pb_bytes(1, policy()))
        sids = []
        body = grpc_msg(observation_msg(3, b"\x80" * 700000))
        for k in range(4):
            sid = h.next_id
            h.next_id += 2
            out = frame(HEADERS, END_HEADERS, sid, header_block(SVC + "SendObservations"))
            for i in range(0, 16384 * 40, 16384):  # about 640 KiB of the message, no end
                out += frame(DATA, 0, sid, body[i:i + 16384])
            h.s.sendall(out)
            sids.append(sid)
        got = h.wait_end(sids[3], 30) or h.wait_end(sids[2], 30)
        assert got is not None, "no call was refused"
        assert "2 x --max-message-mb" in s.logs()
    finally:
        h.close()
        assert s.stop() == 0


# ---------------------------------------------------------------------------------- a half-open error

def test_error_on_headers_closes_the_stream(tmp_path):
    """A call without the key, its stream left open (HEADERS without END_STREAM, then nothing):
    the UNAUTHENTICATED reply is followed by RST_STREAM(NO_ERROR), so the connection goes idle and
    --idle-timeout-s ends it. The half-open stream had held the connection, and a --max-clients
    slot, for as long as the client liked (an attacker review)."""
    key = tmp_path / "key"
    key.write_text("k3y\n")
    gport = free_port()
    s = Server("tiny-grid", "--grpc-port", str(gport), "--api-key-file", str(key), "--idle-timeout-s", "2")
    try:
        h = H2(gport)
        sid = h.next_id
        h.s.sendall(frame(HEADERS, END_HEADERS, sid, header_block(SVC + "Ready")))
        got = h.wait_end(sid, 30)
        assert got is not None and got[-1][0] == HEADERS and got[-1][1] & END_STREAM, got
        deadline, rst, goaway = time.time() + 15, None, None
        while goaway is None:
            f = h.read_frame(deadline)
            assert f is not None, "no GOAWAY within 15 s: the stream held the connection"
            if f == "eof":
                break
            if f[0] == RST_STREAM and f[2] == sid:
                rst = struct.unpack(">I", f[3])[0]
            if f[0] == GOAWAY:
                goaway = f
        assert rst == 0, rst  # NO_ERROR
        assert goaway is not None
    finally:
        assert s.stop() == 0
