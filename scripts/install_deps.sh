#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Debian 12 packages molmoact needs to build, test and run its PyTorch reference.
set -euo pipefail
pkgs=(build-essential cmake clang libclang-rt-14-dev pkg-config git
      libopenblas-dev libopenblas0-pthread libcjson-dev zlib1g-dev libcmocka-dev
      libpng-dev libjpeg62-turbo-dev libutf8proc-dev python3-pil
      python3-torch python3-numpy python3-pytest
      libssl-dev libmsgpack-dev python3-websockets python3-msgpack python3-requests curl chromium
      gcc-aarch64-linux-gnu qemu-user openssh-server openssh-client sshpass)
# Node.js + npm fetch the reference tokenizers for the tests; keep an existing install
command -v npm > /dev/null 2>&1 || pkgs+=(nodejs npm)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" > /dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -eq 0 ]; then echo "dependencies: all installed"; exit 0; fi
sudo=""
[ "$(id -u)" -ne 0 ] && sudo=sudo
echo "installing: ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" > /dev/null
