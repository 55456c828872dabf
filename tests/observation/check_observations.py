#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Real observations, C against the PyTorch reference:
  1. images: >= 20 PNG/JPEG files of many sizes and modes -> bit-identical resized image and pixels;
  2. prompts: many tasks and states -> identical token ids (byte-level stand-in tokenizers of both
     variants, and the real Qwen3-derived MolmoAct2 tokenizer);
  3. end to end from raw inputs (frames, task, state) with the real tokenizer: same ids, same pixels,
     actions cosine >= 0.9999.
  check_observations.py MOLMOACT_BINARY WORK_DIR   (WORK_DIR holds node_modules, see check_tokenizer.sh)
"""
import json
import math
import os
import random
import subprocess
import sys

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "reference"))
from molmoact_ref import checkpoint, config as cfglib, golden, npzio, processing, synthetic  # noqa: E402

BIN, WORK = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
os.environ["MOLMOACT_NODE_MODULES"] = WORK
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("  FAIL:", msg)


def run(args, stdin=None):
    return subprocess.run([BIN] + args, input=stdin, capture_output=True, check=False)


def pil_rgb(path):
    """how a user hands a file to upstream: PIL decode, convert('RGB'), numpy"""
    return np.asarray(Image.open(path).convert("RGB"))


# ------------------------------------------------------------------------------------------ images
def images():
    d = os.path.join(WORK, "images")
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(7)
    cases = []
    sizes = [(256, 256), (224, 224), (480, 640), (640, 480), (378, 378), (377, 379), (1, 1), (7, 13), (13, 7),
             (100, 1000), (1000, 100), (255, 257), (512, 512), (33, 333), (720, 1280), (300, 200)]
    for i, (h, w) in enumerate(sizes):
        yy, xx = np.mgrid[0:h, 0:w]
        img = np.stack([(xx * 255 // max(w - 1, 1)), (yy * 255 // max(h - 1, 1)), (xx + yy) % 256], -1).astype(np.uint8)
        img = np.clip(img.astype(int) + rng.integers(-20, 21, img.shape), 0, 255).astype(np.uint8)
        path = os.path.join(d, f"rgb_{h}x{w}.png" if i % 2 == 0 else f"rgb_{h}x{w}.jpg")
        Image.fromarray(img).save(path, quality=90) if path.endswith("jpg") else Image.fromarray(img).save(path)
        cases.append(path)
    gray = (rng.random((200, 300)) * 255).astype(np.uint8)
    Image.fromarray(gray, "L").save(os.path.join(d, "gray.png"))
    Image.fromarray(gray, "L").save(os.path.join(d, "gray.jpg"))
    rgba = (rng.random((120, 90, 4)) * 255).astype(np.uint8)
    Image.fromarray(rgba, "RGBA").save(os.path.join(d, "rgba.png"))
    Image.fromarray((rng.random((64, 80, 3)) * 255).astype(np.uint8)).convert("P").save(os.path.join(d, "palette.png"))
    Image.fromarray(gray, "L").convert("LA").save(os.path.join(d, "gray_alpha.png"))
    cases += [os.path.join(d, n) for n in ("gray.png", "gray.jpg", "rgba.png", "palette.png", "gray_alpha.png")]
    cfg = cfglib.load(os.path.join(ROOT, "assets", "tiny-grid", "model", "config.json"))
    same = 0
    for path in cases:
        out = os.path.join(d, os.path.basename(path) + ".npz")
        r = run(["preprocess", "--model", os.path.join(ROOT, "assets", "tiny-grid", "model"), "--image0", path, "-o", out])
        check(r.returncode == 0, f"preprocess {path}: {r.stderr.decode()}")
        if r.returncode:
            continue
        got = npzio.load(out)
        src = pil_rgb(path)
        resized, pixels = processing.preprocess_image(cfg, src)
        ok = np.array_equal(got["image"], src) and np.array_equal(got["resized_u8"], resized) and np.array_equal(got["pixels"], pixels)
        check(ok, f"{path}: C and reference pixels differ")
        same += ok
    print(f"images: {same} of {len(cases)} files bit-identical (decoded frame, 378x378 resize, pixels)")
    # refusals: truncated, empty, not an image, huge header
    bad = os.path.join(d, "bad")
    os.makedirs(bad, exist_ok=True)
    raw = open(cases[0], "rb").read()
    samples = {"truncated.png": raw[: len(raw) // 3], "empty.png": b"", "text.png": b"hello world",
               "huge.png": raw[:16] + (65535).to_bytes(4, "big") + (65535).to_bytes(4, "big") + raw[24:]}
    jraw = open(cases[1], "rb").read()
    samples["truncated.jpg"] = jraw[: len(jraw) // 2]
    for name, blob in samples.items():
        p = os.path.join(bad, name)
        open(p, "wb").write(blob)
        r = run(["preprocess", "--model", os.path.join(ROOT, "assets", "tiny-grid", "model"), "--image0", p, "-o", p + ".npz"])
        check(r.returncode == 1 and r.stderr, f"{name}: expected a clean refusal, got rc={r.returncode} {r.stderr[:200]}")
    print(f"images: {len(samples)} broken files refused cleanly")
    return cases


# ------------------------------------------------------------------------------------------ prompts
TASKS = list(synthetic.LIBERO_TASKS) + [
    "Task: open the drawer.", "INSTRUCTION - put the bowl on the plate!!", "language_instruction: pick it up",
    "Language Instruction: pick it up", "goal:stack the blocks", "The task is to turn on the stove.",
    "your task is to close the microwave", '"pick up the ketchup"', "(put the mug on the plate)", "[open it]",
    "first pick up the bowl. then place it on the plate!", "wait... what?", "Put the mug down; then leave.",
    "  lots   of\tspaces \n and\nnewlines  ", "\u201cquoted task\u201d", "caf\u00e9 CR\u00c8ME br\u00fbl\u00e9e",
    "\u0130STANBUL \u03a3\u039f\u03a6\u039f\u03a3", "TA\u017fK: long s prefix", "\u4f60\u597d\u4e16\u754c", "emoji \U0001F916 robot",
    "trailing closers\u2019)", "\u2026", "", "   ", "a", "x" * 500, "Task: ", "pick up the bowl\u0085next", "pick\u00a0up",
]


def states(rng, n):
    lo = np.array([-0.4153, -0.2838, 0.0089, 2.1425, -1.5306, -0.6744, 0.0020, -0.0400])
    hi = np.array([0.1346, 0.3396, 1.2707, 3.6301, 0.6421, 0.5718, 0.0400, -0.0017])
    out = []
    for i in range(n):
        s = lo + (hi - lo) * rng.uniform(-0.3, 1.3, 8)
        s = [float(np.float32(x)) for x in s]
        if i % 7 == 3:
            s[rng.integers(8)] = float("nan")
        if i % 11 == 5:
            s[rng.integers(8)] = float("inf") if i % 2 else float("-inf")
        out.append(s)
    return out


def js_state(s):
    return ["nan" if math.isnan(x) else ("inf" if x == math.inf else ("-inf" if x == -math.inf else x)) for x in s]


def prompts(model_dir, label):
    cfg = cfglib.load(os.path.join(model_dir, "config.json"))
    norm = processing.NormStats.load(os.path.join(model_dir, "norm_stats.json"))
    tok = processing.load_tokenizer(os.path.join(model_dir, "tokenizer.json"))
    pcp = os.path.join(model_dir, "processor_config.json")
    pc = json.load(open(pcp)) if os.path.isfile(pcp) else None
    from molmoact_ref import loader
    k = loader.build(cfg, loader.load_tensors(model_dir)).model.vision_backbone.tokens_per_image()
    rng = np.random.default_rng(11)
    cases = [(t, s) for t in TASKS for s in states(rng, 3)]
    texts = [processing.build_prompt_text(cfg, t, s, norm, k, 2, pc) for t, s in cases]
    if isinstance(tok, processing.NodeTokenizer):
        ids = tok.encode_batch([p["full"] for p in texts])
    else:
        ids = [tok.encode(p["full"]) for p in texts]
    ref = [processing.insert_bos(cfg, i).tolist() for i in ids]
    inp = "".join(json.dumps({"task": t, "state": js_state(s)}) + "\n" for t, s in cases)
    r = run(["prompt", "--model", model_dir], inp.encode())
    got = [json.loads(line) for line in r.stdout.decode().splitlines()]
    check(r.returncode == 0, f"{label}: prompt command failed: {r.stderr.decode()[:300]}")
    same = sum(1 for a, b in zip(got, ref) if a == b)
    for (t, s), a, b in list(zip(cases, got, ref)):
        if a != b:
            print(f"  {label}: task {t!r} state {s}: C {a[:12] if a else a}... ref {b[:12]}...")
            break
    check(same == len(cases) and len(got) == len(cases), f"{label}: {same} of {len(cases)} prompts identical")
    print(f"prompts ({label}): {same} of {len(cases)} identical token layouts, S = {min(map(len, ref))}..{max(map(len, ref))}")


# ------------------------------------------------------------------------------------------ end to end
def end_to_end(model_dir, image_files):
    rng = np.random.default_rng(5)
    checks = 0
    for i in range(3):
        a, b = image_files[2 * i], image_files[2 * i + 1]
        task = TASKS[i * 5]
        state = np.asarray(states(rng, 1)[0], dtype=np.float32)
        obs = dict(image0=pil_rgb(a), image1=pil_rgb(b), task=np.array(task), state=state)
        d = os.path.join(WORK, f"e2e{i}")
        os.makedirs(d, exist_ok=True)
        inp = os.path.join(d, "in.npz")
        npzio.save(inp, obs, compress=False)
        gdir = os.path.join(d, "golden")
        golden.write(model_dir, gdir, inputs=dict(obs), seed=i)
        g_inter = npzio.load(os.path.join(gdir, "intermediates.npz"))
        g_ids = npzio.load(os.path.join(gdir, "step0_boundary.npz"))["input_ids"]
        g_px = npzio.load(os.path.join(gdir, "vision_io.npz"))["pixels"]
        for how, args in (("npz", ["--inputs", inp]),
                          ("files", ["--image0", a, "--image1", b, "--task", task, "--state", ",".join(repr(float(x)) for x in state)])):
            dump = os.path.join(d, "dump-" + how)
            r = run(["run", "--model", model_dir, *args, "--seed", str(i), "--dump", dump, "--json"])
            check(r.returncode == 0, f"e2e {i} ({how}): {r.stderr.decode()[:300]}")
            if r.returncode:
                continue
            got = npzio.load(os.path.join(dump, "intermediates.npz"))
            check(np.array_equal(got["input_ids"], g_ids), f"e2e {i} ({how}): token ids differ")
            check(np.array_equal(got["pixels"], g_px), f"e2e {i} ({how}): pixels differ")
            x, y = got["actions"].astype(np.float64).ravel(), g_inter["actions"].astype(np.float64).ravel()
            cos = float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))
            check(cos >= 0.9999, f"e2e {i} ({how}): action cosine {cos}")
            print(f"end to end {i} ({how}): S={len(g_ids)}, ids and pixels identical, action cosine {cos:.9f}")
            checks += 1
    return checks


def main():
    files = images()
    prompts(os.path.join(ROOT, "assets", "tiny-grid", "model"), "tiny-grid, byte tokenizer")
    prompts(os.path.join(ROOT, "assets", "tiny-original", "model"), "tiny-original, byte tokenizer")
    real_tok = os.path.join(WORK, "molmoact2_tokenizer.json")
    for variant in ("grid", "original"):
        mdir = os.path.join(WORK, f"tiny-{variant}-qwen3tok")
        if not os.path.isfile(os.path.join(mdir, "model.safetensors")):
            checkpoint.make("tiny", variant, 21, mdir, tokenizer=real_tok)
        prompts(mdir, f"tiny-{variant}, real MolmoAct2 tokenizer")
    end_to_end(os.path.join(WORK, "tiny-grid-qwen3tok"), [f for f in files if not f.endswith(("palette.png", "gray_alpha.png"))])
    if failures:
        print(f"{len(failures)} failure(s)")
        sys.exit(1)
    print("observations: all checks passed")


if __name__ == "__main__":
    main()
