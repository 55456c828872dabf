# SPDX-License-Identifier: Apache-2.0
"""Host-side processing: images -> pixels, task + state -> prompt token ids, norm_stats.json.

Follows the upstream HF processor path in crop_mode 'resize' (one 378x378 view per camera) and
the robot prompt builder of modeling_molmoact2.py.
"""

import json
import math
import os
import re
import unicodedata

import numpy as np
import torch
import torch.nn.functional as F

from . import config as cfglib

# ================================================================================== images


def coerce_image(image):
    """Any frame -> HxWx3 uint8 RGB: grayscale replicated, channel-first moved last, alpha dropped,
    float frames with max <= 1 scaled by 255, then clipped and truncated to uint8."""
    arr = np.asarray(image)
    if arr.ndim == 2:
        arr = np.stack([arr] * 3, axis=-1)
    if arr.ndim != 3:
        raise ValueError(f"image must be HxW or HxWxC, got shape {arr.shape}")
    if arr.shape[0] in (1, 3, 4) and arr.shape[-1] not in (1, 3, 4):
        arr = np.moveaxis(arr, 0, -1)
    if arr.shape[-1] == 1:
        arr = np.repeat(arr, 3, axis=-1)
    if arr.shape[-1] == 4:
        arr = arr[..., :3]
    if arr.shape[-1] != 3:
        raise ValueError(f"image must have 1, 3 or 4 channels, got {arr.shape[-1]}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError("image is empty")
    if arr.dtype in (np.float32, np.float64, np.float16):
        arr = arr.astype(np.float64)
        if not np.all(np.isfinite(arr)):
            raise ValueError("image has NaN or infinite values")
        if arr.max() <= 1.0:
            arr = arr * 255.0
        arr = np.clip(arr, 0, 255).astype(np.uint8)
    elif arr.dtype != np.uint8:
        arr = np.clip(arr, 0, 255).astype(np.uint8)
    return np.ascontiguousarray(arr)


def resize_u8(image, height, width):
    """torchvision Resize(BILINEAR, antialias=False) on the uint8 CHW tensor: float bilinear with
    half-pixel centres (align_corners=False), rounded and clipped back to uint8."""
    x = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)[None].to(torch.float32)
    y = F.interpolate(x, size=(height, width), mode="bilinear", align_corners=False)
    y = torch.clamp(torch.round(y), 0, 255).to(torch.uint8)
    return y[0].permute(1, 2, 0).contiguous().numpy()


def patchify(image_f32, patch):
    """[H, W, 3] -> [H/p * W/p, p*p*3], patch index row-major, inside a patch (dy, dx, c)."""
    h, w, c = image_f32.shape
    hp, wp = h // patch, w // patch
    x = image_f32[: hp * patch, : wp * patch].reshape(hp, patch, wp, patch, c)
    return x.transpose(0, 2, 1, 3, 4).reshape(hp * wp, patch * patch * c)


def preprocess_image(cfg, image):
    """-> (resized uint8 [H, W, 3], pixels float32 [P, 588]) with pixels = u8/255*2-1."""
    v = cfg["vit_config"]
    h, w = v["image_default_input_size"]
    resized = resize_u8(coerce_image(image), h, w)
    pixels = (resized.astype(np.float32) / np.float32(255.0)) * np.float32(2.0) - np.float32(1.0)
    return resized, patchify(pixels, v["image_patch_size"]).astype(np.float32)


# ============================================================================ norm_stats.json


