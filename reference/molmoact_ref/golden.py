# SPDX-License-Identifier: Apache-2.0
"""Golden directories (docs/ARCHITECTURE.md "Sessions"): each session's inputs and expected outputs in fp32,
the host-glue state before the first Euler step, a trace, norm_stats.json, and every debugging
intermediate."""

import json
import os
import shutil

import numpy as np

from . import loader, npzio, pipeline, processing, synthetic
from .pipeline import to_numpy

GOLDEN_FORMAT = "molmoact_golden.v1"


def resolve_inputs(cfg, model, model_dir, norm, inputs=None, seed=0):
    """-> dict(pixels, input_ids, noise, sources, extras) following the engine's IN.npz contract:
    pixels | image0+image1, input_ids | task+state, noise (else drawn from seed)."""
    obs = dict(inputs) if inputs is not None else synthetic.synthetic_observation(seed)
    extras, src = {}, {}
    if "pixels" in obs:
        pixels = np.asarray(obs["pixels"], dtype=np.float32)
        src["pixels"] = "given"
    elif "image0" in obs and "image1" in obs:
        res = [processing.preprocess_image(cfg, obs[f"image{i}"]) for i in range(2)]
        pixels = np.stack([r[1] for r in res])
        extras["resized_u8"] = np.stack([r[0] for r in res])
        extras["image0"], extras["image1"] = np.asarray(obs["image0"]), np.asarray(obs["image1"])
        src["pixels"] = "image0/image1"
    else:
        raise ValueError("inputs need `pixels` or `image0` and `image1`")
    if "input_ids" in obs:
        ids = np.asarray(obs["input_ids"], dtype=np.int64).reshape(-1)
        src["input_ids"] = "given"
    elif "task" in obs and "state" in obs:
        tok_path = os.path.join(model_dir, "tokenizer.json")
        tok = processing.load_tokenizer(tok_path)
        pc_path = os.path.join(model_dir, "processor_config.json")
        pc = json.load(open(pc_path, encoding="utf-8")) if os.path.isfile(pc_path) else None
        task = str(np.asarray(obs["task"]).item()) if not isinstance(obs["task"], str) else obs["task"]
        p = processing.build_prompt_ids(cfg, tok, task, obs["state"], norm,
                                        pipeline.tokens_per_image(model), pixels.shape[0], pc)
        ids = p["input_ids"]
        extras.update(state=np.asarray(obs["state"], dtype=np.float32),
                      state_normalized=p["state_normalized"], state_bins=p["state_bins"])
        src.update(input_ids="task/state", task=task, task_normalized=p["task_normalized"],
                   prompt_text=p["text"])
    else:
        raise ValueError("inputs need `input_ids` or `task` and `state`")
    _, horizon, _ = pipeline.action_plan(cfg, norm)
    if "noise" in obs:
        noise = np.asarray(obs["noise"], dtype=np.float32)
        src["noise"] = "given"
        seed = None
    else:
        noise = pipeline.initial_noise(cfg, seed, horizon).numpy()
        src["noise"] = f"torch.randn seed {seed}"
    return dict(pixels=pixels, input_ids=ids, noise=noise, sources=src, extras=extras, seed=seed)


def _ranges(mask):
    """[[start, end), ...] runs of True."""
    idx = np.flatnonzero(np.asarray(mask).astype(bool))
    runs = []
    for i in idx:
        if runs and runs[-1][1] == int(i):
            runs[-1][1] = int(i) + 1
        else:
            runs.append([int(i), int(i) + 1])
    return runs


