#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# molmoact against PyTorch (fp32) and ONNX Runtime (fp32; 4-bit MatMulNBits for action_step) on the
# bench configuration, in one run, same machine, same inputs (the engines take turns component by
# component; medians and minima are printed); then the GEMM micro-benchmark.
#   bench/compare.sh [--runs N] [--rounds R] [--threads T] [--seq S] [--model HF_DIR] [--quick]
# Each component is measured in R rounds (default 3); in each round every engine makes N timed
# runs (action_*: 4N) right after the others, so a drift of the machine's speed (2x and more on
# shared VMs) hits all engines of a round alike; the tables give the median over rounds of
# each round's median, the fastest run, and each round's ratios.
# Without --model it builds the bench checkpoint (real widths, reduced depth) with the reference.
# Needs: build/molmoact (scripts/setup.sh), python3-onnx (installed here when missing) and the npm
# package onnxruntime-node (installed into bench/.ort with --ignore-scripts: its install script
# would download GPU binaries). Writes out/compare/; prints a table of medians and ratios.
# A measurement, not a test: nothing asserts a time.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
runs=5 rounds=3 threads=2 seq=128 model="" quick=0
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    -h|--help) awk 'NR > 2 && !/^#/ { exit } NR > 2 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "compare.sh: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done
py=/usr/bin/python3
work=$root/out/compare
mkdir -p "$work"
[ -x build/molmoact ] || { echo "compare.sh: build/molmoact missing: run scripts/setup.sh first" >&2; exit 1; }

# ---- OpenBLAS: PyTorch's BLAS here and gemm_bench's peer. It picks its kernels by CPU model, and
# Debian 12's 0.3.21 does not know the newer ones: on an Emerald Rapids VM it fell back to
# "Prescott" (SSE3), 5x slower than its AVX-512 kernels, which made PyTorch look 5x slower than
# it is. Name the closest core it knows (OPENBLAS_CORETYPE set by the caller is kept).
[ -x build/gemm_bench ] || { echo "compare.sh: build/gemm_bench missing: run scripts/setup.sh first" >&2; exit 1; }
blas_core=$(build/gemm_bench --openblas-core)
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  case "$blas_core" in
    Prescott|Core2|Penryn|Dunnington|Nehalem|Atom|Sandybridge|Katmai|Coppermine|Northwood|Banias)
      if grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
      elif grep -qw avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell; fi ;;
  esac
fi
echo "== OpenBLAS core: $blas_core${OPENBLAS_CORETYPE:+ -> OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE ($(build/gemm_bench --openblas-core))}"

# ---- peers
if ! $py -c "import onnx" 2> /dev/null; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo=sudo
  echo "== installing python3-onnx (Debian) to export the components"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-onnx > /dev/null
fi
if [ ! -d bench/.ort/node_modules/onnxruntime-node ]; then
  echo "== installing onnxruntime-node (npm, --ignore-scripts) into bench/.ort"
  scripts/install_ort.sh bench/.ort
fi
ort_version=$(node -p "require('$root/bench/.ort/node_modules/onnxruntime-node/package.json').version")

# ---- model: the bench checkpoint and its f16 / q4_0 contexts
if [ -z "$model" ]; then
  model=$work/bench-model
  [ -f "$model/config.json" ] || $py reference/make_checkpoint.py --config bench --variant grid --seed 0 --dtype mixed -o "$model" > /dev/null
fi
for p in f16 q8_0 q4_0; do
  ctx=$work/ctx-$p
  if [ ! -f "$ctx/.done" ] || [ "$ctx/.done" -ot "$model/config.json" ]; then
    echo "== compiling $p context"
    build/molmoact compile "$model" -o "$ctx" --vision $p --llm $p --action $p > /dev/null
    touch "$ctx/.done"
  fi
done
echo "== exporting the components (torch.onnx.export, opset 17) and writing the inputs (prompt $seq tokens)"
$py bench/compare.py prepare --model "$model" --work "$work" --seq "$seq" 2> "$work/prepare.log" > /dev/null ||
  { cat "$work/prepare.log" >&2; exit 1; }

