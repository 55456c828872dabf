#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Regenerate the committed tiny models and goldens in assets/ (the demo model and the C engine's
parity fixtures). Each asset records how it was made in REGENERATE.json.

  make_assets.py [--root ASSETS_DIR]
"""
import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from molmoact_ref import checkpoint, golden  # noqa: E402

ASSETS = [
    dict(name="tiny-grid", config="tiny", variant="grid", placement="projector", seed=0, dtype="f16", golden_seed=0),
    dict(name="tiny-original", config="tiny", variant="original", seed=0, dtype="f16", golden_seed=0),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets"))
    a = ap.parse_args()
    for spec in ASSETS:
        base = os.path.join(a.root, spec["name"])
        shutil.rmtree(base, ignore_errors=True)
        model_dir, golden_dir = os.path.join(base, "model"), os.path.join(base, "golden")
        checkpoint.make(spec["config"], spec["variant"], spec["seed"], model_dir, dtype=spec["dtype"],
                        placement=spec.get("placement", "projector"))
        _, trace = golden.write(model_dir, golden_dir, seed=spec["golden_seed"])
        meta = {k: v for k, v in spec.items() if k != "name"}
        meta["commands"] = [
            f"/usr/bin/python3 reference/make_checkpoint.py --config {spec['config']} --variant {spec['variant']} "
            f"--seed {spec['seed']} --dtype {spec['dtype']}"
            + (f" --sampler-placement {spec['placement']}" if "placement" in spec else "") + f" -o assets/{spec['name']}/model",
            f"/usr/bin/python3 reference/make_golden.py --model assets/{spec['name']}/model "
            f"-o assets/{spec['name']}/golden --seed {spec['golden_seed']}",
        ]
        with open(os.path.join(base, "REGENERATE.json"), "w") as f:
            json.dump(meta, f, indent=2)
            f.write("\n")
        print(f"{spec['name']}: S={trace['seq_len']}, {trace['tokens_per_image']} tokens/image")


if __name__ == "__main__":
    main()