def write(model_dir, out_dir, inputs=None, seed=0, streaming=False):
    """streaming: the model's weights read from the mapped shards block by block (any size)"""
    if streaming:
        from . import streaming as stream
        from .progress import Progress
        model = stream.load(model_dir)
        cfg = model.cfg
        model._reader.progress = Progress("make_golden: streamed blocks run", unit="blocks")
    else:
        cfg, model = loader.load(model_dir)
    norm = processing.NormStats.load(os.path.join(model_dir, cfg["norm_stats_filename"]))
    inp = resolve_inputs(cfg, model, model_dir, norm, inputs, seed)
    out = pipeline.run(model, cfg, norm, inp["pixels"], inp["input_ids"], inp["noise"])
    if streaming and model._reader.progress is not None:
        model._reader.progress.end()
    os.makedirs(out_dir, exist_ok=True)
    f32 = lambda x: to_numpy(x).astype(np.float32)
    u8 = lambda x: to_numpy(x).astype(np.uint8)
    files = {}
    files["vision_io.npz"] = dict(pixels=f32(out["pixels"]), image_features=f32(out["image_features"]))
    for i, sp in enumerate(out["splits"]):
        files[f"llm_split{i}_io.npz"] = dict(
            hidden_in=f32(sp["hidden_in"]), hidden_out=f32(sp["hidden_out"]), k=f32(sp["k"]),
            v=f32(sp["v"]), image_token_mask=u8(out["image_token_mask"]),
            position_ids=to_numpy(out["position_ids"]).astype(np.int64),
            layer_range=np.array([sp["first"], sp["last"]], dtype=np.int64))
    files["action_context_io.npz"] = dict(k=f32(out["llm_k"]), v=f32(out["llm_v"]),
                                          ctx_k=f32(out["ctx_k"]), ctx_v=f32(out["ctx_v"]))
    files["action_step_io.npz"] = dict(x=f32(out["flow_x"]), t=f32(out["flow_t"]),
                                       ctx_k=f32(out["ctx_k"]), ctx_v=f32(out["ctx_v"]),
                                       cross_mask=u8(out["encoder_mask"]),
                                       velocity=f32(out["velocity"]))
    files["step0_boundary.npz"] = dict(
        input_ids=to_numpy(out["input_ids"]).astype(np.int64), noise=f32(out["noise"]),
        x0=f32(out["x0"]), action_valid=u8(out["action_valid"]), cross_mask=u8(out["encoder_mask"]),
        timesteps=f32(out["flow_t"]), image_token_mask=u8(out["image_token_mask"]),
        position_ids=to_numpy(out["position_ids"]).astype(np.int64), llm_input=f32(out["llm_input"]))
    inter = {k: f32(out[k]) for k in (
        "vit_embed", "vit_taps", "pool_query", "pooled", "projected", "sampled",
        "sample_coords", "wte_out", "llm_input", "llm_k", "llm_v", "ctx_k", "ctx_v", "time_cond",
        "modulations", "final_modulation", "flow_x", "velocity", "expert_action_embed",
        "expert_block_out", "traj_final", "raw_action", "actions", "noise") if k in out}
    inter["llm_hidden_split"] = np.stack([f32(sp["hidden_out"]) for sp in out["splits"]])
    inter["encoder_mask"] = u8(out["encoder_mask"])
    inter["trajectory"] = f32(out["traj_final"])
    for k, v in inp["extras"].items():
        inter[k] = np.asarray(v)
    files["intermediates.npz"] = inter
    for name, arrays in files.items():
        npzio.save(os.path.join(out_dir, name), arrays)
    shutil.copyfile(os.path.join(model_dir, cfg["norm_stats_filename"]), os.path.join(out_dir, "norm_stats.json"))

    ids = to_numpy(out["input_ids"])
    action_dim, horizon, n_steps = pipeline.action_plan(cfg, norm)
    vb = model.model.vision_backbone
    trace = {
        "format": GOLDEN_FORMAT,
        "variant": "grid" if vb.sampler_placement else "original",
        "sampler_placement": vb.sampler_placement,
        "tokens_per_image": vb.tokens_per_image(),
        "num_images": int(out["pixels"].shape[0]),
        "seq_len": int(ids.shape[0]),
        "seed": inp["seed"],
        "inputs": inp["sources"],
        "token_layout": {
            "bos_position": 0,
            "image_patch_runs": _ranges(ids == cfg["image_patch_id"]),
            "image_token_runs": _ranges(to_numpy(out["image_token_mask"])),
            "cross_attention_masked": np.flatnonzero(~to_numpy(out["encoder_mask"]).astype(bool)).tolist(),
        },
        "layer_splits": [[sp["first"], sp["last"]] for sp in out["splits"]],
        "timesteps": [float(t) for t in to_numpy(out["flow_t"])],
        "dt": out["dt"],
        "action_dim": action_dim, "action_horizon": horizon, "n_action_steps": n_steps,
        "actions": f32(out["actions"]).tolist(),
        "shapes": {name: {k: list(np.asarray(v).shape) for k, v in arrays.items()}
                   for name, arrays in files.items()},
    }
    with open(os.path.join(out_dir, "trace.json"), "w", encoding="utf-8") as f:
        json.dump(trace, f, indent=1, sort_keys=True)
        f.write("\n")
    return out, trace
