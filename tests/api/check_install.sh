#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# An installed prefix used as a client uses it: cmake --install, then examples/infer.c built with
# pkg-config alone and run without LD_LIBRARY_PATH (the .pc file's rpath; resident: the workers are
# the installed bin/molmoact, found from the library's own place) on two image files; its chunk
# must equal `molmoact run`'s on the same input. The installed binary runs its demo from
# PREFIX/share/molmoact, and the Python binding loads the prefix's library both as cmake installed
# it and after `pip install ./python` (pkg-config finds the library).
#   check_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd)
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
env -u LD_LIBRARY_PATH "$tmp/infer" "$model" "$img0" "$img1" "pick up the cup" "$state" > "$tmp/out.txt"
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

# the installed binary: its version, help, and the demo from the prefix (not the source tree); no
# path of the source tree compiled into the program or the library (debug information aside)
"$tmp/prefix/bin/molmoact" --version | grep -q '^molmoact [0-9]' || { echo "no --version"; exit 1; }
for f in "$tmp/prefix/bin/molmoact" "$lib/libmolmoact.so.0"; do
  objcopy --strip-debug "$f" "$tmp/stripped" 2> /dev/null || cp "$f" "$tmp/stripped"
  if strings "$tmp/stripped" | grep -F "$src"; then echo "$f names the source tree $src"; exit 1; fi
done
echo "installed program and library: no path of the source tree"
"$tmp/prefix/bin/molmoact" run --quiet > "$tmp/demo.txt" 2>&1 || { cat "$tmp/demo.txt"; exit 1; }
grep -q "demo: model $tmp/prefix/bin/../share/molmoact/tiny-grid/model" "$tmp/demo.txt" || { echo "the demo did not come from the prefix:"; head -3 "$tmp/demo.txt"; exit 1; }
grep -q "PASS" "$tmp/demo.txt" || { echo "the installed demo's parity did not pass"; tail -3 "$tmp/demo.txt"; exit 1; }
echo "installed demo: from $tmp/prefix/share/molmoact, parity PASS"
# the Python binding as cmake installed it
pyp=$(find "$tmp/prefix" -path '*python3/dist-packages' -type d | head -1)
out=$(cd "$tmp" && env -u MOLMOACT_LIBRARY PYTHONPATH="$pyp" /usr/bin/python3 -c "import molmoact; print(molmoact.library_path)")
case $out in "$tmp/prefix/"*) echo "python (cmake --install): $out" ;; *) echo "python loaded $out, not the prefix's library"; exit 1 ;; esac
# pip install ./python into a venv (offline), the library through pkg-config
/usr/bin/python3 -m venv --system-site-packages "$tmp/venv" > /dev/null
cp -r "$src/python" "$tmp/pysrc" # (pip builds in the source directory)
"$tmp/venv/bin/pip" install -q --no-build-isolation --no-index "$tmp/pysrc" > "$tmp/pip.log" 2>&1 || { cat "$tmp/pip.log"; exit 1; }
out=$(cd "$tmp" && env -u MOLMOACT_LIBRARY PKG_CONFIG_PATH="$(dirname "$pc")" "$tmp/venv/bin/python" -c "
import molmoact, numpy as np
p = molmoact.Policy('$model')
print(molmoact.library_path, p.info['variant'])
p.close()")
case $out in "$tmp/prefix/"*grid) echo "python (pip install ./python): $out" ;; *) echo "pip-installed binding: $out"; exit 1 ;; esac
