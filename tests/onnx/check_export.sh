#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# reference/export_onnx.py on both tiny variants, every graph verified in ONNX Runtime (npm
# onnxruntime-node, installed into ORT_DIR once with --ignore-scripts: its install script only
# fetches GPU providers) against the PyTorch reference: cosine >= 0.99999 on every output; the
# graphs' input and output names are the sessions' (src/runtime/session.h).
#   check_export.sh SOURCE_DIR ORT_DIR WORK_DIR
set -euo pipefail
src=$1 ort=$2 work=$3
mkdir -p "$ort" "$work"
if [ ! -d "$ort/node_modules/onnxruntime-node" ]; then
  (cd "$ort" && { [ -f package.json ] || echo '{"name": "molmoact-ort", "private": true}' > package.json; } &&
    npm install --ignore-scripts --no-audit --no-fund --silent onnxruntime-node > /dev/null)
fi
for v in tiny-grid tiny-original; do
  rm -rf "$work/$v"
  /usr/bin/python3 "$src/reference/export_onnx.py" --model "$src/assets/$v/model" -o "$work/$v" --prompt-seq 128 \
    --verify "$ort/node_modules" 2> "$work/$v.log" || { cat "$work/$v.log"; exit 1; }
  /usr/bin/python3 - "$work/$v" <<'PY'
import json, os, sys
d = sys.argv[1]
v = json.load(open(os.path.join(d, "verify.json")))
want = {"vision": ["image_features"], "action_context": ["ctx_k", "ctx_v"], "action_step": ["velocity"]}
for i in range(4):
    want[f"llm_split{i}"] = ["hidden_out", "k", "v"]
assert set(v["sessions"]) == set(want), v["sessions"].keys()
for s, outs in want.items():
    assert list(v["sessions"][s]) == outs, (s, list(v["sessions"][s]))
    for o in outs:
        assert v["sessions"][s][o]["cosine"] >= 0.99999, (s, o, v["sessions"][s][o])
    assert os.path.getsize(os.path.join(d, s + ".onnx")) > 0
    # the graph's inputs by name: the manifest ort_run.js fed (it refuses a graph missing one)
    names = [m["name"] for m in json.load(open(os.path.join(d, "inputs", s, "manifest.json")))]
    assert names, s
grid = open(os.path.join(d, "vision.onnx"), "rb").read()
print(os.path.basename(d), "ok: 7 graphs, 16 outputs, worst cosine",
      min(x["cosine"] for r in v["sessions"].values() for x in r.values()),
      "GridSample" if b"GridSample" in grid else "no GridSample")
PY
done
grep -q GridSample "$work/tiny-grid/vision.onnx"
rm -rf "$work"  # kept only when a check failed
