#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The long fuzzing campaign (CI runs each target for a few seconds only):
#   scripts/fuzz.sh [--minutes N] [--grow] [TARGET ...]
# TARGET: safetensors npz gguf json tokenizer_json bpe image wire jsonbody server grpc pickle (default: all), each for N minutes
# (default 10) with libFuzzer + ASan + UBSan on every core but one. The corpus of each target is
# fuzz/corpus/TARGET (kept in the tree); a crash, leak, timeout or sanitizer report is copied
# there as crash-TARGET-<sha1> (so every later run and CI replays it) and fails the script.
# --grow also merges the inputs that found new coverage into the tree's corpus (-merge=1).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
minutes=10
grow=0
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes="$2"; shift 2 ;;
    --grow) grow=1; shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    safetensors|npz|gguf|json|tokenizer_json|bpe|image|wire|jsonbody|server|grpc|pickle) targets+=("$1"); shift ;;
    *) echo "fuzz.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ ${#targets[@]} -eq 0 ] && targets=(safetensors npz gguf json tokenizer_json bpe image wire jsonbody server grpc pickle)
case "$minutes" in ''|*[!0-9]*) echo "fuzz.sh: --minutes needs a whole number" >&2; exit 2 ;; esac
jobs=$(( $(nproc) > 1 ? $(nproc) - 1 : 1 ))
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DMA_FUZZ=ON -DMA_SANITIZE=ON -DMA_TESTS=OFF > /dev/null
cmake --build build-fuzz -j"$(nproc)" --target $(for f in "${targets[@]}"; do printf 'fuzz_%s ' "$f"; done) > /dev/null
failed=0
for f in "${targets[@]}"; do
  work=$(mktemp -d)
  arts=$(mktemp -d)
  log="$work.log"
  echo "== fuzz_$f: $minutes min on $jobs job(s)"
  ./build-fuzz/fuzz/fuzz_$f -max_total_time=$((minutes * 60)) -rss_limit_mb=2048 -max_len=65536 -timeout=20 \
    -jobs="$jobs" -workers="$jobs" -print_final_stats=1 -artifact_prefix="$arts/" "$work" fuzz/corpus/$f > "$log" 2>&1 || true
  cat fuzz-*.log >> "$log" 2>/dev/null || true
  rm -f fuzz-*.log
  grep -hE "^#[0-9]+.*DONE|stat::number_of_executed_units|stat::new_units_added|cov:" "$log" | tail -3 || true
  found=0
  for a in "$arts"/*; do
    [ -e "$a" ] || continue
    found=1
    name="crash-$f-$(sha1sum "$a" | cut -c1-12)"
    cp "$a" "fuzz/corpus/$f/$name"
    echo "fuzz_$f: FOUND $(basename "$a") -> fuzz/corpus/$f/$name"
  done
  if grep -qE "SUMMARY: |runtime error:" "$log"; then found=1; grep -m5 -E "SUMMARY: |runtime error:" "$log"; fi
  if [ $found = 1 ]; then failed=1; echo "fuzz_$f: log kept at $log"; else rm -f "$log"; fi
  if [ $grow = 1 ] && [ $found = 0 ]; then
    before=$(ls fuzz/corpus/$f | wc -l)
    ./build-fuzz/fuzz/fuzz_$f -merge=1 -max_len=65536 fuzz/corpus/$f "$work" > /dev/null 2>&1 || true
    echo "fuzz_$f: corpus $before -> $(ls fuzz/corpus/$f | wc -l) files"
  fi
  rm -rf "$work" "$arts"
done
[ $failed = 0 ] && echo "== fuzzing found nothing" || { echo "== fuzzing found failures (reproducers in fuzz/corpus)"; exit 1; }
