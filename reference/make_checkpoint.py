#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Write a random MolmoAct2 checkpoint directory with the real key names:
config.json, model.safetensors (or shards), norm_stats.json, tokenizer.json, processor_config.json.

  make_checkpoint.py --config tiny|bench|full --variant grid|original --seed N -o DIR
                     [--dtype f16|bf16|f32|mixed] [--sampler-placement projector|pooling]
                     [--shard-mb MB] [--lerobot] [--streaming] [--set KEY=VALUE ...]

--streaming (always for --config full): written tensor by tensor from a model on the meta
device, the same tensors as without (bf16 shards of --shard-mb, default 4096, and
model.safetensors.index.json); peak memory is about the largest tensor, not the model.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from molmoact_ref import checkpoint, progress, streaming  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, choices=["tiny", "bench", "full"])
    ap.add_argument("--variant", default="grid", choices=["grid", "original"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--dtype", default="f16", choices=["f16", "bf16", "f32", "mixed"])
    ap.add_argument("--sampler-placement", default="projector", choices=["projector", "pooling"],
                    help="grid variant: sample the projected (C = LLM width) or pooled (C = adapter width) grid")
    ap.add_argument("--shard-mb", type=int, default=0, help="write model-*.safetensors shards of at most MB")
    ap.add_argument("--lerobot", action="store_true", help="LeRobot key layout (extra 'model.' prefix)")
    ap.add_argument("--tokenizer", help="ship this tokenizer.json (e.g. the derived MolmoAct2 one) instead of the byte-level stand-in")
    ap.add_argument("--streaming", action="store_true")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config.json field (dotted path, JSON value), e.g. text_config.num_hidden_layers=6")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    a = ap.parse_args()
    if a.quiet:
        progress.set_quiet(True)
    t0 = time.time()
    if a.config == "full" or a.streaming:
        if a.lerobot or a.tokenizer or a.sampler_placement != "projector" or a.dtype == "mixed":
            sys.exit("make_checkpoint: --streaming writes the plain layout (no --lerobot, --tokenizer, --sampler-placement pooling, mixed)")
        import resource
        streaming.write(a.config, a.variant, a.seed, a.out, "bf16" if a.config == "full" and a.dtype == "f16" else a.dtype,
                        a.shard_mb or 4096, a.set)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"wrote {a.out} ({a.config}/{a.variant}, seed {a.seed}, streamed) in {time.time() - t0:.1f} s, peak RSS {peak:.0f} MiB")
        return
    try:
        checkpoint.make(a.config, a.variant, a.seed, a.out, a.dtype, a.sampler_placement, a.shard_mb, a.lerobot,
                        overrides=a.set, tokenizer=a.tokenizer)
    except ValueError as e:
        sys.exit(f"make_checkpoint: {e}")
    print(f"wrote {a.out} ({a.config}/{a.variant}, seed {a.seed}, {a.dtype}) in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
