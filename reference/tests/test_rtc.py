# SPDX-License-Identifier: Apache-2.0
"""The reference's RTC (molmoact_ref/rtc.py) against what LeRobot's own RTCProcessor produced
(tests/fixtures/lerobot_rtc/recorded.json and its README): prefix weights, guidance weights, single
guided steps and whole Euler loops, bit for bit (values compared, so +0 == -0)."""
import json
import os

import numpy as np
import pytest
import torch

from molmoact_ref import rtc

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures", "lerobot_rtc", "recorded.json")


@pytest.fixture(scope="module")
def rec():
    with open(FIX) as f:
        return json.load(f)


def f32(hexes, shape=None):
    a = np.array([int(h, 16) for h in hexes], dtype=np.uint32).view(np.float32)
    return torch.from_numpy(a.reshape(shape) if shape else a)


def same(a, b):
    a, b = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
    return a.shape == b.shape and bool(np.all(a == b))


def test_prefix_weights(rec):
    assert len(rec["prefix_weights"]) == 68
    for c in rec["prefix_weights"]:
        w = rtc.prefix_weights(c["schedule"], c["delay"], c["horizon"], c["total"])
        assert w.dtype == torch.float32
        assert same(w, f32(c["weights_f32_hex"])), c


def test_guidance_weight(rec):
    seen = set()
    for c in rec["guidance_weight"]:
        beta, tau = f32([c["beta_f32_hex"]])[0], f32([c["tau_f32_hex"]])[0]
        assert tau == np.float32(c["k"] / c["steps"])
        g = rtc.guidance_weight(tau, beta)
        assert same(g, f32([c["gw_f32_hex"]])[0]), c
        seen.add(float(g))
    # the edge cases are among them: tau = 0 gives beta
    assert 10.0 in seen and 100.0 in seen and 0.3 not in seen


def test_guided_steps(rec):
    for c in rec["steps"]:
        T, D = c["T"], c["max_action_dim"]
        x, v = f32(c["x_f32_hex"], (1, T, D)), f32(c["v_f32_hex"], (1, T, D))
        prefix = f32(c["prefix_f32_hex"], (c["rows"], c["dim"]))
        prev, w = rtc.layout(prefix, c["delay"], c["horizon"], c["schedule"], T, D)
        g = rtc.guide(v, x, f32([c["tau_f32_hex"]])[0], prev, w, f32([c["beta_f32_hex"]])[0])
        want = f32(c["guided_f32_hex"], (1, T, D))
        assert same(g, want), (c["schedule"], c["rows"], c["dim"], float((g - want).abs().max()))
        assert not same(g, v)  # the guidance did something


def test_euler_loops(rec):
    """each recorded loop replayed with its recorded velocities: every x, guided velocity and the
    final trajectory as LeRobot's, the mask applied as pipeline.run applies it"""
    for c in rec["loops"]:
        T, D, n = c["T"], c["max_action_dim"], c["steps"]
        vs, xs = f32(c["v_f32_hex"], (n, T, D)), f32(c["x_f32_hex"], (n, T, D))
        gs = f32(c["guided_f32_hex"], (n, T, D))
        valid = torch.arange(D) < c["action_dim"]

        def mask(t):
            return t.masked_fill(~valid, 0.0)
        plan = None
        if c["prefix_f32_hex"] is not None:
            plan = rtc.layout(f32(c["prefix_f32_hex"], (c["rows"], c["dim"])), c["delay"], c["horizon"], c["schedule"], T, D)
        x = mask(f32(c["noise_f32_hex"], (1, T, D)))
        dt = 1.0 / n
        for i in range(n):
            assert same(x[0], xs[i]), (c, i)
            t = torch.full((1,), i / n, dtype=torch.float32)
            vel = vs[i][None]
            if plan is not None:
                vel = rtc.guide(vel, x, t[0], *plan, f32([c["beta_f32_hex"]])[0])
            assert same(vel[0], gs[i]), (c["schedule"], i)
            x = mask(x + dt * vel)
        assert same(x[0], f32(c["final_f32_hex"], (T, D)))


def test_layout_refusals():
    p = torch.zeros((3, 7))
    with pytest.raises(ValueError):
        rtc.layout(p, -1, 10, "LINEAR", 10, 32)
    with pytest.raises(ValueError):
        rtc.layout(torch.zeros((11, 7)), 0, 10, "LINEAR", 10, 32)
    with pytest.raises(ValueError):
        rtc.layout(torch.zeros((3, 33)), 0, 10, "LINEAR", 10, 32)
    with pytest.raises(ValueError):
        rtc.prefix_weights("SIGMOID", 1, 2, 3)
    # the offset: the prefix's row 0 on trajectory row 1, no weight before it
    prev, w = rtc.layout(torch.ones((2, 7)), 1, 10, "LINEAR", 10, 32, offset=1)
    assert w[0] == 0 and w[1] == 1 and prev[0].abs().sum() == 0 and prev[1:3, :7].sum() == 14
    assert same(w[1:], rtc.prefix_weights("LINEAR", 1, 2, 9))
