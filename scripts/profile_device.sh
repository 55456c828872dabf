#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One-command profiling on the device from the host (the reference deployment's
# runtime/profile_device.sh, for molmoact):
#   1. copies the device tarball (scripts/build_device.sh) into an ephemeral directory on the
#      device (mktemp under /tmp), unpacks it there;
#   2. links the heavy assets (model/ or ctx/, golden/, qnn_libs/, dsp_libs/) from the persistent
#      workspace, never copying or changing them;
#   3. runs `molmoact run` there (resident) with the given options, with LD_LIBRARY_PATH=qnn_libs
#      and ADSP_LIBRARY_PATH="dsp_libs;/usr/lib/rfsa/adsp;/dsp" (';' separates the DSP's directories);
#      with `-- --backend qnn ...` it first prints, on one line, the graphs each ctx/*.bin holds;
#   4. prints its output (the latency table, the parity table with a golden) and the pure
#      inference time, [infer-ms];
#   5. deletes the ephemeral directory, also on failure or Ctrl-C: nothing persistent is modified.
#
#   scripts/profile_device.sh [--tarball FILE] [--workspace DIR] [--model NAME] [-- RUN OPTIONS...]
# The device: MOLMOACT_DEVICE=user@host (key-based ssh), or the reference's IQ9_info.txt
# (IQ9_INFO=path, default ./IQ9_info.txt: "IP: ..." and "passwd: ..." lines; user root) through
# sshpass when a password is all there is. MOLMOACT_DEVICE_PORT (22) and MOLMOACT_SSH_OPTS add
# ssh options. --workspace defaults to /root/molmoact2_workspace; --model to model/ when the
# workspace has one, else ctx/. With a golden/ in the workspace the parity table is printed too.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tarball="" workspace=/root/molmoact2_workspace model="" run_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --tarball) tarball=$2; shift 2 ;;
    --workspace) workspace=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --) shift; run_args=("$@"); break ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "profile_device.sh: unknown argument $1 (run options go after --)" >&2; exit 2 ;;
  esac
done
if [ -z "$tarball" ]; then
  tarball=$(ls -t "$root"/dist/molmoact-*-aarch64-linux.tar.gz 2> /dev/null | head -1 || true)
  [ -n "$tarball" ] || { echo "profile_device.sh: no dist/molmoact-*-aarch64-linux.tar.gz (scripts/build_device.sh)" >&2; exit 2; }
fi
[ -f "$tarball" ] || { echo "profile_device.sh: $tarball: no such file" >&2; exit 2; }

# how to reach the device
port=${MOLMOACT_DEVICE_PORT:-22}
ssh_opts=(-p "$port" -o BatchMode=yes -o ConnectTimeout=15 -o ServerAliveInterval=15)
scp_opts=(-P "$port" -o BatchMode=yes -o ConnectTimeout=15)
wrap=()
if [ -n "${MOLMOACT_DEVICE:-}" ]; then
  target=$MOLMOACT_DEVICE
else
  info=${IQ9_INFO:-./IQ9_info.txt}
  [ -f "$info" ] || { echo "profile_device.sh: set MOLMOACT_DEVICE=user@host, or give IQ9_info.txt (IQ9_INFO=path)" >&2; exit 2; }
  ip=$(sed -n 's/^[[:space:]]*IP:[[:space:]]*\([^[:space:]]*\).*/\1/p' "$info" | head -1)
  pw=$(sed -n 's/^[[:space:]]*passwd:[[:space:]]*\(.*[^[:space:]]\)[[:space:]]*$/\1/p' "$info" | head -1)
  [ -n "$ip" ] || { echo "profile_device.sh: $info has no 'IP:' line" >&2; exit 2; }
  target=root@$ip
  if [ -n "$pw" ]; then
    command -v sshpass > /dev/null || { echo "profile_device.sh: $info gives a password: install sshpass" >&2; exit 2; }
    export SSHPASS=$pw
    wrap=(sshpass -e)
    ssh_opts=(-p "$port" -o BatchMode=no -o PubkeyAuthentication=no -o ConnectTimeout=15)
    scp_opts=(-P "$port" -o BatchMode=no -o PubkeyAuthentication=no -o ConnectTimeout=15)
  fi
