#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The device build tested under emulation (qemu-user), as CI runs it:
#  1. scripts/build_device.sh --tests: the aarch64 tarball, its glibc <= 2.35 check, and the demo
#     through the parity gate in process on cortex-a76 (fp16 + dotprod, like the A78AE) and
#     cortex-a72 (neither);
#  2. the C tests cross-built and run under qemu: the kernel tests (NEON against the portable
#     set) on both CPU models; the parity tests (tiny goldens and the committed upstream fixture),
#     the contexts, the vision fast path, the f16 compute plan end to end (compile --compute f16,
#     run --golden) and the resident runtime (fewer requests: emulation is about 30x slower) on
#     cortex-a76; the resident demo; and scripts/profile_device.sh against
#     a real sshd on a loopback port (tests/device/test_profile_device.sh).
# The resident workers are re-executed aarch64 binaries: binfmt_misc must know qemu-aarch64
# (registered here from /usr/lib/binfmt.d when the machine allows it).
#   scripts/test_device.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/build_device.sh --tests
sysroot=$root/out/sysroot-aarch64
build=$root/build-aarch64-tests
MA_AARCH64_SYSROOT=$sysroot cmake -S . -B "$build" -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release \
  -DMA_TESTS=ON > /dev/null
cmake --build "$build" -j"$(nproc)" --target molmoact test_kernels test_gemm test_parity test_contexts test_vision test_resident > /dev/null

# binfmt_misc for the re-executed workers
if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2> /dev/null || true; fi
if [ -e /proc/sys/fs/binfmt_misc/register ] && [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] && [ -f /usr/lib/binfmt.d/qemu-aarch64.conf ]; then
  cat /usr/lib/binfmt.d/qemu-aarch64.conf > /proc/sys/fs/binfmt_misc/register 2> /dev/null || true
fi
binfmt=0
[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] && binfmt=1

export QEMU_LD_PREFIX=/usr/aarch64-linux-gnu
export LD_LIBRARY_PATH=$sysroot/usr/lib/aarch64-linux-gnu:$sysroot/lib/aarch64-linux-gnu
for cand in "${MOLMOACT_UPSTREAM_FIXTURE:-}" "$root/tests/fixtures/upstream-tiny"; do
  if [ -n "$cand" ] && [ -d "$cand/full" ]; then export MOLMOACT_UPSTREAM_FIXTURE=$cand; break; fi
done
passed=0 failed=0
run() { # NAME CPU TEST [ENV...]
  local name=$1 cpu=$2 t=$3; shift 3
  local t0=$SECONDS
  if env QEMU_CPU="$cpu" "$@" qemu-aarch64 "$build/tests/$t" > "/tmp/device-$name.log" 2>&1; then
    passed=$((passed + 1)); echo "  ok    $name ($((SECONDS - t0)) s)"
  else
    failed=$((failed + 1)); echo "  FAIL  $name ($((SECONDS - t0)) s)"; tail -20 "/tmp/device-$name.log"
  fi
}
echo "== C tests under qemu-aarch64"
for cpu in cortex-a76 cortex-a72; do
  run "test_kernels-$cpu" $cpu test_kernels
  run "test_gemm-$cpu" $cpu test_gemm
done
run test_parity cortex-a76 test_parity
run test_contexts cortex-a76 test_contexts MOLMOACT_SKIP_BENCH_CONTEXTS=1
run test_vision cortex-a76 test_vision
# the f16 compute plan end to end on the NEON FP16 tiles (cortex-a76 has asimdhp; in process):
# both tiny variants compiled with --compute f16, through their parity gate, the plan line
# saying the tiles ran
for v in grid original; do
  t0=$SECONDS
  ctx=$(mktemp -d)
  if QEMU_CPU=cortex-a76 qemu-aarch64 "$build/molmoact" compile assets/tiny-$v/model -o "$ctx/ctx" --compute f16 -q > /tmp/device-f16-$v.log 2>&1 &&
     QEMU_CPU=cortex-a76 qemu-aarch64 "$build/molmoact" run --model "$ctx/ctx" --golden assets/tiny-$v/golden --inproc >> /tmp/device-f16-$v.log 2>&1 &&
     grep -q "f16 on the NEON FP16 tiles" /tmp/device-f16-$v.log; then
    passed=$((passed + 1)); echo "  ok    f16 plan, tiny-$v: $(grep -o 'end-to-end action cosine [0-9.]*' /tmp/device-f16-$v.log) ($((SECONDS - t0)) s)"
  else
    failed=$((failed + 1)); echo "  FAIL  f16 plan, tiny-$v"; tail -20 /tmp/device-f16-$v.log
  fi
  rm -rf "$ctx"
done
if [ $binfmt = 1 ]; then
  # the resident tests whose behaviour depends on the machine (equal results, workers re-executed
  # under binfmt after a kill, the worker's refusal of a manual start); the deadline, leak and
  # RSS tests are the same logic the native builds run, at 30x the time here
  run test_resident cortex-a76 test_resident MOLMOACT_RESIDENT_REQUESTS=4 \
    MOLMOACT_RESIDENT_ONLY=test_resident_equals_inproc,test_kill_each_worker,test_worker_refuses_manual_start
  t0=$SECONDS
  if QEMU_CPU=cortex-a76 "$build/molmoact" run --model assets/tiny-grid/model --golden assets/tiny-grid/golden --runs 1 > /tmp/device-demo.log 2>&1; then
    passed=$((passed + 1)); echo "  ok    resident demo ($((SECONDS - t0)) s)"
  else
    failed=$((failed + 1)); echo "  FAIL  resident demo"; tail -20 /tmp/device-demo.log
  fi
  t0=$SECONDS
  if tests/device/test_profile_device.sh "$root" > /tmp/device-profile.log 2>&1; then
    passed=$((passed + 1)); echo "  ok    profile_device.sh against a real sshd ($((SECONDS - t0)) s)"
  else
    failed=$((failed + 1)); echo "  FAIL  profile_device.sh"; tail -30 /tmp/device-profile.log
  fi
else
  echo "  (binfmt_misc cannot be set up here: the resident tests and the profiler test under qemu are not run)"
fi
echo "device: $passed passed, $failed failed"
[ $failed = 0 ]
