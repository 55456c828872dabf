# SPDX-License-Identifier: Apache-2.0
"""One observation end to end, session by session, keeping every intermediate.

The session boundaries are the C engine's: vision, llm_split0..3, action_context, action_step
(x steps); everything between them is host glue (embedding + scatter, mask and positions, Euler
loop, de-normalisation).
"""

import numpy as np
import torch

from . import config as cfglib
from . import rtc as rtclib
from .model import encoder_mask, image_token_mask

NUM_SPLITS = 4


def split_ranges(num_layers, num_splits=NUM_SPLITS):
    """Contiguous layer ranges, as even as possible, earlier splits taking the remainder."""
    base, extra = divmod(num_layers, num_splits)
    ranges, start = [], 0
    for i in range(num_splits):
        n = base + (1 if i < extra else 0)
        ranges.append((start, start + n))
        start += n
    return ranges


def initial_noise(cfg, seed, horizon):
    g = torch.Generator().manual_seed(int(seed))
    return torch.randn((1, horizon, cfg["max_action_dim"]), generator=g, dtype=torch.float32)


def action_plan(cfg, norm):
    """(action_dim, horizon, n_action_steps) from norm_stats metadata and the config."""
    action_dim = norm.action_dim
    if action_dim > cfg["max_action_dim"]:
        raise ValueError(f"norm_stats action_dim {action_dim} exceeds max_action_dim {cfg['max_action_dim']}")
    horizon = norm.get_int("action_horizon") or cfg["max_action_horizon"]
    if not 1 <= horizon <= cfg["max_action_horizon"]:
        raise ValueError(f"action_horizon {horizon} outside 1..{cfg['max_action_horizon']}")
    n_steps = norm.get_int("n_action_steps") or horizon
    if not 1 <= n_steps <= horizon or cfg["n_obs_steps"] - 1 + n_steps > horizon:
        raise ValueError(f"n_action_steps {n_steps} does not fit the horizon {horizon}")
    return action_dim, horizon, n_steps


def lerobot_layout(cfg, input_ids, multiple=8):
    """The prompt as LeRobot lays it out (huggingface/lerobot c13d79e6 and later,
    processor_molmoact2.py and processing_molmoact2.py insert_bos, utils_molmoact2.py): the
    tokens after BOS left-padded with the pad id to a multiple of 8, BOS written at the first
    valid place, positions clamp(cumsum(mask) - 1, 0). -> (ids, valid mask, positions)."""
    ids = np.asarray(input_ids, dtype=np.int64)
    body = ids[1:]
    npad = (-len(body)) % multiple
    pad = cfg["pad_token_id"] if cfg.get("pad_token_id") is not None else 0
    out = np.concatenate([np.full(npad, pad, np.int64), ids[:1], body])
    valid = np.concatenate([np.zeros(npad, bool), np.ones(len(ids), bool)])
    pos = np.maximum(np.cumsum(valid.astype(np.int64)) - 1, 0)
    return out, valid, pos


