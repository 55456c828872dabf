#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The whole test suite: the PyTorch reference (pytest), generated goldens, the C suite (ctest)
# in a release build (GCC) and an ASan + UBSan build (clang), the aarch64 device build under
# qemu, then every fuzzer for a bounded time. Each phase prints its seconds.
#   scripts/test.sh [--quick]   (--quick: no bench goldens, no sanitizer build, no fuzzing)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
quick=0
case "${1:-}" in
  "") ;;
  --quick) quick=1 ;;
  -h|--help) awk 'NR > 2 && !/^#/ { exit } NR > 2 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
  *) echo "test.sh: unknown option $1 (--help)" >&2; exit 2 ;;
esac
jobs=$(nproc)
scripts/install_test_deps.sh
# disk: the goldens at real widths take 2.6 GiB and a compile of them in a test up to 1 GiB more
# for a moment; each phase reports what is free, and the scratch of tests that passed is removed
free_gib() { df -Pk "$1" | awk 'NR == 2 { printf "%.1f", $4 / 1048576 }'; }
disk() { echo "   (disk: $(free_gib "$root") GiB free here, $(free_gib "${TMPDIR:-/tmp}") GiB in ${TMPDIR:-/tmp})"; }
scratch() { rm -rf "$root/$1/test-tmp"; }
disk
if [ $quick = 0 ] && [ "$(free_gib "$root" | cut -d. -f1)" -lt 6 ]; then
  echo "   warning: the full run wants about 6 GiB free at its peak (goldens 2.6 GiB, builds, a compile's scratch)"
fi
export MOLMOACT_UPSTREAM_FIXTURE=${MOLMOACT_UPSTREAM_FIXTURE:-$root/tests/fixtures/upstream-tiny}
echo "== upstream fixture: $MOLMOACT_UPSTREAM_FIXTURE"
goldens="$root/out/goldens"
bench_flag=""
[ $quick = 1 ] && bench_flag="--no-bench"

echo "== generated goldens (PyTorch reference; bench included unless --quick)"
t0=$(date +%s)
scripts/make_test_goldens.sh "$goldens" $bench_flag
echo "   ($(( $(date +%s) - t0 )) s)"

echo "== reference: pytest"
t0=$(date +%s)
# --quick has no bench goldens: the reference's bench test would build its own (90 s); skipped
skip_bench=""
[ $quick = 1 ] && skip_bench=1
MOLMOACT_TEST_GOLDENS="$goldens" MOLMOACT_SKIP_BENCH=$skip_bench /usr/bin/python3 -m pytest -q reference/tests
echo "   ($(( $(date +%s) - t0 )) s)"

echo "== C: release build + ctest"
t0=$(date +%s)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMA_TESTS=ON -DMA_WERROR=ON -DMA_TEST_GOLDENS="$goldens" -DMA_TEST_BENCH=$([ $quick = 1 ] && echo OFF || echo ON) > /dev/null
cmake --build build -j"$jobs" > /dev/null
scratch build
(cd build && ctest --output-on-failure)
scratch build
disk
echo "   ($(( $(date +%s) - t0 )) s)"

[ $quick = 1 ] && { echo "== quick run: done"; exit 0; }

# The device build and its tests under qemu (13 minutes alone, about 1.3 of the 2 cores) run
# beside the sanitizer passes and the fuzzers, which leave a core idle much of the time (ctest
# runs one test at a time, the server tests wait on sockets, each fuzzer is one process); its
# output is printed when it ends. Started before the ASan pass (it was the last phase's tail,
# 13 of CI's 35 minutes, when it started after it).
echo "== the device build (aarch64): tarball, glibc check, tests under qemu (in the background; its output below)"
dev_log=$(mktemp)
# its own process group (setsid), so a failure here stops it and everything it started
# (its status also goes to a file: `wait` is not the only witness of how it ended)
setsid bash -c 't0=$(date +%s); rc=0; scripts/test_device.sh || rc=$?; echo "   ($(( $(date +%s) - t0 )) s)"; echo $rc > "$0.rc"; exit $rc' "$dev_log" > "$dev_log" 2>&1 &
dev_pid=$!
trap 'kill -- -$dev_pid 2> /dev/null || true' EXIT

