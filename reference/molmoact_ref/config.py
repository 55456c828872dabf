# SPDX-License-Identifier: Apache-2.0
"""MolmoAct2 config.json: the real Hugging Face schema (field names and defaults of upstream
configuration_molmoact2.py), strict validation, and the three configurations we use
(tiny, bench, full).

A config is kept as a plain nested dict exactly as config.json stores it, with the defaults of
the upstream classes filled in. Unknown fields are refused by name: a field we do not understand
could change the math.
"""

import copy
import json

# --- upstream defaults (configuration_molmoact2.py) -----------------------------------------------

VIT_DEFAULTS = dict(
    hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
    num_key_value_heads=16, head_dim=72, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6,
    image_default_input_size=[378, 378], image_patch_size=14, image_num_pos=577,
    attention_dropout=0.0, residual_dropout=0.0, initializer_range=0.02, float32_attention=True,
    attn_implementation="eager", model_type="molmoact2",
)
ADAPTER_DEFAULTS = dict(
    vit_layers=[-3, -9], pooling_attention_mask=False, hidden_size=1152, num_attention_heads=16,
    num_key_value_heads=16, head_dim=72, float32_attention=True, attention_dropout=0.0,
    residual_dropout=0.0, hidden_act="silu", intermediate_size=18944, text_hidden_size=3584,
    image_feature_dropout=0.0, initializer_range=0.02, attn_implementation="eager",
    model_type="molmoact2",
)
TEXT_DEFAULTS = dict(
    hidden_size=3584, num_attention_heads=28, num_key_value_heads=4, head_dim=128,
    vocab_size=152064, additional_vocab_size=128, qkv_bias=True, num_hidden_layers=48,
    intermediate_size=18944, hidden_act="silu", embedding_dropout=0.0, attention_dropout=0.0,
    residual_dropout=0.0, max_position_embeddings=4096, rope_theta=1000000.0, rope_scaling=None,
    rope_scaling_layers=None, use_qk_norm=False, qk_norm_type="olmo", layer_norm_eps=1e-6,
    norm_after=False, initializer_range=0.02, use_cache=True, tie_word_embeddings=False,
    attn_implementation="eager", model_type="molmoact2_text",
)
EXPERT_DEFAULTS = dict(
    hidden_size=1024, num_layers=32, num_heads=16, mlp_ratio=8.0 / 3.0, ffn_multiple_of=256,
    timestep_embed_dim=256, dropout=0.0, attn_dropout=0.0, context_layer_norm=True, qk_norm=True,
    qk_norm_eps=1e-6, rope=True, causal_attn=False, model_type="molmoact2_action_expert",
)
TOP_DEFAULTS = dict(
    image_start_token_id=None, low_res_image_start_token_id=None, image_end_token_id=None,
    image_low_res_id=None, image_patch_id=None, image_high_res_id=None, image_col_id=None,
    frame_start_token_id=None, frame_end_token_id=None, use_frame_special_tokens=True,
    initializer_range=0.02, add_action_expert=True, max_action_dim=32, max_action_horizon=30,
    n_obs_steps=30, action_mode="both", state_format="discrete", flow_matching_num_steps=10,
    flow_matching_cutoff=1.0, flow_matching_time_offset=0.001, flow_matching_time_scale=0.999,
    flow_matching_beta_alpha=1.0, flow_matching_beta_beta=1.5, mask_action_dim_padding=True,
    enable_depth_reasoning=False, num_depth_codes=100, action_expert_depth_gate=False,
    action_expert_depth_gate_per_layer=False, action_expert_depth_gate_init_bias=-4.0,
    action_output_token_id=None, action_start_token_id=None, action_end_token_id=None,
    action_token_start_id=None, num_action_tokens=2048, depth_output_token_id=None,
    depth_start_token_id=None, depth_end_token_id=None, depth_token_start_id=None,
    num_depth_tokens=0, state_start_token_id=None, state_end_token_id=None,
    state_token_start_id=None, num_state_tokens=256, add_setup_tokens=True,
    add_control_tokens=True, norm_stats_filename="norm_stats.json", model_type="molmoact2",
    # Grid Sampler variant (ours; upstream MolmoAct2 has no sampler). The sampler's presence,
    # width and placement are decided from the checkpoint tensors; these only document them.
    use_grid_token_sampler=False, grid_token_sampler_num_tokens=16,
)
SUB_DEFAULTS = {"vit_config": VIT_DEFAULTS, "adapter_config": ADAPTER_DEFAULTS,
                "text_config": TEXT_DEFAULTS, "action_expert_config": EXPERT_DEFAULTS}

