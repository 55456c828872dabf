#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# cli_expect_error.sh BINARY EXPECTED_TEXT ARGS...: the command must fail (non-zero, no crash
# signal) and print EXPECTED_TEXT on stderr.
bin=$1; want=$2; shift 2
err=$("$bin" "$@" 2>&1 >/dev/null); rc=$?
if [ $rc -eq 0 ]; then echo "expected failure, got success"; exit 1; fi
if [ $rc -ge 128 ]; then echo "crashed with signal $((rc - 128))"; exit 1; fi
case "$err" in *"$want"*) exit 0 ;; *) echo "stderr lacks '$want': $err"; exit 1 ;; esac
