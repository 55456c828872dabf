#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One command for a fresh Debian 12 machine: install dependencies, build, run the demo
# (the shipped tiny Grid Sampler model: actions, parity against its golden, latencies).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install_deps.sh"
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$root/build" -j"$(nproc)" > /dev/null
echo "built $root/build/molmoact"
[ "${1:-}" = "--no-demo" ] && exit 0
"$root/build/molmoact" run