# Fields every transformers PretrainedConfig may carry; none of them changes inference.
GENERIC_KEYS = {
    "architectures", "auto_map", "dtype", "torch_dtype", "transformers_version", "_name_or_path",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "tie_word_embeddings", "use_cache", "return_dict", "output_hidden_states", "output_attentions",
    "torchscript", "chunk_size_feed_forward", "is_encoder_decoder", "is_decoder",
    "cross_attention_hidden_size", "add_cross_attention", "tie_encoder_decoder", "finetuning_task",
    "id2label", "label2id", "tokenizer_class", "prefix", "task_specific_params", "problem_type",
    "pruned_heads", "_attn_implementation_autoset", "output_scores", "return_dict_in_generate",
    "_commit_hash", "attn_implementation", "initializer_range", "model_type", "use_return_dict",
}

ACTIVATIONS = {"silu", "swish", "gelu", "gelu_pytorch_tanh", "gelu_new", "relu", "quick_gelu"}


class ConfigError(ValueError):
    pass


# top-level fields read when present, never written by default: the expert's encoder mask
# ("action_mode": the HF model's rule; "prompt": every prompt token, as LeRobot runs a policy
# saved in continuous mode; ours, written by compile) and depth_mode (only with depth reasoning)
OPTIONAL_TOP = {"molmoact_encoder_mask", "depth_mode"}


def _fill(section, defaults, where):
    out = copy.deepcopy(defaults)
    for key, value in section.items():
        if key not in defaults and key not in GENERIC_KEYS and not (where == "" and key in OPTIONAL_TOP):
            raise ConfigError(f"config.json: unknown field {where}{key!r}")
        out[key] = value
    return out


def from_dict(raw):
    """Fill defaults and validate; returns a new nested dict."""
    if not isinstance(raw, dict):
        raise ConfigError("config.json: top level is not an object")
    top = {k: v for k, v in raw.items() if k not in SUB_DEFAULTS}
    cfg = _fill(top, TOP_DEFAULTS, "")
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        cfg.setdefault(key, raw.get(key))
    for name, defaults in SUB_DEFAULTS.items():
        section = raw.get(name)
        if section is None:
            section = {}
        if not isinstance(section, dict):
            raise ConfigError(f"config.json: {name} is not an object")
        cfg[name] = _fill(section, defaults, name + ".")
    if cfg["image_high_res_id"] is None:
        cfg["image_high_res_id"] = cfg["image_patch_id"]
    if raw.get("action_expert_config") is None:
        # upstream builds the expert with one block per LLM layer when the section is absent
        cfg["action_expert_config"]["num_layers"] = cfg["text_config"]["num_hidden_layers"]
    validate(cfg)
    return cfg


