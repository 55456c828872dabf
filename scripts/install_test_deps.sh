#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What the test suite needs beyond building (scripts/test.sh runs this first): the PyTorch
# reference (torch, numpy, PIL, pytest, and onnx, which reads back the graphs export_onnx
# writes), cmocka, clang and its sanitizer runtimes, OpenBLAS (gemm_bench's peer), the real
# clients and peers the tests drive (python3-websockets, python3-msgpack, python3-requests, curl,
# chromium, openssh-server with sshpass, and python3-prometheus-client, whose parser reads the
# server's /metrics, and wrk, scripts/bench_server.py's HTTP load), the aarch64 cross compiler and
# qemu-user, and Node.js/npm (the reference tokenizers, the Node client).
set -euo pipefail
"$(dirname "$0")/install_deps.sh" > /dev/null
pkgs=(clang libclang-rt-14-dev git libopenblas-dev libopenblas0-pthread libcmocka-dev python3-pil python3-torch python3-onnx
      python3-pytest python3-websockets python3-msgpack python3-requests python3-prometheus-client python3-grpcio protobuf-compiler protobuf-compiler-grpc curl chromium wrk
      gcc-aarch64-linux-gnu qemu-user openssh-server openssh-client sshpass)
command -v npm > /dev/null 2>&1 || pkgs+=(nodejs npm)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" > /dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -eq 0 ]; then echo "test dependencies: all installed"; exit 0; fi
sudo=""
[ "$(id -u)" -ne 0 ] && sudo=sudo
echo "installing for the tests: ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" > /dev/null
