# SPDX-License-Identifier: Apache-2.0
"""Record the cache tree huggingface_hub's own snapshot_download writes from tests/hub/fake_hub.py's
sample repo (tests/fixtures/hub/huggingface_hub_tree.txt), and check that huggingface_hub reads a
cache molmoact pull wrote (offline snapshot_download finds the snapshot complete).

huggingface_hub and filelock are not Debian packages at the versions needed: give their source
trees, fetched and unmodified (huggingface/huggingface_hub, tox-dev/filelock; filelock's
version.py, which its build generates, written by hand):

    HF_HUB_SRC=/path/huggingface_hub/src HF_HUB_COMMIT=SHA FILELOCK_SRC=/path/filelock/src \\
      /usr/bin/python3 tests/hub/record_hf_tree.py [--check-pull build/molmoact] [-o FILE]

It needs Debian's python3-httpx, python3-tqdm, python3-fsspec, python3-yaml."""
import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fake_hub  # noqa: E402
from tree import cache_tree  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", default=os.path.join(HERE, "../fixtures/hub/huggingface_hub_tree.txt"))
    ap.add_argument("--check-pull", metavar="MOLMOACT", help="also pull with this molmoact and read its cache with huggingface_hub")
    a = ap.parse_args()
    os.environ["HF_HUB_DISABLE_XET"] = "1"
    sys.path[:0] = [os.environ["HF_HUB_SRC"], os.environ["FILELOCK_SRC"]]
    hub = fake_hub.Hub({"test-org/sample": fake_hub.sample_repo()})
    os.environ["HF_ENDPOINT"] = hub.endpoint
    import huggingface_hub
    from huggingface_hub import snapshot_download
    with tempfile.TemporaryDirectory() as t:
        hf = os.path.join(t, "hf")
        snap = snapshot_download("test-org/sample", cache_dir=hf)
        lines = cache_tree(hf)
        head = ["# the cache huggingface_hub %s (%s)'s snapshot_download wrote from tests/hub/fake_hub.py's sample repo"
                % (huggingface_hub.__version__, os.environ.get("HF_HUB_COMMIT", "commit not given: HF_HUB_COMMIT")),
                "# (tests/hub/record_hf_tree.py); one line per entry: kind, path, symlink target or size and SHA-256"]
        with open(a.o, "w") as f:
            f.write("\n".join(head + lines) + "\n")
        print("recorded %d entries from %s into %s" % (len(lines), snap, a.o))
        if a.check_pull:
            mine = os.path.join(t, "mine")
            subprocess.run([a.check_pull, "pull", "test-org/sample", "--endpoint", hub.endpoint, "--cache-dir", mine, "-q"], check=True)
            assert cache_tree(mine) == lines, "molmoact pull's cache differs from huggingface_hub's"
            got = snapshot_download("test-org/sample", cache_dir=mine, local_files_only=True)
            print("huggingface_hub reads molmoact pull's cache offline: %s" % got)
    hub.close()


if __name__ == "__main__":
    main()
