#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The tokenizer test corpus: one JSON string per line (>= 500 strings). LIBERO task sentences,
the full MolmoAct2 prompt with state and image tokens, digits, contractions, whitespace runs,
tabs and newlines, Unicode (accents, CJK, emoji, combining marks, NFC vs NFD, U+0085 and U+FEFF
next to spaces), a NUL byte, the empty string, and deterministic random mixtures."""
import json
import random
import sys
import unicodedata

LIBERO = [
    "put both the alphabet soup and the tomato sauce in the basket", "put both the cream cheese box and the butter in the basket",
    "turn on the stove and put the moka pot on it", "put the black bowl in the bottom drawer of the cabinet and close it",
    "put the white mug on the left plate and put the yellow and white mug on the right plate",
    "pick up the book and place it in the back compartment of the caddy",
    "put the white mug on the plate and put the chocolate pudding to the right of the plate",
    "put both the alphabet soup and the cream cheese box in the basket", "put both moka pots on the stove",
    "put the yellow and white mug in the microwave and close it", "pick up the black bowl between the plate and the ramekin and place it on the plate",
    "pick up the black bowl next to the ramekin and place it on the plate", "pick up the black bowl from table center and place it on the plate",
    "pick up the black bowl on the cookie box and place it on the plate", "pick up the black bowl in the top drawer of the wooden cabinet and place it on the plate",
    "pick up the black bowl on the ramekin and place it on the plate", "pick up the black bowl next to the cookie box and place it on the plate",
    "pick up the black bowl on the stove and place it on the plate", "pick up the black bowl next to the plate and place it on the plate",
    "pick up the black bowl on the wooden cabinet and place it on the plate", "open the middle drawer of the cabinet",
    "put the bowl on the stove", "put the wine bottle on top of the cabinet", "open the top drawer and put the bowl inside",
    "put the bowl on top of the cabinet", "push the plate to the front of the stove", "put the cream cheese in the bowl",
    "turn on the stove", "put the bowl on the plate", "put the wine bottle on the rack", "pick up the alphabet soup and place it in the basket",
    "pick up the cream cheese and place it in the basket", "pick up the salad dressing and place it in the basket",
    "pick up the bbq sauce and place it in the basket", "pick up the ketchup and place it in the basket",
    "pick up the tomato sauce and place it in the basket", "pick up the butter and place it in the basket",
    "pick up the milk and place it in the basket", "pick up the chocolate pudding and place it in the basket",
    "pick up the orange juice and place it in the basket", "Turn on the stove and put the moka pot on it.",
    "Task: push the plate to the front of the stove", "  open the top drawer and put the bowl inside  ",
]

IMG = "<im_start>" + "<im_patch>" * 16 + "<im_end>"
IMG196 = "<im_start>" + "<im_patch>" * 196 + "<im_end>"


def prompt(task, bins, image=IMG):
    state = "<state_start>" + "".join(f"<state_{b}>" for b in bins) + "<state_end>"
    return (f"Image 1{image}Image 2{image}<|im_start|>user\nThe task is to {task}. The setup is <setup_start>single franka "
            f"robotic arm in libero<setup_end>. The current state of the robot is {state}. The expected control mode is "
            f"<control_start>delta end-effector pose<control_end>. Given these, what action should the robot take to "
            f"complete the task?<|im_end|>\n<|im_start|>assistant\n<action_output>")


def main():
    rng = random.Random(2026)
    out = list(LIBERO)
    out += [t.capitalize() + "." for t in LIBERO[:20]]
    for i, t in enumerate(LIBERO):
        out.append(prompt(t, [rng.randrange(256) for _ in range(8)], IMG196 if i % 5 == 0 else IMG))
    out += ["", " ", "  ", "\t", "\n", "\r\n", "a\u0000b", "\u0000", "x" * 300, "a" * 2000, " " * 40 + "x",
            "12345678901234567890", "3.14159 and 2,718.28", "0x1f 1e-6 -42", "it's they're we've I'm you'll he'd",
            "IT'S THEY'RE WE'VE I'M YOU'LL HE'D", "don't can't won't", "'s 't 're 've 'm 'll 'd", "quote's end'",
            "tab\tseparated\tvalues", "line1\nline2\n\nline4", "spaces   inside    words", "trailing   ", "   leading",
            "\n\n\n", " \n \n ", "\t\t \t", "a \u0085 b", "\u0085\u0085", " \ufeff x", "\ufeffstart", "mid\ufeff dle",
            "caf\u00e9", "cafe\u0301", unicodedata.normalize("NFD", "\u00c5ngstr\u00f6m \u00fcber"),
            "\u00c5ngstr\u00f6m \u00fcber", "na\u0308ive", "\u1e9b\u0323", "\u212b", "\ufb01le \ufb02ow",
            "\u4f60\u597d\u4e16\u754c", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8", "\ud55c\uad6d\uc5b4",
            "\U0001F600\U0001F680 emoji \U0001F44D\U0001F3FD", "\U0001F468\u200d\U0001F469\u200d\U0001F467",
            "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645", "\u05e9\u05dc\u05d5\u05dd",
            "\u0928\u092e\u0938\u094d\u0924\u0947", "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35", "\u00a0nbsp\u00a0", "\u2003em space",
            "\u3000ideographic\u3000space", "zero\u200bwidth", "\u2028\u2029", "<|im_end|>", "<|im_start|>user\nhi<|im_end|>",
            "<im_patch><im_patch>", "<state_0><state_255>", "<state_256>", "<action_output>", "<state_12 >", "<<state_1>>",
            "<state_1>\u0338", "x<|endoftext|>y", "<|image|>", "<im_col>", "<setup_start>x<setup_end>",
            "\u017ft \u017fs 'S '\u017f", "'\u212a", "L'\u00c9t\u00e9", "co\u00f6perate", "\u00df \u1e9e",
            "\u0130stanbul \u0131", "\u03a3\u03c3\u03c2", "\u2167 \u2160", "\u00bd \u00b2 \u2082", "\u0661\u0662\u0663",
            "\u0966\u0967", "\uff11\uff12\uff13", "$100 \u20ac50 \u00a330", "a--b__c..d!!e??", "(parens) [brackets] {braces}",
            "email@example.com", "https://example.com/path?q=1&r=2", "C:\\Windows\\path", "snake_case camelCase PascalCase",
            "kebab-case", "#hashtag @mention", "\u2026ellipsis\u2026", "\u201cquoted\u201d \u2018single\u2019", "\U0010FFFF",
            "\U0001D400\U0001D401", "\u00e9\u0301", "e\u0301\u0301", "\u1100\u1161\u11a8"]
    pool = ["pick", "up", "the", "bowl", " ", "  ", "\n", "\t", "'s", "'ll", "42", "7", ".", ",", "!", "?", "caf\u00e9",
            "cafe\u0301", "\u4f60\u597d", "\U0001F600", "\u0085", "\ufeff", "<state_3>", "<im_patch>", "<|im_end|>", "ABC",
            "\u00a0", "\u2003", "-", "_", "(", ")", "/", "\\", "\u00e4", "a\u0308", "\r\n", "\u0000", "x", "Z", "\u212b", "\u00c5"]
    while len(out) < 620:
        out.append("".join(rng.choice(pool) for _ in range(rng.randrange(1, 25))))
    for s in out:
        sys.stdout.write(json.dumps(s, ensure_ascii=True) + "\n")


if __name__ == "__main__":
    main()
