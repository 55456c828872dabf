#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Node client's npm packages (ws, @msgpack/msgpack) into NODE_DIR/node_modules, once.
#   setup_node.sh NODE_DIR
set -euo pipefail
mkdir -p "$1"
cd "$1"
if [ ! -d node_modules/ws ] || [ ! -d node_modules/@msgpack/msgpack ]; then
  npm install --no-audit --no-fund --silent ws @msgpack/msgpack > /dev/null
fi
node -e "require('$1/node_modules/ws'); require('$1/node_modules/@msgpack/msgpack'); console.log('node client packages ready')"