class Normalizer:
    """One feature's normaliser (upstream _FeatureNormalizer semantics, fp32 numpy), or with
    lerobot=True LeRobot's MolmoAct2 pipeline arithmetic (processor_molmoact2.py: the masked
    normaliser, the clamp of normalised dims, the action clamp before the masked unnormaliser;
    eps only for a zero range)."""

    def __init__(self, stats, mode, where, lerobot=False, eps=1e-8):
        self.mode = mode
        self.lerobot, self.eps = lerobot, np.float32(eps)
        get = lambda k: None if stats.get(k) is None else np.asarray(stats[k], dtype=np.float32)
        self.mean, self.std, self.min, self.max = get("mean"), get("std"), get("min"), get("max")
        self.low = self.high = None
        if mode in ("q01_q99", "q10_q90"):
            lk, hk = ("q01", "q99") if mode == "q01_q99" else ("q10", "q90")
            self.low, self.high = get(lk), get(hk)
            if self.low is None or self.high is None:
                raise ValueError(f"{where}: norm_mode {mode!r} needs {lk} and {hk}")
        elif mode == "mean_std" and (self.mean is None or self.std is None):
            raise ValueError(f"{where}: norm_mode 'mean_std' needs mean and std")
        elif mode == "min_max" and (self.min is None or self.max is None):
            raise ValueError(f"{where}: norm_mode 'min_max' needs min and max")
        elif mode not in ("none", "mean_std", "min_max", "q01_q99", "q10_q90"):
            raise ValueError(f"{where}: unknown norm_mode {mode!r}")
        self.dim = next(len(x) for x in (self.low, self.mean, self.min, self.max, self.std,
                                          stats.get("mask"), stats.get("names")) if x is not None)
        for name in ("mean", "std", "min", "max", "low", "high"):
            val = getattr(self, name)
            if val is not None and (val.shape != (self.dim,) or not np.all(np.isfinite(val))):
                raise ValueError(f"{where}: {name} must be {self.dim} finite numbers")
        self.mask = None if stats.get("mask") is None else np.broadcast_to(
            np.asarray(stats["mask"], dtype=bool), (self.dim,))
        self.zero = None
        if mode == "min_max" or (mode in ("q01_q99", "q10_q90") and self.min is not None and self.max is not None):
            self.zero = self.min == self.max

    def _range(self, lo, hi):
        d = (hi - lo).astype(np.float32)
        return np.where(d == 0, self.eps, d).astype(np.float32)

    def normalize(self, x):
        x = np.asarray(x, dtype=np.float32)
        if self.lerobot:
            if self.mode == "mean_std":
                y = (x - self.mean) / (self.std + self.eps)
            elif self.mode == "min_max":
                y = np.float32(2) * (x - self.min) / self._range(self.min, self.max) - np.float32(1)
            elif self.mode in ("q01_q99", "q10_q90"):
                y = np.float32(2) * (x - self.low) / self._range(self.low, self.high) - np.float32(1)
            else:
                y = x
            y = np.clip(y, -1.0, 1.0).astype(np.float32)
            if self.mask is not None:
                bad = (~self.mask) & ~((x >= -1) & (x <= 1))
                if bad.any():
                    raise ValueError(f"state dimension {int(np.argmax(bad))} passes through and is outside [-1, 1]")
                y = np.where(self.mask, y, x)
            return y.astype(np.float32)
        eps = 1e-6
        if self.mode == "mean_std":
            y = (x - self.mean) / np.maximum(self.std, eps)
        elif self.mode == "min_max":
            y = 2.0 * (x - self.min) / np.maximum(self.max - self.min, eps) - 1.0
        elif self.mode in ("q01_q99", "q10_q90"):
            y = 2.0 * (x - self.low) / np.maximum(self.high - self.low, eps) - 1.0
        else:
            y = x
        if self.mode in ("min_max", "q01_q99", "q10_q90"):
            y = np.clip(y, -1.0, 1.0)
        if self.mask is not None:
            y = np.where(self.mask, y, x)
        if self.zero is not None:
            y = np.where(self.zero, np.float32(0.0), y)
        return y.astype(np.float32)

    def unnormalize(self, x):
        x = np.asarray(x, dtype=np.float32)
        if self.lerobot:
            a = np.clip(x, -1.0, 1.0).astype(np.float32)
            if self.mode == "mean_std":
                y = a * self.std + self.mean
            elif self.mode == "min_max":
                y = (a + np.float32(1)) / np.float32(2) * self._range(self.min, self.max) + self.min
            elif self.mode in ("q01_q99", "q10_q90"):
                y = (a + np.float32(1)) * self._range(self.low, self.high) / np.float32(2) + self.low
            else:
                y = a
            if self.mask is not None:
                y = np.where(self.mask, y, a)
            return y.astype(np.float32)
        if self.mode in ("min_max", "q01_q99", "q10_q90"):
            x = np.clip(x, -1.0, 1.0)
        if self.mode == "mean_std":
            y = x * self.std + self.mean
        elif self.mode == "min_max":
            y = (x + 1.0) * (self.max - self.min) / 2.0 + self.min
        elif self.mode in ("q01_q99", "q10_q90"):
            y = (x + 1.0) * (self.high - self.low) / 2.0 + self.low
        else:
            y = x
        if self.mask is not None:
            y = np.where(self.mask, y, x)
        return y.astype(np.float32)


