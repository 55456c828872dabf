# SPDX-License-Identifier: Apache-2.0
"""Random MolmoAct2 checkpoints with the real key names and healthy activations.

Initialisation (one torch.Generator, parameters visited in sorted-name order):
  Linear weights N(0, (gain/sqrt(fan_in))^2): gain 1.8 for ViT wq/wk (peaked attention), 0.7 for
  residual output projections, 2.0 for action_embed and adaLN modulation, 0.6 for the final layer;
  biases N(0, 0.1^2) (0.2 for modulation); token embeddings N(0, 1); positional embedding
  N(0, 0.5^2); LayerNorm gamma U(0.6, 1.4), beta N(0, 0.1^2); RMSNorm gamma U(0.6, 1.4), LLM
  q_norm/k_norm gamma U(1.2, 2.6). adaLN and the final layer are not zero (upstream zero-inits
  them, which would make every velocity a constant).
  Attention sink: after a first pass, each expert block's cross_attn.q_proj.bias of head h points
  (length 2*sqrt(head_dim)) at the summed context keys of the cross-attention-masked positions,
  so a missing BOS/EOS mask moves the velocities visibly.
"""

import json
import math
import os

import numpy as np
import torch

from . import config as cfglib
from . import safetensors as st
from . import synthetic
from .model import MolmoAct2

SAMPLER_TOKENS = 16


def sampler_spec(cfg, variant, placement):
    if variant == "original":
        return None
    channels = (cfg["adapter_config"]["text_hidden_size"] if placement == "projector"
                else cfg["adapter_config"]["hidden_size"])
    return dict(channels=channels, num_tokens=SAMPLER_TOKENS, scout_hidden=512, coord_hidden=256)


def _gain(name):
    if ".attention.wq." in name or ".attention.wk." in name:
        return 1.8
    if any(s in name for s in (".attention.wo.", "feed_forward.w2.", "attn_out.", "ff_out.",
                               ".out_proj.", "down_proj.")):
        return 0.7
    if "action_embed." in name or "modulation.linear." in name:
        return 2.0
    if "final_layer.linear." in name:
        return 0.6
    return 1.0


def used_token_rows(cfg, ids):
    """Rows of wte.embedding a prompt can reach: the 256 byte tokens and the special families.
    Other rows stay zero (the real vocabulary cannot be shipped; zero rows keep files small)."""
    rows = set(range(256))
    rows |= set(range(ids["pad"], ids["action_token_start"] + ids["num_action_tokens"]))
    return sorted(r for r in rows if r < cfg["text_config"]["vocab_size"])


@torch.no_grad()
def init_tensor(name, shape, g, cfg, ids, all_rows=False):
    """the initial value of parameter `name` (fp32), drawn from g: the rules above. Callers visit
    the parameters in sorted-name order with one generator (init_weights, streaming.write)."""
    if name.endswith("wte.embedding"):
        t = torch.zeros(shape)
        rows = torch.arange(shape[0]) if all_rows else torch.tensor(used_token_rows(cfg, ids))
        t[rows] = torch.randn((len(rows), shape[1]), generator=g)
        return t
    if name.endswith("wte.new_embedding"):
        return torch.randn(shape, generator=g)
    if name.endswith("positional_embedding"):
        return 0.5 * torch.randn(shape, generator=g)
    if name == "lm_head.weight":
        return torch.randn(shape, generator=g) / math.sqrt(shape[1])
    if name.endswith("_norm.weight") and ("q_norm" in name or "k_norm" in name):
        return 1.2 + 1.4 * torch.rand(shape, generator=g)
    if len(shape) == 1 and name.endswith(".weight"):      # LayerNorm / RMSNorm gamma
        return 0.6 + 0.8 * torch.rand(shape, generator=g)
    if name.endswith("norm.bias"):
        return 0.1 * torch.randn(shape, generator=g)
    if name.endswith(".bias"):
        std = 0.2 if "modulation" in name else 0.1
        if name.endswith("scout_mlp.2.bias"):
            std = 0.5
        return std * torch.randn(shape, generator=g)
    if len(shape) == 2:
        gain = 3.0 if name.endswith("scout_mlp.2.weight") else _gain(name)
        return torch.randn(shape, generator=g) * (gain / math.sqrt(shape[1]))
    raise AssertionError(f"no init rule for {name}")


@torch.no_grad()
def init_weights(model, cfg, ids, seed, all_rows=False):
    g = torch.Generator().manual_seed(int(seed))
    params = dict(model.named_parameters())
    for name in sorted(params):
        params[name].copy_(init_tensor(name, tuple(params[name].shape), g, cfg, ids, all_rows))
    t = cfg["text_config"]
    from .model import rope_inv_freq
    model.model.transformer.rotary_emb.inv_freq.copy_(rope_inv_freq(t["head_dim"], t["rope_theta"]))


def storage_dtypes(model, dtype):
    """name -> torch dtype for the file. 'mixed' mimics LeRobot bf16 policies: large VLM matrices
    bf16; the action expert, every norm weight and the RoPE buffer fp32."""
    base = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
    out = {}
    for name, t in model.state_dict().items():
        if dtype == "mixed":
            keep = (".action_expert." in name or t.dim() < 2 or "rotary_emb" in name)
            out[name] = torch.float32 if keep else torch.bfloat16
        else:
            out[name] = base[dtype]
    return out


