#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Write a LeRobot MolmoAct2 policy directory from a Hugging Face MolmoAct2 checkpoint, in the
layout LeRobot saves (huggingface/lerobot 7427f31801f944f5ec9ce53cda02862ce7d1638b:
configs/policies.py writes config.json; policies/pretrained.py one model.safetensors of the
policy's state dict, the HF model under `model.`; processor/pipeline.py the pipelines as JSON
plus one safetensors state file per stateful step; policies/molmoact2/processor_molmoact2.py
the steps and their registry names; policies/molmoact2/modeling_molmoact2.py the dtype policy
(bf16, the action expert and every norm kept fp32) and the LoRA wrapping with PEFT (keys under
`model.base_model.model.`, base_layer / lora_A.default / lora_B.default, fp32 adapters)).

  make_lerobot.py --model HF_DIR -o OUT [--repo-id ORG/NAME] [--lora] [--rank R] [--alpha A]
                  [--action-mode continuous|both] [--chunk-size N] [--n-action-steps N]
                  [--constant-state-dim I] [--effective DIR] [--seed S] [--release first|v0.6|main]

--effective DIR also writes the HF directory that runs the same computation (the base config
as LeRobot changes it at load, the statistics with LeRobot's arithmetic in a norm_stats.json,
LoRA merged with PEFT's formula in torch): the reference's golden of OUT comes from it.
--release picks the pipeline layout of a LeRobot release (the normaliser at step 2 in the first
merge, step 3 from v0.6.0 on), so a loader that finds steps by index would fail one of them.
"""
import argparse
import json
import os
import re
import shutil
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from molmoact_ref import safetensors as stio  # noqa: E402

# the LoRA targets at LeRobot main (_lora_target_modules, prefix "model", lm_head included)
LORA_TARGETS = re.compile(r"^(?:model\.(transformer|vision_backbone|image_pooling_2d|image_projector)\.(?:.*\.)?"
                          r"(w1|w2|w3|wq|wk|wv|wo|att_proj|attn_out|ff_proj|ff_out|patch_embedding)|lm_head)\.weight$")


def policy_config(a, hf_cfg, state_dim, action_dim):
    cfg = {
        "type": "molmoact2", "n_obs_steps": 1,
        "input_features": {"observation.images.image": {"type": "VISUAL", "shape": [3, 256, 256]},
                           "observation.images.wrist_image": {"type": "VISUAL", "shape": [3, 256, 256]},
                           "observation.state": {"type": "STATE", "shape": [state_dim]}},
        "output_features": {"action": {"type": "ACTION", "shape": [action_dim]}},
        "device": "cpu", "use_amp": False, "use_peft": False, "push_to_hub": False, "repo_id": None,
        "checkpoint_path": a.repo_id, "checkpoint_revision": None, "checkpoint_force_download": False,
        "chunk_size": a.chunk_size, "n_action_steps": a.n_action_steps,
        "action_mode": a.action_mode, "inference_action_mode": "continuous",
        "norm_tag": None, "norm_stats_path": None, "setup_type": "", "control_mode": "",
        "image_keys": ["observation.images.image", "observation.images.wrist_image"],
        "normalize_language": True, "add_setup_tokens": True, "add_control_tokens": True, "normalize_gripper": False,
        "num_state_tokens": hf_cfg.get("num_state_tokens", 256), "max_sequence_length": None, "expected_max_action_dim": 32,
        "num_inference_steps": None, "mask_action_dim_padding": True, "enable_inference_cuda_graph": False,
        "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "QUANTILES", "ACTION": "QUANTILES"},
        "lora_rank": a.rank, "lora_alpha": a.alpha, "lora_dropout": 0.05, "lora_bias": "none",
    }
    if a.release == "main":
        cfg.update(train_mode_vlm="lora" if a.lora else "fft", dtype="bfloat16")
    else:  # v0.6.x and the first merge
        cfg.update(enable_lora_vlm=bool(a.lora), enable_lora_action_expert=False, train_action_expert_only=False,
                   model_dtype="bfloat16")
    return cfg


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--repo-id", default="allenai/MolmoAct2-LIBERO")
    ap.add_argument("--lora", action="store_true")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16.0)
    ap.add_argument("--action-mode", default="continuous", choices=["continuous", "both"])
    ap.add_argument("--chunk-size", type=int, default=10)
    ap.add_argument("--n-action-steps", type=int, default=10)
    ap.add_argument("--constant-state-dim", type=int, default=None, help="a state dim with q01 == q99 (LeRobot's eps rule)")
    ap.add_argument("--effective")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--release", default="main", choices=["first", "v0.6", "main"])
    a = ap.parse_args()

    with open(os.path.join(a.model, "config.json")) as f:
        hf_cfg = json.load(f)
    with open(os.path.join(a.model, "norm_stats.json")) as f:
        ns = json.load(f)
    meta = ns["metadata_by_tag"]["libero"]
    tensors = stio.load_checkpoint_dir(a.model)
    os.makedirs(a.out, exist_ok=True)
    g = torch.Generator().manual_seed(a.seed)

    # ---- weights: LeRobot's dtype policy, then (optionally) LoRA adapters
    conv = {}
    for name, t in tensors.items():
        t = torch.as_tensor(t).to(torch.float32)
        keep32 = t.dim() == 1 or name.startswith("model.action_expert") or "rotary_emb" in name
        conv[name] = t if keep32 else t.to(torch.bfloat16)
    out, merged = {}, {}
    prefix = "model.base_model.model." if a.lora else "model."
    scale = a.alpha / a.rank
    for name, t in conv.items():
        if a.lora and LORA_TARGETS.match(name) and t.dim() == 2:
            base = name[:-len(".weight")]
            A = torch.randn((a.rank, t.shape[1]), generator=g) * 0.05
            B = torch.randn((t.shape[0], a.rank), generator=g) * 0.05
            out[prefix + base + ".base_layer.weight"] = t
            out[prefix + base + ".lora_A.default.weight"] = A
            out[prefix + base + ".lora_B.default.weight"] = B
            # PEFT's merge_and_unload() (huggingface/peft 5d602fdbff04c33c1c4de55cda9d4ae1d7cb7e40,
            # src/peft/tuners/lora/layer.py, Linear.merge without safe_merge): delta = (B @ A) * scaling
            # in fp32 (fp32 adapters), added to W in place: the sum rounded once to W's dtype
            delta = (B @ A) * scale
            w = t.clone()
            w += delta
            merged[name] = w
        else:
            out[prefix + name] = t
            merged[name] = t
    stio.save_file(out, os.path.join(a.out, "model.safetensors"))

    # ---- the pipelines and their statistics (float32 tensors, the mask as 1.0 / 0.0)
    def stats_tensors(feature, s, constant=None):
        res = {}
        for k in ("mean", "std", "min", "max", "q01", "q99"):
            if s.get(k) is not None:
                res[f"{feature}.{k}"] = torch.tensor(s[k], dtype=torch.float32)
        if constant is not None:
            res[f"{feature}.q01"][constant] = res[f"{feature}.q99"][constant]
        if s.get("mask") is not None:
            res[f"{feature}.mask"] = torch.tensor([1.0 if m else 0.0 for m in s["mask"]], dtype=torch.float32)
        return res
    st_state = stats_tensors("observation.state", meta["state_stats"], a.constant_state_dim)
    st_action = stats_tensors("action", meta["action_stats"])
    state_dim, action_dim = len(meta["state_stats"]["q01"]), len(meta["action_stats"]["q01"])
    norm_idx = 2 if a.release == "first" else 3
    norm_name = "molmoact2_masked_normalizer"
    pre_file = f"policy_preprocessor_step_{norm_idx}_{norm_name}.safetensors"
    post_file = "policy_postprocessor_step_1_molmoact2_masked_unnormalizer.safetensors"
    stio.save_file({**st_state, **st_action}, os.path.join(a.out, pre_file))
    stio.save_file(st_action, os.path.join(a.out, post_file))
    feats = {"observation.state": {"type": "STATE", "shape": [state_dim]}, "action": {"type": "ACTION", "shape": [action_dim]}}
    norm_map = {"VISUAL": "IDENTITY", "STATE": "QUANTILES", "ACTION": "QUANTILES"}
    pack = {"checkpoint_path": a.repo_id, "checkpoint_revision": None, "checkpoint_force_download": False,
            "action_mode": a.action_mode, "image_keys": ["observation.images.image", "observation.images.wrist_image"],
            "setup_type": meta.get("setup_type", ""), "control_mode": meta.get("control_mode", ""),
            "normalize_language": True, "add_setup_tokens": hf_cfg.get("add_setup_tokens", True),
            "add_control_tokens": hf_cfg.get("add_control_tokens", True), "num_state_tokens": hf_cfg.get("num_state_tokens", 256),
            "max_sequence_length": None, "chunk_size": a.chunk_size, "max_action_dim": 32, "env_action_dim": action_dim}
    steps = [{"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
             {"registry_name": "to_batch_processor", "config": {}}]
    if a.release != "first":
        steps.append({"registry_name": "molmoact2_state_frame_transform", "config": {"joint_signs": None, "joint_offsets": None}})
    steps += [{"registry_name": norm_name, "config": {"eps": 1e-8, "features": feats, "norm_map": norm_map}, "state_file": pre_file},
              {"registry_name": "molmoact2_clamp_normalized", "config": {}},
              {"registry_name": "molmoact2_pack_inputs", "config": pack},
              {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}}]
    post = [{"registry_name": "molmoact2_clamp_action", "config": {}},
            {"registry_name": "molmoact2_masked_unnormalizer",
             "config": {"eps": 1e-8, "features": {"action": feats["action"]}, "norm_map": norm_map}, "state_file": post_file}]
    if a.release != "first":
        post.append({"registry_name": "molmoact2_action_frame_transform", "config": {"joint_signs": None, "joint_offsets": None}})
    post.append({"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}})
    with open(os.path.join(a.out, "policy_preprocessor.json"), "w") as f:
        json.dump({"name": "policy_preprocessor", "steps": steps}, f, indent=2)
    with open(os.path.join(a.out, "policy_postprocessor.json"), "w") as f:
        json.dump({"name": "policy_postprocessor", "steps": post}, f, indent=2)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(policy_config(a, hf_cfg, state_dim, action_dim), f, indent=4)

    # ---- the equivalent HF directory, for the golden
    if a.effective:
        os.makedirs(a.effective, exist_ok=True)
        eff = dict(hf_cfg, max_action_horizon=a.chunk_size)
        eff["molmoact_encoder_mask"] = "prompt" if a.action_mode == "continuous" else "action_mode"
        eff.pop("norm_stats_filename", None)
        with open(os.path.join(a.effective, "config.json"), "w") as f:
            json.dump(eff, f, indent=2)
        def plain(ts, feature):
            d = {k.split(".")[-1]: v.tolist() for k, v in ts.items() if k.startswith(feature + ".")}
            if "mask" in d:
                d["mask"] = [bool(m) for m in d["mask"]]
            return d
        lr_meta = {"arithmetic": "lerobot", "eps": 1e-8, "action_stats": plain(st_action, "action"),
                   "state_stats": plain(st_state, "observation.state"), "action_horizon": a.chunk_size,
                   "n_action_steps": a.n_action_steps, "setup_type": meta.get("setup_type", ""),
                   "control_mode": meta.get("control_mode", "")}
        with open(os.path.join(a.effective, "norm_stats.json"), "w") as f:
            json.dump({"format": "molmoact2_norm_stats.v1", "default_tag": "lerobot", "norm_mode": "q01_q99",
                       "metadata_by_tag": {"lerobot": lr_meta}}, f, indent=2)
        stio.save_file({k: v for k, v in merged.items()}, os.path.join(a.effective, "model.safetensors"))
        for name in ("tokenizer.json", "processor_config.json"):
            if os.path.exists(os.path.join(a.model, name)):
                shutil.copy(os.path.join(a.model, name), os.path.join(a.effective, name))
    print(f"wrote {a.out} ({'LoRA r=%d' % a.rank if a.lora else 'full fine-tune'}, {a.action_mode}, release {a.release})")


if __name__ == "__main__":
    main()