class NormStats:
    def __init__(self, payload, tag="libero"):
        if not isinstance(payload, dict) or payload.get("format") != "molmoact2_norm_stats.v1":
            raise ValueError("norm_stats.json: format must be 'molmoact2_norm_stats.v1'")
        tags = payload.get("metadata_by_tag") or {}
        if tag not in tags and len(tags) == 1 and payload.get("default_tag") in tags:
            tag = payload["default_tag"]  # a LeRobot policy's statistics (compile writes them so)
        if tag not in tags:
            raise ValueError(f"norm_stats.json: unknown tag {tag!r} (have {sorted(tags)})")
        self.mode = str(payload.get("norm_mode", "min_max"))
        self.meta = tags[tag]
        lr = self.meta.get("arithmetic") == "lerobot"
        eps = float(self.meta.get("eps", 1e-8))
        self.action = Normalizer(self.meta["action_stats"], self.mode, f"norm_stats.json {tag}.action_stats", lr, eps)
        self.state = (Normalizer(self.meta["state_stats"], self.mode, f"norm_stats.json {tag}.state_stats", lr, eps)
                      if self.meta.get("state_stats") is not None else None)

    @classmethod
    def load(cls, path, tag="libero"):
        with open(path, "r", encoding="utf-8") as f:
            return cls(json.load(f), tag)

    @property
    def action_dim(self):
        return self.action.dim

    def get_int(self, key):
        v = self.meta.get(key)
        return None if v is None else int(v)


def discretize_state(normed, num_bins):
    """nan->0, +inf->1, -inf->-1, clip to [-1, 1], bin = clip(rint((s+1)/2*(n-1)), 0, n-1)."""
    arr = np.nan_to_num(np.asarray(normed, dtype=np.float32), nan=0.0, posinf=1.0, neginf=-1.0)
    arr = np.clip(arr, -1.0, 1.0)
    scaled = (arr + 1.0) / 2.0 * float(num_bins - 1)
    return np.clip(np.rint(scaled).astype(np.int64), 0, num_bins - 1)


# ================================================================================== prompt

_TRAIL_PUNCT = ".,!?;:,\u2026"
_TRAIL_CLOSERS = "\"'\u201d\u2019)]}"
_SURROUND = "\"'`\u201c\u201d\u2018\u2019[](){}"
_PREFIXES = [re.compile(p, re.IGNORECASE) for p in (
    r"^(?:task|instruction|language[_ ]instruction|goal)\s*[:\-]\s*",
    r"^(?:the\s+task\s+is\s+to|your\s+task\s+is\s+to)\s+")]


def normalize_task(text):
    """Upstream _normalize_question_text: collapse whitespace, repeatedly strip surrounding quotes
    and brackets, 'task:'-style prefixes and trailing punctuation; join sentences with '; ';
    lower-case."""
    s = re.sub(r"\s+", " ", text).strip()
    if not s:
        return ""
    prev = None
    while s and s != prev:
        prev = s
        s = s.strip().strip(_SURROUND).strip()
        for pat in _PREFIXES:
            s = pat.sub("", s, count=1).strip()
        s = s.rstrip(_TRAIL_PUNCT).rstrip()
        s = s.rstrip(_TRAIL_CLOSERS).rstrip()
        s = s.rstrip(_TRAIL_PUNCT).rstrip()
    parts = [p.strip() for p in re.split(r"[.!?]+", s) if p.strip()]
    if len(parts) > 1:
        s = "; ".join(parts)
    return s.lower()


