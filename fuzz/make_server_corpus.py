#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Writes the seeds of fuzz_server (fuzz/corpus/server): scripts in fuzz_server.c's format that
make valid and hostile traffic on up to four connections. Run with /usr/bin/python3 (msgpack)."""
import base64
import json
import os
import struct

import msgpack

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "server")
KEY = b"Authorization: Api-Key k3y\r\n"


def send(c, data):
    out = b""
    for i in range(0, len(data), 65535):
        part = data[i:i + 65535]
        out += bytes([c]) + struct.pack("<H", len(part)) + part
    return out


def repeat(c, count, byte, mult=0):
    return bytes([0x80 | (mult << 2) | c]) + struct.pack(">I", count)[1:] + bytes([byte])


def read(c):
    return bytes([0xc0 | c])


def close(c, reset=False):
    return bytes([0xe0 | (4 if reset else 0) | c])


def ws_frame(payload, opcode=2, fin=True, length=None):
    n = len(payload) if length is None else length
    h = bytes([(0x80 if fin else 0) | opcode])
    if n < 126:
        h += bytes([0x80 | n])
    elif n < 65536:
        h += bytes([0x80 | 126]) + struct.pack(">H", n)
    else:
        h += bytes([0x80 | 127]) + struct.pack(">Q", n)
    mask = b"\x11\x22\x33\x44"
    return h + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def np_(shape, dtype, data):
    return {b"__ndarray__": True, b"data": data, b"dtype": dtype.encode(), b"shape": list(shape)}


def observation(task="put the bowl on the plate"):
    img = np_((8, 8, 3), "|u1", bytes(range(192)))
    return msgpack.packb({"observation/image": img, "observation/wrist_image": img,
                          "observation/state": np_((8,), "<f4", struct.pack("<8f", *range(8))), "prompt": task})


HANDSHAKE = (b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
             b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n" + KEY + b"\r\n")


def json_body(task="put the bowl on the plate"):
    img = {"__numpy__": base64.b64encode(bytes(range(192))).decode(), "dtype": "|u1", "shape": [8, 8, 3]}
    return json.dumps({"image": img, "wrist_image": img, "state": [0.5] * 8, "instruction": task}).encode()


def post(body, extra=b"", path=b"/act"):
    return b"POST " + path + b" HTTP/1.1\r\nHost: x\r\n" + KEY + b"Content-Type: application/json\r\nContent-Length: " + \
        str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body


def chunked(body, size=100):
    parts = b"".join(b"%x\r\n" % len(body[i:i + size]) + body[i:i + size] + b"\r\n" for i in range(0, len(body), size))
    return b"POST /act HTTP/1.1\r\nHost: x\r\n" + KEY + b"Transfer-Encoding: chunked\r\n\r\n" + parts + b"0\r\n\r\n"


seeds = {
    "ws_infer": b"\x00" + send(0, HANDSHAKE + ws_frame(observation())) + read(0),
    "ws_two_requests_fragmented": b"\x00" + send(0, HANDSHAKE) + read(0) + send(0, ws_frame(observation()[:50], fin=False)) +
    send(0, ws_frame(observation()[50:], opcode=0)) + read(0) + send(0, ws_frame(b"ping", opcode=9)) + send(0, ws_frame(observation("fail now"))),
    "ws_claims_huge": b"\x01" + send(0, HANDSHAKE) + send(0, ws_frame(b"", length=(1 << 62))) + send(1, HANDSHAKE) + read(1),
    "ws_over_message": b"\x00" + send(0, HANDSHAKE + ws_frame(b"", length=70000)) + repeat(0, 70000, 0x41),
    "ws_text_and_close": b"\x00" + send(0, HANDSHAKE + ws_frame(b"hello", opcode=1) + ws_frame(struct.pack(">H", 1000), opcode=8)),
    "http_post": b"\x00" + send(0, post(json_body())) + read(0),
    "http_pipelined": b"\x00" + send(0, post(json_body()) + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 3 + post(b"{bad") +
                                  b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + KEY + b"\r\n"),
    "http_chunked": b"\x00" + send(0, chunked(json_body())),
    "http_chunked_bad": b"\x00" + send(0, b"POST /act HTTP/1.1\r\nHost: x\r\n" + KEY + b"Transfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n"),
    "http_over_length": b"\x00" + send(0, post(b"", path=b"/act").replace(b"Content-Length: 0", b"Content-Length: 99999999999999999999")),
    "http_chunked_over": b"\x00" + send(0, b"POST /act HTTP/1.1\r\nHost: x\r\n" + KEY + b"Transfer-Encoding: chunked\r\n\r\n10000\r\n") +
    repeat(0, 65536, 0x20) + send(0, b"\r\n10000\r\n") + repeat(0, 65536, 0x20) + send(0, b"\r\n0\r\n\r\n"),
    "http_four_bodies": b"\x03" + b"".join(send(c, post(b"{" + b" " * 40000 + b"}")[:-20000]) for c in range(4)) +
    b"".join(send(c, b" " * 20000) for c in range(4)) + b"".join(read(c) for c in range(4)),
    "http_no_key_upgrade_health": b"\x00" + send(0, HANDSHAKE.replace(b"GET / ", b"GET /healthz ").replace(KEY, b"")),
    "http_expect": b"\x00" + send(0, post(json_body(), b"Expect: 100-continue\r\n")[:-10]) + read(0) + send(0, json_body()[-10:]),
    "http_head_then_bad": b"\x00" + send(0, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\nBAD\x01REQUEST\r\n\r\n"),
    "http_big_head": b"\x00" + send(0, b"GET /status.json HTTP/1.1\r\nHost: x\r\nX-Pad: ") + repeat(0, 9000, 0x61) + send(0, b"\r\n\r\n"),
    "reset_mid_request": b"\x01" + send(0, post(json_body())[:300]) + close(0, reset=True) + send(1, post(json_body())) + read(1),
    "slow": b"\x00" + send(0, post(json_body())[:100]) + b"\xf0" * 40 + send(0, post(json_body())[100:]),
}
os.makedirs(OUT, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
print(len(seeds), "seeds in", OUT)