results=$work/results.jsonl
: > "$results"
echo "== PyTorch $($py -c 'import torch; print(torch.__version__)') fp32, ONNX Runtime $ort_version (CPU EP), molmoact; $threads threads"
# tag each JSON line with its round (and an engine name)
tag() {
  $py -c '
import json, sys
r, e = int(sys.argv[1]), (sys.argv[2] if len(sys.argv) > 2 else None)
for line in sys.stdin:
    if line.strip():
        d = json.loads(line)
        d["round"] = r
        if e:
            d["engine"] = e
        print(json.dumps(d), flush=True)' "$@"
}
# engines take turns per component and round, so a drift of the machine's speed hits them alike
for s in vision llm_split0 action_context action_step; do
  n=$runs
  [ $s = action_step ] || [ $s = action_context ] && n=$((runs * 4))
  for r in $(seq 1 "$rounds"); do
    $py bench/compare.py torch --model "$model" --work "$work" --runs "$n" --threads "$threads" --session $s | tag "$r" | tee -a "$results"
    NODE_PATH=bench/.ort/node_modules node bench/ort_bench.js "$work/onnx/$s.onnx" "$work/inputs/$s" "$n" "$threads" ort "$s" | tag "$r" | tee -a "$results"
    [ $s = action_step ] &&
      NODE_PATH=bench/.ort/node_modules node bench/ort_bench.js "$work/onnx/action_step_q4.onnx" "$work/inputs/action_step" "$n" "$threads" ort_q4 action_step | tag "$r" | tee -a "$results"
    for p in f16 q4_0; do
      [ $p = q4_0 ] && [ $s != action_step ] && [ $quick = 1 ] && continue
      build/molmoact bench --model "$work/ctx-$p" --session $s --inputs "$work/inputs/$s.npz" --runs "$n" --threads "$threads" --json |
        tag "$r" "molmoact_$p" | tee -a "$results"
    done
    # action_step with its weights flushed from the caches before each run, as in the full model
    # (36 blocks, 0.6 GB in f16: no cache holds them), against the time to stream them once
    # the read bandwidth the stream times are taken at, measured in each round beside the cold
    # runs (it drifts with the machine: 13.5 and 20.2 GB/s in two runs of one afternoon)
    if [ $s = action_step ]; then
      MOLMOACT_THREADS=$threads build/gemm_bench --bandwidth --json | tag "$r" bandwidth | tee -a "$results"
      for p in f16 q8_0 q4_0; do
        build/molmoact bench --model "$work/ctx-$p" --session $s --inputs "$work/inputs/$s.npz" --runs "$n" --threads "$threads" \
          --cold --json | tag "$r" "molmoact_${p}_cold" | tee -a "$results"
      done
    fi
  done
done

$py - "$results" "$seq" "$runs" "$threads" "$rounds" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
seq, runs, threads, rounds = sys.argv[2:6]
bw_round = {r["round"]: r["read_bandwidth_gbs"] for r in rows if r.get("engine") == "bandwidth" and r["read_bandwidth_gbs"] > 0}
bandwidth = statistics.median(bw_round.values()) if bw_round else None
rows = [r for r in rows if r.get("engine") != "bandwidth"]
by = {}
for r in rows:
    by.setdefault((r["engine"], r["session"]), []).append(r)
t = {k: statistics.median(x["median_ms"] for x in v) for k, v in by.items()}
tmin = {k: min(x["min_ms"] for x in v) for k, v in by.items()}
per_round = {(r["engine"], r["session"], r.get("round", 1)): r["median_ms"] for r in rows}
engines = ["pytorch", "ort", "ort_q4", "molmoact_f16", "molmoact_q4_0"]
names = {"vision": "vision (2 images)", "llm_split0": f"llm_split ({seq} tokens)",
         "action_context": "action_context", "action_step": "action_step (1 step)"}
steps = 10
print(f"\nmedian over {rounds} rounds of each round's median ms ({runs} runs, action_* {4 * int(runs)}), {threads} threads;"
      " ratios = peer time / molmoact time (> 1: molmoact faster)")
print(f"{'component':24} {'PyTorch':>9} {'ORT':>9} {'ORT q4':>9} {'mm f16':>9} {'mm q4_0':>9}   {'PT/f16':>7} {'ORT/f16':>7} {'ORTq4/q4':>8}")
def cell(e, s):
    v = t.get((e, s))
    return f"{v:9.2f}" if v is not None else f"{'-':>9}"
def ratio(a, b):
    return f"{a / b:7.2f}" if a and b else f"{'-':>7}"
