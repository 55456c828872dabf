# SPDX-License-Identifier: Apache-2.0
"""The reference's building blocks against independent, hand-written facts."""

import math

import numpy as np
import pytest
import torch

from molmoact_ref import model as M, processing


def bilinear_zero_pad(fmap, px, py):
    """Hand-written grid_sample(align_corners=False, zeros): point (px, py) in (0,1) of a [C,H,W]
    map; pixel centres at (i + 0.5) / W; out-of-range neighbours contribute zero."""
    c, h, w = fmap.shape
    ix, iy = px * w - 0.5, py * h - 0.5
    x0, y0 = math.floor(ix), math.floor(iy)
    out = np.zeros(c)
    for yy, wy in ((y0, 1 - (iy - y0)), (y0 + 1, iy - y0)):
        for xx, wx in ((x0, 1 - (ix - x0)), (x0 + 1, ix - x0)):
            if 0 <= xx < w and 0 <= yy < h:
                out += wx * wy * fmap[:, yy, xx]
    return out


@pytest.mark.parametrize("h,w", [(14, 14), (5, 9)])
def test_grid_sample_matches_hand_bilinear(h, w):
    g = torch.Generator().manual_seed(1)
    fmap = torch.randn((1, 7, h, w), generator=g, dtype=torch.float64)
    pts = torch.rand((1, 1, 40, 2), generator=g, dtype=torch.float64)
    pts[0, 0, :4] = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.01, 0.99], [0.5, 0.5]], dtype=torch.float64)
    out = torch.nn.functional.grid_sample(fmap, pts * 2 - 1, mode="bilinear", padding_mode="zeros",
                                          align_corners=False)[0, :, 0]
    for k in range(pts.shape[2]):
        ref = bilinear_zero_pad(fmap[0].numpy(), float(pts[0, 0, k, 0]), float(pts[0, 0, k, 1]))
        assert np.allclose(out[:, k].numpy(), ref, atol=1e-12)


def test_sampler_uses_x_for_width():
    """coords[..., 0] is the width axis: a map that varies only along W reveals it."""
    s = M.ActiveTokenSampler(1, 1, 4, 4)
    with torch.no_grad():
        for p in s.parameters():
            p.zero_()
        s.scout_mlp[2].bias.copy_(torch.tensor([2.0, -2.0]))   # x = sigmoid(2), y = sigmoid(-2)
        fmap = torch.arange(8.0).view(1, 1, 1, 8).expand(1, 1, 8, 8).contiguous()
        out = s(fmap)
    x = 1 / (1 + math.exp(-2.0))
    assert abs(float(out) - (x * 8 - 0.5)) < 1e-5


def test_attention_mask_structure():
    img = torch.tensor([0, 0, 1, 1, 1, 0, 1, 1, 0, 0], dtype=torch.bool)
    bias, allowed = M.llm_attention_bias(img)
    s = img.shape[0]
    for q in range(s):
        for k in range(s):
            expect = k <= q or (bool(img[q]) and bool(img[k]))
            assert bool(allowed[q, k]) == expect
            assert float(bias[q, k]) == (0.0 if expect else torch.finfo(torch.float32).min)
    # an image token early on sees the later camera's image tokens, text does not look ahead
    assert allowed[2, 7] and not allowed[1, 2] and not allowed[5, 6]


def test_encoder_mask_eos_and_action_spans():
    cfg = dict(action_mode="both", eos_token_id=9, action_start_token_id=5, action_end_token_id=6)
    ids = torch.tensor([9, 1, 5, 2, 5, 6, 3, 6, 9, 4, 5, 1])
    m = M.encoder_mask(cfg, ids).tolist()
    # starts at 2 and 4 pair with ends 5 and 7; the last start is unterminated
    assert m == [False, True, False, False, False, False, False, False, False, True, False, False]
    cfg["action_mode"] = "continuous"
    assert all(M.encoder_mask(cfg, ids).tolist())


