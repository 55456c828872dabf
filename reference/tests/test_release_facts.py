# SPDX-License-Identifier: Apache-2.0
"""The released MolmoAct2-LIBERO's facts (issue 36): the full preset's vocabulary (154,624 rows,
padded to a multiple of 1024) and action-expert MLP (mlp_ratio 4.0: 3,072 wide) give the release's
5,442,196,208 parameters in 1,295 tensors, counted from the config's shapes alone (nothing built);
the derived tokenizer pads the same way; a rope_scaling of type "default" is accepted."""

import copy
import os
import sys

import pytest

from molmoact_ref import checkpoint, config as cfglib, streaming

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import derive_tokenizer  # noqa: E402

RELEASE_TENSORS, RELEASE_PARAMETERS = 1295, 5_442_196_208


def shapes(name, variant, placement="projector"):
    cfg = cfglib.preset(name, variant)
    return cfg, cfglib.tensor_shapes(cfg, checkpoint.sampler_spec(cfg, variant, placement))


def test_full_preset_has_the_release_numbers():
    cfg, orig = shapes("full", "original")
    assert cfg["text_config"]["vocab_size"] == 154_624 == 151 * 1024
    assert cfg["action_expert_config"]["mlp_ratio"] == 4.0 and cfglib.expert_mlp_inner(cfg) == 3072
    assert cfg["image_start_token_id"] == 154_624 and cfg["image_patch_id"] == 154_626
    assert orig["model.transformer.wte.embedding"] == orig["lm_head.weight"] == (154_624, 2560)
    assert orig["model.action_expert.blocks.35.mlp.down_proj.weight"] == (768, 3072)
    # the original variant is the released model: 1,295 tensors (one the rotary inv_freq buffer)
    assert cfglib.parameter_count(orig) == (RELEASE_TENSORS, RELEASE_PARAMETERS)
    # the Grid Sampler variant adds its scout and coordinate MLPs' 8 tensors
    _, grid = shapes("full", "grid")
    extra = sorted(set(grid) - set(orig))
    assert set(orig) <= set(grid) and len(extra) == 8
    assert all(".token_sampler." in n for n in extra)
    assert cfglib.parameter_count(grid) == (1303, RELEASE_PARAMETERS + 1_986_336)


def test_the_expert_cost_the_old_width_understated():
    """per block and Euler step the expert's matrices (the modulation is a compiled table):
    qkv, self out, cross q, cross out and the MLP; 8/3 (2,048 wide) left out 28.6 % of them"""
    cfg, s = shapes("full", "original")
    b = "model.action_expert.blocks.0."
    names = ["self_attn.qkv", "self_attn.out_proj", "cross_attn.q_proj", "cross_attn.out_proj",
             "mlp.up_proj", "mlp.gate_proj", "mlp.down_proj"]
    new = sum(s[b + n + ".weight"][0] * s[b + n + ".weight"][1] for n in names)
    old_cfg = copy.deepcopy(cfg)
    old_cfg["action_expert_config"]["mlp_ratio"] = 8.0 / 3.0
    o = cfglib.tensor_shapes(old_cfg)
    old = sum(o[b + n + ".weight"][0] * o[b + n + ".weight"][1] for n in names)
    assert (old, new) == (8_257_536, 10_616_832)
    assert abs(new / old - 1.2857) < 1e-4


@pytest.mark.parametrize("name,variant,placement", [
    ("tiny", "grid", "projector"), ("tiny", "original", "projector"), ("tiny", "grid", "pooling"),
    ("bench", "grid", "projector"), ("full", "original", "projector"), ("full", "grid", "projector")])
def test_shapes_are_the_models(name, variant, placement):
    """the count from the config is the reference model's layout: every name and shape of its
    state dict, the model built on the meta device (no weights allocated)"""
    cfg, want = shapes(name, variant, placement)
    model = streaming.meta_model(cfg, checkpoint.sampler_spec(cfg, variant, placement))
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert got == want


def test_shapes_follow_other_schema_choices():
    cfg = checkpoint.apply_overrides(cfglib.preset("tiny", "grid"), [
        "text_config.qk_norm_type=olmo", "text_config.qkv_bias=true", "text_config.num_key_value_heads=1",
        "text_config.num_attention_heads=8", "text_config.head_dim=8", "vit_config.num_key_value_heads=1",
        "action_expert_config.num_heads=4", "action_expert_config.mlp_ratio=3.1"])
    spec = checkpoint.sampler_spec(cfg, "grid", "projector")
    model = streaming.meta_model(cfg, spec)
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == cfglib.tensor_shapes(cfg, spec)


def qwen3_like():
    """a tokenizer.json shaped like Qwen3's: 151,643 BPE entries, then 26 added specials"""
    vocab = {f"t{i}": i for i in range(151643)}
    names = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [f"<|special_{i}|>" for i in range(23)]
    added = [derive_tokenizer.entry(151643 + i, n, True) for i, n in enumerate(names)]
    return {"model": {"type": "BPE", "vocab": vocab, "merges": []}, "added_tokens": added}


def test_derived_tokenizer_pads_to_the_release_vocabulary():
    out = derive_tokenizer.derive(qwen3_like())
    ids = {a["content"]: a["id"] for a in out["added_tokens"]}
    assert ids["<action_2047>"] == 153_981                       # 151,669 + 2,313 robot tokens - 1
    extra = [a for a in out["added_tokens"] if a["content"].startswith("<extra_")]
    assert len(extra) == 154_624 - 153_982
    assert ids["<im_start>"] == 154_624 and ids["<im_patch>"] == 154_626
    # the vocabulary a checkpoint shipped with this tokenizer gets
    assert cfglib.preset("tiny", "grid", text_vocab=154_624)["image_patch_id"] == 154_626


def test_tokenizer_vocab_reads_the_padding(tmp_path):
    import json
    p = tmp_path / "tokenizer.json"
    p.write_text(json.dumps({"added_tokens": [{"id": 154_624, "content": "<im_start>"}]}))
    assert checkpoint.tokenizer_vocab(str(p)) == 154_624
    p.write_text(json.dumps({"added_tokens": []}))
    with pytest.raises(ValueError, match="<im_start>"):
        checkpoint.tokenizer_vocab(str(p))
    with pytest.raises(cfglib.ConfigError, match="robot tokens"):
        cfglib.preset("tiny", "grid", text_vocab=1000)


def test_tiny_keeps_its_committed_padding():
    """assets/tiny-* were made with 155,648 rows; the committed goldens stay valid"""
    assert cfglib.preset("tiny", "grid")["text_config"]["vocab_size"] == 155_648
    assert cfglib.preset("tiny", "grid")["image_patch_id"] == 155_650


def test_rope_scaling_default_is_accepted():
    raw = cfglib.preset("tiny", "grid")
    for rs in ({"rope_type": "default"}, {"type": "default"},
               {"rope_type": "default", "rope_theta": 5000000.0, "factor": 1.0}):
        r = copy.deepcopy(raw)
        r["text_config"]["rope_scaling"] = rs
        assert cfglib.from_dict(r)["text_config"]["rope_scaling"] == rs
    for rs, needle in (({"rope_type": "yarn", "factor": 2.0}, "yarn"),
                       ({"rope_type": "default", "type": "linear"}, "not supported"),
                       ({"factor": 2.0}, "not supported"),
                       ({"rope_type": "default", "rope_theta": 10000.0}, "disagrees"),
                       ("default", "object")):
        r = copy.deepcopy(raw)
        r["text_config"]["rope_scaling"] = rs
        with pytest.raises(cfglib.ConfigError, match=needle):
            cfglib.from_dict(r)