fi
# shellcheck disable=SC2206
extra=(${MOLMOACT_SSH_OPTS:-})
dev() { "${wrap[@]}" ssh "${ssh_opts[@]}" "${extra[@]}" "$target" "$@"; }
q() { printf '%q' "$1"; }                      # one word, quoted for the remote shell
qa() { [ $# -eq 0 ] || printf ' %q' "$@"; }     # words, each quoted, each after a space

# 1. the ephemeral directory, removed whatever happens from here on: named here and the cleanup
# armed before it is made, so a Ctrl-C while the device makes it leaves nothing behind (with a
# remote mktemp the name was unknown until it returned)
tmp=/tmp/molmoact-profile.$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')
made=0
cleanup() {
  trap - EXIT INT TERM
  if [ -n "${ssh_pid:-}" ]; then kill "$ssh_pid" 2> /dev/null || true; fi
  rm -f "${log:-}"
  # the run if it still goes on (an interrupted profile: its workers die with it), then the directory
  [ "$made" = 1 ] || [ "$made" = trying ] || return 0
  dev "if [ -f $(q "$tmp")/run.pid ]; then p=\$(cat $(q "$tmp")/run.pid); kill \$p 2> /dev/null; sleep 0.5; kill -9 \$p 2> /dev/null; fi; rm -rf $(q "$tmp")" ||
    echo "profile_device.sh: could not remove $tmp on the device" >&2
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM
made=trying
dev "mkdir -m 700 $(q "$tmp")" || { made=0; echo "profile_device.sh: could not make $tmp on the device" >&2; exit 1; }
made=1
"${wrap[@]}" scp -q "${scp_opts[@]}" "${extra[@]}" "$tarball" "$target:$tmp/molmoact.tar.gz"
dev "cd $(q "$tmp") && tar xzf molmoact.tar.gz && rm molmoact.tar.gz"

# 2. the heavy assets, linked from the workspace
dev "test -d $(q "$workspace")" || { echo "profile_device.sh: no workspace $workspace on the device" >&2; exit 1; }
dev "cd $(q "$tmp") && for d in model ctx golden qnn_libs dsp_libs; do if [ -e $(q "$workspace")/\$d ]; then ln -s $(q "$workspace")/\$d \$d; fi; done"
if [ -z "$model" ]; then
  if dev "test -e $(q "$tmp")/model"; then model=model; else model=ctx; fi
fi
golden=()
if dev "test -d $(q "$tmp")/golden"; then golden=(--golden golden); fi

# 3a. with --backend qnn: the graphs each context binary holds, on the first line (the first
# device run settles what the reference binaries hold: graph count and names)
qnn=0 prev=""
for a in "${run_args[@]}"; do
  { [ "$a" = "--backend=qnn" ] || { [ "$prev" = "--backend" ] && [ "$a" = qnn ]; }; } && qnn=1
  prev=$a
done
if [ $qnn = 1 ]; then
  # each binary's first line of `inspect` ("FILE: N graphs: a, b (binary info ...)", or the
  # error), after the file's name
  graphs=$(dev "cd $(q "$tmp") && for f in $(q "$model")/ctx/*.bin; do printf '%s: ' \"\${f##*/}\"; \
    LD_LIBRARY_PATH=\$PWD/qnn_libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH} \$PWD/molmoact-*/bin/molmoact inspect \"\$f\" \
    --qnn-lib-dir \$PWD/qnn_libs 2>&1 | head -1 | sed 's|^[^ ]*/ctx/[^ ]*: ||'; done" 2>&1 || true)
  echo "qnn graphs: $(echo "$graphs" | sed 's| (binary info.*||' | paste -sd ';' | sed 's/;/; /g')"
fi

# 3-4. the run, its output and the pure inference time
# (ssh in the background and `wait`: a signal to this script runs the cleanup at once, where a
# foreground ssh would hold the trap until the remote run ended)
log=$(mktemp)
dev "cd $(q "$tmp") && echo \$\$ > run.pid && LD_LIBRARY_PATH=\$PWD/qnn_libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH} \
  ADSP_LIBRARY_PATH=\"\$PWD/dsp_libs;/usr/lib/rfsa/adsp;/dsp\" exec \$PWD/molmoact-*/bin/molmoact run --model $(q "$model")$(qa "${golden[@]}")$(qa "${run_args[@]}")" \
  > "$log" 2>&1 < /dev/null &
ssh_pid=$!
wait $ssh_pid && rc=0 || rc=$?
out=$(cat "$log")
rm -f "$log"
echo "$out"
infer=$(echo "$out" | awk '$1 == "inference" { print $2; exit }')
[ -n "$infer" ] && echo "[infer-ms] $infer (pure inference, mean over the runs; device $target)"
exit $rc
