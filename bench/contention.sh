#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Speed when the CPU is not ours alone: each session of the bench model (molmoact f16 and ONNX
# Runtime, the same inputs) and the whole pipeline, with 0, 1 and 2 competing busy processes
# (`yes > /dev/null`, as a robot's other software would be), against the fair-share prediction:
# with T threads and k busy processes on C cores our threads get T*C/(T+k) cores when T+k > C, so
# the quiet time scales by (T+k)/C. Prints mean, median and p90 per row and the mean against the
# prediction. A measurement, not a test: nothing asserts a time.
#
#   bench/contention.sh [--runs N] [--threads T] [--loads "0 1 2"]
#
# Needs bench/compare.sh run once (out/compare: the bench model, its contexts, the exported
# graphs and their inputs, onnxruntime-node in bench/.ort).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
runs=40 threads=2 loads="0 1 2"
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --loads) loads=$2; shift 2 ;;
    *) echo "contention.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
work=$root/out/compare
[ -f "$work/ctx-f16/.done" ] && [ -f "$work/onnx/action_step.onnx" ] || { echo "contention.sh: run bench/compare.sh first (out/compare)" >&2; exit 1; }
py=/usr/bin/python3
cores=$(nproc)
out=$work/contention.jsonl
: > "$out"
busy=()
stop_busy() { for p in "${busy[@]}"; do kill "$p" 2> /dev/null || true; done; wait 2> /dev/null || true; busy=(); }
trap stop_busy EXIT
tag() { $py -c '
import json, sys
for line in sys.stdin:
    if line.strip():
        d = json.loads(line); d["load"] = int(sys.argv[1]); d["engine"] = sys.argv[2]; print(json.dumps(d), flush=True)' "$@"; }
for load in $loads; do
  stop_busy
  for _ in $(seq 1 "$load"); do yes > /dev/null & busy+=($!); done
  sleep 1
  echo "== $load busy process(es) on $cores cores, $threads threads"
  for s in vision llm_split0 action_context action_step; do
    n=$runs
    [ $s = vision ] && n=$((runs / 4 > 3 ? runs / 4 : 3))
    build/molmoact bench --model "$work/ctx-f16" --session $s --inputs "$work/inputs/$s.npz" --runs "$n" --threads "$threads" --json |
      tag "$load" molmoact_f16 | tee -a "$out"
    NODE_PATH=bench/.ort/node_modules node bench/ort_bench.js "$work/onnx/$s.onnx" "$work/inputs/$s" "$n" "$threads" ort "$s" |
      tag "$load" ort | tee -a "$out"
    if [ "$load" = 0 ]; then # one thread alone: the scaling the prediction assumes
      build/molmoact bench --model "$work/ctx-f16" --session $s --inputs "$work/inputs/$s.npz" --runs "$n" --threads 1 --json |
        tag "$load" molmoact_f16_1t | tee -a "$out"
    fi
  done
  build/molmoact bench --model "$work/ctx-f16" --runs "$((runs / 4 > 3 ? runs / 4 : 3))" --threads "$threads" --json | $py -c '
import json, sys
d = json.load(sys.stdin); l = d["latency"]
print(json.dumps({"session": "end_to_end", "mean_ms": l["mean_ms"]["total"], "median_ms": l["median_total_ms"], "p90_ms": l["p90_total_ms"],
                  "min_ms": l["min_total_ms"], "runs": l["runs"]}))' | tag "$load" molmoact_f16 | tee -a "$out"
done
stop_busy
$py - "$out" "$threads" "$cores" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
T, C = int(sys.argv[2]), int(sys.argv[3])
q = {(r["engine"], r["session"]): r for r in rows if r["load"] == 0}
print(f"\n| session | engine | busy | mean ms | median ms | p90 ms | fair-share prediction ms | mean / prediction |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    if r["engine"].endswith("_1t"):
        continue
    k = r["load"]
    base = q.get((r["engine"], r["session"]))
    scale = (T + k) / C if T + k > C else 1.0
    pred = base["mean_ms"] * scale if base and "mean_ms" in base else None
    ratio = f"{r['mean_ms'] / pred:.2f}" if pred else ""
    print(f"| {r['session']} | {r['engine']} | {k} | {r['mean_ms']:.2f} | {r['median_ms']:.2f} | {r.get('p90_ms', 0):.2f} | "
          f"{pred:.2f} | {ratio} |" if pred else f"| {r['session']} | {r['engine']} | {k} | {r['mean_ms']:.2f} | {r['median_ms']:.2f} | | | |")
one = {r["session"]: r for r in rows if r["engine"] == "molmoact_f16_1t"}
if one:
    print("\none thread alone (quiet), mean ms: " + ", ".join(f"{s} {r['mean_ms']:.2f}" for s, r in one.items()))
PY