def round_to_storage(model, dtypes):
    with torch.no_grad():
        for name, t in model.state_dict().items():
            t.copy_(t.to(dtypes[name]).to(torch.float32))


@torch.no_grad()
def calibrate_attention_sink(model, cfg, model_dir, seed):
    from . import pipeline, processing
    norm = processing.NormStats.load(os.path.join(model_dir, "norm_stats.json"))
    tok = processing.load_tokenizer(os.path.join(model_dir, "tokenizer.json"))
    obs = synthetic.synthetic_observation(seed)
    pixels = np.stack([processing.preprocess_image(cfg, obs[f"image{i}"])[1] for i in range(2)])
    ids = processing.build_prompt_ids(cfg, tok, obs["task"], obs["state"], norm,
                                      pipeline.tokens_per_image(model), 2,
                                      synthetic.PROCESSOR_CONFIG)["input_ids"]
    _, horizon, _ = pipeline.action_plan(cfg, norm)
    out = pipeline.run(model, cfg, norm, pixels, ids, pipeline.initial_noise(cfg, seed, horizon))
    masked = ~out["encoder_mask"]
    if not bool(masked.any()):
        return
    hd = model.model.action_expert.head_dim
    for l, block in enumerate(model.model.action_expert.blocks):
        sink = out["ctx_k"][l][masked].sum(0)                     # [H, hd]
        sink = sink / sink.norm(dim=-1, keepdim=True).clamp(min=1e-12)
        block.cross_attn.q_proj.bias.copy_((2.0 * math.sqrt(hd) * sink).reshape(-1))


def apply_overrides(cfg, overrides):
    """overrides: ["text_config.num_hidden_layers=6", ...] with JSON values; re-validated."""
    import json as _json
    raw = json.loads(json.dumps(cfg))
    for item in overrides or []:
        key, _, value = item.partition("=")
        if not _:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE")
        parts = key.split(".")
        node = raw
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        try:
            node[parts[-1]] = _json.loads(value)
        except ValueError:
            node[parts[-1]] = value
    return cfglib.from_dict(raw)


def tokenizer_vocab(path):
    """the padded vocabulary of a tokenizer.json: its first image token, <im_start>, sits at it"""
    with open(path, encoding="utf-8") as f:
        added = json.load(f).get("added_tokens", [])
    ids = [t["id"] for t in added if t.get("content") == cfglib.EXTRA_TOKENS[0]]
    if len(ids) != 1:
        raise ValueError(f"{path}: no single {cfglib.EXTRA_TOKENS[0]} token")
    return ids[0]


def make(config_name, variant, seed, out_dir, dtype="f16", placement="projector", shard_mb=0,
         lerobot=False, with_lm_head=None, overrides=None, tokenizer=None):
    """tokenizer: a real tokenizer.json (e.g. the derived MolmoAct2 one) to ship instead of the
    byte-level stand-in; every embedding row is then random (real BPE ids reach all of them).
    The config's vocabulary then follows the tokenizer's padding (its <im_start> id)."""
    vocab = tokenizer_vocab(tokenizer) if tokenizer else None
    cfg = cfglib.preset(config_name, variant, text_vocab=vocab)
    if overrides:
        cfg = apply_overrides(cfg, overrides)
    ids = cfglib.preset_ids(config_name)
    if vocab is not None:
        ids = dict(ids, text_vocab=vocab)
    if config_name == "full":
        raise ValueError("the full configuration is written by streaming.write (5.4 B parameters)")
    os.makedirs(out_dir, exist_ok=True)
    cfglib.save(cfg, os.path.join(out_dir, "config.json"))
    synthetic.write_json(synthetic.libero_norm_stats(), os.path.join(out_dir, "norm_stats.json"))
    if tokenizer:
        import shutil
        shutil.copyfile(tokenizer, os.path.join(out_dir, "tokenizer.json"))
    else:
        synthetic.write_json(synthetic.tokenizer_json(cfg, ids), os.path.join(out_dir, "tokenizer.json"))
    synthetic.write_json(synthetic.PROCESSOR_CONFIG, os.path.join(out_dir, "processor_config.json"))
    model = MolmoAct2(cfg, sampler_spec(cfg, variant, placement)).eval()
    init_weights(model, cfg, ids, seed, all_rows=bool(tokenizer))
    dtypes = storage_dtypes(model, dtype)
    round_to_storage(model, dtypes)
    calibrate_attention_sink(model, cfg, out_dir, seed)
    round_to_storage(model, dtypes)
    if with_lm_head is None:
        with_lm_head = config_name != "tiny"   # tiny: vocab x D of unused weights left out
    tensors = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and not with_lm_head:
            continue
        tensors[("model." + name) if lerobot else name] = t.to(dtypes[name]).contiguous()
    if shard_mb:
        st.save_sharded(tensors, out_dir, shard_mb * 1024 * 1024)
    else:
        st.save_file(tensors, os.path.join(out_dir, "model.safetensors"))
    return cfg
