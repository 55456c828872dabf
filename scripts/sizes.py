#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The largest C files and functions of src/ and tools/ (a function: a definition opening at
column 0 and its closing brace at column 0), for the maintainers' reports.

    scripts/sizes.py [ROOT] [N]
"""
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "."
n = int(sys.argv[2]) if len(sys.argv) > 2 else 10
files, funcs = [], []
head = re.compile(r"^[A-Za-z_][^;=]*\b([A-Za-z_]\w*)\s*\([^;]*\)\s*\{\s*$")
for top in ("src", "tools"):
    for d, _, fs in os.walk(os.path.join(root, top)):
        for f in fs:
            if not f.endswith((".c", ".h")):
                continue
            p = os.path.join(d, f)
            lines = open(p, errors="replace").read().split("\n")
            files.append((len(lines), os.path.relpath(p, root)))
            start = name = None
            for i, l in enumerate(lines):
                m = head.match(l)
                if m and start is None:
                    start, name = i, m.group(1)
                elif start is not None and l.startswith("}"):
                    funcs.append((i - start + 1, f"{os.path.relpath(p, root)}:{name}"))
                    start = None
print("largest files (lines):")
for c, p in sorted(files, reverse=True)[:n]:
    print(f"  {c:5d}  {p}")
print("largest functions (lines):")
for c, p in sorted(funcs, reverse=True)[:n]:
    print(f"  {c:5d}  {p}")
