#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/profile_device.sh against a real sshd (Debian's openssh-server, started here on a
# loopback port with throwaway keys) whose "device" is this machine: the aarch64 tarball runs
# through qemu-user (binfmt_misc), the workspace is a local folder. Checks: the latency table and
# [infer-ms] come back, the ephemeral directory is gone afterwards, the workspace is unchanged,
# also after a failing run and after Ctrl-C; IQ9_info.txt's IP line is read.
#   test_profile_device.sh SOURCE_DIR
set -uo pipefail
src=$(cd "$1" && pwd)
tarball=$(ls -t "$src"/dist/molmoact-*-aarch64-linux.tar.gz 2> /dev/null | head -1)
[ -n "$tarball" ] || { echo "no device tarball (scripts/build_device.sh)"; exit 1; }
[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || { echo "binfmt_misc has no qemu-aarch64 entry (scripts/test_device.sh registers it)"; exit 1; }
t=$(mktemp -d)
port=$(/usr/bin/python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
ssh-keygen -q -t ed25519 -N "" -f "$t/host_key"
ssh-keygen -q -t ed25519 -N "" -f "$t/client_key"
cp "$t/client_key.pub" "$t/authorized_keys"
chmod 600 "$t/authorized_keys"
mkdir -p /run/sshd
cat > "$t/sshd_config" <<CFG
Port $port
ListenAddress 127.0.0.1
HostKey $t/host_key
AuthorizedKeysFile $t/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile $t/sshd.pid
Subsystem sftp internal-sftp
SetEnv QEMU_LD_PREFIX=/usr/aarch64-linux-gnu QEMU_CPU=cortex-a76
CFG
/usr/sbin/sshd -D -e -f "$t/sshd_config" 2> "$t/sshd.log" &
sshd_pid=$!
trap 'kill $sshd_pid 2> /dev/null; wait $sshd_pid 2> /dev/null; rm -rf "$t"' EXIT
for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/$port) 2> /dev/null && break; sleep 0.1; done
ws=$t/workspace
mkdir -p "$ws"
cp -r "$src/assets/tiny-grid/model" "$ws/model"
cp -r "$src/assets/tiny-grid/golden" "$ws/golden"
mkdir -p "$ws/model/ctx" && printf 'not a real context binary' > "$ws/model/ctx/vision_socid77_archv73.bin"
sum() { (cd "$ws" && find . -type f -exec sha1sum {} + | sort | sha1sum); }
before=$(sum)
export MOLMOACT_DEVICE=root@127.0.0.1 MOLMOACT_DEVICE_PORT=$port
export MOLMOACT_SSH_OPTS="-i $t/client_key -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
leftovers() { ls -d /tmp/molmoact-profile.* 2> /dev/null | wc -l; }
base=$(leftovers)
passed=0 failed=0
check() { if eval "$2"; then passed=$((passed + 1)); echo "  ok    $1"; else failed=$((failed + 1)); echo "  FAIL  $1"; return 1; fi; }

out=$("$src/scripts/profile_device.sh" --tarball "$tarball" --workspace "$ws" -- --runs 2 2>&1); rc=$?
echo "$out" | tail -25
check "profile run exits 0" '[ $rc -eq 0 ]'
check "latency table" 'echo "$out" | grep -q "action_step x10"'
check "parity against the workspace golden" 'echo "$out" | grep -q "gate 0.9999): PASS"'
check "[infer-ms] line" 'echo "$out" | grep -Eq "^\[infer-ms\] [0-9.]+"'
check "ephemeral directory removed" '[ "$(leftovers)" -eq "$base" ]'
check "workspace unchanged" '[ "$(sum)" = "$before" ]'

out=$("$src/scripts/profile_device.sh" --tarball "$tarball" --workspace "$ws" -- --bogus 2>&1); rc=$?
check "a failing run fails" '[ $rc -ne 0 ] && echo "$out" | grep -q "unknown option --bogus"'
check "removed after a failure" '[ "$(leftovers)" -eq "$base" ]'

# --backend qnn: the graphs of each context binary first, on one line (here the QNN libraries are
# missing, so the line names the failure and the run fails)
out=$("$src/scripts/profile_device.sh" --tarball "$tarball" --workspace "$ws" -- --backend qnn --runs 1 2>&1); rc=$?
check "qnn: the graphs line comes first" 'echo "$out" | head -1 | grep -q "^qnn graphs: vision_socid77_archv73.bin: "' || echo "$out" | head -3
check "qnn without libraries fails, named" '[ $rc -ne 0 ] && echo "$out" | grep -q "libQnnHtp.so"'
check "removed after the qnn run" '[ "$(leftovers)" -eq "$base" ]'

# Ctrl-C as a terminal sends it: SIGINT to the profiler's process group (job control on, so the
# background job is its own group and does not start with SIGINT ignored)
# (through a wrapper that gives SIGINT its default disposition: a harness that started this test
# in the background of a non-interactive shell passes SIGINT down ignored, and bash cannot trap
# a signal ignored at its start, as a terminal's shell would not have it)
set -m
/usr/bin/python3 -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); signal.signal(signal.SIGQUIT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])' \
  "$src/scripts/profile_device.sh" --tarball "$tarball" --workspace "$ws" -- --runs 200 > "$t/long.log" 2>&1 &
p=$!
set +m
for _ in $(seq 300); do [ "$(leftovers)" -gt "$base" ] && grep -q . "$t/long.log" 2> /dev/null; [ "$(leftovers)" -gt "$base" ] && break; sleep 0.1; done
sleep 3
kill -INT -- -$p
wait $p; rc=$?
sleep 1
check "Ctrl-C stops it (exit 130)" '[ $rc -eq 130 ]' || { echo "    it exited $rc; its output:"; tail -5 "$t/long.log" | sed 's/^/    /'; }
check "removed after Ctrl-C" '[ "$(leftovers)" -eq "$base" ]'
check "no run left behind" '! pgrep -f "/tmp/molmoact-profile\." > /dev/null'
check "workspace unchanged at the end" '[ "$(sum)" = "$before" ]'

printf 'IP: 127.0.0.1\n' > "$t/IQ9_info.txt"
out=$(env -u MOLMOACT_DEVICE IQ9_INFO="$t/IQ9_info.txt" "$src/scripts/profile_device.sh" --tarball "$tarball" --workspace "$ws" -- --runs 1 2>&1); rc=$?
check "IQ9_info.txt's IP line" '[ $rc -eq 0 ] && echo "$out" | grep -q "device root@127.0.0.1"'
echo "profile_device: $passed passed, $failed failed"
[ $failed -eq 0 ]
