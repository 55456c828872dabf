// SPDX-License-Identifier: Apache-2.0
// Times one ONNX model in ONNX Runtime (npm onnxruntime-node, CPU execution provider).
//   node ort_bench.js MODEL.onnx INPUT_DIR RUNS THREADS LABEL SESSION
// INPUT_DIR holds manifest.json and one raw .bin per input (bench/compare.py prepare writes them).
// Prints one JSON line: median and min over RUNS after one warm-up run.
'use strict';
const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');

async function main() {
  const [model, dir, runsArg, threadsArg, label, session] = process.argv.slice(2);
  const runs = parseInt(runsArg, 10), threads = parseInt(threadsArg, 10);
  const manifest = JSON.parse(fs.readFileSync(path.join(dir, 'manifest.json'), 'utf8'));
  const feeds = {};
  for (const m of manifest) {
    const buf = fs.readFileSync(path.join(dir, m.name + '.bin'));
    const ab = buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength);
    let data;
    if (m.type === 'float32') data = new Float32Array(ab);
    else if (m.type === 'int64') data = new BigInt64Array(ab);
    else data = new Uint8Array(ab);  // bool
    feeds[m.name] = new ort.Tensor(m.type, data, m.dims);
  }
  const sess = await ort.InferenceSession.create(model, {
    executionProviders: ['cpu'], intraOpNumThreads: threads, interOpNumThreads: 1,
    graphOptimizationLevel: 'all',
  });
  // feed only the inputs the exported graph kept (constant folding may drop some)
  const used = {};
  for (const n of sess.inputNames) used[n] = feeds[n];
  const times = [];
  for (let i = 0; i <= runs; i++) {
    const t0 = process.hrtime.bigint();
    await sess.run(used);
    const ms = Number(process.hrtime.bigint() - t0) / 1e6;
    if (i > 0) times.push(ms);
  }
  times.sort((a, b) => a - b);
  const mid = times.length >> 1;
  const median = times.length % 2 ? times[mid] : 0.5 * (times[mid - 1] + times[mid]);
  const mean = times.reduce((a, b) => a + b, 0) / times.length;
  const p90 = times[Math.min(times.length - 1, Math.max(0, Math.ceil(0.9 * times.length) - 1))]; // nearest rank
  console.log(JSON.stringify({engine: label, session, median_ms: median, min_ms: times[0], mean_ms: mean, p90_ms: p90, runs, threads}));
}

main().catch((e) => { console.error('ort_bench: ' + e.message); process.exit(1); });
