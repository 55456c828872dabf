#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# npm's onnxruntime-node into DIR/node_modules once (--ignore-scripts: its install script only
# fetches GPU providers); nothing to do when it is there.
#   scripts/install_ort.sh DIR
set -euo pipefail
dir=${1:?usage: install_ort.sh DIR}
[ -d "$dir/node_modules/onnxruntime-node" ] && exit 0
mkdir -p "$dir"
cd "$dir"
[ -f package.json ] || echo '{"name": "molmoact-ort", "private": true}' > package.json
npm install --ignore-scripts --no-audit --no-fund --silent onnxruntime-node > /dev/null
