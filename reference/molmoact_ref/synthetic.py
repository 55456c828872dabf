# SPDX-License-Identifier: Apache-2.0
"""Deterministic stand-ins for what a real checkpoint directory and a real robot provide:
LIBERO-like norm_stats.json, a byte-level tokenizer.json with the model's special tokens, the
processor config, and synthetic observations (two camera frames, an 8-d state, a task)."""

import json

import numpy as np

from . import config as cfglib

LIBERO_TASKS = [
    "pick up the black bowl next to the ramekin and place it on the plate",
    "Turn on the stove and put the moka pot on it.",
    "put both the alphabet soup and the tomato sauce in the basket",
    "open the top drawer and put the bowl inside",
    "Task: push the plate to the front of the stove",
    "put the cream cheese in the bowl",
    "pick up the book and place it in the back compartment of the caddy",
    "  turn on the stove  ",
]

ACTION_NAMES = ["x", "y", "z", "roll", "pitch", "yaw", "gripper"]
STATE_NAMES = ["eef_pos_x", "eef_pos_y", "eef_pos_z", "eef_axis_angle_x", "eef_axis_angle_y",
               "eef_axis_angle_z", "gripper_qpos_left", "gripper_qpos_right"]


def _stats(q01, q99, mean, std, mn, mx, mask, names):
    r = lambda xs: [round(float(x), 4) for x in xs]
    return dict(mean=r(mean), std=r(std), min=r(mn), max=r(mx), q01=r(q01), q99=r(q99),
                mask=list(mask), names=list(names))


def libero_norm_stats():
    """LIBERO-like statistics: delta-EEF actions in about [-0.94, 0.94] with a +-1 gripper (not
    normalised), states with EEF position, axis-angle and two gripper joint positions."""
    action = _stats(
        q01=[-0.7317, -0.6562, -0.9375, -0.1189, -0.1607, -0.2143, -1.0],
        q99=[0.8330, 0.8545, 0.9375, 0.1564, 0.1950, 0.3236, 1.0],
        mean=[0.0616, 0.0888, -0.0959, 0.0046, 0.0039, -0.0066, -0.0453],
        std=[0.3371, 0.3774, 0.4460, 0.0405, 0.0621, 0.0813, 0.9977],
        mn=[-0.9375, -0.9375, -0.9375, -0.2657, -0.3750, -0.3750, -1.0],
        mx=[0.9375, 0.9375, 0.9375, 0.3750, 0.3750, 0.3750, 1.0],
        mask=[True] * 6 + [False], names=ACTION_NAMES)
    state = _stats(
        q01=[-0.4153, -0.2838, 0.0089, 2.1425, -1.5306, -0.6744, 0.0020, -0.0400],
        q99=[0.1346, 0.3396, 1.2707, 3.6301, 0.6421, 0.5718, 0.0400, -0.0017],
        mean=[-0.0462, 0.0312, 0.7736, 2.9706, -0.2231, -0.1245, 0.0268, -0.0272],
        std=[0.1050, 0.1507, 0.3872, 0.3290, 0.4453, 0.2597, 0.0139, 0.0139],
        mn=[-0.4828, -0.3255, -0.0041, 0.3524, -3.6451, -1.8425, -0.0001, -0.0422],
        mx=[0.2100, 0.3887, 1.3464, 4.6941, 2.6796, 1.0903, 0.0423, 0.0013],
        mask=[True] * 6 + [False, False], names=STATE_NAMES)
    return {
        "format": "molmoact2_norm_stats.v1",
        "norm_mode": "q01_q99",
        "metadata_by_tag": {
            "libero": {
                "action_key": "action", "state_keys": ["observation.state"],
                "camera_keys": ["observation.images.image", "observation.images.wrist_image"],
                "normalize_gripper": False, "action_dim": 32, "action_horizon": 10,
                "n_action_steps": 10, "setup_type": "single franka robotic arm in libero",
                "control_mode": "delta end-effector pose",
                "action_stats": action, "state_stats": state,
            }
        },
    }


