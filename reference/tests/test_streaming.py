# SPDX-License-Identifier: Apache-2.0
"""The streaming writer and reference (issue 22): what the full-size model uses, checked at tiny
size against the in-memory paths, bit for bit (the same generator draws, the same attention-sink
calibration, the same forward)."""

import os

import numpy as np
import pytest
import torch

from molmoact_ref import checkpoint, golden, safetensors as st, streaming


def _bits(t):
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


@pytest.mark.parametrize("variant", ["grid", "original"])
def test_streaming_writer_and_reference_equal_the_in_memory_ones(tmp_path, variant):
    a, b = str(tmp_path / "mem"), str(tmp_path / "stream")
    checkpoint.make("tiny", variant, 3, a, "bf16", "projector", shard_mb=1)
    streaming.write("tiny", variant, 3, b, "bf16", shard_mb=1, log=lambda *x: None)
    assert sorted(os.listdir(a)) == sorted(os.listdir(b))
    ta, tb = st.load_checkpoint_dir(a), st.load_checkpoint_dir(b)
    assert set(ta) == set(tb)
    for n in ta:
        assert ta[n].dtype == tb[n].dtype and torch.equal(_bits(ta[n]), _bits(tb[n])), n
    # the calibrated attention sink is in the streamed file, not the random bias
    sink = "model.action_expert.blocks.0.cross_attn.q_proj.bias"
    assert float(tb[sink].float().norm()) > 0
    ga, gb = str(tmp_path / "golden_mem"), str(tmp_path / "golden_stream")
    golden.write(b, ga)
    golden.write(b, gb, streaming=True)
    for f in sorted(os.listdir(ga)):
        if f.endswith(".npz"):
            x, y = np.load(os.path.join(ga, f)), np.load(os.path.join(gb, f))
            assert x.files == y.files
            for k in x.files:
                assert np.array_equal(x[k], y[k]), (f, k)


def test_streamed_model_holds_no_block_weights_between_calls(tmp_path):
    d = str(tmp_path / "ck")
    streaming.write("tiny", "grid", 0, d, "bf16", shard_mb=1, log=lambda *x: None)
    m = streaming.load(d)
    blocks = list(m.model.transformer.blocks) + list(m.model.action_expert.blocks)
    assert all(p.is_meta for b in blocks for p in b.parameters())
    assert m.lm_head.weight.is_meta
    golden.write(d, str(tmp_path / "g"), streaming=True)