def validate(cfg):
    """Refuse configurations the inference path does not implement, naming the field."""
    v, a, t, e = (cfg["vit_config"], cfg["adapter_config"], cfg["text_config"],
                  cfg["action_expert_config"])

    def need(cond, msg):
        if not cond:
            raise ConfigError("config.json: " + msg)

    def pos_int(section, name, key):
        need(isinstance(section[key], int) and not isinstance(section[key], bool) and section[key] > 0,
             f"{name}{key} must be a positive integer, got {section[key]!r}")

    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "image_patch_size", "image_num_pos"):
        pos_int(v, "vit_config.", key)
    for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "intermediate_size", "text_hidden_size"):
        pos_int(a, "adapter_config.", key)
    for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "vocab_size", "num_hidden_layers", "intermediate_size"):
        pos_int(t, "text_config.", key)
    for key in ("hidden_size", "num_layers", "num_heads", "timestep_embed_dim", "ffn_multiple_of"):
        pos_int(e, "action_expert_config.", key)
    for key in ("max_action_dim", "max_action_horizon", "n_obs_steps", "flow_matching_num_steps",
                "num_state_tokens"):
        pos_int(cfg, "", key)
    need(isinstance(t["additional_vocab_size"], int) and t["additional_vocab_size"] >= 0,
         "text_config.additional_vocab_size must be a non-negative integer")
    need(v["num_attention_heads"] % v["num_key_value_heads"] == 0,
         "vit_config.num_attention_heads must be a multiple of num_key_value_heads")
    need(a["num_attention_heads"] % a["num_key_value_heads"] == 0,
         "adapter_config.num_attention_heads must be a multiple of num_key_value_heads")
    need(a["num_attention_heads"] * a["head_dim"] == a["hidden_size"],
         "adapter_config.num_attention_heads * head_dim must equal hidden_size")
    need(t["num_attention_heads"] % t["num_key_value_heads"] == 0,
         "text_config.num_attention_heads must be a multiple of num_key_value_heads")
    need(e["hidden_size"] % e["num_heads"] == 0,
         "action_expert_config.hidden_size must be divisible by num_heads")
    need((e["hidden_size"] // e["num_heads"]) % 2 == 0 or not e["rope"],
         "action_expert_config: RoPE needs an even head dim")
    need(t["head_dim"] % 2 == 0, "text_config.head_dim must be even (RoPE)")
    need(a["text_hidden_size"] == t["hidden_size"],
         "adapter_config.text_hidden_size must equal text_config.hidden_size")
    size = v["image_default_input_size"]
    need(isinstance(size, (list, tuple)) and len(size) == 2 and all(isinstance(s, int) and s > 0 for s in size),
         "vit_config.image_default_input_size must be two positive integers")
    ph, pw = size[0] // v["image_patch_size"], size[1] // v["image_patch_size"]
    need(ph > 0 and pw > 0, "vit_config.image_default_input_size is smaller than one patch")
    side = int(round(v["image_num_pos"] ** 0.5))
    need(side * side == v["image_num_pos"], "vit_config.image_num_pos must be a square number")
    need(side == ph and side == pw,
         "vit_config.image_num_pos does not match the patch grid (positional-embedding "
         "interpolation is not implemented)")
    layers = a["vit_layers"]
    need(isinstance(layers, (list, tuple)) and len(layers) >= 1, "adapter_config.vit_layers must be a list")
    for layer in layers:
        idx = layer + v["num_hidden_layers"] if layer < 0 else layer
        need(isinstance(layer, int) and 0 <= idx < v["num_hidden_layers"],
             f"adapter_config.vit_layers entry {layer!r} is out of range")
    need(v["hidden_act"] in ACTIVATIONS, f"vit_config.hidden_act {v['hidden_act']!r} is not supported")
    need(a["hidden_act"] in ACTIVATIONS, f"adapter_config.hidden_act {a['hidden_act']!r} is not supported")
    need(t["hidden_act"] in ACTIVATIONS, f"text_config.hidden_act {t['hidden_act']!r} is not supported")
    rs = t["rope_scaling"]
    if rs is not None:
        # a rope_scaling whose type is "default" changes nothing (transformers' default RoPE
        # reads only rope_theta); any other type is refused, a theta in it must agree
        need(isinstance(rs, dict), "text_config.rope_scaling must be an object or null")
        kinds = [rs[k] for k in ("rope_type", "type") if k in rs]
        bad = [k for k in kinds if k != "default"] or ([] if kinds else [None])
        need(not bad, f"text_config.rope_scaling type {bad[0] if bad else None!r} is not supported (only default RoPE)")
        need(rs.get("rope_theta") is None or rs["rope_theta"] == t["rope_theta"],
             "text_config.rope_scaling.rope_theta disagrees with text_config.rope_theta")
    pos_int(t, "text_config.", "max_position_embeddings")
    need(t["rope_scaling_layers"] is None, "text_config.rope_scaling_layers is not supported")
    need(t["qk_norm_type"] in ("qwen3", "olmo"), f"text_config.qk_norm_type {t['qk_norm_type']!r} is unknown")
    for name, sec in (("vit_config", v), ("adapter_config", a), ("text_config", t)):
        need(sec.get("attn_implementation") in (None, "sdpa", "eager"),
             f"{name}.attn_implementation {sec.get('attn_implementation')!r} is not supported")
    need(cfg["state_format"] == "discrete", "state_format must be 'discrete' (upstream HF export)")
    need(cfg["action_mode"] in ("both", "continuous"),
         f"action_mode {cfg['action_mode']!r}: continuous actions need 'both' or 'continuous'")
    need(cfg["add_action_expert"] is True, "add_action_expert must be true (continuous actions)")
    need(not cfg["enable_depth_reasoning"], "enable_depth_reasoning is not supported")
    need(not cfg["action_expert_depth_gate"], "action_expert_depth_gate is not supported")
    need(e["num_layers"] == t["num_hidden_layers"],
         "action_expert_config.num_layers must equal text_config.num_hidden_layers")
    need(cfg["image_patch_id"] is not None, "image_patch_id is missing")
    need(cfg["state_token_start_id"] is not None, "state_token_start_id is missing")
    need(cfg["eos_token_id"] is not None, "eos_token_id is missing")
    need(cfg["n_obs_steps"] <= cfg["max_action_horizon"], "n_obs_steps exceeds max_action_horizon")


def load(path):
    try:
        with open(path, "r", encoding="utf-8") as f:
            raw = json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON: {e}") from None
    return from_dict(raw)


def save(cfg, path):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


# --- derived quantities ---------------------------------------------------------------------------

def vit_layer_indices(cfg):
    n = cfg["vit_config"]["num_hidden_layers"]
    return [l + n if l < 0 else l for l in cfg["adapter_config"]["vit_layers"]]


def vit_blocks_built(cfg):
    """Upstream builds only max(taps)+1 ViT blocks; released checkpoints ship that many."""
    return max(vit_layer_indices(cfg)) + 1


def patch_grid(cfg):
    v = cfg["vit_config"]
    h, w = v["image_default_input_size"]
    return h // v["image_patch_size"], w // v["image_patch_size"]


def pooled_grid(cfg, pool=2):
    ph, pw = patch_grid(cfg)
    return (ph + pool - 1) // pool, (pw + pool - 1) // pool


def expert_mlp_inner(cfg):
    e = cfg["action_expert_config"]
    inner = int(e["hidden_size"] * e["mlp_ratio"])
    m = e["ffn_multiple_of"]
    return -(-inner // m) * m if m > 0 else inner


def tensor_shapes(cfg, sampler=None):
    """name -> shape of every tensor a checkpoint of cfg holds (the HF layout, lm_head and the
    rotary inv_freq buffer included), from the config alone: nothing is built. sampler: the
    Grid Sampler's dict(channels, num_tokens, scout_hidden, coord_hidden) (checkpoint.sampler_spec)
    or None for the original variant."""
    v, a, t, e = (cfg["vit_config"], cfg["adapter_config"], cfg["text_config"],
                  cfg["action_expert_config"])
    out = {}
    vb, ab, tb, eb = ("model.vision_backbone.", "model.vision_backbone.image_pooling_2d.",
                      "model.transformer.", "model.action_expert.")

    def lin(name, n_out, n_in, bias=True):
        out[name + ".weight"] = (n_out, n_in)
        if bias:
            out[name + ".bias"] = (n_out,)

    vd, patch = v["hidden_size"], v["image_patch_size"]
    out[vb + "image_vit.positional_embedding"] = (v["image_num_pos"], vd)
    lin(vb + "image_vit.patch_embedding", vd, patch * patch * 3)
    vq, vkv = v["num_attention_heads"] * v["head_dim"], v["num_key_value_heads"] * v["head_dim"]
    for j in range(vit_blocks_built(cfg)):
        r = f"{vb}image_vit.transformer.resblocks.{j}."
        lin(r + "attention.wq", vq, vd)
        lin(r + "attention.wk", vkv, vd)
        lin(r + "attention.wv", vkv, vd)
        lin(r + "attention.wo", vd, vq)
        lin(r + "feed_forward.w1", v["intermediate_size"], vd)
        lin(r + "feed_forward.w2", vd, v["intermediate_size"])
        for n in ("attention_norm", "ffn_norm"):
            out[r + n + ".weight"] = (vd,)
            out[r + n + ".bias"] = (vd,)
    pin = vd * len(a["vit_layers"])
    aq, akv = a["num_attention_heads"] * a["head_dim"], a["num_key_value_heads"] * a["head_dim"]
    lin(ab + "wq", aq, pin)
    lin(ab + "wk", akv, pin)
    lin(ab + "wv", akv, pin)
    lin(ab + "wo", a["hidden_size"], aq)
    d = t["hidden_size"]
    lin(vb + "image_projector.w1", a["intermediate_size"], a["hidden_size"], bias=False)
    lin(vb + "image_projector.w2", d, a["intermediate_size"], bias=False)
    lin(vb + "image_projector.w3", a["intermediate_size"], a["hidden_size"], bias=False)
    if sampler:
        c, s = sampler["channels"], vb + "token_sampler."
        lin(s + "scout_mlp.0", sampler["scout_hidden"], c)
        lin(s + "scout_mlp.2", 2 * sampler["num_tokens"], sampler["scout_hidden"])
        lin(s + "coord_encoder.0", sampler["coord_hidden"], 2)
        lin(s + "coord_encoder.2", c, sampler["coord_hidden"])
    hd, nq, nkv = t["head_dim"], t["num_attention_heads"], t["num_key_value_heads"]
    out[tb + "wte.embedding"] = (t["vocab_size"], d)
    out[tb + "wte.new_embedding"] = (t["additional_vocab_size"], d)
    for i in range(t["num_hidden_layers"]):
        b = f"{tb}blocks.{i}."
        lin(b + "self_attn.att_proj", (nq + 2 * nkv) * hd, d, bias=t["qkv_bias"])
        lin(b + "self_attn.attn_out", d, nq * hd, bias=False)
        if t["use_qk_norm"]:
            qn = hd if t["qk_norm_type"] == "qwen3" else None
            out[b + "self_attn.q_norm.weight"] = (qn or nq * hd,)
            out[b + "self_attn.k_norm.weight"] = (qn or nkv * hd,)
        out[b + "attn_norm.weight"] = (d,)
        lin(b + "mlp.ff_proj", 2 * t["intermediate_size"], d, bias=False)
        lin(b + "mlp.ff_out", d, t["intermediate_size"], bias=False)
        out[b + "ff_norm.weight"] = (d,)
    out[tb + "ln_f.weight"] = (d,)
    out[tb + "rotary_emb.inv_freq"] = (hd // 2,)
    out["lm_head.weight"] = (t["vocab_size"], d)
    ed, inner = e["hidden_size"], expert_mlp_inner(cfg)
    lin(eb + "time_embed.1", ed, e["timestep_embed_dim"])
    lin(eb + "time_embed.3", ed, ed)
    lin(eb + "action_embed", ed, cfg["max_action_dim"])
    lin(eb + "context_k_proj", ed, nkv * hd, bias=False)
    lin(eb + "context_v_proj", ed, nkv * hd, bias=False)
    for i in range(e["num_layers"]):
        b = f"{eb}blocks.{i}."
        lin(b + "self_attn.qkv", 3 * ed, ed)
        lin(b + "self_attn.out_proj", ed, ed)
        lin(b + "cross_attn.q_proj", ed, ed)
        lin(b + "cross_attn.out_proj", ed, ed)
        lin(b + "mlp.up_proj", inner, ed)
        lin(b + "mlp.gate_proj", inner, ed)
        lin(b + "mlp.down_proj", ed, inner)
        lin(b + "modulation.linear", 9 * ed, ed)
    lin(eb + "final_layer.modulation.linear", 2 * ed, ed)
    lin(eb + "final_layer.linear", cfg["max_action_dim"], ed)
    return out


BUFFERS = ("model.transformer.rotary_emb.inv_freq",)


def parameter_count(shapes):
    """(tensors, parameters): every tensor, the parameters without the buffers"""
    n = 0
    for name, shape in shapes.items():
        if name not in BUFFERS:
            k = 1
            for x in shape:
                k *= x
            n += k
    return len(shapes), n


# --- the three configurations ---------------------------------------------------------------------

# The released model's facts, from public code (facts only, nothing copied):
# - Intel's physical-ai-studio MolmoAct2 port, library/src/physicalai/policies/molmoact2/config.py
#   (samet-akcay/physical-ai-studio @ 673a8d43e47c60e877f837160ff8c73c929cd841), whose defaults its
#   test (library/tests/unit/policies/molmoact2/test_config.py,
#   test_defaults_match_pretrained_architecture) calls the pretrained architecture: text
#   vocab_size 154,624, the image tokens from 154,624 on, action_expert_mlp_ratio 4.0 with
#   ffn_multiple_of 256; its components/action_expert.py (same commit) builds the expert MLP
#   round_up(int(hidden_size * mlp_ratio), ffn_multiple_of) wide: 768 x 4.0 = 3,072.
# - upstream's tokenizer (experiments/olmo/tokenizer.py of jianmanlincjx/Molmoact2, a copy of
#   allenai/molmoact2, @ cc877653588c6f4b34df2faf72f1c60a6b83b521): DEFAULT_PAD_MULTIPLE = 1024;
#   the vocabulary is padded with <extra_N> specials up to pad_tokenizer_to (the embedding size)
#   and the image tokens sit at pad_tokenizer_to + index. Qwen3's 151,669 tokens plus the 2,313
#   robot tokens end at 153,982, and the next multiple of 1024 is 154,624 = 151 x 1024 (so does
#   Qwen's padded 151,936 + 2,313 = 154,249).
# With these two values our layout (tensor_shapes below) has 5,442,196,208 parameters in 1,295
# tensors (the original variant; one of them the rotary inv_freq buffer), the release's figures;
# the Grid Sampler variant adds its 8 tensors.
PAD_MULTIPLE = 1024
NUM_ROBOT_TOKENS = 6 + 256 + 3 + 2048   # setup/control/state markers, <state_N>, action markers, <action_N>


def padded_vocab(n_tokens, multiple=PAD_MULTIPLE):
    """the embedding rows upstream pads a tokenizer of n_tokens (robot tokens included) to"""
    return -(-n_tokens // multiple) * multiple


# Real MolmoAct2 special-token ids (docs/ARCHITECTURE.md "The prompt").
REAL_IDS = dict(
    pad=151643, im_start_chat=151644, eos=151645, setup_start=151669, setup_end=151670,
    control_start=151671, control_end=151672, state_start=151673, state_end=151674,
    state_token_start=151675, action_output=151931, action_start=151932, action_end=151933,
    action_token_start=151934, num_action_tokens=2048,
    text_vocab=padded_vocab(151669 + NUM_ROBOT_TOKENS),   # 154,624
)
# The tiny preset keeps the padding its committed fixtures (assets/tiny-*, their goldens) were
# made with, 155,648 = 152 x 1024: the same robot-token ids, the image tokens 1,024 ids higher.
# A tiny model shipped with the derived tokenizer takes the tokenizer's padding (checkpoint.make).
TINY_IDS = dict(REAL_IDS, text_vocab=155648)
# Image tokens sit at text_vocab + index in upstream's EXTRA_TOKENS order.
EXTRA_TOKENS = ["<im_start>", "<im_end>", "<im_patch>", "<im_col>", "<low_res_im_start>",
                "<|image|>", "<im_low>", "<frame_start>", "<frame_end>", "<|video|>",
                "<|points|>", "<|token_index|>", "<|vit_index|>", "<|vit_loc|>"]


def _token_fields(ids, text_vocab):
    x = {t: text_vocab + i for i, t in enumerate(EXTRA_TOKENS)}
    return dict(
        image_start_token_id=x["<im_start>"], image_end_token_id=x["<im_end>"],
        image_patch_id=x["<im_patch>"], image_high_res_id=x["<im_patch>"],
        image_col_id=x["<im_col>"], low_res_image_start_token_id=x["<low_res_im_start>"],
        image_low_res_id=x["<im_low>"], frame_start_token_id=x["<frame_start>"],
        frame_end_token_id=x["<frame_end>"], bos_token_id=ids["eos"], eos_token_id=ids["eos"],
        pad_token_id=ids["pad"], action_output_token_id=ids["action_output"],
        action_start_token_id=ids["action_start"], action_end_token_id=ids["action_end"],
        action_token_start_id=ids["action_token_start"], num_action_tokens=ids["num_action_tokens"],
        state_start_token_id=ids["state_start"], state_end_token_id=ids["state_end"],
        state_token_start_id=ids["state_token_start"],
    )


# A compact remapped id space for the bench model (like the upstream-tiny fixture): bytes 0..255,
# chat and robot specials above them, 256 state bins, 64 action tokens, then the image tokens.
BENCH_IDS = dict(
    pad=256, im_start_chat=257, eos=258, setup_start=259, setup_end=260, control_start=261,
    control_end=262, state_start=263, state_end=264, state_token_start=265, action_output=521,
    action_start=522, action_end=523, action_token_start=524, num_action_tokens=64, text_vocab=640,
)


def preset_ids(name):
    """the token ids a preset's config and stand-in tokenizer use"""
    try:
        return {"tiny": TINY_IDS, "bench": BENCH_IDS, "full": REAL_IDS}[name]
    except KeyError:
        raise ConfigError(f"unknown configuration {name!r} (tiny, bench, full)") from None


def preset(name, variant="grid", text_vocab=None):
    """tiny: real structure and image geometry, tiny widths, real robot-token ids.
    bench: real widths, reduced depth, a small remapped vocabulary.
    full: the real MolmoAct2-LIBERO numbers (never instantiated in tests; tensor_shapes counts it).
    text_vocab: another vocabulary size (the padding of the tokenizer shipped with the model);
    the image tokens follow it."""
    ids = preset_ids(name)
    if text_vocab is not None:
        if not isinstance(text_vocab, int) or text_vocab < ids["action_token_start"] + ids["num_action_tokens"]:
            raise ConfigError(f"text_vocab {text_vocab!r} does not hold the robot tokens")
        ids = dict(ids, text_vocab=text_vocab)
    if name == "tiny":
        vit = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=10, num_attention_heads=2,
                   num_key_value_heads=2, head_dim=16)
        adapter = dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                       intermediate_size=96, text_hidden_size=64)
        text = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    intermediate_size=128, num_hidden_layers=4)
        expert = dict(hidden_size=64, num_layers=4, num_heads=2)
    elif name == "bench":
        vit = dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=3,
                   num_attention_heads=16, num_key_value_heads=16, head_dim=72)
        adapter = dict(hidden_size=1152, num_attention_heads=16, num_key_value_heads=16, head_dim=72,
                       intermediate_size=9728, text_hidden_size=2560)
        text = dict(hidden_size=2560, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                    intermediate_size=9728, num_hidden_layers=4)
        expert = dict(hidden_size=768, num_layers=4, num_heads=8, mlp_ratio=4.0)
    elif name == "full":
        vit = dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27,
                   num_attention_heads=16, num_key_value_heads=16, head_dim=72)
        adapter = dict(hidden_size=1152, num_attention_heads=16, num_key_value_heads=16, head_dim=72,
                       intermediate_size=9728, text_hidden_size=2560)
        text = dict(hidden_size=2560, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                    intermediate_size=9728, num_hidden_layers=36)
        expert = dict(hidden_size=768, num_layers=36, num_heads=8, mlp_ratio=4.0)   # 3,072 wide
    else:
        raise ConfigError(f"unknown configuration {name!r} (tiny, bench, full)")
    vit.update(image_default_input_size=[378, 378], image_patch_size=14, image_num_pos=729,
               attn_implementation="sdpa")
    # bench keeps the "later tap first" order of the real (-3, -9) with only 3 blocks built
    adapter.update(vit_layers=[-1, -3] if name == "bench" else [-3, -9], pooling_attention_mask=True,
                   attn_implementation="sdpa")
    text.update(vocab_size=ids["text_vocab"], additional_vocab_size=128, qkv_bias=False,
                rope_theta=5000000.0, use_qk_norm=True, qk_norm_type="qwen3",
                max_position_embeddings=36864, attn_implementation="sdpa")
    raw = dict(vit_config=vit, adapter_config=adapter, text_config=text, action_expert_config=expert,
               max_action_dim=32, max_action_horizon=10, n_obs_steps=1, action_mode="both",
               architectures=["MolmoAct2ForConditionalGeneration"], dtype="float32",
               use_grid_token_sampler=(variant == "grid"), grid_token_sampler_num_tokens=16,
               **_token_fields(ids, ids["text_vocab"]))
    if variant not in ("grid", "original"):
        raise ConfigError(f"unknown variant {variant!r} (grid, original)")
    return from_dict(raw)