def _wrap(text, start, end, enabled):
    text = str(text or "")
    if text.startswith(start) and text.endswith(end):
        return text
    if not text or not enabled:
        return text
    return f"{start}{text}{end}"


def robot_prompt(cfg, task, state_bins, setup_type, control_mode, num_images):
    """The LIBERO robot_action prompt string, before <|image|> expansion."""
    setup = _wrap(setup_type, "<setup_start>", "<setup_end>", cfg["add_setup_tokens"])
    control = _wrap(control_mode, "<control_start>", "<control_end>", cfg["add_control_tokens"])
    state_str = ""
    if state_bins is not None:
        state_str = "<state_start>" + "".join(f"<state_{int(b)}>" for b in state_bins) + "<state_end>"
    clause = f" The current state of the robot is {state_str}." if state_str else ""
    body = (f"The task is to {task}. The setup is {setup}.{clause} The expected control mode is "
            f"{control}. Given these, what action should the robot take to complete the task?")
    if num_images <= 0:
        prefix = ""
    elif num_images == 1:
        prefix = "<|image|>"
    else:
        prefix = "".join(f"Image {i + 1}<|image|>" for i in range(num_images))
    return f"{prefix}<|im_start|>user\n{body}<|im_end|>\n<|im_start|>assistant\n<action_output>"


def image_token_string(cfg, tokens_per_image, grid_hw, processor_cfg=None):
    """Expansion of one <|image|> in resize mode: <im_start> + patches + <im_end>. The original
    model has grid_hw rows of patches (an <im_col> after each row if the processor asks for
    single-crop column tokens); the Grid Sampler variant has tokens_per_image patches, no columns."""
    pc = processor_cfg or {}
    if tokens_per_image != grid_hw[0] * grid_hw[1]:
        return "<im_start>" + "<im_patch>" * tokens_per_image + "<im_end>"
    use_col = pc.get("use_single_crop_col_tokens")
    if use_col is None:
        use_col = pc.get("image_use_col_tokens", True) if processor_cfg is not None else False
    row = "<im_patch>" * grid_hw[1] + ("<im_col>" if use_col else "")
    return "<im_start>" + row * grid_hw[0] + "<im_end>"


class ByteTokenizer:
    """Hugging Face tokenizer.json with a byte-level BPE model. Added tokens are matched first
    (longest first); the rest is NFC-normalised (if the file says so), mapped to byte-level symbols
    and merged by rank. Without a `regex` module the pre-tokenizer split is only supported for
    merge-free vocabularies (where it cannot change the result)."""

    def __init__(self, path):
        with open(path, "r", encoding="utf-8") as f:
            tj = json.load(f)
        model = tj.get("model") or {}
        if model.get("type") != "BPE":
            raise ValueError(f"{path}: only BPE tokenizers are supported")
        self.vocab = model["vocab"]
        merges = model.get("merges") or []
        if merges:
            raise ValueError(f"{path}: this reference tokenizer handles merge-free vocabularies only "
                             "(the C tokenizer implements full BPE)")
        self.added = {t["content"]: t["id"] for t in tj.get("added_tokens", [])}
        self.nfc = (tj.get("normalizer") or {}).get("type") == "NFC"
        self.byte_sym = _bytes_to_unicode()
        pattern = "|".join(re.escape(t) for t in sorted(self.added, key=len, reverse=True))
        self.split = re.compile(f"({pattern})") if pattern else None

    def encode(self, text):
        ids = []
        parts = self.split.split(text) if self.split else [text]
        for part in parts:
            if not part:
                continue
            if part in self.added:
                ids.append(self.added[part])
                continue
            if self.nfc:
                part = unicodedata.normalize("NFC", part)
            for b in part.encode("utf-8"):
                ids.append(self.vocab[self.byte_sym[b]])
        return ids

    def token_id(self, token):
        return self.added[token]


