# SPDX-License-Identifier: Apache-2.0
"""Real-time chunking (RTC), "guided" mode, as LeRobot runs it for MolmoAct2 (huggingface/lerobot
at 7427f31801f944f5ec9ce53cda02862ce7d1638b: src/lerobot/policies/rtc/modeling_rtc.py:122-303,
configuration_rtc.py:46-48, and the convention bridge of policies/molmoact2/modeling_molmoact2.py:
1875-1891), in float32 and in the order LeRobot computes it, so results agree bit for bit.

Written in MolmoAct2's frame: flow time tau goes 0 (noise) -> 1 (data), v is the action expert's
velocity. LeRobot's processor sees time 1 - tau and the negated velocity; undoing both, one Euler
step's guided velocity is

    v + gw(tau) * W * (prev - (x + (1 - tau) * v))

with x + (1 - tau) * v the predicted clean chunk, prev the previous chunk's leftover (right-padded
with zeros to the trajectory's shape), W the prefix weights over the chunk's rows and gw the
guidance weight, capped at beta. The correction LeRobot obtains by autograd is the weighted error
itself (x1 depends on x with the identity Jacobian, the velocity being held fixed:
modeling_rtc.py:217-224), so no gradient is taken here.

Alignment: LeRobot lines the leftover's row 0 up with the trajectory's row 0, and MolmoAct2 in
LeRobot returns the chunk from row 0. Our pipeline returns rows from n_obs_steps - 1, so the
leftover's row 0 goes on trajectory row `offset` = n_obs_steps - 1, and the weights are those of
a chunk of T - offset rows starting there (rows before it: weight 0). With n_obs_steps = 1 (every
MolmoAct2 checkpoint we know) that is LeRobot's layout exactly.
"""
import math

import torch

SCHEDULES = ("LINEAR", "EXP", "ONES", "ZEROS")  # lerobot/configs/types.py:48-52 (RTCAttentionSchedule)
DEFAULT_HORIZON = 10  # configuration_rtc.py:48 (execution_horizon)
DEFAULT_BETA = 10.0  # configuration_rtc.py:47 (max_guidance_weight)


def prefix_weights(schedule, start, end, total):
    """get_prefix_weights(start=delay, end=horizon, total=rows) of modeling_rtc.py:256-303: float32 [total]"""
    if schedule not in SCHEDULES:
        raise ValueError(f"rtc schedule {schedule!r}: one of {', '.join(SCHEDULES)}")
    start = min(start, end)
    if schedule == "ZEROS":  # ones before the delay only
        w = torch.zeros(total)
        w[:start] = 1.0
        return w
    if schedule == "ONES":  # ones up to the horizon
        w = torch.ones(total)
        w[end:] = 0.0
        return w
    # LINEAR / EXP: ones for the delay, a ramp from 1 to 0 (ends excluded) up to the horizon, zeros
    n_ramp = total - max(total - end, 0) - start
    ramp = torch.linspace(1, 0, n_ramp + 2)[1:-1] if end > start and n_ramp > 0 else torch.zeros(0)
    if schedule == "EXP":
        ramp = ramp * torch.expm1(ramp).div(math.e - 1)
    parts = [torch.ones(min(start, total))] if min(start, total) > 0 else []
    parts.append(ramp)
    if total - end > 0:
        parts.append(torch.zeros(total - end))
    return torch.cat(parts)


def guidance_weight(tau, beta):
    """modeling_rtc.py:226-232 with its tau = our flow time: float32 0-dim tensor. tau = 0 gives
    beta (c is +inf), tau = 1 gives 0 (inf * 0 is NaN, which nan_to_num makes 0)"""
    beta = torch.as_tensor(float(beta), dtype=torch.float32)
    tau = torch.as_tensor(float(tau), dtype=torch.float32)
    omt2 = (1 - tau) ** 2
    inv_r2 = (omt2 + tau ** 2) / omt2
    c = torch.nan_to_num((1 - tau) / tau, posinf=float(beta))
    gw = torch.nan_to_num(c * inv_r2, posinf=float(beta))
    return torch.minimum(gw, beta)


def layout(prefix, delay, horizon, schedule, rows_total, max_action_dim, offset=0):
    """the leftover `prefix` [rows, dim] right-padded with zeros to [rows_total, max_action_dim]
    (modeling_rtc.py:201-204), its row 0 on row `offset`, and the weights [rows_total] of the
    chunk from `offset` on (horizon None or 0: 10; clipped to the leftover's rows, :189-195)"""
    prefix = torch.as_tensor(prefix, dtype=torch.float32)
    if prefix.ndim != 2:
        raise ValueError(f"rtc prefix: expected [rows, dim], got {list(prefix.shape)}")
    rows, dim = prefix.shape
    total = rows_total - offset
    if not 1 <= rows <= total or not 1 <= dim <= max_action_dim:
        raise ValueError(f"rtc prefix [{rows}, {dim}] does not fit [{total}, {max_action_dim}]")
    if delay < 0:
        raise ValueError(f"rtc delay {delay}: >= 0")
    h = horizon or DEFAULT_HORIZON
    h = min(h, rows)
    prev = torch.zeros((rows_total, max_action_dim))
    prev[offset:offset + rows, :dim] = prefix
    w = torch.zeros(rows_total)
    w[offset:] = prefix_weights(schedule, delay, h, total)
    return prev, w


def guide(v, x, tau, prev, w, beta):
    """the guided velocity of one Euler step (MolmoAct2's frame), float32 like v: v, x [.., T, D],
    prev [T, D], w [T], tau the step's flow time (float32). LeRobot's order of operations, its
    signs undone (modeling_rtc.py:221-234, modeling_molmoact2.py:1879-1891)"""
    time = float(1.0 - float(tau))                 # the processor's time, a Python float
    x1 = x + time * v                              # the predicted clean chunk
    err = (prev - x1) * w[:, None]
    return v + guidance_weight(tau, beta) * err


__all__ = ["SCHEDULES", "DEFAULT_HORIZON", "DEFAULT_BETA", "prefix_weights", "guidance_weight", "layout", "guide"]
