#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Check our QNN declarations (src/backend/qnn/qnn_abi.h) against the SDK's own headers, for
# x86-64 and aarch64: every size, offset and enum value molmoact relies on must match
# (src/backend/qnn/qnn_layout_check.c). The headers are Qualcomm's and are not part of this
# project: pass the include directory of one or more SDKs (the one holding QnnInterface.h).
#
#   scripts/check_qnn_layout.sh /opt/qcom/aistack/qairt/2.47.0/include/QNN [...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
[ $# -gt 0 ] || { echo "usage: $0 SDK_INCLUDE_DIR [...]" >&2; exit 2; }
fail=0
for inc in "$@"; do
  [ -f "$inc/QnnInterface.h" ] || { echo "$inc: no QnnInterface.h" >&2; fail=1; continue; }
  ver=$(sed -n 's/^#define QNN_API_VERSION_MINOR *\([0-9]*\).*/\1/p' "$inc/QnnCommon.h" | head -1)
  for cc in gcc aarch64-linux-gnu-gcc; do
    command -v "$cc" > /dev/null || { echo "  ($cc not installed: skipped)"; continue; }
    if out=$("$cc" -std=c11 -Wall -Wextra -Werror -fsyntax-only -I"$inc" -I"$root/src" "$root/src/backend/qnn/qnn_layout_check.c" 2>&1); then
      echo "ok    $inc (core API 2.$ver) with $cc"
    else
      echo "FAIL  $inc (core API 2.$ver) with $cc"; echo "$out" | grep -E 'error' | head -20; fail=1
    fi
  done
done
exit $fail