def special_tokens(cfg, ids):
    """Token string -> id for every special/added token of the model."""
    toks = {"<|endoftext|>": ids["pad"], "<|im_start|>": ids["im_start_chat"], "<|im_end|>": ids["eos"],
            "<setup_start>": ids["setup_start"], "<setup_end>": ids["setup_end"],
            "<control_start>": ids["control_start"], "<control_end>": ids["control_end"],
            "<state_start>": ids["state_start"], "<state_end>": ids["state_end"]}
    for n in range(cfg["num_state_tokens"]):
        toks[f"<state_{n}>"] = ids["state_token_start"] + n
    toks["<action_output>"] = ids["action_output"]
    toks["<action_start>"] = ids["action_start"]
    toks["<action_end>"] = ids["action_end"]
    for n in range(ids["num_action_tokens"]):
        toks[f"<action_{n}>"] = ids["action_token_start"] + n
    for i, t in enumerate(cfglib.EXTRA_TOKENS):
        toks[t] = ids["text_vocab"] + i
    return toks


def tokenizer_json(cfg, ids):
    """A Hugging Face tokenizer.json: byte-level BPE whose vocabulary is the 256 byte symbols
    (id = byte value) with no merges, and the model's special tokens as added tokens. The real
    Qwen3 vocabulary cannot be shipped; token ids of the prompt are the contract."""
    from .processing import _bytes_to_unicode
    sym = _bytes_to_unicode()
    vocab = {sym[b]: b for b in range(256)}
    chat = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"} | set(cfglib.EXTRA_TOKENS)
    added = [dict(id=i, content=t, single_word=False, lstrip=False, rstrip=False,
                  normalized=t not in chat, special=t in chat)
             for t, i in sorted(special_tokens(cfg, ids).items(), key=lambda kv: kv[1])]
    split = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
             "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                           "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                    "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": []},
    }


PROCESSOR_CONFIG = {
    "processor_class": "MolmoAct2Processor", "image_use_col_tokens": True,
    "use_single_crop_col_tokens": False, "use_single_crop_start_token": True,
    "video_use_col_tokens": False, "use_frame_special_tokens": True,
    "image_processor": {"image_processor_type": "MolmoAct2ImageProcessor",
                        "size": {"height": 378, "width": 378}, "resample": 2,
                        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                        "do_convert_rgb": True, "max_crops": 8, "overlap_margins": [4, 4],
                        "crop_mode": "resize", "patch_size": 14, "pooling_size": [2, 2]},
}


def synthetic_observation(seed, size=256):
    """Two smooth, textured uint8 camera frames, an in-distribution LIBERO state and a task."""
    rng = np.random.default_rng(10_000 + int(seed))
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64) / size
    frames = []
    for cam in range(2):
        img = np.zeros((size, size, 3))
        for c in range(3):
            fx, fy, ph = rng.uniform(0.5, 4.0), rng.uniform(0.5, 4.0), rng.uniform(0, 2 * np.pi)
            img[..., c] = 0.5 + 0.35 * np.sin(2 * np.pi * (fx * xx + fy * yy) + ph + cam)
        for _ in range(6):   # a few flat "objects"
            cx, cy, r = rng.uniform(0.1, 0.9), rng.uniform(0.1, 0.9), rng.uniform(0.04, 0.15)
            img[(xx - cx) ** 2 + (yy - cy) ** 2 < r * r] = rng.uniform(0, 1, 3)
        img += rng.normal(0, 0.03, img.shape)
        frames.append(np.clip(img * 255.0, 0, 255).astype(np.uint8))
    stats = libero_norm_stats()["metadata_by_tag"]["libero"]["state_stats"]
    lo, hi = np.array(stats["q01"]), np.array(stats["q99"])
    state = (lo + (hi - lo) * rng.uniform(-0.05, 1.05, 8)).astype(np.float32)
    task = LIBERO_TASKS[int(seed) % len(LIBERO_TASKS)]
    return dict(image0=frames[0], image1=frames[1], state=state, task=task)


def write_json(obj, path):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")
