# SPDX-License-Identifier: Apache-2.0
"""The reference against the upstream code's own outputs on a tiny random model
(tests/fixtures/upstream-tiny): every intermediate to fp32 round-off."""

import json
import os

import numpy as np
import pytest
import torch

from conftest import close
from molmoact_ref import loader, model as M, pipeline, processing, safetensors as st

COMPARED = ["vit_embed", "pool_query", "pooled", "projected", "wte_out", "llm_input", "llm_k", "llm_v",
            "ctx_k", "ctx_v", "time_cond", "modulations", "final_modulation", "flow_x", "velocity",
            "expert_action_embed", "expert_block_out", "traj_final", "raw_action", "actions"]


@pytest.fixture(scope="module")
def loaded(upstream_dir):
    cfg, model = loader.load(upstream_dir)
    norm = processing.NormStats.load(os.path.join(upstream_dir, "norm_stats.json"))
    return cfg, model, norm


@pytest.mark.parametrize("obs", ["obs0", "obs1"])
def test_every_intermediate(loaded, upstream_dir, obs):
    cfg, model, norm = loaded
    f = np.load(os.path.join(upstream_dir, f"{obs}.npz"))
    out = pipeline.run(model, cfg, norm, f["pixel_values"], f["input_ids"], f["noise"])
    assert out["input_ids"].shape[0] > 700          # prompt length comes from the input
    for name in COMPARED:
        close(pipeline.to_numpy(out[name]), f[name])
    for i in range(f["vit_hidden"].shape[0]):
        close(out["vit_hidden"][i], f["vit_hidden"][i])
    for sp in out["splits"]:
        close(sp["hidden_out"], f["llm_hidden"][sp["last"] - 1])
    assert np.array_equal(pipeline.to_numpy(out["encoder_mask"]), f["encoder_mask"])
    _, allowed = M.llm_attention_bias(out["image_token_mask"])
    assert np.array_equal(allowed.numpy().astype(np.uint8), f["llm_attn_allowed"])
    assert np.array_equal(out["image_token_mask"].numpy(), f["token_type_ids"].astype(bool))
    cos, sin = M.llm_rope(out["position_ids"], cfg["text_config"]["head_dim"], cfg["text_config"]["rope_theta"])
    close(cos, f["llm_rope_cos"])
    close(sin, f["llm_rope_sin"])
    ecos, esin = M.expert_rope(10, 32)
    close(ecos, f["expert_rope_cos"])
    close(esin, f["expert_rope_sin"])


@pytest.mark.parametrize("obs", ["obs0", "obs1"])
def test_preprocessing_and_prompt(loaded, upstream_dir, obs):
    cfg, model, norm = loaded
    f = np.load(os.path.join(upstream_dir, f"{obs}.npz"))
    meta = json.load(open(os.path.join(upstream_dir, f"{obs}.json")))
    for i in range(2):
        resized, pixels = processing.preprocess_image(cfg, f[f"image{i}"])
        assert np.array_equal(resized, f["resized_u8"][i])
        assert np.array_equal(pixels, f["pixel_values"][i])
    tok = processing.ByteTokenizer(os.path.join(upstream_dir, "tokenizer.json"))
    pc = json.load(open(os.path.join(upstream_dir, "processor_config.json")))
    p = processing.build_prompt_ids(cfg, tok, meta["task"], f["state"], norm, 196, 2, pc)
    assert p["task_normalized"] == meta["task_normalized"]
    assert p["text"] == meta["prompt_text"]
    assert np.array_equal(p["state_normalized"], f["state_normalized"])
    assert np.array_equal(p["state_bins"], f["state_bins"])
    assert np.array_equal(p["input_ids"], f["input_ids"])
    idx = M.pooling_index(27, 27)
    assert np.array_equal(idx.numpy(), f["image_token_pooling"][:196])
    assert np.array_equal((idx >= 0).numpy().astype(np.uint8), f["pool_mask"][:196])


@pytest.mark.parametrize("case,channels", [("c128", 128), ("c2560", 2560), ("c128_nonsquare", 128)])
def test_grid_sampler_cases(upstream_dir, case, channels):
    gdir = os.path.join(os.path.dirname(upstream_dir), "grid_sampler")
    sampler = M.ActiveTokenSampler(channels, 16)
    sampler.load_state_dict(st.load_file(os.path.join(gdir, f"sampler_c{channels}.safetensors")))
    d = np.load(os.path.join(gdir, f"case_{case}.npz"))
    trace = {}
    with torch.no_grad():
        out = sampler(torch.from_numpy(d["feature_map"]), trace=trace)
    for name in ("global_feat", "pred_coords", "grid", "grid_sample_out", "coord_emb"):
        close(trace[name], d[name])
    if "pooled_feature_map" in d.files:
        close(trace["pooled_feature_map"], d["pooled_feature_map"])
    close(out, d["output"])
