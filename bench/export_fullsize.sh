#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The ONNX export at full size, one graph at a time (reference/export_onnx.py --streaming): each
# graph written, run in ONNX Runtime against the PyTorch reference, its size, time and peak memory
# (the exporter's and ONNX Runtime's, each its own process) recorded, then removed unless --keep.
#   bench/export_fullsize.sh [--model DIR] [--work DIR] [--graphs vision,llm_split0,...] [--keep]
# The model: the random full-size checkpoint bench/fullsize.sh writes (out/fullsize/ckpt-grid).
# llm (all 36 layers, 13.5 GiB in fp32) is made of the four split graphs, which it exports first:
# it wants 28 GiB of disk and ONNX Runtime about 15 GiB of memory.
# Writes WORK/export.md (a table) and WORK/logs/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=$root/out/fullsize/ckpt-grid work=$root/out/onnx-full keep=0
graphs=vision,llm_split0,llm_split1,llm_split2,llm_split3,action_context,action_step,vision_fused,action_step_fused,llm
while [ $# -gt 0 ]; do
  case $1 in
    --model) model=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --graphs) graphs=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "export_fullsize.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -f "$model/config.json" ] || { echo "export_fullsize.sh: no checkpoint in $model (bench/fullsize.sh writes one)" >&2; exit 1; }
ort=$root/out/ort
"$root/scripts/install_ort.sh" "$ort"
mkdir -p "$work/logs"
table=$work/export.md
{
  echo "# Full-size ONNX export ($(date -u +%Y-%m-%d), $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo))"
  echo
  echo "| graph | weights | beside | export s | exporter peak | ORT peak | worst cosine | max abs diff to unfused |"
  echo "|---|---|---|---|---|---|---|---|"
} > "$table"
for g in ${graphs//,/ }; do
  base=${g%_fused}
  # a fused graph is checked against its unfused twin, which the exporter then writes first
  log=$work/logs/$g.log
  echo "== $g"
  t0=$(date +%s)
  # the exporter and ONNX Runtime (a node child) each print their own peak (VmHWM, maxRSS)
  /usr/bin/python3 "$root/reference/export_onnx.py" --model "$model" -o "$work/out" --streaming \
    --sessions "$g" --verify "$ort/node_modules" > "$log" 2>&1 || { tail -30 "$log"; exit 1; }
  t1=$(date +%s)
  /usr/bin/python3 - "$work/out" "$g" "$base" "$(( t1 - t0 ))" "$log" >> "$table" <<'PY'
import json, os, re, sys
out, g, base, secs, log = sys.argv[1:6]
v = json.load(open(os.path.join(out, "verify.json")))["sessions"][g]
text = open(log).read()
exp = max(int(x) for x in re.findall(r"exporter peak (\d+) MiB", text)) / 1024
ort = max(int(x) for x in re.findall(r"ort_run: peak (\d+) MiB", text)) / 1024
d = os.path.join(out, g)
size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)) / 2**30
worst = min(o["cosine"] for o in v["outputs"].values())
fd = max((o.get("max_abs_diff_unfused", -1) for o in v["outputs"].values()), default=-1)
print(f"| {g} | {size:.2f} GiB | {'yes' if v['external_data'] else 'no'} | {secs} | "
      f"{exp:.1f} GiB | {ort:.1f} GiB | {worst:.9f} | {fd if fd >= 0 else ''} |")
PY
  tail -1 "$table"
  [ $keep = 1 ] || rm -rf "$work/out"  # (llm: its four splits too)
done
echo "table: $table"
