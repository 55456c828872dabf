#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# reference/export_onnx.py on both tiny variants, every graph verified in ONNX Runtime (npm
# onnxruntime-node, installed into ORT_DIR once with --ignore-scripts: its install script only
# fetches GPU providers) against the PyTorch reference: cosine >= 0.99999 on every output; the
# graphs' input and output names are the sessions' (src/runtime/session.h); opset 20, the unsplit
# LLM, the fused variants against their unfused twins, and weights as external data.
#   check_export.sh SOURCE_DIR ORT_DIR WORK_DIR
set -euo pipefail
src=$1 ort=$2 work=$3
mkdir -p "$ort" "$work"
"$src/scripts/install_ort.sh" "$ort"
# tiny-grid as the deployment's defaults (opset 20, weights inside below 2 GiB); tiny-original with
# every graph's weights beside it, read one graph at a time as a full-size export does
# (--streaming); then one graph at opset 17, the exporter's own
for v in tiny-grid tiny-original; do
  rm -rf "$work/$v"
  extra=""
  [ $v = tiny-original ] && extra="--external-data always --streaming"
  /usr/bin/python3 "$src/reference/export_onnx.py" --model "$src/assets/$v/model" -o "$work/$v" --prompt-seq 128 \
    $extra --verify "$ort/node_modules" 2> "$work/$v.log" || { cat "$work/$v.log"; exit 1; }
  /usr/bin/python3 - "$work/$v" "$extra" <<'PY'
import collections, json, os, sys
import onnx
d, external = sys.argv[1], sys.argv[2] != ""
v = json.load(open(os.path.join(d, "verify.json")))
want = {"vision": ["image_features"], "action_context": ["ctx_k", "ctx_v"], "action_step": ["velocity"]}
for i in range(4):
    want[f"llm_split{i}"] = ["hidden_out", "k", "v"]
want.update(llm=["hidden_out", "k", "v"], vision_fused=["image_features"], action_step_fused=["velocity"])
assert set(v["sessions"]) == set(want), v["sessions"].keys()
ops = {}
for s, outs in want.items():
    r = v["sessions"][s]
    assert list(r["outputs"]) == outs, (s, list(r["outputs"]))
    for o in outs:
        assert r["outputs"][o]["cosine"] >= 0.99999, (s, o, r["outputs"][o])
    path = os.path.join(d, s, s + ".onnx")
    data = path + ".data"
    assert r["opset"] == 20 and r["external_data"] == external and os.path.exists(data) == external, (s, r, external)
    assert r["composed_of_splits"] == (s == "llm" and external), (s, r)  # tiny-original runs --streaming
    m = onnx.load(path, load_external_data=False)
    assert [(o.domain, o.version) for o in m.opset_import] == [("", 20)], (s, m.opset_import)
    if external:  # the graph holds no weight of its own: each large one points into the .data file
        big = [t for t in m.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
        assert big and all(e.value == s + ".onnx.data" for t in big for e in t.external_data if e.key == "location"), s
        assert os.path.getsize(path) < os.path.getsize(data), s
    ops[s] = collections.Counter(n.op_type for n in m.graph.node)
    if s.endswith("_fused"):  # one MatMul and one Split per group in place of two or three MatMuls
        base, g = s[:-6], r["fused_groups"]
        assert g > 0 and ops[s]["Split"] - ops[base]["Split"] == g, (s, g, ops[s]["Split"])
        assert ops[base]["MatMul"] - ops[s]["MatMul"] >= g, (s, ops[base]["MatMul"], ops[s]["MatMul"])
        for o in outs:
            assert r["outputs"][o]["max_abs_diff_unfused"] <= 1e-5, (s, o, r["outputs"][o])
    names = [x["name"] for x in json.load(open(os.path.join(d, "inputs", s, "manifest.json")))]
    assert names, s  # the graph's inputs by name: the manifest ort_run.js fed (it refuses a graph missing one)
grid = [n for n in onnx.load(os.path.join(d, "vision", "vision.onnx"), load_external_data=False).graph.node if n.op_type == "GridSample"]
modes = [a.s for n in grid for a in n.attribute if a.name == "mode"]
assert all(m == b"linear" for m in modes), modes  # opset 20's name for bilinear
print(os.path.basename(d), "ok: 10 graphs at opset 20,", "weights beside them," if external else "weights inside,",
      "worst cosine", min(x["cosine"] for r in v["sessions"].values() for x in r["outputs"].values()),
      f"fused {v['sessions']['vision_fused']['fused_groups']} + {v['sessions']['action_step_fused']['fused_groups']} groups"
      f" (max|diff| to unfused {max(x['max_abs_diff_unfused'] for s in ('vision_fused', 'action_step_fused') for x in v['sessions'][s]['outputs'].values()):.3g}),",
      f"GridSample x{len(grid)}" if grid else "no GridSample")
PY
done
grep -q GridSample "$work/tiny-grid/vision/vision.onnx"
/usr/bin/python3 "$src/reference/export_onnx.py" --model "$src/assets/tiny-grid/model" -o "$work/opset17" --opset 17 \
  --sessions vision --verify "$ort/node_modules" 2> "$work/opset17.log" || { cat "$work/opset17.log"; exit 1; }
/usr/bin/python3 -c "import json, sys; r = json.load(open(sys.argv[1]))['sessions']['vision']; assert r['opset'] == 17, r; print('opset 17: vision ok, cosine', r['outputs']['image_features']['cosine'])" "$work/opset17/verify.json"
rm -rf "$work"  # kept only when a check failed
