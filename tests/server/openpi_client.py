# SPDX-License-Identifier: Apache-2.0
"""A client that speaks openpi's websocket protocol exactly as openpi-client does
(websocket_client_policy.py + msgpack_numpy.py), rewritten here on Debian's python3-websockets
(asyncio API) and python3-msgpack: binary keys for arrays, numpy dtype strings, the metadata
frame first, then one binary request -> one binary reply; a text frame is an error."""
import asyncio
import functools

import msgpack
import numpy as np
import websockets


def pack_array(obj):
    # openpi_client/msgpack_numpy.py: arrays and numpy scalars as maps with *bytes* keys
    if isinstance(obj, (np.ndarray, np.generic)) and obj.dtype.kind in ("V", "O", "c"):
        raise ValueError(f"Unsupported dtype: {obj.dtype}")
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": obj.shape}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    return obj


def unpack_array(obj):
    if b"__ndarray__" in obj:
        return np.ndarray(buffer=obj[b"data"], dtype=np.dtype(obj[b"dtype"]), shape=obj[b"shape"])
    if b"__npgeneric__" in obj:
        return np.dtype(obj[b"dtype"]).type(obj[b"data"])
    return obj


Packer = functools.partial(msgpack.Packer, default=pack_array)
packb = functools.partial(msgpack.packb, default=pack_array)
unpackb = functools.partial(msgpack.unpackb, object_hook=unpack_array)


class ServerError(RuntimeError):
    pass


class Client:
    """async: `async with Client(uri) as c: meta = c.metadata; out = await c.infer(obs)`"""

    def __init__(self, uri, api_key=None, max_size=64 * 2 ** 20):
        self.uri, self.api_key, self.max_size = uri, api_key, max_size

    async def __aenter__(self):
        headers = {"Authorization": f"Api-Key {self.api_key}"} if self.api_key else None
        self.ws = await websockets.connect(self.uri, compression=None, max_size=self.max_size, extra_headers=headers,
                                           open_timeout=30)
        self.metadata = unpackb(await self.ws.recv())
        self.packer = Packer()
        return self

    async def __aexit__(self, *exc):
        await self.ws.close()

    async def infer(self, obs):
        await self.ws.send(self.packer.pack(obs))
        response = await self.ws.recv()
        if isinstance(response, str):
            raise ServerError(response)
        return unpackb(response)


def infer_once(uri, obs, api_key=None):
    async def go():
        async with Client(uri, api_key) as c:
            return c.metadata, await c.infer(obs)
    return asyncio.run(go())
