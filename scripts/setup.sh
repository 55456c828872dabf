#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One command for a fresh Debian 12 machine (CI's; Ubuntu 22.04 and 24.04 by the same package
# names, untested): install what building and running need, build, run
# the demo (the shipped tiny Grid Sampler model: actions, parity against its golden, latencies).
#
#   scripts/setup.sh [--no-demo] [--quiet]
#
# The build shows its progress (a line redrawn on a terminal, a line per tenth otherwise); its
# whole output is in build/build.log. The test tools come with scripts/test.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
demo=1 quiet=0
for a in "$@"; do
  case $a in
    --no-demo) demo=0 ;;
    --quiet|-q) quiet=1 ;;
    -h|--help) sed -n '3,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup.sh: unknown option $a (--no-demo, --quiet)" >&2; exit 2 ;;
  esac
done
"$root/scripts/install_deps.sh"
mkdir -p "$root/build"
log=$root/build/build.log
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release > "$log" 2>&1 || { tail -30 "$log" >&2; exit 1; }
# cmake's own "[ NN%]" lines, shown as one progress line, as they come (a bash loop: mawk, the
# awk of Debian and Ubuntu, reads a pipe in large blocks and showed the progress in bursts)
progress() {
  local last=-1 line p tty=0
  [ -t 2 ] && tty=1
  while IFS= read -r line; do
    [[ $line =~ ^\[\ *([0-9]+)%\] ]] || continue
    p=${BASH_REMATCH[1]}
    [ "$quiet" = 1 ] && continue
    if [ $tty = 1 ]; then printf '\r\033[Kbuilding molmoact: %3d%%, %d s' "$p" $((SECONDS - start)) >&2
    elif [ $((p / 10)) -gt $last ]; then last=$((p / 10)); printf 'building molmoact: %d%%, %d s\n' "$p" $((SECONDS - start)) >&2; fi
  done
  if [ "$quiet" != 1 ] && [ $tty = 1 ]; then printf '\n' >&2; fi
  return 0
}
start=$SECONDS
set +e
cmake --build "$root/build" -j"$(nproc)" 2>&1 | tee -a "$log" | progress
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" != 0 ]; then echo "setup.sh: the build failed (build/build.log):" >&2; grep -E 'error|Error' "$log" | head -20 >&2; exit 1; fi
echo "built $root/build/molmoact"
[ $demo = 0 ] && exit 0
"$root/build/molmoact" run
