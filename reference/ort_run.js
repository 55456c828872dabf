// SPDX-License-Identifier: Apache-2.0
// Runs one ONNX graph in ONNX Runtime (npm onnxruntime-node, CPU) and writes its outputs.
//   node ort_run.js MODEL.onnx INPUT_DIR OUT_DIR
// INPUT_DIR: manifest.json [{name, type, dims}] and one raw little-endian NAME.bin per input (as
// bench/compare.py write_raw); OUT_DIR receives NAME.bin (float32) per output and manifest.json.
// The graph must take every input by its name (export_onnx.py keeps them all).
'use strict';
const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');

// this process's own peak: VmHWM (Linux) starts afresh at exec, where getrusage's maxRSS keeps
// the parent's from before the exec
function peakMiB() {
  try {
    const m = /VmHWM:\s+(\d+) kB/.exec(fs.readFileSync('/proc/self/status', 'utf8'));
    if (m) return Math.round(Number(m[1]) / 1024);
  } catch (e) { /* not Linux */ }
  return Math.round(process.resourceUsage().maxRSS / 1024);
}

async function main() {
  const [model, dir, out] = process.argv.slice(2);
  const manifest = JSON.parse(fs.readFileSync(path.join(dir, 'manifest.json'), 'utf8'));
  const feeds = {};
  for (const m of manifest) {
    const buf = fs.readFileSync(path.join(dir, m.name + '.bin'));
    const ab = buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength);
    const data = m.type === 'float32' ? new Float32Array(ab) : m.type === 'int64' ? new BigInt64Array(ab) : new Uint8Array(ab);
    feeds[m.name] = new ort.Tensor(m.type, data, m.dims);
  }
  const sess = await ort.InferenceSession.create(model, {executionProviders: ['cpu'], graphOptimizationLevel: 'all'});
  const missing = sess.inputNames.filter((n) => !(n in feeds));
  if (missing.length) throw new Error(`the graph wants inputs ${missing.join(', ')} the manifest lacks`);
  const used = {};
  for (const n of sess.inputNames) used[n] = feeds[n];
  const res = await sess.run(used);
  fs.mkdirSync(out, {recursive: true});
  const man = [];
  for (const n of sess.outputNames) {
    const t = res[n];
    if (t.type !== 'float32') throw new Error(`output ${n} is ${t.type}, float32 expected`);
    fs.writeFileSync(path.join(out, n + '.bin'), Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength));
    man.push({name: n, type: t.type, dims: t.dims});
  }
  fs.writeFileSync(path.join(out, 'manifest.json'), JSON.stringify(man));
  console.error(`ort_run: peak ${peakMiB()} MiB`);
}

main().catch((e) => { console.error('ort_run: ' + e.message); process.exit(1); });