for s in ["vision", "llm_split0", "action_context", "action_step"]:
    print(f"{names[s]:24} " + " ".join(cell(e, s) for e in engines) + "   " +
          ratio(t.get(("pytorch", s)), t.get(("molmoact_f16", s))) + " " +
          ratio(t.get(("ort", s)), t.get(("molmoact_f16", s))) + " " +
          f"{ratio(t.get(('ort_q4', s)), t.get(('molmoact_q4_0', s))):>8}")
# end to end from the components: vision + 4 splits + context + 10 steps (host glue is < 1%)
def e2e(e, step_e=None):
    step_e = step_e or e
    parts = [t.get((e, "vision")), t.get((e, "llm_split0")), t.get((e, "action_context")), t.get((step_e, "action_step"))]
    if any(p is None for p in parts):
        return None
    return parts[0] + 4 * parts[1] + parts[2] + steps * parts[3]
tot = {e: e2e(e) for e in engines}
tot["ort_q4"] = None
print(f"{'end to end (sum)':24} " + " ".join(f"{tot[e]:9.1f}" if tot[e] else f"{'-':>9}" for e in engines) + "   " +
      ratio(tot["pytorch"], tot["molmoact_f16"]) + " " + ratio(tot["ort"], tot["molmoact_f16"]))
print("\nthe same with the fastest run of each (less sensitive to the machine's drift)")
for s in ["vision", "llm_split0", "action_context", "action_step"]:
    v = {e: tmin.get((e, s)) for e in engines}
    print(f"{names[s]:24} " + " ".join(f"{v[e]:9.2f}" if v[e] is not None else f"{'-':>9}" for e in engines) + "   " +
          ratio(v["pytorch"], v["molmoact_f16"]) + " " + ratio(v["ort"], v["molmoact_f16"]) + " " +
          f"{ratio(v['ort_q4'], v['molmoact_q4_0']):>8}")
if bandwidth:
    print(f"\naction_step with its weights flushed from the caches before each run, against the time to read them once"
          f" at the read bandwidth measured in the same round (median {bandwidth:.1f} GB/s, rounds "
          + " ".join(f"{bw_round[k]:.1f}" for k in sorted(bw_round)) + f"; {threads} threads; target: at most 1.5x)")
    print(f"{'precision':10} {'weights MB':>10} {'stream ms':>9} {'cold ms':>9} {'warm ms':>9} {'cold/stream':>11}   by round")
    for p in ["f16", "q8_0", "q4_0"]:
        c = by.get((f"molmoact_{p}_cold", "action_step"))
        if not c:
            continue
        mb = c[0]["weight_bytes"] / 1e6
        stream = mb / bandwidth  # MB / (GB/s) = ms, at the median bandwidth
        cold = t[(f"molmoact_{p}_cold", "action_step")]
        warm = t.get((f"molmoact_{p}", "action_step"))
        per = [x["median_ms"] / (mb / bw_round[x["round"]]) for x in sorted(c, key=lambda x: x["round"]) if x["round"] in bw_round]
        print(f"{p:10} {mb:10.1f} {stream:9.2f} {cold:9.2f} " + (f"{warm:9.2f}" if warm else f"{'-':>9}") +
              f" {statistics.median(per) if per else cold / stream:11.2f}   " + " ".join(f"{v:.2f}" for v in per))
print("\neach round's ratios (engines of one round ran within seconds of each other)")
print(f"{'component':24} {'PT/f16':>24} {'ORT/f16':>24} {'ORTq4/q4':>24}")
def rr(a, b, s):
    out = []
    for k in range(1, int(rounds) + 1):
        x, y = per_round.get((a, s, k)), per_round.get((b, s, k))
        out.append(f"{x / y:.2f}" if x and y else "-")
    return " ".join(out)
for s in ["vision", "llm_split0", "action_context", "action_step"]:
    print(f"{names[s]:24} {rr('pytorch', 'molmoact_f16', s):>24} {rr('ort', 'molmoact_f16', s):>24} "
          f"{rr('ort_q4', 'molmoact_q4_0', s):>24}")
EOF
if [ $quick = 0 ]; then
  echo
  echo "== GEMM micro-benchmark (GFLOP/s against the measured FMA peak and OpenBLAS sgemm)"
  MOLMOACT_THREADS=$threads build/gemm_bench
fi
