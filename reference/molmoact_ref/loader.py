# SPDX-License-Identifier: Apache-2.0
"""Load a MolmoAct2 checkpoint directory (config.json + safetensors, single or sharded, fp32 /
bf16 / f16 / mixed, HF or LeRobot key layout) into the fp32 reference model.

Every tensor the model needs must be present with the expected shape; anything else is refused by
name. The Grid Sampler is detected from the checkpoint: the prefix of `scout_mlp.0.weight` and its
width decide whether it exists and where it sits (before or after the projector).
"""

import os
import re

import torch

from . import config as cfglib
from . import safetensors as st
from .model import MolmoAct2

# Present in released checkpoints but not used by continuous-action inference.
OPTIONAL_KEYS = {"lm_head.weight", "model.transformer.ln_f.weight",
                 "model.transformer.rotary_emb.inv_freq"}
SAMPLER_PREFIX = "model.vision_backbone.token_sampler."
_SAMPLER_LEAVES = ["scout_mlp.0.weight", "scout_mlp.0.bias", "scout_mlp.2.weight", "scout_mlp.2.bias",
                   "coord_encoder.0.weight", "coord_encoder.0.bias", "coord_encoder.2.weight",
                   "coord_encoder.2.bias"]


class CheckpointError(ValueError):
    pass


def normalize_keys(tensors):
    """Map LeRobot-saved keys (an extra leading `model.`) onto the HF layout; refuse unmerged LoRA."""
    keys = list(tensors)
    if any(".lora_A." in k or ".base_layer." in k for k in keys):
        bad = next(k for k in keys if ".lora_A." in k or ".base_layer." in k)
        raise CheckpointError(f"tensor {bad!r}: unmerged LoRA adapters are not supported; merge them first")
    if keys and all(k.startswith("model.") for k in keys) and any(k.startswith("model.model.") for k in keys):
        tensors = {k[len("model."):]: v for k, v in tensors.items()}
    return tensors


def find_sampler(tensors):
    """Return (prefix, spec) of the ActiveTokenSampler in the checkpoint, or (None, None)."""
    hits = [k for k in tensors if re.search(r"(^|\.)scout_mlp\.0\.weight$", k)]
    if not hits:
        return None, None
    if len(hits) > 1:
        raise CheckpointError(f"several token samplers in the checkpoint: {hits}")
    prefix = hits[0][: -len("scout_mlp.0.weight")]
    for leaf in _SAMPLER_LEAVES:
        if prefix + leaf not in tensors:
            raise CheckpointError(f"token sampler: tensor {prefix + leaf!r} is missing")
    scout0 = tensors[prefix + "scout_mlp.0.weight"]
    scout2 = tensors[prefix + "scout_mlp.2.weight"]
    coord0 = tensors[prefix + "coord_encoder.0.weight"]
    if scout2.shape[0] % 2:
        raise CheckpointError(f"tensor {prefix + 'scout_mlp.2.weight'!r}: rows {scout2.shape[0]} not 2*K")
    spec = dict(channels=int(scout0.shape[1]), scout_hidden=int(scout0.shape[0]),
                num_tokens=int(scout2.shape[0]) // 2, coord_hidden=int(coord0.shape[0]))
    return prefix, spec


def load_tensors(model_dir):
    try:
        return normalize_keys(st.load_checkpoint_dir(model_dir))
    except st.SafetensorsError as e:
        raise CheckpointError(str(e)) from None


def build(cfg, tensors):
    """Instantiate the reference model from a config and a name -> tensor dict (any float dtype)."""
    prefix, spec = find_sampler(tensors)
    if prefix is not None and prefix != SAMPLER_PREFIX:
        tensors = dict(tensors)
        for leaf in _SAMPLER_LEAVES:
            tensors[SAMPLER_PREFIX + leaf] = tensors.pop(prefix + leaf)
    if spec is None and cfg.get("use_grid_token_sampler"):
        raise CheckpointError("config.json sets use_grid_token_sampler but the checkpoint has no "
                              "token sampler tensors (scout_mlp.0.weight)")
    model = MolmoAct2(cfg, spec)
    expected = model.state_dict()
    n_vit = cfglib.vit_blocks_built(cfg)
    unused_vit = re.compile(r"^model\.vision_backbone\.image_vit\.transformer\.resblocks\.(\d+)\.")
    for name, t in tensors.items():
        if name not in expected:
            m = unused_vit.match(name)
            if m and int(m.group(1)) >= n_vit:
                continue   # upstream builds only max(vit_layers)+1 blocks; later ones are unused
            raise CheckpointError(f"tensor {name!r} is not part of this model configuration")
        if tuple(t.shape) != tuple(expected[name].shape):
            raise CheckpointError(f"tensor {name!r} has shape {list(t.shape)}, expected "
                                  f"{list(expected[name].shape)}")
        if not t.is_floating_point():
            raise CheckpointError(f"tensor {name!r} has non-float dtype {t.dtype}")
    state = {}
    for name, ref in expected.items():
        if name in tensors:
            state[name] = tensors[name].to(torch.float32)
        elif name in OPTIONAL_KEYS:
            state[name] = torch.zeros_like(ref)   # unused by continuous-action inference
        else:
            raise CheckpointError(f"tensor {name!r} is missing from the checkpoint")
    model.load_state_dict(state, strict=True)
    model.eval()
    return model


def load(model_dir):
    """-> (cfg, model) from a checkpoint directory."""
    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        raise CheckpointError(f"{model_dir}: config.json not found")
    cfg = cfglib.load(path)
    return cfg, build(cfg, load_tensors(model_dir))
