#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Run the fp32 reference on one observation and write a golden directory.

  make_golden.py --model DIR -o GOLDEN [--inputs IN.npz] [--seed N] [--streaming]

--streaming: each block's weights are read from the mapped checkpoint only while it runs (the
full-size model on a 16-24 GB machine); the same numbers as without.

IN.npz (all optional; missing parts come from a synthetic observation of --seed):
  pixels float32 [n, 729, 588] | image0, image1 uint8 [H, W, 3]
  input_ids int64 [S]          | task (string), state float32 [8]
  noise float32 [1, 10, max_action_dim] (else torch.randn with --seed)
"""
import argparse
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from molmoact_ref import golden, npzio, progress, synthetic  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--inputs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--streaming", action="store_true")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    a = ap.parse_args()
    if a.quiet:
        progress.set_quiet(True)
    t0 = time.time()
    inputs = None
    if a.inputs:
        inputs = npzio.load(a.inputs)
        obs = synthetic.synthetic_observation(a.seed)
        if not any(k in inputs for k in ("pixels", "image0")):
            inputs.update(image0=obs["image0"], image1=obs["image1"])
        if not any(k in inputs for k in ("input_ids", "task")):
            inputs.update(task=obs["task"], state=obs["state"])
    try:
        out, trace = golden.write(a.model, a.out, inputs, a.seed, streaming=a.streaming)
    except ValueError as e:
        sys.exit(f"make_golden: {e}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"wrote {a.out}: {trace['variant']}, S={trace['seq_len']}, {trace['tokens_per_image']} tokens/image, "
          f"{time.time() - t0:.1f} s, peak RSS {peak:.0f} MiB")


if __name__ == "__main__":
    main()
