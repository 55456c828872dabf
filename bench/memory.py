# SPDX-License-Identifier: Apache-2.0
"""Peak memory of the resident runtime, measured on the bench model per precision and
extrapolated to the full MolmoAct2-LIBERO model.

    memory.py --checkpoint HF_DIR --contexts DIR_f16 [DIR_q4_0 ...] [--molmoact build/molmoact]

For each context directory it runs `molmoact bench --json` (resident, six workers) and reads
the peak RSS of the orchestrator and the workers. Mapped weights count in RSS as their pages are
touched, so

    full estimate = measured RSS - bench weight bytes + full weight bytes + extra K/V buffers

where weight bytes follow the precision (f16/bf16: 2 B per parameter, q8_0: 34/32, q4_0: 18/32;
vectors stay f32; the embedding table stays f16 and only its looked-up rows are touched), the
full model's parameter count comes from the bench checkpoint's tensors with the per-layer ones
scaled to the full depth (ViT 25 built blocks, LLM 36 layers, expert 36 blocks) and the
full vocabulary, and the extra K/V term is the 36-layer K/V and context copies held at once.
A measurement plus arithmetic, not a test.
"""

import argparse
import json
import os
import re
import struct
import subprocess
import sys

BYTES = {"f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
FULL = {"vit_blocks": 25, "llm_layers": 36, "expert_blocks": 36, "vocab": 154624}  # wte.embedding rows (the release)
BENCH_PROMPT_KV = 128  # tokens of the K/V the extra term assumes (the grid variant's prompt)


def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def checkpoint_tensors(model_dir):
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
    out = {}
    for fn in files:
        for k, v in header(os.path.join(model_dir, fn)).items():
            if k != "__metadata__":
                out[k] = v["shape"]
    return out


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def component(name):
    if "vision_backbone" in name:
        return "vision"
    if "transformer.wte" in name:
        return "embed"
    if "action_expert" in name:
        return "action"
    if "transformer" in name:
        return "llm"
    return None   # lm_head: unused for continuous actions, not in any context


def weight_bytes(tensors, prec, scale):
    """bytes per component; scale(name) gives the factor from the bench depth to the target"""
    out = {"vision": 0.0, "embed": 0.0, "llm": 0.0, "action": 0.0}
    for name, shape in tensors.items():
        c = component(name)
        if c is None or "time_embed" in name or "modulation.linear" in name:
            continue   # modulation weights are folded into a table at compile time
        f = scale(name, shape)
        if len(shape) == 1:
            b = 4.0 * numel(shape)
        elif c == "embed":
            b = 2.0 * numel(shape)
        elif prec in ("q8_0", "q4_0") and shape[-1] % 32:
            b = 2.0 * numel(shape)
        else:
            b = BYTES[prec] * numel(shape)
        out[c] += b * f
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--contexts", nargs="+", required=True)
    ap.add_argument("--molmoact", default="build/molmoact")
    a = ap.parse_args()
    tensors = checkpoint_tensors(a.checkpoint)
    cfg = json.load(open(os.path.join(a.checkpoint, "config.json")))
    bench_layers = {"vit": max(int(m.group(1)) for n in tensors
                               for m in [re.search(r"resblocks\.(\d+)\.", n)] if m) + 1,
                    "llm": cfg["text_config"]["num_hidden_layers"],
                    "expert": cfg["action_expert_config"]["num_layers"]}

    def same(name, shape):
        return 1.0

    def to_full(name, shape):
        if "resblocks." in name:
            return FULL["vit_blocks"] / bench_layers["vit"]
        if "transformer.blocks." in name:
            return FULL["llm_layers"] / bench_layers["llm"]
        if "action_expert.blocks." in name:
            return FULL["expert_blocks"] / bench_layers["expert"]
        if "transformer.wte.embedding" in name:
            return FULL["vocab"] / shape[0]
        return 1.0

    t = cfg["text_config"]
    kvdim = t["num_key_value_heads"] * t["head_dim"]
    ed = cfg["action_expert_config"]["hidden_size"]
    extra_layers = FULL["llm_layers"] - bench_layers["llm"]
    # K/V of the extra layers in the orchestrator and the action_context worker, and the
    # projected context in the action_context and action_step workers
    extra_kv = extra_layers * BENCH_PROMPT_KV * 4 * (2 * kvdim * 2 + 2 * ed * 2)

    print(f"{'precision':9} {'measured RSS':>13} {'bench weights':>14} {'runtime':>9} {'full weights':>13} "
          f"{'full estimate':>14}")
    rows = []
    for ctx in a.contexts:
        prec = os.path.basename(os.path.normpath(ctx)).split("ctx-")[-1]
        if prec not in BYTES:
            sys.exit(f"{ctx}: name it ctx-<precision> (f16, bf16, q8_0, q4_0)")
        r = subprocess.run([a.molmoact, "bench", "--model", ctx, "--runs", "1", "--json"], capture_output=True, text=True)
        if r.returncode:
            sys.exit(r.stderr)
        d = json.loads(r.stdout)
        rss = (d["peak_rss_kb"]["orchestrator"] + d["peak_rss_kb"]["workers"]) * 1024.0
        # the embedding table is mapped, only the prompt's rows are read: count none of it
        wb = weight_bytes(tensors, prec, same)
        wf = weight_bytes(tensors, prec, to_full)
        bench_w = wb["vision"] + wb["llm"] + wb["action"]
        full_w = wf["vision"] + wf["llm"] + wf["action"]
        runtime = rss - bench_w
        est = runtime + full_w + extra_kv
        gib = 1024.0 ** 3
        print(f"{prec:9} {rss / gib:10.2f} GiB {bench_w / gib:11.2f} GiB {runtime / gib:6.2f} GiB "
              f"{full_w / gib:10.2f} GiB {est / gib:11.2f} GiB")
        rows.append(dict(precision=prec, measured_rss=rss, bench_weights=bench_w, runtime=runtime,
                         full_weights=full_w, full_estimate=est, open_ms=d.get("open_ms")))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
