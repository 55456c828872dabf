#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The packages molmoact needs to build and run (scripts/setup.sh) on Debian 12, which CI runs, and
# by the same names on Ubuntu 22.04 and 24.04 (from universe; untested here): a C compiler and
# CMake, and the libraries it links, by the names Debian and Ubuntu share (libjpeg-dev, not
# Debian's libjpeg62-turbo-dev or Ubuntu's libjpeg-turbo8-dev). The test tools come with scripts/install_test_deps.sh,
# which scripts/test.sh runs itself.
set -euo pipefail
pkgs=(build-essential cmake pkg-config libcjson-dev zlib1g-dev libpng-dev libjpeg-dev libutf8proc-dev
      libmsgpack-dev libssl-dev libmicrohttpd-dev libwslay-dev libnghttp2-dev libcurl4-openssl-dev python3-numpy)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" > /dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -eq 0 ]; then echo "dependencies: all installed"; exit 0; fi
sudo=""
[ "$(id -u)" -ne 0 ] && sudo=sudo
echo "installing: ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" > /dev/null
