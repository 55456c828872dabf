// SPDX-License-Identifier: Apache-2.0
// A Node.js client of `molmoact serve`'s openpi websocket protocol, on npm's `ws` and
// `@msgpack/msgpack` (which writes map keys as msgpack str: the server takes str or bin keys).
//   node node_client.mjs URI REQUEST.json   -> one JSON line: {"metadata": ..., "actions": [[...]]}
// REQUEST.json: {"prompt": str, "state": [8 numbers] (sent as float64), "noise": "file.f32" (raw
// float32 [1, 10, 32]) or null, "images": [{"raw": "file.u8", "shape": [h, w, 3]} | {"encoded": "file"}] x 2}
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(process.env.MOLMOACT_NODE_MODULES ? process.env.MOLMOACT_NODE_MODULES + "/" : import.meta.url);
const WebSocket = require("ws");
const { encode, Decoder } = require("@msgpack/msgpack");

const [uri, reqPath] = process.argv.slice(2);
const req = JSON.parse(readFileSync(reqPath, "utf8"));
const dir = reqPath.replace(/[^/]*$/, "");
const text = new TextDecoder();
const decoder = new Decoder({ mapKeyConverter: (k) => (k instanceof Uint8Array ? text.decode(k) : k) });

function ndarray(bytes, dtype, shape) {
  return { __ndarray__: true, data: new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength), dtype, shape };
}

function image(spec) {
  const b = readFileSync(dir + (spec.raw || spec.encoded));
  return spec.raw ? ndarray(b, "|u1", spec.shape) : new Uint8Array(b);
}

const obs = {
  "observation/image": image(req.images[0]),
  "observation/wrist_image": image(req.images[1]),
  "observation/state": ndarray(new Uint8Array(Float64Array.from(req.state).buffer), "<f8", [req.state.length]),
  prompt: req.prompt,
};
if (req.noise) obs.noise = ndarray(readFileSync(dir + req.noise), "<f4", [1, 10, 32]);

const ws = new WebSocket(uri, { perMessageDeflate: false, maxPayload: 64 << 20 });
let metadata = null;
ws.on("message", (data, isBinary) => {
  if (!isBinary) {
    console.log(JSON.stringify({ error: data.toString() }));
    ws.close();
    return;
  }
  const msg = decoder.decode(data);
  if (!metadata) {
    metadata = msg;
    ws.send(encode(obs));
    return;
  }
  const a = msg.actions;
  const f = new Float32Array(a.data.buffer.slice(a.data.byteOffset, a.data.byteOffset + a.data.byteLength));
  const rows = [];
  for (let i = 0; i < a.shape[0]; i++) rows.push(Array.from(f.slice(i * a.shape[1], (i + 1) * a.shape[1])));
  console.log(JSON.stringify({ metadata, actions: rows, dtype: a.dtype, policy_timing: msg.policy_timing }));
  ws.close();
});
ws.on("error", (e) => { console.log(JSON.stringify({ error: String(e) })); process.exitCode = 1; });
