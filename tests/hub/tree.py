# SPDX-License-Identifier: Apache-2.0
"""A hub cache as lines to compare: each entry's kind, path, and its symlink target or its size and
SHA-256. Lock files, CACHEDIR.TAG's wording and temporary files are left out (each writer has its
own); CACHEDIR.TAG's signature line is kept."""
import hashlib
import os


def cache_tree(root):
    out = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for n in sorted(dirs + files):
            p = os.path.join(d, n)
            rel = os.path.relpath(p, root)
            if rel.startswith(".locks/") and rel.endswith(".lock"):
                continue
            if os.path.islink(p):
                out.append("l %s -> %s" % (rel, os.readlink(p)))
            elif os.path.isdir(p):
                out.append("d %s" % rel)
            elif rel == "CACHEDIR.TAG":
                with open(p) as f:
                    out.append("f %s %s" % (rel, f.readline().strip()))
            else:
                with open(p, "rb") as f:
                    data = f.read()
                out.append("f %s %d %s" % (rel, len(data), hashlib.sha256(data).hexdigest()))
    return sorted(out)