def test_llm_rope_closed_form():
    hd, theta = 16, 5e6
    pos = torch.arange(0, 50)
    cos, sin = M.llm_rope(pos, hd, theta)
    g = torch.Generator().manual_seed(0)
    q = torch.randn((50, 3, hd), generator=g)
    rot = q * cos[:, None] + M.rotate_half(q) * sin[:, None]
    for p in (0, 1, 7, 49):
        for j in range(hd // 2):
            ang = p * theta ** (-2 * j / hd)
            z = complex(float(q[p, 0, j]), float(q[p, 0, j + hd // 2])) * complex(math.cos(ang), math.sin(ang))
            assert abs(float(rot[p, 0, j]) - z.real) < 1e-4
            assert abs(float(rot[p, 0, j + hd // 2]) - z.imag) < 1e-4
    # relative-position property: <R(m)q, R(n)k> depends on m - n only
    k = torch.randn((hd,), generator=g)
    rq = lambda p, x: x * cos[p] + M.rotate_half(x) * sin[p]
    assert abs(float(rq(10, k) @ rq(3, q[0, 0])) - float(rq(17, k) @ rq(10, q[0, 0]))) < 1e-4


def test_expert_rope_closed_form():
    cos, sin = M.expert_rope(10, 96)
    for p in range(10):
        for j in range(48):
            ang = p * 10000.0 ** (-j / 48)
            assert abs(float(cos[p, j]) - math.cos(ang)) < 1e-5
            assert abs(float(sin[p, j]) - math.sin(ang)) < 1e-5


def test_sinusoidal_time_closed_form():
    emb = M.SinusoidalTime(256)(torch.tensor([0.0, 0.3, 0.9]))
    for i, t in enumerate([0.0, 0.3, 0.9]):
        for j in (0, 1, 64, 127):
            f = math.exp(-math.log(10000.0) * j / 127)
            assert abs(float(emb[i, j]) - math.sin(t * f)) < 1e-6
            assert abs(float(emb[i, 128 + j]) - math.cos(t * f)) < 1e-6


def _stats(mask=None, **extra):
    st = dict(q01=[-1.0, 0.0, 2.0], q99=[1.0, 4.0, 2.0], min=[-2.0, -1.0, 2.0], max=[2.0, 5.0, 2.0])
    if mask is not None:
        st["mask"] = mask
    st.update(extra)
    return st


def test_denormalisation_formula():
    n = processing.Normalizer(_stats(mask=[True, True, False]), "q01_q99", "test")
    x = np.array([[0.5, -0.25, 0.7], [3.0, -7.0, -3.0]], dtype=np.float32)
    got = n.unnormalize(x)
    for row in range(2):
        c = np.clip(x[row], -1, 1)
        for d in range(2):
            q01, q99 = [-1.0, 0.0][d], [1.0, 4.0][d]
            assert abs(got[row, d] - ((c[d] + 1) / 2 * (q99 - q01) + q01)) < 1e-6
        assert got[row, 2] == c[2]           # mask False: clipped value passes through


def test_state_normalisation_and_bins():
    n = processing.Normalizer(_stats(mask=[True, False, True]), "q01_q99", "test")
    s = np.array([0.5, 0.03, 2.0], dtype=np.float32)
    y = n.normalize(s)
    assert abs(y[0] - (2 * (0.5 + 1) / 2 - 1)) < 1e-6
    assert y[1] == np.float32(0.03)          # pass-through
    assert y[2] == 0.0                       # min == max -> 0
    bins = processing.discretize_state(np.array([np.nan, np.inf, -np.inf, -1.0, 1.0, 0.0, 1 / 255]), 256)
    assert bins.tolist() == [128, 255, 0, 0, 255, 128, 128]   # rint(127.5)=128, rint(128.0)=128


@pytest.mark.parametrize("raw,expect", [
    ("Turn on the stove and put the moka pot on it.", "turn on the stove and put the moka pot on it"),
    ("Task: push the plate to the front of the stove", "push the plate to the front of the stove"),
    ('  "pick up the book."  ', "pick up the book"),
    ("The task is to open the drawer!", "open the drawer"),
    ("open the drawer. Then close it?", "open the drawer; then close it"),
    ("   ", ""),
])
def test_task_normalisation(raw, expect):
    assert processing.normalize_task(raw) == expect


def test_pooling_index_layout():
    idx = M.pooling_index(27, 27)
    assert idx.shape == (196, 4)
    assert idx[0].tolist() == [0, 1, 27, 28]
    assert idx[13].tolist() == [26, -1, 53, -1]              # right edge: column 27 is padding
    assert idx[195].tolist() == [26 * 27 + 26, -1, -1, -1]   # corner: one valid patch
    assert int((idx < 0).any(1).sum()) == 27


def test_resize_is_half_pixel_bilinear():
    img = (np.arange(4 * 4 * 3) % 256).astype(np.uint8).reshape(4, 4, 3)
    out = processing.resize_u8(img, 8, 8)
    src = img.astype(np.float64)
    for y in range(8):
        for x in range(8):
            sy, sx = max((y + 0.5) * 0.5 - 0.5, 0), max((x + 0.5) * 0.5 - 0.5, 0)
            y0, x0 = int(sy), int(sx)
            y1, x1 = min(y0 + 1, 3), min(x0 + 1, 3)
            wy, wx = sy - y0, sx - x0
            v = ((1 - wy) * ((1 - wx) * src[y0, x0] + wx * src[y0, x1]) +
                 wy * ((1 - wx) * src[y1, x0] + wx * src[y1, x1]))
            assert np.all(np.abs(out[y, x].astype(np.float64) - v) <= 0.5 + 1e-9)


def test_image_coercion():
    gray = np.full((5, 6), 7, dtype=np.uint8)
    assert processing.coerce_image(gray).shape == (5, 6, 3)
    rgba = np.zeros((5, 6, 4), dtype=np.uint8)
    assert processing.coerce_image(rgba).shape == (5, 6, 3)
    f = np.full((2, 2, 3), 0.5, dtype=np.float32)
    assert processing.coerce_image(f)[0, 0, 0] == 127
    chw = np.zeros((3, 5, 6), dtype=np.uint8)
    assert processing.coerce_image(chw).shape == (5, 6, 3)
    with pytest.raises(ValueError):
        processing.coerce_image(np.full((2, 2, 3), np.nan, dtype=np.float32))