@torch.no_grad()
def run(model, cfg, norm, pixels, input_ids, noise, layout=None, rtc_prefix=None, rtc_delay=0, rtc_horizon=None,
        rtc_beta=None, rtc_schedule="LINEAR"):
    """pixels float32 [n, P, 588], input_ids int64 [S], noise float32 [1, A, Da] -> dict of arrays.
    layout "lerobot": the prompt left-padded as LeRobot pads it (lerobot_layout), the padding
    hidden from attention by a key mask.
    rtc_prefix (float32 [rows, dim], normalised; dim the action dim or max_action_dim): real-time
    chunking as LeRobot guides MolmoAct2 (rtc.py): each Euler step's velocity pulled toward the
    previous chunk's leftover, its row 0 on trajectory row n_obs_steps - 1 (the first row
    returned); rtc_delay d, rtc_horizon H (None/0: 10, clipped to rows), rtc_beta (None/0: 10),
    rtc_schedule LINEAR | EXP | ONES | ZEROS. None: no guidance (the loop as without it)."""
    out = {}
    pixels = torch.as_tensor(np.asarray(pixels, dtype=np.float32))
    valid = None
    if layout == "lerobot":
        input_ids, valid, positions = lerobot_layout(cfg, input_ids)
        valid = torch.as_tensor(valid)
    ids = torch.as_tensor(np.asarray(input_ids, dtype=np.int64))
    noise = torch.as_tensor(np.asarray(noise, dtype=np.float32))
    s = ids.shape[0]

    # ---- vision session
    vtrace = {}
    feats = model.vision(pixels, trace=vtrace)
    out["pixels"] = pixels
    out["image_features"] = feats
    for k in ("vit_embed", "vit_hidden", "vit_taps", "pool_query", "pooled", "projected", "sampled",
              "sample_coords"):
        if k in vtrace:
            out[k] = vtrace[k]

    # ---- host glue: embedding, scatter, mask, positions
    out["input_ids"] = ids
    out["wte_out"] = model.model.transformer.wte(ids)
    hidden = model.embed(ids, feats)
    out["llm_input"] = hidden
    img = image_token_mask(cfg, ids)
    pos = torch.arange(s, dtype=torch.int64) if valid is None else torch.as_tensor(positions)
    out["image_token_mask"] = img
    out["position_ids"] = pos

    # ---- llm_split sessions
    ks, vs, hs, splits = [], [], [], []
    for first, last in split_ranges(cfg["text_config"]["num_hidden_layers"]):
        h_in = hidden
        hidden, k, v = (model.llm_layers(hidden, first, last, img, pos, valid) if last > first else
                        (hidden, *_empty_kv(cfg, s)))
        splits.append(dict(first=first, last=last, hidden_in=h_in, hidden_out=hidden, k=k, v=v))
        ks.append(k)
        vs.append(v)
        hs.append(hidden)
    out["splits"] = splits
    k_all, v_all = torch.cat(ks), torch.cat(vs)                       # [L, S, kvh, hd]
    out["llm_k"], out["llm_v"] = k_all, v_all

    # ---- action_context session
    lyr = k_all.shape[0]
    ctx_k, ctx_v = model.model.action_expert.context(k_all.reshape(lyr, s, -1), v_all.reshape(lyr, s, -1))
    out["ctx_k"], out["ctx_v"] = ctx_k, ctx_v

    # ---- host glue: Euler loop state
    enc = encoder_mask(cfg, ids)
    if valid is not None:
        enc = enc & valid
    out["encoder_mask"] = enc
    cross_bias = ((1.0 - enc.to(torch.float32)) * torch.finfo(torch.float32).min)[None]
    action_dim, horizon, n_steps = action_plan(cfg, norm)
    if tuple(noise.shape) != (1, horizon, cfg["max_action_dim"]):
        raise ValueError(f"noise must be [1, {horizon}, {cfg['max_action_dim']}], got {list(noise.shape)}")
    valid = torch.arange(cfg["max_action_dim"]) < action_dim
    masking = cfg["mask_action_dim_padding"] and action_dim < cfg["max_action_dim"]

    def mask(x):
        return x.masked_fill(~valid, 0.0) if masking else x

    steps = cfg["flow_matching_num_steps"]
    dt = 1.0 / steps
    plan = None
    if rtc_prefix is not None:
        prefix = torch.as_tensor(np.asarray(rtc_prefix, dtype=np.float32))
        if prefix.ndim != 2 or prefix.shape[1] not in (action_dim, cfg["max_action_dim"]):
            raise ValueError(f"rtc_prefix must be [rows, {action_dim} or {cfg['max_action_dim']}], got {list(prefix.shape)}")
        if not torch.isfinite(prefix).all():
            raise ValueError("rtc_prefix has NaN or infinite values")
        beta = float(np.float32(rtc_beta or rtclib.DEFAULT_BETA))
        if not beta > 0 or not np.isfinite(beta):
            raise ValueError(f"rtc_beta {rtc_beta}: finite and > 0")
        plan = rtclib.layout(prefix, int(rtc_delay), rtc_horizon, rtc_schedule, horizon, cfg["max_action_dim"],
                             offset=cfg["n_obs_steps"] - 1) + (beta,)
        out["rtc_prefix_padded"], out["rtc_weights"] = plan[0], plan[1]
    x = mask(noise)
    out["noise"], out["x0"], out["action_valid"] = noise, x, valid
    xs, vels, ts, traces = [], [], [], []
    for i in range(steps):
        t = torch.full((1,), i / steps, dtype=torch.float32)
        tr = {}
        vel = model.model.action_expert.step(x, t, ctx_k[:, None], ctx_v[:, None], cross_bias, trace=tr)
        xs.append(x[0])
        vels.append(vel[0])
        ts.append(t[0])
        traces.append(tr)
        vel = mask(vel)
        if plan is not None:  # LeRobot guides the masked velocity (modeling_molmoact2.py:1871-1891)
            vel = rtclib.guide(vel, x, t[0], *plan)
        x = mask(x + dt * vel)
    out["flow_x"] = torch.stack(xs)
    out["velocity"] = torch.stack(vels)
    out["flow_t"] = torch.stack(ts)
    out["time_cond"] = torch.cat([tr["time_cond"] for tr in traces])
    out["modulations"] = torch.cat([tr["modulations"] for tr in traces])
    out["final_modulation"] = torch.cat([tr["final_modulation"] for tr in traces])
    out["expert_action_embed"] = torch.cat([tr["action_embed"] for tr in traces])
    out["expert_block_out"] = torch.stack([torch.cat(tr["block_out"]) for tr in traces])
    out["traj_final"] = x[0]
    out["dt"] = dt

    # ---- host glue: slice and de-normalise
    raw = x[0, :, :action_dim]
    start = cfg["n_obs_steps"] - 1
    raw = raw[start:start + n_steps]
    out["raw_action"] = raw
    out["actions"] = torch.as_tensor(norm.action.unnormalize(raw.numpy()))
    return out


def _empty_kv(cfg, s):
    t = cfg["text_config"]
    z = torch.zeros((0, s, t["num_key_value_heads"], t["head_dim"]))
    return z, z.clone()


def tokens_per_image(model):
    return model.model.vision_backbone.tokens_per_image()


def to_numpy(x):
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.bool:
            return x.numpy().astype(np.uint8)
        return x.numpy()
    return np.asarray(x)


__all__ = ["run", "split_ranges", "initial_noise", "action_plan", "tokens_per_image", "cfglib"]
