#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Which folder of src/ (and tools/) calls into which: from the object files of a build, every
undefined symbol of an object resolved to the folder whose objects define it. Prints the matrix
with counts (distinct symbols) and the calls that go against the layer order
core < io < kernels < model < runtime < backend < api < server < common < tools
(common: src/common/, the CLI's static library molmoact_common).

    scripts/layers.py build            (a configured and built tree)
"""
import os
import subprocess
import sys
from collections import defaultdict

ORDER = ["core", "io", "kernels", "model", "runtime", "backend", "api", "server", "common", "tools"]


def layer_of(obj):
    p = obj.replace(os.sep, "/")
    for marker, name in (("/tools/", "tools"), ("/src/", None)):
        i = p.find(marker)
        if i < 0:
            continue
        if name:
            return name
        return p[i + 5:].split("/")[0]
    return None


def symbols(obj):
    out = subprocess.run(["nm", "--defined-only", "-g", obj], capture_output=True, text=True).stdout
    defined = {l.split()[-1] for l in out.splitlines() if len(l.split()) >= 3 and l.split()[1] in "TDBRVWC"}
    out = subprocess.run(["nm", "-u", obj], capture_output=True, text=True).stdout
    undefined = {l.split()[-1] for l in out.splitlines() if l.strip()}
    return defined, undefined


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    objs = []
    for root, _, files in os.walk(os.path.join(build, "CMakeFiles")):
        if "/tests" in root or "fuzz" in root or "bench" in root or "qnn_stub" in root:
            continue
        for f in files:
            if f.endswith(".o") and ("molmoact_objs.dir" in root or "molmoact_server.dir" in root or "molmoact.dir" in root
                                     or ".dir/src/" in root + "/"):
                objs.append(os.path.join(root, f))
    owner = {}
    per = {}
    for o in sorted(set(objs)):
        lay = layer_of(o)
        if lay is None:
            continue
        d, u = symbols(o)
        per[o] = (lay, u)
        for s in d:
            owner.setdefault(s, lay)
    calls = defaultdict(set)
    for o, (lay, u) in per.items():
        for s in u:
            t = owner.get(s)
            if t and t != lay:
                calls[(lay, t)].add(s)
    print("caller -> callee: distinct functions or objects")
    up = 0
    for (a, b), syms in sorted(calls.items(), key=lambda kv: (ORDER.index(kv[0][0]) if kv[0][0] in ORDER else 99, kv[0][1])):
        bad = a in ORDER and b in ORDER and ORDER.index(b) > ORDER.index(a)
        up += bad
        print(f"  {a:8s} -> {b:8s} {len(syms):4d}{'   UPWARD: ' + ', '.join(sorted(syms)[:6]) if bad else ''}")
    print(f"upward pairs: {up}")
    return 1 if up else 0


if __name__ == "__main__":
    sys.exit(main())
