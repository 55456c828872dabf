#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# An installed prefix used as a client uses it: cmake --install, then examples/infer.c built with
# pkg-config alone and run (resident: the workers are the installed bin/molmoact, found from the
# library's own place) on two image files; its chunk must equal `molmoact run`'s on the same input.
#   check_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" > /dev/null
for f in bin/molmoact include/molmoact.h; do [ -e "$tmp/prefix/$f" ] || { echo "not installed: $f"; exit 1; }; done
pc=$(find "$tmp/prefix" -name molmoact.pc)
lib=$(dirname "$(find "$tmp/prefix" -name 'libmolmoact.so.0' | head -1)")
[ -n "$pc" ] && [ -n "$lib" ] || { echo "no molmoact.pc or libmolmoact.so.0 installed"; exit 1; }
export PKG_CONFIG_PATH=$(dirname "$pc")
cc -std=c11 -Wall -Wextra -Werror "$src/examples/infer.c" $(pkg-config --cflags --libs molmoact) -o "$tmp/infer"
img0=$src/fuzz/corpus/image/rgb.png img1=$src/fuzz/corpus/image/rgb.jpg model=$src/assets/tiny-grid/model
state=0.1,-0.2,0.9,3.0,-0.1,0.05,0.03,-0.03
LD_LIBRARY_PATH=$lib "$tmp/infer" "$model" "$img0" "$img1" "pick up the cup" "$state" > "$tmp/out.txt"
cat "$tmp/out.txt"
tail -n +2 "$tmp/out.txt" > "$tmp/api.txt"
[ "$(wc -l < "$tmp/api.txt")" -eq 10 ] || { echo "expected 10 action rows"; exit 1; }
"$tmp/prefix/bin/molmoact" run --model "$model" --image0 "$img0" --image1 "$img1" --task "pick up the cup" --state "$state" \
  --seed 0 --runs 1 --json > "$tmp/cli.json"
/usr/bin/python3 - "$tmp/cli.json" "$tmp/api.txt" <<'PY'
import json, sys
cli = json.load(open(sys.argv[1]))["actions"]
api = [[float(v) for v in l.split()] for l in open(sys.argv[2])]
assert all(abs(a - b) <= 5e-7 * (1 + abs(b)) for ra, rb in zip(api, cli) for a, b in zip(ra, rb)), (api, cli)
print("installed example = molmoact run (to its printed 6 decimals)")
PY