# One sanitizer pass: clang with ASan + UBSan (+ LSan at exit). It replaced a GCC ASan + UBSan pass
# followed by a clang UBSan pass over most of the same tests (clang's UBSan also checks pointer
# arithmetic on NULL, which GCC's does not): clang's instrumentation covers both, once, and the
# release build above keeps GCC's warnings as errors. About 7 of CI's minutes (issue 41).
echo "== C: ASan + UBSan build (clang) + ctest"
t0=$(date +%s)
CC=clang cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DMA_SANITIZE=ON -DMA_TESTS=ON -DMA_WERROR=ON -DMA_TEST_GOLDENS="$goldens" > /dev/null
cmake --build build-asan -j"$jobs" > /dev/null
(cd build-asan && MOLMOACT_SKIP_BENCH_CONTEXTS=1 MOLMOACT_RESIDENT_REQUESTS=40 MOLMOACT_SOAK_REQUESTS=200 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure)
scratch build-asan
disk
echo "   ($(( $(date +%s) - t0 )) s)"

echo "== fuzzers (libFuzzer + ASan + UBSan, ${MOLMOACT_FUZZ_SECONDS:-12} s each, two at a time)"
t0=$(date +%s)
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DMA_FUZZ=ON -DMA_SANITIZE=ON -DMA_TESTS=OFF -DMA_WERROR=ON > /dev/null
targets="safetensors npz gguf json tokenizer_json bpe image wire jsonbody server grpc pickle"
cmake --build build-fuzz -j"$jobs" --target $(for f in $targets; do printf 'fuzz_%s ' "$f"; done) > /dev/null
fuzz_one() { # TARGET WORK: a bounded run; its findings (crash-*, leak-*, ...) are written into WORK
  ./build-fuzz/fuzz/fuzz_$1 -max_total_time="${MOLMOACT_FUZZ_SECONDS:-12}" -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=0 -artifact_prefix="$2/" "$2/corpus" fuzz/corpus/$1 > "$2/log" 2>&1 || true
}
set -- $targets
while [ $# -gt 0 ]; do
  pair="$1 ${2:-}"
  shift; [ $# -gt 0 ] && shift
  declare -A work=()
  pids=()
  for f in $pair; do work[$f]=$(mktemp -d); mkdir "${work[$f]}/corpus"; fuzz_one "$f" "${work[$f]}" & pids+=($!); done
  wait "${pids[@]}" # these two only: the device build runs in the background too
  for f in $pair; do
    w=${work[$f]}
    grep -E "^Done|ERROR|SUMMARY|runtime error" "$w/log" || true
    # libFuzzer exits non-zero and leaves crash-* files on a finding; a sanitizer report that did
    # not stop the run (UBSan's, where it recovers) fails the step too
    if ls "$w"/crash-* "$w"/leak-* "$w"/timeout-* "$w"/oom-* > /dev/null 2>&1 || grep -qE "SUMMARY: |runtime error:" "$w/log"; then
      echo "fuzz_$f found a failure (kept in $w)"; exit 1
    fi
    rm -rf "$w"
  done
  unset work
done

echo "   ($(( $(date +%s) - t0 )) s)"

echo "== the device build (aarch64), from the background"
wait $dev_pid || true
trap - EXIT
cat "$dev_log"
dev_rc=$(cat "$dev_log.rc" 2> /dev/null || echo "none: it did not finish")
rm -f "$dev_log" "$dev_log.rc"
[ "$dev_rc" = 0 ] || { echo "the device build's tests failed (status $dev_rc)"; exit 1; }
echo "== all tests passed"