class NodeTokenizer:
    """A real (merge-carrying) tokenizer.json, tokenised by the Rust Hugging Face tokenizers
    library through its Node binding (@anush008/tokenizers; no PyPI here). The directory holding
    node_modules comes from MOLMOACT_NODE_MODULES."""

    SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "tests", "tokenizer", "reference_tokenize.mjs")

    def __init__(self, path):
        self.path = os.path.abspath(path)
        self.cwd = os.environ.get("MOLMOACT_NODE_MODULES")
        if not self.cwd or not os.path.isdir(os.path.join(self.cwd, "node_modules", "@anush008")):
            raise ValueError(f"{path} has BPE merges: set MOLMOACT_NODE_MODULES to a directory whose node_modules "
                             "holds @anush008/tokenizers (tests/tokenizer/check_tokenizer.sh installs it)")
        with open(path, "r", encoding="utf-8") as f:
            self.added = {t["content"]: t["id"] for t in json.load(f).get("added_tokens", [])}

    def encode_batch(self, texts):
        import subprocess
        data = "".join(json.dumps(t) + "\n" for t in texts)
        out = subprocess.run(["node", self.SCRIPT, "rust", self.path], input=data.encode(), cwd=self.cwd,
                             capture_output=True, check=True)
        return [json.loads(line) for line in out.stdout.decode().splitlines()]

    def encode(self, text):
        return self.encode_batch([text])[0]

    def token_id(self, token):
        return self.added[token]


def load_tokenizer(path):
    with open(path, "r", encoding="utf-8") as f:
        merges = (json.load(f).get("model") or {}).get("merges")
    return NodeTokenizer(path) if merges else ByteTokenizer(path)


def _bytes_to_unicode():
    """GPT-2 byte-level alphabet: printable bytes map to themselves, the rest to 256+n."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


def build_prompt_text(cfg, task, state, norm, tokens_per_image, num_images=2, processor_cfg=None,
                      normalize_language=True):
    """-> dict(full = the string to tokenise, text, task_normalized, state_normalized, state_bins)"""
    state = np.asarray(state, dtype=np.float32).reshape(-1)
    if norm.state is not None and state.shape[0] != norm.state.dim:
        raise ValueError(f"state has {state.shape[0]} values, norm_stats expects {norm.state.dim}")
    normed = norm.state.normalize(state) if norm.state is not None else state
    bins = discretize_state(normed, cfg["num_state_tokens"])
    task_text = normalize_task(str(task or "")) if normalize_language else str(task or "")
    text = robot_prompt(cfg, task_text, bins, norm.meta.get("setup_type", ""),
                        norm.meta.get("control_mode", ""), num_images)
    expansion = image_token_string(cfg, tokens_per_image, cfglib.pooled_grid(cfg), processor_cfg)
    return dict(full=text.replace("<|image|>", expansion), text=text, task_normalized=task_text,
                state_normalized=normed, state_bins=bins)


def insert_bos(cfg, ids):
    """the processor prepends BOS (= eos for these tokenizers) unless the prompt starts with it"""
    bos = cfg["bos_token_id"] if cfg.get("bos_token_id") is not None else cfg["eos_token_id"]
    ids = list(ids)
    if not ids or ids[0] != bos:
        ids = [bos] + ids
    return np.asarray(ids, dtype=np.int64)


def build_prompt_ids(cfg, tokenizer, task, state, norm, tokens_per_image, num_images=2,
                     processor_cfg=None, normalize_language=True):
    """-> dict(input_ids int64 [S], text, task_normalized, state_normalized, state_bins)"""
    p = build_prompt_text(cfg, task, state, norm, tokens_per_image, num_images, processor_cfg, normalize_language)
    p["input_ids"] = insert_bos(cfg, tokenizer.encode(p.pop("full")))
    return p
